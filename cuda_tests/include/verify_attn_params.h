// verify_attn_params.h -- the parameters of one verify_attn call (VerifyAttnProblem) and
// its CPU entries (cuda_tests/cpu/verify_attn.cpp), without the op's core
// (kernels/verify_attn.cuh).
#pragma once

#include <cstdint>

namespace kdtr {

// Dims the kernels index with int (in-request) and int64 (global) arithmetic: T, H,
// T * H, S and Dqk are at most this (verify_attn_plan refuses more; the binaries check
// it when they read a golden).
constexpr int64_t kVerifyAttnMaxDim = int64_t{1} << 30;

// Element type of q and kv_cache (one dtype per problem).
enum class VerifyAttnInput : int { F32 = 0, BF16 = 1 };

// One verify_attn call (the CPU backend's verify_attn_cpu and the CUDA launcher
// launch_verify_attn in verify_attn_launch.h take the same struct; host or device
// pointers accordingly).  Names as in docs/ops/verify_attn.md; row-major tensors: q
// [B,T,H,Dqk] and kv_cache [B,S,Dqk] (float, or uint16_t bf16 bits), prefix_len [B],
// tree_len [B] (i32), visibility [B,T,T] (u8); outputs out [B,T,H,d_v] and lse [B,T,H]
// (f32, every element written).  Lengths must be valid (verify_attn_lengths_ok, below):
// the kernels trust them.
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

namespace cpu {

// The CPU backend (verify_attn_cpu of verify_attn.cuh) on host pointers.
void verify_attn(const VerifyAttnProblem& p);
// verify_attn_lengths_ok of verify_attn.cuh: a request's lengths are valid for T slots and
// S cache rows.
bool verify_attn_lengths_ok(int64_t prefix_len, int64_t tree_len, int64_t T, int64_t S);

}  // namespace cpu
}  // namespace kdtr
