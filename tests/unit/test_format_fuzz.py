"""Property tests of the KDTR reader and writer (hypothesis).

(a) Round trip: any dict of arrays of KDTR dtypes (up to 3 dims) plus any metadata is
    written by kdtr.save, read back bit-exactly by kdtr.load, and laid out exactly as the
    independent builder of tests/malformed.py lays it out.
(b) Robustness: arbitrary bytes, and random damage to a valid file (bit flips, byte sets,
    truncations, insertions, deletions, overwritten u64 fields; the header CRC repaired
    or not), either load or raise a KdtrError subclass, never any other exception.
"""

from __future__ import annotations

import random
import struct
import tempfile
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import kdtr
import kdtr.format as F
import malformed as M

SETTINGS = settings(
    max_examples=200,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

_DIR = tempfile.TemporaryDirectory(prefix="kdtr-fuzz-")
_WORK = Path(_DIR.name)


def _load_or_kdtr_error(data: bytes, verify: bool = True) -> None:
    path = _WORK / "fuzz.kdtr"
    path.write_bytes(data)
    try:
        f = kdtr.load(path, verify=verify)
    except kdtr.KdtrError as exc:
        assert str(path) in str(exc)
        return
    with f:  # a file that loads is fully usable: touch every byte of every view
        for arr in f.tensors.values():
            arr.tobytes()
        for key, value in f.metadata.items():
            assert isinstance(value, (int, float, str, bool)), (key, value)


# --- (a) round trip ----------------------------------------------------------------------

names = st.text(min_size=1, max_size=12)
shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)


@st.composite
def arrays(draw):
    dtype_name = draw(st.sampled_from(list(M.DTYPES)))
    shape = draw(shapes)
    dt = M.DTYPES[dtype_name][1]
    if dtype_name == "bf16":  # no hypothesis strategy for bf16: draw its bit patterns
        bits = draw(hnp.arrays(np.uint16, shape))
        return bits.view(dt)
    if draw(st.booleans()) and dt.itemsize > 1:
        dt = dt.newbyteorder(">")  # big-endian input is stored little-endian
    return draw(hnp.arrays(dt, shape))


meta_values = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.booleans(),
)


@SETTINGS
@given(tensors=st.dictionaries(names, arrays(), max_size=5), metadata=st.dictionaries(names, meta_values, max_size=5))
def test_round_trip(tensors, metadata):
    path = _WORK / "rt.kdtr"
    kdtr.save(path, tensors, metadata)
    data = path.read_bytes()
    assert data == F.to_bytes(tensors, metadata)
    little = {k: v.astype(v.dtype.newbyteorder("<")) if v.dtype.byteorder == ">" else v for k, v in tensors.items()}
    assert data == M._file_from(little, metadata).render()  # the independent layout
    with kdtr.load(path) as f:
        assert list(f.tensors) == list(tensors)
        for name, want in little.items():
            got = f.tensors[name]
            assert got.dtype == want.dtype and got.shape == want.shape
            assert got.tobytes() == np.ascontiguousarray(want).tobytes()  # bit-exact
            assert not got.flags.writeable
        assert list(f.metadata) == list(metadata)
        for key, want in metadata.items():
            got = f.metadata[key]
            assert type(got) is type(want)
            if isinstance(want, float):
                assert struct.pack("<d", got) == struct.pack("<d", want)
            else:
                assert got == want


# --- (b) robustness ----------------------------------------------------------------------

VALID = M.valid_file_bytes()
INTERESTING_U64 = [0, 1, 12, 63, 64, 255, 4096, 4097, 2**31, 2**32 - 1, 2**32, 2**63, 2**64 - 64, 2**64 - 1]


@SETTINGS
@given(data=st.binary(max_size=1024))
def test_arbitrary_bytes(data):
    _load_or_kdtr_error(data)


@SETTINGS
@given(body=st.binary(max_size=600), minor=st.integers(0, 2), extra=st.integers(-4, 4))
def test_arbitrary_header_with_valid_preamble_and_crc(body, minor, extra):
    """Random header bodies that pass the magic, version, header_len and CRC rules."""
    hl = len(body) + 4
    head = M.MAGIC + struct.pack("<HHI", 1, minor, hl) + body
    data = head + struct.pack("<I", zlib.crc32(head))
    if extra > 0:
        data += b"\0" * (extra * 16)
    elif extra < 0:
        data = data[: len(data) + extra]
    _load_or_kdtr_error(data)


HUGE = [2**31, 2**32, 2**40, 2**61, 2**62, 2**63 - 1, 2**63, 2**64 - 1]
DIMS = st.one_of(st.integers(0, 5), st.sampled_from([0, 1] + HUGE))


@st.composite
def structured_tensors(draw):
    """Tensor entries with well-formed framing but any dtype code, shape, offset and nbytes."""
    code = draw(st.one_of(st.integers(1, 13), st.integers(0, 255)))
    shape = tuple(draw(st.one_of(
        st.lists(DIMS, max_size=draw(st.sampled_from([3, 9]))),
        st.sampled_from(HUGE).flatmap(lambda h: st.permutations([0, h, 1])),  # zero-size, huge dim
    )))
    numel = 1
    for d in shape:
        numel *= d
    exact = numel * M.ITEMSIZE.get(code, 1)
    if exact <= 64 and draw(st.integers(0, 3)):
        data = bytes(draw(st.sampled_from([0, 1, 2]) if code == 1 else st.integers(0, 255)) for _ in range(exact))
    else:
        data = draw(st.binary(max_size=24))
    t = M.raw_tensor(draw(st.sampled_from(["a", "b", "c"])), code, shape, data)
    if draw(st.booleans()):
        t.nbytes = draw(st.sampled_from(INTERESTING_U64 + [len(t.data)]))
    if draw(st.booleans()):
        t.offset = draw(st.sampled_from([64, 128, 192, 256, 320, 1 << 20, 2**64 - 64] + list(range(60, 70))))
    return t


