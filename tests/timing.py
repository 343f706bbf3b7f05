"""Time in tests without verdicts that depend on the machine's speed.

A test on a busy machine (a CI runner at load average 8 on 2 cores) must reach the verdict
it reaches on an idle one. So:

- every wait for something that must happen (a process ending, a file appearing) is
  bounded by :data:`HANG_GUARD`, generous: it only turns a hang into a failure;
- a test that wants a TIMEOUT verdict runs a fake binary that does no work
  (tests/fakes.py: a sh script that copies a precomputed output, milliseconds, not seconds
  of Python start-up) and, where it must hang, blocks forever opening a FIFO that nothing
  ever opens for writing (never a ``sleep N`` that ends by itself); the run's ``--timeout``
  is then :data:`SHORT_TIMEOUT`, thousands of times what the fake needs for the goldens it
  does not block on. Each such test waits out the timeout once (it is marked ``slow``).

``$KDTR_TEST_TIME_SCALE`` (default 1) multiplies both, for a machine slower still.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

SCALE = float(os.environ.get("KDTR_TEST_TIME_SCALE", "1") or 1)
HANG_GUARD = 120.0 * SCALE  # seconds; a hang guard, never a verdict
SHORT_TIMEOUT = 10.0 * SCALE  # seconds; `kdtr run --timeout` with a fake of tests/fakes.py


def wait_for(done: Callable[[], bool], what: str, guard: float = HANG_GUARD) -> None:
    """Poll ``done()`` until it is true; ``pytest.fail`` naming ``what`` after ``guard`` s."""
    deadline = time.monotonic() + guard
    while not done():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not after {guard:g} s")
        time.sleep(0.05)


def gone(pid: int) -> bool:
    """Whether no process ``pid`` exists any more."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def never_fifo(directory: Path) -> Path:
    """A FIFO in ``directory`` that nothing opens for writing: opening it for reading
    blocks forever (until the opener is killed)."""
    path = directory / "never.fifo"
    if not path.exists():
        os.mkfifo(path)
    return path


def release_fifo(path: Path, rounds: int = 100) -> None:
    """Clean-up after a failed test: let whatever still blocks opening ``path`` go on (it
    reads end-of-file), so that no stray process stays blocked on it forever."""
    for _ in range(rounds):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # ENXIO: nobody is opening it for reading (or it is gone)
            return
        os.close(fd)
        time.sleep(0.05)
