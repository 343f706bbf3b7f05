"""Goldens for verify_attn (shared/DESIGN.md 3.3, docs/ops/verify_attn.md).

Visibility comes from real draft-tree shapes (random best-first-like trees, chains,
stars). Everything a correct kernel must not read is poisoned: q rows past tree_len and
cache rows past prefix_len + tree_len are NaN, visibility entries outside the valid
square are 1. Tolerances are computed per golden from the data (see
``tolerances`` and docs/ops/verify_attn.md, "Tolerances").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from kdtr.contract import Contract
from kdtr.ops.verify_attn import sm_scale_mla, verify_attn_f64

from .golden import package

from .trees import chain_tree, random_tree

OP = "verify_attn"
GENERATOR_VERSION = 1
U32 = 2.0**-24  # unit roundoff of f32
U_BF16 = 2.0**-8  # unit roundoff of bf16
K2_SCALE = float(np.float32(sm_scale_mla(192, 64.0)))  # 0.144680 (Kimi K2: yarn factor 64)


@dataclass(frozen=True)
class Config:
    description: str
    seed: int
    batch: int
    slots: int  # T
    heads: int
    dqk: int
    d_v: int
    prefix: tuple[int, ...]  # prefix_len per request (cycled over the batch)
    dtype: str = "f32"
    shape: str = "random"  # random | chain | star
    q_scale: float = 1.0
    sm_scale: float = 0.0  # 0: Dqk^-0.5
    tree_len: tuple[int, ...] = ()  # per request (cycled); empty: full trees (T)
    tier: str = "committed"


CONFIGS: dict[str, Config] = {
    "small": Config("H=4, Dqk=72, d_v=64: generic small dims", 3001, 2, 9, 4, 72, 64, (37, 20)),
    "small_bf16": Config("small dims with bf16 inputs", 3002, 2, 9, 4, 72, 64, (37, 20), dtype="bf16"),
    "no_prefix": Config("prefix_len 0: only the tree is visible", 3003, 2, 9, 4, 72, 64, (0,)),
    "ragged": Config("different prefix_len and tree_len per request, incl. tree_len 1", 3004, 4, 17, 4, 72, 64,
                     (5, 64, 0, 33), tree_len=(17, 6, 1, 11)),
    "chain": Config("a chain: each node sees every earlier one", 3005, 2, 17, 4, 72, 64, (24,), shape="chain"),
    "wide_tree": Config("a star: every node sees the root and itself", 3006, 2, 33, 4, 72, 64, (16,), shape="star"),
    "large_values": Config("q scaled x100: overflows without max subtraction", 3007, 2, 9, 4, 72, 64, (40,),
                           q_scale=100.0),
    "k2_dims_fp32": Config("Kimi K2 dims: H=64, Dqk=576, d_v=512, sm_scale 0.144680", 3008, 2, 9, 64, 576, 512,
                           (96, 40), sm_scale=K2_SCALE),
    "k2_dims_bf16": Config("Kimi K2 dims, bf16 inputs", 3009, 2, 9, 64, 576, 512, (96, 40), dtype="bf16",
                           sm_scale=K2_SCALE),
    "long_prefix": Config("K2 dims, bf16, prefix 4096, T=65 (second tier)", 3010, 2, 65, 64, 576, 512, (4096, 4000),
                          dtype="bf16", sm_scale=K2_SCALE, tier="cache"),
}


def tree_visibility(parents: np.ndarray, n: int, t: int) -> np.ndarray:
    """uint8 [T,T] ancestor mask of slots 0..n (parents[i] < i); 0 elsewhere."""
    vis = np.zeros((t, t), np.uint8)
    for i in range(n + 1):
        if i:
            vis[i] = vis[parents[i]]
        vis[i, i] = 1
    return vis


def _tree(cfg: Config, rng: np.random.Generator, n: int) -> np.ndarray:
    t = cfg.slots
    if cfg.shape == "chain":
        return tree_visibility(chain_tree(rng, t, n, 100).parents, n, t)
    if cfg.shape == "star":
        parents = np.zeros(t, np.int32)
        parents[0] = -1
        return tree_visibility(parents, n, t)
    return tree_visibility(random_tree(rng, t, n, 8, 8, 1000).parents, n, t)


def poison(q: np.ndarray, kv: np.ndarray, vis: np.ndarray | None, prefix: np.ndarray, tree_len: np.ndarray) -> None:
    """In place: NaN in q rows >= tree_len and cache rows >= prefix_len + tree_len; 1 in
    visibility entries outside the valid square (skipped when vis is None)."""
    for r in range(q.shape[0]):
        tl, pl = int(tree_len[r]), int(prefix[r])
        q[r, tl:] = np.nan
        kv[r, pl + tl:] = np.nan
        if vis is not None:
            vis[r, tl:, :] = 1
            vis[r, :, tl:] = 1


def synth(cfg: Config, rng: np.random.Generator) -> dict[str, np.ndarray]:
    b, t = cfg.batch, cfg.slots
    prefix = np.array([cfg.prefix[r % len(cfg.prefix)] for r in range(b)], np.int32)
    tree_len = np.array([cfg.tree_len[r % len(cfg.tree_len)] if cfg.tree_len else t for r in range(b)], np.int32)
    s = int((prefix + t).max())
    dt = np.float32 if cfg.dtype == "f32" else ml_dtypes.bfloat16
    q = (rng.standard_normal((b, t, cfg.heads, cfg.dqk)) * cfg.q_scale).astype(dt)
    kv = rng.standard_normal((b, s, cfg.dqk)).astype(dt)
    vis = np.zeros((b, t, t), np.uint8)
    for r in range(b):
        vis[r] = _tree(cfg, rng, int(tree_len[r]) - 1)
    poison(q, kv, vis, prefix, tree_len)
    scale = cfg.sm_scale or cfg.dqk**-0.5
    return {
        "q": q,
        "kv_cache": kv,
        "prefix_len": prefix,
        "tree_len": tree_len,
        "visibility": vis,
        "sm_scale": np.array(scale, np.float32),
        "d_v": np.array(cfg.d_v, np.int32),
    }


def max_abs_score(x: dict[str, np.ndarray]) -> float:
    """Largest |scaled score| over the valid rows and keys (drives the f32 error bound)."""
    worst = 0.0
    for r in range(x["q"].shape[0]):
        pl, tl = int(x["prefix_len"][r]), int(x["tree_len"][r])
        if tl == 0:
            continue
        qr = x["q"][r, :tl].astype(np.float64)
        keys = x["kv_cache"][r, : pl + tl].astype(np.float64)
        worst = max(worst, float(np.abs(np.einsum("thd,ld->thl", qr, keys, optimize=True)).max()))
    return worst * float(x["sm_scale"])


def tolerances(x: dict[str, np.ndarray]) -> dict[str, Contract]:
    """Per-golden contracts from an error model calibrated by bench/attn_error_model.py.

    An f32-accumulating kernel's score errors grow with the score magnitude: with
    S = max|scaled score| and V = max|value|, the measured worst errors over 10 seeds of
    every config stay below u32 S V for out and 5 u32 S for lse (u32 = 2^-24). Contracts:
    out atol = max(1e-5, 2 u32 S V), lse atol = max(1e-5, 8 u32 S) and lse rtol = 4 u32;
    the 1e-5 floor is the fp32 target. With bf16 inputs a kernel may round the softmax
    weights P to bf16 for the P.V tensor-core product (relative error 2^-9 per weight,
    measured worst 4.5e-3 at V ~ 4.3): out atol adds 2^-8 V. lse is not affected by that,
    but the f32 sum of L exponentials has a relative error ~ sqrt(L) u32: lse atol is at
    least 4 u32 sqrt(L) (1.5e-5 at L = 4161, where the H200 kernels measured 8.4e-6).
    """
    d_v = int(x["d_v"])
    vmax = 1.0
    for r in range(x["q"].shape[0]):
        rows = x["kv_cache"][r, : int(x["prefix_len"][r]) + int(x["tree_len"][r]), :d_v]
        if rows.size:
            vmax = max(vmax, float(np.abs(rows.astype(np.float64)).max()))
    smax = max(1.0, max_abs_score(x))
    lmax = int((x["prefix_len"] + x["tree_len"]).max())
    out_atol = max(1e-5, 2 * U32 * smax * vmax)
    if x["q"].dtype != np.float32:
        out_atol += U_BF16 * vmax
    return {
        "out": Contract("allclose", atol=float(out_atol), rtol=0.0, nan="fail"),
        "lse": Contract("allclose", atol=float(max(1e-5, 8 * U32 * smax, 4 * U32 * np.sqrt(lmax))), rtol=float(4 * U32),
                        nan="fail"),
    }


def generate(name: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Inputs, expected outputs (float64 reference, stored f32) and metadata of ``name``.

    Raises:
        KeyError: unknown configuration.
    """
    cfg = CONFIGS[name]
    rng = np.random.default_rng(cfg.seed)
    x = synth(cfg, rng)
    out, lse = verify_attn_f64(x["q"], x["kv_cache"], x["prefix_len"], x["tree_len"], x["visibility"],
                               float(x["sm_scale"]), int(x["d_v"]))
    expected = {"out": out.astype(np.float32), "lse": lse.astype(np.float32)}
    return package(OP, name, cfg, GENERATOR_VERSION, x, expected, tolerances(x), dtype=cfg.dtype)
