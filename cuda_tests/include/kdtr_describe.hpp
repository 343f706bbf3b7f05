// kdtr_describe.hpp -- an op's parameter struct as the binaries and libkdtr_kernels.so see
// it: `kdtr_<op> --describe` and kdtr_describe(op) print describe_json(op).
//
//   {"op": "tree_accept", "struct": "kdtr_tree_accept_params", "size": 88, "align": 8,
//    "fields": [{"name": "node_token_ids", "type": "const int64_t*", "offset": 0, "size": 8}, ...],
//    "kernels": []}
//
// The fields come from the op's X-macro field list (<op>_params.h), with offsetof and
// sizeof of the compiled struct; "kernels" are the op's forcible kernels (kernel = index +
// 1).  tests/test_kernels_abi.py holds every binary's and the library's answer against the
// layout kdtr/kernels.py derives from the spec (kdtr_abi.h's rule).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "ddtree_decode_params.h"
#include "greedy_step_params.h"
#include "tree_accept_params.h"
#include "tree_build_params.h"
#include "verify_attn_params.h"

namespace kdtr {
namespace abi {

struct Field {
  const char* name;
  const char* type;
  size_t offset;
  size_t size;
};

struct OpLayout {
  const char* op;
  const char* struct_name;
  size_t size;
  size_t align;
  std::vector<Field> fields;
  std::vector<const char*> kernels;
};

#define KDTR_ABI_DESCRIBE_FIELD(S, type, name) {#name, #type, offsetof(S, name), sizeof(type)},

// The layout of `op` ("tree_build", ...); nullptr for another name.
inline const OpLayout* layout(const std::string& op) {
#define KDTR_TB(type, name) KDTR_ABI_DESCRIBE_FIELD(kdtr_tree_build_params, type, name)
#define KDTR_VA(type, name) KDTR_ABI_DESCRIBE_FIELD(kdtr_verify_attn_params, type, name)
#define KDTR_TA(type, name) KDTR_ABI_DESCRIBE_FIELD(kdtr_tree_accept_params, type, name)
#define KDTR_GS(type, name) KDTR_ABI_DESCRIBE_FIELD(kdtr_greedy_step_params, type, name)
#define KDTR_DD(type, name) KDTR_ABI_DESCRIBE_FIELD(kdtr_ddtree_decode_params, type, name)
  static const std::vector<OpLayout> all = {
      {"tree_build",
       "kdtr_tree_build_params",
       sizeof(kdtr_tree_build_params),
       alignof(kdtr_tree_build_params),
       {KDTR_TREE_BUILD_PARAMS_FIELDS(KDTR_TB)},
       {KDTR_TREE_BUILD_KERNEL_NAMES}},
      {"verify_attn",
       "kdtr_verify_attn_params",
       sizeof(kdtr_verify_attn_params),
       alignof(kdtr_verify_attn_params),
       {KDTR_VERIFY_ATTN_PARAMS_FIELDS(KDTR_VA)},
       {KDTR_VERIFY_ATTN_KERNEL_NAMES}},
      {"tree_accept",
       "kdtr_tree_accept_params",
       sizeof(kdtr_tree_accept_params),
       alignof(kdtr_tree_accept_params),
       {KDTR_TREE_ACCEPT_PARAMS_FIELDS(KDTR_TA)},
       {}},
      {"greedy_step",
       "kdtr_greedy_step_params",
       sizeof(kdtr_greedy_step_params),
       alignof(kdtr_greedy_step_params),
       {KDTR_GREEDY_STEP_PARAMS_FIELDS(KDTR_GS)},
       {KDTR_GREEDY_STEP_KERNEL_NAMES}},
      {"ddtree_decode",
       "kdtr_ddtree_decode_params",
       sizeof(kdtr_ddtree_decode_params),
       alignof(kdtr_ddtree_decode_params),
       {KDTR_DDTREE_DECODE_PARAMS_FIELDS(KDTR_DD)},
       {}},
  };
#undef KDTR_TB
#undef KDTR_VA
#undef KDTR_TA
#undef KDTR_GS
#undef KDTR_DD
  for (const OpLayout& l : all)
    if (op == l.op) return &l;
  return nullptr;
}

// describe_json's text for `op` (one line, no newline); "" for another name.
inline std::string describe_json(const std::string& op) {
  const OpLayout* l = layout(op);
  if (l == nullptr) return "";
  auto q = [](const char* s) { return std::string("\"") + s + "\""; };
  std::string j = "{\"op\": " + q(l->op) + ", \"struct\": " + q(l->struct_name) +
                  ", \"size\": " + std::to_string(l->size) + ", \"align\": " + std::to_string(l->align) +
                  ", \"fields\": [";
  for (size_t k = 0; k < l->fields.size(); ++k) {
    const Field& f = l->fields[k];
    j += (k ? ", " : "") + std::string("{\"name\": ") + q(f.name) + ", \"type\": " + q(f.type) +
         ", \"offset\": " + std::to_string(f.offset) + ", \"size\": " + std::to_string(f.size) + "}";
  }
  j += "], \"kernels\": [";
  for (size_t k = 0; k < l->kernels.size(); ++k) j += (k ? ", " : "") + q(l->kernels[k]);
  return j + "]}";
}

}  // namespace abi
}  // namespace kdtr
