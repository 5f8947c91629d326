"""condinit_det.launch.slurm: flags, rendezvous, dependencies; and, on a real cluster (marker ``slurm``), job
arrays, per-element dependencies, requeue on USR2 and on ``scontrol requeue``, ``--max-parallel``."""

import argparse
import functools
import os
import signal
import subprocess
import sys
import time

import cloudpickle
import pytest
import submitit

from condinit_det.launch import arguments, slurm
from condinit_det.utils import preemption

# Toy callables run in the jobs' own Python processes: ship them by value (tests/ is not importable there).
# They use nothing from condinit_det, whose import (torch, detectron2) would add seconds to every job.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _parse(*argv):
    return arguments.add_slurm_arguments(argparse.ArgumentParser(prog="tool")).parse_args(list(argv))


def test_flags_parse():
    args = _parse(
        "--slurm",
        "--nodes",
        "2",
        "--gpus-per-node",
        "8",
        "--cpus-per-task",
        "10",
        "--mem",
        "64GB",
        "--time",
        "01:30:00",
        "--partition",
        "gpu",
        "--account",
        "lab",
        "--qos",
        "high",
        "--constraint",
        "a100|h100",
        "--slurm-extra",
        "exclusive=true",
        "--slurm-extra",
        "mail_type=END",
        "--max-parallel",
        "4",
        "--slurm-folder",
        "/x/slurm",
    )
    assert args.slurm and args.nodes == 2 and args.gpus_per_node == 8 and args.cpus_per_task == 10
    assert args.mem == "64G" and args.time == 90 and args.signal_delay == 120
    assert (args.partition, args.account, args.qos, args.constraint) == ("gpu", "lab", "high", "a100|h100")
    assert args.slurm_extra == [("exclusive", "true"), ("mail-type", "END")]
    assert args.max_parallel == 4 and slurm.slurm_folder(args, "/out") == "/x/slurm"
    defaults = _parse()
    assert not defaults.slurm and defaults.nodes == 1 and defaults.gpus_per_node == 0 and defaults.time == 60
    assert defaults.max_parallel is None and defaults.slurm_extra == []
    assert slurm.slurm_folder(defaults, "/out") == "/out/slurm"


@pytest.mark.parametrize(
    "value, minutes", [("90", 90), ("01:30:00", 90), ("0:00:01", 1), ("2:00:30", 121), ("1-00:00:00", 1440)]
)
def test_time_formats(value, minutes):
    assert arguments.parse_time_minutes(value) == minutes


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--time", "1h"], "invalid time '1h': give minutes (e.g. 90), HH:MM:SS"),
        (["--time", "0"], "at least one minute"),
        (["--time", "1:75:00"], "below 60"),
        (["--nodes", "0"], "invalid node count '0': expected an integer >= 1"),
        (["--gpus-per-node", "-1"], "invalid GPU count '-1': expected an integer >= 0"),
        (["--max-parallel", "two"], "invalid --max-parallel 'two'"),
        (["--mem", "lots"], "invalid memory 'lots': expected a number with an optional unit K, M, G or T"),
        (["--slurm-extra", "exclusive"], "invalid --slurm-extra 'exclusive': expected KEY=VALUE"),
        (["--slurm-extra", "Bad Key=1"], "invalid --slurm-extra"),
        (["--partition", "a b"], "invalid partition 'a b'"),
    ],
)
def test_bad_flags_one_error_line(argv, message, capsys):
    with pytest.raises(SystemExit):
        _parse(*argv)
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and message in errors[0], errors


