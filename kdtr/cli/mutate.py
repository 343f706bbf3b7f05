"""Mutation testing of the CPU cores against the committed goldens (docs/mutation.md).

A *mutant* is one small edit of a C++ core file under ``cuda_tests/`` (the ops' CPU cores,
which the CUDA kernels share): a planted bug. :func:`run` applies each mutant alone to a
scratch copy of ``Makefile`` + ``cuda_tests/``, rebuilds the CPU-only binaries that depend
on the edited file (make's own dependency files decide which), runs the committed goldens
of those binaries' ops on the cpu backend and records which goldens fail. Outcomes:

KILLED      some golden failed (MISMATCH, CRASH, TIMEOUT or ERROR) on a rebuilt binary
SURVIVED    every golden passed: the goldens cannot tell the bug from the right code
EQUIVALENT  declared equivalent in the catalogue (with the reason no input can tell),
            and indeed not killed
IDENTICAL   the rebuilt binaries are byte-identical to the unmutated ones, so no input
            can tell (trivial compiler equivalence: Papadakis et al., ICSE 2015)
STILLBORN   the mutant does not compile
BAD_CLAIM   declared equivalent, yet a golden killed it: the claim is wrong

Two sources of mutants:

* the *catalogue*, ``mutants/<op>.toml``: hand-written realistic bugs, each with its op,
  bug class and origin (the public report or reasoning behind it); see
  :func:`load_catalogue` for the schema;
* the *generic pass*: every mutant the ``universalmutator`` package's C++ operator rules
  (Groce et al., "An extensible, regular-expression-based tool for multi-language mutant
  generation", ICSE 2018) make of the code lines of the cores listed in
  :data:`GENERIC_FILES`.  Its survivors are triaged in ``mutants/generic_triage.toml``.

The edits are applied to a scratch copy only; the checkout is never modified.
"""

from __future__ import annotations

import fcntl
import fnmatch
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kdtr import children, fsutil, runner
from kdtr import userfiles
from kdtr.status import FAILING, Status

CATALOGUE_DIR = "mutants"
TRIAGE_FILE = "generic_triage.toml"
# The cores the generic pass mutates (the catalogue may edit any file under cuda_tests/).
GENERIC_FILES = (
    "cuda_tests/kernels/tree_accept.cuh",
    "cuda_tests/kernels/tree_build.cuh",
    "cuda_tests/kernels/verify_attn.cuh",
    "cuda_tests/kernels/greedy_step.cuh",
)
OPS = ("tree_accept", "tree_build", "verify_attn", "greedy_step")

KILLED, SURVIVED, EQUIVALENT, IDENTICAL, STILLBORN, BAD_CLAIM = (
    "KILLED", "SURVIVED", "EQUIVALENT", "IDENTICAL", "STILLBORN", "BAD_CLAIM")
OUTCOMES = (KILLED, SURVIVED, EQUIVALENT, IDENTICAL, STILLBORN, BAD_CLAIM)

_REQUIRED = ("name", "op", "file", "bug", "origin", "find", "replace")
_OPTIONAL = ("equivalent",)
_NAME = re.compile(r"[a-z0-9][a-z0-9_]*\Z")


class CatalogueError(ValueError):
    """A malformed catalogue or triage file, or a mutant that no longer applies (the
    message names the file, the entry and the field)."""


@dataclass(frozen=True)
class Mutant:
    """One planted bug: replace ``find`` by ``replace`` in ``file`` (repo-relative).

    Catalogue mutants locate ``find`` by its text, which must occur exactly once in the
    file.  Generic mutants replace the whole line ``line`` (1-based), whose text must
    still be ``find``.
    """

    id: str  # "<op>/<name>" (catalogue) or "generic/<file stem>/<line>.<k>"
    op: str
    file: str
    bug: str
    origin: str
    find: str
    replace: str
    equivalent: str = ""  # why no input can tell (declared equivalent), or ""
    line: int = 0  # generic mutants: the line replaced; catalogue: where `find` starts
    kind: str = "catalogue"

    def apply(self, text: str) -> str:
        """``text`` with this mutant's edit.

        Raises:
            CatalogueError: the edit no longer applies (``find`` absent, not unique, or
                the line moved): the catalogue must be updated with the code.
        """
        if self.kind == "generic":
            lines = text.split("\n")
            if not 1 <= self.line <= len(lines) or lines[self.line - 1] != self.find:
                raise CatalogueError(f"{self.file}:{self.line}: generic mutant {self.id}: the line changed")
            lines[self.line - 1] = self.replace
            return "\n".join(lines)
        n = text.count(self.find)
        if n != 1:
            raise CatalogueError(
                f"mutant {self.id}: field 'find' occurs {n} times in {self.file} (must occur exactly once)")
        return text.replace(self.find, self.replace, 1)


