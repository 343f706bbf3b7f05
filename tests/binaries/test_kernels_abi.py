"""The C ABI (build/lib/libkdtr_kernels.so, `make lib`) through kdtr.kernels: every committed
golden of every op through the CPU entries (and, where torch has a CUDA device, through the
CUDA entries with torch tensors) must conform; bad arguments and a wrong library path give
clear errors."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO_ROOT
from kdtr import kernels
from kdtr.ops import OPS as SPECS
from kdtr.testing import assert_conforms, goldens

OPS = ("tree_build", "verify_attn", "tree_accept", "greedy_step")
ALL_GOLDENS = [g for op in OPS for g in goldens(op)]
CUDA_REASON = "needs torch with a CUDA device"


def _torch_cuda():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def call(g, device=None, **kw):
    """The binding of g's op on g's inputs (max_budget from the metadata where the op has it)."""
    fn = getattr(kernels, g.op)
    extra = {"max_budget": g.metadata["max_budget"]} if "max_budget" in g.metadata else {}
    return fn(**g.inputs, **extra, device=device, **kw)


@pytest.fixture(scope="module")
def lib():
    """The library, loaded; a missing one fails (never skips) with the loader's message."""
    try:
        return kernels.load()
    except kernels.KernelLibraryError as exc:
        pytest.fail(str(exc), pytrace=False)


# ---------------------------------------------------------------------------------------
# One op signature: each binary's and the library's view of every op's parameter struct
# is the layout derived from the spec (kdtr_abi.h's rule, kernels.abi_fields)
# ---------------------------------------------------------------------------------------

BIN_DIR = Path(os.environ.get("KDTR_BIN_DIR", REPO_ROOT / "build" / "bin"))


def spec_layout(op):
    """The layout of op's struct by the spec: what --describe and kdtr_describe must say."""
    struct = kernels.abi_struct(SPECS[op])
    fields = [{"name": n, "type": ty, "offset": getattr(struct, n).offset, "size": getattr(struct, n).size}
              for n, ty in kernels.abi_fields(SPECS[op])]
    return {"op": op, "struct": f"kdtr_{op}_params", "size": ctypes.sizeof(struct),
            "align": ctypes.alignment(struct), "fields": fields, "kernels": list(SPECS[op].kernels)}


def test_the_spec_rule_gives_the_documented_order():
    names = [n for n, _ in kernels.abi_fields(SPECS["verify_attn"])]
    assert names == ["q", "kv_cache", "prefix_len", "tree_len", "visibility", "out", "lse", "sm_scale",
                     "B", "T", "H", "S", "Dqk", "d_v", "dtype", "kernel", "kernel_ran"]
    assert dict(kernels.abi_fields(SPECS["tree_build"]))["top_log_probs"] == "const float*"
    assert dict(kernels.abi_fields(SPECS["greedy_step"]))["tree_build_status"] == "int32_t*"
    assert "kernel" not in dict(kernels.abi_fields(SPECS["tree_accept"]))


