// tree_accept.cu -- CUDA kernel and host launcher for tree_accept (compiled by nvcc only).
//
// Contract: docs/ops/tree_accept.md.  The per-request walk is kdtr::tree_accept_walk from
// tree_accept.cuh, shared with the CPU backend.  One warp per request: the walk is a
// chain of dependent loads, so lane 0 runs it alone; then all 32 lanes stripe the -1
// padding of the two [T] output rows, which is the bulk of the stores for large T.

#include <cstdint>

#include "tree_accept.cuh"
#include "tree_accept_launch.h"

namespace kdtr {
namespace {

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 4;

__global__ void __launch_bounds__(kWarp * kWarpsPerBlock)
    tree_accept_kernel(const int64_t* __restrict__ node_token_ids, const int32_t* __restrict__ next_token,
                       const int32_t* __restrict__ next_sibling, const int32_t* __restrict__ node_count,
                       const int64_t* __restrict__ target_predict, int64_t B, int64_t T,
                       int32_t* __restrict__ accepted_count, int32_t* __restrict__ accepted_path,
                       int64_t* __restrict__ proposed, int32_t* __restrict__ status) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  if (b >= B) return;  // whole warps leave together: B is compared per warp
  const int64_t row = b * T;

  TreeAcceptResult r{0, 0};
  if (lane == 0)
    r = tree_accept_walk(node_token_ids + row, next_token + row, next_sibling + row, node_count[b],
                         target_predict + row, T, accepted_path + row, proposed + row);
  r.accepted_count = __shfl_sync(0xffffffffu, r.accepted_count, 0);
  r.status = __shfl_sync(0xffffffffu, r.status, 0);
  __syncwarp();  // orders lane 0's walk stores before the other lanes' overwrites (malformed rows)

  tree_accept_fill(r, T, lane, kWarp, accepted_path + row, proposed + row);
  if (lane == 0) {
    accepted_count[b] = r.accepted_count;
    status[b] = r.status;
  }
}

}  // namespace

cudaError_t launch_tree_accept(const int64_t* node_token_ids, const int32_t* next_token,
                               const int32_t* next_sibling, const int32_t* node_count,
                               const int64_t* target_predict, int64_t B, int64_t T, int32_t* accepted_count,
                               int32_t* accepted_path, int64_t* proposed, int32_t* status,
                               cudaStream_t stream) {
  if (B < 0 || T < 0) return cudaErrorInvalidValue;
  if (B == 0) return cudaSuccess;
  const int64_t blocks = (B + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (blocks > 0x7fffffffLL) return cudaErrorInvalidValue;
  tree_accept_kernel<<<static_cast<unsigned>(blocks), kWarp * kWarpsPerBlock, 0, stream>>>(
      node_token_ids, next_token, next_sibling, node_count, target_predict, B, T, accepted_count, accepted_path,
      proposed, status);
  return cudaGetLastError();
}

}  // namespace kdtr
