"""Conversion between KDTR and the two common tensor containers, ``.npz`` and ``.safetensors``.

The format of each side comes from its file suffix (:data:`SUFFIXES`). A file is read
into an ordered list of ``(name, ndarray)`` tensors and an ordered list of ``(key,
value)`` metadata entries (int, float, str or bool, as in KDTR), then written in the
target format. docs/convert.md is the user-facing description; in short:

* ``.npz``: one ``<name>.npy`` member per tensor, in order, written by numpy's own
  ``np.lib.format.write_array`` (``np.load`` reads it back). npz has no metadata and no
  bf16, so two reserved members carry them, each a 0-d unicode array holding JSON text:
  ``__kdtr_metadata__`` (the metadata, see :func:`encode_metadata`) and
  ``__kdtr_dtypes__`` (``{"<tensor>": "bf16"}``; each bf16 tensor is stored as its
  ``uint16`` bit pattern). Both are written only when needed. Members are stored, or
  deflated with ``compress=True``; timestamps are fixed, so equal inputs give equal bytes.
* ``.safetensors``: written with ``safetensors.numpy.save`` (every KDTR dtype, bf16
  included, has a safetensors dtype). ``__metadata__`` holds only strings, so the KDTR
  metadata goes, typed, into one key ``kdtr.metadata`` (the JSON of
  :func:`encode_metadata`) and the tensor order into ``kdtr.order`` (a JSON list of
  names), since safetensors lays tensors out in its own order.
* Reading a file without the reserved entries (plain numpy or safetensors output) gives
  no metadata from npz, and every ``__metadata__`` string of safetensors as a KDTR string
  entry; the tensors come in member order (npz) or data-offset order (safetensors).

Reading is bounded (:func:`read`): nothing larger than :func:`max_convert_bytes` is read,
allocated or inflated, and every malformed input is one :class:`ConvertError` naming the
file and the field. Writing refuses a tensor name the target cannot keep exactly
(:func:`write`).

Every KDTR write goes through :func:`kdtr.save` (atomic, and its ``WriteError`` names a
bad tensor name, a bool tensor with bytes other than 0/1, a too-long key, ...); npz and
safetensors files go through :func:`kdtr.format.atomic_write` (a temporary file in the
destination's directory, fsynced, renamed).
"""

from __future__ import annotations

import io
import json
import math
import os
import struct
import zipfile
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

from . import format as kformat
from . import userfiles
from .dtypes import code_of_dtype, name_of_dtype

SUFFIXES = {".kdtr": "kdtr", ".npz": "npz", ".safetensors": "safetensors"}

NPZ_METADATA = "__kdtr_metadata__"
NPZ_DTYPES = "__kdtr_dtypes__"
ST_METADATA = "kdtr.metadata"
ST_ORDER = "kdtr.order"

_BF16 = np.dtype(ml_dtypes.bfloat16)

# safetensors dtype strings (its file format's names) -> numpy; every KDTR dtype is here.
_ST_DTYPES = {
    "BOOL": np.dtype(np.bool_), "U8": np.dtype("<u1"), "I8": np.dtype("<i1"),
    "I16": np.dtype("<i2"), "U16": np.dtype("<u2"), "I32": np.dtype("<i4"),
    "U32": np.dtype("<u4"), "I64": np.dtype("<i8"), "U64": np.dtype("<u8"),
    "F16": np.dtype("<f2"), "BF16": _BF16, "F32": np.dtype("<f4"), "F64": np.dtype("<f8"),
}


class ConvertError(ValueError):
    """A file cannot be converted: a bad suffix, an existing destination, a tensor or a
    metadata entry the target format cannot hold, or a source that is not a valid npz or
    safetensors file.

    Attributes:
        path: the file at fault (source or destination).
        field: what in it: ``suffix``, ``file``, ``tensor 'x'``, ``__kdtr_metadata__``,
            ``__metadata__["kdtr.metadata"]["key"]``, ...
        detail: what is wrong, in words.
    """

    def __init__(self, path: str | os.PathLike, field: str, detail: str):
        self.path = os.fspath(path)
        self.field = field
        self.detail = detail
        super().__init__(f"{self.path}: {field}: {detail}")


@dataclass
class Contents:
    """Tensors and metadata of a file, in order, independent of its format."""

    tensors: list[tuple[str, np.ndarray]] = field(default_factory=list)
    metadata: list[tuple[str, Any]] = field(default_factory=list)


