"""Resource limits and non-regular inputs of the C++ binaries and the Python reference ops.

Outputs or scratch implied by a golden's metadata or dims (``max_budget``
above all) must be refused at once, before anything is allocated: a binary exits 2 with
one stderr line naming the file and the field, the Python reference raises ValueError
naming the argument (limits: docs/binaries.md "Resource limits", kdtr/limits.py,
cuda_tests/include/kdtr_cli.hpp). Item 7: a FIFO, a directory, a device or a socket
given as a golden is refused at once (exit 2), never read from or blocked on; the C++
writer's temporary files are hidden and git-ignored.

Every binary runs under a 2 GiB address-space rlimit and a timeout of a few seconds, so
that code which allocates first (or blocks on a FIFO) fails fast instead of eating the
machine or hanging. The binaries are those of build/bin (``make``), or of the directory
in $KDTR_BIN_DIR (used to run these tests against another build, e.g. an old one).
These tests fail (they do not skip) when a binary is missing.
"""

from __future__ import annotations

import os
import re
import resource
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import kdtr
from kdtr import limits
from kdtr.ops import tree_accept as ta
from kdtr.ops import tree_build as tb
from kdtr.ops import verify_attn as va

REPO_ROOT = Path(__file__).resolve().parents[2]
BIN_DIR = Path(os.environ.get("KDTR_BIN_DIR", REPO_ROOT / "build" / "bin"))
OPS = ("tree_build", "verify_attn", "tree_accept", "greedy_step")
AS_LIMIT = 2 << 30  # address space of every binary run here
TIMEOUT = 120  # seconds: a hang guard only (the refusals take milliseconds)
LIMIT_ENVS = (limits.MAX_OUTPUT_BYTES_ENV, limits.MAX_SCRATCH_BYTES_ENV)


def _binary(name: str) -> Path:
    path = BIN_DIR / name
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail(f"{path} does not exist or is not executable: run `make` in {REPO_ROOT}", pytrace=False)
    return path


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))


def _run(args: list[str], env: dict[str, str] | None = None, timeout: float = TIMEOUT,
         limit_memory: bool = True) -> subprocess.CompletedProcess:
    """Run under the rlimit (unless ``limit_memory`` is False) with the limit variables
    cleared, then `env` added."""
    full_env = {k: v for k, v in os.environ.items() if k not in LIMIT_ENVS}
    full_env.update(env or {})
    return subprocess.run(args, capture_output=True, text=True, errors="replace", timeout=timeout,
                          preexec_fn=_limit_memory if limit_memory else None, env=full_env)


def _run_op(op: str, golden: Path, out: Path, backend: str = "cpu", env: dict[str, str] | None = None):
    # No address-space limit for the cuda backend: CUDA's initialisation reserves far more
    # than 2 GiB of address space, so under the limit a GPU machine would answer exit 3
    # and the refusal would go unchecked there.
    return _run([str(_binary(f"kdtr_{op}")), "--input", str(golden), "--output", str(out), "--backend", backend],
                env=env, limit_memory=backend != "cuda")


def _one_line(r: subprocess.CompletedProcess) -> str:
    lines = r.stderr.rstrip("\n").split("\n") if r.stderr else []
    assert len(lines) == 1, f"expected one stderr line, got {r.stderr!r}"
    return lines[0]


def _refused(r: subprocess.CompletedProcess, prog: str, *fragments: str) -> str:
    """Assert exit 2 with one line "<prog>: ..." holding every fragment; return the line."""
    assert r.returncode == 2, f"exit {r.returncode}, stderr {r.stderr!r}"
    line = _one_line(r)
    assert line.startswith(f"{prog}: "), line
    for f in fragments:
        assert f in line, f"{f!r} not in {line!r}"
    return line


