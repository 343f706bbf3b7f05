"""The committed GPU catalogue (mutants/gpu/<kernel>.toml, docs/mutation.md "GPU catalogue"):
every target kernel has its file with at least 12 mutants, every entry loads under the GPU
schema (backend = "cuda", kernel = the file's stem, op an op) and still applies to today's
code (its `find` text occurs exactly once in its file), so a refactor of a kernel that
breaks an entry fails the suite until the entry is updated with the code."""

from __future__ import annotations

import pytest

from conftest import REPO_ROOT
from kdtr import mutate as mut

# The target kernels (docs/mutation.md, "GPU catalogue"): tree_build's select kernel, heap
# kernel path and visibility; verify_attn's simt, mma and wgmma kernels; tree_accept's
# kernel; the host launch code and glue; verify_attn's split-KV code (mutants/gpu/split.toml);
# ddtree_decode's device loop (mutants/gpu/decode.toml).
KERNELS = ("select", "heap", "visibility", "simt", "mma", "wgmma", "tree_accept", "launch", "split", "decode")
MIN_PER_KERNEL = 12
GPU_DIR = REPO_ROOT / mut.GPU_CATALOGUE_DIR


def test_every_target_kernel_has_its_catalogue_file():
    have = sorted(p.stem for p in GPU_DIR.glob("*.toml"))
    assert sorted(KERNELS) == have


@pytest.fixture(scope="module")
def gpu_mutants():
    return mut.load_gpu_catalogue(REPO_ROOT)  # raises, naming file, entry and field, on any bad entry


@pytest.mark.parametrize("kernel", KERNELS)
def test_each_kernel_has_at_least_12_mutants(gpu_mutants, kernel):
    n = sum(m.kernel == kernel for m in gpu_mutants)
    assert n >= MIN_PER_KERNEL, f"mutants/gpu/{kernel}.toml: {n} mutants, fewer than {MIN_PER_KERNEL}"


def test_every_gpu_mutant_applies_to_todays_code(gpu_mutants):
    for m in gpu_mutants:
        text = (REPO_ROOT / m.file).read_text()
        assert text.count(m.find) == 1, m.id
        assert m.apply(text) != text, m.id


def test_every_gpu_mutant_carries_the_gpu_fields(gpu_mutants):
    assert len({m.id for m in gpu_mutants}) == len(gpu_mutants)
    for m in gpu_mutants:
        assert m.backend == "cuda" and m.kernel in KERNELS, m.id
        assert m.id == f"gpu/{m.kernel}/{m.id.rsplit('/', 1)[1]}", m.id
        assert m.op in mut.OPS and m.file.startswith("cuda_tests/"), m.id
        assert m.bug.strip() and m.origin.strip(), m.id


def test_the_cpu_catalogue_does_not_load_the_gpu_files():
    assert all(m.backend == "cpu" and not m.id.startswith("gpu/") for m in mut.load_catalogue(REPO_ROOT))
