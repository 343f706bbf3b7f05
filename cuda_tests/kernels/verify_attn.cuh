// verify_attn.cuh -- MLA-absorb tree verify attention: shared helpers and the CPU backend.
//
// Contract: docs/ops/verify_attn.md (source: shared/DESIGN.md section 3.3); reference:
// kdtr/ops/verify_attn.py (float64).  The CUDA kernels are in verify_attn.cu.
//
// Shapes: B requests, T tree slots, H heads, S cache rows, Dqk key dims, d_v value dims.
//   q          [B,T,H,Dqk]  f32 or bf16 (bf16 as its uint16_t bit pattern)
//   kv_cache   [B,S,Dqk]    same dtype: rows 0..prefix_len-1 the prefix, prefix_len + j
//                            tree slot j; keys use all Dqk dims, values the first d_v
//   prefix_len [B] i32, tree_len [B] i32 (node_count + 1), visibility [B,T,T] u8
//   sm_scale   f32 scalar, d_v i32 scalar
//   out        [B,T,H,d_v] f32, lse [B,T,H] f32 (natural log of the softmax denominator)
//
// Query (b, i, h) with i < tree_len attends to prefix keys 0..prefix_len-1 and to tree
// key prefix_len + j exactly where visibility[b][i][j] != 0 (j < tree_len).  A row with
// no visible key, and every padding row i >= tree_len, has out = 0 and lse = -inf.
// Non-finite scores (docs/ops/verify_attn.md, "NaN and infinities"): emptiness is decided
// from the visible-key set (verify_attn_row_has_key), never from the row max.  A row with
// a visible key is the max-subtracted formula in IEEE arithmetic with NaN propagating
// through the max (verify_attn_max): a visible score that is NaN or +inf, or visible
// scores that are all -inf, give lse = NaN and out = NaN (every element); a -inf score
// among finite ones has weight 0, and a key of weight 0 contributes nothing to out (not
// even 0 * inf = NaN from a non-finite value element).
// Nothing outside the valid ranges is read: q rows i >= tree_len, cache rows
// >= prefix_len + tree_len, visibility entries with i or j >= tree_len.
//
// The KDTR_HD helpers below (key visibility, row emptiness, NaN-propagating max, bf16
// widening, length checks) are shared with the CUDA kernels.  The CPU backend evaluates
// the contract in double, with the row maximum subtracted, and rounds out and lse to f32
// -- the reference's arithmetic.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kdtr_hd.cuh"
#include "verify_attn_params.h"

