"""The GPU architectures of the build (Makefile, docs/binaries.md "Building"):

- verify_attn.cu compiles for sm_120 (Blackwell workstation; CUDA_ARCH="90 120" builds it),
  where nvcc is on PATH: one nvcc run of that file alone, not a whole build;
- the Hopper kernel (verify_attn_sm90.cu) was compiled for sm_90a, and only for it, when
  the build found its CUTLASS headers (and must have been when the pinned wheel is in
  .cache/cutlass and CUDA_ARCH holds 90);
- how the Makefile gets the CUTLASS headers, with `make -n` in a scratch build directory
  (NVCC=true stands in for nvcc: -n runs no compiler, and the CUDA build's choices do not
  depend on nvcc being real): a wheel with another sha256, a CUTLASS_INCLUDE without the
  headers, a failed download and a CUDA_ARCH without 90 each build without the Hopper
  kernel (no -DKDTR_HAVE_WGMMA, no verify_attn_sm90.o), the first three saying why in one
  line; the pinned wheel in the cache is extracted offline and builds it.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WHEEL_NAME = "nvidia_cutlass-4.2.0.0-py3-none-any.whl"
CACHED_WHEEL = REPO / ".cache" / "cutlass" / WHEEL_NAME
NO_NVCC = "nvcc is not on PATH: the Makefile builds the CPU-only variant with g++"


def _pinned_sha256() -> str:
    m = re.search(r"^CUTLASS_SHA256\s*:=\s*([0-9a-f]{64})\s*$", (REPO / "Makefile").read_text(), re.M)
    assert m, "the Makefile pins no CUTLASS_SHA256"
    return m.group(1)


def _stamp_fields(stamp: str) -> dict[str, str]:
    """build/config.stamp: variant | crc32=.. | CXX flags | NVCC flags | wgmma=.. flags | LDFLAGS."""
    f = [x.strip() for x in stamp.strip().split(" | ")]
    assert len(f) == 6 and f[4].startswith("wgmma="), f"unexpected config stamp {stamp!r}"
    return {"variant": f[0], "nvcc": f[3], "wgmma": f[4]}


# ---------------------------------------------------------------------------------------
# The real compilers
# ---------------------------------------------------------------------------------------

@pytest.mark.slow  # compiles verify_attn with nvcc (about 12 s)
def test_verify_attn_compiles_for_sm_120(tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip(NO_NVCC)
    archs = subprocess.run([nvcc, "--list-gpu-arch"], capture_output=True, text=True, timeout=60).stdout.split()
    if "compute_120" not in archs:
        pytest.skip(f"this nvcc does not know compute_120 (it lists {' '.join(archs)}): CUDA 12.8 or later has it")
    # the flags of the kernels in a CUDA_ARCH="90 120" build with the Hopper kernel
    cmd = [nvcc, "-std=c++17", "-O2", "-gencode", "arch=compute_120,code=sm_120", "-Xcompiler=-Wall,-Wextra",
           "-Icuda_tests/include", "-Icuda_tests/kernels", "-DKDTR_HAVE_WGMMA=1",
           "-c", "cuda_tests/kernels/verify_attn.cu", "-o", str(tmp_path / "verify_attn_sm120.o")]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stderr[-4000:]}"
    assert (tmp_path / "verify_attn_sm120.o").stat().st_size > 0


def test_hopper_kernel_was_compiled_for_sm_90a(repo_root):
    if shutil.which("nvcc") is None:
        pytest.skip(NO_NVCC)
    fields = _stamp_fields((repo_root / "build" / "config.stamp").read_text())
    assert fields["variant"] == "cuda", f"build/ holds the {fields['variant']} variant although nvcc is on PATH"
    obj = repo_root / "build" / "obj" / "kernel_verify_attn_sm90.o"
    src = repo_root / "cuda_tests" / "kernels" / "verify_attn_sm90.cu"
    if not re.search(r"arch=compute_90a?,", fields["nvcc"]):
        pytest.skip(f"the build's CUDA_ARCH has no 90 ({fields['nvcc']}): no Hopper kernel asked for")
    if fields["wgmma"].startswith("wgmma=none"):
        wheel_ok = CACHED_WHEEL.is_file() and hashlib.sha256(CACHED_WHEEL.read_bytes()).hexdigest() == _pinned_sha256()
        assert not wheel_ok, (f"{CACHED_WHEEL} is the pinned wheel, yet build/ was built without the Hopper "
                              f"kernel: run `make build` (config stamp: {fields['wgmma']!r})")
        pytest.skip(f"build/ found no CUTLASS headers (no pinned wheel at {CACHED_WHEEL}; `make build` downloads it)")
    flags = fields["wgmma"]
    assert flags.startswith("wgmma=sm_90a"), flags
    # that one translation unit, for sm_90a only
    assert re.findall(r"-gencode \S+", flags) == ["-gencode arch=compute_90a,code=sm_90a"], flags
    assert "-DKDTR_HAVE_WGMMA=1" in flags and "-DKDTR_HAVE_WGMMA=1" in fields["nvcc"], fields
    assert obj.is_file(), f"{obj} missing although the build has the Hopper kernel"
    assert obj.stat().st_mtime >= src.stat().st_mtime, f"{obj} is older than {src}"
    for b in ("kdtr_verify_attn", "kdtr_greedy_step"):
        assert (repo_root / "build" / "bin" / b).stat().st_mtime >= obj.stat().st_mtime, f"{b} is older than {obj}"
    cuobjdump = shutil.which("cuobjdump")
    if cuobjdump is not None:
        elves = subprocess.run([cuobjdump, "--list-elf", str(obj)], capture_output=True, text=True,
                               timeout=60).stdout
        archs = set(re.findall(r"\.(sm_\w+)\.cubin", elves))
        assert archs == {"sm_90a"}, f"cuobjdump --list-elf {obj}: {elves}"
    else:  # the fatbinary records ptxas's options: "-arch sm_90a -m 64"
        data = obj.read_bytes()
        sm90a, other = b"-arch sm_90a " in data, re.findall(rb"-arch (sm_\w+) ", data)
        assert sm90a and set(other) == {b"sm_90a"}, f"{obj} holds code for {sorted(set(other))}, not sm_90a only"


# ---------------------------------------------------------------------------------------
# How make finds the CUTLASS headers (make -n in a scratch build directory)
# ---------------------------------------------------------------------------------------

def _make_n(tmp_path: Path, *args: str, targets=("obj/kernel_verify_attn.o", "bin/kdtr_verify_attn"),
            cache: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    build = tmp_path / "b"
    cmd = ["make", "-n", "--no-print-directory", f"BUILD={build}", "NVCC=true", "KDTR_CRC=zlib",
           f"CUTLASS_CACHE={cache or tmp_path / 'cache'}", *args, *(f"{build}/{t}" for t in targets)]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120,
                          env=None if env is None else {**os.environ, **env})


def _without_hopper(r: subprocess.CompletedProcess, why: str | None) -> None:
    assert r.returncode == 0, r.stderr
    notes = [ln for ln in r.stdout.splitlines() if ln.startswith("cutlass:")]
    if why is None:
        assert notes == [], notes
    else:
        assert len(notes) == 1, r.stdout
        assert re.search(why, notes[0]), notes[0]
        assert notes[0].endswith(": building without the Hopper verify_attn kernel (--kernel wgmma)"), notes[0]
    assert "-DKDTR_HAVE_WGMMA" not in r.stdout and "verify_attn_sm90" not in r.stdout, r.stdout
    assert "cuda_tests/kernels/verify_attn.cu" in r.stdout, r.stdout  # the rest is still built


def test_a_wheel_with_another_hash_builds_without_the_hopper_kernel(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / WHEEL_NAME).write_bytes(b"PK\x03\x04 not the pinned wheel")
    r = _make_n(tmp_path)
    _without_hopper(r, rf"{WHEEL_NAME} has sha256 [0-9a-f]{{64}}, not the pinned {_pinned_sha256()} "
                       r"\(remove it to download again\)")
    assert not (tmp_path / "b" / "third_party").exists() or not any((tmp_path / "b" / "third_party").rglob("*.h*"))
    assert "| wgmma=none " in (tmp_path / "b" / "config.stamp").read_text()


def test_a_cutlass_include_without_the_headers_builds_without_the_hopper_kernel(tmp_path):
    (tmp_path / "inc" / "cute").mkdir(parents=True)
    r = _make_n(tmp_path, f"CUTLASS_INCLUDE={tmp_path / 'inc'}")
    _without_hopper(r, r"CUTLASS_INCLUDE=\S+/inc holds no cute/tensor.hpp and cutlass/cutlass.h")


def test_a_failed_download_is_said_once_and_not_retried(tmp_path):
    """`make deps` with an unreachable index: the stamp keeps why; the next make says it."""
    env = {"PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_FIND_LINKS": "",
           "PIP_NO_INPUT": "1"}
    build = tmp_path / "b"
    r = subprocess.run(["make", "--no-print-directory", f"BUILD={build}", "NVCC=true", "KDTR_CRC=zlib",
                        f"CUTLASS_CACHE={tmp_path / 'cache'}", "deps"], cwd=REPO, capture_output=True, text=True,
                       timeout=180, env={**os.environ, **env})
    assert r.returncode == 0, r.stderr
    assert "deps: downloading nvidia-cutlass==4.2.0.0" in r.stdout, r.stdout
    assert (build / "cutlass.stamp").read_text().startswith("pip download nvidia-cutlass==4.2.0.0 failed")
    assert not (tmp_path / "cache" / WHEEL_NAME).exists()
    _without_hopper(_make_n(tmp_path, env=env), r"pip download nvidia-cutlass==4\.2\.0\.0 failed .* "
                                                r"remove \S+/cutlass\.stamp to try again")
    again = subprocess.run(["make", "-n", "--no-print-directory", f"BUILD={build}", "NVCC=true", "KDTR_CRC=zlib",
                            f"CUTLASS_CACHE={tmp_path / 'cache'}", "deps"], cwd=REPO, capture_output=True,
                           text=True, timeout=60, env={**os.environ, **env})
    assert "cutlass_headers.py" not in again.stdout, again.stdout  # tried once per build directory


def test_no_90_in_cuda_arch_builds_no_hopper_kernel_and_says_nothing(tmp_path):
    _without_hopper(_make_n(tmp_path, "CUDA_ARCH=120"), None)


def test_the_cached_wheel_is_extracted_offline_and_builds_the_hopper_kernel(tmp_path):
    if not CACHED_WHEEL.is_file():
        pytest.skip(f"no {CACHED_WHEEL} (`make build` downloads it)")
    cache = tmp_path / "cache"
    cache.mkdir()
    os.symlink(CACHED_WHEEL, cache / WHEEL_NAME)
    env = {"PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": "http://127.0.0.1:9/simple"}  # no network needed
    r = _make_n(tmp_path, 'CUDA_ARCH=90 120', cache=cache, env=env,
                targets=("obj/kernel_verify_attn.o", "obj/kernel_verify_attn_sm90.o", "bin/kdtr_greedy_step"))
    assert r.returncode == 0, r.stderr
    assert "cutlass:" not in r.stdout, r.stdout
    inc = tmp_path / "b" / "third_party" / "cutlass-4.2.0.0" / "include"
    assert (inc / "cute" / "tensor.hpp").is_file() and (inc / "cutlass" / "cutlass.h").is_file()
    assert [p.name for p in inc.parent.iterdir()] == ["include"]  # no temporary directory left
    lines = r.stdout.splitlines()
    sm90 = [ln for ln in lines if "-c cuda_tests/kernels/verify_attn_sm90.cu" in ln]
    va = [ln for ln in lines if "-c cuda_tests/kernels/verify_attn.cu" in ln]
    link = [ln for ln in lines if f"-o {tmp_path}/b/bin/kdtr_greedy_step" in ln]
    assert len(sm90) == 1 and len(va) == 1 and len(link) == 1, r.stdout
    assert re.findall(r"-gencode \S+", sm90[0]) == ["-gencode arch=compute_90a,code=sm_90a"], sm90[0]
    assert f"-isystem {inc}" in sm90[0] and "-DKDTR_HAVE_WGMMA=1" in sm90[0], sm90[0]
    assert re.findall(r"-gencode \S+", va[0]) == ["-gencode arch=compute_90,code=sm_90",
                                                   "-gencode arch=compute_120,code=sm_120"], va[0]
    assert "-DKDTR_HAVE_WGMMA=1" in va[0], va[0]
    assert "kernel_verify_attn_sm90.o" in link[0], link[0]
