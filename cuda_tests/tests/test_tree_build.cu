// test_tree_build.cu -- build/bin/kdtr_tree_build: run tree_build on a golden's inputs.
//
//   kdtr_tree_build --input GOLDEN --output OUT [--backend cpu|cuda] [--device N] [--repeat N]
//
// Reads input.top_log_probs f32 [B,D,K], input.top_token_ids i64 [B,D,K],
// input.root_token_ids i64 [B], input.budget i32 [B], input.depth_limit i32 [B] and the
// metadata max_budget (int, N: T = N + 1 output slots) from GOLDEN, runs the op (contract:
// docs/ops/tree_build.md), and writes OUT holding node_count i32 [B], node_token_ids i64
// [B,T], node_depths, parents, next_token, next_sibling i32 [B,T], visibility u8 [B,T,T],
// status i32 [B] with metadata op="tree_build", config (copied from the golden), backend,
// device.  budget / depth_limit out of range and bad log-probs or ids are not input errors:
// they are per-request statuses.  Outputs (and the CPU backend's scratch) implied by
// max_budget over the resource limits of kdtr_cli.hpp are input errors (exit 2), checked
// before anything is allocated.  Exit codes, limits and the --repeat line: docs/binaries.md.
//
// Compiles as CUDA (nvcc, linked with kernels/tree_build.cu) or as plain C++ for the
// CPU-only build (g++ -x c++ -DKDTR_NO_CUDA).

#include <cstdint>
#include <cstring>
#include <string>
#include <variant>
#include <vector>

#include "kdtr.hpp"
#include "kdtr_cli.hpp"
#include "tree_build.cuh"

#ifndef KDTR_NO_CUDA
#include "tree_build_launch.h"
#endif

