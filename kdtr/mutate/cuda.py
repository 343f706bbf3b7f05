"""GPU mutants (``kdtr mutate --backend cuda``, docs/mutation.md "GPU catalogue"): the
mutants of ``mutants/gpu/<kernel>.toml`` (:func:`kdtr.mutate.catalogue.load_gpu_catalogue`)
planted one at a time in a copy of the unmutated CUDA build
(:class:`kdtr.mutate.workspace.CudaWorkspace`) and judged on the cuda backend.

How a GPU mutant is judged (:func:`run_mutant`):

1. Build: a copy of the cached build, the edit, ``make`` of the binaries built from the
   edited file (make's graph). A compile error is STILLBORN; binaries that are the same
   once stripped are IDENTICAL (:meth:`CudaWorkspace.binary_digest`).
2. Cases (:func:`mutant_cases`): for each op whose binary changed, that op's committed
   goldens on the cuda backend under the kernels :func:`kernel_choices` gives (the
   mutant's ``kernel`` where the op's kernel axis has it, else every kernel of the axis,
   the binary's own choice where the op has none), those the calibration kept.
3. Calibration (:func:`calibrate`, on the unmutated build, once per case, before any
   mutant uses it): each case runs twice; PASS twice with the same output bytes: kept;
   NOT_SUPPORTED twice: dropped (mma and wgmma on f32 goldens); anything else, or two
   runs that differ, stops the run (:class:`kdtr.run.UsageError`).
4. The goldens: any kept case failing (MISMATCH, CRASH, TIMEOUT, ERROR) or NOT_SUPPORTED
   kills the mutant (KILLED; BAD_CLAIM if declared equivalent). A kill other than a
   MISMATCH (in 4, 5a or 5b) is first confirmed (:func:`confirm_own_failure`): the case
   runs again on the unmutated build, same device, sanitizer and limit; if that fails too
   the failure is the machine's and the run stops (:class:`kdtr.run.UsageError`).
5. The survivor sweep: the kept cases again, (a) plain, every output byte-compared with
   the first run (a difference: KILLED, "nondeterministic: <case>: <output>[index] ...");
   (b) under each compute-sanitizer tool of :attr:`CudaPlan.sanitizer_tools` in turn
   (default memcheck, racecheck, synccheck), the unmutated build checked clean on the same
   cases first (:func:`ensure_clean`: once per case and tool; an error there stops the
   run): a sanitizer error is KILLED_BY_SANITIZER (detail: tool, case, first error line).
   Otherwise SURVIVED (EQUIVALENT if declared so).

Cases run in ``--batch`` processes, one per op and kernel (a CUDA context per process, not
per golden); a case whose batch crashed, hung or drew a sanitizer report runs again alone
(:mod:`kdtr.run.process`). The verdict cache is not used for GPU mutants.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kdtr import children, fsutil
from kdtr import run as runner
from kdtr.judge import read_output
from kdtr.mutate.catalogue import (
    BAD_CLAIM,
    BUILT,
    EQUIVALENT,
    IDENTICAL,
    KILLED,
    KILLED_BY_SANITIZER,
    NOT_RUN,
    OPS,
    STILLBORN,
    SURVIVED,
    CatalogueError,
    Mutant,
)
from kdtr.mutate.execute import MutantResult
from kdtr.mutate.workspace import Workspace, binary
from kdtr.run import process as rproc
from kdtr.status import FAILING, Status

DEFAULT_SANITIZER_TOOLS = ("memcheck", "racecheck", "synccheck")
# Time limits (seconds): a case's plain limit is max(MIN_TIMEOUT, TIMEOUT_FACTOR x its
# slower calibration run); under a sanitizer max(MIN_SANITIZER_TIMEOUT, TIMEOUT_FACTOR x
# the unmutated build's time under that tool), the unmutated build's own sanitizer run
# bounded by BASE_SANITIZER_TIMEOUT per case.
MIN_TIMEOUT = 30.0
TIMEOUT_FACTOR = 20.0
MIN_SANITIZER_TIMEOUT = 60.0
BASE_SANITIZER_TIMEOUT = 300.0

Group = tuple[str, "str | None"]  # (op, forced kernel or None)


def op_kernels() -> dict[str, tuple[str, ...]]:
    """Each op's kernel axis (``kdtr.ops`` OpSpec.kernels; empty: no choice)."""
    from kdtr.ops import OPS as SPECS

    return {op: tuple(SPECS[op].kernels) for op in OPS}


