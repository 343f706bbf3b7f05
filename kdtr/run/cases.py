"""The cases of a run: what a case is, which ones a run has, and where each runs.

:class:`Case` (one golden on one backend, under at most one forced kernel) and
:class:`RunConfig`; :class:`GoldenStore` (each golden of a run read once); selection
(``--only``: :func:`select`, :func:`select_cases`), the kernel axis (:func:`parse_kernels`),
:func:`plan`, :func:`shard`, the batch units and their devices (:func:`plan_units`), the
binaries (:func:`binary_of`, :func:`missing_binaries`) and the rerun line of a case.
"""

from __future__ import annotations

import fnmatch
import os
import shlex
import subprocess
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..goldens import UsageError
from ..judge import Golden, GoldenError
from ..vouch import Vouch

BACKENDS = ("cpu", "cuda")
# compute-sanitizer tools `kdtr run --sanitizer` accepts; a sanitizer that finds errors
# exits with SANITIZER_EXIT (its --error-exitcode), which no binary uses.
SANITIZERS = ("memcheck", "racecheck", "initcheck", "synccheck")
SANITIZER_EXIT = 99


@dataclass(frozen=True)
class Case:
    """One golden on one backend, under one forced kernel or none."""

    op: str
    config: str
    golden: Path
    backend: str
    # The kernel the binary is forced to run (``--kernel``; kdtr.ops OpSpec.kernels; on the cpu
    # backend only as kdtr mutate forces the CPU core's select build);
    # None: the binary's own choice.
    kernel: str | None = None
    # How the binary runs the golden: "" eagerly (the golden as it is); "graph" (``kdtr run
    # --graph``): captured in a CUDA graph at a padded batch and replayed twice (docs/harness.md
    # "Graph replay"); "invariance" (``kdtr run --invariance``): the golden's requests in other
    # batch compositions, each request's outputs compared bit for bit (docs/harness.md
    # "Invariance").
    mode: str = ""
    # The CUDA device a cuda case runs on (set by :func:`run_all` when it spreads the cases
    # over the devices; None: RunConfig.device). Not part of the case's identity.
    device: int | None = field(default=None, compare=False)

    @property
    def column(self) -> str:
        """``backend`` or ``backend:kernel``, then ``#mode`` for a graph or invariance case:
        the case's column in the reports."""
        col = f"{self.backend}:{self.kernel}" if self.kernel else self.backend
        return f"{col}#{self.mode}" if self.mode else col

    @property
    def id(self) -> str:
        """``op/config@backend``, or ``op/config@backend:kernel`` under a forced kernel, then
        ``#graph`` or ``#invariance`` for those modes."""
        return f"{self.op}/{self.config}@{self.column}"


@dataclass
class RunConfig:
    golden_dir: Path
    bin_dir: Path
    out_dir: Path
    timeout: float = 60.0
    device: int = 0  # the CUDA device of cuda cases that name none (Case.device)
    # The devices run_all spreads the cuda cases over (empty: just `device`).
    devices: tuple[int, ...] = ()
    # One binary process per op, backend and device for all its goldens (--batch), with
    # one process per golden where a batch crashes, hangs or a sanitizer reports errors.
    batch: bool = True
    # A compute-sanitizer tool (SANITIZERS) that wraps every cuda case; "" for none.
    sanitizer: str = ""
    sanitizer_bin: str = "compute-sanitizer"
    known_failures: dict[str, str] = field(default_factory=dict)
    # Goldens that must not be run, with the reason (not in the manifest, wrong hash,
    # not a regular file): each of their cases is an ERROR naming the file.
    golden_problems: dict[Path, str] = field(default_factory=dict)
    # What each golden's bytes must be: the MANIFEST.json entry that check_manifest read at
    # the start of the run (its ``vouched``). The expected side of every verdict is that
    # content; a golden not here is vouched for by the run's first read of it.
    vouched: dict[Path, Vouch] = field(default_factory=dict)
    # Options a rerun line must repeat (--golden-dir, --bin-dir, --timeout, --tier all, ...;
    # not --device: rerun_line adds the case's own).
    rerun_args: list[str] = field(default_factory=list)
    # Each golden of the run, read once (kdtr.judge.Golden) and shared by all its cases.
    goldens: GoldenStore = field(default_factory=lambda: GoldenStore(), repr=False, compare=False)

    def device_list(self) -> tuple[int, ...]:
        return self.devices or (self.device,)


