"""Builders of valid and malformed KDTR files, independent of kdtr/format/.

Every byte is laid out here with :mod:`struct` from docs/kdtr-format.md, so the format
tests do not trust the writer under test. :data:`CASES` holds one or more malformed files
per rule of the spec's error table (section 3). Each has one defect (the few with more, such
as a huge tensor_count with no entries, have the one that the spec's check order puts
first), and the header CRC-32 is recomputed after tampering (except in the header checksum
cases), so the rule under test is the one that fires.

    CASES: list[tuple[str, bytes, str]]   # (case id, file bytes, expected error class name)
    valid_file_bytes()                    # a valid multi-tensor file of a few hundred bytes
    valid_file_contents()                 # the arrays and metadata it holds
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

MAGIC = b"\x89KDTR\r\n\x1a"
PREAMBLE_LEN = 16
ALIGNMENT = 64
MAX_HEADER_LEN = 16 * 1024 * 1024
MAX_TENSORS = 4096
MAX_METADATA = 4096
MAX_NDIM = 8
MAX_NAME_LEN = 255
MAX_STRING_LEN = 1024 * 1024
U64_MAX = (1 << 64) - 1

# dtype name -> (code, numpy dtype); docs/kdtr-format.md section 2, typed in by hand.
DTYPES: dict[str, tuple[int, np.dtype]] = {
    "bool": (1, np.dtype(np.bool_)),
    "u8": (2, np.dtype("<u1")),
    "i8": (3, np.dtype("<i1")),
    "i16": (4, np.dtype("<i2")),
    "u16": (5, np.dtype("<u2")),
    "i32": (6, np.dtype("<i4")),
    "u32": (7, np.dtype("<u4")),
    "i64": (8, np.dtype("<i8")),
    "u64": (9, np.dtype("<u8")),
    "f16": (10, np.dtype("<f2")),
    "bf16": (11, np.dtype(ml_dtypes.bfloat16)),
    "f32": (12, np.dtype("<f4")),
    "f64": (13, np.dtype("<f8")),
}
ITEMSIZE = {code: dt.itemsize for code, dt in DTYPES.values()}

META_INT, META_FLOAT, META_STRING, META_BOOL = 1, 2, 3, 4


def align(n: int) -> int:
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


# --- a mutable model of a file ---------------------------------------------------------


@dataclass
class Tensor:
    """One tensor entry plus its data. ``None`` fields are filled in canonically by layout."""

    name: bytes
    dtype: int
    shape: tuple[int, ...]
    data: bytes
    offset: int | None = None
    nbytes: int | None = None
    crc: int | None = None
    ndim: int | None = None  # written ndim; defaults to len(shape)

    def entry(self) -> bytes:
        ndim = len(self.shape) if self.ndim is None else self.ndim
        return (
            struct.pack("<H", len(self.name))
            + self.name
            + struct.pack("<BB", self.dtype, ndim)
            + b"".join(struct.pack("<Q", d) for d in self.shape)
            + struct.pack("<QQI", self.offset, self.nbytes, self.crc)
        )


@dataclass
class Meta:
    """One metadata entry; ``value`` is the encoded value bytes."""

    key: bytes
    type: int
    value: bytes

    def entry(self) -> bytes:
        return struct.pack("<H", len(self.key)) + self.key + struct.pack("<B", self.type) + self.value


def meta_int(key: str | bytes, v: int) -> Meta:
    return Meta(_b(key), META_INT, struct.pack("<q", v))


def meta_float(key: str | bytes, v: float) -> Meta:
    return Meta(_b(key), META_FLOAT, struct.pack("<d", v))


def meta_str(key: str | bytes, v: str | bytes) -> Meta:
    raw = _b(v)
    return Meta(_b(key), META_STRING, struct.pack("<I", len(raw)) + raw)


def meta_bool(key: str | bytes, v: bool | int) -> Meta:
    return Meta(_b(key), META_BOOL, struct.pack("<B", int(v)))


def _b(s: str | bytes) -> bytes:
    return s.encode("utf-8") if isinstance(s, str) else s


def tensor(name: str | bytes, arr: np.ndarray) -> Tensor:
    """A tensor entry for a numpy array of a KDTR dtype (data little-endian, C order)."""
    arr = np.asarray(arr)
    le = arr.dtype.newbyteorder("<") if arr.dtype.byteorder == ">" else arr.dtype
    for code, dt in DTYPES.values():
        if le == dt:
            return Tensor(_b(name), code, tuple(arr.shape), arr.astype(dt).tobytes(order="C"))
    raise TypeError(f"not a KDTR dtype: {arr.dtype}")


def raw_tensor(name: str | bytes, dtype: int, shape: tuple[int, ...], data: bytes = b"") -> Tensor:
    return Tensor(_b(name), dtype, tuple(shape), data)


@dataclass
class File:
    """A KDTR file as fields. :meth:`render` lays it out canonically unless overridden."""

    tensors: list[Tensor] = field(default_factory=list)
    metadata: list[Meta] = field(default_factory=list)
    magic: bytes = MAGIC
    major: int = 1
    minor: int = 0
    extension: bytes = b""
    tensor_count: int | None = None
    metadata_count: int | None = None
    header_len: int | None = None  # the value written in the preamble
    header_crc: int | None = None  # None: the correct CRC-32
    size: int | None = None  # None: the canonical size (end of the last tensor)

    def layout(self) -> File:
        """Fill every ``None`` offset/nbytes/crc canonically (returns self)."""
        entries_len = sum(2 + len(t.name) + 2 + 8 * len(t.shape) + 20 for t in self.tensors)
        meta_len = sum(len(m.entry()) for m in self.metadata)
        real_header_len = 8 + entries_len + meta_len + len(self.extension) + 4
        cursor = PREAMBLE_LEN + real_header_len
        for t in self.tensors:
            if t.nbytes is None:
                t.nbytes = len(t.data)
            if t.crc is None:
                t.crc = zlib.crc32(t.data)
            if t.offset is None:
                t.offset = align(cursor)
            if t.offset + t.nbytes < 1 << 40:  # far-away tensors do not move the next one
                cursor = t.offset + t.nbytes
        self._real_header_len = real_header_len
        return self

    def header(self) -> bytes:
        """Preamble + header bytes (header CRC correct unless ``header_crc`` is set)."""
        self.layout()
        hl = self._real_header_len if self.header_len is None else self.header_len
        tc = len(self.tensors) if self.tensor_count is None else self.tensor_count
        mc = len(self.metadata) if self.metadata_count is None else self.metadata_count
        body = (
            self.magic
            + struct.pack("<HHI", self.major, self.minor, hl)
            + struct.pack("<II", tc, mc)
            + b"".join(t.entry() for t in self.tensors)
            + b"".join(m.entry() for m in self.metadata)
            + self.extension
        )
        crc = zlib.crc32(body) if self.header_crc is None else self.header_crc
        return body + struct.pack("<I", crc)

    def render(self) -> bytes:
        head = self.header()
        data_start = PREAMBLE_LEN + self._real_header_len
        end = data_start
        for t in self.tensors:
            if t.offset >= data_start:
                end = max(end, t.offset + len(t.data))
        size = end if self.size is None else self.size
        if size > 1 << 32:
            raise ValueError(f"file of {size} bytes: set File.size for far-away offsets")
        out = bytearray(max(size, len(head)))
        out[: len(head)] = head
        for t in self.tensors:
            if t.data and t.offset >= data_start and t.offset + len(t.data) <= len(out):
                out[t.offset : t.offset + len(t.data)] = t.data
        return bytes(out[:size])

    def data_start(self) -> int:
        self.layout()
        return PREAMBLE_LEN + self._real_header_len


def set_byte(data: bytes, at: int, value: int) -> bytes:
    b = bytearray(data)
    b[at] = value
    return bytes(b)


def xor_byte(data: bytes, at: int, mask: int = 0xFF) -> bytes:
    b = bytearray(data)
    b[at] ^= mask
    return bytes(b)


def fix_header_crc(data: bytes) -> bytes:
    """Recompute the header CRC-32 of ``data`` in place (uses its header_len field)."""
    hl = struct.unpack_from("<I", data, 12)[0]
    crc_at = PREAMBLE_LEN + hl - 4
    b = bytearray(data)
    b[crc_at : crc_at + 4] = struct.pack("<I", zlib.crc32(bytes(b[:crc_at])))
    return bytes(b)


# --- the valid file ---------------------------------------------------------------------


def valid_file_contents() -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Arrays and metadata of the valid file: several dtypes incl. bool, bf16, a 0-d tensor,
    an empty tensor, and one metadata entry of each of the 4 types."""
    tensors = {
        "input.mask": np.array([[True, False, True], [False, False, True]]),
        "input.logits": np.array([1.0, -2.5, 0.0, -0.0, 3.140625], dtype=ml_dtypes.bfloat16),
        "input.ids": np.array([[0, -1], [2**31 - 1, -(2**31)]], dtype=np.int32),
        "scale": np.array(0.125, dtype=np.float64),  # 0-d
        "empty": np.zeros((0, 3), dtype=np.float32),
        "expected.count": np.array([7, 2**64 - 1], dtype=np.uint64),
        "expected.bytes": np.arange(5, dtype=np.uint8),
    }
    metadata = {
        "op": "tree_accept",
        "seed": -12345678901,
        "contract.x.atol": 1e-3,
        "strict": True,
        "unicode.ключ": "değer ✓",
    }
    return tensors, metadata


