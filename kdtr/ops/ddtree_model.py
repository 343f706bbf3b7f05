"""A tiny deterministic MLA target model, a bigram drafter, and the two reference decode loops
(plain greedy and DDTree) whose emitted tokens must agree: the building blocks of the
``ddtree_decode`` op (design: docs/ops/ddtree_decode.md).

Target model (one MLA-absorb attention layer, weights bf16, token ids in [0, V)):

    x      = emb[t]                                   [E]
    q      = bf16(x @ w_q)                            [H, Dqk]   the absorbed query
    c      = bf16(x @ w_kv)                           [Dqk]      the latent KV row of t
    o      = verify_attn(q over the cache + tree)     [H, d_v]   values: the first d_v dims of c
    y      = x + o.reshape(H d_v) @ w_o.reshape(H d_v, E)
    logits = y @ w_lm                                 [V];  prediction = argmax (lowest id of a tie)

With one layer c depends on the token alone, so a prompt's prefill is ``c(p_i)`` row by row,
exactly what a decode step appends. Every weight is a multiple of 2^-WEIGHT_FRAC_BITS in
[-WEIGHT_MAX, WEIGHT_MAX] (bf16-exact), so ``x @ w_q`` and ``x @ w_kv`` are sums of multiples
of 2^-12 small enough to be exact in float32 and float64 in any order: q and c, hence the
whole cache, are the same bits on every host and device. o comes from the float64 reference
of verify_attn (:func:`kdtr.ops.verify_attn.verify_attn_f64`); y and the logits from
:func:`kdtr.detmath.matmul_exact`: host-independent.

Drafter (a bigram model, cheaper than the target: no attention): from the root token
t_0, for depth d = 1..D, ``s = demb[t_{d-1}] @ dw_lm`` (exact, as above), log-probs
``lp = f32(z - log(fixed_sum(exp(z))))`` with ``z = s - max(s)`` (kdtr.detmath: the same
float64 bits wherever it runs), the top-K by (lp descending, id ascending), and t_d the
top-1. These are tree_build's ``top_log_probs`` / ``top_token_ids`` for depth d.

Decode state per request: the latent KV cache [S, Dqk] whose first n rows are committed, and
the root token (the last emitted token, whose KV is not in the cache yet).

- Greedy step: c(root) goes to row n, attention over rows 0..n (the root sees itself),
  prediction p; n += 1; emit p; root = p.
- DDTree step (Ringel & Romano, "Accelerating Speculative Decoding with Block Diffusion
  Draft Trees"): the drafter's top-K per depth -> tree_build (budget, depth_limit) -> the
  tree's slot tokens (slot 0 = root) get q and c, c to rows n..n+tree_len-1 -> verify_attn
  with prefix_len n, tree_len = node_count + 1 and the tree's visibility -> predictions per
  slot = target_predict -> tree_accept -> KV commit: row n + i = c of path slot i for
  i = 0..a (a = accepted_count; the rows after it are free again) -> n += a + 1; emit the a
  accepted tokens and the bonus token; root = the bonus token.

Mathematically both loops compute the same attention for every emitted token (an accepted
node sees the prefix and its ancestors, as in causal greedy decoding), so they must emit the
same tokens; numerically the two attention sums differ in their last bits. The top-1 logit
margin of every prediction that decides a token (greedy's, and along each accepted path plus
the bonus) is recorded; :func:`logit_error_bound` bounds how far a correct bf16 kernel can
move a logit, and a configuration must keep every margin above 20 times that bound (each of
two logits may move by it, times 10).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..bf16 import round_to, to_float32, widen
from ..detmath import exp, fixed_sum, log, matmul_exact
from .tree_accept import AcceptResult, tree_accept
from .tree_build import TreeBuildResult, tree_build
from .verify_attn import verify_attn_f64

WEIGHT_FRAC_BITS = 6  # every weight a multiple of 2^-6 ...
WEIGHT_MAX = 1.0  # ... in [-1, 1]
MARGIN_FACTOR = 20.0  # required: every deciding margin >= MARGIN_FACTOR * logit_error_bound
OUT_REL_ERROR = 2.0**-8  # |out error| a bf16 verify_attn golden allows a kernel, relative to max |value| (its out atol)
BUGS = ("tree_mask", "accept_walk", "kv_commit")


@dataclass(frozen=True)
class TinyMLA:
    """The target model's weights (bf16 arrays): emb [V,E], w_q [E,H,Dqk], w_kv [E,Dqk],
    w_o [H,d_v,E], w_lm [E,V]; sm_scale the softmax scale (rounded to f32)."""

    emb: np.ndarray
    w_q: np.ndarray
    w_kv: np.ndarray
    w_o: np.ndarray
    w_lm: np.ndarray
    sm_scale: float

    @property
    def dims(self) -> dict[str, int]:
        v, e = self.emb.shape
        _, h, dqk = self.w_q.shape
        return {"V": v, "E": e, "H": h, "Dqk": dqk, "d_v": self.w_o.shape[1]}

    def check(self) -> None:
        """Raises ValueError (naming the weight) on a shape, dtype or value outside the model's rules."""
        d = self.dims
        want = {"emb": (d["V"], d["E"]), "w_q": (d["E"], d["H"], d["Dqk"]), "w_kv": (d["E"], d["Dqk"]),
                "w_o": (d["H"], d["d_v"], d["E"]), "w_lm": (d["E"], d["V"])}
        for name, shape in want.items():
            check_weight(f"target_{name}", getattr(self, name), shape)
        if not 1 <= d["d_v"] <= d["Dqk"]:
            raise ValueError(f"model.w_o: d_v {d['d_v']} outside [1, Dqk = {d['Dqk']}]")


