"""The fast paths of the KDTR format (checksums, the header in one pass).

CRC-32: kdtr/format/layout.py picks zlib's CRC-32 with python-isal (``isal_zlib.crc32``) and
falls back to ``zlib.crc32`` where isal cannot be imported; cuda_tests/include/kdtr.hpp
uses ISA-L's ``crc32_gzip_refl`` when the Makefile's probe finds it (``-DKDTR_HAVE_ISAL``)
and zlib's ``crc32`` otherwise. Both pairs must give the same values on every input, and
files written under one must read under the other.

Header: ``_parse_body_fast`` reads the header body in one pass of precompiled struct
formats and returns None for anything that breaks a rule, in which case the field-by-field
reader ``_parse_body_checked`` names the defect. The two must agree (same entries and
metadata, or None exactly where the checked reader raises), and the fast codecs must agree
byte for byte with the construct declaration ``HeaderBodyLayout``.
"""

from __future__ import annotations

import math
import mmap
import random
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

import kdtr
import kdtr.format as F
import malformed as M
from conftest import REPO_ROOT
from kdtr.format import layout as FL
from kdtr.format import read as FR

GOLDENS = sorted(g for g in (REPO_ROOT / "golden").glob("**/*.kdtr") if ".cache" not in g.parts)
_NP = {c: d.numpy for c, d in F.DTYPE_BY_CODE.items()}


# --- CRC-32: isal's and zlib's are the same function ---------------------------------------


def test_isal_is_the_crc_in_use():
    """isal is a declared dependency: an import that silently fell back would cost 4x."""
    assert F.CRC32_IMPL == "isal"
    assert FL._crc32 is FL._isal_crc32 and FL._crc32 is not zlib.crc32


def test_isal_crc32_equals_zlib_on_random_data():
    rng = np.random.default_rng(12)
    buf = rng.integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()
    view = memoryview(buf)
    assert FL._isal_crc32(b"123456789") == zlib.crc32(b"123456789") == 0xCBF43926  # the check value
    for start in range(0, 64):  # every alignment
        for n in list(range(0, 300)) + [511, 512, 513, 4095, 4096, 4097, 65537]:
            chunk = view[start : start + n]
            assert FL._isal_crc32(chunk) == zlib.crc32(chunk), (start, n)
    assert FL._isal_crc32(view) == zlib.crc32(view)
    for value in (0, 1, 0xDEADBEEF, 0xFFFFFFFF):  # the running value of a chunked CRC
        assert FL._isal_crc32(view[:1000], value) == zlib.crc32(view[:1000], value)
    arr = rng.integers(0, 256, (64, 33), dtype=np.uint8)  # the writer passes numpy arrays
    assert FL._isal_crc32(arr) == zlib.crc32(arr)


@pytest.mark.slow  # CRCs a mapping over 2 GiB twice (ISA-L and zlib)
def test_isal_crc32_on_a_large_mapping():
    """An mmap view longer than 2**31 bytes (load() hands the CRC views of a mapping):
    one call covers it, with the value zlib computes. The anonymous mapping reads as the
    zero page, so it costs no memory."""
    n = (1 << 31) + 12345
    mm = mmap.mmap(-1, n)
    try:
        for at in (0, 4097, (1 << 31) - 1, (1 << 31) + 7, n - 1):
            mm[at] = 0xA5
        with memoryview(mm) as view:
            assert FL._isal_crc32(view) == zlib.crc32(view)
            assert FL._isal_crc32(view[3:]) == zlib.crc32(view[3:])
    finally:
        mm.close()


def _save_and_load_under(monkeypatch, crc, path: Path, tensors, metadata):
    monkeypatch.setattr(FL, "_crc32", crc)
    kdtr.save(path, tensors, metadata)
    with kdtr.load(path, verify=True) as f:
        return path.read_bytes(), {k: v.tobytes() for k, v in f.tensors.items()}


