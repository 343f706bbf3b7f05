"""Running the test binaries: one process per case or one ``--batch`` process per op,
backend, device, kernel and mode; the batch protocol, bounded streams, time-outs, sanitizers,
reruns of what a batch did not finish, and each case's verdict (:func:`kdtr.judge.judge`;
a graph case's: :func:`kdtr.run.graph.judge`, its input file built by
:func:`kdtr.run.graph.build`).

:func:`run_case` and :func:`run_all` never raise for a case's own failure: every outcome
becomes a status (:mod:`kdtr.run.results`). Binary exit codes: docs/binaries.md.
"""

from __future__ import annotations

import os
import queue
import re
import selectors
import signal
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .. import children, fsutil, streams
from ..errors import KdtrError
from ..goldens import KNOWN_FAILURES
from ..judge import Golden, GoldenError, judge
from ..status import FAILING, Status
from . import graph
from .cases import SANITIZER_EXIT, Case, RunConfig, _device_of, binary_of, missing_binary, plan_units, rerun_line
from .results import CaseResult

EXIT_RUNTIME, EXIT_INPUT, EXIT_NOT_SUPPORTED = 1, 2, 3
# Batch mode (docs/binaries.md): after each golden a binary run with --batch prints
# "@kdtr-batch i=<k> rc=<exit code> s=<seconds> msg=<error message>" on stdout.
BATCH_TAG = "@kdtr-batch"
_BATCH_LINE = re.compile(r"@kdtr-batch i=(\d+) rc=(-?\d+) s=([0-9.eE+-]+) msg=(.*)")


_MAX_MESSAGE = 2000  # characters of a batch line's message kept


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _tail(text: str, n: int = 2000) -> str:
    text = text.strip()
    return text if len(text) <= n else "..." + text[-n:]


# The child-process rules (own process group, registered, killed whole on interruption)
# live in kdtr.children, shared with kdtr mutate and regen; these names are kept here.
from ..children import _ACTIVE, _ACTIVE_LOCK, _STOPPING, Terminated, _prctl, install_signal_handlers  # noqa: E402,F401
from ..children import kill_group as _kill_group  # noqa: E402


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
    result record; for a graph case, its input file and plan (:mod:`kdtr.run.graph`)."""

    case: Case
    res: CaseResult
    golden: Golden
    binary: Path
    out_path: Path
    t0: float
    graph: graph.GraphPlan | None = None

    @property
    def input_path(self) -> Path:
        """What the binary reads: the golden, or a graph case's built input file."""
        return self.graph.path if self.graph is not None else self.case.golden


def _new_result(case: Case, cfg: RunConfig) -> CaseResult:
    res = CaseResult(case, Status.ERROR, device=_device_of(case, cfg))
    res.rerun = rerun_line(case, cfg)
    return res


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
        mode = f".{case.mode}" if case.mode else ""
        stem = f"{case.config}.{case.backend}{kernel}"
        out_path = cfg.out_dir / case.op / f"{stem}{mode}.kdtr"
        try:  # no link below out_dir is followed; a previous output (never a link's target) goes
            fsutil.make_dirs(cfg.out_dir, case.op)
            fsutil.remove_stale_output(out_path)
        except OSError as exc:
            res.reason = str(exc) if isinstance(exc, fsutil.UnsafePath) else f"{out_path}: {exc.strerror or exc}"
            return None
        plan = None
        if case.mode == "graph":
            try:
                plan = graph.build(golden, graph.input_path(cfg.out_dir, case.op, stem))
            except fsutil.UnsafePath as exc:
                res.reason = str(exc)
                return None
            except (ValueError, KeyError, KdtrError, OSError) as exc:
                res.reason = f"cannot build the --graph input of {golden.path}: {exc}"
                return None
        res.output_file = str(out_path)
        res.golden = golden
        if plan is not None:
            res.detail = f"graph at {plan.shape_text()}"
        return _Prepared(case, res, golden, binary, out_path, t0, plan)
    return None


