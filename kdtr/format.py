"""KDTR version 1: reader and writer for named tensors plus flat typed metadata.

The normative specification is docs/kdtr-format.md; this docstring is its summary.

Layout (all little-endian, offsets absolute)::

    preamble  16 B   magic b"\\x89KDTR\\r\\n\\x1a", u16 major (1), u16 minor, u32 header_len
    header    header_len B
              u32 tensor_count, u32 metadata_count,
              tensor entries   (u16 name_len, name, u8 dtype, u8 ndim, u64 shape[ndim],
                                u64 offset, u64 nbytes, u32 crc32)
              metadata entries (u16 key_len, key, u8 type, value)
              extension bytes  (empty in 1.0; skipped by 1.x readers when minor > 0)
              u32 header_crc32 (CRC-32 of bytes [0, 16 + header_len - 4))
    data      each tensor at a multiple of 64, zero padding, nothing after the last one

Reading is zero-copy: :func:`load` maps the file and returns read-only numpy views over
the mapping (``mmap=False`` reads the file into memory instead, for files that may be
truncated while in use: a truncated mapping raises SIGBUS); with ``verify=False`` it reads
only the header and the padding bytes. Only regular files are opened (a FIFO, a device or
a directory is refused with :class:`kdtr.errors.Io`, without blocking).
Writing validates everything first (the writer refuses whatever a reader would reject,
with :class:`kdtr.errors.WriteError` naming the destination), then is atomic: a temporary
file ``.<name>.<random>.tmp`` in the target directory, fsync, rename (:func:`atomic_write`,
which ``golden/MANIFEST.json`` and the reports are written through too; the destination
itself is never followed: a symbolic link there is refused; kdtr/fsutil.py).

Every defect raises a subclass of :class:`kdtr.errors.KdtrError` that names the file, the
field and its byte offset. Validation never uses ``assert``.

Speed (docs/kdtr-format.md section 3.3): CRC-32s by python-isal (``zlib.crc32`` where it
cannot be imported; :data:`CRC32_IMPL` says which); the header is read in one pass of
precompiled struct formats (:func:`_parse_body_fast`), and only a header that breaks a
rule goes through the field-by-field construct reader (:func:`_parse_body_checked`) that
names the defect; :data:`HeaderBodyLayout` is the construct declaration both follow.
"""

from __future__ import annotations

import bisect
import errno
import io
import mmap as mmap_module
import os
import stat
import struct
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from construct import (
    Array,
    Bytes,
    Construct,
    ConstructError,
    Float64l,
    GreedyBytes,
    Int8ul,
    Int16ul,
    Int32ul,
    Int64sl,
    Int64ul,
    Struct,
    Switch,
    this,
)

from . import errors as E
from . import fsutil
from .dtypes import DTYPE_BY_CODE, code_of_dtype

# --- CRC-32 ----------------------------------------------------------------------------
# One checksum everywhere: zlib's CRC-32 (docs/kdtr-format.md section 3). ISA-L computes
# the same function several times faster (python-isal's ``isal_zlib.crc32`` is a drop-in
# for ``zlib.crc32``: same values, same optional start value, any buffer length); zlib is
# the fallback where isal cannot be imported. Every CRC of this module goes through
# ``_crc32`` (looked up at call time, so a test can swap it).
try:
    from isal.isal_zlib import crc32 as _isal_crc32
except ImportError:  # pragma: no cover - isal is a declared dependency
    _isal_crc32 = None

_crc32 = _isal_crc32 if _isal_crc32 is not None else zlib.crc32
#: "isal" (python-isal's ISA-L CRC-32) or "zlib" (the fallback): which one this process uses.
CRC32_IMPL = "isal" if _isal_crc32 is not None else "zlib"

MAGIC = b"\x89KDTR\r\n\x1a"
VERSION_MAJOR = 1
VERSION_MINOR = 0
PREAMBLE_LEN = 16
ALIGNMENT = 64
MAX_HEADER_LEN = 16 * 1024 * 1024
MIN_HEADER_LEN = 12  # two counts and the CRC
MAX_TENSORS = 4096
MAX_METADATA = 4096
MAX_NDIM = 8
MAX_NAME_LEN = 255
MAX_STRING_LEN = 1024 * 1024
_U64_MAX = (1 << 64) - 1
_I64_MAX = (1 << 63) - 1  # the cap on product(nonzero dims) x itemsize

