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
//   tree_select_grow         the select build: threshold selection + sort (parallel; CUDA)
//   tree_select_node_outputs the node rows of a select build
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
#include "tree_build_params.h"

namespace kdtr {

// Phase clocks for profiling a build (off unless compiled with -DKDTR_TB_CLOCKS): block 0's
// thread 0 stamps clock64() into slot i; the build kernel prints the stamps at its end.
#if defined(KDTR_TB_CLOCKS) && defined(__CUDACC__)
static __device__ long long g_tree_build_clk[64];
#endif
#if defined(KDTR_TB_CLOCKS) && defined(__CUDA_ARCH__)
#define KDTR_TB_MARK(i)                                                       \
  do {                                                                        \
    if (threadIdx.x == 0 && blockIdx.x == 0) g_tree_build_clk[i] = clock64(); \
  } while (0)
#else
#define KDTR_TB_MARK(i) \
  do {                  \
  } while (0)
#endif
#define KDTR_TB_DMARK(k)                               \
  do {                                                 \
    if (d <= 2) KDTR_TB_MARK(41 + (d - 1) * 10 + (k)); \
  } while (0)

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

// True iff the rank path of candidate (da, ra, pa) is smaller than that of (db, rb, pb)
// (lexicographic, a path before its extensions).  Candidate (d, r, p) is path(p) + [r],
// where path(p) is read from the built tree: node q at depth k >= 1 has rank[q] at depth
// k and parent[q] at depth k - 1; every depth-1 node has the same parent (the root: slot 0
// for the heap build, -1 for the select build's entries).  Lift the deeper candidate to
// the other's depth; equal (rank, parent) there means one path is a prefix of the other
// (the shorter comes first); otherwise walk both up until they share the parent, where
// the two ranks differ (one parent never has two children of equal rank) and decide.  At
// most max(da, db) steps.  Shared by both builds (tree_build_path_less, and the select
// build's sort).
KDTR_HD inline bool tree_build_rank_path_less(int32_t da, int32_t ra, int32_t pa, int32_t db, int32_t rb, int32_t pb,
                                              const int32_t* parent, const int32_t* rank) {
  const int32_t a_depth = da, b_depth = db;
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
  if (ra == rb && pa == pb) return a_depth < b_depth;
  while (pa != pb) {  // both at the same depth >= 2 here; ends at depth 1 (the root parent) at the latest
    ra = rank[pa];
    pa = parent[pa];
    rb = rank[pb];
    pb = parent[pb];
  }
  return ra < rb;
}

// The heap build's candidates: a before b by rank path.
KDTR_HD inline bool tree_build_path_less(const TreeBuildCand& a, const TreeBuildCand& b, const int32_t* parent,
                                         const int32_t* rank) {
  return tree_build_rank_path_less(a.d, a.r, a.p, b.d, b.r, b.p, parent, rank);
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
  int32_t n = 0;      // heap size
  int32_t count = 0;  // nodes placed
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
// The select build: threshold selection + sort (the CUDA kernel's parallel path)
// ---------------------------------------------------------------------------------------
//
// Every candidate's score is a function of its rank path alone (the child of a node of
// score w scores w + lp[d][0], its next sibling (w - lp[d-1][r]) + lp[d-1][r+1]), so the
// scores of the whole implicit K-ary tree are known without running the queue.  Call the
// node that pushes a candidate its *generator* (the parent for rank 0, else the previous
// sibling) and give every node the *effective key* ek = min(w, ek(generator)) (ek of a
// depth-1 rank-0 node = its w).  ek never increases along a generator chain.  A node is
// *clamped* when w > ek(generator): only a positive log-prob or float64 rounding of the
// sibling score (e.g. (w - a) + a > w) does that.
//
// The select build collects, depth by depth, every node whose ek is >= a threshold theta
// (the children of one parent in rank order, stopping at the first ek < theta: the rest
// are smaller), raising theta whenever the set would pass the budget (a histogram of the
// eks picks a value with at least `budget` nodes at or above it, so theta never passes
// the budget-th largest ek of the tree).  When no collected node is clamped, the first
// `budget` collected nodes in the queue's total order (larger w, then smaller rank path)
// are exactly the heap build's pops in the heap build's order (docs/ops/tree_build.md
// gives the argument), so a sort of the set gives the slots.  When a collected node is
// clamped, or the eks do not separate (massive ties: every score equal), or the capacity
// is still exceeded after kTreeSelectRefines raises, the select build gives up and the
// caller runs the heap build (tree_build_grow) instead: same output, serial speed.
//
// The code is written for a team of `lanes` workers (the CUDA block's threads; the CPU
// backend is a team of one) with the operations of TreeSelectSerialTeam below; every
// control decision depends only on team-wide reductions, so all lanes take the same path.

constexpr int32_t kTreeSelectBins = 1024;  // histogram bins of one threshold raise
constexpr int32_t kTreeSelectRefines = 6;  // threshold raises per depth before giving up

// Candidates the select build may hold for maximum budget N (>= N + 64): the limit its
// decisions keep to (a raise stops once the set is within it).
KDTR_HD inline int64_t tree_select_capacity(int64_t N) { return N + N / 8 + 64; }

// Entries a set for maximum budget N and top-k width K has room for where memory allows
// (tree_select_set's `room`): the capacity and up to three times as many entries again,
// at most N * K more -- room for a depth's new children (up to K per parent) beside the
// entries, so that the depth's raises run over the set alone (tree_select_grow).
KDTR_HD inline int64_t tree_select_room(int64_t N, int64_t K) {
  const int64_t cap = tree_select_capacity(N);
  const int64_t more = K > 0 && N > (3 * cap) / K ? 3 * cap : N * K;
  return cap + more;
}

// The collected nodes, structure of arrays of `room` entries (entry = one draft node); at
// most `cap` (tree_select_capacity) of them are kept from one depth to the next.
// After the sort, `ek` holds the order (int32: n entries; `tmp` was the rank sort's second
// buffer) and `w` the slot of each selected entry (int32).
struct TreeSelectSet {
  double* w;         // score (float64, the contract's evaluation)
  double* ek;        // effective key
  int32_t* par;      // parent entry, -1 for the root
  int32_t* gen;      // generator entry (parent for rank 0, else the previous sibling), -1 = root
  int32_t* dep;      // depth, 1..depth_limit
  int32_t* rk;       // rank within the row
  int32_t* tmp;      // scratch: new entry indices of a compaction
  int32_t* hist;     // [kTreeSelectBins] values per bin of one threshold raise
  uint8_t* clamped;  // 1 iff w > ek(generator)
  int64_t cap;       // tree_select_capacity: the limit of the build's decisions
  int64_t room;      // entries the arrays hold (>= cap)
};

// Bytes of a TreeSelectSet of `room` entries laid out by tree_select_set().
KDTR_HD inline size_t tree_select_set_bytes(int64_t room) {
  const size_t c = static_cast<size_t>(room), bins = static_cast<size_t>(kTreeSelectBins);
  return c * (8 + 8 + 4 * 5) + bins * 4 + 16 + ((c + 15) / 16) * 16;
}

// The arrays of a TreeSelectSet of `room` entries (>= cap) carved out of `mem` (8-byte
// aligned, tree_select_set_bytes(room)); cap is the decisions' limit (tree_select_capacity).
KDTR_HD inline TreeSelectSet tree_select_set(void* mem, int64_t cap, int64_t room) {
  const size_t c = static_cast<size_t>(room), bins = static_cast<size_t>(kTreeSelectBins);
  unsigned char* m = static_cast<unsigned char*>(mem);
  TreeSelectSet s;
  s.w = reinterpret_cast<double*>(m);
  s.ek = reinterpret_cast<double*>(m + 8 * c);
  int32_t* i32 = reinterpret_cast<int32_t*>(m + 16 * c);
  s.par = i32;
  s.gen = i32 + c;
  s.dep = i32 + 2 * c;
  s.rk = i32 + 3 * c;
  s.tmp = i32 + 4 * c;
  s.hist = i32 + 5 * c;
  s.clamped = reinterpret_cast<uint8_t*>(s.hist + bins + 4);  // 16 bytes of padding before it
  s.cap = cap;
  s.room = room;
  return s;
}

// The CPU's team: one lane; the CUDA block's team is in tree_build.cu (warp-shuffle scans
// and reductions, __syncthreads).
struct TreeSelectSerialTeam {
  KDTR_HD int32_t lane() const { return 0; }
  KDTR_HD int32_t lanes() const { return 1; }
  KDTR_HD void sync() {}
  KDTR_HD int32_t exclusive_sum(int32_t x, int32_t* total) {  // lane's exclusive prefix; *total = sum
    *total = x;
    return 0;
  }
  KDTR_HD double min(double x) { return x; }
  KDTR_HD double max(double x) { return x; }
  KDTR_HD int32_t max_int(int32_t x) { return x; }
  KDTR_HD bool any(bool x) { return x; }
  KDTR_HD void add(int32_t* p, int32_t v) { *p += v; }
  // tree_select_sort's chunk: small, so that the CPU backend runs the merge rounds on
  // every set of more than 8 entries (the CUDA teams use larger chunks).
  KDTR_HD int32_t sort_chunk() const { return 8; }
};

// Children of one parent at depth d = row + 1, in rank order, while keep(ek) holds (keep
// must be monotone: true for an ek, then for every larger one): calls emit(r, w, ek,
// clamped) for each and returns how many.  The scores are the heap build's, operation for
// operation: the root's first child lp[0][0] exactly (root = true), any other first child
// pw + lp[d-1][0], a sibling (w - lp[d-1][r-1]) + lp[d-1][r].  `pek` is the parent's ek
// (ignored for the root).
KDTR_HD_TEMPLATE
template <class Keep, class Emit>
KDTR_HD inline int32_t tree_select_children_while(const double* row, int64_t K, bool root, double pw, double pek,
                                                  Keep&& keep, Emit&& emit) {
  const int32_t k = static_cast<int32_t>(K);  // a row's length (D * K fits in memory)
  double cur = row[0];
  double w = root ? cur : pw + cur;
  bool clamped = !root && w > pek;
  double ek = root || w < pek ? w : pek;
  if (!keep(ek)) return 0;
  emit(0, w, ek, clamped);
  // row[r + 1] is loaded one step ahead, so the load is off the chain of additions (the
  // loop's exit on !keep(ek) would otherwise keep it from being issued early).
  double next = k > 1 ? row[1] : 0.0;
  int32_t r = 1;
  for (; r < k; ++r) {
    const double prev = cur;
    cur = next;
    if (r + 1 < k) next = row[r + 1];
    w = (w - prev) + cur;
    clamped = w > ek;
    ek = w < ek ? w : ek;
    if (!keep(ek)) break;
    emit(r, w, ek, clamped);
  }
  return r;  // the children emitted: ranks 0 .. r - 1
}

// tree_select_children_while for the children with ek >= theta.
KDTR_HD_TEMPLATE
template <class Emit>
KDTR_HD inline int32_t tree_select_children(const double* row, int64_t K, bool root, double pw, double pek,
                                            double theta, Emit&& emit) {
  return tree_select_children_while(row, K, root, pw, pek, [theta](double ek) { return !(ek < theta); }, emit);
}

// Histogram bin of an ek in [lo, hi]: nondecreasing in v (a subtraction and a product by
// the positive scale = kTreeSelectBins / (hi - lo), each rounded monotonically), clamped to
// 0..kTreeSelectBins-1 (an infinite scale, hi - lo tiny, puts every v > lo in the top bin).
KDTR_HD inline int32_t tree_select_bin(double v, double lo, double scale) {
  const double x = v - lo;
  if (!(x > 0)) return 0;
  const double t = x * scale;
  return t < kTreeSelectBins ? static_cast<int32_t>(t) : kTreeSelectBins - 1;
}

// Keep the entries with ek >= theta, in order, renumbering parents and generators (every
// kept entry's parent and generator are kept: ek never increases along a generator chain).
// Updates *n and *plo (the first entry of the last depth).
KDTR_HD_TEMPLATE
template <class Team>
KDTR_HD inline void tree_select_compact(Team& t, TreeSelectSet s, double theta, int32_t* n, int32_t* plo) {
  const int32_t lane = t.lane(), lanes = t.lanes(), cnt = *n;
  const int32_t chunk = (cnt + lanes - 1) / lanes;
  const int32_t e0 = lane * chunk < cnt ? lane * chunk : cnt;
  const int32_t e1 = e0 + chunk < cnt ? e0 + chunk : cnt;
  int32_t mine = 0;
  for (int32_t e = e0; e < e1; ++e) mine += s.ek[e] >= theta ? 1 : 0;
  int32_t live = 0;
  int32_t at = t.exclusive_sum(mine, &live);
  for (int32_t e = e0; e < e1; ++e) {
    s.tmp[e] = at;  // live entries before e: e's new index if it is kept
    at += s.ek[e] >= theta ? 1 : 0;
  }
  t.sync();
  const int32_t new_plo = *plo < cnt ? s.tmp[*plo] : live;
  // Move in rounds of `lanes` entries: an entry only moves down, to a place no later
  // round reads, and every read of a round happens before its writes.
  for (int32_t base = 0; base < cnt; base += lanes) {
    const int32_t e = base + lane;
    const bool keep = e < cnt && s.ek[e] >= theta;
    double w = 0, ek = 0;
    int32_t par = -1, gen = -1, dep = 0, rk = 0;
    uint8_t cl = 0;
    if (keep) {
      w = s.w[e];
      ek = s.ek[e];
      par = s.par[e] < 0 ? -1 : s.tmp[s.par[e]];
      gen = s.gen[e] < 0 ? -1 : s.tmp[s.gen[e]];
      dep = s.dep[e];
      rk = s.rk[e];
      cl = s.clamped[e];
    }
    t.sync();
    if (keep) {
      const int32_t to = s.tmp[e];
      s.w[to] = w;
      s.ek[to] = ek;
      s.par[to] = par;
      s.gen[to] = gen;
      s.dep[to] = dep;
      s.rk[to] = rk;
      s.clamped[to] = cl;
    }
    t.sync();
  }
  *n = live;
  *plo = new_plo;
}

// True iff entry a comes before entry b in the queue's order: larger w first, equal w
// (by value: -0.0 == +0.0) by rank path (tree_build_rank_path_less), a != b.
KDTR_HD inline bool tree_select_before(const TreeSelectSet& s, int32_t a, int32_t b) {
  const double wa = s.w[a], wb = s.w[b];
  return wa > wb ||
         (wa == wb && tree_build_rank_path_less(s.dep[a], s.rk[a], s.par[a], s.dep[b], s.rk[b], s.par[b], s.par, s.rk));
}

// Entries [0, n) of the set sorted by tree_select_before into order[0, n), by the team,
// with a scratch array tmp of n int32 (order and tmp must not overlap the set's w, dep,
// rk, par).  The order is strict and total, so an entry's place is the number of entries
// before it, whatever the algorithm:
//   1. chunks of C = t.sort_chunk() consecutive entries: each entry counts the entries of
//      its chunk that come before it (all pairs, no barrier; the lanes of a warp scan the
//      same chunk, so each score load is one broadcast) and lands at chunk start + count;
//   2. rounds R = C, 2C, ...: sorted runs [kR, kR + R) merged pairwise: an entry at local
//      index i of its run moves to (pair start) + i + (entries of the partner run before
//      it), a binary search; one barrier per round (about log2(n / C) of them, instead of a
//      bitonic network's log2(P)(log2(P) + 1)/2 stages).
// Every lane reads the scores, ranks and parents only; ties cost the rank-path walk.
KDTR_HD_TEMPLATE
template <class Team>
KDTR_HD inline void tree_select_sort(Team& t, const TreeSelectSet& s, int32_t n, int32_t* order, int32_t* tmp) {
  const int32_t lane = t.lane(), lanes = t.lanes(), C = t.sort_chunk();
  for (int32_t e = lane; e < n; e += lanes) {
    const int32_t c0 = e / C * C, c1 = c0 + C < n ? c0 + C : n;
    // tree_select_before(s, j, e) in two passes: the scores alone (independent loads that
    // pipeline), then, only if some other entry of the chunk has e's score, the rank-path
    // walks of those entries.
    const double we = s.w[e];
    int32_t before = 0;
    bool tie = false;
    for (int32_t j = c0; j < c1; ++j) {
      const double wj = s.w[j];
      before += wj > we ? 1 : 0;
      tie = tie || (wj == we && j != e);
    }
    if (tie) {
      for (int32_t j = c0; j < c1; ++j) before += j != e && s.w[j] == we && tree_select_before(s, j, e) ? 1 : 0;
    }
    order[c0 + before] = e;
  }
  t.sync();
  int32_t* src = order;
  int32_t* dst = tmp;
  for (int32_t R = C; R < n; R <<= 1) {
    for (int32_t i = lane; i < n; i += lanes) {
      const int32_t k = i / R, own0 = k * R;
      const int32_t p0 = (k ^ 1) * R;
      const int32_t p1 = p0 + R < n ? p0 + R : n;
      const int32_t e = src[i];
      int32_t lo = p0, hi = p0 < n ? p1 : p0;  // partner run [p0, p1), empty past n
      while (lo < hi) {
        const int32_t mid = lo + (hi - lo) / 2;
        if (tree_select_before(s, src[mid], e)) lo = mid + 1;
        else hi = mid;
      }
      dst[(k & ~1) * R + (i - own0) + (lo - p0)] = e;
    }
    t.sync();
    int32_t* x = src;
    src = dst;
    dst = x;
  }
  if (src != order) {
    for (int32_t i = lane; i < n; i += lanes) order[i] = src[i];
    t.sync();
  }
}

// The select build of one valid request (status OK, budget >= 1, depth_limit >= 1, K >= 1,
// s.cap >= budget).  On success returns true with *count = node_count, the first *count
// entries of the order (int32, in s.ek) being slots 1..*count and the slot of each of them
// in s.w (int32, indexed by entry).  Returns false where it cannot prove the heap build's
// order (see above); the caller then runs tree_build_grow.  `lp` is the request's
// top_log_probs rows d < depth_limit widened to double (exactly; the CUDA kernel stages
// them in shared memory, row stride K).
//
// Per depth: one pass over the parents counts the children above theta (and their range);
// when the set would pass the budget, a histogram pass (value counts, new-children counts
// and each bin's smallest value) gives the new theta and the new children's count at once,
// and the entries are compacted; a last pass places the children (slots by atomic
// increments; the sort makes the order within a depth irrelevant).
KDTR_HD_TEMPLATE
template <class Team>
KDTR_HD inline bool tree_select_grow(Team& t, const double* lp, int64_t K, int32_t budget, int32_t depth_limit,
                                     TreeSelectSet s, int32_t* count) {
  const int32_t lane = t.lane(), lanes = t.lanes();
  const int32_t cap = static_cast<int32_t>(s.cap), room = static_cast<int32_t>(s.room);
  const double inf = 1.0 / 0.0;
  double theta = -inf;     // every ek passes
  int32_t n = 0, plo = 0;  // entries; the first entry of the last depth (the parents of the next)
  for (int32_t d = 1; d <= depth_limit; ++d) {
    KDTR_TB_MARK(10 + (d < 20 ? d : 20));
    const double* row = lp + static_cast<int64_t>(d - 1) * K;
    const bool root = d == 1;
    // This lane's children of the depth's parents while keep(ek) holds (keep monotone, as
    // in tree_select_children_while): emit(r, w, ek, clamped) for each, in each parent's rank
    // order; returns how many.  The root's children are split over the lanes (rank r on
    // lane r mod lanes): a valid row is non-increasing, so the chain's scores are row[0]
    // and then 0.0 + row[r] (the chain's (w - prev) + cur with w == prev, bit for bit), its
    // ek the same values and nothing clamped, and the kept ranks are a prefix, as the
    // chain's.  Any other parent's children are one chain, on the lane that owns the parent.
    // Once the depth's children are entries (in_set), there are none left to generate.
    bool in_set = false;
    auto lane_children = [&](auto&& keep, auto&& emit) {
      int32_t m = 0;
      if (in_set) return m;
      if (root) {
        for (int32_t r = lane; r < K; r += lanes) {
          const double w = r == 0 ? row[0] : 0.0 + row[r];
          if (!keep(w)) continue;
          emit(r, w, w, false);
          ++m;
        }
        return m;
      }
      for (int32_t q = lane; q < n - plo; q += lanes) {
        const int32_t p = plo + q;
        m += tree_select_children_while(row, K, false, s.w[p], s.ek[p], keep, emit);
      }
      return m;
    };
    const auto above_theta = [&theta](double ek) { return !(ek < theta); };
    // Children above theta of this lane's parents: count and range of their eks, and
    // (my_off) how many children the lanes before this one have: where its first parent's
    // run of children goes.
    double lo = inf, hi = -inf;
    int32_t my_off = 0;
    auto count_children = [&]() {
      lo = inf;
      hi = -inf;
      const int32_t mine = lane_children(above_theta, [&](int32_t, double, double ek, bool) {
        lo = ek < lo ? ek : lo;
        hi = ek > hi ? ek : hi;
      });
      int32_t total = 0;
      my_off = t.exclusive_sum(mine, &total);
      return total;
    };
    int32_t total = count_children();
    KDTR_TB_DMARK(0);
    bool offsets_current = true;  // my_off counts the children above the current theta
    // Place the children: a lane's parents' runs of children take consecutive entries from
    // n + my_off (the chain evaluated once more, emitting; its count is the one counted); a
    // child's generator is the previous child of the same parent (or the parent).  The
    // root's children (split over the lanes) go to entry r.  The sort makes the order of
    // the runs irrelevant.
    auto place_children = [&]() {
      if (root) {
        lane_children(above_theta, [&](int32_t r, double w, double ek, bool cl) {
          s.w[r] = w;
          s.ek[r] = ek;
          s.par[r] = -1;
          s.gen[r] = r - 1;
          s.dep[r] = 1;
          s.rk[r] = r;
          s.clamped[r] = cl ? 1 : 0;
        });
      } else {
        int32_t base = n + my_off;
        for (int32_t q = lane; q < n - plo; q += lanes) {
          const int32_t p = plo + q;
          const int32_t c =
              tree_select_children(row, K, false, s.w[p], s.ek[p], theta, [&](int32_t r, double w, double ek, bool cl) {
                const int32_t at = base + r;
                s.w[at] = w;
                s.ek[at] = ek;
                s.par[at] = p;
                s.gen[at] = r == 0 ? p : at - 1;
                s.dep[at] = d;
                s.rk[at] = r;
                s.clamped[at] = cl ? 1 : 0;
              });
          base += c;
        }
      }
    };
    // Where the set has room for them, the children become entries at once (in_set; the
    // raises then histogram, search and compact the set alone, every lane on its share of
    // the entries, instead of evaluating the chains again in each pass): the same values in
    // the same order as the children placed after the raises, so the same decisions.
    // `total` then counts the children still outside the set (none), `fresh` those of this
    // depth in it, [plo, n).
    int32_t fresh = total;
    if (n + total <= room) {
      place_children();
      t.sync();
      plo = n;
      n += total;
      total = 0;
      in_set = true;
    }
    // Raise theta whenever the set would pass the budget with new children: a tight theta
    // keeps the deeper depths from adding nodes that cannot be placed.  Past the budget but
    // within the capacity a raise that fails is no reason to give up.
    for (int32_t refine = 0; fresh > 0 && n + total > budget; ++refine) {
      const bool fits = n + total <= cap;
      if (refine == kTreeSelectRefines) {
        if (fits) break;
        return false;
      }
      for (int32_t e = lane; e < n; e += lanes) {
        lo = s.ek[e] < lo ? s.ek[e] : lo;
        hi = s.ek[e] > hi ? s.ek[e] : hi;
      }
      lo = t.min(lo);
      hi = t.max(hi);
      KDTR_TB_DMARK(1);
      if (!(hi > lo)) {  // every value equal: no threshold separates them
        if (fits) break;
        return false;
      }
      const double scale = kTreeSelectBins / (hi - lo);
      for (int32_t b = lane; b < kTreeSelectBins; b += lanes) s.hist[b] = 0;
      t.sync();
      KDTR_TB_DMARK(2);
      for (int32_t e = lane; e < n; e += lanes) t.add(&s.hist[tree_select_bin(s.ek[e], lo, scale)], 1);
      lane_children(above_theta,
                    [&](int32_t, double, double ek, bool) { t.add(&s.hist[tree_select_bin(ek, lo, scale)], 1); });
      t.sync();
      KDTR_TB_DMARK(3);
      // bstar: the largest bin whose suffix (bins >= it) holds >= budget values; lanes
      // own contiguous runs of bins counted from the top.
      const int32_t chunk = (kTreeSelectBins + lanes - 1) / lanes;
      const int32_t q0 = lane * chunk < kTreeSelectBins ? lane * chunk : kTreeSelectBins;
      const int32_t q1 = q0 + chunk < kTreeSelectBins ? q0 + chunk : kTreeSelectBins;
      int32_t run = 0;
      for (int32_t q = q0; q < q1; ++q) run += s.hist[kTreeSelectBins - 1 - q];
      int32_t all = 0;
      int32_t acc = t.exclusive_sum(run, &all);
      int32_t cand = -1;
      for (int32_t q = q0; q < q1 && cand < 0; ++q) {
        acc += s.hist[kTreeSelectBins - 1 - q];
        if (acc >= budget) cand = kTreeSelectBins - 1 - q;
      }
      const int32_t bstar = t.max_int(cand);
      KDTR_TB_DMARK(4);
      if (bstar <= 0) {  // nothing would be cut
        if (fits) break;
        return false;
      }
      // The new theta: the smallest value in bins >= bstar (>= budget values are >= it,
      // and exactly the values in those bins are, the bin being monotone), and the new
      // children left above it: a second pass over the entries and the children, whose
      // chains stop at the first child below bin bstar.
      const auto in_top_bins = [&](double ek) { return !(ek < theta) && tree_select_bin(ek, lo, scale) >= bstar; };
      double top_min = inf;
      for (int32_t e = lane; e < n; e += lanes)
        if (in_top_bins(s.ek[e])) top_min = s.ek[e] < top_min ? s.ek[e] : top_min;
      const int32_t kids =
          lane_children(in_top_bins, [&](int32_t, double, double ek, bool) { top_min = ek < top_min ? ek : top_min; });
      const double nt = t.min(top_min);
      if (!in_set) t.exclusive_sum(kids, &total);
      KDTR_TB_DMARK(5);
      if (!(nt > theta)) {
        if (fits) break;
        return false;
      }
      theta = nt;
      if (!root || in_set) tree_select_compact(t, s, theta, &n, &plo);
      KDTR_TB_DMARK(6);
      offsets_current = false;
      fresh = in_set ? n - plo : total;
      if (n + total <= budget || n + total <= cap) break;
      if (in_set) {  // the next raise's range: the set's alone
        lo = inf;
        hi = -inf;
      } else {
        total = count_children();  // the next raise needs the children's range above the new theta
        offsets_current = true;
        fresh = total;
      }
    }
    if (fresh == 0) break;
    if (in_set) continue;
    // The lanes' offsets above the final theta (after a raise that ended the loop; the
    // total is the same as the second pass's: exactly the children in bins >= bstar are >= it).
    if (!offsets_current) total = count_children();
    KDTR_TB_DMARK(7);
    place_children();
    t.sync();
    KDTR_TB_DMARK(8);
    plo = n;
    n += total;
  }
  KDTR_TB_MARK(31);
  // A clamped entry: its order is not the sort's (the heap build decides).
  bool clamped = false;
  for (int32_t e = lane; e < n; e += lanes) clamped = clamped || s.clamped[e] != 0;
  if (t.any(clamped)) return false;
  // Sort the entry indices by the order (larger w first, equal w by rank path):
  // tree_select_sort, a rank sort of chunks merged by binary search.
  int32_t* order = reinterpret_cast<int32_t*>(s.ek);
  KDTR_TB_MARK(32);
  tree_select_sort(t, s, n, order, s.tmp);
  KDTR_TB_MARK(33);
  const int32_t placed = n < budget ? n : budget;
  int32_t* slot_of = reinterpret_cast<int32_t*>(s.w);  // w is not read any more
  for (int32_t i = lane; i < placed; i += lanes) slot_of[order[i]] = i + 1;
  t.sync();
  *count = placed;
  return true;
}

// The five [T] node rows of a request the select build placed (each pointer at element
// [b, 0] of its tensor): slot i <= count from entry order[i - 1], -1 in empty slots; then
// the links: a rank-0 entry is its parent's first child, any other its generator's next
// sibling (children of one parent take consecutive ranks in slot order).
KDTR_HD_TEMPLATE
template <class Team>
KDTR_HD inline void tree_select_node_outputs(Team& t, const TreeSelectSet& s, int32_t count, const int64_t* ids,
                                             int64_t K, int64_t root_token, int64_t T, int64_t* node_token_ids,
                                             int32_t* node_depths, int32_t* parents, int32_t* next_token,
                                             int32_t* next_sibling) {
  const int32_t* order = reinterpret_cast<const int32_t*>(s.ek);
  const int32_t* slot_of = reinterpret_cast<const int32_t*>(s.w);
  for (int64_t i = t.lane(); i < T; i += t.lanes()) {
    int64_t token_id = -1;
    int32_t depth = -1, parent = -1;
    if (i == 0) {
      token_id = root_token;
      depth = 0;
    } else if (i <= count) {
      const int32_t e = order[i - 1];
      token_id = ids[static_cast<int64_t>(s.dep[e] - 1) * K + s.rk[e]];
      depth = s.dep[e];
      parent = s.par[e] < 0 ? 0 : slot_of[s.par[e]];
    }
    node_token_ids[i] = token_id;
    node_depths[i] = depth;
    parents[i] = parent;
    next_token[i] = -1;
    next_sibling[i] = -1;
  }
  t.sync();  // the -1s before the links (CUDA: global stores of one block, ordered by the barrier)
  for (int32_t i = 1 + t.lane(); i <= count; i += t.lanes()) {
    const int32_t e = order[i - 1];
    if (s.rk[e] == 0) next_token[s.par[e] < 0 ? 0 : slot_of[s.par[e]]] = i;
    else next_sibling[slot_of[s.gen[e]]] = i;
  }
}

// ---------------------------------------------------------------------------------------
// Outputs
// ---------------------------------------------------------------------------------------

// The slots on the path from the root to slot i (both included), written to anc[0..len),
// i first, walking `parent` (a request's parents row, T entries); returns len = depth[i] + 1.
// The walk stops after max_len slots or at an index outside [0, T), so even a corrupt
// parents row cannot make it loop or read out of range.  `anc` has room for max_len.
KDTR_HD inline int32_t tree_build_ancestors(int32_t i, const int32_t* parent, int64_t T, int32_t max_len,
                                            int32_t* anc) {
  int32_t len = 0;
  for (int32_t s = i; s >= 0 && s < T && len < max_len; s = parent[s]) anc[len++] = s;
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

// Scratch of the CPU backend, reused request after request: the heap build's candidate
// queue (N + 1) and slot arrays (5 * T int32), a root path (min(D, N) + 1 int32), and for
// the select build its candidate set (tree_select_set_bytes(tree_select_room(N, K)) bytes,
// 8-byte aligned) and the request's log-probs widened to double (D * K).
struct TreeBuildCpuScratch {
  std::vector<TreeBuildCand> heap;
  std::vector<int32_t> slot_mem;
  std::vector<int32_t> anc;
  std::vector<double> select_mem;  // doubles: the set's 8-byte alignment
  std::vector<double> lp_rows;     // the select build's log-probs, widened: D * K
  TreeSelectSet select{};
  TreeBuildCpuScratch(int64_t N, int64_t D, int64_t K, bool with_select)
      : heap(static_cast<size_t>(N + 1)),
        slot_mem(static_cast<size_t>(5 * (N + 1))),
        anc(static_cast<size_t>((D < N ? D : N) + 1)) {
    if (with_select) {
      lp_rows.resize(static_cast<size_t>(D * K));
      const int64_t cap = tree_select_capacity(N), room = tree_select_room(N, K);
      select_mem.resize((tree_select_set_bytes(room) + 7) / 8);
      select = tree_select_set(select_mem.data(), cap, room);
    }
  }
};

// One request on the CPU, every output element of it (the row pointers point at element
// [b, 0] (or [b, 0, 0]) of their tensors).  kernel TREE_BUILD_KERNEL_SELECT runs the
// select build (a team of one lane) and the heap build where it gives up; any other kernel
// the heap build.  Returns the status it also stores in *status.
inline int32_t tree_build_request(const float* lp, const int64_t* ids, int64_t root_token, int32_t budget,
                                  int32_t depth_limit, int64_t N, int64_t D, int64_t K, int32_t kernel,
                                  TreeBuildCpuScratch& scratch, int32_t* node_count, int64_t* node_token_ids,
                                  int32_t* node_depths, int32_t* parents, int32_t* next_token, int32_t* next_sibling,
                                  uint8_t* visibility, int32_t* status, uint8_t* heap_fallback = nullptr) {
  const int64_t T = N + 1;
  const int32_t st = tree_build_validate(lp, ids, budget, depth_limit, N, D, K);
  int32_t count = 0;
  bool placed = false;
  if (st == TREE_BUILD_OK && kernel == TREE_BUILD_KERNEL_SELECT && budget > 0 && depth_limit > 0 && K > 0) {
    TreeSelectSerialTeam team;
    double* lpd = scratch.lp_rows.data();
    for (int64_t e = 0; e < static_cast<int64_t>(depth_limit) * K; ++e) lpd[e] = static_cast<double>(lp[e]);
    placed = tree_select_grow(team, lpd, K, budget, depth_limit, scratch.select, &count);
    if (placed)
      tree_select_node_outputs(team, scratch.select, count, ids, K, root_token, T, node_token_ids, node_depths, parents,
                               next_token, next_sibling);
  }
  if (heap_fallback != nullptr)
    *heap_fallback =
        kernel == TREE_BUILD_KERNEL_SELECT && st == TREE_BUILD_OK && !placed && budget > 0 && depth_limit > 0 && K > 0;
  if (!placed) {
    int32_t* m = scratch.slot_mem.data();
    const TreeBuildSlots s{m, m + T, m + 2 * T, m + 3 * T, m + 4 * T};
    tree_build_init_slots(s, T, 0, 1);
    count = st == TREE_BUILD_OK ? tree_build_grow(lp, K, budget, depth_limit, scratch.heap.data(), s) : 0;
    for (int64_t i = 0; i < T; ++i)
      tree_build_node_outputs(i, ids, K, root_token, count, s, node_token_ids, node_depths, parents, next_token,
                              next_sibling);
  }
  std::memset(visibility, 0, static_cast<size_t>(T) * static_cast<size_t>(T));
  const int32_t max_len = static_cast<int32_t>(scratch.anc.size());
  for (int32_t i = 0; i <= count; ++i) {
    const int32_t len = tree_build_ancestors(i, parents, T, max_len, scratch.anc.data());
    uint8_t* row = visibility + static_cast<int64_t>(i) * T;
    for (int32_t k = 0; k < len; ++k) row[scratch.anc[k]] = 1;
  }
  *node_count = count;
  *status = st;
  return st;
}

// CPU backend: the whole batch, row-major tensors as in the golden (top_log_probs f32
// [B,D,K], top_token_ids i64 [B,D,K], root_token_ids i64 [B], budget / depth_limit i32 [B];
// outputs [B] and [B,T] and visibility [B,T,T]).  p.kernel: TREE_BUILD_KERNEL_SELECT runs
// the select build, anything else the heap build; p.heap_fallback (optional) gets 1 for each
// valid request the select build handed to the heap build.  One scratch, reused request
// after request.
inline void tree_build_cpu(const TreeBuildParams& p) {
  const int64_t N = p.N, D = p.D, K = p.K, T = N + 1;
  TreeBuildCpuScratch scratch(N, D, K, p.kernel == TREE_BUILD_KERNEL_SELECT);
  for (int64_t b = 0; b < p.B; ++b) {
    const int64_t in_row = b * D * K, out_row = b * T;
    tree_build_request(p.top_log_probs + in_row, p.top_token_ids + in_row, p.root_token_ids[b], p.budget[b],
                       p.depth_limit[b], N, D, K, p.kernel, scratch, p.node_count + b, p.node_token_ids + out_row,
                       p.node_depths + out_row, p.parents + out_row, p.next_token + out_row, p.next_sibling + out_row,
                       p.visibility + b * T * T, p.status + b,
                       p.heap_fallback == nullptr ? nullptr : p.heap_fallback + b);
  }
}

}  // namespace kdtr
