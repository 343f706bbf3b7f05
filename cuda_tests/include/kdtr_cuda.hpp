// kdtr_cuda.hpp -- the device side of the kdtr_<op> binaries: a device copy of an input
// or output set (DeviceTensors, Device), the checked CUDA run with --repeat and --graph
// (run_cuda; the graph: CapturedGraph), and the kernel choice of tree_build and verify_attn
// (configure_tree_build, plan_verify_attn).  CUDA build only (not with KDTR_NO_CUDA).
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
  // Copy a host list of the same tensors (dtypes and shapes) into the buffers.
  void upload(const TensorList& host) {
    for (size_t k = 0; k < buf_.size(); ++k) buf_[k]->upload(static_cast<const uint8_t*>(host.all()[k].data));
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

// One binary's device state: a stream, the inputs uploaded (with --graph: the first
// replay's data set, `first`) and the outputs poisoned (then one device synchronization:
// the setup is done).  The buffers are allocated once, at the input file's shapes.
struct Device {
  cli::CudaStream stream;
  mutable DeviceTensors in;
  DeviceTensors out;
  const Inputs* second;      // the golden's inputs (input.<name>; with --graph the second data set)
  const FirstReplay* first;  // --graph's first data set (first->on()), or nullptr
  Device(const Inputs& host_in, const Outputs& host_out, const FirstReplay* first_replay = nullptr)
      : in(first_replay != nullptr && first_replay->on() ? first_replay->inputs() : host_in, true),
        out(host_out, false),
        second(&host_in),
        first(first_replay) {
    KDTR_CUDA_CHECK(cudaDeviceSynchronize());
  }
  bool graph() const { return first != nullptr && first->on(); }
  // The device pointers by name (for *_params).
  Slots slots(const Dims& dims) const {
    Slots s(dims);
    in.add_to(s);
    out.add_to(s);
    return s;
  }
};

// The launches of `launch` (which enqueues the op's launches on `stream` and returns a
// cudaError_t), captured into one CUDA graph (cudaStreamBeginCapture, global mode: a call
// that is illegal during capture anywhere in the process fails the capture) and
// instantiated.  Every call checked; a launch that fails (or throws) ends the capture first,
// so the stream is usable and the error is the launch's.  Kernel choice and configuration
// (shared-memory attributes) must be done before: nothing of it is captured.
class CapturedGraph {
 public:
  template <class Launch>
  CapturedGraph(cudaStream_t stream, Launch&& launch) {
    KDTR_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    cudaError_t launch_during_capture = cudaSuccess;
    try {
      launch_during_capture = launch();
    } catch (...) {
      end_capture(stream);
      throw;
    }
    const cudaError_t capture_end = end_capture(stream);
    KDTR_CUDA_CHECK(launch_during_capture);
    KDTR_CUDA_CHECK(capture_end);
    if (graph_ == nullptr) cli::die(cli::EXIT_RUNTIME, "cudaStreamEndCapture gave no graph");
    KDTR_CUDA_CHECK(cudaGraphGetNodes(graph_, nullptr, &nodes_));
    KDTR_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
  }
  ~CapturedGraph() {
    if (exec_ != nullptr) (void)cudaGraphExecDestroy(exec_);
    if (graph_ != nullptr) (void)cudaGraphDestroy(graph_);
  }
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;
  // Enqueue one replay on `stream` (checked).
  void replay(cudaStream_t stream) const { KDTR_CUDA_CHECK(cudaGraphLaunch(exec_, stream)); }
  cudaGraphExec_t exec() const { return exec_; }
  // The captured graph's node count (kernel launches and any memset/memcpy nodes).
  size_t nodes() const { return nodes_; }

 private:
  cudaError_t end_capture(cudaStream_t stream) {
    cudaGraph_t g = nullptr;
    const cudaError_t err = cudaStreamEndCapture(stream, &g);
    if (graph_ == nullptr) graph_ = g;
    else if (g != nullptr) (void)cudaGraphDestroy(g);
    if (err != cudaSuccess) (void)cudaGetLastError();  // the capture error is reported by the caller
    return err;
  }
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  size_t nodes_ = 0;
};

// --graph on the device (docs/binaries.md, "Graph replay"): the op's launches captured once
// in one graph, replayed on the first data set (uploaded by Device), synchronized, the
// outputs copied back and kept; the second data set uploaded over the first (inputs only:
// the outputs keep the first replay's values), replayed, synchronized, copied back into
// `host_out`; with --repeat, the replays timed.  Returns the graph's node count.
template <class Launch>
size_t run_cuda_graph(const cli::Args& args, const Device& dev, Outputs& host_out, Launch&& launch) {
  const cudaStream_t s = dev.stream.get();
  const CapturedGraph graph(s, launch);
  graph.replay(s);
  dev.stream.sync();
  KDTR_CUDA_CHECK(cudaGetLastError());
  dev.out.download(host_out);
  host_out.keep_first_replay();
  dev.in.upload(*dev.second);
  KDTR_CUDA_CHECK(cudaDeviceSynchronize());  // the uploads (legacy stream) are done before the replay
  graph.replay(s);
  dev.stream.sync();
  KDTR_CUDA_CHECK(cudaGetLastError());
  dev.out.download(host_out);
  if (args.repeat > 0)
    cli::print_timing("cuda", cli::time_cuda(args.repeat, s, [&] { return cudaGraphLaunch(graph.exec(), s); }));
  KDTR_CUDA_CHECK(cudaGetLastError());
  KDTR_CUDA_CHECK(cudaDeviceSynchronize());
  return graph.nodes();
}

// The checked run: `launch` (which enqueues the op on dev.stream and returns its
// cudaError_t) once, checked, then the outputs copied back into `host_out`; with --repeat,
// `extra_warmup` more untimed launches and the timing line (cli::time_cuda).  With --graph
// (dev.graph()): run_cuda_graph instead.
template <class Launch>
void run_cuda(const cli::Args& args, const Device& dev, Outputs& host_out, Launch&& launch, int extra_warmup = 0) {
  if (dev.graph()) {
    host_out.graph_nodes = static_cast<int64_t>(run_cuda_graph(args, dev, host_out, launch));
    return;
  }
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
