"""The smallest inputs that expose the bugs the mutation study planted in the C++
CPU cores (cuda_tests/kernels/*.cuh) and that the goldens of the time let through.

Each input is checked twice: its right value from the Python reference (kdtr/ops/) and
from the CPU binary (build/bin/kdtr_<op> --backend cpu), and, where cheap, a few lines of
Python that replay the bug show that the bug answers otherwise. The goldens that kill each
whole class of bugs (tree_accept/bad_links, tree_accept/leaf_siblings, tree_build/near_ties,
verify_attn/huge_scores, no_visible_key, masked_extremes, finite_padding, and
greedy_step/finite_padding) are tested in tests/unit/test_gen_*.py; inputs that fit a golden's
dims are embedded in it, which is checked here too.

Item 8 of the issue: an expected lse of -inf (padding rows) must be checked. A backend that
writes lse 0 or out != 0 in the padding rows of verify_attn/ragged or greedy_step/underfull
is a MISMATCH for kdtr.compare, `kdtr diff` and `kdtr run`.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

import kdtr
from conftest import op_binary
from kdtr.cli.main import main
from kdtr.compare import compare
from kdtr.contract import Contract
from kdtr.ops import OPS
from kdtr.ops.tree_accept import STATUS_BAD_INDEX, tree_accept
from kdtr.ops.tree_build import tree_build
from kdtr.ops.verify_attn import verify_attn

NAN, INF = float("nan"), float("inf")


def run_cpu(op: str, inputs: dict[str, np.ndarray], tmp_path, metadata: dict | None = None) -> dict[str, np.ndarray]:
    """The outputs of build/bin/kdtr_<op> --backend cpu on ``inputs`` (a golden without
    expected tensors)."""
    golden = tmp_path / f"{op}.in.kdtr"
    kdtr.save(golden, {f"input.{k}": np.asarray(v) for k, v in inputs.items()},
              {"op": op, "config": "mutation_input", **(metadata or {})})
    out = tmp_path / f"{op}.out.kdtr"
    r = subprocess.run([str(op_binary(op)), "--input", str(golden), "--output", str(out), "--backend", "cpu"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    with kdtr.load(out) as f:
        return {k: np.array(v) for k, v in f.tensors.items()}


def assert_same(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    for k, v in want.items():
        np.testing.assert_array_equal(got[k], v, err_msg=k)


def golden_tensors(repo_root, op: str, config: str) -> tuple[dict[str, np.ndarray], dict]:
    with kdtr.load(repo_root / "golden" / op / f"{config}.kdtr") as g:
        return {k: np.array(v) for k, v in g.tensors.items()}, dict(g.metadata)


# ---------------------------------------------------------------------------------------
# 1. tree_accept: a link value of 0 (or below -1) is a BAD_INDEX, not the end of a list
# ---------------------------------------------------------------------------------------


def input1() -> dict[str, np.ndarray]:
    return {
        "node_token_ids": np.array([[100, 7]], np.int64),
        "next_token": np.array([[1, -1]], np.int32),
        "next_sibling": np.array([[-1, 0]], np.int32),
        "node_count": np.array([1], np.int32),
        "target_predict": np.array([[9, 5]], np.int64),
    }


RIGHT1 = {"accepted_count": np.array([0], np.int32), "accepted_path": np.array([[0, -1]], np.int32),
          "proposed": np.array([[-1, -1]], np.int64), "status": np.array([STATUS_BAD_INDEX], np.int32)}


def walk_ending_lists_at(x: dict[str, np.ndarray], link_ends) -> tuple[int, int]:
    """(accepted_count, status) of a walk whose sibling loop runs ``while not link_ends(c)``
    (the bug: ``c > 0`` or ``c >= 0`` in place of ``c != -1`` plus the range check)."""
    ids, nt, ns, n, tp = (x[k][0] for k in ("node_token_ids", "next_token", "next_sibling", "node_count",
                                             "target_predict"))
    cur, accepted = 0, 0
    while True:
        c, found = int(nt[cur]), -1
        while not link_ends(c):
            if c > n:
                return 0, STATUS_BAD_INDEX
            if ids[c] == tp[cur]:
                found = c
                break
            c = int(ns[c])
        if found == -1:
            return accepted, 0
        accepted, cur = accepted + 1, found


def test_input1_bad_link_reference_and_cpu(tmp_path):
    x = input1()
    assert_same(tree_accept(**x).as_dict(), RIGHT1)
    assert_same(run_cpu("tree_accept", x, tmp_path), RIGHT1)
    assert walk_ending_lists_at(x, lambda c: c <= 0) == (0, 0)  # `while (c > 0)` reads 0 as "no more siblings"
    for v in (-2, np.iinfo(np.int32).min):  # `while (c >= 0)` reads these as "no more siblings"
        y = input1()
        y["next_sibling"][0, 1] = v
        assert tree_accept(**y).status[0] == STATUS_BAD_INDEX
        assert walk_ending_lists_at(y, lambda c: c < 0) == (0, 0)


def embedded_row(g: dict[str, np.ndarray], x: dict[str, np.ndarray], row: int) -> None:
    """Request ``row`` of golden tensors ``g`` is the one-request input ``x`` padded to the
    golden's T (-1 in the padding slots of every [B,T] tensor)."""
    for k, v in x.items():
        got = g[f"input.{k}"][row]
        if v.ndim == 1:
            assert got == v[0], k
        else:
            n = v.shape[1]
            np.testing.assert_array_equal(got[:n], v[0], err_msg=k)
            assert (got[n:] == -1).all(), k


