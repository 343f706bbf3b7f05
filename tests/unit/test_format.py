"""Tests of the KDTR v1 Python reader and writer (kdtr/format/) against docs/kdtr-format.md.

The malformed files come from tests/malformed.py, which lays bytes out by hand and does not
use the writer under test.
"""

from __future__ import annotations

import ast
import errno
import math
import mmap
import os
import pickle
import re
import signal
import struct
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import kdtr
import kdtr.errors as E
import kdtr.format as F
import malformed as M
from kdtr.format import layout as FL
from kdtr.format import write as FW

CASE_IDS = [c[0] for c in M.CASES]
ALL_DTYPES = list(M.DTYPES)  # the 13 names of the spec's dtype table


def _write(tmp_path: Path, data: bytes, name: str = "f.kdtr") -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


def _raw_bytes(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).tobytes()


# --- the malformed cases ------------------------------------------------------------------


def test_every_spec_error_has_a_case(repo_root):
    """Each error of the spec's table (section 3) has a class and at least one case."""
    spec = (repo_root / "docs" / "kdtr-format.md").read_text(encoding="utf-8")
    section = spec[spec.index("## 3. Validation and errors") : spec.index("## 4. Versioning")]
    names = set(re.findall(r"^\| `(\w+)` \|", section, flags=re.M))
    assert len(names) == 23, names
    assert names == M.expected_codes()
    for name in names:
        cls = getattr(E, name)
        assert issubclass(cls, kdtr.KdtrError) and cls is not kdtr.KdtrError
    assert issubclass(kdtr.KdtrError, ValueError)


@pytest.mark.parametrize("case_id, data, expected", M.CASES, ids=CASE_IDS)
def test_malformed_file_raises_its_error(tmp_path, case_id, data, expected):
    path = _write(tmp_path, data)
    with pytest.raises(kdtr.KdtrError) as info:
        kdtr.load(path)
    exc = info.value
    assert type(exc).__name__ == expected, f"{case_id}: {exc}"
    assert exc.code == expected
    assert str(path) in str(exc)
    assert exc.path == str(path)
    # file, field, offset, detail (docs/kdtr-format.md section 3)
    assert 0 <= exc.offset <= len(data)
    assert exc.field and exc.detail
    assert str(exc) == f"{path}: {exc.field} at offset {exc.offset}: {exc.detail}"


@pytest.mark.parametrize("case_id, data, expected", M.CASES, ids=CASE_IDS)
def test_malformed_file_without_verify(tmp_path, case_id, data, expected):
    """Header and data-region rules fire on open; only the CRC and bool rules need verify."""
    path = _write(tmp_path, data)
    if expected in M.VERIFY_ONLY:
        with kdtr.load(path, verify=False) as f:
            assert f.tensors
    else:
        with pytest.raises(kdtr.KdtrError) as info:
            kdtr.load(path, verify=False)
        assert type(info.value).__name__ == expected


def test_checks_hold_under_python_O(tmp_path, repo_root):
    """No validation relies on assert: every case still fails the same way under -O."""
    for i, (_, data, _) in enumerate(M.CASES):
        _write(tmp_path, data, f"{i}.kdtr")
    script = (
        "import sys, kdtr, malformed as M\n"
        "assert False, 'asserts are on'\n"
    )
    code = (
        "import sys, kdtr, malformed as M\n"
        "bad = []\n"
        "for i, (cid, _, exp) in enumerate(M.CASES):\n"
        "    try:\n"
        f"        kdtr.load({str(tmp_path)!r} + f'/{{i}}.kdtr'); got = 'OK'\n"
        "    except kdtr.KdtrError as e:\n"
        "        got = type(e).__name__\n"
        "    if got != exp: bad.append((cid, exp, got))\n"
        "print(bad); sys.exit(1 if bad else 0)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(repo_root), str(repo_root / "tests")]))
    probe = subprocess.run([sys.executable, "-O", "-c", script], env=env, capture_output=True, text=True)
    assert probe.returncode == 0, "python -O did not disable assert"
    run = subprocess.run([sys.executable, "-O", "-c", code], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.parametrize(
    "module", ["format/__init__.py", "format/layout.py", "format/read.py", "format/write.py", "errors.py", "dtypes.py"]
)
def test_no_assert_in_validation_code(repo_root, module):
    tree = ast.parse((repo_root / "kdtr" / module).read_text(encoding="utf-8"))
    asserts = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Assert)]
    assert not asserts, f"kdtr/{module} uses assert at lines {asserts}"


