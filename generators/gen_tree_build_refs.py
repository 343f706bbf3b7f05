"""Goldens for tree_build (shared/DESIGN.md 3.1, docs/ops/tree_build.md).

Inputs imitate a block-diffusion drafter: per request and depth, the top-K of a softmax
over a vocabulary slice, with a per-row concentration so that confident (peaked) and
flat rows mix. Configurations aim at code paths: ties (a few log-prob values including
exact 0.0), underfull trees, chains (K = 1), root-only rows, mixed per-request budget and
depth_limit (rows past the depth limit poisoned with NaN and duplicate ids: a builder
that reads or validates them fails), token id 0, and invalid inputs with their statuses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from kdtr.ops.tree_build import SPEC
from .golden import package

OP = "tree_build"
GENERATOR_VERSION = 1
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
    "mixed": Config("per-request budget and depth_limit; rows past the limit poisoned", 2009, 8, 10, 8, 128, kind="mixed"),
    "token_id_zero": Config("token id 0 drafted at rank 0 and as a root token", 2010, 4, 8, 8, 64, kind="zero"),
    "large_batch": Config("B=64, D=16, K=16, N=256", 2011, 64, 16, 16, 256),
    "large_batch_n1024": Config(
        "B=64, D=16, K=16, N=1024 (DESIGN 7 size; 67 MB of visibility: second tier)", 2012, 64, 16, 16, 1024,
        tier="cache",
    ),
    "invalid": Config("NaN, -inf, unsorted, duplicate id, negative id, budget and depth_limit out of range",
                      2013, 10, 6, 6, 32, kind="invalid"),
}


def drafter_rows(rng: np.random.Generator, b: int, d: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted f32 top-k log-probs and distinct token ids, [b, d, k] each."""
    width = max(64, 2 * k)
    alpha = rng.uniform(0.03, 1.0, size=(b, d, 1))
    probs = rng.gamma(np.broadcast_to(alpha, (b, d, width)))
    probs /= probs.sum(axis=-1, keepdims=True)
    top = -np.sort(-probs, axis=-1)[..., :k]
    with np.errstate(divide="ignore"):
        lp = np.log(np.maximum(top, 1e-30)).astype(np.float32)
    lp = -np.sort(-lp, axis=-1)  # float32 rounding can't reorder, but keep the contract explicit
    ids = np.stack([rng.choice(VOCAB, size=k, replace=False) for _ in range(b * d)]).reshape(b, d, k)
    return lp.astype(np.float32), ids.astype(np.int64)


def _base(cfg: Config, rng: np.random.Generator) -> dict[str, np.ndarray]:
    lp, ids = drafter_rows(rng, cfg.batch, cfg.depth, cfg.topk)
    return {
        "top_log_probs": lp,
        "top_token_ids": ids,
        "root_token_ids": rng.integers(0, VOCAB, cfg.batch).astype(np.int64),
        "budget": np.full(cfg.batch, cfg.budget, np.int32),
        "depth_limit": np.full(cfg.batch, cfg.depth, np.int32),
    }


def _synth_random(cfg: Config, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return _base(cfg, rng)


def _synth_ties(cfg: Config, rng: np.random.Generator) -> dict[str, np.ndarray]:
    x = _base(cfg, rng)
    values = np.array([0.0, -0.5, -1.0, -2.0], np.float32)
    lp = rng.choice(values, size=x["top_log_probs"].shape, p=[0.4, 0.3, 0.2, 0.1])
    x["top_log_probs"] = -np.sort(-lp, axis=-1).astype(np.float32)
    x["top_log_probs"][0] = 0.0  # a fully saturated request: every score ties
    return x


def _synth_root_only(cfg: Config, rng: np.random.Generator) -> dict[str, np.ndarray]:
    x = _base(cfg, rng)
    x["budget"][:] = [0, 0, cfg.budget, 5][: cfg.batch]
    x["depth_limit"][:] = [cfg.depth, 0, 0, 0][: cfg.batch]
    return x


def _poison_past_limit(x: dict[str, np.ndarray]) -> None:
    lp, ids = x["top_log_probs"], x["top_token_ids"]
    for r, limit in enumerate(x["depth_limit"]):
        lp[r, limit:] = np.nan
        ids[r, limit:] = -7


def _synth_mixed(cfg: Config, rng: np.random.Generator) -> dict[str, np.ndarray]:
    x = _base(cfg, rng)
    x["budget"][:] = rng.integers(1, cfg.budget + 1, cfg.batch)
    x["depth_limit"][:] = rng.integers(1, cfg.depth + 1, cfg.batch)
    x["budget"][0], x["depth_limit"][0] = cfg.budget, cfg.depth
    x["budget"][1], x["depth_limit"][1] = cfg.budget, 2
    _poison_past_limit(x)
    return x


def _synth_zero(cfg: Config, rng: np.random.Generator) -> dict[str, np.ndarray]:
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


def _synth_invalid(cfg: Config, rng: np.random.Generator) -> dict[str, np.ndarray]:
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


_SYNTH: dict[str, Callable[[Config, np.random.Generator], dict[str, np.ndarray]]] = {
    "random": _synth_random,
    "ties": _synth_ties,
    "root_only": _synth_root_only,
    "mixed": _synth_mixed,
    "zero": _synth_zero,
    "invalid": _synth_invalid,
}


def generate(name: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Inputs, expected outputs and metadata of configuration ``name``.

    Raises:
        KeyError: unknown configuration.
    """
    cfg = CONFIGS[name]
    rng = np.random.default_rng(cfg.seed)
    inputs = _SYNTH[cfg.kind](cfg, rng)
    expected = SPEC.reference(inputs, {"max_budget": cfg.budget})
    return package(OP, name, cfg, GENERATOR_VERSION, inputs, expected, max_budget=cfg.budget)