def _rendezvous(monkeypatch, env, **kwargs):
    for key in [k for k in os.environ if k.startswith("SLURM_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return slurm.slurm_rendezvous(**kwargs)


@pytest.mark.parametrize(
    "nodelist, first",
    [("vm", "vm"), ("gpu[07-09,12],cpu1", "gpu07"), ("a1,b[2-3]", "a1"), ("rack[2,4]-n[010-011]", "rack2-n010")],
)
def test_rendezvous_from_environment(monkeypatch, nodelist, first):
    env = {
        "SLURM_JOB_ID": "123456",
        "SLURM_JOB_NODELIST": nodelist,
        "SLURM_JOB_NUM_NODES": "4",
        "SLURM_NODEID": "2",
        "SLURM_GPUS_ON_NODE": "8",
    }
    assert _rendezvous(monkeypatch, env) == (4, 2, 8, f"tcp://{first}:13456")  # the first node, zero padding kept
    # Without SLURM_GPUS_ON_NODE: the per-node request ("type:count"), else CPU processes for gloo.
    env.pop("SLURM_GPUS_ON_NODE")
    assert _rendezvous(monkeypatch, dict(env, SLURM_GPUS_PER_NODE="a100:4"))[2] == 4
    assert _rendezvous(monkeypatch, env, cpu_processes_per_machine=2) == (4, 2, 2, f"tcp://{first}:13456")
    # Another job on the same nodes gets another port; every node of one job the same URL.
    assert _rendezvous(monkeypatch, dict(env, SLURM_JOB_ID="123457"))[3] == f"tcp://{first}:13457"
    assert _rendezvous(monkeypatch, dict(env, SLURM_NODEID="0"))[3] == f"tcp://{first}:13456"
    with pytest.raises(RuntimeError, match="not inside a Slurm job"):
        _rendezvous(monkeypatch, {})


def test_requeue_flag():
    previous = signal.getsignal(signal.SIGUSR2)
    try:
        flag = preemption.requeue_flag()
        assert not flag.is_set()
        os.kill(os.getpid(), signal.SIGUSR2)  # the process survives: the flag replaces the default action
        deadline = time.time() + 5
        while not flag.is_set() and time.time() < deadline:
            time.sleep(0.01)
        assert flag.is_set()
    finally:
        signal.signal(signal.SIGUSR2, previous)


class _Job:
    def __init__(self, job_id):
        self.job_id = job_id


def test_dependency_strings():
    array = [_Job("12_0"), _Job("12_1"), _Job("12_2")]
    assert slurm.after("afterany", array) == "afterany:12_0:12_1:12_2"
    assert slurm.after("afterok", [_Job("7")]) == "afterok:7"
    assert slurm.after_each(array) == "aftercorr:12"
    assert slurm.after_each([_Job("7")]) == "afterok:7"  # a one-callable "array" is a plain job


# ---- against the cluster ---------------------------------------------------------------------------


def _executor(folder, name="test", *argv):
    args = _parse("--slurm", "--cpus-per-task", "1", "--time", "5", *argv)
    return slurm.make_executor(args, str(folder), name)


def _wait(jobs, timeout=120):
    deadline = time.time() + timeout
    while not all(j.done() for j in jobs):
        if time.time() > deadline:
            queue = subprocess.run(["squeue", "--states=all"], capture_output=True, text=True).stdout
            pytest.fail(f"jobs {[j.job_id for j in jobs]} not done after {timeout} s:\n{queue}")
        time.sleep(0.5)


def _stamp(folder, name, value):
    with open(os.path.join(folder, name), "a") as f:
        f.write(f"{value}\n")


def _stamps(folder, name):
    with open(os.path.join(folder, name)) as f:
        return [float(x) for x in f.read().split()]


class _Element:
    """Records its start and end times; returns its index."""

    def __init__(self, folder, index, seconds):
        self.folder, self.index, self.seconds = str(folder), index, seconds

    def __call__(self):
        _stamp(self.folder, f"start{self.index}", time.time())
        time.sleep(self.seconds)
        _stamp(self.folder, f"end{self.index}", time.time())
        return self.index


class _Report:
    def __init__(self, folder):
        self.folder = str(folder)

    def __call__(self):
        _stamp(self.folder, "report_start", time.time())
        return sorted(int(name[3:]) for name in os.listdir(self.folder) if name.startswith("end"))


@pytest.mark.slurm
@pytest.mark.e2e
def test_array_and_dependent_report(slurm_env):
    out = slurm_env / "out"
    out.mkdir()
    ex = _executor(slurm_env / "slurm", "arr", "--slurm-extra", "comment=condinit", "--mem", "1G")
    jobs = slurm.submit(ex, [_Element(out, i, 1.0) for i in range(3)])
    base = jobs[0].job_id.split("_")[0]
    assert [j.job_id for j in jobs] == [f"{base}_{i}" for i in range(3)]
    report = slurm.submit(ex, [_Report(out)], dependency=slurm.after("afterany", jobs))
    assert len(report) == 1 and "_" not in report[0].job_id
    # The report ran once the whole array had ended, and saw every element's output.
    _wait(jobs + report)
    assert [j.result() for j in jobs] == [0, 1, 2]
    assert report[0].result() == [0, 1, 2]
    assert _stamps(out, "report_start")[0] >= max(_stamps(out, f"end{i}")[0] for i in range(3))
    text = (slurm_env / "slurm" / base / f"{base}_submission.sh").read_text()  # an array's script
    for line in (
        "--array=0-2%3",
        "--signal=USR2@120",
        "--time=5",
        "--cpus-per-task=1",
        "--ntasks-per-node=1",
        "--comment=condinit",
        "--job-name=arr",
        "--mem=1G",
    ):
        assert f"#SBATCH {line}" in text, text
    assert "--dependency=afterany:" in open(report[0].paths.submission_file).read()


@pytest.mark.slurm
@pytest.mark.e2e
def test_per_element_dependency(slurm_env):
    out = slurm_env / "out"
    out.mkdir()
    ex = _executor(slurm_env / "slurm")
    first = slurm.submit(ex, [_Element(out, 0, 25.0), _Element(out, 1, 0.0)])
    second = slurm.submit(ex, [_Element(out, 10, 0.0), _Element(out, 11, 0.0)], dependency=slurm.after_each(first))
    _wait(first + second)
    assert [j.result() for j in second] == [10, 11]
    end = {i: _stamps(out, f"end{i}")[0] for i in (0, 1)}
    start = {i: _stamps(out, f"start{i}")[0] for i in (10, 11)}
    assert start[10] >= end[0] and start[11] >= end[1]
    # Element 1 of the second array did not wait for element 0 of the first: per element, not per array.
    assert start[11] < end[0]


@pytest.mark.slurm
@pytest.mark.e2e
def test_max_parallel_one(slurm_env):
    out = slurm_env / "out"
    out.mkdir()
    jobs = slurm.submit(
        _executor(slurm_env / "slurm", "seq", "--max-parallel", "1"), [_Element(out, i, 1.0) for i in range(3)]
    )
    _wait(jobs)
    base = jobs[0].job_id.split("_")[0]
    assert "#SBATCH --array=0-2%1" in (slurm_env / "slurm" / base / f"{base}_submission.sh").read_text()
    spans = sorted((_stamps(out, f"start{i}")[0], _stamps(out, f"end{i}")[0]) for i in range(3))
    assert all(spans[k][1] <= spans[k + 1][0] for k in range(2)), spans  # one at a time


# It ignores USR2 and TERM, so it ends when its parent does (the one-node Slurm has no cgroup to clean it up).
_CHILD = r"""
import os, signal, sys, time
def log(s, f):
    with open(sys.argv[1], "a") as fh:
        fh.write(signal.Signals(s).name + "\n")
for s in (signal.SIGUSR2, signal.SIGTERM):
    signal.signal(s, log)
parent = os.getppid()
while os.getppid() == parent:
    time.sleep(0.1)
"""


class _Counter(submitit.helpers.Checkpointable):
    """Counts to ``total`` in 0.25 s steps (15 s: the test's signals land while it counts, also on a busy machine);
    a child process logs the signals it receives."""

    def __init__(self, folder, total=60):
        self.folder, self.total, self.count = str(folder), total, 0

    def __call__(self):
        run = int(os.environ.get("SLURM_RESTART_COUNT", 0))
        _stamp(self.folder, "runs", f"{run}.{self.count}")  # restart count, count at start
        child = subprocess.Popen([sys.executable, "-c", _CHILD, os.path.join(self.folder, f"child{run}")])
        while self.count < self.total:
            self.count += 1
            _stamp(self.folder, "progress", self.count)
            time.sleep(0.25)
        child.kill()
        return run, self.count

    def checkpoint(self):
        _stamp(self.folder, "checkpoints", self.count)
        return super().checkpoint()


def _when_counting(folder, steps=4, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if os.path.exists(os.path.join(folder, "progress")) and len(_stamps(folder, "progress")) >= steps:
            return
        time.sleep(0.2)
    pytest.fail(f"the job in {folder} did not start counting within {timeout} s")


def _lines(folder, name):
    path = os.path.join(folder, name)
    return open(path).read().split() if os.path.exists(path) else []


@pytest.mark.slurm
@pytest.mark.e2e
@pytest.mark.slow
def test_requeue_on_usr2_and_on_scontrol_requeue(slurm_env):
    usr2, requeue = slurm_env / "usr2", slurm_env / "requeue"
    usr2.mkdir()
    requeue.mkdir()
    jobs = slurm.submit(_executor(slurm_env / "slurm"), [_Counter(usr2), _Counter(requeue)])
    _when_counting(usr2)
    _when_counting(requeue)
    # The time-limit signal (what --signal=USR2@N sends), and an external requeue (SIGTERM, then SIGKILL).
    subprocess.run(["scancel", "--signal=USR2", jobs[0].job_id], check=True)
    subprocess.run(["scontrol", "requeue", jobs[1].job_id], check=True)
    _wait(jobs, timeout=150)
    assert [j.result()[0] for j in jobs] == [1, 1]  # each finished in its first rerun
    # USR2: checkpoint() ran, the rerun resumed from the checkpointed count; the child got USR2 too.
    (saved,) = [int(x) for x in _lines(usr2, "checkpoints")]
    runs = _lines(usr2, "runs")
    assert len(runs) == 2 and runs[0] == "0.0" and runs[1] == f"1.{saved}" and saved >= 4
    assert "SIGUSR2" in _lines(usr2, "child0")
    # scontrol requeue: no checkpoint(); the rerun starts from the submitted state, the child got SIGTERM.
    assert _lines(requeue, "checkpoints") == [] and _lines(requeue, "runs") == ["0.0", "1.0"]
    assert "SIGTERM" in _lines(requeue, "child0") and "SIGUSR2" not in _lines(requeue, "child0")


@pytest.mark.slurm
@pytest.mark.e2e
def test_cancelled_job_is_done_without_sacct(slurm_env):
    out = slurm_env / "out"
    out.mkdir()
    (job,) = slurm.submit(_executor(slurm_env / "slurm"), [_Element(out, 0, 60.0)])
    deadline = time.time() + 60
    while not os.path.exists(out / "start0") and time.time() < deadline:
        time.sleep(0.2)
    subprocess.run(["scancel", job.job_id], check=True)
    _wait([job], timeout=60)
    assert job.state == "CANCELLED" and not job.paths.result_pickle.exists()


# A worker of the run: loads condinit_det/utils/preemption.py by path (the package would import torch), counts
# from the last saved step, and on USR2 saves its step at the next step boundary and stops.
_WORKER = r"""
import importlib.util, os, sys, time
spec = importlib.util.spec_from_file_location("slurm_helpers", sys.argv[1])
helpers = importlib.util.module_from_spec(spec)
spec.loader.exec_module(helpers)
flag = helpers.requeue_flag()
folder, run, total = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
saved = os.path.join(folder, "saved")
step = int(open(saved).read()) if os.path.exists(saved) else 0
with open(os.path.join(folder, f"resumed{run}"), "w") as f:
    f.write(str(step))
while step < total:
    if flag.is_set():
        with open(saved + ".tmp", "w") as f:
            f.write(str(step))
        os.replace(saved + ".tmp", saved)
        sys.exit(0)
    step += 1
    with open(os.path.join(folder, "progress"), "a") as f:
        f.write(f"{step}\n")
    time.sleep(0.25)
"""


class _Trainer(submitit.helpers.Checkpointable):
    """The main process of a run whose state lives in a worker process."""

    def __init__(self, folder, total=24):
        self.folder, self.total = str(folder), total

    def __call__(self):
        run = int(os.environ.get("SLURM_RESTART_COUNT", 0))
        worker = subprocess.Popen(
            [sys.executable, "-c", _WORKER, _PREEMPTION_PY, self.folder, str(run), str(self.total)]
        )
        worker.wait()
        return run, int(_lines(self.folder, f"resumed{run}")[0])

    def checkpoint(self):
        # Wait for the worker's checkpoint: the requeue that follows kills whatever is still running.
        saved = os.path.join(self.folder, "saved")
        deadline = time.time() + 30
        while not os.path.exists(saved) and time.time() < deadline:
            time.sleep(0.1)
        _stamp(self.folder, "checkpoints", _lines(self.folder, "saved")[0])
        return super().checkpoint()


_SLURM_PY = slurm.__file__
_PREEMPTION_PY = preemption.__file__


@pytest.mark.slurm
@pytest.mark.e2e
@pytest.mark.slow
def test_workers_save_before_requeue(slurm_env):
    out = slurm_env / "out"
    out.mkdir()
    (job,) = slurm.submit(_executor(slurm_env / "slurm"), [_Trainer(out)])
    _when_counting(out)
    subprocess.run(["scancel", "--signal=USR2", job.job_id], check=True)
    _wait([job], timeout=150)
    (saved,) = [int(x) for x in _lines(out, "checkpoints")]
    # The rerun resumed from the step the worker saved on USR2, and counted on to the end.
    assert saved >= 4 and job.result() == (1, saved)
    assert [int(x) for x in _lines(out, "progress")] == list(range(1, 25))  # every step once


def _rendezvous_here(path):
    import importlib
    import types

    # Bare package modules: the launcher's Slurm module without the package's __init__ (torch, detectron2).
    root = os.path.dirname(os.path.dirname(path))
    for name in ("condinit_det", "condinit_det.utils", "condinit_det.launch"):
        package = types.ModuleType(name)
        package.__path__ = [os.path.join(root, *name.split(".")[1:])]
        sys.modules[name] = package
    helpers = importlib.import_module("condinit_det.launch.slurm")
    return helpers.slurm_rendezvous(cpu_processes_per_machine=2), os.environ["SLURM_JOB_ID"]


@pytest.mark.slurm
@pytest.mark.e2e
def test_rendezvous_inside_a_job(slurm_env):
    (job,) = slurm.submit(_executor(slurm_env / "slurm"), [functools.partial(_rendezvous_here, _SLURM_PY)])
    _wait([job])
    (machines, rank, per_machine, url), job_id = job.result()
    host = subprocess.run(["hostname", "-s"], capture_output=True, text=True, check=True).stdout.strip()
    assert (machines, rank, per_machine) == (1, 0, 2)  # one node, no GPU: the CPU processes asked for
    assert url == f"tcp://{host}:{10000 + int(job_id) % 20000}"


@pytest.mark.slurm
@pytest.mark.e2e
def test_status_names_queued_and_running_elements(slurm_env):
    """More elements than the node has CPUs: squeue lists the waiting elements one per line, and condinit-status
    calls them queued and the one on the CPUs running."""
    from condinit_det.launch.status import experiment_status
    from condinit_det.records.jobs import record_jobs
    from condinit_det.records.layout import plan_runs, write_plan
    from condinit_det.stage import DETECTION

    sinfo = subprocess.run(["sinfo", "-h", "-o", "%c"], capture_output=True, text=True, check=True)
    cpus = int(sinfo.stdout.split()[0])
    out, exp = slurm_env / "out", slurm_env / "exp"
    out.mkdir()
    runs = plan_runs(["default"], [0, 1, 2])
    write_plan(str(exp), runs, stage=DETECTION, config=None, length=100)
    ex = _executor(slurm_env / "slurm", "wide", "--cpus-per-task", str(cpus))  # one element fills the node
    jobs = slurm.submit(ex, [_Element(out, i, 20.0) for i in range(3)])
    record_jobs(str(exp), {f"default/seed{i}": job.job_id for i, job in enumerate(jobs)})
    try:
        deadline = time.time() + 60
        while not os.path.exists(out / "start0") and time.time() < deadline:
            time.sleep(0.2)
        states = {s.seed: (s.state, s.job["id"]) for s in experiment_status(str(exp))}
        assert states == {0: ("running", jobs[0].job_id), 1: ("queued", jobs[1].job_id), 2: ("queued", jobs[2].job_id)}
    finally:
        for job in jobs:
            job.cancel(check=False)
