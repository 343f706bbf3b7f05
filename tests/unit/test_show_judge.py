"""``kdtr show GOLDEN --output OUT`` and the report's tree SVGs say "matches expected" only
where the judge (kdtr.judge, the verdict of ``kdtr run`` and ``kdtr diff``) says PASS: an
output whose drawn request looks the same but that the judge fails (NaN in an output the
drawing does not show, a tampered tensor it does not draw, another dtype, another request
that differs) gets the judge's verdict in one line, and so does a golden the judge
cannot use (ERROR)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner

import kdtr
from kdtr import judge
from kdtr.cli.main import main
from kdtr.cli.show import case_svg
from kdtr.status import Status

GOLDEN = Path(__file__).resolve().parents[2] / "golden"


def expected_as_output(op: str, config: str) -> dict:
    with kdtr.load(GOLDEN / op / f"{config}.kdtr") as g:
        return {k[len("expected."):]: np.array(v) for k, v in g.tensors.items() if k.startswith("expected.")}


def _nan_in_attention(t: dict) -> None:
    t["verify_attn.out"].reshape(-1)[5] = np.nan


def _visibility(t: dict) -> None:
    t["visibility"][0, 0, 1] ^= 1


def _another_request(t: dict) -> None:
    t["accepted_path"][1, 0] = 9  # request 1 differs; request 0 (the one drawn) does not


def _dtype(t: dict) -> None:
    t["accepted_path"] = t["accepted_path"].astype(np.int64)


def _tree_visibility(t: dict) -> None:
    t["tree_build.visibility"][0, 0, 2] ^= 1


def _same(t: dict) -> None:
    pass


def _path_differs(t: dict) -> None:
    t["accepted_path"][0, 1] += 1


# (op, config, change, the judge's status): the drawing of request 0 shows no difference in
# the first five; the runner's verdict is what show must say.
CASES = [
    ("greedy_step", "default", _nan_in_attention, Status.MISMATCH),
    ("tree_build", "default", _visibility, Status.MISMATCH),
    ("tree_accept", "chain", _another_request, Status.MISMATCH),
    ("tree_accept", "chain", _dtype, Status.MISMATCH),
    ("greedy_step", "default", _tree_visibility, Status.MISMATCH),
    ("tree_accept", "chain", _same, Status.PASS),
    ("tree_accept", "chain", _path_differs, Status.MISMATCH),
]


@pytest.mark.parametrize("op,config,change,status", CASES, ids=[f"{c[0]}-{c[2].__name__}" for c in CASES])
def test_show_says_matches_only_where_the_judge_passes(tmp_path, op, config, change, status):
    golden = GOLDEN / op / f"{config}.kdtr"
    out = expected_as_output(op, config)
    change(out)
    path = tmp_path / "out.kdtr"
    kdtr.save(path, out, {"op": op})
    verdict = judge.judge(judge.Golden.read(golden), path)
    assert verdict.status == status, verdict.reason  # the case is what it says
    r = CliRunner().invoke(main, ["show", str(golden), "--output", str(path)], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert ("matches expected" in r.output) == (verdict.status == Status.PASS), r.output
    if verdict.status == Status.PASS:
        assert "verdict" not in r.output and "✗" not in r.output
    elif "difference(s) in request 0" not in r.output:  # not drawn: said in one line
        line = [ln for ln in r.output.splitlines() if "verdict (kdtr.judge" in ln]
        assert len(line) == 1 and f"{status}: " in line[0], r.output
        assert verdict.reason.split(":")[0] in line[0]  # the failing output, named


@pytest.mark.parametrize("differs", [False, True])
def test_a_golden_the_judge_cannot_use_is_said_to_be_an_error(tmp_path, differs):
    """A golden with a contract for no output: every verdict against it is ERROR, whether
    or not the drawn request differs."""
    with kdtr.load(GOLDEN / "tree_accept" / "chain.kdtr") as g:
        t, meta = {k: np.array(v) for k, v in g.tensors.items()}, dict(g.metadata)
    meta["contract.no_such_output.kind"] = "exact"
    golden = tmp_path / "stray.kdtr"
    kdtr.save(golden, t, meta)
    out = expected_as_output("tree_accept", "chain")
    if differs:
        _path_differs(out)
    path = tmp_path / "out.kdtr"
    kdtr.save(path, out, {"op": "tree_accept"})
    assert judge.judge(judge.Golden.read(golden), path).status == Status.ERROR
    r = CliRunner().invoke(main, ["show", str(golden), "--output", str(path)], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "matches expected" not in r.output
    assert ("difference(s) in request 0" in r.output) == differs
    line = [ln for ln in r.output.splitlines() if "verdict (kdtr.judge" in ln]
    assert len(line) == 1 and "ERROR: " in line[0] and "no_such_output" in line[0], r.output


def test_report_svg_gives_the_case_verdict_where_the_drawn_request_looks_the_same(tmp_path):
    """The report's picture of a failing greedy_step case (NaN in verify_attn.out, which
    the tree does not show) says the case's MISMATCH, never "matches expected"."""
    out = expected_as_output("greedy_step", "default")
    _nan_in_attention(out)
    path = tmp_path / "default.cpu.kdtr"
    kdtr.save(path, out, {"op": "greedy_step"})
    golden = GOLDEN / "greedy_step" / "default.kdtr"
    case = SimpleNamespace(op="greedy_step", config="default", golden=golden)
    reason = judge.judge(judge.Golden.read(golden), path).reason
    svg = case_svg(SimpleNamespace(case=case, output_file=str(path), outputs=[], status=Status.MISMATCH,
                                   reason=reason))
    ET.parse(svg)
    text = svg.read_text().replace("&#160;", " ")
    assert "matches" not in text and "MISMATCH" in text