def kernel_choices(op: str, kernel: str, axes: dict[str, tuple[str, ...]] | None = None) -> tuple[str | None, ...]:
    """The forced kernels under which ``op``'s goldens judge a mutant of target ``kernel``:
    ``(kernel,)`` if the op's kernel axis has it, else every kernel of the axis, else
    ``(None,)`` (the binary's own choice: an op without an axis, e.g. tree_accept)."""
    axis = (axes if axes is not None else op_kernels()).get(op, ())
    if kernel in axis:
        return (kernel,)
    return tuple(axis) or (None,)


@dataclass
class CudaPlan:
    """The cuda cases of a ``kdtr mutate --backend cuda`` run and what calibration learnt.

    ``cases``: per (op, forced kernel), every committed golden's case; ``kept`` (after
    :func:`calibrate`): those that PASS on the unmutated build; ``dropped``: case ->
    the NOT_SUPPORTED reason; ``timeouts``: case -> seconds; ``clean``: (case, tool) ->
    seconds under that sanitizer on the unmutated build (checked clean).
    """

    cases: dict[Group, list[runner.Case]]
    golden_dir: Path
    vouched: dict[Path, Any] = field(default_factory=dict)
    goldens: runner.GoldenStore = field(default_factory=runner.GoldenStore, repr=False, compare=False)
    sanitizer_tools: tuple[str, ...] = DEFAULT_SANITIZER_TOOLS
    sanitizer_bin: str = "compute-sanitizer"
    devices: tuple[int, ...] = (0,)
    kept: dict[Group, list[runner.Case]] = field(default_factory=dict)
    dropped: dict[runner.Case, str] = field(default_factory=dict)
    timeouts: dict[runner.Case, float] = field(default_factory=dict)
    clean: dict[tuple[runner.Case, str], float] = field(default_factory=dict)
    axes: dict[str, tuple[str, ...]] = field(default_factory=op_kernels)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    _clean_lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def groups_of(self, m: Mutant, ops: list[str]) -> list[Group]:
        return [(op, k) for op in ops for k in kernel_choices(op, m.kernel, self.axes) if self.cases.get((op, k))]


def load_goldens(golden_dir: Path, registry: Any = None, axes: dict[str, tuple[str, ...]] | None = None) -> CudaPlan:
    """The committed goldens of every op as cuda cases, one per kernel of the op's axis
    (one without a forced kernel where the op has none), checked against the manifest;
    nothing runs yet (:func:`calibrate`).

    Raises:
        runner.UsageError: no goldens, or a manifest problem.
    """
    axes = axes if axes is not None else op_kernels()
    found = runner.discover(golden_dir, registry=registry)
    vouched: dict[Path, Any] = {}
    found, problems = runner.check_manifest(golden_dir, found, vouched)
    if problems:
        path, why = next(iter(problems.items()))
        raise runner.UsageError(f"golden {path}: {why}")
    cases: dict[Group, list[runner.Case]] = {}
    for op in OPS:
        for k in axes.get(op, ()) or (None,):
            cases[(op, k)] = [runner.Case(o, cfg, path, "cuda", kernel=k) for o, cfg, path in found if o == op]
    return CudaPlan(cases, golden_dir, vouched, axes=axes)


# ---------------------------------------------------------------------------------------
# Running cases
# ---------------------------------------------------------------------------------------

def _config(plan: CudaPlan, bin_dir: Path, out_dir: Path, timeout: float, device: int,
            sanitizer: str = "") -> runner.RunConfig:
    return runner.RunConfig(golden_dir=plan.golden_dir, bin_dir=bin_dir, out_dir=out_dir, timeout=timeout,
                            device=device, batch=True, sanitizer=sanitizer, sanitizer_bin=plan.sanitizer_bin,
                            vouched=plan.vouched, goldens=plan.goldens)


