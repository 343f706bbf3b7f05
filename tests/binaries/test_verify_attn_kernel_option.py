"""``--kernel auto|simt|mma|wgmma`` of kdtr_verify_attn and kdtr_greedy_step (its verify_attn
stage), docs/binaries.md: anything else is a usage error (exit 2, one line naming the
option, no output file); a forced kernel with the cpu backend is a usage error too, in the
CUDA build and in the CPU-only build alike (both are tested by whichever build/ holds: CI's
cpu job builds the CPU-only one); auto on the cpu backend runs cpu_f64.  With the cuda
backend, a forced wgmma either runs a wgmma_* instance or exits 3 saying what it needs
(and it must run on a compute capability 9.0 device of a build with the Hopper kernel,
for the goldens it takes)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

import kdtr
from conftest import REPO_ROOT, op_binary

GOLDEN = {"verify_attn": REPO_ROOT / "golden" / "verify_attn" / "small_bf16.kdtr",
          "greedy_step": REPO_ROOT / "golden" / "greedy_step" / "default.kdtr"}
OPS = tuple(GOLDEN)


def run(op: str, out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(op_binary(op)), "--input", str(GOLDEN[op]), "--output", str(out), *args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("bad", ["tma", "", "WGMMA", "mma,wgmma", "heap"])
def test_unknown_kernel_is_a_usage_error(op, bad, tmp_path):
    out = tmp_path / "o.kdtr"
    r = run(op, out, "--kernel", bad)
    assert r.returncode == 2, r.stderr
    assert f"--kernel must be auto, simt, mma or wgmma, not '{bad}'" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not out.exists()


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("kernel", ["simt", "mma", "wgmma"])
@pytest.mark.parametrize("backend", [["--backend", "cpu"], []])  # cpu is the default backend
def test_a_forced_kernel_on_the_cpu_backend_is_a_usage_error(op, kernel, backend, tmp_path):
    out = tmp_path / "o.kdtr"
    r = run(op, out, *backend, "--kernel", kernel)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith(f"kdtr_{op}: --kernel {kernel} applies to --backend cuda only; usage: "), r.stderr
    assert "[--kernel VALUE]" in r.stderr and len(r.stderr.strip().splitlines()) == 1 and not out.exists()


@pytest.mark.parametrize("op", OPS)
def test_auto_on_the_cpu_backend_runs_cpu_f64(op, tmp_path):
    out = tmp_path / "o.kdtr"
    r = run(op, out, "--backend", "cpu", "--kernel", "auto")
    assert r.returncode == 0, r.stderr
    assert kdtr.load(out).metadata["kernel"] == "cpu_f64"


@pytest.mark.parametrize("op", OPS)
def test_help_lists_the_kernel_option(op):
    r = subprocess.run([str(op_binary(op)), "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "[--kernel VALUE]" in r.stdout, r.stdout + r.stderr


WGMMA_NEEDS = ("--kernel wgmma needs bf16 inputs with Dqk % 8 == 0, Dqk <= 576, d_v <= 512, enough shared memory, "
               "a compute capability 9.0 device and a build with the Hopper kernel (got ")


@pytest.mark.parametrize("op,golden", [("verify_attn", "small_bf16"), ("verify_attn", "k2_dims_bf16"),
                                       ("verify_attn", "small"), ("greedy_step", "k2_dims")])
def test_wgmma_on_cuda_runs_or_says_what_it_needs(op, golden, tmp_path):
    out = tmp_path / "o.kdtr"
    path = REPO_ROOT / "golden" / op / f"{golden}.kdtr"
    r = subprocess.run([str(op_binary(op)), "--input", str(path), "--output", str(out), "--backend", "cuda",
                        "--kernel", "wgmma"], capture_output=True, text=True, timeout=300)
    if r.returncode == 0:
        assert kdtr.load(out).metadata["kernel"].startswith("wgmma"), r.stderr
        return
    assert r.returncode == 3 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    stage = "verify_attn: " if op == "greedy_step" else ""
    if WGMMA_NEEDS not in r.stderr:  # no device, or a CPU-only build: said by the backend check
        assert re.match(rf"kdtr_{op}: backend cuda not supported: (cudaGetDeviceCount|this binary was built without)",
                        r.stderr), r.stderr
        pytest.skip(f"no CUDA backend here: {r.stderr.strip()}")
    assert r.stderr.startswith(f"kdtr_{op}: backend cuda not supported: {stage}{WGMMA_NEEDS}"), r.stderr
    got = re.search(r"\(got (\w+), Dqk (\d+), d_v (\d+), compute capability (\d+\.\d+), a build (with|without) it\)$",
                    r.stderr.strip())
    assert got, r.stderr
    dtype, dqk, d_v, cc, built = got.groups()
    fits = dtype == "bf16" and int(dqk) % 8 == 0 and int(dqk) <= 576 and int(d_v) <= 512
    assert not (fits and cc == "9.0" and built == "with"), \
        f"the Hopper kernel refused a golden it takes on a compute capability 9.0 device: {r.stderr}"
