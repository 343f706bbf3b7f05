"""``kdtr convert`` (kdtr/convert.py, kdtr/cli/convert_cmd.py; docs/convert.md).

(a) Round trips KDTR -> npz -> KDTR and KDTR -> safetensors -> KDTR of every committed
    golden give the original file back, byte for byte (so the same tensors, dtypes, shapes,
    order and typed metadata); a synthetic file with every dtype, 0-d and empty tensors and
    every kind of metadata value (NaN payloads, infinities, -0.0, the i64 extremes) too.
(b) What other tools see: np.load reads the npz (bf16 as its uint16 bits, the reserved
    entries as standard JSON), safetensors reads the safetensors file (BF16 as BF16).
(c) Files from plain numpy / safetensors (no reserved entries) convert.
(d) Refusals: exit 2, one line on stderr naming the file (and the tensor or field), no
    destination and no temporary file left.
"""

from __future__ import annotations

import io
import json
import math
import struct
import zipfile
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import safetensors  # the test extra installs it (make venv): missing, these tests fail rather than skip
import safetensors.numpy
from click.testing import CliRunner

import kdtr
from kdtr import convert as kconvert
from kdtr.cli.convert_cmd import convert as convert_cmd

REPO_ROOT = Path(__file__).resolve().parents[2]
GOLDENS = sorted(REPO_ROOT.glob("golden/*/*.kdtr"))
BF16 = np.dtype(ml_dtypes.bfloat16)


def run(*args: str):
    return CliRunner().invoke(convert_cmd, [str(a) for a in args], catch_exceptions=False)


def refused(r, *fragments: str) -> str:
    """The one stderr line of a refusal (exit 2), checked to contain every fragment."""
    assert r.exit_code == 2, (r.exit_code, r.output)
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("kdtr: error: "), lines[0]
    for f in fragments:
        assert str(f) in lines[0], (f, lines[0])
    return lines[0]


def ok(r) -> None:
    assert r.exit_code == 0, (r.exit_code, r.output)


def files_in(d: Path) -> set[str]:
    return {p.name for p in d.iterdir()}


def assert_same(a: kdtr.KdtrFile, b: kdtr.KdtrFile) -> None:
    assert list(a.tensors) == list(b.tensors)
    for name, x in a.tensors.items():
        y = b.tensors[name]
        assert (x.dtype, x.shape) == (y.dtype, y.shape), name
        assert x.tobytes() == y.tobytes(), name
    assert list(a.metadata) == list(b.metadata)
    for k, v in a.metadata.items():
        w = b.metadata[k]
        assert type(v) is type(w), k
        if isinstance(v, float):
            assert struct.pack("<d", v) == struct.pack("<d", w), k
        else:
            assert v == w, k


# --- (a) round trips --------------------------------------------------------------------

def test_there_are_goldens():
    assert len(GOLDENS) >= 40
    assert any(BF16 in {t.dtype for t in kdtr.load(g, verify=False).tensors.values()} for g in GOLDENS)


