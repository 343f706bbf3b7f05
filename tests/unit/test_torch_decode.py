"""The DDTree decode of every committed ddtree_decode golden through the torch ops
(torch.ops.kdtr.tree_build, verify_attn, tree_accept) and torch for the model: each step's
drafts (the drafter on the host, through kdtr.detmath, as the op's contract computes them),
the tree, the target's q and latent KV rows (exact fixed-point products in float32), the
attention over the committed cache and the tree, the target's predictions (float64 logits,
argmax), the accept walk and the KV commit, all in torch tensors on one device; the outputs
must conform to the golden. On the CPU here; on CUDA with a GPU (the gpu-marked case)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="needs torch")

from kdtr import kernels  # noqa: E402
from kdtr.bf16 import widen  # noqa: E402
from kdtr.ops import ddtree_decode as op  # noqa: E402
from kdtr.ops.ddtree_model import draft  # noqa: E402
from kdtr.testing import assert_conforms, goldens  # noqa: E402

torch_ops = pytest.importorskip("kdtr.torch_ops", reason="needs torch")
GOLDENS = goldens("ddtree_decode")


@pytest.fixture(scope="module", autouse=True)
def lib():
    try:
        return kernels.load()
    except kernels.KernelLibraryError as exc:
        pytest.fail(str(exc), pytrace=False)


def bf16_tensor(a: np.ndarray, device: str) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a).view(np.int16).copy()).view(torch.bfloat16).to(device)


def decode(inputs: dict[str, np.ndarray], n_max: int, device: str) -> dict[str, np.ndarray]:
    """The op's outputs, computed with the torch ops (module docstring)."""
    model, drafter = op.models(inputs)
    d = model.dims
    f32 = {k: torch.from_numpy(widen(getattr(model, k))).float().to(device)
           for k in ("emb", "w_q", "w_kv", "w_o", "w_lm")}
    cache = bf16_tensor(inputs["kv_cache"], device)
    b, s_max, dqk = cache.shape
    n = torch.from_numpy(np.asarray(inputs["prefix_len"], np.int32).copy()).to(device)
    root = torch.from_numpy(np.asarray(inputs["root_token_ids"], np.int64).copy()).to(device)
    budget = torch.from_numpy(np.array(inputs["budget"], np.int32)).to(device)
    depth_limit = torch.from_numpy(np.array(inputs["depth_limit"], np.int32)).to(device)
    depth, top_k = int(inputs["draft_depth"]), int(inputs["draft_top_k"])
    t = n_max + 1
    steps = budget.shape[1]
    rows = torch.arange(s_max, device=device)
    cache = torch.where((rows[None, :] < n[:, None].long())[..., None], cache, torch.full_like(cache, float("nan")))
    out = {k: [] for k in ("node_count", "top_log_probs", "top_token_ids", "accepted_count", "accepted_path",
                           "step_tokens", "attn_out")}
    for k in range(steps):
        drafts = [draft(drafter, int(r), depth, top_k) for r in root.cpu().numpy()]  # the host's exact log-softmax
        lp = torch.from_numpy(np.stack([x[0] for x in drafts])).to(device)
        ids = torch.from_numpy(np.stack([x[1] for x in drafts])).to(device)
        (node_count, node_token_ids, _, _, next_token, next_sibling, visibility, status) = torch.ops.kdtr.tree_build(
            lp, ids, root, budget[:, k].contiguous(), depth_limit[:, k].contiguous(), n_max)
        assert int(status.abs().sum()) == 0
        tree_len = (node_count + 1).to(torch.int32)
        tok = torch.where(node_token_ids >= 0, node_token_ids, torch.zeros_like(node_token_ids))
        x = f32["emb"][tok]  # [B,T,E]
        q = (x @ f32["w_q"].reshape(d["E"], -1)).reshape(b, t, d["H"], dqk).to(torch.bfloat16)  # exact, then RNE
        c = (x @ f32["w_kv"]).to(torch.bfloat16)  # [B,T,Dqk]
        slot = torch.arange(t, device=device)
        live = slot[None, :] < tree_len[:, None].long()
        at = (n[:, None].long() + slot[None, :]).clamp(max=s_max - 1)
        for r in range(b):  # the tree's rows after the committed ones
            cache[r, at[r, live[r]]] = c[r, live[r]]
        attn, _ = torch.ops.kdtr.verify_attn(q, cache, n, tree_len, visibility, model.sm_scale, d["d_v"])
        y = x.double() + attn.reshape(b, t, -1).double() @ f32["w_o"].reshape(-1, d["E"]).double()
        predict = torch.argmax(y @ f32["w_lm"].double(), dim=-1)  # the first maximum: the lowest id of a tie
        predict = torch.where(live, predict, torch.zeros_like(predict))
        accepted_count, accepted_path, proposed, acc_status = torch.ops.kdtr.tree_accept(
            node_token_ids, next_token, next_sibling, node_count, predict)
        assert int(acc_status.abs().sum()) == 0
        for r in range(b):  # the KV commit of the accepted path; the rows after it are free again
            a = int(accepted_count[r])
            path = accepted_path[r, : a + 1].long()
            base = int(n[r])
            cache[r, base : base + a + 1] = c[r, path]
            cache[r, base + a + 1 :] = float("nan")
        keep = slot[None, :] <= accepted_count[:, None].long()
        out["step_tokens"].append(torch.where(keep, proposed, torch.full_like(proposed, -1)))
        for name, v in (("node_count", node_count), ("top_log_probs", lp), ("top_token_ids", ids),
                        ("accepted_count", accepted_count), ("accepted_path", accepted_path), ("attn_out", attn)):
            out[name].append(v)
        n = (n + accepted_count + 1).to(torch.int32)
        root = proposed.gather(1, accepted_count.long()[:, None])[:, 0]
    res = {name: torch.stack(v, 1).cpu().numpy() for name, v in out.items()}
    committed = rows[None, :] < n[:, None].long()
    final = torch.where(committed[..., None], cache, torch.zeros_like(cache)).cpu()
    res["final_kv_cache"] = final.view(torch.int16).numpy().view(inputs["kv_cache"].dtype)
    res["cache_len"] = n.cpu().numpy()
    return res


@pytest.mark.parametrize("golden", GOLDENS, ids=lambda g: g.config)
def test_decode_through_the_torch_ops_on_the_cpu(golden):
    assert_conforms(golden, decode(golden.inputs, int(golden.metadata["max_budget"]), "cpu"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("golden", GOLDENS, ids=lambda g: g.config)
def test_decode_through_the_torch_ops_on_cuda(golden):
    assert_conforms(golden, decode(golden.inputs, int(golden.metadata["max_budget"]), "cuda"))


def test_a_wrong_commit_fails_the_golden():
    """The same loop with the KV commit of slots 0..a (not the path's) does not conform."""
    g = next(x for x in GOLDENS if x.config == "decoy")
    outputs = op.outputs(*op.run(g.inputs, int(g.metadata["max_budget"]), bug="kv_commit"),
                         int(g.metadata["max_budget"]))
    with pytest.raises(AssertionError):
        assert_conforms(g, outputs)
