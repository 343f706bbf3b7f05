"""The kernels as torch operators: ``torch.ops.kdtr.<op>`` (docs/torch.md).

Importing this module registers, with torch.library, four ops of libkdtr_kernels.so
(:mod:`kdtr.kernels`; :data:`TORCH_OPS`, not ddtree_decode) in the namespace ``kdtr``::

    import kdtr.torch_ops  # noqa: F401  (registers torch.ops.kdtr.*)

    node_count, node_token_ids, ..., status = torch.ops.kdtr.tree_build(
        top_log_probs, top_token_ids, root_token_ids, budget, depth_limit, max_budget)
    out, lse = torch.ops.kdtr.verify_attn(q, kv_cache, prefix_len, tree_len, visibility, sm_scale, d_v)

Each op has two overloads:

- ``torch.ops.kdtr.<op>`` (``.default``): functional, returns fresh tensors (a tuple, in
  the order of :data:`OUTPUTS`); :func:`as_outputs` names them as a golden's
  ``expected.<name>`` for :func:`kdtr.testing.assert_conforms`.
- ``torch.ops.kdtr.<op>.out``: the same inputs, then keyword-only preallocated outputs
  (named as :data:`OUTPUTS`, greedy_step's with ``.`` as ``_``), written in place,
  returning nothing: an engine's static buffers. :func:`out_kwargs` makes them.

Schemas (:data:`SCHEMAS`): tensors as in docs/ops/<op>.md; ``max_budget`` an int
(greedy_step's optional: q's T - 1), ``sm_scale`` a float, ``d_v`` an int, ``kernel`` a
str ("auto" or the op's kernels). Kernels: CPU (host tensors, through the library's CPU
entries, zero-copy) and CUDA (the current stream; no host synchronisation, no copy, legal
in a CUDA graph capture); fake impls (shapes and dtypes, and the checks of
:func:`kdtr.kernels.output_specs`), so ``torch.compile(fullgraph=True)`` traces the ops
and ``torch.library.opcheck`` passes. The ops have no derivative (torch's autograd
fallback raises on a backward through them).

Bad arguments raise ``ValueError`` naming the argument (the :mod:`kdtr.kernels` checks,
eagerly and while tracing); an argument of the wrong type for the schema is torch's own
error. verify_attn's and greedy_step's per-request lengths are checked on the host for CPU
tensors (``ValueError``) and by the kernel on CUDA: NaN rows, and
:func:`kdtr.kernels.check` raises ``KernelError`` naming op, request and field.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from . import kernels
from .ops import OPS

__all__ = ["OUTPUTS", "SCHEMAS", "TORCH_OPS", "as_outputs", "out_kwargs"]

NAMESPACE = "kdtr"

TORCH_OPS = ("tree_build", "verify_attn", "tree_accept", "greedy_step")
"""The ops registered as torch operators (ddtree_decode has no library entry that runs on
CUDA yet, and none here)."""

OUTPUTS: dict[str, tuple[str, ...]] = {op: OPS[op].output_names for op in TORCH_OPS}
"""Each op's outputs in the order the functional op returns them (golden names)."""

_ARGS = {
    "tree_build": "Tensor top_log_probs, Tensor top_token_ids, Tensor root_token_ids, Tensor budget, "
                  "Tensor depth_limit, int max_budget, str kernel=\"auto\"",
    "verify_attn": "Tensor q, Tensor kv_cache, Tensor prefix_len, Tensor tree_len, Tensor visibility, "
                   "float sm_scale, int d_v, str kernel=\"auto\"",
    "tree_accept": "Tensor node_token_ids, Tensor next_token, Tensor next_sibling, Tensor node_count, "
                   "Tensor target_predict",
    "greedy_step": "Tensor top_log_probs, Tensor top_token_ids, Tensor root_token_ids, Tensor budget, "
                   "Tensor depth_limit, Tensor q, Tensor kv_cache, Tensor prefix_len, float sm_scale, int d_v, "
                   "Tensor target_predict, int? max_budget=None, str kernel=\"auto\"",
}


def _field(name: str) -> str:
    return name.replace(".", "_")


def _schemas(op: str) -> tuple[str, str]:
    outs = [_field(n) for n in OUTPUTS[op]]
    functional = f"{op}({_ARGS[op]}) -> (" + ", ".join(f"Tensor {n}" for n in outs) + ")"
    letters = [chr(ord("a") + i) for i in range(len(outs))]
    mutable = ", ".join(f"Tensor({a}!) {n}" for a, n in zip(letters, outs))
    return functional, f"{op}.out({_ARGS[op]}, *, {mutable}) -> ()"


SCHEMAS: dict[str, tuple[str, str]] = {op: _schemas(op) for op in TORCH_OPS}
"""op -> (functional schema, out schema)."""