def _load_toml(path: Path, what: str) -> dict[str, Any]:
    """The TOML document of a catalogue or triage file (kdtr.userfiles: a FIFO, a huge
    file, bytes that are not UTF-8, bad syntax or deep nesting are refused, not hung on).

    Raises:
        CatalogueError: naming the file and what is wrong.
    """
    try:
        return userfiles.load_toml(path, what)
    except userfiles.UserFileError as exc:
        raise CatalogueError(f"{path}: unreadable {what}: {exc.detail}") from None
    except OSError as exc:
        raise CatalogueError(f"{path}: unreadable {what}: {exc.strerror or exc}") from None


def _entry_error(path: Path, i: int, what: str) -> CatalogueError:
    return CatalogueError(f"{path}: mutant #{i + 1}: {what}")


def load_catalogue(root: Path, cat_dir: Path | None = None) -> list[Mutant]:
    """Every mutant of the catalogue files ``<cat_dir>/<op>.toml`` (default
    ``<root>/mutants``), in file order, each checked to apply to today's code.

    Schema: an array of tables ``[[mutant]]`` with the string fields ``name`` (unique in
    the op, ``[a-z0-9_]``), ``op`` (the file's op), ``file`` (repo-relative, under
    ``cuda_tests/``), ``bug`` (the bug class), ``origin`` (the public report or reasoning
    it comes from), ``find`` (exact text, occurring exactly once in the file),
    ``replace`` (different from ``find``) and optionally ``equivalent`` (non-empty: the
    reason no input can tell this mutant from the right code).

    Raises:
        CatalogueError: an unreadable or malformed file, entry or field, a duplicate name,
            or a mutant that no longer applies.
    """
    cat_dir = cat_dir or root / CATALOGUE_DIR
    files = sorted(cat_dir.glob("*.toml"))
    files = [p for p in files if p.name != TRIAGE_FILE]
    if not files:
        hint = ""
        if cat_dir == root / CATALOGUE_DIR and not (root / "cuda_tests").is_dir():
            # an installed kdtr (no checkout above the package): the catalogue, the sources it
            # mutates and the Makefile live in a checkout
            hint = ("; kdtr mutate needs a kdtr checkout (mutants/, cuda_tests/, Makefile): set KDTR_ROOT to one, "
                    "or give --catalogue-dir")
        raise CatalogueError(f"{cat_dir}: no catalogue files (<op>.toml){hint}")
    mutants: list[Mutant] = []
    seen: set[str] = set()
    texts: dict[str, str] = {}
    for path in files:
        doc = _load_toml(path, "catalogue")
        stray = sorted(set(doc) - {"mutant"})
        if stray:
            raise CatalogueError(f"{path}: unknown top-level key {stray[0]!r} (expected [[mutant]] tables)")
        entries = doc.get("mutant", [])
        if not isinstance(entries, list) or not entries:
            raise CatalogueError(f"{path}: no [[mutant]] entries")
        for i, e in enumerate(entries):
            if not isinstance(e, dict):
                raise _entry_error(path, i, f"a {type(e).__name__}, not a table (write [[mutant]] tables)")
            for key in _REQUIRED:
                if not isinstance(e.get(key), str) or not e[key]:
                    raise _entry_error(path, i, f"field {key!r} missing or not a non-empty string")
            for key in e:
                if key not in _REQUIRED and key not in _OPTIONAL:
                    raise _entry_error(path, i, f"unknown field {key!r}")
            if "equivalent" in e and (not isinstance(e["equivalent"], str) or not e["equivalent"].strip()):
                raise _entry_error(path, i, "field 'equivalent' must be the reason (a non-empty string)")
            if not _NAME.match(e["name"]):
                raise _entry_error(path, i, f"field 'name' {e['name']!r}: use [a-z0-9_]")
            if e["op"] != path.stem:
                raise _entry_error(path, i, f"field 'op' {e['op']!r}: entries of {path.name} belong to {path.stem!r}")
            if e["op"] not in OPS:
                raise _entry_error(path, i, f"field 'op' {e['op']!r}: not an op ({', '.join(OPS)})")
            rel = e["file"]
            if not rel.startswith("cuda_tests/") or "\0" in rel or ".." in Path(rel).parts:
                raise _entry_error(path, i, f"field 'file' {rel!r}: must be a file under cuda_tests/")
            if e["find"] == e["replace"]:
                raise _entry_error(path, i, "fields 'find' and 'replace' are equal: no edit")
            mid = f"{e['op']}/{e['name']}"
            if mid in seen:
                raise _entry_error(path, i, f"field 'name': duplicate mutant {mid}")
            seen.add(mid)
            if rel not in texts:
                try:
                    texts[rel] = userfiles.read_text(root / rel, "source file")
                except OSError as exc:
                    raise _entry_error(path, i, f"field 'file' {rel!r}: {exc.strerror or exc}") from exc
                except userfiles.UserFileError as exc:
                    raise _entry_error(path, i, f"field 'file' {rel!r}: {exc.detail}") from exc
            m = Mutant(mid, e["op"], rel, e["bug"], e["origin"], e["find"], e["replace"], e.get("equivalent", ""))
            try:
                m.apply(texts[rel])
            except CatalogueError as exc:
                raise _entry_error(path, i, str(exc)) from exc
            line = texts[rel][: texts[rel].index(e["find"])].count("\n") + 1
            mutants.append(Mutant(**{**asdict(m), "line": line}))
    return mutants


