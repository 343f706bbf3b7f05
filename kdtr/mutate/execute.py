"""Running mutants: the goldens of the run (:func:`load_goldens`), their time limits from
the unmutated build (:func:`calibrate`), one mutant (:func:`run_mutant`) and all of them
on a thread pool (:func:`run`), with verdicts taken from and stored in a
:class:`kdtr.mutate.cache.VerdictCache`. Each golden is read once per plan
(:attr:`Plan.goldens`, a :class:`kdtr.run.GoldenStore`), whatever the number of mutants."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kdtr import children, fsutil
from kdtr import run as runner
from kdtr.mutate.catalogue import (
    BAD_CLAIM,
    EQUIVALENT,
    IDENTICAL,
    KILLED,
    OPS,
    STILLBORN,
    SURVIVED,
    CatalogueError,
    Mutant,
)
from kdtr.mutate.workspace import Workspace, _digest, _make, binary
from kdtr.status import FAILING, Status


@dataclass
class MutantResult:
    mutant: Mutant
    outcome: str
    killed_by: list[str] = field(default_factory=list)  # case ids (op/config@cpu) that failed
    detail: str = ""  # first failing case's reason, the build error, or the triage
    seconds: float = 0.0
    cached: bool = False  # the verdict came from the verdict cache (seconds: those of the run that made it)
    # the files the mutant's binaries were built from and their sha256 (after the edit);
    # None: not known (no build, or a source outside the workspace): the verdict is not cached
    sources: dict[str, str] | None = field(default=None, compare=False, repr=False)

    def to_json(self) -> dict[str, Any]:
        m = self.mutant
        return {"id": m.id, "kind": m.kind, "op": m.op, "file": m.file, "line": m.line, "bug": m.bug,
                "origin": m.origin, "find": m.find, "replace": m.replace, "equivalent": m.equivalent,
                "outcome": self.outcome, "killed_by": self.killed_by, "detail": self.detail,
                "seconds": round(self.seconds, 2), **({"backend": m.backend, "kernel": m.kernel}
                                                      if m.backend != "cpu" else {})}


@dataclass
class Plan:
    """What to run: the goldens per op and the runner configuration (cpu backend)."""

    cases: dict[str, list[runner.Case]]
    golden_dir: Path
    timeouts: dict[runner.Case, float]
    # each golden's sha256 and size from MANIFEST.json at the start: every mutant is judged
    # against those bytes (runner.RunConfig.vouched), whatever a binary does to the files
    vouched: dict[Path, Any] = field(default_factory=dict)
    calibrated: bool = False  # the unmutated build passed every case and `timeouts` is set
    # each golden read once (kdtr.judge.Golden, held to `vouched`) for the whole mutate run:
    # the calibration and every mutant's cases are judged against that one read
    goldens: runner.GoldenStore = field(default_factory=runner.GoldenStore, repr=False, compare=False)


def _run_cases(cases: list[runner.Case], bin_dir: Path, out_dir: Path, plan: Plan) -> list[runner.CaseResult]:
    results = []
    for c in cases:
        cfg = runner.RunConfig(golden_dir=plan.golden_dir, bin_dir=bin_dir, out_dir=out_dir,
                               timeout=plan.timeouts.get(c, 60.0), vouched=plan.vouched, goldens=plan.goldens)
        out_dir.mkdir(parents=True, exist_ok=True)
        results.append(runner.run_case(c, cfg))
        if results[-1].status == Status.TIMEOUT:
            break  # the mutant hangs: killed; its other goldens would each cost the full time limit
    return results


def mutant_ops(m: Mutant, ws: Workspace, plan: Plan, own_op_only: bool = False) -> list[str]:
    """The ops whose binary ``m`` rebuilds and whose goldens judge it: those built from
    ``m.file`` (only ``m.op`` with ``own_op_only``, the generic pass) that have goldens."""
    return [op for op in ([m.op] if own_op_only else ws.ops_of(m.file)) if plan.cases.get(op)]


def run_mutant(m: Mutant, ws: Workspace, plan: Plan, ops: list[str] | None = None) -> MutantResult:
    """Apply ``m`` to a fresh copy of the workspace, rebuild, run the goldens."""
    t0 = time.monotonic()
    d = ws.mutant_dir()
    try:
        src = d / m.file
        text = m.apply(src.read_text(encoding="utf-8"))
        fsutil.atomic_write(src, text.encode("utf-8"))  # never through a link
        st = src.stat()
        os.utime(src, ns=(st.st_atime_ns, max(st.st_mtime_ns, time.time_ns()) + 2_000_000_000))
        ops = [op for op in (ops or ws.ops_of(m.file)) if plan.cases.get(op)]
        if not ops:  # no golden runs a binary built from this file
            return MutantResult(m, EQUIVALENT if m.equivalent else SURVIVED,
                                detail=f"no golden runs a binary built from {m.file}", seconds=time.monotonic() - t0)
        r = _make(d, [binary(op) for op in ops], ws.cxxflags)
        # what the binaries were built from, the mutant's own .d files included
        sources = ws.source_digests(ws.sources(ws.mutant_graph(d), ops), (m.file, text))
        if r.returncode != 0:
            err = next((ln for ln in r.stderr.splitlines() if "error" in ln), r.stderr.strip()[-300:])
            return MutantResult(m, STILLBORN, detail=err.strip()[:300], seconds=time.monotonic() - t0,
                                sources=sources)
        stale = [op for op in ops if (d / binary(op)).stat().st_mtime_ns <= (ws.base / binary(op)).stat().st_mtime_ns]
        if stale:  # never call a mutant equivalent because make skipped its rebuild
            return MutantResult(m, STILLBORN, detail=f"kdtr_{stale[0]} was not rebuilt after the edit",
                                seconds=time.monotonic() - t0)
        changed = [op for op in ops if _digest(d / binary(op)) != ws.digests[op]]
        if not changed:
            return MutantResult(m, IDENTICAL, detail="rebuilt binaries byte-identical",
                                seconds=time.monotonic() - t0, sources=sources)
        cases = [c for op in changed for c in plan.cases[op]]
        results = _run_cases(cases, d / "build" / "bin", d / "obtained", plan)
        failed = [r for r in results if r.status in FAILING]
        if failed:
            outcome = BAD_CLAIM if m.equivalent else KILLED
            return MutantResult(m, outcome, [r.case.id for r in failed],
                                f"{failed[0].case.id}: {failed[0].status}: {failed[0].reason}"[:300],
                                time.monotonic() - t0, sources=sources)
        return MutantResult(m, EQUIVALENT if m.equivalent else SURVIVED, detail=m.equivalent,
                            seconds=time.monotonic() - t0, sources=sources)
    except CatalogueError as exc:
        return MutantResult(m, STILLBORN, detail=str(exc), seconds=time.monotonic() - t0)
    finally:
        shutil.rmtree(d, ignore_errors=True)


# The CPU core's builds that run only when forced, and under which a mutant is judged too:
# tree_build's select build (a team of one lane) runs on the cpu backend only with
# `--kernel select` (auto is the heap build there), so tree_build's goldens run twice, heap
# and select (case ids ``tree_build/<config>@cpu:select``): a mutant of the select build's
# code meets the goldens instead of surviving unseen.
CPU_FORCED_KERNELS: dict[str, tuple[str, ...]] = {"tree_build": ("select",)}


def load_goldens(golden_dir: Path, registry: Any = None) -> Plan:
    """The committed goldens of every op on the cpu backend, checked against the manifest,
    plus their cases under :data:`CPU_FORCED_KERNELS` (nothing runs yet: see
    :func:`calibrate`).

    Raises:
        runner.UsageError: no goldens, or a manifest problem.
    """
    found = runner.discover(golden_dir, registry=registry)
    vouched: dict[Path, Any] = {}
    found, problems = runner.check_manifest(golden_dir, found, vouched)
    if problems:
        path, why = next(iter(problems.items()))
        raise runner.UsageError(f"golden {path}: {why}")
    cases = runner.plan(found, ["cpu"])
    cases += [runner.Case(op, cfg, path, "cpu", kernel=k) for op, cfg, path in found
              for k in CPU_FORCED_KERNELS.get(op, ())]
    return Plan({op: [c for c in cases if c.op == op] for op in OPS}, golden_dir, {}, vouched)


def calibrate(plan: Plan, ws: Workspace) -> None:
    """Run every case of ``plan`` once on the unmutated build: every case must pass (else
    no mutant can be judged).  Each case's time limit becomes 20x its unmutated time, at
    least 10 s.

    Raises:
        runner.UsageError: a case failing unmutated.
    """
    cases = [c for op in OPS for c in plan.cases.get(op, [])]
    results = _run_cases(cases, ws.base / "build" / "bin", ws.scratch / "base-obtained", plan)
    bad = [r for r in results if r.status != Status.PASS]
    if bad:
        raise runner.UsageError(f"the unmutated cpu build does not pass {bad[0].case.id}: {bad[0].status}: "
                                f"{bad[0].reason[:300]} (fix that before judging mutants)")
    plan.timeouts = {r.case: max(10.0, 20.0 * r.seconds) for r in results}
    plan.calibrated = True


def prepare(root: Path, golden_dir: Path, ws: Workspace, registry: Any = None) -> Plan:
    """:func:`load_goldens` then :func:`calibrate`: the goldens, each run once on the
    unmutated build (all must pass), with their time limits.

    Raises:
        runner.UsageError: no goldens, a manifest problem, or a case failing unmutated.
    """
    plan = load_goldens(golden_dir, registry)
    calibrate(plan, ws)
    return plan


def run(mutants: list[Mutant], ws: Workspace, plan: Plan, jobs: int,
        on_done: Callable[[MutantResult], None] | None = None, own_op_only: bool = False,
        cache: Any = None) -> list[MutantResult]:
    """Run every mutant on ``jobs`` threads; results in mutant order.  With
    ``own_op_only`` (the generic pass), only the binary and goldens of the mutant's own op
    are rebuilt and run.  With ``cache`` (a :class:`kdtr.mutate.cache.VerdictCache`), a
    mutant whose verdict is cached is not built or run (its result has ``cached``), every
    other verdict is stored; the plan is calibrated (:func:`calibrate`) only when some
    mutant must run.

    Raises:
        runner.UsageError: calibration found a case failing on the unmutated build.
    """
    hits: dict[int, MutantResult] = {}
    if cache is not None:
        for i, m in enumerate(mutants):
            r = cache.get(m, ws, plan, mutant_ops(m, ws, plan, own_op_only))
            if r is not None:
                hits[i] = r
    todo = [(i, m) for i, m in enumerate(mutants) if i not in hits]
    if todo and not plan.calibrated:
        calibrate(plan, ws)
    for i in sorted(hits):
        if on_done:
            on_done(hits[i])

    def one(m: Mutant) -> MutantResult:
        ops = mutant_ops(m, ws, plan, own_op_only)
        r = run_mutant(m, ws, plan, [m.op] if own_op_only else None)
        if cache is not None:
            cache.put(r, ws, plan, ops)
        if on_done:
            on_done(r)
        return r

    children.reset()
    pool = ThreadPoolExecutor(max_workers=max(1, jobs))
    try:
        futures = {i: pool.submit(one, m) for i, m in todo}
        ran = {i: f.result() for i, f in futures.items()}
    except BaseException:  # Ctrl-C, SIGTERM, SIGHUP: drop queued mutants, kill builds and binaries
        children.stop_all()
        # The workers end at once (their children are dead, new ones die at birth): wait
        # for them, so none writes into the scratch directory after its removal.
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return [hits[i] if i in hits else ran[i] for i in range(len(mutants))]