META_INT, META_FLOAT, META_STRING, META_BOOL = 1, 2, 3, 4

# --- construct descriptions of the header pieces -------------------------------------

Preamble = Struct(
    "magic" / Bytes(8),
    "version_major" / Int16ul,
    "version_minor" / Int16ul,
    "header_len" / Int32ul,
)
Counts = Struct("tensor_count" / Int32ul, "metadata_count" / Int32ul)
Name = Struct("length" / Int16ul, "raw" / Bytes(this.length))
TensorKind = Struct("dtype" / Int8ul, "ndim" / Int8ul)
TensorShape = Struct("dims" / Array(this._.ndim, Int64ul))
TensorPlace = Struct("offset" / Int64ul, "nbytes" / Int64ul, "crc32" / Int32ul)
MetaType = Int8ul
MetaString = Struct("length" / Int32ul, "raw" / Bytes(this.length))
HeaderCrc = Int32ul

# The whole header body (bytes [16, 16 + header_len - 4): everything but the preamble and
# the header CRC) as one declaration. This is the layout of record: the single-pass codecs
# below (_parse_body_fast, _entry_bytes, _meta_value_bytes) implement exactly it, and
# tests/test_format_fast.py checks that they agree with it byte for byte.
TensorEntryLayout = Struct(
    "name_len" / Int16ul,
    "name" / Bytes(this.name_len),
    "dtype" / Int8ul,
    "ndim" / Int8ul,
    "shape" / Array(this.ndim, Int64ul),
    "offset" / Int64ul,
    "nbytes" / Int64ul,
    "crc32" / Int32ul,
)
MetadataEntryLayout = Struct(
    "key_len" / Int16ul,
    "key" / Bytes(this.key_len),
    "type" / MetaType,
    "value" / Switch(this.type, {META_INT: Int64sl, META_FLOAT: Float64l, META_STRING: MetaString, META_BOOL: Int8ul}),
)
HeaderBodyLayout = Struct(
    "tensor_count" / Int32ul,
    "metadata_count" / Int32ul,
    "tensors" / Array(this.tensor_count, TensorEntryLayout),
    "metadata" / Array(this.metadata_count, MetadataEntryLayout),
    "extension" / GreedyBytes,
)

# --- the same layout as precompiled struct formats (one pass, no per-field calls) -----

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_COUNTS = struct.Struct("<II")
_KIND = struct.Struct("<BB")
_I64S = struct.Struct("<q")
_F64S = struct.Struct("<d")
# shape[ndim], offset, nbytes, crc32: everything of a tensor entry after its dtype and ndim
_ENTRY_TAIL = tuple(struct.Struct(f"<{n}QQQI") for n in range(MAX_NDIM + 1))
# dtype, ndim, shape[ndim]: the writer's part of an entry before its place
_ENTRY_KIND_SHAPE = tuple(struct.Struct(f"<BB{n}Q") for n in range(MAX_NDIM + 1))
_PLACE = struct.Struct("<QQI")
_META_INT_HEAD, _META_FLOAT_HEAD, _META_STRING_HEAD = bytes([META_INT]), bytes([META_FLOAT]), bytes([META_STRING])
_ITEMSIZE_BY_CODE = {c: d.itemsize for c, d in DTYPE_BY_CODE.items()}


class _NumpyByCode(dict):
    """dtype code -> numpy dtype; bf16's entry (which imports ml_dtypes) made on first use."""

    def __missing__(self, code: int) -> np.dtype:
        dt = self[code] = DTYPE_BY_CODE[code].numpy
        return dt


_NUMPY_BY_CODE = _NumpyByCode({c: d._numpy for c, d in DTYPE_BY_CODE.items() if d._numpy is not None})


@dataclass(frozen=True)
class TensorEntry:
    """One tensor entry of the header (all sizes in bytes)."""

    name: str
    dtype_code: int
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    crc32: int
    entry_offset: int  # where the entry starts in the file
    crc_offset: int = -1  # where its crc32 field is in the file


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


