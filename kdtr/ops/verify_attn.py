"""verify_attn: MLA-absorb attention of the draft-tree queries over prefix + tree (reference).

Source: shared/DESIGN.md 3.3 and docs/ops/verify_attn.md. In MLA's absorbed form (as in
DeepSeek-V2/V3 and Kimi K2 decoding) all heads of a request share one latent KV row per
position: keys are the full ``Dqk`` (= 512 latent + 64 rope) dims, values the first
``d_v`` dims. The tree queries attend to every prefix position and to the tree slots
their visibility (ancestor) row allows.

Evaluated in float64 from the stored inputs (bf16 widened exactly) with the row max
subtracted before exponentiation, then rounded to float32.

Non-finite scores (docs/ops/verify_attn.md, "NaN and infinities"): whether a row is
empty is decided from its visible-key set, never from its scores. A row with no visible
key (and every padding row i >= tree_len) has out 0 and lse -inf. Otherwise the
max-subtracted formula is evaluated in IEEE arithmetic with NaN propagating through the
max: a NaN or +inf visible score, or visible scores that are all -inf, make the row's lse
and every out element NaN; a -inf score among finite ones has weight 0, and a key of
weight 0 contributes nothing to out (not even 0 * inf = NaN).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..contract import Contract
from ..limits import check_output_bytes, check_scratch_bytes, verify_attn_output_bytes
from . import OpSpec, TensorSpec, register_op


@dataclass
class VerifyAttnResult:
    """out float32 [B,T,H,d_v]; lse float32 [B,T,H] (natural log; -inf for rows with no
    visible key, NaN for rows whose visible scores hold a NaN or +inf or are all -inf)."""

    out: np.ndarray
    lse: np.ndarray

    def as_dict(self) -> dict[str, np.ndarray]:
        return {"out": self.out, "lse": self.lse}


def _scores_f64(qr: np.ndarray, keys: np.ndarray, scale: float) -> np.ndarray:
    """Scaled scores [tl,H,L] (float64) of queries qr [tl,H,Dqk] against keys [L,Dqk].

    Finite inputs go through one BLAS contraction (the values of every golden). Entries
    whose query row or key row holds a NaN or an infinity are recomputed as plain IEEE
    sums of products, so that their class (NaN, +inf, -inf) never depends on a BLAS
    library's handling of non-finite operands: NaN if a term is NaN (a NaN factor or
    0 * inf) or terms of +inf and -inf meet, else +-inf if a term is infinite.
    """
    with np.errstate(invalid="ignore", over="ignore"):
        scores = np.einsum("thd,ld->thl", qr, keys, optimize=True)
    bad_q = ~np.isfinite(qr).all(axis=-1)  # [tl, H]
    bad_k = ~np.isfinite(keys).all(axis=-1)  # [L]
    if bad_q.any() or bad_k.any():
        with np.errstate(invalid="ignore", over="ignore"):
            ti, hi = np.nonzero(bad_q)
            if ti.size:
                scores[ti, hi, :] = (qr[ti, hi][:, None, :] * keys[None, :, :]).sum(axis=-1)
            (li,) = np.nonzero(bad_k)
            if li.size:
                scores[:, :, li] = (qr[:, :, None, :] * keys[li][None, None, :, :]).sum(axis=-1)
    with np.errstate(invalid="ignore", over="ignore"):
        return scale * scores


def verify_attn_f64(
    q: np.ndarray,
    kv_cache: np.ndarray,
    prefix_len: np.ndarray,
    tree_len: np.ndarray,
    visibility: np.ndarray,
    sm_scale: float,
    d_v: int,
) -> tuple[np.ndarray, np.ndarray]:
    """The float64 results (out [B,T,H,d_v], lse [B,T,H]) before rounding; see :func:`verify_attn`.

    Raises:
        ValueError: shapes, dtypes or lengths out of range (as :func:`verify_attn`).
    """
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
    check_output_bytes(verify_attn_output_bytes(b, t, h, d_v), "q, d_v",  # kdtr/limits.py, before allocating
                       f"out [B,T,H,d_v] = [{b},{t},{h},{d_v}] and lse [B,T,H]")
    out = np.zeros((b, t, h, d_v), np.float64)
    lse = np.full((b, t, h), -np.inf, np.float64)
    scale = float(np.float32(sm_scale))
    for r in range(b):
        pl, tl = int(prefix_len[r]), int(tree_len[r])
        if pl < 0 or not 0 <= tl <= t or pl + tl > s_max:
            raise ValueError(f"request {r}: prefix_len {pl}, tree_len {tl} invalid for T={t}, S={s_max}")
        check_scratch_bytes(8 * (pl + tl) * (dqk + tl * h), f"request {r}: prefix_len, tree_len",  # kdtr/limits.py
                            f"keys [L,Dqk] and scores [tree_len,H,L] in float64, L = {pl + tl}, Dqk = {dqk}, H = {h}")
        if tl == 0:
            continue
        keys = kv[r, : pl + tl].astype(np.float64)  # [L, Dqk]
        qr = q[r, :tl].astype(np.float64)  # [tl, H, Dqk]
        scores = _scores_f64(qr, keys, scale)  # [tl, H, L]
        mask = np.ones((tl, pl + tl), bool)
        mask[:, pl:] = np.asarray(visibility[r, :tl, :tl]) != 0
        # Emptiness comes from the visible set, never from the scores (docs: NaN and inf).
        empty = ~mask.any(axis=-1)[:, None, None]  # [tl, 1, 1]
        scores = np.where(mask[:, None, :], scores, -np.inf)
        m = scores.max(axis=-1, keepdims=True)  # NaN if any visible score is NaN
        # NaN or +inf among the visible scores, or all of them -inf: the row is NaN.
        nan_row = ~empty & ~np.isfinite(m)
        m = np.where(empty | nan_row, 0.0, m)
        p = np.exp(scores - m)  # finite m: every p in [0, 1] (0 for invisible and -inf scores)
        denom = p.sum(axis=-1, keepdims=True)  # >= 1 for the other rows
        with np.errstate(divide="ignore", invalid="ignore"):
            lse_r = np.where(empty[..., 0], -np.inf, (m + np.log(denom))[..., 0])
            lse[r, :tl] = np.where(nan_row[..., 0], np.nan, lse_r)
            weights = np.where(empty | nan_row, 0.0, p / np.where(denom == 0, 1.0, denom))
        # A key of weight 0 (invisible, or a -inf score) contributes nothing, even where its
        # value holds a NaN or an infinity (0 * inf would be NaN). Such a value element can
        # only belong to a weight-0 key of a row that is not NaN: the value dims are key
        # dims, so every score of that key is NaN or +-inf. Zeroing it changes nothing else.
        values = keys[:, :d_v]
        values = np.where(np.isfinite(values), values, 0.0)
        o = np.einsum("thl,lv->thv", weights, values, optimize=True)
        out[r, :tl] = np.where(nan_row, np.nan, o)
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
        i >= tree_len and rows with no visible key have out 0 and lse -inf; a row with a
        visible key whose visible scores hold a NaN or +inf, or are all -inf, has lse and
        every out element NaN (module docstring). Other rows are the float64 result
        rounded to f32 (a finite lse beyond the f32 range rounds to +-inf, as any cast).

    Raises:
        ValueError: shapes, dtypes or lengths out of range; outputs over
            kdtr.limits.max_output_bytes() (naming q, d_v) or a request's float64 keys and
            scores over kdtr.limits.max_scratch_bytes(), before allocating them.
    """
    out, lse = verify_attn_f64(q, kv_cache, prefix_len, tree_len, visibility, float(sm_scale), int(d_v))
    with np.errstate(over="ignore"):  # rounding a finite float64 beyond the f32 range gives +-inf
        return VerifyAttnResult(out.astype(np.float32), lse.astype(np.float32))


