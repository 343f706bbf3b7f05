// kdtr.hpp -- header-only reader and writer for KDTR v1 files (C++17, POSIX, zlib).
//
// KDTR is a little-endian container of named tensors plus flat typed metadata; the
// normative specification is docs/kdtr-format.md and this header implements every rule
// of its section 3, raising the error names listed there (the Python package `kdtr`
// raises exceptions of the same names).  Summary of the layout:
//
//   offset 0   preamble, 16 bytes: magic "\x89KDTR\r\n\x1a", u16 version_major (= 1),
//              u16 version_minor, u32 header_len (12 <= header_len <= 16 MiB)
//   offset 16  header, header_len bytes: u32 tensor_count, u32 metadata_count,
//              tensor entries, metadata entries, extension (empty in 1.0), u32 header_crc32
//              (CRC-32 of file bytes [0, 16 + header_len - 4))
//   then       tensor data, each tensor at a multiple of 64, zero padding in between;
//              the file ends where the tensor data that ends last ends.
//   tensor entry:   u16 name_len, name (UTF-8), u8 dtype, u8 ndim, u64 shape[ndim],
//                   u64 offset, u64 nbytes, u32 crc32 (of the tensor's data)
//   metadata entry: u16 key_len, key (UTF-8), u8 type (1 int, 2 float, 3 string, 4 bool),
//                   value (i64 | f64 | u32 length + UTF-8 bytes | u8 0/1)
//
// Use: `#include "kdtr.hpp"` and link with -lz.  Little-endian hosts only.
// CRC-32: zlib's crc32() by default; with -DKDTR_HAVE_ISAL (set by the Makefile when its
// probe finds ISA-L, libisal-dev) ISA-L's crc32_gzip_refl computes the same CRC-32
// several times faster: link with -lisal too.  kdtr::crc32_implementation() names the one
// compiled in (`kdtr_check --version` prints it).  A CRC over 32 MiB or more runs on up to
// 4 threads (KDTR_CRC_THREADS=1 keeps one): link with -lpthread where glibc < 2.34.
//
//   kdtr::File f = kdtr::File::open("golden/tree_accept/default.kdtr");  // validates all
//   const int32_t* nc = f.get<int32_t>("input.node_count", {-1});        // dtype + shape
//   kdtr::Writer w;
//   w.add<int32_t>("status", {B}, status.data());
//   w.set_metadata("op", "tree_accept");
//   w.write("out.kdtr");                                                 // atomic
//
// Validation order (docs/kdtr-format.md section 3): preamble fields in file order (a file
// that ends inside a field is Truncated), header_len rules, then the header CRC (before
// any field after header_len is interpreted), then every header field in file order, then
// the data region (padding bytes, trailing bytes), then with verify=true each tensor's
// CRC-32 and, for bool tensors, its byte values, tensor by tensor in header order.
// Validation never uses assert(); every check survives -DNDEBUG.
//
// Zero-byte tensors: a tensor with nbytes == 0 occupies no bytes, but its range
// [offset, offset) still counts for "where the tensor data ends": the canonical writer
// puts every tensor, empty or not, at the next multiple of 64 and writes zero padding up
// to it, so the file ends at max(16 + header_len, max over tensors of offset + nbytes).
// This is the only reading under which the canonical layout of a file whose last tensor
// is empty is itself valid.

#pragma once

#include <zlib.h>
#if defined(KDTR_HAVE_ISAL) && KDTR_HAVE_ISAL
#include <isa-l/crc.h>
#if __has_include(<isa-l.h>)
#include <isa-l.h>  // ISAL_MAJOR_VERSION ... (older releases lack it)
#endif
#endif

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kdtr.hpp supports little-endian hosts only"
#endif

namespace kdtr {

// ---------------------------------------------------------------------------------------
// Constants (docs/kdtr-format.md section 6)
// ---------------------------------------------------------------------------------------

inline constexpr uint8_t MAGIC[8] = {0x89, 'K', 'D', 'T', 'R', '\r', '\n', 0x1a};
inline constexpr uint16_t VERSION_MAJOR = 1;
inline constexpr uint16_t VERSION_MINOR = 0;  // what the writer writes
inline constexpr uint64_t PREAMBLE_LEN = 16;
inline constexpr uint64_t MIN_HEADER_LEN = 12;  // tensor_count + metadata_count + crc
inline constexpr uint64_t MAX_HEADER_LEN = 16u * 1024u * 1024u;
inline constexpr uint64_t MAX_TENSORS = 4096;
inline constexpr uint64_t MAX_METADATA = 4096;
inline constexpr uint64_t MAX_NDIM = 8;
inline constexpr uint64_t MAX_NAME_LEN = 255;
inline constexpr uint64_t MAX_STRING_LEN = 1024u * 1024u;
inline constexpr uint64_t ALIGNMENT = 64;

// Error::offset() of errors that are not about a byte of a file (MissingTensor, Io, ...).
inline constexpr uint64_t NO_OFFSET = std::numeric_limits<uint64_t>::max();

// ---------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------

namespace detail {

// Code points that are not printable although valid: C1 controls, non-space separators
// (no-break, line and paragraph separators) and the format characters that reorder or
// hide text (bidi overrides and isolates, zero-width characters, byte-order mark),
// plus the non-characters U+FFFE / U+FFFF.  Python's str.isprintable() is false for all
// of them, so kdtr/text.py escapes them too.
inline bool unprintable_code_point(uint32_t cp) {
  static const uint32_t ranges[][2] = {{0x80, 0xA0},     {0xAD, 0xAD},     {0x600, 0x605},   {0x61C, 0x61C},
                                       {0x6DD, 0x6DD},   {0x70F, 0x70F},   {0x1680, 0x1680}, {0x180E, 0x180E},
                                       {0x2000, 0x200F}, {0x2028, 0x202F}, {0x205F, 0x206F}, {0x3000, 0x3000},
                                       {0xFEFF, 0xFEFF}, {0xFFF9, 0xFFFB}, {0xFFFE, 0xFFFF}};
  for (const auto& r : ranges)
    if (cp >= r[0] && cp <= r[1]) return true;
  return false;
}

// Length of the well-formed UTF-8 sequence at s[i] and its code point; 0 if ill-formed
// (overlong, surrogate, beyond U+10FFFF, truncated).
inline size_t utf8_sequence(const std::string& s, size_t i, uint32_t* cp) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  size_t n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
  if (n == 0 || c > 0xF4 || i + n > s.size()) return 0;
  uint32_t v = c & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return 0;
    v = (v << 6) | (b(i + k) & 0x3F);
  }
  static const uint32_t min_of[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (v < min_of[n] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
  *cp = v;
  return n;
}

}  // namespace detail

// `s` on one line, safe for a terminal or a report: control characters (NUL and line
// breaks included, which names in a KDTR file may hold) written as \xNN, the unprintable
// code points above as \xNN (below U+0100) or \uNNNN, and every byte that is not part of
// well-formed UTF-8 (a path in another encoding) as \xNN -- the spelling of kdtr/text.py.
// With escape_backslash, '\' is written \x5c too, so the result is unambiguous.
inline std::string escape_control(const std::string& s, bool escape_backslash = false) {
  std::string out;
  char buf[16];
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      if (c < 0x20 || c == 0x7f || (escape_backslash && c == '\\')) {
        std::snprintf(buf, sizeof buf, "\\x%02x", c);
        out += buf;
      } else {
        out += static_cast<char>(c);
      }
      ++i;
      continue;
    }
    uint32_t cp = 0;
    const size_t n = detail::utf8_sequence(s, i, &cp);
    if (n == 0) {  // not UTF-8: the byte itself
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
      ++i;
    } else if (detail::unprintable_code_point(cp)) {
      std::snprintf(buf, sizeof buf, cp < 0x100 ? "\\x%02x" : "\\u%04x", static_cast<unsigned>(cp));
      out += buf;
      i += n;
    } else {
      out.append(s, i, n);
      i += n;
    }
  }
  return out;
}

