// kdtr_cli.hpp -- shared command line, exit codes, CUDA checks and timing for the
// build/bin/kdtr_<op> test binaries.  The protocol is docs/binaries.md:
//
//   kdtr_<op> --input GOLDEN --output OUT [--backend cpu|cuda] [--device N] [--repeat N]
//   kdtr_<op> --batch --input G1 --output O1 [--input G2 --output O2 ...] [options]
//   kdtr_<op> --graph ... (two data sets in each input file, the op captured in one CUDA
//                          graph and replayed on each; docs/binaries.md, "Graph replay")
//
// Batch mode runs the goldens one after another in one process (the CUDA context is
// created once) and prints, after each, one result line on stdout (kBatchTag, below);
// docs/binaries.md, "Batch mode".
//
//   exit 0  success                      exit 2  usage or input error
//   exit 1  runtime failure (CUDA, ...)  exit 3  backend not supported here
//
// Every nonzero exit prints exactly one line on stderr: "<prog>: <message>".
//
// Typical main (see cuda_tests/tests/test_tree_accept.cu):
//
//   int main(int argc, char** argv) {
//     return kdtr::cli::run_main(argc, argv, "kdtr_tree_accept", [](const kdtr::cli::Args& args) {
//       kdtr::cli::require_backend(args);             // exit 3 if the backend is absent
//       kdtr::File golden = kdtr::File::open(args.input);
//       ...                                           // kdtr::Error -> exit 2
//       KDTR_CUDA_CHECK(cudaMemcpy(...));             // CUDA error -> exit 1
//       return 0;
//     });
//   }
//
// Build without CUDA: compile with -DKDTR_NO_CUDA; the CUDA helpers then disappear and
// --backend cuda exits 3.
#pragma once

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <map>
#include <new>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "kdtr.hpp"

#ifndef KDTR_NO_CUDA
#include <cuda_runtime_api.h>
#endif

namespace kdtr {
namespace cli {

// Exit codes of every kdtr_<op> binary (docs/binaries.md).
enum ExitCode : int {
  EXIT_OK = 0,
  EXIT_RUNTIME = 1,        // the op could not run: CUDA error, out of memory, internal error
  EXIT_USAGE = 2,          // bad arguments; unreadable, invalid or incompatible golden; unwritable output
  EXIT_NOT_SUPPORTED = 3,  // backend absent: no CUDA in this build, no usable device, --device out of range
};

// Thrown by die(); run_main prints it as one line and exits with its code.
class Failure : public std::exception {
 public:
  Failure(int code, std::string message) : code_(code), message_(std::move(message)) {}
  int code() const noexcept { return code_; }
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  int code_;
  std::string message_;
};

// Abort the current run with `code` and a one-line message.  Must be called under
// run_main (it throws Failure, so destructors -- e.g. device buffers -- still run).
[[noreturn]] inline void die(int code, const std::string& message) { throw Failure(code, message); }

// Parsed command line.  Options take a value as "--opt VALUE" or "--opt=VALUE".
struct Args {
  std::string prog;                                        // binary name for messages, e.g. "kdtr_tree_accept"
  std::string input;                                       // --input GOLDEN (required)
  std::string output;                                      // --output OUT (required)
  std::string backend = "cpu";                             // --backend cpu|cuda
  int device = 0;                                          // --device N (>= 0; CUDA only)
  int repeat = 0;                                          // --repeat N (>= 1 when given; 0 = no timing)
  std::map<std::string, std::string> extra;                // values of the op-specific options
  bool batch = false;                                      // --batch: run every (input, output) pair of `items`
  std::vector<std::pair<std::string, std::string>> items;  // batch mode: the pairs, in order
  bool graph = false;  // --graph: each input file holds two data sets, replayed from one CUDA graph (kdtr_io.hpp)

  bool cuda() const { return backend == "cuda"; }

  static std::string usage(const std::string& prog, const std::vector<std::string>& extra_options = {}) {
    std::string u = "usage: " + prog +
                    " [--batch] --input GOLDEN --output OUT [--input GOLDEN --output OUT ...]"
                    " [--backend cpu|cuda] [--device N] [--repeat N] [--graph]";
    for (const std::string& o : extra_options) u += " [--" + o + " VALUE]";
    return u;
  }

