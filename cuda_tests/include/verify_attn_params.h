/* verify_attn_params.h -- the parameters of one verify_attn call (kdtr_verify_attn_params,
 * C++: kdtr::VerifyAttnProblem) and its CPU entries (cuda_tests/cpu/verify_attn.cpp), laid
 * out by the rule of kdtr_abi.h from the spec kdtr/ops/verify_attn.py.  Names as in
 * docs/ops/verify_attn.md; row-major tensors: q [B,T,H,Dqk] and kv_cache [B,S,Dqk] (float,
 * or uint16_t bf16 bits: dtype), prefix_len [B], tree_len [B] (i32), visibility [B,T,T]
 * (u8); outputs out [B,T,H,d_v] and lse [B,T,H] (f32, every element written).  Lengths
 * must be valid (verify_attn_lengths_ok) for the CPU core, which trusts them (its entries
 * check them first); the CUDA kernels check each request's on the device (a failing
 * request: out and lse NaN, recorded; verify_attn_launch.h).
 */
#ifndef KDTR_VERIFY_ATTN_PARAMS_H
#define KDTR_VERIFY_ATTN_PARAMS_H

#include <stdint.h>

#include "kdtr_abi.h"

/* The forcible kernels, in spec order (kernel = index + 1; 0 = auto). */
#define KDTR_VERIFY_ATTN_KERNEL_NAMES "simt", "mma", "wgmma"
enum { KDTR_VERIFY_ATTN_AUTO = 0, KDTR_VERIFY_ATTN_SIMT = 1, KDTR_VERIFY_ATTN_MMA = 2, KDTR_VERIFY_ATTN_WGMMA = 3 };

#define KDTR_VERIFY_ATTN_PARAMS_FIELDS(X)                                    \
  X(const void*, q)             /* f32 or bf16 [B,T,H,Dqk] */                \
  X(const void*, kv_cache)      /* q's dtype [B,S,Dqk] */                    \
  X(const int32_t*, prefix_len) /* i32 [B] */                                \
  X(const int32_t*, tree_len)   /* i32 [B] */                                \
  X(const uint8_t*, visibility) /* u8 [B,T,T] */                             \
  X(float*, out)                /* f32 [B,T,H,d_v] */                        \
  X(float*, lse)                /* f32 [B,T,H] */                            \
  X(float, sm_scale)                                                         \
  X(int64_t, B)                                                              \
  X(int64_t, T)                                                              \
  X(int64_t, H)                                                              \
  X(int64_t, S)                                                              \
  X(int64_t, Dqk)                                                            \
  X(int64_t, d_v)            /* the scalar input d_v */                      \
  X(int32_t, dtype)          /* KDTR_DTYPE_F32 (0) or KDTR_DTYPE_BF16 (1) */ \
  X(int32_t, kernel)         /* KDTR_VERIFY_ATTN_* */                        \
  X(const char*, kernel_ran) /* out (libkdtr_kernels.so): the instance that ran */

typedef struct kdtr_verify_attn_params {
  KDTR_VERIFY_ATTN_PARAMS_FIELDS(KDTR_ABI_DECLARE)
} kdtr_verify_attn_params;

#ifdef __cplusplus
namespace kdtr {

using VerifyAttnProblem = ::kdtr_verify_attn_params;

// Dims the kernels index with int (in-request) and int64 (global) arithmetic: T, H,
// T * H, S and Dqk are at most this (verify_attn_plan refuses more; the binaries check
// it when they read a golden).
constexpr int64_t kVerifyAttnMaxDim = int64_t{1} << 30;

namespace cpu {

// The CPU backend (verify_attn_cpu of verify_attn.cuh) on host pointers.
void verify_attn(const VerifyAttnProblem& p);
// verify_attn_lengths_ok of verify_attn.cuh: a request's lengths are valid for T slots and
// S cache rows.
bool verify_attn_lengths_ok(int64_t prefix_len, int64_t tree_len, int64_t T, int64_t S);

}  // namespace cpu
}  // namespace kdtr
#endif

#endif /* KDTR_VERIFY_ATTN_PARAMS_H */