// One code per defect.  The format codes (BadMagic .. BadBoolValue) are those of
// docs/kdtr-format.md section 3; the rest are raised by this library's API.
enum class ErrorCode {
  BadMagic,
  UnsupportedVersion,
  Truncated,
  HeaderTooLarge,
  HeaderPastEnd,
  TooManyTensors,
  TooManyMetadata,
  TooManyDims,
  BadName,
  DuplicateName,
  UnknownDtype,
  SizeOverflow,
  NbytesMismatch,
  MisalignedOffset,
  OffsetOutOfFile,
  OverlappingTensors,
  NonZeroPadding,
  TrailingBytes,
  BadMetadata,
  ExtensionInV10,
  HeaderChecksumMismatch,
  TensorChecksumMismatch,
  BadBoolValue,
  Io,               // open/read/write/fsync/rename failed
  MissingTensor,    // File::tensor / File::get of a name the file does not hold
  WrongDtype,       // TensorView::as / File::get with the wrong element type
  WrongShape,       // File::get with a shape the tensor does not have
  InvalidArgument,  // a Writer call with an argument it cannot store (null data, ...)
};

// The enumerator's spelling, e.g. "HeaderChecksumMismatch".
inline const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::BadMagic: return "BadMagic";
    case ErrorCode::UnsupportedVersion: return "UnsupportedVersion";
    case ErrorCode::Truncated: return "Truncated";
    case ErrorCode::HeaderTooLarge: return "HeaderTooLarge";
    case ErrorCode::HeaderPastEnd: return "HeaderPastEnd";
    case ErrorCode::TooManyTensors: return "TooManyTensors";
    case ErrorCode::TooManyMetadata: return "TooManyMetadata";
    case ErrorCode::TooManyDims: return "TooManyDims";
    case ErrorCode::BadName: return "BadName";
    case ErrorCode::DuplicateName: return "DuplicateName";
    case ErrorCode::UnknownDtype: return "UnknownDtype";
    case ErrorCode::SizeOverflow: return "SizeOverflow";
    case ErrorCode::NbytesMismatch: return "NbytesMismatch";
    case ErrorCode::MisalignedOffset: return "MisalignedOffset";
    case ErrorCode::OffsetOutOfFile: return "OffsetOutOfFile";
    case ErrorCode::OverlappingTensors: return "OverlappingTensors";
    case ErrorCode::NonZeroPadding: return "NonZeroPadding";
    case ErrorCode::TrailingBytes: return "TrailingBytes";
    case ErrorCode::BadMetadata: return "BadMetadata";
    case ErrorCode::ExtensionInV10: return "ExtensionInV10";
    case ErrorCode::HeaderChecksumMismatch: return "HeaderChecksumMismatch";
    case ErrorCode::TensorChecksumMismatch: return "TensorChecksumMismatch";
    case ErrorCode::BadBoolValue: return "BadBoolValue";
    case ErrorCode::Io: return "Io";
    case ErrorCode::MissingTensor: return "MissingTensor";
    case ErrorCode::WrongDtype: return "WrongDtype";
    case ErrorCode::WrongShape: return "WrongShape";
    case ErrorCode::InvalidArgument: return "InvalidArgument";
  }
  return "Unknown";
}

// Every error of this library.  what() is "<path>: <field> at offset <offset>: <detail>",
// or "<path>: <field>: <detail>" when offset() == NO_OFFSET (errors not about a byte of
// the file: Io, MissingTensor, WrongDtype, WrongShape, InvalidArgument, writer errors),
// with control characters (from names in the file) written as \xNN, so it is one line.
// path() is the file ("<writer>" for Writer::add / set_metadata), field() the header
// field or tensor name (e.g. "tensors[2].offset", "metadata[\"op\"]", "input.q").
class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, std::string path, std::string field, uint64_t offset, std::string detail)
      : std::runtime_error(format(path, field, offset, detail)),
        code_(code),
        path_(std::move(path)),
        field_(std::move(field)),
        offset_(offset),
        detail_(std::move(detail)) {}

  ErrorCode code() const noexcept { return code_; }
  const char* code_name() const noexcept { return error_code_name(code_); }
  const std::string& path() const noexcept { return path_; }
  const std::string& field() const noexcept { return field_; }
  uint64_t offset() const noexcept { return offset_; }
  bool has_offset() const noexcept { return offset_ != NO_OFFSET; }
  const std::string& detail() const noexcept { return detail_; }

 private:
  static std::string format(const std::string& path, const std::string& field, uint64_t offset,
                            const std::string& detail) {
    std::string s = path + ": " + field;
    if (offset != NO_OFFSET) s += " at offset " + std::to_string(offset);
    s += ": " + detail;
    // Names in a file may hold any UTF-8, NUL and line breaks included: what() is a C
    // string meant to print as one line, so control characters become \xNN.
    std::string out;
    out.reserve(s.size());
    for (unsigned char c : s) {
      if (c < 0x20 || c == 0x7f) {
        static const char hex[] = "0123456789abcdef";
        out += "\\x";
        out += hex[c >> 4];
        out += hex[c & 15];
      } else {
        out += static_cast<char>(c);
      }
    }
    return out;
  }

  ErrorCode code_;
  std::string path_;
  std::string field_;
  uint64_t offset_;
  std::string detail_;
};

// ---------------------------------------------------------------------------------------
// Dtypes (docs/kdtr-format.md section 2)
// ---------------------------------------------------------------------------------------

// The on-disk code of each dtype.  bool is one byte 0/1 (read it as uint8_t); f16 and
// bf16 are their uint16_t bit patterns.
enum class DType : uint8_t { Bool = 1, U8, I8, I16, U16, I32, U32, I64, U64, F16, BF16, F32, F64 };

inline bool is_valid_dtype_code(uint8_t code) { return code >= 1 && code <= 13; }

// Bytes per element; 0 for a code outside the table.
inline size_t dtype_itemsize(DType dt) {
  switch (dt) {
    case DType::Bool:
    case DType::U8:
    case DType::I8: return 1;
    case DType::I16:
    case DType::U16:
    case DType::F16:
    case DType::BF16: return 2;
    case DType::I32:
    case DType::U32:
    case DType::F32: return 4;
    case DType::I64:
    case DType::U64:
    case DType::F64: return 8;
  }
  return 0;
}

// The spec's name: bool, u8, i8, i16, u16, i32, u32, i64, u64, f16, bf16, f32, f64.
inline const char* dtype_name(DType dt) {
  switch (dt) {
    case DType::Bool: return "bool";
    case DType::U8: return "u8";
    case DType::I8: return "i8";
    case DType::I16: return "i16";
    case DType::U16: return "u16";
    case DType::I32: return "i32";
    case DType::U32: return "u32";
    case DType::I64: return "i64";
    case DType::U64: return "u64";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::F32: return "f32";
    case DType::F64: return "f64";
  }
  return "unknown";
}

namespace detail {
template <class T>
struct always_false : std::false_type {};
}  // namespace detail

// The dtype that a C++ element type stands for.  bool, f16 and bf16 tensors have no C++
// type of their own: read them with TensorView::as<uint8_t/uint16_t>(DType::Bool/F16/BF16).
template <class T>
constexpr DType dtype_of() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, uint8_t>) return DType::U8;
  else if constexpr (std::is_same_v<U, int8_t>) return DType::I8;
  else if constexpr (std::is_same_v<U, int16_t>) return DType::I16;
  else if constexpr (std::is_same_v<U, uint16_t>) return DType::U16;
  else if constexpr (std::is_same_v<U, int32_t>) return DType::I32;
  else if constexpr (std::is_same_v<U, uint32_t>) return DType::U32;
  else if constexpr (std::is_same_v<U, int64_t>) return DType::I64;
  else if constexpr (std::is_same_v<U, uint64_t>) return DType::U64;
  else if constexpr (std::is_same_v<U, float>) return DType::F32;
  else if constexpr (std::is_same_v<U, double>) return DType::F64;
  else static_assert(detail::always_false<T>::value, "kdtr::dtype_of: no KDTR dtype for this type");
}

// ---------------------------------------------------------------------------------------
// Helpers shared by reader and writer
// ---------------------------------------------------------------------------------------

namespace detail {

// Strict UTF-8 (as Python's str.decode("utf-8")): no overlong forms, no surrogates,
// nothing above U+10FFFF.
inline bool valid_utf8(const uint8_t* s, uint64_t n) {
  uint64_t i = 0;
  while (i < n) {
    const uint8_t c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    uint64_t len;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
      cp = c & 0x1Fu;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      cp = c & 0x0Fu;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      cp = c & 0x07u;
    } else return false;
    if (n - i < len) return false;
    for (uint64_t k = 1; k < len; ++k) {
      const uint8_t b = s[i + k];
      if ((b & 0xC0u) != 0x80u) return false;
      cp = (cp << 6) | (b & 0x3Fu);
    }
    if (len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) return false;
    if (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) return false;
    i += len;
  }
  return true;
}

