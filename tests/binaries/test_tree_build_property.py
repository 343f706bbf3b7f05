"""Property test: build/bin/kdtr_tree_build equals the reference ``tree_build`` bit for bit,
for every build kernel (``--kernel heap``, ``--kernel select``, and the default ``auto``) on
every available backend (cpu always; cuda where ``nvidia-smi -L`` lists a GPU).

Each hypothesis example is one golden of up to 64 requests (so one binary run checks many
requests), built from per-request recipes: a family of log-prob rows, a budget, a depth
limit and an optional defect. The recipes are drawn by hypothesis (so a failure shrinks to
few, simple requests); the bulk values of a request come from numpy seeded by the recipe's
own seed (so a request does not change when others are shrunk away). Strategies:

* ``random``: drafter-like sorted rows, ``-abs(normal) * scale`` over scales 1e-6 .. 1e3 and
  softmax top-k of a gamma-distributed vocabulary slice (kdtr/generators/gen_tree_build_refs.py),
  D up to 8, K up to 32, N up to 300, budgets 0..N, depth limits 0..D.
* ``ties``: log-probs from small sets ({0, -0.5, -1, -2}, {0, -0.25}, {0, -0.0, ...}, all-zero
  rows, one negative value everywhere) and quantized rows: equal scores everywhere, so the
  rank-path tie-break decides.
* ``rounding``: the near-tie pools NEAR_TIE_TINY / NEAR_TIE_ORDINARY of the generator, runs
  of equal non-dyadic values (``(w - a) + a`` rounds away from w), rows with positive
  log-probs (a child outscores its parent: pop order is not score order), and extreme
  finite magnitudes (1e30, f32 max, f32 subnormals).
* ``invalid``: every family above with defects in half of the requests: NaN, +-inf,
  unsorted pair (by one ulp), duplicate id, negative id, budget or depth_limit out of range,
  several defects at once (the status order), defects only past the depth limit (valid),
  budget 0 with a defect (still validated); also D = 0 and K = 0.

Every strategy also mixes in an occasional defect. A mismatch names the tensor, the kernel
and backend (and the output metadata's kernel and select_fallbacks), the first differing
request with its inputs (exact float32 values) and both trees, and the golden file with a
command line that reruns it. Every run also checks that the output metadata ``kernel``
names the kernel asked for.

The deterministic tests run every committed golden/tree_build/*.kdtr (including
``near_ties`` and ``ties``) through each kernel and compare with its ``expected.*`` tensors,
and check that ``--kernel select`` builds the ordinary requests of the ``default`` golden
itself (``select_fallbacks`` below their number), so the property tests do reach the select
path (the select build hands ~20-30 % of the valid requests of ``ties`` and ``rounding`` to
the heap and none of ``random``, as measured when this test was written).

Examples per strategy: 25 (the environment variable KDTR_TREE_BUILD_EXAMPLES overrides it);
derandomized and database-free, so every run checks the same examples.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import kdtr
from conftest import REPO_ROOT, cuda_device_present, op_binary
from kdtr.generators.gen_tree_build_refs import NEAR_TIE_ORDINARY, NEAR_TIE_TINY, drafter_rows
from kdtr.ops.tree_build import OUTPUTS, STATUS_NAMES, tree_build

KERNELS = ("heap", "select", "auto")
MAX_EXAMPLES = int(os.environ.get("KDTR_TREE_BUILD_EXAMPLES", "25"))
MAX_B, MAX_D, MAX_K, MAX_N = 64, 8, 32, 300


HAS_CUDA = cuda_device_present()
BACKENDS = [
    pytest.param("cpu", id="cpu"),
    pytest.param("cuda", id="cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
        not HAS_CUDA, reason="no CUDA device (`nvidia-smi -L` lists no GPU): the cuda backend is not checked")]),
]

PROPERTY_SETTINGS = settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    phases=(Phase.explicit, Phase.generate, Phase.shrink),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)


@pytest.fixture(scope="module")
def binary() -> Path:
    return op_binary("tree_build")


# --- value pools -------------------------------------------------------------------------------

F32 = np.float32
TIE_POOLS = (
    (0.0, -0.5, -1.0, -2.0),
    (0.0, -0.25),
    (0.0,),  # all-zero rows: every score ties
    (0.0, -0.0, -0.25, -0.5, -1.0),  # -0.0 == 0.0
    (-1.0,),
    (-0.5, -1.5, -3.0),
)
# non-dyadic values: w - a + a is not w, and equal sums in different orders round differently
RUN_VALUES = F32([-0.1, -0.2, -0.3, -1.0 / 3.0, -0.7, -1.1, -1.7, -2.3])
# positive log-probs are allowed (finite and sorted is the whole contract): a child outscores its
# parent, a later sibling can outscore the whole subtree before it
POSITIVE_VALUES = F32([2.3, 1.7, 0.7, 0.3, 0.1, 1e-7, 1e-12, 1e-30, 1e-40, 0.0, -1e-12, -0.3, -0.7, -1.7])
EXTREME_VALUES = F32([3.4e38, 1e30, 1e10, 1.0, 1e-30, 1.4e-45, 0.0, -1.4e-45, -1e-30, -1.0, -1e10, -1e30, -3.4e38])
SIGNED_NEAR = np.concatenate([NEAR_TIE_TINY, -NEAR_TIE_TINY, NEAR_TIE_ORDINARY, -NEAR_TIE_ORDINARY]).astype(F32)

RANDOM_FAMILIES = tuple(("halfnormal", s) for s in (1.0, 1e-6, 1e-3, 0.05, 0.5, 3.0, 30.0, 1e3)) + (
    ("drafter", 0), ("uniform", 1.0), ("uniform", 20.0))
TIE_FAMILIES = tuple(("pool", i) for i in range(len(TIE_POOLS))) + (
    ("quantized", 0.5), ("quantized", 0.125), ("quantized", 2.0 ** -10))
ROUND_FAMILIES = (("near", 0), ("near", 1), ("near", 2), ("runs", 2), ("runs", 3), ("runs", 5),
                  ("positive", 0), ("shifted", 0.5), ("shifted", 3.0), ("signed_near", 0), ("extreme", 0))
ALL_FAMILIES = RANDOM_FAMILIES + TIE_FAMILIES + ROUND_FAMILIES

DEFECTS = ("nan", "posinf", "neginf", "unsorted", "duplicate", "negative", "budget", "depth_limit", "several",
           "past_limit", "budget0_nan")


def _sorted_rows(vals: np.ndarray) -> np.ndarray:
    """Rows sorted non-increasing (stable on equal values, -0.0 and 0.0 keep their order)."""
    return np.take_along_axis(vals, np.argsort(-vals, axis=-1, kind="stable"), axis=-1).astype(F32)


def _rows(rng: np.random.Generator, d: int, k: int, family: tuple) -> np.ndarray:
    """float32 [d, k] log-prob rows, sorted non-increasing and finite."""
    name, arg = family
    if d == 0 or k == 0:
        return np.zeros((d, k), F32)
    if name == "halfnormal":
        vals = -np.abs(rng.standard_normal((d, k))) * arg
    elif name == "drafter":
        return drafter_rows(rng, 1, d, k)[0][0]
    elif name == "uniform":
        vals = -rng.uniform(0.0, arg, (d, k))
    elif name == "pool":
        pool = np.array(TIE_POOLS[arg], F32)
        vals = rng.choice(pool, (d, k), p=rng.dirichlet(np.ones(len(pool))))
    elif name == "quantized":
        vals = np.round(-np.abs(rng.standard_normal((d, k))) * rng.choice([0.5, 2.0, 8.0]) / arg) * arg
    elif name == "near":  # the generator's three near_ties families (gen_tree_build_refs._near_tie_rows)
        def one(n_tiny: int) -> np.ndarray:
            n_tiny = min(n_tiny, k)
            return np.concatenate([rng.choice(NEAR_TIE_TINY, n_tiny), rng.choice(NEAR_TIE_ORDINARY, k - n_tiny)])

        if arg == 0:
            vals = np.tile(one(int(rng.integers(1, k + 1))), (d, 1))
        elif arg == 1:
            vals = np.stack([one(int(rng.integers(1, k + 1))) for _ in range(d)])
        else:
            vals = np.stack([one(2) for _ in range(d)])
    elif name == "runs":  # few distinct non-dyadic values: long runs of equal adjacent log-probs
        vals = np.stack([rng.choice(rng.choice(RUN_VALUES, arg, replace=False), k) for _ in range(d)])
    elif name == "positive":
        vals = rng.choice(POSITIVE_VALUES, (d, k))
    elif name == "shifted":  # drafter-like rows moved up: most log-probs positive
        vals = arg - np.abs(rng.standard_normal((d, k)))
    elif name == "signed_near":
        vals = rng.choice(SIGNED_NEAR, (d, k))
    elif name == "extreme":
        vals = rng.choice(EXTREME_VALUES, (d, k))
    else:
        raise AssertionError(family)
    return _sorted_rows(np.asarray(vals, F32))


@dataclass(frozen=True)
class Req:
    """One request's recipe; its arrays come from numpy seeded by ``seed``."""

    seed: int
    budget: int
    depth_limit: int
    family: tuple
    tile: bool  # the same row at every depth: many different rank paths with equal scores
    defect: str | None


