"""The verify_attn goldens aimed at the CUDA kernels' 64-row blocks: infinite raw scores in blocks
with no padding row (``inf_scores``, ``inf_scores_bf16``, ``inf_scores_k2_bf16``) and d_v > 512,
which simt splits over gridDim.y (``dv_split``, ``dv_split_bf16``); docs/ops/verify_attn.md,
"Goldens aimed at the kernels' blocks".

A block kernel simulated in numpy float64 with the CUDA kernels' structure (a block = 64 rows
m = i * H + h of one request, rows past tree_len * H zero-filled, 64-key tiles with keys past L
zero-filled, the raw scores Q K^T of the whole block, a cleaning pass that zeroes the tile's
non-finite values when any raw score of the block is non-finite, IEEE products in P V) passes
them; with the bugs the GPU mutant catalogue plants (mutants/gpu/simt.toml, mma.toml,
wgmma.toml) it fails them: the cleaning triggered by NaN raw scores only
(``clean_trigger_nan_only``, ``nonfinite_flag_nan_only``), and the second column block of
d_v > 512 loading value columns from 0 (``split_block_values_from_column_0``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

import kdtr
from kdtr.generators import gen_verify_attn_refs as gen

_spec = importlib.util.spec_from_file_location("_sim_attn", Path(__file__).with_name("test_gen_verify_attn.py"))
sim = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sim)

INF = ("inf_scores", "inf_scores_bf16", "inf_scores_k2_bf16")
SPLIT = ("dv_split", "dv_split_bf16")
NEW = INF + SPLIT
PASS = {"out": True, "lse": True}
BM = BN = 64  # rows per block, keys per tile
DVT = 512  # simt's value columns per block (simt_*_dvt512): d_v > 512 takes gridDim.y = 2


@pytest.fixture(scope="module")
def goldens():
    return {name: gen.generate(name) for name in NEW + ("nan_scores", "nan_scores_bf16")}


def block_kernel(x, *, trigger: str = "nonfinite", values_from_0: bool = False):
    """out [B,T,H,d_v] f32, lse [B,T,H] f32 of the simulated block kernel (module docstring).

    trigger: "nonfinite" (the kernels: any NaN or +-inf raw score of the block cleans the tile)
    or "nan" (the mutants: NaN raw scores only). values_from_0: value columns >= DVT come from
    columns 0.. of the key rows (the column block's vbase left out of the V load)."""
    q, kv, vis = x["q"], x["kv_cache"], x["visibility"]
    b, t, h, dqk = q.shape
    d_v = int(x["d_v"])
    scale = float(np.float32(x["sm_scale"]))
    out = np.zeros((b, t * h, d_v), np.float64)
    lse = np.full((b, t * h), -np.inf)
    with np.errstate(invalid="ignore", over="ignore"):
        for r in range(b):
            pl, tl = int(x["prefix_len"][r]), int(x["tree_len"][r])
            n_valid, n_keys = tl * h, pl + tl
            qr = q[r].astype(np.float64).reshape(t * h, dqk)
            for m0 in range(0, n_valid, BM):
                rows = min(BM, n_valid - m0)
                qb = np.zeros((BM, dqk))
                qb[:rows] = qr[m0 : m0 + rows]
                i = (m0 + np.arange(BM)) // h
                m = np.full(BM, -np.inf)
                lsum = np.zeros(BM)
                o = np.zeros((BM, d_v))
                for p0 in range(0, n_keys, BN):
                    keys = min(BN, n_keys - p0)
                    kt = np.zeros((BN, dqk))
                    kt[:keys] = kv[r, p0 : p0 + keys].astype(np.float64)
                    raw = (qb[:, None, :] * kt[None, :, :]).sum(-1)  # IEEE: 0 * inf = NaN
                    dirty = np.isnan(raw).any() if trigger == "nan" else (~np.isfinite(raw)).any()
                    v = kt[:, :d_v].copy()
                    if values_from_0 and d_v > DVT:
                        v[:, DVT:] = kt[:, : d_v - DVT]
                    if dirty:
                        v = np.where(np.isfinite(v), v, 0.0)
                    p = p0 + np.arange(BN)
                    seen = np.zeros((BM, BN), bool)
                    for a in range(rows):
                        seen[a] = (p < pl) | ((p >= pl) & (p < n_keys) & (vis[r, i[a], np.clip(p - pl, 0, t - 1)] != 0))
                    s = np.where(seen, raw * scale, -np.inf)
                    m_new = np.maximum(m, s.max(-1))  # NaN propagates
                    m_use = np.where(m_new == -np.inf, 0.0, m_new)
                    alpha = np.exp(m - m_use)
                    w = np.exp(s - m_use[:, None])
                    lsum = lsum * alpha + w.sum(-1)
                    o = o * alpha[:, None] + (w[:, :, None] * v[None, :, :]).sum(1)  # IEEE: 0 * inf = NaN
                    m = m_new
                for a in range(rows):
                    has_key = pl > 0 or (vis[r, i[a], :tl] != 0).any()
                    if not has_key:
                        continue
                    if not lsum[a] > 0:  # NaN, or every visible score -inf
                        out[r, m0 + a], lse[r, m0 + a] = np.nan, np.nan
                    else:
                        out[r, m0 + a], lse[r, m0 + a] = o[a] / lsum[a], m[a] + np.log(lsum[a])
    return out.reshape(b, t, h, d_v).astype(np.float32), lse.reshape(b, t, h).astype(np.float32)


@pytest.mark.parametrize("name", NEW)
def test_committed_golden_is_the_generation(name, goldens, repo_root):
    path = repo_root / "golden" / "verify_attn" / f"{name}.kdtr"
    g = kdtr.load(path)
    assert g.metadata["description"] == gen.CONFIGS[name].description
    for k, v in goldens[name][0].items():
        assert g.tensors[k].tobytes() == v.tobytes(), k
    assert path.stat().st_size <= 2 * 1024 * 1024


@pytest.mark.parametrize("name", INF)
def test_inf_blocks_have_no_padding_row_and_no_nan(name, goldens):
    x = sim.inputs(goldens[name])
    b, t, h, dqk = x["q"].shape
    assert t * h % BM == 0 and (x["tree_len"] == t).all()  # every block: 64 valid rows
    q, kv = x["q"].astype(np.float64), x["kv_cache"].astype(np.float64)
    assert np.isfinite(q).all()
    lens = (x["prefix_len"] + x["tree_len"]).tolist()
    assert lens[-1] == kv.shape[1]
    saw = set()
    for r, n in enumerate(lens):
        keys = kv[r, :n]
        assert not np.isnan(keys).any()
        for sign in (np.inf, -np.inf):
            if (keys[:, : int(x["d_v"])] == sign).any():
                saw.add(sign)
        with np.errstate(invalid="ignore"):
            raw = (q[r][:, :, None, :] * keys[None, None, :, :]).sum(-1)
        assert not np.isnan(raw).any() and np.isinf(raw).any(), r  # infinite raw scores, none NaN
    assert saw == {np.inf, -np.inf}
    e = goldens[name][0]["expected.out"]
    assert np.isnan(e).any() and np.isfinite(e).any()


@pytest.mark.parametrize("name", INF + SPLIT)
def test_the_block_kernel_passes(name, goldens):
    x = sim.inputs(goldens[name])
    assert sim.judge(goldens[name], *block_kernel(x)) == PASS


@pytest.mark.parametrize("name", INF)
def test_inf_scores_kill_a_cleaning_pass_triggered_by_nan_only(name, goldens):
    x = sim.inputs(goldens[name])
    out, lse = block_kernel(x, trigger="nan")
    assert sim.judge(goldens[name], out, lse) != PASS
    e = goldens[name][0]["expected.out"]
    assert (np.isnan(out) & np.isfinite(e)).any()  # 0 * inf = NaN where the row is finite


@pytest.mark.parametrize("name", ["nan_scores", "nan_scores_bf16"])
def test_nan_scores_do_not_reach_it(name, goldens):
    """Why the mutants survived nan_scores: its blocks hold zero-filled padding rows (T * H = 10),
    whose raw scores 0 * -inf = NaN trigger the cleaning even when it tests NaN only."""
    x = sim.inputs(goldens[name])
    assert x["q"].shape[1] * x["q"].shape[2] < BM
    assert sim.judge(goldens[name], *block_kernel(x, trigger="nan")) == PASS


@pytest.mark.parametrize("name", SPLIT)
def test_dv_split_kills_value_columns_from_0(name, goldens):
    x = sim.inputs(goldens[name])
    assert DVT < int(x["d_v"]) <= x["q"].shape[3]
    assert sim.judge(goldens[name], *block_kernel(x, values_from_0=True)) != PASS
