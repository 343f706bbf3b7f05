"""NaN and infinities inside the valid region of verify_attn.

The rule (docs/ops/verify_attn.md, "NaN and infinities"): emptiness comes from the
visible-key set; a row with a visible key is the max-subtracted formula in IEEE arithmetic
with NaN propagating through the max -- a NaN or +inf visible score, or visible scores that
are all -inf, make lse and every out element NaN; a -inf score among finite ones has
weight 0 and a weight-0 key contributes nothing (not 0 * inf); no visible key (and every
padding row) gives out 0, lse -inf. Checked here for the float64 reference (against a
small problem with one NaN or infinity planted at a time and an independent per-row
implementation of the rule), for the CPU binary
(build/bin/kdtr_verify_attn --backend cpu) on the same inputs, and for the committed
goldens nan_scores / nan_scores_bf16.
"""

from __future__ import annotations

import math
import subprocess

import ml_dtypes
import numpy as np
import pytest

import kdtr
from conftest import op_binary
from kdtr.generators import gen_verify_attn_refs as gen
from kdtr.ops.verify_attn import verify_attn, verify_attn_f64

NAN, INF = float("nan"), float("inf")


def rule(x):
    """Per row, plain Python floats: the documented rule, written independently of the reference."""
    q, kv = x["q"].astype(np.float64), x["kv_cache"].astype(np.float64)
    b, t, h, dqk = q.shape
    d_v, scale = int(x["d_v"]), float(np.float32(x["sm_scale"]))
    out = np.zeros((b, t, h, d_v))
    lse = np.full((b, t, h), -math.inf)
    for r in range(b):
        pl, tl = int(x["prefix_len"][r]), int(x["tree_len"][r])
        for i in range(tl):
            keys = list(range(pl)) + [pl + j for j in range(tl) if x["visibility"][r, i, j]]
            if not keys:
                continue  # no visible key: 0 / -inf
            for hh in range(h):
                s = []
                for p in keys:
                    dot = 0.0
                    for d in range(dqk):
                        dot += float(q[r, i, hh, d]) * float(kv[r, p, d])  # IEEE: 0 * inf = NaN
                    s.append(scale * dot)
                if any(math.isnan(v) for v in s):
                    m = math.nan
                else:
                    m = max(s)
                if not math.isfinite(m):  # NaN or +inf visible score, or all -inf
                    out[r, i, hh] = math.nan
                    lse[r, i, hh] = math.nan
                    continue
                w = [math.exp(v - m) for v in s]
                z = math.fsum(w)
                lse[r, i, hh] = m + math.log(z)
                for p, wp in zip(keys, w):
                    if wp == 0.0:
                        continue  # weight 0 contributes nothing
                    out[r, i, hh] += (wp / z) * kv[r, p, :d_v]
    return out, lse


def assert_same_classes_and_close(out, lse, e_out, e_lse, atol=1e-9, rtol=1e-9, what=""):
    """NaN meets NaN, infinities meet the same infinity, finite values are close."""
    for name, a, e in (("out", out, e_out), ("lse", lse, e_lse)):
        a = np.asarray(a, np.float64)
        e = np.asarray(e, np.float64)
        assert np.array_equal(np.isnan(a), np.isnan(e)), (
            f"{what} {name}: NaN at {np.argwhere(np.isnan(a) != np.isnan(e))[:5].tolist()}"
        )
        inf = np.isinf(e)
        assert np.array_equal(np.isinf(a), inf) and np.array_equal(a[inf], e[inf]), f"{what} {name}: infinities differ"
        fin = np.isfinite(e)
        np.testing.assert_allclose(a[fin], e[fin], atol=atol, rtol=rtol, err_msg=f"{what} {name}")


def small_problem():
    """A small finite problem to plant one NaN or infinity in: B=1, T=2, H=1, Dqk=Dv=4, prefix 2,
    tree 2, lower-triangular visibility."""
    rng = np.random.default_rng(8)
    return {
        "q": rng.standard_normal((1, 2, 1, 4)).astype(np.float32),
        "kv_cache": rng.standard_normal((1, 4, 4)).astype(np.float32),
        "prefix_len": np.array([2], np.int32),
        "tree_len": np.array([2], np.int32),
        "visibility": np.tril(np.ones((2, 2), np.uint8))[None],
        "sm_scale": np.array(0.5, np.float32),
        "d_v": np.array(4, np.int32),
    }


def ref(x):
    r = verify_attn(x["q"], x["kv_cache"], x["prefix_len"], x["tree_len"], x["visibility"], x["sm_scale"], x["d_v"])
    return r.out, r.lse


