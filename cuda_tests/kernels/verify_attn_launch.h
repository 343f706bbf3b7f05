// verify_attn_launch.h -- host API of the verify_attn CUDA kernels (verify_attn.cu).
//
// Include from CUDA-enabled host code only (it needs the CUDA runtime's types).
//
//   kdtr::VerifyAttnProblem p{...};                          // device pointers + dims
//   kdtr::VerifyAttnPlan plan;
//   verify_attn_plan(p, kdtr::VerifyAttnKernel::Auto, device, &plan);   // pick a kernel
//   verify_attn_configure(plan);                             // once: shared-memory limit
//   verify_attn_reserve(&plan);                              // the split-KV workspace
//   launch_verify_attn(p, plan, stream);                     // enqueue; no sync
// (verify_attn_choose does the three.)
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "verify_attn_params.h"  // VerifyAttnProblem (shared with the CPU backend)

namespace kdtr {

// Which kernel runs.
//   Simt: FFMA tiles in f32 for any dims and either input dtype (no TF32).
//   Mma:  bf16 tensor cores (mma.sync m16n8k16, f32 accumulation) for bf16 inputs with
//         Dqk % 8 == 0, Dqk <= 576 and d_v <= 512 (instances for Dqk <= 128 / d_v <= 128
//         and for the Kimi K2 dims Dqk = 576, d_v = 512).
//   Wgmma: the Hopper kernel (sm_90a: wgmma + TMA, verify_attn_sm90.cu) for bf16 inputs
//         with Dqk % 8 == 0, Dqk <= 576 and d_v <= 512, on a device of compute
//         capability 9.0, in a build that has it (CUDA_ARCH holds 90 and the CUTLASS
//         headers were found: kdtr::verify_attn_have_wgmma()).
//   Auto: Wgmma where it applies and Dqk > 256, else Mma where it applies, else Simt.
// Mma and Wgmma split a request's keys across blocks where its rows fill few blocks
// (split-KV: verify_attn_split in verify_attn.cuh, from the request's own lengths and H
// only, so a request's results do not depend on the batch) and merge the partial results
// with a second kernel on the same stream; they need the plan's workspace (below).
enum class VerifyAttnKernel : int { Auto = 0, Simt = 1, Mma = 2, Wgmma = 3 };

// Whether this build carries the Hopper kernel (VerifyAttnKernel::Wgmma).
bool verify_attn_have_wgmma();

// The chosen kernel instance (filled by verify_attn_plan).
struct VerifyAttnPlan {
  VerifyAttnKernel kernel = VerifyAttnKernel::Simt;  // Simt, Mma or Wgmma, never Auto
  int instance = 0;                                  // internal instance id
  size_t smem_bytes = 0;                             // dynamic shared memory per block
  const char* name = "";                             // e.g. "mma_bf16_dqk576_dv512"
  // The split-KV workspace: bytes the problem needs (verify_attn_plan; 0 for Simt and for
  // problems that never split, S <= 256), then the device buffer and its size once
  // reserved (verify_attn_reserve).
  size_t workspace_bytes = 0;
  void* workspace = nullptr;
  // Launch the split-KV combine kernel with programmatic dependent launch (compute
  // capability 9.0 and up; verify_attn_plan sets it from the device): its blocks start
  // while the attention kernel runs and wait for it with griddepcontrol.wait.
  bool pdl = false;
};

// Pick the kernel for `p` given the `requested` one on `device`.  Returns
// cudaErrorNotSupported when `requested` is Mma or Wgmma and the problem does not fit it
// (f32 inputs, dims, the device's opt-in shared memory; for Wgmma also a device other
// than compute capability 9.0 or a build without the kernel), cudaErrorInvalidValue for dims
// the kernels cannot index (negative, T*H or S over 2^30, d_v outside [1, Dqk]), or a
// device-query error.
cudaError_t verify_attn_plan(const VerifyAttnProblem& p, VerifyAttnKernel requested, int device, VerifyAttnPlan* plan);

// The kernel-choice policy, the one of the binaries and libkdtr_kernels.so: the kernel for
// p.kernel (KDTR_VERIFY_ATTN_AUTO, _SIMT, _MMA or _WGMMA) on `device`, planned
// (verify_attn_plan) and configured (verify_attn_configure).  Where the forced kernel (for
// auto: every kernel) does not apply it returns cudaErrorNotSupported and *why says what the
// kernel needs against what it got (e.g. "--kernel mma needs bf16 inputs with Dqk % 8 == 0,
// Dqk <= 576, d_v <= 512 and enough shared memory (got f32, Dqk 64, d_v 64)"); any other
// error is the CUDA runtime's.
cudaError_t verify_attn_choose(const VerifyAttnProblem& p, int device, VerifyAttnPlan* plan, std::string* why);

// Raise the plan's kernel's dynamic shared-memory limit on the current device (once per
// device and instance: later calls return at once; cached for the process's life, so a
// process that calls cudaDeviceReset must not launch again).
cudaError_t verify_attn_configure(const VerifyAttnPlan& plan);

// The plan's split-KV workspace on the current device: a per-device buffer of at least
// plan->workspace_bytes (cudaMalloc where the one held is smaller: never during stream
// capture, so call it once eagerly at the largest dims before capturing), shared by every
// launch on that device -- launches on one device must therefore be ordered (one stream,
// or events), since concurrent split launches would share it.  Buffers are never freed or
// moved: a graph captured with one stays valid.  Sets plan->workspace and ->workspace_bytes
// (the buffer's size); nothing to do where workspace_bytes is 0.  Returns cudaMalloc's
// error (cudaErrorMemoryAllocation; cudaErrorStreamCaptureUnsupported during capture).
cudaError_t verify_attn_reserve(VerifyAttnPlan* plan);

// ---------------------------------------------------------------------------------------
// The device-side length check (docs/binaries.md, "Device-side checks")
// ---------------------------------------------------------------------------------------
//
// Every verify_attn kernel checks its request's lengths on the device, before any load of
// that request: prefix_len >= 0, tree_len in [0, T] and the cache rows, under the launch's
// rule: VerifyAttn prefix_len + tree_len <= S (verify_attn_lengths_ok), GreedyStep (the
// chain's verify_attn stage) prefix_len + T <= S, the greedy_step op's own rule.  A request
// that fails has every element of its out and lse rows written quiet NaN, none of its q,
// kv_cache or visibility read, and is counted in the device error record of its device;
// the first one recorded since the last clear keeps its op, request, field and lengths
// (atomic: the first to claim the record wins; of several failing requests of one launch,
// any may be that one).
enum class VerifyAttnRule : int32_t { VerifyAttn = 1, GreedyStep = 2 };

// Which check failed (DeviceErrorRecord::field).
enum DeviceErrorField : int32_t {
  kDeviceErrorPrefixLen = 1,  // prefix_len < 0
  kDeviceErrorTreeLen = 2,    // tree_len outside [0, T]
  kDeviceErrorCacheRows = 3,  // prefix_len + tree_len (GreedyStep: + T) > S
};

// The device error record (one per device, in the verify_attn kernels' module; zero at
// load).  Written by the kernels, read by device_errors.
struct DeviceErrorRecord {
  unsigned long long count;                     // failing requests since the last clear
  int32_t op;                                   // the first's VerifyAttnRule
  int32_t field;                                // the first's DeviceErrorField
  int64_t request, prefix_len, tree_len, T, S;  // the first's request index and lengths
};

// Copies `device`'s record to *out (device < 0: the current device), first synchronizing
// that device (cudaDeviceSynchronize: the one call here that does); clear zeroes it after
// the copy (and synchronizes again).  The caller's current device is restored.  Returns
// the first CUDA error (an earlier kernel's fault included).  Never call it while a stream
// capture is under way.
cudaError_t device_errors(int device, bool clear, DeviceErrorRecord* out);

// Enqueue the plan's kernel on `stream` (one launch, two for a split kernel whose problem
// may split: the attention and the combine; B == 0 launches nothing; T * H == 0 launches
// only the length check, one thread per request).  cudaErrorInvalidValue where the plan's
// workspace is missing or smaller than p needs.  `rule`: the length check's
// (above).  Returns the launch error (cudaGetLastError()); does not synchronize, allocate
// or copy, and is legal during stream capture.
cudaError_t launch_verify_attn(const VerifyAttnProblem& p, const VerifyAttnPlan& plan, cudaStream_t stream,
                               VerifyAttnRule rule = VerifyAttnRule::VerifyAttn);

}  // namespace kdtr