def test_the_package_re_exports_the_public_names_of_its_modules():
    """kdtr.format is layout + read + write; ``import kdtr.format`` gives every public name,
    the very objects of the submodule that defines them."""
    from kdtr.format import layout, read, write

    want = {
        "ALIGNMENT", "CRC32_IMPL", "DTYPE_BY_CODE", "MAGIC", "MAX_HEADER_LEN", "MAX_METADATA", "MAX_NAME_LEN",
        "MAX_NDIM", "MAX_STRING_LEN", "MAX_TENSORS", "META_BOOL", "META_FLOAT", "META_INT", "META_STRING",
        "MIN_HEADER_LEN", "PREAMBLE_LEN", "VERSION_MAJOR", "VERSION_MINOR", "Chunks", "Counts", "HeaderBodyLayout",
        "HeaderCrc", "KdtrFile", "MetaString", "MetaType", "MetadataEntryLayout", "Name", "Preamble", "TensorEntry",
        "TensorEntryLayout", "TensorKind", "TensorPlace", "TensorShape", "atomic_write", "atomic_write_together",
        "code_of_dtype", "encode", "load", "load_bytes", "read_regular_bytes", "save", "to_bytes",
    }
    assert set(F.__all__) == want
    for name in want:
        home = next((m for m in (layout, read, write) if name in vars(m)), None)
        if home is not None:
            assert getattr(F, name) is getattr(home, name), name
    assert F.load is read.load and F.save is write.save and F.HeaderBodyLayout is layout.HeaderBodyLayout
    assert F._open_regular is read._open_regular  # shared with kdtr.goldens and kdtr.userfiles


# --- the valid file ------------------------------------------------------------------------


def _check_contents(f: kdtr.KdtrFile, tensors: dict, metadata: dict) -> None:
    assert list(f.tensors) == list(tensors)
    for name, want in tensors.items():
        got = f.tensors[name]
        assert got.dtype == np.asarray(want).dtype
        assert got.shape == np.shape(want)
        assert _raw_bytes(got) == _raw_bytes(np.asarray(want).astype(got.dtype))
    assert list(f.metadata) == list(metadata)
    for key, want in metadata.items():
        got = f.metadata[key]
        assert type(got) is type(want), (key, got, want)
        if isinstance(want, float):
            assert struct.pack("<d", got) == struct.pack("<d", want)
        else:
            assert got == want


def test_valid_file_loads(tmp_path):
    path = _write(tmp_path, M.valid_file_bytes())
    tensors, metadata = M.valid_file_contents()
    with kdtr.load(path) as f:
        assert f.version == (1, 0)
        _check_contents(f, tensors, metadata)
        assert f.tensors["scale"].shape == () and f.tensors["scale"].dtype == np.float64
        assert f.tensors["empty"].shape == (0, 3)
        assert f.tensors["input.logits"].dtype == np.dtype(ml_dtypes.bfloat16)
        assert f.tensors["input.mask"].dtype == np.bool_
    with kdtr.load(path, verify=False) as f:
        _check_contents(f, tensors, metadata)


def test_writer_matches_independent_layout(tmp_path):
    """kdtr.save writes the canonical layout that tests/malformed.py builds by hand."""
    tensors, metadata = M.valid_file_contents()
    path = tmp_path / "w.kdtr"
    kdtr.save(path, tensors, metadata)
    assert path.read_bytes() == M.valid_file_bytes()
    assert F.to_bytes(tensors, metadata) == M.valid_file_bytes()


def test_minor_version_extension_is_skipped(tmp_path):
    f = M.File([M.tensor("x", np.arange(3, dtype=np.int16))], [M.meta_int("a", 1)], minor=1,
               extension=b"future fields")
    with kdtr.load(_write(tmp_path, f.render())) as got:
        assert got.version == (1, 1)
        assert got.metadata == {"a": 1}
        assert got.tensors["x"].tolist() == [0, 1, 2]


def test_limits_are_inclusive(tmp_path):
    """Values at each cap are valid: 255-byte names and keys, 8 dims, 4096 tensors and keys,
    1 MiB strings."""
    name = "é" * 127 + "x"  # 255 bytes of UTF-8
    assert len(name.encode()) == F.MAX_NAME_LEN
    tensors = {name: np.ones((1, 2, 1, 1, 2, 1, 1, 2), np.int8)}
    tensors.update({f"t{i}": np.zeros((0,), np.uint8) for i in range(F.MAX_TENSORS - 1)})
    metadata = {name: "s" * F.MAX_STRING_LEN}
    metadata.update({f"k{i}": i for i in range(F.MAX_METADATA - 1)})
    path = tmp_path / "limits.kdtr"
    kdtr.save(path, tensors, metadata)
    with kdtr.load(path) as f:
        assert len(f.tensors) == F.MAX_TENSORS and len(f.metadata) == F.MAX_METADATA
        assert f.tensors[name].ndim == F.MAX_NDIM
        assert len(f.metadata[name]) == F.MAX_STRING_LEN


