"""Run goldens through the test binaries and judge the outputs (docs/harness.md, docs/binaries.md).

A *case* is one golden on one backend. :func:`run_case` never raises for a case's own
failure: every outcome becomes a status.

PASS           every expected output meets its contract
MISMATCH       an output is missing, has another dtype/shape, or breaks its contract
CRASH          the binary died by a signal or exited 1 (runtime failure)
TIMEOUT        the binary ran past the time limit (it is killed)
ERROR          harness or input problem: unreadable golden, missing binary, exit 2,
               unreadable output file
NOT_SUPPORTED  the backend is absent here (binary exit 3: not built with CUDA, no GPU)
WAIVED         listed with a reason in golden/known_failures.json and not passing

Binary exit codes are documented in docs/binaries.md.
"""

from __future__ import annotations

import fcntl
import fnmatch
import os
import queue
import re
import selectors
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from . import children
from . import fsutil
from . import streams
from .compare import TensorResult
from .goldens import (KNOWN_FAILURES, UsageError, check_manifest, discover,  # noqa: F401 - the runner's API
                      load_known_failures, stale_waivers)
from .judge import Golden, GoldenError, judge, output_limit  # noqa: F401 - output_limit: the runner's API
from .status import FAILING, Status
from .vouch import Vouch

BACKENDS = ("cpu", "cuda")
STATUSES = tuple(Status)  # in report order
EXIT_RUNTIME, EXIT_INPUT, EXIT_NOT_SUPPORTED = 1, 2, 3
# Batch mode (docs/binaries.md): after each golden a binary run with --batch prints
# "@kdtr-batch i=<k> rc=<exit code> s=<seconds> msg=<error message>" on stdout.
BATCH_TAG = "@kdtr-batch"
_BATCH_LINE = re.compile(r"@kdtr-batch i=(\d+) rc=(-?\d+) s=([0-9.eE+-]+) msg=(.*)")
# compute-sanitizer tools `kdtr run --sanitizer` accepts; a sanitizer that finds errors
# exits with SANITIZER_EXIT (its --error-exitcode), which no binary uses.
SANITIZERS = ("memcheck", "racecheck", "initcheck", "synccheck")
SANITIZER_EXIT = 99


@dataclass(frozen=True)
class Case:
    """One golden on one backend, under one forced kernel or none."""

    op: str
    config: str
    golden: Path
    backend: str
    # The kernel the cuda binary is forced to run (``--kernel``; kdtr.ops OpSpec.kernels);
    # None: the binary's own choice.
    kernel: str | None = None
    # The CUDA device a cuda case runs on (set by :func:`run_all` when it spreads the cases
    # over the devices; None: RunConfig.device). Not part of the case's identity.
    device: int | None = field(default=None, compare=False)

    @property
    def column(self) -> str:
        """``backend`` or ``backend:kernel``: the case's column in the reports."""
        return f"{self.backend}:{self.kernel}" if self.kernel else self.backend

    @property
    def id(self) -> str:
        """``op/config@backend``, or ``op/config@backend:kernel`` under a forced kernel."""
        return f"{self.op}/{self.config}@{self.column}"


@dataclass
class CaseResult:
    case: Case
    status: Status
    reason: str = ""
    outputs: list[TensorResult] = field(default_factory=list)
    seconds: float = 0.0
    command: list[str] = field(default_factory=list)
    output_file: str = ""
    stderr: str = ""
    rerun: str = ""
    device: int | None = None  # the CUDA device that ran a cuda case; None for cpu
    process: str = ""  # "batch": judged from a batch run of its op; "single": its own process
    # Under a forced kernel: the kernel instance that ran (output metadata ``kernel``) and, for
    # tree_build's select, how many requests it handed to the heap build; "" otherwise.
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.case.id,
            "op": self.case.op,
            "config": self.case.config,
            "backend": self.case.backend,
            "kernel": self.case.kernel,
            "device": self.device,
            "process": self.process,
            "golden": str(self.case.golden),
            "status": self.status,
            "reason": self.reason,
            "detail": self.detail,
            "seconds": round(self.seconds, 4),
            "command": shlex.join(self.command) if self.command else "",
            "rerun": self.rerun,
            "output_file": self.output_file,
            "stderr": self.stderr,
            "outputs": [o.to_json() for o in self.outputs],
        }


@dataclass
class RunConfig:
    golden_dir: Path
    bin_dir: Path
    out_dir: Path
    timeout: float = 60.0
    device: int = 0  # the CUDA device of cuda cases that name none (Case.device)
    # The devices run_all spreads the cuda cases over (empty: just `device`).
    devices: tuple[int, ...] = ()
    # One binary process per op, backend and device for all its goldens (--batch), with
    # one process per golden where a batch crashes, hangs or a sanitizer reports errors.
    batch: bool = True
    # A compute-sanitizer tool (SANITIZERS) that wraps every cuda case; "" for none.
    sanitizer: str = ""
    sanitizer_bin: str = "compute-sanitizer"
    known_failures: dict[str, str] = field(default_factory=dict)
    # Goldens that must not be run, with the reason (not in the manifest, wrong hash,
    # not a regular file): each of their cases is an ERROR naming the file.
    golden_problems: dict[Path, str] = field(default_factory=dict)
    # What each golden's bytes must be: the MANIFEST.json entry that check_manifest read at
    # the start of the run (its ``vouched``). The expected side of every verdict is that
    # content; a golden not here is vouched for by the run's first read of it.
    vouched: dict[Path, Vouch] = field(default_factory=dict)
    # Options a rerun line must repeat (--golden-dir, --bin-dir, --timeout, --tier all, ...;
    # not --device: rerun_line adds the case's own).
    rerun_args: list[str] = field(default_factory=list)
    # Each golden of the run, read once (kdtr.judge.Golden) and shared by all its cases.
    goldens: GoldenStore = field(default_factory=lambda: GoldenStore(), repr=False, compare=False)

    def device_list(self) -> tuple[int, ...]:
        return self.devices or (self.device,)


