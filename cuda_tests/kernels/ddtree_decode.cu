// ddtree_decode.cu -- ddtree_decode's CUDA side: none yet (docs/ops/ddtree_decode.md).  The
// binary's --backend cuda exits 3 and the library's CUDA entry returns
// KDTR_ERR_NOT_SUPPORTED; this translation unit exists so that the build's rule for every
// op (kernel_<op>.o) holds.  The device decode loop (the project's kernels plus the
// projections and the drafter on the device, no host round trip inside a step) comes here.

namespace kdtr {
namespace ddtree_decode_cuda {

// The number of device kernels of ddtree_decode built so far.
int kernel_count() { return 0; }

}  // namespace ddtree_decode_cuda
}  // namespace kdtr