  // Parse argv.  Bad arguments -> die(EXIT_USAGE).  "--help"/"-h" prints usage to stdout
  // (and, where the op gives `describe`, a line on --describe) and exits 0; "--describe"
  // prints `describe` (the op's parameter struct as JSON, kdtr_describe.hpp) and exits 0.  `extra_options` names
  // additional value options (without "--") that an op accepts; their values land in `extra`.  With --batch, --input
  // and --output may repeat: the k-th --input pairs with the k-th --output (`items`); `input`/`output` hold the first
  // pair.  Every output must differ from every input and from each other.  --graph (a flag) sets `graph`.
  static Args parse(int argc, char** argv, const std::string& prog, const std::vector<std::string>& extra_options = {},
                    const std::string& describe = "") {
    Args a;
    a.prog = prog;
    const std::set<std::string> extras(extra_options.begin(), extra_options.end());
    std::set<std::string> seen;
    std::vector<std::string> inputs, outputs;
    auto bad = [&](const std::string& why) { die(EXIT_USAGE, why + "; " + usage(prog, extra_options)); };
    for (int i = 1; i < argc; ++i) {
      if (std::string(argv[i]) == "--batch") a.batch = true;
    }
    for (int i = 1; i < argc; ++i) {
      std::string arg = argv[i];
      if (arg == "--help" || arg == "-h") {
        std::printf("%s\n", usage(prog, extra_options).c_str());
        if (!describe.empty())
          std::printf("       %s --describe  (the op's parameter struct as JSON: fields, offsets, kernels)\n",
                      prog.c_str());
        std::fflush(stdout);
        std::exit(EXIT_OK);
      }
      if (arg == "--describe" && !describe.empty()) {
        std::printf("%s\n", describe.c_str());
        std::fflush(stdout);
        std::exit(EXIT_OK);
      }
      if (arg == "--batch") continue;
      if (arg == "--graph") {
        if (a.graph) bad("option --graph given twice");
        a.graph = true;
        continue;
      }
      if (arg.rfind("--", 0) != 0) bad("unexpected argument '" + arg + "'");
      std::string name = arg.substr(2), value;
      const size_t eq = name.find('=');
      if (eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
      } else {
        const bool known = name == "input" || name == "output" || name == "backend" || name == "device" ||
                           name == "repeat" || extras.count(name) > 0;
        if (!known) bad("unknown option --" + name);
        if (i + 1 >= argc) bad("option --" + name + " needs a value");
        value = argv[++i];
      }
      const bool repeatable = a.batch && (name == "input" || name == "output");
      if (seen.count(name) && !repeatable)
        bad("option --" + name + " given twice" +
            (name == "input" || name == "output" ? " (several goldens need --batch)" : ""));
      seen.insert(name);
      if (name == "input") inputs.push_back(value);
      else if (name == "output") outputs.push_back(value);
      else if (name == "backend") a.backend = value;
      else if (name == "device") a.device = parse_int(value, "--device", 0, prog, extra_options);
      else if (name == "repeat") a.repeat = parse_int(value, "--repeat", 1, prog, extra_options);
      else if (extras.count(name)) a.extra[name] = value;
      else bad("unknown option --" + name);
    }
    if (inputs.empty()) bad("--input is required");
    if (outputs.empty()) bad("--output is required");
    if (inputs.size() != outputs.size())
      bad("--batch needs one --output per --input (" + std::to_string(inputs.size()) + " --input, " +
          std::to_string(outputs.size()) + " --output)");
    const std::set<std::string> input_set(inputs.begin(), inputs.end());
    std::set<std::string> output_set;
    for (size_t k = 0; k < inputs.size(); ++k) {
      if (inputs[k].empty()) bad("--input needs a non-empty path");
      if (outputs[k].empty()) bad("--output needs a non-empty path");
      if (input_set.count(outputs[k]))
        bad("--output must differ from --input (the golden would be overwritten): '" + outputs[k] + "'");
      if (!output_set.insert(outputs[k]).second) bad("--output '" + outputs[k] + "' given for two goldens");
      a.items.emplace_back(inputs[k], outputs[k]);
    }
    a.input = inputs.front();
    a.output = outputs.front();
    if (a.backend != "cpu" && a.backend != "cuda") bad("--backend must be cpu or cuda, not '" + a.backend + "'");
    return a;
  }