@dataclass(frozen=True)
class BigramDrafter:
    """The drafter's weights (bf16): emb [V,E], w_lm [E,V]."""

    emb: np.ndarray
    w_lm: np.ndarray

    def check(self, vocab: int) -> None:
        """Raises ValueError (naming the weight) on a shape, dtype or value outside the rules."""
        e = self.emb.shape[1] if self.emb.ndim == 2 else -1
        check_weight("draft_emb", self.emb, (vocab, e))
        check_weight("draft_w_lm", self.w_lm, (e, vocab))


def check_weight(name: str, w: np.ndarray, shape: tuple[int, ...]) -> None:
    """A weight must be bf16 of ``shape``, every value a multiple of 2^-WEIGHT_FRAC_BITS in
    [-WEIGHT_MAX, WEIGHT_MAX].

    Raises:
        ValueError: naming ``name`` and the defect.
    """
    if w.dtype.name != "bfloat16":
        raise ValueError(f"{name}: dtype {w.dtype}, must be bf16")
    if w.shape != shape:
        raise ValueError(f"{name}: shape {list(w.shape)}, must be {list(shape)}")
    f = widen(w)
    if not np.isfinite(f).all() or np.abs(f).max(initial=0.0) > WEIGHT_MAX:
        raise ValueError(f"{name}: values must be finite and within [-{WEIGHT_MAX}, {WEIGHT_MAX}]")
    if (np.rint(f * 2.0**WEIGHT_FRAC_BITS) != f * 2.0**WEIGHT_FRAC_BITS).any():
        raise ValueError(f"{name}: values must be multiples of 2^-{WEIGHT_FRAC_BITS}")


