"""CI strength: where nvcc is on PATH, `make` (run by `make test` before the suite)
compiles every CUDA source with nvcc, so a CUDA compile error fails CI even without a GPU."""

from __future__ import annotations

import shutil

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
    # stamp says "wgmma=none" otherwise; tests/test_build_arch.py checks when it must be).
    if "| wgmma=none " in stamp:
        kernels = [k for k in kernels if k.name != "verify_attn_sm90.cu"]
    for src in kernels:
        obj = repo_root / "build" / "obj" / f"kernel_{src.stem}.o"
        assert obj.exists(), f"{src} was not compiled by nvcc ({obj} missing): add its op to OPS in the Makefile"
        assert obj.stat().st_mtime >= src.stat().st_mtime, f"{obj} is older than {src}"
    for src in tests:
        assert (repo_root / "build" / "bin" / f"kdtr_{src.stem[len('test_'):]}").exists(), src
