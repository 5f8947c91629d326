"""The ``trackers`` node of a config: one switch per tracker, its defaults, and the checks made before training.

Lazy configs of both stages hold it as ``train.trackers`` (``configs/common/trackers.py``)::

    trackers = dict(
        wandb=dict(enabled=False, project="condinit-det", entity=None, mode="offline", group=None),
        mlflow=dict(enabled=False, tracking_uri=None, experiment=None),
    )

yacs configs as ``TRACKERS.WANDB.{ENABLED,PROJECT,ENTITY,MODE,GROUP}`` and
``TRACKERS.MLFLOW.{ENABLED,TRACKING_URI,EXPERIMENT}``. A config without the node gets the defaults (every tracker
off). :func:`tracker_settings` validates the node (unknown keys and bad values are one-line errors);
:func:`check_trackers` checks, before anything is written, that an enabled tracker's package imports and its
settings can work.
"""
from __future__ import annotations

import copy
import importlib
import os
import tempfile
from typing import Any, Dict, List, Mapping, Optional

from ..utils.errors import UsageError

__all__ = ["DEFAULTS", "TRACKERS", "check_trackers", "enabled_trackers", "experiment_name", "file_store_path",
           "mlflow_tracking_uri", "tracker_settings"]

# The trackers, in the order they are opened; each one's package and the extra that installs it.
TRACKERS = ("wandb", "mlflow")
_PACKAGES = {"wandb": ("wandb", "wandb"), "mlflow": ("mlflow", "mlflow")}
WANDB_MODES = ("offline", "online")
MLFLOW_STORE_DIRNAME = "mlruns"

DEFAULTS: Dict[str, Dict[str, Any]] = {
    "wandb": {
        "enabled": False,
        "project": "condinit-det",
        "entity": None,  # None: the account's default entity (online mode)
        "mode": "offline",  # "offline": files in each run directory, for `wandb sync`; "online": a W&B account
        "group": None,  # None: the experiment directory's name
    },
    "mlflow": {
        "enabled": False,
        "tracking_uri": None,  # None: a file store <experiment's parent folder>/mlruns
        "experiment": None,  # None: the experiment directory's name
    },
}
_YACS_KEYS = {"wandb": "WANDB", "mlflow": "MLFLOW"}


def _node(cfg) -> Optional[Mapping]:
    """The raw trackers node of a config (lazy or yacs), or None."""
    if cfg is None:
        return None
    if _is_yacs(cfg):
        node = cfg.get("TRACKERS")
        if node is None:
            return None
        return {name: {k.lower(): v for k, v in dict(node.get(key) or {}).items()}
                for name, key in _YACS_KEYS.items() if node.get(key) is not None}
    train = cfg.get("train") if hasattr(cfg, "get") else None
    if train is None or not hasattr(train, "get"):
        return None
    return train.get("trackers")


def _is_yacs(cfg) -> bool:
    try:
        from yacs.config import CfgNode
    except ImportError:  # pragma: no cover - detectron2 depends on yacs
        return False
    return isinstance(cfg, CfgNode)


def _plain(value):
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:  # pragma: no cover - a dependency
        return value
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


def _where(cfg, name: str, key: Optional[str] = None) -> str:
    if _is_yacs(cfg):
        return "TRACKERS." + _YACS_KEYS[name] + (f".{key.upper()}" if key else "")
    return f"train.trackers.{name}" + (f".{key}" if key else "")


def tracker_settings(cfg) -> Dict[str, Dict[str, Any]]:
    """The validated trackers node of ``cfg`` (a lazy config of either stage, a yacs config, or anything without
    the node) with the defaults filled in. Raises :class:`UsageError` naming the key on an unknown key or a bad
    value."""
    raw = _plain(_node(cfg))
    settings = copy.deepcopy(DEFAULTS)
    if raw is None:
        return settings
    if not isinstance(raw, Mapping):
        raise UsageError(f"{_where(cfg, 'wandb').rsplit('.', 1)[0]} must be a dict with the keys "
                         f"{', '.join(TRACKERS)}; got {raw!r}")
    unknown = sorted(set(raw) - set(TRACKERS))
    if unknown:
        raise UsageError(f"{_where(cfg, 'wandb').rsplit('.', 1)[0]} has unknown tracker(s) {', '.join(unknown)}; "
                         f"accepted: {', '.join(TRACKERS)}")
    for name, given in raw.items():
        if given is None:
            continue
        if not isinstance(given, Mapping):
            raise UsageError(f"{_where(cfg, name)} must be a dict with the keys {', '.join(DEFAULTS[name])}; "
                             f"got {given!r}")
        bad = sorted(set(given) - set(DEFAULTS[name]))
        if bad:
            raise UsageError(f"{_where(cfg, name)} has unknown key(s) {', '.join(bad)}; accepted: "
                             f"{', '.join(DEFAULTS[name])}")
        settings[name].update(given)
    for name, values in settings.items():
        if not isinstance(values["enabled"], bool):
            raise UsageError(f"{_where(cfg, name, 'enabled')}={values['enabled']!r}: expected True or False")
        for key, value in values.items():
            if key != "enabled" and value is not None and not isinstance(value, str):
                raise UsageError(f"{_where(cfg, name, key)}={value!r}: expected a string or None")
    wandb = settings["wandb"]
    if wandb["mode"] not in WANDB_MODES:
        raise UsageError(f"{_where(cfg, 'wandb', 'mode')}={wandb['mode']!r}; accepted: {', '.join(WANDB_MODES)} "
                         "(enabled=False turns W&B off)")
    if not wandb["project"]:
        raise UsageError(f"{_where(cfg, 'wandb', 'project')} is empty; name a W&B project")
    return settings


