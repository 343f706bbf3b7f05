"""kdtr.judge: a golden read once and vouched for, and the verdict on one obtained output
(PASS, MISMATCH, ERROR) with its per-tensor results."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import kdtr
from kdtr.judge import Golden, GoldenError, judge, kernel_ran
from kdtr.vouch import Vouch

EXPECTED = {"y": np.array([1.0, 2.0, 3.0], dtype=np.float32), "n": np.array([4, 5], dtype=np.int32)}
CONTRACTS = {"contract.y.kind": "allclose", "contract.y.atol": 1e-3, "contract.y.rtol": 0.0,
             "contract.y.nan": "fail", "contract.n.kind": "exact"}


def _golden(tmp_path: Path, **meta_extra) -> Path:
    path = tmp_path / "toy" / "one.kdtr"
    path.parent.mkdir(exist_ok=True)
    tensors = {"input.x": np.arange(3, dtype=np.float32), **{f"expected.{k}": v for k, v in EXPECTED.items()}}
    kdtr.save(path, tensors, {"op": "toy", "config": "one", **CONTRACTS, **meta_extra})
    return path


def _output(tmp_path: Path, meta: dict | None = None, **change) -> Path:
    out = tmp_path / "out.kdtr"
    tensors = {k: v.copy() for k, v in EXPECTED.items()}
    for k, v in change.items():
        if v is None:
            del tensors[k]
        else:
            tensors[k] = v
    kdtr.save(out, tensors, {"op": "toy", **(meta or {})})
    return out


def test_matching_outputs_pass_with_one_result_per_expected_tensor(tmp_path):
    g = Golden.read(_golden(tmp_path), op="toy", config="one")
    assert (g.id, g.tier, g.problem) == ("toy/one", "committed", "")
    assert list(g.inputs) == ["x"] and set(g.contracts) == {"y", "n"}
    v = judge(g, _output(tmp_path, {"kernel": "cpu_f64"}))
    assert v.status == "PASS" and v.reason == ""
    assert [r.name for r in v.results] == list(g.expected) and all(r.ok for r in v.results)
    assert v.metadata["kernel"] == "cpu_f64"
    out = _output(tmp_path)
    assert judge(g, out.read_bytes()).status == "PASS"  # the file's bytes judge alike
    assert judge(g, dict(EXPECTED)).status == "PASS"  # and a mapping of arrays


def test_a_value_outside_the_contract_is_a_mismatch_naming_the_output(tmp_path):
    g = Golden.read(_golden(tmp_path))
    v = judge(g, _output(tmp_path, y=np.array([1.0, 2.5, 3.0], dtype=np.float32)))
    assert v.status == "MISMATCH" and v.reason.startswith("y: ")
    assert [r.ok for r in v.results] == [False, True]


def test_a_non_finite_output_breaks_a_nan_fail_contract(tmp_path):
    g = Golden.read(_golden(tmp_path))
    v = judge(g, _output(tmp_path, y=np.array([1.0, np.nan, np.inf], dtype=np.float32)))
    assert v.status == "MISMATCH"
    assert v.results[0].n_nonfinite == 2 and not v.results[0].ok


def test_a_missing_output_or_another_dtype_is_a_mismatch(tmp_path):
    g = Golden.read(_golden(tmp_path))
    v = judge(g, _output(tmp_path, n=None))
    assert v.status == "MISMATCH" and "missing" in v.results[1].problem
    v = judge(g, {"y": EXPECTED["y"]})  # a mapping says where the output is missing from
    assert v.status == "MISMATCH" and v.results[1].problem == "missing from the outputs"
    v = judge(g, _output(tmp_path, n=EXPECTED["n"].astype(np.int64)))
    assert v.status == "MISMATCH" and v.results[1].problem


def test_an_unreadable_output_is_an_error_naming_it(tmp_path):
    g = Golden.read(_golden(tmp_path))
    bad = tmp_path / "garbage.kdtr"
    bad.write_bytes(b"not a kdtr file")
    v = judge(g, bad)
    assert v.status == "ERROR" and v.reason.startswith("output file unreadable") and str(bad) in v.reason
    v = judge(g, tmp_path / "absent.kdtr")
    assert v.status == "ERROR" and "absent.kdtr" in v.reason


def test_a_golden_that_cannot_judge_is_an_error(tmp_path):
    g = Golden.read(_golden(tmp_path, **{"contract.z.kind": "exact"}))  # a contract for no output
    assert "contract.z.kind" in g.problem
    v = judge(g, _output(tmp_path))
    assert v.status == "ERROR" and "contract.z.kind" in v.reason and not v.results


def test_a_stale_or_tampered_golden_is_refused_naming_the_file(tmp_path):
    path = _golden(tmp_path)
    vouch = Vouch.of_bytes(path.read_bytes(), "MANIFEST.json")
    assert Golden.read(path, vouch).vouch == vouch
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))  # same size, other bytes
    with pytest.raises(GoldenError, match="vouched") as info:
        Golden.read(path, vouch)
    assert info.value.kind == "vouch" and str(path) in str(info.value)
    with pytest.raises(GoldenError) as info:
        Golden.read(_golden(tmp_path), op="other")
    assert info.value.kind == "place" and "does not match directory" in str(info.value)


def test_a_golden_changed_after_it_was_read_is_seen_and_its_arrays_stay(tmp_path):
    path = _golden(tmp_path)
    g = Golden.read(path)
    assert g.changed() is None
    path.write_bytes(b"")
    assert "0 bytes" in g.changed()
    assert judge(g, _output(tmp_path)).status == "PASS"  # judged against the private copy


def test_a_forced_kernel_must_be_the_one_that_ran(tmp_path):
    g = Golden.read(_golden(tmp_path))
    assert judge(g, _output(tmp_path, {"kernel": "mma_bf16_dqk576_dv512"}), kernel="mma").status == "PASS"
    v = judge(g, _output(tmp_path, {"kernel": "simt_f32"}), kernel="mma")
    assert v.status == "ERROR" and "mma" in v.reason and "simt_f32" in v.reason
    v = judge(g, _output(tmp_path), kernel="heap")  # no metadata kernel at all
    assert v.status == "ERROR"
    assert kernel_ran("select", "select") and not kernel_ran("select", "cpu_select") and not kernel_ran("mm", "mma_x")


class _Named(dict):
    kernel: str | None = None


def test_a_mapping_that_names_its_kernel_is_held_to_the_forced_one(tmp_path):
    """kdtr.kernels.Outputs carries ``.kernel``: under a forced kernel, another one is an
    ERROR, an instance of it passes; a plain mapping cannot say, so it is judged on values."""
    g = Golden.read(_golden(tmp_path), op="toy", config="one")
    ran = _Named(EXPECTED)
    ran.kernel = "simt_bf16_dvt128"
    v = judge(g, ran, kernel="mma")
    assert v.status == "ERROR" and "kernel mma was forced" in v.reason and "simt_bf16_dvt128" in v.reason
    ran.kernel = "mma_bf16_dqk128_dv128"
    assert judge(g, ran, kernel="mma").status == "PASS"
    assert judge(g, dict(EXPECTED), kernel="mma").status == "PASS"


def test_testing_never_passes_a_golden_it_cannot_judge_or_another_kernel(tmp_path):
    from kdtr import testing

    bare = tmp_path / "bare" / "one.kdtr"
    bare.parent.mkdir()
    kdtr.save(bare, {"input.x": np.arange(3, dtype=np.float32)}, {"op": "toy", "config": "one"})
    g = Golden.read(bare, op="toy", config="one")
    assert g.problem
    with pytest.raises(testing.ConformanceError, match="ERROR"):
        testing.assert_conforms(g, {"y": np.zeros(3, np.float32)})
    forced = Golden.read(_golden(tmp_path), op="toy", config="one")
    forced.kernel = "wgmma"
    ran = _Named(EXPECTED)
    ran.kernel = "mma_bf16_dqk128_dv128"
    with pytest.raises(testing.ConformanceError, match="kernel wgmma was forced"):
        testing.assert_conforms(forced, ran)
    ran.kernel = "wgmma_bf16"
    assert all(r.ok for r in testing.assert_conforms(forced, ran))


def test_an_output_of_another_op_or_a_nameless_kernel_instance_is_an_error(tmp_path):
    g = Golden.read(_golden(tmp_path), op="toy", config="one")
    v = judge(g, _output(tmp_path, {"op": "tree_accept"}))
    assert v.status == "ERROR" and "metadata op is 'tree_accept'" in v.reason
    assert not kernel_ran("mma", "mma_") and kernel_ran("mma", "mma_bf16_dqk128_dv128")
