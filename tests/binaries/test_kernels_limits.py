"""kdtr.kernels checks what a call would allocate before allocating it: the bytes of every
output, all together, against kdtr.limits.max_output_bytes() ($KDTR_MAX_OUTPUT_BYTES), and
for device="cpu" the CPU backend's scratch (tree_build's is sized by max_budget even for
B = 0) against max_scratch_bytes() ($KDTR_MAX_SCRATCH_BYTES). A call over a limit is a
ValueError naming the op, the argument and the limit, at once; the byte counts are the
binaries' for the same golden (build/bin, `make`). The library is build/lib/libkdtr_kernels.so
(`make lib`; CPU entries only are called here)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import kdtr
from conftest import REPO_ROOT, op_binary
from kdtr import kernels, limits

GOLDEN = REPO_ROOT / "golden"
LIMIT_ENVS = (limits.MAX_OUTPUT_BYTES_ENV, limits.MAX_SCRATCH_BYTES_ENV)
CASES = {"tree_build": "default", "verify_attn": "small", "tree_accept": "default", "greedy_step": "default"}
AS_LIMIT = 2 << 30  # address space of the child that calls with the default limits


@pytest.fixture(autouse=True)
def _no_limit_env(monkeypatch):
    for env in LIMIT_ENVS:
        monkeypatch.delenv(env, raising=False)


@pytest.fixture(scope="module")
def lib():
    try:
        return kernels.load()
    except kernels.KernelLibraryError as exc:
        pytest.fail(str(exc), pytrace=False)


def golden_call(op: str):
    """(golden path, kwargs of the binding for its inputs)."""
    path = GOLDEN / op / f"{CASES[op]}.kdtr"
    with kdtr.load(path) as g:
        kw = {k[len("input."):]: np.array(v) for k, v in g.tensors.items() if k.startswith("input.")}
        if "max_budget" in g.metadata:
            kw["max_budget"] = int(g.metadata["max_budget"])
    return path, kw


def tree_build_args(b: int) -> dict[str, np.ndarray]:
    return dict(top_log_probs=np.zeros((b, 1, 1), np.float32), top_token_ids=np.zeros((b, 1, 1), np.int64),
                root_token_ids=np.zeros(b, np.int64), budget=np.ones(b, np.int32), depth_limit=np.ones(b, np.int32))


def need_of(message: str) -> int:
    m = re.search(r"would need (\d+) bytes", message)
    assert m, message
    return int(m.group(1))


# ---------------------------------------------------------------------------------------
# The listed case: max_budget 100,000 would fill a 10 GB visibility
# ---------------------------------------------------------------------------------------

def test_large_max_budget_is_refused_before_anything_is_allocated(lib):
    """In a child under a 2 GiB address-space limit: a binding that allocates first dies of
    MemoryError there (or fills 10 GB); the checked one refuses at once, naming the limit."""
    code = textwrap.dedent(f"""
        import resource, sys
        sys.path.insert(0, {str(REPO_ROOT)!r})
        import numpy as np
        from kdtr import kernels
        kernels.load()
        resource.setrlimit(resource.RLIMIT_AS, ({AS_LIMIT}, {AS_LIMIT}))
        def args(b):
            return (np.zeros((b, 1, 1), np.float32), np.zeros((b, 1, 1), np.int64), np.zeros(b, np.int64),
                    np.ones(b, np.int32), np.ones(b, np.int32))
        def greedy(t):  # H = 0 heads: q holds no bytes, whatever T
            return (*args(1), np.zeros((1, t, 0, 1), np.float32), np.zeros((1, t, 1), np.float32),
                    np.zeros(1, np.int32), 1.0, 1, np.zeros((1, t), np.int64))
        calls = [lambda: kernels.tree_build(*args(1), max_budget=100_000),
                 lambda: kernels.tree_build(*args(1), max_budget=2**31 - 2),
                 lambda: kernels.tree_build(*args(0), max_budget=2**31 - 2),
                 lambda: kernels.greedy_step(*greedy(100_001), max_budget=100_000)]
        for call in calls:
            try:
                call()
                print("allocated")
            except ValueError as exc:
                print("ValueError:", exc)
    """)
    env = {k: v for k, v in os.environ.items() if k not in LIMIT_ENVS}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert len(lines) == 4, r.stdout
    assert lines[0] == (
        "ValueError: tree_build: max_budget: outputs would need 10002600033 bytes (9.32 GiB) for B = 1, "
        "T = max_budget + 1 = 100001, over the limit of 4294967296 bytes (4 GiB); set KDTR_MAX_OUTPUT_BYTES to a "
        "larger byte count to allow it")
    assert lines[1].startswith("ValueError: tree_build: max_budget: outputs would need 4.61e18 bytes"), lines[1]
    # B = 0: no output bytes, but the CPU build's scratch is sized by max_budget
    assert lines[2].startswith("ValueError: tree_build: max_budget: CPU backend scratch would need "), lines[2]
    assert "KDTR_MAX_SCRATCH_BYTES" in lines[2]
    assert lines[3].startswith("ValueError: greedy_step: max_budget: outputs would need 10003800053 bytes "
                               "(9.32 GiB) for B = 1, T = max_budget + 1 = 100001, H = 0, d_v = 1, over the limit of "
                               "4294967296 bytes"), lines[3]


# ---------------------------------------------------------------------------------------
# Every op: the output limit is exact, and its byte count is the binaries'
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("op", list(CASES))
def test_output_limit_is_exact_for_every_op(lib, op, monkeypatch):
    _, kw = golden_call(op)
    fn = getattr(kernels, op)
    need = sum(int(a.nbytes) for a in fn(**kw, device="cpu").values())
    monkeypatch.setenv(limits.MAX_SCRATCH_BYTES_ENV, str(1 << 40))
    monkeypatch.setenv(limits.MAX_OUTPUT_BYTES_ENV, str(need))
    fn(**kw, device="cpu")
    monkeypatch.setenv(limits.MAX_OUTPUT_BYTES_ENV, str(need - 1))
    with pytest.raises(ValueError, match=rf"^{op}: [a-z_, ]+: outputs would need {need} bytes .*over the limit of "
                                         rf"{need - 1} bytes.*set KDTR_MAX_OUTPUT_BYTES"):
        fn(**kw, device="cpu")


def _binary_refusal(op: str, golden: Path, tmp_path: Path, env: dict[str, str], *extra: str) -> str:
    full = {k: v for k, v in os.environ.items() if k not in LIMIT_ENVS}
    full.update(env)
    r = subprocess.run([str(op_binary(op)), "--input", str(golden), "--output", str(tmp_path / "out.kdtr"),
                        "--backend", "cpu", *extra], capture_output=True, text=True, timeout=120, env=full)
    assert r.returncode == 2, (r.returncode, r.stderr)
    return r.stderr.strip()


@pytest.mark.parametrize("op", list(CASES))
def test_output_bytes_are_the_binaries(lib, op, tmp_path, monkeypatch):
    golden, kw = golden_call(op)
    line = _binary_refusal(op, golden, tmp_path, {limits.MAX_OUTPUT_BYTES_ENV: "0"})
    assert ": outputs would need " in line, line
    monkeypatch.setenv(limits.MAX_OUTPUT_BYTES_ENV, "0")
    with pytest.raises(ValueError) as exc:
        getattr(kernels, op)(**kw, device="cpu")
    assert need_of(str(exc.value)) == need_of(line)


@pytest.mark.parametrize("op,extra", [("tree_build", ()), ("tree_build", ("--kernel", "select")),
                                      ("verify_attn", ()), ("greedy_step", ())])
def test_cpu_scratch_bytes_are_the_binaries(lib, op, extra, tmp_path, monkeypatch):
    golden, kw = golden_call(op)
    line = _binary_refusal(op, golden, tmp_path, {limits.MAX_SCRATCH_BYTES_ENV: "0"}, *extra)
    assert ": CPU backend scratch would need " in line, line
    monkeypatch.setenv(limits.MAX_SCRATCH_BYTES_ENV, "0")
    if extra:
        kw["kernel"] = extra[1]
    with pytest.raises(ValueError, match=rf"^{op}: [a-z_]+: CPU backend scratch would need .*KDTR_MAX_SCRATCH_BYTES"
                       ) as exc:
        getattr(kernels, op)(**kw, device="cpu")
    assert need_of(str(exc.value)) == need_of(line)


def test_tree_build_scratch_of_an_empty_batch_is_checked(lib, monkeypatch):
    """B = 0 allocates no output, but the CPU build's scratch is sized by max_budget."""
    monkeypatch.setenv(limits.MAX_SCRATCH_BYTES_ENV, str(1 << 20))
    out = kernels.tree_build(**tree_build_args(0), max_budget=1000)
    assert out["visibility"].shape == (0, 1001, 1001)
    with pytest.raises(ValueError, match=r"^tree_build: max_budget: CPU backend scratch would need 4400052 bytes "
                                         r"\(4.2 MiB\) for N = 100000, D = 1, over the limit of 1048576 bytes"):
        kernels.tree_build(**tree_build_args(0), max_budget=100_000)


def test_bad_limit_variable_is_named(lib, monkeypatch):
    monkeypatch.setenv(limits.MAX_OUTPUT_BYTES_ENV, "lots")
    with pytest.raises(ValueError, match=rf"^environment {limits.MAX_OUTPUT_BYTES_ENV}='lots'"):
        kernels.tree_accept(**golden_call("tree_accept")[1])


def test_limit_check_comes_before_allocation(lib, monkeypatch):
    """Under the limit nothing is allocated: numpy's allocator is never reached."""
    args = {op: golden_call(op)[1] for op in CASES}
    calls = []
    real = np.empty
    monkeypatch.setattr(np, "empty", lambda *a, **k: calls.append(a) or real(*a, **k))
    monkeypatch.setenv(limits.MAX_OUTPUT_BYTES_ENV, "1")
    for op in CASES:
        with pytest.raises(ValueError, match="KDTR_MAX_OUTPUT_BYTES"):
            getattr(kernels, op)(**args[op], device="cpu")
    assert calls == []
