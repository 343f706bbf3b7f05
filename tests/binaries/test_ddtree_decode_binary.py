"""kdtr_ddtree_decode on both backends (cuda where a GPU is present): every committed golden
passes, with every verify_attn kernel on cuda; each bad input is refused (exit 2) with a
message naming the file and the tensor, before anything runs or, for a cache too short for a
step, as soon as the step finds it (on cuda: the decode loop's device-side check);
--kernel is for cuda only; without a GPU, --backend cuda exits 3."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

import kdtr
from conftest import cuda_device_present, op_binary
from kdtr.judge import Golden, judge
from kdtr.status import Status

GOLDENS = sorted(Path(__file__).resolve().parents[2].joinpath("golden", "ddtree_decode").glob("*.kdtr"))
HAS_CUDA = cuda_device_present()
CUDA = pytest.param("cuda", id="cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not HAS_CUDA, reason="no CUDA device (`nvidia-smi -L` lists no GPU): the cuda backend is not checked")])
BACKENDS = [pytest.param("cpu", id="cpu"), CUDA]


def run(golden: Path, out: Path, backend: str = "cpu", *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(op_binary("ddtree_decode")), "--input", str(golden), "--output", str(out),
                           "--backend", backend, *extra], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("path", GOLDENS, ids=lambda p: p.stem)
def test_every_golden_passes(path, tmp_path, backend):
    r = run(path, tmp_path / "out.kdtr", backend)
    assert r.returncode == 0, r.stderr
    assert judge(Golden.read(path), tmp_path / "out.kdtr").status == Status.PASS


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device (`nvidia-smi -L` lists no GPU)")
@pytest.mark.parametrize("kernel", ["simt", "mma", "wgmma"])
@pytest.mark.parametrize("path", GOLDENS, ids=lambda p: p.stem)
def test_every_golden_passes_with_each_attention_kernel(path, tmp_path, kernel):
    r = run(path, tmp_path / "out.kdtr", "cuda", "--kernel", kernel)
    if r.returncode == 3:  # the kernel does not apply to these dims: it must say why
        assert f"--kernel {kernel} needs" in r.stderr, r.stderr
        return
    assert r.returncode == 0, r.stderr
    assert judge(Golden.read(path), tmp_path / "out.kdtr").status == Status.PASS


def _edited(tmp_path: Path, **changes) -> Path:
    with kdtr.load(GOLDENS[0]) as f:
        tensors = {k: np.array(v) for k, v in f.tensors.items()}
        meta = dict(f.metadata)
    for k, v in changes.items():
        tensors[f"input.{k}"] = v(tensors[f"input.{k}"]) if callable(v) else v
    p = tmp_path / "bad.kdtr"
    kdtr.save(p, tensors, meta)
    return p


def _bump(value):
    def f(a):
        a = a.copy()
        a.reshape(-1)[0] = value
        return a
    return f


@pytest.mark.parametrize(("changes", "tensor", "msg"), [
    ({"prefix_len": _bump(10_000)}, "input.prefix_len", "element 0 = 10000 is outside [0, S"),
    ({"root_token_ids": _bump(-1)}, "input.root_token_ids", "element 0 = -1 is outside [0, V"),
    ({"budget": _bump(9)}, "input.budget", "element 0 = 9 is outside [0, N = max_budget = 8]"),
    ({"depth_limit": _bump(5)}, "input.depth_limit", "element 0 = 5 is outside [0, draft_depth = 4]"),
    ({"draft_top_k": np.array(0, np.int32)}, "input.draft_top_k", "draft_top_k 0 is outside [1, V = 256]"),
    ({"draft_depth": np.array(0, np.int32)}, "input.draft_depth", "draft_depth 0 < 1"),
    ({"target_w_kv": _bump(0.3)}, "input.target_w_kv", "element 0 = 0.30"),
    ({"kv_cache": lambda a: a[:, :40]}, "input.kv_cache", "S = 40 rows, step"),
])
@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_inputs_name_the_file_and_tensor(tmp_path, changes, tensor, msg, backend):
    bad = _edited(tmp_path, **changes)
    r = run(bad, tmp_path / "out.kdtr", backend)
    assert r.returncode == 2, r.stderr
    assert str(bad) in r.stderr and tensor in r.stderr and msg in r.stderr, r.stderr


def test_kernel_option_is_for_cuda_only(tmp_path):
    r = run(GOLDENS[0], tmp_path / "out.kdtr", "cpu", "--kernel", "mma")
    assert r.returncode == 2 and "--kernel mma applies to --backend cuda only" in r.stderr, r.stderr
    r = run(GOLDENS[0], tmp_path / "out.kdtr", "cpu", "--kernel", "fast")
    assert r.returncode == 2 and "--kernel must be auto, simt, mma or wgmma" in r.stderr, r.stderr


@pytest.mark.skipif(HAS_CUDA, reason="a GPU is present: the cuda backend runs")
def test_cuda_without_a_gpu_is_not_supported(tmp_path):
    r = run(GOLDENS[0], tmp_path / "out.kdtr", backend="cuda")
    assert r.returncode == 3 and "backend cuda not supported" in r.stderr, r.stderr


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device (`nvidia-smi -L` lists no GPU)")
@pytest.mark.parametrize("rows", [40, 20, 13])
def test_a_short_cache_stops_both_backends_at_the_same_request_and_step(tmp_path, rows):
    # Several requests run out of rows, in one step or in different ones: the device's stop
    # record must name the request and step the CPU names (the first step's lowest request).
    bad = _edited(tmp_path, kv_cache=lambda a: a[:, :rows], prefix_len=lambda a: np.minimum(a, rows))
    cpu, cuda = (run(bad, tmp_path / f"out-{b}.kdtr", b) for b in ("cpu", "cuda"))
    assert cpu.returncode == cuda.returncode == 2, (cpu.stderr, cuda.stderr)
    assert "input.kv_cache: request" in cpu.stderr and f"S = {rows} rows" in cpu.stderr, cpu.stderr
    assert cpu.stderr == cuda.stderr, (cpu.stderr, cuda.stderr)
