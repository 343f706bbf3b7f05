"""torch.ops.kdtr.* (kdtr.torch_ops) on the CPU: every committed golden of every op through
the functional ops conforms, the .out overloads write the same outputs into preallocated
tensors, torch.library.opcheck passes (schema, autograd registration, fake tensors, AOT
dispatch with dynamic shapes), the fake impls give the outputs' shapes and dtypes,
torch.compile(fullgraph=True) traces each op, and bad arguments are ValueErrors naming the
argument, eagerly and while tracing. The library is build/lib/libkdtr_kernels.so (`make lib`)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="needs torch")

from kdtr import kernels  # noqa: E402
from kdtr.testing import assert_conforms, goldens  # noqa: E402

torch_ops = pytest.importorskip("kdtr.torch_ops", reason="needs torch")

OPS = ("tree_build", "verify_attn", "tree_accept", "greedy_step")
ALL_GOLDENS = [g for op in OPS for g in goldens(op)]
CONFIG = {"tree_build": "default", "verify_attn": "small", "tree_accept": "default", "greedy_step": "default"}
FIRST = {op: goldens(op, config=CONFIG[op])[0] for op in OPS}  # small, f32


@pytest.fixture(scope="module", autouse=True)
def lib():
    try:
        return kernels.load()
    except kernels.KernelLibraryError as exc:
        pytest.fail(str(exc), pytrace=False)


def to_torch(a: np.ndarray) -> torch.Tensor:
    a = np.ascontiguousarray(a)
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


def op_args(g, **change) -> tuple:
    """The positional arguments of torch.ops.kdtr.<g.op> for g's inputs (scalars as Python
    numbers; max_budget from the metadata); ``change`` replaces inputs by name."""
    x = {k: to_torch(v) for k, v in g.inputs.items() if v.ndim}
    x["sm_scale"] = float(g.inputs["sm_scale"]) if "sm_scale" in g.inputs else None
    x["d_v"] = int(g.inputs["d_v"]) if "d_v" in g.inputs else None
    x["max_budget"] = g.metadata.get("max_budget")
    x.update(change)
    names = {"tree_build": ["top_log_probs", "top_token_ids", "root_token_ids", "budget", "depth_limit", "max_budget"],
             "verify_attn": ["q", "kv_cache", "prefix_len", "tree_len", "visibility", "sm_scale", "d_v"],
             "tree_accept": ["node_token_ids", "next_token", "next_sibling", "node_count", "target_predict"],
             "greedy_step": ["top_log_probs", "top_token_ids", "root_token_ids", "budget", "depth_limit", "q",
                             "kv_cache", "prefix_len", "sm_scale", "d_v", "target_predict", "max_budget"]}[g.op]
    return tuple(x[n] for n in names)


def op(name: str):
    return getattr(torch.ops.kdtr, name)


# ---------------------------------------------------------------------------------------
# The goldens
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("golden", ALL_GOLDENS, ids=str)
def test_functional_op_conforms(golden):
    res = op(golden.op)(*op_args(golden))
    assert isinstance(res, tuple) and all(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in res)
    out = torch_ops.as_outputs(golden.op, res)
    assert list(out) == list(golden.expected)
    assert_conforms(golden, out)


@pytest.mark.parametrize("name", OPS)
def test_out_overload_writes_the_given_tensors(name):
    g = FIRST[name]
    args = op_args(g)
    ref = torch_ops.as_outputs(name, op(name)(*args))
    out = {k: torch.full_like(v, 7) for k, v in ref.items()}  # stale values: every element must be written
    ptrs = {k: v.data_ptr() for k, v in out.items()}
    assert op(name).out(*args, **torch_ops.out_kwargs(name, out)) is None
    assert {k: v.data_ptr() for k, v in out.items()} == ptrs
    assert_conforms(g, out)


def test_a_wrong_output_fails_the_golden():
    g = FIRST["tree_accept"]
    out = torch_ops.as_outputs("tree_accept", op("tree_accept")(*op_args(g)))
    out["proposed"] = out["proposed"].clone()
    out["proposed"][0, 0] += 1
    with pytest.raises(AssertionError, match="proposed"):
        assert_conforms(g, out)


def test_kernel_argument_reaches_the_library():
    g = FIRST["tree_build"]
    for k in ("heap", "select"):
        res = op("tree_build")(*op_args(g), kernel=k)
        assert_conforms(g, torch_ops.as_outputs("tree_build", res))
    with pytest.raises(ValueError, match=r"tree_build: kernel must be one of auto, heap, select, not 'fast'"):
        op("tree_build")(*op_args(g), kernel="fast")
    with pytest.raises(ValueError, match=r"verify_attn: kernel 'mma' applies to device='cuda' only"):
        op("verify_attn")(*op_args(FIRST["verify_attn"]), kernel="mma")


def test_greedy_step_max_budget_defaults_to_q():
    g = FIRST["greedy_step"]
    args = op_args(g)[:-1]
    assert_conforms(g, torch_ops.as_outputs("greedy_step", op("greedy_step")(*args)))


# ---------------------------------------------------------------------------------------
# torch.library.opcheck, fake impls, torch.compile
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", OPS)
def test_opcheck_functional(name):
    torch.library.opcheck(op(name).default, op_args(FIRST[name]))


@pytest.mark.parametrize("name", OPS)
def test_opcheck_out(name):
    args = op_args(FIRST[name])
    kw = torch_ops.out_kwargs(name, torch_ops.as_outputs(name, op(name)(*args)))
    torch.library.opcheck(op(name).out, args, {k: torch.empty_like(v) for k, v in kw.items()})


def test_opcheck_autograd_registration_with_grad():
    """q requiring grad: the op's outputs do not require grad (no autograd kernel hides in
    a backend kernel), so the registration check has something to check."""
    for name, i in (("verify_attn", 0), ("greedy_step", 5)):
        args = list(op_args(FIRST[name]))
        args[i] = args[i].clone().requires_grad_(True)
        r = torch.library.opcheck(op(name).default, tuple(args),
                                  test_utils=("test_schema", "test_autograd_registration"))
        assert r == {"test_schema": "SUCCESS", "test_autograd_registration": "SUCCESS"}
        assert not any(t.requires_grad for t in op(name)(*args) if not t.is_floating_point())


@pytest.mark.parametrize("name", OPS)
def test_fake_impl_shapes(name):
    from torch._subclasses.fake_tensor import FakeTensorMode

    g = FIRST[name]
    args = op_args(g)
    with FakeTensorMode() as mode:
        fargs = tuple(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args)
        res = op(name)(*fargs)
    got = {n: (tuple(t.shape), t.dtype) for n, t in zip(torch_ops.OUTPUTS[name], res)}
    want = {n: (tuple(e.shape), to_torch(e).dtype) for n, e in g.expected.items()}
    assert got == want


@pytest.mark.parametrize("name", OPS)
def test_meta_tensors_give_the_output_shapes(name):
    g = FIRST[name]
    args = tuple(a.to("meta") if isinstance(a, torch.Tensor) else a for a in op_args(g))
    res = op(name)(*args)
    assert all(t.device.type == "meta" for t in res)
    assert [tuple(t.shape) for t in res] == [tuple(e.shape) for e in g.expected.values()]


def test_fake_impl_checks_the_arguments():
    from torch._subclasses.fake_tensor import FakeTensorMode

    g = FIRST["verify_attn"]
    args = list(op_args(g))
    args[2] = args[2].long()  # prefix_len i64
    with FakeTensorMode() as mode:
        fargs = tuple(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args)
        with pytest.raises(ValueError, match=r"verify_attn: prefix_len: dtype int64, expected i32"):
            op("verify_attn")(*fargs)


@pytest.mark.parametrize("name", OPS)
def test_compile_fullgraph(name):
    torch._dynamo.reset()
    g = FIRST[name]
    args = op_args(g)
    fn = op(name)
    compiled = torch.compile(lambda *a: fn(*a), fullgraph=True, backend="aot_eager")
    assert_conforms(g, torch_ops.as_outputs(name, compiled(*args)))


def test_compile_fullgraph_out_and_chain():
    """tree_build -> verify_attn (tree_len = node_count + 1, visibility from tree_build) ->
    tree_accept traced as one graph, with dynamic shapes; the .out overload in a graph too.
    The outputs equal greedy_step's on the same golden."""
    torch._dynamo.reset()
    g = FIRST["greedy_step"]
    tlp, tti, rti, bud, dl, q, kv, pl, scale, d_v, tp, n = op_args(g)

    def step(tlp, tti, rti, bud, dl, q, kv, pl, tp):
        tb = torch.ops.kdtr.tree_build(tlp, tti, rti, bud, dl, n)
        tree_len = tb[0] + 1
        out, lse = torch.ops.kdtr.verify_attn(q, kv, pl, tree_len, tb[6], scale, d_v)
        acc = torch.ops.kdtr.tree_accept(tb[1], tb[4], tb[5], tb[0], tp)
        return (*tb, out, lse, *acc)

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager", dynamic=True)
    res = compiled(tlp, tti, rti, bud, dl, q, kv, pl, tp)
    assert_conforms(g, torch_ops.as_outputs("greedy_step", res))

    a = op_args(FIRST["tree_accept"])
    out = {k: torch.empty_like(v) for k, v in torch_ops.as_outputs("tree_accept", op("tree_accept")(*a)).items()}

    def accept_into(*x):
        torch.ops.kdtr.tree_accept.out(*x, **torch_ops.out_kwargs("tree_accept", out))

    torch.compile(accept_into, fullgraph=True, backend="aot_eager")(*a)
    assert_conforms(FIRST["tree_accept"], out)