def test_tensor_and_metadata_may_share_a_name(tmp_path):
    path = tmp_path / "s.kdtr"
    kdtr.save(path, {"op": np.zeros(2, np.int32)}, {"op": "x"})
    with kdtr.load(path) as f:
        assert f.metadata["op"] == "x" and f.tensors["op"].tolist() == [0, 0]


ZERO_SIZE_IDS = ["x".join(map(str, shape)) + f"-code{code}" for shape, code, _ in M.ZERO_SIZE_SHAPES]


@pytest.mark.parametrize("shape, dtype, expected", M.ZERO_SIZE_SHAPES, ids=ZERO_SIZE_IDS)
def test_zero_size_tensors_follow_the_size_rule(tmp_path, shape, dtype, expected):
    """Spec 1.3: SizeOverflow when the product of the NONZERO dims x itemsize exceeds
    2**63 - 1, zero-size tensors included; otherwise a valid empty tensor (nbytes 0).
    tests/binaries/test_format_cpp.py checks the C++ reader on the same rows."""
    f = M.File([M.raw_tensor("z", dtype, shape)])
    path = _write(tmp_path, f.render())
    if expected == "OK":
        with kdtr.load(path) as got:
            assert got.tensors["z"].shape == shape and got.tensors["z"].size == 0
            assert got.tensors["z"].dtype.itemsize == M.ITEMSIZE[dtype]
    else:
        with pytest.raises(kdtr.KdtrError) as info:
            kdtr.load(path)
        assert type(info.value).__name__ == expected
        assert info.value.field.startswith("tensors[0].shape")


def test_the_size_rule_is_numpys(tmp_path):
    """Each row of the table agrees with numpy: a shape is valid iff numpy can build it."""
    for shape, code, expected in M.ZERO_SIZE_SHAPES:
        dt = next(d for c, d in M.DTYPES.values() if c == code)
        try:
            np.empty(shape, dt)
            numpy_ok = True
        except (ValueError, OverflowError):
            numpy_ok = False
        assert numpy_ok == (expected == "OK"), (shape, code)


@pytest.mark.parametrize("shape, dtype, nbytes", [
    ((2**62, 0), 12, None), ((0, 2**63), 2, None), ((2**40, 0, 2**40), 2, None),
    ((2**63,), 2, None), ((2**62,), 4, None), ((2**61, 0), 2, 0), ((0, 2**63 - 1), 2, 0),
    ((2**63 - 1,), 2, 2**63 - 1), ((2**31, 2**31 - 1), 11, 2**63 - 2**32), ((), 13, 8), ((3, 0), 12, 0),
])
def test_checked_nbytes(shape, dtype, nbytes):
    """kdtr.format.layout._checked_nbytes directly: nbytes, or SizeOverflow (None)."""
    if nbytes is None:
        with pytest.raises(E.SizeOverflow):
            FL._checked_nbytes("p", "w", 0, shape, M.ITEMSIZE[dtype])
    else:
        assert FL._checked_nbytes("p", "w", 0, shape, M.ITEMSIZE[dtype]) == nbytes


def test_empty_file_of_no_tensors_and_no_metadata(tmp_path):
    path = tmp_path / "e.kdtr"
    kdtr.save(path, {})
    assert path.stat().st_size == 16 + 12
    with kdtr.load(path) as f:
        assert f.tensors == {} and f.metadata == {}


def test_goldens_load_and_resave_byte_identical(tmp_path, repo_root):
    goldens = sorted((repo_root / "golden").glob("**/*.kdtr"))
    goldens = [g for g in goldens if ".cache" not in g.parts]
    assert goldens, "no committed goldens"
    for g in goldens:
        with kdtr.load(g) as f:
            tensors = {k: np.array(v) for k, v in f.tensors.items()}
            metadata = dict(f.metadata)
        out = tmp_path / g.name
        kdtr.save(out, tensors, metadata)
        assert out.read_bytes() == g.read_bytes(), g


# --- round trips ---------------------------------------------------------------------------


def _sample(dtype_name: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dt = M.DTYPES[dtype_name][1]
    n = int(np.prod(shape, dtype=np.int64))
    if dtype_name == "bool":
        flat = rng.integers(0, 2, n).astype(bool)
    elif dt.kind in "iu":
        info = np.iinfo(dt)
        flat = rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)
        flat[: min(n, 2)] = [info.min, info.max][: min(n, 2)]
    else:
        flat = (rng.standard_normal(n) * 100).astype(dt)
        specials = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0], dtype=np.float64).astype(dt)
        k = min(n, len(specials))
        flat[:k] = specials[:k]
    return flat.reshape(shape)


