// verify_attn_sm90.h -- the Hopper (sm_90a: wgmma + TMA) verify_attn kernel's host API,
// internal to verify_attn.cu's dispatcher (the public API is verify_attn_launch.h).
//
// Compiled (verify_attn_sm90.cu, -gencode arch=compute_90a,code=sm_90a, CUTLASS/CuTe
// headers) only when the build's CUDA_ARCH list holds 90 and the pinned CUTLASS headers
// were found; the Makefile then defines KDTR_HAVE_WGMMA=1 for verify_attn.cu too.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "verify_attn_params.h"  // VerifyAttnProblem

namespace kdtr {
struct VerifyAttnCheck;  // verify_attn_device.cuh
namespace va_device {
struct SplitArgs;  // verify_attn_device.cuh
}
}  // namespace kdtr

namespace kdtr {
namespace sm90 {

// Whether the wgmma kernel computes `p` (bf16 inputs, Dqk % 8 == 0, Dqk <= 576,
// d_v <= 512); the device check (compute capability 9.0) is the caller's.
bool wgmma_fits(const VerifyAttnProblem& p);

// Dynamic shared memory per block of the kernel (bytes) and its name.
size_t wgmma_smem_bytes();
const char* wgmma_name();

// Raise the kernel's dynamic shared-memory limit (once per device before launching).
cudaError_t wgmma_configure();

// Enqueue the kernel for `p` (device pointers; each request's lengths checked on the
// device under chk, verify_attn_launch.h) on `stream`: `grid` blocks, B * sa.items_per_req,
// each with its split-KV work under sa (verify_attn_device.cuh); the combine kernel that
// merges split results is the caller's.
cudaError_t launch_wgmma(const VerifyAttnProblem& p, const va_device::SplitArgs& sa, unsigned grid,
                         const VerifyAttnCheck& chk, cudaStream_t stream);

}  // namespace sm90
}  // namespace kdtr
