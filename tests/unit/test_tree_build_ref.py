"""The tree_build reference against an independent second implementation.

The second implementation enumerates every node of the implicit depth x top-k tree,
scores it with the same float64 recurrences, orders all nodes by (score desc, rank path
asc) and keeps the first `budget`. This equals best-first search because a node never
scores above its parent nor a sibling above its better-ranked sibling; to keep that true
bit for bit the log-probs here are multiples of 2^-12 in [-16, 0], so every float64 sum
is exact. Ties (including exact 0.0) are common by construction."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kdtr.ops.tree_build import (
    STATUS_BAD_BUDGET,
    STATUS_BAD_DEPTH_LIMIT,
    STATUS_DUPLICATE_ID,
    STATUS_NEGATIVE_ID,
    STATUS_NON_FINITE,
    STATUS_OK,
    STATUS_UNSORTED,
    tree_build,
)


def path_score(lp: np.ndarray, path: tuple[int, ...]) -> float:
    """Score of a rank path, by the builder's recurrences (first child, then sibling steps)."""
    w = 0.0
    for d, r in enumerate(path):
        w = float(lp[0][0]) if d == 0 else w + float(lp[d][0])
        for k in range(r):
            w = (w - float(lp[d][k])) + float(lp[d][k + 1])
    return w


def enumerate_tree(lp, ids, root, budget, depth_limit):
    k = lp.shape[1]
    nodes = [p for d in range(1, depth_limit + 1) for p in itertools.product(range(k), repeat=d)]
    nodes.sort(key=lambda p: (-path_score(lp, p), p))
    chosen = nodes[:budget]
    slot = {(): 0}
    tokens, depths, parents = [root], [0], [-1]
    for p in chosen:
        slot[p] = len(tokens)
        tokens.append(int(ids[len(p) - 1][p[-1]]))
        depths.append(len(p))
        parents.append(slot[p[:-1]])
    return tokens, depths, parents


@st.composite
def requests(draw):
    d = draw(st.integers(1, 4))
    k = draw(st.integers(1, 4))
    values = draw(st.lists(st.integers(-16 * 4096, 0), min_size=1, max_size=5))
    pool = np.array(values, np.float64) / 4096.0
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    lp = np.sort(rng.choice(pool, size=(d, k)), axis=1)[:, ::-1].astype(np.float32)
    ids = np.stack([rng.choice(50, size=k, replace=False) for _ in range(d)]).astype(np.int64)
    depth_limit = draw(st.integers(0, d))
    budget = draw(st.integers(0, 30))
    return lp, ids, budget, depth_limit


@settings(max_examples=300, deadline=None)
@given(req=requests())
def test_matches_enumeration(req):
    lp, ids, budget, depth_limit = req
    res = tree_build(lp[None], ids[None], np.array([7], np.int64), np.array([budget], np.int32),
                     np.array([depth_limit], np.int32), n_max=30)
    tokens, depths, parents = enumerate_tree(lp, ids, 7, budget, depth_limit)
    n = len(tokens) - 1
    assert res.status[0] == STATUS_OK
    assert res.node_count[0] == n
    assert res.node_token_ids[0, : n + 1].tolist() == tokens
    assert res.node_depths[0, : n + 1].tolist() == depths
    assert res.parents[0, : n + 1].tolist() == parents
    assert (res.node_token_ids[0, n + 1 :] == -1).all() and (res.parents[0, n + 1 :] == -1).all()
    # links and visibility, from parents
    for s in range(n + 1):
        kids = [c for c in range(1, n + 1) if parents[c] == s]
        assert res.next_token[0, s] == (kids[0] if kids else -1)
        for a, b in zip(kids, kids[1:] + [-1]):
            assert res.next_sibling[0, a] == b
        anc, x = set(), s
        while x != -1:
            anc.add(x)
            x = parents[x]
        assert res.visibility[0, s].nonzero()[0].tolist() == sorted(anc)
    assert not res.visibility[0, n + 1 :].any()


def test_ties_break_by_rank_path_prefix_first():
    # every log-prob 0.0: all scores tie; order is breadth of rank paths in lexicographic order
    lp = np.zeros((1, 3, 2), np.float32)
    ids = np.array([[[10, 11], [20, 21], [30, 31]]], np.int64)
    res = tree_build(lp, ids, np.array([1], np.int64), np.array([6], np.int32), np.array([3], np.int32))
    # lexicographic: (0), (0,0), (0,0,0), (0,0,1), (0,1), (0,1,0)
    assert res.node_token_ids[0].tolist() == [1, 10, 20, 30, 31, 21, 30]
    assert res.parents[0].tolist() == [-1, 0, 1, 2, 2, 1, 5]


