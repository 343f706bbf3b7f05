/* ddtree_decode_params.h -- the parameters of one ddtree_decode call (kdtr_ddtree_decode_params,
 * C++: kdtr::DdtreeDecodeParams) and its CPU entry (cuda_tests/cpu/ddtree_decode.cpp), laid
 * out by the rule of kdtr_abi.h from the spec kdtr/ops/ddtree_decode.py.  Names as in
 * docs/ops/ddtree_decode.md; row-major tensors; bf16 as its uint16_t bit pattern.
 */
#ifndef KDTR_DDTREE_DECODE_PARAMS_H
#define KDTR_DDTREE_DECODE_PARAMS_H

#include <stdint.h>

#include "kdtr_abi.h"

#define KDTR_DDTREE_DECODE_PARAMS_FIELDS(X)                \
  X(const uint16_t*, target_emb)    /* bf16 [V,E] */       \
  X(const uint16_t*, target_w_q)    /* bf16 [E,H,Dqk] */   \
  X(const uint16_t*, target_w_kv)   /* bf16 [E,Dqk] */     \
  X(const uint16_t*, target_w_o)    /* bf16 [H,Dv,E] */    \
  X(const uint16_t*, target_w_lm)   /* bf16 [E,V] */       \
  X(const uint16_t*, draft_emb)     /* bf16 [V,E] */       \
  X(const uint16_t*, draft_w_lm)    /* bf16 [E,V] */       \
  X(const uint16_t*, kv_cache)      /* bf16 [B,S,Dqk] */   \
  X(const int32_t*, prefix_len)     /* i32 [B] */          \
  X(const int64_t*, root_token_ids) /* i64 [B] */          \
  X(const int32_t*, budget)         /* i32 [B,R] */        \
  X(const int32_t*, depth_limit)    /* i32 [B,R] */        \
  X(int32_t*, node_count)           /* i32 [B,R] */        \
  X(float*, top_log_probs)          /* f32 [B,R,D,K] */    \
  X(int64_t*, top_token_ids)        /* i64 [B,R,D,K] */    \
  X(int32_t*, accepted_count)       /* i32 [B,R] */        \
  X(int32_t*, accepted_path)        /* i32 [B,R,T] */      \
  X(int64_t*, step_tokens)          /* i64 [B,R,T] */      \
  X(float*, attn_out)               /* f32 [B,R,T,H,Dv] */ \
  X(uint16_t*, final_kv_cache)      /* bf16 [B,S,Dqk] */   \
  X(int32_t*, cache_len)            /* i32 [B] */          \
  X(float, sm_scale)                                       \
  X(int64_t, B)                                            \
  X(int64_t, R)                                            \
  X(int64_t, V)                                            \
  X(int64_t, E)                                            \
  X(int64_t, H)                                            \
  X(int64_t, Dqk)                                          \
  X(int64_t, Dv)                                           \
  X(int64_t, S)                                            \
  X(int64_t, N)           /* max_budget: T = N + 1 */      \
  X(int64_t, draft_depth) /* D, the scalar input */        \
  X(int64_t, draft_top_k) /* K, the scalar input */

typedef struct kdtr_ddtree_decode_params {
  KDTR_DDTREE_DECODE_PARAMS_FIELDS(KDTR_ABI_DECLARE)
} kdtr_ddtree_decode_params;

#ifdef __cplusplus
#include <string>

namespace kdtr {

using DdtreeDecodeParams = ::kdtr_ddtree_decode_params;

namespace cpu {

// The CPU backend (ddtree_decode_cpu of ddtree_decode.cuh) on host pointers: "" when it
// ran, else why it stopped (a step that needs more cache rows than S, naming the request;
// the outputs are then incomplete).
std::string ddtree_decode(const DdtreeDecodeParams& p);

}  // namespace cpu
}  // namespace kdtr
#endif

#endif /* KDTR_DDTREE_DECODE_PARAMS_H */