SHAPES = [(), (0,), (7,), (2, 3), (3, 0, 2), (1, 2, 1, 2, 1, 1, 2, 3)]


@pytest.mark.parametrize("dtype_name", ALL_DTYPES)
def test_round_trip_every_dtype(tmp_path, dtype_name):
    tensors = {f"s{i}": _sample(dtype_name, shape, i) for i, shape in enumerate(SHAPES)}
    path = tmp_path / "r.kdtr"
    kdtr.save(path, tensors)
    code, dt = M.DTYPES[dtype_name]
    with kdtr.load(path) as f:
        assert list(f.tensors) == list(tensors)
        for name, want in tensors.items():
            got = f.tensors[name]
            assert got.dtype == dt and got.shape == want.shape
            assert got.flags.c_contiguous
            assert _raw_bytes(got) == _raw_bytes(want)  # bit-exact: NaN payloads, -0.0
        assert {e.dtype_code for e in f.entries} == {code}
        assert f.entries[-1].shape == SHAPES[-1] and len(f.entries[-1].shape) == 8


def test_bf16_is_a_real_numpy_dtype(tmp_path):
    want = np.array([1.0, -2.0, 0.5, 65280.0], dtype=ml_dtypes.bfloat16)
    path = tmp_path / "b.kdtr"
    kdtr.save(path, {"x": want})
    with kdtr.load(path) as f:
        got = f.tensors["x"]
        assert got.dtype == np.dtype(ml_dtypes.bfloat16)
        assert got.astype(np.float32).tolist() == [1.0, -2.0, 0.5, 65280.0]
        assert _raw_bytes(got) == struct.pack("<4H", 0x3F80, 0xC000, 0x3F00, 0x477F)


def test_non_contiguous_inputs_are_written_in_c_order(tmp_path):
    base = np.arange(24, dtype=np.int32).reshape(4, 6)
    views = {"fortran": np.asfortranarray(base), "strided": base[:, ::2], "transposed": base.T}
    want = {k: np.ascontiguousarray(v) for k, v in views.items()}
    assert F.to_bytes(views) == F.to_bytes(want)
    path = tmp_path / "c.kdtr"
    kdtr.save(path, views)
    with kdtr.load(path) as f:
        for k, v in want.items():
            np.testing.assert_array_equal(f.tensors[k], v)


@pytest.mark.parametrize("dtype", [">i2", ">u2", ">i4", ">u4", ">i8", ">u8", ">f2", ">f4", ">f8"])
def test_big_endian_inputs_are_stored_little_endian(tmp_path, dtype):
    big = (np.arange(-3, 5) * 3).astype(dtype)
    little = big.astype(np.dtype(dtype).newbyteorder("<"))
    assert F.to_bytes({"x": big}) == F.to_bytes({"x": little})
    path = tmp_path / "be.kdtr"
    kdtr.save(path, {"x": big})
    raw = path.read_bytes()
    with kdtr.load(path) as f:
        got = f.tensors["x"]
        assert got.dtype == little.dtype and got.dtype.byteorder in "<="
        np.testing.assert_array_equal(got, big)
        off = f.entries[0].offset
    assert raw[off : off + little.nbytes] == little.tobytes()


def test_round_trip_metadata_of_every_type(tmp_path):
    metadata = {
        "int.zero": 0,
        "int.min": -(2**63),
        "int.max": 2**63 - 1,
        "int.numpy": np.int32(-5),
        "float.pi": math.pi,
        "float.neg_zero": -0.0,
        "float.inf": -math.inf,
        "float.nan": math.nan,
        "float.subnormal": 5e-324,
        "float.numpy": np.float32(0.25),
        "str.empty": "",
        "str.unicode": "κόσμε \u2603 \U0001f600 \x00 nul",
        "str.max": "x" * F.MAX_STRING_LEN,
        "bool.true": True,
        "bool.false": False,
        "bool.numpy": np.bool_(True),
    }
    path = tmp_path / "m.kdtr"
    kdtr.save(path, {}, metadata)
    with kdtr.load(path) as f:
        got = f.metadata
    assert list(got) == list(metadata)
    want_types = {"int": int, "float": float, "str": str, "bool": bool}
    for key, want in metadata.items():
        assert type(got[key]) is want_types[key.split(".")[0]], key
        if isinstance(want, (float, np.floating)):
            assert struct.pack("<d", got[key]) == struct.pack("<d", float(want)), key
        else:
            assert got[key] == want, key


