"""Fault classes of the runner, the reports and the CLI: control characters from
files and binaries, concurrent runs and interrupted writes, the golden set checked against
its manifest, signals, and the command-line edges. Each test failed on the code before it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import warnings
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import kdtr
import kdtr.generators
from fakes import golden_copy, invoke, relist, report_cases
from kdtr import goldens, report
from kdtr import run as runner
from kdtr.cli.main import main
from kdtr.text import printable
from timing import HANG_GUARD, gone, never_fifo, wait_for

ESC_NAME = "x\x1b[31mRED\x1b[0m\nFORGED ROW"


@pytest.fixture
def env(runner_env):
    """``(tmp_path, gdir, bdir)``: the tree_accept goldens and a fake binary (conftest.py)."""
    return runner_env


def _no_raw_controls(text: str) -> None:
    assert "\x1b" not in text and "\x07" not in text, repr(text[:300])


def _cli(repo_root, *args, timeout=60, **kw):
    return subprocess.run([sys.executable, "-c", "from kdtr.cli.main import entry; entry()", *args],
                          capture_output=True, text=True, cwd=repo_root, timeout=timeout, **kw)


def _shim(bdir: Path, script: str) -> None:
    shim = bdir / "kdtr_tree_accept"
    shim.write_text(script)
    shim.chmod(0o755)


# --- control characters (item 6) ------------------------------------------------------


def test_printable_escapes_like_the_cpp_tools():
    assert printable(ESC_NAME) == "x\\x1b[31mRED\\x1b[0m\\x0aFORGED ROW"
    assert printable("ok [b] \\ é") == "ok [b] \\ é"
    assert printable("bidi\u202eflip \udcff") == "bidi\\u202eflip \\xff"
    assert printable("\ufffe") == "\\ufffe"  # not allowed in XML


def test_inspect_escapes_names_and_metadata(tmp_path):
    path = tmp_path / "esc.kdtr"
    kdtr.save(path, {ESC_NAME: np.zeros(2, np.int32)}, {"key\x1b[2J": "v\x1b[2Jv"})
    r = CliRunner().invoke(main, ["inspect", "--values", str(path)], catch_exceptions=False)
    assert r.exit_code == 0
    _no_raw_controls(r.output)
    assert "FORGED ROW" not in r.output.replace("\\x0aFORGED ROW", "")  # never on a line of its own
    assert "key\\x1b[2J" in r.output


def test_run_reports_escape_tensor_names_and_binary_stderr(env):
    tmp_path, gdir, bdir = env
    path = gdir / "tree_accept" / "default.kdtr"
    tensors, meta = golden_copy(path)
    tensors[f"expected.{ESC_NAME}"] = np.zeros(1, np.int32)
    meta[f"contract.{ESC_NAME}.kind"] = "exact"
    kdtr.save(path, tensors, meta)
    relist(gdir)
    # chain: a binary whose stderr holds escapes and exits 1 (CRASH), each golden alone (the
    # message comes from the binary's stderr, not a batch line)
    r = invoke(tmp_path, gdir, bdir, "--backend", "cpu", "--no-batch", "--only", "tree_accept/default",
               "--only", "tree_accept/chain", mode="chain:exit1", FAKE_MSG="\033[31mboom\033[2J\a")
    assert r.exit_code == 1
    _no_raw_controls(r.output)
    rep = tmp_path / "reports"
    for name in ("conformance.json", "junit.xml", "conformance.md"):
        _no_raw_controls((rep / name).read_text())
    root = ET.parse(rep / "junit.xml").getroot()  # well-formed
    assert root.find(".//testcase[@name='chain[cpu]']/error") is not None
    md = (rep / "conformance.md").read_text()
    assert "\\x1b[31mboom" in md and "x\\x1b[31mRED\\x1b[0m\\x0aFORGED ROW: missing" in md
    case = report_cases(tmp_path)["tree_accept/chain@cpu"]
    assert case["status"] == "CRASH" and "\\x1b[31mboom" in case["reason"]


def test_markdown_fence_cannot_be_closed_by_a_name():
    case = runner.Case("op", "a```b", Path("x"), "cpu")
    md = report.markdown([runner.CaseResult(case, "ERROR", "bad ````` name")],
                         dict(date="d", host="h", platform="p", python="3", numpy="2"))
    fence = next(line for line in md.splitlines() if line.startswith("```"))
    assert len(fence) >= 6


# --- concurrency, interruption, manifest (item 7) --------------------------------------


def test_a_second_run_on_a_busy_report_dir_is_refused(env):
    tmp_path, gdir, bdir = env
    with runner.ReportDirLock(tmp_path / "reports"):
        r = invoke(tmp_path, gdir, bdir, "--backend", "cpu")
    assert r.exit_code == 2 and "in use by another kdtr run" in r.output
    r = invoke(tmp_path, gdir, bdir, "--backend", "cpu", "--only", "tree_accept/chain")
    assert r.exit_code == 0  # released


def test_two_concurrent_runs_never_judge_each_others_outputs(env, repo_root):
    tmp_path, gdir, bdir = env
    args = ["run", "--golden-dir", str(gdir), "--bin-dir", str(bdir), "--report-dir", str(tmp_path / "reports"),
            "--backend", "cpu", "-j", "2"]
    env_wrong = dict(os.environ, FAKE_MODE=",".join(f"{p.stem}:wrong" for p in gdir.glob("tree_accept/*.kdtr")))
    procs = [subprocess.Popen([sys.executable, "-c", "from kdtr.cli.main import entry; entry()", *args], cwd=repo_root,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e)
             for e in (dict(os.environ), env_wrong)]
    outs = [p.communicate(timeout=300) for p in procs]
    codes = [p.returncode for p in procs]
    # The good build passes or is refused (exit 2), never a false MISMATCH; the broken build
    # fails or is refused, never a false PASS.
    assert codes[0] in (0, 2), outs[0]
    assert codes[1] in (1, 2), outs[1]
    assert 2 in codes or codes == [0, 1]


def test_reports_are_published_together_or_not_at_all(tmp_path, monkeypatch):
    envd = dict(date="d", host="h", platform="p", python="3", numpy="2", run_id="first")
    case = runner.Case("tree_accept", "a", Path("x"), "cpu")
    report.write_all(tmp_path, [runner.CaseResult(case, "PASS")], envd)

    def snapshot():  # every entry of the report directory; the reports' bytes
        return sorted(p.name for p in tmp_path.iterdir()), {n: (tmp_path / n).read_bytes() for n in report.REPORT_NAMES}

    before = snapshot()

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "markdown", boom)
    with pytest.raises(KeyboardInterrupt):
        report.write_all(tmp_path, [runner.CaseResult(case, "MISMATCH")], dict(envd, run_id="second"))
    assert snapshot() == before  # old set, no temporary file, no run directory left
    monkeypatch.undo()
    report.write_all(tmp_path, [runner.CaseResult(case, "MISMATCH")], dict(envd, run_id="second"))
    assert "second" in (tmp_path / "conformance.md").read_text() or "second" in (tmp_path / "junit.xml").read_text()
    assert json.loads((tmp_path / "conformance.json").read_text())["environment"]["run_id"] == "second"
    assert 'value="second"' in (tmp_path / "junit.xml").read_text()


def test_interrupted_regen_leaves_the_old_set_whole(tmp_path, repo_root):
    gdir = tmp_path / "golden"
    shutil.copytree(repo_root / "golden", gdir, ignore=shutil.ignore_patterns(".cache"))
    (gdir / "known_failures.json").write_text("{}")
    for p in gdir.rglob("*.kdtr"):  # an old set that regen would not rewrite byte for byte
        p.write_bytes(p.read_bytes() + b"old")
    before = {p.relative_to(gdir): p.read_bytes() for p in gdir.rglob("*") if p.is_file()}

    def stop(op, config, i, n):
        if i == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        goldens.regenerate(gdir, kdtr.generators.REGISTRY, on_config=stop)
    after = {p.relative_to(gdir): p.read_bytes() for p in gdir.rglob("*") if p.is_file()}
    assert after == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["golden"]  # no staging left


def test_regen_repairs_a_swap_killed_between_its_renames(tmp_path, repo_root):
    gdir = tmp_path / "golden"
    shutil.copytree(repo_root / "golden" / "tree_accept", tmp_path / ".golden.old-999" / "tree_accept")
    (tmp_path / ".golden.old-999" / "known_failures.json").write_text('{"tree_accept/chain": "kept"}')
    (tmp_path / ".golden.regen-zzz").mkdir()
    goldens._repair_interrupted_swap(gdir)
    assert (gdir / "known_failures.json").read_text() == '{"tree_accept/chain": "kept"}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["golden"]


@pytest.mark.parametrize("defect", ["edited", "unlisted", "missing", "fifo"])
def test_run_holds_goldens_against_the_manifest(env, repo_root, defect):
    tmp_path, gdir, bdir = env
    target = gdir / "tree_accept" / "chain.kdtr"
    if defect == "edited":  # a valid golden with another expected value, manifest not updated
        tensors, meta = golden_copy(target)
        tensors["expected.proposed"][0, 0] += 1
        kdtr.save(target, tensors, meta)
        words = "sha256 differs"
    elif defect == "unlisted":
        target = gdir / "tree_accept" / "extra.kdtr"
        shutil.copy(gdir / "tree_accept" / "chain.kdtr", target)
        words = "not listed"
    elif defect == "missing":
        target.unlink()
        words = "listed in MANIFEST.json but missing"
    else:
        target = gdir / "tree_accept" / "fifo.kdtr"
        os.mkfifo(target)
        words = "not a regular file"
    # in a child process, so that a run blocked on the FIFO fails (after the hang guard)
    r = _cli(repo_root, "run", "--golden-dir", str(gdir), "--bin-dir", str(bdir), "--report-dir",
             str(tmp_path / "reports"), "--backend", "cpu", timeout=HANG_GUARD)
    assert r.returncode == 1, r.stdout + r.stderr
    case = report_cases(tmp_path)[f"tree_accept/{target.stem}@cpu"]
    assert case["status"] == "ERROR" and words in case["reason"] and target.name in case["reason"]


def test_run_without_manifest_is_a_usage_error(env):
    tmp_path, gdir, bdir = env
    (gdir / "MANIFEST.json").unlink()
    r = invoke(tmp_path, gdir, bdir, "--backend", "cpu")
    assert r.exit_code == 2 and "MANIFEST.json: missing" in r.output


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL])
def test_every_signal_that_ends_the_run_ends_its_binaries(env, repo_root, sig):
    tmp_path, gdir, bdir = env
    pidfile = tmp_path / "pids"
    _shim(bdir, f"#!/bin/sh\necho $$ >> {pidfile}\n: < {never_fifo(tmp_path)}\n")  # blocks forever
    p = subprocess.Popen(
        [sys.executable, "-c", "from kdtr.cli.main import entry; entry()", "run", "--golden-dir", str(gdir),
         "--bin-dir", str(bdir), "--report-dir", str(tmp_path / "reports"), "--backend", "cpu", "-j", "2"],
        cwd=repo_root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: pidfile.exists() and len(pidfile.read_text().split()) >= 2, "two binaries not started")
        p.send_signal(sig)
        _, err = p.communicate(timeout=HANG_GUARD)  # its binaries never end by themselves
    except subprocess.TimeoutExpired:
        pytest.fail(f"kdtr run did not stop on {sig.name}")
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    # handled (exit 128 + signal, a message), not just killed; SIGKILL cannot be handled
    assert p.returncode == (-sig if sig == signal.SIGKILL else 128 + sig), (p.returncode, err)
    for pid in map(int, pidfile.read_text().split()):
        try:
            wait_for(lambda pid=pid: gone(pid), f"binary {pid} outlived the runner ({sig.name})")
        finally:
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)


# --- command-line edges (item 8) -------------------------------------------------------


def test_unwritable_report_dir_is_refused_before_any_case_runs(env):
    tmp_path, gdir, bdir = env
    blocker = tmp_path / "file"
    blocker.write_text("")
    _shim(bdir, f"#!/bin/sh\ntouch {tmp_path / 'ran'}\nexit 0\n")
    r = CliRunner().invoke(main, ["run", "--golden-dir", str(gdir), "--bin-dir", str(bdir),
                                  "--report-dir", str(blocker / "reports")], catch_exceptions=False)
    assert r.exit_code == 2 and "not writable" in r.output and len(r.output.strip().splitlines()) == 1
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("value", ["nan", "inf", "1e308", "-1", "0"])
def test_timeout_must_be_a_finite_number_of_seconds(env, value):
    tmp_path, gdir, bdir = env
    r = invoke(tmp_path, gdir, bdir, timeout=value)
    assert r.exit_code == 2 and "--timeout" in r.output


def test_rerun_line_repeats_the_options_that_matter(env, repo_root):
    tmp_path, gdir, bdir = env
    # not the default 60 s (a rerun line names only a changed timeout), and a hang guard only
    r = invoke(tmp_path, gdir, bdir, "--backend", "cpu", "--only", "tree_accept/wide", mode="wide:wrong", timeout="90")
    assert r.exit_code == 1
    rerun = report_cases(tmp_path)["tree_accept/wide@cpu"]["rerun"]
    for piece in ("--only tree_accept/wide", "--backend cpu", f"--golden-dir {gdir}", f"--bin-dir {bdir}",
                  f"--report-dir {tmp_path / 'reports'}", "--timeout 90"):
        assert piece in rerun, rerun
    # and it works as printed
    p = _cli(repo_root, *rerun.split()[1:], env=dict(os.environ, FAKE_MODE="wide:wrong"))
    assert p.returncode == 1 and "tree_accept/wide@cpu" in p.stdout


def test_rerun_line_of_a_second_tier_case_says_tier_all():
    cfg = runner.RunConfig(Path("g"), Path("b"), Path("o"), rerun_args=["--tier", "all"])
    case = runner.Case("tree_build", "large", Path("/nonexistent/large.kdtr"), "cpu")
    assert runner.run_case(case, cfg).rerun.endswith("--tier all")


def test_only_accepts_the_case_ids_reports_print(env):
    tmp_path, gdir, bdir = env
    r = invoke(tmp_path, gdir, bdir, "--only", "tree_accept/chain@cpu")
    assert r.exit_code == 0 and set(report_cases(tmp_path)) == {"tree_accept/chain@cpu"}
    r = invoke(tmp_path, gdir, bdir, "--only", "tree_accept/chain@cuda")
    assert set(report_cases(tmp_path)) == {"tree_accept/chain@cuda"}
    r = invoke(tmp_path, gdir, bdir, "--only", "tree_accept/chain@tpu")
    assert r.exit_code == 2 and "unknown backend" in r.output
    r = invoke(tmp_path, gdir, bdir, "--backend", "cpu", "--only", "tree_accept/chain@cuda")
    assert r.exit_code == 2 and "matches no case" in r.output


def test_every_shard_tests_the_cpu_backend(env):
    tmp_path, gdir, bdir = env
    seen = []
    for i in (1, 2):
        r = invoke(tmp_path, gdir, bdir, "--shard", f"{i}/2")
        assert r.exit_code == 0
        cases = report_cases(tmp_path)
        assert any(k.endswith("@cpu") for k in cases) and any(k.endswith("@cuda") for k in cases)
        seen += list(cases)
    n = len(list(gdir.glob("tree_accept/*.kdtr")))
    assert len(seen) == len(set(seen)) == 2 * n  # the shards partition the cases


def test_require_backend_makes_not_supported_a_failure(env):
    tmp_path, gdir, bdir = env
    r = invoke(tmp_path, gdir, bdir, "--backend", "cuda")
    assert r.exit_code == 0 and "nothing was tested" in r.output
    r = invoke(tmp_path, gdir, bdir, "--backend", "cuda", "--require-backend", "cuda")
    assert r.exit_code == 1 and "--require-backend cuda" in r.output
    r = invoke(tmp_path, gdir, bdir, "--backend", "cpu", "--require-backend", "cuda")
    assert r.exit_code == 2


def test_cpu_backend_not_supported_is_an_error(env):
    tmp_path, gdir, bdir = env
    _shim(bdir, "#!/bin/sh\necho 'backend cpu not supported' >&2\nexit 3\n")
    r = invoke(tmp_path, gdir, bdir, "--only", "tree_accept/chain")
    cases = report_cases(tmp_path)
    assert r.exit_code == 1
    assert cases["tree_accept/chain@cpu"]["status"] == "ERROR"
    assert cases["tree_accept/chain@cuda"]["status"] == "NOT_SUPPORTED"


def test_reports_record_selection_and_commit(env, repo_root):
    tmp_path, gdir, bdir = env
    invoke(tmp_path, gdir, bdir, "--backend", "cpu", "--only", "tree_accept/chain", "--shard", "1/1")
    e = json.loads((tmp_path / "reports" / "conformance.json").read_text())["environment"]
    assert e["selection"] == "--only tree_accept/chain --backend cpu --shard 1/1"
    head = subprocess.run(["git", "-C", str(repo_root), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert e["commit"].startswith(head.strip())
    md = (tmp_path / "reports" / "conformance.md").read_text()
    assert "Selection: --only tree_accept/chain" in md and head.strip() in md


def test_bare_kdtr_is_a_usage_error(repo_root):
    p = _cli(repo_root)
    assert p.returncode == 2 and "Usage:" in p.stderr


def test_list_of_a_missing_golden_dir_is_a_usage_error(tmp_path):
    r = CliRunner().invoke(main, ["list", "--golden-dir", str(tmp_path / "nope")])
    assert r.exit_code == 2 and "does not exist" in r.output


# --- smaller ones (item 9) ---------------------------------------------------------------


def test_inspect_shows_all_nan_and_u64_max_exactly(tmp_path):
    path = tmp_path / "v.kdtr"
    kdtr.save(path, {"nan": np.full(3, np.nan, np.float32), "big": np.array([0, 2**64 - 1], np.uint64),
                     "neg": np.array([-(2**63)], np.int64)})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = CliRunner().invoke(main, ["inspect", str(path)], catch_exceptions=False)
    assert r.exit_code == 0
    assert "18446744073709551615" in r.output and "-9223372036854775808" in r.output
    assert "nan" in r.output and "RuntimeWarning" not in r.output


def test_regen_reports_progress_for_every_config(tmp_path, monkeypatch):
    few = kdtr.generators.REGISTRY.subset("tree_accept/chain", "tree_accept/wide")
    seen = []
    goldens.regenerate(tmp_path / "golden", few, on_config=lambda op, c, i, n: seen.append((op, c, i, n)))
    assert seen == [("tree_accept", "wide", 0, 2), ("tree_accept", "chain", 1, 2)]  # the registry's order
    assert sorted(goldens.read_manifest(tmp_path / "golden")["files"]) == ["tree_accept/chain.kdtr",
                                                                         "tree_accept/wide.kdtr"]


def test_run_reports_an_absurd_golden_as_error_at_once(tmp_path, repo_root):
    """Item 4 through the runner: the 644-byte golden whose max_budget implies 4.6e18 bytes
    of visibility is an ERROR naming the field, never a TIMEOUT or OOM."""
    gdir = tmp_path / "golden"
    (gdir / "tree_build").mkdir(parents=True)
    tensors = {"input.top_log_probs": np.zeros((1, 1, 1), np.float32),
               "input.top_token_ids": np.zeros((1, 1, 1), np.int64), "input.root_token_ids": np.zeros(1, np.int64),
               "input.budget": np.ones(1, np.int32), "input.depth_limit": np.ones(1, np.int32),
               "expected.node_count": np.ones(1, np.int32)}
    kdtr.save(gdir / "tree_build" / "absurd.kdtr", tensors,
              {"op": "tree_build", "config": "absurd", "max_budget": 2**31 - 2, "contract.node_count.kind": "exact"})
    relist(gdir)
    # the ERROR verdict (a refusal before any allocation) is the point; --timeout a hang guard
    r = CliRunner().invoke(main, ["run", "--golden-dir", str(gdir), "--bin-dir", str(repo_root / "build" / "bin"),
                                  "--report-dir", str(tmp_path / "reports"), "--timeout", "120"],
                           catch_exceptions=False)
    assert r.exit_code == 1
    case = report_cases(tmp_path)["tree_build/absurd@cpu"]
    assert case["status"] == "ERROR" and "max_budget" in case["reason"] and "exit 2" in case["reason"]
    assert report_cases(tmp_path)["tree_build/absurd@cuda"]["status"] in ("ERROR", "NOT_SUPPORTED")


# --- found by a fresh-user pass after the first fixes ----------------------------------


def test_regen_check_escapes_file_names(tmp_path, repo_root, monkeypatch):
    gdir = tmp_path / "golden"
    (gdir / "tree_accept").mkdir(parents=True)
    shutil.copy(repo_root / "golden" / "tree_accept" / "chain.kdtr", gdir / "tree_accept" / "bad\x1b[2J\nFORGED.kdtr")
    monkeypatch.setattr(kdtr.generators, "REGISTRY", kdtr.generators.REGISTRY.subset("tree_accept/chain"))
    r = CliRunner().invoke(main, ["regen", "--check", "--golden-dir", str(gdir)], catch_exceptions=False)
    assert r.exit_code == 1
    _no_raw_controls(r.output)
    assert "bad\\x1b[2J\\x0aFORGED.kdtr: extra" in r.output


@pytest.mark.parametrize("name", ["MANIFEST.json", "known_failures.json"])
def test_fifo_manifest_or_waiver_file_is_refused_not_blocked_on(env, repo_root, name):
    tmp_path, gdir, bdir = env
    (gdir / name).unlink(missing_ok=True)
    os.mkfifo(gdir / name)
    p = _cli(repo_root, "run", "--golden-dir", str(gdir), "--bin-dir", str(bdir), "--report-dir",
             str(tmp_path / "reports"), "--backend", "cpu", timeout=HANG_GUARD)
    assert p.returncode == 2 and name in p.stderr and "not a regular file" in p.stderr
    if name == "MANIFEST.json":
        with pytest.raises(OSError, match="not a regular file"):
            goldens.read_manifest(gdir)


def test_a_non_regular_lock_file_is_a_usage_error(env):
    tmp_path, gdir, bdir = env
    (tmp_path / "reports").mkdir()
    os.mkfifo(tmp_path / "reports" / runner.REPORT_LOCK)
    r = invoke(tmp_path, gdir, bdir, "--backend", "cpu")
    assert r.exit_code == 2 and "not a regular file" in r.output and len(r.output.strip().splitlines()) == 1


def test_rerun_pattern_selects_exactly_its_own_case():
    names = ["a[1] b$(id)", "a1 b$(id)", "x*y", "xzy", "q?", "qq", "at@cpu", "e\x1bq"]
    goldens_ = [("tree_accept", n, Path(f"/g/{i}.kdtr")) for i, n in enumerate(names)]
    cases = runner.plan(goldens_, ["cpu"])
    cfg = runner.RunConfig(Path("g"), Path("b"), Path("o"))
    for case in cases:
        line = runner.rerun_line(case, cfg)
        pattern = line.split("--only ")[1].split(" --backend")[0].strip("'")
        chosen = runner.select_cases(cases, [pattern])
        assert chosen == [case], (case.config, pattern, [c.config for c in chosen])


def test_harness_error_still_has_a_rerun_line(env, monkeypatch):
    tmp_path, gdir, bdir = env

    def boom(case, cfg):
        raise RuntimeError("harness bug")

    monkeypatch.setattr(runner.process, "run_case", boom)
    r = invoke(tmp_path, gdir, bdir, "--backend", "cpu", "--only", "tree_accept/chain")
    case = report_cases(tmp_path)["tree_accept/chain@cpu"]
    assert r.exit_code == 1 and case["status"] == "ERROR" and "harness bug" in case["reason"]
    assert case["rerun"].startswith("kdtr run --only tree_accept/chain --backend cpu")


def test_a_contract_for_no_output_is_an_error(env, repo_root):
    tmp_path, gdir, bdir = env
    path = gdir / "tree_accept" / "chain.kdtr"
    tensors, meta = golden_copy(path)
    meta["contract.proposd.kind"] = "exact"  # a typo of "proposed"
    kdtr.save(path, tensors, meta)
    relist(gdir)
    r = invoke(tmp_path, gdir, bdir, "--backend", "cpu", "--only", "tree_accept/chain")
    case = report_cases(tmp_path)["tree_accept/chain@cpu"]
    assert r.exit_code == 1 and case["status"] == "ERROR" and "contract.proposd.kind" in case["reason"]
    r = CliRunner().invoke(main, ["diff", str(path), str(path)])
    assert r.exit_code == 2 and "contract.proposd.kind" in r.output


def test_json_report_spells_a_name_one_way(env):
    tmp_path, gdir, bdir = env
    odd = gdir / "tree_accept" / "n\nl.kdtr"
    shutil.copy(gdir / "tree_accept" / "chain.kdtr", odd)
    relist(gdir)
    invoke(tmp_path, gdir, bdir, "--backend", "cpu", "--only", "tree_accept/n?l")
    cases = json.loads((tmp_path / "reports" / "conformance.json").read_text())["cases"]
    assert [c["config"] for c in cases] == ["n\\x0al"] and cases[0]["id"] == "tree_accept/n\\x0al@cpu"


def test_cpp_tools_escape_what_python_escapes(tmp_path, kdtr_check):
    name, key, value = "a\u009b2Jb\u0085c\u202ez\u2028", "k\u009b31m\u200f", "v\u009b2J\u202e\u2028\x1b é"
    path = tmp_path / "c1.kdtr"
    kdtr.save(path, {name: np.zeros(1, np.int8)}, {key: value})
    r = subprocess.run([str(kdtr_check), str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    tensor_line, meta_line = r.stdout.splitlines()
    assert tensor_line == f"tensor {printable(name)} i8 [1]"
    assert meta_line.startswith(f"meta {printable(key)} string ")
    assert json.loads(meta_line.split(" ", 3)[3]) == value and meta_line.isprintable()
