"""The pytest plugin (kdtr/pytest_plugin.py), run in inner pytest sessions (pytester).

The plugin is loaded by its ``pytest11`` entry point, as in a user's project (the inner
sessions get no ``-p``): the package must be installed (``make venv``: pip install -e).
"""

from __future__ import annotations

import os
import shutil
import xml.etree.ElementTree as ET
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from conftest import golden_subset
from fakes import make_fake

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "golden"
BIN = REPO / "build" / "bin"
ACCEPT_BIN = BIN / "kdtr_tree_accept"


@pytest.fixture(autouse=True)
def _built() -> None:
    if not (ACCEPT_BIN.is_file() and os.access(ACCEPT_BIN, os.X_OK)):
        pytest.fail(f"{ACCEPT_BIN} is missing: run `make` first", pytrace=False)


def _golden_copy(tmp_path: Path, configs: list[str], waivers: dict[str, str] | None = None) -> Path:
    return golden_subset(tmp_path, "tree_accept", configs, waivers)


def _sh_bin(tmp_path: Path, body: str) -> Path:
    """A bin dir whose kdtr_tree_accept is the sh script ``body`` (argv as the real binary's;
    $REAL is the real binary)."""
    bdir = tmp_path / "bin"
    bdir.mkdir(exist_ok=True)
    script = bdir / "kdtr_tree_accept"
    script.write_text(f"#!/bin/sh\nREAL='{ACCEPT_BIN}'\n{body}\n")
    script.chmod(0o755)
    return bdir


# cuda: exit 3 with a reason, as a binary built without CUDA (docs/binaries.md); cpu: the real binary
NO_CUDA = """
prev=''; for a in "$@"; do [ "$prev" = --backend ] && backend=$a; prev=$a; done
if [ "$backend" = cuda ]; then
  echo 'kdtr_tree_accept: backend cuda not supported: no GPU in this test' >&2; exit 3
fi
exec "$REAL" "$@"
"""

CRASH = "kill -s SEGV $$"


def _wrong_bin(tmp_path: Path, gdir: Path) -> Path:
    """A bin dir whose kdtr_tree_accept writes the expected outputs with proposed[0, 1] off
    by one (tests/fakes.py)."""

    def off_by_one(out: dict) -> dict:
        out["proposed"][0, 1] += 1
        return out

    configs = [p.stem for p in (gdir / "tree_accept").glob("*.kdtr")]
    return make_fake(tmp_path / "bin", gdir, "tree_accept", perturb=off_by_one,
                     modes={c: "wrong" for c in configs}).parent


def _outcomes(result: pytest.RunResult) -> dict[str, int]:
    return {k: v for k, v in result.parseoutcomes().items() if k not in ("warnings", "warning", "seconds")}


def test_entry_point_is_registered() -> None:
    eps = [e for e in entry_points(group="pytest11") if e.name == "kdtr"]
    assert [e.value for e in eps] == ["kdtr.pytest_plugin"], "reinstall the package: make venv"


def test_without_kdtr_option_nothing_changes(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_one="def test_one():\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider", "--co", "-q")
    assert result.ret == 0
    assert [ln for ln in result.outlines if "::" in ln] == ["test_one.py::test_one"]
    assert pytester.runpytest("--help").stdout.str().count("--kdtr-bin-dir") == 1  # the plugin is loaded


