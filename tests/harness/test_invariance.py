"""kdtr run --invariance: compositions of a golden's requests, NOT_INVARIANT, and the CPU cores end to end.

The fake binary here is a Python script that speaks the binaries' command line (``--input``
/ ``--output`` pairs, ``--batch`` result lines, ``--backend``, ``--kernel``) and computes
each input file's outputs with the op's numpy reference, then breaks them as ``$FAKE_INV``
says: ``row`` (an output depends on the batch row), ``b1`` (on the batch size: B = 1),
``wrong`` (every composition the same wrong answer: invariant but wrong), ``padding``
(the padding requests' status), ``kernel`` (another kernel in one composition), ``segv``
(dies in the ``padded`` compositions), ``nosupport`` (rc 3 in the ``padded`` compositions).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

import fakes
from kdtr import children, compose
from kdtr.judge import Golden
from kdtr.run import invariance
from kdtr.run.cases import Case, RunConfig
from kdtr.status import Status

ROOT = Path(__file__).resolve().parents[2]

_SCRIPT = r'''#!@PYTHON@
import os, sys
import numpy as np
import kdtr
from kdtr.ops import OPS
mode = os.environ.get("FAKE_INV", "")
log = os.environ.get("FAKE_INV_LOG")
if log:
    with open(log, "a") as f:
        f.write(repr(sys.argv[1:]) + "\n")
args = sys.argv[1:]
val = lambda k: args[args.index(k) + 1] if k in args else None
backend, kernel, batch = val("--backend"), val("--kernel"), "--batch" in args
pairs = [(args[i + 1], args[i + 3]) for i in range(len(args)) if args[i] == "--input"]
first_rc = 0
for k, (inp, out) in enumerate(pairs):
    with kdtr.load(inp) as f:
        md = dict(f.metadata)
        inputs = {n[6:]: np.array(v) for n, v in f.tensors.items() if n.startswith("input.")}
    comp = md.get("composition", "golden")
    rc = 0
    if backend == "cuda" and not os.environ.get("FAKE_GPU"):
        rc = 3
    elif mode == "segv" and comp.startswith("padded"):
        os.kill(os.getpid(), 11)
    elif mode == "nosupport" and comp.startswith("padded"):
        rc = 3
    elif mode == "hang" and comp == "reversed":
        import time
        time.sleep(600)
    if rc == 0:
        op = md["op"]
        res = {n: np.array(v) for n, v in OPS[op].reference(inputs, md).items()}
        b = res["status"].shape[0]
        if mode == "row" and b > 1:
            res["proposed"][1, 0] += 1
        if mode == "b1" and b == 1:
            res["accepted_count"][0] += 7
        if mode == "wrong":
            res["accepted_count"] += 1
        if mode == "padding" and comp.startswith("dup+pad"):
            res["status"][-1] = 9
        if mode == "beyond" and comp.startswith("padded"):
            res["accepted_path"][0, -1] = 3
        meta = {"op": op, "config": md["config"], "backend": backend, "device": "cpu"}
        if kernel:
            meta["kernel"] = ("cpu_" if backend == "cpu" else "") + kernel
            if mode == "kernel" and comp == "alone#0":
                meta["kernel"] = "other"
        kdtr.save(out, res, meta)
    first_rc = first_rc or rc
    if batch:
        print(f"@kdtr-batch i={k} rc={rc} s=0.001 msg={'no CUDA device' if rc == 3 else ''}", flush=True)
    elif rc:
        sys.exit(rc)
if batch and mode == "segv_after":
    os.kill(os.getpid(), 11)
sys.exit(first_rc)  # a batch exits with its first nonzero result code
'''


def _fake(bdir: Path, op: str) -> Path:
    bdir.mkdir(parents=True, exist_ok=True)
    path = bdir / f"kdtr_{op}"
    path.write_text(_SCRIPT.replace("@PYTHON@", sys.executable))
    path.chmod(0o755)
    return path


def _subset(dest: Path, ids: list[str]) -> Path:
    """dest/golden holding the committed goldens ``ids`` and a MANIFEST.json listing them."""
    gdir = dest / "golden"
    manifest = json.loads((ROOT / "golden" / "MANIFEST.json").read_text())
    files = {}
    for gid in ids:
        rel = f"{gid}.kdtr"
        (gdir / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / "golden" / rel, gdir / rel)
        files[rel] = manifest["files"][rel]
    manifest["files"] = files
    (gdir / "MANIFEST.json").write_text(json.dumps(manifest))
    return gdir


def _case(gdir: Path, gid: str, backend: str = "cpu", kernel: str | None = None) -> Case:
    op, config = gid.split("/")
    return Case(op, config, gdir / op / f"{config}.kdtr", backend, kernel=kernel, mode="invariance")


def _run(tmp_path: Path, gdir: Path, gid: str, env: dict[str, str] | None = None, cfg_kw: dict | None = None, **kw):
    bdir = tmp_path / "bin"
    _fake(bdir, gid.split("/")[0])
    cfg = RunConfig(golden_dir=gdir, bin_dir=bdir, out_dir=tmp_path / "out", **{"timeout": 60, **(cfg_kw or {})})
    children.reset()  # as run_all does: a run stopped earlier in this process leaves new children killed
    old = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        return invariance.run_case(_case(gdir, gid, **kw), cfg)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_compositions_of_a_golden():
    g = Golden.read(ROOT / "golden" / "tree_accept" / "malformed.kdtr")
    cfg = RunConfig(golden_dir=ROOT / "golden", bin_dir=ROOT, out_dir=ROOT)
    comps, notes = invariance.compositions(g, cfg)
    names = [c.name for c in comps]
    assert names[0] == "golden" and names[1:9] == [f"alone#{i}" for i in range(8)]
    assert {"reversed", "interleaved", "mixed", "padded T=32", "padded T=18", "dup+pad B=32"} <= set(names)
    by = {c.name: c for c in comps}
    assert by["reversed"].own == list(range(8))[::-1]
    assert by["alone#3"].own == [3] and by["alone#3"].inputs["node_count"].shape == (1,)
    # node_count outside [0, T - 1] (#5, #6): valid under a larger T, so kept out of it
    sens = {i for i, r in enumerate(comps[0].rows) if compose.t_sensitive(r)}
    assert sens == {5, 6} and any("#5, #6" in n for n in notes)
    for name in ("padded T=32", "padded T=18"):
        assert set(by[name].own) == set(range(8)) - sens
        assert by[name].inputs["node_token_ids"].shape[1] == by[name].T == int(name.split("=")[1])
    mixed = by["mixed"]
    assert sum(i >= 0 for i in mixed.own) >= 6 and any(r.source.startswith("tree_accept/bad_links") for r in mixed.rows)
    dup = by["dup+pad B=32"]
    assert dup.rows[0].is_padding and dup.own[1:17] == list(range(8)) * 2 and all(r.is_padding for r in dup.rows[17:])


def test_a_row_dependent_output_is_not_invariant(tmp_path):
    gdir = _subset(tmp_path, ["tree_accept/chain"])
    r = _run(tmp_path, gdir, "tree_accept/chain", {"FAKE_INV": "row"})
    assert r.status == Status.NOT_INVARIANT, r.reason
    # row 1 of every multi-request batch is off: request #1 in 'golden' against request
    # #1 alone, the first composition compared
    assert r.reason.startswith("tree_accept/chain#1: proposed differs between composition 'alone#1' (row 0) "
                               "and 'golden' (row 1)"), r.reason
    assert "at [0]" in r.reason and "more" in r.reason
    assert "--invariance" in r.rerun


def test_a_batch_size_dependent_output_is_not_invariant(tmp_path):
    gdir = _subset(tmp_path, ["tree_accept/chain"])
    r = _run(tmp_path, gdir, "tree_accept/chain", {"FAKE_INV": "b1"})
    assert r.status == Status.NOT_INVARIANT
    assert r.reason.startswith("tree_accept/chain#0: accepted_count differs between composition 'alone#0' (row 0) "
                               "and 'golden' (row 0)"), r.reason
    assert "at []" in r.reason and "0x" in r.reason


def test_invariant_but_wrong_is_not_pass(tmp_path):
    gdir = _subset(tmp_path, ["tree_accept/chain"])
    r = _run(tmp_path, gdir, "tree_accept/chain", {"FAKE_INV": "wrong"})
    assert r.status == Status.MISMATCH
    assert r.reason.startswith("composition 'golden': accepted_count"), r.reason


def test_padding_request_outputs_are_held_to_the_documented_values(tmp_path):
    gdir = _subset(tmp_path, ["tree_accept/chain"])
    r = _run(tmp_path, gdir, "tree_accept/chain", {"FAKE_INV": "padding"})
    assert r.status == Status.MISMATCH
    assert "composition 'dup+pad B=16', row 15 (padding request): status[]: 9" in r.reason, r.reason


def test_slots_beyond_a_requests_t_are_held_to_the_documented_values(tmp_path):
    gdir = _subset(tmp_path, ["tree_accept/chain"])
    r = _run(tmp_path, gdir, "tree_accept/chain", {"FAKE_INV": "beyond"})
    assert r.status == Status.MISMATCH
    assert ("composition 'padded T=64', row 0 (slots beyond T = 33 of tree_accept/chain#0): accepted_path[30]: 3, "
            "documented -1 (1 differ)") in r.reason, r.reason


def test_forced_kernel_reaches_every_composition(tmp_path):
    gdir = _subset(tmp_path, ["tree_accept/chain"])
    log = tmp_path / "argv.log"
    r = _run(tmp_path, gdir, "tree_accept/chain", {"FAKE_INV_LOG": str(log)}, kernel="k1")
    assert r.status == Status.PASS, r.reason
    assert r.detail.startswith("ran cpu_k1; 12 compositions: golden, alone x6, reversed, interleaved, padded T=64")
    argv = [eval(ln) for ln in log.read_text().splitlines()]  # noqa: S307 - our own repr lines
    assert len(argv) == 1 and argv[0][0] == "--batch" and argv[0][-2:] == ["--kernel", "k1"]
    assert argv[0].count("--input") == 12
    r = _run(tmp_path, gdir, "tree_accept/chain", {"FAKE_INV": "kernel"}, kernel="k1")
    assert r.status == Status.ERROR and "composition 'alone#0': kernel cpu_k1 was forced" in r.reason, r.reason


def test_crash_and_not_supported(tmp_path):
    gdir = _subset(tmp_path, ["tree_accept/chain"])
    r = _run(tmp_path, gdir, "tree_accept/chain", {"FAKE_INV": "segv"})
    assert r.status == Status.CRASH
    assert r.reason.startswith("composition 'padded T=64': no result, the process stopped: killed by SIGSEGV")
    r = _run(tmp_path, gdir, "tree_accept/chain", {"FAKE_INV": "segv_after"})
    assert r.status == Status.CRASH
    assert r.reason == "the batch process ended after its last composition: killed by SIGSEGV (its results said 0)"
    r = _run(tmp_path, gdir, "tree_accept/chain", backend="cuda")
    assert r.status == Status.NOT_SUPPORTED and r.reason == "kdtr_tree_accept: no CUDA device"
    # a composition the kernel does not apply to is left out, and said so
    r = _run(tmp_path, gdir, "tree_accept/chain", {"FAKE_INV": "nosupport"}, backend="cuda")
    assert r.status == Status.NOT_SUPPORTED  # the golden's own composition too (no GPU)
    r = _run(tmp_path, gdir, "tree_accept/chain", {"FAKE_INV": "nosupport", "FAKE_GPU": "1"}, backend="cuda")
    assert r.status == Status.PASS and "not supported here: 'padded T=64', 'padded T=34'" in r.detail, r.detail


CPU_GOLDENS = ["tree_accept/malformed", "tree_accept/chain", "tree_build/invalid", "tree_build/status_precedence",
               "verify_attn/ragged", "verify_attn/chain", "verify_attn/nan_scores_bf16", "greedy_step/finite_padding"]


def test_cpu_cores_are_invariant_end_to_end(tmp_path):
    """``kdtr run --invariance --backend cpu`` with the real CPU binaries (build/bin)."""
    for op in ("tree_accept", "tree_build", "verify_attn", "greedy_step"):
        assert (ROOT / "build" / "bin" / f"kdtr_{op}").exists(), "run `make` first"
    gdir = _subset(tmp_path, CPU_GOLDENS)
    res = fakes.invoke(tmp_path, gdir, ROOT / "build" / "bin", "--invariance", "--backend", "cpu")
    cases = fakes.report_cases(tmp_path)
    inv = {k: v for k, v in cases.items() if k.endswith("#invariance")}
    assert sorted(inv) == sorted(f"{g}@cpu#invariance" for g in CPU_GOLDENS)
    bad = {k: (v["status"], v["reason"]) for k, v in inv.items() if v["status"] != "PASS"}
    assert not bad, bad
    assert res.exit_code == 0, res.output
    assert "mixed (+" in inv["tree_build/invalid@cpu#invariance"]["detail"]
    assert "padded T=16 S=" in inv["verify_attn/ragged@cpu#invariance"]["detail"] or \
        "padded T=32 S=128" in inv["verify_attn/ragged@cpu#invariance"]["detail"]


@pytest.mark.parametrize("gid", ["tree_accept/chain"])
def test_not_invariant_fails_the_run_through_the_cli(tmp_path, gid):
    gdir = _subset(tmp_path, [gid])
    bdir = tmp_path / "bin"
    _fake(bdir, "tree_accept")
    res = fakes.invoke(tmp_path, gdir, bdir, "--invariance", "--backend", "cpu", FAKE_INV="row")
    cases = fakes.report_cases(tmp_path)
    assert cases[f"{gid}@cpu#invariance"]["status"] == "NOT_INVARIANT"
    assert cases[f"{gid}@cpu"]["status"] == "MISMATCH"  # the eager case sees the wrong row 1 too
    assert res.exit_code == 1
    # JUnit: a NOT_INVARIANT case is a <failure> of that type, counted in the suite's failures
    import xml.etree.ElementTree as ET

    suite = ET.parse(tmp_path / "reports" / "junit.xml").getroot().find("testsuite")
    fails = [tc.find("failure") for tc in suite.iter("testcase") if tc.get("name", "").endswith("#invariance]")]
    assert [f.get("type") for f in fails if f is not None] == ["NOT_INVARIANT"]
    assert suite.get("failures") == "2"  # the eager MISMATCH and the NOT_INVARIANT


def test_sanitizer_report_names_the_composition(tmp_path):
    gdir = _subset(tmp_path, ["tree_accept/root_only"])
    san = fakes.make_sanitizer(tmp_path / "san")
    log = tmp_path / "argv.log"
    r = _run(tmp_path, gdir, "tree_accept/root_only", {"FAKE_GPU": "1", "FAKE_SAN_ERR": "004_alone_3.input",
                                                        "FAKE_INV_LOG": str(log)},
             {"sanitizer": "memcheck", "sanitizer_bin": str(san)}, backend="cuda")
    assert r.status == Status.CRASH
    assert r.reason.startswith("composition 'alone#3': compute-sanitizer memcheck reported errors: ERROR SUMMARY: "
                               "1 error"), r.reason
    runs = [eval(ln) for ln in log.read_text().splitlines()]  # noqa: S307 - our own repr lines
    # the batch, then one process each up to the one that reports (golden, alone#0..3)
    assert runs[0][0] == "--batch" and [a.count("--input") for a in runs[1:]] == [1] * 5


def test_timeout_names_the_composition(tmp_path):
    gdir = _subset(tmp_path, ["tree_accept/root_only"])
    r = _run(tmp_path, gdir, "tree_accept/root_only", {"FAKE_INV": "hang"}, {"timeout": 8})
    assert r.status == Status.TIMEOUT and r.reason == "composition 'reversed': killed after 8 s", r.reason


def test_one_process_per_composition_without_batch(tmp_path):
    gdir = _subset(tmp_path, ["tree_accept/root_only"])
    log = tmp_path / "argv.log"
    r = _run(tmp_path, gdir, "tree_accept/root_only", {"FAKE_INV_LOG": str(log)}, {"batch": False})
    assert r.status == Status.PASS, r.reason
    runs = [eval(ln) for ln in log.read_text().splitlines()]  # noqa: S307 - our own repr lines
    assert len(runs) == 10 and all("--batch" not in a and a.count("--input") == 1 for a in runs)
    assert r.process == "single"
    r = _run(tmp_path, gdir, "tree_accept/root_only", {"FAKE_INV": "b1"}, {"batch": False})
    assert r.status == Status.NOT_INVARIANT and "'alone#0' (row 0) and 'golden' (row 0)" in r.reason
    r = _run(tmp_path, gdir, "tree_accept/root_only", {"FAKE_INV": "nosupport", "FAKE_GPU": "1"}, {"batch": False},
             backend="cuda")
    assert r.status == Status.PASS and "not supported here: 'padded T=32', 'padded T=18'" in r.detail, r.reason


@pytest.mark.parametrize("key, waived", [("tree_accept/chain", False), ("tree_accept/chain@cpu", False),
                                         ("tree_accept/chain#invariance", True),
                                         ("tree_accept/chain@cpu#invariance", True)])
def test_an_eager_waiver_does_not_waive_the_invariance_case(tmp_path, key, waived):
    """A waiver of the eager case (a known kernel bug) must not hide a NOT_INVARIANT of the
    golden: a mode case is waived only by a key naming its mode."""
    gid = "tree_accept/chain"
    gdir = _subset(tmp_path, [gid])
    (gdir / "known_failures.json").write_text(json.dumps({key: "known bug"}))
    bdir = tmp_path / "bin"
    _fake(bdir, "tree_accept")
    res = fakes.invoke(tmp_path, gdir, bdir, "--invariance", "--backend", "cpu", FAKE_INV="row")
    cases = fakes.report_cases(tmp_path)
    assert cases[f"{gid}@cpu#invariance"]["status"] == ("WAIVED" if waived else "NOT_INVARIANT")
    assert cases[f"{gid}@cpu"]["status"] == ("MISMATCH" if waived else "WAIVED")
    assert res.exit_code == 1
    assert "names no golden" not in res.output  # every form of the key is a known one