# ---------------------------------------------------------------------------------------
# Bad arguments: ValueError naming the argument
# ---------------------------------------------------------------------------------------

def test_bad_tensors_name_the_argument():
    g = FIRST["tree_accept"]
    args = list(op_args(g))
    with pytest.raises(ValueError, match=r"tree_accept: node_count: dtype int64, expected i32"):
        op("tree_accept")(*args[:3], args[3].long(), args[4])
    with pytest.raises(ValueError, match=r"tree_accept: next_sibling: shape .* expected \[B,T\]"):
        op("tree_accept")(args[0], args[1], args[2][:, :-1].contiguous(), *args[3:])
    with pytest.raises(ValueError, match=r"tree_accept: target_predict: not C-contiguous.*\.contiguous\(\)"):
        op("tree_accept")(*args[:4], args[4].repeat(1, 2)[:, ::2])


def test_bad_scalars_and_lengths_name_the_argument():
    v = FIRST["verify_attn"]
    with pytest.raises(ValueError, match=r"verify_attn: d_v: 0 is outside \[1, Dqk"):
        op("verify_attn")(*op_args(v, d_v=0))
    pl = to_torch(v.inputs["prefix_len"])
    pl[0] = v.inputs["kv_cache"].shape[1]
    with pytest.raises(ValueError, match=r"verify_attn: prefix_len: request 0: .* exceeds the cache rows"):
        op("verify_attn")(*op_args(v, prefix_len=pl))
    with pytest.raises(ValueError, match=r"tree_build: max_budget -1 is outside"):
        op("tree_build")(*op_args(FIRST["tree_build"], max_budget=-1))
    s = FIRST["greedy_step"]
    with pytest.raises(ValueError, match=r"greedy_step: q: shape .* T is"):
        op("greedy_step")(*op_args(s, max_budget=s.metadata["max_budget"] + 1))