def _split_pattern(pat: str) -> tuple[str, str | None]:
    """``op[/config][@backend]`` -> (``op/config`` glob, backend or None)."""
    at, depth = -1, 0  # the last "@" outside brackets ("[@]" matches a literal @)
    for i, ch in enumerate(pat):
        depth = 1 if ch == "[" else 0 if ch == "]" else depth
        if ch == "@" and not depth:
            at = i
    case_pat, backend = (pat[:at], pat[at + 1 :]) if at >= 0 else (pat, "")
    if at >= 0 and backend not in BACKENDS:
        raise UsageError(f"--only {pat!r}: unknown backend {backend!r} (backends: {', '.join(BACKENDS)})")
    return (case_pat if "/" in case_pat else f"{case_pat}/*"), (backend or None)


def select(
    goldens: list[tuple[str, str, Path]],
    only: Iterable[str] = (),
    known_ops: Iterable[str] | None = None,
) -> list[tuple[str, str, Path]]:
    """Keep the goldens whose ``op/config`` matches any of the glob patterns in ``only``.

    A pattern without ``/`` matches an op (``tree_accept`` = ``tree_accept/*``); a pattern
    may end in ``@backend`` (the case ids that reports print: ``op/config@cpu``), which
    :func:`select_cases` applies.

    Raises:
        UsageError: a pattern names an unknown op or backend, or matches nothing.
    """
    only = list(only)
    if not only:
        return goldens
    ops = set(known_ops) if known_ops is not None else {g[0] for g in goldens}
    keep: dict[Path, tuple[str, str, Path]] = {}
    for pat in only:
        full, _ = _split_pattern(pat)
        op_pat = full.split("/", 1)[0]
        if not any(fnmatch.fnmatchcase(op, op_pat) for op in ops):
            raise UsageError(f"--only {pat!r}: no op matches {op_pat!r} (ops: {', '.join(sorted(ops))})")
        hits = [g for g in goldens if fnmatch.fnmatchcase(f"{g[0]}/{g[1]}", full)]
        if not hits:
            raise UsageError(f"--only {pat!r} matches no golden")
        for g in hits:
            keep[g[2]] = g
    return sorted(keep.values())


def select_cases(cases: list[Case], only: Iterable[str] = ()) -> list[Case]:
    """Keep the cases that some pattern of ``only`` matches, its ``@backend`` included.

    Raises:
        UsageError: a pattern matches no case among the chosen backends.
    """
    only = list(only)
    if not only:
        return cases
    pats = [(pat, *_split_pattern(pat)) for pat in only]
    for pat, full, backend in pats:
        if not any(fnmatch.fnmatchcase(f"{c.op}/{c.config}", full) and backend in (None, c.backend) for c in cases):
            raise UsageError(f"--only {pat!r} matches no case on the chosen backends")
    return [c for c in cases
            if any(fnmatch.fnmatchcase(f"{c.op}/{c.config}", full) and backend in (None, c.backend)
                   for _, full, backend in pats)]


_MAX_MESSAGE = 2000  # characters of a batch line's message kept


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _tail(text: str, n: int = 2000) -> str:
    text = text.strip()
    return text if len(text) <= n else "..." + text[-n:]


def literal_pattern(text: str) -> str:
    """An ``--only`` pattern matching exactly ``text``: glob characters and ``@`` bracketed
    (``[*]``), characters that cannot be typed (controls; see :mod:`kdtr.text`) as ``?``."""
    out = []
    for ch in text:
        if ch in "*?[]@":
            out.append(f"[{ch}]")
        elif not ch.isprintable():
            out.append("?")
        else:
            out.append(ch)
    return "".join(out)


def rerun_line(case: Case, cfg: RunConfig) -> str:
    """The shell command that reruns ``case`` alone, with the options it needs."""
    pattern = f"{literal_pattern(case.op)}/{literal_pattern(case.config)}"
    device = _device_of(case, cfg)
    dev = ["--device", str(device)] if device is not None and device != 0 else []
    kernel = ["--kernel", f"{case.op}={case.kernel}"] if case.kernel else []
    return shlex.join(["kdtr", "run", "--only", pattern, "--backend", case.backend, *kernel, *cfg.rerun_args, *dev])


def _device_of(case: Case, cfg: RunConfig) -> int | None:
    if case.backend != "cuda":
        return None
    return cfg.device if case.device is None else case.device


# The child-process rules (own process group, registered, killed whole on interruption)
# live in kdtr.children, shared with kdtr mutate and regen; these names are kept here.
from .children import (_ACTIVE, _ACTIVE_LOCK, _STOPPING, Terminated, _prctl,  # noqa: E402,F401
                       install_signal_handlers)
