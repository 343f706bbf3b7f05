#!/usr/bin/env python3
"""Benchmark the Python bindings: what a call of an op costs beyond its kernels.

For each op at a small realistic shape (and verify_attn also at the Kimi K2 shape B=1,
T=9, H=64, Dqk=576, d_v=512, prefix 4096, bf16), on one CUDA device:

- kernel: the op's device time alone. N calls of ``kdtr.kernels.<op>(out=...)``
  (preallocated outputs, nothing allocated) captured in one CUDA graph, replayed R times;
  CUDA events around the replays; time / (N R). Includes the graph's node-to-node gaps,
  none of the host.
- eager: wall time (``time.perf_counter``) of a loop of M calls, synchronized before and
  after, / M, for four ways of calling: ``torch.ops.kdtr.<op>`` (functional: allocates its
  outputs), ``torch.ops.kdtr.<op>.out`` (preallocated), ``kdtr.kernels.<op>(out=...)``,
  and ``kdtr.kernels.<op>()`` (allocates and poisons with 0x5a, the conformance default).
  Where the host is slower than the device this is the host's cost; else the kernel's.
- host: the host's own cost of one call of ``torch.ops.kdtr.<op>``, of
  ``kdtr.kernels.<op>(out=...)``, of the library's CUDA entry alone (``entry``: the
  ctypes call with the struct such a call built, the library's checks and launches) and
  of the functional op's allocations alone (``alloc``: ``torch.empty_strided`` of each
  output, greedy_step also its [B] tree_len workspace, on the device): a
  loop of 200 calls timed without waiting for the device (short enough not to fill the
  launch queue), / 200, the least of 7 loops.
- replay: a CUDA graph holding ONE call of ``torch.ops.kdtr.<op>``, replayed M times;
  wall time / M (synchronized before and after) and events / M.

Prints a Markdown table: op, shape, kernel us, eager us for each way of calling, eager -
kernel for the functional op (target <= 15 us), host us, replay us (wall; events) and
replay / kernel (target <= 1.10), with met / MISSED. ``--profile`` adds cProfile's top
functions of 2000 eager calls of each op's functional form. ``--json FILE`` writes the
numbers.

Usage (from the repository root, after ``make lib``; torch with a CUDA device):

    python3 bench/bench_bindings.py [--calls 2000] [--graph-calls 50] [--replays 40]
        [--only verify_attn] [--profile] [--json FILE]

Exit codes: 0 done (missed targets included: a benchmark, not a test); 1 a call failed;
2 no CUDA device or no library.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

EAGER_TARGET_US = 15.0
REPLAY_TARGET = 1.10


def cases(torch, dev: str = "cuda"):
    """(label, op, shape text, kdtr.kernels kwargs, torch.ops positional args), on ``dev``."""
    from kdtr.generators import gen_tree_build_refs as build_gen

    rng = np.random.default_rng(5)

    def t(a):
        return torch.from_numpy(np.array(a, order="C")).to(dev)  # a writable C-contiguous copy

    def build(b, d, k, n):
        lp, ids = build_gen.drafter_rows(rng, b, d, k)
        return dict(top_log_probs=t(lp), top_token_ids=t(ids), root_token_ids=t(rng.integers(0, 32000, b)),
                    budget=t(np.full(b, n, np.int32)), depth_limit=t(np.full(b, d, np.int32)))

    def attn(b, tt, h, dqk, dv, prefix, dtype):
        s = prefix + tt
        q = torch.randn(b, tt, h, dqk, device=dev).to(dtype)
        kv = torch.randn(b, s, dqk, device=dev).to(dtype)
        vis = t(np.broadcast_to(np.tril(np.ones((tt, tt), np.uint8)), (b, tt, tt)))
        return dict(q=q, kv_cache=kv, prefix_len=t(np.full(b, prefix, np.int32)),
                    tree_len=t(np.full(b, tt, np.int32)), visibility=vis,
                    sm_scale=1.0 / math.sqrt(dqk), d_v=dv)

    out = []
    x = build(8, 8, 8, 64)
    out.append(("tree_build", "tree_build", "B=8 D=8 K=8 N=64", dict(x, max_budget=64),
                (*x.values(), 64)))
    y = attn(4, 33, 4, 72, 64, 64, torch.float32)
    out.append(("verify_attn", "verify_attn", "B=4 T=33 H=4 Dqk=72 d_v=64 prefix 64 f32", y,
                (*list(y.values())[:5], y["sm_scale"], y["d_v"])))
    k2 = attn(1, 9, 64, 576, 512, 4096, torch.bfloat16)
    out.append(("verify_attn K2", "verify_attn", "B=1 T=9 H=64 Dqk=576 d_v=512 prefix 4096 bf16", k2,
                (*list(k2.values())[:5], k2["sm_scale"], k2["d_v"])))
    import kdtr.torch_ops  # noqa: F401

    tb = torch.ops.kdtr.tree_build(*out[0][4])
    a = dict(node_token_ids=tb[1], next_token=tb[4], next_sibling=tb[5], node_count=tb[0],
             target_predict=t(rng.integers(0, 32000, (8, 65))))
    a["target_predict"][:, 0] = tb[1][:, 1]  # the first child of the root matches: a path longer than 0
    out.append(("tree_accept", "tree_accept", "B=8 T=65", a, tuple(a.values())))
    g = build(4, 6, 4, 32)
    ga = attn(4, 33, 4, 72, 64, 64, torch.float32)
    gk = dict(g, q=ga["q"], kv_cache=ga["kv_cache"], prefix_len=ga["prefix_len"], sm_scale=ga["sm_scale"],
              d_v=ga["d_v"], target_predict=t(rng.integers(0, 32000, (4, 33))), max_budget=32)
    out.append(("greedy_step", "greedy_step", "B=4 D=6 K=4 N=32 H=4 Dqk=72 d_v=64 prefix 64 f32", gk,
                (*g.values(), ga["q"], ga["kv_cache"], ga["prefix_len"], ga["sm_scale"], ga["d_v"],
                 gk["target_predict"], 32)))
    return out


def capture(torch, fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def events(torch, fn, reps: int) -> float:
    """Seconds per call of fn, by CUDA events over `reps` calls (after a warm-up)."""
    fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / 1e3 / reps


def wall(torch, fn, calls: int) -> float:
    for _ in range(min(100, calls)):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls


def host(torch, fn, calls: int = 200) -> float:
    """The host's cost of one call: a short loop, not waiting for the device; the least of 7."""
    res = []
    for _ in range(7):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        res.append((time.perf_counter() - t0) / calls)
    torch.cuda.synchronize()
    return min(res)


