"""tree_build: the best-first draft-tree builder of DDTree (reference, numpy + heapq).

Source: Ringel & Romano, "Accelerating Speculative Decoding with Block Diffusion Draft
Trees" (DDTree), its reference tree builder; contract in
docs/ops/tree_build.md.

The drafter gives, per depth d = 1..D, the top-K log-probs ``lp[d-1]`` (sorted
non-increasing) and their token ids. A node at depth d with rank r has score w, the sum
of the log-probs on its rank path. Starting from the candidate (1, 0, 0, lp[0][0]), the
builder repeatedly pops the best candidate into the next slot and pushes its next
sibling ((w - lp[d-1][r]) + lp[d-1][r+1], float64, left to right) and its first child
(w + lp[d][0]) until ``budget`` nodes are placed or no candidate is left. Ties in w are
broken by the rank path in lexicographic order, a path before its own extensions.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from ..limits import check_output_bytes, tree_build_output_bytes
from . import OpSpec, TensorSpec, exact, register_op

STATUS_OK = 0
STATUS_BAD_BUDGET = 1
STATUS_BAD_DEPTH_LIMIT = 2
STATUS_NON_FINITE = 3
STATUS_UNSORTED = 4
STATUS_DUPLICATE_ID = 5
STATUS_NEGATIVE_ID = 6
STATUS_NAMES = {
    0: "OK", 1: "BAD_BUDGET", 2: "BAD_DEPTH_LIMIT", 3: "NON_FINITE", 4: "UNSORTED", 5: "DUPLICATE_ID",
    6: "NEGATIVE_ID",
}

OUTPUTS = (
    "node_count", "node_token_ids", "node_depths", "parents", "next_token", "next_sibling", "visibility", "status",
)


@dataclass
class TreeBuildResult:
    """Outputs for B requests and T = N + 1 slots (docs/ops/tree_build.md).

    node_count int32 [B]; node_token_ids int64 [B,T]; node_depths, parents, next_token,
    next_sibling int32 [B,T]; visibility uint8 [B,T,T]; status int32 [B].
    """

    node_count: np.ndarray
    node_token_ids: np.ndarray
    node_depths: np.ndarray
    parents: np.ndarray
    next_token: np.ndarray
    next_sibling: np.ndarray
    visibility: np.ndarray
    status: np.ndarray

    def as_dict(self) -> dict[str, np.ndarray]:
        return {name: getattr(self, name) for name in OUTPUTS}


def validate_request(lp: np.ndarray, ids: np.ndarray, budget: int, depth_limit: int, n_max: int) -> int:
    """Status of one request (0 = valid), checked in the contract's order.

    Args:
        lp: float32 [D,K] log-probs; ids: int64 [D,K] token ids; budget, depth_limit: ints;
        n_max: N, the largest budget the output holds.
    """
    d_max = lp.shape[0]
    if budget < 0 or budget > n_max:
        return STATUS_BAD_BUDGET
    if depth_limit < 0 or depth_limit > d_max:
        return STATUS_BAD_DEPTH_LIMIT
    rows_lp, rows_ids = lp[:depth_limit], ids[:depth_limit]
    if not np.isfinite(rows_lp).all():
        return STATUS_NON_FINITE
    if (rows_lp[:, :-1] < rows_lp[:, 1:]).any():
        return STATUS_UNSORTED
    srt = np.sort(rows_ids, axis=1)
    if (srt[:, :-1] == srt[:, 1:]).any():
        return STATUS_DUPLICATE_ID
    if (rows_ids < 0).any():
        return STATUS_NEGATIVE_ID
    return STATUS_OK


def build_request(
    lp: np.ndarray, ids: np.ndarray, budget: int, depth_limit: int, scores: list[float] | None = None
) -> tuple[list[int], list[int], list[int]]:
    """Best-first build of one valid request.

    Args:
        lp: float32 [D,K], rows sorted non-increasing; ids: int64 [D,K]; budget >= 0;
        0 <= depth_limit <= D.

    Returns:
        (tokens, depths, parents) of the draft nodes in slot order 1..node_count; if
        ``scores`` is a list, each node's float64 score is appended to it in slot order.
    """
    k = lp.shape[1]
    lp64 = lp.astype(np.float64).tolist()  # exact widening; Python floats are IEEE binary64
    tokens: list[int] = []
    depths: list[int] = []
    parents: list[int] = []
    if budget == 0 or depth_limit == 0 or k == 0:
        return tokens, depths, parents
    # heap key: (-w, rank path) -> largest w first, then lexicographic rank path (prefix first)
    heap: list[tuple[float, tuple[int, ...], int, int, int]] = [(-lp64[0][0], (0,), 1, 0, 0)]
    while heap and len(tokens) < budget:
        neg_w, path, d, r, p = heapq.heappop(heap)
        w = -neg_w
        tokens.append(int(ids[d - 1][r]))
        if scores is not None:
            scores.append(w)
        depths.append(d)
        parents.append(p)
        slot = len(tokens)
        if r + 1 < k:
            ws = (w - lp64[d - 1][r]) + lp64[d - 1][r + 1]
            heapq.heappush(heap, (-ws, path[:-1] + (r + 1,), d, r + 1, p))
        if d < depth_limit:
            wc = w + lp64[d][0]
            heapq.heappush(heap, (-wc, path + (0,), d + 1, 0, slot))
    return tokens, depths, parents


def tree_build(
    top_log_probs: np.ndarray,
    top_token_ids: np.ndarray,
    root_token_ids: np.ndarray,
    budget: np.ndarray,
    depth_limit: np.ndarray,
    n_max: int | None = None,
    on_invalid: str = "raise",
) -> TreeBuildResult:
    """Build B draft trees best-first.

    Args:
        top_log_probs: float32 [B,D,K], each row sorted non-increasing, finite.
        top_token_ids: int64 [B,D,K], distinct and >= 0 within a row.
        root_token_ids: int64 [B].
        budget: int32 [B] in [0, N]; depth_limit: int32 [B] in [0, D].
        n_max: N, the maximum budget (T = N + 1 output slots); default max(budget, 0).
        on_invalid: "raise" (ValueError naming the request and the defect) or "status"
            (the request gets a nonzero status and a root-only tree).

    Returns:
        :class:`TreeBuildResult`.

    Raises:
        ValueError: inconsistent shapes or dtypes; n_max not an int >= 0; outputs (visibility
            alone is B * (n_max + 1)^2 bytes) over kdtr.limits.max_output_bytes(), naming
            n_max, before anything is allocated; invalid input when on_invalid="raise".
    """
    lp = np.asarray(top_log_probs)
    ids = np.asarray(top_token_ids)
    if lp.ndim != 3 or lp.dtype != np.float32:
        raise ValueError(f"top_log_probs must be float32 [B,D,K], got {lp.dtype} {lp.shape}")
    b, d_max, _ = lp.shape
    if ids.shape != lp.shape or ids.dtype != np.int64:
        raise ValueError(f"top_token_ids must be int64 {list(lp.shape)}, got {ids.dtype} {ids.shape}")
    for name, arr, dt in (("root_token_ids", root_token_ids, np.int64), ("budget", budget, np.int32),
                          ("depth_limit", depth_limit, np.int32)):
        if np.asarray(arr).shape != (b,) or np.asarray(arr).dtype != dt:
            raise ValueError(f"{name} must be {np.dtype(dt)} [{b}]")
    if on_invalid not in ("raise", "status"):
        raise ValueError(f"on_invalid must be 'raise' or 'status', not {on_invalid!r}")
    if n_max is None:
        n_max = int(max(int(np.max(budget)) if b else 0, 0))
    if isinstance(n_max, bool) or not isinstance(n_max, (int, np.integer)) or n_max < 0:
        raise ValueError(f"n_max must be an int >= 0, not {n_max!r}")
    n_max = int(n_max)
    t = n_max + 1
    # Before any allocation: visibility alone is B * T * T bytes (kdtr/limits.py).
    check_output_bytes(tree_build_output_bytes(b, t), "n_max", f"B = {b}, T = n_max + 1 = {t}")

    count = np.zeros(b, np.int32)
    tok = np.full((b, t), -1, np.int64)
    dep = np.full((b, t), -1, np.int32)
    par = np.full((b, t), -1, np.int32)
    first = np.full((b, t), -1, np.int32)
    sib = np.full((b, t), -1, np.int32)
    vis = np.zeros((b, t, t), np.uint8)
    status = np.zeros(b, np.int32)
    for r in range(b):
        st = validate_request(lp[r], ids[r], int(budget[r]), int(depth_limit[r]), n_max)
        if st != STATUS_OK and on_invalid == "raise":
            raise ValueError(f"request {r}: invalid input ({STATUS_NAMES[st]})")
        status[r] = st
        if st:
            tokens, depths, parents = [], [], []
        else:
            tokens, depths, parents = build_request(lp[r], ids[r], int(budget[r]), int(depth_limit[r]))
        n = len(tokens)
        count[r] = n
        tok[r, 0], dep[r, 0] = root_token_ids[r], 0
        tok[r, 1 : n + 1], dep[r, 1 : n + 1], par[r, 1 : n + 1] = tokens, depths, parents
        last_child: dict[int, int] = {}
        vis[r, 0, 0] = 1
        for s in range(1, n + 1):
            p = parents[s - 1]
            if p in last_child:
                sib[r, last_child[p]] = s
            else:
                first[r, p] = s
            last_child[p] = s
            vis[r, s, : n + 1] = vis[r, p, : n + 1]
            vis[r, s, s] = 1
    return TreeBuildResult(count, tok, dep, par, first, sib, vis, status)


def reference(inputs, metadata) -> dict[str, np.ndarray]:
    """The op registry's reference: :func:`tree_build` with ``n_max`` = metadata
    ``max_budget`` and invalid requests reported by status (as the kernels do)."""
    return tree_build(**inputs, n_max=int(metadata["max_budget"]), on_invalid="status").as_dict()


SPEC = register_op(OpSpec(
    name="tree_build",
    kernels=("heap", "select"),
    abi_dims=("B", "D", "K", "N"),
    abi_buffers=(TensorSpec("heap_fallback", "u8", ("B",)),),  # optional: 1 where the select build gave up
    description="best-first draft tree (docs/ops/tree_build.md)",
    inputs=(
        TensorSpec("top_log_probs", "f32", ("B", "D", "K")),
        TensorSpec("top_token_ids", "i64", ("B", "D", "K")),
        TensorSpec("root_token_ids", "i64", ("B",)),
        TensorSpec("budget", "i32", ("B",)),
        TensorSpec("depth_limit", "i32", ("B",)),
    ),
    outputs=(
        exact("node_count", "i32", ("B",)),
        exact("node_token_ids", "i64", ("B", "T")),
        exact("node_depths", "i32", ("B", "T")),
        exact("parents", "i32", ("B", "T")),
        exact("next_token", "i32", ("B", "T")),
        exact("next_sibling", "i32", ("B", "T")),
        exact("visibility", "u8", ("B", "T", "T")),
        exact("status", "i32", ("B",)),
    ),
    reference=reference,
    metadata=("max_budget",),  # N: T = N + 1 output slots
))
assert SPEC.output_names == OUTPUTS
