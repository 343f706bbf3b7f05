"""kdtr.bf16: kdtr's own float64 -> bf16 (and -> f32) rounding, one correctly rounded step.

Checked against structural expectations on every bf16 value and on every midpoint between
neighbouring bf16 values (and one float64 ulp either side), against an exact rational
oracle (fractions) on edge inputs, random bit patterns and hypothesis' floats, and for the
bug class the rule exists for: rounding float64 through float32 first (what ml_dtypes 0.5
does) gives another bf16 on some inputs.
"""

from __future__ import annotations

import math
import struct
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kdtr import bf16

BF16_MAX = float.fromhex("0x1.fep127")
F32_MAX = float.fromhex("0x1.fffffep127")


def oracle(x: float, frac_bits: int) -> int:
    """Bits of ``x`` rounded half-even to the format with 8 exponent bits and ``frac_bits``
    fraction bits, in exact rational arithmetic (the IEEE definition, written independently)."""
    width = 8 + frac_bits
    sign = (1 << width) if math.copysign(1.0, x) < 0 else 0
    if math.isnan(x):
        return sign | (0xFF << frac_bits) | (1 << (frac_bits - 1))
    if math.isinf(x):
        return sign | (0xFF << frac_bits)
    a = Fraction(abs(x))
    if a == 0:
        return sign
    e = a.numerator.bit_length() - a.denominator.bit_length()  # floor(log2 a) is e or e - 1
    if a < Fraction(2) ** e:
        e -= 1
    unit = Fraction(2) ** (max(e, -126) - frac_bits)  # the spacing of the format at a (unbounded exponent)
    q = a / unit
    n = q.numerator // q.denominator
    rest = q - n
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and n % 2 == 1):
        n += 1
    v = n * unit
    if v >= Fraction(2) ** 128:
        return sign | (0xFF << frac_bits)
    if v < Fraction(2) ** -126:
        return sign | int(v / Fraction(2) ** (-126 - frac_bits))
    ev = v.numerator.bit_length() - v.denominator.bit_length()
    if v < Fraction(2) ** ev:
        ev -= 1
    mant = int(v / Fraction(2) ** (ev - frac_bits)) - (1 << frac_bits)
    return sign | ((ev + 127) << frac_bits) | mant


def widen_bits(bits: np.ndarray) -> np.ndarray:
    """bf16 bit patterns -> float64 (exact), written without kdtr.bf16."""
    with np.errstate(invalid="ignore"):  # signaling NaNs come out quiet
        return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def test_every_bf16_value_rounds_to_itself():
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    x = widen_bits(bits)
    got = bf16.bf16_bits(x)
    nan = np.isnan(x)
    assert np.array_equal(got[~nan], bits[~nan])  # +-0, subnormals, normals, max finite, +-inf
    assert set(got[nan].tolist()) == {0x7FC0, 0xFFC0}  # canonical quiet NaN, sign kept
    assert np.array_equal(got[nan] >> 15, bits[nan] >> 15)
    assert np.array_equal(bf16.bf16_to_float64(bits)[~nan], x[~nan])
    assert np.isnan(bf16.bf16_to_float64(bits)[nan]).all()


@pytest.mark.parametrize("negative", [False, True])
def test_every_midpoint_and_its_neighbours(negative):
    """Between bf16 neighbours lo < hi (0 and the smallest subnormal up to the largest
    finite value and infinity, as 2^128): the midpoint rounds to the one with an even
    pattern, one float64 ulp below to lo, one above to hi (the midpoint past the largest
    finite value is the overflow threshold: it and above round to inf)."""
    lo = np.arange(0, 0x7F80, dtype=np.uint32).astype(np.uint16)
    hi = lo + np.uint16(1)
    v_lo = widen_bits(lo)
    v_hi = widen_bits(hi)
    v_hi[-1] = 2.0**128  # the pattern 0x7f80 is inf; the rounding step above the largest finite value is 2^128
    mid = (v_lo + v_hi) / 2  # exact: 9 significant bits
    assert np.array_equal(mid * 2, v_lo + v_hi)
    below = np.nextafter(mid, -np.inf)
    above = np.nextafter(mid, np.inf)
    even = np.where(lo % 2 == 0, lo, hi)
    s = -1.0 if negative else 1.0
    sign = np.uint16(0x8000 if negative else 0)
    assert np.array_equal(bf16.bf16_bits(s * mid), even | sign)
    assert np.array_equal(bf16.bf16_bits(s * below), lo | sign)
    assert np.array_equal(bf16.bf16_bits(s * above), hi | sign)
    # the oracle agrees on a sample of them (every 97th pair, and the last ones)
    pick = np.r_[np.arange(0, lo.size, 97), np.arange(lo.size - 4, lo.size)]
    for arr in (mid, below, above):
        for v in (s * arr[pick]).tolist():
            assert int(bf16.bf16_bits(v)) == oracle(v, 7), v.hex()