def run_cases(cases: list[runner.Case], plan: CudaPlan, bin_dir: Path, out_dir: Path, *, device: int = 0,
              sanitizer: str = "", timeout: Callable[[runner.Case], float] | None = None,
              stop_on_failure: bool = False) -> list[runner.CaseResult]:
    """Run ``cases`` with the binaries of ``bin_dir`` (outputs under ``out_dir``), one
    ``--batch`` process per (op, kernel) group, in order; results in case order.

    A case whose batch crashed, hung or drew a sanitizer report runs alone (as in
    ``kdtr run``). After a TIMEOUT (a hanging mutant), or with ``stop_on_failure`` after
    any failing or NOT_SUPPORTED case, nothing more starts: the cases not run have no
    result. ``timeout(case)``: its limit (a batch gets the largest of its cases').
    """
    groups: dict[Group, list[runner.Case]] = {}
    for c in cases:
        groups.setdefault((c.op, c.kernel), []).append(c)
    got: dict[runner.Case, runner.CaseResult] = {}
    stopped = False

    def bad(r: runner.CaseResult) -> bool:
        return r.status == Status.TIMEOUT or (stop_on_failure and (r.status in FAILING
                                                                   or r.status == Status.NOT_SUPPORTED))

    for cs in groups.values():
        if stopped:
            break
        limit = max((timeout(c) if timeout else 60.0) for c in cs)
        cfg = _config(plan, bin_dir, out_dir, limit, device, sanitizer)
        out_dir.mkdir(parents=True, exist_ok=True)

        def emit(r: runner.CaseResult) -> None:
            nonlocal stopped
            got[r.case] = r
            stopped = stopped or bad(r)

        def again(c: runner.Case, cfg: runner.RunConfig = cfg) -> None:
            nonlocal stopped
            if stopped:
                return
            if timeout:
                cfg.timeout = timeout(c)
            r = rproc.run_case(c, cfg)
            got[c] = r
            stopped = bad(r)

        rproc._run_unit(cs, cfg, emit, again)
    return [got[c] for c in cases if c in got]


def first_difference(a: Path, b: Path) -> str | None:
    """Where two output files differ: None when their bytes are equal, else the first
    differing element of the first tensor (file order) that differs (``name[i, j]: x vs
    y``), or the first differing byte when either file is not a readable KDTR file."""
    try:
        da, db = Path(a).read_bytes(), Path(b).read_bytes()
    except OSError as exc:
        return f"unreadable output: {exc.strerror or exc}"
    if da == db:
        return None
    try:
        fa, fb = read_output(a), read_output(b)
    except Exception:  # not a KDTR file: the bytes are what can be compared
        fa = fb = None
    if fa is not None and fb is not None:
        try:
            for name in [*fa.tensors, *(n for n in fb.tensors if n not in fa.tensors)]:
                if name not in fa.tensors or name not in fb.tensors:
                    return f"{name}: present in one run only"
                x, y = fa.tensors[name], fb.tensors[name]
                if x.dtype != y.dtype or x.shape != y.shape:
                    return f"{name}: {x.dtype}{list(x.shape)} vs {y.dtype}{list(y.shape)}"
                bx = np.frombuffer(x.tobytes(), dtype=np.uint8).reshape(-1, max(1, x.dtype.itemsize))
                by = np.frombuffer(y.tobytes(), dtype=np.uint8).reshape(-1, max(1, y.dtype.itemsize))
                diff = np.flatnonzero((bx != by).any(axis=1))
                if diff.size:
                    i = int(diff[0])
                    idx = np.unravel_index(i, x.shape) if x.shape else ()
                    where = ", ".join(str(int(k)) for k in idx)
                    vx, vy = x.reshape(-1)[i], y.reshape(-1)[i]
                    return f"{name}[{where}]: {vx!r} vs {vy!r} ({int(diff.size)} elements differ)"
            if fa.metadata != fb.metadata:
                keys = [k for k in {**fa.metadata, **fb.metadata} if fa.metadata.get(k) != fb.metadata.get(k)]
                return f"metadata {keys[0]}: {fa.metadata.get(keys[0])!r} vs {fb.metadata.get(keys[0])!r}"
        finally:
            fa.close()
            fb.close()
    k = next((i for i, (x, y) in enumerate(zip(da, db)) if x != y), min(len(da), len(db)))
    return f"byte {k} differs (sizes {len(da)} and {len(db)})"


