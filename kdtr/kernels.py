"""The kernels of this repository called from Python through their C ABI (``make lib``).

``build/lib/libkdtr_kernels.so`` (cuda_tests/include/kdtr_kernels.h) exports one ``extern
"C"`` entry per op and backend; this module loads it with ctypes and gives one function
per op::

    from kdtr import kernels
    from kdtr.testing import goldens, assert_conforms

    for g in goldens("tree_accept"):
        assert_conforms(g, kernels.tree_accept(**g.inputs))              # numpy: CPU backend
        t = {k: torch.from_numpy(v.copy()).cuda() for k, v in g.inputs.items()}
        assert_conforms(g, kernels.tree_accept(**t))                     # torch CUDA: the kernel

- ``device="cpu"`` takes numpy arrays and runs the CPU backend; ``device="cuda"`` takes
  torch CUDA tensors (all on one device) and enqueues the CUDA kernel on that device's
  current stream (``torch.cuda.current_stream().cuda_stream``), without synchronizing;
  ``device=None`` (default) is ``"cuda"`` when an array argument is a torch CUDA tensor,
  else ``"cpu"``. torch is imported only when an argument is a torch tensor.
- Every tensor argument is checked before the call: its type for the device, dtype, shape
  (dims named as in docs/ops/<op>.md, bound by the first tensor that shows them) and
  C-contiguity; a violation is a ``ValueError`` naming the op and the argument. So are the
  values the kernels trust (verify_attn's ``prefix_len`` / ``tree_len``, ``d_v``; for CUDA
  the [B] length tensors are copied to the host for that check).
- Before anything is allocated, the bytes of every output of the call, all together
  (tree_build's visibility alone is B * T * T for T = max_budget + 1), are checked against
  :func:`kdtr.limits.max_output_bytes` (``$KDTR_MAX_OUTPUT_BYTES``, 4 GiB by default), and
  for ``device="cpu"`` the CPU backend's scratch (tree_build's is sized by max_budget even
  for B = 0) against :func:`kdtr.limits.max_scratch_bytes`, as the binaries do: a
  ``ValueError`` naming the op and the argument, e.g. ``tree_build: max_budget: outputs
  would need 10002600033 bytes (9.32 GiB) for B = 1, T = max_budget + 1 = 100001, over the
  limit of 4294967296 bytes (4 GiB); set KDTR_MAX_OUTPUT_BYTES to a larger byte count to
  allow it``.
- The outputs are allocated here (numpy on the CPU, torch on the inputs' CUDA device; every
  byte ``0x5a`` first, as the binaries do, so an element a kernel fails to write cannot
  match by chance) and returned as a dict named as the golden's ``expected.<name>``
  tensors (greedy_step: ``tree_build.node_count``, ...), ready for
  :func:`kdtr.testing.assert_conforms`. The dict's ``.kernel`` attribute names the kernel
  that ran, where the op has a choice (``"cpu_heap"``, ``"select"``, ``"cpu_f64"``,
  ``"mma_bf16_dqk576_dv512"``, ...).
- The library: ``$KDTR_KERNELS_LIB`` if set, else ``<repo>/build/lib/libkdtr_kernels.so``;
  :class:`KernelLibraryError` when it is missing, cannot be loaded, or its ABI version or
  struct sizes differ from this module's. An entry's error code becomes a
  :class:`KernelError` carrying the library's message (``kdtr_last_error()``), e.g. the
  CUDA entries of a CPU-only build: ``not built with CUDA``.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import limits
from .ops import OPS, OpSpec, TensorSpec

__all__ = [
    "ABI_VERSION", "KernelError", "KernelLibraryError", "Outputs", "abi_fields", "abi_struct", "default_lib_path",
    "describe", "greedy_step", "has_cuda", "load", "tree_accept", "tree_build", "verify_attn",
]

ABI_VERSION = 2

# Return codes (kdtr_kernels.h).
OK, ERR_INVALID_ARGUMENT, ERR_NOT_SUPPORTED, ERR_NO_CUDA, ERR_CUDA, ERR_OUT_OF_MEMORY, ERR_INTERNAL = range(7)
_CODE_NAMES = {1: "invalid argument", 2: "not supported", 3: "not built with CUDA", 4: "CUDA error",
               5: "out of memory", 6: "internal error"}

_DTYPE_F32, _DTYPE_BF16 = 0, 1
_MAX_BUDGET = 2**31 - 2


class KernelLibraryError(OSError):
    """libkdtr_kernels.so is missing, cannot be loaded, or does not match this module."""


class KernelError(RuntimeError):
    """An entry of the library returned an error code (``.code``; ``.op``; the message is
    the library's ``kdtr_last_error()``)."""

    def __init__(self, op: str, code: int, message: str) -> None:
        super().__init__(f"{op}: {_CODE_NAMES.get(code, f'error {code}')} (code {code}): {message}")
        self.op = op
        self.code = code


class Outputs(dict):
    """The outputs of one call, name -> array; ``.kernel`` names the kernel that ran (or None)."""

    kernel: str | None = None


# ---------------------------------------------------------------------------------------
# The C structs, derived from the op specs (kdtr.ops.OPS) by the rule of
# cuda_tests/include/kdtr_abi.h (docs/binaries.md, "The op signature"); checked at load
# against the library's kdtr_params_size and, in the tests, against kdtr_describe and
# every binary's --describe.
# ---------------------------------------------------------------------------------------

_C_ELEM = {"f32": "float", "bf16": "uint16_t", "i64": "int64_t", "i32": "int32_t", "u8": "uint8_t"}
_C_VALUE = {"float": ctypes.c_float, "int32_t": ctypes.c_int32, "int64_t": ctypes.c_int64,
            "const char*": ctypes.c_char_p}


def abi_fields(spec: OpSpec) -> list[tuple[str, str]]:
    """The fields of ``spec``'s C parameter struct, in order: (name, C type), e.g.
    ``("top_log_probs", "const float*")``, ``("B", "int64_t")``.

    The rule: a pointer per input tensor of rank >= 1 in spec order (``const T*``, or
    ``const void*`` for an input of several dtypes); a pointer per output in spec order
    (``T*``, named with '.' -> '_'); a pointer per ``abi_buffers`` entry; each scalar input
    that is not in ``abi_dims`` as a value of its dtype; each of ``abi_dims`` as
    ``int64_t``; ``int32_t dtype`` where an input takes several dtypes (the index in its
    ``a|b`` list); where the op has kernels, ``int32_t kernel`` (0 auto, k + 1 =
    ``kernels[k]``) and ``const char* kernel_ran``."""

    def elem(s: TensorSpec) -> str:
        return "void" if len(s.dtypes) > 1 else _C_ELEM[s.dtype]

    f = [(s.name, f"const {elem(s)}*") for s in spec.inputs if s.dims]
    f += [(s.name.replace(".", "_"), f"{elem(s)}*") for s in spec.outputs]
    f += [(s.name, f"{elem(s)}*") for s in spec.abi_buffers]
    f += [(s.name, _C_ELEM[s.dtype]) for s in spec.inputs if not s.dims and s.name not in spec.abi_dims]
    f += [(d, "int64_t") for d in spec.abi_dims]
    if any(len(s.dtypes) > 1 for s in spec.inputs):
        f.append(("dtype", "int32_t"))
    if spec.kernels:
        f += [("kernel", "int32_t"), ("kernel_ran", "const char*")]
    return f


def abi_struct(spec: OpSpec) -> type[ctypes.Structure]:
    """A ctypes.Structure of :func:`abi_fields` (pointers as c_void_p, natural alignment)."""
    fields = [(n, ctypes.c_void_p if t.endswith("*") and t != "const char*" else _C_VALUE[t])
              for n, t in abi_fields(spec)]
    return type(f"kdtr_{spec.name}_params", (ctypes.Structure,), {"_fields_": fields})


_STRUCTS = {name: abi_struct(spec) for name, spec in OPS.items()}
_TreeBuildParams = _STRUCTS["tree_build"]
_VerifyAttnParams = _STRUCTS["verify_attn"]
_TreeAcceptParams = _STRUCTS["tree_accept"]
_GreedyStepParams = _STRUCTS["greedy_step"]
def _kernel_code(op: str, kernel: str) -> int:
    """The Params ``kernel`` code of ``kernel`` for ``op``: 0 for "auto", k + 1 for
    ``OPS[op].kernels[k]``.

    Raises:
        ValueError: ``kernel`` is neither "auto" nor one of the op's kernels."""
    names = ("auto", *OPS[op].kernels)
    if kernel not in names:
        raise ValueError(f"{op}: kernel must be one of {', '.join(names)}, not {kernel!r}")
    return names.index(kernel)

# ---------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------

_lock = threading.Lock()
_loaded: dict[Path, ctypes.CDLL] = {}


def default_lib_path() -> Path:
    """``$KDTR_KERNELS_LIB`` if set, else ``<repo>/build/lib/libkdtr_kernels.so``."""
    env = os.environ.get("KDTR_KERNELS_LIB")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[1] / "build" / "lib" / "libkdtr_kernels.so"


def load(path: str | os.PathLike | None = None) -> ctypes.CDLL:
    """The library at ``path`` (default :func:`default_lib_path`), loaded once and checked:
    ABI version and the size of each params struct.

    Raises:
        KernelLibraryError: no such file (the message says how to build it), the loader
            refuses it, or it is another ABI.
    """
    lib_path = Path(path) if path is not None else default_lib_path()
    with _lock:
        key = lib_path.resolve() if lib_path.exists() else lib_path
        if key in _loaded:
            return _loaded[key]
        if not lib_path.is_file():
            how = "$KDTR_KERNELS_LIB" if path is None and os.environ.get("KDTR_KERNELS_LIB") else "the path"
            raise KernelLibraryError(
                f"kdtr kernels library not found: {lib_path} (from {how}); build it with `make lib` in the kdtr "
                "checkout, or set $KDTR_KERNELS_LIB to a libkdtr_kernels.so")
        try:
            lib = ctypes.CDLL(str(lib_path))
        except OSError as exc:
            raise KernelLibraryError(f"cannot load the kdtr kernels library {lib_path}: {exc}") from exc
        try:
            lib.kdtr_abi_version.restype = ctypes.c_int
            lib.kdtr_has_cuda.restype = ctypes.c_int
            lib.kdtr_params_size.restype = ctypes.c_int64
            lib.kdtr_params_size.argtypes = [ctypes.c_char_p]
            lib.kdtr_describe.restype = ctypes.c_char_p
            lib.kdtr_describe.argtypes = [ctypes.c_char_p]
            lib.kdtr_last_error.restype = ctypes.c_char_p
            for op, struct in _STRUCTS.items():
                for backend in ("cpu", "cuda"):
                    fn = getattr(lib, f"kdtr_{op}_{backend}")
                    fn.restype = ctypes.c_int
                    fn.argtypes = [ctypes.POINTER(struct)] + ([ctypes.c_void_p] if backend == "cuda" else [])
        except AttributeError as exc:
            raise KernelLibraryError(f"{lib_path} is not a kdtr kernels library: {exc}") from exc
        version = lib.kdtr_abi_version()
        if version != ABI_VERSION:
            raise KernelLibraryError(f"{lib_path}: ABI version {version}, this kdtr.kernels needs {ABI_VERSION} "
                                     "(rebuild with `make lib`)")
        for op, struct in _STRUCTS.items():
            size = lib.kdtr_params_size(op.encode())
            if size != ctypes.sizeof(struct):
                raise KernelLibraryError(f"{lib_path}: kdtr_{op}_params is {size} bytes, kdtr.kernels has "
                                         f"{ctypes.sizeof(struct)} (rebuild with `make lib`)")
        _loaded[key] = lib
        return lib


def describe(op: str, path: str | os.PathLike | None = None) -> dict[str, Any]:
    """The library's view of ``op``'s parameter struct (``kdtr_describe``; the same JSON as
    ``kdtr_<op> --describe``): ``{"op", "struct", "size", "align", "fields": [{"name",
    "type", "offset", "size"}, ...], "kernels": [...]}``.

    Raises:
        ValueError: the library does not know ``op``.
        KernelLibraryError: as :func:`load`."""
    import json

    text = load(path).kdtr_describe(op.encode())
    if not text:
        raise ValueError(f"libkdtr_kernels.so has no op {op!r}")
    return json.loads(text.decode())


def has_cuda(path: str | os.PathLike | None = None) -> bool:
    """Whether the library was built with the CUDA kernels."""
    return bool(load(path).kdtr_has_cuda())


# ---------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------

def _is_torch(x: Any) -> bool:
    return type(x).__module__.split(".")[0] == "torch" and hasattr(x, "data_ptr")


_NP_DTYPES = {"i64": np.dtype(np.int64), "i32": np.dtype(np.int32), "u8": np.dtype(np.uint8),
              "f32": np.dtype(np.float32)}
_TORCH_DTYPES = {"i64": "int64", "i32": "int32", "u8": "uint8", "f32": "float32", "bf16": "bfloat16"}


def _np_bf16() -> np.dtype:
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


class _Call:
    """One call's arguments: backend, bound dims, checked tensors and allocated outputs."""

    def __init__(self, op: str, device: str | None, arrays: dict[str, Any]) -> None:
        self.op = op
        self.dims: dict[str, int] = {}
        self.keep: list[Any] = []
        if device not in (None, "cpu", "cuda"):
            raise ValueError(f"{op}: device must be 'cpu', 'cuda' or None, not {device!r}")
        if device is None:
            device = "cuda" if any(_is_torch(a) and a.is_cuda for a in arrays.values()) else "cpu"
        self.device = device
        self.torch = None
        self.cuda_index: int | None = None
        if device == "cuda":
            for name, a in arrays.items():
                if not (_is_torch(a) and a.is_cuda):
                    raise ValueError(f"{op}: {name}: device='cuda' takes torch CUDA tensors, got "
                                     f"{self._describe(a)}")
                if self.cuda_index is None:
                    self.cuda_index = a.device.index
                elif a.device.index != self.cuda_index:
                    raise ValueError(f"{op}: {name}: on cuda:{a.device.index}, the other tensors on "
                                     f"cuda:{self.cuda_index}")
            import torch  # only now: every array is a torch tensor

            self.torch = torch
        else:
            for name, a in arrays.items():
                if not isinstance(a, np.ndarray):
                    raise ValueError(f"{op}: {name}: device='cpu' takes numpy arrays, got {self._describe(a)}")

    @staticmethod
    def _describe(a: Any) -> str:
        if _is_torch(a):
            return f"a torch tensor on {a.device}"
        return f"a {type(a).__module__}.{type(a).__name__}"

    def _dtype_ok(self, a: Any, dtype: str) -> bool:
        if self.torch is not None:
            return a.dtype == getattr(self.torch, _TORCH_DTYPES[dtype])
        return a.dtype == (_np_bf16() if dtype == "bf16" else _NP_DTYPES[dtype])

    @staticmethod
    def _dtype_name(a: Any) -> str:
        return str(a.dtype).replace("torch.", "")

    def tensor(self, name: str, a: Any, dtypes: Sequence[str], dims: Sequence[str]) -> int:
        """Check ``a`` (dtype one of ``dtypes``, shape ``dims``, C-contiguous), bind its
        dims; its address."""
        op = self.op
        if not any(self._dtype_ok(a, d) for d in dtypes):
            raise ValueError(f"{op}: {name}: dtype {self._dtype_name(a)}, expected {' or '.join(dtypes)}")
        shape = tuple(int(s) for s in a.shape)
        want = "[" + ",".join(dims) + "]"
        if len(shape) != len(dims):
            raise ValueError(f"{op}: {name}: shape {shape} has {len(shape)} dims, expected {len(dims)} {want}")
        for d, s in zip(dims, shape):
            if d in self.dims and self.dims[d] != s:
                known = tuple(self.dims.get(x, x) for x in dims)
                raise ValueError(f"{op}: {name}: shape {shape}, expected {want} = "
                                 f"({', '.join(str(k) for k in known)}): {d} is {self.dims[d]}")
        for d, s in zip(dims, shape):
            self.dims.setdefault(d, s)
        contiguous = a.is_contiguous() if self.torch is not None else a.flags.c_contiguous
        if not contiguous:
            raise ValueError(f"{op}: {name}: not C-contiguous (row-major); pass a contiguous copy "
                             f"({'.contiguous()' if self.torch is not None else 'numpy.ascontiguousarray'})")
        if self.torch is None and not a.flags.aligned:
            raise ValueError(f"{op}: {name}: not aligned to its dtype")
        self.keep.append(a)
        return int(a.data_ptr()) if self.torch is not None else int(a.ctypes.data)

    def output(self, dtype: str, dims: Sequence[str]) -> Any:
        shape = tuple(self.dims[d] for d in dims)
        if self.torch is not None:
            t = self.torch.empty(shape, dtype=getattr(self.torch, _TORCH_DTYPES[dtype]),
                                 device=f"cuda:{self.cuda_index}")
            if t.numel():
                t.view(-1).view(self.torch.uint8).fill_(0x5A)
            return t
        a = np.empty(shape, dtype=_NP_DTYPES[dtype])
        a.view(np.uint8).fill(0x5A)
        return a

    @staticmethod
    def ptr(a: Any) -> int:
        return int(a.data_ptr()) if _is_torch(a) else int(a.ctypes.data)

    def host(self, a: Any) -> np.ndarray:
        """A [B] tensor's values on the host (for the value checks)."""
        return a.detach().cpu().numpy() if self.torch is not None else a

    def int_scalar(self, name: str, x: Any) -> int:
        if _is_torch(x):
            if x.numel() != 1 or x.dim() != 0 or x.dtype.is_floating_point or x.dtype.is_complex:
                raise ValueError(f"{self.op}: {name}: expected an integer scalar, got a {x.dtype} tensor of shape "
                                 f"{tuple(x.shape)}")
            return int(x.item())
        a = np.asarray(x)
        if a.ndim != 0 or a.dtype.kind not in "iu":
            raise ValueError(f"{self.op}: {name}: expected an integer scalar, got {a.dtype} of shape {a.shape}")
        return int(a)

    def float_scalar(self, name: str, x: Any) -> float:
        if _is_torch(x):
            if x.numel() != 1 or x.dim() != 0 or x.dtype.is_complex:
                raise ValueError(f"{self.op}: {name}: expected a real scalar, got a {x.dtype} tensor of shape "
                                 f"{tuple(x.shape)}")
            return float(x.item())
        a = np.asarray(x)
        if a.ndim != 0 or a.dtype.kind not in "fiu":
            raise ValueError(f"{self.op}: {name}: expected a real scalar, got {a.dtype} of shape {a.shape}")
        return float(a)

    def run(self, lib: ctypes.CDLL, params: ctypes.Structure) -> None:
        if self.torch is not None:
            with self.torch.cuda.device(self.cuda_index):
                stream = self.torch.cuda.current_stream(self.cuda_index).cuda_stream
                rc = getattr(lib, f"kdtr_{self.op}_cuda")(ctypes.byref(params), ctypes.c_void_p(stream))
        else:
            rc = getattr(lib, f"kdtr_{self.op}_cpu")(ctypes.byref(params))
        if rc != OK:
            msg = lib.kdtr_last_error()
            raise KernelError(self.op, rc, msg.decode("utf-8", "replace") if msg else "")


def _max_budget(op: str, x: Any) -> int:
    a = np.asarray(x.item() if _is_torch(x) else x)
    if a.ndim != 0 or a.dtype.kind not in "iu":
        raise ValueError(f"{op}: max_budget: expected an integer, got {x!r}")
    n = int(a)
    if not 0 <= n <= _MAX_BUDGET:
        raise ValueError(f"{op}: max_budget {n} is outside [0, {_MAX_BUDGET}]")
    return n


def _check_d_v(c: _Call, d_v: int) -> None:
    if not 1 <= d_v <= c.dims["Dqk"]:
        raise ValueError(f"{c.op}: d_v: {d_v} is outside [1, Dqk = {c.dims['Dqk']}]")


def _check_lengths(c: _Call, prefix_len: Any, tree_len: Any | None) -> int:
    """verify_attn's trusted lengths, per request (tree_len None: the chain's T); the most
    keys a request attends to, max(prefix_len + tree_len) (0 for B = 0)."""
    T, S = c.dims["T"], c.dims["S"]
    pl = c.host(prefix_len).astype(np.int64)
    tl = c.host(tree_len).astype(np.int64) if tree_len is not None else np.full_like(pl, T)
    for name, bad in (("prefix_len", np.flatnonzero(pl < 0)),):
        if bad.size:
            b = int(bad[0])
            raise ValueError(f"{c.op}: {name}: request {b}: prefix_len {pl[b]} is negative")
    if tree_len is not None:
        bad = np.flatnonzero((tl < 0) | (tl > T))
        if bad.size:
            b = int(bad[0])
            raise ValueError(f"{c.op}: tree_len: request {b}: tree_len {tl[b]} is outside [0, T = {T}]")
    bad = np.flatnonzero(pl + tl > S)
    if bad.size:
        b = int(bad[0])
        what = "tree_len" if tree_len is not None else "T (the largest tree_len)"
        raise ValueError(f"{c.op}: prefix_len: request {b}: prefix_len {pl[b]} + {what} {tl[b]} exceeds the "
                         f"cache rows S = {S}")
    return int((pl + tl).max()) if len(pl) else 0


def _float_dtype(c: _Call, q: Any) -> str:
    return "bf16" if c._dtype_ok(q, "bf16") else "f32"


# ---------------------------------------------------------------------------------------
# The ops
# ---------------------------------------------------------------------------------------

def tree_accept(node_token_ids: Any, next_token: Any, next_sibling: Any, node_count: Any, target_predict: Any, *,
                device: str | None = None, lib: str | os.PathLike | None = None) -> Outputs:
    """tree_accept (docs/ops/tree_accept.md): node_token_ids i64 [B,T], next_token /
    next_sibling i32 [B,T], node_count i32 [B], target_predict i64 [B,T] -> accepted_count
    i32 [B], accepted_path i32 [B,T], proposed i64 [B,T], status i32 [B].

    Raises:
        ValueError: a bad argument (dtype, shape, contiguity, a trusted value), or what the
            call would allocate over the limits (outputs, naming node_token_ids), before anything is allocated.
        KernelError: the library's entry returned an error code.
        KernelLibraryError: the library is missing or does not match this module."""
    L = load(lib)
    c = _Call("tree_accept", device, dict(node_token_ids=node_token_ids, next_token=next_token,
                                          next_sibling=next_sibling, node_count=node_count,
                                          target_predict=target_predict))
    p = _TreeAcceptParams()
    p.node_token_ids = c.tensor("node_token_ids", node_token_ids, ["i64"], ["B", "T"])
    p.next_token = c.tensor("next_token", next_token, ["i32"], ["B", "T"])
    p.next_sibling = c.tensor("next_sibling", next_sibling, ["i32"], ["B", "T"])
    p.node_count = c.tensor("node_count", node_count, ["i32"], ["B"])
    p.target_predict = c.tensor("target_predict", target_predict, ["i64"], ["B", "T"])
    B, T = c.dims["B"], c.dims["T"]
    limits.check_output_bytes(limits.tree_accept_output_bytes(B, T), "tree_accept: node_token_ids",
                              f"B = {B}, T = {T}")
    out = Outputs(accepted_count=c.output("i32", ["B"]), accepted_path=c.output("i32", ["B", "T"]),
                  proposed=c.output("i64", ["B", "T"]), status=c.output("i32", ["B"]))
    p.accepted_count, p.accepted_path = c.ptr(out["accepted_count"]), c.ptr(out["accepted_path"])
    p.proposed, p.status = c.ptr(out["proposed"]), c.ptr(out["status"])
    p.B, p.T = c.dims["B"], c.dims["T"]
    c.run(L, p)
    return out


_TREE_BUILD_OUT = (("node_count", "i32", ["B"]), ("node_token_ids", "i64", ["B", "T"]),
                   ("node_depths", "i32", ["B", "T"]), ("parents", "i32", ["B", "T"]),
                   ("next_token", "i32", ["B", "T"]), ("next_sibling", "i32", ["B", "T"]),
                   ("visibility", "u8", ["B", "T", "T"]), ("status", "i32", ["B"]))


def tree_build(top_log_probs: Any, top_token_ids: Any, root_token_ids: Any, budget: Any, depth_limit: Any,
               max_budget: int, *, kernel: str = "auto", device: str | None = None,
               lib: str | os.PathLike | None = None) -> Outputs:
    """tree_build (docs/ops/tree_build.md): top_log_probs f32 [B,D,K], top_token_ids i64
    [B,D,K], root_token_ids i64 [B], budget / depth_limit i32 [B], max_budget N (the
    golden's metadata; T = N + 1) -> node_count i32 [B], node_token_ids i64 [B,T],
    node_depths / parents / next_token / next_sibling i32 [B,T], visibility u8 [B,T,T],
    status i32 [B].  kernel: "auto", "heap" or "select"; ``.kernel`` of the result: "heap"
    / "select" (CUDA) or "cpu_heap" / "cpu_select".

    Raises:
        ValueError: a bad argument (dtype, shape, contiguity, a trusted value), or what the
            call would allocate over the limits (outputs or, for device='cpu', scratch, naming
            max_budget), before anything is allocated.
        KernelError: the library's entry returned an error code.
        KernelLibraryError: the library is missing or does not match this module."""
    L = load(lib)
    op = "tree_build"
    code = _kernel_code(op, kernel)
    N = _max_budget(op, max_budget)
    c = _Call(op, device, dict(top_log_probs=top_log_probs, top_token_ids=top_token_ids,
                               root_token_ids=root_token_ids, budget=budget, depth_limit=depth_limit))
    p = _TreeBuildParams()
    p.top_log_probs = c.tensor("top_log_probs", top_log_probs, ["f32"], ["B", "D", "K"])
    p.top_token_ids = c.tensor("top_token_ids", top_token_ids, ["i64"], ["B", "D", "K"])
    p.root_token_ids = c.tensor("root_token_ids", root_token_ids, ["i64"], ["B"])
    p.budget = c.tensor("budget", budget, ["i32"], ["B"])
    p.depth_limit = c.tensor("depth_limit", depth_limit, ["i32"], ["B"])
    c.dims["T"] = N + 1
    B, D, K, T = c.dims["B"], c.dims["D"], c.dims["K"], N + 1
    limits.check_output_bytes(limits.tree_build_output_bytes(B, T), f"{op}: max_budget",
                              f"B = {B}, T = max_budget + 1 = {T}")
    if c.device == "cpu":
        limits.check_cpu_scratch_bytes(limits.tree_build_cpu_scratch_bytes(N, D, K, kernel == "select"),
                                       f"{op}: max_budget", f"N = {N}, D = {D}")
    out = Outputs((name, c.output(dt, dims)) for name, dt, dims in _TREE_BUILD_OUT)
    for name, _, _ in _TREE_BUILD_OUT:
        setattr(p, name, c.ptr(out[name]))
    p.B, p.D, p.K, p.N = c.dims["B"], c.dims["D"], c.dims["K"], N
    p.kernel = code
    c.run(L, p)
    out.kernel = p.kernel_ran.decode() if p.kernel_ran else None
    return out


def verify_attn(q: Any, kv_cache: Any, prefix_len: Any, tree_len: Any, visibility: Any, sm_scale: Any, d_v: Any, *,
                kernel: str = "auto", device: str | None = None, lib: str | os.PathLike | None = None) -> Outputs:
    """verify_attn (docs/ops/verify_attn.md): q f32|bf16 [B,T,H,Dqk], kv_cache (q's dtype)
    [B,S,Dqk], prefix_len / tree_len i32 [B], visibility u8 [B,T,T], sm_scale (a real
    scalar), d_v (an integer scalar in [1, Dqk]) -> out f32 [B,T,H,d_v], lse f32 [B,T,H].
    kernel ("auto", "simt", "mma", "wgmma") picks the CUDA kernel (wgmma: the Hopper kernel,
    on compute capability 9.0 with a library built with it, else a KernelError with code
    ERR_NOT_SUPPORTED); the CPU backend takes "auto".

    Raises:
        ValueError: a bad argument (dtype, shape, contiguity, a trusted value), or what the
            call would allocate over the limits (outputs, naming q, d_v; for device='cpu'
            the scratch of the longest request, naming kv_cache), before anything is allocated.
        KernelError: the library's entry returned an error code.
        KernelLibraryError: the library is missing or does not match this module."""
    L = load(lib)
    op = "verify_attn"
    code = _kernel_code(op, kernel)
    c = _Call(op, device, dict(q=q, kv_cache=kv_cache, prefix_len=prefix_len, tree_len=tree_len,
                               visibility=visibility))
    if kernel != "auto" and c.device == "cpu":
        raise ValueError(f"{op}: kernel {kernel!r} applies to device='cuda' only")
    p = _VerifyAttnParams()
    p.q = c.tensor("q", q, ["f32", "bf16"], ["B", "T", "H", "Dqk"])
    dt = _float_dtype(c, q)
    p.kv_cache = c.tensor("kv_cache", kv_cache, [dt], ["B", "S", "Dqk"])
    p.prefix_len = c.tensor("prefix_len", prefix_len, ["i32"], ["B"])
    p.tree_len = c.tensor("tree_len", tree_len, ["i32"], ["B"])
    p.visibility = c.tensor("visibility", visibility, ["u8"], ["B", "T", "T"])
    scale = c.float_scalar("sm_scale", sm_scale)
    dv = c.int_scalar("d_v", d_v)
    _check_d_v(c, dv)
    keys = _check_lengths(c, prefix_len, tree_len)
    c.dims["d_v"] = dv
    B, T, H, Dqk = c.dims["B"], c.dims["T"], c.dims["H"], c.dims["Dqk"]
    limits.check_output_bytes(limits.verify_attn_output_bytes(B, T, H, dv), f"{op}: q, d_v",
                              f"out [B,T,H,d_v] = [{B},{T},{H},{dv}] and lse [B,T,H]")
    if c.device == "cpu":
        limits.check_cpu_scratch_bytes(limits.verify_attn_cpu_scratch_bytes(keys, Dqk, dv), f"{op}: kv_cache",
                                       f"L = prefix_len + tree_len = {keys} keys of Dqk = {Dqk}")
    out = Outputs(out=c.output("f32", ["B", "T", "H", "d_v"]), lse=c.output("f32", ["B", "T", "H"]))
    p.out, p.lse = c.ptr(out["out"]), c.ptr(out["lse"])
    for d in ("B", "T", "H", "S", "Dqk", "d_v"):
        setattr(p, d, c.dims[d])
    p.sm_scale = scale
    p.dtype = _DTYPE_BF16 if dt == "bf16" else _DTYPE_F32
    p.kernel = code
    c.run(L, p)
    out.kernel = p.kernel_ran.decode() if p.kernel_ran else None
    return out


def greedy_step(top_log_probs: Any, top_token_ids: Any, root_token_ids: Any, budget: Any, depth_limit: Any, q: Any,
                kv_cache: Any, prefix_len: Any, sm_scale: Any, d_v: Any, target_predict: Any,
                max_budget: int | None = None, *, kernel: str = "auto", device: str | None = None,
                lib: str | os.PathLike | None = None) -> Outputs:
    """greedy_step (docs/ops/greedy_step.md): tree_build -> verify_attn -> tree_accept in
    one call (CUDA: four launches on one stream, nothing on the host in between).  Inputs
    as the golden's: tree_build's five, q f32|bf16 [B,T,H,Dqk], kv_cache [B,S,Dqk],
    prefix_len i32 [B], sm_scale, d_v, target_predict i64 [B,T]; T = max_budget + 1
    (max_budget defaults to q's T - 1).  Outputs named ``tree_build.<name>``,
    ``verify_attn.<name>``, ``tree_accept.<name>`` as in the golden; ``.kernel`` is
    verify_attn's kernel.  kernel ("auto", "simt", "mma", "wgmma") forces the kernel of the
    verify_attn stage, as ``kdtr_greedy_step --kernel`` does (device='cuda' only).

    Raises:
        ValueError: a bad argument (dtype, shape, contiguity, a trusted value), or what the
            call would allocate over the limits (outputs, naming max_budget (q when it is not
            given); for device='cpu' the scratch, naming max_budget or kv_cache), before anything is allocated.
        KernelError: the library's entry returned an error code.
        KernelLibraryError: the library is missing or does not match this module."""
    L = load(lib)
    op = "greedy_step"
    code = _kernel_code(op, kernel)
    c = _Call(op, device, dict(top_log_probs=top_log_probs, top_token_ids=top_token_ids,
                               root_token_ids=root_token_ids, budget=budget, depth_limit=depth_limit, q=q,
                               kv_cache=kv_cache, prefix_len=prefix_len, target_predict=target_predict))
    if kernel != "auto" and c.device == "cpu":
        raise ValueError(f"{op}: kernel {kernel!r} applies to device='cuda' only")
    if max_budget is not None:
        c.dims["T"] = _max_budget(op, max_budget) + 1
    p = _GreedyStepParams()
    p.top_log_probs = c.tensor("top_log_probs", top_log_probs, ["f32"], ["B", "D", "K"])
    p.top_token_ids = c.tensor("top_token_ids", top_token_ids, ["i64"], ["B", "D", "K"])
    p.root_token_ids = c.tensor("root_token_ids", root_token_ids, ["i64"], ["B"])
    p.budget = c.tensor("budget", budget, ["i32"], ["B"])
    p.depth_limit = c.tensor("depth_limit", depth_limit, ["i32"], ["B"])
    p.q = c.tensor("q", q, ["f32", "bf16"], ["B", "T", "H", "Dqk"])
    dt = _float_dtype(c, q)
    p.kv_cache = c.tensor("kv_cache", kv_cache, [dt], ["B", "S", "Dqk"])
    p.prefix_len = c.tensor("prefix_len", prefix_len, ["i32"], ["B"])
    p.target_predict = c.tensor("target_predict", target_predict, ["i64"], ["B", "T"])
    if c.dims["T"] < 1:
        raise ValueError(f"{op}: q: T = 0 slots (T = max_budget + 1 >= 1)")
    _max_budget(op, c.dims["T"] - 1)
    scale = c.float_scalar("sm_scale", sm_scale)
    dv = c.int_scalar("d_v", d_v)
    _check_d_v(c, dv)
    keys = _check_lengths(c, prefix_len, None)
    c.dims["d_v"] = dv
    B, T, H, Dqk = c.dims["B"], c.dims["T"], c.dims["H"], c.dims["Dqk"]
    limits.check_output_bytes(limits.greedy_step_output_bytes(B, T, H, dv),
                              f"{op}: {'max_budget' if max_budget is not None else 'q'}",
                              f"B = {B}, T = max_budget + 1 = {T}, H = {H}, d_v = {dv}")
    if c.device == "cpu":
        tree_len_bytes = B * 4  # the [B] tree_len handed from tree_build to verify_attn
        limits.check_cpu_scratch_bytes(
            tree_len_bytes + limits.tree_build_cpu_scratch_bytes(T - 1, c.dims["D"], c.dims["K"], False),
            f"{op}: max_budget", f"tree_build: N = {T - 1}, D = {c.dims['D']}")
        limits.check_cpu_scratch_bytes(tree_len_bytes + limits.verify_attn_cpu_scratch_bytes(keys, Dqk, dv),
                                       f"{op}: kv_cache",
                                       f"verify_attn: L = prefix_len + T = {keys} keys of Dqk = {Dqk}")
    out = Outputs()
    for name, dtp, dims in _TREE_BUILD_OUT:
        out[f"tree_build.{name}"] = c.output(dtp, dims)
    out["verify_attn.out"] = c.output("f32", ["B", "T", "H", "d_v"])
    out["verify_attn.lse"] = c.output("f32", ["B", "T", "H"])
    out["tree_accept.accepted_count"] = c.output("i32", ["B"])
    out["tree_accept.accepted_path"] = c.output("i32", ["B", "T"])
    out["tree_accept.proposed"] = c.output("i64", ["B", "T"])
    out["tree_accept.status"] = c.output("i32", ["B"])
    tree_len = c.output("i32", ["B"])
    for name, arr in out.items():
        setattr(p, name.replace(".", "_"), c.ptr(arr))
    p.tree_len = c.ptr(tree_len)
    for d in ("B", "D", "K", "H", "S", "Dqk", "d_v"):
        setattr(p, d, c.dims[d])
    p.N = c.dims["T"] - 1
    p.sm_scale = scale
    p.dtype = _DTYPE_BF16 if dt == "bf16" else _DTYPE_F32
    p.kernel = code
    c.run(L, p)
    out.kernel = p.kernel_ran.decode() if p.kernel_ran else None
    c.keep.append(tree_len)
    return out
