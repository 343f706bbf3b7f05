"""Benchmark verify_attn (build/bin/kdtr_verify_attn) at Kimi K2 dims beside torch SDPA.

Default problem (shared/DESIGN.md 7): B = 8 requests, prefix_len 4096, T = 65 tree slots
(node_count 64), H = 64 heads, Dqk = 576, d_v = 512, sm_scale = 192^-0.5 mscale^2 (yarn
factor 64), q and the latent KV ~ N(0, 1), fp32 and bf16. Visibility comes from random
draft trees of 64 nodes (parents drawn among earlier slots with depth < 16 and fewer than
8 children, recent slots favoured: deep chains with side branches, like best-first
DDTree trees), or chains (`--tree chain`).

In one run, on one GPU:
  1. the FLOP count (QK: 2 H Dqk per visible (row, key) pair, PV: 2 H d_v; masked tree
     positions not counted; the dense count over all L keys, which the kernels compute, is
     printed too) and the minimum bytes (q, valid cache rows, visibility and lengths read
     once, out and lse written once);
  2. the ceilings: a large bf16 and fp32 (no TF32) matmul through torch and a large
     device-to-device copy (bytes read + written), each the median of CUDA-event timings;
  3. the binary's kernel (`--repeat`, median of device-event timings of the kernel alone)
     for each CUDA kernel that applies (mma: bf16 tensor cores; simt: f32 FFMA);
  4. torch.nn.functional.scaled_dot_product_attention on the same inputs (q [B,H,T,Dqk],
     key/value the latent KV expanded over heads, boolean attn_mask [B,1,T,S] equal to the
     contract's mask), under the backend torch picks and under each backend that accepts
     the inputs, median of CUDA-event timings after warm-up;
  5. agreement: max abs error of the kernel's out and lse and of SDPA's out against a
     float64 evaluation of the contract (torch, on the GPU).
It ends with a Markdown table; `--out FILE` appends it with the command, date and GPU.

    python3 bench/bench_verify_attn.py [--out docs/benchmarks.md] [--dtypes bf16,fp32]

Needs torch (with CUDA), numpy, ml_dtypes and the kdtr package (PYTHONPATH=repo root).
"""

from __future__ import annotations

