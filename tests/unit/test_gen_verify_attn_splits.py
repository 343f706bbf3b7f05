"""The verify_attn goldens aimed at the split-KV paths of the mma and wgmma kernels
(docs/ops/verify_attn.md, "Goldens aimed at the split-KV paths"): each request's key ranges
are split_schedule's (kdtr.ops.verify_attn, the mirror of verify_attn_split), the lengths,
masks and non-finite inputs reach the cases their descriptions name, a simulated split kernel
passes them and the bugs they aim at fail them.

The simulated kernel (numpy float32, as the CUDA kernels compute): per request the ranges of
split_schedule; per range an online softmax over its 64-key tiles from m = -inf, l = 0, O = 0
(exp2 with log2 e, the -inf -> 0 substitute for exp, NaN-propagating max, P rounded to bf16 for
P V when asked, non-finite value elements of weight 0 left out as the cleaning pass does), the
partial (O unnormalised, m, l) per row written to a slot of row tile t and range s; a combine
per row: M = the NaN-propagating max of the m_s, w_s = exp(m_s - M), l = sum w_s l_s, out =
sum (w_s / l) O_s, lse = M + log l; then the row's result decided from its visible-key set
(finish_row: no key -> 0 / -inf, l NaN or 0 -> NaN). An unsplit request is the one range.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import kdtr
from kdtr.generators import gen_verify_attn_refs as gen
from kdtr.ops.verify_attn import split_schedule

_spec = importlib.util.spec_from_file_location("_sim_attn", Path(__file__).with_name("test_gen_verify_attn.py"))
sim = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sim)

F32 = np.float32
LOG2E = F32(1.4426950408889634)
BM = BN = 64  # rows per block, keys per tile
COMMITTED = ("split_lengths_bf16", "split_masked_bf16", "split_nonfinite_bf16", "split_empty_rows_bf16",
             "split_k2_bf16", "split_many_bf16")
SECOND_TIER = ("split_long_prefix",)
PASS = {"out": True, "lse": True}
MAX_GOLDEN_BYTES = 1_100_000
MAX_NEW_BYTES = 3 * 1024 * 1024 + 256 * 1024  # the split goldens together


@pytest.fixture(scope="module")
def goldens():
    return {name: gen.generate(name) for name in COMMITTED}


def lengths(cfg):
    pl = [cfg.prefix[r % len(cfg.prefix)] for r in range(cfg.batch)]
    tl = [cfg.tree_len[r % len(cfg.tree_len)] if cfg.tree_len else cfg.slots for r in range(cfg.batch)]
    return pl, tl


def visible(x, r):
    """bool [tl, L]: key p visible to tree row i of request r."""
    pl, tl = int(x["prefix_len"][r]), int(x["tree_len"][r])
    mask = np.ones((tl, pl + tl), bool)
    mask[:, pl:] = x["visibility"][r, :tl, :tl] != 0
    return mask


def raw_scores(x, r):
    """float64 IEEE scaled scores [tl, H, L] of request r (NaN and infinities as the sums make them)."""
    pl, tl = int(x["prefix_len"][r]), int(x["tree_len"][r])
    q = x["q"][r, :tl].astype(np.float64)
    k = x["kv_cache"][r, : pl + tl].astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        return float(F32(x["sm_scale"])) * np.einsum("thd,ld->thl", q, k)


def split_kernel(x, *, round_p=False, bug=""):
    """out [B,T,H,d_v], lse [B,T,H] (f32) of the simulated split kernel (module docstring).

    Bugs: ``floor_splits`` (splits = floor(key_tiles / tiles): a last range shorter than the
    others is dropped); ``empty_split_nan`` (a range's partial decided like a row: l = 0 with a
    visible key in the request -> m and l NaN); ``empty_split_m0`` (a range the row does not see
    writes m = 0, the exp substitute, instead of -inf); ``combine_skip_nonfinite`` (the combine
    leaves out a range whose m is NaN or +inf); ``combine_no_empty_check`` (the combine writes
    sum (w_s / l) O_s and M + log l without finish_row: 0 / 0 for a row with no key);
    ``slot_mixup`` (the combine reads range s of row tile t from the slot written for item
    w = s * row_tiles + t taken as range w % splits, row tile w // splits);
    ``four_tiles_per_range`` (a range walks at most 4 tiles, the minimum, from its start);
    ``combine_15`` (the combine merges 15 ranges at most); ``combine_no_has_key`` (the combine
    decides emptiness from l alone: l = 0 gives out 0, lse -inf even where the row sees keys,
    all of them -inf scores)."""
    q, kv = x["q"], x["kv_cache"]
    b, t, h, dqk = q.shape
    d_v = int(x["d_v"])
    scale = F32(x["sm_scale"])
    out = np.zeros((b, t * h, d_v), F32)
    lse = np.full((b, t * h), -np.inf, F32)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore", under="ignore"):
        for r in range(b):
            pl, tl = int(x["prefix_len"][r]), int(x["tree_len"][r])
            n_keys, rows = pl + tl, tl * h
            if rows == 0:
                continue
            ranges = split_schedule(pl, tl, h)
            if bug == "floor_splits" and len(ranges) > 1:
                tiles = (ranges[0][1] - ranges[0][0]) // BN
                ranges = ranges[: max(1, -(-n_keys // BN) // tiles)]
            if bug == "four_tiles_per_range" and len(ranges) > 1:
                ranges = [(a, min(e, a + 4 * BN)) for a, e in ranges]
            if bug == "combine_15" and len(ranges) > 1:
                ranges = ranges[:15]
            keys = kv[r, :n_keys].astype(F32)
            s = (np.einsum("md,ld->ml", q[r, :tl].astype(F32).reshape(rows, dqk), keys) * scale).astype(F32)
            mask = np.repeat(visible(x, r), h, axis=0)
            s = np.where(mask, s, F32(-np.inf))
            v = np.where(np.isfinite(keys[:, :d_v]), keys[:, :d_v], F32(0))  # weight-0 keys: nothing
            has_key = mask.any(-1)
            parts = []
            for a, e in ranges:
                m = np.full(rows, -np.inf, F32)
                lsum = np.zeros(rows, F32)
                o = np.zeros((rows, d_v), F32)
                for k0 in range(a, e, BN):
                    st = s[:, k0 : min(k0 + BN, e)]
                    m_new = np.maximum(m, st.max(-1))
                    m_use = np.where(m_new == -np.inf, F32(0), m_new)
                    alpha = np.exp2(((m - m_use) * LOG2E).astype(F32)).astype(F32)
                    p = np.exp2(((st - m_use[:, None]) * LOG2E).astype(F32)).astype(F32)
                    lsum = (lsum * alpha + p.sum(-1, dtype=F32)).astype(F32)
                    pv = p.astype(ml_dtypes.bfloat16).astype(F32) if round_p else p
                    o = (o * alpha[:, None] + pv @ v[k0 : min(k0 + BN, e)]).astype(F32)
                    m = m_new
                if bug == "empty_split_nan" and len(ranges) > 1:
                    bad = (lsum == 0) & has_key
                    m, lsum = np.where(bad, F32(np.nan), m), np.where(bad, F32(np.nan), lsum)
                if bug == "empty_split_m0" and len(ranges) > 1:
                    m = np.where(m == -np.inf, F32(0), m)
                parts.append((m, lsum, o))
            if len(parts) == 1:
                m, lsum, o = parts[0]
                o_row = o / lsum[:, None]
                lse_row = m + np.log(lsum)
            else:
                ms = np.stack([p[0] for p in parts])
                ls = np.stack([p[1] for p in parts])
                os_ = np.stack([p[2] for p in parts])
                if bug == "slot_mixup":
                    ms, ls, os_ = mix_slots(ms, ls, os_)
                if bug == "combine_skip_nonfinite":
                    drop = ~np.isfinite(ms)
                    ms = np.where(drop, F32(-np.inf), ms)
                    ls = np.where(drop, F32(0), ls)
                    os_ = np.where(drop[..., None], F32(0), os_)
                big = ms.max(0)  # NaN propagates
                m_use = np.where(big == -np.inf, F32(0), big)
                w = np.exp2(((ms - m_use) * LOG2E).astype(F32)).astype(F32)
                lsum = np.zeros(rows, F32)
                for k in range(len(parts)):  # in range order, as the combine kernel
                    lsum = (lsum + w[k] * ls[k]).astype(F32)
                o_row = np.zeros((rows, d_v), F32)
                for k in range(len(parts)):
                    o_row = (o_row + (w[k] / lsum)[:, None] * os_[k]).astype(F32)
                lse_row = big + np.log(lsum)
            if bug == "combine_no_empty_check" and len(parts) > 1:
                out[r, :rows], lse[r, :rows] = o_row, lse_row
                continue
            if bug == "combine_no_has_key" and len(parts) > 1:
                has_key = has_key & (lsum != 0)
            nan = has_key & ~(lsum > 0)
            out[r, :rows] = np.where(~has_key[:, None], F32(0), np.where(nan[:, None], F32(np.nan), o_row))
            lse[r, :rows] = np.where(~has_key, F32(-np.inf), np.where(nan, F32(np.nan), lse_row))
    return out.reshape(b, t, h, d_v), lse.reshape(b, t, h)


def mix_slots(ms, ls, os_):
    """The partials as a combine with mismatched slot indexing reads them (split_kernel's slot_mixup)."""
    splits, rows = ms.shape
    rt = -(-rows // BM)
    pad = rt * BM - rows

    def tiles(a, fill):
        return np.concatenate([a, np.full((splits, pad, *a.shape[2:]), fill, a.dtype)], 1).reshape(
            splits, rt, BM, *a.shape[2:])

    pm, pl_, po = tiles(ms, -np.inf), tiles(ls, 0), tiles(os_, 0)
    gm, gl, go = np.empty_like(pm), np.empty_like(pl_), np.empty_like(po)
    for s in range(splits):
        for t in range(rt):
            w = s * rt + t
            gm[s, t], gl[s, t], go[s, t] = pm[w % splits, w // splits], pl_[w % splits, w // splits], \
                po[w % splits, w // splits]
    return (gm.reshape(splits, -1)[:, :rows], gl.reshape(splits, -1)[:, :rows],
            go.reshape(splits, rt * BM, -1)[:, :rows])


# --- the goldens are the committed files, and small enough ------------------------------------


@pytest.mark.parametrize("name", COMMITTED)
def test_committed_golden_is_the_generation(name, goldens, repo_root):
    path = repo_root / "golden" / "verify_attn" / f"{name}.kdtr"
    g = kdtr.load(path)
    assert g.metadata["description"] == gen.CONFIGS[name].description
    for k, v in goldens[name][0].items():
        assert g.tensors[k].tobytes() == v.tobytes(), k
    assert path.stat().st_size <= MAX_GOLDEN_BYTES


def test_sizes_and_tiers(repo_root):
    total = sum((repo_root / "golden" / "verify_attn" / f"{n}.kdtr").stat().st_size for n in COMMITTED)
    assert total <= MAX_NEW_BYTES
    assert all(gen.CONFIGS[n].tier == "committed" for n in COMMITTED)
    assert all(gen.CONFIGS[n].tier == "cache" for n in SECOND_TIER)


# --- the ranges are split_schedule's, and the kernels that split take the dims ----------------


@pytest.mark.parametrize("name", COMMITTED + SECOND_TIER)
def test_ranges_are_the_schedule(name):
    cfg = gen.CONFIGS[name]
    assert cfg.dtype == "bf16" and cfg.dqk % 8 == 0 and cfg.dqk <= 576 and cfg.d_v <= 512  # mma and wgmma take it
    pl, tl = lengths(cfg)
    got = [tuple(split_schedule(p, n, cfg.heads)) for p, n in zip(pl, tl)]
    assert got == list(gen.SPLIT_RANGES[name])
    assert any(len(rg) > 1 for rg in got)
    assert pl[-1] + tl[-1] == max(pl) + cfg.slots  # the last request ends at S


def test_the_cases_of_the_issue():
    """Issue 25, item 4: which golden holds each case (by its ranges alone)."""
    rg = gen.SPLIT_RANGES
    pl, _ = lengths(gen.CONFIGS["split_lengths_bf16"])
    single = [r for r, x in enumerate(rg["split_lengths_bf16"]) if len(x) > 1 and x[-1][1] - x[-1][0] == 1]
    assert single == [0, 1, 2]
    assert rg["split_k2_bf16"][0][-1] == (512, 513)
    r5 = rg["split_lengths_bf16"][5]
    assert r5[1][1] == pl[5] == 512 and len(r5) == 3  # a range ends at prefix_len, the next holds the tree
    assert [len(x) for x in rg["split_lengths_bf16"]][3:5] == [1, 1]  # tree_len 0 and unsplit beside them
    assert len(rg["split_long_prefix"][0]) == 16  # the most ranges
    assert [len(x) for x in rg["split_many_bf16"]] == [14, 14, 16]
    a, b = rg["split_many_bf16"][1][-1]  # a range starting at an odd tile with its tail tile first
    assert (a // BN) % 2 == 1 and a % BN == 0 and 0 < b - a < BN
    assert all(b - a == 5 * BN for x in rg["split_many_bf16"] for a, b in x[:-1])  # 5 tiles per range
    assert rg["split_many_bf16"][0][-1][1] - rg["split_many_bf16"][0][-1][0] == 249
    assert gen.CONFIGS["split_masked_bf16"].d_v % 2 == 1


# --- what each golden holds --------------------------------------------------------------------


def test_split_lengths(goldens):
    x = sim.inputs(goldens["split_lengths_bf16"])
    assert not visible(x, 1)[0, 256]  # the single-key range (tree slot 1) is not seen by row 0
    assert visible(x, 1)[1, 256]
    m = visible(x, 2)
    assert (~m[:, 512]).sum() >= 2 and m[8, 512]  # tree slot 8 alone in range 2, seen by few rows
    assert int(x["tree_len"][3]) == 0


def test_split_masked(goldens):
    x = sim.inputs(goldens["split_masked_bf16"])
    m = visible(x, 0)
    assert not m[:, 256:].any() and m.any(-1).all()  # range 1 seen by no row of the block
    s = raw_scores(x, 0)
    assert (s[np.repeat(m[:, None, :], s.shape[1], 1)] < -104).all()  # f32 exp(s - 0) underflows to 0
    m = visible(x, 1)
    assert m[:, 256:].any(-1).any() and not m[:, 256:].any(-1).all()
    m = visible(x, 2)
    assert not m[[2, 5], 512:].any() and m[[0, 1], 512:].any(-1).all()


def test_split_nonfinite(goldens):
    x = sim.inputs(goldens["split_nonfinite_bf16"])
    e = goldens["split_nonfinite_bf16"][0]
    row_nan = np.isnan(e["expected.lse"])
    assert (np.isnan(e["expected.out"]).all(-1) == row_nan).all()
    kinds = gen.CONFIGS["split_nonfinite_bf16"].nonfinite
    ranges = gen.SPLIT_RANGES["split_nonfinite_bf16"][0]
    for r, kind in enumerate(kinds):
        tl = int(x["tree_len"][r])
        s, m = raw_scores(x, r), visible(x, r)
        seen = np.repeat(m[:, None, :], s.shape[1], 1)
        kv = x["kv_cache"][r, :521].astype(np.float64)
        bad_keys = ~np.isfinite(kv).all(-1)
        in_range = [bad_keys[a:b].any() for a, b in ranges]
        if "+" in kind:  # every range: each row sees only -inf scores (l 0 in every partial), NaN
            assert in_range == [True, True, True] and np.isneginf(s[seen]).all()
            assert m.any(-1).all() and row_nan[r, :tl].all()
            continue
        if kind.startswith(("nan_", "neg_inf_split", "inf_masked")):
            assert sum(in_range) == 1, kind  # the non-finite keys lie in one range
        if kind == "nan_tree_key":
            assert in_range == [False, False, True]
            assert (row_nan[r, :tl].all(-1) == m[:, 512 + tl - 2]).all() and (~m[:, 512 + tl - 2]).sum() >= 2
        elif kind == "nan_split_key:1":
            assert in_range == [False, True, False] and row_nan[r, :tl].all()
        elif kind == "inf_split_q:1":
            row = s[1, 0][m[1]]
            assert np.isposinf(row[256:512]).all() and np.isneginf(np.delete(row, np.s_[256:512])).all()
            assert row_nan[r, 1, 0] and row_nan[r, :tl].sum() == 1
        elif kind.startswith("neg_inf_split:"):
            a, b = ranges[int(kind[-1])]
            assert np.isneginf(s[..., a:b]).all() and np.isfinite(np.delete(s, np.s_[a:b], -1)).all()
            assert not row_nan[r].any() and np.isfinite(e["expected.out"][r, :tl]).all()
        elif kind == "inf_masked_value":
            assert in_range == [False, False, True]
            leaf = m[:, 512 + tl - 1]
            assert (row_nan[r, :tl].all(-1) == leaf).all() and (~leaf).sum() >= 2
            assert (np.isposinf(s[..., 512 + tl - 1]) & ~seen[..., 512 + tl - 1]).any()  # masked +inf scores


def test_split_empty_rows(goldens):
    x = sim.inputs(goldens["split_empty_rows_bf16"])
    e = goldens["split_empty_rows_bf16"][0]
    h = x["q"].shape[2]
    m = visible(x, 0)
    empty = ~m.any(-1)
    assert empty[3] and empty[32:64].all() and empty.sum() == 33  # row tile 1 (m = 64..127) has no key
    assert (e["expected.lse"][0][empty] == -np.inf).all() and (e["expected.out"][0][empty] == 0).all()
    assert m[256].sum() == 1 and m[256, 256] and not m[256, :256].any()  # range 0 masked for row 256
    assert not m[:256, 256].any()  # range 1 masked for every other row
    assert -(-int(x["tree_len"][1]) * h // BM) == 7 and -(-x["q"].shape[1] * h // BM) == 9
    m = visible(x, 1)
    assert not m[150, 120:].any() and m[150, :120].all()
    assert np.isfinite(e["expected.lse"][1:, :]).sum() == (200 + 257) * h


def test_split_k2(goldens):
    x = sim.inputs(goldens["split_k2_bf16"])
    assert x["q"].shape[1:] == (2, 64, 576) and int(x["d_v"]) == 512
    m = visible(x, 0)
    assert not m[0, 512] and m[1, 512]  # row tile 0 (tree row 0, 64 heads) sees nothing of range 2


# --- a split kernel passes, the bugs fail ----------------------------------------------------


@pytest.mark.parametrize("name", COMMITTED)
@pytest.mark.parametrize("round_p", [False, True])
def test_a_split_kernel_passes(name, round_p, goldens):
    x = sim.inputs(goldens[name])
    assert sim.judge(goldens[name], *split_kernel(x, round_p=round_p)) == PASS


# bug -> the goldens that must fail it (the others may or may not)
KILLS = {
    "floor_splits": ("split_lengths_bf16", "split_empty_rows_bf16", "split_k2_bf16", "split_many_bf16"),
    "four_tiles_per_range": ("split_many_bf16",),
    "combine_15": ("split_many_bf16",),
    "empty_split_nan": tuple(n for n in COMMITTED if n != "split_many_bf16"),  # its rows see every range
    "empty_split_m0": ("split_masked_bf16",),
    "combine_skip_nonfinite": ("split_nonfinite_bf16",),
    "combine_no_has_key": ("split_nonfinite_bf16",),
    "combine_no_empty_check": ("split_empty_rows_bf16",),
    "slot_mixup": ("split_empty_rows_bf16", "split_k2_bf16"),
}


@pytest.mark.parametrize(("bug", "name"), [(b, n) for b, ns in KILLS.items() for n in ns])
def test_the_bugs_fail(bug, name, goldens):
    x = sim.inputs(goldens[name])
    assert sim.judge(goldens[name], *split_kernel(x, round_p=True, bug=bug)) != PASS


def test_the_bugs_pass_unsplit_goldens():
    """The same bugs leave the tile goldens passing (no request of theirs splits): only the
    split goldens reach them."""
    for name in ("tail_tile_bf16", "odd_dv_bf16", "nan_scores_bf16"):
        g = gen.generate(name)
        x = sim.inputs(g)
        b, _, h, _ = x["q"].shape
        assert all(len(split_schedule(int(x["prefix_len"][r]), int(x["tree_len"][r]), h)) == 1 for r in range(b))
        for bug in KILLS:
            assert sim.judge(g, *split_kernel(x, round_p=True, bug=bug)) == PASS, (name, bug)
