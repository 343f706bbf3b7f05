"""The tree_accept reference: hand-made trees, statuses, and a property check against an
independent walk written over parent pointers; negative token ids (NEGATIVE_TOKEN) in the
reference and through the CPU backend of build/bin/kdtr_tree_accept and kdtr_greedy_step."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kdtr
from conftest import op_binary
from kdtr.generators.trees import random_tree, synth_target_predict
from kdtr.ops.tree_accept import (
    STATUS_BAD_INDEX,
    STATUS_BAD_NODE_COUNT,
    STATUS_CYCLE,
    STATUS_NAMES,
    STATUS_NEGATIVE_TOKEN,
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


# --- negative token ids ------------------------------------------------

# A -1 where a token id belongs (T = 4): a walk that does not check signs returns status 0
# and proposes the padding value -1 as the bonus token (a), or accepts the -1 draft token
# of slot 1 (b).
MINUS_ONE_BONUS = dict(ids=[42, 5, -1, -1], nt=[1, -1, -1, -1], ns=[-1, -1, -1, -1], count=1, tp=[-1, 7, 0, 0])
MINUS_ONE_DRAFT = dict(ids=[42, -1, 7, -1], nt=[1, -1, -1, -1], ns=[-1, 2, -1, -1], count=2, tp=[-1, 55, 0, 0])


def one_request(case):
    return batch(case["ids"], case["nt"], case["ns"], case["count"], case["tp"])


def assert_rejected(r, status, t):
    assert r.status.tolist() == [status]
    assert r.accepted_count.tolist() == [0]
    assert r.accepted_path.tolist() == [[0] + [-1] * (t - 1)]
    assert r.proposed.tolist() == [[-1] * t]


def test_negative_token_codes():
    assert STATUS_NEGATIVE_TOKEN == 4 and STATUS_NAMES[4] == "NEGATIVE_TOKEN"
    assert len(set(STATUS_NAMES)) == len(STATUS_NAMES) == 5


@pytest.mark.parametrize("case", [MINUS_ONE_BONUS, MINUS_ONE_DRAFT], ids=["a", "b"])
def test_minus_one_prediction_or_draft_is_negative_token(case):
    assert_rejected(tree_accept(**one_request(case)), STATUS_NEGATIVE_TOKEN, 4)


@pytest.mark.parametrize("field", ["node_token_ids", "target_predict"])
@pytest.mark.parametrize("slot", range(6))  # every live slot of IDS (node_count 5), root included
@pytest.mark.parametrize("value", [-1, -7, np.iinfo(np.int64).min])
def test_negative_in_any_live_slot_rejects_the_request(field, slot, value):
    """Whether or not the walk reaches the slot: tp walks 0 -> 2 -> 4 -> 5, never looking at
    slots 1 and 3's predictions nor at slot 5's children."""
    b = batch(IDS, NT, NS, 5, [0, 99, 13, 98, 14, 42, -1])
    b[field] = b[field].copy()
    b[field][0, slot] = value
    assert_rejected(tree_accept(**b), STATUS_NEGATIVE_TOKEN, 7)


def test_negatives_past_node_count_are_padding():
    """Slots past node_count are not live: negatives there change nothing (bounds of the scan)."""
    tp = [0, 99, 13, 98, 14, 42, -1]
    want = tree_accept(**batch(IDS, NT, NS, 5, tp))
    for count in (5, 4):  # slot 5 is live, then not (its predicate must not be read)
        ids = IDS[: count + 1] + [-3] * (6 - count)
        tp_pad = tp[: count + 1] + [np.iinfo(np.int64).min] * (6 - count)
        nt = [c if c <= count else -1 for c in NT]
        r = tree_accept(**batch(ids, nt, NS, count, tp_pad))
        assert r.status.tolist() == [STATUS_OK], count
        if count == 5:
            for k, v in want.as_dict().items():
                np.testing.assert_array_equal(getattr(r, k), v, err_msg=k)
        else:  # walk 0 -> 2 -> 4, then slot 4's prediction is the bonus
            assert r.accepted_path.tolist() == [[0, 2, 4, -1, -1, -1, -1]]
            assert r.proposed.tolist() == [[0, 13, 14, -1, -1, -1, -1]]


@pytest.mark.parametrize(
    "nt,ns,count,status",
    [
        (NT, NS, 7, STATUS_BAD_NODE_COUNT),  # node_count first
        (NT, NS, -1, STATUS_BAD_NODE_COUNT),
        ([6] + NT[1:], NS, 5, STATUS_NEGATIVE_TOKEN),  # before the walk's BAD_INDEX
        (NT, NS[:3] + [1] + NS[4:], 5, STATUS_NEGATIVE_TOKEN),  # before the walk's CYCLE
    ],
)
def test_negative_token_check_order(nt, ns, count, status):
    tp = [55, 0, 0, 0, 0, -2, -1]  # slot 5 is live for node_count 5
    assert_rejected(tree_accept(**batch(IDS, nt, ns, count, tp)), status, 7)


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    count=st.integers(0, 40),
    depth=st.integers(1, 8),
    topk=st.integers(1, 5),
    field=st.sampled_from(["node_token_ids", "target_predict"]),
    value=st.integers(np.iinfo(np.int64).min, -1),
)
def test_property_negative_live_token_rejects_and_padding_does_not(seed, count, depth, topk, field, value):
    rng = np.random.default_rng(seed)
    tree = random_tree(rng, 41, count, depth, topk, 1000)
    tp = synth_target_predict(rng, tree, 1000)
    b = batch(tree.token_ids, tree.next_token, tree.next_sibling, tree.node_count, tp)
    want = tree_accept(**b)
    n = tree.node_count
    # negatives past node_count: the same result
    padded = {k: v.copy() for k, v in b.items()}
    padded[field][0, n + 1:] = value
    got = tree_accept(**padded)
    for k, v in want.as_dict().items():
        np.testing.assert_array_equal(getattr(got, k), v, err_msg=k)
    # a negative in any one live slot: rejected whole
    b[field] = b[field].copy()
    b[field][0, int(rng.integers(0, n + 1))] = value
    assert_rejected(tree_accept(**b), STATUS_NEGATIVE_TOKEN, 41)


# --- the same through the binaries' CPU backend --------------------------------------------


def _binary(repo_root, op):
    return op_binary(op)


def _run_cpu(binary, golden, out):
    r = subprocess.run([str(binary), "--input", str(golden), "--output", str(out), "--backend", "cpu"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return kdtr.load(out).tensors


# (row, status, accepted_path, proposed) at T = 4 for the binary: rows a and b above, the
# check order, and negatives past node_count (padding).
BINARY_ROWS = [
    (one_request(MINUS_ONE_BONUS), STATUS_NEGATIVE_TOKEN, [0, -1, -1, -1], [-1] * 4),
    (one_request(MINUS_ONE_DRAFT), STATUS_NEGATIVE_TOKEN, [0, -1, -1, -1], [-1] * 4),
    # root 42 -> 1(5), 2(6): tp walks 0 -> 2, bonus 9; -1 and INT64_MIN past node_count
    (batch([42, 5, 6, -1], [1, -1, -1, -1], [-1, 2, -1, -1], 2, [6, 8, 9, np.iinfo(np.int64).min]),
     STATUS_OK, [0, 2, -1, -1], [6, 9, -1, -1]),
    # a negative root token, never read by the walk
    (batch([-42, 5, 6, -1], [1, -1, -1, -1], [-1, 2, -1, -1], 2, [6, 8, 9, 0]),
     STATUS_NEGATIVE_TOKEN, [0, -1, -1, -1], [-1] * 4),
    # a negative prediction at slot 1, never reached (the walk goes to slot 2)
    (batch([42, 5, 6, -1], [1, -1, -1, -1], [-1, 2, -1, -1], 2, [6, -8, 9, 0]),
     STATUS_NEGATIVE_TOKEN, [0, -1, -1, -1], [-1] * 4),
    # a sibling cycle 2 -> 1 and a negative token: NEGATIVE_TOKEN comes first
    (batch([42, 5, 6, -1], [1, -1, -1, -1], [-1, 2, 1, -1], 2, [7, 8, -9, 0]),
     STATUS_NEGATIVE_TOKEN, [0, -1, -1, -1], [-1] * 4),
    # a wild child index and a negative token: NEGATIVE_TOKEN comes first
    (batch([42, 5, 6, -1], [1 << 30, -1, -1, -1], [-1, 2, -1, -1], 2, [7, 8, -9, 0]),
     STATUS_NEGATIVE_TOKEN, [0, -1, -1, -1], [-1] * 4),
    # node_count out of range and a negative token: BAD_NODE_COUNT comes first
    (batch([42, 5, 6, -1], [1, -1, -1, -1], [-1, 2, -1, -1], 4, [-6, 8, 9, 0]),
     STATUS_BAD_NODE_COUNT, [0, -1, -1, -1], [-1] * 4),
]


def test_binary_rows_are_right_in_the_reference():
    for i, (row, status, path, proposed) in enumerate(BINARY_ROWS):
        r = tree_accept(**row)
        assert (r.status.tolist(), r.accepted_path.tolist(), r.proposed.tolist()) == ([status], [path], [proposed]), i


def test_binary_cpu_negative_token_rows(repo_root, tmp_path):
    x = {k: np.concatenate([r[0][k] for r in BINARY_ROWS]) for k in BINARY_ROWS[0][0]}
    golden = tmp_path / "negative.kdtr"
    kdtr.save(golden, {f"input.{k}": v for k, v in x.items()}, {"op": "tree_accept", "config": "negative"})
    got = _run_cpu(_binary(repo_root, "tree_accept"), golden, tmp_path / "out.kdtr")
    assert got["status"].tolist() == [r[1] for r in BINARY_ROWS]
    assert got["accepted_count"].tolist() == [sum(s > 0 for s in r[2]) for r in BINARY_ROWS]
    assert got["accepted_path"].tolist() == [r[2] for r in BINARY_ROWS]
    assert got["proposed"].tolist() == [r[3] for r in BINARY_ROWS]


def test_binary_cpu_equals_reference_with_sparse_negative_tokens(repo_root, tmp_path):
    """Random trees, a few negative ids in live slots (on and off the walk) and many past
    node_count, some malformed links and counts: the CPU backend equals the reference."""
    rng = np.random.default_rng(8_3)
    b, t = 96, 13
    trees = [random_tree(rng, t, int(rng.integers(0, t)), 4, 3, 6) for _ in range(b)]
    x = {
        "node_token_ids": np.stack([tr.token_ids for tr in trees]).astype(np.int64),
        "next_token": np.stack([tr.next_token for tr in trees]).astype(np.int32),
        "next_sibling": np.stack([tr.next_sibling for tr in trees]).astype(np.int32),
        "node_count": np.array([tr.node_count for tr in trees], np.int32),
        "target_predict": np.stack([synth_target_predict(rng, tr, 6) for tr in trees]).astype(np.int64),
    }
    for r in range(b):
        n = int(x["node_count"][r])
        kind = rng.integers(0, 6)
        if kind == 0:
            x["node_token_ids"][r, rng.integers(0, n + 1)] = -int(rng.integers(1, 4))
        elif kind == 1:
            x["target_predict"][r, rng.integers(0, n + 1)] = -int(rng.integers(1, 4))
        elif kind == 2:
            x["node_count"][r] = rng.choice([-1, t, t + 5])
        elif kind == 3 and n > 0:
            x["next_sibling"][r, rng.integers(1, n + 1)] = int(rng.integers(-3, t + 3))
        x["node_token_ids"][r, n + 1:] = -int(rng.integers(1, 9))  # padding: never counts
        x["target_predict"][r, n + 1:] = -int(rng.integers(1, 9))
    want = tree_accept(**x).as_dict()
    assert {STATUS_OK, STATUS_BAD_NODE_COUNT, STATUS_NEGATIVE_TOKEN} <= set(want["status"].tolist())
    assert (want["accepted_count"] > 0).any()
    golden = tmp_path / "sparse.kdtr"
    kdtr.save(golden, {f"input.{k}": v for k, v in x.items()}, {"op": "tree_accept", "config": "sparse"})
    got = _run_cpu(_binary(repo_root, "tree_accept"), golden, tmp_path / "out.kdtr")
    for k, v in want.items():
        assert got[k].dtype == v.dtype, k
        np.testing.assert_array_equal(got[k], v, err_msg=k)


def test_binary_cpu_greedy_step_inherits_negative_token(repo_root, tmp_path):
    """greedy_step/invalid_rows: rows 4 (negative root token, which tree_build passes through)
    and 5 (target_predict -1 at a live slot) are NEGATIVE_TOKEN in the chain; row 3 (a
    negative draft id: tree_build NEGATIVE_ID, root-only tree) is accepted as root-only."""
    golden = repo_root / "golden" / "greedy_step" / "invalid_rows.kdtr"
    x = kdtr.load(golden).tensors
    got = _run_cpu(_binary(repo_root, "greedy_step"), golden, tmp_path / "out.kdtr")
    assert got["tree_build.status"].tolist() == [0, 3, 1, 6, 0, 0]
    assert got["tree_accept.status"].tolist() == [0, 0, 0, 0, STATUS_NEGATIVE_TOKEN, STATUS_NEGATIVE_TOKEN]
    assert got["tree_accept.accepted_count"][4:].tolist() == [0, 0]
    assert (got["tree_accept.proposed"][4:] == -1).all()
    path = got["tree_accept.accepted_path"]
    assert (path[4:, 1:] == -1).all() and (path[4:, 0] == 0).all()
    assert got["tree_accept.proposed"][3, 0] == x["input.target_predict"][3, 0]
    for k in ("tree_accept.status", "tree_accept.accepted_count", "tree_accept.accepted_path", "tree_accept.proposed"):
        np.testing.assert_array_equal(got[k], x[f"expected.{k}"], err_msg=k)
