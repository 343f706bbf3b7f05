"""Each tree_accept configuration exercises the code path its name promises."""

from __future__ import annotations

import numpy as np
import pytest

import kdtr
from kdtr.generators import gen_accept_refs as gen
from kdtr.ops.tree_accept import (
    STATUS_BAD_INDEX,
    STATUS_BAD_NODE_COUNT,
    STATUS_CYCLE,
    STATUS_NEGATIVE_TOKEN,
    STATUS_OK,
    tree_accept,
)

REQUIRED = {
    "default", "mid", "wide", "underfull", "chain", "large_batch", "root_only",
    "full_accept", "non_first_child", "token_id_zero", "malformed", "negative_token", "bad_links", "leaf_siblings",
}
DEFECTIVE = {"malformed", "negative_token", "bad_links"}


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
    for name in set(gen.CONFIGS) - DEFECTIVE:
        assert (t(goldens, name, "expected.status") == 0).all(), name


def live_slots(goldens, name):
    """(request, slot) of every live slot (0..node_count) of a configuration."""
    counts = t(goldens, name, "input.node_count")
    return [(b, s) for b in range(len(counts)) for s in range(int(counts[b]) + 1)]


def test_well_formed_configs_have_real_tokens_in_live_slots(goldens):
    """Live draft and target tokens are real ids in [0, VOCAB] (VOCAB itself only as a
    non-child token when every id is a child); -1 appears only past node_count."""
    for name in set(gen.CONFIGS) - DEFECTIVE:
        for key in ("input.node_token_ids", "input.target_predict"):
            v = t(goldens, name, key)
            live = np.array([v[b, s] for b, s in live_slots(goldens, name)])
            if name == "wide_token_ids":  # ids beyond int32: VOCAB ids plus an offset (and bit 33)
                live = live & (2**31 - 1)
            assert ((live >= 0) & (live <= gen.VOCAB)).all(), (name, key)


def test_large_batch_is_64_requests(goldens):
    assert t(goldens, "large_batch", "input.node_count").shape == (64,)


def test_predictions_mix_first_child_other_child_and_early_stop(goldens):
    ids = t(goldens, "large_batch", "input.node_token_ids")
    nt = t(goldens, "large_batch", "input.next_token")
    ns = t(goldens, "large_batch", "input.next_sibling")
    tp = t(goldens, "large_batch", "input.target_predict")
    counts = t(goldens, "large_batch", "input.node_count")
    first = other = stop = leaves = 0
    for b in range(ids.shape[0]):
        for s in range(counts[b] + 1):
            kids = []
            c = nt[b, s]
            while c != -1:
                kids.append(c)
                c = ns[b, c]
            if not kids:  # a leaf: a real token (never padding), so the walk stops there with a bonus
                assert 0 <= tp[b, s] <= gen.VOCAB
                leaves += 1
                continue
            if tp[b, s] == ids[b, kids[0]]:
                first += 1
            elif tp[b, s] in ids[b, kids]:
                other += 1
            else:
                stop += 1
    assert first > other > 0 and stop > 0 and leaves > 0


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


