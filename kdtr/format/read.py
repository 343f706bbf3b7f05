"""The KDTR reader: :func:`load`, :func:`load_bytes` and :class:`KdtrFile`
(docs/kdtr-format.md sections 1 and 3).

Reading is zero-copy: :func:`load` maps the file and returns read-only numpy views over
the mapping (``mmap=False`` reads the file into memory instead); with ``verify=False`` it
reads only the header and the padding bytes. Only regular files are opened
(:func:`_open_regular`: a FIFO, a device or a directory is refused with
:class:`kdtr.errors.Io`, without blocking).

The header is read in one pass of precompiled struct formats (:func:`_parse_body_fast`);
only a header that breaks a rule goes through the field-by-field construct reader
(:func:`_parse_body_checked`), which raises the first defect in file order as a subclass
of :class:`kdtr.errors.KdtrError` naming the file, the field and its byte offset.
Validation never uses ``assert``.
"""

from __future__ import annotations

import bisect
import errno
import io
import mmap as mmap_module
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from construct import (
    Bytes,
    Construct,
    ConstructError,
    Float64l,
    Int8ul,
    Int16ul,
    Int32ul,
    Int64sl,
    Int64ul,
)

from .. import errors as E
from ..dtypes import DTYPE_BY_CODE
from . import layout
from .layout import (
    _COUNTS,
    _ENTRY_TAIL,
    _F64S,
    _I64_MAX,
    _I64S,
    _ITEMSIZE_BY_CODE,
    _KIND,
    _NUMPY_BY_CODE,
    _U16,
    _U32,
    _U64_MAX,
    ALIGNMENT,
    MAGIC,
    MAX_HEADER_LEN,
    MAX_METADATA,
    MAX_NAME_LEN,
    MAX_NDIM,
    MAX_STRING_LEN,
    MAX_TENSORS,
    META_BOOL,
    META_FLOAT,
    META_INT,
    META_STRING,
    MIN_HEADER_LEN,
    PREAMBLE_LEN,
    VERSION_MAJOR,
    Counts,
    HeaderCrc,
    MetaType,
    Preamble,
    TensorEntry,
    TensorShape,
    _checked_nbytes,
)


@dataclass
class KdtrFile:
    """An opened KDTR file.

    Attributes:
        path: the file's path.
        version: (major, minor).
        tensors: name -> read-only numpy array, file order: a view over the file mapping
            (``load(mmap=True)``) or over a private in-memory copy (``mmap=False``).
        metadata: key -> int | float | str | bool, file order.
        entries: the parsed tensor entries, file order.
    """

    path: str
    version: tuple[int, int]
    tensors: dict[str, np.ndarray]
    metadata: dict[str, Any]
    entries: list[TensorEntry] = field(repr=False)
    _mmap: mmap_module.mmap | None = field(default=None, repr=False)

    def __enter__(self) -> KdtrFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Drop the tensors and unmap the file if no view is still alive elsewhere (an
        in-memory copy is freed when its last view is)."""
        self.tensors = {}
        if self._mmap is not None:
            try:
                self._mmap.close()
            except BufferError:
                pass  # a caller still holds a view; the mapping closes when it is freed
            self._mmap = None


class _HeaderReader:
    """Reads header fields through construct, turning short reads into ``Truncated``."""

    def __init__(self, path: str, body: bytes):
        self.path = path
        self.stream = io.BytesIO(body)

    @property
    def offset(self) -> int:
        return PREAMBLE_LEN + self.stream.tell()

    def read(self, con: Construct, field_name: str, **ctx: Any) -> Any:
        at = self.offset
        try:
            return con.parse_stream(self.stream, **ctx)
        except ConstructError as exc:
            raise E.Truncated(self.path, field_name, at, "header ends inside this field") from exc

    def name(self, field_name: str) -> tuple[str, int]:
        """Reads a name or key; returns it and the offset of its bytes.

        The length is checked before the bytes are read (file order): a length over the cap
        is ``BadName`` even when the header also ends early.
        """
        at = self.offset
        length = self.read(Int16ul, field_name + "_len")
        if not 1 <= length <= MAX_NAME_LEN:
            raise E.BadName(self.path, field_name + "_len", at, f"length {length} not in [1, {MAX_NAME_LEN}]")
        raw_at = self.offset
        raw = self.read(Bytes(length), field_name)
        try:
            return raw.decode("utf-8"), raw_at
        except UnicodeDecodeError as exc:
            raise E.BadName(self.path, field_name, raw_at, f"not valid UTF-8 ({exc.reason})") from exc

    def remaining(self) -> int:
        return len(self.stream.getbuffer()) - self.stream.tell()


class _Ranges:
    """Disjoint [start, end) data ranges seen so far, sorted by start (for the overlap rule)."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.items: list[tuple[int, int, int]] = []  # (start, end, tensor index)

    def overlapping(self, start: int, end: int) -> int | None:
        k = bisect.bisect_left(self.starts, start)
        if k < len(self.items) and self.items[k][0] < end:
            return self.items[k][2]
        if k > 0 and self.items[k - 1][1] > start:
            return self.items[k - 1][2]
        return None

    def add(self, start: int, end: int, index: int) -> None:
        k = bisect.bisect_left(self.starts, start)
        self.starts.insert(k, start)
        self.items.insert(k, (start, end, index))


