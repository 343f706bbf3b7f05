"""``kdtr run --graph`` (docs/harness.md, "Graph replay"): the padded input file, the two
replays judged, the graph cases as their own column, selection and rerun lines.

The real CPU binaries run every committed golden in graph mode; a fake binary (a Python
script computing the reference, kdtr.ops) checks that what an engine would suffer from --
state leaking from the first replay into the second, padding rows holding other values
than the documented ones, an output element the second replay leaves unwritten -- is a
MISMATCH naming the replay, the request and the output.
"""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import kdtr
from conftest import REPO_ROOT, golden_subset, op_binary
from kdtr import compose
from kdtr.cli.main import main
from kdtr.judge import Golden
from kdtr.run import Case, RunConfig, UsageError, graph, plan, rerun_line, select_cases

# A stand-in for kdtr_<op>: the reference's outputs of each data set; with --graph the
# outputs of both replays on one set of buffers (replay 2 starts from replay 1's outputs).
# $FAKE_GRAPH_FAULT: leak (replay 2's row 0 outputs are replay 1's), padding (the last
# batch row's first output element changed), unwritten (replay 2 leaves element 0 of the
# first output of row 1 as replay 1 left it), beyond (replay 2 writes 5 into the last slot of
# row 0 of the second output, beyond the golden's T), ignore (--graph ignored: the eager outputs of
# input.* only).
FAKE = r'''#!{python}
import os, sys
sys.path.insert(0, {root!r})
import numpy as np
import kdtr
from kdtr.ops import OPS

args = sys.argv[1:]
pairs, graph, batch, backend = [], "--graph" in args, "--batch" in args, "cpu"
i = 0
while i < len(args):
    if args[i] == "--input":
        pairs.append([args[i + 1], None])
    elif args[i] == "--output":
        pairs[-1][1] = args[i + 1]
    elif args[i] == "--backend":
        backend = args[i + 1]
    i += 1 if args[i] in ("--graph", "--batch") else 2
fault = os.environ.get("FAKE_GRAPH_FAULT", "")


def run(src, dst):
    f = kdtr.load(src)
    md = dict(f.metadata)
    spec = OPS[md["op"]]
    def outputs(prefix):
        ins = {{s.name: np.array(f.tensors[prefix + s.name]) for s in spec.inputs}}
        with np.errstate(all="ignore"):
            return {{k: np.array(v) for k, v in spec.reference(ins, md).items()}}
    second = outputs("input.")
    tensors = dict(second)
    if graph and fault != "ignore":
        first = outputs("replay1.")
        names = [s.name for s in spec.outputs]
        if fault == "leak":
            for n in names:
                second[n][0] = first[n][0]
        flat = lambda a: a.reshape(a.shape[0], -1)  # a view: rows by elements
        if fault == "unwritten":
            flat(second[names[0]])[1, 0] = flat(first[names[0]])[1, 0]
        if fault == "beyond":
            flat(second[names[1]])[0, -1] = 5
        if fault == "padding":
            for out in (first, second):
                flat(out[names[0]])[-1, 0] += 7
        tensors = dict(second)
        tensors.update({{"replay1." + k: v for k, v in first.items()}})
    meta = {{"op": md["op"], "config": md.get("config", ""), "backend": backend, "device": "cpu"}}
    if graph:
        meta["graph_replays"] = 2
    kdtr.save(dst, tensors, meta)


for k, (src, dst) in enumerate(pairs):
    run(src, dst)
    if batch:
        print(f"@kdtr-batch i={{k}} rc=0 s=0.001 msg=", flush=True)
    else:
        break
'''


def _fake(bdir: Path, op: str) -> Path:
    bdir.mkdir(parents=True, exist_ok=True)
    path = bdir / f"kdtr_{op}"
    path.write_text(FAKE.format(python=sys.executable, root=str(REPO_ROOT)))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _run(tmp_path: Path, gdir: Path, bdir: Path, *args: str):
    return CliRunner().invoke(main, ["run", "--golden-dir", str(gdir), "--bin-dir", str(bdir), "--report-dir",
                                     str(tmp_path / "reports"), "--timeout", "120", "--backend", "cpu", *args])


def _cases(tmp_path: Path) -> dict[str, dict]:
    data = json.loads((tmp_path / "reports" / "conformance.json").read_text())
    return {c["id"]: c for c in data["cases"]}


