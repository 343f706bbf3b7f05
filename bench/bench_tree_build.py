#!/usr/bin/env python3
"""Benchmark tree_build: the CUDA kernel against the numpy/heapq reference.

shared/DESIGN.md section 7: on an H200, tree_build for a whole batch (B=64, D=16, K=16,
N=1024) must be at least 100x faster than the per-request CPU heap builder of the paper's
reference. This script measures that, for B in {1, 8, 64} x N in {64, 256, 1024}, D=16,
K=16:

- inputs (seeded): per request and depth, the top-16 log-probs of a softmax over random
  logits for a 32000-token vocabulary, as f32, sorted non-increasing, with their (distinct)
  token ids; budget = N and depth_limit = D for every request; written with ``kdtr.save``
  as ``input.*`` tensors plus metadata op / config / max_budget in a temporary directory;
- reference: ``kdtr.ops.tree_build.tree_build`` on the whole batch, wall clock
  (``time.perf_counter``) on this machine's CPU, median of several runs (fewer for the
  slow large configurations);
- CUDA: ``build/bin/kdtr_tree_build --backend cuda --repeat R`` on that file; its timing
  line gives the median and min over R runs of the kernel alone (device events around the
  launch, after a warm-up; inputs already on the GPU: docs/binaries.md);
- the CUDA output must equal the reference's exactly (every output, dtype and bytes),
  else the script exits 1.

``--backend cpu`` times the binary's C++ CPU backend instead (a machine without a GPU;
its time covers the whole batch, steady_clock).

Prints a Markdown table (B, N, reference ms/batch, CUDA us/batch median and min, speedup
= reference median / CUDA median) and the GPU name. ``--out FILE`` appends the table with
the command, the date and the machine to a Markdown file (e.g. docs/benchmarks.md).

Usage (from the repository root, after ``make``):

    python3 bench/bench_tree_build.py [--out docs/benchmarks.md] [--device 0] [--repeat 200]

Exit codes: 0 done; 1 a CUDA run failed or its output differs from the reference;
2 bad arguments or the binary is missing. Runs in well under 3 minutes on an H200 host.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import kdtr  # noqa: E402
from kdtr.ops.tree_build import tree_build  # noqa: E402

VOCAB = 32000
DEPTH = 16
TOPK = 16
BATCHES = (1, 8, 64)
BUDGETS = (64, 256, 1024)
TIMING_RE = re.compile(r"^timing backend=(\w+) repeat=(\d+) median_us=([0-9.]+) min_us=([0-9.]+)$", re.M)


def synth_inputs(rng: np.random.Generator, b: int, n: int) -> dict[str, np.ndarray]:
    """Drafter-like inputs for B requests: top-K log-probs of softmax(random logits)."""
    lp = np.empty((b, DEPTH, TOPK), np.float32)
    ids = np.empty((b, DEPTH, TOPK), np.int64)
    for i in range(b):  # one request at a time: [D, VOCAB] logits stay small
        # per-row temperature: peaked and flat rows mix, as a drafter's would
        temp = rng.uniform(0.5, 3.0, size=(DEPTH, 1))
        logits = rng.standard_normal((DEPTH, VOCAB)) * temp
        m = logits.max(axis=1, keepdims=True)
        logz = m + np.log(np.exp(logits - m).sum(axis=1, keepdims=True))
        top = np.argpartition(-logits, TOPK - 1, axis=1)[:, :TOPK]
        top_lp = (np.take_along_axis(logits, top, axis=1) - logz).astype(np.float32)
        order = np.argsort(-top_lp, axis=1, kind="stable")
        lp[i] = np.take_along_axis(top_lp, order, axis=1)
        ids[i] = np.take_along_axis(top, order, axis=1)
    return {
        "top_log_probs": lp,
        "top_token_ids": ids,
        "root_token_ids": rng.integers(0, VOCAB, b).astype(np.int64),
        "budget": np.full(b, n, np.int32),
        "depth_limit": np.full(b, DEPTH, np.int32),
    }


def time_reference(inputs: dict[str, np.ndarray], n: int, runs: int) -> tuple[float, dict[str, np.ndarray]]:
    """Median wall-clock seconds of the reference over `runs` runs, and its outputs."""
    samples = []
    out = None
    for _ in range(runs):
        t0 = time.perf_counter()
        res = tree_build(**inputs, n_max=n)
        samples.append(time.perf_counter() - t0)
        out = res.as_dict()
    assert out is not None
    return statistics.median(samples), out


def run_binary(binary: Path, golden: Path, out: Path, backend: str, device: int, repeat: int) -> tuple[float, float, str]:
    """(median_us, min_us, device name) of the binary's `backend` on `golden`; output in `out`."""
    cmd = [str(binary), "--input", str(golden), "--output", str(out), "--backend", backend,
           "--device", str(device), "--repeat", str(repeat)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} exited {r.returncode}: {r.stderr.strip()}")
    m = TIMING_RE.search(r.stdout)
    if not m:
        raise RuntimeError(f"no timing line in the output of {shlex.join(cmd)}: {r.stdout!r}")
    dev = kdtr.load(out).metadata.get("device", "?")
    return float(m.group(3)), float(m.group(4)), str(dev)


