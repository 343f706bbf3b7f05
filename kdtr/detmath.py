"""Deterministic float64 arithmetic for the references and generators: results whose bits
depend on the inputs alone, whatever the numpy version, CPU, SIMD width, BLAS or thread count.

numpy's own ``exp``/``log`` dispatch on the CPU (AVX-512, AVX2 and baseline loops differ in
the last bits), ``sum`` picks its order from the memory layout and the numpy version, and a
BLAS matmul rounds in an order of its choosing. Only IEEE's correctly rounded elementwise
operations (+, -, *, /, sqrt), exact ones (comparisons, ``rint``, ``trunc``, integer ops) and
sums of integers below 2^53 (exact in float64 in any order) are the same everywhere; this
module builds the rest from those:

- :func:`exp`, :func:`log`: range reduction (Cody-Waite, ln 2 split in two) and a fixed
  polynomial, with exponents taken and put from the bit patterns (no ``frexp``/``ldexp``);
  within 2 ulp of the exact value.
- :func:`fixed_sum`: a pairwise sum in one fixed order (halves of an axis padded to a
  power of two with -0.0, added elementwise).
- :func:`matmul_exact`: an Ozaki-style product: rows of the left and columns of the right
  operand are scaled by a power of two to below 1 and cut into integer-valued slices of
  ``w`` bits with 2w + ceil(log2 K) <= 53, so that every slice product is an exact integer
  sum (any BLAS, order or FMA computes it identically); the slice products are scaled
  (exactly) and added in a fixed order, a few float64 roundings (one per slice pair after
  the first). The last slice is rounded: bits of an element more than ``max_slices * w``
  bits below its row's (column's) largest element are rounded off, deterministically, and
  only there (bf16 and f32 rows spread over fewer bits in practice: exact).
"""

from __future__ import annotations

from fractions import Fraction
from math import factorial

import numpy as np

_FRAC = np.uint64((1 << 52) - 1)
LN2_HI = float.fromhex("0x1.62e42fee00000p-1")  # 32 significant bits: k * LN2_HI is exact for |k| < 2^21
LN2_LO = float.fromhex("0x1.a39ef35793c76p-33")  # ln 2 - LN2_HI
INV_LN2 = float.fromhex("0x1.71547652b82fep0")
EXP_MAX = 709.782712893384  # above: exp overflows to inf
EXP_MIN = -745.1332191019412  # below: exp is below half the smallest subnormal: 0
SQRT2 = float.fromhex("0x1.6a09e667f3bcdp0")
# Taylor coefficients 1/n!, n = 15..0 (Horner order); |r| <= 0.35 leaves < 2^-60 of truncation.
_EXP_POLY = tuple(float(Fraction(1, factorial(n))) for n in range(15, -1, -1))
# 2/(2n+1), n = 12..1: log(1+f) = 2 atanh(s), s = f / (2 + f), |s| <= 0.1716.
_LOG_POLY = tuple(float(Fraction(2, 2 * n + 1)) for n in range(12, 0, -1))


def _pow2(k: np.ndarray) -> np.ndarray:
    """2.0 ** k for int64 ``k`` already known to lie in [-1022, 1023]."""
    return ((k + 1023).view(np.uint64) << np.uint64(52)).view(np.float64)


def pow2(k) -> np.ndarray:
    """2.0 ** k (float64) from the bit pattern, for integer ``k`` in [-1022, 1023] (checked).

    Raises:
        ValueError: some k outside [-1022, 1023].
    """
    k = np.array(k, np.int64)
    if k.size and (k.min() < -1022 or k.max() > 1023):
        raise ValueError(f"pow2: exponent outside [-1022, 1023] ({k.min()}..{k.max()})")
    return _pow2(k)