def test_every_committed_golden_passes_in_graph_mode_on_the_cpu_binaries(tmp_path):
    bdir = op_binary("tree_accept").parent
    res = _run(tmp_path, REPO_ROOT / "golden", bdir, "--graph", "--only", "*#graph")
    cases = _cases(tmp_path)
    graph_cases = {k: v for k, v in cases.items() if k.endswith("@cpu#graph")}
    committed = sorted(REPO_ROOT.glob("golden/*/*.kdtr"))
    assert len(graph_cases) == len(cases) == len(committed)
    bad = {k: (v["status"], v["reason"][:300]) for k, v in graph_cases.items() if v["status"] != "PASS"}
    assert not bad, bad
    assert res.exit_code == 0, res.output
    one = graph_cases["tree_accept/chain@cpu#graph"]
    assert one["mode"] == "graph" and "--graph" in one["command"] and one["detail"].startswith("graph at B 6 -> 8")
    md = (tmp_path / "reports" / "conformance.md").read_text()
    assert "| op | config | cpu#graph |" in md
    xml = (tmp_path / "reports" / "junit.xml").read_text()
    assert 'name="chain[cpu#graph]"' in xml


@pytest.fixture
def fake_env(tmp_path):
    gdir = golden_subset(tmp_path, "tree_accept", ["chain", "default"])
    bdir = tmp_path / "bin"
    _fake(bdir, "tree_accept")
    return tmp_path, gdir, bdir


def test_the_fake_passes_eager_and_graph_cases_as_their_own_columns(fake_env, monkeypatch):
    tmp_path, gdir, bdir = fake_env
    monkeypatch.delenv("FAKE_GRAPH_FAULT", raising=False)
    res = _run(tmp_path, gdir, bdir, "--graph", "-j", "1")
    cases = _cases(tmp_path)
    assert {k: v["status"] for k, v in cases.items()} == {
        "tree_accept/chain@cpu": "PASS", "tree_accept/chain@cpu#graph": "PASS",
        "tree_accept/default@cpu": "PASS", "tree_accept/default@cpu#graph": "PASS"}, res.output
    assert "cpu#graph" in res.output
    # the graph cases ran apart from the eager ones (one --batch process of two graph cases)
    assert cases["tree_accept/chain@cpu#graph"]["process"] == "batch"
    out = Path(cases["tree_accept/chain@cpu#graph"]["output_file"])
    assert out.name == "chain.cpu.graph.kdtr" and Path(cases["tree_accept/chain@cpu"]["output_file"]) != out


@pytest.mark.parametrize("fault, words", [
    ("leak", ["replay 2, request 0", "accepted_count"]),
    ("unwritten", ["replay 2, request 1", "accepted_count"]),
    ("padding", ["replay 2, padding request (batch row 7)", "accepted_count"]),
    ("beyond", ["replay 2, request 0 (batch row 0) beyond its T = 33: accepted_path[63]: 5, documented -1"]),
    ("ignore", ["replay 1: output replay1.accepted_count missing"]),
])
def test_what_an_engine_would_suffer_from_is_a_mismatch_naming_it(fake_env, monkeypatch, fault, words):
    tmp_path, gdir, bdir = fake_env
    monkeypatch.setenv("FAKE_GRAPH_FAULT", fault)
    res = _run(tmp_path, gdir, bdir, "--graph", "--only", "tree_accept/chain#graph")
    case = _cases(tmp_path)["tree_accept/chain@cpu#graph"]
    assert case["status"] == "MISMATCH", (case["status"], case["reason"])
    for w in words:
        assert w in case["reason"], case["reason"]
    assert res.exit_code == 1
    assert "--graph" in case["rerun"] and "tree_accept/chain@cpu#graph" in case["rerun"]