EDGES = [
    0.0, -0.0, 1.0, -1.0, math.inf, -math.inf, math.nan, -math.nan,
    BF16_MAX, -BF16_MAX,
    float.fromhex("0x1.ffp127"),  # the overflow threshold (max + half ulp): inf
    np.nextafter(float.fromhex("0x1.ffp127"), 0.0),  # just below: max finite
    F32_MAX, 2.0**128, 1e300, -1e300, 1.7976931348623157e308,
    2.0**-126, 2.0**-127, 2.0**-133, -(2.0**-133),  # smallest normal, a subnormal, the smallest subnormal
    2.0**-134,  # halfway to zero: ties to 0 (even)
    np.nextafter(2.0**-134, 1.0), np.nextafter(2.0**-134, 0.0), 1.5 * 2.0**-133, 2.5 * 2.0**-133,
    float.fromhex("0x1.fcp-127"), float.fromhex("0x1.fep-127"),  # below and at the subnormal/normal tie
    5e-324, -5e-324, 2.0**-1022, 1e-200,
    1 + 2.0**-8, 1 + 3 * 2.0**-8, 1 + 2.0**-8 + 2.0**-40, 1 + 2.0**-8 - 2.0**-40,
]
NAN_PAYLOADS = [0x7FF0000000000001, 0x7FF4000000000000, 0x7FFFFFFFFFFFFFFF, 0xFFF8000000000000, 0xFFF0000000000001,
                0x7FF8000000000001]


@pytest.mark.parametrize("frac_bits", [7, 23])
def test_edges_against_the_oracle(frac_bits):
    fn = bf16.bf16_bits if frac_bits == 7 else bf16.f32_bits
    got = fn(np.array(EDGES, np.float64)).tolist()
    want = [oracle(v, frac_bits) for v in EDGES]
    assert got == want, [(float(v).hex(), hex(g), hex(w)) for v, g, w in zip(EDGES, got, want) if g != w]
    nans = np.array(NAN_PAYLOADS, np.uint64).view(np.float64)
    qnan = (0xFF << frac_bits) | (1 << (frac_bits - 1))
    sign = 1 << (8 + frac_bits)
    assert fn(nans).tolist() == [qnan | (sign if p >> 63 else 0) for p in NAN_PAYLOADS]


def test_named_edges():
    b = lambda v: int(bf16.bf16_bits(v))  # noqa: E731
    assert b(-0.0) == 0x8000 and b(0.0) == 0
    assert b(BF16_MAX) == 0x7F7F and b(float.fromhex("0x1.ffp127")) == 0x7F80 and b(F32_MAX) == 0x7F80
    assert b(np.nextafter(float.fromhex("0x1.ffp127"), 0.0)) == 0x7F7F
    assert b(2.0**-133) == 0x0001 and b(2.0**-134) == 0 and b(np.nextafter(2.0**-134, 1.0)) == 0x0001
    assert b(-(2.0**-134)) == 0x8000  # rounds to -0.0
    assert b(5e-324) == 0 and b(-5e-324) == 0x8000


@pytest.mark.parametrize("frac_bits", [7, 23])
def test_random_bit_patterns_against_the_oracle(frac_bits):
    """float64 patterns with exponents around the target's range (normals, subnormals,
    overflow), random fractions (ties are rare here; the midpoint test has them)."""
    rng = np.random.default_rng(20 + frac_bits)
    n = 1500
    exp = rng.integers(1023 - 160, 1023 + 132, n).astype(np.uint64)
    frac = rng.integers(0, 1 << 52, n, dtype=np.uint64)
    # a third of them with the bits below the target's fraction set to exactly half
    tie = np.arange(n) % 3 == 0
    keep = 52 - frac_bits
    frac[tie] = (frac[tie] >> np.uint64(keep) << np.uint64(keep)) | np.uint64(1 << (keep - 1))
    sign = (rng.integers(0, 2, n).astype(np.uint64)) << np.uint64(63)
    x = (sign | (exp << np.uint64(52)) | frac).view(np.float64)
    fn = bf16.bf16_bits if frac_bits == 7 else bf16.f32_bits
    got = fn(x).tolist()
    for v, g in zip(x.tolist(), got):
        assert g == oracle(v, frac_bits), (v.hex(), hex(g))


