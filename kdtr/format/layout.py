"""The KDTR 1.x layout (docs/kdtr-format.md section 1): constants and caps, the construct
declaration of the header (:data:`HeaderBodyLayout`, the layout of record), the same
layout as precompiled struct formats, the dtype tables, the CRC-32 in use and the size
rule shared by the reader and the writer.

Nothing here reads or writes a file: :mod:`kdtr.format.read` and :mod:`kdtr.format.write`
do, both through the names below.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

import numpy as np
from construct import (
    Array,
    Bytes,
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

from .. import errors as E
from ..dtypes import DTYPE_BY_CODE

# --- CRC-32 ----------------------------------------------------------------------------
# One checksum everywhere: zlib's CRC-32 (docs/kdtr-format.md section 3). ISA-L computes
# the same function several times faster (python-isal's ``isal_zlib.crc32`` is a drop-in
# for ``zlib.crc32``: same values, same optional start value, any buffer length); zlib is
# the fallback where isal cannot be imported. Every CRC of this package goes through
# ``kdtr.format.layout._crc32`` (the reader and the writer look it up on this module at
# call time, so a test can swap it here).
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
# below, as read._parse_body_fast and write.encode use them, implement exactly it, and
# tests/unit/test_format_fast.py checks that they agree with it byte for byte.
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
