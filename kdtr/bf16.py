"""kdtr's own rounding of float64 to bf16 and to float32, in numpy integer arithmetic.

Every float a golden stores in bf16 or f32 is rounded here, from the float64 bit pattern,
so that its bytes depend on the value alone: not on the ml_dtypes or numpy version, the
CPU or its SIMD width (ml_dtypes 0.5 rounds float64 to bf16 through float32, a double
rounding; 0.7 rounds once: the two differ on about one value in 2^16).

The rule (docs/harness.md, "Host independence of goldens"), for both targets (8 exponent
bits, bias 127; bf16 keeps 7 fraction bits, f32 23):

- One correctly rounded step from the float64 value, round half to even.
- Finite values from the largest finite target value plus half an ulp on (the IEEE
  overflow threshold; a tie there rounds to infinity, the "even" neighbour) round to
  +-inf; +-inf stays +-inf.
- Results below the smallest normal are subnormal targets (gradual underflow, rounded the
  same way); a float64 subnormal rounds to +-0; -0.0 stays -0.0 (the sign is kept).
- NaN becomes the canonical quiet NaN of its sign: 0x7fc0 / 0xffc0 (bf16), 0x7fc00000 /
  0xffc00000 (f32), whatever the payload (ml_dtypes' rule for bf16).

float32 inputs are widened to float64 first (exact), so the same functions round float32
to bf16 in one step. ml_dtypes is imported only when a bf16 *array* is asked for
(:func:`to_bfloat16`); :func:`bf16_bits` needs numpy alone.
"""

from __future__ import annotations

import numpy as np

from .dtypes import bfloat16

_SIGN64 = np.uint64(1 << 63)
_MAG64 = np.uint64((1 << 63) - 1)
_FRAC64 = np.uint64((1 << 52) - 1)
_IMPLICIT = np.uint64(1 << 52)
_EXP_INF = 2047


def _as_f64_bits(x) -> np.ndarray:
    """The float64 bit patterns (uint64, C order) of ``x``: float64 as is, bf16 from its bits,
    any other real dtype widened by numpy (exact for float16/float32 and for integers below 2^53).

    Raises:
        TypeError: a complex or non-numeric array.
    """
    a = np.asarray(x)
    if a.dtype.kind not in "biuf" and a.dtype.name != "bfloat16":
        raise TypeError(f"cannot round a {a.dtype} array to bf16/f32 (real numbers only)")
    if a.dtype.name == "bfloat16":
        a = bf16_to_float64(a)
    return np.ascontiguousarray(a, dtype=np.float64).view(np.uint64)


def _rne_shift(v: np.ndarray, s: np.ndarray) -> np.ndarray:
    """round(v / 2^s), half to even, for uint64 ``v`` and shifts 1 <= s <= 63 (elementwise)."""
    one = np.uint64(1)
    q = v >> s
    rem = v & ((one << s) - one)
    half = one << (s - one)
    up = (rem > half) | ((rem == half) & ((q & one) == one))
    return q + up.astype(np.uint64)


def _round_e8(x, frac_bits: int) -> np.ndarray:
    """Bit patterns (uint64, shape of ``x``) of ``x`` rounded to the binary format with 8
    exponent bits (bias 127) and ``frac_bits`` fraction bits: the rule of the module docstring."""
    u = _as_f64_bits(x)
    shape = np.shape(x)
    u = u.reshape(-1)
    sign = (u & _SIGN64) >> np.uint64(63 - (8 + frac_bits))  # the sign at bit 8 + frac_bits
    mag = u & _MAG64
    e = (mag >> np.uint64(52)).astype(np.int64)  # the float64 exponent field
    frac = mag & _FRAC64
    out = np.zeros(u.shape, np.uint64)

    inf_bits = np.uint64(0xFF << frac_bits)
    qnan_bits = np.uint64((0xFF << frac_bits) | (1 << (frac_bits - 1)))

    # normal targets: float64 exponent field e with e - 1023 + 127 >= 1, i.e. e >= 897. Rebias
    # the exponent and round the fraction: a carry out of the fraction raises the exponent,
    # and one out of the largest exponent gives the infinity pattern (exponent 0xFF, fraction 0).
    normal = (e >= 897) & (e < _EXP_INF)
    rebias = mag[normal] - np.uint64((1023 - 127) << 52)
    r = _rne_shift(rebias, np.full(rebias.shape, 52 - frac_bits, np.uint64))
    out[normal] = np.minimum(r, inf_bits)  # beyond the exponent range: +-inf

    # subnormal targets (and results that round to 0 or up to the smallest normal): value =
    # sig * 2^(e - 1075), in units of the target's smallest subnormal 2^(-126 - frac_bits).
    sub = (e >= 1) & (e < 897)
    sig = frac[sub] | _IMPLICIT
    shift = np.minimum(949 - frac_bits - e[sub], 63).astype(np.uint64)  # >= 53 - frac_bits; 63: all to 0
    out[sub] = _rne_shift(sig, shift)
    # e == 0 (float64 zero or subnormal, below 2^-1022): rounds to zero; out stays 0.

    special = e == _EXP_INF
    out[special & (frac == 0)] = inf_bits
    out[special & (frac != 0)] = qnan_bits
    return (out | sign).reshape(shape)


