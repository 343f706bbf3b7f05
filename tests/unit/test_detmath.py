"""kdtr.detmath: host-independent exp, log, fixed-order sums and exact dot products.

Accuracy against high-precision oracles (decimal, math.fsum); the properties that make the
bits host-independent: every slice product is an exact integer (equal to an int64 matmul),
results do not depend on memory layout or block size, and the special values follow IEEE.
"""

from __future__ import annotations

import math
from decimal import Decimal, localcontext

import numpy as np
import pytest

from kdtr import detmath as dm
from kdtr.bf16 import to_bfloat16, widen


def ulps(a, b) -> np.ndarray:
    return np.abs(np.asarray(a, np.float64).view(np.int64) - np.asarray(b, np.float64).view(np.int64))


def test_exp_within_2_ulp_of_the_exact_value():
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.uniform(-745, 709.7, 1500), rng.uniform(-1, 1, 800), rng.uniform(-40, 0, 800),
                        [-745.0, -740.0, -708.5, 709.7, 1e-300, -1e-18, 0.5, 1.0]])
    with localcontext() as ctx:
        ctx.prec = 40
        want = np.array([float(Decimal(v).exp()) for v in x.tolist()])
    assert ulps(dm.exp(x), want).max() <= 2


def test_exp_special_values():
    got = dm.exp(np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 710.0, -746.0, 1e308, -1e308]))
    assert np.isnan(got[0]) and got[1] == np.inf and got[2] == 0.0 and got[3] == 1.0 and got[4] == 1.0
    assert got[5] == np.inf and got[6] == 0.0 and got[7] == np.inf and got[8] == 0.0
    assert dm.exp(-745.0) == 5e-324 and 0 < dm.exp(-740.0) < 2.0**-1022  # subnormal results
    assert dm.exp(2.5).shape == () and dm.exp(np.zeros((2, 3))).shape == (2, 3)


def test_log_within_2_ulp_of_the_exact_value():
    rng = np.random.default_rng(2)
    x = np.concatenate([np.exp(rng.uniform(-700, 700, 1500)), rng.uniform(0.5, 2, 1000), rng.uniform(0.99, 1.01, 500),
                        [5e-324, 1e-310, 2.0**-1022, 1.0, 2.0, 1e-30, 1.7976931348623157e308]])
    with localcontext() as ctx:
        ctx.prec = 40
        want = np.array([float(Decimal(v).ln()) for v in x.tolist()])
    assert ulps(dm.log(x), want).max() <= 2


def test_log_special_values():
    got = dm.log(np.array([np.nan, np.inf, -1.0, -np.inf, 0.0, -0.0, 1.0]))
    assert np.isnan(got[0]) and got[1] == np.inf and np.isnan(got[2]) and np.isnan(got[3])
    assert got[4] == -np.inf and got[5] == -np.inf and got[6] == 0.0
    assert dm.log(2.0).shape == ()


def pairwise_reference(v: list[float]) -> float:
    """The documented order, in plain Python floats: pad to a power of two with -0.0, then
    add the first half to the second half until one element is left."""
    size = 1 << max(0, (len(v) - 1).bit_length())
    v = v + [-0.0] * (size - len(v))
    while len(v) > 1:
        h = len(v) // 2
        v = [a + b for a, b in zip(v[:h], v[h:])]
    return v[0]


def test_fixed_sum_is_the_documented_order_whatever_the_layout():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 37)) * np.exp2(rng.integers(-30, 30, (6, 37)))
    want = np.array([pairwise_reference(row) for row in x.tolist()])
    assert np.array_equal(dm.fixed_sum(x).view(np.uint64), want.view(np.uint64))
    assert np.array_equal(dm.fixed_sum(np.asfortranarray(x)), want)  # layout does not matter
    assert np.array_equal(dm.fixed_sum(x.T.copy(), axis=0), want)
    assert dm.fixed_sum(x, keepdims=True).shape == (6, 1)
    assert dm.fixed_sum(np.zeros((3, 0))).tolist() == [0.0, 0.0, 0.0]
    assert np.signbit(dm.fixed_sum(np.array([-0.0, -0.0, -0.0])))  # -0.0 padding is neutral
    s = dm.fixed_sum(np.array([[1.0, np.nan, 2.0], [np.inf, 1.0, -np.inf], [np.inf, 3.0, 1.0]]))
    assert np.isnan(s[0]) and np.isnan(s[1]) and s[2] == np.inf


