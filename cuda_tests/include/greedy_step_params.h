// greedy_step_params.h -- the parameters of the greedy_step chain (the glue step's
// GreedyStepTreeLenParams and the four structs of GreedyStepParams) and its CPU entries
// (cuda_tests/cpu/greedy_step.cpp), without any op's core.
#pragma once

#include <cstdint>

#include "tree_accept_params.h"
#include "tree_build_params.h"
#include "verify_attn_params.h"

namespace kdtr {

// The glue step of the chain: tree_len i32 [B] from tree_build's node_count i32 [B], T
// slots (host pointers for greedy_step_tree_len_cpu, device pointers for
// launch_greedy_step_tree_len).
struct GreedyStepTreeLenParams {
  const int32_t* node_count = nullptr;  // i32 [B]
  int32_t* tree_len = nullptr;          // i32 [B]
  int64_t B = 0, T = 0;
};

// The four structs of the chain, wired by kdtr::ops::greedy_step_params
// (greedy_step_chain.hpp): tree_build -> tree_len -> verify_attn -> tree_accept.
struct GreedyStepParams {
  TreeBuildParams build;
  GreedyStepTreeLenParams tree_len;
  VerifyAttnProblem attn;
  TreeAcceptParams accept;
};

namespace cpu {

// The glue step (greedy_step_tree_len_cpu of greedy_step.cuh) on host pointers.
void greedy_step_tree_len(const GreedyStepTreeLenParams& p);
// The whole chain on the CPU, host pointers: tree_build, the glue, verify_attn, tree_accept.
void greedy_step(const GreedyStepParams& c);

}  // namespace cpu
}  // namespace kdtr
