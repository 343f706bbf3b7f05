"""The op registry (kdtr.ops.OPS) and the configuration registry (kdtr.generators.REGISTRY):
the committed goldens meet their op's spec and reference, the core of kdtr/ never imports
kdtr.generators or kdtr.cli, and a toy fifth op added through the registries alone goes through
regen, `kdtr run` (with a fake binary) and the reports (docs/adding-an-op.md)."""

from __future__ import annotations

import json
import re
import stat
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass

import numpy as np
import pytest
from click.testing import CliRunner

import kdtr
import kdtr.generators
from kdtr import goldens
from kdtr.cli.main import main
from kdtr.contract import Contract
from kdtr.generators.golden import package
from kdtr.ops import OPS, OpSpec, TensorSpec, exact, register_op, unregister_op
from kdtr.registry import Registry

# the core (every module of kdtr/ outside kdtr/generators and kdtr/cli) never imports those two
IMPORT_RE = re.compile(
    r"^\s*(from|import) (kdtr\.(generators|cli)\b|kdtr import (generators|cli)\b|\.+(generators|cli)\b)"
)


def test_no_module_under_kdtr_imports_generators_or_runners(repo_root):
    bad = [f"{p.relative_to(repo_root)}:{i}: {line.strip()}"
           for p in sorted((repo_root / "kdtr").rglob("*.py"))
           if p.parent.name not in ("generators", "cli")
           for i, line in enumerate(p.read_text().splitlines(), 1) if IMPORT_RE.match(line)]
    assert not bad, bad
    code = ("import sys, kdtr, kdtr.goldens, kdtr.run, kdtr.report, kdtr.registry, kdtr.ops; "
            "bad = sorted(m for m in sys.modules if m.split('.')[:2] in (['kdtr', 'generators'], ['kdtr', 'cli'])); "
            "assert not bad, bad")
    p = subprocess.run([sys.executable, "-c", code], cwd=repo_root, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr


def test_the_generators_register_every_op():
    assert kdtr.generators.REGISTRY.ops() == ["tree_accept", "tree_build", "verify_attn", "greedy_step",
                                              "ddtree_decode"]
    assert set(kdtr.generators.REGISTRY.ops()) == set(OPS)
    for op_configs in kdtr.generators.REGISTRY.entries():
        assert op_configs.spec is OPS[op_configs.op]


def test_every_committed_golden_meets_its_op_spec_and_reference(repo_root):
    """The spec (names, dtypes, named dims, default contracts where the golden has no
    tolerance of its own) and ``reference`` of each op reproduce every committed golden."""
    paths = sorted((repo_root / "golden").glob("*/*.kdtr"))
    assert {p.parent.name for p in paths} == set(OPS)
    for path in paths:
        with kdtr.load(path) as g:
            spec = OPS[g.metadata["op"]]
            dims = spec.check(g.tensors)
            assert "B" in dims, path
            inputs = {k[len("input."):]: v for k, v in g.tensors.items() if k.startswith("input.")}
            out = spec.reference(inputs, {k: g.metadata[k] for k in spec.metadata})
            assert list(out) == list(spec.output_names), path
            for name, arr in out.items():
                want = g.tensors[f"expected.{name}"]
                assert (arr.dtype, arr.shape) == (want.dtype, want.shape), (path, name)
                assert arr.tobytes() == want.tobytes(), (path, name)
                if spec.outputs[spec.output_names.index(name)].contract.kind == "exact":
                    assert Contract.from_metadata(g.metadata, name).kind == "exact", (path, name)


def test_the_spec_check_names_the_tensor():
    spec = OPS["tree_accept"]
    b, t = 2, 5
    tensors = {"input.node_token_ids": np.zeros((b, t), np.int64), "input.next_token": np.zeros((b, t), np.int32),
               "input.next_sibling": np.zeros((b, t), np.int32), "input.node_count": np.zeros(b, np.int32),
               "input.target_predict": np.zeros((b, t), np.int64)}
    tensors.update({f"expected.{k}": v for k, v in spec.reference(
        {k[6:]: v for k, v in tensors.items()}, {}).items()})
    assert spec.check(tensors) == {"B": b, "T": t}
    with pytest.raises(ValueError, match="input.next_token: dtype i64"):
        spec.check(dict(tensors, **{"input.next_token": np.zeros((b, t), np.int64)}))
    with pytest.raises(ValueError, match="input.node_count: dim B = 3"):
        spec.check(dict(tensors, **{"input.node_count": np.zeros(3, np.int32)}))
    with pytest.raises(ValueError, match="'expected.bonus' is not in the op's spec"):
        spec.check(dict(tensors, **{"expected.bonus": np.zeros(b, np.int64)}))
    with pytest.raises(ValueError, match="'expected.status' missing"):
        spec.check({k: v for k, v in tensors.items() if k != "expected.status"})


def test_the_registries_refuse_what_they_cannot_serve():
    reg = Registry()
    cfg = ToyConfig("one row", 1, 1, 4)
    with pytest.raises(ValueError, match="no such op"):
        reg.register("no_such_op", {"a": cfg}, lambda name: ({}, {}))
    reg.register("tree_accept", {"a": cfg}, lambda name: ({}, {}))
    with pytest.raises(ValueError, match="registered already"):
        reg.register("tree_accept", {}, lambda name: ({}, {}))
    with pytest.raises(ValueError, match="int seed and a str description"):
        Registry().register("tree_accept", {"b": object()}, lambda name: ({}, {}))
    with pytest.raises(ValueError, match="registered already"):
        register_op(OPS["tree_accept"])
    with pytest.raises(ValueError, match="no default contract"):
        OpSpec("x", (), (TensorSpec("y", "f32", ("B",)),), lambda i, m: {})
    with pytest.raises(ValueError, match="not a KDTR dtype"):
        TensorSpec("y", "f33", ("B",))
    with pytest.raises(KeyError):
        reg.generate("tree_accept", "b")
    assert kdtr.generators.REGISTRY.subset("tree_accept/ch*", "verify_attn").all_configs() == (
        [("tree_accept", "chain")] + [("verify_attn", c) for c in kdtr.generators.REGISTRY.configs("verify_attn")])


# --- a toy fifth op, added through the registries alone -------------------------------

TOY = "toy_axpy"


def toy_reference(inputs, metadata):
    """out = alpha * x + y in f32; argmax of out per row (the first one on ties)."""
    out = (inputs["alpha"] * inputs["x"] + inputs["y"]).astype(np.float32)
    return {"out": out, "argmax": np.argmax(out, axis=1).astype(np.int32)}


TOY_SPEC = OpSpec(
    name=TOY,
    description="a toy elementwise op: out = alpha * x + y",
    inputs=(TensorSpec("x", "f32", ("B", "N")), TensorSpec("y", "f32", ("B", "N")), TensorSpec("alpha", "f32", ())),
    outputs=(TensorSpec("out", "f32", ("B", "N"), Contract("allclose", atol=1e-6, rtol=1e-6)),
             exact("argmax", "i32", ("B",))),
    reference=toy_reference,
)


@dataclass(frozen=True)
class ToyConfig:
    description: str
    seed: int
    batch: int
    n: int


TOY_CONFIGS = {"small": ToyConfig("B=3, N=17: every row has a distinct maximum", 9001, 3, 17)}


def toy_generate(name):
    cfg = TOY_CONFIGS[name]
    rng = np.random.default_rng(cfg.seed)
    inputs = {"x": rng.standard_normal((cfg.batch, cfg.n)).astype(np.float32),
              "y": rng.standard_normal((cfg.batch, cfg.n)).astype(np.float32), "alpha": np.array(0.5, np.float32)}
    return package(TOY, name, cfg, 1, inputs, TOY_SPEC.reference(inputs, {}))


# The kernel's stand-in, build/bin/kdtr_toy_axpy (docs/binaries.md's interface): cpu only;
# TOY_WRONG=1 makes it wrong at request 1, slot 2.
TOY_BINARY = r'''#!{python}
import os, sys
sys.path.insert(0, {root!r})
import numpy as np, kdtr
a = sys.argv
inp, out, backend = a[a.index("--input") + 1], a[a.index("--output") + 1], a[a.index("--backend") + 1]
if backend != "cpu":
    print("backend " + backend + " not supported", file=sys.stderr); sys.exit(3)
with kdtr.load(inp) as g:
    x, y, alpha = (np.array(g.tensors["input." + k]) for k in ("x", "y", "alpha"))
res = (alpha * x + y).astype(np.float32)
if os.environ.get("TOY_WRONG"):
    res[1, 2] += 1.0
kdtr.save(out, {{"out": res, "argmax": np.argmax(alpha * x + y, axis=1).astype(np.int32)}}, {{"op": "toy_axpy"}})
'''


@pytest.fixture
def toy_op():
    """The toy op in kdtr.ops.OPS and its configurations in kdtr.generators.REGISTRY (the
    registry the `kdtr` command uses); both removed again afterwards."""
    try:
        register_op(TOY_SPEC)
        kdtr.generators.REGISTRY.register(TOY, TOY_CONFIGS, toy_generate)
        yield kdtr.generators.REGISTRY.subset(TOY)
    finally:
        kdtr.generators.REGISTRY.unregister(TOY)
        unregister_op(TOY)
    assert TOY not in OPS and TOY not in kdtr.generators.REGISTRY


def _run(tmp_path, gdir, bdir, name, **env):
    return CliRunner().invoke(main, ["run", "--golden-dir", str(gdir), "--bin-dir", str(bdir), "--report-dir",
                                     str(tmp_path / name), "--only", TOY], env=env, catch_exceptions=False)


def test_a_toy_fifth_op_through_regen_run_and_reports(toy_op, tmp_path, repo_root):
    gdir, bdir = tmp_path / "golden", tmp_path / "bin"
    manifest = goldens.regenerate(gdir, toy_op)
    assert sorted(manifest["files"]) == ["toy_axpy/small.kdtr"]
    assert goldens.check(gdir, toy_op).ok
    with kdtr.load(gdir / TOY / "small.kdtr") as g:
        assert TOY_SPEC.check(g.tensors) == {"B": 3, "N": 17}
        assert g.metadata["contract.out.kind"] == "allclose" and g.metadata["contract.argmax.kind"] == "exact"
        assert g.metadata["contract.out.atol"] == 1e-6  # the spec's default contract

    bdir.mkdir()
    binary = bdir / f"kdtr_{TOY}"
    binary.write_text(TOY_BINARY.format(python=sys.executable, root=str(repo_root)))
    binary.chmod(binary.stat().st_mode | stat.S_IEXEC)

    r = _run(tmp_path, gdir, bdir, "reports")
    assert r.exit_code == 0, r.output
    cases = {c["id"]: c for c in json.loads((tmp_path / "reports" / "conformance.json").read_text())["cases"]}
    assert {i: c["status"] for i, c in cases.items()} == {"toy_axpy/small@cpu": "PASS",
                                                         "toy_axpy/small@cuda": "NOT_SUPPORTED"}
    suites = ET.parse(tmp_path / "reports" / "junit.xml").getroot().iter("testsuite")
    assert [s.get("name") for s in suites] == [TOY]
    assert "toy_axpy" in (tmp_path / "reports" / "conformance.md").read_text()

    r = _run(tmp_path, gdir, bdir, "reports-wrong", TOY_WRONG="1")
    assert r.exit_code == 1
    case = {c["id"]: c for c in json.loads((tmp_path / "reports-wrong" / "conformance.json").read_text())["cases"]}
    assert case["toy_axpy/small@cpu"]["status"] == "MISMATCH"
    assert "out: 1/51" in r.output and "request 1, slot 2" in r.output
    assert "kdtr run --only toy_axpy/small --backend cpu" in r.output
    assert (tmp_path / "reports-wrong" / "obtained" / TOY / "small.cpu.kdtr").is_file()

    r = CliRunner().invoke(main, ["list", "--golden-dir", str(gdir)], env={"COLUMNS": "250"}, catch_exceptions=False)
    assert r.exit_code == 0 and "toy_axpy" in r.output and "small" in r.output