# ---------------------------------------------------------------------------------------
# The generic pass (universalmutator)
# ---------------------------------------------------------------------------------------

def _strip_comment(line: str) -> str:
    i = line.find("//")
    return (line if i < 0 else line[:i]).strip()


def code_lines(text: str) -> list[int]:
    """1-based numbers of the lines that hold code (not blank, not a // comment, not a
    preprocessor line), the lines the generic pass mutates."""
    out = []
    for n, line in enumerate(text.split("\n"), 1):
        s = _strip_comment(line)
        if s and not s.startswith("#"):
            out.append(n)
    return out


def mutate_tool() -> str:
    """The universalmutator ``mutate`` executable (beside this Python, or on PATH).

    Raises:
        FileNotFoundError: the package is not installed (``pip install 'kdtr[mutate]'``).
    """
    here = Path(sys.executable).parent / "mutate"
    if here.is_file():
        return str(here)
    found = shutil.which("mutate")
    if not found:
        raise FileNotFoundError("the generic pass needs universalmutator: pip install -e '.[mutate]'")
    return found


def generic_mutants(root: Path, files: Iterable[str] = GENERIC_FILES) -> list[Mutant]:
    """The universalmutator C++ mutants of the code lines of ``files``: one line each,
    deduplicated, those that change only a trailing comment dropped.

    Raises:
        FileNotFoundError: universalmutator is not installed.
        CatalogueError: a file of ``files`` cannot be read as UTF-8 text.
        subprocess.CalledProcessError: universalmutator failed.
    """
    tool = mutate_tool()
    out: list[Mutant] = []
    for rel in files:
        try:
            text = userfiles.read_text(root / rel, "source file")
        except userfiles.UserFileError as exc:
            raise CatalogueError(str(exc)) from None
        except OSError as exc:
            raise CatalogueError(f"{root / rel}: {exc.strerror or exc}") from None
        orig = text.split("\n")
        op = Path(rel).stem
        with tempfile.TemporaryDirectory(prefix="kdtr-um-") as tmp:
            src = Path(tmp) / f"{op}.cpp"  # universalmutator picks the C++ rules by the suffix
            src.write_text(text, encoding="utf-8")
            (Path(tmp) / "lines.txt").write_text("\n".join(map(str, code_lines(text))) + "\n")
            mdir = Path(tmp) / "mutants"
            mdir.mkdir()
            cmd = [tool, src.name, "cpp", "--noCheck", "--lines", "lines.txt", "--mutantDir", "mutants"]
            r = children.run_captured(cmd, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if r.returncode != 0:
                raise subprocess.CalledProcessError(r.returncode, cmd)
            seen: set[tuple[int, str]] = set()
            per_line: dict[int, int] = {}
            for mfile in sorted(mdir.iterdir(), key=lambda p: int(re.findall(r"\d+", p.name)[-1])):
                new = mfile.read_text(encoding="utf-8").split("\n")
                if len(new) != len(orig):
                    continue  # not a one-line edit
                diff = [k for k, (a, b) in enumerate(zip(orig, new)) if a != b]
                if len(diff) != 1:
                    continue
                k = diff[0]
                if _strip_comment(orig[k]) == _strip_comment(new[k]) or (k + 1, new[k]) in seen:
                    continue
                seen.add((k + 1, new[k]))
                per_line[k + 1] = per_line.get(k + 1, 0) + 1
                out.append(Mutant(f"generic/{op}/{k + 1}.{per_line[k + 1]}", op, rel, "generic operator",
                                  "universalmutator C++ rules", orig[k], new[k], line=k + 1, kind="generic"))
    return out


@dataclass(frozen=True)
class Triage:
    """A verdict on a generic survivor (see :func:`load_triage`)."""

    file: str
    original: str
    mutated: str
    verdict: str  # "equivalent" or "gap"
    reason: str


_TRIAGE_FIELDS = ("file", "original", "mutated", "verdict", "reason")


def load_triage(root: Path, cat_dir: Path | None = None) -> dict[tuple[str, str, str], Triage]:
    """The verdicts on generic survivors, keyed by (file, original line, mutated line),
    both lines stripped of surrounding whitespace.

    Schema: ``[[survivor]]`` tables with string fields ``file``, ``original``,
    ``mutated``, ``verdict`` ("equivalent": no input can tell; "gap": a real bug the
    goldens miss, kept visible) and ``reason``.

    Raises:
        CatalogueError: malformed file or entry.
    """
    path = (cat_dir or root / CATALOGUE_DIR) / TRIAGE_FILE
    if not os.path.lexists(path):
        return {}
    doc = _load_toml(path, "triage file")
    stray = sorted(set(doc) - {"survivor"})
    if stray:
        raise CatalogueError(f"{path}: unknown top-level key {stray[0]!r} (expected [[survivor]] tables)")
    entries = doc.get("survivor", [])
    if not isinstance(entries, list):
        raise CatalogueError(f"{path}: 'survivor' is a {type(entries).__name__}, not [[survivor]] tables")
    out = {}
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            raise CatalogueError(f"{path}: survivor #{i + 1}: a {type(e).__name__}, not a table")
        unknown = sorted(set(e) - set(_TRIAGE_FIELDS))
        if unknown:
            raise CatalogueError(f"{path}: survivor #{i + 1}: unknown field {unknown[0]!r}")
        for key in _TRIAGE_FIELDS:
            if not isinstance(e.get(key), str) or not e[key].strip():
                raise CatalogueError(f"{path}: survivor #{i + 1}: field {key!r} missing or empty")
        if e["verdict"] not in ("equivalent", "gap"):
            raise CatalogueError(f"{path}: survivor #{i + 1}: field 'verdict' must be 'equivalent' or 'gap'")
        t = Triage(e["file"], e["original"].strip(), e["mutated"].strip(), e["verdict"], e["reason"])
        out[(t.file, t.original, t.mutated)] = t
    return out


# ---------------------------------------------------------------------------------------
# Running mutants
# ---------------------------------------------------------------------------------------

@dataclass
class MutantResult:
    mutant: Mutant
    outcome: str
    killed_by: list[str] = field(default_factory=list)  # case ids (op/config@cpu) that failed
    detail: str = ""  # first failing case's reason, the build error, or the triage
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        m = self.mutant
        return {"id": m.id, "kind": m.kind, "op": m.op, "file": m.file, "line": m.line, "bug": m.bug,
                "origin": m.origin, "find": m.find, "replace": m.replace, "equivalent": m.equivalent,
                "outcome": self.outcome, "killed_by": self.killed_by, "detail": self.detail,
                "seconds": round(self.seconds, 2)}


def _make(cwd: Path, targets: list[str], cxxflags: str | None) -> subprocess.CompletedProcess:
    """``make -s NO_CUDA=1 BUILD=build TARGETS`` in ``cwd``, output captured, in its own
    process group (kdtr.children): an interruption kills make and every compiler it runs.

    Raises:
        runner.Terminated: the run is being interrupted (no build starts).
        OSError: make cannot be started.
    """
    cmd = ["make", "-s", "NO_CUDA=1", "BUILD=build", *targets]
    if cxxflags is not None:
        cmd.append(f"CXXFLAGS={cxxflags}")
    if children.stopping():
        raise runner.Terminated(signal.SIGTERM)
    return children.run_captured(cmd, cwd=cwd)


def stop_builds() -> None:
    """Kill every running build and test binary, and start no more (an interrupted run)."""
    children.stop_all()


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _tree_digest(root: Path, cxxflags: str | None) -> str:
    h = hashlib.sha256(repr((cxxflags, os.environ.get("CXX"), os.environ.get("LDFLAGS"))).encode())
    for p in [root / "Makefile", *sorted(q for q in (root / "cuda_tests").rglob("*") if q.is_file())]:
        h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


_STAGING_MARK = ".kdtr-staging"


def _is_marked(d: Path, marker: str) -> bool:
    """``d`` is a real directory (not a link) holding the regular file ``marker``."""
    return d.is_dir() and not d.is_symlink() and (d / marker).is_file() and not (d / marker).is_symlink()


class Workspace:
    """A scratch copy of Makefile + cuda_tests/ with the unmutated CPU binaries built,
    and, per binary, the cuda_tests files it depends on (from make's .d files).

    The unmutated build is kept in ``cache_dir/base-<digest>`` (default
    ``<root>/build/mutate``), keyed by the bytes of Makefile and cuda_tests/ and the
    flags, so a second run on unchanged sources skips it.  Mutant copies go to
    ``scratch``.

    The cache is kdtr's own: its lock ``cache_dir/.lock`` is opened without following a
    link (:func:`kdtr.fsutil.open_lock`; a link or a file kdtr did not make there is
    refused, untouched, and nothing is written into it); a build is made in a staging
    directory ``cache_dir/.base-tmp-*`` and renamed into place whole; and only directories
    carrying kdtr's markers (``.complete``, ``.kdtr-staging``) are ever removed.

    Raises:
        kdtr.fsutil.UnsafePath: (an OSError) the lock file is a link or not kdtr's.
        RuntimeError: the unmutated build failed.
    """

    def __init__(self, root: Path, scratch: Path, cxxflags: str | None = None, cache_dir: Path | None = None) -> None:
        self.root = root
        self.scratch = scratch
        self.cxxflags = cxxflags
        cache_dir = cache_dir or root / "build" / "mutate"
        self.base = cache_dir / f"base-{_tree_digest(root, cxxflags)}"
        cache_dir.mkdir(parents=True, exist_ok=True)
        lock = fsutil.open_lock(cache_dir / ".lock")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)  # concurrent runs build the cache once
            if not _is_marked(self.base, ".complete"):
                self._build_base(cache_dir)
        finally:
            os.close(lock)
        self.digests = {op: _digest(self.base / "build" / "bin" / f"kdtr_{op}") for op in OPS}
        self.deps: dict[str, set[str]] = {}
        for op in OPS:
            dep = (self.base / "build" / "obj" / f"kdtr_{op}.d").read_text()
            words = dep.replace("\\\n", " ").split()
            self.deps[op] = {w for w in words if w.startswith("cuda_tests/")}
        self._n = 0
        self._lock = threading.Lock()

    def _build_base(self, cache_dir: Path) -> None:
        # Called under the cache lock: one cached build at a time; stale staging of a killed
        # run goes too. Only kdtr's own directories (marked) are removed.
        for old in [*cache_dir.glob("base-*"), *cache_dir.glob(".base-tmp-*")]:
            fsutil.remove_marked_dir(old, ".complete") or fsutil.remove_marked_dir(old, _STAGING_MARK)
        tmp = Path(tempfile.mkdtemp(prefix=".base-tmp-", dir=cache_dir))  # fresh, ours (mkdir is O_EXCL)
        (tmp / _STAGING_MARK).touch()
        try:
            shutil.copy2(self.root / "Makefile", tmp / "Makefile")
            shutil.copytree(self.root / "cuda_tests", tmp / "cuda_tests")  # links copied as files
            r = _make(tmp, [f"build/bin/kdtr_{op}" for op in OPS], self.cxxflags)
            if r.returncode != 0:
                raise RuntimeError(f"the unmutated CPU build failed:\n{r.stderr[-3000:]}")
            (tmp / ".complete").touch()
            os.rename(tmp, self.base)  # whole or absent: never a half-copied cache
        except BaseException:
            fsutil.remove_marked_dir(tmp, _STAGING_MARK)
            raise

    def ops_of(self, rel: str) -> list[str]:
        """The ops whose binary is built from ``rel``."""
        return [op for op in OPS if rel in self.deps[op]]

    def mutant_dir(self) -> Path:
        with self._lock:
            self._n += 1
            n = self._n
        d = self.scratch / f"m{n}"
        shutil.copytree(self.base, d, symlinks=True)  # copy2 keeps mtimes: make rebuilds only dependents
        return d


