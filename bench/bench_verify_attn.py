"""Benchmark verify_attn (build/bin/kdtr_verify_attn) at Kimi K2 dims beside torch SDPA.

Default problem (shared/DESIGN.md 7): B = 8 requests, prefix_len 4096, T = 65 tree slots
(node_count 64), H = 64 heads, Dqk = 576, d_v = 512, sm_scale = 192^-0.5 mscale^2 (yarn
factor 64), q and the latent KV ~ N(0, 1), fp32 and bf16. Visibility comes from random
draft trees of 64 nodes (parents drawn among earlier slots with depth < 16 and fewer than
8 children, recent slots favoured: deep chains with side branches, like best-first
DDTree trees), or chains (`--tree chain`).

One run measures, on one GPU, up to three tables against one set of ceilings (measured once,
at the first table, so every table's targets are judged against ceilings of the same run):
the K2 table (the default; with `--latency` or `--sweep` only when `--k2` is given), the
latency points (`--latency`), the sweep (`--sweep`), in that order.

The K2 table:
  1. the FLOP count (QK: 2 H Dqk per visible (row, key) pair, PV: 2 H d_v; masked tree
     positions not counted; the dense count over all L keys, which the kernels compute, is
     printed too) and the minimum bytes (q, valid cache rows, visibility and lengths read
     once, out and lse written once);
  2. the ceilings: a large bf16 and fp32 (no TF32) matmul through torch and a large
     device-to-device copy (bytes read + written), each the median of CUDA-event timings;
  3. the binary's launch for each CUDA kernel that applies, forced with `--kernel` (bf16:
     `wgmma`, the Hopper wgmma + TMA kernel, and `mma`, mma.sync tensor cores, the sm_80 /
     sm_120 path; fp32: `simt`, f32 FFMA; a kernel the binary does not offer here, exit 3,
     is skipped with a note), timed twice: stream-launched (`--repeat`) and graph-replayed
     (`--repeat --graph`; `--no-graph` skips it), each the median of device-event timings
     (see "Timing" below); with its share of the matmul ceiling of its dtype, its roofline
     bound and its share of it, and its target beside it (bf16: wgmma >= 65%, mma >= 45%
     of the bf16 matmul ceiling);
  4. torch.nn.functional.scaled_dot_product_attention on the same inputs (q [B,H,T,Dqk],
     key/value the latent KV expanded over heads, boolean attn_mask [B,1,T,S] equal to the
     contract's mask), under the backend torch picks and under each backend that accepts
     the inputs, median of CUDA-event timings after warm-up;
  5. agreement: max abs error of the kernel's out and lse and of SDPA's out against a
     float64 evaluation of the contract (torch, on the GPU); the graph-replayed outputs
     must equal the stream-launched ones bit for bit (noted where not).

    python3 bench/bench_verify_attn.py [--out docs/benchmarks.md] [--dtypes bf16,fp32]

Roofline bound (K2 table, latency points, sweep): bound = max(FLOP / matmul ceiling,
minimum bytes / copy rate), FLOP the visible-pair count above (the bound is then a little
below the dense work the kernels do: the stricter reading), both ceilings measured in the
same run; % of bound = bound / judged time.

Timing. The binary (cuda_tests/include/kdtr_cuda.hpp run_cuda, kdtr_cli.hpp time_cuda) runs
the op once, checked, 3 + 3 untimed launches, then `--repeat N` launches, each between two
device events recorded on its stream; one launch is everything launch_verify_attn enqueues,
for a split-KV problem the split attention kernel and the combine kernel back to back on
that stream, so both are inside the timed region. Under `--graph` the op's launches are
captured in one CUDA graph (replayed twice, checked, then 3 untimed) and each replay is
timed the same way. The judged time (% of bound, targets) is the graph-replayed one where
it was measured (an engine replays the op from a CUDA graph), else the stream-launched
one; both are printed. Each timed launch starts on an idle GPU (the binary waits for the
previous stop event), so the host's enqueue of the first kernel (or of the graph) after the
start event is inside every sample: a few microseconds that matter at the latency points.

`--latency`: the latency points (`--latency-points`, default B=1, T=9, prefix 4096 <= 15 us
and B=1, T=65, prefix 16384 <= 40 us; inputs as the K2 problem's, `--latency-repeat`), per
kernel of `--sweep-kernels`: stream and graph microseconds, the roofline bound, % of bound,
the target and the verdict. A target below its point's bound cannot be met by any kernel and
says so (B=1, T=65, prefix 16384 is about 190 us of dense bf16 tensor work at an H200's
~780 TFLOP/s: its 40 us target is below the bound).

    python3 bench/bench_verify_attn.py --k2 --latency [--out FILE]

`--sweep` times the bf16 kernels (`--sweep-kernels`, default wgmma,mma) over a grid:
prefix_len x B x T (`--sweep-prefix`, `--sweep-batch`, `--sweep-t`; default {1024, 2048,
4096, 8192, 16384, 32768} x {1, 2, 4, 8, 16, 64} x {9, 33, 65, 129}: 144 points per
kernel, issue 25's grid) at H = 64, Dqk = 576, d_v = 512. Time only: no SDPA and no float64
reference; per point the kernels' out and lse of request 0 are compared with the first
kernel's (max abs difference: a cheap agreement figure). Inputs are random bf16 bit
patterns (|x| in [0.25, 2), signs random) made once for the largest point (a random pool
tiled into one q and one KV buffer; each point's q and KV are views of their fronts, no
copy), written as one KDTR input per point in a temporary directory (/dev/shm where it has
room) and deleted after the point; points are run in batches (one `--batch` binary process
per kernel for up to `--sweep-chunk` points and `--sweep-chunk-gb` of files). Points whose
estimated bound is at most `--sweep-graph-us` (default 1000 us) are also timed under
`--graph` (their files hold the replay1.* copy; above that the launch gap is a negligible
share and the stream time stands). Per point and kernel: key ranges per request
(split_schedule) and blocks, stream ms, graph ms, TFLOP/s, % of the bf16 matmul ceiling,
GB/s, the bound (and whether FLOP or bytes set it), % of bound, the target (wgmma >= 50%,
mma >= 35% of the bound at every point): met or missed. Then per kernel the minimum and the
median % of bound and how many points met the target (judged time; the stream-only figures
beside).

Sweep cost: the largest point (B=64, prefix 32768, T=129) is 2.4 GB of KV (input file) and
1.1 GB of outputs per kernel; host memory holds the 2.4 GB random KV buffer plus one batch of
files (at most `--sweep-chunk-gb`, 8 GB by default); the GPU holds one point at a time. File
I/O, not the kernels, dominates the sweep: of the full grid's ~275 s estimated on an H200
(two kernels, graph-replay up to 1000 us), writing inputs is ~45 s and the binaries'
loads and output writes ~150 s against ~75 s of launches and replays. A representative subset
is prefix {1024, 4096, 16384, 32768} x every B x every T (96 points, ~195 s estimated);
bench/h200_verify_attn.sh runs that by default. The expected time is estimated and printed
first (with how many points the budget is expected to admit); `--time-budget S` counts from
the start of this process (ceilings and earlier tables included) and starts no batch whose
estimated end (scaled by the real / estimated ratio of the batches so far) would pass S;
points run cheapest first, so a cut drops the largest, listed in the notes.

    python3 bench/bench_verify_attn.py --sweep [--sweep-prefix 1024,4096] [--time-budget 300] [--out FILE]

Needs torch (with CUDA) for the ceilings, SDPA and the reference, numpy, ml_dtypes and the
kdtr package (PYTHONPATH=repo root). `--ceilings BF16,FP32,COPY` (TFLOP/s, TFLOP/s, GB/s)
skips measuring them; with `--binary-backend cpu` (and small dims) the latency points and
the sweep then run without torch or a GPU: a dry run of the pipeline, e.g.

    python3 bench/bench_verify_attn.py --latency --sweep --ceilings 700,50,4000 --binary-backend cpu \\
        --device cpu --heads 2 --dqk 16 --dv 8 --latency-points "1,9,64,15;1,5,32,1" \\
        --sweep-prefix 16,64 --sweep-batch 1,2 --sweep-t 3,9
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np

try:
    import torch
except ImportError:  # the sweep's dry run (--ceilings, --binary-backend cpu) needs no torch
    torch = None

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import kdtr  # noqa: E402
from kdtr.ops.verify_attn import sm_scale_mla  # noqa: E402

try:
    from kdtr.ops.verify_attn import split_schedule  # noqa: E402
except ImportError:  # a tree before split-KV: the key-range column reads '-'
    split_schedule = None

T_IMPORT = time.monotonic()


def since_start() -> float:
    """Seconds since this process started (/proc: interpreter start and imports included), else
    since this module was imported: what --time-budget counts."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        age = uptime - start_ticks / os.sysconf("SC_CLK_TCK")
        if age >= time.monotonic() - T_IMPORT - 1.0:
            return age
    except (OSError, ValueError, IndexError):
        pass
    return time.monotonic() - T_IMPORT