def _checked_nbytes(path: str, where: str, at: int, shape: tuple[int, ...], itemsize: int) -> int:
    """nbytes of a tensor, or SizeOverflow (docs/kdtr-format.md sections 1.3 and 3).

    The product of the nonzero dims times the itemsize must not exceed 2**63 - 1
    (INT64_MAX), checked as the C++ reader does: the running product of the nonzero dims,
    left to right, then times the itemsize.  That bound is numpy's own (it makes every
    valid shape an ndarray) and keeps every size a signed 64-bit value in C++.  nbytes is
    product(shape) x itemsize: that bounded value, or 0 when any dim is 0."""
    n = 1
    for d in shape:
        if d:
            n *= d
            if n > _I64_MAX:
                break
    if n > _I64_MAX or n * itemsize > _I64_MAX:
        raise E.SizeOverflow(
            path, where, at, f"shape {shape} x {itemsize} B: product of the nonzero dims x itemsize exceeds 2**63 - 1"
        )
    return 0 if 0 in shape else n * itemsize


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
    order. (tests/test_format_fast.py checks that the two agree.)"""
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
        crc = _crc32(data)
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
        actual = _crc32(buf[:crc_at])
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


# --- writer ---------------------------------------------------------------------------


_BOOL_CODE = next(c for c, d in DTYPE_BY_CODE.items() if d.name == "bool")
_F64 = np.dtype("<f8")


def _werr(path: str, field_name: str, detail: str) -> E.WriteError:
    return E.WriteError(path, field_name, -1, detail)


def _pairs(path: str, what: str, obj: Any) -> list[tuple[Any, Any]]:
    """The (name, value) pairs of ``obj``, in order: a mapping (anything with ``keys()``
    and ``[]``, as ``dict()`` takes it) or an iterable of 2-tuples / 2-lists.

    Raises WriteError naming ``what`` (``tensors`` or ``metadata``) for anything else: a
    str, bytes, an array, a non-iterable, or an item that is not a pair."""
    if isinstance(obj, Mapping) or (hasattr(obj, "keys") and hasattr(obj, "__getitem__")):
        return [(k, obj[k]) for k in list(obj.keys())]
    item = "(name, array)" if what == "tensors" else "(key, value)"
    if isinstance(obj, (str, bytes, bytearray, memoryview, np.ndarray, np.generic)) or not isinstance(obj, Iterable):
        raise _werr(path, what, f"expected a mapping or an iterable of {item} pairs, got {type(obj).__name__}")
    out = []
    for i, pair in enumerate(obj):
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            got = type(pair).__name__ + (f" of length {len(pair)}" if isinstance(pair, (tuple, list)) else "")
            raise _werr(path, f"{what}[{i}]", f"expected a {item} pair, got {got}")
        out.append((pair[0], pair[1]))
    return out


def _encode_name(path: str, field_name: str, kind: str, name: Any) -> tuple[str, bytes]:
    """A tensor name or metadata key and its encoded entry prefix (u16 length, UTF-8 bytes)."""
    if not isinstance(name, str):
        raise _werr(path, field_name, f"{kind} {name!r} is a {type(name).__name__}, not a str")
    try:
        raw = name.encode("utf-8")
    except UnicodeEncodeError as exc:  # lone surrogates have no UTF-8 form
        raise _werr(path, field_name, f"{kind} {name!r} cannot be encoded as UTF-8 ({exc.reason})") from None
    if not 1 <= len(raw) <= MAX_NAME_LEN:
        raise _werr(path, field_name, f"{kind} {name!r} is {len(raw)} bytes of UTF-8, not in [1, {MAX_NAME_LEN}]")
    return str(name), _U16.pack(len(raw)) + raw


def _unique_name(path: str, section: str, what: str, i: int, name: Any, seen: dict[str, int]) -> tuple[str, bytes]:
    """Entry ``i`` of ``section``'s name, encoded (:func:`_encode_name`), and not a repeat
    of an earlier entry (recorded in ``seen``): WriteError DuplicateName otherwise."""
    field = f"{section}[{i}].{'name' if section == 'tensors' else 'key'}"
    name, name_bytes = _encode_name(path, field, what, name)
    if name in seen:
        raise _werr(path, field, f"{what} {name!r} repeats {section}[{seen[name]}] (readers reject it: DuplicateName)")
    seen[name] = i
    return name, name_bytes


def _as_array(path: str, where: str, value: Any) -> np.ndarray:
    """``value`` as an ndarray: an ndarray (subclasses too, masked arrays refused), a numpy
    scalar (a 0-d array), or an object with ``__array__`` / ``__array_interface__`` /
    ``__array_struct__`` (a torch CPU tensor, ...). Python lists, tuples and scalars are
    refused: their numpy dtype is a guess (int64 or int32, float64) and goldens need exact
    dtypes."""
    if isinstance(value, np.ma.MaskedArray):
        raise _werr(path, where, "is a masked array; KDTR cannot store its mask (pass .filled(...) or .data)")
    if isinstance(value, (np.ndarray, np.generic)):
        return np.asarray(value)
    if any(hasattr(value, attr) for attr in ("__array__", "__array_interface__", "__array_struct__")):
        try:
            arr = np.asarray(value)
        except Exception as exc:  # noqa: BLE001 - any conversion failure is the caller's value
            raise _werr(
                path, where, f"{type(value).__name__} cannot be converted to a numpy array ({type(exc).__name__}: {exc})"
            ) from exc
        if isinstance(arr, np.ndarray):
            return arr
    raise _werr(
        path, where, f"is a {type(value).__name__}, not an array; pass a numpy array with an explicit dtype "
        "(np.asarray(value, dtype=...))"
    )


_CODE_CACHE: dict[np.dtype, int] = {}
# dtype -> code for the dtypes the writer stores as they are (little-endian), bool left out;
# bf16 joins when _code_of first meets it (ml_dtypes is imported only where bf16 is used)
_STORED_CODE: dict[np.dtype, int] = {d._numpy: c for c, d in DTYPE_BY_CODE.items()
                                     if c != _BOOL_CODE and d._numpy is not None}


def _code_of(dt: np.dtype) -> int | None:
    """code_of_dtype of ``dt`` in either byte order, remembered per dtype (a handful of
    distinct dtypes reach the writer; the linear search is the slow part of a small tensor)."""
    try:
        return _CODE_CACHE[dt]
    except (KeyError, TypeError):  # TypeError: an unhashable dtype (none known)
        pass
    code = code_of_dtype(dt.newbyteorder("<"))
    if code is not None and len(_CODE_CACHE) < 256:  # only KDTR dtypes: the cache stays small
        try:
            _CODE_CACHE[dt] = code
            if code != _BOOL_CODE and dt == DTYPE_BY_CODE[code].numpy:  # bf16, first met
                _STORED_CODE.setdefault(dt, code)
        except TypeError:
            pass
    return code


def _prepare_tensor(path: str, where: str, value: Any) -> tuple[int, np.ndarray]:
    """(dtype code, C-contiguous little-endian array) of one tensor value, or WriteError
    for anything a KDTR reader would reject."""
    arr = _as_array(path, where, value)
    if arr.ndim > MAX_NDIM:
        raise _werr(path, where, f"ndim {arr.ndim} > {MAX_NDIM} (readers reject it: TooManyDims)")
    code = _code_of(arr.dtype)
    if code is None:
        raise _werr(path, where, f"dtype {arr.dtype} is not a KDTR dtype (docs/kdtr-format.md section 2)")
    target = DTYPE_BY_CODE[code].numpy
    if arr.dtype != target:  # big-endian input: the same values, stored little-endian
        arr = arr.astype(target)
    try:
        _checked_nbytes(path, where, -1, arr.shape, target.itemsize)
    except E.SizeOverflow as exc:  # numpy forbids such arrays; kept as a guard
        raise _werr(path, where, exc.detail) from None
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    if code == _BOOL_CODE and arr.size:
        raw = _raw(arr)
        bad = np.flatnonzero(raw > 1)
        if bad.size:
            k = int(bad[0])
            raise _werr(
                path, where, f"bool byte {int(raw[k])} at element {k} (C order) is neither 0 nor 1 "
                "(readers reject it: BadBoolValue); store arr != 0 or a u8 array"
            )
    return code, arr


def _encode_metadata_value(path: str, where: str, value: Any) -> bytes:
    """The type byte and value of one metadata entry (docs/kdtr-format.md section 1.4)."""
    if isinstance(value, (bool, np.bool_)):
        return bytes((META_BOOL, int(bool(value))))
    if isinstance(value, (int, np.integer)):
        v = int(value)
        if not -(1 << 63) <= v < (1 << 63):
            raise _werr(path, where, f"int {v} does not fit in i64")
        return _META_INT_HEAD + _I64S.pack(v)
    if isinstance(value, (float, np.floating)):
        f = float(value)
        if isinstance(value, np.floating) and value.dtype.itemsize > 8 and not (f == value or np.isnan(value)):
            raise _werr(path, where, f"{value.dtype} {value!r} is not exactly a float64; pass float(value) to round it")
        return _META_FLOAT_HEAD + _F64S.pack(f)
    if isinstance(value, str):
        try:
            raw = value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise _werr(path, where, f"string {value!r} cannot be encoded as UTF-8 ({exc.reason})") from None
        if len(raw) > MAX_STRING_LEN:
            raise _werr(path, where, f"string of {len(raw)} bytes of UTF-8 > {MAX_STRING_LEN}")
        return _META_STRING_HEAD + _U32.pack(len(raw)) + raw
    raise _werr(
        path, where, f"unsupported metadata type {type(value).__name__} (int, float, str, bool or a numpy scalar of one)"
    )


def _raw(arr: np.ndarray) -> np.ndarray:
    """The bytes of a C-contiguous array as a flat uint8 view (works for bool and bf16)."""
    return arr.reshape(-1).view(np.uint8)


def _align(n: int) -> int:
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


def encode(
    tensors: Mapping[str, Any] | Iterable[tuple[str, Any]],
    metadata: Mapping[str, Any] | Iterable[tuple[str, Any]] | None = None,
    path: str = "<bytes>",
) -> tuple[bytes, list[tuple[int, np.ndarray]], int]:
    """Validate and lay out a file without writing it.

    Arguments as :func:`save`; ``path`` only names the destination in errors.

    Returns:
        (preamble + header bytes, [(offset, C-contiguous little-endian array)], file size).

    Raises:
        WriteError: anything a KDTR reader (Python or C++) would reject; see :func:`save`.
    """
    pairs = _pairs(path, "tensors", tensors)
    if len(pairs) > MAX_TENSORS:
        raise _werr(path, "tensors", f"{len(pairs)} tensors > {MAX_TENSORS} (readers reject it: TooManyTensors)")
    meta_pairs = [] if metadata is None else _pairs(path, "metadata", metadata)
    if len(meta_pairs) > MAX_METADATA:
        raise _werr(path, "metadata", f"{len(meta_pairs)} entries > {MAX_METADATA} (readers reject it: TooManyMetadata)")

    entry_parts: list[tuple[bytes, np.ndarray]] = []
    seen: dict[str, int] = {}
    kind_shape = _ENTRY_KIND_SHAPE
    for i, (name, value) in enumerate(pairs):
        # The common case in one step: a new str name and a C-contiguous ndarray whose dtype
        # is a KDTR dtype as stored (little-endian, not bool: bool bytes need a scan).
        # Anything else, or anything wrong, takes the checked helpers below, which give the
        # same bytes for what is valid and the WriteErrors for what is not.
        if type(name) is str and type(value) is np.ndarray and name not in seen:
            code = _STORED_CODE.get(value.dtype)
            if code is not None and value.ndim <= MAX_NDIM and value.flags.c_contiguous:
                try:
                    raw = name.encode("utf-8")
                except UnicodeEncodeError:
                    raw = b""
                if 1 <= len(raw) <= MAX_NAME_LEN:
                    seen[name] = i
                    entry_parts.append((_U16.pack(len(raw)) + raw + kind_shape[value.ndim].pack(code, value.ndim, *value.shape), value))
                    continue
        name, name_bytes = _unique_name(path, "tensors", "tensor name", i, name, seen)
        code, arr = _prepare_tensor(path, f"tensor {name!r}", value)
        head = name_bytes + kind_shape[arr.ndim].pack(code, arr.ndim, *arr.shape)
        entry_parts.append((head, arr))

    meta_chunks: list[bytes] = []
    seen_keys: dict[str, int] = {}
    for i, (key, value) in enumerate(meta_pairs):
        key, key_bytes = _unique_name(path, "metadata", "metadata key", i, key, seen_keys)
        meta_chunks.append(key_bytes + _encode_metadata_value(path, f'metadata["{key}"]', value))
    meta_bytes = b"".join(meta_chunks)

    entries_len = sum(len(head) for head, _ in entry_parts) + _PLACE.size * len(entry_parts)
    header_len = Counts.sizeof() + entries_len + len(meta_bytes) + 4
    if header_len > MAX_HEADER_LEN:
        raise _werr(path, "header", f"header of {header_len} bytes > {MAX_HEADER_LEN} (readers reject it: HeaderTooLarge)")

    cursor = PREAMBLE_LEN + header_len
    data_end = cursor
    placed: list[tuple[int, np.ndarray]] = []
    body = [_COUNTS.pack(len(entry_parts), len(meta_pairs))]
    crc32 = _crc32
    for head, arr in entry_parts:
        off = (cursor + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT
        nbytes = arr.nbytes
        # A C-contiguous array is its own buffer of its bytes in C order (bf16 and bool too)
        body.append(head + _PLACE.pack(off, nbytes, crc32(arr) if nbytes else 0))
        placed.append((off, arr))
        cursor = off + nbytes
        if cursor > data_end:
            data_end = cursor
    body.append(meta_bytes)
    pre = Preamble.build(
        {"magic": MAGIC, "version_major": VERSION_MAJOR, "version_minor": VERSION_MINOR, "header_len": header_len}
    )
    head = pre + b"".join(body)
    head += _U32.pack(_crc32(head))
    return head, placed, data_end


def save(
    path: str | os.PathLike,
    tensors: Mapping[str, Any] | Iterable[tuple[str, Any]],
    metadata: Mapping[str, Any] | Iterable[tuple[str, Any]] | None = None,
) -> None:
    """Write tensors and metadata to ``path`` as KDTR 1.0, atomically.

    Args:
        path: destination; its directory must exist.
        tensors: name -> array, as a mapping or an iterable of (name, array) pairs (as
            ``dict()`` takes them; a repeated name is an error, never "last one wins").
            Names are non-empty str of at most 255 bytes of UTF-8. Each array is an
            ndarray, a numpy scalar (stored 0-d) or an object with ``__array__`` (a torch
            CPU tensor); any KDTR dtype (bf16 as ``ml_dtypes.bfloat16``), at most 8 dims,
            any strides and byte order. Written in C order, little-endian, in the given order.
            Python lists and scalars are refused (their dtype would be a guess).
        metadata: key -> int | float | str | bool (numpy scalars of those kinds accepted),
            as a mapping or an iterable of (key, value) pairs, written in the given order.

    Everything is validated before any file is created: ``save`` refuses whatever the
    readers (``kdtr.load``, the C++ ``kdtr.hpp``) would reject, so every file it writes
    loads back equal (docs/kdtr-format.md section 3.1). The bytes go to a temporary file
    ``.<name>.<random>.tmp`` in the same directory (git ignores ``*.tmp``), which is fsynced
    and then renamed over ``path``: an interrupted write never leaves a partial file under
    ``path``; a process killed mid-write may leave the temporary file.

    Raises:
        WriteError: (a KdtrError) whose message starts with ``path`` and names the
            argument, tensor or metadata entry: ``tensors``/``metadata`` not a mapping or
            iterable of pairs; a name or key not a str, empty, over 255 bytes, not
            encodable as UTF-8 (lone surrogates), or repeated; a value that is not an
            array or cannot be converted; a dtype outside the KDTR set; more than 8
            dims; a bool array holding a byte other than 0 or 1; a metadata value of
            another type, an int outside i64, a long double not exactly a float64, a
            string over 1 MiB or not encodable as UTF-8; more than 4096 tensors or
            metadata entries; a header over 16 MiB.
        kdtr.fsutil.UnsafePath: (an OSError) ``path`` is a symbolic link, a directory,
            a FIFO or a device: kdtr replaces regular files only.
        OSError: the file cannot be written (the temporary file is removed).
    """
    p = os.fsdecode(os.fspath(path))
    head, placed, data_end = encode(tensors, metadata, p)
    atomic_write(p, _file_chunks(head, placed, data_end))


def _file_chunks(head: bytes, placed: list[tuple[int, np.ndarray]], data_end: int) -> Iterator[Any]:
    """The bytes of a file laid out by :func:`encode`, in order, as buffers: the header,
    zero padding and each tensor's data (views, not copies)."""
    yield head
    pos = len(head)
    for off, arr in placed:
        if off > pos:
            yield b"\0" * (off - pos)
        if arr.nbytes:
            yield arr  # C-contiguous: its buffer is its bytes in C order (bf16 and bool too)
        pos = off + arr.nbytes if arr.nbytes else max(pos, off)
    if data_end > pos:
        yield b"\0" * (data_end - pos)


