"""The documentation against the code: README.md, BENCHMARKS.md and docs/*.md (docs/development.md: the docs test).

Every check is a function from one document to its problems, one line each (``docs/x.md:12: ...``). The tests run
each check over every document, then over small broken documents written to ``tmp_path``, which it must flag. The
slow test at the end runs the documented two-stage demo as written, at tiny size.
"""

import ast
import contextlib
import functools
import glob
import io
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple
from urllib.parse import unquote

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = [os.path.join(ROOT, "README.md"), os.path.join(ROOT, "BENCHMARKS.md")] + sorted(
    glob.glob(os.path.join(ROOT, "docs", "*.md"))
)
# Pages written to their own rule for measured numbers (the command next to each number), kept out of that check.
OWN_MEASUREMENT_RULE = ("docs/install.md", "docs/statistics.md")
README_MAX_LINES = 200
FIRST_SCREEN_LINES = 30
SHELL_LANGUAGES = ("bash", "sh", "shell", "console", "zsh")
# The two-stage examples the docs must show (pretraining config, fine-tuning config), checked for agreeing paths.
REQUIRED_PAIRS = (
    ("configs/ImageNet/xcit_s12_p16_400ep.py", "configs/COCO/mask_rcnn_xcit_s12_p16_3x_in1k.py"),
    ("configs/demo/pretrain_vit_tiny.py", "configs/demo/mask_rcnn_vit_tiny_finetune.py"),
)
DEMO_PAIR = REQUIRED_PAIRS[1]

FENCE_OPEN = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.DOTALL)
LINK = re.compile(r"!?\[([^\]]*)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(\S+)", re.MULTILINE)
CHECKOUT_PATH = re.compile(
    r"(?<![\w./$-])((?:tools|bench|tests|configs|docs|condinit_det)/[\w./-]*?\.(?:py|sh|md|png|yaml|yml))(?![\w/{<*$])"
)
ZOO_NAME = re.compile(r"\bzoo:([\w./-]+)")
MEASURED = re.compile(r"(?<!not )(?<!never )\bmeasured\b", re.IGNORECASE)
ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
OVERRIDE = re.compile(r"^[A-Za-z_][\w.]*=")
HEREDOC = re.compile(r"<<-?\s*['\"]?(\w+)['\"]?")
PREFIX_WORDS = ("time", "sudo", "env", "do", "then", "else", "exec", "nohup")
TEMPLATE_TAIL = re.compile(r"/\{arm\}/seed\{seed\}/?$")


# ---------------------------------------------------------------------------------------------
# Reading Markdown
# ---------------------------------------------------------------------------------------------
@dataclass
class Fence:
    """A fenced code block: the line numbers (1-based) of its opening and closing lines, its info string."""

    start: int
    marker: str
    info: str
    lines: List[str]
    end: Optional[int] = None

    @property
    def language(self) -> str:
        return self.info.split()[0].lower() if self.info.split() else ""


