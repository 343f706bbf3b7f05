/* greedy_step_params.h -- the parameters of one greedy_step call (kdtr_greedy_step_params,
 * C++: kdtr::GreedyStepParams: tree_build -> verify_attn -> tree_accept, laid out by the
 * rule of kdtr_abi.h from the spec kdtr/ops/greedy_step.py), the glue step's
 * GreedyStepTreeLenParams, the four stage structs of the chain (GreedyStepStages) and the
 * CPU entries (cuda_tests/cpu/greedy_step.cpp), without any op's core.
 */
#ifndef KDTR_GREEDY_STEP_PARAMS_H
#define KDTR_GREEDY_STEP_PARAMS_H

#include <stdint.h>

#include "kdtr_abi.h"
#include "tree_accept_params.h"
#include "tree_build_params.h"
#include "verify_attn_params.h"

/* The forcible kernels of the verify_attn stage (kernel = index + 1; 0 = auto). */
#define KDTR_GREEDY_STEP_KERNEL_NAMES KDTR_VERIFY_ATTN_KERNEL_NAMES

#define KDTR_GREEDY_STEP_PARAMS_FIELDS(X)                                         \
  X(const float*, top_log_probs)          /* f32 [B,D,K] */                       \
  X(const int64_t*, top_token_ids)        /* i64 [B,D,K] */                       \
  X(const int64_t*, root_token_ids)       /* i64 [B] */                           \
  X(const int32_t*, budget)               /* i32 [B] */                           \
  X(const int32_t*, depth_limit)          /* i32 [B] */                           \
  X(const void*, q)                       /* f32 or bf16 [B,T,H,Dqk] */           \
  X(const void*, kv_cache)                /* q's dtype [B,S,Dqk] */               \
  X(const int32_t*, prefix_len)           /* i32 [B] */                           \
  X(const int64_t*, target_predict)       /* i64 [B,T] */                         \
  X(int32_t*, tree_build_node_count)      /* i32 [B] */                           \
  X(int64_t*, tree_build_node_token_ids)  /* i64 [B,T] */                         \
  X(int32_t*, tree_build_node_depths)     /* i32 [B,T] */                         \
  X(int32_t*, tree_build_parents)         /* i32 [B,T] */                         \
  X(int32_t*, tree_build_next_token)      /* i32 [B,T] */                         \
  X(int32_t*, tree_build_next_sibling)    /* i32 [B,T] */                         \
  X(uint8_t*, tree_build_visibility)      /* u8 [B,T,T] */                        \
  X(int32_t*, tree_build_status)          /* i32 [B] */                           \
  X(float*, verify_attn_out)              /* f32 [B,T,H,d_v] */                   \
  X(float*, verify_attn_lse)              /* f32 [B,T,H] */                       \
  X(int32_t*, tree_accept_accepted_count) /* i32 [B] */                           \
  X(int32_t*, tree_accept_accepted_path)  /* i32 [B,T] */                         \
  X(int64_t*, tree_accept_proposed)       /* i64 [B,T] */                         \
  X(int32_t*, tree_accept_status)         /* i32 [B] */                           \
  X(int32_t*, tree_len)                   /* i32 [B] workspace: node_count + 1 */ \
  X(float, sm_scale)                                                              \
  X(int64_t, B)                                                                   \
  X(int64_t, D)                                                                   \
  X(int64_t, K)                                                                   \
  X(int64_t, N) /* max_budget; T = N + 1 */                                       \
  X(int64_t, H)                                                                   \
  X(int64_t, S)                                                                   \
  X(int64_t, Dqk)                                                                 \
  X(int64_t, d_v)            /* the scalar input d_v */                           \
  X(int32_t, dtype)          /* KDTR_DTYPE_F32 (0) or KDTR_DTYPE_BF16 (1) */      \
  X(int32_t, kernel)         /* verify_attn's: KDTR_VERIFY_ATTN_* */              \
  X(const char*, kernel_ran) /* out: verify_attn's instance that ran */

typedef struct kdtr_greedy_step_params {
  KDTR_GREEDY_STEP_PARAMS_FIELDS(KDTR_ABI_DECLARE)
} kdtr_greedy_step_params;

/* The glue step of the chain: tree_len i32 [B] from tree_build's node_count i32 [B], T
 * slots (host pointers for the CPU core, device pointers for
 * launch_greedy_step_tree_len). */
typedef struct kdtr_greedy_step_tree_len_params {
  const int32_t* node_count; /* i32 [B] */
  int32_t* tree_len;         /* i32 [B] */
  int64_t B, T;
} kdtr_greedy_step_tree_len_params;

#ifdef __cplusplus
namespace kdtr {

using GreedyStepParams = ::kdtr_greedy_step_params;
using GreedyStepTreeLenParams = ::kdtr_greedy_step_tree_len_params;

// The four stage structs of the chain, wired by kdtr::ops::greedy_step_params
// (greedy_step_chain.hpp) or libkdtr_kernels.so: tree_build -> tree_len -> verify_attn
// -> tree_accept.
struct GreedyStepStages {
  TreeBuildParams build;
  GreedyStepTreeLenParams tree_len;
  VerifyAttnProblem attn;
  TreeAcceptParams accept;
};

namespace cpu {

// The glue step (greedy_step_tree_len_cpu of greedy_step.cuh) on host pointers.
void greedy_step_tree_len(const GreedyStepTreeLenParams& p);
// The whole chain on the CPU, host pointers: tree_build, the glue, verify_attn, tree_accept.
void greedy_step(const GreedyStepStages& c);

}  // namespace cpu
}  // namespace kdtr
#endif

#endif /* KDTR_GREEDY_STEP_PARAMS_H */
