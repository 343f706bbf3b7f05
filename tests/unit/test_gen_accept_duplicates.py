"""tree_accept/duplicate_siblings (docs/ops/tree_accept.md): siblings that carry the predicted
token; the contract's walk takes the first in list order, and every row tells it from a walk
that takes the last match (rows with adjacent duplicates also from one that prefers a
matching next sibling)."""

from __future__ import annotations

import numpy as np
import pytest

import kdtr
from kdtr.generators import gen_accept_refs as gen
from kdtr.generators.trees import Tree


@pytest.fixture(scope="module")
def golden():
    return gen.generate("duplicate_siblings")


def trees(t):
    for r in range(t["input.node_count"].shape[0]):
        yield r, Tree(int(t["input.node_count"][r]), None, None, t["input.node_token_ids"][r],
                      t["input.next_token"][r], t["input.next_sibling"][r]), t["input.target_predict"][r]


def test_committed_golden_is_the_generation(golden, repo_root):
    g = kdtr.load(repo_root / "golden" / "tree_accept" / "duplicate_siblings.kdtr")
    for k, v in golden[0].items():
        assert g.tensors[k].tobytes() == v.tobytes(), k


def test_first_match_wins_and_differs_from_the_last(golden):
    t, _ = golden
    assert (t["expected.status"] == 0).all()
    pair_differs = []
    for r, tree, tp in trees(t):
        first = gen.walk_matching(tree, tp, "first")
        n = int(t["expected.accepted_count"][r])
        assert t["expected.accepted_path"][r, : n + 1].tolist() == first  # the contract: the first match
        assert gen.walk_matching(tree, tp, "last") != first, r
        pair_differs.append(gen.walk_matching(tree, tp, "pair") != first)
        # some slot of the walk has two children of the predicted token
        assert any(sum(int(tree.token_ids[c]) == int(tp[x]) for c in tree.children(x)) >= 2 for x in first), r
    assert [r for r in range(6) if pair_differs[r]] == [0, 1, 2, 4, 5]


def test_a_walk_that_takes_the_last_match_fails_the_golden(golden):
    t, _ = golden
    wrong = np.full_like(t["expected.accepted_path"], -1)
    for r, tree, tp in trees(t):
        path = gen.walk_matching(tree, tp, "last")
        wrong[r, : len(path)] = path
    assert not (wrong == t["expected.accepted_path"]).all(axis=1).any()
