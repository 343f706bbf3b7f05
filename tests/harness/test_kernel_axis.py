"""The kernel as a case axis: ``kdtr run --kernel op=K,...`` runs each golden of the op on
the cuda backend once per forced kernel (``op/config@cuda:K``), in batch mode, in every
report; a kernel that does not apply is NOT_SUPPORTED with the binary's reason; an output
of another kernel than the forced one is an ERROR. The same axis in the pytest plugin and
kdtr.testing.

The binaries are a Python fake that speaks the cuda backend (no GPU here): it writes the
golden's expected tensors with metadata ``kernel`` naming the forced kernel's instance,
exits 3 for ``wgmma`` on a golden whose config says f32, and with $FAKE_LIE names another
kernel than the forced one.
"""

from __future__ import annotations

import json
import stat
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import kdtr
from kdtr import goldens, testing
from kdtr import run as runner
from kdtr.cli.main import main

pytest_plugins = ["pytester"]

FAKE = r'''#!{python}
import json, os, sys
sys.path.insert(0, {root!r})
import kdtr
a = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps(a) + "\n")
op = os.path.basename(sys.argv[0])[len("kdtr_"):]
kernel = a[a.index("--kernel") + 1] if "--kernel" in a else "auto"
backend = a[a.index("--backend") + 1]
pairs = list(zip([a[i + 1] for i, x in enumerate(a) if x == "--input"],
                 [a[i + 1] for i, x in enumerate(a) if x == "--output"]))

def one(inp, out):
    config = os.path.basename(inp)[:-5]
    if kernel == "wgmma" and "f32" in config:
        return 3, f"{{op}}: --kernel wgmma does not apply: f32 inputs (wgmma needs bf16)"
    g = kdtr.load(inp)
    ran = {{"auto": "mma_auto", "heap": "heap", "select": "select"}}.get(kernel, kernel + "_bf16_d64")
    if backend == "cpu":
        ran = "cpu_f64"
    if os.environ.get("FAKE_LIE"):
        ran = "simt_f32"
    meta = {{"op": op, "kernel": ran}}
    if ran == "select":
        meta["select_fallbacks"] = 2
    kdtr.save(out, {{k[9:]: v for k, v in g.tensors.items() if k.startswith("expected.")}}, meta)
    return 0, ""

if "--batch" in a:
    first = 0
    for i, (inp, out) in enumerate(pairs):
        rc, msg = one(inp, out)
        first = first or rc
        print(f"@kdtr-batch i={{i}} rc={{rc}} s=0.001 msg={{msg}}", flush=True)
    sys.exit(first)  # the code of the first failing pair (docs/binaries.md)
rc, msg = one(*pairs[0])
if msg:
    print(msg, file=sys.stderr)
sys.exit(rc)
'''

CONFIGS = {"verify_attn": ["a_bf16", "b_f32"], "tree_build": ["c", "d"], "tree_accept": ["e"]}


@pytest.fixture
def env(tmp_path, monkeypatch):
    """(tmp_path, golden dir, bin dir, log): toy goldens of three ops and their fakes."""
    gdir, bdir = tmp_path / "golden", tmp_path / "bin"
    bdir.mkdir()
    for op, configs in CONFIGS.items():
        (gdir / op).mkdir(parents=True)
        for c in configs:
            kdtr.save(gdir / op / f"{c}.kdtr",
                      {"input.x": np.arange(4, dtype=np.int32), "expected.y": np.arange(4, dtype=np.int32) * 2},
                      {"op": op, "config": c, "contract.y.kind": "exact"})
        fake = bdir / f"kdtr_{op}"
        fake.write_text(FAKE.format(python=sys.executable, root=str(Path(__file__).resolve().parents[2])))
        fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    goldens.write_manifest(gdir, goldens.manifest_of_files(gdir))
    log = tmp_path / "log.jsonl"
    monkeypatch.setenv("FAKE_LOG", str(log))
    monkeypatch.delenv("FAKE_LIE", raising=False)
    return tmp_path, gdir, bdir, log


def _run(tmp_path, gdir, bdir, *args):
    return CliRunner().invoke(main, ["run", "--golden-dir", str(gdir), "--bin-dir", str(bdir),
                                     "--report-dir", str(tmp_path / "reports"), "--timeout", "120", *args])


def _cases(tmp_path) -> dict[str, dict]:
    data = json.loads((tmp_path / "reports" / "conformance.json").read_text())
    return {c["id"]: c for c in data["cases"]}


def _log(log: Path) -> list[list[str]]:
    return [json.loads(ln) for ln in log.read_text().splitlines()]


