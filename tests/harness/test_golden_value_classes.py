"""Audit of the committed goldens: every value class the op contracts admit (docs/ops/*.md) is
reached by at least one committed golden, so a class cannot silently lose its last golden
(a config deleted, regenerated smaller, or its special case dropped).

Each class is a predicate over one golden (its tensors and metadata); the test lists, per
class, the goldens that hold it and fails naming every class that none holds. The classes
are the contracts' own terms: dtypes, lengths at their bounds, at the CUDA kernels' tile
boundaries (64-key tiles) and at their split-KV ranges (split_schedule), visibility bytes,
non-finite inputs, statuses, score classes (-0.0 beside +0.0, positive log-probs, ties), link
and token classes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import kdtr
from kdtr.ops.verify_attn import split_schedule

Golden = tuple[dict[str, np.ndarray], dict]
ROOT = Path(__file__).resolve().parents[2]


def _i(t, name):
    return t[f"input.{name}"]


def _e(t, name):
    return t[f"expected.{name}"]


# --- verify_attn (docs/ops/verify_attn.md) -------------------------------------------------


def _lens(t):
    return _i(t, "prefix_len").astype(np.int64) + _i(t, "tree_len")


def _tiles(n):
    return (np.asarray(n) + 63) // 64


def _dims(t):
    _, _, h, dqk = _i(t, "q").shape
    return h, dqk, int(_i(t, "d_v"))


def _bf16(t):
    return _i(t, "q").dtype != np.float32


def _small_mma(t):  # the mma_bf16_dqk128_dv128 instance
    _, dqk, d_v = _dims(t)
    return _bf16(t) and dqk % 8 == 0 and dqk <= 128 and d_v <= 128


def _k2(t):
    _, dqk, d_v = _dims(t)
    return dqk == 576 and d_v == 512


def _vis_square(t):
    vis, tl = _i(t, "visibility"), _i(t, "tree_len")
    return [vis[r, : int(n), : int(n)] for r, n in enumerate(tl)]


def _empty_row(t):
    return any(int(pl) == 0 and (sq == 0).all(axis=1).any() for pl, sq in zip(_i(t, "prefix_len"), _vis_square(t)))


def _first_tile_masked(t):
    return any(int(pl) == 0 and sq.shape[0] > 64 and not sq[64:, :64].any()
               for pl, sq in zip(_i(t, "prefix_len"), _vis_square(t)))


def _valid_nonfinite(t, test) -> bool:
    q, kv = _i(t, "q").astype(np.float64), _i(t, "kv_cache").astype(np.float64)
    for r, (pl, tl) in enumerate(zip(_i(t, "prefix_len"), _i(t, "tree_len"))):
        if test(q[r, : int(tl)]).any() or test(kv[r, : int(pl) + int(tl)]).any():
            return True
    return False


def _inf_block(t):
    """A request whose 64-row blocks are all valid rows (tree_len * H a multiple of 64) with an
    infinite raw score (q . key over all Dqk, IEEE) and no NaN one: only a cleaning pass that
    tests for infinities keeps 0 * inf out of P V (zero-filled padding rows would give NaN)."""
    q, kv = _i(t, "q").astype(np.float64), _i(t, "kv_cache").astype(np.float64)
    h = q.shape[2]
    for r, (pl, tl) in enumerate(zip(_i(t, "prefix_len"), _i(t, "tree_len"))):
        if int(tl) == 0 or int(tl) * h % 64:
            continue
        with np.errstate(invalid="ignore"):
            raw = (q[r, : int(tl)][:, :, None, :] * kv[r, None, None, : int(pl) + int(tl), :]).sum(-1)
        if np.isinf(raw).any() and not np.isnan(raw).any():
            return True
    return False


_SPLITS: dict[str, list] = {}


def _splits(t, m) -> list[tuple[int, int, int, list[tuple[int, int]], np.ndarray, np.ndarray]]:
    """The requests that the mma and wgmma kernels split (bf16, Dqk % 8 == 0, Dqk <= 576,
    d_v <= 512; split_schedule gives two ranges or more): (r, prefix_len, tree_len, ranges,
    the visible-key mask [tl, L] and the IEEE scaled scores [tl, H, L]), once per golden."""
    key = m["config"]
    if key not in _SPLITS:
        h, dqk, d_v = _dims(t)
        found = []
        if _bf16(t) and dqk % 8 == 0 and dqk <= 576 and d_v <= 512:
            vis, scale = _i(t, "visibility"), float(np.float32(_i(t, "sm_scale")))
            for r, (pl, tl) in enumerate(zip(_i(t, "prefix_len").tolist(), _i(t, "tree_len").tolist())):
                ranges = split_schedule(pl, tl, h)
                if len(ranges) < 2:
                    continue
                seen = np.ones((tl, pl + tl), bool)
                seen[:, pl:] = vis[r, :tl, :tl] != 0
                q = _i(t, "q")[r, :tl].astype(np.float64)
                k = _i(t, "kv_cache")[r, : pl + tl].astype(np.float64)
                with np.errstate(invalid="ignore", over="ignore"):
                    s = scale * np.einsum("thd,ld->thl", q, k)  # IEEE: 0 * inf = NaN
                found.append((r, pl, tl, ranges, seen, s))
        _SPLITS[key] = found
    return _SPLITS[key]


def _split_row_tile_misses_a_range(t, m) -> bool:
    """A 64-row block (rows m = i H + h) of a split request whose valid rows see no key of one range."""
    h = _dims(t)[0]
    for _, _, tl, ranges, seen, _ in _splits(t, m):
        rows = np.repeat(seen, h, axis=0)
        for m0 in range(0, tl * h, 64):
            if any(not rows[m0 : m0 + 64, a:b].any() for a, b in ranges):
                return True
    return False


def _split_rows(t, m, test) -> bool:
    """test(seen [L], scores [L], ranges) for some row and head of a split request."""
    return any(test(seen[i], s[i, hh], ranges)
               for _, _, tl, ranges, seen, s in _splits(t, m) for i in range(tl) for hh in range(s.shape[1]))


def _one_range(cls):
    """A row whose visible scores of class ``cls`` (np.isnan, np.isposinf) lie in exactly one range."""
    return lambda t, m: _split_rows(t, m, lambda seen, s, ranges: sum(
        bool((cls(s[a:b]) & seen[a:b]).any()) for a, b in ranges) == 1)


def _finite_row_with_a_neg_inf_range(seen, s, ranges) -> bool:
    vis = s[seen]
    if not vis.size or np.isnan(vis).any() or np.isposinf(vis).any() or not np.isfinite(vis).any():
        return False
    return any(seen[a:b].any() and np.isneginf(s[a:b][seen[a:b]]).all() for a, b in ranges)


def _split_batch_mixed(t, m) -> bool:
    """Requests that split, one that does not (tree_len > 0) and one of tree_len 0, in one batch."""
    if not _splits(t, m):
        return False
    h = _dims(t)[0]
    tl, pl = _i(t, "tree_len").tolist(), _i(t, "prefix_len").tolist()
    return 0 in tl and any(n > 0 and len(split_schedule(p, n, h)) == 1 for p, n in zip(pl, tl))


def _finite_padding_q(t):
    q = _i(t, "q").astype(np.float64)
    return any(int(tl) < q.shape[1] and np.isfinite(q[r, int(tl):]).all() for r, tl in enumerate(_i(t, "tree_len")))


VERIFY_ATTN: dict[str, Callable[[dict, dict], bool]] = {
    "q f32": lambda t, m: not _bf16(t),
    "q bf16": lambda t, m: _bf16(t),
    "prefix_len 0": lambda t, m: (_i(t, "prefix_len") == 0).any(),
    "tree_len 0": lambda t, m: (_i(t, "tree_len") == 0).any(),
    "tree_len 1": lambda t, m: (_i(t, "tree_len") == 1).any(),
    "tree_len T (full tree)": lambda t, m: (_i(t, "tree_len") == _i(t, "q").shape[1]).any(),
    "padding rows (0 < tree_len < T)": lambda t, m: ((_i(t, "tree_len") > 0) & (_i(t, "tree_len") < _i(t, "q").shape[1])).any(),  # noqa: E501
    "last request ends at S (L == S for b = B-1)": lambda t, m: int(_lens(t)[-1]) == _i(t, "kv_cache").shape[1],
    "d_v == Dqk": lambda t, m: _dims(t)[2] == _dims(t)[1],
    "d_v == 1": lambda t, m: _dims(t)[2] == 1,
    "odd d_v, bf16 (mma / wgmma float2 stores)": lambda t, m: _bf16(t) and _dims(t)[2] % 2 == 1 and _dims(t)[2] > 1,
    "d_v = 2 mod 4 (simt float4 stores)": lambda t, m: _dims(t)[2] % 4 == 2,
    "Dqk not a multiple of 8 (simt only)": lambda t, m: _dims(t)[1] % 8 != 0,
    "K2 dims, f32": lambda t, m: _k2(t) and not _bf16(t),
    "K2 dims, bf16": lambda t, m: _k2(t) and _bf16(t),
    "two or more key tiles (L > 64)": lambda t, m: (_lens(t) > 64).any(),
    "bf16 small dims, 3 tiles, partial last (128 < L < 192)": lambda t, m: _small_mma(t) and any(
        128 < n < 192 and n % 64 for n in _lens(t).tolist()),
    "bf16 K2 dims, 3 tiles, partial last (128 < L < 192)": lambda t, m: _k2(t) and _bf16(t) and any(
        128 < n < 192 and n % 64 for n in _lens(t).tolist()),
    "bf16 small dims, >= 4 tiles": lambda t, m: _small_mma(t) and (_tiles(_lens(t)) >= 4).any(),
    "bf16 K2 dims, >= 5 full tiles": lambda t, m: _k2(t) and _bf16(t) and (_lens(t) // 64 >= 5).any(),
    "visibility bytes other than 0 and 1": lambda t, m: any((sq > 1).any() for sq in _vis_square(t)),
    "visibility byte >= 0x80": lambda t, m: any((sq >= 0x80).any() for sq in _vis_square(t)),
    "row with no visible key (prefix 0)": lambda t, m: _empty_row(t),
    "rows whose first 64-key tile is fully masked": lambda t, m: _first_tile_masked(t),
    "NaN in the valid region": lambda t, m: _valid_nonfinite(t, np.isnan),
    "+inf in the valid region": lambda t, m: _valid_nonfinite(t, np.isposinf),
    "-inf in the valid region": lambda t, m: _valid_nonfinite(t, np.isneginf),
    "finite q in padding rows": lambda t, m: _finite_padding_q(t),
    "+-inf raw scores in a 64-row block of valid rows, no NaN raw score": lambda t, m: _inf_block(t),
    "d_v > 512 (simt: value columns split over gridDim.y)": lambda t, m: _dims(t)[2] > 512,
    "|lse| beyond float64 exp's range (> 745)": lambda t, m: (np.abs(_e(t, "lse")[np.isfinite(_e(t, "lse"))]) > 745).any(),  # noqa: E501
    # split-KV of the mma and wgmma kernels (kdtr.ops.verify_attn.split_schedule)
    "split-KV: a range of a single key": lambda t, m: any(rg[-1][1] - rg[-1][0] == 1 for _, _, _, rg, _, _ in _splits(t, m)),  # noqa: E501
    "split-KV: a range ending at prefix_len": lambda t, m: any(
        b == pl for _, pl, _, rg, _, _ in _splits(t, m) for _, b in rg[:-1]),
    "split-KV: 16 ranges (the most)": lambda t, m: any(len(rg) == 16 for _, _, _, rg, _, _ in _splits(t, m)),
    "split-KV: more than 4 tiles per range": lambda t, m: any(rg[0][1] > 256 for _, _, _, rg, _, _ in _splits(t, m)),
    "split-KV: 2 or more row tiles": lambda t, m: any(tl * _dims(t)[0] > 64 for _, _, tl, _, _, _ in _splits(t, m)),
    "split-KV: K2 dims": lambda t, m: _k2(t) and bool(_splits(t, m)),
    "split-KV: d_v % 4 != 0 (the combine's scalar stores)": lambda t, m: _dims(t)[2] % 4 != 0 and bool(_splits(t, m)),
    "split-KV: a 64-row block that sees no key of a range": _split_row_tile_misses_a_range,
    "split-KV: a row that sees keys, none of one range": lambda t, m: _split_rows(t, m, lambda seen, s, rg: (
        seen.any() and any(not seen[a:b].any() for a, b in rg))),
    "split-KV: a row with no visible key in any range": lambda t, m: _split_rows(
        t, m, lambda seen, s, rg: not seen.any()),
    "split-KV: visible scores all < -104 (f32 exp underflow) and a range not seen": lambda t, m: _split_rows(
        t, m, lambda seen, s, rg: seen.any() and (s[seen] < -104).all() and any(not seen[a:b].any() for a, b in rg)),
    "split-KV: NaN visible scores in one range only": _one_range(np.isnan),
    "split-KV: +inf visible scores in one range only": _one_range(np.isposinf),
    "split-KV: a finite row whose visible scores of one range are all -inf": lambda t, m: _split_rows(
        t, m, _finite_row_with_a_neg_inf_range),
    "split-KV: split, unsplit and tree_len 0 requests in one batch": _split_batch_mixed,
}


# --- tree_build (docs/ops/tree_build.md) ---------------------------------------------------


def _lp(t):
    return _i(t, "top_log_probs")


def _checked(t):
    lp, lim = _lp(t), _i(t, "depth_limit")
    return [lp[r, : max(0, min(int(d), lp.shape[1]))] for r, d in enumerate(lim)]


def _item_status(lp, ids, d, r):
    """tree_build_check_item (tree_build.cuh): the status element (d, r) witnesses, or 0."""
    k = lp.shape[1]
    if not np.isfinite(lp[d, r]):
        return 3
    if r + 1 < k and lp[d, r] < lp[d, r + 1]:
        return 4
    if (ids[d, r + 1:] == ids[d, r]).any():
        return 5
    return 6 if ids[d, r] < 0 else 0


def _stripe_defects(t, m) -> bool:
    """A valid-range request with more checked elements than a stripe of W threads (W = 256,
    or 1024 for the select kernel's N > 256 instance) where one thread's stripe holds two
    defects, a later one of a larger status than its smallest."""
    lp, ids = _lp(t), _i(t, "top_token_ids")
    n, d_rows, k = m["max_budget"], lp.shape[1], lp.shape[2]
    for r, (budget, limit) in enumerate(zip(_i(t, "budget").tolist(), _i(t, "depth_limit").tolist())):
        if not (0 <= budget <= n and 0 <= limit <= d_rows):
            continue
        for w in {256, 256 if n <= 256 else 1024}:
            if limit * k <= w:
                continue
            for tid in range(w):
                st = [s for e in range(tid, limit * k, w) if (s := _item_status(lp[r], ids[r], e // k, e % k))]
                if len(st) >= 2 and st[-1] > min(st):
                    return True
    return False


TREE_BUILD: dict[str, Callable[[dict, dict], bool]] = {
    **{f"status {s}": (lambda s: lambda t, m: (_e(t, "status") == s).any())(s) for s in range(7)},  # noqa: B023 (bound by the outer lambda)
    "budget 0": lambda t, m: (_i(t, "budget") == 0).any(),
    "depth_limit 0": lambda t, m: (_i(t, "depth_limit") == 0).any(),
    "budget N (full tree)": lambda t, m: ((_e(t, "node_count") == m["max_budget"]) & (_e(t, "status") == 0)).any(),
    "underfull (node_count < budget, valid)": lambda t, m: (
        (_e(t, "node_count") < _i(t, "budget")) & (_e(t, "status") == 0) & (_i(t, "budget") > 0)).any(),
    "K == 1": lambda t, m: _lp(t).shape[2] == 1,
    "K >= 16": lambda t, m: _lp(t).shape[2] >= 16,
    "N <= 256 (select: 256 threads), N >= 64": lambda t, m: 64 <= m["max_budget"] <= 256,
    "N > 256 (select: 1024 threads)": lambda t, m: m["max_budget"] > 256 and (_e(t, "status") == 0).any(),
    "N >= 1024, budget >= 1024 (a select set past 1024 entries)": lambda t, m: (_i(t, "budget") >= 1024).any(),
    "T > 128 (the visibility kernel)": lambda t, m: m["max_budget"] + 1 > 128,
    "T <= 128 (visibility in the build block)": lambda t, m: m["max_budget"] + 1 <= 128,
    "T > 128, T % 16 in 2..15 (a row's unaligned head adds a 16-byte chunk)": lambda t, m: (
        m["max_budget"] + 1 > 128 and (m["max_budget"] + 1) % 16 >= 2),
    "T <= 128 even (the fused block's 32-bit copy)": lambda t, m: (
        m["max_budget"] + 1 <= 128 and (m["max_budget"] + 1) % 2 == 0),
    "depth_limit * K > 256 with two defects in one thread's stripe, the lower status first": lambda t, m: (
        _stripe_defects(t, m)),
    "range failure holding element defects": lambda t, m: any(
        s in (1, 2) and (not np.isfinite(_lp(t)[r]).all() or (_i(t, "top_token_ids")[r] < 0).any())
        for r, s in enumerate(_e(t, "status").tolist())),
    "last request depth_limit > D (rows past the inputs)": lambda t, m: int(_i(t, "depth_limit")[-1]) > _lp(t).shape[1],
    "log-prob +0.0": lambda t, m: any(((c == 0) & ~np.signbit(c)).any() for c in _checked(t)),
    "log-prob -0.0": lambda t, m: any(((c == 0) & np.signbit(c)).any() for c in _checked(t)),
    "-0.0 and +0.0 in one request": lambda t, m: any(((c == 0) & np.signbit(c)).any() and ((c == 0) & ~np.signbit(c)).any()  # noqa: E501
                                                     for c in _checked(t)),
    "positive log-prob": lambda t, m: any((c > 0).any() for c in _checked(t)),
    "positive log-prob at rank 0 of a deeper row (child beats parent)": lambda t, m: any(
        (c[1:, 0] > 0).any() for c in _checked(t) if c.shape[0] > 1),
    "f32 subnormal log-prob": lambda t, m: any(((c != 0) & (np.abs(c) < np.finfo(np.float32).tiny)).any()
                                              for c in _checked(t)),
    "equal log-probs within a row": lambda t, m: any((c[:, :-1] == c[:, 1:]).any() for c in _checked(t)),
    "NaN past the depth limit (valid request)": lambda t, m: any(
        np.isnan(_lp(t)[r, int(d):]).any() for r, d in enumerate(_i(t, "depth_limit"))
        if _e(t, "status")[r] == 0 and 0 <= d < _lp(t).shape[1]),
    "token id 0 placed": lambda t, m: (_e(t, "node_token_ids")[:, 1:] == 0).any(),
    "root token id 0": lambda t, m: (_i(t, "root_token_ids") == 0).any(),
}


# --- tree_accept (docs/ops/tree_accept.md) -------------------------------------------------


def _duplicate_match_on_walk(t) -> bool:
    nt, ns, ids, tp = _i(t, "next_token"), _i(t, "next_sibling"), _i(t, "node_token_ids"), _i(t, "target_predict")
    for r in range(nt.shape[0]):
        if _e(t, "status")[r] != 0:
            continue
        for slot in _e(t, "accepted_path")[r]:
            if slot < 0:
                break
            kids, c, n = [], int(nt[r, slot]), int(_i(t, "node_count")[r])
            while 1 <= c <= n and len(kids) <= n:  # a list past its match may hold a link never followed
                kids.append(c)
                c = int(ns[r, c])
            if sum(int(ids[r, k]) == int(tp[r, slot]) for k in kids) >= 2:
                return True
    return False


TREE_ACCEPT: dict[str, Callable[[dict, dict], bool]] = {
    **{f"status {s}": (lambda s: lambda t, m: (_e(t, "status") == s).any())(s) for s in range(5)},  # noqa: B023 (bound by the outer lambda)
    "node_count 0": lambda t, m: (_i(t, "node_count") == 0).any(),
    "node_count T-1 (full row)": lambda t, m: (_i(t, "node_count") == _i(t, "next_token").shape[1] - 1).any(),
    "T > 32 (the kernel's lane stripes wrap)": lambda t, m: _i(t, "next_token").shape[1] > 32,
    "accepted_count 0 with draft nodes": lambda t, m: ((_e(t, "accepted_count") == 0) & (_i(t, "node_count") > 0)
                                                       & (_e(t, "status") == 0)).any(),
    "accepted token id 0": lambda t, m: any(
        (_e(t, "proposed")[r, : int(n)] == 0).any() for r, n in enumerate(_e(t, "accepted_count"))),
    "token ids >= 2^31": lambda t, m: (_i(t, "node_token_ids") >= 2**31).any(),
    "negative ids past node_count only (status 0)": lambda t, m: any(
        (_i(t, "node_token_ids")[r, int(n) + 1:] < -1).any() and _e(t, "status")[r] == 0
        for r, n in enumerate(_i(t, "node_count")) if 0 <= n < _i(t, "next_token").shape[1]),
    "two children of the current slot carry the prediction": lambda t, m: _duplicate_match_on_walk(t),
}


# --- greedy_step (docs/ops/greedy_step.md) -------------------------------------------------


def _chain_lens(t):
    return _i(t, "prefix_len").astype(np.int64) + _e(t, "tree_build.node_count") + 1


GREEDY_STEP: dict[str, Callable[[dict, dict], bool]] = {
    "q f32": lambda t, m: not _bf16(t),
    "q bf16": lambda t, m: _bf16(t),
    "K2 dims, bf16": lambda t, m: _k2(t) and _bf16(t),
    "bf16, L > 128 (3+ key tiles)": lambda t, m: _bf16(t) and (_chain_lens(t) > 128).any(),
    "bf16, a partial last tile past the second": lambda t, m: _bf16(t) and any(
        n > 128 and n % 64 for n in _chain_lens(t).tolist()),
    "tree_build status != 0 in the chain": lambda t, m: (_e(t, "tree_build.status") != 0).any(),
    "tree_accept status 4 in the chain": lambda t, m: (_e(t, "tree_accept.status") == 4).any(),
    "underfull tree (node_count < budget)": lambda t, m: (
        (_e(t, "tree_build.node_count") < _i(t, "budget")) & (_e(t, "tree_build.status") == 0)).any(),
    "finite q in padding rows": lambda t, m: any(
        int(n) + 1 < _i(t, "q").shape[1] and np.isfinite(_i(t, "q")[r, int(n) + 1:].astype(np.float64)).all()
        for r, n in enumerate(_e(t, "tree_build.node_count"))),
}

CLASSES = {"verify_attn": VERIFY_ATTN, "tree_build": TREE_BUILD, "tree_accept": TREE_ACCEPT,
           "greedy_step": GREEDY_STEP}


def committed(golden_dir: Path) -> dict[str, list[str]]:
    """op -> the committed golden files (relative names) that golden/MANIFEST.json lists."""
    manifest = json.loads((golden_dir / "MANIFEST.json").read_text())
    out: dict[str, list[str]] = {op: [] for op in CLASSES}
    for rel, entry in sorted(manifest["files"].items()):
        if entry.get("tier") == "committed" and entry["op"] in out:
            out[entry["op"]].append(rel)
    return out


def holders(golden_dir: Path, op: str, files: list[str]) -> dict[str, list[str]]:
    """class -> the goldens of ``files`` that reach it (every class of ``op``, empty lists included)."""
    found: dict[str, list[str]] = {name: [] for name in CLASSES[op]}
    for rel in files:
        g = kdtr.load(golden_dir / rel)
        t = {k: np.asarray(v) for k, v in g.tensors.items()}
        for name, pred in CLASSES[op].items():
            if pred(t, g.metadata):
                found[name].append(rel)
    return found


@pytest.fixture(scope="module")
def reached():
    gdir = ROOT / "golden"
    files = committed(gdir)
    return {op: holders(gdir, op, files[op]) for op in CLASSES}


@pytest.mark.parametrize("op", sorted(CLASSES))
def test_every_value_class_has_a_golden(op, reached):
    missing = [name for name, files in reached[op].items() if not files]
    assert not missing, f"{op}: no committed golden reaches {missing}"


def test_a_class_that_loses_its_last_golden_fails(reached):
    """Dropping the goldens that hold a class leaves it empty: the audit would name it."""
    gdir = ROOT / "golden"
    files = committed(gdir)
    for op, cls in (("verify_attn", "visibility bytes other than 0 and 1"), ("tree_build", "log-prob -0.0"),
                    ("tree_accept", "two children of the current slot carry the prediction"),
                    ("greedy_step", "bf16, L > 128 (3+ key tiles)"),
                    ("verify_attn", "+-inf raw scores in a 64-row block of valid rows, no NaN raw score"),
                    ("verify_attn", "split-KV: a range of a single key"),
                    ("verify_attn", "split-KV: +inf visible scores in one range only"),
                    ("tree_build",
                     "depth_limit * K > 256 with two defects in one thread's stripe, the lower status first")):
        holding = set(reached[op][cls])
        assert holding
        left = holders(gdir, op, [f for f in files[op] if f not in holding])
        assert left[cls] == [], (op, cls)