def scale2(x, k) -> np.ndarray:
    """x * 2**k rounded once (exact when the result is a normal number), for float64 ``x``
    with |x| >= 2^-22 (or 0, inf, NaN) and integer ``k`` with |k| <= 2000 (broadcast).

    Two multiplications by powers of two: the first (by 2^clip(k, -1000, 1000)) is exact for
    such x, the second does the one rounding into the subnormal range or to infinity.

    Raises:
        ValueError: some |k| > 2000.
    """
    k = np.array(k, np.int64)
    if k.size and np.abs(k).max() > 2000:
        raise ValueError("scale2: |k| > 2000")
    k1 = np.clip(k, -1000, 1000)
    return np.asarray(x, np.float64) * _pow2(k1) * _pow2(k - k1)


def exponent_of(x) -> np.ndarray:
    """floor(log2 |x|) (int64) of finite nonzero float64 ``x``, subnormals included, read from
    the bits; 0 for zeros (callers mask them); 1024 for NaN and inf."""
    x = np.asarray(x, np.float64)
    sub = (np.abs(x) < 2.0**-1022) & (x != 0)
    with np.errstate(over="ignore"):  # only the subnormals are taken from the product
        xs = np.ascontiguousarray(np.where(sub, x * 2.0**64, x))  # exact
    e = ((xs.view(np.uint64) >> np.uint64(52)) & np.uint64(0x7FF)).astype(np.int64) - 1023
    e = e - np.where(sub, 64, 0)
    return np.where(x == 0, 0, e).reshape(x.shape)


def exp(x) -> np.ndarray:
    """e ** x in float64, within 2 ulp of the exact value, the same bits on every host.

    exp(NaN) = NaN, exp(+inf) = +inf, exp(-inf) = 0; x > 709.78 gives +inf, x < -745.13
    gives 0; results below 2^-1022 are subnormal (rounded once).

    Args:
        x: float64 (or anything numpy widens exactly to it), any shape.

    Returns:
        float64 array of the shape of ``x``.
    """
    x = np.asarray(x, np.float64)
    nan = np.isnan(x)
    xc = np.minimum(x, EXP_MAX, out=np.empty_like(x))  # NaN stays NaN: made 0 below
    np.maximum(xc, EXP_MIN, out=xc)
    any_nan = bool(nan.any())
    if any_nan:
        xc[nan] = 0.0
    k = np.rint(xc * INV_LN2)
    r = xc - k * LN2_HI
    r -= k * LN2_LO  # |r| <= ln2/2 + tiny
    p = np.full(r.shape, _EXP_POLY[0])
    for c in _EXP_POLY[1:]:
        p *= r
        p += c
    ki = k.astype(np.int64)  # in [-1075, 1024]: both halves in the normal range
    k1 = ki >> 1
    p *= _pow2(k1)  # exact (p in [0.7, 1.42])
    p *= _pow2(ki - k1)  # the one rounding (subnormal results, overflow)
    p[x > EXP_MAX] = np.inf
    p[x < EXP_MIN] = 0.0
    if any_nan:
        p[nan] = np.nan
    return p


def log(x) -> np.ndarray:
    """Natural log in float64, within 2 ulp of the exact value, the same bits on every host.

    log(NaN) = NaN, log(x < 0) = NaN, log(+-0) = -inf, log(+inf) = +inf; subnormals included.

    Args:
        x: float64 (or anything numpy widens exactly to it), any shape.

    Returns:
        float64 array of the shape of ``x``.
    """
    x = np.asarray(x, np.float64)
    ok = np.isfinite(x) & (x > 0)
    xs = np.where(ok, x, 1.0)
    sub = xs < 2.0**-1022
    with np.errstate(over="ignore"):  # only the subnormals are taken from the product
        xs = np.where(sub, xs * 2.0**64, xs)  # exact
    u = np.ascontiguousarray(xs).view(np.uint64).reshape(xs.shape)
    e = (u >> np.uint64(52)).astype(np.int64) - 1023 - np.where(sub, 64, 0)
    m = ((u & _FRAC) | np.uint64(1023 << 52)).view(np.float64).reshape(xs.shape)  # [1, 2)
    big = m > SQRT2
    m = np.where(big, m * 0.5, m)  # [sqrt(2)/2, sqrt(2)]
    e = e + big
    f = m - 1.0  # exact
    s = f / (2.0 + f)
    z = s * s
    r = np.full(z.shape, _LOG_POLY[0])
    for c in _LOG_POLY[1:]:
        r = r * z + c
    r = r * z  # 2z/3 + 2z^2/5 + ...: log(1+f) = 2s + s r = f - s (f - r)
    ef = e.astype(np.float64)
    y = ef * LN2_HI + ((f - s * (f - r)) + ef * LN2_LO)
    y = np.where(x == 0, -np.inf, y)
    y = np.where(x == np.inf, np.inf, y)
    return np.where(np.isnan(x) | (x < 0), np.nan, y).reshape(x.shape)