def fixed_point_product(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x @ w (float64) for fixed-point operands (multiples of 2^-6 in [-1, 1], contraction
    below 2^20): every partial sum is a multiple of 2^-12 below 2^32, exact in float64 in any
    order, so the BLAS's order cannot reach the bits."""
    return np.asarray(x, np.float64) @ np.asarray(w, np.float64)


def project(model: TinyMLA, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """q bf16 [..., H, Dqk] and c bf16 [..., Dqk] of token ids ``tokens`` (any shape)."""
    d = model.dims
    x = widen(model.emb)[np.asarray(tokens)]
    q = fixed_point_product(x, widen(model.w_q).reshape(d["E"], -1)).reshape(*x.shape[:-1], d["H"], d["Dqk"])
    c = fixed_point_product(x, widen(model.w_kv))
    return round_to(q, model.emb.dtype), round_to(c, model.emb.dtype)


def logits_of(model: TinyMLA, tokens: np.ndarray, out: np.ndarray) -> np.ndarray:
    """float64 logits [n, V] of ``tokens`` [n] given their attention outputs ``out`` [n, H, d_v] (float64)."""
    d = model.dims
    x = widen(model.emb)[np.asarray(tokens)]
    y = x + matmul_exact(np.asarray(out, np.float64).reshape(len(x), -1), widen(model.w_o).reshape(-1, d["E"]))
    return matmul_exact(y, widen(model.w_lm))


def margins(logits: np.ndarray) -> np.ndarray:
    """top-1 minus top-2 logit per row (float64; 0 for a tie at the top)."""
    top2 = np.sort(logits, axis=-1)[..., -2:]
    return top2[..., 1] - top2[..., 0]


def logit_error_bound(model: TinyMLA) -> float:
    """How far a correct bf16 kernel can move one logit: OUT_REL_ERROR * max |value| per
    element of out (the values: the first d_v dims of c(t), over every token t of the
    vocabulary, which is every latent KV row the decode can hold), through |w_o @ w_lm| (the
    largest column sum of its absolute values), plus 1e-5 for the float32 projections."""
    d = model.dims
    vmax = float(np.abs(widen(project(model, np.arange(d["V"]))[1])[:, : d["d_v"]]).max())
    m = fixed_point_product(widen(model.w_o).reshape(-1, d["E"]), widen(model.w_lm))  # exact
    return OUT_REL_ERROR * vmax * float(np.abs(m).sum(axis=0).max()) + 1e-5


def draft(drafter: BigramDrafter, root: int, depth: int, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """The drafter's (top_log_probs f32 [D,K], top_token_ids i64 [D,K]) from ``root`` (module docstring)."""
    emb, w_lm = widen(drafter.emb), widen(drafter.w_lm)
    vocab = w_lm.shape[1]
    if not 1 <= top_k <= vocab:
        raise ValueError(f"draft_top_k {top_k} outside [1, V = {vocab}]")
    lps = np.zeros((depth, top_k), np.float32)
    ids = np.zeros((depth, top_k), np.int64)
    t = int(root)
    for dd in range(depth):
        s = fixed_point_product(emb[t], w_lm)
        z = s - s.max()  # exact
        lp = to_float32(z - log(fixed_sum(exp(z))))
        order = np.lexsort((np.arange(vocab), -lp))[:top_k]
        lps[dd], ids[dd] = lp[order], order
        t = int(order[0])
    return lps, ids


@dataclass
class DecodeState:
    """Per request: the latent KV cache [B,S,Dqk] (bf16; rows >= n NaN), the committed
    length n [B] and the root token [B]."""

    cache: np.ndarray
    n: np.ndarray
    root: np.ndarray
    emitted: list[list[int]] = field(default_factory=list)
    margins: list[list[float]] = field(default_factory=list)

    @classmethod
    def from_prompts(cls, model: TinyMLA, prompts: list[list[int]], capacity: int) -> DecodeState:
        """The state after the prefill of ``prompts`` (each of at least one token): rows
        0..P-2 hold c(p_i), the root is p_{P-1}.

        Raises:
            ValueError: an empty prompt, a token outside [0, V), or a prompt longer than ``capacity``.
        """
        d = model.dims
        cache = np.full((len(prompts), capacity, d["Dqk"]), np.nan)
        cache = round_to(cache, model.emb.dtype)
        for r, p in enumerate(prompts):
            if not p or min(p) < 0 or max(p) >= d["V"] or len(p) > capacity:
                raise ValueError(f"prompt {r}: needs 1..{capacity} tokens in [0, {d['V']})")
            if len(p) > 1:
                cache[r, : len(p) - 1] = project(model, np.array(p[:-1]))[1]
        n = np.array([len(p) - 1 for p in prompts], np.int32)
        root = np.array([p[-1] for p in prompts], np.int64)
        return cls(cache, n, root, [[] for _ in prompts], [[] for _ in prompts])


def _attend(model: TinyMLA, q: np.ndarray, cache: np.ndarray, n: np.ndarray, tree_len: np.ndarray,
            vis: np.ndarray) -> np.ndarray:
    d = model.dims
    out, _ = verify_attn_f64(q, cache, n, tree_len, vis, model.sm_scale, d["d_v"])
    return out


def greedy_step(model: TinyMLA, st: DecodeState) -> None:
    """One plain greedy step of every request (in place)."""
    b = len(st.n)
    q, c = project(model, st.root)
    for r in range(b):
        _room(st, r, 1)
        st.cache[r, st.n[r]] = c[r]
    out = _attend(model, q[:, None], st.cache, st.n, np.ones(b, np.int32), np.ones((b, 1, 1), np.uint8))
    lg = logits_of(model, st.root, out[:, 0])
    pred = np.argmax(lg, axis=-1)
    mg = margins(lg)
    for r in range(b):
        st.emitted[r].append(int(pred[r]))
        st.margins[r].append(float(mg[r]))
    st.n = st.n + 1
    st.root = pred.astype(np.int64)


def _room(st: DecodeState, r: int, rows: int) -> None:
    if int(st.n[r]) + rows > st.cache.shape[1]:
        raise ValueError(f"request {r}: kv_cache: S = {st.cache.shape[1]} rows, the step needs "
                         f"{int(st.n[r]) + rows}")


@dataclass
class StepRecord:
    """One DDTree step of every request: the drafter's top-K (f32 [B,D,K], i64 [B,D,K]),
    the tree (tree_build's result), verify_attn's float64 out [B,T,H,d_v] over the tree
    (rows past tree_len 0), the predictions per slot (i64 [B,T]) and tree_accept's result."""

    top_log_probs: np.ndarray
    top_token_ids: np.ndarray
    tree: TreeBuildResult
    attn_out: np.ndarray
    target_predict: np.ndarray
    accept: AcceptResult


def ddtree_step(model: TinyMLA, drafter: BigramDrafter, st: DecodeState, budget: np.ndarray,
                depth_limit: np.ndarray, depth: int, top_k: int, n_max: int, bug: str = "") -> StepRecord:
    """One DDTree step of every request (in place; module docstring). ``bug`` plants one of
    BUGS (for the tests that show the decode goldens catch it): ``tree_mask`` (every tree
    slot sees every other tree slot), ``accept_walk`` (only the first child of each node is
    tried), ``kv_commit`` (rows n..n+a take the c of slots 0..a, not of the path's slots).

    Raises:
        ValueError: a malformed draft (tree_build's errors), or a cache too short for the tree.
    """
    b = len(st.n)
    drafts = [draft(drafter, int(st.root[r]), depth, top_k) for r in range(b)]
    lp = np.stack([x[0] for x in drafts])
    ids = np.stack([x[1] for x in drafts])
    tree = tree_build(lp, ids, st.root, np.asarray(budget, np.int32), np.asarray(depth_limit, np.int32),
                               n_max=n_max)
    t = n_max + 1
    tree_len = (tree.node_count + 1).astype(np.int32)
    slot_tokens = np.where(tree.node_token_ids >= 0, tree.node_token_ids, 0)
    q, c = project(model, slot_tokens)
    for r in range(b):
        _room(st, r, int(tree_len[r]))
        st.cache[r, st.n[r] : st.n[r] + tree_len[r]] = c[r, : tree_len[r]]
    vis = tree.visibility.copy()
    if bug == "tree_mask":
        for r in range(b):
            vis[r, : tree_len[r], : tree_len[r]] = 1
    out = _attend(model, q, st.cache, st.n, tree_len, vis)
    lg = logits_of(model, slot_tokens.reshape(-1), out.reshape(b * t, *out.shape[2:])).reshape(b, t, -1)
    predict = np.argmax(lg, axis=-1).astype(np.int64)
    next_sibling = tree.next_sibling.copy()
    if bug == "accept_walk":
        next_sibling[:] = -1
    acc = tree_accept(tree.node_token_ids, tree.next_token, next_sibling, tree.node_count, predict)
    mg = margins(lg)
    for r in range(b):
        a = int(acc.accepted_count[r])
        path = acc.accepted_path[r, : a + 1]
        n = int(st.n[r])
        rows = c[r, : a + 1] if bug == "kv_commit" else c[r, path]
        st.cache[r, n : n + a + 1] = rows
        st.cache[r, n + a + 1 :] = round_to(np.nan, st.cache.dtype)
        st.emitted[r].extend(int(x) for x in acc.proposed[r, : a + 1])
        st.margins[r].extend(float(mg[r, s]) for s in path)
        st.n[r] = n + a + 1
        st.root[r] = acc.proposed[r, a]
    return StepRecord(lp, ids, tree, out, predict, acc)


def greedy_decode(model: TinyMLA, prompts: list[list[int]], counts: list[int], capacity: int) -> DecodeState:
    """Plain greedy decoding of each prompt (alone) for ``counts[r]`` tokens."""
    states = []
    for p, k in zip(prompts, counts):
        st = DecodeState.from_prompts(model, [p], capacity)
        for _ in range(k):
            greedy_step(model, st)
        states.append(st)
    cache = np.concatenate([s.cache for s in states])
    return DecodeState(cache, np.concatenate([s.n for s in states]), np.concatenate([s.root for s in states]),
                       [s.emitted[0] for s in states], [s.margins[0] for s in states])