def format_of(path: str | os.PathLike) -> str:
    """``"kdtr"``, ``"npz"`` or ``"safetensors"`` from the file's suffix (case-insensitive).

    Raises:
        ConvertError: any other suffix (field ``suffix``).
    """
    suffix = os.path.splitext(os.fspath(path))[1].lower()
    if suffix not in SUFFIXES:
        raise ConvertError(path, "suffix", f"{suffix or 'no suffix'!r} is not one of "
                           f"{', '.join(SUFFIXES)} (the suffix picks the format)")
    return SUFFIXES[suffix]


# --- metadata as JSON ---------------------------------------------------------------------

def encode_metadata(metadata: Iterable[tuple[str, Any]]) -> str:
    """The JSON object text of KDTR metadata, keys in order, standard JSON only.

    bool -> ``true``/``false``, int -> a JSON integer, str -> a JSON string, finite float
    -> a JSON number written by ``repr`` (always with ``.`` or ``e``, so it reads back as a
    float, bit for bit, ``-0.0`` included), non-finite float -> ``{"f64": "0x<16 hex
    digits>"}``, the IEEE 754 bit pattern (NaN payload and sign kept). ASCII only.

    Raises:
        TypeError: a value of another type (KDTR metadata never has one).
    """
    out: dict[str, Any] = {}
    for key, value in metadata:
        if isinstance(value, np.generic):
            value = value.item()
        if isinstance(value, (bool, int, str)):
            out[key] = value
        elif isinstance(value, float):
            out[key] = value if math.isfinite(value) else {"f64": _f64_bits(value)}
        else:
            raise TypeError(f"metadata {key!r}: {type(value).__name__} is not a KDTR metadata type")
    return json.dumps(out, ensure_ascii=True, allow_nan=False, separators=(",", ":"))


def _f64_bits(value: float) -> str:
    return f"0x{struct.unpack('<Q', struct.pack('<d', value))[0]:016x}"


class _Obj(list):
    """A JSON object as its (key, value) pairs, in order, repeats kept."""


def decode_metadata(text: str, path: str | os.PathLike, where: str) -> list[tuple[str, Any]]:
    """The metadata pairs of :func:`encode_metadata`'s JSON text (repeated keys are kept,
    so that :func:`kdtr.save` refuses them as it refuses any duplicate).

    Raises:
        ConvertError: not JSON, not an object, or a value that is not a bool, int, str,
            float or ``{"f64": "0x..."}`` (field ``where`` or ``where["key"]``).
    """
    try:
        obj = json.loads(text, object_pairs_hook=_Obj)
    except (ValueError, RecursionError) as exc:
        raise ConvertError(path, where, f"not JSON: {exc}") from None
    if not isinstance(obj, _Obj):
        raise ConvertError(path, where, f"a JSON {type(obj).__name__}, not an object")
    pairs = []
    for key, value in obj:
        if isinstance(value, (bool, int, float, str)):
            pairs.append((key, value))
            continue
        bits = None
        if isinstance(value, _Obj) and len(value) == 1 and value[0][0] == "f64" and isinstance(value[0][1], str):
            bits = value[0][1]
            try:
                n = int(bits, 16) if bits[:2].lower() == "0x" else -1
            except ValueError:
                n = -1
            if 0 <= n < 2**64:
                pairs.append((key, struct.unpack("<d", struct.pack("<Q", n))[0]))
                continue
        raise ConvertError(path, f"{where}[{json.dumps(key)}]",
                           f"{_json_text(value)} is not a bool, int, float, string or "
                           '{"f64": "0x<16 hex digits>"}')
    return pairs


def _json_text(value: Any) -> str:
    if isinstance(value, _Obj):
        value = dict(value)
    try:
        text = json.dumps(value)
    except (ValueError, TypeError, RecursionError):  # nested too deep to print
        return f"a JSON {type(value).__name__}"
    return text if len(text) <= 80 else text[:77] + "..."


# --- tensors ------------------------------------------------------------------------------

def _kdtr_array(path: str | os.PathLike, name: str, arr: np.ndarray) -> np.ndarray:
    """``arr`` as a KDTR tensor: little-endian, C order. Raises ConvertError naming the
    tensor if its dtype has no KDTR dtype."""
    dt = _check_kdtr_dtype(path, f"tensor {name!r}", arr.dtype)
    arr = arr.astype(dt, copy=False)
    # not np.ascontiguousarray: it turns a 0-d array into shape (1,)
    return arr if arr.flags.c_contiguous else arr.copy(order="C")


