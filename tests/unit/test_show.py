"""``kdtr show``: the draft tree of a golden drawn in the terminal and as SVG, the
accepted path and bonus token marked, differences with an output file marked, malformed
trees drawn without hanging, usage errors as one line, and the SVG linked from the
Markdown report for a failing tree_accept case."""

from __future__ import annotations

import os
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import kdtr
from fakes import make_fake, relist, report_cases
from kdtr.cli.main import main
from kdtr.ops.tree_accept import tree_accept

GOLDEN = Path(__file__).resolve().parents[2] / "golden"


def show(*args, env=None):
    return CliRunner().invoke(main, ["show", *map(str, args)], env=env, catch_exceptions=False)


def lines_with(output: str, needle: str) -> list[str]:
    return [ln for ln in output.splitlines() if needle in ln]


def golden_arrays(path):
    with kdtr.load(path) as g:
        return {k: np.array(v) for k, v in g.tensors.items()}


def test_tree_accept_chain_draws_every_slot_and_the_path(repo_root):
    t = golden_arrays(GOLDEN / "tree_accept" / "chain.kdtr")
    b = 3
    r = show(GOLDEN / "tree_accept" / "chain.kdtr", "--request", b)
    assert r.exit_code == 0, r.output
    n = int(t["input.node_count"][b])
    for s in range(n + 1):
        assert len(lines_with(r.output, f"[{s}] tok {t['input.node_token_ids'][b, s]} ")) == 1, s
    count = int(t["expected.accepted_count"][b])
    path = t["expected.accepted_path"][b, :count + 1]
    marked = {int(m) for m in re.findall(r"✓ \[(\d+)\]", r.output)}
    assert marked == {int(s) for s in path}
    assert f"+ bonus {t['expected.proposed'][b, count]}" in r.output
    assert "path " + " → ".join(map(str, path)) in r.output
    # a chain: slot s sits at depth s
    assert f"[{n}] tok {t['input.node_token_ids'][b, n]}  d{n}" in r.output


def test_tree_build_default_draws_slots_tokens_depths_scores_in_child_order():
    t = golden_arrays(GOLDEN / "tree_build" / "default.kdtr")
    r = show(GOLDEN / "tree_build" / "default.kdtr", "--request", 1)
    assert r.exit_code == 0, r.output
    n = int(t["expected.node_count"][1])
    found = [int(m) for m in re.findall(r"\[(\d+)\] tok", r.output)]
    assert sorted(found) == list(range(n + 1))
    # pre-order of the first-child / next-sibling links
    order, stack = [], [0]
    while stack:
        s = stack.pop()
        order.append(s)
        kids, c = [], int(t["expected.next_token"][1, s])
        while c != -1:
            kids.append(c)
            c = int(t["expected.next_sibling"][1, c])
        stack.extend(reversed(kids))
    assert found == order
    s = 5
    line = lines_with(r.output, f"[{s}] tok {t['expected.node_token_ids'][1, s]}  d{t['expected.node_depths'][1, s]}")
    assert len(line) == 1
    # depth-1 slot: the score is the log-prob of its token in row 0
    rank = list(t["input.top_token_ids"][1, 0]).index(t["expected.node_token_ids"][1, s]) \
        if t["expected.node_depths"][1, s] == 1 else None
    if rank is not None:
        assert f"score {float(t['input.top_log_probs'][1, 0, rank]):.4f}" in line[0]
    assert "✓" not in r.output and "bonus" not in r.output  # tree_build has no accepted path


def test_greedy_step_draws_the_built_tree_and_the_accepted_path():
    t = golden_arrays(GOLDEN / "greedy_step" / "default.kdtr")
    r = show(GOLDEN / "greedy_step" / "default.kdtr", "--request", 1)
    assert r.exit_code == 0, r.output
    count = int(t["expected.tree_accept.accepted_count"][1])
    path = t["expected.tree_accept.accepted_path"][1, :count + 1]
    assert {int(m) for m in re.findall(r"✓ \[(\d+)\]", r.output)} == {int(s) for s in path}
    assert f"+ bonus {t['expected.tree_accept.proposed'][1, count]}" in r.output
    assert "score" in r.output


