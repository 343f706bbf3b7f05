// kdtr_cuda.hpp -- the device side of the kdtr_<op> binaries: a device copy of an input
// or output set (DeviceTensors, Device), the checked CUDA run with --repeat (run_cuda),
// and the kernel choice of tree_build and verify_attn (configure_tree_build,
// plan_verify_attn).  CUDA build only (not with KDTR_NO_CUDA).
#pragma once

#ifndef KDTR_NO_CUDA

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kdtr.hpp"
#include "kdtr_cli.hpp"
#include "kdtr_io.hpp"
#include "tree_build_launch.h"
#include "verify_attn_launch.h"

namespace kdtr {
namespace ops {

// ---------------------------------------------------------------------------------------
// Device copies and the checked CUDA run
// ---------------------------------------------------------------------------------------

// A device buffer per tensor of a list: a copy of it (inputs) or every byte kPoison
// (outputs).
class DeviceTensors {
 public:
  DeviceTensors(const TensorList& host, bool upload) {
    for (const Tensor& t : host.all()) {
      buf_.push_back(std::make_unique<cli::DeviceBuffer<uint8_t>>(static_cast<size_t>(t.nbytes)));
      if (upload) buf_.back()->upload(static_cast<const uint8_t*>(t.data));
      else buf_.back()->fill_bytes(cli::kPoison);
      names_.emplace_back(t.name, t.dtype);
    }
  }
  void add_to(Slots& s) const {
    for (size_t k = 0; k < buf_.size(); ++k) s.add(names_[k].first, buf_[k]->get(), names_[k].second);
  }
  // Copy every buffer back into the host list it was made from.
  void download(const TensorList& host) const {
    for (size_t k = 0; k < buf_.size(); ++k) buf_[k]->download(static_cast<uint8_t*>(host.all()[k].data));
  }

 private:
  std::vector<std::unique_ptr<cli::DeviceBuffer<uint8_t>>> buf_;
  std::vector<std::pair<std::string, DType>> names_;
};

// One binary's device state: a stream, the inputs uploaded and the outputs poisoned
// (then one device synchronization: the setup is done).
struct Device {
  cli::CudaStream stream;
  DeviceTensors in, out;
  Device(const Inputs& host_in, const Outputs& host_out) : in(host_in, true), out(host_out, false) {
    KDTR_CUDA_CHECK(cudaDeviceSynchronize());
  }
  // The device pointers by name (for *_params).
  Slots slots(const Dims& dims) const {
    Slots s(dims);
    in.add_to(s);
    out.add_to(s);
    return s;
  }
};

// The checked run: `launch` (which enqueues the op on dev.stream and returns its
// cudaError_t) once, checked, then the outputs copied back into `host_out`; with --repeat,
// `extra_warmup` more untimed launches and the timing line (cli::time_cuda).
template <class Launch>
void run_cuda(const cli::Args& args, const Device& dev, const Outputs& host_out, Launch&& launch,
              int extra_warmup = 0) {
  KDTR_CUDA_CHECK(launch());
  KDTR_CUDA_CHECK(cudaGetLastError());
  dev.stream.sync();
  dev.out.download(host_out);
  if (args.repeat > 0) {
    for (int w = 0; w < extra_warmup; ++w) KDTR_CUDA_CHECK(launch());
    if (extra_warmup > 0) dev.stream.sync();
    cli::print_timing("cuda", cli::time_cuda(args.repeat, dev.stream.get(), launch));
  }
  KDTR_CUDA_CHECK(cudaGetLastError());
  KDTR_CUDA_CHECK(cudaDeviceSynchronize());
}

// tree_build's build kernel for `want` (TREE_BUILD_KERNEL_AUTO, _HEAP or _SELECT) on
// `device`, configured: the launcher's policy (tree_build_choose).  Exit 3 ("backend cuda
// not supported: <who>N = ...") when the chosen (or forced) kernel needs more shared memory
// than the device allows.  Returns the kernel to put in TreeBuildParams::kernel.
inline int32_t configure_tree_build(const TreeBuildParams& p, int32_t want, int device, const std::string& who) {
  TreeBuildParams q = p;
  q.kernel = want;
  int32_t k = want;
  std::string why;
  const cudaError_t err = tree_build_choose(q, device, &k, &why);
  if (err == cudaErrorNotSupported) cli::die(cli::EXIT_NOT_SUPPORTED, "backend cuda not supported: " + who + why);
  KDTR_CUDA_CHECK(err);
  return k;
}

// verify_attn's kernel for the --kernel value `kernel` (verify_attn_kernel_option) on
// `device`, configured: the launcher's policy (verify_attn_choose).  Where the forced
// kernel (or, for auto, every kernel) does not apply: exit 3, "backend cuda not supported:
// <who>" and what the kernel needs against what it got.
inline VerifyAttnPlan plan_verify_attn(const VerifyAttnProblem& p, const std::string& kernel, int device,
                                       const std::string& who) {
  VerifyAttnProblem q = p;
  q.kernel = kernel == "simt"    ? KDTR_VERIFY_ATTN_SIMT
             : kernel == "mma"   ? KDTR_VERIFY_ATTN_MMA
             : kernel == "wgmma" ? KDTR_VERIFY_ATTN_WGMMA
                                 : KDTR_VERIFY_ATTN_AUTO;
  VerifyAttnPlan plan;
  std::string why;
  const cudaError_t err = verify_attn_choose(q, device, &plan, &why);
  if (err == cudaErrorNotSupported) cli::die(cli::EXIT_NOT_SUPPORTED, "backend cuda not supported: " + who + why);
  KDTR_CUDA_CHECK(err);
  return plan;
}

}  // namespace ops
}  // namespace kdtr

#endif  // KDTR_NO_CUDA