def test_input1_is_row0_of_bad_links(repo_root):
    g, _ = golden_tensors(repo_root, "tree_accept", "bad_links")
    embedded_row(g, input1(), 0)
    assert g["expected.status"][0] == STATUS_BAD_INDEX


# ---------------------------------------------------------------------------------------
# 2. tree_accept: the walk stops at an accepted leaf, whatever its siblings hold
# ---------------------------------------------------------------------------------------


def input2() -> dict[str, np.ndarray]:
    return {
        "node_token_ids": np.array([[100, 7, 8]], np.int64),
        "next_token": np.array([[1, -1, -1]], np.int32),
        "next_sibling": np.array([[-1, 2, -1]], np.int32),
        "node_count": np.array([2], np.int32),
        "target_predict": np.array([[7, 8, 9]], np.int64),
    }


RIGHT2 = {"accepted_count": np.array([1], np.int32), "accepted_path": np.array([[0, 1, -1]], np.int32),
          "proposed": np.array([[7, 8, -1]], np.int64), "status": np.array([0], np.int32)}


def test_input2_leaf_siblings_reference_and_cpu(tmp_path, repo_root):
    x = input2()
    assert_same(tree_accept(**x).as_dict(), RIGHT2)
    assert_same(run_cpu("tree_accept", x, tmp_path), RIGHT2)
    # The bug: at the accepted leaf 1, the walk went on into its next sibling 2 (token 8 =
    # target_predict[1]) and accepted it: accepted_count 2, proposed [7, 8, 9].
    assert x["node_token_ids"][0, x["next_sibling"][0, 1]] == x["target_predict"][0, 1]
    g, _ = golden_tensors(repo_root, "tree_accept", "leaf_siblings")
    embedded_row(g, x, 0)
    assert g["expected.accepted_count"][0] == 1 and g["expected.proposed"][0, :3].tolist() == [7, 8, -1]


# ---------------------------------------------------------------------------------------
# 3. tree_build: the sibling score is (w - lp[r]) + lp[r+1], evaluated in that order
# ---------------------------------------------------------------------------------------