# --- zero copy, read-only views, verify -----------------------------------------------------


def _mapping_of(arr: np.ndarray):
    obj = arr
    while isinstance(obj, np.ndarray):
        obj = obj.base
    if isinstance(obj, memoryview):
        obj = obj.obj
    return obj


def test_tensors_are_read_only_views_over_an_mmap(tmp_path):
    path = _write(tmp_path, M.valid_file_bytes())
    f = kdtr.load(path)
    for name, arr in f.tensors.items():
        assert not arr.flags.writeable, name
        if arr.size:
            assert isinstance(_mapping_of(arr), mmap.mmap), name
            with pytest.raises(ValueError):
                arr.reshape(-1)[0] = arr.reshape(-1)[0]
            with pytest.raises(ValueError):
                arr.setflags(write=True)
    arrs = dict(f.tensors)
    f.close()  # a live view keeps the mapping: no error, data still readable
    assert arrs["input.ids"].tolist() == [[0, -1], [2**31 - 1, -(2**31)]]
    assert path.read_bytes() == M.valid_file_bytes()


def test_verify_false_does_not_read_tensor_data(tmp_path, monkeypatch):
    """With verify=False the only CRC computed is the header's: tensor bytes are untouched."""
    data = M.valid_file_bytes()
    path = _write(tmp_path, data)
    data_start = M.valid_file().data_start()
    crc_lengths: list[int] = []
    real_crc32 = FL._crc32  # the CRC-32 the reader uses (isal's, or zlib's as the fallback)

    def counting_crc32(buf, *args):
        crc_lengths.append(len(memoryview(buf).cast("B")))
        return real_crc32(buf, *args)

    monkeypatch.setattr(FL, "_crc32", counting_crc32)
    with kdtr.load(path, verify=False):
        pass
    assert crc_lengths == [data_start - 4]
    crc_lengths.clear()
    with kdtr.load(path, verify=True):
        pass
    assert crc_lengths[0] == data_start - 4 and len(crc_lengths) == 1 + len(M.valid_file_contents()[0])


def test_corrupt_tensor_loads_without_verify_only(tmp_path):
    f = M.valid_file()
    data = bytearray(f.render())
    ids = f.tensors[2]
    data[ids.offset] ^= 0x01  # the first i32 of input.ids: 0 -> 1
    path = _write(tmp_path, bytes(data))
    with kdtr.load(path, verify=False) as got:
        assert got.tensors["input.ids"][0, 0] == 1  # the view shows the file's bytes
    with pytest.raises(E.TensorChecksumMismatch) as info:
        kdtr.load(path, verify=True)
    crc_field_at = 24 + sum(len(t.entry()) for t in f.tensors[:3]) - 4  # the last field of entry 2
    assert info.value.offset == crc_field_at and str(path) in str(info.value)


def test_bad_bool_loads_without_verify_only(tmp_path):
    f = M.File([M.raw_tensor("m", 1, (3,), bytes([1, 7, 0]))])
    path = _write(tmp_path, f.render())
    with kdtr.load(path, verify=False) as got:
        assert got.tensors["m"].shape == (3,)
    with pytest.raises(E.BadBoolValue) as info:
        kdtr.load(path)
    assert info.value.offset == f.tensors[0].offset + 1


# --- every single-byte flip and every truncation of a valid file is rejected ---------------


def _expected_for_flip(at: int, f: M.File, data: bytes) -> set[str]:
    """The errors a flipped byte at ``at`` may produce (docs/kdtr-format.md section 3)."""
    data_start = f.data_start()
    if at < 8:
        return {"BadMagic"}
    if at < 10:
        return {"UnsupportedVersion"}
    if 12 <= at < 16:  # header_len itself: its own rules fire first
        return {"HeaderTooLarge", "HeaderPastEnd", "Truncated", "HeaderChecksumMismatch"}
    if at < data_start:
        return {"HeaderChecksumMismatch"}
    for t in f.tensors:
        if t.offset <= at < t.offset + t.nbytes:
            return {"TensorChecksumMismatch"}
    return {"NonZeroPadding"}


@pytest.mark.parametrize("mask", [0x01, 0x80, 0xFF])
def test_every_single_byte_flip_is_rejected(tmp_path, mask):
    f = M.valid_file()
    data = f.render()
    path = tmp_path / "flip.kdtr"
    wrong = []
    for at in range(len(data)):
        path.write_bytes(M.xor_byte(data, at, mask))
        try:
            kdtr.load(path)
        except kdtr.KdtrError as exc:
            if type(exc).__name__ not in _expected_for_flip(at, f, data):
                wrong.append((at, type(exc).__name__))
        else:
            wrong.append((at, "loaded"))
        # any other exception propagates and fails the test
    assert not wrong, wrong[:20]