def fixed_sum(x, axis: int = -1, keepdims: bool = False) -> np.ndarray:
    """Sum along ``axis`` in one fixed order: the axis padded to a power of two with -0.0
    (x + -0.0 = x for every x), then halves added elementwise until one element is left.

    NaN and infinities propagate as in any IEEE sum (their class does not depend on the
    order). An empty axis sums to +0.0.

    Args:
        x: float64 array; axis: the axis summed; keepdims: keep it with size 1.

    Returns:
        float64 array, ``x``'s shape without (or with size 1 at) ``axis``.
    """
    a = np.moveaxis(np.asarray(x, np.float64), axis, -1)
    n = a.shape[-1]
    if n == 0:
        s = np.zeros(a.shape[:-1])
    else:
        size = 1 << (n - 1).bit_length()
        if size != n:
            pad = np.full(a.shape[:-1] + (size - n,), -0.0)
            a = np.concatenate([a, pad], axis=-1)
        with np.errstate(invalid="ignore"):  # inf + -inf is NaN, as documented
            while size > 1:
                size //= 2
                a = a[..., :size] + a[..., size:]
        s = a[..., 0]
    return np.expand_dims(s, axis) if keepdims else s


def slice_bits(k: int) -> int:
    """w, the bits per slice for a contraction of length ``k``: the largest w with
    2w + ceil(log2 k) <= 53 (every slice product's sum of k terms is then below 2^53)."""
    return (53 - max(1, (max(k, 1) - 1).bit_length())) // 2


class Sliced:
    """A float64 matrix cut into integer-valued slices along its contraction axis.

    ``side="right"``: ``m`` is [K, N]; each column is scaled by 2^-E (E = exponent of the
    column's largest |element| + 1, so |scaled| < 1), then cut into up to ``max_slices``
    slices of ``w`` bits, the last one rounded half to even, the others truncated:
    m ~= sum_i slices[i] * 2^(E - (i + 1) w) per column, |slice| <= 2^w. ``side="left"``:
    ``m`` is [M, K], scaled per row. Slices after the last nonzero remainder are not made
    (they would be exact zeros), so a matrix whose elements fit in fewer slices costs fewer
    products. Elements must be finite, and the largest of each row (column) 0 or in
    [2^-400, 2^400] (bf16 and f32 values always are), so that every scaling is exact.

    Raises:
        ValueError: a non-finite element, a row (column) maximum outside that range, not
            a 2-D array.
    """

    def __init__(self, m: np.ndarray, w: int, side: str, max_slices: int = 3) -> None:
        m = np.asarray(m, np.float64)
        if m.ndim != 2:
            raise ValueError(f"Sliced: a 2-D matrix, not shape {m.shape}")
        if not np.isfinite(m).all():
            raise ValueError("Sliced: non-finite element (callers handle NaN and inf first)")
        axis = 0 if side == "right" else 1
        if m.shape[axis]:
            amax = np.abs(m).max(axis=axis, keepdims=True)
        else:
            amax = np.zeros((1, m.shape[1]) if axis == 0 else (m.shape[0], 1))
        e = np.where(amax > 0, exponent_of(amax) + 1, 0)  # |m| < 2^e
        if e.size and np.abs(e).max() > 400:
            raise ValueError("Sliced: a row or column whose largest element is outside [2^-400, 2^400]")
        # Elements below 2^(e - max_slices w - 1) round to 0 in every slice: make them 0 first,
        # so that the scaling below never meets a subnormal result (exact for all others).
        tiny = np.abs(m) < pow2(e - max_slices * w - 1)
        m = np.where(tiny, 0.0, m)
        self.exponent = e.reshape(-1)  # per column (right) or row (left)
        self.w = w
        self.side = side
        rest = m * pow2(w - e)  # exact: |rest| < 2^w
        self.slices: list[tuple[int, np.ndarray]] = []  # (index i, integer-valued slice)
        for i in range(max_slices):
            last = i == max_slices - 1
            s = np.rint(rest) if last else np.trunc(rest)
            if s.any():
                self.slices.append((i, np.ascontiguousarray(s)))
            if last:
                break
            rest = (rest - s) * float(2**w)  # exact: the fractional part, shifted up
            if not rest.any():
                break