def test_zlib_fallback_writes_and_reads_the_same_files(tmp_path, monkeypatch):
    rng = np.random.default_rng(5)
    tensors = {
        "a": rng.standard_normal((7, 129)).astype(np.float32),
        "b": rng.integers(0, 2, 1000).astype(bool),
        "c": rng.integers(-(2**62), 2**62, (3, 5, 7), dtype=np.int64),
        "empty": np.zeros((0, 4), np.uint16),
    }
    meta = {"op": "x", "seed": 3}
    got_isal = _save_and_load_under(monkeypatch, FL._isal_crc32, tmp_path / "i.kdtr", tensors, meta)
    got_zlib = _save_and_load_under(monkeypatch, zlib.crc32, tmp_path / "z.kdtr", tensors, meta)
    assert got_isal == got_zlib
    monkeypatch.setattr(FL, "_crc32", zlib.crc32)  # each reads the other's file
    with kdtr.load(tmp_path / "i.kdtr", verify=True):
        pass
    monkeypatch.setattr(FL, "_crc32", FL._isal_crc32)
    with kdtr.load(tmp_path / "z.kdtr", verify=True):
        pass


@pytest.mark.parametrize("golden", GOLDENS, ids=[str(g.relative_to(REPO_ROOT / "golden")) for g in GOLDENS])
def test_zlib_fallback_agrees_on_the_goldens(monkeypatch, golden):
    """Under either CRC every committed golden verifies and rewrites to its own bytes."""
    data = golden.read_bytes()
    for crc in (zlib.crc32, FL._isal_crc32):
        monkeypatch.setattr(FL, "_crc32", crc)
        with kdtr.load(golden, verify=True) as f:
            assert F.to_bytes(f.tensors, f.metadata) == data


def test_without_isal_the_import_falls_back_to_zlib():
    """A process where `import isal` fails: CRC32_IMPL is "zlib" and the files are the same."""
    golden = GOLDENS[0]
    code = f"""
import sys
sys.modules["isal"] = None  # makes `import isal` raise ImportError
sys.modules["isal.isal_zlib"] = None
import zlib
import kdtr, kdtr.format as F, kdtr.format.layout as FL
assert F.CRC32_IMPL == "zlib" and FL._crc32 is zlib.crc32, F.CRC32_IMPL
with kdtr.load({str(golden)!r}, verify=True) as f:
    assert F.to_bytes(f.tensors, f.metadata) == open({str(golden)!r}, "rb").read()
print("zlib ok")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "zlib ok", r.stderr


# --- the one-pass header codecs against the construct declaration ---------------------


def _random_name(rng: random.Random, used: set[str]) -> str:
    alphabet = "abcXYZ_.019" + "\u00e9\u4e2d\U0001f600\u0000\n"
    while True:
        name = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 20)))
        if rng.random() < 0.02:
            name = "n" * 200 + "\u00e9" * 27  # 254 bytes of UTF-8
        if name not in used:
            used.add(name)
            return name


def _random_contents(rng: random.Random, n_tensors: int, n_meta: int):
    names: set[str] = set()
    tensors = {}
    for _ in range(n_tensors):
        code = rng.randint(1, 13)
        ndim = rng.randint(0, F.MAX_NDIM)
        shape = tuple(rng.choice([0, 1, 1, 2, 3]) if rng.random() < 0.2 else rng.randint(1, 3) for _ in range(ndim))
        size = math.prod(shape)
        raw = np.frombuffer(rng.randbytes(size * _NP[code].itemsize), np.uint8)
        if code == 1:
            raw = raw & 1
        tensors[_random_name(rng, names)] = raw.view(_NP[code]).reshape(shape)
    keys: set[str] = set()
    meta = {}
    for _ in range(n_meta):
        kind = rng.randint(1, 4)
        value = (
            rng.randint(-(2**63), 2**63 - 1) if kind == 1
            else struct.unpack("<d", rng.randbytes(8))[0] if kind == 2
            else "".join(rng.choice("ab\u00e9\u4e2d\n\"") for _ in range(rng.randint(0, 30))) if kind == 3
            else rng.random() < 0.5
        )
        meta[_random_name(rng, keys)] = value
    return tensors, meta


def _canon_meta(meta: dict) -> list:
    """Metadata comparable bit for bit (NaN payloads included)."""
    return [(k, type(v).__name__, struct.pack("<d", v) if isinstance(v, float) else v) for k, v in meta.items()]


def _split(data: bytes) -> tuple[bytes, int, int, int]:
    """(header body, file size, data_start, minor version) of a file's bytes."""
    minor, hl = struct.unpack_from("<HI", data, 10)
    return data[F.PREAMBLE_LEN : F.PREAMBLE_LEN + hl - 4], len(data), F.PREAMBLE_LEN + hl, minor


