"""Golden lifecycle: write, list, hash and check the golden files (docs/harness.md, "Goldens").

Goldens live at ``golden/<op>/<config>.kdtr``; ``golden/MANIFEST.json`` lists each with
its op, config, seed, sha256, size, generator version and the numpy version that wrote
it, plus (:func:`host_record`) the library versions of the regen and which libraries shape
golden bytes: only numpy's PCG64 stream and kdtr's own code do (docs/harness.md, "Host
independence of goldens"). Committed goldens stay under :data:`COMMITTED_BUDGET` bytes in all. Configurations
whose generator marks them ``tier = "cache"`` are too large to commit: they are listed
in the manifest with their hash and generated on demand into a cache directory.

What a run judges also starts here: :func:`discover` (the goldens on disk, and the second
tier on demand), :func:`check_manifest` (each held to its manifest entry: the vouches of
:mod:`kdtr.vouch`), :func:`load_known_failures` and :func:`stale_waivers` (the waivers of
``golden/known_failures.json``).

The configurations come from a :class:`kdtr.registry.Registry` passed in by the caller
(``kdtr.generators.REGISTRY`` for the ``kdtr`` command); this module never imports generators.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import signal
import stat
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import format as kformat
from . import fsutil, userfiles
from .compare import ulp_distance
from .errors import KdtrError
from .registry import Registry
from .vouch import Vouch, vouches_of_manifest
from .vouch import sha256_of as sha256_now

MANIFEST_NAME = "MANIFEST.json"
MANIFEST_FORMAT = 1
COMMITTED_BUDGET = 32 * 1024 * 1024


def repo_root() -> Path:
    """The checkout root: $KDTR_ROOT, else the directory above this package."""
    env = os.environ.get("KDTR_ROOT")
    return Path(env) if env else Path(__file__).resolve().parent.parent


def default_golden_dir() -> Path:
    return repo_root() / "golden"


def missing_golden_dir(gdir: Path) -> str:
    """The one-line refusal for a golden directory ``gdir`` that does not exist. For the
    default directory it also says where kdtr looked and what to do: an installed kdtr
    (``pip install``, no checkout above the package) finds goldens only through
    ``$KDTR_ROOT`` or ``--golden-dir``."""
    msg = f"golden directory {gdir} does not exist"
    if Path(gdir) == default_golden_dir():
        where = "$KDTR_ROOT" if os.environ.get("KDTR_ROOT") else "the directory above the kdtr package"
        msg += (f" (the default: golden/ of the kdtr checkout, taken to be {where}, {repo_root()}); "
                "set KDTR_ROOT to a kdtr checkout, or give the golden directory "
                "(kdtr --golden-dir DIR, pytest --kdtr-golden-dir DIR, kdtr.testing golden_dir=DIR)")
    return msg


def sha256_of(path: Path) -> str:
    """The sha256 (hex) of the regular file ``path``.

    Raises:
        kdtr.errors.Io: (an OSError) not a regular file: a FIFO is refused, never blocked on.
        OSError: unreadable.
    """
    h = hashlib.sha256()
    with open(kformat._open_regular(os.fspath(path)), "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# What shapes a golden's bytes (docs/harness.md, "Host independence of goldens"); written into
# the manifest by `kdtr regen` beside the versions it ran with.
GOLDEN_BYTES = {
    "shaped_by": {
        "numpy": "PCG64 seeded by SeedSequence: the raw 64-bit stream, the same in every numpy version (NEP 19); "
                 "IEEE elementwise arithmetic, comparisons, integer operations and stable sorts",
        "kdtr": "its own draws (kdtr/generators/rng.py), float64 -> bf16/f32 rounding (kdtr/bf16.py), exp, log, "
                "fixed-order sums and exact dot products (kdtr/detmath.py)",
    },
    "not_shaped_by": {
        "ml_dtypes": "provides the bf16 dtype only (a view of kdtr's bit patterns); it rounds nothing",
        "numpy Generator methods, exp/log/power, sum order, casts to bf16": "not used where bits reach a golden",
        "BLAS, its thread count": "it multiplies integer-valued slices whose sums are exact in any order",
        "CPU, SIMD width": "only correctly rounded or exact operations reach a golden",
        "python": "IEEE float arithmetic only (no pow or libm transcendentals)",
    },
}


def host_record() -> dict[str, Any]:
    """The manifest's record of the host that ran ``kdtr regen``: ``generated_with`` (the
    versions of numpy, ml_dtypes and Python) and ``golden_bytes`` (:data:`GOLDEN_BYTES`:
    which of them shape golden bytes, which do not). ``kdtr regen --check`` does not compare
    it: goldens regenerate bit-identically whatever these versions."""
    import platform
    from importlib import metadata

    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "not installed"

    return {"generated_with": {"numpy": np.__version__, "ml_dtypes": version("ml_dtypes"),
                               "python": platform.python_version()},
            "golden_bytes": GOLDEN_BYTES}


def write_one(golden_dir: Path, registry: Registry, op: str, config: str) -> tuple[Path, dict[str, Any]]:
    """Generate configuration ``op/config`` of ``registry`` into ``golden_dir/op/config.kdtr``;
    return its manifest entry."""
    tensors, metadata = registry.generate(op, config)
    dest = golden_dir / op / f"{config}.kdtr"
    fsutil.make_dirs(golden_dir, op)  # golden_dir/op, never through a link (kdtr/fsutil.py)
    kformat.save(dest, tensors, metadata)
    entry = {
        "op": op,
        "config": config,
        "seed": int(metadata["seed"]),
        "sha256": sha256_of(dest),
        "size": dest.stat().st_size,
        "generator_version": int(metadata["generator_version"]),
        "numpy_version": np.__version__,
        "tier": registry.tier_of(op, config),
    }
    return dest, entry


def regenerate(
    golden_dir: Path,
    registry: Registry,
    cache_dir: Path | None = None,
    on_config: Callable[[str, str, int, int], None] | None = None,
) -> dict[str, Any]:
    """Write every committed golden of ``registry`` and the manifest, and swap them in as one set.

    The new set is generated into a staging directory beside ``golden_dir`` (files of the
    old directory that no configuration writes, such as ``known_failures.json``, are carried
    over); only when every golden and the manifest are written does the staging directory
    replace ``golden_dir`` (two renames with SIGINT/SIGTERM/SIGHUP held off in between). An
    interrupted or failed regen leaves the old set and its manifest untouched; a regen
    killed between the two renames is repaired by the next one. Concurrent regens of one
    directory wait for each other (``flock`` on the parent directory). A ``golden_dir``
    that is a symbolic link is resolved first: the set it points to is replaced, the link
    stays as it was.

    Second-tier configurations are written into ``cache_dir`` (default the new set's
    ``.cache``, git-ignored) so that their hash can be recorded.

    ``on_config(op, config, i, n)`` is called before each configuration (progress).

    Returns:
        The manifest written.

    Raises:
        ValueError: the committed goldens exceed :data:`COMMITTED_BUDGET`.
        OSError: the parent directory is not writable.
    """
    # The directory itself is swapped, never a link to it: a symlinked golden/ keeps its
    # link, pointing at the new set (the swap happens where the link leads).
    golden_dir = Path(os.path.realpath(golden_dir))
    parent = golden_dir.parent
    parent.mkdir(parents=True, exist_ok=True)
    lock_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        _repair_interrupted_swap(golden_dir)
        staging = Path(tempfile.mkdtemp(prefix=f".{golden_dir.name}.regen-", dir=parent))
        try:
            mask = os.umask(0o022)
            os.umask(mask)
            os.chmod(staging, (golden_dir.stat().st_mode & 0o7777) if golden_dir.is_dir() else 0o777 & ~mask)
            manifest = _generate_set(staging, registry, None if cache_dir is None else Path(cache_dir), on_config)
            if golden_dir.is_dir():
                _carry_over(golden_dir, staging, manifest)
            _swap_in(staging, golden_dir)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
    finally:
        os.close(lock_fd)
    return manifest


def _generate_set(
    staging: Path, registry: Registry, cache_dir: Path | None, on_config: Callable[[str, str, int, int], None] | None
) -> dict[str, Any]:
    cache_dir = cache_dir or staging / ".cache"
    files: dict[str, Any] = {}
    configs = registry.all_configs()
    for i, (op, config) in enumerate(configs):
        if on_config:
            on_config(op, config, i, len(configs))
        target = staging if registry.tier_of(op, config) == "committed" else cache_dir
        _, entry = write_one(target, registry, op, config)
        files[f"{op}/{config}.kdtr"] = entry
    manifest = {"format": MANIFEST_FORMAT, "files": files, **host_record()}
    committed = sum(e["size"] for e in files.values() if e["tier"] == "committed")
    if committed > COMMITTED_BUDGET:
        raise ValueError(f"committed goldens total {committed} bytes > budget {COMMITTED_BUDGET}")
    write_manifest(staging, manifest)
    return manifest


def _carry_over(old: Path, staging: Path, manifest: dict[str, Any]) -> None:
    """Copy what the old set holds and the regen does not write (known_failures.json,
    orphan goldens, which ``kdtr regen --check`` and ``kdtr run`` then report)."""
    for src in old.rglob("*"):
        rel = src.relative_to(old)
        if rel.parts[0] == ".cache" or rel.as_posix() == MANIFEST_NAME or rel.as_posix() in manifest["files"]:
            continue
        dest = staging / rel
        if src.is_dir() and not src.is_symlink():
            dest.mkdir(exist_ok=True)
        elif not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest, follow_symlinks=False)


_SWAP_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


def _swap_in(staging: Path, golden_dir: Path) -> None:
    old = golden_dir.parent / f".{golden_dir.name}.old-{os.getpid()}"
    blocked = threading.current_thread() is threading.main_thread()
    if blocked:
        signal.pthread_sigmask(signal.SIG_BLOCK, _SWAP_SIGNALS)
    try:
        if golden_dir.exists():
            os.rename(golden_dir, old)
        os.rename(staging, golden_dir)
    finally:
        if blocked:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _SWAP_SIGNALS)
    shutil.rmtree(old, ignore_errors=True)


def _repair_interrupted_swap(golden_dir: Path) -> None:
    """Undo what a regen killed mid-swap left (called under the regen lock): restore the
    old set if the directory itself is gone, then remove stale staging and old sets."""
    leftovers = sorted(golden_dir.parent.glob(f".{golden_dir.name}.old-*"))
    if not golden_dir.exists() and leftovers:
        os.rename(leftovers[-1], golden_dir)
        leftovers = leftovers[:-1]
    for stale in leftovers + sorted(golden_dir.parent.glob(f".{golden_dir.name}.regen-*")):
        shutil.rmtree(stale, ignore_errors=True)


def write_manifest(golden_dir: Path, manifest: dict[str, Any]) -> None:
    """Write ``golden_dir/MANIFEST.json`` atomically (:func:`kdtr.format.atomic_write`)."""
    text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    kformat.atomic_write(golden_dir / MANIFEST_NAME, text.encode("utf-8"))


def manifest_of_files(golden_dir: Path) -> dict[str, Any]:
    """A manifest listing the committed goldens now on disk (``*/*.kdtr``) as they are:
    for a golden directory assembled by hand or by a test, which ``kdtr run`` will then
    accept. ``kdtr regen`` writes the real one, from the generators."""
    files = {}
    for path in sorted(golden_dir.glob("*/*.kdtr")):
        try:
            meta = kformat.load(path, verify=False).metadata
        except KdtrError:  # listed as it is: `kdtr run` reports the defect
            meta = {}
        files[path.relative_to(golden_dir).as_posix()] = {
            "op": path.parent.name, "config": path.stem, "seed": int(meta.get("seed", 0)),
            "sha256": sha256_of(path), "size": path.stat().st_size,
            "generator_version": int(meta.get("generator_version", 0)), "numpy_version": np.__version__,
            "tier": "committed",
        }
    return {"format": MANIFEST_FORMAT, "files": files}


def read_manifest(golden_dir: Path) -> dict[str, Any]:
    """Parse ``golden_dir/MANIFEST.json``.

    Raises:
        FileNotFoundError: no manifest.
        OSError: not a regular file (:class:`kdtr.errors.Io`, never blocks), unreadable.
        ValueError: not valid JSON or not a kdtr manifest.
    """
    from .userfiles import load_json

    path = golden_dir / MANIFEST_NAME
    # a UserFileError (a ValueError) for a file too large, not UTF-8, malformed, nested too deep
    manifest = load_json(path, "manifest")
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT or "files" not in manifest:
        raise ValueError(f"{path}: not a kdtr manifest of format {MANIFEST_FORMAT}")
    if not isinstance(manifest["files"], dict):
        raise ValueError(f'{path}: "files": a JSON {type(manifest["files"]).__name__}, not an object of entries')
    for rel, entry in manifest["files"].items():
        if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str):
            raise ValueError(f'{path}: "files"[{json.dumps(rel)}]: not an entry (an object with a "sha256" string)')
    return manifest