def test_bad_out_tensors_name_the_argument():
    g = FIRST["tree_accept"]
    args = op_args(g)
    good = torch_ops.out_kwargs("tree_accept", torch_ops.as_outputs("tree_accept", op("tree_accept")(*args)))
    for change, msg in ((dict(status=good["status"].long()), r"tree_accept: status: dtype int64, expected i32"),
                        (dict(proposed=good["proposed"][:, :-1]), r"tree_accept: proposed: shape .* expected"),
                        (dict(accepted_path=good["accepted_path"].t().contiguous().t()),
                         r"tree_accept: accepted_path: not C-contiguous")):
        if "accepted_path" in change and change["accepted_path"].is_contiguous():
            continue  # a [B,1] tensor is contiguous either way
        with pytest.raises(ValueError, match=msg):
            op("tree_accept").out(*args, **dict(good, **change))


# ---------------------------------------------------------------------------------------
# The per-signature plan cache: a call after a planned one is checked again
# ---------------------------------------------------------------------------------------

def test_a_planned_signature_does_not_serve_a_different_call(monkeypatch):
    """After a good call has planned its signature (shapes, dtypes), a call that differs in
    shape, dtype, strides (contiguity), device-side data (the lengths) or the output limit
    is checked, never served by the stale plan: each is the ValueError naming the argument,
    and the good call still conforms afterwards."""
    v = FIRST["verify_attn"]
    args = list(op_args(v))
    f = op("verify_attn")
    assert_conforms(v, torch_ops.as_outputs("verify_attn", f(*args)))
    assert_conforms(v, torch_ops.as_outputs("verify_attn", f(*args)))  # the planned signature again
    q = args[0]
    with pytest.raises(ValueError, match=r"verify_attn: q: not C-contiguous"):  # same shape and dtype, strided
        f(q.transpose(1, 2).contiguous().transpose(1, 2), *args[1:])
    with pytest.raises(ValueError, match=r"verify_attn: prefix_len: dtype int64, expected i32"):
        f(*args[:2], args[2].long(), *args[3:])
    with pytest.raises(ValueError, match=r"verify_attn: kv_cache: dtype bfloat16, expected f32"):
        f(args[0], args[1].bfloat16(), *args[2:])
    with pytest.raises(ValueError, match=r"verify_attn: visibility: shape .* expected \[B,T,T\]"):
        f(*args[:4], args[4][:, :-1].contiguous(), *args[5:])
    with pytest.raises(ValueError, match=r"verify_attn: d_v: .* is outside"):
        f(*args[:6], v.inputs["q"].shape[-1] + 1)
    pl = args[2].clone()
    pl[0] = -1  # data: checked on every CPU call
    with pytest.raises(ValueError, match=r"verify_attn: prefix_len: request 0: prefix_len -1 is negative"):
        f(args[0], args[1], pl, *args[3:])
    monkeypatch.setenv("KDTR_MAX_OUTPUT_BYTES", "16")
    with pytest.raises(ValueError, match=r"verify_attn: q, d_v: outputs would need"):
        f(*args)
    monkeypatch.delenv("KDTR_MAX_OUTPUT_BYTES")
    assert_conforms(v, torch_ops.as_outputs("verify_attn", f(*args)))


