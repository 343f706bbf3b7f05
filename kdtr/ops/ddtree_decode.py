"""ddtree_decode: R DDTree decode steps of a tiny MLA target model with a bigram drafter
(reference; contract: docs/ops/ddtree_decode.md).

The model, the drafter and the step are :mod:`kdtr.ops.ddtree_model`'s. This module holds
the op's tensors, its reference and its spec (registered in :data:`kdtr.ops.OPS`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..bf16 import round_to, to_float32, widen
from ..contract import Contract
from . import OpSpec, TensorSpec, exact, register_op
from .ddtree_model import OUT_REL_ERROR, BigramDrafter, DecodeState, StepRecord, TinyMLA, ddtree_step, project

WEIGHTS = (("target_emb", ("V", "E")), ("target_w_q", ("E", "H", "Dqk")), ("target_w_kv", ("E", "Dqk")),
           ("target_w_o", ("H", "Dv", "E")), ("target_w_lm", ("E", "V")), ("draft_emb", ("V", "E")),
           ("draft_w_lm", ("E", "V")))


def models(inputs: Mapping[str, np.ndarray]) -> tuple[TinyMLA, BigramDrafter]:
    """The target and the drafter of a golden's inputs, checked (ValueError naming the weight)."""
    model = TinyMLA(*(np.asarray(inputs[f"target_{n}"]) for n in ("emb", "w_q", "w_kv", "w_o", "w_lm")),
                    float(to_float32(float(inputs["sm_scale"]))))
    drafter = BigramDrafter(np.asarray(inputs["draft_emb"]), np.asarray(inputs["draft_w_lm"]))
    model.check()
    drafter.check(model.dims["V"])
    return model, drafter


def run(inputs: Mapping[str, np.ndarray], n_max: int, bug: str = "") -> tuple[DecodeState, list[StepRecord]]:
    """The decode state after the R steps and each step's record (``bug``: ddtree_step's).

    Raises:
        ValueError: naming the tensor: a weight outside the model's rules, kv_cache not bf16
            [B,S,Dqk], prefix_len outside [0, S], a root token outside [0, V), budget or
            depth_limit not [B,R] or outside tree_build's ranges, draft_depth < 1,
            draft_top_k outside [1, V], or a step that needs more than S cache rows.
    """
    model, drafter = models(inputs)
    d = model.dims
    kv = np.asarray(inputs["kv_cache"])
    if kv.dtype != model.emb.dtype or kv.ndim != 3 or kv.shape[2] != d["Dqk"]:
        raise ValueError(f"kv_cache: must be bf16 [B,S,{d['Dqk']}], got {kv.dtype} {list(kv.shape)}")
    b, s_max, _ = kv.shape
    prefix = np.asarray(inputs["prefix_len"], np.int64)
    root = np.asarray(inputs["root_token_ids"], np.int64)
    budget, depth_limit = np.asarray(inputs["budget"]), np.asarray(inputs["depth_limit"])
    for name, a in (("prefix_len", prefix), ("root_token_ids", root)):
        if a.shape != (b,):
            raise ValueError(f"{name}: shape {list(a.shape)}, must be [{b}]")
    if budget.ndim != 2 or budget.shape[0] != b or depth_limit.shape != budget.shape:
        raise ValueError(f"budget and depth_limit: must be [B={b},R], got {list(budget.shape)}, "
                         f"{list(depth_limit.shape)}")
    bad = (prefix < 0) | (prefix > s_max)
    if bad.any():
        raise ValueError(f"prefix_len: request {int(np.argmax(bad))} outside [0, S={s_max}]")
    if ((root < 0) | (root >= d["V"])).any():
        raise ValueError(f"root_token_ids: request {int(np.argmax((root < 0) | (root >= d['V'])))} outside "
                         f"[0, V={d['V']})")
    depth, top_k = int(inputs["draft_depth"]), int(inputs["draft_top_k"])
    if depth < 1:
        raise ValueError(f"draft_depth: {depth} < 1")
    if not 1 <= top_k <= d["V"]:
        raise ValueError(f"draft_top_k: {top_k} outside [1, V={d['V']}]")
    if ((budget < 0) | (budget > n_max)).any() or ((depth_limit < 0) | (depth_limit > depth)).any():
        raise ValueError(f"budget / depth_limit: outside [0, N={n_max}] / [0, draft_depth={depth}]")
    cache = kv.copy()
    for r in range(b):
        cache[r, prefix[r]:] = round_to(np.nan, kv.dtype)
    st = DecodeState(cache, prefix.astype(np.int32), root.copy(), [[] for _ in range(b)], [[] for _ in range(b)])
    recs = [ddtree_step(model, drafter, st, budget[:, k], depth_limit[:, k], depth, top_k, n_max, bug=bug)
            for k in range(budget.shape[1])]
    return st, recs