def _split_mode(pat: str) -> tuple[str, str | None]:
    """``PATTERN#mode`` -> (``PATTERN``, ``mode``); a pattern without a ``#`` outside
    brackets ("[#]" matches a literal #) -> (``PATTERN``, None).

    Raises:
        UsageError: the suffix is not a mode of :data:`MODES`.
    """
    hash_at, depth = -1, 0
    for i, ch in enumerate(pat):
        depth = 1 if ch == "[" else 0 if ch == "]" else depth
        if ch == "#" and not depth:
            hash_at = i
    if hash_at < 0:
        return pat, None
    mode = pat[hash_at + 1 :]
    if mode not in MODES:
        raise UsageError(f"--only {pat!r}: unknown mode {mode!r} after '#' (modes: {', '.join(MODES)})")
    return pat[:hash_at], mode


def _split_pattern(pat: str) -> tuple[str, str | None]:
    """``op[/config][@backend[:kernel]][#mode]`` -> (``op/config`` glob, ``backend`` or
    ``backend:kernel`` or None); the ``#mode`` suffix is :func:`_split_mode`'s."""
    pat, _ = _split_mode(pat)
    at, depth = -1, 0  # the last "@" outside brackets ("[@]" matches a literal @)
    for i, ch in enumerate(pat):
        depth = 1 if ch == "[" else 0 if ch == "]" else depth
        if ch == "@" and not depth:
            at = i
    case_pat, column = (pat[:at], pat[at + 1 :]) if at >= 0 else (pat, "")
    backend, colon, kernel = column.partition(":")  # @cuda:mma: the case of a forced kernel
    if at >= 0 and (backend not in BACKENDS or (colon and not kernel)):
        raise UsageError(f"--only {pat!r}: unknown backend {column!r} (backends: {', '.join(BACKENDS)}, "
                         "each maybe with :<kernel>)")
    return (case_pat if "/" in case_pat else f"{case_pat}/*"), (column or None)


def _matches(c: Case, full: str, column: str | None, mode: str | None = None) -> bool:
    """``@cuda`` matches every cuda case, forced kernels and modes included; ``@cuda:K`` the
    cases of K; a ``#mode`` suffix (``mode``) only the cases of that mode."""
    col = c.column[: -len(c.mode) - 1] if c.mode else c.column  # without its #mode
    return (fnmatch.fnmatchcase(f"{c.op}/{c.config}", full) and column in (None, c.backend, col)
            and (mode is None or c.mode == mode))


def select(
    goldens: list[tuple[str, str, Path]],
    only: Iterable[str] = (),
    known_ops: Iterable[str] | None = None,
) -> list[tuple[str, str, Path]]:
    """Keep the goldens whose ``op/config`` matches any of the glob patterns in ``only``.

    A pattern without ``/`` matches an op (``tree_accept`` = ``tree_accept/*``); a pattern
    may end in ``@backend`` (the case ids that reports print: ``op/config@cpu``) and in
    ``#graph`` / ``#invariance`` (``op/config@cpu#graph``, or ``op/config#graph`` for every
    backend), which :func:`select_cases` applies.

    Raises:
        UsageError: a pattern names an unknown op or backend, or matches nothing.
    """
    only = list(only)
    if not only:
        return goldens
    ops = set(known_ops) if known_ops is not None else {g[0] for g in goldens}
    keep: dict[Path, tuple[str, str, Path]] = {}
    for pat in only:
        full, _ = _split_pattern(pat)
        op_pat = full.split("/", 1)[0]
        if not any(fnmatch.fnmatchcase(op, op_pat) for op in ops):
            raise UsageError(f"--only {pat!r}: no op matches {op_pat!r} (ops: {', '.join(sorted(ops))})")
        hits = [g for g in goldens if fnmatch.fnmatchcase(f"{g[0]}/{g[1]}", full)]
        if not hits:
            raise UsageError(f"--only {pat!r} matches no golden")
        for g in hits:
            keep[g[2]] = g
    return sorted(keep.values())