# ---------------------------------------------------------------------------------------
# Calibration and the unmutated build's sanitizer check
# ---------------------------------------------------------------------------------------

def _in_parallel(items: list[Any], work: Callable[[Any], Any]) -> dict[Any, Any]:
    """``{item: work(item)}``, each item on a thread of its own (each runs one binary
    process at a time: the groups of a calibration at once). An exception in one (an
    interruption) stops every process and is raised."""
    if len(items) <= 1:
        return {it: work(it) for it in items}
    pool = ThreadPoolExecutor(max_workers=len(items))
    try:
        futures = {it: pool.submit(work, it) for it in items}
        out = {it: f.result() for it, f in futures.items()}
    except BaseException:
        children.stop_all()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return out


def calibrate(plan: CudaPlan, ws: Workspace, groups: list[Group] | None = None) -> None:
    """Run every case of ``groups`` (default: all) not yet calibrated twice on the
    unmutated build: PASS twice with byte-identical outputs: kept (time limit
    max(:data:`MIN_TIMEOUT`, :data:`TIMEOUT_FACTOR` x the slower run)); NOT_SUPPORTED
    twice: dropped.

    Raises:
        runner.UsageError: a case neither (it fails, or the two runs differ in status or
            output bytes: the unmutated kernel is nondeterministic), naming the case.
    """
    wanted = groups if groups is not None else list(plan.cases)
    if all(g in plan.kept for g in wanted):
        return  # done (by this thread or another): no wait for a calibration that runs now
    with plan._lock:
        todo = [g for g in wanted if g not in plan.kept]
        cases = [c for g in todo for c in plan.cases.get(g, [])]
        if not cases:
            for g in todo:
                plan.kept[g] = []
            return
        base_bin = ws.base / "build" / "bin"
        runs = _in_parallel([(g, k) for g in todo for k in (1, 2)], lambda gk: run_cases(
            plan.cases.get(gk[0], []), plan, base_bin, ws.scratch / f"calibration-{gk[1]}", device=plan.devices[0],
            timeout=lambda c: 600.0))
        first = {r.case: r for (g, k), rs in runs.items() if k == 1 for r in rs}
        second = {r.case: r for (g, k), rs in runs.items() if k == 2 for r in rs}
        for c in cases:
            a, b = first.get(c), second.get(c)
            for r in (a, b):
                if r is None or r.status not in (Status.PASS, Status.NOT_SUPPORTED):
                    what = "no result" if r is None else f"{r.status}: {r.reason[:300]}"
                    raise runner.UsageError(f"the unmutated cuda build does not pass {c.id}: {what} "
                                            "(fix that before judging mutants)")
            if a.status != b.status:
                raise runner.UsageError(f"the unmutated cuda build is nondeterministic on {c.id}: {a.status} in one "
                                        f"run, {b.status} in the other")
            if a.status == Status.PASS:
                why = first_difference(Path(a.output_file), Path(b.output_file))
                if why is not None:
                    raise runner.UsageError(f"the unmutated cuda build is nondeterministic on {c.id}: two runs give "
                                            f"different outputs: {why}")
                plan.timeouts[c] = max(MIN_TIMEOUT, TIMEOUT_FACTOR * max(a.seconds, b.seconds))
            else:
                plan.dropped[c] = a.reason
        for g in todo:
            plan.kept[g] = [c for c in plan.cases.get(g, []) if c in plan.timeouts]


