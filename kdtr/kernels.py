"""The kernels of this repository called from Python through their C ABI (``make lib``).

``build/lib/libkdtr_kernels.so`` (cuda_tests/include/kdtr_kernels.h) exports one ``extern
"C"`` entry per op and backend; this module loads it with ctypes and gives one function
per op (the torch.library ops over them: :mod:`kdtr.torch_ops`, docs/torch.md)::

    from kdtr import kernels
    from kdtr.testing import goldens, assert_conforms

    for g in goldens("tree_accept"):
        assert_conforms(g, kernels.tree_accept(**g.inputs))              # numpy: CPU backend
        t = {k: torch.from_numpy(v.copy()).cuda() for k, v in g.inputs.items()}
        assert_conforms(g, kernels.tree_accept(**t))                     # torch CUDA: the kernel

- ``device="cpu"`` takes numpy arrays and runs the CPU backend; ``device="cuda"`` takes
  torch CUDA tensors (all on one device) and enqueues the CUDA kernel on that device's
  current stream, without synchronizing; ``device=None`` (default) is ``"cuda"`` when an
  array argument is a torch CUDA tensor, else ``"cpu"``. torch is imported only when an
  argument is a torch tensor.
- A CUDA call makes no host synchronisation and no host-device copy, allocates nothing but
  its outputs (none with ``out=``; greedy_step also its [B] ``tree_len`` workspace unless
  ``out=`` holds one) and is legal during CUDA graph capture. The scalars
  (``sm_scale``, ``d_v``, ``max_budget``) are Python numbers, numpy scalars or CPU tensors;
  a CUDA tensor there is a ``ValueError`` (reading it would synchronize).
- Every tensor argument is checked before the call: its type for the device, dtype, shape
  (dims named as in docs/ops/<op>.md, bound by the first tensor that shows them) and
  C-contiguity; a violation is a ``ValueError`` naming the op and the argument. So are
  ``d_v`` and ``max_budget``, and on the CPU the per-request lengths verify_attn trusts
  (``prefix_len`` / ``tree_len``). On CUDA those lengths live on the device: the kernels
  check them there, write NaN into the out / lse rows of a request that fails and record
  the failure in the library's device error record, which :func:`check` reads (a
  ``KernelError`` naming op, request and field). A library without that record
  (``kdtr_device_errors``) gets the old host check, a copy of the [B] lengths.
- Before anything is allocated, the bytes of every output of the call, all together
  (tree_build's visibility alone is B * T * T for T = max_budget + 1), are checked against
  :func:`kdtr.limits.max_output_bytes` (``$KDTR_MAX_OUTPUT_BYTES``, 4 GiB by default), and
  for ``device="cpu"`` the CPU backend's scratch (tree_build's is sized by max_budget even
  for B = 0) against :func:`kdtr.limits.max_scratch_bytes`, as the binaries do: a
  ``ValueError`` naming the op and the argument, e.g. ``tree_build: max_budget: outputs
  would need 10002600033 bytes (9.32 GiB) for B = 1, T = max_budget + 1 = 100001, over the
  limit of 4294967296 bytes (4 GiB); set KDTR_MAX_OUTPUT_BYTES to a larger byte count to
  allow it``.
- The outputs are allocated here (numpy on the CPU, torch on the inputs' CUDA device) or
  given by ``out=`` (a dict named as the result, each entry checked for dtype, shape,
  device and contiguity; :func:`empty_outputs` makes one), and returned as a dict named as
  the golden's ``expected.<name>`` tensors (greedy_step: ``tree_build.node_count``, ...),
  ready for :func:`kdtr.testing.assert_conforms`. ``poison=True`` fills every output
  byte with ``0x5a`` first, as the binaries do, so an element a kernel fails to write
  cannot match by chance; the default (``poison=None``) poisons the outputs this module
  allocates and not those of ``out=``; ``poison=False`` never does (no fill launches).
  The dict's ``.kernel`` attribute names the kernel that ran, where the op has a choice
  (``"cpu_heap"``, ``"select"``, ``"cpu_f64"``, ``"mma_bf16_dqk576_dv512"``, ...).
- The per-signature work (dims, checks of the shapes, limits, the outputs' shapes) is
  cached by the inputs' shapes and dtypes and the scalars that size the outputs; a call
  of a seen signature checks contiguity and device and reads the data pointers only.
- The library: ``$KDTR_KERNELS_LIB`` if set, else ``<repo>/build/lib/libkdtr_kernels.so``;
  :class:`KernelLibraryError` when it is missing, cannot be loaded, or its ABI version or
  struct sizes differ from this module's. An entry's error code becomes a
  :class:`KernelError` carrying the library's message (``kdtr_last_error()``), e.g. the
  CUDA entries of a CPU-only build: ``not built with CUDA``.
"""

from __future__ import annotations

import ctypes
import os
import re
import struct
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import limits
from .ops import OPS, OpSpec, TensorSpec

__all__ = [
    "ABI_VERSION", "KernelError", "KernelLibraryError", "Outputs", "abi_fields", "abi_struct", "check",
    "default_lib_path", "describe", "empty_outputs", "greedy_step", "has_cuda", "has_device_checks", "load",
    "output_specs", "tree_accept", "tree_build", "verify_attn",
]

ABI_VERSION = 2
"""The library's ABI (``KDTR_ABI_VERSION``) this module is written for. The device error
record (``kdtr_device_errors``) is an entry added within it: looked up by name."""

# Return codes (kdtr_kernels.h).
OK, ERR_INVALID_ARGUMENT, ERR_NOT_SUPPORTED, ERR_NO_CUDA, ERR_CUDA, ERR_OUT_OF_MEMORY, ERR_INTERNAL = range(7)
_CODE_NAMES = {1: "invalid argument", 2: "not supported", 3: "not built with CUDA", 4: "CUDA error",
               5: "out of memory", 6: "internal error"}

_DTYPE_F32, _DTYPE_BF16 = 0, 1
_MAX_BUDGET = 2**31 - 2


class KernelLibraryError(OSError):
    """libkdtr_kernels.so is missing, cannot be loaded, or does not match this module."""


class KernelError(RuntimeError):
    """An entry of the library returned an error code, or (:func:`check`) the device error
    record holds a failed request.  ``.code``, ``.op``; for a device record also
    ``.device`` (the CUDA index), ``.request`` (batch row), ``.field`` (the argument,
    e.g. ``"prefix_len"``) and ``.count`` (failures recorded since the last check); the
    message is the library's."""

    def __init__(self, op: str, code: int, message: str, *, device: int | None = None, request: int | None = None,
                 field: str | None = None, count: int | None = None) -> None:
        super().__init__(f"{op}: {_CODE_NAMES.get(code, f'error {code}')} (code {code}): {message}")
        self.op = op
        self.code = code
        self.device = device
        self.request = request
        self.field = field
        self.count = count


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


