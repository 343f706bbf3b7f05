"""Batch mode (one binary process per op, backend and device), its per-golden fallback,
several devices and sanitizer sweeps: the runner side with a batch-aware fake
binary, the binary side with the real build/bin/kdtr_<op>."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import kdtr
from conftest import op_binary
from fakes import make_sanitizer, read_log, relist
from kdtr import run as runner
from kdtr.cli.main import main
from timing import SHORT_TIMEOUT


@pytest.fixture
def env(tmp_path, repo_root, fake_bin):
    """The tree_accept goldens, a batch-speaking fake binary and a fake compute-sanitizer
    (tests/fakes.py: $FAKE_MODE, $FAKE_GPU, $FAKE_EXIT_SEGV and $FAKE_SAN_ERR steer them;
    every invocation is logged to $FAKE_LOG)."""
    gdir = tmp_path / "golden"
    shutil.copytree(repo_root / "golden" / "tree_accept", gdir / "tree_accept")
    relist(gdir)
    bdir = fake_bin(gdir, "tree_accept", wrong_tensor="proposed").parent
    make_sanitizer(bdir)
    return tmp_path, gdir, bdir


def invoke(env, *args, timeout="60", **extra):
    tmp_path, gdir, bdir = env
    log = tmp_path / "fake.log"
    log.write_text("")
    e = dict(os.environ, FAKE_LOG=str(log), PATH=f"{bdir}{os.pathsep}{os.environ['PATH']}",
             **{k: v for k, v in extra.items()})
    jobs = [] if "-j" in args else ["-j", "1"]  # one cpu batch per op (-j N splits it in up to N)
    r = CliRunner().invoke(
        main,
        ["run", "--golden-dir", str(gdir), "--bin-dir", str(bdir), "--report-dir", str(tmp_path / "reports"),
         "--timeout", timeout, *jobs, *args],
        env=e, catch_exceptions=False,
    )
    calls = read_log(log)
    cases = {c["id"]: c for c in json.loads((tmp_path / "reports" / "conformance.json").read_text())["cases"]} \
        if (tmp_path / "reports" / "conformance.json").exists() else {}
    return r, calls, cases


def n_goldens(gdir: Path) -> int:
    return len(list(gdir.glob("tree_accept/*.kdtr")))


def test_one_process_per_op_and_backend(env):
    r, calls, cases = invoke(env)
    assert r.exit_code == 0, r.output
    assert len(calls) == 2 and all("--batch" in c for c in calls)  # cpu, cuda
    assert {c["process"] for c in cases.values()} == {"batch"}
    assert sum(c["status"] == "PASS" for c in cases.values()) == n_goldens(env[1])
    # the record of a batch case reruns it alone: its own command, no --batch
    chain = cases["tree_accept/chain@cpu"]
    assert "--batch" not in chain["command"] and "chain.kdtr" in chain["command"]
    assert chain["device"] is None and cases["tree_accept/chain@cuda"]["device"] == 0


def test_cpu_batches_split_over_jobs_by_golden_bytes(env):
    tmp_path, gdir, _ = env
    r, calls, cases = invoke(env, "-j", "3")
    assert r.exit_code == 0
    cpu = [c for c in calls if c[c.index("--backend") + 1] == "cpu"]
    cuda = [c for c in calls if c[c.index("--backend") + 1] == "cuda"]
    assert len(cpu) == 3 and len(cuda) == 1  # cuda: one process per op and device whatever -j
    sizes = sorted(sum(Path(c[i + 1]).stat().st_size for i, x in enumerate(c) if x == "--input") for c in cpu)
    biggest = max(p.stat().st_size for p in gdir.glob("tree_accept/*.kdtr"))
    assert sizes[-1] - sizes[0] <= biggest  # balanced to within one golden
    assert sorted(Path(c[i + 1]).name for c in cpu for i, x in enumerate(c) if x == "--input") == \
        sorted(p.name for p in gdir.glob("tree_accept/*.kdtr"))
    # a unit of one golden runs it as a single-golden process (large_batch outweighs the rest)
    assert [len([x for x in c if x == "--input"]) for c in cpu].count(1) == 1
    assert cases["tree_accept/large_batch@cpu"]["process"] == "single"
    assert {c["process"] for k, c in cases.items() if k != "tree_accept/large_batch@cpu"} == {"batch"}


@pytest.mark.parametrize("mode,status,words", [
    ("segv", "CRASH", "SIGSEGV"), ("batchsegv", "PASS", ""),   # batchsegv crashes only inside a batch
    # a hang inside a batch only: the batch is killed after --timeout, the rest runs alone
    # (and passes); a hang alone is TIMEOUT (test_runner.py), so each waits out one timeout
    pytest.param("batchhang", "PASS", "", marks=pytest.mark.slow),
    ("exit1", "CRASH", "cudaErrorIllegalAddress"),
])
def test_a_failure_inside_a_batch_is_attributed_to_its_golden(env, mode, status, words):
    tmp_path, gdir, bdir = env
    # the fake copies outputs (milliseconds): --timeout is a hang guard but for batchhang
    timeout = f"{SHORT_TIMEOUT:g}" if mode == "batchhang" else "60"
    r, calls, cases = invoke(env, "--backend", "cpu", timeout=timeout, FAKE_MODE=f"chain:{mode}")
    case = cases["tree_accept/chain@cpu"]
    assert case["status"] == status and words in case["reason"], case
    others = [c for k, c in cases.items() if k != "tree_accept/chain@cpu"]
    assert all(c["status"] == "PASS" for c in others)
    if mode == "exit1":  # the batch went on: exit 1 stops a batch on the cuda backend only
        assert len(calls) == 1 and case["process"] == "batch"
        assert case["stderr"] == "kdtr_tree_accept: cudaErrorIllegalAddress at test.cu:10"
    else:  # the batch died at chain: chain and every golden after it ran alone
        order = sorted(p.stem for p in gdir.glob("tree_accept/*.kdtr"))
        after = order[order.index("chain"):]
        assert case["process"] == "single"
        assert len(calls) == 1 + len(after) and all("--batch" not in c for c in calls[1:])
        assert sorted(Path(c[c.index("--input") + 1]).stem for c in calls[1:]) == after
        assert all(cases[f"tree_accept/{g}@cpu"]["process"] == ("single" if g in after else "batch") for g in order)
    assert r.exit_code == (0 if status == "PASS" else 1)


def test_cuda_runtime_failure_stops_the_batch_and_the_rest_runs_alone(env):
    r, calls, cases = invoke(env, "--backend", "cuda", FAKE_GPU="1", FAKE_MODE="chain:exit1")
    order = sorted(p.stem for p in env[1].glob("tree_accept/*.kdtr"))
    rest = order[order.index("chain") + 1:]
    assert cases["tree_accept/chain@cuda"]["status"] == "CRASH"
    assert cases["tree_accept/chain@cuda"]["process"] == "batch"
    assert sorted(Path(c[c.index("--input") + 1]).stem for c in calls[1:]) == rest
    assert all(cases[f"tree_accept/{g}@cuda"]["status"] == "PASS" for g in order if g != "chain")


def test_a_crash_after_the_last_golden_reruns_the_whole_batch(env):
    r, calls, cases = invoke(env, "--backend", "cpu", FAKE_EXIT_SEGV="1")
    assert r.exit_code == 0  # alone, no golden crashes
    assert len(calls) == 1 + n_goldens(env[1])
    assert {c["process"] for c in cases.values()} == {"single"}


def test_a_binary_without_batch_mode_gets_one_process_per_golden(env, fake_bin):
    tmp_path, gdir, bdir = env
    fake_bin(gdir, "tree_accept", wrong_tensor="proposed", batch=False)
    r, _, cases = invoke(env, "--backend", "cpu", FAKE_MODE="chain:wrong")
    assert cases["tree_accept/chain@cpu"]["status"] == "MISMATCH"
    assert {c["process"] for c in cases.values()} == {"single"}
    assert sum(c["status"] == "PASS" for c in cases.values()) == n_goldens(gdir) - 1


def test_batch_and_single_runs_report_the_same(env):
    _, _, batched = invoke(env, FAKE_MODE="chain:wrong,mid:exit1")
    _, calls, single = invoke(env, "--no-batch", FAKE_MODE="chain:wrong,mid:exit1")
    assert len(calls) == 2 * n_goldens(env[1])
    keys = ("status", "reason", "outputs", "stderr", "rerun", "command", "device")
    assert {k: {f: c[f] for f in keys} for k, c in batched.items()} == \
           {k: {f: c[f] for f in keys} for k, c in single.items()}
    assert batched["tree_accept/chain@cpu"]["status"] == "MISMATCH"


def test_cases_are_spread_over_devices(env):
    r, calls, cases = invoke(env, "--backend", "cuda", "--device", "0,1", FAKE_GPU="1")
    assert r.exit_code == 0
    devices = sorted(c[c.index("--device") + 1] for c in calls)
    assert devices == ["0", "1"] and all("--batch" in c for c in calls)
    by_device = {d: [c for c in cases.values() if c["device"] == d] for d in (0, 1)}
    assert abs(len(by_device[0]) - len(by_device[1])) <= 1 and by_device[0] and by_device[1]
    for c in by_device[1]:
        assert c["rerun"].endswith("--device 1") and "--device 1" in c["command"]
    for c in by_device[0]:
        assert "--device" not in c["rerun"]
    junit = (env[0] / "reports" / "junit.xml").read_text()
    assert 'name="device" value="1"' in junit
    md = (env[0] / "reports" / "conformance.md").read_text()
    assert f"CUDA devices (cases each): 0: {len(by_device[0])}, 1: {len(by_device[1])}" in md


@pytest.mark.parametrize("spec", ["x", "0,0", "-1", "1,", ""])
def test_bad_device_list_is_a_usage_error(env, spec):
    r, calls, _ = invoke(env, "--device", spec)
    assert r.exit_code == 2 and "--device" in r.output and not calls


def test_device_all_counts_the_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert runner.parse_devices("all") == (0, 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert runner.parse_devices("all") == (0,)


def test_sanitizer_errors_are_attributed_to_their_golden(env):
    r, calls, cases = invoke(env, "--backend", "cuda", "--sanitizer", "memcheck", FAKE_GPU="1", FAKE_SAN_ERR="mid")
    bad = cases["tree_accept/mid@cuda"]
    assert bad["status"] == "CRASH" and bad["process"] == "single"
    assert "compute-sanitizer memcheck reported errors: ERROR SUMMARY: 1 error; " \
           "first: Invalid __global__ read of size 4 bytes" in bad["reason"]
    assert all(c["status"] == "PASS" for k, c in cases.items() if k != "tree_accept/mid@cuda")
    # one batch, then (the sanitizer found something) every golden alone under the sanitizer
    assert len(calls) == 1 + n_goldens(env[1])
    assert bad["command"].startswith("compute-sanitizer --tool memcheck --leak-check full --error-exitcode 99 ")
    assert bad["rerun"].endswith("--sanitizer memcheck")


def test_sanitizer_reason_from_real_compute_sanitizer_output(repo_root):
    # compute-sanitizer 2025 (CUDA 13.0) memcheck on an out-of-bounds write, captured on the H200
    text = (repo_root / "tests" / "data" / "compute_sanitizer_memcheck_oob.txt").read_text()
    assert runner._sanitizer_errors(text) == "ERROR SUMMARY: 18 errors; first: Invalid __global__ write of size 4 bytes"
    assert runner._sanitizer_errors("========= COMPUTE-SANITIZER\n") == "(no report line)"


def test_a_clean_sanitizer_sweep_is_one_process(env):
    r, calls, cases = invoke(env, "--backend", "cuda", "--sanitizer", "racecheck", FAKE_GPU="1")
    assert r.exit_code == 0 and len(calls) == 1
    assert {c["status"] for c in cases.values()} == {"PASS"} and {c["process"] for c in cases.values()} == {"batch"}


def test_sanitizer_needs_the_cuda_backend(env):
    r, calls, _ = invoke(env, "--backend", "cpu", "--sanitizer", "memcheck")
    assert r.exit_code == 2 and "--sanitizer" in r.output and not calls


# --- the binaries' batch mode ---------------------------------------------------------


def _bin(*args, **kw):
    return subprocess.run([str(op_binary("tree_accept")), *map(str, args)], capture_output=True, text=True,
                          timeout=60, **kw)


def test_binary_batch_runs_each_golden_and_reports_each(repo_root, tmp_path):
    g = repo_root / "golden"
    goldens = [g / "tree_accept" / "chain.kdtr", g / "tree_build" / "chain.kdtr", g / "tree_accept" / "wide.kdtr"]
    args = ["--batch"]
    for k, golden in enumerate(goldens):
        args += ["--input", golden, "--output", tmp_path / f"{k}.kdtr"]
    p = _bin(*args)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith(runner.BATCH_TAG)]
    parsed = [runner._BATCH_LINE.fullmatch(ln) for ln in lines]
    assert [int(m[1]) for m in parsed] == [0, 1, 2] and [int(m[2]) for m in parsed] == [0, 2, 0]
    assert "tree_build/chain.kdtr" in parsed[1][4] and parsed[1][4] in p.stderr  # the same message on stderr
    assert p.returncode == 2  # the first failing golden's code
    for k in (0, 2):  # each output equals its single-golden run
        single = tmp_path / f"single{k}.kdtr"
        assert _bin("--input", goldens[k], "--output", single).returncode == 0
        a, b = kdtr.load(tmp_path / f"{k}.kdtr"), kdtr.load(single)
        assert a.tensors.keys() == b.tensors.keys()
        assert all(np.array_equal(a.tensors[n], b.tensors[n]) for n in a.tensors)
        assert a.metadata == b.metadata
    assert not (tmp_path / "1.kdtr").exists()


@pytest.mark.parametrize("args,words", [
    (["--input", "A", "--output", "B", "--input", "C", "--output", "D"], "several goldens need --batch"),
    (["--batch", "--input", "A", "--output", "B", "--input", "C"], "one --output per --input"),
    (["--batch", "--input", "A", "--output", "B", "--input", "C", "--output", "B"], "given for two goldens"),
    (["--batch", "--input", "A", "--output", "B", "--input", "B", "--output", "C"], "must differ from --input"),
])
def test_binary_batch_usage_errors(args, words):
    p = _bin(*args)
    assert p.returncode == 2 and words in p.stderr and len(p.stderr.splitlines()) == 1
    assert runner.BATCH_TAG not in p.stdout


def test_several_ops_go_whole_to_devices_when_that_balances(repo_root):
    found = runner.discover(repo_root / "golden")
    cfg = runner.RunConfig(repo_root / "golden", Path("b"), Path("o"), devices=(0, 1))
    units = runner.plan_units(runner.plan(found, ["cuda"]), cfg, jobs=8)
    ops = {op for op, _, _ in found}
    assert len(units) == len(ops)  # one process per op, as on one device
    assert all(len({c.device for c in u}) == 1 and len({c.op for c in u}) == 1 for u in units)
    assert {u[0].device for u in units} == {0, 1}
    # one op alone cannot be balanced whole: its goldens are dealt out over both devices
    one = runner.plan([g for g in found if g[0] == "tree_build"], ["cuda"])
    units = runner.plan_units(one, cfg, jobs=8)
    assert sorted(u[0].device for u in units) == [0, 1]
    assert abs(len(units[0]) - len(units[1])) <= 1
    # the cpu cases of a mixed run are not placed on devices
    mixed = runner.plan_units(runner.plan(found, ["cpu", "cuda"]), cfg, jobs=2)
    assert all(c.device is None for u in mixed for c in u if c.backend == "cpu")
