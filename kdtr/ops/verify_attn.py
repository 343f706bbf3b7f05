"""verify_attn: MLA-absorb attention of the draft-tree queries over prefix + tree (reference).

Contract: docs/ops/verify_attn.md. In MLA's absorbed form (as in
DeepSeek-V2/V3 and Kimi K2 decoding) all heads of a request share one latent KV row per
position: keys are the full ``Dqk`` (= 512 latent + 64 rope) dims, values the first
``d_v`` dims. The tree queries attend to every prefix position and to the tree slots
their visibility (ancestor) row allows.

Evaluated in float64 from the stored inputs (bf16 widened exactly) with the row max
subtracted before exponentiation, then rounded to float32, with the same bits on every host
(docs/harness.md, "Host independence of goldens"): every dot product is the exact sum of
integer slice products that any BLAS computes exactly in any order, combined in a fixed
order (:func:`kdtr.detmath.matmul_exact`: within a few float64 ulp of the exact value); exp
and log are kdtr's own (:mod:`kdtr.detmath`), the softmax denominator a fixed-order sum, and
the weights of ``out`` (in [0, 1]) are rounded to multiples of 2^(1 - 2w), w = 20..26 bits
from the key count (an error below 2^-40 per weight), before their exact product with the
values; the float32 rounding is kdtr's (:mod:`kdtr.bf16`).

Non-finite scores (docs/ops/verify_attn.md, "NaN and infinities"): whether a row is
empty is decided from its visible-key set, never from its scores. A row with no visible
key (and every padding row i >= tree_len) has out 0 and lse -inf. Otherwise the
max-subtracted formula is evaluated in IEEE arithmetic with NaN propagating through the
max: a NaN or +inf visible score, or visible scores that are all -inf, make the row's lse
and every out element NaN; a -inf score among finite ones has weight 0, and a key of
weight 0 contributes nothing to out (not even 0 * inf = NaN).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..bf16 import to_float32, widen
from ..contract import Contract
from ..detmath import Sliced, exp, fixed_sum, log, matmul_exact, slice_bits
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


ROW_BLOCK_ELEMENTS = 1 << 22  # scores [rows, H, L] of this many float64 per block of tree rows


def _scores_f64(qr: np.ndarray, keys: Sliced, bad_k: np.ndarray, keys_raw: np.ndarray, scale: float) -> np.ndarray:
    """Scaled scores [tl,H,L] (float64) of queries qr [tl,H,Dqk] against the keys [L,Dqk].

    Finite operands go through :func:`kdtr.detmath.matmul_exact` (``keys`` is the sliced
    key matrix [Dqk, L], its non-finite rows zeroed): the same bits on every host. Entries whose query row
    or key row (``bad_k``) holds a NaN or an infinity are recomputed as plain IEEE sums of products: all of them
    are NaN or +-inf, and their class (NaN if a term is NaN, as 0 * inf, or terms of +inf
    and -inf meet; else +-inf) does not depend on the order of the sum.
    """
    tl, h, dqk = qr.shape
    bad_q = ~np.isfinite(qr).all(axis=-1)  # [tl, H]
    qf = np.where(bad_q[..., None], 0.0, qr).reshape(tl * h, dqk)
    scores = matmul_exact(qf, keys).reshape(tl, h, -1)
    if bad_q.any() or bad_k.any():
        with np.errstate(invalid="ignore", over="ignore"):
            ti, hi = np.nonzero(bad_q)
            if ti.size:
                scores[ti, hi, :] = (qr[ti, hi][:, None, :] * keys_raw[None, :, :]).sum(axis=-1)
            (li,) = np.nonzero(bad_k)
            if li.size:
                scores[:, :, li] = (qr[:, :, None, :] * keys_raw[li][None, None, :, :]).sum(axis=-1)
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
    stats: dict | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The float64 results (out [B,T,H,d_v], lse [B,T,H]) before rounding; see :func:`verify_attn`.

    Host-independent (docs/harness.md, "Host independence of goldens"): exact dot
    products (:func:`kdtr.detmath.matmul_exact`), kdtr's own exp and log, fixed-order
    sums; the weights of ``out`` are rounded to 2w bits (w = slice_bits(L) >= 20), an
    error below 2^-40 per weight (module docstring).

    ``stats``, when a dict, receives ``max_abs_score``: the largest finite |scaled score|
    over the valid rows and keys (visible or not), 0.0 if there is none.

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
    scale = float(to_float32(float(sm_scale)))
    worst = 0.0
    for r in range(b):
        pl, tl = int(prefix_len[r]), int(tree_len[r])
        if pl < 0 or not 0 <= tl <= t or pl + tl > s_max:
            raise ValueError(f"request {r}: prefix_len {pl}, tree_len {tl} invalid for T={t}, S={s_max}")
        check_scratch_bytes(8 * (pl + tl) * (dqk + tl * h), f"request {r}: prefix_len, tree_len",  # kdtr/limits.py
                            f"keys [L,Dqk] and scores [tree_len,H,L] in float64, L = {pl + tl}, Dqk = {dqk}, H = {h}")
        if tl == 0:
            continue
        n_keys = pl + tl
        keys = widen(kv[r, :n_keys])  # [L, Dqk], exact
        bad_k = ~np.isfinite(keys).all(axis=-1)
        keys_sliced = Sliced(np.where(bad_k[:, None], 0.0, keys).T, slice_bits(dqk), "right")
        # A key of weight 0 (invisible, or a -inf score) contributes nothing, even where its
        # value holds a NaN or an infinity (0 * inf would be NaN). Such a value element can
        # only belong to a weight-0 key of a row that is not NaN: the value dims are key
        # dims, so every score of that key is NaN or +-inf. Zeroing it changes nothing else.
        values = keys[:, :d_v]
        values_sliced = Sliced(np.where(np.isfinite(values), values, 0.0), slice_bits(n_keys), "right")
        qr_all = widen(q[r, :tl])  # [tl, H, Dqk]
        vis_r = np.asarray(visibility[r, :tl, :tl]) != 0
        step = max(1, ROW_BLOCK_ELEMENTS // (h * n_keys))
        for i0 in range(0, tl, step):  # blocks of tree rows: the same values whatever the block
            i1 = min(tl, i0 + step)
            scores = _scores_f64(qr_all[i0:i1], keys_sliced, bad_k, keys, scale)  # [rows, H, L]
            if stats is not None:
                fin = np.abs(scores[np.isfinite(scores)])
                if fin.size:
                    worst = max(worst, float(fin.max()))
            mask = np.ones((i1 - i0, n_keys), bool)
            mask[:, pl:] = vis_r[i0:i1]
            # Emptiness comes from the visible set, never from the scores (docs: NaN and inf).
            empty = ~mask.any(axis=-1)[:, None, None]  # [rows, 1, 1]
            scores = np.where(mask[:, None, :], scores, -np.inf)
            m = scores.max(axis=-1, keepdims=True) + 0.0  # NaN if any visible score is NaN; no -0.0
            # NaN or +inf among the visible scores, or all of them -inf: the row is NaN.
            nan_row = ~empty & ~np.isfinite(m)
            m = np.where(empty | nan_row, 0.0, m)
            with np.errstate(invalid="ignore"):
                p = exp(scores - m)  # finite m: every p in [0, 1] (0 for invisible and -inf scores)
            p = np.where(empty | nan_row, 0.0, p)
            denom = fixed_sum(p, axis=-1, keepdims=True)  # >= 1 for the other rows
            with np.errstate(divide="ignore", invalid="ignore"):
                lse_r = np.where(empty[..., 0], -np.inf, (m + log(denom))[..., 0])
            lse[r, i0:i1] = np.where(nan_row[..., 0], np.nan, lse_r)
            rows = (i1 - i0) * h
            pv = matmul_exact(Sliced(p.reshape(rows, n_keys), values_sliced.w, "left", max_slices=2), values_sliced)
            o = pv.reshape(i1 - i0, h, d_v) / np.where(denom == 0, 1.0, denom)
            out[r, i0:i1] = np.where(nan_row, np.nan, o)
    if stats is not None:
        stats["max_abs_score"] = worst
    return out, lse


def verify_attn(
    q: np.ndarray,
    kv_cache: np.ndarray,
    prefix_len: np.ndarray,
    tree_len: np.ndarray,
    visibility: np.ndarray,
    sm_scale: float | np.ndarray,
    d_v: int | np.ndarray,
    stats: dict | None = None,
) -> VerifyAttnResult:
    """Tree verify attention over prefix + tree, MLA-absorb (one latent KV per request).

    Args:
        q: f32 or bf16 [B,T,H,Dqk], the tree queries (all heads).
        kv_cache: same dtype, [B,S,Dqk]: prefix rows then one row per tree slot.
        prefix_len: int32 [B]; tree_len: int32 [B] (node_count + 1).
        visibility: uint8 [B,T,T], the tree's ancestor mask.
        sm_scale: softmax scale (rounded to f32, as stored); d_v: value width (<= Dqk).
        stats: a dict that receives ``max_abs_score`` (:func:`verify_attn_f64`), or None.

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
    out, lse = verify_attn_f64(q, kv_cache, prefix_len, tree_len, visibility, float(sm_scale), int(d_v), stats)
    # kdtr's rounding (kdtr/bf16.py): a finite float64 beyond the f32 range gives +-inf, NaN the canonical NaN
    return VerifyAttnResult(to_float32(out), to_float32(lse))


