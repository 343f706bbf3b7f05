"""Packing a configuration's arrays into golden tensors and metadata (shared by every generator)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from kdtr.contract import Contract
from kdtr.ops import OPS


def package(
    op: str,
    name: str,
    cfg: Any,
    generator_version: int,
    inputs: Mapping[str, np.ndarray],
    expected: Mapping[str, np.ndarray],
    contracts: Mapping[str, Contract] | None = None,
    **extra: Any,
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Golden tensors (``input.<name>``, ``expected.<name>``) and metadata.

    Metadata: op, config, seed, generator_version, description (from ``cfg``), the
    ``extra`` keys, and one contract per expected output (``contracts[name]``, default
    the op spec's contract of that output, :data:`kdtr.ops.OPS`).

    Raises:
        ValueError: the tensors do not meet the op's spec (names, dtypes, named dims).
    """
    spec = OPS[op]
    defaults = spec.default_contracts()
    tensors = {f"input.{k}": v for k, v in inputs.items()}
    tensors.update({f"expected.{k}": v for k, v in expected.items()})
    metadata: dict[str, Any] = {
        "op": op,
        "config": name,
        "seed": cfg.seed,
        "generator_version": generator_version,
        "description": cfg.description,
        **extra,
    }
    spec.check(tensors)
    for out in expected:
        metadata.update((contracts or {}).get(out, defaults[out]).to_metadata(out))
    return tensors, metadata
