#!/usr/bin/env python3
"""Differential check of two builds of the kdtr_<op> binaries (docs/binaries.md).

    python3 tools/diff_binaries.py --old OLD_BIN_DIR --new NEW_BIN_DIR [--backend cpu] [--backend cuda]
                                   [--golden-dir golden] [--jobs N] [--keep DIR]

Runs both builds' kdtr_<op> on the same cases and compares, case by case, the exit code,
stderr and stdout (with the binary's path normalised to its name, and the seconds of a
--batch protocol line to "s=*") and the bytes of every output file.  The cases:

- every golden of the golden directory (both tiers: GOLDEN_DIR/<op>/*.kdtr and, where it
  exists, GOLDEN_DIR/.cache/<op>/*.kdtr), once per backend given, one process per golden;
- per op and backend, one --batch run over all of the op's goldens (the runner's mode);
- per op, broken inputs made from the op's first golden: the file truncated to half and
  to all but one byte, an empty file, a missing file, the first input tensor with a wrong
  dtype, with a wrong shape, the last input tensor removed, and bad metadata (max_budget as
  a string, or config as an int, or an extra metadata entry with a wrong type where the op
  reads one) -- the files laid out by tests/malformed.py's builders;
- per op, the command line: no arguments, --help, an unknown option, a bad --backend, a
  bad --kernel where the op has the option.

Prints one line per difference ("DIFF <case>: <what>") and a summary; exit 0 when the two
builds agree on every case, 1 on any difference, 2 on a usage error (a directory without
the binaries).  Needs numpy (tests/malformed.py builds the broken files), nothing of kdtr.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
try:  # tests/malformed.py names bf16 by ml_dtypes; only its item size (2) is used here
    import ml_dtypes  # noqa: F401
except ImportError:
    import types

    import numpy as np

    sys.modules["ml_dtypes"] = types.SimpleNamespace(bfloat16=np.float16)  # a 2-byte stand-in

OPS = ("tree_accept", "tree_build", "verify_attn", "greedy_step")
KERNEL_OPTION = {"tree_build", "verify_attn", "greedy_step"}
TIMEOUT = 600.0


@dataclass(frozen=True)
class Case:
    """One invocation: `args` with the placeholders {in} (a path) and {out} (a name in cwd)."""

    name: str
    op: str
    args: tuple[str, ...]
    outputs: tuple[str, ...] = ()


@dataclass
class Result:
    rc: int
    stderr: str
    stdout: str
    outputs: dict[str, bytes | None]


# --- reading and rewriting a golden with tests/malformed.py's model ---------------------


def parse(data: bytes):
    """A KDTR file's bytes as a malformed.File (tensors with their data, metadata)."""
    import malformed as mf

    _, _, hl = struct.unpack_from("<HHI", data, 8)
    pos = 16
    tc, mc = struct.unpack_from("<II", data, pos)
    pos += 8
    f = mf.File()
    for _ in range(tc):
        (n,) = struct.unpack_from("<H", data, pos)
        name = data[pos + 2 : pos + 2 + n]
        pos += 2 + n
        dtype, ndim = struct.unpack_from("<BB", data, pos)
        pos += 2
        shape = struct.unpack_from(f"<{ndim}Q", data, pos)
        pos += 8 * ndim
        off, nbytes, _crc = struct.unpack_from("<QQI", data, pos)
        pos += 20
        f.tensors.append(mf.raw_tensor(name, dtype, tuple(shape), data[off : off + nbytes]))
    for _ in range(mc):
        (n,) = struct.unpack_from("<H", data, pos)
        key = data[pos + 2 : pos + 2 + n]
        pos += 2 + n
        (typ,) = struct.unpack_from("<B", data, pos)
        pos += 1
        if typ == mf.META_STRING:
            (ln,) = struct.unpack_from("<I", data, pos)
            size = 4 + ln
        else:
            size = {mf.META_INT: 8, mf.META_FLOAT: 8, mf.META_BOOL: 1}[typ]
        f.metadata.append(mf.Meta(key, typ, data[pos : pos + size]))
        pos += size
    return f