def _sanitizer_prefix(case: Case, cfg: RunConfig) -> list[str]:
    if not cfg.sanitizer or case.backend != "cuda":
        return []
    extra = ["--leak-check", "full"] if cfg.sanitizer == "memcheck" else []
    return [cfg.sanitizer_bin, "--tool", cfg.sanitizer, *extra, "--error-exitcode", str(SANITIZER_EXIT)]


def _backend_args(case: Case, cfg: RunConfig) -> list[str]:
    device = _device_of(case, cfg)
    return (["--backend", case.backend] + (["--device", str(device)] if device is not None else [])
            + (["--kernel", case.kernel] if case.kernel else []) + (["--graph"] if case.mode == "graph" else []))


def _single_command(p: _Prepared, cfg: RunConfig) -> list[str]:
    return [*_sanitizer_prefix(p.case, cfg), str(p.binary), "--input", str(p.input_path),
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


def forced_kernel_name(case: Case) -> str | None:
    """The name the output's metadata ``kernel`` must give (:func:`kdtr.judge.kernel_ran`)
    for ``case``: its forced kernel on the cuda backend, ``cpu_<kernel>`` on the cpu backend
    (the CPU core names its builds so: ``cpu_select``, ``cpu_heap``), None when no kernel is
    forced."""
    if not case.kernel:
        return None
    return f"cpu_{case.kernel}" if case.backend == "cpu" else case.kernel


def _conclude(p: _Prepared, cfg: RunConfig, rc: int, last_line: str, stdout: str = "") -> None:
    """The status of case ``p`` from its binary's exit code; on exit 0, its output judged
    (:func:`kdtr.judge.judge`) against the golden's private copy of the vouched bytes."""
    st = _exit_status(p, cfg, rc, last_line, stdout)
    if st is not None:
        p.res.status, p.res.reason = st
        return
    if p.graph is not None:
        v = graph.judge(p.graph, p.golden, p.out_path, kernel=forced_kernel_name(p.case))
    else:
        v = judge(p.golden, p.out_path, kernel=forced_kernel_name(p.case))
    p.res.status, p.res.reason, p.res.outputs = v.status, v.reason, v.results
    if p.case.kernel and "kernel" in v.metadata:
        ran = f"ran {v.metadata['kernel']}"
        if "select_fallbacks" in v.metadata:  # requests the select build handed to the heap build
            ran += f"; select_fallbacks {v.metadata['select_fallbacks']}"
        p.res.detail = f"{p.res.detail}; {ran}" if p.res.detail else ran


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
    # A graph or invariance case is waived only by a key that names its mode
    # (op/config@column#mode, op/config@backend#mode, op/config#mode): an eager waiver
    # must not hide, say, a NOT_INVARIANT unrelated to the known failure.
    mode = f"#{case.mode}" if case.mode else ""
    keys = [f"{case.op}/{case.config}@{case.column}", f"{case.op}/{case.config}@{case.backend}{mode}",
            f"{case.op}/{case.config}{mode}"]
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
        cmd += ["--input", str(p.input_path), "--output", str(p.out_path)]
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

    def invariance(c: Case) -> None:
        from . import invariance as inv  # kdtr run --invariance: its own execution

        try:
            r = inv.run_case(c, cfg)
        except Exception as exc:  # a harness bug must not stop the run
            r = harness_error(c, exc)
        arrived.put(r)

    try:
        for c in cases:
            if c.mode == "invariance":
                pool.submit(invariance, c)
        for cs in plan_units([c for c in cases if c.mode != "invariance"], cfg, jobs):
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
            if r.status in (Status.PASS, Status.NOT_SUPPORTED):
                r.golden = None  # only a failing case's golden is drawn in the report
            if on_done:
                on_done(r)
    except BaseException:  # Ctrl-C, SIGTERM, SIGHUP: drop queued cases, kill the running binaries
        pool.shutdown(wait=False, cancel_futures=True)
        children.stop_all()
        raise
    pool.shutdown(wait=True)
    return [results[c] for c in cases]
