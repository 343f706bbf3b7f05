"""``kdtr run --graph``: a golden's requests captured in a CUDA graph at a padded batch and
replayed twice, as an engine runs an op (docs/harness.md, "Graph replay").

For a case of mode ``"graph"`` (:attr:`kdtr.run.cases.Case.mode`) :func:`build` writes the
binary's input file: two data sets of one padded shape (B, T and S each rounded up to the
smallest capture size above the golden's own, :func:`kdtr.compose.capture_size`, so that
there is always at least one padding request and one slot beyond T and S; the extra rows are
padding requests, :func:`kdtr.compose.padding_request`). The second replay's inputs are named
``input.<name>`` (the golden's requests in order, then the padding requests), the first
replay's ``replay1.<name>``: the same rows rotated by one over the whole batch, so that every
batch row holds another request in each replay (a live row becomes a padding one and a
padding row a live one, for any B, 1 included). The first replay's unfilled slots (padding
requests' stale inputs, slots beyond a request's own T or S) hold the poison of
:func:`kdtr.compose.batch` (NaN in floats, bytes 0x5a in integers and visibility); the
second's integer and visibility ones hold what the first left there (as an engine writes
its live slots over the last step's buffers), its float ones the poison again (a padding
request's outputs computed from stale floats, greedy_step's root attention, are then NaN:
on finite stale data only a tolerance could hold them, docs/ops/greedy_step.md). The
binary (``kdtr_<op> --graph``, docs/binaries.md "Graph replay") runs both sets on one set
of buffers, the outputs not cleared in between, and writes both replays' outputs
(``replay1.<name>``, ``<name>``).

:func:`judge` then holds, for each replay, the live requests (back in the golden's order) to
the golden's expected outputs under its contracts (:func:`kdtr.judge.judge`), and the
padding rows and the slots beyond each request's own T exactly to the documented values
(:func:`kdtr.compose.padding_outputs` of the padding rows, :func:`kdtr.compose.beyond_outputs`
for the slots beyond T; :func:`kdtr.compose.padding_mismatch`: a NaN matches any NaN; a
padding row's finite values of an allclose output under the golden's contract). PASS
only if all of it holds; the first failure names the replay, the request (or padding row)
and the output.

A golden with a request whose outputs may depend on T (:func:`kdtr.compose.t_sensitive`:
tree_build's budget over its N, tree_accept's node_count outside [0, T - 1]) keeps its own T:
only B and S are padded.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .. import compose, fsutil
from .. import format as kformat
from ..compare import TensorResult
from ..errors import KdtrError
from ..judge import Golden, Verdict, kernel_ran, output_limit
from ..judge import judge as judge_outputs
from ..ops import OPS
from ..status import Status
from ..vouch import load_private

__all__ = ["REPLAY1", "GraphPlan", "build", "judge"]

REPLAY1 = "replay1."
"""The prefix of the first replay's inputs in the binary's input file and of its outputs in
the binary's output file (docs/binaries.md, "Graph replay")."""

REPLAYS = 2

# The reference (kdtr.ops) of the padding outputs runs one at a time and on one BLAS thread:
# the cases of a run are judged in threads while binaries run, and OpenBLAS's thread pool
# (its threads spin while waiting) then oversubscribes the cores so badly that a reference
# call of a second takes minutes.
_REFERENCE_LOCK = threading.Lock()


def _openblas_threads() -> tuple[Any, Any] | None:
    """(set, get) of the OpenBLAS that numpy loaded (numpy's wheels bundle scipy-openblas),
    or None where there is none or it cannot be found."""
    try:
        with open("/proc/self/maps") as f:
            libs = sorted(set(re.findall(r"(/\S*openblas\S*\.so\S*)", f.read())))
        for lib in libs:
            dll = ctypes.CDLL(lib)
            for suffix in ("scipy_openblas_%s_num_threads64_", "openblas_%s_num_threads64_", "openblas_%s_num_threads"):
                if hasattr(dll, suffix % "set") and hasattr(dll, suffix % "get"):
                    return getattr(dll, suffix % "set"), getattr(dll, suffix % "get")
    except OSError:
        return None
    return None


