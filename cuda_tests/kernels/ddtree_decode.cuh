// ddtree_decode.cuh -- ddtree_decode's core (docs/ops/ddtree_decode.md; reference
// kdtr/ops/ddtree_decode.py and kdtr/ops/ddtree_model.py): R DDTree decode steps of a tiny
// one-layer MLA target with a bigram drafter.  Per step and request: the drafter's top-K
// per depth, tree_build, q and the latent KV row c of every tree slot, verify_attn over the
// committed cache rows and the tree, the target's prediction per slot (argmax of its
// logits, the lowest id of a tie), tree_accept, and the KV commit of the accepted path.
//
// The per-token pieces are KDTR_HD so that a CUDA kernel can share them: the fixed-point
// projections (every weight a multiple of 2^-6 in [-1, 1]: x @ w_q and x @ w_kv are exact in
// double, and in float, in any order, so q and c are the same bits everywhere) and the
// drafter's log-softmax through kdtr_detmath.hpp (kdtr.detmath's float64 exp, log and
// fixed-order sum, bit for bit: this translation unit is compiled without FMA
// contraction).  The CPU backend ddtree_decode_cpu runs the three ops through their CPU
// entries (their own objects; this file includes none of their cores).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "ddtree_decode_params.h"
#include "kdtr_detmath.hpp"
#include "kdtr_hd.cuh"
#include "tree_accept_params.h"
#include "tree_build_params.h"
#include "verify_attn_params.h"

namespace kdtr {

constexpr uint16_t kBf16QuietNan = 0x7FC0;

KDTR_HD inline double bf16_to_double(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return static_cast<double>(f);
}

// bf16 bits of a finite float, rounded to nearest even (NaN: the quiet NaN).
KDTR_HD inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu) != 0) return kBf16QuietNan;
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// x @ w for one row x [E] (widened) and w [E, n] (bf16): out [n], exact (fixed point).
KDTR_HD inline void ddtree_fixed_row(const double* x, const uint16_t* w, int64_t E, int64_t n, double* out) {
  for (int64_t j = 0; j < n; ++j) out[j] = 0.0;
  for (int64_t e = 0; e < E; ++e) {
    const double xe = x[e];
    if (xe == 0.0) continue;
    const uint16_t* row = w + e * n;
    for (int64_t j = 0; j < n; ++j) out[j] += xe * bf16_to_double(row[j]);
  }
}

// The bf16 bits of an exact fixed-point value (exactly a float: one rounding to bf16).
KDTR_HD inline uint16_t ddtree_round_bf16(double v) { return float_to_bf16(static_cast<float>(v)); }

// The drafter's log-probs of every token after token t: lp [V] (float); x (at least
// max(V, E) doubles) and s (V) are scratch.
KDTR_HD inline void ddtree_draft_log_probs(const uint16_t* demb, const uint16_t* dw_lm, int64_t V, int64_t E, int64_t t,
                                           double* x, double* s, float* lp) {
  for (int64_t e = 0; e < E; ++e) x[e] = bf16_to_double(demb[t * E + e]);
  ddtree_fixed_row(x, dw_lm, E, V, s);
  double mx = s[0];
  for (int64_t v = 1; v < V; ++v) mx = s[v] > mx ? s[v] : mx;
  for (int64_t v = 0; v < V; ++v) s[v] -= mx;                 // exact
  for (int64_t v = 0; v < V; ++v) x[v] = detmath::exp(s[v]);  // x (room for V) is free again
  const double lse = detmath::log(detmath::fixed_sum(x, static_cast<int>(V)));
  for (int64_t v = 0; v < V; ++v) lp[v] = static_cast<float>(s[v] - lse);
}

