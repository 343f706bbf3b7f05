"""The tree_accept reference: hand-made trees, statuses, and a property check against an
independent walk written over parent pointers."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from generators.trees import random_tree, synth_target_predict
from kdtr.ops.tree_accept import (
    STATUS_BAD_INDEX,
    STATUS_BAD_NODE_COUNT,
    STATUS_CYCLE,
    STATUS_OK,
    tree_accept,
)


def batch(ids, nt, ns, count, tp):
    return dict(
        node_token_ids=np.array([ids], np.int64),
        next_token=np.array([nt], np.int32),
        next_sibling=np.array([ns], np.int32),
        node_count=np.array([count], np.int32),
        target_predict=np.array([tp], np.int64),
    )


# root(7) -> 1(10), 2(0), 3(12); 2 -> 4(13); 4 -> 5(14); slot 6 is padding
IDS = [7, 10, 0, 12, 13, 14, -1]
NT = [1, -1, 4, -1, 5, -1, -1]
NS = [-1, 2, 3, -1, -1, -1, -1]


def test_walks_non_first_child_with_token_zero_and_bonus():
    tp = [0, 99, 13, 98, 14, 42, -1]
    r = tree_accept(**batch(IDS, NT, NS, 5, tp))
    assert r.status.tolist() == [STATUS_OK]
    assert r.accepted_count.tolist() == [3]
    assert r.accepted_path.tolist() == [[0, 2, 4, 5, -1, -1, -1]]
    assert r.proposed.tolist() == [[0, 13, 14, 42, -1, -1, -1]]


def test_no_match_at_root_proposes_only_the_bonus_token():
    r = tree_accept(**batch(IDS, NT, NS, 5, [55, 1, 1, 1, 1, 1, -1]))
    assert r.accepted_count.tolist() == [0]
    assert r.accepted_path.tolist() == [[0, -1, -1, -1, -1, -1, -1]]
    assert r.proposed.tolist() == [[55, -1, -1, -1, -1, -1, -1]]


def test_root_only_tree():
    r = tree_accept(**batch([5, -1], [-1, -1], [-1, -1], 0, [9, -1]))
    assert (r.accepted_count[0], r.proposed[0, 0], r.status[0]) == (0, 9, STATUS_OK)


REJECTED_PATH = [0, -1, -1, -1, -1, -1, -1]
REJECTED_TOKENS = [-1] * 7


@pytest.mark.parametrize(
    "nt,ns,count,tp,status",
    [
        (NT, NS[:3] + [1] + NS[4:], 5, [55, 0, 0, 0, 0, 0, -1], STATUS_CYCLE),  # 3 -> 1 sibling cycle
        ([6] + NT[1:], NS, 5, [10, 0, 0, 0, 0, 0, -1], STATUS_BAD_INDEX),  # child beyond node_count
        ([0] + NT[1:], NS, 5, [10, 0, 0, 0, 0, 0, -1], STATUS_BAD_INDEX),  # root as a child
        (NT, NS[:1] + [1 << 30] + NS[2:], 5, [55, 0, 0, 0, 0, 0, -1], STATUS_BAD_INDEX),  # wild sibling
        (NT, NS, 7, [10, 0, 0, 0, 0, 0, -1], STATUS_BAD_NODE_COUNT),
        (NT, NS, -1, [10, 0, 0, 0, 0, 0, -1], STATUS_BAD_NODE_COUNT),
        (NT[:5] + [2] + NT[6:], NS, 5, [0, 0, 13, 0, 14, 0, -1], STATUS_CYCLE),  # child loops to ancestor
    ],
)
def test_malformed_trees_are_rejected_whole(nt, ns, count, tp, status):
    r = tree_accept(**batch(IDS, nt, ns, count, tp))
    assert r.status.tolist() == [status]
    assert r.accepted_count.tolist() == [0]
    assert r.accepted_path.tolist() == [REJECTED_PATH]
    assert r.proposed.tolist() == [REJECTED_TOKENS]


def test_defect_off_the_walked_path_is_not_seen():
    ns = NS[:3] + [1] + NS[4:]  # cycle among the root's children, but the walk takes slot 1 first
    r = tree_accept(**batch(IDS, NT, ns, 5, [10, 77, 0, 0, 0, 0, -1]))
    assert r.status.tolist() == [STATUS_OK]
    assert r.accepted_path[0, :2].tolist() == [0, 1]


def test_shape_errors_raise():
    b = batch(IDS, NT, NS, 5, [0] * 7)
    b["next_token"] = b["next_token"].astype(np.int64)
    with pytest.raises(ValueError, match="next_token"):
        tree_accept(**b)


def independent_walk(parents, ids, count, tp):
    """Greedy acceptance written over parent pointers (children in index order)."""
    cur, path = 0, [0]
    while True:
        kids = [c for c in range(1, count + 1) if parents[c] == cur]
        match = [c for c in kids if ids[c] == tp[cur]]
        if not match:
            return path, [int(ids[s]) for s in path[1:]] + [int(tp[cur])]
        cur = match[0]
        path.append(cur)


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    count=st.integers(0, 40),
    depth=st.integers(1, 8),
    topk=st.integers(1, 5),
    vocab=st.sampled_from([2, 5, 1000]),
)
def test_matches_independent_walk(seed, count, depth, topk, vocab):
    rng = np.random.default_rng(seed)
    vocab = max(vocab, topk)
    tree = random_tree(rng, 41, count, depth, topk, vocab)
    tp = synth_target_predict(rng, tree, vocab)
    r = tree_accept(**batch(tree.token_ids, tree.next_token, tree.next_sibling, tree.node_count, tp))
    path, tokens = independent_walk(tree.parents, tree.token_ids, tree.node_count, tp)
    assert r.status[0] == STATUS_OK
    assert r.accepted_count[0] == len(path) - 1
    assert r.accepted_path[0, : len(path)].tolist() == path
    assert (r.accepted_path[0, len(path):] == -1).all()
    assert r.proposed[0, : len(tokens)].tolist() == tokens
    assert (r.proposed[0, len(tokens):] == -1).all()
