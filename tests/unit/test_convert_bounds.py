"""``kdtr convert`` refuses malformed and oversized sources with one line, exit 2, naming the
file and the field, before allocating or inflating what they declare (kdtr/convert.py;
docs/convert.md "Refusals" and "Bounds").

The inputs are built small in tmp_path; the zip bombs are built in a fraction of a second
from one deflated MiB of zeros repeated (each copy a self-contained run of deflate blocks),
and their refusal is measured to allocate little (tracemalloc counts numpy's and zlib's
buffers too).
"""

from __future__ import annotations

import io
import json
import os
import struct
import threading
import tracemalloc
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy
from click.testing import CliRunner

import kdtr
from kdtr.cli.convert_cmd import convert as convert_cmd

MIB = 1 << 20


def run(*args: object):
    return CliRunner().invoke(convert_cmd, [str(a) for a in args], catch_exceptions=False)


def refused(r, *fragments: str, absent: tuple[str, ...] = ()) -> str:
    """The one stderr line of a refusal (exit 2), checked to hold every fragment."""
    assert r.exit_code == 2, (r.exit_code, r.output)
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("kdtr: error: "), lines[0]
    for f in fragments:
        assert f in lines[0], (f, lines[0])
    for f in absent:
        assert f not in lines[0], (f, lines[0])
    return lines[0]


def npy_header(shape: tuple[int, ...], descr: str = "|u1", pad_to: int = 0) -> bytes:
    """A version 1.0 .npy preamble and header for ``shape`` (``pad_to``: at least so many
    header bytes, spaces before the newline)."""
    h = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape!r}, }}"
    h += " " * max(0, pad_to - len(h) - 1)
    h += " " * ((64 - (10 + len(h) + 1) % 64) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h.encode("latin-1")


def npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, arr)
    return buf.getvalue()


def zip_one(path: Path, name: bytes, data: bytes, crc: int, size: int, method: int = 8, flags: int = 0) -> None:
    """A zip of one member written by hand: ``data`` (already compressed by ``method``),
    with the CRC-32 and the uncompressed ``size`` the headers declare."""
    local = struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, flags, method, 0, 0x21, crc, len(data), size,
                        len(name), 0) + name
    central = struct.pack("<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 20, 20, flags, method, 0, 0x21, crc, len(data),
                          size, len(name), 0, 0, 0, 0, 0, 0) + name
    end = struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, 1, 1, len(central), len(local) + len(data), 0)
    path.write_bytes(local + data + central + end)


def deflated_zeros(head: bytes, mib: int) -> tuple[bytes, int]:
    """A raw deflate stream of ``head`` then zeros, ``mib`` MiB in all, and its CRC-32."""
    first = zlib.compressobj(9, zlib.DEFLATED, -15)
    block0 = head + bytes(MIB - len(head))
    out = [first.compress(block0) + first.flush(zlib.Z_FULL_FLUSH)]
    z = zlib.compressobj(9, zlib.DEFLATED, -15)
    zeros = z.compress(bytes(MIB)) + z.flush(zlib.Z_FULL_FLUSH)  # ~1 KiB, independent of what precedes
    out += [zeros] * (mib - 1)
    out.append(zlib.compressobj(9, zlib.DEFLATED, -15).flush(zlib.Z_FINISH))
    crc = zlib.crc32(block0)
    zero = bytes(MIB)
    for _ in range(mib - 1):
        crc = zlib.crc32(zero, crc)
    return b"".join(out), crc


