"""greedy_step: tree_build -> verify_attn -> tree_accept chained on one device (reference).

Contract: docs/ops/greedy_step.md. The reference chains the three
numpy references exactly as a device would: the tree that tree_build returns feeds
verify_attn (its visibility, tree_len = node_count + 1) and tree_accept (node_token_ids,
next_token, next_sibling, node_count); ``target_predict`` is an input (the generator
synthesizes it on the reference tree). Outputs of the three ops are named
``<op>.<output>`` (``tree_build.status`` and ``tree_accept.status`` would collide).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from . import OpSpec, TensorSpec, register_op
from . import tree_accept as accept_op
from . import tree_build as build_op
from . import verify_attn as attn_op

ATTN_INPUTS = ("q", "kv_cache", "prefix_len", "sm_scale", "d_v")  # tree_len and visibility come from the tree


def greedy_step(inputs: Mapping[str, np.ndarray], n_max: int) -> dict[str, np.ndarray]:
    """Every output of the three ops, named ``<op>.<output>``.

    Args:
        inputs: tree_build's inputs, verify_attn's q, kv_cache, prefix_len, sm_scale, d_v,
            and tree_accept's target_predict [B, n_max + 1].
        n_max: N, the maximum budget (T = N + 1 slots).

    Raises:
        ValueError: as the three references (shapes, dtypes, size limits).
    """
    tree = build_op.tree_build(**{k: inputs[k] for k in build_op.SPEC.input_names}, n_max=n_max, on_invalid="status")
    tree_len = (tree.node_count + 1).astype(np.int32)
    attn = attn_op.verify_attn(inputs["q"], inputs["kv_cache"], inputs["prefix_len"], tree_len, tree.visibility,
                               inputs["sm_scale"], inputs["d_v"])
    acc = accept_op.tree_accept(tree.node_token_ids, tree.next_token, tree.next_sibling, tree.node_count,
                                inputs["target_predict"])
    out = {f"tree_build.{k}": v for k, v in tree.as_dict().items()}
    out.update({f"verify_attn.{k}": v for k, v in attn.as_dict().items()})
    out.update({f"tree_accept.{k}": v for k, v in acc.as_dict().items()})
    return out


def reference(inputs: Mapping[str, np.ndarray], metadata: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The op registry's reference: :func:`greedy_step` with ``n_max`` = metadata ``max_budget``."""
    return greedy_step(inputs, int(metadata["max_budget"]))


def _prefixed(op: OpSpec) -> tuple[TensorSpec, ...]:
    return tuple(TensorSpec(f"{op.name}.{s.name}", s.dtype, s.dims, s.contract) for s in op.outputs)


_ATTN_IN = {s.name: s for s in attn_op.SPEC.inputs}

SPEC = register_op(OpSpec(
    name="greedy_step",
    kernels=("simt", "mma", "wgmma"),  # the kernel of its verify_attn stage
    abi_dims=("B", "D", "K", "N", "H", "S", "Dqk", "d_v"),
    abi_buffers=(TensorSpec("tree_len", "i32", ("B",)),),  # workspace: node_count + 1
    description="tree_build -> verify_attn -> tree_accept on one device (docs/ops/greedy_step.md)",
    inputs=build_op.SPEC.inputs + tuple(_ATTN_IN[n] for n in ATTN_INPUTS)
    + (TensorSpec("target_predict", "i64", ("B", "T")),),
    outputs=_prefixed(build_op.SPEC) + _prefixed(attn_op.SPEC) + _prefixed(accept_op.SPEC),
    reference=reference,
    metadata=("max_budget",),
))
