// verify_attn.cu -- CUDA kernels and host launcher for verify_attn (compiled by nvcc only).
//
// Contract: docs/ops/verify_attn.md; CPU backend and shared helpers: verify_attn.cuh;
// design notes and measurements: docs/ops/verify_attn.md, section "Kernel".
//
// MLA-absorb attention is multi-query attention: the H heads of all T tree queries of a
// request share one latent KV.  Both kernels therefore treat a request's queries as one
// matrix of M = T*H rows (row m = i*H + h, contiguous in q) against L = prefix_len +
// tree_len keys, like the two GEMMs of flash attention: a block owns 64 query rows, walks
// the keys in tiles of 64 with an online softmax (running max and sum, max subtracted,
// f32 accumulation), and loads each KV tile once for all heads and tree rows of the block.
// The visibility mask is applied only in tiles that reach past the prefix.  Rows
// i >= tree_len are never loaded (their q rows are not read); they and rows with no
// visible key end with out = 0 and lse = -inf.  Blocks with only such rows skip the
// loop.  Cache rows >= L are zero-filled, never read; visibility is read only at
// [i < tree_len][j < tree_len].  Each block first checks its request's lengths
// (length_fault, verify_attn_device.cuh; verify_attn_launch.h, "The device-side length
// check"): a failing request's blocks write NaN rows, read nothing of it and record it in
// the device error record (g_device_errors below), which device_errors reads.
//
//   mma  (bf16 inputs): 8 warps, Q tile (64 x Dqk) and two KV tiles (64 x Dqk, cp.async
//        double buffer) in shared memory, XOR-swizzled 16-byte chunks for conflict-free
//        ldmatrix.  Warp (r, c), r = warp % 4, c = warp / 4: S[rows 16r.., keys 32c..] =
//        Q K^T with mma.sync m16n8k16 (bf16 in, f32 accumulate, two chains over the key
//        dims); the row max is exchanged with the partner warp through shared memory; P
//        (bf16) goes to shared memory while l sums the unrounded f32 weights; then
//        O[rows 16r.., value cols c*DV/2 ..] += P V with the same mma, V read from the KV
//        tile already in shared memory (values are its first d_v columns).  The d_v = 512
//        accumulator is split over the two warp columns: 128 f32 registers per thread.
//   simt (f32 inputs, or bf16 with dims the mma kernel does not cover): FFMA in f32 (no
//        TF32), 256 threads as 16 x 16; a thread owns 4 query rows x 4 keys of S and 4
//        rows x 4*NJ value columns of O; the 16 threads of a half-warp own whole rows, so
//        row reductions are shuffles.  Q/K are staged 32 dims at a time (transposed,
//        swizzled) and V 64/NJ keys at a time, through a register prefetch one stage ahead
//        and a double-buffered stage in shared memory.  Sums are blocked for accuracy:
//        each 32-dim stage of Q K^T, and each 64-key tile of P V (added to a running O kept
//        in shared memory).  d_v > 512 splits value columns over gridDim.y (S recomputed).

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "verify_attn.cuh"
#include "verify_attn_device.cuh"
#include "verify_attn_launch.h"
#if defined(KDTR_HAVE_WGMMA)
#include "verify_attn_sm90.h"
#endif

namespace kdtr {
namespace {

constexpr int kThreads = 256;
constexpr int kBM = 64;  // query rows (m = i*H + h) per block
constexpr int kBN = 64;  // keys per KV tile
constexpr float kLog2e = 1.4426950408889634f;
constexpr unsigned kFull = 0xffffffffu;
constexpr int64_t kMaxDim = kVerifyAttnMaxDim;  // T*H, S, Dqk bounds (verify_attn.cuh): in-request indices stay int

using namespace va_device;  // neg_inf, finite tests, finish_row, padding rows, cp.async (verify_attn_device.cuh)

// ---------------------------------------------------------------------------------------
// simt: f32 FFMA kernel, any dims
// ---------------------------------------------------------------------------------------
namespace simt {

constexpr int kDK = 32;  // key dims per Q/K stage

// Four consecutive elements row[c0 .. c0+3] widened to f32; those at or past `limit` are
// 0 and not read (limit <= 0: nothing is read).  `vec`: row and c0 allow a vector load.
__device__ __forceinline__ float4 load4(const float* row, int c0, int limit, bool vec) {
  if (vec && c0 + 4 <= limit) return __ldg(reinterpret_cast<const float4*>(row + c0));
  float4 r = make_float4(0.f, 0.f, 0.f, 0.f);
  if (c0 < limit) r.x = __ldg(row + c0);
  if (c0 + 1 < limit) r.y = __ldg(row + c0 + 1);
  if (c0 + 2 < limit) r.z = __ldg(row + c0 + 2);
  if (c0 + 3 < limit) r.w = __ldg(row + c0 + 3);
  return r;
}
__device__ __forceinline__ float4 load4(const uint16_t* row, int c0, int limit, bool vec) {
  if (vec && c0 + 4 <= limit) {
    const uint2 u = __ldg(reinterpret_cast<const uint2*>(row + c0));
    return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u), __uint_as_float(u.y << 16),
                       __uint_as_float(u.y & 0xffff0000u));
  }
  float4 r = make_float4(0.f, 0.f, 0.f, 0.f);
  if (c0 < limit) r.x = bf16_bits_to_float(__ldg(row + c0));
  if (c0 + 1 < limit) r.y = bf16_bits_to_float(__ldg(row + c0 + 1));
  if (c0 + 2 < limit) r.z = bf16_bits_to_float(__ldg(row + c0 + 2));
  if (c0 + 3 < limit) r.w = bf16_bits_to_float(__ldg(row + c0 + 3));
  return r;
}

__device__ __forceinline__ float f4(const float4& v, int k) { return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w; }

template <int NJ>
struct Cfg {
  static constexpr int kDVT = 64 * NJ;                // value columns per block
  static constexpr int kVK = 64 / NJ;                 // keys per V stage (kVK * kDVT = 4096 floats)
  static constexpr int kStageFloats = 2 * kDK * kBM;  // Qt + Kt = 4096 floats
  static_assert(kVK * kDVT == kStageFloats, "a V stage fills one stage buffer");
  // Two stage buffers, P, and the running O: 4 * NJ float4 per thread, [4 * NJ][kThreads].
  static constexpr size_t kSmem = (2 * kStageFloats + kBN * kBM + 16 * NJ * kThreads) * sizeof(float);
};

template <class In, int NJ>
__global__ void __launch_bounds__(kThreads, 1)
    verify_attn_simt_kernel(const __grid_constant__ VerifyAttnProblem prm, int tiles_per_req, VerifyAttnCheck chk) {
  const In* __restrict__ q = static_cast<const In*>(prm.q);
  const In* __restrict__ kv = static_cast<const In*>(prm.kv_cache);
  const int32_t* __restrict__ prefix_len = prm.prefix_len;
  const int32_t* __restrict__ tree_len = prm.tree_len;
  const uint8_t* __restrict__ vis = prm.visibility;
  const float sm_scale = prm.sm_scale;
  const int T = static_cast<int>(prm.T), H = static_cast<int>(prm.H), S = static_cast<int>(prm.S);
  const int Dqk = static_cast<int>(prm.Dqk), d_v = static_cast<int>(prm.d_v);
  float* __restrict__ out = prm.out;
  float* __restrict__ lse = prm.lse;
  using C = Cfg<NJ>;
  extern __shared__ __align__(16) float smem_f[];
  float* const stage0 = smem_f;
  float* const stage1 = smem_f + C::kStageFloats;
  float* const Pt = smem_f + 2 * C::kStageFloats;  // [key][row], P of the current tile
  // The running O of this thread's 4 rows x 4*NJ columns, rescaled and added to once per
  // tile: the registers o sum one tile's 64 keys (blocked summation keeps the f32 error of
  // P V over thousands of keys at the 1e-5 target, docs/ops/verify_attn.md).
  float4* const Ot = reinterpret_cast<float4*>(Pt + kBN * kBM);

  const int b = static_cast<int>(blockIdx.x) / tiles_per_req;
  const int m0 = (static_cast<int>(blockIdx.x) - b * tiles_per_req) * kBM;
  const int vbase = static_cast<int>(blockIdx.y) * C::kDVT;  // first value column of this block
  // The lengths first (verify_attn_launch.h): nothing of a failing request is read.
  if (length_fault(prefix_len[b], tree_len[b], prm.T, prm.S, chk.rule) != 0) {
    request_failed(chk, prm, b, m0, vbase, C::kDVT);
    return;
  }
  const int M = T * H;
  const int pl = prefix_len[b], tl = tree_len[b];
  const int valid_rows = tl * H, L = pl + tl;
  const int64_t row_base = static_cast<int64_t>(b) * M;
  const int ncols = min(C::kDVT, d_v - vbase);
  if (m0 >= valid_rows) {
    write_padding_rows(out, lse, row_base + m0, min(kBM, M - m0), d_v, vbase, ncols, blockIdx.y == 0);
    return;
  }

  const int tid = static_cast<int>(threadIdx.x), ty = tid >> 4, tx = tid & 15;
  const In* const q_req = q + row_base * Dqk;
  const In* const kv_req = kv + static_cast<int64_t>(b) * S * Dqk;
  const uint8_t* const vis_req = vis + static_cast<int64_t>(b) * T * T;
  const bool vec = (Dqk & 3) == 0;
  const int nq = (Dqk + kDK - 1) / kDK;
  const int ntiles = (L + kBN - 1) / kBN;

  float4 pf[4];  // the next stage, prefetched

  // Q/K stage st of tile j: dims [st*kDK, +kDK) of the block's 64 q rows and the tile's keys.
  auto fetch_qk = [&](int j, int st) {
    const int d0 = st * kDK;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int g = tid + kThreads * e, row = g >> 3, dg = g & 7;
      const int m = m0 + row;
      const bool ok = m < valid_rows;
      pf[e] = load4(q_req + (ok ? static_cast<int64_t>(m) * Dqk + d0 : 0), 4 * dg, ok ? Dqk - d0 : 0, vec);
      const int p = j * kBN + row;
      const bool okk = p < L;
      pf[2 + e] = load4(kv_req + (okk ? static_cast<int64_t>(p) * Dqk + d0 : 0), 4 * dg, okk ? Dqk - d0 : 0, vec);
    }
  };
  // V stage v of tile j: keys [j*kBN + v*kVK, +kVK), value columns [vbase, vbase + kDVT).
  auto fetch_v = [&](int j, int v) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int g = tid + kThreads * e, key = g / (C::kDVT / 4), cg = g % (C::kDVT / 4);
      const int p = j * kBN + v * C::kVK + key;
      const bool ok = p < L;
      pf[e] = load4(kv_req + (ok ? static_cast<int64_t>(p) * Dqk + vbase : 0), 4 * cg, ok ? d_v - vbase : 0, vec);
    }
  };
  // Qt[d][row] and Kt[d][key]: 64 floats per dim, groups of 4 rows XOR-swizzled by d / 4 so
  // that the transposing stores are conflict-free and the compute reads stay float4.
  auto store_qk = [&](float* buf) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int g = tid + kThreads * (e & 1), row = g >> 3, dg = g & 7;
      float* dst = buf + (e >> 1) * (kDK * kBM) + 4 * ((row >> 2) ^ dg) + (row & 3);
