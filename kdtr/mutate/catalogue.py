"""The mutants: the hand-written catalogue (``mutants/<op>.toml``), the generic pass
(universalmutator's C++ rules over the cores of :data:`GENERIC_FILES`), the triage of
generic survivors (``mutants/generic_triage.toml``), sampling and selection by id.

Nothing here builds or runs anything but universalmutator (:func:`generic_mutants`).
"""

from __future__ import annotations

import fnmatch
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kdtr import children, userfiles

CATALOGUE_DIR = "mutants"
GPU_CATALOGUE_DIR = "mutants/gpu"  # the GPU catalogue: <kernel>.toml files (kdtr mutate --backend cuda)
TRIAGE_FILE = "generic_triage.toml"
# The cores the generic pass mutates (the catalogue may edit any file under cuda_tests/).
GENERIC_FILES = (
    "cuda_tests/kernels/tree_accept.cuh",
    "cuda_tests/kernels/tree_build.cuh",
    "cuda_tests/kernels/verify_attn.cuh",
    "cuda_tests/kernels/greedy_step.cuh",
)
OPS = ("tree_accept", "tree_build", "verify_attn", "greedy_step", "ddtree_decode")

KILLED, SURVIVED, EQUIVALENT, IDENTICAL, STILLBORN, BAD_CLAIM = (
    "KILLED", "SURVIVED", "EQUIVALENT", "IDENTICAL", "STILLBORN", "BAD_CLAIM")
OUTCOMES = (KILLED, SURVIVED, EQUIVALENT, IDENTICAL, STILLBORN, BAD_CLAIM)
# GPU mutants only (kdtr mutate --backend cuda): a survivor of the goldens on which a
# compute-sanitizer tool reports an error (counted as killed); BUILT: --build-only's verdict
# on a mutant that compiles and changes the binaries (nothing was run); NOT_RUN: not judged
# before the run's --time-budget was spent (not counted in the score; the run exits 1).
KILLED_BY_SANITIZER, BUILT, NOT_RUN = "KILLED_BY_SANITIZER", "BUILT", "NOT_RUN"
GPU_OUTCOMES = (KILLED, KILLED_BY_SANITIZER, SURVIVED, EQUIVALENT, IDENTICAL, STILLBORN, BAD_CLAIM, BUILT, NOT_RUN)

_REQUIRED = ("name", "op", "file", "bug", "origin", "find", "replace")
_OPTIONAL = ("equivalent",)
_GPU_REQUIRED = ("backend", "kernel")  # a GPU catalogue entry's fields on top of the CPU schema
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
    backend: str = "cpu"  # "cuda": a GPU catalogue mutant (mutants/gpu/<kernel>.toml)
    kernel: str = ""  # GPU mutants: the target kernel (the catalogue file's stem), else ""

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
    return _load_files(root, files, gpu=False)


def load_gpu_catalogue(root: Path, cat_dir: Path | None = None) -> list[Mutant]:
    """Every mutant of the GPU catalogue files ``<cat_dir>/<kernel>.toml`` (default
    ``<root>/mutants/gpu``), in file order, each checked to apply to today's code.

    Schema: the CPU catalogue's (:func:`load_catalogue`: ``name``, ``op``, ``file``,
    ``bug``, ``origin``, ``find``, ``replace``, optional ``equivalent``) with two more
    required string fields: ``backend = "cuda"`` and ``kernel``, the target kernel, equal
    to the file's stem (``select.toml``: ``kernel = "select"``). ``op`` is the op whose
    kernel it is (one of :data:`OPS`, any file), ``name`` is unique in its file; the id is
    ``gpu/<kernel>/<name>``.

    Raises:
        CatalogueError: an unreadable or malformed file, entry or field (the message names
            the file, ``mutant #N`` and the field), a duplicate name, or a mutant that no
            longer applies.
    """
    cat_dir = cat_dir or root / GPU_CATALOGUE_DIR
    files = sorted(cat_dir.glob("*.toml")) if cat_dir.is_dir() else []
    files = [p for p in files if p.name != TRIAGE_FILE]
    if not files:
        raise CatalogueError(f"{cat_dir}: no GPU catalogue files (<kernel>.toml)")
    for path in files:
        if not _NAME.match(path.stem):
            raise CatalogueError(f"{path}: the file's stem {path.stem!r} is not a kernel name ([a-z0-9_])")
    return _load_files(root, files, gpu=True)


def _load_files(root: Path, files: list[Path], gpu: bool) -> list[Mutant]:
    """The mutants of catalogue ``files`` (CPU: ``<op>.toml``; ``gpu``: ``<kernel>.toml``)."""
    mutants: list[Mutant] = []
    seen: set[str] = set()
    texts: dict[str, str] = {}
    required = _REQUIRED + _GPU_REQUIRED if gpu else _REQUIRED
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
            for key in required:
                if not isinstance(e.get(key), str) or not e[key]:
                    raise _entry_error(path, i, f"field {key!r} missing or not a non-empty string")
            for key in e:
                if key not in required and key not in _OPTIONAL:
                    raise _entry_error(path, i, f"unknown field {key!r}")
            if "equivalent" in e and (not isinstance(e["equivalent"], str) or not e["equivalent"].strip()):
                raise _entry_error(path, i, "field 'equivalent' must be the reason (a non-empty string)")
            if not _NAME.match(e["name"]):
                raise _entry_error(path, i, f"field 'name' {e['name']!r}: use [a-z0-9_]")
            if gpu:
                if e["backend"] != "cuda":
                    raise _entry_error(path, i, f"field 'backend' {e['backend']!r}: GPU catalogue entries are "
                                                "backend = \"cuda\"")
                if e["kernel"] != path.stem:
                    raise _entry_error(path, i, f"field 'kernel' {e['kernel']!r}: entries of {path.name} target "
                                                f"kernel {path.stem!r}")
            elif e["op"] != path.stem:
                raise _entry_error(path, i, f"field 'op' {e['op']!r}: entries of {path.name} belong to {path.stem!r}")
            if e["op"] not in OPS:
                raise _entry_error(path, i, f"field 'op' {e['op']!r}: not an op ({', '.join(OPS)})")
            rel = e["file"]
            if not rel.startswith("cuda_tests/") or "\0" in rel or ".." in Path(rel).parts:
                raise _entry_error(path, i, f"field 'file' {rel!r}: must be a file under cuda_tests/")
            if e["find"] == e["replace"]:
                raise _entry_error(path, i, "fields 'find' and 'replace' are equal: no edit")
            mid = f"gpu/{e['kernel']}/{e['name']}" if gpu else f"{e['op']}/{e['name']}"
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
            extra = {"backend": "cuda", "kernel": e["kernel"]} if gpu else {}
            m = Mutant(mid, e["op"], rel, e["bug"], e["origin"], e["find"], e["replace"], e.get("equivalent", ""),
                       **extra)
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