def select_cases(cases: list[Case], only: Iterable[str] = ()) -> list[Case]:
    """Keep the cases that some pattern of ``only`` matches, its ``@backend`` included
    (``@cuda:K``: the case of forced kernel K only; ``@cuda``: every cuda case).

    Raises:
        UsageError: a pattern matches no case among the chosen backends.
    """
    only = list(only)
    if not only:
        return cases
    pats = [(pat, *_split_pattern(pat), _split_mode(pat)[1]) for pat in only]
    for pat, full, column, mode in pats:
        if not any(_matches(c, full, column, mode) for c in cases):
            raise UsageError(f"--only {pat!r} matches no case on the chosen backends"
                             + (" and kernels (--kernel)" if column and ":" in column else "")
                             + (f" (a #{mode} case needs --{mode})" if mode else ""))
    return [c for c in cases if any(_matches(c, full, column, mode) for _, full, column, mode in pats)]


def literal_pattern(text: str) -> str:
    """An ``--only`` pattern matching exactly ``text``: glob characters, ``@`` and ``#``
    bracketed (``[*]``), characters that cannot be typed (controls; see :mod:`kdtr.text`) as ``?``."""
    out = []
    for ch in text:
        if ch in "*?[]@#":
            out.append(f"[{ch}]")
        elif not ch.isprintable():
            out.append("?")
        else:
            out.append(ch)
    return "".join(out)


def rerun_line(case: Case, cfg: RunConfig) -> str:
    """The shell command that reruns ``case`` alone, with the options it needs (a graph or
    invariance case: its ``#mode`` pattern and ``--graph`` / ``--invariance``)."""
    pattern = f"{literal_pattern(case.op)}/{literal_pattern(case.config)}"
    device = _device_of(case, cfg)
    dev = ["--device", str(device)] if device is not None and device != 0 else []
    kernel = ["--kernel", f"{case.op}={case.kernel}"] if case.kernel else []
    mode = [f"--{case.mode}"] if case.mode else []
    if case.mode:
        pattern += f"@{case.backend}#{case.mode}"
    return shlex.join(["kdtr", "run", "--only", pattern, "--backend", case.backend, *kernel, *mode, *cfg.rerun_args,
                       *dev])


def _device_of(case: Case, cfg: RunConfig) -> int | None:
    if case.backend != "cuda":
        return None
    return cfg.device if case.device is None else case.device


def default_bin_dir() -> Path:
    """The checkout's ``build/bin`` (what ``make`` builds)."""
    from ..goldens import repo_root

    return repo_root() / "build" / "bin"


def binary_of(cfg: RunConfig, op: str) -> Path:
    return cfg.bin_dir / f"kdtr_{op}"


def _is_default_bin_dir(bin_dir: Path) -> bool:
    try:
        return bin_dir.resolve() == default_bin_dir().resolve()
    except OSError:
        return False


def missing_binary(bin_dir: Path, op: str) -> str:
    """Why the cases of ``op`` cannot run when ``bin_dir`` lacks ``kdtr_<op>``, with the
    advice that fits: ``make`` for the checkout's build/bin; for a directory of one's own
    binaries, the directory and the name it lacks."""
    if _is_default_bin_dir(bin_dir):
        return f"binary {bin_dir / f'kdtr_{op}'} not found (run `make`)"
    return f"binary kdtr_{op} not found in {bin_dir} (the binary directory given)"


def missing_binaries(cases: Iterable[Case], bin_dir: Path) -> dict[str, int]:
    """The ops of ``cases`` whose ``kdtr_<op>`` is not in ``bin_dir``, with their case count."""
    ops: dict[str, int] = {}
    for c in cases:
        ops[c.op] = ops.get(c.op, 0) + 1
    return {op: n for op, n in sorted(ops.items()) if not (bin_dir / f"kdtr_{op}").exists()}