def max_abs_score(q: np.ndarray, kv_cache: np.ndarray, prefix_len: np.ndarray, tree_len: np.ndarray,
                  sm_scale: float | np.ndarray) -> float:
    """Largest finite |scaled score| over the valid rows (i < tree_len) and keys (< prefix_len
    + tree_len), visible or not, from the same exact dot products as :func:`verify_attn_f64`;
    0.0 if there is none.

    Args:
        q: f32 or bf16 [B,T,H,Dqk]; kv_cache: same dtype [B,S,Dqk]; prefix_len, tree_len:
            int [B] (not checked beyond the ranges they slice); sm_scale: rounded to f32.
    """
    scale = float(to_float32(float(sm_scale)))
    worst = 0.0
    dqk = np.shape(q)[-1]
    for r in range(np.shape(q)[0]):
        pl, tl = int(prefix_len[r]), int(tree_len[r])
        if tl <= 0:
            continue
        keys = widen(kv_cache[r, : pl + tl])
        bad_k = ~np.isfinite(keys).all(axis=-1)
        sliced = Sliced(np.where(bad_k[:, None], 0.0, keys).T, slice_bits(dqk), "right")
        s = np.abs(_scores_f64(widen(q[r, :tl]), sliced, bad_k, keys, scale))
        s = s[np.isfinite(s)]
        if s.size:
            worst = max(worst, float(s.max()))
    return worst


