"""The verify_attn configurations that kill mutation survivors exercise what their names promise, and their
contracts pass a correct f32 online-softmax kernel while failing the bugs they aim at.

huge_scores (and _bf16): scores beyond the float64 exp range, kept finite only by
max-subtraction; no_visible_key: empty rows (out 0, lse -inf) among normal ones, rows that
do not see the root; masked_extremes (and _bf16): masked keys that would dominate the row
maximum; finite_padding (and _bf16): padding rows with finite q. The kernels are simulated
in numpy float32 (tiles of 64 keys, running max and sum, exp2 as the CUDA kernels do, P
rounded to bf16 for the bf16 goldens), as docs/ops/verify_attn.md's error model does.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import kdtr
from kdtr.compare import compare
from kdtr.contract import Contract
from kdtr.generators import gen_verify_attn_refs as gen

NEW = ("huge_scores", "huge_scores_bf16", "no_visible_key", "masked_extremes", "masked_extremes_bf16",
       "finite_padding", "finite_padding_bf16")
F32 = np.float32
LOG2E = F32(1.4426950408889634)
LN2 = F32(0.6931471805599453)


@pytest.fixture(scope="module")
def goldens():
    return {name: gen.generate(name) for name in NEW}


def inputs(g):
    return {k[len("input."):]: v for k, v in g[0].items() if k.startswith("input.")}


def scores64(x, r):
    """float64 scaled scores [tl, H, L] of request r and the visibility mask [tl, L]."""
    pl, tl = int(x["prefix_len"][r]), int(x["tree_len"][r])
    q = x["q"][r, :tl].astype(np.float64)
    k = x["kv_cache"][r, : pl + tl].astype(np.float64)
    mask = np.ones((tl, pl + tl), bool)
    mask[:, pl:] = x["visibility"][r, :tl, :tl] != 0
    return float(F32(x["sm_scale"])) * np.einsum("thd,ld->thl", q, k), mask


def kernel(x, *, round_p=False, fold_log2e=False, max_sub=True, visible_max=True, pad_rows=False,
           empty_nan=False, tile=64):
    """An f32 flash-attention kernel over one golden's inputs: per 64-key tile, masked
    scores, running max m, p = exp2((s - m) log2 e) (or, ``fold_log2e``, scores scaled by
    sm_scale log2 e first, as FlashAttention does), running sum l and O rescaled by
    exp2((m_old - m) log2 e). Bugs: ``max_sub=False`` (p = exp(s), lse = log l),
    ``visible_max=False`` (m over every key in range, masked ones included), ``pad_rows``
    (rows i >= tree_len computed from q like valid ones, keys still < prefix + tree_len,
    visibility entries as stored), ``empty_nan`` (a row with no visible key divides 0 by 0)."""
    q, kv = x["q"], x["kv_cache"]
    b, t, h, _ = q.shape
    d_v = int(x["d_v"])
    out = np.zeros((b, t, h, d_v), F32)
    lse = np.full((b, t, h), -np.inf, F32)
    scale = F32(x["sm_scale"])
    for r in range(b):
        pl, tl = int(x["prefix_len"][r]), int(x["tree_len"][r])
        rows = t if pad_rows else tl
        if rows == 0 or pl + tl == 0:
            continue
        keys = kv[r, : pl + tl].astype(F32)
        s = np.einsum("thd,ld->thl", q[r, :rows].astype(F32), keys).astype(F32)
        s = (s * (scale * LOG2E if fold_log2e else scale)).astype(F32)
        mask = np.ones((rows, pl + tl), bool)
        mask[:, pl:] = x["visibility"][r, :rows, :tl] != 0
        masked = np.where(mask[:, None, :], s, F32(-np.inf))
        m = np.full((rows, h), -np.inf, F32)
        lsum = np.zeros((rows, h), F32)
        o = np.zeros((rows, h, d_v), F32)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            for k0 in range(0, pl + tl, tile):
                st = masked[:, :, k0 : k0 + tile]
                m_new = np.maximum(m, (st if visible_max else s[:, :, k0 : k0 + tile]).max(-1))
                m_use = np.where(np.isneginf(m_new), F32(0), m_new) if max_sub else np.zeros_like(m_new)
                if fold_log2e:
                    alpha = np.exp2((m - m_use).astype(F32)).astype(F32)
                    p = np.exp2((st - m_use[..., None]).astype(F32)).astype(F32)
                else:
                    alpha = np.exp2(((m - m_use) * LOG2E).astype(F32)).astype(F32)
                    p = np.exp2(((st - m_use[..., None]) * LOG2E).astype(F32)).astype(F32)
                if not max_sub:
                    alpha = np.ones_like(alpha)
                lsum = (lsum * alpha + p.sum(-1, dtype=F32)).astype(F32)
                pv = p.astype(ml_dtypes.bfloat16).astype(F32) if round_p else p
                o = (o * alpha[..., None] + np.einsum("thl,lv->thv", pv, keys[k0 : k0 + tile, :d_v])).astype(F32)
                m = m_new
            empty = lsum == 0 if not empty_nan else np.zeros_like(lsum, bool)
            o = np.where(empty[..., None], F32(0), o / lsum[..., None])
            base = m if max_sub else np.zeros_like(m)
            if fold_log2e:
                ls = (base + np.log2(lsum)) * LN2
            else:
                ls = base + np.log(lsum)
            ls = np.where(empty, F32(-np.inf), ls)
        out[r, :rows] = o
        lse[r, :rows] = ls
    return out, lse


def judge(g, out, lse) -> dict[str, bool]:
    t, md = g
    return {name: compare(name, t[f"expected.{name}"], val, Contract.from_metadata(md, name)).ok
            for name, val in (("out", out), ("lse", lse))}


@pytest.mark.parametrize("name", NEW)
def test_committed_golden_is_the_generation(name, goldens, repo_root):
    with kdtr.load(repo_root / "golden" / "verify_attn" / f"{name}.kdtr") as f:
        assert f.metadata["config"] == name and f.metadata["seed"] == gen.CONFIGS[name].seed
        for k, v in goldens[name][0].items():
            assert np.asarray(f.tensors[k]).tobytes() == v.tobytes(), k
        for out in ("out", "lse"):
            assert f.metadata[f"contract.{out}.kind"] == "allclose" and f.metadata[f"contract.{out}.nan"] == "fail"


@pytest.mark.parametrize("name", NEW)
def test_poisoned_outside_the_valid_region(name, goldens):
    x = inputs(goldens[name])
    exp_out, exp_lse = goldens[name][0]["expected.out"], goldens[name][0]["expected.lse"]
    assert not np.isnan(exp_out).any() and not np.isnan(exp_lse).any()
    q = x["q"].astype(F32)
    for r in range(q.shape[0]):
        pl, tl = int(x["prefix_len"][r]), int(x["tree_len"][r])
        assert np.isnan(x["kv_cache"][r, pl + tl :].astype(F32)).all()
        assert not np.isnan(x["kv_cache"][r, : pl + tl].astype(F32)).any()
        assert (x["visibility"][r, tl:, :] == 1).all() and (x["visibility"][r, :, tl:] == 1).all()
        assert not np.isnan(q[r, :tl]).any()
        if gen.CONFIGS[name].special == "finite_padding":
            assert np.isfinite(q[r, tl:]).all()
        else:
            assert np.isnan(q[r, tl:]).all()
        assert (exp_lse[r, tl:] == -np.inf).all() and (exp_out[r, tl:] == 0).all()
    assert q.dtype == F32 and x["q"].dtype == (F32 if gen.CONFIGS[name].dtype == "f32" else ml_dtypes.bfloat16)


@pytest.mark.parametrize("name", NEW)
@pytest.mark.parametrize("fold_log2e", [False, True])
def test_a_correct_f32_kernel_passes(name, fold_log2e, goldens):
    x = inputs(goldens[name])
    for round_p in (False, True) if gen.CONFIGS[name].dtype == "bf16" else (False,):
        assert judge(goldens[name], *kernel(x, round_p=round_p, fold_log2e=fold_log2e)) == {"out": True, "lse": True}


@pytest.mark.parametrize("name", ["huge_scores", "huge_scores_bf16"])
def test_huge_scores_are_beyond_float64_exp(name, goldens):
    """Every visible score of every valid row is beyond exp's float64 range (> 709.78 or <
    -745.2), both signs occur, a tile's maximum is >= 192 off the other's; inputs are small
    integers (exact in bf16 and f32, and so are the scores)."""
    x = inputs(goldens[name])
    signs = set()
    for r in range(len(x["prefix_len"])):
        s, mask = scores64(x, r)
        vis = np.broadcast_to(mask[:, None, :], s.shape)
        assert (np.abs(s[vis]) > 900).all()
        signs |= set(np.sign(s[vis]).tolist())
        if x["prefix_len"][r] > 64:
            assert (np.abs(s[..., :64].max(-1) - s[..., 64:].max(-1)) >= 192).all()
    assert signs == {-1.0, 1.0}
    for k in ("q", "kv_cache"):
        v = x[k].astype(F32)
        v = v[np.isfinite(v)]
        assert (v == np.round(v)).all() and np.abs(v).max() <= 64
    lse = goldens[name][0]["expected.lse"]
    assert (np.abs(lse[np.isfinite(lse)]) > 900).all() and np.isfinite(goldens[name][0]["expected.out"]).all()


@pytest.mark.parametrize("name", ["huge_scores", "huge_scores_bf16"])
def test_huge_scores_kill_a_kernel_without_max_subtraction(name, goldens):
    ok = judge(goldens[name], *kernel(inputs(goldens[name]), max_sub=False))
    assert ok == {"out": False, "lse": False}


def test_no_visible_key_rows(goldens):
    x = inputs(goldens["no_visible_key"])
    exp_out, exp_lse = goldens["no_visible_key"][0]["expected.out"], goldens["no_visible_key"][0]["expected.lse"]
    n_empty = n_no_root = 0
    for r, (empty, no_root) in enumerate(gen.NO_KEY_ROWS):
        pl, tl = int(x["prefix_len"][r]), int(x["tree_len"][r])
        vis = x["visibility"][r, :tl, :tl]
        for i in range(tl):
            if pl == 0 and not vis[i].any():
                assert i in empty
                assert (exp_lse[r, i] == -np.inf).all() and (exp_out[r, i] == 0).all()
                n_empty += 1
            else:
                assert np.isfinite(exp_lse[r, i]).all()
            if vis[i].any() and not vis[i, 0]:
                n_no_root += 1
        for i in empty:
            assert not vis[i].any()
        assert not vis[np.array(no_root, int), 0].any() if no_root else True
    assert n_empty >= 7 and n_no_root >= 10
    # a prefix-only row (request 3 has prefix 5): finite
    assert not x["visibility"][3, 1, : x["tree_len"][3]].any() and np.isfinite(exp_lse[3, 1]).all()
    # request 4 is the input that first showed the bug: prefix 0, tree_len 1, visibility [[0]]
    assert x["prefix_len"][4] == 0 and x["tree_len"][4] == 1 and x["visibility"][4, 0, 0] == 0
    assert (exp_lse[4] == -np.inf).all() and (exp_out[4] == 0).all()


def test_no_visible_key_kills_a_kernel_that_divides_by_zero(goldens):
    ok = judge(goldens["no_visible_key"], *kernel(inputs(goldens["no_visible_key"]), empty_nan=True))
    assert not ok["out"]  # out 0 / 0 = NaN (its lse, log 0 = -inf, happens to be right)


@pytest.mark.parametrize("name", ["masked_extremes", "masked_extremes_bf16"])
def test_masked_extremes_rows(name, goldens):
    """Rows whose visible maximum is over 745 below the maximum over every key in range
    (so even float64 weights underflow if the masked keys set the maximum): many, on even
    heads, and their expected outputs are finite."""
    x = inputs(goldens[name])
    lse = goldens[name][0]["expected.lse"]
    trapped = 0
    for r in range(len(x["prefix_len"])):
        s, mask = scores64(x, r)
        vis_max = np.where(mask[:, None, :], s, -np.inf).max(-1)
        all_max = s.max(-1)
        gap = all_max - vis_max  # [tl, H]
        trapped += int((gap > 745).sum())
        assert np.isfinite(lse[r, : int(x["tree_len"][r])]).all()
        assert (gap[0, 0::2] > 745).all() or x["tree_len"][r] == 1  # the root row, even heads
    assert trapped >= 10
    v = x["kv_cache"].astype(F32)
    assert set(np.unique(v[..., -1][np.isfinite(v[..., -1])]).tolist()) == {-450.0, 450.0}


@pytest.mark.parametrize("name", ["masked_extremes", "masked_extremes_bf16"])
def test_masked_extremes_kill_a_kernel_whose_max_sees_masked_keys(name, goldens):
    ok = judge(goldens[name], *kernel(inputs(goldens[name]), visible_max=False))
    assert not ok["out"] and not ok["lse"]


@pytest.mark.parametrize("name", ["finite_padding", "finite_padding_bf16"])
def test_finite_padding_rows_would_see_keys(name, goldens):
    """Every padding row has a finite q and, read as a valid row (prefix or the poisoned
    visibility 1 of columns < tree_len), a visible key: computing it gives finite values."""
    x = inputs(goldens[name])
    t = x["q"].shape[1]
    n_pad = 0
    for r in range(len(x["prefix_len"])):
        pl, tl = int(x["prefix_len"][r]), int(x["tree_len"][r])
        for i in range(tl, t):
            assert pl > 0 or x["visibility"][r, i, :tl].any()
            n_pad += 1
    assert n_pad >= 20 and 0 in x["tree_len"] and 1 in x["tree_len"]
    ok = judge(goldens[name], *kernel(x, pad_rows=True))
    assert ok == {"out": False, "lse": False}


def test_contracts_fail_wrong_values_at_padding_and_empty_rows(goldens):
    """lse 0 (or finite) where -inf is expected, out != 0 there, NaN where finite is expected:
    each is a mismatch under every new golden's contract."""
    for name in NEW:
        t, md = goldens[name]
        lse, out = t["expected.lse"], t["expected.out"]
        ninf = np.isneginf(lse)
        assert ninf.any()
        for bad_lse in (0.0, 1.0, -1e30, np.nan):
            x = lse.copy()
            x[tuple(np.argwhere(ninf)[0])] = bad_lse
            assert not compare("lse", lse, x, Contract.from_metadata(md, "lse")).ok, (name, bad_lse)
        o = out.copy()
        o[tuple(np.argwhere(ninf)[0])][0] = 0.5
        assert not compare("out", out, o, Contract.from_metadata(md, "out")).ok, name
        fin = np.argwhere(np.isfinite(lse))[0]
        x = lse.copy()
        x[tuple(fin)] = np.nan
        assert not compare("lse", lse, x, Contract.from_metadata(md, "lse")).ok, name
