"""Writing files without touching anything kdtr did not create.

The rule every command follows (docs/harness.md, "Writing files"): a path kdtr writes is
never followed where it ends. A lock or report path that is a symbolic link, or not a
regular file, is refused with :class:`UnsafePath` (one line naming the path), and no file
that kdtr did not create is ever truncated, moved, written or removed. Directories named on
the command line (``--report-dir``, ``--golden-dir``, the parent of ``--svg FILE``) may be
symbolic links: they are the user's choice and are followed once, when they are opened.

* :func:`atomic_write`: a new file or a new version of a regular file, via a temporary file
  created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` (a name someone else made, link or file,
  is never reused: another random name is drawn), fsync, rename; every step relative to
  one open descriptor of the directory, so swapping the directory meanwhile cannot move
  the write elsewhere.
* :func:`open_lock`: a lock file opened with ``O_NOFOLLOW`` and checked (regular, one
  link, at most a pid's size) before anything is written to it; never truncated first.
* :func:`make_dirs`: directories below one kdtr created, none of them a link.
* :class:`ReportSet`: several files and directories published as one unit, by one rename
  of a pointer (``<report-dir>/.<kind> -> .<kind>-<id>``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import secrets
import shutil
import stat
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

Chunks = bytes | bytearray | memoryview | Iterable[Any]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_NOFOLLOW_DIR = _DIR_FLAGS | os.O_NOFOLLOW


class UnsafePath(OSError):
    """kdtr refused to write ``filename``: it is a symbolic link, not a regular file, or
    not a file kdtr made. ``strerror`` says which and what to do; ``str()`` is the path
    followed by it (one line)."""

    def __init__(self, err: int, detail: str, path: str | os.PathLike) -> None:
        super().__init__(err, detail, os.fspath(path))

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def _lstat_at(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def check_replaceable(dir_fd: int, name: str, shown: str | os.PathLike) -> None:
    """Refuse (UnsafePath) when ``name`` in the directory ``dir_fd`` exists and is not a
    regular file: kdtr replaces regular files only, never a link (nor what it points to),
    a directory, a FIFO or a device."""
    st = _lstat_at(dir_fd, name)
    if st is None or stat.S_ISREG(st.st_mode):
        return
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePath(errno.ELOOP, "a symbolic link: kdtr writes no file through a link and never replaces "
                         "one (remove the link, or name the file it points to)", shown)
    raise UnsafePath(errno.EEXIST, f"{_kind(st.st_mode)}: kdtr replaces regular files only", shown)


def _temp_name(name: str) -> str:
    """``.<name, cut to 200 bytes>.<random>.tmp``: fits NAME_MAX whenever ``name`` does."""
    raw = os.fsencode(name)[:200]
    return "." + os.fsdecode(raw) + "." + secrets.token_hex(4) + ".tmp"


def _write_chunks(fd: int, data: Chunks) -> None:
    with open(fd, "wb", closefd=False) as fh:
        if isinstance(data, (bytes, bytearray, memoryview)):
            fh.write(data)
        else:
            for chunk in data:
                fh.write(chunk)
        fh.flush()
    os.fsync(fd)


def _new_file_at(dir_fd: int, name: str, access: int = os.O_WRONLY) -> tuple[int, str]:
    """A new temporary file beside ``name`` (O_EXCL | O_NOFOLLOW, mode 0o666 & ~umask)."""
    for _ in range(100):
        tmp = _temp_name(name)
        try:
            fd = os.open(tmp, access | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666,
                         dir_fd=dir_fd)
        except FileExistsError:
            continue  # someone made this name (a file or a link): never reuse it
        return fd, tmp
    raise FileExistsError(errno.EEXIST, "no free temporary name", name)


def write_temp_at(dir_fd: int, name: str, data: Chunks) -> str:
    """``data`` in a new temporary file beside ``name`` in ``dir_fd``, fsynced and closed;
    its name. An exception removes the temporary file (it is ours: O_EXCL made it)."""
    fd, tmp = _new_file_at(dir_fd, name)
    try:
        try:
            _write_chunks(fd, data)
        finally:
            os.close(fd)
    except BaseException:
        _unlink_quietly(dir_fd, tmp)
        raise
    return tmp


def _unlink_quietly(dir_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass


def _readlink_at(dir_fd: int, name: str) -> str | None:
    try:
        return os.readlink(name, dir_fd=dir_fd)
    except OSError:
        return None


def fsync_dir(dir_fd: int) -> None:
    """Make renames in ``dir_fd`` durable (best effort: some file systems refuse)."""
    try:
        os.fsync(dir_fd)
    except OSError:
        pass


def open_dir(path: str | os.PathLike) -> int:
    """A descriptor of the directory ``path`` (symbolic links on the way followed)."""
    return os.open(os.fspath(path) or ".", _DIR_FLAGS)


def atomic_write(path: str | os.PathLike, data: Chunks) -> None:
    """Replace ``path`` with ``data`` atomically: readers see the old file or the new one,
    never a part of either; nothing but ``path`` itself and one temporary file is touched.

    The bytes go to a temporary file ``.<name>.<random>.tmp`` in ``path``'s directory (the
    name cut to 200 bytes so it fits NAME_MAX; git ignores ``*.tmp``), created with
    ``O_CREAT | O_EXCL | O_NOFOLLOW`` and mode ``0o666 & ~umask``, fsynced, renamed over
    ``path``, then the directory is fsynced; every step is relative to one descriptor of
    the directory, opened once. An exception removes the temporary file (a process killed
    mid-write may leave it).

    Args:
        path: destination; its directory must exist. A symbolic link in the directory part
            is followed; ``path`` itself must be absent or a regular file.
        data: the bytes, or an iterable of bytes-like chunks (bytes, memoryviews,
            C-contiguous uint8 arrays) written in order; a generator is consumed lazily,
            and an exception it raises removes the temporary file and propagates.

    Raises:
        UnsafePath: ``path`` is a symbolic link, a directory, a FIFO or a device.
        OSError: the file cannot be written or renamed.
    """
    write_together([(path, data)])


def write_together(items: Iterable[tuple[str | os.PathLike, Chunks]]) -> None:
    """Write every file to its temporary file first (as :func:`atomic_write` does), then
    rename each into place. Each file is replaced atomically; the set is not: a process
    killed between two renames leaves the first files new and the others old (publish a
    set that readers must see whole with :class:`ReportSet`). Nothing is renamed unless
    every file was written; an exception removes every temporary file not yet renamed.

    Raises:
        UnsafePath: a destination is a symbolic link or not a regular file (checked for
            all before anything is written).
        OSError: a file cannot be written or renamed.
    """
    pairs = [(os.fsdecode(os.fspath(p)), data) for p, data in items]
    dirs: dict[str, int] = {}
    temps: list[tuple[int, str, str]] = []  # (dir fd, temporary name, final name)
    try:
        for path, _ in pairs:
            parent = os.path.dirname(path) or "."
            if parent not in dirs:
                dirs[parent] = open_dir(parent)
            check_replaceable(dirs[parent], os.path.basename(path), path)
        for path, data in pairs:
            dfd, name = dirs[os.path.dirname(path) or "."], os.path.basename(path)
            temps.append((dfd, write_temp_at(dfd, name, data), name))
        while temps:
            dfd, tmp, name = temps[0]
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            temps.pop(0)
        for dfd in dirs.values():
            fsync_dir(dfd)
    except BaseException:
        for dfd, tmp, _ in temps:
            _unlink_quietly(dfd, tmp)
        raise
    finally:
        for dfd in dirs.values():
            os.close(dfd)


# --- locks -------------------------------------------------------------------------------

LOCK_MAX_BYTES = 64  # a lock file holds at most a pid line


def open_lock(path: str | os.PathLike) -> int:
    """Open (creating it if absent) the lock file ``path`` for ``flock``, never following
    a link and writing nothing: ``O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY``.

    Returns:
        The descriptor (close-on-exec); the caller takes the ``flock``.

    Raises:
        UnsafePath: ``path`` is a symbolic link, not a regular file, a file with other hard
            links, or one over :data:`LOCK_MAX_BYTES` bytes (not a lock kdtr made).
        OSError: it cannot be created or opened.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY,
                     0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePath(errno.ELOOP, "a symbolic link: a lock file must be a regular file "
                             "(remove the link)", path) from None
        if exc.errno in (errno.ENXIO, errno.EISDIR, errno.EWOULDBLOCK):
            raise UnsafePath(exc.errno, "not a regular file (remove it)", path) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePath(errno.EEXIST, f"not a regular file ({_kind(st.st_mode)}; remove it)", path)
        if st.st_nlink != 1:
            raise UnsafePath(errno.EMLINK, f"has {st.st_nlink} hard links: not a lock file kdtr made "
                             "(remove it)", path)
        if st.st_size > LOCK_MAX_BYTES:
            raise UnsafePath(errno.EEXIST, f"holds {st.st_size} bytes, more than a lock's pid: not a lock "
                             "file kdtr made (remove it)", path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_pid(fd: int) -> None:
    """Record this process's pid in a lock opened by :func:`open_lock` (and held): the
    pid is written first, then the file cut to its length (never truncated to 0 first)."""
    text = f"{os.getpid()}\n".encode()
    os.pwrite(fd, text, 0)
    os.ftruncate(fd, len(text))


# --- directories --------------------------------------------------------------------------


def make_dirs(base: str | os.PathLike, rel: str | os.PathLike) -> Path:
    """``base/rel`` as a directory, creating what is missing (``base`` too, as
    ``mkdir -p``: it is the caller's, links in it followed); no component below ``base``
    may be a symbolic link or anything but a directory.

    Raises:
        UnsafePath: a component below ``base`` is a link or not a directory.
        OSError: one cannot be created.
    """
    base = Path(base)
    base.mkdir(parents=True, exist_ok=True)
    fd = open_dir(base)
    shown = base
    try:
        for part in Path(rel).parts:
            shown = shown / part
            try:
                os.mkdir(part, 0o777, dir_fd=fd)
            except FileExistsError:
                pass
            try:
                nfd = os.open(part, _NOFOLLOW_DIR, dir_fd=fd)
            except OSError as exc:
                st = _lstat_at(fd, part)
                if st is not None and not stat.S_ISDIR(st.st_mode):
                    raise UnsafePath(errno.ENOTDIR, f"{_kind(st.st_mode)}, not a directory kdtr made "
                                     "(remove it)", shown) from None
                raise exc
            os.close(fd)
            fd = nfd
    finally:
        os.close(fd)
    return base / rel


def remove_stale_output(path: str | os.PathLike) -> None:
    """Remove a previous output at ``path`` before a binary writes it anew: a regular file
    or a link is unlinked (a link's target is never touched); nothing else is removed.

    Raises:
        UnsafePath: ``path`` is a directory, a FIFO or a device.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
        raise UnsafePath(errno.EEXIST, f"{_kind(st.st_mode)} where an output file goes (remove it)", path)
    os.unlink(path)


# --- report sets -------------------------------------------------------------------------

SET_MARKER = ".kdtr-report-set"
_MARKER_TEXT = b"kdtr report set\n"


class ReportSet:
    """Files and directories of one run, published as one unit in ``report_dir``.

    Layout, for kind ``conformance``, files ``conformance.json``, ... and directory
    ``obtained``::

        report_dir/.conformance-<id>/      one run's complete set (kdtr's marker inside)
        report_dir/.conformance            -> .conformance-<id>: the pointer, replaced by
                                           one rename when a new set is complete
        report_dir/conformance.json        -> .conformance/conformance.json (fixed links,
        report_dir/obtained                -> .conformance/obtained          never changed)

    :meth:`begin` makes the run directory (the caller writes the set into it);
    :meth:`publish` switches the pointer and then removes the older run directories;
    :meth:`discard` removes an unpublished one. A reader of one name gets that file of the
    last complete set; a reader of several files of one set resolves the pointer once
    (:func:`current_set`) and reads them from that directory. A process killed at any
    point leaves the previous complete set or the new one published, never a mix.

    Only what kdtr made is removed: run directories of this kind that carry kdtr's marker
    file, are not current and are not in use (their creator holds an ``flock`` on the
    marker until it has published). A name of the set that is a symbolic link kdtr did not
    make, or anything but a regular file or (``obtained``) a directory, is refused with
    :class:`UnsafePath` before anything is switched. A regular file or a directory under a
    name of the set (what an older kdtr wrote there) is taken over as the previous set:
    hard-linked into a run directory of its own, pointed at, each name then swapped for its
    link in one step (see :meth:`_take_over`).
    """

    def __init__(self, report_dir: str | os.PathLike, kind: str, files: Sequence[str],
                 dirs: Sequence[str] = ()) -> None:
        self.report_dir = Path(report_dir)
        self.kind = kind
        self.files = tuple(files)
        self.dirs = tuple(dirs)
        self.names = self.files + self.dirs
        self.pointer = f".{kind}"
        self.run_dir: Path | None = None
        self._marker_fd: int | None = None

    # -- names
    def _link_target(self, name: str) -> str:
        return f"{self.pointer}/{name}"

    def _is_run_name(self, name: str) -> bool:
        return name.startswith(f"{self.pointer}-") and "/" not in name and not name.endswith(".tmp")

    def shown(self, path: str | os.PathLike) -> str:
        """``path`` inside the unpublished run directory, spelt through the fixed links
        (``report_dir/obtained/...``): the name readers will see once published."""
        p = os.fspath(path)
        if self.run_dir is not None:
            prefix = str(self.run_dir) + os.sep
            if p.startswith(prefix):
                return str(self.report_dir / p[len(prefix):])
        return p

    # -- lifecycle
    def begin(self) -> Path:
        """Create a fresh run directory ``report_dir/.<kind>-<id>`` holding the set's
        (empty) directories, creating ``report_dir`` if missing, and return it.

        Raises:
            UnsafePath: the pointer or a name of the set is not what kdtr made (see
                :meth:`publish`): refused before the run rather than after it.
            OSError: ``report_dir`` cannot be created or written.
        """
        self.report_dir.mkdir(parents=True, exist_ok=True)
        dfd = open_dir(self.report_dir)
        try:
            self._check_pointer(dfd)
            self._check_names(dfd)
        finally:
            os.close(dfd)
        self.run_dir, self._marker_fd = self._new_run_dir(self.report_dir)
        for d in self.dirs:
            make_dirs(self.run_dir, d)
        return self.run_dir

    def _new_run_dir(self, report_dir: Path) -> tuple[Path, int]:
        """A new run directory holding kdtr's marker, whose ``flock`` the returned
        descriptor holds. The marker is written and locked beside it first and renamed in
        last, so the directory is never seen with an unlocked or empty marker; a process
        killed midway leaves an empty directory or an unlocked marker file, both of which
        the next cleanup removes."""
        dfd = open_dir(report_dir)
        try:
            mfd, mtmp = _new_file_at(dfd, SET_MARKER, os.O_RDWR)
            try:
                fcntl.flock(mfd, fcntl.LOCK_EX)  # in use until published: no cleanup removes it
                os.write(mfd, _MARKER_TEXT)
                for _ in range(100):
                    name = f"{self.pointer}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-{secrets.token_hex(3)}"
                    try:
                        os.mkdir(name, 0o777, dir_fd=dfd)
                    except FileExistsError:
                        continue
                    break
                else:
                    raise FileExistsError(errno.EEXIST, "no free run directory name", str(report_dir))
                rfd = os.open(name, _NOFOLLOW_DIR, dir_fd=dfd)
                try:
                    os.rename(mtmp, SET_MARKER, src_dir_fd=dfd, dst_dir_fd=rfd)
                finally:
                    os.close(rfd)
            except BaseException:
                os.close(mfd)
                raise
            return report_dir / name, mfd
        finally:
            os.close(dfd)

    def _release(self) -> None:
        if self._marker_fd is not None:
            os.close(self._marker_fd)
            self._marker_fd = None

    def discard(self) -> None:
        """Remove the unpublished run directory (an interrupted or failed run)."""
        if self.run_dir is None:
            return
        name = self.run_dir.name
        self._release()
        self.run_dir = None
        dfd = open_dir(self.report_dir)
        try:
            self._remove_run_dir(dfd, name)
        finally:
            os.close(dfd)

    @contextlib.contextmanager
    def discarded_on_error(self) -> Iterator[None]:
        """Run the block that fills and publishes the set; on any exception (a signal's
        too) discard the unpublished run directory, then re-raise the first error."""
        try:
            yield
        except BaseException:
            try:
                self.discard()
            except Exception:  # noqa: BLE001 - the first error is the one to report
                pass
            raise

    def publish(self) -> list[Path]:
        """Make the run directory the current set: check the fixed names, create the
        missing links, switch the pointer by one rename, fsync, then remove the older run
        directories. Returns the published paths (``report_dir/<name>``).

        Raises:
            UnsafePath: the pointer or a name of the set is not what kdtr made (nothing
                switched then).
            OSError: a link cannot be made or the pointer renamed.
        """
        if self.run_dir is None:
            raise RuntimeError("ReportSet.publish before begin")
        dfd = open_dir(self.report_dir)
        try:
            rfd = os.open(self.run_dir.name, _NOFOLLOW_DIR, dir_fd=dfd)
            try:
                os.fsync(rfd)
            finally:
                os.close(rfd)
            self._check_pointer(dfd)
            legacy = self._check_names(dfd)
            if legacy:
                self._take_over(dfd, legacy)
            for name in self.names:
                if _lstat_at(dfd, name) is None:
                    self._make_link(dfd, name)
            self._switch(dfd, self.run_dir.name)
            fsync_dir(dfd)
            self._release()
            self._cleanup(dfd)
        finally:
            os.close(dfd)
        return [self.report_dir / n for n in self.names]

    # -- steps
    def _check_pointer(self, dfd: int) -> None:
        st = _lstat_at(dfd, self.pointer)
        if st is None:
            return
        shown = self.report_dir / self.pointer
        if not stat.S_ISLNK(st.st_mode):
            raise UnsafePath(errno.EEXIST, f"{_kind(st.st_mode)} where kdtr keeps its pointer to the current "
                             "report set (remove it)", shown)
        target = os.readlink(self.pointer, dir_fd=dfd)
        if not self._is_run_name(target):
            raise UnsafePath(errno.EEXIST, f"a symbolic link kdtr did not make (-> {target}); remove it", shown)

    def _check_names(self, dfd: int) -> list[str]:
        """The names held by an older kdtr's files (regular files, directories); refuse
        links kdtr did not make and anything else."""
        legacy = []
        for name in self.names:
            st = _lstat_at(dfd, name)
            if st is None:
                continue
            shown = self.report_dir / name
            if stat.S_ISLNK(st.st_mode):
                target = os.readlink(name, dir_fd=dfd)
                if target != self._link_target(name):
                    raise UnsafePath(errno.ELOOP, f"a symbolic link kdtr did not make (-> {target}): kdtr "
                                     "writes no report through it; remove it", shown)
            elif stat.S_ISREG(st.st_mode) if name in self.files else stat.S_ISDIR(st.st_mode):
                legacy.append(name)
            else:
                raise UnsafePath(errno.EEXIST, f"{_kind(st.st_mode)} where a report goes (remove it)", shown)
        return legacy

    def _take_over(self, dfd: int, legacy: list[str]) -> None:
        """Adopt what an older kdtr wrote under the set's names as the current set, never
        showing a reader less: the files are hard-linked (a directory's tree copied by
        hard links) into a run directory of their own, with what the names already linked
        show (an adoption killed midway), the pointer is set to it, and each name is then
        swapped for its link in one step (a rename over a file; an exchange with a
        directory, whose original lands in the adopted directory and goes with it)."""
        old_dir, old_fd = self._new_run_dir(self.report_dir)
        try:
            ofd = os.open(old_dir.name, _NOFOLLOW_DIR, dir_fd=dfd)
            try:
                for name in legacy:
                    _link_copy(dfd, ofd, name, self.report_dir / name, old_dir / name)
                cur = self._current(dfd)
                if cur is not None and len(legacy) < len(self.names):
                    try:
                        cfd = os.open(cur, _NOFOLLOW_DIR, dir_fd=dfd)
                    except OSError:
                        cfd = None
                    if cfd is not None:
                        try:
                            for name in self.names:
                                if name not in legacy:
                                    _link_copy(cfd, ofd, name, self.report_dir / cur / name, old_dir / name)
                        finally:
                            os.close(cfd)
                os.fsync(ofd)
            finally:
                os.close(ofd)
            self._switch(dfd, old_dir.name)
            for name in legacy:
                if name in self.files:
                    self._make_link(dfd, name)  # over the old file: the same bytes either way
                    continue
                # The directory is swapped for its link in one step, the original landing in
                # the adopted run directory (removed with it): no moment without the name.
                ofd = os.open(old_dir.name, _NOFOLLOW_DIR, dir_fd=dfd)
                try:
                    held = f".replaced-{name}"
                    os.symlink(self._link_target(name), held, dir_fd=ofd)
                    if not exchange(ofd, held, dfd, name):  # no RENAME_EXCHANGE: missing for one rename
                        os.unlink(held, dir_fd=ofd)
                        os.rename(name, held, src_dir_fd=dfd, dst_dir_fd=ofd)
                        self._make_link(dfd, name)
                finally:
                    os.close(ofd)
        finally:
            os.close(old_fd)

    def _new_link(self, dfd: int, name: str) -> str:
        """A new temporary link beside ``name`` pointing where ``name``'s fixed link does."""
        for _ in range(100):
            tmp = _temp_name(name)
            try:
                os.symlink(self._link_target(name), tmp, dir_fd=dfd)
            except FileExistsError:
                continue  # a name someone else made: never reused
            return tmp
        raise FileExistsError(errno.EEXIST, "no free temporary name", name)

    def _make_link(self, dfd: int, name: str) -> None:
        tmp = self._new_link(dfd, name)
        try:
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except FileNotFoundError:  # a concurrent publish tidied our temporary link away
            if _readlink_at(dfd, name) != self._link_target(name):
                raise
        except BaseException:
            _unlink_quietly(dfd, tmp)
            raise

    def _switch(self, dfd: int, run_name: str) -> None:
        for _ in range(100):
            tmp = _temp_name(self.pointer)
            try:
                os.symlink(run_name, tmp, dir_fd=dfd)
            except FileExistsError:
                continue  # a name someone else made: never reused
            break
        else:
            raise FileExistsError(errno.EEXIST, "no free temporary name", self.pointer)
        try:
            os.replace(tmp, self.pointer, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            _unlink_quietly(dfd, tmp)
            raise

    def _current(self, dfd: int) -> str | None:
        return _readlink_at(dfd, self.pointer)

    def _cleanup(self, dfd: int) -> None:
        for entry in list(os.scandir(dfd)):
            name = entry.name
            if self._is_run_name(name) and entry.is_dir(follow_symlinks=False):
                self._remove_run_dir(dfd, name)
        marker_tmp = re.compile(r"\." + re.escape(SET_MARKER) + r"\.[0-9a-f]{8}\.tmp")
        for entry in list(os.scandir(dfd)):  # markers a run killed while creating its directory left
            if marker_tmp.fullmatch(entry.name) and entry.is_file(follow_symlinks=False):
                _remove_stale_marker(dfd, entry.name)
        live = {e.name for e in os.scandir(dfd)}
        for entry in list(os.scandir(dfd)):  # temporary links a killed publish left behind
            stem, _, rest = entry.name[1:].rpartition(".")[0].rpartition(".")
            if not (entry.name.startswith(".") and entry.name.endswith(".tmp") and entry.is_symlink()
                    and len(rest) == 8 and (stem == self.pointer or stem in self.names)):
                continue
            try:
                target = os.readlink(entry.name, dir_fd=dfd)
                if (target == self._link_target(stem) if stem in self.names
                        else self._is_run_name(target) and target not in live):
                    os.unlink(entry.name, dir_fd=dfd)
            except OSError:
                pass

    def _remove_run_dir(self, dfd: int, name: str) -> None:
        """Remove run directory ``name`` if it is kdtr's (marker), not in use (its marker's
        flock is free) and not the current set. The marker goes last, so an interrupted
        removal is finished by the next one."""
        try:
            rfd = os.open(name, _NOFOLLOW_DIR, dir_fd=dfd)
        except OSError:
            return
        try:
            try:
                mfd = os.open(SET_MARKER, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=rfd)
            except OSError:  # not kdtr's, unless empty (made or emptied by a killed run): rmdir takes only that
                if self._current(dfd) != name:
                    try:
                        os.rmdir(name, dir_fd=dfd)
                    except OSError:
                        pass
                return
            try:
                if not stat.S_ISREG(os.fstat(mfd).st_mode):
                    return
                try:
                    fcntl.flock(mfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    return  # in use: its creator has not published yet
                if os.pread(mfd, len(_MARKER_TEXT), 0) != _MARKER_TEXT:
                    return
                if self._current(dfd) == name:
                    return
                _empty_marked(rfd, self.report_dir / name, SET_MARKER)
            finally:
                os.close(mfd)
        finally:
            os.close(rfd)
        try:
            os.rmdir(name, dir_fd=dfd)
        except OSError:
            pass


def _link_copy(src_dfd: int, dst_dfd: int, name: str, src_shown: Path, dst_shown: Path) -> None:
    """``name`` of ``src_dfd`` into ``dst_dfd``: a file hard-linked (copied where links are
    refused), a directory recreated with its tree linked the same way, a link recreated;
    anything else is left out. The source is not changed."""
    st = _lstat_at(src_dfd, name)
    if st is None:
        return
    if stat.S_ISDIR(st.st_mode):
        os.mkdir(name, 0o777, dir_fd=dst_dfd)
        s = os.open(name, _NOFOLLOW_DIR, dir_fd=src_dfd)
        try:
            d = os.open(name, _NOFOLLOW_DIR, dir_fd=dst_dfd)
            try:
                for entry in list(os.scandir(s)):
                    _link_copy(s, d, entry.name, src_shown / entry.name, dst_shown / entry.name)
            finally:
                os.close(d)
        finally:
            os.close(s)
    elif stat.S_ISLNK(st.st_mode):
        os.symlink(os.readlink(name, dir_fd=src_dfd), name, dir_fd=dst_dfd)
    elif stat.S_ISREG(st.st_mode):
        try:
            os.link(name, name, src_dir_fd=src_dfd, dst_dir_fd=dst_dfd, follow_symlinks=False)
        except OSError:  # no hard links on this file system (or not allowed for this file)
            shutil.copy2(src_shown, dst_shown, follow_symlinks=False)


_RENAME_EXCHANGE = 2


def exchange(a_dir_fd: int, a: str, b_dir_fd: int, b: str) -> bool:
    """Swap the entries ``a`` (in directory ``a_dir_fd``) and ``b`` (in ``b_dir_fd``) in
    one step (Linux ``renameat2`` with ``RENAME_EXCHANGE``); False, nothing done, where the
    C library or the file system lacks it.

    Raises:
        OSError: the exchange failed for another reason.
    """
    fn = _renameat2()
    if fn is None:
        return False
    if fn(a_dir_fd, os.fsencode(a), b_dir_fd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    import ctypes

    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), b)


_RENAMEAT2: list[Any] = []


def _renameat2() -> Any:
    if not _RENAMEAT2:
        try:
            import ctypes

            _RENAMEAT2.append(getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None))
        except (OSError, AttributeError):
            _RENAMEAT2.append(None)
    return _RENAMEAT2[0]