@pytest.mark.parametrize("op", OPS)
def test_each_binary_describes_the_spec_layout(op):
    binary = BIN_DIR / f"kdtr_{op}"
    if not binary.is_file():
        pytest.fail(f"{binary} is missing: run `make` first", pytrace=False)
    r = subprocess.run([str(binary), "--describe"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert json.loads(r.stdout) == spec_layout(op)


@pytest.mark.parametrize("op", OPS)
def test_the_library_describes_the_spec_layout(lib, op):
    assert kernels.describe(op) == spec_layout(op)
    assert lib.kdtr_describe(b"nope") == b""


# ---------------------------------------------------------------------------------------
# The goldens through the CPU entries
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("golden", ALL_GOLDENS, ids=str)
def test_cpu_entries_conform(lib, golden):
    out = call(golden, device="cpu")
    assert all(isinstance(v, np.ndarray) for v in out.values())
    assert set(out) == set(golden.expected), "outputs are named as the golden's expected.* tensors"
    assert_conforms(golden, out)


@pytest.mark.parametrize("golden", goldens("tree_build"), ids=str)
def test_cpu_tree_build_select_conforms(lib, golden):
    out = call(golden, device="cpu", kernel="select")
    assert out.kernel == "cpu_select"
    assert_conforms(golden, out)


def test_default_device_is_cpu_for_numpy(lib):
    g = goldens("tree_accept", config="default")[0]
    out = kernels.tree_accept(**g.inputs)
    assert isinstance(out["status"], np.ndarray)
    assert_conforms(g, out)


def test_kernel_names(lib):
    assert call(goldens("tree_build", config="default")[0]).kernel == "cpu_heap"
    assert call(goldens("verify_attn", config="small")[0]).kernel == "cpu_f64"
    assert call(goldens("greedy_step", config="default")[0]).kernel == "cpu_f64"


def test_a_wrong_output_fails_the_golden(lib):
    """The comparison sees what the binding returns: one changed element is a mismatch."""
    g = goldens("tree_accept", config="chain")[0]
    out = call(g)
    out["accepted_count"] = out["accepted_count"] + 1
    with pytest.raises(AssertionError, match="accepted_count"):
        assert_conforms(g, out)


# ---------------------------------------------------------------------------------------
# Bad arguments: ValueError naming the argument, before any call
# ---------------------------------------------------------------------------------------

def _accept_inputs():
    g = goldens("tree_accept", config="default")[0]
    return {k: np.array(v) for k, v in g.inputs.items()}


def test_wrong_dtype_names_the_argument(lib):
    a = _accept_inputs()
    a["node_count"] = a["node_count"].astype(np.int64)
    with pytest.raises(ValueError, match=r"tree_accept: node_count: dtype int64, expected i32"):
        kernels.tree_accept(**a)


def test_wrong_shape_names_the_argument(lib):
    a = _accept_inputs()
    a["next_sibling"] = np.zeros((a["next_sibling"].shape[0], a["next_sibling"].shape[1] + 1), np.int32)
    with pytest.raises(ValueError, match=r"tree_accept: next_sibling: shape .* expected \[B,T\]"):
        kernels.tree_accept(**a)
    a = _accept_inputs()
    a["node_count"] = a["node_count"][:, None]
    with pytest.raises(ValueError, match=r"tree_accept: node_count: shape .* has 2 dims, expected 1"):
        kernels.tree_accept(**a)


def test_non_contiguous_names_the_argument(lib):
    a = _accept_inputs()
    tp = a["target_predict"]
    a["target_predict"] = np.repeat(tp, 2, axis=1)[:, ::2]  # same values, strided
    assert not a["target_predict"].flags.c_contiguous
    with pytest.raises(ValueError, match=r"tree_accept: target_predict: not C-contiguous"):
        kernels.tree_accept(**a)
    a["target_predict"] = np.asfortranarray(tp)
    if not a["target_predict"].flags.c_contiguous:
        with pytest.raises(ValueError, match=r"target_predict: not C-contiguous"):
            kernels.tree_accept(**a)


def test_not_an_array_names_the_argument(lib):
    a = _accept_inputs()
    a["next_token"] = a["next_token"].tolist()
    with pytest.raises(ValueError, match=r"tree_accept: next_token: device='cpu' takes numpy arrays"):
        kernels.tree_accept(**a)
    with pytest.raises(ValueError, match=r"device must be"):
        kernels.tree_accept(**_accept_inputs(), device="gpu")


def test_cuda_device_takes_torch_cuda_tensors(lib):
    """device='cuda' with numpy arrays names the first argument (torch is not needed for that)."""
    with pytest.raises(ValueError, match=r"tree_accept: node_token_ids: device='cuda' takes torch CUDA tensors"):
        kernels.tree_accept(**_accept_inputs(), device="cuda")


def test_verify_attn_values_name_the_argument(lib):
    g = goldens("verify_attn", config="small")[0]
    a = {k: np.array(v) for k, v in g.inputs.items()}
    bad = dict(a, kv_cache=a["kv_cache"].astype(np.float64))
    with pytest.raises(ValueError, match=r"verify_attn: kv_cache: dtype float64, expected f32"):
        kernels.verify_attn(**bad)
    with pytest.raises(ValueError, match=r"verify_attn: d_v: 0 is outside \[1, Dqk"):
        kernels.verify_attn(**dict(a, d_v=np.int32(0)))
    with pytest.raises(ValueError, match=r"verify_attn: d_v: expected an integer scalar"):
        kernels.verify_attn(**dict(a, d_v=np.float32(8)))
    pl = a["prefix_len"].copy()
    pl[0] = a["kv_cache"].shape[1]  # prefix alone fills the cache: no room for the tree
    with pytest.raises(ValueError, match=r"verify_attn: prefix_len: request 0: .* exceeds the cache rows"):
        kernels.verify_attn(**dict(a, prefix_len=pl))
    tl = a["tree_len"].copy()
    tl[0] = -1
    with pytest.raises(ValueError, match=r"verify_attn: tree_len: request 0: tree_len -1 is outside"):
        kernels.verify_attn(**dict(a, tree_len=tl))
    for k in ("simt", "mma", "wgmma"):
        with pytest.raises(ValueError, match=rf"kernel '{k}' applies to device='cuda' only"):
            kernels.verify_attn(**a, kernel=k)
    with pytest.raises(ValueError, match=r"verify_attn: kernel must be one of auto, simt, mma, wgmma, not 'tma'"):
        kernels.verify_attn(**a, kernel="tma")


def test_tree_build_and_greedy_step_arguments(lib):
    g = goldens("tree_build", config="default")[0]
    with pytest.raises(ValueError, match=r"tree_build: max_budget -1 is outside"):
        kernels.tree_build(**g.inputs, max_budget=-1)
    with pytest.raises(ValueError, match=r"tree_build: kernel must be"):
        kernels.tree_build(**g.inputs, max_budget=8, kernel="fast")
    s = goldens("greedy_step", config="default")[0]
    n = s.metadata["max_budget"]
    with pytest.raises(ValueError, match=r"greedy_step: q: shape .* T is"):
        kernels.greedy_step(**s.inputs, max_budget=n + 1)
    assert_conforms(s, kernels.greedy_step(**s.inputs))  # max_budget from q's T
    for k in ("simt", "mma", "wgmma"):  # the verify_attn stage's kernel: CUDA only
        with pytest.raises(ValueError, match=rf"greedy_step: kernel '{k}' applies to device='cuda' only"):
            kernels.greedy_step(**s.inputs, kernel=k)
    with pytest.raises(ValueError, match=r"greedy_step: kernel must be one of auto, simt, mma, wgmma, not 'heap'"):
        kernels.greedy_step(**s.inputs, kernel="heap")


def test_the_library_checks_too(lib):
    """The C entries refuse what they can see, whoever calls them: a negative dim, a NULL
    pointer, and (CPU) a length verify_attn trusts."""
    p = kernels._TreeAcceptParams(B=-1, T=4)
    assert lib.kdtr_tree_accept_cpu(ctypes.byref(p)) == kernels.ERR_INVALID_ARGUMENT
    assert b"B -1 is negative" in lib.kdtr_last_error()
    p = kernels._TreeAcceptParams(B=2, T=4)
    assert lib.kdtr_tree_accept_cpu(ctypes.byref(p)) == kernels.ERR_INVALID_ARGUMENT
    assert lib.kdtr_last_error() == b"tree_accept: node_token_ids is NULL"
    q = np.zeros((1, 2, 1, 4), np.float32)
    kv = np.zeros((1, 3, 4), np.float32)
    pl, tl = np.array([2], np.int32), np.array([2], np.int32)
    vis = np.ones((1, 2, 2), np.uint8)
    out, lse = np.zeros((1, 2, 1, 4), np.float32), np.zeros((1, 2, 1), np.float32)
    v = kernels._VerifyAttnParams(q=q.ctypes.data, kv_cache=kv.ctypes.data, prefix_len=pl.ctypes.data,
                                  tree_len=tl.ctypes.data, visibility=vis.ctypes.data, out=out.ctypes.data,
                                  lse=lse.ctypes.data, B=1, T=2, H=1, S=3, Dqk=4, d_v=4, sm_scale=1.0)
    assert lib.kdtr_verify_attn_cpu(ctypes.byref(v)) == kernels.ERR_INVALID_ARGUMENT
    assert b"exceeds the cache rows S = 3" in lib.kdtr_last_error()
    tl[0] = 1
    assert lib.kdtr_verify_attn_cpu(ctypes.byref(v)) == kernels.OK
    assert lib.kdtr_last_error() == b""
    v.kernel = 3  # KDTR_VERIFY_ATTN_WGMMA: a known kernel, but the CPU entry takes AUTO only
    assert lib.kdtr_verify_attn_cpu(ctypes.byref(v)) == kernels.ERR_INVALID_ARGUMENT
    assert b"kernel SIMT / MMA / WGMMA applies to the CUDA entry only" in lib.kdtr_last_error()
    v.kernel = 4
    assert lib.kdtr_verify_attn_cpu(ctypes.byref(v)) == kernels.ERR_INVALID_ARGUMENT
    assert b"kernel 4 is not AUTO (0), SIMT (1), MMA (2) or WGMMA (3)" in lib.kdtr_last_error()


def test_abi_version_and_struct_sizes(lib):
    assert lib.kdtr_abi_version() == kernels.ABI_VERSION
    for op, struct in kernels._STRUCTS.items():
        assert lib.kdtr_params_size(op.encode()) == ctypes.sizeof(struct), op
    assert lib.kdtr_params_size(b"nope") == 0


@pytest.fixture(scope="module")
def cpu_only_lib(tmp_path_factory):
    """The library built here without CUDA (`make NO_CUDA=1 lib` into a scratch BUILD
    directory, a few seconds of g++), whatever the repository's own build is."""
    build = tmp_path_factory.mktemp("nocuda")
    r = subprocess.run(["make", "-s", "NO_CUDA=1", f"BUILD={build}", "lib"], cwd=REPO_ROOT,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return build / "lib" / "libkdtr_kernels.so"


def test_cuda_entries_of_a_cpu_only_build(cpu_only_lib):
    """Without CUDA in the library, every CUDA entry returns "not built with CUDA"."""
    assert not kernels.has_cuda(cpu_only_lib)
    lib = kernels.load(cpu_only_lib)
    for op, struct in kernels._STRUCTS.items():
        p = struct()
        assert getattr(lib, f"kdtr_{op}_cuda")(ctypes.byref(p), None) == kernels.ERR_NO_CUDA, op
        assert b"not built with CUDA" in lib.kdtr_last_error(), op


# ---------------------------------------------------------------------------------------
# The library path
# ---------------------------------------------------------------------------------------

def test_missing_library_is_a_clear_error(tmp_path):
    missing = tmp_path / "nowhere" / "libkdtr_kernels.so"
    with pytest.raises(kernels.KernelLibraryError, match=r"not found: .*nowhere/libkdtr_kernels.so.*make lib"):
        kernels.tree_accept(**_accept_inputs(), lib=missing)


def test_env_variable_names_the_library(tmp_path, monkeypatch):
    missing = tmp_path / "env.so"
    monkeypatch.setenv("KDTR_KERNELS_LIB", str(missing))
    assert kernels.default_lib_path() == missing
    with pytest.raises(kernels.KernelLibraryError, match=r"env.so \(from \$KDTR_KERNELS_LIB\)"):
        kernels.load()
    monkeypatch.delenv("KDTR_KERNELS_LIB")
    assert kernels.default_lib_path() == Path(kernels.__file__).resolve().parents[1] / "build/lib/libkdtr_kernels.so"


def test_not_a_library_is_a_clear_error(tmp_path):
    junk = tmp_path / "libkdtr_kernels.so"
    junk.write_bytes(b"not an ELF file")
    with pytest.raises(kernels.KernelLibraryError, match=r"cannot load the kdtr kernels library"):
        kernels.load(junk)


# ---------------------------------------------------------------------------------------
# CUDA: every golden through the CUDA entries with torch tensors
# ---------------------------------------------------------------------------------------

def _to_cuda(torch, a):
    a = np.asarray(a)
    if a.ndim == 0 and a.dtype.kind in "fiu":
        return a  # scalars (sm_scale, d_v) stay host values (np.ascontiguousarray would make them 1-d)
    a = np.ascontiguousarray(a)
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16).cuda()
    return torch.from_numpy(a.copy()).cuda()


def _cuda_inputs(torch, g):
    return {k: _to_cuda(torch, v) for k, v in g.inputs.items()}


@pytest.mark.parametrize("golden", ALL_GOLDENS, ids=str)
def test_cuda_entries_conform(lib, golden):
    torch = _torch_cuda()
    if torch is None:
        pytest.skip(CUDA_REASON)
    if not kernels.has_cuda():
        pytest.fail("torch has a CUDA device but libkdtr_kernels.so is the CPU-only build: run `make lib` with nvcc")
    fn = golden.op
    extra = {"max_budget": golden.metadata["max_budget"]} if "max_budget" in golden.metadata else {}
    out = getattr(kernels, fn)(**_cuda_inputs(torch, golden), **extra)  # device inferred: cuda
    assert all(v.is_cuda for v in out.values())
    torch.cuda.synchronize()
    assert_conforms(golden, out)


@pytest.mark.parametrize("kernel", ["heap", "select"])
@pytest.mark.parametrize("golden", goldens("tree_build"), ids=str)
def test_cuda_tree_build_kernels_conform(lib, golden, kernel):
    torch = _torch_cuda()
    if torch is None:
        pytest.skip(CUDA_REASON)
    out = kernels.tree_build(**_cuda_inputs(torch, golden), max_budget=golden.metadata["max_budget"], kernel=kernel)
    assert out.kernel == kernel
    assert_conforms(golden, out)


def _wgmma_fits(g) -> bool:
    """The dims and dtype the Hopper kernel takes (verify_attn_launch.h)."""
    q, d_v = g.inputs["q"], int(np.asarray(g.inputs["d_v"]))
    dqk = q.shape[-1]
    return q.dtype.name == "bfloat16" and dqk % 8 == 0 and dqk <= 576 and d_v <= 512


@pytest.mark.parametrize("golden", goldens("verify_attn"), ids=str)
def test_cuda_verify_attn_wgmma(lib, golden):
    """kernel="wgmma": on a compute capability 9.0 device with a library built with the
    Hopper kernel, every golden it takes runs it (kernel_ran wgmma_*) and conforms; anything
    else is KernelError ERR_NOT_SUPPORTED saying what wgmma needs."""
    torch = _torch_cuda()
    if torch is None:
        pytest.skip(CUDA_REASON)
    try:
        out = kernels.verify_attn(**_cuda_inputs(torch, golden), kernel="wgmma")
    except kernels.KernelError as exc:
        assert exc.code == kernels.ERR_NOT_SUPPORTED, exc
        assert "wgmma needs bf16" in str(exc), exc
        hopper = torch.cuda.get_device_capability() == (9, 0)
        assert not (hopper and "this one was built with it" in str(exc) and _wgmma_fits(golden)), \
            f"the Hopper kernel refused a golden it takes on a compute capability 9.0 device: {exc}"
        return
    assert out.kernel.startswith("wgmma"), out.kernel
    torch.cuda.synchronize()
    assert_conforms(golden, out)


@pytest.mark.parametrize("golden", goldens("greedy_step"), ids=str)
def test_cuda_greedy_step_forced_simt(lib, golden):
    """kernel="simt" forces the verify_attn stage of greedy_step (as kdtr_greedy_step
    --kernel simt): the stage runs a simt instance, and the outputs conform."""
    torch = _torch_cuda()
    if torch is None:
        pytest.skip(CUDA_REASON)
    out = kernels.greedy_step(**_cuda_inputs(torch, golden), kernel="simt")
    assert out.kernel.startswith("simt"), out.kernel
    torch.cuda.synchronize()
    assert_conforms(golden, out)


def test_cuda_on_a_side_stream(lib):
    """The kernel is enqueued on torch's current stream (here a side stream)."""
    torch = _torch_cuda()
    if torch is None:
        pytest.skip(CUDA_REASON)
    g = goldens("greedy_step", config="large_batch")[0]
    inputs = _cuda_inputs(torch, g)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        out = kernels.greedy_step(**inputs)
        host = {k: v.to("cpu", non_blocking=False) for k, v in out.items()}
    s.synchronize()
    assert_conforms(g, host)


def test_cuda_bad_inputs(lib):
    torch = _torch_cuda()
    if torch is None:
        pytest.skip(CUDA_REASON)
    g = goldens("tree_accept", config="default")[0]
    t = _cuda_inputs(torch, g)
    with pytest.raises(ValueError, match=r"tree_accept: node_count: dtype int64, expected i32"):
        kernels.tree_accept(**dict(t, node_count=t["node_count"].long()))
    with pytest.raises(ValueError, match=r"tree_accept: target_predict: not C-contiguous"):
        kernels.tree_accept(**dict(t, target_predict=t["target_predict"].repeat(1, 2)[:, ::2]))
    with pytest.raises(ValueError, match=r"tree_accept: next_token: device='cuda' takes torch CUDA tensors"):
        kernels.tree_accept(**dict(t, next_token=t["next_token"].cpu()))
    v = goldens("verify_attn", config="small")[0]
    tv = _cuda_inputs(torch, v)
    pl = tv["prefix_len"].clone()
    pl[0] = -3
    # CUDA: the lengths are checked on the device (no host copy): the call returns, the bad
    # request's rows are NaN, and kernels.check() names it (docs/binaries.md "Device-side checks")
    kernels.check()
    res = kernels.verify_attn(**dict(tv, prefix_len=pl))
    assert bool(torch.isnan(res["out"][0]).all()) and bool(torch.isnan(res["lse"][0]).all())
    with pytest.raises(kernels.KernelError, match=r"verify_attn: request 0: prefix_len -3 is negative") as exc:
        kernels.check()
    assert exc.value.request == 0 and exc.value.field == "prefix_len"
    kernels.check()  # cleared
