"""The Python KDTR writer (kdtr.save / kdtr.format.to_bytes) refuses exactly what the
readers reject (docs/kdtr-format.md section 3.1).

(a) Regressions: inputs the old writer accepted although its own readers reject the file
    (a bool array holding byte 2, duplicate names given as pairs), inputs it crashed on
    (a list of pairs: AttributeError), inputs it stored lossily (a Python list whose dtype
    numpy guesses, a long double, a masked array), and errors that did not name the
    destination (``<write>: ...``).
(b) A property test: for arbitrary tensors and metadata, valid and invalid mixed, save
    either raises WriteError (message starting with the path, no file and no temporary file
    left) or writes a file that loads back equal, bit for bit; it raises exactly when the
    spec's rules say a reader would reject the file. A sample of accepted files is also
    read by the C++ reader (build/bin/kdtr_check).
(c) Temporary files: a save killed mid-write leaves nothing under the final name and a
    temporary file that git ignores.
(d) The one atomic-write helper behind kdtr.save, goldens.write_manifest and
    report.write_all (kdtr.format.atomic_write / atomic_write_together): temporary name,
    mode, fsync order, publish-together.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import kdtr
import kdtr.errors as E
import kdtr.format as F
import malformed as M

SETTINGS = settings(
    max_examples=300,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

_DIR = tempfile.TemporaryDirectory(prefix="kdtr-writer-")
_WORK = Path(_DIR.name)


def _assert_refused(tmp_path: Path, tensors, metadata=None, field: str | None = None, detail: str = "") -> E.WriteError:
    """save refuses with a WriteError naming the path (and ``field``), and leaves the
    directory empty; to_bytes refuses the same way with path ``<bytes>``."""
    path = tmp_path / "w.kdtr"
    with pytest.raises(E.WriteError) as info:
        kdtr.save(path, tensors, metadata)
    exc = info.value
    assert isinstance(exc, kdtr.KdtrError)
    assert exc.path == str(path)
    assert str(exc) == f"{path}: {exc.field}: {exc.detail}", str(exc)
    if field is not None:
        assert exc.field == field, str(exc)
    assert detail in exc.detail, str(exc)
    assert list(tmp_path.iterdir()) == [], "save left a file behind"
    with pytest.raises(E.WriteError) as again:
        F.to_bytes(tensors, metadata)
    assert again.value.path == "<bytes>" and again.value.field == exc.field
    return exc


# --- (a) regressions ---------------------------------------------------------------------


def test_bool_bytes_other_than_0_1_are_refused(tmp_path):
    """A u8 array holding 2 viewed as bool: the reader says BadBoolValue, so the writer refuses it."""
    bad = np.array([0, 2, 1], np.uint8).view(bool)
    exc = _assert_refused(tmp_path, {"m": bad}, field="tensor 'm'", detail="bool byte 2 at element 1")
    assert "BadBoolValue" in exc.detail


@pytest.mark.parametrize("label", ["strided", "transposed", "zero_d", "last", "0xff", "big"])
def test_bool_bytes_are_checked_in_every_layout(tmp_path, label):
    raw = np.zeros((4, 6), np.uint8)
    raw[3, 4] = 0xFF if label == "0xff" else 3
    b = raw.view(bool)
    value = {
        "strided": b[:, ::2],  # element (3, 4) is kept: column 4 of the strided view is 2
        "transposed": b.T,
        "zero_d": np.array(7, np.uint8).view(bool).reshape(()),
        "last": b.reshape(-1),
        "0xff": b,
        "big": np.concatenate([np.ones(1 << 16, bool), b.reshape(-1)]),
    }[label]
    assert not np.array_equal(np.ascontiguousarray(value).view(np.uint8) > 1, np.zeros(value.shape, bool))
    _assert_refused(tmp_path, {"ok": np.ones(3, bool), "m": value}, field="tensor 'm'", detail="bool byte")


def test_valid_bool_arrays_are_accepted(tmp_path):
    path = tmp_path / "b.kdtr"
    raw = np.array([[0, 1], [1, 0]], np.uint8)
    kdtr.save(path, {"a": raw.view(bool).T, "z": np.array(True), "e": np.zeros((0, 2), bool)})
    with kdtr.load(path) as f:
        assert f.tensors["a"].tolist() == [[False, True], [True, False]]
        assert f.tensors["z"].shape == () and bool(f.tensors["z"])


def test_pairs_are_accepted_like_dict(tmp_path):
    """A list (or any iterable) of (name, array) pairs, and of (key, value) pairs, is taken
    as dict() takes it, order kept."""
    path = tmp_path / "p.kdtr"
    tensors = [("b", np.arange(3, dtype=np.int16)), ["a", np.ones((2, 2), np.float32)]]
    metadata = iter([("z", 1), ("op", "x")])
    kdtr.save(path, tensors, metadata)
    assert path.read_bytes() == F.to_bytes(dict(tensors), {"z": 1, "op": "x"})
    with kdtr.load(path) as f:
        assert list(f.tensors) == ["b", "a"] and list(f.metadata) == ["z", "op"]


def test_duplicate_tensor_names_in_pairs_are_refused(tmp_path):
    tensors = [("a", np.zeros(1, np.int8)), ("b", np.zeros(1, np.int8)), ("a", np.ones(1, np.int8))]
    exc = _assert_refused(tmp_path, tensors, field="tensors[2].name", detail="repeats tensors[0]")
    assert "DuplicateName" in exc.detail


def test_duplicate_metadata_keys_in_pairs_are_refused(tmp_path):
    exc = _assert_refused(tmp_path, {"x": np.zeros(1, np.int8)}, [("k", 1), ("k", 2)],
                          field="metadata[1].key", detail="repeats metadata[0]")
    assert "DuplicateName" in exc.detail


class _DupMapping:
    """A mapping-like object whose keys() repeats a key (dict() would keep the last)."""

    def keys(self):
        return ["a", "a"]

    def __getitem__(self, k):
        return np.zeros(1, np.int8)


def test_duplicate_keys_of_a_mapping_like_object_are_refused(tmp_path):
    _assert_refused(tmp_path, _DupMapping(), field="tensors[1].name")


@pytest.mark.parametrize("label, value, field", [
    ("ndarray", np.zeros(3), "tensors"),
    ("str", "abc", "tensors"),
    ("bytes", b"ab", "tensors"),
    ("int", 3, "tensors"),
    ("none", None, "tensors"),
    ("list_of_arrays", [np.zeros(2), np.zeros(2)], "tensors[0]"),
    ("triple", [("a", np.zeros(1), 1)], "tensors[0]"),
    ("string_pair", ["ab"], "tensors[0]"),
])
def test_tensors_argument_that_is_not_a_mapping_or_pairs(tmp_path, label, value, field):
    _assert_refused(tmp_path, value, field=field)


@pytest.mark.parametrize("label, value, field", [
    ("str", "abc", "metadata"),
    ("int", 5, "metadata"),
    ("list_of_keys", ["a", "b"], "metadata[0]"),
    ("single", [("a",)], "metadata[0]"),
])
def test_metadata_argument_that_is_not_a_mapping_or_pairs(tmp_path, label, value, field):
    _assert_refused(tmp_path, {"x": np.zeros(1, np.int8)}, value, field=field)


class _Tensorish:
    """A torch-like CPU tensor: converts through __array__."""

    def __init__(self, arr):
        self.arr = arr

    def __array__(self, dtype=None, copy=None):
        return self.arr if dtype is None else self.arr.astype(dtype)


class _Unconvertible:
    """A torch bf16 or CUDA tensor: __array__ raises."""

    def __array__(self, dtype=None, copy=None):
        raise TypeError("Got unsupported ScalarType BFloat16")


class _HugeInterface:
    """An array interface describing a shape the size rule (and numpy) forbids."""

    __array_interface__ = {"shape": (2**62, 0), "typestr": "<f4", "data": (0, True), "version": 3}


@pytest.mark.parametrize("label, value, detail", [
    ("list", [1, 2, 3], "not an array"),
    ("nested_list", [[1.0], [2.0]], "not an array"),
    ("tuple", (1, 2), "not an array"),
    ("python_int", 3, "not an array"),
    ("python_float", 0.5, "not an array"),
    ("python_bool", True, "not an array"),
    ("none", None, "not an array"),
    ("bytes", b"abc", "not an array"),
    ("memoryview", memoryview(b"abcd"), "not an array"),
    ("masked", np.ma.masked_array([1, 2], mask=[0, 1]), "masked array"),
    ("unconvertible", _Unconvertible(), "TypeError: Got unsupported ScalarType BFloat16"),
    ("huge_interface", _HugeInterface(), "cannot be converted"),
])
def test_tensor_values_that_are_not_arrays_are_refused(tmp_path, label, value, detail):
    """Lists and Python scalars are refused: numpy would guess their dtype (int64 on one
    platform, int32 on another), and a golden's dtypes must be explicit."""
    _assert_refused(tmp_path, {"v": value}, field="tensor 'v'", detail=detail)