def _check_kdtr_dtype(path: str | os.PathLike, where: str, dt: np.dtype) -> np.dtype:
    """``dt`` little-endian, or ConvertError (field ``where``) if KDTR has no such dtype."""
    if dt.byteorder == ">":
        dt = dt.newbyteorder("<")
    if code_of_dtype(dt) is None:
        hint = ""
        if dt.kind == "O":
            hint = " (an object array: KDTR holds numbers only)"
        elif dt.kind == "V" and dt.itemsize == 2 and dt.names is None:
            hint = (" (plain numpy saves bf16 as V2, losing the dtype: store arr.view(np.uint16) with a "
                    f"{NPZ_DTYPES} record, docs/convert.md)")
        raise ConvertError(path, where, f"dtype {dt.str} has no KDTR dtype{hint}; KDTR holds "
                           "bool, u8, i8, i16, u16, i32, u32, i64, u64, f16, bf16, f32, f64")
    return dt


_I64_MAX = (1 << 63) - 1


def _checked_nbytes(path: str | os.PathLike, where: str, shape: tuple[int, ...], itemsize: int) -> int:
    """The bytes of a tensor of ``shape`` (Python integers, so nothing wraps), or
    ConvertError: the KDTR size rule (docs/kdtr-format.md), which is numpy's too -- the
    product of the nonzero dims times the item size at most 2**63 - 1."""
    if any(d < 0 for d in shape):
        raise ConvertError(path, where, f"shape {list(shape)}: a negative dim")
    n = 1
    for d in shape:
        n *= d or 1
        if n > _I64_MAX:  # already too large: stop before the product grows without bound
            break
    if n * itemsize > _I64_MAX:
        raise ConvertError(path, where, f"shape {list(shape)} x {itemsize} B: the product of the nonzero dims "
                           "times the item size exceeds 2**63 - 1 (no array can have this shape)")
    return 0 if 0 in shape else n * itemsize


# --- bounds -------------------------------------------------------------------------------

MAX_CONVERT_BYTES = 1 << 30
"""Default limit on what one conversion holds in memory (1 GiB): the source file, and the
tensors' bytes, all together, decompressed. A conversion holds the source, its tensors and
the destination's bytes in memory at once; the limit keeps a small file (a zip bomb, a
header declaring 10^12 bytes) from making that unbounded. ``KDTR_MAX_CONVERT_BYTES`` (a
decimal byte count) replaces it."""

MAX_CONVERT_BYTES_ENV = "KDTR_MAX_CONVERT_BYTES"


def max_convert_bytes(path: str | os.PathLike = "") -> int:
    """The limit in force: ``$KDTR_MAX_CONVERT_BYTES`` or :data:`MAX_CONVERT_BYTES`.

    Raises:
        ConvertError: the variable is not a decimal byte count (field: the variable).
    """
    text = os.environ.get(MAX_CONVERT_BYTES_ENV, "")
    if text == "":
        return MAX_CONVERT_BYTES
    if not (text.isascii() and text.isdigit()):
        raise ConvertError(path, f"environment {MAX_CONVERT_BYTES_ENV}",
                           f"{text!r} is not a byte count (a decimal integer, e.g. {MAX_CONVERT_BYTES})")
    return int(text)


def _limit_text(limit: int) -> str:
    return f"{limit} bytes (set {MAX_CONVERT_BYTES_ENV} to raise it)"


def _read_source(p: str, limit: int) -> bytes:
    """The bytes of the source file (a FIFO or a directory refused at once, never blocked
    on, as kdtr.load does), at most ``limit`` of them."""
    try:
        return userfiles.read_bounded(p, limit, "conversion source")
    except userfiles.UserFileError as exc:
        raise ConvertError(p, "file", f"{exc.detail} (set {MAX_CONVERT_BYTES_ENV} to raise it)") from None


def _check_total(p: str, tensors: Iterable[tuple[str, np.ndarray]], limit: int) -> None:
    total = 0
    for name, arr in tensors:
        total += arr.nbytes
        if total > limit:
            raise ConvertError(p, f"tensor {name!r}", f"the tensors hold {total} bytes so far, over the limit of "
                               f"{_limit_text(limit)}")


# --- readers --------------------------------------------------------------------------

def read(path: str | os.PathLike) -> Contents:
    """The tensors and metadata of a KDTR, npz or safetensors file (format by suffix).

    Every size is checked before it is allocated or inflated: the source file and its
    tensors' bytes (the sizes an npz declares, then what is read) at most
    :func:`max_convert_bytes` (1 GiB unless ``KDTR_MAX_CONVERT_BYTES``); every shape by the
    KDTR size rule; an npz member's data against what its ``.npy`` header declares.

    Raises:
        ConvertError: bad suffix, a corrupt npz or safetensors file (a bad CRC-32, a
            corrupt deflate stream, a header that does not parse or declares more data
            than the file holds, JSON nested too deep), a file over the limit, a tensor
            whose dtype KDTR cannot hold (object, string, complex, structured, ...
            arrays), a name the file's own readers would not keep (a zip name holding a
            NUL, a non-ASCII zip name not marked UTF-8, a name twice), a reserved entry
            that does not parse.
        kdtr.KdtrError: a KDTR source that is not a valid KDTR file (every tensor's
            checksum is verified).
        OSError: the file cannot be read, or is not a regular file
            (:class:`kdtr.errors.Io`: a FIFO is refused, never blocked on).
    """
    fmt = format_of(path)
    if fmt == "kdtr":
        return _read_kdtr(path)
    if fmt == "npz":
        return _read_npz(path)
    return _read_safetensors(path)