def _parse_tensor(
    r: _HeaderReader, i: int, file_size: int, data_start: int, seen: dict[str, int], ranges: _Ranges
) -> TensorEntry:
    """One tensor entry, every field checked in file order (docs/kdtr-format.md section 3)."""
    p = r.path
    entry_at = r.offset
    name, name_at = r.name(f"tensors[{i}].name")
    if name in seen:
        raise E.DuplicateName(
            p, f"tensors[{i}].name", name_at, f"tensor name {name!r} repeats tensors[{seen[name]}]"
        )
    dtype_at = r.offset
    code = r.read(Int8ul, f"tensors[{i}].dtype ({name})")
    if code not in DTYPE_BY_CODE:
        raise E.UnknownDtype(p, f"tensors[{i}].dtype ({name})", dtype_at, f"unknown dtype code {code}")
    ndim_at = r.offset
    ndim = r.read(Int8ul, f"tensors[{i}].ndim ({name})")
    if ndim > MAX_NDIM:
        raise E.TooManyDims(p, f"tensors[{i}].ndim ({name})", ndim_at, f"ndim {ndim} > {MAX_NDIM}")
    shape_at = r.offset
    shape = tuple(r.read(TensorShape, f"tensors[{i}].shape ({name})", ndim=ndim).dims)
    itemsize = DTYPE_BY_CODE[code].itemsize
    want = _checked_nbytes(p, f"tensors[{i}].shape ({name})", shape_at, shape, itemsize)

    where = f"tensors[{i}].offset ({name})"
    offset_at = r.offset
    offset = r.read(Int64ul, where)
    if offset % ALIGNMENT:
        raise E.MisalignedOffset(p, where, offset_at, f"{offset} is not a multiple of {ALIGNMENT}")
    if offset < data_start:
        raise E.OffsetOutOfFile(p, where, offset_at, f"{offset} is inside the header, which ends at {data_start}")
    if offset > file_size:
        raise E.OffsetOutOfFile(p, where, offset_at, f"{offset} is past the end of the file ({file_size} bytes)")

    where = f"tensors[{i}].nbytes ({name})"
    nbytes_at = r.offset
    nbytes = r.read(Int64ul, where)
    if nbytes != want:
        raise E.NbytesMismatch(p, where, nbytes_at, f"nbytes {nbytes} != {want} (shape {shape} x {itemsize} B)")
    end = offset + nbytes
    if end > _U64_MAX:
        raise E.SizeOverflow(p, where, nbytes_at, "offset + nbytes overflows 64 bits")
    if end > file_size:
        raise E.OffsetOutOfFile(
            p, where, nbytes_at, f"data [{offset}, {end}) ends past the end of the file ({file_size} bytes)"
        )
    if nbytes:
        other = ranges.overlapping(offset, end)
        if other is not None:
            raise E.OverlappingTensors(
                p, f"tensors[{i}].offset ({name})", offset_at, f"data [{offset}, {end}) overlaps tensors[{other}]"
            )
        ranges.add(offset, end, i)

    crc_at = r.offset
    crc = r.read(Int32ul, f"tensors[{i}].crc32 ({name})")
    seen[name] = i
    return TensorEntry(name, code, shape, offset, nbytes, crc, entry_at, crc_at)