# ---------------------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------------------


def tree_parents(rng: np.random.Generator, n: int, shape: str, max_depth: int = 16, max_children: int = 8) -> np.ndarray:
    """Parent slot of each of the n + 1 slots (-1 for the root); parents[i] < i."""
    parents = np.full(n + 1, -1, np.int64)
    depth = np.zeros(n + 1, np.int64)
    kids = np.zeros(n + 1, np.int64)
    for i in range(1, n + 1):
        if shape == "chain":
            p = i - 1
        else:
            open_slots = [s for s in range(i) if depth[s] < max_depth and kids[s] < max_children]
            w = np.linspace(1.0, 3.0, len(open_slots))
            p = int(rng.choice(open_slots, p=w / w.sum()))
        parents[i], depth[i] = p, depth[p] + 1
        kids[p] += 1
    return parents


def visibility(parents: np.ndarray, t: int) -> np.ndarray:
    """uint8 [t, t] ancestor-or-self mask of the len(parents) valid slots."""
    vis = np.zeros((t, t), np.uint8)
    for i in range(len(parents)):
        if i:
            vis[i] = vis[parents[i]]
        vis[i, i] = 1
    return vis


@dataclass
class Problem:
    B: int
    T: int
    H: int
    Dqk: int
    d_v: int
    prefix: int
    tree: str
    seed: int


def synth(p: Problem, dtype: str) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(p.seed)
    s = p.prefix + p.T
    npdt = np.float32 if dtype == "fp32" else ml_dtypes.bfloat16
    q = rng.standard_normal((p.B, p.T, p.H, p.Dqk), dtype=np.float32).astype(npdt)
    kv = rng.standard_normal((p.B, s, p.Dqk), dtype=np.float32).astype(npdt)
    vis = np.stack([visibility(tree_parents(rng, p.T - 1, p.tree), p.T) for _ in range(p.B)])
    return {
        "q": q,
        "kv_cache": kv,
        "prefix_len": np.full(p.B, p.prefix, np.int32),
        "tree_len": np.full(p.B, p.T, np.int32),
        "visibility": vis,
        "sm_scale": np.array(sm_scale_mla(192, 64.0), np.float32),
        "d_v": np.array(p.d_v, np.int32),
    }


def to_torch(a: np.ndarray, device: str) -> torch.Tensor:
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).to(device).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(a)).to(device)


# ---------------------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------------------


def time_ms(fn, device: str, warmup: int, iters: int) -> float:
    """Median milliseconds of fn() over iters runs after warmup runs (CUDA events on a GPU)."""
    for _ in range(warmup):
        fn()
    samples = []
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        for _ in range(iters):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            samples.append(start.elapsed_time(stop))
    else:
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def ceilings(device: str, n: int, copy_bytes: int, iters: int) -> dict[str, float]:
    """TFLOP/s of an n^3 bf16 and fp32 (no TF32) matmul; GB/s of a device copy (read + write)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    g = torch.Generator(device=device).manual_seed(0)
    out = {}
    for name, dt in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        a = torch.randn(n, n, device=device, dtype=dt, generator=g)
        b = torch.randn(n, n, device=device, dtype=dt, generator=g)
        ms = time_ms(lambda a=a, b=b: a @ b, device, 3, iters)
        out[f"matmul_{name}_tflops"] = 2 * n**3 / (ms * 1e-3) / 1e12
        del a, b
    x = torch.randn(copy_bytes // 4, device=device, generator=g)
    y = torch.empty_like(x)
    ms = time_ms(lambda x=x, y=y: y.copy_(x), device, 3, iters)
    out["copy_gbs"] = 2 * copy_bytes / (ms * 1e-3) / 1e9
    del x, y
    return out


# ---------------------------------------------------------------------------------------
# the op: float64 reference, SDPA, the binary
# ---------------------------------------------------------------------------------------


def contract_mask(x: dict[str, torch.Tensor], S: int) -> torch.Tensor:
    """bool [B, T, S]: key p visible to tree row i (rows i >= tree_len see nothing)."""
    B, T = x["visibility"].shape[:2]
    dev = x["visibility"].device
    mask = torch.zeros(B, T, S, dtype=torch.bool, device=dev)
    for r in range(B):
        pl, tl = int(x["prefix_len"][r]), int(x["tree_len"][r])
        mask[r, :tl, :pl] = True
        mask[r, :tl, pl : pl + tl] = x["visibility"][r, :tl, :tl] != 0
    return mask


def reference_f64(x: dict[str, torch.Tensor], mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The contract in float64 (max subtracted): out [B,T,H,d_v], lse [B,T,H]."""
    q, kv = x["q"], x["kv_cache"]
    B, T, H, _ = q.shape
    d_v = int(x["d_v"])
    scale = float(x["sm_scale"].float())
    out = torch.zeros(B, T, H, d_v, dtype=torch.float64, device=q.device)
    lse = torch.full((B, T, H), -math.inf, dtype=torch.float64, device=q.device)
    for r in range(B):
        pl, tl = int(x["prefix_len"][r]), int(x["tree_len"][r])
        if tl == 0:
            continue
        keys = kv[r, : pl + tl].double()
        s = scale * torch.einsum("thd,ld->thl", q[r, :tl].double(), keys)
        s = s.masked_fill(~mask[r, :tl, None, : pl + tl], -math.inf)
        m = s.amax(-1, keepdim=True)
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        p = torch.exp(s - m)
        den = p.sum(-1, keepdim=True)
        lse[r, :tl] = torch.where(den[..., 0] > 0, (m + torch.log(den))[..., 0], -math.inf)
        out[r, :tl] = torch.einsum("thl,lv->thv", p / den.clamp_min(1e-300), keys[:, :d_v])
    return out, lse


SDPA_BACKENDS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH")


def sdpa_inputs(x: dict[str, torch.Tensor], mask: torch.Tensor):
    q, kv = x["q"], x["kv_cache"]
    B, T, H, Dqk = q.shape
    S, d_v = kv.shape[1], int(x["d_v"])
    qt = q.permute(0, 2, 1, 3).contiguous()  # [B,H,T,Dqk]
    k = kv[:, None].expand(B, H, S, Dqk)
    v = kv[:, None, :, :d_v].expand(B, H, S, d_v)
    return qt, k, v, mask[:, None]  # mask [B,1,T,S]


def sdpa_default_backend(qt, k, v, m, scale: float) -> str:
    try:
        from torch.nn.attention import SDPBackend

        choice = int(torch._fused_sdp_choice(qt, k, v, m, 0.0, False, scale=scale))
        for name in SDPA_BACKENDS:
            be = getattr(SDPBackend, name, None)
            if be is not None and int(be) == choice:
                return name
        return f"choice {choice}"
    except Exception as exc:  # noqa: BLE001 -- private API, report what happened
        return f"unknown ({type(exc).__name__})"


def run_sdpa(x, mask, device: str, warmup: int, iters: int) -> dict[str, tuple[float, torch.Tensor] | str]:
    """{backend: (median ms, out [B,T,H,d_v]) or the reason it did not run}; key 'default' too."""
    import torch.nn.functional as F

    qt, k, v, m = sdpa_inputs(x, mask)
    scale = float(x["sm_scale"].float())
    fn = lambda: F.scaled_dot_product_attention(qt, k, v, attn_mask=m, scale=scale)  # noqa: E731
    res: dict[str, tuple[float, torch.Tensor] | str] = {}
    res["default"] = (time_ms(fn, device, warmup, iters), fn().permute(0, 2, 1, 3).float())
    res["default_backend"] = sdpa_default_backend(qt, k, v, m, scale)
    # The same call with key and value materialized per head (not an expanded view).
    kc, vc = k.contiguous(), v.contiguous()
    # a closure over kc and vc: `del kc, vc` below frees them (F821: ruff reads the del as undefining them)
    fnc = lambda: F.scaled_dot_product_attention(qt, kc, vc, attn_mask=m, scale=scale)  # noqa: E731, F821
    res["contiguous"] = (time_ms(fnc, device, warmup, iters), fnc().permute(0, 2, 1, 3).float())
    res["contiguous_backend"] = sdpa_default_backend(qt, kc, vc, m, scale)
    del kc, vc
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return res
    for name in SDPA_BACKENDS:
        be = getattr(SDPBackend, name, None)
        if be is None:
            continue
        try:
            with sdpa_kernel([be]):
                o = fn()
                if device.startswith("cuda"):
                    torch.cuda.synchronize()
                res[name] = (time_ms(fn, device, warmup, iters), o.permute(0, 2, 1, 3).float())
        except RuntimeError as exc:
            res[name] = "not supported: " + str(exc).strip().splitlines()[0][:100]
    return res


TIMING = re.compile(r"timing backend=(\w+) repeat=(\d+) median_us=([0-9.]+) min_us=([0-9.]+)")

