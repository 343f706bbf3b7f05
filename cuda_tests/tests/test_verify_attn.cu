// test_verify_attn.cu -- build/bin/kdtr_verify_attn: run verify_attn on a golden's inputs.
//
//   kdtr_verify_attn --input GOLDEN --output OUT [--backend cpu|cuda] [--device N] [--repeat N]
//                    [--kernel auto|simt|mma]
//
// Reads input.q f32|bf16 [B,T,H,Dqk], input.kv_cache (same dtype) [B,S,Dqk],
// input.prefix_len i32 [B], input.tree_len i32 [B], input.visibility u8 [B,T,T],
// input.sm_scale f32 [] and input.d_v i32 [] from GOLDEN, runs the op (contract:
// docs/ops/verify_attn.md), and writes OUT holding out f32 [B,T,H,d_v] and lse f32
// [B,T,H] with metadata op="verify_attn", config (copied from the golden), backend,
// device, kernel ("cpu_f64", or the CUDA kernel instance that ran).  Exit codes and the
// --repeat line: docs/binaries.md.  --kernel (CUDA only) forces the f32 FFMA kernel
// (simt) or the bf16 tensor-core kernel (mma; exit 3 where it does not apply); the
// default auto picks mma where it applies.  Outputs (and the CPU backend's scratch) over
// the resource limits of kdtr_cli.hpp are input errors (exit 2), checked before anything
// is allocated.
//
// Compiles as CUDA (nvcc, linked with kernels/verify_attn.cu) or as plain C++ for the
// CPU-only build (g++ -x c++ -DKDTR_NO_CUDA).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kdtr.hpp"
#include "kdtr_cli.hpp"
#include "verify_attn.cuh"

#ifndef KDTR_NO_CUDA
#include "verify_attn_launch.h"
#endif

