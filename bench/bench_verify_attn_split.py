"""verify_attn split-KV (issue 25): each point's share of its roofline bound, on one GPU.

For each point (B requests, T tree slots, prefix_len; H = 64, Dqk = 576, d_v = 512, bf16,
every request prefix_len + T keys, a random draft tree of T slots as visibility) and each
kernel (`--kernels`, default wgmma,mma: forced with the binary's --kernel), the binary
build/bin/kdtr_verify_attn times one launch (`--repeat`, median of device-event timings;
with --graph also the replay of a captured CUDA graph). Both launches of a split problem
(attention and combine) are inside the timed region.

    bound = max(FLOP / bf16 matmul ceiling, minimum bytes / copy rate)

FLOP counts the visible (row, key) pairs, 2 H (Dqk + d_v) each; minimum bytes are q, the
valid cache rows, visibility and lengths read once, out and lse written once. The ceilings
(a 8192^3 bf16 torch matmul, a 1 GiB device-to-device copy, medians of CUDA-event timings)
are measured in the same run unless `--ceilings BF16_TFLOPS,COPY_GBPS` gives them.
Targets: every point >= 50% of its bound (wgmma) / 35% (mma); B=1, T=9, prefix 4096 <= 15
us; B=1, T=65, prefix 16384 <= 40 us. Prints one line per point and kernel, then per kernel
the minimum and median % of bound and the points that met the target; `--out FILE` appends
a Markdown table. `--time-budget S` stops before a point once S seconds have passed.

    python3 bench/bench_verify_attn_split.py [--points "B,T,P;..."] [--graph] [--time-budget 240] [--out FILE]

Inputs come from a pool of random bf16 values (|x| ~ N(0, 1)) tiled to size, written as one
KDTR file per point (with replay1.* copies for --graph) in /dev/shm, deleted after it.
"""

from __future__ import annotations

import argparse
import datetime
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ml_dtypes
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import kdtr  # noqa: E402

H, DQK, DV = 64, 576, 512
TIMING = re.compile(r"median_us=([0-9.]+)")
TARGET = {"wgmma": 50.0, "mma": 35.0}
LATENCY = {(1, 9, 4096): 15.0, (1, 65, 16384): 40.0}
DEFAULT_POINTS = [(b, t, p) for p in (1024, 4096, 16384, 32768) for t in (9, 33, 65, 129) for b in (1, 2, 4, 8, 16, 64)]


def ceilings() -> tuple[float, float]:
    import torch

    def med(fn, n=20):
        ts = []
        for _ in range(n):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            ts.append(a.elapsed_time(b) * 1e-3)
        return statistics.median(ts)

    n = 8192
    x = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        x @ y
    tf = 2 * n**3 / med(lambda: x @ y) / 1e12
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    gbps = 2 * src.numel() / med(lambda: dst.copy_(src)) / 1e9
    return tf, gbps


def tree_vis(rng: np.random.Generator, t: int) -> np.ndarray:
    vis = np.zeros((t, t), np.uint8)
    for i in range(t):
        if i:
            vis[i] = vis[int(rng.integers(max(0, i - 4), i))]
        vis[i, i] = 1
    return vis


def point_inputs(rng: np.random.Generator, pool: np.ndarray, b: int, t: int, p: int) -> dict[str, np.ndarray]:
    """The op's inputs at one point: B=b requests of T=t slots, prefix_len p (module docstring)."""
    return {
        "q": np.resize(pool, (b, t, H, DQK)),
        "kv_cache": np.resize(pool[7:], (b, p + t, DQK)),
        "prefix_len": np.full(b, p, np.int32),
        "tree_len": np.full(b, t, np.int32),
        "visibility": np.stack([tree_vis(rng, t) for _ in range(b)]),
        "sm_scale": np.array(0.1, np.float32),
        "d_v": np.array(DV, np.int32),
    }