def missing_binaries_line(missing: dict[str, int], bin_dir: Path, only_option: str = "--only") -> str:
    """One line for every missing binary of :func:`missing_binaries` (not one per case):
    the directory, the names it lacks, the cases that are ERROR, and what to do."""
    names = ", ".join(f"kdtr_{op}" for op in missing)
    n = sum(missing.values())
    cases = f"{n} case{'s' if n != 1 else ''}"
    if _is_default_bin_dir(bin_dir):
        return f"{bin_dir} has no {names}: {cases} ERROR (run `make`)"
    return (f"{bin_dir} has no {names}: {cases} ERROR (the binary directory given: put "
            f"{'them' if len(missing) > 1 else 'it'} there, or select the ops it has with {only_option})")


class GoldenStore:
    """The goldens of a run, each read once (:meth:`kdtr.judge.Golden.read`: into private
    memory, held to :attr:`RunConfig.vouched`, else to the run's first read) and shared by
    every case of it, whatever its backend or forced kernel. A read that fails is kept too:
    each case of that golden is the same ERROR.

    :meth:`expect` counts the cases of each golden; :meth:`release` (one per finished case)
    drops a golden once its last case is done, so a run holds only the goldens of its
    running and pending cases. A golden whose cases were not counted stays held.
    Thread-safe: one read per golden, however many cases ask at once.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[Path, Golden | GoldenError] = {}
        self._reading: dict[Path, threading.Lock] = {}
        self._first: dict[Path, Vouch] = {}
        self._pending: dict[Path, int] = {}
        self.reads = 0  # files read so far (each golden once)

    def expect(self, cases: Iterable[Case]) -> None:
        with self._lock:
            for c in cases:
                self._pending[c.golden] = self._pending.get(c.golden, 0) + 1

    def release(self, path: Path) -> None:
        with self._lock:
            if path in self._pending:
                self._pending[path] -= 1
                if self._pending[path] <= 0:
                    del self._pending[path]
                    self._held.pop(path, None)

    def get(self, case: Case, cfg: RunConfig) -> Golden:
        """The golden of ``case``, read on its first use.

        Raises:
            kdtr.judge.GoldenError: unreadable, not the vouched bytes, or its metadata
                op/config not those of its place.
        """
        path = case.golden
        with self._lock:
            lock = self._reading.setdefault(path, threading.Lock())
        with lock:
            with self._lock:
                got = self._held.get(path)
            if got is None:
                vouch = cfg.vouched.get(path) or self._first.get(path)
                tier = "cache" if path.parent.parent.name == ".cache" else "committed"
                try:
                    got = Golden.read(path, vouch, op=case.op, config=case.config, tier=tier)
                except GoldenError as exc:
                    got = exc
                with self._lock:
                    self.reads += 1
                    if isinstance(got, Golden) and vouch is None:
                        self._first.setdefault(path, got.vouch)
                    self._held[path] = got
        if isinstance(got, GoldenError):
            raise got
        return got


def visible_devices() -> tuple[int, ...]:
    """The CUDA device indices a binary can open here: as many as CUDA_VISIBLE_DEVICES
    lists when it is set, else as many as ``nvidia-smi -L`` lists; (0,) when neither tells
    (then the cuda cases say NOT_SUPPORTED themselves)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        n = len([x for x in visible.split(",") if x.strip()])
        return tuple(range(n)) or (0,)
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return (0,)
    n = sum(1 for ln in out.stdout.splitlines() if ln.startswith("GPU ")) if out.returncode == 0 else 0
    return tuple(range(n)) or (0,)


def parse_devices(spec: str) -> tuple[int, ...]:
    """``--device``: "N", a comma-separated list "0,1" or "all" (:func:`visible_devices`).

    Raises:
        UsageError: not a list of distinct integers >= 0 nor "all".
    """
    if spec.strip() == "all":
        return visible_devices()
    try:
        devices = tuple(int(x) for x in spec.split(","))
    except ValueError as exc:
        raise UsageError(f"--device {spec!r}: expected N, a list such as 0,1, or all") from exc
    if any(d < 0 for d in devices) or len(set(devices)) != len(devices):
        raise UsageError(f"--device {spec!r}: device indices must be distinct integers >= 0")
    return devices


