"""Each tree_accept configuration exercises the code path its name promises."""

from __future__ import annotations

import numpy as np
import pytest

import kdtr
from generators import gen_accept_refs as gen
from kdtr.ops.tree_accept import STATUS_BAD_INDEX, STATUS_BAD_NODE_COUNT, STATUS_CYCLE

REQUIRED = {
    "default", "mid", "wide", "underfull", "chain", "large_batch", "root_only",
    "full_accept", "non_first_child", "token_id_zero", "malformed",
}


@pytest.fixture(scope="module")
def goldens():
    return {name: gen.generate(name) for name in gen.CONFIGS}


def t(goldens, name, key):
    return goldens[name][0][key]


def test_required_configs_exist():
    assert REQUIRED <= set(gen.CONFIGS)


@pytest.mark.parametrize("name", sorted(gen.CONFIGS))
def test_generation_is_deterministic_and_committed(name, goldens, repo_root):
    again, meta = gen.generate(name)
    for k, v in goldens[name][0].items():
        assert v.tobytes() == again[k].tobytes(), k
    committed = kdtr.load(repo_root / "golden" / "tree_accept" / f"{name}.kdtr")
    assert committed.metadata["config"] == name and committed.metadata["op"] == "tree_accept"
    for out in gen.OUTPUTS:
        assert committed.metadata[f"contract.{out}.kind"] == "exact"


def test_well_formed_configs_have_status_ok(goldens):
    for name in REQUIRED - {"malformed"}:
        assert (t(goldens, name, "expected.status") == 0).all(), name


def test_large_batch_is_64_requests(goldens):
    assert t(goldens, "large_batch", "input.node_count").shape == (64,)


def test_predictions_mix_first_child_other_child_and_early_stop(goldens):
    ids = t(goldens, "large_batch", "input.node_token_ids")
    nt = t(goldens, "large_batch", "input.next_token")
    ns = t(goldens, "large_batch", "input.next_sibling")
    tp = t(goldens, "large_batch", "input.target_predict")
    counts = t(goldens, "large_batch", "input.node_count")
    first = other = stop = 0
    for b in range(ids.shape[0]):
        for s in range(counts[b] + 1):
            kids = []
            c = nt[b, s]
            while c != -1:
                kids.append(c)
                c = ns[b, c]
            if not kids:
                assert tp[b, s] not in ids[b, kids]  # leaves: never a child token
                continue
            if tp[b, s] == ids[b, kids[0]]:
                first += 1
            elif tp[b, s] in ids[b, kids]:
                other += 1
            else:
                stop += 1
    assert first > other > 0 and stop > 0


def test_underfull_and_root_only(goldens):
    n = t(goldens, "underfull", "input.node_count")
    assert (n < t(goldens, "underfull", "input.node_token_ids").shape[1] // 4).all()
    assert (t(goldens, "root_only", "input.node_count") == 0).all()
    assert (t(goldens, "root_only", "expected.accepted_count") == 0).all()


def test_chain_has_single_children(goldens):
    ns = t(goldens, "chain", "input.next_sibling")
    assert (ns == -1).all()


def test_full_accept_reaches_a_leaf_at_maximum_depth(goldens):
    cfg = gen.CONFIGS["full_accept"]
    assert (t(goldens, "full_accept", "expected.accepted_count") == cfg.depth).all()


def test_non_first_child_is_taken(goldens):
    nt = t(goldens, "non_first_child", "input.next_token")
    path = t(goldens, "non_first_child", "expected.accepted_path")
    taken = [(b, k) for b in range(path.shape[0]) for k in range(1, path.shape[1]) if path[b, k] != -1]
    assert taken and all(path[b, k] != nt[b, path[b, k - 1]] for b, k in taken)


def test_token_id_zero_is_accepted_not_padding(goldens):
    proposed = t(goldens, "token_id_zero", "expected.proposed")
    count = t(goldens, "token_id_zero", "expected.accepted_count")
    assert any(0 in proposed[b, : count[b]] for b in range(len(count)))


def test_malformed_statuses(goldens):
    status = t(goldens, "malformed", "expected.status").tolist()
    assert status[:2] == [0, 0]
    assert {STATUS_BAD_NODE_COUNT, STATUS_BAD_INDEX, STATUS_CYCLE} <= set(status)
    bad = np.array(status) != 0
    assert (t(goldens, "malformed", "expected.accepted_count")[bad] == 0).all()
    assert (t(goldens, "malformed", "expected.proposed")[bad] == -1).all()