def test_kdtr_collects_golden_x_backend_and_runs_them(pytester: pytest.Pytester, tmp_path: Path) -> None:
    bdir = _sh_bin(tmp_path, NO_CUDA)
    args = ["--kdtr", f"--kdtr-bin-dir={bdir}", f"--kdtr-golden-dir={GOLDEN}", "-p", "no:cacheprovider"]
    only = ["--kdtr-only", "tree_accept/chain", "--kdtr-only", "tree_accept/wide*"]
    co = pytester.runpytest(*args, *only, "--co", "-q")
    ids = [ln for ln in co.outlines if ln.startswith("kdtr::")]
    assert ids == [f"kdtr::tree_accept/{c}@{b}" for c in ("chain", "wide", "wide_token_ids") for b in ("cpu", "cuda")]
    co.stdout.fnmatch_lines(["6 tests collected*"])
    result = pytester.runpytest(*args, *only, "-rs")
    assert _outcomes(result) == {"passed": 3, "skipped": 3}
    result.stdout.fnmatch_lines(
        ["SKIPPED ?3? *NOT_SUPPORTED: kdtr_tree_accept: backend cuda not supported: no GPU in this test"])
    assert result.ret == 0
    # -m kdtr / -k select among the cases; --kdtr-backend restricts the backends
    result = pytester.runpytest(*args, "--kdtr-only", "tree_accept", "--kdtr-backend", "cpu", "-m", "kdtr",
                                "-k", "wide or chain", "-v")
    n_accept = len(list((GOLDEN / "tree_accept").glob("*.kdtr")))  # one cpu case each
    assert _outcomes(result) == {"passed": 3, "deselected": n_accept - 3}
    result.stdout.fnmatch_lines(["kdtr::tree_accept/chain@cpu PASSED*"])


def test_kdtr_real_binaries_cpu(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--kdtr", "--kdtr-backend", "cpu", "--kdtr-only", "tree_accept",
                                "-p", "no:cacheprovider")
    n = len(list((GOLDEN / "tree_accept").glob("*.kdtr")))
    assert _outcomes(result) == {"passed": n}


def test_kdtr_mismatch_fails_with_the_record_and_waiver_is_xfail(pytester: pytest.Pytester, tmp_path: Path) -> None:
    gdir = _golden_copy(tmp_path, ["chain", "default"], {"tree_accept/default@cpu": "upstream: known off-by-one"})
    bdir = _wrong_bin(tmp_path, gdir)
    result = pytester.runpytest("--kdtr", f"--kdtr-bin-dir={bdir}", f"--kdtr-golden-dir={gdir}",
                                "--kdtr-backend", "cpu", "-rxX", "-p", "no:cacheprovider")
    assert _outcomes(result) == {"failed": 1, "xfailed": 1}
    assert result.ret == 1
    result.stdout.fnmatch_lines([
        "*_ tree_accept/chain@cpu _*",
        "tree_accept/chain@cpu: MISMATCH",
        "  proposed: 1/* differ ?exact?; max abs 1 at ?0, 1?*",
        "    request 0, slot 1: expected *, actual *",
        "  obtained tensors: *tree_accept/chain.cpu.kdtr",
        f"  rerun: kdtr run --only tree_accept/chain --backend cpu --golden-dir {gdir} --bin-dir {bdir}",
    ])
    result.stdout.fnmatch_lines(
        ["XFAIL kdtr::tree_accept/default@cpu - waived (upstream: known off-by-one); was MISMATCH*"])


def test_kdtr_crash_and_unvouched_golden_fail(pytester: pytest.Pytester, tmp_path: Path) -> None:
    gdir = _golden_copy(tmp_path, ["chain"])
    shutil.copyfile(gdir / "tree_accept/chain.kdtr", gdir / "tree_accept/stray.kdtr")
    bdir = _sh_bin(tmp_path, CRASH)
    result = pytester.runpytest("--kdtr", f"--kdtr-bin-dir={bdir}", f"--kdtr-golden-dir={gdir}",
                                "--kdtr-backend", "cpu", "-p", "no:cacheprovider")
    assert _outcomes(result) == {"failed": 2}
    result.stdout.fnmatch_lines(["tree_accept/chain@cpu: CRASH: killed by SIGSEGV"])
    result.stdout.fnmatch_lines(["tree_accept/stray@cpu: ERROR: *stray.kdtr: not listed in MANIFEST.json*"])


