"""tools/train_net.py under DDP and under SIGKILL: replicas identical, nothing lost, duplicated or half-read."""

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
import torch
from forked_tool import run_tool, start_tool

from condinit_det.engine.checkpoint import check_checkpoint_file
from condinit_det.init import PAPER_ARMS as ARMS
from condinit_det.records.results import ResultsFile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "tests", "tiny_train_config.py")
SLOW_EVAL_CONFIG = os.path.join(ROOT, "tests", "tiny_slow_eval_config.py")
TRAIN_NET = os.path.join(ROOT, "tools", "train_net.py")
# Two evaluations: one before the kill, one after the resume.
SCHEDULE = ["train.max_iter=20", "train.eval_period=10", "train.checkpointer.period=10"]

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


def _env(**extra):
    return dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", **extra)


def _popen(tmp_path, *argv, config=CONFIG, **env):
    log = open(tmp_path / f"stdout.{time.time_ns()}.txt", "w")
    return start_tool(
        TRAIN_NET, "--config-file", config, *argv, cwd=tmp_path, env=_env(**env), stdout=log, stderr=subprocess.STDOUT
    )


def _run(tmp_path, *argv, config=CONFIG, **env):
    proc = run_tool(TRAIN_NET, "--config-file", config, *argv, cwd=tmp_path, env=_env(**env), timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc.stdout + proc.stderr


def _kill_when(proc, condition, timeout=600):
    """SIGKILL ``proc`` as soon as ``condition()`` holds (fails if the run ends first)."""
    deadline = time.time() + timeout
    while not condition():
        assert proc.poll() is None, "the run ended before the moment to kill it"
        assert time.time() < deadline, "timed out waiting for the moment to kill the run"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _iterations(run):
    return [r["iteration"] for r in ResultsFile(run).records("ap")]


def _best_is_best(run):
    records = ResultsFile(run).records("ap")
    best = max(records, key=lambda r: (r["bbox"]["AP"] or 0.0, -r["iteration"]))
    saved = torch.load(run / "model_best.pth", map_location="cpu", weights_only=True)
    assert saved["iteration"] + 1 == best["iteration"]


def test_kill_during_evaluation_then_resume(tmp_path):
    run, marker = tmp_path / "exp" / "mimetic" / "seed0", tmp_path / "evaluating.txt"
    args = ["--arm", "mimetic", f"train.output_dir={tmp_path / 'exp'}", *SCHEDULE]
    proc = _popen(tmp_path, *args, config=SLOW_EVAL_CONFIG, SLOW_EVAL_MARKER=str(marker), SLOW_EVAL_SECONDS="5")
    _kill_when(proc, lambda: _read(marker).count("evaluating") == 1)  # inside the evaluation at iteration 10
    # An iteration's evaluation comes before its checkpoint: the run resumes from the checkpoint before (none here).
    assert _iterations(run) == [] and not (run / "last_checkpoint").exists()
    _run(tmp_path, "--resume", *args, config=SLOW_EVAL_CONFIG)
    assert _iterations(run) == [10, 20]  # the interrupted evaluation is made up, once
    _best_is_best(run)


_WRITER = r"""
import sys
out, what = sys.argv[1], sys.argv[2]
if what == "results":  # the records alone import no torch: the six kills come in seconds
    from condinit_det.records.results import ResultsFile
    rf = ResultsFile(out)
    i = len(rf.records())
    while True:
        rf.add({"kind": "ap", "iteration": i, "payload": ["x" * 1000] * 300})
        i += 1
else:
    import torch
    from condinit_det.engine.checkpoint import RunCheckpointer
    ckpt = RunCheckpointer(torch.nn.Linear(1024, 2048), out, save_to_disk=True)
    i = 0
    while True:
        ckpt.save(f"model_{i:07d}")
        i += 1
"""


@pytest.mark.parametrize("what", ["results", "checkpoint"])
def test_kill_while_a_file_is_replaced(tmp_path, what):
    rng = random.Random(0)
    written = tmp_path / ("results.json" if what == "results" else "last_checkpoint")
    for _ in range(6):
        before = written.stat().st_mtime_ns if written.exists() else 0
        proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path), what], env=_env())
        # Once the child writes, let it write on for a random moment: the kill lands mid-write most times.
        deadline = time.time() + 120
        while not (written.exists() and written.stat().st_mtime_ns != before):
            assert proc.poll() is None and time.time() < deadline
            time.sleep(0.02)
        time.sleep(rng.random())
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        if what == "results":
            records = ResultsFile(tmp_path).records()  # parses: never a half-written file
            assert [r["iteration"] for r in records] == list(range(len(records)))
        else:
            last = tmp_path / _read(tmp_path / "last_checkpoint")
            check_checkpoint_file(str(last))
            assert torch.load(last, map_location="cpu")["model"]["weight"].shape == (2048, 1024)
    if what == "results":
        assert len(ResultsFile(tmp_path).records()) > 6


