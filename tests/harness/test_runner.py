"""The runner's statuses, mismatch records, reports and exit codes, driven with fake
binaries (so CRASH / TIMEOUT / NOT_SUPPORTED can be provoked) and real goldens."""

from __future__ import annotations

import json
import shutil
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import kdtr
from fakes import golden_copy, invoke, relist, report_cases
from kdtr import run as runner
from kdtr.cli.main import main
from timing import HANG_GUARD, SHORT_TIMEOUT, gone, never_fifo, wait_for


@pytest.fixture
def env(runner_env):
    """``(tmp_path, gdir, bdir)``: the tree_accept goldens and a fake binary (conftest.py)."""
    return runner_env


def test_all_pass_on_cpu_and_cuda_not_supported(env):
    tmp_path, gdir, bdir = env
    r = invoke(tmp_path, gdir, bdir)
    assert r.exit_code == 0, r.output
    cases = report_cases(tmp_path)
    assert len(cases) == 2 * len(list(gdir.glob("tree_accept/*.kdtr")))
    assert {c["status"] for i, c in cases.items() if i.endswith("@cpu")} == {"PASS"}
    assert {c["status"] for i, c in cases.items() if i.endswith("@cuda")} == {"NOT_SUPPORTED"}
    assert "PASS" in r.output and "kdtr conformance" in r.output


def test_flipped_golden_byte_is_error_and_the_run_goes_on(env):
    tmp_path, gdir, bdir = env
    path = gdir / "tree_accept" / "mid.kdtr"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40  # a data byte
    path.write_bytes(bytes(data))
    relist(gdir)
    r = invoke(tmp_path, gdir, bdir, "--backend", "cpu")
    assert r.exit_code == 1
    cases = report_cases(tmp_path)
    assert cases["tree_accept/mid@cpu"]["status"] == "ERROR"
    assert "mid.kdtr" in cases["tree_accept/mid@cpu"]["reason"]
    assert "CRC" in cases["tree_accept/mid@cpu"]["reason"]
    assert sum(c["status"] == "PASS" for c in cases.values()) == len(list(gdir.glob("tree_accept/*.kdtr"))) - 1


def test_flipped_header_byte_is_error(env):
    tmp_path, gdir, bdir = env
    path = gdir / "tree_accept" / "chain.kdtr"
    data = bytearray(path.read_bytes())
    data[40] ^= 0x01
    path.write_bytes(bytes(data))
    relist(gdir)
    r = invoke(tmp_path, gdir, bdir, "--backend", "cpu", "--only", "tree_accept/chain")
    assert r.exit_code == 1
    case = report_cases(tmp_path)["tree_accept/chain@cpu"]
    assert case["status"] == "ERROR" and "header_crc32" in case["reason"]


def test_edited_expected_value_is_mismatch_naming_tensor_request_slot(env):
    tmp_path, gdir, bdir = env
    path = gdir / "tree_accept" / "default.kdtr"
    tensors, metadata = golden_copy(path)
    tensors["expected.accepted_path"][2, 1] = 4242
    kdtr.save(path, tensors, metadata)
    relist(gdir)
    r = invoke(tmp_path, gdir, bdir, "--backend", "cpu")
    assert r.exit_code == 1
    case = report_cases(tmp_path)["tree_accept/default@cpu"]
    assert case["status"] == "MISMATCH"
    out = {o["name"]: o for o in case["outputs"]}["accepted_path"]
    assert not out["ok"] and out["n_mismatch"] == 1
    assert out["first"][0]["index"] == [2, 1] and out["first"][0]["expected"] == "4242"
    assert "accepted_path" in r.output and "request 2, slot 1: expected 4242" in r.output
    assert "kdtr run --only tree_accept/default --backend cpu" in r.output
    assert Path(case["output_file"]).exists()  # obtained tensors kept next to the report
    md = (tmp_path / "reports" / "conformance.md").read_text()
    assert "request 2, slot 1: expected 4242" in md


def test_wrong_kernel_output_is_mismatch(env):
    tmp_path, gdir, bdir = env
    r = invoke(tmp_path, gdir, bdir, "--backend", "cpu", mode="wide:wrong")
    assert r.exit_code == 1
    case = report_cases(tmp_path)["tree_accept/wide@cpu"]
    assert case["status"] == "MISMATCH" and "proposed" in case["reason"]