def ensure_clean(plan: CudaPlan, ws: Workspace, cases: list[runner.Case], tool: str) -> None:
    """Check, once per case and tool, that the unmutated build is clean under
    compute-sanitizer ``tool`` on ``cases`` (PASS, no sanitizer error).

    Raises:
        runner.UsageError: a case that is not (naming the tool, the case and the report):
            no mutant can be judged by that tool on it.
    """
    if all((c, tool) in plan.clean for c in cases):
        return
    with plan._clean_lock:
        todo = [c for c in cases if (c, tool) not in plan.clean]
        if not todo:
            return
        groups: dict[Group, list[runner.Case]] = {}
        for c in todo:
            groups.setdefault((c.op, c.kernel), []).append(c)
        runs = _in_parallel(list(groups), lambda g: run_cases(
            groups[g], plan, ws.base / "build" / "bin", ws.scratch / f"sanitizer-base-{tool}",
            device=plan.devices[0], sanitizer=tool, timeout=lambda c: BASE_SANITIZER_TIMEOUT, stop_on_failure=True))
        results = [r for g in groups for r in runs[g]]
        for r in results:
            if r.status != Status.PASS:
                raise runner.UsageError(f"the unmutated cuda build is not clean under compute-sanitizer {tool} on "
                                        f"{r.case.id}: {r.status}: {r.reason[:300]} (fix that before judging "
                                        "mutants)")
            plan.clean[(r.case, tool)] = r.seconds
        missing = [c for c in todo if (c, tool) not in plan.clean]
        if missing:
            raise runner.UsageError(f"the unmutated cuda build under compute-sanitizer {tool}: {missing[0].id} "
                                    "has no result")


# ---------------------------------------------------------------------------------------
# One mutant
# ---------------------------------------------------------------------------------------

def _sanitizer_error(r: runner.CaseResult, tool: str) -> str | None:
    """The first error line of a case that compute-sanitizer ``tool`` failed, else None."""
    mark = f"compute-sanitizer {tool} reported errors: "
    if r.status != Status.CRASH or not r.reason.startswith(mark):
        return None
    rest = r.reason[len(mark):]
    first = rest.split("first: ", 1)[1] if "first: " in rest else rest
    return first.strip()


def confirm_own_failure(r: runner.CaseResult, plan: CudaPlan, ws: Workspace, d: Path, *, device: int,
                        sanitizer: str = "", limit: Callable[[runner.Case], float]) -> None:
    """Check that a mutant's failing result ``r`` (not a MISMATCH) is the mutant's own: its
    case runs again alone on the unmutated build, on the same device, under the same
    sanitizer and time limit (outputs under ``d``). A CRASH, TIMEOUT, ERROR or
    NOT_SUPPORTED the unmutated build gives too is the machine's (the GPU out of memory or
    busy, a load that ran past the limit, a sanitizer that does not start), not a kill.
    A MISMATCH is not checked: calibration saw the unmutated build pass that case twice
    with the same bytes (and clean under the sanitizer).

    Raises:
        runner.UsageError: the unmutated build fails the case too (the run must stop: no
            mutant can be judged so).
    """
    if r.status == Status.MISMATCH:
        return
    (base,) = run_cases([r.case], plan, ws.base / "build" / "bin", d / "unmutated-check", device=device,
                        sanitizer=sanitizer, timeout=limit)
    if base.status != Status.PASS:
        under = f" under compute-sanitizer {sanitizer}" if sanitizer else ""
        raise runner.UsageError(f"the unmutated cuda build fails {r.case.id} too{under} (device {device}): "
                                f"{base.status}: {base.reason[:300]}; the mutant's {r.status} is the machine's, "
                                "not the mutant's (no verdict)")


def build_mutant(m: Mutant, ws: Workspace, d: Path) -> tuple[MutantResult | None, list[str]]:
    """Apply ``m`` in the copy ``d`` and rebuild the binaries built from its file.

    Returns (a final result, []) for a mutant that cannot be run (STILLBORN, IDENTICAL),
    else (None, the ops whose binary changed)."""
    t0 = time.monotonic()
    src = d / m.file
    text = m.apply(src.read_text(encoding="utf-8"))
    fsutil.atomic_write(src, text.encode("utf-8"))  # never through a link
    st = src.stat()
    os.utime(src, ns=(st.st_atime_ns, max(st.st_mtime_ns, time.time_ns()) + 2_000_000_000))
    ops = ws.ops_of(m.file)
    if not ops:
        return MutantResult(m, STILLBORN, detail=f"no binary of the {ws.VARIANT} build is built from {m.file}",
                            seconds=time.monotonic() - t0), []
    r = ws.build(d, [binary(op) for op in ops])
    if r.returncode != 0:
        err = next((ln for ln in r.stderr.splitlines() if "error" in ln), r.stderr.strip()[-300:])
        return MutantResult(m, STILLBORN, detail=err.strip()[:300], seconds=time.monotonic() - t0), []
    stale = [op for op in ops if (d / binary(op)).stat().st_mtime_ns <= (ws.base / binary(op)).stat().st_mtime_ns]
    if stale:  # never call a mutant equivalent because make skipped its rebuild
        return MutantResult(m, STILLBORN, detail=f"kdtr_{stale[0]} was not rebuilt after the edit",
                            seconds=time.monotonic() - t0), []
    changed = [op for op in ops if ws.binary_digest(d / binary(op)) != ws.digests[op]]
    if not changed:
        return MutantResult(m, IDENTICAL, detail="rebuilt binaries identical once stripped",
                            seconds=time.monotonic() - t0), []
    return None, changed


