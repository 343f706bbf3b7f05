"""CI strength: where nvcc is on PATH, `make` (run by `make test` before the suite)
compiles every CUDA source with nvcc, so a CUDA compile error fails CI even without a GPU."""

from __future__ import annotations

import shutil
import subprocess

import pytest


def test_every_cuda_source_was_compiled_by_nvcc(repo_root):
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH: the Makefile builds the CPU-only variant with g++")
    stamp = (repo_root / "build" / "config.stamp").read_text()
    assert stamp.startswith("cuda"), f"build/ holds the {stamp.split()[0]} variant although nvcc is on PATH"
    kernels = sorted((repo_root / "cuda_tests" / "kernels").glob("*.cu"))
    tests = sorted((repo_root / "cuda_tests" / "tests").glob("test_*.cu"))
    assert kernels and tests
    # The Hopper kernel is compiled only with its CUTLASS headers and 90 in CUDA_ARCH (the
    # stamp says "wgmma=none" otherwise; tests/binaries/test_build_arch.py checks when it must be).
    if "| wgmma=none " in stamp:
        kernels = [k for k in kernels if k.name != "verify_attn_sm90.cu"]
    for src in kernels:
        obj = repo_root / "build" / "obj" / f"kernel_{src.stem}.o"
        assert obj.exists(), f"{src} was not compiled by nvcc ({obj} missing): add its op to OPS in the Makefile"
        assert obj.stat().st_mtime >= src.stat().st_mtime, f"{obj} is older than {src}"
    for src in tests:
        assert (repo_root / "build" / "bin" / f"kdtr_{src.stem[len('test_'):]}").exists(), src


CORES = ("tree_accept", "tree_build", "verify_attn", "greedy_step")


@pytest.mark.parametrize("op", CORES)
def test_a_core_edit_recompiles_only_the_objects_that_include_it(repo_root, op):
    """`make -n -W cuda_tests/kernels/<op>.cuh` on the built tree: the host sources it
    recompiles are the op's CPU core object alone (cuda_tests/cpu/<op>.cpp), never a
    binary's main, so a mutant of a core costs one small compile and a link."""
    if not (repo_root / "build" / "config.stamp").is_file():
        pytest.fail("build/ is not built: run `make` first", pytrace=False)
    variant = (repo_root / "build" / "config.stamp").read_text().split()[0]
    args = [] if variant == "cuda" else ["NO_CUDA=1"]
    targets = [f"build/bin/kdtr_{o}" for o in CORES]
    r = subprocess.run(["make", "-n", "--no-print-directory", *args, "-W", f"cuda_tests/kernels/{op}.cuh", *targets],
                       cwd=repo_root, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    sources = set()  # the file each compile line compiles (the word after -c)
    for ln in r.stdout.splitlines():
        words = ln.split()
        if "-c" in words:
            sources.add(words[words.index("-c") + 1])
    host = sorted(s for s in sources if not s.startswith("cuda_tests/kernels/"))
    assert host == [f"cuda_tests/cpu/{op}.cpp"], r.stdout