@dataclass
class Drift:
    """One difference found by :func:`check`."""

    file: str
    kind: str  # missing | extra | unlisted | hash | tensor | metadata | unreadable | manifest
    detail: str

    def __str__(self) -> str:
        return f"{self.file}: {self.kind}: {self.detail}"


@dataclass
class CheckReport:
    drifts: list[Drift] = field(default_factory=list)
    checked: int = 0

    @property
    def ok(self) -> bool:
        return not self.drifts


def _tensor_drift(rel: str, name: str, old: np.ndarray, new: np.ndarray) -> Drift | None:
    """The drift of one tensor, counted per element by bit pattern: an element is unchanged
    when its bytes are equal, so NaN meets NaN of the same pattern (not ``NaN != NaN``), while
    a NaN that becomes a number (or the reverse), a NaN whose sign or payload changes, and
    -0.0 against +0.0 are changes. Float tensors also give the max ULP change over the
    elements that are numbers on both sides, and how many changed between NaN and number."""
    if old.dtype != new.dtype or old.shape != new.shape:
        return Drift(rel, "tensor", f"{name}: {old.dtype}{list(old.shape)} -> {new.dtype}{list(new.shape)}")
    if old.tobytes() == new.tobytes():
        return None
    raw = np.dtype(f"u{old.dtype.itemsize}")  # every KDTR dtype is 1, 2, 4 or 8 bytes
    changed = np.ascontiguousarray(old).reshape(-1).view(raw) != np.ascontiguousarray(new).reshape(-1).view(raw)
    n = int(np.count_nonzero(changed))
    if not (old.dtype.kind == "f" or old.dtype.name == "bfloat16"):
        return Drift(rel, "tensor", f"{name}: {n} of {old.size} elements changed")
    o_nan = np.isnan(np.asarray(old, np.float64)).reshape(-1)
    n_nan = np.isnan(np.asarray(new, np.float64)).reshape(-1)
    numbers = changed & ~o_nan & ~n_nan
    ulp = ulp_distance(old.reshape(-1)[numbers], new.reshape(-1)[numbers]) if numbers.any() else None
    parts = [f"max {int(np.max(ulp))} ULP" if ulp is not None else "no number changed"]
    if (k := int(np.count_nonzero(o_nan != n_nan))):
        parts.append(f"{k} between NaN and a number")
    if (k := int(np.count_nonzero(changed & o_nan & n_nan))):
        parts.append(f"{k} NaN bit patterns")
    what = "float output changed: " if name.startswith("expected.") else ""
    return Drift(rel, "tensor", f"{name}: {what}{n} of {old.size} elements changed ({', '.join(parts)})")


