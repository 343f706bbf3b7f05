"""Each tree_build configuration exercises the code path its name promises."""

from __future__ import annotations

import numpy as np
import pytest

import kdtr
from kdtr import goldens
from kdtr.generators import REGISTRY
from kdtr.generators import gen_tree_build_refs as gen
from kdtr.ops.tree_build import STATUS_NAMES

REQUIRED = {
    "default", "mid", "wide", "deep", "underfull", "chain", "ties", "root_only", "mixed", "token_id_zero",
    "large_batch", "invalid", "near_ties",
}


@pytest.fixture(scope="module")
def gens():
    return {name: gen.generate(name)[0] for name in gen.CONFIGS if gen.CONFIGS[name].tier == "committed"}


def test_required_configs_exist():
    assert REQUIRED <= set(gen.CONFIGS)
    big = gen.CONFIGS["large_batch_n1024"]
    assert (big.batch, big.depth, big.topk, big.budget, big.tier) == (64, 16, 16, 1024, "cache")


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_committed_golden_matches_generation(name, gens, repo_root):
    g = kdtr.load(repo_root / "golden" / "tree_build" / f"{name}.kdtr")
    assert g.metadata["op"] == "tree_build" and g.metadata["max_budget"] == gen.CONFIGS[name].budget
    for k, v in gens[name].items():
        assert g.tensors[k].tobytes() == v.tobytes(), k


def test_inputs_follow_the_contract_where_valid(gens):
    for name in REQUIRED - {"invalid", "mixed"}:
        lp = gens[name]["input.top_log_probs"]
        assert np.isfinite(lp).all() and (lp[..., :-1] >= lp[..., 1:]).all(), name
        assert (gens[name]["expected.status"] == 0).all(), name


def test_ties_are_real(gens):
    lp = gens["ties"]["input.top_log_probs"]
    assert (lp == 0.0).any() and (lp[..., :-1] == lp[..., 1:]).mean() > 0.3


def test_underfull_chain_root_only(gens):
    assert (gens["underfull"]["expected.node_count"] == 3 + 9 + 27).all()
    assert (gens["chain"]["expected.node_count"] == 16).all()  # depth 16 < budget 32
    assert (gens["chain"]["expected.next_sibling"] == -1).all()
    ro = gens["root_only"]
    assert ro["expected.node_count"].tolist() == [0, 0, 0, 0]
    assert (ro["input.budget"] == 0).any() and (ro["input.depth_limit"] == 0).any()


def test_mixed_limits_and_poison(gens):
    m = gens["mixed"]
    assert len(set(m["input.budget"].tolist())) > 3 and len(set(m["input.depth_limit"].tolist())) > 3
    assert (m["expected.node_depths"].max(axis=1) <= m["input.depth_limit"]).all()
    assert (m["expected.node_count"] <= m["input.budget"]).all()
    assert np.isnan(m["input.top_log_probs"]).any()  # rows past the limit are poisoned...
    assert (m["expected.status"] == 0).all()  # ...and never read


def test_token_id_zero_in_trees(gens):
    z = gens["token_id_zero"]
    assert z["input.root_token_ids"][0] == 0
    assert all(0 in z["expected.node_token_ids"][b, 1:] for b in range(z["expected.node_count"].shape[0]))


def test_invalid_statuses(gens):
    st = gens["invalid"]["expected.status"].tolist()
    assert {STATUS_NAMES[s] for s in st} == set(STATUS_NAMES.values())
    assert st[0] == 0 and st[-1] == 0


def test_second_tier_is_generated_on_demand_and_hash_checked(repo_root, tmp_path, monkeypatch):
    import shutil

    gdir = tmp_path / "golden"
    gdir.mkdir()
    shutil.copy(repo_root / "golden" / "MANIFEST.json", gdir / "MANIFEST.json")
    path = goldens.ensure_cached(gdir, REGISTRY, "tree_build", "large_batch_n1024")
    assert path.parent == gdir / ".cache" / "tree_build"
    entry = goldens.read_manifest(gdir)["files"]["tree_build/large_batch_n1024.kdtr"]
    assert goldens.sha256_of(path) == entry["sha256"]
    path.write_bytes(b"stale")  # a stale cache entry is regenerated
    assert kdtr.load(goldens.ensure_cached(gdir, REGISTRY, "tree_build", "large_batch_n1024")).metadata["config"] == (
        "large_batch_n1024")
    import dataclasses

    cfg = gen.CONFIGS["large_batch_n1024"]
    monkeypatch.setitem(gen.CONFIGS, "large_batch_n1024", dataclasses.replace(cfg, seed=cfg.seed + 1))
    path.unlink()
    with pytest.raises(ValueError, match="does not match its manifest"):
        goldens.ensure_cached(gdir, REGISTRY, "tree_build", "large_batch_n1024")


# --- near_ties (it kills mutation survivors) ----------------------------------------------------------------------