def _cuda_refused_or_absent(r: subprocess.CompletedProcess, prog: str, *fragments: str) -> None:
    """--backend cuda: exit 3 where there is no GPU (this build or this machine), else refused as on cpu."""
    if r.returncode == 3:
        assert "backend cuda not supported" in _one_line(r), r.stderr
        return
    _refused(r, prog, *fragments)


def _output_bytes(path: Path) -> int:
    with kdtr.load(path) as f:
        return sum(int(a.nbytes) for a in f.tensors.values())


# ---------------------------------------------------------------------------------------
# Goldens whose metadata or dims imply absurd outputs or scratch
# ---------------------------------------------------------------------------------------


def _tree_build_inputs(b: int) -> dict[str, np.ndarray]:
    return {
        "input.top_log_probs": np.zeros((b, 1, 1), np.float32),
        "input.top_token_ids": np.zeros((b, 1, 1), np.int64),
        "input.root_token_ids": np.zeros(b, np.int64),
        "input.budget": np.ones(b, np.int32),
        "input.depth_limit": np.ones(b, np.int32),
    }


def _greedy_step_golden(path: Path, b: int, n: int, s: int) -> Path:
    """B requests, N = n, attention with H = 0 heads (q holds no bytes) and S = s rows."""
    t = n + 1
    tensors = _tree_build_inputs(b)
    tensors.update({
        "input.q": np.zeros((b, t, 0, 1), np.float32),
        "input.kv_cache": np.zeros((b, s, 1), np.float32),
        "input.prefix_len": np.zeros(b, np.int32),
        "input.sm_scale": np.array(1.0, np.float32),
        "input.d_v": np.array(1, np.int32),
        "input.target_predict": np.zeros((b, t), np.int64),
    })
    kdtr.save(path, tensors, {"op": "greedy_step", "config": "limits", "max_budget": n})
    return path


@pytest.fixture
def huge_budget(tmp_path) -> Path:
    """A 644-byte tree_build golden whose max_budget 2^31 - 2 (B = D = K = 1) asks for 4.6e18 output bytes."""
    path = tmp_path / "golden.kdtr"
    kdtr.save(path, _tree_build_inputs(1), {"op": "tree_build", "config": "budget_limit", "max_budget": 2**31 - 2})
    assert path.stat().st_size == 644
    return path


def test_huge_budget_refused_at_once(huge_budget, tmp_path):
    r = _run_op("tree_build", huge_budget, tmp_path / "out.kdtr")
    line = _refused(r, "kdtr_tree_build", f"{huge_budget}: metadata max_budget: outputs would need 4.61e18 bytes",
                    f"over the limit of {limits.MAX_OUTPUT_BYTES} bytes (4 GiB)", limits.MAX_OUTPUT_BYTES_ENV)
    assert "T = max_budget + 1 = 2147483647" in line
    assert not (tmp_path / "out.kdtr").exists()


def test_huge_budget_refused_by_cuda_backend(huge_budget, tmp_path):
    r = _run_op("tree_build", huge_budget, tmp_path / "out.kdtr", backend="cuda")
    _cuda_refused_or_absent(r, "kdtr_tree_build", "metadata max_budget: outputs would need")


def test_tree_build_scratch_of_empty_batch_refused(tmp_path):
    """B = 0: no output bytes, but the CPU backend's heap and slot arrays are sized by N."""
    path = tmp_path / "empty.kdtr"
    kdtr.save(path, _tree_build_inputs(0), {"op": "tree_build", "config": "x", "max_budget": 2**31 - 2})
    _refused(_run_op("tree_build", path, tmp_path / "out.kdtr"), "kdtr_tree_build",
             f"{path}: metadata max_budget: CPU backend scratch would need",
             f"over the limit of {limits.MAX_SCRATCH_BYTES} bytes (1 GiB)", limits.MAX_SCRATCH_BYTES_ENV)