@SETTINGS
@given(tensors=st.lists(structured_tensors(), max_size=4), metadata=st.lists(st.builds(
    M.Meta, st.sampled_from([b"k", b"j", b"\xff"]), st.integers(0, 6), st.binary(max_size=12)), max_size=3),
    minor=st.integers(0, 1), extension=st.binary(max_size=3), pad=st.integers(0, 200))
def test_structured_headers(tensors, metadata, minor, extension, pad):
    """Headers that frame correctly and carry a valid CRC, with arbitrary field values."""
    f = M.File(tensors, metadata, minor=minor, extension=extension)
    f.layout()
    data_start = f.data_start()
    end = max([data_start] + [t.offset + len(t.data) for t in tensors if t.offset < 1 << 20])
    f.size = end + pad
    _load_or_kdtr_error(f.render())
    _load_or_kdtr_error(f.render(), verify=False)


@SETTINGS
@given(tensor=structured_tensors())
def test_size_rule_matches_numpy(tensor):
    """The Python reader raises SizeOverflow at a shape exactly when numpy cannot build an
    array of that shape and dtype (spec 1.3: product of the nonzero dims x itemsize <= 2**63
    - 1). numpy is asked about shape + (0,), which has the same nonzero dims but allocates
    nothing."""
    if tensor.dtype not in M.ITEMSIZE or len(tensor.shape) > M.MAX_NDIM:
        return  # UnknownDtype / TooManyDims come first
    dt = next(d for c, d in M.DTYPES.values() if c == tensor.dtype)
    try:
        np.empty(tuple(tensor.shape) + (0,), dt)
        numpy_ok = True
    except (ValueError, OverflowError):
        numpy_ok = False
    path = _WORK / "size.kdtr"
    path.write_bytes(M.File([tensor], size=1 << 12).render())  # the shape is checked before offset/nbytes
    try:
        kdtr.load(path, verify=False).close()
        at_shape = False
    except kdtr.KdtrError as exc:
        at_shape = isinstance(exc, kdtr.errors.SizeOverflow) and exc.field.startswith("tensors[0].shape")
    assert at_shape == (not numpy_ok), (tensor.shape, tensor.dtype)


mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10**6), st.integers(0, 7)),
    st.tuples(st.just("set"), st.integers(0, 10**6), st.integers(0, 255)),
    st.tuples(st.just("u64"), st.integers(0, 10**6), st.sampled_from(INTERESTING_U64)),
    st.tuples(st.just("insert"), st.integers(0, 10**6), st.binary(min_size=1, max_size=16)),
    st.tuples(st.just("delete"), st.integers(0, 10**6), st.integers(1, 16)),
    st.tuples(st.just("truncate"), st.integers(0, 10**6), st.just(0)),
)


def _apply(data: bytes, ops) -> bytes:
    b = bytearray(data)
    for kind, pos, arg in ops:
        at = pos % (len(b) + 1)
        if kind == "flip" and at < len(b):
            b[at] ^= 1 << arg
        elif kind == "set" and at < len(b):
            b[at] = arg
        elif kind == "u64" and at + 8 <= len(b):
            b[at : at + 8] = struct.pack("<Q", arg)
        elif kind == "insert":
            b[at:at] = arg
        elif kind == "delete":
            del b[at : at + arg]
        elif kind == "truncate":
            del b[at:]
    return bytes(b)


@SETTINGS
@given(ops=st.lists(mutation, min_size=1, max_size=4), fix_crc=st.booleans(), verify=st.booleans())
def test_mutated_valid_file(ops, fix_crc, verify):
    data = _apply(VALID, ops)
    if fix_crc and len(data) >= 16:
        hl = struct.unpack_from("<I", data, 12)[0]
        if 12 <= hl and 16 + hl <= len(data):
            data = M.fix_header_crc(data)  # let the damage reach the header fields
    _load_or_kdtr_error(data, verify=verify)


def _random_ops(rng: random.Random, size: int) -> list[tuple[str, int, object]]:
    ops = []
    for _ in range(rng.randint(1, 2)):
        kind = rng.choice(["flip", "set", "u64", "insert", "delete"])
        pos = rng.randrange(size + 1)
        arg = {
            "flip": rng.randrange(8),
            "set": rng.randrange(256),
            "u64": rng.choice(INTERESTING_U64),
            "insert": bytes([rng.randrange(256)]),
            "delete": rng.randint(1, 8),
        }[kind]
        ops.append((kind, pos, arg))
    return ops


SMALL_CASES = [c for c in M.CASES if len(c[1]) < 1 << 20]


@pytest.mark.parametrize("case_id, data, expected", SMALL_CASES, ids=[c[0] for c in SMALL_CASES])
def test_mutated_malformed_cases(case_id, data, expected):
    """Seeded small damage to every malformed case, with the header CRC repaired."""
    rng = random.Random(case_id)
    for _ in range(10):
        out = _apply(data, _random_ops(rng, len(data)))
        if len(out) >= 16:
            hl = struct.unpack_from("<I", out, 12)[0]
            if 12 <= hl and 16 + hl <= len(out):
                out = M.fix_header_crc(out)
        _load_or_kdtr_error(out)
