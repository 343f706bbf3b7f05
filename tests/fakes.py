"""Fake op binaries for the runner tests: POSIX sh scripts that start in a millisecond.

:func:`make_fake` writes ``bdir/kdtr_<op>``, a stand-in that speaks the binaries' command
line (docs/binaries.md): ``--input G --output O`` once, or ``--batch`` with several pairs
(one ``@kdtr-batch i=K rc=R s=S msg=M`` line per golden on stdout, in order), then
``--backend cpu|cuda`` and maybe ``--device N``. It does no arithmetic: a passing golden's
output is a copy of that golden's expected tensors, precomputed by :func:`make_fake` (so
the output is what the golden said *when the fake was made*: a test that edits a golden
afterwards gets the original answer, as from a real kernel).

What each golden does is its *mode*, chosen per config name: baked in with ``modes=`` and
overridden at run time by ``$FAKE_MODE`` (``<config>:<mode>,...``, the last entry for a
config wins):

=============  ============================================================================
(none)         copy the expected outputs, exit 0 (PASS)
``wrong``      copy the expected outputs with one element of ``wrong_tensor`` changed
``garbage``    write bytes that are not a kdtr file, exit 0
``exit1``      print ``$FAKE_MSG`` (default ``cudaErrorIllegalAddress at test.cu:10``) on
               stderr, rc 1; on the cuda backend that stops a batch (as a CUDA error does)
``segv``       die of SIGSEGV
``batchsegv``  die of SIGSEGV inside a batch only (alone it passes)
``hang``       block forever opening a FIFO nothing writes to (only a kill ends it)
``batchhang``  hang inside a batch only (alone it passes)
``flood``      write ``$FAKE_FLOOD_BYTES`` (default 1 MiB) of ``x`` without a newline to stderr,
               then pass
=============  ============================================================================

Other run-time switches: ``$FAKE_GPU`` set lets the cuda backend run (else each cuda golden
is rc 3, ``no CUDA device``: NOT_SUPPORTED); ``$FAKE_EXIT_SEGV`` set makes a batch die of
SIGSEGV after its last golden; ``$FAKE_LOG`` (or ``log=``) names a file to which every
invocation appends its argv as one JSON list (:func:`read_log`; paths must hold no quote,
backslash or newline).

``batch=False`` makes a binary without batch mode: it ignores ``--batch``, runs the first
golden only and prints no batch line (the runner then runs each golden alone).
:func:`make_sanitizer` writes a stand-in for ``compute-sanitizer``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

import kdtr
from kdtr.run import BATCH_TAG
from timing import never_fifo

_FAKE = r'''#!/bin/sh
# Stand-in for kdtr_@OP@ written by tests/fakes.py (the modes are described there).
OUTPUTS='@OUTPUTS@'; WRONG='@WRONG@'; FIFO='@FIFO@'; CAN_BATCH=@CAN_BATCH@
MODES="@MODES@,${FAKE_MODE:-}"
LOG=${FAKE_LOG:-'@LOG@'}
if [ -n "$LOG" ]; then
  line='['; sep=''
  for a in "$@"; do line="$line$sep\"$a\""; sep=', '; done
  printf '%s]\n' "$line" >> "$LOG"
fi
backend=''; batch=0; prev=''
for a in "$@"; do
  [ "$prev" = --backend ] && backend=$a
  [ "$a" = --batch ] && batch=1
  prev=$a
done
[ "$CAN_BATCH" = 1 ] || batch=0
mode_of() {  # $1: config; sets m
  m=''; rest="$MODES,"
  while [ -n "$rest" ]; do
    item=${rest%%,*}; rest=${rest#*,}
    [ "${item%%:*}" = "$1" ] && m=${item#*:}
  done
}
one() {  # $1: config, $2: output path; sets r and msg
  r=0; msg=''
  mode_of "$1"
  if [ "$backend" = cuda ] && [ -z "${FAKE_GPU:-}" ]; then r=3; msg='no CUDA device'; return; fi
  src="$OUTPUTS/$1.kdtr"
  case "$m" in
    segv) kill -s SEGV $$ ;;
    batchsegv) [ $batch = 1 ] && kill -s SEGV $$ ;;
    hang) : < "$FIFO" ;;
    batchhang) [ $batch = 1 ] && : < "$FIFO" ;;
    exit1) r=1; msg=${FAKE_MSG:-'cudaErrorIllegalAddress at test.cu:10'}; return ;;
    garbage) printf 'not a kdtr file' > "$2"; return ;;
    wrong) src="$WRONG/$1.kdtr" ;;
    flood) head -c "${FAKE_FLOOD_BYTES:-1048576}" /dev/zero | tr '\0' x >&2 ;;
  esac
  [ -f "$src" ] || { r=1; msg="no precomputed output for $1"; return; }
  cp "$src" "$2" || { r=1; msg='cp failed'; }
}
k=0; rc=0; prev=''; inp=''
for a in "$@"; do
  case "$prev" in
    --input) inp=$a ;;
    --output)
      c=${inp##*/}; c=${c%.kdtr}
      one "$c" "$a"
      [ -n "$msg" ] && printf 'kdtr_@OP@: %s\n' "$msg" >&2
      [ $rc = 0 ] && rc=$r
      [ $batch = 1 ] || exit $r
      printf '%s i=%d rc=%d s=0.001 msg=%s\n' '@TAG@' $k $r "$msg"
      k=$((k+1))
      [ $r = 1 ] && [ "$backend" = cuda ] && break ;;
  esac
  prev=$a
done
[ $batch = 1 ] && [ -n "${FAKE_EXIT_SEGV:-}" ] && kill -s SEGV $$
exit $rc
'''

_SANITIZER = r'''#!/bin/sh
# Stand-in for compute-sanitizer written by tests/fakes.py: runs the binary, then reports
# an error (exit code --error-exitcode) when an --input names a config in $FAKE_SAN_ERR.
while [ $# -gt 0 ]; do
  if [ "$1" = --error-exitcode ]; then code=$2; shift 2; break; fi
  shift
done
"$@"; rc=$?
hit=0; prev=''
for a in "$@"; do
  if [ "$prev" = --input ]; then
    c=${a##*/}; c=${c%.kdtr}
    case ",${FAKE_SAN_ERR:-}," in *",$c,"*) hit=1 ;; esac
  fi
  prev=$a
done
echo "========= COMPUTE-SANITIZER"
if [ $hit = 1 ]; then
  echo "========= Invalid __global__ read of size 4 bytes"
  echo "=========     at tree_accept_kernel+0x90"
  echo "========= ERROR SUMMARY: 1 error"
  exit "$code"
fi
echo "========= ERROR SUMMARY: 0 errors"
exit $rc
'''


def _quotable(text: str) -> str:
    if "'" in text or "\n" in text:
        raise ValueError(f"{text!r}: a quote or newline in a fake's path")
    return text


def _perturbed(expected: dict[str, np.ndarray], wrong_tensor: str | None) -> dict[str, np.ndarray]:
    """``expected`` with one element of ``wrong_tensor`` (default: the first non-empty
    tensor by name) changed: +5 for integers, +1 for floats, flipped for bools."""
    names = [wrong_tensor] if wrong_tensor in expected else [n for n in sorted(expected) if expected[n].size]
    out = dict(expected)
    if not names or not expected[names[0]].size:
        return out
    name = names[0]
    arr = expected[name].copy()
    flat = arr.reshape(-1)
    i = flat.size // 2
    if arr.dtype == np.bool_:
        flat[i] = not flat[i]
    elif np.issubdtype(arr.dtype, np.integer):
        flat[i] = flat[i] + 5
    else:
        flat[i] = flat[i] * 2 + 1 if np.isfinite(np.float32(flat[i])) else 0
    out[name] = arr
    return out


# (sha256 of a golden's bytes, op, wrong_tensor) -> (passing output, wrong output), as
# bytes: the goldens are the same in most tests, and loading and saving them is most of
# the time a fake takes to make (a test's own perturb is not cached)
_OUTPUTS: dict[tuple[str, str, str | None], tuple[bytes, bytes]] = {}


def _outputs_of(golden: Path, op: str, wrong_tensor: str | None, perturb: Callable[[dict], dict] | None,
                ok_path: Path, wrong_path: Path) -> None:
    key = (hashlib.sha256(golden.read_bytes()).hexdigest(), op, wrong_tensor)
    if perturb is not None or key not in _OUTPUTS:
        with kdtr.load(golden) as g:
            expected = {k[len("expected."):]: np.array(v) for k, v in g.tensors.items() if k.startswith("expected.")}
        kdtr.save(ok_path, expected, {"op": op})
        wrong = perturb({k: v.copy() for k, v in expected.items()}) if perturb else _perturbed(expected, wrong_tensor)
        kdtr.save(wrong_path, wrong, {"op": op})
        if perturb is None:
            _OUTPUTS[key] = (ok_path.read_bytes(), wrong_path.read_bytes())
        return
    ok, bad = _OUTPUTS[key]
    ok_path.write_bytes(ok)
    wrong_path.write_bytes(bad)


def make_fake(bdir: Path, gdir: Path, op: str, *, modes: Mapping[str, str] | None = None, batch: bool = True,
              wrong_tensor: str | None = None, perturb: Callable[[dict], dict] | None = None,
              log: Path | None = None) -> Path:
    """Write ``bdir/kdtr_<op>`` (see the module docstring) for the goldens now in ``gdir/<op>``
    and return its path.

    Args:
        modes: config name -> mode baked in (``$FAKE_MODE`` overrides it per config).
        batch: False for a binary without batch mode.
        wrong_tensor: the output tensor mode ``wrong`` changes (default: the first by name).
        perturb: instead, makes mode ``wrong``'s outputs from a golden's expected ones (name
            -> writable array; it returns the dict to write).
        log: a file that gets each invocation's argv (else ``$FAKE_LOG``, if set).

    Raises:
        ValueError: a path holds a quote or a newline, or a mode holds ``,`` or ``:``.
    """
    bdir.mkdir(parents=True, exist_ok=True)
    outputs, wrong = bdir / "outputs", bdir / "wrong"
    outputs.mkdir(exist_ok=True)
    wrong.mkdir(exist_ok=True)
    for golden in sorted((gdir / op).glob("*.kdtr")):
        _outputs_of(golden, op, wrong_tensor, perturb, outputs / golden.name, wrong / golden.name)
    fifo = never_fifo(bdir)
    for c, m in (modes or {}).items():
        if any(ch in c + m for ch in ",:\"'\n"):
            raise ValueError(f"{c}:{m}: a mode or config with , : or a quote")
    text = _FAKE
    for key, value in {
        "@OP@": op, "@OUTPUTS@": _quotable(str(outputs)), "@WRONG@": _quotable(str(wrong)),
        "@FIFO@": _quotable(str(fifo)), "@CAN_BATCH@": "1" if batch else "0",
        "@MODES@": ",".join(f"{c}:{m}" for c, m in (modes or {}).items()),
        "@LOG@": _quotable(str(log)) if log else "", "@TAG@": BATCH_TAG,
    }.items():
        text = text.replace(key, value)
    fake = bdir / f"kdtr_{op}"
    fake.write_text(text)
    fake.chmod(0o755)
    return fake


def make_sanitizer(bdir: Path) -> Path:
    """Write ``bdir/compute-sanitizer``: runs the command after ``--error-exitcode N`` and
    reports one memcheck error (exit N) when an ``--input`` names a config listed in
    ``$FAKE_SAN_ERR`` (comma-separated), else a clean summary and the binary's exit code."""
    bdir.mkdir(parents=True, exist_ok=True)
    path = bdir / "compute-sanitizer"
    path.write_text(_SANITIZER)
    path.chmod(0o755)
    return path