inline bool valid_utf8(const std::string& s) {
  return valid_utf8(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

// zlib's CRC-32 over any length (crc32() takes a 32-bit length, so feed 1 GiB chunks).
inline uint32_t crc32_zlib(const uint8_t* p, uint64_t n) {
  uLong crc = ::crc32(0L, Z_NULL, 0);
  constexpr uint64_t kChunk = uint64_t{1} << 30;
  while (n > 0) {
    const uint64_t step = n < kChunk ? n : kChunk;
    crc = ::crc32(crc, p, static_cast<uInt>(step));
    p += step;
    n -= step;
  }
  return static_cast<uint32_t>(crc);
}

#if defined(KDTR_HAVE_ISAL) && KDTR_HAVE_ISAL
// The same CRC-32 by ISA-L: crc32_gzip_refl is the reflected CRC-32 of gzip and zlib
// (polynomial 0xEDB88320 reflected, initial and final XOR 0xFFFFFFFF applied inside, a
// 64-bit length), so crc32_gzip_refl(0, p, n) == crc32(0, p, n) for every input
// (tests/test_format_fast.py checks it).  Not crc32_ieee: that is the unreflected CRC.
inline uint32_t crc32_isal(const uint8_t* p, uint64_t n) { return ::crc32_gzip_refl(0, p, n); }
#endif

// One thread's CRC-32: ISA-L's where the build found it, else zlib's.
inline uint32_t crc32_serial(const uint8_t* p, uint64_t n) {
#if defined(KDTR_HAVE_ISAL) && KDTR_HAVE_ISAL
  return crc32_isal(p, n);
#else
  return crc32_zlib(p, n);
#endif
}

// A CRC of at least this many bytes is split over crc32_threads() threads.
inline constexpr uint64_t kCrcParallelMin = uint64_t{32} << 20;

// Threads for one large CRC: the environment variable KDTR_CRC_THREADS when it holds an
// integer in [1, 64] (1: one thread), else the hardware threads, at most 4 (a single
// core's CRC runs near the memory bandwidth it can draw; a few cores cover the rest).
inline unsigned crc32_threads() {
  static const unsigned n = [] {
    if (const char* e = std::getenv("KDTR_CRC_THREADS")) {
      char* end = nullptr;
      const long v = std::strtol(e, &end, 10);
      if (*e && end && !*end && v >= 1 && v <= 64) return static_cast<unsigned>(v);
    }
    const unsigned hw = std::thread::hardware_concurrency();
    return hw == 0 ? 1u : std::min(hw, 4u);
  }();
  return n;
}

// The CRC-32 of every checksum the reader verifies and the writer stores: crc32_serial,
// or for kCrcParallelMin bytes and more, k equal parts on k threads joined with zlib's
// crc32_combine (the CRC of a concatenation from the parts' CRCs; exact, any CRC-32 of
// this polynomial).  Should a thread not start, the main thread computes its part.
inline uint32_t crc32_bytes(const uint8_t* p, uint64_t n, unsigned threads = 0) {
  const unsigned k = threads ? threads : crc32_threads();
  if (k < 2 || n < kCrcParallelMin || sizeof(z_off_t) < 8) return crc32_serial(p, n);
  const uint64_t step = n / k;
  auto part_len = [&](unsigned t) { return t + 1 == k ? n - t * step : step; };
  std::vector<uint32_t> part(k);
  std::vector<std::thread> pool;
  pool.reserve(k - 1);
  unsigned started = 1;
  try {
    for (; started < k; ++started) {
      const unsigned t = started;
      pool.emplace_back([&part, p, t, step, len = part_len(t)] { part[t] = crc32_serial(p + t * step, len); });
    }
  } catch (const std::system_error&) {
    // no more threads here: the main thread takes the parts not started
  }
  part[0] = crc32_serial(p, step);
  for (unsigned t = started; t < k; ++t) part[t] = crc32_serial(p + t * step, part_len(t));
  for (std::thread& th : pool) th.join();
  uLong crc = part[0];
  for (unsigned t = 1; t < k; ++t) crc = ::crc32_combine(crc, part[t], static_cast<z_off_t>(part_len(t)));
  return static_cast<uint32_t>(crc);
}

inline uint64_t load_le(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int k = n - 1; k >= 0; --k) v = (v << 8) | p[k];
  return v;
}

inline void store_le(std::vector<uint8_t>& out, uint64_t v, int n) {
  for (int k = 0; k < n; ++k) out.push_back(static_cast<uint8_t>(v >> (8 * k)));
}

inline uint64_t align_up(uint64_t x) { return (x + (ALIGNMENT - 1)) / ALIGNMENT * ALIGNMENT; }

inline std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

inline std::string quoted(const std::string& s) { return "\"" + s + "\""; }

inline std::string shape_str(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t k = 0; k < shape.size(); ++k) s += (k ? "," : "") + std::to_string(shape[k]);
  return s + "]";
}

// The size rule (docs/kdtr-format.md sections 1.3 and 3): the product of the nonzero dims
// times the itemsize must not exceed INT64_MAX (2**63 - 1), checked left to right over the
// nonzero dims, then times the itemsize.  Returns false when it does (SizeOverflow).
// Otherwise *numel = product(shape) and *nbytes = product(shape) x itemsize, both 0 when a
// dim is 0, and both fit in int64_t.
inline bool checked_nbytes(const std::vector<uint64_t>& shape, uint64_t itemsize, uint64_t* numel, uint64_t* nbytes) {
  constexpr uint64_t kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  uint64_t n = 1;
  bool empty = false;
  for (uint64_t d : shape) {
    if (d == 0) {
      empty = true;
      continue;
    }
    if (__builtin_mul_overflow(n, d, &n) || n > kMax) return false;
  }
  uint64_t b;
  if (__builtin_mul_overflow(n, itemsize, &b) || b > kMax) return false;
  *numel = empty ? 0 : n;
  *nbytes = empty ? 0 : b;
  return true;
}

inline std::string errno_text(int err) { return std::strerror(err); }

// The bytes of an open file: an mmap of the whole file (read-only, shared by every copy of
// the File and its TensorViews), or an owned buffer.
struct Storage {
  const uint8_t* data = nullptr;
  uint64_t size = 0;
  void* map = nullptr;
  size_t map_len = 0;
  std::vector<uint8_t> owned;

  Storage() = default;
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage() {
    if (map != nullptr) ::munmap(map, map_len);
  }
};

// "a FIFO", "a directory", ... for "not a regular file" messages.
inline const char* file_type_text(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a plain file";
}

// Open `path` for reading without ever blocking: a FIFO with no writer, a socket, a tty
// or any other non-regular file is refused as Io "not a regular file (a FIFO)".  stat()
// first (so a socket gets that message, not open()'s ENXIO), then open() with O_NONBLOCK
// (so a FIFO swapped in after the stat cannot block), then fstat() of what was opened.
inline std::shared_ptr<Storage> map_file(const std::string& path) {
  auto st = std::make_shared<Storage>();
  struct stat sb;
  if (::stat(path.c_str(), &sb) == 0 && !S_ISREG(sb.st_mode))
    throw Error(ErrorCode::Io, path, "file", NO_OFFSET,
                std::string("not a regular file (") + file_type_text(sb.st_mode) + ")");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) throw Error(ErrorCode::Io, path, "file", NO_OFFSET, "cannot open: " + errno_text(errno));
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  if (::fstat(fd, &sb) != 0) throw Error(ErrorCode::Io, path, "file", NO_OFFSET, "cannot stat: " + errno_text(errno));
  if (!S_ISREG(sb.st_mode))
    throw Error(ErrorCode::Io, path, "file", NO_OFFSET,
                std::string("not a regular file (") + file_type_text(sb.st_mode) + ")");
  const int flags = ::fcntl(fd, F_GETFL);  // a regular file: back to blocking reads
  if (flags >= 0) (void)::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  const uint64_t size = static_cast<uint64_t>(sb.st_size);
  if (size > std::numeric_limits<size_t>::max())
    throw Error(ErrorCode::Io, path, "file", NO_OFFSET, "file too large for this address space");
  st->size = size;
  if (size == 0) return st;  // data stays null; the preamble check reports Truncated
  void* m = ::mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_PRIVATE, fd, 0);
  if (m != MAP_FAILED) {
    st->map = m;
    st->map_len = static_cast<size_t>(size);
    st->data = static_cast<const uint8_t*>(m);
    return st;
  }
  // mmap can fail on odd file systems: fall back to reading the file.
  st->owned.resize(static_cast<size_t>(size));
  uint64_t got = 0;
  while (got < size) {
    const ssize_t r = ::pread(fd, st->owned.data() + got, static_cast<size_t>(size - got), static_cast<off_t>(got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw Error(ErrorCode::Io, path, "file", NO_OFFSET, "cannot read: " + errno_text(errno));
    if (r == 0) throw Error(ErrorCode::Io, path, "file", NO_OFFSET, "file shrank while reading");
    got += static_cast<uint64_t>(r);
  }
  st->data = st->owned.data();
  return st;
}

}  // namespace detail

