"""The device-side length checks of libkdtr_kernels.so's CUDA entries and its device error
record (kdtr_device_errors), called through ctypes directly (docs/binaries.md, "Device-side
checks").

verify_attn's and greedy_step's CUDA entries cannot read the [B] lengths without a copy, so
the kernels check them: a request with prefix_len < 0, tree_len outside [0, T] or
prefix_len + tree_len > S (greedy_step: prefix_len + T > S) gets NaN in every element of its
out and lse, nothing of it is read, the entry returns OK, and kdtr_device_errors(device,
clear, message, size) says how many failed and the first one's message -- the CPU entry's
message for the same lengths.  The good requests of such a batch are bit for bit those of
the batch without the bad request.  Each entry is legal during a global-mode stream
capture (also as the process's first call of the library) and checks the lengths again on
every replay.

GPU tests (torch with a CUDA device, marked gpu) and CPU tests (the CPU-only build's entry,
the CUDA build's entry without a device).  Run as a script (`python3
tests/binaries/test_device_errors.py time`) it prints the host cost of one CUDA entry call.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # conftest, when run as a script or a subprocess

from conftest import REPO_ROOT  # noqa: E402
from kdtr import kernels  # noqa: E402
from kdtr.ops import OPS as SPECS  # noqa: E402

LIB_PATH = Path(os.environ.get("KDTR_KERNELS_LIB", REPO_ROOT / "build" / "lib" / "libkdtr_kernels.so"))
OK, INVALID = 0, 1
NOT_SUPPORTED = 2
ERR_CUDA = 4
KERNELS = {"auto": 0, "simt": 1, "mma": 2, "wgmma": 3}
I32_MIN, I32_MAX = -(2**31), 2**31 - 1
STRUCTS = {op: kernels.abi_struct(SPECS[op]) for op in ("verify_attn", "greedy_step")}
CUDA_REASON = "needs torch with a CUDA device and the CUDA build of libkdtr_kernels.so"


def open_lib(path: Path = LIB_PATH) -> ctypes.CDLL:
    """The library through ctypes alone (no kdtr.kernels loader): every entry used here typed."""
    if not path.is_file():
        pytest.fail(f"{path} is missing: build it with `make lib`", pytrace=False)
    lib = ctypes.CDLL(str(path))
    lib.kdtr_device_errors.restype = ctypes.c_int
    lib.kdtr_device_errors.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int64]
    lib.kdtr_last_error.restype = ctypes.c_char_p
    lib.kdtr_has_cuda.restype = ctypes.c_int
    lib.kdtr_abi_version.restype = ctypes.c_int
    for op in ("verify_attn", "greedy_step"):
        struct = STRUCTS[op]
        getattr(lib, f"kdtr_{op}_cpu").argtypes = [ctypes.POINTER(struct)]
        getattr(lib, f"kdtr_{op}_cuda").argtypes = [ctypes.POINTER(struct), ctypes.c_void_p]
    return lib


def device_errors(lib, device: int = 0, clear: bool = False, size: int = 512) -> tuple[int, str]:
    buf = ctypes.create_string_buffer(b"x" * (size - 1), size) if size > 0 else None
    n = lib.kdtr_device_errors(device, int(clear), buf, size)
    return n, (buf.value.decode() if buf is not None else "")


# ---------------------------------------------------------------------------------------
# Memory: numpy arrays (the CPU entries) or torch CUDA byte buffers (the CUDA entries)
# ---------------------------------------------------------------------------------------

class Buf:
    """One tensor: its numpy dtype and shape, and its bytes on the host or the device."""

    def __init__(self, a: np.ndarray, cuda: bool) -> None:
        a = np.ascontiguousarray(a)
        self.dtype, self.shape, self.cuda = a.dtype, a.shape, cuda
        if cuda:
            import torch

            self.t = torch.from_numpy(a.reshape(-1).view(np.uint8).copy()).to("cuda")
            self.ptr = self.t.data_ptr() if a.size else None
        else:
            self.a = a.copy()
            self.ptr = self.a.ctypes.data if a.size else None

    def get(self) -> np.ndarray:
        if self.cuda:
            return self.t.cpu().numpy().view(self.dtype).reshape(self.shape)
        return self.a.copy()

    def set(self, a: np.ndarray) -> None:
        a = np.ascontiguousarray(a, dtype=self.dtype).reshape(self.shape)
        if self.cuda:
            import torch

            self.t.copy_(torch.from_numpy(a.reshape(-1).view(np.uint8).copy()))
        else:
            self.a[...] = a


def bf16(a: np.ndarray) -> np.ndarray:
    import ml_dtypes

    return a.astype(ml_dtypes.bfloat16)


# ---------------------------------------------------------------------------------------
# One call of an entry: arrays by name, the struct filled by the spec's rule (abi_fields)
# ---------------------------------------------------------------------------------------

def fill_struct(op: str, bufs: dict[str, Buf], values: dict[str, object]):
    spec = SPECS[op]
    p = STRUCTS[op]()
    for name, ctype in kernels.abi_fields(spec):
        if ctype.endswith("*") and ctype != "const char*":
            setattr(p, name, bufs[name].ptr)
        elif name in values:
            setattr(p, name, values[name])
    return p


def stream_of(cuda: bool):
    if not cuda:
        return None
    import torch

    return torch.cuda.current_stream().cuda_stream


def call(lib, op: str, p, cuda: bool) -> tuple[int, str]:
    if cuda:
        rc = getattr(lib, f"kdtr_{op}_cuda")(ctypes.byref(p), stream_of(True))
    else:
        rc = getattr(lib, f"kdtr_{op}_cpu")(ctypes.byref(p))
    return rc, lib.kdtr_last_error().decode()


# ---------------------------------------------------------------------------------------
# verify_attn problems
# ---------------------------------------------------------------------------------------

# (name, kernel, dtype, T, H, S, Dqk, d_v): every kernel and instance family, several tiles
# of 64 rows per request (T*H > 64) and, for simt, d_v split over gridDim.y (d_v > 512).
ATTN_CONFIGS = [
    ("simt_f32", "simt", "f32", 9, 8, 40, 72, 64),
    ("simt_f32_wide_dv", "simt", "f32", 5, 2, 30, 576, 576),
    ("simt_bf16", "simt", "bf16", 9, 8, 40, 72, 64),
    ("mma_bf16_d128", "mma", "bf16", 9, 8, 40, 72, 64),
    ("mma_bf16_k2", "mma", "bf16", 5, 16, 80, 576, 512),
    ("wgmma_bf16_k2", "wgmma", "bf16", 5, 16, 80, 576, 512),
    ("auto_f32", "auto", "f32", 9, 8, 40, 72, 64),
]
ATTN_IDS = [c[0] for c in ATTN_CONFIGS]

B_ATTN = 4
BAD = 1  # the request whose lengths are broken


def good_lengths(T: int, S: int) -> tuple[np.ndarray, np.ndarray]:
    """Four valid requests: a full tree after the longest prefix, a shorter one, an empty
    tree after a prefix, a full tree without prefix."""
    return (np.array([S - T, 3, 5, 0], np.int32), np.array([T, T - 1, 0, T], np.int32))


def attn_inputs(dtype: str, T: int, H: int, S: int, Dqk: int, seed: int = 7) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    q = (rng.standard_normal((B_ATTN, T, H, Dqk)) * 0.5).astype(np.float32)
    kv = rng.standard_normal((B_ATTN, S, Dqk)).astype(np.float32)
    vis = np.zeros((B_ATTN, T, T), np.uint8)
    for b in range(B_ATTN):
        for i in range(T):
            vis[b, i, : i + 1] = rng.random(i + 1) < 0.6
            vis[b, i, i] = 1
    pl, tl = good_lengths(T, S)
    if dtype == "bf16":
        q, kv = bf16(q), bf16(kv)
    return {"q": q, "kv_cache": kv, "prefix_len": pl, "tree_len": tl, "visibility": vis}


def run_attn(lib, arrays: dict[str, np.ndarray], kernel: str, d_v: int, cuda: bool, fill: float = 7.0):
    """One verify_attn call on `arrays` (the [B]-leading inputs); (rc, message, out, lse)."""
    q = arrays["q"]
    B, T, H, Dqk = q.shape
    S = arrays["kv_cache"].shape[1]
    bufs = {k: Buf(v, cuda) for k, v in arrays.items()}
    bufs["out"] = Buf(np.full((B, T, H, d_v), fill, np.float32), cuda)
    bufs["lse"] = Buf(np.full((B, T, H), fill, np.float32), cuda)
    values = {"sm_scale": float(1.0 / np.sqrt(Dqk)), "B": B, "T": T, "H": H, "S": S, "Dqk": Dqk, "d_v": d_v,
              "dtype": 1 if str(q.dtype) == "bfloat16" else 0, "kernel": KERNELS[kernel] if cuda else 0}
    p = fill_struct("verify_attn", bufs, values)
    rc, msg = call(lib, "verify_attn", p, cuda)
    return rc, msg, bufs["out"].get(), bufs["lse"].get()


def drop(arrays: dict[str, np.ndarray], b: int) -> dict[str, np.ndarray]:
    """The batch without request b."""
    keep = [i for i in range(next(iter(arrays.values())).shape[0]) if i != b]
    return {k: v[keep] for k, v in arrays.items()}


def with_lengths(arrays, b: int, pl: int, tl: int | None = None) -> dict[str, np.ndarray]:
    a = dict(arrays)
    a["prefix_len"] = arrays["prefix_len"].copy()
    a["prefix_len"][b] = pl
    if tl is not None:
        a["tree_len"] = arrays["tree_len"].copy()
        a["tree_len"][b] = tl
    return a


def bad_attn_lengths(T: int, S: int) -> list[tuple[str, int, int, str]]:
    """(kind, prefix_len, tree_len, the check that fails first) of every kind of bad request
    for T slots and S cache rows: "negative" (prefix_len < 0), "tree" (tree_len outside [0,
    T]), "rows" (prefix_len + tree_len > S)."""
    return [
        ("prefix_neg1", -1, T, "negative"),
        ("prefix_int32_min", I32_MIN, 1, "negative"),
        ("prefix_int32_max", I32_MAX, 1, "rows"),
        ("prefix_S_plus_1", S + 1, 0, "rows"),
        ("tree_neg1", 0, -1, "tree"),
        ("tree_int32_min", 3, I32_MIN, "tree"),
        ("tree_T_plus_1", 0, T + 1, "tree"),
        ("tree_int32_max", 0, I32_MAX, "tree"),
        ("sum_S_plus_1", S - T + 1, T, "rows"),
        ("both_int32_max", I32_MAX, I32_MAX, "tree"),
        ("both_int32_min", I32_MIN, I32_MIN, "negative"),
    ]


BAD_KINDS = [k[0] for k in bad_attn_lengths(9, 40)]


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def all_nan(a: np.ndarray) -> bool:
    return bool(np.isnan(a).all())


# ---------------------------------------------------------------------------------------
# Fixtures
# ---------------------------------------------------------------------------------------

def _torch_cuda():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


@pytest.fixture(scope="module")
def lib():
    return open_lib()


@pytest.fixture(scope="module")
def cuda_lib(lib):
    if _torch_cuda() is None:
        pytest.skip(CUDA_REASON)
    if not lib.kdtr_has_cuda():
        pytest.fail("torch has a CUDA device but libkdtr_kernels.so is the CPU-only build: run `make lib` with nvcc")
    n, msg = device_errors(lib, 0, clear=True)
    assert n >= 0, msg
    return lib


def expect_clean(lib) -> None:
    n, msg = device_errors(lib, 0, clear=True)
    assert n == 0, f"the record held {n} failure(s) before the case: {msg}"


# ---------------------------------------------------------------------------------------
# CPU: the host checks stay, and their messages are the device record's
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", BAD_KINDS)
def test_cpu_entry_refuses_bad_lengths_naming_the_request(lib, kind):
    T, S = 9, 40
    _, pl, tl, fails = next(k for k in bad_attn_lengths(T, S) if k[0] == kind)
    arrays = with_lengths(attn_inputs("f32", T, 8, S, 72), BAD, pl, tl)
    rc, msg, _, _ = run_attn(lib, arrays, "auto", 64, cuda=False)
    assert rc == INVALID, msg
    want = {"negative": f"prefix_len {pl} is negative", "tree": f"tree_len {tl} is outside [0, T = {T}]",
            "rows": f"prefix_len {pl} + tree_len {tl} exceeds the cache rows S = {S}"}[fails]
    assert msg == f"verify_attn: request {BAD}: {want}", msg


def test_cpu_entry_runs_the_good_requests(lib):
    rc, msg, out, lse = run_attn(lib, attn_inputs("f32", 9, 8, 40, 72), "auto", 64, cuda=False)
    assert rc == OK, msg
    assert np.isfinite(lse[0]).all() and np.isneginf(lse[2]).all()
    assert not np.isnan(out).any()


def test_the_entry_is_exported_and_the_abi_version_is_unchanged(lib):
    """kdtr_device_errors is an added entry: the ABI version (structs and existing entries)
    stays kdtr.kernels' ABI_VERSION."""
    assert lib.kdtr_abi_version() == 2
    assert hasattr(lib, "kdtr_device_errors")


