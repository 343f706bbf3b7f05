// ddtree_decode.cu -- ddtree_decode's CUDA decode loop (docs/ops/ddtree_decode.md; host API
// ddtree_decode_launch.h).  R steps on one stream, no host round trip: per step the drafter
// kernel, the project's tree_build, the projection kernel, verify_attn (its planned kernel),
// the prediction kernel, tree_accept and the commit kernel; an init kernel before the first
// step and a final kernel after the last.
//
// Bits: the per-token pieces are ddtree_decode.cuh's KDTR_HD functions, the CPU backend's.
// The projections of the fixed-point weights are exact in double in any order; the
// drafter's log-softmax goes through kdtr_detmath.hpp (exp and log per element, the
// fixed-order sum by one thread), so with FMA contraction off (the Makefile compiles this
// file with -fmad=false) the drafts are the CPU's and the reference's, bit for bit.  The
// logits accumulate in double in the CPU's order (one thread per output, the inner index
// ascending); they follow verify_attn's output, which differs from the CPU's within the
// contract, and only their argmax matters: the goldens' margins exceed that error 20x.
//
// The step checks of the CPU backend (tree_build's status, the cache rows a step needs,
// tree_accept's status) are made on the device: the failure the CPU would report (the first
// step's, the lowest request's) is kept in the workspace's stop record and every later
// launch of the decode does nothing but keep the lengths valid (tree_len 0), so no kernel
// reads or writes past S.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "ddtree_decode.cuh"
#include "ddtree_decode_launch.h"
#include "tree_accept_launch.h"
#include "tree_build_launch.h"

