// tree_build.cu -- CUDA kernel and host launcher for tree_build (compiled by nvcc only).
//
// Contract: docs/ops/tree_build.md.  The per-request pieces (validation, the best-first
// builder, the node rows) are kdtr::tree_build_* from tree_build.cuh, shared with the CPU
// backend.  One block of 256 threads per request, in four phases separated by barriers:
//
//   1. all threads: empty slot arrays in shared memory; statuses 3-6 over the checked
//      rows' elements, striped, reduced with atomicMin to the first failing status
//   2. thread 0: the best-first loop, the heap and the slot arrays in shared memory
//      (a chain of dependent compares: one thread is the fastest way to run it)
//   3. all threads: the five [T] node rows, striped (coalesced)
//   4. each warp, one visibility row at a time: lane 0 collects the row's ancestors in the
//      warp's shared buffer, then the 32 lanes write the row as aligned 16-byte chunks
//      (bytes only at the row's two unaligned ends), so the [T,T] block -- the bulk of the
//      output, 64 MiB for B = 64, N = 1024 -- streams out at full width.
//
// Shared memory: the heap (N + 1 candidates, 24 B each), five int32 [T] slot arrays and
// one ancestor buffer per warp; tree_build_smem_bytes() gives the size, which limits N
// (about 5,200 with the 227 KiB a block may opt into on H100/H200).

#include <cstddef>
#include <cstdint>

#include "tree_build.cuh"
#include "tree_build_launch.h"

namespace kdtr {
namespace {

constexpr int kWarp = 32;
constexpr int kWarps = kTreeBuildThreads / kWarp;
static_assert(kTreeBuildThreads % kWarp == 0, "whole warps");
static_assert(sizeof(TreeBuildCand) == 24, "heap entry layout");

struct SmemLayout {
  size_t heap, slots, anc, total;  // byte offsets of the three regions, and the size
  int64_t anc_len;                 // int32 entries per warp's ancestor buffer
};

__host__ __device__ inline SmemLayout smem_layout(int64_t N, int64_t D) {
  SmemLayout l;
  const int64_t T = N + 1;
  l.anc_len = (D < N ? D : N) + 1;  // a path holds at most min(depth_limit, budget) + 1 slots
  l.heap = 0;
  l.slots = l.heap + sizeof(TreeBuildCand) * static_cast<size_t>(N + 1);
  l.anc = l.slots + sizeof(int32_t) * 5 * static_cast<size_t>(T);
  l.total = l.anc + sizeof(int32_t) * static_cast<size_t>(kWarps) * static_cast<size_t>(l.anc_len);
  return l;
}

// Row i of one request's [T,T] visibility block, by the 32 lanes of a warp: byte j is 1
// iff j is one of anc[0..len).  The row's 16-byte-aligned chunks are stored whole
// (uint4); the chunks at its two ends, shared with the neighbouring rows, byte by byte.
__device__ inline void write_visibility_row(uint8_t* row, int64_t T, const int32_t* anc, int32_t len, int lane) {
  const uintptr_t p0 = reinterpret_cast<uintptr_t>(row);
  const uintptr_t a0 = p0 & ~static_cast<uintptr_t>(15);
  const int64_t head = static_cast<int64_t>(p0 - a0);  // row bytes before p0 in the first chunk
  const int64_t chunks = (head + T + 15) / 16;
  for (int64_t c = lane; c < chunks; c += kWarp) {
    const int64_t lo = 16 * c - head;  // column of the chunk's first byte (may be < 0)
    uint32_t w0 = 0, w1 = 0, w2 = 0, w3 = 0;
    for (int32_t k = 0; k < len; ++k) {
      const int64_t pos = static_cast<int64_t>(anc[k]) - lo;
      if (pos >= 0 && pos < 16) {
        const uint32_t bit = 1u << (8 * (pos & 3));
        const int64_t word = pos >> 2;
        w0 |= word == 0 ? bit : 0u;
        w1 |= word == 1 ? bit : 0u;
        w2 |= word == 2 ? bit : 0u;
        w3 |= word == 3 ? bit : 0u;
      }
    }
    if (lo >= 0 && lo + 16 <= T) {
      *reinterpret_cast<uint4*>(row + lo) = make_uint4(w0, w1, w2, w3);
    } else {
      for (int q = 0; q < 16; ++q) {
        const int64_t j = lo + q;
        if (j < 0 || j >= T) continue;
        const uint32_t w = q < 4 ? w0 : q < 8 ? w1 : q < 12 ? w2 : w3;
        row[j] = static_cast<uint8_t>((w >> (8 * (q & 3))) & 0xffu);
      }
    }
  }
}

__global__ void __launch_bounds__(kTreeBuildThreads)
    tree_build_kernel(const float* __restrict__ top_log_probs, const int64_t* __restrict__ top_token_ids,
                      const int64_t* __restrict__ root_token_ids, const int32_t* __restrict__ budget,
                      const int32_t* __restrict__ depth_limit, int64_t D, int64_t K, int64_t N,
                      int32_t* __restrict__ node_count, int64_t* __restrict__ node_token_ids,
                      int32_t* __restrict__ node_depths, int32_t* __restrict__ parents,
                      int32_t* __restrict__ next_token, int32_t* __restrict__ next_sibling,
                      uint8_t* __restrict__ visibility, int32_t* __restrict__ status) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int32_t s_defect;  // min over the checked elements of tree_build_check_item
  __shared__ int32_t s_count;   // node_count, from thread 0's build

