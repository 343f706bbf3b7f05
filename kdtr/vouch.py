"""The bytes a verdict is judged against.

A test binary can reach the files of its case: it reads its ``--input`` golden and writes
its ``--output``, and nothing stops a buggy or hostile one (or a concurrent ``kdtr regen``
or ``git checkout``) from writing into the golden, replacing it, or truncating a file after
the run has opened it. So no verdict reads a file through a mapping, and none trusts what a
path holds now:

- :func:`load_vouched` reads a golden into private memory once and holds those bytes to the
  sha256 that ``golden/MANIFEST.json`` gave for it when the run began (a :class:`Vouch`);
  the expected tensors a case is judged against are views over that copy, so a change to
  the file afterwards cannot reach them, and bytes that are not the vouched ones raise
  :class:`NotVouched` naming the file: the case is an ERROR.
- :func:`changed` re-hashes a golden after its binary ran: a golden its binary (or anyone)
  changed while the case ran voids the case's verdict.
- :func:`load_private` reads an obtained output into private memory, refusing one larger
  than the binaries' output limit unread: a file truncated or rewritten while it is judged
  gives an error, never a SIGBUS (which would kill the runner and every other case).

Every read is a plain ``read`` of a regular file (a FIFO, device or directory is refused at
once, without blocking), bounded by a size known before reading.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from . import errors as E
from . import format as kformat

_CHUNK = 1 << 20


@dataclass(frozen=True)
class Vouch:
    """What a golden's bytes must be: their sha256 (hex) and, when known, their size."""

    sha256: str
    size: int | None = None
    source: str = "MANIFEST.json"  # who vouched: named in the errors

    @classmethod
    def of_bytes(cls, data: bytes, source: str) -> Vouch:
        return cls(hashlib.sha256(data).hexdigest(), len(data), source)


class NotVouched(ValueError):
    """A golden's bytes are not the ones vouched for (changed, replaced, truncated, grown).

    Attributes:
        path: the file.
    """

    def __init__(self, path: str | os.PathLike, detail: str) -> None:
        self.path = os.fspath(path)
        super().__init__(f"{self.path}: {detail}")


class TooLarge(OSError):
    """A file is larger than the limit it is read under (it is not read)."""

    def __init__(self, path: str | os.PathLike, size: int, limit: int, what: str) -> None:
        super().__init__(errno.EFBIG, f"{size} bytes, over the limit of {limit} bytes for {what}", os.fspath(path))