def test_greedy_step_visibility_refused(tmp_path):
    """B = 1, N = 70000: a 1 MB golden (q has no heads) whose visibility would be 4.9e9 bytes."""
    path = _greedy_step_golden(tmp_path / "gs.kdtr", b=1, n=70000, s=70001)
    assert path.stat().st_size < 2_000_000
    _refused(_run_op("greedy_step", path, tmp_path / "out.kdtr"), "kdtr_greedy_step",
             f"{path}: metadata max_budget: outputs would need 4902660053 bytes (4.57 GiB)",
             "T = max_budget + 1 = 70001",
             limits.MAX_OUTPUT_BYTES_ENV)
    r = _run_op("greedy_step", path, tmp_path / "out.kdtr", backend="cuda")
    _cuda_refused_or_absent(r, "kdtr_greedy_step", "metadata max_budget: outputs would need")


def test_greedy_step_scratch_of_empty_batch_refused(tmp_path):
    path = _greedy_step_golden(tmp_path / "gs0.kdtr", b=0, n=2**30 - 1, s=1)
    _refused(_run_op("greedy_step", path, tmp_path / "out.kdtr"), "kdtr_greedy_step",
             f"{path}: metadata max_budget: CPU backend scratch would need", limits.MAX_SCRATCH_BYTES_ENV)


# ---------------------------------------------------------------------------------------
# The accounting equals the real outputs: a limit of exactly the output's bytes passes,
# one byte less is refused (every binary, a committed golden each)
# ---------------------------------------------------------------------------------------

GOLDENS = {"tree_build": "default", "verify_attn": "small", "tree_accept": "default", "greedy_step": "default"}
FIELDS = {"tree_build": "metadata max_budget", "verify_attn": "input.q", "tree_accept": "input.node_token_ids",
          "greedy_step": "metadata max_budget"}


@pytest.mark.parametrize("op", OPS)
def test_output_limit_is_exact(op, tmp_path):
    golden = REPO_ROOT / "golden" / op / f"{GOLDENS[op]}.kdtr"
    out = tmp_path / "out.kdtr"
    r = _run_op(op, golden, out)
    assert r.returncode == 0, r.stderr
    need = _output_bytes(out)
    out.unlink()
    env = limits.MAX_OUTPUT_BYTES_ENV
    r = _run_op(op, golden, out, env={env: str(need)})
    assert r.returncode == 0, f"{env}={need} (the output's own bytes) refused: {r.stderr!r}"
    out.unlink()
    r = _run_op(op, golden, out, env={env: str(need - 1)})
    _refused(r, f"kdtr_{op}", f"{golden}: {FIELDS[op]}: outputs would need {need} bytes",
             f"over the limit of {need - 1} bytes", env)
    assert not out.exists()
    r = _run_op(op, golden, out, backend="cuda", env={env: str(need - 1)})
    _cuda_refused_or_absent(r, f"kdtr_{op}", f"outputs would need {need} bytes")


@pytest.mark.parametrize("op, field", [("tree_build", "metadata max_budget"), ("verify_attn", "input.kv_cache"),
                                       ("greedy_step", "metadata max_budget")])
def test_scratch_limit_applies(op, field, tmp_path):
    golden = REPO_ROOT / "golden" / op / f"{GOLDENS[op]}.kdtr"
    env = limits.MAX_SCRATCH_BYTES_ENV
    r = _run_op(op, golden, tmp_path / "out.kdtr", env={env: "100"})
    _refused(r, f"kdtr_{op}", f"{golden}: {field}: CPU backend scratch would need", "over the limit of 100 bytes", env)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("value", ["abc", "-1", "1e9", "0x10", "99999999999999999999999"])
def test_bad_limit_variable_is_a_usage_error(op, value, tmp_path):
    golden = REPO_ROOT / "golden" / op / f"{GOLDENS[op]}.kdtr"
    r = _run_op(op, golden, tmp_path / "out.kdtr", env={limits.MAX_OUTPUT_BYTES_ENV: value})
    _refused(r, f"kdtr_{op}", f"environment {limits.MAX_OUTPUT_BYTES_ENV}='{value}': not a byte count")