def _read_kdtr(path: str | os.PathLike) -> Contents:
    f = kformat.load(path, verify=True)  # mapped, not read into memory; the destination will be
    _check_total(os.fspath(path), f.tensors.items(), max_convert_bytes(path))
    return Contents(list(f.tensors.items()), list(f.metadata.items()))


def _read_npz(path: str | os.PathLike) -> Contents:
    p = os.fspath(path)
    limit = max_convert_bytes(p)
    data = _read_source(p, limit)
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
        infos = zf.infolist()
    except _ZIP_ERRORS as exc:
        raise ConvertError(p, "file", f"not a valid npz (zip) file: {exc}") from None
    members = _npz_members(p, infos, limit)
    arrays: list[tuple[str, np.ndarray]] = []
    reserved: dict[str, np.ndarray] = {}
    with zf:
        for info, name in members:
            where = f"tensor {name!r}" if name not in (NPZ_METADATA, NPZ_DTYPES) else name
            try:
                with zf.open(info) as fh:
                    arr = _read_npy(p, where, fh, info.file_size, reserved=name in (NPZ_METADATA, NPZ_DTYPES))
            except ConvertError:
                raise
            except _ZIP_ERRORS as exc:
                raise ConvertError(p, where, f"unreadable zip member: {exc}") from None
            if name in (NPZ_METADATA, NPZ_DTYPES):
                reserved[name] = arr
            else:
                arrays.append((name, arr))
    metadata = decode_metadata(_reserved_text(p, NPZ_METADATA, reserved[NPZ_METADATA]), p, NPZ_METADATA) \
        if NPZ_METADATA in reserved else []
    dtypes: list[tuple[str, Any]] = []
    if NPZ_DTYPES in reserved:
        dtypes = decode_metadata(_reserved_text(p, NPZ_DTYPES, reserved[NPZ_DTYPES]), p, NPZ_DTYPES)
    by_name = {}
    for i, (name, _) in enumerate(arrays):
        by_name.setdefault(name, i)
    for name, dtype_name in dtypes:
        where = f"{NPZ_DTYPES}[{json.dumps(name)}]"
        if dtype_name != "bf16":
            raise ConvertError(p, where, f"{_json_text(dtype_name)}: only \"bf16\" is recorded here")
        if name not in by_name:
            raise ConvertError(p, where, f"no tensor {name!r} in the file")
        i = by_name[name]
        arr = arrays[i][1]
        if arr.dtype.str not in ("<u2", ">u2"):
            raise ConvertError(p, f"tensor {name!r}", f"recorded as bf16 but stored as {arr.dtype.str}, "
                               "not as its uint16 bits")
        arr = arr.astype("<u2", copy=False)
        arrays[i] = (name, (arr if arr.flags.c_contiguous else arr.copy(order="C")).view(_BF16))
    return Contents([(name, _kdtr_array(p, name, arr)) for name, arr in arrays], metadata)


# Errors of zipfile and its decompressors on a corrupt archive or member (a bad CRC, a
# corrupt deflate stream, a truncated file, inconsistent headers), each turned into one
# ConvertError line.
_ZIP_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError, OSError, ValueError,
               struct.error, NotImplementedError, RuntimeError, IndexError, KeyError, OverflowError)

# The compression methods numpy writes (np.savez: stored; np.savez_compressed: deflated).
# The others (bzip2, lzma) are refused: zipfile inflates their chunks without a bound.
_ZIP_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflated"}