@pytest.mark.parametrize(
    "mode,status,words",
    [("segv", "CRASH", "SIGSEGV"), ("exit1", "CRASH", "cudaErrorIllegalAddress"),
     pytest.param("hang", "TIMEOUT", "killed after", marks=pytest.mark.slow),
     ("garbage", "ERROR", "output file unreadable")],
)
def test_crash_timeout_and_bad_output_are_statuses(env, mode, status, words):
    tmp_path, gdir, bdir = env
    # the fake copies outputs (milliseconds) and, for hang, blocks forever at chain; one
    # process per golden, so that a hang waits out the timeout once (test_runner_batch.py
    # has the hang inside a batch)
    timeout = f"{SHORT_TIMEOUT:g}" if mode == "hang" else "60"
    r = invoke(tmp_path, gdir, bdir, "--backend", "cpu", "--no-batch", mode=f"chain:{mode}", timeout=timeout)
    assert r.exit_code == 1
    cases = report_cases(tmp_path)
    assert cases["tree_accept/chain@cpu"]["status"] == status
    assert words in cases["tree_accept/chain@cpu"]["reason"]
    n = len(list(gdir.glob("tree_accept/*.kdtr")))
    assert sum(c["status"] == "PASS" for c in cases.values()) == n - 1  # the rest went on
    assert "Traceback" not in r.output


def test_waived_case(env):
    tmp_path, gdir, bdir = env
    (gdir / "known_failures.json").write_text(json.dumps({"tree_accept/chain@cpu": "fake kernel bug #1"}))
    r = invoke(tmp_path, gdir, bdir, "--backend", "cpu", mode="chain:segv")
    assert r.exit_code == 0, r.output
    case = report_cases(tmp_path)["tree_accept/chain@cpu"]
    assert case["status"] == "WAIVED" and "fake kernel bug #1" in case["reason"]


def test_junit_keeps_statuses(env):
    tmp_path, gdir, bdir = env
    invoke(tmp_path, gdir, bdir, mode="chain:segv")
    root = ET.parse(tmp_path / "reports" / "junit.xml").getroot()
    statuses = {
        tc.get("name"): tc.find("properties/property[@name='status']").get("value") for tc in root.iter("testcase")
    }
    assert statuses["chain[cpu]"] == "CRASH" and statuses["default[cpu]"] == "PASS"
    assert statuses["default[cuda]"] == "NOT_SUPPORTED"
    chain = next(tc for tc in root.iter("testcase") if tc.get("name") == "chain[cpu]")
    assert chain.find("error") is not None


def test_only_and_shard_select(env):
    tmp_path, gdir, bdir = env
    r = invoke(tmp_path, gdir, bdir, "--only", "tree_accept/*_accept", "--backend", "cpu")
    assert r.exit_code == 0
    assert set(report_cases(tmp_path)) == {"tree_accept/full_accept@cpu"}
    r = invoke(tmp_path, gdir, bdir, "--only", "tree_accept", "--backend", "cpu", "--shard", "2/4")
    n = len(list((gdir / "tree_accept").glob("*.kdtr")))  # shard 2/4 deals goldens 1, 5, 9, ...
    assert r.exit_code == 0 and len(report_cases(tmp_path)) == len(range(1, n, 4)) >= 3


@pytest.mark.parametrize(
    "args,words",
    [
        (["--only", "no_such_op"], "no op matches"),
        (["--only", "tree_accept/zzz*"], "matches no golden"),
        (["--shard", "5/2"], "--shard"),
        (["--backend", "tpu"], "tpu"),
    ],
)
def test_bad_command_line_is_exit_2_with_one_line(env, args, words):
    tmp_path, gdir, bdir = env
    r = invoke(tmp_path, gdir, bdir, *args)
    assert r.exit_code == 2
    assert words in r.output


def test_missing_binary_is_error_not_traceback(env):
    tmp_path, gdir, bdir = env
    (bdir / "kdtr_tree_accept").unlink()
    r = invoke(tmp_path, gdir, bdir, "--backend", "cpu", "--only", "tree_accept/default")
    assert r.exit_code == 1
    reason = report_cases(tmp_path)["tree_accept/default@cpu"]["reason"]
    assert reason == f"binary kdtr_tree_accept not found in {bdir} (the binary directory given)"


