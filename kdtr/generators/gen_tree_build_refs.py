"""Goldens for tree_build (docs/ops/tree_build.md).

Inputs imitate a block-diffusion drafter: per request and depth, the top-K of a softmax
over a vocabulary slice, with a per-row concentration so that confident (peaked) and
flat rows mix. Configurations aim at code paths: ties (a few log-prob values including
exact 0.0), underfull trees, chains (K = 1), root-only rows, mixed per-request budget and
depth_limit (rows past the depth limit poisoned with NaN and duplicate ids: a builder
that reads or validates them fails), token id 0, and invalid inputs with their statuses;
the select build's two GPU instances on exact ties (``select_ties``, ``select_ties_n1024``)
and the score classes -0.0 beside +0.0 (``signed_zero``) and positive log-probs
(``positive_log_probs``); the CUDA kernels' row chunks and stripes (``vis_unaligned_rows``: T =
142, rows whose unaligned head adds a 16-byte chunk; ``vis_fused_words``: T = 128, the fused
block's 32-bit copy; ``stripe_defects``, ``stripe_defects_n1024``: defects on one validation
thread's stripe, range failures holding element defects, STRIPE_REQUESTS).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from kdtr.bf16 import to_float32
from kdtr.detmath import fixed_sum, log
from kdtr.ops.tree_build import SPEC

from .golden import package
from .rng import Rng

OP = "tree_build"
GENERATOR_VERSION = 2  # 2: host-independent synthesis (kdtr.generators.rng, kdtr.bf16, kdtr.detmath)
VOCAB = 32000


@dataclass(frozen=True)
class Config:
    """B requests, D depth, K top-k, N maximum budget (T = N + 1 slots)."""

    description: str
    seed: int
    batch: int
    depth: int
    topk: int
    budget: int
    kind: str = "random"
    tier: str = "committed"


CONFIGS: dict[str, Config] = {
    "default": Config("B=4, D=8, K=8, N=64: typical drafter distributions", 2001, 4, 8, 8, 64),
    "mid": Config("B=8, D=12, K=8, N=256", 2002, 8, 12, 8, 256),
    "wide": Config("K=16: wide top-k rows", 2003, 4, 8, 16, 128),
    "deep": Config("D=16, K=4: deep trees", 2004, 4, 16, 4, 128),
    "underfull": Config("budget 64 but D=3, K=3 hold only 39 nodes", 2005, 4, 3, 3, 64),
    "chain": Config("K=1: every node has at most one child", 2006, 4, 16, 1, 32),
    "ties": Config("log-probs from {0, -0.5, -1, -2}: equal scores everywhere", 2007, 6, 6, 6, 64, kind="ties"),
    "root_only": Config("budget 0 and depth_limit 0 rows", 2008, 4, 8, 8, 16, kind="root_only"),
    "mixed": Config("per-request budget and depth_limit; rows past the limit poisoned", 2009, 8, 10, 8, 128,
                    kind="mixed"),
    "token_id_zero": Config("token id 0 drafted at rank 0 and as a root token", 2010, 4, 8, 8, 64, kind="zero"),
    "large_batch": Config("B=64, D=16, K=16, N=256", 2011, 64, 16, 16, 256),
    "large_batch_n1024": Config(
        "B=64, D=16, K=16, N=1024 (DESIGN 7 size; 67 MB of visibility: second tier)", 2012, 64, 16, 16, 1024,
        tier="cache",
    ),
    "invalid": Config("NaN, -inf, unsorted, duplicate id, negative id, budget and depth_limit out of range",
                      2013, 10, 6, 6, 32, kind="invalid"),
    "status_precedence": Config("several defects in one request: the first status of the contract's order wins "
                                "(ranges before rows, a later NaN before an earlier unsorted pair, -inf at rank 0, "
                                "duplicate before negative, budget 0 still validated)",
                                2015, 12, 6, 6, 32, kind="precedence"),
    "near_ties": Config("tiny log-probs (-1e-12, -1e-30, -2^-40, f32 subnormals) beside ordinary ones (-0.3, -1.7, "
                        "...): scores that tie or nearly tie, whose order depends on evaluating the sibling score "
                        "exactly as (w - lp[r]) + lp[r+1] and the child score as w + lp[d][0] in float64",
                        2014, 25, 4, 4, 16, kind="near_ties"),
    # The select build's paths on the GPU (docs/ops/tree_build.md, "Goldens aimed at the select
    # build and the score classes"): its block is 256 threads for N <= 256, 1024 above.
    "select_ties": Config("select kernel, 256-thread instance (N=256), K=16, D=8: dyadic log-probs (multiples of 1/16 "
                          "in [-3, -1/16], no 0.0) so that scores are exact and nearly all tie, in groups small "
                          "enough for the select build's set: threshold raises at depths 2-7, a set of up to 300 "
                          "entries (more than the 256 threads: strided team loops) and a bitonic sort of 512 slots, "
                          "ties decided by rank path in the sort; no request falls back to the heap build",
                          2016, 4, 8, 16, 256,
                          kind="select_ties"),
    "select_ties_n1024": Config("select kernel, 1024-thread instance (N=1024 > 256), K=16, D=16, one request, the "
                                "select_ties log-probs: threshold raises at depths 3-7 over a set of up to 1179 "
                                "entries (strided team loops, compaction in two rounds), a bitonic sort of 2048 "
                                "slots, no fallback; T = 1025 > 128: "
                                "the separate visibility kernel", 2017, 1, 16, 16, 1024, kind="select_ties"),
    "signed_zero": Config("log-probs -0.0 and +0.0 (equal by value, different bits) at the top ranks: scores of "
                          "-0.0 and +0.0 that tie, so the rank path decides; every request is drawn until ordering "
                          "+0.0 before -0.0 (a comparison of the bits) builds another tree; heap and select builds",
                          2018, 8, 4, 4, 16, kind="signed_zero"),
    "positive_log_probs": Config("positive finite log-probs (the contract asks only finite and sorted): in the first "
                                 "row only (positive scores, no clamped node: the select build runs), at rank 0 of "
                                 "deeper rows (children that outscore their parents: clamped, the select build "
                                 "hands the request to the heap build), whole rows positive, large (+20) and tiny "
                                 "(+1e-30) values", 2019, 6, 5, 4, 24, kind="positive"),
    # The CUDA kernels' paths that the shapes above miss (docs/ops/tree_build.md, "Goldens aimed
    # at the CUDA kernels' stripes and row chunks").
    "vis_unaligned_rows": Config("tree_build_visibility_kernel (T = 142 > 128, T % 16 = 14), heap and select "
                                 "(256-thread instance) builds, full trees (node_count = N = 141): rows of 142 bytes "
                                 "start at offsets 14 i + 4 b mod 16, so a row whose first chunk holds head >= 3 "
                                 "bytes of the previous row spans one 16-byte chunk more than (T + 15) / 16; the "
                                 "last row's last byte is its own diagonal (1)", 2020, 2, 4, 8, 141),
    "vis_fused_words": Config("the build block's fused visibility (T = 128 <= 128, the fuse boundary), heap and select "
                              "(256-thread instance) builds, full trees (node_count = N = 127): T even, so T * T = "
                              "16384 is a multiple of 4 and every request's [T,T] block starts 4-byte aligned: the "
                              "block is copied out as 32-bit words (every other golden has T odd: the byte copy); "
                              "the last request's block ends at the end of the visibility allocation", 2023, 2, 4, 8,
                              127),
    "stripe_defects": Config("tree_build_kernel's validation (statuses 3-6 striped over 256 threads, heap and select "
                             "builds, N=16, D=K=24: 576 elements, two or three per thread): two or three defects on "
                             "one thread's stripe (elements e, e + 256, e + 512) with the first status of the "
                             "contract's order at the earliest (a thread must keep its lowest status, not its last), "
                             "the reverse order as a control, range failures (budget N + 1; depth_limit D + 1 in the "
                             "last request, whose rows d >= D lie past the inputs) holding element defects",
                             2021, 6, 24, 24, 16, kind="stripes"),
    "stripe_defects_n1024": Config("stripe_defects for the select kernel's 1024-thread instance (N=257 > 256; T = 258: "
                                   "the visibility kernel) and the heap kernel's 256 threads: D=40, K=32 (1280 "
                                   "elements), a NaN at element 100 and a negative id at 1124 = 100 + 1024 = 100 + "
                                   "4 * 256 (one thread's stripe in both instances); the last request has "
                                   "depth_limit D + 1 and element defects", 2022, 2, 40, 32, 257, kind="stripes"),
}


def drafter_rows(rng: Rng | np.random.Generator, b: int, d: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted f32 top-k log-probs and distinct token ids, [b, d, k] each.

    Host-independent for an :class:`Rng`: a fixed-order sum, kdtr's log and f32 rounding
    (kdtr/detmath.py, kdtr/bf16.py), stable sorts."""
    width = max(64, 2 * k)
    alpha = rng.uniform(0.03, 1.0, size=(b, d, 1))
    probs = rng.gamma(np.broadcast_to(alpha, (b, d, width)))
    probs = probs / fixed_sum(probs, axis=-1, keepdims=True)
    top = -np.sort(-probs, axis=-1, kind="stable")[..., :k]
    lp = to_float32(log(np.maximum(top, 1e-30)))
    lp = -np.sort(-lp, axis=-1, kind="stable")  # float32 rounding can't reorder, but keep the contract explicit
    ids = np.stack([rng.choice(VOCAB, size=k, replace=False) for _ in range(b * d)]).reshape(b, d, k)
    return lp.astype(np.float32), ids.astype(np.int64)


