"""``kdtr run --invariance``: a golden's requests in other batch compositions, bit for bit.

A request's outputs may depend on its own inputs only (docs/ops/<op>.md, "Invariance"):
not on its batch row, the batch size, the other requests, nor T or S padding. For the
golden of an invariance case (:attr:`kdtr.run.cases.Case.mode` ``"invariance"``),
:func:`run_case` builds with :mod:`kdtr.compose`

- ``golden``: the golden as it is (its own composition, judged under its contracts);
- ``alone#i``: each request in a batch of 1;
- ``reversed``: the requests in reverse order;
- ``interleaved``: each request one row on (the first last), a padding request after each;
- ``mixed``: interleaved with the requests of other goldens of the op that may share a batch
  with them (:func:`kdtr.compose.compatible`), when there are any;
- ``padded T=.. S=..``: at a larger T (and S): the next capture size above T (and above the S
  the batch needs), and T + 1 (S + 3), not a power of two;
- ``dup+pad B=..``: a padding request, every request twice, padding requests up to the
  capture size above 2B + 1,

writes each as an input file under ``cfg.out_dir/invariance/<op>/<config>.<backend>[.<kernel>]/``
(removed again, but for the golden's own output, when the case passes), runs
the case's binary on all of them in one ``--batch`` process (one process each with
``--no-batch``; under a sanitizer, one each again when the batch drew a report, to name the
composition), forcing the case's kernel, and holds every request's outputs in every
composition byte for byte (NaN payloads included) to its outputs in ``golden``. The padding
rows and every slot beyond a request's own T must hold the documented values
(:func:`kdtr.compose.padding_outputs`).

A request whose validity is relative to T (:func:`kdtr.compose.t_sensitive`: a budget above
N, a node_count beyond T - 1) is kept out of the compositions at a larger T, where its
outputs may differ by the contract.

Status (docs/harness.md, "Invariance"): PASS when every request is bit-identical everywhere,
the padding values hold and the golden's own composition passes its contracts
(:func:`kdtr.judge.judge`); NOT_INVARIANT naming the request (``op/config#row``), the
output, both compositions and the first differing index; MISMATCH for a wrong own
composition or padding value; NOT_SUPPORTED, CRASH, TIMEOUT, ERROR as the eager runner.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .. import compose, fsutil
from .. import format as kformat
from ..errors import KdtrError
from ..judge import Golden, GoldenError, judge, kernel_ran, read_output
from ..ops import OPS
from ..status import Status
from .cases import SANITIZER_EXIT, Case, RunConfig, binary_of, missing_binary
from .process import (
    _BATCH_LINE,
    EXIT_NOT_SUPPORTED,
    _backend_args,
    _exit_status,
    _new_result,
    _Prepared,
    _sanitizer_errors,
    _sanitizer_prefix,
    _stream_binary,
    _tail,
    _waive,
    forced_kernel_name,
)
from .results import CaseResult

__all__ = ["Composition", "compositions", "run_case"]

GOLDEN = "golden"
MAX_MIXED_GOLDENS = 3  # other goldens whose requests a "mixed" composition takes


@dataclass
class Composition:
    """One batch of requests, as the binary runs it.

    Attributes:
        name: ``"golden"``, ``"alone#3"``, ``"reversed"``, ``"mixed"``, ``"padded T=64 S=128"``,
            ``"dup+pad B=16"``.
        rows: the batch rows in order (:class:`kdtr.compose.Request`).
        own: per row, the index of the golden's request it is, or -1 (another golden's or a
            padding request).
        inputs, meta: the batch (:func:`kdtr.compose.batch`).
        note: what else it holds, in words (``"+4 requests of verify_attn/small"``).
        T: the batch's T (at least every row's own).
    """

    name: str
    rows: list[compose.Request]
    own: list[int]
    inputs: dict[str, np.ndarray] = field(repr=False)
    meta: dict[str, Any] = field(repr=False)
    note: str = ""
    T: int = 0  # the batch's T (0: the largest own T of its rows)

    def __post_init__(self) -> None:
        self.T = self.T or max(r.T for r in self.rows)


def _other_requests(golden: Golden, cfg: RunConfig, like: compose.Request) -> tuple[list[compose.Request], list[str]]:
    """Requests of other goldens of the op (same directory, file-name order) that may share a
    batch with ``like``: up to :data:`MAX_MIXED_GOLDENS` goldens, and the ids used."""
    found: list[compose.Request] = []
    used: list[str] = []
    for path in sorted(golden.path.parent.glob("*.kdtr")):
        if len(used) >= MAX_MIXED_GOLDENS:
            break
        if path == golden.path or path in cfg.golden_problems:
            continue
        try:
            other = Golden.read(path, cfg.vouched.get(path), op=golden.op)
            reqs = compose.requests(other.op, other.inputs, other.metadata, source=other.id)
        except (GoldenError, ValueError):
            continue  # a golden that cannot be a filler is that golden's own case's problem
        mine = [r for r in reqs if compose.compatible(like, r, ignore=("max_budget",))]
        if mine:
            found += mine
            used.append(other.id)
    return found, used


def _s_of(golden: Golden) -> int | None:
    kv = golden.inputs.get("kv_cache")
    return None if kv is None else int(kv.shape[1])


def compositions(golden: Golden, cfg: RunConfig | None = None) -> tuple[list[Composition], list[str]]:
    """The compositions of ``golden`` (module docstring), ``golden`` first, and notes in words
    (requests kept out of the larger T, compositions left out).

    Args:
        golden: the golden.
        cfg: where the other goldens of a ``mixed`` composition come from (its vouched
            bytes); None: no ``mixed`` composition.

    Raises:
        ValueError: the golden's inputs are not those of its op (:func:`kdtr.compose.requests`).
    """
    op = golden.op
    reqs = compose.requests(op, golden.inputs, golden.metadata, source=golden.id)
    b = len(reqs)
    notes: list[str] = []
    if not reqs:
        raise ValueError("the golden holds no request (B = 0)")
    out = [Composition(GOLDEN, list(reqs), list(range(b)), dict(golden.inputs), dict(golden.metadata))]
    t_own = max(r.T for r in reqs)
    sens = [i for i, r in enumerate(reqs) if compose.t_sensitive(r)]
    if sens:
        notes.append(f"{len(sens)} request(s) kept at their own T (validity relative to T): "
                     + ", ".join(f"#{i}" for i in sens[:8]) + (" ..." if len(sens) > 8 else ""))

    def add(name: str, idx: list[int | compose.Request], *, T: int | None = None, S: int | None = None,
            note: str = "") -> None:
        rows = [reqs[i] if isinstance(i, int) else i for i in idx]
        own = [i if isinstance(i, int) else -1 for i in idx]
        inputs, meta = compose.batch(op, rows, T=T, S=S)
        out.append(Composition(name, rows, own, inputs, meta, note, T or 0))

    for i in range(b):
        add(f"alone#{i}", [i])
    if b > 1:
        add("reversed", list(range(b))[::-1])
    pad = compose.padding_request(op, reqs[0])
    # every request one row on (the first last), each followed by a padding request
    add("interleaved", [x for i in [*range(1, b), 0] for x in (i, pad)])
    at_larger_t = [i for i in range(b) if i not in sens]
    if cfg is not None:
        others, used = _other_requests(golden, cfg, reqs[0])
        if others:
            fill = others[:b]
            # requests kept at their own T: only where the mixed batch's T is theirs
            mine = list(range(b)) if max(r.T for r in fill) <= t_own else at_larger_t
            idx: list[int | compose.Request] = []
            for k in range(max(len(mine), len(fill))):
                if k < len(mine):
                    idx.append(mine[k])
                if k < len(fill):
                    idx.append(fill[k])
            if mine:
                add("mixed", idx, note=f"+{len(fill)} request(s) of {', '.join(used)}")
        else:
            notes.append("no mixed composition: no other golden of the op may share a batch with it")
    if at_larger_t:
        s_own = _s_of(golden)
        sub = [reqs[i] for i in at_larger_t]
        for t in (compose.capture_size(t_own + 1), t_own + 1):
            s = None
            if s_own is not None:
                need = s_own  # greedy_step: its binary wants prefix_len + T <= S
                if op == "greedy_step":
                    need = max(need, max(int(r.arrays["prefix_len"]) for r in sub) + t)
                s = compose.capture_size(need + 1) if t > t_own + 1 else need + 3
            add(f"padded T={t}" + (f" S={s}" if s is not None else ""), list(at_larger_t), T=t, S=s)
    total = compose.capture_size(2 * b + 1)
    idx2: list[int | compose.Request] = [pad, *range(b), *range(b)]
    idx2 += [pad] * (total - len(idx2))
    add(f"dup+pad B={total}", idx2)
    return out, notes


def _bits(a: np.ndarray) -> np.ndarray:
    a = np.array(a, copy=True, order="C")  # (np.ascontiguousarray makes a 0-d array 1-d)
    return a.view(f"u{a.dtype.itemsize}") if a.dtype.itemsize in (1, 2, 4, 8) else a.view(np.uint8)


def _value(x: Any) -> str:
    return repr(np.asarray(x).item()) if np.asarray(x).dtype.kind in "biuf" else repr(float(np.asarray(x)))


def _first_diff(a: np.ndarray, b: np.ndarray) -> str | None:
    """None if ``a`` and ``b`` are equal byte for byte (dtype, shape, every bit), else the
    first differing index with both values and their bits."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return f"{a.dtype} {list(a.shape)} vs {b.dtype} {list(b.shape)}"
    ua, ub = _bits(a), _bits(b)
    bad = ua != ub
    if not bad.any():
        return None
    i = tuple(int(x) for x in np.argwhere(bad)[0]) if bad.ndim else ()
    w = 2 * a.dtype.itemsize
    return (f"at {list(i)}: {_value(a[i])} (0x{int(ua[i]):0{w}x}) vs {_value(b[i])} (0x{int(ub[i]):0{w}x}); "
            f"{int(bad.sum())} of {bad.size} elements differ")


