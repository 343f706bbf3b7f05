"""What `pytest --kdtr -m kdtr` selects, and what a binary directory lacking some ops says.

The marker ``kdtr`` belongs to the --kdtr cases (golden x backend of the binaries): a user's
kdtr_golden fixture tests, in the documented form ``@pytest.mark.kdtr_golden(op=...)`` or in
the earlier ``@pytest.mark.kdtr(op=...)``, are never selected by ``-m kdtr``. A binary
directory that lacks some ``kdtr_<op>`` gets one line naming the directory and the missing
names, with advice that fits it (``make`` is for the checkout's build/bin only).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import REPO_ROOT, op_binary
from kdtr.cli.main import main

pytest_plugins = ["pytester"]

GOLDEN = REPO_ROOT / "golden"

USER_TESTS = """
import pytest
from kdtr.ops.tree_accept import tree_accept
from kdtr.testing import assert_conforms

@pytest.mark.{mark}(op="tree_accept")
def test_mine(kdtr_golden):
    assert_conforms(kdtr_golden, tree_accept(**kdtr_golden.inputs).as_dict())

@pytest.mark.{mark}(op="tree_accept", config="chain")
def test_wrong(kdtr_golden):
    out = tree_accept(**kdtr_golden.inputs).as_dict()
    out["accepted_count"] = out["accepted_count"] + 1
    assert_conforms(kdtr_golden, out)
"""


def _outcomes(result: pytest.RunResult) -> dict[str, int]:
    return {k: v for k, v in result.parseoutcomes().items() if k not in ("warnings", "warning", "seconds")}


def _n_accept() -> int:
    return len(list((GOLDEN / "tree_accept").glob("*.kdtr")))


@pytest.mark.parametrize("mark", ["kdtr", "kdtr_golden"])
def test_m_kdtr_selects_only_the_binary_cases(pytester: pytest.Pytester, mark: str) -> None:
    op_binary("tree_accept")
    pytester.makepyfile(test_user=USER_TESTS.format(mark=mark))
    n = _n_accept()
    result = pytester.runpytest("--kdtr", "--kdtr-only", "tree_accept", "-m", "kdtr", "-p", "no:cacheprovider")
    # cpu passes, cuda is NOT_SUPPORTED here (a skip); the user's fixture tests are deselected
    assert _outcomes(result) == {"passed": n, "skipped": n, "deselected": n + 1}, result.stdout.str()[-3000:]


@pytest.mark.parametrize("mark", ["kdtr", "kdtr_golden"])
def test_the_fixture_tests_run_in_either_form(pytester: pytest.Pytester, mark: str) -> None:
    pytester.makepyfile(test_user=USER_TESTS.format(mark=mark))
    result = pytester.runpytest("-p", "no:cacheprovider", "-m", "kdtr_golden")
    assert _outcomes(result) == {"passed": _n_accept(), "failed": 1}
    if mark == "kdtr":  # the earlier form: told to write kdtr_golden
        result.stdout.fnmatch_lines(["*PytestDeprecationWarning*write @pytest.mark.kdtr_golden(op=...)*"])
    else:
        assert "PytestDeprecationWarning" not in result.stdout.str()


def _bin_dir_with(tmp_path: Path, ops: list[str]) -> Path:
    bdir = tmp_path / "mybin"
    bdir.mkdir()
    for op in ops:
        os.symlink(op_binary(op), bdir / f"kdtr_{op}")
    return bdir


def _golden_dir(tmp_path: Path, picks: dict[str, list[str]]) -> Path:
    gdir = tmp_path / "golden"
    manifest = json.loads((GOLDEN / "MANIFEST.json").read_text())
    files = {}
    for op, configs in picks.items():
        (gdir / op).mkdir(parents=True)
        for c in configs:
            rel = f"{op}/{c}.kdtr"
            shutil.copyfile(GOLDEN / rel, gdir / rel)
            files[rel] = manifest["files"][rel]
    manifest["files"] = files
    (gdir / "MANIFEST.json").write_text(json.dumps(manifest))
    return gdir


PICKS = {"tree_accept": ["chain", "mid"], "tree_build": ["chain", "root_only", "near_ties"]}


def test_kdtr_run_says_once_what_an_external_bin_dir_lacks(tmp_path: Path) -> None:
    gdir = _golden_dir(tmp_path, PICKS)
    bdir = _bin_dir_with(tmp_path, ["tree_accept"])
    rdir = tmp_path / "reports"
    r = CliRunner().invoke(main, ["run", "--golden-dir", str(gdir), "--bin-dir", str(bdir), "--report-dir", str(rdir),
                                  "--backend", "cpu"], catch_exceptions=False)
    assert r.exit_code == 1
    assert "run `make`" not in r.output and r.output.count("not found") == 0, r.output
    line = (f"kdtr: error: {bdir} has no kdtr_tree_build: 3 cases ERROR (the binary directory given: put it "
            "there, or select the ops it has with --only)")
    assert r.output.count(line) == 1, r.output
    cases = {c["id"]: c for c in json.loads((rdir / "conformance.json").read_text())["cases"]}
    assert cases["tree_build/chain@cpu"]["reason"] == \
        f"binary kdtr_tree_build not found in {bdir} (the binary directory given)"
    assert cases["tree_accept/chain@cpu"]["status"] == "PASS"
    assert f"Binaries tested: {bdir.resolve()}." in (rdir / "conformance.md").read_text()


def test_pytest_kdtr_says_once_what_an_external_bin_dir_lacks(pytester: pytest.Pytester, tmp_path: Path) -> None:
    gdir = _golden_dir(tmp_path, PICKS)
    bdir = _bin_dir_with(tmp_path, ["tree_accept"])
    result = pytester.runpytest("--kdtr", f"--kdtr-bin-dir={bdir}", f"--kdtr-golden-dir={gdir}",
                                "--kdtr-backend", "cpu", "-p", "no:cacheprovider")
    assert _outcomes(result) == {"passed": 2, "failed": 3}
    out = result.stdout.str()
    assert "run `make`" not in out
    result.stdout.fnmatch_lines([f"kdtr: binaries from {bdir}, goldens from {gdir}"])
    assert out.count(f"kdtr: {bdir} has no kdtr_tree_build: 3 cases ERROR (the binary directory given: put it "
                     "there, or select the ops it has with --kdtr-only)") == 1, out[-3000:]
    result.stdout.fnmatch_lines([f"tree_build/chain@cpu: ERROR: binary kdtr_tree_build not found in {bdir}*"])


def test_the_checkouts_build_bin_still_says_run_make(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kdtr import run as runner

    fake_root = tmp_path / "checkout"
    (fake_root / "build" / "bin").mkdir(parents=True)
    monkeypatch.setenv("KDTR_ROOT", str(fake_root))
    own = fake_root / "build" / "bin"
    assert runner.missing_binary(own, "tree_build") == f"binary {own / 'kdtr_tree_build'} not found (run `make`)"
    assert runner.missing_binaries_line({"tree_build": 3, "verify_attn": 1}, own) == \
        f"{own} has no kdtr_tree_build, kdtr_verify_attn: 4 cases ERROR (run `make`)"