def _base(cfg: Config, rng: Rng | np.random.Generator) -> dict[str, np.ndarray]:
    lp, ids = drafter_rows(rng, cfg.batch, cfg.depth, cfg.topk)
    return {
        "top_log_probs": lp,
        "top_token_ids": ids,
        "root_token_ids": rng.integers(0, VOCAB, cfg.batch).astype(np.int64),
        "budget": np.full(cfg.batch, cfg.budget, np.int32),
        "depth_limit": np.full(cfg.batch, cfg.depth, np.int32),
    }


def _synth_random(cfg: Config, rng: Rng | np.random.Generator) -> dict[str, np.ndarray]:
    return _base(cfg, rng)


def _synth_ties(cfg: Config, rng: Rng | np.random.Generator) -> dict[str, np.ndarray]:
    x = _base(cfg, rng)
    values = np.array([0.0, -0.5, -1.0, -2.0], np.float32)
    lp = rng.choice(values, size=x["top_log_probs"].shape, p=[0.4, 0.3, 0.2, 0.1])
    x["top_log_probs"] = -np.sort(-lp, axis=-1, kind="stable").astype(np.float32)  # f32 already: exact
    x["top_log_probs"][0] = 0.0  # a fully saturated request: every score ties
    return x


def _synth_root_only(cfg: Config, rng: Rng | np.random.Generator) -> dict[str, np.ndarray]:
    x = _base(cfg, rng)
    x["budget"][:] = [0, 0, cfg.budget, 5][: cfg.batch]
    x["depth_limit"][:] = [cfg.depth, 0, 0, 0][: cfg.batch]
    return x