@contextlib.contextmanager
def _one_reference_at_a_time() -> Iterator[None]:
    with _REFERENCE_LOCK:
        blas = _openblas_threads()
        before = blas[1]() if blas else None
        if blas:
            blas[0](1)
        try:
            yield
        finally:
            if blas and before:
                blas[0](int(before))


@dataclass
class GraphPlan:
    """What :func:`build` wrote and :func:`judge` needs.

    Attributes:
        path: the binary's input file.
        B, T, S: the golden's B, own T and S (S None for ops without a cache).
        Bp, Tp, Sp: the padded (captured) B, T and S.
        order: per replay, per batch row, the golden request it holds, or -1 for a padding
            request (replay 2: the requests in order, then padding; replay 1: that rotated
            by one row over all rows).
        reqs: per replay, the batch's requests row by row.
        inputs: per replay, the inputs of its data set (name without ``input.``).
        meta: the metadata the binary reads (op, config, max_budget, dtype).
    """

    path: Path
    B: int
    T: int
    S: int | None
    Bp: int
    Tp: int
    Sp: int | None
    order: list[list[int]]
    reqs: list[list[compose.Request]] = field(repr=False)
    inputs: list[dict[str, np.ndarray]] = field(repr=False)
    meta: dict[str, Any] = field(repr=False)

    def shape_text(self) -> str:
        s = f", S {self.S} -> {self.Sp}" if self.S is not None else ""
        return f"B {self.B} -> {self.Bp}, T {self.T} -> {self.Tp}{s}"


def build(golden: Golden, path: Path) -> GraphPlan:
    """Write the ``--graph`` input file of ``golden`` to ``path`` (atomically; its directory
    must exist) and return the plan.

    The padded shape: B, T and S each rounded up to the smallest capture size *above* the
    golden's own (:func:`kdtr.compose.capture_size` of B + 1, T + 1, S + 1; greedy_step's S
    to hold prefix_len + T at the padded T), so that every graph case has padding requests
    and slots beyond its own T and S whatever its B; T stays the golden's where a request's
    outputs may depend on it (:func:`kdtr.compose.t_sensitive`). Replay 2 holds the live
    requests in the golden's order, then the padding requests; replay 1 is that batch
    rotated by one row over all its rows (row i holds what row i + 1 holds in replay 2, the
    last row request 0), so that every batch row's request changes between the replays: a
    live row becomes padding and a padding row live. Replay 1's unfilled slots are the
    poison of :func:`kdtr.compose.batch`; replay 2's integer and visibility ones are replay
    1's values (an engine writes the live slots and the padding requests' fields over what
    the last step left), its float ones the poison.

    Raises:
        ValueError: the golden's inputs cannot be taken apart or batched (:mod:`kdtr.compose`),
            or it has no request.
        KdtrError, OSError: the file cannot be written.
    """
    op = golden.op
    reqs = compose.requests(op, golden.inputs, golden.metadata, source=golden.id)
    if not reqs:
        raise ValueError(f"{golden.id}: the golden has no request (B = 0): nothing to replay")
    b = len(reqs)
    t = reqs[0].T
    s = reqs[0].S
    bp = compose.capture_size(b + 1)
    tp = t if any(compose.t_sensitive(r) for r in reqs) else compose.capture_size(t + 1)
    pad = compose.padding_request(op, reqs[0])
    order2 = list(range(b)) + [-1] * (bp - b)
    order1 = [order2[(i + 1) % bp] for i in range(bp)]
    s_need = None
    if s is not None:  # the smallest S both batches need (greedy_step: prefix_len + T), rounded up
        need = max(int(r.S or 0) for r in reqs)
        if op == "greedy_step":
            need = max(need, max(int(r.arrays["prefix_len"]) for r in reqs) + tp)
        s_need = compose.capture_size(need + 1)
    batches = []
    stale = None
    for order in (order1, order2):
        rows = [reqs[i] if i >= 0 else pad for i in order]
        inputs, meta = compose.batch(op, rows, T=tp, S=s_need, stale=stale)
        batches.append((rows, inputs, meta))
        # replay 2's unfilled integer and visibility slots: what replay 1 left; its float
        # ones poison again (on finite stale floats a padding request's computed outputs,
        # greedy_step's root attention, would be held bit for bit to the reference's rounding)
        stale = {n: a for n, a in inputs.items() if a.ndim and a.dtype.kind in "biu"}
    meta = dict(batches[1][2])
    meta["config"] = golden.config
    tensors: dict[str, np.ndarray] = {}
    for name, arr in batches[1][1].items():
        tensors[f"input.{name}"] = arr
    for name, arr in batches[0][1].items():
        tensors[f"{REPLAY1}{name}"] = arr
    kformat.save(path, tensors, meta)
    return GraphPlan(path, b, t, s, bp, tp, s_need, [order1, order2], [batches[0][0], batches[1][0]],
                     [batches[0][1], batches[1][1]], meta)


