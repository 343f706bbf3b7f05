"""Run goldens through the test binaries and judge the outputs (shared/DESIGN.md 5, 6).

A *case* is one golden on one backend. :func:`run_case` never raises for a case's own
failure: every outcome becomes a status.

PASS           every expected output meets its contract
MISMATCH       an output is missing, has another dtype/shape, or breaks its contract
CRASH          the binary died by a signal or exited 1 (runtime failure)
TIMEOUT        the binary ran past the time limit (it is killed)
ERROR          harness or input problem: unreadable golden, missing binary, exit 2,
               unreadable output file
NOT_SUPPORTED  the backend is absent here (binary exit 3: not built with CUDA, no GPU)
WAIVED         listed with a reason in golden/known_failures.json and not passing

Binary exit codes are documented in docs/binaries.md.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import fnmatch
import json
import os
import shlex
import stat
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import format as kformat
from .compare import TensorResult, compare
from .contract import Contract, stray_contract_keys
from .errors import KdtrError
from .status import FAILING, Status

BACKENDS = ("cpu", "cuda")
STATUSES = tuple(Status)  # in report order
EXIT_RUNTIME, EXIT_INPUT, EXIT_NOT_SUPPORTED = 1, 2, 3
KNOWN_FAILURES = "known_failures.json"


class UsageError(ValueError):
    """Bad selection or configuration given to the runner (CLI exit code 2)."""


@dataclass(frozen=True)
class Case:
    """One golden on one backend."""

    op: str
    config: str
    golden: Path
    backend: str

    @property
    def id(self) -> str:
        return f"{self.op}/{self.config}@{self.backend}"


@dataclass
class CaseResult:
    case: Case
    status: Status
    reason: str = ""
    outputs: list[TensorResult] = field(default_factory=list)
    seconds: float = 0.0
    command: list[str] = field(default_factory=list)
    output_file: str = ""
    stderr: str = ""
    rerun: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.case.id,
            "op": self.case.op,
            "config": self.case.config,
            "backend": self.case.backend,
            "golden": str(self.case.golden),
            "status": self.status,
            "reason": self.reason,
            "seconds": round(self.seconds, 4),
            "command": shlex.join(self.command) if self.command else "",
            "rerun": self.rerun,
            "output_file": self.output_file,
            "stderr": self.stderr,
            "outputs": [o.to_json() for o in self.outputs],
        }


@dataclass
class RunConfig:
    golden_dir: Path
    bin_dir: Path
    out_dir: Path
    timeout: float = 60.0
    device: int = 0
    known_failures: dict[str, str] = field(default_factory=dict)
    # Goldens that must not be run, with the reason (not in the manifest, wrong hash,
    # not a regular file): each of their cases is an ERROR naming the file.
    golden_problems: dict[Path, str] = field(default_factory=dict)
    # Options a rerun line must repeat (--golden-dir, --bin-dir, --timeout, --tier all, ...).
    rerun_args: list[str] = field(default_factory=list)


def discover(golden_dir: Path, second_tier: bool = False, registry: Any = None) -> list[tuple[str, str, Path]]:
    """Every committed golden as (op, config, path), sorted; from the files on disk.

    With ``second_tier``, also every manifest entry of tier "cache", generated on demand
    from ``registry`` (a :class:`kdtr.registry.Registry`, required then) into
    ``golden_dir/.cache`` and checked against its manifest sha256.

    Raises:
        UsageError: the directory does not exist, holds no goldens, or a second-tier
            golden cannot be produced with its manifest hash.
        ValueError: ``second_tier`` without a ``registry``.
    """
    if second_tier and registry is None:
        raise ValueError("discover: second-tier goldens need the configuration registry")
    if not golden_dir.is_dir():
        raise UsageError(f"golden directory {golden_dir} does not exist")
    found = sorted((p.parent.name, p.stem, p) for p in golden_dir.glob("*/*.kdtr"))
    if not found:
        raise UsageError(f"no goldens under {golden_dir} (run `kdtr regen`)")
    if second_tier:
        from . import goldens

        try:
            entries = goldens.read_manifest(golden_dir)["files"].values()
            for e in sorted(entries, key=lambda e: (e["op"], e["config"])):
                if e.get("tier") == "cache":
                    found.append((e["op"], e["config"], goldens.ensure_cached(golden_dir, registry, e["op"], e["config"])))
        except (OSError, ValueError, KeyError) as exc:
            raise UsageError(f"second-tier goldens: {exc}") from exc
    return found


def check_manifest(
    golden_dir: Path, found: list[tuple[str, str, Path]]
) -> tuple[list[tuple[str, str, Path]], dict[Path, str]]:
    """Hold the committed goldens on disk against ``golden_dir/MANIFEST.json``.

    A run never judges a golden that its manifest does not vouch for: one that is not
    listed, not a regular file, or whose sha256 differs from its entry (a half-finished
    regen, a hand edit, a file from another checkout); and a listed golden missing from
    disk is a case of its own. Returns ``found`` plus the missing goldens, and the problem
    of each golden that must not run (its cases become ERROR naming the file).

    Raises:
        UsageError: no manifest, or not a kdtr manifest.
    """
    from . import goldens

    try:
        listed = goldens.read_manifest(golden_dir)["files"]
    except FileNotFoundError as exc:
        raise UsageError(f"{golden_dir / goldens.MANIFEST_NAME}: missing (run `kdtr regen`)") from exc
    except (OSError, ValueError) as exc:
        raise UsageError(str(exc)) from exc
    problems: dict[Path, str] = {}
    on_disk = set()
    for op, config, path in found:
        rel = f"{op}/{config}.kdtr"
        try:
            rel_to_dir = path.relative_to(golden_dir).as_posix()
        except ValueError:  # a second-tier golden in a cache elsewhere: checked by ensure_cached
            continue
        if rel_to_dir != rel:  # .cache/<op>/<config>.kdtr: checked by ensure_cached
            continue
        on_disk.add(rel)
        entry = listed.get(rel)
        try:
            mode = os.stat(path).st_mode
        except OSError as exc:
            problems[path] = f"{path}: cannot stat: {exc.strerror or exc}"
            continue
        if not stat.S_ISREG(mode):
            problems[path] = f"{path}: not a regular file"
        elif not isinstance(entry, dict):
            problems[path] = f"{path}: not listed in {goldens.MANIFEST_NAME} (run `kdtr regen`, or remove the file)"
        elif entry.get("tier", "committed") != "committed":
            problems[path] = f"{path}: listed in {goldens.MANIFEST_NAME} as second tier, found among the committed goldens"
        elif goldens.sha256_of(path) != entry.get("sha256"):
            problems[path] = f"{path}: sha256 differs from {goldens.MANIFEST_NAME} (edited, or a regen did not finish: run `kdtr regen`)"
    missing = []
    for rel, entry in sorted(listed.items()):
        if isinstance(entry, dict) and entry.get("tier", "committed") == "committed" and rel not in on_disk:
            op, _, name = rel.partition("/")
            path = golden_dir / rel
            missing.append((op, name[: -len(".kdtr")] if name.endswith(".kdtr") else name, path))
            problems[path] = f"{path}: listed in {goldens.MANIFEST_NAME} but missing"
    return sorted(found + missing), problems


def _split_pattern(pat: str) -> tuple[str, str | None]:
    """``op[/config][@backend]`` -> (``op/config`` glob, backend or None)."""
    at, depth = -1, 0  # the last "@" outside brackets ("[@]" matches a literal @)
    for i, ch in enumerate(pat):
        depth = 1 if ch == "[" else 0 if ch == "]" else depth
        if ch == "@" and not depth:
            at = i
    case_pat, backend = (pat[:at], pat[at + 1 :]) if at >= 0 else (pat, "")
    if at >= 0 and backend not in BACKENDS:
        raise UsageError(f"--only {pat!r}: unknown backend {backend!r} (backends: {', '.join(BACKENDS)})")
    return (case_pat if "/" in case_pat else f"{case_pat}/*"), (backend or None)


def select(
    goldens: list[tuple[str, str, Path]],
    only: Iterable[str] = (),
    known_ops: Iterable[str] | None = None,
) -> list[tuple[str, str, Path]]:
    """Keep the goldens whose ``op/config`` matches any of the glob patterns in ``only``.

    A pattern without ``/`` matches an op (``tree_accept`` = ``tree_accept/*``); a pattern
    may end in ``@backend`` (the case ids that reports print: ``op/config@cpu``), which
    :func:`select_cases` applies.

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
    """Keep the cases that some pattern of ``only`` matches, its ``@backend`` included.

    Raises:
        UsageError: a pattern matches no case among the chosen backends.
    """
    only = list(only)
    if not only:
        return cases
    pats = [(pat, *_split_pattern(pat)) for pat in only]
    for pat, full, backend in pats:
        if not any(fnmatch.fnmatchcase(f"{c.op}/{c.config}", full) and backend in (None, c.backend) for c in cases):
            raise UsageError(f"--only {pat!r} matches no case on the chosen backends")
    return [c for c in cases
            if any(fnmatch.fnmatchcase(f"{c.op}/{c.config}", full) and backend in (None, c.backend)
                   for _, full, backend in pats)]


def load_known_failures(golden_dir: Path) -> dict[str, str]:
    """``golden/known_failures.json``: {"op/config" or "op/config@backend": reason}.

    Raises:
        UsageError: the file is not a JSON object of non-empty strings.
    """
    path = golden_dir / KNOWN_FAILURES
    if not os.path.lexists(path):
        return {}
    try:
        data = json.loads(kformat.read_regular_bytes(path))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: not valid JSON ({exc})") from exc
    except OSError as exc:  # kdtr.errors.Io for a FIFO or directory: refused, never blocked on
        raise UsageError(f"{path}: {exc.strerror or exc}") from exc
    if not isinstance(data, dict) or not all(isinstance(v, str) and v.strip() for v in data.values()):
        raise UsageError(f"{path}: must map 'op/config[@backend]' to a non-empty reason")
    return data


def stale_waivers(known_failures: dict[str, str], goldens: list[tuple[str, str, Path]]) -> list[str]:
    """Waiver keys that name no golden (or an unknown backend): typos or leftovers."""
    ids = {f"{op}/{cfg}" for op, cfg, _ in goldens}
    stale = []
    for key in known_failures:
        case, _, backend = key.partition("@")
        if case not in ids or (backend and backend not in BACKENDS):
            stale.append(key)
    return stale


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _tail(text: str, n: int = 2000) -> str:
    text = text.strip()
    return text if len(text) <= n else "..." + text[-n:]


def _judge(case: Case, golden: kformat.KdtrFile, out_path: Path) -> tuple[Status, str, list[TensorResult]]:
    try:
        out = kformat.load(out_path)
    except (KdtrError, OSError) as exc:
        return Status.ERROR, f"output file unreadable: {exc}", []
    results = []
    expected_names = [k[len("expected.") :] for k in golden.tensors if k.startswith("expected.")]
    if not expected_names:
        return Status.ERROR, f"{case.golden}: golden has no expected.* tensors", []
    stray = stray_contract_keys(golden.metadata, expected_names)
    if stray:
        return Status.ERROR, f"{case.golden}: metadata {stray[0]!r} is a contract for no expected.* output", []
    for name in expected_names:
        try:
            contract = Contract.from_metadata(golden.metadata, name)
        except (KeyError, ValueError) as exc:
            return Status.ERROR, f"{case.golden}: bad or missing contract for {name!r}: {exc}", []
        results.append(compare(name, golden.tensors[f"expected.{name}"], out.tensors.get(name), contract))
    bad = [r for r in results if not r.ok]
    if bad:
        return Status.MISMATCH, "; ".join(r.summary() for r in bad), results
    return Status.PASS, "", results


def literal_pattern(text: str) -> str:
    """An ``--only`` pattern matching exactly ``text``: glob characters and ``@`` bracketed
    (``[*]``), characters that cannot be typed (controls; see :mod:`kdtr.text`) as ``?``."""
    out = []
    for ch in text:
        if ch in "*?[]@":
            out.append(f"[{ch}]")
        elif not ch.isprintable():
            out.append("?")
        else:
            out.append(ch)
    return "".join(out)


def rerun_line(case: Case, cfg: RunConfig) -> str:
    """The shell command that reruns ``case`` alone, with the options it needs."""
    pattern = f"{literal_pattern(case.op)}/{literal_pattern(case.config)}"
    return shlex.join(["kdtr", "run", "--only", pattern, "--backend", case.backend, *cfg.rerun_args])


def run_case(case: Case, cfg: RunConfig) -> CaseResult:
    """Run one case and return its result; never raises for the case's own failures."""
    t0 = time.monotonic()
    res = CaseResult(case, Status.ERROR)
    res.rerun = rerun_line(case, cfg)
    res.status, res.reason = _run_case(case, cfg, res)
    res.seconds = time.monotonic() - t0
    waiver = cfg.known_failures.get(f"{case.op}/{case.config}@{case.backend}") or cfg.known_failures.get(
        f"{case.op}/{case.config}"
    )
    if waiver and res.status in FAILING:
        res.reason = f"waived ({waiver}); was {res.status}: {res.reason}"
        res.status = Status.WAIVED
    elif waiver and res.status == Status.PASS:
        res.reason = f"passes although waived ({waiver}): remove it from {KNOWN_FAILURES}"
    return res


_ACTIVE: set[subprocess.Popen] = set()
_ACTIVE_LOCK = threading.Lock()
_STOPPING = threading.Event()  # set when a run is being interrupted: start no more binaries


class Terminated(BaseException):
    """Raised in the main thread when SIGTERM or SIGHUP ends the run (as KeyboardInterrupt
    for SIGINT): :func:`run_all` kills the running binaries on its way out."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_terminated(signum: int, _frame: Any) -> None:
    raise Terminated(signum)


def install_signal_handlers() -> None:
    """SIGTERM and SIGHUP (a CI cancel, a closed terminal) end the run the way Ctrl-C does:
    queued cases dropped, running binaries' process groups killed. Main thread only."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_terminated)


# Linux: a binary gets SIGKILL when the runner dies, even by SIGKILL (prctl PR_SET_PDEATHSIG).
_PR_SET_PDEATHSIG = 1
try:
    _prctl = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True).prctl
except (OSError, AttributeError):
    _prctl = None


def _child_setup(parent_pid: int) -> None:  # runs in the child between fork and exec
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the runner died before the line above took effect
        os._exit(137)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _run_binary(cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
    """Run a test binary in its own process group; on timeout kill the whole group
    (a wrapper script or a sanitizer leaves no orphans) and raise TimeoutExpired."""
    parent = os.getpid()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, errors="replace", start_new_session=True,
                            preexec_fn=(lambda: _child_setup(parent)) if _prctl is not None else None)
    with _ACTIVE_LOCK:
        _ACTIVE.add(proc)
        if _STOPPING.is_set():  # started while the run was being interrupted
            _kill_group(proc)
    try:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            out, err = proc.communicate()
            raise subprocess.TimeoutExpired(cmd, timeout, output=out, stderr=err) from None
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    finally:
        with _ACTIVE_LOCK:
            _ACTIVE.discard(proc)


def _run_case(case: Case, cfg: RunConfig, res: CaseResult) -> tuple[Status, str]:
    if case.golden in cfg.golden_problems:
        return Status.ERROR, cfg.golden_problems[case.golden]
    try:
        golden = kformat.load(case.golden)
    except (KdtrError, OSError) as exc:
        return Status.ERROR, f"golden unreadable: {exc}"
    op = golden.metadata.get("op")
    if op != case.op:
        return Status.ERROR, f"{case.golden}: metadata op {op!r} does not match directory {case.op!r}"
    config = golden.metadata.get("config")
    if config != case.config:
        return Status.ERROR, f"{case.golden}: metadata config {config!r} does not match the file name {case.config!r}"
    binary = cfg.bin_dir / f"kdtr_{case.op}"
    if not binary.exists():
        return Status.ERROR, f"binary {binary} not found (run `make`)"
    out_path = cfg.out_dir / case.op / f"{case.config}.{case.backend}.kdtr"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.unlink(missing_ok=True)
    res.output_file = str(out_path)
    cmd = [str(binary), "--input", str(case.golden), "--output", str(out_path), "--backend", case.backend]
    if case.backend == "cuda":
        cmd += ["--device", str(cfg.device)]
    res.command = cmd
    try:
        proc = _run_binary(cmd, cfg.timeout)
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        res.stderr = _tail(err)
        return Status.TIMEOUT, f"killed after {cfg.timeout:g} s"
    except OSError as exc:
        return Status.ERROR, f"cannot start {binary}: {exc}"
    res.stderr = _tail(proc.stderr)
    first_line = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "(no message)"
    rc = proc.returncode
    if rc < 0:
        return Status.CRASH, f"killed by {_signal_name(rc)}"
    if rc == EXIT_NOT_SUPPORTED:
        if case.backend == "cpu":  # the cpu backend always exists (docs/binaries.md)
            return Status.ERROR, f"binary says the cpu backend is not supported (exit 3): {first_line}"
        return Status.NOT_SUPPORTED, first_line
    if rc == EXIT_INPUT:
        return Status.ERROR, f"binary rejected its input (exit 2): {first_line}"
    if rc != 0:
        return Status.CRASH, f"exit {rc}: {first_line}"
    status, reason, outputs = _judge(case, golden, out_path)
    res.outputs = outputs
    return status, reason


def plan(goldens: list[tuple[str, str, Path]], backends: Iterable[str]) -> list[Case]:
    return [Case(op, cfg, path, b) for op, cfg, path in goldens for b in backends]


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


def run_all(
    cases: list[Case], cfg: RunConfig, jobs: int, on_done: Callable[[CaseResult], None] | None = None
) -> list[CaseResult]:
    """Run cases on ``jobs`` threads (each waits on a subprocess); results in case order."""
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    _STOPPING.clear()
    results: dict[Case, CaseResult] = {}
    pool = ThreadPoolExecutor(max_workers=max(1, jobs))
    try:
        futures = {pool.submit(run_case, c, cfg): c for c in cases}
        for fut in as_completed(futures):
            c = futures[fut]
            try:
                r = fut.result()
            except Exception as exc:  # a harness bug must not stop the run
                r = CaseResult(c, Status.ERROR, f"harness error: {type(exc).__name__}: {exc}", rerun=rerun_line(c, cfg))
            results[c] = r
            if on_done:
                on_done(r)
    except BaseException:  # Ctrl-C, SIGTERM, SIGHUP: drop queued cases, kill the running binaries
        pool.shutdown(wait=False, cancel_futures=True)
        with _ACTIVE_LOCK:
            _STOPPING.set()
            for proc in list(_ACTIVE):
                _kill_group(proc)
        raise
    pool.shutdown(wait=True)
    return [results[c] for c in cases]


REPORT_LOCK = ".kdtr-run.lock"


class ReportDirLock:
    """Exclusive use of a report directory for one ``kdtr run`` (an advisory ``flock`` on
    ``<report_dir>/.kdtr-run.lock``, released when the process ends, however it ends).

    Two runs sharing a report directory would overwrite each other's obtained outputs and
    judge each other's files; the second one is refused at once instead.

    Raises (on enter):
        UsageError: the directory cannot be created or written, or another run holds it.
    """

    def __init__(self, report_dir: Path) -> None:
        self.report_dir = report_dir
        self._fd: int | None = None

    def __enter__(self) -> ReportDirLock:
        path = self.report_dir / REPORT_LOCK
        try:
            self.report_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY, 0o644)
        except OSError as exc:
            raise UsageError(f"report directory {self.report_dir}: not writable ({exc.strerror or exc})") from exc
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise UsageError(f"{path}: not a regular file (remove it)")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            try:
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            finally:
                os.close(fd)
            raise UsageError(
                f"report directory {self.report_dir} is in use by another kdtr run (pid {holder}); "
                "wait for it or give this run its own --report-dir"
            ) from exc
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as exc:
            os.close(fd)
            raise UsageError(f"{path}: cannot write ({exc.strerror or exc})") from exc
        if not os.access(self.report_dir, os.W_OK):
            os.close(fd)
            raise UsageError(f"report directory {self.report_dir}: not writable")
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None


def exit_code(results: list[CaseResult]) -> int:
    """0 if nothing failed (PASS, NOT_SUPPORTED, WAIVED only), else 1."""
    return 1 if any(r.status in FAILING for r in results) else 0


def default_jobs() -> int:
    return max(1, min(8, os.cpu_count() or 1))
