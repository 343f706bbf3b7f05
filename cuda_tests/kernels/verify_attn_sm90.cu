// verify_attn_sm90.cu -- the Hopper verify_attn kernel: wgmma (warpgroup MMA) and TMA
// (the bulk tensor copy engine), through CUTLASS/CuTe.  Compiled for sm_90a only, when the
// build has the CUTLASS headers (Makefile); dispatched by verify_attn.cu at run time on
// devices of compute capability 9.0 (VerifyAttnKernel::Wgmma, verify_attn_launch.h).
//
// Contract: docs/ops/verify_attn.md; the numerics (NaN-propagating row max, emptiness from
// the visible-key set, cleaning of non-finite KV elements before P V, blocked Q K^T in two
// chains, f32 row sums of the unrounded weights, P rounded to bf16 for P V) are those of
// the mma kernel in verify_attn.cu, and the same tolerances apply.
//
// Design (FlashMLA's layout for MLA decode: the heads of a request's tree rows folded into
// the M dimension).  A block owns 64 query rows m = i*H + h of one request and walks its
// L = prefix_len + tree_len keys in tiles of 64 with an online softmax.  256 threads = two
// warpgroups; warpgroup w computes S[:, 32w .. 32w+32) = Q K^T with wgmma m64n32k16 (A = Q
// and B = the K tile both from shared memory), the row max is exchanged between the two
// warpgroups through shared memory, each writes its half of P (bf16) to shared memory,
// and then computes O[:, 256w .. 256w+256) += P V with wgmma m64n256k16, V being the first
// 512 columns of the same KV tile read through a transposed (MN-major) view.  O stays in
// registers (128 f32 per thread).
//   Loads: Q once per block by cp.async (rows past tree_len*H and dims past Dqk zero, not
// read).  KV tiles are double-buffered; a tile whose 64 rows all lie below L comes by TMA
// as nine 64x64 slabs, each completing on its own mbarrier, so Q K^T starts on slab 0
// while later slabs land (lane 0 of each warp issues some of the nine).  P V of tile j is
// left running while tile j+1's Q K^T is issued behind it (KDTR_WGMMA_OVERLAP); tile j+1
// goes into the buffer of tile j-1 at tile j's row-max barrier, once both warpgroups are
// past P V of tile j-1.  The last tile, when it reaches past L, is loaded by
// cp.async with zero fill instead (a TMA box would read cache rows >= L, which the
// contract forbids).  Slabs past Dqk are never loaded and stay zero.
//   Shared memory (bytes): Q 73728, two KV tiles 2 x 73728, P 8192, row max / row sum
// exchange, the non-finite flag and 18 mbarriers: 231,424 (sizeof, 1024-aligned) of the 232,448 an H100/H200
// block may opt into.

#include <cuda_runtime.h>
#include <cutlass/arch/barrier.h>
#include <cutlass/cutlass.h>
#include <cutlass/numeric_types.h>

#include <cstdint>
#include <cute/tensor.hpp>

#include "verify_attn_device.cuh"
#include "verify_attn_sm90.h"

