"""Errors raised by the KDTR reader and writer.

One class per defect (docs/kdtr-format.md section 3). Every error carries the file path,
the field that was being read (``tensors[2].offset``, ``metadata["op"]``) and the byte
offset where that field starts, and formats them into one sentence::

    golden/tree_accept/default.kdtr: tensors[1].offset at offset 137: 70 is not a multiple of 64

The class names are the same as the C++ reader's ``kdtr::ErrorCode`` enumerators, so a
test can check that both readers reject a malformed file for the same reason.
"""

from __future__ import annotations

import errno as _errno
import os


class KdtrError(ValueError):
    """Base of every KDTR format error.

    Attributes:
        path: the file (str) or ``"<bytes>"``.
        field: the header field being read when the defect was found.
        offset: absolute byte offset of that field in the file (int), or -1 if unknown.
        detail: what is wrong, in words.
    """

    def __init__(self, path: str | os.PathLike, field: str, offset: int, detail: str):
        self.path = os.fspath(path)
        self.field = field
        self.offset = offset
        self.detail = detail
        where = f" at offset {offset}" if offset >= 0 else ""
        super().__init__(f"{self.path}: {field}{where}: {detail}")

    @property
    def code(self) -> str:
        """The error's name, equal to the C++ ``kdtr::ErrorCode`` enumerator."""
        return type(self).__name__


class BadMagic(KdtrError):
    """The first 8 bytes are not the KDTR magic."""


class UnsupportedVersion(KdtrError):
    """The major version is not 1."""


class Truncated(KdtrError):
    """The file or a header field ends early."""


class HeaderTooLarge(KdtrError):
    """header_len is above MAX_HEADER_LEN."""


class HeaderPastEnd(KdtrError):
    """The header runs past the end of the file."""


class TooManyTensors(KdtrError):
    """tensor_count is above MAX_TENSORS."""


class TooManyMetadata(KdtrError):
    """metadata_count is above MAX_METADATA."""


class TooManyDims(KdtrError):
    """A tensor has more than MAX_NDIM dimensions."""


class BadName(KdtrError):
    """A tensor name or metadata key is empty, too long, or not UTF-8."""


class DuplicateName(KdtrError):
    """Two tensors or two metadata keys share a name."""


class UnknownDtype(KdtrError):
    """A dtype code outside the closed set."""


class SizeOverflow(KdtrError):
    """product(nonzero dims) x itemsize exceeds 2**63 - 1, or offset + nbytes overflows 64 bits."""


class NbytesMismatch(KdtrError):
    """nbytes differs from product(shape) x itemsize."""


class MisalignedOffset(KdtrError):
    """A tensor offset is not a multiple of 64."""


class OffsetOutOfFile(KdtrError):
    """A tensor range starts inside the header or ends past the end of the file."""


class OverlappingTensors(KdtrError):
    """Two tensor ranges overlap."""


class NonZeroPadding(KdtrError):
    """A padding byte in the data region is not zero."""


class TrailingBytes(KdtrError):
    """Bytes follow the last tensor."""


class BadMetadata(KdtrError):
    """A metadata entry has an unknown type or an invalid value."""


class ExtensionInV10(KdtrError):
    """A version 1.0 header has extension bytes."""


class HeaderChecksumMismatch(KdtrError):
    """The header CRC-32 does not match."""


class TensorChecksumMismatch(KdtrError):
    """A tensor's data CRC-32 does not match."""


class BadBoolValue(KdtrError):
    """A bool tensor holds a byte other than 0 or 1."""


class WriteError(KdtrError):
    """The writer was given something it cannot store, or something a KDTR reader would
    reject (bad name, duplicate name, dtype, bool byte, metadata value, caps).

    ``path`` is the destination given to :func:`kdtr.save` (``"<bytes>"`` for
    :func:`kdtr.format.to_bytes`), ``field`` the argument, tensor or metadata entry
    (``tensors[1].name``, ``tensor 'mask'``, ``metadata["op"]``), ``offset`` is -1.
    """


class Io(OSError):
    """The path cannot be read as a KDTR file: it is not a regular file (a directory, a
    FIFO, a device, a socket), or it shrank while :func:`kdtr.load` read it with
    ``mmap=False``.

    An :class:`OSError`, not a :class:`KdtrError`: no byte of a file is wrong. Its name is
    the C++ ``kdtr::ErrorCode::Io``. Failures of the operating system itself (no such
    file, permission denied) stay the ordinary ``OSError`` subclasses.

    Attributes:
        path: the file (str). ``filename`` (OSError's) is the same.
        field: always ``"file"``, as in the C++ message.
        offset: always -1.
        detail: what is wrong, in words; also ``strerror``.
        errno: EISDIR for a directory, EIO when the file shrank, else EINVAL.
    """

    def __init__(self, path: str | os.PathLike, detail: str, err: int = _errno.EINVAL):
        super().__init__(err, detail, os.fspath(path))
        self.path = os.fspath(path)
        self.field = "file"
        self.offset = -1
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.path}: {self.field}: {self.detail}"

    def __reduce__(self):  # pickles (e.g. across a process pool) with its own signature
        return (type(self), (self.path, self.detail, self.errno))

    @property
    def code(self) -> str:
        """``"Io"``, the C++ ``kdtr::ErrorCode`` enumerator."""
        return "Io"