def _open_regular(path: str) -> tuple[int, int]:
    """A blocking read-only descriptor of the regular file ``path`` and its size."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise E.Io(path, "not a regular file", errno.EISDIR if stat.S_ISDIR(st.st_mode) else errno.EINVAL)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, st.st_size


def read_private(path: str | os.PathLike, limit: int | None = None, what: str = "this file") -> bytes:
    """The bytes of the regular file ``path``, read (never mapped) into private memory.

    At most the size the file had when opened is read; ``limit`` refuses a larger file
    before any byte is read.

    Raises:
        TooLarge: the file is larger than ``limit`` (``what`` names the limit).
        kdtr.errors.Io: not a regular file, or it shrank while being read.
        OSError: the operating system's own failures.
    """
    p = os.fspath(path)
    fd, size = _open_regular(p)
    try:
        if limit is not None and size > limit:
            raise TooLarge(p, size, limit, what)
        buf = bytearray(size)
        view = memoryview(buf)
        pos = 0
        while pos < size:
            n = os.readv(fd, [view[pos:pos + _CHUNK]])
            if n == 0:
                raise E.Io(p, f"file shrank while being read: {size} bytes when opened, {pos} read", errno.EIO)
            pos += n
        view.release()
    finally:
        os.close(fd)
    return bytes(buf)


def sha256_of(path: str | os.PathLike, limit: int | None = None) -> tuple[str, int]:
    """The sha256 (hex) and size of the file's bytes now, read in bounded chunks.

    ``limit``: stop reading past that many bytes (the digest is then of the first
    ``limit + 1`` bytes: it cannot match a vouch of ``limit`` bytes).

    Raises:
        kdtr.errors.Io: not a regular file.
        OSError: the operating system's own failures.
    """
    p = os.fspath(path)
    fd, _ = _open_regular(p)
    h = hashlib.sha256()
    n = 0
    try:
        while limit is None or n <= limit:
            chunk = os.read(fd, _CHUNK if limit is None else min(_CHUNK, limit + 1 - n))
            if not chunk:
                break
            h.update(chunk)
            n += len(chunk)
    finally:
        os.close(fd)
    return h.hexdigest(), n


def load_vouched(path: str | os.PathLike, vouch: Vouch | None) -> tuple[kformat.KdtrFile, Vouch]:
    """A golden, read once into private memory and held to ``vouch``.

    Args:
        path: the golden.
        vouch: what its bytes must be; None: these bytes are vouched for now (the first
            read of a golden no manifest vouched for), and the returned vouch holds them.

    Returns:
        The file (every CRC checked; tensors read-only views over the private copy, which
        no other process can change) and the vouch its bytes meet.

    Raises:
        NotVouched: the bytes differ from ``vouch`` (size or sha256).
        KdtrError: the bytes are not a valid KDTR file.
        OSError: unreadable, not a regular file, or shrank while being read.
    """
    p = os.fspath(path)
    try:
        data = read_private(p, vouch.size if vouch is not None else None)
    except TooLarge as exc:  # only a vouch of known size sets a limit
        raise NotVouched(p, f"more than the {vouch.size} bytes that {vouch.source} vouched for "
                            f"(changed since: {_HOW})") from exc
    got = Vouch.of_bytes(data, "the run's first read")
    if vouch is not None:
        if vouch.size is not None and got.size != vouch.size:
            raise NotVouched(p, f"{got.size} bytes where {vouch.source} vouched for {vouch.size} "
                                f"(changed since: {_HOW})")
        if got.sha256 != vouch.sha256:
            raise NotVouched(p, f"sha256 {got.sha256[:16]}... differs from the {vouch.sha256[:16]}... that "
                                f"{vouch.source} vouched for (changed since: {_HOW})")
        got = vouch
    return kformat.load_bytes(data, p), got


_HOW = "written, replaced or truncated by a test binary or another process"


def changed(path: str | os.PathLike, vouch: Vouch) -> str | None:
    """None when the file still holds the vouched bytes, else what changed, in words."""
    try:
        digest, size = sha256_of(path, vouch.size)
    except OSError as exc:
        return f"{os.fspath(path)}: unreadable now ({exc.strerror or exc})"
    if vouch.size is not None and size != vouch.size:
        now = f"over {vouch.size}" if size > vouch.size else str(size)
        return f"{os.fspath(path)}: now {now} bytes, {vouch.source} vouched for {vouch.size}"
    if digest != vouch.sha256:
        return f"{os.fspath(path)}: sha256 now {digest[:16]}..., {vouch.source} vouched for {vouch.sha256[:16]}..."
    return None


def load_private(path: str | os.PathLike, limit: int | None, what: str = "this file") -> kformat.KdtrFile:
    """A KDTR file (an obtained output) read into private memory and parsed, CRCs checked.

    Raises:
        TooLarge: larger than ``limit`` (not read).
        KdtrError: not a valid KDTR file.
        OSError: unreadable, not a regular file, or shrank while being read.
    """
    return kformat.load_bytes(read_private(path, limit, what), path)


def vouches_of_manifest(golden_dir: Path, entries: dict[str, dict]) -> dict[str, Vouch]:
    """``MANIFEST.json`` ``files`` entries as vouches, by their key ``op/config.kdtr``
    (entries without a sha256 string left out)."""
    out = {}
    for rel, e in entries.items():
        if isinstance(e, dict) and isinstance(e.get("sha256"), str):
            size = e.get("size")
            out[rel] = Vouch(e["sha256"], size if isinstance(size, int) and size >= 0 else None,
                             f"{golden_dir.name}/MANIFEST.json")
    return out