def _parse_metadata(r: _HeaderReader, i: int, seen: Mapping[str, Any]) -> tuple[str, Any]:
    p = r.path
    key, key_at = r.name(f"metadata[{i}].key")
    if key in seen:
        raise E.DuplicateName(p, f"metadata[{i}].key", key_at, f"metadata key {key!r} repeats")
    where = f'metadata["{key}"]'
    type_at = r.offset
    kind = r.read(MetaType, where)
    if kind == META_INT:
        return key, r.read(Int64sl, where)
    if kind == META_FLOAT:
        return key, r.read(Float64l, where)
    if kind == META_BOOL:
        value_at = r.offset
        b = r.read(Int8ul, where)
        if b not in (0, 1):
            raise E.BadMetadata(p, where, value_at, f"bool value byte {b} is neither 0 nor 1")
        return key, bool(b)
    if kind == META_STRING:
        len_at = r.offset
        length = r.read(Int32ul, where)
        if length > MAX_STRING_LEN:
            raise E.BadMetadata(p, where, len_at, f"string length {length} > {MAX_STRING_LEN}")
        raw = r.read(Bytes(length), where)
        try:
            return key, raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise E.BadMetadata(p, where, len_at + 4, "string value is not valid UTF-8") from exc
    raise E.BadMetadata(p, where, type_at, f"unknown metadata type {kind}")


def _parse_body_checked(
    p: str, body: bytes, size: int, data_start: int, minor: int
) -> tuple[list[TensorEntry], dict[str, Any]]:
    """The header body (bytes [16, 16 + header_len - 4)) read field by field through the
    construct pieces, every rule checked in file order: the reader of record for errors,
    which raises the first defect with its field and offset (docs/kdtr-format.md section 3)."""
    r = _HeaderReader(p, body)
    counts_at = r.offset
    counts = r.read(Counts, "tensor_count")
    if counts.tensor_count > MAX_TENSORS:
        raise E.TooManyTensors(p, "tensor_count", counts_at, f"{counts.tensor_count} > {MAX_TENSORS}")
    if counts.metadata_count > MAX_METADATA:
        raise E.TooManyMetadata(p, "metadata_count", counts_at + 4, f"{counts.metadata_count} > {MAX_METADATA}")

    entries: list[TensorEntry] = []
    seen: dict[str, int] = {}
    ranges = _Ranges()
    for i in range(counts.tensor_count):
        entries.append(_parse_tensor(r, i, size, data_start, seen, ranges))

    metadata: dict[str, Any] = {}
    for i in range(counts.metadata_count):
        key, value = _parse_metadata(r, i, metadata)
        metadata[key] = value

    if r.remaining() and minor == 0:
        raise E.ExtensionInV10(
            p, "extension", r.offset, f"{r.remaining()} bytes between metadata and header CRC in a 1.0 file"
        )
    return entries, metadata