def as_outputs(op: str, result: Sequence[torch.Tensor]) -> kernels.Outputs:
    """The functional op's tuple as a dict named as the golden's ``expected.<name>``."""
    return kernels.Outputs(zip(OUTPUTS[op], result))


def out_kwargs(op: str, outputs: Any) -> dict[str, torch.Tensor]:
    """The keyword arguments of ``torch.ops.kdtr.<op>.out`` from a dict of outputs named
    as the golden's (:func:`kdtr.kernels.empty_outputs`, or a previous result)."""
    return {_field(n): outputs[n] for n in OUTPUTS[op]}


# ---------------------------------------------------------------------------------------
# The kernels
# ---------------------------------------------------------------------------------------

_INPUTS = {op: kernels._DEFS[op].names for op in TORCH_OPS}
_HAS_SCALE = {"verify_attn", "greedy_step"}


def _np(t: torch.Tensor) -> np.ndarray:
    """A host tensor's numpy view (zero-copy; bf16 as ml_dtypes.bfloat16)."""
    t = t.detach()
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _split(op: str, args: tuple, kw: dict) -> tuple[tuple, dict]:
    """(tensor inputs in order, the scalars as kdtr.kernels takes them) from a call."""
    names = _INPUTS[op]
    if op == "tree_build":
        *tensors, n = args[:6]
        return tuple(tensors), {"n": n, "kernel": kw.get("kernel", args[6] if len(args) > 6 else "auto")}
    if op == "tree_accept":
        return tuple(args[:5]), {}
    if op == "verify_attn":
        return tuple(args[:5]), {"sm_scale": args[5], "d_v": args[6],
                                 "kernel": kw.get("kernel", args[7] if len(args) > 7 else "auto")}
    rest = args[11:]
    n = kw.get("max_budget", rest[0] if rest else None)
    kernel = kw.get("kernel", rest[1] if len(rest) > 1 else "auto")
    assert len(names) == 9
    return tuple(args[:8]) + (args[10],), {"sm_scale": args[8], "d_v": args[9], "n": n, "kernel": kernel}


def _check_host(op: str, tensors: tuple, scalars: dict) -> dict[str, tuple[str, tuple]]:
    """The torch-side checks of host tensors (torch's words: dtype names, .contiguous());
    the output specs."""
    inputs = dict(zip(_INPUTS[op], tensors))
    if "d_v" in scalars:
        inputs["d_v"] = scalars["d_v"]
    return kernels.output_specs(op, inputs, max_budget=scalars.get("n"))


def _parser(op: str):
    """args, kw of a call -> (tensors, kernel, max_budget, sm_scale, d_v). The dispatcher
    passes the schema's positional arguments positionally and may drop trailing ones that
    equal their defaults; a keyword is taken where one is given."""
    def general(args: tuple, kw: dict) -> tuple:
        tensors, sc = _split(op, args, kw)
        return tensors, sc.get("kernel", "auto"), sc.get("n"), sc.get("sm_scale"), sc.get("d_v")

    if op == "tree_build":
        def parse(args: tuple, kw: dict) -> tuple:
            if kw:
                return general(args, kw)
            return args[:5], args[6] if len(args) > 6 else "auto", args[5], None, None
    elif op == "verify_attn":
        def parse(args: tuple, kw: dict) -> tuple:
            if kw:
                return general(args, kw)
            return args[:5], args[7] if len(args) > 7 else "auto", None, args[5], args[6]
    elif op == "tree_accept":
        def parse(args: tuple, kw: dict) -> tuple:
            return args[:5], "auto", None, None, None
    else:
        def parse(args: tuple, kw: dict) -> tuple:
            if kw:
                return general(args, kw)
            n = len(args)
            return (args[:8] + (args[10],), args[12] if n > 12 else "auto", args[11] if n > 11 else None,
                    args[8], args[9])
    return parse


def _hot(op: str):
    """The call of the functional op (outs None) and of the out overload (outs the given
    tensors, in OUTPUTS order), CPU and CUDA alike: kdtr.kernels._torch_call, which for a
    signature planned before reads the tensors' class, contiguity, device, shape, dtype and
    data pointer and calls the entry once; else kdtr.kernels._torch_plan checks the call
    (ValueError naming the argument) and plans it, and the call is made again. None where
    that still declines (the caller's general path then runs: it raises the right error)."""
    parse = _parser(op)
    codes = {k: i for i, k in enumerate(("auto", *OPS[op].kernels))}
    call = kernels._torch_call

    def run(args: tuple, kw: dict, outs: list | None) -> list | None:
        tensors, kernel, n, scale, dv = parse(args, kw)
        code = codes.get(kernel)
        if code is not None:
            r = call(op, tensors, code, n, dv, scale, outs)
            if r is not None:
                return r
        code, n, dv = kernels._torch_plan(op, tensors, kernel, n, dv)
        return call(op, tensors, code, n, dv, scale, outs)

    return run


