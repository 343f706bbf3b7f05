"""The op registry: the numpy reference implementations of the DDTree ops and their specs.

Each op module declares one :class:`OpSpec` and registers it in :data:`OPS` when it is
imported (importing this package imports all four): the op's name, its inputs and outputs
(name, KDTR dtype, shape in named dims such as B, T, H), the default comparison contract
of each output, and ``reference(inputs, metadata) -> outputs``. The semantics are in
docs/ops/<op>.md; adding an op: docs/adding-an-op.md.

Configurations are not here: generators register them against these specs in a
:class:`kdtr.registry.Registry`, which the golden, runner and CLI code receive as an
argument (kdtr never imports the generators).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..contract import EXACT, Contract
from ..dtypes import DTYPE_BY_NAME, name_of_dtype

Reference = Callable[[Mapping[str, np.ndarray], Mapping[str, Any]], dict[str, np.ndarray]]


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of an op.

    name: the tensor's name (``input.<name>`` / ``expected.<name>`` in a golden, ``<name>``
        in a binary's output file).
    dtype: a KDTR dtype name (``"i32"``), or several joined by ``|`` (``"f32|bf16"``).
    dims: the shape as named dims (``("B", "T", "T")``); ``()`` for a scalar. A dim name
        stands for one size throughout a golden (every ``B`` is the same B).
    contract: outputs only: the default comparison contract (a generator may give a
        golden its own, e.g. tolerances computed from the data).
    """

    name: str
    dtype: str
    dims: tuple[str, ...]
    contract: Contract | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"tensor spec name must be a non-empty string, got {self.name!r}")
        for d in self.dtypes:
            if d not in DTYPE_BY_NAME:
                raise ValueError(f"{self.name}: dtype {d!r} is not a KDTR dtype ({', '.join(DTYPE_BY_NAME)})")
        object.__setattr__(self, "dims", tuple(self.dims))

    @property
    def dtypes(self) -> tuple[str, ...]:
        return tuple(self.dtype.split("|"))


@dataclass(frozen=True)
class OpSpec:
    """An op: its name, inputs, outputs (each with a default contract) and reference.

    ``reference(inputs, metadata)`` takes the input tensors by name (as in a golden, without
    the ``input.`` prefix) and the golden's metadata (only the keys listed in ``metadata``
    are read, e.g. ``max_budget``) and returns every output by name, with the dtypes and
    shapes of ``outputs``: the expected outputs a golden stores.
    """

    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    reference: Reference
    metadata: tuple[str, ...] = ()
    description: str = ""
    # The kernels a cuda binary of the op can be forced to run (``--kernel NAME``; ``kdtr run
    # --kernel op=NAME``); () for an op with no kernel choice. An output's metadata
    # ``kernel`` names the one that ran: the name, or an instance of it (``mma_bf16_...``).
    kernels: tuple[str, ...] = ()
    # The C ABI (docs/binaries.md, "The op signature"; cuda_tests/include/kdtr_abi.h): the
    # dims of the op's parameter struct, as int64, in this order (a dim of a tensor, a
    # scalar input such as d_v, or N = metadata max_budget), and its buffers: pointers that
    # are neither inputs nor outputs (a caller's workspace, an optional extra output).
    abi_dims: tuple[str, ...] = ()
    abi_buffers: tuple[TensorSpec, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "outputs", tuple(self.outputs))
        object.__setattr__(self, "kernels", tuple(self.kernels))
        object.__setattr__(self, "abi_dims", tuple(self.abi_dims))
        object.__setattr__(self, "abi_buffers", tuple(self.abi_buffers))
        for kind, specs in (("input", self.inputs), ("output", self.outputs)):
            names = [s.name for s in specs]
            if len(set(names)) != len(names):
                raise ValueError(f"op {self.name}: duplicate {kind} names in {names}")
        for s in self.outputs:
            if not isinstance(s.contract, Contract):
                raise ValueError(f"op {self.name}: output {s.name} has no default contract")

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.inputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.outputs)

    def default_contracts(self) -> dict[str, Contract]:
        return {s.name: s.contract for s in self.outputs}  # type: ignore[misc]

    def check(self, tensors: Mapping[str, np.ndarray]) -> dict[str, int]:
        """Hold a golden's tensors (``input.<name>``, ``expected.<name>``) against this spec.

        Returns:
            The size of every named dim.

        Raises:
            ValueError: a tensor missing or not in the spec, a dtype not allowed, a shape
                with another rank or a dim whose size differs from an earlier one; the
                message names the tensor.
        """
        want = [("input." + s.name, s) for s in self.inputs] + [("expected." + s.name, s) for s in self.outputs]
        names = {n for n, _ in want}
        extra = sorted(set(tensors) - names)
        if extra:
            raise ValueError(f"op {self.name}: tensor {extra[0]!r} is not in the op's spec")
        sizes: dict[str, int] = {}
        where: dict[str, str] = {}
        for full, spec in want:
            if full not in tensors:
                raise ValueError(f"op {self.name}: tensor {full!r} missing")
            arr = tensors[full]
            dt = name_of_dtype(np.dtype(arr.dtype))
            if dt not in spec.dtypes:
                raise ValueError(f"op {self.name}: {full}: dtype {dt}, spec says {spec.dtype}")
            if len(arr.shape) != len(spec.dims):
                raise ValueError(f"op {self.name}: {full}: shape {list(arr.shape)}, spec says [{','.join(spec.dims)}]")
            for dim, size in zip(spec.dims, arr.shape):
                if sizes.setdefault(dim, int(size)) != size:
                    raise ValueError(f"op {self.name}: {full}: dim {dim} = {size}, but {sizes[dim]} in {where[dim]}")
                where.setdefault(dim, full)
        return sizes


OPS: dict[str, OpSpec] = {}
"""Every registered op by name: the four DDTree ops (filled on import of this package)."""


def register_op(spec: OpSpec) -> OpSpec:
    """Add ``spec`` to :data:`OPS`.

    Raises:
        ValueError: an op of that name is registered already.
    """
    if spec.name in OPS:
        raise ValueError(f"op {spec.name!r} is registered already")
    OPS[spec.name] = spec
    return spec


def unregister_op(name: str) -> None:
    """Remove op ``name`` from :data:`OPS` (tests that add an op clean up with it)."""
    OPS.pop(name, None)


def exact(name: str, dtype: str, dims: tuple[str, ...]) -> TensorSpec:
    """An output compared byte for byte (the default for every integer output)."""
    return TensorSpec(name, dtype, dims, EXACT)


# The op modules register themselves; greedy_step and ddtree_decode last (they compose the other three).
from . import tree_build, verify_attn, tree_accept, greedy_step, ddtree_decode  # noqa: E402,F401  isort: skip