# The targets (issue 25), each against ceilings measured in the same run:
# - the K2 problem: share of the bf16 matmul ceiling;
# - every sweep point: share of its roofline bound, bound / judged time, where
#   bound = max(FLOP / bf16 matmul ceiling, minimum bytes / copy rate);
# - the latency points: microseconds (judged time), each with its own bound beside it.
KERNEL_TARGETS = {"wgmma": 0.65, "mma": 0.45}
BOUND_TARGETS = {"wgmma": 0.50, "mma": 0.35}
# (B, T, prefix_len, target us): B=1 requests at the batch sizes speculative decoding runs at.
LATENCY_POINTS = "1,9,4096,15;1,65,16384,40"

# The binary's untimed launches before its --repeat timed ones (cuda_tests: run_cuda runs the
# op once, checked, then 3 extra warm-ups, then time_cuda's 3; under --graph the graph is
# replayed twice, checked, then time_cuda's 3): used by the time estimate.
WARMUP_LAUNCHES = 7
WARMUP_REPLAYS = 5


def run_binary(binary: Path, golden: Path, out: Path, backend: str, kernel: str, repeat: int, graph: bool = False):
    """(median ms, min ms, kernel name, out, lse) or an error string ("exit 3: ..." where the
    kernel does not apply or the backend is absent). graph: `--graph` (the file holds the
    replay1.* data set too): the timing is of the captured graph's replays, out / lse of the
    second replay."""
    cmd = [str(binary), "--input", str(golden), "--output", str(out), "--backend", backend, "--repeat", str(repeat)]
    if backend == "cuda" and kernel != "auto":
        cmd += ["--kernel", kernel]
    if graph:
        cmd.append("--graph")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        return f"exit {r.returncode}: {r.stderr.strip()}"
    mt = TIMING.search(r.stdout)
    if mt is None:
        return f"no timing line in {r.stdout!r}"
    with kdtr.load(out) as f:
        res = (float(mt.group(3)) / 1e3, float(mt.group(4)) / 1e3, str(f.metadata.get("kernel", "?")),
               np.array(f.tensors["out"]), np.array(f.tensors["lse"]))
    out.unlink(missing_ok=True)
    return res


def save_input(path: Path, x: dict[str, np.ndarray], config: str, graph: bool) -> int:
    """Write x as the binary's input (input.<name>; with graph the same arrays as the first
    replay's data set, replay1.<name>, too: docs/binaries.md "Graph replay"). Returns bytes."""
    tensors = {f"input.{k}": v for k, v in x.items()}
    if graph:
        tensors.update({f"replay1.{k}": v for k, v in x.items()})
    kdtr.save(path, tensors, {"op": "verify_attn", "config": config})
    return path.stat().st_size



# ---------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------


def counts(x: dict[str, np.ndarray]) -> dict[str, float]:
    q = x["q"]
    B, T, H, Dqk = q.shape
    d_v = int(x["d_v"])
    elt = q.dtype.itemsize
    visible = dense = valid_kv_rows = 0
    for r in range(B):
        pl, tl = int(x["prefix_len"][r]), int(x["tree_len"][r])
        visible += tl * pl + int(x["visibility"][r, :tl, :tl].astype(np.int64).sum())
        dense += tl * (pl + tl)
        valid_kv_rows += pl + tl
    return {
        "qk_flop": 2.0 * H * Dqk * visible,
        "pv_flop": 2.0 * H * d_v * visible,
        "dense_flop": 2.0 * H * (Dqk + d_v) * dense,
        "bytes": float(B * T * H * Dqk * elt + valid_kv_rows * Dqk * elt + B * T * T + 8 * B
                       + B * T * H * d_v * 4 + B * T * H * 4),
        "visible_pairs": float(visible * H),
    }


def roofline(flop: float, nbytes: float, mm_tflops: float, copy_gbs: float) -> tuple[float, str]:
    """(bound in seconds, 'compute' or 'memory'): max(FLOP / matmul ceiling, bytes / copy rate)."""
    t_c, t_m = flop / (mm_tflops * 1e12), nbytes / (copy_gbs * 1e9)
    return (t_c, "compute") if t_c >= t_m else (t_m, "memory")


def judged(r: dict) -> tuple[float, str]:
    """(ms, 'graph' or 'stream'): the graph-replayed time where it was measured (an engine
    replays the op from a CUDA graph), else the stream-launched one."""
    return (r["graph_ms"], "graph") if r.get("graph_ms") is not None else (r["ms"], "stream")


def pct_summary(values: list[tuple[float, str]], target: float | None) -> str:
    """'min 12.3% (where), median 45.6%, 3 of 8 at >= 50%' over (share, where) pairs."""
    if not values:
        return "no points"
    lo = min(values, key=lambda v: v[0])
    med = statistics.median(v[0] for v in values)
    s = f"min {100 * lo[0]:.1f}% ({lo[1]}), median {100 * med:.1f}%"
    if target is not None:
        s += f", {sum(v[0] >= target for v in values)} of {len(values)} at >= {100 * target:.0f}%"
    return s


def splits_of(prefix: int, T: int, H: int, kernel: str) -> int | None:
    """Key ranges per request of the split-KV schedule (kdtr.ops.verify_attn.split_schedule)
    for the mma and wgmma kernels; None for others or where the schedule is not there."""
    if kernel not in ("mma", "wgmma") or split_schedule is None:
        return None
    return max(1, len(split_schedule(prefix, T, H)))


def target_text(kernel: str, share: float) -> str:
    """'>= 60%: met' for a kernel with a target, else '-'."""
    t = KERNEL_TARGETS.get(kernel)
    return "-" if t is None else f">= {100 * t:.0f}%: {'met' if share >= t else 'missed'}"


def kernel_family(name: str) -> str:
    """'wgmma_bf16_dqk576_dv512' -> 'wgmma' (the --kernel value that forces it)."""
    return name.split("_", 1)[0]


def gpu_name(dev: str) -> str:
    if torch is not None and dev.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                           text=True, timeout=30)
        if r.returncode == 0 and r.stdout.strip():
            return r.stdout.strip().splitlines()[0] + ("" if dev.startswith("cuda") else " (torch device cpu)")
    except (OSError, subprocess.SubprocessError):
        pass
    return "no GPU (dry run)" if not dev.startswith("cuda") else "unknown GPU"


def commit_id(explicit: str | None) -> str:
    """--commit, else $KDTR_COMMIT, else this checkout's git HEAD (+dirty)."""
    if explicit:
        return explicit
    if os.environ.get("KDTR_COMMIT"):
        return os.environ["KDTR_COMMIT"]
    try:
        h = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                           timeout=30)
        d = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, timeout=30)
        if h.returncode == 0:
            return h.stdout.strip() + ("+dirty" if d.stdout.strip() else "") + " (git HEAD of this checkout)"
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown (no git; give --commit or KDTR_COMMIT)"


def header(title: str, gpu: str, commit: str) -> str:
    cmd = "python3 " + " ".join(shlex.quote(a) for a in [str(Path(sys.argv[0]))] + sys.argv[1:])
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    tv = f", torch {torch.__version__}" if torch is not None else ""
    return f"\n## {title} ({date})\n\nCommand: `{cmd}`  \nMachine: {gpu}{tv}  \nCommit: {commit}\n\n"

_CEILINGS: dict[str, float] = {}


def get_ceilings(args) -> dict[str, float]:
    """The ceilings: given (--ceilings), else measured once per run (every table of the run
    uses the same)."""
    if _CEILINGS:
        return _CEILINGS
    if args.ceilings:
        bf, fp, cp = (float(v) for v in args.ceilings.split(","))
        ceil = {"matmul_bf16_tflops": bf, "matmul_fp32_tflops": fp, "copy_gbs": cp, "given": True}
        src = "given (--ceilings)"
    else:
        if torch is None:
            sys.exit("bench_verify_attn: torch is needed to measure the ceilings (or give --ceilings BF16,FP32,COPY)")
        t0 = time.monotonic()
        ceil = ceilings(args.device, args.matmul_n, args.copy_bytes, args.iters)
        src = f"measured, {time.monotonic() - t0:.1f} s"
    print(f"ceilings ({src}): bf16 matmul {ceil['matmul_bf16_tflops']:.1f} TFLOP/s, fp32 matmul (no TF32) "
          f"{ceil['matmul_fp32_tflops']:.1f} TFLOP/s, copy {ceil['copy_gbs']:.0f} GB/s (read + write)", flush=True)
    _CEILINGS.update(ceil)
    return _CEILINGS


def ceiling_note(args, ceil: dict[str, float]) -> str:
    how = ("given on the command line (--ceilings), not measured" if ceil.get("given") else
           f"measured in the same run ({args.matmul_n}^3 through torch; copy of {args.copy_bytes / 2**30:.0f} GiB)")
    return (f"Ceilings, {how}: bf16 matmul {ceil['matmul_bf16_tflops']:.0f} TFLOP/s, fp32 matmul (no TF32) "
            f"{ceil['matmul_fp32_tflops']:.1f} TFLOP/s, copy {ceil['copy_gbs']:.0f} GB/s (read + write).")