def check_equal(got_path: Path, expected: dict[str, np.ndarray]) -> list[str]:
    """Names of the outputs that differ (dtype, shape or any byte) from the reference."""
    got = kdtr.load(got_path).tensors
    bad = []
    for name, want in expected.items():
        have = got.get(name)
        if have is None or have.dtype != want.dtype or have.shape != want.shape or not np.array_equal(have, want):
            bad.append(name)
    return bad


def reference_runs(b: int, n: int) -> int:
    """Fewer runs where one run of the reference takes long (B=64, N=1024: about a second)."""
    work = b * n
    if work >= 64 * 1024:
        return 3
    if work >= 16 * 1024:
        return 5
    return 9


def machine_line() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{socket.gethostname()}, {cpu} ({os.cpu_count()} CPUs), Python {platform.python_version()}, numpy {np.__version__}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="append the table (with command, date, machine) to this Markdown file")
    ap.add_argument("--binary", type=Path, default=REPO_ROOT / "build" / "bin" / "kdtr_tree_build")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--backend", choices=("cuda", "cpu"), default="cuda",
                    help="backend of the binary to time (default cuda; cpu: the C++ CPU backend, for a machine without GPU)")
    ap.add_argument("--repeat", type=int, default=200, help="CUDA runs timed per configuration (default 200)")
    ap.add_argument("--seed", type=int, default=20240)
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error("--repeat must be >= 1")
    if not (args.binary.is_file() and os.access(args.binary, os.X_OK)):
        print(f"bench_tree_build: {args.binary} not found: run `make` first", file=sys.stderr)
        return 2

    rows = []
    gpu = "?"
    failures = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kdtr_bench_tree_build_") as tmp:
        tmpdir = Path(tmp)
        for b in BATCHES:
            for n in BUDGETS:
                rng = np.random.default_rng([args.seed, b, n])
                inputs = synth_inputs(rng, b, n)
                config = f"bench_B{b}_N{n}"
                golden = tmpdir / f"{config}.kdtr"
                kdtr.save(golden, {f"input.{k}": v for k, v in inputs.items()},
                          {"op": "tree_build", "config": config, "max_budget": n})
                ref_s, expected = time_reference(inputs, n, reference_runs(b, n))
                out = tmpdir / f"{config}.out.kdtr"
                try:
                    med_us, min_us, gpu = run_binary(args.binary, golden, out, args.backend, args.device, args.repeat)
                except (RuntimeError, subprocess.TimeoutExpired) as exc:
                    print(f"bench_tree_build: B={b} N={n}: {exc}", file=sys.stderr)
                    return 1
                bad = check_equal(out, expected)
                if bad:
                    failures.append(f"B={b} N={n}: {args.backend} output differs from the reference in {', '.join(bad)}")
                rows.append((b, n, ref_s * 1e3, med_us, min_us, ref_s * 1e6 / med_us if med_us > 0 else float("inf"),
                             not bad))
                print(f"  B={b:3d} N={n:5d}: reference {ref_s * 1e3:10.3f} ms, {args.backend} {med_us:10.3f} us"
                      f" (min {min_us:.3f}), {'equal' if not bad else 'DIFFERENT'}", file=sys.stderr, flush=True)
    elapsed = time.perf_counter() - started

    what = ("CUDA = kernel time by device events" if args.backend == "cuda"
            else "cpu = the binary's C++ CPU backend, steady_clock around the whole batch")
    label = "CUDA" if args.backend == "cuda" else "C++ cpu"
    table = [
        f"Device: {gpu}; D={DEPTH}, K={TOPK}, budget = N and depth_limit = D for every request; "
        f"{what}, {args.repeat} runs; reference = kdtr.ops.tree_build on one CPU core, wall clock.",
        "",
        f"| B | N | reference ms/batch | {label} us/batch (median) | {label} us/batch (min) | speedup | output |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | :--- |",
    ]
    for b, n, ref_ms, med_us, min_us, speedup, ok in rows:
        table.append(f"| {b} | {n} | {ref_ms:.3f} | {med_us:.3f} | {min_us:.3f} | {speedup:.0f}x |"
                     f" {'equal' if ok else '**DIFFERENT**'} |")
    text = "\n".join(table)
    print(text)
    for f in failures:
        print(f"bench_tree_build: {f}", file=sys.stderr)

    if args.out is not None:
        cmd = shlex.join([Path(sys.executable).name, *sys.argv])
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        section = (
            f"\n## tree_build: {label} vs. numpy/heapq reference ({now})\n\n"
            f"Command: `{cmd}`  \nMachine: {machine_line()}  \nRun time: {elapsed:.0f} s\n\n{text}\n"
        )
        with open(args.out, "a", encoding="utf-8") as fh:
            fh.write(section)
        print(f"appended to {args.out}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
