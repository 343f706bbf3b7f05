#!/usr/bin/env python3
"""compare() against a plain byte comparison, and its share of `kdtr run --backend cpu`.

The target: "comparing identical outputs costs about a byte comparison".

1. Identical tensors (default 4,194,304 elements of u8, i32, f32 and bf16, under the
   contract a golden of that dtype carries: exact for integers, allclose atol=1e-5 nan=fail
   for floats, which also needs a NaN scan): ``compare()`` beside ``np.array_equal`` of the
   uint8 views and ``bytes == bytes`` (CPython's memcmp, the bytes made before timing), in
   the same run; and the element-wise comparison (``kdtr.compare._compare_elements``) where
   the imported kdtr has it.
2. Tensors that differ: a few mismatching elements, and an allclose output that passes with
   every element 1 ULP off (what a GPU output within tolerance looks like).
3. Every expected output of the committed goldens compared with a copy of itself (the
   comparison work of a run whose outputs all match, without binaries, I/O or threads).
4. ``kdtr run --backend cpu`` on the committed goldens: the wall time of the command (a
   fresh interpreter, start-up included) and, in this process, the run's wall time and the
   time spent inside ``compare()`` (summed over the worker threads).

Whichever kdtr is importable is measured: to time an older version, put its
tree first, e.g. ``git archive <commit> kdtr runners generators | tar -x -C /tmp/old`` and
``PYTHONPATH=/tmp/old python3 bench/bench_compare.py ...``; the output names the source.

Usage: python3 bench/bench_compare.py [--n 4194304] [--repeat 15] [--runs 5]
       [--bin-dir build/bin] [--golden-dir golden] [--skip-run | --run-only] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import ml_dtypes
import numpy as np

import kdtr
import kdtr.compare as kc
from kdtr.compare import compare
from kdtr.contract import EXACT, Contract

ROOT = Path(__file__).resolve().parent.parent
GOLDEN_FLOAT = Contract("allclose", atol=1e-5, rtol=0.0, nan="fail")  # as verify_attn's goldens
DTYPES = [("u8", np.dtype(np.uint8)), ("i32", np.dtype(np.int32)), ("f32", np.dtype(np.float32)),
          ("bf16", np.dtype(ml_dtypes.bfloat16))]


def median_ms(fn, repeat: int) -> float:
    fn()  # warm
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def tensor(dt: np.dtype, n: int, rng: np.random.Generator) -> np.ndarray:
    if dt.kind in "iu":
        return rng.integers(0, 2 if dt.itemsize == 1 else 1 << 20, n).astype(dt)  # u8: a 0/1 mask, as visibility
    return rng.standard_normal(n).astype(dt)


def contract_for(dt: np.dtype) -> Contract:
    return EXACT if dt.kind in "iu" else GOLDEN_FLOAT


def identical_table(n: int, repeat: int) -> list[str]:
    rng = np.random.default_rng(0)
    elementwise = getattr(kc, "_compare_elements", None)
    rows = ["| dtype | MB | contract | compare() ms | element-wise ms | np.array_equal(u8) ms | bytes == bytes ms | compare / array_equal | compare / memcmp |",
            "| :--- | ---: | :--- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, dt in DTYPES:
        e = tensor(dt, n, rng)
        a = e.copy()
        c = contract_for(dt)
        assert compare("t", e, a, c).ok
        eb, ab = e.view(np.uint8), a.view(np.uint8)
        be, ba = e.tobytes(), a.tobytes()
        t_cmp = median_ms(lambda e=e, a=a, c=c: compare("t", e, a, c), repeat)
        t_elem = (median_ms(lambda e=e, a=a, c=c: elementwise("t", e, a, c), max(3, repeat // 5))
                  if elementwise else None)
        t_ae = median_ms(lambda eb=eb, ab=ab: np.array_equal(eb, ab), repeat)
        t_mc = median_ms(lambda be=be, ba=ba: be == ba, repeat)
        rows.append(f"| {name} | {e.nbytes / 1e6:.1f} | {c.describe()} | {t_cmp:.2f} | "
                    f"{f'{t_elem:.1f}' if t_elem is not None else 'n/a'} | {t_ae:.2f} | {t_mc:.2f} | {t_cmp / t_ae:.2f}x | {t_cmp / t_mc:.2f}x |")
    return rows


def differing_table(n: int, repeat: int) -> list[str]:
    rng = np.random.default_rng(1)
    rows = ["| case | dtype | contract | verdict | compare() ms |", "| :--- | :--- | :--- | :--- | ---: |"]
    for name, dt in DTYPES:
        e = tensor(dt, n, rng)
        few = e.copy()
        k = rng.choice(n, 100, replace=False)
        if dt.kind in "iu":
            few[k] ^= 1
        else:
            few[k] = few[k] + dt.type(1.0)  # far outside atol
        c = contract_for(dt)
        r = compare("t", e, few, c)
        rows.append(f"| 100 mismatching elements | {name} | {c.describe()} | {r.n_mismatch} mismatch | "
                    f"{median_ms(lambda e=e, few=few, c=c: compare('t', e, few, c), max(3, repeat // 3)):.1f} |")
        if dt.kind == "f" or dt.itemsize == 2:
            ulp = e.copy()
            raw = ulp.view({2: np.uint16, 4: np.uint32}[dt.itemsize])
            raw += 1  # every element 1 ULP off (away from zero): passes a loose enough contract
            loose = Contract("allclose", atol=1e-5, rtol=1e-2, nan="fail")
            r = compare("t", e, ulp, loose)
            rows.append(f"| every element 1 ULP off | {name} | {loose.describe()} | {'pass' if r.ok else 'MISMATCH'} | "
                        f"{median_ms(lambda e=e, ulp=ulp, loose=loose: compare('t', e, ulp, loose), max(3, repeat // 3)):.1f} |")
    return rows


def goldens_table(golden_dir: Path, repeat: int) -> list[str]:
    """compare() of every expected output of the committed goldens against an in-memory
    copy of itself, under its contract, one thread: the comparison work of a run whose
    outputs all equal their goldens, without the binaries, the file I/O and the threads."""
    from kdtr.contract import Contract as C

    items = []
    for path in sorted(golden_dir.glob("*/*.kdtr")):
        g = kdtr.load(path)
        for key, v in g.tensors.items():
            if key.startswith("expected."):
                name = key[len("expected."):]
                items.append((name, v, np.array(v), C.from_metadata(g.metadata, name)))
    nbytes = sum(v.nbytes for _, v, _, _ in items)

    def all_compare(fn):
        for name, e, a, c in items:
            assert fn(name, e, a, c).ok

    elementwise = getattr(kc, "_compare_elements", None)
    t_cmp = median_ms(lambda: all_compare(compare), repeat)
    t_elem = median_ms(lambda: all_compare(elementwise), max(3, repeat // 5)) if elementwise else None
    t_ae = median_ms(lambda: [np.array_equal(e.reshape(-1).view(np.uint8), a.reshape(-1).view(np.uint8)) for _, e, a, _ in items], repeat)
    return [
        "| outputs | MB | compare() ms | element-wise ms | np.array_equal(u8) ms, all |",
        "| ---: | ---: | ---: | ---: | ---: |",
        f"| {len(items)} | {nbytes / 1e6:.1f} | {t_cmp:.1f} | {f'{t_elem:.1f}' if t_elem is not None else 'n/a'} | {t_ae:.1f} |",
    ]


def run_args(golden_dir: Path, bin_dir: Path, report_dir: str) -> list[str]:
    return ["run", "--backend", "cpu", "--golden-dir", str(golden_dir), "--bin-dir", str(bin_dir), "--report-dir", report_dir]


def run_table(golden_dir: Path, bin_dir: Path, runs: int) -> list[str]:
    import kdtr.cli.main as cli
    import kdtr.run as kr

    walls_cmd, walls_in, cmp_s, n_cmp, statuses, used = [], [], [], [], "", ""
    for _ in range(runs):  # the command, as a user runs it
        with tempfile.TemporaryDirectory() as rep:
            t0 = time.perf_counter()
            # (cwd: not the checkout, whose kdtr would shadow a PYTHONPATH one: -c puts cwd first)
            p = subprocess.run([sys.executable, "-c", "from kdtr.cli.main import entry; entry()", *run_args(golden_dir, bin_dir, rep)],
                               capture_output=True, text=True, cwd=rep)
            walls_cmd.append(time.perf_counter() - t0)
            statuses = p.stdout.strip().splitlines()[-2] if p.stdout.strip() else p.stderr[-300:]
            used = subprocess.run([sys.executable, "-c", "import kdtr, pathlib; print(pathlib.Path(kdtr.__file__).parent)"],
                                  capture_output=True, text=True, cwd=rep).stdout.strip()
            if p.returncode != 0:
                raise SystemExit(f"kdtr run failed (exit {p.returncode}): {p.stdout[-2000:]}{p.stderr[-2000:]}")
    real = kr.compare
    lock = threading.Lock()
    for _ in range(runs):  # in this process, compare() timed
        spent = [0.0, 0]

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return real(*args, **kwargs)
            finally:
                with lock:  # timed replaces kr.compare only while this iteration runs
                    spent[0] += time.perf_counter() - t0  # noqa: B023
                    spent[1] += 1  # noqa: B023

        kr.compare = timed
        try:
            with tempfile.TemporaryDirectory() as rep:
                t0 = time.perf_counter()
                sink = io.StringIO()
                try:
                    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                        cli.main.main(args=run_args(golden_dir, bin_dir, rep), standalone_mode=False, prog_name="kdtr")
                except SystemExit as exc:
                    if exc.code not in (0, None):
                        raise SystemExit(f"kdtr run (in process) exited {exc.code}: {sink.getvalue()[-2000:]}") from exc
                walls_in.append(time.perf_counter() - t0)
        finally:
            kr.compare = real
        cmp_s.append(spent[0])
        n_cmp.append(spent[1])
    wi, cs = statistics.median(walls_in), statistics.median(cmp_s)
    return [
        "| measure | median | runs |",
        "| :--- | ---: | :--- |",
        f"| `kdtr run --backend cpu` wall (new interpreter, start-up included) | {statistics.median(walls_cmd):.2f} s | "
        + ", ".join(f"{w:.2f}" for w in walls_cmd) + " |",
        f"| the same run in this process (after imports), wall | {wi:.2f} s | " + ", ".join(f"{w:.2f}" for w in walls_in) + " |",
        f"| time inside compare() ({n_cmp[0]} calls, summed over worker threads) | {cs * 1e3:.0f} ms ({100 * cs / wi:.0f}% of the in-process wall) | "
        + ", ".join(f"{c * 1e3:.0f}" for c in cmp_s) + " |",
        "",
        f"Run result: {statuses}; the command imported kdtr from `{used}`",
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=4_194_304, help="elements per tensor")
    ap.add_argument("--repeat", type=int, default=15, help="timings per figure (median)")
    ap.add_argument("--runs", type=int, default=5, help="kdtr run repetitions")
    ap.add_argument("--golden-dir", type=Path, default=ROOT / "golden")
    ap.add_argument("--bin-dir", type=Path, default=ROOT / "build" / "bin")
    ap.add_argument("--skip-run", action="store_true", help="leave out kdtr run")
    ap.add_argument("--run-only", action="store_true", help="only kdtr run")
    ap.add_argument("--out", type=Path, help="also write the tables here (markdown)")
    args = ap.parse_args()

    head = [
        f"kdtr from `{Path(kdtr.__file__).resolve().parent}`"
        + ("" if hasattr(kc, "_compare_elements") else " (no identical-bytes fast path)"),
        f"Python {platform.python_version()}, numpy {np.__version__}, ml_dtypes {ml_dtypes.__version__}, "
        f"{os.cpu_count()} CPUs; n = {args.n:,} elements; median of {args.repeat} (element-wise and differing: fewer)",
    ]
    lines = [] if args.run_only else [
        "",
        "Identical tensors:",
        "",
        *identical_table(args.n, args.repeat),
        "",
        "Tensors that differ:",
        "",
        *differing_table(args.n, args.repeat),
    ]
    if not args.run_only:
        lines += ["", f"Every expected output of the goldens in {args.golden_dir} against a copy of itself:", "",
                  *goldens_table(args.golden_dir, args.repeat)]
    if not args.skip_run:
        lines += ["", f"`kdtr run --backend cpu` on {args.golden_dir} with {args.bin_dir}:", "",
                  *run_table(args.golden_dir.resolve(), args.bin_dir.resolve(), args.runs)]
    text = "\n".join(head + lines) + "\n"
    print(text, end="")
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