def mutant_cases(m: Mutant, changed: list[str], plan: CudaPlan) -> list[runner.Case]:
    """The kept cases that judge ``m`` (whose rebuilt binaries are those of ``changed``)."""
    return [c for g in plan.groups_of(m, changed) for c in plan.kept.get(g, [])]


def _killed(m: Mutant, outcome: str, failed: list[runner.CaseResult], detail: str, t0: float) -> MutantResult:
    if m.equivalent:
        outcome = BAD_CLAIM
    return MutantResult(m, outcome, [r.case.id for r in failed], detail[:300], time.monotonic() - t0)


def run_mutant(m: Mutant, ws: Workspace, plan: CudaPlan, device: int = 0, build_only: bool = False) -> MutantResult:
    """Build ``m`` in a fresh copy of the workspace and judge it (module docstring);
    ``build_only``: only build (STILLBORN, IDENTICAL or BUILT).

    Raises:
        runner.UsageError: the unmutated build fails a case or a sanitizer check the mutant
            needs (from :func:`calibrate` / :func:`ensure_clean`): the run must stop.
    """
    t0 = time.monotonic()
    d = ws.mutant_dir()
    try:
        try:
            final, changed = build_mutant(m, ws, d)
        except CatalogueError as exc:
            return MutantResult(m, STILLBORN, detail=str(exc), seconds=time.monotonic() - t0)
        if final is not None:
            final.seconds = time.monotonic() - t0
            return final
        if build_only:
            return MutantResult(m, BUILT, detail="binaries changed: " + ", ".join(f"kdtr_{op}" for op in changed),
                                seconds=time.monotonic() - t0)
        groups = plan.groups_of(m, changed)
        calibrate(plan, ws, groups)
        cases = mutant_cases(m, changed, plan)
        if not cases:
            return MutantResult(m, EQUIVALENT if m.equivalent else SURVIVED,
                                detail="no golden passes on the unmutated cuda build under these kernels",
                                seconds=time.monotonic() - t0)
        bin_dir = d / "build" / "bin"

        def limit(c: runner.Case) -> float:
            return plan.timeouts.get(c, 60.0)

        first = run_cases(cases, plan, bin_dir, d / "obtained", device=device, timeout=limit)
        failed = [r for r in first if r.status in FAILING or r.status == Status.NOT_SUPPORTED]
        if failed:
            confirm_own_failure(failed[0], plan, ws, d, device=device, limit=limit)
            return _killed(m, KILLED, failed, f"{failed[0].case.id}: {failed[0].status}: {failed[0].reason}", t0)
        # (a) a second plain run, byte-compared with the first
        second = run_cases(cases, plan, bin_dir, d / "obtained-2", device=device, timeout=limit,
                           stop_on_failure=True)
        failed = [r for r in second if r.status in FAILING or r.status == Status.NOT_SUPPORTED]
        if failed:
            confirm_own_failure(failed[0], plan, ws, d, device=device, limit=limit)
            return _killed(m, KILLED, failed[:1], f"second run: {failed[0].case.id}: {failed[0].status}: "
                                                  f"{failed[0].reason}", t0)
        by_case = {r.case: r for r in first}
        for r in second:
            why = first_difference(Path(by_case[r.case].output_file), Path(r.output_file))
            if why is not None:
                return _killed(m, KILLED, [r], f"nondeterministic: {r.case.id}: {why}", t0)
        # (b) compute-sanitizer, tool by tool
        for tool in plan.sanitizer_tools:
            ensure_clean(plan, ws, cases, tool)

            def san_limit(c: runner.Case, tool: str = tool) -> float:
                return max(MIN_SANITIZER_TIMEOUT, TIMEOUT_FACTOR * plan.clean.get((c, tool), 60.0))

            res = run_cases(cases, plan, bin_dir, d / f"sanitizer-{tool}", device=device, sanitizer=tool,
                            timeout=san_limit, stop_on_failure=True)
            bad = [r for r in res if r.status in FAILING or r.status == Status.NOT_SUPPORTED]
            if bad:
                # a sanitizer report too: the tool's own failure to start may use its error exit code
                confirm_own_failure(bad[0], plan, ws, d, device=device, sanitizer=tool, limit=san_limit)
                first_line = _sanitizer_error(bad[0], tool)
                if first_line is not None:
                    return _killed(m, KILLED_BY_SANITIZER, bad[:1], f"{tool}: {bad[0].case.id}: {first_line}", t0)
                return _killed(m, KILLED, bad[:1], f"under compute-sanitizer {tool}: {bad[0].case.id}: "
                                                   f"{bad[0].status}: {bad[0].reason}", t0)
        swept = ", ".join(plan.sanitizer_tools) or "no sanitizer"
        return MutantResult(m, EQUIVALENT if m.equivalent else SURVIVED,
                            detail=m.equivalent or f"{len(cases)} cases passed twice, byte-identical; clean under "
                                                   f"{swept}",
                            seconds=time.monotonic() - t0)
    finally:
        shutil.rmtree(d, ignore_errors=True)


