// kdtr_ops.hpp -- the op table of the kdtr_<op> binaries (docs/binaries.md, "The op table").
//
// One declaration per op (OpDecl): its input tensors ("input.<name>", dtype, named dims)
// in reading order, whether it reads N from the metadata max_budget, its output tensors
// (bare names, dtype, dims) in the output file's order, and the bound of every dim it
// indexes with.  The generic input reader, output set and parameter wiring built on it
// are in kdtr_io.hpp; the device side (device copies, the checked CUDA run, the kernel
// choice) in kdtr_cuda.hpp; greedy_step's chain of the three declarations in
// greedy_step_chain.hpp.  None of them includes an op's core (kernels/<op>.cuh): the cores
// are compiled once each, in cuda_tests/cpu/<op>.cpp, and reached through the entries of
// <op>_params.h.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ddtree_decode_params.h"
#include "kdtr.hpp"
#include "tree_accept_params.h"
#include "tree_build_params.h"
#include "verify_attn_params.h"

namespace kdtr {
namespace ops {

// ---------------------------------------------------------------------------------------
// Dimension bounds (the one definition of each; an input dim over its bound is an input
// error, exit 2: "<path>: <tensor>: <dim> <value> exceeds <bound>")
// ---------------------------------------------------------------------------------------

constexpr uint64_t kMaxIndexDim = 0x7fffffffULL;  // tree_build: B (one block per request), D, K
constexpr uint64_t kMaxAttnDim = static_cast<uint64_t>(kVerifyAttnMaxDim);  // verify_attn: int in-request indices
constexpr uint64_t kMaxRowDim = static_cast<uint64_t>(INT64_MAX) / 2;       // tree_accept: int64 row offsets b * T

// ---------------------------------------------------------------------------------------
// The table
// ---------------------------------------------------------------------------------------

// How an input's dtype is given: fixed, "f32 or bf16" (the op's float dtype, bound by
// this tensor), or the float dtype bound earlier.
enum class DtypeRule : uint8_t { Fixed, Float, SameFloat };

struct TensorDecl {
  const char* name;               // "input.<name>" (inputs) or the bare output name
  DType dtype;                    // for DtypeRule::Fixed
  std::vector<const char*> dims;  // named dims; empty for a scalar
  DtypeRule rule = DtypeRule::Fixed;
  // A wrong rank while none of the dims is known yet is reported as "tensor has <n> dims,
  // expected <r> [<dims>]" (else as kdtr::File::get's WrongShape).
  bool rank_names_dims = false;
};

// The bound of one dim, or of the product of several ("T*H").
struct Bound {
  std::vector<const char*> dims;
  uint64_t max;
};

struct OpDecl {
  const char* name;
  std::vector<Bound> bounds;
  std::vector<TensorDecl> inputs;
  bool max_budget;  // after the inputs: N from metadata max_budget, T = N + 1
  std::vector<TensorDecl> outputs;
};

inline const OpDecl& tree_build_decl() {
  static const OpDecl op{"tree_build",
                         {{{"B"}, kMaxIndexDim}, {{"D"}, kMaxIndexDim}, {{"K"}, kMaxIndexDim}},
                         {{"input.top_log_probs", DType::F32, {"B", "D", "K"}},
                          {"input.top_token_ids", DType::I64, {"B", "D", "K"}},
                          {"input.root_token_ids", DType::I64, {"B"}},
                          {"input.budget", DType::I32, {"B"}},
                          {"input.depth_limit", DType::I32, {"B"}}},
                         true,
                         {{"node_count", DType::I32, {"B"}},
                          {"node_token_ids", DType::I64, {"B", "T"}},
                          {"node_depths", DType::I32, {"B", "T"}},
                          {"parents", DType::I32, {"B", "T"}},
                          {"next_token", DType::I32, {"B", "T"}},
                          {"next_sibling", DType::I32, {"B", "T"}},
                          {"visibility", DType::U8, {"B", "T", "T"}},
                          {"status", DType::I32, {"B"}}}};
  return op;
}

inline const OpDecl& verify_attn_decl() {
  static const OpDecl op{"verify_attn",
                         {{{"B"}, kMaxAttnDim},
                          {{"T"}, kMaxAttnDim},
                          {{"H"}, kMaxAttnDim},
                          {{"Dqk"}, kMaxAttnDim},
                          {{"T", "H"}, kMaxAttnDim},
                          {{"S"}, kMaxAttnDim}},
                         {{"input.q", DType::F32, {"B", "T", "H", "Dqk"}, DtypeRule::Float, true},
                          {"input.kv_cache", DType::F32, {"B", "S", "Dqk"}, DtypeRule::SameFloat},
                          {"input.prefix_len", DType::I32, {"B"}},
                          {"input.tree_len", DType::I32, {"B"}},
                          {"input.visibility", DType::U8, {"B", "T", "T"}},
                          {"input.sm_scale", DType::F32, {}},
                          {"input.d_v", DType::I32, {}}},
                         false,
                         {{"out", DType::F32, {"B", "T", "H", "d_v"}}, {"lse", DType::F32, {"B", "T", "H"}}}};
  return op;
}

inline const OpDecl& tree_accept_decl() {
  static const OpDecl op{"tree_accept",
                         {{{"B"}, kMaxRowDim}, {{"T"}, kMaxRowDim}},
                         {{"input.node_token_ids", DType::I64, {"B", "T"}},
                          {"input.next_token", DType::I32, {"B", "T"}},
                          {"input.next_sibling", DType::I32, {"B", "T"}},
                          {"input.node_count", DType::I32, {"B"}},
                          {"input.target_predict", DType::I64, {"B", "T"}}},
                         false,
                         {{"accepted_count", DType::I32, {"B"}},
                          {"accepted_path", DType::I32, {"B", "T"}},
                          {"proposed", DType::I64, {"B", "T"}},
                          {"status", DType::I32, {"B"}}}};
  return op;
}

// ddtree_decode (docs/ops/ddtree_decode.md): D and K are the scalar inputs draft_depth and
// draft_top_k, bound by the binary after reading (Inputs::bind).  Its CPU core indexes
// with int64 throughout.
inline const OpDecl& ddtree_decode_decl() {
  static const OpDecl op{"ddtree_decode",
                         {{{"B"}, kMaxIndexDim},
                          {{"R"}, kMaxIndexDim},
                          {{"V"}, kMaxIndexDim},
                          {{"E"}, kMaxIndexDim},
                          {{"H"}, kMaxAttnDim},
                          {{"Dqk"}, kMaxAttnDim},
                          {{"S"}, kMaxAttnDim}},
                         {{"input.target_emb", DType::BF16, {"V", "E"}},
                          {"input.target_w_q", DType::BF16, {"E", "H", "Dqk"}},
                          {"input.target_w_kv", DType::BF16, {"E", "Dqk"}},
                          {"input.target_w_o", DType::BF16, {"H", "Dv", "E"}},
                          {"input.target_w_lm", DType::BF16, {"E", "V"}},
                          {"input.draft_emb", DType::BF16, {"V", "E"}},
                          {"input.draft_w_lm", DType::BF16, {"E", "V"}},
                          {"input.kv_cache", DType::BF16, {"B", "S", "Dqk"}},
                          {"input.prefix_len", DType::I32, {"B"}},
                          {"input.root_token_ids", DType::I64, {"B"}},
                          {"input.budget", DType::I32, {"B", "R"}},
                          {"input.depth_limit", DType::I32, {"B", "R"}},
                          {"input.draft_depth", DType::I32, {}},
                          {"input.draft_top_k", DType::I32, {}},
                          {"input.sm_scale", DType::F32, {}}},
                         true,
                         {{"node_count", DType::I32, {"B", "R"}},
                          {"top_log_probs", DType::F32, {"B", "R", "D", "K"}},
                          {"top_token_ids", DType::I64, {"B", "R", "D", "K"}},
                          {"accepted_count", DType::I32, {"B", "R"}},
                          {"accepted_path", DType::I32, {"B", "R", "T"}},
                          {"step_tokens", DType::I64, {"B", "R", "T"}},
                          {"attn_out", DType::F32, {"B", "R", "T", "H", "Dv"}},
                          {"final_kv_cache", DType::BF16, {"B", "S", "Dqk"}},
                          {"cache_len", DType::I32, {"B"}}}};
  return op;
}

// One op of a chain: the inputs it takes from earlier outputs (input -> tensor), not read.
struct Link {
  const OpDecl* op;
  std::vector<std::pair<const char*, const char*>> wired;
};

namespace detail {

// "B,T,H" / "T*H"
inline std::string join(const std::vector<const char*>& dims, const char* sep) {
  std::string s;
  for (size_t k = 0; k < dims.size(); ++k) s += (k ? sep : "") + std::string(dims[k]);
  return s;
}

}  // namespace detail

// The bounds of a chain: each dim's smallest bound over its ops.
inline std::vector<Bound> chain_bounds(const std::vector<Link>& chain) {
  std::vector<Bound> out;
  for (const Link& l : chain)
    for (const Bound& b : l.op->bounds) {
      bool merged = false;
      for (Bound& o : out)
        if (detail::join(o.dims, "*") == detail::join(b.dims, "*")) {
          o.max = std::min(o.max, b.max);
          merged = true;
        }
      if (!merged) out.push_back(b);
    }
  return out;
}

}  // namespace ops
}  // namespace kdtr