@dataclass(frozen=True)
class Batch:
    d: int
    k: int
    n: int
    reqs: tuple


def _defects(percent: int) -> st.SearchStrategy:
    """None (shrinks there) or a defect, the latter in about ``percent`` % of the draws."""
    return st.tuples(st.integers(0, 99), st.sampled_from(DEFECTS)).map(
        lambda t: t[1] if t[0] >= 100 - percent else None)


@st.composite
def batches(draw, families: tuple, defect_percent: int, min_dk: int = 1) -> Batch:
    d = draw(st.integers(min_dk, MAX_D))
    k = draw(st.integers(min_dk, MAX_K))
    n = draw(st.integers(0, MAX_N))
    b = draw(st.integers(1, MAX_B))
    req = st.builds(
        Req,
        seed=st.integers(0, 2**32 - 1),
        budget=st.one_of(st.integers(0, n), st.sampled_from(sorted({0, 1, n}))),
        depth_limit=st.one_of(st.just(d), st.integers(0, d)),  # the full depth half the time
        family=st.sampled_from(families),
        tile=st.booleans(),
        defect=_defects(defect_percent),
    )
    return Batch(d, k, n, tuple(draw(st.lists(req, min_size=b, max_size=b))))


def _apply_defect(rng, lp, ids, budget, depth_limit, d, k, n, defect):
    """Plant ``defect`` in one request; returns (budget, depth_limit)."""
    checked = depth_limit if 0 < depth_limit <= d else d

    def row(lo: int, hi: int) -> int | None:
        return int(rng.integers(lo, hi)) if hi > lo else None

    def plant(kind: str, j: int | None) -> None:
        if j is None or k == 0:
            return
        r = int(rng.integers(0, k))
        if kind == "nan":
            lp[j, r] = np.nan
        elif kind == "posinf":
            lp[j, r] = np.inf
        elif kind == "neginf":
            lp[j, r] = -np.inf
        elif kind == "unsorted" and k > 1:  # the smallest possible violation: one ulp
            r = min(r, k - 2)
            lp[j, r + 1] = np.nextafter(lp[j, r], F32(np.inf))
        elif kind == "duplicate" and k > 1:
            r2 = (r + 1 + int(rng.integers(0, k - 1))) % k
            ids[j, r2] = ids[j, r]
        elif kind == "negative":
            ids[j, r] = -1 - int(rng.integers(0, 3))

    row_kinds = ("nan", "posinf", "neginf", "unsorted", "duplicate", "negative")
    if defect in row_kinds:
        plant(defect, row(0, checked))
    elif defect == "budget":
        budget = n + 1 + int(rng.integers(0, 3)) if rng.random() < 0.5 else -1 - int(rng.integers(0, 3))
    elif defect == "depth_limit":
        depth_limit = d + 1 if rng.random() < 0.5 else -1
    elif defect == "several":
        for _ in range(int(rng.integers(2, 4))):
            plant(str(rng.choice(row_kinds)), row(0, checked))
        if rng.random() < 0.25:
            budget = n + 1
        if rng.random() < 0.25:
            depth_limit = d + 1
    elif defect == "past_limit":  # rows the builder never reads: must not count
        for _ in range(int(rng.integers(1, 3))):
            plant(str(rng.choice(row_kinds)), row(depth_limit, d))
    elif defect == "budget0_nan":
        budget = 0
        plant("nan", row(0, checked))
    return budget, depth_limit