namespace kdtr {

// Exact widening of a bf16 bit pattern to float.
KDTR_HD inline float bf16_bits_to_float(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// Element widening used by the kernels and the CPU backend: f32 as is, bf16 exactly.
KDTR_HD inline float verify_attn_widen(float x) { return x; }
KDTR_HD inline float verify_attn_widen(uint16_t bf16_bits) { return bf16_bits_to_float(bf16_bits); }

// Whether a request's lengths are valid for T slots and S cache rows (docs: input errors).
KDTR_HD inline bool verify_attn_lengths_ok(int64_t prefix_len, int64_t tree_len, int64_t T, int64_t S) {
  return prefix_len >= 0 && tree_len >= 0 && tree_len <= T && prefix_len <= S - tree_len;
}

// Whether key position p (0 <= p) is visible to tree row i of a request, for i < tree_len.
// vis_row points at visibility[b][i][0]; only entries j < tree_len are read.
KDTR_HD inline bool verify_attn_key_visible(int64_t prefix_len, int64_t tree_len, const uint8_t* vis_row, int64_t p) {
  if (p < prefix_len) return true;
  const int64_t j = p - prefix_len;
  return j < tree_len && vis_row[j] != 0;
}

// Whether tree row i (i < tree_len) of a request sees any key: a prefix, or a visibility
// entry vis_row[j] != 0 with j < tree_len.  Decides "no visible key" (out 0, lse -inf);
// the row max cannot, since NaN and -inf scores also leave it non-finite.
KDTR_HD inline bool verify_attn_row_has_key(int64_t prefix_len, int64_t tree_len, const uint8_t* vis_row) {
  if (prefix_len > 0) return true;
  for (int64_t j = 0; j < tree_len; ++j)
    if (vis_row[j] != 0) return true;
  return false;
}

// The row max with NaN propagating: NaN if a or b is NaN, else the larger (fmax and a
// plain `b > a` both drop a NaN, which would hide a NaN score).
template <class F>
KDTR_HD inline F verify_attn_max(F a, F b) {
  return (a > b || a != a) ? a : b;
}

// ---------------------------------------------------------------------------------------
// Split-KV schedule of the tensor-core kernels (docs/ops/verify_attn.md, "Split-KV")
// ---------------------------------------------------------------------------------------
//
// The mma and wgmma kernels give a block 64 query rows (m = i*H + h) of one request and a
// range of its key tiles (64 keys each).  A request whose rows fill few blocks has its L =
// prefix_len + tree_len keys split across blocks, so that a small batch still fills the
// GPU; the partial results are merged by a combine kernel.  The split depends on the
// request's own prefix_len, tree_len and H only (never on the batch, the device or the
// other requests), so a request's bits are the same in any batch:
//   row_tiles  = ceil(tree_len * H / 64)                  (blocks of rows with a query)
//   key_tiles  = ceil(L / 64)
//   want       = min(kVerifyAttnMaxSplits, ceil(kVerifyAttnSplitTargetBlocks / row_tiles))
//   tiles      = max(kVerifyAttnMinSplitTiles, ceil(key_tiles / want))   (per split)
//   splits     = ceil(key_tiles / tiles)
// split s holds key tiles [s * tiles, min((s + 1) * tiles, key_tiles)), i.e. keys
// [64 s tiles, min(64 (s + 1) tiles, L)); the last one may hold a single key.  splits == 1
// (no row tiles, or L <= 64 kVerifyAttnMinSplitTiles keys, or row_tiles >= 128) is the
// unsplit kernel.  kdtr/ops/verify_attn.py (split_schedule) mirrors this.
constexpr int64_t kVerifyAttnSplitTargetBlocks = 128;  // blocks per request the split aims at
constexpr int64_t kVerifyAttnMaxSplits = 16;
constexpr int64_t kVerifyAttnMinSplitTiles = 4;  // 256 keys: a split's work against its partial's traffic
constexpr int64_t kVerifyAttnTileRows = 64;      // query rows per block, keys per tile

struct VerifyAttnSplit {
  int64_t row_tiles;    // ceil(tree_len * H / 64)
  int64_t key_tiles;    // ceil(L / 64)
  int64_t split_tiles;  // key tiles per split (all but the last)
  int64_t splits;       // >= 1
};

// The split of one request with valid lengths (verify_attn_lengths_ok) and H heads.
KDTR_HD inline VerifyAttnSplit verify_attn_split(int64_t prefix_len, int64_t tree_len, int64_t H) {
  const int64_t n = kVerifyAttnTileRows;
  VerifyAttnSplit s;
  s.row_tiles = (tree_len * H + n - 1) / n;
  s.key_tiles = (prefix_len + tree_len + n - 1) / n;
  s.split_tiles = s.key_tiles;
  s.splits = 1;
  if (s.row_tiles == 0 || s.key_tiles == 0) return s;
#if defined(KDTR_VERIFY_ATTN_SPLIT_WANT_FLOOR)  // (a measurement variant: at most 128 blocks per request)
  int64_t want = kVerifyAttnSplitTargetBlocks / s.row_tiles;
  if (want < 1) want = 1;
#else
  int64_t want = (kVerifyAttnSplitTargetBlocks + s.row_tiles - 1) / s.row_tiles;
#endif
  if (want > kVerifyAttnMaxSplits) want = kVerifyAttnMaxSplits;
  int64_t tiles = (s.key_tiles + want - 1) / want;
  if (tiles < kVerifyAttnMinSplitTiles) tiles = kVerifyAttnMinSplitTiles;
  s.split_tiles = tiles;
  s.splits = (s.key_tiles + tiles - 1) / tiles;
  return s;
}

// ---------------------------------------------------------------------------------------
// CPU backend
// ---------------------------------------------------------------------------------------

// One request: q [T,H,Dqk], kv [S,Dqk], vis [T,T]; writes out [T,H,d_v] and lse [T,H]
// (every element).  Lengths must satisfy verify_attn_lengths_ok.  `keys` is scratch.
template <class In>
inline void verify_attn_request_cpu(const In* q, const In* kv, int32_t prefix_len, int32_t tree_len, const uint8_t* vis,
                                    int64_t T, int64_t H, int64_t Dqk, int64_t d_v, float sm_scale, float* out,
                                    float* lse, std::vector<double>& keys) {
  const double neg_inf = -std::numeric_limits<double>::infinity();
  const int64_t L = static_cast<int64_t>(prefix_len) + tree_len;
  // Padding rows first (and everything when the tree is empty).
  for (int64_t i = tree_len; i < T; ++i)
    for (int64_t h = 0; h < H; ++h) {
      lse[i * H + h] = -std::numeric_limits<float>::infinity();
      for (int64_t v = 0; v < d_v; ++v) out[(i * H + h) * d_v + v] = 0.0f;
    }
  if (tree_len == 0) return;

  keys.resize(static_cast<size_t>(L * Dqk));
  for (int64_t k = 0; k < L * Dqk; ++k) keys[static_cast<size_t>(k)] = verify_attn_widen(kv[k]);
  const double scale = static_cast<double>(sm_scale);
  std::vector<double> qrow(static_cast<size_t>(Dqk)), score(static_cast<size_t>(L)), acc(static_cast<size_t>(d_v));
  std::vector<uint8_t> visible(static_cast<size_t>(L));

  for (int64_t i = 0; i < tree_len; ++i) {
    const uint8_t* vis_row = vis + i * T;
    for (int64_t p = 0; p < L; ++p)
      visible[static_cast<size_t>(p)] = verify_attn_key_visible(prefix_len, tree_len, vis_row, p);
    const bool has_key = verify_attn_row_has_key(prefix_len, tree_len, vis_row);
    for (int64_t h = 0; h < H; ++h) {
      const In* qr = q + (i * H + h) * Dqk;
      for (int64_t k = 0; k < Dqk; ++k) qrow[static_cast<size_t>(k)] = verify_attn_widen(qr[k]);
      double m = neg_inf;
      for (int64_t p = 0; p < L; ++p) {
        if (!visible[static_cast<size_t>(p)]) continue;
        const double* kp = keys.data() + p * Dqk;
        double dot = 0.0;
        for (int64_t k = 0; k < Dqk; ++k) dot += qrow[static_cast<size_t>(k)] * kp[k];
        const double s = scale * dot;
        score[static_cast<size_t>(p)] = s;
        m = verify_attn_max(m, s);
      }
      float* o = out + (i * H + h) * d_v;
      if (!has_key) {  // no visible key
        lse[i * H + h] = -std::numeric_limits<float>::infinity();
        for (int64_t v = 0; v < d_v; ++v) o[v] = 0.0f;
        continue;
      }
      if (!std::isfinite(m)) {  // a NaN or +inf visible score, or all of them -inf
        lse[i * H + h] = std::numeric_limits<float>::quiet_NaN();
        for (int64_t v = 0; v < d_v; ++v) o[v] = std::numeric_limits<float>::quiet_NaN();
        continue;
      }
      double denom = 0.0;
      for (int64_t v = 0; v < d_v; ++v) acc[static_cast<size_t>(v)] = 0.0;
      for (int64_t p = 0; p < L; ++p) {
        if (!visible[static_cast<size_t>(p)]) continue;
        const double w = std::exp(score[static_cast<size_t>(p)] - m);  // in [0, 1]: m is finite
        if (w == 0.0) continue;  // weight 0 (a -inf score): contributes nothing, not 0 * inf
        denom += w;
        const double* vp = keys.data() + p * Dqk;
        for (int64_t v = 0; v < d_v; ++v) acc[static_cast<size_t>(v)] += w * vp[v];
      }
      lse[i * H + h] = static_cast<float>(m + std::log(denom));
      for (int64_t v = 0; v < d_v; ++v) o[v] = static_cast<float>(acc[static_cast<size_t>(v)] / denom);
    }
  }
}

// CPU backend: the whole batch, row-major tensors as in the golden (In = float or the
// uint16_t bits of bf16).  Every request's lengths must satisfy verify_attn_lengths_ok.
template <class In>
inline void verify_attn_cpu(const In* q, const In* kv_cache, const int32_t* prefix_len, const int32_t* tree_len,
                            const uint8_t* visibility, int64_t B, int64_t T, int64_t H, int64_t S, int64_t Dqk,
                            int64_t d_v, float sm_scale, float* out, float* lse) {
  std::vector<double> keys;
  for (int64_t b = 0; b < B; ++b)
    verify_attn_request_cpu(q + b * T * H * Dqk, kv_cache + b * S * Dqk, prefix_len[b], tree_len[b],
                            visibility + b * T * T, T, H, Dqk, d_v, sm_scale, out + b * T * H * d_v, lse + b * T * H,
                            keys);
}

// The same for one VerifyAttnProblem of host pointers (p.dtype picks float or bf16 bits).
inline void verify_attn_cpu(const VerifyAttnProblem& p) {
  if (p.dtype == KDTR_DTYPE_BF16)
    verify_attn_cpu(static_cast<const uint16_t*>(p.q), static_cast<const uint16_t*>(p.kv_cache), p.prefix_len,
                    p.tree_len, p.visibility, p.B, p.T, p.H, p.S, p.Dqk, p.d_v, p.sm_scale, p.out, p.lse);
  else
    verify_attn_cpu(static_cast<const float*>(p.q), static_cast<const float*>(p.kv_cache), p.prefix_len, p.tree_len,
                    p.visibility, p.B, p.T, p.H, p.S, p.Dqk, p.d_v, p.sm_scale, p.out, p.lse);
}

}  // namespace kdtr