namespace {

constexpr const char* kProg = "kdtr_verify_attn";

using kdtr::cli::kPoison;
using kdtr::cli::poisoned;

// Dims the kernels index with int (in-request) and int64 (global) arithmetic.
constexpr uint64_t kMaxDim = 1ULL << 30;

struct Inputs {
  int64_t B = 0, T = 0, H = 0, S = 0, Dqk = 0, d_v = 0;
  bool bf16 = false;
  const void* q = nullptr;  // float or uint16_t (bf16 bits)
  const void* kv_cache = nullptr;
  const int32_t* prefix_len = nullptr;
  const int32_t* tree_len = nullptr;
  const uint8_t* visibility = nullptr;
  float sm_scale = 0.0f;
};

[[noreturn]] void bad_value(const kdtr::File& g, const std::string& tensor, const std::string& detail) {
  throw kdtr::Error(kdtr::ErrorCode::InvalidArgument, g.path(), tensor, kdtr::NO_OFFSET, detail);
}

// Dtypes and shapes are checked against each other (B, T, H, Dqk from input.q), then the
// values: d_v in [1, Dqk], per request prefix_len >= 0, tree_len in [0, T],
// prefix_len + tree_len <= S.  Any violation is a kdtr::Error naming file and tensor.
Inputs read_inputs(const kdtr::File& g) {
  Inputs in;
  const kdtr::TensorView& q = g.tensor("input.q");
  if (q.dtype != kdtr::DType::F32 && q.dtype != kdtr::DType::BF16)
    throw kdtr::Error(kdtr::ErrorCode::WrongDtype, g.path(), q.name, kdtr::NO_OFFSET,
                      std::string("tensor has dtype ") + kdtr::dtype_name(q.dtype) + ", expected f32 or bf16");
  in.bf16 = q.dtype == kdtr::DType::BF16;
  if (q.shape.size() != 4)
    throw kdtr::Error(kdtr::ErrorCode::WrongShape, g.path(), q.name, kdtr::NO_OFFSET,
                      "tensor has " + std::to_string(q.shape.size()) + " dims, expected 4 [B,T,H,Dqk]");
  kdtr::cli::require_dim_at_most(g, q.name, q.shape[0], kMaxDim, "B");
  kdtr::cli::require_dim_at_most(g, q.name, q.shape[1], kMaxDim, "T");
  kdtr::cli::require_dim_at_most(g, q.name, q.shape[2], kMaxDim, "H");
  kdtr::cli::require_dim_at_most(g, q.name, q.shape[3], kMaxDim, "Dqk");
  kdtr::cli::require_dim_at_most(g, q.name, q.shape[1] * q.shape[2], kMaxDim, "T*H");
  in.B = static_cast<int64_t>(q.shape[0]);
  in.T = static_cast<int64_t>(q.shape[1]);
  in.H = static_cast<int64_t>(q.shape[2]);
  in.Dqk = static_cast<int64_t>(q.shape[3]);
  const kdtr::DType dt = q.dtype;
  if (in.bf16) {
    in.q = g.get<uint16_t>("input.q", {in.B, in.T, in.H, in.Dqk}, dt);
    in.kv_cache = g.get<uint16_t>("input.kv_cache", {in.B, -1, in.Dqk}, dt);
  } else {
    in.q = g.get<float>("input.q", {in.B, in.T, in.H, in.Dqk});
    in.kv_cache = g.get<float>("input.kv_cache", {in.B, -1, in.Dqk});
  }
  const kdtr::TensorView& kv = g.tensor("input.kv_cache");
  kdtr::cli::require_dim_at_most(g, kv.name, kv.shape[1], kMaxDim, "S");
  in.S = static_cast<int64_t>(kv.shape[1]);
  in.prefix_len = g.get<int32_t>("input.prefix_len", {in.B});
  in.tree_len = g.get<int32_t>("input.tree_len", {in.B});
  in.visibility = g.get<uint8_t>("input.visibility", {in.B, in.T, in.T});
  in.sm_scale = *g.get<float>("input.sm_scale", {});
  const int32_t d_v = *g.get<int32_t>("input.d_v", {});
  if (d_v < 1 || d_v > in.Dqk)
    bad_value(g, "input.d_v", "d_v " + std::to_string(d_v) + " is outside [1, Dqk = " + std::to_string(in.Dqk) + "]");
  in.d_v = d_v;
  for (int64_t b = 0; b < in.B; ++b) {
    const int64_t pl = in.prefix_len[b], tl = in.tree_len[b];
    const std::string req = "request " + std::to_string(b) + ": ";
    if (pl < 0) bad_value(g, "input.prefix_len", req + "prefix_len " + std::to_string(pl) + " is negative");
    if (tl < 0 || tl > in.T)
      bad_value(g, "input.tree_len",
                req + "tree_len " + std::to_string(tl) + " is outside [0, T = " + std::to_string(in.T) + "]");
    if (!kdtr::verify_attn_lengths_ok(pl, tl, in.T, in.S))
      bad_value(g, "input.prefix_len",
                req + "prefix_len " + std::to_string(pl) + " + tree_len " + std::to_string(tl) +
                    " exceeds the cache rows S = " + std::to_string(in.S));
  }
  return in;
}

// Resource limits (docs/binaries.md), before anything is allocated: the outputs out
// [B,T,H,d_v] and lse [B,T,H] (f32), and for the CPU backend its scratch for the longest
// request, L = prefix_len + tree_len keys (at most S rows of input.kv_cache).  Exit 2.
void check_limits(const kdtr::File& g, const Inputs& in, bool cpu) {
  const uint64_t B = static_cast<uint64_t>(in.B), T = static_cast<uint64_t>(in.T), H = static_cast<uint64_t>(in.H);
  const uint64_t d_v = static_cast<uint64_t>(in.d_v), Dqk = static_cast<uint64_t>(in.Dqk);
  kdtr::cli::require_output_bytes(g, "input.q", kdtr::cli::verify_attn_output_bytes(B, T, H, d_v),
                                  "out [B,T,H,d_v] = [" + std::to_string(B) + "," + std::to_string(T) + "," +
                                      std::to_string(H) + "," + std::to_string(d_v) + "] and lse [B,T,H]");
  if (!cpu) return;
  uint64_t L = 0;
  for (int64_t b = 0; b < in.B; ++b)
    L = std::max<uint64_t>(L, static_cast<uint64_t>(in.prefix_len[b]) + static_cast<uint64_t>(in.tree_len[b]));
  kdtr::cli::require_scratch_bytes(g, "input.kv_cache", kdtr::cli::verify_attn_scratch_bytes(L, Dqk, d_v),
                                   "L = prefix_len + tree_len = " + std::to_string(L) + " keys of Dqk = " +
                                       std::to_string(Dqk));
}

struct Outputs {
  std::vector<float> out, lse;
  explicit Outputs(const Inputs& in) {
    out = poisoned<float>(static_cast<size_t>(in.B * in.T * in.H * in.d_v));
    lse = poisoned<float>(static_cast<size_t>(in.B * in.T * in.H));
  }
};

std::string run_cpu(const Inputs& in, Outputs& out, int repeat) {
  auto op = [&] {
    if (in.bf16)
      kdtr::verify_attn_cpu(static_cast<const uint16_t*>(in.q), static_cast<const uint16_t*>(in.kv_cache),
                            in.prefix_len, in.tree_len, in.visibility, in.B, in.T, in.H, in.S, in.Dqk, in.d_v,
                            in.sm_scale, out.out.data(), out.lse.data());
    else
      kdtr::verify_attn_cpu(static_cast<const float*>(in.q), static_cast<const float*>(in.kv_cache), in.prefix_len,
                            in.tree_len, in.visibility, in.B, in.T, in.H, in.S, in.Dqk, in.d_v, in.sm_scale,
                            out.out.data(), out.lse.data());
  };
  op();
  if (repeat > 0) kdtr::cli::print_timing("cpu", kdtr::cli::time_cpu(repeat, op));
  return "cpu_f64";
}

// --kernel: "auto" (default), "simt" or "mma"; anything else, or a forced kernel with
// --backend cpu, is a usage error.
std::string kernel_option(const kdtr::cli::Args& args) {
  auto it = args.extra.find("kernel");
  const std::string k = it == args.extra.end() ? "auto" : it->second;
  if (k != "auto" && k != "simt" && k != "mma")
    kdtr::cli::die(kdtr::cli::EXIT_USAGE,
                   "--kernel must be auto, simt or mma, not '" + k + "'; " + kdtr::cli::Args::usage(kProg, {"kernel"}));
  if (k != "auto" && !args.cuda())
    kdtr::cli::die(kdtr::cli::EXIT_USAGE,
                   "--kernel " + k + " applies to --backend cuda only; " + kdtr::cli::Args::usage(kProg, {"kernel"}));
  return k;
}

#ifndef KDTR_NO_CUDA
std::string run_cuda(const Inputs& in, Outputs& out, const kdtr::cli::Args& args, const std::string& kernel) {
  using kdtr::cli::DeviceBuffer;
  const size_t elt = in.bf16 ? 2 : 4;
  const size_t nq = static_cast<size_t>(in.B * in.T * in.H * in.Dqk), nkv = static_cast<size_t>(in.B * in.S * in.Dqk);
  const size_t b = static_cast<size_t>(in.B), btt = static_cast<size_t>(in.B * in.T * in.T);

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
  const kdtr::VerifyAttnKernel requested = kernel == "simt"  ? kdtr::VerifyAttnKernel::Simt
                                           : kernel == "mma" ? kdtr::VerifyAttnKernel::Mma
                                                             : kdtr::VerifyAttnKernel::Auto;
  const cudaError_t perr = kdtr::verify_attn_plan(p, requested, args.device, &plan);
  if (perr == cudaErrorNotSupported)
    kdtr::cli::die(kdtr::cli::EXIT_NOT_SUPPORTED,
                   "backend cuda not supported: --kernel " + kernel + " needs bf16 inputs with Dqk % 8 == 0, Dqk <= 576, "
                   "d_v <= 512 and enough shared memory (got " +
                       std::string(in.bf16 ? "bf16" : "f32") + ", Dqk " + std::to_string(in.Dqk) + ", d_v " +
                       std::to_string(in.d_v) + ")");
  KDTR_CUDA_CHECK(perr);
  KDTR_CUDA_CHECK(kdtr::verify_attn_configure(plan));

  kdtr::cli::CudaStream stream;
  DeviceBuffer<uint8_t> q(static_cast<const uint8_t*>(in.q), nq * elt);
  DeviceBuffer<uint8_t> kv(static_cast<const uint8_t*>(in.kv_cache), nkv * elt);
  DeviceBuffer<int32_t> prefix_len(in.prefix_len, b), tree_len(in.tree_len, b);
  DeviceBuffer<uint8_t> visibility(in.visibility, btt);
  DeviceBuffer<float> d_out(out.out.size()), d_lse(out.lse.size());
  d_out.fill_bytes(kPoison);
  d_lse.fill_bytes(kPoison);
  KDTR_CUDA_CHECK(cudaDeviceSynchronize());

  p.q = q.get();
  p.kv_cache = kv.get();
  p.prefix_len = prefix_len.get();
  p.tree_len = tree_len.get();
  p.visibility = visibility.get();
  p.out = d_out.get();
  p.lse = d_lse.get();
  auto launch = [&] { return kdtr::launch_verify_attn(p, plan, stream.get()); };
  KDTR_CUDA_CHECK(launch());
  KDTR_CUDA_CHECK(cudaGetLastError());
  stream.sync();
  d_out.download(out.out.data());
  d_lse.download(out.lse.data());

  if (args.repeat > 0) {
    for (int w = 0; w < 3; ++w) KDTR_CUDA_CHECK(launch());  // warm-up beyond the checked run
    stream.sync();
    kdtr::cli::print_timing("cuda", kdtr::cli::time_cuda(args.repeat, stream.get(), launch));
  }
  KDTR_CUDA_CHECK(cudaGetLastError());
  KDTR_CUDA_CHECK(cudaDeviceSynchronize());
  return plan.name;
}
#endif

int run(const kdtr::cli::Args& args) {
  const std::string kernel_opt = kernel_option(args);
  kdtr::cli::require_backend(args);
  const kdtr::File golden = kdtr::File::open(args.input);
  const Inputs in = read_inputs(golden);
  check_limits(golden, in, !args.cuda());
  Outputs out(in);

  std::string kernel;
  if (args.cuda()) {
#ifndef KDTR_NO_CUDA
    kernel = run_cuda(in, out, args, kernel_opt);
#endif
  } else {
    kernel = run_cpu(in, out, args.repeat);
  }

  const uint64_t B = static_cast<uint64_t>(in.B), T = static_cast<uint64_t>(in.T), H = static_cast<uint64_t>(in.H);
  kdtr::Writer w;
  w.add<float>("out", {B, T, H, static_cast<uint64_t>(in.d_v)}, out.out.data());
  w.add<float>("lse", {B, T, H}, out.lse.data());
  w.set_metadata("op", "verify_attn");
  if (const kdtr::MetaValue* config = kdtr::cli::golden_config(golden)) w.set_metadata("config", *config);
  w.set_metadata("backend", args.backend);
  w.set_metadata("device", kdtr::cli::device_name(args));
  w.set_metadata("kernel", kernel);
  w.write(args.output);
  return kdtr::cli::EXIT_OK;
}

}  // namespace

int main(int argc, char** argv) { return kdtr::cli::run_main(argc, argv, kProg, run, {"kernel"}); }
