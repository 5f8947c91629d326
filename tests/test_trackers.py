"""Experiment trackers (condinit_det.tracking): Weights & Biases and MLflow for both stages, offline.

The end-to-end tests train tiny two-arm experiments with both trackers on and read them back through each tracker's
own data: MLflow's client on the SQLite store beside the experiment, and W&B's offline run files (the transaction log
``run-<id>.wandb`` that ``wandb sync`` uploads, decoded with W&B's own protobuf records). The fast tests pin the config
node, the one-line errors, the writers' steps, ids and endings, and the real trackers' runs continued by a resume.
"""

import glob
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from forked_tool import run_tool

from condinit_det.records.layout import RunSpec
from condinit_det.records.results import ResultsFile
from condinit_det.tracking.settings import DEFAULTS, check_trackers, mlflow_tracking_uri, tracker_settings
from condinit_det.tracking.writers import (
    MLFLOW_RUN_ID_TAG,
    MlflowWriter,
    TrackerWriter,
    WandbWriter,
    attach_report,
    tracker_run_id,
)
from condinit_det.utils.errors import UsageError
from condinit_det.utils.preemption import Preempted

ROOT = Path(__file__).resolve().parents[1]
TRAIN_NET = str(ROOT / "tools" / "train_net.py")
PRETRAIN_NET = str(ROOT / "tools" / "pretrain_net.py")
FAILING_CONFIG = str(ROOT / "tests" / "tiny_failing_config.py")
PRETRAIN_DEMO = str(ROOT / "configs" / "demo" / "pretrain_vit_tiny.py")
BOTH = ["train.trackers.wandb.enabled=True", "train.trackers.mlflow.enabled=True"]


@pytest.fixture
def tracker_env(tmp_path, monkeypatch):
    """W&B quiet, its caches and settings in the test's folder; no account anywhere. Returns the environment of the
    training processes."""
    values = {
        "WANDB_SILENT": "true",
        "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache"),
        "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
        "WANDB_DATA_DIR": str(tmp_path / "wandb-data"),
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "NETRC": str(tmp_path / "no-netrc"),
    }
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    for key in (
        "WANDB_MODE",
        "WANDB_API_KEY",
        "WANDB_PROJECT",
        "WANDB_ENTITY",
        "WANDB_RUN_ID",
        "MLFLOW_TRACKING_URI",
        "MLFLOW_ALLOW_FILE_STORE",
    ):
        monkeypatch.delenv(key, raising=False)
    (tmp_path / "tmp").mkdir()  # W&B's temporary folders, of this process and of the training processes
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    return dict(
        os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONWARNINGS="ignore", TMPDIR=str(tmp_path / "tmp")
    )


def _tool(tool, *argv, cwd, env, **extra):
    proc = run_tool(tool, *argv, cwd=cwd, env={**env, **extra})
    return proc.returncode, proc.stdout, proc.stderr


# ---------------------------------------------------------------------------------------------
# Reading the trackers back
# ---------------------------------------------------------------------------------------------
def mlflow_runs(folder, experiment):
    """({run name: run}, client) of an MLflow experiment in the SQLite store ``<folder>/mlflow.db``."""
    from mlflow.tracking import MlflowClient

    assert (Path(folder) / "mlflow.db").is_file(), f"no MLflow database in {folder}"
    client = MlflowClient(tracking_uri=f"sqlite:///{folder}/mlflow.db")
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no MLflow experiment {experiment!r} in {folder}"
    runs = client.search_runs([found.experiment_id])
    names = [r.info.run_name for r in runs]
    assert len(names) == len(set(names)), names  # one tracker run per run: a resume adds none
    return {r.info.run_name: r for r in runs}, client


def history(client, run, key):
    return [(m.step, m.value) for m in sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)]


