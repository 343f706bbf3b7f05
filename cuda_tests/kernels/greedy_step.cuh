// greedy_step.cuh -- the glue of the greedy_step chain: tree_len from tree_build's node_count.
//
// Contract: docs/ops/greedy_step.md (source: shared/DESIGN.md section 3.4).  greedy_step
// is tree_build -> verify_attn -> tree_accept; the three ops' cores live in their own
// headers (tree_build.cuh, verify_attn.cuh, tree_accept.cuh).  The one value the chain
// computes between them is verify_attn's tree_len, the valid tree slots of a request:
//
//   tree_len[b] = node_count[b] + 1        (the root plus the draft nodes)
//
// greedy_step_tree_len is KDTR_HD, so the CPU backend (test_greedy_step.cu) and the CUDA
// kernel (greedy_step.cu) compute it with the same code.
#pragma once

#include <cstdint>

#include "greedy_step_params.h"
#include "kdtr_hd.cuh"

namespace kdtr {

// tree_len of one request with T = N + 1 slots: node_count + 1, with node_count first
// clamped to [0, T - 1].  tree_build always returns node_count in [0, budget] within
// [0, N] (docs/ops/tree_build.md), so the clamp never changes a correct chain's value;
// it only guarantees that verify_attn, which trusts tree_len in [1, T], can never be
// driven out of bounds by a defective tree_build.
KDTR_HD inline int32_t greedy_step_tree_len(int32_t node_count, int64_t T) {
  int64_t n = node_count;
  if (n < 0) n = 0;
  if (n > T - 1) n = T - 1;
  return static_cast<int32_t>(n + 1);
}

// CPU backend: tree_len [B] from node_count [B].
inline void greedy_step_tree_len_cpu(const GreedyStepTreeLenParams& p) {
  for (int64_t b = 0; b < p.B; ++b) p.tree_len[b] = greedy_step_tree_len(p.node_count[b], p.T);
}

}  // namespace kdtr