def _npz_members(p: str, infos: list[zipfile.ZipInfo], limit: int) -> list[tuple[zipfile.ZipInfo, str]]:
    """The (member, tensor name) pairs of an npz, checked before any member is inflated:
    names kept exactly (no NUL cut, no unmarked non-ASCII, no repeats), stored or deflated
    members only, not encrypted, at most MAX_TENSORS tensors, and the sizes the zip declares
    within ``limit`` in all."""
    out: list[tuple[zipfile.ZipInfo, str]] = []
    seen: set[str] = set()
    declared = 0
    for info in infos:
        member = info.filename
        if info.orig_filename != member:
            raise ConvertError(p, f"member {info.orig_filename!r}", "its name holds a NUL byte, where zip readers cut "
                               f"it ({member!r}): the name cannot be kept")
        if info.is_dir():
            continue
        if not info.flag_bits & 0x800 and not member.isascii():
            raise ConvertError(p, f"member {member!r}", "a non-ASCII name not marked UTF-8 (zip flag bit 11): its "
                               "encoding is unknown, so the name cannot be kept")
        if not member.endswith(".npy"):
            raise ConvertError(p, f"member {member!r}", "not a .npy array (an npz holds <name>.npy members)")
        if member in seen:
            raise ConvertError(p, f"member {member!r}", "a second member of this name (np.load would keep only "
                               "the last)")
        seen.add(member)
        if info.flag_bits & 0x1:
            raise ConvertError(p, f"member {member!r}", "encrypted: kdtr convert reads no encrypted members")
        if info.compress_type not in _ZIP_METHODS:
            raise ConvertError(p, f"member {member!r}", f"compression method {info.compress_type}: kdtr convert "
                               "reads stored and deflated members (what np.savez and np.savez_compressed write)")
        declared += info.file_size
        if declared > limit:
            raise ConvertError(p, f"member {member!r}", f"the members declare {declared} bytes decompressed so far, "
                               f"over the limit of {_limit_text(limit)}; nothing was inflated")
        out.append((info, member[:-4]))
    if len(out) > kformat.MAX_TENSORS + 2:
        raise ConvertError(p, "file", f"{len(out)} members: more than the {kformat.MAX_TENSORS} tensors KDTR holds")
    return out


_NPY_MAGIC = b"\x93NUMPY"
_NPY_MAX_HEADER = 10_000  # numpy's own bound (np.load's max_header_size) on the header it parses


def _read_exact(fh: Any, n: int, p: str, where: str, what: str) -> bytes:
    data = fh.read(n)
    if len(data) != n:
        raise ConvertError(p, where, f"not a valid .npy array: the member ends inside {what}")
    return data


def _read_npy(p: str, where: str, fh: Any, member_size: int, reserved: bool) -> np.ndarray:
    """One ``.npy`` array from the zip member stream ``fh`` of ``member_size`` declared
    bytes: the header parsed with numpy's parser (at most 10,000 bytes, as np.load), the
    dtype and shape checked before any data is read, the data read in bounded chunks into
    an array of exactly the size the header declares, the member then read to its end so
    that its CRC-32 is checked."""
    magic = _read_exact(fh, 8, p, where, "the magic")
    if magic[:6] != _NPY_MAGIC:
        raise ConvertError(p, where, f"not a valid .npy array: magic {magic[:6]!r} is not {_NPY_MAGIC!r}")
    version = (magic[6], magic[7])
    if version not in ((1, 0), (2, 0), (3, 0)):
        raise ConvertError(p, where, f"not a valid .npy array: format version {version[0]}.{version[1]} is not "
                           "1.0, 2.0 or 3.0")
    len_bytes = _read_exact(fh, 2 if version == (1, 0) else 4, p, where, "the header length")
    hlen = int.from_bytes(len_bytes, "little")
    if hlen > _NPY_MAX_HEADER:
        raise ConvertError(p, where, f"the .npy header is {hlen} bytes, over the {_NPY_MAX_HEADER} bytes numpy "
                           "parses from an untrusted file (np.load refuses it too)")
    header = _read_exact(fh, hlen, p, where, "the header")
    if version == (3, 0):  # 2.0 with a UTF-8 header: only non-ASCII dtype field names need it
        if not header.isascii():
            raise ConvertError(p, where, "a .npy 3.0 header with non-ASCII text (a structured dtype): KDTR holds "
                               "numbers only")
        len_bytes, version = hlen.to_bytes(4, "little"), (2, 0)
    reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    try:
        shape, fortran, dtype = reader(io.BytesIO(len_bytes + header), max_header_size=_NPY_MAX_HEADER)
    except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError, OverflowError) as exc:
        raise ConvertError(p, where, f"not a valid .npy array: {exc}") from None
    if dtype.hasobject:
        raise ConvertError(p, where, "an object array (pickled Python objects): KDTR holds numbers only")
    if not reserved:
        _check_kdtr_dtype(p, where, dtype)
    if dtype.itemsize == 0:
        raise ConvertError(p, where, f"dtype {dtype.str} has items of 0 bytes")
    nbytes = _checked_nbytes(p, where, shape, dtype.itemsize)
    held = member_size - (8 + len(len_bytes) + hlen)
    if nbytes > held:
        raise ConvertError(p, where, f"the .npy header declares shape {list(shape)} x {dtype.itemsize} B = "
                           f"{nbytes} bytes, but the member holds {max(held, 0)} bytes of data")
    buf = bytearray(nbytes)
    view = memoryview(buf)
    pos = 0
    while pos < nbytes:
        chunk = fh.read(min(nbytes - pos, 1 << 20))
        if not chunk:
            raise ConvertError(p, where, f"the member ends after {pos} of the {nbytes} data bytes its header declares")
        view[pos:pos + len(chunk)] = chunk
        pos += len(chunk)
    view.release()
    while fh.read(1 << 20):  # to the end of the member (bounded by its declared size): the CRC-32 check
        pass
    order = "F" if fortran else "C"
    if nbytes == 0:
        return np.empty(shape, dtype=dtype, order=order)
    return np.frombuffer(buf, dtype=dtype).reshape(shape, order=order)