@pytest.mark.parametrize("args,words", [
    (["tree_accept/chain.kdtr", "--request", "6"], "--request 6: out of range [0, 5]"),
    (["tree_accept/chain.kdtr", "--request", "-1"], "out of range [0, 5]"),
    (["verify_attn/chain.kdtr"], "op 'verify_attn'"),
    (["tree_accept/no_such.kdtr"], "no_such.kdtr"),
])
def test_usage_errors_are_exit_2_with_one_line(args, words):
    r = CliRunner().invoke(main, ["show", str(GOLDEN / args[0]), *args[1:]], catch_exceptions=False)
    assert r.exit_code == 2
    assert r.output.count("\n") == 1 and r.output.startswith("kdtr: error:") and words in r.output, r.output


def test_unreadable_file_is_exit_2_naming_it(tmp_path):
    bad = tmp_path / "garbage.kdtr"
    bad.write_bytes(b"not a kdtr file")
    r = show(bad)
    assert r.exit_code == 2 and r.output.count("\n") == 1 and "garbage.kdtr" in r.output, r.output


@pytest.mark.parametrize("config", ["malformed", "bad_links"])
def test_malformed_trees_end_with_a_warning(config):
    t = golden_arrays(GOLDEN / "tree_accept" / f"{config}.kdtr")
    warned = 0
    for b in range(t["input.node_count"].shape[0]):
        r = show(GOLDEN / "tree_accept" / f"{config}.kdtr", "--request", b)
        assert r.exit_code == 0, r.output
        slots = re.findall(r"\[(\d+)\] tok", r.output)
        assert len(slots) == len(set(slots))  # each slot drawn at most once
        if t["expected.status"][b] in (1, 2, 3):  # bad node_count, bad index, cycle
            assert "⚠" in r.output, (b, r.output)
            warned += 1
    assert warned >= 3


def test_cycle_is_named(tmp_path):
    t = golden_arrays(GOLDEN / "tree_accept" / "chain.kdtr")
    t["input.next_token"][0, 3] = 1  # slot 3's first child links back to slot 1
    path = tmp_path / "cycle.kdtr"
    kdtr.save(path, t, {"op": "tree_accept", "config": "cycle"})
    r = show(path)
    assert r.exit_code == 0
    assert "next_token[3] = 1: slot 1 already drawn (a cycle)" in r.output


def reference_output(golden: Path) -> dict:
    with kdtr.load(golden) as g:
        ins = {k[len("input."):]: np.array(v) for k, v in g.tensors.items() if k.startswith("input.")}
    return {k: np.array(v) for k, v in tree_accept(**ins).as_dict().items()}


def test_output_that_matches_is_drawn_once(tmp_path):
    out = tmp_path / "same.kdtr"
    kdtr.save(out, reference_output(GOLDEN / "tree_accept" / "chain.kdtr"), {"op": "tree_accept"})
    r = show(GOLDEN / "tree_accept" / "chain.kdtr", "--request", 3, "--output", out)
    assert r.exit_code == 0, r.output
    assert "matches expected" in r.output and "✗" not in r.output and "expected (golden)" not in r.output


