// cpu/verify_attn.cpp -- verify_attn's CPU core (kernels/verify_attn.cuh) as its own
// object: the one translation unit of the binaries and the library that includes the core.

#include "verify_attn.cuh"

#include "verify_attn_params.h"

namespace kdtr {
namespace cpu {

void verify_attn(const VerifyAttnProblem& p) { verify_attn_cpu(p); }

bool verify_attn_lengths_ok(int64_t prefix_len, int64_t tree_len, int64_t T, int64_t S) {
  return kdtr::verify_attn_lengths_ok(prefix_len, tree_len, T, S);
}

}  // namespace cpu
}  // namespace kdtr
