"""Comparison contracts: how each expected output of a golden must be met.

A contract travels with the data as flat metadata keys (docs/kdtr-format.md section 5):
``contract.<name>.kind`` is ``"exact"`` or ``"allclose"``; ``allclose`` adds
``contract.<name>.atol``, ``.rtol`` (floats), ``.max_ulp`` (int, -1 = no limit) and
``.nan`` (``"equal"`` or ``"fail"``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

KINDS = ("exact", "allclose")
NAN_POLICIES = ("equal", "fail")


@dataclass(frozen=True)
class Contract:
    """How one output is compared.

    kind: "exact" (bytes equal: -0.0 != +0.0) or "allclose"
        (|actual - expected| <= atol + rtol * |expected| element-wise).
    atol, rtol: tolerances for allclose (units of the output).
    max_ulp: for allclose on floats, also require ULP distance <= max_ulp; -1 disables.
    nan: "equal" (NaN must meet NaN at the same index) or "fail" (any NaN fails).
    """

    kind: str = "exact"
    atol: float = 0.0
    rtol: float = 0.0
    max_ulp: int = -1
    nan: str = "fail"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"contract kind {self.kind!r} not in {KINDS}")
        if self.nan not in NAN_POLICIES:
            raise ValueError(f"contract nan policy {self.nan!r} not in {NAN_POLICIES}")
        if self.atol < 0 or self.rtol < 0:
            raise ValueError("contract tolerances must be >= 0")

    def to_metadata(self, name: str) -> dict[str, Any]:
        key = f"contract.{name}"
        if self.kind == "exact":
            return {f"{key}.kind": "exact"}
        return {
            f"{key}.kind": "allclose",
            f"{key}.atol": float(self.atol),
            f"{key}.rtol": float(self.rtol),
            f"{key}.max_ulp": int(self.max_ulp),
            f"{key}.nan": self.nan,
        }

    @classmethod
    def from_metadata(cls, metadata: dict[str, Any], name: str) -> Contract:
        """Read the contract of output ``name``.

        Raises:
            KeyError: the golden has no contract for this output.
            ValueError: the contract is malformed.
        """
        key = f"contract.{name}"
        kind = metadata[f"{key}.kind"]
        if kind == "exact":
            return cls("exact")
        return cls(
            kind,
            float(metadata.get(f"{key}.atol", 0.0)),
            float(metadata.get(f"{key}.rtol", 0.0)),
            int(metadata.get(f"{key}.max_ulp", -1)),
            str(metadata.get(f"{key}.nan", "fail")),
        )

    def describe(self) -> str:
        if self.kind == "exact":
            return "exact"
        s = f"allclose(atol={self.atol:g}, rtol={self.rtol:g}"
        if self.max_ulp >= 0:
            s += f", max_ulp={self.max_ulp}"
        return s + f", nan={self.nan})"


EXACT = Contract("exact")