from .children import child_setup as _child_setup  # noqa: E402
from .children import kill_group as _kill_group  # noqa: E402


@dataclass
class _Streamed:
    """What a binary process left: its exit code (None when killed for a timeout), its
    stdout other than batch result lines, and its stderr (each :class:`kdtr.streams.Capped`:
    head and tail kept, whatever the binary printed)."""

    returncode: int | None
    stdout: str
    stderr: str




def _stream_binary(cmd: list[str], timeout: float, on_batch_line: Callable[[str], None] | None = None) -> _Streamed:
    """Run a test binary in its own process group, reading stdout and stderr as they come.

    Each stdout line starting with :data:`BATCH_TAG` goes to ``on_batch_line`` and restarts
    the clock: ``timeout`` bounds the time to the first such line and between two of them
    (for a binary that prints none, the whole run). On timeout the whole group is killed
    (a wrapper script or a sanitizer leaves no orphans) and ``returncode`` is None.

    Memory and time are bounded whatever the binary prints (:mod:`kdtr.streams`): of each
    stream the head and tail are kept, and a stdout line longer than
    :data:`kdtr.streams.MAX_LINE` is never a batch line (it is never buffered whole).
    """
    # own process group, registered, killed at once if the run is being interrupted
    proc = children.spawn(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out_keep, err_keep = streams.Capped(), streams.Capped()
    tag = BATCH_TAG.encode() + b" "
    deadline = time.monotonic() + timeout

    def on_line(line: bytes) -> None:
        nonlocal deadline
        if on_batch_line is not None and line.startswith(tag):
            on_batch_line(line.decode(errors="replace").rstrip("\n"))
            deadline = time.monotonic() + timeout
        else:
            out_keep.add(line)

    lines = streams.Lines(on_line, out_keep.add)
    sel = selectors.DefaultSelector()
    timed_out = False
    try:
        sel.register(proc.stdout, selectors.EVENT_READ)
        sel.register(proc.stderr, selectors.EVENT_READ)
        while sel.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                _kill_group(proc)
                break
            for key, _ in sel.select(timeout=remaining):
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                if key.fileobj is proc.stderr:
                    err_keep.add(chunk)
                else:
                    lines.feed(chunk)
        lines.close()
        if timed_out:
            proc.wait()
        else:
            try:  # both pipes closed: the binary is ending (or handed them to a stray child)
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc)
                proc.wait()
    finally:
        sel.close()
        for pipe in (proc.stdout, proc.stderr):
            pipe.close()
        if proc.returncode is None:  # an exception on the way: leave nothing running
            _kill_group(proc)
            proc.wait()
        with _ACTIVE_LOCK:
            _ACTIVE.discard(proc)
    return _Streamed(None if timed_out else proc.returncode, out_keep.text(), err_keep.text())


@dataclass
class _Prepared:
    """A case ready to run: its golden (read once, vouched for), binary, output path and
    result record."""

    case: Case
    res: CaseResult
    golden: Golden
    binary: Path
    out_path: Path
    t0: float


def _new_result(case: Case, cfg: RunConfig) -> CaseResult:
    res = CaseResult(case, Status.ERROR, device=_device_of(case, cfg))
    res.rerun = rerun_line(case, cfg)
    return res


def default_bin_dir() -> Path:
    """The checkout's ``build/bin`` (what ``make`` builds)."""
    from .goldens import repo_root

    return repo_root() / "build" / "bin"


def binary_of(cfg: RunConfig, op: str) -> Path:
    return cfg.bin_dir / f"kdtr_{op}"


def _is_default_bin_dir(bin_dir: Path) -> bool:
    try:
        return bin_dir.resolve() == default_bin_dir().resolve()
    except OSError:
        return False


def missing_binary(bin_dir: Path, op: str) -> str:
    """Why the cases of ``op`` cannot run when ``bin_dir`` lacks ``kdtr_<op>``, with the
    advice that fits: ``make`` for the checkout's build/bin; for a directory of one's own
    binaries, the directory and the name it lacks."""
    if _is_default_bin_dir(bin_dir):
        return f"binary {bin_dir / f'kdtr_{op}'} not found (run `make`)"
    return f"binary kdtr_{op} not found in {bin_dir} (the binary directory given)"


def missing_binaries(cases: Iterable[Case], bin_dir: Path) -> dict[str, int]:
    """The ops of ``cases`` whose ``kdtr_<op>`` is not in ``bin_dir``, with their case count."""
    ops: dict[str, int] = {}
    for c in cases:
        ops[c.op] = ops.get(c.op, 0) + 1
    return {op: n for op, n in sorted(ops.items()) if not (bin_dir / f"kdtr_{op}").exists()}


def missing_binaries_line(missing: dict[str, int], bin_dir: Path, only_option: str = "--only") -> str:
    """One line for every missing binary of :func:`missing_binaries` (not one per case):
    the directory, the names it lacks, the cases that are ERROR, and what to do."""
    names = ", ".join(f"kdtr_{op}" for op in missing)
    n = sum(missing.values())
    cases = f"{n} case{'s' if n != 1 else ''}"
    if _is_default_bin_dir(bin_dir):
        return f"{bin_dir} has no {names}: {cases} ERROR (run `make`)"
    return (f"{bin_dir} has no {names}: {cases} ERROR (the binary directory given: put "
            f"{'them' if len(missing) > 1 else 'it'} there, or select the ops it has with {only_option})")