namespace {

constexpr const char* kProg = "kdtr_tree_build";

using kdtr::cli::kPoison;
using kdtr::cli::poisoned;


struct Inputs {
  int64_t B = 0, D = 0, K = 0, N = 0, T = 0;
  const float* top_log_probs = nullptr;
  const int64_t* top_token_ids = nullptr;
  const int64_t* root_token_ids = nullptr;
  const int32_t* budget = nullptr;
  const int32_t* depth_limit = nullptr;
};

struct Outputs {
  std::vector<int32_t> node_count, node_depths, parents, next_token, next_sibling, status;
  std::vector<int64_t> node_token_ids;
  std::vector<uint8_t> visibility;
  Outputs(int64_t B, int64_t T) {
    const size_t b = static_cast<size_t>(B), bt = static_cast<size_t>(B * T), btt = static_cast<size_t>(B * T * T);
    node_count = poisoned<int32_t>(b);
    node_token_ids = poisoned<int64_t>(bt);
    node_depths = poisoned<int32_t>(bt);
    parents = poisoned<int32_t>(bt);
    next_token = poisoned<int32_t>(bt);
    next_sibling = poisoned<int32_t>(bt);
    visibility = poisoned<uint8_t>(btt);
    status = poisoned<int32_t>(b);
  }
};


// Dtypes and shapes are checked against each other: B, D, K come from top_log_probs.
Inputs read_inputs(const kdtr::File& g) {
  Inputs in;
  in.top_log_probs = g.get<float>("input.top_log_probs", {-1, -1, -1});
  const kdtr::TensorView& lp = g.tensor("input.top_log_probs");
  kdtr::cli::require_dim_at_most(g, lp.name, lp.shape[0], 0x7fffffffULL, "B");
  kdtr::cli::require_dim_at_most(g, lp.name, lp.shape[1], 0x7fffffffULL, "D");
  kdtr::cli::require_dim_at_most(g, lp.name, lp.shape[2], 0x7fffffffULL, "K");
  in.B = static_cast<int64_t>(lp.shape[0]);
  in.D = static_cast<int64_t>(lp.shape[1]);
  in.K = static_cast<int64_t>(lp.shape[2]);
  in.top_token_ids = g.get<int64_t>("input.top_token_ids", {in.B, in.D, in.K});
  in.root_token_ids = g.get<int64_t>("input.root_token_ids", {in.B});
  in.budget = g.get<int32_t>("input.budget", {in.B});
  in.depth_limit = g.get<int32_t>("input.depth_limit", {in.B});
  in.N = kdtr::cli::read_max_budget(g);
  in.T = in.N + 1;
  return in;
}

// Resource limits (docs/binaries.md), before anything is allocated: the outputs (visibility
// alone is B * T * T bytes, T = max_budget + 1) and, for the CPU backend, tree_build_cpu's
// scratch (sized by N even when B = 0).  Exit 2 naming metadata max_budget.
void check_limits(const kdtr::File& g, const Inputs& in, bool cpu) {
  const uint64_t B = static_cast<uint64_t>(in.B), T = static_cast<uint64_t>(in.T);
  kdtr::cli::require_output_bytes(g, "metadata max_budget", kdtr::cli::tree_build_output_bytes(B, T),
                                  "B = " + std::to_string(B) + ", T = max_budget + 1 = " + std::to_string(T));
  if (cpu)
    kdtr::cli::require_scratch_bytes(
        g, "metadata max_budget",
        kdtr::cli::tree_build_scratch_bytes(static_cast<uint64_t>(in.N), static_cast<uint64_t>(in.D),
                                            sizeof(kdtr::TreeBuildCand)),
        "N = " + std::to_string(in.N) + ", D = " + std::to_string(in.D));
}

void run_cpu(const Inputs& in, Outputs& out, int repeat) {
  auto op = [&] {
    kdtr::tree_build_cpu(in.top_log_probs, in.top_token_ids, in.root_token_ids, in.budget, in.depth_limit, in.B,
                         in.D, in.K, in.N, out.node_count.data(), out.node_token_ids.data(), out.node_depths.data(),
                         out.parents.data(), out.next_token.data(), out.next_sibling.data(), out.visibility.data(),
                         out.status.data());
  };
  op();
  if (repeat > 0) kdtr::cli::print_timing("cpu", kdtr::cli::time_cpu(repeat, op));
}

#ifndef KDTR_NO_CUDA
void run_cuda(const Inputs& in, Outputs& out, const kdtr::cli::Args& args) {
  using kdtr::cli::DeviceBuffer;
  // Shared memory limits N: check before allocating anything.
  const size_t smem = kdtr::tree_build_smem_bytes(in.N, in.D);
  size_t smem_max = 0;
  KDTR_CUDA_CHECK(kdtr::tree_build_smem_available(args.device, &smem_max));
  if (smem > smem_max)
    kdtr::cli::die(kdtr::cli::EXIT_NOT_SUPPORTED,
                   "backend cuda not supported: N = " + std::to_string(in.N) + ", D = " + std::to_string(in.D) +
                       " needs " + std::to_string(smem) + " bytes of shared memory per block, device " +
                       std::to_string(args.device) + " allows " + std::to_string(smem_max));
  KDTR_CUDA_CHECK(kdtr::tree_build_configure(smem));

  const size_t b = static_cast<size_t>(in.B), bdk = static_cast<size_t>(in.B * in.D * in.K);
  const size_t bt = static_cast<size_t>(in.B * in.T), btt = static_cast<size_t>(in.B * in.T * in.T);
  kdtr::cli::CudaStream stream;
  DeviceBuffer<float> top_log_probs(in.top_log_probs, bdk);
  DeviceBuffer<int64_t> top_token_ids(in.top_token_ids, bdk), root_token_ids(in.root_token_ids, b);
  DeviceBuffer<int32_t> budget(in.budget, b), depth_limit(in.depth_limit, b);
  DeviceBuffer<int32_t> node_count(b), node_depths(bt), parents(bt), next_token(bt), next_sibling(bt), status(b);
  DeviceBuffer<int64_t> node_token_ids(bt);
  DeviceBuffer<uint8_t> visibility(btt);
  node_count.fill_bytes(kPoison);
  node_token_ids.fill_bytes(kPoison);
  node_depths.fill_bytes(kPoison);
  parents.fill_bytes(kPoison);
  next_token.fill_bytes(kPoison);
  next_sibling.fill_bytes(kPoison);
  visibility.fill_bytes(kPoison);
  status.fill_bytes(kPoison);
  KDTR_CUDA_CHECK(cudaDeviceSynchronize());

  auto launch = [&] {
    return kdtr::launch_tree_build(top_log_probs.get(), top_token_ids.get(), root_token_ids.get(), budget.get(),
                                   depth_limit.get(), in.B, in.D, in.K, in.N, node_count.get(),
                                   node_token_ids.get(), node_depths.get(), parents.get(), next_token.get(),
                                   next_sibling.get(), visibility.get(), status.get(), stream.get());
  };
  KDTR_CUDA_CHECK(launch());
  KDTR_CUDA_CHECK(cudaGetLastError());
  stream.sync();

  node_count.download(out.node_count.data());
  node_token_ids.download(out.node_token_ids.data());
  node_depths.download(out.node_depths.data());
  parents.download(out.parents.data());
  next_token.download(out.next_token.data());
  next_sibling.download(out.next_sibling.data());
  visibility.download(out.visibility.data());
  status.download(out.status.data());

  if (args.repeat > 0) kdtr::cli::print_timing("cuda", kdtr::cli::time_cuda(args.repeat, stream.get(), launch));
  KDTR_CUDA_CHECK(cudaGetLastError());
  KDTR_CUDA_CHECK(cudaDeviceSynchronize());
}
#endif

int run(const kdtr::cli::Args& args) {
  kdtr::cli::require_backend(args);
  const kdtr::File golden = kdtr::File::open(args.input);
  const Inputs in = read_inputs(golden);
  check_limits(golden, in, !args.cuda());
  Outputs out(in.B, in.T);

  if (args.cuda()) {
#ifndef KDTR_NO_CUDA
    run_cuda(in, out, args);
#endif
  } else {
    run_cpu(in, out, args.repeat);
  }

  const uint64_t B = static_cast<uint64_t>(in.B), T = static_cast<uint64_t>(in.T);
  kdtr::Writer w;
  w.add<int32_t>("node_count", {B}, out.node_count.data());
  w.add<int64_t>("node_token_ids", {B, T}, out.node_token_ids.data());
  w.add<int32_t>("node_depths", {B, T}, out.node_depths.data());
  w.add<int32_t>("parents", {B, T}, out.parents.data());
  w.add<int32_t>("next_token", {B, T}, out.next_token.data());
  w.add<int32_t>("next_sibling", {B, T}, out.next_sibling.data());
  w.add<uint8_t>("visibility", {B, T, T}, out.visibility.data());
  w.add<int32_t>("status", {B}, out.status.data());
  w.set_metadata("op", "tree_build");
  if (const kdtr::MetaValue* config = kdtr::cli::golden_config(golden)) w.set_metadata("config", *config);
  w.set_metadata("backend", args.backend);
  w.set_metadata("device", kdtr::cli::device_name(args));
  w.write(args.output);
  return kdtr::cli::EXIT_OK;
}

}  // namespace

int main(int argc, char** argv) { return kdtr::cli::run_main(argc, argv, kProg, run); }
