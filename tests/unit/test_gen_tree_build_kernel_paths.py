"""The tree_build goldens aimed at the CUDA kernels' stripes and row chunks (docs/ops/tree_build.md,
"Goldens aimed at the CUDA kernels' stripes and row chunks"): the visibility kernel's rows whose
unaligned head adds a 16-byte chunk (``vis_unaligned_rows``), the fused block's 32-bit copy
(``vis_fused_words``), and the validation's per-thread stripes and range checks
(``stripe_defects``, ``stripe_defects_n1024``).

Each is checked against a numpy model of the code path in cuda_tests/kernels/tree_build.cu,
correct and with the bug that mutants/gpu/visibility.toml or heap.toml plants: the correct model
gives the golden's outputs, the mutant's does not (or, for bugs only compute-sanitizer can see,
the golden makes the access leave its allocation).
"""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

import kdtr
from conftest import op_binary
from kdtr import format as kformat
from kdtr.generators import gen_tree_build_refs as gen

NEW = ("vis_unaligned_rows", "vis_fused_words", "stripe_defects", "stripe_defects_n1024")
POISON = 0x5A  # the binaries fill outputs with it before the kernel (cuda_tests/include/kdtr_cli.hpp)
FUSE_T = 128  # T <= 128: the build block writes the visibility (tree_build.cu kFuseT)


@pytest.fixture(scope="module")
def goldens():
    return {name: gen.generate(name) for name in NEW}


def committed(repo_root, op):
    manifest = json.loads((repo_root / "golden" / "MANIFEST.json").read_text())
    return [repo_root / "golden" / rel for rel, e in sorted(manifest["files"].items())
            if e["op"] == op and e.get("tier") == "committed"]


@pytest.mark.parametrize("name", NEW)
def test_committed_golden_is_the_generation(name, goldens, repo_root):
    path = repo_root / "golden" / "tree_build" / f"{name}.kdtr"
    g = kdtr.load(path)
    assert g.metadata["description"] == gen.CONFIGS[name].description
    for k, v in goldens[name][0].items():
        assert g.tensors[k].tobytes() == v.tobytes(), k
    assert path.stat().st_size <= 2 * 1024 * 1024


# --- tree_build_visibility_kernel: 16-byte chunks -------------------------------------------


