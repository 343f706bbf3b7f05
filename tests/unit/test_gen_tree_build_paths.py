"""The tree_build goldens aimed at the select build and the score classes (docs/ops/tree_build.md,
"Goldens aimed at the select build and the score classes") hold what their descriptions
promise: exact ties without a fallback to the heap build, -0.0 beside +0.0 where a bit order
builds another tree, positive log-probs with and without clamped nodes.
"""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

import kdtr
from conftest import op_binary
from kdtr import format as kformat
from kdtr.generators import gen_tree_build_refs as gen

NEW = ("select_ties", "select_ties_n1024", "signed_zero", "positive_log_probs")
# Requests the select build hands to the heap build (a clamped node), per golden.
FALLBACKS = {
    "select_ties": [0, 0, 0, 0],
    "select_ties_n1024": [0],
    "signed_zero": [0] * 8,
    "positive_log_probs": [0, 1, 1, 0, 1, 1],
}


@pytest.fixture(scope="module")
def goldens():
    return {name: gen.generate(name) for name in NEW}


@pytest.mark.parametrize("name", NEW)
def test_committed_golden_is_the_generation(name, goldens, repo_root):
    path = repo_root / "golden" / "tree_build" / f"{name}.kdtr"
    g = kdtr.load(path)
    assert g.metadata["description"] == gen.CONFIGS[name].description
    for k, v in goldens[name][0].items():
        assert g.tensors[k].tobytes() == v.tobytes(), k
    assert path.stat().st_size <= 2 * 1024 * 1024


@pytest.mark.parametrize("name", NEW)
def test_valid_sorted_rows(name, goldens):
    t, _ = goldens[name]
    lp = t["input.top_log_probs"]
    assert np.isfinite(lp).all() and (lp[..., :-1] >= lp[..., 1:]).all()
    assert (t["expected.status"] == 0).all()
    assert (t["expected.node_count"] == t["input.budget"]).all()


def test_select_ties_are_exact_and_tied(goldens):
    for name in ("select_ties", "select_ties_n1024"):
        t, md = goldens[name]
        lp = t["input.top_log_probs"].astype(np.float64)
        assert (lp * 16 == np.round(lp * 16)).all() and (lp < 0).all()
        assert md["max_budget"] == (256 if name == "select_ties" else 1024)
        assert t["input.top_log_probs"].shape[2] == 16


def test_signed_zero_rows(goldens):
    t, md = goldens["signed_zero"]
    lp, ids = t["input.top_log_probs"], t["input.top_token_ids"]
    zeros = lp == 0
    assert np.signbit(lp[zeros]).any() and (~np.signbit(lp[zeros])).any()
    assert lp[0, :, :4].tolist() == [[-0.0, 0.0, -0.5, -1.0]] * lp.shape[1]
    assert np.signbit(lp[0, :, 0]).all()
    budget, depth = int(t["input.budget"][0]), int(t["input.depth_limit"][0])
    for r in range(lp.shape[0]):
        contract = gen.grow_scored(lp[r], ids[r], budget, depth)
        assert contract == t["expected.node_token_ids"][r, 1:].tolist()  # an independent builder agrees
        assert gen.grow_bits(lp[r], ids[r], budget, depth) != contract, r


def test_positive_log_probs_rows(goldens):
    t, _ = goldens["positive_log_probs"]
    lp = t["input.top_log_probs"]
    assert (lp[0, 0] > 0).any() and (lp[0, 1:] <= 0).all()  # row 0 only
    assert (lp[1, 1:, 0] > 0).all()  # rank 0 of every deeper row
    assert (lp[2] > 0).all()
    assert lp[3].max() == np.float32(20.0)
    assert np.float32(1e-30) in lp[4] and (lp[4] == 0).any()


@pytest.mark.parametrize("name", NEW)
def test_select_build_fallbacks(name, goldens, tmp_path):
    """Each request alone through kdtr_tree_build --kernel select on the CPU (the select build
    with a team of one lane, whose decisions are the GPU team's): the heap build takes over
    exactly where FALLBACKS says, and the outputs are the golden's either way."""
    t, md = goldens[name]
    b = t["input.budget"].shape[0]
    got = []
    for r in range(b):
        one = {k: v[r : r + 1] for k, v in t.items() if k.startswith("input.")}
        src, dst = tmp_path / f"{r}.kdtr", tmp_path / f"{r}.out.kdtr"
        kformat.save(src, one, {"op": "tree_build", "config": name, "max_budget": md["max_budget"]})
        subprocess.run([str(op_binary("tree_build")), "--input", str(src), "--output", str(dst), "--kernel", "select"],
                       check=True, capture_output=True)
        out = kdtr.load(dst)
        assert out.metadata["kernel"] == "cpu_select"
        for k in ("node_count", "node_token_ids", "parents", "next_token", "next_sibling", "visibility"):
            assert out.tensors[k].tobytes() == t[f"expected.{k}"][r : r + 1].tobytes(), (r, k)
        got.append(int(out.metadata["select_fallbacks"]))
    assert got == FALLBACKS[name]
