"""torch.ops.kdtr.* (kdtr.torch_ops) on a CUDA device: each op eagerly on every committed
golden conforms (functional, and .out into poisoned buffers); each op captured in one
torch.cuda.graph and replayed with new inputs (the golden's rows reversed, then the golden
itself copied into the static tensors, outputs poisoned in between) conforms both times; a
bad length gives NaN rows and kernels.check() names the request, eagerly and inside a
graph; the engine loop (tree_build -> verify_attn -> tree_accept through the torch ops in
ONE captured graph) replayed for 100 steps with fresh inputs, each step judged against the
numpy reference (kdtr.ops) under the goldens' contracts. Skips without a CUDA device."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="needs torch")

from kdtr import kernels  # noqa: E402
from kdtr.compare import compare  # noqa: E402
from kdtr.ops import OPS as SPECS  # noqa: E402
from kdtr.testing import assert_conforms, goldens  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

OPS = ("tree_build", "verify_attn", "tree_accept", "greedy_step")
ALL_GOLDENS = [g for op in OPS for g in goldens(op)]
ARG_NAMES = {"tree_build": ["top_log_probs", "top_token_ids", "root_token_ids", "budget", "depth_limit", "max_budget"],
             "verify_attn": ["q", "kv_cache", "prefix_len", "tree_len", "visibility", "sm_scale", "d_v"],
             "tree_accept": ["node_token_ids", "next_token", "next_sibling", "node_count", "target_predict"],
             "greedy_step": ["top_log_probs", "top_token_ids", "root_token_ids", "budget", "depth_limit", "q",
                             "kv_cache", "prefix_len", "sm_scale", "d_v", "target_predict", "max_budget"]}


@pytest.fixture(scope="module", autouse=True)
def torch_ops():
    try:
        kernels.load()
    except kernels.KernelLibraryError as exc:
        pytest.fail(str(exc), pytrace=False)
    if not kernels.has_cuda():
        pytest.fail("torch has a CUDA device but libkdtr_kernels.so is the CPU-only build: run `make lib` with nvcc")
    if not kernels.has_device_checks():
        pytest.fail("libkdtr_kernels.so has no device-side length checks (kdtr_device_errors): rebuild it with "
                    "`make lib`")
    import kdtr.torch_ops as mod

    return mod


def to_cuda(a: np.ndarray) -> torch.Tensor:
    a = np.ascontiguousarray(a)
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16).cuda()
    return torch.from_numpy(a.copy()).cuda()


def host_inputs(g, reverse: bool = False) -> dict[str, np.ndarray]:
    """g's tensor inputs (rows reversed: the same requests in the other order)."""
    return {k: (v[::-1] if reverse else v) for k, v in g.inputs.items() if v.ndim}


def args_of(g, tensors: dict) -> tuple:
    x = dict(tensors)
    x["sm_scale"] = float(g.inputs["sm_scale"]) if "sm_scale" in g.inputs else None
    x["d_v"] = int(g.inputs["d_v"]) if "d_v" in g.inputs else None
    x["max_budget"] = g.metadata.get("max_budget")
    return tuple(x[n] for n in ARG_NAMES[g.op])


def on_host(out: dict) -> dict:
    return {k: v.cpu() for k, v in out.items()}


def reversed_rows(out: dict) -> dict:
    return {k: v.flip(0) for k, v in out.items()}


def poison_(out: dict) -> None:
    for v in out.values():
        if v.numel():
            v.view(-1).view(torch.uint8).fill_(0x5A)


# ---------------------------------------------------------------------------------------
# Eager
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("golden", ALL_GOLDENS, ids=str)
def test_eager_conforms(torch_ops, golden):
    op = getattr(torch.ops.kdtr, golden.op)
    args = args_of(golden, {k: to_cuda(v) for k, v in host_inputs(golden).items()})
    res = torch_ops.as_outputs(golden.op, op(*args))
    assert all(v.is_cuda for v in res.values())
    out = {k: torch.empty_like(v) for k, v in res.items()}
    poison_(out)  # an element the kernel does not write stays 0x5a and fails the golden
    op.out(*args, **torch_ops.out_kwargs(golden.op, out))
    torch.cuda.synchronize()
    assert_conforms(golden, on_host(res))
    assert_conforms(golden, on_host(out))