def test_nan_in_q_makes_that_row_nan_not_empty():
    x = small_problem()
    clean_out, clean_lse = ref(x)
    x["q"][0, 1, 0, 2] = np.nan
    out, lse = ref(x)
    assert np.isnan(lse[0, 1, 0]) and np.isnan(out[0, 1, 0]).all()  # it sees 4 keys: not 0 / -inf
    assert np.array_equal(out[0, 0], clean_out[0, 0]) and np.array_equal(lse[0, 0], clean_lse[0, 0])


def test_nan_in_prefix_key_makes_every_row_nan():
    x = small_problem()
    x["kv_cache"][0, 0, 1] = np.nan
    out, lse = ref(x)
    assert np.isnan(lse).all() and np.isnan(out).all()  # not out [0, NaN, 0, 0] with lse -inf


def test_plus_inf_score_all_minus_inf_and_empty_rows():
    x = small_problem()
    x["q"][0, 0, 0] = [np.inf, 0.0, 0.0, 0.0]
    x["kv_cache"][0, :, 0] = np.abs(x["kv_cache"][0, :, 0]) + 0.5  # every score of row 0 is +inf
    out, lse = ref(x)
    assert np.isnan(lse[0, 0]).all() and np.isnan(out[0, 0]).all()

    x = small_problem()
    x["prefix_len"][0] = 0
    x["kv_cache"] = x["kv_cache"][:, :2].copy()
    x["kv_cache"][0, 0, 3] = -np.inf  # tree slot 0's key
    x["q"][0, :, 0, 3] = np.abs(x["q"][0, :, 0, 3]) + 0.5  # its scores are -inf
    out, lse = ref(x)
    assert np.isnan(lse[0, 0, 0]) and np.isnan(out[0, 0, 0]).all()  # row 0 sees only the -inf score
    assert np.isfinite(lse[0, 1]).all() and np.isfinite(out[0, 1]).all()  # row 1: the -inf key has weight 0
    np.testing.assert_allclose(out[0, 1, 0], x["kv_cache"][0, 1], rtol=1e-6)  # ... so it sees only slot 1
    x["visibility"][0, 0, 0] = 0  # row 0 sees nothing now: the empty answer, not NaN
    out, lse = ref(x)
    assert lse[0, 0, 0] == -np.inf and (out[0, 0, 0] == 0).all()