// Which CRC-32 implementation this build computes checksums with (the values are the
// same either way): "isa-l <version> crc32_gzip_refl" or "zlib <version> crc32".
inline std::string crc32_implementation() {
#if defined(KDTR_HAVE_ISAL) && KDTR_HAVE_ISAL
#if defined(ISAL_MAJOR_VERSION)
  return "isa-l " + std::to_string(ISAL_MAJOR_VERSION) + "." + std::to_string(ISAL_MINOR_VERSION) + "." +
         std::to_string(ISAL_PATCH_VERSION) + " crc32_gzip_refl";
#else
  return "isa-l crc32_gzip_refl";
#endif
#else
  return std::string("zlib ") + zlibVersion() + " crc32";
#endif
}

// ---------------------------------------------------------------------------------------
// Reader
// ---------------------------------------------------------------------------------------

// One tensor of an open File: a read-only view into the file's bytes, valid while the
// File (or any copy of it) lives.  data is 64-byte aligned relative to the file start.
struct TensorView {
  std::string name;
  DType dtype = DType::U8;
  std::vector<uint64_t> shape;  // C order; empty for a 0-d tensor
  uint64_t offset = 0;          // absolute byte offset of the data in the file
  uint64_t nbytes = 0;
  const uint8_t* data = nullptr;
  std::string file;  // the path of the File this view belongs to (for error messages)

  // product(shape); 1 for a 0-d tensor.  Never overflows (checked when the file opened).
  uint64_t numel() const {
    uint64_t n = 1;
    for (uint64_t d : shape) n *= d;
    return n;
  }

  // The data as T.  Throws Error(WrongDtype) unless dtype == dtype_of<T>().
  template <class T>
  const T* as() const {
    return as<T>(dtype_of<T>());
  }

  // The data as T for a tensor of dtype `expected` (e.g. as<uint16_t>(DType::BF16),
  // as<uint8_t>(DType::Bool)).  Throws Error(WrongDtype) unless dtype == expected and
  // sizeof(T) == itemsize(expected).
  template <class T>
  const T* as(DType expected) const {
    if (dtype != expected || sizeof(T) != dtype_itemsize(expected))
      throw Error(
          ErrorCode::WrongDtype, file, name, NO_OFFSET,
          std::string("tensor has dtype ") + dtype_name(dtype) + ", expected " + dtype_name(expected) +
              (sizeof(T) != dtype_itemsize(expected) ? " (read through a " + std::to_string(sizeof(T)) + "-byte type)"
                                                     : std::string()));
    return reinterpret_cast<const T*>(data);
  }
};

// A metadata value: KDTR type 1 int (int64_t), 2 float (double), 3 string, 4 bool.
using MetaValue = std::variant<int64_t, double, std::string, bool>;

// The KDTR metadata type code of a value (1 int, 2 float, 3 string, 4 bool).
inline uint8_t meta_type_code(const MetaValue& v) {
  switch (v.index()) {
    case 0: return 1;
    case 1: return 2;
    case 2: return 3;
    default: return 4;
  }
}

inline const char* meta_type_name(const MetaValue& v) {
  switch (v.index()) {
    case 0: return "int";
    case 1: return "float";
    case 2: return "string";
    default: return "bool";
  }
}

// An open, fully validated KDTR file.  Cheap to move and to copy (copies share the
// mapping); TensorView::data stays valid while any copy lives.
class File {
 public:
  // Open and validate `path` (docs/kdtr-format.md section 3).  verify=true also checks
  // every tensor's CRC-32 and bool bytes (reads all data once); verify=false costs
  // O(header) plus the padding bytes.  Throws kdtr::Error.
  static File open(const std::string& path, bool verify = true) {
    File f;
    f.path_ = path;
    f.storage_ = detail::map_file(path);
    f.parse(verify);
    return f;
  }

  // Validate an in-memory file image; `label` stands for the path in errors.
  static File from_bytes(std::vector<uint8_t> bytes, const std::string& label = "<bytes>", bool verify = true) {
    File f;
    f.path_ = label;
    auto st = std::make_shared<detail::Storage>();
    st->owned = std::move(bytes);
    st->size = st->owned.size();
    st->data = st->owned.data();
    f.storage_ = std::move(st);
    f.parse(verify);
    return f;
  }

  const std::string& path() const { return path_; }
  uint16_t version_major() const { return version_major_; }
  uint16_t version_minor() const { return version_minor_; }
  uint32_t header_len() const { return header_len_; }
  uint64_t file_size() const { return storage_ ? storage_->size : 0; }

  // Tensors in header order.
  const std::vector<TensorView>& tensors() const { return tensors_; }
  bool has(const std::string& name) const { return index_.count(name) != 0; }

  // Throws Error(MissingTensor) naming the file and the tensor.
  const TensorView& tensor(const std::string& name) const {
    auto it = index_.find(name);
    if (it == index_.end())
      throw Error(ErrorCode::MissingTensor, path_, name, NO_OFFSET, "no tensor of this name in the file");
    return tensors_[it->second];
  }

  // The data of tensor `name` as T, after checking its dtype (== dtype_of<T>()) and its
  // shape: same ndim, and each dim equal to the given one, where -1 matches any size.
  // Throws MissingTensor, WrongDtype or WrongShape, each naming the file and the tensor.
  template <class T>
  const T* get(const std::string& name, std::initializer_list<int64_t> shape) const {
    return get<T>(name, shape, dtype_of<T>());
  }

  // As above for a tensor of dtype `expected` (bool, f16, bf16 read as uint8_t/uint16_t).
  template <class T>
  const T* get(const std::string& name, std::initializer_list<int64_t> shape, DType expected) const {
    const TensorView& t = tensor(name);
    const T* p = t.as<T>(expected);
    bool ok = shape.size() == t.shape.size();
    size_t k = 0;
    for (int64_t want : shape) {
      if (!ok) break;
      if (want != -1 && (want < 0 || static_cast<uint64_t>(want) != t.shape[k])) ok = false;
      ++k;
    }
    if (!ok) {
      std::string w = "[";
      k = 0;
      for (int64_t d : shape) w += (k++ ? "," : "") + (d == -1 ? std::string("*") : std::to_string(d));
      w += "]";
      throw Error(ErrorCode::WrongShape, path_, name, NO_OFFSET,
                  "tensor has shape " + detail::shape_str(t.shape) + ", expected " + w);
    }
    return p;
  }

  // Metadata by key, and in file order.
  const std::map<std::string, MetaValue>& metadata() const { return metadata_; }
  const std::vector<std::pair<std::string, MetaValue>>& metadata_entries() const { return metadata_entries_; }
  // The value of `key`, or nullptr.
  const MetaValue* find_metadata(const std::string& key) const {
    auto it = metadata_.find(key);
    return it == metadata_.end() ? nullptr : &it->second;
  }

 private:
  File() = default;

  // Reads header fields of [pos, end) in order; a field that does not fit is Truncated.
  class Cursor {
   public:
    Cursor(const uint8_t* base, uint64_t pos, uint64_t end, const std::string& path)
        : base_(base), pos_(pos), end_(end), path_(path) {}
    uint64_t pos() const { return pos_; }

