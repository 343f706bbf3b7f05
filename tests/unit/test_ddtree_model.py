"""The tiny MLA target, the bigram drafter and the two reference decode loops
(kdtr.ops.ddtree_model, kdtr.generators.ddtree_synth): speculative decoding emits exactly the
tokens greedy decoding emits, every deciding margin clears the kernels' error bound, each
drafter mode reaches the path it is named for, a planted bug in the tree mask, the accept walk
or the KV commit changes an output, and bad weights or prompts are refused by name."""

from __future__ import annotations

import hashlib

import ml_dtypes
import numpy as np
import pytest

from kdtr.bf16 import round_to, widen
from kdtr.detmath import matmul_exact
from kdtr.generators.ddtree_synth import DRAFT_MODES, ModelDims, synth_models
from kdtr.ops import ddtree_model as dm

R, N, D, K = 6, 8, 4, 3  # steps, max budget, draft depth, top-k
PROMPT_LENS = (5, 12, 1)
SEEDS = (2, 3)


def decode(seed: int, mode: str, bug: str = ""):
    model, drafter, rng = synth_models(seed, ModelDims(), mode)
    prompts = [[int(t) for t in rng.integers(0, model.dims["V"], size=n)] for n in PROMPT_LENS]
    cap = max(PROMPT_LENS) + R * (N + 1) + N + 1
    st = dm.DecodeState.from_prompts(model, prompts, cap)
    b = len(prompts)
    recs = [dm.ddtree_step(model, drafter, st, np.full(b, N), np.full(b, D), D, K, N, bug=bug) for _ in range(R)]
    return model, drafter, prompts, cap, st, recs


@pytest.fixture(scope="module")
def runs():
    return {(s, m): decode(s, m) for s in SEEDS for m in DRAFT_MODES}


@pytest.mark.parametrize("mode", DRAFT_MODES)
@pytest.mark.parametrize("seed", SEEDS)
def test_speculative_equals_greedy(runs, seed, mode):
    model, _, prompts, cap, st, recs = runs[seed, mode]
    g = dm.greedy_decode(model, prompts, [len(e) for e in st.emitted], cap)
    assert st.emitted == g.emitted
    assert [len(e) for e in st.emitted] == [R + int(sum(r.accept.accepted_count[i] for r in recs))
                                            for i in range(len(prompts))]
    # the committed caches agree row for row (rows past n are NaN in both)
    for i in range(len(prompts)):
        n = int(st.n[i])
        assert n == int(g.n[i]) == PROMPT_LENS[i] - 1 + len(st.emitted[i])
        assert np.array_equal(widen(st.cache[i, :n]), widen(g.cache[i, :n]))
        assert np.isnan(widen(st.cache[i, n:])).all()
    bound = dm.logit_error_bound(model)
    assert min(min(m) for m in st.margins + g.margins) >= dm.MARGIN_FACTOR * bound


def _accepted_through_sibling(rec) -> int:
    tree, acc = rec.tree, rec.accept
    n = 0
    for i in range(len(acc.accepted_count)):
        path = acc.accepted_path[i, : acc.accepted_count[i] + 1]
        n += sum(int(tree.next_token[i, a]) != int(c) for a, c in zip(path[:-1], path[1:]))
    return n


@pytest.mark.parametrize("seed", SEEDS)
def test_each_mode_reaches_its_path(runs, seed):
    steps = R * len(PROMPT_LENS)
    accepted = {m: sum(int(r.accept.accepted_count.sum()) for r in runs[seed, m][5]) for m in DRAFT_MODES}
    assert accepted["chain"] >= 2.5 * steps  # deep acceptance
    assert accepted["random"] <= 1  # rejection at depth 0
    assert sum(_accepted_through_sibling(r) for r in runs[seed, "decoy"][5]) >= steps // 2
    assert sum(_accepted_through_sibling(r) for r in runs[seed, "chain"][5]) == 0
    lp = np.concatenate([r.top_log_probs.reshape(-1, K) for r in runs[seed, "ties"][5]])
    ids = np.concatenate([r.top_token_ids.reshape(-1, K) for r in runs[seed, "ties"][5]])
    tied = lp[:, 0] == lp[:, 1]
    assert tied.all() and (ids[tied, 0] < ids[tied, 1]).all()  # equal log-probs: the lower id first


