"""CPU cost of kdtr mutate per mutant: build and golden run measured separately.

    .venv/bin/python tools/mutate_cost.py [--only PATTERN ...] [--cxxflags FLAGS]

Runs the selected catalogue mutants one at a time (no verdict cache, no report) and prints,
per mutant, the CPU seconds of its build (make and the compilers and linker it runs:
``getrusage(RUSAGE_CHILDREN)`` deltas) and of its golden run (the test binaries, plus
kdtr's own judging in this process: ``RUSAGE_SELF``), then the mean and the maximum.  One
mutant at a time, so the children's deltas belong to that mutant alone.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

import kdtr.generators
from kdtr import goldens
from kdtr import mutate as mut
from kdtr.mutate import execute


def _cpu(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", action="append", default=[], metavar="PATTERN")
    ap.add_argument("--cxxflags", default=None)
    args = ap.parse_args()
    root = goldens.repo_root()
    mutants = mut.select(mut.load_catalogue(root), args.only)
    cost: dict[str, list[float]] = {}
    real_make, real_cases = execute._make, execute._run_cases
    current: list[str] = []

    def make(*a, **k):
        c0 = _cpu(resource.RUSAGE_CHILDREN)
        try:
            return real_make(*a, **k)
        finally:
            cost.setdefault(current[0], [0.0, 0.0])[0] += _cpu(resource.RUSAGE_CHILDREN) - c0

    def cases(*a, **k):
        c0, s0 = _cpu(resource.RUSAGE_CHILDREN), _cpu(resource.RUSAGE_SELF)
        try:
            return real_cases(*a, **k)
        finally:
            cost.setdefault(current[0], [0.0, 0.0])[1] += (_cpu(resource.RUSAGE_CHILDREN) - c0
                                                           + _cpu(resource.RUSAGE_SELF) - s0)

    with tempfile.TemporaryDirectory(prefix="kdtr-mutate-cost-") as tmp:
        ws = mut.Workspace(root, Path(tmp), args.cxxflags)
        plan = mut.prepare(root, root / "golden", ws, registry=kdtr.generators.REGISTRY)
        execute._make, execute._run_cases = make, cases
        print(f"{'mutant':48} {'outcome':10} {'build CPU-s':>11} {'goldens CPU-s':>13} {'wall s':>7}")
        rows = []
        for m in mutants:
            current[:] = [m.id]
            t0 = time.monotonic()
            (r,) = mut.run([m], ws, plan, 1)
            b, g = cost.get(m.id, [0.0, 0.0])
            rows.append((b, g, time.monotonic() - t0))
            print(f"{m.id:48} {r.outcome:10} {b:11.2f} {g:13.2f} {rows[-1][2]:7.2f}", flush=True)
    if rows:
        n = len(rows)
        print(f"{n} mutants: build CPU-s mean {sum(r[0] for r in rows) / n:.2f} max {max(r[0] for r in rows):.2f}; "
              f"goldens CPU-s mean {sum(r[1] for r in rows) / n:.2f} max {max(r[1] for r in rows):.2f}; "
              f"wall mean {sum(r[2] for r in rows) / n:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