def peak_bytes(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# --- the six inputs that gave tracebacks or a wrong message -----------------------------

def test_corrupt_deflated_member(tmp_path):
    src = tmp_path / "z.npz"
    with zipfile.ZipFile(src, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("a.npy", npy(np.arange(1000)))
    data = bytearray(src.read_bytes())
    at = data.index(b"a.npy") + len(b"a.npy") + 10  # inside the deflate stream
    data[at:at + 3] = bytes(b ^ m for b, m in zip(data[at:at + 3], (0xFF, 0xFF, 0x55)))
    src.write_bytes(bytes(data))
    refused(run(src, tmp_path / "z.kdtr"), str(src), "tensor 'a'", "unreadable zip member")
    assert not (tmp_path / "z.kdtr").exists()


def test_header_declaring_far_more_than_the_member_holds(tmp_path):
    src = tmp_path / "h.npz"
    with zipfile.ZipFile(src, "w") as zf:
        zf.writestr("a.npy", npy_header((10**12,)) + bytes(16))
    refused(run(src, tmp_path / "h.kdtr"), str(src), "tensor 'a'", "1000000000000 bytes", "holds 16 bytes")


def test_zip_bomb_is_refused_before_inflating(tmp_path):
    """1.5 MiB inflating to 1.5 GiB, sizes declared truthfully: refused from the sizes the
    zip declares, before a byte is inflated."""
    src = tmp_path / "bomb.npz"
    total = 1536 * MIB
    head = npy_header((total - len(npy_header((total,))),))
    assert len(head) == len(npy_header((total,)))
    data, crc = deflated_zeros(head, 1536)
    zip_one(src, b"a.npy", data, crc, total)
    assert src.stat().st_size < 2 * MIB
    result = {}
    peak = peak_bytes(lambda: result.setdefault("r", run(src, tmp_path / "bomb.kdtr")))
    refused(result["r"], str(src), "member 'a.npy'", "1610612736 bytes", "KDTR_MAX_CONVERT_BYTES",
            "nothing was inflated")
    assert peak < 32 * MIB, peak
    assert not (tmp_path / "bomb.kdtr").exists()


def test_zip_bomb_with_lying_sizes_inflates_only_what_it_declares(tmp_path):
    """The same stream, its headers declaring 1 MiB: reading stops at the declared size
    (the CRC-32 of what was read then fails), so memory stays bounded by the declaration."""
    src = tmp_path / "liar.npz"
    head = npy_header((MIB - len(npy_header((MIB,))),))
    data, crc = deflated_zeros(head, 1536)
    zip_one(src, b"a.npy", data, crc, MIB)
    result = {}
    peak = peak_bytes(lambda: result.setdefault("r", run(src, tmp_path / "liar.kdtr")))
    refused(result["r"], str(src), "tensor 'a'", "CRC")
    assert peak < 32 * MIB, peak


def test_safetensors_shape_beyond_64_bits(tmp_path):
    raw = safetensors.numpy.save({"a": np.zeros(0, np.float32)})
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    header["a"]["shape"] = [0, 2**63]
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    src = tmp_path / "s.safetensors"
    src.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n:])
    refused(run(src, tmp_path / "s.kdtr"), str(src), "tensor 'a'", "2**63 - 1")


def test_deeply_nested_order_metadata(tmp_path):
    src = tmp_path / "d.safetensors"
    src.write_bytes(safetensors.numpy.save({"a": np.zeros(2, np.float32)},
                                           metadata={"kdtr.order": "[" * 100_000 + "]" * 100_000}))
    refused(run(src, tmp_path / "d.kdtr"), str(src), '__metadata__["kdtr.order"]', "nested too deep")


def test_npz_header_over_numpys_limit_is_not_called_a_pickle(tmp_path):
    src = tmp_path / "big.npz"
    with zipfile.ZipFile(src, "w") as zf:
        zf.writestr("a.npy", npy_header((3,), pad_to=12_000) + b"\1\2\3")
    refused(run(src, tmp_path / "big.kdtr"), str(src), "tensor 'a'", "header", "10000",
            absent=("pickle", "object array"))


# --- the same class: every other way a source can be malformed or too large ---------------

def _npz(path: Path, members: dict[str, bytes], compression: int = zipfile.ZIP_STORED) -> Path:
    with zipfile.ZipFile(path, "w", compression) as zf:
        for name, payload in members.items():
            zf.writestr(name, payload)
    return path


@pytest.mark.parametrize("case, fragments", [
    ("negative dim", ("tensor 'a'", "negative")),
    ("shape over 64 bits", ("tensor 'a'", "2**63 - 1")),
    ("object dtype", ("tensor 'a'", "object array")),
    ("unsupported dtype, data never read", ("tensor 'a'", "<c16", "no KDTR dtype")),
    ("bad version", ("tensor 'a'", "version 9.9")),
    ("short data", ("tensor 'a'", "declares", "holds 4 bytes")),
    ("nested header", ("tensor 'a'", "not a valid .npy")),
    ("bzip2 member", ("member 'a.npy'", "compression method 12")),
    ("duplicate member", ("member 'a.npy'", "second member")),
])
def test_malformed_npz_members(tmp_path, case, fragments):
    src = tmp_path / "m.npz"
    if case == "negative dim":
        _npz(src, {"a.npy": npy_header((-3,)) + bytes(8)})
    elif case == "shape over 64 bits":
        _npz(src, {"a.npy": npy_header((0, 2**63), descr="<f4")})
    elif case == "object dtype":
        _npz(src, {"a.npy": npy_header((1,), descr="|O") + bytes(8)})
    elif case == "unsupported dtype, data never read":
        _npz(src, {"a.npy": npy_header((10**9,), descr="<c16")})  # declares 16 GB: refused for the dtype first
    elif case == "bad version":
        _npz(src, {"a.npy": b"\x93NUMPY\x09\x09" + bytes(8)})
    elif case == "short data":
        _npz(src, {"a.npy": npy_header((100,)) + bytes(4)})
    elif case == "nested header":
        h = b"{'descr': '|u1', 'fortran_order': False, 'shape': " + b"(" * 3000 + b")" * 3000 + b", }"
        h += b" " * (-(10 + len(h) + 1) % 64) + b"\n"
        _npz(src, {"a.npy": b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h})
    elif case == "bzip2 member":
        _npz(src, {"a.npy": npy(np.arange(3))}, zipfile.ZIP_BZIP2)
    elif case == "duplicate member":
        with zipfile.ZipFile(src, "w") as zf:
            zf.writestr("a.npy", npy(np.arange(3)))
            with pytest.warns(UserWarning):
                zf.writestr("a.npy", npy(np.arange(4)))
    refused(run(src, tmp_path / "m.kdtr"), str(src), *fragments)
    assert not (tmp_path / "m.kdtr").exists()