def bf16_bits(x) -> np.ndarray:
    """``x`` rounded to bf16 (module docstring): the bit patterns.

    Args:
        x: a real array or scalar (float64, float32, float16, integer, bf16), any shape.

    Returns:
        uint16 array of the shape of ``x``.

    Raises:
        TypeError: complex or non-numeric input.
    """
    return _round_e8(x, 7).astype(np.uint16)


def to_bfloat16(x) -> np.ndarray:
    """``x`` rounded to bf16 (module docstring), as an ``ml_dtypes.bfloat16`` array (a view of
    :func:`bf16_bits`; imports ml_dtypes).

    Raises:
        TypeError: complex or non-numeric input.
    """
    return bf16_bits(x).view(bfloat16())


def f32_bits(x) -> np.ndarray:
    """``x`` rounded to float32 (module docstring): the bit patterns, uint32, shape of ``x``.

    Raises:
        TypeError: complex or non-numeric input.
    """
    return _round_e8(x, 23).astype(np.uint32)


def to_float32(x) -> np.ndarray:
    """``x`` rounded to float32 by kdtr's rule (module docstring; NaN canonical, unlike a
    hardware cast that keeps payloads): float32 array of the shape of ``x``.

    Raises:
        TypeError: complex or non-numeric input.
    """
    return f32_bits(x).view(np.float32)


def bf16_to_float64(a) -> np.ndarray:
    """Widen bf16 values exactly to float64, from their bit patterns (a NaN stays a NaN of
    its sign; a signaling one comes out quiet).

    Args:
        a: an ``ml_dtypes.bfloat16`` array or its uint16 bit patterns, any shape.

    Returns:
        float64 array of the same shape.

    Raises:
        TypeError: neither bf16 nor uint16.
    """
    a = np.asarray(a)
    if a.dtype.name == "bfloat16":
        a = a.view(np.uint16)
    elif a.dtype != np.uint16:
        raise TypeError(f"bf16_to_float64 takes bf16 or uint16 bit patterns, not {a.dtype}")
    with np.errstate(invalid="ignore"):  # a signaling NaN is quieted, not an error
        return (a.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)


def round_to(x, dtype) -> np.ndarray:
    """``x`` rounded to ``dtype`` by kdtr's rule: bf16 (:func:`to_bfloat16`), float32
    (:func:`to_float32`) or float64 (exact for float64, float32 and bf16 inputs).

    Raises:
        TypeError: another dtype, or complex or non-numeric input.
    """
    dt = np.dtype(dtype)
    if dt == np.float32:
        return to_float32(x)
    if dt == np.float64:
        return _as_f64_bits(x).view(np.float64).reshape(np.shape(x))
    if dt.name == "bfloat16":
        return to_bfloat16(x)
    raise TypeError(f"kdtr rounds to bf16, f32 or f64, not {dt}")


def widen(x) -> np.ndarray:
    """float64 copy of a bf16, float32 or float64 array (exact; bf16 from its bits)."""
    return _as_f64_bits(x).view(np.float64).reshape(np.shape(x)).copy()