@pytest.mark.parametrize("fmt", ["npz", "safetensors"])
@pytest.mark.parametrize("golden", GOLDENS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_golden_round_trip(tmp_path, golden, fmt):
    mid, back = tmp_path / f"g.{fmt}", tmp_path / "back.kdtr"
    ok(run(golden, mid))
    ok(run(mid, back))
    assert_same(kdtr.load(golden), kdtr.load(back))
    assert back.read_bytes() == golden.read_bytes()


def every_kind() -> tuple[list, list]:
    rng = np.random.default_rng(7)
    tensors = [
        ("b", np.array([[True, False, True]])),
        ("u8", np.arange(256, dtype=np.uint8)),
        ("i8", np.array([-128, 0, 127], dtype=np.int8)),
        ("i16", np.array([-(2**15), 2**15 - 1], dtype=np.int16)),
        ("u16", np.array([0, 2**16 - 1], dtype=np.uint16)),
        ("i32", rng.integers(-(2**31), 2**31, size=(3, 4), dtype=np.int32)),
        ("u32", np.array([2**32 - 1], dtype=np.uint32)),
        ("i64", np.array([-(2**63), 2**63 - 1], dtype=np.int64)),
        ("u64", np.array([2**64 - 1, 0], dtype=np.uint64)),
        ("f16", np.array([np.nan, -0.0, np.inf, 6.1e-5], dtype=np.float16)),
        ("bf16", np.array([[1.5, -np.inf], [np.nan, 3e38]], dtype=BF16)),
        ("bf16.0d", np.array(2.5, dtype=BF16)),
        ("f32", rng.standard_normal((2, 3, 4)).astype(np.float32)),
        ("f64", np.array([5e-324, -0.0, np.nan], dtype=np.float64)),
        ("scalar", np.array(7, dtype=np.int32)),
        ("empty", np.zeros((3, 0, 2), dtype=np.float32)),
        ("ünï/côdé name", np.array([1], dtype=np.int64)),
        ("nd8", np.ones((1, 2, 1, 2, 1, 2, 1, 2), dtype=np.uint8)),
    ]
    nan_payload = struct.unpack("<d", struct.pack("<Q", 0xFFF0_0000_DEAD_BEEF))[0]
    metadata = [
        ("op", "tree_accept"), ("unicode", "ünï ✓ \u2028 \"q\" \\"), ("empty", ""),
        ("t", True), ("f", False), ("zero", 0), ("one", 1),
        ("imin", -(2**63)), ("imax", 2**63 - 1),
        ("x", 0.1), ("one.f", 1.0), ("big", 1e300), ("tiny", 5e-324), ("negzero", -0.0),
        ("nan", math.nan), ("nan.payload", nan_payload), ("inf", math.inf), ("ninf", -math.inf),
    ]
    return tensors, metadata


@pytest.mark.parametrize("chain", [["npz"], ["safetensors"], ["npz", "safetensors"], ["safetensors", "npz"]])
def test_every_dtype_and_metadata_kind_round_trip(tmp_path, chain):
    tensors, metadata = every_kind()
    src = tmp_path / "src.kdtr"
    kdtr.save(src, tensors, metadata)
    prev = src
    for i, fmt in enumerate(chain):
        nxt = tmp_path / f"step{i}.{fmt}"
        ok(run(prev, nxt))
        prev = nxt
    back = tmp_path / "back.kdtr"
    ok(run(prev, back))
    assert_same(kdtr.load(src), kdtr.load(back))
    assert back.read_bytes() == src.read_bytes()


def test_compress(tmp_path):
    src = tmp_path / "z.kdtr"
    kdtr.save(src, [("zeros", np.zeros(100_000, np.float32)), ("h", np.ones(3, BF16))], [("k", 1.5)])
    ok(run(src, tmp_path / "plain.npz"))
    ok(run(src, tmp_path / "small.npz", "--compress"))
    with zipfile.ZipFile(tmp_path / "small.npz") as zf:
        assert {i.compress_type for i in zf.infolist()} == {zipfile.ZIP_DEFLATED}
    with zipfile.ZipFile(tmp_path / "plain.npz") as zf:
        assert {i.compress_type for i in zf.infolist()} == {zipfile.ZIP_STORED}
    assert (tmp_path / "small.npz").stat().st_size * 20 < (tmp_path / "plain.npz").stat().st_size
    ok(run(tmp_path / "small.npz", tmp_path / "back.kdtr"))
    assert (tmp_path / "back.kdtr").read_bytes() == src.read_bytes()


def test_npz_bytes_are_deterministic(tmp_path, monkeypatch):
    import time
    golden = GOLDENS[0]
    monkeypatch.setattr(time, "time", lambda: 1.0e9)
    ok(run(golden, tmp_path / "a.npz"))
    monkeypatch.setattr(time, "time", lambda: 1.7e9)  # another clock must not change the bytes
    ok(run(golden, tmp_path / "b.npz"))
    assert (tmp_path / "a.npz").read_bytes() == (tmp_path / "b.npz").read_bytes()


# --- (b) what numpy and safetensors see ---------------------------------------------------

def test_npz_as_numpy_reads_it(tmp_path):
    tensors, metadata = every_kind()
    src, dst = tmp_path / "s.kdtr", tmp_path / "s.npz"
    kdtr.save(src, tensors, metadata)
    ok(run(src, dst))
    with np.load(dst, allow_pickle=False) as f:
        assert f.files == [n for n, _ in tensors] + [kconvert.NPZ_METADATA, kconvert.NPZ_DTYPES]
        for name, arr in tensors:
            got = f[name]
            if arr.dtype == BF16:
                assert got.dtype == np.dtype("<u2") and got.shape == arr.shape
                assert got.tobytes() == arr.tobytes()
            else:
                assert got.dtype == arr.dtype and got.shape == arr.shape and got.tobytes() == arr.tobytes()
        # standard JSON: no NaN / Infinity literals
        meta = json.loads(str(f[kconvert.NPZ_METADATA]), parse_constant=lambda c: pytest.fail(f"literal {c}"))
        assert meta["nan"] == {"f64": "0x7ff8000000000000"} and meta["ninf"] == {"f64": "0xfff0000000000000"}
        assert meta["nan.payload"] == {"f64": "0xfff00000deadbeef"}
        assert meta["x"] == 0.1 and meta["t"] is True and meta["imin"] == -(2**63)
        assert json.loads(str(f[kconvert.NPZ_DTYPES])) == {"bf16": "bf16", "bf16.0d": "bf16"}


def test_npz_without_metadata_or_bf16_has_no_reserved_entries(tmp_path):
    src, dst = tmp_path / "s.kdtr", tmp_path / "s.npz"
    kdtr.save(src, [("a", np.arange(3, dtype=np.int32))])
    ok(run(src, dst))
    with np.load(dst) as f:
        assert f.files == ["a"]


def test_safetensors_as_safetensors_reads_it(tmp_path):
    tensors, metadata = every_kind()
    src, dst = tmp_path / "s.kdtr", tmp_path / "s.safetensors"
    kdtr.save(src, tensors, metadata)
    ok(run(src, dst))
    with safetensors.safe_open(dst, framework="np") as f:
        meta = f.metadata()
    assert set(meta) == {kconvert.ST_METADATA, kconvert.ST_ORDER}
    assert json.loads(meta[kconvert.ST_ORDER]) == [n for n, _ in tensors]
    typed = json.loads(meta[kconvert.ST_METADATA], parse_constant=lambda c: pytest.fail(f"literal {c}"))
    assert typed["one.f"] == 1.0 and isinstance(typed["one.f"], float) and typed["one"] == 1
    views = dict(safetensors.deserialize(dst.read_bytes()))
    assert views["bf16"]["dtype"] == "BF16" and views["u64"]["dtype"] == "U64" and views["b"]["dtype"] == "BOOL"
    for name, arr in tensors:
        assert bytes(views[name]["data"]) == arr.tobytes() and list(views[name]["shape"]) == list(arr.shape)


def test_golden_safetensors_loads_with_safetensors_numpy(tmp_path):
    golden = REPO_ROOT / "golden" / "tree_accept" / "default.kdtr"
    ok(run(golden, tmp_path / "g.safetensors"))
    got = safetensors.numpy.load_file(tmp_path / "g.safetensors")
    for name, arr in kdtr.load(golden).tensors.items():
        assert got[name].dtype == arr.dtype and np.array_equal(got[name], arr)


# --- (c) files from plain numpy and safetensors -------------------------------------------

def test_plain_npz_converts(tmp_path):
    src = tmp_path / "plain.npz"
    f_order = np.asfortranarray(np.arange(12, dtype=np.float64).reshape(3, 4))
    big = np.arange(5, dtype=">i4")
    np.savez(src, z=np.zeros(2, np.float16), a=f_order, big=big, s=np.float32(3.5), m=np.array([True, False]))
    ok(run(src, tmp_path / "p.kdtr"))
    f = kdtr.load(tmp_path / "p.kdtr")
    assert list(f.tensors) == ["z", "a", "big", "s", "m"] and f.metadata == {}
    assert np.array_equal(f.tensors["a"], f_order) and f.tensors["a"].flags.c_contiguous
    assert f.tensors["big"].dtype == np.dtype("<i4") and np.array_equal(f.tensors["big"], big)
    assert f.tensors["s"].shape == () and f.tensors["s"] == np.float32(3.5)
    np.savez_compressed(tmp_path / "c.npz", x=np.arange(4, dtype=np.uint64))
    ok(run(tmp_path / "c.npz", tmp_path / "c.kdtr"))
    assert kdtr.load(tmp_path / "c.kdtr").tensors["x"].tolist() == [0, 1, 2, 3]


def test_plain_safetensors_converts(tmp_path):
    src = tmp_path / "plain.safetensors"
    data = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "a": np.array([1, 2], dtype=np.int8),
            "h": np.ones(4, dtype=BF16), "e": np.zeros((0,), dtype=np.int64)}
    safetensors.numpy.save_file(data, src, metadata={"format": "pt", "note": "hi"})
    ok(run(src, tmp_path / "p.kdtr"))
    f = kdtr.load(tmp_path / "p.kdtr")
    assert f.metadata == {"format": "pt", "note": "hi"}
    assert set(f.tensors) == set(data)
    # no kdtr.order: data-offset order (safetensors lays out the widest dtypes first)
    assert list(f.tensors) == ["e", "w", "h", "a"]
    for name, arr in data.items():
        assert f.tensors[name].dtype == arr.dtype and f.tensors[name].tobytes() == arr.tobytes()