def _poison_past_limit(x: dict[str, np.ndarray]) -> None:
    lp, ids = x["top_log_probs"], x["top_token_ids"]
    for r, limit in enumerate(x["depth_limit"]):
        lp[r, limit:] = np.nan
        ids[r, limit:] = -7


def _synth_mixed(cfg: Config, rng: Rng | np.random.Generator) -> dict[str, np.ndarray]:
    x = _base(cfg, rng)
    x["budget"][:] = rng.integers(1, cfg.budget + 1, cfg.batch)
    x["depth_limit"][:] = rng.integers(1, cfg.depth + 1, cfg.batch)
    x["budget"][0], x["depth_limit"][0] = cfg.budget, cfg.depth
    x["budget"][1], x["depth_limit"][1] = cfg.budget, 2
    _poison_past_limit(x)
    return x


def _synth_zero(cfg: Config, rng: Rng | np.random.Generator) -> dict[str, np.ndarray]:
    x = _base(cfg, rng)
    ids = x["top_token_ids"]
    for r in range(cfg.batch):
        for d in range(cfg.depth):
            row = ids[r, d]
            if 0 in row:
                continue
            row[r % 2] = 0  # rank 0 or rank 1: inside every tree of this size
    x["root_token_ids"][0] = 0
    return x


def _synth_invalid(cfg: Config, rng: Rng | np.random.Generator) -> dict[str, np.ndarray]:
    x = _base(cfg, rng)
    lp, ids, budget, limit = x["top_log_probs"], x["top_token_ids"], x["budget"], x["depth_limit"]
    lp[1, 2, 3] = np.nan  # NON_FINITE
    lp[2, 0, 5] = -np.inf  # NON_FINITE (last rank)
    lp[3, 4, 1], lp[3, 4, 2] = -3.0, -1.0  # UNSORTED
    ids[4, 5, 5] = ids[4, 5, 0]  # DUPLICATE_ID
    budget[5] = cfg.budget + 1  # BAD_BUDGET
    budget[6] = -1  # BAD_BUDGET
    limit[7] = cfg.depth + 1  # BAD_DEPTH_LIMIT
    ids[8, 1, 2] = -1  # NEGATIVE_ID
    limit[9] = 3  # a NaN past the depth limit: valid
    lp[9, 4, 0] = np.nan
    return x