#pragma unroll
      for (int k = 0; k < 4; ++k) dst[(4 * dg + k) * kBM] = f4(pf[e], k);
    }
  };
  // clean: non-finite values stored as 0 (tiles with a non-finite raw score only).
  auto store_v = [&](float* buf, bool clean) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int g = tid + kThreads * e, key = g / (C::kDVT / 4), cg = g % (C::kDVT / 4);
      float4 x = pf[e];
      if (clean) x = make_float4(finite_or_zero(x.x), finite_or_zero(x.y), finite_or_zero(x.z), finite_or_zero(x.w));
      *reinterpret_cast<float4*>(buf + key * C::kDVT + 4 * cg) = x;
    }
  };

  float o[4][NJ][4];
#pragma unroll
  for (int a = 0; a < 4; ++a)
#pragma unroll
    for (int jj = 0; jj < NJ; ++jj)
#pragma unroll
      for (int k = 0; k < 4; ++k) o[a][jj][k] = 0.0f;
  float m_run[4], l_run[4];
#pragma unroll
  for (int a = 0; a < 4; ++a) {
    m_run[a] = neg_inf();
    l_run[a] = 0.0f;
#pragma unroll
    for (int jj = 0; jj < NJ; ++jj) Ot[(a * NJ + jj) * kThreads + tid] = make_float4(0.f, 0.f, 0.f, 0.f);
  }

  int cur = 0;
  fetch_qk(0, 0);
  for (int j = 0; j < ntiles; ++j) {
    const int p0 = j * kBN;
    float s[4][4];
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
      for (int k = 0; k < 4; ++k) s[a][k] = 0.0f;

    // S = Q K^T over the key dims, one 32-dim stage at a time.
    for (int st = 0; st < nq; ++st) {
      float* buf = cur ? stage1 : stage0;
      store_qk(buf);
      __syncthreads();
      if (st + 1 < nq) fetch_qk(j, st + 1);
      else fetch_v(j, 0);
      const float* Qt = buf;
      const float* Kt = buf + kDK * kBM;
      // Blocked summation: each 32-dim stage sums into t, then into s (f32 dot products
      // over 576 dims summed in one chain err ~3x more; see docs/ops/verify_attn.md).
      float t[4][4];
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int c = 0; c < 4; ++c) t[a][c] = 0.0f;
#pragma unroll 8
      for (int k = 0; k < kDK; ++k) {
        const int sw = k >> 2;
        const float4 qa = *reinterpret_cast<const float4*>(Qt + k * kBM + 4 * (ty ^ sw));
        const float4 kb = *reinterpret_cast<const float4*>(Kt + k * kBM + 4 * (tx ^ sw));
#pragma unroll
        for (int a = 0; a < 4; ++a)
#pragma unroll
          for (int c = 0; c < 4; ++c) t[a][c] = fmaf(f4(qa, a), f4(kb, c), t[a][c]);
      }
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int c = 0; c < 4; ++c) s[a][c] += t[a][c];
      cur ^= 1;
    }

    // Any non-finite raw score in this thread's part of S (before the mask): the V stages
    // of this tile are stored with non-finite values as 0 (see finish_row).
    bool raw_nonfinite = false;
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
      for (int c = 0; c < 4; ++c) raw_nonfinite |= !finite_f(s[a][c]);

    // Mask, scale, online softmax; P to shared memory (this half-warp's rows only).
    const bool prefix_tile = p0 + kBN <= pl;
#pragma unroll
    for (int a = 0; a < 4; ++a) {
      const int m = m0 + 4 * ty + a;
      const bool rv = m < valid_rows;
      const uint8_t* vrow = vis_req + static_cast<int64_t>(rv ? m / H : 0) * T;
      float mx = neg_inf();
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        bool visible = rv;
        if (!prefix_tile && rv) visible = verify_attn_key_visible(pl, tl, vrow, p0 + 4 * tx + c);
        s[a][c] = visible ? s[a][c] * sm_scale : neg_inf();
        mx = verify_attn_max(mx, s[a][c]);
      }
#pragma unroll
      for (int off = 1; off < 16; off <<= 1) mx = verify_attn_max(mx, __shfl_xor_sync(kFull, mx, off));
      const float m_new = verify_attn_max(m_run[a], mx);
      const float m_use = m_new == neg_inf() ? 0.0f : m_new;
      const float alpha = exp2f((m_run[a] - m_use) * kLog2e);
      m_run[a] = m_new;
      float sum = 0.0f;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        s[a][c] = exp2f((s[a][c] - m_use) * kLog2e);
        sum += s[a][c];
      }
      l_run[a] = l_run[a] * alpha + sum;
#pragma unroll
      for (int jj = 0; jj < NJ; ++jj) {  // this thread's own slots: no barrier needed
        float4& t = Ot[(a * NJ + jj) * kThreads + tid];
        t = make_float4(t.x * alpha, t.y * alpha, t.z * alpha, t.w * alpha);
      }
    }
    __syncwarp();  // this warp's reads of Pt (previous tile) are done
#pragma unroll
    for (int c = 0; c < 4; ++c)
      *reinterpret_cast<float4*>(Pt + (4 * tx + c) * kBM + 4 * ty) = make_float4(s[0][c], s[1][c], s[2][c], s[3][c]);
    __syncwarp();

    // O += P V, kVK keys at a time.  The first stage's barrier also tells the block
    // whether any raw score of the tile was non-finite (clean: see finish_row); if so, that
    // stage is stored again cleaned (same thread, same slots) before anyone reads it.
    bool clean = false;