def input3() -> dict[str, np.ndarray]:
    lp = np.array([[-1e-12, -0.3], [-1e-12, -0.3]], np.float32)
    return {
        "top_log_probs": lp[None],
        "top_token_ids": np.array([[[1, 2], [3, 4]]], np.int64),
        "root_token_ids": np.array([0], np.int64),
        "budget": np.array([4], np.int32),
        "depth_limit": np.array([2], np.int32),
    }


def test_input3_sibling_score_reference_and_cpu(tmp_path, repo_root):
    from kdtr.generators.gen_tree_build_refs import grow_scored

    x = input3()
    ref = tree_build(**x, n_max=4).as_dict()
    assert ref["node_token_ids"][0].tolist() == [0, 1, 3, 2, 4]
    assert ref["parents"][0].tolist() == [-1, 0, 1, 0, 1]
    got = run_cpu("tree_build", x, tmp_path, {"max_budget": 4})
    assert_same(got, ref)
    lp, ids = x["top_log_probs"][0], x["top_token_ids"][0]
    assert grow_scored(lp, ids, 4, 2) == [1, 3, 2, 4]
    assert grow_scored(lp, ids, 4, 2, "swap") != [1, 3, 2, 4]  # (w + lp[r+1]) - lp[r] builds another tree
    # request 0 of tree_build/near_ties is this input (K = 4: ranks 2, 3 are never reached)
    g, _ = golden_tensors(repo_root, "tree_build", "near_ties")
    np.testing.assert_array_equal(g["input.top_log_probs"][0, :2, :2], lp)
    np.testing.assert_array_equal(g["input.top_token_ids"][0, :2, :2], ids)
    assert g["input.budget"][0] == 4 and g["input.depth_limit"][0] == 2 and g["input.root_token_ids"][0] == 0
    assert g["expected.node_token_ids"][0, :5].tolist() == [0, 1, 3, 2, 4]
    assert g["expected.parents"][0, :5].tolist() == [-1, 0, 1, 0, 1]


# ---------------------------------------------------------------------------------------
# 4-7. verify_attn
# ---------------------------------------------------------------------------------------


def attn_inputs(q, kv, prefix, tree_len, vis, sm_scale=1.0, d_v=1) -> dict[str, np.ndarray]:
    """q [T][H*Dqk] as nested lists with H = 1, Dqk = len(row); kv [S][Dqk]; one request."""
    q = np.array(q, np.float32)
    kv = np.array(kv, np.float32)
    return {
        "q": q.reshape(1, q.shape[0], 1, -1),
        "kv_cache": kv.reshape(1, kv.shape[0], -1),
        "prefix_len": np.array([prefix], np.int32),
        "tree_len": np.array([tree_len], np.int32),
        "visibility": np.array(vis, np.uint8)[None],
        "sm_scale": np.array(sm_scale, np.float32),
        "d_v": np.array(d_v, np.int32),
    }


def check_attn(x, tmp_path, out, lse):
    want = {"out": np.array(out, np.float32).reshape(1, -1, 1, int(x["d_v"])),
            "lse": np.array(lse, np.float32).reshape(1, -1, 1)}
    assert_same(verify_attn(**x).as_dict(), want)
    assert_same(run_cpu("verify_attn", x, tmp_path), want)


def test_input4_score_900_needs_max_subtraction(tmp_path):
    x = attn_inputs([[30]], [[30]], prefix=0, tree_len=1, vis=[[1]])
    check_attn(x, tmp_path, out=[30], lse=[900])
    with np.errstate(over="ignore", invalid="ignore"):
        assert np.isinf(np.exp(900.0)) and np.isnan(np.exp(900.0) * 30 / np.exp(900.0))  # the bug's answer: NaN


def test_input5_row_with_no_visible_key(tmp_path):
    x = attn_inputs([[1.5]], [[2.0]], prefix=0, tree_len=1, vis=[[0]])
    check_attn(x, tmp_path, out=[0], lse=[-INF])


