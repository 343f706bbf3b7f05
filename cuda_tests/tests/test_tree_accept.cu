// test_tree_accept.cu -- build/bin/kdtr_tree_accept: run tree_accept on a golden's inputs.
//
//   kdtr_tree_accept --input GOLDEN --output OUT [--backend cpu|cuda] [--device N] [--repeat N]
//
// Reads input.node_token_ids i64 [B,T], input.next_token i32 [B,T], input.next_sibling
// i32 [B,T], input.node_count i32 [B], input.target_predict i64 [B,T] from GOLDEN, runs
// the op (contract: docs/ops/tree_accept.md), and writes OUT holding accepted_count i32
// [B], accepted_path i32 [B,T], proposed i64 [B,T], status i32 [B] with metadata
// op="tree_accept", config (copied from the golden), backend, device.  Exit codes and
// the --repeat line: docs/binaries.md.
//
// Compiles as CUDA (nvcc, linked with kernels/tree_accept.cu) or as plain C++ for the
// CPU-only build (g++ -x c++ -DKDTR_NO_CUDA).

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kdtr.hpp"
#include "kdtr_cli.hpp"
#include "tree_accept.cuh"

#ifndef KDTR_NO_CUDA
#include "tree_accept_launch.h"
#endif

namespace {

constexpr const char* kProg = "kdtr_tree_accept";

using kdtr::cli::kPoison;
using kdtr::cli::poisoned;

struct Inputs {
  int64_t B = 0, T = 0;
  const int64_t* node_token_ids = nullptr;
  const int32_t* next_token = nullptr;
  const int32_t* next_sibling = nullptr;
  const int32_t* node_count = nullptr;
  const int64_t* target_predict = nullptr;
};

struct Outputs {
  std::vector<int32_t> accepted_count, accepted_path, status;
  std::vector<int64_t> proposed;
  Outputs(int64_t B, int64_t T) {
    const size_t b = static_cast<size_t>(B), bt = static_cast<size_t>(B * T);
    accepted_count = poisoned<int32_t>(b);
    accepted_path = poisoned<int32_t>(bt);
    status = poisoned<int32_t>(b);
    proposed = poisoned<int64_t>(bt);
  }
};

// Dtypes and shapes are checked against each other: B and T come from node_token_ids.
Inputs read_inputs(const kdtr::File& g) {
  Inputs in;
  in.node_token_ids = g.get<int64_t>("input.node_token_ids", {-1, -1});
  const kdtr::TensorView& ntok = g.tensor("input.node_token_ids");
  kdtr::cli::require_dim_at_most(g, ntok.name, ntok.shape[0], INT64_MAX / 2, "B");
  kdtr::cli::require_dim_at_most(g, ntok.name, ntok.shape[1], INT64_MAX / 2, "T");
  in.B = static_cast<int64_t>(ntok.shape[0]);
  in.T = static_cast<int64_t>(ntok.shape[1]);
  in.next_token = g.get<int32_t>("input.next_token", {in.B, in.T});
  in.next_sibling = g.get<int32_t>("input.next_sibling", {in.B, in.T});
  in.node_count = g.get<int32_t>("input.node_count", {in.B});
  in.target_predict = g.get<int64_t>("input.target_predict", {in.B, in.T});
  // Resource limits (docs/binaries.md), before anything is allocated; the CPU backend has
  // no scratch.  The outputs are bounded by the inputs' own bytes, but a limit is a limit.
  const uint64_t B = static_cast<uint64_t>(in.B), T = static_cast<uint64_t>(in.T);
  kdtr::cli::require_output_bytes(g, "input.node_token_ids", kdtr::cli::tree_accept_output_bytes(B, T),
                                  "B = " + std::to_string(B) + ", T = " + std::to_string(T));
  return in;
}

void run_cpu(const Inputs& in, Outputs& out, int repeat) {
  auto op = [&] {
    kdtr::tree_accept_cpu(in.node_token_ids, in.next_token, in.next_sibling, in.node_count, in.target_predict,
                          in.B, in.T, out.accepted_count.data(), out.accepted_path.data(), out.proposed.data(),
                          out.status.data());
  };
  op();
  if (repeat > 0) kdtr::cli::print_timing("cpu", kdtr::cli::time_cpu(repeat, op));
}

#ifndef KDTR_NO_CUDA
void run_cuda(const Inputs& in, Outputs& out, int repeat) {
  using kdtr::cli::DeviceBuffer;
  const size_t b = static_cast<size_t>(in.B), bt = static_cast<size_t>(in.B * in.T);
  kdtr::cli::CudaStream stream;
  DeviceBuffer<int64_t> node_token_ids(in.node_token_ids, bt), target_predict(in.target_predict, bt);
  DeviceBuffer<int32_t> next_token(in.next_token, bt), next_sibling(in.next_sibling, bt);
  DeviceBuffer<int32_t> node_count(in.node_count, b);
  DeviceBuffer<int32_t> accepted_count(b), accepted_path(bt), status(b);
  DeviceBuffer<int64_t> proposed(bt);
  accepted_count.fill_bytes(kPoison);
  accepted_path.fill_bytes(kPoison);
  status.fill_bytes(kPoison);
  proposed.fill_bytes(kPoison);
  KDTR_CUDA_CHECK(cudaDeviceSynchronize());

  auto launch = [&] {
    return kdtr::launch_tree_accept(node_token_ids.get(), next_token.get(), next_sibling.get(), node_count.get(),
                                    target_predict.get(), in.B, in.T, accepted_count.get(), accepted_path.get(),
                                    proposed.get(), status.get(), stream.get());
  };
  KDTR_CUDA_CHECK(launch());
  KDTR_CUDA_CHECK(cudaGetLastError());
  stream.sync();

  accepted_count.download(out.accepted_count.data());
  accepted_path.download(out.accepted_path.data());
  proposed.download(out.proposed.data());
  status.download(out.status.data());

  if (repeat > 0) kdtr::cli::print_timing("cuda", kdtr::cli::time_cuda(repeat, stream.get(), launch));
  KDTR_CUDA_CHECK(cudaGetLastError());
  KDTR_CUDA_CHECK(cudaDeviceSynchronize());
}
#endif

int run(const kdtr::cli::Args& args) {
  kdtr::cli::require_backend(args);
  const kdtr::File golden = kdtr::File::open(args.input);
  const Inputs in = read_inputs(golden);
  Outputs out(in.B, in.T);

  if (args.cuda()) {
#ifndef KDTR_NO_CUDA
    run_cuda(in, out, args.repeat);
#endif
  } else {
    run_cpu(in, out, args.repeat);
  }

  const uint64_t B = static_cast<uint64_t>(in.B), T = static_cast<uint64_t>(in.T);
  kdtr::Writer w;
  w.add<int32_t>("accepted_count", {B}, out.accepted_count.data());
  w.add<int32_t>("accepted_path", {B, T}, out.accepted_path.data());
  w.add<int64_t>("proposed", {B, T}, out.proposed.data());
  w.add<int32_t>("status", {B}, out.status.data());
  w.set_metadata("op", "tree_accept");
  if (const kdtr::MetaValue* config = kdtr::cli::golden_config(golden)) w.set_metadata("config", *config);
  w.set_metadata("backend", args.backend);
  w.set_metadata("device", kdtr::cli::device_name(args));
  w.write(args.output);
  return kdtr::cli::EXIT_OK;
}

}  // namespace

int main(int argc, char** argv) { return kdtr::cli::run_main(argc, argv, kProg, run); }
