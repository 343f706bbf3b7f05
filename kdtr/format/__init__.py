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
precompiled struct formats (``read._parse_body_fast``), and only a header that breaks a
rule goes through the field-by-field construct reader (``read._parse_body_checked``) that
names the defect; :data:`HeaderBodyLayout` is the construct declaration both follow.

The package, by responsibility:

- :mod:`kdtr.format.layout`: constants and caps, the construct declaration of the header,
  the precompiled struct formats, the dtype tables, the CRC-32 in use, the size rule;
- :mod:`kdtr.format.read`: :func:`load`, :func:`load_bytes`, :class:`KdtrFile`, every
  validation rule of the reader;
- :mod:`kdtr.format.write`: :func:`save`, :func:`encode`, :func:`to_bytes` and the atomic
  writes (:func:`atomic_write`, :func:`atomic_write_together`).

This module re-exports their public names (``import kdtr.format as kformat``,
``from kdtr.format import load``); a test that swaps a private helper patches the
submodule that calls it (the CRC-32: ``kdtr.format.layout._crc32``).
"""

from __future__ import annotations

from ..dtypes import DTYPE_BY_CODE, code_of_dtype
from .layout import (
    ALIGNMENT,
    CRC32_IMPL,
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
    VERSION_MINOR,
    Counts,
    HeaderBodyLayout,
    HeaderCrc,
    MetadataEntryLayout,
    MetaString,
    MetaType,
    Name,
    Preamble,
    TensorEntry,
    TensorEntryLayout,
    TensorKind,
    TensorPlace,
    TensorShape,
)
from .read import KdtrFile, load, load_bytes, read_regular_bytes
from .read import _open_regular as _open_regular  # for kdtr.goldens and kdtr.userfiles
from .write import Chunks, atomic_write, atomic_write_together, encode, save, to_bytes

__all__ = [
    "ALIGNMENT",
    "CRC32_IMPL",
    "DTYPE_BY_CODE",
    "MAGIC",
    "MAX_HEADER_LEN",
    "MAX_METADATA",
    "MAX_NAME_LEN",
    "MAX_NDIM",
    "MAX_STRING_LEN",
    "MAX_TENSORS",
    "META_BOOL",
    "META_FLOAT",
    "META_INT",
    "META_STRING",
    "MIN_HEADER_LEN",
    "PREAMBLE_LEN",
    "VERSION_MAJOR",
    "VERSION_MINOR",
    "Chunks",
    "Counts",
    "HeaderBodyLayout",
    "HeaderCrc",
    "KdtrFile",
    "MetaString",
    "MetaType",
    "MetadataEntryLayout",
    "Name",
    "Preamble",
    "TensorEntry",
    "TensorEntryLayout",
    "TensorKind",
    "TensorPlace",
    "TensorShape",
    "atomic_write",
    "atomic_write_together",
    "code_of_dtype",
    "encode",
    "load",
    "load_bytes",
    "read_regular_bytes",
    "save",
    "to_bytes",
]