def test_drafter_rows_are_tree_build_inputs(runs):
    for r in runs[2, "decoy"][5]:
        lp, ids = r.top_log_probs, r.top_token_ids
        assert lp.dtype == np.float32 and (np.diff(lp, axis=-1) <= 0).all() and (lp <= 0).all()
        assert all(len(set(row)) == K for row in ids.reshape(-1, K))
        assert (r.tree.status == 0).all()


def test_planted_bugs_change_an_output(runs):
    _, _, _, _, st, recs = runs[2, "decoy"]
    out_tol = dm.OUT_REL_ERROR * float(np.abs(widen(st.cache[:, :1])).max())  # a lower bound of the tolerance
    # tree mask: the tree rows' attention moves far past the tolerance a kernel gets
    _, _, _, _, _, bad = decode(2, "decoy", "tree_mask")
    assert max(float(np.abs(x.attn_out - y.attn_out).max()) for x, y in zip(bad, recs)) > 100 * out_tol
    # accept walk: the accepted counts (and paths) change
    _, _, _, _, _, bad = decode(2, "decoy", "accept_walk")
    assert [r.accept.accepted_count.tolist() for r in bad] != [r.accept.accepted_count.tolist() for r in recs]
    # KV commit: the committed cache rows change
    _, _, _, _, sb, _ = decode(2, "decoy", "kv_commit")
    assert any(not np.array_equal(widen(sb.cache[i, : st.n[i]]), widen(st.cache[i, : st.n[i]]))
               for i in range(len(PROMPT_LENS)))


def test_bits_are_pinned(runs):
    """The references' bits (drafts, trees, committed cache, tokens) for one configuration,
    pinned: a numpy, BLAS or host that changed any of them would change goldens."""
    _, _, _, _, st, recs = runs[3, "decoy"]
    h = hashlib.sha256()
    for r in recs:
        h.update(r.top_log_probs.tobytes() + r.top_token_ids.tobytes() + r.tree.node_token_ids.tobytes())
        h.update(r.accept.accepted_path.tobytes() + r.target_predict.tobytes() + r.attn_out.tobytes())
    h.update(np.nan_to_num(widen(st.cache)).tobytes() + repr(st.emitted).encode())
    assert h.hexdigest()[:16] == "3af95a7aafbdd45a"


def test_fixed_point_products_are_exact():
    model, _, _ = synth_models(5, ModelDims(), "chain")
    x = widen(model.emb)[:64]
    for w in (widen(model.w_q).reshape(model.dims["E"], -1), widen(model.w_kv), widen(model.w_lm)):
        assert np.array_equal(dm.fixed_point_product(x, w), matmul_exact(x, w))


# --- bad input --------------------------------------------------------------------------------


def _bf16(a):
    return round_to(np.asarray(a, np.float64), ml_dtypes.bfloat16)


@pytest.mark.parametrize(("value", "shape", "msg"), [
    (np.zeros((4, 2), np.float32), (4, 2), "dtype float32, must be bf16"),
    (_bf16(np.zeros((4, 3))), (4, 2), "shape \\[4, 3\\], must be \\[4, 2\\]"),
    (_bf16(np.full((4, 2), 1.5)), (4, 2), "within"),
    (_bf16(np.full((4, 2), np.nan)), (4, 2), "finite"),
    (_bf16(np.full((4, 2), 1 / 128)), (4, 2), "multiples of 2\\^-6"),
])
def test_bad_weights_are_named(value, shape, msg):
    with pytest.raises(ValueError, match=f"target_w_kv: {msg}" if "shape" in msg or "dtype" in msg else msg):
        dm.check_weight("target_w_kv", value, shape)


def test_bad_prompts_and_short_caches():
    model, drafter, _ = synth_models(2, ModelDims(), "chain")
    for prompts in ([[]], [[model.dims["V"]]], [[-1, 3]]):
        with pytest.raises(ValueError, match="prompt 0: needs"):
            dm.DecodeState.from_prompts(model, prompts, 16)
    st = dm.DecodeState.from_prompts(model, [[1, 2, 3]], 5)  # n = 2: a tree of 9 slots does not fit
    with pytest.raises(ValueError, match="request 0: kv_cache: S = 5 rows, the step needs"):
        dm.ddtree_step(model, drafter, st, np.array([N]), np.array([D]), D, K, N)
    with pytest.raises(ValueError, match="draft mode 'x' not in"):
        synth_models(2, ModelDims(), "x")
    with pytest.raises(ValueError, match="draft_top_k 0 outside"):
        dm.draft(drafter, 1, D, 0)
