// cpu/ddtree_decode.cpp -- ddtree_decode's CPU core (kernels/ddtree_decode.cuh) as its own
// object: the one translation unit of the binaries and the library that includes the core.
// Compiled with -ffp-contract=off (the Makefile): the drafter's float64 log-softmax must be
// kdtr.detmath's bits.

#include "ddtree_decode.cuh"

#include <string>

#include "ddtree_decode_params.h"

namespace kdtr {

std::string ddtree_decode_error_message(const DdtreeDecodeError& e, int64_t S) {
  const std::string req = "request " + std::to_string(e.request), step = "step " + std::to_string(e.step);
  switch (e.kind) {
    case KDTR_DDTREE_DECODE_OK: return "";
    case KDTR_DDTREE_DECODE_TREE_BUILD_STATUS:
      return req + ", " + step + ": tree_build status " + std::to_string(e.value);
    case KDTR_DDTREE_DECODE_CACHE_ROWS:
      return req + ": kv_cache: S = " + std::to_string(S) + " rows, " + step + " needs " + std::to_string(e.value);
    case KDTR_DDTREE_DECODE_TREE_ACCEPT_STATUS:
      return req + ", " + step + ": tree_accept status " + std::to_string(e.value);
    default: return req + ", " + step + ": unknown stop " + std::to_string(e.kind);
  }
}

namespace cpu {

std::string ddtree_decode(const DdtreeDecodeParams& p) { return ddtree_decode_cpu(p); }

}  // namespace cpu
}  // namespace kdtr
