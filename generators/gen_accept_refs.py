"""Goldens for tree_accept (shared/DESIGN.md 3.2, docs/ops/tree_accept.md).

Each configuration is named by the code path it aims at. Trees are random but
well-formed (parents before children, links in index order, distinct sibling tokens)
unless the config says otherwise; target predictions follow DESIGN 4: the first child
with high probability, sometimes a non-first child, sometimes a token matching no child
(early stop); leaves always get a non-child token. Token ids of live slots are
non-negative except in ``negative_token``, which aims at status NEGATIVE_TOKEN.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from kdtr.ops.tree_accept import OUTPUTS, SPEC  # noqa: F401  (OUTPUTS: the op's outputs, for tests)

from .trees import Tree, chain_tree, non_child_token, path_to, random_tree, synth_target_predict
from .golden import package

OP = "tree_accept"
GENERATOR_VERSION = 1
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
    #                       | negative


CONFIGS: dict[str, Config] = {
    "default": Config("B=4, N=64, depth 8, top-k 8; typical trees and predictions", 1001, 4, 64),
    "mid": Config("B=8, N=256, depth 12, top-k 8", 1002, 8, 256, depth=12),
    "wide": Config("B=4, N=128, depth 4, top-k 32: long sibling lists", 1003, 4, 128, depth=4, topk=32),
    "underfull": Config("node_count far below N: padding slots must stay untouched", 1004, 8, 64, kind="underfull"),
    "chain": Config("top-k 1: every slot has at most one child", 1005, 6, 32, depth=32, topk=1, kind="chain"),
    "large_batch": Config("B=64, N=256, depth 16, top-k 16", 1006, 64, 256, depth=16, topk=16),
    "root_only": Config("node_count 0: only the bonus token is proposed", 1007, 4, 16, kind="root_only"),
    "full_accept": Config("predictions walk to a leaf at maximum depth", 1008, 4, 64, depth=6, topk=4, kind="full_accept"),
    "non_first_child": Config("predictions choose a non-first child at every step", 1009, 6, 64, depth=6, topk=6, kind="non_first"),
    "token_id_zero": Config("accepted draft tokens with id 0 (not padding)", 1010, 4, 32, depth=6, topk=4, kind="zero"),
    "malformed": Config("cycle in next_sibling, wild index, bad node_count: statuses 1-3", 1011, 8, 16, depth=4, topk=4, kind="malformed"),
    "negative_token": Config("negative token ids in live slots (status 4 NEGATIVE_TOKEN), on and off the walk, "
                             "and only past node_count (OK); T = 49 > 32 so the scan wraps the lanes", 1012, 10, 48, depth=4,
                             topk=4, kind="negative"),
}


def _batch(trees: list[Tree], targets: list[np.ndarray]) -> dict[str, np.ndarray]:
    return {
        "node_token_ids": np.stack([t.token_ids for t in trees]).astype(np.int64),
        "next_token": np.stack([t.next_token for t in trees]).astype(np.int32),
        "next_sibling": np.stack([t.next_sibling for t in trees]).astype(np.int32),
        "node_count": np.array([t.node_count for t in trees], np.int32),
        "target_predict": np.stack(targets).astype(np.int64),
    }


def _follow_path(rng: np.random.Generator, tree: Tree, path: list[int]) -> np.ndarray:
    """Predictions that accept exactly ``path`` (root..last), then stop."""
    out = synth_target_predict(rng, tree, VOCAB)
    for a, b in zip(path, path[1:]):
        out[a] = tree.token_ids[b]
    out[path[-1]] = non_child_token(rng, tree, path[-1], VOCAB)
    return out


def _random_rows(cfg: Config, rng: np.random.Generator, t: int, counts: list[int]) -> dict[str, np.ndarray]:
    trees = [random_tree(rng, t, n, cfg.depth, cfg.topk, VOCAB) for n in counts]
    return _batch(trees, [synth_target_predict(rng, tr, VOCAB) for tr in trees])


def _synth_random(cfg: Config, rng: np.random.Generator, t: int) -> dict[str, np.ndarray]:
    counts = [int(rng.integers(cfg.budget * 3 // 4, cfg.budget + 1)) for _ in range(cfg.batch)]
    counts[0] = cfg.budget  # one full tree per batch
    return _random_rows(cfg, rng, t, counts)


def _synth_underfull(cfg: Config, rng: np.random.Generator, t: int) -> dict[str, np.ndarray]:
    counts = [int(rng.integers(1, cfg.budget // 4)) for _ in range(cfg.batch)]
    counts[0] = 1
    return _random_rows(cfg, rng, t, counts)


def _synth_chain(cfg: Config, rng: np.random.Generator, t: int) -> dict[str, np.ndarray]:
    trees = [chain_tree(rng, t, int(rng.integers(cfg.budget // 2, cfg.budget + 1)), VOCAB) for _ in range(cfg.batch)]
    targets = [synth_target_predict(rng, tr, VOCAB, p_first=0.9, p_other=0.0) for tr in trees]
    return _batch(trees, targets)


def _synth_root_only(cfg: Config, rng: np.random.Generator, t: int) -> dict[str, np.ndarray]:
    trees = [random_tree(rng, t, 0, cfg.depth, cfg.topk, VOCAB) for _ in range(cfg.batch)]
    return _batch(trees, [synth_target_predict(rng, tr, VOCAB) for tr in trees])


def _synth_full_accept(cfg: Config, rng: np.random.Generator, t: int) -> dict[str, np.ndarray]:
    trees, targets = [], []
    for _ in range(cfg.batch):
        tree = random_tree(rng, t, cfg.budget, cfg.depth, cfg.topk, VOCAB)
        deepest = int(np.flatnonzero(tree.depths == tree.depths.max())[-1])
        trees.append(tree)
        targets.append(_follow_path(rng, tree, path_to(tree, deepest)))
    return _batch(trees, targets)


def _synth_non_first(cfg: Config, rng: np.random.Generator, t: int) -> dict[str, np.ndarray]:
    trees, targets = [], []
    for _ in range(cfg.batch):
        tree = random_tree(rng, t, cfg.budget, cfg.depth, cfg.topk, VOCAB)
        path = [0]
        while len(kids := tree.children(path[-1])) > 1:
            path.append(kids[int(rng.integers(1, len(kids)))])
        trees.append(tree)
        targets.append(_follow_path(rng, tree, path))
    return _batch(trees, targets)


def _synth_zero(cfg: Config, rng: np.random.Generator, t: int) -> dict[str, np.ndarray]:
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


def _synth_malformed(cfg: Config, rng: np.random.Generator, t: int) -> dict[str, np.ndarray]:
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


def _synth_negative(cfg: Config, rng: np.random.Generator, t: int) -> dict[str, np.ndarray]:
    """A negative token id (-1 is the padding value) in a live slot 0..node_count of
    node_token_ids or target_predict is NEGATIVE_TOKEN wherever it is, reached by the walk
    or not; past node_count it is padding and does not count (docs/ops/tree_accept.md).

    Rows: 0 well-formed; 1, 2 the issue's inputs (a) and (b) padded to T; 3 target_predict
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

    def issue_row(r: int, row_ids, row_nt, row_ns, count: int, row_tp) -> None:
        k = len(row_ids)
        ids[r], nt[r], ns[r], tp[r] = -1, -1, -1, 0
        ids[r, :k], nt[r, :k], ns[r, :k], tp[r, :k] = row_ids, row_nt, row_ns, row_tp
        nc[r] = count

    # rows 1, 2: issue 8 item 3 (a) and (b)
    issue_row(1, [42, 5, -1, -1], [1, -1, -1, -1], [-1, -1, -1, -1], 1, [-1, 7, 0, 0])
    issue_row(2, [42, -1, 7, -1], [1, -1, -1, -1], [-1, 2, -1, -1], 2, [-1, 55, 0, 0])
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


_SYNTH: dict[str, Callable[[Config, np.random.Generator, int], dict[str, np.ndarray]]] = {
    "random": _synth_random,
    "underfull": _synth_underfull,
    "chain": _synth_chain,
    "root_only": _synth_root_only,
    "full_accept": _synth_full_accept,
    "non_first": _synth_non_first,
    "zero": _synth_zero,
    "malformed": _synth_malformed,
    "negative": _synth_negative,
}


def generate(name: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Inputs, expected outputs (reference) and metadata of configuration ``name``.

    Raises:
        KeyError: unknown configuration.
    """
    cfg = CONFIGS[name]
    rng = np.random.default_rng(cfg.seed)
    inputs = _SYNTH[cfg.kind](cfg, rng, cfg.budget + 1)
    expected = SPEC.reference(inputs, {})
    return package(OP, name, cfg, GENERATOR_VERSION, inputs, expected)