def test_arm_all_resume_after_a_kill_in_the_middle_arm(tmp_path):
    exp = tmp_path / "exp"
    args = [
        "--arm",
        "all",
        f"train.output_dir={exp}",
        "train.max_iter=6",
        "train.eval_period=3",
        "train.checkpointer.period=3",
    ]
    proc = _popen(tmp_path, *args)
    _kill_when(proc, lambda: (exp / "mimetic" / "seed0" / "last_checkpoint").is_file())
    assert _iterations(exp / "default" / "seed0") == [3, 6]
    log = _run(tmp_path, "--resume", *args)
    assert "Run default/seed0 already finished" in log and "Run mimetic/seed0 already finished" not in log
    assert "model_0000002.pth" in _read(exp / "mimetic" / "seed0" / "log.txt")  # resumed, not restarted
    for arm in ARMS:
        assert _iterations(exp / arm / "seed0") == [3, 6], arm
    assert (exp / "report" / "report.md").is_file()


def test_seed_and_lr_scan_layout_resumes_after_a_kill_between_runs(tmp_path):
    exp = tmp_path / "exp"
    args = [
        "--arm",
        "all",
        "--seeds",
        "0,1",
        "--lr-scale",
        "0.5,1",
        f"train.output_dir={exp}",
        "train.max_iter=1",
        "train.eval_period=1",
    ]
    proc = _popen(tmp_path, *args)
    _kill_when(proc, lambda: _iterations(exp / "conditioned" / "seed0") == [1])
    log = _run(tmp_path, "--resume", *args)
    assert log.count("already finished") >= 3
    plan = json.loads(_read(exp / "experiment.json"))
    dirs = [r["dir"] for r in plan["runs"]]
    assert dirs == [f"{arm}/seed{s}" for s in (0, 1) for arm in ARMS] + [f"{arm}/seed0-lr0.5" for arm in ARMS]
    for run in plan["runs"]:
        records = ResultsFile(exp / run["dir"]).records("ap")
        assert [(r["iteration"], r["arm"], r["seed"], r["lr_scale"]) for r in records] == [
            (1, run["arm"], run["seed"], run["lr_scale"])
        ]
        identity = json.loads(_read(exp / run["dir"] / "condinit_arm_report.json"))["run"]
        assert (identity["seed"], identity["arm_seed"], identity["lr_scale"]) == (
            run["seed"],
            run["seed"],
            run["lr_scale"],
        )
    assert "lr: 5.0e-05" in _read(exp / "default" / "seed0-lr0.5" / "config.yaml")
    assert "lr: 0.0001" in _read(exp / "default" / "seed1" / "config.yaml")


def test_ddp_two_processes_train_every_arm_from_identical_weights(tmp_path):
    """``--arm all`` in two processes: each arm passes the replica check before and after training, and rank 0 alone
    writes its records (a 2-process evaluation equals a 1-process one: tests/test_multiprocess.py)."""
    exp = tmp_path / "ddp"
    argv = ["--num-gpus", "2", "--arm", "all", f"train.output_dir={exp}", "train.max_iter=3", "train.eval_period=3"]
    _run(tmp_path, *argv)
    for arm in ARMS:
        run = exp / arm / "seed0"
        log = _read(run / "log.txt")
        assert "Replica check before training: all 2 processes hold identical weights" in log, arm
        assert "Replica check after training: all 2 processes hold identical weights" in log, arm
        assert _iterations(run) == [3]  # written once, by rank 0
        report = json.loads(_read(run / "condinit_arm_report.json"))
        assert report["arm"] == arm and len(report["sites"]) == 2
        assert all(bool(s["changed"]) == (arm != "default") for s in report["sites"])
        assert _read(run / "last_checkpoint") == "model_final.pth"
        check_checkpoint_file(str(run / "model_final.pth"))
