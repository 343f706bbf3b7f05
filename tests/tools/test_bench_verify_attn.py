"""bench/bench_verify_attn.py: the roofline bound, % of bound and its per-kernel summary
(minimum, median, points at the target), the latency points' bounds, the sweep's time
estimate, and a dry run of the latency table and the sweep through the CPU binary (no GPU,
no torch: --ceilings, --binary-backend cpu, tiny dims)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from conftest import REPO_ROOT, op_binary
from timing import HANG_GUARD

BENCH = REPO_ROOT / "bench" / "bench_verify_attn.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_verify_attn", BENCH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_verify_attn"] = mod
    spec.loader.exec_module(mod)
    return mod


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=HANG_GUARD, cwd=REPO_ROOT
    )


def test_roofline_takes_the_larger_term(bench):
    # 1 TFLOP at 500 TFLOP/s = 2 ms; 1 GB at 1000 GB/s = 1 ms
    assert bench.roofline(1e12, 1e9, 500.0, 1000.0) == pytest.approx((2e-3, "compute"))
    assert bench.roofline(1e12, 4e9, 500.0, 1000.0) == pytest.approx((4e-3, "memory"))


def test_judged_time_is_the_graph_replay_where_measured(bench):
    assert bench.judged({"ms": 2.0, "graph_ms": 1.5}) == (1.5, "graph")
    assert bench.judged({"ms": 2.0, "graph_ms": None}) == (2.0, "stream")


def test_pct_summary_gives_min_median_and_the_points_at_target(bench):
    vals = [(0.2, "a"), (0.6, "b"), (0.5, "c")]
    assert bench.pct_summary(vals, 0.5) == "min 20.0% (a), median 50.0%, 2 of 3 at >= 50%"
    assert bench.pct_summary(vals, None) == "min 20.0% (a), median 50.0%"
    assert bench.pct_summary([], 0.5) == "no points"


def test_targets_are_the_issues(bench):
    assert bench.KERNEL_TARGETS == {"wgmma": 0.65, "mma": 0.45}
    assert bench.BOUND_TARGETS == {"wgmma": 0.50, "mma": 0.35}
    assert bench.latency_points(bench.LATENCY_POINTS) == [(1, 9, 4096, 15.0), (1, 65, 16384, 40.0)]


def test_latency_bounds_at_k2_dims(bench):
    """At 792.7 TFLOP/s and 4198 GB/s: B=1, T=9, prefix 4096 is about 6.6 us of tensor work
    (its 15 us target is above it); B=1, T=65, prefix 16384 about 188 us (its 40 us target
    is below the bound, which the table must say)."""
    bounds = {}
    for b, t, p, _us in bench.latency_points(bench.LATENCY_POINTS):
        c = bench.counts(bench.synth(bench.Problem(b, t, 64, 576, 512, p, "random", 7), "bf16"))
        bounds[(t, p)] = bench.roofline(c["qk_flop"] + c["pv_flop"], c["bytes"], 792.7, 4198.0)
    assert bounds[(9, 4096)][1] == "compute" and 6.0e-6 < bounds[(9, 4096)][0] < 7.0e-6
    assert bounds[(65, 16384)][1] == "compute" and 180e-6 < bounds[(65, 16384)][0] < 195e-6


def test_splits_follow_split_schedule(bench):
    assert bench.split_schedule is not None, "the bench must find kdtr.ops.verify_attn.split_schedule"
    assert bench.splits_of(4096, 9, 64, "wgmma") == 13
    assert bench.splits_of(16384, 65, 64, "mma") == 2
    assert bench.splits_of(4096, 9, 64, "simt") is None


def test_point_sizes_match_the_counts(bench):
    pt = bench.Point(64, 2, 9)
    sz = bench.point_sizes(pt, 2, 16, 8, 700.0, 4000.0)
    rng = __import__("numpy").random.default_rng(0)
    vis = __import__("numpy").stack([bench.visibility(bench.tree_parents(rng, 8, "random"), 9) for _ in range(2)])
    pool = bench.bf16_pool(1, 1 << 12)
    x = bench.sweep_inputs(pt, 2, 16, 8, bench.tiled(pool, 2 * 9 * 2 * 16, 0), bench.tiled(pool, 2 * 73 * 16, 0), vis)
    c = bench.counts(x)
    assert sz.min_bytes == c["bytes"]
    assert sz.flop == pytest.approx(c["qk_flop"] + c["pv_flop"], rel=0.1)


def test_graph_replay_is_in_the_estimate(bench):
    pt = bench.Point(4096, 8, 65)
    sizes = {pt: bench.point_sizes(pt, 64, 576, 512, 780.0, 4200.0)}
    plain = bench.chunk_estimate([pt], sizes, set(), ["wgmma", "mma"], 20)
    graph = bench.chunk_estimate([pt], sizes, {pt}, ["wgmma", "mma"], 20)
    assert plain["replays"] == 0 and graph["replays"] > 0
    assert graph["inputs"] == pytest.approx(2 * plain["inputs"])
    assert graph["total"] > plain["total"]


def test_estimate_predicts_the_budget_cut():
    r = _run("--sweep", "--estimate-only", "--ceilings", "780,51,4200", "--device", "cpu", "--time-budget", "60")
    assert r.returncode == 0, r.stderr
    assert "144 points x 2 kernels" in r.stdout
    line = next(s for s in r.stdout.splitlines() if s.startswith("time budget 60 s"))
    assert "of 144 points expected to run; the first point expected to be cut:" in line


def test_dry_run_prints_the_bound_summary_and_the_latency_verdicts(tmp_path):
    op_binary("verify_attn")
    out = tmp_path / "bench.md"
    # a bf16 ceiling of 1 MFLOP/s puts the first latency point's bound (about 0.06 s) above its
    # 15 us target; the second's target (1e9 us) is above its bound
    r = _run(
        "--latency",
        "--sweep",
        "--bin",
        str(REPO_ROOT / "build" / "bin" / "kdtr_verify_attn"),
        "--ceilings",
        "1e-6,1e-6,1e-3",
        "--binary-backend",
        "cpu",
        "--device",
        "cpu",
        "--heads",
        "2",
        "--dqk",
        "16",
        "--dv",
        "8",
        "--latency-points",
        "1,9,64,15;1,5,32,1e9",
        "--sweep-prefix",
        "16",
        "--sweep-batch",
        "1,2",
        "--sweep-t",
        "3",
        "--sweep-graph-us",
        "1e12",
        "--out",
        str(out),
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    text = out.read_text()
    assert "## verify_attn latency points (B=1)" in text
    assert "## verify_attn sweep: kernels over prefix_len x B x T, % of the roofline bound" in text
    assert "| B | T | prefix_len | kernel | key ranges | stream us | graph us | bound us (by) |" in text
    assert "missed, and the target is below the bound" in text
    assert "`cpu`: latency targets met at 1 of 2 points." in text
    assert "| prefix_len | B | T | kernel | key ranges | blocks | stream ms | graph ms |" in text
    assert "`auto`: 2 points (2 graph-replayed); % of bound (judged): min " in text
    assert ", median " in text and "stream-launched only: min " in text
    assert "Wall time " in text