# ---------------------------------------------------------------------------------------
# Every mutant
# ---------------------------------------------------------------------------------------

# Rough compile seconds of each object on one core (tree_build.cu ~20 s, verify_attn.cu ~23 s,
# verify_attn_sm90.cu ~48 s; a binary's main, test_<op>.o, ~20 s: an edit of kdtr_cuda.hpp
# rebuilds all four mains in one make): the mutants that rebuild the slowest objects start
# first, so the run does not end waiting on one late compile.
_OBJECT_COST = {"kernel_verify_attn_sm90.o": 48.0, "kernel_verify_attn.o": 23.0, "kernel_tree_build.o": 20.0}


def _object_cost(name: str) -> float:
    if name in _OBJECT_COST:
        return _OBJECT_COST[name]
    return 20.0 if name.startswith("test_") else 8.0 if name.startswith("kernel_") else 3.0


def build_cost(m: Mutant, ws: Workspace) -> float:
    """An estimate of ``m``'s build time (the objects built from its file), for ordering."""
    cost = 0.0
    for target, deps in ws.graph.items():
        if target.endswith(".o") and "/pic/" not in target and m.file in deps:
            name = target.rsplit("/", 1)[-1]
            cost += _object_cost(name)
    return cost


def _calibrate_unless_expired(plan: CudaPlan, ws: Workspace, groups: list[Group], expired: threading.Event) -> None:
    try:
        calibrate(plan, ws, groups)
    except (runner.Terminated, runner.UsageError, OSError):
        if not expired.is_set():
            raise  # after the budget's stop its failures are the stop's: the mutants say NOT_RUN