def test_a_planned_out_signature_checks_each_output():
    """The out overload after a planned call: an output of another dtype, shape or
    contiguity is the ValueError naming it; a good one is written."""
    g = FIRST["tree_build"]
    args = op_args(g)
    good = torch_ops.out_kwargs("tree_build", torch_ops.as_outputs("tree_build", op("tree_build")(*args)))
    bufs = {k: torch.full_like(t, 0x5A) for k, t in good.items()}
    op("tree_build").out(*args, **bufs)
    assert_conforms(g, {n: bufs[n] for n in torch_ops.OUTPUTS["tree_build"]})
    vis = bufs["visibility"]
    for change, msg in ((dict(node_count=bufs["node_count"].long()), r"tree_build: node_count: dtype int64"),
                        (dict(parents=bufs["parents"][:, :-1]), r"tree_build: parents: shape"),
                        (dict(visibility=vis.transpose(1, 2).contiguous().transpose(1, 2)),
                         r"tree_build: visibility: not C-contiguous")):
        with pytest.raises(ValueError, match=msg):
            op("tree_build").out(*args, **dict(bufs, **change))


def test_a_planned_signature_with_another_max_budget_or_kernel_is_planned_again():
    """max_budget and the kernel are part of the signature: a call with another max_budget
    gets outputs of its own T (or the ValueError of a bad one), the kernel another plan."""
    g = FIRST["tree_build"]
    n = g.metadata["max_budget"]
    args = op_args(g)
    assert op("tree_build")(*args)[1].shape[1] == n + 1
    assert op("tree_build")(*args[:5], n + 3)[1].shape[1] == n + 4
    with pytest.raises(ValueError, match=r"tree_build: max_budget -1 is outside"):
        op("tree_build")(*args[:5], -1)
    assert_conforms(g, torch_ops.as_outputs("tree_build", op("tree_build")(*args, "select")))
    with pytest.raises(ValueError, match=r"tree_build: kernel must be one of"):
        op("tree_build")(*args, "bogus")
    v = FIRST["verify_attn"]
    op("verify_attn")(*op_args(v))
    with pytest.raises(ValueError, match=r"verify_attn: kernel 'mma' applies to device='cuda' only"):
        op("verify_attn")(*op_args(v), "mma")