def matmul_exact(a, b, max_slices: int = 3, block_bytes: int = 64 << 20) -> np.ndarray:
    """a @ b (float64 [M, N]) from exact integer slice products combined in a fixed order:
    the same bits on every host, within (slice pairs) float64 ulp of the exact product of
    the sliced operands (module docstring).

    Args:
        a: float64 [M, K] or a :class:`Sliced` (side "left") of it; b: float64 [K, N] or a
            :class:`Sliced` (side "right"); both finite. ``max_slices``: slices per operand
            when a or b is cut here. ``block_bytes``: rows of ``a`` are processed in blocks
            whose [rows, N] float64 products stay below it (the result does not depend on it).

    Returns:
        float64 [M, N]; exact zeros are +0.0.

    Raises:
        ValueError: shapes that do not chain, non-finite elements, slices of another width.
    """
    if not isinstance(b, Sliced):
        b_arr = np.asarray(b, np.float64)
        b = Sliced(b_arr, slice_bits(b_arr.shape[0]), "right", max_slices)
    k = b.slices[0][1].shape[0] if b.slices else None
    if not isinstance(a, Sliced):
        a_arr = np.asarray(a, np.float64)
        kk = a_arr.shape[1] if a_arr.ndim == 2 else -1
        a = Sliced(a_arr, b.w if k is None or k == kk else slice_bits(kk), "left", max_slices)
    if a.w != b.w:
        raise ValueError(f"matmul_exact: slices of {a.w} and {b.w} bits")
    m_rows = a.exponent.size
    n_cols = b.exponent.size
    out = np.zeros((m_rows, n_cols))
    if not a.slices or not b.slices:
        return out
    if a.slices[0][1].shape[1] != b.slices[0][1].shape[0]:
        raise ValueError(f"matmul_exact: [{m_rows}, {a.slices[0][1].shape[1]}] @ [{b.slices[0][1].shape[0]}, {n_cols}]")
    w = a.w
    # fixed order: the least significant slice pairs first (i + j descending), then i ascending
    pairs = sorted(((i + j, i, sa, sb) for i, sa in a.slices for j, sb in b.slices), key=lambda p: (-p[0], p[1]))
    col_scale = pow2(b.exponent)[None, :]
    row_scale = pow2(a.exponent)[:, None]
    rows = max(1, block_bytes // (8 * max(n_cols, 1)))
    for r0 in range(0, m_rows, rows):
        r1 = min(m_rows, r0 + rows)
        acc = np.zeros((r1 - r0, n_cols))
        for d, _, sa, sb in pairs:
            prod = np.matmul(sa[r0:r1], sb)  # an exact integer in any order
            prod *= pow2(-(d + 2) * w)  # exact
            prod += 0.0  # -0.0 (a BLAS that starts from a product) becomes +0.0
            acc += prod  # the one rounding step, in this fixed order
        # |acc| in [2^-160, 2^53] or 0 and row/column exponents within +-401: both scalings exact
        acc *= row_scale[r0:r1]
        acc *= col_scale
        out[r0:r1] = acc
    return out