class _OpDef:
    """An op's call layout, from its spec: the tensor inputs (name, dtypes, dims) in
    signature order, the outputs (name, dtype, dims; the spec's ``Dv`` is ``d_v``), the
    buffers, and the struct's fields in positional order (checked against abi_fields)."""

    def __init__(self, spec: OpSpec) -> None:
        self.name = spec.name
        self.tensors = tuple((s.name, s.dtypes, s.dims) for s in spec.inputs if s.dims)
        self.names = tuple(n for n, _, _ in self.tensors)
        self.output_names = tuple(s.name for s in spec.outputs)
        self.outputs = tuple((s.name, s.dtype, tuple("d_v" if d == "Dv" else d for d in s.dims))
                             for s in spec.outputs)
        self.buffers = tuple((s.name, s.dtype, s.dims) for s in spec.abi_buffers)
        self.abi_dims = spec.abi_dims
        self.has_scale = any(s.name == "sm_scale" for s in spec.inputs)
        self.multi = any(len(s.dtypes) > 1 for s in spec.inputs)
        self.has_kernel = bool(spec.kernels)
        self.struct = _STRUCTS[spec.name]
        order = [n for n, _, _ in self.tensors] + [n.replace(".", "_") for n, _, _ in self.outputs]
        order += [n for n, _, _ in self.buffers] + (["sm_scale"] if self.has_scale else []) + list(self.abi_dims)
        order += (["dtype"] if self.multi else []) + (["kernel"] if self.has_kernel else [])
        assert order == [n for n, _ in abi_fields(spec)][:len(order)], spec.name


_DEFS = {name: _OpDef(spec) for name, spec in OPS.items()}

# ---------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------

_lock = threading.Lock()
_loaded: dict[Path, ctypes.CDLL] = {}
_ENV_DATA = getattr(os.environ, "_data", None)  # os.environ's own dict (CPython): a lookup without encoding


def _env(name: str) -> Any:
    """``$name`` as os.environ holds it (bytes or str; None if unset), cheaply."""
    if _ENV_DATA is not None:
        return _ENV_DATA.get(_ENV_KEYS[name])
    return os.environ.get(name)


_ENV_KEYS = {n: os.environ.encodekey(n) if hasattr(os.environ, "encodekey") else n
             for n in ("KDTR_KERNELS_LIB", limits.MAX_OUTPUT_BYTES_ENV, limits.MAX_SCRATCH_BYTES_ENV)}
_default: tuple[str | None, ctypes.CDLL] | None = None  # ($KDTR_KERNELS_LIB, its library)


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
        lib._kdtr_entries = {(op, b): getattr(lib, f"kdtr_{op}_{b}") for op in _STRUCTS for b in ("cpu", "cuda")}
        try:
            errors = lib.kdtr_device_errors
            errors.restype = ctypes.c_int
            errors.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int64]
            lib._kdtr_device_checks = True
        except AttributeError:
            lib._kdtr_device_checks = False
        _loaded[key] = lib
        return lib


def _library(path: str | os.PathLike | None) -> ctypes.CDLL:
    """:func:`load`, with the default library's lookup cached (per ``$KDTR_KERNELS_LIB``)."""
    global _default
    if path is not None:
        return load(path)
    env = _env("KDTR_KERNELS_LIB")
    d = _default
    if d is not None and d[0] == env:
        return d[1]
    lib = load()
    _default = (env, lib)
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


def has_device_checks(path: str | os.PathLike | None = None) -> bool:
    """Whether the library's CUDA kernels check verify_attn's lengths on the device and
    record failures (``kdtr_device_errors``, read by :func:`check`); without it kdtr.kernels
    copies the [B] lengths to the host to check them, which a CUDA graph capture refuses."""
    return bool(load(path)._kdtr_device_checks)


# ---------------------------------------------------------------------------------------
# The device error record
# ---------------------------------------------------------------------------------------

_used_devices: set[int] = set()  # the CUDA devices this process has launched kernels on
_RECORD = re.compile(r"^(?P<op>\w+): request (?P<request>\d+): (?P<field>\w+)")


def check(device: Any = None, *, lib: str | os.PathLike | None = None) -> None:
    """Read and clear the library's device error record: the requests that the CUDA kernels
    refused since the last check (verify_attn's and greedy_step's per-request lengths:
    ``prefix_len >= 0``, ``tree_len`` in [0, T], ``prefix_len + tree_len <= S``; greedy_step
    ``prefix_len + T <= S``). Such a request's out and lse rows are NaN; nothing of its q or
    kv_cache was read.

    ``device``: a CUDA index, ``"cuda:N"`` or a torch.device; None (default): every device
    this process has run kernels on through this module. This synchronizes each device
    read (wait for the work in flight first); never call it during a CUDA graph capture.
    A library without the record (:func:`has_device_checks` False) has nothing to read:
    this returns at once.

    Raises:
        KernelError: a device's record holds a failure: ``.op``, ``.request``, ``.field``
            (the argument), ``.device``, ``.count``; code ERR_INVALID_ARGUMENT; or the
            record could not be read (ERR_CUDA, the CUDA error in the message). Every
            device read is cleared first; the first failing one is raised.
    """
    L = _library(lib)
    if not L._kdtr_device_checks:
        return
    if device is None:
        devices = sorted(_used_devices)
    elif isinstance(device, int):
        devices = [device]
    else:
        text = str(device)
        m = re.fullmatch(r"cuda(?::(\d+))?", text)
        if not m:
            raise ValueError(f"check: device must be a CUDA index, 'cuda:N' or a torch.device, not {device!r}")
        index = getattr(device, "index", None)
        if m.group(1):
            index = int(m.group(1))
        devices = [index if index is not None else (_torch.cuda.current_device() if _torch is not None else 0)]
    first: KernelError | None = None
    buf = ctypes.create_string_buffer(1024)
    for d in devices:
        n = L.kdtr_device_errors(d, 1, buf, len(buf))
        msg = buf.value.decode("utf-8", "replace")
        if n == 0 or first is not None:
            continue
        if n < 0:
            first = KernelError("check", ERR_CUDA, f"cuda:{d}: reading the device error record failed: {msg}",
                                device=d)
            continue
        m = _RECORD.match(msg)
        op = m.group("op") if m else "kernels"
        first = KernelError(op, ERR_INVALID_ARGUMENT,
                            f"cuda:{d}: {n} request(s) refused by the device-side checks since the last check; the "
                            f"first: {msg}", device=d, request=int(m.group("request")) if m else None,
                            field=m.group("field") if m else None, count=n)
    if first is not None:
        raise first


# ---------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------

_torch: Any = None  # the torch module, once a torch tensor was seen
_Tensor: Any = None
_raw_stream: Any = None  # device index -> cudaStream_t of torch's current stream


_current_device: Any = None  # () -> torch's current CUDA device index


