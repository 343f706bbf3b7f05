"""The comparison engine: an expected tensor against an obtained one, under a contract.

Rules (docs/comparison.md is the normative text, with a table per contract kind):

* Both arrays must have the same KDTR dtype and shape; a change is a mismatch, never
  converted. A dtype outside the KDTR set is refused the same way.
* ``exact`` compares the bytes of each element: -0.0 != +0.0, NaN matches NaN only with
  the same bits, +inf matches +inf only.
* ``allclose`` applies to float outputs only (f16, bf16, f32, f64); an integer or bool
  output under ``allclose`` is a mismatch whose problem says to use ``exact`` (widening
  int64 to float64 would let distinct values compare equal). Element by element:
  a NaN on either side follows the NaN policy (``equal``: NaN matches NaN only;
  ``fail``: any NaN fails); an infinity on either side matches only the same infinity;
  two finite values match when ``|a - e| <= atol + rtol * |e|`` holds *in real
  arithmetic* (decided exactly: float64 evaluation with a safety margin, and exact
  rational arithmetic for the few elements within rounding of the bound or whose
  difference overflows float64), and, if ``max_ulp >= 0``, their ULP distance in the
  output's own dtype is at most ``max_ulp``. -0.0 and +0.0 are equal.

The result holds what a kernel engineer needs without a debugger: how many elements
differ and their share, the worst absolute / relative / ULP error with its index, and
the first differing elements with expected and actual values; for tree ops the first
two index components are the request (batch row) and the slot. The worst errors are
taken over the mismatching elements (over all elements when none mismatch), a NaN error
ranking above every number; the ULP maximum covers only pairs of finite values.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from .contract import Contract
from .dtypes import code_of_dtype, name_of_dtype

MAX_SHOWN = 10
INDEX_LABELS = ("request", "slot")
FLOAT_DTYPES = ("f16", "bf16", "f32", "f64")

# Safety margins of the float64 pre-decision of |a - e| <= atol + rtol*|e| (see _allclose_bad):
# far larger than float64 rounding (2^-53 relative, 2^-1075 absolute), far smaller than any
# tolerance anyone writes. Elements inside the margins are decided in exact arithmetic.
_REL_MARGIN = 2.0**-40
_ABS_MARGIN = 2.0**-1000
_RAW = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


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
    """Outcome of comparing one output tensor.

    ``max_abs`` is an int for integer and bool outputs (exact, no float rounding), a
    float (possibly inf or nan) for float outputs; ``max_rel`` a float; ``max_ulp`` an int
    (float outputs only, finite pairs only). Each ``*_index`` is the element's index.
    ``n_nonfinite`` counts the mismatching elements where expected or actual is NaN or
    infinite (their ULP distance is not counted in ``max_ulp``).
    """

    name: str
    contract: str
    ok: bool
    problem: str = ""  # missing tensor, dtype or shape change, contract not applicable
    n_mismatch: int = 0
    n_total: int = 0
    max_abs: float | int | None = None
    max_abs_index: list[int] | None = None
    max_rel: float | None = None
    max_rel_index: list[int] | None = None
    max_ulp: int | None = None
    max_ulp_index: list[int] | None = None
    n_nonfinite: int = 0
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
        if self.n_nonfinite:
            s += f"; {self.n_nonfinite} with nan/inf"
        if self.max_abs is not None:
            v = str(self.max_abs) if isinstance(self.max_abs, int) else f"{self.max_abs:.6g}"
            s += f"; max abs {v} at {self.max_abs_index}"
        if self.max_rel is not None:
            s += f"; max rel {self.max_rel:.6g} at {self.max_rel_index}"
        if self.max_ulp is not None:
            s += f"; max ulp {self.max_ulp} at {self.max_ulp_index}"
            if self.n_nonfinite:
                s += " (finite pairs)"
        return s

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["percent"] = self.percent
        for k in ("max_abs", "max_rel"):  # JSON has no nan/inf literals: write them as strings
            if isinstance(d[k], float) and not math.isfinite(d[k]):
                d[k] = repr(d[k])
        return d


def _is_float(dt: np.dtype) -> bool:
    return name_of_dtype(dt) in FLOAT_DTYPES


def _fmt_float(x: Any, bits: int, dt: np.dtype) -> str:
    """Shortest text that identifies a value of dtype ``dt``; NaN shows its bits, zero its sign."""
    f = float(x)
    if math.isnan(f):
        return f"nan(0x{bits:0{2 * dt.itemsize}x})"
    if math.isinf(f) or f == 0.0 or dt.itemsize == 8:
        return repr(f)  # 'inf', '-inf', '0.0', '-0.0', shortest float64
    for p in range(1, 18):
        s = f"{f:.{p}g}"
        with np.errstate(over="ignore"):  # a short text may round past the largest finite value
            back = float(np.array(float(s)).astype(dt))
        if back == f:
            return s if any(ch in s for ch in ".en") else s + ".0"  # '1' -> '1.0', like repr
    return repr(f)


def _fmt(arr: np.ndarray, raw: np.ndarray | None, k: int) -> str:
    x = arr[k]
    if _is_float(arr.dtype):
        return _fmt_float(x, int(raw[k]) if raw is not None else 0, arr.dtype)
    if arr.dtype.kind == "b":
        return str(bool(x))
    if arr.dtype.kind in "iu":
        return str(int(x))
    return str(x)


def _ordered_bits(a: np.ndarray) -> np.ndarray | None:
    """Float bits mapped to int64 whose difference is the ULP distance (None if not float)."""
    if not _is_float(a.dtype):
        return None
    width = a.dtype.itemsize * 8
    ints = a.view({16: np.int16, 32: np.int32, 64: np.int64}[width]).astype(np.int64)
    magnitude = ints & np.int64((1 << (width - 1)) - 1)
    return np.where(ints < 0, -magnitude, magnitude)


def ulp_distance(expected: np.ndarray, actual: np.ndarray) -> np.ndarray | None:
    """Element-wise ULP distance of two float arrays of one dtype; None for non-floats.

    Args:
        expected, actual: arrays of one float dtype (f16, bf16, f32, f64) and one shape.

    Returns:
        uint64 array of that shape: the number of representable values between the two
        (+0.0 and -0.0 are 0 apart). Infinities count as the value after the largest
        finite one (so inf is 1 ULP from the max finite value) and NaNs give meaningless
        distances: callers must judge non-finite pairs by other rules, as
        :func:`compare` does.
    """
    e, a = _ordered_bits(expected), _ordered_bits(actual)
    if e is None or a is None:
        return None
    eu, au = e.view(np.uint64), a.view(np.uint64)
    return np.where(a >= e, au - eu, eu - au)


def _unravel(flat: int, shape: tuple[int, ...]) -> list[int]:
    return [int(i) for i in np.unravel_index(flat, shape)] if shape else []


def _within_exact(e: float, a: float, atol: float, rtol: float) -> bool:
    """|a - e| <= atol + rtol * |e| in exact rational arithmetic (finite floats)."""
    fe = Fraction(e)
    return abs(Fraction(a) - fe) <= Fraction(atol) + Fraction(rtol) * abs(fe)


def _two_sum_err(x: np.ndarray, y: Any, s: np.ndarray) -> np.ndarray:
    """Knuth's TwoSum: x + y - s exactly, for s = fl(x + y) (no overflow)."""
    bp = s - x
    ap = s - bp
    return (x - ap) + (y - bp)