def run(mutants: list[Mutant], ws: Workspace, plan: CudaPlan, jobs: int,
        on_done: Callable[[MutantResult], None] | None = None, build_only: bool = False,
        deadline: float | None = None) -> list[MutantResult]:
    """Run (or with ``build_only`` only build) every mutant on ``jobs`` threads, the
    costliest builds first (:func:`build_cost`); results in mutant order. Mutant ``i`` runs
    its cases on ``plan.devices[k % len(devices)]``, ``k`` its place in the start order.

    ``deadline`` (a :func:`time.monotonic` time): then every build and binary still running
    is killed and each mutant not judged by then is NOT_RUN (so a run bounded by the
    device's time limit still writes its report).

    Raises:
        runner.UsageError: the unmutated build failed a case or a sanitizer check.
    """
    order = sorted(range(len(mutants)), key=lambda i: (-build_cost(mutants[i], ws), i))
    expired = threading.Event()
    budget = "the time budget (--time-budget) ran out before it was judged"

    def one(k: int, m: Mutant) -> MutantResult:
        if expired.is_set():
            r = MutantResult(m, NOT_RUN, detail=budget)
        else:
            try:
                r = run_mutant(m, ws, plan, plan.devices[k % len(plan.devices)], build_only)
            except (runner.Terminated, runner.UsageError, OSError):
                if not expired.is_set():
                    raise
                r = MutantResult(m, NOT_RUN, detail=budget)
            if expired.is_set():  # its builds or binaries may have been killed: no verdict
                r = MutantResult(m, NOT_RUN, detail=budget, seconds=r.seconds)
        if on_done:
            on_done(r)
        return r

    def expire() -> None:
        expired.set()  # before any process dies: a result it spoils is seen as NOT_RUN
        children.stop_all()

    children.reset()
    timer = None
    if deadline is not None:
        timer = threading.Timer(max(0.0, deadline - time.monotonic()), expire)
        timer.daemon = True
        timer.start()
    pool = ThreadPoolExecutor(max_workers=max(1, jobs) + (0 if build_only else 1))
    try:
        # The calibration of every case a mutant may need (the ops built from its file) starts
        # at once, beside the first builds: the first mutant built finds it done or running.
        prefetch = None
        if not build_only and mutants:
            groups = list(dict.fromkeys(g for m in mutants for g in plan.groups_of(m, ws.ops_of(m.file))))
            prefetch = pool.submit(_calibrate_unless_expired, plan, ws, groups, expired)
        futures = {i: pool.submit(one, k, mutants[i]) for k, i in enumerate(order)}
        if prefetch is not None:
            prefetch.result()  # an unmutated case failing stops the run now, not after the builds
        ran = {i: futures[i].result() for i in order}
    except BaseException as exc:  # Ctrl-C, SIGTERM, SIGHUP, a failing unmutated build: stop everything
        children.stop_all()
        pool.shutdown(wait=True, cancel_futures=True)
        if isinstance(exc, runner.UsageError):
            children.reset()  # not an interruption: the caller may start processes again
        raise
    finally:
        if timer is not None:
            timer.cancel()
    pool.shutdown(wait=True)
    if expired.is_set():
        children.reset()  # the budget's stop is over: the caller may start processes again
    return [ran[i] for i in range(len(mutants))]


# ---------------------------------------------------------------------------------------
# What the machine has
# ---------------------------------------------------------------------------------------

def cuda_devices() -> tuple[int, ...]:
    """The CUDA devices a binary can open here: ``nvidia-smi -L``'s GPUs, as many as
    $CUDA_VISIBLE_DEVICES lists when it is set; () when there is none (or no nvidia-smi)."""
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    n = sum(1 for ln in out.stdout.splitlines() if ln.startswith("GPU ")) if out.returncode == 0 else 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        n = min(n, len([x for x in visible.split(",") if x.strip()]))
    return tuple(range(n))


def sanitizer_path() -> str | None:
    """compute-sanitizer on PATH, else in $CUDA_HOME/bin or /usr/local/cuda/bin; None if absent."""
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    for d in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if d and os.access(Path(d) / "bin" / "compute-sanitizer", os.X_OK):
            return str(Path(d) / "bin" / "compute-sanitizer")
    return None


def parse_tools(spec: str) -> tuple[str, ...]:
    """``--sanitizer-tools``: a comma-separated list of compute-sanitizer tools
    (:data:`kdtr.run.SANITIZERS`), in the order they run; ``none`` (or empty): no sweep.

    Raises:
        runner.UsageError: an unknown tool, or one given twice.
    """
    if spec.strip() in ("", "none"):
        return ()
    tools = tuple(t.strip() for t in spec.split(","))
    for t in tools:
        if t not in runner.SANITIZERS:
            raise runner.UsageError(f"--sanitizer-tools {spec!r}: unknown tool {t!r} (tools: "
                                    f"{', '.join(runner.SANITIZERS)}, or none)")
    if len(set(tools)) != len(tools):
        raise runner.UsageError(f"--sanitizer-tools {spec!r}: a tool given twice")
    return tools