def _import_torch() -> Any:
    global _torch, _Tensor, _raw_stream, _current_device, _CPU
    if _torch is None:
        import torch

        _CPU = torch.device("cpu")

        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        _raw_stream = raw if raw is not None else (lambda i: torch.cuda.current_stream(i).cuda_stream)
        get = getattr(torch._C, "_cuda_getDevice", None)  # torch.cuda.current_device without its lazy-init check
        _current_device = get if get is not None else torch.cuda.current_device
        _Tensor = torch.Tensor
        _torch = torch
    return _torch


def _is_torch(x: Any) -> bool:
    if _Tensor is not None and isinstance(x, _Tensor):
        return True
    return type(x).__module__.split(".")[0] == "torch" and hasattr(x, "data_ptr")


_NP_DTYPES = {"i64": np.dtype(np.int64), "i32": np.dtype(np.int32), "u8": np.dtype(np.uint8),
              "f32": np.dtype(np.float32)}
_TORCH_DTYPES = {"i64": "int64", "i32": "int32", "u8": "uint8", "f32": "float32", "bf16": "bfloat16"}
_dtype_maps: dict[bool, dict[str, Any]] = {}


def _dtypes(torch_kind: bool) -> dict[str, Any]:
    """KDTR dtype name -> numpy dtype (torch_kind False) or torch dtype."""
    m = _dtype_maps.get(torch_kind)
    if m is None:
        if torch_kind:
            torch = _import_torch()
            m = {k: getattr(torch, v) for k, v in _TORCH_DTYPES.items()}
        else:
            import ml_dtypes

            m = dict(_NP_DTYPES, bf16=np.dtype(ml_dtypes.bfloat16))
        _dtype_maps[torch_kind] = m
    return m


def _describe(a: Any) -> str:
    if _is_torch(a):
        return f"a torch tensor on {a.device}"
    return f"a {type(a).__module__}.{type(a).__name__}"


def _placement(op: str, names: Sequence[str], arrays: Sequence[Any], device: str | None) -> int | None:
    """The CUDA index of the call (None: the CPU backend), every array checked for it."""
    if device not in (None, "cpu", "cuda"):
        raise ValueError(f"{op}: device must be 'cpu', 'cuda' or None, not {device!r}")
    if device is None:
        device = "cuda" if any(_Tensor is not None and isinstance(a, _Tensor) and a.is_cuda or
                               _Tensor is None and _is_torch(a) and a.is_cuda for a in arrays) else "cpu"
    if device == "cpu":
        for name, a in zip(names, arrays):
            if not isinstance(a, np.ndarray):
                raise ValueError(f"{op}: {name}: device='cpu' takes numpy arrays, got {_describe(a)}")
        return None
    index = None
    for name, a in zip(names, arrays):
        if not (_is_torch(a) and a.is_cuda):
            raise ValueError(f"{op}: {name}: device='cuda' takes torch CUDA tensors, got {_describe(a)}")
        i = a.get_device()
        if index is None:
            index = i
        elif i != index:
            raise ValueError(f"{op}: {name}: on cuda:{i}, the other tensors on cuda:{index}")
    if _torch is None:
        _import_torch()
    return index


def _cuda_scalar(op: str, name: str, x: Any) -> None:
    if x.device.type != "cpu":
        raise ValueError(f"{op}: {name}: a tensor on {x.device}; reading it would synchronize the device: pass a "
                         "Python number, a numpy scalar or a CPU tensor")


def _scalar(op: str, name: str, x: Any, integer: bool) -> int | float:
    """``x`` as a Python int (``integer``) or float: a Python number, a numpy / 0-d array
    scalar or a 0-d CPU tensor (a CUDA tensor would synchronize: refused).

    Raises:
        ValueError: another kind or shape, naming the op and the argument."""
    want, kinds = ("an integer", "iu") if integer else ("a real", "fiu")
    if type(x) is (int if integer else float):
        return x
    if _is_torch(x):
        _cuda_scalar(op, name, x)
        bad_dtype = x.dtype.is_complex or (integer and (x.dtype.is_floating_point or str(x.dtype) == "torch.bool"))
        if x.numel() != 1 or x.dim() != 0 or bad_dtype:
            raise ValueError(f"{op}: {name}: expected {want} scalar, got a {x.dtype} tensor of shape "
                             f"{tuple(x.shape)}")
        return int(x.item()) if integer else float(x.item())
    a = np.asarray(x)
    if a.ndim != 0 or a.dtype.kind not in kinds:
        raise ValueError(f"{op}: {name}: expected {want} scalar, got {a.dtype} of shape {a.shape}")
    return int(a) if integer else float(a)


def _int_scalar(op: str, name: str, x: Any) -> int:
    return _scalar(op, name, x, True)


def _float_scalar(op: str, name: str, x: Any) -> float:
    return _scalar(op, name, x, False)


def _max_budget(op: str, x: Any) -> int:
    if type(x) is not int:
        if _is_torch(x):
            _cuda_scalar(op, "max_budget", x)
            x = x.item()
        a = np.asarray(x)
        if a.ndim != 0 or a.dtype.kind not in "iu":
            raise ValueError(f"{op}: max_budget: expected an integer, got {x!r}")
        x = int(a)
    if not 0 <= x <= _MAX_BUDGET:
        raise ValueError(f"{op}: max_budget {x} is outside [0, {_MAX_BUDGET}]")
    return x


def _check_tensor(op: str, name: str, a: Any, dtypes: Sequence[str], dims: Sequence[str], bound: dict[str, Any],
                  torch_kind: bool) -> str:
    """Check ``a`` (dtype one of ``dtypes``, shape ``dims`` as bound so far, C-contiguous)
    and bind its dims; the KDTR dtype it has."""
    m = _dtypes(torch_kind)
    dt = next((d for d in dtypes if a.dtype == m[d]), None)
    if dt is None:
        raise ValueError(f"{op}: {name}: dtype {str(a.dtype).replace('torch.', '')}, expected {' or '.join(dtypes)}")
    shape = tuple(a.shape)
    want = "[" + ",".join(dims) + "]"
    if len(shape) != len(dims):
        raise ValueError(f"{op}: {name}: shape {shape} has {len(shape)} dims, expected {len(dims)} {want}")
    for d, s in zip(dims, shape):
        if d in bound and bound[d] != s:
            known = tuple(bound.get(x, x) for x in dims)
            raise ValueError(f"{op}: {name}: shape {shape}, expected {want} = "
                             f"({', '.join(str(k) for k in known)}): {d} is {bound[d]}")
    for d, s in zip(dims, shape):
        bound.setdefault(d, s)
    _contiguous(op, name, a, torch_kind)
    return dt


def _contiguous(op: str, name: str, a: Any, torch_kind: bool) -> None:
    if torch_kind:
        if not a.is_contiguous():
            raise ValueError(f"{op}: {name}: not C-contiguous (row-major); pass a contiguous copy (.contiguous())")
        return
    if not a.flags.c_contiguous:
        raise ValueError(f"{op}: {name}: not C-contiguous (row-major); pass a contiguous copy "
                         "(numpy.ascontiguousarray)")
    if not a.flags.aligned:
        raise ValueError(f"{op}: {name}: not aligned to its dtype")