# ---------------------------------------------------------------------------------------
# Non-regular files as the golden: refused at once, never blocked on
# ---------------------------------------------------------------------------------------


def _special(kind: str, tmp_path: Path):
    """(path, the file type the message names, a closer or None)."""
    if kind == "fifo":
        path = tmp_path / "fifo.kdtr"
        os.mkfifo(path)  # no writer: open(O_RDONLY) without O_NONBLOCK blocks forever
        return path, "a FIFO", None
    if kind == "directory":
        path = tmp_path / "dir.kdtr"
        path.mkdir()
        return path, "a directory", None
    if kind == "devnull":
        return Path("/dev/null"), "a character device", None
    path = tmp_path / "sock.kdtr"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen(1)
    return path, "a socket", sock.close


KINDS = ("fifo", "directory", "devnull", "socket")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("op", OPS)
def test_op_binary_refuses_non_regular_golden(op, kind, tmp_path):
    path, what, close = _special(kind, tmp_path)
    try:
        r = _run_op(op, path, tmp_path / "out.kdtr")
    finally:
        if close:
            close()
    _refused(r, f"kdtr_{op}", f"Io: {path}: file: not a regular file ({what})")


@pytest.mark.parametrize("kind", KINDS)
def test_kdtr_check_refuses_non_regular_file(kind, tmp_path):
    path, what, close = _special(kind, tmp_path)
    try:
        r = _run([str(_binary("kdtr_check")), str(path)])
        r2 = _run([str(_binary("kdtr_check")), "--copy", str(path), str(tmp_path / "copy.kdtr")])
    finally:
        if close:
            close()
    for res in (r, r2):
        assert res.returncode == 2, res.stderr
        assert _one_line(res) == f"Io: {path}: file: not a regular file ({what})"
    assert not (tmp_path / "copy.kdtr").exists()


def test_fifo_output_is_replaced_not_blocked_on(tmp_path):
    """--output naming a FIFO: the atomic write renames over it (no open of the FIFO)."""
    out = tmp_path / "out.kdtr"
    os.mkfifo(out)
    r = _run_op("tree_accept", REPO_ROOT / "golden" / "tree_accept" / "default.kdtr", out)
    assert r.returncode == 0, r.stderr
    assert out.is_file()


# ---------------------------------------------------------------------------------------
# The C++ writer's temporary file: hidden, next to OUT, git-ignored
# ---------------------------------------------------------------------------------------


def test_writer_temp_name_is_hidden_and_git_ignored(tmp_path):
    out = tmp_path / "missing_dir" / "out.kdtr"  # creating the temporary file fails and names it
    r = _run_op("tree_accept", REPO_ROOT / "golden" / "tree_accept" / "default.kdtr", out)
    line = _refused(r, "kdtr_tree_accept", "cannot create temporary file")
    m = re.search(r"cannot create temporary file (\S+): ", line)
    assert m, line
    tmp = Path(m[1])
    assert tmp.parent == out.parent
    assert re.fullmatch(r"\.out\.kdtr\.\d+\.\d+\.tmp", tmp.name), tmp.name
    # where `kdtr run` has binaries write: the run directory of the report set (reports/obtained
    # itself is a link into it, and git refuses paths through links)
    rel = f"reports/.conformance-0/obtained/tree_accept/{tmp.name}"
    ignored = subprocess.run(["git", "check-ignore", "--no-index", "-q", rel], cwd=REPO_ROOT)
    assert ignored.returncode == 0, f"{rel} is not git-ignored"
    ignored = subprocess.run(["git", "check-ignore", "--no-index", "-q", f"golden/tree_build/{tmp.name}"],
                             cwd=REPO_ROOT)
    assert ignored.returncode == 0, f"golden/tree_build/{tmp.name} is not git-ignored"


