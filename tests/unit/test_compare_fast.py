"""kdtr.compare's fast paths (identical outputs cost about a byte comparison) against the element-wise comparison.

* Identical bytes: ``compare`` returns at the cost of a byte comparison, and its record
  (verdict, every figure, ``to_json()``) equals the one of the element-wise comparison
  (``_compare_elements``), for every dtype and contract, NaN, infinities and -0.0
  included; identical NaNs still fail ``allclose`` with ``nan=fail``.
* Other outputs: the verdict and the error figures are computed once, on the elements that
  can matter; every record equals the one of the comparison as it was before (a frozen copy,
  ``_reference_compare`` below).
"""

from __future__ import annotations

import json
import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kdtr.compare as kc
from kdtr.compare import (
    _ABS_MARGIN,
    _REL_MARGIN,
    Element,
    TensorResult,
    _compare_elements,
    _decide_near_bound,
    _fmt,
    _is_float,
    _unravel,
    compare,
    ulp_distance,
)
from kdtr.contract import EXACT, Contract
from kdtr.dtypes import code_of_dtype, name_of_dtype

inf, nan = math.inf, math.nan
BF16 = np.dtype(ml_dtypes.bfloat16)
FLOATS = [np.dtype(np.float16), BF16, np.dtype(np.float32), np.dtype(np.float64)]
INTS = [np.dtype(t) for t in (np.uint8, np.int8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64)]
ALL = [np.dtype(np.bool_)] + INTS + FLOATS
RAW = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def record(r: TensorResult) -> str:
    """Everything a record holds, NaN-safe (``to_json`` writes non-finite figures as strings)."""
    return json.dumps(r.to_json(), sort_keys=True, allow_nan=False) + "\n" + r.summary()


# ---- the comparison before its fast paths, frozen as an oracle ---------------------------------
# (kdtr/compare.py at f371b26: ulp_distance, _allclose_bad, _fill_stats and compare's body,
# unchanged but for names; the helpers it calls, _decide_near_bound, _fmt and _unravel, are
# unchanged in kdtr.compare.)


def _ref_ordered_bits(a):
    width = a.dtype.itemsize * 8
    ints = a.view({16: np.int16, 32: np.int32, 64: np.int64}[width]).astype(np.int64)
    magnitude = ints & np.int64((1 << (width - 1)) - 1)
    return np.where(ints < 0, -magnitude, magnitude)


def _ref_ulp_distance(expected, actual):
    e, a = _ref_ordered_bits(expected), _ref_ordered_bits(actual)
    eu, au = e.view(np.uint64), a.view(np.uint64)
    return np.where(a >= e, au - eu, eu - au)


def _ref_allclose_bad(exp, act, c):
    with np.errstate(all="ignore"):
        e = exp.reshape(-1).astype(np.float64)
        a = act.reshape(-1).astype(np.float64)
        e_nan, a_nan = np.isnan(e), np.isnan(a)
        fin = np.isfinite(e) & np.isfinite(a)
        bad = ~fin & (e != a)
        if c.nan == "equal":
            bad &= ~(e_nan & a_nan)
        else:
            bad |= e_nan | a_nan
        ne = fin & (e != a)
        if ne.any():
            d = np.abs(a - e)
            t = c.atol + c.rtol * np.abs(e)
            hi = t * (1.0 + _REL_MARGIN) + _ABS_MARGIN
            lo = t * (1.0 - _REL_MARGIN) - _ABS_MARGIN
            sure_fail = (d >= hi) & np.isfinite(d) & np.isfinite(hi)
            sure_pass = (d <= lo) & np.isfinite(lo)
            bad |= ne & sure_fail
            unsure = np.flatnonzero(ne & ~sure_fail & ~sure_pass)
            if unsure.size:
                _decide_near_bound(e, a, c, unsure, bad)
        if c.max_ulp >= 0:
            ulp = _ref_ulp_distance(exp.reshape(-1), act.reshape(-1))
            bad |= fin & (ulp > np.uint64(c.max_ulp))
    return bad


