"""Names a package exports but loads on first use, so that importing it (a command's ``--help``) loads no torch."""

import importlib
from typing import Callable, Dict, List, Sequence, Tuple

__all__ = ["lazy_exports"]


def lazy_exports(package: str, modules: Dict[str, Sequence[str]]) -> Tuple[List[str], Callable[[str], object]]:
    """``(__all__, __getattr__)`` for ``package``: each name of ``modules`` (submodule -> names) is imported from
    its submodule when it is first read (PEP 562)."""
    where = {name: module for module, names in modules.items() for name in names}

    def __getattr__(name: str):
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f".{where[name]}", package), name)

    return sorted(where), __getattr__