def _compare_files(rel: str, old_path: Path, new_path: Path) -> list[Drift]:
    try:
        old = kformat.load(old_path)
    except KdtrError as exc:
        return [Drift(rel, "unreadable", str(exc))]
    new = kformat.load(new_path)
    out: list[Drift] = []
    for name in sorted(set(old.tensors) | set(new.tensors)):
        if name not in new.tensors:
            out.append(Drift(rel, "tensor", f"{name}: in the committed file, no longer generated"))
        elif name not in old.tensors:
            out.append(Drift(rel, "tensor", f"{name}: newly generated, absent from the committed file"))
        elif d := _tensor_drift(rel, name, old.tensors[name], new.tensors[name]):
            out.append(d)
    for key in sorted(set(old.metadata) | set(new.metadata)):
        if old.metadata.get(key) != new.metadata.get(key):
            out.append(Drift(rel, "metadata", f"{key}: {old.metadata.get(key)!r} -> {new.metadata.get(key)!r}"))
    return out


def check(golden_dir: Path, registry: Registry, cache_dir: Path | None = None) -> CheckReport:
    """Regenerate every golden of ``registry`` into a temporary directory and compare with ``golden_dir``.

    Reports, per file: missing (listed or generated but not on disk), extra (orphan
    ``.kdtr`` not produced by any configuration), unlisted (generated but not in the
    manifest), hash (on-disk bytes differ from the manifest's sha256), tensor changes
    (inputs and integer outputs byte for byte; float outputs with their max ULP change)
    and metadata changes. Second-tier files are checked against their manifest hash only.
    """
    report = CheckReport()
    try:
        manifest = read_manifest(golden_dir)
        listed = manifest["files"]
    except (OSError, ValueError) as exc:  # missing, not a regular file, malformed
        report.drifts.append(Drift(MANIFEST_NAME, "manifest", str(exc)))
        listed = {}
    generated = {f"{op}/{cfg}.kdtr": (op, cfg) for op, cfg in registry.all_configs()}
    on_disk = {str(p.relative_to(golden_dir)) for p in golden_dir.glob("*/*.kdtr")}

    for rel in sorted(on_disk - set(generated)):
        report.drifts.append(Drift(rel, "extra", "orphan golden: no configuration generates it"))
    for rel in sorted(set(listed) - set(generated)):
        report.drifts.append(Drift(rel, "extra", "listed in the manifest but no configuration generates it"))
    for rel in sorted(set(generated) - set(listed)):
        report.drifts.append(Drift(rel, "unlisted", "generated but not listed in the manifest"))

    with tempfile.TemporaryDirectory(prefix="kdtr-regen-") as tmp:
        tmpdir = Path(tmp)
        for rel, (op, cfg) in sorted(generated.items()):
            tier = registry.tier_of(op, cfg)
            new_path, entry = write_one(tmpdir, registry, op, cfg)
            report.checked += 1
            if tier != "committed":
                if rel in listed and listed[rel]["sha256"] != entry["sha256"]:
                    report.drifts.append(Drift(rel, "hash", "second-tier regeneration differs from the manifest hash"))
                continue
            disk = golden_dir / rel
            if not disk.exists():
                report.drifts.append(Drift(rel, "missing", "generated but absent from golden/"))
                continue
            if not disk.is_file():
                report.drifts.append(Drift(rel, "unreadable", "not a regular file"))
                continue
            if rel in listed and sha256_of(disk) != listed[rel]["sha256"]:
                report.drifts.append(Drift(rel, "hash", "file on disk does not match its manifest sha256"))
            if rel in listed:
                for key in ("seed", "generator_version", "op", "config"):
                    if listed[rel].get(key) != entry[key]:
                        report.drifts.append(Drift(rel, "manifest",
                                                   f"{key}: {listed[rel].get(key)!r} -> {entry[key]!r}"))
            found = _compare_files(rel, disk, new_path)
            if not found and sha256_of(disk) != entry["sha256"]:
                found = [Drift(rel, "bytes",
                               "same tensors and metadata, but the bytes differ (metadata order or layout)")]
            report.drifts.extend(found)
    return report