@dataclass
class _Ran:
    """What the binary did with one composition: its exit code and message (None: no
    result, the process stopped before it), and its output path."""

    out: Path
    inp: Path
    rc: int | None = None
    msg: str = ""


def _scratch(case: Case, cfg: RunConfig) -> Path:
    kernel = f".{case.kernel}" if case.kernel else ""
    return fsutil.make_dirs(cfg.out_dir, Path("invariance") / case.op / f"{case.config}.{case.backend}{kernel}")


def _file_name(k: int, name: str) -> str:
    safe = "".join(ch if ch.isalnum() else "_" for ch in name).strip("_")
    return f"{k:03d}_{safe}"


def _command(case: Case, cfg: RunConfig, binary: Path, runs: list[_Ran], batch: bool) -> list[str]:
    cmd = [*_sanitizer_prefix(case, cfg), str(binary)] + (["--batch"] if batch else [])
    for r in runs:
        cmd += ["--input", str(r.inp), "--output", str(r.out)]
    return cmd + _backend_args(case, cfg)


def _run_batch(case: Case, cfg: RunConfig, binary: Path, runs: list[_Ran]) -> tuple[int | None, str, str]:
    """One ``--batch`` process over ``runs`` (each gets its rc and message from its batch
    line); returns the process's exit code (None: killed for the timeout), stdout, stderr."""
    seen: set[int] = set()

    def on_line(line: str) -> None:
        m = _BATCH_LINE.fullmatch(line)
        if m is None:
            return
        k = int(m[1])
        if k < len(runs) and k not in seen:
            seen.add(k)
            msg = m[4][:2000]
            runs[k].rc, runs[k].msg = int(m[2]), f"{binary.name}: {msg}" if msg else ""

    run = _stream_binary(_command(case, cfg, binary, runs, True), cfg.timeout, on_line)
    return run.returncode, run.stdout, run.stderr


