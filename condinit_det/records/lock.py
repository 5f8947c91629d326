"""One owner per run directory: ``flock`` on ``<run>/.owner.lock`` plus the owner's record in it, which decides where
``flock`` cannot (a live process here or a live Slurm job owns the run; a dead one is taken over; a requeued job takes
its run back). The rules per file system: docs/run_ownership.md.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import logging
import os
import shlex
import socket
import sys
import threading
import time
import weakref
from typing import Optional, Tuple

import psutil

from ..utils.squeue import query_jobs, still_runs

__all__ = ["LOCK_FILENAME", "RunInUse", "RunLock", "describe_owner", "owner_record", "slurm_job_id"]

LOCK_FILENAME = ".owner.lock"
# How long to wait for a record being written (an owner that has just taken the flock writes it within milliseconds).
_RECORD_WAIT_S = 2.0
_MAX_RECORD_BYTES = 1 << 16
_UNREADABLE = "unreadable"
_BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"

# Locks held by this process: a forked child closes its inherited descriptors, so it never releases the parent's.
_HELD: "weakref.WeakSet[RunLock]" = weakref.WeakSet()
# Held by a fork and by the end of a release: a child sees a lock held, with its descriptor, or released and closed.
_FORK_GUARD = threading.Lock()


class RunInUse(ValueError):
    """Another process owns the run directory. ``owner`` is its record in the lock file, ``run_dir`` the run."""

    def __init__(self, run_dir: str, owner: Optional[dict]):
        self.run_dir, self.owner = run_dir, owner
        super().__init__(f"{run_dir} is in use by {describe_owner(owner)}; wait for it, or stop it")


def slurm_job_id() -> Optional[str]:
    """This process's Slurm job (``"<array job>_<task>"`` for an array element), kept by a requeue; None outside."""
    array_job, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array_job and task:
        return f"{array_job}_{task}"
    return os.environ.get("SLURM_JOB_ID") or None


def _read_text(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _pid_namespace() -> Optional[str]:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def _process_start(pid: int) -> Optional[int]:
    """Start time of ``pid`` in clock ticks after boot (``/proc/<pid>/stat`` field 22); None when unknown."""
    stat = _read_text(f"/proc/{pid}/stat")
    if stat is None:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])  # the command name (field 2) may hold spaces and parentheses


def owner_record() -> dict:
    """The record this process writes when it owns a run."""
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "pid_start": _process_start(os.getpid()),
        "boot_id": _read_text(_BOOT_ID_FILE),
        "pid_namespace": _pid_namespace(),
        "slurm_job": slurm_job_id(),
        "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "user": psutil.Process().username(),  # the uid itself where it has no passwd entry (some containers)
        "command": shlex.join(sys.argv),
    }


def _same_machine(record: dict) -> bool:
    """Whether the record's pid can be checked here: same host name, and same boot and pid namespace when recorded."""
    if record.get("host") != socket.gethostname():
        return False
    for key, here in (("boot_id", _read_text(_BOOT_ID_FILE)), ("pid_namespace", _pid_namespace())):
        if record.get(key) and here and record[key] != here:
            return False
    return True


def _process_alive(record: dict) -> bool:
    """Whether the record's process (on this machine) still runs: its pid exists and started when recorded."""
    pid, recorded = record["pid"], record.get("pid_start")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists (psutil cannot see it where /proc hides pids)
        pass
    return recorded is None or _process_start(pid) in (None, recorded)


def _job_alive(job_id: str) -> Tuple[bool, str]:
    """Whether the Slurm job may still run, and the evidence (for the log line)."""
    answer = query_jobs([job_id])
    if answer.error:
        return False, answer.error
    state = answer.get(job_id)
    if state is None:
        return False, "squeue no longer lists it"
    return still_runs(state), f"squeue says {state}"


def _parse_record(data: bytes) -> Optional[dict]:
    """The record in ``data`` (its first line); {} when empty, None when incomplete or not a record."""
    if not data.strip():
        return {}
    line, newline, _ = data.partition(b"\n")
    if not newline:
        return None  # being written
    try:
        record = json.loads(line.decode())
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    pid = record.get("pid") if isinstance(record, dict) else None
    return record if isinstance(pid, int) and pid > 0 and record.get("host") else None


def _read_record(fd: int, wait_s: float = _RECORD_WAIT_S) -> Optional[dict]:
    """The record in the lock file open as ``fd``, retried while it is half written; None when empty.
    A record that stays unreadable for ``wait_s`` comes back as ``{"unreadable": <its start>}``."""
    deadline = time.monotonic() + wait_s
    while True:
        data = os.pread(fd, _MAX_RECORD_BYTES, 0)
        record = _parse_record(data)
        if record is not None:
            return record or None
        if time.monotonic() >= deadline:
            return {_UNREADABLE: data[:80].decode(errors="replace")}
        time.sleep(0.05)


def describe_owner(record: Optional[dict]) -> str:
    """``"pid 1234 on host h (Slurm job 5_0) since 12:03:04"`` (the date too when not today, in local time)."""
    if not record:
        return "a process that has not written its record yet"
    if _UNREADABLE in record:
        return f"an owner whose record cannot be read ({record[_UNREADABLE]!r})"
    text = f"pid {record.get('pid')} on host {record.get('host')}"
    if record.get("slurm_job"):
        text += f" (Slurm job {record['slurm_job']})"
    try:
        started = datetime.datetime.fromisoformat(str(record.get("started"))).astimezone()
    except ValueError:
        return text
    today = datetime.datetime.now().astimezone().date()
    return text + " since " + started.strftime("%H:%M:%S" if started.date() == today else "%Y-%m-%d %H:%M:%S")