@pytest.mark.parametrize("name", OPS)
def test_a_planned_cuda_signature_does_not_serve_a_call_with_a_host_tensor(torch_ops, name):
    """After a call has planned a signature on CUDA, the same call with one input moved to
    the host is refused naming that input (a stale plan would hand the kernel a host pointer)."""
    g = goldens(name)[0]
    op = getattr(torch.ops.kdtr, name)
    cuda = {k: to_cuda(v) for k, v in host_inputs(g).items()}
    op(*args_of(g, cuda))  # plans the signature
    torch.cuda.synchronize()
    second = ARG_NAMES[name][1]  # not the first: the first tensor's device is the one the others are held to
    moved = dict(cuda, **{second: cuda[second].cpu()})
    with pytest.raises(ValueError, match=rf"{name}: {second}: on cpu, the other tensors on cuda"):
        op(*args_of(g, moved))
    with pytest.raises(ValueError, match=rf"{name}: {second}: "):
        getattr(kernels, name)(**{k: v for k, v in zip(ARG_NAMES[name], args_of(g, moved)) if v is not None})


def test_kernels_on_cuda_allocate_nothing_with_out_and_refuse_cuda_scalars():
    g = goldens("verify_attn", config="small")[0]
    x = {k: to_cuda(v) for k, v in host_inputs(g).items()}
    out = kernels.empty_outputs("verify_attn", dict(x, d_v=g.inputs["d_v"]))
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    res = kernels.verify_attn(**x, sm_scale=g.inputs["sm_scale"], d_v=g.inputs["d_v"], out=out)
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == before
    assert all(res[k] is out[k] for k in out)
    torch.cuda.synchronize()
    assert_conforms(g, on_host(res))
    with pytest.raises(ValueError, match=r"verify_attn: d_v: a tensor on cuda:0; reading it would synchronize"):
        kernels.verify_attn(**x, sm_scale=g.inputs["sm_scale"], d_v=torch.tensor(int(g.inputs["d_v"]), device="cuda"))
    with pytest.raises(ValueError, match=r"verify_attn: out\['lse'\]: expected a torch tensor on cuda:0"):
        kernels.verify_attn(**x, sm_scale=g.inputs["sm_scale"], d_v=g.inputs["d_v"],
                            out=dict(out, lse=out["lse"].cpu()))


# ---------------------------------------------------------------------------------------
# CUDA graphs: capture once, replay with new inputs
# ---------------------------------------------------------------------------------------

def capture(fn, *args):
    """fn(*args) warmed up on a side stream, then captured in a CUDA graph: (graph, outputs)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn(*args)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(*args)
    return graph, out


@pytest.mark.parametrize("golden", ALL_GOLDENS, ids=str)
def test_graph_replay_with_new_inputs_conforms(torch_ops, golden):
    op = getattr(torch.ops.kdtr, golden.op)
    static = {k: to_cuda(v) for k, v in host_inputs(golden, reverse=True).items()}
    args = args_of(golden, static)
    graph, res = capture(op, *args)
    out = torch_ops.as_outputs(golden.op, res)
    graph.replay()  # the reversed requests
    torch.cuda.synchronize()
    assert_conforms(golden, on_host(reversed_rows(out)))
    for k, v in host_inputs(golden).items():  # new inputs into the static tensors: the golden in order
        static[k].copy_(to_cuda(v))
    poison_(out)
    graph.replay()
    torch.cuda.synchronize()
    assert_conforms(golden, on_host(out))


@pytest.mark.parametrize("name", OPS)
def test_graph_of_the_out_overload_and_of_kernels(torch_ops, name):
    """The .out overload and kdtr.kernels.<op>(out=) captured: the graph writes the given buffers."""
    g = goldens(name)[0]
    static = {k: to_cuda(v) for k, v in host_inputs(g, reverse=True).items()}
    args = args_of(g, static)
    out = torch_ops.as_outputs(name, getattr(torch.ops.kdtr, name)(*args))
    out = {k: torch.empty_like(v) for k, v in out.items()}
    kout = {k: torch.empty_like(v) for k, v in out.items()}
    if name == "greedy_step":
        kout["tree_len"] = torch.empty_like(out["tree_build.node_count"])
    kw = dict(zip(ARG_NAMES[name], args))

    def both(*a):
        getattr(torch.ops.kdtr, name).out(*a, **torch_ops.out_kwargs(name, out))
        getattr(kernels, name)(**kw, out=kout)

    graph, _ = capture(both, *args)
    for k, v in host_inputs(g).items():
        static[k].copy_(to_cuda(v))
    poison_(out)
    poison_(kout)
    graph.replay()
    torch.cuda.synchronize()
    assert_conforms(g, on_host(out))
    assert_conforms(g, on_host({k: v for k, v in kout.items() if k != "tree_len"}))


def nan_rows(out: torch.Tensor, lse: torch.Tensor, b: int) -> bool:
    return bool(torch.isnan(out[b]).all()) and bool(torch.isnan(lse[b]).all())


def clear_record() -> None:
    """Empty device 0's error record (what earlier tests in this process left there)."""
    try:
        kernels.check(0)
    except kernels.KernelError:
        pass


