// cpu/tree_accept.cpp -- tree_accept's CPU core (kernels/tree_accept.cuh) as its own
// object: the one translation unit of the binaries and the library that includes the core.

#include "tree_accept.cuh"

#include "tree_accept_params.h"

namespace kdtr {
namespace cpu {

void tree_accept(const TreeAcceptParams& p) { tree_accept_cpu(p); }

}  // namespace cpu
}  // namespace kdtr
