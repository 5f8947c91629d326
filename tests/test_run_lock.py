"""One owner per run directory (condinit_det.records.lock): refusal, release on every exit path, stale locks,
Slurm jobs (a fake ``squeue`` on PATH), forked and executed children."""

import datetime
import fcntl
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import condinit_det.records.lock as run_lock
from condinit_det.records.lock import (
    LOCK_FILENAME,
    RunInUse,
    RunLock,
    describe_owner,
    owner_record,
    slurm_job_id,
)
from condinit_det.utils.squeue import squeue_command

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The lock module and the squeue query it uses are plain Python: the helper processes import them through bare
# package modules, without running the package's __init__ (which imports torch and detectron2 and would take seconds
# per process).
PACKAGE = os.path.join(REPO, "condinit_det")
HOLDER = textwrap.dedent("""
    import os, subprocess, sys, time, types
    for name in ("condinit_det", "condinit_det.utils", "condinit_det.records"):
        package = types.ModuleType(name)
        package.__path__ = [os.path.join(sys.argv[1], *name.split(".")[1:])]
        sys.modules[name] = package
    import condinit_det.records.lock as run_lock
    run_dir, mode = sys.argv[2], sys.argv[3]

    def say(*words):
        print(*words, flush=True)

    if mode == "try":
        try:
            run_lock.RunLock(run_dir).acquire()
        except run_lock.RunInUse as e:
            say(e)
            sys.exit(2)
        say("acquired")
        sys.exit(0)
    with run_lock.RunLock(run_dir) as lock:
        with open(os.path.join(run_dir, "model_0000009.pth"), "w") as f:
            f.write("weights of iteration 9")
        if mode == "fork-release":  # a forked child releasing must not release the parent's lock
            child = os.fork()
            if child == 0:
                lock.release()
                os._exit(0)
            os.waitpid(child, 0)
        if mode == "children":  # a forked child and an executed one, both outliving this process
            ready = os.path.join(run_dir, "child_ready")
            child = os.fork()
            if child == 0:  # the lock's fork hook has run by now: say so, so the owner is killed after it
                open(ready, "w").close()
                time.sleep(60)
                os._exit(0)
            while not os.path.exists(ready):
                time.sleep(0.01)
            sleeper = subprocess.Popen(["sleep", "60"])
            say("held", os.getpid(), child, sleeper.pid)
        else:
            say("held", os.getpid())
        if mode in ("sleep", "children"):
            time.sleep(60)
        sys.stdin.readline()
        if mode == "raise":
            raise RuntimeError("the run failed")
    say("released")
""")
FAKE_SQUEUE = textwrap.dedent("""\
    #!/bin/sh
    echo "$@" >> "$FAKE_SQUEUE_LOG"
    printf '%s' "$FAKE_SQUEUE_OUT"
    [ -n "$FAKE_SQUEUE_ERR" ] && echo "$FAKE_SQUEUE_ERR" >&2
    exit "${FAKE_SQUEUE_RC:-0}"
""")


@pytest.fixture
def helper(tmp_path):
    path = tmp_path / "holder.py"
    path.write_text(HOLDER)
    return str(path)


@pytest.fixture
def log():
    return logging.getLogger("test_run_lock")


