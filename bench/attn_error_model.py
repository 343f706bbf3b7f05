"""Measure how far an f32-accumulating verify_attn lands from the float64 reference.

Simulates two kernel styles in numpy over many seeds of each verify_attn configuration:
  f32:  scores, exp, sums and P.V in float32 (sgemm accumulation)
  bf16p: as f32, but the softmax weights P rounded to bf16 before P.V (tensor-core style)
and prints the worst max-abs error of out and lse per config. The verify_attn tolerances
(kdtr/generators/gen_verify_attn_refs.py, docs/ops/verify_attn.md) are set from these numbers.

    python3 bench/attn_error_model.py [--seeds 20]
"""

from __future__ import annotations

import argparse
import dataclasses

import ml_dtypes
import numpy as np

from kdtr.generators import gen_verify_attn_refs as gen
from kdtr.generators.rng import Rng
from kdtr.ops.verify_attn import verify_attn_f64


def simulate(x, round_p: bool):
    q, kv = x["q"], x["kv_cache"]
    b, t, h, _ = q.shape
    d_v = int(x["d_v"])
    out = np.zeros((b, t, h, d_v), np.float32)
    lse = np.full((b, t, h), -np.inf, np.float32)
    scale = np.float32(x["sm_scale"])
    for r in range(b):
        pl, tl = int(x["prefix_len"][r]), int(x["tree_len"][r])
        keys = kv[r, : pl + tl].astype(np.float32)
        qr = q[r, :tl].astype(np.float32)
        s = np.einsum("thd,ld->thl", qr, keys).astype(np.float32) * scale
        mask = np.ones((tl, pl + tl), bool)
        mask[:, pl:] = x["visibility"][r, :tl, :tl] != 0
        s = np.where(mask[:, None, :], s, np.float32(-np.inf))
        m = s.max(axis=-1, keepdims=True)
        p = np.exp(s - m).astype(np.float32)
        den = p.sum(axis=-1, keepdims=True, dtype=np.float32)
        if round_p:
            p = p.astype(ml_dtypes.bfloat16).astype(np.float32)
        out[r, :tl] = np.einsum("thl,lv->thv", p, keys[:, :d_v]).astype(np.float32) / den
        lse[r, :tl] = (m + np.log(den))[..., 0]
    return out, lse


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=20)
    args = ap.parse_args()
    print("| config | dtype | worst out err (f32) | worst out err (P in bf16) | worst lse err | contract out atol | contract lse atol |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, cfg in gen.CONFIGS.items():
        if cfg.tier != "committed" or cfg.nonfinite or cfg.special:  # the softmax-aimed ones: their own tests
            continue
        worst = np.zeros(3)
        for k in range(args.seeds):
            c = dataclasses.replace(cfg, seed=cfg.seed * 1000 + k)
            x = gen.synth(c, Rng(c.seed))  # the generators' draws
            ref_out, ref_lse = verify_attn_f64(x["q"], x["kv_cache"], x["prefix_len"], x["tree_len"],
                                               x["visibility"], float(x["sm_scale"]), int(x["d_v"]))
            valid = np.isfinite(ref_lse)
            for j, round_p in enumerate((False, True)):
                o, lz = simulate(x, round_p)
                worst[j] = max(worst[j], float(np.abs(o - ref_out).max()))
                worst[2] = max(worst[2], float(np.abs(lz[valid] - ref_lse[valid]).max()))
        tol = gen.tolerances(gen.synth(cfg, Rng(cfg.seed)))  # the golden's own contract
        print(f"| {name} | {cfg.dtype} | {worst[0]:.2e} | {worst[1]:.2e} | {worst[2]:.2e} | "
              f"{tol['out'].atol:.2e} | {tol['lse'].atol:.2e} |")


if __name__ == "__main__":
    main()
