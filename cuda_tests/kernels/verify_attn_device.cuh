// verify_attn_device.cuh -- device helpers shared by the verify_attn CUDA kernels
// (verify_attn.cu: simt and mma; verify_attn_sm90.cu: wgmma).  nvcc only.
//
// The length check (verify_attn_launch.h, "The device-side length check"): every kernel
// gets a VerifyAttnCheck (the device's error record, the launch's rule), checks its
// request with length_fault before any load of it, and a failing request's blocks take
// request_failed (NaN rows, the record claimed by its first block).
//
// NaN and infinities (docs/ops/verify_attn.md, "NaN and infinities"; verify_attn.cuh).
// Every kernel keeps the running max with verify_attn_max (NaN propagates; fmaxf would
// drop it), so a NaN or +inf visible score leaves l = NaN through alpha and P, and the
// epilogue (finish_row) decides from l and the visible-key set:
//   l NaN                      -> out NaN, lse NaN
//   l == 0 and a visible key   -> out NaN, lse NaN (every visible score was -inf)
//   l == 0 and no visible key  -> out 0,   lse -inf (also padding rows)
//   else                       -> out O / l, lse m + log(l)
// A key of weight 0 (invisible, or a -inf score) must contribute nothing to O, but P V
// would give 0 * NaN = NaN from a NaN or inf value element.  Such an element makes every
// raw score of its key NaN or +-inf (values are key dims), so it can only meet rows where
// the key has weight 0 or that are NaN anyway: a tile whose raw scores (before the mask)
// hold any non-finite value has the non-finite elements of its KV tile replaced by 0
// before P V (bf16x2_finite_or_zero / finite_or_zero); finite tiles take the unchanged
// path.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "verify_attn.cuh"
#include "verify_attn_launch.h"  // DeviceErrorRecord, VerifyAttnRule