def _signature(od: _OpDef, arrays: Sequence[Any], torch_kind: bool, n: int | None, d_v: int | None
               ) -> tuple[dict[str, Any], str | None]:
    """Check the tensors' dtypes, shapes and contiguity, ``n`` (max_budget, checked) and
    ``d_v`` against them; the dims (T, N and d_v included) and the float dtype (None where
    the op has no float input of several dtypes). Works on torch FakeTensors (sizes may be
    symbolic: compared, never converted)."""
    op = od.name
    dims: dict[str, Any] = {}
    if n is not None:
        dims["T"] = n + 1
    float_dt = None
    for (name, dtypes, tdims), a in zip(od.tensors, arrays):
        several = len(dtypes) > 1  # q and kv_cache: f32|bf16, the same for both
        dt = _check_tensor(op, name, a, (float_dt,) if several and float_dt else dtypes, tdims, dims, torch_kind)
        if several:
            float_dt = dt
    if op == "greedy_step":
        if dims["T"] < 1:
            raise ValueError(f"{op}: q: T = 0 slots (T = max_budget + 1 >= 1)")
        if n is None:  # from q's T (symbolic under torch.compile's dynamic shapes: left so)
            n = _max_budget(op, dims["T"] - 1) if type(dims["T"]) is int else dims["T"] - 1
    if n is not None:
        dims["N"] = n
    if d_v is not None:
        if not 1 <= d_v <= dims["Dqk"]:
            raise ValueError(f"{op}: d_v: {d_v} is outside [1, Dqk = {dims['Dqk']}]")
        dims["d_v"] = d_v
    return dims, float_dt


def _output_limit(op: str, dims: dict[str, int], n_given: bool) -> None:
    B, T = dims["B"], dims["T"]
    if op == "tree_accept":
        limits.check_output_bytes(limits.tree_accept_output_bytes(B, T), "tree_accept: node_token_ids",
                                  f"B = {B}, T = {T}")
    elif op == "tree_build":
        limits.check_output_bytes(limits.tree_build_output_bytes(B, T), f"{op}: max_budget",
                                  f"B = {B}, T = max_budget + 1 = {T}")
    elif op == "verify_attn":
        H, dv = dims["H"], dims["d_v"]
        limits.check_output_bytes(limits.verify_attn_output_bytes(B, T, H, dv), f"{op}: q, d_v",
                                  f"out [B,T,H,d_v] = [{B},{T},{H},{dv}] and lse [B,T,H]")
    else:
        H, dv = dims["H"], dims["d_v"]
        limits.check_output_bytes(limits.greedy_step_output_bytes(B, T, H, dv),
                                  f"{op}: {'max_budget' if n_given else 'q'}",
                                  f"B = {B}, T = max_budget + 1 = {T}, H = {H}, d_v = {dv}")


class _Plan:
    """The cached work of one call signature: dims, the outputs' (name, dtype, shape), the
    buffers' (name, dtype, shape), and the struct's values after the pointers and scalars."""

    __slots__ = ("dims", "outputs", "buffers", "tail", "float_dt", "torch_outputs", "template", "pack")

    def __init__(self, od: _OpDef, dims: dict[str, int], float_dt: str | None, code: int) -> None:
        self.dims = dims
        self.float_dt = float_dt
        self.outputs = tuple((name, dt, tuple(dims[d] for d in ds)) for name, dt, ds in od.outputs)
        self.buffers = tuple((name, dt, tuple(dims[d] for d in ds)) for name, dt, ds in od.buffers)
        tail = [dims[d] for d in od.abi_dims]
        if od.multi:
            tail.append(_DTYPE_BF16 if float_dt == "bf16" else _DTYPE_F32)
        if od.has_kernel:
            tail.append(code)
        self.tail = tuple(tail)
        self.torch_outputs = None  # torch plans: ((name, torch dtype, shape, strides), ...), set by _plan
        # The struct of every call of this signature, its pointers 0: a call copies it and
        # writes its pointers (the leading fields, one pack_into) and sm_scale.
        nptr = len(od.tensors) + len(od.outputs) + len(od.buffers)
        self.template = bytes(od.struct(*([0] * nptr), *([0.0] if od.has_scale else []), *self.tail))
        self.pack = struct.Struct(f"={nptr}Q").pack_into


_plans: dict[tuple, _Plan] = {}
_MAX_PLANS = 4096


_NUMPY, _CUDA, _TORCH_CPU = 0, 1, 2  # the kinds of plan: numpy arrays (CPU), torch CUDA tensors, torch CPU tensors


def _plan(od: _OpDef, arrays: Sequence[Any], kind: int, code: int, n: int | None, d_v: int | None,
          kernel: str) -> _Plan:
    """The plan of a call signature, from the cache or made (every per-signature check:
    dtypes, shapes, contiguity, ``d_v`` against Dqk, the output-bytes limit, tree_build's
    CPU scratch). Keyed by op, kind, kernel code, max_budget, d_v, the two limits'
    environment values and each tensor's shape and dtype; contiguity, device and data are
    checked per call by the caller."""
    cuda = kind == _CUDA
    key = [od.name, kind, code, n, d_v, _env(limits.MAX_OUTPUT_BYTES_ENV), _env(limits.MAX_SCRATCH_BYTES_ENV)]
    for a in arrays:
        key += (a.shape, a.dtype)
    key = tuple(key)
    plan = _plans.get(key)
    if plan is not None:
        return plan
    dims, float_dt = _signature(od, arrays, kind != _NUMPY, n, d_v)
    _output_limit(od.name, dims, n is not None)
    if not cuda and od.name == "tree_build":
        limits.check_cpu_scratch_bytes(limits.tree_build_cpu_scratch_bytes(n, dims["D"], dims["K"],
                                                                           kernel == "select"),
                                       f"{od.name}: max_budget", f"N = {n}, D = {dims['D']}")
    plan = _Plan(od, dims, float_dt, code)
    if kind != _NUMPY:
        m = _dtypes(True)
        plan.torch_outputs = tuple((name, m[dt], shape, _strides(shape)) for name, dt, shape in plan.outputs)
    if len(_plans) >= _MAX_PLANS:
        _plans.clear()
    _plans[key] = plan
    return plan