def _read(out_path: str | os.PathLike) -> kformat.KdtrFile:
    # the output file holds two replays' outputs: twice what one run may write, plus a header
    return load_private(out_path, 2 * output_limit(), "a --graph output file (two replays' outputs)")


def _t_mask(dims: tuple[str, ...], shape: tuple[int, ...], t_own: int) -> np.ndarray | None:
    """Over one row of an output (dims without B): True where any T index is beyond the
    request's own T; None if the output has no T dim."""
    axes = [k for k, d in enumerate(dims) if d == "T"]
    if not axes:
        return None
    mask = np.zeros(shape, bool)
    for k in axes:
        idx = [slice(None)] * len(shape)
        idx[k] = slice(t_own, None)
        mask[tuple(idx)] = True
    return mask


def _padding_problems(plan: GraphPlan, k: int, outputs: dict[str, np.ndarray],
                     contracts: dict[str, Any] | None = None) -> list[str]:
    """Replay ``k`` (0-based): the padding rows and each live row's slots beyond its own T
    against the documented values (a padding request's under ``contracts``, the golden's:
    :func:`kdtr.compose.padding_mismatch`); one text per output that differs, naming the
    row."""
    op = plan.meta["op"]
    spec = OPS[op]
    problems: list[str] = []
    order = plan.order[k]
    pad_rows = [row for row, i in enumerate(order) if i < 0]
    live_rows = [row for row, i in enumerate(order) if i >= 0] if plan.Tp > plan.T else []
    rows = pad_rows + live_rows
    if not rows:
        return problems
    like = next(r for r in plan.reqs[k] if not r.is_padding)
    with _one_reference_at_a_time():
        # the padding rows: the reference on those rows of this replay's inputs; the slots
        # beyond a live request's own T: the documented values (a padding request's, so the
        # reference never runs on a live request, whatever its size)
        try:
            want = compose.padding_outputs(op, plan.inputs[k], plan.meta, pad_rows) if pad_rows else {}
            beyond = compose.beyond_outputs(op, like, plan.Tp) if live_rows else {}
        except ValueError as exc:  # (a limit of the reference): no padding value can be vouched for
            return [f"replay {k + 1}: the reference cannot say the padding values: {exc}"]
    for sp in spec.outputs:
        got_all = outputs[sp.name]
        for j, row in enumerate(rows):
            got = np.asarray(got_all[row])
            padding = order[row] < 0
            ref = np.asarray(want[sp.name][j] if padding else beyond[sp.name])
            if padding:
                what = f"padding request (batch row {row})"
            else:
                mask = _t_mask(sp.dims[1:], ref.shape, plan.T)
                if mask is None:
                    continue
                got = np.where(mask, got, ref) if got.shape == ref.shape else got
                what = f"request {order[row]} (batch row {row}) beyond its T = {plan.T}"
            bad = compose.padding_mismatch(sp.name, got, ref, (contracts or {}).get(sp.name) if padding else None)
            if bad is not None:
                problems.append(f"replay {k + 1}, {what}: {bad}")
                break  # one row per output is enough to act on
    return problems