def _run_one(case: Case, cfg: RunConfig, binary: Path, r: _Ran) -> tuple[int | None, str, str]:
    run = _stream_binary(_command(case, cfg, binary, [r], False), cfg.timeout)
    r.rc = run.returncode
    lines = run.stderr.strip().splitlines()
    r.msg = lines[-1] if lines else ""
    return run.returncode, run.stdout, run.stderr


def _fail(res: CaseResult, status: Status, reason: str) -> CaseResult:
    res.status, res.reason = status, reason
    return res


def _execute(case: Case, cfg: RunConfig, res: CaseResult, binary: Path, runs: list[_Ran],
             names: list[str]) -> bool:
    """Run the binary on every composition; False (and ``res`` holding the failure) when
    some composition has no usable output."""
    p = _Prepared(case, res, None, binary, runs[0].out, time.monotonic())  # type: ignore[arg-type]
    res.process = "batch" if cfg.batch else "single"
    res.command = _command(case, cfg, binary, runs, cfg.batch)
    if cfg.batch:
        rc, stdout, stderr = _run_batch(case, cfg, binary, runs)
        res.stderr = _tail(stderr)
        if rc == SANITIZER_EXIT and _sanitizer_prefix(case, cfg):
            for r, name in zip(runs, names):  # one process each, to name the composition
                rc1, out1, err1 = _run_one(case, cfg, binary, r)
                if rc1 == SANITIZER_EXIT:
                    res.stderr = _tail(err1)
                    return not _fail(res, Status.CRASH, f"composition {name!r}: compute-sanitizer {cfg.sanitizer} "
                                                        f"reported errors: {_sanitizer_errors(out1)}")
                if rc1 is None:
                    return not _fail(res, Status.TIMEOUT, f"composition {name!r}: killed after {cfg.timeout:g} s")
            return not _fail(res, Status.CRASH, f"compute-sanitizer {cfg.sanitizer} reported errors in the batch of "
                                                f"compositions, none alone: {_sanitizer_errors(stdout)}")
    else:
        rc = 0
        for k, r in enumerate(runs):
            rc1, _, stderr = _run_one(case, cfg, binary, r)
            res.stderr = _tail(stderr)
            # go on past a composition its kernel does not apply to (exit 3), not past the golden's
            if rc1 != 0 and (rc1 != EXIT_NOT_SUPPORTED or k == 0):
                rc = rc1
                break
    for r, name in zip(runs, names):
        if r.rc is None:  # the process stopped before this composition's result
            if rc is None:
                return not _fail(res, Status.TIMEOUT, f"composition {name!r}: killed after {cfg.timeout:g} s")
            last = res.stderr.strip().splitlines()[-1] if res.stderr.strip() else "(no message)"
            how = _exit_status(p, cfg, rc, last) if rc < 0 else None
            why = how[1] if how is not None else f"exit {rc}: {last}"
            return not _fail(res, Status.CRASH, f"composition {name!r}: no result, the process stopped: {why}")
        st = _exit_status(p, cfg, r.rc, r.msg or "(no message)")
        if st is None:
            continue
        status, why = st
        if name == GOLDEN or status != Status.NOT_SUPPORTED:
            prefix = "" if name == GOLDEN and status == Status.NOT_SUPPORTED else f"composition {name!r}: "
            return not _fail(res, status, prefix + why)
    if cfg.batch:  # a batch exits with its first nonzero result code; anything else went wrong after the last
        expected = next((r.rc for r in runs if r.rc), 0)
        if rc != expected:
            how = _exit_status(p, cfg, rc, "") if rc is not None and rc < 0 else None
            why = how[1] if how is not None else f"exit {rc}"
            return not _fail(res, Status.CRASH, f"the batch process ended after its last composition: {why} (its "
                                                f"results said {expected})")
    return True


