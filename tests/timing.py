"""Time in tests without verdicts that depend on the machine's speed.

A test on a busy machine (a CI runner at load average 8 on 2 cores) must reach the verdict
it reaches on an idle one. So:

- every wait for something that must happen (a process ending, a file appearing) is
  bounded by :data:`HANG_GUARD`, generous: it only turns a hang into a failure;
- a test that wants a TIMEOUT verdict runs a fake binary that does no work (it copies a
  precomputed output: milliseconds, not seconds of Python start-up) and, where it must
  hang, blocks forever opening a FIFO that nothing ever opens for writing (never a
  ``sleep N`` that ends by itself); the run's ``--timeout`` is then :data:`SHORT_TIMEOUT`,
  hundreds of times what the fake needs for the goldens it does not block on.

``$KDTR_TEST_TIME_SCALE`` (default 1) multiplies both, for a machine slower still.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

import kdtr
from kdtr.runner import BATCH_TAG

SCALE = float(os.environ.get("KDTR_TEST_TIME_SCALE", "1") or 1)
HANG_GUARD = 120.0 * SCALE  # seconds; a hang guard, never a verdict
SHORT_TIMEOUT = 10.0 * SCALE  # seconds; `kdtr run --timeout` with a fake made by copy_fake()


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


_COPY_FAKE = r'''#!/bin/sh
# Stand-in for kdtr_{op}: copies the precomputed output of each --input's config from
# {outputs}; blocks forever (opening a FIFO nothing writes to) on the configs in BLOCK.
# Speaks batch mode (docs/binaries.md); only the cpu backend runs (others exit 3).
BLOCK=' {block} '
{log}
backend=''; batch=0; prev=''
for a in "$@"; do
  [ "$prev" = --backend ] && backend=$a
  [ "$a" = --batch ] && batch=1
  prev=$a
done
k=0; rc=0; prev=''; inp=''
for a in "$@"; do
  case "$prev" in
    --input) inp=$a ;;
    --output)
      c=${{inp##*/}}; c=${{c%.kdtr}}
      if [ "$backend" != cpu ]; then
        r=3; msg='no CUDA device'
        echo "kdtr_{op}: $msg" >&2
      else
        case "$BLOCK" in *" $c "*) : < '{fifo}' ;; esac
        r=0; msg=''
        cp '{outputs}'/"$c.kdtr" "$a" || {{ r=1; msg='cp failed'; }}
      fi
      [ $rc = 0 ] && rc=$r
      [ $batch = 1 ] || exit $r
      echo "{tag} i=$k rc=$r s=0.001 msg=$msg"
      k=$((k+1)) ;;
  esac
  prev=$a
done
exit $rc
'''

_LOG = r'''line='['; sep=''
for a in "$@"; do line="$line$sep\"$a\""; sep=', '; done
echo "$line]" >> '{log}'
'''


def copy_fake(bdir: Path, gdir: Path, op: str, block: tuple[str, ...] = (), log: Path | None = None) -> Path:
    """Write ``bdir/kdtr_<op>``: a POSIX sh fake that passes every golden of
    ``gdir/<op>`` on the cpu backend by copying its expected tensors (precomputed here into
    ``bdir/outputs``), blocks forever on the configs in ``block``, and exits 3
    (NOT_SUPPORTED) on other backends. With ``log``, each invocation appends its argv
    there as one JSON list (paths must hold no quote or backslash)."""
    outputs = bdir / "outputs"
    outputs.mkdir(parents=True, exist_ok=True)
    for golden in sorted((gdir / op).glob("*.kdtr")):
        with kdtr.load(golden) as g:
            expected = {k[len("expected."):]: np.array(v) for k, v in g.tensors.items() if k.startswith("expected.")}
        kdtr.save(outputs / golden.name, expected, {"op": op})
    for text in map(str, (outputs, bdir)):
        if "'" in text:
            raise ValueError(f"{text}: a quote in the path")
    fake = bdir / f"kdtr_{op}"
    fake.write_text(_COPY_FAKE.format(op=op, outputs=outputs, block=" ".join(block), fifo=never_fifo(bdir),
                                      tag=BATCH_TAG, log=_LOG.format(log=log) if log else ""))
    fake.chmod(0o755)
    return fake


def read_log(log: Path) -> list[list[str]]:
    """The argv lists a fake logged, one per invocation."""
    return [json.loads(ln) for ln in log.read_text().splitlines()]