def test_npz_to_safetensors_and_back(tmp_path):
    np.savez(tmp_path / "a.npz", x=np.arange(3, dtype=np.int16))
    ok(run(tmp_path / "a.npz", tmp_path / "a.safetensors"))
    ok(run(tmp_path / "a.safetensors", tmp_path / "b.npz"))
    with np.load(tmp_path / "b.npz") as f:
        assert f.files == ["x"] and f["x"].dtype == np.int16 and f["x"].tolist() == [0, 1, 2]


# --- (d) refusals -------------------------------------------------------------------------

@pytest.mark.parametrize("bad", ["src", "dst"])
def test_bad_suffix(tmp_path, bad):
    golden = GOLDENS[0]
    src, dst = (tmp_path / "x.npy", tmp_path / "out.kdtr") if bad == "src" else (golden, tmp_path / "out.pt")
    if bad == "src":
        np.save(src, np.zeros(2))
    refused(run(src, dst), src if bad == "src" else dst, "suffix")
    assert not (tmp_path / "out.kdtr").exists() and not (tmp_path / "out.pt").exists()


def test_same_format_and_compress_misuse(tmp_path):
    refused(run(GOLDENS[0], tmp_path / "x.kdtr"), "nothing to convert")
    refused(run(GOLDENS[0], tmp_path / "x.safetensors", "--compress"), "x.safetensors", "--compress")
    assert files_in(tmp_path) == set()


