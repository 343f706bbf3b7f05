// tree_accept_launch.h -- host launcher of the tree_accept CUDA kernel (tree_accept.cu).
//
// Include from CUDA-enabled host code only (it needs the CUDA runtime's types).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tree_accept_params.h"

namespace kdtr {

// Runs tree_accept on `stream` for p.B requests of p.T slots.  Every pointer of `p`
// (TreeAcceptParams, tree_accept.cuh) is a device pointer to a row-major tensor:
// node_token_ids i64 [B,T], next_token i32 [B,T], next_sibling i32 [B,T], node_count i32
// [B], target_predict i64 [B,T]; outputs accepted_count i32 [B], accepted_path i32 [B,T],
// proposed i64 [B,T], status i32 [B] (every element written).  One warp per request: lane
// 0 walks, all lanes write the padding.  Returns the launch error (cudaGetLastError());
// does not synchronize.  B == 0 launches nothing and returns cudaSuccess; B or T < 0
// returns cudaErrorInvalidValue.
cudaError_t launch_tree_accept(const TreeAcceptParams& p, cudaStream_t stream);

}  // namespace kdtr