# status_precedence: (request, expected status) -- checked by tests/unit/test_gen_tree_build.py.
PRECEDENCE_STATUS = (1, 1, 2, 3, 3, 5, 5, 4, 3, 3, 0, 6)


def _synth_precedence(cfg: Config, rng: Rng | np.random.Generator) -> dict[str, np.ndarray]:
    x = _base(cfg, rng)
    lp, ids, budget, limit = x["top_log_probs"], x["top_token_ids"], x["budget"], x["depth_limit"]
    budget[0], limit[0] = cfg.budget + 1, cfg.depth + 1  # BAD_BUDGET and BAD_DEPTH_LIMIT: 1
    budget[1], lp[1, 0, 2] = -1, np.nan  # BAD_BUDGET and a NaN: 1 (ranges before rows)
    limit[2], lp[2, 1, 1] = -1, np.nan  # BAD_DEPTH_LIMIT and a NaN: 2
    lp[3, 0, 1], lp[3, 0, 2] = -9.0, -1.0  # UNSORTED in row 0 ...
    lp[3, 4, 3] = np.nan  # ... and a NaN in a later row: 3
    lp[4, 2, 0] = -np.inf  # -inf at rank 0 (also "smaller than its successor"): 3
    ids[5, 3, 4] = ids[5, 3, 1]  # DUPLICATE_ID in row 3 ...
    ids[5, 1, 0] = -3  # ... and NEGATIVE_ID in an earlier row: 5
    ids[6, 2, 2] = ids[6, 2, 5] = -4  # one id both duplicated and negative: 5
    lp[7, 5, 0], lp[7, 5, 1] = -8.0, -2.0  # UNSORTED in the last row ...
    ids[7, 0, 3] = ids[7, 0, 0]  # ... and DUPLICATE_ID in the first: 4
    budget[8], lp[8, 2, 4] = 0, np.nan  # budget 0 still validates the rows: 3
    limit[9], lp[9, 2, 5] = 3, np.inf  # +inf in the last checked row (depth_limit 3): 3
    limit[10], lp[10, 3, 0], ids[10, 4, 1] = 3, np.nan, -5  # defects only past the depth limit: 0
    budget[11], ids[11, 5, 5] = 0, -1  # budget 0, a negative id in the last row: 6
    return x