def test_negative_token_rows(goldens):
    """The rows promised by gen_accept_refs._synth_negative, and that the defects of rows 3,
    4 and 8 lie off the walk: with the negative ids repaired the walk never looks there."""
    x = goldens["negative_token"][0]
    status = x["expected.status"].tolist()
    n4 = STATUS_NEGATIVE_TOKEN
    assert status == [STATUS_OK, n4, n4, n4, n4, n4, STATUS_OK, STATUS_BAD_NODE_COUNT, n4, n4]
    bad = np.array(status) != STATUS_OK
    assert (x["expected.accepted_count"][bad] == 0).all()
    assert (x["expected.accepted_path"][bad, 0] == 0).all() and (x["expected.accepted_path"][bad, 1:] == -1).all()
    assert (x["expected.proposed"][bad] == -1).all()
    ids, tp, nc = x["input.node_token_ids"], x["input.target_predict"], x["input.node_count"]
    # rows 1, 2: a -1 prediction that would be the bonus token, a -1 draft token the walk would accept
    assert ids[1, :4].tolist() == [42, 5, -1, -1] and tp[1, :4].tolist() == [-1, 7, 0, 0] and nc[1] == 1
    assert ids[2, :4].tolist() == [42, -1, 7, -1] and tp[2, :4].tolist() == [-1, 55, 0, 0] and nc[2] == 2
    assert ids[5, 0] < 0  # the root
    # row 6: negatives fill every slot past node_count, the walk accepts something
    assert (ids[6, nc[6] + 1:] < 0).all() and (tp[6, nc[6] + 1:] < 0).all()
    assert x["expected.accepted_count"][6] > 0
    # row 9: a full tree, INT64_MIN at its last slot
    assert nc[9] == ids.shape[1] - 1 and tp[9, -1] == np.iinfo(np.int64).min
    # rows 3, 4, 8: repaired, the walk stops at the root and the defect is not a root child
    for r in (3, 4, 8):
        row = {k[len("input."):]: np.array(v[r : r + 1]) for k, v in x.items() if k.startswith("input.")}
        neg = [s for s in range(nc[r] + 1) if ids[r, s] < 0 or tp[r, s] < 0]
        assert len(neg) == 1 and neg[0] > 0, r
        row["node_token_ids"][0, neg] = np.abs(row["node_token_ids"][0, neg])
        row["target_predict"][0, neg] = gen.VOCAB + 1
        repaired = tree_accept(**row)
        assert repaired.status[0] == (STATUS_CYCLE if r == 8 else STATUS_OK), r
        assert repaired.accepted_count[0] == 0, r
        kids, c = [], row["next_token"][0, 0]
        while c != -1 and c not in kids:
            kids.append(c)
            c = row["next_sibling"][0, c]
        assert neg[0] not in kids, r


def test_greedy_step_invalid_rows_reach_negative_token():
    """greedy_step inherits NEGATIVE_TOKEN (docs/ops/greedy_step.md): a negative root token
    (row 4: tree_build passes it through) and a negative target token at a live slot (row 5);
    a negative draft id (row 3) is tree_build's NEGATIVE_ID, whose root-only tree accepts
    nothing and proposes target_predict[3][0]."""
    from kdtr.generators import gen_greedy_step_refs as gs

    x, _ = gs.generate("invalid_rows")
    assert x["expected.tree_build.status"].tolist() == [0, 3, 1, 6, 0, 0]
    assert x["expected.tree_accept.status"].tolist() == [0, 0, 0, 0, STATUS_NEGATIVE_TOKEN, STATUS_NEGATIVE_TOKEN]
    assert x["input.root_token_ids"][4] < 0
    assert (x["input.target_predict"][5, : x["expected.tree_build.node_count"][5] + 1] < 0).sum() == 1
    assert (x["expected.tree_accept.proposed"][4:] == -1).all()
    assert x["expected.tree_accept.proposed"][3].tolist() == [x["input.target_predict"][3, 0]] + [-1] * 16
    assert x["expected.tree_accept.accepted_count"][0] > 0


# --- bad_links and leaf_siblings (they kill mutation survivors) ------------------------------------------------


def request(x, r):
    """Row r of a golden's inputs as plain arrays (ids, next_token, next_sibling, node_count, target)."""
    return (x["input.node_token_ids"][r], x["input.next_token"][r], x["input.next_sibling"][r],
            int(x["input.node_count"][r]), x["input.target_predict"][r])


def followed_links(ids, nt, ns, n, tp):
    """(every link value the contract's walk reads, in order, up to the first bad one; the
    slots accepted before it)."""
    seen, cur, accepted = [], 0, 0
    while True:
        c, found = int(nt[cur]), -1
        while True:
            seen.append(c)
            if c == -1:
                break
            if c < 1 or c > n:
                return seen, accepted
            if ids[c] == tp[cur]:
                found = c
                break
            c = int(ns[c])
        if found == -1:
            return seen, accepted
        cur, accepted = found, accepted + 1


