"""Batch composition: a golden's requests taken apart, padded and put together in other batches.

An engine runs an op on whatever requests share a step: in another order, next to other
requests, at a batch size rounded up to a CUDA-graph capture size (:func:`capture_size`),
with T and S padded, and with the unused batch rows filled by *padding requests*. A
request's outputs may depend on its own inputs only (docs/ops/<op>.md, "Invariance"), so
``kdtr run --invariance`` (:mod:`kdtr.run.invariance`) and ``kdtr run --graph``
(:mod:`kdtr.run.graph`) build those batches here:

- :func:`requests`: a golden's inputs and metadata as one :class:`Request` per batch row;
- :func:`compatible`: whether two requests may share a batch (same batch-level scalars);
- :func:`padding_request`: a request as engines fill an unused slot (docs/ops/<op>.md,
  "Padding requests");
- :func:`batch`: the inputs (and the metadata the binary reads) of a batch of requests at a
  chosen T and S, every slot beyond a request's own extent from ``stale`` or poison;
- :func:`live_outputs`: a batch's outputs cut back to each request's own rows and T;
- :func:`padding_outputs`: the documented outputs of padding rows and of the slots beyond a
  request's own T (the reference's values); :func:`beyond_outputs`: the latter alone,
  cheaply (the reference on one padding row);
- :func:`padding_mismatch`: the comparison those documented values are held to.

Dims. Every input of an op whose first dim is ``B`` is per request (its row, without the
``B`` dim, is one of the request's :attr:`Request.arrays`); a 0-d input (``sm_scale``,
``d_v``) and any other input without a leading ``B`` (ddtree_decode's weights) is
batch-level (:attr:`Request.scalars`, compared bit for bit). ``T`` (tree slots) and ``S`` (cache
rows) may differ between requests and are padded; every other named dim (``D``, ``K``,
``H``, ``Dqk``) must agree. tree_build's T is metadata ``max_budget`` + 1 (no input has a T
dim); a batch at T writes ``max_budget = T - 1``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .compare import compare
from .dtypes import DTYPE_BY_NAME, name_of_dtype
from .ops import OPS, OpSpec

__all__ = [
    "PADDING",
    "POISON_BYTE",
    "Request",
    "batch",
    "beyond_outputs",
    "capture_size",
    "compatible",
    "live_outputs",
    "padding_mismatch",
    "padding_outputs",
    "padding_request",
    "requests",
    "t_sensitive",
]

POISON_BYTE = 0x5A
"""Every byte of an integer (and visibility) slot that no request fills, when no ``stale``
data is given (the binaries poison their output buffers with the same byte)."""

PADDING = "padding"
"""The :attr:`Request.source` of a padding request."""

PADDED = ("T", "S")  # the dims a batch may pad beyond a request's own extent

# What a padding request holds (docs/ops/<op>.md, "Padding requests"): per op, the arrays
# an engine writes for an unused slot, as (name, value); every other per-request input is
# stale (whatever an earlier step left: absent from the request's arrays).
_PADDING_FILL: dict[str, tuple[tuple[str, int], ...]] = {
    "tree_build": (("top_token_ids", -1), ("root_token_ids", -1), ("budget", 0), ("depth_limit", 0)),
    "verify_attn": (("prefix_len", 0), ("tree_len", 0)),
    "tree_accept": (("node_token_ids", -1), ("next_token", -1), ("next_sibling", -1), ("node_count", 0),
                    ("target_predict", -1)),
    "greedy_step": (("top_token_ids", -1), ("root_token_ids", -1), ("budget", 0), ("depth_limit", 0),
                    ("prefix_len", 0), ("target_predict", -1)),
    "ddtree_decode": (("prefix_len", 0), ("root_token_ids", 0), ("budget", 0), ("depth_limit", 0)),
}


def capture_size(n: int) -> int:
    """The CUDA-graph capture size for ``n`` requests: the smallest power of two >= max(n, 1)
    (1, 2, 4, 8, ...)."""
    n = max(int(n), 1)
    return 1 << (n - 1).bit_length()


@dataclass(eq=False)
class Request:
    """One request of a golden (one batch row) or a padding request.

    Attributes:
        op: the op's name.
        source: where it comes from: ``"<op>/<config>#<row>"``, or ``"padding"``.
        arrays: each per-request input (name -> its row, without the leading B dim, a
            private copy). A padding request lacks the inputs that are stale (its floats):
            a batch takes those from ``stale`` or poison.
        scalars: the batch-level values that must agree for two requests to share a batch:
            the 0-d inputs (``sm_scale``, ``d_v``, as 0-d arrays), metadata ``max_budget``
            (tree_build, greedy_step) and ``dtype`` where present, the dtype of every input
            (``dtype.<name>``: a KDTR dtype name) and every dim other than B, T, S
            (``dim.D``, ``dim.K``, ``dim.H``, ``dim.Dqk``).
        T: the request's own T (its arrays' extent along T; tree_build: ``max_budget`` + 1).
        S: its own S (``kv_cache``'s rows) for verify_attn and greedy_step, else None.
    """

    op: str
    source: str
    arrays: dict[str, np.ndarray] = field(repr=False)
    scalars: dict[str, Any] = field(repr=False)
    T: int
    S: int | None = None

    @property
    def is_padding(self) -> bool:
        return self.source == PADDING


def _spec(op: str) -> OpSpec:
    if op not in OPS:
        raise ValueError(f"unknown op {op!r} (known: {', '.join(OPS)})")
    return OPS[op]


def _t_from_meta(spec: OpSpec) -> bool:
    """Whether the op's T comes from metadata max_budget alone (no input has a T dim)."""
    return "max_budget" in spec.metadata and not any("T" in s.dims for s in spec.inputs)


def requests(op: str, inputs: Mapping[str, np.ndarray], meta: Mapping[str, Any], source: str = "") -> list[Request]:
    """A golden's inputs as one :class:`Request` per batch row.

    Args:
        op: the op.
        inputs: input name (without ``input.``) -> array, as :attr:`kdtr.judge.Golden.inputs`.
        meta: the golden's metadata (``max_budget``, ``dtype``, ``op``, ``config`` read).
        source: the prefix of each request's source (default ``"<op>/<config>"``); row b's
            source is ``"<source>#<b>"``.

    Raises:
        ValueError: an unknown op, an input missing or not in the spec, a dtype the spec does
            not allow, dims that disagree (as :meth:`kdtr.ops.OpSpec.check`; each names the
            input), or ``max_budget`` missing or not an integer where the op reads it.
    """
    spec = _spec(op)
    missing = [s.name for s in spec.inputs if s.name not in inputs]
    if missing:
        raise ValueError(f"op {op}: input {missing[0]!r} missing")
    sizes: dict[str, int] = {}
    for s in spec.inputs:
        arr = np.asarray(inputs[s.name])
        dt = name_of_dtype(arr.dtype)
        if dt not in s.dtypes:  # (a padding request's -1 does not fit an unsigned type)
            raise ValueError(f"op {op}: input.{s.name}: dtype {dt}, spec says {s.dtype}")
        if arr.ndim != len(s.dims):
            raise ValueError(f"op {op}: input {s.name}: shape {list(arr.shape)}, spec says [{','.join(s.dims)}]")
        for d, n in zip(s.dims, arr.shape):
            if sizes.setdefault(d, int(n)) != n:
                raise ValueError(f"op {op}: input {s.name}: dim {d} = {n}, but {sizes[d]} elsewhere")
    scalars: dict[str, Any] = {}
    for key in ("max_budget", "dtype"):
        if key in spec.metadata or (key == "dtype" and key in meta):
            if key not in meta:
                raise ValueError(f"op {op}: metadata {key!r} missing")
            try:
                scalars[key] = int(meta[key]) if key == "max_budget" else str(meta[key])
            except (TypeError, ValueError, OverflowError) as exc:
                raise ValueError(f"op {op}: metadata {key} = {meta[key]!r}: not an integer") from exc
    for s in spec.inputs:
        arr = np.asarray(inputs[s.name])
        scalars[f"dtype.{s.name}"] = name_of_dtype(arr.dtype)
        if not s.dims or s.dims[0] != "B":
            scalars[s.name] = np.array(arr, copy=True)
    for d, n in sizes.items():
        if d not in ("B",) + PADDED:
            scalars[f"dim.{d}"] = n
    b = sizes.get("B", 0)
    t = int(scalars["max_budget"]) + 1 if _t_from_meta(spec) else sizes.get("T", 0)
    s_own = sizes.get("S")
    src = source or f"{op}/{meta.get('config', '?')}"
    out = []
    for r in range(b):
        arrays = {s.name: np.array(np.asarray(inputs[s.name])[r], copy=True) for s in spec.inputs
                  if s.dims and s.dims[0] == "B"}
        out.append(Request(op, f"{src}#{r}", arrays, dict(scalars), t, s_own))
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    return a == b


def compatible(a: Request, b: Request, *, ignore: Sequence[str] = ()) -> bool:
    """Whether ``a`` and ``b`` may share one batch: the same op and the same
    :attr:`Request.scalars` (0-d inputs compared bit for bit), except the keys in
    ``ignore`` (``("max_budget",)``: requests of goldens with other N, which a batch at a
    common T = N + 1 holds; :func:`t_sensitive` says which of them that changes)."""
    if a.op != b.op or set(a.scalars) != set(b.scalars):
        return False
    return all(_same(a.scalars[k], b.scalars[k]) for k in a.scalars if k not in ignore)


def padding_request(op: str, like: Request) -> Request:
    """A padding request, as engines fill an unused batch slot, that may share a batch with ``like``.

    tree_build: budget 0, depth_limit 0, root and top token ids -1, top_log_probs stale;
    verify_attn: prefix_len 0, tree_len 0, q, kv_cache and visibility stale; tree_accept:
    node_count 0, node_token_ids, target_predict, next_token and next_sibling -1;
    greedy_step: tree_build's, plus prefix_len 0 and target_predict -1, q and kv_cache
    stale; ddtree_decode: prefix_len 0, root token 0, budget and depth_limit 0 in every step
    (R root-only trees: the target's greedy tokens), kv_cache stale. Its own T is 1 (the
    root slot), its S 0 (verify_attn), 1 (greedy_step) or R (ddtree_decode), so every other
    slot of a batch is stale or poison. These are inputs each op's contract
    accepts (docs/ops/<op>.md, "Padding requests"): tree_build validates rows
    d < depth_limit only, so none with depth_limit 0.

    Raises:
        ValueError: an unknown op, or ``like`` of another op.
    """
    spec = _spec(op)
    if like.op != op:
        raise ValueError(f"padding_request: like is a {like.op} request, not {op}")
    t = 1
    # ddtree_decode: R steps of a root-only tree, one committed row each: S = R
    s_own = {"verify_attn": 0, "greedy_step": 1, "ddtree_decode": like.scalars.get("dim.R", 0)}.get(op)
    by_name = {s.name: s for s in spec.inputs}
    arrays: dict[str, np.ndarray] = {}
    for name, value in _PADDING_FILL[op]:
        s = by_name[name]
        shape = tuple(t if d == "T" else (s_own or 0) if d == "S" else like.scalars[f"dim.{d}"] for d in s.dims[1:])
        dt = np.asarray(like.arrays[name]).dtype
        arrays[name] = np.full(shape, value, dt)
    return Request(op, PADDING, arrays, dict(like.scalars), t, s_own)


def _poison(shape: tuple[int, ...], dt: np.dtype) -> np.ndarray:
    if np.issubdtype(dt, np.integer) or dt == np.bool_:
        return np.full(int(np.prod(shape, dtype=np.int64)) * dt.itemsize, POISON_BYTE, np.uint8).view(dt).reshape(shape)
    return np.full(shape, np.nan, dt)  # f32 / bf16: the canonical quiet NaN


def t_sensitive(req: Request) -> bool:
    """Whether the request's outputs may, by the op's contract, change at a larger T than its
    own: its validity is relative to T. tree_build, greedy_step: ``budget`` > N = T - 1
    (BAD_BUDGET under its own N, valid under a larger one); tree_accept: ``node_count``
    outside [0, T - 1] (BAD_NODE_COUNT); verify_attn: ``tree_len`` > T (outside the op's
    domain). Such a request is kept out of compositions at a larger T."""
    if req.is_padding:
        return False
    if req.op in ("tree_build", "greedy_step"):
        return int(req.arrays["budget"]) > req.T - 1
    if req.op == "tree_accept":
        return not 0 <= int(req.arrays["node_count"]) <= req.T - 1
    if req.op == "verify_attn":
        return int(req.arrays["tree_len"]) > req.T
    return False


def batch(op: str, reqs: Sequence[Request], *, T: int | None = None, S: int | None = None,
          stale: Mapping[str, np.ndarray] | None = None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The inputs of a batch of ``reqs`` (in order) and the metadata the binary reads.

    Args:
        op: the op.
        reqs: the requests, one per batch row (B = len(reqs) >= 1); all compatible, but
            for ``max_budget`` (the batch's is T - 1).
        T: the batch's T (default: the largest own T); at least every request's own T.
            tree_build, greedy_step: metadata ``max_budget`` = T - 1.
        S: the batch's S (verify_attn, greedy_step; default: the smallest that holds every
            request: the largest own S, and greedy_step also max prefix_len + T, which its
            binary requires).
        stale: input name -> an array of the batch's shape (what an earlier replay left):
            where given, every slot a request does not fill (beyond its own T or S, or an
            input a padding request lacks) holds its value; else the poison: NaN for floats,
            bytes 0x5a for integers and visibility.

    Returns:
        (inputs, metadata): input name -> array of the batch; metadata ``op``,
        ``max_budget`` (where the op reads it) and ``dtype`` (where the requests carry it).

    Raises:
        ValueError: no requests, requests of another op or not compatible, T or S smaller
            than a request's own, greedy_step's S smaller than prefix_len + T, a stale array
            of another shape or dtype.
    """
    spec = _spec(op)
    if not reqs:
        raise ValueError("batch: no requests")
    first = reqs[0]
    for r in reqs:
        if r.op != op:
            raise ValueError(f"batch: {r.source} is a {r.op} request, not {op}")
        if not compatible(first, r, ignore=("max_budget",)):
            raise ValueError(f"batch: {r.source} cannot share a batch with {first.source}: batch-level values differ")
    own_t = max(r.T for r in reqs)
    t = own_t if T is None else int(T)
    if t < own_t:
        raise ValueError(f"batch: T = {t} is smaller than a request's own T ({own_t})")
    s_val: int | None = None
    if any("S" in sp.dims for sp in spec.inputs):
        own_s = max(int(r.S or 0) for r in reqs)
        need = own_s
        if op == "greedy_step":
            need = max(need, max(int(r.arrays["prefix_len"]) for r in reqs) + t)
        s_val = need if S is None else int(S)
        if s_val < need:
            raise ValueError(f"batch: S = {s_val} is smaller than the requests need ({need})")
    b = len(reqs)
    sizes = {k[len("dim."):]: v for k, v in first.scalars.items() if k.startswith("dim.")}
    sizes.update({"B": b, "T": t})
    if s_val is not None:
        sizes["S"] = s_val
    out: dict[str, np.ndarray] = {}
    for sp in spec.inputs:
        dt = DTYPE_BY_NAME[first.scalars[f"dtype.{sp.name}"]].numpy
        if not sp.dims or sp.dims[0] != "B":
            out[sp.name] = np.array(first.scalars[sp.name], dtype=dt, copy=True)
            continue
        shape = tuple(sizes[d] for d in sp.dims)
        if stale is not None and sp.name in stale:
            st = np.asarray(stale[sp.name])
            if st.shape != shape or st.dtype != dt:
                raise ValueError(f"batch: stale {sp.name} is {st.dtype} {list(st.shape)}, the batch's "
                                 f"{np.dtype(dt)} {list(shape)}")
            arr = np.array(st, copy=True)
        else:
            arr = _poison(shape, np.dtype(dt))
        for i, r in enumerate(reqs):
            if sp.name not in r.arrays:
                continue
            row = r.arrays[sp.name]
            arr[(i,) + tuple(slice(0, n) for n in row.shape)] = row
        out[sp.name] = arr
    meta: dict[str, Any] = {"op": op}
    if "max_budget" in spec.metadata:
        meta["max_budget"] = t - 1
    if "dtype" in first.scalars:
        meta["dtype"] = first.scalars["dtype"]
    return out, meta


def live_outputs(op: str, outputs: Mapping[str, np.ndarray], reqs: Sequence[Request]) -> list[dict[str, np.ndarray]]:
    """Per request (batch row i = ``reqs[i]``), its outputs cut to its own T (and its own S, for
    an output with an S dim: ddtree_decode's final_kv_cache): what a golden of that request
    alone would hold (views into ``outputs``).

    Raises:
        ValueError: an output missing, or with fewer rows than ``reqs``.
    """
    spec = _spec(op)
    res: list[dict[str, np.ndarray]] = [{} for _ in reqs]
    for sp in spec.outputs:
        if sp.name not in outputs:
            raise ValueError(f"live_outputs: output {sp.name!r} missing")
        arr = np.asarray(outputs[sp.name])
        if arr.ndim != len(sp.dims) or arr.shape[0] < len(reqs):
            raise ValueError(f"live_outputs: {sp.name} has shape {list(arr.shape)}, not [{len(reqs)},...]")
        for i, r in enumerate(reqs):
            row = arr[i]
            idx = tuple(slice(0, r.T) if d == "T" else slice(0, r.S) if d == "S" and r.S is not None
                        else slice(None) for d in sp.dims[1:])
            res[i][sp.name] = row[idx]
    return res


def padding_outputs(op: str, inputs: Mapping[str, np.ndarray], meta: Mapping[str, Any],
                    rows: Sequence[int]) -> dict[str, np.ndarray]:
    """The documented outputs of batch rows ``rows`` of a batch (``inputs``, ``meta`` as
    :func:`batch` returns them): the reference's (:mod:`kdtr.ops`) values, at the batch's
    full T, one row per entry of ``rows`` in that order.

    For a padding row every value is documented (docs/ops/<op>.md, "Padding requests"); for a
    request's row only the slots beyond its own T are (the reference's padding: -1, 0,
    visibility 0, out 0 and lse -inf). Compare with :func:`padding_mismatch`.

    Raises:
        ValueError: a row outside the batch; as the op's reference.
    """
    spec = _spec(op)
    b = None
    for sp in spec.inputs:
        if sp.dims and sp.dims[0] == "B":
            b = int(np.asarray(inputs[sp.name]).shape[0])
            break
    rows = [int(r) for r in rows]
    for r in rows:
        if b is None or not 0 <= r < b:
            raise ValueError(f"padding_outputs: row {r} outside the batch (B = {b})")
    sub = {}
    for sp in spec.inputs:
        arr = np.asarray(inputs[sp.name])
        sub[sp.name] = arr[rows] if sp.dims and sp.dims[0] == "B" else arr
    with np.errstate(all="ignore"):
        return spec.reference(sub, meta)


def beyond_outputs(op: str, like: Request, T: int, S: int | None = None) -> dict[str, np.ndarray]:
    """The documented values of a request's slots beyond its own T (>= 1) in a batch at ``T``
    (and, with ``S``, beyond its own S in a batch at ``S``: ddtree_decode's final cache rows, 0):
    per output, one row (without the B dim) at the batch's T, whose slots at index >= the
    request's own T (in every T dim) are those values: -1 in tree_build's and tree_accept's
    slot outputs, 0 in visibility, out 0 and lse -inf.

    They are a padding request's (whose every slot >= 1 holds them), so the reference runs on
    one padding row only: cheap whatever the size of ``like``. Holds for a request whose
    outputs do not depend on T (:func:`t_sensitive` false).

    Raises:
        ValueError: as :func:`padding_request` and :func:`batch`.
    """
    pad = padding_request(op, like)
    inputs, meta = batch(op, [pad], T=T, S=S)
    with np.errstate(all="ignore"):
        ref = _spec(op).reference(inputs, meta)
    return {k: np.asarray(v)[0] for k, v in ref.items()}


def padding_mismatch(name: str, got: np.ndarray, want: np.ndarray, contract: Any = None) -> str | None:
    """None if ``got`` holds the documented values ``want`` (same dtype and shape, equal bit
    for bit, except that a NaN matches any NaN: the reference's NaN is canonical, a kernel's
    payload is its own); else the first differing index and both values, in words.

    ``contract``: for a padding request's rows, the output's :class:`kdtr.contract.Contract`
    from the golden. Where it is ``allclose`` the finite documented values are held to it
    (:func:`kdtr.compare.compare`: a padding request's attention is a kernel result like a
    live request's, the reference's float64 value is not its bits), a documented NaN still
    to any NaN and every other non-finite value to itself. The slots beyond a request's own
    T (constants) are compared without one."""
    got, want = np.asarray(got), np.asarray(want)
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"{name}: {got.dtype} {list(got.shape)}, documented {want.dtype} {list(want.shape)}"
    if np.issubdtype(want.dtype, np.integer) or want.dtype == np.bool_:
        bad = got != want
    else:
        g, w = got.astype(np.float64), want.astype(np.float64)
        same = (g.view(np.uint64) == w.view(np.uint64)) | (np.isnan(g) & np.isnan(w))
        if contract is not None and getattr(contract, "kind", "exact") == "allclose":
            near = np.isfinite(w) & np.isfinite(g)
            if near.any():
                r = compare(name, want[near], got[near], contract)
                if not r.ok:
                    return (f"{name}: {r.n_mismatch} of {int(near.sum())} finite values outside allclose(atol="
                            f"{contract.atol:g}, rtol={contract.rtol:g}), max |difference| {r.max_abs:g}")
                same |= near
        bad = ~same
    if not bad.any():
        return None
    idx = tuple(int(i) for i in np.argwhere(bad)[0])
    def show(x: Any) -> str:  # a Python number (bf16 widened), not numpy's repr
        x = np.asarray(x)
        return repr(x.item() if x.dtype.kind in "biuf" else float(x))

    return f"{name}{list(idx)}: {show(got[idx])}, documented {show(want[idx])} ({int(bad.sum())} differ)"