def ensure_cached(golden_dir: Path, registry: Registry, op: str, config: str, cache_dir: Path | None = None) -> Path:
    """Path of a second-tier golden, generating it (from ``registry``) into the cache if absent or stale.

    Raises:
        ValueError: the regenerated file does not match the manifest hash.
    """
    cache_dir = cache_dir or golden_dir / ".cache"
    rel = f"{op}/{config}.kdtr"
    want = read_manifest(golden_dir)["files"][rel]["sha256"]
    path = cache_dir / rel
    if path.exists() and sha256_of(path) == want:
        return path
    path, entry = write_one(cache_dir, registry, op, config)
    if entry["sha256"] != want:
        raise ValueError(f"{path}: regenerated second-tier golden does not match its manifest sha256")
    return path


# ---------------------------------------------------------------- discovery, manifest check, waivers
# What a run judges: the goldens on disk, each held to its MANIFEST.json entry, and the
# waivers of golden/known_failures.json (docs/harness.md, "Goldens" and "Known failures").

KNOWN_FAILURES = "known_failures.json"
_BACKENDS = ("cpu", "cuda")  # kdtr.run.BACKENDS: a waiver's @backend must name one


class UsageError(ValueError):
    """Bad selection or configuration given to the runner (CLI exit code 2): no golden directory
    or manifest, a malformed known-failures list, a pattern or option that selects nothing."""


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
        raise UsageError(missing_golden_dir(golden_dir))
    found = sorted((p.parent.name, p.stem, p) for p in golden_dir.glob("*/*.kdtr"))
    if not found:
        raise UsageError(f"no goldens under {golden_dir} (run `kdtr regen`)")
    if second_tier:
        try:
            entries = read_manifest(golden_dir)["files"].values()
            for e in sorted(entries, key=lambda e: (e["op"], e["config"])):
                if e.get("tier") == "cache":
                    found.append((e["op"], e["config"], ensure_cached(golden_dir, registry, e["op"], e["config"])))
        except (OSError, ValueError, KeyError) as exc:
            raise UsageError(f"second-tier goldens: {exc}") from exc
    return found