def test_kdtr_usage_errors(pytester: pytest.Pytester, tmp_path: Path) -> None:
    result = pytester.runpytest("--kdtr", "--kdtr-golden-dir", str(tmp_path / "nowhere"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--kdtr: golden directory *nowhere does not exist*"])
    result = pytester.runpytest("--kdtr", "--kdtr-only", "no_such_op")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--kdtr: --only 'no_such_op': no op matches*"])


def test_kdtr_under_xdist(pytester: pytest.Pytester, tmp_path: Path) -> None:
    pytest.importorskip("xdist")
    junit = tmp_path / "junit.xml"
    result = pytester.runpytest("--kdtr", "--kdtr-backend", "cpu", "--kdtr-only", "tree_accept", "-n", "2",
                                "-p", "no:cacheprovider", f"--junitxml={junit}")
    n = len(list((GOLDEN / "tree_accept").glob("*.kdtr")))
    assert _outcomes(result) == {"passed": n}
    props = [dict((p.get("name"), p.get("value")) for p in tc.iter("property"))
             for tc in ET.parse(junit).getroot().iter("testcase")]
    outputs = [Path(p["kdtr_output_file"]) for p in props]
    assert len(outputs) == n and all(p["kdtr_status"] == "PASS" for p in props)
    # each worker writes under its own directory
    assert len({o.parent.parent.parent for o in outputs}) == 2


USER_TEST = """
import numpy as np
import pytest
from kdtr.ops.tree_accept import tree_accept
from kdtr.testing import assert_conforms

def my_kernel(**inputs):
    return tree_accept(**inputs).as_dict()

def wrong_kernel(**inputs):
    out = tree_accept(**inputs).as_dict()
    out["accepted_count"] = out["accepted_count"] + 1
    return out

@pytest.mark.kdtr_golden(op="tree_accept")
def test_mine(kdtr_golden):
    assert_conforms(kdtr_golden, my_kernel(**kdtr_golden.inputs))

@pytest.mark.kdtr_golden(op="tree_accept", config="chain")
def test_wrong(kdtr_golden):
    assert_conforms(kdtr_golden, wrong_kernel(**kdtr_golden.inputs))
"""


def test_kdtr_golden_fixture_runs_a_callable_on_every_golden(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_user=USER_TEST)
    configs = sorted(p.stem for p in (GOLDEN / "tree_accept").glob("*.kdtr"))
    co = pytester.runpytest("--co", "-q", "-p", "no:cacheprovider")
    assert [ln for ln in co.outlines if "::" in ln] == (
        [f"test_user.py::test_mine[tree_accept/{c}]" for c in configs]
        + ["test_user.py::test_wrong[tree_accept/chain]"])
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert _outcomes(result) == {"passed": len(configs), "failed": 1}
    result.stdout.fnmatch_lines([
        ">*assert_conforms(kdtr_golden, wrong_kernel(**kdtr_golden.inputs))",
        "E*kdtr.testing.ConformanceError: tree_accept/chain@python: MISMATCH",
        "E*accepted_count: 6/6 (100%) differ ?exact?; max abs 1 at ?0?*",
        "E*request 0: expected *, actual *",
    ])


def test_kdtr_golden_fixture_needs_the_marker_and_a_known_op(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_a="def test_no_marker(kdtr_golden):\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert _outcomes(result) == {"errors": 1}
    result.stdout.fnmatch_lines(["*kdtr_golden needs @pytest.mark.kdtr_golden(op=...)*"])
    pytester.makepyfile(
        test_a="import pytest\n@pytest.mark.kdtr_golden(op='nope')\ndef test_x(kdtr_golden):\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.INTERRUPTED  # a collection error
    result.stdout.fnmatch_lines(["*ERROR collecting test_a.py*", "test_a.py::test_x: no golden of op 'nope' under *"])
    pytester.makepyfile(test_a="import pytest\n@pytest.mark.kdtr_golden\ndef test_x(kdtr_golden):\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["test_a.py::test_x: @pytest.mark.kdtr_golden needs op='<op name>'"])


def test_kdtr_golden_fixture_golden_dir_option(pytester: pytest.Pytester, tmp_path: Path) -> None:
    gdir = _golden_copy(tmp_path, ["default", "mid"])
    pytester.makepyfile(test_b="import pytest\n@pytest.mark.kdtr_golden(op='tree_accept')\n"
                               "def test_x(kdtr_golden):\n    assert kdtr_golden.path.parent.parent.name == 'golden'\n")
    result = pytester.runpytest(f"--kdtr-golden-dir={gdir}", "-v", "-p", "no:cacheprovider")
    assert _outcomes(result) == {"passed": 2}
    result.stdout.fnmatch_lines(["*test_x?tree_accept/default? PASSED*", "*test_x?tree_accept/mid? PASSED*"])
