"""Golden generators, one module per op (docs/harness.md, "Goldens").

Each module exposes ``OP`` (the op name, an op of :data:`kdtr.ops.OPS`),
``GENERATOR_VERSION`` (bump it when synthesis changes on purpose), ``CONFIGS`` (name ->
config with a ``seed`` and a ``description``) and ``generate(name) -> (tensors, metadata)``:
``input.<name>`` and ``expected.<name>`` tensors (the expected ones from the op's
reference) plus metadata with the comparison contract of every expected output.

:data:`REGISTRY` holds every module's configurations, registered against the op specs;
the ``kdtr`` command (kdtr/cli/main.py) passes it to :mod:`kdtr.goldens` and
:mod:`kdtr.run`, which never import this package.
"""

from __future__ import annotations

from types import ModuleType

from kdtr.registry import Registry

from . import gen_accept_refs, gen_ddtree_decode_refs, gen_greedy_step_refs, gen_tree_build_refs, gen_verify_attn_refs

GENERATORS: dict[str, ModuleType] = {
    gen_accept_refs.OP: gen_accept_refs,
    gen_tree_build_refs.OP: gen_tree_build_refs,
    gen_verify_attn_refs.OP: gen_verify_attn_refs,
    gen_greedy_step_refs.OP: gen_greedy_step_refs,
    gen_ddtree_decode_refs.OP: gen_ddtree_decode_refs,
}

REGISTRY = Registry()
for _gen in GENERATORS.values():
    REGISTRY.register(_gen.OP, _gen.CONFIGS, _gen.generate)
del _gen