@settings(max_examples=300, deadline=None)
@given(st.floats(allow_nan=True, allow_infinity=True, width=64))
def test_hypothesis_floats_against_the_oracle(v):
    assert int(bf16.bf16_bits(v)) == oracle(v, 7)
    assert int(bf16.f32_bits(v)) == oracle(v, 23)


def test_f32_matches_a_hardware_cast_on_finite_values():
    rng = np.random.default_rng(5)
    x = rng.standard_normal(1 << 16) * np.exp2(rng.integers(-160, 130, 1 << 16))
    with np.errstate(over="ignore"):
        want = x.astype(np.float32)
    assert np.array_equal(bf16.to_float32(x).view(np.uint32), want.view(np.uint32))


def test_float32_inputs_round_in_one_step():
    """A float32 input is widened exactly, then rounded once: the same as rounding its value."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal(1 << 14).astype(np.float32)
    assert np.array_equal(bf16.bf16_bits(x), bf16.bf16_bits(x.astype(np.float64)))


def test_double_rounding_through_float32_differs():
    """The bug class: float64 -> f32 -> bf16 (ml_dtypes 0.5's float64 cast) is not one
    rounding. 1 + 2^-8 + 2^-40 lies just above the midpoint of 1 and 1 + 2^-7: one rounding
    gives 1 + 2^-7; through f32 it first becomes the midpoint, which ties to 1."""
    x = 1 + 2.0**-8 + 2.0**-40
    assert int(bf16.bf16_bits(x)) == 0x3F81
    assert int(bf16.bf16_bits(np.float32(x))) == 0x3F80
    rng = np.random.default_rng(7)
    v = rng.standard_normal(1 << 20)
    direct = bf16.bf16_bits(v)
    via_f32 = bf16.bf16_bits(v.astype(np.float32))
    diff = direct != via_f32
    assert 0 < diff.sum() < 200  # about one value in 2^16
    for a, d in zip(v[diff][:20].tolist(), direct[diff][:20].tolist()):
        assert d == oracle(a, 7)


def test_shapes_dtypes_and_views():
    x = np.linspace(-3, 3, 24).reshape(2, 3, 4)
    bits = bf16.bf16_bits(x)
    assert bits.dtype == np.uint16 and bits.shape == (2, 3, 4)
    arr = bf16.to_bfloat16(x)
    assert arr.dtype.name == "bfloat16" and arr.shape == (2, 3, 4) and np.array_equal(arr.view(np.uint16), bits)
    assert bf16.bf16_bits(arr).tolist() == bits.tolist()  # bf16 in, the same bits out
    assert bf16.to_float32(x).dtype == np.float32 and bf16.to_float32(2.5).shape == ()
    assert bf16.bf16_bits(1.0).shape == () and int(bf16.bf16_bits(1.0)) == 0x3F80
    assert np.array_equal(bf16.widen(arr), bf16.bf16_to_float64(bits))
    assert bf16.round_to(x, np.float64) is not x and np.array_equal(bf16.round_to(x, np.float64), x)
    assert bf16.round_to(x, arr.dtype).dtype == arr.dtype
    assert bf16.bf16_bits(np.array([3, -7], np.int32)).tolist() == [0x4040, 0xC0E0]
    with pytest.raises(TypeError, match="real numbers"):
        bf16.bf16_bits(np.array([1j]))
    with pytest.raises(TypeError, match="bf16, f32 or f64"):
        bf16.round_to(x, np.float16)
    with pytest.raises(TypeError, match="uint16"):
        bf16.bf16_to_float64(np.zeros(2, np.int16))
    # struct's IEEE packing agrees with the f32 rounding on a few values
    for v in (1 / 3, -2.5e-40, 3.0e38):
        assert int(bf16.f32_bits(v)) == struct.unpack("<I", struct.pack("<f", v))[0]