    // Claim n bytes for the field named by field(); returns their offset.
    template <class FieldFn>
    uint64_t take(uint64_t n, FieldFn&& field) {
      if (n > end_ - pos_)
        throw Error(ErrorCode::Truncated, path_, field(), pos_,
                    "field of " + std::to_string(n) + " bytes runs past the end of the header at offset " +
                        std::to_string(end_));
      const uint64_t at = pos_;
      pos_ += n;
      return at;
    }
    template <class FieldFn>
    uint64_t uint(int n, FieldFn&& field) {
      return detail::load_le(base_ + take(static_cast<uint64_t>(n), field), n);
    }

   private:
    const uint8_t* base_;
    uint64_t pos_;
    uint64_t end_;
    const std::string& path_;
  };

  [[noreturn]] void fail(ErrorCode code, const std::string& field, uint64_t offset, const std::string& detail) const {
    throw Error(code, path_, field, offset, detail);
  }

  // The reader, in the steps of kdtr/format/read.py's (docs/kdtr-format.md section 3): the
  // preamble, the header CRC, the counts, each tensor entry, each metadata entry, the
  // extension, the data region, then (verify) each tensor's checksum.  Each step throws
  // the first defect it meets, so the checks run in file order, as in Python.

  // Data ranges of the tensors with nbytes > 0 seen so far: start -> (end, tensor index);
  // disjoint (the overlap rule), ordered by start.
  using Ranges = std::map<uint64_t, std::pair<uint64_t, size_t>>;

  // Where a tensor's crc32 field is, and the value stored there (checked by verify_tensor).
  struct StoredCrc {
    uint64_t at = 0;
    uint32_t value = 0;
  };

  void parse(bool verify) {
    const uint64_t data_start = parse_preamble();
    const uint64_t body_end = data_start - 4;
    check_header_crc(body_end);

    Cursor cur(storage_->data, PREAMBLE_LEN, body_end, path_);
    uint64_t tensor_count = 0, metadata_count = 0;
    parse_counts(cur, &tensor_count, &metadata_count);

    tensors_.reserve(tensor_count);
    std::vector<StoredCrc> crcs(tensor_count);
    Ranges ranges;
    for (uint64_t i = 0; i < tensor_count; ++i) crcs[i] = parse_tensor(cur, i, data_start, ranges);
    for (uint64_t j = 0; j < metadata_count; ++j) parse_metadata(cur, j);
    check_extension(cur, body_end);

    check_data_region(data_start, ranges);
    if (verify)
      for (size_t i = 0; i < tensors_.size(); ++i) verify_tensor(i, crcs[i]);
  }

  // The preamble, field by field (a file shorter than 16 bytes is Truncated in the field
  // it ends inside, after the complete fields before it are checked); returns where the
  // header ends and the data region starts (16 + header_len).
  uint64_t parse_preamble() {
    const uint8_t* d = storage_->data;
    const uint64_t size = storage_->size;
    if (size < 8)
      fail(ErrorCode::Truncated, "magic", 0, "file has " + std::to_string(size) + " bytes; the preamble needs 16");
    if (std::memcmp(d, MAGIC, 8) != 0)
      fail(ErrorCode::BadMagic, "magic", 0, "not a KDTR file (expected bytes 89 4B 44 54 52 0D 0A 1A)");
    if (size < 10)
      fail(ErrorCode::Truncated, "version_major", 8,
           "file has " + std::to_string(size) + " bytes; the preamble needs 16");
    version_major_ = static_cast<uint16_t>(detail::load_le(d + 8, 2));
    if (version_major_ != VERSION_MAJOR)
      fail(ErrorCode::UnsupportedVersion, "version_major", 8,
           "major version " + std::to_string(version_major_) + " is not supported (this reader reads 1)");
    if (size < 12)
      fail(ErrorCode::Truncated, "version_minor", 10,
           "file has " + std::to_string(size) + " bytes; the preamble needs 16");
    version_minor_ = static_cast<uint16_t>(detail::load_le(d + 10, 2));
    if (size < 16)
      fail(ErrorCode::Truncated, "header_len", 12,
           "file has " + std::to_string(size) + " bytes; the preamble needs 16");
    const uint64_t hl = detail::load_le(d + 12, 4);
    if (hl < MIN_HEADER_LEN)
      fail(ErrorCode::Truncated, "header_len", 12, std::to_string(hl) + " is below the minimum header length 12");
    if (hl > MAX_HEADER_LEN)
      fail(ErrorCode::HeaderTooLarge, "header_len", 12,
           std::to_string(hl) + " exceeds MAX_HEADER_LEN (16777216 bytes)");
    if (PREAMBLE_LEN + hl > size)
      fail(ErrorCode::HeaderPastEnd, "header_len", 12,
           "header ends at offset " + std::to_string(PREAMBLE_LEN + hl) + " but the file has " + std::to_string(size) +
               " bytes");
    header_len_ = static_cast<uint32_t>(hl);
    return PREAMBLE_LEN + hl;
  }

  // The header CRC (its last 4 bytes, at body_end), before any other header field is
  // interpreted.
  void check_header_crc(uint64_t body_end) const {
    const uint8_t* d = storage_->data;
    const uint32_t stored = static_cast<uint32_t>(detail::load_le(d + body_end, 4));
    const uint32_t actual = detail::crc32_bytes(d, body_end);
    if (stored != actual)
      fail(ErrorCode::HeaderChecksumMismatch, "header_crc32", body_end,
           "stored " + detail::hex32(stored) + ", computed " + detail::hex32(actual));
  }

  void parse_counts(Cursor& cur, uint64_t* tensor_count, uint64_t* metadata_count) const {
    const uint64_t at_tc = cur.pos();
    *tensor_count = cur.uint(4, [] { return std::string("tensor_count"); });
    if (*tensor_count > MAX_TENSORS)
      fail(ErrorCode::TooManyTensors, "tensor_count", at_tc,
           std::to_string(*tensor_count) + " exceeds MAX_TENSORS (4096)");
    const uint64_t at_mc = cur.pos();
    *metadata_count = cur.uint(4, [] { return std::string("metadata_count"); });
    if (*metadata_count > MAX_METADATA)
      fail(ErrorCode::TooManyMetadata, "metadata_count", at_mc,
           std::to_string(*metadata_count) + " exceeds MAX_METADATA (4096)");
  }

