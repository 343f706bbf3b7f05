// tree_build.cu -- CUDA kernels and host launcher for tree_build (compiled by nvcc only).
//
// Contract: docs/ops/tree_build.md.  The per-request pieces (validation, the heap build,
// the select build, the node rows) are kdtr::tree_build_* / tree_select_* from
// tree_build.cuh, shared with the CPU backend.  One or two launches:
//
//   tree_build_kernel<threads, select>: one block per request.
//     1. all threads: statuses 3-6 over the checked rows' elements, striped, reduced with
//        atomicMin to the first failing status (the select kernel checks a copy of the
//        rows staged in shared memory, the log-probs also widened to double there)
//     2. select kernel (256 threads for N <= 256, else 1024): the select build (tree_select_grow:
//        depth-by-depth collection above a threshold, histogram raises, a rank sort of
//        chunks merged by binary search) and its node rows; where it gives up -- or for the
//        heap kernel (256 threads), or an invalid request -- thread 0 runs the heap build in
//        shared memory and all threads write the node rows from its slot arrays
//     3. T <= 128: the request's [T,T] visibility block, built in shared memory and copied
//        out whole
//   tree_build_visibility_kernel (T > 128): the [B,T,T] visibility block spread over the
//     whole GPU (a request's rows are not tied to its build block), 4-128 rows of one request
//     per 128-thread block (1-32 per warp, more for a larger batch): the block copies the
//     request's parents row to shared memory, each lane walks its row's root path, then the
//     warp zeroes its rows one by one (16-byte stores), each row's 1s stored right after
//     its zeros.  It is a programmatic dependent launch (sm_90; the build kernel lets it
//     start at once and it waits, griddepcontrol.wait: the build grid complete, its stores
//     visible, before its first read, so its launch overlaps the build).
//
// Shared memory of the build kernel (tree_build_smem_bytes): the heap build's queue (N + 1
// candidates of 24 B) and slot arrays (5 int32 [T]); for the select kernel its candidate
// set (tree_select_set_bytes(tree_select_capacity(N))) and the staged rows (D * K doubles,
// int64 ids and floats) in the same bytes; for T <= 128 the parents row and the T x T block after them.

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "tree_build.cuh"
#include "tree_build_launch.h"

namespace kdtr {
namespace {

constexpr int kWarp = 32;
constexpr int kHeapThreads = kTreeBuildThreads;  // heap kernel: validation and node rows
constexpr int kSelectThreads = 1024;             // select kernel: one block-wide team ...
constexpr int kSelectThreadsSmall = 256;         // ... of 256 threads for N <= kSmallN
constexpr int64_t kSmallN = 256;
constexpr int64_t kFuseT = 128;   // T <= kFuseT: the build block writes its visibility
constexpr int kVisThreads = 128;  // visibility kernel: 4 warps of 1-32 rows each per block
constexpr int kVisWarps = kVisThreads / kWarp;
constexpr int64_t kVisRowsPerWarpStep = 512;  // a warp's rows: doubled per 512 rows of the batch (B T), up to 32
constexpr int64_t kVisSharedT = 8192;         // T <= kVisSharedT: parents row in shared memory
constexpr int kVisPathCap = 8;                // root-path slots a lane keeps in shared memory
constexpr int kVisPathWords = kVisThreads * kVisPathCap;  // the block's path buffers (int32)
static_assert(kHeapThreads % kWarp == 0, "whole warps");
static_assert(kVisWarps * kWarp == kVisThreads, "visibility: whole warps");
static_assert(sizeof(TreeBuildCand) == 24, "heap entry layout");

// The heap build's bytes: queue of N + 1 candidates, then 5 int32 slot arrays of T.
__host__ __device__ inline size_t heap_bytes(int64_t N) {
  return sizeof(TreeBuildCand) * static_cast<size_t>(N + 1) + sizeof(int32_t) * 5 * static_cast<size_t>(N + 1);
}

// The build's bytes: the heap build's, and for the select kernel the larger of that and its
// candidate set of `room` entries (tree_select_capacity(N) <= room <= tree_select_room(N, K))
// followed by the request's staged rows: the log-probs widened to double, the token ids and
// the log-probs as read (D * K each; 8, 8 and 4 bytes).
__host__ __device__ inline size_t build_smem_bytes(int64_t N, int64_t D, int64_t K, bool select, int64_t room) {
  const size_t heap = heap_bytes(N);
  if (!select) return heap;
  if (D > 0 && K > (int64_t{1} << 36) / D) return ~size_t{0} / 2;  // D * K doubles never fit
  const size_t dk = static_cast<size_t>(D) * static_cast<size_t>(K);
  const size_t rows = (sizeof(double) + sizeof(int64_t)) * dk + (sizeof(float) * dk + 7) / 8 * 8;
  const size_t set = (tree_select_set_bytes(room) + 15) / 16 * 16 + rows;
  return set > heap ? set : heap;
}

struct MinOp {
  template <class V>
  __device__ V operator()(const V& a, const V& b) const {
    return b < a ? b : a;
  }
};
struct MaxOp {
  template <class V>
  __device__ V operator()(const V& a, const V& b) const {
    return b > a ? b : a;
  }
};

// The CUDA block as the select build's team (operations as TreeSelectSerialTeam).  Scans
// and reductions are warp shuffles, the warps' partial results exchanged through shared
// memory with one barrier: each collective writes one of two buffers (they alternate,
// block-uniformly), so the next collective never overwrites a buffer some thread is still
// reading -- the one after it, which writes the same buffer again, comes after the next
// collective's barrier, which every thread reaches only after its reads.  (cub's block scan,
// used before, needs a second barrier before its storage is reused.)
template <int kThreads>
struct BlockTeam {
  static constexpr int kWarps = kThreads / kWarp;
  static_assert(kWarps * kWarp == kThreads && kWarps <= kWarp, "whole warps, at most 32");
  struct Storage {
    int32_t i[2][kWarps];
    double d[2][kWarps];
  };
  Storage& st;
  int parity = 0;  // the buffer of the next collective (every thread calls every collective)

