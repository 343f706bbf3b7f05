#!/usr/bin/env python3
"""Benchmark tree_build: each CUDA kernel against the numpy/heapq reference.

shared/DESIGN.md section 7: on an H200, D=16, K=16, tree_build must take at most 10 us at
B=1, N=64, 60 us at B=1, N=1024 and 150 us at B=64, N=1024, there at least 1500x faster
than the numpy reference measured in the same run, with a bit-exact output order. This
script measures that for each kernel of ``build/bin/kdtr_tree_build`` named by
``--kernels`` (default ``select,heap``: ``select`` the parallel select kernel, ``heap``
the one-thread best-first heap per request; ``auto`` is the binary's own choice), for
B in {1, 4, 16, 64, 256} x N in {64, 256, 1024, 4096} (``--batches``, ``--budgets``),
D=16, K=16:

- inputs (seeded): per request and depth, the top-16 log-probs of a softmax over random
  logits for a 32000-token vocabulary, as f32, sorted non-increasing, with their (distinct)
  token ids; budget = N and depth_limit = D for every request; written with ``kdtr.save``
  as ``input.*`` tensors plus metadata op / config / max_budget in a temporary directory;
- reference: ``kdtr.ops.tree_build.tree_build`` on the whole batch, wall clock
  (``time.perf_counter``) on this machine's CPU, median of 9 runs (5 from requests x N >=
  16K, 3 from 64K, 1 from 256K: a run of B=256, N=4096 takes tens of seconds). Above
  ``--max-ref-work`` W (requests x N, default 64 x 4096) it is timed on the first
  M = W // N requests only and scaled by B / M (requests are independent; marked ``*``);
- CUDA: ``build/bin/kdtr_tree_build --backend cuda --kernel K --repeat R`` per kernel K on
  that file, in the same run; its timing line gives the median and min over R runs of the
  kernel alone (device events around the launch, after a warm-up; inputs already on the
  GPU: docs/binaries.md). Before the first configuration every kernel is tried once on a
  B=1, N=8 file, so that a binary without ``--kernel`` (built before the kernel choice) or refusing
  a kernel stops the script at once;
- exactness: every kernel's output must equal the reference's exactly (every output, dtype
  and bytes) for all B requests -- for a scaled configuration against one more, untimed,
  reference run on the whole batch, except where B x N > 4 W: there on the first M
  requests only (said in the footnote) -- else the script exits 1;
- bandwidth: output GB/s = the bytes of all the op's outputs, B(8 + 24T + T^2) with
  T = N + 1 (node_count, status i32 [B]; node_token_ids i64 [B,T]; node_depths, parents,
  next_token, next_sibling i32 [B,T]; visibility u8 [B,T,T]), over the median kernel time
  (1 GB = 1e9 bytes). Beside it, its share of the fill rate (the outputs are written, not
  copied) of the same GPU in the same run, measured with torch: ``fill_`` of a 1 GiB
  uint8 tensor (bytes / time, write only) and ``copy_`` between two such tensors
  (2 x bytes / time, read + write), each the median of 20 runs timed with CUDA events.
  Without torch or its CUDA the rates are n/a.

``--graph`` also times each kernel inside a replayed CUDA graph (the binary's ``--graph
--repeat R``, docs/binaries.md "Graph replay": the launches captured once, each sample one
``cudaGraphLaunch`` between device events, so the host's launch cost is left out): the
input file then holds the batch twice (``replay1.*`` and ``input.*``, the same data), and
the second replay's outputs must equal the reference too. The table gains two columns,
graph us/batch (median and min); configurations whose outputs pass ``--graph-max-bytes``
(default 2e9: the output file holds both replays) are not timed in a graph (n/a).

Outputs over ``KDTR_MAX_OUTPUT_BYTES`` (4 GiB by default; B=256, N=4096 needs 4.3 GB)
raise that limit for this process and the binaries it starts.

``--backend cpu`` times the binary's C++ CPU backend instead (a machine without a GPU;
its time covers the whole batch, steady_clock; ``--kernel heap`` and ``select`` exist there
too; no copy rate). Use small ``--batches`` / ``--budgets`` there.

Prints a Markdown table (B, N, kernel, reference ms/batch, CUDA us/batch median and min,
speedup = reference median / kernel median, output GB/s, % of the fill rate, output
equal or DIFFERENT) under the GPU name and the copy and fill rates, footnotes for the
scaled references, then the section 7 targets evaluated on the select kernel's numbers
(met / MISSED, CUDA only, for the configurations that ran). ``--out FILE`` appends all of
it with the command, the date and the machine to a Markdown file (e.g. docs/benchmarks.md).

Usage (from the repository root, after ``make``):

    python3 bench/bench_tree_build.py [--out docs/benchmarks.md] [--device 0] [--repeat 200]
        [--kernels select,heap] [--batches 1,4,16,64,256] [--budgets 64,256,1024,4096]
        [--max-ref-work 262144] [--graph]

Exit codes: 0 done (a missed target included: this is a benchmark, not a test); 1 a run
of the binary failed or an output differs from the reference; 2 bad arguments, the binary
missing, or a binary that rejects ``--kernel`` or one of the kernels. With the defaults it
takes a few minutes on an H200 host, most of it the reference and synthesising inputs.
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
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import kdtr  # noqa: E402
from kdtr.limits import MAX_OUTPUT_BYTES_ENV, max_output_bytes, tree_build_output_bytes  # noqa: E402
from kdtr.ops.tree_build import tree_build  # noqa: E402

VOCAB = 32000
DEPTH = 16
TOPK = 16
BATCHES = (1, 4, 16, 64, 256)
BUDGETS = (64, 256, 1024, 4096)
KERNELS = ("auto", "heap", "select")  # what the binary's --kernel accepts
DEFAULT_KERNELS = ("select", "heap")
MAX_REF_WORK = 64 * 4096
"""Default --max-ref-work: requests x N above which the reference is timed on a slice."""
PROBE_N = 8  # the B=1 file every kernel is tried on before the first configuration
COPY_BYTES = 1 << 30
COPY_RUNS = 20
TARGETS = (  # shared/DESIGN.md section 7, select kernel: (B, N, max us, min speedup or None)
    (1, 64, 10.0, None),
    (1, 1024, 60.0, None),
    (64, 1024, 150.0, 1500.0),
)
STRETCH = (  # the tighter small-batch targets, select kernel: (B, N, max us)
    (1, 64, 8.0),
    (1, 1024, 30.0),
    (64, 1024, 100.0),
)
STRETCH_FILL = (256, 4096, 0.80)  # (B, N, min share of the fill rate)
TIMING_RE = re.compile(r"^timing (.*)$", re.M)


class BinaryError(RuntimeError):
    """A run of the binary failed; ``usage`` when it exited 2 (usage or input error)."""

    def __init__(self, message: str, usage: bool = False):
        super().__init__(message)
        self.usage = usage


@dataclass
class Row:
    b: int
    n: int
    kernel: str  # as passed to --kernel
    kernel_ran: str  # the output's `kernel` metadata, "" if it has none
    ref_s: float  # reference seconds per batch (scaled where ref_requests < b)
    ref_requests: int  # requests the reference was timed on
    checked_requests: int  # requests compared (b, or ref_requests where B x N > 4 W)
    med_us: float
    min_us: float
    ok: bool
    graph_med_us: float | None = None  # --graph: one replay of the captured graph
    graph_min_us: float | None = None


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


def first_requests(inputs: dict[str, np.ndarray], m: int) -> dict[str, np.ndarray]:
    """The inputs of the first `m` requests (every input's axis 0 is B)."""
    return {k: np.ascontiguousarray(v[:m]) for k, v in inputs.items()}


def output_bytes(b: int, n: int) -> int:
    """Bytes of all tree_build outputs for B requests of budget N: B(8 + 24T + T^2), T = N + 1."""
    return tree_build_output_bytes(b, n + 1)


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


def reference_runs(work: int) -> int:
    """Runs of the reference for `work` = requests x N (B=64, N=1024: about 0.2 s a run)."""
    if work >= 256 * 1024:
        return 1
    if work >= 64 * 1024:
        return 3
    if work >= 16 * 1024:
        return 5
    return 9


def run_binary(binary: Path, golden: Path, out: Path, backend: str, device: int, repeat: int,
               kernel: str, graph: bool = False) -> tuple[float, float, dict[str, str]]:
    """(median_us, min_us, every field of the timing line) of `kernel` on `golden`; output in `out`.

    Raises:
        BinaryError: the binary exited nonzero (naming the command and its stderr; a binary
            without --kernel gets a sentence saying so) or printed no timing line.
    """
    cmd = [str(binary), "--input", str(golden), "--output", str(out), "--backend", backend,
           "--device", str(device), "--repeat", str(repeat), "--kernel", kernel] + (["--graph"] if graph else [])
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        err = r.stderr.strip()
        if "unknown option --kernel" in err:
            raise BinaryError(f"{binary} has no --kernel option (built before the kernel choice): "
                              f"rebuild it with `make` ({err})", usage=True)
        raise BinaryError(f"{shlex.join(cmd)} exited {r.returncode}: {err}", usage=r.returncode == 2)
    m = TIMING_RE.search(r.stdout)
    fields = dict(tok.split("=", 1) for tok in m.group(1).split() if "=" in tok) if m else {}
    try:
        return float(fields["median_us"]), float(fields["min_us"]), fields
    except (KeyError, ValueError):
        raise BinaryError(f"no timing line with median_us and min_us in the output of {shlex.join(cmd)}: "
                          f"{r.stdout!r}") from None


def check_equal(got: dict[str, np.ndarray], expected: dict[str, np.ndarray], b: int) -> list[str]:
    """Names of the outputs that differ (dtype, shape or any byte) from the reference.

    `expected` may hold the first requests only (axis 0 shorter than `b`): the binary's
    outputs, which must still hold `b` requests, are compared on those.
    """
    bad = []
    for name, want in expected.items():
        have = got.get(name)
        if (have is None or have.dtype != want.dtype or have.ndim != want.ndim or have.shape[0] != b
                or have[: want.shape[0]].shape != want.shape or not np.array_equal(have[: want.shape[0]], want)):
            bad.append(name)
    return bad


def copy_rates(device: int) -> tuple[float | None, float | None, str]:
    """(copy GB/s, fill GB/s, description) of CUDA device `device`, measured with torch.

    copy: ``dst.copy_(src)`` between two 1 GiB uint8 tensors, 2 x bytes / time (read +
    write); fill: ``dst.fill_(1)``, bytes / time (write only); each the median of
    COPY_RUNS runs timed with CUDA events, after a warm-up. (None, None, reason) without
    torch or its CUDA.
    """
    try:
        import torch
    except ImportError:
        return None, None, "copy rate: n/a (torch unavailable)"
    if not torch.cuda.is_available():
        return None, None, "copy rate: n/a (torch unavailable)"
    with torch.cuda.device(device):
        src = torch.full((COPY_BYTES,), 7, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)

        def median_ms(op) -> float:
            for _ in range(3):
                op()
            samples = []
            for _ in range(COPY_RUNS):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                op()
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end))
            return statistics.median(samples)

        copy_ms = median_ms(lambda dst=dst, src=src: dst.copy_(src))
        fill_ms = median_ms(lambda dst=dst: dst.fill_(1))
        del src, dst
        torch.cuda.empty_cache()
    copy_gbs = 2 * COPY_BYTES / (copy_ms * 1e-3) / 1e9
    fill_gbs = COPY_BYTES / (fill_ms * 1e-3) / 1e9
    return copy_gbs, fill_gbs, (
        f"Same GPU, same run (torch {torch.__version__}, 1 GiB uint8, median of {COPY_RUNS}, CUDA events): "
        f"copy rate {copy_gbs:.0f} GB/s (`copy_`, read + write); fill rate {fill_gbs:.0f} GB/s "
        f"(`fill_`, write only); 1 GB = 1e9 bytes.")


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