def _strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The C-contiguous strides (elements) of ``shape``."""
    st = []
    acc = 1
    for d in reversed(shape):
        st.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(st))


def _check_lengths(op: str, dims: dict[str, int], pl: np.ndarray, tl: np.ndarray | None) -> int:
    """verify_attn's trusted lengths, per request (tree_len None: the chain's T), host
    arrays; the most keys a request attends to, max(prefix_len + tree_len) (0 for B = 0)."""
    T, S = dims["T"], dims["S"]
    pl = pl.astype(np.int64)
    tl64 = tl.astype(np.int64) if tl is not None else np.full_like(pl, T)
    bad = np.flatnonzero(pl < 0)
    if bad.size:
        b = int(bad[0])
        raise ValueError(f"{op}: prefix_len: request {b}: prefix_len {pl[b]} is negative")
    if tl is not None:
        bad = np.flatnonzero((tl64 < 0) | (tl64 > T))
        if bad.size:
            b = int(bad[0])
            raise ValueError(f"{op}: tree_len: request {b}: tree_len {tl64[b]} is outside [0, T = {T}]")
    bad = np.flatnonzero(pl + tl64 > S)
    if bad.size:
        b = int(bad[0])
        what = "tree_len" if tl is not None else "T (the largest tree_len)"
        raise ValueError(f"{op}: prefix_len: request {b}: prefix_len {pl[b]} + {what} {tl64[b]} exceeds the "
                         f"cache rows S = {S}")
    return int((pl + tl64).max()) if len(pl) else 0


def _cpu_scratch(op: str, dims: dict[str, int], keys: int) -> None:
    Dqk, dv = dims["Dqk"], dims["d_v"]
    if op == "verify_attn":
        limits.check_cpu_scratch_bytes(limits.verify_attn_cpu_scratch_bytes(keys, Dqk, dv), f"{op}: kv_cache",
                                       f"L = prefix_len + tree_len = {keys} keys of Dqk = {Dqk}")
        return
    T, B = dims["T"], dims["B"]
    tree_len_bytes = B * 4  # the [B] tree_len handed from tree_build to verify_attn
    limits.check_cpu_scratch_bytes(
        tree_len_bytes + limits.tree_build_cpu_scratch_bytes(T - 1, dims["D"], dims["K"], False),
        f"{op}: max_budget", f"tree_build: N = {T - 1}, D = {dims['D']}")
    limits.check_cpu_scratch_bytes(tree_len_bytes + limits.verify_attn_cpu_scratch_bytes(keys, Dqk, dv),
                                   f"{op}: kv_cache", f"verify_attn: L = prefix_len + T = {keys} keys of Dqk = {Dqk}")


def _allocate(cuda: int | None, dt: str, shape: tuple[int, ...]) -> Any:
    if cuda is not None:
        return _torch.empty(shape, dtype=_dtype_maps[True][dt], device=_cuda_devices[cuda])
    return np.empty(shape, dtype=_dtypes(False)[dt])


class _CudaDevices(dict):
    def __missing__(self, index: int) -> Any:
        d = self[index] = _torch.device("cuda", index)
        return d


_cuda_devices = _CudaDevices()
_CPU: Any = None  # torch.device("cpu"), once torch is imported


def _poison(a: Any) -> None:
    if isinstance(a, np.ndarray):
        a.view(np.uint8).fill(0x5A)
    elif a.numel():
        a.view(-1).view(_torch.uint8).fill_(0x5A)


def _given(op: str, name: str, a: Any, dt: str, shape: tuple[int, ...], cuda: int | None) -> Any:
    """Check one ``out=`` entry: dtype, shape, device, contiguity."""
    m = _dtypes(cuda is not None)
    if cuda is not None:
        if not (_is_torch(a) and a.is_cuda and a.get_device() == cuda):
            raise ValueError(f"{op}: out[{name!r}]: expected a torch tensor on cuda:{cuda}, got {_describe(a)}")
    elif not isinstance(a, np.ndarray):
        raise ValueError(f"{op}: out[{name!r}]: device='cpu' takes numpy arrays, got {_describe(a)}")
    if a.dtype != m[dt]:
        raise ValueError(f"{op}: out[{name!r}]: dtype {str(a.dtype).replace('torch.', '')}, expected {dt}")
    if tuple(a.shape) != shape:
        raise ValueError(f"{op}: out[{name!r}]: shape {tuple(a.shape)}, expected {shape}")
    _contiguous(op, f"out[{name!r}]", a, cuda is not None)
    if cuda is None and not a.flags.writeable:
        raise ValueError(f"{op}: out[{name!r}]: read-only")
    return a


def _ptr(a: Any) -> int:
    return a.data_ptr() if _Tensor is not None and isinstance(a, _Tensor) else a.ctypes.data


def _call(op: str, arrays: tuple, *, n: Any = None, sm_scale: Any = None, d_v: Any = None, kernel: str = "auto",
          out: Mapping[str, Any] | None, poison: bool | None, device: str | None,
          lib: str | os.PathLike | None) -> Outputs:
    """One call of ``op``'s entry, its outputs named (the functions below come here)."""
    outs, ran = _run(op, arrays, n=n, sm_scale=sm_scale, d_v=d_v, kernel=kernel, out=out, poison=poison,
                     device=device, lib=lib)
    res = Outputs(zip(_DEFS[op].output_names, outs))
    if _DEFS[op].has_kernel:
        res.kernel = ran.decode() if ran else None
    return res


def _run(op: str, arrays: tuple, *, n: Any = None, sm_scale: Any = None, d_v: Any = None, kernel: str = "auto",
         out: Mapping[str, Any] | None = None, poison: bool | None = None, device: str | None = None,
         lib: str | os.PathLike | None = None) -> tuple[list[Any], bytes | None]:
    """One call of ``op``'s entry: its outputs in spec order and the kernel_ran field
    (kdtr.torch_ops comes here)."""
    L = _library(lib)
    od = _DEFS[op]
    code = _kernel_code(op, kernel) if kernel != "auto" else 0
    if n is not None:
        n = _max_budget(op, n)
    if device != "cpu" and _Tensor is not None and (L._kdtr_device_checks or not od.has_scale):
        scale = _float_scalar(op, "sm_scale", sm_scale) if od.has_scale else None
        dv = _int_scalar(op, "d_v", d_v) if d_v is not None else None
        done = _fast_cuda(L, od, arrays, code, n, dv, scale, out, poison)
        if done is not None:
            return done
    cuda = _placement(op, od.names, arrays, device)
    if code and cuda is None and op != "tree_build":
        raise ValueError(f"{op}: kernel {kernel!r} applies to device='cuda' only")
    scale = _float_scalar(op, "sm_scale", sm_scale) if od.has_scale else None
    dv = _int_scalar(op, "d_v", d_v) if d_v is not None else None
    plan = _plan(od, arrays, _NUMPY if cuda is None else _CUDA, code, n, dv, kernel)
    vals = []
    if cuda is not None:
        for name, a in zip(od.names, arrays):
            if not a.is_contiguous():
                _contiguous(op, name, a, True)
            vals.append(a.data_ptr())
    else:
        for name, a in zip(od.names, arrays):
            _contiguous(op, name, a, False)
            vals.append(a.ctypes.data)
    if od.has_scale and (cuda is None or not L._kdtr_device_checks):  # the lengths, on the host
        _host_lengths(op, od, plan, arrays, cuda)
    if out is None:
        outs = [_allocate(cuda, dt, shape) for _, dt, shape in plan.outputs]
        if poison is None:
            poison = True
    else:
        outs = _given_outputs(op, plan, out, cuda)
    if poison:
        for a in outs:
            _poison(a)
    if cuda is not None:
        vals += [a.data_ptr() for a in outs]
    else:
        vals += [a.ctypes.data for a in outs]
    for name, dt, shape in plan.buffers:  # tree_build's heap_fallback (optional), greedy_step's tree_len
        a = out.get(name) if out is not None else None
        if a is not None:
            vals.append(_ptr(_given(op, name, a, dt, shape, cuda)))
        elif name == "tree_len":
            a = _allocate(cuda, dt, shape)
            outs.append(a)  # kept alive to the end of the call (and, on CUDA, by the caching allocator's stream order)
            vals.append(_ptr(a))
        else:
            vals.append(0)
    ran = _launch(L, od, plan, -1 if cuda is None else cuda, vals, scale)
    if len(outs) > len(plan.outputs):
        del outs[len(plan.outputs):]
    return outs, ran