def _file_from(tensors: dict[str, np.ndarray], metadata: dict[str, Any]) -> File:
    f = File()
    for name, arr in tensors.items():
        f.tensors.append(tensor(name, arr))
    for k, v in metadata.items():
        if isinstance(v, bool):
            f.metadata.append(meta_bool(k, v))
        elif isinstance(v, int):
            f.metadata.append(meta_int(k, v))
        elif isinstance(v, float):
            f.metadata.append(meta_float(k, v))
        else:
            f.metadata.append(meta_str(k, v))
    return f


def valid_file() -> File:
    return _file_from(*valid_file_contents())


def valid_file_bytes() -> bytes:
    """A valid multi-tensor KDTR 1.0 file, laid out canonically."""
    return valid_file().render()


# --- the malformed cases ----------------------------------------------------------------


def _require(cond: bool) -> None:
    if not cond:
        raise RuntimeError("malformed.py: a case does not have the layout it was built for")


def _one(arr_name: str = "x", n: int = 4) -> Tensor:
    return tensor(arr_name, np.arange(n, dtype=np.int32))


# Zero-size shapes near the size rule's cap (docs/kdtr-format.md section 1.3): the product
# of the nonzero dims x itemsize must be <= 2**63 - 1.  (shape, dtype code, expected: "OK"
# or the error name); both readers must agree on every row.
ZERO_SIZE_SHAPES: list[tuple[tuple[int, ...], int, str]] = [
    ((1 << 62, 0), 12, "SizeOverflow"),  # f32: 2**64
    ((1 << 61, 0), 2, "OK"),  # u8
    ((1 << 61, 0), 13, "SizeOverflow"),  # f64: 2**64
    ((1 << 60, 0), 13, "SizeOverflow"),  # f64: 2**63, one past the cap
    (((1 << 60) - 1, 0), 13, "OK"),  # f64: 2**63 - 8
    ((0, 1 << 63), 2, "SizeOverflow"),
    ((0, (1 << 63) - 1), 2, "OK"),  # u8: exactly the cap
    ((0, (1 << 63) - 1), 3, "OK"),
    ((0, (1 << 63) - 1), 4, "SizeOverflow"),  # i16: 2**64 - 2
    ((0, (1 << 64) - 1), 13, "SizeOverflow"),
    ((0, 1 << 30, 1 << 20), 13, "OK"),  # f64: 2**53
    ((1 << 31, 0, 1 << 31), 11, "SizeOverflow"),  # bf16: 2**63
    ((1 << 31, 0, (1 << 31) - 1), 11, "OK"),  # bf16: 2**63 - 2**32
    ((0,) * MAX_NDIM, 13, "OK"),
    ((0, 1, 0), 1, "OK"),
]