def test_the_plan_cache_key_includes_the_devices_of_the_tensors():
    """A plan of CPU tensors does not serve numpy arrays (kdtr.kernels' own plans), and a
    torch CPU call after a numpy call of the same signature is planned and checked."""
    g = FIRST["tree_accept"]
    res = kernels.tree_accept(**{k: np.array(v) for k, v in g.inputs.items()})
    assert_conforms(g, res)
    assert_conforms(g, torch_ops.as_outputs("tree_accept", op("tree_accept")(*op_args(g))))
    kinds = {k[1] for k in kernels._plans if k[0] == "tree_accept"}
    assert {kernels._NUMPY, kernels._TORCH_CPU} <= kinds


# ---------------------------------------------------------------------------------------
# kdtr.kernels: out=, poison=, scalars, check()
# ---------------------------------------------------------------------------------------

def np_inputs(g):
    return {k: np.array(v) for k, v in g.inputs.items()}


def test_kernels_out_is_checked_and_written():
    g = FIRST["tree_accept"]
    x = np_inputs(g)
    out = kernels.empty_outputs("tree_accept", x)
    assert {k: (v.dtype, v.shape) for k, v in out.items()} == {k: (e.dtype, e.shape) for k, e in g.expected.items()}
    res = kernels.tree_accept(**x, out=out)
    assert all(res[k] is out[k] for k in out)
    assert_conforms(g, res)
    bad = dict(out, status=out["status"].astype(np.int64))
    with pytest.raises(ValueError, match=r"tree_accept: out\['status'\]: dtype int64, expected i32"):
        kernels.tree_accept(**x, out=bad)
    bad = dict(out, proposed=out["proposed"][:, :-1])
    with pytest.raises(ValueError, match=r"tree_accept: out\['proposed'\]: shape .* expected"):
        kernels.tree_accept(**x, out=bad)
    bad = {k: v for k, v in out.items() if k != "accepted_count"}
    with pytest.raises(ValueError, match=r"tree_accept: out: no 'accepted_count'"):
        kernels.tree_accept(**x, out=bad)
    with pytest.raises(ValueError, match=r"tree_accept: out: 'extra' is not an output of tree_accept"):
        kernels.tree_accept(**x, out=dict(out, extra=out["status"]))
    with pytest.raises(ValueError, match=r"tree_accept: out\['accepted_path'\]: device='cpu' takes numpy arrays"):
        kernels.tree_accept(**x, out=dict(out, accepted_path=torch.from_numpy(out["accepted_path"])))
    ro = out["status"].copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match=r"tree_accept: out\['status'\]: read-only"):
        kernels.tree_accept(**x, out=dict(out, status=ro))


def test_kernels_greedy_step_out_with_workspace():
    g = FIRST["greedy_step"]
    x = np_inputs(g)
    out = kernels.empty_outputs("greedy_step", x)
    assert out["tree_len"].shape == (g.inputs["q"].shape[0],)
    res = kernels.greedy_step(**x, out=out)
    assert_conforms(g, res)
    assert np.array_equal(out["tree_len"], res["tree_build.node_count"] + 1)


def test_poison_default_and_flags(monkeypatch):
    """Outputs the module allocates are poisoned (0x5a) before the call; out= ones are
    not unless poison=True; poison=False never. Seen through a library entry that writes
    nothing."""
    g = FIRST["tree_accept"]
    x = np_inputs(g)
    L = kernels.load()

    class Silent:
        _kdtr_device_checks = L._kdtr_device_checks
        _kdtr_entries = dict(L._kdtr_entries)
        _kdtr_entries["tree_accept", "cpu"] = staticmethod(lambda p: kernels.OK)

        def __getattr__(self, name):
            return getattr(L, name)

    monkeypatch.setattr(kernels, "_library", lambda path: Silent())
    res = kernels.tree_accept(**x)
    assert all((v.view(np.uint8) == 0x5A).all() for v in res.values())
    out = {k: np.zeros_like(v) for k, v in res.items()}
    kernels.tree_accept(**x, out=out)
    assert all((v == 0).all() for v in out.values())
    kernels.tree_accept(**x, out=out, poison=True)
    assert all((v.view(np.uint8) == 0x5A).all() for v in out.values())
    res = kernels.tree_accept(**x, poison=False)
    assert set(res) == set(g.expected)


