// test_tree_accept.cu -- build/bin/kdtr_tree_accept: run tree_accept on a golden's inputs.
//
//   kdtr_tree_accept --input GOLDEN --output OUT [--backend cpu|cuda] [--device N] [--repeat N] [--graph]
//   kdtr_tree_accept --describe   (its parameter struct kdtr_tree_accept_params as JSON: docs/binaries.md)
//
// Reads the inputs of kdtr::ops::tree_accept_decl() (kdtr_ops.hpp: node_token_ids i64
// [B,T], next_token i32 [B,T], next_sibling i32 [B,T], node_count i32 [B], target_predict
// i64 [B,T]) from GOLDEN, runs the op (contract: docs/ops/tree_accept.md), and writes OUT
// holding its outputs (accepted_count i32 [B], accepted_path i32 [B,T], proposed i64
// [B,T], status i32 [B]) with metadata op="tree_accept", config (copied from the golden),
// backend, device.  Exit codes, the --repeat line and --graph (two data sets replayed from
// one CUDA graph): docs/binaries.md.
//
// Host code only, compiled as C++ in both builds (-DKDTR_NO_CUDA in the CPU-only one),
// linked with the CPU core (cpu/tree_accept.cpp) and, in the CUDA build, the kernel
// (kernels/tree_accept.cu); it includes neither core.

#include <string>

#include "kdtr.hpp"
#include "kdtr_cli.hpp"
#include "kdtr_describe.hpp"
#include "kdtr_io.hpp"
#include "kdtr_ops.hpp"
#include "tree_accept_params.h"

#ifndef KDTR_NO_CUDA
#include "kdtr_cuda.hpp"
#include "tree_accept_launch.h"
#endif

namespace {

using namespace kdtr;

int run(const cli::Args& args) {
  cli::require_backend(args);
  const File golden = File::open(args.input);
  const ops::OpDecl& op = ops::tree_accept_decl();
  ops::Inputs in(golden, op.bounds);
  in.read(op);                                                                  // B and T from node_token_ids
  const ops::FirstReplay first(args, in, [&](ops::Inputs& i) { i.read(op); });  // --graph: replay1.<name>
  ops::Outputs out;
  out.declare(op, in.dims());
  // Resource limits (docs/binaries.md), before anything is allocated; the CPU backend has
  // no scratch.  The outputs are bounded by the inputs' own bytes, but a limit is a limit.
  out.require_within_limit(golden, "input.node_token_ids", in.dims().eq("B") + ", " + in.dims().eq("T"));
  out.allocate();

  if (args.cuda()) {
#ifndef KDTR_NO_CUDA
    const ops::Device dev(in, out, &first);
    const TreeAcceptParams p = ops::tree_accept_params(dev.slots(in.dims()));
    ops::run_cuda(args, dev, out, [&] { return launch_tree_accept(p, dev.stream.get()); });
#endif
  } else {
    const ops::Host host(in, first);
    const TreeAcceptParams p = ops::tree_accept_params(host.slots(in.dims()).add(out));
    ops::run_cpu(args, host, out, [&] { cpu::tree_accept(p); });
  }
  ops::write_outputs(args, golden, op.name, out);
  return cli::EXIT_OK;
}

}  // namespace

int main(int argc, char** argv) {
  return kdtr::cli::run_main(argc, argv, "kdtr_tree_accept", run, {}, kdtr::abi::describe_json("tree_accept"));
}