def test_every_truncation_is_rejected(tmp_path):
    data = M.valid_file_bytes()
    path = tmp_path / "cut.kdtr"
    for n in range(len(data)):
        path.write_bytes(data[:n])
        with pytest.raises(kdtr.KdtrError):
            kdtr.load(path)


# --- the writer ----------------------------------------------------------------------------


def test_writes_are_deterministic(tmp_path):
    tensors, metadata = M.valid_file_contents()
    a, b = tmp_path / "a.kdtr", tmp_path / "b.kdtr"
    kdtr.save(a, tensors, metadata)
    kdtr.save(b, dict(tensors), dict(metadata))
    assert a.read_bytes() == b.read_bytes()
    kdtr.save(a, tensors, metadata)  # overwrite in place
    assert a.read_bytes() == b.read_bytes() == F.to_bytes(tensors, metadata)


def test_writer_layout_is_canonical(tmp_path):
    tensors, metadata = M.valid_file_contents()
    path = tmp_path / "c.kdtr"
    kdtr.save(path, tensors, metadata)
    with kdtr.load(path) as f:
        cursor = 16 + struct.unpack_from("<I", path.read_bytes(), 12)[0]
        for e in f.entries:
            assert e.offset == (cursor + 63) // 64 * 64
            cursor = e.offset + e.nbytes
        assert path.stat().st_size == max(cursor, f.entries[-1].offset)


class _Unknown:
    pass


REJECTED_TENSORS = {
    "complex64": {"x": np.zeros(2, np.complex64)},
    "complex128": {"x": np.zeros(2, np.complex128)},
    "object": {"x": np.array([object(), None], dtype=object)},
    "unicode": {"x": np.array(["a", "b"])},
    "bytes": {"x": np.array([b"a"])},
    "datetime": {"x": np.array(["2024-01-01"], dtype="datetime64[D]")},
    "structured": {"x": np.zeros(2, dtype=[("a", "<i4")])},
    "float8": {"x": np.zeros(2, dtype=ml_dtypes.float8_e4m3fn)},
    "ndim_9": {"x": np.zeros((1,) * 9, np.float32)},
    "name_empty": {"": np.zeros(1, np.int32)},
    "name_256_bytes": {"n" * 256: np.zeros(1, np.int32)},
    "name_128_two_byte_chars": {"é" * 128: np.zeros(1, np.int32)},
    "name_not_str": {7: np.zeros(1, np.int32)},
    "name_lone_surrogate": {"\ud800": np.zeros(1, np.int32)},
}
if hasattr(np, "longdouble") and np.dtype(np.longdouble).itemsize > 8:
    REJECTED_TENSORS["longdouble"] = {"x": np.zeros(2, np.longdouble)}

REJECTED_METADATA = {
    "none": {"k": None},
    "list": {"k": [1, 2]},
    "dict": {"k": {"a": 1}},
    "bytes": {"k": b"raw"},
    "tuple": {"k": (1,)},
    "ndarray": {"k": np.zeros(2)},
    "object": {"k": _Unknown()},
    "int_too_big": {"k": 2**63},
    "int_too_small": {"k": -(2**63) - 1},
    "string_over_1MiB": {"k": "x" * (F.MAX_STRING_LEN + 1)},
    "string_lone_surrogate": {"k": "\udc80"},
    "key_empty": {"": 1},
    "key_256_bytes": {"k" * 256: 1},
    "key_not_str": {1: 1},
}


@pytest.mark.parametrize("label", list(REJECTED_TENSORS))
def test_writer_rejects_bad_tensors(tmp_path, label):
    path = tmp_path / "w.kdtr"
    with pytest.raises(E.WriteError) as info:
        kdtr.save(path, REJECTED_TENSORS[label])
    assert isinstance(info.value, kdtr.KdtrError)
    assert not path.exists() and list(tmp_path.iterdir()) == []
    with pytest.raises(E.WriteError):
        F.to_bytes(REJECTED_TENSORS[label])


@pytest.mark.parametrize("label", list(REJECTED_METADATA))
def test_writer_rejects_bad_metadata(tmp_path, label):
    path = tmp_path / "w.kdtr"
    with pytest.raises(E.WriteError):
        kdtr.save(path, {"x": np.zeros(1, np.int8)}, REJECTED_METADATA[label])
    assert list(tmp_path.iterdir()) == []