def test_bad_length_eagerly_gives_nan_rows_and_check_names_the_request(torch_ops):
    clear_record()
    g = goldens("verify_attn", config="small")[0]
    x = {k: to_cuda(v) for k, v in host_inputs(g).items()}
    x["prefix_len"][1] = g.inputs["kv_cache"].shape[1]  # the prefix alone fills the cache
    out, lse = torch.ops.kdtr.verify_attn(*args_of(g, x))
    torch.cuda.synchronize()
    assert nan_rows(out, lse, 1)
    assert not torch.isnan(lse[0]).all()
    with pytest.raises(kernels.KernelError, match=r"verify_attn: .*request 1: prefix_len") as exc:
        kernels.check()
    assert (exc.value.op, exc.value.request, exc.value.field) == ("verify_attn", 1, "prefix_len")
    kernels.check()  # read once: cleared
    s = goldens("greedy_step", config="default")[0]
    y = {k: to_cuda(v) for k, v in host_inputs(s).items()}
    y["prefix_len"][0] = -2
    res = torch_ops.as_outputs("greedy_step", torch.ops.kdtr.greedy_step(*args_of(s, y)))
    torch.cuda.synchronize()
    assert nan_rows(res["verify_attn.out"], res["verify_attn.lse"], 0)
    with pytest.raises(kernels.KernelError, match=r"greedy_step: .*request 0: prefix_len") as exc:
        kernels.check(0)
    assert exc.value.request == 0


def test_bad_length_inside_a_graph(torch_ops):
    """A graph captured on good lengths, replayed with a bad tree_len in request 1: that
    request's rows are NaN, request 0 conforms, check() names request 1 and tree_len; the
    next replay with good lengths conforms again and records nothing."""
    clear_record()
    g = goldens("verify_attn", config="small")[0]  # B = 2
    static = {k: to_cuda(v) for k, v in host_inputs(g).items()}
    graph, (out, lse) = capture(torch.ops.kdtr.verify_attn, *args_of(g, static))
    T = g.inputs["q"].shape[1]
    static["tree_len"][1] = T + 1
    graph.replay()
    torch.cuda.synchronize()
    assert nan_rows(out, lse, 1)
    got = {"out": out.cpu().numpy(), "lse": lse.cpu().numpy()}
    for name in ("out", "lse"):
        r = compare(name, g.expected[name][:1], got[name][:1], g.contracts[name])
        assert r.ok, r
    with pytest.raises(kernels.KernelError, match=r"verify_attn: .*request 1: tree_len") as exc:
        kernels.check()
    assert (exc.value.request, exc.value.field) == (1, "tree_len")
    static["tree_len"].copy_(to_cuda(g.inputs["tree_len"]))
    graph.replay()
    torch.cuda.synchronize()
    kernels.check()
    assert_conforms(g, {"out": out.cpu(), "lse": lse.cpu()})


# ---------------------------------------------------------------------------------------
# The engine loop: tree_build -> verify_attn -> tree_accept in one graph, 100 steps
# ---------------------------------------------------------------------------------------

