"""kdtr_ddtree_decode on the CPU: every committed golden passes; each bad input is refused
(exit 2) with a message naming the file and the tensor, before anything runs or, for a cache
too short for a step, as soon as the step finds it; --backend cuda says it is not built yet
(exit 3)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

import kdtr
from conftest import op_binary
from kdtr.judge import Golden, judge
from kdtr.status import Status

GOLDENS = sorted(Path(__file__).resolve().parents[2].joinpath("golden", "ddtree_decode").glob("*.kdtr"))


def run(golden: Path, out: Path, backend: str = "cpu") -> subprocess.CompletedProcess:
    return subprocess.run([str(op_binary("ddtree_decode")), "--input", str(golden), "--output", str(out),
                           "--backend", backend], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("path", GOLDENS, ids=lambda p: p.stem)
def test_every_golden_passes(path, tmp_path):
    r = run(path, tmp_path / "out.kdtr")
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
def test_bad_inputs_name_the_file_and_tensor(tmp_path, changes, tensor, msg):
    bad = _edited(tmp_path, **changes)
    r = run(bad, tmp_path / "out.kdtr")
    assert r.returncode == 2, r.stderr
    assert str(bad) in r.stderr and tensor in r.stderr and msg in r.stderr, r.stderr


def test_cuda_is_not_built_yet(tmp_path):
    r = run(GOLDENS[0], tmp_path / "out.kdtr", backend="cuda")
    assert r.returncode == 3 and "ddtree_decode has no CUDA implementation yet" in r.stderr, r.stderr