  const int64_t b = blockIdx.x;
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / kWarp, lane = tid % kWarp;
  const int64_t T = N + 1;
  const SmemLayout layout = smem_layout(N, D);
  TreeBuildCand* heap = reinterpret_cast<TreeBuildCand*>(smem + layout.heap);
  int32_t* slot_mem = reinterpret_cast<int32_t*>(smem + layout.slots);
  const TreeBuildSlots slots{slot_mem, slot_mem + T, slot_mem + 2 * T, slot_mem + 3 * T, slot_mem + 4 * T};
  int32_t* anc = reinterpret_cast<int32_t*>(smem + layout.anc) + warp * layout.anc_len;

  const float* lp = top_log_probs + b * D * K;
  const int64_t* ids = top_token_ids + b * D * K;
  const int32_t req_budget = budget[b];
  const int32_t req_depth_limit = depth_limit[b];

  // Phase 1: empty tree; validation.
  if (tid == 0) s_defect = TREE_BUILD_NO_DEFECT;
  tree_build_init_slots(slots, T, tid, kTreeBuildThreads);
  __syncthreads();
  int32_t st = tree_build_check_ranges(req_budget, req_depth_limit, N, D);
  if (st == TREE_BUILD_OK) {
    int32_t worst = TREE_BUILD_NO_DEFECT;
    const int64_t items = static_cast<int64_t>(req_depth_limit) * K;
    for (int64_t e = tid; e < items; e += kTreeBuildThreads) {
      const int32_t s = tree_build_check_item(lp, ids, K, e / K, e % K);
      worst = s < worst ? s : worst;
    }
    if (worst != TREE_BUILD_NO_DEFECT) atomicMin(&s_defect, worst);
  }
  __syncthreads();
  if (st == TREE_BUILD_OK && s_defect != TREE_BUILD_NO_DEFECT) st = s_defect;

  // Phase 2: the build, by one thread.
  if (tid == 0) {
    const int32_t count = st == TREE_BUILD_OK ? tree_build_grow(lp, K, req_budget, req_depth_limit, heap, slots) : 0;
    s_count = count;
    node_count[b] = count;
    status[b] = st;
  }
  __syncthreads();
  const int32_t count = s_count;

  // Phase 3: node rows.
  const int64_t row = b * T;
  for (int64_t i = tid; i < T; i += kTreeBuildThreads)
    tree_build_node_outputs(i, ids, K, root_token_ids[b], count, slots, node_token_ids + row, node_depths + row,
                            parents + row, next_token + row, next_sibling + row);

  // Phase 4: visibility rows, one per warp at a time.
  uint8_t* vis = visibility + b * T * T;
  for (int64_t i = warp; i < T; i += kWarps) {
    int32_t len = 0;
    if (i <= count) {
      if (lane == 0) len = tree_build_ancestors(static_cast<int32_t>(i), slots.parent, anc);
      len = __shfl_sync(0xffffffffu, len, 0);
      __syncwarp();  // lane 0's ancestor stores before the other lanes read them
    }
    write_visibility_row(vis + i * T, T, anc, len, lane);
    __syncwarp();  // every lane's reads before lane 0 overwrites the buffer for the next row
  }
}

}  // namespace

size_t tree_build_smem_bytes(int64_t N, int64_t D) { return smem_layout(N, D).total; }

cudaError_t tree_build_smem_available(int device, size_t* bytes) {
  int optin = 0;
  cudaError_t err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (err != cudaSuccess) return err;
  cudaFuncAttributes attr;
  err = cudaFuncGetAttributes(&attr, tree_build_kernel);
  if (err != cudaSuccess) return err;
  const size_t total = static_cast<size_t>(optin);
  *bytes = total > attr.sharedSizeBytes ? total - attr.sharedSizeBytes : 0;
  return cudaSuccess;
}

cudaError_t tree_build_configure(size_t smem_bytes) {
  if (smem_bytes > static_cast<size_t>(0x7fffffff)) return cudaErrorInvalidValue;
  return cudaFuncSetAttribute(tree_build_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(smem_bytes));
}

cudaError_t launch_tree_build(const TreeBuildParams& p, cudaStream_t stream) {
  const int64_t B = p.B, D = p.D, K = p.K, N = p.N;
  if (B < 0 || D < 0 || K < 0 || N < 0 || N > 0x7ffffffeLL || B > 0x7fffffffLL) return cudaErrorInvalidValue;
  if (B == 0) return cudaSuccess;
  const size_t smem = tree_build_smem_bytes(N, D);
  tree_build_kernel<<<static_cast<unsigned>(B), kTreeBuildThreads, smem, stream>>>(
      p.top_log_probs, p.top_token_ids, p.root_token_ids, p.budget, p.depth_limit, D, K, N, p.node_count,
      p.node_token_ids, p.node_depths, p.parents, p.next_token, p.next_sibling, p.visibility, p.status);
  return cudaGetLastError();
}

}  // namespace kdtr
