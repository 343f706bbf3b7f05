"""The verify_attn float64 reference against a naive per-row implementation, plus the
padding, poisoning and overflow rules of docs/ops/verify_attn.md, and the generator."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import kdtr
from kdtr.generators import gen_verify_attn_refs as gen
from kdtr.ops.verify_attn import sm_scale_mla, verify_attn, verify_attn_f64


def naive(x):
    q, kv = x["q"].astype(np.float64), x["kv_cache"].astype(np.float64)
    b, t, h, _ = q.shape
    d_v = int(x["d_v"])
    out = np.zeros((b, t, h, d_v))
    lse = np.full((b, t, h), -math.inf)
    for r in range(b):
        pl, tl = int(x["prefix_len"][r]), int(x["tree_len"][r])
        for i in range(tl):
            keys = list(range(pl)) + [pl + j for j in range(tl) if x["visibility"][r, i, j]]
            for hh in range(h):
                if not keys:
                    continue
                s = [float(x["sm_scale"]) * math.fsum(q[r, i, hh] * kv[r, p]) for p in keys]
                m = max(s)
                z = math.fsum(math.exp(v - m) for v in s)
                lse[r, i, hh] = m + math.log(z)
                for p, v in zip(keys, s):
                    out[r, i, hh] += math.exp(v - lse[r, i, hh]) * kv[r, p, :d_v]
    return out, lse


@pytest.mark.parametrize("name", ["small", "ragged", "chain", "wide_tree", "large_values", "no_prefix", "small_bf16"])
def test_matches_naive(name):
    cfg = gen.CONFIGS[name]
    x = gen.synth(cfg, np.random.default_rng(cfg.seed))
    out, lse = verify_attn_f64(x["q"], x["kv_cache"], x["prefix_len"], x["tree_len"], x["visibility"],
                               float(x["sm_scale"]), int(x["d_v"]))
    n_out, n_lse = naive(x)
    assert np.allclose(out, n_out, rtol=1e-9, atol=1e-9)
    assert np.array_equal(np.isinf(lse), np.isinf(n_lse))
    assert np.allclose(lse[np.isfinite(lse)], n_lse[np.isfinite(n_lse)], rtol=1e-12, atol=1e-9)
    assert np.isfinite(out).all()  # the poison (NaN) was never read


def test_padding_and_empty_rows():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 4, 2, 8)).astype(np.float32)
    kv = rng.standard_normal((1, 4, 8)).astype(np.float32)
    vis = np.eye(4, dtype=np.uint8)[None]
    vis[0, 1, 1] = 0  # row 1 sees nothing: no prefix, no tree slot
    r = verify_attn(q, kv, np.array([0], np.int32), np.array([3], np.int32), vis, 0.5, 4)
    assert r.out.dtype == np.float32 and r.out.shape == (1, 4, 2, 4)
    assert (r.lse[0, 1] == -np.inf).all() and (r.out[0, 1] == 0).all()
    assert (r.lse[0, 3] == -np.inf).all() and (r.out[0, 3] == 0).all()  # padding row i >= tree_len
    np.testing.assert_allclose(r.out[0, 0], np.broadcast_to(kv[0, 0, :4], (2, 4)), rtol=1e-6)  # sees only itself


def test_large_scores_do_not_overflow():
    q = np.full((1, 1, 1, 4), 1000.0, np.float32)
    kv = np.array([[[1, 1, 1, 1], [1, 1, 1, 0.999]]], np.float32)
    r = verify_attn(q, kv, np.array([1], np.int32), np.array([1], np.int32), np.ones((1, 1, 1), np.uint8), 1.0, 2)
    assert np.isfinite(r.out).all() and np.isfinite(r.lse).all() and r.lse[0, 0, 0] > 3999


def test_bad_lengths_and_dtypes_raise():
    q = np.zeros((1, 2, 1, 4), np.float32)
    kv = np.zeros((1, 3, 4), np.float32)
    vis = np.ones((1, 2, 2), np.uint8)
    with pytest.raises(ValueError, match="request 0"):
        verify_attn(q, kv, np.array([2], np.int32), np.array([2], np.int32), vis, 1.0, 4)
    with pytest.raises(ValueError, match="one dtype"):
        verify_attn(q, kv.astype(ml_dtypes.bfloat16), np.array([0], np.int32), np.array([2], np.int32), vis, 1.0, 4)
    with pytest.raises(ValueError, match="d_v"):
        verify_attn(q, kv, np.array([0], np.int32), np.array([2], np.int32), vis, 1.0, 5)


def test_k2_scale():
    assert abs(sm_scale_mla(192, 64.0) - 0.144680) < 1e-6


REQUIRED = {"small", "no_prefix", "ragged", "chain", "wide_tree", "large_values", "k2_dims_fp32", "k2_dims_bf16"}


@pytest.mark.parametrize("name", sorted(REQUIRED | {"small_bf16"}))
def test_committed_goldens_are_poisoned_and_contracted(name, repo_root):
    g = kdtr.load(repo_root / "golden" / "verify_attn" / f"{name}.kdtr")
    t = g.tensors
    q, kv, pl, tl, vis = (t[f"input.{k}"] for k in ("q", "kv_cache", "prefix_len", "tree_len", "visibility"))
    for r in range(q.shape[0]):
        assert np.isnan(q[r, tl[r]:].astype(np.float32)).all() and not np.isnan(q[r, : tl[r]].astype(np.float32)).any()
        assert np.isnan(kv[r, pl[r] + tl[r]:].astype(np.float32)).all()
        assert (vis[r, tl[r]:, :] == 1).all() and (vis[r, :, tl[r]:] == 1).all()
    for out in ("out", "lse"):
        assert g.metadata[f"contract.{out}.kind"] == "allclose" and g.metadata[f"contract.{out}.nan"] == "fail"
    if g.metadata["dtype"] == "f32" and name != "large_values":
        assert g.metadata["contract.out.atol"] == 1e-5  # the fp32 target
    assert q.dtype == (np.float32 if g.metadata["dtype"] == "f32" else ml_dtypes.bfloat16)


def test_k2_dims_and_second_tier():
    for name in ("k2_dims_fp32", "k2_dims_bf16"):
        c = gen.CONFIGS[name]
        assert (c.heads, c.dqk, c.d_v) == (64, 576, 512) and abs(c.sm_scale - 0.144680) < 1e-6
    lp = gen.CONFIGS["long_prefix"]
    assert lp.tier == "cache" and max(lp.prefix) == 4096