def broken_inputs(golden: Path, dest: Path) -> list[tuple[str, Path]]:
    """The broken variants of `golden`, written under `dest`: (label, path)."""
    import malformed as mf

    data = golden.read_bytes()
    out: list[tuple[str, Path]] = []

    def put(label: str, blob: bytes) -> None:
        p = dest / f"{label}.kdtr"
        p.write_bytes(blob)
        out.append((label, p))

    put("truncated_half", data[: len(data) // 2])
    put("truncated_last_byte", data[:-1])
    put("empty", b"")
    out.append(("missing", dest / "missing.kdtr"))

    inputs = [t for t in parse(data).tensors if t.name.startswith(b"input.")]
    if inputs:
        f = parse(data)
        t = next(x for x in f.tensors if x.name == inputs[0].name)
        # f64 <-> i64 keep the byte count; i32/f32 -> i64/f64 doubles it (a consistent file)
        wider = {mf.DTYPES["f32"][0]: mf.DTYPES["f64"][0], mf.DTYPES["i32"][0]: mf.DTYPES["i64"][0],
                 mf.DTYPES["i64"][0]: mf.DTYPES["f64"][0], mf.DTYPES["u8"][0]: mf.DTYPES["i16"][0],
                 mf.DTYPES["bf16"][0]: mf.DTYPES["f32"][0]}
        new = wider.get(t.dtype, mf.DTYPES["f64"][0])
        count = len(t.data) // mf.ITEMSIZE[t.dtype]
        need = count * mf.ITEMSIZE[new]
        t.dtype, t.data = new, (t.data * (need // max(1, len(t.data)) + 1))[:need]
        put("wrong_dtype", f.render())

        f = parse(data)
        t = next(x for x in f.tensors if x.name == inputs[0].name)
        if t.shape:
            t.shape = (t.shape[0] + 1, *t.shape[1:])
            t.data = t.data + t.data[: len(t.data) // max(1, t.shape[0] - 1)]
        else:
            t.shape = (1,)
        put("wrong_shape", f.render())

        f = parse(data)
        f.tensors = [x for x in f.tensors if x.name != inputs[-1].name]
        put("missing_tensor", f.render())

    f = parse(data)
    keys = {m.key for m in f.metadata}
    if b"max_budget" in keys:
        f.metadata = [mf.meta_str("max_budget", "seven") if m.key == b"max_budget" else m for m in f.metadata]
        put("bad_metadata_max_budget", f.render())
        f = parse(data)
        f.metadata = [m for m in f.metadata if m.key != b"max_budget"]
        put("missing_metadata_max_budget", f.render())
    f = parse(data)
    f.metadata = [mf.meta_int("config", 7) if m.key == b"config" else m for m in f.metadata]
    put("bad_metadata_config", f.render())
    f = parse(data)
    f.metadata = [m for m in f.metadata if m.key != b"dtype"] + [mf.meta_int("dtype", 3)]
    put("bad_metadata_dtype", f.render())
    return out


# --- cases --------------------------------------------------------------------------------


def goldens(golden_dir: Path) -> dict[str, list[Path]]:
    found: dict[str, list[Path]] = {op: [] for op in OPS}
    for base in (golden_dir, golden_dir / ".cache"):
        for op in OPS:
            found[op] += sorted((base / op).glob("*.kdtr")) if (base / op).is_dir() else []
    return found


def cases(golden_dir: Path, backends: list[str], scratch: Path) -> list[Case]:
    out: list[Case] = []
    found = goldens(golden_dir)
    for op in OPS:
        for be in backends:
            for g in found[op]:
                rel = g.relative_to(golden_dir)
                out.append(Case(f"{op}:{rel}@{be}", op, ("--input", str(g), "--output", "out.kdtr", "--backend", be),
                                ("out.kdtr",)))
            if found[op]:
                args: list[str] = ["--batch"]
                names = []
                for k, g in enumerate(found[op]):
                    args += ["--input", str(g), "--output", f"out{k}.kdtr"]
                    names.append(f"out{k}.kdtr")
                out.append(Case(f"{op}:batch@{be}", op, (*args, "--backend", be), tuple(names)))
        if found[op]:
            d = scratch / "broken" / op
            d.mkdir(parents=True, exist_ok=True)
            for label, p in broken_inputs(found[op][0], d):
                for be in backends:
                    out.append(Case(f"{op}:broken/{label}@{be}", op,
                                    ("--input", str(p), "--output", "out.kdtr", "--backend", be), ("out.kdtr",)))
        out.append(Case(f"{op}:cli/no_arguments", op, ()))
        out.append(Case(f"{op}:cli/help", op, ("--help",)))
        out.append(Case(f"{op}:cli/unknown_option", op, ("--frobnicate", "1")))
        g = str(found[op][0]) if found[op] else "missing.kdtr"
        out.append(Case(f"{op}:cli/bad_backend", op, ("--input", g, "--output", "out.kdtr", "--backend", "tpu"),
                        ("out.kdtr",)))
        if op in KERNEL_OPTION:
            out.append(Case(f"{op}:cli/bad_kernel", op, ("--input", g, "--output", "out.kdtr", "--kernel", "warp9"),
                            ("out.kdtr",)))
    return out


# --- running and comparing -----------------------------------------------------------------

_BATCH_SECONDS = re.compile(r"( s=)[0-9.eE+-]+")


def run(binary: Path, case: Case, cwd: Path) -> Result:
    cwd.mkdir(parents=True, exist_ok=True)
    try:
        p = subprocess.run([str(binary), *case.args], cwd=cwd, capture_output=True, timeout=TIMEOUT,
                           env={**os.environ, "LC_ALL": "C"})
        rc, err, so = p.returncode, p.stderr.decode("utf-8", "replace"), p.stdout.decode("utf-8", "replace")
    except subprocess.TimeoutExpired:
        rc, err, so = -999, "timed out", ""
    name = binary.name
    err = err.replace(str(binary), name)
    so = so.replace(str(binary), name)
    err = _BATCH_SECONDS.sub(r"\1*", err)
    so = _BATCH_SECONDS.sub(r"\1*", so)
    outs = {o: ((cwd / o).read_bytes() if (cwd / o).is_file() else None) for o in case.outputs}
    shutil.rmtree(cwd, ignore_errors=True)
    return Result(rc, err, so, outs)


def first_line_diff(a: str, b: str) -> str:
    la, lb = a.splitlines(), b.splitlines()
    for k in range(max(len(la), len(lb))):
        x = la[k] if k < len(la) else "<none>"
        y = lb[k] if k < len(lb) else "<none>"
        if x != y:
            return f"line {k + 1}: old {x[:300]!r} new {y[:300]!r}"
    return "trailing whitespace"


def compare(case: Case, old: Result, new: Result) -> list[str]:
    d = []
    if old.rc != new.rc:
        d.append(f"exit code: old {old.rc} new {new.rc}")
    if old.stderr != new.stderr:
        d.append(f"stderr: {first_line_diff(old.stderr, new.stderr)}")
    if old.stdout != new.stdout:
        d.append(f"stdout: {first_line_diff(old.stdout, new.stdout)}")
    for o in case.outputs:
        a, b = old.outputs[o], new.outputs[o]
        if a != b:
            if a is None or b is None:
                d.append(f"output {o}: {'absent' if a is None else 'present'} in old, "
                         f"{'absent' if b is None else 'present'} in new")
            else:
                at = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
                d.append(f"output {o}: {len(a)} vs {len(b)} bytes, first difference at byte {at}")
    return d


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", required=True, type=Path, help="bin directory of the old build")
    ap.add_argument("--new", required=True, type=Path, help="bin directory of the new build")
    ap.add_argument("--backend", action="append", choices=["cpu", "cuda"], help="repeatable; default cpu")
    ap.add_argument("--golden-dir", type=Path, default=ROOT / "golden")
    ap.add_argument("--jobs", "-j", type=int, default=2)
    a = ap.parse_args(argv)
    backends = a.backend or ["cpu"]
    for d in (a.old, a.new):
        missing = [op for op in OPS if not (d / f"kdtr_{op}").is_file()]
        if missing:
            print(f"diff_binaries: {d}: no kdtr_{missing[0]}", file=sys.stderr)
            return 2
    scratch = Path(tempfile.mkdtemp(prefix="kdtr-diff-"))
    try:
        todo = cases(a.golden_dir.resolve(), backends, scratch)

        def one(k_case: tuple[int, Case]) -> tuple[Case, list[str]]:
            k, c = k_case
            old = run((a.old / f"kdtr_{c.op}").resolve(), c, scratch / f"old{k}")
            new = run((a.new / f"kdtr_{c.op}").resolve(), c, scratch / f"new{k}")
            return c, compare(c, old, new)

        ndiff = 0
        with concurrent.futures.ThreadPoolExecutor(max(1, a.jobs)) as ex:
            for c, diffs in ex.map(one, enumerate(todo)):
                for d in diffs:
                    print(f"DIFF {c.name}: {d}")
                ndiff += bool(diffs)
        print(f"{len(todo)} cases, {len(todo) - ndiff} identical, {ndiff} different "
              f"(backends: {', '.join(backends)}; old {a.old}, new {a.new})")
        return 1 if ndiff else 0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