namespace kdtr {
namespace sm90 {
namespace {

using namespace cute;
using bf16 = cutlass::bfloat16_t;
using namespace va_device;  // neg_inf, finite tests, finish_row, padding rows, cp.async (verify_attn_device.cuh)

constexpr int kThreads = 256;
constexpr int kBM = 64;            // query rows per block
constexpr int kBN = 64;            // keys per KV tile
constexpr int kDQK = 576;          // key dims the shared-memory tiles hold (Dqk <= this)
constexpr int kDV = 512;           // value columns the kernel computes (d_v <= this)
constexpr int kSlabs = kDQK / 64;  // 64-dim slabs of a tile
constexpr int kKSteps = kDQK / 16;
#ifndef KDTR_WGMMA_ONE_CHAIN
#define KDTR_WGMMA_ONE_CHAIN 0
#endif
constexpr int kKHalf =
    KDTR_WGMMA_ONE_CHAIN ? kKSteps : kKSteps / 2;  // S accumulates k-steps [0, kKHalf) and the rest apart
constexpr float kLog2e = 1.4426950408889634f;
constexpr unsigned kFull = 0xffffffffu;

// P V of tile j left running while tile j+1's Q K^T is issued (1), or waited for at the end
// of its iteration (0); docs/ops/verify_attn.md compares the two.
#ifndef KDTR_WGMMA_OVERLAP
#define KDTR_WGMMA_OVERLAP 1
#endif

// Shared-memory layouts: K-major with the 128-byte swizzle (GMMA's canonical layout),
// 64-dim slabs of 64 rows contiguous (8 KB each).
using SmemLayoutSlab = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<bf16>{}, Shape<Int<kBN>, _64>{}));
using SmemLayoutQ = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<bf16>{}, Shape<Int<kBM>, Int<kDQK>>{}));
using SmemLayoutKV = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<bf16>{}, Shape<Int<kBN>, Int<kDQK>>{}));
// V^T: (value column, key) -> the KV tile's element (key, column).
using SmemLayoutVt = decltype(composition(SmemLayoutKV{}, make_layout(Shape<Int<kDV>, Int<kBN>>{}, GenRowMajor{})));
using SmemLayoutP = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<bf16>{}, Shape<Int<kBM>, Int<kBN>>{}));

using TiledMmaQK = decltype(make_tiled_mma(
    GMMA::ss_op_selector<bf16, bf16, float, Shape<Int<kBM>, Int<kBN / 2>, Int<kDQK>>, GMMA::Major::K, GMMA::Major::K>(),
    Layout<Shape<_1, _1, _1>>{}));
using TiledMmaPV = decltype(make_tiled_mma(
    GMMA::ss_op_selector<bf16, bf16, float, Shape<Int<kBM>, Int<kDV / 2>, Int<kBN>>, GMMA::Major::K, GMMA::Major::MN>(),
    Layout<Shape<_1, _1, _1>>{}));

constexpr int kQBytes = kBM * kDQK * 2;
constexpr int kKVBytes = kBN * kDQK * 2;
constexpr int kSlabBytes = kBN * 64 * 2;
constexpr int kPBytes = kBM * kBN * 2;

struct SharedStorage {
  alignas(1024) uint8_t q[kQBytes];
  alignas(1024) uint8_t kv[2][kKVBytes];
  alignas(1024) uint8_t p[kPBytes];
  float red_max[2][kBM];
  float red_sum[2][kBM];
  int nonfinite;  // the index + 1 of the last tile with a non-finite raw score
  alignas(8) uint64_t full[2][kSlabs];
};

using Barrier = cutlass::arch::ClusterTransactionBarrier;

// Ordinary (generic-proxy) shared-memory writes of this thread become visible to the
// tensor cores and the copy engine (async proxy) after a following barrier.
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Named barrier over the 256 threads (ids 1..: 0 is __syncthreads).
__device__ __forceinline__ void sync_threads_named(int id) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(kThreads) : "memory");
}

// Byte offset of element (row, col) in a shared-memory tile of layout `layout` (a
// swizzled GMMA layout): CuTe applies the swizzle to the byte address (tiles are
// 1024-byte aligned), so the offset is the swizzle of the unswizzled byte offset.
template <class Layout>
__device__ __forceinline__ uint32_t smem_byte_offset(const Layout& layout, int row, int col) {
  const uint32_t byte = 2u * static_cast<uint32_t>(layout.layout_b()(row, col));
  return static_cast<uint32_t>(layout.layout_a()(byte));
}

// Calls f(std::integral_constant<int, I>) for I in [I0, N): compile-time loop indices.
template <int I, int N, class F>
__device__ __forceinline__ void static_for(F&& f) {
  if constexpr (I < N) {
    f(std::integral_constant<int, I>{});
    static_for<I + 1, N>(f);
  }
}

// One warpgroup GEMM acc += A B over the k-steps [K0, K1) of the fragments (acc = A B
// when kZero: the first k-step ignores acc's old value); issues and commits the wgmma
// batch, the caller waits (warpgroup_wait).
template <int K0, int K1, bool kZero, class Mma, class FA, class FB, class FC>
__device__ __forceinline__ void wg_gemm(Mma& mma, const FA& a, const FB& b, FC& acc) {
  if constexpr (K0 < K1) {
    warpgroup_fence_operand(acc);
    warpgroup_arrive();
    mma.accumulate_ = kZero ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
    CUTLASS_PRAGMA_UNROLL
    for (int k = K0; k < K1; ++k) {
      cute::gemm(mma, a(_, _, k), b(_, _, k), acc);
      mma.accumulate_ = GMMA::ScaleOut::One;
    }
    warpgroup_commit_batch();
    warpgroup_fence_operand(acc);
  }
}

