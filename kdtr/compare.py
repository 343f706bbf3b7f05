"""The comparison engine: an expected tensor against an obtained one, under a contract.

``exact`` compares raw bytes element by element (so -0.0 != +0.0 and a NaN payload
counts); ``allclose`` widens both to float64 and requires
``|actual - expected| <= atol + rtol * |expected|`` (equal values, infinities included,
always match), optionally a ULP bound, and a NaN policy. Dtype and shape must match in both modes: a silent dtype change is a mismatch.

The result holds what a kernel engineer needs without a debugger: how many elements
differ and their share, the worst absolute / relative / ULP error with its index, and
the first differing elements with expected and actual values; for tree ops the first
two index components are the request (batch row) and the slot.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .contract import Contract
from .dtypes import name_of_dtype

MAX_SHOWN = 10
INDEX_LABELS = ("request", "slot")


@dataclass
class Element:
    """One mismatching element: its index, expected and actual values (as text)."""

    index: list[int]
    expected: str
    actual: str

    def where(self) -> str:
        parts = [f"{INDEX_LABELS[k] if k < len(INDEX_LABELS) else f'dim{k}'} {i}" for k, i in enumerate(self.index)]
        return ", ".join(parts) if parts else "scalar"


@dataclass
class TensorResult:
    """Outcome of comparing one output tensor."""

    name: str
    contract: str
    ok: bool
    problem: str = ""  # missing tensor, dtype or shape change
    n_mismatch: int = 0
    n_total: int = 0
    max_abs: float | None = None
    max_abs_index: list[int] | None = None
    max_rel: float | None = None
    max_rel_index: list[int] | None = None
    max_ulp: int | None = None
    max_ulp_index: list[int] | None = None
    first: list[Element] = field(default_factory=list)

    @property
    def percent(self) -> float:
        return 100.0 * self.n_mismatch / self.n_total if self.n_total else 0.0

    def summary(self) -> str:
        if self.ok:
            return f"{self.name}: ok ({self.contract})"
        if self.problem:
            return f"{self.name}: {self.problem}"
        s = f"{self.name}: {self.n_mismatch}/{self.n_total} ({self.percent:.3g}%) differ [{self.contract}]"
        if self.max_abs is not None:
            s += f"; max abs {self.max_abs:.6g} at {self.max_abs_index}"
        if self.max_rel is not None:
            s += f"; max rel {self.max_rel:.6g} at {self.max_rel_index}"
        if self.max_ulp is not None:
            s += f"; max ulp {self.max_ulp} at {self.max_ulp_index}"
        return s

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["percent"] = self.percent
        return d


def _fmt(x: Any) -> str:
    if isinstance(x, (float, np.floating)):
        return repr(float(x))
    if isinstance(x, (np.bool_, bool)):
        return str(bool(x))
    if isinstance(x, np.integer):
        return str(int(x))
    return str(x)


def _as_float64(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float64)


def _ordered_bits(a: np.ndarray) -> np.ndarray | None:
    """Float bits mapped to int64 whose difference is the ULP distance (None if not float)."""
    if a.dtype.kind != "f" and name_of_dtype(a.dtype) != "bf16":
        return None
    width = a.dtype.itemsize * 8
    ints = a.view({16: np.int16, 32: np.int32, 64: np.int64}[width]).astype(np.int64)
    magnitude = ints & np.int64((1 << (width - 1)) - 1)
    return np.where(ints < 0, -magnitude, magnitude)


def ulp_distance(expected: np.ndarray, actual: np.ndarray) -> np.ndarray | None:
    """Element-wise ULP distance (uint64) of two float arrays of one dtype; None for non-floats.

    +0.0 and -0.0 are 0 ULP apart; NaNs give meaningless distances (callers mask them).
    """
    e, a = _ordered_bits(expected), _ordered_bits(actual)
    if e is None or a is None:
        return None
    eu, au = e.view(np.uint64), a.view(np.uint64)
    return np.where(a >= e, au - eu, eu - au)


def _unravel(flat: int, shape: tuple[int, ...]) -> list[int]:
    return [int(i) for i in np.unravel_index(flat, shape)] if shape else []


def compare(name: str, expected: np.ndarray, actual: np.ndarray | None, contract: Contract) -> TensorResult:
    """Compare one obtained output with its expected value under ``contract``.

    Args:
        name: output name (for the record).
        expected: the golden's ``expected.<name>`` array.
        actual: the binary's ``<name>`` array, or None if the output file lacks it.
        contract: exact or allclose (see :mod:`kdtr.contract`).

    Returns:
        A :class:`TensorResult`; ``ok`` is True when the contract holds.
    """
    res = TensorResult(name, contract.describe(), ok=False, n_total=int(expected.size))
    if actual is None:
        res.problem = "missing from the output file"
        return res
    if actual.dtype != expected.dtype:
        res.problem = f"dtype {name_of_dtype(actual.dtype)} != expected {name_of_dtype(expected.dtype)}"
        return res
    if actual.shape != expected.shape:
        res.problem = f"shape {list(actual.shape)} != expected {list(expected.shape)}"
        return res
    exp = np.ascontiguousarray(expected)
    act = np.ascontiguousarray(actual)

    if contract.kind == "exact":
        width = exp.dtype.itemsize
        raw = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[width]
        bad = exp.view(raw) != act.view(raw)
    else:
        e64, a64 = _as_float64(exp), _as_float64(act)
        e_nan, a_nan = np.isnan(e64), np.isnan(a64)
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.abs(a64 - e64)
            bad = ~(diff <= contract.atol + contract.rtol * np.abs(e64)) & ~(a64 == e64)  # equal infinities match
        if contract.nan == "equal":
            bad = np.where(e_nan | a_nan, e_nan != a_nan, bad)
        else:
            bad |= e_nan | a_nan
        ulp = ulp_distance(exp, act)
        if contract.max_ulp >= 0 and ulp is not None:
            bad |= (ulp > np.uint64(contract.max_ulp)) & ~(e_nan | a_nan)

    bad = np.asarray(bad).reshape(exp.shape)
    res.n_mismatch = int(bad.sum())
    res.ok = res.n_mismatch == 0

    if exp.dtype.kind in "fiub" or name_of_dtype(exp.dtype) == "bf16":
        e64 = _as_float64(exp).reshape(-1)
        a64 = _as_float64(act).reshape(-1)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            absd = np.abs(a64 - e64)
            reld = absd / np.abs(e64)
        finite = np.isfinite(absd)
        if finite.any() and exp.size:
            k = int(np.argmax(np.where(finite, absd, -1.0)))
            res.max_abs, res.max_abs_index = float(absd[k]), _unravel(k, exp.shape)
            relf = np.isfinite(reld)
            if relf.any():
                k = int(np.argmax(np.where(relf, reld, -1.0)))
                res.max_rel, res.max_rel_index = float(reld[k]), _unravel(k, exp.shape)
        ulp = ulp_distance(exp, act)
        if ulp is not None and exp.size:
            u = np.asarray(ulp).reshape(-1)
            k = int(np.argmax(u))
            res.max_ulp, res.max_ulp_index = int(min(int(u[k]), (1 << 63) - 1)), _unravel(k, exp.shape)

    flat_bad = np.flatnonzero(bad.reshape(-1))[:MAX_SHOWN]
    ef, af = exp.reshape(-1), act.reshape(-1)
    res.first = [Element(_unravel(int(k), exp.shape), _fmt(ef[k]), _fmt(af[k])) for k in flat_bad]
    return res