import argparse
import datetime
import math
import re
import shlex
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
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import kdtr  # noqa: E402
from kdtr.ops.verify_attn import sm_scale_mla  # noqa: E402


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
        ms = time_ms(lambda: a @ b, device, 3, iters)
        out[f"matmul_{name}_tflops"] = 2 * n**3 / (ms * 1e-3) / 1e12
        del a, b
    x = torch.randn(copy_bytes // 4, device=device, generator=g)
    y = torch.empty_like(x)
    ms = time_ms(lambda: y.copy_(x), device, 3, iters)
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
    fnc = lambda: F.scaled_dot_product_attention(qt, kc, vc, attn_mask=m, scale=scale)  # noqa: E731
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


def run_binary(binary: Path, golden: Path, out: Path, backend: str, kernel: str, repeat: int):
    """(median ms, min ms, kernel name, out, lse) or an error string."""
    cmd = [str(binary), "--input", str(golden), "--output", str(out), "--backend", backend, "--repeat", str(repeat)]
    if backend == "cuda":
        cmd += ["--kernel", kernel]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        return f"exit {r.returncode}: {r.stderr.strip()}"
    mt = TIMING.search(r.stdout)
    if mt is None:
        return f"no timing line in {r.stdout!r}"
    f = kdtr.load(out)
    return (float(mt.group(3)) / 1e3, float(mt.group(4)) / 1e3, str(f.metadata.get("kernel", "?")),
            np.array(f.tensors["out"]), np.array(f.tensors["lse"]))


# ---------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------


def counts(x: dict[str, np.ndarray]) -> dict[str, float]:
    q, kv = x["q"], x["kv_cache"]
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default=str(ROOT / "build" / "bin" / "kdtr_verify_attn"))
    ap.add_argument("--dtypes", default="bf16,fp32")
    ap.add_argument("--kernels", default="mma,simt",
                    help="CUDA kernels to time where they apply (binary --kernel; mma*: bf16 only)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prefix", type=int, default=4096)
    ap.add_argument("--slots", type=int, default=65, help="T = node_count + 1")
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--dqk", type=int, default=576)
    ap.add_argument("--dv", type=int, default=512)
    ap.add_argument("--tree", choices=["random", "chain"], default="random")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--repeat", type=int, default=50, help="binary --repeat")
    ap.add_argument("--iters", type=int, default=30, help="timed runs for torch (SDPA, ceilings)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--matmul-n", type=int, default=8192)
    ap.add_argument("--copy-bytes", type=int, default=2 << 30)
    ap.add_argument("--device", default="cuda", help="torch device; 'cpu' (with --binary-backend cpu) is a dry run")
    ap.add_argument("--binary-backend", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--out", help="append the table (with command, date, GPU) to this Markdown file")
    args = ap.parse_args()
    warnings.filterwarnings("ignore", category=UserWarning)  # SDPA explains each backend it skips

    dev = args.device
    gpu = torch.cuda.get_device_name(0) if dev.startswith("cuda") else "cpu (dry run)"
    prob = Problem(args.batch, args.slots, args.heads, args.dqk, args.dv, args.prefix, args.tree, args.seed)
    print(f"verify_attn bench on {gpu}: B={prob.B} T={prob.T} H={prob.H} Dqk={prob.Dqk} d_v={prob.d_v} "
          f"prefix={prob.prefix} tree={prob.tree} (node_count {prob.T - 1}); torch {torch.__version__}")

    ceil = ceilings(dev, args.matmul_n, args.copy_bytes, args.iters)
    print(f"ceilings: bf16 matmul {ceil['matmul_bf16_tflops']:.1f} TFLOP/s, fp32 matmul (no TF32) "
          f"{ceil['matmul_fp32_tflops']:.1f} TFLOP/s, copy {ceil['copy_gbs']:.0f} GB/s (read + write)")

    rows = []
    sdpa_lines = []
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
            kdtr.save(golden, {f"input.{k}": v for k, v in x.items()}, {"op": "verify_attn", "config": f"bench_k2_{dtype}"})
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

            kernels = [k.strip() for k in args.kernels.split(",") if k.strip()]
            if args.binary_backend == "cpu":
                kernels = ["auto"]
            for kern in kernels:
                if kern.startswith("mma") and dtype != "bf16":
                    continue
                res = run_binary(Path(args.bin), golden, tmp / "out.kdtr", args.binary_backend, kern, args.repeat)
                if isinstance(res, str):
                    print(f"  kernel {kern}: {res}")
                    continue
                ms, ms_min, name, out, lse = res
                out_t, lse_t = torch.from_numpy(out).to(dev).double(), torch.from_numpy(lse).to(dev).double()
                e_out = float((out_t - ref_out).abs().max())
                e_lse = float((lse_t[fin] - ref_lse[fin]).abs().max())
                e_ks = float((out_t - sd_out.double()).abs().max())
                tflops = flop / (ms * 1e-3) / 1e12
                gbs = c["bytes"] / (ms * 1e-3) / 1e9
                mm = ceil["matmul_bf16_tflops" if dtype == "bf16" else "matmul_fp32_tflops"]
                print(f"  kernel {name}: median {ms:.3f} ms (min {ms_min:.3f}), {tflops:.1f} TFLOP/s "
                      f"({100 * tflops / mm:.1f}% of {dtype} matmul), {gbs:.0f} GB/s "
                      f"({100 * gbs / ceil['copy_gbs']:.1f}% of copy); max abs err vs f64: out {e_out:.2e}, "
                      f"lse {e_lse:.2e}; vs SDPA out {e_ks:.2e}")
                rows.append([dtype, name, f"{ms:.3f}", f"{tflops:.1f}", f"{100 * tflops / mm:.1f}%", f"{gbs:.0f}",
                             f"{100 * gbs / ceil['copy_gbs']:.2f}%", f"{sd_ms:.3f} ({sd['default_backend']})",
                             f"{sd_ms / ms:.2f}", f"{sc_ms:.3f} ({sd['contiguous_backend']})", f"{sc_ms / ms:.2f}",
                             f"{e_out:.2e}", f"{e_lse:.2e}", f"{sd_err:.2e} / {sc_err:.2e}"])
            del xt, mask, ref_out, ref_lse, sd
            if dev.startswith("cuda"):
                torch.cuda.empty_cache()

    head = ["dtype", "kernel", "kernel ms", "TFLOP/s", "% matmul ceiling", "GB/s", "% copy ceiling",
            "torch SDPA ms (backend)", "SDPA ms / kernel ms", "SDPA, K/V per head, ms", "that / kernel ms",
            "kernel out err", "kernel lse err", "SDPA out err (expanded / per head)"]
    table = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]
    c = counts(synth(prob, "bf16")) if rows else None
    notes = [
        f"Problem: B={prob.B}, T={prob.T} (node_count {prob.T - 1}, {prob.tree} trees), H={prob.H}, Dqk={prob.Dqk}, "
        f"d_v={prob.d_v}, prefix_len {prob.prefix}, S = prefix + T. TFLOP/s counts visible (row, key) pairs only"
        + (f" ({(c['qk_flop'] + c['pv_flop']) / 1e9:.1f} GFLOP; dense {c['dense_flop'] / 1e9:.1f})" if c else "")
        + "; GB/s uses the minimum bytes. Ceilings measured in the same run: "
        f"bf16 matmul {ceil['matmul_bf16_tflops']:.0f} TFLOP/s, fp32 matmul (no TF32) "
        f"{ceil['matmul_fp32_tflops']:.1f} TFLOP/s ({args.matmul_n}^3, torch), copy {ceil['copy_gbs']:.0f} GB/s "
        "(read + write). Errors: max abs against the float64 contract.",
        *sdpa_lines,
    ]
    text = "\n".join(table) + "\n\n" + "\n\n".join(notes) + "\n"
    print("\n" + text)
    if args.out:
        cmd = "python3 " + " ".join(shlex.quote(a) for a in [str(Path(sys.argv[0]))] + sys.argv[1:])
        date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        with open(args.out, "a", encoding="utf-8") as f:
            f.write(f"\n## verify_attn: kernel vs torch SDPA at Kimi K2 dims ({date})\n\n"
                    f"Command: `{cmd}`  \nMachine: {gpu}, torch {torch.__version__}\n\n{text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