#pragma unroll 1
    for (int v = 0; v < NJ; ++v) {
      float* buf = cur ? stage1 : stage0;
      store_v(buf, clean);
      if (v == 0) {
        clean = __syncthreads_or(raw_nonfinite) != 0;
        if (clean) {
          store_v(buf, true);
          __syncthreads();
        }
      } else {
        __syncthreads();
      }
      if (v + 1 < NJ) fetch_v(j, v + 1);
      else if (j + 1 < ntiles) fetch_qk(j + 1, 0);
#pragma unroll 2
      for (int kk = 0; kk < C::kVK; ++kk) {
        const float4 pp = *reinterpret_cast<const float4*>(Pt + (v * C::kVK + kk) * kBM + 4 * ty);
#pragma unroll
        for (int jj = 0; jj < NJ; ++jj) {
          const float4 vv = *reinterpret_cast<const float4*>(buf + kk * C::kDVT + 64 * jj + 4 * tx);
#pragma unroll
          for (int a = 0; a < 4; ++a) {
            const float pa = f4(pp, a);
            o[a][jj][0] = fmaf(pa, vv.x, o[a][jj][0]);
            o[a][jj][1] = fmaf(pa, vv.y, o[a][jj][1]);
            o[a][jj][2] = fmaf(pa, vv.z, o[a][jj][2]);
            o[a][jj][3] = fmaf(pa, vv.w, o[a][jj][3]);
          }
        }
      }
      cur ^= 1;
    }
    // Running O += this tile's sums; o restarts from zero.
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
      for (int jj = 0; jj < NJ; ++jj) {
        float4& t = Ot[(a * NJ + jj) * kThreads + tid];
        t = make_float4(t.x + o[a][jj][0], t.y + o[a][jj][1], t.z + o[a][jj][2], t.w + o[a][jj][3]);
        o[a][jj][0] = o[a][jj][1] = o[a][jj][2] = o[a][jj][3] = 0.0f;
      }
  }

  // Epilogue: the row sums over the half-warp, then out = O / l and lse = m + log(l).
#pragma unroll
  for (int a = 0; a < 4; ++a) {
    float l = l_run[a];
#pragma unroll
    for (int off = 1; off < 16; off <<= 1) l += __shfl_xor_sync(kFull, l, off);
    const int m = m0 + 4 * ty + a;
    if (m >= M) continue;
    const bool rv = m < valid_rows;
    const RowResult res = finish_row(l, rv, pl, tl, vis_req + static_cast<int64_t>(rv ? m / H : 0) * T);
    float* orow = out + (row_base + m) * d_v;
#pragma unroll
    for (int jj = 0; jj < NJ; ++jj) {
      const int col = vbase + 64 * jj + 4 * tx;
      const float4 t = Ot[(a * NJ + jj) * kThreads + tid];
      const float acc[4] = {t.x, t.y, t.z, t.w};
      float r[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) r[k] = res.nan ? quiet_nan() : res.zero ? 0.0f : acc[k] / l;
      if ((d_v & 3) == 0 && col + 4 <= d_v) {
        *reinterpret_cast<float4*>(orow + col) = make_float4(r[0], r[1], r[2], r[3]);
      } else {
#pragma unroll
        for (int k = 0; k < 4; ++k)
          if (col + k < d_v && col + k < vbase + C::kDVT) orow[col + k] = r[k];
      }
    }
    if (blockIdx.y == 0 && tx == 0)
      lse[row_base + m] = res.nan ? quiet_nan() : res.zero ? neg_inf() : m_run[a] + logf(l);
  }
}

}  // namespace simt

// ---------------------------------------------------------------------------------------
// mma: bf16 tensor-core kernel (mma.sync m16n8k16, f32 accumulation)
// ---------------------------------------------------------------------------------------
namespace mma {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
// d += a (16x16 bf16, row) * b (16x8 bf16, col), f32 accumulators.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Byte offset of 16-byte chunk `chunk` of row `row` in a tile of rows of `row_bytes`
// (a multiple of 128): chunks are XOR-swizzled by row % 8, so the 8 rows that one
// ldmatrix 8x8 reads fall in 8 different bank groups.
__device__ __forceinline__ uint32_t swz(int row, int chunk, int row_bytes) {
  return static_cast<uint32_t>(row * row_bytes + ((chunk ^ (row & 7)) << 4));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);  // .x (low half) = lo
  uint32_t u;
  memcpy(&u, &h, sizeof u);
  return u;
}

// Tile shapes.  Warp (wr, wc), wr = warp % 4, wc = warp / 4, owns S rows 16 wr.. x keys
// 32 wc.. and O rows 16 wr.. x value columns wc DV/2 ...  (A 2 x 4 layout for O, 32 rows x
// DV/4 columns per warp, halves the V fragment loads but measured no faster: 1.309 vs
// 1.319 ms at K2 dims, docs/ops/verify_attn.md.)
template <int DQK, int DV>
struct Cfg {
  static_assert(DQK % 64 == 0 && DV % 64 == 0 && DV <= DQK, "tile shape");
  static constexpr int kChunks = DQK / 8;  // 16-byte chunks per tile row
  static constexpr int kRowBytes = DQK * 2;
  static constexpr int kTileBytes = kBM * kRowBytes;  // Q tile; each KV tile has kBN == kBM rows
  static constexpr int kPRowBytes = kBN * 2;          // 128
  static constexpr int kPBytes = kBM * kPRowBytes;
  static constexpr int kKSteps = DQK / 16;
  static constexpr int kKHalf = kKSteps / 2;  // S accumulates k-steps [0, kKHalf) and the rest apart
  static constexpr int kOCols = DV / 2;       // value columns of O per warp
  static constexpr int kONT = kOCols / 8;     // n-tiles of 8 columns per warp
  // Q, two KV tiles, P, then the row-max and row-sum exchange, [2][64] floats each.
  static constexpr size_t kSmem = 3 * static_cast<size_t>(kTileBytes) + kPBytes + 4 * kBM * sizeof(float);
};