def test_writer_handles_the_longest_output_name(tmp_path):
    """A 255-byte OUT name (NAME_MAX) still gets a temporary name that fits (name part cut)."""
    out = tmp_path / ("é" * 100 + "x" * 50 + ".kdtr")  # 255 bytes of UTF-8
    assert len(out.name.encode()) == 255
    r = _run_op("tree_accept", REPO_ROOT / "golden" / "tree_accept" / "default.kdtr", out)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name]


# ---------------------------------------------------------------------------------------
# The Python reference path
# ---------------------------------------------------------------------------------------


def _tb_args(b: int = 1) -> dict[str, np.ndarray]:
    return {k.removeprefix("input."): v for k, v in _tree_build_inputs(b).items()}


def test_python_tree_build_refuses_issue_n_max_before_allocating():
    """In a child under the rlimit: code that allocates first dies of MemoryError there."""
    code = textwrap.dedent(f"""
        import resource, sys
        sys.path.insert(0, {str(REPO_ROOT)!r})
        import numpy as np
        from kdtr.ops.tree_build import tree_build
        resource.setrlimit(resource.RLIMIT_AS, ({AS_LIMIT}, {AS_LIMIT}))
        one = lambda dt: np.ones(1, dt)
        try:
            tree_build(np.zeros((1, 1, 1), np.float32), np.zeros((1, 1, 1), np.int64), one(np.int64),
                       one(np.int32), one(np.int32), n_max=2**31 - 2)
        except ValueError as exc:
            print("ValueError:", exc)
    """)
    env = {k: v for k, v in os.environ.items() if k not in LIMIT_ENVS}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("ValueError: n_max: outputs would need 4.61e18 bytes"), r.stdout
    assert f"over the limit of {limits.MAX_OUTPUT_BYTES} bytes" in r.stdout
    assert limits.MAX_OUTPUT_BYTES_ENV in r.stdout


@pytest.mark.parametrize("n_max", [-1, 2.0, True, "3"])
def test_python_tree_build_rejects_bad_n_max(n_max):
    with pytest.raises(ValueError, match=r"n_max must be an int >= 0"):
        tb.tree_build(**_tb_args(), n_max=n_max)


def test_python_tree_build_output_limit_is_exact(monkeypatch):
    monkeypatch.delenv(limits.MAX_OUTPUT_BYTES_ENV, raising=False)
    res = tb.tree_build(**_tb_args(3), n_max=20)
    need = sum(a.nbytes for a in res.as_dict().values())
    assert need == limits.tree_build_output_bytes(3, 21)
    monkeypatch.setenv(limits.MAX_OUTPUT_BYTES_ENV, str(need))
    tb.tree_build(**_tb_args(3), n_max=20)
    monkeypatch.setenv(limits.MAX_OUTPUT_BYTES_ENV, str(need - 1))
    with pytest.raises(ValueError, match=rf"^n_max: outputs would need {need} bytes .*KDTR_MAX_OUTPUT_BYTES"):
        tb.tree_build(**_tb_args(3), n_max=20)


def _va_args():
    rng = np.random.default_rng(0)
    b, t, h, dqk, s = 2, 3, 2, 8, 7
    return dict(q=rng.standard_normal((b, t, h, dqk)).astype(np.float32),
                kv_cache=rng.standard_normal((b, s, dqk)).astype(np.float32),
                prefix_len=np.array([4, 2], np.int32), tree_len=np.array([3, 2], np.int32),
                visibility=np.ones((b, t, t), np.uint8), sm_scale=0.5, d_v=5)


