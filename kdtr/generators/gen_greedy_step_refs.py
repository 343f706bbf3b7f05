"""Goldens for greedy_step: tree_build -> verify_attn -> tree_accept (docs/ops/greedy_step.md).

The reference is :mod:`kdtr.ops.greedy_step` (the three numpy references chained as a
device would). This generator synthesizes its inputs: drafter rows as for tree_build,
attention inputs over the reference tree (one latent KV row per tree slot, poisoned past
each request's range), and target_predict on that reference tree as for tree_accept (first
child mostly, sometimes another child, sometimes no child; leaves never match), -1 past
node_count; ``invalid_rows`` also puts negative tokens where tree_accept must answer
NEGATIVE_TOKEN (docs/ops/greedy_step.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from kdtr.bf16 import round_to
from kdtr.dtypes import bfloat16  # ml_dtypes, imported on first use
from kdtr.ops import tree_build as build_op
from kdtr.ops.greedy_step import SPEC

from . import gen_tree_build_refs as build_gen
from . import gen_verify_attn_refs as attn_gen
from .golden import package
from .rng import Rng
from .trees import Tree, synth_target_predict

OP = "greedy_step"
GENERATOR_VERSION = 2  # 2: host-independent synthesis (kdtr.generators.rng, kdtr.bf16, kdtr.detmath)
VOCAB = build_gen.VOCAB


@dataclass(frozen=True)
class Config:
    description: str
    seed: int
    batch: int
    depth: int
    topk: int
    budget: int  # N
    heads: int
    dqk: int
    d_v: int
    prefix: tuple[int, ...]
    dtype: str = "f32"
    sm_scale: float = 0.0
    kind: str = "random"  # random | ties | underfull | invalid
    tier: str = "committed"
    budgets: tuple[int, ...] = ()  # per request (cycled); empty: N for every request
    finite_padding: bool = False  # q finite in rows past node_count (the cache rows past the tree stay NaN)


CONFIGS: dict[str, Config] = {
    "default": Config("B=4, D=6, K=4, N=32; H=4, Dqk=72, d_v=64", 4001, 4, 6, 4, 32, 4, 72, 64, (40, 7)),
    "k2_dims": Config("Kimi K2 attention dims (H=64, Dqk=576, d_v=512, bf16), D=4, K=4, N=8", 4002, 2, 4, 4, 8,
                      64, 576, 512, (64, 100), dtype="bf16", sm_scale=attn_gen.K2_SCALE),
    "large_batch": Config("B=32, D=8, K=8, N=64; small attention dims", 4003, 32, 8, 8, 64, 2, 40, 32, (12, 50, 0)),
    "underfull": Config("D=2, K=3 trees hold 12 of a budget of 32", 4004, 4, 2, 3, 32, 4, 72, 64, (20,),
                        kind="underfull"),
    "ties": Config("log-probs from {0, -0.5, -1, -2}: tied scores", 4005, 4, 5, 4, 32, 4, 72, 64, (16,), kind="ties"),
    "invalid_rows": Config("tree_build statuses (NaN, bad budget, negative id) flow into a root-only verify and "
                           "accept; negative tokens reach tree_accept (NEGATIVE_TOKEN)", 4006, 6,
                           5, 4, 16, 4, 72, 64, (8,), kind="invalid"),
    "finite_padding": Config("underfull trees (D=2, K=3 hold 12 of N=16; budgets 16, 5, 16, 9) whose padding q rows "
                             "(past node_count) are finite: verify_attn must answer them out 0, lse -inf, not size "
                             "the tree from the budget", 4007, 4, 2, 3, 16, 2, 16, 8, (6, 0, 3, 1),
                             kind="underfull", budgets=(16, 5, 16, 9), finite_padding=True),
    "tail_tile_bf16": Config("verify_attn stage on its tile paths through the chain: bf16, H=2, Dqk=72, d_v=64 "
                             "(mma_bf16_dqk128_dv128 by auto on cuda; wgmma and simt forced), D=4, K=4, N=16 full "
                             "trees, prefixes 120, 141, 250: L = 137, 158 (3 key tiles, the last partial, loaded "
                             "inside the tile loop) and 267 (5 tiles: both KV buffers refilled); the last request "
                             "ends at S", 4008, 3, 4, 4, 16, 2, 72, 64, (120, 141, 250), dtype="bf16"),
}


def _build_inputs(cfg: Config, rng: Rng | np.random.Generator) -> dict[str, np.ndarray]:
    lp, ids = build_gen.drafter_rows(rng, cfg.batch, cfg.depth, cfg.topk)
    x = {
        "top_log_probs": lp,
        "top_token_ids": ids,
        "root_token_ids": rng.integers(0, VOCAB, cfg.batch).astype(np.int64),
        "budget": np.full(cfg.batch, cfg.budget, np.int32),
        "depth_limit": np.full(cfg.batch, cfg.depth, np.int32),
    }
    if cfg.budgets:
        x["budget"][:] = [cfg.budgets[r % len(cfg.budgets)] for r in range(cfg.batch)]
    if cfg.kind == "ties":
        vals = rng.choice(np.array([0.0, -0.5, -1.0, -2.0], np.float32), size=lp.shape, p=[0.4, 0.3, 0.2, 0.1])
        x["top_log_probs"] = -np.sort(-vals, axis=-1, kind="stable").astype(np.float32)  # f32 already: exact
    if cfg.kind == "invalid":
        x["top_log_probs"][1, 0, 1] = np.nan  # tree_build NON_FINITE: root-only tree
        x["budget"][2] = cfg.budget + 5  # tree_build BAD_BUDGET: root-only tree
        x["top_token_ids"][3, 1, 2] = -4  # tree_build NEGATIVE_ID: root-only tree, tree_accept OK
        x["root_token_ids"][4] = -3  # not a tree_build defect; slot 0 is live: tree_accept NEGATIVE_TOKEN
        # row 5: target_predict -1 at the tree's last live slot (set in generate): NEGATIVE_TOKEN
    return x


def generate(name: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Inputs, expected outputs of all three ops, and metadata of configuration ``name``.

    Raises:
        KeyError: unknown configuration.
    """
    cfg = CONFIGS[name]
    rng = Rng(cfg.seed)
    b, t = cfg.batch, cfg.budget + 1
    bx = _build_inputs(cfg, rng)
    tree = build_op.SPEC.reference(bx, {"max_budget": cfg.budget})  # the tree the attention inputs fit
    tree_len = (tree["node_count"] + 1).astype(np.int32)

    # attention inputs over the reference tree: prefix + one latent KV row per tree slot
    prefix = np.array([cfg.prefix[r % len(cfg.prefix)] for r in range(b)], np.int32)
    s = int((prefix + t).max())
    dt = np.float32 if cfg.dtype == "f32" else bfloat16()
    q = round_to(rng.standard_normal((b, t, cfg.heads, cfg.dqk)), dt)  # kdtr's rounding (kdtr/bf16.py)
    kv = round_to(rng.standard_normal((b, s, cfg.dqk)), dt)
    attn_gen.poison(None if cfg.finite_padding else q, kv, None, prefix, tree_len)  # visibility: from tree_build
    sm_scale = round_to(cfg.sm_scale or 1.0 / math.sqrt(cfg.dqk), np.float32)  # sqrt: correctly rounded, unlike pow
    d_v = np.array(cfg.d_v, np.int32)

    # target predictions on the reference tree (as for tree_accept's goldens)
    target = np.full((b, t), -1, np.int64)
    for r in range(b):
        tr = Tree(int(tree["node_count"][r]), tree["parents"][r], tree["node_depths"][r], tree["node_token_ids"][r],
                  tree["next_token"][r], tree["next_sibling"][r])
        target[r] = synth_target_predict(rng, tr, VOCAB)
    if cfg.kind == "invalid":
        target[0, 0] = tree["node_token_ids"][0, tree["next_token"][0, 0]]  # the valid row 0 accepts >= 1 node
        target[5, tree["node_count"][5]] = -1  # a negative target token in a live slot: NEGATIVE_TOKEN

    inputs = dict(bx, q=q, kv_cache=kv, prefix_len=prefix, sm_scale=sm_scale, d_v=d_v, target_predict=target)
    expected = SPEC.reference(inputs, {"max_budget": cfg.budget})
    attn_x = {"q": q, "kv_cache": kv, "prefix_len": prefix, "tree_len": tree_len, "sm_scale": sm_scale, "d_v": d_v}
    contracts = {f"verify_attn.{k}": c for k, c in attn_gen.tolerances(attn_x).items()}
    return package(OP, name, cfg, GENERATOR_VERSION, inputs, expected, contracts, max_budget=cfg.budget,
                   dtype=cfg.dtype)
