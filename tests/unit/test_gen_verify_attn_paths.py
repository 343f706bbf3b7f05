"""The verify_attn goldens aimed at the CUDA kernels' tile paths (docs/ops/verify_attn.md,
"Goldens aimed at the kernels' tile paths") have the lengths and dims their descriptions
promise, pass a correct f32 online-softmax kernel (64-key tiles, exp2, P rounded to bf16 for
the bf16 goldens, simulated in numpy float32) and fail the bugs they aim at.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import kdtr
from kdtr.generators import gen_verify_attn_refs as gen
from kdtr.ops.verify_attn import verify_attn

# The simulated kernel and judge of the softmax goldens' test (one copy of the error model).
_spec = importlib.util.spec_from_file_location("_sim_attn", Path(__file__).with_name("test_gen_verify_attn.py"))
sim = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sim)

F32 = np.float32
LOG2E = F32(1.4426950408889634)
# name -> (dtype, H, Dqk, d_v, L per request)
PATHS = {
    "tail_tile_bf16": ("bf16", 2, 72, 64, [129, 150, 191]),
    "tail_tile_k2_bf16": ("bf16", 2, 576, 512, [150, 191]),
    "multi_tile_bf16": ("bf16", 2, 72, 64, [256, 290, 320, 384]),
    "multi_tile_k2_bf16": ("bf16", 2, 576, 512, [320, 330]),
    "odd_dv_bf16": ("bf16", 2, 72, 65, [79, 87]),
    "dv66": ("f32", 2, 72, 66, [79, 87]),
    "late_keys": ("f32", 2, 16, 8, [70, 81]),
    "late_keys_bf16": ("bf16", 2, 16, 8, [70, 81]),
    "vis_bytes": ("f32", 2, 16, 8, [9, 14, 6, 79]),
    "vis_bytes_bf16": ("bf16", 2, 16, 8, [9, 14, 6, 79]),
    "dv_full": ("f32", 2, 16, 16, [9, 79]),
    "dv1_bf16": ("bf16", 2, 16, 1, [9, 79]),
    "odd_dqk": ("f32", 2, 67, 33, [9, 79]),
    "odd_dqk_bf16": ("bf16", 2, 66, 33, [9, 79]),
}


@pytest.fixture(scope="module")
def goldens():
    return {name: gen.generate(name) for name in PATHS}


@pytest.mark.parametrize("name", sorted(PATHS))
def test_committed_golden_is_the_generation(name, goldens, repo_root):
    g = kdtr.load(repo_root / "golden" / "verify_attn" / f"{name}.kdtr")
    assert g.metadata["description"] == gen.CONFIGS[name].description
    for k, v in goldens[name][0].items():
        assert g.tensors[k].tobytes() == v.tobytes(), k
    assert (repo_root / "golden" / "verify_attn" / f"{name}.kdtr").stat().st_size <= 2 * 1024 * 1024


@pytest.mark.parametrize("name", sorted(PATHS))
def test_dims_and_lengths(name, goldens):
    dtype, h, dqk, d_v, lengths = PATHS[name]
    x = sim.inputs(goldens[name])
    assert x["q"].dtype == (F32 if dtype == "f32" else ml_dtypes.bfloat16)
    assert x["q"].shape[2:] == (h, dqk) and int(x["d_v"]) == d_v
    lens = (x["prefix_len"] + x["tree_len"]).tolist()
    assert lens == lengths
    assert lens[-1] == x["kv_cache"].shape[1], "the last request must end at S (a read of row L leaves the cache)"
    assert dqk % 8 == 0 and d_v <= 512 or dtype == "f32" or name == "odd_dqk_bf16"  # bf16 ones fit mma and wgmma


def test_tile_classes():
    tiles = {name: [(n + 63) // 64 for n in PATHS[name][4]] for name in PATHS}
    for name in ("tail_tile_bf16", "tail_tile_k2_bf16"):
        assert all(128 < n < 192 and n % 64 for n in PATHS[name][4]), name  # 3 tiles, the last partial
    for name in ("multi_tile_bf16", "multi_tile_k2_bf16"):
        assert min(tiles[name]) >= 4 and max(tiles[name]) >= 5, name  # buffers refilled twice, parity back
        assert any(n % 64 == 0 for n in PATHS[name][4]) and any(n % 64 for n in PATHS[name][4]), name
    assert PATHS["tail_tile_k2_bf16"][2:4] == (576, 512) and PATHS["multi_tile_k2_bf16"][2:4] == (576, 512)
    assert PATHS["odd_dv_bf16"][3] % 2 == 1 and PATHS["dv66"][3] % 4 == 2
    assert PATHS["dv_full"][3] == PATHS["dv_full"][2] and PATHS["dv1_bf16"][3] == 1


@pytest.mark.parametrize("name", sorted(PATHS))
@pytest.mark.parametrize("fold_log2e", [False, True])
def test_a_correct_f32_kernel_passes(name, fold_log2e, goldens):
    x = sim.inputs(goldens[name])
    for round_p in (False, True) if PATHS[name][0] == "bf16" else (False,):
        got = sim.kernel(x, round_p=round_p, fold_log2e=fold_log2e)
        assert sim.judge(goldens[name], *got) == {"out": True, "lse": True}, (round_p, fold_log2e)


def late_kernel(x, bug: str):
    """The f32 tile kernel of the CUDA kernels (64-key tiles, running max m, m_use = m with
    -inf replaced by 0, alpha = exp2((m_old - m_use) log2 e)) with one bug: ``zero_base``
    (exp of s - 0 while the row's old max is -inf: the substitute reaches the weights of the
    first tile that has a visible key), ``no_substitute`` (m_use = m: alpha = exp(-inf - -inf)
    = NaN after a fully masked tile)."""
    q, kv = x["q"], x["kv_cache"]
    b, t, h, _ = q.shape
    d_v = int(x["d_v"])
    out = np.zeros((b, t, h, d_v), F32)
    lse = np.full((b, t, h), -np.inf, F32)
    for r in range(b):
        pl, tl = int(x["prefix_len"][r]), int(x["tree_len"][r])
        keys = kv[r, : pl + tl].astype(F32)
        s = (np.einsum("thd,ld->thl", q[r, :tl].astype(F32), keys) * F32(x["sm_scale"])).astype(F32)
        mask = np.ones((tl, pl + tl), bool)
        mask[:, pl:] = x["visibility"][r, :tl, :tl] != 0
        s = np.where(mask[:, None, :], s, F32(-np.inf))
        m = np.full((tl, h), -np.inf, F32)
        l_run = np.zeros((tl, h), F32)
        o = np.zeros((tl, h, d_v), F32)
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            for k0 in range(0, pl + tl, 64):
                st = s[:, :, k0 : k0 + 64]
                m_new = np.maximum(m, st.max(-1))
                if bug == "zero_base":
                    m_use = np.where(np.isneginf(m), F32(0), m_new)
                elif bug == "no_substitute":
                    m_use = m_new
                else:
                    m_use = np.where(np.isneginf(m_new), F32(0), m_new)
                alpha = np.exp2(((m - m_use) * LOG2E).astype(F32)).astype(F32)
                p = np.exp2(((st - m_use[..., None]) * LOG2E).astype(F32)).astype(F32)
                l_run = (l_run * alpha + p.sum(-1, dtype=F32)).astype(F32)
                o = (o * alpha[..., None] + np.einsum("thl,lv->thv", p, keys[k0 : k0 + 64, :d_v])).astype(F32)
                m = m_new
            has_key = mask.any(-1)[:, None]
            nan = has_key & ~(l_run > 0)  # every visible weight underflowed (or NaN): the kernels write NaN
            out[r, :tl] = np.where(nan[..., None], np.nan, np.where(l_run[..., None] > 0, o / l_run[..., None], 0))
            lse[r, :tl] = np.where(nan, np.nan, np.where(l_run > 0, m + np.log(l_run), -np.inf))
    return out, lse


@pytest.mark.parametrize("name", ["late_keys", "late_keys_bf16"])
def test_late_keys_rows(name, goldens):
    x = sim.inputs(goldens[name])
    for r in range(x["q"].shape[0]):
        pl, tl = int(x["prefix_len"][r]), int(x["tree_len"][r])
        assert pl == 0
        scores, mask = sim.scores64(x, r)
        assert (scores[mask[:, None, :].repeat(scores.shape[1], 1)] < -88).all()  # below f32 exp's range
        if tl > 64:
            assert not mask[64:, :64].any() and mask[64:].any(-1).all()  # first tile fully masked, rows not empty
    assert int(x["tree_len"].max()) > 64
    assert np.isfinite(goldens[name][0]["expected.lse"][:, :64]).any()


@pytest.mark.parametrize("name", ["late_keys", "late_keys_bf16"])
def test_late_keys_kill_the_substitute_bugs(name, goldens):
    x = sim.inputs(goldens[name])
    assert sim.judge(goldens[name], *late_kernel(x, "")) == {"out": True, "lse": True}
    for bug in ("zero_base", "no_substitute"):
        assert sim.judge(goldens[name], *late_kernel(x, bug)) != {"out": True, "lse": True}, bug


@pytest.mark.parametrize("name", ["vis_bytes", "vis_bytes_bf16"])
def test_vis_bytes_other_than_one_decide(name, goldens):
    t, _ = goldens[name]
    x = sim.inputs(goldens[name])
    vis = x["visibility"]
    inside = np.concatenate([vis[r, :tl, :tl].ravel() for r, tl in enumerate(x["tree_len"].tolist())])
    assert {2, 0x80, 0xFF, 0xFE} <= set(inside.tolist())
    for wrong in (vis & 1, (vis.view(np.int8) > 0).astype(np.uint8), (vis == 1).astype(np.uint8)):
        y = dict(x, visibility=wrong)
        got = verify_attn(**y).as_dict()
        assert sim.judge(goldens[name], got["out"], got["lse"]) != {"out": True, "lse": True}