def outputs(st: DecodeState, recs: list[StepRecord], n_max: int) -> dict[str, np.ndarray]:
    """The op's outputs (docs/ops/ddtree_decode.md) from :func:`run`'s result."""
    b, t = len(st.n), n_max + 1
    steps = len(recs)
    step_tokens = np.full((b, steps, t), -1, np.int64)
    for k, rec in enumerate(recs):
        for r in range(b):
            a = int(rec.accept.accepted_count[r])
            step_tokens[r, k, : a + 1] = rec.accept.proposed[r, : a + 1]
    cache = st.cache.copy()
    for r in range(b):
        cache[r, st.n[r]:] = round_to(0.0, cache.dtype)
    return {
        "node_count": np.stack([rec.tree.node_count for rec in recs], 1).astype(np.int32),
        "top_log_probs": np.stack([rec.top_log_probs for rec in recs], 1),
        "top_token_ids": np.stack([rec.top_token_ids for rec in recs], 1),
        "accepted_count": np.stack([rec.accept.accepted_count for rec in recs], 1).astype(np.int32),
        "accepted_path": np.stack([rec.accept.accepted_path for rec in recs], 1).astype(np.int32),
        "step_tokens": step_tokens,
        "attn_out": to_float32(np.stack([rec.attn_out for rec in recs], 1)),
        "final_kv_cache": cache,
        "cache_len": st.n.astype(np.int32),
    }


def attn_contract(inputs: Mapping[str, np.ndarray]) -> Contract:
    """attn_out's tolerance: verify_attn's for bf16 inputs, OUT_REL_ERROR (2^-8) max |value|
    + 1e-5, the values being the first d_v dims of c(t) over the vocabulary (every row the
    decode can write) and of the prefill rows."""
    model, _ = models(inputs)
    d = model.dims
    c = widen(project(model, np.arange(d["V"]))[1])
    kv = widen(np.asarray(inputs["kv_cache"]))
    vmax = max(float(np.abs(c[:, : d["d_v"]]).max()), float(np.nan_to_num(np.abs(kv[..., : d["d_v"]])).max()))
    return Contract("allclose", atol=float(OUT_REL_ERROR * vmax + 1e-5), rtol=0.0)


def reference(inputs: Mapping[str, np.ndarray], metadata: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The op registry's reference: :func:`run` then :func:`outputs`, N = metadata ``max_budget``."""
    n_max = int(metadata["max_budget"])
    return outputs(*run(inputs, n_max), n_max)


SPEC = register_op(OpSpec(
    name="ddtree_decode",
    kernels=("simt", "mma", "wgmma"),  # the kernel of its verify_attn stage
    description="R DDTree decode steps of a tiny MLA target with a bigram drafter (docs/ops/ddtree_decode.md)",
    inputs=tuple(TensorSpec(n, "bf16", dims) for n, dims in WEIGHTS) + (
        TensorSpec("kv_cache", "bf16", ("B", "S", "Dqk")),
        TensorSpec("prefix_len", "i32", ("B",)),
        TensorSpec("root_token_ids", "i64", ("B",)),
        TensorSpec("budget", "i32", ("B", "R")),
        TensorSpec("depth_limit", "i32", ("B", "R")),
        TensorSpec("draft_depth", "i32", ()),
        TensorSpec("draft_top_k", "i32", ()),
        TensorSpec("sm_scale", "f32", ()),
    ),
    outputs=(
        exact("node_count", "i32", ("B", "R")),
        exact("top_log_probs", "f32", ("B", "R", "D", "K")),
        exact("top_token_ids", "i64", ("B", "R", "D", "K")),
        exact("accepted_count", "i32", ("B", "R")),
        exact("accepted_path", "i32", ("B", "R", "T")),
        exact("step_tokens", "i64", ("B", "R", "T")),
        TensorSpec("attn_out", "f32", ("B", "R", "T", "H", "Dv"), Contract("allclose", atol=1e-5, rtol=0.0)),
        exact("final_kv_cache", "bf16", ("B", "S", "Dqk")),
        exact("cache_len", "i32", ("B",)),
    ),
    reference=reference,
    metadata=("max_budget",),
    abi_dims=("B", "R", "V", "E", "H", "Dqk", "Dv", "S", "N", "draft_depth", "draft_top_k"),
))