def buggy_walk(ids, nt, ns, n, tp, bug):
    """(accepted_count, path, status) of a walk with one of the mutation study's bugs:
    ``gt0`` (``while (c > 0)``, range check kept), ``ge0`` (``while (c >= 0)``), ``in_range``
    (``while (c > 0 && c <= node_count)``: any bad link ends the list), ``leaf_next`` (at an
    accepted leaf, accept its next sibling if that matches), ``own_list`` (when no child of
    an accepted slot matches, scan the rest of its own sibling list)."""
    ends = {"gt0": lambda c: c <= 0, "ge0": lambda c: c < 0,
            "in_range": lambda c: c <= 0 or c > n}.get(bug, lambda c: c == -1)
    cur, path, visits = 0, [0], 0
    while True:
        c, found = int(nt[cur]), -1
        while not ends(c):
            if c < 1 or c > n:
                return 0, [0], 2
            visits += 1
            if visits > n:
                return 0, [0], 3
            if ids[c] == tp[cur]:
                found = c
                break
            c = int(ns[c])
        if found == -1 and cur != 0 and bug == "leaf_next" and nt[cur] == -1:
            s = int(ns[cur])
            if 1 <= s <= n and ids[s] == tp[cur]:
                found = s
        if found == -1 and cur != 0 and bug == "own_list":
            s = int(ns[cur])
            while 1 <= s <= n:
                if ids[s] == tp[cur]:
                    found = s
                    break
                s = int(ns[s])
        if found == -1:
            return len(path) - 1, path, 0
        path.append(found)
        cur = found


def test_bad_links_every_value_and_place_is_a_bad_index(goldens):
    x = goldens["bad_links"][0]
    status = x["expected.status"].tolist()
    assert status[0] == STATUS_BAD_INDEX and status[1] == STATUS_OK
    assert status[2:] == [STATUS_BAD_INDEX] * (len(status) - 2)
    t = x["input.node_token_ids"].shape[1]
    rows = iter(range(2, len(status)))
    for place in gen.BAD_LINK_PLACES:
        for v in gen.bad_link_values(t - 5, t):
            r = next(rows)
            ids, nt, ns, n, tp = request(x, r)
            assert n == t - 5 and n < t - 2  # T - 1 is a slot of the row past node_count
            links, accepted = followed_links(ids, nt, ns, n, tp)
            assert links[-1] == v and links.count(v) == 1, (place, v, links)  # the walk stops at the bad link
            assert accepted == {"root": 0, "accepted": 1}.get(place.split("_")[0]) or (
                place == "accepted_leaf_next_token" and accepted == 2), (place, v, accepted)
            in_next_token = place.endswith("next_token")
            assert v in (nt if in_next_token else ns)[: n + 1], (place, v)
            if place.endswith("first_sibling"):
                assert len(links) == 2  # the root's first child, then its bad sibling link
            if place.endswith("mid_sibling") or place.endswith("last_sibling"):
                assert len(links) >= 3
    with pytest.raises(StopIteration):
        next(rows)
    bad = np.array(status) != STATUS_OK
    assert (x["expected.accepted_count"][bad] == 0).all() and (x["expected.proposed"][bad] == -1).all()


@pytest.mark.parametrize("bug", ["gt0", "ge0", "in_range"])
def test_bad_links_kill_walks_that_end_a_list_at_a_bad_link(goldens, bug):
    """Each bug answers status 0 on some rows of bad_links; on every row where it answers at
    all differently, the golden's exact status comparison fails it."""
    x = goldens["bad_links"][0]
    wrong = [r for r in range(len(x["expected.status"]))
             if buggy_walk(*request(x, r), bug)[2] != x["expected.status"][r]]
    assert wrong, bug
    # the input that first showed the bug: 0 read as "no sibling"
    assert buggy_walk(*request(x, 0), "gt0")[2] == STATUS_OK
    t = x["input.node_token_ids"].shape[1]
    values = gen.bad_link_values(t - 5, t)
    cells = [(place, v) for place in gen.BAD_LINK_PLACES for v in values]  # rows 2, 3, ...
    expect = {"gt0": {v for v in values if v <= 0}, "ge0": {v for v in values if v < 0}, "in_range": set(values)}[bug]
    # every place, for every value the bug misreads
    assert {cells[r - 2] for r in wrong if r >= 2} == {(p, v) for p, v in cells if v in expect}