def judge(plan: GraphPlan, golden: Golden, out_path: str | os.PathLike, *, kernel: str | None = None) -> Verdict:
    """The verdict of a ``--graph`` output file (``out_path``) on ``golden``.

    Each replay's live requests, back in the golden's order, are judged against the golden's
    expected outputs under its contracts (:func:`kdtr.judge.judge`); the padding rows and
    the slots beyond each request's own T must be the documented values exactly
    (:func:`kdtr.compose.padding_outputs`). ``kernel``: the forced kernel, which the
    output's metadata ``kernel`` must name (else ERROR).

    Returns:
        PASS; MISMATCH naming the replay, request and output (its ``results``: every
        output of each replay, named ``replay <k>: <name>``); ERROR for an unreadable
        output file, an output of another op or kernel, or a golden that cannot be judged.
    """
    try:
        out = _read(out_path)
    except (KdtrError, OSError) as exc:
        return Verdict(Status.ERROR, f"output file unreadable: {exc}")
    md = dict(out.metadata)
    if golden.problem:
        return Verdict(Status.ERROR, golden.problem, metadata=md)
    if md.get("op") != golden.op:
        return Verdict(Status.ERROR, f"the output's metadata op is {md.get('op')!r}, the golden's {golden.op!r}: "
                                     "an output of another op", metadata=md)
    if kernel is not None and not kernel_ran(kernel, md.get("kernel")):
        return Verdict(Status.ERROR, f"kernel {kernel} was forced but the output's metadata kernel is "
                                     f"{md.get('kernel')!r}: the binary ran another kernel", metadata=md)
    spec = OPS[golden.op]
    results: list[TensorResult] = []
    problems: list[str] = []
    for k in range(REPLAYS):
        prefix = REPLAY1 if k == 0 else ""
        outputs: dict[str, np.ndarray] = {}
        missing = []
        for sp in spec.outputs:
            arr = out.tensors.get(prefix + sp.name)
            shape_ok = arr is not None and arr.ndim == len(sp.dims) and arr.shape[0] == plan.Bp
            if not shape_ok:
                missing.append(prefix + sp.name)
            else:
                outputs[sp.name] = np.asarray(arr)
        if missing:
            what = "missing" if all(prefix + n not in out.tensors for n in missing) else "not of the padded batch"
            problems.append(f"replay {k + 1}: output {missing[0]} {what} (B = {plan.Bp} rows expected)")
            continue
        try:
            live = compose.live_outputs(golden.op, outputs, plan.reqs[k])
        except ValueError as exc:
            problems.append(f"replay {k + 1}: {exc}")
            continue
        by_request: list[dict[str, np.ndarray] | None] = [None] * plan.B
        for row, req in enumerate(plan.order[k]):
            if req >= 0:
                by_request[req] = live[row]
        if any(x is None for x in by_request):  # every request in every replay, or the verdict says nothing
            raise AssertionError(f"kdtr.run.graph: replay {k + 1} holds requests {plan.order[k]}, not 0..{plan.B - 1}")
        stacked = {name: np.stack([by_request[r][name] for r in range(plan.B)]) for name in live[0]}
        v = judge_outputs(golden, stacked)
        if v.status == Status.ERROR:
            return Verdict(Status.ERROR, f"replay {k + 1}: {v.reason}", metadata=md)
        for r in v.results:
            r.name = f"replay {k + 1}: {r.name}"
            if not r.ok:
                req = f", request {r.first[0].index[0]}" if r.first and r.first[0].index else ""
                problems.append(f"replay {k + 1}{req}: {r.summary()[len(f'replay {k + 1}: '):]}")
        results += v.results
        problems += _padding_problems(plan, k, outputs, golden.contracts)
    if problems:
        return Verdict(Status.MISMATCH, "; ".join(problems), results, md)
    return Verdict(Status.PASS, "", results, md)


def input_path(out_dir: Path, op: str, stem: str) -> Path:
    """Where the ``--graph`` input file of a case goes: ``<out_dir>/<op>/<stem>.graph-input.kdtr``
    (no link below ``out_dir`` followed; a previous file removed)."""
    fsutil.make_dirs(out_dir, op)
    path = out_dir / op / f"{stem}.graph-input.kdtr"
    fsutil.remove_stale_output(path)
    return path
