"""build/bin/kdtr_detmath_check (cuda_tests/tools/kdtr_detmath_check.cpp: the host build of
cuda_tests/include/kdtr_detmath.hpp, made by `make build` with -ffp-contract=off) gives
kdtr.detmath's exp, log and fixed_sum bit for bit (NaN: both NaN, any payload).

A fixed sweep (~320k values, each through exp and log): random bit patterns, every biased
exponent 0..2047 with random fractions and both signs, subnormals, the overflow and
underflow edges of exp (EXP_MAX, EXP_MIN, the first subnormal result) and its rint ties
(x = (j + 1/2) ln 2 for every reduction step j, a few ulp either way), 1 and sqrt(2) for
log (the reduction's switch), NaN, infinities, signed zeros, negatives; fixed_sum over
every length to 130 and powers of two around them, with cancellation, signed zeros, NaN
and infinities; and hypothesis lists of floats through all three.
tests/binaries/test_detmath_cpp.py compiles the header itself instead (its own program).

Like the other tests of build/bin, these fail (they do not skip) when the tool has not
been built: run `make build`.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kdtr import detmath

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "build" / "bin" / "kdtr_detmath_check"
U63 = np.uint64(63)


@pytest.fixture(scope="module")
def tool() -> Path:
    if not (TOOL.is_file() and os.access(TOOL, os.X_OK)):
        pytest.fail(f"{TOOL} is missing: run `make build` in {REPO}", pytrace=False)
    return TOOL


def _hex(x) -> list[str]:
    return [f"{int(b):016x}" for b in np.ascontiguousarray(x, np.float64).reshape(-1).view(np.uint64)]


def _ask(tool: Path, requests: list[str]) -> np.ndarray:
    """The tool's answers (uint64 bit patterns), one per request line."""
    r = subprocess.run([str(tool)], input="\n".join(requests) + "\n", capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = r.stdout.split()
    assert len(out) == len(requests), f"{len(out)} answers to {len(requests)} requests"
    return np.array([int(h, 16) for h in out], np.uint64)


def _mismatches(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Per element: True where the bits differ (and not both are NaN)."""
    want = np.ascontiguousarray(want, np.float64)
    same = (got == want.view(np.uint64)) | (np.isnan(got.view(np.float64)) & np.isnan(want))
    return ~same


def _check_elementwise(tool: Path, fn: str, x: np.ndarray) -> None:
    x = np.ascontiguousarray(x, np.float64)
    got = _ask(tool, [f"{fn} {h}" for h in _hex(x)])
    with np.errstate(all="ignore"):
        want = getattr(detmath, fn)(x)
    bad = _mismatches(got, want)
    if bad.any():
        i = np.flatnonzero(bad)[:5]
        rows = ", ".join(f"x={x[j]!r} ({_hex(x[j])[0]}): C++ {int(got[j]):016x}, Python {_hex(want[j])[0]}" for j in i)
        pytest.fail(f"{fn}: {int(bad.sum())} of {len(x)} values differ; first: {rows}", pytrace=False)


def _ulps_around(x: np.ndarray, n: int) -> np.ndarray:
    """x and its n neighbours either way (by bit pattern, for finite positive or negative x)."""
    x = np.ascontiguousarray(x, np.float64)
    steps = np.arange(-n, n + 1, dtype=np.int64)
    b = x.view(np.int64)[:, None] + steps[None, :]
    return b.reshape(-1).view(np.float64)


def _sweep() -> np.ndarray:
    rng = np.random.default_rng(20261202)
    parts = [rng.integers(0, 2**64 - 1, size=100_000, dtype=np.uint64, endpoint=True).view(np.float64)]
    # every biased exponent (0: zeros and subnormals, 2047: infinities and NaN), both signs
    exps = np.repeat(np.arange(2048, dtype=np.uint64), 40)
    frac = rng.integers(0, 2**52, size=exps.size, dtype=np.uint64)
    sign = rng.integers(0, 2, size=exps.size, dtype=np.uint64) << U63
    parts.append((sign | (exps << np.uint64(52)) | frac).view(np.float64))
    # subnormals: the smallest ones, random ones, the largest ones
    sub = np.concatenate([np.arange(1, 200, dtype=np.uint64), rng.integers(1, 2**52, size=5000, dtype=np.uint64),
                          np.uint64(2**52) - np.arange(1, 200, dtype=np.uint64)])
    parts += [sub.view(np.float64), (sub | (np.uint64(1) << U63)).view(np.float64)]
    # exp's edges: overflow, underflow to 0, the first subnormal and the first normal result
    edges = np.array([detmath.EXP_MAX, detmath.EXP_MIN, np.log(2.0) * -1022, np.log(2.0) * -1074,
                      np.log(2.0) * 1024, np.log(2.0) * -1075])
    parts.append(_ulps_around(edges, 300))
    parts += [np.linspace(700.0, 720.0, 10_001), np.linspace(-760.0, -700.0, 20_001), np.linspace(-50, 50, 20_001)]
    # rint ties of the reduction: x = (j + 1/2) ln 2 for every j the clamp allows
    j = np.arange(-1076, 1025, dtype=np.float64)
    parts.append(_ulps_around((j + 0.5) * detmath.LN2_HI, 3))
    parts.append(_ulps_around(j * detmath.LN2_HI, 1))
    # log: around 1 (f = m - 1 tiny), sqrt(2) and sqrt(2)/2 (the switch m > SQRT2), powers of two
    parts.append(_ulps_around(np.array([1.0, detmath.SQRT2, detmath.SQRT2 / 2, 2.0, 0.5]), 2000))
    parts += [1.0 + np.linspace(-1e-3, 1e-3, 10_001), np.exp2(np.arange(-1074, 1024, dtype=np.float64))]
    parts.append(rng.uniform(0.0, 4.0, size=10_000))
    # small integers and their logs (the drafter's log-softmax sees sums of exps of logits)
    parts.append(np.arange(-2000, 2001, dtype=np.float64) / 8)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 5e-324, -5e-324, 2.2250738585072014e-308,
                        -2.2250738585072014e-308, 1.7976931348623157e308, -1.7976931348623157e308, 1.0, -1.0])
    parts.append(special)
    nan_payloads = (np.uint64(0x7FF0000000000001), np.uint64(0x7FF8000000000001), np.uint64(0xFFF4000000000000))
    parts.append(np.array(nan_payloads, np.uint64).view(np.float64))
    return np.concatenate(parts)


SWEEP = _sweep()


def test_sweep_covers_what_it_says():
    x = SWEEP
    assert len(x) > 250_000
    e = (x.view(np.uint64) >> np.uint64(52)) & np.uint64(0x7FF)
    assert len(np.unique(e)) == 2048 and (x < 0).any() and np.isnan(x).any() and np.isinf(x).any()
    assert ((np.abs(x) < 2.0**-1022) & (x != 0)).sum() > 10_000


@pytest.mark.parametrize("fn", ["exp", "log"])
def test_sweep_bits_equal_kdtr_detmath(tool, fn):
    _check_elementwise(tool, fn, SWEEP)


def _sum_cases() -> list[np.ndarray]:
    rng = np.random.default_rng(26)
    cases = [rng.standard_normal(n) * 10.0 ** rng.integers(-8, 9, size=n) for n in range(131)]
    cases += [rng.standard_normal(n) for n in (255, 256, 257, 511, 512, 513, 1023, 1024, 1025, 5000)]
    # the drafter's case: exps of shifted logits, positive, many orders of magnitude
    cases += [detmath.exp(rng.standard_normal(n) * 8 - 20) for n in (3, 17, 100, 1000, 32_000)]
    cases += [rng.integers(0, 2**64 - 1, size=n, dtype=np.uint64, endpoint=True).view(np.float64)
              for n in (1, 2, 3, 5, 8, 33)]  # NaN and inf among them
    cases += [np.array(c, np.float64) for c in (
        [1e16, 1.0, -1e16, 1.0], [1.0, 1e16, 1.0, -1e16, 1.0], [-0.0], [-0.0, -0.0, -0.0], [0.0, -0.0, -0.0],
        [-0.0, 0.0], [-0.0, -0.0, 0.0], [np.inf, -np.inf, 1.0], [np.inf, 1.0, 2.0], [-np.inf, 5e-324],
        [np.nan, 1.0, 2.0], [1.7976931348623157e308] * 3, [1.7976931348623157e308, -1.7976931348623157e308, 1.0],
        [5e-324] * 7, [0.1] * 10, [0.1] * 100)]
    # signs of zero in every position of short arrays
    for n in range(1, 7):
        for mask in range(1 << n):
            cases.append(np.array([-0.0 if mask >> i & 1 else 0.0 for i in range(n)]))
    return cases


def _check_sums(tool: Path, cases: list[np.ndarray]) -> None:
    got = _ask(tool, [" ".join([f"sum {len(a)}", *_hex(a)]) for a in cases])
    with np.errstate(all="ignore"):
        want = np.array([detmath.fixed_sum(np.asarray(a, np.float64)) for a in cases])
    bad = _mismatches(got, want)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        pytest.fail(f"fixed_sum: {int(bad.sum())} of {len(cases)} arrays differ; first: length {len(cases[i])}, "
                    f"C++ {int(got[i]):016x}, Python {_hex(want[i])[0]} ({cases[i][:8]!r}...)", pytrace=False)


def test_fixed_sum_bits_equal_kdtr_detmath(tool):
    _check_sums(tool, _sum_cases())


def test_malformed_requests_are_refused(tool):
    for text in ("exp 3ff0\nlog zz\n", "sum 2 3ff0000000000000\n", "sum -1\n", "pow 0\n", "exp 1 2\n",
                 "exp 00000000000000000\n"):
        r = subprocess.run([str(tool)], input=text, capture_output=True, text=True, timeout=30)
        assert r.returncode == 2 and r.stderr.startswith("kdtr_detmath_check: line "), (text, r)


@settings(max_examples=60)
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True), max_size=200))
def test_hypothesis_floats_through_exp_log_and_sum(tool, xs):
    x = np.array(xs, np.float64)
    for fn in ("exp", "log"):
        _check_elementwise(tool, fn, x)
    _check_sums(tool, [x, x[: len(x) // 2], x[::-1]])