template <class TmaKV>
__global__ void __launch_bounds__(kThreads, 1)
    verify_attn_wgmma_kernel(CUTE_GRID_CONSTANT TmaKV const tma_kv, const __grid_constant__ VerifyAttnProblem prm,
                             SplitArgs sa, VerifyAttnCheck chk) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint16_t* __restrict__ q = static_cast<const uint16_t*>(prm.q);
  const uint16_t* __restrict__ kv = static_cast<const uint16_t*>(prm.kv_cache);
  const uint8_t* __restrict__ vis = prm.visibility;
  const float sm_scale = prm.sm_scale;
  const int T = static_cast<int>(prm.T), H = static_cast<int>(prm.H), S = static_cast<int>(prm.S);
  const int Dqk = static_cast<int>(prm.Dqk), d_v = static_cast<int>(prm.d_v);
  float* __restrict__ out = prm.out;
  float* __restrict__ lse = prm.lse;
  const int B = static_cast<int>(prm.B);
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  SharedStorage& sm = *reinterpret_cast<SharedStorage*>(smem_raw);

  if (sa.ws != nullptr) pdl_launch_dependents();  // the combine kernel follows: it may be scheduled now
  // The block's request, row tile and key tiles (split-KV, verify_attn_device.cuh), its
  // lengths checked first (verify_attn_launch.h): nothing of a failing request is read.
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

  const int tid = static_cast<int>(threadIdx.x);
  const int wg = tid >> 7, tid_wg = tid & 127;
  const int lane = tid & 31, warp_wg = tid_wg >> 5;
  const int dchunks = Dqk >> 3;          // 16-byte chunks of a row
  const int nslab = (Dqk + 63) >> 6;     // slabs that hold key dims
  const int j0 = work.j0, j1 = work.j1;  // the split's key tiles (j1 > j0: tl >= 1 here)
  const uint16_t* const q_req = q + row_base * Dqk;
  const uint16_t* const kv_req = kv + static_cast<int64_t>(b) * S * Dqk;

  const uint32_t sQ_u32 = static_cast<uint32_t>(__cvta_generic_to_shared(sm.q));
  const uint32_t sKV0_u32 = static_cast<uint32_t>(__cvta_generic_to_shared(sm.kv[0]));  // buffer b at + b * kKVBytes
  const SmemLayoutQ layout_q{};
  const SmemLayoutKV layout_kv{};

  if (tid == 0) {
    for (int buf = 0; buf < 2; ++buf)
      for (int s = 0; s < kSlabs; ++s) Barrier::init(&sm.full[buf][s], 1);
    sm.nonfinite = 0;
    cutlass::arch::fence_barrier_init();
  }
  // Slabs past Dqk are never loaded: zero them once in both buffers.
  if (nslab < kSlabs) {
    const int words = (kSlabs - nslab) * kSlabBytes / 16;
    for (int buf = 0; buf < 2; ++buf) {
      uint4* base = reinterpret_cast<uint4*>(sm.kv[buf] + nslab * kSlabBytes);
      for (int i = tid; i < words; i += kThreads) base[i] = make_uint4(0, 0, 0, 0);
    }
    fence_async_shared();
  }
  __syncthreads();

  Tensor mKV = tma_kv.get_tma_tensor(make_shape(S, Dqk, B));  // TMA coordinates (row, dim, request)
  // KV tile `tile` into buffer `buf`: TMA by thread 0 when all its rows are below L, else
  // (the tail tile) cp.async by every thread, zero-filling rows >= L and dims >= Dqk.
  auto load_tile = [&](int tile, int buf) {
    const int p0 = tile * kBN;
    if (p0 + kBN <= L) {
      // Lane 0 of warp w issues slabs w, w + 8, ...: the issue cost is spread over the
      // warps instead of delaying warp 0's next Q K^T.
      if (lane == 0) {
        auto cta_tma = tma_kv.get_slice(Int<0>{});
        for (int s = tid >> 5; s < nslab; s += kThreads / 32) {
          Tensor g_slab = local_tile(mKV(_, _, b), Shape<Int<kBN>, _64>{}, make_coord(tile, s));
          Tensor s_slab =
              make_tensor(make_smem_ptr(reinterpret_cast<bf16*>(sm.kv[buf] + s * kSlabBytes)), SmemLayoutSlab{});
          Barrier::arrive_and_expect_tx(&sm.full[buf][s], kSlabBytes);
          copy(tma_kv.with(sm.full[buf][s]), cta_tma.partition_S(g_slab), cta_tma.partition_D(s_slab));
        }
      }
    } else {
      for (int idx = tid; idx < kBN * nslab * 8; idx += kThreads) {
        const int row = idx / (nslab * 8), ch = idx - row * (nslab * 8);
        const bool ok = p0 + row < L && ch < dchunks;
        const uint32_t dst =
            sKV0_u32 + static_cast<uint32_t>(buf * kKVBytes) + smem_byte_offset(layout_kv, row, ch * 8);
        cp_async16(dst, ok ? kv_req + static_cast<int64_t>(p0 + row) * Dqk + ch * 8 : kv, ok);
      }
      cp_async_commit();
    }
  };

  // Q tile: rows past the valid ones and dims past Dqk are zero and not read.
  for (int idx = tid; idx < kBM * (kDQK / 8); idx += kThreads) {
    const int row = idx / (kDQK / 8), ch = idx - row * (kDQK / 8);
    const bool ok = m0 + row < valid_rows && ch < dchunks;
    const uint32_t dst = sQ_u32 + smem_byte_offset(layout_q, row, ch * 8);
    cp_async16(dst, ok ? q_req + static_cast<int64_t>(m0 + row) * Dqk + ch * 8 : q, ok);
  }
  cp_async_commit();
  load_tile(j0, 0);
  if (j0 + 1 < j1) load_tile(j0 + 1, 1);
  cp_async_wait_all();  // Q, and a cp.async tail tile among the first two
  fence_async_shared();
  __syncthreads();

  // MMA fragments.
  TiledMmaQK mma_qk;
  TiledMmaPV mma_pv;
  mma_qk.accumulate_ = GMMA::ScaleOut::One;
  mma_pv.accumulate_ = GMMA::ScaleOut::One;
  auto thr_qk = mma_qk.get_thread_slice(tid_wg);
  auto thr_pv = mma_pv.get_thread_slice(tid_wg);
  Tensor sQ = make_tensor(make_smem_ptr(reinterpret_cast<bf16*>(sm.q)), SmemLayoutQ{});
  Tensor sP = make_tensor(make_smem_ptr(reinterpret_cast<bf16*>(sm.p)), SmemLayoutP{});
  Tensor tSrQ = thr_qk.partition_fragment_A(sQ);
  Tensor tOrP = thr_pv.partition_fragment_A(sP);
  Tensor rS = partition_fragment_C(mma_qk, Shape<Int<kBM>, Int<kBN / 2>>{});
  Tensor rS2 = partition_fragment_C(mma_qk, Shape<Int<kBM>, Int<kBN / 2>>{});
  Tensor rO = partition_fragment_C(mma_pv, Shape<Int<kBM>, Int<kDV / 2>>{});
  clear(rO);
  // (row, column) of each accumulator element in the warpgroup's 64 x 32 S half and
  // 64 x 256 O half.
  Tensor tScS = thr_qk.partition_C(make_identity_tensor(Shape<Int<kBM>, Int<kBN / 2>>{}));
  Tensor tOcO = thr_pv.partition_C(make_identity_tensor(Shape<Int<kBM>, Int<kDV / 2>>{}));
  static_assert(decltype(size(rS))::value == 16 && decltype(size(rO))::value == 128, "fragment sizes");
  // bf16 P of this warpgroup's 32 keys, stored to sP with stmatrix.
  auto r2s = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, bf16>{}, mma_qk);
  auto thr_r2s = r2s.get_thread_slice(tid_wg);
  Tensor tPsP = thr_r2s.partition_D(local_tile(sP, Shape<Int<kBM>, Int<kBN / 2>>{}, make_coord(0, wg)));
  Tensor rPb = make_tensor<bf16>(shape(rS));

  // This thread's two rows (C fragments: warp_wg * 16 + gid and + 8; element i of a C
  // fragment lies in the second when (i >> 1) & 1) and their visibility rows.
  const ThreadRows rows = thread_rows(warp_wg * 16, lane, m0, valid_rows, vis, b, T, H);
  const int* const rr = rows.r;
  const bool* const rv = rows.valid;
  const uint8_t* const* const vrow = rows.vis;
  float m_run[2] = {neg_inf(), neg_inf()}, l_run[2] = {0.0f, 0.0f};

  for (int j = j0; j < j1; ++j) {
    const int jj = j - j0;  // the block's tile count: buffer jj & 1, its barriers' phase (jj / 2) & 1
    const int buf = jj & 1;
    const uint32_t phase = static_cast<uint32_t>((jj >> 1) & 1);
    const int p0 = j * kBN;
    const bool tma_tile = p0 + kBN <= L;
    if (!tma_tile && jj >= 2) {  // a cp.async tail tile issued inside the loop
      cp_async_wait_all();
      fence_async_shared();
      sync_threads_named(1);
    }
    bf16* const kv_tile = reinterpret_cast<bf16*>(sm.kv[buf]);
    Tensor sK = local_tile(make_tensor(make_smem_ptr(kv_tile), SmemLayoutKV{}), Shape<Int<kBN / 2>, Int<kDQK>>{},
                           make_coord(wg, 0));
    Tensor sVt = local_tile(make_tensor(make_smem_ptr(kv_tile), SmemLayoutVt{}), Shape<Int<kDV / 2>, Int<kBN>>{},
                            make_coord(wg, 0));
    Tensor tSrK = thr_qk.partition_fragment_B(sK);
    Tensor tOrV = thr_pv.partition_fragment_B(sVt);

    // S = Q K^T slab by slab as the slabs land, k-steps [0, kKHalf) into rS and the rest
    // into rS2 (two chains: the tensor cores' f32 accumulation drifts with the chain
    // length; docs/ops/verify_attn.md), summed afterwards.
    static_for<0, kSlabs>([&](auto s_) {
      constexpr int s = decltype(s_)::value;
      if (s < nslab) {
        if (tma_tile) reinterpret_cast<Barrier*>(&sm.full[buf][s])->wait(phase);
        constexpr int k0 = 4 * s, k1 = 4 * s + 4;
        wg_gemm<k0, (k1 < kKHalf ? k1 : kKHalf), k0 == 0>(mma_qk, tSrQ, tSrK, rS);
        wg_gemm<(k0 > kKHalf ? k0 : kKHalf), k1, (k0 <= kKHalf && kKHalf < k1)>(mma_qk, tSrQ, tSrK, rS2);
      }
    });
    warpgroup_wait<0>();
    const bool two_chains = nslab * 4 > kKHalf;  // else rS2 was never written
    bool raw_nonfinite = false;
#pragma unroll
    for (int i = 0; i < size(rS); ++i) {
      if (two_chains) rS(i) += rS2(i);
      raw_nonfinite |= !finite_f(rS(i));
    }

    // Mask and scale; the row max over this warpgroup's 32 keys, then over both.
    const bool prefix_tile = p0 + kBN <= pl;
    float mx[2] = {neg_inf(), neg_inf()};
#pragma unroll
    for (int i = 0; i < size(rS); ++i) {
      const int h = (i >> 1) & 1;
      bool visible = rv[h];
      if (!prefix_tile && visible)
        visible = verify_attn_key_visible(pl, tl, vrow[h], p0 + wg * (kBN / 2) + get<1>(tScS(i)));
      rS(i) = visible ? rS(i) * sm_scale : neg_inf();
      mx[h] = verify_attn_max(mx[h], rS(i));
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = verify_attn_max(mx[h], __shfl_xor_sync(kFull, mx[h], 1));
      mx[h] = verify_attn_max(mx[h], __shfl_xor_sync(kFull, mx[h], 2));
    }
    if ((lane & 3) == 0) {
      sm.red_max[wg][rr[0]] = mx[0];
      sm.red_max[wg][rr[1]] = mx[1];
    }
    if (raw_nonfinite) sm.nonfinite = j + 1;
    sync_threads_named(2);  // both halves of the row max and the non-finite flag written; S done reading K
#if KDTR_WGMMA_OVERLAP
    // Both warpgroups are past P V of tile j-1 (it completed with this tile's Q K^T): its
    // buffer takes tile j+1 (tiles 0 and 1 came in the prologue).
    if (jj >= 1 && j + 1 < j1) load_tile(j + 1, buf ^ 1);
#endif
    // A non-finite raw score anywhere in the block: the tile's non-finite elements become
    // 0 before P V reads it (a key of weight 0 contributes nothing, not 0 * inf).
    if (sm.nonfinite == j + 1) {
      uint4* const t4 = reinterpret_cast<uint4*>(sm.kv[buf]);
      for (int idx = tid; idx < nslab * kSlabBytes / 16; idx += kThreads) {
        uint4 u = t4[idx];
        u.x = bf16x2_finite_or_zero(u.x);
        u.y = bf16x2_finite_or_zero(u.y);
        u.z = bf16x2_finite_or_zero(u.z);
        u.w = bf16x2_finite_or_zero(u.w);
        t4[idx] = u;
      }
      fence_async_shared();
    }

    float m_use[2], alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float m_new = verify_attn_max(m_run[h], verify_attn_max(mx[h], sm.red_max[wg ^ 1][rr[h]]));
      m_use[h] = m_new == neg_inf() ? 0.0f : m_new;
      alpha[h] = exp2f((m_run[h] - m_use[h]) * kLog2e);
      m_run[h] = m_new;
    }
    // P = exp(s - m): l sums it in f32; P V uses it rounded to bf16.
    float lsum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < size(rS); ++i) {
      const int h = (i >> 1) & 1;
      const float pv = exp2f((rS(i) - m_use[h]) * kLog2e);
      lsum[h] += pv;
      rPb(i) = static_cast<bf16>(pv);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) l_run[h] = l_run[h] * alpha[h] + lsum[h];
    copy(r2s, thr_r2s.retile_S(rPb), tPsP);
    fence_async_shared();
    sync_threads_named(3);  // P complete (both halves), the cleaned tile visible

    // O *= alpha (per row), then O[:, this half] += P V.
    // (Skipped when every row of the warp keeps its max: alpha == 1 exactly; a NaN alpha
    // is != 1 and still multiplies.)
    if (__any_sync(kFull, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
      for (int i = 0; i < size(rO); ++i) rO(i) *= alpha[(i >> 1) & 1];
    }
    wg_gemm<0, kBN / 16, false>(mma_pv, tOrP, tOrV, rO);
#if KDTR_WGMMA_OVERLAP
    // P V runs on while the next tile's Q K^T is issued behind it; the wait there covers both.
  }
  warpgroup_wait<0>();