def _launch(L: ctypes.CDLL, od: _OpDef, plan: _Plan, index: int, ptrs: Sequence[int], scale: float | None
            ) -> bytes | None:
    """Call ``od``'s entry (CUDA ``index``, on torch's current stream there; -1 the CPU
    entry) with the plan's struct and these pointers (inputs, outputs, buffers, in field
    order) and sm_scale; the kernel_ran field (None where the op has none).

    Raises:
        KernelError: the entry returned an error code."""
    p = od.struct.from_buffer_copy(plan.template)
    plan.pack(p, 0, *ptrs)
    if scale is not None:
        p.sm_scale = scale
    if index >= 0:
        _used_devices.add(index)
        fn = L._kdtr_entries[od.name, "cuda"]
        if _current_device() == index:
            rc = fn(p, _raw_stream(index))
        else:
            with _torch.cuda.device(index):
                rc = fn(p, _raw_stream(index))
    else:
        rc = L._kdtr_entries[od.name, "cpu"](p)
    if rc != OK:
        msg = L.kdtr_last_error()
        raise KernelError(od.name, rc, msg.decode("utf-8", "replace") if msg else "")
    return p.kernel_ran if od.has_kernel else None


def _fast_cuda(L: ctypes.CDLL, od: _OpDef, arrays: tuple, code: int, n: int | None, dv: int | None,
               scale: float | None, out: Mapping[str, Any] | None, poison: bool | None
               ) -> tuple[list[Any], bytes | None] | None:
    """A CUDA call of a signature seen before, every tensor a plain torch tensor on one
    device, contiguous, and (``out=``) of the planned dtype and shape: the call, with the
    fewest host operations. None where anything differs (before anything is allocated or
    enqueued): the general path then raises the right error or plans the signature."""
    key = [od.name, _CUDA, code, n, dv, _env(limits.MAX_OUTPUT_BYTES_ENV), _env(limits.MAX_SCRATCH_BYTES_ENV)]
    vals = []
    index = None
    for a in arrays:
        if a.__class__ is not _Tensor or not a.is_contiguous():
            return None
        i = a.get_device()
        if i != index:
            if index is not None or i < 0:
                return None
            index = i
        key += (a.shape, a.dtype)
        vals.append(a.data_ptr())
    plan = _plans.get(tuple(key))
    if plan is None:
        return None
    if out is None:
        dev = _cuda_devices[index]
        outs = [_torch.empty_strided(shape, st, dtype=dt, device=dev) for _, dt, shape, st in plan.torch_outputs]
        if poison is None:
            poison = True
    else:
        if out.__class__ is not dict and not isinstance(out, Mapping):
            return None
        outs = []
        for name, dt, shape, _ in plan.torch_outputs:
            a = out.get(name)
            if a is None or a.__class__ is not _Tensor or a.dtype is not dt or a.shape != shape or \
                    a.get_device() != index or not a.is_contiguous():
                return None
            outs.append(a)
        if len(out) != len(outs) and any(k not in _OPTIONAL_OUT[od.name] for k in out if k not in od.output_names):
            return None
    bufs = []
    keep = None
    for name, dt, shape in plan.buffers:  # tree_build's heap_fallback (optional), greedy_step's tree_len
        a = out.get(name) if out is not None else None
        if a is not None:
            if a.__class__ is not _Tensor or a.dtype is not _dtype_maps[True][dt] or a.shape != shape or \
                    a.get_device() != index or not a.is_contiguous():
                return None
            bufs.append(a.data_ptr())
        elif name == "tree_len":
            keep = _torch.empty(shape, dtype=_torch.int32, device=_cuda_devices[index])
            bufs.append(keep.data_ptr())
        else:
            bufs.append(0)
    if poison:
        for a in outs:
            _poison(a)
    vals += [a.data_ptr() for a in outs]
    vals += bufs
    ran = _launch(L, od, plan, index, vals, scale)
    del keep
    return outs, ran


def _torch_call(op: str, arrays: Sequence[Any], code: int, n: int | None, dv: int | None, scale: float | None,
                outs: Sequence[Any] | None) -> list[Any] | None:
    """The torch ops' call (kdtr.torch_ops) of a signature planned before: torch tensors
    (plain torch.Tensor, contiguous) all on one device -- one CUDA device (the current
    stream there) or the CPU (the CPU entry) -- the scalars already in their plan's form
    (``code`` the kernel code, ``n`` max_budget, ``dv`` d_v, as :func:`_torch_plan`
    checked them). ``outs``: the outputs in spec order (each must have the planned dtype
    and shape, be contiguous and on the inputs' device), or None: allocated here. The
    outputs in spec order; nothing poisoned.

    None where any of that differs or the signature has no plan yet, before anything is
    allocated or enqueued: the caller then goes through :func:`_torch_plan` (which raises
    the error naming the argument, or makes the plan). Per call this reads each tensor's
    class, contiguity, device, shape, dtype and data pointer, checks verify_attn's /
    greedy_step's lengths on the host for CPU tensors, and makes one call of the entry."""
    L = _library(None)
    od = _DEFS[op]
    index = arrays[0].get_device()
    if index >= 0 and od.has_scale and not L._kdtr_device_checks:
        return None  # the lengths are copied to the host: kdtr.kernels' general path
    key = [op, _CUDA if index >= 0 else _TORCH_CPU, code, n, dv, _env(limits.MAX_OUTPUT_BYTES_ENV),
           _env(limits.MAX_SCRATCH_BYTES_ENV)]
    vals = []
    for a in arrays:
        if a.__class__ is not _Tensor or not a.is_contiguous() or a.get_device() != index:
            return None
        key += (a.shape, a.dtype)
        vals.append(a.data_ptr())
    plan = _plans.get(tuple(key))
    if plan is None:
        return None
    if outs is None:
        dev = _cuda_devices[index] if index >= 0 else _CPU
        outs = [_torch.empty_strided(shape, st, dtype=dt, device=dev) for _, dt, shape, st in plan.torch_outputs]
    else:
        for a, (_, dt, shape, _) in zip(outs, plan.torch_outputs):
            if a.__class__ is not _Tensor or a.dtype is not dt or a.shape != shape or a.get_device() != index or \
                    not a.is_contiguous():
                return None
        outs = list(outs)
    if index < 0 and od.has_scale:  # the lengths (data) on the host, every call
        tl = arrays[od.names.index("tree_len")].numpy() if "tree_len" in od.names else None
        keys = _check_lengths(op, plan.dims, arrays[od.names.index("prefix_len")].numpy(), tl)
        _cpu_scratch(op, plan.dims, keys)
    vals += [a.data_ptr() for a in outs]
    keep = None
    for name, _, shape in plan.buffers:  # tree_build's heap_fallback (not given: NULL), greedy_step's tree_len
        if name == "tree_len":
            keep = _torch.empty(shape, dtype=_torch.int32, device=arrays[0].device)
            vals.append(keep.data_ptr())
        else:
            vals.append(0)
    _launch(L, od, plan, index, vals, scale)
    del keep
    return outs


