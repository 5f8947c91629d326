"""One owner per run directory: ``flock`` on ``<run>/.owner.lock`` plus the owner's record in it.

A second process gets :class:`RunInUse`. Where ``flock`` cannot decide (per node or a no-op), the record does: a live
process here or a live foreign Slurm job owns the run; a dead owner or an ended job is taken over with a log line; a
requeued job takes its own run back. The rules per file system: docs/run_ownership.md.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import getpass
import json
import logging
import os
import shlex
import socket
import sys
import time
import weakref
from typing import Mapping, Optional, Tuple

from ..utils.squeue import query_jobs, still_runs

__all__ = ["LOCK_FILENAME", "RunInUse", "RunLock", "describe_owner", "owner_record", "slurm_job_id"]

LOCK_FILENAME = ".owner.lock"
# How long a reader waits for a record being written, and a locker for the record of an owner that has just taken
# the flock (its record follows within milliseconds).
_RECORD_WAIT_S = 2.0
_MAX_RECORD_BYTES = 1 << 16
_UNREADABLE = "unreadable"
_BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"

# Locks held by this process: a forked child closes its inherited descriptors, so it never releases the parent's.
_HELD: "weakref.WeakSet[RunLock]" = weakref.WeakSet()


class RunInUse(ValueError):
    """Another process owns the run directory. ``owner`` is its record in the lock file, ``run_dir`` the run."""

    def __init__(self, run_dir: str, owner: Optional[dict]):
        self.run_dir, self.owner = run_dir, owner
        super().__init__(f"{run_dir} is in use by {describe_owner(owner)}; wait for it, or stop it")


def slurm_job_id(environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """This process's Slurm job: ``"<array job>_<task>"`` for an array element, else ``SLURM_JOB_ID``; None outside
    Slurm. A requeued job keeps it."""
    env = os.environ if environ is None else environ
    array_job, task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    if array_job and task:
        return f"{array_job}_{task}"
    return env.get("SLURM_JOB_ID") or None


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
    if not stat or ")" not in stat:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # the command name (field 2) may hold spaces and parentheses
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def owner_record(environ: Optional[Mapping[str, str]] = None) -> dict:
    """The record this process writes when it owns a run (``environ``: where the Slurm variables are read)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry for the uid (some containers)
        user = str(os.getuid())
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "pid_start": _process_start(os.getpid()),
        "boot_id": _read_text(_BOOT_ID_FILE),
        "pid_namespace": _pid_namespace(),
        "slurm_job": slurm_job_id(environ),
        "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "user": user,
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
    pid = record.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        pass
    recorded = record.get("pid_start")
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
    if not isinstance(record, dict) or not isinstance(record.get("pid"), int) or not record.get("host"):
        return None
    return record


def _read_record(read, wait_s: float = _RECORD_WAIT_S) -> Optional[dict]:
    """The record through ``read()`` (bytes of the file), retried while it is half written; None when empty.
    A record that stays unreadable for ``wait_s`` comes back as ``{"unreadable": <its start>}``."""
    deadline = time.monotonic() + wait_s
    while True:
        data = read()
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
    for lock in list(_HELD):
        lock._forget()


os.register_at_fork(after_in_child=_close_inherited_locks)