def _remove_stale_marker(dfd: int, name: str) -> None:
    """Unlink a report-set marker file left beside its directory by a killed run: only if
    it is kdtr's (its text) and no process holds its lock."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dfd)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        # Its text is written under the lock: a marker with its text and no lock held is a
        # dead run's (a live one renames it away before unlocking).
        if stat.S_ISREG(os.fstat(fd).st_mode) and os.pread(fd, 64, 0) == _MARKER_TEXT:
            os.unlink(name, dir_fd=dfd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _empty_marked(rfd: int, shown: Path, marker: str) -> None:
    """Remove everything in the directory ``rfd`` (``shown``), its ``marker`` file last:
    a removal interrupted midway still carries the marker and is finished next time."""
    for entry in list(os.scandir(rfd)):
        if entry.name == marker:
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(shown / entry.name)  # never follows a link inside
        else:
            os.unlink(entry.name, dir_fd=rfd)
    os.unlink(marker, dir_fd=rfd)


def remove_marked_dir(path: str | os.PathLike, marker: str) -> bool:
    """Remove the directory ``path`` if it is a real directory (not a link) holding the
    regular file ``marker`` that kdtr put there when it made it; the marker goes last.
    Returns whether it was removed; anything else at ``path`` is left alone."""
    path = Path(path)
    try:
        pfd = open_dir(path.parent)
    except OSError:
        return False
    try:
        try:
            rfd = os.open(path.name, _NOFOLLOW_DIR, dir_fd=pfd)
        except OSError:
            return False
        try:
            st = _lstat_at(rfd, marker)
            if st is None or not stat.S_ISREG(st.st_mode):
                return False
            _empty_marked(rfd, path, marker)
        finally:
            os.close(rfd)
        os.rmdir(path.name, dir_fd=pfd)
        return True
    finally:
        os.close(pfd)


def current_set(report_dir: str | os.PathLike, kind: str) -> Path | None:
    """The directory of the current published set of ``kind`` in ``report_dir``, resolved
    once (read every file of one set from it); None when none was published."""
    report_dir = Path(report_dir)
    try:
        target = os.readlink(report_dir / f".{kind}")
    except OSError:
        return None
    return report_dir / target