def _parse_body_fast(
    body: bytes, size: int, data_start: int, minor: int
) -> tuple[list[TensorEntry], dict[str, Any]] | None:
    """The header body in one pass (HeaderBodyLayout through precompiled struct formats:
    one unpack for everything of a tensor entry after its name), checking every rule of
    docs/kdtr-format.md section 3 that the header alone decides.

    Returns the same (entries, metadata) as :func:`_parse_body_checked` for a header that
    breaks no rule, and None for any other: it never raises a format error itself, the
    caller then runs :func:`_parse_body_checked`, which names the first defect in file
    order. (tests/unit/test_format_fast.py checks that the two agree.)"""
    n = len(body)
    if n < _COUNTS.size:
        return None
    tensor_count, metadata_count = _COUNTS.unpack_from(body, 0)
    if tensor_count > MAX_TENSORS or metadata_count > MAX_METADATA:
        return None
    pos = _COUNTS.size
    itemsizes = _ITEMSIZE_BY_CODE
    tails = _ENTRY_TAIL
    entries: list[TensorEntry] = []
    names: set[str] = set()
    spans: list[tuple[int, int]] = []
    for _ in range(tensor_count):
        entry_at = pos
        if pos + 2 > n:
            return None
        (name_len,) = _U16.unpack_from(body, pos)
        name_end = pos + 2 + name_len
        if not 1 <= name_len <= MAX_NAME_LEN or name_end + 2 > n:
            return None
        try:
            name = body[pos + 2 : name_end].decode("utf-8")
        except UnicodeDecodeError:
            return None
        code, ndim = _KIND.unpack_from(body, name_end)
        itemsize = itemsizes.get(code)
        if name in names or itemsize is None or ndim > MAX_NDIM:
            return None
        tail = tails[ndim]
        pos = name_end + 2 + tail.size
        if pos > n:
            return None
        *shape, offset, nbytes, crc = tail.unpack_from(body, name_end + 2)
        count = 1
        for d in shape:
            if d:
                count *= d
        if count * itemsize > _I64_MAX:  # the size rule (itemsize >= 1 covers count itself)
            return None
        if nbytes != (0 if 0 in shape else count * itemsize):
            return None
        if offset % ALIGNMENT or offset < data_start or offset + nbytes > size:
            return None
        if nbytes:
            spans.append((offset, offset + nbytes))
        names.add(name)
        entries.append(
            TensorEntry(name, code, tuple(shape), offset, nbytes, crc, PREAMBLE_LEN + entry_at, PREAMBLE_LEN + pos - 4)
        )
    spans.sort()
    for k in range(1, len(spans)):
        if spans[k][0] < spans[k - 1][1]:  # sorted by start: an overlap shows between neighbours
            return None

    metadata: dict[str, Any] = {}
    for _ in range(metadata_count):
        if pos + 2 > n:
            return None
        (key_len,) = _U16.unpack_from(body, pos)
        key_end = pos + 2 + key_len
        if not 1 <= key_len <= MAX_NAME_LEN or key_end + 1 > n:
            return None
        try:
            key = body[pos + 2 : key_end].decode("utf-8")
        except UnicodeDecodeError:
            return None
        if key in metadata:
            return None
        kind = body[key_end]
        pos = key_end + 1
        value: Any
        if kind == META_INT or kind == META_FLOAT:
            if pos + 8 > n:
                return None
            (value,) = (_I64S if kind == META_INT else _F64S).unpack_from(body, pos)
            pos += 8
        elif kind == META_BOOL:
            if pos + 1 > n or body[pos] > 1:
                return None
            value = body[pos] == 1
            pos += 1
        elif kind == META_STRING:
            if pos + 4 > n:
                return None
            (length,) = _U32.unpack_from(body, pos)
            pos += 4
            if length > MAX_STRING_LEN or pos + length > n:
                return None
            try:
                value = body[pos : pos + length].decode("utf-8")
            except UnicodeDecodeError:
                return None
            pos += length
        else:
            return None
        metadata[key] = value

    if pos != n and minor == 0:
        return None
    return entries, metadata


