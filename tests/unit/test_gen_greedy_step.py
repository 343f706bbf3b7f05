"""greedy_step/finite_padding (it kills a mutation survivor): underfull trees whose padding query rows (past
node_count) hold finite q, so a chain that sizes the tree from the budget (or from N)
instead of node_count computes those rows as attention and fails, where NaN-poisoned q
would only have made them NaN."""

from __future__ import annotations

import numpy as np
import pytest

import kdtr
from kdtr.compare import compare
from kdtr.contract import Contract
from kdtr.generators import gen_greedy_step_refs as gen
from kdtr.ops.verify_attn import verify_attn


@pytest.fixture(scope="module")
def golden():
    return gen.generate("finite_padding")


def test_committed_golden_is_the_generation(golden, repo_root):
    with kdtr.load(repo_root / "golden" / "greedy_step" / "finite_padding.kdtr") as f:
        assert f.metadata["config"] == "finite_padding" and f.metadata["max_budget"] == 16
        for k, v in golden[0].items():
            assert np.asarray(f.tensors[k]).tobytes() == v.tobytes(), k


def test_underfull_trees_with_finite_padding_q(golden):
    t = golden[0]
    n = t["expected.tree_build.node_count"]
    budget = t["input.budget"]
    cfg = gen.CONFIGS["finite_padding"]
    assert budget.tolist() == list(cfg.budgets) and (n < cfg.budget).all()
    assert (n < budget).any() and (n == budget).any()  # underfull for its budget, and full to a budget < N
    q = t["input.q"]
    assert np.isfinite(q).all()  # padding q rows included
    kv, pl = t["input.kv_cache"], t["input.prefix_len"]
    lse, out = t["expected.verify_attn.lse"], t["expected.verify_attn.out"]
    for r in range(len(n)):
        tl = int(n[r]) + 1
        assert np.isnan(kv[r, pl[r] + tl :]).all() and np.isfinite(kv[r, : pl[r] + tl]).all()
        assert (lse[r, tl:] == -np.inf).all() and (out[r, tl:] == 0).all()
        assert np.isfinite(lse[r, :tl]).all()
    assert (pl > 0).sum() >= 3 and (pl == 0).any()
    assert (t["expected.tree_accept.status"] == 0).all() and (t["expected.tree_accept.accepted_count"] > 0).all()


@pytest.mark.parametrize("sized_from", ["budget", "N"])
def test_a_chain_sizing_the_tree_from_the_budget_fails(golden, sized_from):
    """verify_attn run with tree_len = budget + 1 (or N + 1) over tree_build's visibility, the
    cache rows past the real tree made finite (a kernel sized that way would not see the
    poison in the rows it reads as keys either way: they are masked): the padding rows of
    the requests with a prefix become finite, a MISMATCH under the golden's contracts."""
    t, md = golden
    n = t["expected.tree_build.node_count"]
    tl = t["input.budget"] + 1 if sized_from == "budget" else np.full_like(n, md["max_budget"] + 1)
    kv = np.nan_to_num(t["input.kv_cache"], nan=0.25)
    w = verify_attn(t["input.q"], kv, t["input.prefix_len"], tl.astype(np.int32), t["expected.tree_build.visibility"],
                    t["input.sm_scale"], t["input.d_v"])
    res = {name: compare(f"verify_attn.{name}", t[f"expected.verify_attn.{name}"], getattr(w, name),
                         Contract.from_metadata(md, f"verify_attn.{name}")) for name in ("out", "lse")}
    assert not res["out"].ok and not res["lse"].ok