def test_member_names_the_reader_cannot_keep(tmp_path):
    """A zip name holding a NUL (zip readers cut it there) and a non-ASCII name not marked
    UTF-8 (its encoding is unknown) are refused, naming the member."""
    body = npy(np.arange(3, dtype=np.int32))
    crc = zlib.crc32(body)
    zip_one(tmp_path / "nul.npz", b"w.npy\x00junk.npy", body, crc, len(body), method=0)
    refused(run(tmp_path / "nul.npz", tmp_path / "nul.kdtr"), "nul.npz", "member 'w.npy\\x00junk.npy'", "NUL")
    zip_one(tmp_path / "cp.npz", "é.npy".encode(), body, crc, len(body), method=0)  # flag bit 11 unset
    refused(run(tmp_path / "cp.npz", tmp_path / "cp.kdtr"), "cp.npz", "not marked UTF-8")


def test_limits_on_the_source_and_its_tensors(tmp_path, monkeypatch):
    kdtr.save(tmp_path / "k.kdtr", {"a": np.zeros(4096, np.uint8)}, {})
    np.savez(tmp_path / "n.npz", a=np.zeros(4096, np.uint8))
    safetensors.numpy.save_file({"a": np.zeros(4096, np.uint8)}, tmp_path / "s.safetensors")
    monkeypatch.setenv("KDTR_MAX_CONVERT_BYTES", "2000")
    refused(run(tmp_path / "k.kdtr", tmp_path / "k.npz"), "k.kdtr", "tensor 'a'", "over the limit of 2000 bytes")
    refused(run(tmp_path / "n.npz", tmp_path / "n.kdtr"), "n.npz", "file", "2000-byte limit")
    refused(run(tmp_path / "s.safetensors", tmp_path / "s.kdtr"), "s.safetensors", "file", "2000-byte limit")
    monkeypatch.setenv("KDTR_MAX_CONVERT_BYTES", "lots")
    refused(run(tmp_path / "k.kdtr", tmp_path / "k.npz"), "KDTR_MAX_CONVERT_BYTES", "'lots'")
    monkeypatch.setenv("KDTR_MAX_CONVERT_BYTES", "100000")
    assert run(tmp_path / "n.npz", tmp_path / "n.kdtr").exit_code == 0


def _st_raw(header: object, data: bytes = b"") -> bytes:
    text = json.dumps(header).encode() if not isinstance(header, bytes) else header
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


@pytest.mark.parametrize("raw, fragments", [
    (b"\x01\x02", ("file", "shorter than")),
    (struct.pack("<Q", 10**12) + b"{}", ("header", "header in a")),
    (_st_raw([1, 2]), ("header", "a JSON list")),
    (_st_raw(b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, '
             b'"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}', bytes(4)), ("appears twice",)),
    (_st_raw({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, bytes(4)), ("tensor 'a'", "shape")),
    (_st_raw({"a": {"dtype": "F32", "shape": [1], "data_offsets": "x"}}, bytes(4)), ("tensor 'a'", "data_offsets")),
    (_st_raw({"__metadata__": {"k": 1}}), ("__metadata__", "strings")),
    (_st_raw(b"[" * 50_000 + b"]" * 50_000), ("header", "nested too deep")),
], ids=["short", "header longer than the file", "not an object", "a name twice", "negative dim", "bad offsets",
        "metadata not strings", "nested too deep"])
def test_malformed_safetensors_headers(tmp_path, raw, fragments):
    src = tmp_path / "x.safetensors"
    src.write_bytes(raw)
    refused(run(src, tmp_path / "x.kdtr"), str(src), *fragments)


@pytest.mark.parametrize("suffix", [".npz", ".safetensors", ".kdtr"])
def test_fifo_source_is_refused_not_waited_on(tmp_path, suffix):
    src = tmp_path / f"f{suffix}"
    os.mkfifo(src)
    dst = tmp_path / ("f.npz" if suffix == ".kdtr" else "f.kdtr")
    result = {}
    t = threading.Thread(target=lambda: result.setdefault("r", run(src, dst)))
    t.start()
    t.join(60)
    if t.is_alive():  # hang guard: a writer lets the blocked open return, then fail
        with open(src, "wb"):
            pass
        t.join()
        pytest.fail("kdtr convert blocked on a FIFO source")
    refused(result["r"], str(src), "FIFO")
