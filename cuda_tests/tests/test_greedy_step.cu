// test_greedy_step.cu -- build/bin/kdtr_greedy_step: tree_build -> verify_attn -> tree_accept
// chained on a golden's inputs, with no host round trip between the ops.
//
//   kdtr_greedy_step --input GOLDEN --output OUT [--backend cpu|cuda] [--device N] [--repeat N]
//                    [--kernel auto|simt|mma|wgmma] [--graph]
//   kdtr_greedy_step --describe   (its parameter struct kdtr_greedy_step_params as JSON: docs/binaries.md)
//
// Reads from GOLDEN the inputs of kdtr::ops::greedy_step_chain() (greedy_step_chain.hpp; contract:
// docs/ops/greedy_step.md; source: shared/DESIGN.md 3.4)
//   tree_build:  input.top_log_probs f32 [B,D,K], input.top_token_ids i64 [B,D,K],
//                input.root_token_ids i64 [B], input.budget i32 [B], input.depth_limit i32 [B],
//                metadata max_budget (int N; T = N + 1 slots)
//   verify_attn: input.q f32|bf16 [B,T,H,Dqk], input.kv_cache (same dtype) [B,S,Dqk],
//                input.prefix_len i32 [B], input.sm_scale f32 [], input.d_v i32 []
//   tree_accept: input.target_predict i64 [B,T]
// and writes OUT holding every output of the three ops, named <op>.<output> as in the
// golden: tree_build.{node_count, node_token_ids, node_depths, parents, next_token,
// next_sibling, visibility, status}, verify_attn.{out, lse}, tree_accept.{accepted_count,
// accepted_path, proposed, status}, with metadata op="greedy_step", config (copied from
// the golden), backend, device, kernel (verify_attn's: "cpu_f64" or the CUDA instance).
//
// The chain: tree_build's visibility and tree_len = node_count + 1 feed verify_attn;
// tree_build's node_token_ids, next_token, next_sibling and node_count feed tree_accept.
// CUDA: the inputs are copied to the device once, then the four launches (tree_build,
// the tree_len kernel of kernels/greedy_step.cu, verify_attn, tree_accept) are enqueued on
// one stream, each launch checked, with no host synchronization or copy in between; one
// stream synchronization at the end, then every output is copied back.  CPU: the same
// chain with the three CPU cores.  --repeat times the whole chain (docs/binaries.md).
// --graph (docs/binaries.md, "Graph replay"): the four launches captured in one CUDA graph,
// replayed on the input file's two data sets (the chain's tree_len buffer is not cleared
// between the replays either).
// --kernel forces the kernel of the verify_attn stage exactly as kdtr_verify_attn's
// --kernel does (CUDA only: a usage error with --backend cpu; exit 3 where a forced mma
// or wgmma does not apply); tree_build's build is always auto.
//
// Input errors (exit 2, naming file and tensor) are checked on the host before anything
// runs, because the kernels trust them: dtypes and shapes of all inputs against each
// other (B, D, K from top_log_probs; T = max_budget + 1; H, Dqk from q; S from kv_cache),
// d_v in [1, Dqk], per request prefix_len >= 0 and prefix_len + T <= S (tree_len is only
// known on the device, and it is at most T), and the golden's metadata dtype, where
// present, must name q's dtype; outputs and CPU scratch within the resource limits of
// kdtr_cli.hpp (check_limits).  Per-request defects of the draft
// (budget, depth_limit, log-probs, ids) are tree_build statuses, not input errors.
//
// Host code only, compiled as C++ in both builds (-DKDTR_NO_CUDA in the CPU-only one),
// linked with the chain's wiring (greedy_step_chain.cpp), the four CPU cores (cpu/*.cpp:
// cpu::greedy_step runs the chain on the CPU) and, in the CUDA build, kernels/greedy_step.cu
// and the kernels of tree_build, verify_attn and tree_accept; it includes no core.

#include <algorithm>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "greedy_step_chain.hpp"
#include "greedy_step_params.h"
#include "kdtr.hpp"
#include "kdtr_cli.hpp"
#include "kdtr_describe.hpp"
#include "kdtr_io.hpp"
#include "kdtr_ops.hpp"