def make_inputs(batch: Batch) -> dict[str, np.ndarray]:
    b, d, k, n = len(batch.reqs), batch.d, batch.k, batch.n
    lp = np.zeros((b, d, k), F32)
    ids = np.zeros((b, d, k), np.int64)
    root = np.zeros(b, np.int64)
    budget = np.zeros(b, np.int32)
    limit = np.zeros(b, np.int32)
    for i, q in enumerate(batch.reqs):
        rng = np.random.default_rng(q.seed)
        lp[i] = _rows(rng, d, k, q.family)
        if q.tile and d > 1:
            lp[i] = lp[i, :1]
        vocab = int(rng.integers(max(k, 1), 4 * k + 17))
        for j in range(d):
            ids[i, j] = rng.permutation(vocab)[:k]  # distinct per row; token 0 now and then
        root[i] = rng.integers(0, vocab)
        bud, dl = q.budget, q.depth_limit
        if q.defect is not None:
            bud, dl = _apply_defect(rng, lp[i], ids[i], bud, dl, d, k, n, q.defect)
        budget[i], limit[i] = bud, dl
    return {"top_log_probs": lp, "top_token_ids": ids, "root_token_ids": root, "budget": budget, "depth_limit": limit}


# --- running and comparing -----------------------------------------------------------------------


