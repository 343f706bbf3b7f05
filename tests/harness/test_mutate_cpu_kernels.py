"""The CPU core's select build under the mutants: kdtr mutate judges tree_build's goldens
under the heap build (the cpu backend's auto) and under ``--kernel select``, whose output
names its build ``cpu_select`` (kdtr.run.process.forced_kernel_name)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import REPO_ROOT, golden_subset, op_binary
from kdtr import mutate as mut
from kdtr import run as runner
from kdtr.run.process import forced_kernel_name

GOLDEN = REPO_ROOT / "golden"


def test_the_forced_kernel_a_cpu_output_must_name():
    g = GOLDEN / "tree_build" / "default.kdtr"
    assert forced_kernel_name(runner.Case("tree_build", "default", g, "cpu", kernel="select")) == "cpu_select"
    assert forced_kernel_name(runner.Case("tree_build", "default", g, "cuda", kernel="select")) == "select"
    assert forced_kernel_name(runner.Case("tree_build", "default", g, "cpu")) is None


def test_mutate_plans_every_tree_build_golden_under_the_select_build_too():
    plan = mut.load_goldens(GOLDEN)
    tb = plan.cases["tree_build"]
    configs = {c.config for c in tb}
    assert {c.config for c in tb if c.kernel is None} == configs
    assert {c.config for c in tb if c.kernel == "select"} == configs
    assert all(c.backend == "cpu" for c in tb)
    assert "tree_build/default@cpu:select" in {c.id for c in tb}
    # no other op gets a forced kernel on the cpu backend (their CPU cores have one build)
    assert all(c.kernel is None for op, cases in plan.cases.items() if op != "tree_build" for c in cases)


@pytest.mark.parametrize("kernel, want", [("select", "cpu_select"), ("heap", "cpu_heap")])
def test_a_cpu_case_forced_to_a_build_passes_with_the_real_binary(tmp_path: Path, kernel: str, want: str):
    gdir = golden_subset(tmp_path, "tree_build", ["default"])
    case = runner.Case("tree_build", "default", gdir / "tree_build" / "default.kdtr", "cpu", kernel=kernel)
    found = runner.discover(gdir)
    vouched: dict = {}
    runner.check_manifest(gdir, found, vouched)
    cfg = runner.RunConfig(golden_dir=gdir, bin_dir=op_binary("tree_build").parent, out_dir=tmp_path / "out",
                           vouched=vouched)
    res = runner.run_case(case, cfg)
    assert res.status == runner.Status.PASS, res.reason
    assert res.detail.startswith(f"ran {want}"), res.detail