#ifndef KDTR_NO_CUDA
#include "greedy_step_launch.h"
#include "kdtr_cuda.hpp"
#include "tree_accept_launch.h"
#include "tree_build_launch.h"
#include "verify_attn_launch.h"
#endif

namespace {

using namespace kdtr;

constexpr const char* kProg = "kdtr_greedy_step";

// The checks of the chain between verify_attn's inputs and tree_accept's: d_v in [1, Dqk];
// per request prefix_len >= 0 and room for a full tree after the prefix (tree_len =
// node_count + 1 is only known on the device, and it is at most T); the golden's "dtype"
// metadata, where present, names q's dtype.
void check_attn_values(ops::Inputs& in) {
  ops::read_d_v(in);
  const File& g = in.golden();
  const int64_t T = in.dim("T"), S = in.dim("S");
  const int32_t* prefix_len = in.get<const int32_t>("input.prefix_len");
  for (int64_t b = 0; b < in.dim("B"); ++b) {
    const int64_t pl = prefix_len[b];
    const std::string req = "request " + std::to_string(b) + ": ";
    if (pl < 0) ops::invalid(g, "input.prefix_len", req + "prefix_len " + std::to_string(pl) + " is negative");
    if (!cpu::verify_attn_lengths_ok(pl, T, T, S))
      ops::invalid(g, "input.prefix_len",
                   req + "prefix_len " + std::to_string(pl) + " + T " + std::to_string(T) +
                       " (the largest tree_len) exceeds the cache rows S = " + std::to_string(S));
  }
  if (const MetaValue* m = g.find_metadata("dtype")) {
    const std::string what = g.path() + ": metadata dtype: ";
    const std::string* s = std::get_if<std::string>(m);
    const char* q_dtype = dtype_name(in.find("input.q").dtype);
    if (s == nullptr) cli::die(cli::EXIT_USAGE, what + "must be a string, not a " + meta_type_name(*m));
    if (*s != q_dtype) cli::die(cli::EXIT_USAGE, what + "\"" + *s + "\" is not the dtype of input.q (" + q_dtype + ")");
  }
}

// Resource limits (docs/binaries.md), before anything is allocated: every output of the
// three ops (visibility alone is B * T * T bytes, T = max_budget + 1), and for the CPU
// backend the larger of the two scratches that the chain uses one after the other:
// tree_build_cpu's (sized by N, even when B = 0) and verify_attn_cpu's for the longest
// request (L = prefix_len + tree_len keys, tree_len <= T).  Exit 2.
void check_limits(const ops::Inputs& in, const ops::Outputs& out, bool cpu) {
  using cli::Bytes;
  const File& g = in.golden();
  const ops::Dims& d = in.dims();
  const uint64_t B = static_cast<uint64_t>(d["B"]), T = static_cast<uint64_t>(d["T"]);
  const uint64_t d_v = static_cast<uint64_t>(d["d_v"]), Dqk = static_cast<uint64_t>(d["Dqk"]);
  out.require_within_limit(
      g, "metadata max_budget",
      d.eq("B") + ", T = max_budget + 1 = " + std::to_string(T) + ", " + d.eq("H") + ", " + d.eq("d_v"));
  if (!cpu) return;
  const Bytes tree_len = Bytes::product({B, 4});
  cli::require_scratch_bytes(
      g, "metadata max_budget",
      tree_len + cli::tree_build_scratch_bytes(static_cast<uint64_t>(d["N"]), static_cast<uint64_t>(d["D"]),
                                               cpu::tree_build_candidate_bytes(), cli::Bytes::product({0})),
      "tree_build: " + d.eq("N") + ", " + d.eq("D"));
  const int32_t* prefix_len = in.get<const int32_t>("input.prefix_len");
  uint64_t L = 0;
  for (uint64_t b = 0; b < B; ++b) L = std::max<uint64_t>(L, static_cast<uint64_t>(prefix_len[b]) + T);
  cli::require_scratch_bytes(
      g, "input.kv_cache", tree_len + cli::verify_attn_scratch_bytes(L, Dqk, d_v),
      "verify_attn: L = prefix_len + T = " + std::to_string(L) + " keys of Dqk = " + std::to_string(Dqk));
}

#ifndef KDTR_NO_CUDA
// CUDA: the inputs copied to the device once, then the four launches enqueued on one
// stream, each checked, nothing on the host in between; one synchronization at the end.
std::string run_cuda(const cli::Args& args, const ops::Inputs& in, ops::Outputs& out, const ops::FirstReplay& first,
                     float sm_scale, const std::string& attn_kernel) {
  // Everything that can refuse the problem is settled before any allocation.
  const GreedyStepStages host = ops::greedy_step_params(ops::Slots(in.dims()).add(in).add(out), nullptr, sm_scale);
  // shared memory limits N; the select kernel where it fits
  const int32_t build_kernel =
      ops::configure_tree_build(host.build, TREE_BUILD_KERNEL_AUTO, args.device, "tree_build: ");
  // verify_attn: the kernel instance for these dims and dtype (--kernel)
  const VerifyAttnPlan plan =
      ops::plan_verify_attn(host.attn, attn_kernel, args.device, attn_kernel == "auto" ? "" : "verify_attn: ");

  cli::DeviceBuffer<int32_t> tree_len(static_cast<size_t>(in.dim("B")));  // the chain's own, poisoned
  tree_len.fill_bytes(cli::kPoison);
  const ops::Device dev(in, out, &first);
  GreedyStepStages c = ops::greedy_step_params(dev.slots(in.dims()), tree_len.get(), sm_scale);
  c.build.kernel = build_kernel;
  const cudaStream_t s = dev.stream.get();
  auto chain = [&]() -> cudaError_t {
    KDTR_CUDA_CHECK(launch_tree_build(c.build, s));
    KDTR_CUDA_CHECK(launch_greedy_step_tree_len(c.tree_len, s));
    KDTR_CUDA_CHECK(launch_verify_attn(c.attn, plan, s));
    KDTR_CUDA_CHECK(launch_tree_accept(c.accept, s));
    return cudaSuccess;
  };
  ops::run_cuda(args, dev, out, chain);
  return plan.name;
}
#endif

int run(const cli::Args& args) {
  const std::string attn_kernel = ops::verify_attn_kernel_option(args, kProg);
  cli::require_backend(args);
  const File golden = File::open(args.input);
  const std::vector<ops::Link>& chain = ops::greedy_step_chain();
  ops::Inputs in(golden, ops::chain_bounds(chain));
  const auto read = [&](ops::Inputs& i) {
    i.read(chain[0]);  // tree_build: B, D, K from top_log_probs; N from max_budget
    i.read(chain[1]);  // verify_attn: H, Dqk from q, S from kv_cache (tree_len, visibility wired)
    check_attn_values(i);
    i.read(chain[2]);  // tree_accept: target_predict (the tree wired from tree_build)
  };
  read(in);
  const ops::FirstReplay first(args, in, read);  // --graph: replay1.<name>
  ops::Outputs out;
  for (const ops::Link& l : chain) out.declare(*l.op, in.dims(), std::string(l.op->name) + ".");
  check_limits(in, out, !args.cuda());
  if (first.on()) check_limits(first.inputs(), out, !args.cuda());
  out.allocate();

  const float sm_scale = in.scalar<float>("input.sm_scale");
  std::string kernel;
  if (args.cuda()) {
#ifndef KDTR_NO_CUDA
    kernel = run_cuda(args, in, out, first, sm_scale, attn_kernel);
#endif
  } else {
    // The same chain with the three CPU cores, tree_len in host memory.
    std::vector<int32_t> tree_len(static_cast<size_t>(in.dim("B")));
    const ops::Host host(in, first);
    const GreedyStepStages c = ops::greedy_step_params(host.slots(in.dims()).add(out), tree_len.data(), sm_scale);
    ops::run_cpu(args, host, out, [&] { cpu::greedy_step(c); });
    kernel = "cpu_f64";
  }
  ops::write_outputs(args, golden, "greedy_step", out, &kernel);
  return cli::EXIT_OK;
}

}  // namespace

int main(int argc, char** argv) {
  return kdtr::cli::run_main(argc, argv, kProg, run, {"kernel"}, kdtr::abi::describe_json("greedy_step"));
}