def entry_call(kernels, op: str, call):
    """A function calling the library's CUDA entry of `op` alone, with the struct and stream
    that `call()` passed it (recorded by a wrapper around the entry for one call)."""
    import ctypes

    L = kernels.load()
    real = L._kdtr_entries[op, "cuda"]
    seen = []

    def spy(p, stream):
        obj = getattr(p, "_obj", p)  # the struct, or a byref() of it
        seen.append((type(obj).from_buffer_copy(obj), stream))
        return real(p, stream)

    L._kdtr_entries[op, "cuda"] = spy
    try:
        call()
    finally:
        L._kdtr_entries[op, "cuda"] = real
    p, stream = seen[0]
    ref = ctypes.byref(p)
    return lambda: real(ref, stream)


def allocations(torch, kernels, op: str, kin: dict):
    """A function making the allocations the functional op makes per call (each output,
    greedy_step also its [B] tree_len workspace), on the inputs' device, and nothing else."""
    specs = kernels.output_specs(op, kin, max_budget=kin.get("max_budget"))
    dts = kernels._dtypes(True)
    dev = kin[kernels._DEFS[op].names[0]].device
    shapes = [(s, kernels._strides(s), dts[dt]) for dt, s in specs.values()]
    if op == "greedy_step":
        b = (kin["q"].shape[0],)
        shapes.append((b, (1,), torch.int32))
    empty = torch.empty_strided
    return lambda: [empty(s, st, dtype=dt, device=dev) for s, st, dt in shapes]