# --- atomic file writes (goldens, the manifest, the reports) ---------------------------
#
# The writing itself lives in kdtr/fsutil.py (one rule for every file kdtr writes).

Chunks = fsutil.Chunks


def atomic_write(path: str | os.PathLike, data: Chunks) -> None:
    """Replace ``path`` with ``data`` atomically: readers see the old file or the new one,
    never a part of either (:func:`kdtr.fsutil.atomic_write`).

    The one write rule of kdtr (``kdtr.save``, ``golden/MANIFEST.json``, the reports): the
    bytes go to a temporary file ``.<name>.<random>.tmp`` in ``path``'s directory (the name
    cut to 200 bytes so the temporary name fits NAME_MAX; git ignores ``*.tmp``), created
    with ``O_CREAT | O_EXCL | O_NOFOLLOW`` and mode ``0o666 & ~umask`` (as ``open()``
    would), fsynced, renamed over ``path``, then the directory is fsynced, all relative to
    one descriptor of the directory. An interruption never leaves a partial file under
    ``path``; an exception removes the temporary file (a process killed mid-write may
    leave it). ``path`` itself is never followed: a symbolic link, directory, FIFO or
    device there is refused, the link's target untouched.

    Args:
        path: destination; its directory must exist.
        data: the bytes, or an iterable of bytes-like chunks (bytes, memoryviews,
            C-contiguous uint8 arrays) written in order; a generator is consumed lazily,
            and an exception it raises removes the temporary file and propagates.

    Raises:
        kdtr.fsutil.UnsafePath: (an OSError) ``path`` is a symbolic link or not a
            regular file.
        OSError: the file cannot be written or renamed.
    """
    fsutil.atomic_write(path, data)