def _ref_argworst(v, mask):
    if v.size == 0 or (mask is not None and not mask.any()):
        return None
    if v.dtype.kind == "f":
        w = v if mask is None else np.where(mask, v, -np.inf)
        isn = np.isnan(w)
        return int(np.argmax(isn)) if isn.any() else int(np.argmax(w))
    w = v if mask is None else np.where(mask, v, 0)
    k = int(np.argmax(w))
    if mask is not None and not mask[k]:
        k = int(np.argmax(mask))
    return k


def _ref_fill_stats(res, exp, act, bad):
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
            absd = np.where((e == a) | (e_nan & a_nan), 0.0, np.abs(a - e))
            rel = np.where(absd == 0.0, 0.0, np.where(np.isinf(e) & ~np.isnan(absd), np.inf, absd / np.abs(e)))
            k = _ref_argworst(absd, cand)
            if k is not None:
                res.max_abs, res.max_abs_index = float(absd[k]), _unravel(k, exp.shape)
                k = _ref_argworst(rel, cand)
                res.max_rel, res.max_rel_index = float(rel[k]), _unravel(k, exp.shape)
            ulp_mask = fin if cand is None else (cand & fin)
            k = _ref_argworst(_ref_ulp_distance(ef, af), ulp_mask)
            if k is not None:
                u = int(_ref_ulp_distance(ef[k : k + 1], af[k : k + 1])[0])
                res.max_ulp, res.max_ulp_index = u, _unravel(k, exp.shape)
        else:
            if exp.dtype.kind == "i":
                e, a = ef.astype(np.int64), af.astype(np.int64)
                eu, au = e.view(np.uint64), a.view(np.uint64)
            else:
                e, a = ef.astype(np.uint64), af.astype(np.uint64)
                eu, au = e, a
            absd = np.where(a >= e, au - eu, eu - au)
            rel = np.where(absd == 0, 0.0, absd.astype(np.float64) / np.abs(e.astype(np.float64)))
            k = _ref_argworst(absd, cand)
            if k is not None:
                res.max_abs, res.max_abs_index = int(absd[k]), _unravel(k, exp.shape)
                k = _ref_argworst(rel, cand)
                res.max_rel, res.max_rel_index = float(rel[k]), _unravel(k, exp.shape)


def _ref_exact_bad(exp, act):
    w = exp.dtype.itemsize
    e, a = exp.reshape(-1), act.reshape(-1)
    return e.view(RAW[w]) != a.view(RAW[w])


def _reference_compare(name, expected, actual, contract):
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
    exp = expected if expected.flags.c_contiguous else expected.copy()
    act = actual if actual.flags.c_contiguous else actual.copy()
    bad = _ref_exact_bad(exp, act) if contract.kind == "exact" else _ref_allclose_bad(exp, act, contract)
    res.n_mismatch = int(np.count_nonzero(bad))
    res.ok = res.n_mismatch == 0
    _ref_fill_stats(res, exp, act, bad)
    flat_bad = np.flatnonzero(bad)[: kc.MAX_SHOWN]
    ef, af = exp.reshape(-1), act.reshape(-1)
    w = exp.dtype.itemsize
    er = ef.view(RAW[w]) if _is_float(exp.dtype) else None
    ar = af.view(RAW[w]) if _is_float(exp.dtype) else None
    res.first = [Element(_unravel(int(k), exp.shape), _fmt(ef, er, int(k)), _fmt(af, ar, int(k))) for k in flat_bad]
    return res


# ---- strategies ----------------------------------------------------------------------------------


