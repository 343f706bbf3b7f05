// test_greedy_step.cu -- build/bin/kdtr_greedy_step: tree_build -> verify_attn -> tree_accept
// chained on a golden's inputs, with no host round trip between the ops.
//
//   kdtr_greedy_step --input GOLDEN --output OUT [--backend cpu|cuda] [--device N] [--repeat N]
//
// Reads from GOLDEN (contract: docs/ops/greedy_step.md; source: shared/DESIGN.md 3.4)
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
// Compiles as CUDA (nvcc, linked with kernels/greedy_step.cu and the kernels of
// tree_build, verify_attn and tree_accept) or as plain C++ for the CPU-only build
// (g++ -x c++ -DKDTR_NO_CUDA).

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <variant>
#include <vector>

#include "greedy_step.cuh"
#include "kdtr.hpp"
#include "kdtr_cli.hpp"
#include "tree_accept.cuh"
#include "tree_build.cuh"
#include "verify_attn.cuh"

#ifndef KDTR_NO_CUDA
#include "greedy_step_launch.h"
#include "tree_accept_launch.h"
#include "tree_build_launch.h"
#include "verify_attn_launch.h"
#endif

namespace {

constexpr const char* kProg = "kdtr_greedy_step";

using kdtr::cli::kPoison;
using kdtr::cli::poisoned;


// Dims verify_attn's kernels index with int (in-request) and int64 (global) arithmetic.
constexpr uint64_t kMaxAttnDim = 1ULL << 30;

struct Inputs {
  int64_t B = 0, D = 0, K = 0, N = 0, T = 0;  // tree_build
  int64_t H = 0, S = 0, Dqk = 0, d_v = 0;     // verify_attn
  // tree_build
  const float* top_log_probs = nullptr;
  const int64_t* top_token_ids = nullptr;
  const int64_t* root_token_ids = nullptr;
  const int32_t* budget = nullptr;
  const int32_t* depth_limit = nullptr;
  // verify_attn
  bool bf16 = false;
  const void* q = nullptr;  // float or uint16_t (bf16 bits)
  const void* kv_cache = nullptr;
  const int32_t* prefix_len = nullptr;
  float sm_scale = 0.0f;
  // tree_accept
  const int64_t* target_predict = nullptr;
};

// Every output of the three ops (host side), pre-filled with kPoison.
struct Outputs {
  // tree_build
  std::vector<int32_t> node_count, node_depths, parents, next_token, next_sibling, build_status;
  std::vector<int64_t> node_token_ids;
  std::vector<uint8_t> visibility;
  // verify_attn
  std::vector<float> out, lse;
  // tree_accept
  std::vector<int32_t> accepted_count, accepted_path, accept_status;
  std::vector<int64_t> proposed;

