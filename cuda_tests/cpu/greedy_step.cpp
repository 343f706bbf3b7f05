// cpu/greedy_step.cpp -- greedy_step's CPU core: the glue (kernels/greedy_step.cuh) and
// the chain on the CPU, calling the three ops' CPU entries (their own objects: this file
// includes none of their cores).

#include "greedy_step.cuh"

#include "greedy_step_params.h"

namespace kdtr {
namespace cpu {

void greedy_step_tree_len(const GreedyStepTreeLenParams& p) { greedy_step_tree_len_cpu(p); }

void greedy_step(const GreedyStepStages& c) {
  tree_build(c.build);
  greedy_step_tree_len(c.tree_len);
  verify_attn(c.attn);
  tree_accept(c.accept);
}

}  // namespace cpu
}  // namespace kdtr
