"""Goldens for ddtree_decode (docs/ops/ddtree_decode.md): the weights of a tiny MLA target
and its bigram drafter from a seed (:mod:`kdtr.generators.ddtree_synth`), prompts, the
prefill cache, per-step budgets and depth limits; the expected outputs from
:mod:`kdtr.ops.ddtree_decode`'s reference.

Each golden is checked before it is written: plain greedy decoding of every prompt alone
(:func:`kdtr.ops.ddtree_model.greedy_decode`) must emit exactly the tokens the DDTree
decode emits, and every deciding top-1 margin (greedy's and the DDTree loop's) must be at
least ``MARGIN_FACTOR`` times :func:`kdtr.ops.ddtree_model.logit_error_bound`; otherwise
generation fails (ValueError naming the config). The smallest margin, the bound and the
accepted tokens per step go to the metadata.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kdtr.ops import ddtree_decode as op
from kdtr.ops import ddtree_model as dm

from .ddtree_synth import ModelDims, synth_models
from .golden import package

OP = "ddtree_decode"
GENERATOR_VERSION = 1


@dataclass(frozen=True)
class Config:
    description: str
    seed: int
    mode: str  # ddtree_synth.DRAFT_MODES
    prompt_lens: tuple[int, ...]
    steps: int = 6
    budget: int = 8  # N
    depth: int = 4  # D
    top_k: int = 3  # K
    dims: ModelDims = field(default_factory=ModelDims)
    budgets: tuple[int, ...] = ()  # per step (cycled over the requests' steps); empty: N
    depth_limits: tuple[int, ...] = ()  # per step; empty: D
    last_prompt_token: int = -1  # >= 0: every prompt ends with this token (the first root)
    o_scale: float = 0.25  # ddtree_synth.synth_models's
    o_density: float = 1.0
    tier: str = "committed"


CONFIGS: dict[str, Config] = {
    "chain": Config("drafter = the target's residual path: deep acceptance (3-4 tokens per step), N=8, D=4, K=3, "
                    "prompts of 5, 12 and 1 tokens (the last: an empty prefill, prefix_len 0)", 2, "chain",
                    (5, 12, 1)),
    "decoy": Config("the drafter's top-1 is a decoy and the target's token its second choice: acceptance through "
                    "the next-sibling walk; budgets 8, 3, 0 (a root-only tree: the bonus token alone), 8 and depth "
                    "limits 4, 2, 4, 1 by step", 2, "decoy", (5, 12, 1),
                    budgets=(8, 3, 0, 8), depth_limits=(4, 2, 4, 1)),
    "reject": Config("a drafter unrelated to the target: rejection at depth 0 (the bonus token only) in almost "
                     "every step; every prompt ends with token 0, the first root", 3, "random", (5, 12, 2),
                     last_prompt_token=0),
    "ties": Config("the drafter's w_lm columns duplicated in pairs: exact ties in every top-K row (ordered by "
                   "id), inside tree_build's best-first order", 3, "ties", (5, 12, 1)),
    "batch": Config("eight requests with prompts of 1 to 30 tokens (prefix_len 0 to 29), chain drafts, 5 steps",
                    2, "chain", (1, 2, 7, 30, 16, 3, 11, 24), steps=5),
    "k2_dims": Config("Kimi K2 attention dims (H=64, Dqk=576, d_v=512; V=512, E=32), prompts of 1024, 300 and 1 "
                      "tokens, chain drafts, 4 steps; w_o sparse (2e-5 of its entries, each up to 1) so that the "
                      "logit error bound, a sum over H d_v = 32768 rows, stays 20x below the margins (second tier)",
                      2, "chain", (1024, 300, 1), steps=4, dims=ModelDims(512, 32, 64, 576, 512), o_scale=1.0,
                      o_density=2e-5, tier="cache"),
}


def synth(cfg: Config) -> tuple[dict[str, np.ndarray], list[list[int]], int]:
    """(the golden's inputs, the prompts, the cache capacity S) of ``cfg``."""
    model, drafter, rng = synth_models(cfg.seed, cfg.dims, cfg.mode, o_scale=cfg.o_scale, o_density=cfg.o_density)
    v = cfg.dims.V
    prompts = [[int(t) for t in rng.integers(0, v, size=n)] for n in cfg.prompt_lens]
    if cfg.last_prompt_token >= 0:
        prompts = [p[:-1] + [cfg.last_prompt_token] for p in prompts]
    t = cfg.budget + 1
    cap = max(cfg.prompt_lens) - 1 + cfg.steps * t + t
    st = dm.DecodeState.from_prompts(model, prompts, cap)
    b = len(prompts)

    def per_step(values: tuple[int, ...], default: int) -> np.ndarray:
        row = [values[k % len(values)] if values else default for k in range(cfg.steps)]
        return np.tile(np.array(row, np.int32), (b, 1))

    inputs = {
        "target_emb": model.emb, "target_w_q": model.w_q, "target_w_kv": model.w_kv, "target_w_o": model.w_o,
        "target_w_lm": model.w_lm, "draft_emb": drafter.emb, "draft_w_lm": drafter.w_lm,
        "kv_cache": st.cache, "prefix_len": st.n.astype(np.int32), "root_token_ids": st.root.astype(np.int64),
        "budget": per_step(cfg.budgets, cfg.budget), "depth_limit": per_step(cfg.depth_limits, cfg.depth),
        "draft_depth": np.array(cfg.depth, np.int32), "draft_top_k": np.array(cfg.top_k, np.int32),
        "sm_scale": np.array(model.sm_scale, np.float32),
    }
    return inputs, prompts, cap


def check_decode(name: str, inputs: dict[str, np.ndarray], prompts: list[list[int]], cap: int,
                 n_max: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The expected outputs and the metadata of a decode that meets the module's rules.

    Raises:
        ValueError: naming the config, where greedy decoding emits other tokens or a
            deciding margin is below MARGIN_FACTOR times the error bound.
    """
    st, recs = op.run(inputs, n_max)
    model, _ = op.models(inputs)
    greedy = dm.greedy_decode(model, prompts, [len(e) for e in st.emitted], cap)
    if greedy.emitted != st.emitted:
        raise ValueError(f"ddtree_decode/{name}: greedy decoding emits other tokens than the DDTree decode")
    bound = dm.logit_error_bound(model)
    margin = min(min(m) for m in st.margins + greedy.margins)
    if margin < dm.MARGIN_FACTOR * bound:
        raise ValueError(f"ddtree_decode/{name}: smallest deciding margin {margin:.6g} is below "
                         f"{dm.MARGIN_FACTOR:g} x the logit error bound {bound:.6g}: pick another seed")
    meta = {
        "max_budget": n_max,
        "min_margin": round(float(margin), 6),
        "logit_error_bound": round(float(bound), 6),
        "margin_factor": dm.MARGIN_FACTOR,
        "accepted_per_step": round(float(np.mean([r.accept.accepted_count for r in recs])), 4),
    }
    return op.outputs(st, recs, n_max), meta


def generate(name: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The golden of config ``name`` (tensors, metadata)."""
    cfg = CONFIGS[name]
    inputs, prompts, cap = synth(cfg)
    expected, meta = check_decode(name, inputs, prompts, cap, cfg.budget)
    contracts = {"attn_out": op.attn_contract(inputs)}
    return package(OP, name, cfg, GENERATOR_VERSION, inputs, expected, contracts, **meta)