template <int DQK, int DV>
__global__ void __launch_bounds__(kThreads, 1)
    verify_attn_mma_kernel(const __grid_constant__ VerifyAttnProblem prm, SplitArgs sa, VerifyAttnCheck chk) {
  const uint16_t* __restrict__ q = static_cast<const uint16_t*>(prm.q);
  const uint16_t* __restrict__ kv = static_cast<const uint16_t*>(prm.kv_cache);
  const uint8_t* __restrict__ vis = prm.visibility;
  const float sm_scale = prm.sm_scale;
  const int T = static_cast<int>(prm.T), H = static_cast<int>(prm.H), S = static_cast<int>(prm.S);
  const int Dqk = static_cast<int>(prm.Dqk), d_v = static_cast<int>(prm.d_v);
  float* __restrict__ out = prm.out;
  float* __restrict__ lse = prm.lse;
  using C = Cfg<DQK, DV>;
  extern __shared__ __align__(128) uint8_t smem[];

  if (sa.ws != nullptr) pdl_launch_dependents();  // the combine kernel follows: it may be scheduled now
  // The block's request, row tile and key tiles (split-KV), its lengths checked first
  // (verify_attn_launch.h): nothing of a failing request is read.
  const BlockWork work = block_work(sa, prm, chk.rule);
  if (work.none) return;
  const int b = work.b, m0 = work.m0;
  const int M = T * H;
  const int pl = work.pl, tl = work.tl;
  const bool ok = work.ok;
  // (L wraps, unused, where !ok: unsigned, so that no signed overflow is evaluated.)
  const int valid_rows = ok ? tl * H : 0, L = static_cast<int>(static_cast<uint32_t>(pl) + static_cast<uint32_t>(tl));
  const int64_t row_base = static_cast<int64_t>(b) * M;
  if (m0 >= valid_rows) {  // padding rows only, or a failing request
    if (ok) write_padding_rows(out, lse, row_base + m0, min(kBM, M - m0), d_v, 0, d_v, true);
    else request_failed(chk, prm, b, m0, 0, d_v);
    return;
  }

  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int wr = warp & 3, wc = warp >> 2, gid = lane >> 2, tig = lane & 3;
  const int ocol0 = wc * C::kOCols;  // this warp's first value column
  const uint32_t sQ = smem_u32(smem);
  const uint32_t sKV0 = sQ + C::kTileBytes, sKV1 = sQ + 2 * C::kTileBytes;
  const uint32_t sP = sQ + 3 * C::kTileBytes;
  uint8_t* const P_bytes = smem + 3 * C::kTileBytes;
  float* const red_max = reinterpret_cast<float*>(smem + 3 * C::kTileBytes + C::kPBytes);  // [2][kBM]
  float* const red_sum = red_max + 2 * kBM;                                                // [2][kBM]

  const uint16_t* const q_req = q + row_base * Dqk;
  const uint16_t* const kv_req = kv + static_cast<int64_t>(b) * S * Dqk;
  const int dchunks = Dqk >> 3;

  // Q tile (rows past the valid ones and dims past Dqk: zeros), then KV tile 0.
  for (int idx = tid; idx < kBM * C::kChunks; idx += kThreads) {
    const int row = idx / C::kChunks, ch = idx - row * C::kChunks;
    const bool ok = m0 + row < valid_rows && ch < dchunks;
    cp_async16(sQ + swz(row, ch, C::kRowBytes), ok ? q_req + static_cast<int64_t>(m0 + row) * Dqk + ch * 8 : q, ok);
  }
  auto load_kv = [&](int tile, uint32_t dst) {
    const int p0 = tile * kBN;
    for (int idx = tid; idx < kBN * C::kChunks; idx += kThreads) {
      const int row = idx / C::kChunks, ch = idx - row * C::kChunks;
      const bool ok = p0 + row < L && ch < dchunks;
      cp_async16(dst + swz(row, ch, C::kRowBytes), ok ? kv_req + static_cast<int64_t>(p0 + row) * Dqk + ch * 8 : kv,
                 ok);
    }
  };
  load_kv(work.j0, sKV0);
  cp_async_commit();

  // This thread's two rows (in the block) and their visibility rows (the mma kernel keeps
  // its own copy of thread_rows' arithmetic: through the struct, ptxas spilled 16 bytes at
  // 255 registers).
  const int rr[2] = {wr * 16 + gid, wr * 16 + gid + 8};
  bool rv[2];
  const uint8_t* vrow[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int m = m0 + rr[h];
    rv[h] = m < valid_rows;
    vrow[h] = vis + (static_cast<int64_t>(b) * T + (rv[h] ? m / H : 0)) * T;
  }

  float o[C::kONT][4];
#pragma unroll
  for (int n = 0; n < C::kONT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m_run[2] = {neg_inf(), neg_inf()}, l_run[2] = {0.0f, 0.0f};

  // Key tiles [j0, j1) of the block's split (all of them unsplit); buffer (j - j0) & 1.
  const int j0 = work.j0, j1 = work.j1;
  for (int j = j0; j < j1; ++j) {
    const int odd = (j - j0) & 1;
    cp_async_wait_all();
    __syncthreads();  // KV tile j (and Q) visible; every warp is done with tile j-1
    if (j + 1 < j1) {
      load_kv(j + 1, odd ? sKV0 : sKV1);
      cp_async_commit();
    }
    const uint32_t sK = odd ? sKV1 : sKV0;

    // S[16 rows, 32 keys] = Q K^T, in two chains over the key dims summed at the end: the
    // tensor cores' f32 accumulation drifts with the number of accumulate steps and the
    // accumulator's size (lse error at K2 dims 1.4e-5 with one chain, docs/ops/verify_attn.md).
    float s[4][4], s2[4][4];
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = s2[n][e] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < C::kKSteps; ++ks) {
      uint32_t a[4];
      ldsm_x4(sQ + swz(wr * 16 + (lane & 15), ks * 2 + (lane >> 4), C::kRowBytes), a);
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        uint32_t bb[4];
        ldsm_x4(sK + swz(wc * 32 + np * 16 + (lane & 7) + ((lane >> 4) << 3), ks * 2 + ((lane >> 3) & 1), C::kRowBytes),
                bb);
        if (ks < C::kKHalf) {
          mma_bf16(s[2 * np], a, bb[0], bb[1]);
          mma_bf16(s[2 * np + 1], a, bb[2], bb[3]);
        } else {
          mma_bf16(s2[2 * np], a, bb[0], bb[1]);
          mma_bf16(s2[2 * np + 1], a, bb[2], bb[3]);
        }
      }
    }
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] += s2[n][e];
    // Any non-finite raw score (before the mask): the tile is cleaned before P V (finish_row).
    bool raw_nonfinite = false;
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) raw_nonfinite |= !finite_f(s[n][e]);

    // Mask and scale; the row max of this warp's 32 keys, exchanged with the partner warp.
    const int p0 = j * kBN;
    const bool prefix_tile = p0 + kBN <= pl;
    float mx[2] = {neg_inf(), neg_inf()};
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e >> 1;
        bool visible = rv[h];
        if (!prefix_tile && visible)
          visible = verify_attn_key_visible(pl, tl, vrow[h], p0 + wc * 32 + n * 8 + 2 * tig + (e & 1));
        s[n][e] = visible ? s[n][e] * sm_scale : neg_inf();
        mx[h] = verify_attn_max(mx[h], s[n][e]);
      }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = verify_attn_max(mx[h], __shfl_xor_sync(kFull, mx[h], 1));
      mx[h] = verify_attn_max(mx[h], __shfl_xor_sync(kFull, mx[h], 2));
    }
    if (tig == 0) {
      red_max[wc * kBM + rr[0]] = mx[0];
      red_max[wc * kBM + rr[1]] = mx[1];
    }
    // Every warp is done reading this KV tile for S; if any raw score of the block was
    // non-finite, its non-finite elements become 0 (the "P complete" barrier below orders
    // these writes before P V reads the tile).
    if (__syncthreads_or(raw_nonfinite)) {
      uint4* const tile = reinterpret_cast<uint4*>(smem + (odd ? 2 : 1) * C::kTileBytes);
      for (int idx = tid; idx < kBN * C::kChunks; idx += kThreads) {
        uint4 u = tile[idx];
        u.x = bf16x2_finite_or_zero(u.x);
        u.y = bf16x2_finite_or_zero(u.y);
        u.z = bf16x2_finite_or_zero(u.z);
        u.w = bf16x2_finite_or_zero(u.w);
        tile[idx] = u;
      }
    }

    float m_use[2], alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float m_new = verify_attn_max(m_run[h], verify_attn_max(mx[h], red_max[(wc ^ 1) * kBM + rr[h]]));
      m_use[h] = m_new == neg_inf() ? 0.0f : m_new;
      alpha[h] = exp2f((m_run[h] - m_use[h]) * kLog2e);
      m_run[h] = m_new;
    }
    // P = exp(s - m): l sums it in f32; P.V uses it rounded to bf16 (the tensor cores'
    // input), a relative error of at most 2^-9 per weight in out, none in lse.
    float lsum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float pa = exp2f((s[n][2 * h] - m_use[h]) * kLog2e);
        const float pb = exp2f((s[n][2 * h + 1] - m_use[h]) * kLog2e);
        lsum[h] += pa + pb;
        *reinterpret_cast<uint32_t*>(P_bytes + swz(rr[h], wc * 4 + n, C::kPRowBytes) + 4 * tig) = pack_bf16(pa, pb);
      }
#pragma unroll
    for (int h = 0; h < 2; ++h) l_run[h] = l_run[h] * alpha[h] + lsum[h];
    __syncthreads();  // P complete

    // O *= alpha (per row), then O += P[16 rows, 64 keys] V[64 keys, this warp's columns].
#pragma unroll
    for (int n = 0; n < C::kONT; ++n) {
      o[n][0] *= alpha[0];
      o[n][1] *= alpha[0];
      o[n][2] *= alpha[1];
      o[n][3] *= alpha[1];
    }
#pragma unroll
    for (int ks = 0; ks < kBN / 16; ++ks) {
      uint32_t a[4];
      ldsm_x4(sP + swz(wr * 16 + (lane & 15), ks * 2 + (lane >> 4), C::kPRowBytes), a);
#pragma unroll
      for (int np = 0; np < C::kONT / 2; ++np) {
        uint32_t bb[4];
        ldsm_x4_trans(sK + swz(ks * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), (ocol0 + np * 16) / 8 + (lane >> 4),
                               C::kRowBytes),
                      bb);
        mma_bf16(o[2 * np], a, bb[0], bb[1]);
        mma_bf16(o[2 * np + 1], a, bb[2], bb[3]);
      }
    }
  }

  // Epilogue: full row sums (quad, then partner warp), out = O / l, lse = m + log(l).
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_run[h] += __shfl_xor_sync(kFull, l_run[h], 1);
    l_run[h] += __shfl_xor_sync(kFull, l_run[h], 2);
  }
  if (tig == 0) {
    red_sum[wc * kBM + rr[0]] = l_run[0];
    red_sum[wc * kBM + rr[1]] = l_run[1];
  }
  __syncthreads();
  if (work.splits > 1) {  // the partial result: O unnormalised, m and l per row (combine_kernel)
    float* const slot = split_slot(sa, work);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float* const orow = slot + static_cast<int64_t>(rr[h]) * sa.ldo;
#pragma unroll
      for (int n = 0; n < C::kONT; ++n) {
        const int col = ocol0 + n * 8 + 2 * tig;
        if (col < d_v) *reinterpret_cast<float2*>(orow + col) = make_float2(o[n][2 * h], o[n][2 * h + 1]);
      }
      if (wc == 0 && tig == 0) {
        slot[kBM * sa.ldo + rr[h]] = m_run[h];
        slot[kBM * sa.ldo + kBM + rr[h]] = l_run[h] + red_sum[kBM + rr[h]];
      }
    }
    return;
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int m = m0 + rr[h];
    if (m >= M) continue;
    const float l = l_run[h] + red_sum[(wc ^ 1) * kBM + rr[h]];
    const RowResult res = finish_row(l, rv[h], pl, tl, vrow[h]);
    float* orow = out + (row_base + m) * d_v;
