// tree_build_params.h -- the parameters of one tree_build call (TreeBuildParams) and its
// CPU entries (cuda_tests/cpu/tree_build.cpp): what the binary main, the CUDA launcher
// (tree_build_launch.h) and libkdtr_kernels.so share, without the op's core
// (kernels/tree_build.cuh).
#pragma once

#include <cstddef>
#include <cstdint>

namespace kdtr {

// One tree_build call (the CPU backend's tree_build_cpu and the CUDA launcher
// launch_tree_build take the same struct; host or device pointers accordingly).  Names
// as in docs/ops/tree_build.md; row-major tensors, T = N + 1 slots.
struct TreeBuildParams {
  const float* top_log_probs = nullptr;     // f32 [B,D,K]
  const int64_t* top_token_ids = nullptr;   // i64 [B,D,K]
  const int64_t* root_token_ids = nullptr;  // i64 [B]
  const int32_t* budget = nullptr;          // i32 [B]
  const int32_t* depth_limit = nullptr;     // i32 [B]
  int32_t* node_count = nullptr;            // i32 [B]
  int64_t* node_token_ids = nullptr;        // i64 [B,T]
  int32_t* node_depths = nullptr;           // i32 [B,T]
  int32_t* parents = nullptr;               // i32 [B,T]
  int32_t* next_token = nullptr;            // i32 [B,T]
  int32_t* next_sibling = nullptr;          // i32 [B,T]
  uint8_t* visibility = nullptr;            // u8 [B,T,T]
  int32_t* status = nullptr;                // i32 [B]
  int64_t B = 0, D = 0, K = 0, N = 0;       // N: max_budget
  int32_t kernel = 0;                       // TreeBuildKernel: AUTO (0), HEAP (1) or SELECT (2)
  uint8_t* heap_fallback = nullptr;         // optional u8 [B]: 1 where the select build gave up
};

// Build kernels: the heap build only, or the select build (falling back per request).
enum TreeBuildKernel : int32_t {
  TREE_BUILD_KERNEL_AUTO = 0,    // CUDA: select where its shared memory fits, else heap; CPU: heap
  TREE_BUILD_KERNEL_HEAP = 1,    // tree_build_grow for every request
  TREE_BUILD_KERNEL_SELECT = 2,  // tree_select_grow, tree_build_grow where it gives up
};

namespace cpu {

// The CPU backend (tree_build_cpu of tree_build.cuh) on host pointers.
void tree_build(const TreeBuildParams& p);
// sizeof(TreeBuildCand): one candidate of the heap build's queue (the scratch limit).
size_t tree_build_candidate_bytes();
// Bytes of the select build's candidate set for maximum budget N
// (tree_select_set_bytes(tree_select_capacity(N))).
size_t tree_build_select_set_bytes(int64_t N);

}  // namespace cpu
}  // namespace kdtr
