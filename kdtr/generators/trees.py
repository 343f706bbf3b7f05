"""Draft-tree synthesis shared by the generators.

A draft tree has T = N + 1 slots; slot 0 is the root. Every non-root slot's parent has a
smaller index (best-first order), children of a slot are linked in index order through
first child (``next_token``) and ``next_sibling``, and sibling tokens are distinct (they
come from one top-k row).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .rng import Rng  # noqa: F401  (type hints: an Rng or a numpy Generator)


@dataclass
class Tree:
    """One request's tree, padded to T slots (-1 in empty slots)."""

    node_count: int
    parents: np.ndarray  # int32 [T]
    depths: np.ndarray  # int32 [T]
    token_ids: np.ndarray  # int64 [T]
    next_token: np.ndarray  # int32 [T]
    next_sibling: np.ndarray  # int32 [T]

    def children(self, slot: int) -> list[int]:
        out = []
        c = int(self.next_token[slot])
        while c != -1:
            out.append(c)
            c = int(self.next_sibling[c])
        return out


def links_from_parents(parents: np.ndarray, node_count: int) -> tuple[np.ndarray, np.ndarray]:
    """First-child / next-sibling links (int32 [T]) from parent slots, children in index order."""
    t = len(parents)
    next_token = np.full(t, -1, np.int32)
    next_sibling = np.full(t, -1, np.int32)
    last_child = {}
    for i in range(1, node_count + 1):
        p = int(parents[i])
        if p in last_child:
            next_sibling[last_child[p]] = i
        else:
            next_token[p] = i
        last_child[p] = i
    return next_token, next_sibling


def weighted_index(rng, n: int) -> int:
    """An index in [0, n) with probability proportional to n - 1 + i (1 when n == 1): one
    ``rng.integers`` draw searched in the integer cumulative weights."""
    if n == 1:
        return 0
    cdf = np.cumsum(np.arange(n - 1, 2 * n - 1, dtype=np.int64))
    return int(np.searchsorted(cdf, int(rng.integers(0, int(cdf[-1]))), side="right"))


def random_tree(
    rng: Rng | np.random.Generator,
    t: int,
    node_count: int,
    max_depth: int,
    max_children: int,
    vocab: int,
    root_token: int | None = None,
) -> Tree:
    """A random well-formed tree of ``node_count`` draft nodes in ``t`` slots.

    Parents are drawn among earlier slots that still have room (depth < max_depth and
    fewer than max_children children); if none has room the tree stops early (underfull).
    Sibling tokens are distinct draws from [0, vocab).
    """
    parents = np.full(t, -1, np.int32)
    depths = np.full(t, -1, np.int32)
    ids = np.full(t, -1, np.int64)
    depths[0] = 0
    ids[0] = rng.integers(0, vocab) if root_token is None else root_token
    kids: dict[int, set[int]] = {0: set()}
    n = 0
    for i in range(1, node_count + 1):
        open_slots = [s for s in range(i) if depths[s] < max_depth and len(kids[s]) < min(max_children, vocab)]
        if not open_slots:
            break
        # Favour recent slots a little so trees grow deep as well as wide: weights n-1 .. 2n-2
        # (proportional to 1..2), integers, so the draw has no float rounding to depend on.
        p = open_slots[weighted_index(rng, len(open_slots))]
        tok = int(rng.integers(0, vocab))
        while tok in kids[p]:
            tok = int(rng.integers(0, vocab))
        kids[p].add(tok)
        kids[i] = set()
        parents[i], depths[i], ids[i] = p, depths[p] + 1, tok
        n = i
    next_token, next_sibling = links_from_parents(parents, n)
    return Tree(n, parents, depths, ids, next_token, next_sibling)


def chain_tree(rng: Rng | np.random.Generator, t: int, node_count: int, vocab: int) -> Tree:
    """A chain: slot i's only child is slot i + 1 (top-k width 1)."""
    parents = np.full(t, -1, np.int32)
    depths = np.full(t, -1, np.int32)
    ids = np.full(t, -1, np.int64)
    depths[0] = 0
    ids[: node_count + 1] = rng.integers(0, vocab, node_count + 1)
    for i in range(1, node_count + 1):
        parents[i], depths[i] = i - 1, i
    next_token, next_sibling = links_from_parents(parents, node_count)
    return Tree(node_count, parents, depths, ids, next_token, next_sibling)


def non_child_token(rng: Rng | np.random.Generator, tree: Tree, slot: int, vocab: int) -> int:
    """A token that matches no child of ``slot`` (the walk stops there)."""
    taken = {int(tree.token_ids[c]) for c in tree.children(slot)}
    if len(taken) >= vocab:
        return vocab  # every in-vocabulary token is a child: use one past the vocabulary
    while True:
        tok = int(rng.integers(0, vocab))
        if tok not in taken:
            return tok


def synth_target_predict(
    rng: Rng | np.random.Generator,
    tree: Tree,
    vocab: int,
    p_first: float = 0.7,
    p_other: float = 0.2,
) -> np.ndarray:
    """The target model's greedy token at every valid slot (int64 [T], -1 in empty slots).

    At a slot with children: the first child's token with probability p_first, a random
    non-first child's token with probability p_other, else a token matching no child
    (early stop). Leaves always get a token matching no child.
    """
    t = len(tree.token_ids)
    out = np.full(t, -1, np.int64)
    for s in range(tree.node_count + 1):
        kids = tree.children(s)
        u = rng.random()
        if kids and u < p_first:
            out[s] = tree.token_ids[kids[0]]
        elif len(kids) > 1 and u < p_first + p_other:
            out[s] = tree.token_ids[kids[int(rng.integers(1, len(kids)))]]
        else:
            out[s] = non_child_token(rng, tree, s, vocab)
    return out


def path_to(tree: Tree, slot: int) -> list[int]:
    """Slots from the root to ``slot`` inclusive."""
    path = [slot]
    while path[-1] != 0:
        path.append(int(tree.parents[path[-1]]))
    return path[::-1]