def test_input6_row_max_over_visible_keys_only(tmp_path):
    x = attn_inputs([[1], [1]], [[-400], [400]], prefix=0, tree_len=2, vis=[[1, 0], [1, 1]])
    check_attn(x, tmp_path, out=[-400, 400], lse=[-400, 400])
    # the bug: m = 400 (the masked key) for row 0; exp(-400 - 400) underflows even in float64
    assert np.exp(-800.0) == 0.0


def test_input7_finite_padding_row(tmp_path):
    x = attn_inputs([[1], [1]], [[2], [3], [NAN]], prefix=1, tree_len=1, vis=[[1, 1], [1, 1]])
    ref = verify_attn(**x)
    assert ref.lse[0, 1, 0] == -INF and ref.out[0, 1, 0, 0] == 0.0  # the padding row
    e2, e3 = np.exp(2.0), np.exp(3.0)  # row 0 sees the prefix key (2) and tree slot 0 (3)
    np.testing.assert_allclose(ref.out[0, 0, 0, 0], (2 * e2 + 3 * e3) / (e2 + e3), rtol=1e-6)
    np.testing.assert_allclose(ref.lse[0, 0, 0], np.log(e2 + e3), rtol=1e-6)
    assert_same(run_cpu("verify_attn", x, tmp_path), ref.as_dict())
    # the bug (rows up to T): row 1 would see the same two keys and be finite
    wrong = verify_attn(**dict(x, tree_len=np.array([2], np.int32), kv_cache=np.array([[[2], [3], [5]]], np.float32)))
    assert np.isfinite(wrong.lse[0, 1, 0])


def greedy_input7() -> dict[str, np.ndarray]:
    """D = 1, K = 1, N = 2: the tree holds one node of a budget of 2 (underfull), so slot 2
    is padding; its q row is finite (1.0) and the prefix makes it see a key if computed."""
    return {
        "top_log_probs": np.array([[[-0.5]]], np.float32),
        "top_token_ids": np.array([[[5]]], np.int64),
        "root_token_ids": np.array([3], np.int64),
        "budget": np.array([2], np.int32),
        "depth_limit": np.array([1], np.int32),
        "q": np.ones((1, 3, 1, 1), np.float32),
        "kv_cache": np.array([[[2.0], [3.0], [1.0], [NAN]]], np.float32),
        "prefix_len": np.array([1], np.int32),
        "sm_scale": np.array(1.0, np.float32),
        "d_v": np.array(1, np.int32),
        "target_predict": np.array([[5, 9, -1]], np.int64),
    }


def test_input7_underfull_greedy_step_padding_row(tmp_path):
    x = greedy_input7()
    ref = OPS["greedy_step"].reference(x, {"max_budget": 2})
    assert ref["tree_build.node_count"].tolist() == [1]
    assert ref["verify_attn.lse"][0, 2, 0] == -INF and ref["verify_attn.out"][0, 2, 0, 0] == 0.0
    assert np.isfinite(ref["verify_attn.lse"][0, :2]).all()
    assert ref["tree_accept.proposed"][0].tolist() == [5, 9, -1]
    got = run_cpu("greedy_step", x, tmp_path, {"max_budget": 2})
    assert_same(got, ref)
    # the bug (tree_len from the budget, 3): row 2 sees the prefix key and is finite
    attn = {k: x[k] for k in ("q", "prefix_len", "sm_scale", "d_v")}
    kv = x["kv_cache"].copy()
    kv[0, 3] = 1.0
    wrong = verify_attn(**attn, kv_cache=kv, tree_len=np.array([3], np.int32), visibility=ref["tree_build.visibility"])
    assert np.isfinite(wrong.lse[0, 2, 0])


# ---------------------------------------------------------------------------------------
# 8. an expected lse of -inf is checked: padding rows that are not 0 / -inf are a MISMATCH
# ---------------------------------------------------------------------------------------

PADDING_GOLDENS = [("verify_attn", "ragged", "out", "lse"),
                   ("greedy_step", "underfull", "verify_attn.out", "verify_attn.lse")]