def check_manifest(
    golden_dir: Path, found: list[tuple[str, str, Path]], vouched: dict[Path, Vouch] | None = None
) -> tuple[list[tuple[str, str, Path]], dict[Path, str]]:
    """Hold the committed goldens on disk against ``golden_dir/MANIFEST.json``.

    A run never judges a golden that its manifest does not vouch for: one that is not
    listed, not a regular file, or whose sha256 differs from its entry (a half-finished
    regen, a hand edit, a file from another checkout); and a listed golden missing from
    disk is a case of its own. Returns ``found`` plus the missing goldens, and the problem
    of each golden that must not run (its cases become ERROR naming the file).

    ``vouched`` (a dict, for :attr:`RunConfig.vouched`) receives the manifest's sha256 and
    size of every golden of ``found`` that it lists, second-tier ones included: from then on
    the run judges against those bytes only, whatever the files hold later.

    Raises:
        UsageError: no manifest, or not a kdtr manifest.
    """
    try:
        listed = read_manifest(golden_dir)["files"]
    except FileNotFoundError as exc:
        raise UsageError(f"{golden_dir / MANIFEST_NAME}: missing (run `kdtr regen`)") from exc
    except (OSError, ValueError) as exc:
        raise UsageError(str(exc)) from exc
    problems: dict[Path, str] = {}
    on_disk = set()
    vouches = vouches_of_manifest(golden_dir, listed if isinstance(listed, dict) else {})
    for op, config, path in found:
        rel = f"{op}/{config}.kdtr"
        if vouched is not None and rel in vouches:
            vouched[path] = vouches[rel]
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
            problems[path] = f"{path}: not listed in {MANIFEST_NAME} (run `kdtr regen`, or remove the file)"
        elif entry.get("tier", "committed") != "committed":
            problems[path] = f"{path}: listed in {MANIFEST_NAME} as second tier, found among the committed goldens"
        else:
            try:
                digest = sha256_now(path)[0]
            except OSError as exc:  # replaced since the stat (by a FIFO, a directory): never blocks
                problems[path] = f"{path}: cannot read: {exc.strerror or exc}"
                continue
            if digest != entry.get("sha256"):
                problems[path] = (f"{path}: sha256 differs from {MANIFEST_NAME} (edited, or a regen did not "
                                  "finish: run `kdtr regen`)")
    missing = []
    for rel, entry in sorted(listed.items()):
        if isinstance(entry, dict) and entry.get("tier", "committed") == "committed" and rel not in on_disk:
            op, _, name = rel.partition("/")
            path = golden_dir / rel
            missing.append((op, name[: -len(".kdtr")] if name.endswith(".kdtr") else name, path))
            problems[path] = f"{path}: listed in {MANIFEST_NAME} but missing"
    return sorted(found + missing), problems


