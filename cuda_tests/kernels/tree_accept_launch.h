// tree_accept_launch.h -- host launcher of the tree_accept CUDA kernel (tree_accept.cu).
//
// Include from CUDA-enabled host code only (it needs the CUDA runtime's types).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kdtr {

// Runs tree_accept on `stream` for B requests of T slots.  All pointers are device
// pointers to row-major tensors: node_token_ids i64 [B,T], next_token i32 [B,T],
// next_sibling i32 [B,T], node_count i32 [B], target_predict i64 [B,T]; outputs
// accepted_count i32 [B], accepted_path i32 [B,T], proposed i64 [B,T], status i32 [B]
// (every element written).  One warp per request: lane 0 walks, all lanes write the
// padding.  Returns the launch error (cudaGetLastError()); does not synchronize.
// B == 0 launches nothing and returns cudaSuccess; B or T < 0 returns cudaErrorInvalidValue.
cudaError_t launch_tree_accept(const int64_t* node_token_ids, const int32_t* next_token,
                               const int32_t* next_sibling, const int32_t* node_count,
                               const int64_t* target_predict, int64_t B, int64_t T, int32_t* accepted_count,
                               int32_t* accepted_path, int64_t* proposed, int32_t* status,
                               cudaStream_t stream);

}  // namespace kdtr