def test_scalars_on_a_device_are_refused():
    """A tensor scalar not on the CPU (here on the meta device; on a GPU a CUDA one) would
    need a device read: a ValueError naming the argument; CPU tensors and numpy scalars are
    taken."""
    v = FIRST["verify_attn"]
    x = np_inputs(v)
    with pytest.raises(ValueError, match=r"verify_attn: d_v: a tensor on meta; reading it would synchronize"):
        kernels.verify_attn(**dict(x, d_v=torch.empty((), dtype=torch.int32, device="meta")))
    with pytest.raises(ValueError, match=r"verify_attn: sm_scale: a tensor on meta"):
        kernels.verify_attn(**dict(x, sm_scale=torch.empty((), device="meta")))
    with pytest.raises(ValueError, match=r"tree_build: max_budget: a tensor on meta"):
        kernels.tree_build(**np_inputs(FIRST["tree_build"]), max_budget=torch.empty((), dtype=torch.int64,
                                                                                      device="meta"))
    res = kernels.verify_attn(**dict(x, d_v=torch.tensor(int(x["d_v"])), sm_scale=torch.tensor(float(x["sm_scale"]))))
    assert_conforms(v, res)


class RecordLib:
    """A library stub whose device error record holds one failure."""

    _kdtr_device_checks = True

    def __init__(self, message: bytes, count: int = 1):
        self.message, self.count, self.calls = message, count, []

    def kdtr_device_errors(self, device, clear, buf, size):
        import ctypes

        self.calls.append((device, clear))
        n, self.count = self.count, 0 if clear else self.count
        msg = self.message if n > 0 else b""
        ctypes.memmove(buf, msg + b"\0", min(len(msg) + 1, size))
        return n


def test_check_names_op_request_and_field(monkeypatch):
    stub = RecordLib(b"verify_attn: request 3: prefix_len 100 + tree_len 9 exceeds the cache rows S = 64", 2)
    monkeypatch.setattr(kernels, "_library", lambda path: stub)
    with pytest.raises(kernels.KernelError, match=r"verify_attn: invalid argument .*cuda:0: 2 request\(s\) refused"
                                                  r".*request 3: prefix_len 100") as exc:
        kernels.check(0)
    e = exc.value
    assert (e.op, e.request, e.field, e.device, e.count) == ("verify_attn", 3, "prefix_len", 0, 2)
    assert stub.calls == [(0, 1)]
    kernels.check(0)  # cleared
    kernels.check("cuda:0")
    assert [d for d, _ in stub.calls] == [0, 0, 0]
    with pytest.raises(ValueError, match=r"check: device must be"):
        kernels.check("cpu")


def test_check_without_a_device_record_returns():
    """A library without kdtr_device_errors records nothing (its lengths are checked on the
    host): check() has nothing to read."""
    L = kernels.load()
    assert kernels.has_device_checks() == L._kdtr_device_checks
    if not L._kdtr_device_checks:
        assert kernels.check() is None


def test_the_bindings_benchmark_builds_valid_calls():
    """bench/bench_bindings.py's cases (made here on the CPU) are calls the ops take: every
    tensor contiguous, the kdtr.kernels arguments and the torch.ops arguments checked by
    output_specs and the fake impls (nothing is run but the small tree_build the cases use)."""
    import importlib.util

    from torch._subclasses.fake_tensor import FakeTensorMode

    from conftest import REPO_ROOT

    spec = importlib.util.spec_from_file_location("bench_bindings", REPO_ROOT / "bench" / "bench_bindings.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    made = bench.cases(torch, "cpu")
    assert [c[0] for c in made] == ["tree_build", "verify_attn", "verify_attn K2", "tree_accept", "greedy_step"]
    for label, name, _, kin, targs in made:
        specs = kernels.output_specs(name, kin, max_budget=kin.get("max_budget"))
        with FakeTensorMode(allow_non_fake_inputs=False) as mode:
            fargs = tuple(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in targs)
            res = op(name)(*fargs)
        assert [tuple(t.shape) for t in res] == [s for _, s in specs.values()], label
