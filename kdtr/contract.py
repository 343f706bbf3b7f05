"""Comparison contracts: how each expected output of a golden must be met.

A contract travels with the data as flat metadata keys (docs/kdtr-format.md section 5):
``contract.<name>.kind`` is ``"exact"`` or ``"allclose"``; ``allclose`` adds
``contract.<name>.atol``, ``.rtol`` (finite floats >= 0, both required), ``.max_ulp``
(int >= -1, -1 = no limit; optional, default -1) and ``.nan`` (``"equal"`` or ``"fail"``;
optional, default ``"fail"``). An ``exact`` contract carries ``.kind`` alone.

Every field is validated when a :class:`Contract` is built and when it is read from
metadata; a bad value is a ``ValueError`` that names the field (or the metadata key).
The rules for NaN, infinities and signed zeros under each kind are in docs/comparison.md.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

KINDS = ("exact", "allclose")
NAN_POLICIES = ("equal", "fail")
FIELDS = ("kind", "atol", "rtol", "max_ulp", "nan")
_DEFAULTS = {"atol": 0.0, "rtol": 0.0, "max_ulp": -1, "nan": "fail"}


def _is_bool(v: Any) -> bool:
    return isinstance(v, (bool, np.bool_))


def _check_tolerance(v: Any, where: str) -> float:
    """A finite real number >= 0 (not a bool, not a string) as a Python float."""
    if _is_bool(v) or not isinstance(v, numbers.Real):
        raise ValueError(f"{where}: expected a finite number >= 0, got {type(v).__name__} {v!r}")
    f = float(v)
    if not math.isfinite(f) or f < 0:
        raise ValueError(f"{where}: expected a finite number >= 0, got {f!r}")
    return f


def _check_max_ulp(v: Any, where: str) -> int:
    """An integer >= -1 (not a bool, not a float) as a Python int."""
    if _is_bool(v) or not isinstance(v, numbers.Integral):
        raise ValueError(f"{where}: expected an integer >= -1 (-1 = no limit), got {type(v).__name__} {v!r}")
    i = int(v)
    if not -1 <= i <= (1 << 63) - 1:  # an int64 metadata value
        raise ValueError(f"{where}: expected an integer in [-1, 2^63 - 1] (-1 = no limit), got {i}")
    return i


def _check_choice(v: Any, choices: tuple[str, ...], where: str) -> str:
    if not isinstance(v, str) or v not in choices:
        raise ValueError(f"{where}: expected one of {', '.join(map(repr, choices))}, got {v!r}")
    return v


@dataclass(frozen=True)
class Contract:
    """How one output is compared (full rules: docs/comparison.md).

    kind: "exact" (the bytes of every element equal: -0.0 != +0.0, NaN payloads count)
        or "allclose" (for float outputs only: |actual - expected| <= atol + rtol * |expected|
        decided exactly in real arithmetic; infinities match only an equal infinity).
    atol, rtol: tolerances for allclose (units of the output); finite, >= 0. Stored as float.
    max_ulp: for allclose, also require ULP distance <= max_ulp between finite values;
        -1 disables. An int >= -1.
    nan: "equal" (NaN must meet NaN at the same index) or "fail" (a NaN in expected or
        actual fails).

    An ``exact`` contract takes no tolerance: any of atol, rtol, max_ulp, nan set to a
    non-default value is an error (it would be silently ignored otherwise).

    Raises:
        ValueError: unknown kind or nan policy; atol/rtol not a finite number >= 0 (NaN,
            inf, negative, bool, string); max_ulp not an int >= -1 (float, bool, < -1);
            a tolerance given to an ``exact`` contract. The message names the field.
    """

    kind: str = "exact"
    atol: float = 0.0
    rtol: float = 0.0
    max_ulp: int = -1
    nan: str = "fail"

    def __post_init__(self) -> None:
        _check_choice(self.kind, KINDS, "contract kind")
        object.__setattr__(self, "atol", _check_tolerance(self.atol, "contract atol"))
        object.__setattr__(self, "rtol", _check_tolerance(self.rtol, "contract rtol"))
        object.__setattr__(self, "max_ulp", _check_max_ulp(self.max_ulp, "contract max_ulp"))
        _check_choice(self.nan, NAN_POLICIES, "contract nan policy")
        if self.kind == "exact":
            for f, default in _DEFAULTS.items():
                if getattr(self, f) != default:
                    raise ValueError(
                        f"contract {f}: an exact contract takes no {f} (got {getattr(self, f)!r}); "
                        "use kind 'allclose' for a tolerance"
                    )

    def to_metadata(self, name: str) -> dict[str, Any]:
        """The metadata keys of this contract for output ``name`` (``contract.<name>.*``).

        Raises:
            ValueError: ``name`` is not a non-empty string.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"contract output name must be a non-empty string, got {name!r}")
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
    def from_metadata(cls, metadata: Mapping[str, Any], name: str) -> Contract:
        """Read the contract of output ``name`` from a golden's metadata.

        ``contract.<name>.kind`` is required; ``allclose`` requires ``.atol`` and ``.rtol``
        (int or float metadata), and takes optional ``.max_ulp`` (int) and ``.nan`` (string).
        Keys ``contract.<name>.<field>`` with an unknown field, and tolerance keys beside
        an ``exact`` kind, are errors. (Keys with a further dot belong to another output
        whose name extends ``name``, e.g. ``contract.verify_attn.lse.kind``.)

        Raises:
            KeyError: the golden has no ``contract.<name>.*`` key at all.
            ValueError: the contract is malformed; the message names the metadata key.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"contract output name must be a non-empty string, got {name!r}")
        key = f"contract.{name}"
        mine = {k[len(key) + 1 :]: v for k, v in metadata.items() if k.startswith(key + ".")}
        fields = {f: v for f, v in mine.items() if "." not in f}
        if not fields:
            raise KeyError(f"{key}.kind")
        unknown = sorted(set(fields) - set(FIELDS))
        if unknown:
            raise ValueError(f"{key}.{unknown[0]}: unknown contract field (known: {', '.join(FIELDS)})")
        if "kind" not in fields:
            other = sorted(fields)[0]
            raise ValueError(f"{key}.kind: missing, although {key}.{other} is given")
        kind = _check_choice(fields["kind"], KINDS, f"{key}.kind")
        if kind == "exact":
            stray = sorted(set(fields) - {"kind"})
            if stray:
                raise ValueError(f"{key}.{stray[0]}: an exact contract takes no {stray[0]}; use kind 'allclose'")
            return cls("exact")
        for required in ("atol", "rtol"):
            if required not in fields:
                raise ValueError(f"{key}.{required}: missing (an allclose contract requires atol and rtol)")
        return cls(
            "allclose",
            _check_tolerance(fields["atol"], f"{key}.atol"),
            _check_tolerance(fields["rtol"], f"{key}.rtol"),
            _check_max_ulp(fields.get("max_ulp", -1), f"{key}.max_ulp"),
            _check_choice(fields.get("nan", "fail"), NAN_POLICIES, f"{key}.nan"),
        )

    def describe(self) -> str:
        """One-line text: ``exact`` or ``allclose(atol=..., rtol=..[, max_ulp=..], nan=..)``."""
        if self.kind == "exact":
            return "exact"
        s = f"allclose(atol={self.atol:g}, rtol={self.rtol:g}"
        if self.max_ulp >= 0:
            s += f", max_ulp={self.max_ulp}"
        return s + f", nan={self.nan})"


EXACT = Contract("exact")


def stray_contract_keys(metadata: Mapping[str, Any], outputs: Iterable[str]) -> list[str]:
    """Metadata keys ``contract.<name>.<field>`` whose ``<name>`` is none of ``outputs``
    (or that have no name or field at all): a contract for an output the golden does not
    hold is a typo that would otherwise leave the real output's contract unchecked."""
    names = set(outputs)
    stray = []
    for key in metadata:
        if not key.startswith("contract."):
            continue
        name, dot, field = key[len("contract.") :].rpartition(".")
        if not (dot and name and field) or name not in names:
            stray.append(key)
    return sorted(stray)
