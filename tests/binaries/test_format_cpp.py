"""The C++ reader/writer (cuda_tests/include/kdtr.hpp, via build/bin/kdtr_check) against
the Python one, on the malformed files of tests/malformed.py and on the committed goldens.

Contract of the tool: ``kdtr_check [--no-verify] FILE`` exits 0 on a valid file; on a
format error it prints exactly one line to stderr,
``<ErrorCodeName>: <path>: <field> at offset <n>: <detail>``, and exits 2, the name being
the Python exception's class name. ``kdtr_check --copy IN OUT`` rewrites IN with the C++
writer, keeping tensor and metadata order.

These tests fail (they do not skip) when the binary has not been built: run ``make``.
"""

from __future__ import annotations

import random
import re
import struct
import subprocess
from pathlib import Path

import pytest

import kdtr
import malformed as M

CASE_IDS = [c[0] for c in M.CASES]
LINE = re.compile(r"^(?P<code>[A-Za-z0-9]+): (?P<rest>.*) at offset (?P<offset>\d+): (?P<detail>.*)$")


def _check(binary: Path, path: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(binary), *flags, str(path)], capture_output=True, text=True,
                          errors="replace", timeout=60)


def _lines(stderr: str) -> list[str]:
    """stderr split at newlines only (names may hold other control characters)."""
    return stderr.rstrip("\n").split("\n") if stderr else []


def _python_code(path: Path, verify: bool = True) -> str:
    try:
        with kdtr.load(path, verify=verify):
            return "OK"
    except kdtr.KdtrError as exc:
        return type(exc).__name__


def _cpp_code(binary: Path, path: Path, verify: bool = True) -> str:
    r = _check(binary, path, *([] if verify else ["--no-verify"]))
    if r.returncode == 0:
        return "OK"
    lines = _lines(r.stderr)
    if r.returncode != 2 or len(lines) != 1:
        return f"<exit {r.returncode}: {r.stderr.strip()[:300]!r}>"
    m = re.match(r"([A-Za-z0-9]+): ", lines[0])  # the full line is checked by the tests above
    return m[1] if m else f"<unparsed: {lines[0]!r}>"


def _goldens(repo_root: Path) -> list[Path]:
    return sorted(g for g in (repo_root / "golden").glob("**/*.kdtr") if ".cache" not in g.parts)


@pytest.mark.parametrize("case_id, data, expected", M.CASES, ids=CASE_IDS)
def test_cpp_reports_the_same_error(tmp_path, kdtr_check, case_id, data, expected):
    path = tmp_path / "case.kdtr"
    path.write_bytes(data)
    r = _check(kdtr_check, path)
    assert r.returncode == 2, f"{case_id}: exit {r.returncode}, stderr {r.stderr!r}"
    assert r.stderr.endswith("\n"), r.stderr
    lines = _lines(r.stderr)
    assert len(lines) == 1, f"{case_id}: expected one stderr line, got {r.stderr!r}"
    m = LINE.match(lines[0])
    assert m, f"{case_id}: stderr line not '<Code>: <path>: <field> at offset <n>: <detail>': {lines[0]!r}"
    assert m["code"] == expected, f"{case_id}: C++ says {m['code']}, Python and the spec say {expected}"
    assert lines[0].startswith(f"{expected}: {path}: "), lines[0]
    assert 0 <= int(m["offset"]) <= len(data)


@pytest.mark.parametrize("case_id, data, expected", M.CASES, ids=CASE_IDS)
def test_cpp_no_verify(tmp_path, kdtr_check, case_id, data, expected):
    """--no-verify skips only the tensor CRC and bool-value rules."""
    path = tmp_path / "case.kdtr"
    path.write_bytes(data)
    want = "OK" if expected in M.VERIFY_ONLY else expected
    assert _cpp_code(kdtr_check, path, verify=False) == want


@pytest.mark.parametrize("case_id, data, expected", M.CASES, ids=CASE_IDS)
def test_cpp_and_python_agree_on_the_offset(tmp_path, kdtr_check, case_id, data, expected):
    """Both readers name the byte offset where the bad field starts (spec section 3)."""
    path = tmp_path / "case.kdtr"
    path.write_bytes(data)
    with pytest.raises(kdtr.KdtrError) as info:
        kdtr.load(path)
    r = _check(kdtr_check, path)
    m = LINE.match(r.stderr.strip())
    assert m, r.stderr
    assert int(m["offset"]) == info.value.offset, (
        f"{case_id}: C++ {r.stderr.strip()!r} vs Python {info.value}"
    )


ZERO_SIZE_IDS = ["x".join(map(str, shape)) + f"-code{code}" for shape, code, _ in M.ZERO_SIZE_SHAPES]