  // Tensor entry i, every field checked in file order (docs/kdtr-format.md section 3);
  // appends it to tensors_ and index_, its data range to `ranges`, and returns its
  // stored CRC for verify_tensor.
  StoredCrc parse_tensor(Cursor& cur, uint64_t i, uint64_t data_start, Ranges& ranges) {
    const uint8_t* d = storage_->data;
    const uint64_t size = storage_->size;
    const std::string ti = "tensors[" + std::to_string(i) + "]";
    auto F = [&ti](const char* member) { return [&ti, member] { return ti + "." + member; }; };

    const uint64_t at_nl = cur.pos();
    const uint64_t name_len = cur.uint(2, F("name_len"));
    if (name_len == 0 || name_len > MAX_NAME_LEN)
      fail(ErrorCode::BadName, ti + ".name_len", at_nl,
           "name length " + std::to_string(name_len) + " is outside [1, 255]");
    const uint64_t at_name = cur.take(name_len, F("name"));
    if (!detail::valid_utf8(d + at_name, name_len))
      fail(ErrorCode::BadName, ti + ".name", at_name, "name is not valid UTF-8");
    TensorView t;
    t.name.assign(reinterpret_cast<const char*>(d + at_name), name_len);
    t.file = path_;
    if (index_.count(t.name))
      fail(
          ErrorCode::DuplicateName, ti + ".name", at_name,
          "tensor name " + detail::quoted(t.name) + " already used by tensors[" + std::to_string(index_[t.name]) + "]");
    const std::string who = " (tensor " + detail::quoted(t.name) + ")";

    const uint64_t at_dt = cur.pos();
    const uint64_t code = cur.uint(1, F("dtype"));
    if (!is_valid_dtype_code(static_cast<uint8_t>(code)))
      fail(ErrorCode::UnknownDtype, ti + ".dtype", at_dt, "dtype code " + std::to_string(code) + " is unknown" + who);
    t.dtype = static_cast<DType>(code);

    const uint64_t at_nd = cur.pos();
    const uint64_t ndim = cur.uint(1, F("ndim"));
    if (ndim > MAX_NDIM)
      fail(ErrorCode::TooManyDims, ti + ".ndim", at_nd, "ndim " + std::to_string(ndim) + " exceeds MAX_NDIM (8)" + who);

    const uint64_t at_shape = cur.take(8 * ndim, F("shape"));
    t.shape.resize(ndim);
    for (uint64_t k = 0; k < ndim; ++k) t.shape[k] = detail::load_le(d + at_shape + 8 * k, 8);
    uint64_t numel = 0, expect_nbytes = 0;
    if (!detail::checked_nbytes(t.shape, dtype_itemsize(t.dtype), &numel, &expect_nbytes))
      fail(ErrorCode::SizeOverflow, ti + ".shape", at_shape,
           "product of the nonzero dims of shape " + detail::shape_str(t.shape) + " x itemsize " +
               std::to_string(dtype_itemsize(t.dtype)) + " exceeds 2**63 - 1" + who);

    const uint64_t at_off = cur.pos();
    t.offset = cur.uint(8, F("offset"));
    if (t.offset % ALIGNMENT != 0)
      fail(ErrorCode::MisalignedOffset, ti + ".offset", at_off,
           std::to_string(t.offset) + " is not a multiple of 64" + who);
    if (t.offset < data_start)
      fail(ErrorCode::OffsetOutOfFile, ti + ".offset", at_off,
           std::to_string(t.offset) + " is inside the header, which ends at " + std::to_string(data_start) + who);
    if (t.offset > size)
      fail(ErrorCode::OffsetOutOfFile, ti + ".offset", at_off,
           std::to_string(t.offset) + " is past the end of the file (" + std::to_string(size) + " bytes)" + who);

    const uint64_t at_nb = cur.pos();
    t.nbytes = cur.uint(8, F("nbytes"));
    if (t.nbytes != expect_nbytes)
      fail(ErrorCode::NbytesMismatch, ti + ".nbytes", at_nb,
           std::to_string(t.nbytes) + " != " + std::to_string(expect_nbytes) + " = product of shape " +
               detail::shape_str(t.shape) + " x itemsize " + std::to_string(dtype_itemsize(t.dtype)) + who);
    uint64_t end = 0;
    if (__builtin_add_overflow(t.offset, t.nbytes, &end))
      fail(ErrorCode::SizeOverflow, ti + ".nbytes", at_nb, "offset + nbytes overflows 64 bits" + who);
    if (end > size)
      fail(ErrorCode::OffsetOutOfFile, ti + ".nbytes", at_nb,
           "data [" + std::to_string(t.offset) + ", " + std::to_string(end) + ") ends past the end of the file (" +
               std::to_string(size) + " bytes)" + who);
    if (t.nbytes > 0) {
      // Ranges seen so far are disjoint, so checking the neighbours suffices.
      auto next = ranges.lower_bound(t.offset);
      const std::pair<uint64_t, size_t>* hit = nullptr;
      if (next != ranges.end() && next->first < end) hit = &next->second;
      if (hit == nullptr && next != ranges.begin() && std::prev(next)->second.first > t.offset)
        hit = &std::prev(next)->second;
      if (hit != nullptr)
        fail(ErrorCode::OverlappingTensors, ti + ".offset", at_off,
             "data [" + std::to_string(t.offset) + ", " + std::to_string(end) + ") overlaps tensors[" +
                 std::to_string(hit->second) + "] (" + detail::quoted(tensors_[hit->second].name) + ")" + who);
      ranges.emplace(t.offset, std::make_pair(end, static_cast<size_t>(i)));
    }

    StoredCrc crc;
    crc.at = cur.pos();
    crc.value = static_cast<uint32_t>(cur.uint(4, F("crc32")));
    t.data = d + t.offset;
    index_.emplace(t.name, static_cast<size_t>(i));
    tensors_.push_back(std::move(t));
    return crc;
  }

  // Metadata entry j (key, type, value), appended to metadata_ and metadata_entries_.
  void parse_metadata(Cursor& cur, uint64_t j) {
    const uint8_t* d = storage_->data;
    const std::string mj = "metadata[" + std::to_string(j) + "]";
    const uint64_t at_kl = cur.pos();
    const uint64_t key_len = cur.uint(2, [&] { return mj + ".key_len"; });
    if (key_len == 0 || key_len > MAX_NAME_LEN)
      fail(ErrorCode::BadName, mj + ".key_len", at_kl,
           "key length " + std::to_string(key_len) + " is outside [1, 255]");
    const uint64_t at_key = cur.take(key_len, [&] { return mj + ".key"; });
    if (!detail::valid_utf8(d + at_key, key_len))
      fail(ErrorCode::BadName, mj + ".key", at_key, "key is not valid UTF-8");
    std::string key(reinterpret_cast<const char*>(d + at_key), key_len);
    if (metadata_.count(key))
      fail(ErrorCode::DuplicateName, mj + ".key", at_key, "metadata key " + detail::quoted(key) + " appears twice");
    const std::string mk = "metadata[" + detail::quoted(key) + "]";

    const uint64_t at_ty = cur.pos();
    const uint64_t type = cur.uint(1, [&] { return mk + ".type"; });
    MetaValue value;
    const uint64_t at_val = cur.pos();
    auto value_field = [&] { return mk; };
    switch (type) {
      case 1: value.emplace<int64_t>(static_cast<int64_t>(cur.uint(8, value_field))); break;
      case 2: {
        const uint64_t bits = cur.uint(8, value_field);
        double x;
        std::memcpy(&x, &bits, 8);
        value.emplace<double>(x);
        break;
      }
      case 3: {
        const uint64_t len = cur.uint(4, [&] { return mk + ".length"; });
        if (len > MAX_STRING_LEN)
          fail(ErrorCode::BadMetadata, mk + ".length", at_val,
               "string of " + std::to_string(len) + " bytes exceeds MAX_STRING_LEN (1048576)");
        const uint64_t at_s = cur.take(len, value_field);
        if (!detail::valid_utf8(d + at_s, len))
          fail(ErrorCode::BadMetadata, mk, at_s, "string value is not valid UTF-8");
        value.emplace<std::string>(reinterpret_cast<const char*>(d + at_s), len);
        break;
      }
      case 4: {
        const uint64_t b = cur.uint(1, value_field);
        if (b > 1) fail(ErrorCode::BadMetadata, mk, at_val, "bool value " + std::to_string(b) + " is neither 0 nor 1");
        value.emplace<bool>(b == 1);
        break;
      }
      default:
        fail(ErrorCode::BadMetadata, mk + ".type", at_ty,
             "metadata type " + std::to_string(type) + " is unknown (1 int, 2 float, 3 string, 4 bool)");
    }
    metadata_.emplace(key, value);
    metadata_entries_.emplace_back(std::move(key), std::move(value));
  }

  // Bytes between the last metadata entry and the header CRC: an error in a 1.0 file;
  // 1.x with x > 0: the extension is skipped (it is covered by the header CRC).
  void check_extension(const Cursor& cur, uint64_t body_end) const {
    if (cur.pos() < body_end && version_minor_ == 0)
      fail(ErrorCode::ExtensionInV10, "extension", cur.pos(),
           std::to_string(body_end - cur.pos()) +
               " bytes between the last metadata entry and header_crc32 in a 1.0 file");
  }

  // The data region (docs/kdtr-format.md section 1.5): padding bytes are zero, then no
  // byte follows the end of the tensor data.  parse_tensor has already rejected
  // overlapping ranges.
  void check_data_region(uint64_t data_start, const Ranges& ranges) const {
    const uint8_t* d = storage_->data;
    const uint64_t size = storage_->size;
    uint64_t data_end = data_start;
    for (const TensorView& t : tensors_) data_end = std::max(data_end, t.offset + t.nbytes);
    uint64_t pos = data_start;
    auto check_zero = [&](uint64_t from, uint64_t to) {
      for (uint64_t k = from; k < to; ++k)
        if (d[k] != 0)
          fail(ErrorCode::NonZeroPadding, "padding", k, "padding byte is " + std::to_string(d[k]) + ", must be 0");
    };
    for (const auto& r : ranges) {  // ordered by start, disjoint
      check_zero(pos, r.first);
      pos = r.second.first;
    }
    check_zero(pos, data_end);
    if (size > data_end)
      fail(ErrorCode::TrailingBytes, "end of data", data_end,
           std::to_string(size - data_end) + " bytes follow the end of the tensor data");
  }