def test_leaf_siblings_rows(goldens):
    x = goldens["leaf_siblings"][0]
    assert (x["expected.status"] == STATUS_OK).all()
    count, path, proposed = x["expected.accepted_count"], x["expected.accepted_path"], x["expected.proposed"]
    assert count.tolist()[:10] == [1, 1, 2, 1, 1, 1, 1, 2, 4, 1]
    for r in range(len(count)):
        ids, nt, ns, n, tp = request(x, r)
        par = {c: p for p in range(n + 1) for c in [int(nt[p])] if c != -1}
        for p in range(n + 1):  # parent of every live child, through the sibling links
            c = int(nt[p])
            while 1 <= c <= n:
                par[c] = p
                c = int(ns[c])
        last = int(path[r, count[r]])
        bonus = int(proposed[r, count[r]])
        assert bonus == tp[last]
        sibs = [c for c, p in par.items() if p == par[last] and c != last]
        uncles = [c for c, p in par.items() if p == par.get(par[last], -2) and c != par[last]]
        if r == 9:
            assert ids[last] == bonus  # predicts its own token
        elif r == 6:
            assert not 1 <= ns[last] <= n  # a broken sibling link the walk never follows
        else:
            assert bonus in [int(ids[c]) for c in sibs + uncles], r
        kids = [c for c, p in par.items() if p == last]
        assert bonus not in [int(ids[c]) for c in kids]  # so the walk stops at `last`
    # rows 10..: random trees, the bonus token is a sibling's, later and earlier ones
    later = earlier = 0
    for r in range(10, len(count)):
        ids, nt, ns, n, tp = request(x, r)
        last = int(path[r, count[r]])
        s, after = int(ns[last]), []
        while 1 <= s <= n:
            after.append(int(ids[s]))
            s = int(ns[s])
        later += int(proposed[r, count[r]]) in after
        earlier += int(proposed[r, count[r]]) not in after
    assert later >= 3 and earlier >= 3


@pytest.mark.parametrize("bug", ["leaf_next", "own_list"])
def test_leaf_siblings_kill_walks_that_go_on_into_siblings(goldens, bug):
    x = goldens["leaf_siblings"][0]
    wrong = []
    for r in range(len(x["expected.status"])):
        n_acc, path, st = buggy_walk(*request(x, r), bug)
        if n_acc != x["expected.accepted_count"][r]:
            wrong.append(r)
    assert 0 in wrong or bug == "own_list"
    assert len(wrong) >= 5, (bug, wrong)


def test_wide_token_ids_golden_catches_ids_narrowed_to_32_bits(repo_root):
    """tree_accept/wide_token_ids: ids beyond int32; in odd rows a prediction equals a
    child's id only in the low 32 bits. A walk comparing narrowed ids accepts more there."""
    import numpy as np

    import kdtr
    from kdtr.generators import gen_accept_refs as g

    def accepted(x, b, narrow):
        ids, nt, ns, want = (x[k][b] for k in ("node_token_ids", "next_token", "next_sibling", "target_predict"))
        eq = (lambda a, c: (int(a) & 0xFFFFFFFF) == (int(c) & 0xFFFFFFFF)) if narrow else (lambda a, c: a == c)
        cur, n = 0, 0
        while True:
            c = int(nt[cur])
            while c != -1 and not eq(ids[c], want[cur]):
                c = int(ns[c])
            if c == -1:
                return n
            cur, n = c, n + 1

    tensors, _ = g.generate("wide_token_ids")
    x = {k[len("input."):]: v for k, v in tensors.items() if k.startswith("input.")}
    assert (x["node_token_ids"][:, 1:][x["node_token_ids"][:, 1:] >= 0] >= 2**31).all()
    for b in range(len(x["node_count"])):
        right = accepted(x, b, narrow=False)
        assert right == int(tensors["expected.accepted_count"][b])
        assert (accepted(x, b, narrow=True) > right) == (b % 2 == 1), b
    with kdtr.load(repo_root / "golden" / "tree_accept" / "wide_token_ids.kdtr") as f:
        assert np.array_equal(f.tensors["expected.accepted_count"], tensors["expected.accepted_count"])