def run_binary(binary: Path, golden: Path, out: Path, backend: str,
               kernel: str | None) -> tuple[dict[str, np.ndarray], dict]:
    """(outputs, metadata) of one run; the metadata's ``kernel`` must name the kernel asked for
    (cpu_heap / cpu_select on the CPU backend, heap / select on CUDA)."""
    args = [str(binary), "--input", str(golden), "--output", str(out), "--backend", backend]
    if kernel is not None:
        args += ["--kernel", kernel]
    r = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{shlex.join(args)}: exit {r.returncode}\n{r.stderr}"
    with kdtr.load(out) as f:
        tensors = {name: np.array(v) for name, v in f.tensors.items()}
        meta = dict(f.metadata)
    if kernel in ("heap", "select"):
        want = f"cpu_{kernel}" if backend == "cpu" else kernel
        assert meta.get("kernel") == want, \
            f"{shlex.join(args)}: output metadata kernel {meta.get('kernel')!r}, not {want!r}"
    return tensors, meta


def _fmt(a: np.ndarray) -> str:
    if a.dtype == np.float32:  # shortest repr that round-trips in float32
        return np.array2string(a, floatmode="unique", separator=", ", max_line_width=160, threshold=10**6)
    return np.array2string(a, separator=", ", max_line_width=160, threshold=10**6)