@pytest.mark.parametrize("fmt", ["npz", "safetensors", "kdtr"])
def test_existing_destination_needs_force(tmp_path, fmt):
    src = GOLDENS[0] if fmt != "kdtr" else tmp_path / "src.npz"
    if fmt == "kdtr":
        np.savez(src, a=np.arange(3, dtype=np.int32))
    dst = tmp_path / f"dst.{fmt}"
    dst.write_bytes(b"precious")
    refused(run(src, dst), dst, "--force")
    assert dst.read_bytes() == b"precious"
    ok(run(src, dst, "--force"))
    assert dst.read_bytes() != b"precious"
    assert {p for p in files_in(tmp_path) if p.endswith(".tmp")} == set()


def test_object_array_refused(tmp_path):
    src = tmp_path / "o.npz"
    np.savez(src, good=np.arange(2), objs=np.array([{"a": 1}, None], dtype=object))
    refused(run(src, tmp_path / "o.kdtr"), str(src), "tensor 'objs'", "object array")
    assert files_in(tmp_path) == {"o.npz"}


@pytest.mark.parametrize("value, what", [
    (np.array([1 + 2j]), "<c16"),
    (np.array(["text"]), "<U4"),
    (np.array([(1, 2.0)], dtype=[("i", "<i4"), ("f", "<f4")]), "dtype"),
    (np.ones(2, dtype=BF16), "V2"),  # bf16 through plain numpy: the dtype is lost
    (np.array([1], dtype=np.float128) if hasattr(np, "float128") else np.array([1], dtype=np.complex64),
     "dtype"),
])
def test_unsupported_npz_dtype_refused(tmp_path, value, what):
    src = tmp_path / "u.npz"
    np.savez(src, ok=np.arange(2), bad=value)
    refused(run(src, tmp_path / "u.kdtr"), str(src), "tensor 'bad'", what, "no KDTR dtype")
    assert files_in(tmp_path) == {"u.npz"}


