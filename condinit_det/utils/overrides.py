"""The one check of command-line config overrides, before anything is built: ``LazyConfig.apply_overrides`` would
add a misspelt key silently (``train.max_itr=10``) and store a value of any type (``train.max_iter=abc``).
"""

from __future__ import annotations

import difflib
import inspect
import pydoc
from typing import Any, Dict, List, Mapping, Sequence, Tuple

from .errors import UsageError

__all__ = ["check_override_keys", "target_arguments"]

# What an override may put in place of a value of each type: its name in an error, and the types that fit.
_EXPECTED = {bool: ("true or false", (bool,)), int: ("an integer", (int,)), float: ("a number", (int, float))}


def target_arguments(target) -> Tuple[List[str], bool]:
    """``(names, takes_any)``: the keyword arguments ``target`` (a callable or its dotted name) takes (a class's along
    its MRO while each ``__init__`` passes ``**kwargs`` upward), and whether it is a function taking ``**kwargs``."""
    target = pydoc.locate(target) if isinstance(target, str) else target
    if inspect.isclass(target):  # object.__init__ takes no keyword
        functions = [vars(cls)["__init__"] for cls in target.__mro__[:-1] if "__init__" in vars(cls)]
    else:
        functions = [target]
    names = []
    for function in functions:
        try:
            parameters = inspect.signature(function).parameters.values()
        except (TypeError, ValueError):  # not callable, or a builtin without a signature
            return names, False
        keywords = [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        names += [name for name in keywords if name != "self"]
        if not any(p.kind == p.VAR_KEYWORD for p in parameters):
            return names, False
    return names, not inspect.isclass(target)


def _config_keys(cfg) -> Tuple[Dict[str, Any], List[str], List[str]]:
    """``(values, arguments, open_nodes)``: every dotted key of a lazy config (list indices too) with its value,
    interpolations unresolved; the keyword arguments of each ``_target_`` the config does not set; the nodes whose
    target takes any keyword."""
    from omegaconf import OmegaConf

    values, arguments, open_nodes = {}, [], []

    def walk(value, prefix: str) -> None:
        if isinstance(value, dict) and ("_arm_target_" in value or "_target_" in value):
            names, takes_any = target_arguments(value.get("_arm_target_", value.get("_target_")))
            arguments.extend(f"{prefix}{name}" for name in names if name not in value)
            if takes_any:
                open_nodes.append(prefix.rstrip("."))
        children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for key, child in children:
            values[f"{prefix}{key}"] = child
            walk(child, f"{prefix}{key}.")

    walk(OmegaConf.to_container(cfg, resolve=False), "")
    return values, arguments, open_nodes


def _closest(key: str, keys: List[str]) -> List[str]:
    """The keys most like ``key``: siblings with a similar last name first, else similar keys anywhere."""
    parent, _, leaf = key.rpartition(".")
    siblings = {k.rpartition(".")[2]: k for k in keys if k.rpartition(".")[0] == parent}
    close = [siblings[name] for name in difflib.get_close_matches(leaf, list(siblings), n=2, cutoff=0.6)]
    return close or difflib.get_close_matches(key, keys, n=2, cutoff=0.8)


def check_override_keys(cfg, opts: Sequence[str], *, optional: Mapping[str, Any] = {}) -> None:
    """Raise :class:`UsageError` for an override ``key=value`` whose key ``cfg`` does not have, or whose value does not
    fit the type of the value it replaces (a bool, an integer, a number; ``null`` and ``${...}`` always fit).

    Args:
        cfg: the loaded lazy config, before the overrides are applied.
        opts: the overrides; ``+key=value``, ``++key=value``, ``~key`` and what hydra's parser refuses are not checked.
        optional: dotted keys (and the keys below them) a config may lack, with their defaults.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    try:
        overrides = OverridesParser.create().parse_overrides(list(opts))
    except OverrideParseException:
        return
    values, arguments, open_nodes = _config_keys(cfg)
    for override in overrides:
        key, value = override.key_or_group, override.value()
        if override.is_add() or override.is_force_add() or override.is_delete():
            continue
        if not (
            key in values
            or key in arguments
            or key.rpartition(".")[0] in open_nodes
            or any(key == k or key.startswith(k + ".") for k in optional)
        ):
            close = _closest(key, list(dict.fromkeys([*values, *arguments, *optional])))
            hint = f"did you mean {' or '.join(close)}?" if close else "the config has no such node"
            raise UsageError(f"{key}: no such key; {hint} (to add a key the config lacks: +{override.input_line})")
        replaced = values.get(key, optional.get(key))
        if type(replaced) in _EXPECTED and value is not None and not str(value).startswith("${"):
            expected, fits = _EXPECTED[type(replaced)]
            # a fraction where the config wrote an integer is a rate written as 0 (weight_decay=0), not a count
            fraction = type(replaced) is int and isinstance(value, float) and not value.is_integer()
            if type(value) not in fits and not fraction:
                where = "the config's value" if key in values else "its default"
                raise UsageError(f"{override.input_line}: expected {expected} ({where} is {replaced!r})")