#pragma unroll
    for (int n = 0; n < C::kONT; ++n) {
      const int col = ocol0 + n * 8 + 2 * tig;
      const float v0 = res.nan ? quiet_nan() : res.zero ? 0.0f : o[n][2 * h] / l;
      const float v1 = res.nan ? quiet_nan() : res.zero ? 0.0f : o[n][2 * h + 1] / l;
      if ((d_v & 1) == 0 && col + 2 <= d_v) {
        *reinterpret_cast<float2*>(orow + col) = make_float2(v0, v1);
      } else {
        if (col < d_v) orow[col] = v0;
        if (col + 1 < d_v) orow[col + 1] = v1;
      }
    }
    if (wc == 0 && tig == 0) lse[row_base + m] = res.nan ? quiet_nan() : res.zero ? neg_inf() : m_run[h] + logf(l);
  }
}

}  // namespace mma

// ---------------------------------------------------------------------------------------
// The device error record and the check-only kernel
// ---------------------------------------------------------------------------------------

// One per device (each context loads its own copy of the module), zero at load.
__device__ DeviceErrorRecord g_device_errors;

// The length check alone, one thread per request: for launches with no out rows (T * H ==
// 0), which launch no attention block, so that a failing request is still recorded.
__global__ void __launch_bounds__(kThreads)
    verify_attn_check_kernel(const __grid_constant__ VerifyAttnProblem prm, VerifyAttnCheck chk) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (b >= prm.B) return;
  const int32_t pl = prm.prefix_len[b], tl = prm.tree_len[b];
  const int32_t field = length_fault(pl, tl, prm.T, prm.S, chk.rule);
  if (field != 0) record_fault(chk, field, b, pl, tl, prm.T, prm.S);
}

// ---------------------------------------------------------------------------------------
// combine: the split-KV merge (verify_attn_device.cuh, SplitArgs)
// ---------------------------------------------------------------------------------------
//
// One block per 16 rows of a row tile of each request and 64 value columns (gridDim.x =
// B * row_tiles_T * 4, gridDim.y = ceil(d_v / 64)); blocks of requests that did not split (or
// failed the length check, or of padding tiles) return at once.  Row r of the tile, split
// s: O_s (unnormalised), m_s, l_s.  With M = the NaN-propagating max of the m_s (m_use = 0
// where M = -inf) and w_s = exp(m_s - m_use), the row's sum is l = sum_s w_s l_s (in split
// order) and out = (sum_s w_s O_s) / l, lse = M + log(l): the online softmax's rescaling
// applied once per split instead of once per tile, decided by finish_row like the unsplit
// kernels (a NaN m_s or l_s makes l NaN).  A thread owns 1 row x 4 columns.  It issues
// all its loads at once -- lane j of a row's 16 threads m_j and l_j, every thread its 4
// columns of each O_s -- and the row's 16 threads exchange the m_s, l_s and w_s / l by
// shuffles, folded in split order (the same operations, in the same order, as one thread
// per row would do), so the block has no barrier and no shared memory, and its only wait
// is one round trip to memory.  (A chain of dependent loads per element was
// latency-bound: 350 us at B = 1, T = 9, prefix 4096; weights by 16 threads, a barrier,
// then the O_s loads: two round trips.)  Launched with programmatic dependent launch where
// the device has it (VerifyAttnPlan::pdl): pdl_wait_primary first, in every block.
constexpr int kCombineCols = 64;
constexpr int kCombineRows = 16;  // rows per block: kThreads / (kCombineCols / 4)
__global__ void __launch_bounds__(kThreads)
    verify_attn_combine_kernel(const __grid_constant__ VerifyAttnProblem prm, SplitArgs sa, VerifyAttnCheck chk) {
  pdl_wait_primary();  // the attention grid's partials are complete and visible past this point
  constexpr int kQuarters = kBM / kCombineRows;
  const int b = static_cast<int>(blockIdx.x) / (sa.row_tiles_T * kQuarters);
  const int tq = static_cast<int>(blockIdx.x) - b * sa.row_tiles_T * kQuarters;
  const int tile = tq / kQuarters, r0 = (tq - tile * kQuarters) * kCombineRows;  // rows [r0, r0 + 16) of the tile
  const int pl = prm.prefix_len[b], tl = prm.tree_len[b];
  if (sa.ws == nullptr || length_fault(pl, tl, prm.T, prm.S, chk.rule) != 0) return;
  const VerifyAttnSplit sp = verify_attn_split(pl, tl, prm.H);
  const int splits = static_cast<int>(sp.splits), rt = static_cast<int>(sp.row_tiles);
  if (splits <= 1 || tile >= rt) return;
  const int T = static_cast<int>(prm.T), H = static_cast<int>(prm.H), d_v = static_cast<int>(prm.d_v);
  const int M = T * H, m0 = tile * kBM, valid_rows = tl * H;
  const int rows = min(kBM, M - m0);
  const int tid = static_cast<int>(threadIdx.x);
  const int k = tid >> 4, r = r0 + k;  // this thread's row: k of the 16
  const int lane16 = tid & 15, c = static_cast<int>(blockIdx.y) * kCombineCols + 4 * lane16;  // and its 4 columns
  const int64_t row_base = static_cast<int64_t>(b) * M + m0;
  const float* const slot0 =
      sa.ws + (static_cast<int64_t>(b) * sa.slots_per_req + tile) * sa.slot_floats;  // split s: + s * rt slots
  const int64_t split_stride = static_cast<int64_t>(rt) * sa.slot_floats;
  const int ml = kBM * sa.ldo;  // m [64] then l [64] after a slot's O
  // rv: the row exists and has a query (the same for the 16 threads of a row).
  const bool rv = r < rows && m0 + r < valid_rows, has_cols = c < d_v;

  // Loads: lane j of the row's 16 threads reads m_j and l_j; every thread its 4 columns of
  // each O_s.  The 16 m_s, l_s reach every thread of the row by shuffles below, in split order.
  float m_lane = neg_inf(), l_lane = 0.0f;
  float4 part[kVerifyAttnMaxSplits];
#pragma unroll
  for (int s = 0; s < kVerifyAttnMaxSplits; ++s) part[s] = make_float4(0.f, 0.f, 0.f, 0.f);
  if (rv) {
    if (lane16 < splits) {
      m_lane = slot0[lane16 * split_stride + ml + r];
      l_lane = slot0[lane16 * split_stride + ml + kBM + r];
    }
    if (has_cols) {
      const float* const src = slot0 + static_cast<int64_t>(r) * sa.ldo + c;
#pragma unroll
      for (int s = 0; s < kVerifyAttnMaxSplits; ++s)
        if (s < splits) part[s] = __ldcs(reinterpret_cast<const float4*>(src + s * split_stride));
    }
  }
  // Every thread of the block runs the shuffles (no exit before them; splits is the block's).
  constexpr unsigned kAll = 0xffffffffu;
  float mx = neg_inf();
#pragma unroll
  for (int s = 0; s < kVerifyAttnMaxSplits; ++s)
    if (s < splits) mx = verify_attn_max(mx, __shfl_sync(kAll, m_lane, s, 16));
  const float m_use = mx == neg_inf() ? 0.0f : mx;
  float l = 0.0f;
#pragma unroll
  for (int s = 0; s < kVerifyAttnMaxSplits; ++s)
    if (s < splits) {
      const float w = exp2f((__shfl_sync(kAll, m_lane, s, 16) - m_use) * kLog2e);
      l += w * __shfl_sync(kAll, l_lane, s, 16);
    }
  if (!rv) l = 0.0f;
  const float wl_lane = exp2f((m_lane - m_use) * kLog2e) / l;  // lane j: w_j / l (used where l is finite, > 0)
  float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int s = 0; s < kVerifyAttnMaxSplits; ++s)
    if (s < splits) {
      const float ws = __shfl_sync(kAll, wl_lane, s, 16);
      v.x = fmaf(ws, part[s].x, v.x);
      v.y = fmaf(ws, part[s].y, v.y);
      v.z = fmaf(ws, part[s].z, v.z);
      v.w = fmaf(ws, part[s].w, v.w);
    }
  if (r >= rows) return;
  const uint8_t* const vrow = prm.visibility + (static_cast<int64_t>(b) * T + (rv ? (m0 + r) / H : 0)) * T;
  const RowResult rr = finish_row(l, rv, pl, tl, vrow);
  if (blockIdx.y == 0 && lane16 == 0) prm.lse[row_base + r] = rr.nan ? quiet_nan() : rr.zero ? neg_inf() : mx + logf(l);
  if (!has_cols) return;
  if (rr.nan || rr.zero) {
    const float x = rr.nan ? quiet_nan() : 0.0f;
    v = make_float4(x, x, x, x);
  }
  float* const orow = prm.out + (row_base + r) * d_v;
  if ((d_v & 3) == 0) {
    *reinterpret_cast<float4*>(orow + c) = v;
  } else {
    const float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int q = 0; q < 4; ++q)
      if (c + q < d_v) orow[c + q] = e[q];
  }
}