def test_the_input_file_holds_two_data_sets_every_row_rotated(tmp_path):
    g = Golden.read(REPO_ROOT / "golden" / "verify_attn" / "ragged.kdtr")
    p = graph.build(g, tmp_path / "in.kdtr")
    f = kdtr.load(tmp_path / "in.kdtr")
    b = g.inputs["q"].shape[0]
    # B = 4 is a capture size: captured at the next one, so that there are padding requests
    assert (p.B, p.Bp) == (b, compose.capture_size(b + 1)) and p.Bp > b
    assert p.Tp == compose.capture_size(p.T + 1) > p.T and p.Sp == compose.capture_size(p.S + 1) > p.S
    q1, q2 = np.asarray(f.tensors["replay1.q"]), np.asarray(f.tensors["input.q"])
    assert q1.shape == q2.shape == (p.Bp, p.Tp) + g.inputs["q"].shape[2:]
    # replay 2: the golden's requests in order, then padding; replay 1: that rotated by one row
    t = g.inputs["q"].shape[1]
    assert p.order[1] == list(range(b)) + [-1] * (p.Bp - b)
    assert p.order[0] == p.order[1][1:] + p.order[1][:1]
    assert np.array_equal(q2[:b, :t], g.inputs["q"], equal_nan=True)
    assert np.array_equal(q1[:b - 1, :t], g.inputs["q"][1:], equal_nan=True)
    assert np.array_equal(q1[-1, :t], g.inputs["q"][0], equal_nan=True)
    tl1, tl2 = np.asarray(f.tensors["replay1.tree_len"]), np.asarray(f.tensors["input.tree_len"])
    assert np.all(tl2[b:] == 0) and np.all(tl1[b - 1:-1] == 0)
    # replay 1's unfilled slots are poison; replay 2's integer ones what replay 1 left there,
    # its float ones poison again
    assert np.isnan(q1[b - 1:-1]).all() and np.isnan(q1[:, t:]).all()
    assert np.isnan(q2[b:]).all() and np.isnan(q2[:, t:]).all()
    assert np.isnan(np.asarray(f.tensors["input.kv_cache"])[b:]).all()
    v1, v2 = np.asarray(f.tensors["replay1.visibility"]), np.asarray(f.tensors["input.visibility"])
    own = tuple(slice(0, n) for n in g.inputs["visibility"].shape[1:])
    assert v1[b:].tobytes() == v2[b:].tobytes() and v2[-1][own].tobytes() == g.inputs["visibility"][0].tobytes()
    assert float(f.tensors["replay1.sm_scale"]) == float(f.tensors["input.sm_scale"])


def test_a_golden_whose_outputs_depend_on_t_keeps_its_t(tmp_path):
    g = Golden.read(REPO_ROOT / "golden" / "tree_build" / "invalid.kdtr")
    reqs = compose.requests("tree_build", g.inputs, g.metadata)
    assert any(compose.t_sensitive(r) for r in reqs)  # a budget over N: BAD_BUDGET at its own T only
    p = graph.build(g, tmp_path / "in.kdtr")
    assert p.Tp == p.T and p.Bp == compose.capture_size(p.B) > p.B
    assert kdtr.load(tmp_path / "in.kdtr").metadata["max_budget"] == p.T - 1


def test_only_selects_by_mode_and_rerun_lines_repeat_it(tmp_path):
    goldens = [("tree_accept", "chain", tmp_path / "chain.kdtr"), ("tree_accept", "a#b", tmp_path / "x.kdtr")]
    cases = plan(goldens, ["cpu", "cuda"], modes=["graph"])
    ids = lambda cs: sorted(c.id for c in cs)  # noqa: E731
    assert ids(select_cases(cases, ["tree_accept/chain@cpu#graph"])) == ["tree_accept/chain@cpu#graph"]
    assert ids(select_cases(cases, ["tree_accept/chain#graph"])) == ["tree_accept/chain@cpu#graph",
                                                                     "tree_accept/chain@cuda#graph"]
    assert len(select_cases(cases, ["tree_accept/chain@cpu"])) == 2  # eager and graph
    assert ids(select_cases(cases, ["tree_accept/a[#]b@cpu"])) == ["tree_accept/a#b@cpu", "tree_accept/a#b@cpu#graph"]
    with pytest.raises(UsageError, match="unknown mode 'grph'"):
        select_cases(cases, ["tree_accept/chain#grph"])
    with pytest.raises(UsageError, match="needs --invariance"):
        select_cases(cases, ["tree_accept/chain#invariance"])
    cfg = RunConfig(golden_dir=tmp_path, bin_dir=tmp_path, out_dir=tmp_path)
    g = next(c for c in cases if c.config == "a#b" and c.mode == "graph" and c.backend == "cpu")
    line = rerun_line(g, cfg)
    assert line == "kdtr run --only 'tree_accept/a[#]b@cpu#graph' --backend cpu --graph"
    assert ids(select_cases(cases, ["tree_accept/a[#]b@cpu#graph"])) == [g.id]
    assert rerun_line(Case("tree_accept", "chain", tmp_path, "cpu"), cfg) == \
        "kdtr run --only tree_accept/chain --backend cpu"