# The split-KV schedule of the tensor-core kernels (docs/ops/verify_attn.md, "Split-KV";
# verify_attn_split in cuda_tests/kernels/verify_attn.cuh, which this mirrors).
SPLIT_TARGET_BLOCKS = 128
SPLIT_MAX_SPLITS = 16
SPLIT_MIN_TILES = 4
SPLIT_TILE = 64  # query rows per block, keys per key tile


def split_schedule(prefix_len: int, tree_len: int, H: int) -> list[tuple[int, int]]:
    """The key ranges [start, stop) into which the mma and wgmma CUDA kernels split one
    request's L = prefix_len + tree_len keys (one block per split and 64 query rows; a
    combine kernel merges the partial results).

    Depends on the request's own lengths and the head count only, never on the batch or
    the device. One range [0, L) where the request is not split; [] where L == 0.
    Raises ValueError for negative lengths or H < 1.
    """
    if prefix_len < 0 or tree_len < 0 or H < 1:
        raise ValueError(f"split_schedule: prefix_len {prefix_len}, tree_len {tree_len}, H {H}")
    n = SPLIT_TILE
    L = prefix_len + tree_len
    row_tiles = -(-tree_len * H // n)
    key_tiles = -(-L // n)
    if key_tiles == 0:
        return []
    if row_tiles == 0:
        return [(0, L)]
    want = min(SPLIT_MAX_SPLITS, -(-SPLIT_TARGET_BLOCKS // row_tiles))
    tiles = max(SPLIT_MIN_TILES, -(-key_tiles // want))
    splits = -(-key_tiles // tiles)
    return [(s * tiles * n, min((s + 1) * tiles * n, L)) for s in range(splits)]


def sm_scale_mla(qk_head_dim: int = 192, yarn_factor: float = 64.0) -> float:
    """DeepSeek/Kimi MLA softmax scale: qk_head_dim^-0.5 * mscale^2, mscale = 0.1 ln(factor) + 1."""
    mscale = 0.1 * float(log(float(yarn_factor))) + 1.0 if yarn_factor > 1 else 1.0  # kdtr's log: host-independent
    return float(1.0 / math.sqrt(qk_head_dim) * mscale * mscale)  # sqrt and / are correctly rounded; pow is not


def reference(inputs, metadata) -> dict[str, np.ndarray]:
    """The op registry's reference: :func:`verify_attn` (reads no metadata)."""
    return verify_attn(**inputs).as_dict()


SPEC = register_op(OpSpec(
    name="verify_attn",
    kernels=("simt", "mma", "wgmma"),
    abi_dims=("B", "T", "H", "S", "Dqk", "d_v"),
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
