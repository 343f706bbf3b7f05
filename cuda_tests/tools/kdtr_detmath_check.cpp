// kdtr_detmath_check.cpp -- build/bin/kdtr_detmath_check: kdtr_detmath.hpp's exp, log and
// fixed_sum on the host, for tests/binaries/test_detmath_check.py (the bits against
// kdtr.detmath's).  Compiled with -ffp-contract=off, as every user of the header must be.
//
// stdin, one request a line, every float64 as its bit pattern in 16 hex digits:
//   exp <bits>
//   log <bits>
//   sum <n> <bits_0> ... <bits_{n-1}>     (n >= 0; n == 0 sums to +0.0)
// stdout: one line per request, the result's bit pattern (16 hex digits, lower case).
// Empty lines are skipped.  A malformed line: one line on stderr naming its number, exit 2.

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "kdtr_detmath.hpp"

namespace {

uint64_t bits_of(double x) {
  uint64_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

double from_bits(uint64_t u) {
  double x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

// The next whitespace-separated token of `s` from `*pos` as a 64-bit hex number; false at
// the end of the line or on anything but 1..16 hex digits.
bool next_hex(const std::string& s, size_t* pos, uint64_t* out) {
  size_t i = s.find_first_not_of(" \t\r", *pos);
  if (i == std::string::npos) return false;
  size_t j = s.find_first_of(" \t\r", i);
  if (j == std::string::npos) j = s.size();
  if (j - i > 16) return false;
  uint64_t v = 0;
  for (size_t k = i; k < j; ++k) {
    const char c = s[k];
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      d = c - 'A' + 10;
    } else {
      return false;
    }
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  *out = v;
  *pos = j;
  return true;
}

bool next_word(const std::string& s, size_t* pos, std::string* out) {
  size_t i = s.find_first_not_of(" \t\r", *pos);
  if (i == std::string::npos) return false;
  size_t j = s.find_first_of(" \t\r", i);
  if (j == std::string::npos) j = s.size();
  *out = s.substr(i, j - i);
  *pos = j;
  return true;
}

bool at_end(const std::string& s, size_t pos) { return s.find_first_not_of(" \t\r", pos) == std::string::npos; }

int bad(long line_no, const char* what) {
  std::fprintf(stderr, "kdtr_detmath_check: line %ld: %s\n", line_no, what);
  return 2;
}

}  // namespace

int main() {
  std::ios::sync_with_stdio(false);
  std::string line, op;
  std::vector<double> a;
  long line_no = 0;
  while (std::getline(std::cin, line)) {
    ++line_no;
    size_t pos = 0;
    if (!next_word(line, &pos, &op)) continue;
    double y;
    if (op == "exp" || op == "log") {
      uint64_t u;
      if (!next_hex(line, &pos, &u) || !at_end(line, pos)) return bad(line_no, "expected `exp|log <16 hex digits>`");
      y = op == "exp" ? kdtr::detmath::exp(from_bits(u)) : kdtr::detmath::log(from_bits(u));
    } else if (op == "sum") {
      std::string count;
      if (!next_word(line, &pos, &count)) return bad(line_no, "expected `sum <n> <bits>...`");
      errno = 0;
      char* end = nullptr;
      const long n = std::strtol(count.c_str(), &end, 10);
      if (errno != 0 || *end != '\0' || n < 0 || n > (1L << 30)) return bad(line_no, "sum: n is not in [0, 2^30]");
      a.assign(static_cast<size_t>(n > 0 ? n : 1), 0.0);
      for (long i = 0; i < n; ++i) {
        uint64_t u;
        if (!next_hex(line, &pos, &u)) return bad(line_no, "sum: fewer than n bit patterns (16 hex digits each)");
        a[static_cast<size_t>(i)] = from_bits(u);
      }
      if (!at_end(line, pos)) return bad(line_no, "sum: more than n values");
      y = kdtr::detmath::fixed_sum(a.data(), static_cast<int>(n));
    } else {
      return bad(line_no, "unknown request (exp, log or sum)");
    }
    std::printf("%016llx\n", static_cast<unsigned long long>(bits_of(y)));
  }
  if (std::fflush(stdout) != 0) return bad(line_no, "could not write stdout");
  return 0;
}