def test_writer_accepts_limits_in_utf8_bytes():
    F.to_bytes({"é" * 127: np.zeros(1, np.int8)}, {"€" * 85: 1})  # 254 and 255 bytes


@pytest.mark.parametrize("target", ["fsync", "replace"])
@pytest.mark.parametrize("exists", [False, True], ids=["new", "overwrite"])
def test_atomic_write_leaves_nothing_behind(tmp_path, monkeypatch, target, exists):
    dest = tmp_path / "golden.kdtr"
    old = F.to_bytes({"old": np.arange(3, dtype=np.int8)})
    if exists:
        dest.write_bytes(old)

    def boom(*args, **kwargs):
        raise OSError(28, "simulated failure")

    monkeypatch.setattr(os, target, boom)
    tensors, metadata = M.valid_file_contents()
    with pytest.raises(OSError, match="simulated failure"):
        kdtr.save(dest, tensors, metadata)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == (["golden.kdtr"] if exists else [])
    if exists:
        assert dest.read_bytes() == old
        with kdtr.load(dest) as f:
            assert list(f.tensors) == ["old"]


def test_interrupted_write_leaves_nothing_behind(tmp_path, monkeypatch):
    """A KeyboardInterrupt in the middle of writing tensor data (BaseException, not OSError)."""
    dest = tmp_path / "golden.kdtr"
    real_chunks = FW._file_chunks
    written = []

    def chunks_then_interrupt(*args):
        for k, chunk in enumerate(real_chunks(*args)):
            if k == 3:  # the header and two chunks of padding or data are in the file
                raise KeyboardInterrupt
            written.append(len(memoryview(chunk).cast("B")))
            yield chunk

    monkeypatch.setattr(FW, "_file_chunks", chunks_then_interrupt)
    tensors, metadata = M.valid_file_contents()
    with pytest.raises(KeyboardInterrupt):
        kdtr.save(dest, tensors, metadata)
    assert len(written) == 3 and list(tmp_path.iterdir()) == []


def test_saved_file_has_ordinary_permissions(tmp_path):
    path = tmp_path / "p.kdtr"
    kdtr.save(path, {"x": np.zeros(1, np.int8)})
    mask = os.umask(0)
    os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~mask


# --- opening: only regular files; mmap=False ------------------------------------------------


def _load_in_subprocess(
    repo_root: Path, path: Path, extra: str = "", timeout: float = 120
) -> subprocess.CompletedProcess:
    """kdtr.load(path) in a child process, so that a hang fails the test (TimeoutExpired)
    instead of hanging the suite. The child prints the error's class and message."""
    code = (
        "import sys, kdtr\n"
        "try:\n"
        f"    kdtr.load({str(path)!r}{extra})\n"
        "except Exception as e:\n"
        "    print(type(e).__name__, '|', e); sys.exit(3)\n"
        "print('loaded')\n"
    )
    env = dict(os.environ, PYTHONPATH=str(repo_root))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("extra", ["", ", mmap=False", ", verify=False"])
def test_fifo_without_writer_is_refused_not_waited_on(tmp_path, repo_root, extra):
    """open() of a FIFO blocks until a writer appears, so load hung."""
    fifo = tmp_path / "golden.kdtr"
    os.mkfifo(fifo)
    r = _load_in_subprocess(repo_root, fifo, extra)
    assert r.returncode == 3, r.stdout + r.stderr
    assert r.stdout.strip() == f"Io | {fifo}: file: not a regular file (a FIFO)", r.stdout


@pytest.mark.parametrize("mmap_flag", [True, False])
def test_non_regular_files_are_refused(tmp_path, mmap_flag):
    fifo = tmp_path / "fifo.kdtr"
    os.mkfifo(fifo)
    cases = {tmp_path: ("a directory", errno.EISDIR), Path("/dev/null"): ("a character device", errno.EINVAL),
             fifo: ("a FIFO", errno.EINVAL)}
    link = tmp_path / "link.kdtr"
    link.symlink_to("/dev/null")
    cases[link] = cases[Path("/dev/null")]
    for path, (kind, err) in cases.items():
        with pytest.raises(E.Io) as info:
            kdtr.load(path, mmap=mmap_flag)
        exc = info.value
        assert isinstance(exc, OSError) and not isinstance(exc, kdtr.KdtrError)
        assert exc.code == "Io" and exc.path == str(path) and exc.filename == str(path)
        assert exc.errno == err
        assert str(exc) == f"{path}: file: not a regular file ({kind})"