# near_ties pools: tiny log-probs (absorbed by an ordinary score, or not quite: -1e-12 and -3e-9
# move a float64 sum of ordinary values by thousands of ulps, so the order of the two additions of
# a sibling score decides its last bits) and ordinary ones, repeated so that different rank paths
# have mathematically equal scores.
NEAR_TIE_TINY = to_float32([-1e-12, -1e-30, -(2.0**-40), -1e-40, -1.4e-45, -3e-9, -1e-7])
NEAR_TIE_ORDINARY = to_float32([-0.3, -1.7, -0.5, -0.7, -1.1, -2.3])
# Wrong evaluations of the scores (the golden's requests are chosen so that each changes the tree).
NEAR_TIE_WRONG = ("swap", "diff", "f32")


def grow_scored(lp: np.ndarray, ids: np.ndarray, budget: int, depth_limit: int, how: str = "contract") -> list[int]:
    """Token ids in slot order of the best-first tree, with the scores evaluated ``how``:
    ``contract`` (w - lp[r]) + lp[r+1] and w + lp[d][0] in float64 (= the reference); ``swap``
    (w + lp[r+1]) - lp[r]; ``diff`` w + (lp[r+1] - lp[r]); ``parent`` the parent's score +
    lp[r+1]; ``f32`` the contract's formulas in float32. Ties by rank path as in the contract."""
    k = lp.shape[1]
    f = np.float32 if how == "f32" else float
    v = [[f(x) for x in row] for row in lp.astype(np.float64)]
    slot_w = [f(0.0)]
    heap = [(-v[0][0], (0,), 1, 0, 0)]
    out: list[int] = []
    while heap and len(out) < budget and depth_limit > 0:
        nw, path, d, r, p = heapq.heappop(heap)
        w = -nw
        out.append(int(ids[d - 1][r]))
        slot_w.append(w)
        if r + 1 < k:
            a, b = v[d - 1][r], v[d - 1][r + 1]
            ws = {"swap": (w + b) - a, "diff": w + (b - a), "parent": slot_w[p] + b}.get(how, (w - a) + b)
            heapq.heappush(heap, (-ws, path[:-1] + (r + 1,), d, r + 1, p))
        if d < depth_limit:
            heapq.heappush(heap, (-(w + v[d][0]), path + (0,), d + 1, 0, len(out)))
    return out


def _near_tie_rows(rng: Rng | np.random.Generator, d: int, k: int) -> np.ndarray:
    """f32 [d, k] sorted rows mixing NEAR_TIE_TINY and NEAR_TIE_ORDINARY: one row shared by
    every depth, independent rows, or rows whose two best ranks are tiny (child scores that
    nearly tie their parent's siblings)."""
    family = int(rng.integers(0, 3))

    def one(n_tiny: int) -> np.ndarray:
        vals = np.concatenate([rng.choice(NEAR_TIE_TINY, n_tiny), rng.choice(NEAR_TIE_ORDINARY, k - n_tiny)])
        return -np.sort(-vals.astype(np.float32), kind="stable")  # f32 already: exact

    if family == 0:
        return np.tile(one(int(rng.integers(1, k))), (d, 1))
    if family == 1:
        return np.stack([one(int(rng.integers(1, k))) for _ in range(d)])
    return np.stack([one(min(2, k)) for _ in range(d)])


