"""The KDTR writer: :func:`save`, :func:`encode`, :func:`to_bytes`, and the atomic file
writes every file of kdtr goes through (:func:`atomic_write`, :func:`atomic_write_together`;
docs/kdtr-format.md section 3.1).

Writing validates everything first: the writer refuses whatever a reader would reject,
with :class:`kdtr.errors.WriteError` naming the destination, the argument and the entry.
Then it is atomic: a temporary file ``.<name>.<random>.tmp`` in the target directory,
fsync, rename (``golden/MANIFEST.json`` and the reports are written the same way; the
destination itself is never followed: a symbolic link there is refused; kdtr/fsutil.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from .. import errors as E
from .. import fsutil
from ..dtypes import DTYPE_BY_CODE, code_of_dtype
from . import layout
from .layout import (
    _COUNTS,
    _ENTRY_KIND_SHAPE,
    _F64S,
    _I64S,
    _META_FLOAT_HEAD,
    _META_INT_HEAD,
    _META_STRING_HEAD,
    _PLACE,
    _U16,
    _U32,
    ALIGNMENT,
    MAGIC,
    MAX_HEADER_LEN,
    MAX_METADATA,
    MAX_NAME_LEN,
    MAX_NDIM,
    MAX_STRING_LEN,
    MAX_TENSORS,
    META_BOOL,
    PREAMBLE_LEN,
    VERSION_MAJOR,
    VERSION_MINOR,
    Counts,
    Preamble,
    _checked_nbytes,
)

_BOOL_CODE = next(c for c, d in DTYPE_BY_CODE.items() if d.name == "bool")


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
                path, where,
                f"{type(value).__name__} cannot be converted to a numpy array ({type(exc).__name__}: {exc})",
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
        path, where,
        f"unsupported metadata type {type(value).__name__} (int, float, str, bool or a numpy scalar of one)",
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
        raise _werr(
            path, "metadata", f"{len(meta_pairs)} entries > {MAX_METADATA} (readers reject it: TooManyMetadata)"
        )

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
                    head = _U16.pack(len(raw)) + raw + kind_shape[value.ndim].pack(code, value.ndim, *value.shape)
                    entry_parts.append((head, value))
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
        raise _werr(
            path, "header", f"header of {header_len} bytes > {MAX_HEADER_LEN} (readers reject it: HeaderTooLarge)"
        )

    cursor = PREAMBLE_LEN + header_len
    data_end = cursor
    placed: list[tuple[int, np.ndarray]] = []
    body = [_COUNTS.pack(len(entry_parts), len(meta_pairs))]
    crc32 = layout._crc32
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
    head += _U32.pack(layout._crc32(head))
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
