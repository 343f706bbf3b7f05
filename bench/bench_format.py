#!/usr/bin/env python3
"""Benchmark the KDTR format: checksums near memory speed, the header in one pass.

The targets on the 2-core development machine, each measured here beside its peer in the
same run:

1. ``kdtr.load(path, verify=True)`` of a 512 MiB file (8 f32 tensors of 64 MiB) at
   >= 8 GB/s and >= 0.7x the rate of reading the mapped bytes. Peer: map the file
   (``mmap``, read-only, as ``load`` does) and read every byte once
   (``np.bitwise_or.reduce`` over a u64 view of the mapping). Beside them, the same load
   with the CRC swapped to ``zlib.crc32`` (the fallback where python-isal is missing).
2. ``build/bin/kdtr_check FILE`` (the C++ reader, verify on) on the same file, same target,
   as a whole process (exec, open, map, every CRC, exit; its listing to /dev/null), with
   its default CRC threads (a 64 MiB tensor is split over up to 4) and with
   ``KDTR_CRC_THREADS=1``. Peer:
   a C program, built here with ``g++ -O3``, that maps the file the same way
   (``MAP_PRIVATE``, as kdtr.hpp does) and ORs every u64 of it. Beside them,
   ``kdtr_check --no-verify`` (the same process without reading the data) and, when
   ``--zlib-check`` names a zlib build of kdtr_check (``make KDTR_CRC=zlib``), that one.
3. Loading a 4096-tensor file (f32 [16, 16] each, names ``layers.<i>.<part>.weight``, 10
   metadata entries) within 2x of safetensors: ``kdtr.load(verify=False)`` (open: the
   header in one pass, then read-only views) and ``verify=True`` against
   ``safetensors.numpy.load_file`` (the same tensors as a dict of numpy arrays) on a
   safetensors file of the same tensors. Beside them, the header parse alone per tensor:
   the one-pass parse (``_parse_body_fast``) and the field-by-field reader it replaced
   for valid files (``_parse_body_checked``, now run only to name a defect).
4. ``kdtr.save`` within 1.5x of a raw durable write: the same bytes written as one file
   the way ``atomic_write`` does (temporary file, every chunk, fsync, rename, fsync of the
   directory), from the same arrays, without the checks, the CRCs or the header. For the
   512 MiB file and the 4096-tensor file; ``safetensors.numpy.save_file`` beside the
   latter (it does not fsync).

Every figure is the best (and the median) of ``--repeat`` runs (default 7; half as many,
at least 3, for the 512 MiB saves), subject and
peer alternating in one loop so that background load hits both alike; files live in a
temporary directory (``--dir``, default the system's), so the 512 MiB file is read from
the page cache (it was just written) -- these are CPU figures, not disk figures, except
the fsyncs of item 4. 1 GB = 1e9 bytes.

Prints Markdown (the machine, each figure beside its peer, each target met or MISSED);
``--out FILE`` appends it with the command and the date to FILE (e.g. docs/benchmarks.md).

Usage (from the repository root, after ``make`` and ``make venv``; safetensors comes with
the ``bench`` extra: ``.venv/bin/pip install -e '.[bench]'``):

    .venv/bin/python bench/bench_format.py [--repeat 7] [--out docs/benchmarks.md]
        [--zlib-check /tmp/kz/bin/kdtr_check] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import datetime
import mmap
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import kdtr  # noqa: E402
import kdtr.format as F  # noqa: E402
from kdtr.format import layout as FL  # noqa: E402
from kdtr.format import read as FR  # noqa: E402
from kdtr.format import write as FW  # noqa: E402

BIG_TENSORS = 8
BIG_TENSOR_BYTES = 64 << 20  # 8 x 64 MiB = 512 MiB
MANY = 4096

C_READER = r"""
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
int main(int argc, char** argv) {
  int fd = open(argv[1], O_RDONLY);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) return 2;
  const uint64_t* p = (const uint64_t*)mmap(0, st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (p == MAP_FAILED) return 2;
  uint64_t acc = 0;
  size_t n = st.st_size / 8;
  for (size_t i = 0; i < n; ++i) acc |= p[i];
  printf("%llu\n", (unsigned long long)acc);
  return 0;
}
"""


def timed(fn, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def alternate(fns: dict, repeat: int) -> dict[str, list[float]]:
    """Each function once per round, ``repeat`` rounds (one warm-up round not counted)."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeat):
        for k, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t)
    return times


def load_verify(path):
    with kdtr.load(path, verify=True):
        pass


def load_noverify(path):
    with kdtr.load(path, verify=False):
        pass


