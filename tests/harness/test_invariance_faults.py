"""kdtr run --invariance against binaries whose composition outputs are malformed or absent,
and goldens that cannot be composed: a verdict that is not PASS, naming the composition
(or the golden's file and field), never a harness error and never a vacuous PASS.

The fake binary (a Python script speaking the binaries' command line) computes each input
file's outputs with the op's reference, then does what ``$FAKE_FAULT`` says in the
compositions it names: ``drop`` (the ``dup+pad`` composition's outputs one row short),
``missing`` (``dup+pad`` without its last output), ``short_t`` (the ``padded``
compositions' first T-dim output cut to T - 1 slots), ``skip_all`` (exit 3, "not supported",
in every composition but the golden's own), ``nan_payload`` / ``neg_zero`` (in ``reversed``:
another NaN payload, -0.0 for 0.0), ``s_dep`` / ``t_dep`` (an element one ulp or one more at
an even S or T: in the padded compositions).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import kdtr
from kdtr import children
from kdtr.judge import Golden
from kdtr.ops import OPS
from kdtr.run import graph, invariance, process
from kdtr.run.cases import Case, RunConfig
from kdtr.status import Status

ROOT = Path(__file__).resolve().parents[2]

_SCRIPT = r'''#!@PYTHON@
import os, sys
import numpy as np
import kdtr
from kdtr.ops import OPS
fault = os.environ.get("FAKE_FAULT", "")
args = sys.argv[1:]
val = lambda k: args[args.index(k) + 1] if k in args else None
backend, batch = val("--backend"), "--batch" in args
pairs = [(args[i + 1], args[i + 3]) for i in range(len(args)) if args[i] == "--input"]
first_rc = 0
for k, (inp, out) in enumerate(pairs):
    with kdtr.load(inp) as f:
        md = dict(f.metadata)
        inputs = {n[6:]: np.array(v) for n, v in f.tensors.items() if n.startswith("input.")}
    comp = md.get("composition", "golden")
    rc = 0
    if fault == "skip_all" and comp != "golden":
        rc = 3
    if rc == 0:
        spec = OPS[md["op"]]
        with np.errstate(all="ignore"):
            res = {n: np.array(v) for n, v in spec.reference(inputs, md).items()}
        names = [s.name for s in spec.outputs]
        f0 = next((n for n in names if res[n].dtype.kind == "f"), None)
        rows = lambda a: a.reshape(a.shape[0], -1)  # noqa: E731
        if fault == "drop" and comp.startswith("dup+pad"):
            res = {n: v[:-1] for n, v in res.items()}
        if fault == "missing" and comp.startswith("dup+pad"):
            del res[names[-1]]
        if fault == "short_t" and comp.startswith("padded"):
            s = next(s for s in spec.outputs if "T" in s.dims[1:])
            res[s.name] = np.ascontiguousarray(res[s.name][:, :-1])
        if fault == "nan_payload" and comp == "reversed":  # another NaN payload, same NaN
            a = res[f0]
            bits = a.view(f"u{a.itemsize}")
            bits[np.isnan(a)] ^= 1
        if fault == "neg_zero" and comp == "reversed":  # -0.0 where 0.0
            a = res[f0]
            a[a == 0] = -0.0
        if fault == "s_dep" and inputs["kv_cache"].shape[1] % 2 == 0:  # one ulp more at an even S
            a = rows(res[f0])
            a[:, 0] = np.nextafter(a[:, 0], np.inf)
        if fault == "t_dep":  # the first output one more at an even T
            t = int(md["max_budget"]) + 1 if "max_budget" in md else inputs["node_token_ids"].shape[1]
            if t % 2 == 0:
                rows(res[names[0]])[:, 0] += 1
        kdtr.save(out, res, {"op": md["op"], "config": md["config"], "backend": backend, "device": "cpu"})
    first_rc = first_rc or rc
    if batch:
        print(f"@kdtr-batch i={k} rc={rc} s=0.001 msg={'not supported here' if rc == 3 else ''}", flush=True)
    elif rc:
        sys.exit(rc)
sys.exit(first_rc)
'''


def _fake(bdir: Path, op: str) -> None:
    bdir.mkdir(parents=True, exist_ok=True)
    path = bdir / f"kdtr_{op}"
    path.write_text(_SCRIPT.replace("@PYTHON@", sys.executable))
    path.chmod(0o755)


def _subset(dest: Path, gid: str) -> Path:
    gdir = dest / "golden"
    manifest = json.loads((ROOT / "golden" / "MANIFEST.json").read_text())
    rel = f"{gid}.kdtr"
    (gdir / rel).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(ROOT / "golden" / rel, gdir / rel)
    manifest["files"] = {rel: manifest["files"][rel]}
    (gdir / "MANIFEST.json").write_text(json.dumps(manifest))
    return gdir


def _run(tmp_path: Path, gdir: Path, gid: str, fault: str, monkeypatch, backend: str = "cpu",
         golden: Path | None = None):
    op, config = gid.split("/")
    bdir = tmp_path / "bin"
    _fake(bdir, op)
    monkeypatch.setenv("FAKE_FAULT", fault)
    cfg = RunConfig(golden_dir=gdir, bin_dir=bdir, out_dir=tmp_path / "out", timeout=60)
    children.reset()
    case = Case(op, config, golden or gdir / op / f"{config}.kdtr", backend, mode="invariance")
    return invariance.run_case(case, cfg)


@pytest.mark.parametrize("fault, status, words", [
    ("drop", Status.NOT_INVARIANT, "composition 'dup+pad B=16'"),
    ("missing", Status.NOT_INVARIANT, "composition 'dup+pad B=16'"),
    ("short_t", Status.MISMATCH, "composition 'padded T=64', row 0 (slots beyond T = 33 of tree_accept/chain#0)"),
])
def test_a_malformed_composition_output_is_a_verdict_naming_it(tmp_path, monkeypatch, fault, status, words):
    gid = "tree_accept/chain"
    res = _run(tmp_path, _subset(tmp_path, gid), gid, fault, monkeypatch)
    assert res.status == status, (res.status, res.reason)
    assert words in res.reason, res.reason


@pytest.mark.parametrize("gid, fault, words", [
    ("verify_attn/nan_scores", "nan_payload", "out differs between composition 'reversed'"),
    ("verify_attn/nan_scores_bf16", "nan_payload", "out differs between composition 'reversed'"),
    ("verify_attn/ragged", "neg_zero", "out differs between composition 'reversed'"),
    ("verify_attn/finite_padding_bf16", "neg_zero", "out differs between composition 'reversed'"),
    ("verify_attn/ragged", "s_dep", "composition 'padded T=32 S=128'"),
    ("greedy_step/k2_dims", "s_dep", "composition 'padded T=16"),
    ("tree_build/ties", "t_dep", "composition 'padded T=128'"),
])
def test_bits_and_padding_dependence_are_not_invariant(tmp_path, monkeypatch, gid, fault, words):
    res = _run(tmp_path, _subset(tmp_path, gid), gid, fault, monkeypatch)
    assert res.status == Status.NOT_INVARIANT, (res.status, res.reason)
    assert words in res.reason, res.reason


def test_no_composition_but_the_golden_is_no_pass(tmp_path, monkeypatch):
    gid = "verify_attn/ragged"
    monkeypatch.setenv("FAKE_GPU", "1")
    res = _run(tmp_path, _subset(tmp_path, gid), gid, "skip_all", monkeypatch, backend="cuda")
    assert res.status != Status.PASS, res.detail
    assert res.status == Status.NOT_SUPPORTED and "no composition but the golden's own ran" in res.reason, res.reason


def _bad_golden(tmp_path: Path, gid: str, edit) -> Path:
    """A copy of the committed golden ``gid`` with its tensors edited by ``edit``."""
    f = kdtr.load(ROOT / "golden" / f"{gid}.kdtr")
    t = {k: np.array(v) for k, v in f.tensors.items()}
    md = dict(f.metadata)
    edit(t, md)
    path = tmp_path / "bad" / f"{gid}.kdtr"
    path.parent.mkdir(parents=True, exist_ok=True)
    kdtr.save(path, t, md)
    return path


BAD = [
    ("tree_accept/chain", lambda t, md: t.update({"input.node_token_ids": t["input.node_token_ids"].astype(np.uint8)}),
     "input.node_token_ids: dtype u8"),
    ("verify_attn/small", lambda t, md: t.update({"input.prefix_len": t["input.prefix_len"].astype(np.uint8)}),
     "input.prefix_len: dtype u8"),
    ("verify_attn/ragged", lambda t, md: t.update({"input.tree_len": t["input.tree_len"][:-1]}), "tree_len"),
]


@pytest.mark.parametrize("gid, edit, words", BAD, ids=[b[0] for b in BAD])
def test_a_golden_compose_refuses_is_an_error_naming_file_and_field(tmp_path, monkeypatch, gid, edit, words):
    path = _bad_golden(tmp_path, gid, edit)
    res = _run(tmp_path, path.parent.parent, gid, "", monkeypatch, golden=path)
    assert res.status == Status.ERROR, (res.status, res.reason)
    assert "harness error" not in res.reason and str(path) in res.reason and words in res.reason, res.reason
    with pytest.raises(ValueError, match=words.split(":")[0]):
        graph.build(Golden.read(path), tmp_path / "graph-in.kdtr")
    # the same golden's --graph case: an ERROR naming it, before any binary runs
    op, config = gid.split("/")
    cfg = RunConfig(golden_dir=path.parent.parent, bin_dir=tmp_path / "bin", out_dir=tmp_path / "out2", timeout=60)
    g = process.run_case(Case(op, config, path, "cpu", mode="graph"), cfg)
    assert g.status == Status.ERROR and f"cannot build the --graph input of {path}" in g.reason, g.reason
    assert words in g.reason, g.reason


def test_every_output_of_every_request_is_compared(tmp_path, monkeypatch):
    # the last output of the last request, in one composition only: still NOT_INVARIANT
    gid = "tree_accept/chain"
    gdir = _subset(tmp_path, gid)
    g = Golden.read(gdir / f"{gid}.kdtr")
    comps, _ = invariance.compositions(g)
    by_name = {c.name: c for c in comps}
    last = OPS["tree_accept"].outputs[-1].name
    rev = by_name["reversed"]
    b = len(comps[0].rows)
    got = _ref(rev)
    # in 'reversed' the golden's last request is row 0
    res = invariance._differences("tree_accept", rev, ({**got, last: _bump(got[last], 0)}, {}), _live(comps[0]), {},
                                  comps[0].rows)
    assert len(res) == 1 and f"{gid}#{b - 1}: {last} differs between composition 'reversed' (row 0)" in res[0], res
    assert invariance._differences("tree_accept", rev, (got, {}), _live(comps[0]), {}, comps[0].rows) == []


def _ref(c: invariance.Composition) -> dict[str, np.ndarray]:
    with np.errstate(all="ignore"):
        return {k: np.array(v) for k, v in OPS[c.meta["op"]].reference(c.inputs, c.meta).items()}


def _bump(a: np.ndarray, row: int) -> np.ndarray:
    a = a.copy()
    a.reshape(a.shape[0], -1)[row, -1] += 1
    return a


def _live(c: invariance.Composition) -> list[dict[str, np.ndarray]]:
    from kdtr import compose
    return compose.live_outputs(c.meta["op"], _ref(c), c.rows)
