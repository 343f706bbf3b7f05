// tree_build.cuh -- best-first DDTree draft-tree builder, one request at a time.
//
// Contract: docs/ops/tree_build.md (source: shared/DESIGN.md section 3.1); reference:
// kdtr/ops/tree_build.py, after the reference tree builder of Ringel & Romano,
// "Accelerating Speculative Decoding with Block Diffusion Draft Trees" (DDTree).  The
// per-request pieces below are KDTR_HD, so the CPU backend (tree_build_cpu, at the end)
// and the CUDA kernel (tree_build.cu) run the very same code:
//
//   tree_build_check_ranges  statuses 1-2 (budget, depth_limit out of range)
//   tree_build_check_item    statuses 3-6 that element (d, r) of a checked row proves
//   tree_build_init_slots    the slot arrays of an empty tree (root in slot 0)
//   tree_build_grow          the best-first loop: heap of candidates -> slots and links
//   tree_build_ancestors     the root path of a slot (one visibility row)
//   tree_build_node_outputs  one slot's entries of the five [T] node rows
//
// Shapes: D draft depth, K top-k width, N maximum budget, T = N + 1 slots (slot 0 = root).
// Per request the input pointers point at element [b, 0, 0] of top_log_probs f32 [B,D,K]
// and top_token_ids i64 [B,D,K]; row d (depth d + 1) is lp[d*K .. d*K + K).
//
// Scores are float64: lp widened exactly from f32, the sibling score evaluated as
// (w - lp[d-1][r]) + lp[d-1][r+1] and the child score as w + lp[d][0], each a single IEEE
// binary64 addition, left to right (no multiply, so no FMA contraction is possible; the
// host build is x86-64 SSE2, no excess precision).
//
// Order of candidates (strict and total): larger w first; equal w -> smaller rank path
// (the ranks from depth 1 to d) first, lexicographically, a path before its extensions.
// The tie-break is exact for every D and K: a candidate (d, r, p) is the path of its parent
// slot p followed by r, and two paths are compared by walking both up the built tree to
// their common prefix (tree_build_path_less, at most d steps, only on equal scores), so no
// packed encoding and no limit on D or K.
//
// Memory: the heap is a caller-provided array of capacity budget + 1 (the queue never
// holds more: each pop adds at most two candidates, and the last pop adds none), the slot
// arrays are five int32 [T] arrays (parent, depth, rank, first child, next sibling).  The
// CUDA kernel keeps all of them in shared memory, the CPU backend in std::vectors.
//
// Reads of the inputs never leave the request's [D,K] rows and never touch a row
// d >= depth_limit: validation checks rows d < depth_limit only (and none at all when
// budget or depth_limit is out of range), and the builder reads lp[d-1][*] and lp[d][0] for
// d < depth_limit and ids[d-1][r] for the nodes it placed.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "kdtr_hd.cuh"