def _synth_near_ties(cfg: Config, rng: Rng | np.random.Generator) -> dict[str, np.ndarray]:
    """Request 0: the input that first showed the bug (rows [-1e-12, -0.3], budget 4, depth_limit 2), padded with
    ranks of -5 and -6 that the tree never reaches. Request r >= 1: near-tie rows
    (:func:`_near_tie_rows`) drawn until the wrong evaluation NEAR_TIE_WRONG[(r - 1) % 3]
    (:func:`grow_scored`) builds another tree than the contract's: every request is one where
    the evaluation order of the scores shows."""
    x = _base(cfg, rng)
    lp, ids = x["top_log_probs"], x["top_token_ids"]
    if cfg.topk < 4:
        raise ValueError("near_ties: top-k must be >= 4")
    lp[0] = to_float32([-1e-12, -0.3, -5.0, -6.0] + [-7.0] * (cfg.topk - 4))
    ids[0] = np.arange(1, cfg.depth * cfg.topk + 1).reshape(cfg.depth, cfg.topk)
    ids[0, :2, :2] = [[1, 2], [3, 4]]
    x["root_token_ids"][0] = 0
    x["budget"][0], x["depth_limit"][0] = 4, 2
    for r in range(1, cfg.batch):
        how = NEAR_TIE_WRONG[(r - 1) % len(NEAR_TIE_WRONG)]
        for _ in range(100_000):
            cand = _near_tie_rows(rng, cfg.depth, cfg.topk)
            plain = grow_scored(cand, ids[r], cfg.budget, cfg.depth)
            if grow_scored(cand, ids[r], cfg.budget, cfg.depth, how) != plain:
                lp[r] = cand
                break
        else:
            raise ValueError(f"near_ties: no near-tie rows for request {r} ({how}) in 100000 draws")
    return x


# select_ties: exact (dyadic) log-probs, the multiples of 1/16 in [-3, -1/16]; no 0.0. Nearly
# every placed node shares its score with another, yet the tie groups stay small enough for the
# select build's set (with eight values from -0.25 to -3 a group at theta overflows its capacity
# and the select build gives up).
SELECT_TIE_VALUES = np.array([-k / 16 for k in range(1, 49)], np.float32)


def _synth_select_ties(cfg: Config, rng: Rng | np.random.Generator) -> dict[str, np.ndarray]:
    """Rows drawn uniformly from SELECT_TIE_VALUES, sorted: every score is a dyadic rational
    with few bits, so every evaluation order gives the same bits, no node is clamped, and
    nearly every placed node shares its score with another (the sort's rank-path comparison
    decides them)."""
    x = _base(cfg, rng)
    lp = rng.choice(SELECT_TIE_VALUES, size=x["top_log_probs"].shape)
    x["top_log_probs"] = -np.sort(-lp, axis=-1, kind="stable").astype(np.float32)  # f32 already: exact
    return x


def _zero_key(w: float) -> tuple[float, int]:
    """The order of scores by their bits: +0.0 before -0.0 (what a sort on the IEEE bits, or on
    an order-preserving integer key of them, does); equal otherwise to the order by value."""
    return (-w, 1 if math.copysign(1.0, w) < 0 else 0)


def grow_bits(lp: np.ndarray, ids: np.ndarray, budget: int, depth_limit: int) -> list[int]:
    """Token ids in slot order of the best-first tree when scores are ordered by their bits
    (_zero_key: +0.0 before -0.0, then the rank path): the tree a comparison of the bits
    builds. Scores as in the contract."""
    k = lp.shape[1]
    v = [[float(x) for x in row] for row in lp.astype(np.float64)]
    heap = [(_zero_key(v[0][0]), (0,), v[0][0], 1, 0)]
    out: list[int] = []
    while heap and len(out) < budget and depth_limit > 0:
        _, path, w, d, r = heapq.heappop(heap)
        out.append(int(ids[d - 1][r]))
        if r + 1 < k:
            ws = (w - v[d - 1][r]) + v[d - 1][r + 1]
            heapq.heappush(heap, (_zero_key(ws), path[:-1] + (r + 1,), ws, d, r + 1))
        if d < depth_limit:
            wc = w + v[d][0]
            heapq.heappush(heap, (_zero_key(wc), path + (0,), wc, d + 1, 0))
    return out


SIGNED_ZERO_ORDINARY = np.array([-0.5, -1.0, -1.5, -0.3, -0.7, -2.2], np.float32)