def describe_mismatch(name: str, expected: dict, got: dict, inputs: dict, what: str, golden: Path | None) -> str:
    e, g = expected[name], got[name]
    nb = e.shape[0]
    differs = (e != g).reshape(nb, -1).any(axis=1)
    bad = np.flatnonzero(differs)
    b = int(bad[0])
    lines = [f"tree_build output {name!r} differs from the reference ({what}): {bad.size} of {nb} requests, "
             f"first request {b} (all: {bad[:20].tolist()}{' ...' if bad.size > 20 else ''})"]
    if golden is not None:
        lines.append(f"golden: {golden}")
    lp, ids = inputs["top_log_probs"][b], inputs["top_token_ids"][b]
    lines.append(f"request {b}: budget={int(inputs['budget'][b])} depth_limit={int(inputs['depth_limit'][b])} "
                 f"root_token_id={int(inputs['root_token_ids'][b])} N={expected['node_token_ids'].shape[1] - 1} "
                 f"D={lp.shape[0]} K={lp.shape[1] if lp.ndim > 1 else '?'}; status expected "
                 f"{int(expected['status'][b])} ({STATUS_NAMES.get(int(expected['status'][b]))}), got "
                 f"{int(got['status'][b])}; node_count expected {int(expected['node_count'][b])}, got "
                 f"{int(got['node_count'][b])}")
    for j in range(lp.shape[0]):
        lines.append(f"  top_log_probs[{b}][{j}] = {_fmt(lp[j])}")
        lines.append(f"  top_token_ids[{b}][{j}] = {_fmt(ids[j])}")
    if name == "visibility":
        i, j = (int(x) for x in np.argwhere(e[b] != g[b])[0])
        lines.append(f"  visibility[{b}][{i}][{j}]: expected {int(e[b, i, j])}, got {int(g[b, i, j])}")
        lines.append(f"  expected row {i}: {_fmt(e[b, i])}\n  got row {i}:      {_fmt(g[b, i])}")
    elif e.ndim == 1:
        lines.append(f"  {name}[{b}]: expected {e[b]}, got {g[b]}")
    else:
        first = int(np.flatnonzero(e[b] != g[b])[0])
        lines.append(f"  {name}[{b}]: first difference at slot {first}: expected {e[b, first]}, got {g[b, first]}")
    shown = min(e.shape[1] if e.ndim > 1 else 1,
                max(int(expected["node_count"][b]), int(np.clip(got["node_count"][b], 0, 10**6))) + 1, 80)
    for t in ("node_token_ids", "node_depths", "parents", "next_token", "next_sibling"):
        if t in expected and t in got and expected[t].ndim == 2 and got[t].shape == expected[t].shape:
            lines.append(f"  expected {t}[{b}][:{shown}] = {_fmt(expected[t][b, :shown])}")
            lines.append(f"  got      {t}[{b}][:{shown}] = {_fmt(got[t][b, :shown])}")
    return "\n".join(lines)


def assert_outputs_equal(expected: dict, got: dict, inputs: dict, what: str, golden: Path | None = None) -> None:
    """Every output tensor: same names in the same order, same dtype and shape, equal elements."""
    assert list(got) == list(expected), f"{what}: output tensors {list(got)}, expected {list(expected)}"
    for name in expected:
        e, g = expected[name], got[name]
        assert g.dtype == e.dtype, f"{what}: {name} has dtype {g.dtype}, expected {e.dtype}"
        assert g.shape == e.shape, f"{what}: {name} has shape {g.shape}, expected {e.shape}"
    for name in expected:
        if not np.array_equal(expected[name], got[name]):
            raise AssertionError(describe_mismatch(name, expected, got, inputs, what, golden))


def check_batch(binary: Path, backend: str, batch: Batch, tmp_path: Path, label: str,
                kernels: tuple = KERNELS) -> None:
    inputs = make_inputs(batch)
    expected = tree_build(**inputs, n_max=batch.n, on_invalid="status").as_dict()
    golden = tmp_path / f"{label}.kdtr"
    kdtr.save(golden, {f"input.{k}": v for k, v in inputs.items()},
              {"op": "tree_build", "config": f"property_{label}", "max_budget": batch.n})
    for kernel in kernels:
        out = tmp_path / f"{label}.{backend}.{kernel}.out.kdtr"
        got, meta = run_binary(binary, golden, out, backend, kernel)
        rerun = (f"build/bin/kdtr_tree_build --input {golden} --output /tmp/o.kdtr --backend {backend}"
                 + (f" --kernel {kernel}" if kernel else ""))
        ran = f"ran {meta.get('kernel')}" + (f", select_fallbacks {meta['select_fallbacks']}"
                                            if "select_fallbacks" in meta else "")
        assert_outputs_equal(expected, got, inputs, f"--backend {backend} --kernel {kernel}, {ran}; rerun: {rerun}",
                             golden)


# --- the properties ------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@PROPERTY_SETTINGS
@given(batch=batches(RANDOM_FAMILIES, defect_percent=5))
def test_binary_equals_reference_random(binary, backend, batch, tmp_path):
    check_batch(binary, backend, batch, tmp_path, "random")