def mapped_read(path):
    with open(path, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        a = np.frombuffer(mm, dtype=np.uint64, count=len(mm) // 8)
        np.bitwise_or.reduce(a)
        del a
    finally:
        mm.close()


def load_with_zlib(path):
    saved = FL._crc32
    FL._crc32 = zlib.crc32
    try:
        load_verify(path)
    finally:
        FL._crc32 = saved


def run_quiet(cmd, env=None):
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    if r.returncode:
        raise SystemExit(f"{shlex.join(map(str, cmd))}: exit {r.returncode}: {r.stderr.decode()[:300]}")


def raw_durable_write(path: Path, chunks) -> None:
    """What atomic_write does with the bytes, nothing else: temp file, write, fsync,
    rename, fsync of the directory."""
    tmp = path.with_name(f".{path.name}.raw.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    with os.fdopen(fd, "wb") as fh:
        for c in chunks:
            fh.write(c)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def fmt_s(ts: list[float]) -> str:
    return f"{min(ts) * 1e3:.1f} ms (median {statistics.median(ts) * 1e3:.1f})"


def gbs(nbytes: int, ts: list[float]) -> float:
    return nbytes / min(ts) / 1e9


def machine() -> str:
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
    except OSError:
        lscpu = []
    keep = ("Architecture", "CPU(s):", "Model name", "Thread(s) per core", "Core(s) per socket", "L2 cache", "L3 cache")
    lines = [ln.strip() for ln in lscpu if ln.strip().startswith(keep)]
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    import isal  # noqa: PLC0415

    versions = (
        f"python {platform.python_version()}, numpy {np.__version__}, isal {isal.__version__} "
        f"(kdtr.format CRC-32: {F.CRC32_IMPL})"
    )
    try:
        import safetensors  # noqa: PLC0415

        versions += f", safetensors {safetensors.__version__}"
    except ImportError:
        pass
    return "; ".join(lines) + f"; {mem:.0f} GiB memory; {versions}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--dir", default=None, help="where the temporary files go (default: the system's tmp)")
    ap.add_argument("--check", type=Path, default=ROOT / "build" / "bin" / "kdtr_check")
    ap.add_argument("--zlib-check", type=Path, default=None, help="a kdtr_check built with KDTR_CRC=zlib")
    args = ap.parse_args()
    R = args.repeat
    lines: list[str] = []
    say = lines.append
    verdicts: list[str] = []

    def target(ok: bool, text: str) -> None:
        verdicts.append(f"- {'met' if ok else 'MISSED'}: {text}")

    check_version = subprocess.run([str(args.check), "--version"], capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="kdtr-bench-", dir=args.dir) as d:
        d = Path(d)
        rng = np.random.default_rng(0)

        # --- 1, 2: the 512 MiB file -------------------------------------------------------
        big = {f"w{i}": rng.standard_normal(BIG_TENSOR_BYTES // 4, dtype=np.float32).reshape(4096, -1)
               for i in range(BIG_TENSORS)}
        big_path = d / "big.kdtr"
        kdtr.save(big_path, big)
        size = big_path.stat().st_size
        say(f"### 1. `kdtr.load(verify=True)`, 512 MiB file ({size:,} bytes, {BIG_TENSORS} f32 tensors)\n")
        t = alternate({
            "load": lambda: load_verify(big_path),
            "mapped": lambda: mapped_read(big_path),
            "noverify": lambda: load_noverify(big_path),
            "zlib": lambda: load_with_zlib(big_path),
        }, R)
        say("| what | time, best (median) | GB/s (best) |")
        say("| --- | ---: | ---: |")
        say(f"| `kdtr.load(verify=True)`, CRC-32 by {F.CRC32_IMPL} | {fmt_s(t['load'])} | {gbs(size, t['load']):.2f} |")
        say(f"| peer: map + read every byte (numpy OR-reduce of a u64 view) | {fmt_s(t['mapped'])} | {gbs(size, t['mapped']):.2f} |")
        say(f"| `kdtr.load(verify=False)` (header, padding, views) | {fmt_s(t['noverify'])} | |")
        say(f"| `kdtr.load(verify=True)`, CRC swapped to `zlib.crc32` (the fallback) | {fmt_s(t['zlib'])} | {gbs(size, t['zlib']):.2f} |")
        ratio = min(t["mapped"]) / min(t["load"])
        say(f"\nload / mapped read: **{ratio:.2f}x**\n")
        rate = gbs(size, t["load"])
        target(rate >= 8 and ratio >= 0.7,
               f"`kdtr.load(verify=True)` of 512 MiB: {rate:.2f} GB/s (>= 8) and {ratio:.2f}x the mapped read (>= 0.7)")

        say(f"### 2. `kdtr_check` on the same file (`{check_version}`)\n")
        c_src = d / "mapread.c"
        c_src.write_text(C_READER)
        c_exe = d / "mapread"
        subprocess.run(["g++", "-x", "c++", "-O3", "-march=native", str(c_src), "-o", str(c_exe)], check=True)
        one_thread = {**os.environ, "KDTR_CRC_THREADS": "1"}
        procs = {
            "check": lambda: run_quiet([args.check, big_path]),
            "check1": lambda: run_quiet([args.check, big_path], env=one_thread),
            "cread": lambda: run_quiet([c_exe, big_path]),
            "noverify": lambda: run_quiet([args.check, "--no-verify", big_path]),
        }
        if args.zlib_check:
            procs["zlib"] = lambda: run_quiet([args.zlib_check, big_path])
        t = alternate(procs, R)
        say("| what (one process each) | time, best (median) | GB/s (best) |")
        say("| --- | ---: | ---: |")
        say(f"| `kdtr_check FILE` (a tensor's CRC on up to 4 threads: {os.cpu_count()} here) | {fmt_s(t['check'])} | {gbs(size, t['check']):.2f} |")
        say(f"| `KDTR_CRC_THREADS=1 kdtr_check FILE` (one thread) | {fmt_s(t['check1'])} | {gbs(size, t['check1']):.2f} |")
        say(f"| peer: C program, mmap + OR of every u64 (`g++ -O3 -march=native`) | {fmt_s(t['cread'])} | {gbs(size, t['cread']):.2f} |")
        say(f"| `kdtr_check --no-verify FILE` | {fmt_s(t['noverify'])} | |")
        if args.zlib_check:
            zv = subprocess.run([str(args.zlib_check), "--version"], capture_output=True, text=True).stdout.strip()
            say(f"| `{args.zlib_check.name} FILE` built with `KDTR_CRC=zlib` (`{zv.split('CRC-32: ')[-1]}`) | {fmt_s(t['zlib'])} | {gbs(size, t['zlib']):.2f} |")
        ratio = min(t["cread"]) / min(t["check"])
        rate = gbs(size, t["check"])
        ratio1 = min(t["cread"]) / min(t["check1"])
        rate1 = gbs(size, t["check1"])
        say(f"\nkdtr_check / mapped read: **{ratio:.2f}x** (one thread: {ratio1:.2f}x)\n")
        target(rate >= 8 and ratio >= 0.7,
               f"`kdtr_check` on 512 MiB: {rate:.2f} GB/s (>= 8) and {ratio:.2f}x the mapped read (>= 0.7)")
        target(rate1 >= 8 and ratio1 >= 0.7,
               f"`kdtr_check` on 512 MiB, one CRC thread: {rate1:.2f} GB/s (>= 8) and {ratio1:.2f}x the mapped read (>= 0.7)")

        # --- 4a: save of the 512 MiB file -------------------------------------------------
        say("### 4a. `kdtr.save` vs a raw durable write, 512 MiB\n")
        head, placed, data_end = F.encode(big)
        chunks = list(FW._file_chunks(head, placed, data_end))
        out_k, out_r = d / "save.kdtr", d / "raw.bin"
        t = alternate({
            "save": lambda: kdtr.save(out_k, big),
            "raw": lambda: raw_durable_write(out_r, chunks),
        }, max(3, R // 2))
        say("| what | time, best (median) | GB/s (best) |")
        say("| --- | ---: | ---: |")
        say(f"| `kdtr.save` (checks, CRCs, header, temp file, fsync, rename) | {fmt_s(t['save'])} | {gbs(size, t['save']):.2f} |")
        say(f"| peer: the same bytes, temp file + fsync + rename + dir fsync | {fmt_s(t['raw'])} | {gbs(size, t['raw']):.2f} |")
        ratio = min(t["save"]) / min(t["raw"])
        say(f"\nsave / raw write: **{ratio:.2f}x**\n")
        target(ratio <= 1.5, f"`kdtr.save` of 512 MiB: {ratio:.2f}x the raw durable write (<= 1.5)")
        for p in (big_path, out_k, out_r):
            p.unlink(missing_ok=True)
        big = chunks = placed = None  # free the 512 MiB before the next part

        # --- 3, 4b: the 4096-tensor file -----------------------------------------------------
        parts = ("attn.q", "attn.k", "attn.v", "mlp.up")
        many = {f"layers.{i // 4}.{parts[i % 4]}.weight": rng.standard_normal((16, 16), dtype=np.float32)
                for i in range(MANY)}
        meta = {f"config.k{i}": i for i in range(10)}
        many_path = d / "many.kdtr"
        kdtr.save(many_path, many, meta)
        msize = many_path.stat().st_size
        say(f"### 3. Loading a {MANY}-tensor file ({msize:,} bytes; f32 [16, 16] each, 10 metadata entries)\n")
        try:
            from safetensors.numpy import load_file, save_file  # noqa: PLC0415
        except ImportError:
            load_file = save_file = None
        fns = {
            "noverify": lambda: load_noverify(many_path),
            "verify": lambda: load_verify(many_path),
        }
        if load_file is not None:
            st_path = d / "many.safetensors"
            save_file(many, str(st_path), metadata={k: str(v) for k, v in meta.items()})
            fns["st"] = lambda: load_file(str(st_path))
        t = alternate(fns, R)
        say("| what | time, best (median) | per tensor (best) |")
        say("| --- | ---: | ---: |")
        say(f"| `kdtr.load(verify=False)` | {fmt_s(t['noverify'])} | {min(t['noverify']) / MANY * 1e6:.1f} us |")
        say(f"| `kdtr.load(verify=True)` | {fmt_s(t['verify'])} | {min(t['verify']) / MANY * 1e6:.1f} us |")
        if "st" in t:
            say(f"| peer: `safetensors.numpy.load_file` | {fmt_s(t['st'])} | {min(t['st']) / MANY * 1e6:.1f} us |")
        data = many_path.read_bytes()
        body = data[F.PREAMBLE_LEN : F.PREAMBLE_LEN + int.from_bytes(data[12:16], "little") - 4]
        ds = F.PREAMBLE_LEN + len(body) + 4
        tp = alternate({
            "fast": lambda: FR._parse_body_fast(body, len(data), ds, 0),
            "checked": lambda: FR._parse_body_checked("x", body, len(data), ds, 0),
            "encode": lambda: F.encode(many, meta),
        }, R)
        say(f"| header parse alone, one pass (`_parse_body_fast`) | {fmt_s(tp['fast'])} | {min(tp['fast']) / MANY * 1e6:.1f} us |")
        say(f"| header parse alone, field by field through construct (`_parse_body_checked`, the reader before this change) | {fmt_s(tp['checked'])} | {min(tp['checked']) / MANY * 1e6:.1f} us |")
        say(f"| header build (`kdtr.format.encode`: checks, CRCs, header bytes) | {fmt_s(tp['encode'])} | {min(tp['encode']) / MANY * 1e6:.1f} us |")
        if "st" in t:
            r_nv = min(t["noverify"]) / min(t["st"])
            r_v = min(t["verify"]) / min(t["st"])
            say(f"\nkdtr / safetensors: **{r_nv:.2f}x** (verify=False), **{r_v:.2f}x** (verify=True)\n")
            target(r_nv <= 2, f"loading {MANY} tensors, `verify=False`: {r_nv:.2f}x safetensors (<= 2)")
            target(r_v <= 2, f"loading {MANY} tensors, `verify=True`: {r_v:.2f}x safetensors (<= 2)")
        else:
            say("\n(safetensors is not installed: `pip install -e '.[bench]'`)\n")
            verdicts.append("- not measured: safetensors missing")

        say(f"### 4b. `kdtr.save` vs a raw durable write, {MANY} tensors\n")
        head, placed, data_end = F.encode(many, meta)
        chunks = list(FW._file_chunks(head, placed, data_end))
        fns = {
            "save": lambda: kdtr.save(out_k, many, meta),
            "raw": lambda: raw_durable_write(out_r, chunks),
        }
        if save_file is not None:
            fns["st"] = lambda: save_file(many, str(d / "save.safetensors"))
        t = alternate(fns, R)
        say("| what | time, best (median) |")
        say("| --- | ---: |")
        say(f"| `kdtr.save` | {fmt_s(t['save'])} |")
        say(f"| peer: the same bytes ({len(chunks)} chunks), temp file + fsync + rename + dir fsync | {fmt_s(t['raw'])} |")
        if "st" in t:
            say(f"| `safetensors.numpy.save_file` (no fsync) | {fmt_s(t['st'])} |")
        ratio = min(t["save"]) / min(t["raw"])
        say(f"\nsave / raw write: **{ratio:.2f}x**\n")
        target(ratio <= 1.5, f"`kdtr.save` of {MANY} tensors: {ratio:.2f}x the raw durable write (<= 1.5)")

    say("### Targets\n")
    lines.extend(verdicts)
    text = "\n".join(lines) + "\n"
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cmd = shlex.join([os.path.relpath(sys.executable, ROOT) if sys.executable.startswith(str(ROOT)) else sys.executable,
                      *sys.argv])
    header = f"Command: `{cmd}`  \nDate: {now}  \nMachine: {machine()}\n\n"
    print(header + text)
    if args.out:
        with open(args.out, "a") as fh:
            fh.write("\n" + header + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