def best_first(lp, ids, budget, depth_limit, sibling):
    """(tokens, parents) of slots 1..n, built with a plain list (no heap) and the sibling
    score ``sibling(w, lp[d-1][r], lp[d-1][r+1])``; child w + lp[d][0]; the best candidate is
    the largest w, then the smallest rank path (a path before its own extensions). An
    independent re-implementation of kdtr/ops/tree_build.py's builder, to replay bugs."""
    lp = lp.astype(np.float64).tolist()
    k = len(lp[0])
    cands = [(lp[0][0], (0,), 1, 0, 0)] if budget > 0 and depth_limit > 0 else []
    tokens, parents = [], []
    while cands and len(tokens) < budget:
        best = min(cands, key=lambda c: (-c[0], c[1]))
        cands.remove(best)
        w, path, d, r, p = best
        tokens.append(int(ids[d - 1][r]))
        parents.append(p)
        if r + 1 < k:
            cands.append((sibling(w, lp[d - 1][r], lp[d - 1][r + 1]), path[:-1] + (r + 1,), d, r + 1, p))
        if d < depth_limit:
            cands.append((w + lp[d][0], path + (0,), d + 1, 0, len(tokens)))
    return tokens, parents


RIGHT = lambda w, a, b: (w - a) + b  # noqa: E731  (the contract)
WRONG = {
    "swap": lambda w, a, b: (w + b) - a,  # the mutation study's survivor 3
    "diff": lambda w, a, b: w + (b - a),
}


def requests(g):
    x = {k[len("input."):]: v for k, v in g.items() if k.startswith("input.")}
    return [(x["top_log_probs"][r], x["top_token_ids"][r], int(x["budget"][r]), int(x["depth_limit"][r]))
            for r in range(len(x["budget"]))]


def test_near_ties_independent_builder_matches_the_golden(gens):
    g = gens["near_ties"]
    assert (g["expected.status"] == 0).all()
    for r, (lp, ids, budget, limit) in enumerate(requests(g)):
        tokens, parents = best_first(lp, ids, budget, limit, RIGHT)
        n = len(tokens)
        assert g["expected.node_count"][r] == n
        assert g["expected.node_token_ids"][r, 1 : n + 1].tolist() == tokens
        assert g["expected.parents"][r, 1 : n + 1].tolist() == parents


@pytest.mark.parametrize("how", sorted(WRONG))
def test_near_ties_kill_other_sibling_score_evaluations(gens, how):
    """A builder that evaluates the sibling score in another order builds another tree on
    many requests of near_ties (so the golden's exact comparison fails it); request 0 is
    the input that first showed the bug."""
    g = gens["near_ties"]
    reqs = requests(g)
    differ = [r for r, (lp, ids, b, d) in enumerate(reqs)
              if best_first(lp, ids, b, d, WRONG[how]) != best_first(lp, ids, b, d, RIGHT)]
    assert len(differ) >= len(reqs) // 3, (how, differ)
    if how == "swap":
        assert 0 in differ


def test_near_ties_kill_float32_scores(gens):
    from kdtr.generators.gen_tree_build_refs import grow_scored

    g = gens["near_ties"]
    differ = [r for r, (lp, ids, b, d) in enumerate(requests(g)) if grow_scored(lp, ids, b, d, "f32")
              != grow_scored(lp, ids, b, d)]
    assert len(differ) >= len(requests(g)) // 2


def test_near_ties_inputs(gens):
    g = gens["near_ties"]
    lp = g["input.top_log_probs"]
    assert np.isfinite(lp).all() and (lp[..., :-1] >= lp[..., 1:]).all()
    for v in (-1e-12, -1e-30, -(2.0**-40), -0.3, -1.7):
        assert (lp == np.float32(v)).any(), v
    tiny = lp[(lp < 0) & (lp > -np.finfo(np.float32).tiny)]  # f32 subnormals
    assert tiny.size > 0
    ids = g["input.top_token_ids"]
    assert all(len(set(row.tolist())) == len(row) for row in ids.reshape(-1, ids.shape[-1]))
    # exact ties between different rank paths exist (mathematically equal scores)
    assert (lp[:, :, :-1] == lp[:, :, 1:]).any()


def test_status_precedence_golden_holds_the_first_status_of_the_contract_order(repo_root):
    """Each request of tree_build/status_precedence has several defects; the status is the
    first of the contract's order (docs/ops/tree_build.md), in the reference and the file."""
    import kdtr
    from kdtr.generators import gen_tree_build_refs as g

    tensors, _ = g.generate("status_precedence")
    assert tuple(int(s) for s in tensors["expected.status"]) == g.PRECEDENCE_STATUS
    with kdtr.load(repo_root / "golden" / "tree_build" / "status_precedence.kdtr") as f:
        assert tuple(int(s) for s in f.tensors["expected.status"]) == g.PRECEDENCE_STATUS
