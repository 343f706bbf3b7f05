// tree_accept.cuh -- greedy walk of the verified draft tree, one request at a time.
//
// Contract: docs/ops/tree_accept.md (source: shared/DESIGN.md section 3.2); reference:
// kdtr/ops/tree_accept.py.  The per-request core below is KDTR_HD, so the CPU backend
// (tree_accept_cpu) and the CUDA kernel (tree_accept.cu) run the very same code.
//
// Shapes: B requests, T = N + 1 tree slots (slot 0 is the root).  Per request b the row
// pointers point at element [b, 0] of the [B,T] tensors:
//   node_token_ids i64 [T], next_token i32 [T] (first child), next_sibling i32 [T],
//   node_count i32 (draft nodes, root excluded), target_predict i64 [T]
// and the outputs:
//   accepted_count i32, accepted_path i32 [T], proposed i64 [T], status i32.
//
// Walk: from slot 0, while some child c of the current slot (first child, then next
// siblings) has node_token_ids[c] == target_predict[current], move to c.  accepted_path
// lists the accepted slots starting with 0, proposed the tokens of the accepted draft
// nodes then the bonus token target_predict[last accepted slot]; both are -1 after their
// accepted_count + 1 entries.  Every walk is bounded by node_count link visits and every
// followed index by [1, node_count], so no input can hang it or make it read outside
// [0, T) of a row.  A malformed request (status != 0) is rejected whole:
// accepted_count 0, accepted_path [0, -1, ...], proposed all -1.
//
// Checks, in this order (the first that holds is the status): node_count in [0, T-1]
// (BAD_NODE_COUNT); no negative token id in node_token_ids[0..node_count] or
// target_predict[0..node_count] (NEGATIVE_TOKEN; every live slot, not only those the walk
// reaches, so the verdict does not depend on the walk; -1 is the padding value of empty
// slots); then the walk's own BAD_INDEX and CYCLE.  The first two are request-level and
// come before any walk: tree_accept_node_count_ok and tree_accept_negative_in_stripe
// (striped over lanes so the CUDA kernel can spread the scan over a warp), then
// tree_accept_walk_links.  tree_accept_walk runs all of it on one worker.
#pragma once

#include <cstdint>

#include "kdtr_hd.cuh"
#include "tree_accept_params.h"

