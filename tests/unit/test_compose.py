"""kdtr.compose: requests of a golden, batches at other T/S/B, padding requests and their outputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kdtr import compose
from kdtr.judge import Golden
from kdtr.ops import OPS

ROOT = Path(__file__).resolve().parents[2]
GOLDENS = sorted((ROOT / "golden").glob("*/*.kdtr"))
SMALL = ["tree_build/ties", "verify_attn/ragged", "tree_accept/malformed", "greedy_step/finite_padding"]


def _golden(gid: str) -> Golden:
    return Golden.read(ROOT / "golden" / f"{gid}.kdtr")


def _bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.ascontiguousarray(a).tobytes() == \
        np.ascontiguousarray(b).tobytes()


def test_capture_size():
    assert [compose.capture_size(n) for n in (0, 1, 2, 3, 4, 5, 8, 9, 33, 64, 65)] == \
        [1, 1, 2, 4, 4, 8, 8, 16, 64, 64, 128]


@pytest.mark.parametrize("path", GOLDENS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_round_trip_every_golden(path):
    g = Golden.read(path)
    reqs = compose.requests(g.op, g.inputs, g.metadata)
    assert len(reqs) == next(np.asarray(g.inputs[s.name]).shape[0] for s in OPS[g.op].inputs if s.dims[:1] == ("B",))
    assert [r.source for r in reqs] == [f"{g.id}#{i}" for i in range(len(reqs))]
    inputs, meta = compose.batch(g.op, reqs)
    assert set(inputs) == set(g.inputs)
    for name, arr in g.inputs.items():
        assert _bits_equal(inputs[name], np.asarray(arr)), name
    if "max_budget" in OPS[g.op].metadata:
        assert meta["max_budget"] == g.metadata["max_budget"]
    if "dtype" in g.metadata:
        assert meta["dtype"] == g.metadata["dtype"]


@pytest.mark.parametrize("gid", SMALL)
def test_reverse_then_live_outputs_equal_reference(gid):
    g = _golden(gid)
    reqs = compose.requests(g.op, g.inputs, g.metadata)
    rev = reqs[::-1]
    inputs, meta = compose.batch(g.op, rev)
    got = compose.live_outputs(g.op, OPS[g.op].reference(inputs, meta), rev)
    want = compose.live_outputs(g.op, g.expected, reqs)
    for i, r in enumerate(rev):
        j = reqs.index(r)
        for name in want[j]:
            assert _bits_equal(np.ascontiguousarray(got[i][name]), np.ascontiguousarray(want[j][name])), (gid, i, name)


@pytest.mark.parametrize("gid", SMALL)
def test_padded_batch_reference_matches_and_padding_documented(gid):
    g = _golden(gid)
    reqs = [r for r in compose.requests(g.op, g.inputs, g.metadata) if not compose.t_sensitive(r)]
    assert reqs
    pad = compose.padding_request(g.op, reqs[0])
    assert compose.compatible(pad, reqs[0])
    rows = reqs + [pad] * (compose.capture_size(len(reqs) + 1) - len(reqs))
    t = compose.capture_size(reqs[0].T + 1) + 1
    s = None if reqs[0].S is None else max(r.S for r in reqs) + 7
    if g.op == "greedy_step":
        s = max(int(r.arrays["prefix_len"]) for r in reqs) + t + 3
    inputs, meta = compose.batch(g.op, rows, T=t, S=s)
    ref = OPS[g.op].reference(inputs, meta)
    live = compose.live_outputs(g.op, ref, rows)
    want = compose.live_outputs(g.op, g.expected, compose.requests(g.op, g.inputs, g.metadata))
    by_src = {r.source: i for i, r in enumerate(compose.requests(g.op, g.inputs, g.metadata))}
    for i, r in enumerate(reqs):
        for name, w in want[by_src[r.source]].items():
            assert _bits_equal(np.ascontiguousarray(live[i][name]), np.ascontiguousarray(w)), (gid, r.source, name)
    prow = list(range(len(reqs), len(rows)))
    doc = compose.padding_outputs(g.op, inputs, meta, prow)
    for name, arr in doc.items():
        assert compose.padding_mismatch(name, ref[name][prow], arr) is None
    # Slots beyond a request's own T: the reference's padding values, which beyond_outputs
    # gives from one padding row.
    doc_live = compose.padding_outputs(g.op, inputs, meta, list(range(len(reqs))))
    cheap = compose.beyond_outputs(g.op, reqs[0], t)
    for sp in OPS[g.op].outputs:
        if "T" in sp.dims[1:]:
            for i, r in enumerate(reqs):
                mask = np.ones(ref[sp.name][i].shape, bool)
                mask[tuple(slice(0, r.T) if d == "T" else slice(None) for d in sp.dims[1:])] = False
                assert compose.padding_mismatch(sp.name, ref[sp.name][i][mask], doc_live[sp.name][i][mask]) is None
                assert compose.padding_mismatch(sp.name, cheap[sp.name][mask], doc_live[sp.name][i][mask]) is None


def test_padding_request_inputs_documented():
    g = _golden("tree_build/ties")
    r = compose.requests(g.op, g.inputs, g.metadata)[0]
    p = compose.padding_request("tree_build", r)
    assert p.is_padding and p.T == 1
    assert int(p.arrays["budget"]) == 0 and int(p.arrays["depth_limit"]) == 0
    assert (p.arrays["top_token_ids"] == -1).all() and int(p.arrays["root_token_ids"]) == -1
    assert "top_log_probs" not in p.arrays  # stale
    inputs, meta = compose.batch("tree_build", [r, p])
    assert np.isnan(inputs["top_log_probs"][1]).all()
    out = compose.padding_outputs("tree_build", inputs, meta, [1])
    assert int(out["status"][0]) == 0 and int(out["node_count"][0]) == 0
    assert int(out["node_token_ids"][0, 0]) == -1 and (out["node_token_ids"][0, 1:] == -1).all()

    v = _golden("verify_attn/ragged")
    vr = compose.requests(v.op, v.inputs, v.metadata)[0]
    vp = compose.padding_request("verify_attn", vr)
    inputs, meta = compose.batch("verify_attn", [vp, vr])
    assert int(inputs["tree_len"][0]) == 0 and int(inputs["prefix_len"][0]) == 0
    assert (inputs["visibility"][0] == compose.POISON_BYTE).all()
    out = compose.padding_outputs("verify_attn", inputs, meta, [0])
    assert (out["out"] == 0).all() and np.isneginf(out["lse"]).all()


def test_stale_fills_unfilled_slots():
    g = _golden("tree_accept/malformed")
    r = compose.requests(g.op, g.inputs, g.metadata)[0]
    p = compose.padding_request("tree_accept", r)
    t = r.T + 3
    stale = {"node_token_ids": np.full((2, t), 77, np.int64)}
    inputs, _ = compose.batch("tree_accept", [r, p], T=t, stale=stale)
    assert (inputs["node_token_ids"][0, r.T:] == 77).all()
    assert int(inputs["node_token_ids"][1, 0]) == -1 and (inputs["node_token_ids"][1, 1:] == 77).all()
    assert (inputs["next_token"][0, r.T:].view(np.uint8) == compose.POISON_BYTE).all()
    with pytest.raises(ValueError, match="stale node_token_ids"):
        compose.batch("tree_accept", [r, p], T=t, stale={"node_token_ids": np.zeros((2, t), np.int32)})


def test_incompatible_and_bad_sizes_refused():
    a = compose.requests("tree_build", *_gm("tree_build/ties"))[0]
    b = compose.requests("tree_build", *_gm("tree_build/default"))[0]
    assert not compose.compatible(a, b)
    with pytest.raises(ValueError, match="cannot share a batch"):
        compose.batch("tree_build", [a, b])
    with pytest.raises(ValueError, match="smaller than a request's own T"):
        compose.batch("tree_build", [a], T=a.T - 1)
    v = compose.requests("verify_attn", *_gm("verify_attn/small"))
    w = compose.requests("verify_attn", *_gm("verify_attn/small_bf16"))
    assert compose.compatible(v[0], v[1]) and not compose.compatible(v[0], w[0])
    with pytest.raises(ValueError, match="S = 3 is smaller"):
        compose.batch("verify_attn", v, S=3)
    gs = compose.requests("greedy_step", *_gm("greedy_step/finite_padding"))
    with pytest.raises(ValueError, match="smaller than the requests need"):
        compose.batch("greedy_step", gs, T=gs[0].T + 8, S=gs[0].S)
    with pytest.raises(ValueError, match="no requests"):
        compose.batch("tree_build", [])


def test_t_sensitive_requests():
    g = _golden("tree_accept/malformed")
    reqs = compose.requests(g.op, g.inputs, g.metadata)
    sens = [r for r in reqs if compose.t_sensitive(r)]
    assert sens and all(not 0 <= int(r.arrays["node_count"]) <= r.T - 1 for r in sens)
    tb = _golden("tree_build/invalid")
    assert any(compose.t_sensitive(r) for r in compose.requests(tb.op, tb.inputs, tb.metadata))


def test_padding_mismatch_nan_payload_and_values():
    a = np.array([np.nan, 1.0, 0.0], np.float32)
    b = a.copy()
    b.view(np.uint32)[0] = 0xFFC00000  # another NaN
    assert compose.padding_mismatch("x", b, a) is None
    c = a.copy()
    c[2] = -0.0
    assert "x[2]" in compose.padding_mismatch("x", c, a)
    assert compose.padding_mismatch("i", np.array([1, 2]), np.array([1, 3])).startswith("i[1]: ")
    assert "documented int32" in compose.padding_mismatch("i", np.zeros(2, np.int64), np.zeros(2, np.int32))


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_padding_mismatch_a_nan_matches_only_a_nan(dtype):
    from kdtr.dtypes import DTYPE_BY_NAME

    dt = DTYPE_BY_NAME[dtype].numpy
    doc = np.array([0.0, -np.inf, np.nan, 0.0], np.float32).astype(dt)
    for k, value in [(0, np.nan), (1, np.nan), (2, 0.0), (2, -np.inf), (3, -0.0), (1, np.inf)]:
        got = doc.copy()
        got[k] = value
        assert f"x[{k}]" in (compose.padding_mismatch("x", got, doc) or ""), (k, value)
    assert compose.padding_mismatch("x", doc.copy(), doc) is None


def _gm(gid):
    g = _golden(gid)
    return g.inputs, g.metadata


def test_requests_of_other_n_share_a_batch_at_a_common_t():
    a = compose.requests("tree_build", *_gm("tree_build/default"))  # N = 64, D = K = 8
    b = compose.requests("tree_build", *_gm("tree_build/root_only"))  # N = 16, D = K = 8
    assert not compose.compatible(a[0], b[0])
    assert compose.compatible(a[0], b[0], ignore=("max_budget",))
    inputs, meta = compose.batch("tree_build", [b[0], a[0]])
    assert meta["max_budget"] == 64
    ref = OPS["tree_build"].reference(inputs, meta)
    g = _golden("tree_build/default")
    for name, want in compose.live_outputs("tree_build", g.expected, a)[0].items():
        assert _bits_equal(np.ascontiguousarray(compose.live_outputs("tree_build", ref, [b[0], a[0]])[1][name]),
                           np.ascontiguousarray(want)), name


def test_requests_refuse_inputs_off_the_spec():
    g = _golden("verify_attn/small")
    inputs = dict(g.inputs)
    del inputs["tree_len"]
    with pytest.raises(ValueError, match="input 'tree_len' missing"):
        compose.requests("verify_attn", inputs, g.metadata)
    inputs = dict(g.inputs, tree_len=np.zeros(3, np.int32))
    with pytest.raises(ValueError, match="dim B = 3, but 2"):
        compose.requests("verify_attn", inputs, g.metadata)
    with pytest.raises(ValueError, match="metadata 'max_budget' missing"):
        tb = _golden("tree_build/ties")
        compose.requests("tree_build", tb.inputs, {k: v for k, v in tb.metadata.items() if k != "max_budget"})
    with pytest.raises(ValueError, match="unknown op"):
        compose.requests("nope", g.inputs, g.metadata)


def test_padding_requests_of_tree_accept_and_greedy_step():
    ta = compose.requests("tree_accept", *_gm("tree_accept/chain"))
    p = compose.padding_request("tree_accept", ta[0])
    inputs, meta = compose.batch("tree_accept", [p, ta[0]])
    assert int(inputs["node_count"][0]) == 0 and int(inputs["node_token_ids"][0, 0]) == -1
    out = compose.padding_outputs("tree_accept", inputs, meta, [0])
    assert int(out["status"][0]) == 4 and int(out["accepted_count"][0]) == 0  # NEGATIVE_TOKEN: root -1
    assert out["accepted_path"][0].tolist() == [0] + [-1] * (ta[0].T - 1) and (out["proposed"][0] == -1).all()

    gs = compose.requests("greedy_step", *_gm("greedy_step/finite_padding"))
    p = compose.padding_request("greedy_step", gs[0])
    assert set(p.arrays) == {"top_token_ids", "root_token_ids", "budget", "depth_limit", "prefix_len",
                             "target_predict"}  # top_log_probs, q and kv_cache stale
    inputs, meta = compose.batch("greedy_step", [gs[0], p])
    assert inputs["kv_cache"].shape[1] == max(gs[0].S, int(gs[0].arrays["prefix_len"]) + gs[0].T)
    out = compose.padding_outputs("greedy_step", inputs, meta, [1])
    assert int(out["tree_build.node_count"][0]) == 0 and int(out["tree_build.status"][0]) == 0
    assert int(out["tree_accept.status"][0]) == 4
    lse = out["verify_attn.lse"][0]
    assert np.isnan(lse[0]).all() and np.isneginf(lse[1:]).all()  # row 0 attends to the poisoned cache row 0
    with pytest.raises(ValueError, match="not tree_build"):
        compose.padding_request("tree_build", gs[0])


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_padding_mismatch_holds_a_padding_request_to_the_outputs_allclose_contract(dtype):
    # A padding request's attention is a kernel result (ddtree_decode's attn_out: the
    # reference's float64 value is not a GPU kernel's bits): within the golden's contract it
    # is the documented value; outside it, or a non-finite value moved, it is not.
    from kdtr.contract import Contract
    from kdtr.dtypes import DTYPE_BY_NAME

    dt = DTYPE_BY_NAME[dtype].numpy
    c = Contract("allclose", atol=2.0 ** -6)
    doc = np.array([0.5, np.nan, -np.inf, 0.0], np.float32).astype(dt)
    near = np.array([0.5 + 2.0 ** -8, np.nan, -np.inf, 2.0 ** -7], np.float32).astype(dt)
    assert compose.padding_mismatch("o", near, doc, c) is None
    assert compose.padding_mismatch("o", near, doc) is not None  # without the contract: exact
    far = near.copy()
    far[0] = 0.75
    assert "outside allclose(atol=0.015625" in compose.padding_mismatch("o", far, doc, c)
    for k, value in [(1, 0.0), (2, 0.0), (2, np.inf)]:
        moved = near.copy()
        moved[k] = value
        assert f"o[{k}]" in compose.padding_mismatch("o", moved, doc, c), (k, value)
    assert compose.padding_mismatch("o", near, doc, Contract()) is not None  # an exact contract stays exact