namespace kdtr {

// One tree_build call (the CPU backend's tree_build_cpu and the CUDA launcher
// launch_tree_build take the same struct; host or device pointers accordingly).  Names
// as in docs/ops/tree_build.md; row-major tensors, T = N + 1 slots.
struct TreeBuildParams {
  const float* top_log_probs = nullptr;     // f32 [B,D,K]
  const int64_t* top_token_ids = nullptr;   // i64 [B,D,K]
  const int64_t* root_token_ids = nullptr;  // i64 [B]
  const int32_t* budget = nullptr;          // i32 [B]
  const int32_t* depth_limit = nullptr;     // i32 [B]
  int32_t* node_count = nullptr;            // i32 [B]
  int64_t* node_token_ids = nullptr;        // i64 [B,T]
  int32_t* node_depths = nullptr;           // i32 [B,T]
  int32_t* parents = nullptr;               // i32 [B,T]
  int32_t* next_token = nullptr;            // i32 [B,T]
  int32_t* next_sibling = nullptr;          // i32 [B,T]
  uint8_t* visibility = nullptr;            // u8 [B,T,T]
  int32_t* status = nullptr;                // i32 [B]
  int64_t B = 0, D = 0, K = 0, N = 0;       // N: max_budget
};

// tree_build status codes (docs/ops/tree_build.md), in the order they are checked: the
// first that holds is the status.
enum TreeBuildStatus : int32_t {
  TREE_BUILD_OK = 0,
  TREE_BUILD_BAD_BUDGET = 1,       // budget < 0 or budget > N
  TREE_BUILD_BAD_DEPTH_LIMIT = 2,  // depth_limit < 0 or depth_limit > D
  TREE_BUILD_NON_FINITE = 3,       // NaN or +-inf log-prob in a checked row
  TREE_BUILD_UNSORTED = 4,         // lp[d][r] < lp[d][r+1] in a checked row
  TREE_BUILD_DUPLICATE_ID = 5,     // two equal token ids in a checked row
  TREE_BUILD_NEGATIVE_ID = 6,      // a token id < 0 in a checked row
  TREE_BUILD_NO_DEFECT = 7,        // not a status: "no defect found" in a min-reduction
};

// One candidate of the best-first queue (24 bytes).  `prev` is the slot of the previous
// sibling (the node whose pop pushed this sibling candidate), or -1 for a first-child
// candidate (r == 0): children of one parent are placed in rank order, so this is all the
// links need.
struct TreeBuildCand {
  double w;      // score: sum of the log-probs on the rank path, float64
  int32_t d;     // depth, 1..depth_limit
  int32_t r;     // rank within the row, 0..K-1
  int32_t p;     // parent slot
  int32_t prev;  // previous sibling slot, or -1
};

// The per-slot arrays of one request's tree, T = N + 1 entries each.  Empty slots hold -1
// everywhere; the root (slot 0) has depth 0 and parent/rank -1.
struct TreeBuildSlots {
  int32_t* parent;
  int32_t* depth;
  int32_t* rank;          // rank r of the node within its row (-1 for the root)
  int32_t* first_child;   // next_token output: the smallest-index child
  int32_t* next_sibling;  // next_sibling output: the next larger-index child of the parent
};

// ---------------------------------------------------------------------------------------
// Validation
// ---------------------------------------------------------------------------------------

// Status 1 or 2, or TREE_BUILD_OK when budget is in [0, N] and depth_limit in [0, D].
KDTR_HD inline int32_t tree_build_check_ranges(int32_t budget, int32_t depth_limit, int64_t N, int64_t D) {
  if (budget < 0 || static_cast<int64_t>(budget) > N) return TREE_BUILD_BAD_BUDGET;
  if (depth_limit < 0 || static_cast<int64_t>(depth_limit) > D) return TREE_BUILD_BAD_DEPTH_LIMIT;
  return TREE_BUILD_OK;
}

// True for NaN and +-inf (exponent bits all ones), by the bits: immune to fast-math flags.
KDTR_HD inline bool tree_build_non_finite(float x) {
#if defined(__CUDA_ARCH__)
  const uint32_t u = __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
#endif
  return (u & 0x7f800000u) == 0x7f800000u;
}

// The smallest of statuses 3-6 that element (d, r) of a checked row witnesses, or
// TREE_BUILD_NO_DEFECT: NON_FINITE if lp[d][r] is not finite, UNSORTED if
// lp[d][r] < lp[d][r+1], DUPLICATE_ID if ids[d][r] == ids[d][r'] for some r' > r,
// NEGATIVE_ID if ids[d][r] < 0.  Each status is "some element witnesses it", so the
// minimum over all elements of the checked rows is the first status of the contract's
// order that holds -- whatever order (or thread) visits the elements.  Reads row d only.
KDTR_HD inline int32_t tree_build_check_item(const float* lp, const int64_t* ids, int64_t K, int64_t d, int64_t r) {
  const float* lrow = lp + d * K;
  const int64_t* irow = ids + d * K;
  if (tree_build_non_finite(lrow[r])) return TREE_BUILD_NON_FINITE;
  // A NaN anywhere in the row already made the status NON_FINITE (a smaller code), so the
  // comparison below only decides between finite values (or is overruled).
  if (r + 1 < K && lrow[r] < lrow[r + 1]) return TREE_BUILD_UNSORTED;
  const int64_t id = irow[r];
  for (int64_t q = r + 1; q < K; ++q)
    if (irow[q] == id) return TREE_BUILD_DUPLICATE_ID;
  if (id < 0) return TREE_BUILD_NEGATIVE_ID;
  return TREE_BUILD_NO_DEFECT;
}

// The whole request's status, sequentially (CPU backend).
KDTR_HD inline int32_t tree_build_validate(const float* lp, const int64_t* ids, int32_t budget, int32_t depth_limit,
                                           int64_t N, int64_t D, int64_t K) {
  const int32_t st = tree_build_check_ranges(budget, depth_limit, N, D);
  if (st != TREE_BUILD_OK) return st;
  int32_t worst = TREE_BUILD_NO_DEFECT;
  for (int64_t d = 0; d < depth_limit && K > 0; ++d)
    for (int64_t r = 0; r < K; ++r) {
      const int32_t s = tree_build_check_item(lp, ids, K, d, r);
      if (s < worst) worst = s;
      if (worst == TREE_BUILD_NON_FINITE) return worst;  // cannot get smaller
    }
  return worst == TREE_BUILD_NO_DEFECT ? TREE_BUILD_OK : worst;
}

// ---------------------------------------------------------------------------------------
// Slots
// ---------------------------------------------------------------------------------------

// Slots [0, T) of an empty tree, striped over `lanes` workers (lane in [0, lanes)): every
// array -1, except the root's depth 0.  (A rejected request keeps exactly this.)
KDTR_HD inline void tree_build_init_slots(TreeBuildSlots s, int64_t T, int64_t lane, int64_t lanes) {
  for (int64_t i = lane; i < T; i += lanes) {
    s.parent[i] = -1;
    s.depth[i] = i == 0 ? 0 : -1;
    s.rank[i] = -1;
    s.first_child[i] = -1;
    s.next_sibling[i] = -1;
  }
}

// ---------------------------------------------------------------------------------------
// The best-first builder
// ---------------------------------------------------------------------------------------

// True iff the rank path of candidate a is smaller than that of candidate b
// (lexicographic, a path before its extensions).  Candidate (d, r, p) is path(p) + [r],
// where path(p) is read from the built tree: slot q at depth k >= 1 has rank[q] at depth k
// and parent[q] at depth k - 1; every depth-1 slot has parent 0 (the root).  Lift the
// deeper candidate to the other's depth; equal (rank, parent) there means one path is a
// prefix of the other (the shorter comes first); otherwise walk both up until they share
// the parent, where the two ranks differ (one parent never has two children of equal rank)
// and decide.  At most max(da, db) steps.
KDTR_HD inline bool tree_build_path_less(const TreeBuildCand& a, const TreeBuildCand& b, const int32_t* parent,
                                         const int32_t* rank) {
  int32_t da = a.d, ra = a.r, pa = a.p;
  int32_t db = b.d, rb = b.r, pb = b.p;
  while (da > db) {
    ra = rank[pa];
    pa = parent[pa];
    --da;
  }
  while (db > da) {
    rb = rank[pb];
    pb = parent[pb];
    --db;
  }
  if (ra == rb && pa == pb) return a.d < b.d;
  while (pa != pb) {  // both at the same depth >= 2 here; ends at depth 1 (parent 0) at the latest
    ra = rank[pa];
    pa = parent[pa];
    rb = rank[pb];
    pb = parent[pb];
  }
  return ra < rb;
}

// The strict total order of the queue: a pops before b.
KDTR_HD inline bool tree_build_before(const TreeBuildCand& a, const TreeBuildCand& b, const int32_t* parent,
                                      const int32_t* rank) {
  if (a.w != b.w) return a.w > b.w;
  return tree_build_path_less(a, b, parent, rank);
}

// Binary max-heap (in the order above) over heap[0, n).
KDTR_HD inline void tree_build_sift_down(TreeBuildCand* heap, int32_t n, TreeBuildCand x, const int32_t* parent,
                                         const int32_t* rank) {
  int32_t i = 0;
  for (;;) {
    int32_t c = 2 * i + 1;
    if (c >= n) break;
    if (c + 1 < n && tree_build_before(heap[c + 1], heap[c], parent, rank)) ++c;
    if (!tree_build_before(heap[c], x, parent, rank)) break;
    heap[i] = heap[c];
    i = c;
  }
  heap[i] = x;
}

KDTR_HD inline void tree_build_sift_up(TreeBuildCand* heap, int32_t i, TreeBuildCand x, const int32_t* parent,
                                       const int32_t* rank) {
  while (i > 0) {
    const int32_t up = (i - 1) / 2;
    if (!tree_build_before(x, heap[up], parent, rank)) break;
    heap[i] = heap[up];
    i = up;
  }
  heap[i] = x;
}

// Best-first build of one valid request (status OK).  `slots` must hold an empty tree
// (tree_build_init_slots); `heap` has room for budget + 1 candidates.  Fills slots
// 1..node_count (parent, depth, rank) and the links of slots 0..node_count; returns
// node_count.  Reads lp rows d < depth_limit only.
KDTR_HD inline int32_t tree_build_grow(const float* lp, int64_t K, int32_t budget, int32_t depth_limit,
                                       TreeBuildCand* heap, TreeBuildSlots s) {
  if (budget <= 0 || depth_limit <= 0 || K <= 0) return 0;
  int32_t n = 0;     // heap size
  int32_t count = 0; // nodes placed
  heap[n++] = TreeBuildCand{static_cast<double>(lp[0]), 1, 0, 0, -1};
  while (count < budget && n > 0) {
    const TreeBuildCand top = heap[0];
    const int32_t slot = ++count;
    s.parent[slot] = top.p;
    s.depth[slot] = top.d;
    s.rank[slot] = top.r;
    if (top.prev < 0) s.first_child[top.p] = slot;
    else s.next_sibling[top.prev] = slot;
    if (count == budget) break;  // the queue is not needed any more

    const float* row = lp + static_cast<int64_t>(top.d - 1) * K;
    const bool has_sibling = static_cast<int64_t>(top.r) + 1 < K;
    const bool has_child = top.d < depth_limit;
    TreeBuildCand sib{}, child{};
    if (has_sibling) {
      const double w = (top.w - static_cast<double>(row[top.r])) + static_cast<double>(row[top.r + 1]);
      sib = TreeBuildCand{w, top.d, top.r + 1, top.p, slot};
    }
    if (has_child) {
      const double w = top.w + static_cast<double>(lp[static_cast<int64_t>(top.d) * K]);
      child = TreeBuildCand{w, top.d + 1, 0, slot, -1};
    }
    // Pop and push fused: the first new candidate replaces the top (one sift-down), the
    // second is pushed (one sift-up).  The order is total, so the pops do not depend on
    // how the heap is arranged.
    if (has_sibling) {
      tree_build_sift_down(heap, n, sib, s.parent, s.rank);
      if (has_child) {
        ++n;
        tree_build_sift_up(heap, n - 1, child, s.parent, s.rank);
      }
    } else if (has_child) {
      tree_build_sift_down(heap, n, child, s.parent, s.rank);
    } else {
      --n;
      if (n > 0) tree_build_sift_down(heap, n, heap[n], s.parent, s.rank);
    }
  }
  return count;
}

// ---------------------------------------------------------------------------------------
// Outputs
// ---------------------------------------------------------------------------------------

// The slots on the path from the root to slot i (both included), written to anc[0..len),
// i first; returns len = depth[i] + 1.  `anc` needs room for depth_limit + 1 entries.
KDTR_HD inline int32_t tree_build_ancestors(int32_t i, const int32_t* parent, int32_t* anc) {
  int32_t len = 0;
  for (int32_t s = i; s >= 0; s = parent[s]) anc[len++] = s;
  return len;
}

// Slot i's entries of node_token_ids, node_depths, parents, next_token, next_sibling
// (each pointer at element [b, 0] of its [B,T] tensor): the node for i <= node_count,
// -1 everywhere for an empty slot (which the slot arrays already hold).
KDTR_HD inline void tree_build_node_outputs(int64_t i, const int64_t* ids, int64_t K, int64_t root_token,
                                            int32_t node_count, const TreeBuildSlots& s, int64_t* node_token_ids,
                                            int32_t* node_depths, int32_t* parents, int32_t* next_token,
                                            int32_t* next_sibling) {
  int64_t token = -1;
  if (i == 0) token = root_token;
  else if (i <= node_count) token = ids[static_cast<int64_t>(s.depth[i] - 1) * K + s.rank[i]];
  node_token_ids[i] = token;
  node_depths[i] = s.depth[i];
  parents[i] = s.parent[i];
  next_token[i] = s.first_child[i];
  next_sibling[i] = s.next_sibling[i];
}

// One request on the CPU, every output element of it.  `heap` has room for N + 1 >= budget
// + 1 candidates, `slot_mem` for 5 * T int32, `anc` for min(D, N) + 1 int32.
// The row pointers point at element [b, 0] (or [b, 0, 0]) of their tensors.  Returns the
// status it also stores in *status.
inline int32_t tree_build_request(const float* lp, const int64_t* ids, int64_t root_token, int32_t budget,
                                  int32_t depth_limit, int64_t N, int64_t D, int64_t K, TreeBuildCand* heap,
                                  int32_t* slot_mem, int32_t* anc, int32_t* node_count, int64_t* node_token_ids,
                                  int32_t* node_depths, int32_t* parents, int32_t* next_token,
                                  int32_t* next_sibling, uint8_t* visibility, int32_t* status) {
  const int64_t T = N + 1;
  const TreeBuildSlots s{slot_mem, slot_mem + T, slot_mem + 2 * T, slot_mem + 3 * T, slot_mem + 4 * T};
  tree_build_init_slots(s, T, 0, 1);
  const int32_t st = tree_build_validate(lp, ids, budget, depth_limit, N, D, K);
  const int32_t count = st == TREE_BUILD_OK ? tree_build_grow(lp, K, budget, depth_limit, heap, s) : 0;
  for (int64_t i = 0; i < T; ++i)
    tree_build_node_outputs(i, ids, K, root_token, count, s, node_token_ids, node_depths, parents, next_token,
                            next_sibling);
  std::memset(visibility, 0, static_cast<size_t>(T) * static_cast<size_t>(T));
  for (int32_t i = 0; i <= count; ++i) {
    const int32_t len = tree_build_ancestors(i, s.parent, anc);
    uint8_t* row = visibility + static_cast<int64_t>(i) * T;
    for (int32_t k = 0; k < len; ++k) row[anc[k]] = 1;
  }
  *node_count = count;
  *status = st;
  return st;
}

// CPU backend: the whole batch, row-major tensors as in the golden (top_log_probs f32
// [B,D,K], top_token_ids i64 [B,D,K], root_token_ids i64 [B], budget / depth_limit i32 [B];
// outputs [B] and [B,T] and visibility [B,T,T]).  One heap and one set of slot arrays,
// reused request after request.
inline void tree_build_cpu(const TreeBuildParams& p) {
  const int64_t N = p.N, D = p.D, K = p.K, T = N + 1;
  std::vector<TreeBuildCand> heap(static_cast<size_t>(N + 1));
  std::vector<int32_t> slot_mem(static_cast<size_t>(5 * T));
  std::vector<int32_t> anc(static_cast<size_t>((D < N ? D : N) + 1));  // a root path: <= min(D, N) + 1 slots
  for (int64_t b = 0; b < p.B; ++b) {
    const int64_t in_row = b * D * K, out_row = b * T;
    tree_build_request(p.top_log_probs + in_row, p.top_token_ids + in_row, p.root_token_ids[b], p.budget[b],
                       p.depth_limit[b], N, D, K, heap.data(), slot_mem.data(), anc.data(), p.node_count + b,
                       p.node_token_ids + out_row, p.node_depths + out_row, p.parents + out_row,
                       p.next_token + out_row, p.next_sibling + out_row, p.visibility + b * T * T, p.status + b);
  }
}

}  // namespace kdtr