#else
    warpgroup_wait<0>();
    sync_threads_named(4);  // both warpgroups done with this buffer and with sP
    if (j + 2 < j1) load_tile(j + 2, buf);
  }
#endif

  // Epilogue: full row sums (quad, then the other warpgroup), out = O / l, lse = m + log(l).
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_run[h] += __shfl_xor_sync(kFull, l_run[h], 1);
    l_run[h] += __shfl_xor_sync(kFull, l_run[h], 2);
  }
  if ((lane & 3) == 0) {
    sm.red_sum[wg][rr[0]] = l_run[0];
    sm.red_sum[wg][rr[1]] = l_run[1];
  }
  __syncthreads();
  if (work.splits > 1) {  // the partial result: O unnormalised, m and l per row (the combine kernel)
    float* const slot = split_slot(sa, work);
    const int col0 = wg * (kDV / 2);
#pragma unroll
    for (int i = 0; i < size(rO); i += 2) {
      const int h = (i >> 1) & 1;
      const int col = col0 + get<1>(tOcO(i));
      if (col < d_v)
        *reinterpret_cast<float2*>(slot + static_cast<int64_t>(rr[h]) * sa.ldo + col) = make_float2(rO(i), rO(i + 1));
    }
    if (wg == 0 && (lane & 3) == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        slot[kBM * sa.ldo + rr[h]] = m_run[h];
        slot[kBM * sa.ldo + kBM + rr[h]] = l_run[h] + sm.red_sum[1][rr[h]];
      }
    }
    return;
  }
  RowResult res[2];
  float l[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] = l_run[h] + sm.red_sum[wg ^ 1][rr[h]];
    res[h] = finish_row(l[h], rv[h], pl, tl, vrow[h]);
  }
  const int col0 = wg * (kDV / 2);