def _wandb_records(path):
    """The protobuf records of a W&B transaction log (``run-<id>.wandb``): a 7-byte header, then 32 KiB blocks of
    chunks (checksum, length, type: full / first / middle / last)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    if not data:  # a session killed before W&B wrote anything
        return []
    assert data[:4] == b":W&B", path
    block, pos, parts, payloads = 32768, 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 0:
            break
        if kind == 1:
            payloads.append(chunk)
        elif kind == 2:
            parts = chunk
        elif kind == 3:
            parts += chunk
        elif kind == 4:
            payloads.append(parts + chunk)
    return [pb.Record.FromString(p) for p in payloads]


def wandb_sessions(run_dir, timeout=30.0):
    """Each offline W&B session of ``run_dir`` (oldest first): its run record, history rows, config, saved files and
    exit code. W&B's service process writes a session's log after the run's ``finish()`` returns: read again until
    every session has its exit record, for at most ``timeout`` seconds."""
    deadline = time.time() + timeout
    while True:
        sessions = _read_wandb_sessions(run_dir)
        if all(s["exit"] is not None for s in sessions) or time.time() > deadline:
            return sessions
        time.sleep(0.2)


def _read_wandb_sessions(run_dir):
    sessions = []
    for folder in sorted(glob.glob(os.path.join(run_dir, "wandb", "offline-run-*"))):
        logs = glob.glob(os.path.join(folder, "run-*.wandb"))  # none: killed before W&B opened it
        assert len(logs) <= 1, logs
        session = {"folder": folder, "rows": [], "config": {}, "exit": None, "run": None, "preempting": False}
        for record in _wandb_records(logs[0]) if logs else []:
            kind = record.WhichOneof("record_type")
            if kind == "run":
                session["run"] = record.run
                session["config"].update({u.key: json.loads(u.value_json) for u in record.run.config.update})
            elif kind == "config":
                session["config"].update({u.key: json.loads(u.value_json) for u in record.config.update})
            elif kind == "history":
                session["rows"].append(
                    {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
                )
            elif kind == "exit":
                session["exit"] = record.exit.exit_code
            elif kind == "preempting":
                session["preempting"] = True
        files = os.path.join(folder, "files")
        session["files"] = sorted(os.path.relpath(os.path.join(r, f), files) for r, _, fs in os.walk(files) for f in fs)
        sessions.append(session)
    return sessions


def wandb_series(sessions, key, step="iteration"):
    return [(row[step], row[key]) for s in sessions for row in s["rows"] if key in row]


# ---------------------------------------------------------------------------------------------
# The config node
# ---------------------------------------------------------------------------------------------
def _lazy_configs():
    return sorted(p for sub in ("COCO", "ImageNet", "demo") for p in glob.glob(str(ROOT / "configs" / sub / "*.py")))


def test_common_trackers_node_is_the_code_defaults():
    from detectron2.config import LazyConfig

    node = LazyConfig.load(str(ROOT / "configs" / "common" / "trackers.py")).trackers
    from omegaconf import OmegaConf

    assert OmegaConf.to_container(node) == DEFAULTS
    assert DEFAULTS["wandb"]["mode"] == "offline" and not DEFAULTS["wandb"]["enabled"]
    assert not DEFAULTS["mlflow"]["enabled"] and DEFAULTS["mlflow"]["tracking_uri"] is None


@pytest.mark.parametrize("path", _lazy_configs(), ids=lambda p: os.path.relpath(p, ROOT / "configs"))
def test_every_config_of_both_stages_has_the_switches_off(path):
    from detectron2.config import LazyConfig
    from omegaconf import OmegaConf

    cfg = LazyConfig.load(path)
    assert "trackers" in cfg.train, f"{path}: train.trackers is missing"
    assert OmegaConf.to_container(cfg.train.trackers) == DEFAULTS
    assert tracker_settings(LazyConfig.apply_overrides(cfg, ["train.trackers.mlflow.enabled=True"])) == {
        **DEFAULTS,
        "mlflow": {**DEFAULTS["mlflow"], "enabled": True},
    }


def test_yacs_configs_have_the_switches():
    from detectron2.config import get_cfg

    from condinit_det.engine.yacs import lazy_from_yacs
    from condinit_det.modeling.yacs_config import add_condinit_config

    cfg = add_condinit_config(get_cfg())
    cfg.merge_from_file(str(ROOT / "configs" / "yacs" / "mask_rcnn_vit_tiny_embedded.yaml"))
    assert tracker_settings(lazy_from_yacs(cfg)) == DEFAULTS  # as the detection stage loads it
    cfg.merge_from_list(
        [
            "TRACKERS.WANDB.ENABLED",
            "True",
            "TRACKERS.WANDB.PROJECT",
            "p",
            "TRACKERS.MLFLOW.TRACKING_URI",
            "sqlite:///tmp/mlflow.db",
        ]
    )
    settings = tracker_settings(lazy_from_yacs(cfg))
    assert settings["wandb"] == {**DEFAULTS["wandb"], "enabled": True, "project": "p"}
    assert settings["mlflow"]["tracking_uri"] == "sqlite:///tmp/mlflow.db" and not settings["mlflow"]["enabled"]
    cfg.merge_from_list(["TRACKERS.WANDB.MODE", "cloud"])
    with pytest.raises(UsageError, match=r"train\.trackers\.wandb\.mode='cloud'; accepted: offline, online"):
        tracker_settings(lazy_from_yacs(cfg))


@pytest.mark.parametrize(
    "node, message",
    [
        ({"neptune": {}}, "train.trackers has unknown tracker(s) neptune; accepted: wandb, mlflow"),
        (
            {"wandb": {"enabled": True, "projct": "x"}},
            "train.trackers.wandb has unknown key(s) projct; accepted: enabled, project, entity, mode, group",
        ),
        ({"wandb": {"enabled": "yes"}}, "train.trackers.wandb.enabled='yes': expected True or False"),
        ({"wandb": {"mode": "cloud"}}, "train.trackers.wandb.mode='cloud'; accepted: offline, online"),
        ({"mlflow": {"tracking_uri": 3}}, "train.trackers.mlflow.tracking_uri=3: expected a string or None"),
        ({"wandb": {"project": ""}}, "train.trackers.wandb.project is empty"),
    ],
)
def test_bad_settings_are_named(node, message):
    with pytest.raises(UsageError) as e:
        tracker_settings({"train": {"trackers": node}})
    assert str(e.value).startswith(message)


def test_a_config_without_the_node_gets_the_defaults():
    assert tracker_settings({"train": {"output_dir": "x"}}) == DEFAULTS
    assert tracker_settings({"output_dir": "x"}) == DEFAULTS  # a stage whose configs have no train node


def _refusal(tmp_path, capsys, *opts):
    from condinit_det.engine import DetectionStage
    from condinit_det.launch.command import run_command

    out = tmp_path / "exp"
    code = run_command(
        DetectionStage,
        ["--config-file", str(ROOT / "tests" / "tiny_train_config.py"), f"train.output_dir={out}", *opts],
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert not out.exists(), "nothing may be written before a refusal"
    return code, err


def test_a_missing_package_is_one_line_before_training(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if it were not installed
    code, err = _refusal(tmp_path, capsys, "train.trackers.wandb.enabled=True")
    assert code == 2 and len(err) == 1, err
    message = err[0].split(": error: ", 1)[1]
    assert message.startswith("the wandb tracker is enabled but the wandb package does not import (")
    assert message.endswith(
        "install it with: pip install 'condinit-det[wandb]' (or set train.trackers.wandb.enabled=False)"
    )
    import mlflow  # noqa: F401 -- imported without sqlalchemy, it would keep SQL stores off for this process

    monkeypatch.setitem(sys.modules, "sqlalchemy", None)  # MLflow's SQLite store needs it
    code, err = _refusal(tmp_path, capsys, "train.trackers.mlflow.enabled=True")
    assert code == 2 and len(err) == 1 and "the sqlalchemy package does not import" in err[0], err


def test_a_bad_setting_is_one_line_before_training(tmp_path, capsys):
    code, err = _refusal(tmp_path, capsys, "train.trackers.wandb.mode=cloud")
    assert code == 2 and len(err) == 1, err
    assert err[0].endswith(
        "error: train.trackers.wandb.mode='cloud'; accepted: offline, online (enabled=False turns W&B off)"
    )
    blocked = tmp_path / "file"
    blocked.write_text("")
    code, err = _refusal(
        tmp_path,
        capsys,
        "train.trackers.mlflow.enabled=True",
        f"train.trackers.mlflow.tracking_uri=sqlite:///{blocked}/mlflow.db",
    )
    assert code == 2 and len(err) == 1 and f"cannot write to {blocked} for the store" in err[0], err


def test_the_mlflow_store_is_a_sqlite_database_beside_the_experiment(tmp_path, tracker_env):
    settings = {**DEFAULTS, "mlflow": {**DEFAULTS["mlflow"], "enabled": True}}
    assert mlflow_tracking_uri(settings["mlflow"], "out/exp") == f"sqlite:///{os.path.abspath('out')}/mlflow.db"
    assert mlflow_tracking_uri({"tracking_uri": "http://host:5000"}, "out/exp") == "http://host:5000"
    check_trackers(settings, str(tmp_path / "new" / "exp"))
    assert not (tmp_path / "new").exists()  # checked, not created
    unreachable = {**settings, "mlflow": {**settings["mlflow"], "tracking_uri": "http://127.0.0.1:9"}}
    with pytest.raises(UsageError) as e:
        check_trackers(unreachable, str(tmp_path / "exp"))
    message = str(e.value)
    assert message.startswith("train.trackers.mlflow.tracking_uri='http://127.0.0.1:9' does not work (")
    assert "\n" not in message and not (tmp_path / "exp").exists()


def _mlflow_server(status, body):
    """A local server answering every request with ``status`` and ``body``; returns (its URI, the paths asked)."""
    import http.server
    import threading

    asked = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            asked.append(self.path)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(json.dumps(body).encode())

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}", asked, server


def test_an_mlflow_server_is_asked_once_before_training(tmp_path, tracker_env, monkeypatch):
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_TIMEOUT", raising=False)
    before = dict(os.environ)
    settings = {**DEFAULTS, "mlflow": {**DEFAULTS["mlflow"], "enabled": True}}
    uri, asked, server = _mlflow_server(200, {"experiments": []})
    try:
        check_trackers({**settings, "mlflow": {**settings["mlflow"], "tracking_uri": uri}}, str(tmp_path / "exp"))
        assert asked == ["/api/2.0/mlflow/experiments/search"]
    finally:
        server.shutdown()
    uri, asked, server = _mlflow_server(503, {"error_code": "TEMPORARILY_UNAVAILABLE"})
    try:
        with pytest.raises(UsageError, match=f"^train.trackers.mlflow.tracking_uri='{uri}' does not work"):
            check_trackers({**settings, "mlflow": {**settings["mlflow"], "tracking_uri": uri}}, str(tmp_path / "exp"))
        assert len(asked) == 1  # no retry: MLflow's default would ask 8 times over minutes
        assert dict(os.environ) == before  # the check reads the environment, never changes it
        monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")  # the user's own setting is kept
        monkeypatch.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "0")
        with pytest.raises(UsageError):
            check_trackers({**settings, "mlflow": {**settings["mlflow"], "tracking_uri": uri}}, str(tmp_path / "exp"))
        assert len(asked) == 3
    finally:
        server.shutdown()


def test_wandb_online_needs_an_api_key(tmp_path, tracker_env, monkeypatch):
    online = {**DEFAULTS, "wandb": {**DEFAULTS["wandb"], "enabled": True, "mode": "online"}}
    check_trackers({**online, "wandb": {**online["wandb"], "mode": "offline"}}, str(tmp_path / "exp"))
    with pytest.raises(
        UsageError,
        match=r"^train.trackers.wandb.mode='online' needs a W&B account on this machine: "
        r"run `wandb login` or set WANDB_API_KEY",
    ):
        check_trackers(online, str(tmp_path / "exp"))
    monkeypatch.setenv("WANDB_API_KEY", "0" * 40)
    check_trackers(online, str(tmp_path / "exp"))


# ---------------------------------------------------------------------------------------------
# The writers
# ---------------------------------------------------------------------------------------------
class Recorder(TrackerWriter):
    """A tracker that records what it is sent."""

    tracker = "recorder"

    def __init__(self, run_dir, **kwargs):
        super().__init__(
            {},
            run_dir=str(run_dir),
            experiment_dir=str(Path(run_dir).parents[1]),
            name="default/seed0",
            stage="detection",
            params=kwargs.pop("params", {}),
            **kwargs,
        )
        self.calls = []

    def _open(self):
        self.calls.append(("open",))

    def _log(self, values, step, step_name):
        self.calls.append((step, step_name, values))

    def _attach(self, folder, files):
        self.calls.append(("attach", files))

    def _end(self, how):
        self.calls.append(("end", how))


def test_the_writer_sends_each_scalar_once_with_its_step(tmp_path):
    from detectron2.utils.events import EventStorage

    writer = Recorder(
        tmp_path / "exp" / "default" / "seed0",
        step_offset=1,
        max_step=4,
        exclude=("eval/",),
        params={"arm": "default", "config": None, "identity": {"seed": 0, "arm": "default"}},
    )
    assert writer.calls == []  # the tracker run opens at the first thing sent
    with EventStorage(start_iter=0) as storage:
        for it, loss in enumerate([4.0, 3.0, 2.0, 1.0]):
            storage.iter = it
            storage.put_scalars(total_loss=loss, lr=0.1 * (it + 1), smoothing_hint=False)
            if it == 1:
                storage.put_scalars(**{"bbox/AP": 12.5, "eval/top1": 3.0}, smoothing_hint=False)
                writer.write()
        storage.iter = 4  # detectron2's trainers evaluate after the last iteration at iteration max_iter
        storage.put_scalars(**{"bbox/AP": 20.0}, smoothing_hint=False)
        writer.write()
        writer.write()  # nothing new
    writer.log({"eval/top1": 50.0}, step=2, step_name="epoch")
    writer.close()
    writer.close()  # once
    assert writer.calls == [
        ("open",),
        (2, "iteration", {"bbox/AP": 12.5, "lr": 0.2, "total_loss": 3.0}),
        (4, "iteration", {"lr": pytest.approx(0.4), "total_loss": 1.0}),
        (4, "iteration", {"bbox/AP": 20.0}),
        (2, "epoch", {"eval/top1": 50.0}),
        ("end", "finished"),
    ]
    assert writer.params == {
        "stage": "detection",
        "run": "default/seed0",
        "experiment": str(tmp_path / "exp"),
        "run_dir": str(tmp_path / "exp" / "default" / "seed0"),
        "arm": "default",
        "identity.arm": "default",
        "identity.seed": 0,
    }  # None (no config file) left out


def _trainer(run_dir, fail_with=None):
    """A detectron2 trainer of three steps whose third step raises ``fail_with``, writing to a :class:`Recorder`."""
    from detectron2.engine import TrainerBase, hooks

    class Trainer(TrainerBase):
        def run_step(self):
            if fail_with is not None and self.iter == 2:
                raise fail_with
            self.storage.put_scalar("total_loss", 1.0 / (self.iter + 1), smoothing_hint=False)

    trainer, writer = Trainer(), Recorder(run_dir, step_offset=1, max_step=3)
    trainer.register_hooks([hooks.PeriodicWriter([writer], period=1)])
    return trainer, writer


@pytest.mark.parametrize(
    "error, how",
    [
        (None, "finished"),
        (RuntimeError("data loader failed"), "failed"),
        (Preempted("time limit"), "killed"),
        (KeyboardInterrupt(), "killed"),
    ],
)
def test_closing_ends_the_tracker_run_as_the_training_ended(tmp_path, error, how):
    trainer, writer = _trainer(tmp_path / "exp" / "default" / "seed0", fail_with=error)
    if error is None:
        trainer.train(0, 3)
    else:
        with pytest.raises(type(error)):
            trainer.train(0, 3)
    steps = [call[0] for call in writer.calls if isinstance(call[0], int)]
    assert steps == ([1, 2, 3] if error is None else [1, 2]) and writer.calls[-1] == ("end", how)


def test_tracker_writers_only_in_the_main_process_of_a_tracked_run(tmp_path, monkeypatch):
    from detectron2.utils import comm

    from condinit_det.tracking import tracker_writers

    run_dir = str(tmp_path / "exp" / "mimetic" / "seed1-lr0.5")
    cfg = {"train": {"trackers": {"mlflow": {"enabled": True}}}}
    assert tracker_writers({"train": {}}, run_dir, stage="detection", params={}) == []
    (writer,) = tracker_writers(cfg, run_dir, stage="pretrain", params={"arm": "mimetic"})
    assert isinstance(writer, MlflowWriter) and writer.settings == {**DEFAULTS["mlflow"], "enabled": True}
    assert (writer.name, writer.group, writer.stage) == ("mimetic/seed1-lr0.5", "exp", "pretrain")
    monkeypatch.setattr(comm, "is_main_process", lambda: False)
    assert tracker_writers(cfg, run_dir, stage="pretrain", params={}) == []


def test_the_tracker_run_id_is_the_run_directory_and_its_retries(tmp_path):
    run_dir = tmp_path / "exp" / "default" / "seed0"
    run_dir.mkdir(parents=True)
    first = tracker_run_id(str(run_dir))
    assert first == tracker_run_id(str(run_dir) + "/") and len(first) == 16  # a resume, a requeue: the same id
    assert first != tracker_run_id(str(tmp_path / "exp" / "default" / "seed1"))
    (run_dir / "metrics.json").write_text("{}")
    assert tracker_run_id(str(run_dir)) == first  # whatever the run wrote
    run_dir.rename(str(run_dir) + ".failed0")  # --retry-failed: the same directory, a new run
    run_dir.mkdir()
    second = tracker_run_id(str(run_dir))
    assert second != first and second == tracker_run_id(str(run_dir))
    (tmp_path / "exp" / "default" / "seed0.failed1").mkdir()
    assert tracker_run_id(str(run_dir)) not in (first, second)
    assert tracker_run_id(str(tmp_path / "exp" / "default" / "seed0-lr0.5")) == tracker_run_id(
        str(tmp_path / "exp" / "default" / "seed0-lr0.5")
    )  # other runs' retries do not count


def test_a_failing_tracker_never_stops_the_run(tmp_path, caplog):
    class Broken(Recorder):
        def _log(self, values, step, step_name):
            raise OSError("disk full")

    trainer, _ = _trainer(tmp_path / "exp" / "default" / "seed0")
    broken = Broken(tmp_path / "exp" / "default" / "seed0")
    trainer._hooks[0]._writers.append(broken)
    trainer.train(0, 3)
    assert trainer.iter == 3 and broken.state == "dropped"
    assert broken.calls == [("open",), ("end", "failed")]  # ended as failed at once, then left alone
    assert (
        caplog.text.count("recorder: logging metrics failed (OSError: disk full); not tracking the rest of this run")
        == 1
    )


def test_a_tracker_whose_ending_fails_is_not_ended_twice(tmp_path, caplog):
    class Unending(Recorder):
        def _end(self, how):
            super()._end(how)
            raise OSError("server gone")

    writer = Unending(tmp_path / "exp" / "default" / "seed0")
    writer.log({"total_loss": 1.0}, step=1)
    writer.close()
    writer.close()
    assert writer.state == "dropped" and writer.calls[1:] == [
        (1, "iteration", {"total_loss": 1.0}),
        ("end", "finished"),
    ]
    assert "recorder: ending the tracker run failed (OSError: server gone)" in caplog.text


# ---------------------------------------------------------------------------------------------
# The real trackers, continued by a resume
# ---------------------------------------------------------------------------------------------
def _writer(cls, run_dir, **settings):
    name = "mlflow" if cls is MlflowWriter else "wandb"
    return cls(
        {**DEFAULTS[name], "enabled": True, **settings},
        run_dir=str(run_dir),
        experiment_dir=str(Path(run_dir).parents[1]),
        name="mimetic/seed1",
        stage="pretrain",
        params={"arm": "mimetic", "seed": 1, "identity": {"arm": "mimetic", "lr_scale": 1.0}},
    )


def test_an_mlflow_run_is_continued_by_its_resumes(tmp_path, tracker_env, monkeypatch):
    run_dir = tmp_path / "exp" / "mimetic" / "seed1"
    run_dir.mkdir(parents=True)
    monkeypatch.chdir(run_dir)  # MLflow's own default would put the artifacts here
    killed = _writer(MlflowWriter, run_dir)
    killed.log({"eval/top1": 10.0}, step=1, step_name="epoch")  # then killed: never closed
    runs, client = mlflow_runs(tmp_path, "exp")
    assert runs["mimetic/seed1"].info.status == "RUNNING"
    assert runs["mimetic/seed1"].data.tags[MLFLOW_RUN_ID_TAG] == tracker_run_id(str(run_dir))
    preempted = _writer(MlflowWriter, run_dir)  # the resumed run, stopped for a requeue
    preempted.log({"eval/top1": 20.0}, step=2, step_name="epoch")
    try:
        raise Preempted("time limit")
    except Preempted:
        preempted.close()
    runs, client = mlflow_runs(tmp_path, "exp")
    assert runs["mimetic/seed1"].info.status == "KILLED"
    requeued = _writer(MlflowWriter, run_dir)
    requeued.log({"eval/top1": 30.0}, step=3, step_name="epoch")
    requeued.close()
    runs, client = mlflow_runs(tmp_path, "exp")
    run = runs["mimetic/seed1"]
    assert run.info.status == "FINISHED" and run.info.run_id == killed.mlflow_run == requeued.mlflow_run
    assert history(client, run, "eval/top1") == [(1, 10.0), (2, 20.0), (3, 30.0)]
    assert (run.data.params["stage"], run.data.params["seed"], run.data.params["identity.lr_scale"]) == (
        "pretrain",
        "1",
        "1.0",
    )
    assert (run.data.tags["arm"], run.data.tags["stage"], run.data.tags["experiment"]) == ("mimetic", "pretrain", "exp")
    (tmp_path / "exp" / "report").mkdir()
    (tmp_path / "exp" / "report" / "report.md").write_text("# report")
    attach_report(
        {name: {**DEFAULTS[name], "enabled": name == "mlflow"} for name in DEFAULTS},
        str(tmp_path / "exp"),
        str(tmp_path / "exp" / "report"),
    )
    runs, client = mlflow_runs(tmp_path, "exp")
    assert [a.path for a in client.list_artifacts(runs["report"].info.run_id, "report")] == ["report/report.md"]
    assert (tmp_path / "mlartifacts").is_dir() and not (run_dir / "mlruns").exists()


def test_a_wandb_run_is_continued_by_its_resumes(tmp_path, tracker_env):
    run_dir = tmp_path / "exp" / "mimetic" / "seed1"
    run_dir.mkdir(parents=True)
    first = _writer(WandbWriter, run_dir)
    first.log({"total_loss": 2.0}, step=1)
    try:
        raise RuntimeError("out of memory")
    except RuntimeError:
        first.close()
    second = _writer(WandbWriter, run_dir)
    second.log({"total_loss": 1.0}, step=2)
    second.log({"eval/top1": 30.0}, step=1, step_name="epoch")
    second.close()
    sessions = wandb_sessions(run_dir)
    assert len(sessions) == 2 and {s["run"].run_id for s in sessions} == {tracker_run_id(str(run_dir))}
    assert [s["exit"] for s in sessions] == [1, 0]
    assert wandb_series(sessions, "total_loss") == [(1, 2.0), (2, 1.0)]
    assert wandb_series(sessions, "eval/top1", step="epoch") == [(1, 30.0)]
    run = sessions[1]["run"]
    assert (run.run_group, run.job_type, run.display_name, run.project) == (
        "exp",
        "pretrain",
        "mimetic/seed1",
        "condinit-det",
    )
    assert list(run.tags) == ["pretrain", "mimetic"] and sessions[1]["config"]["identity.arm"] == "mimetic"


def test_a_dropped_tracker_shows_its_run_failed(tmp_path, tracker_env, monkeypatch):
    run_dir = tmp_path / "exp" / "mimetic" / "seed1"
    run_dir.mkdir(parents=True)
    monkeypatch.chdir(run_dir)
    writers = [_writer(MlflowWriter, run_dir), _writer(WandbWriter, run_dir)]
    for writer in writers:
        writer.log({"total_loss": 2.0}, step=1)
    monkeypatch.setattr(writers[0].client, "log_batch", _disk_full)
    monkeypatch.setattr(writers[1].run, "log", _disk_full)
    for writer in writers:
        writer.log({"total_loss": 1.0}, step=2)  # fails: the tracker is dropped and its run ended as failed
        assert writer.state == "dropped"
    runs, client = mlflow_runs(tmp_path, "exp")
    assert runs["mimetic/seed1"].info.status == "FAILED"
    assert history(client, runs["mimetic/seed1"], "total_loss") == [(1, 2.0)]
    (session,) = wandb_sessions(run_dir)
    assert session["exit"] == 1 and wandb_series([session], "total_loss") == [(1, 2.0)]


def _disk_full(*args, **kwargs):
    raise OSError("disk full")


# ---------------------------------------------------------------------------------------------
# End to end
# ---------------------------------------------------------------------------------------------
def _ap_records(run_dir):
    return {r["iteration"]: r for r in ResultsFile(str(run_dir)).records("ap")}


@pytest.mark.slow
def test_detection_experiment_with_both_trackers_fail_and_resume(tmp_path, tracker_env):
    exp = tmp_path / "exp"
    argv = [
        "--config-file",
        FAILING_CONFIG,
        "--arm",
        "default,conditioned",
        "--bootstrap",
        "0",
        "train.max_iter=4",
        "train.eval_period=2",
        "train.log_period=1",
        "train.checkpointer.period=2",
        f"train.output_dir={exp}",
        *BOTH,
    ]
    fail = {"CONDINIT_FAIL_ONCE": str(tmp_path / "failed-once"), "CONDINIT_FAIL_AT": "3"}
    rc, out, err = _tool(TRAIN_NET, *argv, cwd=tmp_path, env=tracker_env, **fail)
    assert rc == 1, err[-3000:]  # the default arm's loader raised on its third batch
    default, conditioned = (exp / "default" / "seed0"), (exp / "conditioned" / "seed0")
    runs, client = mlflow_runs(tmp_path, "exp")  # the store beside the experiment
    assert sorted(runs) == ["conditioned/seed0", "default/seed0", "report"]
    assert runs["default/seed0"].info.status == "FAILED" and runs["conditioned/seed0"].info.status == "FINISHED"
    failed_id = runs["default/seed0"].info.run_id
    assert history(client, runs["default/seed0"], "total_loss")[-1][0] == 2
    first_report = sorted(a.path for a in client.list_artifacts(runs["report"].info.run_id, "report"))

    rc, out, err = _tool(TRAIN_NET, "--resume", *argv, cwd=tmp_path, env=tracker_env, **fail)
    assert rc == 0, err[-3000:]
    runs, client = mlflow_runs(tmp_path, "exp")
    assert sorted(runs) == ["conditioned/seed0", "default/seed0", "report"]  # the same three tracker runs
    assert runs["default/seed0"].info.run_id == failed_id
    report_files = sorted(n for n in os.listdir(exp / "report") if (exp / "report" / n).is_file())
    for name in ("report.md", "summary.csv", "bbox_ap.png", "segm_ap.png"):
        assert name in report_files
    attached = sorted(a.path for a in client.list_artifacts(runs["report"].info.run_id, "report"))
    assert attached == [f"report/{n}" for n in report_files] and set(first_report) <= set(attached)
    assert runs["report"].data.params["stage"] == "report"

    for arm, run_dir in (("default", default), ("conditioned", conditioned)):
        run = runs[f"{arm}/seed0"]
        assert run.info.status == "FINISHED" and run.data.tags[MLFLOW_RUN_ID_TAG] == tracker_run_id(str(run_dir))
        params, tags = run.data.params, run.data.tags
        assert (params["arm"], params["seed"], params["lr_scale"], params["stage"]) == (arm, "0", "1.0", "detection")
        assert params["config"] == FAILING_CONFIG and params["run"] == f"{arm}/seed0"
        assert (tags["arm"], tags["stage"], tags["experiment"]) == (arm, "detection", "exp")
        identity = json.loads((run_dir / "condinit_arm_report.json").read_text())["run"]
        assert params["identity.arm"] == arm and params["identity.arm_seed"] == str(identity["arm_seed"])
        # every scalar each log period, by completed iteration; every evaluation at its iteration
        assert [s for s, _ in history(client, run, "total_loss")] == [1, 2, 3, 4]
        assert [s for s, _ in history(client, run, "lr")] == [1, 2, 3, 4]
        records = _ap_records(run_dir)
        assert sorted(records) == [2, 4]
        for task in ("bbox", "segm"):
            assert history(client, run, f"{task}/AP") == [(i, pytest.approx(records[i][task]["AP"])) for i in (2, 4)]

    # W&B: offline files in each run directory, one run id per run, continued by the resume
    sessions = wandb_sessions(default)
    assert len(sessions) == 2 and {s["run"].run_id for s in sessions} == {tracker_run_id(str(default))}
    assert [s["exit"] for s in sessions] == [1, 0]  # failed, then the resumed run finished
    for s in sessions:
        run = s["run"]
        assert (run.run_group, run.job_type, run.display_name, run.project) == (
            "exp",
            "detection",
            "default/seed0",
            "condinit-det",
        )
        assert list(run.tags) == ["detection", "default"]
        assert s["config"]["arm"] == "default" and s["config"]["seed"] == 0 and s["config"]["stage"] == "detection"
    assert [i for i, _ in wandb_series(sessions[:1], "total_loss")] == [1, 2]
    assert [i for i, _ in wandb_series(sessions[1:], "total_loss")] == [3, 4]
    records = _ap_records(default)
    assert wandb_series(sessions, "bbox/AP") == [(i, pytest.approx(records[i]["bbox"]["AP"])) for i in (2, 4)]
    (only,) = wandb_sessions(conditioned)
    assert only["exit"] == 0 and only["run"].run_id == tracker_run_id(str(conditioned)) != tracker_run_id(str(default))
    assert [i for i, _ in wandb_series([only], "segm/AP")] == [2, 4]
    # ready for `wandb sync` (a dry run: no account, no network)
    wandb_cli = os.path.join(os.path.dirname(sys.executable), "wandb")
    folders = [s["folder"] for s in sessions]
    proc = subprocess.run(
        [wandb_cli, "sync", "--dry-run", *folders],
        cwd=tmp_path,
        env=tracker_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    for folder in folders:
        assert os.path.relpath(folder, tmp_path) in proc.stdout + proc.stderr
    report_sessions = wandb_sessions(exp / "report")
    assert len(report_sessions) == 2 and len({s["run"].run_id for s in report_sessions}) == 1
    assert {"report.md", "summary.csv", "bbox_ap.png"} <= set(report_sessions[-1]["files"])
    # TensorBoard, as before
    for run_dir in (default, conditioned):
        assert glob.glob(str(run_dir / "events.out.tfevents.*"))


@pytest.mark.slow
def test_pretraining_experiment_with_both_trackers(tmp_path, tracker_env):
    from condinit_det.data.classification import ShapesClsSpec, generate_classification_dataset

    spec = ShapesClsSpec(image_size=32, min_size=14.0, max_size=22.0, center_jitter=3.0, distractor_size=(4.0, 7.0))
    data = generate_classification_dataset(tmp_path / "shapes", num_train=48, num_val=16, spec=spec)
    exp = tmp_path / "pre"
    opts = {
        "data.root": data,
        "data.img_size": 32,
        "model.kwargs.img_size": 32,
        "model.kwargs.depth": 1,
        "train.output_dir": exp,
        "train.epochs": 2,
        "train.batch_size": 8,
        "train.workers": 0,
        "train.log_period": 4,
        "train.eval_batch_size": 16,
        "scheduler.warmup_epochs": 1,
    }
    rc, out, err = _tool(
        PRETRAIN_NET,
        "--config-file",
        PRETRAIN_DEMO,
        "--arm",
        "default,conditioned",
        "--bootstrap",
        "0",
        *[f"{k}={v}" for k, v in opts.items()],
        *BOTH,
        cwd=tmp_path,
        env=tracker_env,
    )
    assert rc == 0, err[-3000:]
    runs, client = mlflow_runs(tmp_path, "pre")
    assert sorted(runs) == ["conditioned/seed0", "default/seed0", "report"]
    for arm in ("default", "conditioned"):
        run_dir = RunSpec(arm, 0).path(str(exp))
        run = runs[f"{arm}/seed0"]
        assert run.info.status == "FINISHED"
        assert (run.data.params["stage"], run.data.params["arm"]) == ("pretrain", arm)
        records = {r["epoch"]: r for r in ResultsFile(run_dir).records("cls")}
        # evaluations by epoch; the scalars every log period by optimizer step (6 steps an epoch)
        assert history(client, run, "eval/top1") == [(e, pytest.approx(records[e]["top1"])) for e in (1, 2)]
        assert [s for s, _ in history(client, run, "eval/top5")] == [1, 2]
        assert [s for s, _ in history(client, run, "total_loss")] == [4, 6, 8, 12]
        (session,) = wandb_sessions(run_dir)
        assert session["exit"] == 0 and session["run"].job_type == "pretrain"
        assert session["run"].run_id == tracker_run_id(run_dir)
        assert wandb_series([session], "eval/top1", step="epoch") == [
            (e, pytest.approx(records[e]["top1"])) for e in (1, 2)
        ]
        assert [i for i, _ in wandb_series([session], "total_loss")] == [4, 6, 8, 12]
        assert glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))
    attached = sorted(a.path for a in client.list_artifacts(runs["report"].info.run_id, "report"))
    written = sorted(n for n in os.listdir(exp / "report") if (exp / "report" / n).is_file())
    assert "report.md" in written and any(n.endswith(".png") for n in written)
    assert attached == [f"report/{n}" for n in written]
    (report,) = wandb_sessions(exp / "report")
    assert report["exit"] == 0 and set(written) <= set(report["files"])


@pytest.mark.slow
def test_yacs_config_run_is_tracked(tmp_path, tracker_env):
    exp, yaml = tmp_path / "yacs", str(ROOT / "configs" / "yacs" / "mask_rcnn_vit_tiny_embedded.yaml")
    rc, out, err = _tool(
        TRAIN_NET,
        "--config-file",
        yaml,
        "OUTPUT_DIR",
        str(exp),
        "SOLVER.MAX_ITER",
        "2",
        "TEST.EVAL_PERIOD",
        "2",
        "SOLVER.IMS_PER_BATCH",
        "2",
        "TRACKERS.MLFLOW.ENABLED",
        "True",
        cwd=tmp_path,
        env=tracker_env,
    )
    assert rc == 0, err[-3000:]
    run_dir = exp / "default" / "seed0"
    runs, client = mlflow_runs(tmp_path, "yacs")
    run = runs["default/seed0"]
    assert run.info.status == "FINISHED" and run.data.tags[MLFLOW_RUN_ID_TAG] == tracker_run_id(str(run_dir))
    assert (run.data.params["stage"], run.data.params["arm"]) == ("detection", "default")
    assert "identity.arm" in run.data.params
    records = _ap_records(run_dir)
    assert history(client, run, "bbox/AP") == [(2, pytest.approx(records[2]["bbox"]["AP"]))]
    assert [s for s, _ in history(client, run, "total_loss")] == [2]