def _reserved_text(path: str, name: str, arr: np.ndarray) -> str:
    """The JSON text of a reserved npz member: a 0-d unicode array, or the UTF-8 bytes as
    a 1-d u8 array."""
    if arr.dtype.kind == "U" and arr.ndim == 0:
        return str(arr[()])
    if arr.dtype == np.uint8 and arr.ndim == 1:
        try:
            return arr.tobytes().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConvertError(path, name, f"not UTF-8: {exc}") from None
    raise ConvertError(path, name, f"a {arr.ndim}-d {arr.dtype.str} array; expected JSON text as a 0-d "
                       "unicode array (or its UTF-8 bytes as a 1-d uint8 array)")


def _safetensors():
    try:
        import safetensors
        import safetensors.numpy  # noqa: F401
    except ImportError:
        raise ImportError("converting .safetensors files needs the safetensors package: "
                          "pip install -e '.[convert]' (or pip install safetensors)") from None
    return safetensors


_ST_MAX_HEADER = 100_000_000  # safetensors' own bound on the JSON header


def _st_header(p: str, data: bytes) -> dict[str, Any]:
    """The JSON header of a safetensors file, checked before safetensors' reader sees it:
    a JSON object (parsed with deep nesting refused) naming no tensor twice, at most
    :data:`kdtr.format.MAX_TENSORS` tensors, each an object with a shape of dims >= 0 that
    the KDTR size rule admits and two data offsets, and ``__metadata__`` strings to strings."""
    if len(data) < 8:
        raise ConvertError(p, "file", f"not a valid safetensors file: {len(data)} bytes, shorter than the "
                           "8-byte header length")
    n = struct.unpack("<Q", data[:8])[0]
    if n > min(_ST_MAX_HEADER, len(data) - 8):
        raise ConvertError(p, "header", f"not a valid safetensors file: a {n}-byte header in a {len(data)}-byte file")

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                raise ConvertError(p, "header", f"{json.dumps(key)} appears twice: the name cannot be kept")
            out[key] = value
        return out

    try:
        header = userfiles.parse_json(bytes(data[8:8 + n]), p, "header", object_pairs_hook=pairs)
    except userfiles.UserFileError as exc:
        raise ConvertError(p, "header", f"not a valid safetensors file: {exc.detail.removeprefix('header: ')}") \
            from None
    if not isinstance(header, dict):
        raise ConvertError(p, "header", f"a JSON {type(header).__name__}, not an object")
    meta = header.get("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise ConvertError(p, "__metadata__", "not an object of strings")
    tensors = [k for k in header if k != "__metadata__"]
    if len(tensors) > kformat.MAX_TENSORS:
        raise ConvertError(p, "header", f"{len(tensors)} tensors: more than the {kformat.MAX_TENSORS} KDTR holds")
    for name in tensors:
        where = f"tensor {name!r}"
        entry = header[name]
        if not isinstance(entry, dict):
            raise ConvertError(p, where, "not a JSON object")
        shape, offsets = entry.get("shape"), entry.get("data_offsets")
        if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
            raise ConvertError(p, where, f"shape {_json_text(shape)} is not a list of dims (integers >= 0)")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int and o >= 0 for o in offsets)):
            raise ConvertError(p, where, f"data_offsets {_json_text(offsets)} is not two byte offsets")
        dt = _ST_DTYPES.get(entry.get("dtype"))
        if dt is not None:
            _checked_nbytes(p, where, tuple(shape), dt.itemsize)
    return header


