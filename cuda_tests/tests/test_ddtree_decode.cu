// test_ddtree_decode.cu -- build/bin/kdtr_ddtree_decode: R DDTree decode steps of a tiny MLA
// target with a bigram drafter (docs/ops/ddtree_decode.md; reference kdtr/ops/ddtree_decode.py).
//
//   kdtr_ddtree_decode --input GOLDEN --output OUT [--backend cpu|cuda] [--repeat N]
//   kdtr_ddtree_decode --describe   (its parameter struct kdtr_ddtree_decode_params as JSON)
//
// Reads the weights input.target_{emb, w_q, w_kv, w_o, w_lm} and input.draft_{emb, w_lm}
// (bf16), input.kv_cache bf16 [B,S,Dqk], input.prefix_len i32 [B], input.root_token_ids i64
// [B], input.budget and input.depth_limit i32 [B,R], input.draft_depth and input.draft_top_k
// i32 [], input.sm_scale f32 [] and metadata max_budget N (T = N + 1), and writes OUT with
// node_count, top_log_probs, top_token_ids, accepted_count, accepted_path, step_tokens,
// attn_out, final_kv_cache and cache_len, metadata op="ddtree_decode", config, backend,
// device.
//
// Input errors (exit 2, naming file and tensor), checked before anything runs: dtypes and
// shapes against each other (V, E from target_emb; H, Dqk from target_w_q; Dv from
// target_w_o; B, S from kv_cache; R from budget), Dv <= Dqk, every weight a multiple of
// 2^-6 within [-1, 1] (the model's fixed-point rule), draft_depth >= 1, draft_top_k in
// [1, V], prefix_len in [0, S], root_token_ids in [0, V), budget in [0, N], depth_limit in
// [0, draft_depth]; and, found while it runs, a step that needs more cache rows than S
// (exit 2 naming input.kv_cache and the request).
//
// --backend cuda runs the decode loop of kernels/ddtree_decode.cu (ddtree_decode_launch.h):
// every step on one stream, no host round trip, capturable (--graph); --kernel
// auto|simt|mma|wgmma picks its verify_attn stage's kernel (exit 3 where it does not apply).

#include <cstdint>
#include <cstring>
#include <string>

#include "ddtree_decode_params.h"
#include "kdtr.hpp"
#include "kdtr_cli.hpp"
#include "kdtr_describe.hpp"
#include "kdtr_io.hpp"
#include "kdtr_ops.hpp"

#ifndef KDTR_NO_CUDA
#include "ddtree_decode_launch.h"
#include "kdtr_cuda.hpp"
#endif

