// test_tree_build.cu -- build/bin/kdtr_tree_build: run tree_build on a golden's inputs.
//
//   kdtr_tree_build --input GOLDEN --output OUT [--backend cpu|cuda] [--device N] [--repeat N]
//                   [--kernel auto|heap|select] [--graph]
//   kdtr_tree_build --describe   (its parameter struct kdtr_tree_build_params as JSON: docs/binaries.md)
//
// Reads the inputs of kdtr::ops::tree_build_decl() (kdtr_ops.hpp: top_log_probs f32
// [B,D,K], top_token_ids i64 [B,D,K], root_token_ids i64 [B], budget i32 [B], depth_limit
// i32 [B], and the metadata max_budget, int N: T = N + 1 output slots) from GOLDEN, runs
// the op (contract: docs/ops/tree_build.md), and writes OUT holding its outputs
// (node_count i32 [B], node_token_ids i64 [B,T], node_depths, parents, next_token,
// next_sibling i32 [B,T], visibility u8 [B,T,T], status i32 [B]) with metadata
// op="tree_build", config (copied from the golden), backend, device.  budget / depth_limit
// out of range and bad log-probs or ids are not input errors: they are per-request
// statuses.  --kernel picks the build (docs/ops/tree_build.md): heap (the serial best-first
// queue), select (the parallel threshold selection, the heap build where it gives up) or
// auto (default: select on CUDA where its shared memory fits, else heap; heap on the CPU).
// Both give the same outputs; the output's metadata `kernel` names the one that ran
// ("heap", "select", "cpu_heap", "cpu_select").  Outputs (and the CPU backend's scratch) implied by max_budget over the
// resource limits of kdtr_cli.hpp are input errors (exit 2), checked before anything is
// allocated.  Exit codes, limits, the --repeat line and --graph (two data sets replayed
// from one CUDA graph; select_fallbacks then counts the second replay): docs/binaries.md.
//
// Host code only, compiled as C++ in both builds (-DKDTR_NO_CUDA in the CPU-only one),
// linked with the CPU core (cpu/tree_build.cpp) and, in the CUDA build, the kernels
// (kernels/tree_build.cu); it includes neither core.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kdtr.hpp"
#include "kdtr_cli.hpp"
#include "kdtr_describe.hpp"
#include "kdtr_io.hpp"
#include "kdtr_ops.hpp"
#include "tree_build_params.h"

#ifndef KDTR_NO_CUDA
#include "kdtr_cuda.hpp"
#include "tree_build_launch.h"
#endif

namespace {

using namespace kdtr;

const char* const kProg = "kdtr_tree_build";

// --kernel: auto (default), heap or select; anything else is a usage error.
int32_t kernel_option(const cli::Args& args) {
  auto it = args.extra.find("kernel");
  const std::string k = it == args.extra.end() ? "auto" : it->second;
  if (k == "auto") return TREE_BUILD_KERNEL_AUTO;
  if (k == "heap") return TREE_BUILD_KERNEL_HEAP;
  if (k == "select") return TREE_BUILD_KERNEL_SELECT;
  cli::die(cli::EXIT_USAGE,
           "--kernel must be auto, heap or select, not '" + k + "'; " + cli::Args::usage(kProg, {"kernel"}));
  return TREE_BUILD_KERNEL_AUTO;
}

// Resource limits (docs/binaries.md), before anything is allocated: the outputs (visibility
// alone is B * T * T bytes, T = max_budget + 1) and, for the CPU backend, tree_build_cpu's
// scratch (sized by N even when B = 0).  Exit 2 naming metadata max_budget.
void check_limits(const File& g, const ops::Dims& d, const ops::Outputs& out, bool cpu, bool select) {
  out.require_within_limit(g, "metadata max_budget", d.eq("B") + ", T = max_budget + 1 = " + std::to_string(d["T"]));
  if (cpu) {
    const cli::Bytes set =
        select ? cli::Bytes::product({static_cast<uint64_t>(cpu::tree_build_select_set_bytes(d["N"], d["K"])), 1}) +
                     cli::Bytes::product({static_cast<uint64_t>(d["D"]), static_cast<uint64_t>(d["K"]), 8})
               : cli::Bytes::product({0});
    cli::require_scratch_bytes(
        g, "metadata max_budget",
        cli::tree_build_scratch_bytes(static_cast<uint64_t>(d["N"]), static_cast<uint64_t>(d["D"]),
                                      cpu::tree_build_candidate_bytes(), set),
        d.eq("N") + ", " + d.eq("D"));
  }
}

int run(const cli::Args& args) {
  cli::require_backend(args);
  const int32_t want = kernel_option(args);
  const File golden = File::open(args.input);
  const ops::OpDecl& op = ops::tree_build_decl();
  ops::Inputs in(golden, op.bounds);
  in.read(op);  // B, D, K from top_log_probs; N from max_budget
  const ops::FirstReplay first(args, in, [&](ops::Inputs& i) { i.read(op); });  // --graph: replay1.<name>
  ops::Outputs out;
  out.declare(op, in.dims());
  check_limits(golden, in.dims(), out, !args.cuda(), want == TREE_BUILD_KERNEL_SELECT);
  out.allocate();

  std::string kernel;
  std::vector<uint8_t> fallback_flags;  // per request: the select build gave up (heap build ran)
  if (args.cuda()) {
#ifndef KDTR_NO_CUDA
    // Shared memory limits N: checked before anything is allocated on the device.
    const int32_t k = ops::configure_tree_build(ops::tree_build_params(ops::Slots(in.dims()).add(in).add(out)), want,
                                                args.device, "");
    const ops::Device dev(in, out, &first);
    TreeBuildParams p = ops::tree_build_params(dev.slots(in.dims()));
    p.kernel = k;
    cli::DeviceBuffer<uint8_t> fell_back(static_cast<size_t>(in.dim("B")));
    p.heap_fallback = fell_back.get();
    ops::run_cuda(args, dev, out, [&] { return launch_tree_build(p, dev.stream.get()); });
    kernel = k == TREE_BUILD_KERNEL_SELECT ? "select" : "heap";
    fallback_flags.resize(fell_back.size());
    fell_back.download(fallback_flags.data());
#endif
  } else {
    const ops::Host host(in, first);
    TreeBuildParams p = ops::tree_build_params(host.slots(in.dims()).add(out));
    p.kernel = want == TREE_BUILD_KERNEL_SELECT ? TREE_BUILD_KERNEL_SELECT : TREE_BUILD_KERNEL_HEAP;
    fallback_flags.assign(static_cast<size_t>(in.dim("B")), 0);
    p.heap_fallback = fallback_flags.data();
    ops::run_cpu(args, host, out, [&] { cpu::tree_build(p); });
    kernel = p.kernel == TREE_BUILD_KERNEL_SELECT ? "cpu_select" : "cpu_heap";
  }
  // select_fallbacks: valid requests the select build handed to the heap build (same
  // outputs; a count for benchmarks and tests of the select path's coverage).
  int64_t fallbacks = 0;
  for (uint8_t f : fallback_flags) fallbacks += f;
  std::vector<std::pair<std::string, int64_t>> extra;
  if (kernel == "select" || kernel == "cpu_select") extra.emplace_back("select_fallbacks", fallbacks);
  ops::write_outputs(args, golden, op.name, out, &kernel, extra);
  return cli::EXIT_OK;
}

}  // namespace

int main(int argc, char** argv) {
  return kdtr::cli::run_main(argc, argv, kProg, run, {"kernel"}, kdtr::abi::describe_json("tree_build"));
}