@dataclass
class Plan:
    """What to run: the goldens per op and the runner configuration (cpu backend)."""

    cases: dict[str, list[runner.Case]]
    golden_dir: Path
    timeouts: dict[runner.Case, float]
    # each golden's sha256 and size from MANIFEST.json at the start: every mutant is judged
    # against those bytes (runner.RunConfig.vouched), whatever a binary does to the files
    vouched: dict[Path, Any] = field(default_factory=dict)


def _run_cases(cases: list[runner.Case], bin_dir: Path, out_dir: Path, plan: Plan) -> list[runner.CaseResult]:
    results = []
    for c in cases:
        cfg = runner.RunConfig(golden_dir=plan.golden_dir, bin_dir=bin_dir, out_dir=out_dir,
                               timeout=plan.timeouts.get(c, 60.0), vouched=plan.vouched)
        out_dir.mkdir(parents=True, exist_ok=True)
        results.append(runner.run_case(c, cfg))
        if results[-1].status == Status.TIMEOUT:
            break  # the mutant hangs: killed; its other goldens would each cost the full time limit
    return results


def run_mutant(m: Mutant, ws: Workspace, plan: Plan, ops: list[str] | None = None) -> MutantResult:
    """Apply ``m`` to a fresh copy of the workspace, rebuild, run the goldens."""
    t0 = time.monotonic()
    d = ws.mutant_dir()
    try:
        src = d / m.file
        fsutil.atomic_write(src, m.apply(src.read_text(encoding="utf-8")).encode("utf-8"))  # never through a link
        st = src.stat()
        os.utime(src, ns=(st.st_atime_ns, max(st.st_mtime_ns, time.time_ns()) + 2_000_000_000))
        ops = [op for op in (ops or ws.ops_of(m.file)) if plan.cases.get(op)]
        if not ops:  # no golden runs a binary built from this file
            return MutantResult(m, EQUIVALENT if m.equivalent else SURVIVED,
                                detail=f"no golden runs a binary built from {m.file}", seconds=time.monotonic() - t0)
        r = _make(d, [f"build/bin/kdtr_{op}" for op in ops], ws.cxxflags)
        if r.returncode != 0:
            err = next((ln for ln in r.stderr.splitlines() if "error" in ln), r.stderr.strip()[-300:])
            return MutantResult(m, STILLBORN, detail=err.strip()[:300], seconds=time.monotonic() - t0)
        stale = [op for op in ops if (d / "build" / "bin" / f"kdtr_{op}").stat().st_mtime_ns
                 <= (ws.base / "build" / "bin" / f"kdtr_{op}").stat().st_mtime_ns]
        if stale:  # never call a mutant equivalent because make skipped its rebuild
            return MutantResult(m, STILLBORN, detail=f"kdtr_{stale[0]} was not rebuilt after the edit",
                                seconds=time.monotonic() - t0)
        changed = [op for op in ops if _digest(d / "build" / "bin" / f"kdtr_{op}") != ws.digests[op]]
        if not changed:
            return MutantResult(m, IDENTICAL, detail="rebuilt binaries byte-identical",
                                seconds=time.monotonic() - t0)
        cases = [c for op in changed for c in plan.cases[op]]
        results = _run_cases(cases, d / "build" / "bin", d / "obtained", plan)
        failed = [r for r in results if r.status in FAILING]
        if failed:
            outcome = BAD_CLAIM if m.equivalent else KILLED
            return MutantResult(m, outcome, [r.case.id for r in failed],
                                f"{failed[0].case.id}: {failed[0].status}: {failed[0].reason}"[:300],
                                time.monotonic() - t0)
        return MutantResult(m, EQUIVALENT if m.equivalent else SURVIVED, detail=m.equivalent,
                            seconds=time.monotonic() - t0)
    except CatalogueError as exc:
        return MutantResult(m, STILLBORN, detail=str(exc), seconds=time.monotonic() - t0)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def prepare(root: Path, golden_dir: Path, ws: Workspace, registry: Any = None) -> Plan:
    """Discover the committed goldens, check them against the manifest and run them once
    on the unmutated build: every case must pass (else no mutant can be judged).  Each
    case's time limit is 20x its unmutated time, at least 10 s.

    Raises:
        runner.UsageError: no goldens, a manifest problem, or a case failing unmutated.
    """
    found = runner.discover(golden_dir, registry=registry)
    vouched: dict[Path, Any] = {}
    found, problems = runner.check_manifest(golden_dir, found, vouched)
    if problems:
        path, why = next(iter(problems.items()))
        raise runner.UsageError(f"golden {path}: {why}")
    cases = runner.plan(found, ["cpu"])
    plan = Plan({op: [c for c in cases if c.op == op] for op in OPS}, golden_dir, {}, vouched)
    results = _run_cases(cases, ws.base / "build" / "bin", ws.scratch / "base-obtained", plan)
    bad = [r for r in results if r.status != Status.PASS]
    if bad:
        raise runner.UsageError(f"the unmutated cpu build does not pass {bad[0].case.id}: {bad[0].status}: "
                                f"{bad[0].reason[:300]} (fix that before judging mutants)")
    plan.timeouts = {r.case: max(10.0, 20.0 * r.seconds) for r in results}
    return plan