class GoldenStore:
    """The goldens of a run, each read once (:meth:`kdtr.judge.Golden.read`: into private
    memory, held to :attr:`RunConfig.vouched`, else to the run's first read) and shared by
    every case of it, whatever its backend or forced kernel. A read that fails is kept too:
    each case of that golden is the same ERROR.

    :meth:`expect` counts the cases of each golden; :meth:`release` (one per finished case)
    drops a golden once its last case is done, so a run holds only the goldens of its
    running and pending cases. A golden whose cases were not counted stays held.
    Thread-safe: one read per golden, however many cases ask at once.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[Path, Golden | GoldenError] = {}
        self._reading: dict[Path, threading.Lock] = {}
        self._first: dict[Path, Vouch] = {}
        self._pending: dict[Path, int] = {}
        self.reads = 0  # files read so far (each golden once)

    def expect(self, cases: Iterable[Case]) -> None:
        with self._lock:
            for c in cases:
                self._pending[c.golden] = self._pending.get(c.golden, 0) + 1

    def release(self, path: Path) -> None:
        with self._lock:
            if path in self._pending:
                self._pending[path] -= 1
                if self._pending[path] <= 0:
                    del self._pending[path]
                    self._held.pop(path, None)

    def get(self, case: Case, cfg: RunConfig) -> Golden:
        """The golden of ``case``, read on its first use.

        Raises:
            kdtr.judge.GoldenError: unreadable, not the vouched bytes, or its metadata
                op/config not those of its place.
        """
        path = case.golden
        with self._lock:
            lock = self._reading.setdefault(path, threading.Lock())
        with lock:
            with self._lock:
                got = self._held.get(path)
            if got is None:
                vouch = cfg.vouched.get(path) or self._first.get(path)
                tier = "cache" if path.parent.parent.name == ".cache" else "committed"
                try:
                    got = Golden.read(path, vouch, op=case.op, config=case.config, tier=tier)
                except GoldenError as exc:
                    got = exc
                with self._lock:
                    self.reads += 1
                    if isinstance(got, Golden) and vouch is None:
                        self._first.setdefault(path, got.vouch)
                    self._held[path] = got
        if isinstance(got, GoldenError):
            raise got
        return got


def _prepare(case: Case, cfg: RunConfig, res: CaseResult) -> _Prepared | None:
    """Check what a case needs before its binary runs; None (and ``res`` holding an
    ERROR) when it cannot run."""
    t0 = time.monotonic()
    if case.golden in cfg.golden_problems:
        res.reason = cfg.golden_problems[case.golden]
        return None
    try:
        golden = cfg.goldens.get(case, cfg)
    except GoldenError as exc:
        res.reason = str(exc)
        return None
    binary = binary_of(cfg, case.op)
    if not binary.exists():
        res.reason = missing_binary(cfg.bin_dir, case.op)
    else:
        kernel = f".{case.kernel}" if case.kernel else ""
        out_path = cfg.out_dir / case.op / f"{case.config}.{case.backend}{kernel}.kdtr"
        try:  # no link below out_dir is followed; a previous output (never a link's target) goes
            fsutil.make_dirs(cfg.out_dir, case.op)
            fsutil.remove_stale_output(out_path)
        except OSError as exc:
            res.reason = str(exc) if isinstance(exc, fsutil.UnsafePath) else f"{out_path}: {exc.strerror or exc}"
            return None
        res.output_file = str(out_path)
        return _Prepared(case, res, golden, binary, out_path, t0)
    return None


def _sanitizer_prefix(case: Case, cfg: RunConfig) -> list[str]:
    if not cfg.sanitizer or case.backend != "cuda":
        return []
    extra = ["--leak-check", "full"] if cfg.sanitizer == "memcheck" else []
    return [cfg.sanitizer_bin, "--tool", cfg.sanitizer, *extra, "--error-exitcode", str(SANITIZER_EXIT)]


def _backend_args(case: Case, cfg: RunConfig) -> list[str]:
    device = _device_of(case, cfg)
    return (["--backend", case.backend] + (["--device", str(device)] if device is not None else [])
            + (["--kernel", case.kernel] if case.kernel else []))


def _single_command(p: _Prepared, cfg: RunConfig) -> list[str]:
    return [*_sanitizer_prefix(p.case, cfg), str(p.binary), "--input", str(p.case.golden),
            "--output", str(p.out_path), *_backend_args(p.case, cfg)]


def _sanitizer_errors(stdout: str) -> str:
    """compute-sanitizer's error count and first report line, from its output."""
    # "========= Invalid __global__ write ...", then its details indented further
    lines = [ln[len("========= "):].rstrip() for ln in stdout.splitlines() if ln.startswith("=========")]
    summary = next((ln for ln in lines if ln.startswith("ERROR SUMMARY")), "")
    first = next((ln for ln in lines if ln.strip() and not ln.startswith((" ", "COMPUTE-SANITIZER", "ERROR SUMMARY"))),
                 "")
    return "; ".join(x for x in (summary, f"first: {first}" if first else "") if x) or "(no report line)"


