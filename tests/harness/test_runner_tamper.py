"""A binary cannot forge its own verdict: every verdict is judged against the golden bytes
that MANIFEST.json vouched for, read into private memory, and a golden changed while its
case ran makes the case an ERROR naming the change.

The fake binary is a shell wrapper around the real build/bin/kdtr_tree_accept (fast: no
Python start-up) that, after the real run, tampers with one golden, $TARGET:

- ``patch``: writes a wrong output for it, then overwrites the golden in place (same size,
  valid CRCs) with a forged copy whose expected values match that wrong output;
- ``replace``: on a run of another golden, replaces $TARGET by a forged copy (rename), so
  the target's own case starts after the change; its run writes the wrong output;
- ``truncate``: truncates the golden to 0 bytes (a runner reading it through a mapping
  dies of SIGBUS: those runs go through a subprocess).

In batch mode the wrapper holds the real binary's result lines back until it has tampered,
so the runner judges after the change.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import kdtr
from conftest import golden_subset, op_binary
from kdtr import judge, mutate, testing
from kdtr import run as runner
from kdtr.cli.main import main

pytest_plugins = ["pytester"]

TAMPERED = "golden changed while its case ran"  # kdtr.run.TAMPERED
CONFIGS = ["chain", "mid"]  # mid is the larger: with -j 1 --no-batch it runs first

WRAPPER = r'''#!/bin/sh
target_out="" hit="" prev="" mine=""
for a in "$@"; do
  if [ "$prev" = "--input" ]; then
    if [ "$a" = "$TARGET" ]; then hit=1; mine=1; else hit=""; fi
  fi
  if [ "$prev" = "--output" ] && [ -n "$hit" ]; then target_out="$a"; hit=""; fi
  prev="$a"
done
log=$("$REAL" "$@"); rc=$?
case "$TAMPER" in
  patch) if [ -n "$mine" ]; then cp "$WRONG" "$target_out"; dd if="$FORGED" of="$TARGET" conv=notrunc status=none; fi ;;
  truncate) if [ -n "$mine" ]; then : > "$TARGET"; fi ;;
  replace)
    if [ -n "$mine" ]; then cp "$WRONG" "$target_out"
    elif [ ! -e "$TARGET.done" ]; then
      : > "$TARGET.done"; cp "$FORGED" "$TARGET.new" && mv "$TARGET.new" "$TARGET"
    fi ;;
esac
[ -n "$log" ] && printf '%s\n' "$log"
exit $rc
'''


def _forgeries(golden: Path, where: Path) -> tuple[Path, Path]:
    """(wrong output, forged golden): accepted_count[0] off by one in both; the forged
    golden is a valid file of the golden's exact size (only data and CRCs differ)."""
    with kdtr.load(golden) as g:
        tensors = {k: np.array(v) for k, v in g.tensors.items()}
        meta = dict(g.metadata)
    tensors["expected.accepted_count"][0] += 1
    wrong, forged = where / f"{golden.stem}.wrong.kdtr", where / f"{golden.stem}.forged.kdtr"
    kdtr.save(wrong, {k[len("expected."):]: v for k, v in tensors.items() if k.startswith("expected.")})
    kdtr.save(forged, tensors, meta)
    assert forged.stat().st_size == golden.stat().st_size
    return wrong, forged


@pytest.fixture
def setup(tmp_path):
    """(golden dir, bin dir, environment for the wrapper given a mode and a target config)."""
    gdir = golden_subset(tmp_path, "tree_accept", CONFIGS)
    bdir = tmp_path / "bin"
    bdir.mkdir()
    fake = bdir / "kdtr_tree_accept"
    fake.write_text(WRAPPER)
    fake.chmod(0o755)
    real = op_binary("tree_accept")

    def env_for(mode: str, target: str) -> dict[str, str]:
        golden = gdir / "tree_accept" / f"{target}.kdtr"
        wrong, forged = _forgeries(golden, tmp_path)
        return dict(os.environ, REAL=str(real), TAMPER=mode, TARGET=str(golden), WRONG=str(wrong),
                    FORGED=str(forged))

    return tmp_path, gdir, bdir, env_for


def _run_args(tmp_path: Path, gdir: Path, bdir: Path, *extra: str) -> list[str]:
    return ["run", "--golden-dir", str(gdir), "--bin-dir", str(bdir), "--report-dir", str(tmp_path / "reports"),
            "--backend", "cpu", "-j", "1", *extra]


def _cases(tmp_path: Path) -> dict[str, dict]:
    import json

    return {c["id"]: c for c in json.loads((tmp_path / "reports" / "conformance.json").read_text())["cases"]}