namespace {

using namespace kdtr;

constexpr const char* kProg = "kdtr_ddtree_decode";

const char* const kWeights[] = {"input.target_emb",  "input.target_w_q", "input.target_w_kv", "input.target_w_o",
                                "input.target_w_lm", "input.draft_emb",  "input.draft_w_lm"};

// Every weight a multiple of 2^-6 within [-1, 1]: x @ w is then exact in any order.
void check_weights(const ops::Inputs& in) {
  for (const char* name : kWeights) {
    const ops::Tensor& t = in.find(name);
    const uint16_t* w = static_cast<const uint16_t*>(t.data);
    const uint64_t n = t.nbytes / 2;
    for (uint64_t i = 0; i < n; ++i) {
      const uint32_t u = static_cast<uint32_t>(w[i]) << 16;
      float f;
      std::memcpy(&f, &u, sizeof f);
      const float scaled = f * 64.0f;
      if (!(f >= -1.0f && f <= 1.0f) || scaled != static_cast<float>(static_cast<int>(scaled)))
        ops::invalid(in.golden(), name,
                     "element " + std::to_string(i) + " = " + std::to_string(f) +
                         " is not a multiple of 2^-6 within [-1, 1] (the model's fixed-point weights)");
    }
  }
}

template <class T>
void check_range(const ops::Inputs& in, const char* name, int64_t lo, int64_t hi, const std::string& what) {
  const ops::Tensor& t = in.find(name);
  const T* v = static_cast<const T*>(t.data);
  const uint64_t n = t.nbytes / sizeof(T);
  for (uint64_t i = 0; i < n; ++i)
    if (v[i] < lo || v[i] > hi)
      ops::invalid(in.golden(), name,
                   "element " + std::to_string(i) + " = " + std::to_string(v[i]) + " is outside " + what);
}

#ifndef KDTR_NO_CUDA
// The decode on the device: "" when every step ran, else the CPU backend's reason.  *kernel:
// the verify_attn stage's kernel instance.
std::string run_cuda(const cli::Args& args, const ops::Inputs& in, ops::Outputs& out, const ops::FirstReplay& first,
                     int32_t depth, int32_t top_k, float sm_scale, const std::string& attn_kernel,
                     std::string* kernel) {
  // The kernels are chosen before anything is allocated (a null workspace: dims only).
  const DdtreeDecodeParams dims =
      ops::ddtree_decode_params(ops::Slots(in.dims()).add(in).add(out), depth, top_k, sm_scale);
  const DdtreeDecodeStages planned = ddtree_decode_stages(dims, nullptr);
  const int32_t build_kernel =
      ops::configure_tree_build(planned.build, TREE_BUILD_KERNEL_AUTO, args.device, "tree_build: ");
  const VerifyAttnPlan plan =
      ops::plan_verify_attn(planned.attn, attn_kernel, args.device, attn_kernel == "auto" ? "" : "verify_attn: ");
  *kernel = plan.name;

  cli::DeviceBuffer<uint8_t> workspace(ddtree_decode_workspace_bytes(dims));
  workspace.fill_bytes(cli::kPoison);
  const ops::Device dev(in, out, &first);
  const DdtreeDecodeParams p = ops::ddtree_decode_params(dev.slots(in.dims()), depth, top_k, sm_scale);
  DdtreeDecodeStages st = ddtree_decode_stages(p, workspace.get());
  st.build.kernel = build_kernel;
  const cudaStream_t s = dev.stream.get();
  ops::run_cuda(args, dev, out, [&] { return launch_ddtree_decode(p, st, plan, s); });
  DdtreeDecodeError e{};
  KDTR_CUDA_CHECK(ddtree_decode_read_error(p, workspace.get(), s, &e));
  return ddtree_decode_error_message(e, p.S);
}
#endif

int run(const cli::Args& args) {
  const std::string attn_kernel = ops::verify_attn_kernel_option(args, kProg);
  cli::require_backend(args);
  const File golden = File::open(args.input);
  const ops::OpDecl& op = ops::ddtree_decode_decl();
  ops::Inputs in(golden, op.bounds);
  in.read(op);
  const ops::Dims& d = in.dims();
  if (d["Dv"] > d["Dqk"])
    ops::invalid(golden, "input.target_w_o",
                 "Dv " + std::to_string(d["Dv"]) + " exceeds Dqk " + std::to_string(d["Dqk"]));
  const int32_t depth = in.scalar<int32_t>("input.draft_depth"), top_k = in.scalar<int32_t>("input.draft_top_k");
  if (depth < 1) ops::invalid(golden, "input.draft_depth", "draft_depth " + std::to_string(depth) + " < 1");
  if (top_k < 1 || top_k > d["V"])
    ops::invalid(golden, "input.draft_top_k",
                 "draft_top_k " + std::to_string(top_k) + " is outside [1, V = " + std::to_string(d["V"]) + "]");
  in.bind("D", depth);
  in.bind("K", top_k);
  check_weights(in);
  check_range<int32_t>(in, "input.prefix_len", 0, d["S"], "[0, S = " + std::to_string(d["S"]) + "]");
  check_range<int64_t>(in, "input.root_token_ids", 0, d["V"] - 1, "[0, V = " + std::to_string(d["V"]) + ")");
  check_range<int32_t>(in, "input.budget", 0, d["N"], "[0, N = max_budget = " + std::to_string(d["N"]) + "]");
  check_range<int32_t>(in, "input.depth_limit", 0, depth, "[0, draft_depth = " + std::to_string(depth) + "]");
  ops::Outputs out;
  out.declare(op, in.dims());
  out.require_within_limit(golden, "input.budget", d.eq("B") + ", " + d.eq("R") + ", T = max_budget + 1");
  out.allocate();

  const ops::FirstReplay first(args, in, [&](ops::Inputs& i) { i.read(op); });
  const float sm_scale = in.scalar<float>("input.sm_scale");
  std::string why, kernel;
  if (args.cuda()) {
#ifndef KDTR_NO_CUDA
    why = run_cuda(args, in, out, first, depth, top_k, sm_scale, attn_kernel, &kernel);
#endif
  } else {
    const ops::Host host(in, first);
    const DdtreeDecodeParams p = ops::ddtree_decode_params(host.slots(in.dims()).add(out), depth, top_k, sm_scale);
    ops::run_cpu(args, host, out, [&] { why = cpu::ddtree_decode(p); });
    kernel = "cpu_f64";
  }
  if (!why.empty()) ops::invalid(golden, "input.kv_cache", why);
  ops::write_outputs(args, golden, op.name, out, &kernel);
  return cli::EXIT_OK;
}

}  // namespace

int main(int argc, char** argv) {
  return kdtr::cli::run_main(argc, argv, kProg, run, {"kernel"}, kdtr::abi::describe_json("ddtree_decode"));
}