def test_output_with_another_path_is_shown_side_by_side_with_the_difference_marked(tmp_path):
    golden = GOLDEN / "tree_accept" / "chain.kdtr"
    res = reference_output(golden)
    b = next(r for r in range(len(res["accepted_count"])) if res["accepted_count"][r] >= 1)  # a walk to cut short
    count = int(res["accepted_count"][b])
    res["accepted_count"][b] = count - 1  # the kernel stops one slot early
    res["accepted_path"][b, count] = -1
    res["proposed"][b, count - 1] = 777  # ... with another bonus token
    res["proposed"][b, count] = -1
    out = tmp_path / "chain.cpu.kdtr"
    kdtr.save(out, res, {"op": "tree_accept"})
    r = show(golden, "--request", b, "--output", out)
    assert r.exit_code == 0, r.output
    both = [ln for ln in r.output.splitlines() if "expected (golden)" in ln and "actual (" in ln]
    assert both, r.output  # the two titles on one line: side by side
    missed = int(reference_output(golden)["accepted_path"][b, count])
    marked_rows = lines_with(r.output, f"✗ ✓ [{missed}]")
    assert marked_rows and f"✗ [{missed}]" in marked_rows[0].split("✗ ✓")[1]  # marked on both sides
    assert "✗ + bonus 777" in r.output
    assert f"accepted_path[{count}]: expected slot {missed}, actual slot None" in r.output
    assert f"accepted_count: expected {count}, actual {count - 1}" in r.output


def test_svg_is_written_and_holds_the_token_ids(tmp_path):
    svg = tmp_path / "chain.svg"
    r = show(GOLDEN / "tree_accept" / "chain.kdtr", "--request", 3, "--svg", svg)
    assert r.exit_code == 0, r.output
    root = ET.parse(svg).getroot()  # well-formed XML
    assert root.tag.endswith("svg")
    text = svg.read_text()
    t = golden_arrays(GOLDEN / "tree_accept" / "chain.kdtr")
    for s in range(int(t["input.node_count"][3]) + 1):
        assert str(t["input.node_token_ids"][3, s]) in text, s
    r = show(GOLDEN / "tree_accept" / "chain.kdtr", "--svg", tmp_path / "no" / "dir" / "x.svg")
    assert r.exit_code == 2 and r.output.count("\n") == 1 and "x.svg" in r.output


def test_report_links_the_svg_of_a_failing_tree_accept_case(tmp_path, repo_root):
    gdir = tmp_path / "golden"
    shutil.copytree(repo_root / "golden" / "tree_accept", gdir / "tree_accept")
    for p in gdir.glob("tree_accept/*.kdtr"):
        if p.stem not in ("chain", "mid"):
            p.unlink()
    relist(gdir)
    bdir = make_fake(tmp_path / "bin", gdir, "tree_accept", wrong_tensor="proposed").parent
    r = CliRunner().invoke(
        main, ["run", "--golden-dir", str(gdir), "--bin-dir", str(bdir), "--report-dir", str(tmp_path / "reports"),
               "--backend", "cpu"],
        env=dict(os.environ, FAKE_MODE="chain:wrong"), catch_exceptions=False)
    assert r.exit_code == 1, r.output
    assert report_cases(tmp_path)["tree_accept/chain@cpu"]["status"] == "MISMATCH"
    svg = tmp_path / "reports" / "obtained" / "tree_accept" / "chain.cpu.svg"
    assert svg.is_file()
    ET.parse(svg)
    assert "✗" in svg.read_text() or "&#10007;" in svg.read_text()
    md = (tmp_path / "reports" / "conformance.md").read_text()
    assert "(obtained/tree_accept/chain.cpu.svg)" in md
    assert md.count(".svg)") == 1  # one link: the passing case has no picture
    assert not (svg.parent / "mid.cpu.svg").exists()


def test_report_is_written_when_the_picture_fails(tmp_path, monkeypatch):
    from kdtr import report
    from kdtr import run as runner

    def boom(_r):
        raise RuntimeError("no picture")

    monkeypatch.setattr(report, "case_svg", boom)
    case = runner.Case("tree_accept", "chain", GOLDEN / "tree_accept" / "chain.kdtr", "cpu")
    res = runner.CaseResult(case, "MISMATCH", "proposed differs", output_file=str(tmp_path / "x.kdtr"))
    env = {"date": "d", "host": "h", "platform": "p", "python": "3", "numpy": "2"}
    md = report.markdown([res], env, tmp_path)
    assert ".svg" not in md and "tree_accept/chain@cpu: MISMATCH" in md