 private:
  static int parse_int(const std::string& s, const char* opt, int min, const std::string& prog,
                       const std::vector<std::string>& extra_options) {
    char* end = nullptr;
    errno = 0;
    const long v = std::strtol(s.c_str(), &end, 10);
    if (s.empty() || end == nullptr || *end != '\0' || errno != 0 || v < min || v > 1000000000L)
      die(EXIT_USAGE, std::string(opt) + " needs an integer >= " + std::to_string(min) + ", not '" + s + "'; " +
                          usage(prog, extra_options));
    return static_cast<int>(v);
  }
};

// One line, whatever the message holds: control characters (NUL and line breaks included,
// which names in a KDTR file may contain) become \xNN.
inline std::string one_line(const std::string& s) { return escape_control(s); }

// Run `body(args)` with the binary's error protocol: Failure -> its code; kdtr::Error ->
// EXIT_USAGE as "<ErrorCodeName>: <what()>"; std::bad_alloc and any other exception ->
// EXIT_RUNTIME.  Each prints exactly one line "<prog>: <message>" on stderr.  Returns
// the exit code for main to return.
//
// With --batch, `body` runs once per (input, output) pair, each under the same protocol,
// and after each one result line goes to stdout (flushed at once):
//
//   @kdtr-batch i=<k> rc=<exit code> s=<seconds> msg=<the error line's message, or empty>
//
// k counts from 0 in command-line order; a failing golden also prints its usual line on
// stderr, and the batch goes on with the next one -- except after exit 1 on the cuda
// backend, where a CUDA error may have left the context unusable: the batch stops there
// (the goldens after it get no line; the runner reruns them one process each).  The
// process exits with the code of the first failing golden, 0 when all succeeded.
constexpr const char* kBatchTag = "@kdtr-batch";

template <class Body>
int run_main(int argc, char** argv, const std::string& prog, Body&& body,
             const std::vector<std::string>& extra_options = {}, const std::string& describe = "") {
  std::string message;
  auto report = [&](int code, const std::string& msg) {
    std::fflush(stdout);
    message = one_line(msg);
    const std::string line = prog + ": " + message + "\n";
    std::fwrite(line.data(), 1, line.size(), stderr);
    std::fflush(stderr);
    return code;
  };
  // One run of `body` under the error protocol: its exit code; `message` holds the error.
  auto guarded = [&](auto&& step) -> int {
    message.clear();
    try {
      const int rc = step();
      std::fflush(stdout);
      return rc;
    } catch (const Failure& f) {
      return report(f.code(), f.what());
    } catch (const kdtr::Error& e) {
      return report(EXIT_USAGE, std::string(e.code_name()) + ": " + e.what());
    } catch (const std::bad_alloc&) {
      return report(EXIT_RUNTIME, "out of host memory");
    } catch (const std::exception& e) {
      return report(EXIT_RUNTIME, std::string("internal error: ") + e.what());
    } catch (...) {
      return report(EXIT_RUNTIME, "internal error: unknown exception");
    }
  };
  Args args;
  const int parsed = guarded([&] {
    args = Args::parse(argc, argv, prog, extra_options, describe);
    return EXIT_OK;
  });
  if (parsed != EXIT_OK) return parsed;
  if (!args.batch) return guarded([&] { return body(static_cast<const Args&>(args)); });
  int first_failure = EXIT_OK;
  for (size_t k = 0; k < args.items.size(); ++k) {
    Args one = args;
    one.input = args.items[k].first;
    one.output = args.items[k].second;
    one.items.clear();
    const auto t0 = std::chrono::steady_clock::now();
    const int rc = guarded([&] { return body(static_cast<const Args&>(one)); });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%s i=%zu rc=%d s=%.6f msg=%s\n", kBatchTag, k, rc, s, message.c_str());
    std::fflush(stdout);
    if (rc != EXIT_OK && first_failure == EXIT_OK) first_failure = rc;
    if (rc == EXIT_RUNTIME && args.cuda() && k + 1 < args.items.size()) {
      report(EXIT_RUNTIME, "batch stopped after golden " + std::to_string(k) + " (" + one.input +
                               "): a CUDA runtime failure may leave the context unusable; " +
                               std::to_string(args.items.size() - k - 1) + " golden(s) not run");
      break;
    }
  }
  return first_failure;
}

// ---------------------------------------------------------------------------------------
// Inputs
// ---------------------------------------------------------------------------------------

// Outputs are pre-filled with this byte so that an element a kernel forgets to write cannot
// pass a comparison by luck (0x5a is neither 0 nor 1; 0x5a5a5a5a is not -1 or an index,
// and as a float it is 1.5e16).
constexpr uint8_t kPoison = 0x5a;

// Largest maximum budget N: slot indices are int32 and T = N + 1 must stay below 2^31 - 1.
constexpr int64_t kMaxBudget = 0x7ffffffeLL;

// N, the maximum budget, from a golden's int metadata "max_budget" (no input shape implies
// it; outputs have T = N + 1 slots).  Exits 2 naming the file when it is missing, not an
// int, or outside [0, max_n].
inline int64_t read_max_budget(const File& g, int64_t max_n = kMaxBudget) {
  const MetaValue* v = g.find_metadata("max_budget");
  const std::string what = g.path() + ": metadata max_budget: ";
  if (v == nullptr) die(EXIT_USAGE, what + "missing (N, the maximum budget; the outputs have T = N + 1 slots)");
  const int64_t* n = std::get_if<int64_t>(v);
  if (n == nullptr) die(EXIT_USAGE, what + "must be an int, not a " + meta_type_name(*v));
  if (*n < 0 || *n > max_n)
    die(EXIT_USAGE, what + std::to_string(*n) + " is outside [0, " + std::to_string(max_n) + "]");
  return *n;
}

// The golden's `config` metadata, if present (copied into the output file as-is).
inline const MetaValue* golden_config(const File& golden) { return golden.find_metadata("config"); }

// ---------------------------------------------------------------------------------------
// Resource limits (docs/binaries.md, "Resource limits")
// ---------------------------------------------------------------------------------------
//
// A golden's tensors are mapped, not copied, so what they cost is bounded by the file.
// What a binary allocates on top of them is sized by dims and metadata the golden
// declares (max_budget above all: no input shape bounds it), so before allocating it
// every binary computes, in overflow-checked 64-bit arithmetic, the bytes of
//   - its output tensors, all together (host vectors; the same bytes on the device for
//     --backend cuda), limited by kMaxOutputBytes, and
//   - the largest working memory of its CPU backend (per-request scratch reused request
//     after request), limited by kMaxScratchBytes (checked for --backend cpu only),
// and refuses with exit 2 and one line naming the file and the field that implies the
// size.  The limits are the defaults below; the environment variables raise (or lower)
// them for one run.  kdtr/limits.py holds the same values for the Python reference.

constexpr uint64_t kMaxOutputBytes = uint64_t{4} << 30;   // 4 GiB of output tensors
constexpr uint64_t kMaxScratchBytes = uint64_t{1} << 30;  // 1 GiB of CPU-backend scratch
constexpr const char* kMaxOutputBytesEnv = "KDTR_MAX_OUTPUT_BYTES";
constexpr const char* kMaxScratchBytesEnv = "KDTR_MAX_SCRATCH_BYTES";

// A byte count computed from untrusted dims: `exact` while it fits in 64 bits (`overflow`
// otherwise); `approx` (a double, ~16 digits) is kept for messages in every case.
struct Bytes {
  uint64_t exact = 0;
  bool overflow = false;
  double approx = 0.0;

