"""Golden generators, one module per op (shared/DESIGN.md section 4).

Each module exposes ``OP`` (the op name), ``GENERATOR_VERSION`` (bump it when synthesis
changes on purpose), ``CONFIGS`` (name -> config with a ``seed`` and a ``description``)
and ``generate(name) -> (tensors, metadata)``: ``input.<name>`` and ``expected.<name>``
tensors plus metadata with the comparison contract of every expected output.
"""

from __future__ import annotations

from types import ModuleType

from . import gen_accept_refs, gen_greedy_step_refs, gen_tree_build_refs, gen_verify_attn_refs

GENERATORS: dict[str, ModuleType] = {
    gen_accept_refs.OP: gen_accept_refs,
    gen_tree_build_refs.OP: gen_tree_build_refs,
    gen_verify_attn_refs.OP: gen_verify_attn_refs,
    gen_greedy_step_refs.OP: gen_greedy_step_refs,
}