// ---------------------------------------------------------------------------------------
// Per-device cache: what the host asks the runtime once per device (device attributes,
// the shared-memory limits set, the record's address), so that a launch does nothing
// slow, synchronizing or capture-unsafe.  Devices >= kCacheDevices are asked every time.
// ---------------------------------------------------------------------------------------

constexpr int kCacheDevices = 64;

struct DeviceCache {
  std::atomic<int> attrs_ready{0};
  std::atomic<int> major{0}, minor{0}, optin{0};
  std::atomic<uint32_t> configured{0};  // bit id: instance id's shared-memory limit set
  std::atomic<DeviceErrorRecord*> record{nullptr};
};
DeviceCache g_device_cache[kCacheDevices];

DeviceCache* device_cache(int device) {
  return device >= 0 && device < kCacheDevices ? &g_device_cache[device] : nullptr;
}

struct DeviceAttrs {
  int major, minor, optin;
};

cudaError_t device_attrs(int device, DeviceAttrs* a) {
  DeviceCache* c = device_cache(device);
  if (c != nullptr && c->attrs_ready.load(std::memory_order_acquire)) {
    *a = {c->major.load(std::memory_order_relaxed), c->minor.load(std::memory_order_relaxed),
          c->optin.load(std::memory_order_relaxed)};
    return cudaSuccess;
  }
  cudaError_t err;
  if ((err = cudaDeviceGetAttribute(&a->major, cudaDevAttrComputeCapabilityMajor, device)) != cudaSuccess ||
      (err = cudaDeviceGetAttribute(&a->minor, cudaDevAttrComputeCapabilityMinor, device)) != cudaSuccess ||
      (err = cudaDeviceGetAttribute(&a->optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device)) != cudaSuccess)
    return err;
  if (c != nullptr) {
    c->major.store(a->major, std::memory_order_relaxed);
    c->minor.store(a->minor, std::memory_order_relaxed);
    c->optin.store(a->optin, std::memory_order_relaxed);
    c->attrs_ready.store(1, std::memory_order_release);
  }
  return cudaSuccess;
}

// The current device's record (its address in that device's copy of the module).
cudaError_t device_record(DeviceErrorRecord** rec) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  DeviceCache* c = device_cache(device);
  if (c != nullptr && (*rec = c->record.load(std::memory_order_acquire)) != nullptr) return cudaSuccess;
  void* addr = nullptr;
  if ((err = cudaGetSymbolAddress(&addr, g_device_errors)) != cudaSuccess) return err;
  *rec = static_cast<DeviceErrorRecord*>(addr);
  if (c != nullptr) c->record.store(*rec, std::memory_order_release);
  return cudaSuccess;
}

// ---------------------------------------------------------------------------------------
// Instances and host launcher
// ---------------------------------------------------------------------------------------

// Instance ids (VerifyAttnPlan::instance).
enum Instance : int {
  kSimtF32Nj1 = 1,
  kSimtF32Nj2,
  kSimtF32Nj4,
  kSimtF32Nj8,
  kSimtBf16Nj1,
  kSimtBf16Nj2,
  kSimtBf16Nj4,
  kSimtBf16Nj8,
  kMmaD128V128,
  kMmaD576V512,
  kWgmma,  // the Hopper kernel (verify_attn_sm90.cu)
};

struct InstanceInfo {
  const void* fn;  // the __global__ function (for cudaFuncSetAttribute / launch)
  size_t smem;
  int dvt;  // value columns per block (gridDim.y splits d_v beyond it); 0: all
  const char* name;
};

InstanceInfo instance_info(int id) {
  switch (id) {
    case kSimtF32Nj1:
      return {reinterpret_cast<const void*>(&simt::verify_attn_simt_kernel<float, 1>), simt::Cfg<1>::kSmem, 64,
              "simt_f32_dvt64"};
    case kSimtF32Nj2:
      return {reinterpret_cast<const void*>(&simt::verify_attn_simt_kernel<float, 2>), simt::Cfg<2>::kSmem, 128,
              "simt_f32_dvt128"};
    case kSimtF32Nj4:
      return {reinterpret_cast<const void*>(&simt::verify_attn_simt_kernel<float, 4>), simt::Cfg<4>::kSmem, 256,
              "simt_f32_dvt256"};
    case kSimtF32Nj8:
      return {reinterpret_cast<const void*>(&simt::verify_attn_simt_kernel<float, 8>), simt::Cfg<8>::kSmem, 512,
              "simt_f32_dvt512"};
    case kSimtBf16Nj1:
      return {reinterpret_cast<const void*>(&simt::verify_attn_simt_kernel<uint16_t, 1>), simt::Cfg<1>::kSmem, 64,
              "simt_bf16_dvt64"};
    case kSimtBf16Nj2:
      return {reinterpret_cast<const void*>(&simt::verify_attn_simt_kernel<uint16_t, 2>), simt::Cfg<2>::kSmem, 128,
              "simt_bf16_dvt128"};
    case kSimtBf16Nj4:
      return {reinterpret_cast<const void*>(&simt::verify_attn_simt_kernel<uint16_t, 4>), simt::Cfg<4>::kSmem, 256,
              "simt_bf16_dvt256"};
    case kSimtBf16Nj8:
      return {reinterpret_cast<const void*>(&simt::verify_attn_simt_kernel<uint16_t, 8>), simt::Cfg<8>::kSmem, 512,
              "simt_bf16_dvt512"};
    case kMmaD128V128:
      return {reinterpret_cast<const void*>(&mma::verify_attn_mma_kernel<128, 128>), mma::Cfg<128, 128>::kSmem, 0,
              "mma_bf16_dqk128_dv128"};
    case kMmaD576V512:
      return {reinterpret_cast<const void*>(&mma::verify_attn_mma_kernel<576, 512>), mma::Cfg<576, 512>::kSmem, 0,
              "mma_bf16_dqk576_dv512"};
#if defined(KDTR_HAVE_WGMMA)
    case kWgmma: return {nullptr, sm90::wgmma_smem_bytes(), 0, sm90::wgmma_name()};
#endif
    default: return {nullptr, 0, 0, ""};
  }
}

