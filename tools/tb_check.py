#!/usr/bin/env python3
"""tree_build goldens through each build kernel of the binary, outputs against the golden.

    python3 tools/tb_check.py [--backend cuda] [--kernel heap --kernel select] GOLDEN...
    python3 tools/tb_check.py --write-bench FILE --batch B --budget N

The first form runs ``build/bin/kdtr_tree_build --kernel K`` on each golden and compares
every output tensor with the golden's ``expected.<name>`` bit for bit; it prints one line
per (golden, kernel) with the number of requests the select build handed to the heap build
(metadata ``select_fallbacks``) and exits 1 on any difference or failed run.  The second
writes bench/bench_tree_build.py's drafter-like inputs (D=16, K=16, budget = N) as a golden
without expected outputs, for profiling.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import kdtr  # noqa: E402
from kdtr import streams  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("goldens", nargs="*", type=Path)
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--kernel", action="append", default=None)
    ap.add_argument("--binary", type=Path, default=ROOT / "build" / "bin" / "kdtr_tree_build")
    ap.add_argument("--write-bench", type=Path)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--budget", type=int, default=1024)
    args = ap.parse_args()
    if args.write_bench:
        from bench_tree_build import synth_inputs

        x = synth_inputs(np.random.default_rng([20240, args.batch, args.budget]), args.batch, args.budget)
        kdtr.save(args.write_bench, {f"input.{k}": v for k, v in x.items()},
                  {"op": "tree_build", "config": f"bench_B{args.batch}_N{args.budget}", "max_budget": args.budget})
        return 0
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        for g in args.goldens:
            gold = kdtr.load(g, mmap=False)  # a private copy, read before any binary runs
            for k in args.kernel or ["heap", "select"]:
                out = Path(tmp) / "out.kdtr"
                r = streams.run([str(args.binary), "--input", str(g), "--output", str(out), "--backend", args.backend,
                                 "--kernel", k])  # output capped, whatever the binary prints
                if r.returncode != 0:
                    print(f"FAIL {g.name} {k}: exit {r.returncode}: {r.stderr.strip()}")
                    bad += 1
                    continue
                got = kdtr.load(out, mmap=False)
                diff = [n for n, v in got.tensors.items()
                        if not np.array_equal(v, gold.tensors[f"expected.{n}"]) or v.dtype != gold.tensors[f"expected.{n}"].dtype]
                fb = got.metadata.get("select_fallbacks", "-")
                print(f"{'FAIL' if diff else 'PASS'} {g.name} {k} ran={got.metadata.get('kernel')} "
                      f"B={len(got.tensors['status'])} select_fallbacks={fb} {'differs: ' + ','.join(diff) if diff else ''}")
                bad += bool(diff)
    print(f"{bad} failures")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
