"""tree_accept: the greedy walk of a verified draft tree (reference, numpy).

Algorithm: docs/ops/tree_accept.md. It is SGLang's
``verify_tree_greedy`` (accept_token_num = accepted_count) for one step of greedy
DDTree speculative decoding (Ringel & Romano, "Accelerating Speculative Decoding with
Block Diffusion Draft Trees"): starting at the root (slot 0), move to the child whose
draft token equals the target model's greedy token at the current slot, while one
exists; the bonus token is the target's token at the last accepted slot.

Malformed trees never hang or read out of range: every walk is bounded by node_count
child-link visits and every followed index by [1, node_count]; a malformed request is
rejected whole with a nonzero status (codes below). A negative token id (-1 is the
padding value of empty slots) in a live slot 0..node_count of node_token_ids or
target_predict is malformed as well (NEGATIVE_TOKEN), checked on every live slot before
the walk so that the verdict does not depend on which slots the walk reaches.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..limits import check_output_bytes, tree_accept_output_bytes
from . import OpSpec, TensorSpec, exact, register_op

STATUS_OK = 0
STATUS_BAD_NODE_COUNT = 1
STATUS_BAD_INDEX = 2
STATUS_CYCLE = 3
STATUS_NEGATIVE_TOKEN = 4
STATUS_NAMES = {0: "OK", 1: "BAD_NODE_COUNT", 2: "BAD_INDEX", 3: "CYCLE", 4: "NEGATIVE_TOKEN"}

OUTPUTS = ("accepted_count", "accepted_path", "proposed", "status")


@dataclass
class AcceptResult:
    """Outputs of :func:`tree_accept` (B requests, T slots).

    accepted_count: int32 [B]; accepted_path: int32 [B,T]; proposed: int64 [B,T];
    status: int32 [B].
    """

    accepted_count: np.ndarray
    accepted_path: np.ndarray
    proposed: np.ndarray
    status: np.ndarray

    def as_dict(self) -> dict[str, np.ndarray]:
        return {name: getattr(self, name) for name in OUTPUTS}


def accept_request(
    node_token_ids: np.ndarray,
    next_token: np.ndarray,
    next_sibling: np.ndarray,
    node_count: int,
    target_predict: np.ndarray,
) -> tuple[int, list[int], list[int], int]:
    """Walk one request's tree.

    Args: the request's rows (int64 node_token_ids and target_predict, int32 next_token
    and next_sibling; length T each) and its node_count.

    Returns:
        (accepted_count, path slots, proposed tokens incl. the bonus token, status); for a
        malformed tree: (0, [0], [], status). Checked in this order: BAD_NODE_COUNT
        (node_count outside [0, T-1]), NEGATIVE_TOKEN (a negative id in
        node_token_ids[0..node_count] or target_predict[0..node_count], whether or not the
        walk reaches that slot), then during the walk BAD_INDEX and CYCLE.
    """
    t = len(node_token_ids)
    n = int(node_count)
    if n < 0 or n > t - 1:
        return 0, [0], [], STATUS_BAD_NODE_COUNT
    if (np.asarray(node_token_ids[: n + 1]) < 0).any() or (np.asarray(target_predict[: n + 1]) < 0).any():
        return 0, [0], [], STATUS_NEGATIVE_TOKEN
    cur = 0
    path = [0]
    tokens: list[int] = []
    visits = 0
    while True:
        want = int(target_predict[cur])
        c = int(next_token[cur])
        found = -1
        while c != -1:
            if c < 1 or c > n:
                return 0, [0], [], STATUS_BAD_INDEX
            visits += 1
            if visits > n:
                return 0, [0], [], STATUS_CYCLE
            if int(node_token_ids[c]) == want:
                found = c
                break
            c = int(next_sibling[c])
        if found == -1:
            break
        path.append(found)
        tokens.append(int(node_token_ids[found]))
        cur = found
    tokens.append(int(target_predict[cur]))
    return len(path) - 1, path, tokens, STATUS_OK


def tree_accept(
    node_token_ids: np.ndarray,
    next_token: np.ndarray,
    next_sibling: np.ndarray,
    node_count: np.ndarray,
    target_predict: np.ndarray,
) -> AcceptResult:
    """Greedy acceptance over a batch of verified draft trees.

    Args:
        node_token_ids: int64 [B,T], draft token per slot (slot 0 = root token, -1 empty);
            >= 0 in the live slots 0..node_count, else status NEGATIVE_TOKEN.
        next_token: int32 [B,T], first child (smallest-index child) per slot, -1 if none.
        next_sibling: int32 [B,T], next larger-index child of the same parent, -1 if none.
        node_count: int32 [B], draft nodes per request, root excluded.
        target_predict: int64 [B,T], the target model's greedy token at each slot; >= 0 in
            the live slots 0..node_count, else status NEGATIVE_TOKEN.

    Returns:
        :class:`AcceptResult`; rows padded with -1 after accepted_count + 1 entries. A
        malformed request (status BAD_NODE_COUNT, NEGATIVE_TOKEN, BAD_INDEX or CYCLE; see
        :func:`accept_request` for the order) gets accepted_count 0, accepted_path
        [0, -1, ...] and proposed all -1.

    Raises:
        ValueError: inconsistent shapes or dtypes (never for malformed trees or negative
            token ids: those get a per-request status); outputs over
            kdtr.limits.max_output_bytes() (naming node_token_ids), before allocating them.
    """
    ids = np.asarray(node_token_ids)
    if ids.ndim != 2:
        raise ValueError(f"node_token_ids must be [B,T], got shape {ids.shape}")
    b, t = ids.shape
    for name, arr, dt in (
        ("node_token_ids", ids, np.int64),
        ("next_token", next_token, np.int32),
        ("next_sibling", next_sibling, np.int32),
        ("target_predict", target_predict, np.int64),
    ):
        if np.asarray(arr).shape != (b, t) or np.asarray(arr).dtype != dt:
            got = np.asarray(arr)
            raise ValueError(f"{name} must be {np.dtype(dt)} [{b},{t}], got {got.dtype} {got.shape}")
    if np.asarray(node_count).shape != (b,) or np.asarray(node_count).dtype != np.int32:
        raise ValueError(f"node_count must be int32 [{b}]")
    if t < 1:
        raise ValueError("T must be at least 1 (the root slot)")
    # kdtr/limits.py, before allocating (the inputs may be views that hold no bytes)
    check_output_bytes(tree_accept_output_bytes(b, t), "node_token_ids", f"B = {b}, T = {t}")

    count = np.zeros(b, np.int32)
    path = np.full((b, t), -1, np.int32)
    proposed = np.full((b, t), -1, np.int64)
    status = np.zeros(b, np.int32)
    for r in range(b):
        n, slots, toks, st = accept_request(ids[r], next_token[r], next_sibling[r], node_count[r], target_predict[r])
        count[r] = n
        path[r, : len(slots)] = slots
        proposed[r, : len(toks)] = toks
        status[r] = st
    return AcceptResult(count, path, proposed, status)


def reference(inputs, metadata) -> dict[str, np.ndarray]:
    """The op registry's reference: :func:`tree_accept` (reads no metadata)."""
    return tree_accept(**inputs).as_dict()


SPEC = register_op(OpSpec(
    name="tree_accept",
    abi_dims=("B", "T"),
    description="greedy walk of the verified draft tree (docs/ops/tree_accept.md)",
    inputs=(
        TensorSpec("node_token_ids", "i64", ("B", "T")),
        TensorSpec("next_token", "i32", ("B", "T")),
        TensorSpec("next_sibling", "i32", ("B", "T")),
        TensorSpec("node_count", "i32", ("B",)),
        TensorSpec("target_predict", "i64", ("B", "T")),
    ),
    outputs=(
        exact("accepted_count", "i32", ("B",)),
        exact("accepted_path", "i32", ("B", "T")),
        exact("proposed", "i64", ("B", "T")),
        exact("status", "i32", ("B",)),
    ),
    reference=reference,
))
assert SPEC.output_names == OUTPUTS