  // verify: tensor i's CRC-32 against the stored one, then (bool tensors) every byte is
  // 0 or 1.
  void verify_tensor(size_t i, const StoredCrc& crc) const {
    const TensorView& t = tensors_[i];
    const std::string ti = "tensors[" + std::to_string(i) + "]";
    const uint32_t actual = detail::crc32_bytes(t.data, t.nbytes);
    if (actual != crc.value)
      fail(ErrorCode::TensorChecksumMismatch, ti + ".crc32", crc.at,
           "stored " + detail::hex32(crc.value) + ", computed " + detail::hex32(actual) + " over " +
               std::to_string(t.nbytes) + " data bytes (tensor " + detail::quoted(t.name) + ")");
    if (t.dtype == DType::Bool) {
      for (uint64_t k = 0; k < t.nbytes; ++k)
        if (t.data[k] > 1)
          fail(ErrorCode::BadBoolValue, ti, t.offset + k,
               "element " + std::to_string(k) + " of bool tensor " + detail::quoted(t.name) + " is " +
                   std::to_string(t.data[k]) + ", must be 0 or 1");
    }
  }

  std::string path_;
  std::shared_ptr<detail::Storage> storage_;
  uint16_t version_major_ = 0;
  uint16_t version_minor_ = 0;
  uint32_t header_len_ = 0;
  std::vector<TensorView> tensors_;
  std::unordered_map<std::string, size_t> index_;
  std::map<std::string, MetaValue> metadata_;
  std::vector<std::pair<std::string, MetaValue>> metadata_entries_;
};

// ---------------------------------------------------------------------------------------
// Writer
// ---------------------------------------------------------------------------------------

// Builds a KDTR 1.0 file in the canonical layout (docs/kdtr-format.md section 1.5):
// tensors in insertion order, each at the next multiple of 64 after the previous one (the
// first after the header), zero padding, metadata entries in insertion order, no
// extension.  Equal inputs give equal bytes, identical to kdtr.save in Python for the
// same tensors and metadata in the same order.  add() copies the data.
class Writer {
 public:
  // Add a tensor of `dtype` and `shape` whose `nbytes` bytes are at `data` (C order,
  // little-endian).  Throws Error: BadName (empty, over 255 bytes, not UTF-8),
  // DuplicateName, UnknownDtype, TooManyDims, TooManyTensors, SizeOverflow,
  // NbytesMismatch (nbytes != product(shape) x itemsize), BadBoolValue (a bool byte
  // other than 0/1), InvalidArgument (null data with nbytes > 0).
  void add(const std::string& name, DType dtype, std::vector<uint64_t> shape, const void* data, size_t nbytes) {
    const std::string field = name.empty() ? std::string("<empty name>") : name;
    check_name(name, "tensor name");
    for (const Entry& e : tensors_)
      if (e.name == name) throw Error(ErrorCode::DuplicateName, kLabel, field, NO_OFFSET, "tensor added twice");
    if (tensors_.size() >= MAX_TENSORS)
      throw Error(ErrorCode::TooManyTensors, kLabel, field, NO_OFFSET, "more than MAX_TENSORS (4096) tensors");
    if (!is_valid_dtype_code(static_cast<uint8_t>(dtype)))
      throw Error(ErrorCode::UnknownDtype, kLabel, field, NO_OFFSET,
                  "dtype code " + std::to_string(static_cast<int>(dtype)) + " is unknown");
    if (shape.size() > MAX_NDIM)
      throw Error(ErrorCode::TooManyDims, kLabel, field, NO_OFFSET,
                  "ndim " + std::to_string(shape.size()) + " exceeds MAX_NDIM (8)");
    uint64_t numel = 0, expect = 0;
    if (!detail::checked_nbytes(shape, dtype_itemsize(dtype), &numel, &expect))
      throw Error(ErrorCode::SizeOverflow, kLabel, field, NO_OFFSET,
                  "product of the nonzero dims of shape " + detail::shape_str(shape) + " x itemsize exceeds 2**63 - 1");
    if (expect != nbytes)
      throw Error(ErrorCode::NbytesMismatch, kLabel, field, NO_OFFSET,
                  std::to_string(nbytes) + " bytes given, shape " + detail::shape_str(shape) + " of " +
                      dtype_name(dtype) + " needs " + std::to_string(expect));
    if (data == nullptr && nbytes > 0)
      throw Error(ErrorCode::InvalidArgument, kLabel, field, NO_OFFSET, "null data pointer");
    const uint8_t* p = static_cast<const uint8_t*>(data);
    if (dtype == DType::Bool)
      for (size_t k = 0; k < nbytes; ++k)
        if (p[k] > 1)
          throw Error(ErrorCode::BadBoolValue, kLabel, field, NO_OFFSET,
                      "element " + std::to_string(k) + " is " + std::to_string(p[k]) + ", must be 0 or 1");
    Entry e;
    e.name = name;
    e.dtype = dtype;
    e.shape = std::move(shape);
    if (nbytes > 0) e.data.assign(p, p + nbytes);
    e.crc = detail::crc32_bytes(e.data.data(), e.data.size());
    tensors_.push_back(std::move(e));
  }

  // Typed form: dtype_of<T>(), nbytes = product(shape) x sizeof(T).
  template <class T>
  void add(const std::string& name, std::vector<uint64_t> shape, const T* data) {
    uint64_t numel = 0, nbytes = 0;
    if (!detail::checked_nbytes(shape, sizeof(T), &numel, &nbytes) || nbytes > std::numeric_limits<size_t>::max())
      throw Error(ErrorCode::SizeOverflow, kLabel, name, NO_OFFSET,
                  "product of the nonzero dims of shape " + detail::shape_str(shape) + " x itemsize exceeds 2**63 - 1");
    add(name, dtype_of<T>(), std::move(shape), data, static_cast<size_t>(nbytes));
  }

  // Set metadata `key` (1..255 bytes of UTF-8).  A new key goes last; setting an existing
  // key replaces its value in place (as a Python dict does).  Throws BadName,
  // TooManyMetadata, BadMetadata (string over 1 MiB or not UTF-8).
  void set_metadata(const std::string& key, MetaValue value) {
    check_name(key, "metadata key");
    if (const std::string* s = std::get_if<std::string>(&value)) {
      if (s->size() > MAX_STRING_LEN)
        throw Error(ErrorCode::BadMetadata, kLabel, key, NO_OFFSET,
                    "string of " + std::to_string(s->size()) + " bytes exceeds MAX_STRING_LEN (1048576)");
      if (!detail::valid_utf8(*s))
        throw Error(ErrorCode::BadMetadata, kLabel, key, NO_OFFSET, "string value is not valid UTF-8");
    }
    for (auto& kv : metadata_)
      if (kv.first == key) {
        kv.second = std::move(value);
        return;
      }
    if (metadata_.size() >= MAX_METADATA)
      throw Error(ErrorCode::TooManyMetadata, kLabel, key, NO_OFFSET, "more than MAX_METADATA (4096) entries");
    metadata_.emplace_back(key, std::move(value));
  }
  void set_metadata(const std::string& key, const char* value) { set_metadata(key, MetaValue(std::string(value))); }
  template <class T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
  void set_metadata(const std::string& key, T value) {
    if constexpr (std::is_unsigned_v<T> && sizeof(T) >= sizeof(int64_t)) {
      if (value > static_cast<T>(std::numeric_limits<int64_t>::max()))
        throw Error(ErrorCode::InvalidArgument, kLabel, key, NO_OFFSET, "integer does not fit in int64");
    }
    set_metadata(key, MetaValue(static_cast<int64_t>(value)));
  }
  template <class T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>
  void set_metadata(const std::string& key, T value) {
    set_metadata(key, MetaValue(static_cast<double>(value)));
  }

  size_t tensor_count() const { return tensors_.size(); }
  size_t metadata_count() const { return metadata_.size(); }

  // The whole file image (what write() puts on disk).
  std::vector<uint8_t> to_bytes(const std::string& path_for_errors = "<writer>") const {
    std::vector<uint64_t> offsets;
    uint64_t file_size = 0;
    std::vector<uint8_t> out = header(&offsets, &file_size, path_for_errors);
    out.resize(file_size, 0);
    for (size_t i = 0; i < tensors_.size(); ++i)
      if (!tensors_[i].data.empty())
        std::memcpy(out.data() + offsets[i], tensors_[i].data.data(), tensors_[i].data.size());
    return out;
  }