AUTO = "auto"  # in a --kernel list: the case without a forced kernel (the binary's choice)


def parse_kernels(specs: Iterable[str], op_kernels: dict[str, tuple[str, ...]] | None = None,
                  option: str = "--kernel") -> dict[str, tuple[str | None, ...]]:
    """``--kernel OP=K[,K...]`` (repeatable) as {op: kernels}, for :func:`plan`.

    ``K`` is a kernel of the op (``op_kernels``, default ``kdtr.ops`` OpSpec.kernels),
    ``all`` (every one of them) or ``auto`` (the case without a forced kernel, as None).
    An op given twice gets the union, in the order given.

    Raises:
        UsageError: malformed, an unknown op, an op without kernels, or an unknown kernel.
    """
    if op_kernels is None:
        from ..ops import OPS

        op_kernels = {name: spec.kernels for name, spec in OPS.items()}
    out: dict[str, list[str | None]] = {}
    for spec in specs:
        op, eq, names = spec.partition("=")
        op = op.strip()
        if not eq or not op or not names.strip():
            raise UsageError(f"{option} {spec!r}: expected OP=KERNEL[,KERNEL...], e.g. verify_attn=mma,wgmma")
        with_kernels = sorted(o for o, ks in op_kernels.items() if ks)
        if op not in op_kernels:
            raise UsageError(f"{option} {spec!r}: unknown op {op!r} (ops with kernels: {', '.join(with_kernels)})")
        known = op_kernels[op]
        if not known:
            raise UsageError(f"{option} {spec!r}: op {op} has no kernel choice (ops with kernels: "
                             f"{', '.join(with_kernels)})")
        chosen = out.setdefault(op, [])
        for k in (x.strip() for x in names.split(",")):
            ks: tuple[str | None, ...]
            if k == "all":
                ks = known
            elif k == AUTO:
                ks = (None,)
            elif k in known:
                ks = (k,)
            else:
                raise UsageError(f"{option} {spec!r}: op {op} has no kernel {k!r} (kernels: "
                                 f"{', '.join(known)}, all, {AUTO})")
            chosen += [x for x in ks if x not in chosen]
    return {op: tuple(ks) for op, ks in out.items()}


MODES = ("graph", "invariance")  # Case.mode besides "" (eager)


def plan(goldens: list[tuple[str, str, Path]], backends: Iterable[str],
         kernels: dict[str, tuple[str | None, ...]] | None = None, modes: Iterable[str] = ()) -> list[Case]:
    """The cases of ``goldens`` on each of ``backends``, golden by golden.

    ``kernels`` ({op: kernels}, :func:`parse_kernels`): the cuda cases of such an op are one
    per kernel listed (None: the case without a forced kernel); the cpu backend has no kernel
    choice and keeps one case per golden. ``modes`` (of :data:`MODES`): each eager case is
    followed by one case per mode, the same golden, backend and kernel.
    """
    kernels = kernels or {}
    modes = tuple(modes)
    out = []
    for op, cfg, path in goldens:
        for b in backends:
            for k in (kernels.get(op, (None,)) if b == "cuda" else (None,)):
                out += [Case(op, cfg, path, b, kernel=k, mode=m) for m in ("", *modes)]
    return out


def shard(cases: list[Case], spec: str | None) -> list[Case]:
    """Keep shard ``i/n`` (1-based) of ``cases``, dealt out golden by golden: every
    backend of a golden lands in the same shard, so each shard of a CPU-only runner still
    tests its goldens on the cpu backend.

    Raises:
        UsageError: malformed spec.
    """
    if not spec:
        return cases
    try:
        i, n = (int(x) for x in spec.split("/"))
    except ValueError as exc:
        raise UsageError(f"--shard {spec!r}: expected i/n, e.g. 1/4") from exc
    if not 1 <= i <= n:
        raise UsageError(f"--shard {spec!r}: need 1 <= i <= n")
    order: dict[tuple[str, str, Path], int] = {}
    for c in cases:
        order.setdefault((c.op, c.config, c.golden), len(order))
    return [c for c in cases if order[(c.op, c.config, c.golden)] % n == i - 1]