  __device__ int32_t lane() const { return static_cast<int32_t>(threadIdx.x); }
  __device__ int32_t lanes() const { return kThreads; }
  __device__ void sync() { __syncthreads(); }
  __device__ int32_t exclusive_sum(int32_t x, int32_t* total) {
    const int lane = static_cast<int>(threadIdx.x) % kWarp, warp = static_cast<int>(threadIdx.x) / kWarp;
    int32_t incl = x;
#pragma unroll
    for (int o = 1; o < kWarp; o <<= 1) {
      const int32_t y = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += y;
    }
    int32_t* buf = st.i[parity];
    parity ^= 1;
    if (lane == kWarp - 1) buf[warp] = incl;
    __syncthreads();
    int32_t wincl = lane < kWarps ? buf[lane] : 0;  // the warps' totals, scanned
#pragma unroll
    for (int o = 1; o < kWarps; o <<= 1) {
      const int32_t y = __shfl_up_sync(0xffffffffu, wincl, o);
      if (lane >= o) wincl += y;
    }
    *total = __shfl_sync(0xffffffffu, wincl, kWarps - 1);
    const int32_t before = warp == 0 ? 0 : __shfl_sync(0xffffffffu, wincl, warp > 0 ? warp - 1 : 0);
    return before + incl - x;
  }
  template <class Op>
  __device__ double reduce_d(double x, Op op) {
    const int lane = static_cast<int>(threadIdx.x) % kWarp, warp = static_cast<int>(threadIdx.x) / kWarp;
#pragma unroll
    for (int o = kWarp / 2; o > 0; o >>= 1) x = op(x, __shfl_xor_sync(0xffffffffu, x, o));
    double* buf = st.d[parity];
    parity ^= 1;
    if (lane == 0) buf[warp] = x;
    __syncthreads();
    double all = buf[lane % kWarps];
#pragma unroll
    for (int o = kWarps / 2; o > 0; o >>= 1) all = op(all, __shfl_xor_sync(0xffffffffu, all, o));
    return all;
  }
  __device__ double min(double x) { return reduce_d(x, MinOp()); }
  __device__ double max(double x) { return reduce_d(x, MaxOp()); }
  __device__ int32_t max_int(int32_t x) {
    const int lane = static_cast<int>(threadIdx.x) % kWarp, warp = static_cast<int>(threadIdx.x) / kWarp;
    x = __reduce_max_sync(0xffffffffu, x);
    int32_t* buf = st.i[parity];
    parity ^= 1;
    if (lane == 0) buf[warp] = x;
    __syncthreads();
    return __reduce_max_sync(0xffffffffu, buf[lane % kWarps]);
  }
  __device__ bool any(bool x) { return __syncthreads_or(x ? 1 : 0) != 0; }
  __device__ void add(int32_t* p, int32_t v) { atomicAdd(p, v); }
  // tree_select_sort's chunk: two warps' entries
  __device__ int32_t sort_chunk() const { return 64; }
};

template <int kThreads, bool kSelect>
__global__ void __launch_bounds__(kThreads)
    tree_build_kernel(const __grid_constant__ TreeBuildParams prm, uint8_t* __restrict__ visibility, int32_t anc_len,
                      int32_t room) {
  // The op's struct by value (kernel parameter space); `visibility` is prm.visibility where
  // this block writes the request's visibility too (T <= kFuseT), else nullptr; `room` the
  // select build's set entries (build_launch).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // The visibility kernel (a programmatic dependent launch) may start now: it waits for
  // this grid's completion before it reads anything.
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  const float* __restrict__ top_log_probs = prm.top_log_probs;
  const int64_t* __restrict__ top_token_ids = prm.top_token_ids;
  const int64_t* __restrict__ root_token_ids = prm.root_token_ids;
  const int32_t* __restrict__ budget = prm.budget;
  const int32_t* __restrict__ depth_limit = prm.depth_limit;
  const int64_t D = prm.D, K = prm.K, N = prm.N;
  int32_t* __restrict__ node_count = prm.node_count;
  int64_t* __restrict__ node_token_ids = prm.node_token_ids;
  int32_t* __restrict__ node_depths = prm.node_depths;
  int32_t* __restrict__ parents = prm.parents;
  int32_t* __restrict__ next_token = prm.next_token;
  int32_t* __restrict__ next_sibling = prm.next_sibling;
  int32_t* __restrict__ status = prm.status;
  uint8_t* __restrict__ heap_fallback = prm.heap_fallback;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int32_t s_defect;  // min over the checked elements of tree_build_check_item
  __shared__ int32_t s_count;   // node_count, from thread 0's heap build

  const int64_t b = blockIdx.x;
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t T = N + 1;
  const float* lp = top_log_probs + b * D * K;
  const int64_t* ids = top_token_ids + b * D * K;
  const int32_t req_budget = budget[b];
  const int32_t req_depth_limit = depth_limit[b];
  const int64_t row = b * T;

  KDTR_TB_MARK(0);
  // Phase 1: validation.  The select kernel first stages the checked rows in shared memory
  // (one coalesced read of each input; the log-probs also widened to double for the build)
  // and checks the staged copies; the heap kernel checks the global rows.
  if (tid == 0) s_defect = TREE_BUILD_NO_DEFECT;
  int32_t st = tree_build_check_ranges(req_budget, req_depth_limit, N, D);
  const int64_t items = st == TREE_BUILD_OK ? static_cast<int64_t>(req_depth_limit) * K : 0;
  const float* check_lp = lp;
  const int64_t* check_ids = ids;
  double* lpd = nullptr;  // select kernel: the staged rows, widened (row stride K)
  if constexpr (kSelect) {
    lpd = reinterpret_cast<double*>(smem + (tree_select_set_bytes(room) + 15) / 16 * 16);
    int64_t* ids_s = reinterpret_cast<int64_t*>(lpd + D * K);
    float* lp_s = reinterpret_cast<float*>(ids_s + D * K);
#pragma unroll 4
    for (int64_t e = tid; e < items; e += kThreads) {
      const float x = lp[e];
      lp_s[e] = x;
      lpd[e] = static_cast<double>(x);
      ids_s[e] = ids[e];
    }
    check_lp = lp_s;
    check_ids = ids_s;
  }
  __syncthreads();
  if (st == TREE_BUILD_OK) {
    int32_t worst = TREE_BUILD_NO_DEFECT;
    for (int64_t e = tid; e < items; e += kThreads) {
      const int32_t s = tree_build_check_item(check_lp, check_ids, K, e / K, e % K);
      worst = s < worst ? s : worst;
    }
    if (worst != TREE_BUILD_NO_DEFECT) atomicMin(&s_defect, worst);
  }
  __syncthreads();
  if (st == TREE_BUILD_OK && s_defect != TREE_BUILD_NO_DEFECT) st = s_defect;
  KDTR_TB_MARK(1);

  // Phase 2a: the select build, by the whole block (uniform: st and every decision of
  // tree_select_grow are block-wide values).
  bool placed = false;
  int32_t count = 0;
  if constexpr (kSelect) {
    __shared__ typename BlockTeam<kThreads>::Storage team_storage;
    if (st == TREE_BUILD_OK && req_budget > 0 && req_depth_limit > 0 && K > 0) {
      BlockTeam<kThreads> team{team_storage};
      const TreeSelectSet set = tree_select_set(smem, tree_select_capacity(N), room);
      KDTR_TB_MARK(2);
      placed = tree_select_grow(team, lpd, K, req_budget, req_depth_limit, set, &count);
      KDTR_TB_MARK(3);
      if (placed)  // token ids from the staged rows
        tree_select_node_outputs(team, set, count, check_ids, K, root_token_ids[b], T, node_token_ids + row,
                                 node_depths + row, parents + row, next_token + row, next_sibling + row);
    }
    __syncthreads();  // the set's last reads before the heap build reuses the bytes
    KDTR_TB_MARK(4);
  }

  // Phase 2b: the heap build, by thread 0, and the node rows from its slot arrays.
  if (!placed) {
    TreeBuildCand* heap = reinterpret_cast<TreeBuildCand*>(smem);
    int32_t* slot_mem = reinterpret_cast<int32_t*>(smem + sizeof(TreeBuildCand) * static_cast<size_t>(N + 1));
    const TreeBuildSlots slots{slot_mem, slot_mem + T, slot_mem + 2 * T, slot_mem + 3 * T, slot_mem + 4 * T};
    tree_build_init_slots(slots, T, tid, kThreads);
    __syncthreads();
    if (tid == 0) s_count = st == TREE_BUILD_OK ? tree_build_grow(lp, K, req_budget, req_depth_limit, heap, slots) : 0;
    __syncthreads();
    KDTR_TB_MARK(5);
    count = s_count;
    for (int64_t i = tid; i < T; i += kThreads)
      tree_build_node_outputs(i, ids, K, root_token_ids[b], count, slots, node_token_ids + row, node_depths + row,
                              parents + row, next_token + row, next_sibling + row);
  }
  if (tid == 0) {
    node_count[b] = count;
    status[b] = st;
    if (heap_fallback != nullptr)
      heap_fallback[b] = kSelect && !placed && st == TREE_BUILD_OK && req_budget > 0 && req_depth_limit > 0 && K > 0;
  }
  // Small trees (visibility != nullptr: T <= kFuseT): this block writes the request's
  // visibility too, saving the visibility kernel's launch: the [T,T] block is built in
  // shared memory (zeros, then each row's root path, walked on a shared copy of the
  // parents row -- taken from the build's shared memory, not read back from the global row
  // just written) and copied out whole.  Both follow the bytes the build used.  The block
  // starts `mis` = (destination address mod 16) bytes into its 16-byte-aligned buffer, so
  // that buffer and destination share their alignment: the 16-byte chunks wholly inside the
  // block are copied as uint4, the at most two partial ones (first and last) byte by byte.
  if (visibility != nullptr) {
    int32_t* vis_par = reinterpret_cast<int32_t*>(smem + (build_smem_bytes(N, D, K, kSelect, room) + 15) / 16 * 16);
    uint8_t* buf = reinterpret_cast<uint8_t*>(vis_par + (T + 3) / 4 * 4);
    uint8_t* dst = visibility + b * T * T;
    const int64_t bytes = T * T, mis = static_cast<int64_t>(reinterpret_cast<uintptr_t>(dst) & 15);
    const int64_t chunks = (mis + bytes + 15) / 16;
    uint8_t* blk = buf + mis;
    if (placed) {  // slot i's parent from the select set (as tree_select_node_outputs wrote it)
      if constexpr (kSelect) {
        const TreeSelectSet set = tree_select_set(smem, tree_select_capacity(N), room);
        const int32_t* order = reinterpret_cast<const int32_t*>(set.ek);
        const int32_t* slot_of = reinterpret_cast<const int32_t*>(set.w);
        for (int64_t i = tid; i < T; i += kThreads) {
          int32_t par = -1;
          if (i >= 1 && i <= count) {
            const int32_t pe = set.par[order[i - 1]];
            par = pe < 0 ? 0 : slot_of[pe];
          }
          vis_par[i] = par;
        }
      }
    } else {  // the heap build's slot array
      const int32_t* slot_parent =
          reinterpret_cast<const int32_t*>(smem + sizeof(TreeBuildCand) * static_cast<size_t>(N + 1));
      for (int64_t i = tid; i < T; i += kThreads) vis_par[i] = slot_parent[i];
    }
    for (int64_t k = tid; k < chunks; k += kThreads) reinterpret_cast<uint4*>(buf)[k] = make_uint4(0u, 0u, 0u, 0u);
    __syncthreads();
    for (int64_t i = tid; i <= count; i += kThreads) {
      int32_t len = 0;
      for (int32_t s = static_cast<int32_t>(i); s >= 0 && s < T && len < anc_len; s = vis_par[s], ++len)
        blk[i * T + s] = 1;
    }
    __syncthreads();
    uint4* dst16 = reinterpret_cast<uint4*>(dst - mis);  // 16-byte aligned: chunk k is buf[16k, 16k + 16)
    for (int64_t k = tid; k < chunks; k += kThreads) {
      const int64_t c0 = 16 * k;
      if (c0 >= mis && c0 + 16 <= mis + bytes) {
        dst16[k] = reinterpret_cast<const uint4*>(buf)[k];
      } else {
        for (int64_t j = c0 < mis ? mis : c0; j < c0 + 16 && j < mis + bytes; ++j) dst[j - mis] = buf[j];
      }
    }
  }
#if defined(KDTR_TB_CLOCKS) && defined(__CUDA_ARCH__)
  KDTR_TB_MARK(40);
  if (tid == 0 && b == 0)
    for (int i = 1; i < 64; ++i)
      if (g_tree_build_clk[i] != 0) printf("tbclk %d %lld\n", i, g_tree_build_clk[i] - g_tree_build_clk[0]);
#endif
}

// The visibility kernels' first statement: in a programmatic dependent launch (the fast
// path's), the build grid complete and its stores visible before the first read of
// node_count and parents; a no-op in an ordinary launch.
__device__ inline void wait_for_build_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Zeroes bytes [0, n) of p by the 32 lanes of a warp: 16-byte-aligned chunks stored whole
// (uint4, 512 bytes per warp store), the bytes before the first and after the last
// aligned chunk one by one (those chunks are shared with bytes outside [0, n), which
// other warps write).
__device__ inline void zero_span_by_warp(uint8_t* p, int64_t n, int lane) {
  const uintptr_t p0 = reinterpret_cast<uintptr_t>(p);
  int64_t head = static_cast<int64_t>((16 - (p0 & 15)) & 15);  // bytes before the first aligned chunk
  if (head > n) head = n;
  const int64_t body = (n - head) / 16;   // whole aligned chunks
  const int64_t tail = head + 16 * body;  // first byte after them
  if (lane < head) p[lane] = 0;
  if (lane < n - tail) p[tail + lane] = 0;
  uint4* chunks = reinterpret_cast<uint4*>(p + head);
  for (int64_t c = lane; c < body; c += kWarp) chunks[c] = make_uint4(0u, 0u, 0u, 0u);
}

// The [B,T,T] visibility of all B requests (T > kFuseT).  Block x (request b = x / tiles,
// tile x % tiles; tile_rows = 4 rpw, tiles = ceil(T / tile_rows)) writes rows [tile_rows *
// tile, +tile_rows) of request b; warp w of the block takes rpw consecutive rows of them
// (rpw, rows per warp: 1, 2, 4, ..., 32, vis_rows_per_warp):
//   1. the block copies request b's parents row to shared memory (par_smem: T <=
//      kVisSharedT; the walks read the global row instead for larger T) and reads
//      node_count[b] -- items whose rows all lie past node_count skip the copy;
//   2. lane l < rpw walks the root path of its row r0 + l (rows <= node_count; at most
//      anc_len slots, as tree_build_ancestors), the walks side by side, keeping the first
//      kVisPathCap slots in the warp's path buffer (column l) and the path's length;
//   3. row by row, the warp zeroes row j (zero_span_by_warp), __syncwarp (the zero stores
//      before the marks: the same bytes, other lanes), and lane k stores the 1 of row j's
//      k-th path slot (lane 0 walks on past kVisPathCap slots, from the last one kept).
// A row's 1s are stored right after its zeros, while their lines are still in L2 (a late
// partial-sector store of an evicted line costs the DRAM a read-modify-write).  Rows past
// node_count stay zero; warps whose rows start at or past T do nothing.  anc_len = min(D,
// N) + 1 bounds every walk, so a corrupt parents row can neither loop nor read out of range.
__global__ void __launch_bounds__(kVisThreads)
    tree_build_visibility_kernel(const __grid_constant__ TreeBuildParams prm, int32_t anc_len, int32_t par_smem,
                                 int32_t rpw) {
  const int32_t* __restrict__ node_count = prm.node_count;
  const int32_t* __restrict__ parents = prm.parents;
  uint8_t* __restrict__ visibility = prm.visibility;
  const int64_t T = prm.N + 1;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int32_t s_count;
  int32_t* s_path = reinterpret_cast<int32_t*>(smem);  // [warps][kVisPathCap][32]
  int32_t* s_par = s_path + kVisPathWords;
  wait_for_build_grid();
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / kWarp, lane = tid % kWarp;
  const int64_t tile_rows = static_cast<int64_t>(kVisWarps) * rpw, tiles = (T + tile_rows - 1) / tile_rows;
  const int64_t b = static_cast<int64_t>(blockIdx.x) / tiles,
                i0 = (static_cast<int64_t>(blockIdx.x) % tiles) * tile_rows;
  if (tid == 0) s_count = node_count[b];
  __syncthreads();
  const int32_t count = s_count;
  const int32_t* par = parents + b * T;
  if (par_smem != 0 && i0 <= count) {
    for (int64_t j = tid; j < T; j += kVisThreads) s_par[j] = par[j];
    __syncthreads();
    par = s_par;
  }
  const int64_t r0 = i0 + static_cast<int64_t>(warp) * rpw;  // the warp's first row
  if (r0 >= T) return;
  const int64_t rows = T - r0 < rpw ? T - r0 : rpw;
  int32_t* path = s_path + warp * kVisPathCap * kWarp;
  int32_t len = 0;
  if (lane < rows && r0 + lane <= count)
    for (int32_t s = static_cast<int32_t>(r0 + lane); s >= 0 && s < T && len < anc_len; s = par[s], ++len)
      if (len < kVisPathCap) path[len * kWarp + lane] = s;
  __syncwarp();  // the path buffer's stores before other lanes read them
  uint8_t* vis = visibility + b * T * T;
  for (int64_t j = 0; j < rows; ++j) {
    uint8_t* row = vis + (r0 + j) * T;
    zero_span_by_warp(row, T, lane);
    __syncwarp();
    const int32_t n = __shfl_sync(0xffffffffu, len, static_cast<int>(j));
    if (lane < n && lane < kVisPathCap) row[path[lane * kWarp + j]] = 1;
    if (lane == 0 && n > kVisPathCap) {  // the rest of a long path, walked on from its last kept slot
      int32_t s = par[path[(kVisPathCap - 1) * kWarp + j]];
      for (int32_t k = kVisPathCap; k < n && s >= 0 && s < T; ++k, s = par[s]) row[s] = 1;
    }
  }
}

int32_t vis_anc_len(int64_t N, int64_t D) { return static_cast<int32_t>((D < N ? D : N) + 1); }

// The visibility kernel's rows per warp for B * T rows: 1, doubled for each doubling of the
// batch's rows past 2 kVisRowsPerWarpStep, at most 32 -- one row per warp (the most warps)
// for a small batch, 32 (each walk step shared by 32 rows) where warps are plentiful.
int32_t vis_rows_per_warp(int64_t rows) {
  int32_t rpw = 1;
  while (rpw < kWarp && 2 * rpw * kVisRowsPerWarpStep <= rows) rpw *= 2;
  return rpw;
}

// The build kernel instance for N and `kernel`, its threads, its select set's entries
// (`room`: tree_select_capacity(N), or tree_select_room(N, K) where `roomy` and N <= kSmallN:
// above that the raises over every placed child cost more than the chains, which stop at the
// first child below theta -- docs/benchmarks.md, "The roomier select set") and its dynamic
// shared memory (the build's bytes, plus the ancestor buffers when it writes the visibility
// itself).
struct BuildLaunch {
  const void* fn;
  int threads;
  bool fuse;
  int64_t room;
  size_t smem;
};

BuildLaunch build_launch(int64_t N, int64_t D, int64_t K, int32_t kernel, bool roomy = false) {
  const bool select = kernel == TREE_BUILD_KERNEL_SELECT;
  BuildLaunch l;
  if (!select) {
    l.fn = reinterpret_cast<const void*>(tree_build_kernel<kHeapThreads, false>);
    l.threads = kHeapThreads;
  } else if (N <= kSmallN) {
    l.fn = reinterpret_cast<const void*>(tree_build_kernel<kSelectThreadsSmall, true>);
    l.threads = kSelectThreadsSmall;
  } else {
    l.fn = reinterpret_cast<const void*>(tree_build_kernel<kSelectThreads, true>);
    l.threads = kSelectThreads;
  }
  l.fuse = N + 1 <= kFuseT;
  l.room = roomy && select && N <= kSmallN ? tree_select_room(N, K) : tree_select_capacity(N);
  l.smem = build_smem_bytes(N, D, K, select, l.room);
  if (l.fuse)  // the parents row (T int32, padded to 16 bytes) and the [T,T] block's buffer
    // (the block at an offset of up to 15 bytes, in whole 16-byte chunks)
    l.smem = (l.smem + 15) / 16 * 16 + sizeof(int32_t) * static_cast<size_t>((N + 1 + 3) / 4 * 4) +
             static_cast<size_t>(((N + 1) * (N + 1) + 15 + 15) / 16 * 16);
  return l;
}

}  // namespace

size_t tree_build_smem_bytes(int64_t N, int64_t D, int64_t K, int32_t kernel) {
  return build_launch(N, D, K, kernel).smem;
}

// Per-device cache of what tree_build_smem_available and tree_build_configure ask the
// runtime (devices >= kCacheDevices are asked every time): a launch through
// tree_build_choose does nothing slow, synchronizing or capture-unsafe after its first
// call on a device.  Index [device][select].
namespace {

constexpr int kCacheDevices = 64;
std::atomic<int64_t> g_smem_available[kCacheDevices][2];   // bytes + 1; 0: not asked yet
std::atomic<int64_t> g_smem_configured[kCacheDevices][2];  // the limit set (both instances); 0: none
std::atomic<int64_t> g_sm_count[kCacheDevices];            // multiprocessors; 0: not asked yet
std::atomic<int64_t> g_smem_per_sm[kCacheDevices];         // shared memory per multiprocessor, bytes

int cache_index(int device) { return device >= 0 && device < kCacheDevices ? device : -1; }

cudaError_t smem_available_uncached(int device, int32_t kernel, size_t* bytes);

}  // namespace

cudaError_t tree_build_smem_available(int device, int32_t kernel, size_t* bytes) {
  const int d = cache_index(device), k = kernel == TREE_BUILD_KERNEL_SELECT ? 1 : 0;
  if (d >= 0) {
    const int64_t v = g_smem_available[d][k].load(std::memory_order_acquire);
    if (v > 0) {
      *bytes = static_cast<size_t>(v - 1);
      return cudaSuccess;
    }
  }
  const cudaError_t err = smem_available_uncached(device, kernel, bytes);
  if (err == cudaSuccess && d >= 0)
    g_smem_available[d][k].store(static_cast<int64_t>(*bytes) + 1, std::memory_order_release);
  return err;
}

namespace {

cudaError_t smem_available_uncached(int device, int32_t kernel, size_t* bytes) {
  int optin = 0;
  cudaError_t err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (err != cudaSuccess) return err;
  // The most static shared memory of the kernel's instances (any N).
  size_t static_max = 0;
  for (int64_t N : {int64_t{1}, kSmallN + 1}) {
    cudaFuncAttributes attr;
    err = cudaFuncGetAttributes(&attr, build_launch(N, 1, 1, kernel).fn);
    if (err != cudaSuccess) return err;
    static_max = attr.sharedSizeBytes > static_max ? attr.sharedSizeBytes : static_max;
  }
  const size_t total = static_cast<size_t>(optin);
  *bytes = total > static_max ? total - static_max : 0;
  return cudaSuccess;
}

}  // namespace

// The limit is only raised: a limit set earlier on this device at or above smem_bytes
// already allows the launch (the attribute bounds the dynamic shared memory a launch may
// ask; each launch asks its own tree_build_smem_bytes).
cudaError_t tree_build_configure(int32_t kernel, size_t smem_bytes) {
  if (smem_bytes > static_cast<size_t>(0x7fffffff)) return cudaErrorInvalidValue;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const int d = cache_index(device), k = kernel == TREE_BUILD_KERNEL_SELECT ? 1 : 0;
  if (d >= 0) {
    const int64_t have = g_smem_configured[d][k].load(std::memory_order_acquire);
    if (have > 0 && have >= static_cast<int64_t>(smem_bytes)) return cudaSuccess;
  }
  for (int64_t N : {int64_t{1}, kSmallN + 1}) {
    err = cudaFuncSetAttribute(build_launch(N, 1, 1, kernel).fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(smem_bytes));
    if (err != cudaSuccess) return err;
  }
  if (d >= 0) {
    int64_t have = g_smem_configured[d][k].load(std::memory_order_acquire);
    const int64_t want = static_cast<int64_t>(smem_bytes) > 0 ? static_cast<int64_t>(smem_bytes) : 1;
    while (have < want && !g_smem_configured[d][k].compare_exchange_weak(have, want, std::memory_order_acq_rel)) {
    }
  }
  return cudaSuccess;
}

cudaError_t tree_build_choose(const TreeBuildParams& p, int device, int32_t* kernel, std::string* why) {
  size_t need = 0, have = 0;
  auto fits = [&](int32_t k, cudaError_t* err) {
    need = tree_build_smem_bytes(p.N, p.D, p.K, k);
    *err = tree_build_smem_available(device, k, &have);
    return need <= have;
  };
  cudaError_t err = cudaSuccess;
  int32_t k = p.kernel == TREE_BUILD_KERNEL_HEAP ? TREE_BUILD_KERNEL_HEAP : TREE_BUILD_KERNEL_SELECT;
  if (!fits(k, &err) && err == cudaSuccess && p.kernel == TREE_BUILD_KERNEL_AUTO) {
    k = TREE_BUILD_KERNEL_HEAP;
    fits(k, &err);
  }
  if (err != cudaSuccess) return err;
  if (need > have) {
    *why = "N = " + std::to_string(p.N) + ", D = " + std::to_string(p.D) + ": the " +
           (k == TREE_BUILD_KERNEL_HEAP ? "heap" : "select") + " kernel needs " + std::to_string(need) +
           " bytes of shared memory per block, device " + std::to_string(device) + " allows " + std::to_string(have);
    return cudaErrorNotSupported;
  }
  *kernel = k;
  // The select kernel's roomier set (build_launch's `roomy`) where the device has the bytes:
  // the limit is set for it, and launch_tree_build takes it where the batch allows.
  if (k == TREE_BUILD_KERNEL_SELECT) {
    const size_t roomy = build_launch(p.N, p.D, p.K, k, true).smem;
    if (roomy <= have) need = roomy > need ? roomy : need;
    const int d = cache_index(device);
    if (d >= 0 && g_sm_count[d].load(std::memory_order_acquire) == 0) {
      int sms = 0, per_sm = 0;
      err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
      if (err == cudaSuccess)
        err = cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device);
      if (err != cudaSuccess) return err;
      g_smem_per_sm[d].store(per_sm, std::memory_order_release);
      g_sm_count[d].store(sms, std::memory_order_release);
    }
  }
  return tree_build_configure(k, need);
}