int simt_instance(int32_t dtype, int64_t d_v) {
  const int nj_index = d_v <= 64 ? 0 : d_v <= 128 ? 1 : d_v <= 256 ? 2 : 3;
  return (dtype == KDTR_DTYPE_F32 ? kSimtF32Nj1 : kSimtBf16Nj1) + nj_index;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The split kernels' grid and workspace for p's dims (SplitArgs, verify_attn_device.cuh):
// bounds over every valid request of p's T, H and S (L <= S; verify_attn_split gives at most
// ceil(ceil(S / 64) / kVerifyAttnMinSplitTiles) splits, and at most ceil(128 / row_tiles)).
struct SplitLayout {
  int64_t row_tiles_T, items_per_req, slots_per_req, slot_floats, ldo;
  size_t bytes;  // the workspace: B * slots_per_req slots of slot_floats floats (0: no split)
};
SplitLayout split_layout(const VerifyAttnProblem& p) {
  SplitLayout s{};
  s.row_tiles_T = ceil_div(p.T * p.H, kBM);
  s.ldo = (p.d_v + 3) / 4 * 4;
  s.slot_floats = kBM * s.ldo + 2 * kBM;
  s.items_per_req = s.row_tiles_T;
  const int64_t by_keys = ceil_div(ceil_div(p.S, kBN), kVerifyAttnMinSplitTiles);
  for (int64_t rt = 1; rt <= s.row_tiles_T && rt < kVerifyAttnSplitTargetBlocks; ++rt) {
    const int64_t splits =
        std::min(std::min(ceil_div(kVerifyAttnSplitTargetBlocks, rt), kVerifyAttnMaxSplits), by_keys);
    if (splits <= 1) continue;
    s.slots_per_req = std::max(s.slots_per_req, rt * splits);
    s.items_per_req = std::max(s.items_per_req, rt * splits + s.row_tiles_T - rt);
  }
  s.bytes = static_cast<size_t>(p.B * s.slots_per_req * s.slot_floats) * sizeof(float);
  return s;
}

bool splits_kv(int instance) { return instance == kMmaD128V128 || instance == kMmaD576V512 || instance == kWgmma; }

// The per-device split-KV workspaces: grown, never freed or moved (a CUDA graph captured
// with one keeps its address), so a process holds at most one per device at the largest
// size asked plus the smaller ones it outgrew.
std::mutex g_workspace_mutex;
struct Workspace {
  void* ptr = nullptr;
  size_t bytes = 0;
};
std::vector<Workspace> g_workspaces;
std::vector<void*> g_outgrown;  // buffers replaced by larger ones, kept until exit

// At exit (registered after the CUDA runtime's own handler, so it runs first): every
// workspace freed, so that compute-sanitizer's leak check sees none.
void free_workspaces() {
  std::lock_guard<std::mutex> lock(g_workspace_mutex);
  for (Workspace& w : g_workspaces)
    if (w.ptr != nullptr) (void)cudaFree(w.ptr);
  for (void* p : g_outgrown) (void)cudaFree(p);
  g_workspaces.clear();
  g_outgrown.clear();
}

// The Hopper kernel's id when it computes `p` on `device` (compute capability 9.0, a
// build that has it, enough opt-in shared memory), else 0; a device-query error is
// returned through *err.
int wgmma_instance(const VerifyAttnProblem& p, int device, cudaError_t* err) {
  *err = cudaSuccess;
#if defined(KDTR_HAVE_WGMMA)
  if (!sm90::wgmma_fits(p)) return 0;
  DeviceAttrs a{};
  if ((*err = device_attrs(device, &a)) != cudaSuccess) return 0;
  if (a.major != 9 || a.minor != 0 || sm90::wgmma_smem_bytes() > static_cast<size_t>(a.optin)) return 0;
  return kWgmma;
#else
  (void)p;
  (void)device;
  return 0;
#endif
}

}  // namespace

bool verify_attn_have_wgmma() {
#if defined(KDTR_HAVE_WGMMA)
  return true;
#else
  return false;
#endif
}

cudaError_t verify_attn_plan(const VerifyAttnProblem& p, VerifyAttnKernel requested, int device, VerifyAttnPlan* plan) {
  if (plan == nullptr) return cudaErrorInvalidValue;
  if (p.B < 0 || p.T < 0 || p.H < 0 || p.S < 0 || p.Dqk < 1 || p.d_v < 1 || p.d_v > p.Dqk) return cudaErrorInvalidValue;
  if (p.T > kMaxDim || p.H > kMaxDim || p.T * p.H > kMaxDim || p.S > kMaxDim || p.Dqk > kMaxDim)
    return cudaErrorInvalidValue;
  const int64_t tiles = ceil_div(p.T * p.H, kBM);
  if (p.B > 0 && tiles > 0x7fffffffLL / p.B) return cudaErrorInvalidValue;
  const SplitLayout split = split_layout(p);

  int mma_id = 0;
  if (p.dtype == KDTR_DTYPE_BF16 && p.Dqk % 8 == 0) {
    if (p.Dqk <= 128 && p.d_v <= 128) mma_id = kMmaD128V128;
    else if (p.Dqk <= 576 && p.d_v <= 512) mma_id = kMmaD576V512;
  }
  if (mma_id != 0) {
    DeviceAttrs a{};
    const cudaError_t err = device_attrs(device, &a);
    if (err != cudaSuccess) return err;
    if (instance_info(mma_id).smem > static_cast<size_t>(a.optin)) mma_id = 0;
  }
  int wgmma_id = 0;
  if (requested == VerifyAttnKernel::Wgmma || requested == VerifyAttnKernel::Auto) {
    cudaError_t err;
    wgmma_id = wgmma_instance(p, device, &err);
    if (err != cudaSuccess) return err;
  }
  int id;
  if (requested == VerifyAttnKernel::Wgmma) {
    if (wgmma_id == 0) return cudaErrorNotSupported;
    id = wgmma_id;
  } else if (requested == VerifyAttnKernel::Mma) {
    if (mma_id == 0) return cudaErrorNotSupported;
    id = mma_id;
  } else if (requested == VerifyAttnKernel::Simt) {
    id = simt_instance(p.dtype, p.d_v);
  } else {
    id = wgmma_id != 0 && p.Dqk > 256 ? wgmma_id : mma_id != 0 ? mma_id : simt_instance(p.dtype, p.d_v);
  }
  const InstanceInfo info = instance_info(id);
  if (info.dvt > 0 && ceil_div(p.d_v, info.dvt) > 65535) return cudaErrorInvalidValue;
  plan->kernel = id == kWgmma         ? VerifyAttnKernel::Wgmma
                 : id >= kMmaD128V128 ? VerifyAttnKernel::Mma
                                      : VerifyAttnKernel::Simt;
  if (splits_kv(id) && p.B > 0 && split.items_per_req > 0x7fffffffLL / p.B) return cudaErrorInvalidValue;
  plan->instance = id;
  plan->smem_bytes = info.smem;
  plan->name = info.name;
  plan->workspace_bytes = splits_kv(id) ? split.bytes : 0;
  plan->workspace = nullptr;
  plan->pdl = false;
  if (splits_kv(id)) {
    DeviceAttrs a{};
    const cudaError_t err = device_attrs(device, &a);
    if (err != cudaSuccess) return err;
    plan->pdl = a.major >= 9;
  }
  return cudaSuccess;
}

cudaError_t verify_attn_choose(const VerifyAttnProblem& p, int device, VerifyAttnPlan* plan, std::string* why) {
  const VerifyAttnKernel requested = p.kernel == KDTR_VERIFY_ATTN_SIMT    ? VerifyAttnKernel::Simt
                                     : p.kernel == KDTR_VERIFY_ATTN_MMA   ? VerifyAttnKernel::Mma
                                     : p.kernel == KDTR_VERIFY_ATTN_WGMMA ? VerifyAttnKernel::Wgmma
                                                                          : VerifyAttnKernel::Auto;
  const cudaError_t perr = verify_attn_plan(p, requested, device, plan);
  if (perr == cudaErrorNotSupported) {
    const std::string got = std::string(p.dtype == KDTR_DTYPE_BF16 ? "bf16" : "f32") + ", Dqk " +
                            std::to_string(p.Dqk) + ", d_v " + std::to_string(p.d_v);
    if (requested == VerifyAttnKernel::Wgmma) {
      DeviceAttrs a{};
      const cudaError_t err = device_attrs(device, &a);
      if (err != cudaSuccess) return err;
      const int major = a.major, minor = a.minor;
      *why =
          "--kernel wgmma needs bf16 inputs with Dqk % 8 == 0, Dqk <= 576, d_v <= 512, enough shared memory, a "
          "compute capability 9.0 device and a build with the Hopper kernel (got " +
          got + ", compute capability " + std::to_string(major) + "." + std::to_string(minor) + ", a build " +
          (verify_attn_have_wgmma() ? "with" : "without") + " it)";
    } else if (requested == VerifyAttnKernel::Mma) {
      *why = "--kernel mma needs bf16 inputs with Dqk % 8 == 0, Dqk <= 576, d_v <= 512 and enough shared memory (got " +
             got + ")";
    } else {
      *why = "verify_attn has no kernel for " + got;
    }
    return perr;
  }
  if (perr != cudaSuccess) return perr;
  const cudaError_t cerr = verify_attn_configure(*plan);
  if (cerr != cudaSuccess) return cerr;
  return verify_attn_reserve(plan);
}

