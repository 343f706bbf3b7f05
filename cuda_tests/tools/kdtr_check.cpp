// kdtr_check.cpp -- build/bin/kdtr_check: validate a KDTR file with the C++ reader.
//
//   kdtr_check [--no-verify] FILE          validate; list tensors and metadata
//   kdtr_check [--no-verify] --copy IN OUT rewrite IN with kdtr::Writer (same tensor and
//                                          metadata order) -- for byte-identity tests
//   kdtr_check --version                   one line: the format version and the CRC-32
//                                          implementation compiled in (ISA-L or zlib)
//
// On success: exit 0; FILE mode prints one line per tensor and per metadata entry, in
// file order:
//   tensor <name> <dtype> [<d0>,<d1>,...]
//   meta <key> <int|float|string|bool> <value>
// (strings JSON-quoted, unprintable characters as \uNNNN; floats %.17g, bools true/false;
// unprintable characters in names and keys as \xNN / \uNNNN, see kdtr::escape_control).  On a kdtr::Error: exactly one
// line "<ErrorCodeName>: <what()>" on stderr, exit 2.  Usage errors: one line, exit 2.  Anything else: one line,
// exit 1.

#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "kdtr.hpp"

namespace {

const char* const kUsage =
    "usage: kdtr_check [--no-verify] FILE | kdtr_check [--no-verify] --copy IN OUT | kdtr_check --version";

std::string escape_name(const std::string& s) { return kdtr::escape_control(s, true); }

// A JSON string literal; controls and the unprintable code points of kdtr::escape_control
// as \uNNNN, so json.loads gives the value back and a terminal sees no escape sequence.
std::string json_string(const std::string& s) {
  std::string out = "\"";
  char buf[16];
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    uint32_t cp = 0;
    const size_t n = c < 0x80 ? 1 : kdtr::detail::utf8_sequence(s, i, &cp);
    if (c >= 0x80 && n > 1 && !kdtr::detail::unprintable_code_point(cp)) {
      out.append(s, i, n);
      i += n;
      continue;
    }
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20 || c == 0x7f || c >= 0x80) {  // c >= 0x80: an unprintable code point
          std::snprintf(buf, sizeof buf, "\\u%04x", c >= 0x80 && n > 1 ? static_cast<unsigned>(cp) : c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
    i += (c >= 0x80 && n > 1) ? n : 1;
  }
  return out + "\"";
}

std::string value_text(const kdtr::MetaValue& v) {
  switch (v.index()) {
    case 0: return std::to_string(std::get<int64_t>(v));
    case 1: {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.17g", std::get<double>(v));
      return buf;
    }
    case 2: return json_string(std::get<std::string>(v));
    default: return std::get<bool>(v) ? "true" : "false";
  }
}

void list(const kdtr::File& f) {
  for (const kdtr::TensorView& t : f.tensors()) {
    std::string shape = "[";
    for (size_t k = 0; k < t.shape.size(); ++k) shape += (k ? "," : "") + std::to_string(t.shape[k]);
    shape += "]";
    std::printf("tensor %s %s %s\n", escape_name(t.name).c_str(), kdtr::dtype_name(t.dtype), shape.c_str());
  }
  for (const auto& kv : f.metadata_entries())
    std::printf("meta %s %s %s\n", escape_name(kv.first).c_str(), kdtr::meta_type_name(kv.second),
                value_text(kv.second).c_str());
}

void copy(const kdtr::File& f, const std::string& out) {
  kdtr::Writer w;
  for (const kdtr::TensorView& t : f.tensors()) w.add(t.name, t.dtype, t.shape, t.data, static_cast<size_t>(t.nbytes));
  for (const auto& kv : f.metadata_entries()) w.set_metadata(kv.first, kv.second);
  w.write(out);
}

// Messages quote names from the file, which may hold any valid UTF-8, NUL and line
// breaks included: control characters become \xNN so the message stays one whole line.
std::string one_line(const std::string& s) { return kdtr::escape_control(s); }

// One line on stderr: "<prefix><message>\n".
void error_line(const std::string& prefix, const std::string& message) {
  const std::string line = prefix + one_line(message) + "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

int usage_error(const std::string& why) {
  error_line("", why + "; " + kUsage);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  bool verify = true, do_copy = false;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--no-verify") verify = false;
    else if (a == "--copy") do_copy = true;
    else if (a == "-h" || a == "--help") {
      std::printf("%s\n", kUsage);
      return 0;
    } else if (a == "--version") {
      std::printf("kdtr_check: KDTR %u.%u reader and writer; CRC-32: %s\n", unsigned{kdtr::VERSION_MAJOR},
                  unsigned{kdtr::VERSION_MINOR}, kdtr::crc32_implementation().c_str());
      return 0;
    } else if (a.size() > 1 && a[0] == '-' && a != "--") return usage_error("unknown option " + a);
    else if (a == "--") {
      for (++i; i < argc; ++i) files.emplace_back(argv[i]);
    } else files.push_back(a);
  }
  if (files.size() != (do_copy ? 2u : 1u))
    return usage_error(do_copy ? "--copy needs IN and OUT" : "expected exactly one FILE");
  try {
    const kdtr::File f = kdtr::File::open(files[0], verify);
    if (do_copy) copy(f, files[1]);
    else list(f);
    std::fflush(stdout);
    return 0;
  } catch (const kdtr::Error& e) {
    std::fflush(stdout);
    error_line(std::string(e.code_name()) + ": ", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    error_line("internal error: ", e.what());
    return 1;
  }
}
