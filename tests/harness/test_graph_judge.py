"""kdtr.run.graph.build and judge against binaries that get graph replay wrong.

A stand-in binary here is a Python function: it reads the ``--graph`` input file that
:func:`kdtr.run.graph.build` wrote, computes each data set's outputs with the reference
(:mod:`kdtr.ops`) and then does one thing an engine would suffer from -- runs one replay
and writes it twice, never uploads the second data set, mishandles padding requests,
skips the padding rows of the second replay. Each must be a MISMATCH, whatever the
golden's B (1, or a capture size already: no room for padding at the golden's own B).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import kdtr
from conftest import REPO_ROOT
from kdtr import compose
from kdtr.judge import Golden
from kdtr.ops import OPS
from kdtr.run import graph
from kdtr.status import Status


def _sliced(tmp_path: Path, op: str, config: str, rows: list[int]) -> Golden:
    """The committed golden op/config cut to batch rows ``rows`` (its contracts as they are)."""
    g = Golden.read(REPO_ROOT / "golden" / op / f"{config}.kdtr")
    t = {}
    for s in OPS[op].inputs:
        a = np.asarray(g.inputs[s.name])
        t[f"input.{s.name}"] = a[rows] if s.dims and s.dims[0] == "B" else a
    for k, v in g.expected.items():
        t[f"expected.{k}"] = np.asarray(v)[rows]
    path = tmp_path / f"{op}_{config}_{len(rows)}.kdtr"
    kdtr.save(path, t, dict(g.metadata))
    return Golden.read(path)


def _reference(f: kdtr.KdtrFile, prefix: str) -> dict[str, np.ndarray]:
    md = dict(f.metadata)
    spec = OPS[md["op"]]
    ins = {s.name: np.array(f.tensors[prefix + s.name]) for s in spec.inputs}
    with np.errstate(all="ignore"):
        return {k: np.array(v) for k, v in spec.reference(ins, md).items()}


def _binary(plan: graph.GraphPlan, out: Path, fault: str = "") -> None:
    """Write the output file a ``--graph`` binary with ``fault`` would write for ``plan``."""
    f = kdtr.load(plan.path)
    first, second = _reference(f, graph.REPLAY1), _reference(f, "input.")
    if fault == "once":  # one replay (the second data set's), written as both
        first = {k: v.copy() for k, v in second.items()}
    if fault == "first_only":  # the second data set never uploaded: replay 2 runs on replay 1's inputs
        second = {k: v.copy() for k, v in first.items()}
    pad2 = [row for row, i in enumerate(plan.order[1]) if i < 0]
    if fault == "bad_padding":  # a padding request's first output element wrong, in both replays
        for k, out_k in enumerate((first, second)):
            row = next(row for row, i in enumerate(plan.order[k]) if i < 0)
            a = next(iter(out_k.values()))
            a.reshape(a.shape[0], -1)[row, 0] += 3
    if fault == "skip_padding":  # replay 2 does not write its padding rows: they hold what replay 1 left
        for name in second:
            second[name][pad2] = first[name][pad2]
    tensors = dict(second)
    tensors.update({graph.REPLAY1 + k: v for k, v in first.items()})
    md = f.metadata
    kdtr.save(out, tensors, {"op": md["op"], "config": md["config"], "backend": "cpu", "device": "cpu"})


# B = 1 (replay 1 would equal replay 2 without padding rows to rotate through) and B a
# capture size (4: no padding request at the golden's own B)
GOLDENS = [("verify_attn", "ragged", [2]), ("tree_accept", "chain", [1]), ("tree_build", "default", [0]),
           ("greedy_step", "default", [3]), ("greedy_step", "default", [0, 1, 2, 3]),
           ("verify_attn", "ragged", [0, 1, 2, 3])]
IDS = [f"{op}/{c}[B={len(r)}]" for op, c, r in GOLDENS]


@pytest.mark.parametrize("op, config, rows", GOLDENS, ids=IDS)
def test_every_graph_case_has_padding_rows_and_every_row_changes_between_replays(tmp_path, op, config, rows):
    g = _sliced(tmp_path, op, config, rows)
    plan = graph.build(g, tmp_path / "in.kdtr")
    assert plan.Bp == compose.capture_size(plan.B + 1) > plan.B
    assert plan.Tp > plan.T and (plan.S is None or plan.Sp > plan.S)
    assert sorted(i for i in plan.order[0] if i >= 0) == sorted(i for i in plan.order[1] if i >= 0) == \
        list(range(plan.B))
    # no row holds one request in both replays; one turns padding, one turns live
    assert all(a != b or a < 0 for a, b in zip(plan.order[0], plan.order[1])), plan.order
    assert any(a >= 0 > b for a, b in zip(plan.order[0], plan.order[1]))
    assert any(b >= 0 > a for a, b in zip(plan.order[0], plan.order[1]))
    _binary(plan, tmp_path / "out.kdtr")
    v = graph.judge(plan, g, tmp_path / "out.kdtr")
    assert v.status == Status.PASS, v.reason


@pytest.mark.parametrize("fault, words", [
    ("once", "replay 1, request 0"),
    ("first_only", "replay 2, request 0"),
    ("bad_padding", "padding request (batch row"),
    ("skip_padding", "replay 2, padding request (batch row"),
])
@pytest.mark.parametrize("op, config, rows", GOLDENS, ids=IDS)
def test_a_binary_that_gets_replay_wrong_is_a_mismatch(tmp_path, op, config, rows, fault, words):
    g = _sliced(tmp_path, op, config, rows)
    plan = graph.build(g, tmp_path / "in.kdtr")
    _binary(plan, tmp_path / "out.kdtr", fault)
    v = graph.judge(plan, g, tmp_path / "out.kdtr")
    assert v.status == Status.MISMATCH, (fault, v.status, v.reason)
    assert words in v.reason, v.reason


def test_replay_2_stale_slots_are_what_replay_1_left_but_floats_poison(tmp_path):
    g = _sliced(tmp_path, "verify_attn", "ragged", [0, 1, 2, 3])
    plan = graph.build(g, tmp_path / "in.kdtr")
    f = kdtr.load(plan.path)
    t = lambda name, k: np.asarray(f.tensors[("replay1." if k == 1 else "input.") + name])  # noqa: E731
    last = plan.Bp - 1
    assert plan.order[0][last] == 0 and plan.order[1][last] == -1  # request 0 ends; its row turns padding
    assert t("tree_len", 2)[last] == 0 and t("tree_len", 1)[last] == g.inputs["tree_len"][0]
    assert t("visibility", 2)[last].tobytes() == t("visibility", 1)[last].tobytes()  # stale: request 0's
    assert not np.isnan(t("q", 1)[last, :plan.T]).any() and np.isnan(t("q", 2)[last]).all()  # floats: poison
    assert np.isnan(t("q", 1)[plan.B - 1]).all()  # replay 1's padding row: poison


def test_greedy_step_padding_outputs_stay_exactly_comparable(tmp_path):
    # a padding request's root attention is computed from stale floats: poison there keeps it
    # NaN (documented NaN), never a finite value held bit for bit to the reference's rounding
    g = Golden.read(REPO_ROOT / "golden" / "greedy_step" / "default.kdtr")
    plan = graph.build(g, tmp_path / "in.kdtr")
    for k in range(2):
        pad = [row for row, i in enumerate(plan.order[k]) if i < 0]
        want = compose.padding_outputs("greedy_step", plan.inputs[k], plan.meta, pad)
        for name in ("verify_attn.out", "verify_attn.lse"):
            v = np.asarray(want[name])
            assert not (np.isfinite(v) & (v != 0)).any(), (k, name)


def test_a_reference_that_refuses_the_padding_rows_is_no_pass(tmp_path, monkeypatch):
    g = _sliced(tmp_path, "tree_accept", "chain", [0, 1])
    plan = graph.build(g, tmp_path / "in.kdtr")
    _binary(plan, tmp_path / "out.kdtr")

    def refuse(*args, **kw):
        raise ValueError("outputs over the limit")

    monkeypatch.setattr(compose, "padding_outputs", refuse)
    v = graph.judge(plan, g, tmp_path / "out.kdtr")
    assert v.status == Status.MISMATCH and "the reference cannot say the padding values" in v.reason, v.reason
