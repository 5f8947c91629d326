"""The project's configs by name, as detectron2's ``model_zoo`` serves its own.

    from condinit_det import model_zoo
    cfg = model_zoo.get_config("COCO/mask_rcnn_xcit_s12_p16_3x_in1k.py")    # lazy: a DictConfig
    path = model_zoo.get_config_file("demo/mask_rcnn_vit_tiny.py")           # the file itself
    model_zoo.list_configs()                                                  # every name

A name is a config's path relative to the checkout's ``configs/`` folder ("COCO/...",
"ImageNet/...", "demo/...", "yacs/..."). Built wheels carry a copy of that folder at
``condinit_det/model_zoo/configs`` (setup.py copies it at build time); a checkout or an editable
install reads the top-level ``configs/`` itself. Relative imports between configs
(``from ..common.condinit import condinit``) work from either place.

On the command line every ``--config-file`` takes a path or ``zoo:<name>``
(:func:`resolve_config_file`), e.g. ``condinit-train --config-file zoo:demo/mask_rcnn_vit_tiny.py``.
"""
import difflib
import os
from typing import List

__all__ = ["ZOO_PREFIX", "configs_root", "get_config", "get_config_file", "is_yacs_file", "list_configs",
           "resolve_config_file"]

ZOO_PREFIX = "zoo:"
EXTENSIONS = (".py", ".yaml", ".yml")
# Pieces imported by the configs, not configs of their own.
_PIECES = ("common/",)
_EXAMPLE = "zoo:demo/mask_rcnn_vit_tiny.py"

_PACKAGED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")
_CHECKOUT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs")


def configs_root() -> str:
    """The folder the names are relative to: the wheel's copy, else the checkout's ``configs/``."""
    for root in (_PACKAGED, _CHECKOUT):
        if os.path.isdir(root):
            return root
    raise FileNotFoundError(f"no model-zoo configs: neither {_PACKAGED} (an installed wheel) nor {_CHECKOUT} "
                            "(a checkout) exists; reinstall condinit-det")


def _all_files(root: str) -> List[str]:
    names = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        rel = os.path.relpath(folder, root)
        names.extend((f if rel == "." else f"{rel}/{f}").replace(os.sep, "/") for f in files if f.endswith(EXTENSIONS))
    return sorted(names)


def list_configs() -> List[str]:
    """Every config's name (sorted), without the ``common/`` pieces the configs import."""
    return [n for n in _all_files(configs_root()) if not n.startswith(_PIECES)]


def get_config_file(config_path: str) -> str:
    """Absolute path of the config named ``config_path`` (e.g. ``"demo/mask_rcnn_vit_tiny.py"``)."""
    root = configs_root()
    name = str(config_path).strip().replace(os.sep, "/")
    path = os.path.normpath(os.path.join(root, name))
    if name and not os.path.isabs(name) and path.startswith(root + os.sep) and os.path.isfile(path):
        return path
    known = _all_files(root)
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(close)}?" if close else f"available: {', '.join(list_configs())}"
    raise FileNotFoundError(f"{config_path!r} is not a model-zoo config (names are paths under configs/, "
                            f"e.g. demo/mask_rcnn_vit_tiny.py); {hint}")


def is_yacs_file(path: str) -> bool:
    """Whether a ``.yaml`` file is a yacs config (upper-case keys, ``_BASE_``) rather than a saved lazy one."""
    if not path.endswith((".yaml", ".yml")):
        return False
    import yaml

    with open(path) as f:
        data = yaml.safe_load(f) or {}
    return any(str(k).isupper() or k == "_BASE_" for k in data)


def get_config(config_path: str):
    """The named config loaded: lazy configs as a ``DictConfig`` (``LazyConfig.load``), yacs ones as a
    ``CfgNode`` from ``get_cfg()`` with the project's keys
    (:func:`condinit_det.modeling.yacs_config.add_condinit_config`)."""
    path = get_config_file(config_path)
    if is_yacs_file(path):
        from detectron2.config import get_cfg

        from condinit_det.modeling.yacs_config import add_condinit_config

        cfg = get_cfg()
        add_condinit_config(cfg)
        cfg.merge_from_file(path)
        return cfg
    from detectron2.config import LazyConfig

    return LazyConfig.load(path)


def resolve_config_file(spec: str) -> str:
    """A command line's ``--config-file``: ``zoo:<name>`` is the model-zoo config, anything else a path.

    Raises FileNotFoundError (one line, with the accepted forms) when there is no such file or name.
    """
    spec = str(spec)
    if spec.startswith(ZOO_PREFIX):
        return get_config_file(spec[len(ZOO_PREFIX):])
    if os.path.isfile(spec):
        return spec
    hint = f"give a config file or a model-zoo name such as {_EXAMPLE}"
    name = spec[len("configs/"):] if spec.startswith("configs/") else spec
    try:
        if name in _all_files(configs_root()):
            hint = f"for the model-zoo config write {ZOO_PREFIX}{name}"
    except FileNotFoundError:
        pass
    raise FileNotFoundError(f"config file {spec!r} does not exist; {hint}")
