"""Experiments on a real (one-node) Slurm: a dry run, job arrays of runs, the report job, status, cancel and resubmit,
extending a running experiment (requeue, preemption and the two-stage protocol: tests/test_slurm_faults.py). Skipped
without a cluster (tools/slurm_local.sh start; .ci/run starts one)."""

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from forked_tool import run_tool

from condinit_det.init import PAPER_ARMS as ARMS
from condinit_det.records.layout import PLAN_FILENAME, RunSpec
from condinit_det.records.results import ResultsFile

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.e2e]

ROOT = Path(__file__).resolve().parents[1]
TRAIN_NET = str(ROOT / "tools" / "train_net.py")
STATUS = str(ROOT / "tools" / "experiment_status.py")
CONFIG = str(ROOT / "tests" / "tiny_train_config.py")
SLURM = ["--slurm", "--time", "30", "--cpus-per-task", "1"]
DONE = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
}


def _env():
    return dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONWARNINGS="ignore")


def _tool(tool, *argv, cwd):
    proc = run_tool(tool, *argv, cwd=cwd, env=_env(), timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def _states(job: str):
    out = subprocess.run(
        ["squeue", "--states=all", "--noheader", "--format=%i|%T", "-j", job],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    return dict(line.split("|", 1) for line in out.split() if "|" in line)


def _wait(job: str, timeout: float = 900):
    """Wait until every job of ``job`` (an array id names all its elements) has ended; returns their states."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        states = _states(job)
        if states and all(s in DONE for s in states.values()):
            return states
        time.sleep(2)
    raise AssertionError(f"job {job} did not end within {timeout:.0f} s: {_states(job)}")


def _ids(log):
    array = re.search(r"Submitted \d+ run\(s\) of \S+ as job (?:array )?(\d+)", log)
    report = re.search(r"Report job (\d+)", log)
    return (array.group(1) if array else None), (report.group(1) if report else None)


def _iterations(run_dir):
    return [r["iteration"] for r in ResultsFile(str(run_dir)).records("ap")]


def test_arm_all_two_seeds_as_an_array_then_cancel_and_resubmit(slurm_env):
    exp = slurm_env / "exp"
    argv = [
        "--config-file",
        CONFIG,
        "--arm",
        "all",
        "--seeds",
        "0,1",
        *SLURM,
        "--max-parallel",
        "2",
        "train.max_iter=2",
        "train.eval_period=1",
        f"train.output_dir={exp}",
    ]
    log = _tool(TRAIN_NET, *argv[:4], "--dry-run", *argv[4:], cwd=slurm_env)
    assert "6 of 6 run(s) would train; nothing was written or submitted" in log and not exp.exists()
    log = _tool(TRAIN_NET, *argv, cwd=slurm_env)
    array, report = _ids(log)
    assert f"Submitted 6 run(s) of {exp} as job array {array}" in log
    plan = json.loads((exp / PLAN_FILENAME).read_text())
    assert plan["stage"] == "detection" and [r["dir"] for r in plan["runs"]][:2] == ["default/seed0", "mimetic/seed0"]
    jobs = json.loads((exp / "slurm.json").read_text())
    assert sorted(jobs["runs"].values()) == [[f"{array}_{i}"] for i in range(6)] and jobs["report"] == [report]
    # The first element (default, seed 0) is cancelled while it runs (Slurm forgets a pending element
    # cancelled before it started at once; a running one stays visible as CANCELLED for MinJobAge).
    deadline = time.time() + 600
    while _states(array).get(f"{array}_0") != "RUNNING" and time.time() < deadline:
        time.sleep(0.5)
    subprocess.run(["scancel", f"{array}_0"], check=True, timeout=60)
    states = _wait(array)
    assert states[f"{array}_0"] == "CANCELLED" and sum(s == "COMPLETED" for s in states.values()) == 5, states
    _wait(report)
    for spec in [RunSpec(arm, seed) for seed in (0, 1) for arm in ARMS][1:]:
        assert _iterations(spec.path(str(exp))) == [1, 2], spec
    status = json.loads(_tool(STATUS, str(exp), "--json", cwd=slurm_env))
    by_run = {(r["arm"], r["seed"]): r for r in status["runs"]}
    assert by_run[("default", 0)]["state"] == "cancelled" and by_run[("default", 0)]["job"]["id"] == f"{array}_0"
    assert status["counts"]["finished"] == 5
    md = (exp / "report" / "report.md").read_text()  # written by the report job, after every element ended
    missing = md.split("### Missing or unfinished runs")[1].split("##")[0]
    assert "default seed 0:" in missing
    # Submitting the same command again runs only what is not finished.
    log = _tool(TRAIN_NET, *argv, cwd=slurm_env)
    first_array = array
    array, report = _ids(log)
    assert f"Submitted 1 run(s) of {exp}" in log and "5 run(s) of" in log and "finished or diverged earlier" in log
    history = json.loads((exp / "slurm.json").read_text())["runs"]
    assert history[os.path.join("default", "seed0")] == [f"{first_array}_0", array]  # every job it had (one: a job)
    status = json.loads(_tool(STATUS, str(exp), "--json", cwd=slurm_env))
    current = {(r["arm"], r["seed"]): r["job"]["id"] for r in status["runs"]}
    assert current[("default", 0)] == array  # status shows the current one
    _wait(array)
    _wait(report)
    assert _iterations(RunSpec("default", 0).path(str(exp))) == [1, 2]
    md = (exp / "report" / "report.md").read_text()
    assert "None: every planned run has finished." in md
    # Once more: nothing left to train, nothing submitted.
    log = _tool(TRAIN_NET, *argv, cwd=slurm_env)
    assert "Nothing new to submit" in log and "Submitted" not in log, log


def test_extending_a_running_experiment_submits_only_the_new_runs(slurm_env):
    exp = slurm_env / "exp"
    argv = ["--config-file", CONFIG, "--arm", "all", *SLURM]
    overrides = ["train.max_iter=40", "train.eval_period=40", f"train.output_dir={exp}"]
    log = _tool(TRAIN_NET, *argv, "--seeds", "0", *overrides, cwd=slurm_env)
    first, first_report = _ids(log)
    deadline = time.time() + 300
    while "RUNNING" not in _states(first).values() and time.time() < deadline:
        time.sleep(0.5)
    # What has not started waits until the second command has run: two CPUs run two of the three elements at once,
    # so the first report job is still pending then, however busy the machine.
    subprocess.run(["scontrol", "hold", first], capture_output=True, timeout=60)
    in_flight = {job: state for job, state in _states(first).items() if state in ("PENDING", "RUNNING")}
    assert "PENDING" in in_flight.values(), "the first array started every element before it could be extended"
    # The same command with a second seed, while seed 0 is queued or running.
    log = _tool(TRAIN_NET, *argv, "--seeds", "0,1", *overrides, cwd=slurm_env)
    subprocess.run(["scontrol", "release", first], capture_output=True, timeout=60)
    second, report = _ids(log)
    after = _states(first)
    for i, arm in enumerate(ARMS):
        if after.get(f"{first}_{i}") in ("PENDING", "RUNNING"):  # in flight before and after the second command
            assert f"{arm}/seed0: in flight as job {first}_{i}: not resubmitted" in log, log
    assert f"Submitted 3 run(s) of {exp} as job array {second}" in log
    assert [line.split()[-1] for line in log.splitlines() if line.startswith(f"  {second}_")] == [
        f"{arm}/seed1" for arm in ARMS
    ]
    assert f"Report job {first_report} (pending) is replaced by report job {report}" in log
    history = json.loads((exp / "slurm.json").read_text())
    assert all(len(jobs) == 1 for jobs in history["runs"].values()) and len(history["runs"]) == 6  # no duplicate
    states = _wait(second)
    assert all(s == "COMPLETED" for s in states.values()) and set(_wait(first).values()) == {"COMPLETED"}
    assert _wait(report) == {report: "COMPLETED"} and _states(first_report).get(first_report) in (None, "CANCELLED")
    md = (exp / "report" / "report.md").read_text()  # one report after every run of both submissions
    assert "None: every planned run has finished." in md
    # each arm's row of the main table: two seeds, both at iteration 40
    assert {
        line.split("|")[1].strip() for line in md.splitlines() if re.search(r"\|\s+2\s+\|\s+40\s+\|$", line)
    } == set(ARMS), md