def test_missing_golden_dir_is_usage_error(tmp_path):
    r = CliRunner().invoke(main, ["run", "--golden-dir", str(tmp_path / "nope")])
    assert r.exit_code == 2 and "does not exist" in r.output


def test_inspect_diff_list(repo_root, tmp_path):
    golden = repo_root / "golden" / "tree_accept" / "default.kdtr"
    r = CliRunner().invoke(main, ["inspect", str(golden)])
    assert r.exit_code == 0 and "expected.accepted_path" in r.output and "contract.status.kind" in r.output
    r = CliRunner().invoke(main, ["inspect", str(tmp_path / "missing.kdtr")])
    assert r.exit_code == 2
    bad = tmp_path / "bad.kdtr"
    bad.write_bytes(b"definitely not kdtr bytes")
    r = CliRunner().invoke(main, ["inspect", str(bad)])
    assert r.exit_code == 2 and "BadMagic" in r.output
    g = kdtr.load(golden)
    out = tmp_path / "out.kdtr"
    outputs = {k[9:]: np.array(v) for k, v in g.tensors.items() if k.startswith("expected.")}
    kdtr.save(out, outputs)
    assert CliRunner().invoke(main, ["diff", str(golden), str(out)]).exit_code == 0
    outputs["status"][0] = 3
    kdtr.save(out, outputs)
    r = CliRunner().invoke(main, ["diff", str(golden), str(out)])
    assert r.exit_code == 1 and "request 0: expected 0, actual 3" in r.output
    r = CliRunner().invoke(main, ["list"])
    assert r.exit_code == 0 and "token_id_zero" in r.output


def test_select_unit():
    g = [("tree_accept", "a", Path("a")), ("tree_accept", "b", Path("b"))]
    assert runner.select(g, ["tree_accept/b"]) == [g[1]]
    with pytest.raises(runner.UsageError):
        runner.select(g, ["x/y"])


@pytest.mark.slow  # waits out SHORT_TIMEOUT
def test_timeout_kills_the_whole_process_group(env):
    tmp_path, gdir, bdir = env
    pidfile = tmp_path / "child.pid"
    shim = bdir / "kdtr_tree_accept"
    # the child blocks forever (a FIFO nothing writes to): only the group kill ends it
    shim.write_text(f"#!/bin/sh\ncat {never_fifo(tmp_path)} >/dev/null 2>&1 &\necho $! > {pidfile}\nwait\n")
    r = invoke(tmp_path, gdir, bdir, "--backend", "cpu", "--only", "tree_accept/chain", timeout=f"{SHORT_TIMEOUT:g}")
    assert r.exit_code == 1 and report_cases(tmp_path)["tree_accept/chain@cpu"]["status"] == "TIMEOUT"
    child = int(pidfile.read_text())
    # the killed child may take a moment to be reaped by init
    wait_for(lambda: gone(child), f"child {child} of the timed-out binary is still running")


def test_config_metadata_must_match_the_file_name(env):
    tmp_path, gdir, bdir = env
    shutil.copy(gdir / "tree_accept" / "default.kdtr", gdir / "tree_accept" / "renamed.kdtr")
    relist(gdir)
    r = invoke(tmp_path, gdir, bdir, "--backend", "cpu", "--only", "tree_accept/renamed")
    case = report_cases(tmp_path)["tree_accept/renamed@cpu"]
    assert r.exit_code == 1 and case["status"] == "ERROR" and "does not match the file name" in case["reason"]


def test_empty_shard_is_a_usage_error(env):
    tmp_path, gdir, bdir = env
    r = invoke(tmp_path, gdir, bdir, "--backend", "cpu", "--shard", "40/40")
    assert r.exit_code == 2 and "selects no case" in r.output


def test_reports_are_world_readable(env):
    tmp_path, gdir, bdir = env
    invoke(tmp_path, gdir, bdir, "--backend", "cpu", "--only", "tree_accept/chain")
    for name in ("conformance.json", "junit.xml", "conformance.md"):
        assert (tmp_path / "reports" / name).stat().st_mode & 0o044 == 0o044, name


