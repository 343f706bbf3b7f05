"""Compare builds of the Hopper verify_attn kernel of one tree (tools/seesaw_variants.sh device).

    python3 tools/seesaw_check.py TREE VARIANTS

TREE: the base build's tree (its bench/bench_verify_attn.py gives synth, the float64 reference
and run_binary; its golden/ the goldens); VARIANTS: comma-separated names v, each built in
/tmp/ss-v (build/bin/kdtr_verify_attn), the first the baseline.  On one GPU, for K2-shaped
problems (H 64, Dqk 576, d_v 512, random draft trees; L = prefix + T from 126, one refill of
the double buffer, to 4161) each variant runs with --kernel wgmma: median and minimum kernel
time (--repeat), max |out - f64| and |lse - f64| over the rows the reference leaves finite,
NaN count in those rows, max |out - baseline out|.  Then every bf16 verify_attn golden of
TREE: max |out - expected| on finite rows and whether the NaN pattern is the expected one.
Needs torch with CUDA, numpy, ml_dtypes and TREE's kdtr package on PYTHONPATH.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

TREE = Path(sys.argv[1])
VARIANTS = sys.argv[2].split(",")
sys.path.insert(0, str(TREE / "bench"))
import bench_verify_attn as bv  # noqa: E402  (TREE's bench module)

import kdtr  # noqa: E402

TMP = Path("/tmp/seesaw-check")
PROBLEMS = [(8, 65, 61), (8, 65, 130), (8, 65, 200), (2, 65, 1000), (8, 65, 4096), (1, 9, 4096)]  # (B, T, prefix)


def binary(v: str) -> Path:
    return Path(f"/tmp/ss-{v}/build/bin/kdtr_verify_attn")


def max_abs(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b))) if a.size else 0.0


def problems() -> None:
    for batch, slots, prefix in PROBLEMS:
        prob = bv.Problem(batch, slots, 64, 576, 512, prefix, "random", 7)
        x = bv.synth(prob, "bf16")
        golden = TMP / f"p{batch}_{slots}_{prefix}.kdtr"
        kdtr.save(golden, {f"input.{k}": v for k, v in x.items()}, {"op": "verify_attn", "config": "seesaw"})
        xt = {k: bv.to_torch(v, "cuda") for k, v in x.items()}
        mask = bv.contract_mask(xt, xt["kv_cache"].shape[1])
        ref_out, ref_lse = (t.cpu().numpy() for t in bv.reference_f64(xt, mask))
        fin = np.isfinite(ref_lse)
        repeat = 30 if prefix >= 1000 else 50
        runs = {v: bv.run_binary(binary(v), golden, TMP / f"o_{v}.kdtr", "cuda", "wgmma", repeat) for v in VARIANTS}
        base = runs[VARIANTS[0]]
        for v, r in runs.items():
            head = f"B={batch} T={slots} prefix={prefix} L={prefix + slots} tiles={-(-(prefix + slots) // 64)} {v:5s}"
            if isinstance(r, str):
                print(f"{head}: {r}", flush=True)
                continue
            ms, ms_min, name, out, lse = r
            out, lse = out.reshape(ref_out.shape).astype(np.float64), lse.reshape(ref_lse.shape).astype(np.float64)
            vs_base = max_abs(out, base[3].reshape(ref_out.shape)) if not isinstance(base, str) else float("nan")
            print(f"{head} {name}: median {ms * 1e3:8.1f} us min {ms_min * 1e3:8.1f} us | max|out-f64| "
                  f"{max_abs(out[fin], ref_out[fin]):.2e} max|lse-f64| {max_abs(lse[fin], ref_lse[fin]):.2e} "
                  f"NaN in finite rows {int(np.isnan(out[fin]).sum())} max|out-{VARIANTS[0]}| {vs_base:.2e}",
                  flush=True)


def goldens() -> None:
    for golden in sorted((TREE / "golden" / "verify_attn").glob("*bf16*.kdtr")):
        with kdtr.load(golden) as f:
            exp_out = np.array(f.tensors["expected.out"]).astype(np.float64)
            exp_lse = np.array(f.tensors["expected.lse"]).astype(np.float64)
        fin = np.isfinite(exp_lse)
        for v in VARIANTS:
            r = bv.run_binary(binary(v), golden, TMP / f"g_{v}.kdtr", "cuda", "wgmma", 1)
            if isinstance(r, str):
                print(f"golden {golden.name} {v}: {r[:100]}", flush=True)
                continue
            out = r[3].reshape(exp_out.shape).astype(np.float64)
            lse = r[4].reshape(exp_lse.shape).astype(np.float64)
            same_nan = bool((np.isnan(out) == np.isnan(exp_out)).all() and (np.isnan(lse) == np.isnan(exp_lse)).all())
            print(f"golden {golden.name} {v}: max|out-expected| {max_abs(out[fin], exp_out[fin]):.2e} "
                  f"NaN pattern as expected {same_nan}", flush=True)


if __name__ == "__main__":
    TMP.mkdir(exist_ok=True)
    problems()
    goldens()