def enabled_trackers(settings: Optional[Mapping]) -> List[str]:
    """The names of the trackers ``settings`` turns on, in :data:`TRACKERS` order."""
    return [name for name in TRACKERS if settings and (settings.get(name) or {}).get("enabled")]


def experiment_name(experiment_dir: str) -> str:
    """What an experiment is called in the trackers by default: its directory's name."""
    return os.path.basename(os.path.normpath(os.path.abspath(experiment_dir))) or "condinit-det"


def mlflow_tracking_uri(settings: Mapping, experiment_dir: str) -> str:
    """The MLflow tracking URI: the configured one, else a file store ``mlruns/`` beside the experiment
    directory (in its parent folder, shared by the experiments there)."""
    uri = settings["mlflow"]["tracking_uri"]
    if uri:
        return uri
    parent = os.path.dirname(os.path.normpath(os.path.abspath(experiment_dir)))
    return "file://" + os.path.join(parent, MLFLOW_STORE_DIRNAME)


def file_store_path(uri: str) -> Optional[str]:
    """The folder of a file-store URI (``file://...`` or a plain path), else None."""
    if uri.startswith("file:"):
        from urllib.parse import unquote, urlparse

        return unquote(urlparse(uri).path)
    return None if "://" in uri or uri.startswith(("sqlite:", "databricks")) else uri


def _check_importable(name: str) -> None:
    module, extra = _PACKAGES[name]
    try:
        importlib.import_module(module)
    except ImportError as e:
        raise UsageError(f"the {name} tracker is enabled but the {module} package does not import ({e}); install "
                         f"it with: pip install 'condinit-det[{extra}]' (or set train.trackers.{name}.enabled=False)"
                         ) from None


def _check_writable_folder(path: str, what: str) -> None:
    """``path`` exists as a folder that takes files, or can be created (nothing is created)."""
    existing = os.path.abspath(path)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    problem = None
    if not os.path.isdir(existing):
        problem = f"{existing} is not a directory"
    else:
        try:
            os.rmdir(tempfile.mkdtemp(prefix=".write-test.", dir=existing))
        except OSError as e:
            problem = e.strerror
    if problem:
        raise UsageError(f"{what}: cannot write to {path} ({problem})")


def _check_wandb(settings: Mapping) -> None:
    if settings["mode"] != "online":
        return
    import wandb

    try:  # no prompt, no network: only whether an API key is configured
        wandb.login(verify=False, prompt=False)
    except Exception as e:  # noqa: BLE001 -- wandb raises its own error types
        raise UsageError(f"train.trackers.wandb.mode='online' needs a W&B account on this machine "
                         f"({' '.join(str(e).split())}); run `wandb login` or set WANDB_API_KEY, or keep "
                         "mode='offline' and `wandb sync` the runs later") from None


def _check_mlflow(settings: Mapping, uri: str) -> None:
    path = file_store_path(uri)
    if path is not None:
        _check_writable_folder(path, f"train.trackers.mlflow (file store {uri})")
        return
    from mlflow.tracking import MlflowClient

    try:  # a server or database store: reachable and readable now rather than failing mid-run
        with _environ(MLFLOW_HTTP_REQUEST_MAX_RETRIES="0", MLFLOW_HTTP_REQUEST_TIMEOUT="10"):
            MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
    except Exception as e:  # noqa: BLE001 -- MLflow raises many types
        message = " ".join(str(e).split())[:300]
        raise UsageError(f"train.trackers.mlflow.tracking_uri={uri!r} does not work ({type(e).__name__}: "
                         f"{message}); use a reachable server or database, or None for a file store beside the "
                         "experiment") from None


class _environ:
    """Set environment variables for a block (those already set are kept)."""

    def __init__(self, **values):
        self.values, self.saved = values, {}

    def __enter__(self):
        for key, value in self.values.items():
            self.saved[key] = os.environ.get(key)
            os.environ.setdefault(key, value)

    def __exit__(self, *exc):
        for key, value in self.saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def check_trackers(settings: Mapping, experiment_dir: str) -> None:
    """Before anything is written: every enabled tracker's package imports and its settings can work (W&B
    online mode has an API key; MLflow's store can be written or reached). Raises :class:`UsageError`."""
    for name in enabled_trackers(settings):
        _check_importable(name)
    if settings["wandb"]["enabled"]:
        _check_wandb(settings["wandb"])
    if settings["mlflow"]["enabled"]:
        _check_mlflow(settings["mlflow"], mlflow_tracking_uri(settings, experiment_dir))