namespace kdtr {

// tree_accept status codes (docs/ops/tree_accept.md).
enum TreeAcceptStatus : int32_t {
  TREE_ACCEPT_OK = 0,
  TREE_ACCEPT_BAD_NODE_COUNT = 1,  // node_count outside [0, T-1]
  TREE_ACCEPT_BAD_INDEX = 2,       // a followed link outside {-1} U [1, node_count]
  TREE_ACCEPT_CYCLE = 3,           // more than node_count link visits
  TREE_ACCEPT_NEGATIVE_TOKEN = 4,  // a token id < 0 in a live slot 0..node_count of
                                   // node_token_ids or target_predict
};

struct TreeAcceptResult {
  int32_t accepted_count;  // accepted draft nodes, root excluded (0 when status != 0)
  int32_t status;          // TreeAcceptStatus
};

// Check 1: node_count in [0, T-1] (the live slots 0..node_count lie inside the row).
KDTR_HD inline bool tree_accept_node_count_ok(int32_t node_count, int64_t T) {
  return node_count >= 0 && static_cast<int64_t>(node_count) <= T - 1;
}

// Check 2, one stripe of it: whether a live slot s in [0, node_count] with
// s = lane (mod lanes) holds a negative id in node_token_ids or target_predict.  The
// request has a NEGATIVE_TOKEN exactly when some lane in [0, lanes) returns true.  Requires
// tree_accept_node_count_ok (then it reads only [0, node_count] within [0, T)).
KDTR_HD inline bool tree_accept_negative_in_stripe(const int64_t* node_token_ids, const int64_t* target_predict,
                                                   int32_t node_count, int64_t lane, int64_t lanes) {
  bool negative = false;
  for (int64_t s = lane; s <= static_cast<int64_t>(node_count); s += lanes)
    negative |= (node_token_ids[s] < 0) | (target_predict[s] < 0);
  return negative;
}

// The walk proper, for a request that passed checks 1 and 2 (it relies on check 1 for its
// bounds; check 2 does not affect its memory safety).  For an OK request it writes
// accepted_path[0 .. accepted_count] and proposed[0 .. accepted_count] (nothing after
// them); for a malformed one (BAD_INDEX, CYCLE) it may have written some of those
// entries, which tree_accept_fill then overwrites.
KDTR_HD inline TreeAcceptResult tree_accept_walk_links(const int64_t* node_token_ids, const int32_t* next_token,
                                                       const int32_t* next_sibling, int32_t node_count,
                                                       const int64_t* target_predict, int32_t* accepted_path,
                                                       int64_t* proposed) {
  int32_t cur = 0;
  int32_t accepted = 0;
  int64_t visits = 0;  // child links followed over the whole walk
  accepted_path[0] = 0;
  for (;;) {
    const int64_t want = target_predict[cur];
    int32_t c = next_token[cur];
    int32_t found = -1;
    while (c != -1) {
      if (c < 1 || c > node_count) return {0, TREE_ACCEPT_BAD_INDEX};
      if (++visits > node_count) return {0, TREE_ACCEPT_CYCLE};
      if (node_token_ids[c] == want) {
        found = c;
        break;
      }
      c = next_sibling[c];
    }
    if (found == -1) break;
    ++accepted;  // <= visits <= node_count <= T - 1: always a valid slot
    accepted_path[accepted] = found;
    proposed[accepted - 1] = node_token_ids[found];
    cur = found;
  }
  proposed[accepted] = target_predict[cur];  // the bonus token
  return {accepted, TREE_ACCEPT_OK};
}

// All the checks and the walk on one worker, in the contract's order.  Writes what
// tree_accept_walk_links writes (nothing when a request-level check fails).
KDTR_HD inline TreeAcceptResult tree_accept_walk(const int64_t* node_token_ids, const int32_t* next_token,
                                                 const int32_t* next_sibling, int32_t node_count,
                                                 const int64_t* target_predict, int64_t T, int32_t* accepted_path,
                                                 int64_t* proposed) {
  if (!tree_accept_node_count_ok(node_count, T)) return {0, TREE_ACCEPT_BAD_NODE_COUNT};
  if (tree_accept_negative_in_stripe(node_token_ids, target_predict, node_count, 0, 1))
    return {0, TREE_ACCEPT_NEGATIVE_TOKEN};
  return tree_accept_walk_links(node_token_ids, next_token, next_sibling, node_count, target_predict, accepted_path,
                                proposed);
}

// The rest of the output rows, striped over `lanes` workers (lane in [0, lanes)): -1
// after the accepted_count + 1 valid entries, or the rejected rows of a malformed request.
// Writes no entry that the walk of an OK request wrote, so lanes need no ordering with the
// walk except for malformed requests (the CUDA kernel syncs the warp in between).
KDTR_HD inline void tree_accept_fill(TreeAcceptResult r, int64_t T, int64_t lane, int64_t lanes, int32_t* accepted_path,
                                     int64_t* proposed) {
  const bool ok = r.status == TREE_ACCEPT_OK;
  const int64_t path_from = ok ? static_cast<int64_t>(r.accepted_count) + 1 : 1;
  const int64_t proposed_from = ok ? static_cast<int64_t>(r.accepted_count) + 1 : 0;
  if (!ok && lane == 0 && T > 0) accepted_path[0] = 0;
  for (int64_t j = path_from + lane; j < T; j += lanes) accepted_path[j] = -1;
  for (int64_t j = proposed_from + lane; j < T; j += lanes) proposed[j] = -1;
}

// One request, all of its outputs (every one of the T slots of both rows).  Returns the
// status it also stores in *status.
KDTR_HD inline int32_t tree_accept_request(const int64_t* node_token_ids, const int32_t* next_token,
                                           const int32_t* next_sibling, int32_t node_count,
                                           const int64_t* target_predict, int64_t T, int32_t* accepted_count,
                                           int32_t* accepted_path, int64_t* proposed, int32_t* status) {
  const TreeAcceptResult r = tree_accept_walk(node_token_ids, next_token, next_sibling, node_count, target_predict, T,
                                              accepted_path, proposed);
  tree_accept_fill(r, T, 0, 1, accepted_path, proposed);
  *accepted_count = r.accepted_count;
  *status = r.status;
  return r.status;
}

// CPU backend: the whole batch, [B,T] row-major tensors as in the golden.
inline void tree_accept_cpu(const TreeAcceptParams& p) {
  for (int64_t b = 0; b < p.B; ++b) {
    const int64_t row = b * p.T;
    tree_accept_request(p.node_token_ids + row, p.next_token + row, p.next_sibling + row, p.node_count[b],
                        p.target_predict + row, p.T, p.accepted_count + b, p.accepted_path + row, p.proposed + row,
                        p.status + b);
  }
}

}  // namespace kdtr