def _assert_tampered(case: dict, golden: Path) -> None:
    assert case["status"] == "ERROR", case
    assert TAMPERED in case["reason"] and str(golden) in case["reason"], case["reason"]


@pytest.mark.parametrize("batch", ["--batch", "--no-batch"])
def test_a_binary_patching_its_golden_in_place_is_an_error_not_a_pass(setup, batch):
    tmp_path, gdir, bdir, env_for = setup
    env = env_for("patch", "chain")
    r = CliRunner().invoke(main, _run_args(tmp_path, gdir, bdir, batch), env=env, catch_exceptions=False)
    assert r.exit_code == 1, r.output
    cases = _cases(tmp_path)
    _assert_tampered(cases["tree_accept/chain@cpu"], gdir / "tree_accept" / "chain.kdtr")
    assert cases["tree_accept/mid@cpu"]["status"] == "PASS"


def test_a_golden_replaced_after_the_manifest_check_is_not_judged(setup):
    tmp_path, gdir, bdir, env_for = setup
    env = env_for("replace", "chain")  # the run of mid (first) replaces chain, then chain's case starts
    r = CliRunner().invoke(main, _run_args(tmp_path, gdir, bdir, "--no-batch"), env=env, catch_exceptions=False)
    assert r.exit_code == 1, r.output
    case = _cases(tmp_path)["tree_accept/chain@cpu"]
    assert case["status"] == "ERROR" and "vouched" in case["reason"] and "chain.kdtr" in case["reason"], case
    assert case["command"] == ""  # never run: the replaced golden is not the one vouched for


@pytest.mark.parametrize("batch", [True, False])
def test_run_all_judges_the_bytes_vouched_for_at_the_manifest_check(setup, batch):
    tmp_path, gdir, bdir, env_for = setup
    env = env_for("patch", "chain")  # only for its forged golden and wrong output
    found = runner.discover(gdir)
    vouched: dict = {}
    found, problems = runner.check_manifest(gdir, found, vouched)
    assert set(vouched) == {p for _, _, p in found}
    target = gdir / "tree_accept" / "chain.kdtr"
    os.replace(env["FORGED"], target)  # a concurrent regen or checkout, after the check
    real_bin = op_binary("tree_accept").parent
    cfg = runner.RunConfig(golden_dir=gdir, bin_dir=real_bin, out_dir=tmp_path / "out", batch=batch,
                           golden_problems=problems, vouched=vouched)
    results = {r.case.id: r for r in runner.run_all(runner.plan(found, ["cpu"]), cfg, jobs=1)}
    assert results["tree_accept/chain@cpu"].status == "ERROR"
    assert "vouched" in results["tree_accept/chain@cpu"].reason
    assert results["tree_accept/mid@cpu"].status == "PASS"


@pytest.mark.parametrize("batch", ["--batch", "--no-batch"])
def test_a_binary_truncating_its_golden_does_not_kill_the_runner(setup, batch):
    tmp_path, gdir, bdir, env_for = setup
    env = env_for("truncate", "chain")
    r = subprocess.run([sys.executable, "-c", "from kdtr.cli.main import entry; entry()",
                        *_run_args(tmp_path, gdir, bdir, batch)], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])  # SIGBUS was -7
    cases = _cases(tmp_path)
    _assert_tampered(cases["tree_accept/chain@cpu"], gdir / "tree_accept" / "chain.kdtr")
    assert "0 bytes" in cases["tree_accept/chain@cpu"]["reason"]
    assert cases["tree_accept/mid@cpu"]["status"] == "PASS"


def _plugin_args(gdir: Path, bdir: Path) -> list[str]:
    return ["--kdtr", f"--kdtr-bin-dir={bdir}", f"--kdtr-golden-dir={gdir}", "--kdtr-backend", "cpu",
            "-p", "no:cacheprovider"]


def _outcomes(result: pytest.RunResult) -> dict[str, int]:
    return {k: v for k, v in result.parseoutcomes().items() if k not in ("warnings", "warning", "seconds")}


def test_pytest_kdtr_patched_golden_fails(setup, pytester, monkeypatch):
    tmp_path, gdir, bdir, env_for = setup
    for k, v in env_for("patch", "chain").items():
        monkeypatch.setenv(k, v)
    result = pytester.runpytest(*_plugin_args(gdir, bdir))
    assert _outcomes(result) == {"passed": 1, "failed": 1}
    result.stdout.fnmatch_lines([f"tree_accept/chain@cpu: ERROR: {TAMPERED}*chain.kdtr*"])