class _Sub(np.ndarray):
    pass


def test_array_likes_and_numpy_scalars_are_accepted(tmp_path):
    path = tmp_path / "a.kdtr"
    arr = np.arange(6, dtype=np.int32).reshape(2, 3)
    kdtr.save(path, {"t": _Tensorish(arr), "s": np.float32(1.5), "m": arr.view(_Sub)})
    with kdtr.load(path) as f:
        assert f.tensors["t"].tolist() == arr.tolist() and f.tensors["t"].dtype == np.int32
        assert f.tensors["s"].shape == () and f.tensors["s"].dtype == np.float32 and f.tensors["s"] == 1.5
        assert type(f.tensors["m"]) is np.ndarray and f.tensors["m"].tolist() == arr.tolist()


def test_long_double_metadata_must_be_exact(tmp_path):
    if np.dtype(np.longdouble).itemsize <= 8 or np.finfo(np.longdouble).nmant <= 52:
        pytest.skip("long double is float64 on this platform: nothing to lose")
    third = np.longdouble(1) / 3
    assert float(third) != third
    _assert_refused(tmp_path, {}, {"x": third}, field='metadata["x"]', detail="not exactly a float64")
    path = tmp_path / "ok.kdtr"
    kdtr.save(path, {}, {"half": np.longdouble(0.5), "nan": np.longdouble("nan"), "inf": np.longdouble("-inf")})
    with kdtr.load(path) as f:
        assert f.metadata["half"] == 0.5 and math.isnan(f.metadata["nan"]) and f.metadata["inf"] == -math.inf


