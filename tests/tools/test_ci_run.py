""".ci/run, the CI entry point (docs/harness.md "Continuous integration"): its phases in
their order, each with its duration printed, the total at the end, and a failing phase
that stops the run with its own exit status after printing the durations so far.

The script is sourced by bash (it then defines its functions without running them), and
its ``phase`` runner is driven with stand-in phases: nothing is built or tested here.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from conftest import REPO_ROOT
from timing import HANG_GUARD

CI_RUN = REPO_ROOT / ".ci" / "run"

PHASES = ["build", "fast-tests", "run", "mutants", "lowest-deps", "slow-tests", "lint"]


def _bash(script: str) -> subprocess.CompletedProcess:
    bash = shutil.which("bash")
    if bash is None:
        pytest.fail("bash not found on PATH: .ci/run is a bash script", pytrace=False)
    return subprocess.run([bash, "-c", f"source {str(CI_RUN)!r}\n{script}"], capture_output=True, text=True,
                          timeout=HANG_GUARD, cwd=REPO_ROOT)


def test_phases_run_in_the_documented_order():
    text = CI_RUN.read_text()
    body = re.search(r"^main\(\) \{\n(.*?)^\}", text, re.S | re.M)
    assert body, ".ci/run has no main() function"
    phases = re.findall(r"^\s*phase (\S+) \S+$", body.group(1), re.M)
    assert phases == PHASES


def test_each_phase_prints_its_duration_and_the_total():
    r = _bash("one() { echo one-ran; }\ntwo() { true; }\nphase first one\nphase second two\nsummary")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[:4] == ["== phase first", "one-ran", lines[2], "== phase second"], lines
    assert re.fullmatch(r"== phase first: \d+ s", lines[2]), lines
    assert re.fullmatch(r"== phase second: \d+ s", lines[4]), lines
    assert lines[5] == "== phases"
    assert re.fullmatch(r"   first +\d+ s", lines[6]) and re.fullmatch(r"   second +\d+ s", lines[7]), lines
    assert re.fullmatch(r"== total: \d+ s \(\d+ min \d\d s\)", lines[8]), lines
    assert len(lines) == 9, lines


def test_a_failing_phase_stops_the_run_with_its_exit_status():
    r = _bash("ok() { true; }\nbad() { return 3; }\nnever() { echo never-ran; }\n"
              "phase first ok\nphase second bad\nphase third never\necho after-phases")
    assert r.returncode == 3, (r.stdout, r.stderr)
    out = r.stdout
    assert "never-ran" not in out and "after-phases" not in out and "== phase third" not in out
    assert re.search(r"^== phase second: \d+ s: FAILED \(exit 3\)$", out, re.M), out
    listed = re.findall(r"^   (\S+) +\d+ s$", out, re.M)
    assert listed == ["first", "second"], out
    assert re.search(r"^== total: \d+ s", out, re.M), out


def test_no_test_marked_slow_is_not_a_failure():
    """pytest exits 5 when it collects nothing; the slow-tests phase takes that as done."""
    r = _bash('PYTEST=(bash -c "exit 5")\nphase slow-tests slow_tests')
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "slow-tests: no test is marked slow" in r.stdout
    r = _bash('PYTEST=(bash -c "exit 1")\nphase slow-tests slow_tests')
    assert r.returncode == 1, (r.stdout, r.stderr)