def _check_data_region(path: str, buf: memoryview, entries: list[TensorEntry], data_start: int) -> None:
    """Zero padding and trailing bytes (docs/kdtr-format.md section 1.5); the header parse
    has already rejected overlapping ranges."""
    size = len(buf)
    cursor = data_start
    for e in sorted((e for e in entries if e.nbytes), key=lambda e: e.offset):
        _check_zero(path, buf, cursor, e.offset)
        cursor = e.offset + e.nbytes
    data_end = max([data_start, cursor] + [e.offset for e in entries])
    _check_zero(path, buf, cursor, data_end)
    if size > data_end:
        raise E.TrailingBytes(path, "end of data", data_end, f"{size - data_end} bytes after the last tensor")


def _check_zero(path: str, buf: memoryview, start: int, stop: int) -> None:
    gap = bytes(buf[start:stop])
    if gap.count(0) != len(gap):
        bad = start + next(k for k, b in enumerate(gap) if b)
        raise E.NonZeroPadding(path, "padding", bad, f"padding byte is {gap[bad - start]}, must be 0")


def _verify_tensor(path: str, buf: memoryview, e: TensorEntry) -> None:
    # No view of the mapping may outlive this function when it raises: a view kept alive
    # by the traceback would make load()'s mm.close() fail with BufferError.
    with buf[e.offset : e.offset + e.nbytes] as data:
        crc = layout._crc32(data)
    if crc != e.crc32:
        raise E.TensorChecksumMismatch(
            path, f"tensor {e.name!r} crc32", e.crc_offset,
            f"stored {e.crc32:#010x} != CRC-32 {crc:#010x} of data [{e.offset}, {e.offset + e.nbytes})",
        )
    if DTYPE_BY_CODE[e.dtype_code].name == "bool" and e.nbytes:
        with buf[e.offset : e.offset + e.nbytes] as data:
            raw = np.frombuffer(data, dtype=np.uint8)
            bad = np.flatnonzero(raw > 1)
            k = int(bad[0]) if bad.size else -1
            value = int(raw[k]) if bad.size else 0
            del raw
        if k >= 0:
            raise E.BadBoolValue(path, f"tensor {e.name!r} data", e.offset + k, f"bool byte {value} at element {k}")


def load(path: str | os.PathLike, verify: bool = True, *, mmap: bool = True) -> KdtrFile:
    """Open a KDTR file and return its tensors (read-only numpy arrays) and metadata.

    Args:
        path: the file; it must be a regular file (a symlink to one is fine).
        verify: also check every tensor's CRC-32 and the 0/1 rule of bool tensors
            (reads all data once). With False, opening costs O(header).
        mmap: True (the default): the tensors are zero-copy views over a read-only
            mapping of the file. False: the whole file is read into memory once and the
            tensors are views over that copy; the same rules are checked and the arrays
            are just as read-only.

    Returns:
        A :class:`KdtrFile`; ``.tensors`` maps name -> np.ndarray (C order, the file's
        shape and dtype, bf16 as ``ml_dtypes.bfloat16``, ``writeable`` False),
        ``.metadata`` maps key -> int | float | str | bool, both in file order.

    Raises:
        KdtrError: a subclass naming the defect, the file, the field and the offset.
        kdtr.errors.Io: ``path`` is not a regular file (a directory, FIFO, device or
            socket: it is refused without being read, so a FIFO with no writer does not
            hang), or it shrank while being read with ``mmap=False``.
        OSError: the file cannot be opened or read (no such file, permission denied).

    Warning (mmap=True): the arrays read the file's pages on first touch. If the file is
    truncated or rewritten in place while the arrays are alive, touching a page past its
    new end kills the process with SIGBUS, and a rewrite in place changes the arrays'
    contents under you (``kdtr.save`` replaces files by rename, which is safe). Use
    ``mmap=False`` when another process may truncate or rewrite the file.
    """
    p = os.fspath(path)
    fd = _open_regular(p)
    try:
        size = os.fstat(fd).st_size
        if size < PREAMBLE_LEN:
            _check_short_preamble(p, os.read(fd, PREAMBLE_LEN), size)
        if mmap:
            try:
                src: Any = mmap_module.mmap(fd, 0, access=mmap_module.ACCESS_READ)
            except ValueError:  # "cannot mmap an empty file": emptied since fstat
                _check_short_preamble(p, b"", 0)
            size = len(src)  # the mapping's own length, should the file have changed since fstat
            if size < PREAMBLE_LEN:
                head = bytes(src[:size])
                src.close()
                _check_short_preamble(p, head, size)
        else:
            src = _read_all(p, fd, size)
    finally:
        os.close(fd)
    try:
        return _load_mapped(p, src, size, verify, src if mmap else None)
    except BaseException:
        if mmap:
            try:
                src.close()
            except BufferError:
                pass  # a view is still referenced (e.g. by the traceback); freed with it
        raise