def special_bits(dt: np.dtype) -> list[int]:
    """Bit patterns that matter: zeros of both signs, infinities, NaNs (quiet, signalling,
    negative, with payloads), the extremes, the smallest subnormal, one."""
    w = dt.itemsize * 8
    if dt.kind == "b":
        return [0, 1]
    if dt.kind in "iu":
        top = 1 << w
        return [0, 1, top - 1, top >> 1, (top >> 1) - 1, (top >> 1) + 1, 2]  # incl. int min / max
    raw = RAW[dt.itemsize]
    inf_bits = int(np.array(np.inf, dt).view(raw))
    sign = 1 << (w - 1)
    mantissa = (sign - 1) ^ inf_bits
    quiet = inf_bits | (mantissa + 1) >> 1  # the top mantissa bit set
    one = int(np.array(1.0, dt).view(raw))
    big = int(np.array(ml_dtypes.finfo(dt).max, dt).view(raw))
    return [0, sign, inf_bits, inf_bits | sign, quiet, quiet | sign, inf_bits | 1, inf_bits | 1 | sign,
            quiet | 5, big, big | sign, 1, 1 | sign, one, one | sign]


def values(dt: np.dtype, n: int):
    w = dt.itemsize * 8
    if dt.kind == "b":
        bits = st.integers(0, 1)
    else:
        bits = st.one_of(st.sampled_from(special_bits(dt)), st.integers(0, (1 << w) - 1))
    return st.lists(bits, min_size=n, max_size=n)


def make(dt: np.dtype, bits: list[int], shape: tuple[int, ...]) -> np.ndarray:
    raw = np.array(bits, dtype=RAW[dt.itemsize]) if dt.kind != "b" else np.array(bits, np.uint8)
    return raw.view(dt).reshape(shape)


DTYPES = st.one_of(st.sampled_from(FLOATS), st.sampled_from(FLOATS), st.sampled_from(ALL))  # floats weighted up


@st.composite
def shapes(draw):
    nd = draw(st.integers(0, 3))
    return tuple(draw(st.lists(st.sampled_from([1, 2, 3, 4, 5, 7, 1, 2, 3, 0]), min_size=nd, max_size=nd)))


TOLS = [0.0, 1e-6, 0.5, 1.0, 1e300, 5e-324]


@st.composite
def contracts(draw, dt):
    # integers: mostly exact (an allclose contract on them is a problem record, checked too)
    exact_weights = [True, True, True, True, True, False] if dt.kind in "biu" else [True, False, False, False]
    if draw(st.sampled_from(exact_weights)):
        return EXACT
    return Contract("allclose", atol=draw(st.sampled_from(TOLS)), rtol=draw(st.sampled_from(TOLS)),
                    max_ulp=draw(st.sampled_from([-1, -1, 0, 0, 1, 3, 2**62])),
                    nan=draw(st.sampled_from(["equal", "fail"])))


@st.composite
def identical_cases(draw):
    dt = draw(DTYPES)
    shape = draw(shapes())
    n = int(np.prod(shape)) if shape else 1
    e = make(dt, draw(values(dt, n)), shape)
    return e, draw(contracts(dt))


@st.composite
def differing_cases(draw):
    dt = draw(DTYPES)
    shape = draw(shapes())
    n = int(np.prod(shape)) if shape else 1
    ebits = draw(values(dt, n))
    abits = list(ebits)
    w = dt.itemsize * 8
    top = (1 << w) - 1 if dt.kind != "b" else 1
    other = values(dt, 1)
    for i in range(n):
        how = draw(st.sampled_from(["same", "same", "near", "other", "sign"]))
        if how == "near":  # a few ULPs (floats) or units (integers) away
            abits[i] = min(max(ebits[i] + draw(st.integers(-3, 3)), 0), top)
        elif how == "other":
            abits[i] = draw(other)[0]
        elif how == "sign" and dt.kind != "b":  # the sign bit (int min against 0 for integers)
            abits[i] = ebits[i] ^ (1 << (w - 1))
    if n and abits == ebits:  # at least one element differs in its bits
        i = draw(st.integers(0, n - 1))
        abits[i] = ebits[i] ^ (1 << draw(st.integers(0, w - 1 if dt.kind != "b" else 0)))
    return make(dt, ebits, shape), make(dt, abits, shape), draw(contracts(dt))