  explicit Outputs(const Inputs& in) {
    const size_t b = static_cast<size_t>(in.B), bt = static_cast<size_t>(in.B * in.T);
    const size_t btt = static_cast<size_t>(in.B * in.T * in.T);
    const size_t bth = static_cast<size_t>(in.B * in.T * in.H);
    node_count = poisoned<int32_t>(b);
    node_token_ids = poisoned<int64_t>(bt);
    node_depths = poisoned<int32_t>(bt);
    parents = poisoned<int32_t>(bt);
    next_token = poisoned<int32_t>(bt);
    next_sibling = poisoned<int32_t>(bt);
    visibility = poisoned<uint8_t>(btt);
    build_status = poisoned<int32_t>(b);
    out = poisoned<float>(bth * static_cast<size_t>(in.d_v));
    lse = poisoned<float>(bth);
    accepted_count = poisoned<int32_t>(b);
    accepted_path = poisoned<int32_t>(bt);
    proposed = poisoned<int64_t>(bt);
    accept_status = poisoned<int32_t>(b);
  }
};

[[noreturn]] void bad_value(const kdtr::File& g, const std::string& tensor, const std::string& detail) {
  throw kdtr::Error(kdtr::ErrorCode::InvalidArgument, g.path(), tensor, kdtr::NO_OFFSET, detail);
}


// Every input, checked against the others; anything the kernels trust is validated here.
Inputs read_inputs(const kdtr::File& g) {
  Inputs in;
  // tree_build: B, D, K from top_log_probs; N from the metadata.
  in.top_log_probs = g.get<float>("input.top_log_probs", {-1, -1, -1});
  const kdtr::TensorView& lp = g.tensor("input.top_log_probs");
  kdtr::cli::require_dim_at_most(g, lp.name, lp.shape[0], kMaxAttnDim, "B");
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
  // The outputs are checked against the resource limits in check_limits, once H and d_v
  // are known; nothing is allocated before.

  // verify_attn: q [B,T,H,Dqk] (f32 or bf16), kv_cache [B,S,Dqk] of the same dtype.
  const kdtr::TensorView& q = g.tensor("input.q");
  if (q.dtype != kdtr::DType::F32 && q.dtype != kdtr::DType::BF16)
    throw kdtr::Error(kdtr::ErrorCode::WrongDtype, g.path(), q.name, kdtr::NO_OFFSET,
                      std::string("tensor has dtype ") + kdtr::dtype_name(q.dtype) + ", expected f32 or bf16");
  in.bf16 = q.dtype == kdtr::DType::BF16;
  const kdtr::DType dt = q.dtype;
  if (in.bf16) in.q = g.get<uint16_t>("input.q", {in.B, in.T, -1, -1}, dt);
  else in.q = g.get<float>("input.q", {in.B, in.T, -1, -1});
  kdtr::cli::require_dim_at_most(g, q.name, q.shape[1], kMaxAttnDim, "T");
  kdtr::cli::require_dim_at_most(g, q.name, q.shape[2], kMaxAttnDim, "H");
  kdtr::cli::require_dim_at_most(g, q.name, q.shape[3], kMaxAttnDim, "Dqk");
  kdtr::cli::require_dim_at_most(g, q.name, q.shape[1] * q.shape[2], kMaxAttnDim, "T*H");
  in.H = static_cast<int64_t>(q.shape[2]);
  in.Dqk = static_cast<int64_t>(q.shape[3]);
  if (in.bf16) in.kv_cache = g.get<uint16_t>("input.kv_cache", {in.B, -1, in.Dqk}, dt);
  else in.kv_cache = g.get<float>("input.kv_cache", {in.B, -1, in.Dqk});
  const kdtr::TensorView& kv = g.tensor("input.kv_cache");
  kdtr::cli::require_dim_at_most(g, kv.name, kv.shape[1], kMaxAttnDim, "S");
  in.S = static_cast<int64_t>(kv.shape[1]);
  in.prefix_len = g.get<int32_t>("input.prefix_len", {in.B});
  in.sm_scale = *g.get<float>("input.sm_scale", {});
  const int32_t d_v = *g.get<int32_t>("input.d_v", {});
  if (d_v < 1 || d_v > in.Dqk)
    bad_value(g, "input.d_v", "d_v " + std::to_string(d_v) + " is outside [1, Dqk = " + std::to_string(in.Dqk) + "]");
  in.d_v = d_v;
  // tree_len = node_count + 1 is only known on the device; it is at most T, so every
  // request must have room for a full tree after its prefix.
  for (int64_t b = 0; b < in.B; ++b) {
    const int64_t pl = in.prefix_len[b];
    const std::string req = "request " + std::to_string(b) + ": ";
    if (pl < 0) bad_value(g, "input.prefix_len", req + "prefix_len " + std::to_string(pl) + " is negative");
    if (!kdtr::verify_attn_lengths_ok(pl, in.T, in.T, in.S))
      bad_value(g, "input.prefix_len",
                req + "prefix_len " + std::to_string(pl) + " + T " + std::to_string(in.T) +
                    " (the largest tree_len) exceeds the cache rows S = " + std::to_string(in.S));
  }
  // The golden's "dtype" metadata, where present, must name q's dtype.
  if (const kdtr::MetaValue* m = g.find_metadata("dtype")) {
    const std::string what = g.path() + ": metadata dtype: ";
    const std::string* s = std::get_if<std::string>(m);
    if (s == nullptr)
      kdtr::cli::die(kdtr::cli::EXIT_USAGE, what + "must be a string, not a " + kdtr::meta_type_name(*m));
    if (*s != kdtr::dtype_name(dt))
      kdtr::cli::die(kdtr::cli::EXIT_USAGE, what + "\"" + *s + "\" is not the dtype of input.q (" +
                                                kdtr::dtype_name(dt) + ")");
  }

  // tree_accept: target_predict [B,T].
  in.target_predict = g.get<int64_t>("input.target_predict", {in.B, in.T});
  return in;
}

// Resource limits (docs/binaries.md), before anything is allocated: every output of the
// three ops (visibility alone is B * T * T bytes, T = max_budget + 1), and for the CPU
// backend the larger of the two scratches that the chain uses one after the other:
// tree_build_cpu's (sized by N, even when B = 0) and verify_attn_cpu's for the longest
// request (L = prefix_len + tree_len keys, tree_len <= T).  Exit 2.
void check_limits(const kdtr::File& g, const Inputs& in, bool cpu) {
  using kdtr::cli::Bytes;
  const uint64_t B = static_cast<uint64_t>(in.B), T = static_cast<uint64_t>(in.T), H = static_cast<uint64_t>(in.H);
  const uint64_t d_v = static_cast<uint64_t>(in.d_v), Dqk = static_cast<uint64_t>(in.Dqk);
  const Bytes outputs = kdtr::cli::tree_build_output_bytes(B, T) + kdtr::cli::verify_attn_output_bytes(B, T, H, d_v) +
                        kdtr::cli::tree_accept_output_bytes(B, T);
  kdtr::cli::require_output_bytes(g, "metadata max_budget", outputs,
                                  "B = " + std::to_string(B) + ", T = max_budget + 1 = " + std::to_string(T) +
                                      ", H = " + std::to_string(H) + ", d_v = " + std::to_string(d_v));
  if (!cpu) return;
  const Bytes tree_len = Bytes::product({B, 4});
  kdtr::cli::require_scratch_bytes(
      g, "metadata max_budget",
      tree_len + kdtr::cli::tree_build_scratch_bytes(static_cast<uint64_t>(in.N), static_cast<uint64_t>(in.D),
                                                     sizeof(kdtr::TreeBuildCand)),
      "tree_build: N = " + std::to_string(in.N) + ", D = " + std::to_string(in.D));
  uint64_t L = 0;
  for (int64_t b = 0; b < in.B; ++b) L = std::max<uint64_t>(L, static_cast<uint64_t>(in.prefix_len[b]) + T);
  kdtr::cli::require_scratch_bytes(g, "input.kv_cache", tree_len + kdtr::cli::verify_attn_scratch_bytes(L, Dqk, d_v),
                                   "verify_attn: L = prefix_len + T = " + std::to_string(L) + " keys of Dqk = " +
                                       std::to_string(Dqk));
}

std::string run_cpu(const Inputs& in, Outputs& out, int repeat) {
  std::vector<int32_t> tree_len(static_cast<size_t>(in.B));
  auto chain = [&] {
    kdtr::tree_build_cpu(in.top_log_probs, in.top_token_ids, in.root_token_ids, in.budget, in.depth_limit, in.B,
                         in.D, in.K, in.N, out.node_count.data(), out.node_token_ids.data(), out.node_depths.data(),
                         out.parents.data(), out.next_token.data(), out.next_sibling.data(), out.visibility.data(),
                         out.build_status.data());
    kdtr::greedy_step_tree_len_cpu(out.node_count.data(), in.B, in.T, tree_len.data());
    if (in.bf16)
      kdtr::verify_attn_cpu(static_cast<const uint16_t*>(in.q), static_cast<const uint16_t*>(in.kv_cache),
                            in.prefix_len, tree_len.data(), out.visibility.data(), in.B, in.T, in.H, in.S, in.Dqk,
                            in.d_v, in.sm_scale, out.out.data(), out.lse.data());
    else
      kdtr::verify_attn_cpu(static_cast<const float*>(in.q), static_cast<const float*>(in.kv_cache), in.prefix_len,
                            tree_len.data(), out.visibility.data(), in.B, in.T, in.H, in.S, in.Dqk, in.d_v,
                            in.sm_scale, out.out.data(), out.lse.data());
    kdtr::tree_accept_cpu(out.node_token_ids.data(), out.next_token.data(), out.next_sibling.data(),
                          out.node_count.data(), in.target_predict, in.B, in.T, out.accepted_count.data(),
                          out.accepted_path.data(), out.proposed.data(), out.accept_status.data());
  };
  chain();
  if (repeat > 0) kdtr::cli::print_timing("cpu", kdtr::cli::time_cpu(repeat, chain));
  return "cpu_f64";
}

#ifndef KDTR_NO_CUDA
std::string run_cuda(const Inputs& in, Outputs& out, const kdtr::cli::Args& args) {
  using kdtr::cli::DeviceBuffer;

  // Everything that can refuse the problem is settled before any allocation.
  // tree_build: shared memory limits N.
  const size_t smem = kdtr::tree_build_smem_bytes(in.N, in.D);
  size_t smem_max = 0;
  KDTR_CUDA_CHECK(kdtr::tree_build_smem_available(args.device, &smem_max));
  if (smem > smem_max)
    kdtr::cli::die(kdtr::cli::EXIT_NOT_SUPPORTED,
                   "backend cuda not supported: tree_build: N = " + std::to_string(in.N) + ", D = " +
                       std::to_string(in.D) + " needs " + std::to_string(smem) +
                       " bytes of shared memory per block, device " + std::to_string(args.device) + " allows " +
                       std::to_string(smem_max));
  KDTR_CUDA_CHECK(kdtr::tree_build_configure(smem));
  // verify_attn: the kernel instance for these dims and dtype.
  kdtr::VerifyAttnProblem p;
  p.input = in.bf16 ? kdtr::VerifyAttnInput::BF16 : kdtr::VerifyAttnInput::F32;
  p.B = in.B;
  p.T = in.T;
  p.H = in.H;
  p.S = in.S;
  p.Dqk = in.Dqk;
  p.d_v = in.d_v;
  p.sm_scale = in.sm_scale;
  kdtr::VerifyAttnPlan plan;
  const cudaError_t perr = kdtr::verify_attn_plan(p, kdtr::VerifyAttnKernel::Auto, args.device, &plan);
  if (perr == cudaErrorNotSupported)
    kdtr::cli::die(kdtr::cli::EXIT_NOT_SUPPORTED, "backend cuda not supported: verify_attn has no kernel for " +
                                                      std::string(in.bf16 ? "bf16" : "f32") + ", Dqk " +
                                                      std::to_string(in.Dqk) + ", d_v " + std::to_string(in.d_v));
  KDTR_CUDA_CHECK(perr);
  KDTR_CUDA_CHECK(kdtr::verify_attn_configure(plan));

  // Inputs: copied to the device once.
  const size_t b = static_cast<size_t>(in.B), bdk = static_cast<size_t>(in.B * in.D * in.K);
  const size_t bt = static_cast<size_t>(in.B * in.T), btt = static_cast<size_t>(in.B * in.T * in.T);
  const size_t elt = in.bf16 ? 2 : 4;
  const size_t nq = static_cast<size_t>(in.B * in.T * in.H * in.Dqk), nkv = static_cast<size_t>(in.B * in.S * in.Dqk);
  kdtr::cli::CudaStream stream;
  DeviceBuffer<float> top_log_probs(in.top_log_probs, bdk);
  DeviceBuffer<int64_t> top_token_ids(in.top_token_ids, bdk), root_token_ids(in.root_token_ids, b);
  DeviceBuffer<int32_t> budget(in.budget, b), depth_limit(in.depth_limit, b);
  DeviceBuffer<uint8_t> q(static_cast<const uint8_t*>(in.q), nq * elt);
  DeviceBuffer<uint8_t> kv(static_cast<const uint8_t*>(in.kv_cache), nkv * elt);
  DeviceBuffer<int32_t> prefix_len(in.prefix_len, b);
  DeviceBuffer<int64_t> target_predict(in.target_predict, bt);

  // Outputs (tree_build's are also the inputs of the next two ops) and tree_len, poisoned.
  DeviceBuffer<int32_t> node_count(b), node_depths(bt), parents(bt), next_token(bt), next_sibling(bt);
  DeviceBuffer<int32_t> build_status(b), tree_len(b);
  DeviceBuffer<int64_t> node_token_ids(bt);
  DeviceBuffer<uint8_t> visibility(btt);
  DeviceBuffer<float> attn_out(out.out.size()), lse(out.lse.size());
  DeviceBuffer<int32_t> accepted_count(b), accepted_path(bt), accept_status(b);
  DeviceBuffer<int64_t> proposed(bt);
  node_count.fill_bytes(kPoison);
  node_depths.fill_bytes(kPoison);
  parents.fill_bytes(kPoison);
  next_token.fill_bytes(kPoison);
  next_sibling.fill_bytes(kPoison);
  build_status.fill_bytes(kPoison);
  tree_len.fill_bytes(kPoison);
  node_token_ids.fill_bytes(kPoison);
  visibility.fill_bytes(kPoison);
  attn_out.fill_bytes(kPoison);
  lse.fill_bytes(kPoison);
  accepted_count.fill_bytes(kPoison);
  accepted_path.fill_bytes(kPoison);
  accept_status.fill_bytes(kPoison);
  proposed.fill_bytes(kPoison);
  KDTR_CUDA_CHECK(cudaDeviceSynchronize());  // setup done; nothing below waits until the chain is enqueued

  p.q = q.get();
  p.kv_cache = kv.get();
  p.prefix_len = prefix_len.get();
  p.tree_len = tree_len.get();      // from the tree_len kernel
  p.visibility = visibility.get();  // from tree_build
  p.out = attn_out.get();
  p.lse = lse.get();

  // The chain: four launches on one stream, each checked, nothing on the host in between.
  cudaStream_t s = stream.get();
  auto chain = [&]() -> cudaError_t {
    KDTR_CUDA_CHECK(kdtr::launch_tree_build(top_log_probs.get(), top_token_ids.get(), root_token_ids.get(),
                                            budget.get(), depth_limit.get(), in.B, in.D, in.K, in.N,
                                            node_count.get(), node_token_ids.get(), node_depths.get(), parents.get(),
                                            next_token.get(), next_sibling.get(), visibility.get(),
                                            build_status.get(), s));
    KDTR_CUDA_CHECK(kdtr::launch_greedy_step_tree_len(node_count.get(), in.B, in.T, tree_len.get(), s));
    KDTR_CUDA_CHECK(kdtr::launch_verify_attn(p, plan, s));
    KDTR_CUDA_CHECK(kdtr::launch_tree_accept(node_token_ids.get(), next_token.get(), next_sibling.get(),
                                             node_count.get(), target_predict.get(), in.B, in.T,
                                             accepted_count.get(), accepted_path.get(), proposed.get(),
                                             accept_status.get(), s));
    return cudaSuccess;
  };
  KDTR_CUDA_CHECK(chain());
  stream.sync();  // the one synchronization: the chain's execution errors surface here
  KDTR_CUDA_CHECK(cudaGetLastError());

  node_count.download(out.node_count.data());
  node_token_ids.download(out.node_token_ids.data());
  node_depths.download(out.node_depths.data());
  parents.download(out.parents.data());
  next_token.download(out.next_token.data());
  next_sibling.download(out.next_sibling.data());
  visibility.download(out.visibility.data());
  build_status.download(out.build_status.data());
  attn_out.download(out.out.data());
  lse.download(out.lse.data());
  accepted_count.download(out.accepted_count.data());
  accepted_path.download(out.accepted_path.data());
  proposed.download(out.proposed.data());
  accept_status.download(out.accept_status.data());

  if (args.repeat > 0) kdtr::cli::print_timing("cuda", kdtr::cli::time_cuda(args.repeat, s, chain));
  KDTR_CUDA_CHECK(cudaGetLastError());
  KDTR_CUDA_CHECK(cudaDeviceSynchronize());
  return plan.name;
}
#endif

int run(const kdtr::cli::Args& args) {
  kdtr::cli::require_backend(args);
  const kdtr::File golden = kdtr::File::open(args.input);
  const Inputs in = read_inputs(golden);
  check_limits(golden, in, !args.cuda());
  Outputs out(in);

  std::string kernel;
  if (args.cuda()) {
#ifndef KDTR_NO_CUDA
    kernel = run_cuda(in, out, args);
#endif
  } else {
    kernel = run_cpu(in, out, args.repeat);
  }

  const uint64_t B = static_cast<uint64_t>(in.B), T = static_cast<uint64_t>(in.T), H = static_cast<uint64_t>(in.H);
  kdtr::Writer w;
  w.add<int32_t>("tree_build.node_count", {B}, out.node_count.data());
  w.add<int64_t>("tree_build.node_token_ids", {B, T}, out.node_token_ids.data());
  w.add<int32_t>("tree_build.node_depths", {B, T}, out.node_depths.data());
  w.add<int32_t>("tree_build.parents", {B, T}, out.parents.data());
  w.add<int32_t>("tree_build.next_token", {B, T}, out.next_token.data());
  w.add<int32_t>("tree_build.next_sibling", {B, T}, out.next_sibling.data());
  w.add<uint8_t>("tree_build.visibility", {B, T, T}, out.visibility.data());
  w.add<int32_t>("tree_build.status", {B}, out.build_status.data());
  w.add<float>("verify_attn.out", {B, T, H, static_cast<uint64_t>(in.d_v)}, out.out.data());
  w.add<float>("verify_attn.lse", {B, T, H}, out.lse.data());
  w.add<int32_t>("tree_accept.accepted_count", {B}, out.accepted_count.data());
  w.add<int32_t>("tree_accept.accepted_path", {B, T}, out.accepted_path.data());
  w.add<int64_t>("tree_accept.proposed", {B, T}, out.proposed.data());
  w.add<int32_t>("tree_accept.status", {B}, out.accept_status.data());
  w.set_metadata("op", "greedy_step");
  if (const kdtr::MetaValue* config = kdtr::cli::golden_config(golden)) w.set_metadata("config", *config);
  w.set_metadata("backend", args.backend);
  w.set_metadata("device", kdtr::cli::device_name(args));
  w.set_metadata("kernel", kernel);
  w.write(args.output);
  return kdtr::cli::EXIT_OK;
}

}  // namespace

int main(int argc, char** argv) { return kdtr::cli::run_main(argc, argv, kProg, run); }