@pytest.mark.parametrize("shape, dtype, expected", M.ZERO_SIZE_SHAPES, ids=ZERO_SIZE_IDS)
def test_cpp_zero_size_tensors_follow_the_size_rule(tmp_path, kdtr_check, shape, dtype, expected):
    """Spec 1.3's size rule (product of the nonzero dims x itemsize <= 2**63 - 1) on zero-size
    tensors: the C++ reader agrees with the table, and with the Python reader on the field
    and offset of the error."""
    path = tmp_path / "z.kdtr"
    path.write_bytes(M.File([M.raw_tensor("z", dtype, shape)]).render())
    assert _cpp_code(kdtr_check, path) == expected
    assert _python_code(path) == expected
    if expected != "OK":
        with pytest.raises(kdtr.KdtrError) as info:
            kdtr.load(path)
        m = LINE.match(_check(kdtr_check, path).stderr.strip())
        assert m and int(m["offset"]) == info.value.offset
        assert ": tensors[0].shape" in m["rest"], m["rest"]


NUL_NAMES = {
    "tensor_name": M.File([M.raw_tensor("a\x00b", 0, (1,), b"x")]),  # UnknownDtype after the name
    "metadata_key": M.File(metadata=[M.meta_bool("k\x00", 2)]),  # BadMetadata after the key
}


@pytest.mark.parametrize("label", list(NUL_NAMES))
def test_cpp_error_line_survives_nul_in_names(tmp_path, kdtr_check, label):
    """U+0000 is valid UTF-8, so a name may hold a NUL byte; the error line must still be whole."""
    path = tmp_path / "nul.kdtr"
    path.write_bytes(NUL_NAMES[label].render())
    with pytest.raises(kdtr.KdtrError) as info:
        kdtr.load(path)
    r = _check(kdtr_check, path)
    assert r.returncode == 2
    lines = _lines(r.stderr)
    assert len(lines) == 1 and LINE.match(lines[0]), f"C++ error line cut short: {r.stderr!r}"
    assert LINE.match(lines[0])["code"] == type(info.value).__name__
    assert int(LINE.match(lines[0])["offset"]) == info.value.offset


def test_cpp_accepts_the_valid_file(tmp_path, kdtr_check):
    path = tmp_path / "valid.kdtr"
    path.write_bytes(M.valid_file_bytes())
    for flags in ([], ["--no-verify"]):
        r = _check(kdtr_check, path, *flags)
        assert r.returncode == 0, r.stderr
        assert r.stderr == ""


def test_cpp_accepts_a_minor_version_extension(tmp_path, kdtr_check):
    f = M.File([M.tensor("x", M.np.arange(3, dtype=M.np.int16))], [M.meta_int("a", 1)], minor=3,
               extension=b"future fields")
    path = tmp_path / "v1_3.kdtr"
    path.write_bytes(f.render())
    r = _check(kdtr_check, path)
    assert r.returncode == 0, r.stderr


def test_cpp_missing_file_is_not_a_format_error(tmp_path, kdtr_check):
    path = tmp_path / "absent.kdtr"
    r = _check(kdtr_check, path)
    assert r.returncode != 0 and str(path) in r.stderr, r
    assert r.stderr.split(":")[0] not in M.expected_codes(), r.stderr  # not blamed on the format


def _copy(binary: Path, src: Path, dst: Path) -> None:
    r = subprocess.run([str(binary), "--copy", str(src), str(dst)], capture_output=True, text=True,
                       errors="replace", timeout=60)
    assert r.returncode == 0, f"--copy {src}: exit {r.returncode}: {r.stderr}"


def test_cpp_copy_of_valid_file_is_byte_identical(tmp_path, kdtr_check):
    src = tmp_path / "valid.kdtr"
    src.write_bytes(M.valid_file_bytes())
    dst = tmp_path / "copy.kdtr"
    _copy(kdtr_check, src, dst)
    assert dst.read_bytes() == src.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy.kdtr", "valid.kdtr"]  # no temp left


def test_cpp_copy_of_limits_is_byte_identical(tmp_path, kdtr_check):
    """Names of 255 bytes, 8 dims, empty tensors last, every dtype, a 1 MiB string."""
    np = M.np
    tensors = {name: np.zeros((2,), dt) for name, (_, dt) in M.DTYPES.items()}
    tensors["é" * 127 + "x"] = np.ones((1, 2, 1, 1, 2, 1, 1, 2), np.int8)
    tensors["zero_d"] = np.array(3, np.int64)
    tensors["empty_last"] = np.zeros((4, 0), np.float32)
    metadata = {"s": "x" * M.MAX_STRING_LEN, "f": -0.0, "i": -(2**63), "b": False}
    src = tmp_path / "limits.kdtr"
    kdtr.save(src, tensors, metadata)
    dst = tmp_path / "copy.kdtr"
    _copy(kdtr_check, src, dst)
    assert dst.read_bytes() == src.read_bytes()


def test_cpp_copy_of_every_golden_is_byte_identical(tmp_path, kdtr_check, repo_root):
    goldens = _goldens(repo_root)
    assert goldens, "no committed goldens under golden/"
    for g in goldens:
        dst = tmp_path / g.name
        _copy(kdtr_check, g, dst)
        assert dst.read_bytes() == g.read_bytes(), f"--copy {g} differs from the input"