def _both(body: bytes, size: int, data_start: int, minor: int):
    """(fast result, checked result or the exception it raised)."""
    fast = FR._parse_body_fast(body, size, data_start, minor)
    try:
        checked = FR._parse_body_checked("<t>", body, size, data_start, minor)
    except kdtr.KdtrError as exc:
        checked = exc
    return fast, checked


def _assert_agree(fast, checked, what) -> None:
    if isinstance(checked, kdtr.KdtrError):
        assert fast is None, f"{what}: the fast parse accepted a header the checked reader rejects: {checked}"
        return
    assert fast is not None, f"{what}: the fast parse refused a valid header"
    assert fast[0] == checked[0], what
    assert _canon_meta(fast[1]) == _canon_meta(checked[1]), what


def _layout_values(tensors: dict, meta: dict, data: bytes) -> dict:
    """HeaderBodyLayout's values for this content, worked out from the spec (offsets of
    the canonical layout, CRCs by zlib), not read back from the file."""
    entries_len = sum(2 + len(k.encode()) + 2 + 8 * a.ndim + 20 for k, a in tensors.items())
    meta_len = 0
    for k, v in meta.items():
        meta_len += 2 + len(k.encode()) + 1 + (
            1 if isinstance(v, bool) else 8 if isinstance(v, (int, float)) else 4 + len(v.encode())
        )
    cursor = F.PREAMBLE_LEN + 8 + entries_len + meta_len + 4
    ts = []
    for name, arr in tensors.items():
        off = M.align(cursor)
        raw = arr.tobytes()
        ts.append({
            "name_len": len(name.encode()), "name": name.encode(), "dtype": F.code_of_dtype(arr.dtype),
            "ndim": arr.ndim, "shape": list(arr.shape), "offset": off, "nbytes": len(raw), "crc32": zlib.crc32(raw),
        })
        assert data[off : off + len(raw)] == raw
        cursor = off + len(raw)
    ms = []
    for k, v in meta.items():
        kind = F.META_BOOL if isinstance(v, bool) else F.META_INT if isinstance(v, int) else \
            F.META_FLOAT if isinstance(v, float) else F.META_STRING
        value = int(v) if kind == F.META_BOOL else {"length": len(v.encode()), "raw": v.encode()} \
            if kind == F.META_STRING else v
        ms.append({"key_len": len(k.encode()), "key": k.encode(), "type": kind, "value": value})
    return {"tensor_count": len(ts), "metadata_count": len(ms), "tensors": ts, "metadata": ms, "extension": b""}


@pytest.mark.parametrize("seed", range(40))
def test_writer_header_is_the_construct_layout(seed):
    """encode()'s one-pass header bytes == HeaderBodyLayout.build of the spec's values."""
    rng = random.Random(seed)
    tensors, meta = _random_contents(rng, rng.randint(0, 12), rng.randint(0, 8))
    data = F.to_bytes(tensors, meta)
    body, size, data_start, minor = _split(data)
    assert body == F.HeaderBodyLayout.build(_layout_values(tensors, meta, data))
    assert struct.unpack_from("<I", data, data_start - 4)[0] == zlib.crc32(data[: data_start - 4])


class _Sub(np.ndarray):
    """An ndarray subclass: the writer's one-step case skips it, the checked helpers take it."""


@pytest.mark.parametrize("seed", range(20))
def test_writer_one_step_case_equals_the_checked_helpers(seed):
    """encode() writes the same bytes whether a tensor takes its one-step case (str name,
    C-contiguous ndarray of a stored dtype) or the checked helpers (a subclass, a
    big-endian or Fortran-order copy of the same values)."""
    rng = random.Random(3000 + seed)
    tensors, meta = _random_contents(rng, rng.randint(1, 10), 2)
    want = F.to_bytes(tensors, meta)
    for convert in (
        lambda a: a.view(_Sub),
        lambda a: a.astype(a.dtype.newbyteorder(">")) if a.dtype.itemsize > 1 and a.dtype != _NP[11] else a.view(_Sub),
        lambda a: np.asfortranarray(a) if a.ndim > 1 else a.view(_Sub),
    ):
        assert F.to_bytes({k: convert(v) for k, v in tensors.items()}, meta) == want