def test_a_symlink_to_a_regular_file_loads(tmp_path):
    target = _write(tmp_path, M.valid_file_bytes())
    link = tmp_path / "link.kdtr"
    link.symlink_to(target)
    with kdtr.load(link) as f:
        assert list(f.tensors) == list(M.valid_file_contents()[0])


def test_missing_file_is_still_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        kdtr.load(tmp_path / "nope.kdtr")
    with pytest.raises(FileNotFoundError):
        kdtr.load(tmp_path / "nope.kdtr", mmap=False)


def test_io_error_pickles(tmp_path):
    exc = E.Io(tmp_path / "x", "not a regular file (a FIFO)")
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is E.Io and str(back) == str(exc) and back.errno == exc.errno


def test_mmap_false_reads_a_private_read_only_copy(tmp_path):
    path = _write(tmp_path, M.valid_file_bytes())
    tensors, metadata = M.valid_file_contents()
    with kdtr.load(path, mmap=False) as f:
        _check_contents(f, tensors, metadata)
        for name, arr in f.tensors.items():
            assert not arr.flags.writeable, name
            if arr.size:
                assert not isinstance(_mapping_of(arr), mmap.mmap), name
                with pytest.raises(ValueError):
                    arr.setflags(write=True)
                with pytest.raises(ValueError):
                    arr.reshape(-1)[0] = arr.reshape(-1)[0]


@pytest.mark.parametrize("case_id, data, expected", M.CASES, ids=CASE_IDS)
def test_malformed_file_without_mmap(tmp_path, case_id, data, expected):
    """mmap=False applies the same rules and raises the same errors."""
    path = _write(tmp_path, data)
    with pytest.raises(kdtr.KdtrError) as info:
        kdtr.load(path, mmap=False)
    assert type(info.value).__name__ == expected and str(path) in str(info.value)


def test_mmap_false_survives_truncation_after_load(tmp_path):
    """With mmap=False the arrays do not depend on the file any more."""
    tensors = {"big": np.arange(1 << 18, dtype=np.int64), "small": np.arange(5, dtype=np.int32)}
    path = tmp_path / "t.kdtr"
    kdtr.save(path, tensors)
    f = kdtr.load(path, mmap=False)
    os.truncate(path, 0)
    path.unlink()
    for name, want in tensors.items():
        assert np.array_equal(f.tensors[name], want)
        assert f.tensors[name].sum() == want.sum()


def test_mmap_true_truncation_is_the_documented_sigbus(tmp_path, repo_root):
    """The hazard documented in load() and docs/kdtr-format.md: touching a mapped page past
    the new end of a truncated file kills the process with SIGBUS (in a child here)."""
    path = tmp_path / "t.kdtr"
    kdtr.save(path, {"big": np.arange(1 << 18, dtype=np.int64)})
    code = (
        "import os, kdtr\n"
        f"f = kdtr.load({str(path)!r}, verify=False)\n"
        f"os.truncate({str(path)!r}, 0)\n"
        "print(int(f.tensors['big'].sum()))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(repo_root))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == -signal.SIGBUS, (r.returncode, r.stdout, r.stderr)
    load_doc = kdtr.load.__doc__ or ""
    assert "SIGBUS" in load_doc and "mmap=False" in load_doc


def test_mmap_false_file_that_shrinks_while_read(tmp_path, monkeypatch):
    """The size is taken at open; a file that then ends early is Io, not a short parse."""
    path = _write(tmp_path, M.valid_file_bytes())
    monkeypatch.setattr(os, "fstat", _fstat_claiming(100))
    with pytest.raises(E.Io) as info:
        kdtr.load(path, mmap=False)
    assert "shrank" in str(info.value) and str(info.value).startswith(f"{path}: file: ")


def _fstat_claiming(extra: int):
    real_fstat = os.fstat

    def fstat(fd):
        st = real_fstat(fd)
        return os.stat_result((st.st_mode, st.st_ino, st.st_dev, st.st_nlink, st.st_uid, st.st_gid,
                               st.st_size + extra, int(st.st_atime), int(st.st_mtime), int(st.st_ctime)))

    return fstat


@pytest.mark.parametrize("length", [0, 5, 12, 15])
def test_file_that_shrinks_below_the_preamble_after_fstat(tmp_path, monkeypatch, length):
    """The mapping's own length is what is parsed: a file cut (here: fstat over-reporting)
    to fewer bytes than the preamble is Truncated, never a construct or mmap error."""
    path = _write(tmp_path, M.valid_file_bytes()[:length])
    monkeypatch.setattr(os, "fstat", _fstat_claiming(1000))
    with pytest.raises(E.Truncated) as info:
        kdtr.load(path)
    assert str(path) in str(info.value)