B, D, K, N, H, DQK, DV, PMAX = 4, 6, 4, 32, 4, 72, 64, 48
T, S = N + 1, PMAX + N + 1
SM_SCALE = float(np.float32(1 / math.sqrt(DQK)))


def step_case(step: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict]:
    """One step's inputs as the generators synthesize them (kdtr/generators: drafter rows,
    a random prefix, q / kv poisoned past each request's rows, target_predict on the
    reference tree), the numpy reference's outputs (greedy_step = the three ops chained)
    and the goldens' contracts (verify_attn's tolerances from the error model)."""
    from kdtr.generators import gen_tree_build_refs as build_gen
    from kdtr.generators import gen_verify_attn_refs as attn_gen
    from kdtr.generators.rng import Rng
    from kdtr.generators.trees import Tree, synth_target_predict

    rng = Rng(23000 + step)
    lp, ids = build_gen.drafter_rows(rng, B, D, K)
    x = dict(top_log_probs=lp, top_token_ids=ids,
             root_token_ids=rng.integers(0, build_gen.VOCAB, B).astype(np.int64),
             budget=rng.integers(0, N + 1, B).astype(np.int32),
             depth_limit=rng.integers(0, D + 1, B).astype(np.int32))
    if step % 10 == 9:
        x["budget"][step % B] = N + 3  # BAD_BUDGET: a root-only tree
    tree = SPECS["tree_build"].reference(x, {"max_budget": N})
    tree_len = (tree["node_count"] + 1).astype(np.int32)
    prefix = rng.integers(0, PMAX + 1, B).astype(np.int32)
    q = rng.standard_normal((B, T, H, DQK)).astype(np.float32)
    kv = rng.standard_normal((B, S, DQK)).astype(np.float32)
    attn_gen.poison(q, kv, None, prefix, tree_len)
    target = np.stack([synth_target_predict(rng, Tree(int(tree["node_count"][r]), tree["parents"][r],
                                                      tree["node_depths"][r], tree["node_token_ids"][r],
                                                      tree["next_token"][r], tree["next_sibling"][r]),
                                            build_gen.VOCAB) for r in range(B)])
    x.update(q=q, kv_cache=kv, prefix_len=prefix, target_predict=target)
    scalars = {"sm_scale": np.float32(SM_SCALE), "d_v": np.int32(DV)}
    expected = SPECS["greedy_step"].reference(dict(x, **scalars), {"max_budget": N})
    contracts = SPECS["greedy_step"].default_contracts()
    attn_x = dict(q=q, kv_cache=kv, prefix_len=prefix, tree_len=tree_len, **scalars)
    contracts.update({f"verify_attn.{k}": c for k, c in attn_gen.tolerances(attn_x).items()})
    return x, expected, contracts


def engine_step(tlp, tti, rti, budget, depth_limit, q, kv, prefix_len, target):
    tb = torch.ops.kdtr.tree_build(tlp, tti, rti, budget, depth_limit, N)
    tree_len = tb[0] + 1  # node_count + 1, on the device
    out, lse = torch.ops.kdtr.verify_attn(q, kv, prefix_len, tree_len, tb[6], SM_SCALE, DV)
    acc = torch.ops.kdtr.tree_accept(tb[1], tb[4], tb[5], tb[0], target)
    return (*tb, out, lse, *acc)


def test_engine_loop_one_graph_100_steps(torch_ops):
    order = ["top_log_probs", "top_token_ids", "root_token_ids", "budget", "depth_limit", "q", "kv_cache",
             "prefix_len", "target_predict"]
    clear_record()
    x0, _, _ = step_case(0)
    static = {k: to_cuda(x0[k]) for k in order}
    graph, res = capture(engine_step, *[static[k] for k in order])
    names = SPECS["greedy_step"].output_names
    failures = []
    for step in range(100):
        x, expected, contracts = step_case(step)
        for k in order:
            static[k].copy_(torch.from_numpy(x[k]))
        graph.replay()
        got = {n: v.cpu().numpy() for n, v in zip(names, res)}
        for n in names:
            r = compare(n, expected[n], got[n], contracts[n])
            if not r.ok:
                failures.append(f"step {step}: {n}: {r}")
    assert not failures, "\n".join(failures[:10])
    kernels.check()  # the loop's lengths were all good: nothing recorded