def sm_scale_mla(qk_head_dim: int = 192, yarn_factor: float = 64.0) -> float:
    """DeepSeek/Kimi MLA softmax scale: qk_head_dim^-0.5 * mscale^2, mscale = 0.1 ln(factor) + 1."""
    mscale = 0.1 * np.log(yarn_factor) + 1.0 if yarn_factor > 1 else 1.0
    return float(qk_head_dim**-0.5 * mscale * mscale)


def reference(inputs, metadata) -> dict[str, np.ndarray]:
    """The op registry's reference: :func:`verify_attn` (reads no metadata)."""
    return verify_attn(**inputs).as_dict()


SPEC = register_op(OpSpec(
    name="verify_attn",
    description="MLA-absorb attention over prefix + draft tree (docs/ops/verify_attn.md)",
    inputs=(
        TensorSpec("q", "f32|bf16", ("B", "T", "H", "Dqk")),
        TensorSpec("kv_cache", "f32|bf16", ("B", "S", "Dqk")),
        TensorSpec("prefix_len", "i32", ("B",)),
        TensorSpec("tree_len", "i32", ("B",)),
        TensorSpec("visibility", "u8", ("B", "T", "T")),
        TensorSpec("sm_scale", "f32", ()),
        TensorSpec("d_v", "i32", ()),
    ),
    # The fp32 floor; each golden carries its own tolerances, computed from its data
    # (kdtr/generators/gen_verify_attn_refs.tolerances, docs/ops/verify_attn.md "Tolerances").
    outputs=(
        TensorSpec("out", "f32", ("B", "T", "H", "Dv"), Contract("allclose", atol=1e-5, rtol=0.0)),
        TensorSpec("lse", "f32", ("B", "T", "H"), Contract("allclose", atol=1e-5, rtol=0.0)),
    ),
    reference=reference,
))