def _load(path: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    f = read_output(path)
    return dict(f.tensors), dict(f.metadata)


def run_case(case: Case, cfg: RunConfig) -> CaseResult:
    """Run invariance case ``case`` (module docstring) and return its result; never raises
    for the case's own failures (a harness error is the caller's ERROR)."""
    res = _new_result(case, cfg)
    if "--invariance" not in res.rerun:
        res.rerun += " --invariance"
    t0 = time.monotonic()
    try:
        _run(case, cfg, res)
    finally:
        res.seconds = time.monotonic() - t0
    return _waive(res, cfg)


def _run(case: Case, cfg: RunConfig, res: CaseResult) -> None:
    if case.golden in cfg.golden_problems:
        _fail(res, Status.ERROR, cfg.golden_problems[case.golden])
        return
    try:
        golden = cfg.goldens.get(case, cfg)
    except GoldenError as exc:
        _fail(res, Status.ERROR, str(exc))
        return
    binary = binary_of(cfg, case.op)
    if not binary.exists():
        _fail(res, Status.ERROR, missing_binary(cfg.bin_dir, case.op))
        return
    res.golden = golden
    if golden.problem:
        _fail(res, Status.ERROR, golden.problem)
        return
    try:
        comps, notes = compositions(golden, cfg)
    except ValueError as exc:
        _fail(res, Status.ERROR, f"cannot compose the requests of {golden.path}: {exc}")
        return
    try:
        scratch = _scratch(case, cfg)
        runs: list[_Ran] = []
        for k, c in enumerate(comps):
            stem = _file_name(k, c.name)
            inp, out = scratch / f"{stem}.input.kdtr", scratch / f"{stem}.output.kdtr"
            fsutil.remove_stale_output(out)
            if c.name == GOLDEN:
                inp = case.golden  # the golden as it is
            else:
                fsutil.remove_stale_output(inp)
                meta = {**c.meta, "config": case.config, "composition": c.name}
                kformat.save(inp, {f"input.{n}": a for n, a in c.inputs.items()}, meta)
            runs.append(_Ran(out, inp))
    except (OSError, KdtrError) as exc:
        _fail(res, Status.ERROR, f"cannot write the compositions: {exc}")
        return
    res.output_file = str(runs[0].out)
    names = [c.name for c in comps]
    if not _execute(case, cfg, res, binary, runs, names):
        _void_if_changed(res, golden)
        return
    _judge(case, cfg, res, golden, comps, runs, notes)
    _void_if_changed(res, golden)
    if res.status in (Status.PASS, Status.NOT_SUPPORTED):  # a failing case keeps its files to look at
        for r in runs[1:]:
            for path in (r.inp, r.out):
                try:
                    path.unlink()
                except FileNotFoundError:
                    pass


def _void_if_changed(res: CaseResult, golden: Golden) -> None:
    why = golden.changed()
    if why is not None:
        was = f"{res.status}" + (f": {res.reason}" if res.reason else "")
        _fail(res, Status.ERROR, f"golden changed while its case ran ({why}); a test binary must not write to "
                                 f"its --input (docs/harness.md); the verdict it voids: {was}")


def _judge(case: Case, cfg: RunConfig, res: CaseResult, golden: Golden, comps: list[Composition],
           runs: list[_Ran], notes: list[str]) -> None:
    """Each composition's output, one at a time (only the golden's own is kept), against the
    golden's own per request, and its padding rows and slots beyond a request's own T
    against the documented values; then the golden's own verdict; sets ``res``."""
    op = case.op
    forced = forced_kernel_name(case)
    skipped = [c.name for c, r in zip(comps, runs) if r.rc not in (0, None)]  # NOT_SUPPORTED there

    def load(c: Composition, r: _Ran) -> tuple[dict[str, np.ndarray], dict[str, Any]] | None:
        try:
            got = _load(r.out)
        except (KdtrError, OSError) as exc:
            _fail(res, Status.ERROR, f"composition {c.name!r}: output file unreadable: {exc}")
            return None
        if forced is not None and not kernel_ran(forced, got[1].get("kernel")):
            _fail(res, Status.ERROR, f"composition {c.name!r}: kernel {forced} was forced but the output's metadata "
                                     f"kernel is {got[1].get('kernel')!r}: the binary ran another kernel")
            return None
        return got

    first = load(comps[0], runs[0])
    if first is None:
        return
    base_t, base_md = first
    reqs = comps[0].rows
    base_problem = ""
    try:
        base = compose.live_outputs(op, base_t, reqs)
    except ValueError as exc:  # an output missing or of another shape: the judge below says which
        base, base_problem = None, f"composition 'golden': {exc}"
    differ: list[str] = []
    padding: list[str] = []
    beyond_cache: dict[tuple[int, int | None], dict[str, np.ndarray]] = {}
    for c, r in zip(comps[1:], runs[1:]):
        if base is None or r.rc != 0:
            continue
        got = load(c, r)
        if got is None:
            return
        differ += _differences(op, c, got, base, base_md, reqs)
        padding += _padding_differences(op, c, got[0], beyond_cache, golden.contracts)
    v = judge(golden, runs[0].out, kernel=forced)
    res.outputs = v.results
    detail = [f"{len(comps)} compositions: " + ", ".join(_summary(comps))]
    if skipped:
        detail.append("not supported here: " + ", ".join(repr(n) for n in skipped))
    detail += notes
    if forced is not None and "kernel" in v.metadata:
        detail.insert(0, f"ran {v.metadata['kernel']}")
    res.detail = "; ".join(detail)
    ran = [c.name for c, r in zip(comps[1:], runs[1:]) if r.rc == 0]
    if differ:
        more = f" (and {len(differ) - 1} more)" if len(differ) > 1 else ""
        own = "" if v.status == Status.PASS else f"; the golden's own composition: {v.status}: {v.reason}"
        _fail(res, Status.NOT_INVARIANT, differ[0] + more + own)
    elif v.status != Status.PASS:
        _fail(res, v.status, f"composition 'golden': {v.reason}")
    elif base_problem:
        _fail(res, Status.ERROR, base_problem)
    elif padding:
        more = f" (and {len(padding) - 1} more)" if len(padding) > 1 else ""
        _fail(res, Status.MISMATCH, "documented padding values differ: " + padding[0] + more)
    elif not ran:  # nothing was compared: no verdict on invariance
        _fail(res, Status.NOT_SUPPORTED, "no composition but the golden's own ran (each other one exit 3, not "
                                         "supported): nothing to compare its outputs with")
    else:
        _fail(res, Status.PASS, "")


def _differences(op: str, c: Composition, got: tuple[dict[str, np.ndarray], dict[str, Any]],
                 base: list[dict[str, np.ndarray]], base_md: dict[str, Any], reqs: list[compose.Request]) -> list[str]:
    """Per request of the golden in composition ``c``: its first output that differs, bit
    for bit, from the golden's own composition (at most one line per request)."""
    try:
        live = compose.live_outputs(op, got[0], c.rows)
    except ValueError as exc:
        return [f"composition {c.name!r}: {exc}"]
    out = []
    k1, k2 = got[1].get("kernel"), base_md.get("kernel")
    kern = f" (kernels {k1!r} vs {k2!r})" if k1 != k2 else ""
    for row, i in enumerate(c.own):
        if i < 0:
            continue
        for s in OPS[op].outputs:
            d = _first_diff(live[row][s.name], base[i][s.name])
            if d is not None:
                out.append(f"{reqs[i].source}: {s.name} differs between composition {c.name!r} (row {row}) "
                           f"and 'golden' (row {i}){kern} {d}")
                break
    return out


def _padding_differences(op: str, c: Composition, got: dict[str, np.ndarray],
                         beyond_cache: dict[tuple[int, int | None], dict[str, np.ndarray]],
                         contracts: dict[str, Any] | None = None) -> list[str]:
    """The padding rows of ``c`` against :func:`kdtr.compose.padding_outputs` (the reference
    on those rows), and the slots beyond a request's own T against
    :func:`kdtr.compose.beyond_outputs` (a padding request's at the batch's T: the
    reference never runs on a live request here, whatever its size)."""
    spec = OPS[op]
    pad_rows = [k for k, r in enumerate(c.rows) if r.is_padding]
    # An op with an S-dim output (ddtree_decode's final_kv_cache) has slots beyond a
    # request's own S too; every other op's outputs have no S dim.
    s_out = any("S" in sp.dims for sp in spec.outputs)
    batch_s = next((int(np.shape(c.inputs[sp.name])[sp.dims.index("S")]) for sp in spec.inputs if "S" in sp.dims),
                   None) if s_out else None
    # (a filler of another golden whose validity is relative to T may be valid at this T)
    beyond = [k for k, r in enumerate(c.rows) if not r.is_padding and not compose.t_sensitive(r)
              and (r.T < c.T or (batch_s is not None and r.S is not None and r.S < batch_s))]
    key = (c.T, batch_s)
    out: list[str] = []
    try:
        doc = compose.padding_outputs(op, c.inputs, c.meta, pad_rows) if pad_rows else {}
        if beyond and key not in beyond_cache:
            beyond_cache[key] = compose.beyond_outputs(op, c.rows[beyond[0]], c.T, S=batch_s)
    except ValueError as exc:
        return [f"composition {c.name!r}: the reference cannot say the padding values: {exc}"]
    for k in pad_rows + beyond:
        for s in spec.outputs:
            arr = got.get(s.name)
            if arr is None or np.ndim(arr) != len(s.dims) or np.shape(arr)[0] <= k:
                break  # an output missing or short of rows: the comparison of the requests says so
            got_k = np.asarray(arr)[k]
            if k in beyond:
                t = c.rows[k].T
                want_row = np.asarray(beyond_cache[key][s.name])
                if got_k.shape != want_row.shape:
                    m = compose.padding_mismatch(s.name, got_k, want_row)  # the shapes, in words
                    out.append(f"composition {c.name!r}, row {k} (slots beyond T = {t} of {c.rows[k].source}): {m}")
                    break
                mask = np.ones(got_k.shape, bool)
                own_s = c.rows[k].S
                mask[tuple(slice(0, t) if d == "T" else slice(0, own_s) if d == "S" and own_s is not None
                           else slice(None) for d in s.dims[1:])] = False  # compared above
                if not mask.any():
                    continue
                got_k, want_k = got_k[mask], want_row[mask]
            else:
                want_k = np.asarray(doc[s.name])[pad_rows.index(k)]
            m = compose.padding_mismatch(s.name, got_k, want_k,
                                         (contracts or {}).get(s.name) if k in pad_rows else None)
            if m is not None:
                what = "padding request" if k in pad_rows else f"slots beyond T = {c.rows[k].T} of {c.rows[k].source}"
                out.append(f"composition {c.name!r}, row {k} ({what}): {m}")
                break
    return out


def _summary(comps: list[Composition]) -> list[str]:
    names = [c.name for c in comps]
    alone = [n for n in names if n.startswith("alone#")]
    out = []
    for c in comps:
        if c.name.startswith("alone#"):
            if c.name == alone[0]:
                out.append(f"alone x{len(alone)}")
            continue
        out.append(c.name + (f" ({c.note})" if c.note else ""))
    return out