def load_known_failures(golden_dir: Path) -> dict[str, str]:
    """``golden/known_failures.json``: {"op/config", "op/config@backend" or
    "op/config@backend:kernel": reason} (the most specific key of a case applies).

    Raises:
        UsageError: the file is not a JSON object of non-empty strings.
    """
    path = golden_dir / KNOWN_FAILURES
    if not os.path.lexists(path):
        return {}
    try:  # kdtr.userfiles: too large, not UTF-8, malformed or nested too deep: one line
        data = userfiles.load_json(path, "known-failures list")
    except userfiles.UserFileError as exc:
        raise UsageError(str(exc)) from exc
    except OSError as exc:  # kdtr.errors.Io for a FIFO or directory: refused, never blocked on
        raise UsageError(f"{path}: {exc.strerror or exc}") from exc
    if not isinstance(data, dict):
        raise UsageError(f"{path}: must map 'op/config[@backend]' to a non-empty reason (a JSON object, "
                         f"not a {type(data).__name__})")
    for key, why in data.items():
        if not (isinstance(why, str) and why.strip()):
            what = "a blank one" if isinstance(why, str) else type(why).__name__
            raise UsageError(f"{path}: {json.dumps(key)}: must map 'op/config[@backend]' to a non-empty reason "
                             f"(a string with text, not {what})")
    return data


def stale_waivers(known_failures: dict[str, str], goldens: list[tuple[str, str, Path]]) -> list[str]:
    """Waiver keys that name no golden (or an unknown backend): typos or leftovers. A key
    may name a case under a forced kernel, ``op/config@cuda:<kernel>``, and a graph or
    invariance case by its suffix, ``op/config[@column]#graph``."""
    from .run.cases import MODES

    ids = {f"{op}/{cfg}" for op, cfg, _ in goldens}
    stale = []
    for key in known_failures:
        head, hash_, mode = key.rpartition("#") if "#" in key else (key, "", "")
        case, _, column = head.partition("@")
        backend = column.partition(":")[0]  # @cuda:<kernel>: a forced kernel's case
        if case not in ids or (column and backend not in _BACKENDS) or (hash_ and mode not in MODES):
            stale.append(key)
    return stale