def _split(x: Any) -> tuple[Any, Any]:
    c = 134217729.0 * x  # Veltkamp: 2^27 + 1
    hi = c - (c - x)
    return hi, x - hi


def _two_prod_err(x: Any, y: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Dekker's TwoProduct: x * y - p exactly, for p = fl(x * y) (no over- or underflow)."""
    xh, xl = _split(x)
    yh, yl = _split(y)
    return ((xh * yh - p) + xh * yl + xl * yh) + xl * yl


def _decide_near_bound(e: np.ndarray, a: np.ndarray, c: Contract, idx: np.ndarray, bad: np.ndarray) -> None:
    """Decide ``|a - e| <= atol + rtol*|e|`` exactly at the finite, differing elements ``idx``.

    These lie within rounding of the bound (or overflow float64). Where a - e, rtol*|e|
    and atol + rtol*|e| are all exact in float64 (checked with error-free transformations:
    the usual case of a tie, e.g. quantized values and a tolerance of one step), the float
    comparison is exact and vectorized; the rest go through exact rational arithmetic.
    """
    big, small = 2.0**990, 2.0**-900
    eu, au = e[idx], a[idx]
    s = au - eu
    exact = (np.abs(eu) <= big) & (np.abs(au) <= big) & (_two_sum_err(au, -eu, s) == 0)
    if c.rtol == 0.0:
        p = np.zeros_like(eu)
    else:
        ae = np.abs(eu)
        p = c.rtol * ae
        in_range = (ae == 0) | ((p >= small) & (ae <= big) & (c.rtol <= big) & (c.rtol >= small))
        exact &= in_range & (_two_prod_err(c.rtol, ae, p) == 0)
    t = c.atol + p
    exact &= (c.atol <= big) & np.isfinite(t) & (_two_sum_err(np.full_like(p, c.atol), p, t) == 0)
    bad[idx[exact]] = np.abs(s[exact]) > t[exact]
    for k in idx[~exact]:
        bad[k] = not _within_exact(float(e[k]), float(a[k]), c.atol, c.rtol)


def _exact_bad(exp: np.ndarray, act: np.ndarray) -> np.ndarray:
    """Flat bool mask: element bytes differ."""
    n, w = exp.size, exp.dtype.itemsize
    e, a = exp.reshape(-1), act.reshape(-1)
    if w in _RAW:
        return e.view(_RAW[w]) != a.view(_RAW[w])
    return np.any(e.view(np.uint8).reshape(n, w) != a.view(np.uint8).reshape(n, w), axis=1)


def _allclose_bad(exp: np.ndarray, act: np.ndarray, c: Contract) -> np.ndarray:
    """Flat bool mask of the elements of two float arrays that break allclose contract ``c``."""
    with np.errstate(all="ignore"):  # (bf16 NaN casts warn)
        e = exp.reshape(-1).astype(np.float64)  # exact widening for f16, bf16, f32
        a = act.reshape(-1).astype(np.float64)
        e_nan, a_nan = np.isnan(e), np.isnan(a)
        fin = np.isfinite(e) & np.isfinite(a)
        # Non-finite pairs: an infinity matches only the same infinity; NaN by policy.
        bad = ~fin & (e != a)
        if c.nan == "equal":
            bad &= ~(e_nan & a_nan)
        else:
            bad |= e_nan | a_nan
        # Finite pairs that differ: the tolerance, decided exactly.
        ne = fin & (e != a)
        if ne.any():
            d = np.abs(a - e)
            t = c.atol + c.rtol * np.abs(e)
            hi = t * (1.0 + _REL_MARGIN) + _ABS_MARGIN
            lo = t * (1.0 - _REL_MARGIN) - _ABS_MARGIN
            sure_fail = (d >= hi) & np.isfinite(d) & np.isfinite(hi)
            sure_pass = (d <= lo) & np.isfinite(lo)  # a rounded-up infinite bound decides nothing
            bad |= ne & sure_fail
            unsure = np.flatnonzero(ne & ~sure_fail & ~sure_pass)
            if unsure.size:
                _decide_near_bound(e, a, c, unsure, bad)
        if c.max_ulp >= 0:
            ulp = ulp_distance(exp.reshape(-1), act.reshape(-1))
            bad |= fin & (ulp > np.uint64(c.max_ulp))
    return bad


def _argworst(v: np.ndarray, mask: np.ndarray | None) -> int | None:
    """Flat index of the largest value of ``v`` among ``mask`` (all if None); NaN ranks first."""
    if v.size == 0 or (mask is not None and not mask.any()):
        return None
    if v.dtype.kind == "f":
        w = v if mask is None else np.where(mask, v, -np.inf)
        nan = np.isnan(w)
        return int(np.argmax(nan)) if nan.any() else int(np.argmax(w))
    w = v if mask is None else np.where(mask, v, 0)
    k = int(np.argmax(w))
    if mask is not None and not mask[k]:  # every masked value is 0: the first masked element
        k = int(np.argmax(mask))
    return k


def _fill_stats(res: TensorResult, exp: np.ndarray, act: np.ndarray, bad: np.ndarray) -> None:
    """Worst abs / rel / ULP error with index, over the mismatching elements (all if none)."""
    if exp.size == 0:
        return
    cand = bad if bad.any() else None
    ef, af = exp.reshape(-1), act.reshape(-1)
    with np.errstate(all="ignore"):
        if _is_float(exp.dtype):
            e, a = ef.astype(np.float64), af.astype(np.float64)
            e_nan, a_nan = np.isnan(e), np.isnan(a)
            fin = np.isfinite(e) & np.isfinite(a)
            res.n_nonfinite = int(np.count_nonzero(bad & ~fin))
            # equal values (same infinity, +-0) and NaN against NaN: 0; NaN against a number: nan;
            # an infinity against anything else: inf; finite values: |a - e| (inf if it overflows).
            absd = np.where((e == a) | (e_nan & a_nan), 0.0, np.abs(a - e))
            rel = np.where(absd == 0.0, 0.0, np.where(np.isinf(e) & ~np.isnan(absd), np.inf, absd / np.abs(e)))
            k = _argworst(absd, cand)
            if k is not None:
                res.max_abs, res.max_abs_index = float(absd[k]), _unravel(k, exp.shape)
                k = _argworst(rel, cand)
                res.max_rel, res.max_rel_index = float(rel[k]), _unravel(k, exp.shape)
            ulp_mask = fin if cand is None else (cand & fin)
            k = _argworst(ulp_distance(ef, af), ulp_mask)
            if k is not None:
                u = int(ulp_distance(ef[k : k + 1], af[k : k + 1])[0])
                res.max_ulp, res.max_ulp_index = u, _unravel(k, exp.shape)
        else:  # bool and integers: exact |a - e| as uint64
            if exp.dtype.kind == "i":
                e, a = ef.astype(np.int64), af.astype(np.int64)
                eu, au = e.view(np.uint64), a.view(np.uint64)
            else:
                e, a = ef.astype(np.uint64), af.astype(np.uint64)
                eu, au = e, a
            absd = np.where(a >= e, au - eu, eu - au)
            rel = np.where(absd == 0, 0.0, absd.astype(np.float64) / np.abs(e.astype(np.float64)))
            k = _argworst(absd, cand)
            if k is not None:
                res.max_abs, res.max_abs_index = int(absd[k]), _unravel(k, exp.shape)
                k = _argworst(rel, cand)
                res.max_rel, res.max_rel_index = float(rel[k]), _unravel(k, exp.shape)


def compare(name: str, expected: Any, actual: Any | None, contract: Contract) -> TensorResult:
    """Compare one obtained output with its expected value under ``contract``.

    Args:
        name: output name (for the record).
        expected: the golden's ``expected.<name>`` array (any shape; a KDTR dtype: bool,
            u8..u64, i8..i64, f16, bf16, f32, f64). Array-likes go through ``np.asarray``.
        actual: the binary's ``<name>`` array, or None if the output file lacks it.
        contract: exact or allclose (see :mod:`kdtr.contract`, docs/comparison.md).

    Returns:
        A :class:`TensorResult`; ``ok`` is True exactly when the contract holds for every
        element. A missing output, a dtype or shape change, a dtype outside the KDTR set,
        or an ``allclose`` contract on a non-float output gives ``ok=False`` with
        ``problem`` set. Never raises for the arrays' values (NaN, inf, overflow).
    """
    expected = np.asarray(expected)
    res = TensorResult(name, contract.describe(), ok=False, n_total=int(expected.size))
    if actual is None:
        res.problem = "missing from the output file"
        return res
    actual = np.asarray(actual)
    if code_of_dtype(expected.dtype) is None:
        res.problem = f"expected dtype {expected.dtype} is not a KDTR dtype"
        return res
    if actual.dtype != expected.dtype:
        res.problem = f"dtype {name_of_dtype(actual.dtype)} != expected {name_of_dtype(expected.dtype)}"
        return res
    if actual.shape != expected.shape:
        res.problem = f"shape {list(actual.shape)} != expected {list(expected.shape)}"
        return res
    if contract.kind == "allclose" and not _is_float(expected.dtype):
        res.problem = (
            f"an allclose contract applies to float outputs only; this {name_of_dtype(expected.dtype)} "
            "output needs kind 'exact' (fix the golden's contract)"
        )
        return res
    exp = expected if expected.flags.c_contiguous else expected.copy()  # (ascontiguousarray makes 0-d 1-d)
    act = actual if actual.flags.c_contiguous else actual.copy()

    bad = _exact_bad(exp, act) if contract.kind == "exact" else _allclose_bad(exp, act, contract)
    res.n_mismatch = int(np.count_nonzero(bad))
    res.ok = res.n_mismatch == 0
    _fill_stats(res, exp, act, bad)

    flat_bad = np.flatnonzero(bad)[:MAX_SHOWN]
    ef, af = exp.reshape(-1), act.reshape(-1)
    w = exp.dtype.itemsize
    er = ef.view(_RAW[w]) if _is_float(exp.dtype) else None
    ar = af.view(_RAW[w]) if _is_float(exp.dtype) else None
    res.first = [Element(_unravel(int(k), exp.shape), _fmt(ef, er, int(k)), _fmt(af, ar, int(k))) for k in flat_bad]
    return res
