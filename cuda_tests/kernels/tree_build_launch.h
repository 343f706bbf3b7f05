// tree_build_launch.h -- host side of the tree_build CUDA kernel (tree_build.cu).
//
// Include from CUDA-enabled host code only (it needs the CUDA runtime's types).
//
// Use:
//   const size_t need = kdtr::tree_build_smem_bytes(N, D);
//   size_t have = 0;
//   check(kdtr::tree_build_smem_available(device, &have));
//   if (need > have) -> N too large for this device (not supported)
//   check(kdtr::tree_build_configure(need));          // once per device, before launching
//   check(kdtr::launch_tree_build(params, stream));   // as often as needed (TreeBuildParams)
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "tree_build.cuh"

namespace kdtr {

// Threads per block (one block per request).
constexpr int kTreeBuildThreads = 256;

// Dynamic shared memory one block needs for maximum budget N and draft depth D:
// the heap (N + 1 candidates of 24 bytes), five int32 slot arrays of T = N + 1 entries,
// and one ancestor buffer of min(D, N) + 1 int32 per warp.  44 * (N + 1) + 32 * (min(D, N)
// + 1) bytes with 256 threads; e.g. 45,644 bytes for N = 1024, D = 16.
size_t tree_build_smem_bytes(int64_t N, int64_t D);

// The most dynamic shared memory the kernel may use on `device`: the device's opt-in
// maximum per block (cudaDevAttrMaxSharedMemoryPerBlockOptin) less the kernel's static
// shared memory.  227 KiB - 16 B-ish on H100/H200, i.e. N up to about 5,200.
cudaError_t tree_build_smem_available(int device, size_t* bytes);

// Allow the kernel `smem_bytes` of dynamic shared memory on the current device
// (cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize); needed above 48 KiB).
// Call once per device before launch_tree_build; smem_bytes must not exceed
// tree_build_smem_available().
cudaError_t tree_build_configure(size_t smem_bytes);

// Runs tree_build on `stream` for p.B requests.  Every pointer of `p` (TreeBuildParams,
// tree_build.cuh) is a device pointer to a row-major tensor: top_log_probs f32 [B,D,K],
// top_token_ids i64 [B,D,K], root_token_ids i64 [B], budget i32 [B], depth_limit i32 [B];
// outputs node_count i32 [B], node_token_ids i64 [B,T], node_depths / parents /
// next_token / next_sibling i32 [B,T], visibility u8 [B,T,T], status i32 [B], T = N + 1
// (every element written).  One block of kTreeBuildThreads per request,
// tree_build_smem_bytes(N, D) bytes of dynamic shared memory (see tree_build_configure).
// Returns the launch error (cudaGetLastError()); does not synchronize.  B == 0 launches
// nothing and returns cudaSuccess; B, D, K or N < 0, N > 2^31 - 2 or B > 2^31 - 1 returns
// cudaErrorInvalidValue.
cudaError_t launch_tree_build(const TreeBuildParams& p, cudaStream_t stream);

}  // namespace kdtr