TIMING_NOTE = (
    "Times: the binary's `--repeat` median of device-event timings on its stream, the events recorded just before "
    "and just after one launch of the op, which for a split-KV problem is both kernels (the split attention kernel "
    "and the combine kernel, enqueued back to back on that stream); graph: the same with `--graph`, the op's "
    "launches captured once in a CUDA graph and each replay timed. Judged (% of bound, targets): the graph-replayed "
    "time where it ran (an engine replays the op from a CUDA graph), else the stream-launched one."
)


def write_out(args, title: str, gpu: str, text: str) -> None:
    if args.out:
        with open(args.out, "a", encoding="utf-8") as f:
            f.write(header(title, gpu, commit_id(args.commit)) + text)


def k2_table(args, prob: Problem, gpu: str) -> int:
    if torch is None:
        sys.exit("bench_verify_attn: the K2 table needs torch (SDPA and the float64 reference); --sweep and "
                 "--latency need it only for the ceilings")
    dev = args.device
    print(f"verify_attn bench on {gpu}: B={prob.B} T={prob.T} H={prob.H} Dqk={prob.Dqk} d_v={prob.d_v} "
          f"prefix={prob.prefix} tree={prob.tree} (node_count {prob.T - 1}); torch {torch.__version__}", flush=True)
    ceil = get_ceilings(args)

    rows = []
    sdpa_lines = []
    skipped = []
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        for dtype in [d.strip() for d in args.dtypes.split(",") if d.strip()]:
            x = synth(prob, dtype)
            c = counts(x)
            flop = c["qk_flop"] + c["pv_flop"]
            print(f"\n[{dtype}] FLOP (visible pairs only): QK {c['qk_flop'] / 1e9:.1f} G + PV {c['pv_flop'] / 1e9:.1f} G "
                  f"= {flop / 1e9:.1f} GFLOP; dense over all L keys {c['dense_flop'] / 1e9:.1f} GFLOP; "
                  f"minimum bytes {c['bytes'] / 1e6:.1f} MB; intensity {flop / c['bytes']:.0f} FLOP/B")
            golden = tmp / f"bench_{dtype}.kdtr"
            save_input(golden, x, f"bench_k2_{dtype}", args.graph)
            xt = {k: to_torch(v, dev) for k, v in x.items()}
            mask = contract_mask(xt, xt["kv_cache"].shape[1])
            ref_out, ref_lse = reference_f64(xt, mask)
            fin = torch.isfinite(ref_lse)

            sd = run_sdpa(xt, mask, dev, args.warmup, args.iters)
            sd_ms, sd_out = sd["default"]
            sd_err = float((sd_out.double() - ref_out).abs().max())
            print(f"  torch SDPA default ({sd['default_backend']}): {sd_ms:.3f} ms, max abs err out vs f64 {sd_err:.2e}")
            sc_ms, sc_out = sd["contiguous"]
            sc_err = float((sc_out.double() - ref_out).abs().max())
            print(f"  torch SDPA, K/V materialized per head ({sd['contiguous_backend']}): {sc_ms:.3f} ms, "
                  f"max abs err out vs f64 {sc_err:.2e}")
            per_backend = []
            for name in SDPA_BACKENDS:
                if name in sd:
                    v = sd[name]
                    if isinstance(v, str):
                        print(f"    {name}: {v}")
                        per_backend.append(f"{name} n/a")
                    else:
                        e = float((v[1].double() - ref_out).abs().max())
                        print(f"    {name}: {v[0]:.3f} ms, max abs err out {e:.2e}")
                        per_backend.append(f"{name} {v[0]:.3f} ms (out err {e:.1e})")
            sdpa_lines.append(f"SDPA {dtype}: default backend {sd['default_backend']}; K/V materialized per head: "
                              f"{sd['contiguous_backend']} {sc_ms:.3f} ms (out err {sc_err:.1e}); forced backends "
                              "(expanded K/V): " + "; ".join(per_backend) + ".")

            wanted = args.kernels_bf16 if dtype == "bf16" else args.kernels_fp32
            kernels = [k.strip() for k in wanted.split(",") if k.strip()]
            if args.binary_backend == "cpu":
                kernels = ["auto"]
            mm = ceil["matmul_bf16_tflops" if dtype == "bf16" else "matmul_fp32_tflops"]
            bound_s, bound_by = roofline(flop, c["bytes"], mm, ceil["copy_gbs"])
            for kern in kernels:
                if kern in ("mma", "wgmma") and dtype != "bf16":
                    continue
                res = run_binary(Path(args.bin), golden, tmp / "out.kdtr", args.binary_backend, kern, args.repeat)
                if isinstance(res, str):
                    why = "does not apply here (exit 3)" if res.startswith("exit 3") else "failed"
                    print(f"  kernel {kern}: {why}: {res}")
                    skipped.append(f"`--kernel {kern}` on {dtype} {why}: {res.splitlines()[0][:240]}")
                    continue
                ms, ms_min, name, out, lse = res
                r = {"ms": ms, "graph_ms": None}
                gtxt = "-"
                if args.graph:
                    g = run_binary(Path(args.bin), golden, tmp / "out.kdtr", args.binary_backend, kern, args.repeat,
                                   graph=True)
                    if isinstance(g, str):
                        gtxt = "failed"
                        skipped.append(f"`--kernel {kern} --graph` on {dtype} failed: {g.splitlines()[0][:240]}")
                    else:
                        r["graph_ms"] = g[0]
                        same = np.array_equal(g[3], out) and np.array_equal(g[4], lse)
                        gtxt = f"{g[0]:.3f}" + ("" if same else " (outputs differ from the stream run)")
                jms, jhow = judged(r)
                out_t, lse_t = torch.from_numpy(out).to(dev).double(), torch.from_numpy(lse).to(dev).double()
                e_out = float((out_t - ref_out).abs().max())
                e_lse = float((lse_t[fin] - ref_lse[fin]).abs().max())
                e_ks = float((out_t - sd_out.double()).abs().max())
                tflops = flop / (jms * 1e-3) / 1e12
                gbs = c["bytes"] / (jms * 1e-3) / 1e9
                share = tflops / mm
                tgt = target_text(kernel_family(name), share) if dtype == "bf16" else "-"
                pb = bound_s * 1e3 / jms
                print(f"  kernel {name}: median {ms:.3f} ms (min {ms_min:.3f}), graph {gtxt} ms; judged ({jhow}) "
                      f"{tflops:.1f} TFLOP/s ({100 * share:.1f}% of {dtype} matmul; target {tgt}), {100 * pb:.1f}% of "
                      f"its bound {bound_s * 1e3:.3f} ms ({bound_by}), {gbs:.0f} GB/s "
                      f"({100 * gbs / ceil['copy_gbs']:.1f}% of copy); max abs err vs f64: out {e_out:.2e}, "
                      f"lse {e_lse:.2e}; vs SDPA out {e_ks:.2e}", flush=True)
                rows.append([dtype, name, f"{ms:.3f}", gtxt, f"{tflops:.1f}", f"{100 * share:.1f}%", tgt,
                             f"{bound_s * 1e3:.3f} ({bound_by})", f"{100 * pb:.1f}%", f"{gbs:.0f}",
                             f"{100 * gbs / ceil['copy_gbs']:.2f}%", f"{sd_ms:.3f} ({sd['default_backend']})",
                             f"{sd_ms / jms:.2f}", f"{sc_ms:.3f} ({sd['contiguous_backend']})", f"{sc_ms / jms:.2f}",
                             f"{e_out:.2e}", f"{e_lse:.2e}", f"{sd_err:.2e} / {sc_err:.2e}"])
            del xt, mask, ref_out, ref_lse, sd
            if dev.startswith("cuda"):
                torch.cuda.empty_cache()

    head = ["dtype", "kernel", "kernel ms (stream)", "graph ms", "TFLOP/s", "% matmul ceiling (its dtype)", "target",
            "bound ms", "% of bound", "GB/s", "% copy ceiling", "torch SDPA ms (backend)", "SDPA ms / kernel ms",
            "SDPA, K/V per head, ms", "that / kernel ms", "kernel out err", "kernel lse err",
            "SDPA out err (expanded / per head)"]
    table = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]
    c = counts(synth(prob, "bf16")) if rows else None
    ridge = ceil["matmul_bf16_tflops"] * 1e12 / (ceil["copy_gbs"] * 1e9)
    notes = [
        f"Problem: B={prob.B}, T={prob.T} (node_count {prob.T - 1}, {prob.tree} trees), H={prob.H}, Dqk={prob.Dqk}, "
        f"d_v={prob.d_v}, prefix_len {prob.prefix}, S = prefix + T. TFLOP/s counts visible (row, key) pairs only"
        + (f" ({(c['qk_flop'] + c['pv_flop']) / 1e9:.1f} GFLOP; dense {c['dense_flop'] / 1e9:.1f}); "
           f"bf16 intensity {(c['qk_flop'] + c['pv_flop']) / c['bytes']:.0f} FLOP/B against a ridge point of "
           f"{ridge:.0f} FLOP/B (bf16 matmul / copy): "
           + ("compute-bound" if (c["qk_flop"] + c["pv_flop"]) / c["bytes"] >= ridge else "memory-bound") if c else "")
        + "; GB/s uses the minimum bytes; bound = max(FLOP / matmul ceiling of the dtype, minimum bytes / copy rate). "
        + ceiling_note(args, ceil) + " " + TIMING_NOTE
        + f" Targets (bf16, share of the bf16 matmul ceiling, judged time): wgmma >= {100 * KERNEL_TARGETS['wgmma']:.0f}%, "
        f"mma >= {100 * KERNEL_TARGETS['mma']:.0f}%; the fp32 row's share is of the fp32 matmul ceiling. Errors: max "
        "abs against the float64 contract.",
        *sdpa_lines,
    ]
    if skipped:
        notes.append("Not run: " + "; ".join(skipped) + ".")
    text = "\n".join(table) + "\n\n" + "\n\n".join(notes) + "\n"
    print("\n" + text)
    write_out(args, "verify_attn: kernels vs torch SDPA at Kimi K2 dims", gpu, text)
    return 0