namespace kdtr {

// The length check's argument of every verify_attn kernel (verify_attn_launch.h, "The
// device-side length check"): the device's error record and the launch's rule.
struct VerifyAttnCheck {
  DeviceErrorRecord* record;  // never null in a launch of launch_verify_attn
  int32_t rule;               // VerifyAttnRule
};

namespace va_device {

// Programmatic dependent launch (compute capability 9.0 and up; no-ops below).  The split
// kernels call pdl_launch_dependents first, so that the combine kernel, launched with the
// programmatic-serialization attribute (launch_verify_attn), is scheduled while they run;
// every combine block calls pdl_wait_primary before anything else, which returns once the
// attention grid has completed and its writes are visible.  Because every combine block
// waits (the early-returning ones too), the combine grid completes after the attention grid,
// so the next launch on the stream sees both.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(KDTR_VERIFY_ATTN_NO_PDL)
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait_primary() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ float neg_inf() { return __int_as_float(static_cast<int>(0xff800000u)); }
__device__ __forceinline__ float quiet_nan() { return __int_as_float(0x7fffffff); }
__device__ __forceinline__ bool finite_f(float x) { return fabsf(x) <= 3.402823466e38f; }  // false for NaN
__device__ __forceinline__ float finite_or_zero(float x) { return finite_f(x) ? x : 0.0f; }

// Two bf16 in a word, each NaN or +-inf (exponent all ones) replaced by +0.
__device__ __forceinline__ uint32_t bf16x2_finite_or_zero(uint32_t u) {
  if ((u & 0x7f800000u) == 0x7f800000u) u &= 0x0000ffffu;
  if ((u & 0x00007f80u) == 0x00007f80u) u &= 0xffff0000u;
  return u;
}

// The epilogue's decision for one row (table above).
struct RowResult {
  bool nan;   // out and lse NaN
  bool zero;  // out 0, lse -inf
};
__device__ __forceinline__ RowResult finish_row(float l, bool row_valid, int pl, int tl, const uint8_t* vis_row) {
  if (l != l) return {true, false};
  if (l == 0.0f) {
    const bool has_key = row_valid && verify_attn_row_has_key(pl, tl, vis_row);
    return {has_key, !has_key};
  }
  return {false, false};
}

// Rows [row0, row0 + nrows) of out (columns [col0, col0 + ncols)) and lse: out_value and
// lse_value.
__device__ __forceinline__ void write_rows(float* __restrict__ out, float* __restrict__ lse, int64_t row0, int nrows,
                                           int d_v, int col0, int ncols, bool with_lse, float out_value,
                                           float lse_value) {
  for (int idx = threadIdx.x; idx < nrows * ncols; idx += blockDim.x) {
    const int r = idx / ncols, c = idx - r * ncols;
    out[(row0 + r) * d_v + col0 + c] = out_value;
  }
  if (with_lse)
    for (int r = threadIdx.x; r < nrows; r += blockDim.x) lse[row0 + r] = lse_value;
}

// Padding rows (and a block's rows with no visible key beyond tree_len): 0 and -inf.
__device__ __forceinline__ void write_padding_rows(float* __restrict__ out, float* __restrict__ lse, int64_t row0,
                                                   int nrows, int d_v, int col0, int ncols, bool with_lse) {
  write_rows(out, lse, row0, nrows, d_v, col0, ncols, with_lse, 0.0f, neg_inf());
}

// The length check of one request (64-bit: any int32 lengths, INT32_MIN included): 0 when
// its lengths are valid under `rule`, else the DeviceErrorField that fails first (in the
// order of the CPU entries' checks).  Under VerifyAttn, 0 exactly where
// verify_attn_lengths_ok holds.
__device__ __forceinline__ int32_t length_fault(int64_t pl, int64_t tl, int64_t T, int64_t S, int32_t rule) {
  if (pl < 0) return kDeviceErrorPrefixLen;
  if (tl < 0 || tl > T) return kDeviceErrorTreeLen;
  const int64_t rows = rule == static_cast<int32_t>(VerifyAttnRule::GreedyStep) ? T : tl;
  if (pl > S - rows) return kDeviceErrorCacheRows;
  return 0;
}

// Counts failing request b in the record; the first to claim it (count 0 -> 1) writes its
// details.  One call per failing request (its first block's thread 0).
__device__ __forceinline__ void record_fault(const VerifyAttnCheck& chk, int32_t field, int64_t b, int64_t pl,
                                             int64_t tl, int64_t T, int64_t S) {
  DeviceErrorRecord* const r = chk.record;
  if (r == nullptr) return;
  if (atomicAdd(&r->count, 1ull) != 0ull) return;
  r->op = chk.rule;
  r->field = field;
  r->request = b;
  r->prefix_len = pl;
  r->tree_len = tl;
  r->T = T;
  r->S = S;
  __threadfence();
}

// A failing request's block (the kernels check the lengths first, before any load of the
// request, and take this path where length_fault != 0, in the branch of their padding
// blocks): its part of out and lse written NaN -- rows [m0, m0 + 64) of the request's M =
// T*H (within M), value columns [col0, col0 + cols) (within d_v), lse where blockIdx.y ==
// 0 -- and the request recorded by its first block (m0 == 0, blockIdx.y == 0).  (Merged
// into the padding branch and inlined, the check leaves the main path's registers as they
// were; as an early return of its own, or a call, the mma kernel of Dqk 576 spilled.)
__device__ __forceinline__ void request_failed(const VerifyAttnCheck& chk, const VerifyAttnProblem& prm, int64_t b,
                                               int m0, int col0, int cols) {
  const int32_t pl = prm.prefix_len[b], tl = prm.tree_len[b];
  const int64_t M = prm.T * prm.H;
  const bool first = m0 == 0 && blockIdx.y == 0;
  if (first && threadIdx.x == 0)
    record_fault(chk, length_fault(pl, tl, prm.T, prm.S, chk.rule), b, pl, tl, prm.T, prm.S);
  const int nrows = static_cast<int>(M - m0 < 64 ? M - m0 : 64);
  const int ncols = static_cast<int>(prm.d_v - col0 < cols ? prm.d_v - col0 : cols);
  write_rows(prm.out, prm.lse, b * M + m0, nrows, static_cast<int>(prm.d_v), col0, ncols, blockIdx.y == 0, quiet_nan(),
             quiet_nan());
}

// ---------------------------------------------------------------------------------------
// Split-KV (verify_attn.cuh, verify_attn_split; docs/ops/verify_attn.md, "Split-KV")
// ---------------------------------------------------------------------------------------
//
// The mma and wgmma kernels run gridDim.x = B * items_per_req blocks.  Item w of request b
// with row_tiles r and s splits (verify_attn_split): w < r * s is split w / r of row tile
// w % r (the blocks reading one split's keys adjacent); r * s <= w < r * s + (row_tiles_T -
// r) is the padding row tile r + (w - r * s); the rest have nothing to do.  A failing
// request (length_fault) is unsplit: item w < row_tiles_T is row tile w.  A split block
// (splits > 1) writes its partial result to workspace slot (b * slots_per_req + w) -- O
// unnormalised [64][ldo] (rows of the tile, value columns < d_v), then the row max m [64]
// and row sum l [64] -- and the combine kernel merges the slots of each row tile.
struct SplitArgs {
  float* ws;              // the workspace; nullptr: the launch never splits
  int items_per_req;      // blocks per request
  int row_tiles_T;        // ceil(T * H / 64)
  int64_t slots_per_req;  // workspace slots per request
  int64_t slot_floats;    // floats per slot: 64 * ldo + 128
  int ldo;                // row stride of a slot's O (d_v rounded up to 4)
};

// What one block of a split kernel computes.
struct BlockWork {
  bool none;        // nothing to do: return
  bool ok;          // the request's lengths are valid (else: request_failed on its row tile)
  int b, tile, m0;  // request, row tile, its first row m
  int pl, tl;       // the request's lengths
  int j0, j1;       // key tiles [j0, j1)
  int split, splits, row_tiles;
};

__device__ __forceinline__ BlockWork block_work(const SplitArgs& sa, const VerifyAttnProblem& prm, int32_t rule) {
  BlockWork w{};
  const int items = sa.items_per_req;
  w.b = static_cast<int>(blockIdx.x) / items;
  const int item = static_cast<int>(blockIdx.x) - w.b * items;
  w.pl = prm.prefix_len[w.b];
  w.tl = prm.tree_len[w.b];
  w.ok = length_fault(w.pl, w.tl, prm.T, prm.S, rule) == 0;
  w.split = 0;
  w.splits = 1;
  if (!w.ok) {  // (L and the row tiles unused: nothing of the request is read)
    w.none = item >= sa.row_tiles_T;
    w.tile = item;
    w.m0 = item * 64;
    w.row_tiles = 0;
    w.j0 = w.j1 = 0;
    return w;
  }
  const VerifyAttnSplit sp = verify_attn_split(w.pl, w.tl, prm.H);
  const int rt = static_cast<int>(sp.row_tiles);
  const int splits = sa.ws != nullptr ? static_cast<int>(sp.splits) : 1;
  const int tiles = splits > 1 ? static_cast<int>(sp.split_tiles) : static_cast<int>(sp.key_tiles);
  w.row_tiles = rt;
  w.splits = splits;
  if (item < rt * splits) {
    w.split = item / rt;
    w.tile = item - w.split * rt;
    w.j0 = w.split * tiles;
    w.j1 = min(w.j0 + tiles, static_cast<int>(sp.key_tiles));
  } else {
    w.tile = rt + (item - rt * splits);  // a padding row tile (no row with a query)
    w.j0 = w.j1 = 0;
  }
  w.none = w.tile >= sa.row_tiles_T;
  w.m0 = w.tile * 64;
  return w;
}

// The workspace slot of block work w (splits > 1).
__device__ __forceinline__ float* split_slot(const SplitArgs& sa, const BlockWork& w) {
  return sa.ws + (static_cast<int64_t>(w.b) * sa.slots_per_req + static_cast<int64_t>(w.split) * w.row_tiles + w.tile) *
                     sa.slot_floats;
}

// The two query rows a thread holds in a 16-row band of an m16 (mma.sync) or m64
// (wgmma, one band per warp) accumulator: band_row0 + lane / 4 and + 8, in the block's
// tile of rows starting at m0 (m = i*H + h); whether each is a valid row (m < valid_rows
// = tree_len * H) and its visibility row (row 0 of the request for invalid rows, never
// read for them).
struct ThreadRows {
  int r[2];
  bool valid[2];
  const uint8_t* vis[2];
};
__device__ __forceinline__ ThreadRows thread_rows(int band_row0, int lane, int m0, int valid_rows, const uint8_t* vis,
                                                  int b, int T, int H) {
  ThreadRows t;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    t.r[h] = band_row0 + (lane >> 2) + 8 * h;
    const int m = m0 + t.r[h];
    t.valid[h] = m < valid_rows;
    t.vis[h] = vis + (static_cast<int64_t>(b) * T + (t.valid[h] ? m / H : 0)) * T;
  }
  return t;
}

// 16 bytes global -> shared, asynchronously; valid == false writes 16 zero bytes and reads
// nothing (src must still be a valid address).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

}  // namespace va_device
}  // namespace kdtr