# ---- identical bytes -----------------------------------------------------------------------------


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(identical_cases())
def test_property_identical_bytes_fast_equals_elementwise(case) -> None:
    e, c = case
    slow = _compare_elements("t", e, e.copy(), c)
    assert record(compare("t", e, e.copy(), c)) == record(slow)
    assert record(compare("t", e, e, c)) == record(slow)  # the same array on both sides
    assert record(slow) == record(_reference_compare("t", e, e.copy(), c))
    if e.ndim >= 1 and e.shape[-1] > 1:  # a non-contiguous output
        a = np.ascontiguousarray(e[..., ::-1])[..., ::-1]
        assert record(compare("t", e, a, c)) == record(slow)


@pytest.mark.parametrize("dt", FLOATS, ids=["f16", "bf16", "f32", "f64"])
def test_identical_nans_fail_nan_fail_for_every_payload(dt) -> None:
    raw = RAW[dt.itemsize]
    inf_bits = int(np.array(np.inf, dt).view(raw))
    sign = 1 << (dt.itemsize * 8 - 1)
    for nb in (inf_bits | 1, inf_bits | 1 | sign, (sign - 1), sign | (sign - 1)):  # signalling, negative, all ones
        x = np.array([0x0, nb, 0x0], raw).view(dt)
        with np.errstate(invalid="ignore"):
            assert np.isnan(x.astype(np.float64)[1])
        r = compare("t", x, x.copy(), Contract("allclose", atol=1e300, rtol=1e300, nan="fail"))
        assert not r.ok and r.n_mismatch == 1 and r.first[0].index == [1] and r.n_nonfinite == 1
        assert record(r) == record(_reference_compare("t", x, x.copy(), Contract("allclose", atol=1e300, rtol=1e300)))
        assert compare("t", x, x.copy(), Contract("allclose", nan="equal")).ok
        assert compare("t", x, x.copy(), EXACT).ok


@pytest.mark.parametrize("dt", FLOATS, ids=["f16", "bf16", "f32", "f64"])
def test_identical_infinities_and_signed_zeros_pass_every_contract(dt) -> None:
    x = np.array([-inf, inf, -0.0, 0.0], dt)
    for c in (EXACT, Contract("allclose"), Contract("allclose", max_ulp=0), Contract("allclose", nan="equal")):
        r = compare("t", x, x.copy(), c)
        assert r.ok and r.max_abs == 0.0 and r.max_abs_index == [0]
        assert r.max_ulp == 0 and r.max_ulp_index == [2]  # the first finite pair
        assert record(r) == record(_compare_elements("t", x, x.copy(), c))
    r = compare("t", x[:2], x[:2].copy(), EXACT)
    assert r.ok and r.max_ulp is None and r.max_ulp_index is None  # no finite pair at all


def test_identical_records_by_kind() -> None:
    r = compare("ids", np.arange(6, dtype=np.int32).reshape(2, 3), np.arange(6, dtype=np.int32).reshape(2, 3), EXACT)
    got = (r.ok, r.n_mismatch, r.n_total, r.max_abs, r.max_abs_index, r.max_rel, r.max_ulp)
    assert got == (True, 0, 6, 0, [0, 0], 0.0, None)
    assert isinstance(r.max_abs, int)
    f = compare("x", np.ones(3, np.float32), np.ones(3, np.float32), Contract("allclose", atol=1e-5))
    assert (f.max_abs, f.max_rel, f.max_ulp, f.max_ulp_index) == (0.0, 0.0, 0, [0]) and isinstance(f.max_abs, float)
    z = compare("x", np.zeros((0, 2), BF16), np.zeros((0, 2), BF16), EXACT)
    assert z.ok and z.max_abs is None and z.max_abs_index is None
    s = compare("x", np.array(nan, np.float16), np.array(nan, np.float16), Contract("allclose", nan="equal"))
    assert s.ok and s.max_abs_index == [] and s.max_ulp is None


