"""The one check of command-line config overrides both stages make: a key the config does not have is refused
(``LazyConfig.apply_overrides`` would add it silently, so ``train.max_itr=10`` would train the full schedule); a
deliberate new key is written ``+key=value``. A node built by a ``_target_`` also accepts the target's own keyword
arguments (``model.roi_heads.box_predictor.test_topk_per_image``), and any key of its own when its targets all take
``**kwargs`` (an armed node's ``_target_`` does, and passes them to its ``_arm_target_``, which need not).
The error is one line with the closest keys.
"""

from __future__ import annotations

import difflib
import inspect
import pydoc
from typing import Iterable, List, Sequence, Tuple

from .errors import UsageError

__all__ = ["check_override_keys", "config_keys"]


def _target_arguments(target) -> Tuple[List[str], bool]:
    """The keyword arguments ``target`` (a callable or its dotted name) takes, and whether it takes ``**kwargs``."""
    target = pydoc.locate(target) if isinstance(target, str) else target
    try:
        parameters = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):  # not callable, or a builtin without a signature
        return [], False
    named = [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return named, any(p.kind == p.VAR_KEYWORD for p in parameters)


def config_keys(cfg) -> Tuple[List[str], List[str]]:
    """The dotted keys an override may set in an OmegaConf (lazy) config, without resolving interpolations.

    Returns:
        ``(keys, open_nodes)``: every key of the config, nested ones and list indices (``augmentations.1.…``)
        included, and the keyword arguments of each ``_target_`` the config does not set; the nodes whose
        targets all take ``**kwargs`` (any key directly below them is accepted).
    """
    from omegaconf import OmegaConf

    keys, open_nodes = [], []

    def walk(value, prefix: str) -> None:
        # "_target_", and an armed node's "_arm_target_" (the callable its "_target_" builds and arms)
        targets = (
            [_target_arguments(child) for key, child in value.items() if str(key).endswith("_target_")]
            if isinstance(value, dict)
            else []
        )
        keys.extend(f"{prefix}{name}" for arguments, _ in targets for name in arguments if name not in value)
        if targets and all(takes_any for _, takes_any in targets):
            open_nodes.append(prefix.rstrip("."))
        children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for key, child in children:
            keys.append(f"{prefix}{key}")
            walk(child, f"{prefix}{key}.")

    walk(OmegaConf.to_container(cfg, resolve=False), "")
    return keys, open_nodes


def _closest(key: str, keys: List[str]) -> List[str]:
    """The keys most like ``key``: siblings with a similar last name first, else similar keys anywhere."""
    parent, _, leaf = key.rpartition(".")
    siblings = {k.rpartition(".")[2]: k for k in keys if k.rpartition(".")[0] == parent}
    close = [siblings[name] for name in difflib.get_close_matches(leaf, list(siblings), n=2, cutoff=0.6)]
    return close or difflib.get_close_matches(key, keys, n=2, cutoff=0.8)


def check_override_keys(cfg, opts: Sequence[str], *, optional: Iterable[str] = ()) -> None:
    """Raise :class:`UsageError` for an override ``key=value`` whose key ``cfg`` does not have.

    Args:
        cfg: the loaded lazy config (an OmegaConf ``DictConfig``), before the overrides are applied.
        opts: the ``key=value`` overrides; ``+key=value`` (add a key) and ``~key`` (delete one) are not checked.
        optional: dotted keys (and the keys below them) the stage reads though a config may lack them.
    """
    optional = list(optional)
    known = None
    for opt in opts:
        if opt.startswith(("+", "~")) or "=" not in opt:
            continue  # hydra's parser judges the syntax
        key = opt.split("=", 1)[0].strip()
        if known is None:
            known, open_nodes = config_keys(cfg)
        if (
            key in known
            or key.rpartition(".")[0] in open_nodes
            or any(key == k or key.startswith(k + ".") for k in optional)
        ):
            continue
        close = _closest(key, list(dict.fromkeys(known + optional)))
        hint = f"did you mean {' or '.join(close)}?" if close else "the config has no such node"
        raise UsageError(f"{key}: no such key; {hint} (to add a key the config lacks: +{opt})")
