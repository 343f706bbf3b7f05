"""verify_attn: MLA-absorb attention of the draft-tree queries over prefix + tree (reference).

Source: shared/DESIGN.md 3.3 and docs/ops/verify_attn.md. In MLA's absorbed form (as in
DeepSeek-V2/V3 and Kimi K2 decoding) all heads of a request share one latent KV row per
position: keys are the full ``Dqk`` (= 512 latent + 64 rope) dims, values the first
``d_v`` dims. The tree queries attend to every prefix position and to the tree slots
their visibility (ancestor) row allows.

Evaluated in float64 from the stored inputs (bf16 widened exactly) with the row max
subtracted before exponentiation, then rounded to float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class VerifyAttnResult:
    """out float32 [B,T,H,d_v]; lse float32 [B,T,H] (natural log; -inf for rows with no key)."""

    out: np.ndarray
    lse: np.ndarray

    def as_dict(self) -> dict[str, np.ndarray]:
        return {"out": self.out, "lse": self.lse}


def verify_attn_f64(
    q: np.ndarray,
    kv_cache: np.ndarray,
    prefix_len: np.ndarray,
    tree_len: np.ndarray,
    visibility: np.ndarray,
    sm_scale: float,
    d_v: int,
) -> tuple[np.ndarray, np.ndarray]:
    """The float64 results (out [B,T,H,d_v], lse [B,T,H]) before rounding; see :func:`verify_attn`."""
    q = np.asarray(q)
    kv = np.asarray(kv_cache)
    if q.ndim != 4 or kv.ndim != 3:
        raise ValueError(f"q must be [B,T,H,Dqk] and kv_cache [B,S,Dqk]; got {q.shape}, {kv.shape}")
    b, t, h, dqk = q.shape
    if kv.shape[0] != b or kv.shape[2] != dqk:
        raise ValueError(f"kv_cache {kv.shape} does not match q {q.shape}")
    if q.dtype != kv.dtype:
        raise ValueError(f"q is {q.dtype} but kv_cache is {kv.dtype}: one dtype per file")
    s_max = kv.shape[1]
    if not 1 <= d_v <= dqk:
        raise ValueError(f"d_v {d_v} outside [1, {dqk}]")
    if np.asarray(visibility).shape != (b, t, t):
        raise ValueError(f"visibility must be [{b},{t},{t}]")
    out = np.zeros((b, t, h, d_v), np.float64)
    lse = np.full((b, t, h), -np.inf, np.float64)
    scale = float(np.float32(sm_scale))
    for r in range(b):
        pl, tl = int(prefix_len[r]), int(tree_len[r])
        if pl < 0 or not 0 <= tl <= t or pl + tl > s_max:
            raise ValueError(f"request {r}: prefix_len {pl}, tree_len {tl} invalid for T={t}, S={s_max}")
        if tl == 0:
            continue
        keys = kv[r, : pl + tl].astype(np.float64)  # [L, Dqk]
        qr = q[r, :tl].astype(np.float64)  # [tl, H, Dqk]
        scores = scale * np.einsum("thd,ld->thl", qr, keys, optimize=True)  # [tl, H, L]
        mask = np.ones((tl, pl + tl), bool)
        mask[:, pl:] = np.asarray(visibility[r, :tl, :tl]) != 0
        scores = np.where(mask[:, None, :], scores, -np.inf)
        m = scores.max(axis=-1, keepdims=True)
        empty = ~np.isfinite(m)
        m = np.where(empty, 0.0, m)
        p = np.exp(scores - m)
        denom = p.sum(axis=-1, keepdims=True)
        with np.errstate(divide="ignore"):
            lse[r, :tl] = np.where(empty[..., 0], -np.inf, (m + np.log(denom))[..., 0])
        weights = np.where(empty, 0.0, p / np.where(denom == 0, 1.0, denom))
        out[r, :tl] = np.einsum("thl,lv->thv", weights, keys[:, :d_v], optimize=True)
    return out, lse


def verify_attn(
    q: np.ndarray,
    kv_cache: np.ndarray,
    prefix_len: np.ndarray,
    tree_len: np.ndarray,
    visibility: np.ndarray,
    sm_scale: float | np.ndarray,
    d_v: int | np.ndarray,
) -> VerifyAttnResult:
    """Tree verify attention over prefix + tree, MLA-absorb (one latent KV per request).

    Args:
        q: f32 or bf16 [B,T,H,Dqk], the tree queries (all heads).
        kv_cache: same dtype, [B,S,Dqk]: prefix rows then one row per tree slot.
        prefix_len: int32 [B]; tree_len: int32 [B] (node_count + 1).
        visibility: uint8 [B,T,T], the tree's ancestor mask.
        sm_scale: softmax scale (rounded to f32, as stored); d_v: value width (<= Dqk).

    Returns:
        :class:`VerifyAttnResult` with f32 ``out`` [B,T,H,d_v] and ``lse`` [B,T,H]; rows
        i >= tree_len and rows with no visible key have out 0 and lse -inf.

    Raises:
        ValueError: shapes, dtypes or lengths out of range.
    """
    out, lse = verify_attn_f64(q, kv_cache, prefix_len, tree_len, visibility, float(sm_scale), int(d_v))
    return VerifyAttnResult(out.astype(np.float32), lse.astype(np.float32))


def sm_scale_mla(qk_head_dim: int = 192, yarn_factor: float = 64.0) -> float:
    """DeepSeek/Kimi MLA softmax scale: qk_head_dim^-0.5 * mscale^2, mscale = 0.1 ln(factor) + 1."""
    mscale = 0.1 * np.log(yarn_factor) + 1.0 if yarn_factor > 1 else 1.0
    return float(qk_head_dim**-0.5 * mscale * mscale)