@pytest.mark.parametrize("seed", range(40))
def test_fast_parse_reads_what_construct_reads(seed):
    """On valid random headers: the fast parse, the checked reader and construct's own
    parse of HeaderBodyLayout give the same fields."""
    rng = random.Random(1000 + seed)
    tensors, meta = _random_contents(rng, rng.randint(0, 12), rng.randint(0, 8))
    data = F.to_bytes(tensors, meta)
    body, size, data_start, minor = _split(data)
    fast, checked = _both(body, size, data_start, minor)
    _assert_agree(fast, checked, f"seed {seed}")
    parsed = F.HeaderBodyLayout.parse(body)
    entries, metadata = fast
    assert [(e.name, e.dtype_code, e.shape, e.offset, e.nbytes, e.crc32) for e in entries] == [
        (t.name.decode(), t.dtype, tuple(t.shape), t.offset, t.nbytes, t.crc32) for t in parsed.tensors
    ]
    want_meta = {}
    for m in parsed.metadata:
        v = m.value
        want_meta[m.key.decode()] = (
            bool(v) if m.type == F.META_BOOL else v.raw.decode() if m.type == F.META_STRING else v
        )
    assert _canon_meta(metadata) == _canon_meta(want_meta)
    assert parsed.extension == b""
    # and the file positions the errors of a later check (verify) name
    for e, t in zip(entries, parsed.tensors):
        assert data[e.entry_offset : e.entry_offset + 2] == struct.pack("<H", t.name_len)
        assert data[e.crc_offset : e.crc_offset + 4] == struct.pack("<I", t.crc32)


_EDGE_U64 = [0, 1, 63, 64, 65, 2**31, 2**32 - 1, 2**32, 2**62, 2**63 - 1, 2**63, 2**64 - 64, 2**64 - 1]


def _damage(rng: random.Random, body: bytearray) -> bytearray:
    b = bytearray(body)
    kind = rng.randrange(7)
    if kind == 0 and b:  # flip a bit
        b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    elif kind == 1 and b:  # set a byte
        b[rng.randrange(len(b))] = rng.choice([0, 1, 2, 8, 9, 13, 14, 0x7F, 0x80, 0xC0, 0xFF])
    elif kind == 2 and len(b) >= 8:  # overwrite a u64 (shape, offset, nbytes, int metadata)
        at = rng.randrange(len(b) - 7)
        b[at : at + 8] = struct.pack("<Q", rng.choice(_EDGE_U64))
    elif kind == 3 and len(b) >= 2:  # overwrite a u16 (a name or key length)
        at = rng.randrange(len(b) - 1)
        b[at : at + 2] = struct.pack("<H", rng.choice([0, 1, 2, 254, 255, 256, 65535]))
    elif kind == 4 and b:  # cut the body short
        del b[rng.randrange(len(b)) :]
    elif kind == 5:  # insert bytes
        at = rng.randrange(len(b) + 1)
        b[at:at] = rng.randbytes(rng.randint(1, 9))
    elif b:  # delete bytes
        at = rng.randrange(len(b))
        del b[at : at + rng.randint(1, 9)]
    return b


@pytest.mark.parametrize("seed", range(30))
def test_fast_parse_never_accepts_what_the_checked_reader_rejects(seed):
    """Random damage to valid headers (one to three hits each, minor version 0 and 1):
    the fast parse returns None exactly where the checked reader raises, else the same
    result. (The load() tests of tests/malformed.py hold this for every error rule.)"""
    rng = random.Random(5000 + seed)
    tensors, meta = _random_contents(rng, rng.randint(1, 10), rng.randint(0, 6))
    data = F.to_bytes(tensors, meta)
    body, size, data_start, _ = _split(data)
    rejected = 0
    for trial in range(150):
        b = bytearray(body)
        for _ in range(rng.randint(1, 3)):
            b = _damage(rng, b)
        minor = rng.choice([0, 0, 1])
        fast, checked = _both(bytes(b), size, data_start, minor)
        _assert_agree(fast, checked, f"seed {seed} trial {trial}")
        rejected += isinstance(checked, kdtr.KdtrError)
    assert rejected > 0


