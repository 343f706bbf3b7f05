"""Goldens for verify_attn (docs/ops/verify_attn.md).

Visibility comes from real draft-tree shapes (random best-first-like trees, chains,
stars). Everything a correct kernel must not read is poisoned: q rows past tree_len and
cache rows past prefix_len + tree_len are NaN, visibility entries outside the valid
square are 1. Tolerances are computed per golden from the data (see
``tolerances`` and docs/ops/verify_attn.md, "Tolerances").

Configurations with a ``special`` kind (SPECIAL_KINDS; they kill mutation survivors) aim at the softmax:
``huge_scores`` (scores beyond float64's exp range), ``no_visible_key`` (empty rows),
``masked_extremes`` (masked keys that would set the row maximum) and ``finite_padding``,
which leaves q's padding rows finite (every other poison stays) so that a kernel that
computes them gets finite values instead of out 0, lse -inf; ``late_keys`` (rows whose first
64-key tile is fully masked, scores below f32 exp's range) and ``vis_bytes`` (visibility
bytes other than 1) aim at the CUDA kernels, as do the configurations without a special
kind whose lengths and dims reach their tile paths (``tail_tile_*``, ``multi_tile_*``,
``odd_dv_bf16``, ``dv66``, ``dv_full``, ``dv1_bf16``, ``odd_dqk*``; docs/ops/verify_attn.md,
"Goldens aimed at the kernels' tile paths").

Configurations with ``nonfinite`` kinds (``nan_scores``, ``nan_scores_bf16``; ``inf_scores``,
``inf_scores_bf16``, ``inf_scores_k2_bf16``, whose 64-row blocks hold no padding row, so that
their raw scores are infinite and never NaN) put NaN and infinities inside the valid region on
purpose (``inject_nonfinite``): their expected outputs hold NaN (docs/ops/verify_attn.md, "NaN
and infinities") and their contracts use the NaN policy ``equal``. ``dv_split`` and
``dv_split_bf16`` have d_v > 512, which simt splits over gridDim.y (docs/ops/verify_attn.md,
"Goldens aimed at the kernels' blocks").

The ``split_*`` configurations have the lengths that reach the split-KV paths of the mma and
wgmma kernels (key ranges of ``kdtr.ops.verify_attn.split_schedule``, listed in SPLIT_RANGES):
a range of a single key, a range ending at prefix_len, ranges that rows or whole row tiles do
not see (``split_masks``, ``split_empty_rows``), NaN and infinities in one range
(SPLIT_NONFINITE_KINDS), and, on the second tier, 16 and 15 ranges at prefix 32768
(docs/ops/verify_attn.md, "Goldens aimed at the split-KV paths").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from kdtr.bf16 import round_to, to_float32, widen
from kdtr.contract import Contract
from kdtr.dtypes import bfloat16  # ml_dtypes, imported on first use
from kdtr.ops import verify_attn as attn_op
from kdtr.ops.verify_attn import sm_scale_mla

from .golden import package
from .rng import Rng
from .trees import chain_tree, random_tree

OP = "verify_attn"
GENERATOR_VERSION = 2  # 2: host-independent synthesis (kdtr.generators.rng, kdtr.bf16, kdtr.detmath)
U32 = math.ldexp(1.0, -24)  # unit roundoff of f32
U_BF16 = math.ldexp(1.0, -8)  # unit roundoff of bf16
K2_SCALE = float(to_float32(sm_scale_mla(192, 64.0)))  # 0.144680 (Kimi K2: yarn factor 64)


@dataclass(frozen=True)
class Config:
    description: str
    seed: int
    batch: int
    slots: int  # T
    heads: int
    dqk: int
    d_v: int
    prefix: tuple[int, ...]  # prefix_len per request (cycled over the batch)
    dtype: str = "f32"
    shape: str = "random"  # random | chain | star
    q_scale: float = 1.0
    sm_scale: float = 0.0  # 0: Dqk^-0.5
    tree_len: tuple[int, ...] = ()  # per request (cycled); empty: full trees (T)
    tier: str = "committed"
    # per request (cycled): NONFINITE_KINDS / BLOCK_NONFINITE_KINDS entries ("+"-joined) or "" (none)
    nonfinite: tuple[str, ...] = ()
    special: str = ""  # a SPECIAL_KINDS entry: huge_scores | no_visible_key | masked_extremes | finite_padding
    #                    | late_keys | vis_bytes | split_masks | split_empty_rows


CONFIGS: dict[str, Config] = {
    "small": Config("H=4, Dqk=72, d_v=64: generic small dims", 3001, 2, 9, 4, 72, 64, (37, 20)),
    "small_bf16": Config("small dims with bf16 inputs", 3002, 2, 9, 4, 72, 64, (37, 20), dtype="bf16"),
    "no_prefix": Config("prefix_len 0: only the tree is visible", 3003, 2, 9, 4, 72, 64, (0,)),
    "ragged": Config("different prefix_len and tree_len per request, incl. tree_len 1", 3004, 4, 17, 4, 72, 64,
                     (5, 64, 0, 33), tree_len=(17, 6, 1, 11)),
    "chain": Config("a chain: each node sees every earlier one", 3005, 2, 17, 4, 72, 64, (24,), shape="chain"),
    "wide_tree": Config("a star: every node sees the root and itself", 3006, 2, 33, 4, 72, 64, (16,), shape="star"),
    "large_values": Config("q scaled x100: overflows without max subtraction", 3007, 2, 9, 4, 72, 64, (40,),
                           q_scale=100.0),
    "k2_dims_fp32": Config("Kimi K2 dims: H=64, Dqk=576, d_v=512, sm_scale 0.144680", 3008, 2, 9, 64, 576, 512,
                           (96, 40), sm_scale=K2_SCALE),
    "k2_dims_bf16": Config("Kimi K2 dims, bf16 inputs", 3009, 2, 9, 64, 576, 512, (96, 40), dtype="bf16",
                           sm_scale=K2_SCALE),
    "nan_scores": Config("NaN / inf inside the valid region, one case per request (docs: NaN and infinities)",
                         3011, 8, 5, 2, 24, 16, (3, 4, 2, 3, 3, 0, 0, 2), tree_len=(5, 5, 5, 4, 5, 5, 5, 1),
                         nonfinite=("nan_q", "nan_prefix_key", "nan_tree_key", "inf_q", "neg_inf_key",
                                    "only_neg_inf", "no_key", "")),
    "nan_scores_bf16": Config("nan_scores with bf16 inputs (the tensor-core kernel on cuda)", 3012, 8, 5, 2, 24, 16,
                              (3, 4, 2, 3, 3, 0, 0, 2), tree_len=(5, 5, 5, 4, 5, 5, 5, 1), dtype="bf16",
                              nonfinite=("nan_q", "nan_prefix_key", "nan_tree_key", "inf_q", "neg_inf_key",
                                         "only_neg_inf", "no_key", "")),
    "long_prefix": Config("K2 dims, bf16, prefix 4096, T=65 (second tier)", 3010, 2, 65, 64, 576, 512, (4096, 4000),
                          dtype="bf16", sm_scale=K2_SCALE, tier="cache"),
    "huge_scores": Config("integer q and keys, scores +-(900..3132) (beyond float64 exp, far beyond f32): only "
                          "max-subtraction keeps them finite; one prefix spans two 64-key tiles whose maxima "
                          "differ by >= 192", 3013, 6, 9, 2, 16, 8, (70, 0, 5, 12, 1, 33), sm_scale=1.0,
                          tree_len=(9, 9, 6, 9, 1, 4), special="huge_scores"),
    "huge_scores_bf16": Config("huge_scores with bf16 inputs (exact: small integers)", 3014, 6, 9, 2, 16, 8,
                               (70, 0, 5, 12, 1, 33), dtype="bf16", sm_scale=1.0, tree_len=(9, 9, 6, 9, 1, 4),
                               special="huge_scores"),
    "no_visible_key": Config("prefix 0 with all-zero visibility rows (out 0, lse -inf) among normal rows, the root "
                             "row empty, rows that do not see the root, a prefix-only row; tree_len 1 with "
                             "visibility [[0]]", 3015, 5, 9, 2, 16, 8, (0, 0, 0, 5, 0), tree_len=(9, 7, 9, 9, 1),
                             special="no_visible_key"),
    "masked_extremes": Config("masked tree keys score +450 where the visible ones score -450: a row maximum taken "
                              "over masked keys underflows every visible weight", 3016, 4, 9, 2, 16, 8, (0, 3, 0, 66),
                              sm_scale=1.0, tree_len=(9, 9, 5, 9), special="masked_extremes"),
    "masked_extremes_bf16": Config("masked_extremes with bf16 inputs (exact: integers)", 3017, 4, 9, 2, 16, 8,
                                   (0, 3, 0, 66), dtype="bf16", sm_scale=1.0, tree_len=(9, 9, 5, 9),
                                   special="masked_extremes"),
    "finite_padding": Config("finite q in the padding rows (i >= tree_len; cache rows past the tree stay NaN): "
                             "padding rows must be out 0, lse -inf, not attention; tree_len 0 and 1", 3018, 5, 9, 2,
                             16, 8, (1, 0, 6, 3, 4), tree_len=(1, 4, 7, 2, 0), special="finite_padding"),
    "finite_padding_bf16": Config("finite_padding with bf16 inputs (the tensor-core kernel on cuda)", 3019, 5, 9, 2,
                                  16, 8, (1, 0, 6, 3, 4), dtype="bf16", tree_len=(1, 4, 7, 2, 0),
                                  special="finite_padding"),
    # Goldens at the shapes that reach the CUDA kernels' tile paths (docs/ops/verify_attn.md,
    # "Goldens aimed at the kernels' tile paths"). The kernels tile keys by 64; every one of
    # these has its last request at L = prefix_len + tree_len = S, so a load of cache row L
    # (or of a whole tile past L) leaves the kv_cache allocation.
    "tail_tile_bf16": Config("mma kernel (mma_bf16_dqk128_dv128 by auto; wgmma and simt forced), bf16, H=2, Dqk=72, "
                             "d_v=64: L = 129, 150, 191, three 64-key tiles with a partial last one (tails 1, 22, "
                             "63): the zero-filled tail tile loaded inside the tile loop (wgmma: cp.async at j = 2, "
                             "after two TMA tiles); tree keys straddle the tile 1/2 boundary; last request L == S",
                             3020, 3, 9, 2, 72, 64, (120, 141, 182), dtype="bf16"),
    "tail_tile_k2_bf16": Config("wgmma kernel (wgmma_bf16_dqk576_dv512 by auto on sm_90; mma_bf16_dqk576_dv512 and "
                                "simt forced), bf16 at the K2 dims Dqk=576, d_v=512, H=2: L = 150, 191, three tiles, "
                                "the last partial (cp.async zero-fill tail at j = 2 after two TMA tiles of nine "
                                "slabs); last request L == S", 3021, 2, 9, 2, 576, 512, (141, 182), dtype="bf16",
                                sm_scale=K2_SCALE),
    "multi_tile_bf16": Config("mma kernel (auto; wgmma and simt forced), bf16, H=2, Dqk=72, d_v=64: L = 256, 290, "
                              "320, 384 = 4, 5 (tail 34), 5 and 6 key tiles: both KV buffers refilled twice or more, "
                              "the wgmma mbarrier parity flips (tiles 2-3) and returns (tiles 4-5); last request "
                              "L == S (6 full tiles: a seventh tile would read past the cache)", 3022, 4, 9, 2, 72,
                              64, (247, 281, 311, 375), dtype="bf16"),
    "multi_tile_k2_bf16": Config("wgmma kernel (auto on sm_90; mma_bf16_dqk576_dv512 and simt forced), bf16 at the "
                                 "K2 dims Dqk=576, d_v=512, H=2: L = 320 (5 TMA tiles, the buffers' mbarriers on "
                                 "their third phase) and 330 (5 TMA tiles and a cp.async tail at j = 5); last "
                                 "request L == S", 3023, 2, 9, 2, 576, 512, (311, 321), dtype="bf16",
                                 sm_scale=K2_SCALE),
    "odd_dv_bf16": Config("odd d_v = 65 in bf16, Dqk=72, H=2 (mma_bf16_dqk128_dv128 by auto, its second warp "
                          "column holding one value column; wgmma and simt_bf16_dvt128 forced): the paired float2 "
                          "and float4 output stores must fall back to scalar ones; L = 79, 87 (two tiles), last "
                          "request L == S", 3024, 2, 9, 2, 72, 65, (70, 78), dtype="bf16"),
    "dv66": Config("simt kernel (simt_f32_dvt128), f32, d_v = 66 (even, not a multiple of 4), Dqk=72, H=2: rows of "
                   "out are 8-byte but not 16-byte aligned, so the float4 output store must fall back; L = 79, 87, "
                   "last request L == S", 3025, 2, 9, 2, 72, 66, (70, 78)),
    "late_keys": Config("every kernel's online softmax with a first tile fully masked: prefix 0, tree_len 70 and 81 "
                        "(> 64), rows >= 64 see only tree keys >= 64 (columns 0..63 cleared) and every visible "
                        "score is about -1e4 (request 0) or in [-125, -95] (request 1, below f32 exp's range): the "
                        "running max stays -inf through tile 0 and the kernels' -inf -> 0 substitute must not "
                        "reach exp(s - m); simt on cuda (f32); last request L == S", 3026, 2, 81, 2, 16, 8, (0,),
                        sm_scale=1.0, tree_len=(70, 81), special="late_keys"),
    "late_keys_bf16": Config("late_keys with bf16 inputs (exact: integers; mma by auto, wgmma forced)", 3027, 2, 81,
                             2, 16, 8, (0,), dtype="bf16", sm_scale=1.0, tree_len=(70, 81), special="late_keys"),
    "vis_bytes": Config("visibility bytes other than 1 where a key is visible (2, 0x80, 0xff, 0x7f, 0x40, 0x10, "
                        "0xfe, 1): nonzero means visible; rows whose only tree key is an even byte (2, 0x80, 0xfe) "
                        "with prefix 0; prefix 70 puts the tree in the second tile; simt on cuda (f32); last "
                        "request L == S", 3028, 4, 9, 2, 16, 8, (0, 5, 0, 70), tree_len=(9, 9, 6, 9),
                        special="vis_bytes"),
    "vis_bytes_bf16": Config("vis_bytes with bf16 inputs (mma by auto, wgmma forced)", 3029, 4, 9, 2, 16, 8,
                             (0, 5, 0, 70), dtype="bf16", tree_len=(9, 9, 6, 9), special="vis_bytes"),
    "dv_full": Config("d_v = Dqk = 16 (the largest d_v: every key dim is a value dim, the last included), f32, "
                      "H=2 (simt_f32_dvt64 on cuda); L = 9, 79 (two tiles), last request L == S", 3030, 2, 9, 2, 16,
                      16, (0, 70)),
    "dv1_bf16": Config("d_v = 1 (the smallest), bf16, Dqk=16, H=2 (mma_bf16_dqk128_dv128 by auto: one value column "
                       "of 128, a single scalar store per row; wgmma and simt_bf16_dvt64 forced); L = 9, 79, last "
                       "request L == S", 3031, 2, 9, 2, 16, 1, (0, 70), dtype="bf16"),
    "odd_dqk": Config("Dqk = 67 (odd: q and key rows not 8-byte aligned, the simt loads' scalar path; a key-dim "
                      "stage of 32 partly past Dqk), f32, d_v = 33, H=2 (simt_f32_dvt64 on cuda); L = 9, 79, last "
                      "request L == S", 3032, 2, 9, 2, 67, 33, (0, 70)),
    "odd_dqk_bf16": Config("Dqk = 66 (not a multiple of 8: only the simt kernel takes it, simt_bf16_dvt64 by auto; "
                           "mma and wgmma are NOT_SUPPORTED), bf16, d_v = 33, H=2; L = 9, 79, last request L == S",
                           3033, 2, 9, 2, 66, 33, (0, 70), dtype="bf16"),
    # Infinite raw scores with no NaN anywhere in a 64-row block (docs/ops/verify_attn.md,
    # "NaN and infinities"): T * H = 64 and full trees, so every block is all valid rows (no
    # zero-filled padding row, whose 0 * inf = NaN raw score would trigger the kernels'
    # cleaning pass by itself, as in nan_scores).
    "inf_scores": Config("simt kernel (simt_f32_dvt64), f32, T=8, H=8 (T * H = 64: one block of valid rows, no "
                         "padding row), Dqk=16, d_v=8: -inf in value dim 3 of prefix key 0 with q dim 3 > 0 on every "
                         "row (every raw score of that key -inf, weight 0, rows finite), +inf in value dim 2 of the "
                         "last tree slot's key with q dim 2 > 0 (+inf raw scores: the slot's own rows NaN, the rows "
                         "that do not see it finite), both in one request; no NaN raw score anywhere, so only a "
                         "cleaning pass triggered by infinities (not NaN alone) keeps 0 * inf out of P V; prefix 61 "
                         "and 70 put the +inf key in tile 1; last request L == S", 3034, 3, 8, 8, 16, 8,
                         (5, 61, 70), nonfinite=("neg_inf_value_all", "inf_masked_value",
                                                  "neg_inf_value_all+inf_masked_value")),
    "inf_scores_bf16": Config("inf_scores with bf16 inputs (mma_bf16_dqk128_dv128 by auto; wgmma and simt forced): "
                              "T * H = 64, no padding row, infinite raw scores and no NaN in the block", 3035, 3, 8, 8,
                              16, 8, (5, 61, 70), dtype="bf16",
                              nonfinite=("neg_inf_value_all", "inf_masked_value",
                                         "neg_inf_value_all+inf_masked_value")),
    "inf_scores_k2_bf16": Config("inf_scores at the K2 dims (wgmma_bf16_dqk576_dv512 by auto on sm_90; "
                                 "mma_bf16_dqk576_dv512 and simt forced), bf16, T=4, H=16 (one block of 64 valid "
                                 "rows), Dqk=576, d_v=512, prefix 61: -inf in value dim 3 of prefix key 0 (a TMA "
                                 "tile) and +inf in value dim 2 of the last slot's key 64 (the cp.async tail tile), "
                                 "q dims 2 and 3 > 0: infinite raw scores, no NaN; L == S", 3036, 1, 4, 16, 576,
                                 512, (61,), dtype="bf16", sm_scale=K2_SCALE,
                                 nonfinite=("neg_inf_value_all+inf_masked_value",)),
    # simt splits d_v > 512 over gridDim.y (blocks of 512 value columns, vbase = 512 y).
    "dv_split": Config("simt kernel (simt_f32_dvt512, the only kernel past d_v 512), f32, d_v = 520 > 512: two "
                       "blocks per row tile along gridDim.y, the second (vbase 512) loading and storing value "
                       "columns 512..519; Dqk=528, H=1, T=3; L = 5, 7, last request L == S", 3037, 2, 3, 1, 528,
                       520, (2, 4)),
    "dv_split_bf16": Config("dv_split with bf16 inputs (simt_bf16_dvt512 by auto: mma and wgmma take d_v <= 512 "
                            "only, NOT_SUPPORTED), d_v = 520, Dqk=528: the gridDim.y split of the value columns",
                            3038, 2, 3, 1, 528, 520, (2, 4), dtype="bf16"),
    # Goldens at the lengths that reach the split-KV paths of the mma and wgmma kernels
    # (docs/ops/verify_attn.md, "Goldens aimed at the split-KV paths"): the key ranges are
    # kdtr.ops.verify_attn.split_schedule's (verify_attn_split in verify_attn.cuh), listed per
    # request in SPLIT_RANGES and checked against it by tests/unit/test_gen_verify_attn_splits.py.
    "split_lengths_bf16": Config("split-KV of the mma kernel (mma_bf16_dqk128_dv128 by auto; wgmma forced; simt "
                                 "never splits), bf16, H=2, Dqk=72, d_v=64, T=9, one row tile per request: L = 257 "
                                 "(prefix 256, tree_len 1) and 257 (prefix 255, tree_len 2) split [0,256) [256,257), "
                                 "a last range of a single key (the root; tree slot 1, which row 0 does not see); "
                                 "L = 513 splits [0,256) [256,512) [512,513), the single key tree slot 8; tree_len 0 "
                                 "beside them (prefix 256, no row); L = 201 unsplit (4 tiles); L = 521 (prefix 512) "
                                 "splits [0,256) [256,512) [512,521), a range ending exactly at prefix_len and one of "
                                 "tree keys only; last request L == S", 3040, 6, 9, 2, 72, 64,
                                 (256, 255, 504, 256, 192, 512), dtype="bf16", tree_len=(1, 2, 9, 0, 9, 9)),
    "split_masked_bf16": Config("split-KV (mma_bf16_dqk128_dv128 by auto; wgmma forced), bf16, H=2, Dqk=72, d_v=65 "
                                "(odd: the combine's scalar stores, two 64-column combine blocks), T=9: L = 259 split "
                                "[0,256) [256,259) = tree slots 6..8, which no row sees (columns 6..8 cleared: the "
                                "whole block's partial of range 1 is m -inf, l 0), every visible score about -188 "
                                "(an empty range's m written as 0 would underflow every weight); L = 259 with the "
                                "tree's own masks (range 1 seen by some rows only); L = 521 split [0,256) [256,512) "
                                "[512,521) with rows 2 and 5 seeing the prefix only (the tree range masked for "
                                "them); last request L == S", 3041, 3, 9, 2, 72, 65, (250, 250, 512), dtype="bf16",
                                special="split_masks"),
    "split_nonfinite_bf16": Config("NaN and infinities in one key range of split-KV (mma_bf16_dqk128_dv128 by auto; "
                                   "wgmma forced), bf16, H=2, Dqk=72, d_v=64, T=9, every request prefix 512, tree_len "
                                   "9 split [0,256) [256,512) [512,521): NaN in tree slot 7's key (range 2 only: the "
                                   "rows that see it NaN, the others finite); NaN in prefix key 384 (range 1 only: "
                                   "every row NaN); +inf in q of row 1 head 0 with key dim 2 > 0 on range 1 and < 0 "
                                   "elsewhere (+inf scores in range 1 only, -inf in the others: that row NaN); -inf "
                                   "in value dim 3 of every key of range 1, then of range 0, q dim 3 > 0 (a range "
                                   "whose every score is -inf: the rows finite, as if it were absent); +inf in the "
                                   "last slot's value dim 2 (range 2, masked for the other rows); "
                                   "-inf in value dim 3 of every "
                                   "key of all three ranges (every visible score -inf: each range's partial m -inf, "
                                   "l 0, and every row NaN, which only the visible-key test tells from an empty "
                                   "row); last request L == S",
                                   3042, 7, 9, 2, 72, 64, (512,), dtype="bf16",
                                   nonfinite=("nan_tree_key", "nan_split_key:1", "inf_split_q:1", "neg_inf_split:1",
                                              "inf_masked_value", "neg_inf_split:0",
                                              "neg_inf_split:0+neg_inf_split:1+neg_inf_split:2")),
    "split_empty_rows_bf16": Config("split-KV over several row tiles (mma_bf16_dqk128_dv128 by auto; wgmma forced), "
                                    "bf16, T=257, H=2 (T * H = 514: 9 row tiles), Dqk=16, d_v=8: prefix 0, tree_len "
                                    "257 split [0,256) [256,257) with row 3 and rows 32..63 (the whole row tile 1) "
                                    "seeing no key in any range (out 0, lse -inf from the combine), row 256 seeing "
                                    "only itself (range 0 masked for it); prefix 120, tree_len 200 (7 row tiles, "
                                    "the last partial; row tiles 7 and 8 padding) split [0,256) [256,320), row 150 "
                                    "seeing the prefix only; prefix 143, tree_len 257 split [0,256) [256,400); last "
                                    "request L == S", 3043, 3, 257, 2, 16, 8, (0, 120, 143), dtype="bf16",
                                    tree_len=(257, 200, 257), special="split_empty_rows"),
    "split_k2_bf16": Config("split-KV at the K2 dims (wgmma_bf16_dqk576_dv512 by auto on sm_90; "
                            "mma_bf16_dqk576_dv512 forced), bf16, T=2, H=64 (row tile 0 = tree row 0, row tile 1 = "
                            "tree row 1), Dqk=576, d_v=512: prefix 511, tree_len 2, L = 513 split [0,256) [256,512) "
                            "[512,513): two ranges of four TMA tiles, then a range of one key (tree slot 1, a "
                            "cp.async tail tile) that row tile 0 does not see at all; L == S", 3044, 1, 2, 64, 576,
                            512, (511,), dtype="bf16", sm_scale=K2_SCALE),
    "split_many_bf16": Config("split-KV with the most ranges and more than four tiles per range "
                              "(mma_bf16_dqk128_dv128 by auto; wgmma forced), bf16, H=2, Dqk=16, d_v=8, T=9: L = "
                              "4409 (69 tiles) split into 14 ranges of 320 keys (5 tiles: each KV buffer refilled, "
                              "the wgmma mbarrier parity back at the range's fifth tile), the last 249 keys (4 "
                              "tiles, the last partial); L = 4169 (prefix 4160) into 13 ranges of 320 keys and a "
                              "last one of the 9 tree keys alone: a range that starts at an odd tile (65) with "
                              "its cp.async tail tile first (the wgmma double buffer and mbarrier parity are "
                              "counted from the range's start); L = 5120 into 16 ranges of 320 keys, every one "
                              "full; last request L == S", 3046, 3, 9, 2, 16, 8, (4400, 4160, 5111), dtype="bf16"),
    "split_long_prefix": Config("split-KV at the K2 dims with a long prefix (second tier; wgmma_bf16_dqk576_dv512 by "
                                "auto on sm_90, mma_bf16_dqk576_dv512 forced), bf16, T=8, H=64, Dqk=576, d_v=512: "
                                "prefix 32768, tree_len 8 (8 row tiles: the most splits, 16 ranges of 2112 keys = 33 "
                                "tiles, the last 1096 keys); L == S", 3045, 1, 8, 64, 576, 512, (32768,), dtype="bf16",
                                sm_scale=K2_SCALE, tier="cache"),
}

# The key ranges of every request of the split goldens (kdtr.ops.verify_attn.split_schedule
# of its prefix_len, tree_len and H); [(0, L)] is unsplit, [] no key.
SPLIT_RANGES: dict[str, tuple[tuple[tuple[int, int], ...], ...]] = {
    "split_lengths_bf16": (((0, 256), (256, 257)), ((0, 256), (256, 257)), ((0, 256), (256, 512), (512, 513)),
                           ((0, 256),), ((0, 201),), ((0, 256), (256, 512), (512, 521))),
    "split_masked_bf16": (((0, 256), (256, 259)), ((0, 256), (256, 259)), ((0, 256), (256, 512), (512, 521))),
    "split_nonfinite_bf16": (((0, 256), (256, 512), (512, 521)),) * 7,
    "split_empty_rows_bf16": (((0, 256), (256, 257)), ((0, 256), (256, 320)), ((0, 256), (256, 400))),
    "split_k2_bf16": (((0, 256), (256, 512), (512, 513)),),
    "split_many_bf16": (tuple((320 * s, min(320 * (s + 1), 4409)) for s in range(14)),
                        tuple((320 * s, min(320 * (s + 1), 4169)) for s in range(14)),
                        tuple((320 * s, 320 * (s + 1)) for s in range(16))),
    "split_long_prefix": (tuple((2112 * s, min(2112 * (s + 1), 32776)) for s in range(16)),),
}


def tree_visibility(parents: np.ndarray, n: int, t: int) -> np.ndarray:
    """uint8 [T,T] ancestor mask of slots 0..n (parents[i] < i); 0 elsewhere."""
    vis = np.zeros((t, t), np.uint8)
    for i in range(n + 1):
        if i:
            vis[i] = vis[parents[i]]
        vis[i, i] = 1
    return vis


def put(arr: np.ndarray, index, value) -> None:
    """``arr[index] = value`` with the value rounded to ``arr``'s dtype by kdtr's rule
    (kdtr/bf16.py: bf16 or f32; NaN the canonical NaN), never by a library cast."""
    arr[index] = round_to(np.asarray(value, np.float64), arr.dtype)


def _tree(cfg: Config, rng: Rng | np.random.Generator, n: int) -> np.ndarray:
    t = cfg.slots
    if cfg.shape == "chain":
        return tree_visibility(chain_tree(rng, t, n, 100).parents, n, t)
    if cfg.shape == "star":
        parents = np.zeros(t, np.int32)
        parents[0] = -1
        return tree_visibility(parents, n, t)
    return tree_visibility(random_tree(rng, t, n, 8, 8, 1000).parents, n, t)


def poison(q: np.ndarray | None, kv: np.ndarray, vis: np.ndarray | None, prefix: np.ndarray,
           tree_len: np.ndarray) -> None:
    """In place: NaN in q rows >= tree_len (skipped when q is None) and cache rows >=
    prefix_len + tree_len; 1 in visibility entries outside the valid square (skipped when
    vis is None)."""
    for r in range(kv.shape[0]):
        tl, pl = int(tree_len[r]), int(prefix[r])
        if q is not None:
            put(q, (r, slice(tl, None)), np.nan)
        put(kv, (r, slice(pl + tl, None)), np.nan)
        if vis is not None:
            vis[r, tl:, :] = 1
            vis[r, :, tl:] = 1


NONFINITE_KINDS = ("nan_q", "nan_prefix_key", "nan_tree_key", "inf_q", "neg_inf_key", "only_neg_inf", "no_key")
# Kinds for blocks of valid rows only (inf_scores*): infinite raw scores, none NaN.
BLOCK_NONFINITE_KINDS = ("neg_inf_value_all", "inf_masked_value")
# Kinds aimed at one key range of the split-KV schedule (split_nonfinite_bf16), written
# "kind:s" for range s of split_schedule(prefix_len, tree_len, H).
SPLIT_NONFINITE_KINDS = ("nan_split_key", "inf_split_q", "neg_inf_split")


def inject_nonfinite(x: dict[str, np.ndarray], kinds: tuple[str, ...]) -> None:
    """In place: request r gets the non-finite case ``kinds[r % len(kinds)]`` ("" = none).

    Cases (docs/ops/verify_attn.md, "NaN and infinities"; the expected result in brackets):

    - ``nan_q``: NaN in q[r, 1, 0, Dqk // 2] [that row and head NaN, the rest finite].
    - ``nan_prefix_key``: NaN in value dim 0 of prefix key 0 [every row of r NaN].
    - ``nan_tree_key``: NaN in value dim 0 of tree slot tl-2's key [the rows that see
      that slot (itself, perhaps tl-1) NaN; the others, rows 0..tl-3, finite: a kernel must
      not form 0 * NaN in P V].
    - ``inf_q``: +inf in q[r, 1, 0, 2] and key dim 2 positive on every key [+inf scores:
      that row and head NaN].
    - ``neg_inf_key``: -inf in value dim 3 of prefix key 0, q dim 3 positive except head
      H-1 of the last row [its -inf score has weight 0 and rows stay finite, value dim 3
      included (no 0 * inf); that last row's head sees +inf and is NaN].
    - ``only_neg_inf`` (prefix_len 0): as ``neg_inf_key`` on tree slot 0's key with q
      dim 3 positive everywhere, and row 1 sees only slot 0 [rows 0 and 1 see only -inf
      scores: NaN; the others finite].
    - ``no_key`` (prefix_len 0): row 1 sees no key [out 0, lse -inf; the others finite].
    - ``neg_inf_value_all`` (prefix_len > 0): -inf in value dim 3 of prefix key 0 and q
      dim 3 positive on every row and head [every raw score of that key is -inf, none NaN:
      weight 0, every row finite, value dim 3 included].
    - ``inf_masked_value``: +inf in value dim 2 of the last tree slot's key (a leaf: only
      its own row sees it) and q dim 2 positive on every row and head [+inf raw scores, none
      NaN: that slot's rows NaN, every other row finite, value dim 2 included].

    Split kinds, ``kind:s`` for key range s = [a, b) of
    ``kdtr.ops.verify_attn.split_schedule(prefix_len, tree_len, H)`` (the request must split):

    - ``nan_split_key:s``: NaN in value dim 0 of key (a + b) // 2, a prefix key [every row
      NaN, from range s alone].
    - ``inf_split_q:s``: +inf in q[r, 1, 0, 2], key dim 2 positive on the keys of range s and
      negative on every other key [that row and head: +inf scores in range s, -inf in the
      others: NaN; the rest finite].
    - ``neg_inf_split:s``: -inf in value dim 3 of every key of range s, q dim 3 positive on
      every row and head [every raw score of range s is -inf, none NaN: weight 0, the rows
      finite, as if range s were absent; a row that sees no other key is NaN].

    Kinds joined by "+" are applied in turn to the same request (e.g.
    ``neg_inf_value_all+inf_masked_value``).

    Args:
        x: the inputs of :func:`synth` (q [B,T,H,Dqk], kv_cache [B,S,Dqk], prefix_len,
            tree_len, visibility [B,T,T] u8, d_v); modified in place.
        kinds: entries of NONFINITE_KINDS or BLOCK_NONFINITE_KINDS, of SPLIT_NONFINITE_KINDS
            with a range (``kind:s``), "+"-joined entries, or "".

    Raises:
        ValueError: an unknown kind, or a request that the kind does not fit (naming the
            request, the kind and the field): tree_len < 3 (< 2 for nan_q, inf_q,
            neg_inf_key, neg_inf_value_all, inf_masked_value), prefix_len 0 for
            nan_prefix_key / neg_inf_key / neg_inf_value_all, prefix_len > 0 for
            only_neg_inf / no_key, Dqk < 4 or d_v < 4; for a split kind, a request that
            does not split, a range s it does not have, or (nan_split_key) a middle key
            that is not a prefix key.
    """
    q, kv, vis = x["q"], x["kv_cache"], x["visibility"]
    _, _, h, dqk = q.shape
    d_v = int(x["d_v"])
    for r in range(q.shape[0]):
        for kind in kinds[r % len(kinds)].split("+"):
            if kind:
                _inject_one(x, q, kv, vis, r, kind, h, dqk, d_v)


def _inject_one(x: dict[str, np.ndarray], q: np.ndarray, kv: np.ndarray, vis: np.ndarray, r: int, kind: str, h: int,
                dqk: int, d_v: int) -> None:
    """One case of :func:`inject_nonfinite` on request r (same arguments and errors)."""
    if kind.partition(":")[0] in SPLIT_NONFINITE_KINDS:
        _inject_split(x, q, kv, r, kind, h, dqk, d_v)
        return
    if kind not in NONFINITE_KINDS + BLOCK_NONFINITE_KINDS:
        raise ValueError(f"nonfinite kind {kind!r} (request {r}) not in {NONFINITE_KINDS + BLOCK_NONFINITE_KINDS}"
                         f" or {tuple(k + ':s' for k in SPLIT_NONFINITE_KINDS)}")
    pl, tl = int(x["prefix_len"][r]), int(x["tree_len"][r])
    need_tl = 2 if kind in ("nan_q", "inf_q", "neg_inf_key", "neg_inf_value_all", "inf_masked_value") else 3
    if tl < need_tl:
        raise ValueError(f"request {r}, nonfinite {kind}: tree_len {tl} < {need_tl}")
    if kind in ("nan_prefix_key", "neg_inf_key", "neg_inf_value_all") and pl == 0:
        raise ValueError(f"request {r}, nonfinite {kind}: prefix_len must be > 0")
    if kind in ("only_neg_inf", "no_key") and pl != 0:
        raise ValueError(f"request {r}, nonfinite {kind}: prefix_len must be 0, got {pl}")
    if dqk < 4 or d_v < 4:
        raise ValueError(f"request {r}, nonfinite {kind}: Dqk {dqk} and d_v {d_v} must be >= 4")
    if kind == "nan_q":
        put(q, (r, 1, 0, dqk // 2), np.nan)
    elif kind == "nan_prefix_key":
        put(kv, (r, 0, 0), np.nan)
    elif kind == "nan_tree_key":
        put(kv, (r, pl + tl - 2, 0), np.nan)
    elif kind == "inf_q":
        put(kv, (r, slice(0, pl + tl), 2), np.abs(widen(kv[r, : pl + tl, 2])) + 0.25)
        put(q, (r, 1, 0, 2), np.inf)
    elif kind in ("neg_inf_key", "only_neg_inf"):
        put(q, (r, slice(0, tl), slice(None), 3), np.abs(widen(q[r, :tl, :, 3])) + 0.25)
        put(kv, (r, 0, 3), -np.inf)  # prefix key 0, or tree slot 0 when prefix_len is 0
        if kind == "neg_inf_key":
            put(q, (r, tl - 1, h - 1, 3), -widen(q[r, tl - 1, h - 1, 3]))
        else:
            vis[r, 1, :tl] = 0
            vis[r, 1, 0] = 1
    elif kind == "neg_inf_value_all":
        put(q, (r, slice(0, tl), slice(None), 3), np.abs(widen(q[r, :tl, :, 3])) + 0.25)
        put(kv, (r, 0, 3), -np.inf)
    elif kind == "inf_masked_value":
        put(q, (r, slice(0, tl), slice(None), 2), np.abs(widen(q[r, :tl, :, 2])) + 0.25)
        put(kv, (r, pl + tl - 1, 2), np.inf)
    else:  # no_key
        vis[r, 1, :tl] = 0


def _inject_split(x: dict[str, np.ndarray], q: np.ndarray, kv: np.ndarray, r: int, kind: str, h: int, dqk: int,
                  d_v: int) -> None:
    """A split kind (``kind:s``) of :func:`inject_nonfinite` on request r (same errors)."""
    base, _, index = kind.partition(":")
    pl, tl = int(x["prefix_len"][r]), int(x["tree_len"][r])
    ranges = attn_op.split_schedule(pl, tl, h)
    if not index.isdigit() or int(index) >= len(ranges) or len(ranges) < 2:
        raise ValueError(f"request {r}, nonfinite {kind}: needs a range s of the request's split {ranges}")
    if tl < 2 or dqk < 4 or d_v < 4:
        raise ValueError(f"request {r}, nonfinite {kind}: tree_len {tl} < 2, or Dqk {dqk} / d_v {d_v} < 4")
    a, b = ranges[int(index)]
    if base == "nan_split_key":
        if (a + b) // 2 >= pl:
            raise ValueError(f"request {r}, nonfinite {kind}: key {(a + b) // 2} is not a prefix key (prefix {pl})")
        put(kv, (r, (a + b) // 2, 0), np.nan)
    elif base == "inf_split_q":
        mag = np.abs(widen(kv[r, : pl + tl, 2])) + 0.25
        inside = (np.arange(pl + tl) >= a) & (np.arange(pl + tl) < b)
        put(kv, (r, slice(0, pl + tl), 2), np.where(inside, mag, -mag))
        put(q, (r, 1, 0, 2), np.inf)
    else:  # neg_inf_split
        put(q, (r, slice(0, tl), slice(None), 3), np.abs(widen(q[r, :tl, :, 3])) + 0.25)
        put(kv, (r, slice(a, b), 3), -np.inf)


def _special_huge_scores(cfg: Config, rng: Rng | np.random.Generator, q: np.ndarray, kv: np.ndarray, vis: np.ndarray,
                         prefix: np.ndarray, tree_len: np.ndarray) -> None:
    """Integer q and keys (exact in f32 and bf16, so are the scores): dims 0..Dqk-2 in
    [-2, 2]; the last key dim (a rope dim: not a value, d_v < Dqk) 48 on every key of even
    requests, 46..48 on odd ones (groups of keys |q_last| >= 24 apart), 40 on the first 64
    prefix keys of a prefix > 64 (the first tile's maximum 8 |q_last| >= 192 off the
    second's); q's last dim +-24..64 per row and head. Scores +-(900..3132): exp overflows
    (> 709.78) or underflows (< -745) in float64 for every key of every row, so a kernel
    without max-subtraction returns NaN, inf or -inf everywhere."""
    b, t, h, dqk = q.shape
    put(q, ..., rng.integers(-2, 3, q.shape))
    put(kv, ..., rng.integers(-2, 3, kv.shape))
    put(q, (..., -1), rng.integers(24, 65, (b, t, h)) * rng.choice([-1, 1], (b, t, h)))
    for r in range(b):
        put(kv, (r, slice(None), -1), rng.choice([46, 47, 48], kv.shape[1]) if r % 2 else 48)
        if prefix[r] > 64:
            put(kv, (r, slice(0, 64), -1), 40)


def _special_masked_extremes(cfg: Config, rng: Rng | np.random.Generator, q: np.ndarray, kv: np.ndarray,
                             vis: np.ndarray, prefix: np.ndarray, tree_len: np.ndarray) -> None:
    """Integer q and keys in [-1, 1] except the last key dim (a rope dim): +450 ("hot") on
    about 80% of the tree's leaves (the last slot, always a leaf, included), -450 ("cold") on
    every other key: the prefix, the root, inner slots; q's last dim +1 on even heads, -1 on
    odd ones. On even heads the row of an inner slot sees only cold keys (its ancestors and
    the prefix), scoring near -450, while masked hot keys score near +450: a maximum over all
    keys instead of the visible ones is 870 or more above every visible score, whose weights
    then underflow even in float64. Leaf rows see their own hot key."""
    b, t, h, dqk = q.shape
    put(q, ..., rng.integers(-1, 2, q.shape))
    put(kv, ..., rng.integers(-1, 2, kv.shape))
    put(q, (..., -1), np.where(np.arange(h) % 2 == 0, 1, -1))
    for r in range(b):
        pl, tl = int(prefix[r]), int(tree_len[r])
        leaf = vis[r, :tl, :tl].sum(axis=0) == 1  # seen by no row but its own
        hot = leaf & (rng.random(tl) < 0.8)
        hot[0] = False
        hot[tl - 1] = tl > 1
        put(kv, (r, slice(None), -1), -450)
        put(kv, (r, slice(pl, pl + tl), -1), np.where(hot, 450, -450))


# no_visible_key: per request, (rows whose tree visibility is cleared, rows that lose column 0).
NO_KEY_ROWS: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...] = (
    ((2, 5), (3,)),  # prefix 0: two empty rows, one row that does not see the root
    ((0, 6), (1, 2, 3, 4, 5)),  # prefix 0: the root row empty; no other row sees the root
    ((4, 8), (1, 2, 3, 5, 6, 7)),  # prefix 0: likewise, with the empty rows deeper
    ((1, 2), (3,)),  # prefix 5: rows with no tree key still see the prefix (not empty)
    ((0,), ()),  # prefix 0, tree_len 1, visibility [[0]]: the input that first showed the bug
)


def _special_no_visible_key(cfg: Config, rng: Rng | np.random.Generator, q: np.ndarray, kv: np.ndarray,
                            vis: np.ndarray, prefix: np.ndarray, tree_len: np.ndarray) -> None:
    """NO_KEY_ROWS applied to the tree masks (inside the valid square; the poison outside it
    stays 1, so a kernel that reads it sees a key that is not there)."""
    if q.shape[0] != len(NO_KEY_ROWS):
        raise ValueError(f"no_visible_key: batch must be {len(NO_KEY_ROWS)}")
    for r, (empty, no_root) in enumerate(NO_KEY_ROWS):
        tl = int(tree_len[r])
        if max(empty + no_root) >= tl:
            raise ValueError(f"no_visible_key: request {r} needs tree_len > {max(empty + no_root)}")
        for i in no_root:
            vis[r, i, 0] = 0
        for i in empty:
            vis[r, i, :tl] = 0


# late_keys: (|q last dim|, key last dim) per request (cycled): every score is about -c_q * c_k.
LATE_KEY_SCALES = ((100, 100), (10, 11))


def _special_late_keys(cfg: Config, rng: Rng | np.random.Generator, q: np.ndarray, kv: np.ndarray, vis: np.ndarray,
                       prefix: np.ndarray, tree_len: np.ndarray) -> None:
    """Integer q and keys in [-1, 1] except the last key dim (a rope dim: not a value, d_v <
    Dqk): q's is -c_q and every key's +c_k (LATE_KEY_SCALES), so every score is -c_q c_k
    +- (Dqk - 1): about -1e4, or in [-125, -95] (below -87.3, where f32 exp underflows to a
    subnormal, and -103.3, where it underflows to 0). Rows i >= 64 of a tree of more than 64
    slots lose columns 0..63 of their visibility row: they see only keys of the second 64-key
    tile (their ancestors >= 64 and themselves), so their running max is -inf after tile 0.
    A kernel that subtracts 0 instead of the row max there (the -inf -> 0 substitute used
    for exp) gets weights exp(-1e4) = 0 and a NaN or empty row; one that forms -inf - -inf
    gets NaN.

    Raises:
        ValueError: prefix_len > 0, or no request with tree_len > 64 (nothing to test)."""
    b, t, h, dqk = q.shape
    if (prefix != 0).any() or int(tree_len.max()) <= 64:
        raise ValueError("late_keys: prefix_len must be 0 and some tree_len > 64")
    put(q, ..., rng.integers(-1, 2, q.shape))
    put(kv, ..., rng.integers(-1, 2, kv.shape))
    for r in range(b):
        c_q, c_k = LATE_KEY_SCALES[r % len(LATE_KEY_SCALES)]
        put(q, (r, ..., -1), -c_q)
        put(kv, (r, slice(None), -1), c_k)
        tl = int(tree_len[r])
        if tl > 64:
            vis[r, 64:tl, :64] = 0


# vis_bytes: the nonzero visibility bytes used for visible keys (1 included), and the bytes
# given to rows whose only tree key is their own slot (even bytes: a low-bit test reads them as 0).
VIS_BYTES = (1, 2, 0x80, 0xFF, 0x7F, 0x40, 0x10, 0xFE)
VIS_BYTES_ALONE = (2, 0x80, 0xFE)


def _special_vis_bytes(cfg: Config, rng: Rng | np.random.Generator, q: np.ndarray, kv: np.ndarray, vis: np.ndarray,
                       prefix: np.ndarray, tree_len: np.ndarray) -> None:
    """Every visible entry of the valid square gets a byte drawn from VIS_BYTES (nonzero:
    visible, docs/ops/verify_attn.md); in requests with prefix 0, rows 1..3 (when inside the
    tree) see only their own slot, with the byte VIS_BYTES_ALONE[i - 1]: a kernel that tests
    the low bit (or the sign of the byte as int8, or == 1) takes such a row for empty."""
    for r in range(q.shape[0]):
        tl = int(tree_len[r])
        sq = vis[r, :tl, :tl]
        on = sq != 0
        sq[on] = rng.choice(np.array(VIS_BYTES, np.uint8), int(on.sum()))
        if prefix[r] == 0:
            for i, byte in enumerate(VIS_BYTES_ALONE, start=1):
                if i < tl:
                    sq[i, :] = 0
                    sq[i, i] = byte


# split_masks (split_masked_bf16), per request: (tree columns cleared in every row, rows that
# see the prefix only, |q last dim| and key last dim for scores near -q k sm_scale, or None).
SPLIT_MASKS: tuple[tuple[tuple[int, ...], tuple[int, ...], tuple[int, int] | None], ...] = (
    ((6, 7, 8), (), (40, 40)),  # range 1 (tree slots 6..8) seen by no row; scores about -188
    ((), (), None),  # the tree's own masks: range 1 seen by some rows only
    ((), (2, 5), None),  # rows 2 and 5 see the prefix only: the tree range masked for them
)
# split_empty_rows (split_empty_rows_bf16), per request: (rows that see no tree key, rows that
# see only their own slot).
SPLIT_EMPTY_ROWS: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...] = (
    ((3, *range(32, 64)), (256,)),  # prefix 0: row 3 and row tile 1 empty in every range; row 256 in range 1 only
    ((150,), ()),  # prefix 120: row 150 sees the prefix only
    ((), ()),
)


def _special_split_masks(cfg: Config, rng: Rng | np.random.Generator, q: np.ndarray, kv: np.ndarray,
                         vis: np.ndarray, prefix: np.ndarray, tree_len: np.ndarray) -> None:
    """SPLIT_MASKS applied to the tree masks (inside the valid square: the poison outside it
    stays 1). A request with scales (c_q, c_k) gets -c_q in q's last dim and +c_k in every
    key's (a rope dim: not a value, d_v < Dqk): every score is sm_scale (-c_q c_k +- the
    other dims' sum), about -188 at (40, 40) and Dqk = 72, below -103.3, where f32 exp of the
    score underflows to 0. A kernel that writes m = 0 (the -inf -> 0 substitute of exp) for a
    range a row does not see makes every weight of that row underflow in the combine."""
    if q.shape[0] != len(SPLIT_MASKS):
        raise ValueError(f"split_masks: batch must be {len(SPLIT_MASKS)}")
    for r, (cols, rows, scales) in enumerate(SPLIT_MASKS):
        tl = int(tree_len[r])
        if max(cols + rows, default=-1) >= tl:
            raise ValueError(f"split_masks: request {r} needs tree_len > {max(cols + rows)}")
        for j in cols:
            vis[r, :tl, j] = 0
        for i in rows:
            vis[r, i, :tl] = 0
        if scales is not None:
            put(q, (r, ..., -1), -scales[0])
            put(kv, (r, slice(None), -1), scales[1])


def _special_split_empty_rows(cfg: Config, rng: Rng | np.random.Generator, q: np.ndarray, kv: np.ndarray,
                              vis: np.ndarray, prefix: np.ndarray, tree_len: np.ndarray) -> None:
    """SPLIT_EMPTY_ROWS applied to the tree masks (inside the valid square): rows cleared
    (no visible key in any range where prefix_len is 0, the prefix only otherwise) and rows
    that see only their own slot."""
    if q.shape[0] != len(SPLIT_EMPTY_ROWS):
        raise ValueError(f"split_empty_rows: batch must be {len(SPLIT_EMPTY_ROWS)}")
    for r, (empty, alone) in enumerate(SPLIT_EMPTY_ROWS):
        tl = int(tree_len[r])
        if max(empty + alone, default=-1) >= tl:
            raise ValueError(f"split_empty_rows: request {r} needs tree_len > {max(empty + alone)}")
        for i in empty:
            vis[r, i, :tl] = 0
        for i in alone:
            vis[r, i, :tl] = 0
            vis[r, i, i] = 1


SPECIAL_KINDS = {
    "split_masks": _special_split_masks,
    "split_empty_rows": _special_split_empty_rows,
    "late_keys": _special_late_keys,
    "vis_bytes": _special_vis_bytes,
    "huge_scores": _special_huge_scores,
    "masked_extremes": _special_masked_extremes,
    "no_visible_key": _special_no_visible_key,
    "finite_padding": None,  # no change to the data; q's padding rows are left finite (synth)
}


def synth(cfg: Config, rng: Rng | np.random.Generator) -> dict[str, np.ndarray]:
    b, t = cfg.batch, cfg.slots
    prefix = np.array([cfg.prefix[r % len(cfg.prefix)] for r in range(b)], np.int32)
    tree_len = np.array([cfg.tree_len[r % len(cfg.tree_len)] if cfg.tree_len else t for r in range(b)], np.int32)
    s = int((prefix + t).max())
    dt = np.float32 if cfg.dtype == "f32" else bfloat16()
    q = round_to(rng.standard_normal((b, t, cfg.heads, cfg.dqk)) * cfg.q_scale, dt)  # kdtr's rounding
    kv = round_to(rng.standard_normal((b, s, cfg.dqk)), dt)
    vis = np.zeros((b, t, t), np.uint8)
    for r in range(b):
        vis[r] = _tree(cfg, rng, int(tree_len[r]) - 1)
    if cfg.special:
        if cfg.special not in SPECIAL_KINDS:
            raise ValueError(f"special {cfg.special!r} not in {tuple(SPECIAL_KINDS)}")
        if cfg.special in ("huge_scores", "masked_extremes", "late_keys", "split_masks") and cfg.d_v >= cfg.dqk:
            raise ValueError(f"{cfg.special}: the last key dim must not be a value dim (d_v < Dqk)")
        fill = SPECIAL_KINDS[cfg.special]
        if fill is not None:
            fill(cfg, rng, q, kv, vis, prefix, tree_len)
    poison(None if cfg.special == "finite_padding" else q, kv, vis, prefix, tree_len)
    scale = cfg.sm_scale or 1.0 / math.sqrt(cfg.dqk)  # sqrt: correctly rounded, unlike pow
    x = {
        "q": q,
        "kv_cache": kv,
        "prefix_len": prefix,
        "tree_len": tree_len,
        "visibility": vis,
        "sm_scale": round_to(scale, np.float32),
        "d_v": np.array(cfg.d_v, np.int32),
    }
    if cfg.nonfinite:
        inject_nonfinite(x, cfg.nonfinite)
    return x


def max_abs_score(x: dict[str, np.ndarray]) -> float:
    """Largest finite |scaled score| over the valid rows and keys (drives the f32 error
    bound); scores that are NaN or infinite (nonfinite configurations) are left out.
    Computed by :func:`kdtr.ops.verify_attn.max_abs_score` (exact dot products)."""
    return attn_op.max_abs_score(x["q"], x["kv_cache"], x["prefix_len"], x["tree_len"], x["sm_scale"])


def tolerances(x: dict[str, np.ndarray], nan: str = "fail", smax: float | None = None) -> dict[str, Contract]:
    """Per-golden contracts from an error model calibrated by bench/attn_error_model.py.

    An f32-accumulating kernel's score errors grow with the score magnitude: with
    S = max|scaled score| and V = max|value|, the measured worst errors over 10 seeds of
    every config stay below u32 S V for out and 5 u32 S for lse (u32 = 2^-24). Contracts:
    out atol = max(1e-5, 2 u32 S V), lse atol = max(1e-5, 8 u32 S) and lse rtol = 4 u32;
    the 1e-5 floor is the fp32 target. With bf16 inputs a kernel may round the softmax
    weights P to bf16 for the P.V tensor-core product (relative error 2^-9 per weight,
    measured worst 4.5e-3 at V ~ 4.3): out atol adds 2^-8 V. lse is not affected by that,
    but the f32 sum of L exponentials has a relative error ~ sqrt(L) u32: lse atol is at
    least 4 u32 sqrt(L) (1.5e-5 at L = 4161, where the H200 kernels measured 8.4e-6).

    ``nan`` is the contracts' NaN policy: "fail" (no NaN may appear) for goldens with finite
    inputs, "equal" (NaN must meet NaN) for the nonfinite configurations. Non-finite
    scores and values are left out of S and V. ``smax``: S if known already (the reference's
    ``stats``), else computed by :func:`max_abs_score`.

    Raises:
        ValueError: ``nan`` not a contract NaN policy (from :class:`Contract`).
    """
    d_v = int(x["d_v"])
    vmax = 1.0
    for r in range(x["q"].shape[0]):
        rows = np.abs(widen(x["kv_cache"][r, : int(x["prefix_len"][r]) + int(x["tree_len"][r]), :d_v]))
        rows = rows[np.isfinite(rows)]  # a NaN or inf value only meets weight 0 or NaN rows
        if rows.size:
            vmax = max(vmax, float(rows.max()))
    smax = max(1.0, max_abs_score(x) if smax is None else smax)
    lmax = int((x["prefix_len"] + x["tree_len"]).max())
    out_atol = max(1e-5, 2 * U32 * smax * vmax)
    if x["q"].dtype != np.float32:
        out_atol += U_BF16 * vmax
    return {
        "out": Contract("allclose", atol=float(out_atol), rtol=0.0, nan=nan),
        "lse": Contract("allclose", atol=float(max(1e-5, 8 * U32 * smax, 4 * U32 * np.sqrt(lmax))), rtol=float(4 * U32),
                        nan=nan),
    }


def generate(name: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Inputs, expected outputs (float64 reference, stored f32) and metadata of ``name``.

    Raises:
        KeyError: unknown configuration.
    """
    cfg = CONFIGS[name]
    x = synth(cfg, Rng(cfg.seed))
    stats: dict[str, float] = {}
    expected = attn_op.verify_attn(**x, stats=stats).as_dict()  # = SPEC.reference(x, {}), with S
    contracts = tolerances(x, nan="equal" if cfg.nonfinite else "fail", smax=stats["max_abs_score"])
    return package(OP, name, cfg, GENERATOR_VERSION, x, expected, contracts, dtype=cfg.dtype)