def span_visibility(vis: np.ndarray, zero_head: bool = True, zero_tail: bool = True) -> np.ndarray:
    """The [B,T,T] bytes tree_build_visibility_kernel leaves in a buffer poisoned with 0x5a
    (base 16-byte aligned, as cudaMalloc's): each row zeroed by a warp (zero_span_by_warp:
    aligned 16-byte chunks, the bytes before the first and after the last one by one), then
    the row's ones from ``vis``.  zero_head / zero_tail False: the mutants
    zero_head_bytes_missing / zero_tail_bytes_missing (those bytes left as they were)."""
    b, t, _ = vis.shape
    flat = np.full(b * t * t, POISON, np.uint8)
    for row in range(b * t):
        start = row * t
        head = min((16 - start % 16) % 16, t)
        tail = head + 16 * ((t - head) // 16)
        flat[start + head:start + tail] = 0
        if zero_head:
            flat[start:start + head] = 0
        if zero_tail:
            flat[start + tail:start + t] = 0
    ones = vis.reshape(-1) == 1
    flat[ones] = 1
    return flat.reshape(b, t, t)


def test_vis_unaligned_rows_shape(goldens):
    t, md = goldens["vis_unaligned_rows"]
    tt = md["max_budget"] + 1
    assert tt > FUSE_T and 2 <= tt % 16 <= 15
    assert (t["expected.node_count"] == md["max_budget"]).all() and (t["expected.status"] == 0).all()
    assert (t["expected.visibility"][:, -1, -1] == 1).all()  # the last row's last byte is 1


@pytest.mark.parametrize("golden", ["vis_unaligned_rows", "mixed", "wide", "select_ties_n1024"])
def test_warp_spans_unaligned_at_both_ends(golden, repo_root):
    """These goldens (T odd) have rows that start and end inside a 16-byte chunk, so the
    kernel's head and tail bytes are written and a kernel that leaves either out keeps the
    poison (mutants zero_head_bytes_missing, zero_tail_bytes_missing)."""
    vis = kdtr.load(repo_root / "golden" / "tree_build" / f"{golden}.kdtr").tensors["expected.visibility"]
    assert vis.shape[1] > FUSE_T
    assert (span_visibility(vis) == vis).all()
    assert (span_visibility(vis, zero_head=False) == POISON).any()
    assert (span_visibility(vis, zero_tail=False) == POISON).any()


# --- the fused block (T <= 128): the copy out -----------------------------------------------


def word_copy(t_slots: int, b: int) -> bool:
    """Whether request b's fused block takes the 32-bit copy: its destination (b T T bytes
    past a 256-byte-aligned base) and T T both multiples of 4."""
    return (b * t_slots * t_slots) % 4 == 0 and (t_slots * t_slots) % 4 == 0


def test_vis_fused_words_takes_the_word_copy(goldens):
    t, md = goldens["vis_fused_words"]
    tt, b = md["max_budget"] + 1, t["input.budget"].shape[0]
    assert tt <= FUSE_T and tt % 2 == 0
    assert all(word_copy(tt, r) for r in range(b))
    assert (t["expected.node_count"] == md["max_budget"]).all() and (t["expected.status"] == 0).all()
    # The mutant fused_word_copy_bound_in_bytes copies T*T words (4 T T bytes) per request: the
    # last request's block writes past the visibility allocation (compute-sanitizer memcheck),
    # the others over their successors' blocks, and every block reads past its shared memory.
    last_end = (b - 1) * tt * tt + 4 * tt * tt
    assert last_end > b * tt * tt


def test_no_older_golden_takes_the_word_copy(repo_root):
    """Why the mutant survived: T = N + 1 is odd in every golden before these with T <= 128
    (tree_build and the chain's tree_build in greedy_step), so T * T is odd and the byte copy
    runs."""
    for op in ("tree_build", "greedy_step"):
        for path in committed(repo_root, op):
            if path.stem in NEW and op == "tree_build":
                continue
            g = kdtr.load(path)
            tt = g.metadata["max_budget"] + 1
            b = g.tensors["input.budget"].shape[0]
            assert tt > FUSE_T or not any(word_copy(tt, r) for r in range(b)), (op, path.stem)


# --- validation: statuses 3-6 striped over the block's threads -----------------------------

NO_DEFECT = 1 << 30


def check_item(lp: np.ndarray, ids: np.ndarray, d: int, r: int) -> int:
    """tree_build_check_item of element (d, r) (tree_build.cuh)."""
    k = lp.shape[1]
    if not np.isfinite(lp[d, r]):
        return 3
    if r + 1 < k and lp[d, r] < lp[d, r + 1]:
        return 4
    if (ids[d, r + 1 :] == ids[d, r]).any():
        return 5
    if ids[d, r] < 0:
        return 6
    return NO_DEFECT


def striped_status(lp, ids, budget, limit, n, threads, keep_last=False):
    """The kernel's status of one request: ranges, then per thread tid the elements tid, tid +
    threads, ... of the checked rows, each thread's lowest status (keep_last: the mutant
    validation_keeps_last_defect, its last defect), then the minimum over threads."""
    d_rows, k = lp.shape
    if budget < 0 or budget > n:
        return 1
    if limit < 0 or limit > d_rows:
        return 2
    worst = NO_DEFECT
    for tid in range(threads):
        mine = NO_DEFECT
        for e in range(tid, limit * k, threads):
            s = check_item(lp, ids, e // k, e % k)
            if keep_last:
                mine = s if s != NO_DEFECT else mine
            else:
                mine = min(mine, s)
        worst = min(worst, mine)
    return 0 if worst == NO_DEFECT else worst


def stripe_widths(n: int) -> tuple[int, ...]:
    """The validation's thread counts for max budget n: the heap kernel's 256, and the select
    kernel's 256 (n <= 256) or 1024."""
    return (256, 256 if n <= 256 else 1024)


@pytest.mark.parametrize("name", ["stripe_defects", "stripe_defects_n1024"])
def test_stripe_defects_statuses(name, goldens):
    t, md = goldens[name]
    n, lp, ids = md["max_budget"], t["input.top_log_probs"], t["input.top_token_ids"]
    d_rows, k = lp.shape[1:]
    killed = set()
    for r, want in enumerate(t["expected.status"].tolist()):
        args = (lp[r], ids[r], int(t["input.budget"][r]), int(t["input.depth_limit"][r]), n)
        for width in stripe_widths(n):
            assert striped_status(*args, width) == want, (r, width)
            if striped_status(*args, width, keep_last=True) != want:
                killed.add((r, width))
    assert {w for _, w in killed} == set(stripe_widths(n)), killed  # each stripe width is caught
    assert d_rows * k > max(stripe_widths(n))  # more elements than threads


@pytest.mark.parametrize("name", ["stripe_defects", "stripe_defects_n1024"])
def test_range_failures_hold_element_defects(name, goldens):
    """Requests with status 1 or 2 hold element defects too (a validation outside the range
    check must not let them through), and the last request's depth_limit is D + 1: checks that
    ran anyway would read row D, past the inputs' end (the mutant
    staging_outside_range_check of the select kernel; compute-sanitizer memcheck)."""
    t, md = goldens[name]
    lp, ids = t["input.top_log_probs"], t["input.top_token_ids"]
    b, d_rows, k = lp.shape
    st = t["expected.status"]
    for r in np.flatnonzero((st == 1) | (st == 2)):
        assert not np.isfinite(lp[r]).all() and (ids[r] < 0).any(), r
    assert st[-1] == 2 and int(t["input.depth_limit"][-1]) == d_rows + 1
    assert (b - 1) * d_rows * k + int(t["input.depth_limit"][-1]) * k > b * d_rows * k


def test_the_control_order_passes_keep_last(goldens):
    """Request 3 of stripe_defects holds its lower status last: a thread that keeps its last
    defect gets it right (the order of the other requests is what kills the mutant)."""
    t, md = goldens["stripe_defects"]
    args = (t["input.top_log_probs"][3], t["input.top_token_ids"][3], int(t["input.budget"][3]),
            int(t["input.depth_limit"][3]), md["max_budget"])
    assert striped_status(*args, 256, keep_last=True) == striped_status(*args, 256) == 3


@pytest.mark.parametrize("name", ["vis_unaligned_rows", "vis_fused_words"])
def test_select_build_places_every_request(name, goldens, tmp_path):
    """kdtr_tree_build --kernel select on the CPU (the select build with a team of one lane,
    whose decisions are the GPU team's): no request falls back to the heap build, and the
    outputs are the golden's."""
    t, md = goldens[name]
    src, dst = tmp_path / "in.kdtr", tmp_path / "out.kdtr"
    kformat.save(src, {k: v for k, v in t.items() if k.startswith("input.")},
                 {"op": "tree_build", "config": name, "max_budget": md["max_budget"]})
    subprocess.run([str(op_binary("tree_build")), "--input", str(src), "--output", str(dst), "--kernel", "select"],
                   check=True, capture_output=True)
    out = kdtr.load(dst)
    assert out.metadata["kernel"] == "cpu_select" and int(out.metadata["select_fallbacks"]) == 0
    for k in ("node_count", "node_token_ids", "parents", "next_token", "next_sibling", "visibility"):
        assert out.tensors[k].tobytes() == t[f"expected.{k}"].tobytes(), k