def _torch_plan(op: str, arrays: Sequence[Any], kernel: str, n: Any, d_v: Any) -> tuple[int, int | None, int | None]:
    """Check a torch ops' call the way :func:`_torch_call` needs it, and plan its
    signature: the scalars in the plan's form (kernel code, max_budget, d_v). Every tensor
    a torch tensor, all on the CPU or all on one CUDA device; the checks of :func:`_plan`.

    Raises:
        ValueError: naming the op and the argument, as kdtr.kernels does."""
    od = _DEFS[op]
    code = _kernel_code(op, kernel) if kernel != "auto" else 0
    n = _max_budget(op, n) if n is not None else None
    dv = _int_scalar(op, "d_v", d_v) if d_v is not None else None
    if _torch is None:
        _import_torch()
    index = None
    for name, a in zip(od.names, arrays):
        if not _is_torch(a):
            raise ValueError(f"{op}: {name}: expected a torch tensor, got {_describe(a)}")
        i = a.get_device()
        if index is None:
            index = i
        elif i != index:
            raise ValueError(f"{op}: {name}: on {a.device}, the other tensors on {arrays[0].device}")
    if code and index < 0 and op != "tree_build":
        raise ValueError(f"{op}: kernel {kernel!r} applies to device='cuda' only")
    _plan(od, arrays, _CUDA if index >= 0 else _TORCH_CPU, code, n, dv, kernel)
    return code, n, dv


_OPTIONAL_OUT = {name: {b for b, _, _ in d.buffers} for name, d in _DEFS.items()}


def _host_lengths(op: str, od: _OpDef, plan: _Plan, arrays: tuple, cuda: int | None) -> None:
    """verify_attn's / greedy_step's lengths checked on the host: the CPU backend's (and its
    scratch for the longest request), or a CUDA call through a library without the
    device-side checks (a copy; refused during a CUDA graph capture)."""
    i = od.names.index("prefix_len")
    tl = arrays[od.names.index("tree_len")] if "tree_len" in od.names else None
    if cuda is not None:
        if _torch.cuda.is_current_stream_capturing():
            raise ValueError(f"{op}: prefix_len: this libkdtr_kernels.so has no device-side length checks "
                             "(kdtr_device_errors), so they are read to the host, which a CUDA graph capture "
                             "refuses: rebuild it with `make lib`")
        _check_lengths(op, plan.dims, arrays[i].cpu().numpy(), tl.cpu().numpy() if tl is not None else None)
        return
    keys = _check_lengths(op, plan.dims, arrays[i], tl)
    _cpu_scratch(op, plan.dims, keys)


def _given_outputs(op: str, plan: _Plan, out: Mapping[str, Any], cuda: int | None) -> list[Any]:
    """The ``out=`` dict's outputs in plan order, each checked."""
    if not isinstance(out, Mapping):
        raise ValueError(f"{op}: out: expected a dict of output name -> tensor, got {type(out).__name__}")
    outs = []
    for name, dt, shape in plan.outputs:
        a = out.get(name)
        if a is None:
            raise ValueError(f"{op}: out: no {name!r} (out= names every output: "
                             f"{', '.join(n for n, _, _ in plan.outputs)})")
        outs.append(_given(op, name, a, dt, shape, cuda))
    if len(out) != len(plan.outputs):
        known = {n for n, _, _ in plan.outputs} | {n for n, _, _ in plan.buffers}
        extra = sorted(set(out) - known)
        if extra:
            raise ValueError(f"{op}: out: {extra[0]!r} is not an output of {op}")
    return outs


# ---------------------------------------------------------------------------------------
# Shapes of the outputs, preallocation
# ---------------------------------------------------------------------------------------

def _op_arrays(op: str, inputs: Mapping[str, Any]) -> tuple[list[Any], Any, Any]:
    od = _DEFS.get(op)
    if od is None:
        raise ValueError(f"no op {op!r} (one of {', '.join(_DEFS)})")
    missing = [n for n in od.names if n not in inputs]
    if missing:
        raise ValueError(f"{op}: inputs: no {missing[0]!r}")
    return [inputs[n] for n in od.names], inputs.get("d_v"), inputs.get("sm_scale")


def output_specs(op: str, inputs: Mapping[str, Any], *, max_budget: Any = None) -> dict[str, tuple[str, tuple]]:
    """The outputs a call of ``op`` on ``inputs`` (name -> array, as a golden's inputs:
    numpy arrays or torch tensors, FakeTensors too; scalars ``d_v``, ``sm_scale`` by value)
    returns: name -> (KDTR dtype, shape), in the result's order. ``max_budget``: tree_build's
    (required) and greedy_step's (default q's T - 1). The tensors are checked as a call
    checks them (dtype, shape, contiguity, ``d_v``, ``max_budget``); nothing is read or
    allocated, and sizes are never converted to ints (symbolic sizes stay symbolic).

    Raises:
        ValueError: as a call of the op would, naming the argument; an unknown op or a
            missing input."""
    arrays, d_v, _ = _op_arrays(op, inputs)
    od = _DEFS[op]
    if op == "tree_build" and max_budget is None:
        raise ValueError("tree_build: max_budget: required")
    n = _max_budget(op, max_budget) if max_budget is not None else None
    dv = _int_scalar(op, "d_v", d_v) if op in ("verify_attn", "greedy_step") else None
    dims, _ = _signature(od, arrays, any(_is_torch(a) for a in arrays), n, dv)
    return {name: (dt, tuple(dims[d] for d in ds)) for name, dt, ds in od.outputs}


