/* tree_accept_params.h -- the parameters of one tree_accept call (kdtr_tree_accept_params,
 * C++: kdtr::TreeAcceptParams) and its CPU entry (cuda_tests/cpu/tree_accept.cpp), laid
 * out by the rule of kdtr_abi.h from the spec kdtr/ops/tree_accept.py.  Names as in
 * docs/ops/tree_accept.md; row-major tensors; host or device pointers as the callee needs.
 */
#ifndef KDTR_TREE_ACCEPT_PARAMS_H
#define KDTR_TREE_ACCEPT_PARAMS_H

#include <stdint.h>

#include "kdtr_abi.h"

#define KDTR_TREE_ACCEPT_PARAMS_FIELDS(X)           \
  X(const int64_t*, node_token_ids) /* i64 [B,T] */ \
  X(const int32_t*, next_token)     /* i32 [B,T] */ \
  X(const int32_t*, next_sibling)   /* i32 [B,T] */ \
  X(const int32_t*, node_count)     /* i32 [B] */   \
  X(const int64_t*, target_predict) /* i64 [B,T] */ \
  X(int32_t*, accepted_count)       /* i32 [B] */   \
  X(int32_t*, accepted_path)        /* i32 [B,T] */ \
  X(int64_t*, proposed)             /* i64 [B,T] */ \
  X(int32_t*, status)               /* i32 [B] */   \
  X(int64_t, B)                                     \
  X(int64_t, T)

typedef struct kdtr_tree_accept_params {
  KDTR_TREE_ACCEPT_PARAMS_FIELDS(KDTR_ABI_DECLARE)
} kdtr_tree_accept_params;

#ifdef __cplusplus
namespace kdtr {

using TreeAcceptParams = ::kdtr_tree_accept_params;

namespace cpu {

// The CPU backend (tree_accept_cpu of tree_accept.cuh) on host pointers.
void tree_accept(const TreeAcceptParams& p);

}  // namespace cpu
}  // namespace kdtr
#endif

#endif /* KDTR_TREE_ACCEPT_PARAMS_H */