def test_each_forced_kernel_is_its_own_case_in_one_batch_per_kernel(env):
    tmp_path, gdir, bdir, log = env
    r = _run(tmp_path, gdir, bdir, "--backend", "cpu", "--backend", "cuda",
             "--kernel", "verify_attn=wgmma,mma", "--kernel", "tree_build=all")
    assert r.exit_code == 0, r.output
    cases = _cases(tmp_path)
    assert sorted(cases) == sorted([
        "verify_attn/a_bf16@cpu", "verify_attn/b_f32@cpu", "verify_attn/a_bf16@cuda:wgmma",
        "verify_attn/b_f32@cuda:wgmma", "verify_attn/a_bf16@cuda:mma", "verify_attn/b_f32@cuda:mma",
        "tree_build/c@cpu", "tree_build/d@cpu", "tree_build/c@cuda:heap", "tree_build/d@cuda:heap",
        "tree_build/c@cuda:select", "tree_build/d@cuda:select", "tree_accept/e@cpu", "tree_accept/e@cuda"])
    assert {c["status"] for i, c in cases.items() if i != "verify_attn/b_f32@cuda:wgmma"} == {"PASS"}
    ns = cases["verify_attn/b_f32@cuda:wgmma"]
    assert ns["status"] == "NOT_SUPPORTED" and "does not apply: f32 inputs" in ns["reason"]
    mma = cases["verify_attn/a_bf16@cuda:mma"]
    assert mma["kernel"] == "mma" and mma["backend"] == "cuda" and mma["detail"] == "ran mma_bf16_d64"
    assert mma["process"] == "batch" and mma["output_file"].endswith("a_bf16.cuda.mma.kdtr")
    assert "--kernel verify_attn=mma" in mma["rerun"]
    assert cases["tree_build/c@cuda:select"]["detail"] == "ran select; select_fallbacks 2"
    assert cases["tree_accept/e@cuda"]["kernel"] is None and cases["verify_attn/a_bf16@cpu"]["kernel"] is None
    # one batch process per (op, backend, kernel), the kernel forced on its command line
    cuda_runs = [a for a in _log(log) if a[a.index("--backend") + 1] == "cuda"]
    kernels = sorted((Path(a[a.index("--input") + 1]).parent.name, a[a.index("--kernel") + 1] if "--kernel" in a
                      else None) for a in cuda_runs)
    assert kernels == [("tree_accept", None), ("tree_build", "heap"), ("tree_build", "select"),
                       ("verify_attn", "mma"), ("verify_attn", "wgmma")]
    assert all("--batch" in a for a in cuda_runs if "--kernel" in a)
    # every report names the kernel
    md = (tmp_path / "reports" / "conformance.md").read_text()
    assert "| op | config | cpu | cuda | cuda:heap | cuda:mma | cuda:select | cuda:wgmma |" in md
    assert "verify_attn/a_bf16@cuda:mma: ran mma_bf16_d64" in md
    junit = ET.parse(tmp_path / "reports" / "junit.xml")
    names = {tc.get("name") for tc in junit.iter("testcase")}
    assert "a_bf16[cuda:mma]" in names and "c[cuda:select]" in names and "e[cuda]" in names


def test_auto_keeps_the_unforced_case_beside_the_forced_ones(env):
    tmp_path, gdir, bdir, log = env
    r = _run(tmp_path, gdir, bdir, "--backend", "cuda", "--only", "verify_attn/a_bf16", "--kernel",
             "verify_attn=auto,simt")
    assert r.exit_code == 0, r.output
    assert sorted(_cases(tmp_path)) == ["verify_attn/a_bf16@cuda", "verify_attn/a_bf16@cuda:simt"]


def test_a_case_id_with_its_kernel_selects_that_case_alone(env):
    tmp_path, gdir, bdir, log = env
    r = _run(tmp_path, gdir, bdir, "--backend", "cpu", "--backend", "cuda", "--only", "verify_attn/a_bf16@cuda:mma",
             "--only", "tree_build/c@cuda", "--kernel", "verify_attn=all", "--kernel", "tree_build=all")
    assert r.exit_code == 0, r.output
    assert sorted(_cases(tmp_path)) == ["tree_build/c@cuda:heap", "tree_build/c@cuda:select",
                                        "verify_attn/a_bf16@cuda:mma"]
    r = _run(tmp_path, gdir, bdir, "--backend", "cuda", "--only", "verify_attn/a_bf16@cuda:mma")
    assert r.exit_code == 2 and "matches no case" in r.output and "--kernel" in r.output, r.output


def test_an_output_of_another_kernel_than_the_forced_one_is_an_error(env, monkeypatch):
    tmp_path, gdir, bdir, log = env
    monkeypatch.setenv("FAKE_LIE", "1")
    r = _run(tmp_path, gdir, bdir, "--backend", "cuda", "--only", "verify_attn", "--kernel", "verify_attn=mma,simt")
    assert r.exit_code == 1, r.output
    cases = _cases(tmp_path)
    bad = cases["verify_attn/a_bf16@cuda:mma"]
    assert bad["status"] == "ERROR" and "kernel mma was forced" in bad["reason"] and "simt_f32" in bad["reason"]
    assert cases["verify_attn/a_bf16@cuda:simt"]["status"] == "PASS"  # simt_f32 is an instance of simt


