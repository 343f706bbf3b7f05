"""``kdtr_<op> --graph`` on the CPU backend (docs/binaries.md, "Graph replay"): the two data
sets of the input file run on one set of buffers, both replays' outputs written; the first
data set checked as the second is, its defects naming its own tensors."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

import kdtr
from conftest import REPO_ROOT, op_binary
from kdtr.ops import OPS

OPS_WITH_GOLDEN = {"tree_accept": "chain", "tree_build": "default", "verify_attn": "ragged", "greedy_step": "k2_dims"}


def _graph_file(path, op, config, edit=None):
    """A --graph input file from a golden: replay 1 = its rows reversed, replay 2 = as is."""
    f = kdtr.load(REPO_ROOT / "golden" / op / f"{config}.kdtr")
    t = {k: np.array(v) for k, v in f.tensors.items() if k.startswith("input.")}
    out = dict(t)
    for k, v in t.items():
        out["replay1." + k[len("input."):]] = v[::-1].copy() if v.ndim else v
    if edit:
        edit(out)
    md = {k: v for k, v in f.metadata.items() if k in ("op", "config", "max_budget", "dtype")}
    kdtr.save(path, out, md)
    return out, md


def _run(op, inp, out, *extra):
    return subprocess.run([str(op_binary(op)), "--graph", "--input", str(inp), "--output", str(out), *extra],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("op", list(OPS_WITH_GOLDEN))
def test_both_replays_outputs_are_the_reference_of_their_data_sets(tmp_path, op):
    tensors, md = _graph_file(tmp_path / "in.kdtr", op, OPS_WITH_GOLDEN[op])
    r = _run(op, tmp_path / "in.kdtr", tmp_path / "out.kdtr")
    assert r.returncode == 0, r.stderr
    got = kdtr.load(tmp_path / "out.kdtr")
    assert got.metadata["graph_replays"] == 2 and got.metadata["op"] == op
    spec = OPS[op]
    for prefix, name_prefix in (("input.", ""), ("replay1.", "replay1.")):
        ins = {s.name: tensors[prefix + s.name] for s in spec.inputs}
        with np.errstate(all="ignore"):
            want = spec.reference(ins, md)
        for s in spec.outputs:
            g, w = np.asarray(got.tensors[name_prefix + s.name]), np.asarray(want[s.name])
            if w.dtype.kind == "f":  # the CPU cores compute in f64: equal within rounding, NaN where NaN
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=name_prefix + s.name)
            else:
                assert np.array_equal(g, w), name_prefix + s.name


def test_a_file_without_the_first_data_set_is_an_input_error(tmp_path):
    r = _run("tree_accept", REPO_ROOT / "golden" / "tree_accept" / "chain.kdtr", tmp_path / "out.kdtr")
    assert r.returncode == 2
    assert "MissingTensor" in r.stderr and "replay1.node_token_ids" in r.stderr


def test_a_defect_of_the_first_data_set_names_its_tensor(tmp_path):
    def bad_prefix(t):
        t["replay1.prefix_len"] = t["replay1.prefix_len"].copy()
        t["replay1.prefix_len"][0] = 10**6

    _graph_file(tmp_path / "in.kdtr", "verify_attn", "ragged", bad_prefix)
    r = _run("verify_attn", tmp_path / "in.kdtr", tmp_path / "out.kdtr")
    assert r.returncode == 2
    assert "replay1.prefix_len: request 0: prefix_len 1000000" in r.stderr


@pytest.mark.parametrize("edit, words", [
    (lambda t: t.__setitem__("replay1.sm_scale", np.float32(t["input.sm_scale"] * 2)),
     "replay1.sm_scale: differs from input.sm_scale"),
    (lambda t: t.__setitem__("replay1.kv_cache", np.concatenate([t["replay1.kv_cache"]] * 2, axis=1)),
     "replay1.kv_cache: shape [4,162,72] differs from input.kv_cache's [4,81,72]"),
])
def test_the_data_sets_must_share_shapes_and_scalars(tmp_path, edit, words):
    _graph_file(tmp_path / "in.kdtr", "verify_attn", "ragged", edit)
    r = _run("verify_attn", tmp_path / "in.kdtr", tmp_path / "out.kdtr")
    assert r.returncode == 2, r.stderr
    assert words in r.stderr