def _exit_status(p: _Prepared, cfg: RunConfig, rc: int, last_line: str, stdout: str = "") -> tuple[Status, str] | None:
    """The status of a binary's exit code for case ``p``; None when it succeeded (exit 0)
    and its output is to be judged."""
    if rc < 0:
        return Status.CRASH, f"killed by {_signal_name(rc)}"
    if rc == SANITIZER_EXIT and _sanitizer_prefix(p.case, cfg):
        return Status.CRASH, f"compute-sanitizer {cfg.sanitizer} reported errors: {_sanitizer_errors(stdout)}"
    if rc == EXIT_NOT_SUPPORTED:
        if p.case.backend == "cpu":  # the cpu backend always exists (docs/binaries.md)
            return Status.ERROR, f"binary says the cpu backend is not supported (exit 3): {last_line}"
        return Status.NOT_SUPPORTED, last_line
    if rc == EXIT_INPUT:
        return Status.ERROR, f"binary rejected its input (exit 2): {last_line}"
    if rc != 0:
        return Status.CRASH, f"exit {rc}: {last_line}"
    return None


TAMPERED = "golden changed while its case ran"


def _conclude(p: _Prepared, cfg: RunConfig, rc: int, last_line: str, stdout: str = "") -> None:
    """The status of case ``p`` from its binary's exit code; on exit 0, its output judged
    (:func:`kdtr.judge.judge`) against the golden's private copy of the vouched bytes."""
    st = _exit_status(p, cfg, rc, last_line, stdout)
    if st is not None:
        p.res.status, p.res.reason = st
        return
    v = judge(p.golden, p.out_path, kernel=p.case.kernel)
    p.res.status, p.res.reason, p.res.outputs = v.status, v.reason, v.results
    if p.case.kernel and "kernel" in v.metadata:
        p.res.detail = f"ran {v.metadata['kernel']}"
        if "select_fallbacks" in v.metadata:  # requests the select build handed to the heap build
            p.res.detail += f"; select_fallbacks {v.metadata['select_fallbacks']}"


_NO_WRITE = "a test binary must not write to its --input (docs/harness.md)"


def _void_if_changed(p: _Prepared) -> None:
    """After the binary of ``p`` exited: if its golden no longer holds the vouched bytes,
    the case is an ERROR naming the change (whatever its verdict was)."""
    if p.res.status == Status.ERROR and p.res.reason.startswith(TAMPERED):
        return
    why = p.golden.changed()
    if why is None:
        return
    was = f"{p.res.status}" + (f": {p.res.reason}" if p.res.reason else "")
    p.res.status = Status.ERROR
    p.res.reason = f"{TAMPERED} ({why}); {_NO_WRITE}; the verdict it voids: {was}"


def _waive(res: CaseResult, cfg: RunConfig) -> CaseResult:
    case = res.case
    keys = [f"{case.op}/{case.config}@{case.column}", f"{case.op}/{case.config}@{case.backend}",
            f"{case.op}/{case.config}"]
    waiver = next((cfg.known_failures[k] for k in keys if cfg.known_failures.get(k)), None)
    if waiver and res.status in FAILING:
        res.reason = f"waived ({waiver}); was {res.status}: {res.reason}"
        res.status = Status.WAIVED
    elif waiver and res.status == Status.PASS:
        res.reason = f"passes although waived ({waiver}): remove it from {KNOWN_FAILURES}"
    return res


def _run_single(p: _Prepared, cfg: RunConfig) -> None:
    cmd = _single_command(p, cfg)
    p.res.command = cmd
    p.res.process = "single"
    try:
        run = _stream_binary(cmd, cfg.timeout)
    except OSError as exc:
        p.res.status, p.res.reason = Status.ERROR, f"cannot start {cmd[0]}: {exc}"
        return
    p.res.stderr = _tail(run.stderr)
    if run.returncode is None:
        p.res.status, p.res.reason = Status.TIMEOUT, f"killed after {cfg.timeout:g} s"
        _void_if_changed(p)
        return
    last_line = run.stderr.strip().splitlines()[-1] if run.stderr.strip() else "(no message)"
    _conclude(p, cfg, run.returncode, last_line, run.stdout)
    _void_if_changed(p)


def run_case(case: Case, cfg: RunConfig) -> CaseResult:
    """Run one case in a process of its own and return its result; never raises for the
    case's own failures."""
    res = _new_result(case, cfg)
    t0 = time.monotonic()
    p = _prepare(case, cfg, res)
    if p is not None:
        _run_single(p, cfg)
    res.seconds = time.monotonic() - t0
    return _waive(res, cfg)


