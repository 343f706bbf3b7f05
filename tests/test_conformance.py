"""Conformance of the real binaries (build/bin, built by `make`) on every committed golden.

The cpu backend must PASS everywhere; the cuda backend must PASS where a GPU is present
and report NOT_SUPPORTED (never a failure) where it is not."""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pytest
from click.testing import CliRunner

import kdtr
from runners.cli import main


@pytest.fixture(scope="module")
def binary(repo_root):
    path = repo_root / "build" / "bin" / "kdtr_tree_accept"
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail(f"{path} is missing: run `make` first", pytrace=False)
    return path


def test_every_golden_passes_on_cpu_and_cuda_is_pass_or_not_supported(binary, repo_root, tmp_path):
    r = CliRunner().invoke(main, ["run", "--report-dir", str(tmp_path), "-j", "2"], catch_exceptions=False)
    data = json.loads((tmp_path / "conformance.json").read_text())
    by_backend: dict[str, set[str]] = {}
    for c in data["cases"]:
        by_backend.setdefault(c["backend"], set()).add(c["status"])
    assert by_backend["cpu"] == {"PASS"}, r.output
    assert by_backend["cuda"] in ({"PASS"}, {"NOT_SUPPORTED"}), r.output
    assert r.exit_code == 0
    ops = {c["op"] for c in data["cases"]}
    assert "tree_accept" in ops


def run_bin(binary, *args):
    return subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=60)


def test_binary_bad_input_is_exit_2_with_one_line(binary, tmp_path, repo_root):
    out = tmp_path / "o.kdtr"
    r = run_bin(binary, "--input", str(tmp_path / "missing.kdtr"), "--output", str(out))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "missing.kdtr" in r.stderr
    bad = tmp_path / "bad.kdtr"
    bad.write_bytes(b"\x89KDTR\r\n\x1a" + b"\0" * 40)
    r = run_bin(binary, "--input", str(bad), "--output", str(out))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    r = run_bin(binary, "--input", str(repo_root / "golden/tree_accept/default.kdtr"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    r = run_bin(binary, "--input", str(repo_root / "golden/tree_accept/default.kdtr"), "--output", str(out),
                "--backend", "tpu")
    assert r.returncode == 2 and "tpu" in r.stderr
    assert not out.exists()


def test_binary_rejects_wrong_input_dtype(binary, tmp_path, repo_root):
    g = kdtr.load(repo_root / "golden/tree_accept/default.kdtr")
    tensors = {k: np.array(v) for k, v in g.tensors.items()}
    tensors["input.next_token"] = tensors["input.next_token"].astype(np.int64)
    bad = tmp_path / "wrong_dtype.kdtr"
    kdtr.save(bad, tensors, g.metadata)
    r = run_bin(binary, "--input", str(bad), "--output", str(tmp_path / "o.kdtr"))
    assert r.returncode == 2 and "input.next_token" in r.stderr


def test_cpu_output_equals_reference_on_random_wild_inputs(binary, tmp_path):
    """Arbitrary links and counts (not trees at all): statuses and outputs equal the reference."""
    from kdtr.ops.tree_accept import tree_accept

    rng = np.random.default_rng(7)
    b, t = 32, 9
    inputs = {
        "node_token_ids": rng.integers(-1, 4, (b, t)).astype(np.int64),
        "next_token": rng.integers(-3, t + 3, (b, t)).astype(np.int32),
        "next_sibling": rng.integers(-3, t + 3, (b, t)).astype(np.int32),
        "node_count": rng.integers(-2, t + 2, b).astype(np.int32),
        "target_predict": rng.integers(-1, 4, (b, t)).astype(np.int64),
    }
    inputs["next_token"][rng.random((b, t)) < 0.3] = -1
    inputs["next_sibling"][rng.random((b, t)) < 0.3] = -1
    expected = tree_accept(**inputs).as_dict()
    assert len(set(expected["status"].tolist())) >= 3
    golden = tmp_path / "wild.kdtr"
    kdtr.save(golden, {f"input.{k}": v for k, v in inputs.items()}, {"op": "tree_accept", "config": "wild"})
    out = tmp_path / "out.kdtr"
    r = run_bin(binary, "--input", str(golden), "--output", str(out), "--backend", "cpu")
    assert r.returncode == 0, r.stderr
    got = kdtr.load(out)
    for k, v in expected.items():
        np.testing.assert_array_equal(got.tensors[k], v, err_msg=k)
