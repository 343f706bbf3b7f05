// cpu/ddtree_decode.cpp -- ddtree_decode's CPU core (kernels/ddtree_decode.cuh) as its own
// object: the one translation unit of the binaries and the library that includes the core.
// Compiled with -ffp-contract=off (the Makefile): the drafter's float64 log-softmax must be
// kdtr.detmath's bits.

#include "ddtree_decode.cuh"

#include <string>

#include "ddtree_decode_params.h"

namespace kdtr {
namespace cpu {

std::string ddtree_decode(const DdtreeDecodeParams& p) { return ddtree_decode_cpu(p); }

}  // namespace cpu
}  // namespace kdtr
