// test_verify_attn.cu -- build/bin/kdtr_verify_attn: run verify_attn on a golden's inputs.
//
//   kdtr_verify_attn --input GOLDEN --output OUT [--backend cpu|cuda] [--device N] [--repeat N]
//                    [--kernel auto|simt|mma|wgmma] [--graph]
//   kdtr_verify_attn --describe   (its parameter struct kdtr_verify_attn_params as JSON: docs/binaries.md)
//
// Reads the inputs of kdtr::ops::verify_attn_decl() (kdtr_ops.hpp: q f32|bf16
// [B,T,H,Dqk], kv_cache (same dtype) [B,S,Dqk], prefix_len i32 [B], tree_len i32 [B],
// visibility u8 [B,T,T], sm_scale f32 [], d_v i32 []) from GOLDEN, runs the op (contract:
// docs/ops/verify_attn.md), and writes OUT holding out f32 [B,T,H,d_v] and lse f32
// [B,T,H] with metadata op="verify_attn", config (copied from the golden), backend,
// device, kernel ("cpu_f64", or the CUDA kernel instance that ran).  Exit codes, the
// --repeat line and --graph (two data sets replayed from one CUDA graph): docs/binaries.md.  --kernel (CUDA only)
// forces the f32 FFMA kernel (simt), the bf16 tensor-core kernel (mma) or the Hopper wgmma + TMA kernel (wgmma: compute
// capability 9.0 and a build with it, verify_attn_sm90.cu); mma and wgmma exit 3 where they do not apply; the default
// auto picks wgmma for Dqk > 256 where it applies, else mma where it applies, else simt.  Outputs (and the CPU
// backend's scratch) over the resource limits of kdtr_cli.hpp are input errors (exit 2), checked before anything is
// allocated.
//
// Host code only, compiled as C++ in both builds (-DKDTR_NO_CUDA in the CPU-only one),
// linked with the CPU core (cpu/verify_attn.cpp) and, in the CUDA build, the kernels
// (kernels/verify_attn.cu, verify_attn_sm90.cu); it includes neither core.

#include <algorithm>
#include <cstdint>
#include <string>

#include "kdtr.hpp"
#include "kdtr_cli.hpp"
#include "kdtr_describe.hpp"
#include "kdtr_io.hpp"
#include "kdtr_ops.hpp"
#include "verify_attn_params.h"

#ifndef KDTR_NO_CUDA
#include "kdtr_cuda.hpp"
#include "verify_attn_launch.h"
#endif

