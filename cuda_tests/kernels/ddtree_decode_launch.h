// ddtree_decode_launch.h -- host side of ddtree_decode's CUDA decode loop (ddtree_decode.cu).
//
// Include from CUDA-enabled host code only (it needs the CUDA runtime's types).
//
// Use (every pointer of DdtreeDecodeParams a device pointer, ddtree_decode_params.h):
//   const size_t bytes = kdtr::ddtree_decode_workspace_bytes(p);
//   void* ws = ...;                                   // bytes of device memory, 256-aligned
//   kdtr::DdtreeDecodeStages st = kdtr::ddtree_decode_stages(p, ws);
//   st.build.kernel = <tree_build kernel chosen for st.build>;      // tree_build_choose
//   VerifyAttnPlan plan = <verify_attn plan for st.attn>;           // verify_attn_choose
//   check(kdtr::launch_ddtree_decode(p, st, plan, stream));         // R steps, no sync
//   ... synchronize; kdtr::ddtree_decode_read_error(ws, &err) ...   // a step that stopped
//
// The loop is 8 launches per step on one stream and none of them waits on the host, so it
// may be captured in a CUDA graph: the drafter's top-K per depth, tree_build, the q / latent
// KV projection of the tree slots (with the step's checks), verify_attn over the committed
// rows and the tree, the target's prediction per slot, tree_accept and the KV commit; one
// launch before the first step (the working cache, lengths and roots from the inputs, the
// error record cleared) and one after the last (final_kv_cache, cache_len).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "ddtree_decode_params.h"
#include "tree_accept_params.h"
#include "tree_build_params.h"
#include "verify_attn_launch.h"

namespace kdtr {

// The three ops of one step, wired to the workspace: tree_build on the drafts, verify_attn
// on the working cache (prefix_len = the committed rows, tree_len = node_count + 1),
// tree_accept on the tree and the target's predictions.
struct DdtreeDecodeStages {
  void* workspace;  // the loop's own arrays are there too
  TreeBuildParams build;
  VerifyAttnProblem attn;
  TreeAcceptParams accept;
};

// Bytes of device workspace the loop needs for p's dims (every scratch array rounded up to
// 256 bytes): the step's drafts, tree, q, latent KV rows, attention output, predictions,
// accept results, the working cache [B,S,Dqk], per-request float64 scratch of V and of
// T * E values, and the error record.
size_t ddtree_decode_workspace_bytes(const DdtreeDecodeParams& p);

// The three ops' parameters wired to `workspace` (ddtree_decode_workspace_bytes(p) bytes of
// device memory); build.kernel and attn.kernel are left AUTO for the caller to choose.  A
// null workspace gives null pointers and the dims alone (enough to choose the kernels).
DdtreeDecodeStages ddtree_decode_stages(const DdtreeDecodeParams& p, void* workspace);

// Enqueue the whole decode (p.R steps) on `stream`; st from ddtree_decode_stages on the
// same workspace, st.build.kernel resolved (HEAP or SELECT) and `plan` planned and
// reserved for st.attn.  Returns the first launch error; does not synchronize, allocate or
// copy, and is legal during stream capture.  cudaErrorInvalidValue for negative dims,
// B * T or B over 2^31 - 1; B == 0 launches nothing.
cudaError_t launch_ddtree_decode(const DdtreeDecodeParams& p, const DdtreeDecodeStages& st, const VerifyAttnPlan& plan,
                                 cudaStream_t stream);

// The error record (ddtree_decode_params.h) of the last decode run on `workspace`, copied
// to *out after a cudaStreamSynchronize of `stream`; ddtree_decode_error_message gives its
// text.
cudaError_t ddtree_decode_read_error(const DdtreeDecodeParams& p, const void* workspace, cudaStream_t stream,
                                     DdtreeDecodeError* out);

}  // namespace kdtr
