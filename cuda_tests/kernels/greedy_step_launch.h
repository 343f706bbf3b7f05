// greedy_step_launch.h -- host launcher of the greedy_step glue kernel (greedy_step.cu).
//
// Include from CUDA-enabled host code only (it needs the CUDA runtime's types).
//
// The chain (docs/ops/greedy_step.md), all on one stream, no host work in between:
//   launch_tree_build(build /* TreeBuildParams: ..., node_count, ..., visibility */, stream);
//   launch_greedy_step_tree_len(glue /* node_count -> tree_len */, stream);
//   launch_verify_attn(attn /* VerifyAttnProblem: tree_len, visibility */, plan, stream);
//   launch_tree_accept(accept /* node_token_ids, next_token, next_sibling, node_count */, stream);
// (kdtr::ops::greedy_step_params in cuda_tests/include/kdtr_ops.hpp wires the four structs.)
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "greedy_step_params.h"

namespace kdtr {

// tree_len[b] = greedy_step_tree_len(node_count[b], T) (node_count + 1, clamped to
// [1, T]) for b < B, on `stream`.  p.node_count and p.tree_len are device pointers to i32
// [B] (GreedyStepTreeLenParams, greedy_step.cuh).  Returns the launch error
// (cudaGetLastError()); does not synchronize.  B == 0 launches nothing and returns
// cudaSuccess; B < 0, T < 1 or T > 2^31 - 1 returns cudaErrorInvalidValue.
cudaError_t launch_greedy_step_tree_len(const GreedyStepTreeLenParams& p, cudaStream_t stream);

}  // namespace kdtr
