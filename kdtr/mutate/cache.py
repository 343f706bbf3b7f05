"""The verdict cache of ``kdtr mutate``: one small JSON file per mutant verdict in
``build/mutate-cache/`` (docs/mutation.md, "The verdict cache").

An entry's name is the sha256 of its *key*: the mutant (every field: id, file, line,
find, replace, the equivalence claim, ...), the ops whose binaries it rebuilds, the
sha256 of every golden of those ops (the manifest's), the kdtr version and a digest of
kdtr's Python sources (the code that judges), the numpy version, the environment variables
the binaries read (:data:`BINARY_ENV`), and the cache format.  The entry holds the
key itself, the files the mutated binaries were built from with their sha256 after the
edit (make's dependency graph and the mutant build's ``.d`` files: the cores, headers and
mains, ``Makefile`` and ``build/config.stamp``, the record of compiler and flags), and the
verdict.  A verdict is used only when the key inside the entry equals the key of this run
and every listed source still has its digest, and the unmutated build's dependency graph
names no file the entry does not list; anything else (unreadable, not JSON, a
foreign or tampered entry, a verdict that cannot be this mutant's) is a miss: the mutant
runs again and its entry is rewritten.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import threading
from pathlib import Path
from typing import Any

import numpy as np

import kdtr
from kdtr import fsutil
from kdtr.mutate.catalogue import BAD_CLAIM, EQUIVALENT, IDENTICAL, KILLED, STILLBORN, SURVIVED, CatalogueError, Mutant
from kdtr.mutate.execute import MutantResult, Plan
from kdtr.mutate.workspace import CONFIG_STAMP, Workspace

FORMAT = "kdtr-mutate-verdict/1"
MAX_ENTRY = 1 << 20  # bytes: an entry is a few hundred; a bigger file is not ours
CACHE_DIR = Path("build") / "mutate-cache"
_KILLING = (KILLED, BAD_CLAIM)

# The environment variables the binaries read (their limits, the CRC's threads): a verdict
# reached under other limits is not this run's.
BINARY_ENV = ("KDTR_MAX_OUTPUT_BYTES", "KDTR_MAX_SCRATCH_BYTES", "KDTR_CRC_THREADS")

_judge_digest: str | None = None


def judge_digest() -> str:
    """sha256 of every Python source of the installed kdtr package (path and bytes): any
    change of the code that runs and judges the goldens gives other keys."""
    global _judge_digest
    if _judge_digest is None:
        pkg = Path(kdtr.__file__).resolve().parent
        h = hashlib.sha256()
        for p in sorted(pkg.rglob("*.py")):
            h.update(p.relative_to(pkg).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
        _judge_digest = h.hexdigest()
    return _judge_digest


def _golden_digest(case: Any, plan: Plan) -> str:
    v = plan.vouched.get(case.golden)
    if v is not None:
        return str(v.sha256)
    return hashlib.sha256(Path(case.golden).read_bytes()).hexdigest()


class VerdictCache:
    """Verdicts of earlier runs, in ``directory`` (default ``<root>/build/mutate-cache``).

    ``hits`` and ``stored`` count this run's cache hits and written entries.  Never
    raises for the cache's own state: an entry that cannot be read or trusted is a miss,
    one that cannot be written is skipped.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.hits = 0
        self.stored = 0
        self._count = threading.Lock()
        try:
            if self.directory.is_symlink():
                self.usable = False  # not kdtr's: never written through
            else:
                self.directory.mkdir(parents=True, exist_ok=True)
                self.usable = self.directory.is_dir()
        except OSError:
            self.usable = False

    def key(self, m: Mutant, plan: Plan, ops: list[str]) -> dict[str, Any]:
        """The key of ``m``'s verdict (see the module docstring); JSON-serialisable."""
        goldens = {c.id: _golden_digest(c, plan) for op in ops for c in plan.cases.get(op, [])}
        mutant = {k: getattr(m, k) for k in ("id", "kind", "op", "file", "line", "bug", "origin", "find",
                                             "replace", "equivalent")}
        return {"format": FORMAT, "kdtr": kdtr.__version__, "judge": judge_digest(), "mutant": mutant,
                "ops": list(ops), "goldens": goldens, "env": {k: os.environ.get(k) for k in BINARY_ENV},
                "numpy": np.__version__}

    def _path(self, key: dict[str, Any]) -> Path:
        blob = json.dumps(key, sort_keys=True, separators=(",", ":")).encode()
        return self.directory / f"{hashlib.sha256(blob).hexdigest()}.json"

    @staticmethod
    def _read(path: Path) -> bytes | None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_ENTRY:
                return None
            data = os.read(fd, MAX_ENTRY + 1)
            return data if len(data) <= MAX_ENTRY else None
        except OSError:
            return None
        finally:
            os.close(fd)

    def get(self, m: Mutant, ws: Workspace, plan: Plan, ops: list[str]) -> MutantResult | None:
        """The cached verdict of ``m``, or None (no entry, or one that is not trusted)."""
        if not self.usable or not ops:
            return None
        key = self.key(m, plan, ops)
        data = self._read(self._path(key))
        if data is None:
            return None
        try:
            entry = json.loads(data)
        except (ValueError, RecursionError):
            return None
        r = self._verdict(entry, key, m, ws, plan, ops)
        if r is not None:
            with self._count:
                self.hits += 1
        return r

    @staticmethod
    def _verdict(entry: Any, key: dict[str, Any], m: Mutant, ws: Workspace, plan: Plan,
                 ops: list[str]) -> MutantResult | None:
        if not isinstance(entry, dict) or set(entry) != {"key", "sources", "result"} or entry["key"] != key:
            return None
        sources, res = entry["sources"], entry["result"]
        if (not isinstance(sources, dict)
                or not all(isinstance(k, str) and isinstance(v, str) for k, v in sources.items())
                or not {m.file, "Makefile", CONFIG_STAMP} <= set(sources)):
            return None
        # Every file the unmutated build of these binaries is made of now must be one the
        # entry's build was made of: a new dependency (a header that now shadows an
        # include, a new object) is a miss, even though every listed file is unchanged.
        if not ws.sources(ws.graph, ops) <= set(sources):
            return None
        try:
            edited = m.apply((ws.base / m.file).read_text(encoding="utf-8"))
            now = ws.source_digests(sources, (m.file, edited))
        except (OSError, UnicodeDecodeError, CatalogueError):
            return None
        if now != sources:
            return None
        if not isinstance(res, dict) or set(res) != {"outcome", "killed_by", "detail", "seconds"}:
            return None
        outcome, killed_by, detail, seconds = res["outcome"], res["killed_by"], res["detail"], res["seconds"]
        allowed = (EQUIVALENT, BAD_CLAIM) if m.equivalent else (KILLED, SURVIVED)
        case_ids = {c.id for op in ops for c in plan.cases.get(op, [])}
        if (outcome not in (*allowed, IDENTICAL, STILLBORN) or not isinstance(detail, str)
                or not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not 0 <= seconds < 1e7
                or not isinstance(killed_by, list) or not all(isinstance(k, str) and k in case_ids for k in killed_by)
                or len(set(killed_by)) != len(killed_by) or bool(killed_by) != (outcome in _KILLING)):
            return None
        return MutantResult(m, outcome, list(killed_by), detail, float(seconds), cached=True, sources=sources)

    def put(self, r: MutantResult, ws: Workspace, plan: Plan, ops: list[str]) -> None:
        """Store ``r``'s verdict (not when its sources are unknown, or it came from here)."""
        if not self.usable or r.cached or r.sources is None or not ops:
            return
        key = self.key(r.mutant, plan, ops)
        entry = {"key": key, "sources": r.sources,
                 "result": {"outcome": r.outcome, "killed_by": r.killed_by, "detail": r.detail,
                            "seconds": round(r.seconds, 2)}}
        try:
            fsutil.atomic_write(self._path(key), (json.dumps(entry, sort_keys=True, indent=1) + "\n").encode())
            with self._count:
                self.stored += 1
        except OSError:
            pass  # a cache that cannot be written only costs the next run time
