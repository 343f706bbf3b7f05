// greedy_step_chain.hpp -- greedy_step as the chain of three op declarations of the op
// table (kdtr_ops.hpp): tree_build -> verify_attn -> tree_accept (docs/ops/greedy_step.md).
// The inputs an op takes from an earlier op's outputs are wired, not read; the chain's
// outputs are the three ops' outputs named <op>.<output>.  Defined in
// cuda_tests/tests/greedy_step_chain.cpp (its own object, linked into kdtr_greedy_step).
#pragma once

#include <cstdint>
#include <vector>

#include "greedy_step_params.h"
#include "kdtr_io.hpp"
#include "kdtr_ops.hpp"

namespace kdtr {
namespace ops {

// The chain's own tensor between the ops: tree_len i32 [B] (greedy_step.cuh).
constexpr const char* kTreeLen = "tree_len";

// greedy_step: tree_build -> verify_attn -> tree_accept, with the wired inputs of each.
const std::vector<Link>& greedy_step_chain();

// The four structs of the chain (GreedyStepStages, greedy_step_params.h), wired as
// greedy_step_chain() says.  `s` holds the inputs and the prefixed outputs; tree_len is
// the chain's [B] buffer.
GreedyStepStages greedy_step_params(Slots s, int32_t* tree_len, float sm_scale);

}  // namespace ops
}  // namespace kdtr