def test_underfull_and_root_only():
    lp = np.log(np.full((1, 2, 2), 0.5, np.float32))
    ids = np.array([[[1, 2], [3, 4]]], np.int64)
    res = tree_build(lp, ids, np.array([0], np.int64), np.array([10], np.int32), np.array([2], np.int32), n_max=10)
    assert res.node_count[0] == 6  # 2 + 4 nodes: the tree cannot hold 10
    for budget, depth in ((0, 2), (5, 0)):
        res = tree_build(lp, ids, np.array([9], np.int64), np.array([budget], np.int32),
                         np.array([depth], np.int32), n_max=5)
        assert res.node_count[0] == 0 and res.node_token_ids[0, 0] == 9 and res.visibility[0, 0, 0] == 1
        assert res.visibility[0].sum() == 1


@pytest.mark.parametrize(
    "mutate,status",
    [
        (lambda lp, ids, b, d: lp.__setitem__((0, 0, 1), np.nan), STATUS_NON_FINITE),
        (lambda lp, ids, b, d: lp.__setitem__((0, 1, 0), -np.inf), STATUS_NON_FINITE),
        (lambda lp, ids, b, d: lp.__setitem__((0, 1, 2), 0.5), STATUS_UNSORTED),
        (lambda lp, ids, b, d: ids.__setitem__((0, 1, 2), ids[0, 1, 0]), STATUS_DUPLICATE_ID),
        (lambda lp, ids, b, d: ids.__setitem__((0, 0, 1), -1), STATUS_NEGATIVE_ID),
        (lambda lp, ids, b, d: b.__setitem__(0, 9), STATUS_BAD_BUDGET),
        (lambda lp, ids, b, d: b.__setitem__(0, -1), STATUS_BAD_BUDGET),
        (lambda lp, ids, b, d: d.__setitem__(0, 4), STATUS_BAD_DEPTH_LIMIT),
        (lambda lp, ids, b, d: d.__setitem__(0, -1), STATUS_BAD_DEPTH_LIMIT),
    ],
)
def test_invalid_input_status_and_root_only_answer(mutate, status):
    lp = np.tile(np.array([-0.1, -1.0, -2.0], np.float32), (1, 3, 1))
    ids = np.tile(np.array([3, 4, 5], np.int64), (1, 3, 1))
    b, d = np.array([8], np.int32), np.array([3], np.int32)
    mutate(lp, ids, b, d)
    res = tree_build(lp, ids, np.array([2], np.int64), b, d, n_max=8, on_invalid="status")
    assert res.status[0] == status
    assert res.node_count[0] == 0 and res.node_token_ids[0].tolist() == [2] + [-1] * 8
    assert res.visibility[0].sum() == 1
    with pytest.raises(ValueError, match="request 0"):
        tree_build(lp, ids, np.array([2], np.int64), b, d, n_max=8)


def test_rows_beyond_depth_limit_are_not_checked():
    lp = np.tile(np.array([-0.1, -1.0], np.float32), (1, 3, 1))
    lp[0, 2, 0] = np.nan
    ids = np.tile(np.array([3, 4], np.int64), (1, 3, 1))
    res = tree_build(lp, ids, np.array([2], np.int64), np.array([4], np.int32), np.array([2], np.int32),
                     on_invalid="status")
    assert res.status[0] == STATUS_OK and res.node_count[0] == 4


def test_scores_follow_the_contract_order_of_operations():
    """On arbitrary f32 log-probs (inexact sums) every node's float64 score is bit-identical
    to the contract's recurrences: (w - lp[r]) + lp[r+1] for siblings, w + lp[d][0] for children."""
    from kdtr.ops.tree_build import build_request

    rng = np.random.default_rng(3)
    d, k = 4, 6
    # Sums of f32 values are exact in float64 unless their exponents span more than ~29 bits:
    # mix near-certain tokens (log-prob ~ -1e-13) with unlikely ones (~ -20).
    mags = np.where(rng.random((d, k)) < 0.5, rng.uniform(1e-14, 1e-12, (d, k)), rng.uniform(1.0, 30.0, (d, k)))
    lp = np.sort(-mags.astype(np.float32), axis=1)[:, ::-1].copy()
    ids = np.tile(np.arange(k, dtype=np.int64), (d, 1))
    scores: list[float] = []
    tokens, depths, parents = build_request(lp, ids, 2000, d, scores)
    assert len(tokens) == sum(k**i for i in range(1, d + 1))  # the whole implicit tree
    paths = {0: ()}
    inexact = 0
    for s, (tok, p) in enumerate(zip(tokens, parents), start=1):
        paths[s] = paths[p] + (tok,)
        assert scores[s - 1] == path_score(lp, paths[s]), paths[s]
        inexact += scores[s - 1] != path_score_other_order(lp, paths[s])
    assert inexact > 0  # the data does distinguish the order of operations


def path_score_other_order(lp: np.ndarray, path: tuple[int, ...]) -> float:
    """The same sum with the sibling step written w + (lp[r+1] - lp[r]): not the contract."""
    w = 0.0
    for d, r in enumerate(path):
        w = float(lp[0][0]) if d == 0 else w + float(lp[d][0])
        for k in range(r):
            w = w + (float(lp[d][k + 1]) - float(lp[d][k]))
    return w