#pragma unroll
  for (int i = 0; i < size(rO); i += 2) {
    const int h = (i >> 1) & 1;
    const int m = m0 + rr[h];
    const int col = col0 + get<1>(tOcO(i));
    if (m >= M || col >= d_v) continue;
    float* orow = out + (row_base + m) * d_v;
    const float v0 = res[h].nan ? quiet_nan() : res[h].zero ? 0.0f : rO(i) / l[h];
    const float v1 = res[h].nan ? quiet_nan() : res[h].zero ? 0.0f : rO(i + 1) / l[h];
    if ((d_v & 1) == 0) {
      *reinterpret_cast<float2*>(orow + col) = make_float2(v0, v1);
    } else {
      orow[col] = v0;
      if (col + 1 < d_v) orow[col + 1] = v1;
    }
  }
  if (wg == 0 && (lane & 3) == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = m0 + rr[h];
      if (m < M) lse[row_base + m] = res[h].nan ? quiet_nan() : res[h].zero ? neg_inf() : m_run[h] + logf(l[h]);
    }
  }
#endif
}

// The TMA descriptor type for the latent KV [B, S, Dqk] (bf16) in 64 x 64 slabs.
auto make_kv_tma(const void* kv, int S, int Dqk, int B) {
  Tensor g = make_tensor(
      make_gmem_ptr(static_cast<const bf16*>(kv)),
      make_layout(make_shape(S, Dqk, B), make_stride(static_cast<int64_t>(Dqk), _1{}, static_cast<int64_t>(S) * Dqk)));
  return make_tma_copy(SM90_TMA_LOAD{}, g, SmemLayoutSlab{});
}
using TmaKV = decltype(make_kv_tma(nullptr, 1, 8, 1));