def _golden_bytes(case: Case) -> int:
    try:
        return os.stat(case.golden).st_size
    except OSError:
        return 0


def _balanced(cases: list[Case], k: int) -> list[list[Case]]:
    """``cases`` dealt into ``k`` groups of about equal golden bytes (largest first, each
    to the lightest group), each group in the order of ``cases``."""
    groups: list[list[Case]] = [[] for _ in range(k)]
    load = [0] * k
    for c in sorted(cases, key=_golden_bytes, reverse=True):
        j = load.index(min(load))
        groups[j].append(c)
        load[j] += _golden_bytes(c)
    order = {c: i for i, c in enumerate(cases)}
    return [sorted(g, key=order.__getitem__) for g in groups if g]


def _place_on_devices(cases: list[Case], devices: tuple[int, ...], batch: bool) -> dict[Case, int]:
    """The device of each cuda case that names none.

    In batch mode over several devices, whole ops go to devices (heaviest op first, each
    to the device with the fewest golden bytes) when that balances within 25% of an even
    split: each GPU then creates a context for fewer ops, and the process count stays one
    per op. Otherwise (one op outweighs the rest, or too few ops) the cases are dealt out
    in turn, golden by golden.
    """
    cuda = [c for c in cases if c.backend == "cuda" and c.device is None]
    if batch and len(devices) > 1 and cuda:
        by_op: dict[str, list[Case]] = {}
        for c in cuda:
            by_op.setdefault(c.op, []).append(c)
        weight = {op: sum(map(_golden_bytes, cs)) for op, cs in by_op.items()}
        load = dict.fromkeys(devices, 0)
        chosen: dict[str, int] = {}
        for op in sorted(by_op, key=lambda o: (-weight[o], o)):
            d = min(devices, key=lambda d: (load[d], d))
            chosen[op] = d
            load[d] += weight[op]
        even = sum(weight.values()) / len(devices)
        if len(by_op) >= len(devices) and max(load.values()) <= 1.25 * even:
            return {c: chosen[c.op] for c in cuda}
    return {c: devices[k % len(devices)] for k, c in enumerate(cuda)}


def plan_units(cases: list[Case], cfg: RunConfig, jobs: int = 1) -> list[list[Case]]:
    """Group ``cases`` into the units run_all starts, the heaviest (golden bytes) first.

    With ``cfg.batch``: one unit per op and device for the cuda cases (placed on the
    devices of ``cfg.device_list()`` by :func:`_place_on_devices`), so each process pays
    the CUDA context once; the
    cpu cases of an op split into up to ``jobs`` units of about equal golden bytes, since a
    CPU process costs milliseconds and the cores are better kept busy. Without it, one
    unit per case. Every cuda case comes out with its ``device`` set.
    """
    placed = _place_on_devices(cases, cfg.device_list(), cfg.batch)
    units: dict[tuple[str, str, int | None, str | None, str], list[Case]] = {}
    for i, c in enumerate(cases):
        device = None
        if c.backend == "cuda":
            device = c.device if c.device is not None else placed[c]
            c = replace(c, device=device)
        key = (c.op, c.backend, device, c.kernel, c.mode) if cfg.batch else (str(i), c.backend, device, c.kernel,
                                                                                  c.mode)
        units.setdefault(key, []).append(c)
    out: list[list[Case]] = []
    for (_, backend, _, _, _), cs in units.items():
        if cfg.batch and backend == "cpu" and jobs > 1 and len(cs) > 1:
            out += _balanced(cs, min(jobs, len(cs)))
        else:
            out.append(cs)
    return sorted(out, key=lambda u: -sum(map(_golden_bytes, u)))


def default_jobs() -> int:
    return max(1, min(8, os.cpu_count() or 1))
