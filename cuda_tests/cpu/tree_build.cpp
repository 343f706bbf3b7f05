// cpu/tree_build.cpp -- tree_build's CPU core (kernels/tree_build.cuh) as its own object:
// the one translation unit of the binaries and the library that includes the core, so an
// edit of the core rebuilds this object and relinks, nothing else (docs/binaries.md).

#include "tree_build.cuh"

#include "tree_build_params.h"

namespace kdtr {
namespace cpu {

void tree_build(const TreeBuildParams& p) { tree_build_cpu(p); }

size_t tree_build_candidate_bytes() { return sizeof(TreeBuildCand); }

size_t tree_build_select_set_bytes(int64_t N, int64_t K) { return tree_select_set_bytes(tree_select_room(N, K)); }

}  // namespace cpu
}  // namespace kdtr