namespace ddtree_detail {

struct Scratch {
  int64_t T, D, K;
  std::vector<double> x, s;
  std::vector<float> lp_all;
  std::vector<int64_t> order;
  std::vector<float> lp;        // [B,D,K]
  std::vector<int64_t> ids;     // [B,D,K]
  std::vector<int32_t> budget;  // [B]
  std::vector<int32_t> depth_limit;
  std::vector<int32_t> node_count, node_depths, parents, next_token, next_sibling, status, tree_len;
  std::vector<int64_t> node_token_ids;
  std::vector<uint8_t> visibility;
  std::vector<uint16_t> q, c, cache;
  std::vector<float> out, lse;
  std::vector<int64_t> predict;
  std::vector<int32_t> accepted_count, accepted_path;
  std::vector<int64_t> proposed;
  std::vector<int32_t> accept_status, n;
  std::vector<int64_t> root;
};

}  // namespace ddtree_detail

// The CPU backend: "" when every step ran, else the reason (outputs incomplete).
inline std::string ddtree_decode_cpu(const DdtreeDecodeParams& p) {
  using ddtree_detail::Scratch;
  const int64_t B = p.B, R = p.R, V = p.V, E = p.E, H = p.H, Dqk = p.Dqk, Dv = p.Dv, S = p.S;
  Scratch w;
  w.T = p.N + 1;
  w.D = p.draft_depth;
  w.K = p.draft_top_k;
  const int64_t T = w.T, D = w.D, K = w.K;
  w.x.assign(static_cast<size_t>(std::max(V, std::max(E, H * Dv))), 0.0);
  w.s.assign(static_cast<size_t>(std::max(V, H * Dqk)), 0.0);
  w.lp_all.assign(V, 0.0f);
  w.order.resize(V);
  w.lp.assign(B * D * K, 0.0f);
  w.ids.assign(B * D * K, 0);
  w.budget.resize(B);
  w.depth_limit.resize(B);
  for (auto* v : {&w.node_count, &w.status, &w.tree_len, &w.accepted_count, &w.accept_status}) v->assign(B, 0);
  for (auto* v : {&w.node_depths, &w.parents, &w.next_token, &w.next_sibling, &w.accepted_path}) v->assign(B * T, 0);
  w.node_token_ids.assign(B * T, 0);
  w.visibility.assign(B * T * T, 0);
  w.q.assign(B * T * H * Dqk, 0);
  w.c.assign(B * T * Dqk, 0);
  w.cache.assign(p.kv_cache, p.kv_cache + B * S * Dqk);
  w.out.assign(B * T * H * Dv, 0.0f);
  w.lse.assign(B * T * H, 0.0f);
  w.predict.assign(B * T, 0);
  w.proposed.assign(B * T, 0);
  w.n.assign(p.prefix_len, p.prefix_len + B);
  w.root.assign(p.root_token_ids, p.root_token_ids + B);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t r = w.n[b]; r < S; ++r)
      for (int64_t d = 0; d < Dqk; ++d) w.cache[(b * S + r) * Dqk + d] = kBf16QuietNan;
  std::vector<double> xrow(E), y(E), logit(V), orow(H * Dv);

  for (int64_t k = 0; k < R; ++k) {
    // 1. Drafts: top-K per depth by (log-prob descending, id ascending), along the top-1 chain.
    for (int64_t b = 0; b < B; ++b) {
      int64_t t = w.root[b];
      for (int64_t d = 0; d < D; ++d) {
        ddtree_draft_log_probs(p.draft_emb, p.draft_w_lm, V, E, t, w.x.data(), w.s.data(), w.lp_all.data());
        for (int64_t v = 0; v < V; ++v) w.order[v] = v;
        const float* lpa = w.lp_all.data();
        std::partial_sort(w.order.begin(), w.order.begin() + K, w.order.end(),
                          [lpa](int64_t a, int64_t c) { return lpa[a] > lpa[c] || (lpa[a] == lpa[c] && a < c); });
        for (int64_t j = 0; j < K; ++j) {
          const int64_t o = ((b * R + k) * D + d) * K + j, i = (b * D + d) * K + j;
          w.lp[i] = p.top_log_probs[o] = lpa[w.order[j]];
          w.ids[i] = p.top_token_ids[o] = w.order[j];
        }
        t = w.order[0];
      }
      w.budget[b] = p.budget[b * R + k];
      w.depth_limit[b] = p.depth_limit[b * R + k];
    }
    // 2. The tree.
    TreeBuildParams tb{};
    tb.top_log_probs = w.lp.data();
    tb.top_token_ids = w.ids.data();
    tb.root_token_ids = w.root.data();
    tb.budget = w.budget.data();
    tb.depth_limit = w.depth_limit.data();
    tb.node_count = w.node_count.data();
    tb.node_token_ids = w.node_token_ids.data();
    tb.node_depths = w.node_depths.data();
    tb.parents = w.parents.data();
    tb.next_token = w.next_token.data();
    tb.next_sibling = w.next_sibling.data();
    tb.visibility = w.visibility.data();
    tb.status = w.status.data();
    tb.heap_fallback = nullptr;
    tb.B = B;
    tb.D = D;
    tb.K = K;
    tb.N = p.N;
    tb.kernel = KDTR_TREE_BUILD_AUTO;
    cpu::tree_build(tb);
    // 3. q and c of every slot, c into the cache after the committed rows.
    for (int64_t b = 0; b < B; ++b) {
      const auto stop = [&](int32_t kind, int64_t value) {
        return ddtree_decode_error_message(
            {kind, static_cast<int32_t>(b), static_cast<int32_t>(k), static_cast<int32_t>(value)}, S);
      };
      if (w.status[b] != 0) return stop(KDTR_DDTREE_DECODE_TREE_BUILD_STATUS, w.status[b]);
      p.node_count[b * R + k] = w.node_count[b];
      const int64_t tl = w.node_count[b] + 1;
      w.tree_len[b] = static_cast<int32_t>(tl);
      if (w.n[b] + tl > S) return stop(KDTR_DDTREE_DECODE_CACHE_ROWS, w.n[b] + tl);
      std::fill(w.q.begin() + b * T * H * Dqk, w.q.begin() + (b + 1) * T * H * Dqk, uint16_t{0});
      for (int64_t slot = 0; slot < tl; ++slot) {
        const int64_t tok = w.node_token_ids[b * T + slot];
        for (int64_t e = 0; e < E; ++e) xrow[e] = bf16_to_double(p.target_emb[tok * E + e]);
        ddtree_fixed_row(xrow.data(), p.target_w_q, E, H * Dqk, w.s.data());
        for (int64_t j = 0; j < H * Dqk; ++j) w.q[(b * T + slot) * H * Dqk + j] = ddtree_round_bf16(w.s[j]);
        ddtree_fixed_row(xrow.data(), p.target_w_kv, E, Dqk, w.s.data());
        for (int64_t j = 0; j < Dqk; ++j) {
          const uint16_t cv = ddtree_round_bf16(w.s[j]);
          w.c[(b * T + slot) * Dqk + j] = cv;
          w.cache[(b * S + w.n[b] + slot) * Dqk + j] = cv;
        }
      }
    }
    // 4. Attention over the committed rows and the tree.
    VerifyAttnProblem va{};
    va.q = w.q.data();
    va.kv_cache = w.cache.data();
    va.prefix_len = w.n.data();
    va.tree_len = w.tree_len.data();
    va.visibility = w.visibility.data();
    va.out = w.out.data();
    va.lse = w.lse.data();
    va.sm_scale = p.sm_scale;
    va.B = B;
    va.T = T;
    va.H = H;
    va.S = S;
    va.Dqk = Dqk;
    va.d_v = Dv;
    va.dtype = KDTR_DTYPE_BF16;
    va.kernel = KDTR_VERIFY_ATTN_AUTO;
    cpu::verify_attn(va);
    // 5. The target's prediction per slot.
    for (int64_t b = 0; b < B; ++b) {
      float* dst = p.attn_out + (b * R + k) * T * H * Dv;
      std::copy(w.out.begin() + b * T * H * Dv, w.out.begin() + (b + 1) * T * H * Dv, dst);
      for (int64_t slot = 0; slot < T; ++slot) {
        if (slot >= w.tree_len[b]) {
          w.predict[b * T + slot] = 0;
          continue;
        }
        const int64_t tok = w.node_token_ids[b * T + slot];
        for (int64_t e = 0; e < E; ++e) y[e] = bf16_to_double(p.target_emb[tok * E + e]);
        for (int64_t j = 0; j < H * Dv; ++j) orow[j] = static_cast<double>(w.out[(b * T + slot) * H * Dv + j]);
        for (int64_t j = 0; j < H * Dv; ++j) {
          const double oj = orow[j];
          const uint16_t* wo = p.target_w_o + j * E;
          for (int64_t e = 0; e < E; ++e) y[e] += oj * bf16_to_double(wo[e]);
        }
        for (int64_t v = 0; v < V; ++v) logit[v] = 0.0;
        for (int64_t e = 0; e < E; ++e) {
          const double ye = y[e];
          const uint16_t* wl = p.target_w_lm + e * V;
          for (int64_t v = 0; v < V; ++v) logit[v] += ye * bf16_to_double(wl[v]);
        }
        int64_t best = 0;
        for (int64_t v = 1; v < V; ++v)
          if (logit[v] > logit[best]) best = v;
        w.predict[b * T + slot] = best;
      }
    }
    // 6. The accept walk.
    TreeAcceptParams ta{};
    ta.node_token_ids = w.node_token_ids.data();
    ta.next_token = w.next_token.data();
    ta.next_sibling = w.next_sibling.data();
    ta.node_count = w.node_count.data();
    ta.target_predict = w.predict.data();
    ta.accepted_count = w.accepted_count.data();
    ta.accepted_path = w.accepted_path.data();
    ta.proposed = w.proposed.data();
    ta.status = w.accept_status.data();
    ta.B = B;
    ta.T = T;
    cpu::tree_accept(ta);
    // 7. Outputs of the step and the KV commit of the accepted path.
    for (int64_t b = 0; b < B; ++b) {
      if (w.accept_status[b] != 0)
        return ddtree_decode_error_message({KDTR_DDTREE_DECODE_TREE_ACCEPT_STATUS, static_cast<int32_t>(b),
                                            static_cast<int32_t>(k), w.accept_status[b]},
                                           S);
      const int32_t a = w.accepted_count[b];
      p.accepted_count[b * R + k] = a;
      for (int64_t i = 0; i < T; ++i) {
        p.accepted_path[(b * R + k) * T + i] = w.accepted_path[b * T + i];
        p.step_tokens[(b * R + k) * T + i] = i <= a ? w.proposed[b * T + i] : -1;
      }
      const int64_t n0 = w.n[b];
      for (int32_t i = 0; i <= a; ++i) {
        const int64_t slot = w.accepted_path[b * T + i];
        std::copy(w.c.begin() + (b * T + slot) * Dqk, w.c.begin() + (b * T + slot + 1) * Dqk,
                  w.cache.begin() + (b * S + n0 + i) * Dqk);
      }
      std::fill(w.cache.begin() + (b * S + n0 + a + 1) * Dqk, w.cache.begin() + (b + 1) * S * Dqk, kBf16QuietNan);
      w.n[b] = static_cast<int32_t>(n0 + a + 1);
      w.root[b] = w.proposed[b * T + a];
    }
  }
  for (int64_t b = 0; b < B; ++b) {
    p.cache_len[b] = w.n[b];
    for (int64_t r = 0; r < S; ++r)
      for (int64_t d = 0; d < Dqk; ++d)
        p.final_kv_cache[(b * S + r) * Dqk + d] = r < w.n[b] ? w.cache[(b * S + r) * Dqk + d] : uint16_t{0};
  }
  return "";
}

}  // namespace kdtr
