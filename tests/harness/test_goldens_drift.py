"""`kdtr regen --check`'s drift counts (per element, by bit pattern: NaN meets NaN of the
same pattern) and the manifest's record of the host (kdtr/goldens.py)."""

from __future__ import annotations

import numpy as np

from kdtr import goldens
from kdtr.bf16 import to_bfloat16


def drift(old, new, name="input.kv_cache"):
    d = goldens._tensor_drift("verify_attn/x.kdtr", name, old, new)
    return None if d is None else d.detail


def test_nan_poison_counts_as_unchanged():
    """A NaN-poisoned input (most of it NaN) with one element changed: 1 changed, not every NaN."""
    for make in (lambda a: a.astype(np.float32), to_bfloat16):
        old = np.full((2, 200, 8), np.nan)
        old[:, :40] = np.arange(2 * 40 * 8).reshape(2, 40, 8) / 7.0
        new = old.copy()
        new[1, 3, 5] += 1.0
        old, new = make(old), make(new)
        assert drift(old, old.copy()) is None
        assert drift(old, new).startswith("input.kv_cache: 1 of 3200 elements changed (max "), drift(old, new)


def test_nan_against_a_number_and_nan_patterns_are_changes():
    old = np.array([np.nan, 1.0, np.nan, 0.0, 2.0], np.float32)
    new = old.copy()
    new[0] = 3.0  # NaN -> number
    new[2] = -np.nan  # another NaN pattern (sign)
    new[3] = -0.0  # -0.0 is not +0.0
    d = drift(old, new, "expected.out")
    assert d == "expected.out: float output changed: 3 of 5 elements changed (max 0 ULP, 1 between NaN and a number, " \
                "1 NaN bit patterns)"


def test_integer_and_float_outputs():
    old = np.arange(10, dtype=np.int32)
    new = old.copy()
    new[[2, 7]] = -1
    assert drift(old, new, "expected.parents") == "expected.parents: 2 of 10 elements changed"
    f_old = np.linspace(0, 1, 6)
    f_new = f_old.copy()
    f_new[4] = np.nextafter(f_new[4], 2.0)
    f_new[5] = np.nextafter(np.nextafter(f_new[5], 2.0), 2.0)
    want = "expected.lse: float output changed: 2 of 6 elements changed (max 2 ULP)"
    assert drift(f_old, f_new, "expected.lse") == want
    assert "int32[2] -> int32[3]" in drift(old[:2], old[:3])


def test_manifest_records_the_host_and_what_shapes_bytes():
    rec = goldens.host_record()
    assert set(rec["generated_with"]) == {"numpy", "ml_dtypes", "python"}
    assert rec["generated_with"]["numpy"] == np.__version__
    assert set(rec["golden_bytes"]["shaped_by"]) == {"numpy", "kdtr"}
    assert "ml_dtypes" in rec["golden_bytes"]["not_shaped_by"]


def test_committed_manifest_holds_the_record(repo_root):
    m = goldens.read_manifest(repo_root / "golden")
    assert m["golden_bytes"] == goldens.GOLDEN_BYTES
    assert set(m["generated_with"]) == {"numpy", "ml_dtypes", "python"}
