"""Markdown tables as text a test can match whatever their column widths."""

import re


def unpadded(text: str) -> str:
    """``text`` with each run of spaces in its table lines (those starting with "|") made one: a row reads
    ``| a | b |``."""
    return "\n".join(re.sub(" {2,}", " ", line) if line.startswith("|") else line for line in text.splitlines())