  // The temporary file of a write of `path`: "<dir>/.<name>.<pid>.<n>.tmp", hidden, in
  // the same directory, and matched by the repository's `*.tmp` ignore pattern (the
  // Python writer's temporaries are ".<name>.<random>.tmp" alike, docs/kdtr-format.md).
  // <name> is cut to 200 bytes (at a UTF-8 character boundary) so that the temporary name
  // fits NAME_MAX whenever `path`'s own name does.  A write killed before its rename
  // (SIGKILL, power loss) leaves it behind; it is safe to delete.
  static std::string temp_path(const std::string& path, long pid, unsigned n) {
    const size_t slash = path.find_last_of('/');
    const std::string dir = slash == std::string::npos ? std::string() : path.substr(0, slash + 1);
    std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
    if (name.size() > 200) {
      size_t cut = 200;
      while (cut > 0 && (static_cast<unsigned char>(name[cut]) & 0xC0) == 0x80) --cut;
      name.resize(cut);
    }
    return dir + "." + name + "." + std::to_string(pid) + "." + std::to_string(n) + ".tmp";
  }

  // Write the file atomically: a temporary file in the same directory (temp_path), fsync,
  // rename over `path`, fsync of the directory.  On failure the temporary file is removed
  // and Error(Io) is thrown; `path` is then untouched.  HeaderTooLarge if the header would
  // exceed MAX_HEADER_LEN.
  void write(const std::string& path) const {
    std::vector<uint64_t> offsets;
    uint64_t file_size = 0;
    const std::vector<uint8_t> head = header(&offsets, &file_size, path);

    static std::atomic<unsigned> counter{0};
    std::string tmp;
    int fd = -1;
    for (int attempt = 0; attempt < 100 && fd < 0; ++attempt) {
      tmp = temp_path(path, static_cast<long>(::getpid()), counter.fetch_add(1));
      fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
      if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0)
      throw Error(ErrorCode::Io, path, "file", NO_OFFSET,
                  "cannot create temporary file " + tmp + ": " + detail::errno_text(errno));

    auto fail_io = [&](const char* what) {
      const int err = errno;
      if (fd >= 0) ::close(fd);
      ::unlink(tmp.c_str());
      throw Error(ErrorCode::Io, path, "file", NO_OFFSET, std::string(what) + ": " + detail::errno_text(err));
    };
    auto put = [&](const uint8_t* p, uint64_t n) {
      while (n > 0) {
        const size_t step = static_cast<size_t>(std::min<uint64_t>(n, uint64_t{1} << 30));
        const ssize_t w = ::write(fd, p, step);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
          if (w == 0) errno = EIO;
          fail_io("cannot write");
        }
        p += w;
        n -= static_cast<uint64_t>(w);
      }
    };
    static const uint8_t zeros[ALIGNMENT] = {};
    put(head.data(), head.size());
    uint64_t pos = head.size();
    for (size_t i = 0; i < tensors_.size(); ++i) {
      while (pos < offsets[i]) {
        const uint64_t n = std::min<uint64_t>(offsets[i] - pos, ALIGNMENT);
        put(zeros, n);
        pos += n;
      }
      put(tensors_[i].data.data(), tensors_[i].data.size());
      pos += tensors_[i].data.size();
    }
    if (::fsync(fd) != 0) fail_io("cannot fsync");
    const int fd_closed = fd;
    fd = -1;
    if (::close(fd_closed) != 0) fail_io("cannot close");
    if (::rename(tmp.c_str(), path.c_str()) != 0) fail_io("cannot rename temporary file into place");
    // Make the rename durable (best effort: some file systems refuse fsync on directories).
    const size_t slash = path.find_last_of('/');
    const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      (void)::fsync(dfd);
      ::close(dfd);
    }
  }

 private:
  static inline const std::string kLabel = "<writer>";

  struct Entry {
    std::string name;
    DType dtype = DType::U8;
    std::vector<uint64_t> shape;
    std::vector<uint8_t> data;
    uint32_t crc = 0;
  };

  static void check_name(const std::string& name, const char* what) {
    if (name.empty() || name.size() > MAX_NAME_LEN)
      throw Error(ErrorCode::BadName, kLabel, name.empty() ? std::string("<empty name>") : name, NO_OFFSET,
                  std::string(what) + " length " + std::to_string(name.size()) + " is outside [1, 255]");
    if (!detail::valid_utf8(name))
      throw Error(ErrorCode::BadName, kLabel, name, NO_OFFSET, std::string(what) + " is not valid UTF-8");
  }

  // The preamble + header bytes; fills each tensor's offset and the final file size.
  std::vector<uint8_t> header(std::vector<uint64_t>* offsets, uint64_t* file_size, const std::string& path) const {
    uint64_t hl = 4 + 4 + 4;  // counts + crc
    for (const Entry& e : tensors_) hl += 2 + e.name.size() + 1 + 1 + 8 * e.shape.size() + 8 + 8 + 4;
    for (const auto& kv : metadata_) {
      hl += 2 + kv.first.size() + 1;
      switch (kv.second.index()) {
        case 0:
        case 1: hl += 8; break;
        case 2: hl += 4 + std::get<std::string>(kv.second).size(); break;
        default: hl += 1; break;
      }
    }
    if (hl > MAX_HEADER_LEN)
      throw Error(ErrorCode::HeaderTooLarge, path, "header_len", NO_OFFSET,
                  "header of " + std::to_string(hl) + " bytes exceeds MAX_HEADER_LEN (16777216)");

    offsets->clear();
    uint64_t pos = PREAMBLE_LEN + hl;
    for (const Entry& e : tensors_) {
      const uint64_t off = detail::align_up(pos);
      offsets->push_back(off);
      if (__builtin_add_overflow(off, static_cast<uint64_t>(e.data.size()), &pos))
        throw Error(ErrorCode::SizeOverflow, path, e.name, NO_OFFSET, "file size overflows 64 bits");
    }
    *file_size = pos;

    std::vector<uint8_t> out;
    out.reserve(static_cast<size_t>(PREAMBLE_LEN + hl));
    out.insert(out.end(), MAGIC, MAGIC + 8);
    detail::store_le(out, VERSION_MAJOR, 2);
    detail::store_le(out, VERSION_MINOR, 2);
    detail::store_le(out, hl, 4);
    detail::store_le(out, tensors_.size(), 4);
    detail::store_le(out, metadata_.size(), 4);
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const Entry& e = tensors_[i];
      detail::store_le(out, e.name.size(), 2);
      out.insert(out.end(), e.name.begin(), e.name.end());
      detail::store_le(out, static_cast<uint8_t>(e.dtype), 1);
      detail::store_le(out, e.shape.size(), 1);
      for (uint64_t dim : e.shape) detail::store_le(out, dim, 8);
      detail::store_le(out, (*offsets)[i], 8);
      detail::store_le(out, e.data.size(), 8);
      detail::store_le(out, e.crc, 4);
    }
    for (const auto& kv : metadata_) {
      detail::store_le(out, kv.first.size(), 2);
      out.insert(out.end(), kv.first.begin(), kv.first.end());
      detail::store_le(out, meta_type_code(kv.second), 1);
      switch (kv.second.index()) {
        case 0: detail::store_le(out, static_cast<uint64_t>(std::get<int64_t>(kv.second)), 8); break;
        case 1: {
          uint64_t bits;
          const double x = std::get<double>(kv.second);
          std::memcpy(&bits, &x, 8);
          detail::store_le(out, bits, 8);
          break;
        }
        case 2: {
          const std::string& s = std::get<std::string>(kv.second);
          detail::store_le(out, s.size(), 4);
          out.insert(out.end(), s.begin(), s.end());
          break;
        }
        default: detail::store_le(out, std::get<bool>(kv.second) ? 1 : 0, 1); break;
      }
    }
    detail::store_le(out, detail::crc32_bytes(out.data(), out.size()), 4);
    return out;
  }

  std::vector<Entry> tensors_;
  std::vector<std::pair<std::string, MetaValue>> metadata_;
};

}  // namespace kdtr
