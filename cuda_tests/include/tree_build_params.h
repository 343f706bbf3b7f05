/* tree_build_params.h -- the parameters of one tree_build call (kdtr_tree_build_params,
 * C++: kdtr::TreeBuildParams) and its CPU entries (cuda_tests/cpu/tree_build.cpp): what
 * the kernels, the CPU core, the binary and libkdtr_kernels.so share, laid out by the rule
 * of kdtr_abi.h from the spec kdtr/ops/tree_build.py.  Names as in docs/ops/tree_build.md;
 * row-major tensors, T = N + 1 slots; host or device pointers as the callee needs.
 */
#ifndef KDTR_TREE_BUILD_PARAMS_H
#define KDTR_TREE_BUILD_PARAMS_H

#include <stddef.h>
#include <stdint.h>

#include "kdtr_abi.h"

/* The forcible kernels, in spec order (kernel = index + 1; 0 = auto). */
#define KDTR_TREE_BUILD_KERNEL_NAMES "heap", "select"
enum { KDTR_TREE_BUILD_AUTO = 0, KDTR_TREE_BUILD_HEAP = 1, KDTR_TREE_BUILD_SELECT = 2 };

#define KDTR_TREE_BUILD_PARAMS_FIELDS(X)                                                    \
  X(const float*, top_log_probs)    /* f32 [B,D,K] */                                       \
  X(const int64_t*, top_token_ids)  /* i64 [B,D,K] */                                       \
  X(const int64_t*, root_token_ids) /* i64 [B] */                                           \
  X(const int32_t*, budget)         /* i32 [B] */                                           \
  X(const int32_t*, depth_limit)    /* i32 [B] */                                           \
  X(int32_t*, node_count)           /* i32 [B] */                                           \
  X(int64_t*, node_token_ids)       /* i64 [B,T] */                                         \
  X(int32_t*, node_depths)          /* i32 [B,T] */                                         \
  X(int32_t*, parents)              /* i32 [B,T] */                                         \
  X(int32_t*, next_token)           /* i32 [B,T] */                                         \
  X(int32_t*, next_sibling)         /* i32 [B,T] */                                         \
  X(uint8_t*, visibility)           /* u8 [B,T,T] */                                        \
  X(int32_t*, status)               /* i32 [B] */                                           \
  X(uint8_t*, heap_fallback)        /* optional u8 [B]: 1 where the select build gave up */ \
  X(int64_t, B)                                                                             \
  X(int64_t, D)                                                                             \
  X(int64_t, K)                                                                             \
  X(int64_t, N)              /* max_budget */                                               \
  X(int32_t, kernel)         /* KDTR_TREE_BUILD_AUTO (0), _HEAP (1) or _SELECT (2) */       \
  X(const char*, kernel_ran) /* out (libkdtr_kernels.so): "heap", "select", "cpu_heap", "cpu_select" */

typedef struct kdtr_tree_build_params {
  KDTR_TREE_BUILD_PARAMS_FIELDS(KDTR_ABI_DECLARE)
} kdtr_tree_build_params;

#ifdef __cplusplus
namespace kdtr {

using TreeBuildParams = ::kdtr_tree_build_params;

// Build kernels: the heap build only, or the select build (falling back per request).
enum TreeBuildKernel : int32_t {
  TREE_BUILD_KERNEL_AUTO = KDTR_TREE_BUILD_AUTO,      // CUDA: select where its shared memory fits, else heap; CPU: heap
  TREE_BUILD_KERNEL_HEAP = KDTR_TREE_BUILD_HEAP,      // tree_build_grow for every request
  TREE_BUILD_KERNEL_SELECT = KDTR_TREE_BUILD_SELECT,  // tree_select_grow, tree_build_grow where it gives up
};

namespace cpu {

// The CPU backend (tree_build_cpu of tree_build.cuh) on host pointers.
void tree_build(const TreeBuildParams& p);
// sizeof(TreeBuildCand): one candidate of the heap build's queue (the scratch limit).
size_t tree_build_candidate_bytes();
// Bytes of the select build's candidate set for maximum budget N and top-k width K, as
// the CPU backend allocates it (tree_select_set_bytes(tree_select_room(N, K))).
size_t tree_build_select_set_bytes(int64_t N, int64_t K);

}  // namespace cpu
}  // namespace kdtr
#endif

#endif /* KDTR_TREE_BUILD_PARAMS_H */