def test_fast_parse_on_every_malformed_case():
    """Every case of tests/malformed.py whose defect is in the header body: None."""
    for case_id, data, _expected in M.CASES:
        if len(data) < F.PREAMBLE_LEN:
            continue
        minor, hl = struct.unpack_from("<HI", data, 10)
        if not F.MIN_HEADER_LEN <= hl <= min(F.MAX_HEADER_LEN, len(data) - F.PREAMBLE_LEN):
            continue
        body = data[F.PREAMBLE_LEN : F.PREAMBLE_LEN + hl - 4]
        fast, checked = _both(body, len(data), F.PREAMBLE_LEN + hl, minor)
        _assert_agree(fast, checked, case_id)


def test_valid_files_never_take_the_checked_reader(tmp_path, monkeypatch):
    """The fast parse reads every valid file (the goldens, a 4096-tensor file, an
    extension in a 1.1 file) on its own: the field-by-field reader is for errors."""
    def refuse(*args, **kwargs):
        raise AssertionError("the checked reader ran on a valid file")

    tensors = {f"t{i}": np.full((i % 5, 3), i, np.int16) for i in range(F.MAX_TENSORS)}
    many = tmp_path / "many.kdtr"
    kdtr.save(many, tensors, {f"k{i}": i for i in range(F.MAX_METADATA)})
    minor_ext = tmp_path / "ext.kdtr"
    f = M.valid_file()
    f.minor = 1
    f.extension = b"\x01\x02\x03"
    minor_ext.write_bytes(f.render())
    monkeypatch.setattr(FR, "_parse_body_checked", refuse)
    for path in [*GOLDENS, many, minor_ext]:
        with kdtr.load(path, verify=True) as got:
            assert got.tensors or got.metadata


# --- C++: kdtr.hpp's CRC-32 (ISA-L where the build found it, zlib otherwise) -------------

CPP_CRC_CHECK = r"""
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>
#include "kdtr.hpp"

// crc32_isal (ISA-L) and the split CRC of crc32_bytes against zlib's, one thread.
int main() {
  using kdtr::detail::crc32_bytes;
  using kdtr::detail::crc32_zlib;
  int bad = 0;
  const uint8_t check[] = "123456789";
  if (crc32_zlib(check, 9) != 0xCBF43926u) ++bad;
  std::mt19937_64 rng(7);
  const uint64_t min = kdtr::detail::kCrcParallelMin;
  std::vector<uint8_t> buf(min + (1u << 20) + 64);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
#if defined(KDTR_HAVE_ISAL) && KDTR_HAVE_ISAL
  using kdtr::detail::crc32_isal;
  if (crc32_isal(check, 9) != 0xCBF43926u) ++bad;
  for (size_t off = 0; off < 64; ++off)           // every alignment
    for (size_t n = 0; n <= 1100; ++n)             // every short length
      if (crc32_isal(buf.data() + off, n) != crc32_zlib(buf.data() + off, n)) ++bad;
  for (size_t n : {4095u, 4096u, 4097u, 65537u, 1u << 20})
    if (crc32_isal(buf.data() + 3, n) != crc32_zlib(buf.data() + 3, n)) ++bad;
#endif
  // the split CRC: 1..5 threads, around the threshold, odd lengths and alignments
  for (uint64_t n : {min - 1, min, min + 1, min + 12345, min + (1u << 20) + 63})
    for (unsigned k = 1; k <= 5; ++k)
      if (crc32_bytes(buf.data() + 1, n, k) != crc32_zlib(buf.data() + 1, n)) ++bad;
  // Longer than 2**32 bytes (zlib's crc32 takes 32-bit lengths: crc32_zlib feeds chunks;
  // crc32_gzip_refl takes a 64-bit length).  calloc'd pages read as the zero page.
  const uint64_t big = (uint64_t{1} << 32) + 4099;
  uint8_t* p = static_cast<uint8_t*>(std::calloc(big, 1));
  if (!p) { std::printf("no memory\n"); return 3; }
  p[5] = 1; p[(uint64_t{1} << 31) + 11] = 2; p[(uint64_t{1} << 32) + 1] = 3; p[big - 1] = 4;
  const uint32_t a = crc32_bytes(p, big, 1), b = crc32_zlib(p, big), c = crc32_bytes(p, big, 3);
  std::free(p);
  if (a != b || c != b) ++bad;
  std::printf("%s %d %08x %08x %08x %s\n", bad ? "MISMATCH" : "ok", bad, a, b, c,
              kdtr::crc32_implementation().c_str());
  return bad ? 1 : 0;
}
"""