namespace {

// The roomier select set for this launch: only where the limit configured on the current
// device allows its bytes (tree_build_choose sets it so), and where it keeps the batch in
// one wave -- B blocks within the multiprocessors' room for such blocks (threads, and the
// shared memory with 4 KiB per block for the static part and the runtime's reserve) -- so
// that a large batch keeps the smaller set's occupancy.  Reads the caches only.
bool roomy_fits(const BuildLaunch& big, int64_t B) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  const int d = cache_index(device);
  if (d < 0) return false;
  const int64_t configured = g_smem_configured[d][1].load(std::memory_order_acquire);
  const int64_t sms = g_sm_count[d].load(std::memory_order_acquire);
  const int64_t per_sm = g_smem_per_sm[d].load(std::memory_order_acquire);
  if (configured < static_cast<int64_t>(big.smem) || sms <= 0) return false;
  const int64_t by_smem = per_sm / (static_cast<int64_t>(big.smem) + 4096);
  const int64_t by_threads = 2048 / big.threads;
  const int64_t per = by_smem < by_threads ? by_smem : by_threads;
  return B <= per * sms;
}

}  // namespace

cudaError_t launch_tree_build(const TreeBuildParams& p, cudaStream_t stream) {
  const int64_t B = p.B, D = p.D, K = p.K, N = p.N, T = N + 1;
  if (B < 0 || D < 0 || K < 0 || N < 0 || N > 0x7ffffffeLL || B > 0x7fffffffLL) return cudaErrorInvalidValue;
  if (p.kernel != TREE_BUILD_KERNEL_HEAP && p.kernel != TREE_BUILD_KERNEL_SELECT) return cudaErrorInvalidValue;
  if (B == 0) return cudaSuccess;
  BuildLaunch l = build_launch(N, D, K, p.kernel);
  if (p.kernel == TREE_BUILD_KERNEL_SELECT) {
    const BuildLaunch big = build_launch(N, D, K, p.kernel, true);
    if (big.smem > l.smem && roomy_fits(big, B)) l = big;
  }
  // The visibility kernel's grid, checked before anything is launched: one block per 4 rpw
  // rows of a request, B * ceil(T / (4 rpw)) <= 2^31 - 1 blocks (more would be over 2 TB of
  // visibility output).
  const int32_t rpw = vis_rows_per_warp(B * T);
  const int64_t tile_rows = static_cast<int64_t>(kVisWarps) * rpw;
  const int64_t items = B * ((T + tile_rows - 1) / tile_rows);
  if (!l.fuse && items > 0x7fffffffLL) return cudaErrorInvalidValue;
  const int32_t anc_len = vis_anc_len(N, D);
  uint8_t* fused_visibility = l.fuse ? p.visibility : nullptr;
  // The build kernel's instance is chosen at run time (BuildLaunch::fn): cudaLaunchKernel
  // with the kernel's four parameters, the struct by value first.
  TreeBuildParams params = p;
  int32_t anc = anc_len;
  int32_t room = static_cast<int32_t>(l.room);
  void* args[] = {&params, &fused_visibility, &anc, &room};
  cudaError_t err = cudaLaunchKernel(l.fn, dim3(static_cast<unsigned>(B)), dim3(static_cast<unsigned>(l.threads)), args,
                                     l.smem, stream);
  if (err != cudaSuccess) return err;
  if (l.fuse) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>(items);
  const int32_t par_smem = T <= kVisSharedT ? 1 : 0;
  const size_t vis_smem = sizeof(int32_t) * (kVisPathWords + (par_smem != 0 ? static_cast<size_t>(T) : 0));
  // A programmatic dependent launch (the kernel waits for the build grid before its first
  // read): its launch overlaps the build.  Where the attribute is refused, an ordinary one.
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(blocks);
  cfg.blockDim = dim3(kVisThreads);
  cfg.dynamicSmemBytes = vis_smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  err = cudaLaunchKernelEx(&cfg, tree_build_visibility_kernel, p, anc_len, par_smem, rpw);
  if (err == cudaErrorNotSupported) {  // no programmatic launch here: an ordinary one
    (void)cudaGetLastError();
    tree_build_visibility_kernel<<<blocks, kVisThreads, vis_smem, stream>>>(p, anc_len, par_smem, rpw);
    return cudaGetLastError();
  }
  return err;
}

}  // namespace kdtr
