"""The child processes of long-running commands (``kdtr run``, ``kdtr mutate``, ``kdtr regen``),
and how an interruption ends every one of them.

Every child starts through :func:`spawn`: in a process group of its own (a new session), so
that killing the group kills what it started too (a ``make`` and its compilers, a wrapper
script and the binary it runs); registered, with signals blocked between the fork and the
registration, so that no interruption can fall between them; and, on Linux, with
``PR_SET_PDEATHSIG`` so that it gets SIGKILL if kdtr itself is killed outright.

The rule of an interruption (Ctrl-C, SIGTERM, SIGHUP): :func:`install_signal_handlers` turns
SIGTERM and SIGHUP into :class:`Terminated`, raised in the main thread as Python raises
KeyboardInterrupt for SIGINT; the code on the way out calls :func:`stop_all`, which kills the
process group of every registered child and makes any later :func:`spawn` kill its child at
once (a worker thread starting one while the run ends); :func:`release` -- which
:func:`run_captured` and every ``finally`` around a child call -- kills and reaps a child
whose caller is unwinding.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import subprocess
import threading
from typing import Any

_ACTIVE: set[subprocess.Popen] = set()
_ACTIVE_LOCK = threading.Lock()
_STOPPING = threading.Event()  # set when a run is being interrupted: every new child is killed at once

_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Terminated(BaseException):
    """Raised in the main thread when SIGTERM or SIGHUP ends a command (as KeyboardInterrupt
    for SIGINT); ``signum`` is the signal's number, ``args[0]`` its name."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_terminated(signum: int, _frame: Any) -> None:
    raise Terminated(signum)


def install_signal_handlers() -> None:
    """SIGTERM and SIGHUP (a CI cancel, a closed terminal) end the command the way Ctrl-C
    does, by an exception in the main thread. Called from another thread (a command run
    inside a test harness's or an application's thread), it does nothing: Python runs
    signal handlers in the main thread only."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_terminated)


def signal_number(exc: BaseException) -> int:
    """The signal behind ``exc``: a :class:`Terminated`'s, or SIGINT for KeyboardInterrupt."""
    return exc.signum if isinstance(exc, Terminated) else int(signal.SIGINT)


# Linux: a child gets SIGKILL when kdtr dies, even by SIGKILL (prctl PR_SET_PDEATHSIG).
_PR_SET_PDEATHSIG = 1
try:
    _prctl = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True).prctl
except (OSError, AttributeError):
    _prctl = None


def child_setup(parent_pid: int, mask: set[int] | None = None) -> None:
    """Runs in the child between fork and exec: the parent's signal mask back, the death
    signal set, and an exit if the parent is already gone."""
    if mask is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # kdtr died before the line above took effect
        os._exit(137)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL to ``proc``'s process group (nothing if it is gone)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def spawn(cmd: list[str], **popen_kwargs: Any) -> subprocess.Popen:
    """``subprocess.Popen(cmd, **popen_kwargs)`` in a new process group, registered for
    :func:`stop_all`; killed at once if the command is being interrupted. The caller must
    :func:`release` it (in a ``finally``).

    Raises:
        OSError: the program cannot be started (as Popen).
    """
    parent = os.getpid()
    main = threading.current_thread() is threading.main_thread()
    # In the main thread a signal handler raises: block the signals until the child is
    # registered (the child gets the old mask back before exec).
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS) if main else None
    try:
        proc = subprocess.Popen(cmd, start_new_session=True,
                                preexec_fn=lambda: child_setup(parent, old), **popen_kwargs)
        with _ACTIVE_LOCK:
            _ACTIVE.add(proc)
            if _STOPPING.is_set():  # started while the command was being interrupted
                kill_group(proc)
    finally:
        if old is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
    return proc


def release(proc: subprocess.Popen) -> None:
    """Unregister ``proc``; if it is still running (its caller is unwinding), kill its group
    and reap it first."""
    try:
        if proc.poll() is None:
            kill_group(proc)
            proc.wait()
    finally:
        with _ACTIVE_LOCK:
            _ACTIVE.discard(proc)


def stop_all() -> None:
    """Kill the process group of every registered child and from now on every new one
    (until :func:`reset`); reap the killed children."""
    with _ACTIVE_LOCK:
        _STOPPING.set()
        procs = list(_ACTIVE)
        for proc in procs:
            kill_group(proc)
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # unkillable (stuck in the kernel): do not hang on it
            pass


def reset() -> None:
    """A new run starts: children may start again."""
    _STOPPING.clear()


def stopping() -> bool:
    """Whether :func:`stop_all` was called (since the last :func:`reset`)."""
    return _STOPPING.is_set()


def run_captured(cmd: list[str], *, cwd: str | os.PathLike | None = None, timeout: float | None = None,
                 text: bool = True, stdout: Any = subprocess.PIPE,
                 stderr: Any = subprocess.PIPE) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True)`` through :func:`spawn`: the child's whole
    process group is killed on any exception (an interruption, the time-out). What it
    prints is kept bounded whatever its size (:func:`kdtr.streams.communicate`: the head and
    tail of each stream).

    Raises:
        OSError: the program cannot be started.
        subprocess.TimeoutExpired: ``timeout`` seconds passed (the group is killed).
    """
    from . import streams

    proc = spawn(cmd, cwd=cwd, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr)
    try:
        out, err = streams.communicate(proc, timeout, text)
    finally:
        release(proc)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