def test_pytest_kdtr_replaced_golden_fails(setup, pytester, monkeypatch):
    tmp_path, gdir, bdir, env_for = setup
    for k, v in env_for("replace", "mid").items():  # the items run chain first: it replaces mid
        monkeypatch.setenv(k, v)
    result = pytester.runpytest(*_plugin_args(gdir, bdir))
    assert _outcomes(result) == {"passed": 1, "failed": 1}
    result.stdout.fnmatch_lines(["tree_accept/mid@cpu: ERROR: golden not the one vouched for: *mid.kdtr*"])


def test_pytest_kdtr_truncated_golden_fails_and_the_session_goes_on(setup, pytester, monkeypatch):
    tmp_path, gdir, bdir, env_for = setup
    for k, v in env_for("truncate", "chain").items():
        monkeypatch.setenv(k, v)
    result = pytester.runpytest_subprocess(*_plugin_args(gdir, bdir), timeout=120)
    assert _outcomes(result) == {"passed": 1, "failed": 1}, result.stdout.str()[-2000:]
    result.stdout.fnmatch_lines([f"tree_accept/chain@cpu: ERROR: {TAMPERED}*0 bytes*"])


def test_mutation_runner_judges_vouched_bytes(setup):
    tmp_path, gdir, bdir, env_for = setup
    env = env_for("patch", "chain")
    found = runner.discover(gdir)
    vouched: dict = {}
    found, _ = runner.check_manifest(gdir, found, vouched)
    target = gdir / "tree_accept" / "chain.kdtr"
    os.replace(env["FORGED"], target)  # changed after the check: no mutant may be judged against it
    cases = runner.plan(found, ["cpu"])
    plan = mutate.Plan({"tree_accept": cases}, gdir, {}, vouched)
    results = {r.case.id: r for r in mutate._run_cases(cases, op_binary("tree_accept").parent, tmp_path / "o", plan)}
    assert results["tree_accept/chain@cpu"].status == "ERROR"
    assert results["tree_accept/mid@cpu"].status == "PASS"


# --- kdtr.testing: a Golden's arrays are a private copy of the vouched bytes ---------------


def test_testing_golden_survives_a_patch_in_place(setup):
    tmp_path, gdir, bdir, env_for = setup
    env = env_for("patch", "chain")
    g = testing.goldens("tree_accept", gdir, config="chain")[0]
    with open(env["FORGED"], "rb") as src, open(g.path, "r+b") as dst:  # in place: same inode
        dst.write(src.read())
    wrong = {k[len("expected."):]: np.array(v) for k, v in kdtr.load(env["FORGED"]).tensors.items()
             if k.startswith("expected.")}
    with pytest.raises(testing.ConformanceError, match="accepted_count"):
        testing.assert_conforms(g, wrong)


def test_testing_golden_replaced_after_the_manifest_check_is_refused(setup, monkeypatch):
    tmp_path, gdir, bdir, env_for = setup
    env = env_for("patch", "chain")
    checked = testing.golden_cases

    def then_replace(*a, **kw):
        out = checked(*a, **kw)
        os.replace(env["FORGED"], gdir / "tree_accept" / "chain.kdtr")
        return out

    monkeypatch.setattr(testing, "golden_cases", then_replace)
    with pytest.raises(testing.GoldenError, match=r"chain\.kdtr.*vouched"):
        testing.goldens("tree_accept", gdir, config="chain")


def test_testing_golden_survives_truncation(setup):
    tmp_path, gdir, bdir, env_for = setup
    code = ("import os, sys, numpy as np\nfrom kdtr import testing\n"
            f"g = testing.goldens('tree_accept', {str(gdir)!r}, config='chain')[0]\n"
            "os.truncate(g.path, 0)\n"
            "print(int(sum(np.asarray(v).sum() for v in g.expected.values())))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])  # SIGBUS was -7
    assert r.stdout.strip().lstrip("-").isdigit()


# --- the obtained output: read into private memory, bounded ------------------------------


def test_an_output_over_the_limit_is_refused_unread(setup, monkeypatch):
    tmp_path, gdir, bdir, env_for = setup
    out = tmp_path / "out.kdtr"
    env = env_for("patch", "chain")
    os.replace(env["WRONG"], out)
    case = runner.Case("tree_accept", "chain", gdir / "tree_accept" / "chain.kdtr", "cpu")
    golden = judge.Golden.read(case.golden)
    assert judge.judge(golden, out).status == "MISMATCH"
    with open(out, "r+b") as f:  # sparse: a huge file that costs nothing on disk
        f.truncate(runner.output_limit() + 1)
    status, reason, _ = judge.judge(golden, out)
    assert status == "ERROR" and "over the limit" in reason and str(out) in reason
