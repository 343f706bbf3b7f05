// tree_build_launch.h -- host side of the tree_build CUDA kernel (tree_build.cu).
//
// Include from CUDA-enabled host code only (it needs the CUDA runtime's types).
//
// Use:
//   const size_t need = kdtr::tree_build_smem_bytes(N, D, kernel);   // kernel HEAP or SELECT
//   size_t have = 0;
//   check(kdtr::tree_build_smem_available(device, kernel, &have));
//   if (need > have) -> N too large for this kernel on this device (select: try HEAP)
//   check(kdtr::tree_build_configure(kernel, need));  // once per device, before launching
//   params.kernel = kernel;
//   check(kdtr::launch_tree_build(params, stream));   // as often as needed (TreeBuildParams)
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "tree_build_params.h"

namespace kdtr {

// Threads per block of the heap kernel (one block per request; the select kernel runs 1024).
constexpr int kTreeBuildThreads = 256;

// Dynamic shared memory one build block needs for maximum budget N and draft depth D with
// `kernel` (TREE_BUILD_KERNEL_HEAP or TREE_BUILD_KERNEL_SELECT): the heap build's queue and
// slot arrays, 44 * (N + 1) bytes (45,100 for N = 1024), and for the select kernel the
// larger of that and its candidate set (tree_select_set_bytes(tree_select_capacity(N))).
// That is the need; tree_build_choose configures the limit for the select kernel's roomier
// set (tree_select_room, N <= 256) where the device has the bytes, and launch_tree_build uses it
// where the configured limit allows it and the batch fits one wave (faster, same outputs).
size_t tree_build_smem_bytes(int64_t N, int64_t D, int64_t K, int32_t kernel);

// The most dynamic shared memory `kernel`'s build kernel may use on `device`: the device's
// opt-in maximum per block (cudaDevAttrMaxSharedMemoryPerBlockOptin) less the kernel's
// static shared memory.  About 227 KiB on H100/H200.  Asked once per device (ordinals
// 0-63) and cached for the process's life.
cudaError_t tree_build_smem_available(int device, int32_t kernel, size_t* bytes);

// Allow `kernel`'s build kernel `smem_bytes` of dynamic shared memory on the current
// device (cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize); needed above
// 48 KiB).  Call once per device before launch_tree_build; smem_bytes must not exceed
// tree_build_smem_available().  The limit set is cached per device and only raised: a
// call at or below it returns at once (a process that calls cudaDeviceReset must not
// launch again).
cudaError_t tree_build_configure(int32_t kernel, size_t smem_bytes);

// The kernel-choice policy, the one of the binaries and libkdtr_kernels.so: the build
// kernel for p.kernel on `device` (TREE_BUILD_KERNEL_AUTO: the select kernel where its
// shared memory for p.N and p.D fits, else the heap kernel; HEAP or SELECT as forced),
// configured (tree_build_configure), in *kernel.  Where the chosen kernel needs more
// shared memory than the device allows it returns cudaErrorNotSupported and *why says so
// ("N = 100000, D = 8: the heap kernel needs 4400044 bytes of shared memory per block,
// device 0 allows 232448"); any other error is the CUDA runtime's.
cudaError_t tree_build_choose(const TreeBuildParams& p, int device, int32_t* kernel, std::string* why);

// Runs tree_build on `stream` for p.B requests with p.kernel (TREE_BUILD_KERNEL_HEAP or
// TREE_BUILD_KERNEL_SELECT; resolve AUTO first, e.g. ops::configure_tree_build).  Every
// pointer of `p` (TreeBuildParams, tree_build.cuh) is a device pointer to a row-major
// tensor: top_log_probs f32 [B,D,K], top_token_ids i64 [B,D,K], root_token_ids i64 [B],
// budget i32 [B], depth_limit i32 [B]; outputs node_count i32 [B], node_token_ids i64
// [B,T], node_depths / parents / next_token / next_sibling i32 [B,T], visibility u8
// [B,T,T], status i32 [B], T = N + 1 (every element written).  Two launches: the build
// kernel (one block per request, tree_build_smem_bytes(N, D, p.kernel) bytes of dynamic
// shared memory, see tree_build_configure), then, for T > 128, the visibility kernel (32 rows
// per warp, the whole GPU; for T <= 128 the build block writes the visibility itself).  Returns the first launch error
// (cudaGetLastError()); does not synchronize.  B == 0 launches nothing and returns cudaSuccess; B, D, K or N < 0, N >
// 2^31 - 2, B > 2^31 - 1, B * ceil((N + 1) / 128) > 2^31 - 1 or another kernel value returns cudaErrorInvalidValue.
cudaError_t launch_tree_build(const TreeBuildParams& p, cudaStream_t stream);

}  // namespace kdtr
