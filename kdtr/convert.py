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
from dataclasses import dataclass, field
from typing import Any, Iterable

import ml_dtypes
import numpy as np

from . import format as kformat
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
    return "0x%016x" % struct.unpack("<Q", struct.pack("<d", value))[0]


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
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


# --- tensors ------------------------------------------------------------------------------

def _kdtr_array(path: str | os.PathLike, name: str, arr: np.ndarray) -> np.ndarray:
    """``arr`` as a KDTR tensor: little-endian, C order. Raises ConvertError naming the
    tensor if its dtype has no KDTR dtype."""
    dt = arr.dtype
    if dt.byteorder == ">":
        dt = dt.newbyteorder("<")
    if code_of_dtype(dt) is None:
        hint = ""
        if dt.kind == "O":
            hint = " (an object array: KDTR holds numbers only)"
        elif dt.kind == "V" and dt.itemsize == 2 and dt.names is None:
            hint = (" (plain numpy saves bf16 as V2, losing the dtype: store arr.view(np.uint16) with a "
                    f"{NPZ_DTYPES} record, docs/convert.md)")
        raise ConvertError(path, f"tensor {name!r}", f"dtype {dt.str} has no KDTR dtype{hint}; KDTR holds "
                           "bool, u8, i8, i16, u16, i32, u32, i64, u64, f16, bf16, f32, f64")
    arr = arr.astype(dt, copy=False)
    # not np.ascontiguousarray: it turns a 0-d array into shape (1,)
    return arr if arr.flags.c_contiguous else arr.copy(order="C")


# --- readers --------------------------------------------------------------------------

def read(path: str | os.PathLike) -> Contents:
    """The tensors and metadata of a KDTR, npz or safetensors file (format by suffix).

    Raises:
        ConvertError: bad suffix, a corrupt npz or safetensors file, a tensor whose dtype
            KDTR cannot hold (object, string, complex, structured, ... arrays), a reserved
            entry that does not parse.
        kdtr.KdtrError: a KDTR source that is not a valid KDTR file (every tensor's
            checksum is verified).
        OSError: the file cannot be read.
    """
    fmt = format_of(path)
    if fmt == "kdtr":
        return _read_kdtr(path)
    if fmt == "npz":
        return _read_npz(path)
    return _read_safetensors(path)


def _read_kdtr(path: str | os.PathLike) -> Contents:
    f = kformat.load(path, verify=True)
    return Contents(list(f.tensors.items()), list(f.metadata.items()))


def _read_npz(path: str | os.PathLike) -> Contents:
    p = os.fspath(path)
    data = kformat.read_regular_bytes(p)  # refuses a FIFO or a directory like kdtr.load
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError) as exc:
        raise ConvertError(p, "file", f"not a valid npz (zip) file: {exc}") from None
    arrays: list[tuple[str, np.ndarray]] = []
    reserved: dict[str, np.ndarray] = {}
    with zf:
        for info in zf.infolist():
            member = info.filename
            if info.is_dir():
                continue
            if not member.endswith(".npy"):
                raise ConvertError(p, f"member {member!r}", "not a .npy array (an npz holds <name>.npy members)")
            name = member[:-4]
            where = f"tensor {name!r}" if name not in (NPZ_METADATA, NPZ_DTYPES) else name
            try:
                with zf.open(info) as fh:
                    arr = np.lib.format.read_array(fh, allow_pickle=False)
            except ValueError as exc:
                msg = str(exc)
                if "allow_pickle" in msg or "Object arrays" in msg:
                    raise ConvertError(p, where, "an object array (pickled Python objects): KDTR holds "
                                       "numbers only") from None
                raise ConvertError(p, where, f"not a valid .npy array: {msg}") from None
            except (zipfile.BadZipFile, EOFError, OSError, RuntimeError, NotImplementedError) as exc:
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


def _read_safetensors(path: str | os.PathLike) -> Contents:
    p = os.fspath(path)
    st = _safetensors()
    data = kformat.read_regular_bytes(p)
    st_error = getattr(st, "SafetensorError", Exception)
    try:
        flat = st.deserialize(data)
    except st_error as exc:
        raise ConvertError(p, "file", f"not a valid safetensors file: {exc}") from None
    # deserialize validated the header; it gives no metadata and no stable order, so read
    # both from the header itself.
    n = struct.unpack("<Q", data[:8])[0]
    try:
        header = json.loads(bytes(data[8:8 + n]).decode("utf-8"))
    except ValueError as exc:  # not reached with a file deserialize accepted
        raise ConvertError(p, "header", f"not JSON: {exc}") from None
    meta = header.get("__metadata__") or {}
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
            order = json.loads(meta[ST_ORDER])
        except ValueError as exc:
            raise ConvertError(p, where, f"not JSON: {exc}") from None
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
            safetensors); a dtype the target cannot hold; a metadata value that is not a
            KDTR type; safetensors' own refusal.
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
        if name in seen:
            raise ConvertError(p, f"tensor {name!r}", "a second tensor of this name")
        seen.add(name)
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
