"""The ``train.trackers`` node of a config of either stage (``configs/common/trackers.py``; yacs: ``TRACKERS.*``), its
:data:`DEFAULTS` (every tracker off) and the checks made before training."""

from __future__ import annotations

import copy
import importlib
import os
from typing import Any, Dict, List, Mapping

from ..records.failures import one_line
from ..utils.errors import UsageError

__all__ = ["DEFAULTS", "check_trackers", "enabled_trackers", "mlflow_tracking_uri", "tracker_settings"]

DEFAULTS: Dict[str, Dict[str, Any]] = {
    # mode "offline": files in each run directory for `wandb sync`; group None: the experiment directory's name
    "wandb": {"enabled": False, "project": "condinit-det", "entity": None, "mode": "offline", "group": None},
    # tracking_uri None: sqlite:///<the experiment's parent folder>/mlflow.db; experiment None: as W&B's group
    "mlflow": {"enabled": False, "tracking_uri": None, "experiment": None},
}


def _keys_of(value, accepted, where: str, what: str) -> Mapping:
    if not isinstance(value, Mapping):
        raise UsageError(f"{where} must be a dict with the keys {', '.join(accepted)}; got {value!r}")
    unknown = sorted(set(value) - set(accepted))
    if unknown:
        raise UsageError(f"{where} has unknown {what}(s) {', '.join(unknown)}; accepted: {', '.join(accepted)}")
    return value


def tracker_settings(cfg) -> Dict[str, Dict[str, Any]]:
    """The ``train.trackers`` node of ``cfg`` (a lazy config of either stage, or a config without the node) with the
    defaults filled in. Raises a one-line :class:`UsageError` naming the key on an unknown key or a bad value."""
    trackers = (cfg.get("train") or {}).get("trackers") or {}
    settings = copy.deepcopy(DEFAULTS)
    for name, given in _keys_of(trackers, DEFAULTS, "train.trackers", "tracker").items():
        settings[name].update(_keys_of(given or {}, DEFAULTS[name], f"train.trackers.{name}", "key"))
        for key, value in settings[name].items():
            setting = f"train.trackers.{name}.{key}"
            if key == "enabled" and not isinstance(value, bool):
                raise UsageError(f"{setting}={value!r}: expected True or False")
            if key != "enabled" and value is not None and not isinstance(value, str):
                raise UsageError(f"{setting}={value!r}: expected a string or None")
            if key == "mode" and value not in ("offline", "online"):
                raise UsageError(f"{setting}={value!r}; accepted: offline, online (enabled=False turns W&B off)")
            if key == "project" and not value:
                raise UsageError(f"{setting} is empty; name a W&B project")
    return settings


def enabled_trackers(settings: Mapping) -> List[str]:
    """The names of the trackers ``settings`` turns on, in :data:`DEFAULTS` order."""
    return [name for name in DEFAULTS if settings and (settings.get(name) or {}).get("enabled")]


def mlflow_tracking_uri(settings: Mapping, experiment_dir: str) -> str:
    """MLflow's store: ``settings["tracking_uri"]`` (the tracker's entry), else a SQLite database ``mlflow.db``
    beside the experiment directory (in its parent folder, shared by the experiments there)."""
    parent = os.path.dirname(os.path.abspath(experiment_dir))
    return settings["tracking_uri"] or "sqlite:///" + os.path.join(parent, "mlflow.db")


def check_trackers(settings: Mapping, experiment_dir: str) -> None:
    """Before anything is written: every enabled tracker's packages import and its settings can work (W&B online
    mode has an API key; MLflow's store can be written or reached). Raises :class:`UsageError`."""
    uri = mlflow_tracking_uri(settings["mlflow"], experiment_dir)
    database = ["sqlalchemy", "alembic"] if uri.startswith("sqlite:") else []  # MLflow's SQL store needs them
    packages = {"wandb": ["wandb"], "mlflow": ["mlflow"] + database}
    for name in enabled_trackers(settings):
        for module in packages[name]:
            try:
                importlib.import_module(module)
            except ImportError as e:
                raise UsageError(
                    f"the {name} tracker is enabled but the {module} package does not import ({e}); "
                    f"install it with: pip install 'condinit-det[{name}]' (or set "
                    f"train.trackers.{name}.enabled=False)"
                ) from None
    if settings["wandb"]["enabled"] and settings["wandb"]["mode"] == "online":
        import wandb

        if not wandb.login(verify=False, prompt=False):  # no prompt, no network: whether an API key is configured
            raise UsageError(
                "train.trackers.wandb.mode='online' needs a W&B account on this machine: run `wandb "
                "login` or set WANDB_API_KEY, or keep mode='offline' and `wandb sync` the runs later"
            )
    if settings["mlflow"]["enabled"] and uri.startswith("sqlite:///"):  # its folder takes files (none is created)
        folder = existing = os.path.dirname(os.path.abspath(uri[len("sqlite:///") :]))
        while not os.path.exists(existing):
            existing = os.path.dirname(existing)
        if not (os.path.isdir(existing) and os.access(existing, os.W_OK)):
            raise UsageError(
                f"train.trackers.mlflow: cannot write to {folder} for the store {uri} ({existing} "
                "is not a writable directory)"
            )
    elif settings["mlflow"]["enabled"]:  # a server or another database answers now, not in the middle of a run
        try:
            _reach_mlflow(uri)
        except Exception as e:  # noqa: BLE001 -- MLflow raises many types
            raise UsageError(
                f"train.trackers.mlflow.tracking_uri={uri!r} does not work ({one_line(e)}); use a reachable server "
                "or database, or None for a SQLite database beside the experiment"
            ) from None


def _reach_mlflow(uri: str) -> None:
    """Ask MLflow's store at ``uri`` for one experiment; a server gets one try of at most 10 s (MLflow's defaults
    would retry for minutes) unless MLflow's environment variables say otherwise."""
    if not uri.startswith(("http://", "https://")):
        from mlflow.tracking import MlflowClient

        MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
        return
    from mlflow.environment_variables import MLFLOW_HTTP_REQUEST_MAX_RETRIES, MLFLOW_HTTP_REQUEST_TIMEOUT
    from mlflow.utils.credentials import get_default_host_creds
    from mlflow.utils.rest_utils import http_request_safe

    http_request_safe(
        get_default_host_creds(uri),
        "/api/2.0/mlflow/experiments/search",
        "POST",
        max_retries=MLFLOW_HTTP_REQUEST_MAX_RETRIES.get() if MLFLOW_HTTP_REQUEST_MAX_RETRIES.defined else 0,
        timeout=MLFLOW_HTTP_REQUEST_TIMEOUT.get() if MLFLOW_HTTP_REQUEST_TIMEOUT.defined else 10,
        json={"max_results": 1},
    )
