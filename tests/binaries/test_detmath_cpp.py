"""cuda_tests/include/kdtr_detmath.hpp gives kdtr.detmath's bits: exp and log of values over
the whole double range (subnormals, the overflow and underflow edges, NaN, infinities,
signed zeros, negatives) and fixed_sum of arrays of every length up to 70 and a few longer,
compiled as the decode core is (g++ -O2 -ffp-contract=off), compared bit for bit."""

from __future__ import annotations

import shutil
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pytest

from kdtr import detmath

REPO = Path(__file__).resolve().parents[2]
PROGRAM = textwrap.dedent("""
    #include <cstdint>
    #include <cstdio>
    #include <cstring>
    #include <string>
    #include <vector>
    #include "kdtr_detmath.hpp"
    static double d(unsigned long long u) { double x; std::memcpy(&x, &u, 8); return x; }
    static unsigned long long u(double x) { unsigned long long v; std::memcpy(&v, &x, 8); return v; }
    int main(int argc, char** argv) {
      const std::string mode = argc > 1 ? argv[1] : "";
      unsigned long long v;
      if (mode == "sum") {
        int n;
        while (std::scanf("%d", &n) == 1) {
          std::vector<double> a(n > 0 ? n : 1);
          for (int i = 0; i < n; ++i) { if (std::scanf("%llx", &v) != 1) return 2; a[i] = d(v); }
          std::printf("%016llx\\n", u(kdtr::detmath::fixed_sum(a.data(), n)));
        }
        return 0;
      }
      while (std::scanf("%llx", &v) == 1) {
        const double x = d(v);
        std::printf("%016llx\\n", u(mode == "exp" ? kdtr::detmath::exp(x) : kdtr::detmath::log(x)));
      }
      return 0;
    }
""")


@pytest.fixture(scope="module")
def prog(tmp_path_factory) -> Path:
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler (g++ / c++) on PATH")
    d = tmp_path_factory.mktemp("detmath")
    (d / "main.cpp").write_text(PROGRAM)
    exe = d / "detmath"
    r = subprocess.run([cxx, "-std=c++17", "-O2", "-ffp-contract=off", "-Wall", "-Wextra", "-Werror",
                        f"-I{REPO / 'cuda_tests' / 'include'}", f"-I{REPO / 'cuda_tests' / 'kernels'}",
                        str(d / "main.cpp"), "-o", str(exe)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return exe


def _run(prog: Path, mode: str, text: str) -> np.ndarray:
    r = subprocess.run([str(prog), mode], input=text, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return np.array([int(h, 16) for h in r.stdout.split()], np.uint64)


def _hex(x: np.ndarray) -> str:
    return "\n".join(f"{int(b):016x}" for b in np.ascontiguousarray(x, np.float64).view(np.uint64))


def _same_bits(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Per element: equal bits, or both NaN."""
    g, w = got.view(np.float64), np.ascontiguousarray(want, np.float64)
    return (got == w.view(np.uint64)) | (np.isnan(g) & np.isnan(w))


def _values(rng: np.random.Generator) -> np.ndarray:
    bits = rng.integers(0, 2**63, size=40_000, dtype=np.uint64) | (rng.integers(0, 2, size=40_000, dtype=np.uint64)
                                                                     << np.uint64(63))
    wide = bits.view(np.float64)  # every exponent, subnormals, NaN and infinities among them
    edges = np.concatenate([np.linspace(-800, 800, 20_001), np.nextafter(detmath.EXP_MAX, [-np.inf, np.inf]),
                            np.nextafter(detmath.EXP_MIN, [-np.inf, np.inf]), [detmath.EXP_MAX, detmath.EXP_MIN],
                            1 + np.linspace(-1e-3, 1e-3, 2001), np.linspace(-40, 0, 4001)])
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 5e-324, -5e-324, 2.2250738585072014e-308,
                        1.0, 2.0, 0.5, np.sqrt(2), np.sqrt(2) / 2, 1.7976931348623157e308])
    return np.concatenate([wide, edges, special])


@pytest.mark.parametrize("fn", ["exp", "log"])
def test_exp_and_log_bits_equal_kdtr_detmath(prog, fn):
    x = _values(np.random.default_rng(20261202))
    if fn == "log":
        x = np.concatenate([x, np.abs(x)])
    with np.errstate(all="ignore"):
        want = getattr(detmath, fn)(x)
    ok = _same_bits(_run(prog, fn, _hex(x)), want)
    assert ok.all(), f"{fn}: {int((~ok).sum())} of {len(x)} differ, first at x = {x[~ok][0]!r}"


def test_fixed_sum_bits_equal_kdtr_detmath(prog):
    rng = np.random.default_rng(7)
    arrays = [rng.standard_normal(n) * 10.0 ** rng.integers(-5, 6, size=n) for n in range(0, 71)]
    arrays += [rng.standard_normal(n) for n in (255, 256, 257, 1000, 4096)]
    arrays += [np.array([1e16, 1.0, -1e16, 1.0]), np.array([-0.0, -0.0, -0.0]), np.array([np.inf, -np.inf, 1.0])]
    text = "\n".join(f"{len(a)} " + " ".join(_hex(a).split()) for a in arrays)
    got = _run(prog, "sum", text)
    with np.errstate(all="ignore"):
        want = np.array([detmath.fixed_sum(a) for a in arrays])
    ok = _same_bits(got, want)
    assert ok.all(), f"fixed_sum: lengths {[len(a) for a, k in zip(arrays, ok) if not k]} differ"