constexpr size_t kSmemBytes = sizeof(SharedStorage);
static_assert(kSmemBytes <= 232448, "shared memory of an sm_90 block");

}  // namespace

bool wgmma_fits(const VerifyAttnProblem& p) {
  return p.dtype == KDTR_DTYPE_BF16 && p.Dqk % 8 == 0 && p.Dqk <= kDQK && p.d_v <= kDV && p.d_v <= p.Dqk && p.S >= 1 &&
         p.B <= 0x7fffffffLL && reinterpret_cast<uintptr_t>(p.q) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(p.kv_cache) % 16 == 0;
}

size_t wgmma_smem_bytes() { return kSmemBytes; }
const char* wgmma_name() { return "wgmma_bf16_dqk576_dv512"; }

cudaError_t wgmma_configure() {
  return cudaFuncSetAttribute(&verify_attn_wgmma_kernel<TmaKV>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(kSmemBytes));
}

cudaError_t launch_wgmma(const VerifyAttnProblem& p, const va_device::SplitArgs& sa, unsigned grid,
                         const VerifyAttnCheck& chk, cudaStream_t stream) {
  if (p.B == 0 || grid == 0) return cudaSuccess;
  if (!wgmma_fits(p)) return cudaErrorInvalidValue;
  const int S = static_cast<int>(p.S), Dqk = static_cast<int>(p.Dqk), B = static_cast<int>(p.B);
  const TmaKV tma = make_kv_tma(p.kv_cache, S, Dqk, B);
  verify_attn_wgmma_kernel<TmaKV><<<grid, kThreads, kSmemBytes, stream>>>(tma, p, sa, chk);
  return cudaGetLastError();
}

}  // namespace sm90
}  // namespace kdtr