def int_list(text: str) -> tuple[int, ...]:
    """argparse type: a comma list of integers >= 1, e.g. ``1,64,256``."""
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma list of integers: {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"every value must be >= 1: {text!r}")
    return tuple(dict.fromkeys(values))


def kernel_list(text: str) -> tuple[str, ...]:
    """argparse type: a comma list of --kernel values of the binary, e.g. ``select,heap``."""
    values = tuple(dict.fromkeys(v.strip() for v in text.split(",")))
    unknown = [v for v in values if v not in KERNELS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown kernel {', '.join(map(repr, unknown))}: "
                                         f"choose among {', '.join(KERNELS)}")
    return values


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="append the table (with command, date, machine) to this Markdown file")
    ap.add_argument("--binary", type=Path, default=REPO_ROOT / "build" / "bin" / "kdtr_tree_build")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--backend", choices=("cuda", "cpu"), default="cuda",
                    help="backend of the binary to time (default cuda; cpu: the C++ CPU backend, for a machine "
                         "without GPU; use small --batches/--budgets there)")
    ap.add_argument("--kernels", type=kernel_list, default=DEFAULT_KERNELS,
                    help=f"comma list of the binary's --kernel values to time, each in the same run "
                         f"({'|'.join(KERNELS)}; default {','.join(DEFAULT_KERNELS)})")
    ap.add_argument("--batches", type=int_list, default=BATCHES,
                    help=f"comma list of batch sizes B (default {','.join(map(str, BATCHES))})")
    ap.add_argument("--budgets", type=int_list, default=BUDGETS,
                    help=f"comma list of budgets N (default {','.join(map(str, BUDGETS))})")
    ap.add_argument("--max-ref-work", type=int, default=MAX_REF_WORK, metavar="W",
                    help=f"requests x N above which the reference is timed on the first W // N requests and "
                         f"scaled by B (default {MAX_REF_WORK}); its output is still compared on all requests "
                         f"up to B x N = 4W (an untimed full reference run), on those first requests above")
    ap.add_argument("--repeat", type=int, default=200, help="kernel runs timed per configuration and kernel (default 200)")
    ap.add_argument("--seed", type=int, default=20240)
    ap.add_argument("--graph", action="store_true",
                    help="also time each kernel inside a replayed CUDA graph (the binary's --graph; CUDA only)")
    ap.add_argument("--graph-max-bytes", type=float, default=2e9, metavar="BYTES",
                    help="--graph: only for configurations whose outputs are at most this many bytes "
                         "(default 2e9; the graph run's output file holds two replays)")
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error("--repeat must be >= 1")
    if args.max_ref_work < 1:
        ap.error("--max-ref-work must be >= 1")
    if not (args.binary.is_file() and os.access(args.binary, os.X_OK)):
        print(f"bench_tree_build: {args.binary} not found: run `make` first", file=sys.stderr)
        return 2
    kernels: tuple[str, ...] = args.kernels
    configs = [(b, n) for b in args.batches for n in args.budgets]
    need = max(output_bytes(b, n) for b, n in configs)
    try:
        limit = max_output_bytes()
    except ValueError as exc:
        print(f"bench_tree_build: {exc}", file=sys.stderr)
        return 2
    if need > limit:  # read by the reference (kdtr.limits) and by the binaries, which inherit it
        os.environ[MAX_OUTPUT_BYTES_ENV] = str(need)
        print(f"bench_tree_build: {MAX_OUTPUT_BYTES_ENV}={need} (outputs of the largest configuration; "
              f"limit was {limit})", file=sys.stderr)

    rows: list[Row] = []
    gpu = "?"
    failures = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kdtr_bench_tree_build_") as tmp:
        tmpdir = Path(tmp)
        # Every kernel once on a tiny file first: an old binary (no --kernel) or a refused
        # kernel stops the script before minutes of reference runs.
        probe = tmpdir / "probe.kdtr"
        kdtr.save(probe, {f"input.{k}": v for k, v in synth_inputs(np.random.default_rng(args.seed), 1, PROBE_N).items()},
                  {"op": "tree_build", "config": f"bench_probe_N{PROBE_N}", "max_budget": PROBE_N})
        for kernel in kernels:
            try:
                run_binary(args.binary, probe, tmpdir / "probe.out.kdtr", args.backend, args.device, 1, kernel)
            except (BinaryError, subprocess.TimeoutExpired) as exc:
                print(f"bench_tree_build: --kernel {kernel}: {exc}", file=sys.stderr)
                return 2 if getattr(exc, "usage", False) else 1

        if args.backend == "cuda":
            _copy_gbs, fill_gbs, rates_line = copy_rates(args.device)
        else:
            fill_gbs, rates_line = None, "copy rate: n/a (backend cpu)"
        print(f"  {rates_line}", file=sys.stderr, flush=True)

        for b, n in configs:
            rng = np.random.default_rng([args.seed, b, n])
            inputs = synth_inputs(rng, b, n)
            config = f"bench_B{b}_N{n}"
            golden = tmpdir / f"{config}.kdtr"
            kdtr.save(golden, {f"input.{k}": v for k, v in inputs.items()},
                      {"op": "tree_build", "config": config, "max_budget": n})
            graph_file = tmpdir / f"{config}.graph.kdtr"
            graph = args.graph and output_bytes(b, n) <= args.graph_max_bytes
            if graph:  # both replays on the same data: replay1.* and input.*
                kdtr.save(graph_file, {**{f"replay1.{k}": v for k, v in inputs.items()},
                                       **{f"input.{k}": v for k, v in inputs.items()}},
                          {"op": "tree_build", "config": config, "max_budget": n})
            m = b if b * n <= args.max_ref_work else min(b, max(1, args.max_ref_work // n))
            ref_s, expected = time_reference(first_requests(inputs, m) if m < b else inputs, n, reference_runs(m * n))
            ref_s *= b / m  # linear in B: the requests are independent
            if m < b and b * n <= 4 * args.max_ref_work:
                expected = tree_build(**inputs, n_max=n).as_dict()  # untimed, to check every request
            checked = expected["node_count"].shape[0]
            out = tmpdir / f"{config}.out.kdtr"
            for kernel in kernels:
                try:
                    med_us, min_us, timing = run_binary(args.binary, golden, out, args.backend, args.device,
                                                        args.repeat, kernel)
                except (BinaryError, subprocess.TimeoutExpired) as exc:
                    print(f"bench_tree_build: B={b} N={n} --kernel {kernel}: {exc}", file=sys.stderr)
                    return 1
                got = kdtr.load(out)
                gpu = str(got.metadata.get("device", gpu))
                kernel_ran = str(got.metadata.get("kernel", timing.get("kernel", "")))
                bad = check_equal(got.tensors, expected, b)
                del got
                out.unlink()
                if bad:
                    failures.append(f"B={b} N={n} --kernel {kernel}: {args.backend} output differs from the reference "
                                    f"in {', '.join(bad)}")
                row = Row(b, n, kernel, kernel_ran, ref_s, m, checked, med_us, min_us, not bad)
                if graph:
                    try:
                        row.graph_med_us, row.graph_min_us, _ = run_binary(
                            args.binary, graph_file, out, args.backend, args.device, args.repeat, kernel, graph=True)
                    except (BinaryError, subprocess.TimeoutExpired) as exc:
                        print(f"bench_tree_build: B={b} N={n} --kernel {kernel} --graph: {exc}", file=sys.stderr)
                        return 1
                    got = kdtr.load(out)  # the second replay's outputs under the bare names
                    gbad = check_equal({k: v for k, v in got.tensors.items() if not k.startswith("replay1.")},
                                       expected, b)
                    del got
                    out.unlink()
                    if gbad:
                        failures.append(f"B={b} N={n} --kernel {kernel} --graph: output differs from the reference "
                                        f"in {', '.join(gbad)}")
                        row.ok = False
                rows.append(row)
                gtxt = f", graph {row.graph_med_us:.3f} us" if row.graph_med_us is not None else ""
                print(f"  B={b:3d} N={n:5d} {kernel:>6}: reference {ref_s * 1e3:10.3f} ms{'*' if m < b else ' '},"
                      f" {args.backend} {med_us:10.3f} us (min {min_us:.3f}){gtxt},"
                      f" {'equal' if row.ok else 'DIFFERENT'}", file=sys.stderr, flush=True)
            golden.unlink()
            if graph:
                graph_file.unlink()
            del inputs, expected
    elapsed = time.perf_counter() - started

    what = ("CUDA = kernel time by device events" if args.backend == "cuda"
            else "cpu = the binary's C++ CPU backend, steady_clock around the whole batch")
    label = "CUDA" if args.backend == "cuda" else "C++ cpu"
    table = [
        f"Device: {gpu}; D={DEPTH}, K={TOPK}, budget = N and depth_limit = D for every request; "
        f"{what}, {args.repeat} runs per kernel; reference = kdtr.ops.tree_build on one CPU core, wall clock.",
        "",
        rates_line,
        "",
        "Output GB/s = bytes of all outputs, B(8 + 24T + T^2) with T = N + 1, / median time; "
        "% of fill = output GB/s / fill rate (the outputs are written, not copied).",
        "",
        f"| B | N | kernel | reference ms/batch | {label} us/batch (median) | {label} us/batch (min) | speedup"
        " | output GB/s | % of fill rate |" + (" graph us/batch (median) | graph us/batch (min) |" if args.graph else "")
        + " output |",
        "| ---: | ---: | :--- | ---: | ---: | ---: | ---: | ---: | ---: |" + (" ---: | ---: |" if args.graph else "")
        + " :--- |",
    ]
    notes = []
    for r in rows:
        gbs = output_bytes(r.b, r.n) / (r.med_us * 1e-6) / 1e9 if r.med_us > 0 else float("inf")
        fill = f"{100 * gbs / fill_gbs:.3g}%" if fill_gbs else "n/a"
        speedup = r.ref_s * 1e6 / r.med_us if r.med_us > 0 else float("inf")
        kernel = r.kernel if r.kernel_ran in ("", r.kernel) else f"{r.kernel} ({r.kernel_ran})"
        scaled = "\\*" if r.ref_requests < r.b else ""
        verdict = "equal" if r.ok else "**DIFFERENT**"
        if r.checked_requests < r.b:
            verdict += f" (first {r.checked_requests})"
        graph = (f" {r.graph_med_us:.3f} | {r.graph_min_us:.3f} |" if r.graph_med_us is not None else " n/a | n/a |"
                 ) if args.graph else ""
        table.append(f"| {r.b} | {r.n} | {kernel} | {r.ref_s * 1e3:.3f}{scaled} | {r.med_us:.3f} | {r.min_us:.3f}"
                     f" | {speedup:.0f}x | {gbs:.1f} | {fill} |{graph} {verdict} |")
        if r.ref_requests < r.b and (r.b, r.n) not in {k for k, _ in notes}:
            check = (f"output compared on all {r.b} requests against one more, untimed, reference run"
                     if r.checked_requests == r.b else
                     f"output compared on the first {r.ref_requests} requests only (B x N > 4 x {args.max_ref_work})")
            notes.append(((r.b, r.n), f"B={r.b}, N={r.n}: reference timed on the first {r.ref_requests} of {r.b} "
                                      f"requests and scaled by {r.b / r.ref_requests:g}; {check}"))
    if notes:
        table.append("")
        table.append(f"\\* reference scaled (requests x N over --max-ref-work {args.max_ref_work}): "
                     + "; ".join(text for _, text in notes) + ".")
    if args.backend == "cuda" and "select" in kernels:
        lines = []
        for b, n, max_us, min_speedup in TARGETS:
            r = next((r for r in rows if (r.b, r.n, r.kernel) == (b, n, "select")), None)
            if r is None:
                continue
            line = (f"- B={b}, N={n} <= {max_us:g} us: "
                    + ("met" if r.med_us <= max_us else f"MISSED ({r.med_us:.1f} us)"))
            if min_speedup is not None:
                speedup = r.ref_s * 1e6 / r.med_us if r.med_us > 0 else float("inf")
                line += (f"; >= {min_speedup:g}x the reference: "
                         + ("met" if speedup >= min_speedup else f"MISSED ({speedup:.0f}x)"))
            if not r.ok:
                line += " (output DIFFERENT)"
            lines.append(line)
        if lines:
            table += ["", "Targets (shared/DESIGN.md section 7), select kernel:", *lines]
        lines = []
        for b, n, max_us in STRETCH:
            r = next((r for r in rows if (r.b, r.n, r.kernel) == (b, n, "select")), None)
            if r is not None:
                lines.append(f"- B={b}, N={n} <= {max_us:g} us: "
                             + ("met" if r.med_us <= max_us else f"MISSED ({r.med_us:.1f} us)"))
        b, n, share = STRETCH_FILL
        r = next((r for r in rows if (r.b, r.n, r.kernel) == (b, n, "select")), None)
        if r is not None and fill_gbs:
            got = output_bytes(b, n) / (r.med_us * 1e-6) / 1e9 / fill_gbs
            lines.append(f"- B={b}, N={n} >= {100 * share:g}% of the fill rate: "
                         + ("met" if got >= share else f"MISSED ({100 * got:.3g}%)"))
        if lines:
            table += ["", "Small-batch targets (median of the timed runs), select kernel:", *lines]
    text = "\n".join(table)
    print(text)
    for f in failures:
        print(f"bench_tree_build: {f}", file=sys.stderr)

    if args.out is not None:
        cmd = shlex.join([Path(sys.executable).name, *sys.argv])
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        section = (
            f"\n## tree_build: {label} kernels {', '.join(kernels)} vs. numpy/heapq reference ({now})\n\n"
            f"Command: `{cmd}`  \nMachine: {machine_line()}  \nRun time: {elapsed:.0f} s\n\n{text}\n"
        )
        with open(args.out, "a", encoding="utf-8") as fh:
            fh.write(section)
        print(f"appended to {args.out}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
