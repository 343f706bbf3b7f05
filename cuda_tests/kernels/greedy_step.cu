// greedy_step.cu -- the glue kernel of the greedy_step chain (compiled by nvcc only).
//
// Contract: docs/ops/greedy_step.md.  tree_build (tree_build.cu), verify_attn
// (verify_attn.cu) and tree_accept (tree_accept.cu) are launched by the binary as they
// are; the only work between them is verify_attn's tree_len = node_count + 1, computed
// here on the device from tree_build's node_count buffer, so the chain never needs the
// host.  One thread per request (kdtr::greedy_step_tree_len, shared with the CPU backend).

#include <cstdint>

#include "greedy_step.cuh"
#include "greedy_step_launch.h"

namespace kdtr {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    greedy_step_tree_len_kernel(const __grid_constant__ GreedyStepTreeLenParams prm) {
  const int32_t* __restrict__ node_count = prm.node_count;
  int32_t* __restrict__ tree_len = prm.tree_len;
  const int64_t B = prm.B, T = prm.T;
  const int64_t b = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (b < B) tree_len[b] = greedy_step_tree_len(node_count[b], T);
}

}  // namespace

cudaError_t launch_greedy_step_tree_len(const GreedyStepTreeLenParams& p, cudaStream_t stream) {
  const int64_t B = p.B, T = p.T;
  if (B < 0 || T < 1 || T > 0x7fffffffLL) return cudaErrorInvalidValue;
  if (B == 0) return cudaSuccess;
  const int64_t blocks = (B + kThreads - 1) / kThreads;
  if (blocks > 0x7fffffffLL) return cudaErrorInvalidValue;
  greedy_step_tree_len_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kdtr