def _synth_signed_zero(cfg: Config, rng: Rng | np.random.Generator) -> dict[str, np.ndarray]:
    """Per request, rows whose first 1..2 ranks are 0.0 or -0.0 (either sign in any order:
    equal values are sorted) followed by ordinary values; drawn until :func:`grow_bits`
    builds another tree than the contract's (:func:`grow_scored`). Request 0 is fixed: rows
    [-0.0, 0.0, -0.5, -1] at every depth (the root's first child scores -0.0, its sibling
    +0.0 and its first child -0.0: the contract places the child (path (0, 0)) before the
    sibling (path (1)), a bit order the other way round)."""
    x = _base(cfg, rng)
    lp = x["top_log_probs"]
    if cfg.topk < 4:
        raise ValueError("signed_zero: top-k must be >= 4")
    lp[0] = np.array([-0.0, 0.0, -0.5, -1.0] + [-2.0] * (cfg.topk - 4), np.float32)
    for r in range(1, cfg.batch):
        for _ in range(100_000):
            rows = []
            for _d in range(cfg.depth):
                nz = int(rng.integers(1, 3))
                zeros = rng.choice(np.array([0.0, -0.0], np.float32), nz)
                rest = -np.sort(-rng.choice(SIGNED_ZERO_ORDINARY, cfg.topk - nz), kind="stable")
                rows.append(np.concatenate([zeros, rest]).astype(np.float32))
            cand = np.stack(rows)
            if grow_bits(cand, x["top_token_ids"][r], cfg.budget, cfg.depth) != grow_scored(
                    cand, x["top_token_ids"][r], cfg.budget, cfg.depth):
                lp[r] = cand
                break
        else:
            raise ValueError(f"signed_zero: no rows for request {r} in 100000 draws")
    return x