def test_cuda_build_without_a_device_reports_the_cuda_error(lib):
    if not lib.kdtr_has_cuda():
        pytest.skip("the CPU-only build: test_cpu_only_build_has_no_record covers it")
    if _torch_cuda() is not None:
        pytest.skip("a CUDA device is present: the GPU tests cover the entry")
    n, msg = device_errors(lib, 0, clear=False)
    assert n == -ERR_CUDA, (n, msg)
    assert msg.startswith("kdtr_device_errors: device 0: cudaError"), msg
    assert lib.kdtr_last_error().decode() == msg
    n, short = device_errors(lib, 0, size=8)  # truncated, NUL-terminated
    assert n == -ERR_CUDA and short == msg[:7]
    assert lib.kdtr_device_errors(0, 1, None, 0) == -ERR_CUDA  # no buffer: nothing written


@pytest.fixture(scope="module")
def cpu_only_lib(tmp_path_factory):
    """The library built without CUDA (`make NO_CUDA=1 lib` into a scratch BUILD, g++)."""
    build = tmp_path_factory.mktemp("nocuda")
    r = subprocess.run(["make", "-s", "NO_CUDA=1", f"BUILD={build}", "lib"], cwd=REPO_ROOT,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return open_lib(build / "lib" / "libkdtr_kernels.so")


def test_cpu_only_build_has_no_record(cpu_only_lib):
    """Nothing of the CPU-only build runs on a device: 0 failures, an empty message, for any
    device and with or without clear."""
    assert not cpu_only_lib.kdtr_has_cuda()
    for device, clear in ((0, False), (3, True), (-1, False)):
        assert device_errors(cpu_only_lib, device, clear) == (0, "")
    assert cpu_only_lib.kdtr_device_errors(0, 0, None, 0) == 0
    # its CPU entry still refuses bad lengths on the host
    arrays = with_lengths(attn_inputs("f32", 9, 8, 40, 72), BAD, -1, 9)
    rc, msg, _, _ = run_attn(cpu_only_lib, arrays, "auto", 64, cuda=False)
    assert rc == INVALID and msg == f"verify_attn: request {BAD}: prefix_len -1 is negative"


# ---------------------------------------------------------------------------------------
# GPU: verify_attn
# ---------------------------------------------------------------------------------------

def attn_case(cuda_lib, name):
    _, kernel, dtype, T, H, S, Dqk, d_v = next(c for c in ATTN_CONFIGS if c[0] == name)
    arrays = attn_inputs(dtype, T, H, S, Dqk)
    rc, msg, out, lse = run_attn(cuda_lib, drop(arrays, BAD), kernel, d_v, cuda=True)
    if rc == NOT_SUPPORTED:
        pytest.skip(f"this library and device have no {kernel} kernel for {name}: {msg}")
    assert rc == OK, msg
    return kernel, T, S, d_v, arrays, out, lse


@pytest.mark.gpu
@pytest.mark.parametrize("name", ATTN_IDS)
def test_bad_lengths_give_nan_rows_and_a_record(cuda_lib, name):
    kernel, T, S, d_v, arrays, good_out, good_lse = attn_case(cuda_lib, name)
    rc, msg, out, lse = run_attn(cuda_lib, arrays, kernel, d_v, cuda=True)
    assert rc == OK, msg
    good = [b for b in range(B_ATTN) if b != BAD]
    assert same_bits(out[good], good_out) and same_bits(lse[good], good_lse)  # batch invariance
    for kind, pl, tl, _ in bad_attn_lengths(T, S):
        expect_clean(cuda_lib)
        bad = with_lengths(arrays, BAD, pl, tl)
        rc, msg, out, lse = run_attn(cuda_lib, bad, kernel, d_v, cuda=True)
        assert rc == OK, (kind, msg)  # no host check of device data
        assert all_nan(out[BAD]) and all_nan(lse[BAD]), kind
        assert same_bits(out[good], good_out) and same_bits(lse[good], good_lse), kind
        n, record = device_errors(cuda_lib, 0, clear=False)
        rc_cpu, cpu_msg, _, _ = run_attn(cuda_lib, bad, "auto", d_v, cuda=False)
        assert rc_cpu == INVALID
        assert n == 1 and record == cpu_msg, (kind, n, record, cpu_msg)
        assert record.startswith(f"verify_attn: request {BAD}: "), record
        assert device_errors(cuda_lib, 0, clear=True)[0] == 1  # read and cleared
        assert device_errors(cuda_lib, 0) == (0, ""), kind


@pytest.mark.gpu
def test_several_bad_requests_are_counted_and_the_first_is_one_of_them(cuda_lib):
    kernel, T, S, d_v, arrays, _, _ = attn_case(cuda_lib, "simt_f32")
    expect_clean(cuda_lib)
    bad = with_lengths(with_lengths(arrays, 0, -5), 3, 0, T + 2)
    rc, msg, out, lse = run_attn(cuda_lib, bad, kernel, d_v, cuda=True)
    assert rc == OK, msg
    for b in (0, 3):
        assert all_nan(out[b]) and all_nan(lse[b])
    n, record = device_errors(cuda_lib, 0)
    assert n == 2
    assert record in ("verify_attn: request 0: prefix_len -5 is negative",
                      f"verify_attn: request 3: tree_len {T + 2} is outside [0, T = {T}]"), record
    # a second call adds to the count; the first message stays until cleared
    rc, msg, _, _ = run_attn(cuda_lib, with_lengths(arrays, 2, S + 1), kernel, d_v, cuda=True)
    assert rc == OK, msg
    assert device_errors(cuda_lib, 0, clear=True) == (3, record)
    assert device_errors(cuda_lib, 0) == (0, "")


@pytest.mark.gpu
def test_no_out_rows_still_records(cuda_lib):
    """T = 0 (no out rows, no attention block): the check alone runs."""
    arrays = attn_inputs("f32", 1, 4, 10, 16)
    arrays = {"q": arrays["q"][:, :0], "kv_cache": arrays["kv_cache"], "prefix_len": arrays["prefix_len"] * 0,
              "tree_len": arrays["tree_len"] * 0, "visibility": arrays["visibility"][:, :0, :0]}
    expect_clean(cuda_lib)
    rc, msg, _, _ = run_attn(cuda_lib, arrays, "simt", 16, cuda=True)
    assert rc == OK, msg
    assert device_errors(cuda_lib, 0) == (0, "")
    rc, msg, out, _ = run_attn(cuda_lib, with_lengths(arrays, 2, -3), "simt", 16, cuda=True)
    assert rc == OK and out.size == 0, msg
    assert device_errors(cuda_lib, 0, clear=True) == (1, "verify_attn: request 2: prefix_len -3 is negative")


@pytest.mark.gpu
def test_record_of_other_devices_and_bad_devices(cuda_lib):
    import torch

    expect_clean(cuda_lib)
    assert device_errors(cuda_lib, -1) == (0, "")  # the current device
    n, msg = device_errors(cuda_lib, torch.cuda.device_count() + 5)
    assert n == -ERR_CUDA and "cudaErrorInvalidDevice" in msg, (n, msg)
    assert torch.cuda.current_device() == 0
    n, short = device_errors(cuda_lib, torch.cuda.device_count() + 5, size=10)
    assert n == -ERR_CUDA and short == msg[:9]


# ---------------------------------------------------------------------------------------
# GPU: greedy_step (its verify_attn stage checks the chain's rule prefix_len + T <= S)
# ---------------------------------------------------------------------------------------

GREEDY_CASES = [("default", "auto"), ("default", "simt"), ("k2_dims", "simt"), ("k2_dims", "mma"),
                ("k2_dims", "wgmma")]


def greedy_golden(config: str):
    from kdtr.testing import goldens

    return next(g for g in goldens("greedy_step") if g.metadata["config"] == config)


def run_greedy(lib, g, inputs: dict[str, np.ndarray], kernel: str, cuda: bool):
    """greedy_step on `inputs` (the golden's names; B from them): (rc, message, outputs)."""
    spec = SPECS["greedy_step"]
    B = inputs["prefix_len"].shape[0]
    bufs = {s.name: Buf(inputs[s.name], cuda) for s in spec.inputs if s.dims}
    outs = {}
    for s in spec.outputs:
        like = g.expected[s.name]
        fill = 7 if like.dtype.kind != "f" else 7.0
        outs[s.name] = bufs[s.name.replace(".", "_")] = Buf(np.full((B,) + like.shape[1:], fill, like.dtype), cuda)
    bufs["tree_len"] = Buf(np.zeros(B, np.int32), cuda)
    q = inputs["q"]
    values = {"sm_scale": float(np.asarray(inputs["sm_scale"])), "B": B, "D": inputs["top_log_probs"].shape[1],
              "K": inputs["top_log_probs"].shape[2], "N": int(g.metadata["max_budget"]), "H": q.shape[2],
              "S": inputs["kv_cache"].shape[1], "Dqk": q.shape[3], "d_v": int(np.asarray(inputs["d_v"])),
              "dtype": 1 if str(q.dtype) == "bfloat16" else 0, "kernel": KERNELS[kernel] if cuda else 0}
    p = fill_struct("greedy_step", bufs, values)
    rc, msg = call(lib, "greedy_step", p, cuda)
    return rc, msg, {k: b.get() for k, b in outs.items()}


def greedy_inputs(g, b: int | None = None, pl: int | None = None) -> dict[str, np.ndarray]:
    inputs = {k: np.asarray(v) for k, v in g.inputs.items()}
    if b is not None:
        inputs["prefix_len"] = inputs["prefix_len"].copy()
        inputs["prefix_len"][b] = pl
    return inputs


def greedy_drop(inputs, b: int) -> dict[str, np.ndarray]:
    B = inputs["prefix_len"].shape[0]
    keep = [i for i in range(B) if i != b]
    return {k: (v[keep] if v.ndim and v.shape[0] == B else v) for k, v in inputs.items()}


def same_output(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype.kind == "f":
        return same_bits(a, b)
    return a.shape == b.shape and np.array_equal(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("config,kernel", GREEDY_CASES, ids=[f"{c}-{k}" for c, k in GREEDY_CASES])
def test_greedy_step_bad_prefix_len(cuda_lib, config, kernel):
    g = greedy_golden(config)
    base = greedy_inputs(g)
    B, T, S = base["prefix_len"].shape[0], int(g.metadata["max_budget"]) + 1, base["kv_cache"].shape[1]
    rc, msg, full = run_greedy(cuda_lib, g, base, kernel, cuda=True)
    if rc == NOT_SUPPORTED:
        pytest.skip(f"this library and device have no {kernel} kernel for greedy_step/{config}: {msg}")
    assert rc == OK, msg
    rc, msg, good_only = run_greedy(cuda_lib, g, greedy_drop(base, BAD), kernel, cuda=True)
    assert rc == OK, msg
    good = [b for b in range(B) if b != BAD]
    for pl in (-1, I32_MIN, I32_MAX, S - T + 1):
        expect_clean(cuda_lib)
        bad = greedy_inputs(g, BAD, pl)
        rc, msg, out = run_greedy(cuda_lib, g, bad, kernel, cuda=True)
        assert rc == OK, (pl, msg)
        assert all_nan(out["verify_attn.out"][BAD]) and all_nan(out["verify_attn.lse"][BAD]), pl
        for name, a in out.items():
            assert same_output(a[good], good_only[name]), (pl, name)
            if not name.startswith("verify_attn."):  # tree_build and tree_accept do not read prefix_len
                assert same_output(a[BAD], full[name][BAD]), (pl, name)
        n, record = device_errors(cuda_lib, 0, clear=True)
        rc_cpu, cpu_msg, _ = run_greedy(cuda_lib, g, bad, "auto", cuda=False)
        assert rc_cpu == INVALID
        assert n == 1 and record == cpu_msg, (pl, n, record, cpu_msg)
        assert record.startswith(f"greedy_step: request {BAD}: prefix_len {pl}"), record


# ---------------------------------------------------------------------------------------
# GPU: stream capture (global mode) and replay
# ---------------------------------------------------------------------------------------

class Captured:
    """One verify_attn call captured in a torch CUDA graph on fixed buffers."""

    def __init__(self, lib, arrays, kernel: str, d_v: int, warm: bool) -> None:
        import torch

        q = arrays["q"]
        B, T, H, Dqk = q.shape
        S = arrays["kv_cache"].shape[1]
        self.bufs = {k: Buf(v, True) for k, v in arrays.items()}
        self.bufs["out"] = Buf(np.full((B, T, H, d_v), 7.0, np.float32), True)
        self.bufs["lse"] = Buf(np.full((B, T, H), 7.0, np.float32), True)
        values = {"sm_scale": float(1.0 / np.sqrt(Dqk)), "B": B, "T": T, "H": H, "S": S, "Dqk": Dqk, "d_v": d_v,
                  "dtype": 1 if str(q.dtype) == "bfloat16" else 0, "kernel": KERNELS[kernel]}
        self.p = fill_struct("verify_attn", self.bufs, values)
        if warm:
            rc, msg = call(lib, "verify_attn", self.p, True)
            assert rc == OK, msg
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        rcs = []
        with torch.cuda.graph(self.graph, capture_error_mode="global"):
            rcs.append(call(lib, "verify_attn", self.p, True))
        assert rcs[0][0] == OK, rcs[0][1]

    def replay(self, arrays) -> tuple[np.ndarray, np.ndarray]:
        import torch

        for k, v in arrays.items():
            self.bufs[k].set(v)
        self.graph.replay()
        torch.cuda.synchronize()
        return self.bufs["out"].get(), self.bufs["lse"].get()


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["simt_f32", "mma_bf16_k2", "wgmma_bf16_k2"])
def test_captured_call_replays_with_new_data_and_checks_lengths(cuda_lib, name):
    kernel, T, S, d_v, arrays, _, _ = attn_case(cuda_lib, name)
    g = Captured(cuda_lib, arrays, kernel, d_v, warm=True)
    expect_clean(cuda_lib)
    dtype = "bf16" if str(arrays["q"].dtype) == "bfloat16" else "f32"
    for seed in (11, 12):  # new data in the same buffers: the eager call's bits
        new = attn_inputs(dtype, T, arrays["q"].shape[2], S, arrays["q"].shape[3], seed=seed)
        new["prefix_len"] = np.array([1, S - T, 0, 2], np.int32)
        out, lse = g.replay(new)
        rc, msg, e_out, e_lse = run_attn(cuda_lib, new, kernel, d_v, cuda=True)
        assert rc == OK, msg
        assert same_bits(out, e_out) and same_bits(lse, e_lse), seed
    bad = with_lengths(new, BAD, S - T + 2, T)
    out, lse = g.replay(bad)
    assert all_nan(out[BAD]) and all_nan(lse[BAD])
    assert same_bits(np.delete(out, BAD, 0), np.delete(e_out, BAD, 0))
    assert device_errors(cuda_lib, 0, clear=True) == (
        1, f"verify_attn: request {BAD}: prefix_len {S - T + 2} + tree_len {T} exceeds the cache rows S = {S}")
    out, _ = g.replay(new)  # lengths good again: no record, the eager bits
    assert same_bits(out, e_out) and device_errors(cuda_lib, 0) == (0, "")


@pytest.mark.gpu
def test_captured_greedy_step_replays(cuda_lib):
    import torch

    g = greedy_golden("k2_dims")
    base = greedy_inputs(g)
    spec = SPECS["greedy_step"]
    B, S = base["prefix_len"].shape[0], base["kv_cache"].shape[1]
    T = int(g.metadata["max_budget"]) + 1
    rc, msg, eager = run_greedy(cuda_lib, g, base, "auto", cuda=True)
    assert rc == OK, msg
    bufs = {s.name: Buf(base[s.name], True) for s in spec.inputs if s.dims}
    outs = {s.name: Buf(np.zeros_like(g.expected[s.name]), True) for s in spec.outputs}
    bufs.update({k.replace(".", "_"): v for k, v in outs.items()})
    bufs["tree_len"] = Buf(np.zeros(B, np.int32), True)
    q = base["q"]
    values = {"sm_scale": float(np.asarray(base["sm_scale"])), "B": B, "D": base["top_log_probs"].shape[1],
              "K": base["top_log_probs"].shape[2], "N": T - 1, "H": q.shape[2], "S": S, "Dqk": q.shape[3],
              "d_v": int(np.asarray(base["d_v"])), "dtype": 1, "kernel": 0}
    p = fill_struct("greedy_step", bufs, values)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    rcs = []
    with torch.cuda.graph(graph, capture_error_mode="global"):
        rcs.append(call(cuda_lib, "greedy_step", p, True))
    assert rcs[0][0] == OK, rcs[0][1]
    expect_clean(cuda_lib)
    graph.replay()
    torch.cuda.synchronize()
    for name, b in outs.items():
        assert same_output(b.get(), eager[name]), name
    bufs["prefix_len"].set(greedy_inputs(g, BAD, S - T + 1)["prefix_len"])
    graph.replay()
    torch.cuda.synchronize()
    assert all_nan(outs["verify_attn.out"].get()[BAD])
    n, record = device_errors(cuda_lib, 0, clear=True)
    assert n == 1 and record == (f"greedy_step: request {BAD}: prefix_len {S - T + 1} + T {T} exceeds the cache "
                                 f"rows S = {S}"), record


FRESH = """
import sys
sys.path.insert(0, {here!r})
import test_device_errors as t
t.first_call_in_capture()
print("fresh-capture-ok")
"""


def first_call_in_capture() -> None:
    """In a fresh process: the library's first call of all is inside a global-mode capture."""
    import torch

    torch.zeros(1, device="cuda")  # torch's context first, then nothing of the library before capture
    lib = open_lib()
    arrays = attn_inputs("bf16", 5, 16, 80, 576)
    g = Captured(lib, arrays, "auto", 512, warm=False)
    out, lse = g.replay(arrays)
    rc, msg, e_out, e_lse = run_attn(lib, arrays, "auto", 512, cuda=True)
    assert rc == OK, msg
    assert same_bits(out, e_out) and same_bits(lse, e_lse)
    assert device_errors(lib, 0) == (0, "")


@pytest.mark.gpu
def test_first_call_of_the_library_inside_a_capture(cuda_lib):
    r = subprocess.run([sys.executable, "-c", FRESH.format(here=str(HERE))], capture_output=True, text=True,
                       timeout=300, cwd=REPO_ROOT)
    assert r.returncode == 0 and "fresh-capture-ok" in r.stdout, r.stdout + r.stderr


# ---------------------------------------------------------------------------------------
# Script: the host cost of one CUDA entry call (no synchronization in the loop)
# ---------------------------------------------------------------------------------------


def _host_times(torch, fn, p, stream, n: int) -> list[float]:
    """Sorted host seconds of n calls of the CUDA entry fn(&p, stream), after one warm-up."""
    import time

    fn(ctypes.byref(p), stream)
    torch.cuda.synchronize()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn(ctypes.byref(p), stream)
        times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return sorted(times)


def time_entries(n: int = 2000) -> None:
    import torch

    lib = open_lib()
    for name in ("simt_f32", "mma_bf16_k2", "wgmma_bf16_k2"):
        _, kernel, dtype, T, H, S, Dqk, d_v = next(c for c in ATTN_CONFIGS if c[0] == name)
        arrays = attn_inputs(dtype, T, H, S, Dqk)
        bufs = {k: Buf(v, True) for k, v in arrays.items()}
        bufs["out"] = Buf(np.zeros((B_ATTN, T, H, d_v), np.float32), True)
        bufs["lse"] = Buf(np.zeros((B_ATTN, T, H), np.float32), True)
        p = fill_struct("verify_attn", bufs, {"sm_scale": 0.1, "B": B_ATTN, "T": T, "H": H, "S": S, "Dqk": Dqk,
                                              "d_v": d_v, "dtype": int(dtype == "bf16"), "kernel": KERNELS[kernel]})
        s = stream_of(True)
        fn = lib.kdtr_verify_attn_cuda
        times = _host_times(torch, fn, p, s, n)
        print(f"kdtr_verify_attn_cuda {name}: median {times[n // 2] * 1e6:.1f} us, "
              f"p90 {times[n * 9 // 10] * 1e6:.1f} us host time per call ({n} calls, ctypes included)")
    g = greedy_golden("k2_dims")
    base = greedy_inputs(g)
    spec = SPECS["greedy_step"]
    bufs = {s_.name: Buf(base[s_.name], True) for s_ in spec.inputs if s_.dims}
    bufs.update({s_.name.replace(".", "_"): Buf(np.zeros_like(g.expected[s_.name]), True) for s_ in spec.outputs})
    bufs["tree_len"] = Buf(np.zeros(2, np.int32), True)
    q = base["q"]
    p = fill_struct("greedy_step", bufs, {"sm_scale": 0.05, "B": 2, "D": 4, "K": 4, "N": 8, "H": q.shape[2],
                                          "S": base["kv_cache"].shape[1], "Dqk": 576, "d_v": 512, "dtype": 1,
                                          "kernel": 0})
    s = stream_of(True)
    fn = lib.kdtr_greedy_step_cuda
    times = _host_times(torch, fn, p, s, n)
    print(f"kdtr_greedy_step_cuda k2_dims: median {times[n // 2] * 1e6:.1f} us, p90 {times[n * 9 // 10] * 1e6:.1f} us"
          f" host time per call ({n} calls, ctypes included)")


if __name__ == "__main__":
    if sys.argv[1:] == ["time"]:
        time_entries()
    else:
        sys.exit(f"usage: {sys.argv[0]} time")