def run(mutants: list[Mutant], ws: Workspace, plan: Plan, jobs: int,
        on_done: Callable[[MutantResult], None] | None = None, own_op_only: bool = False) -> list[MutantResult]:
    """Run every mutant on ``jobs`` threads; results in mutant order.  With
    ``own_op_only`` (the generic pass), only the binary and goldens of the mutant's own op
    are rebuilt and run."""
    def one(m: Mutant) -> MutantResult:
        r = run_mutant(m, ws, plan, [m.op] if own_op_only else None)
        if on_done:
            on_done(r)
        return r

    children.reset()
    pool = ThreadPoolExecutor(max_workers=max(1, jobs))
    try:
        futures = [pool.submit(one, m) for m in mutants]
        results = [f.result() for f in futures]
    except BaseException:  # Ctrl-C, SIGTERM, SIGHUP: drop queued mutants, kill builds and binaries
        children.stop_all()
        # The workers end at once (their children are dead, new ones die at birth): wait
        # for them, so none writes into the scratch directory after its removal.
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return results


# ---------------------------------------------------------------------------------------
# Reports
# ---------------------------------------------------------------------------------------

def score(results: list[MutantResult]) -> dict[str, dict[str, Any]]:
    """Per op and "all": counts of each outcome and the score killed / (killed +
    survived): the share of mutants that compute a wrong output which the goldens catch
    (EQUIVALENT, IDENTICAL and STILLBORN mutants compute no wrong output, BAD_CLAIM ones
    count as killed)."""
    out: dict[str, dict[str, Any]] = {}
    for key in (*OPS, "all"):
        rs = [r for r in results if key == "all" or r.mutant.op == key]
        if not rs:
            continue
        c = {o: sum(r.outcome == o for r in rs) for o in OUTCOMES}
        killed = c[KILLED] + c[BAD_CLAIM]
        judged = killed + c[SURVIVED]
        out[key] = {"mutants": len(rs), **c, "score": (killed / judged) if judged else None}
    return out


