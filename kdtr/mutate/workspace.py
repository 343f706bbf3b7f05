"""The scratch build of the mutants: the unmutated CPU-only binaries, built once and
cached in ``build/mutate/base-<digest>``, what each binary is built from (make's own
database and dependency files), and one copy of that build per mutant.

Every ``make`` runs in a process group of its own (:mod:`kdtr.children`): an interruption
kills make and every compiler it runs.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from kdtr import children, fsutil
from kdtr import run as runner
from kdtr.mutate.catalogue import OPS

_STAGING_MARK = ".kdtr-staging"
_GRAPH_FILE = "make-graph.json"  # in the base build: target -> prerequisites, from `make -pq`
CONFIG_STAMP = "build/config.stamp"  # the Makefile's record of the build configuration


def binary(op: str) -> str:
    """The CPU binary of ``op``, relative to a workspace (``build/bin/kdtr_<op>``)."""
    return f"build/bin/kdtr_{op}"


def _make_cmd(targets: list[str], cxxflags: str | None, *flags: str) -> list[str]:
    cmd = ["make", *flags, "NO_CUDA=1", "BUILD=build", *targets]
    if cxxflags is not None:
        cmd.append(f"CXXFLAGS={cxxflags}")
    return cmd


def _make(cwd: Path, targets: list[str], cxxflags: str | None) -> subprocess.CompletedProcess:
    """``make -s NO_CUDA=1 BUILD=build TARGETS`` in ``cwd``, output captured, in its own
    process group (kdtr.children): an interruption kills make and every compiler it runs.

    Raises:
        runner.Terminated: the run is being interrupted (no build starts).
        OSError: make cannot be started.
    """
    if children.stopping():
        raise runner.Terminated(signal.SIGTERM)
    return children.run_captured(_make_cmd(targets, cxxflags, "-s"), cwd=cwd)


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


def _is_marked(d: Path, marker: str) -> bool:
    """``d`` is a real directory (not a link) holding the regular file ``marker``."""
    return d.is_dir() and not d.is_symlink() and (d / marker).is_file() and not (d / marker).is_symlink()


# `target [target...]: prerequisites [| order-only]` in make's database (not a variable)
_RULE = re.compile(r"([^#\s:=][^:=]*?):(?!=)(?!:)(.*)\Z")


def parse_rules(text: str, graph: dict[str, set[str]] | None = None) -> dict[str, set[str]]:
    """Add the rules of ``text`` (make's database from ``make -p``, or a ``.d`` file) to
    ``graph`` (target -> its normal prerequisites; order-only ones and recipes skipped)."""
    graph = {} if graph is None else graph
    for line in text.replace("\\\n", " ").split("\n"):
        if not line or line[0] in "#\t " or "=" in line.partition(":")[2][:2]:
            continue
        m = _RULE.match(line)
        if not m or ":=" in m.group(2) or " = " in m.group(2):
            continue
        deps = m.group(2).split("|")[0].split()
        for target in m.group(1).split():
            graph.setdefault(target, set()).update(deps)
    return graph


def sources_of(graph: dict[str, set[str]], targets: Iterable[str]) -> set[str]:
    """Every file name reachable from ``targets`` through ``graph`` (the targets excluded)."""
    seen: set[str] = set()
    todo = list(targets)
    while todo:
        for dep in graph.get(todo.pop(), ()):
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


class Workspace:
    """A scratch copy of Makefile + cuda_tests/ with the unmutated CPU binaries built,
    and, per binary, the files it is built from.

    The unmutated build is kept in ``cache_dir/base-<digest>`` (default
    ``<root>/build/mutate``), keyed by the bytes of Makefile and cuda_tests/ and the
    flags, so a second run on unchanged sources skips it.  With it, make's dependency
    graph of the binaries (``make -pq``: the Makefile's rules and the ``.d`` files the
    compiler wrote) is kept in ``make-graph.json``, so a run on unchanged sources starts
    no make at all.  Mutant copies go to ``scratch``.

    The cache is kdtr's own: its lock ``cache_dir/.lock`` is opened without following a
    link (:func:`kdtr.fsutil.open_lock`; a link or a file kdtr did not make there is
    refused, untouched, and nothing is written into it); a build is made in a staging
    directory ``cache_dir/.base-tmp-*`` and renamed into place whole; and only directories
    carrying kdtr's markers (``.complete``, ``.kdtr-staging``) are ever removed.

    ``on_build(base)`` is called before the unmutated build is made (not when it is
    cached): the CLI says then that it builds.

    Raises:
        kdtr.fsutil.UnsafePath: (an OSError) the lock file is a link or not kdtr's.
        RuntimeError: the unmutated build failed, or make's graph names no source of a binary.
    """

    def __init__(self, root: Path, scratch: Path, cxxflags: str | None = None, cache_dir: Path | None = None, *,
                 on_build: Callable[[Path], None] | None = None) -> None:
        self.root = root
        self.scratch = scratch
        self.cxxflags = cxxflags
        cache_dir = cache_dir or root / self.CACHE
        self.base = cache_dir / f"base-{self._key()}"
        cache_dir.mkdir(parents=True, exist_ok=True)
        lock = fsutil.open_lock(cache_dir / ".lock")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)  # concurrent runs build the cache once
            if not _is_marked(self.base, ".complete"):
                if on_build is not None:  # only when a build runs (a cached one is silent)
                    on_build(self.base)
                self._build_base(cache_dir)
            self.graph = self._load_graph()
        finally:
            os.close(lock)
        self.digests = {op: self.binary_digest(self.base / binary(op)) for op in OPS}
        self.deps: dict[str, set[str]] = {op: self.sources(self.graph, [op]) for op in OPS}
        lost = [op for op in OPS if not any(n.startswith("cuda_tests/") for n in self.deps[op])]
        if lost:  # never judge mutants against a graph that says a binary is built from nothing
            raise RuntimeError(f"make's dependency graph ({self.base / _GRAPH_FILE}) lists no source of "
                               f"{binary(lost[0])}: remove {self.base} and run again")
        self._file_digests: dict[str, str] = {}
        self._n = 0
        self._lock = threading.Lock()

    CACHE = Path("build") / "mutate"  # the default cache_dir, under the root
    VARIANT = "CPU"  # in messages: "the unmutated CPU build failed"

    def _key(self) -> str:
        """The name of the unmutated build in the cache (``base-<key>``)."""
        return _tree_digest(self.root, self.cxxflags)

    base_jobs = 1  # make jobs of the unmutated build (the CPU build: make's default, one)

    def build(self, cwd: Path, targets: list[str], jobs: int = 1) -> subprocess.CompletedProcess:
        """``make`` of ``targets`` in the build ``cwd`` (the base's staging, or a mutant's
        copy); ``jobs``: make's ``-j`` (the CPU build ignores it: one job).

        Raises:
            runner.Terminated: the run is being interrupted (no build starts).
            OSError: make cannot be started.
        """
        return _make(cwd, targets, self.cxxflags)

    def _make_cmd(self, targets: list[str], *flags: str) -> list[str]:
        return _make_cmd(targets, self.cxxflags, *flags)

    def _seed(self, tmp: Path) -> None:
        """Put what the unmutated build may reuse into its staging directory ``tmp`` (the CPU
        build: nothing)."""

    def binary_digest(self, path: Path) -> str:
        """The digest two builds of a binary are compared by (IDENTICAL): sha256 of its bytes."""
        return _digest(path)

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
            self._seed(tmp)
            r = self.build(tmp, [binary(op) for op in OPS], jobs=self.base_jobs)
            if r.returncode != 0:
                raise RuntimeError(f"the unmutated {self.VARIANT} build failed:\n{r.stderr[-3000:]}")
            self._write_graph(tmp)
            (tmp / ".complete").touch()
            os.rename(tmp, self.base)  # whole or absent: never a half-copied cache
        except BaseException:
            fsutil.remove_marked_dir(tmp, _STAGING_MARK)
            raise

    def _write_graph(self, d: Path) -> dict[str, set[str]]:
        """make's dependency graph of the op binaries in the build ``d`` (``make -pq``: no
        recipe runs), written to ``d/make-graph.json``."""
        if children.stopping():
            raise runner.Terminated(signal.SIGTERM)
        r = children.run_captured(self._make_cmd([binary(op) for op in OPS], "-pq"), cwd=d)
        if r.returncode not in (0, 1):  # 1: something is out of date (-q); 2: make failed
            raise RuntimeError(f"make -pq (the dependency graph of the unmutated build) failed:\n{r.stderr[-3000:]}")
        start = r.stdout.find("\n# Files\n")
        graph = parse_rules(r.stdout[start:] if start >= 0 else r.stdout)
        graph = {t: deps for t, deps in graph.items() if deps}
        fsutil.atomic_write(d / _GRAPH_FILE, json.dumps({t: sorted(v) for t, v in sorted(graph.items())}).encode())
        return graph

    def _load_graph(self) -> dict[str, set[str]]:
        # Called under the cache lock. A base built before the graph was kept gets it now.
        path = self.base / _GRAPH_FILE
        try:
            data = json.loads(path.read_bytes())
            if isinstance(data, dict) and all(isinstance(v, list) for v in data.values()):
                return {str(t): {str(x) for x in v} for t, v in data.items()}
        except (OSError, ValueError):
            pass
        return self._write_graph(self.base)

    def sources(self, graph: dict[str, set[str]], ops: Iterable[str]) -> set[str]:
        """The files under the workspace (repo-relative, not build outputs) that the
        binaries of ``ops`` are built from according to ``graph``, with ``Makefile`` and the
        build configuration (``build/config.stamp``).  A name outside the workspace (an
        absolute path, ``..``) is kept as is: :meth:`source_digests` refuses it."""
        out = {"Makefile", CONFIG_STAMP}
        for name in sources_of(graph, [binary(op) for op in ops]):
            if name.startswith("build/"):
                continue  # outputs of the build (objects, stamps); what they are made of is followed
            out.add(name)
        return out

    def source_digests(self, names: Iterable[str], edited: tuple[str, str] | None = None) -> dict[str, str] | None:
        """sha256 of each of ``names`` in the unmutated build (``edited``: ``(file,
        text)``, that file's text after a mutant's edit instead); None when a name is not a
        regular file inside the workspace (then no verdict may be cached)."""
        out: dict[str, str] = {}
        for name in sorted(names):
            if edited and name == edited[0]:
                out[name] = hashlib.sha256(edited[1].encode("utf-8")).hexdigest()
                continue
            if name not in self._file_digests:
                p = Path(name)
                if p.is_absolute() or ".." in p.parts or not (self.base / p).is_file() or (self.base / p).is_symlink():
                    return None
                self._file_digests[name] = _digest(self.base / p)
            out[name] = self._file_digests[name]
        return out

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

    def mutant_graph(self, d: Path) -> dict[str, set[str]]:
        """The base graph plus the rules of the ``.d`` files in the mutant build ``d``
        (what the compiler found the edited sources include)."""
        graph = {t: set(v) for t, v in self.graph.items()}
        for dep in sorted((d / "build").rglob("*.d")):
            try:
                parse_rules(dep.read_text(encoding="utf-8", errors="replace"), graph)
            except OSError:
                continue
        return graph


# ---------------------------------------------------------------------------------------
# The CUDA build (kdtr mutate --backend cuda)
# ---------------------------------------------------------------------------------------

_ANON_NAMESPACE = re.compile(rb"_GLOBAL__N__[0-9a-f]{8}_")  # nvcc's name of an anonymous namespace
CUDA_ARCH = "90"  # the H200's: the Makefile's default, given explicitly (the Hopper kernel needs 90)


def nvcc_path() -> str | None:
    """The nvcc the Makefile would use ($NVCC, default ``nvcc``, on PATH), or None."""
    return shutil.which(os.environ.get("NVCC") or "nvcc")


def _tool_version(cmd: list[str]) -> str:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return r.stdout.strip()


class CudaWorkspace(Workspace):
    """A scratch copy of Makefile + cuda_tests/ with the unmutated CUDA binaries built
    (``make BUILD=build CUDA_ARCH=90``, nvcc), cached in ``cache_dir/base-<digest>``
    (default ``<root>/build/mutate-cuda``, apart from the CPU build's cache so that neither
    build removes the other), with make's dependency graph: as :class:`Workspace`.

    The key of the cached build: the bytes of Makefile and cuda_tests/, the variant
    ("cuda"), CUDA_ARCH, the nvcc found and its ``--version``, $CXX, $NVCCFLAGS, $CXXFLAGS,
    $LDFLAGS, $CUTLASS_INCLUDE and the CUTLASS header trees of the checkout's
    ``build/third_party``.

    The Hopper kernel's CUTLASS headers: ``$CUTLASS_INCLUDE`` if set (make reads it from
    the environment), else the checkout's ``build/third_party`` (what ``make deps``
    extracts) is linked into the build as ``build/third_party``, so the Makefile finds
    them where it looks itself and writes the same configuration as the checkout's build.
    That lets the unmutated build start from the checkout's own objects and binaries
    (``build/obj``, ``build/bin``, ``build/config.stamp`` copied with their modification
    times): make then rebuilds only what is out of date there, nothing at all right after a
    ``make build`` of the same sources (a different configuration rebuilds everything, as
    make always does). ``seed=False``: build from nothing.

    Binaries are compared (IDENTICAL) stripped and with nvcc's path-dependent names
    normalised (:meth:`binary_digest`): nvcc names a temporary file (``tmpxft_<pid>_...``)
    in each object's symbol table and each anonymous namespace by a hash of the source's
    directory, so two compiles of the same source in two copies never give the same bytes.

    ``jobs``: make's ``-j`` for the unmutated build (each mutant's make runs one job: the
    mutants build in parallel). ``wgmma``: whether the build has the Hopper kernel.

    Raises:
        kdtr.fsutil.UnsafePath: (an OSError) the lock file is a link or not kdtr's.
        RuntimeError: the unmutated build failed, or make's graph names no source of a binary.
    """

    CACHE = Path("build") / "mutate-cuda"
    VARIANT = "CUDA"

    def __init__(self, root: Path, scratch: Path, cache_dir: Path | None = None, *, jobs: int = 1,
                 seed: bool = True, on_build: Callable[[Path], None] | None = None) -> None:
        self.base_jobs = max(1, jobs)
        self.seed = seed
        scratch.mkdir(parents=True, exist_ok=True)  # binary_digest's stripped copies go there
        super().__init__(root, scratch, None, cache_dir, on_build=on_build)
        try:
            config = (self.base / CONFIG_STAMP).read_text(encoding="utf-8", errors="replace")
        except OSError:
            config = ""
        self.config = config.strip()
        self.wgmma = "wgmma=sm_90a" in config

    def _third_party(self) -> Path:
        return self.root / "build" / "third_party"

    def _key(self) -> str:
        h = hashlib.sha256(_tree_digest(self.root, None).encode())
        nvcc = nvcc_path()
        env = {k: os.environ.get(k) for k in ("CXX", "NVCCFLAGS", "CXXFLAGS", "LDFLAGS", "CUTLASS_INCLUDE")}
        tp = self._third_party()
        trees = sorted(p.name for p in tp.glob("cutlass-*")) if tp.is_dir() else []
        h.update(repr(("cuda", CUDA_ARCH, nvcc, _tool_version([nvcc, "--version"]) if nvcc else "", env,
                       trees)).encode())
        return h.hexdigest()[:16]

    def _vars(self) -> list[str]:
        return ["BUILD=build", f"CUDA_ARCH={CUDA_ARCH}"]

    def build(self, cwd: Path, targets: list[str], jobs: int = 1) -> subprocess.CompletedProcess:
        if children.stopping():
            raise runner.Terminated(signal.SIGTERM)
        return children.run_captured(["make", "-s", f"-j{max(1, jobs)}", *self._vars(), *targets], cwd=cwd)

    def _make_cmd(self, targets: list[str], *flags: str) -> list[str]:
        return ["make", *flags, *self._vars(), *targets]

    def _seed(self, tmp: Path) -> None:
        (tmp / "build").mkdir(exist_ok=True)
        tp = self._third_party()
        if tp.is_dir() and not os.environ.get("CUTLASS_INCLUDE"):
            os.symlink(tp.resolve(), tmp / "build" / "third_party")  # the CUTLASS headers, not copied
        if not self.seed:
            return
        src = self.root / "build"
        try:
            stamp = (src / "config.stamp").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return
        if not stamp.startswith("cuda"):
            return  # a CPU-only build of the checkout: nothing to reuse
        for sub in ("obj", "bin"):
            if (src / sub).is_dir() and not (src / sub).is_symlink():
                shutil.copytree(src / sub, tmp / "build" / sub, symlinks=True,
                                ignore=shutil.ignore_patterns("pic", "*.tmp"))
        shutil.copy2(src / "config.stamp", tmp / CONFIG_STAMP)

    def binary_digest(self, path: Path) -> str:
        """sha256 of the binary stripped (symbols and the build-id note removed: ``strip
        -R .note.gnu.build-id``), each anonymous namespace's name ``_GLOBAL__N__<8 hex>_``
        written with zeros: nvcc names each translation unit's anonymous namespace by a hash
        of its directory, so the same source compiled in another copy of the build gives
        other names, and nothing else. Without ``strip``, of its bytes (then no two builds
        compare equal: no mutant is IDENTICAL, each is run)."""
        strip = shutil.which("strip")
        if strip is None:
            return _digest(path)
        fd, tmp = tempfile.mkstemp(prefix="kdtr-strip-", dir=self.scratch)
        os.close(fd)
        try:
            r = children.run_captured([strip, "-R", ".note.gnu.build-id", "-o", tmp, str(path)])
            if r.returncode != 0:
                return _digest(path)
            data = _ANON_NAMESPACE.sub(b"_GLOBAL__N__00000000_", Path(tmp).read_bytes())
            return hashlib.sha256(data).hexdigest()
        finally:
            try:
                os.unlink(tmp)
            except FileNotFoundError:  # strip removes its output when it fails
                pass