  // The product of `factors` (dims and an item size), checked.
  static Bytes product(std::initializer_list<uint64_t> factors) { return product(std::vector<uint64_t>(factors)); }
  static Bytes product(const std::vector<uint64_t>& factors) {
    Bytes b;
    b.exact = 1;
    b.approx = 1.0;
    for (uint64_t f : factors) {
      b.overflow = b.overflow || __builtin_mul_overflow(b.exact, f, &b.exact);
      b.approx *= static_cast<double>(f);
    }
    if (b.approx == 0.0) {  // a zero factor makes the product 0, whatever overflowed before
      b.exact = 0;
      b.overflow = false;
    }
    return b;
  }
  Bytes operator+(const Bytes& o) const {
    Bytes s;
    s.overflow = overflow || o.overflow || __builtin_add_overflow(exact, o.exact, &s.exact);
    s.approx = approx + o.approx;
    return s;
  }
  bool over(uint64_t limit) const { return overflow || exact > limit; }
};

// Byte counts for messages: exact digits while they fit in 64 bits and 15 digits
// ("4294967296 bytes (4 GiB)"), else 3 digits ("4.61e18 bytes (4 EiB)"); the binary unit
// is added from 1 KiB on.
inline std::string bytes_text(const Bytes& b) {
  char buf[64];
  if (!b.overflow && b.exact < 1000000000000000ULL) {
    std::snprintf(buf, sizeof buf, "%llu", static_cast<unsigned long long>(b.exact));
  } else {
    std::snprintf(buf, sizeof buf, "%.3g", b.approx);
  }
  std::string s = buf;
  const size_t plus = s.find("e+");
  if (plus != std::string::npos) s.erase(plus + 1, 1);  // 4.61e+18 -> 4.61e18
  s += " bytes";
  static const char* const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB"};
  double v = b.approx;
  int u = -1;
  while (v >= 1024.0 && u < 7) {
    v /= 1024.0;
    ++u;
  }
  if (u >= 0) {
    std::snprintf(buf, sizeof buf, " (%.3g %s)", v, units[u]);
    s += buf;
  }
  return s;
}

// A limit: the environment variable `env` when set (a decimal byte count, 0 allowed),
// else `dflt`.  A value that is not a decimal integer below 2^64 is a usage error
// naming the variable.
inline uint64_t byte_limit(const char* env, uint64_t dflt) {
  const char* s = std::getenv(env);
  if (s == nullptr || *s == '\0') return dflt;
  bool digits = true;
  for (const char* p = s; *p != '\0'; ++p) digits = digits && *p >= '0' && *p <= '9';
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = digits ? std::strtoull(s, &end, 10) : 0;
  if (!digits || errno != 0 || end == nullptr || *end != '\0')
    die(EXIT_USAGE, std::string("environment ") + env + "='" + s + "': not a byte count (a decimal integer, e.g. " +
                        std::to_string(dflt) + ")");
  return static_cast<uint64_t>(v);
}

// die(EXIT_USAGE) unless `need` fits the limit of `env` (default `dflt`):
//   "<path>: <field>: <what> would need <n> bytes (<unit>) for <dims>, over the limit of
//    <limit> bytes (<unit>); set <ENV> to a larger byte count to allow it"
inline void require_within_limit(const File& g, const std::string& field, const char* what, const Bytes& need,
                                 const std::string& dims, const char* env, uint64_t dflt) {
  const uint64_t limit = byte_limit(env, dflt);
  if (!need.over(limit)) return;
  Bytes lim;
  lim.exact = limit;
  lim.approx = static_cast<double>(limit);
  die(EXIT_USAGE, g.path() + ": " + field + ": " + what + " would need " + bytes_text(need) + " for " + dims +
                      ", over the limit of " + bytes_text(lim) + "; set " + env +
                      " to a larger byte count to allow it");
}

// The output tensors of one run, all together, against kMaxOutputBytes ($KDTR_MAX_OUTPUT_BYTES).
inline void require_output_bytes(const File& g, const std::string& field, const Bytes& need, const std::string& dims) {
  require_within_limit(g, field, "outputs", need, dims, kMaxOutputBytesEnv, kMaxOutputBytes);
}

// The CPU backend's working memory, against kMaxScratchBytes ($KDTR_MAX_SCRATCH_BYTES).
inline void require_scratch_bytes(const File& g, const std::string& field, const Bytes& need, const std::string& dims) {
  require_within_limit(g, field, "CPU backend scratch", need, dims, kMaxScratchBytesEnv, kMaxScratchBytes);
}

// The bytes of the outputs follow from the op table (kdtr_ops.hpp, Outputs::bytes); the
// CPU backends' scratch is op-specific:

// Bytes of the CPU tree_build's scratch (cuda_tests/kernels/tree_build.cuh,
// TreeBuildCpuScratch): heap (N + 1) candidates, 5 slot arrays of T int32, an ancestor path
// of min(D, N) + 1 int32, and with the select build its candidate set and widened
// log-probs, `select_bytes`.  Allocated once, whatever B (also for B = 0).
inline Bytes tree_build_scratch_bytes(uint64_t N, uint64_t D, size_t candidate_size, Bytes select_bytes) {
  const uint64_t T = N + 1;
  return Bytes::product({T, candidate_size}) + Bytes::product({T, 5 * 4}) + Bytes::product({std::min(D, N) + 1, 4}) +
         select_bytes;
}

// Bytes of the CPU verify_attn's scratch for one request attending to at most L keys
// (cuda_tests/kernels/verify_attn.cuh): the keys widened to f64 [L,Dqk], scores f64 [L],
// a visible flag u8 [L], the q row f64 [Dqk] and an accumulator f64 [d_v].
inline Bytes verify_attn_scratch_bytes(uint64_t L, uint64_t Dqk, uint64_t d_v) {
  return Bytes::product({L, Dqk, 8}) + Bytes::product({L, 8 + 1}) + Bytes::product({Dqk + d_v, 8});
}

// Require dims to fit the int range kernels index with; die(EXIT_USAGE) otherwise.
inline void require_dim_at_most(const File& f, const std::string& tensor, uint64_t value, uint64_t max,
                                const char* what) {
  if (value > max)
    die(EXIT_USAGE,
        f.path() + ": " + tensor + ": " + what + " " + std::to_string(value) + " exceeds " + std::to_string(max));
}

// ---------------------------------------------------------------------------------------
// Timing (--repeat N)
// ---------------------------------------------------------------------------------------

// Print "timing backend=<b> repeat=<N> median_us=<x> min_us=<y>" on stdout.  The median
// of an even count is the mean of the two middle samples.
inline void print_timing(const std::string& backend, std::vector<double> samples_us) {
  if (samples_us.empty()) return;
  std::sort(samples_us.begin(), samples_us.end());
  const size_t n = samples_us.size();
  const double median = n % 2 ? samples_us[n / 2] : 0.5 * (samples_us[n / 2 - 1] + samples_us[n / 2]);
  std::printf("timing backend=%s repeat=%zu median_us=%.3f min_us=%.3f\n", backend.c_str(), n, median,
              samples_us.front());
  std::fflush(stdout);
}

// The CPU backend's run: `op()` once, then with --repeat N (repeat > 0) N timed runs and
// the timing line.
template <class Op>
void run_cpu_timed(int repeat, Op&& op);

// Run `op` `repeat` times, timing each with steady_clock (microseconds).
template <class Op>
std::vector<double> time_cpu(int repeat, Op&& op) {
  std::vector<double> us;
  us.reserve(static_cast<size_t>(std::max(repeat, 0)));
  for (int i = 0; i < repeat; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    op();
    const auto t1 = std::chrono::steady_clock::now();
    us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  return us;
}

template <class Op>
void run_cpu_timed(int repeat, Op&& op) {
  op();
  if (repeat > 0) print_timing("cpu", time_cpu(repeat, op));
}

// ---------------------------------------------------------------------------------------
// Backends and CUDA helpers
// ---------------------------------------------------------------------------------------

#ifdef KDTR_NO_CUDA

inline constexpr bool kHaveCuda = false;

// --backend cuda in a build without CUDA -> exit 3.
inline void require_backend(const Args& args) {
  if (args.cuda())
    die(EXIT_NOT_SUPPORTED, "backend cuda not supported: this binary was built without CUDA (NO_CUDA / no nvcc)");
}

inline std::string device_name(const Args&) { return "cpu"; }

#else  // CUDA available

inline constexpr bool kHaveCuda = true;

// "CUDA error at FILE:LINE: EXPR: cudaErrorName: description"
inline std::string cuda_error_text(cudaError_t err, const char* expr, const char* file, int line) {
  return std::string("CUDA error at ") + file + ":" + std::to_string(line) + ": " + expr + ": " +
         cudaGetErrorName(err) + ": " + cudaGetErrorString(err);
}

// Check a CUDA runtime call; on error die(EXIT_RUNTIME) with file:line and the error string.
#define KDTR_CUDA_CHECK(expr)                                                                    \
  do {                                                                                           \
    const cudaError_t kdtr_cuda_err_ = (expr);                                                   \
    if (kdtr_cuda_err_ != cudaSuccess)                                                           \
      ::kdtr::cli::die(::kdtr::cli::EXIT_RUNTIME,                                                \
                       ::kdtr::cli::cuda_error_text(kdtr_cuda_err_, #expr, __FILE__, __LINE__)); \
  } while (0)

// After a kernel launch: the launch error, then the execution error (synchronizes the device).
#define KDTR_CUDA_CHECK_LAUNCH()              \
  do {                                        \
    KDTR_CUDA_CHECK(cudaGetLastError());      \
    KDTR_CUDA_CHECK(cudaDeviceSynchronize()); \
  } while (0)

// Select --device for --backend cuda: no usable driver/device or an out-of-range index
// -> die(EXIT_NOT_SUPPORTED); cudaSetDevice failing on a listed device -> EXIT_RUNTIME.
// A CPU run never touches CUDA.
inline void require_backend(const Args& args) {
  if (!args.cuda()) return;
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // reset the runtime's last-error slot
    die(EXIT_NOT_SUPPORTED, std::string("backend cuda not supported: cudaGetDeviceCount: ") + cudaGetErrorName(err) +
                                ": " + cudaGetErrorString(err));
  }
  if (count <= 0) die(EXIT_NOT_SUPPORTED, "backend cuda not supported: no CUDA device found");
  if (args.device >= count)
    die(EXIT_NOT_SUPPORTED, "backend cuda not supported: --device " + std::to_string(args.device) + " out of range (" +
                                std::to_string(count) + " device(s))");
  KDTR_CUDA_CHECK(cudaSetDevice(args.device));
}

// The GPU's name for the output metadata ("cpu" for the CPU backend).
inline std::string device_name(const Args& args) {
  if (!args.cuda()) return "cpu";
  cudaDeviceProp prop;
  KDTR_CUDA_CHECK(cudaGetDeviceProperties(&prop, args.device));
  return prop.name;
}

// Device memory for n elements of T; frees itself (errors on free are ignored).
template <class T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    if (n_ > 0) KDTR_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), n_ * sizeof(T)));
  }
  // Allocate and copy n elements from host memory.
  DeviceBuffer(const T* host, size_t n) : DeviceBuffer(n) { upload(host); }
  ~DeviceBuffer() {
    if (p_ != nullptr) (void)cudaFree(p_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return p_; }
  size_t size() const { return n_; }
  void upload(const T* host) {
    if (n_ > 0) KDTR_CUDA_CHECK(cudaMemcpy(p_, host, n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  void download(T* host) const {
    if (n_ > 0) KDTR_CUDA_CHECK(cudaMemcpy(host, p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
  }
  // Fill every byte with `byte` (e.g. 0xff poisons int outputs with -1).
  void fill_bytes(int byte) {
    if (n_ > 0) KDTR_CUDA_CHECK(cudaMemset(p_, byte, n_ * sizeof(T)));
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

class CudaStream {
 public:
  CudaStream() { KDTR_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  ~CudaStream() { (void)cudaStreamDestroy(s_); }
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  cudaStream_t get() const { return s_; }
  void sync() const { KDTR_CUDA_CHECK(cudaStreamSynchronize(s_)); }

 private:
  cudaStream_t s_ = nullptr;
};

class CudaEvent {
 public:
  CudaEvent() { KDTR_CUDA_CHECK(cudaEventCreate(&e_)); }
  ~CudaEvent() { (void)cudaEventDestroy(e_); }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

// Untimed launches before the timed ones (clocks up, caches and TLBs warm).
inline constexpr int kCudaWarmup = 3;

// Run `launch()` (which enqueues the op's kernel launch(es) on `stream` and returns its
// cudaError_t) `warmup` times untimed, then `repeat` times, timing each with device
// events recorded on `stream` just before and just after it (microseconds): the samples
// are device time of the launches alone, no copies and no host work.  Every launch and
// every execution is checked.
template <class Launch>
std::vector<double> time_cuda(int repeat, cudaStream_t stream, Launch&& launch, int warmup = kCudaWarmup) {
  std::vector<double> us;
  us.reserve(static_cast<size_t>(std::max(repeat, 0)));
  for (int i = 0; i < warmup; ++i) KDTR_CUDA_CHECK(launch());
  KDTR_CUDA_CHECK(cudaStreamSynchronize(stream));
  KDTR_CUDA_CHECK(cudaGetLastError());
  CudaEvent start, stop;
  for (int i = 0; i < repeat; ++i) {
    KDTR_CUDA_CHECK(cudaEventRecord(start.get(), stream));
    KDTR_CUDA_CHECK(launch());
    KDTR_CUDA_CHECK(cudaEventRecord(stop.get(), stream));
    KDTR_CUDA_CHECK(cudaEventSynchronize(stop.get()));
    KDTR_CUDA_CHECK(cudaGetLastError());
    float ms = 0.0f;
    KDTR_CUDA_CHECK(cudaEventElapsedTime(&ms, start.get(), stop.get()));
    us.push_back(static_cast<double>(ms) * 1000.0);
  }
  return us;
}

#endif  // KDTR_NO_CUDA

}  // namespace cli
}  // namespace kdtr