@pytest.mark.parametrize("dt", [np.dtype(np.uint8), np.dtype(np.int32), np.dtype(np.float32), BF16], ids=str)
def test_identical_bytes_skip_the_elementwise_comparison(monkeypatch, dt) -> None:
    def boom(*args, **kwargs):
        raise AssertionError("element-wise comparison of identical bytes")

    x = (np.arange(1 << 16) % 251).astype(dt)
    if dt.kind not in "iu":
        x[:3] = [inf, -inf, -0.0]  # no NaN: nan=fail passes without the element-wise comparison
    monkeypatch.setattr(kc, "_exact_bad", boom)
    monkeypatch.setattr(kc, "_allclose_bad", boom)
    monkeypatch.setattr(kc, "_fill_stats", boom)
    c = EXACT if dt.kind in "iu" else Contract("allclose", atol=1e-5, nan="fail")
    r = compare("t", x, x.copy(), c)
    assert r.ok and r.max_ulp_index == (None if dt.kind in "iu" else [2])  # -0.0 is the first finite
    y = x.copy()
    y[-1] = y[0]  # one element differs: the element-wise comparison runs
    with pytest.raises(AssertionError, match="element-wise"):
        compare("t", x, y, c)


def test_byte_comparison_of_odd_sizes_and_offsets() -> None:
    buf = np.zeros(64, np.uint8)
    for n in (1, 3, 5, 7, 9, 17):  # sizes not a multiple of 8, 4 or 2 bytes; unaligned starts
        e = buf[1 : 1 + n]
        a = buf[9 : 9 + n].copy()
        assert compare("t", e, a, EXACT).ok
        a[-1] = 1
        r = compare("t", e, a, EXACT)
        assert r.n_mismatch == 1 and r.first[0].index == [n - 1]
    h = np.zeros(3, np.float16)  # 6 bytes: compared as 3 u16
    g = h.copy()
    g[2] = -0.0
    assert compare("t", h, g, EXACT).n_mismatch == 1


# ---- other outputs: the same records as before -----------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(FLOATS).flatmap(lambda dt: st.tuples(st.just(dt), values(dt, 12), values(dt, 12))))
def test_property_ulp_distance_equals_the_reference(case) -> None:
    dt, eb, ab = case
    e, a = make(dt, eb, (3, 4)), make(dt, ab, (3, 4))
    got = ulp_distance(e, a)
    assert got.dtype == np.uint64 and got.shape == (3, 4)
    assert np.array_equal(got, _ref_ulp_distance(e, a))
    assert np.array_equal(ulp_distance(e[1, 2], a[1, 2]), _ref_ulp_distance(e[1, 2], a[1, 2]))  # 0-d
    assert np.array_equal(ulp_distance(e[:, ::2], a[:, ::2]), _ref_ulp_distance(e[:, ::2], a[:, ::2]))  # strided



@pytest.mark.slow  # 800 hypothesis examples
@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(differing_cases())
def test_property_records_equal_the_reference(case) -> None:
    e, a, c = case
    want = record(_reference_compare("t", e, a, c))
    assert record(compare("t", e, a, c)) == want
    assert record(_compare_elements("t", e, a, c)) == want