class RunLock:
    """Exclusive ownership of one run directory by this process: ``with RunLock(run_dir): ...`` or
    :meth:`acquire` / :meth:`release`. A stale lock is taken over with a log line; the former owner's record is
    kept in :attr:`previous_owner`.

    Args:
        run_dir: the run directory; the lock file is ``<run_dir>/.owner.lock``.
        log: where take-overs are logged (default: this module's logger).
        environ: where the Slurm variables are read (default ``os.environ``).
    """

    def __init__(
        self, run_dir: str, *, log: Optional[logging.Logger] = None, environ: Optional[Mapping[str, str]] = None
    ):
        if not isinstance(run_dir, (str, os.PathLike)) or not os.fspath(run_dir):
            raise ValueError(f"RunLock: run_dir must be a non-empty path, got {run_dir!r}")
        self.run_dir = os.fspath(run_dir)
        self.path = os.path.join(self.run_dir, LOCK_FILENAME)
        self.previous_owner: Optional[dict] = None
        self._log = log or logging.getLogger(__name__)
        self._environ = environ
        self._fd: Optional[int] = None
        self._flocked = False
        self._record: Optional[dict] = None
        self._pid: Optional[int] = None

    @property
    def held(self) -> bool:
        """Whether this process owns the run through this object."""
        return self._fd is not None and self._pid == os.getpid()

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"RunLock({self.run_dir!r}, held={self.held})"

    def _read_own(self) -> bytes:
        return os.pread(self._fd, _MAX_RECORD_BYTES, 0)

    def acquire(self) -> "RunLock":
        """Own the run or raise :class:`RunInUse`; returns ``self``."""
        if self._fd is not None:
            raise RuntimeError(f"{self!r} is already acquired")
        self.previous_owner = None
        os.makedirs(self.run_dir, exist_ok=True)
        # Read-write: NFS needs the file open for writing to grant an exclusive lock.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            flocked, lock_free = self._try_flock(fd)
            self._fd = fd
            record = _read_record(self._read_own)
            takeover, record = self._judge(record, lock_free=lock_free)
            mine = owner_record(self._environ)
            data = (json.dumps(mine, sort_keys=True) + "\n").encode()
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
            os.fsync(fd)
        except BaseException:
            self._fd = None
            os.close(fd)  # drops the flock if it was granted
            raise
        self._flocked, self._record, self._pid = flocked, mine, os.getpid()
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

    def _try_flock(self, fd: int) -> Tuple[bool, bool]:
        """``(granted, free)``: whether this process now holds the flock, and whether nobody else does. Where the
        file system refuses flock altogether (Lustre's ``noflock``) both are unknown: (False, True), and the record
        alone decides."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True, True
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return False, False
            self._log.warning(
                f"{self.path}: this file system refuses flock ({e.strerror}); ownership rests on the "
                "record alone (Lustre: mount with -o flock)"
            )
            return False, True

    def _judge(self, record: Optional[dict], *, lock_free: bool) -> Tuple[Optional[str], Optional[dict]]:
        """``(why the recorded owner is gone, its record)`` to take over; ``(None, None)`` when nobody owned the
        run; raises RunInUse otherwise. ``lock_free``: whether no other process holds the flock."""
        if not lock_free and (record is None or (_same_machine(record) and not _process_alive(record))):
            # Another process holds the flock under no record or a dead owner's: it has just taken the lock and
            # writes its record within milliseconds.
            record = self._wait_for_new_record(record)
            if record is not None and _same_machine(record) and not _process_alive(record):
                record = None  # still the dead owner's record: the holder is not the recorded process
        if record is None:
            if lock_free:
                return None, None
            raise RunInUse(self.run_dir, record)
        if _UNREADABLE in record:
            if lock_free:
                return "its record could not be read", record
            raise RunInUse(self.run_dir, record)
        local = _same_machine(record)
        alive_here = local and _process_alive(record)
        our_job = slurm_job_id(self._environ)
        if our_job and record.get("slurm_job") == our_job and not alive_here:
            return f"Slurm job {our_job} was requeued and takes its run back", record
        if not lock_free:
            raise RunInUse(self.run_dir, record)
        if local:
            if alive_here:  # the flock was free, yet the owner runs: this file system's flock does not protect
                raise RunInUse(self.run_dir, record)
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

    def _wait_for_new_record(self, old: Optional[dict]) -> Optional[dict]:
        deadline = time.monotonic() + _RECORD_WAIT_S
        record = old
        while record == old and time.monotonic() < deadline:
            time.sleep(0.05)
            record = _read_record(self._read_own)
        return record

    def release(self) -> None:
        """Give the run up: empty the record (when it is still ours), drop the lock, close the file. Idempotent;
        in a process other than the acquiring one (a forked child) it only closes this copy of the descriptor."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        _HELD.discard(self)
        try:
            if self._pid != os.getpid():
                return
            current = _read_record(lambda: os.pread(fd, _MAX_RECORD_BYTES, 0), wait_s=0.5)
            if current == self._record:
                os.ftruncate(fd, 0)
                with contextlib.suppress(OSError):
                    os.fsync(fd)
            else:
                self._log.warning(
                    f"{self.run_dir}: ownership was taken over by {describe_owner(current)} while "
                    "this process held it; its record is left in place"
                )
            if self._flocked:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def _forget(self) -> None:
        """In a forked child: close the inherited descriptor without unlocking the parent's lock."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