def _synth_positive(cfg: Config, rng: Rng | np.random.Generator) -> dict[str, np.ndarray]:
    """Positive finite log-probs, rows sorted non-increasing:
    0. positives in row 0 only (+2, +0.5, ...): positive scores, no clamped node;
    1. lp[d][0] > 0 in every row d >= 1: every first child outscores its parent (clamped);
    2. every row positive;
    3. a large value (+20) at rank 0 of the last row, negatives elsewhere;
    4. tiny positives (+1e-30, +1e-7) beside 0.0 and negatives;
    5. positives in one middle row, at ranks 0 and 1.
    Requests past 5: drafter rows shifted up by a random amount in [0.5, 3)."""
    x = _base(cfg, rng)
    lp = x["top_log_probs"]
    d, k = cfg.depth, cfg.topk
    if cfg.batch < 6 or d < 3 or k < 4:
        raise ValueError("positive_log_probs: needs B >= 6, D >= 3, K >= 4")
    base = lp.copy()
    lp[0, 0, :4] = to_float32([2.0, 0.5, -0.25, -1.0])
    lp[1, 1:, 0] = to_float32(rng.uniform(0.1, 1.5, d - 1))
    lp[2] = np.abs(lp[2]) + to_float32(0.125)
    lp[3, d - 1, 0] = to_float32(20.0)
    lp[4, :, :3] = to_float32([1e-7, 1e-30, 0.0])
    lp[5, d // 2, :2] = to_float32([3.0, 1.0])
    for r in range(6, cfg.batch):
        lp[r] = to_float32(base[r].astype(np.float64) + rng.uniform(0.5, 3.0))
    x["top_log_probs"] = -np.sort(-lp, axis=-1, kind="stable").astype(np.float32)  # f32 already: exact
    return x


# stripes: per configuration and request, the defects (flat element e = d * K + r of the [D, K]
# rows, kind) and the range overrides (budget, depth_limit; None: N, D). Kinds: "nan" (lp NaN at
# e: NON_FINITE), "unsorted" (lp[d][r + 1] raised above lp[d][r]: UNSORTED at e), "duplicate"
# (ids[d][K - 1] = ids[d][r]: DUPLICATE_ID at e), "negative" (id -2 at e: NEGATIVE_ID).
# A stripe of W threads holds elements e, e + W, e + 2 W, ... (W = 256, or 1024 for the select
# kernel's N > 256 instance).
STRIPE_REQUESTS: dict[str, tuple[tuple[tuple[tuple[int, str], ...], int | None, int | None], ...]] = {
    "stripe_defects": (
        (((5, "nan"), (261, "negative")), None, None),  # 3, not the stripe's last (6)
        (((40, "unsorted"), (296, "duplicate")), None, None),  # 4, not 5
        (((50, "nan"), (306, "duplicate"), (562, "negative")), None, None),  # 3, not 6
        (((7, "negative"), (263, "nan")), None, None),  # 3 either way (the control)
        (((9, "nan"), (265, "negative")), 17, None),  # BAD_BUDGET (N + 1) with element defects: 1
        (((3, "nan"), (259, "negative")), None, 25),  # BAD_DEPTH_LIMIT (D + 1), last request: 2
    ),
    "stripe_defects_n1024": (
        (((100, "nan"), (1124, "negative")), None, None),  # 3, not 6 (1024 and 4 x 256 apart)
        (((100, "nan"), (1124, "negative")), None, 41),  # BAD_DEPTH_LIMIT (D + 1), last request: 2
    ),
}


def _synth_stripes(cfg: Config, rng: Rng | np.random.Generator) -> dict[str, np.ndarray]:
    """Drafter rows with STRIPE_REQUESTS[name]'s defects and range overrides, request by
    request (the configuration is found by its seed).

    Raises:
        ValueError: the batch is not the table's length, an element is outside [0, D K), an
            unsorted or duplicate defect at rank K - 1, or an unknown kind."""
    name = next(n for n, c in CONFIGS.items() if c.seed == cfg.seed)
    table = STRIPE_REQUESTS[name]
    if len(table) != cfg.batch:
        raise ValueError(f"{name}: batch {cfg.batch} != {len(table)} requests in STRIPE_REQUESTS")
    x = _base(cfg, rng)
    lp, ids, k = x["top_log_probs"], x["top_token_ids"], cfg.topk
    for b, (defects, budget, limit) in enumerate(table):
        for e, kind in defects:
            if not 0 <= e < cfg.depth * k:
                raise ValueError(f"{name}, request {b}: element {e} outside [0, {cfg.depth * k})")
            d, r = divmod(e, k)
            if kind in ("unsorted", "duplicate") and r + 1 >= k:
                raise ValueError(f"{name}, request {b}: {kind} at rank {r} = K - 1")
            if kind == "nan":
                lp[b, d, r] = np.nan
            elif kind == "unsorted":
                lp[b, d, r + 1] = lp[b, d, r] + np.float32(1.0)
            elif kind == "duplicate":
                ids[b, d, k - 1] = ids[b, d, r]
            elif kind == "negative":
                ids[b, d, r] = -2
            else:
                raise ValueError(f"{name}, request {b}: unknown defect kind {kind!r}")
        if budget is not None:
            x["budget"][b] = budget
        if limit is not None:
            x["depth_limit"][b] = limit
    return x


_SYNTH: dict[str, Callable[[Config, Rng], dict[str, np.ndarray]]] = {
    "random": _synth_random,
    "ties": _synth_ties,
    "root_only": _synth_root_only,
    "mixed": _synth_mixed,
    "zero": _synth_zero,
    "invalid": _synth_invalid,
    "near_ties": _synth_near_ties,
    "precedence": _synth_precedence,
    "select_ties": _synth_select_ties,
    "signed_zero": _synth_signed_zero,
    "positive": _synth_positive,
    "stripes": _synth_stripes,
}


def generate(name: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Inputs, expected outputs and metadata of configuration ``name``.

    Raises:
        KeyError: unknown configuration.
    """
    cfg = CONFIGS[name]
    inputs = _SYNTH[cfg.kind](cfg, Rng(cfg.seed))
    expected = SPEC.reference(inputs, {"max_budget": cfg.budget})
    return package(OP, name, cfg, GENERATOR_VERSION, inputs, expected, max_budget=cfg.budget)