# ---------------------------------------------------------------------------------------
# the latency points
# ---------------------------------------------------------------------------------------


def latency_points(spec: str) -> list[tuple[int, int, int, float]]:
    """'B,T,prefix,target_us;...' -> [(B, T, prefix, target us)]."""
    pts = []
    for item in spec.split(";"):
        if item.strip():
            b, t, p, us = item.split(",")
            pts.append((int(b), int(t), int(p), float(us)))
    return pts


def latency_table(args, gpu: str) -> int:
    """The latency points, each kernel stream-launched and graph-replayed, beside the target
    and the point's own roofline bound (a target below the bound cannot be met)."""
    pts = latency_points(args.latency_points)
    kernels = [k.strip() for k in args.sweep_kernels.split(",") if k.strip()]
    if args.binary_backend == "cpu":
        kernels = ["auto"]
    print(f"\nverify_attn latency points on {gpu}: " + "; ".join(f"B={b} T={t} prefix={p} <= {us:g} us" for b, t, p, us
                                                           in pts) + f"; kernels {', '.join(kernels)}", flush=True)
    ceil = get_ceilings(args)
    mm, cp = ceil["matmul_bf16_tflops"], ceil["copy_gbs"]
    rows, verdicts, errors = [], [], []
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        for b, t, p, target_us in pts:
            prob = Problem(b, t, args.heads, args.dqk, args.dv, p, args.tree, args.seed)
            x = synth(prob, "bf16")
            c = counts(x)
            flop = c["qk_flop"] + c["pv_flop"]
            bound_s, bound_by = roofline(flop, c["bytes"], mm, cp)
            bound_us = bound_s * 1e6
            golden = tmp / "latency.kdtr"
            save_input(golden, x, f"bench_latency_b{b}_t{t}_p{p}", args.graph)
            ref = None
            feasible = target_us >= bound_us
            for kern in kernels:
                res = run_binary(Path(args.bin), golden, tmp / "out.kdtr", args.binary_backend, kern,
                                 args.latency_repeat)
                if isinstance(res, str):
                    msg = res.splitlines()[0][:240]
                    print(f"  B={b} T={t} prefix={p} {kern}: {msg}")
                    errors.append(f"{kern} at B={b}, T={t}, prefix {p}: {msg}")
                    continue
                ms, _mn, name, out, lse = res
                r = {"ms": ms, "graph_ms": None}
                if args.graph:
                    g = run_binary(Path(args.bin), golden, tmp / "out.kdtr", args.binary_backend, kern,
                                   args.latency_repeat, graph=True)
                    if isinstance(g, str):
                        errors.append(f"{kern} --graph at B={b}, T={t}, prefix {p}: {g.splitlines()[0][:240]}")
                    else:
                        r["graph_ms"] = g[0]
                        if not (np.array_equal(g[3], out) and np.array_equal(g[4], lse)):
                            errors.append(f"{kern} at B={b}, T={t}, prefix {p}: graph outputs differ from stream")
                jms, jhow = judged(r)
                jus = jms * 1e3
                agree = agreement(ref, out[:1], lse[:1])
                if ref is None:
                    ref = (out[:1].astype(np.float64), lse[:1].astype(np.float64))
                fam = kernel_family(name) if kern == "auto" else kern
                met = jus <= target_us
                verdicts.append((fam, b, t, p, met))
                verdict = ("met" if met else "missed") + ("" if feasible else ", and the target is below the bound")
                nsp = splits_of(p, t, args.heads, fam)
                gus = f"{r['graph_ms'] * 1e3:.1f}" if r["graph_ms"] is not None else "-"
                print(f"  B={b} T={t} prefix={p} {name}: stream {ms * 1e3:.1f} us, graph {gus} us; bound "
                      f"{bound_us:.4g} us ({bound_by}); {100 * bound_us / jus:.1f}% of bound ({jhow}); target <= "
                      f"{target_us:g} us: {verdict}", flush=True)
                rows.append([str(b), str(t), str(p), name, "-" if nsp is None else str(nsp), f"{ms * 1e3:.1f}", gus,
                             f"{bound_us:.4g} ({bound_by})", f"{100 * bound_us / jus:.1f}%",
                             f"<= {target_us:g}" + ("" if feasible else f" (below the bound: {bound_us / target_us:.1f}x)"),
                             verdict, agree])
            golden.unlink(missing_ok=True)
    head = ["B", "T", "prefix_len", "kernel", "key ranges", "stream us", "graph us", "bound us (by)",
            "% of bound (judged)", "target us", "verdict (judged)", f"vs {kernels[0]}: max abs diff out / lse"]
    table = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]
    notes = [
        f"Latency points: H={args.heads}, Dqk={args.dqk}, d_v={args.dv}, bf16, random trees ({args.tree}) of T slots, "
        f"inputs ~ N(0, 1) (as the K2 problem); `--repeat {args.latency_repeat}`. Bound = max(FLOP / bf16 matmul "
        "ceiling, minimum bytes / copy rate), FLOP over visible (row, key) pairs (2 H (Dqk + d_v) each); a target "
        "below its point's bound cannot be met by any kernel and is reported as such, not adjusted. Key ranges: "
        "split_schedule's ranges per request (mma and wgmma). " + ceiling_note(args, ceil) + " " + TIMING_NOTE,
    ]
    for k in dict.fromkeys(v[0] for v in verdicts):
        mine = [v for v in verdicts if v[0] == k]
        notes.append(f"`{k}`: latency targets met at {sum(v[4] for v in mine)} of {len(mine)} points.")
    if errors:
        notes.append("Errors: " + "; ".join(errors) + ".")
    text = "\n".join(table) + "\n\n" + "\n\n".join(notes) + "\n"
    print("\n" + text)
    write_out(args, "verify_attn latency points (B=1)", gpu, text)
    return 1 if errors or not rows else 0


# ---------------------------------------------------------------------------------------
# the sweep
# ---------------------------------------------------------------------------------------

# Assumed rates for the time estimate (the H200 device machine; calibrated on the sweep of
# docs/benchmarks.md, 140 s real against 146 s estimated; refined while running).
EST = {
    "gen_Bps": 1.0e9,  # input bytes filled, CRC'd and written per second (numpy + kdtr.save)
    "load_Bps": 2.0e9,  # input bytes the binary maps, verifies and copies to the device
    "out_Bps": 1.0e9,  # output bytes copied back, CRC'd and written
    "setup_Bps": 1.0e9,  # bytes of the random q and KV buffers made per second
    "start_s": 0.5,  # one binary process: start, CUDA context, allocation
    "floor_s": 20e-6,  # one launch at the least (two kernels for a split problem)
    "share": 0.35,  # share of the roofline bound assumed to choose --repeat (the same for every kernel)
}
# share of its roofline bound assumed per kernel for the time estimate (the split-KV sweep of
# docs/benchmarks.md: medians 36% wgmma, 23% mma)
EST_SHARE = {"wgmma": 0.35, "mma": 0.22}


def ints(s: str) -> list[int]:
    return [int(v) for v in s.split(",") if v.strip()]


def bf16_pool(seed: int, n: int = (1 << 25) + 4099) -> np.ndarray:
    """n random bf16 values: random sign and 7 mantissa bits, exponent 2^-2 .. 2^0, so
    |x| in [0.25, 2): finite, no subnormals; made from random bits in one shot."""
    r = np.random.default_rng(seed).integers(0, 1 << 16, n, dtype=np.uint16)
    exp = (np.uint16(125) + ((r >> np.uint16(7)) & np.uint16(0xFF)) % np.uint16(3)).astype(np.uint16)
    return ((r & np.uint16(0x807F)) | (exp << np.uint16(7))).view(ml_dtypes.bfloat16)