cudaError_t verify_attn_reserve(VerifyAttnPlan* plan) {
  if (plan == nullptr) return cudaErrorInvalidValue;
  if (plan->workspace_bytes == 0) {
    plan->workspace = nullptr;
    return cudaSuccess;
  }
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  std::lock_guard<std::mutex> lock(g_workspace_mutex);
  if (static_cast<size_t>(device) >= g_workspaces.size()) g_workspaces.resize(static_cast<size_t>(device) + 1);
  Workspace& w = g_workspaces[static_cast<size_t>(device)];
  if (w.bytes < plan->workspace_bytes) {
    void* ptr = nullptr;
    if ((err = cudaMalloc(&ptr, plan->workspace_bytes)) != cudaSuccess) return err;
    // Zeroed once, so that the combine kernel's vector loads past d_v read defined memory.
    if ((err = cudaMemset(ptr, 0, plan->workspace_bytes)) != cudaSuccess) return err;
    static const bool at_exit = std::atexit(free_workspaces) == 0;
    (void)at_exit;
    if (w.ptr != nullptr) g_outgrown.push_back(w.ptr);  // not freed: a captured graph may use it
    w.ptr = ptr;
    w.bytes = plan->workspace_bytes;
  }
  plan->workspace = w.ptr;
  plan->workspace_bytes = w.bytes;
  return cudaSuccess;
}

cudaError_t verify_attn_configure(const VerifyAttnPlan& plan) {
  if (plan.instance < kSimtF32Nj1 || plan.instance > kWgmma) return cudaErrorInvalidValue;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  DeviceCache* c = device_cache(device);
  const uint32_t bit = 1u << plan.instance;
  if (c != nullptr && (c->configured.load(std::memory_order_acquire) & bit) != 0) return cudaSuccess;
  DeviceErrorRecord* rec = nullptr;  // the record's address too, so that a launch after this asks nothing
  if ((err = device_record(&rec)) != cudaSuccess) return err;
#if defined(KDTR_HAVE_WGMMA)
  if (plan.instance == kWgmma) {
    err = sm90::wgmma_configure();
  } else
#endif
  {
    const InstanceInfo info = instance_info(plan.instance);
    if (info.fn == nullptr) return cudaErrorInvalidValue;
    err = cudaFuncSetAttribute(info.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(info.smem));
  }
  if (err == cudaSuccess && c != nullptr) c->configured.fetch_or(bit, std::memory_order_acq_rel);
  return err;
}

cudaError_t device_errors(int device, bool clear, DeviceErrorRecord* out) {
  if (out == nullptr) return cudaErrorInvalidValue;
  int prev = 0;
  cudaError_t err = cudaGetDevice(&prev);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return err;
  }
  if (device < 0) device = prev;
  if (device != prev && (err = cudaSetDevice(device)) != cudaSuccess) {
    (void)cudaGetLastError();
    return err;
  }
  err = cudaDeviceSynchronize();
  if (err == cudaSuccess) err = cudaMemcpyFromSymbol(out, g_device_errors, sizeof *out);
  if (err == cudaSuccess && clear) {
    const DeviceErrorRecord zero{};
    err = cudaMemcpyToSymbol(g_device_errors, &zero, sizeof zero);
    if (err == cudaSuccess) err = cudaDeviceSynchronize();
  }
  if (device != prev) {
    const cudaError_t back = cudaSetDevice(prev);
    if (err == cudaSuccess) err = back;
  }
  // Returned above: not left as the thread's last error, which the next launch would
  // report as its own (a sticky error stays sticky).
  (void)cudaGetLastError();
  return err;
}

cudaError_t launch_verify_attn(const VerifyAttnProblem& p, const VerifyAttnPlan& plan, cudaStream_t stream,
                               VerifyAttnRule rule) {
  if (p.B < 0 || p.T < 0 || p.H < 0) return cudaErrorInvalidValue;
  if (p.B == 0) return cudaSuccess;
  VerifyAttnCheck chk{nullptr, static_cast<int32_t>(rule)};
  cudaError_t err = device_record(&chk.record);
  if (err != cudaSuccess) return err;
  const int64_t tiles = ceil_div(p.T * p.H, kBM);
  if (tiles == 0) {  // no out rows: the length check alone
    if (ceil_div(p.B, kThreads) > 0x7fffffffLL) return cudaErrorInvalidValue;
    verify_attn_check_kernel<<<static_cast<unsigned>(ceil_div(p.B, kThreads)), kThreads, 0, stream>>>(p, chk);
    return cudaGetLastError();
  }
  if (splits_kv(plan.instance)) {
    const SplitLayout lay = split_layout(p);
    if (lay.bytes > 0 && (plan.workspace == nullptr || plan.workspace_bytes < lay.bytes)) return cudaErrorInvalidValue;
    if (lay.items_per_req > 0x7fffffffLL / p.B) return cudaErrorInvalidValue;
    const SplitArgs sa{lay.bytes > 0 ? static_cast<float*>(plan.workspace) : nullptr,
                       static_cast<int>(lay.items_per_req),
                       static_cast<int>(lay.row_tiles_T),
                       lay.slots_per_req,
                       lay.slot_floats,
                       static_cast<int>(lay.ldo)};
    const unsigned grid = static_cast<unsigned>(p.B * lay.items_per_req);
    switch (plan.instance) {
      case kMmaD128V128:
        mma::verify_attn_mma_kernel<128, 128><<<grid, kThreads, plan.smem_bytes, stream>>>(p, sa, chk);
        err = cudaGetLastError();
        break;
      case kMmaD576V512:
        mma::verify_attn_mma_kernel<576, 512><<<grid, kThreads, plan.smem_bytes, stream>>>(p, sa, chk);
        err = cudaGetLastError();
        break;
#if defined(KDTR_HAVE_WGMMA)
      case kWgmma: err = sm90::launch_wgmma(p, sa, grid, chk, stream); break;
#endif
      default: return cudaErrorInvalidValue;
    }
    if (err != cudaSuccess || sa.ws == nullptr) return err;
    const dim3 cgrid(static_cast<unsigned>(p.B * lay.row_tiles_T * (kBM / kCombineRows)),
                     static_cast<unsigned>(ceil_div(p.d_v, kCombineCols)));
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = cgrid;
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = 0;
    cfg.stream = stream;
    cfg.attrs = &attr;
    cfg.numAttrs = plan.pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, verify_attn_combine_kernel, p, sa, chk);
  }
  const InstanceInfo info = instance_info(plan.instance);
  if (info.fn == nullptr) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(p.B * tiles),
                  info.dvt > 0 ? static_cast<unsigned>(ceil_div(p.d_v, info.dvt)) : 1u);
  const int tpr = static_cast<int>(tiles);
  const size_t smem = info.smem;
  // Each kernel takes the op's struct by value (kernel parameter space) and its tiles per request.
#define KDTR_VA_ARGS p, tpr, chk
  switch (plan.instance) {
    case kSimtF32Nj1: simt::verify_attn_simt_kernel<float, 1><<<grid, kThreads, smem, stream>>>(KDTR_VA_ARGS); break;
    case kSimtF32Nj2: simt::verify_attn_simt_kernel<float, 2><<<grid, kThreads, smem, stream>>>(KDTR_VA_ARGS); break;
    case kSimtF32Nj4: simt::verify_attn_simt_kernel<float, 4><<<grid, kThreads, smem, stream>>>(KDTR_VA_ARGS); break;
    case kSimtF32Nj8: simt::verify_attn_simt_kernel<float, 8><<<grid, kThreads, smem, stream>>>(KDTR_VA_ARGS); break;
    case kSimtBf16Nj1:
      simt::verify_attn_simt_kernel<uint16_t, 1><<<grid, kThreads, smem, stream>>>(KDTR_VA_ARGS);
      break;
    case kSimtBf16Nj2:
      simt::verify_attn_simt_kernel<uint16_t, 2><<<grid, kThreads, smem, stream>>>(KDTR_VA_ARGS);
      break;
    case kSimtBf16Nj4:
      simt::verify_attn_simt_kernel<uint16_t, 4><<<grid, kThreads, smem, stream>>>(KDTR_VA_ARGS);
      break;
    case kSimtBf16Nj8:
      simt::verify_attn_simt_kernel<uint16_t, 8><<<grid, kThreads, smem, stream>>>(KDTR_VA_ARGS);
      break;
    default: return cudaErrorInvalidValue;
  }
#undef KDTR_VA_ARGS
  return cudaGetLastError();
}

}  // namespace kdtr