def atomic_write_together(items: Iterable[tuple[str | os.PathLike, Chunks]]) -> None:
    """Write several files, then rename each into place (:func:`kdtr.fsutil.write_together`).

    Each file is replaced atomically and none before all are written and fsynced; the
    set is not replaced as one unit (a process killed between two renames leaves the first
    files new, the others old): a set that readers must see whole is a
    :class:`kdtr.fsutil.ReportSet`, as the reports of ``kdtr run`` and ``kdtr mutate``
    are. An exception removes every temporary file not yet renamed.

    Raises:
        kdtr.fsutil.UnsafePath: a destination is a symbolic link or not a regular file.
        OSError: a file cannot be written or renamed.
    """
    fsutil.write_together(items)


def to_bytes(
    tensors: Mapping[str, Any] | Iterable[tuple[str, Any]],
    metadata: Mapping[str, Any] | Iterable[tuple[str, Any]] | None = None,
) -> bytes:
    """The bytes :func:`save` would write (for tests and fuzzing); the same WriteErrors,
    with path ``"<bytes>"``."""
    head, placed, data_end = encode(tensors, metadata)
    out = bytearray(data_end)
    out[: len(head)] = head
    for off, arr in placed:
        if arr.nbytes:
            # bytearray slice assignment refuses numpy arrays (they pass PyNumber_Check)
            memoryview(out)[off : off + arr.nbytes] = _raw(arr)
    return bytes(out)