def padding_mask(g: dict[str, np.ndarray], op: str) -> np.ndarray:
    """bool [B,T]: the padding rows (i >= tree_len) of the golden."""
    if op == "verify_attn":
        tl = g["input.tree_len"]
    else:
        tl = g["expected.tree_build.node_count"] + 1
    t = g["input.q"].shape[1]
    return np.arange(t)[None, :] >= tl[:, None]


def corrupted(g: dict[str, np.ndarray], op: str, out_name: str, lse_name: str, how: str) -> dict[str, np.ndarray]:
    """The expected outputs with the padding rows corrupted: ``lse0`` (lse 0 there),
    ``out1`` (out 1.0 there) or ``finite`` (lse and out of a computed row)."""
    res = {k[len("expected."):]: np.array(v) for k, v in g.items() if k.startswith("expected.")}
    pad = padding_mask(g, op)
    assert pad.any()
    if how in ("lse0", "finite"):
        res[lse_name][pad] = 0.0 if how == "lse0" else 1.25
    if how in ("out1", "finite"):
        res[out_name][pad] = 1.0 if how == "out1" else 0.5
    return res


@pytest.mark.parametrize("op,config,out_name,lse_name", PADDING_GOLDENS)
@pytest.mark.parametrize("how", ["lse0", "out1", "finite"])
def test_padding_rows_are_checked_by_compare_and_diff(op, config, out_name, lse_name, how, repo_root, tmp_path):
    g, md = golden_tensors(repo_root, op, config)
    assert (g[f"expected.{lse_name}"][padding_mask(g, op)] == -INF).all()
    assert (g[f"expected.{out_name}"][padding_mask(g, op)] == 0).all()
    res = corrupted(g, op, out_name, lse_name, how)
    bad = {lse_name} if how == "lse0" else {out_name} if how == "out1" else {out_name, lse_name}
    for name in (out_name, lse_name):
        r = compare(name, g[f"expected.{name}"], res[name], Contract.from_metadata(md, name))
        assert r.ok == (name not in bad), (name, r.summary())
    obtained = tmp_path / "obtained.kdtr"
    kdtr.save(obtained, res, {"op": op})
    golden = repo_root / "golden" / op / f"{config}.kdtr"
    r = CliRunner().invoke(main, ["diff", str(golden), str(obtained)])
    assert r.exit_code == 1, r.output
    # and the uncorrupted outputs pass
    clean = tmp_path / "clean.kdtr"
    kdtr.save(clean, {k[len("expected."):]: v for k, v in g.items() if k.startswith("expected.")}, {"op": op})
    r = CliRunner().invoke(main, ["diff", str(golden), str(clean)])
    assert r.exit_code == 0, r.output


FAKE = r'''#!{python}
import shutil, sys
a = sys.argv
shutil.copyfile({obtained!r}, a[a.index("--output") + 1])
'''


@pytest.mark.parametrize("op,config,out_name,lse_name", PADDING_GOLDENS)
def test_runner_judges_lse_zero_in_padding_rows_a_mismatch(op, config, out_name, lse_name, repo_root, tmp_path):
    """kdtr run with a stand-in binary that writes lse 0 in the padding rows: MISMATCH naming lse."""
    g, _ = golden_tensors(repo_root, op, config)
    obtained = tmp_path / "obtained.kdtr"
    kdtr.save(obtained, corrupted(g, op, out_name, lse_name, "lse0"), {"op": op})
    bdir = tmp_path / "bin"
    bdir.mkdir()
    fake = bdir / f"kdtr_{op}"
    fake.write_text(FAKE.format(python=sys.executable, obtained=str(obtained)))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    r = CliRunner().invoke(main, ["run", "--only", f"{op}/{config}", "--backend", "cpu", "--bin-dir", str(bdir),
                                  "--report-dir", str(tmp_path / "reports")], env=dict(os.environ),
                           catch_exceptions=False)
    assert r.exit_code == 1, r.output
    assert "MISMATCH" in r.output and lse_name in r.output
