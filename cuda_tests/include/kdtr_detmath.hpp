// kdtr_detmath.hpp -- kdtr.detmath's exp, log and fixed-order sum in C++ (host and device),
// bit for bit: the same IEEE double operations in the same order as the numpy code of
// kdtr/detmath.py (range reduction with ln 2 split in two, a fixed Horner polynomial, 2^k
// from bit patterns, a pairwise sum over a power-of-two padding), so that a CPU or CUDA
// port of a reference that uses them (ddtree_decode's drafter) computes the reference's
// bits.  Every multiply and add is its own rounding: a translation unit that includes this
// must be compiled without FMA contraction (g++ -ffp-contract=off; nvcc -fmad=false),
// which the Makefile does for the objects that use it.  tests/binaries/test_detmath_cpp.py
// holds the results against the Python.  Where the compiler honours it (clang, host and
// CUDA), `#pragma STDC FP_CONTRACT OFF` at the top of exp and log says the same inside them
// (a pragma in a compound statement: that block alone); g++ ignores it and nvcc's device pass
// knows only -fmad, so the flags remain the rule, and each Horner step is its own statement.
#pragma once

#include <cstdint>
#include <cstring>

#include "kdtr_hd.cuh"

namespace kdtr {
namespace detmath {

// The constants of kdtr/detmath.py, as hex literals (float(...).hex() of the Python values).
constexpr double kLn2Hi = 0x1.62e42fee00000p-1;
constexpr double kLn2Lo = 0x1.a39ef35793c76p-33;
constexpr double kInvLn2 = 0x1.71547652b82fep+0;
constexpr double kExpMax = 0x1.62e42fefa39efp+9;   // 709.782712893384
constexpr double kExpMin = -0x1.74910d52d3052p+9;  // -745.1332191019412
constexpr double kSqrt2 = 0x1.6a09e667f3bcdp+0;

KDTR_HD inline uint64_t bits_of(double x) {
  uint64_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}
KDTR_HD inline double from_bits(uint64_t u) {
  double x;
  memcpy(&x, &u, sizeof x);
  return x;
}
// 2.0 ** k for k in [-1022, 1023] (_pow2).
KDTR_HD inline double pow2(int64_t k) { return from_bits(static_cast<uint64_t>(k + 1023) << 52); }
// numpy's rint: round half to even (the default rounding mode's nearbyint).
KDTR_HD inline double rint_even(double x) {
#ifdef __CUDA_ARCH__
  return ::rint(x);
#else
  return __builtin_nearbyint(x);
#endif
}

// e ** x within 2 ulp, the bits of kdtr.detmath.exp.
KDTR_HD inline double exp(double x) {
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif
  if (x != x) return x;
  double xc = x < kExpMax ? x : kExpMax;
  xc = xc > kExpMin ? xc : kExpMin;
  const double k = rint_even(xc * kInvLn2);
  const double khi = k * kLn2Hi;
  double r = xc - khi;
  const double klo = k * kLn2Lo;
  r = r - klo;
  // 1/n!, n = 15..0 (Horner order).  Local tables: a namespace-scope array is host memory,
  // which device code cannot index.
  const double kExpPoly[16] = {
      0x1.ae7f3e733b81fp-41, 0x1.93974a8c07c9dp-37, 0x1.6124613a86d09p-33, 0x1.1eed8eff8d898p-29,
      0x1.ae64567f544e4p-26, 0x1.27e4fb7789f5cp-22, 0x1.71de3a556c734p-19, 0x1.a01a01a01a01ap-16,
      0x1.a01a01a01a01ap-13, 0x1.6c16c16c16c17p-10, 0x1.1111111111111p-7,  0x1.5555555555555p-5,
      0x1.5555555555555p-3,  0x1.0000000000000p-1,  0x1.0000000000000p+0,  0x1.0000000000000p+0};
  double p = kExpPoly[0];
  for (int i = 1; i < 16; ++i) {
    p = p * r;
    p = p + kExpPoly[i];
  }
  const int64_t ki = static_cast<int64_t>(k);
  const int64_t k1 = ki >> 1;  // floor division (arithmetic shift), as numpy's >>
  p = p * pow2(k1);
  p = p * pow2(ki - k1);
  if (x > kExpMax) return __builtin_inf();
  if (x < kExpMin) return 0.0;
  return p;
}

// Natural log within 2 ulp, the bits of kdtr.detmath.log.
KDTR_HD inline double log(double x) {
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif
  if (x != x || x < 0.0) return __builtin_nan("");
  if (x == 0.0) return -__builtin_inf();
  if (x == __builtin_inf()) return __builtin_inf();
  double xs = x;
  const bool sub = xs < 0x1p-1022;
  if (sub) xs = xs * 0x1p64;  // exact
  const uint64_t u = bits_of(xs);
  int64_t e = static_cast<int64_t>(u >> 52) - 1023 - (sub ? 64 : 0);
  double m = from_bits((u & ((uint64_t{1} << 52) - 1)) | (uint64_t{1023} << 52));  // [1, 2)
  const bool big = m > kSqrt2;
  if (big) m = m * 0.5;
  e += big ? 1 : 0;
  const double f = m - 1.0;
  const double s = f / (2.0 + f);
  const double z = s * s;
  // 2/(2n+1), n = 12..1 (Horner order).
  const double kLogPoly[12] = {0x1.47ae147ae147bp-4, 0x1.642c8590b2164p-4, 0x1.8618618618618p-4, 0x1.af286bca1af28p-4,
                               0x1.e1e1e1e1e1e1ep-4, 0x1.1111111111111p-3, 0x1.3b13b13b13b14p-3, 0x1.745d1745d1746p-3,
                               0x1.c71c71c71c71cp-3, 0x1.2492492492492p-2, 0x1.999999999999ap-2, 0x1.5555555555555p-1};
  double r = kLogPoly[0];
  for (int i = 1; i < 12; ++i) {
    r = r * z;
    r = r + kLogPoly[i];
  }
  r = r * z;
  const double ef = static_cast<double>(e);
  const double t1 = f - r;
  const double t2 = s * t1;
  const double t3 = f - t2;
  const double t4 = ef * kLn2Lo;
  const double t5 = t3 + t4;
  const double t6 = ef * kLn2Hi;
  return t6 + t5;
}

// kdtr.detmath.fixed_sum of a[0..n): the axis padded to a power of two with -0.0 (x + -0.0
// = x, so the padding is skipped), then halves added elementwise.  Overwrites a; n == 0: +0.0.
KDTR_HD inline double fixed_sum(double* a, int n) {
  if (n <= 0) return 0.0;
  int size = 1;
  while (size < n) size <<= 1;
  int len = n;
  while (size > 1) {
    size >>= 1;
    for (int i = 0; i < size && i + size < len; ++i) a[i] = a[i] + a[i + size];
    len = len < size ? len : size;
  }
  return a[0];
}

}  // namespace detmath
}  // namespace kdtr