def empty_outputs(op: str, inputs: Mapping[str, Any], *, max_budget: Any = None) -> Outputs:
    """Uninitialised outputs for ``out=`` of a call of ``op`` on ``inputs`` (see
    :func:`output_specs`): torch tensors on the inputs' CUDA device, else numpy arrays;
    greedy_step's dict also holds its ``tree_len`` workspace (i32 [B]), so that a call
    with it allocates nothing.

    Raises:
        ValueError: as :func:`output_specs`."""
    specs = output_specs(op, inputs, max_budget=max_budget)
    arrays = _op_arrays(op, inputs)[0]
    cuda = arrays[0].get_device() if _is_torch(arrays[0]) and arrays[0].is_cuda else None
    if cuda is not None:
        _dtypes(True)
    res = Outputs((name, _allocate(cuda, dt, shape)) for name, (dt, shape) in specs.items())
    if op == "greedy_step":
        res["tree_len"] = _allocate(cuda, "i32", (arrays[0].shape[0],))
    return res


# ---------------------------------------------------------------------------------------
# The ops
# ---------------------------------------------------------------------------------------

_COMMON = """
    out: a dict of preallocated outputs named as the result (:func:`empty_outputs`); each
        is checked (dtype, shape, device, contiguity) and written, and the result holds
        them. poison: fill every output byte with 0x5a before the call (default: only
        outputs this function allocates). device: "cpu" (numpy arrays), "cuda" (torch CUDA
        tensors on one device, torch's current stream) or None (inferred). lib: the
        library's path (default :func:`default_lib_path`).

    Raises:
        ValueError: a bad argument (dtype, shape, contiguity, device, a trusted value, an
            ``out=`` entry, a CUDA tensor as a scalar), or what the call would allocate
            over the limits, before anything is allocated; the message names the argument.
        KernelError: the library's entry returned an error code.
        KernelLibraryError: the library is missing or does not match this module."""


def tree_accept(node_token_ids: Any, next_token: Any, next_sibling: Any, node_count: Any, target_predict: Any, *,
                out: Mapping[str, Any] | None = None, poison: bool | None = None, device: str | None = None,
                lib: str | os.PathLike | None = None) -> Outputs:
    return _call("tree_accept", (node_token_ids, next_token, next_sibling, node_count, target_predict), out=out,
                 poison=poison, device=device, lib=lib)


tree_accept.__doc__ = """tree_accept (docs/ops/tree_accept.md): node_token_ids i64 [B,T], next_token /
    next_sibling i32 [B,T], node_count i32 [B], target_predict i64 [B,T] -> accepted_count
    i32 [B], accepted_path i32 [B,T], proposed i64 [B,T], status i32 [B] (limits: naming
    node_token_ids).
""" + _COMMON


def tree_build(top_log_probs: Any, top_token_ids: Any, root_token_ids: Any, budget: Any, depth_limit: Any,
               max_budget: int, *, kernel: str = "auto", out: Mapping[str, Any] | None = None,
               poison: bool | None = None, device: str | None = None,
               lib: str | os.PathLike | None = None) -> Outputs:
    return _call("tree_build", (top_log_probs, top_token_ids, root_token_ids, budget, depth_limit), n=max_budget,
                 kernel=kernel, out=out, poison=poison, device=device, lib=lib)


tree_build.__doc__ = """tree_build (docs/ops/tree_build.md): top_log_probs f32 [B,D,K], top_token_ids i64
    [B,D,K], root_token_ids i64 [B], budget / depth_limit i32 [B], max_budget N (an int,
    the golden's metadata; T = N + 1) -> node_count i32 [B], node_token_ids i64 [B,T],
    node_depths / parents / next_token / next_sibling i32 [B,T], visibility u8 [B,T,T],
    status i32 [B]; ``out=`` may also hold ``heap_fallback`` u8 [B] (1 where the select
    build handed a request to the heap build).  kernel: "auto", "heap" or "select";
    ``.kernel`` of the result: "heap" / "select" (CUDA) or "cpu_heap" / "cpu_select".
    Limits: naming max_budget (outputs; device='cpu' also the scratch).
""" + _COMMON


def verify_attn(q: Any, kv_cache: Any, prefix_len: Any, tree_len: Any, visibility: Any, sm_scale: Any, d_v: Any, *,
                kernel: str = "auto", out: Mapping[str, Any] | None = None, poison: bool | None = None,
                device: str | None = None, lib: str | os.PathLike | None = None) -> Outputs:
    return _call("verify_attn", (q, kv_cache, prefix_len, tree_len, visibility), sm_scale=sm_scale, d_v=d_v,
                 kernel=kernel, out=out, poison=poison, device=device, lib=lib)


verify_attn.__doc__ = """verify_attn (docs/ops/verify_attn.md): q f32|bf16 [B,T,H,Dqk], kv_cache (q's dtype)
    [B,S,Dqk], prefix_len / tree_len i32 [B], visibility u8 [B,T,T], sm_scale (a real
    scalar), d_v (an integer scalar in [1, Dqk]) -> out f32 [B,T,H,d_v], lse f32 [B,T,H].
    kernel ("auto", "simt", "mma", "wgmma") picks the CUDA kernel (wgmma: the Hopper kernel,
    on compute capability 9.0 with a library built with it, else a KernelError with code
    ERR_NOT_SUPPORTED); the CPU backend takes "auto".  The lengths: checked on the host for
    device='cpu' (ValueError); on CUDA by the kernel (NaN rows, :func:`check`).  Limits:
    naming q, d_v (outputs), kv_cache (device='cpu': the longest request's scratch).
""" + _COMMON


def greedy_step(top_log_probs: Any, top_token_ids: Any, root_token_ids: Any, budget: Any, depth_limit: Any, q: Any,
                kv_cache: Any, prefix_len: Any, sm_scale: Any, d_v: Any, target_predict: Any,
                max_budget: int | None = None, *, kernel: str = "auto", out: Mapping[str, Any] | None = None,
                poison: bool | None = None, device: str | None = None,
                lib: str | os.PathLike | None = None) -> Outputs:
    return _call("greedy_step", (top_log_probs, top_token_ids, root_token_ids, budget, depth_limit, q, kv_cache,
                                 prefix_len, target_predict), n=max_budget, sm_scale=sm_scale, d_v=d_v,
                 kernel=kernel, out=out, poison=poison, device=device, lib=lib)


greedy_step.__doc__ = """greedy_step (docs/ops/greedy_step.md): tree_build -> verify_attn -> tree_accept in
    one call (CUDA: four launches on one stream, nothing on the host in between).  Inputs
    as the golden's: tree_build's five, q f32|bf16 [B,T,H,Dqk], kv_cache [B,S,Dqk],
    prefix_len i32 [B], sm_scale, d_v, target_predict i64 [B,T]; T = max_budget + 1
    (max_budget defaults to q's T - 1).  Outputs named ``tree_build.<name>``,
    ``verify_attn.<name>``, ``tree_accept.<name>`` as in the golden; ``out=`` may also hold
    the ``tree_len`` i32 [B] workspace (else one is allocated per call).  ``.kernel`` is
    verify_attn's kernel.  kernel ("auto", "simt", "mma", "wgmma") forces the kernel of the
    verify_attn stage, as ``kdtr_greedy_step --kernel`` does (device='cuda' only).  Limits:
    naming max_budget (q when it is not given), kv_cache (device='cpu').
""" + _COMMON
