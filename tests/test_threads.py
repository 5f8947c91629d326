"""Threads from the allocation (condinit_det.utils.threads): fake allocations, the division rule, and the settings
applied in a process started with a Slurm-like environment."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from condinit_det.utils.threads import ThreadPlan, allocated_cpus, threads_for_process

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Loaded from its file in the helper processes: importing the package would import detectron2 as well.
THREADS_MODULE = os.path.join(REPO, "condinit_det", "utils", "threads.py")
LOADER = textwrap.dedent(f"""
    import importlib.util
    spec = importlib.util.spec_from_file_location("threads", {THREADS_MODULE!r})
    threads = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(threads)
""")


# ---------------------------------------------------------------------------------------------
# The allocation
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "environ, affinity, machine, expected",
    [
        ({"SLURM_CPUS_PER_TASK": "1"}, range(2), 2, 1),  # the two-elements-on-a-2-core-node case: no pinning
        ({"SLURM_CPUS_PER_TASK": "4"}, range(64), 64, 4),
        ({"SLURM_CPUS_PER_TASK": "8"}, range(2), 64, 2),  # pinned to fewer CPUs than Slurm counts
        ({}, range(4), 16, 4),  # taskset / cpuset
        ({}, range(16), 16, None),  # the whole machine
        ({"SLURM_CPUS_PER_TASK": ""}, range(16), 16, None),
    ],
    ids=["slurm-1", "slurm-4", "slurm-above-affinity", "affinity", "machine", "slurm-empty"],
)
def test_allocated_cpus_under_fake_allocations(environ, affinity, machine, expected, monkeypatch):
    fake_allocation(monkeypatch, environ, affinity, machine)
    assert allocated_cpus() == expected


@pytest.mark.parametrize("value", ["0", "two", "-1", "1.5"])
def test_allocated_cpus_refuses_a_bad_slurm_value(value, monkeypatch):
    fake_allocation(monkeypatch, {"SLURM_CPUS_PER_TASK": value}, range(2), 2)
    with pytest.raises(ValueError, match=rf"SLURM_CPUS_PER_TASK='{value}': expected a positive integer"):
        allocated_cpus()


def fake_allocation(monkeypatch, environ, affinity, machine):
    """This process as if Slurm's ``environ`` were set, pinned to ``affinity`` on a machine of ``machine`` CPUs."""
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(affinity))
    monkeypatch.setattr(os, "cpu_count", lambda: machine)


def test_allocated_cpus_reads_the_real_affinity():
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs a process allowed on at least two CPUs")
    code = LOADER + textwrap.dedent("""
        import os
        first = min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {first})
        os.environ.pop("SLURM_CPUS_PER_TASK", None)
        without = threads.allocated_cpus()
        os.environ["SLURM_CPUS_PER_TASK"] = "3"
        print(without, threads.allocated_cpus())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.split() == ["1", "1"]


# ---------------------------------------------------------------------------------------------
# The division
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "processes, allocated, kwargs, expected",
    [
        (2, 1, {}, (1, 0)),  # oversubscribed: still one thread each
        (1, 1, {}, (1, 0)),
        (1, 2, {}, (1, 1)),
        (2, 2, {}, (1, 0)),
        (1, 3, {}, (2, 1)),
        (1, 8, {}, (4, 4)),
        (8, 64, {}, (4, 4)),
        (1, 8, {"max_workers": 0}, (8, 0)),  # a config loading in the training process: all CPUs compute
        (1, 8, {"max_workers": 2}, (6, 2)),
    ],
)
def test_threads_for_process(processes, allocated, kwargs, expected):
    plan = threads_for_process(processes, allocated=allocated, **kwargs)
    assert isinstance(plan, ThreadPlan) and tuple(plan) == expected
    threads, workers = plan  # unpacks as a pair
    assert (plan.intra_op_threads, plan.loader_workers) == (threads, workers)


def test_division_invariants():
    for processes in range(1, 9):
        for allocated in range(1, 65):
            for cap in (None, 0, 1, 4, 100):
                threads, workers = threads_for_process(processes, allocated=allocated, max_workers=cap)
                share = max(1, allocated // processes)
                assert threads >= 1 and workers >= 0
                assert threads + workers == share  # the whole share, never more
                assert threads >= workers  # compute gets at least half
                assert cap is None or workers <= cap
                if processes <= allocated:
                    assert processes * (threads + workers) <= allocated


def test_no_allocation_divides_the_machine(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert threads_for_process(2, allocated=None) == (2, 1)


# ---------------------------------------------------------------------------------------------
# The settings, in a process started like an array element with one CPU
# ---------------------------------------------------------------------------------------------
def test_apply_thread_settings_in_a_process_with_one_cpu():
    code = LOADER + textwrap.dedent("""
        import json, logging, os, subprocess, sys
        import numpy, scipy.linalg  # BLAS libraries loaded before the settings
        import threadpoolctl, torch

        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stderr)
        plan = threads.apply_thread_settings(2, max_workers=4)
        child = subprocess.run(["sh", "-c", "echo $OMP_NUM_THREADS $OPENBLAS_NUM_THREADS"], capture_output=True,
                               text=True).stdout.split()
        first = dict(plan=list(plan), torch=torch.get_num_threads(), child=child,
                     pools=sorted({p["num_threads"] for p in threadpoolctl.threadpool_info()}),
                     apis=sorted({p["user_api"] for p in threadpoolctl.threadpool_info()}))
        plan = threads.apply_thread_settings(1, allocated=4, max_workers=4)  # the environment's allocation wins
        second = dict(plan=list(plan), torch=torch.get_num_threads(), omp=os.environ["OMP_NUM_THREADS"],
                      pools=sorted({p["num_threads"] for p in threadpoolctl.threadpool_info()}))
        print(json.dumps([first, second]))
    """)
    env = {**os.environ, "SLURM_CPUS_PER_TASK": "1", "OPENBLAS_NUM_THREADS": "8"}
    env.pop("OMP_NUM_THREADS", None)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    first, second = json.loads(done.stdout.strip().splitlines()[-1])
    assert first["plan"] == [1, 0]
    assert first["torch"] == 1
    assert first["pools"] == [1] and {"blas", "openmp"} <= set(first["apis"])
    assert first["child"] == ["1", "1"]  # children inherit the count; a BLAS-specific variable follows it
    assert second["plan"] == [1, 0] and second["torch"] == 1 and second["omp"] == "1" and second["pools"] == [1]
    lines = [line for line in done.stderr.splitlines() if "Threads:" in line]
    assert lines[0] == (
        "INFO Threads: 1 intra-op thread(s) and 0 data-loader worker(s) per process: 1 CPU(s) "
        "(SLURM_CPUS_PER_TASK) for 2 process(es) on this node"
    )
    assert lines[1].startswith("WARNING Threads: 2 process(es) x (1 thread(s) + 0 worker(s)) = 2 busy threads on 1 ")
    assert lines[2].startswith(
        "INFO Threads: 1 intra-op thread(s) and 0 data-loader worker(s) per process: 1 CPU(s) "
        "(SLURM_CPUS_PER_TASK) for 1 process(es)"
    )