@pytest.mark.parametrize("args", [["run", "--backend", "tpu"], ["inspect", "/no/such/file.kdtr"], ["nosuch"],
                                  ["run", "-j", "0"]])
def test_console_script_usage_errors_are_one_line(args, repo_root):
    import subprocess

    p = subprocess.run([sys.executable, "-c", "from kdtr.cli.main import entry; entry()", *args],
                       capture_output=True, text=True, cwd=repo_root, timeout=60)
    assert p.returncode == 2
    assert len(p.stderr.strip().splitlines()) == 1 and "error" in p.stderr, p.stderr


def test_markup_like_names_are_shown_verbatim(tmp_path):
    path = tmp_path / "odd.kdtr"
    kdtr.save(path, {"input.[/]": np.zeros(2, np.int32), "x[bold]y": np.ones(1, np.int8)}, {"k[/]": "[red]v"})
    r = CliRunner().invoke(main, ["inspect", str(path)], catch_exceptions=False)
    assert r.exit_code == 0
    assert "input.[/]" in r.output and "x[bold]y" in r.output and "k[/]" in r.output and "[red]v" in r.output
    r = CliRunner().invoke(main, ["diff", str(path), str(path)], catch_exceptions=False)
    assert r.exit_code == 0 and "x[bold]y: ok (exact)" in r.output


def test_stale_and_needless_waivers_are_reported(env):
    tmp_path, gdir, bdir = env
    waivers = {"tree_accept/chain@cpu": "old bug", "tree_accept/nosuch": "typo"}
    (gdir / "known_failures.json").write_text(json.dumps(waivers))
    r = invoke(tmp_path, gdir, bdir, "--backend", "cpu", "--only", "tree_accept/chain")
    assert r.exit_code == 0
    assert "'tree_accept/nosuch' names no golden" in r.output
    assert "passes although waived" in report_cases(tmp_path)["tree_accept/chain@cpu"]["reason"]


def test_diff_refuses_swapped_or_foreign_files(repo_root, tmp_path):
    golden = repo_root / "golden" / "tree_accept" / "default.kdtr"
    out = tmp_path / "out.kdtr"
    g = kdtr.load(golden)
    expected = {k[9:]: np.array(v) for k, v in g.tensors.items() if k.startswith("expected.")}
    kdtr.save(out, expected, {"op": "tree_accept"})
    r = CliRunner().invoke(main, ["diff", str(out), str(golden)])
    assert r.exit_code == 2 and "give it first" in r.output
    kdtr.save(out, {"status": np.zeros(4, np.int32)}, {"op": "tree_build"})
    r = CliRunner().invoke(main, ["diff", str(golden), str(out)])
    assert r.exit_code == 2 and "is op 'tree_accept'" in r.output


def test_ctrl_c_stops_the_run_and_its_binaries(env, repo_root):
    import signal as _signal
    import subprocess

    tmp_path, gdir, bdir = env
    pidfile = tmp_path / "pids"
    shim = bdir / "kdtr_tree_accept"
    shim.write_text(f"#!/bin/sh\necho $$ >> {pidfile}\n: < {never_fifo(tmp_path)}\n")  # blocks forever
    # The runner gets SIGINT's default disposition, as under a terminal: a test suite started
    # in the background of a non-interactive shell (`cmd &`) inherits SIGINT ignored, and a
    # Python started with SIGINT ignored keeps ignoring it.
    p = subprocess.Popen(
        [sys.executable, "-c", "from kdtr.cli.main import entry; entry()", "run", "--golden-dir", str(gdir),
         "--bin-dir", str(bdir), "--report-dir", str(tmp_path / "reports"), "--backend", "cpu", "-j", "1"],
        cwd=repo_root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: _signal.signal(_signal.SIGINT, _signal.SIG_DFL))
    try:
        wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), "no binary started")
        p.send_signal(_signal.SIGINT)
        p.communicate(timeout=HANG_GUARD)  # its binaries never end by themselves
    except subprocess.TimeoutExpired:
        pytest.fail("kdtr run did not stop on Ctrl-C")
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 128 + _signal.SIGINT
    for pid in map(int, pidfile.read_text().split()):
        wait_for(lambda pid=pid: gone(pid), f"binary {pid} outlived the runner")