@pytest.mark.parametrize("backend", BACKENDS)
@PROPERTY_SETTINGS
@given(batch=batches(TIE_FAMILIES, defect_percent=5))
def test_binary_equals_reference_ties(binary, backend, batch, tmp_path):
    check_batch(binary, backend, batch, tmp_path, "ties")


@pytest.mark.parametrize("backend", BACKENDS)
@PROPERTY_SETTINGS
@given(batch=batches(ROUND_FAMILIES, defect_percent=5))
def test_binary_equals_reference_rounding(binary, backend, batch, tmp_path):
    check_batch(binary, backend, batch, tmp_path, "rounding")


@pytest.mark.parametrize("backend", BACKENDS)
@PROPERTY_SETTINGS
@given(batch=batches(ALL_FAMILIES, defect_percent=50, min_dk=0))
def test_binary_equals_reference_invalid(binary, backend, batch, tmp_path):
    check_batch(binary, backend, batch, tmp_path, "invalid")


# --- the committed goldens, deterministically ---------------------------------------------------

GOLDEN_DIR = REPO_ROOT / "golden" / "tree_build"
GOLDENS = sorted(p.stem for p in GOLDEN_DIR.glob("*.kdtr"))


def test_near_ties_and_ties_goldens_are_committed():
    assert {"near_ties", "ties"} <= set(GOLDENS)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("config", GOLDENS)
def test_golden_expected_outputs_per_kernel(binary, tmp_path, config, kernel, backend):
    golden = GOLDEN_DIR / f"{config}.kdtr"
    with kdtr.load(golden) as g:
        inputs = {k[len("input."):]: np.array(v) for k, v in g.tensors.items() if k.startswith("input.")}
        expected = {k[len("expected."):]: np.array(v) for k, v in g.tensors.items() if k.startswith("expected.")}
    assert list(expected) == list(OUTPUTS)
    got, meta = run_binary(binary, golden, tmp_path / "out.kdtr", backend, kernel)
    assert_outputs_equal(expected, got, inputs, f"golden {config} --backend {backend} --kernel {kernel} "
                         f"(ran {meta.get('kernel')}, select_fallbacks {meta.get('select_fallbacks', '-')})", golden)


@pytest.mark.parametrize("backend", BACKENDS)
def test_select_kernel_builds_ordinary_requests_itself(binary, tmp_path, backend):
    """The property tests check the select path only if it runs: on the drafter-like
    ``default`` golden (distinct random log-probs, no ties) it must not hand every request
    to the heap build (output metadata ``select_fallbacks``, test_tree_build.cu)."""
    golden = GOLDEN_DIR / "default.kdtr"
    got, meta = run_binary(binary, golden, tmp_path / "out.kdtr", backend, "select")
    built = int(((got["status"] == 0) & (got["node_count"] > 0)).sum())
    assert built > 0
    assert "select_fallbacks" in meta, f"no select_fallbacks in the output metadata {meta}"
    assert 0 <= int(meta["select_fallbacks"]) < built, (meta, built)


@pytest.mark.parametrize("bad", ["fast", "", "SELECT", "heap,select"])
def test_unknown_kernel_is_a_usage_error(binary, tmp_path, bad):
    """--kernel other than auto/heap/select: exit 2, one line naming the option, no output."""
    out = tmp_path / "o.kdtr"
    r = subprocess.run([str(binary), "--input", str(GOLDEN_DIR / "default.kdtr"), "--output", str(out),
                        "--kernel", bad], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "--kernel must be auto, heap or select" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_cpu_auto_kernel_is_the_heap_build(binary, tmp_path):
    """On the CPU, auto runs the heap build (metadata kernel cpu_heap, no select_fallbacks)."""
    out = tmp_path / "o.kdtr"
    r = subprocess.run([str(binary), "--input", str(GOLDEN_DIR / "default.kdtr"), "--output", str(out),
                        "--backend", "cpu"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    meta = kdtr.load(out).metadata
    assert meta["kernel"] == "cpu_heap" and "select_fallbacks" not in meta