@pytest.mark.parametrize("spec, words", [
    ("nosuchop=mma", "unknown op 'nosuchop'"),
    ("verify_attn=warp9", "no kernel 'warp9'"),
    ("tree_accept=heap", "tree_accept has no kernel choice"),
    ("verify_attn", "expected OP=KERNEL"),
])
def test_an_unknown_op_or_kernel_is_a_one_line_usage_error(env, spec, words):
    tmp_path, gdir, bdir, log = env
    r = _run(tmp_path, gdir, bdir, "--backend", "cuda", "--kernel", spec)
    assert r.exit_code == 2 and words in r.output and len(r.output.strip().splitlines()) == 1, r.output
    assert not log.exists()  # nothing ran


def test_a_forced_kernel_needs_the_cuda_backend(env):
    tmp_path, gdir, bdir, log = env
    r = _run(tmp_path, gdir, bdir, "--backend", "cpu", "--kernel", "verify_attn=mma")
    assert r.exit_code == 2 and "add --backend cuda" in r.output, r.output


def test_a_waiver_may_name_one_forced_kernel(env, monkeypatch):
    tmp_path, gdir, bdir, log = env
    (gdir / "known_failures.json").write_text(json.dumps({"verify_attn/a_bf16@cuda:mma": "mma rounds differently"}))
    monkeypatch.setenv("FAKE_LIE", "1")
    r = _run(tmp_path, gdir, bdir, "--backend", "cuda", "--only", "verify_attn/a_bf16", "--kernel",
             "verify_attn=mma,wgmma")
    cases = _cases(tmp_path)
    assert cases["verify_attn/a_bf16@cuda:mma"]["status"] == "WAIVED"
    assert cases["verify_attn/a_bf16@cuda:wgmma"]["status"] == "ERROR"
    assert r.exit_code == 1 and "names no golden" not in r.output


def test_a_run_reads_each_golden_once_whatever_its_backends_and_kernels(env):
    tmp_path, gdir, bdir, log = env
    found, problems = runner.check_manifest(gdir, runner.discover(gdir), vouched := {})
    cases = runner.plan(found, ["cpu", "cuda"], runner.parse_kernels(["verify_attn=all", "tree_build=all"]))
    assert len(cases) == 2 * 4 + 2 * 3 + 1 * 2
    cfg = runner.RunConfig(golden_dir=gdir, bin_dir=bdir, out_dir=tmp_path / "out", vouched=vouched,
                           golden_problems=problems)
    results = runner.run_all(cases, cfg, jobs=2)
    assert {r.status for r in results} <= {"PASS", "NOT_SUPPORTED"}
    assert cfg.goldens.reads == len(found) == 5


def test_testing_goldens_take_the_kernel_axis(env):
    tmp_path, gdir, bdir, log = env
    gs = testing.goldens("verify_attn", gdir, kernels=["auto", "mma", "wgmma"])
    assert [g.id for g in gs] == ["verify_attn/a_bf16", "verify_attn/a_bf16:mma", "verify_attn/a_bf16:wgmma",
                                  "verify_attn/b_f32", "verify_attn/b_f32:mma", "verify_attn/b_f32:wgmma"]
    assert [g.kernel for g in gs[:3]] == [None, "mma", "wgmma"] and gs[1].expected is gs[0].expected
    assert [g.kernel for g in testing.goldens("tree_build", gdir, kernels="all")] == ["heap", "select"] * 2
    with pytest.raises(testing.GoldenError, match="no kernel 'warp9'"):
        testing.goldens("verify_attn", gdir, kernels=["warp9"])


def test_the_pytest_plugin_takes_the_kernel_axis(env, pytester):
    tmp_path, gdir, bdir, log = env
    pytester.makepyfile(test_mine=f'''
import pytest

@pytest.mark.kdtr_golden(op="tree_build", golden_dir={str(gdir)!r}, kernels=["heap", "select"])
def test_it(kdtr_golden):
    assert kdtr_golden.kernel in ("heap", "select")
''')
    result = pytester.runpytest("-v", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["*test_it?tree_build/c:select?*PASSED*"])
    (pytester.path / "test_mine.py").unlink()
    result = pytester.runpytest(
        "--kdtr", "--kdtr-golden-dir", str(gdir), "--kdtr-bin-dir", str(bdir),
        "--kdtr-backend", "cuda", "--kdtr-only", "verify_attn", "--kdtr-kernel", "verify_attn=wgmma", "-v",
        "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*verify_attn/a_bf16@cuda:wgmma PASSED*"])