def test_python_verify_attn_output_limit_is_exact(monkeypatch):
    monkeypatch.delenv(limits.MAX_OUTPUT_BYTES_ENV, raising=False)
    res = va.verify_attn(**_va_args())
    need = res.out.nbytes + res.lse.nbytes
    monkeypatch.setenv(limits.MAX_OUTPUT_BYTES_ENV, str(need))
    va.verify_attn(**_va_args())
    monkeypatch.setenv(limits.MAX_OUTPUT_BYTES_ENV, str(need - 1))
    with pytest.raises(ValueError, match=rf"^q, d_v: outputs would need {need} bytes"):
        va.verify_attn(**_va_args())


def test_python_verify_attn_output_limit_on_a_view_that_holds_no_bytes(monkeypatch):
    """A broadcast q of 2^34 elements costs nothing; its out would cost 64 GiB."""
    monkeypatch.delenv(limits.MAX_OUTPUT_BYTES_ENV, raising=False)
    q = np.broadcast_to(np.float32(0), (1, 2**12, 2**12, 2**10))
    kv = np.zeros((1, 1, 2**10), np.float32)
    vis = np.broadcast_to(np.uint8(0), (1, 2**12, 2**12))
    with pytest.raises(ValueError, match=r"^q, d_v: outputs would need 68786585600 bytes \(64.1 GiB\)"):
        va.verify_attn(q, kv, np.zeros(1, np.int32), np.zeros(1, np.int32), vis, 1.0, 2**10)


def test_python_verify_attn_scratch_limit(monkeypatch):
    monkeypatch.setenv(limits.MAX_SCRATCH_BYTES_ENV, "100")
    with pytest.raises(ValueError, match=r"^request 0: prefix_len, tree_len: scratch would need .*"
                                         r"KDTR_MAX_SCRATCH_BYTES"):
        va.verify_attn(**_va_args())


def test_python_tree_accept_output_limit_is_exact(monkeypatch):
    b, t = 3, 5
    args = dict(node_token_ids=np.zeros((b, t), np.int64), next_token=np.full((b, t), -1, np.int32),
                next_sibling=np.full((b, t), -1, np.int32), node_count=np.zeros(b, np.int32),
                target_predict=np.zeros((b, t), np.int64))
    monkeypatch.delenv(limits.MAX_OUTPUT_BYTES_ENV, raising=False)
    need = sum(a.nbytes for a in ta.tree_accept(**args).as_dict().values())
    assert need == limits.tree_accept_output_bytes(b, t)
    monkeypatch.setenv(limits.MAX_OUTPUT_BYTES_ENV, str(need))
    ta.tree_accept(**args)
    monkeypatch.setenv(limits.MAX_OUTPUT_BYTES_ENV, str(need - 1))
    with pytest.raises(ValueError, match=rf"^node_token_ids: outputs would need {need} bytes"):
        ta.tree_accept(**args)


@pytest.mark.parametrize("value", ["abc", "-1", "1e9", " 5"])
def test_python_bad_limit_variable(monkeypatch, value):
    monkeypatch.setenv(limits.MAX_OUTPUT_BYTES_ENV, value)
    with pytest.raises(ValueError, match=rf"^environment {limits.MAX_OUTPUT_BYTES_ENV}="):
        tb.tree_build(**_tb_args())


def test_limits_agree_with_the_binaries():
    """kdtr/limits.py and kdtr_cli.hpp state the same defaults and variable names."""
    hpp = (REPO_ROOT / "cuda_tests" / "include" / "kdtr_cli.hpp").read_text()
    assert "constexpr uint64_t kMaxOutputBytes = uint64_t{4} << 30;" in hpp
    assert "constexpr uint64_t kMaxScratchBytes = uint64_t{1} << 30;" in hpp
    assert (limits.MAX_OUTPUT_BYTES, limits.MAX_SCRATCH_BYTES) == (4 << 30, 1 << 30)
    assert f'kMaxOutputBytesEnv = "{limits.MAX_OUTPUT_BYTES_ENV}"' in hpp
    assert f'kMaxScratchBytesEnv = "{limits.MAX_SCRATCH_BYTES_ENV}"' in hpp