def _functional(op: str):
    run = _hot(op)

    def cuda_impl(*args: Any, **kw: Any) -> tuple[torch.Tensor, ...]:
        r = run(args, kw, None)
        if r is not None:
            return tuple(r)
        tensors, scalars = _split(op, args, kw)
        return tuple(kernels._run(op, tensors, poison=False, device="cuda", **scalars)[0])

    def cpu_impl(*args: Any, **kw: Any) -> tuple[torch.Tensor, ...]:
        r = run(args, kw, None)
        if r is not None:
            return tuple(r)
        tensors, scalars = _split(op, args, kw)
        specs = _check_host(op, tensors, scalars)
        dts = kernels._dtypes(True)
        outs = {n: torch.empty(shape, dtype=dts[dt]) for n, (dt, shape) in specs.items()}
        kernels._call(op, tuple(_np(t) for t in tensors), out={n: _np(t) for n, t in outs.items()}, poison=False,
                      device="cpu", lib=None, **scalars)
        return tuple(outs.values())

    def fake_impl(*args: Any, **kw: Any) -> tuple[torch.Tensor, ...]:
        tensors, scalars = _split(op, args, kw)
        if scalars.get("kernel", "auto") != "auto":
            kernels._kernel_code(op, scalars["kernel"])
        specs = _check_host(op, tensors, scalars)
        dts = kernels._dtypes(True)
        return tuple(tensors[0].new_empty(shape, dtype=dts[dt]) for dt, shape in specs.values())

    return cpu_impl, cuda_impl, fake_impl


def _check_outs(op: str, specs: dict, out: dict, device: torch.device) -> None:
    """The out overload's outputs, in torch's words: dtype, shape, device, contiguity."""
    dts = kernels._dtypes(True)
    for name, (dt, shape) in specs.items():
        t = out[name]
        where = f"{op}: {_field(name)}"
        if t.dtype != dts[dt]:
            raise ValueError(f"{where}: dtype {str(t.dtype).replace('torch.', '')}, expected {dt}")
        if tuple(t.shape) != tuple(shape):
            raise ValueError(f"{where}: shape {tuple(t.shape)}, expected {tuple(shape)}")
        if t.device != device:
            raise ValueError(f"{where}: on {t.device}, the inputs on {device}")
        if not t.is_contiguous():
            raise ValueError(f"{where}: not C-contiguous (row-major); pass a contiguous tensor")


def _out(op: str):
    fields = [_field(n) for n in OUTPUTS[op]]
    run = _hot(op)

    def gather(kw: dict) -> tuple[dict, dict]:
        kw = dict(kw)
        return {n: kw.pop(f) for n, f in zip(OUTPUTS[op], fields)}, kw

    def cuda_impl(*args: Any, **kw: Any) -> None:
        if run(args, {k: v for k, v in kw.items() if k not in fields}, [kw[f] for f in fields]) is not None:
            return
        out, kw = gather(kw)
        tensors, scalars = _split(op, args, kw)
        kernels._run(op, tensors, out=out, poison=False, device="cuda", **scalars)

    def cpu_impl(*args: Any, **kw: Any) -> None:
        if run(args, {k: v for k, v in kw.items() if k not in fields}, [kw[f] for f in fields]) is not None:
            return
        out, kw = gather(kw)
        tensors, scalars = _split(op, args, kw)
        _check_outs(op, _check_host(op, tensors, scalars), out, tensors[0].device)
        kernels._call(op, tuple(_np(t) for t in tensors), out={n: _np(t) for n, t in out.items()}, poison=False,
                      device="cpu", lib=None, **scalars)

    def fake_impl(*args: Any, **kw: Any) -> None:
        out, kw = gather(kw)
        tensors, scalars = _split(op, args, kw)
        _check_outs(op, _check_host(op, tensors, scalars), out, tensors[0].device)

    return cpu_impl, cuda_impl, fake_impl


_lib = torch.library.Library(NAMESPACE, "DEF")  # noqa: TOR901 - the ops' definitions, kept for the process
for _op, (_functional_schema, _out_schema) in SCHEMAS.items():
    _lib.define(_functional_schema)
    _lib.define(_out_schema)
    for _overload, _impls in (("", _functional(_op)), (".out", _out(_op))):
        _cpu, _cuda, _fake = _impls
        _lib.impl(_op + _overload, _cpu, "CPU")
        _lib.impl(_op + _overload, _cuda, "CUDA")
        torch.library.register_fake(f"{NAMESPACE}::{_op}{_overload}", _fake, lib=_lib)
