// tree_accept_params.h -- the parameters of one tree_accept call (TreeAcceptParams) and
// its CPU entry (cuda_tests/cpu/tree_accept.cpp), without the op's core
// (kernels/tree_accept.cuh).
#pragma once

#include <cstdint>

namespace kdtr {

// One tree_accept call (the CPU backend's tree_accept_cpu and the CUDA launcher
// launch_tree_accept take the same struct; host or device pointers accordingly).  Names
// as in docs/ops/tree_accept.md; row-major tensors.
struct TreeAcceptParams {
  const int64_t* node_token_ids = nullptr;  // i64 [B,T]
  const int32_t* next_token = nullptr;      // i32 [B,T]
  const int32_t* next_sibling = nullptr;    // i32 [B,T]
  const int32_t* node_count = nullptr;      // i32 [B]
  const int64_t* target_predict = nullptr;  // i64 [B,T]
  int32_t* accepted_count = nullptr;        // i32 [B]
  int32_t* accepted_path = nullptr;         // i32 [B,T]
  int64_t* proposed = nullptr;              // i64 [B,T]
  int32_t* status = nullptr;                // i32 [B]
  int64_t B = 0, T = 0;
};

namespace cpu {

// The CPU backend (tree_accept_cpu of tree_accept.cuh) on host pointers.
void tree_accept(const TreeAcceptParams& p);

}  // namespace cpu
}  // namespace kdtr