def test_slice_bits():
    assert dm.slice_bits(576) == 21 and dm.slice_bits(4161) == 20 and dm.slice_bits(1) == 26
    for k in (1, 2, 3, 64, 65, 576, 4161, 1 << 20):
        w = dm.slice_bits(k)
        assert 2 * w + max(1, math.ceil(math.log2(k))) <= 53


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_matmul_exact_slices_are_exact_integers_and_reconstruct_the_input(dtype):
    rng = np.random.default_rng(4)
    a = rng.standard_normal((40, 576)) * np.exp2(rng.integers(-12, 12, (40, 1)))
    b = rng.standard_normal((576, 30))
    a = widen(to_bfloat16(a)) if dtype == "bf16" else a.astype(np.float32).astype(np.float64)
    b = widen(to_bfloat16(b)) if dtype == "bf16" else b.astype(np.float32).astype(np.float64)
    w = dm.slice_bits(576)
    sa, sb = dm.Sliced(a, w, "left"), dm.Sliced(b, w, "right")
    # the slices rebuild the inputs exactly (3 slices of 21 bits hold their spread)
    ra = sum(s * dm.pow2(sa.exponent - (i + 1) * w)[:, None] for i, s in sa.slices)
    assert np.array_equal(ra, a)
    for _, x in sa.slices:
        for _, y in sb.slices:
            assert (np.abs(x) <= 2**w).all() and (x == np.trunc(x)).all()
            # every BLAS product equals the integer product: no rounding to reorder
            assert np.array_equal(x @ y, (x.astype(np.int64) @ y.astype(np.int64)).astype(np.float64))


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_matmul_exact_is_the_exact_dot_product_to_a_few_roundings(dtype):
    rng = np.random.default_rng(5)
    a = rng.standard_normal((25, 300))
    b = rng.standard_normal((300, 20))
    if dtype == "bf16":
        a, b = widen(to_bfloat16(a)), widen(to_bfloat16(b))
    else:
        a, b = a.astype(np.float32).astype(np.float64), b.astype(np.float32).astype(np.float64)
    got = dm.matmul_exact(a, b)
    exact = np.array([[math.fsum((a[i] * b[:, j]).tolist()) for j in range(20)] for i in range(25)])
    assert ulps(got, exact).max() <= 4
    # the same bits whatever the layout of the operands and the block size
    assert np.array_equal(dm.matmul_exact(np.asfortranarray(a), np.asfortranarray(b)), got)
    assert np.array_equal(dm.matmul_exact(a, b, block_bytes=8 * 20 * 3), got)
    assert np.array_equal(np.concatenate([dm.matmul_exact(a[:7], b), dm.matmul_exact(a[7:], b)]), got)


def test_matmul_exact_zeros_tiny_and_bad_input():
    z = dm.matmul_exact(np.zeros((3, 4)), np.ones((4, 2)))
    assert np.array_equal(z, np.zeros((3, 2))) and not np.signbit(z).any()
    neg = dm.matmul_exact(-np.ones((2, 3)), np.zeros((3, 2)))  # sums of -0.0 products: +0.0
    assert not np.signbit(neg).any()
    # weights in [0, 1] with subnormal entries: those far below the row's maximum become 0
    p = np.array([[1.0, 5e-324, 1e-300, 0.5]])
    v = np.array([[1.0], [2.0], [3.0], [4.0]])
    assert dm.matmul_exact(p, v, max_slices=2).tolist() == [[3.0]]
    assert dm.matmul_exact(np.zeros((0, 4)), v).shape == (0, 1)
    with pytest.raises(ValueError, match="non-finite"):
        dm.matmul_exact(np.array([[np.nan]]), np.ones((1, 1)))
    with pytest.raises(ValueError, match="2\\^-400"):
        dm.matmul_exact(np.array([[1e300]]), np.ones((1, 1)))
    with pytest.raises(ValueError, match="pow2"):
        dm.pow2(1024)