def test_unsupported_safetensors_dtype_refused(tmp_path):
    src = tmp_path / "u.safetensors"
    safetensors.numpy.save_file({"ok": np.arange(2, dtype=np.int32), "c": np.ones(2, dtype=np.complex64)}, src)
    refused(run(src, tmp_path / "u.kdtr"), str(src), "tensor 'c'", "C64", "no KDTR dtype")
    assert files_in(tmp_path) == {"u.safetensors"}


def _npz_with_member(path: Path, member: str, payload: bytes) -> None:
    with zipfile.ZipFile(path, "w") as zf:
        buf = io.BytesIO()
        np.lib.format.write_array(buf, np.arange(3, dtype=np.int32))
        zf.writestr("a.npy", buf.getvalue())
        zf.writestr(member, payload)


def _corrupt_cases(tmp_path: Path) -> dict[str, tuple[Path, tuple[str, ...]]]:
    golden = GOLDENS[0]
    cases: dict[str, tuple[Path, tuple[str, ...]]] = {}
    data = bytearray(golden.read_bytes())
    data[-1] ^= 0xFF
    (tmp_path / "flip.kdtr").write_bytes(bytes(data))
    cases["kdtr"] = (tmp_path / "flip.kdtr", ("TensorChecksumMismatch",))
    np.savez(tmp_path / "ok.npz", a=np.arange(1000, dtype=np.int64))
    npz = (tmp_path / "ok.npz").read_bytes()
    (tmp_path / "trunc.npz").write_bytes(npz[: len(npz) // 2])
    cases["npz truncated"] = (tmp_path / "trunc.npz", ("not a valid npz",))
    flipped = bytearray(npz)
    flipped[npz.index(b"\x93NUMPY") + 300] ^= 0xFF  # inside a's data: the member's CRC-32 fails
    (tmp_path / "crc.npz").write_bytes(bytes(flipped))
    cases["npz crc"] = (tmp_path / "crc.npz", ("tensor 'a'", "CRC"))
    (tmp_path / "text.npz").write_bytes(b"hello, not a zip\n")
    cases["npz not a zip"] = (tmp_path / "text.npz", ("not a valid npz",))
    _npz_with_member(tmp_path / "member.npz", "readme.txt", b"hi")
    cases["npz non-npy member"] = (tmp_path / "member.npz", ("member 'readme.txt'", ".npy"))
    _npz_with_member(tmp_path / "badnpy.npz", "b.npy", b"\x93NUMPY garbage")
    cases["npz bad npy"] = (tmp_path / "badnpy.npz", ("tensor 'b'", "not a valid .npy"))
    _npz_with_member(tmp_path / "meta.npz", "__kdtr_metadata__.npy", _npy(np.array("{not json")))
    cases["npz bad metadata"] = (tmp_path / "meta.npz", ("__kdtr_metadata__", "not JSON"))
    _npz_with_member(tmp_path / "metav.npz", "__kdtr_metadata__.npy", _npy(np.array('{"k": [1, 2]}')))
    cases["npz metadata list"] = (tmp_path / "metav.npz", ('__kdtr_metadata__["k"]', "[1, 2]"))
    _npz_with_member(tmp_path / "dt.npz", "__kdtr_dtypes__.npy", _npy(np.array('{"a": "bf16"}')))
    cases["npz bf16 record on i32"] = (tmp_path / "dt.npz", ("tensor 'a'", "recorded as bf16"))
    _npz_with_member(tmp_path / "dt2.npz", "__kdtr_dtypes__.npy", _npy(np.array('{"zz": "bf16"}')))
    cases["npz bf16 record of nothing"] = (tmp_path / "dt2.npz", ('__kdtr_dtypes__["zz"]', "no tensor"))
    st = safetensors.numpy.save({"a": np.arange(10, dtype=np.float32)}, metadata={"kdtr.order": '["b"]'})
    (tmp_path / "trunc.safetensors").write_bytes(st[:-3])
    cases["safetensors truncated"] = (tmp_path / "trunc.safetensors", ("not a valid safetensors",))
    (tmp_path / "order.safetensors").write_bytes(st)
    cases["safetensors bad order"] = (tmp_path / "order.safetensors", ('__metadata__["kdtr.order"]',))
    st = safetensors.numpy.save({"a": np.arange(1, dtype=np.float32)}, metadata={"kdtr.metadata": '{"x": null}'})
    (tmp_path / "meta.safetensors").write_bytes(st)
    cases["safetensors bad metadata"] = (tmp_path / "meta.safetensors",
                                         ('__metadata__["kdtr.metadata"]["x"]', "null"))
    return cases


def _npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, arr)
    return buf.getvalue()


CORRUPT = ["kdtr", "npz truncated", "npz crc", "npz not a zip", "npz non-npy member", "npz bad npy",
           "npz bad metadata", "npz metadata list", "npz bf16 record on i32", "npz bf16 record of nothing",
           "safetensors truncated", "safetensors bad order", "safetensors bad metadata"]


@pytest.mark.parametrize("case", CORRUPT)
def test_corrupt_input_refused(tmp_path, case):
    cases = _corrupt_cases(tmp_path)
    assert sorted(cases) == sorted(CORRUPT)
    src, fragments = cases[case]
    dst = tmp_path / ("out.npz" if src.suffix == ".kdtr" else "out.kdtr")
    before = files_in(tmp_path)
    refused(run(src, dst), str(src), *fragments)
    assert files_in(tmp_path) == before


@pytest.mark.parametrize("fmt, name", [("npz", "__kdtr_metadata__"), ("npz", "__kdtr_dtypes__"),
                                       ("safetensors", "__metadata__")])
def test_reserved_tensor_name_refused(tmp_path, fmt, name):
    src = tmp_path / "r.kdtr"
    kdtr.save(src, [("a", np.zeros(1, np.int8)), (name, np.zeros(1, np.int8))])
    dst = tmp_path / f"r.{fmt}"
    refused(run(src, dst), str(dst), f"tensor {name!r}", "reserved")
    assert files_in(tmp_path) == {"r.kdtr"}


def test_kdtr_writer_refusal_names_the_destination(tmp_path):
    src = tmp_path / "long.npz"
    np.savez(src, **{"n" * 300: np.zeros(1, np.int8)})
    dst = tmp_path / "long.kdtr"
    refused(run(src, dst), "WriteError", str(dst), "name")
    assert files_in(tmp_path) == {"long.npz"}
    bad_bool = tmp_path / "bool.safetensors"
    raw = safetensors.numpy.save({"m": np.array([False, True])})
    assert raw.endswith(b"\x00\x01")
    bad_bool.write_bytes(raw[:-1] + b"\x02")  # a BOOL byte 2: safetensors takes it, KDTR does not
    refused(run(bad_bool, tmp_path / "bool.kdtr"), "WriteError", "bool.kdtr", "'m'")


def test_missing_source_and_destination_directory(tmp_path):
    refused(run(tmp_path / "nope.npz", tmp_path / "x.kdtr"), "nope.npz")
    refused(run(GOLDENS[0], tmp_path / "no" / "dir" / "x.npz"), "x.npz")


def test_without_safetensors_package(tmp_path, monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "safetensors", None)
    refused(run(GOLDENS[0], tmp_path / "x.safetensors"), "x.safetensors", "pip install")
    ok(run(GOLDENS[0], tmp_path / "x.npz"))


def test_registered_in_the_kdtr_command():
    from kdtr.cli.main import main
    assert main.commands.get("convert") is convert_cmd


def test_library_api(tmp_path):
    contents = kconvert.convert(GOLDENS[0], tmp_path / "a.npz")
    assert [n for n, _ in contents.tensors] == list(kdtr.load(GOLDENS[0]).tensors)
    with pytest.raises(kconvert.ConvertError) as exc:
        kconvert.convert(GOLDENS[0], tmp_path / "a.npz")
    assert exc.value.path == str(tmp_path / "a.npz") and exc.value.field == "file"
    with pytest.raises(kconvert.ConvertError) as exc:
        kconvert.format_of("x.h5")
    assert exc.value.field == "suffix"
    meta = [("a", math.nan), ("b", -0.0), ("c", True), ("d", 3)]
    back = kconvert.decode_metadata(kconvert.encode_metadata(meta), "p", "w")
    assert [(k, type(v)) for k, v in back] == [(k, type(v)) for k, v in meta]
    assert math.isnan(back[0][1]) and math.copysign(1, back[1][1]) == -1
