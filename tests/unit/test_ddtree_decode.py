"""ddtree_decode's reference and generator (kdtr.ops.ddtree_decode,
kdtr.generators.gen_ddtree_decode_refs): every configuration generates (greedy decoding
agrees, margins clear the bound), the same bytes twice; the judge passes the reference's
outputs and fails each planted bug (tree mask, accept walk, KV commit); a seed below the
margin rule fails generation; bad inputs are refused naming the tensor."""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest

import kdtr
from kdtr.bf16 import round_to
from kdtr.generators import gen_ddtree_decode_refs as gen
from kdtr.judge import Golden, judge
from kdtr.ops import ddtree_decode as op
from kdtr.status import Status

COMMITTED = [n for n, c in gen.CONFIGS.items() if c.tier == "committed"]


@pytest.fixture(scope="module")
def goldens(tmp_path_factory):
    d = tmp_path_factory.mktemp("ddtree")
    out = {}
    for name in COMMITTED:
        tensors, meta = gen.generate(name)
        kdtr.save(d / f"{name}.kdtr", tensors, meta)
        out[name] = (tensors, meta, Golden.read(d / f"{name}.kdtr"))
    return out


def inputs_of(tensors):
    return {k[len("input."):]: v for k, v in tensors.items() if k.startswith("input.")}


@pytest.mark.parametrize("name", COMMITTED)
def test_configs_generate_deterministically(goldens, name):
    tensors, meta, _ = goldens[name]
    assert meta["min_margin"] >= meta["margin_factor"] * meta["logit_error_bound"]
    again, meta2 = gen.generate(name)
    assert meta2 == meta and all(again[k].tobytes() == v.tobytes() for k, v in tensors.items())
    assert sum(a.nbytes for a in tensors.values()) < 400_000


def test_configs_reach_their_paths(goldens):
    acc = {n: goldens[n][1]["accepted_per_step"] for n in COMMITTED}
    assert acc["chain"] >= 3 and acc["batch"] >= 3 and acc["reject"] <= 0.1 and 0.3 <= acc["decoy"] <= 1.5
    t = goldens["decoy"][0]
    assert (t["expected.node_count"][:, 2] == 0).all()  # budget 0: a root-only tree, the bonus token alone
    assert (t["expected.accepted_count"][:, 2] == 0).all()
    lp = goldens["ties"][0]["expected.top_log_probs"]
    assert (lp[..., 0] == lp[..., 1]).all()
    assert (goldens["reject"][0]["input.root_token_ids"] == 0).all()
    pl = goldens["batch"][0]["input.prefix_len"]
    assert pl.min() == 0 and pl.max() == 29 and len(pl) == 8


@pytest.mark.parametrize("name", COMMITTED)
def test_the_judge_passes_the_reference(goldens, name):
    tensors, meta, golden = goldens[name]
    got = op.reference(inputs_of(tensors), meta)
    assert judge(golden, got).status == Status.PASS
    tol = float(meta["contract.attn_out.atol"])
    near = dict(got, attn_out=(got["attn_out"] + np.float32(0.5 * tol)).astype(np.float32))
    assert judge(golden, near).status == Status.PASS
    far = dict(got, attn_out=(got["attn_out"] + np.float32(4 * tol)).astype(np.float32))
    assert judge(golden, far).status == Status.MISMATCH


@pytest.mark.parametrize(("bug", "names"), [("tree_mask", tuple(COMMITTED)), ("accept_walk", ("decoy",)),
                                            ("kv_commit", ("chain", "decoy", "batch"))])
def test_planted_bugs_fail_the_goldens(goldens, bug, names):
    for name in names:
        tensors, meta, golden = goldens[name]
        n = int(meta["max_budget"])
        bad = op.outputs(*op.run(inputs_of(tensors), n, bug=bug), n)
        assert judge(golden, bad).status == Status.MISMATCH, (bug, name)


def test_a_seed_below_the_margin_rule_fails_generation(goldens, monkeypatch):
    monkeypatch.setitem(gen.CONFIGS, "batch", dataclasses.replace(gen.CONFIGS["batch"], seed=3))
    with pytest.raises(ValueError, match="ddtree_decode/batch: smallest deciding margin .* pick another seed"):
        gen.generate("batch")


@pytest.mark.parametrize(("field", "value", "msg"), [
    ("prefix_len", np.array([0, 4, 99], np.int32), "prefix_len: request 2 outside"),
    ("root_token_ids", np.array([1, -1, 2], np.int64), "root_token_ids: request 1 outside"),
    ("budget", np.zeros((3,), np.int32), "budget and depth_limit: must be"),
    ("budget", np.full((3, 6), 9, np.int32), "budget / depth_limit: outside"),
    ("draft_top_k", np.array(0, np.int32), "draft_top_k: 0 outside"),
    ("draft_depth", np.array(0, np.int32), "draft_depth: 0 < 1"),
    ("kv_cache", np.zeros((3, 90, 24), np.float32), "kv_cache: must be bf16"),
    ("target_w_kv", round_to(np.full((32, 24), 0.3), ml_dtypes.bfloat16), "target_w_kv: values must be multiples"),
])
def test_bad_inputs_name_the_tensor(goldens, field, value, msg):
    x = dict(inputs_of(goldens["chain"][0]), **{field: value})
    with pytest.raises(ValueError, match=msg):
        op.run(x, 8)


def test_invariance_checks_the_cache_rows_beyond_a_requests_own_s(goldens):
    """A batch at a larger S: the rows of final_kv_cache past a request's own S are held to
    the documented 0 (kdtr.run.invariance, via compose.beyond_outputs with S)."""
    from kdtr import compose
    from kdtr.run.invariance import Composition, _padding_differences

    tensors, meta, golden = goldens["chain"]
    reqs = compose.requests("ddtree_decode", golden.inputs, golden.metadata)
    s_own = int(reqs[0].S)
    inputs, bmeta = compose.batch("ddtree_decode", reqs, S=s_own + 16)
    got = {k: np.array(v) for k, v in op.reference(inputs, bmeta).items()}
    c = Composition("padded S", reqs, [0, 1, 2], inputs, bmeta, T=reqs[0].T)
    assert _padding_differences("ddtree_decode", c, got, {}) == []
    got["final_kv_cache"][1, s_own + 3, 0] = round_to(np.array(1.0), got["final_kv_cache"].dtype)
    diff = _padding_differences("ddtree_decode", c, got, {})
    assert len(diff) == 1 and "row 1 (slots beyond T = 9 of ddtree_decode/chain#1): final_kv_cache" in diff[0], diff


@pytest.mark.slow  # the K2-dims golden: about 20 s to generate, 26 MB
def test_the_k2_dims_config_meets_the_margin_rule_and_the_reference(tmp_path):
    tensors, meta = gen.generate("k2_dims")
    assert gen.CONFIGS["k2_dims"].tier == "cache"
    assert meta["min_margin"] >= meta["margin_factor"] * meta["logit_error_bound"]
    assert meta["accepted_per_step"] >= 2
    assert tensors["input.target_w_q"].shape == (32, 64, 576) and tensors["input.target_w_o"].shape == (64, 512, 32)
    kdtr.save(tmp_path / "k2.kdtr", tensors, meta)
    got = op.reference(inputs_of(tensors), meta)
    assert judge(Golden.read(tmp_path / "k2.kdtr"), got).status == Status.PASS