def _read_safetensors(path: str | os.PathLike) -> Contents:
    p = os.fspath(path)
    st = _safetensors()
    data = _read_source(p, max_convert_bytes(p))
    header = _st_header(p, data)  # before safetensors' reader: no shape or name it would choke on
    st_error = getattr(st, "SafetensorError", Exception)
    try:
        flat = st.deserialize(data)
    except st_error as exc:
        raise ConvertError(p, "file", f"not a valid safetensors file: {exc}") from None
    meta = header.get("__metadata__", {})
    tensors: dict[str, np.ndarray] = {}
    for name, view in flat:
        dt = _ST_DTYPES.get(view["dtype"])
        if dt is None:
            raise ConvertError(p, f"tensor {name!r}", f"dtype {view['dtype']} has no KDTR dtype; KDTR holds "
                               + ", ".join(_ST_DTYPES))
        tensors[name] = np.frombuffer(view["data"], dtype=dt).reshape(view["shape"])
    if ST_ORDER in meta:
        where = f'__metadata__["{ST_ORDER}"]'
        try:
            order = userfiles.parse_json(meta[ST_ORDER], p, where)
        except userfiles.UserFileError as exc:
            raise ConvertError(p, where, exc.detail.removeprefix(f"{where}: ")) from None
        if not (isinstance(order, list) and all(isinstance(x, str) for x in order)
                and len(order) == len(tensors) and set(order) == set(tensors)):
            raise ConvertError(p, where, "not a JSON list of the file's tensor names, each once")
    else:
        order = sorted(tensors, key=lambda k: (*header[k]["data_offsets"], k))
    metadata: list[tuple[str, Any]] = []
    if ST_METADATA in meta:
        metadata = decode_metadata(meta[ST_METADATA], p, f'__metadata__["{ST_METADATA}"]')
    metadata += [(k, v) for k, v in meta.items() if k not in (ST_METADATA, ST_ORDER)]
    return Contents([(name, tensors[name]) for name in order], metadata)


# --- writers --------------------------------------------------------------------------

def write(path: str | os.PathLike, contents: Contents, *, compress: bool = False) -> None:
    """Write ``contents`` to ``path`` atomically, in the format of its suffix.

    Args:
        compress: npz only: deflate the members (``np.savez_compressed``'s choice).

    Raises:
        ConvertError: bad suffix; a tensor named like a reserved entry
            (``__kdtr_metadata__``, ``__kdtr_dtypes__`` in npz, ``__metadata__`` in
            safetensors); a name the target cannot keep exactly (twice; not UTF-8; in npz
            one holding a NUL, which zip cuts at, longer than a zip name, or ``X.npy``
            beside a tensor ``X``, which np.load would read under that name); a dtype the
            target cannot hold; a metadata value that is not a KDTR type; safetensors' own
            refusal.
        kdtr.KdtrError: ``kdtr.save``'s ``WriteError`` for a KDTR target (bad or
            duplicate name, bool bytes other than 0/1, limits, ...).
        OSError: the file cannot be written.
    """
    fmt = format_of(path)
    if fmt == "kdtr":
        kformat.save(path, contents.tensors, contents.metadata)
        return
    p = os.fspath(path)
    seen: set[str] = set()
    for name, _ in contents.tensors:
        if not isinstance(name, str):
            raise ConvertError(p, f"tensor {name!r}", f"a {type(name).__name__} name, not a string")
        if name in seen:
            raise ConvertError(p, f"tensor {name!r}", "a second tensor of this name")
        seen.add(name)
        try:
            name.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ConvertError(p, f"tensor {name!r}", f"not UTF-8 text ({exc.reason}): the name cannot be kept") \
                from None
    for key, value in contents.metadata:
        if isinstance(value, np.generic):
            value = value.item()
        if not isinstance(value, (bool, int, float, str)):
            raise ConvertError(p, f"metadata {key!r}", f"{type(value).__name__} is not a KDTR metadata type")
    if fmt == "npz":
        kformat.atomic_write(p, _npz_bytes(p, contents, compress))
    else:
        kformat.atomic_write(p, _safetensors_bytes(p, contents))


_ZIP_TIME = (1980, 1, 1, 0, 0, 0)


def _check_npz_names(path: str, names: list[str], reserved: list[str]) -> None:
    """Refuse a tensor name that an npz cannot keep exactly: zip cuts a member name at its
    first NUL (and some platforms map the path separator), a zip name has at most 65,535
    bytes, and np.load, which looks a key up as a member name before adding ``.npy``,
    would read another member under a name ``X.npy`` when ``X`` is a tensor or a reserved
    member too."""
    members = {n + ".npy" for n in [*names, *reserved]}
    for name in names:
        where = f"tensor {name!r}"
        member = name + ".npy"
        if "\0" in name:
            raise ConvertError(path, where, "holds a NUL byte: a zip member name ends at its first NUL, so npz cannot "
                               "keep this name")
        stored = zipfile.ZipInfo(member).filename
        if stored != member:
            raise ConvertError(path, where, f"zip would store the member as {stored!r}: npz cannot keep this name")
        if len(member.encode("utf-8")) > 0xFFFF:
            raise ConvertError(path, where, "longer than the 65,535 bytes of a zip member name")
        if name in members:
            raise ConvertError(path, where, f"np.load looks this name up as the member {name!r}, which holds "
                               f"{name[:-4]!r}: npz cannot keep both names")