def read_log(log: Path) -> list[list[str]]:
    """The argv lists a fake logged, one per invocation."""
    return [json.loads(ln) for ln in log.read_text().splitlines()]


# --- a run of `kdtr run` over a private golden copy (the fixture runner_env, conftest.py) --


def relist(gdir: Path) -> None:
    """Make ``gdir/MANIFEST.json`` list the goldens now in ``gdir`` (after a test edits them)."""
    from kdtr import goldens

    goldens.write_manifest(gdir, goldens.manifest_of_files(gdir))


def golden_copy(path: Path) -> tuple[dict[str, np.ndarray], dict]:
    """A golden's tensors (writable copies) and metadata, the file closed again."""
    with kdtr.load(path) as g:
        return {k: np.array(v) for k, v in g.tensors.items()}, dict(g.metadata)


def invoke(tmp_path: Path, gdir: Path, bdir: Path, *args: str, mode: str = "", timeout: str = "60", **extra: str):
    """``kdtr run`` (in process, click's CliRunner) on ``gdir`` with the binaries of
    ``bdir``, reports in ``tmp_path/reports``; ``mode`` is ``$FAKE_MODE`` and ``extra`` more
    environment variables for the fake. Returns click's Result."""
    import os

    from click.testing import CliRunner

    from kdtr.cli.main import main

    env = dict(os.environ, FAKE_MODE=mode, **extra)
    return CliRunner().invoke(
        main,
        ["run", "--golden-dir", str(gdir), "--bin-dir", str(bdir), "--report-dir", str(tmp_path / "reports"),
         "--timeout", timeout, *args],
        env=env,
        catch_exceptions=False,
    )


def report_cases(tmp_path: Path) -> dict[str, dict]:
    """The cases of ``tmp_path/reports/conformance.json`` by id."""
    data = json.loads((tmp_path / "reports" / "conformance.json").read_text())
    return {c["id"]: c for c in data["cases"]}
