"""Goldens for tree_accept (docs/ops/tree_accept.md).

Each configuration is named by the code path it aims at. Trees are random but
well-formed (parents before children, links in index order, distinct sibling tokens)
unless the config says otherwise; target predictions aim at code paths: the first child
with high probability, sometimes a non-first child, sometimes a token matching no child
(early stop); leaves always get a non-child token. Token ids of live slots are
non-negative except in ``negative_token``, which aims at status NEGATIVE_TOKEN.
``bad_links`` (status BAD_INDEX) and ``leaf_siblings`` come from the mutation
study: link values that are neither -1 nor a live slot, followed by the walk; and accepted
slots whose siblings carry the bonus token (the walk must stop).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from kdtr.ops.tree_accept import OUTPUTS, SPEC, accept_request  # noqa: F401  (OUTPUTS: the op's outputs, for tests)

from .golden import package
from .rng import Rng
from .trees import Tree, chain_tree, links_from_parents, non_child_token, path_to, random_tree, synth_target_predict

OP = "tree_accept"
GENERATOR_VERSION = 2  # 2: host-independent synthesis (kdtr.generators.rng, kdtr.bf16, kdtr.detmath)
VOCAB = 32000


@dataclass(frozen=True)
class Config:
    """One named configuration: B requests, N maximum budget (T = N + 1 slots)."""

    description: str
    seed: int
    batch: int
    budget: int
    depth: int = 8
    topk: int = 8
    kind: str = "random"  # random | underfull | chain | root_only | full_accept | non_first | zero | malformed
    #                       | negative | bad_links | leaf_siblings | wide_ids | duplicate_siblings
    tier: str = "committed"


CONFIGS: dict[str, Config] = {
    "default": Config("B=4, N=64, depth 8, top-k 8; typical trees and predictions", 1001, 4, 64),
    "mid": Config("B=8, N=256, depth 12, top-k 8", 1002, 8, 256, depth=12),
    "wide": Config("B=4, N=128, depth 4, top-k 32: long sibling lists", 1003, 4, 128, depth=4, topk=32),
    "underfull": Config("node_count far below N: padding slots must stay untouched", 1004, 8, 64, kind="underfull"),
    "chain": Config("top-k 1: every slot has at most one child", 1005, 6, 32, depth=32, topk=1, kind="chain"),
    "large_batch": Config("B=64, N=256, depth 16, top-k 16", 1006, 64, 256, depth=16, topk=16),
    "root_only": Config("node_count 0: only the bonus token is proposed", 1007, 4, 16, kind="root_only"),
    "full_accept": Config("predictions walk to a leaf at maximum depth", 1008, 4, 64, depth=6, topk=4,
                          kind="full_accept"),
    "non_first_child": Config("predictions choose a non-first child at every step", 1009, 6, 64, depth=6, topk=6,
                              kind="non_first"),
    "token_id_zero": Config("accepted draft tokens with id 0 (not padding)", 1010, 4, 32, depth=6, topk=4, kind="zero"),
    "malformed": Config("cycle in next_sibling, wild index, bad node_count: statuses 1-3", 1011, 8, 16, depth=4, topk=4,
                        kind="malformed"),
    "negative_token": Config("negative token ids in live slots (status 4 NEGATIVE_TOKEN), on and off the walk, "
                             "and only past node_count (OK); T = 49 > 32 so the scan wraps the lanes", 1012, 10, 48,
                             depth=4, topk=4, kind="negative"),
    "bad_links": Config("a followed next_token / next_sibling link that is neither -1 nor in [1, node_count] (0, -2, "
                        "INT32_MIN, node_count+1, T-1 > node_count, T, INT32_MAX) at the root, at the start, middle "
                        "and end of a sibling list and after one or two acceptances: status 2 BAD_INDEX", 1013, 51, 16,
                        depth=4, topk=4, kind="bad_links"),
    "wide_token_ids": Config("token ids beyond int32 (2^31, 2^32, 2^40, 2^62 offsets): a prediction equal to a "
                             "child's id only in the low 32 bits must stop the walk", 1015, 8, 32, depth=6, topk=4,
                             kind="wide_ids"),
    "leaf_siblings": Config("accepted leaves (and accepted nodes with no matching child) whose siblings, later or "
                            "earlier, or uncle carry the bonus token: the walk must stop there", 1014, 20, 16, depth=5,
                            topk=4, kind="leaf_siblings"),
    "duplicate_siblings": Config("two or three siblings carry the predicted token (adjacent or not, at the root and "
                                 "deeper, the first a leaf or with the matching subtree): the first matching "
                                 "sibling in list order wins; every row's walk differs from one that takes the last "
                                 "match, and rows 0-2, 4, 5 (adjacent duplicates) from one that prefers a matching "
                                 "next sibling",
                                 1016, 16,
                                 16, depth=5, topk=4, kind="duplicate_siblings"),
}


def _batch(trees: list[Tree], targets: list[np.ndarray]) -> dict[str, np.ndarray]:
    return {
        "node_token_ids": np.stack([t.token_ids for t in trees]).astype(np.int64),
        "next_token": np.stack([t.next_token for t in trees]).astype(np.int32),
        "next_sibling": np.stack([t.next_sibling for t in trees]).astype(np.int32),
        "node_count": np.array([t.node_count for t in trees], np.int32),
        "target_predict": np.stack(targets).astype(np.int64),
    }


def _follow_path(rng: Rng | np.random.Generator, tree: Tree, path: list[int]) -> np.ndarray:
    """Predictions that accept exactly ``path`` (root..last), then stop."""
    out = synth_target_predict(rng, tree, VOCAB)
    for a, b in zip(path, path[1:]):
        out[a] = tree.token_ids[b]
    out[path[-1]] = non_child_token(rng, tree, path[-1], VOCAB)
    return out


def _random_rows(cfg: Config, rng: Rng | np.random.Generator, t: int, counts: list[int]) -> dict[str, np.ndarray]:
    trees = [random_tree(rng, t, n, cfg.depth, cfg.topk, VOCAB) for n in counts]
    return _batch(trees, [synth_target_predict(rng, tr, VOCAB) for tr in trees])


def _synth_random(cfg: Config, rng: Rng | np.random.Generator, t: int) -> dict[str, np.ndarray]:
    counts = [int(rng.integers(cfg.budget * 3 // 4, cfg.budget + 1)) for _ in range(cfg.batch)]
    counts[0] = cfg.budget  # one full tree per batch
    return _random_rows(cfg, rng, t, counts)


def _synth_underfull(cfg: Config, rng: Rng | np.random.Generator, t: int) -> dict[str, np.ndarray]:
    counts = [int(rng.integers(1, cfg.budget // 4)) for _ in range(cfg.batch)]
    counts[0] = 1
    return _random_rows(cfg, rng, t, counts)


def _synth_chain(cfg: Config, rng: Rng | np.random.Generator, t: int) -> dict[str, np.ndarray]:
    trees = [chain_tree(rng, t, int(rng.integers(cfg.budget // 2, cfg.budget + 1)), VOCAB) for _ in range(cfg.batch)]
    targets = [synth_target_predict(rng, tr, VOCAB, p_first=0.9, p_other=0.0) for tr in trees]
    return _batch(trees, targets)


def _synth_root_only(cfg: Config, rng: Rng | np.random.Generator, t: int) -> dict[str, np.ndarray]:
    trees = [random_tree(rng, t, 0, cfg.depth, cfg.topk, VOCAB) for _ in range(cfg.batch)]
    return _batch(trees, [synth_target_predict(rng, tr, VOCAB) for tr in trees])


def _synth_full_accept(cfg: Config, rng: Rng | np.random.Generator, t: int) -> dict[str, np.ndarray]:
    trees, targets = [], []
    for _ in range(cfg.batch):
        tree = random_tree(rng, t, cfg.budget, cfg.depth, cfg.topk, VOCAB)
        deepest = int(np.flatnonzero(tree.depths == tree.depths.max())[-1])
        trees.append(tree)
        targets.append(_follow_path(rng, tree, path_to(tree, deepest)))
    return _batch(trees, targets)


def _synth_non_first(cfg: Config, rng: Rng | np.random.Generator, t: int) -> dict[str, np.ndarray]:
    trees, targets = [], []
    for _ in range(cfg.batch):
        tree = random_tree(rng, t, cfg.budget, cfg.depth, cfg.topk, VOCAB)
        path = [0]
        while len(kids := tree.children(path[-1])) > 1:
            path.append(kids[int(rng.integers(1, len(kids)))])
        trees.append(tree)
        targets.append(_follow_path(rng, tree, path))
    return _batch(trees, targets)


def _synth_zero(cfg: Config, rng: Rng | np.random.Generator, t: int) -> dict[str, np.ndarray]:
    trees, targets = [], []
    for r in range(cfg.batch):
        tree = random_tree(rng, t, cfg.budget, cfg.depth, cfg.topk, VOCAB)
        # Give an accepted node at depth >= 1 the token 0 (no sibling holds 0 already).
        path = [0]
        while kids := tree.children(path[-1]):
            path.append(kids[0])
        k = 1 + r % (len(path) - 1)
        slot = path[k]
        if all(int(tree.token_ids[s]) != 0 for s in tree.children(path[k - 1])):
            tree.token_ids[slot] = 0
        if r == 0:
            tree.token_ids[0] = 0  # a root token 0 as well
        trees.append(tree)
        targets.append(_follow_path(rng, tree, path))
    return _batch(trees, targets)


def _synth_malformed(cfg: Config, rng: Rng | np.random.Generator, t: int) -> dict[str, np.ndarray]:
    """Rows 0-1 well-formed; then one defect per row, each on the walked path."""
    trees = [random_tree(rng, t, cfg.budget, cfg.depth, cfg.topk, VOCAB) for _ in range(cfg.batch)]
    targets = [synth_target_predict(rng, tr, VOCAB) for tr in trees]
    d = _batch(trees, targets)
    ids, nt, ns, nc, tp = d["node_token_ids"], d["next_token"], d["next_sibling"], d["node_count"], d["target_predict"]

    def stop_at_root(r: int) -> None:  # the walk scans every child of the root
        tp[r, 0] = non_child_token(rng, trees[r], 0, VOCAB)

    # row 2: cycle in next_sibling among the root's children
    kids = trees[2].children(0)
    ns[2, kids[-1]] = kids[0]
    stop_at_root(2)
    # row 3: a child index beyond node_count
    nt[3, 0] = nc[3] + 1
    # row 4: a sibling index past the end of the row (wild, far outside T)
    kids = trees[4].children(0)
    ns[4, kids[-1]] = 1 << 20
    stop_at_root(4)
    # row 5: node_count > T - 1
    nc[5] = t + 3
    # row 6: negative node_count
    nc[6] = -2
    # row 7: a child link that loops back to an ancestor (cycle through next_token)
    path = [0]
    while kids := trees[7].children(path[-1]):
        path.append(kids[0])
    nt[7, path[-1]] = path[1]
    tp[7, path[-1]] = ids[7, path[1]]
    for a, b in zip(path, path[1:]):
        tp[7, a] = ids[7, b]
    return d


def _synth_negative(cfg: Config, rng: Rng | np.random.Generator, t: int) -> dict[str, np.ndarray]:
    """A negative token id (-1 is the padding value) in a live slot 0..node_count of
    node_token_ids or target_predict is NEGATIVE_TOKEN wherever it is, reached by the walk
    or not; past node_count it is padding and does not count (docs/ops/tree_accept.md).

    Rows: 0 well-formed; 1, 2 a -1 prediction that would be the bonus token (a) and a -1
    draft token the walk would accept (b), padded to T; 3 target_predict
    -1 at a live leaf the walk never reaches; 4 node_token_ids -5 at a live slot the walk
    never reaches; 5 a negative root token (slot 0 is live, though no walk reads it);
    6 negatives only past node_count (status OK, a real walk); 7 node_count out of range
    and a negative token (BAD_NODE_COUNT comes first); 8 a negative token and a sibling
    cycle on the walk (NEGATIVE_TOKEN comes first); 9 a full tree (node_count = T - 1)
    with target_predict INT64_MIN at its last slot.
    """
    trees = [random_tree(rng, t, cfg.budget, cfg.depth, cfg.topk, VOCAB) for _ in range(cfg.batch)]
    if any(tr.node_count != cfg.budget for tr in trees):
        raise ValueError(f"negative_token: depth {cfg.depth}, top-k {cfg.topk} cannot hold {cfg.budget} nodes")
    targets = [synth_target_predict(rng, tr, VOCAB) for tr in trees]
    d = _batch(trees, targets)
    ids, nt, ns, nc, tp = d["node_token_ids"], d["next_token"], d["next_sibling"], d["node_count"], d["target_predict"]

    def stop_at_root(r: int) -> None:  # the walk inspects the root's children only
        tp[r, 0] = non_child_token(rng, trees[r], 0, VOCAB)

    def off_walk_slot(r: int) -> int:  # a live slot below a root child (never visited by stop_at_root)
        slots = [s for s in range(1, t) if trees[r].depths[s] >= 2]
        return slots[int(rng.integers(0, len(slots)))]

    def padded_row(r: int, row_ids, row_nt, row_ns, count: int, row_tp) -> None:
        k = len(row_ids)
        ids[r], nt[r], ns[r], tp[r] = -1, -1, -1, 0
        ids[r, :k], nt[r, :k], ns[r, :k], tp[r, :k] = row_ids, row_nt, row_ns, row_tp
        nc[r] = count

    # rows 1, 2: target_predict -1 on the walked path (1: it would be the bonus token; 2: it
    # would accept a child whose draft token is -1)
    padded_row(1, [42, 5, -1, -1], [1, -1, -1, -1], [-1, -1, -1, -1], 1, [-1, 7, 0, 0])
    padded_row(2, [42, -1, 7, -1], [1, -1, -1, -1], [-1, 2, -1, -1], 2, [-1, 55, 0, 0])
    # row 3: target_predict -1 at a live leaf that the walk never reaches
    stop_at_root(3)
    leaves = [s for s in range(1, t) if trees[3].next_token[s] == -1 and trees[3].depths[s] >= 2]
    tp[3, leaves[-1]] = -1
    # row 4: node_token_ids -5 at a live slot that the walk never reaches
    stop_at_root(4)
    ids[4, off_walk_slot(4)] = -5
    # row 5: a negative root token
    ids[5, 0] = -3
    # row 6: negatives only past node_count: status OK
    nc[6] = nc[6] // 2
    ids[6, nc[6] + 1:] = -9
    tp[6, nc[6] + 1:] = -9
    nt[6, nt[6] > nc[6]] = -1  # cut the links into the dropped slots (parents precede children)
    ns[6, ns[6] > nc[6]] = -1
    nt[6, nc[6] + 1:] = -1
    ns[6, nc[6] + 1:] = -1
    # row 7: node_count out of range comes before the negative token
    nc[7] = t
    tp[7, 0] = -1
    # row 8: a negative token and a sibling cycle on the walk: NEGATIVE_TOKEN comes first
    kids = trees[8].children(0)
    ns[8, kids[-1]] = kids[0]
    stop_at_root(8)
    ids[8, off_walk_slot(8)] = -1
    # row 9: the last slot of a full tree
    tp[9, t - 1] = np.iinfo(np.int64).min
    return d


INT32_MIN = int(np.iinfo(np.int32).min)
INT32_MAX = int(np.iinfo(np.int32).max)


def bad_link_values(node_count: int, t: int) -> list[int]:
    """Link values that are neither the -1 sentinel nor a live slot [1, node_count]: 0 (the
    root, never a child), -2, INT32_MIN, node_count + 1, T - 1 (a slot of the row past
    node_count; requires node_count < T - 2), T and INT32_MAX (past the row)."""
    return [0, -2, INT32_MIN, node_count + 1, t - 1, t, INT32_MAX]


BAD_LINK_PLACES = ("root_next_token", "root_first_sibling", "root_last_sibling", "accepted_next_token",
                   "accepted_mid_sibling", "accepted_last_sibling", "accepted_leaf_next_token")


def _tree_from_parents(rng: Rng | np.random.Generator, t: int, parents: list[int]) -> Tree:
    """A well-formed tree from the parents of slots 1..n (parents[i - 1] < i), distinct random
    sibling tokens, children linked in slot order."""
    n = len(parents)
    par = np.full(t, -1, np.int32)
    dep = np.full(t, -1, np.int32)
    ids = np.full(t, -1, np.int64)
    dep[0] = 0
    ids[0] = rng.integers(0, VOCAB)
    for i, p in enumerate(parents, start=1):
        if not 0 <= p < i:
            raise ValueError(f"slot {i}: parent {p} not an earlier slot")
        par[i], dep[i] = p, dep[p] + 1
    for p in range(n + 1):
        kids = [i for i in range(1, n + 1) if par[i] == p]
        ids[kids] = rng.choice(VOCAB, size=len(kids), replace=False)
    nt, ns = links_from_parents(par, n)
    return Tree(n, par, dep, ids, nt, ns)


def _synth_bad_links(cfg: Config, rng: Rng | np.random.Generator, t: int) -> dict[str, np.ndarray]:
    """Row 0: the input that first showed the bug (a sibling link 0 at the end of the root's list), padded to T;
    row 1: a well-formed control (status 0). Then one row per (place, bad value) of
    BAD_LINK_PLACES x bad_link_values: a tree of node_count = T - 5 nodes whose walk follows
    the bad link (status 2 BAD_INDEX, the request rejected whole). A walk that ends a list at
    any non-positive value, or at any value out of range, instead of testing -1 and the range,
    returns status 0 on some of these rows.
    """
    n = t - 5
    values = bad_link_values(n, t)
    if cfg.batch != 2 + len(BAD_LINK_PLACES) * len(values):
        raise ValueError(f"bad_links: batch must be {2 + len(BAD_LINK_PLACES) * len(values)}")

    def good_tree() -> Tree:
        # the root has >= 3 children; a root child has >= 3 children, one of them a leaf
        while True:
            tree = random_tree(rng, t, n, cfg.depth, cfg.topk, VOCAB)
            kids = tree.children(0)
            rich = [a for a in kids if len(tree.children(a)) >= 3
                    and any(not tree.children(c) for c in tree.children(a))]
            if len(kids) >= 3 and rich:
                return tree

    trees, targets = [], []
    row0 = _tree_from_parents(rng, t, [0])
    row0.token_ids[:2] = [100, 7]
    row0.next_sibling[1] = 0
    tp0 = np.full(t, -1, np.int64)
    tp0[:2] = [9, 5]
    trees.append(row0)
    targets.append(tp0)
    tree = good_tree()
    trees.append(tree)
    targets.append(synth_target_predict(rng, tree, VOCAB))
    for place in BAD_LINK_PLACES:
        for v in values:
            tree = good_tree()
            root_kids = tree.children(0)
            a = [c for c in root_kids if len(tree.children(c)) >= 3
                 and any(not tree.children(g) for g in tree.children(c))][0]
            a_kids = tree.children(a)
            leaf = [g for g in a_kids if not tree.children(g)][0]
            tp = synth_target_predict(rng, tree, VOCAB)
            nt, ns = tree.next_token, tree.next_sibling
            if place == "root_next_token":
                nt[0] = v
            elif place in ("root_first_sibling", "root_last_sibling"):
                tp[0] = non_child_token(rng, tree, 0, VOCAB)  # the walk scans the whole root list
                ns[root_kids[0] if place == "root_first_sibling" else root_kids[-1]] = v
            else:
                tp[0] = tree.token_ids[a]  # accept a
                if place == "accepted_next_token":
                    nt[a] = v
                elif place in ("accepted_mid_sibling", "accepted_last_sibling"):
                    tp[a] = non_child_token(rng, tree, a, VOCAB)  # the walk scans a's whole list
                    ns[a_kids[1] if place == "accepted_mid_sibling" else a_kids[-1]] = v
                else:  # accept a, then its leaf child; the leaf's first-child link is bad
                    tp[a] = tree.token_ids[leaf]
                    nt[leaf] = v
            trees.append(tree)
            targets.append(tp)
    return _batch(trees, targets)


def _synth_leaf_siblings(cfg: Config, rng: Rng | np.random.Generator, t: int) -> dict[str, np.ndarray]:
    """The walk stops at an accepted slot none of whose children matches, even when a
    sibling (or an uncle) of that slot carries the bonus token. Hand-made rows (parents of
    slots 1..n; every row well-formed, status 0):

    0. the input that first showed the bug: root children 1 (token 7) and 2 (token 8), predictions [7, 8, 9]:
       accept 1 (a leaf), bonus 8 = the token of its next sibling 2.
    1. accept a depth-1 leaf; its next sibling (a leaf) carries the bonus token.
    2. accept a depth-2 leaf; its next sibling carries the bonus token and has a child the
       sibling's prediction matches (a walk that went on would accept two more).
    3. accept a leaf; a later, not the next, sibling carries the bonus token.
    4. accept the last child (a leaf); an earlier sibling carries the bonus token.
    5. accept a slot with children, none matching; its next sibling carries the prediction.
    6. accept a leaf whose next_sibling link is out of range (never followed: status 0).
    7. accept the only child (a leaf) of a root child; the uncle carries the bonus token.
    8. a chain of accepted first children to a depth-4 leaf whose next sibling carries the
       bonus token and has a matching child.
    9. accept a leaf whose prediction is its own token (a sibling list that restarts at the
       current slot would accept it again).
    Rows 10..: random trees (depth 5, top-k 4), a walk to a random leaf whose prediction is
    the token of its next sibling (even rows: what a walk that goes on from a leaf into its
    next sibling accepts) or of an earlier sibling (odd rows), by construction.
    """
    rows: list[tuple[Tree, np.ndarray]] = []

    def row(parents: list[int], path: list[int], bonus_from: int | None = None, bonus: int | None = None,
            extra: dict[int, int] | None = None) -> Tree:
        """Predictions accept ``path`` (slots after the root); the last slot predicts the token
        of ``bonus_from`` (or ``bonus``); ``extra`` maps a slot to the slot whose token it
        predicts (what a walk that wrongly went on would accept)."""
        tree = _tree_from_parents(rng, t, parents)
        tp = synth_target_predict(rng, tree, VOCAB)
        full = [0, *path]
        for x, y in zip(full, full[1:]):
            tp[x] = tree.token_ids[y]
        tp[full[-1]] = tree.token_ids[bonus_from] if bonus_from is not None else bonus
        for x, y in (extra or {}).items():
            tp[x] = tree.token_ids[y]
        rows.append((tree, tp))
        return tree

    def check(k: int, path: list[int]) -> None:  # the reference walks exactly the intended path
        tree, tp = rows[k]
        _, got, _, status = accept_request(tree.token_ids, tree.next_token, tree.next_sibling, tree.node_count, tp)
        if status != 0 or got != [0, *path]:
            raise ValueError(f"leaf_siblings row {k}: walk {got} (status {status}), meant {[0, *path]}")

    tree = row([0, 0], [1], bonus_from=2)  # 0: the input that first showed the bug, padded to T
    tree.token_ids[:3] = [100, 7, 8]
    rows[-1][1][:3] = [7, 8, 9]
    row([0, 0, 0, 1], [1 + 1], bonus_from=3)  # 1: accept slot 2 (a leaf), next sibling 3
    row([0, 0, 1, 1, 1, 4, 2], [1, 3], bonus_from=4, extra={4: 6})  # 2
    row([0, 0, 0, 0, 1], [2], bonus_from=4)  # 3: accept 2; 3 is its next sibling, 4 carries the bonus
    row([0, 0, 0, 1, 2], [3], bonus_from=1)  # 4: accept 3 (last root child, a leaf); bonus = token of 1
    row([0, 0, 1, 1, 2], [1], bonus_from=2)  # 5: accept 1 (children 3, 4 do not match); bonus = token of 2
    tree = row([0, 0, 0, 2], [1], bonus_from=2)  # 6: accept leaf 1; its next_sibling link broken
    tree.next_sibling[1] = t + 5
    row([0, 0, 1, 2], [1, 3], bonus_from=2)  # 7: accept 1, then its only child 3; bonus = token of uncle 2
    row([0, 1, 2, 3, 0, 1, 2, 3, 8], [1, 2, 3, 4], bonus_from=8, extra={8: 9})  # 8: chain; leaf 4, sibling 8
    row([0, 0, 0], [2], bonus_from=2)  # 9: accept 2, predict its own token
    for k, path in enumerate([[1], [2], [1, 3], [2], [3], [1], [1], [1, 3], [1, 2, 3, 4], [2]]):
        check(k, path)
    while len(rows) < cfg.batch:
        tree = random_tree(rng, t, cfg.budget, cfg.depth, cfg.topk, VOCAB)
        want_next = len(rows) % 2 == 0  # even rows: the next sibling; odd rows: an earlier one
        leaves = [s for s in range(1, tree.node_count + 1) if tree.next_token[s] == -1
                  and (tree.next_sibling[s] != -1 if want_next else tree.children(int(tree.parents[s]))[0] != s)]
        if not leaves:
            continue
        leaf = leaves[int(rng.integers(0, len(leaves)))]
        earlier = [s for s in tree.children(int(tree.parents[leaf])) if s < leaf]
        pick = int(tree.next_sibling[leaf]) if want_next else earlier[int(rng.integers(0, len(earlier)))]
        tp = _follow_path(rng, tree, path_to(tree, leaf))
        tp[leaf] = tree.token_ids[pick]
        rows.append((tree, tp))
        check(len(rows) - 1, path_to(tree, leaf)[1:])
    return _batch([r[0] for r in rows], [r[1] for r in rows])


def walk_matching(tree: Tree, target: np.ndarray, pick: str) -> list[int]:
    """The slots a well-formed tree's walk accepts (root first) when, among the children of
    the current slot that carry its prediction, it takes the ``first`` in list order (the
    contract), the ``last``, or (``pair``) the first unless its next sibling matches too, then
    that one (a sibling loop unrolled by two whose select prefers the second lane)."""
    path = [0]
    while True:
        kids = tree.children(path[-1])
        match = [c for c in kids if int(tree.token_ids[c]) == int(target[path[-1]])]
        if not match:
            return path
        c = match[0] if pick in ("first", "pair") else match[-1]
        if pick == "pair" and int(tree.next_sibling[c]) in match:
            c = int(tree.next_sibling[c])
        path.append(c)


def _synth_duplicate_siblings(cfg: Config, rng: Rng | np.random.Generator, t: int) -> dict[str, np.ndarray]:
    """Siblings that carry the same token, the prediction of their parent (the contract's walk
    takes the first in list order, docs/ops/tree_accept.md). Hand-made rows (parents of
    slots 1..n; ``dups`` the sibling groups given one token; the predictions follow ``path``,
    and below a later duplicate they follow ``decoy`` so that a walk into it would accept
    more or fewer nodes):

    0. root children 1 (a leaf), 2 (with child 3): 1 and 2 alike; accept 1, stop.
    1. root children 1, 2, 3 alike, each with a child: accept 1 and its child.
    2. root children 1, 2, 3, 4; 2 and 3 alike (adjacent, not the first): accept 2.
    3. root children 1, 2, 3, 4; 1 and 4 alike (not adjacent): accept 1, then its child.
    4. after one acceptance: 1's children 3, 4, 5, with 3 and 4 alike; 4 has a matching child.
    5. the first duplicate has the matching subtree (two more nodes), the later one is a leaf.
    Rows 6..: random trees, a walk down first children where possible; at a slot of the walk
    with two or more children a later child gets the token of the matching one (the subtree
    below it is then followed by the predictions too), drawn until the walk that takes the
    last match differs.
    """
    rows: list[tuple[Tree, np.ndarray]] = []

    def row(parents: list[int], dups: list[list[int]], path: list[int], decoy: list[int] = ()) -> None:
        tree = _tree_from_parents(rng, t, parents)
        for group in dups:
            tree.token_ids[group[1:]] = tree.token_ids[group[0]]
        tp = synth_target_predict(rng, tree, VOCAB)
        for chain in ([0, *path], list(decoy)):
            for x, y in zip(chain, chain[1:]):
                tp[x] = tree.token_ids[y]
        end = [0, *path][-1]
        tp[end] = non_child_token(rng, tree, end, VOCAB)
        rows.append((tree, tp))

    row([0, 0, 2], [[1, 2]], [1], decoy=[2, 3])  # 0
    row([0, 0, 0, 1, 2, 3], [[1, 2, 3]], [1, 4], decoy=[2, 5])  # 1
    row([0, 0, 0, 0, 3], [[2, 3]], [2], decoy=[3, 5])  # 2
    row([0, 0, 0, 0, 1, 4, 6], [[1, 4]], [1, 5], decoy=[4, 6, 7])  # 3
    row([0, 0, 1, 1, 1, 4], [[3, 4]], [1, 3], decoy=[4, 6])  # 4
    row([0, 0, 1, 3], [[1, 2]], [1, 3, 4])  # 5
    for k, (tree, tp) in enumerate(rows):
        if walk_matching(tree, tp, "first") == walk_matching(tree, tp, "last"):
            raise ValueError(f"duplicate_siblings row {k}: the last match walks the same path")
    while len(rows) < cfg.batch:
        tree = random_tree(rng, t, cfg.budget, cfg.depth, cfg.topk, VOCAB)
        tp = synth_target_predict(rng, tree, VOCAB, p_first=1.0, p_other=0.0)
        walk = walk_matching(tree, tp, "first")
        forks = [(x, y) for x, y in zip(walk, walk[1:]) if len(tree.children(x)) >= 2]
        if not forks:
            continue
        x, y = forks[int(rng.integers(0, len(forks)))]
        later = [c for c in tree.children(x) if c > y]
        if not later:
            continue
        z = later[int(rng.integers(0, len(later)))]
        tree.token_ids[z] = tree.token_ids[y]
        if walk_matching(tree, tp, "first") != walk_matching(tree, tp, "last"):
            rows.append((tree, tp))
    return _batch([r[0] for r in rows], [r[1] for r in rows])


WIDE_ID_OFFSETS = (2**32, 2**40, 2**62, 2**31)


def _synth_wide_ids(cfg: Config, rng: Rng | np.random.Generator, t: int) -> dict[str, np.ndarray]:
    """Full-accept walks whose ids all carry a large offset; odd rows change the prediction
    at one step only in bit 33, so a walk comparing ids narrowed to 32 bits accepts on."""
    trees, targets = [], []
    for r in range(cfg.batch):
        tree = random_tree(rng, t, cfg.budget, cfg.depth, cfg.topk, VOCAB)
        deepest = int(np.flatnonzero(tree.depths == tree.depths.max())[-1])
        path = path_to(tree, deepest)
        target = _follow_path(rng, tree, path)
        live = slice(0, tree.node_count + 1)
        hi = WIDE_ID_OFFSETS[r % len(WIDE_ID_OFFSETS)]
        tree.token_ids[live] += hi
        target[live] += hi
        if r % 2 == 1:
            k = 1 + (r // 2) % (len(path) - 1)
            target[path[k - 1]] = int(tree.token_ids[path[k]]) ^ (1 << 33)
        trees.append(tree)
        targets.append(target)
    return _batch(trees, targets)


_SYNTH: dict[str, Callable[[Config, Rng, int], dict[str, np.ndarray]]] = {
    "random": _synth_random,
    "underfull": _synth_underfull,
    "chain": _synth_chain,
    "root_only": _synth_root_only,
    "full_accept": _synth_full_accept,
    "non_first": _synth_non_first,
    "zero": _synth_zero,
    "malformed": _synth_malformed,
    "negative": _synth_negative,
    "bad_links": _synth_bad_links,
    "leaf_siblings": _synth_leaf_siblings,
    "wide_ids": _synth_wide_ids,
    "duplicate_siblings": _synth_duplicate_siblings,
}


def generate(name: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Inputs, expected outputs (reference) and metadata of configuration ``name``.

    Raises:
        KeyError: unknown configuration.
    """
    cfg = CONFIGS[name]
    inputs = _SYNTH[cfg.kind](cfg, Rng(cfg.seed), cfg.budget + 1)
    expected = SPEC.reference(inputs, {})
    return package(OP, name, cfg, GENERATOR_VERSION, inputs, expected)