@pytest.mark.parametrize("dt", FLOATS, ids=["f16", "bf16", "f32", "f64"])
def test_passing_output_with_differing_values(dt) -> None:
    """No mismatch but values differ: the worst errors are over every element, found among
    the differing ones (element 0 differs here, so the index is not the default)."""
    e = np.array([1.0, 2.0, 4.0, 8.0, inf, nan], dt)
    a = e.copy()
    raw = a.view(RAW[dt.itemsize])
    raw[0] += 1
    raw[3] += 2
    c = Contract("allclose", atol=0.1, rtol=0.1, max_ulp=2, nan="equal")
    r = compare("t", e, a, c)
    assert r.ok and r.n_mismatch == 0
    assert r.max_abs_index == [3] and r.max_rel_index == [3] and (r.max_ulp, r.max_ulp_index) == (2, [3])
    assert record(r) == record(_reference_compare("t", e, a, c))
    b = e.copy()
    b.view(RAW[dt.itemsize])[0] += 1  # only element 0 differs
    r = compare("t", e, b, c)
    assert r.max_abs_index == [0] and r.max_ulp == 1 and record(r) == record(_reference_compare("t", e, b, c))


def test_passing_output_with_only_signed_zeros_differing() -> None:
    e = np.array([inf, 0.0, 1.0], np.float32)
    a = np.array([inf, -0.0, 1.0], np.float32)
    c = Contract("allclose", max_ulp=0)
    r = compare("t", e, a, c)  # bytes differ, values do not: errors 0 at element 0, ULP at the first finite
    assert r.ok and (r.max_abs, r.max_abs_index, r.max_ulp, r.max_ulp_index) == (0.0, [0], 0, [1])
    assert record(r) == record(_reference_compare("t", e, a, c))


def test_mismatch_figures_over_the_mismatching_elements() -> None:
    e = np.array([1e6, 1.0, 2.0, 0.0, 5.0, -inf], np.float32)
    a = np.array([1e6 + 900, 1.5, nan, 0.02, 5.0, inf], np.float32)
    for c in (Contract("allclose", atol=0.01, rtol=1e-3, max_ulp=10**9), EXACT):
        r = compare("t", e, a, c)
        assert record(r) == record(_reference_compare("t", e, a, c))
    r = compare("t", e, a, Contract("allclose", atol=0.01, rtol=1e-3, max_ulp=10**9))
    assert [el.index[0] for el in r.first] == [1, 2, 3, 5] and r.n_nonfinite == 2
    assert r.max_abs_index == [2] and math.isnan(r.max_abs) and r.max_ulp_index in ([1], [3])
    ints = compare("i", np.array([5, -(2**63), 7], np.int64), np.array([5, 2**63 - 1, 8], np.int64), EXACT)
    assert (ints.max_abs, ints.max_abs_index, ints.max_rel_index) == (2**64 - 1, [1], [1])
    assert record(ints) == record(_reference_compare("i", np.array([5, -(2**63), 7], np.int64),
                                                     np.array([5, 2**63 - 1, 8], np.int64), EXACT))


def test_large_tensors_equal_the_reference() -> None:
    """Sizes where the vectorized paths (not the per-element fallbacks) do the work."""
    rng = np.random.default_rng(3)
    n = 1 << 15
    for dt in FLOATS:
        e = rng.standard_normal(n).astype(dt)
        a = e.copy()
        ar = a.view(RAW[dt.itemsize])
        ar[::7] += 1  # 1 ULP off
        ar[::1009] += 40
        a[123] = nan
        e[777] = inf
        for c in (EXACT, Contract("allclose", atol=1e-3, rtol=1e-2),
                  Contract("allclose", atol=1.0, max_ulp=2, nan="equal"), Contract("allclose", atol=10.0, rtol=1.0)):
            assert record(compare("t", e, a, c)) == record(_reference_compare("t", e, a, c)), (dt, c)
        e[777] = 1.0
        b = e.copy()
        b.view(RAW[dt.itemsize])[::3] += 1
        c = Contract("allclose", atol=1.0, rtol=1.0)
        r = compare("t", e, b, c)  # passes with differing values
        assert r.ok and record(r) == record(_reference_compare("t", e, b, c))
    for dt in INTS:
        e = rng.integers(0, 100, n).astype(dt)
        a = e.copy()
        a[::513] += 1
        assert record(compare("t", e, a, EXACT)) == record(_reference_compare("t", e, a, EXACT))
