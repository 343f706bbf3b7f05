"""The configuration registry: named golden configurations, registered against the op specs.

A generator registers, for one op of :data:`kdtr.ops.OPS`, its configurations (name ->
config object with a ``seed``, a ``description`` and optionally ``tier``, ``"committed"``
or ``"cache"``) and ``generate(name) -> (tensors, metadata)``. The golden lifecycle
(:mod:`kdtr.goldens`), the runner and the CLI receive a :class:`Registry` as an argument;
nothing under kdtr/ imports the generators. The registry the ``kdtr`` command uses is
``kdtr.generators.REGISTRY`` (filled by kdtr/generators/__init__.py).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .ops import OPS, OpSpec

TIERS = ("committed", "cache")
Generate = Callable[[str], tuple[dict[str, np.ndarray], dict[str, Any]]]


@dataclass
class OpConfigs:
    """The configurations of one op and the function that generates a golden of each."""

    spec: OpSpec
    configs: Mapping[str, Any]
    generate: Generate

    @property
    def op(self) -> str:
        return self.spec.name


class Registry:
    """Configurations by op, in registration order."""

    def __init__(self) -> None:
        self._ops: dict[str, OpConfigs] = {}

    def register(self, op: str, configs: Mapping[str, Any], generate: Generate) -> OpConfigs:
        """Register the configurations of ``op`` (kept by reference: later edits of
        ``configs`` show, as monkeypatching tests rely on).

        Raises:
            ValueError: ``op`` is not in :data:`kdtr.ops.OPS`, is registered here already,
                or a configuration lacks an int ``seed`` or a str ``description`` or has an
                unknown ``tier``.
        """
        if op not in OPS:
            raise ValueError(f"configurations for op {op!r}: no such op in kdtr.ops.OPS (register its OpSpec first)")
        if op in self._ops:
            raise ValueError(f"configurations for op {op!r} are registered already")
        for name, cfg in configs.items():
            seed, description = getattr(cfg, "seed", None), getattr(cfg, "description", None)
            if not isinstance(seed, int) or not isinstance(description, str):
                raise ValueError(f"{op}/{name}: a configuration needs an int seed and a str description")
            if getattr(cfg, "tier", "committed") not in TIERS:
                raise ValueError(f"{op}/{name}: tier {cfg.tier!r} not in {TIERS}")
        entry = OpConfigs(OPS[op], configs, generate)
        self._ops[op] = entry
        return entry

    def unregister(self, op: str) -> None:
        self._ops.pop(op, None)

    def __contains__(self, op: object) -> bool:
        return op in self._ops

    def ops(self) -> list[str]:
        return list(self._ops)

    def entries(self) -> list[OpConfigs]:
        return list(self._ops.values())

    def entry(self, op: str) -> OpConfigs:
        """Raises: KeyError: unknown op."""
        return self._ops[op]

    def configs(self, op: str) -> Mapping[str, Any]:
        """Raises: KeyError: unknown op."""
        return self._ops[op].configs

    def all_configs(self, ops: list[str] | None = None) -> list[tuple[str, str]]:
        """Every (op, config), ops in registration order (or ``ops``' order)."""
        return [(op, cfg) for op in (ops or list(self._ops)) for cfg in self._ops[op].configs]

    def tier_of(self, op: str, config: str) -> str:
        """Raises: KeyError: unknown op or configuration."""
        return getattr(self._ops[op].configs[config], "tier", "committed")

    def generate(self, op: str, config: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The golden tensors and metadata of ``op/config``.

        Raises:
            KeyError: unknown op or configuration.
        """
        if config not in self._ops[op].configs:
            raise KeyError(f"{op}/{config}")
        return self._ops[op].generate(config)  # looked up at call time: a test may patch it

    def subset(self, *patterns: str) -> Registry:
        """A registry of the configurations that match ``op`` or ``op/config`` glob patterns
        (e.g. ``subset("tree_accept/chain", "toy")``), in this registry's order."""
        sub = Registry()
        for e in self._ops.values():
            keep = {n: c for n, c in e.configs.items()
                    if any(fnmatch.fnmatchcase(f"{e.op}/{n}", p if "/" in p else f"{p}/*") for p in patterns)}
            if keep:
                sub._ops[e.op] = OpConfigs(e.spec, keep, e.generate)
        return sub