def _close_inherited_locks() -> None:
    _FORK_GUARD.release()
    for lock in list(_HELD):
        lock._forget()


os.register_at_fork(
    before=_FORK_GUARD.acquire, after_in_parent=_FORK_GUARD.release, after_in_child=_close_inherited_locks
)


class RunLock:
    """Exclusive ownership of one run directory by this process (``with RunLock(run_dir): ...``): :meth:`acquire`
    raises :class:`RunInUse` when another process owns the run and takes a stale lock over with a log line naming
    the former owner (kept in :attr:`previous_owner`).

    Args:
        log: where take-overs are logged (default: this module's logger).
    """

    def __init__(self, run_dir: str, *, log: Optional[logging.Logger] = None):
        self.run_dir = os.fspath(run_dir)
        self.path = os.path.join(self.run_dir, LOCK_FILENAME)
        self.previous_owner: Optional[dict] = None
        self._log = log or logging.getLogger(__name__)
        self._fd: Optional[int] = None
        self._record: Optional[dict] = None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    def acquire(self) -> "RunLock":
        """Own the run or raise :class:`RunInUse`; returns ``self``."""
        self.previous_owner = None
        os.makedirs(self.run_dir, exist_ok=True)
        # Read-write: NFS needs the file open for writing to grant an exclusive lock.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            lock_free = self._try_flock(fd)
            takeover, record = self._judge(_read_record(fd), fd, lock_free=lock_free)
            mine = owner_record()
            data = (json.dumps(mine, sort_keys=True) + "\n").encode()
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
            os.fsync(fd)
        except BaseException:
            os.close(fd)  # drops the flock if it was granted
            raise
        self._fd, self._record = fd, mine
        _HELD.add(self)
        if takeover is not None:
            self.previous_owner = record
            if not lock_free:
                takeover += (
                    "; the OS lock is still held by the previous instance (a crashed node's lock on the "
                    "file server), this job owns the run through its record"
                )
            self._log.warning(f"{self.run_dir}: took over the lock of {describe_owner(record)}: {takeover}")
        return self

    def _try_flock(self, fd: int) -> bool:
        """Take the flock; whether nobody else holds it (True where the file system refuses flock: records decide)."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return False
            self._log.warning(
                f"{self.path}: this file system refuses flock ({e.strerror}); ownership rests on the "
                "record alone (Lustre: mount with -o flock)"
            )
            return True

    def _judge(self, record: Optional[dict], fd: int, *, lock_free: bool) -> Tuple[Optional[str], Optional[dict]]:
        """``(why the recorded owner is gone, its record)`` to take over, ``(None, None)`` when nobody owned the run;
        else raises RunInUse. ``lock_free``: whether no other process holds the flock."""
        if not lock_free and (record is None or (_same_machine(record) and not _process_alive(record))):
            # Another process holds the flock under no record or a dead owner's: it has just taken the lock and
            # writes its record within milliseconds.
            old, deadline = record, time.monotonic() + _RECORD_WAIT_S
            while record == old and time.monotonic() < deadline:
                time.sleep(0.05)
                record = _read_record(fd)
            if record is not None and _same_machine(record) and not _process_alive(record):
                record = None  # still the dead owner's record: the holder is not the recorded process
        if record is None or _UNREADABLE in record:
            if not lock_free:
                raise RunInUse(self.run_dir, record)
            return ("its record could not be read", record) if record else (None, None)
        local = _same_machine(record)
        alive_here = local and _process_alive(record)
        our_job = slurm_job_id()
        if our_job and record.get("slurm_job") == our_job and not alive_here:
            return f"Slurm job {our_job} was requeued and takes its run back", record
        if not lock_free or alive_here:  # alive with the flock free: this file system's flock does not protect
            raise RunInUse(self.run_dir, record)
        if local:
            return f"pid {record.get('pid')} no longer runs on this host", record
        job = record.get("slurm_job")
        if job:
            alive, evidence = _job_alive(job)
            if alive:
                raise RunInUse(self.run_dir, record)
            return f"Slurm job {job} is over ({evidence})", record
        why = (
            f"no process on host {record.get('host')} holds the OS lock any more (its pid cannot be checked from "
            f"{socket.gethostname()})"
        )
        return why, record

    def release(self) -> None:
        """Give the run up: empty the record (when it is still ours), drop the lock, close the file. Idempotent; a
        no-op in a forked child."""
        fd = self._fd
        if fd is None:
            return
        try:  # still held: a child forked meanwhile closes its copy of fd
            current = _read_record(fd, wait_s=0.5)
            if current == self._record:
                os.ftruncate(fd, 0)
                with contextlib.suppress(OSError):
                    os.fsync(fd)
            else:
                self._log.warning(
                    f"{self.run_dir}: ownership was taken over by {describe_owner(current)} while "
                    "this process held it; its record is left in place"
                )
            with contextlib.suppress(OSError):  # nothing to unlock where the file system refuses flock
                fcntl.flock(fd, fcntl.LOCK_UN)  # for every copy of the descriptor, closed or not
        finally:
            with _FORK_GUARD:
                self._fd = None
                _HELD.discard(self)
                os.close(fd)

    def _forget(self) -> None:
        """In a forked child: close the inherited descriptor without unlocking the parent's lock."""
        fd, self._fd = self._fd, None  # held: only held locks are in _HELD
        with contextlib.suppress(OSError):
            os.close(fd)
