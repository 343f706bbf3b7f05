/* ddtree_decode_params.h -- the parameters of one ddtree_decode call (kdtr_ddtree_decode_params,
 * C++: kdtr::DdtreeDecodeParams) and its CPU entry (cuda_tests/cpu/ddtree_decode.cpp), laid
 * out by the rule of kdtr_abi.h from the spec kdtr/ops/ddtree_decode.py.  Names as in
 * docs/ops/ddtree_decode.md; row-major tensors; bf16 as its uint16_t bit pattern.
 */
#ifndef KDTR_DDTREE_DECODE_PARAMS_H
#define KDTR_DDTREE_DECODE_PARAMS_H

#include <stdint.h>

#include "kdtr_abi.h"

#define KDTR_DDTREE_DECODE_PARAMS_FIELDS(X)                          \
  X(const uint16_t*, target_emb)    /* bf16 [V,E] */                 \
  X(const uint16_t*, target_w_q)    /* bf16 [E,H,Dqk] */             \
  X(const uint16_t*, target_w_kv)   /* bf16 [E,Dqk] */               \
  X(const uint16_t*, target_w_o)    /* bf16 [H,Dv,E] */              \
  X(const uint16_t*, target_w_lm)   /* bf16 [E,V] */                 \
  X(const uint16_t*, draft_emb)     /* bf16 [V,E] */                 \
  X(const uint16_t*, draft_w_lm)    /* bf16 [E,V] */                 \
  X(const uint16_t*, kv_cache)      /* bf16 [B,S,Dqk] */             \
  X(const int32_t*, prefix_len)     /* i32 [B] */                    \
  X(const int64_t*, root_token_ids) /* i64 [B] */                    \
  X(const int32_t*, budget)         /* i32 [B,R] */                  \
  X(const int32_t*, depth_limit)    /* i32 [B,R] */                  \
  X(int32_t*, node_count)           /* i32 [B,R] */                  \
  X(float*, top_log_probs)          /* f32 [B,R,D,K] */              \
  X(int64_t*, top_token_ids)        /* i64 [B,R,D,K] */              \
  X(int32_t*, accepted_count)       /* i32 [B,R] */                  \
  X(int32_t*, accepted_path)        /* i32 [B,R,T] */                \
  X(int64_t*, step_tokens)          /* i64 [B,R,T] */                \
  X(float*, attn_out)               /* f32 [B,R,T,H,Dv] */           \
  X(uint16_t*, final_kv_cache)      /* bf16 [B,S,Dqk] */             \
  X(int32_t*, cache_len)            /* i32 [B] */                    \
  X(float, sm_scale)                                                 \
  X(int64_t, B)                                                      \
  X(int64_t, R)                                                      \
  X(int64_t, V)                                                      \
  X(int64_t, E)                                                      \
  X(int64_t, H)                                                      \
  X(int64_t, Dqk)                                                    \
  X(int64_t, Dv)                                                     \
  X(int64_t, S)                                                      \
  X(int64_t, N)              /* max_budget: T = N + 1 */             \
  X(int64_t, draft_depth)    /* D, the scalar input */               \
  X(int64_t, draft_top_k)    /* K, the scalar input */               \
  X(int32_t, kernel)         /* verify_attn's: KDTR_VERIFY_ATTN_* */ \
  X(const char*, kernel_ran) /* out: verify_attn's instance that ran */

typedef struct kdtr_ddtree_decode_params {
  KDTR_DDTREE_DECODE_PARAMS_FIELDS(KDTR_ABI_DECLARE)
} kdtr_ddtree_decode_params;

/* Why a decode stopped: the first step check that failed (kind KDTR_DDTREE_DECODE_OK: none).
 * The outputs are then incomplete.  Both backends fill one (the CUDA loop on the device). */
enum {
  KDTR_DDTREE_DECODE_OK = 0,
  KDTR_DDTREE_DECODE_TREE_BUILD_STATUS = 1, /* value: tree_build's status */
  KDTR_DDTREE_DECODE_CACHE_ROWS = 2,        /* value: the cache rows the step needs, > S */
  KDTR_DDTREE_DECODE_TREE_ACCEPT_STATUS = 3 /* value: tree_accept's status */
};
typedef struct kdtr_ddtree_decode_error {
  int32_t kind, request, step, value;
} kdtr_ddtree_decode_error;

#ifdef __cplusplus
#include <string>

namespace kdtr {

using DdtreeDecodeParams = ::kdtr_ddtree_decode_params;
using DdtreeDecodeError = ::kdtr_ddtree_decode_error;

// The message of a stopped decode ("" for KDTR_DDTREE_DECODE_OK), naming the request and
// the step; S: the cache rows.  Defined in cuda_tests/cpu/ddtree_decode.cpp.
std::string ddtree_decode_error_message(const DdtreeDecodeError& e, int64_t S);

namespace cpu {

// The CPU backend (ddtree_decode_cpu of ddtree_decode.cuh) on host pointers: "" when it
// ran, else why it stopped (a step that needs more cache rows than S, naming the request;
// the outputs are then incomplete).
std::string ddtree_decode(const DdtreeDecodeParams& p);

}  // namespace cpu
}  // namespace kdtr
#endif

#endif /* KDTR_DDTREE_DECODE_PARAMS_H */
