"""The one check of command-line config overrides both stages make: a key the config does not have is refused
(``LazyConfig.apply_overrides`` would add it silently, so ``train.max_itr=10`` would train the full schedule); a
deliberate new key is written ``+key=value``. The error is one line with the closest keys.
"""
from __future__ import annotations

import difflib
from typing import Iterable, List, Sequence

from .errors import UsageError

__all__ = ["check_override_keys", "config_keys"]


def config_keys(node, prefix: str = "") -> List[str]:
    """Every dotted key of an OmegaConf (lazy) config, nested ones included, without resolving interpolations."""
    from omegaconf import DictConfig

    keys = []
    for key, value in node.items_ex(resolve=False):
        dotted = f"{prefix}{key}"
        keys.append(dotted)
        if isinstance(value, DictConfig):
            keys += config_keys(value, dotted + ".")
    return keys


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
            known = config_keys(cfg)
        if key in known or any(key == k or key.startswith(k + ".") for k in optional):
            continue
        close = _closest(key, list(dict.fromkeys(known + optional)))
        hint = f"did you mean {' or '.join(close)}?" if close else "the config has no such node"
        raise UsageError(f"{key}: no such key; {hint} (to add a key the config lacks: +{opt})")
