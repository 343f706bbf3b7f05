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

Cost: an output whose bytes equal the expected ones is judged at about the cost of a byte
comparison (plus a NaN scan under ``allclose`` with ``nan=fail``, which identical NaNs still
fail), with the record the element-wise comparison gives; other outputs compute each
figure once, and only at the elements that can matter (docs/comparison.md, "Identical
outputs").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
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
        # what dataclasses.asdict gives (lists copied), without its deep-copying walk
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        for k in ("max_abs_index", "max_rel_index", "max_ulp_index"):
            if d[k] is not None:
                d[k] = list(d[k])
        d["first"] = [{"index": list(e.index), "expected": e.expected, "actual": e.actual} for e in self.first]
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
    """Float bits mapped to signed integers of the same width, in the order of the values
    (+0.0 and -0.0 both 0), so that their difference is the ULP distance; flat; None if
    not float. (-(2^(w-1) - 1) .. 2^(w-1) - 1: the width's own integers hold them.)"""
    if not _is_float(a.dtype):
        return None
    it = {2: np.int16, 4: np.int32, 8: np.int64}[a.dtype.itemsize]
    ints = a.reshape(-1).view(it)
    sign = np.right_shift(ints, a.dtype.itemsize * 8 - 1)  # -1 where the sign bit is set, else 0
    ordered = sign & it(np.iinfo(it).max)
    ordered ^= ints  # negative: the sign bit and the magnitude's ones' complement, -1 - magnitude
    ordered -= sign  # -magnitude (no overflow: -1 - magnitude >= -2^(w-1))
    return ordered


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
    shape = np.shape(expected)
    if e.dtype.itemsize < 8:  # the difference of two 16- or 32-bit values fits int64
        d = a.astype(np.int64)
        d -= e
        np.abs(d, out=d)
        return d.view(np.uint64).reshape(shape)
    d = a.view(np.uint64) - e.view(np.uint64)  # modulo 2^64: |a - e| itself, or its negation
    np.negative(d, out=d, where=a < e)
    return d.reshape(shape)


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


def _exact_bad(ef: np.ndarray, af: np.ndarray) -> np.ndarray:
    """Flat bool mask: element bytes differ (flat arrays of one dtype)."""
    n, w = ef.size, ef.dtype.itemsize
    if w in _RAW:
        return ef.view(_RAW[w]) != af.view(_RAW[w])
    return np.any(ef.view(np.uint8).reshape(n, w) != af.view(np.uint8).reshape(n, w), axis=1)


def _widen(x: np.ndarray) -> np.ndarray:
    """f16 and bf16 widened to f32 (exact, and numpy's f32 loops are far faster than the
    16-bit ones); f32 and f64 as they are. NaN, infinity, sign and order are kept, so
    isnan, isfinite and != give what they give in float64."""
    return x.astype(np.float32) if x.dtype.itemsize == 2 else x


@dataclass
class _Differing:
    """What the allclose verdict computed and the statistics reuse: the finite pairs whose
    values differ (flat indices), their values and difference in float64 and, if computed,
    their ULP distances."""

    index: np.ndarray
    e64: np.ndarray
    a64: np.ndarray
    absd: np.ndarray  # |a - e| rounded to float64 (inf where it overflows)
    ulp: np.ndarray | None


def _allclose_bad(ef: np.ndarray, af: np.ndarray, c: Contract) -> tuple[np.ndarray, _Differing]:
    """Flat bool mask of the elements of two flat float arrays that break allclose contract ``c``.

    The value classes (NaN, infinity, equal values) are sorted in the arrays' own width
    (f16/bf16 widened to f32), which is exact; only the finite pairs that differ are widened
    to float64 for the tolerance, and only they can break the ULP bound (equal values are
    0 ULP apart).
    """
    with np.errstate(all="ignore"):
        we, wa = _widen(ef), _widen(af)
        e_nan, a_nan = np.isnan(we), np.isnan(wa)
        fin = np.isfinite(we) & np.isfinite(wa)
        neq = we != wa
        # Non-finite pairs: an infinity matches only the same infinity; NaN by policy.
        bad = ~fin & neq
        if c.nan == "equal":
            bad &= ~(e_nan & a_nan)
        else:
            bad |= e_nan | a_nan
        # Finite pairs that differ: the tolerance, decided exactly.
        idx = np.flatnonzero(fin & neq)
        e, a = we[idx].astype(np.float64), wa[idx].astype(np.float64)  # exact widening
        d = a - e
        np.abs(d, out=d)
        ulp = None
        if idx.size:
            t = np.abs(e)
            t *= c.rtol
            t += c.atol
            hi = t * (1.0 + _REL_MARGIN)
            hi += _ABS_MARGIN
            lo = t * (1.0 - _REL_MARGIN)
            lo -= _ABS_MARGIN
            sure_fail = (d >= hi) & np.isfinite(d) & np.isfinite(hi)
            sure_pass = (d <= lo) & np.isfinite(lo)  # a rounded-up infinite bound decides nothing
            sub_bad = sure_fail
            unsure = np.flatnonzero(~sure_fail & ~sure_pass)
            if unsure.size:
                _decide_near_bound(e, a, c, unsure, sub_bad)
            if c.max_ulp >= 0:
                ulp = ulp_distance(ef[idx], af[idx])
                sub_bad |= ulp > np.uint64(c.max_ulp)
            bad[idx[sub_bad]] = True
    return bad, _Differing(idx, e, a, d, ulp)


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


def _nonfinite_bits(x: np.ndarray) -> tuple[np.ndarray, int]:
    """The magnitude bits of a flat float array and the magnitude bits of inf: a value is
    NaN when its magnitude is above inf's, finite when below."""
    raw = _RAW[x.dtype.itemsize]
    inf_bits = int(np.array(np.inf, x.dtype).view(raw))
    return x.view(raw) & raw(inf_bits | (inf_bits - 1)), inf_bits  # (inf | mantissa ones = all but the sign)


def _first_finite(x: np.ndarray) -> int | None:
    """Flat index of the first finite element of a flat float array (None if none)."""
    if x.size == 0:
        return None
    mag, inf_bits = _nonfinite_bits(x[:1])
    if mag[0] < inf_bits:
        return 0
    mag, inf_bits = _nonfinite_bits(x)
    fin = mag < inf_bits
    return int(np.argmax(fin)) if fin.any() else None


def _has_nan(x: np.ndarray) -> bool:
    """Whether a flat float array holds a NaN (any payload, any sign)."""
    if x.size == 0:
        return False
    if x.dtype.itemsize == 2:  # f16, bf16: from the bits (their isnan loops are slow)
        mag, inf_bits = _nonfinite_bits(x)
        return bool(int(mag.max()) > inf_bits)
    with np.errstate(invalid="ignore"):
        return bool(np.isnan(np.min(x)))  # min propagates NaN, and allocates no mask


def _identical(res: TensorResult, ef: np.ndarray, shape: tuple[int, ...], c: Contract) -> bool:
    """Fill ``res`` for an output whose bytes equal the expected ones, as the element-wise
    comparison fills it (errors 0 at the first element, the ULP maximum at the first
    finite one), and return True; return False, leaving ``res`` alone, when the contract
    still fails such an output: a NaN under ``allclose`` with ``nan=fail``."""
    is_float = _is_float(ef.dtype)
    if is_float and c.kind == "allclose" and c.nan == "fail" and _has_nan(ef):
        return False
    res.ok = True
    if ef.size == 0:
        return True
    res.max_abs = 0.0 if is_float else 0
    res.max_rel = 0.0
    res.max_abs_index, res.max_rel_index = [0] * len(shape), [0] * len(shape)  # the first element
    if is_float:
        k = _first_finite(ef)
        if k is not None:
            res.max_ulp, res.max_ulp_index = 0, _unravel(k, shape) if k else [0] * len(shape)
    return True


def _same_bytes(ef: np.ndarray, af: np.ndarray) -> bool:
    """Whether two flat contiguous arrays of one dtype and size hold the same bytes,
    compared as the widest unsigned integers that tile them (near memcmp speed)."""
    nb = ef.nbytes
    if nb == 0:
        return True
    e, a = ef.view(np.uint8), af.view(np.uint8)
    for w in (8, 4, 2):
        if nb % w == 0:
            e, a = e.view(_RAW[w]), a.view(_RAW[w])
            break
    return bool((e == a).all())


def _worst(
    v: np.ndarray, mask: np.ndarray | None, index: np.ndarray, everywhere: bool
) -> tuple[int | None, int | None]:
    """The worst of ``v`` (values at flat indices ``index``, among ``mask``) as (flat index,
    position in ``v``), or (None, None) when there is none.

    With ``everywhere`` the worst is over the whole tensor and ``index`` lists the pairs whose
    values differ: every other element has error 0, every listed one an error above 0 (finite
    values that differ are at least one ULP apart, and their relative error is at least about
    2^-54, no underflow), so the worst is a listed one, or with none listed the first element
    (position None, error 0).
    """
    k = _argworst(v, mask)
    if everywhere and k is None:
        return 0, None
    return (None, None) if k is None else (int(index[k]), k)


def _fill_stats(res: TensorResult, ef: np.ndarray, af: np.ndarray, shape: tuple[int, ...],
                bad_index: np.ndarray, diff: _Differing | None) -> None:
    """Worst abs / rel / ULP error with index, over the mismatching elements (all if none).

    Computed only at the elements that can be worst: the mismatching ones, or, when none
    mismatch, the pairs whose values differ (every other element has error 0, and then the
    worst is the first element, or for ULP the first finite one).
    """
    if ef.size == 0:
        return
    everywhere = bad_index.size == 0
    if not everywhere:
        idx = bad_index
    elif diff is not None:
        idx = diff.index
    else:  # exact contract, no mismatch: the bytes are equal
        idx = bad_index
    with np.errstate(all="ignore"):
        if _is_float(ef.dtype):
            if everywhere and diff is not None:
                # finite pairs that differ: |a - e| > 0 (inf if it overflows), relative to |e|
                # (inf where e is 0), and no NaN or infinity among them
                absd = diff.absd
                rel = np.abs(diff.e64)
                np.divide(absd, rel, out=rel)
                fin = None  # every pair finite
            else:
                e, a = ef[idx].astype(np.float64), af[idx].astype(np.float64)
                e_nan, a_nan = np.isnan(e), np.isnan(a)
                fin = np.isfinite(e) & np.isfinite(a)
                res.n_nonfinite = int(np.count_nonzero(~fin)) if not everywhere else 0
                # equal values (same infinity, +-0) and NaN against NaN: 0; NaN against a number: nan;
                # an infinity against anything else: inf; finite values: |a - e| (inf if it overflows).
                absd = np.where((e == a) | (e_nan & a_nan), 0.0, np.abs(a - e))
                rel = np.where(absd == 0.0, 0.0, np.where(np.isinf(e) & ~np.isnan(absd), np.inf, absd / np.abs(e)))
            k, p = _worst(absd, None, idx, everywhere)
            res.max_abs, res.max_abs_index = (float(absd[p]) if p is not None else 0.0), _unravel(k, shape)
            k, p = _worst(rel, None, idx, everywhere)
            res.max_rel, res.max_rel_index = (float(rel[p]) if p is not None else 0.0), _unravel(k, shape)
            exact_ulp = everywhere and diff is not None and diff.ulp is not None
            ulp = diff.ulp if exact_ulp else ulp_distance(ef[idx], af[idx])
            k, p = _worst(ulp, fin, idx, everywhere)
            if p is None and everywhere:
                k = _first_finite(ef)  # every finite pair is 0 ULP apart: the first one
            if k is not None:
                res.max_ulp, res.max_ulp_index = (int(ulp[p]) if p is not None else 0), _unravel(k, shape)
        else:  # bool and integers: exact |a - e| as uint64
            es, as_ = ef[idx], af[idx]
            if ef.dtype.kind == "i":
                e, a = es.astype(np.int64), as_.astype(np.int64)
                eu, au = e.view(np.uint64), a.view(np.uint64)
            else:
                e, a = es.astype(np.uint64), as_.astype(np.uint64)
                eu, au = e, a
            absd = np.where(a >= e, au - eu, eu - au)
            rel = np.where(absd == 0, 0.0, absd.astype(np.float64) / np.abs(e.astype(np.float64)))
            k, p = _worst(absd, None, idx, everywhere)
            res.max_abs, res.max_abs_index = (int(absd[p]) if p is not None else 0), _unravel(k, shape)
            k, p = _worst(rel, None, idx, everywhere)
            res.max_rel, res.max_rel_index = (float(rel[p]) if p is not None else 0.0), _unravel(k, shape)


def _compare(name: str, expected: Any, actual: Any | None, contract: Contract, fast: bool) -> TensorResult:
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
    shape = exp.shape
    ef, af = exp.reshape(-1), act.reshape(-1)

    # Identical bytes: the record at the cost of a byte comparison (and, for a NaN-failing
    # contract, a NaN scan: identical NaNs still fail it).
    if fast and _same_bytes(ef, af) and _identical(res, ef, shape, contract):
        return res

    diff = None
    if contract.kind == "exact":
        bad = _exact_bad(ef, af)
    else:
        bad, diff = _allclose_bad(ef, af, contract)
    bad_index = np.flatnonzero(bad)
    res.n_mismatch = int(bad_index.size)
    res.ok = res.n_mismatch == 0
    _fill_stats(res, ef, af, shape, bad_index, diff)

    shown = bad_index[:MAX_SHOWN]
    w = ef.dtype.itemsize
    er = ef.view(_RAW[w]) if _is_float(ef.dtype) else None
    ar = af.view(_RAW[w]) if _is_float(ef.dtype) else None
    res.first = [Element(_unravel(int(k), shape), _fmt(ef, er, int(k)), _fmt(af, ar, int(k))) for k in shown]
    return res


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

    An output whose bytes equal the expected ones costs about a byte comparison (plus a
    NaN scan under ``allclose`` with ``nan=fail``, which such an output still fails when it
    holds a NaN); its record equals the one the element-wise comparison gives.
    """
    return _compare(name, expected, actual, contract, fast=True)


def _compare_elements(name: str, expected: Any, actual: Any | None, contract: Contract) -> TensorResult:
    """:func:`compare` without the identical-bytes fast path (every element judged), for
    tests and benchmarks that check the fast path against it."""
    return _compare(name, expected, actual, contract, fast=False)