namespace {

using namespace kdtr;

constexpr const char* kProg = "kdtr_verify_attn";

// The values (dtypes, shapes and dim bounds are the table's): d_v in [1, Dqk], per
// request prefix_len >= 0, tree_len in [0, T], prefix_len + tree_len <= S.  Any violation
// is a kdtr::Error naming file and tensor.
void check_values(ops::Inputs& in) {
  ops::read_d_v(in);
  const File& g = in.golden();
  const int64_t T = in.dim("T"), S = in.dim("S");
  const int32_t* prefix_len = in.get<const int32_t>("input.prefix_len");
  const int32_t* tree_len = in.get<const int32_t>("input.tree_len");
  for (int64_t b = 0; b < in.dim("B"); ++b) {
    const int64_t pl = prefix_len[b], tl = tree_len[b];
    const std::string req = "request " + std::to_string(b) + ": ";
    if (pl < 0) ops::invalid(g, "input.prefix_len", req + "prefix_len " + std::to_string(pl) + " is negative");
    if (tl < 0 || tl > T)
      ops::invalid(g, "input.tree_len",
                   req + "tree_len " + std::to_string(tl) + " is outside [0, T = " + std::to_string(T) + "]");
    if (!cpu::verify_attn_lengths_ok(pl, tl, T, S))
      ops::invalid(g, "input.prefix_len",
                   req + "prefix_len " + std::to_string(pl) + " + tree_len " + std::to_string(tl) +
                       " exceeds the cache rows S = " + std::to_string(S));
  }
}

// Resource limits (docs/binaries.md), before anything is allocated: the outputs out
// [B,T,H,d_v] and lse [B,T,H] (f32), and for the CPU backend its scratch for the longest
// request, L = prefix_len + tree_len keys (at most S rows of input.kv_cache).  Exit 2.
void check_limits(const ops::Inputs& in, const ops::Outputs& out, bool cpu) {
  const File& g = in.golden();
  const uint64_t d_v = static_cast<uint64_t>(in.dim("d_v")), Dqk = static_cast<uint64_t>(in.dim("Dqk"));
  out.require_within_limit(g, "input.q",
                           "out [B,T,H,d_v] = [" + std::to_string(in.dim("B")) + "," + std::to_string(in.dim("T")) +
                               "," + std::to_string(in.dim("H")) + "," + std::to_string(d_v) + "] and lse [B,T,H]");
  if (!cpu) return;
  const int32_t* prefix_len = in.get<const int32_t>("input.prefix_len");
  const int32_t* tree_len = in.get<const int32_t>("input.tree_len");
  uint64_t L = 0;
  for (int64_t b = 0; b < in.dim("B"); ++b)
    L = std::max<uint64_t>(L, static_cast<uint64_t>(prefix_len[b]) + static_cast<uint64_t>(tree_len[b]));
  cli::require_scratch_bytes(
      g, "input.kv_cache", cli::verify_attn_scratch_bytes(L, Dqk, d_v),
      "L = prefix_len + tree_len = " + std::to_string(L) + " keys of Dqk = " + std::to_string(Dqk));
}

#ifndef KDTR_NO_CUDA
std::string run_cuda(const cli::Args& args, const ops::Inputs& in, ops::Outputs& out, const ops::FirstReplay& first,
                     const std::string& kernel) {
  const float sm_scale = in.scalar<float>("input.sm_scale");
  const VerifyAttnProblem dims = ops::verify_attn_params(ops::Slots(in.dims()).add(in).add(out), sm_scale);
  // the kernel (--kernel; exit 3 where a forced one does not apply), its shared memory raised
  const VerifyAttnPlan plan = ops::plan_verify_attn(dims, kernel, args.device, "");

  const ops::Device dev(in, out, &first);
  const VerifyAttnProblem p = ops::verify_attn_params(dev.slots(in.dims()), sm_scale);
  // 3 warm-up launches beyond the checked run before the timed ones
  ops::run_cuda(args, dev, out, [&] { return launch_verify_attn(p, plan, dev.stream.get()); }, 3);
  return plan.name;
}
#endif

int run(const cli::Args& args) {
  const std::string kernel_opt = ops::verify_attn_kernel_option(args, kProg);
  cli::require_backend(args);
  const File golden = File::open(args.input);
  const ops::OpDecl& op = ops::verify_attn_decl();
  ops::Inputs in(golden, op.bounds);
  const auto read = [&](ops::Inputs& i) {
    i.read(op);  // B, T, H, Dqk from q, S from kv_cache
    check_values(i);
  };
  read(in);
  const ops::FirstReplay first(args, in, read);  // --graph: replay1.<name>
  ops::Outputs out;
  out.declare(op, in.dims());
  check_limits(in, out, !args.cuda());
  if (first.on()) check_limits(first.inputs(), out, !args.cuda());
  out.allocate();

  std::string kernel;
  if (args.cuda()) {
#ifndef KDTR_NO_CUDA
    kernel = run_cuda(args, in, out, first, kernel_opt);
#endif
  } else {
    const ops::Host host(in, first);
    const VerifyAttnProblem p =
        ops::verify_attn_params(host.slots(in.dims()).add(out), in.scalar<float>("input.sm_scale"));
    ops::run_cpu(args, host, out, [&] { cpu::verify_attn(p); });
    kernel = "cpu_f64";
  }
  ops::write_outputs(args, golden, op.name, out, &kernel);
  return cli::EXIT_OK;
}

}  // namespace

int main(int argc, char** argv) {
  return kdtr::cli::run_main(argc, argv, kProg, run, {"kernel"}, kdtr::abi::describe_json("verify_attn"));
}