def test_cpp_accepts_every_golden(kdtr_check, repo_root):
    for g in _goldens(repo_root):
        r = _check(kdtr_check, g)
        assert r.returncode == 0, f"{g}: {r.stderr}"


# --- differential: the same verdict as Python on damaged copies of the valid file ----------


@pytest.mark.slow  # one kdtr_check process per byte of the file
def test_cpp_and_python_agree_on_every_single_byte_flip(tmp_path, kdtr_check):
    data = M.valid_file_bytes()
    path = tmp_path / "flip.kdtr"
    diffs = []
    for at in range(len(data)):
        path.write_bytes(M.xor_byte(data, at, 0xFF))
        py, cpp = _python_code(path), _cpp_code(kdtr_check, path)
        if py != cpp or py == "OK":
            diffs.append((at, py, cpp))
    assert not diffs, diffs[:20]


def test_cpp_and_python_agree_on_every_truncation(tmp_path, kdtr_check):
    data = M.valid_file_bytes()
    path = tmp_path / "cut.kdtr"
    diffs = []
    for n in range(len(data)):
        path.write_bytes(data[:n])
        py, cpp = _python_code(path), _cpp_code(kdtr_check, path)
        if py != cpp or py == "OK":
            diffs.append((n, py, cpp))
    assert not diffs, diffs[:20]


INTERESTING_U64 = [0, 1, 63, 64, 65, 255, 256, 4096, 4097, 2**31, 2**32 - 1, 2**32, 2**63, 2**64 - 64, 2**64 - 1]


def _mutate(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(5)
        at = rng.randrange(len(b)) if b else 0
        if op == 0 and b:
            b[at] ^= 1 << rng.randrange(8)
        elif op == 1 and b:
            b[at] = rng.randrange(256)
        elif op == 2 and len(b) >= at + 8:
            b[at : at + 8] = struct.pack("<Q", rng.choice(INTERESTING_U64))
        elif op == 3:
            b[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif b:
            del b[at : at + rng.randint(1, 8)]
    out = bytes(b)
    if len(out) >= 16 and rng.random() < 0.8:
        hl = struct.unpack_from("<I", out, 12)[0]
        if 12 <= hl and 16 + hl <= len(out):
            out = M.fix_header_crc(out)  # let the damage reach the header fields
    return out


def test_cpp_and_python_agree_on_random_mutations(tmp_path, kdtr_check):
    """Seeded random damage (bit flips, byte sets, interesting u64s, insertions, deletions),
    with the header CRC usually repaired so that the header fields themselves are judged."""
    rng = random.Random(20240601)
    seeds = [M.valid_file_bytes(), M.File([M.tensor("a", M.np.arange(5, dtype=M.np.uint8))],
                                          [M.meta_str("k", "v"), M.meta_bool("b", 1)]).render()]
    path = tmp_path / "mut.kdtr"
    diffs = []
    for i in range(600):
        data = _mutate(rng, seeds[i % len(seeds)])
        path.write_bytes(data)
        py, cpp = _python_code(path), _cpp_code(kdtr_check, path)
        if py != cpp:
            (tmp_path / f"diff_{i}.kdtr").write_bytes(data)
            diffs.append((i, py, cpp))
    assert not diffs, diffs[:20]


def _structured_file(tensors, metadata, minor, extension, pad) -> bytes:
    f = M.File(tensors, metadata, minor=minor, extension=extension)
    f.layout()
    end = max([f.data_start()] + [t.offset + len(t.data) for t in tensors if t.offset < 1 << 20])
    f.size = end + pad
    return f.render()


def test_cpp_and_python_agree_on_structured_headers(tmp_path_factory, kdtr_check):
    """Hypothesis-built headers with valid framing and CRC but arbitrary field values,
    huge and zero dims included: no exclusions, the readers must agree on every file."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from conftest import import_test_module

    FZ = import_test_module("unit/test_format_fuzz.py")

    path = tmp_path_factory.mktemp("structured") / "s.kdtr"
    diffs = []

    @settings(max_examples=300, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(tensors=st.lists(FZ.structured_tensors(), max_size=4),
           metadata=st.lists(st.builds(M.Meta, st.sampled_from([b"k", b"j", b"\xff"]), st.integers(0, 6),
                                       st.binary(max_size=12)), max_size=3),
           minor=st.integers(0, 1), extension=st.binary(max_size=3), pad=st.integers(0, 200),
           verify=st.booleans())
    def run(tensors, metadata, minor, extension, pad, verify):
        path.write_bytes(_structured_file(tensors, metadata, minor, extension, pad))
        try:
            with kdtr.load(path, verify=verify):
                py = "OK"
        except kdtr.KdtrError as exc:
            py = type(exc).__name__
        cpp = _cpp_code(kdtr_check, path, verify)
        if py != cpp:
            diffs.append((py, cpp, path.read_bytes()))

    run()
    assert not diffs, [(py, cpp) for py, cpp, _ in diffs[:20]]