@dataclass
class Document:
    """A Markdown file: its lines, its fences, and its prose (every line inside a fence blanked)."""

    path: str
    lines: List[str]
    fences: List[Fence] = field(default_factory=list)
    prose: List[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return os.path.relpath(self.path, ROOT) if self.path.startswith(ROOT + os.sep) else self.path

    def where(self, line: int) -> str:
        return f"{self.name}:{line}"


def parse(path: str, text: Optional[str] = None) -> Document:
    """Split a Markdown file into fences and prose (CommonMark's fence rules: a closing fence is made of the
    opening fence's character, at least as long, and nothing else)."""
    if text is None:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    doc = Document(path=path, lines=text.splitlines())
    current: Optional[Fence] = None
    for number, line in enumerate(doc.lines, start=1):
        if current is None:
            m = FENCE_OPEN.match(line)
            if m and not (m.group(1)[0] == "`" and "`" in m.group(2)):
                current = Fence(start=number, marker=m.group(1), info=m.group(2).strip(), lines=[])
                doc.fences.append(current)
                doc.prose.append("")
            else:
                doc.prose.append(line)
            continue
        doc.prose.append("")
        stripped = line.strip()
        marker = current.marker
        if (
            len(line) - len(line.lstrip(" ")) <= 3
            and stripped
            and set(stripped) == {marker[0]}
            and len(stripped) >= len(marker)
        ):
            current.end = number
            current = None
        else:
            current.lines.append(line)
    return doc


@functools.lru_cache(maxsize=None)
def load(path: str) -> Document:
    return parse(path)


def paragraphs(doc: Document) -> List[Tuple[int, str]]:
    """(first line number, text) of every prose paragraph, its lines joined by newlines."""
    found, start, block = [], None, []
    for number, line in enumerate(doc.prose + [""], start=1):
        if HEADING.match(line):  # a heading is a paragraph of its own
            if block:
                found.append((start, "\n".join(block)))
            found.append((number, line))
            start, block = None, []
        elif line.strip():
            start = number if start is None else start
            block.append(line)
        elif block:
            found.append((start, "\n".join(block)))
            start, block = None, []
    return found


def code_spans(text: str) -> List[str]:
    return [" ".join(m.group(2).split()) for m in CODE_SPAN.finditer(text)]


def without_code_spans(text: str) -> str:
    return CODE_SPAN.sub("", text)


def headings(doc: Document) -> List[Tuple[int, int, str]]:
    """(line number, level, text) of every ATX heading outside fences."""
    found = []
    for number, line in enumerate(doc.prose, start=1):
        m = HEADING.match(line)
        if m:
            found.append((number, len(m.group(1)), m.group(2)))
    return found


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: its text (link targets, emphasis marks and backticks dropped), lower
    case, every character that is not a letter, digit, space, hyphen or underscore removed, spaces as hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "")
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(doc: Document) -> Set[str]:
    seen: Dict[str, int] = {}
    found = set()
    for _, _, text in headings(doc):
        anchor = github_anchor(text)
        count = seen.get(anchor, 0)
        seen[anchor] = count + 1
        found.add(anchor if count == 0 else f"{anchor}-{count}")
    for line in doc.prose:
        found.update(re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", line))
    return found


# ---------------------------------------------------------------------------------------------
# Reading shell lines
# ---------------------------------------------------------------------------------------------
def shell_lines(fence: Fence) -> List[Tuple[int, str]]:
    """(line number, logical line) of a shell fence: continuation lines joined, heredoc bodies and console output
    left out."""
    logical, pending, first = [], "", None
    heredoc_end = None
    console = fence.language == "console"
    for offset, line in enumerate(fence.lines, start=1):
        number = fence.start + offset
        if heredoc_end is not None:
            heredoc_end = None if line.strip() == heredoc_end else heredoc_end
            continue
        if console and not pending:
            if not line.lstrip().startswith("$ "):
                continue
            line = line.lstrip()[2:]
        first = number if not pending else first
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        text = pending + line
        pending = ""
        m = HEREDOC.search(text)
        if m:
            heredoc_end = m.group(1)
        logical.append((first, text))
    if pending:
        logical.append((first, pending))
    return logical


def split_shell(text: str) -> List[List[str]]:
    """The simple commands of one shell line (split at ; && || | & and parentheses), as words."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands, words = [], []
    for token in lexer:
        if token and set(token) <= set(";&|()<>"):
            if words:
                commands.append(words)
            words = []
        else:
            words.append(token)
    if words:
        commands.append(words)
    return commands


@dataclass
class Command:
    """One documented command line: the program (a console script, ``make``, or a checkout script path), its
    arguments, and where it was written."""

    program: str
    args: List[str]
    where: str
    fence: Optional[Fence] = None

    def flags(self) -> List[str]:
        out = []
        for word in self.args:
            if word == "--":
                break
            if word.startswith("--") and len(word) > 2:
                out.append(word.split("=", 1)[0])
        return out

    def value(self, flag: str) -> Optional[str]:
        for i, word in enumerate(self.args):
            if word == flag and i + 1 < len(self.args):
                return self.args[i + 1]
            if word.startswith(flag + "="):
                return word.split("=", 1)[1]
        return None

    def overrides(self) -> Dict[str, str]:
        """``key=value`` config overrides (quotes around a value removed)."""
        found = {}
        for word in self.args:
            if OVERRIDE.match(word) and not word.startswith("-"):
                key, value = word.split("=", 1)
                found[key] = value.strip("'\"")
        return found


def identify(words: List[str], where: str, fence: Optional[Fence] = None) -> Optional[Command]:
    """The command a word list runs, or None for programs this project does not own (pip, git, pytest, ...)."""
    words = list(words)
    while words and (ENV_ASSIGNMENT.match(words[0]) or words[0] in PREFIX_WORDS):
        words.pop(0)
    if not words:
        return None
    first = words[0]
    if first.startswith("condinit-") or first == "make":
        return Command(first, words[1:], where, fence)
    if re.fullmatch(r"(.*/)?python[\d.]*", first) or first in ("$PY", "${PY}"):
        if len(words) < 2 or words[1].startswith("-"):
            return None  # python -m ..., python -c ..., python - <<EOF
        first, words = words[1], words[1:]
    elif first in ("bash", "sh") and len(words) > 1:
        first, words = words[1], words[1:]
    script = first[2:] if first.startswith("./") else first
    if script.startswith(("tools/", "bench/")):
        return Command(script, words[1:], where, fence)
    return None


def commands_in(doc: Document) -> List[Command]:
    """Every command written in a shell fence, or in an inline code span that starts with a command."""
    found = []
    for fence in doc.fences:
        if fence.language not in SHELL_LANGUAGES:
            continue
        for number, text in shell_lines(fence):
            for words in split_shell(text):
                command = identify(words, doc.where(number), fence)
                if command:
                    found.append(command)
    for number, text in paragraphs(doc):
        for span in code_spans(text):
            try:
                commands = split_shell(span)
            except ValueError:
                continue  # an inline span that is not a command line (unbalanced quotes)
            for words in commands[:1]:
                command = identify(words, doc.where(number))
                if command:
                    found.append(command)
    return found


# ---------------------------------------------------------------------------------------------
# What the code provides
# ---------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def console_scripts() -> Dict[str, str]:
    """setup.py's console scripts: name -> module under condinit_det.commands."""
    with open(os.path.join(ROOT, "setup.py")) as f:
        text = f.read()
    return dict(re.findall(r"\"(condinit-[\w-]+)=condinit_det\.commands\.(\w+):main\"", text))


@functools.lru_cache(maxsize=None)
def make_targets() -> Set[str]:
    with open(os.path.join(ROOT, "Makefile")) as f:
        text = f.read()
    return {t for t in re.findall(r"^([A-Za-z0-9_.-]+)\s*:(?![=:])", text, re.MULTILINE) if not t.startswith(".")}


@functools.lru_cache(maxsize=None)
def zoo_names() -> Set[str]:
    from condinit_det import model_zoo

    return set(model_zoo.list_configs())


def _parser_flags(parser) -> Set[str]:
    return {option for action in parser._actions for option in action.option_strings}


def _help_flags(main) -> Set[str]:
    """The flags a command's ``--help`` lists (for a command that builds its parser inside ``main``)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main(["--help"])
    return set(re.findall(r"(?<![\w-])(--[a-z][\w-]*)", out.getvalue()))


@functools.lru_cache(maxsize=None)
def command_module_flags(module: str) -> Set[str]:
    """The flags of the console script whose code is ``condinit_det.commands.<module>``, from its parser built
    in-process."""
    import importlib

    if module in ("train", "pretrain"):
        from condinit_det.launch.arguments import build_parser

        return _parser_flags(build_parser())
    if module == "protocol":
        from condinit_det.launch.protocol import build_protocol_parser

        return _parser_flags(build_protocol_parser())
    code = importlib.import_module(f"condinit_det.commands.{module}")
    if hasattr(code, "get_parser"):
        return _parser_flags(code.get_parser())
    return _help_flags(code.main)  # condinit-status builds its parser inside main()


@functools.lru_cache(maxsize=None)
def tool_module(script: str) -> Optional[str]:
    """The command module a ``tools/*.py`` script runs (``from condinit_det.commands.X import main``)."""
    path = os.path.join(ROOT, script)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        m = re.search(r"from condinit_det\.commands\.(\w+) import main", f.read())
    return m.group(1) if m else None


@functools.lru_cache(maxsize=None)
def source_flags(script: str) -> Set[str]:
    """The option strings of every ``add_argument`` call in a script's source (bench/*.py, tools/gpu_check.py: their
    ``--help`` would import torch and detectron2 once per script)."""
    with open(os.path.join(ROOT, script)) as f:
        tree = ast.parse(f.read())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            found.update(
                a.value
                for a in node.args
                if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("-")
            )
    return found


@functools.lru_cache(maxsize=None)
def shell_script_flags(script: str) -> Set[str]:
    """The flags a ``tools/*.sh`` script's ``--help`` names."""
    proc = subprocess.run(
        ["bash", os.path.join(ROOT, script), "--help"], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    flags = set(re.findall(r"(?<![\w-])(--[a-z][\w-]*)", proc.stdout + proc.stderr))
    return flags | {"--help"} if proc.returncode == 0 else flags - {"--help"}


def program_flags(program: str) -> Optional[Set[str]]:
    """The flags ``program`` accepts; None for a program whose flags are not known here."""
    scripts = console_scripts()
    if program in scripts:
        return command_module_flags(scripts[program])
    if program.startswith("tools/") and program.endswith(".py"):
        module = tool_module(program)
        if module:
            return command_module_flags(module)
        return source_flags(program) if os.path.isfile(os.path.join(ROOT, program)) else None
    if program.startswith("bench/") and program.endswith(".py"):
        return source_flags(program) if os.path.isfile(os.path.join(ROOT, program)) else None
    if program.startswith("tools/") and program.endswith(".sh"):
        return shell_script_flags(program) if os.path.isfile(os.path.join(ROOT, program)) else None
    return None


def console_name(program: str) -> Optional[str]:
    """``condinit-train`` for ``condinit-train`` and ``tools/train_net.py`` alike."""
    if program in console_scripts():
        return program
    module = tool_module(program) if program.startswith("tools/") else None
    return next((name for name, m in console_scripts().items() if m == module), None) if module else None


# ---------------------------------------------------------------------------------------------
# The checks: one document in, its problems out
# ---------------------------------------------------------------------------------------------
def check_fences(doc: Document) -> List[str]:
    return [
        f"{doc.where(f.start)}: the code fence {f.marker}{f.info} opened here is never closed"
        for f in doc.fences
        if f.end is None
    ]


def check_links(doc: Document) -> List[str]:
    problems = []
    targets = [
        (number, m.group(2)) for number, text in paragraphs(doc) for m in LINK.finditer(without_code_spans(text))
    ]
    prose = "\n".join(doc.prose)
    targets += [(prose.count("\n", 0, m.start()) + 1, m.group(1)) for m in REFERENCE_LINK.finditer(prose)]
    for number, target in targets:
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue  # http(s), mailto: not checked here
        path, _, anchor = target.partition("#")
        file = os.path.normpath(os.path.join(os.path.dirname(doc.path), unquote(path))) if path else doc.path
        if not os.path.exists(file):
            problems.append(f"{doc.where(number)}: link target {target} does not exist ({file})")
        elif anchor and file.endswith(".md") and anchor not in anchors(load(file) if file != doc.path else doc):
            problems.append(
                f"{doc.where(number)}: link {target}: no heading in {os.path.basename(file)} has the anchor #{anchor}"
            )
    return problems


def check_paths(doc: Document) -> List[str]:
    """Checkout paths (tools/, bench/, tests/, configs/, docs/, condinit_det/ with an extension) and zoo: names."""
    problems = []
    for number, line in enumerate(doc.lines, start=1):
        for m in CHECKOUT_PATH.finditer(line):
            if not os.path.exists(os.path.join(ROOT, m.group(1))):
                problems.append(f"{doc.where(number)}: {m.group(1)} does not exist in the checkout")
        for m in ZOO_NAME.finditer(line):
            name = m.group(1).rstrip(".")
            if "/" in name and name not in zoo_names():
                problems.append(f"{doc.where(number)}: zoo:{name} is not a model-zoo name")
    return problems


def check_commands(doc: Document) -> List[str]:
    """Every flag of a known command exists in its parser; make targets exist; console scripts are installed."""
    problems = []
    for command in commands_in(doc):
        if command.program == "make":
            for word in command.args:
                if not word.startswith("-") and "=" not in word and word not in make_targets():
                    problems.append(
                        f"{command.where}: make {word}: no such target in the Makefile "
                        f"(targets: {', '.join(sorted(make_targets()))})"
                    )
            continue
        if command.program.startswith("condinit-") and command.program not in console_scripts():
            problems.append(
                f"{command.where}: {command.program} is not a console script of setup.py "
                f"({', '.join(sorted(console_scripts()))})"
            )
            continue
        accepted = program_flags(command.program)
        if accepted is None:
            continue
        for flag in command.flags():
            if flag not in accepted:
                problems.append(f"{command.where}: {command.program} has no flag {flag}")
    return problems


@functools.lru_cache(maxsize=None)
def config_value(config: str, key: str) -> Optional[str]:
    """``train.<key>`` of a config given as a checkout path or a zoo: name (None when it has none)."""
    from detectron2.config import LazyConfig

    from condinit_det.model_zoo import resolve_config_file

    path = resolve_config_file(config if config.startswith("zoo:") else os.path.join(ROOT, config))
    cfg = LazyConfig.load(path)
    value = cfg.train.get(key) if "train" in cfg else None
    return None if value is None else str(value)


def two_stage_pairs(doc: Document) -> List[Tuple[Command, Command]]:
    """(pretraining command, fine-tuning command) of every shell block that pretrains and then fine-tunes from a
    ``{arm}`` template."""
    pairs = []
    for fence in doc.fences:
        if fence.language not in SHELL_LANGUAGES:
            continue
        pretrain = None
        for number, text in shell_lines(fence):
            for words in split_shell(text):
                command = identify(words, doc.where(number), fence)
                name = console_name(command.program) if command else None
                if name == "condinit-pretrain":
                    pretrain = command
                elif name == "condinit-train" and pretrain is not None and _loadable(command.value("--config-file")):
                    if "{arm}" in (init_template(command) or ""):
                        pairs.append((pretrain, command))
    return pairs


def _loadable(config: Optional[str]) -> bool:
    """A config the docs name by checkout path or zoo: name (a placeholder such as my_config.py is not checked)."""
    if not config:
        return False
    return (
        config[len("zoo:") :] in zoo_names()
        if config.startswith("zoo:")
        else os.path.isfile(os.path.join(ROOT, config))
    )


def init_template(command: Command) -> Optional[str]:
    return command.overrides().get("train.init_checkpoint") or config_value(
        command.value("--config-file"), "init_checkpoint"
    )


def output_dir(command: Command) -> Optional[str]:
    return command.overrides().get("train.output_dir") or config_value(command.value("--config-file"), "output_dir")


def check_two_stage_paths(doc: Document) -> List[str]:
    """The folder a pretraining command writes is the folder the next fine-tuning command's template reads."""
    problems = []
    for pretrain, finetune in two_stage_pairs(doc):
        template = init_template(finetune)
        reads = os.path.normpath(TEMPLATE_TAIL.sub("", template))
        writes = os.path.normpath(output_dir(pretrain) or "")
        if reads != writes:
            problems.append(
                f"{finetune.where}: fine-tuning reads {template} but the pretraining at {pretrain.where} "
                f"writes its runs into {writes}/<arm>/seed<k>"
            )
    return problems


def check_condinit_node(doc: Document) -> List[str]:
    with open(os.path.join(ROOT, "configs", "common", "condinit.py")) as f:
        real = {line.strip() for line in f}
    return [
        f"{doc.where(number)}: this condinit node is not the one in configs/common/condinit.py"
        for number, line in enumerate(doc.lines, start=1)
        if line.strip().startswith("condinit = dict(") and line.strip() not in real
    ]


def check_measured(doc: Document) -> List[str]:
    """A section whose prose says "measured" holds a ``Measured with:`` paragraph naming a command (a code span in
    it, or a code fence right after it)."""
    if doc.name in OWN_MEASUREMENT_RULE:
        return []
    starts = {f.start for f in doc.fences}
    heading_lines = {number for number, _, _ in headings(doc)}
    bounds = sorted(heading_lines) + [len(doc.lines) + 1]
    sections = [(1, bounds[0])] + list(zip(bounds, bounds[1:]))
    problems = []
    for first, stop in sections:
        paras = [(n, t) for n, t in paragraphs(doc) if first <= n < stop and n not in heading_lines]
        claim = next((n for n, t in paras if MEASURED.search(without_code_spans(t))), None)
        if claim is None:
            continue
        ok = False
        for number, text in paras:
            if not text.lstrip().startswith("Measured with:"):
                continue
            after = number + text.count("\n") + 1
            while after <= len(doc.lines) and not doc.lines[after - 1].strip():
                after += 1
            ok = ok or bool(code_spans(text)) or after in starts
        if not ok:
            problems.append(
                f"{doc.where(claim)}: says 'measured' but its section has no 'Measured with:' line naming the command"
            )
    return problems


CHECKS = (
    check_fences,
    check_links,
    check_paths,
    check_commands,
    check_two_stage_paths,
    check_condinit_node,
    check_measured,
)


# ---------------------------------------------------------------------------------------------
# The documents as they are
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_the_docs_pass(check):
    problems = [p for path in DOCS for p in check(load(path))]
    assert not problems, "\n".join(problems)


def test_the_docs_show_both_two_stage_examples():
    shown = {
        (os.path.normpath(a.value("--config-file")), os.path.normpath(b.value("--config-file")))
        for path in DOCS
        for a, b in two_stage_pairs(load(path))
    }
    for pair in REQUIRED_PAIRS:
        assert pair in shown, f"no shell block pretrains with {pair[0]} and then fine-tunes with {pair[1]}"


def test_readme_is_short_and_answers_the_two_questions_first():
    readme = load(DOCS[0])
    assert len(readme.lines) <= README_MAX_LINES, len(readme.lines)
    screen = "\n".join(readme.lines[:FIRST_SCREEN_LINES])
    for anchor in ("#use-it-in-your-own-config", "#reproduce-the-paper"):
        assert f"]({anchor})" in screen and anchor[1:] in anchors(readme), anchor


def test_every_page_is_reachable_from_the_readme():
    readme = "\n".join(load(DOCS[0]).lines)
    for path in DOCS[1:]:
        assert f"]({os.path.relpath(path, ROOT)})" in readme, f"README.md does not link {os.path.relpath(path, ROOT)}"


# ---------------------------------------------------------------------------------------------
# The checks on broken documents
# ---------------------------------------------------------------------------------------------
def _doc(tmp_path, text, name="page.md") -> Document:
    path = tmp_path / name
    path.write_text(text)
    return parse(str(path))


def test_a_good_document_has_no_problem(tmp_path):
    (tmp_path / "other.md").write_text("# Other\n\n## A section: `with code`\n")
    doc = _doc(
        tmp_path,
        (
            "# Page\n\nSee [the other page](other.md#a-section-with-code) and [below](#usage).\n\n## Usage\n\n"
            "```bash\ncondinit-train --config-file configs/demo/mask_rcnn_vit_tiny.py --arm all --seeds 0,1 \\\n"
            "    train.output_dir=output/x   # a comment\nmake demo DEMO_OUTPUT=output/d\n```\n\n"
            "It took 3 s.\n\nMeasured with: `time make demo`\n"
        ),
    )
    assert [p for check in CHECKS for p in check(doc)] == []


@pytest.mark.parametrize(
    "text, problem",
    [
        ("# Page\n\n```bash\nmake test\n", "is never closed"),
        ("# Page\n\n````python\nx = 1\n```\n", "is never closed"),
        ("# Page\n\nSee [there](missing.md).\n", "does not exist"),
        ("# Page\n\nSee [there](#nowhere).\n\n## Somewhere\n", "anchor #nowhere"),
        ("# Page\n\nSee [there](other.md#nowhere).\n", "anchor #nowhere"),
        ("# Page\n\nThe config `configs/demo/no_such_config.py`.\n", "does not exist in the checkout"),
        ("# Page\n\n`condinit-train --config-file zoo:demo/no_such.py`\n", "is not a model-zoo name"),
        ("# Page\n\n```bash\ncondinit-train --config-file x.py --no-such-flag\n```\n", "has no flag --no-such-flag"),
        ("# Page\n\n```bash\n.venv/bin/python tools/pretrain_net.py --arms all\n```\n", "has no flag --arms"),
        ("# Page\n\n```bash\ncondinit-protocol --pretrain-cfg a.py\n```\n", "has no flag --pretrain-cfg"),
        ("# Page\n\n```bash\ncondinit-compare out --boot 10\n```\n", "has no flag --boot"),
        ("# Page\n\n`condinit-status out --stale 5`\n", "has no flag --stale"),
        ("# Page\n\n```bash\n.venv/bin/python bench/bench_eval.py --imgs 5\n```\n", "has no flag --imgs"),
        ("# Page\n\n```bash\nbash tools/setup_env.sh --offlin DIR\n```\n", "has no flag --offlin"),
        ("# Page\n\n```bash\nmake no-such-target\n```\n", "no such target"),
        ("# Page\n\n```bash\ncondinit-evaluate out\n```\n", "is not a console script"),
        ('# Page\n\n```python\ncondinit = dict(arm="mimetic")\n```\n', "is not the one in configs/common/condinit.py"),
        (
            "# Page\n\nIt took 3 s, measured on two cores.\n\n## Next\n\nMeasured with: `make demo`\n",
            "'Measured with:'",
        ),
        ("# Page\n\nMeasured here: 3 s.\n\nMeasured with: the usual command.\n", "'Measured with:'"),
    ],
)
def test_a_broken_document_is_flagged(tmp_path, text, problem):
    (tmp_path / "other.md").write_text("# Other\n")
    doc = _doc(tmp_path, text)
    problems = [p for check in CHECKS for p in check(doc)]
    assert any(problem in p for p in problems), problems


def test_two_stage_paths_that_disagree_are_flagged(tmp_path):
    broken = _doc(
        tmp_path,
        (
            "# Page\n\n```bash\n"
            "condinit-pretrain --config-file configs/ImageNet/xcit_s12_p16_400ep.py --arm all "
            "train.output_dir=output/pretrain/xcit_s12_p16\n"
            "condinit-train --config-file configs/COCO/mask_rcnn_xcit_s12_p16_3x_in1k.py --arm all\n```\n"
        ),
    )
    problems = check_two_stage_paths(broken)
    assert len(problems) == 1 and "output/imagenet/xcit_s12_p16_400ep/{arm}/seed{seed}" in problems[0], problems
    good = _doc(
        tmp_path,
        (
            "# Page\n\n```bash\n"
            ".venv/bin/python tools/pretrain_net.py --config-file configs/demo/pretrain_vit_tiny.py --arm all "
            "train.output_dir=./output/demo_paper/pretrain/\n"
            "condinit-train --config-file zoo:demo/mask_rcnn_vit_tiny_finetune.py --arm all\n"
            "condinit-train --config-file configs/demo/mask_rcnn_vit_tiny.py --arm all "
            "\"train.init_checkpoint='output/demo_paper/pretrain/{arm}/seed{seed}'\"\n```\n"
        ),
        name="good.md",
    )
    assert len(two_stage_pairs(good)) == 2 and check_two_stage_paths(good) == []


def test_anchors_follow_githubs_rules():
    assert github_anchor("Training with an arm: `tools/train_net.py`") == "training-with-an-arm-toolstrain_netpy"
    assert github_anchor("1. COCO evaluation: **fast** vs [slow](x.md)") == "1-coco-evaluation-fast-vs-slow"
    assert github_anchor("κ of the attention Jacobian") == "κ-of-the-attention-jacobian"
    doc = parse("page.md", "# A\n\n## Same\n\n## Same\n\n```\n## not a heading\n```\n")
    assert anchors(doc) == {"a", "same", "same-1"}


def test_commands_are_read_like_a_shell(tmp_path):
    doc = _doc(
        tmp_path,
        (
            "# P\n\n```bash\nPY=.venv/bin/python\nOMP_NUM_THREADS=1 $PY tools/train_net.py --arm all \\\n"
            "    --seeds 0 && time make test\nfor c in a b; do\n  condinit-pretrain --config-file configs/$c.py; done\n"
            "$PY - <<'EOF'\nprint('--not-a-flag')\nEOF\n.venv/bin/python -m pytest -q\n```\n"
        ),
    )
    commands = [(c.program, c.flags()) for c in commands_in(doc)]
    assert commands == [
        ("tools/train_net.py", ["--arm", "--seeds"]),
        ("make", []),
        ("condinit-pretrain", ["--config-file"]),
    ]


# ---------------------------------------------------------------------------------------------
# The demo pair, run as the docs write it
# ---------------------------------------------------------------------------------------------
def documented_demo_pair() -> Tuple[Command, Command]:
    """The demo's pretraining and fine-tuning commands, as every doc that shows them writes them (one way)."""
    pairs = {}
    for path in DOCS:
        for pretrain, finetune in two_stage_pairs(load(path)):
            key = (os.path.normpath(pretrain.value("--config-file")), os.path.normpath(finetune.value("--config-file")))
            if key == DEMO_PAIR:
                pairs[(tuple(pretrain.args), tuple(finetune.args))] = (pretrain, finetune)
    assert len(pairs) == 1, f"the docs write the demo pair in {len(pairs)} ways: {sorted(pairs)}"
    return next(iter(pairs.values()))


def comparisons_after(command: Command) -> List[Command]:
    """The ``condinit-compare`` commands written after ``command`` in its shell block."""
    found, after = [], False
    for _, text in shell_lines(command.fence):
        for words in split_shell(text):
            other = identify(words, command.where, command.fence)
            if other is not None and other.args == command.args and other.program == command.program:
                after = True
            elif after and other is not None and console_name(other.program) == "condinit-compare":
                found.append(other)
    return found


def _as_run_here(command: Command, extra: List[str]) -> List[str]:
    """The documented command line, run with this checkout's tools/ script, its config path absolute (the command
    runs in another folder) and ``extra`` overrides appended."""
    script = next(
        s
        for s in ("tools/pretrain_net.py", "tools/train_net.py", "tools/compare_arms.py")
        if console_name(s) == console_name(command.program)
    )
    args = [os.path.join(ROOT, a) if a.startswith("configs/") else a for a in command.args]
    return [sys.executable, os.path.join(ROOT, script), *args, *extra]


def run_documented_demo_pair(work: str) -> Dict[str, str]:
    """The demo pair's three commands as the docs write them, run in ``work`` at tiny size (data and schedule
    overrides only: one epoch of 32 images, one fine-tuning step); returns the pretraining, fine-tuning and report
    folders. Run once per test run by the ``documented_demo_pair_run`` fixture (conftest.py), which this module's test
    and the every config end to end test read."""
    from condinit_det.data.classification import ShapesClsSpec, generate_classification_dataset

    pretrain, finetune = documented_demo_pair()
    spec = ShapesClsSpec(image_size=32, min_size=14.0, max_size=22.0, center_jitter=3.0, distractor_size=(4.0, 7.0))
    data = generate_classification_dataset(os.path.join(work, "shapes"), num_train=32, num_val=8, spec=spec)
    # Tiny size: data and schedule only.
    tiny_pretrain = [
        f"data.root={data}",
        "train.epochs=1",
        "scheduler.warmup_epochs=0",
        "train.batch_size=8",
        "train.eval_batch_size=8",
        "train.workers=0",
    ]
    tiny_finetune = ["train.max_iter=1", "train.eval_period=1", "condinit_analysis.period=0"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    compare = comparisons_after(finetune)
    assert len(compare) == 1, "the demo pair's block should end with one condinit-compare of both stages"
    for command, extra in ((pretrain, tiny_pretrain), (finetune, tiny_finetune), (compare[0], [])):
        proc = subprocess.run(
            _as_run_here(command, extra), cwd=work, env=env, capture_output=True, text=True, timeout=900
        )
        assert proc.returncode == 0, f"{command.where}: {' '.join(command.args)}\n{proc.stderr[-5000:]}"
    return {
        "work": work,
        "pretrain": os.path.join(work, pretrain.overrides()["train.output_dir"]),
        "finetune": os.path.join(work, finetune.overrides()["train.output_dir"]),
        "report": os.path.join(work, compare[0].value("--output")),
    }


@pytest.mark.slow
@pytest.mark.e2e
def test_the_documented_demo_pair_fine_tunes_each_arm_from_its_own_pretraining(documented_demo_pair_run):
    from condinit_det.init import PAPER_ARMS
    from condinit_det.records.results import ResultsFile

    runs = documented_demo_pair_run
    for arm in PAPER_ARMS:
        own = os.path.join(runs["pretrain"], arm, "seed0")
        assert [r["epoch"] for r in ResultsFile(own).records("cls")] == [1]
        run = os.path.join(runs["finetune"], arm, "seed0")
        assert [r["iteration"] for r in ResultsFile(run).records("ap")] == [1]
        with open(os.path.join(run, "condinit_arm_report.json")) as f:
            report = json.load(f)
        started_from = os.path.normpath(os.path.join(runs["work"], report["init_checkpoint"]))
        assert os.path.dirname(started_from) == os.path.normpath(own), report["init_checkpoint"]
        assert report["sites"] and all(
            s["weights_from"].endswith(f"(pretrained with arm {arm})") for s in report["sites"]
        ), report["sites"]
    with open(os.path.join(runs["report"], "report.md")) as f:
        markdown = f.read()
    assert "## Classification pretraining" in markdown and "## Detection" in markdown
