"""The project's configs by name (a path under ``configs/``), as detectron2's ``model_zoo`` serves its own, and the
loader of every ``--config-file`` (a path or ``zoo:<name>``)."""

import difflib
import glob
import os
import warnings
from typing import Any, List, Mapping, Sequence

from ..utils.errors import UsageError
from ..utils.overrides import check_override_keys

__all__ = [
    "ZOO_PREFIX",
    "configs_root",
    "get_config",
    "get_config_file",
    "list_configs",
    "load_config",
    "resolve_config_file",
]

ZOO_PREFIX = "zoo:"
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_ROOTS = (os.path.join(_PACKAGE, "model_zoo", "configs"), os.path.join(os.path.dirname(_PACKAGE), "configs"))


def configs_root() -> str:
    """The folder the names are relative to: a built wheel's copy of ``configs/``, else the checkout's."""
    for root in _ROOTS:
        if os.path.isdir(root):
            return root
    raise FileNotFoundError(f"no model-zoo configs in {' or '.join(_ROOTS)}; reinstall condinit-det")


def _all_files(root: str) -> List[str]:
    found = glob.glob("**/*.*", root_dir=root, recursive=True)
    return sorted(f.replace(os.sep, "/") for f in found if f.endswith((".py", ".yaml", ".yml")) and "__" not in f)


def list_configs() -> List[str]:
    """Every config's name (sorted), without the ``common/`` pieces the configs import."""
    return [n for n in _all_files(configs_root()) if not n.startswith("common/")]


def get_config_file(config_path: str) -> str:
    """Absolute path of the config named ``config_path``."""
    root, name = configs_root(), str(config_path).strip().replace(os.sep, "/")
    path = os.path.normpath(os.path.join(root, name))
    if name and not os.path.isabs(name) and path.startswith(root + os.sep) and os.path.isfile(path):
        return path
    close = difflib.get_close_matches(name, _all_files(root), n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(close)}?" if close else f"available: {', '.join(list_configs())}"
    raise FileNotFoundError(
        f"{config_path!r} is not a model-zoo config (names are paths under configs/, "
        f"e.g. demo/mask_rcnn_vit_tiny.py); {hint}"
    )


def get_config(config_path: str):
    """The model-zoo config named ``config_path`` (its path under ``configs/``, e.g. ``"demo/mask_rcnn_vit_tiny.py"``),
    loaded by :func:`load_config` without overrides; FileNotFoundError naming the closest names for an unknown one."""
    return load_config(get_config_file(config_path))


def resolve_config_file(spec: str) -> str:
    """``zoo:<name>`` -> the model-zoo config; anything else is a path. Raises FileNotFoundError (one line)."""
    spec = str(spec)
    if spec.startswith(ZOO_PREFIX):
        return get_config_file(spec[len(ZOO_PREFIX) :])
    if os.path.isfile(spec):
        return spec
    name = spec.removeprefix("configs/")
    hint = f"give a config file or a model-zoo name such as {ZOO_PREFIX}demo/mask_rcnn_vit_tiny.py"
    if any(os.path.isfile(os.path.join(root, name)) for root in _ROOTS):
        hint = f"for the model-zoo config write {ZOO_PREFIX}{name}"
    raise FileNotFoundError(f"config file {spec!r} does not exist; {hint}")


def load_config(config_file: str, opts: Sequence[str] = (), *, optional: Mapping[str, Any] = {}):
    """``config_file`` (a path or ``zoo:<name>``) with its overrides: a lazy ``.py`` (or saved lazy ``.yaml``) config
    as a ``DictConfig`` (``key=value``; keys it lacks must be ``optional``), a yacs ``.yaml`` one as a ``CfgNode``
    with the project's keys (``KEY VALUE``). Bad input raises a one-line UsageError."""
    import yaml
    from detectron2.config import LazyConfig, get_cfg

    try:
        path = resolve_config_file(config_file)
    except FileNotFoundError as e:
        raise UsageError(f"--config-file: {e}") from None
    with open(path) as f:  # a yacs .yaml has upper-case keys (or _BASE_); a saved lazy one lower-case ones
        keys = yaml.safe_load(f) if path.endswith((".yaml", ".yml")) else None
    opts, yacs_file = list(opts), any(str(k).isupper() or k == "_BASE_" for k in keys or {})
    if yacs_file:
        from ..modeling.yacs_config import add_condinit_config

        cfg = add_condinit_config(get_cfg())
        cfg.merge_from_file(path)
    else:
        with warnings.catch_warnings():  # detectron2's model_zoo imports the deprecated pkg_resources
            warnings.filterwarnings("ignore", message="pkg_resources is deprecated", category=UserWarning)
            cfg = LazyConfig.load(path)
        check_override_keys(cfg, opts, optional=optional)
    try:
        if yacs_file:
            cfg.merge_from_list(opts)
            return cfg
        return LazyConfig.apply_overrides(cfg, opts)
    except Exception as e:  # yacs, hydra's parser and OmegaConf raise several types
        first = (str(e) or type(e).__name__).splitlines()[0]
        raise UsageError(f"cannot apply overrides {' '.join(opts)!r}: {first}") from None