def _simple(*tensors: Tensor, metadata: list[Meta] | None = None, **kw: Any) -> File:
    return File(list(tensors), list(metadata or []), **kw)


def _cases() -> list[tuple[str, bytes, str]]:
    cases: list[tuple[str, bytes, str]] = []

    def add(case_id: str, data: bytes, expected: str) -> None:
        cases.append((case_id, data, expected))

    valid = valid_file_bytes()

    # BadMagic
    add("bad_magic/first_byte", fix_header_crc(set_byte(valid, 0, 0x88)), "BadMagic")
    add("bad_magic/last_byte", fix_header_crc(set_byte(valid, 7, 0x00)), "BadMagic")
    add("bad_magic/crlf_mangled", fix_header_crc(valid[:5] + b"\n\n" + valid[7:]), "BadMagic")
    add("bad_magic/safetensors", b"\x08\x00\x00\x00\x00\x00\x00\x00{}      " + valid[16:], "BadMagic")

    # UnsupportedVersion
    for major in (0, 2, 0xFFFF):
        add(f"unsupported_version/{major}", _simple(_one(), major=major).render(), "UnsupportedVersion")

    # Truncated
    add("truncated/empty_file", b"", "Truncated")
    add("truncated/magic_only", MAGIC, "Truncated")
    add("truncated/preamble_15_bytes", valid[:15], "Truncated")
    # the preamble's fields in file order: a field the file ends inside is Truncated, a
    # complete one is still checked
    add("truncated/short_file_inside_magic", b"PK\x03\x04", "Truncated")
    add("bad_magic/short_file_12_bytes", b"GIF89a\x01\x00\x01\x00\x00\x00", "BadMagic")
    add("unsupported_version/short_file_10_bytes", MAGIC + struct.pack("<H", 2), "UnsupportedVersion")
    for hl in (0, 4, 8, 11):
        f = _simple(header_len=hl)
        add(f"truncated/header_len_{hl}", f.render(), "Truncated")
    # tensor_count says 2, only one entry follows
    add("truncated/missing_tensor_entry", _simple(_one(), tensor_count=2).render(), "Truncated")
    add("truncated/missing_metadata_entry", _simple(_one(), metadata_count=1).render(), "Truncated")
    # a tensor entry cut inside its shape: ndim says 3, the header holds 1 dim and no more
    entry = struct.pack("<H", 1) + b"x" + struct.pack("<BB", 3, 3) + struct.pack("<Q", 2)
    hdr = MAGIC + struct.pack("<HHI", 1, 0, 8 + len(entry) + 4) + struct.pack("<II", 1, 0) + entry
    add("truncated/inside_shape", hdr + struct.pack("<I", zlib.crc32(hdr)), "Truncated")
    # a name whose name_len runs past the header's end
    hdr = MAGIC + struct.pack("<HHI", 1, 0, 8 + 2 + 3 + 4) + struct.pack("<II", 1, 0) + struct.pack("<H", 200) + b"abc"
    add("truncated/tensor_name_past_header", hdr + struct.pack("<I", zlib.crc32(hdr)), "Truncated")
    # the header ends inside an int metadata value
    hdr = MAGIC + struct.pack("<HHI", 1, 0, 8 + 2 + 1 + 1 + 5 + 4) + struct.pack("<II", 0, 1)
    hdr += struct.pack("<H", 1) + b"k" + struct.pack("<B", META_INT) + b"\0" * 5
    add("truncated/inside_metadata_int", hdr + struct.pack("<I", zlib.crc32(hdr)), "Truncated")
    # a string value shorter than its (in-cap) length field
    m = Meta(b"s", META_STRING, struct.pack("<I", 100) + b"short")
    add("truncated/metadata_string_past_header", _simple(metadata=[m]).render(), "Truncated")

    # HeaderTooLarge: header_len = cap + 1 in a file long enough to hold it (one defect)
    big = bytearray(PREAMBLE_LEN + MAX_HEADER_LEN + 1)
    big[:16] = MAGIC + struct.pack("<HHI", 1, 0, MAX_HEADER_LEN + 1)
    add("header_too_large/cap_plus_1", bytes(big), "HeaderTooLarge")

    # HeaderPastEnd
    nodata = _simple(metadata=[meta_int("a", 1)]).render()
    add("header_past_end/cut_1_byte", nodata[:-1], "HeaderPastEnd")
    add("header_past_end/preamble_only", nodata[:16], "HeaderPastEnd")
    hl = struct.unpack_from("<I", nodata, 12)[0]
    add("header_past_end/header_len_plus_64", nodata[:12] + struct.pack("<I", hl + 64) + nodata[16:], "HeaderPastEnd")

    # TooManyTensors: 4097 well-formed empty tensors (the count is the only defect)
    f = File([raw_tensor(f"t{i}", 2, (0,)) for i in range(MAX_TENSORS + 1)])
    add("too_many_tensors/4097", f.render(), "TooManyTensors")
    add("too_many_tensors/u32_max_count", _simple(tensor_count=0xFFFFFFFF).render(), "TooManyTensors")
    # TooManyMetadata
    f = File(metadata=[meta_int(f"k{i}", i) for i in range(MAX_METADATA + 1)])
    add("too_many_metadata/4097", f.render(), "TooManyMetadata")

    # TooManyDims
    add("too_many_dims/9", _simple(tensor("x", np.zeros((1,) * 9, np.int16))).render(), "TooManyDims")
    add("too_many_dims/255", _simple(raw_tensor("x", 2, (1,) * 255, b"\x07")).render(), "TooManyDims")

    # BadName (tensor names and metadata keys)
    bad_names = {"empty": b"", "256_bytes": b"n" * 256, "u16_max_len": b"n" * 0xFFFF,
                 "not_utf8": b"ab\xff", "lone_surrogate": b"\xed\xa0\x80", "truncated_utf8": b"\xc3",
                 "overlong_nul": b"\xc0\x80", "above_u10ffff": b"\xf4\x90\x80\x80"}
    for label, raw in bad_names.items():
        t = _one()
        t.name = raw
        add(f"bad_name/tensor_{label}", _simple(t).render(), "BadName")
        add(f"bad_name/metadata_{label}", _simple(metadata=[Meta(raw, META_INT, struct.pack("<q", 1))]).render(),
            "BadName")

    # DuplicateName
    add("duplicate_name/tensors", _simple(_one("a"), _one("b"), _one("a")).render(), "DuplicateName")
    add("duplicate_name/metadata", _simple(metadata=[meta_int("k", 1), meta_str("j", "x"), meta_bool("k", 0)]).render(),
        "DuplicateName")

    # UnknownDtype
    for code in (0, 14, 255):
        add(f"unknown_dtype/{code}", _simple(raw_tensor("x", code, (4,), b"\0" * 4)).render(), "UnknownDtype")

    # SizeOverflow
    add("size_overflow/shape_product", _simple(raw_tensor("x", 2, (1 << 32, 1 << 32))).render(), "SizeOverflow")
    add("size_overflow/times_itemsize", _simple(raw_tensor("x", 12, (1 << 62,))).render(), "SizeOverflow")
    # the cap is 2**63 - 1 (INT64_MAX), not 2**64 - 1
    add("size_overflow/dim_2_63", _simple(raw_tensor("x", 2, (1 << 63,))).render(), "SizeOverflow")
    add("size_overflow/times_itemsize_2_63", _simple(raw_tensor("x", 4, (1 << 62,))).render(), "SizeOverflow")
    # the rule counts the nonzero dims only, so a zero dim anywhere does not exempt a shape
    add("size_overflow/before_zero_dim", _simple(raw_tensor("x", 2, (1 << 40, 1 << 40, 0))).render(), "SizeOverflow")
    add("size_overflow/around_zero_dim", _simple(raw_tensor("x", 2, (1 << 40, 0, 1 << 40))).render(), "SizeOverflow")
    for shape, code, expected in ZERO_SIZE_SHAPES:
        if expected == "SizeOverflow":
            dims = "x".join(str(d) for d in shape)
            add(f"size_overflow/zero_size_{dims}_code{code}", _simple(raw_tensor("x", code, shape)).render(), expected)
    # nbytes = 2**64 - 1 would make offset + nbytes overflow, but the shape check fires first.
    # (With nbytes <= 2**63 - 1 and offset <= file size, offset + nbytes cannot overflow 64
    # bits in a file under 2**63 bytes; the largest nbytes is just past the end instead.)
    t = raw_tensor("x", 2, (U64_MAX,))
    t.nbytes = U64_MAX
    add("size_overflow/dim_u64_max_before_offset_plus_nbytes", _simple(t).render(), "SizeOverflow")
    t = raw_tensor("x", 2, ((1 << 63) - 1,))
    t.nbytes = (1 << 63) - 1
    add("offset_out_of_file/nbytes_at_the_size_cap", _simple(t).render(), "OffsetOutOfFile")

    # NbytesMismatch
    t = _one()
    t.data = t.data[:12]
    add("nbytes_mismatch/smaller", _simple(t).render(), "NbytesMismatch")
    t = _one()
    t.data = t.data + b"\0" * 4
    add("nbytes_mismatch/larger", _simple(t).render(), "NbytesMismatch")
    t = raw_tensor("x", 12, ())  # 0-d f32 holds 4 bytes, not 0
    add("nbytes_mismatch/zero_d_empty", _simple(t).render(), "NbytesMismatch")

    # MisalignedOffset
    for delta in (1, 8, 32):
        f = _simple(_one())
        f.tensors[0].offset = f.data_start() + (-f.data_start()) % ALIGNMENT + delta
        add(f"misaligned_offset/plus_{delta}", f.render(), "MisalignedOffset")
    f = _simple(_one("a"), raw_tensor("b", 6, (0,)))
    f.layout()
    f.tensors[1].offset = f.tensors[0].offset + 16  # inside [a.end, file end] but misaligned
    add("misaligned_offset/empty_tensor", f.render(), "MisalignedOffset")

    # OffsetOutOfFile
    f = _simple(tensor("a_long_name_" + "x" * 100, np.arange(4, dtype=np.int32)))
    f.tensors[0].offset = 64  # aligned, but inside the header (data starts after 128)
    _require(f.data_start() > 128)
    add("offset_out_of_file/inside_header", f.render(), "OffsetOutOfFile")
    f = _simple(_one())
    f.tensors[0].offset = 0
    add("offset_out_of_file/at_zero", f.render(), "OffsetOutOfFile")
    f = _simple(_one(n=16))
    data = f.render()
    add("offset_out_of_file/data_cut", data[:-1], "OffsetOutOfFile")
    add("offset_out_of_file/data_cut_to_start", data[: f.tensors[0].offset], "OffsetOutOfFile")
    f = _simple(_one(), raw_tensor("e", 6, (0,)))
    f.layout()
    f.tensors[1].offset = align(f.tensors[0].offset + 16) + 64  # empty tensor beyond the end
    f.size = f.tensors[0].offset + 16
    add("offset_out_of_file/empty_tensor_past_end", f.render(), "OffsetOutOfFile")
    f = _simple(_one())
    f.tensors[0].offset = U64_MAX - 127  # aligned, no overflow, far past the end
    f.size = f.data_start()
    add("offset_out_of_file/huge_offset", f.render(), "OffsetOutOfFile")

    # OverlappingTensors
    a = tensor("a", np.arange(128, dtype=np.uint8))
    b = tensor("b", np.arange(64, 128, dtype=np.uint8))
    f = _simple(a, b)
    f.layout()
    b.offset = a.offset + 64  # b's bytes are a's second half: same bytes, overlapping ranges
    add("overlapping_tensors/contained", f.render(), "OverlappingTensors")
    a = tensor("a", np.arange(16, dtype=np.uint8))
    b = tensor("b", np.arange(16, dtype=np.uint8))
    f = _simple(a, b)
    f.layout()
    b.offset = a.offset
    add("overlapping_tensors/same_range", f.render(), "OverlappingTensors")
    a = tensor("a", np.zeros(100, dtype=np.uint8))
    b = tensor("b", np.zeros(100, dtype=np.uint8))
    f = _simple(a, b)
    f.layout()
    b.offset = a.offset + 64  # partial overlap, b ends after a
    add("overlapping_tensors/partial", f.render(), "OverlappingTensors")
    # the later entry has the lower offset
    a = tensor("a", np.zeros(100, dtype=np.uint8))
    b = tensor("b", np.zeros(100, dtype=np.uint8))
    f = _simple(a, b)
    f.layout()
    a.offset, b.offset = b.offset, a.offset
    b.offset = a.offset - 64
    add("overlapping_tensors/reverse_order", f.render(), "OverlappingTensors")

    # NonZeroPadding
    f = _simple(_one())
    data = f.render()
    _require(f.data_start() % ALIGNMENT != 0)
    add("non_zero_padding/after_header", set_byte(data, f.data_start(), 1), "NonZeroPadding")
    add("non_zero_padding/before_first_tensor", set_byte(data, f.tensors[0].offset - 1, 0x80), "NonZeroPadding")
    f = _simple(_one("a"), _one("b"))
    data = f.render()
    add("non_zero_padding/between_tensors", set_byte(data, f.tensors[0].offset + 16, 1), "NonZeroPadding")
    add("non_zero_padding/before_second", set_byte(data, f.tensors[1].offset - 1, 0xFF), "NonZeroPadding")
    f = _simple(_one("a"), raw_tensor("e", 6, (0, 4)))
    data = f.render()
    _require(len(data) == f.tensors[1].offset)  # the writer pads up to the trailing empty tensor
    add("non_zero_padding/before_trailing_empty_tensor", set_byte(data, len(data) - 1, 1), "NonZeroPadding")

    # TrailingBytes
    add("trailing_bytes/one_zero", valid + b"\0", "TrailingBytes")
    add("trailing_bytes/junk", valid + b"junk", "TrailingBytes")
    add("trailing_bytes/64_zeros", valid + b"\0" * 64, "TrailingBytes")
    add("trailing_bytes/no_tensors", nodata + b"\0", "TrailingBytes")

    # BadMetadata
    for kind in (0, 5, 255):
        add(f"bad_metadata/unknown_type_{kind}", _simple(metadata=[Meta(b"k", kind, b"\0" * 8)]).render(),
            "BadMetadata")
    for byte in (2, 0xFF):
        add(f"bad_metadata/bool_{byte}", _simple(metadata=[meta_bool("flag", byte)]).render(), "BadMetadata")
    m = Meta(b"s", META_STRING, struct.pack("<I", MAX_STRING_LEN + 1) + b"abc")
    add("bad_metadata/string_over_cap", _simple(metadata=[m]).render(), "BadMetadata")
    m = Meta(b"s", META_STRING, struct.pack("<I", 0xFFFFFFFF))
    add("bad_metadata/string_len_u32_max", _simple(metadata=[m]).render(), "BadMetadata")
    add("bad_metadata/string_not_utf8", _simple(metadata=[meta_str("s", b"caf\xe9")]).render(), "BadMetadata")
    add("bad_metadata/string_surrogate", _simple(metadata=[meta_str("s", b"\xed\xb2\x80")]).render(), "BadMetadata")

    # ExtensionInV10
    add("extension_in_v10/3_bytes", _simple(_one(), extension=b"ext").render(), "ExtensionInV10")
    add("extension_in_v10/1_zero_byte", _simple(metadata=[meta_int("a", 1)], extension=b"\0").render(),
        "ExtensionInV10")

    # HeaderChecksumMismatch (the only cases without a recomputed CRC)
    crc_at = valid_file().data_start() - 4
    add("header_checksum/crc_plus_1", xor_byte(valid, crc_at, 0x01), "HeaderChecksumMismatch")
    add("header_checksum/minor_version", xor_byte(valid, 10, 0x01), "HeaderChecksumMismatch")
    add("header_checksum/tensor_count", xor_byte(valid, 16, 0x01), "HeaderChecksumMismatch")
    add("header_checksum/name_byte", xor_byte(valid, 26, 0x20), "HeaderChecksumMismatch")

    # TensorChecksumMismatch
    f = valid_file()
    f.layout()
    f.tensors[2].crc ^= 1
    add("tensor_checksum/crc_field", f.render(), "TensorChecksumMismatch")
    f = valid_file()
    data = f.render()
    add("tensor_checksum/data_byte", xor_byte(data, f.tensors[1].offset + 1, 0x04), "TensorChecksumMismatch")
    add("tensor_checksum/bool_data", xor_byte(data, f.tensors[0].offset, 0x02), "TensorChecksumMismatch")

    # BadBoolValue (CRC-32 matches the bad bytes)
    for byte in (2, 0xFF):
        t = raw_tensor("m", 1, (2, 2), bytes([0, 1, byte, 1]))
        add(f"bad_bool_value/{byte}", _simple(_one(), t).render(), "BadBoolValue")

    ids = [c[0] for c in cases]
    dup = {i for i in ids if ids.count(i) > 1}
    if dup:
        raise RuntimeError(f"duplicate case ids {dup}")
    return cases


CASES: list[tuple[str, bytes, str]] = _cases()

# Cases whose defect is only seen when tensor data is verified (kdtr.load(verify=True)).
VERIFY_ONLY = {"TensorChecksumMismatch", "BadBoolValue"}


def expected_codes() -> set[str]:
    """Every error name the spec's table lists (one or more cases each)."""
    return {c[2] for c in CASES}


__all__ = [
    "CASES",
    "VERIFY_ONLY",
    "ZERO_SIZE_SHAPES",
    "File",
    "Meta",
    "Tensor",
    "valid_file",
    "valid_file_bytes",
    "valid_file_contents",
]
