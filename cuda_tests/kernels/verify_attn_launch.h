// verify_attn_launch.h -- host API of the verify_attn CUDA kernels (verify_attn.cu).
//
// Include from CUDA-enabled host code only (it needs the CUDA runtime's types).
//
//   kdtr::VerifyAttnProblem p{...};                          // device pointers + dims
//   kdtr::VerifyAttnPlan plan;
//   verify_attn_plan(p, kdtr::VerifyAttnKernel::Auto, device, &plan);   // pick a kernel
//   verify_attn_configure(plan);                             // once: shared-memory limit
//   launch_verify_attn(p, plan, stream);                     // enqueue; no sync
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace kdtr {

// Element type of q and kv_cache (one dtype per problem).
enum class VerifyAttnInput : int { F32 = 0, BF16 = 1 };

// Which kernel runs.
//   Simt: FFMA tiles in f32 for any dims and either input dtype (no TF32).
//   Mma:  bf16 tensor cores (mma.sync m16n8k16, f32 accumulation) for bf16 inputs with
//         Dqk % 8 == 0, Dqk <= 576 and d_v <= 512 (instances for Dqk <= 128 / d_v <= 128
//         and for the Kimi K2 dims Dqk = 576, d_v = 512).
//   Auto: Mma where it applies, else Simt.
enum class VerifyAttnKernel : int { Auto = 0, Simt = 1, Mma = 2 };

// One launch's data.  All pointers are device pointers to row-major tensors: q
// [B,T,H,Dqk] and kv_cache [B,S,Dqk] (float, or uint16_t bf16 bits), prefix_len [B],
// tree_len [B] (i32), visibility [B,T,T] (u8); outputs out [B,T,H,d_v] and lse [B,T,H]
// (f32, every element written).  Lengths must be valid (verify_attn_lengths_ok in
// verify_attn.cuh): the kernels trust them.
struct VerifyAttnProblem {
  VerifyAttnInput input = VerifyAttnInput::F32;
  const void* q = nullptr;
  const void* kv_cache = nullptr;
  const int32_t* prefix_len = nullptr;
  const int32_t* tree_len = nullptr;
  const uint8_t* visibility = nullptr;
  float* out = nullptr;
  float* lse = nullptr;
  int64_t B = 0, T = 0, H = 0, S = 0, Dqk = 0, d_v = 0;
  float sm_scale = 0.0f;
};

// The chosen kernel instance (filled by verify_attn_plan).
struct VerifyAttnPlan {
  VerifyAttnKernel kernel = VerifyAttnKernel::Simt;  // Simt or Mma, never Auto
  int instance = 0;                                  // internal instance id
  size_t smem_bytes = 0;                             // dynamic shared memory per block
  const char* name = "";                             // e.g. "mma_bf16_dqk576_dv512"
};

// Pick the kernel for `p` given the `requested` one on `device`.  Returns
// cudaErrorNotSupported when `requested` is Mma and the problem does not fit it (f32
// inputs, dims, or the device's opt-in shared memory), cudaErrorInvalidValue for dims
// the kernels cannot index (negative, T*H or S over 2^30, d_v outside [1, Dqk]), or a
// device-query error.
cudaError_t verify_attn_plan(const VerifyAttnProblem& p, VerifyAttnKernel requested, int device, VerifyAttnPlan* plan);

// Raise the plan's kernel's dynamic shared-memory limit (call once before launching).
cudaError_t verify_attn_configure(const VerifyAttnPlan& plan);

// Enqueue the plan's kernel on `stream` (one launch; B == 0 launches nothing).  Returns
// the launch error (cudaGetLastError()); does not synchronize.
cudaError_t launch_verify_attn(const VerifyAttnProblem& p, const VerifyAttnPlan& plan, cudaStream_t stream);

}  // namespace kdtr