def _build_crc() -> str:
    stamp = (REPO_ROOT / "build" / "config.stamp").read_text()
    crc = next((w.split("=", 1)[1] for w in stamp.split() if w.startswith("crc32=")), None)
    assert crc in ("isal", "zlib"), f"build/config.stamp names no CRC-32 implementation: {stamp!r}"
    return crc


def test_kdtr_check_version_names_the_crc(kdtr_check):
    r = subprocess.run([str(kdtr_check), "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr == "", r
    line = r.stdout.strip()
    assert line.startswith("kdtr_check: KDTR 1.0 reader and writer; CRC-32: "), line
    want = "isa-l " if _build_crc() == "isal" else "zlib "
    assert line.split("CRC-32: ", 1)[1].startswith(want), line


def _run_cpp_check(tmp_path: Path, isal: bool) -> str:
    src = tmp_path / "crc_check.cpp"
    src.write_text(CPP_CRC_CHECK)
    exe = tmp_path / ("crc_check_isal" if isal else "crc_check_zlib")
    subprocess.run(
        ["g++", "-std=c++17", "-O2", *(["-DKDTR_HAVE_ISAL=1"] if isal else []),
         f"-I{REPO_ROOT / 'cuda_tests' / 'include'}", str(src), "-o", str(exe),
         *(["-lisal"] if isal else []), "-lz", "-lpthread"],
        check=True, timeout=300,
    )
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.startswith("ok 0 "), r.stdout + r.stderr
    return r.stdout


@pytest.mark.slow  # compiles a C++ check and CRCs a buffer over 4 GiB
def test_cpp_isal_crc32_equals_zlib(tmp_path):
    """crc32_gzip_refl(0, p, n) == zlib's crc32(0, p, n): every alignment and short length,
    the check value, a buffer over 4 GiB; and the split CRC of 2..5 threads. Runs where
    the build found ISA-L."""
    if _build_crc() != "isal":
        pytest.skip("the build did not find ISA-L (build/config.stamp: crc32=zlib)")
    assert "isa-l" in _run_cpp_check(tmp_path, isal=True)


@pytest.mark.slow  # compiles a C++ check and CRCs a buffer over 4 GiB
def test_cpp_zlib_split_crc32(tmp_path):
    """Without ISA-L: the split CRC (crc32_combine of the parts) == zlib's, 1..5 threads."""
    assert "zlib" in _run_cpp_check(tmp_path, isal=False)


@pytest.mark.slow  # builds kdtr_check with make
def test_zlib_fallback_build_reads_the_goldens(tmp_path, kdtr_check):
    """`make KDTR_CRC=zlib` (what a machine without ISA-L builds): kdtr_check says zlib,
    verifies every golden, rewrites one to the same bytes as the ISA-L build, and still
    finds a bad tensor checksum."""
    build = tmp_path / "b"
    r = subprocess.run(
        ["make", "-s", "NO_CUDA=1", "KDTR_CRC=zlib", f"BUILD={build}", f"{build}/bin/kdtr_check"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "crc32=zlib" in (build / "config.stamp").read_text()
    exe = build / "bin" / "kdtr_check"
    v = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=60)
    assert "CRC-32: zlib " in v.stdout, v.stdout
    for g in GOLDENS:
        c = subprocess.run([str(exe), str(g)], capture_output=True, text=True, timeout=60)
        assert c.returncode == 0, f"{g}: {c.stderr}"
    g = GOLDENS[0]
    for tool, out in ((exe, tmp_path / "z.kdtr"), (kdtr_check, tmp_path / "i.kdtr")):
        subprocess.run([str(tool), "--copy", str(g), str(out)], check=True, timeout=60)
    assert (tmp_path / "z.kdtr").read_bytes() == (tmp_path / "i.kdtr").read_bytes() == g.read_bytes()
    case = next(d for cid, d, want in M.CASES if want == "TensorChecksumMismatch")
    bad = tmp_path / "bad.kdtr"
    bad.write_bytes(case)
    c = subprocess.run([str(exe), str(bad)], capture_output=True, text=True, timeout=60)
    assert c.returncode == 2 and c.stderr.startswith("TensorChecksumMismatch: "), c.stderr