def write_inputs(path: Path, x: dict[str, np.ndarray], graph: bool) -> None:
    tens = {f"input.{k}": v for k, v in x.items()}
    if graph:
        tens.update({f"replay1.{k}": v for k, v in x.items()})
    kdtr.save(path, tens, {"op": "verify_attn"})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default=str(ROOT / "build" / "bin" / "kdtr_verify_attn"))
    ap.add_argument("--kernels", default="wgmma,mma")
    ap.add_argument("--points", help='"B,T,prefix;..." (default: prefix 1K..32K x T 9..129 x B 1..64)')
    ap.add_argument("--graph", action="store_true", help="also time the graph replay")
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--ceilings", help="BF16_TFLOPS,COPY_GBPS (skip measuring them)")
    ap.add_argument("--time-budget", type=float, default=1e9)
    ap.add_argument("--label", default="", help="a name for the binary in the table")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--write-input", type=Path, help="write the first point's input file here and stop (for ncu)")
    args = ap.parse_args()
    t_start = time.time()
    pts = [tuple(int(v) for v in p.split(",")) for p in args.points.split(";")] if args.points else DEFAULT_POINTS
    pts.sort(key=lambda p: p[0] * p[1] * (p[2] + p[1]))
    tf, gbps = (float(v) for v in args.ceilings.split(",")) if args.ceilings else ceilings()
    print(f"ceilings: bf16 matmul {tf:.1f} TFLOP/s, copy {gbps:.0f} GB/s", flush=True)
    kernels = args.kernels.split(",")
    rng = np.random.default_rng(0)
    pool = rng.standard_normal(1 << 22, dtype=np.float32).astype(ml_dtypes.bfloat16)
    rows, pct = [], {k: [] for k in kernels}
    with tempfile.TemporaryDirectory(dir="/dev/shm" if Path("/dev/shm").is_dir() else None) as td:
        for b, t, p in pts:
            if time.time() - t_start > args.time_budget:
                print(f"time budget reached: {len(rows)} rows done; stopping before B={b} T={t} prefix={p}")
                break
            s = p + t
            x = point_inputs(rng, pool, b, t, p)
            vis = x["visibility"]
            g = Path(td) / "in.kdtr"
            write_inputs(g, x, args.graph)
            if args.write_input:
                write_inputs(args.write_input, x, args.graph)
                print(f"wrote {args.write_input} (B={b} T={t} prefix={p})")
                return 0
            pairs = b * H * (t * p + int(vis.astype(np.int64).sum()))
            flop = 2.0 * pairs * (DQK + DV)
            nbytes = 2 * (b * t * H * DQK + b * s * DQK) + b * t * t + 8 * b + 4 * b * t * H * (DV + 1)
            bound_us = max(flop / (tf * 1e12), nbytes / (gbps * 1e9)) * 1e6
            for k in kernels:
                us = []
                for graph in [False, True] if args.graph else [False]:
                    cmd = [
                        args.bin,
                        "--input",
                        str(g),
                        "--output",
                        f"{td}/o.kdtr",
                        "--backend",
                        "cuda",
                        "--kernel",
                        k,
                        "--repeat",
                        str(args.repeat),
                    ] + (["--graph"] if graph else [])
                    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
                    m = TIMING.search(r.stdout + r.stderr)
                    if not m:
                        print(f"B={b} T={t} prefix={p} {k}: exit {r.returncode}: {r.stderr.strip()[-300:]}")
                    us.append(float(m.group(1)) if m else float("nan"))
                share = 100.0 * bound_us / us[0]
                pct[k].append(share)
                lat = LATENCY.get((b, t, p))
                rows.append((b, t, p, k, us, bound_us, share, lat))
                gtxt = f", graph {us[1]:.1f} us" if args.graph else ""
                ltxt = f", target <= {lat:.0f} us: {'met' if us[0] <= lat else 'missed'}" if lat else ""
                print(
                    f"B={b:3} T={t:3} prefix={p:6} {k:6} {us[0]:10.1f} us{gtxt}  bound {bound_us:8.1f} us  "
                    f"{share:5.1f}% of bound ({'met' if share >= TARGET.get(k, 0) else 'missed'}){ltxt}",
                    flush=True,
                )
            g.unlink()
    summary = []
    for k in kernels:
        v = [x for x in pct[k] if x == x]
        if v:
            met = sum(x >= TARGET.get(k, 0) for x in v)
            summary.append(
                f"{k}: {len(v)} points, min {min(v):.1f}%, median {statistics.median(v):.1f}% of bound; "
                f"{met} at >= {TARGET.get(k, 0):.0f}%"
            )
    print("\n".join(summary))
    if args.out:
        with args.out.open("a") as fh:
            fh.write(
                f"\n### {args.label or args.bin} ({datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC)\n\n"
            )
            fh.write(
                f"Command: `python3 bench/bench_verify_attn_split.py {' '.join(sys.argv[1:])}`; ceilings bf16 "
                f"{tf:.1f} TFLOP/s, copy {gbps:.0f} GB/s.\n\n"
            )
            fh.write("| B | T | prefix | kernel | us | graph us | bound us | % of bound | latency target |\n")
            fh.write("| ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | --- |\n")
            for b, t, p, k, us, bound_us, share, lat in rows:
                gs = f"{us[1]:.1f}" if len(us) > 1 else "-"
                ls = f"<= {lat:.0f} us: {'met' if us[0] <= lat else 'missed'}" if lat else ""
                fh.write(f"| {b} | {t} | {p} | {k} | {us[0]:.1f} | {gs} | {bound_us:.1f} | {share:.1f}% | {ls} |\n")
            fh.write("\n" + "\n".join(f"- {s}" for s in summary) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
