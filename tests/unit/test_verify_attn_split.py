"""The split-KV schedule of the mma and wgmma kernels, as mirrored in Python
(kdtr.ops.verify_attn.split_schedule; docs/ops/verify_attn.md, "Split-KV";
verify_attn_split in cuda_tests/kernels/verify_attn.cuh): the plan's examples, the
properties every schedule has, and the refusal of bad input.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from kdtr.ops.verify_attn import split_schedule

TILE = 64  # keys per key tile, query rows per block
MAX_SPLITS = 16
MIN_KEYS = 256  # 4 key tiles per split at least (all but the last)
TARGET_BLOCKS = 128

lengths = st.integers(0, 70_000)
heads = st.integers(1, 128)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# (prefix_len, tree_len, H) -> the ranges (the plan's examples and the edges around them).
EXAMPLES = {
    (256, 1, 1): [(0, 256), (256, 257)],  # a split holding a single key
    (255, 2, 1): [(0, 256), (256, 257)],
    (256, 0, 1): [(0, 256)],  # no query row: one range, never split
    (0, 0, 1): [],
    (0, 0, 64): [],
    (0, 1, 1): [(0, 1)],
    (255, 1, 1): [(0, 256)],  # L = 256: 4 tiles, not split
    (512, 9, 2): [(0, 256), (256, 512), (512, 521)],  # a split ending at the prefix
    (0, 129, 64): [(0, 129)],  # 129 row tiles: one range
    (0, 257, 2): [(0, 256), (256, 257)],  # 9 row tiles, want 15
}


@pytest.mark.parametrize(("args", "ranges"), sorted(EXAMPLES.items()))
def test_examples(args, ranges):
    assert split_schedule(*args) == ranges


def test_plan_examples():
    r = split_schedule(4096, 9, 64)  # 13 splits of 320 keys, the last 265
    assert len(r) == 13
    assert all(b - a == 320 for a, b in r[:-1]) and r[-1] == (12 * 320, 4105)
    assert r[-1][1] - r[-1][0] == 265
    r = split_schedule(16384, 65, 64)  # 65 row tiles: want 2, two splits of 129 tiles
    assert r == [(0, 129 * 64), (129 * 64, 16449)]
    assert split_schedule(0, 129, 64) == [(0, 129)]
    assert split_schedule(256, 1, 1) == [(0, 256), (256, 257)]


def test_the_most_splits():
    # 8 row tiles or fewer: 16 splits once the keys fill 16 x 4 tiles
    assert len(split_schedule(32768, 8, 64)) == 16
    assert len(split_schedule(32768, 9, 64)) == 15  # 9 row tiles: want ceil(128 / 9) = 15
    assert len(split_schedule(3840, 1, 1)) == 16  # 16 splits of 4 tiles, the last one key
    assert split_schedule(3840, 1, 1)[-1] == (3840, 3841)
    assert len(split_schedule(10**6, 1, 1)) == 16


@given(lengths, lengths, heads)
@example(256, 1, 1)
@example(0, 0, 1)
@example(4096, 9, 64)
@example(127 * 64, 1, 1)
@example(0, 128, 64)
@example(0, 8192, 1)
@example(0, 8191, 1)
def test_properties(prefix_len, tree_len, h):
    ranges = split_schedule(prefix_len, tree_len, h)
    n_keys = prefix_len + tree_len
    row_tiles = ceil_div(tree_len * h, TILE)
    if n_keys == 0:
        assert ranges == []
        return
    # contiguous cover of [0, L), every range non-empty
    assert ranges[0][0] == 0 and ranges[-1][1] == n_keys
    assert all(a < b for a, b in ranges)
    assert all(ranges[i][1] == ranges[i + 1][0] for i in range(len(ranges) - 1))
    assert 1 <= len(ranges) <= MAX_SPLITS
    sizes = [b - a for a, b in ranges]
    if len(ranges) > 1:
        # every range but the last: the same whole number of key tiles, at least 4 of them;
        # the last holds the rest (1 key at least, no more than the others)
        assert len(set(sizes[:-1])) == 1
        assert sizes[0] % TILE == 0 and sizes[0] >= MIN_KEYS
        assert 1 <= sizes[-1] <= sizes[0]
        assert row_tiles * len(ranges) < TARGET_BLOCKS + row_tiles  # splits <= ceil(128 / row tiles)
        assert n_keys > MIN_KEYS
    if row_tiles >= TARGET_BLOCKS or row_tiles == 0 or n_keys <= MIN_KEYS:
        assert ranges == [(0, n_keys)]
    # the formula of the plan, written out
    want = min(MAX_SPLITS, ceil_div(TARGET_BLOCKS, row_tiles)) if row_tiles else 1
    tiles = max(4, ceil_div(ceil_div(n_keys, TILE), want))
    if row_tiles:
        assert len(ranges) == ceil_div(ceil_div(n_keys, TILE), tiles)
    # boundaries on key-tile edges: a split starts where a 64-key tile does
    assert all(a % TILE == 0 for a, _ in ranges)


@given(lengths, lengths, heads, st.integers(0, 70_000), heads)
def test_depends_on_the_key_count_and_row_tiles_only(prefix_len, tree_len, h, tree_len2, h2):
    """Nothing but L = prefix_len + tree_len and ceil(tree_len H / 64) decides the ranges
    (never the batch, the device or the other requests: the function takes nothing else)."""
    n_keys = prefix_len + tree_len
    tree_len2 = min(tree_len2, n_keys)
    a = split_schedule(prefix_len, tree_len, h)
    assert a == split_schedule(prefix_len, tree_len, h)  # the same on every call
    b = split_schedule(n_keys - tree_len2, tree_len2, h2)
    if ceil_div(tree_len * h, TILE) == ceil_div(tree_len2 * h2, TILE):
        assert a == b


@given(lengths, st.integers(1, 70_000), heads)
def test_more_rows_never_split_more(prefix_len, tree_len, h):
    """Fewer splits as the row tiles grow (the split fills the GPU only where rows do not)."""
    n = len(split_schedule(prefix_len, tree_len, h))
    assert len(split_schedule(prefix_len, tree_len, h + 1)) <= n
    if tree_len * h >= TARGET_BLOCKS * TILE - TILE + 1:
        assert n == 1


@pytest.mark.parametrize(("args", "field"), [((-1, 5, 1), "prefix_len -1"), ((0, -1, 1), "tree_len -1"),
                                             ((3, 4, 0), "H 0"), ((3, 4, -2), "H -2"),
                                             ((-5, -5, 0), "prefix_len -5")])
def test_bad_input_raises(args, field):
    with pytest.raises(ValueError, match=field):
        split_schedule(*args)


def test_keys_per_split_shrink_to_four_tiles_then_splits_drop():
    """At one row tile (want 16): 4 tiles per split up to 64 key tiles, then more tiles per
    split at 16 splits."""
    for key_tiles in range(1, 200):
        n_keys = key_tiles * TILE
        r = split_schedule(n_keys - 1, 1, 1)
        tiles = max(4, math.ceil(key_tiles / 16))
        assert len(r) == math.ceil(key_tiles / tiles), key_tiles
        assert r[0][1] == min(tiles * TILE, n_keys)
