"""
Run a ``tools/*.py`` command line in a process forked from the test's own, as ``python TOOL ARGS`` would run it.

The child is a process of its own (pid, exit status, signals, standard streams, environment, working folder) that
runs the script as ``__main__``; what it does not redo is importing torch, detectron2 and timm, which the test
process has imported already and a fresh interpreter takes seconds of CPU for on a small machine. Tests about how
an interpreter starts (what a command imports, what it prints while importing) start a real ``python`` instead.
"""

import atexit
import importlib
import logging
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import warnings

# What a run of either stage and its report import: imported once here, before the first fork.
_SHARED_MODULES = (
    "condinit_det.engine.train",
    "condinit_det.pretrain.trainer",
    "condinit_det.report.compare",
    "detectron2.utils.visualizer",
    "matplotlib.pyplot",
)
# Python's own filters when no -W option and no PYTHONWARNINGS is given (pytest's are the test's, not the tool's).
_DEFAULT_FILTERS = [
    ("default", DeprecationWarning, "__main__"),
    ("ignore", DeprecationWarning, None),
    ("ignore", PendingDeprecationWarning, None),
    ("ignore", ImportWarning, None),
    ("ignore", ResourceWarning, None),
]


class ForkedTool:
    """A tool started by :func:`start_tool`: ``pid``, ``poll()``, ``wait()`` and ``returncode`` as
    ``subprocess.Popen``'s (negative: the signal that ended it)."""

    def __init__(self, pid: int, argv):
        self.pid, self.args, self.returncode = pid, argv, None

    def send_signal(self, number: int) -> None:
        os.kill(self.pid, number)

    def poll(self):
        if self.returncode is None:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout=None):
        """The exit status; ``subprocess.TimeoutExpired`` past ``timeout`` seconds (the tool goes on, as Popen's)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.05)
        return self.returncode


def start_tool(tool, *args, cwd, env=None, stdout=None, stderr=None, start_new_session=False):
    """Start ``python tool *args`` in ``cwd`` with the environment ``env`` (default: the test's) in a forked process.

    ``stdout`` and ``stderr``: an open file, ``subprocess.DEVNULL`` or None (the test's); ``stderr`` may also be
    ``subprocess.STDOUT``. ``start_new_session``: the tool leads a process group of its own (``os.killpg``).
    Returns a :class:`ForkedTool`, or where CUDA is available a ``subprocess.Popen`` of a fresh interpreter.
    """
    argv = [sys.executable, str(tool), *map(str, args)]
    import torch

    if torch.cuda.is_available():  # CUDA does not survive a fork: a fresh interpreter
        return subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=stdout, stderr=stderr, start_new_session=start_new_session
        )
    for module in _SHARED_MODULES:
        importlib.import_module(module)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _child(
            argv,
            cwd=str(cwd),
            env=dict(os.environ if env is None else env),
            out=stdout,
            err=stderr,
            new_session=start_new_session,
        )
    return ForkedTool(pid, argv)


def run_tool(tool, *args, cwd, env=None, timeout: float = 1200) -> subprocess.CompletedProcess:
    """Run ``python tool *args`` as :func:`start_tool` does and wait for it; returns what ``subprocess.run(...,
    capture_output=True, text=True)`` returns: ``returncode``, ``stdout`` and ``stderr``. Raises
    ``subprocess.TimeoutExpired`` (the tool killed) past ``timeout`` seconds."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        tool = start_tool(tool, *args, cwd=cwd, env=env, stdout=out, stderr=err)
        try:
            code = tool.wait(timeout)
        except subprocess.TimeoutExpired:
            tool.send_signal(signal.SIGKILL)  # a forked tool and a fresh interpreter alike
            tool.wait()
            raise
        streams = []
        for stream in (out, err):
            stream.seek(0)
            streams.append(stream.read().decode(errors="replace"))
    return subprocess.CompletedProcess(tool.args, code, *streams)


def _child(argv, *, cwd, env, out, err, new_session):
    """Become ``python TOOL ARGS`` and run it; never returns."""
    code = 1
    try:
        if new_session:
            os.setsid()
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        for fd, target in ((1, out), (2, err)):
            if target == subprocess.DEVNULL:
                os.dup2(os.open(os.devnull, os.O_WRONLY), fd)
            elif target == subprocess.STDOUT:
                os.dup2(1, fd)
            elif target is not None:
                os.dup2(target.fileno(), fd)
        sys.stdin = sys.__stdin__ = open(0, closefd=False)  # noqa: SIM115
        sys.stdout = sys.__stdout__ = open(1, "w", closefd=False)  # noqa: SIM115
        sys.stderr = sys.__stderr__ = open(2, "w", closefd=False, buffering=1)  # noqa: SIM115
        for number in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP, signal.SIGALRM):
            signal.signal(number, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        warnings.resetwarnings()
        for action, category, module in reversed(_DEFAULT_FILTERS):
            warnings.filterwarnings(action, category=category, module=module or "")
        for option in filter(None, env.get("PYTHONWARNINGS", "").split(",")):
            warnings._setoption(option)  # noqa: SLF001  (how the interpreter reads PYTHONWARNINGS)
        warnings.showwarning = warnings._showwarning_orig  # noqa: SLF001
        warnings._showwarnmsg_impl = _show_warning  # noqa: SLF001  (pytest's recorder is the test's)
        atexit._clear()  # noqa: SLF001  (the test process's exit handlers are not the tool's)
        logging.root.handlers.clear()  # pytest's capture handlers
        logging.root.setLevel(logging.WARNING)
        sys.argv = argv[1:]
        sys.path[0] = os.path.dirname(os.path.abspath(argv[1]))
        runpy.run_path(argv[1], run_name="__main__")
        code = 0
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
    except BaseException:  # noqa: B902  (as the interpreter does: the traceback, then status 1)
        traceback.print_exc()
    finally:
        try:
            atexit._run_exitfuncs()  # noqa: SLF001  (what the tool registered, as at an interpreter's exit)
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _show_warning(message):
    sys.stderr.write(warnings.formatwarning(message.message, message.category, message.filename, message.lineno))
