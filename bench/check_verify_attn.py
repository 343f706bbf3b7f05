"""Edge-case check of build/bin/kdtr_verify_attn beyond the committed goldens.

Random problems chosen for the kernels' code paths (odd dims that rule out vector loads
or the tensor-core kernel, d_v > 512 split over blocks, Dqk between the mma instances,
tree_len 0, prefix_len 0, rows with no visible key, tiles that straddle the prefix end,
T*H not a multiple of 64), poisoned like the goldens (NaN in q rows >= tree_len and
cache rows >= prefix_len + tree_len, 1 in visibility outside the valid square). Each
runs on every backend and CUDA kernel that applies; outputs are compared with the
float64 reference (kdtr.ops.verify_attn) under the goldens' tolerance model
(docs/ops/verify_attn.md, "Tolerances"); padding rows and empty rows must be exactly
0 / -inf. The ``*_nonfinite_*`` cases put NaN and infinities inside the valid region
(kdtr.generators.gen_verify_attn_refs.inject_nonfinite, one kind per request, at K2 dims with
prefixes past one 64-key tile, and with d_v > 512): a row must be NaN (lse and every out
element) exactly where the reference's is (docs/ops/verify_attn.md, "NaN and
infinities"), and no NaN may appear elsewhere.

    python3 bench/check_verify_attn.py [--bin build/bin/kdtr_verify_attn] [--backend cpu --backend cuda]

Exit 0 when every run passes, 1 otherwise. Prints one line per run.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import kdtr  # noqa: E402
from kdtr.generators import gen_verify_attn_refs as gen  # noqa: E402
from kdtr.ops.verify_attn import verify_attn_f64  # noqa: E402

U32 = 2.0**-24


@dataclass(frozen=True)
class Case:
    name: str
    dtype: str
    B: int
    T: int
    H: int
    Dqk: int
    d_v: int
    prefix: tuple[int, ...]
    tree_len: tuple[int, ...]
    empty_rows: bool = False  # blank some visibility rows (with prefix 0: rows with no key)
    nonfinite: tuple[str, ...] = ()  # per request: gen.inject_nonfinite kinds


CASES = [
    Case("odd_f32", "f32", 3, 7, 3, 40, 24, (0, 13, 70), (7, 0, 3)),
    Case("odd_bf16", "bf16", 3, 7, 3, 40, 24, (0, 13, 70), (7, 0, 3)),
    Case("dqk66_f32", "f32", 2, 9, 5, 66, 33, (17, 64), (9, 5)),
    Case("dqk66_bf16", "bf16", 2, 9, 5, 66, 33, (17, 64), (9, 5)),
    Case("dqk136_bf16", "bf16", 2, 13, 5, 136, 100, (60, 3), (13, 12)),
    Case("k2_empty_rows_bf16", "bf16", 2, 9, 64, 576, 512, (0, 70), (9, 6), empty_rows=True),
    Case("k2_empty_rows_f32", "f32", 2, 9, 64, 576, 512, (0, 70), (9, 6), empty_rows=True),
    Case("dv600_f32", "f32", 2, 5, 2, 640, 600, (30, 0), (5, 4)),
    Case("dv600_bf16", "bf16", 2, 5, 2, 640, 600, (30, 0), (5, 4)),
    Case("th231_f32", "f32", 2, 33, 7, 72, 64, (60, 129), (17, 33)),
    Case("th231_bf16", "bf16", 2, 33, 7, 72, 64, (60, 129), (17, 33)),
    Case("dv1_bf16", "bf16", 1, 4, 16, 32, 1, (5,), (3,)),
    Case("all_empty_f32", "f32", 2, 4, 2, 16, 8, (0, 3), (0, 0)),
    Case("k2_nonfinite_bf16", "bf16", 7, 9, 64, 576, 512, (70, 70, 3, 70, 65, 0, 0), (9,) * 7,
         nonfinite=gen.NONFINITE_KINDS),
    Case("k2_nonfinite_f32", "f32", 7, 9, 64, 576, 512, (70, 70, 3, 70, 65, 0, 0), (9,) * 7,
         nonfinite=gen.NONFINITE_KINDS),
    Case("dv600_nonfinite_f32", "f32", 7, 5, 2, 640, 600, (30, 64, 2, 3, 66, 0, 0), (5,) * 7,
         nonfinite=gen.NONFINITE_KINDS),
    # split-KV (docs/ops/verify_attn.md, "Split-KV"; kdtr.ops.verify_attn.split_schedule) of
    # the mma and wgmma kernels: requests split into 2..16 key ranges beside unsplit ones
    Case("split_k2_bf16", "bf16", 1, 9, 64, 576, 512, (4096,), (9,)),
    Case("split_ragged_bf16", "bf16", 5, 9, 2, 72, 64, (256, 0, 1000, 513, 3000), (1, 9, 5, 0, 9)),
    Case("split_odd_dv_bf16", "bf16", 2, 5, 3, 136, 65, (700, 1800), (5, 2)),
    Case("split_empty_rows_bf16", "bf16", 1, 300, 1, 64, 64, (0,), (300,), empty_rows=True),
    Case("split_nonfinite_k2_bf16", "bf16", 7, 9, 64, 576, 512, (1000, 700, 300, 1000, 650, 0, 0), (9,) * 7,
         nonfinite=gen.NONFINITE_KINDS),
    Case("split_nonfinite_bf16", "bf16", 7, 3, 2, 64, 64, (1000, 700, 300, 1000, 650, 0, 0), (3,) * 7,
         nonfinite=gen.NONFINITE_KINDS),
]


def synth(c: Case, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    prefix = np.array(c.prefix, np.int32)
    tree_len = np.array(c.tree_len, np.int32)
    s = int((prefix + c.T).max()) + 3
    dt = np.float32 if c.dtype == "f32" else ml_dtypes.bfloat16
    q = rng.standard_normal((c.B, c.T, c.H, c.Dqk)).astype(dt)
    kv = rng.standard_normal((c.B, s, c.Dqk)).astype(dt)
    vis = np.zeros((c.B, c.T, c.T), np.uint8)
    for r in range(c.B):
        tl = int(tree_len[r])
        parents = [-1] + [int(rng.integers(0, i)) for i in range(1, tl)]
        for i in range(tl):
            if i:
                vis[r, i] = vis[r, parents[i]]
            vis[r, i, i] = 1
        if c.empty_rows and tl > 2:
            vis[r, 1, :tl] = 0  # no tree key: with prefix 0, no key at all
            vis[r, tl - 1, :tl] = 0
    gen.poison(q, kv, vis, prefix, tree_len)
    x = {
        "q": q,
        "kv_cache": kv,
        "prefix_len": prefix,
        "tree_len": tree_len,
        "visibility": vis,
        "sm_scale": np.array(c.Dqk**-0.5, np.float32),
        "d_v": np.array(c.d_v, np.int32),
    }
    if c.nonfinite:
        gen.inject_nonfinite(x, c.nonfinite)
    return x


def tolerance(x: dict[str, np.ndarray]) -> tuple[float, float, float]:
    """(out atol, lse atol, lse rtol): the goldens' model (docs/ops/verify_attn.md);
    non-finite scores and values are left out, as in gen.tolerances."""
    smax, vmax = 1.0, 1.0
    for r in range(x["q"].shape[0]):
        pl, tl = int(x["prefix_len"][r]), int(x["tree_len"][r])
        if tl == 0:
            continue
        keys = x["kv_cache"][r, : pl + tl].astype(np.float64)
        qr = x["q"][r, :tl].astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            a = np.abs(np.einsum("thd,ld->thl", qr, keys))
        a = a[np.isfinite(a)]
        v = np.abs(keys[:, : int(x["d_v"])])
        v = v[np.isfinite(v)]
        smax = max(smax, float(a.max()) * float(x["sm_scale"]) if a.size else 0.0)
        vmax = max(vmax, float(v.max()) if v.size else 0.0)
    out_atol = max(1e-5, 2 * U32 * smax * vmax)
    if x["q"].dtype != np.float32:
        out_atol += 2.0**-8 * vmax
    return out_atol, max(1e-5, 8 * U32 * smax), 4 * U32


def check(binary: Path, backend: str, kernel: str, golden: Path, x, ref_out, ref_lse, tol, tmp: Path) -> tuple[str, str]:
    outp = tmp / "out.kdtr"
    cmd = [str(binary), "--input", str(golden), "--output", str(outp), "--backend", backend]
    if kernel != "auto":
        cmd += ["--kernel", kernel]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode == 3:
        return "NOT_SUPPORTED", r.stderr.strip()
    if r.returncode != 0:
        return "FAIL", f"exit {r.returncode}: {r.stderr.strip()}"
    f = kdtr.load(outp)
    out, lse = np.asarray(f.tensors["out"]), np.asarray(f.tensors["lse"])
    name = f.metadata.get("kernel", "?")
    nan_rows = np.isnan(ref_lse)  # the reference's NaN rows: lse and every out element NaN
    if not (np.array_equal(np.isnan(lse), nan_rows) and np.array_equal(np.isnan(out).any(-1), nan_rows)
            and np.isnan(out[nan_rows]).all()):
        return "FAIL", f"{name}: NaN rows differ from the reference's ({int(nan_rows.sum())} NaN rows expected)"
    empty = ref_lse == -np.inf
    if not (np.all(out[empty] == 0) and np.all(lse[empty] == -np.inf)):
        return "FAIL", f"{name}: empty/padding rows are not exactly 0 / -inf"
    fin = np.isfinite(ref_lse)
    eo = float(np.abs(out[fin].astype(np.float64) - ref_out[fin]).max()) if fin.any() else 0.0
    el = float(np.abs(lse[fin].astype(np.float64) - ref_lse[fin]).max()) if fin.any() else 0.0
    lse_ok = np.all(np.abs(lse[fin].astype(np.float64) - ref_lse[fin]) <= tol[1] + tol[2] * np.abs(ref_lse[fin]))
    ok = eo <= tol[0] and bool(lse_ok)
    return ("PASS" if ok else "FAIL"), f"{name}: max abs err out {eo:.3e} (atol {tol[0]:.1e}), lse {el:.3e}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default=str(ROOT / "build" / "bin" / "kdtr_verify_attn"))
    ap.add_argument("--backend", action="append", choices=["cpu", "cuda"])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--only", action="append", help="run only the cases whose name starts with this (repeatable)")
    ap.add_argument("--keep", type=Path, help="write each case's input KDTR file into this directory and keep it")
    args = ap.parse_args()
    backends = args.backend or ["cpu", "cuda"]
    failures = 0
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        for k, c in enumerate(CASES):
            if args.only and not any(c.name.startswith(o) for o in args.only):
                continue
            x = synth(c, args.seed * 1000 + k)
            if args.keep:
                args.keep.mkdir(parents=True, exist_ok=True)
            golden = (args.keep or tmp) / f"{c.name}.kdtr"
            kdtr.save(golden, {f"input.{n}": v for n, v in x.items()}, {"op": "verify_attn", "config": c.name})
            ref_out, ref_lse = verify_attn_f64(x["q"], x["kv_cache"], x["prefix_len"], x["tree_len"],
                                               x["visibility"], float(x["sm_scale"]), int(x["d_v"]))
            tol = tolerance(x)
            runs = [(b, "auto") for b in backends]
            if "cuda" in backends:
                runs += [("cuda", "simt"), ("cuda", "mma"), ("cuda", "wgmma")]
            for backend, kernel in runs:
                status, msg = check(Path(args.bin), backend, kernel, golden, x, ref_out, ref_lse, tol, tmp)
                # mma and wgmma must run wherever the kernel claims it applies (bf16, Dqk % 8 == 0,
                # Dqk <= 576, d_v <= 512; wgmma also needs a compute capability 9.0 device and a
                # build with the Hopper kernel, which the H200 runs of this script have)
                mma_applies = c.dtype == "bf16" and c.Dqk % 8 == 0 and c.Dqk <= 576 and c.d_v <= 512
                if status == "NOT_SUPPORTED" and kernel in ("mma", "wgmma") and not mma_applies:
                    status = "SKIP"
                if status == "NOT_SUPPORTED" and backend == "cuda" and kernel == "auto":
                    status = "SKIP"  # no GPU here
                failures += status not in ("PASS", "SKIP")
                print(f"{status:5} {c.name:20} {backend:4} {kernel:7} {msg}")
    print(f"failures: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