def measure(torch, case, args) -> dict:
    from kdtr import kernels
    from kdtr.torch_ops import out_kwargs

    label, op, shape, kin, targs = case
    f_kernels = getattr(kernels, op)
    top = getattr(torch.ops.kdtr, op)
    out = kernels.empty_outputs(op, kin, max_budget=kin.get("max_budget"))
    okw = out_kwargs(op, out)
    ways = {
        "torch.ops": lambda: top(*targs),
        "torch.ops .out": lambda: top.out(*targs, **okw),
        "kernels(out=)": lambda: f_kernels(**kin, out=out),
        "kernels()": lambda: f_kernels(**kin),
    }
    n = args.graph_calls

    def many():
        for _ in range(n):
            f_kernels(**kin, out=out)

    g_many = capture(torch, many)
    kernel = events(torch, g_many.replay, args.replays) / n
    eager = {w: wall(torch, fn, args.calls) for w, fn in ways.items()}
    g_one = capture(torch, ways["torch.ops"])
    replay_wall = wall(torch, g_one.replay, args.calls)
    replay_ev = events(torch, g_one.replay, args.calls)
    res = {"label": label, "op": op, "shape": shape, "kernel_us": kernel * 1e6,
           "eager_us": {w: v * 1e6 for w, v in eager.items()}, "host_us": host(torch, ways["torch.ops"]) * 1e6,
           "host_out_us": host(torch, ways["kernels(out=)"]) * 1e6,
           "entry_us": host(torch, entry_call(kernels, op, ways["kernels(out=)"])) * 1e6,
           "alloc_us": host(torch, allocations(torch, kernels, op, kin)) * 1e6,
           "replay_wall_us": replay_wall * 1e6, "replay_events_us": replay_ev * 1e6}
    res["eager_minus_kernel_us"] = res["eager_us"]["torch.ops"] - res["kernel_us"]
    res["eager_out_minus_kernel_us"] = res["eager_us"]["torch.ops .out"] - res["kernel_us"]
    res["replay_over_kernel"] = res["replay_wall_us"] / res["kernel_us"]
    if args.profile:
        import cProfile
        import io
        import pstats

        pr = cProfile.Profile()
        pr.enable()
        for _ in range(2000):
            ways["torch.ops"]()
        pr.disable()
        torch.cuda.synchronize()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(14)
        res["profile"] = s.getvalue()
    return res


def table(rows: list[dict], gpu: str) -> str:
    lines = [f"GPU: {gpu}", "",
             "| op | shape | kernel us | torch.ops us | .out us | kernels(out=) us | kernels() us | "
             "eager - kernel us (<= 15) | .out - kernel us | host us: torch.ops; kernels(out=); entry; alloc | "
             "replay us (wall; events) | replay / kernel (<= 1.10) |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        e = r["eager_us"]
        ok1 = "met" if r["eager_minus_kernel_us"] <= EAGER_TARGET_US else "MISSED"
        ok2 = "met" if r["replay_over_kernel"] <= REPLAY_TARGET else "MISSED"
        lines.append(
            f"| {r['label']} | {r['shape']} | {r['kernel_us']:.1f} | {e['torch.ops']:.1f} | {e['torch.ops .out']:.1f} "
            f"| {e['kernels(out=)']:.1f} | {e['kernels()']:.1f} | {r['eager_minus_kernel_us']:.1f} {ok1} | "
            f"{r['eager_out_minus_kernel_us']:.1f} | {r['host_us']:.1f}; {r['host_out_us']:.1f}; "
            f"{r['entry_us']:.1f}; {r['alloc_us']:.1f} | {r['replay_wall_us']:.1f}; "
            f"{r['replay_events_us']:.1f} | {r['replay_over_kernel']:.2f} {ok2} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000, help="eager calls / graph replays per loop (default 2000)")
    ap.add_argument("--graph-calls", type=int, default=50, help="calls in the kernel-time graph (default 50)")
    ap.add_argument("--replays", type=int, default=40, help="replays of the kernel-time graph (default 40)")
    ap.add_argument("--only", default="", help="only the cases whose label contains this")
    ap.add_argument("--profile", action="store_true", help="cProfile of the functional op's eager calls")
    ap.add_argument("--json", type=Path, help="write the numbers here")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("bench_bindings: needs torch", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("bench_bindings: needs a CUDA device", file=sys.stderr)
        return 2
    from kdtr import kernels

    try:
        kernels.load()
    except kernels.KernelLibraryError as exc:
        print(f"bench_bindings: {exc}", file=sys.stderr)
        return 2
    rows = []
    for case in cases(torch):
        if args.only and args.only not in case[0]:
            continue
        try:
            rows.append(measure(torch, case, args))
        except Exception as exc:  # noqa: BLE001 - name the case, stop
            print(f"bench_bindings: {case[0]}: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
    kernels.check()
    print(table(rows, torch.cuda.get_device_name()))
    for r in rows:
        if "profile" in r:
            print(f"\n## profile: {r['label']} (torch.ops, 2000 calls)\n{r['profile']}")
    if args.json:
        args.json.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                         "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