def load_bytes(data: bytes | bytearray | memoryview, path: str | os.PathLike = "<bytes>",
               verify: bool = True) -> KdtrFile:
    """Parse a KDTR file already held in memory (read by the caller, e.g. to hash those
    very bytes first), with every rule of :func:`load`.

    Args:
        data: the whole file. The tensors are read-only views over it: a ``bytes`` object
            is a private copy no other process can change; a bytearray must not be changed
            while its tensors are in use.
        path: the name that errors give for the file.
        verify: as :func:`load`.

    Returns:
        A :class:`KdtrFile` as :func:`load` returns it (``tensors`` read-only).

    Raises:
        KdtrError: a subclass naming the defect, ``path``, the field and the offset.
    """
    p = os.fspath(path)
    src = memoryview(data).cast("B").toreadonly()
    size = src.nbytes
    if size < PREAMBLE_LEN:
        _check_short_preamble(p, bytes(src), size)
    return _load_mapped(p, src, size, verify, None)


def _open_regular(p: str) -> int:
    """A read-only descriptor of ``p``, or :class:`kdtr.errors.Io` if it is not a regular
    file. The open does not block (O_NONBLOCK, so a FIFO with no writer is refused at once,
    and O_NOCTTY); O_NONBLOCK is cleared again before any read."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    flags |= getattr(os, "O_BINARY", 0)
    fd = os.open(p, flags)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = (
                "a directory" if stat.S_ISDIR(mode) else
                "a FIFO" if stat.S_ISFIFO(mode) else
                "a character device" if stat.S_ISCHR(mode) else
                "a block device" if stat.S_ISBLK(mode) else
                "a socket" if stat.S_ISSOCK(mode) else
                "not a regular file"
            )
            raise E.Io(p, f"not a regular file ({kind})", errno.EISDIR if stat.S_ISDIR(mode) else errno.EINVAL)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular_bytes(path: str | os.PathLike) -> bytes:
    """The bytes of a small regular file (a manifest, a known-failures list), opened the way
    :func:`load` opens a golden: a FIFO, directory, device or socket raises
    :class:`kdtr.errors.Io` at once instead of blocking or reading forever.

    Raises:
        kdtr.errors.Io: not a regular file.
        OSError: the operating system's own failures (no such file, permission denied).
    """
    fd = _open_regular(os.fspath(path))
    with open(fd, "rb", closefd=True) as fh:
        return fh.read()


def _read_all(p: str, fd: int, size: int) -> memoryview:
    """The first ``size`` bytes of ``fd`` as a read-only memoryview over a private copy."""
    buf = bytearray(size)
    view = memoryview(buf)
    pos = 0
    with open(fd, "rb", buffering=0, closefd=False) as raw:
        while pos < size:
            n = raw.readinto(view[pos:])
            if not n:
                view.release()
                raise E.Io(p, f"file shrank while reading: {size} bytes at open, {pos} read", errno.EIO)
            pos += n
    view.release()
    return memoryview(buf).toreadonly()


def _check_short_preamble(p: str, head: bytes, size: int) -> None:
    """A file shorter than the preamble: its fields in file order; the one the file ends
    inside is Truncated (a complete magic or major version is still checked first)."""
    short = f"file has {size} bytes; the preamble needs {PREAMBLE_LEN}"
    if size < 8:
        raise E.Truncated(p, "magic", 0, short)
    if head[:8] != MAGIC:
        raise E.BadMagic(p, "magic", 0, f"{head[:8]!r} is not {MAGIC!r}")
    if size < 10:
        raise E.Truncated(p, "version_major", 8, short)
    major = int.from_bytes(head[8:10], "little")
    if major != VERSION_MAJOR:
        raise E.UnsupportedVersion(p, "version_major", 8, f"major version {major}; this reader reads {VERSION_MAJOR}")
    if size < 12:
        raise E.Truncated(p, "version_minor", 10, short)
    raise E.Truncated(p, "header_len", 12, short)


def _load_mapped(p: str, src: Any, size: int, verify: bool, mm: mmap_module.mmap | None) -> KdtrFile:
    """Parse and validate the ``size`` bytes of ``src`` (a read-only mmap or memoryview);
    ``mm`` is the mapping the returned file owns (None for an in-memory copy)."""
    buf = memoryview(src)
    try:
        pre = Preamble.parse(bytes(buf[:PREAMBLE_LEN]))
        if pre.magic != MAGIC:
            raise E.BadMagic(p, "magic", 0, f"{pre.magic!r} is not {MAGIC!r}")
        if pre.version_major != VERSION_MAJOR:
            raise E.UnsupportedVersion(
                p, "version_major", 8, f"major version {pre.version_major}; this reader reads {VERSION_MAJOR}"
            )
        hl = pre.header_len
        if hl > MAX_HEADER_LEN:
            raise E.HeaderTooLarge(p, "header_len", 12, f"{hl} bytes > cap MAX_HEADER_LEN = {MAX_HEADER_LEN}")
        if hl < MIN_HEADER_LEN:
            raise E.Truncated(p, "header_len", 12, f"{hl} bytes < the minimum {MIN_HEADER_LEN}")
        data_start = PREAMBLE_LEN + hl
        if data_start > size:
            raise E.HeaderPastEnd(p, "header_len", 12, f"header ends at {data_start}, file has {size} bytes")
        crc_at = data_start - 4
        stored = HeaderCrc.parse(bytes(buf[crc_at:data_start]))
        actual = layout._crc32(buf[:crc_at])
        if stored != actual:
            raise E.HeaderChecksumMismatch(
                p, "header_crc32", crc_at, f"CRC-32 {actual:#010x} != stored {stored:#010x}"
            )

        body = bytes(buf[PREAMBLE_LEN:crc_at])
        parsed = _parse_body_fast(body, size, data_start, pre.version_minor)
        if parsed is None:  # something is wrong (or unusual): the field-by-field reader names it
            parsed = _parse_body_checked(p, body, size, data_start, pre.version_minor)
        entries, metadata = parsed

        _check_data_region(p, buf, entries, data_start)
        if verify:
            for e in entries:
                _verify_tensor(p, buf, e)

        tensors: dict[str, np.ndarray] = {}
        for e in entries:
            dt = _NUMPY_BY_CODE[e.dtype_code]
            if e.nbytes == 0:
                arr = np.empty(e.shape, dtype=dt)
                arr.flags.writeable = False
            else:
                arr = np.frombuffer(src, dtype=dt, count=e.nbytes // dt.itemsize, offset=e.offset).reshape(e.shape)
            tensors[e.name] = arr
    finally:
        buf.release()
    return KdtrFile(p, (pre.version_major, pre.version_minor), tensors, metadata, entries, mm)