@pytest.mark.parametrize("label, tensors, metadata, field", [
    ("name_not_str", {7: np.zeros(1, np.int8)}, None, "tensors[0].name"),
    ("name_empty", {"": np.zeros(1, np.int8)}, None, "tensors[0].name"),
    ("name_surrogate", {"ok": np.zeros(1, np.int8), "\ud800": np.zeros(1, np.int8)}, None, "tensors[1].name"),
    ("name_256", {"n" * 256: np.zeros(1, np.int8)}, None, "tensors[0].name"),
    ("dtype", {"c": np.zeros(1, np.complex64)}, None, "tensor 'c'"),
    ("ndim", {"d": np.zeros((1,) * 9, np.int8)}, None, "tensor 'd'"),
    ("too_many_tensors", {f"t{i}": np.zeros(0, np.int8) for i in range(F.MAX_TENSORS + 1)}, None, "tensors"),
    ("too_many_metadata", {}, {f"k{i}": 0 for i in range(F.MAX_METADATA + 1)}, "metadata"),
    ("key_not_str", {}, {b"k": 1}, "metadata[0].key"),
    ("key_surrogate", {}, {"a": 1, "\udc80": 1}, "metadata[1].key"),
    ("int_range", {}, {"k": 2**63}, 'metadata["k"]'),
    ("string_surrogate", {}, {"k": "x\udfff"}, 'metadata["k"]'),
    ("string_long", {}, {"k": "é" * (F.MAX_STRING_LEN // 2 + 1)}, 'metadata["k"]'),
    ("type", {}, {"k": None}, 'metadata["k"]'),
    ("header", {}, {f"k{i}": "x" * F.MAX_STRING_LEN for i in range(17)}, "header"),
])
def test_every_write_error_names_the_destination_and_field(tmp_path, label, tensors, metadata, field):
    """Errors used to start with ``<write>:``."""
    _assert_refused(tmp_path, tensors, metadata, field=field)


def test_error_path_is_the_given_path_for_pathlike_and_str(tmp_path):
    for path in (tmp_path / "x.kdtr", str(tmp_path / "y.kdtr")):
        with pytest.raises(E.WriteError) as info:
            kdtr.save(path, {"m": np.array([3], np.uint8).view(bool)})
        assert str(info.value).startswith(f"{path}: tensor 'm': ")


# --- (b) the property: save accepts exactly what loads back --------------------------------

SURROGATE = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF, exclude_categories=())
NAME_TEXT = st.text(st.one_of(st.characters(), SURROGATE), min_size=0, max_size=6)


def _name_ok(name) -> bool:
    """Spec 1.3 / 1.4: a str whose UTF-8 form has 1..255 bytes."""
    if not isinstance(name, str):
        return False
    try:
        return 1 <= len(name.encode("utf-8")) <= F.MAX_NAME_LEN
    except UnicodeEncodeError:
        return False


names = st.one_of(
    NAME_TEXT,
    st.sampled_from(["a", "b", "x" * 255, "x" * 256, "é" * 127 + "x", "é" * 128, "\x00", "k\nl"]),
    st.sampled_from([7, b"a", None]),
)

KDTR_DTYPES = {name: dt for name, (_, dt) in M.DTYPES.items()}
shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)


@st.composite
def tensor_values(draw):
    """(value, ok, kdtr dtype or None): ``ok`` is whether the spec lets a file hold it."""
    kind = draw(st.sampled_from(["array"] * 6 + ["bool_bytes", "bad_dtype", "not_array", "scalar", "ndim"]))
    if kind == "bool_bytes":
        raw = draw(hnp.arrays(np.uint8, shapes, elements=st.integers(0, 3)))
        return raw.view(bool), bool((raw <= 1).all()), np.dtype(bool)
    if kind == "bad_dtype":
        dt = draw(st.sampled_from([np.complex64, "U2", object, "datetime64[s]", ml_dtypes.float8_e5m2, "V3"]))
        return np.zeros(draw(shapes), dt), False, None
    if kind == "not_array":
        return draw(st.sampled_from([[1, 2], 3, 1.5, True, None, (1,), b"x"])), False, None
    if kind == "scalar":
        v = draw(st.sampled_from([np.int16(-3), np.uint64(2**64 - 1), np.float32("nan"), np.bool_(True),
                                  ml_dtypes.bfloat16(1.5), np.float16(-0.0)]))
        return v, True, np.dtype(type(v)) if not isinstance(v, ml_dtypes.bfloat16) else np.dtype(ml_dtypes.bfloat16)
    if kind == "ndim":
        nd = draw(st.sampled_from([8, 9]))
        return np.zeros((1,) * nd, np.int8), nd <= F.MAX_NDIM, np.dtype(np.int8)
    name = draw(st.sampled_from(list(KDTR_DTYPES)))
    dt = KDTR_DTYPES[name]
    shape = draw(shapes)
    if name == "bf16":  # no hypothesis strategy for bf16: draw its bit patterns
        arr = draw(hnp.arrays(np.uint16, shape)).view(dt)
    else:
        arr = draw(hnp.arrays(dt, shape))
    if dt.itemsize > 1 and draw(st.booleans()):
        arr = arr.astype(dt.newbyteorder(">"))  # big-endian input, stored little-endian
    layout = draw(st.sampled_from(["c", "f", "reversed", "strided"]))
    if layout == "f":
        arr = np.asfortranarray(arr)
    elif layout == "reversed" and arr.ndim:
        arr = arr[::-1]
    elif layout == "strided" and arr.ndim:
        arr = np.repeat(arr, 2, axis=0)[::2]
    return arr, True, dt


meta_values = st.one_of(
    st.tuples(st.integers(min_value=-(2**63), max_value=2**63 - 1), st.just(True)),
    st.tuples(st.sampled_from([2**63, -(2**63) - 1, 2**64]), st.just(False)),
    st.tuples(st.floats(allow_nan=True, allow_infinity=True), st.just(True)),
    st.tuples(st.sampled_from([np.float16(1.5), np.float32("-inf"), np.float64(-0.0), np.int8(-1), np.uint64(2**63 - 1),
                               np.int64(-(2**63)), np.bool_(False), np.str_("np")]), st.just(True)),
    st.tuples(st.just(np.uint64(2**63)), st.just(False)),
    st.tuples(st.text(st.one_of(st.characters(), SURROGATE), max_size=20), st.just(None)),  # ok iff encodable
    st.tuples(st.booleans(), st.just(True)),
    st.tuples(st.sampled_from([None, [1], b"x", {"a": 1}, 1j, np.zeros(1)]), st.just(False)),
)


def _meta_ok(value, ok) -> bool:
    if ok is not None:
        return ok
    try:
        value.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def _expected_bytes(value) -> bytes:
    """The little-endian C-order bytes of ``value``, computed without the writer."""
    arr = np.asarray(value)
    raw = np.ascontiguousarray(arr).tobytes()
    if arr.dtype.byteorder == ">" and arr.dtype.itemsize > 1:
        raw = np.frombuffer(raw, np.uint8).reshape(-1, arr.dtype.itemsize)[:, ::-1].tobytes()
    return raw


def _normalized(value):
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    return str(value)


@st.composite
def inputs(draw):
    """(tensors argument, metadata argument, should be accepted)."""
    t_items = draw(st.lists(st.tuples(names, tensor_values()), max_size=4))
    m_items = draw(st.lists(st.tuples(names, meta_values), max_size=4))
    ok = all(_name_ok(n) and v[1] for n, v in t_items) and all(_name_ok(k) and _meta_ok(*v) for k, v in m_items)
    t_names = [n for n, _ in t_items]
    m_keys = [k for k, _ in m_items]
    hashable = all(isinstance(k, (str, int, bytes, type(None))) for k in t_names + m_keys)
    if hashable and (len(set(t_names)) < len(t_names) or len(set(m_keys)) < len(m_keys)):
        ok = False  # a repeated name: as pairs it is refused; as a dict it cannot be built
    as_pairs = draw(st.booleans()) or not ok
    tensors = [(n, v[0]) for n, v in t_items] if as_pairs else {n: v[0] for n, v in t_items}
    metadata = [(k, v[0]) for k, v in m_items] if as_pairs else {k: v[0] for k, v in m_items}
    return tensors, metadata, ok, t_items, m_items


def _save_and_check(tensors, metadata, ok, t_items, m_items) -> Path | None:
    d = Path(tempfile.mkdtemp(dir=_WORK))
    path = d / "p.kdtr"
    try:
        kdtr.save(path, tensors, metadata)
    except E.WriteError as exc:
        assert not ok, f"refused a valid input: {exc}"
        assert str(exc).startswith(f"{path}: "), str(exc)
        assert list(d.iterdir()) == [], "a refused save left a file"
        d.rmdir()
        return None
    assert ok, "accepted an input the spec's rules reject"
    with kdtr.load(path) as f:
        assert list(f.tensors) == [n for n, _ in t_items]
        for name, (value, _, dt) in t_items:
            got = f.tensors[name]
            assert got.dtype == dt and got.shape == np.shape(value) and not got.flags.writeable
            assert got.tobytes() == _expected_bytes(value), name  # bit for bit
        assert list(f.metadata) == [k for k, _ in m_items]
        for key, (value, _) in m_items:
            got, want = f.metadata[key], _normalized(value)
            assert type(got) is type(want), key
            if isinstance(want, float):
                assert struct.pack("<d", got) == struct.pack("<d", want), key
            else:
                assert got == want, key
    return path


@SETTINGS
@given(case=inputs())
def test_save_accepts_exactly_what_loads_back_equal(case):
    path = _save_and_check(*case)
    if path is not None:
        shutil.rmtree(path.parent)


@settings(SETTINGS, max_examples=60)
@given(case=inputs().filter(lambda c: c[2]))
def test_cpp_reader_accepts_what_save_accepted(case, kdtr_check):
    path = _save_and_check(*case)
    assert path is not None
    r = subprocess.run([str(kdtr_check), str(path)], capture_output=True, text=True, errors="replace", timeout=60)
    assert r.returncode == 0, r.stderr
    shutil.rmtree(path.parent)


# --- (c) temporary files ------------------------------------------------------------------


def test_killed_save_leaves_nothing_under_the_final_name(tmp_path, repo_root):
    """SIGKILL between writing and the rename (at the fsync): no file under the final
    name, and the temporary file left behind is ``.<name>.<random>.tmp``, which git ignores."""
    dest = tmp_path / "golden.kdtr"
    code = (
        "import os, signal, numpy as np, kdtr\n"
        "os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)\n"
        f"kdtr.save({str(dest)!r}, {{'x': np.arange(1000, dtype=np.int32)}})\n"
    )
    env = dict(os.environ, PYTHONPATH=str(repo_root))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == -signal.SIGKILL, r.stderr
    left = [p.name for p in tmp_path.iterdir()]
    assert "golden.kdtr" not in left
    assert len(left) == 1 and left[0].startswith(".golden.kdtr.") and left[0].endswith(".tmp"), left
    ignored = subprocess.run(
        ["git", "-C", str(repo_root), "check-ignore", "--no-index", "-q", f"golden/tree_accept/{left[0]}"]
    )
    assert ignored.returncode == 0, f"git does not ignore {left[0]}"


def test_a_255_byte_file_name_can_be_saved(tmp_path):
    """The temporary name must fit NAME_MAX too: it shortens the prefix it takes from a long name."""
    dest = tmp_path / ("g" * 250 + ".kdtr")
    kdtr.save(dest, {"x": np.zeros(2, np.int8)})
    assert [p.name for p in tmp_path.iterdir()] == [dest.name]
    with kdtr.load(dest) as f:
        assert f.tensors["x"].tolist() == [0, 0]


# --- (d) the one atomic-write helper (kdtr.format.atomic_write / atomic_write_together) ---
#
# kdtr.save, goldens.write_manifest and report.write_all all write through these: a
# temporary ``.<name>.<random>.tmp`` beside the destination, mode 0o666 & ~umask, fsync,
# rename, directory fsync.


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_atomic_write_replaces_the_file_with_an_ordinary_mode(tmp_path):
    dest = tmp_path / "a.json"
    dest.write_bytes(b"old")
    F.atomic_write(dest, b"new bytes\n")
    assert dest.read_bytes() == b"new bytes\n"
    assert dest.stat().st_mode & 0o777 == 0o666 & ~_umask()
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_atomic_write_takes_chunks_and_str_paths(tmp_path):
    dest = str(tmp_path / "c.bin")
    F.atomic_write(dest, iter([b"ab", memoryview(b"cd"), np.arange(3, dtype=np.uint8), bytearray(b"\xff")]))
    assert Path(dest).read_bytes() == b"abcd\x00\x01\x02\xff"


def test_atomic_write_applies_the_umask(tmp_path):
    old = os.umask(0o077)
    try:
        F.atomic_write(tmp_path / "private", b"x")
    finally:
        os.umask(old)
    assert (tmp_path / "private").stat().st_mode & 0o777 == 0o600


def test_atomic_write_failing_source_keeps_the_old_file_and_no_temp(tmp_path):
    dest = tmp_path / "keep.bin"
    dest.write_bytes(b"old")

    def chunks():
        yield b"partial"
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        F.atomic_write(dest, chunks())
    assert [p.name for p in tmp_path.iterdir()] == ["keep.bin"] and dest.read_bytes() == b"old"


def test_atomic_write_fsyncs_file_then_directory(tmp_path, monkeypatch):
    kinds = []
    real = os.fsync

    def spy(fd):
        kinds.append("dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "file")
        real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    F.atomic_write(tmp_path / "s", b"x")
    assert kinds == ["file", "dir"]


def test_killed_atomic_write_leaves_an_ignored_temp_named_after_a_long_name(tmp_path, repo_root):
    """SIGKILL at the fsync: the destination is untouched and the temporary file left is
    ``.<first 200 characters of the name>.<random>.tmp`` (fits NAME_MAX; git ignores it)."""
    name = "m" * 255
    (tmp_path / name).write_bytes(b"old")
    code = (
        "import os, signal, kdtr.format as F\n"
        "os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)\n"
        f"F.atomic_write({str(tmp_path / name)!r}, b'new')\n"
    )
    env = dict(os.environ, PYTHONPATH=str(repo_root))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert (tmp_path / name).read_bytes() == b"old"
    left = sorted(p.name for p in tmp_path.iterdir() if p.name != name)
    assert len(left) == 1 and left[0].startswith("." + "m" * 200 + ".") and left[0].endswith(".tmp"), left
    ignored = subprocess.run(
        ["git", "-C", str(repo_root), "check-ignore", "--no-index", "-q", f"golden/tree_accept/{left[0]}"]
    )
    assert ignored.returncode == 0


def test_atomic_write_together_publishes_all_or_keeps_all_old(tmp_path, monkeypatch):
    paths = [tmp_path / n for n in ("one", "two", "three")]
    for p in paths:
        p.write_bytes(b"old " + p.name.encode())
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def third():
        yield b"new three, half"
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        F.atomic_write_together([(paths[0], b"new one"), (paths[1], b"new two"), (paths[2], third())])
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # old set, no temp files

    F.atomic_write_together([(paths[0], b"new one"), (paths[1], b"new two"), (str(paths[2]), [b"new ", b"three"])])
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == {
        "one": b"new one", "two": b"new two", "three": b"new three"
    }


def test_atomic_write_together_renames_only_after_all_are_written_and_removes_nothing(tmp_path, monkeypatch):
    """Several files: no old file is removed (each is replaced by its own rename, made
    only once every file is written), so an interruption between renames leaves each file
    old or new, never missing; the set as a unit is kdtr.fsutil.ReportSet's job."""
    paths = [tmp_path / n for n in ("a", "b")]
    for p in paths:
        p.write_bytes(b"old")
    real = os.replace
    seen = []

    def replace_once(src, dst, **kw):
        seen.append(sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")))
        if len(seen) == 2:
            raise KeyboardInterrupt
        real(src, dst, **kw)

    real_unlink = os.unlink
    unlinked = []

    def unlink(name, **kw):
        unlinked.append(os.path.basename(name))
        real_unlink(name, **kw)

    monkeypatch.setattr(os, "unlink", unlink)
    monkeypatch.setattr(os, "replace", replace_once)
    with pytest.raises(KeyboardInterrupt):
        F.atomic_write_together([(paths[0], b"new a"), (paths[1], b"new b")])
    monkeypatch.undo()
    assert len(seen[0]) == 2  # both written before the first rename
    assert unlinked and all(n.endswith(".tmp") for n in unlinked)  # only b's own temporary file
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if not p.name.endswith(".tmp")} == {
        "a": b"new a", "b": b"old"}


def test_atomic_write_of_a_single_file_never_removes_the_old_one_first(tmp_path, monkeypatch):
    dest = tmp_path / "only"
    dest.write_bytes(b"old")
    monkeypatch.setattr(os, "unlink", lambda *a, **k: pytest.fail("unlinked"))
    F.atomic_write_together([(dest, b"new")])
    assert dest.read_bytes() == b"new"


def test_manifest_and_reports_are_written_through_the_helper(tmp_path, monkeypatch):
    """write_manifest and report.write_all go through kdtr.format's helper (one rule for
    temporary names, modes and fsync)."""
    from kdtr import fsutil, goldens, report
    from kdtr import run as runner

    calls = []
    real = fsutil.write_temp_at

    def spy(dir_fd, name, data):
        calls.append(name)
        return real(dir_fd, name, data)

    monkeypatch.setattr(fsutil, "write_temp_at", spy)
    goldens.write_manifest(tmp_path, {"files": {}})
    assert calls == ["MANIFEST.json"]
    assert (tmp_path / "MANIFEST.json").stat().st_mode & 0o777 == 0o666 & ~_umask()
    envd = dict(date="d", host="h", platform="p", python="3", numpy="2", run_id="r")
    case = runner.Case("tree_accept", "a", Path("x"), "cpu")
    report.write_all(tmp_path / "reports", [runner.CaseResult(case, "PASS")], envd)
    assert calls[1:] == list(report.REPORT_NAMES)
    for name in report.REPORT_NAMES:
        assert (tmp_path / "reports" / name).stat().st_mode & 0o777 == 0o666 & ~_umask()