@dataclass(frozen=True)
class Point:
    prefix: int
    B: int
    T: int

    def where(self) -> str:
        return f"prefix {self.prefix}, B {self.B}, T {self.T}"


def tiled(pool: np.ndarray, n: int, offset: int) -> np.ndarray:
    """n values: the pool, rotated by offset, repeated (one copy, no temporary)."""
    src = np.concatenate([pool[offset:], pool[:offset]])
    out = np.empty(n, pool.dtype)
    for i in range(0, n, len(src)):
        m = min(len(src), n - i)
        out[i : i + m] = src[:m]
    return out


def sweep_inputs(pt: Point, H: int, Dqk: int, d_v: int, flat_q: np.ndarray, flat_kv: np.ndarray,
                 vis: np.ndarray) -> dict[str, np.ndarray]:
    """One point's inputs: q and KV are C-contiguous views of the front of the big random
    buffers (no copy), full trees (tree_len = T)."""
    S = pt.prefix + pt.T
    return {
        "q": flat_q[: pt.B * pt.T * H * Dqk].reshape(pt.B, pt.T, H, Dqk),
        "kv_cache": flat_kv[: pt.B * S * Dqk].reshape(pt.B, S, Dqk),
        "prefix_len": np.full(pt.B, pt.prefix, np.int32),
        "tree_len": np.full(pt.B, pt.T, np.int32),
        "visibility": np.ascontiguousarray(vis[: pt.B]),
        "sm_scale": np.array(sm_scale_mla(192, 64.0), np.float32),
        "d_v": np.array(d_v, np.int32),
    }


@dataclass(frozen=True)
class Sizes:
    inp: float  # one data set's input file bytes
    out: float  # output file bytes (one replay)
    flop: float  # visible-pair FLOP, estimated (tree pairs: at most min(T, 16) ancestors a slot)
    min_bytes: float  # minimum bytes (as counts())
    bound_s: float  # roofline bound of the estimate


def point_sizes(pt: Point, H: int, Dqk: int, d_v: int, mm: float, cp: float) -> Sizes:
    """A point's sizes and estimated bound, without making its inputs."""
    S = pt.prefix + pt.T
    inp = pt.B * pt.T * H * Dqk * 2 + pt.B * S * Dqk * 2 + pt.B * pt.T * pt.T + 8 * pt.B
    out = pt.B * pt.T * H * (d_v + 1) * 4
    pairs = pt.B * pt.T * (pt.prefix + min(pt.T, 16) / 2)
    flop = 2.0 * H * (Dqk + d_v) * pairs
    bound_s, _ = roofline(flop, float(inp + out), mm, cp)
    return Sizes(float(inp), float(out), flop, float(inp + out), bound_s)


def point_repeat(sz: Sizes, args) -> int:
    est_s = max(sz.bound_s / EST["share"], EST["floor_s"])
    return int(min(args.sweep_max_repeat, max(args.sweep_min_repeat, round(args.sweep_seconds / est_s))))


def run_seconds(sz: Sizes, kern: str) -> float:
    return max(sz.bound_s / EST_SHARE.get(kern, 0.30), EST["floor_s"])


def chunk_estimate(chunk: list[Point], sizes: dict[Point, Sizes], graphed: set[Point], kernels: list[str],
                   repeat: int) -> dict[str, float]:
    """Seconds of one batch of points, by part: inputs written, binary starts + loads +
    outputs, kernel launches (warm-ups and timed), graph replays (warm-ups and timed)."""
    gen = sum(sizes[pt].inp * (2 if pt in graphed else 1) for pt in chunk) / EST["gen_Bps"]
    io = launches = replays = 0.0
    g_pts = [pt for pt in chunk if pt in graphed]
    for kern in kernels:
        io += EST["start_s"] + sum(sizes[pt].inp * (2 if pt in graphed else 1) / EST["load_Bps"]
                                   + sizes[pt].out / EST["out_Bps"] for pt in chunk)
        launches += sum((WARMUP_LAUNCHES + repeat) * run_seconds(sizes[pt], kern) for pt in chunk)
        if g_pts:
            io += EST["start_s"] + sum(2 * sizes[pt].inp / EST["load_Bps"] + 2 * sizes[pt].out / EST["out_Bps"]
                                       for pt in g_pts)
            replays += sum((WARMUP_REPLAYS + repeat) * run_seconds(sizes[pt], kern) for pt in g_pts)
    return {"inputs": gen, "io": io, "launches": launches, "replays": replays,
            "total": gen + io + launches + replays}


def make_chunks(order: list[Point], sizes: dict[Point, Sizes], graphed: set[Point], limit_bytes: float,
                most: int) -> list[list[Point]]:
    """Consecutive points grouped for one --batch process per kernel: at most `most` points
    whose inputs and outputs (one kernel's) take at most limit_bytes (a larger point alone)."""
    chunks: list[list[Point]] = []
    cur: list[Point] = []
    used = 0.0
    for pt in order:
        k = 2 if pt in graphed else 1
        b = k * (sizes[pt].inp + sizes[pt].out)
        if cur and (used + b > limit_bytes or len(cur) >= most):
            chunks.append(cur)
            cur, used = [], 0.0
        cur.append(pt)
        used += b
    if cur:
        chunks.append(cur)
    return chunks


BATCH_LINE = re.compile(r"@kdtr-batch i=(\d+) rc=(-?\d+) s=([0-9.eE+-]+) msg=(.*)")