def start(helper, run_dir, mode, **kwargs):
    """A helper process in ``mode``; for the holding modes, returns once it holds the lock (and its first line)."""
    proc = subprocess.Popen(
        [sys.executable, helper, PACKAGE, str(run_dir), mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )
    line = proc.stdout.readline().split()
    assert line and line[0] == "held", proc.stderr.read()
    return proc, [int(x) for x in line[1:]]


def try_acquire(helper, run_dir):
    done = subprocess.run(
        [sys.executable, helper, PACKAGE, str(run_dir), "try"], capture_output=True, text=True, timeout=60
    )
    return done.returncode, done.stdout.strip()


def flock_free(run_dir) -> bool:
    fd = os.open(os.path.join(run_dir, LOCK_FILENAME), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def hold_flock(run_dir) -> subprocess.Popen:
    """A process holding the flock of ``run_dir``'s lock file without writing a record (kill it when done)."""
    locker = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
        import fcntl, os, time
        fd = os.open({str(run_dir / LOCK_FILENAME)!r}, os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX)
        print("locked", flush=True)
        time.sleep(60)
    """),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert locker.stdout.readline().strip() == "locked"
    return locker


def read_owner(run_dir):
    """The owner's record in the run's lock file (its first line), or None when nobody owns the run."""
    path = os.path.join(run_dir, LOCK_FILENAME)
    text = open(path).read() if os.path.isfile(path) else ""
    return json.loads(text.splitlines()[0]) if text.strip() else None


def write_record(run_dir, **fields):
    """A lock file holding a record like ``owner_record()``'s with ``fields`` changed; not flocked by anyone."""
    os.makedirs(run_dir, exist_ok=True)
    record = {**owner_record(), "slurm_job": None, **fields}
    with open(os.path.join(run_dir, LOCK_FILENAME), "w") as f:
        f.write(json.dumps(record) + "\n")
    return record


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.fixture
def fake_squeue(tmp_path, monkeypatch):
    """A ``squeue`` first on PATH answering ``out`` (exit status ``rc``, ``err`` on stderr); returns the file
    where each call's arguments land."""
    folder = tmp_path / "bin"
    folder.mkdir()
    script = folder / "squeue"
    script.write_text(FAKE_SQUEUE)
    script.chmod(0o755)
    calls = tmp_path / "squeue_calls"
    calls.write_text("")
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SQUEUE_LOG", str(calls))

    def answer(out="", rc=0, err=""):
        monkeypatch.setenv("FAKE_SQUEUE_OUT", out)
        monkeypatch.setenv("FAKE_SQUEUE_RC", str(rc))
        monkeypatch.setenv("FAKE_SQUEUE_ERR", err)
        return calls

    return answer


# ---------------------------------------------------------------------------------------------
# A live owner, and release on every exit path
# ---------------------------------------------------------------------------------------------
def test_second_process_is_refused_while_the_first_holds_the_run(helper, tmp_path):
    run_dir = tmp_path / "conditioned" / "seed0"
    holder, (pid,) = start(helper, run_dir, "wait")
    try:
        record = read_owner(str(run_dir))
        assert record["pid"] == pid and record["host"] == socket.gethostname()
        assert holder.args[1] in record["command"] and record["slurm_job"] is None

        code, message = try_acquire(helper, run_dir)
        assert code == 2
        assert re.fullmatch(
            rf"{re.escape(str(run_dir))} is in use by pid {pid} on host "
            rf"{re.escape(socket.gethostname())} since \d\d:\d\d:\d\d; wait for it, or stop it",
            message,
        ), message
        with pytest.raises(RunInUse, match=f"in use by pid {pid} ") as refused:  # and in this process
            RunLock(str(run_dir)).acquire()
        assert isinstance(refused.value, ValueError) and refused.value.owner["pid"] == pid
        # The refused attempts changed nothing of the owner's.
        assert read_owner(str(run_dir)) == record
        assert (run_dir / "model_0000009.pth").read_text() == "weights of iteration 9"
    finally:
        holder.communicate("go\n", timeout=30)
    assert holder.returncode == 0
    assert read_owner(str(run_dir)) is None
    assert (run_dir / LOCK_FILENAME).exists()  # kept: see the module docstring on unlinking
    assert try_acquire(helper, run_dir) == (0, "acquired")


@pytest.mark.parametrize("mode, status", [("wait", 0), ("raise", 1)])
def test_released_on_normal_exit_and_on_an_exception(helper, tmp_path, log, caplog, mode, status):
    run_dir = tmp_path / "run"
    holder, _ = start(helper, run_dir, mode)
    assert not flock_free(run_dir)
    out, err = holder.communicate("go\n", timeout=30)
    assert holder.returncode == status
    assert ("the run failed" in err) == (mode == "raise")
    assert flock_free(run_dir) and read_owner(str(run_dir)) is None
    with caplog.at_level(logging.WARNING, logger=log.name):
        with RunLock(str(run_dir), log=log) as lock:
            assert read_owner(str(run_dir))["pid"] == os.getpid() and lock.previous_owner is None
    assert not caplog.records  # a released lock is no stale lock


def test_killed_holder_loses_the_lock_and_its_record_is_taken_over(helper, tmp_path, log, caplog):
    run_dir = tmp_path / "run"
    holder, (pid,) = start(helper, run_dir, "sleep")
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
    assert flock_free(run_dir)  # the kernel dropped the flock with the process
    stale = read_owner(str(run_dir))
    assert stale["pid"] == pid  # ...and the record of the dead owner stayed
    with caplog.at_level(logging.WARNING, logger=log.name):
        lock = RunLock(str(run_dir), log=log).acquire()
    try:
        assert lock.previous_owner == stale
        assert read_owner(str(run_dir))["pid"] == os.getpid()
        (message,) = [r.getMessage() for r in caplog.records]
        assert f"took over the lock of pid {pid} on host {socket.gethostname()}" in message
        assert f"pid {pid} no longer runs on this host" in message
        assert (run_dir / "model_0000009.pth").read_text() == "weights of iteration 9"
    finally:
        lock.release()


def test_stale_record_of_a_dead_pid_on_this_host_is_taken_over(tmp_path, log, caplog):
    run_dir = tmp_path / "run"
    pid = dead_pid()
    write_record(run_dir, pid=pid, slurm_job=None)
    with caplog.at_level(logging.WARNING, logger=log.name):
        with RunLock(str(run_dir), log=log) as lock:
            assert lock.previous_owner["pid"] == pid
            assert read_owner(str(run_dir))["pid"] == os.getpid()
    assert any(f"took over the lock of pid {pid} " in r.getMessage() for r in caplog.records)


def test_live_owner_on_this_host_is_refused_even_without_its_flock(tmp_path):
    # A file system whose flock is a no-op: the record of a live process on this host still owns the run.
    run_dir = tmp_path / "run"
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        start_ticks = int(open(f"/proc/{sleeper.pid}/stat").read().rsplit(")", 1)[1].split()[19])
        write_record(run_dir, pid=sleeper.pid, pid_start=start_ticks)
        with pytest.raises(RunInUse, match=f"in use by pid {sleeper.pid} "):
            RunLock(str(run_dir)).acquire()
        # The same pid with another start time is a reused pid, not the owner.
        write_record(run_dir, pid=sleeper.pid, pid_start=start_ticks + 1)
        with RunLock(str(run_dir)) as lock:
            assert lock.previous_owner["pid"] == sleeper.pid
    finally:
        sleeper.kill()
        sleeper.wait()


def test_another_users_live_process_is_refused_where_proc_hides_it(tmp_path, monkeypatch):
    # /proc mounted hidepid=2: another user's process answers kill(pid, 0) with EPERM and has no readable /proc entry.
    run_dir = tmp_path / "run"
    pid, kill = dead_pid(), os.kill

    def hidden(target, sig):
        if target == pid:
            raise PermissionError(1, "Operation not permitted")
        return kill(target, sig)

    monkeypatch.setattr(os, "kill", hidden)
    write_record(run_dir, pid=pid, pid_start=12345)
    with pytest.raises(RunInUse, match=f"in use by pid {pid} "):
        RunLock(str(run_dir)).acquire()


def test_children_neither_hold_nor_release_the_lock(helper, tmp_path):
    run_dir = tmp_path / "run"
    # A forked child calling release() leaves the parent's lock in place.
    holder, (pid,) = start(helper, run_dir, "fork-release")
    try:
        assert not flock_free(run_dir)
        assert read_owner(str(run_dir))["pid"] == pid
        assert try_acquire(helper, run_dir)[0] == 2
    finally:
        holder.communicate("go\n", timeout=30)
    assert holder.returncode == 0 and flock_free(run_dir)

    # A forked child and an executed one outlive the killed owner: neither keeps the lock.
    holder, (pid, forked, executed) = start(helper, run_dir, "children", start_new_session=True)
    try:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
        for child in (forked, executed):
            os.kill(child, 0)  # still running
        assert flock_free(run_dir)
        assert try_acquire(helper, run_dir) == (0, "acquired")
    finally:
        os.killpg(holder.pid, signal.SIGKILL)


def test_a_child_forked_while_another_thread_releases_keeps_no_descriptor(tmp_path, monkeypatch):
    # release() in one thread, os.fork() in another: whenever the fork lands, the child holds no copy of the lock
    # file's descriptor (such a copy would keep the flock after the parent is gone) and its fork hook does not fail.
    run_dir = tmp_path / "run"
    lock_file = os.path.realpath(run_dir) + os.sep + LOCK_FILENAME
    releasing = threading.Event()
    read_record = run_lock._read_record

    def slow_read_record(fd, *args, **kwargs):  # widens release() so that the fork lands inside it
        releasing.set()
        time.sleep(0.01)
        return read_record(fd, *args, **kwargs)

    for attempt in range(20):
        lock = RunLock(str(run_dir)).acquire()
        monkeypatch.setattr(run_lock, "_read_record", slow_read_record)
        releasing.clear()
        releaser = threading.Thread(target=lock.release)
        releaser.start()
        releasing.wait(10)
        time.sleep(attempt * 0.001)  # from early in release() to after it
        read_end, write_end = os.pipe()
        child = os.fork()
        if child == 0:
            os.close(read_end)
            fds = os.listdir("/proc/self/fd")
            kept = [fd for fd in fds if os.path.realpath(f"/proc/self/fd/{fd}") == lock_file]
            os.write(write_end, json.dumps(kept).encode())
            os._exit(0)
        os.close(write_end)
        with os.fdopen(read_end) as f:
            kept = json.loads(f.read())
        _, status = os.waitpid(child, 0)
        releaser.join(10)
        monkeypatch.setattr(run_lock, "_read_record", read_record)
        assert kept == [] and status == 0, f"attempt {attempt}: the child kept descriptor(s) {kept} of {lock_file}"
        assert flock_free(run_dir) and read_owner(str(run_dir)) is None


def test_flock_held_with_no_record_yet_is_refused(tmp_path):
    # Another process has just taken the flock and not written its record (or never does): in use.
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / LOCK_FILENAME).write_text("")
    locker = hold_flock(run_dir)
    try:
        with pytest.raises(RunInUse, match="in use by a process that has not written its record yet"):
            RunLock(str(run_dir)).acquire()
    finally:
        locker.kill()
        locker.wait()


# ---------------------------------------------------------------------------------------------
# Slurm jobs
# ---------------------------------------------------------------------------------------------
def in_slurm_job(monkeypatch, **variables):
    """This process as if it ran in the Slurm job of ``variables`` (none: outside Slurm)."""
    for key in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"):
        monkeypatch.delenv(key, raising=False)
    for key, value in variables.items():
        monkeypatch.setenv(key, value)


def test_slurm_job_id_of_plain_jobs_and_array_elements(monkeypatch):
    in_slurm_job(monkeypatch)
    assert slurm_job_id() is None
    in_slurm_job(monkeypatch, SLURM_JOB_ID="812")
    assert slurm_job_id() == "812" and owner_record()["slurm_job"] == "812"
    in_slurm_job(monkeypatch, SLURM_JOB_ID="812", SLURM_ARRAY_JOB_ID="805", SLURM_ARRAY_TASK_ID="7")
    assert slurm_job_id() == "805_7"


def test_same_slurm_job_takes_its_run_back(tmp_path, log, caplog, fake_squeue, monkeypatch):
    calls = fake_squeue(out="805_7|RUNNING\n")
    run_dir = tmp_path / "run"
    write_record(run_dir, host="node-b", pid=4321, slurm_job="805_7")
    in_slurm_job(monkeypatch, SLURM_JOB_ID="812", SLURM_ARRAY_JOB_ID="805", SLURM_ARRAY_TASK_ID="7")
    with caplog.at_level(logging.WARNING, logger=log.name):
        with RunLock(str(run_dir), log=log) as lock:
            assert lock.previous_owner["host"] == "node-b"
            assert read_owner(str(run_dir))["slurm_job"] == "805_7"
    assert calls.read_text() == ""  # its own job: nothing to ask
    assert any("Slurm job 805_7 was requeued and takes its run back" in r.getMessage() for r in caplog.records)


def test_same_slurm_job_takes_its_run_back_from_a_lingering_lock(tmp_path, log, caplog, fake_squeue, monkeypatch):
    # The previous instance's node crashed and its lock lingers on the file server (here: a process holding the
    # flock under the previous instance's record); the requeued element owns the run, another job does not.
    fake_squeue(out="805_7|RUNNING\n")
    run_dir = tmp_path / "run"
    write_record(run_dir, host="node-b", pid=4321, slurm_job="805_7")
    locker = hold_flock(run_dir)
    try:
        in_slurm_job(monkeypatch, SLURM_JOB_ID="900")
        with pytest.raises(RunInUse, match=r"in use by pid 4321 on host node-b \(Slurm job 805_7\)"):
            RunLock(str(run_dir)).acquire()
        in_slurm_job(monkeypatch, SLURM_ARRAY_JOB_ID="805", SLURM_ARRAY_TASK_ID="7", SLURM_JOB_ID="812")
        with caplog.at_level(logging.WARNING, logger=log.name):
            with RunLock(str(run_dir), log=log):
                assert read_owner(str(run_dir))["pid"] == os.getpid()
        assert any("the OS lock is still held by the previous instance" in r.getMessage() for r in caplog.records)
        assert read_owner(str(run_dir)) is None
    finally:
        locker.kill()
        locker.wait()


def test_foreign_running_slurm_job_is_refused_even_when_the_flock_is_free(tmp_path, fake_squeue, monkeypatch):
    calls = fake_squeue(out="805_7|RUNNING\n")
    run_dir = tmp_path / "run"
    record = write_record(run_dir, host="node-b", pid=4321, slurm_job="805_7", started="2026-12-01T12:03:04+00:00")
    assert flock_free(run_dir)
    in_slurm_job(monkeypatch, SLURM_JOB_ID="900")
    with pytest.raises(RunInUse) as refused:
        RunLock(str(run_dir)).acquire()
    assert str(refused.value).startswith(f"{run_dir} is in use by pid 4321 on host node-b (Slurm job 805_7) since ")
    assert calls.read_text().split() == squeue_command(["805_7"])[1:]
    assert read_owner(str(run_dir)) == record  # untouched
    for state in ("PENDING|Dependency", "REQUEUED", "COMPLETING", "SUSPENDED"):
        fake_squeue(out=f"805_7|{state}\n")
        with pytest.raises(RunInUse):
            RunLock(str(run_dir)).acquire()


@pytest.mark.parametrize(
    "answer",
    [
        dict(out=""),
        dict(out="805_7|COMPLETED\n"),
        dict(out="805_7|CANCELLED\n"),
        dict(out="805_7|PENDING|DependencyNeverSatisfied\n"),  # waits on a job that failed: never starts
        dict(out="", rc=1, err="slurm_load_jobs error: Invalid job id specified"),
        None,  # no squeue on PATH
    ],
    ids=["empty", "completed", "cancelled", "never-starts", "unknown-job", "no-squeue"],
)
def test_foreign_slurm_job_that_is_gone_is_taken_over(tmp_path, log, caplog, fake_squeue, monkeypatch, answer):
    if answer is None:
        empty = tmp_path / "empty_bin"
        empty.mkdir()
        monkeypatch.setenv("PATH", str(empty))
    else:
        fake_squeue(**answer)
    run_dir = tmp_path / "run"
    write_record(run_dir, host="node-b", pid=4321, slurm_job="805_7")
    with caplog.at_level(logging.WARNING, logger=log.name):
        with RunLock(str(run_dir), log=log) as lock:
            assert lock.previous_owner["slurm_job"] == "805_7"
    (message,) = [r.getMessage() for r in caplog.records]
    assert "took over the lock of pid 4321 on host node-b (Slurm job 805_7)" in message
    assert "Slurm job 805_7 is over" in message


def test_other_host_without_a_job_is_decided_by_the_flock(tmp_path, log, caplog):
    run_dir = tmp_path / "run"
    write_record(run_dir, host="workstation-2", pid=4321, slurm_job=None)
    with caplog.at_level(logging.WARNING, logger=log.name):
        with RunLock(str(run_dir), log=log):
            pass
    assert any("no process on host workstation-2 holds the OS lock" in r.getMessage() for r in caplog.records)


# ---------------------------------------------------------------------------------------------
# The record and the API
# ---------------------------------------------------------------------------------------------
def test_describe_owner_names_pid_host_job_and_start():
    today = datetime.datetime.now().astimezone().replace(hour=12, minute=3, second=4, microsecond=0)
    record = {"pid": 1234, "host": "h", "slurm_job": "5_0", "started": today.isoformat()}
    assert describe_owner(record) == "pid 1234 on host h (Slurm job 5_0) since 12:03:04"
    earlier = today - datetime.timedelta(days=3)
    assert describe_owner({**record, "slurm_job": None, "started": earlier.isoformat()}) == (
        f"pid 1234 on host h since {earlier:%Y-%m-%d} 12:03:04"
    )
    assert describe_owner(None) == "a process that has not written its record yet"


def test_a_garbled_record_of_a_gone_writer_is_taken_over(tmp_path):
    (tmp_path / LOCK_FILENAME).write_text('{"pid": 12')  # a record that never completes
    with RunLock(str(tmp_path)) as lock:  # free flock: the garbled record's writer is gone
        assert lock.previous_owner == {"unreadable": '{"pid": 12'}


def test_one_owner_per_process_and_object(tmp_path):
    run_dir = str(tmp_path / "run")
    lock = RunLock(run_dir)
    with lock:
        with pytest.raises(RunInUse, match=f"in use by pid {os.getpid()} "):
            RunLock(run_dir).acquire()  # a second object in the same process is a second owner
    assert read_owner(run_dir) is None
    lock.release()  # idempotent
    with lock:  # reusable
        assert read_owner(run_dir)["pid"] == os.getpid()


def test_release_keeps_a_record_that_is_no_longer_ours(tmp_path, log, caplog):
    run_dir = tmp_path / "run"
    lock = RunLock(str(run_dir), log=log).acquire()
    other = write_record(run_dir, host="node-c", pid=99, slurm_job="77")
    with caplog.at_level(logging.WARNING, logger=log.name):
        lock.release()
    assert read_owner(str(run_dir)) == other
    assert any("ownership was taken over by pid 99 on host node-c" in r.getMessage() for r in caplog.records)
