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
// `device`, with its shared memory for p.N and p.D raised: AUTO is the select kernel
// where its shared memory fits, else the heap kernel.  Exit 3 ("backend cuda not supported:
// <who>N = ...") when the chosen (or forced) kernel needs more than the device allows.
// Returns the kernel to put in TreeBuildParams::kernel.
inline int32_t configure_tree_build(const TreeBuildParams& p, int32_t want, int device, const std::string& who) {
  auto fits = [&](int32_t k, size_t* need, size_t* have) {
    *need = tree_build_smem_bytes(p.N, p.D, p.K, k);
    KDTR_CUDA_CHECK(tree_build_smem_available(device, k, have));
    return *need <= *have;
  };
  size_t need = 0, have = 0;
  int32_t k = want == TREE_BUILD_KERNEL_HEAP ? TREE_BUILD_KERNEL_HEAP : TREE_BUILD_KERNEL_SELECT;
  if (!fits(k, &need, &have) && want == TREE_BUILD_KERNEL_AUTO) {
    k = TREE_BUILD_KERNEL_HEAP;
    fits(k, &need, &have);
  }
  if (need > have)
    cli::die(cli::EXIT_NOT_SUPPORTED, "backend cuda not supported: " + who + "N = " + std::to_string(p.N) +
                                          ", D = " + std::to_string(p.D) + ": the " +
                                          (k == TREE_BUILD_KERNEL_HEAP ? "heap" : "select") + " kernel needs " +
                                          std::to_string(need) + " bytes of shared memory per block, device " +
                                          std::to_string(device) + " allows " + std::to_string(have));
  KDTR_CUDA_CHECK(tree_build_configure(k, need));
  return k;
}

// verify_attn's kernel for the --kernel value `kernel` (verify_attn_kernel_option) on
// `device`, configured (its shared-memory limit raised).  Where the forced kernel (or,
// for auto, every kernel) does not apply: exit 3, "backend cuda not supported: <who>"
// and what the kernel needs against what it got.
inline VerifyAttnPlan plan_verify_attn(const VerifyAttnProblem& p, const std::string& kernel, int device,
                                       const std::string& who) {
  const VerifyAttnKernel requested = kernel == "simt"    ? VerifyAttnKernel::Simt
                                     : kernel == "mma"   ? VerifyAttnKernel::Mma
                                     : kernel == "wgmma" ? VerifyAttnKernel::Wgmma
                                                         : VerifyAttnKernel::Auto;
  VerifyAttnPlan plan;
  const cudaError_t perr = verify_attn_plan(p, requested, device, &plan);
  if (perr == cudaErrorNotSupported) {
    const std::string got = std::string(p.input == VerifyAttnInput::BF16 ? "bf16" : "f32") + ", Dqk " +
                            std::to_string(p.Dqk) + ", d_v " + std::to_string(p.d_v);
    std::string why;
    if (requested == VerifyAttnKernel::Wgmma) {
      int major = 0, minor = 0;
      KDTR_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
      KDTR_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
      why = "--kernel wgmma needs bf16 inputs with Dqk % 8 == 0, Dqk <= 576, d_v <= 512, enough shared memory, a "
            "compute capability 9.0 device and a build with the Hopper kernel (got " + got +
            ", compute capability " + std::to_string(major) + "." + std::to_string(minor) + ", a build " +
            (verify_attn_have_wgmma() ? "with" : "without") + " it)";
    } else if (requested == VerifyAttnKernel::Mma) {
      why = "--kernel mma needs bf16 inputs with Dqk % 8 == 0, Dqk <= 576, d_v <= 512 and enough shared memory (got " +
            got + ")";
    } else {
      why = "verify_attn has no kernel for " + got;
    }
    cli::die(cli::EXIT_NOT_SUPPORTED, "backend cuda not supported: " + who + why);
  }
  KDTR_CUDA_CHECK(perr);
  KDTR_CUDA_CHECK(verify_attn_configure(plan));
  return plan;
}

}  // namespace ops
}  // namespace kdtr

#endif  // KDTR_NO_CUDA