def _npz_bytes(path: str, contents: Contents, compress: bool) -> bytes:
    members: list[tuple[str, np.ndarray]] = []
    bf16: list[tuple[str, str]] = []
    for name, arr in contents.tensors:
        if name in (NPZ_METADATA, NPZ_DTYPES):
            raise ConvertError(path, f"tensor {name!r}", "this name is reserved in npz for KDTR's metadata "
                               "and dtypes; rename the tensor")
        arr = _kdtr_array(path, name, np.asarray(arr))
        if arr.dtype == _BF16:
            arr = arr.view("<u2")
            bf16.append((name, "bf16"))
        members.append((name, arr))
    _check_npz_names(path, [n for n, _ in members],
                     ([NPZ_METADATA] if contents.metadata else []) + ([NPZ_DTYPES] if bf16 else []))
    if contents.metadata:
        members.append((NPZ_METADATA, np.array(encode_metadata(contents.metadata))))
    if bf16:
        members.append((NPZ_DTYPES, np.array(json.dumps(dict(bf16), ensure_ascii=True))))
    buf = io.BytesIO()
    method = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    with zipfile.ZipFile(buf, "w", compression=method, allowZip64=True) as zf:
        for name, arr in members:
            info = zipfile.ZipInfo(name + ".npy", date_time=_ZIP_TIME)
            info.compress_type = method
            info.external_attr = 0o644 << 16
            with zf.open(info, "w", force_zip64=True) as fh:
                np.lib.format.write_array(fh, arr, allow_pickle=False)
    return buf.getvalue()


def _safetensors_bytes(path: str, contents: Contents) -> bytes:
    st = _safetensors()
    tensors: dict[str, np.ndarray] = {}
    for name, arr in contents.tensors:
        if name == "__metadata__":
            raise ConvertError(path, f"tensor {name!r}", "this name is reserved in safetensors; rename the tensor")
        tensors[name] = _kdtr_array(path, name, np.asarray(arr))
    meta = {ST_METADATA: encode_metadata(contents.metadata),
            ST_ORDER: json.dumps(list(tensors), ensure_ascii=True)}
    try:
        return st.numpy.save(tensors, metadata=meta)
    except getattr(st, "SafetensorError", Exception) as exc:
        bad = [n for n, a in tensors.items() if name_of_dtype(a.dtype) == "bf16"]
        hint = f" (bf16 tensor {bad[0]!r}: this safetensors version may lack bf16 from numpy)" if bad else ""
        raise ConvertError(path, "tensors", f"safetensors refused the tensors: {exc}{hint}") from None


# --- the command's work ---------------------------------------------------------------

def convert(src: str | os.PathLike, dst: str | os.PathLike, *, force: bool = False,
            compress: bool = False) -> Contents:
    """Convert ``src`` to ``dst``, each format given by its suffix; return what was written.

    The two formats must differ (one of them is usually ``.kdtr``; npz <-> safetensors
    works too). ``dst`` is written atomically and is not replaced unless ``force``.

    Raises:
        ConvertError: a bad suffix (naming the file), equal formats, ``dst`` exists without
            ``force``, ``compress`` with a non-npz target, or anything :func:`read` and
            :func:`write` raise.
        kdtr.KdtrError: a corrupt KDTR source, or ``kdtr.save``'s ``WriteError``.
        OSError: a file cannot be read or written.
        ImportError: a .safetensors file without the safetensors package.
    """
    check_paths(src, dst, force=force, compress=compress)
    contents = read(src)
    write(dst, contents, compress=compress)
    return contents


def check_paths(src: str | os.PathLike, dst: str | os.PathLike, *, force: bool = False,
                compress: bool = False) -> None:
    """The checks :func:`convert` makes before reading anything.

    Raises:
        ConvertError: a suffix that names no format (field ``suffix`` of that file), equal
            formats, ``compress`` with a non-npz destination, or ``dst`` exists (a file, a
            link, anything) and not ``force`` (field ``file``).
    """
    fmt_src, fmt_dst = format_of(src), format_of(dst)
    if fmt_src == fmt_dst:
        raise ConvertError(dst, "suffix", f"the same format as {os.fspath(src)} ({fmt_src}): nothing to convert")
    if compress and fmt_dst != "npz":
        raise ConvertError(dst, "suffix", "--compress applies to an .npz destination only")
    if os.path.lexists(dst) and not force:
        raise ConvertError(dst, "file", "exists; give --force to replace it")
