"""The select build's team code run by threads (tests/data/tree_select_team.cpp).

tree_build.cuh's select build is written for a team of lanes (docs/ops/tree_build.md,
"The CUDA kernels"): the CPU backend is a team of one, the CUDA kernels are teams of 256
or 1024 threads. This test compiles the same header into a program whose team is
std::threads (std::barrier, atomics) and runs random tie-heavy requests through it at the
CUDA teams' lane counts and sort chunk, and at narrower teams and other chunks, each tree
compared with the heap build's; once more under ThreadSanitizer (a missing barrier is a
data race); and once with a planted scan bug, which must fail. Skipped without a C++20
compiler (g++ with <barrier>).
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from conftest import REPO_ROOT

SRC = REPO_ROOT / "tests" / "data" / "tree_select_team.cpp"
INCLUDES = ["-I", str(REPO_ROOT / "cuda_tests" / "kernels"), "-I", str(REPO_ROOT / "cuda_tests" / "include")]
# (lanes, sort chunk, requests): a warp-wide team with one chunk of all pairs (256) and
# with merge rounds (chunk 32), two warps and the 256-thread block (chunk 64, the CUDA
# teams'), an odd team, and the CPU backend's team of one.
CONFIGS = [(32, 256, 600), (32, 32, 300), (64, 64, 400), (256, 64, 60), (7, 16, 600), (1, 8, 2000)]


def _compile(tmp_path, name, *flags):
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("no g++")
    exe = tmp_path / name
    r = subprocess.run([cxx, "-std=c++20", *flags, *INCLUDES, str(SRC), "-o", str(exe), "-lpthread"],
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        if "barrier" in r.stderr or "c++20" in r.stderr:
            pytest.skip(f"no C++20 <barrier>: {r.stderr.strip()[:200]}")
        raise AssertionError(r.stderr)
    return exe


@pytest.fixture(scope="module")
def team_exe(tmp_path_factory):
    return _compile(tmp_path_factory.mktemp("team"), "tree_select_team", "-O2")


@pytest.mark.parametrize("lanes,chunk,iters", CONFIGS)
def test_team_select_build_equals_heap_build(team_exe, lanes, chunk, iters):
    r = subprocess.run([str(team_exe), str(lanes), str(chunk), str(iters)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"lanes={lanes} chunk={chunk}: placed" in r.stdout and "bad 0" in r.stdout, r.stdout
    placed = int(r.stdout.split("placed ")[1].split(",")[0])
    assert placed >= iters // 2, r.stdout  # most requests are placed by the select build itself


@pytest.mark.slow
@pytest.mark.parametrize("lanes,chunk,iters", [(32, 256, 40), (64, 64, 30), (32, 16, 30)])
def test_team_select_build_has_no_data_race(tmp_path, lanes, chunk, iters):
    exe = _compile(tmp_path, "tree_select_team_tsan", "-O1", "-g", "-fsanitize=thread")
    r = subprocess.run([str(exe), str(lanes), str(chunk), str(iters)], capture_output=True, text=True, timeout=600)
    if "FATAL: ThreadSanitizer" in r.stderr:
        pytest.skip(f"ThreadSanitizer cannot run here: {r.stderr.strip()[:200]}")
    assert "WARNING: ThreadSanitizer" not in r.stderr, r.stderr[:4000]
    assert r.returncode == 0 and "bad 0" in r.stdout, r.stdout + r.stderr[:2000]


def test_planted_scan_bug_fails(tmp_path):
    exe = _compile(tmp_path, "tree_select_team_bug", "-O2", "-DPLANT_SCAN_BUG")
    r = subprocess.run([str(exe), "32", "256", "200"], capture_output=True, text=True, timeout=300)
    # Caught by either check of test_team_select_build_equals_heap_build: a wrong tree (the
    # exit status), or the select build giving up on most requests (an inclusive offset
    # leaves holes in the set and pushes runs past their entries, so every request whose
    # holes hold the poison's nonzero clamped bytes falls back to the heap build).
    placed = int(r.stdout.split("placed ")[1].split(",")[0]) if "placed " in r.stdout else 0
    assert r.returncode != 0 or placed < 200 // 2, r.stdout


@pytest.mark.parametrize("args", [["32", "0", "10"], ["0", "64", "10"], ["32", "64"]])
def test_bad_arguments_are_refused(team_exe, args):
    # A chunk of 0 would divide by zero in tree_select_sort; the program must refuse it
    # (and a team of no lanes, and a missing argument) with a message, not crash.
    r = subprocess.run([str(team_exe), *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "tree_select_team" in r.stderr and "placed" not in r.stdout