def test_minus_inf_score_with_infinite_value_gives_no_nan():
    """0 * inf is NaN in IEEE; a weight-0 key must contribute nothing instead."""
    x = small_problem()
    x["kv_cache"][0, 0, 1] = -np.inf  # prefix key 0: value dim 1 is -inf
    x["q"][0, :, 0, 1] = np.abs(x["q"][0, :, 0, 1]) + 0.5  # so its scores are -inf: weight 0
    out, lse = ref(x)
    assert np.isfinite(out).all() and np.isfinite(lse).all()
    y = dict(x, kv_cache=x["kv_cache"][:, 1:].copy(), prefix_len=np.array([1], np.int32))  # without key 0
    y_out, y_lse = ref(y)
    np.testing.assert_allclose(out, y_out, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(lse, y_lse, rtol=1e-6, atol=1e-7)
    assert_same_classes_and_close(out, lse, *rule(x), atol=1e-6, rtol=1e-6, what="reference vs rule")


def test_nan_in_a_tree_key_only_reaches_rows_that_see_it():
    x = small_problem()
    x["kv_cache"][0, 3, 0] = np.nan  # tree slot 1: visible to row 1 only (lower triangular)
    out, lse = ref(x)
    assert np.isfinite(out[0, 0]).all() and np.isfinite(lse[0, 0]).all()
    assert np.isnan(out[0, 1]).all() and np.isnan(lse[0, 1]).all()
    clean_out, clean_lse = ref(small_problem())
    assert np.array_equal(out[0, 0], clean_out[0, 0]) and np.array_equal(lse[0, 0], clean_lse[0, 0])


def test_huge_finite_row_is_rounded_not_nan():
    """A finite float64 lse beyond the f32 range rounds to +inf as any cast; out stays finite."""
    x = small_problem()
    x["q"][0, 1, 0] = [1e20, 0, 0, 0]
    x["kv_cache"][0, 0] = [1e20, 1, 2, 3]
    x["sm_scale"] = np.array(1.0, np.float32)
    out, lse = ref(x)
    assert lse[0, 1, 0] == np.inf
    np.testing.assert_array_equal(out[0, 1, 0], x["kv_cache"][0, 0])
    _, lse64 = verify_attn_f64(x["q"], x["kv_cache"], x["prefix_len"], x["tree_len"], x["visibility"], 1.0, 4)
    assert lse64[0, 1, 0] == pytest.approx(1e40, rel=1e-6)


def random_nonfinite(seed, dtype=np.float32):
    """Random small problem with NaN / +-inf sprinkled over q and the cache (valid region too)."""
    rng = np.random.default_rng(seed)
    b, t, h, dqk, d_v = 3, 5, 2, 6, 4
    prefix = rng.integers(0, 4, b).astype(np.int32)
    tree_len = rng.integers(0, t + 1, b).astype(np.int32)
    s = int((prefix + tree_len).max()) + 1
    q = rng.standard_normal((b, t, h, dqk))
    kv = rng.standard_normal((b, s, dqk))
    for arr in (q, kv):
        flat = arr.reshape(-1)
        idx = rng.choice(flat.size, size=max(1, flat.size // 25), replace=False)
        flat[idx] = rng.choice([np.nan, np.inf, -np.inf], size=idx.size)
    q[rng.random(q.shape) < 0.05] = 0.0  # zeros meet infinities: 0 * inf
    vis = (rng.random((b, t, t)) < 0.5).astype(np.uint8)
    return {
        "q": q.astype(dtype),
        "kv_cache": kv.astype(dtype),
        "prefix_len": prefix,
        "tree_len": tree_len,
        "visibility": vis,
        "sm_scale": np.array(0.7, np.float32),
        "d_v": np.array(d_v, np.int32),
    }


@pytest.mark.parametrize("seed", range(12))
def test_reference_follows_the_rule_on_random_nonfinite_inputs(seed):
    x = random_nonfinite(seed, np.float32 if seed % 2 else ml_dtypes.bfloat16)
    out, lse = verify_attn_f64(x["q"], x["kv_cache"], x["prefix_len"], x["tree_len"], x["visibility"],
                               float(x["sm_scale"]), int(x["d_v"]))
    assert_same_classes_and_close(out, lse, *rule(x), what=f"seed {seed}")


# ---------------------------------------------------------------------------------------
# The CPU binary
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def va_binary(repo_root):
    return op_binary("verify_attn")


def run_cpu(binary, x, tmp_path, name):
    golden = tmp_path / f"{name}.kdtr"
    kdtr.save(golden, {f"input.{k}": np.array(v) for k, v in x.items()},
              {"op": "verify_attn", "config": name})
    outp = tmp_path / f"{name}.out.kdtr"
    r = subprocess.run([str(binary), "--input", str(golden), "--output", str(outp), "--backend", "cpu"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    f = kdtr.load(outp)
    return np.asarray(f.tensors["out"]), np.asarray(f.tensors["lse"])


def planted_cases():
    a = small_problem()
    a["q"][0, 1, 0, 2] = np.nan
    b = small_problem()
    b["kv_cache"][0, 0, 1] = np.nan
    c = small_problem()
    c["kv_cache"][0, 3, 0] = np.nan
    d = small_problem()
    d["kv_cache"][0, 0, 1] = -np.inf
    d["q"][0, :, 0, 1] = np.abs(d["q"][0, :, 0, 1]) + 0.5
    e = small_problem()
    e["q"][0, 0, 0] = [np.inf, 0.0, 0.0, 0.0]
    e["kv_cache"][0, :, 0] = np.abs(e["kv_cache"][0, :, 0]) + 0.5
    return {"nan_q": a, "nan_prefix_key": b, "nan_tree_key": c, "neg_inf_value": d, "inf_q": e}


@pytest.mark.parametrize("case", sorted(planted_cases()))
def test_cpu_binary_on_one_planted_nonfinite_value(va_binary, tmp_path, case):
    x = planted_cases()[case]
    out, lse = run_cpu(va_binary, x, tmp_path, case)
    e_out, e_lse = ref(x)
    assert_same_classes_and_close(out, lse, e_out, e_lse, atol=1e-6, rtol=1e-6, what=case)


@pytest.mark.parametrize("seed", range(6))
def test_cpu_binary_follows_the_rule_on_random_nonfinite_inputs(va_binary, tmp_path, seed):
    x = random_nonfinite(100 + seed, np.float32 if seed % 2 else ml_dtypes.bfloat16)
    out, lse = run_cpu(va_binary, x, tmp_path, f"random{seed}")
    e_out, e_lse = ref(x)
    assert_same_classes_and_close(out, lse, e_out, e_lse, atol=1e-6, rtol=1e-6, what=f"seed {100 + seed}")


# ---------------------------------------------------------------------------------------
# Goldens and the generator
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["nan_scores", "nan_scores_bf16"])
def test_nan_scores_goldens(name, repo_root):
    g = kdtr.load(repo_root / "golden" / "verify_attn" / f"{name}.kdtr")
    t, md = g.tensors, g.metadata
    for out in ("out", "lse"):
        assert md[f"contract.{out}.kind"] == "allclose" and md[f"contract.{out}.nan"] == "equal"
    x = {k[len("input."):]: np.asarray(v) for k, v in t.items() if k.startswith("input.")}
    out, lse = np.asarray(t["expected.out"]), np.asarray(t["expected.lse"])
    assert_same_classes_and_close(out, lse, *rule(x), atol=1e-6, rtol=1e-6, what=name)
    kinds = dict(zip(gen.CONFIGS[name].nonfinite, range(len(gen.CONFIGS[name].nonfinite))))
    row_nan = np.isnan(lse)
    assert (np.isnan(out).all(-1) == row_nan).all() and (np.isnan(out).any(-1) == row_nan).all()
    assert row_nan[kinds["nan_q"], 1, 0] and not row_nan[kinds["nan_q"], 1, 1]
    assert row_nan[kinds["nan_prefix_key"], :5].all()
    r = kinds["nan_tree_key"]
    tl = int(x["tree_len"][r])
    sees = x["visibility"][r, :tl, tl - 2] != 0
    assert (row_nan[r, :tl].all(-1) == sees).all() and (~sees).sum() >= 2  # rows that cannot see it stay finite
    assert row_nan[kinds["inf_q"], 1, 0]
    r = kinds["neg_inf_key"]
    assert row_nan[r].sum() == 1 and row_nan[r, 4, 1] and np.isfinite(out[r, :4]).all()
    r = kinds["only_neg_inf"]
    assert row_nan[r, :2].all() and np.isfinite(lse[r, 2:]).all()
    r = kinds["no_key"]
    assert (lse[r, 1] == -np.inf).all() and (out[r, 1] == 0).all() and np.isfinite(lse[r, [0, 2, 3, 4]]).all()
    for r in range(lse.shape[0]):  # padding rows: 0 / -inf; poisoned like every golden
        tl, pl = int(x["tree_len"][r]), int(x["prefix_len"][r])
        assert (lse[r, tl:] == -np.inf).all() and (out[r, tl:] == 0).all()
        assert np.isnan(x["q"][r, tl:].astype(np.float32)).all()
        assert np.isnan(x["kv_cache"][r, pl + tl:].astype(np.float32)).all()
        assert (x["visibility"][r, tl:, :] == 1).all() and (x["visibility"][r, :, tl:] == 1).all()


def test_inject_nonfinite_rejects_bad_kinds_and_requests():
    cfg = gen.CONFIGS["nan_scores"]
    x = gen.synth(gen.CONFIGS["small"], np.random.default_rng(1))
    with pytest.raises(ValueError, match=r"request 0.*not in"):
        gen.inject_nonfinite(x, ("nan_everything",))
    with pytest.raises(ValueError, match=r"request 0, nonfinite no_key: prefix_len must be 0"):
        gen.inject_nonfinite(x, ("no_key",))
    x["prefix_len"][:] = 0
    with pytest.raises(ValueError, match=r"request 0, nonfinite nan_prefix_key: prefix_len must be > 0"):
        gen.inject_nonfinite(x, ("nan_prefix_key",))
    x["tree_len"][:] = 2
    with pytest.raises(ValueError, match=r"request 0, nonfinite nan_tree_key: tree_len 2 < 3"):
        gen.inject_nonfinite(x, ("nan_tree_key",))
    assert set(cfg.nonfinite) - {""} == set(gen.NONFINITE_KINDS)  # every kind is in the golden


def test_tolerances_ignore_nonfinite_scores():
    cfg = gen.CONFIGS["nan_scores"]
    x = gen.synth(cfg, np.random.default_rng(cfg.seed))
    s = gen.max_abs_score(x)
    assert math.isfinite(s) and s > 0
    c = gen.tolerances(x, nan="equal")
    assert c["out"].atol == 1e-5 and c["out"].nan == "equal" and c["lse"].nan == "equal"
    assert gen.tolerances(gen.synth(gen.CONFIGS["small"], np.random.default_rng(1)))["out"].nan == "fail"
