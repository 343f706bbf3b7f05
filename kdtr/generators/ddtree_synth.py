"""Weights of the tiny target model and its drafter (kdtr.ops.ddtree_model) from a seed,
aimed at the decode paths: drafts that the target accepts deep (``chain``), drafts whose
top-1 is a decoy and the target's token their second choice (``decoy``: acceptance through
the next-sibling walk), and drafts unrelated to the target (``random``: rejection at depth
0). Design: docs/ops/ddtree_decode.md.

The target is built so that its predictions have wide top-1 margins and still depend on
the attention: every token t has a successor succ(t), emb[t] = 0.9 w_lm[:, succ(t)] + noise
(the residual path alone would predict succ(t) by a margin of about 0.8 |w_lm column|^2),
w_lm's entries are in {-1/2, 0, 1/2}, w_kv copies one hidden dim per latent dim (values
within [-1, 1]) and w_o, scaled by ``o_scale``, adds the attention's contribution. Every
weight is a multiple of 2^-6 in [-1, 1] (ddtree_model.check_weight). All draws through
:class:`kdtr.generators.rng.Rng`: the same weights on every host.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..bf16 import round_to, widen
from ..dtypes import bfloat16  # ml_dtypes, imported on first use
from ..ops.ddtree_model import WEIGHT_FRAC_BITS, BigramDrafter, TinyMLA
from .rng import Rng

DRAFT_MODES = ("chain", "decoy", "random", "ties")


@dataclass(frozen=True)
class ModelDims:
    """V vocabulary, E hidden, H heads, Dqk latent (key) dims, d_v value dims."""

    V: int = 256
    E: int = 32
    H: int = 2
    Dqk: int = 24
    d_v: int = 16


def fixed(a) -> np.ndarray:
    """``a`` rounded to the nearest multiple of 2^-6, clipped to [-1, 1], as bf16 (exact)."""
    scale = 2.0**WEIGHT_FRAC_BITS
    return round_to(np.clip(np.rint(np.asarray(a, np.float64) * scale), -scale, scale) / scale, bfloat16())


def _uniform(rng: Rng, shape: tuple[int, ...]) -> np.ndarray:
    return rng.integers(-64, 65, size=shape).astype(np.float64) / 64.0


def synth_models(seed: int, dims: ModelDims, mode: str, o_scale: float = 0.25, noise: float = 0.15,
                 sm_scale: float = 0.5, o_density: float = 1.0) -> tuple[TinyMLA, BigramDrafter, Rng]:
    """(target, drafter, the generator's Rng for what comes next: prompts) for ``seed``.

    Modes (module docstring): ``chain`` (the drafter is the target's residual path: emb and
    w_lm), ``decoy`` (the drafter's emb adds 1.1 w_lm[:, decoy(t)], a token other than
    succ(t), so the decoy leads and succ(t) comes second), ``random`` (independent
    weights), ``ties`` (``chain`` with every column of the drafter's w_lm duplicated in
    pairs: exact ties in its top-K). ``o_density`` < 1 keeps that share of w_o's entries
    (the others 0): at K2 dims (H d_v = 32768 rows of w_o) the logit error bound, a sum over
    those rows, stays below the margins only with a sparse w_o.

    Raises:
        ValueError: an unknown mode.
    """
    if mode not in DRAFT_MODES:
        raise ValueError(f"draft mode {mode!r} not in {DRAFT_MODES}")
    d = dims
    rng = Rng(seed)
    w_lm = rng.integers(-1, 2, size=(d.E, d.V)).astype(np.float64) * 0.5
    succ = rng.integers(0, d.V, size=d.V)
    emb = 0.9 * w_lm[:, succ].T + noise * _uniform(rng, (d.V, d.E))
    w_q = _uniform(rng, (d.E, d.H, d.Dqk))
    w_kv = np.zeros((d.E, d.Dqk))
    w_kv[rng.integers(0, d.E, size=d.Dqk), np.arange(d.Dqk)] = 1.0
    w_o = o_scale * _uniform(rng, (d.H, d.d_v, d.E))
    if o_density < 1.0:
        w_o = np.where(rng.random(size=w_o.shape) < o_density, w_o, 0.0)
    model = TinyMLA(fixed(emb), fixed(w_q), fixed(w_kv), fixed(w_o), fixed(w_lm), float(np.float32(sm_scale)))
    if mode == "random":
        drafter = BigramDrafter(fixed(_uniform(rng, (d.V, d.E))), fixed(_uniform(rng, (d.E, d.V))))
    elif mode == "decoy":
        decoy = (succ + 1 + rng.integers(0, d.V - 1, size=d.V)) % d.V  # never succ(t)
        drafter = BigramDrafter(fixed(widen(model.emb) + 1.1 * w_lm[:, decoy].T), model.w_lm)
    elif mode == "ties":
        lm = widen(model.w_lm).copy()
        lm[:, 1::2] = lm[:, 0::2][:, : lm[:, 1::2].shape[1]]
        drafter = BigramDrafter(model.emb, fixed(lm))
    else:
        drafter = BigramDrafter(model.emb, model.w_lm)
    model.check()
    drafter.check(d.V)
    return model, drafter, rng