def _run_batch(prepared: list[_Prepared], cfg: RunConfig) -> tuple[list[CaseResult], list[Case]]:
    """Run the prepared cases of one op, backend and device in one ``--batch`` process.

    Returns the results judged from the batch, and the cases that must run again in a
    process of their own: every case after the one where the batch crashed, hung or
    stopped (and, when the process died after its last result line, all of them); every
    case when a sanitizer reported errors (so each report is attributed to its golden).
    """
    first = prepared[0]
    cmd = [*_sanitizer_prefix(first.case, cfg), str(first.binary), "--batch"]
    for p in prepared:
        cmd += ["--input", str(p.case.golden), "--output", str(p.out_path)]
    cmd += _backend_args(first.case, cfg)
    judged: dict[int, CaseResult] = {}
    expected_rc = [0]
    prog = first.binary.name

    def on_line(line: str) -> None:
        m = _BATCH_LINE.fullmatch(line)
        if m is None:
            return
        k, rc, secs, msg = int(m[1]), int(m[2]), float(m[3]), m[4][:_MAX_MESSAGE]
        if k >= len(prepared) or k in judged:
            return
        p = prepared[k]
        t = time.monotonic()
        p.res.command = _single_command(p, cfg)
        p.res.process = "batch"
        p.res.stderr = f"{prog}: {msg}" if msg else ""
        _conclude(p, cfg, rc, p.res.stderr or "(no message)")
        p.res.seconds = secs + (time.monotonic() - t)
        judged[k] = p.res
        if rc != 0 and expected_rc[0] == 0:
            expected_rc[0] = rc

    try:
        run = _stream_binary(cmd, cfg.timeout, on_line)
    except OSError:
        return [], [p.case for p in prepared]
    complete = len(judged) == len(prepared)
    rerun_all = (
        (run.returncode == SANITIZER_EXIT and bool(_sanitizer_prefix(first.case, cfg)))
        or (complete and run.returncode != expected_rc[0])  # died after its last golden, or a foreign exit
    )
    if rerun_all:
        return [], [p.case for p in prepared]
    # A batch runs its goldens in order: those after the first without a line ran only
    # partly or not at all (crash, hang, a CUDA failure that stopped the batch).
    cut = next((k for k in range(len(prepared)) if k not in judged), len(prepared))
    for k in range(cut):  # the process has exited: no golden may have changed since it started
        _void_if_changed(prepared[k])
    return [r for k, r in judged.items() if k < cut], [p.case for p in prepared[cut:]]


def _run_unit(cases: list[Case], cfg: RunConfig, emit: Callable[[CaseResult], None],
              again: Callable[[Case], None]) -> None:
    """Run the cases of one op, backend and device: those that can run in one batch
    process, each result handed to ``emit``; cases to run alone go to ``again``."""
    prepared: list[_Prepared] = []
    for case in cases:
        res = _new_result(case, cfg)
        p = _prepare(case, cfg, res)
        if p is None:
            res.seconds = 0.0
            emit(_waive(res, cfg))
        else:
            prepared.append(p)
    if len(prepared) == 1:
        again(prepared[0].case)
        return
    if not prepared:
        return
    done, alone = _run_batch(prepared, cfg)
    for r in done:
        emit(_waive(r, cfg))
    for c in alone:
        again(c)


