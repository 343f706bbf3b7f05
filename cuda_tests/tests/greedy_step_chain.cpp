// greedy_step_chain.cpp -- the wiring of the greedy_step chain (greedy_step_chain.hpp):
// its own object, so an edit of it rebuilds this file and relinks kdtr_greedy_step only.

#include "greedy_step_chain.hpp"

#include <string>
#include <vector>

namespace kdtr {
namespace ops {

// greedy_step: tree_build -> verify_attn -> tree_accept (docs/ops/greedy_step.md).
const std::vector<Link>& greedy_step_chain() {
  static const std::vector<Link> chain{
      {&tree_build_decl(), {}},
      {&verify_attn_decl(), {{"input.tree_len", kTreeLen}, {"input.visibility", "tree_build.visibility"}}},
      {&tree_accept_decl(),
       {{"input.node_token_ids", "tree_build.node_token_ids"},
        {"input.next_token", "tree_build.next_token"},
        {"input.next_sibling", "tree_build.next_sibling"},
        {"input.node_count", "tree_build.node_count"}}}};
  return chain;
}

// `s` holds the inputs and the prefixed outputs; tree_len is the chain's [B] buffer.
GreedyStepStages greedy_step_params(Slots s, int32_t* tree_len, float sm_scale) {
  s.add(kTreeLen, tree_len, DType::I32);
  for (const Link& l : greedy_step_chain())
    for (const auto& w : l.wired) s.wire(w.first, w.second);
  GreedyStepStages c{};
  c.build = tree_build_params(s, "tree_build.");
  c.tree_len.node_count = c.build.node_count;
  c.tree_len.tree_len = tree_len;
  s.dims({{&c.tree_len.B, "B"}, {&c.tree_len.T, "T"}});
  c.attn = verify_attn_params(s, sm_scale, "verify_attn.");
  c.accept = tree_accept_params(s, "tree_accept.");
  return c;
}

}  // namespace ops
}  // namespace kdtr