def run_batch(binary: Path, pairs: list[tuple[Path, Path]], backend: str, kernel: str, repeat: int,
              graph: bool = False):
    """One `--batch --repeat` process (with graph: `--graph`, every input holding the
    replay1.* data set) over (input, output) pairs; per pair (median ms, min ms, kernel name,
    out[:1], lse[:1]) or an error string ("exit 3: ..." where the kernel does not apply).
    Outputs are deleted once read."""
    cmd = [str(binary), "--batch", "--backend", backend, "--repeat", str(repeat)]
    if backend == "cuda" and kernel != "auto":
        cmd += ["--kernel", kernel]
    if graph:
        cmd.append("--graph")
    for inp, out in pairs:
        cmd += ["--input", str(inp), "--output", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    res: list = [None] * len(pairs)
    timing = None
    for line in r.stdout.splitlines():
        mt = TIMING.search(line)
        if mt:
            timing = mt
            continue
        mb = BATCH_LINE.search(line)
        if not mb:
            continue
        i, rc, msg = int(mb.group(1)), int(mb.group(2)), mb.group(4).strip()
        if not 0 <= i < len(pairs):
            continue
        if rc != 0:
            res[i] = f"exit {rc}: {msg}"
        elif timing is None:
            res[i] = "no timing line"
        else:
            with kdtr.load(pairs[i][1], verify=False) as f:
                res[i] = (float(timing.group(3)) / 1e3, float(timing.group(4)) / 1e3, str(f.metadata.get("kernel", "?")),
                          np.array(f.tensors["out"][:1]), np.array(f.tensors["lse"][:1]))
        timing = None
    err = (r.stderr.strip().splitlines() or [""])[-1]
    for i in range(len(pairs)):
        pairs[i][1].unlink(missing_ok=True)
        if res[i] is None:
            res[i] = f"exit {r.returncode}: not run, the batch ended: {err}"
    return res


def pick_tmpdir(explicit: str | None, need: float) -> str | None:
    if explicit:
        return explicit
    shm = Path("/dev/shm")
    try:
        if shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > need + (1 << 30):
            return str(shm)
    except OSError:
        pass
    return None


def agreement(ref: tuple[np.ndarray, np.ndarray] | None, out0: np.ndarray, lse0: np.ndarray) -> str:
    """Max abs difference of request 0's out / lse against the first kernel's; '' for the first."""
    if not (np.isfinite(out0).all() and np.isfinite(lse0).all()):
        return "NON-FINITE output"
    if ref is None:
        return "reference"
    ro, rl = ref
    return f"{float(np.abs(out0.astype(np.float64) - ro).max()):.1e} / {float(np.abs(lse0.astype(np.float64) - rl).max()):.1e}"


def sweep(args, gpu: str) -> int:
    prefixes, batches, ts = ints(args.sweep_prefix), ints(args.sweep_batch), ints(args.sweep_t)
    H, Dqk, d_v = args.heads, args.dqk, args.dv
    kernels = [k.strip() for k in args.sweep_kernels.split(",") if k.strip()]
    if args.binary_backend == "cpu":
        kernels = ["auto"]
    print(f"\nverify_attn sweep on {gpu}: prefix_len {prefixes} x B {batches} x T {ts}, H={H} Dqk={Dqk} d_v={d_v} "
          f"bf16, kernels {', '.join(kernels)}; {len(prefixes) * len(batches) * len(ts)} points per kernel", flush=True)
    ceil = get_ceilings(args)
    mm, cp = ceil["matmul_bf16_tflops"], ceil["copy_gbs"]
    points = [Point(p, b, t) for p in prefixes for b in batches for t in ts]
    sizes = {pt: point_sizes(pt, H, Dqk, d_v, mm, cp) for pt in points}
    graphed = {pt for pt in points if args.graph and sizes[pt].bound_s * 1e6 <= args.sweep_graph_us}
    order = sorted(points, key=lambda pt: (sizes[pt].bound_s, sizes[pt].inp))  # cheap first: a budget cut drops the largest
    chunks = make_chunks(order, sizes, graphed, args.sweep_chunk_gb * 1e9, args.sweep_chunk)
    repeats = [min(point_repeat(sizes[pt], args) for pt in ch) for ch in chunks]
    parts = [chunk_estimate(ch, sizes, graphed, kernels, rep) for ch, rep in zip(chunks, repeats)]
    chunk_est = [p["total"] for p in parts]
    buf_bytes = 2.0 * (max(batches) * max(ts) * H * Dqk + max(batches) * (max(prefixes) + max(ts)) * Dqk)
    setup_est = buf_bytes / EST["setup_Bps"]
    total = setup_est + sum(chunk_est)
    part_sum = {k: sum(p[k] for p in parts) for k in ("inputs", "io", "launches", "replays")}
    since = since_start()
    print(f"estimated time: {total:.0f} s ({len(points)} points x {len(kernels)} kernels in {len(chunks)} batches per "
          f"kernel, {len(graphed)} points also graph-replayed: random buffers ~{setup_est:.0f} s, inputs written "
          f"~{part_sum['inputs']:.0f} s, binary starts + loads + outputs ~{part_sum['io']:.0f} s, launches "
          f"~{part_sum['launches']:.0f} s, graph replays ~{part_sum['replays']:.0f} s; assuming "
          + ", ".join(f"{k} at {v:.0%}" for k, v in EST_SHARE.items()) + " of the roofline bound, "
          f"{EST['gen_Bps'] / 1e9:.1f} GB/s to write inputs, {EST['load_Bps'] / 1e9:.1f} GB/s to load them, "
          f"{EST['out_Bps'] / 1e9:.1f} GB/s for outputs, {EST['start_s']} s per binary start); {since:.0f} s spent "
          "before (start, ceilings, other tables)", flush=True)
    if args.time_budget:
        acc, fit = since + setup_est, 0
        for ch, e in zip(chunks, chunk_est):
            if acc + e > args.time_budget:
                break
            acc += e
            fit += len(ch)
        cutwhere = "" if fit == len(points) else f"; the first point expected to be cut: {order[fit].where()}"
        print(f"time budget {args.time_budget:.0f} s from the start of this process: about {fit} of {len(points)} "
              f"points expected to run{cutwhere}", flush=True)
    if args.estimate_only:
        return 0
    need = max(sum((2 if pt in graphed else 1) * (sizes[pt].inp + sizes[pt].out) for pt in ch) for ch in chunks)
    t_start = time.monotonic()
    rng = np.random.default_rng(args.seed)
    pool = bf16_pool(args.seed)
    flat_q = tiled(pool, max(batches) * max(ts) * H * Dqk, 1237)
    flat_kv = tiled(pool, max(batches) * (max(prefixes) + max(ts)) * Dqk, 0)
    del pool
    vis_by_t = {t: np.stack([visibility(tree_parents(rng, t - 1, args.tree), t) for _ in range(max(batches))])
                for t in sorted(set(ts))}
    setup_s = time.monotonic() - t_start
    print(f"random q and KV buffers ({(flat_q.nbytes + flat_kv.nbytes) / 1e9:.2f} GB) and trees: {setup_s:.1f} s "
          f"(estimated {setup_est:.1f} s)", flush=True)

    results: dict[tuple[Point, str], dict] = {}
    dropped: dict[str, str] = {}
    errors: list[str] = []
    done_est = done_real = 0.0
    cut = None
    base = pick_tmpdir(args.tmpdir, need)
    with tempfile.TemporaryDirectory(prefix="kdtr_sweep.", dir=base) as td:
        tmp = Path(td)
        print(f"temporary files in {tmp} (largest batch: {need / 1e9:.2f} GB of inputs + outputs)", flush=True)
        n_done = 0
        for ci, chunk in enumerate(chunks):
            ratio = done_real / done_est if done_est > 0 else 1.0
            elapsed = since_start()
            if args.time_budget and elapsed + chunk_est[ci] * ratio > args.time_budget:
                cut = (n_done, elapsed, ci)
                break
            live = [k for k in kernels if k not in dropped]
            if not live:
                break
            t0 = time.monotonic()
            info = {}
            t_gen = time.monotonic()
            for j, pt in enumerate(chunk):
                x = sweep_inputs(pt, H, Dqk, d_v, flat_q, flat_kv, vis_by_t[pt.T])
                c = counts(x)
                golden = tmp / f"point{j}.kdtr"
                save_input(golden, x, f"sweep_p{pt.prefix}_b{pt.B}_t{pt.T}", pt in graphed)
                del x
                info[pt] = (golden, c["qk_flop"] + c["pv_flop"], c["bytes"])
            t_gen = time.monotonic() - t_gen
            repeat = repeats[ci]
            refs: dict[Point, tuple[np.ndarray, np.ndarray]] = {}
            lines: dict[Point, list[str]] = {pt: [] for pt in chunk}
            g_chunk = [pt for pt in chunk if pt in graphed]
            for kern in live:
                pairs = [(info[pt][0], tmp / f"out{j}.kdtr") for j, pt in enumerate(chunk)]
                res = dict(zip(chunk, run_batch(Path(args.bin), pairs, args.binary_backend, kern, repeat)))
                gres = {}
                if g_chunk:
                    gpairs = [(info[pt][0], tmp / f"gout{j}.kdtr") for j, pt in enumerate(g_chunk)]
                    gres = dict(zip(g_chunk, run_batch(Path(args.bin), gpairs, args.binary_backend, kern, repeat,
                                                       graph=True)))
                for pt in chunk:
                    r = res[pt]
                    if isinstance(r, str):
                        msg = r.splitlines()[0][:240]
                        if not any(k == kern for (_p, k) in results) and kern not in dropped:
                            dropped[kern] = msg
                            print(f"  kernel {kern}: {msg}: dropped from the sweep")
                        elif kern not in dropped:
                            errors.append(f"{kern} at {pt.where()}: {msg}")
                            lines[pt].append(f"{kern} {msg}")
                        continue
                    ms, ms_min, name, out0, lse0 = r
                    agree = agreement(refs.get(pt), out0, lse0)
                    refs.setdefault(pt, (out0.astype(np.float64), lse0.astype(np.float64)))
                    _g, flop, nbytes = info[pt]
                    entry = {"ms": ms, "min": ms_min, "name": name, "flop": flop, "bytes": nbytes, "repeat": repeat,
                             "agree": agree, "graph_ms": None}
                    g = gres.get(pt)
                    if isinstance(g, str):
                        errors.append(f"{kern} --graph at {pt.where()}: {g.splitlines()[0][:240]}")
                    elif g is not None:
                        entry["graph_ms"] = g[0]
                        if not (np.array_equal(g[3], out0) and np.array_equal(g[4], lse0)):
                            entry["agree"] += "; graph outputs DIFFER"
                            errors.append(f"{kern} at {pt.where()}: graph-replayed outputs differ from stream-launched")
                    results[(pt, kern)] = entry
                    gtxt = f" (graph {entry['graph_ms']:.4g} ms)" if entry["graph_ms"] is not None else ""
                    lines[pt].append(f"{kern} {ms:.4g} ms{gtxt} {flop / (judged(entry)[0] * 1e-3) / 1e12:.1f} TFLOP/s")
            for g, _f, _b in info.values():
                g.unlink(missing_ok=True)
            real = time.monotonic() - t0
            done_est += chunk_est[ci]
            done_real += real
            n_done += len(chunk)
            left = sum(chunk_est[ci + 1 :]) * (done_real / done_est)
            for pt in chunk:
                print(f"  {pt.where()}: " + "; ".join(lines[pt]))
            print(f"[batch {ci + 1}/{len(chunks)}: {len(chunk)} points ({len(g_chunk)} graph-replayed), repeat {repeat}, "
                  f"{real:.1f} s (estimated {chunk_est[ci]:.1f} s; inputs written {t_gen:.1f} s, estimated "
                  f"{parts[ci]['inputs']:.1f} s); {n_done}/{len(points)} points, {since_start():.0f} s "
                  f"since start, ~{left:.0f} s left]", flush=True)

    elapsed = time.monotonic() - t_start
    run_kernels = [k for k in kernels if any(kk == k for (_p, kk) in results)]
    head = ["prefix_len", "B", "T", "kernel", "key ranges", "blocks", "stream ms", "graph ms", "TFLOP/s",
            "% bf16 matmul", "GB/s", "bound us (by)", "% of bound", "target",
            f"vs {run_kernels[0] if run_kernels else '-'}: max abs diff out / lse (request 0)"]
    rows = []
    summary: dict[str, dict[str, list]] = {k: {"judged": [], "stream": [], "graph": 0} for k in run_kernels}
    for pt in points:
        for kern in run_kernels:
            r = results.get((pt, kern))
            if r is None:
                continue
            jms, jhow = judged(r)
            tflops = r["flop"] / (jms * 1e-3) / 1e12
            gbs = r["bytes"] / (jms * 1e-3) / 1e9
            bound_s, bound_by = roofline(r["flop"], r["bytes"], mm, cp)
            pb, pb_stream = bound_s * 1e3 / jms, bound_s * 1e3 / r["ms"]
            fam = kernel_family(r["name"]) if kern == "auto" else kern
            t = BOUND_TARGETS.get(fam)
            tgt = "-" if t is None else f">= {100 * t:.0f}%: {'met' if pb >= t else 'missed'}"
            summary[kern]["judged"].append((pb, pt.where()))
            summary[kern]["stream"].append((pb_stream, pt.where()))
            summary[kern]["graph"] += jhow == "graph"
            nsp = splits_of(pt.prefix, pt.T, H, fam)
            row_tiles = math.ceil(pt.T * H / 64)
            blocks = pt.B * row_tiles * (nsp or 1)
            rows.append([str(pt.prefix), str(pt.B), str(pt.T), r["name"], "-" if nsp is None else str(nsp), str(blocks),
                         f"{r['ms']:.4g}", "-" if r["graph_ms"] is None else f"{r['graph_ms']:.4g}", f"{tflops:.1f}",
                         f"{100 * tflops / mm:.1f}%", f"{gbs:.0f}", f"{bound_s * 1e6:.4g} ({bound_by})",
                         f"{100 * pb:.1f}%", tgt, r["agree"]])
    table = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]
    notes = [
        f"Sweep: prefix_len {prefixes} x B {batches} x T {ts} ({len(points)} points), H={H}, Dqk={Dqk}, d_v={d_v}, "
        f"bf16, full random trees (tree_len = T for every request), inputs |x| in [0.25, 2). "
        f"Bound = max(FLOP / bf16 matmul ceiling, minimum bytes / copy rate), FLOP over visible (row, key) pairs "
        f"(2 H (Dqk + d_v) each: masked tree positions not counted, so the bound is a little below the dense work "
        f"the kernels do), minimum bytes: q, the valid cache rows, visibility and lengths read once, out and lse "
        f"written once; % of bound = bound / judged time. Targets: "
        + ", ".join(f"{k} >= {100 * v:.0f}%" for k, v in BOUND_TARGETS.items())
        + " of the bound at every point. " + TIMING_NOTE + f" Repeat chosen per batch of points for about "
        f"{args.sweep_seconds} s of timed runs ({args.sweep_min_repeat}..{args.sweep_max_repeat}); graph-replayed: "
        f"the points whose estimated bound is at most {args.sweep_graph_us:g} us (there the launch gap between the "
        "two kernels is a visible share; above it the stream time stands). TFLOP/s and GB/s (minimum bytes) of the "
        "judged time. Key ranges: split_schedule's per request; blocks: the attention kernel's grid, B x ceil(T H / "
        "64) x key ranges (132 SMs on an H200). " + ceiling_note(args, ceil),
    ]
    for k in run_kernels:
        sm = summary[k]
        if not sm["judged"]:
            continue
        notes.append(f"`{k}`: {len(sm['judged'])} points ({sm['graph']} graph-replayed); % of bound (judged): "
                     f"{pct_summary(sm['judged'], BOUND_TARGETS.get(k))}; stream-launched only: "
                     f"{pct_summary(sm['stream'], None)}.")
    for k, msg in dropped.items():
        notes.append(f"`--kernel {k}` not run: {msg}.")
    if errors:
        notes.append("Errors: " + "; ".join(errors) + ".")
    if cut is not None:
        missing = [pt.where() for ch in chunks[cut[2] :] for pt in ch]
        notes.append(f"Time budget {args.time_budget:.0f} s (from the start of the process): stopped after {cut[0]} of "
                     f"{len(points)} points ({cut[1]:.0f} s; points run cheapest first, so the largest are missing: "
                     + "; ".join(missing) + ").")
    run_est = setup_est + sum(chunk_est[: (cut[2] if cut is not None else len(chunks))])
    notes.append(f"Wall time {elapsed:.0f} s (estimated beforehand: {run_est:.0f} s for the points run, {total:.0f} s "
                 "for all).")
    text = "\n".join(table) + "\n\n" + "\n\n".join(notes) + "\n"
    print("\n" + text)
    write_out(args, "verify_attn sweep: kernels over prefix_len x B x T, % of the roofline bound", gpu, text)
    return 1 if errors or not results else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default=str(ROOT / "build" / "bin" / "kdtr_verify_attn"))
    ap.add_argument("--dtypes", default="bf16,fp32")
    ap.add_argument("--kernels-bf16", default="wgmma,mma", help="binary --kernel values timed on bf16 inputs")
    ap.add_argument("--kernels-fp32", default="simt", help="... on fp32 inputs (mma and wgmma never apply)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prefix", type=int, default=4096)
    ap.add_argument("--slots", type=int, default=65, help="T = node_count + 1")
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--dqk", type=int, default=576)
    ap.add_argument("--dv", type=int, default=512)
    ap.add_argument("--tree", choices=["random", "chain"], default="random")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--repeat", type=int, default=50, help="binary --repeat")
    ap.add_argument("--graph", action=argparse.BooleanOptionalAction, default=True,
                    help="also time the binary under --graph (CUDA graph replay); --no-graph: stream launches only")
    ap.add_argument("--iters", type=int, default=30, help="timed runs for torch (SDPA, ceilings)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--matmul-n", type=int, default=8192)
    ap.add_argument("--copy-bytes", type=int, default=2 << 30)
    ap.add_argument("--ceilings", help="BF16_TFLOPS,FP32_TFLOPS,COPY_GBS: use these instead of measuring")
    ap.add_argument("--device", default="cuda", help="torch device; 'cpu' (with --binary-backend cpu) is a dry run")
    ap.add_argument("--binary-backend", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--commit", help="the commit to name in --out (default $KDTR_COMMIT, else git HEAD)")
    ap.add_argument("--out", help="append the tables (with command, date, GPU, commit) to this Markdown file")
    ap.add_argument("--k2", action="store_true", help="the K2 table also when --latency or --sweep is given")
    lat = ap.add_argument_group("latency points")
    lat.add_argument("--latency", action="store_true", help="the latency table (after the K2 table, before the sweep)")
    lat.add_argument("--latency-points", default=LATENCY_POINTS, help="'B,T,prefix,target_us;...'")
    lat.add_argument("--latency-repeat", type=int, default=200)
    sw = ap.add_argument_group("sweep")
    sw.add_argument("--sweep", action="store_true", help="the sweep over prefix_len x B x T (last)")
    sw.add_argument("--sweep-kernels", default="wgmma,mma", help="kernels of the sweep and the latency points")
    sw.add_argument("--sweep-prefix", default="1024,2048,4096,8192,16384,32768")
    sw.add_argument("--sweep-batch", default="1,2,4,8,16,64")
    sw.add_argument("--sweep-t", default="9,33,65,129")
    sw.add_argument("--sweep-seconds", type=float, default=0.25, help="timed runs per point and kernel, about")
    sw.add_argument("--sweep-min-repeat", type=int, default=5)
    sw.add_argument("--sweep-max-repeat", type=int, default=100)
    sw.add_argument("--sweep-graph-us", type=float, default=1000.0,
                    help="points whose estimated bound is at most this are graph-replayed too (with --graph)")
    sw.add_argument("--time-budget", type=float, default=0.0,
                    help="seconds from the start of this process; the sweep starts no batch that would end past it")
    sw.add_argument("--sweep-chunk", type=int, default=8, help="points per --batch process (one per kernel)")
    sw.add_argument("--sweep-chunk-gb", type=float, default=8.0, help="inputs + outputs of one batch, at most")
    sw.add_argument("--estimate-only", action="store_true", help="print the sweep's time estimate and exit")
    sw.add_argument("--tmpdir", help="where the per-point files go (default /dev/shm where it has room)")
    args = ap.parse_args()
    warnings.filterwarnings("ignore", category=UserWarning)  # SDPA explains each backend it skips
    gpu = gpu_name(args.device)
    rc = 0
    if args.estimate_only:
        return sweep(args, gpu)
    if args.k2 or not (args.latency or args.sweep):
        prob = Problem(args.batch, args.slots, args.heads, args.dqk, args.dv, args.prefix, args.tree, args.seed)
        rc |= k2_table(args, prob, gpu)
    if args.latency:
        rc |= latency_table(args, gpu)
    if args.sweep:
        rc |= sweep(args, gpu)
    return rc


if __name__ == "__main__":
    sys.exit(main())
