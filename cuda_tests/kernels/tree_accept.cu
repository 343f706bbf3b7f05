// tree_accept.cu -- CUDA kernel and host launcher for tree_accept (compiled by nvcc only).
//
// Contract: docs/ops/tree_accept.md.  The per-request checks and walk are the KDTR_HD
// functions of tree_accept.cuh, shared with the CPU backend (which runs them in sequence
// through kdtr::tree_accept_walk).  One warp per request, in the contract's order:
//   1. every lane evaluates tree_accept_node_count_ok on the same node_count[b]
//      (warp-uniform, so the warp never diverges around the vote below);
//   2. the NEGATIVE_TOKEN scan of the live slots 0..node_count, striped over the 32 lanes
//      (coalesced loads of both i64 rows), combined with __any_sync;
//   3. the walk (tree_accept_walk_links), a chain of dependent loads, by lane 0 alone,
//      only for a request that passed 1 and 2;
//   4. all 32 lanes stripe the -1 padding of the two [T] output rows, which is the bulk of
//      the stores for large T.

#include <cstdint>

#include "tree_accept.cuh"
#include "tree_accept_launch.h"

namespace kdtr {
namespace {

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 4;

__global__ void __launch_bounds__(kWarp* kWarpsPerBlock)
    tree_accept_kernel(const __grid_constant__ TreeAcceptParams prm) {
  const int64_t* __restrict__ node_token_ids = prm.node_token_ids;
  const int32_t* __restrict__ next_token = prm.next_token;
  const int32_t* __restrict__ next_sibling = prm.next_sibling;
  const int32_t* __restrict__ node_count = prm.node_count;
  const int64_t* __restrict__ target_predict = prm.target_predict;
  const int64_t B = prm.B, T = prm.T;
  int32_t* __restrict__ accepted_count = prm.accepted_count;
  int32_t* __restrict__ accepted_path = prm.accepted_path;
  int64_t* __restrict__ proposed = prm.proposed;
  int32_t* __restrict__ status = prm.status;
  const int64_t b = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  if (b >= B) return;  // whole warps leave together: B is compared per warp
  const int64_t row = b * T;

  const int32_t n = node_count[b];  // the same value in every lane
  TreeAcceptResult r{0, TREE_ACCEPT_OK};
  if (!tree_accept_node_count_ok(n, T)) {
    r.status = TREE_ACCEPT_BAD_NODE_COUNT;
  } else {
    // warp-uniform branch: all 32 lanes vote
    const bool negative = tree_accept_negative_in_stripe(node_token_ids + row, target_predict + row, n, lane, kWarp);
    if (__any_sync(0xffffffffu, negative)) r.status = TREE_ACCEPT_NEGATIVE_TOKEN;
  }
  if (lane == 0 && r.status == TREE_ACCEPT_OK)
    r = tree_accept_walk_links(node_token_ids + row, next_token + row, next_sibling + row, n, target_predict + row,
                               accepted_path + row, proposed + row);
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

cudaError_t launch_tree_accept(const TreeAcceptParams& p, cudaStream_t stream) {
  const int64_t B = p.B, T = p.T;
  if (B < 0 || T < 0) return cudaErrorInvalidValue;
  if (B == 0) return cudaSuccess;
  const int64_t blocks = (B + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (blocks > 0x7fffffffLL) return cudaErrorInvalidValue;
  tree_accept_kernel<<<static_cast<unsigned>(blocks), kWarp * kWarpsPerBlock, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kdtr