def visible_devices() -> tuple[int, ...]:
    """The CUDA device indices a binary can open here: as many as CUDA_VISIBLE_DEVICES
    lists when it is set, else as many as ``nvidia-smi -L`` lists; (0,) when neither tells
    (then the cuda cases say NOT_SUPPORTED themselves)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        n = len([x for x in visible.split(",") if x.strip()])
        return tuple(range(n)) or (0,)
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return (0,)
    n = sum(1 for ln in out.stdout.splitlines() if ln.startswith("GPU ")) if out.returncode == 0 else 0
    return tuple(range(n)) or (0,)


def parse_devices(spec: str) -> tuple[int, ...]:
    """``--device``: "N", a comma-separated list "0,1" or "all" (:func:`visible_devices`).

    Raises:
        UsageError: not a list of distinct integers >= 0 nor "all".
    """
    if spec.strip() == "all":
        return visible_devices()
    try:
        devices = tuple(int(x) for x in spec.split(","))
    except ValueError as exc:
        raise UsageError(f"--device {spec!r}: expected N, a list such as 0,1, or all") from exc
    if any(d < 0 for d in devices) or len(set(devices)) != len(devices):
        raise UsageError(f"--device {spec!r}: device indices must be distinct integers >= 0")
    return devices


AUTO = "auto"  # in a --kernel list: the case without a forced kernel (the binary's choice)


def parse_kernels(specs: Iterable[str], op_kernels: dict[str, tuple[str, ...]] | None = None,
                  option: str = "--kernel") -> dict[str, tuple[str | None, ...]]:
    """``--kernel OP=K[,K...]`` (repeatable) as {op: kernels}, for :func:`plan`.

    ``K`` is a kernel of the op (``op_kernels``, default ``kdtr.ops`` OpSpec.kernels),
    ``all`` (every one of them) or ``auto`` (the case without a forced kernel, as None).
    An op given twice gets the union, in the order given.

    Raises:
        UsageError: malformed, an unknown op, an op without kernels, or an unknown kernel.
    """
    if op_kernels is None:
        from .ops import OPS

        op_kernels = {name: spec.kernels for name, spec in OPS.items()}
    out: dict[str, list[str | None]] = {}
    for spec in specs:
        op, eq, names = spec.partition("=")
        op = op.strip()
        if not eq or not op or not names.strip():
            raise UsageError(f"{option} {spec!r}: expected OP=KERNEL[,KERNEL...], e.g. verify_attn=mma,wgmma")
        with_kernels = sorted(o for o, ks in op_kernels.items() if ks)
        if op not in op_kernels:
            raise UsageError(f"{option} {spec!r}: unknown op {op!r} (ops with kernels: {', '.join(with_kernels)})")
        known = op_kernels[op]
        if not known:
            raise UsageError(f"{option} {spec!r}: op {op} has no kernel choice (ops with kernels: "
                             f"{', '.join(with_kernels)})")
        chosen = out.setdefault(op, [])
        for k in (x.strip() for x in names.split(",")):
            ks: tuple[str | None, ...]
            if k == "all":
                ks = known
            elif k == AUTO:
                ks = (None,)
            elif k in known:
                ks = (k,)
            else:
                raise UsageError(f"{option} {spec!r}: op {op} has no kernel {k!r} (kernels: "
                                 f"{', '.join(known)}, all, {AUTO})")
            chosen += [x for x in ks if x not in chosen]
    return {op: tuple(ks) for op, ks in out.items()}


def plan(goldens: list[tuple[str, str, Path]], backends: Iterable[str],
         kernels: dict[str, tuple[str | None, ...]] | None = None) -> list[Case]:
    """The cases of ``goldens`` on each of ``backends``, golden by golden.

    ``kernels`` ({op: kernels}, :func:`parse_kernels`): the cuda cases of such an op are one
    per kernel listed (None: the case without a forced kernel); the cpu backend has no kernel
    choice and keeps one case per golden.
    """
    kernels = kernels or {}
    out = []
    for op, cfg, path in goldens:
        for b in backends:
            for k in (kernels.get(op, (None,)) if b == "cuda" else (None,)):
                out.append(Case(op, cfg, path, b, kernel=k))
    return out


def shard(cases: list[Case], spec: str | None) -> list[Case]:
    """Keep shard ``i/n`` (1-based) of ``cases``, dealt out golden by golden: every
    backend of a golden lands in the same shard, so each shard of a CPU-only runner still
    tests its goldens on the cpu backend.

    Raises:
        UsageError: malformed spec.
    """
    if not spec:
        return cases
    try:
        i, n = (int(x) for x in spec.split("/"))
    except ValueError as exc:
        raise UsageError(f"--shard {spec!r}: expected i/n, e.g. 1/4") from exc
    if not 1 <= i <= n:
        raise UsageError(f"--shard {spec!r}: need 1 <= i <= n")
    order: dict[tuple[str, str, Path], int] = {}
    for c in cases:
        order.setdefault((c.op, c.config, c.golden), len(order))
    return [c for c in cases if order[(c.op, c.config, c.golden)] % n == i - 1]


def _golden_bytes(case: Case) -> int:
    try:
        return os.stat(case.golden).st_size
    except OSError:
        return 0


def _balanced(cases: list[Case], k: int) -> list[list[Case]]:
    """``cases`` dealt into ``k`` groups of about equal golden bytes (largest first, each
    to the lightest group), each group in the order of ``cases``."""
    groups: list[list[Case]] = [[] for _ in range(k)]
    load = [0] * k
    for c in sorted(cases, key=_golden_bytes, reverse=True):
        j = load.index(min(load))
        groups[j].append(c)
        load[j] += _golden_bytes(c)
    order = {c: i for i, c in enumerate(cases)}
    return [sorted(g, key=order.__getitem__) for g in groups if g]


def _place_on_devices(cases: list[Case], devices: tuple[int, ...], batch: bool) -> dict[Case, int]:
    """The device of each cuda case that names none.

    In batch mode over several devices, whole ops go to devices (heaviest op first, each
    to the device with the fewest golden bytes) when that balances within 25% of an even
    split: each GPU then creates a context for fewer ops, and the process count stays one
    per op. Otherwise (one op outweighs the rest, or too few ops) the cases are dealt out
    in turn, golden by golden.
    """
    cuda = [c for c in cases if c.backend == "cuda" and c.device is None]
    if batch and len(devices) > 1 and cuda:
        by_op: dict[str, list[Case]] = {}
        for c in cuda:
            by_op.setdefault(c.op, []).append(c)
        weight = {op: sum(map(_golden_bytes, cs)) for op, cs in by_op.items()}
        load = dict.fromkeys(devices, 0)
        chosen: dict[str, int] = {}
        for op in sorted(by_op, key=lambda o: (-weight[o], o)):
            d = min(devices, key=lambda d: (load[d], d))
            chosen[op] = d
            load[d] += weight[op]
        even = sum(weight.values()) / len(devices)
        if len(by_op) >= len(devices) and max(load.values()) <= 1.25 * even:
            return {c: chosen[c.op] for c in cuda}
    return {c: devices[k % len(devices)] for k, c in enumerate(cuda)}


def plan_units(cases: list[Case], cfg: RunConfig, jobs: int = 1) -> list[list[Case]]:
    """Group ``cases`` into the units run_all starts, the heaviest (golden bytes) first.

    With ``cfg.batch``: one unit per op and device for the cuda cases (placed on the
    devices of ``cfg.device_list()`` by :func:`_place_on_devices`), so each process pays
    the CUDA context once; the
    cpu cases of an op split into up to ``jobs`` units of about equal golden bytes, since a
    CPU process costs milliseconds and the cores are better kept busy. Without it, one
    unit per case. Every cuda case comes out with its ``device`` set.
    """
    placed = _place_on_devices(cases, cfg.device_list(), cfg.batch)
    units: dict[tuple[str, str, int | None, str | None], list[Case]] = {}
    for i, c in enumerate(cases):
        device = None
        if c.backend == "cuda":
            device = c.device if c.device is not None else placed[c]
            c = replace(c, device=device)
        key = (c.op, c.backend, device, c.kernel) if cfg.batch else (str(i), c.backend, device, c.kernel)
        units.setdefault(key, []).append(c)
    out: list[list[Case]] = []
    for (_, backend, _, _), cs in units.items():
        if cfg.batch and backend == "cpu" and jobs > 1 and len(cs) > 1:
            out += _balanced(cs, min(jobs, len(cs)))
        else:
            out.append(cs)
    return sorted(out, key=lambda u: -sum(map(_golden_bytes, u)))


def run_all(
    cases: list[Case], cfg: RunConfig, jobs: int, on_done: Callable[[CaseResult], None] | None = None
) -> list[CaseResult]:
    """Run ``cases`` and return their results in case order.

    With ``cfg.batch`` (the default) each op, backend and device runs as one binary process
    over all its goldens (:func:`plan_units`); a case whose batch crashed, hung or drew a
    sanitizer report runs again in a process of its own, which is what its result says.
    At most ``jobs`` processes run at once; ``on_done`` is called in this thread as each
    result arrives.
    """
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    children.reset()
    cfg.goldens.expect(cases)
    results: dict[Case, CaseResult] = {}
    arrived: queue.Queue[CaseResult] = queue.Queue()
    pool = ThreadPoolExecutor(max_workers=max(1, jobs))

    def harness_error(c: Case, exc: BaseException) -> CaseResult:
        return CaseResult(c, Status.ERROR, f"harness error: {type(exc).__name__}: {exc}",
                          rerun=rerun_line(c, cfg), device=_device_of(c, cfg))

    def alone(c: Case) -> None:
        try:
            r = run_case(c, cfg)
        except Exception as exc:  # a harness bug must not stop the run
            r = harness_error(c, exc)
        arrived.put(r)

    def unit(cs: list[Case]) -> None:
        handled: set[Case] = set()

        def emit(r: CaseResult) -> None:
            handled.add(r.case)
            arrived.put(r)

        def again(c: Case) -> None:
            handled.add(c)
            pool.submit(alone, c)

        try:
            _run_unit(cs, cfg, emit, again)
            lost: Exception | None = RuntimeError("the batch left this case without a result")
        except Exception as exc:  # a harness bug must not stop the run
            lost = exc
        for c in cs:  # every case gets a result, or the run would wait for it forever
            if c not in handled:
                arrived.put(harness_error(c, lost))

    try:
        for cs in plan_units(cases, cfg, jobs):
            if len(cs) > 1:
                pool.submit(unit, cs)
            else:
                pool.submit(alone, cs[0])
        while len(results) < len(cases):
            try:
                r = arrived.get(timeout=0.2)
            except queue.Empty:
                continue
            if r.case in results:
                continue
            results[r.case] = r
            cfg.goldens.release(r.case.golden)
            if on_done:
                on_done(r)
    except BaseException:  # Ctrl-C, SIGTERM, SIGHUP: drop queued cases, kill the running binaries
        pool.shutdown(wait=False, cancel_futures=True)
        children.stop_all()
        raise
    pool.shutdown(wait=True)
    return [results[c] for c in cases]


REPORT_LOCK = ".kdtr-run.lock"


class ReportDirLock:
    """Exclusive use of a report directory for one ``kdtr run`` (an advisory ``flock`` on
    ``<report_dir>/.kdtr-run.lock``, released when the process ends, however it ends).

    Two runs sharing a report directory would overwrite each other's obtained outputs and
    judge each other's files; the second one is refused at once instead. The lock file is
    opened without following a link (:func:`kdtr.fsutil.open_lock`) and gets this run's
    pid only once it is known to be a regular file of kdtr's: a link, a FIFO, a directory,
    a file with other hard links or more than a pid's bytes is refused, untouched.

    Raises (on enter):
        UsageError: the directory cannot be created or written, the lock file is not one
            kdtr made (the message names it), or another run holds it.
    """

    def __init__(self, report_dir: Path) -> None:
        self.report_dir = report_dir
        self._fd: int | None = None

    def __enter__(self) -> ReportDirLock:
        path = self.report_dir / REPORT_LOCK
        try:
            self.report_dir.mkdir(parents=True, exist_ok=True)
            fd = fsutil.open_lock(path)
        except fsutil.UnsafePath as exc:
            raise UsageError(str(exc)) from None
        except OSError as exc:
            raise UsageError(f"report directory {self.report_dir}: not writable ({exc.strerror or exc})") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            try:
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            finally:
                os.close(fd)
            raise UsageError(
                f"report directory {self.report_dir} is in use by another kdtr run (pid {holder}); "
                "wait for it or give this run its own --report-dir"
            ) from exc
        try:
            fsutil.write_pid(fd)
        except OSError as exc:
            os.close(fd)
            raise UsageError(f"{path}: cannot write ({exc.strerror or exc})") from exc
        if not os.access(self.report_dir, os.W_OK):
            os.close(fd)
            raise UsageError(f"report directory {self.report_dir}: not writable")
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None


def exit_code(results: list[CaseResult]) -> int:
    """0 if nothing failed (PASS, NOT_SUPPORTED, WAIVED only), else 1."""
    return 1 if any(r.status in FAILING for r in results) else 0


def default_jobs() -> int:
    return max(1, min(8, os.cpu_count() or 1))