def failing(results: list[MutantResult], triage: dict[tuple[str, str, str], Triage]) -> list[MutantResult]:
    """The results that make ``kdtr mutate`` exit 1: a catalogue mutant that survived, did
    not compile or was wrongly declared equivalent; a generic survivor not triaged
    "equivalent"."""
    bad = []
    for r in results:
        if r.mutant.kind == "catalogue" and r.outcome in (SURVIVED, STILLBORN, BAD_CLAIM):
            bad.append(r)
        elif r.mutant.kind == "generic" and r.outcome == SURVIVED:
            t = triage.get((r.mutant.file, r.mutant.find.strip(), r.mutant.replace.strip()))
            if t is None or t.verdict != "equivalent":
                bad.append(r)
    return bad


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ").replace("`", "'")


def markdown(results: list[MutantResult], triage: dict[tuple[str, str, str], Triage], env: dict[str, Any]) -> str:
    lines = ["# Mutation report", ""]
    lines += [f"- {k}: {v}" for k, v in env.items()]
    for kind in ("catalogue", "generic"):
        rs = [r for r in results if r.mutant.kind == kind]
        if not rs:
            continue
        lines += ["", f"## {kind.capitalize()}", "",
                  "| op | mutants | killed | survived | equivalent | identical | stillborn | bad claim | score |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for op, s in score(rs).items():
            lines.append(f"| {op} | {s['mutants']} | {s[KILLED]} | {s[SURVIVED]} | {s[EQUIVALENT]} | "
                         f"{s[IDENTICAL]} | {s[STILLBORN]} | {s[BAD_CLAIM]} | {_pct(s['score'])} |")
        surv = [r for r in rs if r.outcome in (SURVIVED, BAD_CLAIM)]
        if surv:
            lines += ["", "### Survivors" if kind == "catalogue" else "### Survivors and their triage", ""]
            for r in surv:
                m = r.mutant
                t = triage.get((m.file, m.find.strip(), m.replace.strip()))
                verdict = f" -- triage: {t.verdict}: {t.reason}" if t else (" -- untriaged" if kind == "generic" else "")
                lines.append(f"- {r.outcome} `{m.id}` {m.file}:{m.line}: `{_cell(m.find.strip())}` -> "
                             f"`{_cell(m.replace.strip())}`{_cell(verdict)}")
        if kind == "catalogue":
            lines += ["", "### Every catalogue mutant", "",
                      "| mutant | bug | outcome | killed by / reason |", "|---|---|---|---|"]
            for r in rs:
                why = ", ".join(k.removesuffix("@cpu") for k in r.killed_by) or r.detail
                lines.append(f"| `{r.mutant.id}` | {_cell(r.mutant.bug)} | {r.outcome} | {_cell(why)} |")
    return "\n".join(lines) + "\n"


def to_json(results: list[MutantResult], triage: dict[tuple[str, str, str], Triage],
            env: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"environment": env, "score": {}, "mutants": []}
    for kind in ("catalogue", "generic"):
        rs = [r for r in results if r.mutant.kind == kind]
        if rs:
            out["score"][kind] = score(rs)
    for r in results:
        j = r.to_json()
        t = triage.get((r.mutant.file, r.mutant.find.strip(), r.mutant.replace.strip()))
        if r.mutant.kind == "generic" and r.outcome == SURVIVED:
            j["triage"] = asdict(t) if t else None
        out["mutants"].append(j)
    return out


def sample(mutants: list[Mutant], per_op: int, seed: int = 0) -> list[Mutant]:
    """A deterministic random sample of at most ``per_op`` mutants of each op (all of them
    when ``per_op`` is 0), in the original order: random mutant sampling (Wong & Mathur,
    1995), which estimates the score of the whole set (docs/mutation.md)."""
    if per_op <= 0:
        return mutants
    keep: set[str] = set()
    for op in sorted({m.op for m in mutants}):
        ids = sorted(m.id for m in mutants if m.op == op)
        keep.update(random.Random(f"{seed}:{op}").sample(ids, min(per_op, len(ids))))
    return [m for m in mutants if m.id in keep]


def select(mutants: list[Mutant], only: Iterable[str]) -> list[Mutant]:
    """The mutants whose id matches one of the glob patterns (all without patterns)."""
    pats = list(only)
    if not pats:
        return mutants
    return [m for m in mutants if any(fnmatch.fnmatchcase(m.id, p) for p in pats)]


def write_reports(report_dir: Path, results: list[MutantResult], triage: dict[tuple[str, str, str], Triage],
                  env: dict[str, Any]) -> list[Path]:
    """Publish ``mutation.json`` and ``mutation.md`` in ``report_dir`` as one set
    (:class:`kdtr.fsutil.ReportSet` of kind ``mutation``: ``report_dir/.mutation ->
    .mutation-<id>``, the two names links through it), so that a reader never sees the
    JSON of one run beside the Markdown of another.

    Raises:
        kdtr.fsutil.UnsafePath: a report name is a link kdtr did not make, or not a file.
        OSError: the reports cannot be written.
    """
    md = markdown(results, triage, env).encode()
    js = (json.dumps(to_json(results, triage, env), indent=1) + "\n").encode()
    rset = fsutil.ReportSet(report_dir, "mutation", MUTATION_REPORTS)
    run_dir = rset.begin()
    with rset.discarded_on_error():
        fsutil.write_together([(run_dir / MUTATION_REPORTS[0], js), (run_dir / MUTATION_REPORTS[1], md)])
        return rset.publish()


MUTATION_REPORTS = ("mutation.json", "mutation.md")