namespace kdtr {
namespace {

constexpr int kThreads = 256;

#define KDTR_DDTREE_CHECK(call)                     \
  do {                                              \
    const cudaError_t kdtr_err_ = (call);           \
    if (kdtr_err_ != cudaSuccess) return kdtr_err_; \
  } while (0)
constexpr int kWarps = kThreads / 32;

// The device's record of a stopped decode: key = request << 2 | kind (kNoStop: none).
constexpr unsigned long long kNoStop = ~0ull;
struct StopRecord {
  unsigned long long key;
  int32_t step, stage;  // stage INT32_MAX: none
};

// The workspace's arrays, each at a 256-byte boundary.
struct Layout {
  size_t lp, ids, budget, depth_limit;  // drafts [B,D,K], [B]
  size_t node_count, node_token_ids, node_depths, parents, next_token, next_sibling, visibility, status;
  size_t tree_len, q, c, cache, out, lse, predict;                         // step
  size_t accepted_count, accepted_path, proposed, accept_status, n, root;  // accept, state
  size_t s, x, lp_all, taken, y, error, error_value, bytes;                // scratch
};

size_t take(size_t* at, int64_t count, size_t item) {
  const size_t here = *at;
  *at += (static_cast<size_t>(count) * item + 255) / 256 * 256;
  return here;
}

Layout layout(const DdtreeDecodeParams& p) {
  const int64_t B = p.B, T = p.N + 1, D = p.draft_depth, K = p.draft_top_k;
  Layout l{};
  size_t at = 0;
  l.lp = take(&at, B * D * K, 4);
  l.ids = take(&at, B * D * K, 8);
  l.budget = take(&at, B, 4);
  l.depth_limit = take(&at, B, 4);
  l.node_count = take(&at, B, 4);
  l.node_token_ids = take(&at, B * T, 8);
  l.node_depths = take(&at, B * T, 4);
  l.parents = take(&at, B * T, 4);
  l.next_token = take(&at, B * T, 4);
  l.next_sibling = take(&at, B * T, 4);
  l.visibility = take(&at, B * T * T, 1);
  l.status = take(&at, B, 4);
  l.tree_len = take(&at, B, 4);
  l.q = take(&at, B * T * p.H * p.Dqk, 2);
  l.c = take(&at, B * T * p.Dqk, 2);
  l.cache = take(&at, B * p.S * p.Dqk, 2);
  l.out = take(&at, B * T * p.H * p.Dv, 4);
  l.lse = take(&at, B * T * p.H, 4);
  l.predict = take(&at, B * T, 8);
  l.accepted_count = take(&at, B, 4);
  l.accepted_path = take(&at, B * T, 4);
  l.proposed = take(&at, B * T, 8);
  l.accept_status = take(&at, B, 4);
  l.n = take(&at, B, 4);
  l.root = take(&at, B, 8);
  l.s = take(&at, B * p.V, 8);
  l.x = take(&at, B * p.V, 8);
  l.lp_all = take(&at, B * p.V, 4);
  l.taken = take(&at, B * p.V, 1);
  l.y = take(&at, B * T * p.E, 8);
  l.error = take(&at, 1, sizeof(StopRecord));
  l.error_value = take(&at, B, 4);
  l.bytes = at;
  return l;
}

// (nullptr for a null workspace: the stages' dims alone, for planning)
template <class T>
T* at(void* ws, size_t offset) {
  return ws == nullptr ? nullptr : reinterpret_cast<T*>(static_cast<char*>(ws) + offset);
}

// The loop's device state: the stages' arrays plus the scratch only this file uses.
struct Loop {
  DdtreeDecodeParams p;
  float* lp;
  int64_t* ids;
  int32_t *budget, *depth_limit, *node_count, *status, *tree_len, *accepted_count, *accepted_path, *accept_status, *n;
  int64_t *node_token_ids, *predict, *proposed, *root;
  uint16_t *q, *c, *cache;
  float* out;
  double *s, *x, *y;
  float* lp_all;
  uint8_t* taken;
  StopRecord* error;
  int32_t* error_value;  // [B]: the value of the request's failed check
};

Loop loop_of(const DdtreeDecodeParams& p, void* ws) {
  const Layout l = layout(p);
  Loop o{};
  o.p = p;
  o.lp = at<float>(ws, l.lp);
  o.ids = at<int64_t>(ws, l.ids);
  o.budget = at<int32_t>(ws, l.budget);
  o.depth_limit = at<int32_t>(ws, l.depth_limit);
  o.node_count = at<int32_t>(ws, l.node_count);
  o.status = at<int32_t>(ws, l.status);
  o.tree_len = at<int32_t>(ws, l.tree_len);
  o.accepted_count = at<int32_t>(ws, l.accepted_count);
  o.accepted_path = at<int32_t>(ws, l.accepted_path);
  o.accept_status = at<int32_t>(ws, l.accept_status);
  o.n = at<int32_t>(ws, l.n);
  o.node_token_ids = at<int64_t>(ws, l.node_token_ids);
  o.predict = at<int64_t>(ws, l.predict);
  o.proposed = at<int64_t>(ws, l.proposed);
  o.root = at<int64_t>(ws, l.root);
  o.q = at<uint16_t>(ws, l.q);
  o.c = at<uint16_t>(ws, l.c);
  o.cache = at<uint16_t>(ws, l.cache);
  o.out = at<float>(ws, l.out);
  o.s = at<double>(ws, l.s);
  o.x = at<double>(ws, l.x);
  o.y = at<double>(ws, l.y);
  o.lp_all = at<float>(ws, l.lp_all);
  o.taken = at<uint8_t>(ws, l.taken);
  o.error = at<StopRecord>(ws, l.error);
  o.error_value = at<int32_t>(ws, l.error_value);
  return o;
}

// The stages that check: step k's projection (2k) and commit (2k + 1).  A launch of stage
// `stage` does nothing where the decode stopped at an earlier stage; failures found by one
// launch are all recorded, so that the record is the one the CPU backend reports.
__device__ bool stopped_before(const Loop& o, int64_t stage) {
  return *reinterpret_cast<volatile const int32_t*>(&o.error->stage) < stage;
}

// A failed check of request b at step k (stage 2k or 2k + 1).  The record keeps the first
// stage's failures (every later stage does nothing) and of those the lowest request's (the
// key's order: the CPU's, which stops at the first request that fails).  A request fails
// one check per stage, found by one thread: its value needs no atomic.
__device__ void record(const Loop& o, int32_t kind, int64_t b, int64_t k, int64_t stage, int64_t value) {
  o.error_value[b] = static_cast<int32_t>(value);
  o.error->step = static_cast<int32_t>(k);  // the same k from every writer
  atomicMin(&o.error->stage, static_cast<int32_t>(stage));
  atomicMin(&o.error->key, static_cast<unsigned long long>(b) << 2 | static_cast<unsigned long long>(kind));
}

// (value, id) pairs: the larger value first, the lower id among equal values.
struct Best {
  double v;
  int64_t id;
};
__device__ bool better(const Best& a, const Best& b) { return a.v > b.v || (a.v == b.v && a.id < b.id); }

// The block's best pair (every thread gets it).  `red` is kWarps pairs of shared memory.
__device__ Best block_best(Best m, Best* red) {
  for (int off = 16; off > 0; off >>= 1) {
    Best o{__shfl_down_sync(0xffffffffu, m.v, off), __shfl_down_sync(0xffffffffu, m.id, off)};
    if (better(o, m)) m = o;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // red is free
  if (lane == 0) red[warp] = m;
  __syncthreads();
  Best r = red[0];
  for (int w = 1; w < kWarps; ++w)
    if (better(red[w], r)) r = red[w];
  return r;
}

__device__ double block_max(double m, double* red) {
  for (int off = 16; off > 0; off >>= 1) m = fmax(m, __shfl_down_sync(0xffffffffu, m, off));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) red[warp] = m;
  __syncthreads();
  double r = red[0];
  for (int w = 1; w < kWarps; ++w) r = fmax(r, red[w]);
  return r;
}

// Before the first step: the working cache (the committed rows, the rest quiet NaN), the
// committed lengths and roots, the error record cleared.  One block per request.
__global__ void __launch_bounds__(kThreads) init_kernel(const __grid_constant__ Loop o) {
  const DdtreeDecodeParams& p = o.p;
  const int64_t b = blockIdx.x, S = p.S, Dqk = p.Dqk;
  const int64_t n = p.prefix_len[b];
  for (int64_t i = threadIdx.x; i < S * Dqk; i += kThreads)
    o.cache[b * S * Dqk + i] = i / Dqk < n ? p.kv_cache[b * S * Dqk + i] : kBf16QuietNan;
  if (threadIdx.x == 0) {
    o.n[b] = static_cast<int32_t>(n);
    o.root[b] = p.root_token_ids[b];
    if (b == 0) *o.error = StopRecord{kNoStop, 0, INT32_MAX};
  }
}

// 1. The drafts of step k: along the drafter's top-1 chain from the root, per depth the
// log-probs of every token (ddtree_draft_log_probs's steps, spread over the block) and the
// top K by (log-prob descending, id ascending).  One block per request.
__global__ void __launch_bounds__(kThreads) draft_kernel(const __grid_constant__ Loop o, int64_t k) {
  const DdtreeDecodeParams& p = o.p;
  const int64_t b = blockIdx.x, V = p.V, E = p.E, D = p.draft_depth, K = p.draft_top_k, R = p.R;
  __shared__ Best red[kWarps];
  __shared__ double redmax[kWarps];
  __shared__ double lse;
  if (threadIdx.x == 0) {
    o.budget[b] = p.budget[b * R + k];
    o.depth_limit[b] = p.depth_limit[b * R + k];
  }
  if (stopped_before(o, 2 * k)) return;
  double* s = o.s + b * V;
  double* x = o.x + b * V;
  float* lp = o.lp_all + b * V;
  uint8_t* taken = o.taken + b * V;
  int64_t t = o.root[b];
  for (int64_t d = 0; d < D; ++d) {
    double m = -INFINITY;
    for (int64_t v = threadIdx.x; v < V; v += kThreads) {
      double acc = 0.0;  // the fixed-point row of ddtree_fixed_row, exact
      for (int64_t e = 0; e < E; ++e)
        acc += bf16_to_double(p.draft_emb[t * E + e]) * bf16_to_double(p.draft_w_lm[e * V + v]);
      s[v] = acc;
      taken[v] = 0;
      m = fmax(m, acc);
    }
    m = block_max(m, redmax);
    for (int64_t v = threadIdx.x; v < V; v += kThreads) {
      s[v] -= m;  // exact
      x[v] = detmath::exp(s[v]);
    }
    __syncthreads();
    if (threadIdx.x == 0) lse = detmath::log(detmath::fixed_sum(x, static_cast<int>(V)));
    __syncthreads();
    for (int64_t v = threadIdx.x; v < V; v += kThreads) lp[v] = static_cast<float>(s[v] - lse);
    __syncthreads();
    for (int64_t j = 0; j < K; ++j) {
      Best mine{-INFINITY, INT64_MAX};
      for (int64_t v = threadIdx.x; v < V; v += kThreads) {
        const Best c{static_cast<double>(lp[v]), v};
        if (!taken[v] && better(c, mine)) mine = c;
      }
      const Best top = block_best(mine, red);
      if (threadIdx.x == 0) {
        taken[top.id] = 1;
        const int64_t dst = ((b * R + k) * D + d) * K + j, i = (b * D + d) * K + j;
        o.lp[i] = p.top_log_probs[dst] = static_cast<float>(top.v);
        o.ids[i] = p.top_token_ids[dst] = top.id;
      }
      if (j == 0) t = top.id;
      __syncthreads();  // taken
    }
  }
}

// 3. After tree_build: the step's checks, tree_len, and q and c of every tree slot (c into
// the working cache after the committed rows).  One block per (request, slot).
__global__ void __launch_bounds__(kThreads) project_kernel(const __grid_constant__ Loop o, int64_t k) {
  const DdtreeDecodeParams& p = o.p;
  const int64_t T = p.N + 1, E = p.E, H = p.H, Dqk = p.Dqk, S = p.S, R = p.R;
  const int64_t b = blockIdx.x / T, slot = blockIdx.x % T;
  const bool lead = slot == 0 && threadIdx.x == 0;
  const int64_t tl = static_cast<int64_t>(o.node_count[b]) + 1, n0 = o.n[b];
  const bool earlier = stopped_before(o, 2 * k);
  if (earlier || o.status[b] != 0 || n0 + tl > S) {
    if (lead) {
      o.tree_len[b] = 0;  // verify_attn reads no tree row of this request
      if (earlier) return;
      if (o.status[b] != 0) record(o, KDTR_DDTREE_DECODE_TREE_BUILD_STATUS, b, k, 2 * k, o.status[b]);
      else record(o, KDTR_DDTREE_DECODE_CACHE_ROWS, b, k, 2 * k, n0 + tl);
    }
    return;
  }
  if (lead) {
    o.tree_len[b] = static_cast<int32_t>(tl);
    p.node_count[b * R + k] = o.node_count[b];
  }
  uint16_t* q = o.q + (b * T + slot) * H * Dqk;
  if (slot >= tl) {
    for (int64_t j = threadIdx.x; j < H * Dqk; j += kThreads) q[j] = 0;
    return;
  }
  const int64_t tok = o.node_token_ids[b * T + slot];
  const uint16_t* x = p.target_emb + tok * E;
  for (int64_t j = threadIdx.x; j < H * Dqk; j += kThreads) {
    double acc = 0.0;
    for (int64_t e = 0; e < E; ++e) acc += bf16_to_double(x[e]) * bf16_to_double(p.target_w_q[e * H * Dqk + j]);
    q[j] = ddtree_round_bf16(acc);
  }
  for (int64_t j = threadIdx.x; j < Dqk; j += kThreads) {
    double acc = 0.0;
    for (int64_t e = 0; e < E; ++e) acc += bf16_to_double(x[e]) * bf16_to_double(p.target_w_kv[e * Dqk + j]);
    const uint16_t cv = ddtree_round_bf16(acc);
    o.c[(b * T + slot) * Dqk + j] = cv;
    o.cache[(b * S + n0 + slot) * Dqk + j] = cv;
  }
}

// 5. After verify_attn: the step's attn_out rows, and the target's prediction per live slot
// (the residual y = emb + out @ w_o, the logits y @ w_lm, their argmax with the lowest id
// of a tie; slots past the tree: 0).  One block per (request, slot).
__global__ void __launch_bounds__(kThreads) predict_kernel(const __grid_constant__ Loop o, int64_t k) {
  const DdtreeDecodeParams& p = o.p;
  const int64_t T = p.N + 1, E = p.E, HDv = p.H * p.Dv, V = p.V, R = p.R;
  const int64_t b = blockIdx.x / T, slot = blockIdx.x % T;
  __shared__ Best red[kWarps];
  if (stopped_before(o, 2 * k + 1)) return;
  const float* out = o.out + (b * T + slot) * HDv;
  float* dst = p.attn_out + ((b * R + k) * T + slot) * HDv;
  for (int64_t j = threadIdx.x; j < HDv; j += kThreads) dst[j] = out[j];
  if (slot >= o.tree_len[b]) {
    if (threadIdx.x == 0) o.predict[b * T + slot] = 0;
    return;
  }
  const int64_t tok = o.node_token_ids[b * T + slot];
  double* y = o.y + (b * T + slot) * E;
  for (int64_t e = threadIdx.x; e < E; e += kThreads) {
    double acc = bf16_to_double(p.target_emb[tok * E + e]);
    for (int64_t j = 0; j < HDv; ++j) acc += static_cast<double>(out[j]) * bf16_to_double(p.target_w_o[j * E + e]);
    y[e] = acc;
  }
  __syncthreads();
  Best mine{-INFINITY, INT64_MAX};
  for (int64_t v = threadIdx.x; v < V; v += kThreads) {
    double logit = 0.0;
    for (int64_t e = 0; e < E; ++e) logit += y[e] * bf16_to_double(p.target_w_lm[e * V + v]);
    const Best c{logit, v};
    if (better(c, mine)) mine = c;
  }
  const Best top = block_best(mine, red);
  if (threadIdx.x == 0) o.predict[b * T + slot] = top.id;
}

// 7. After tree_accept: the step's outputs, the KV commit of the accepted path (its rows
// after the committed ones; every row after them quiet NaN again), the new length and the
// bonus token as the next root.  One block per request.
__global__ void __launch_bounds__(kThreads) commit_kernel(const __grid_constant__ Loop o, int64_t k) {
  const DdtreeDecodeParams& p = o.p;
  const int64_t T = p.N + 1, Dqk = p.Dqk, S = p.S, R = p.R;
  const int64_t b = blockIdx.x;
  if (stopped_before(o, 2 * k + 1)) return;
  if (o.accept_status[b] != 0) {
    if (threadIdx.x == 0) record(o, KDTR_DDTREE_DECODE_TREE_ACCEPT_STATUS, b, k, 2 * k + 1, o.accept_status[b]);
    return;
  }
  const int64_t a = o.accepted_count[b], n0 = o.n[b];
  if (threadIdx.x == 0) p.accepted_count[b * R + k] = static_cast<int32_t>(a);
  for (int64_t i = threadIdx.x; i < T; i += kThreads) {
    p.accepted_path[(b * R + k) * T + i] = o.accepted_path[b * T + i];
    p.step_tokens[(b * R + k) * T + i] = i <= a ? o.proposed[b * T + i] : -1;
  }
  for (int64_t i = threadIdx.x; i < (S - n0) * Dqk; i += kThreads) {
    const int64_t row = i / Dqk, d = i % Dqk;
    o.cache[(b * S + n0) * Dqk + i] = row <= a ? o.c[(b * T + o.accepted_path[b * T + row]) * Dqk + d] : kBf16QuietNan;
  }
  __syncthreads();  // every thread has read n0
  if (threadIdx.x == 0) {
    o.n[b] = static_cast<int32_t>(n0 + a + 1);
    o.root[b] = o.proposed[b * T + a];
  }
}

// After the last step: cache_len and final_kv_cache (the committed rows, the rest 0).
__global__ void __launch_bounds__(kThreads) final_kernel(const __grid_constant__ Loop o) {
  const DdtreeDecodeParams& p = o.p;
  const int64_t b = blockIdx.x, S = p.S, Dqk = p.Dqk;
  const int64_t n = o.n[b];
  if (threadIdx.x == 0) p.cache_len[b] = static_cast<int32_t>(n);
  for (int64_t i = threadIdx.x; i < S * Dqk; i += kThreads)
    p.final_kv_cache[b * S * Dqk + i] = i / Dqk < n ? o.cache[b * S * Dqk + i] : uint16_t{0};
}

}  // namespace

size_t ddtree_decode_workspace_bytes(const DdtreeDecodeParams& p) { return layout(p).bytes; }

DdtreeDecodeStages ddtree_decode_stages(const DdtreeDecodeParams& p, void* ws) {
  const Layout l = layout(p);
  const Loop o = loop_of(p, ws);
  DdtreeDecodeStages st{};
  st.workspace = ws;
  TreeBuildParams& tb = st.build;
  tb.top_log_probs = o.lp;
  tb.top_token_ids = o.ids;
  tb.root_token_ids = o.root;
  tb.budget = o.budget;
  tb.depth_limit = o.depth_limit;
  tb.node_count = o.node_count;
  tb.node_token_ids = o.node_token_ids;
  tb.node_depths = at<int32_t>(ws, l.node_depths);
  tb.parents = at<int32_t>(ws, l.parents);
  tb.next_token = at<int32_t>(ws, l.next_token);
  tb.next_sibling = at<int32_t>(ws, l.next_sibling);
  tb.visibility = at<uint8_t>(ws, l.visibility);
  tb.status = o.status;
  tb.heap_fallback = nullptr;
  tb.B = p.B;
  tb.D = p.draft_depth;
  tb.K = p.draft_top_k;
  tb.N = p.N;
  tb.kernel = KDTR_TREE_BUILD_AUTO;
  VerifyAttnProblem& va = st.attn;
  va.q = o.q;
  va.kv_cache = o.cache;
  va.prefix_len = o.n;
  va.tree_len = o.tree_len;
  va.visibility = tb.visibility;
  va.out = o.out;
  va.lse = at<float>(ws, l.lse);
  va.sm_scale = p.sm_scale;
  va.B = p.B;
  va.T = p.N + 1;
  va.H = p.H;
  va.S = p.S;
  va.Dqk = p.Dqk;
  va.d_v = p.Dv;
  va.dtype = KDTR_DTYPE_BF16;
  va.kernel = KDTR_VERIFY_ATTN_AUTO;
  TreeAcceptParams& ta = st.accept;
  ta.node_token_ids = o.node_token_ids;
  ta.next_token = tb.next_token;
  ta.next_sibling = tb.next_sibling;
  ta.node_count = o.node_count;
  ta.target_predict = o.predict;
  ta.accepted_count = o.accepted_count;
  ta.accepted_path = o.accepted_path;
  ta.proposed = o.proposed;
  ta.status = o.accept_status;
  ta.B = p.B;
  ta.T = p.N + 1;
  return st;
}

cudaError_t launch_ddtree_decode(const DdtreeDecodeParams& p, const DdtreeDecodeStages& st, const VerifyAttnPlan& plan,
                                 cudaStream_t stream) {
  const int64_t B = p.B, T = p.N + 1;
  if (B < 0 || p.R < 0 || p.N < 0 || p.V < 1 || p.E < 0 || p.draft_depth < 1 || p.draft_top_k < 1 ||
      p.draft_top_k > p.V || B > 0x7fffffffLL || B * T > 0x7fffffffLL || st.workspace == nullptr)
    return cudaErrorInvalidValue;
  if (B == 0) return cudaSuccess;
  const Loop o = loop_of(p, st.workspace);
  const unsigned requests = static_cast<unsigned>(B), slots = static_cast<unsigned>(B * T);
  init_kernel<<<requests, kThreads, 0, stream>>>(o);
  KDTR_DDTREE_CHECK(cudaGetLastError());
  for (int64_t k = 0; k < p.R; ++k) {
    draft_kernel<<<requests, kThreads, 0, stream>>>(o, k);
    KDTR_DDTREE_CHECK(cudaGetLastError());
    KDTR_DDTREE_CHECK(launch_tree_build(st.build, stream));
    project_kernel<<<slots, kThreads, 0, stream>>>(o, k);
    KDTR_DDTREE_CHECK(cudaGetLastError());
    KDTR_DDTREE_CHECK(launch_verify_attn(st.attn, plan, stream));
    predict_kernel<<<slots, kThreads, 0, stream>>>(o, k);
    KDTR_DDTREE_CHECK(cudaGetLastError());
    KDTR_DDTREE_CHECK(launch_tree_accept(st.accept, stream));
    commit_kernel<<<requests, kThreads, 0, stream>>>(o, k);
    KDTR_DDTREE_CHECK(cudaGetLastError());
  }
  final_kernel<<<requests, kThreads, 0, stream>>>(o);
  return cudaGetLastError();
}

cudaError_t ddtree_decode_read_error(const DdtreeDecodeParams& p, const void* workspace, cudaStream_t stream,
                                     DdtreeDecodeError* out) {
  *out = DdtreeDecodeError{KDTR_DDTREE_DECODE_OK, 0, 0, 0};
  if (p.B <= 0) return cudaSuccess;
  KDTR_DDTREE_CHECK(cudaStreamSynchronize(stream));
  const Layout l = layout(p);
  const char* ws = static_cast<const char*>(workspace);
  StopRecord r{};
  KDTR_DDTREE_CHECK(cudaMemcpy(&r, ws + l.error, sizeof r, cudaMemcpyDeviceToHost));
  if (r.key == kNoStop) return cudaSuccess;
  const int64_t b = static_cast<int64_t>(r.key >> 2);
  int32_t value = 0;
  KDTR_DDTREE_CHECK(cudaMemcpy(&value, ws + l.error_value + b * 4, sizeof value, cudaMemcpyDeviceToHost));
  *out = DdtreeDecodeError{static_cast<int32_t>(r.key & 3u), static_cast<int32_t>(b), r.step, value};
  return cudaSuccess;
}

}  // namespace kdtr
