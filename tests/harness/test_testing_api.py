"""kdtr.testing: goldens() and assert_conforms() (docs/bring-your-own-kernel.md)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

import kdtr
from conftest import golden_subset
from kdtr.contract import Contract
from kdtr.judge import judge
from kdtr.ops import OPS
from kdtr.testing import ConformanceError, Golden, GoldenError, assert_conforms, goldens, to_numpy

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "golden"


def _reference(g: Golden) -> dict[str, np.ndarray]:
    return dict(OPS[g.op].reference(g.inputs, g.metadata))


@pytest.fixture(scope="module")
def accept() -> list[Golden]:
    return goldens("tree_accept", GOLDEN)


@pytest.fixture(scope="module")
def chain(accept: list[Golden]) -> Golden:
    return next(g for g in accept if g.config == "chain")


def _wrong(g: Golden) -> dict[str, np.ndarray]:
    out = _reference(g)
    out["proposed"] = out["proposed"].copy()
    out["proposed"][0, 1] += 1
    return out


# ---------------------------------------------------------------- goldens()


def test_goldens_of_an_op_are_the_committed_files(accept: list[Golden]) -> None:
    on_disk = sorted(p.stem for p in (GOLDEN / "tree_accept").glob("*.kdtr"))
    assert [g.config for g in accept] == on_disk
    assert [g.id for g in accept] == [f"tree_accept/{c}" for c in on_disk]
    g = accept[0]
    assert (g.op, str(g), g.path) == ("tree_accept", g.id, GOLDEN / "tree_accept" / f"{g.config}.kdtr")
    raw = kdtr.load(g.path)
    assert set(g.inputs) == {k[len("input."):] for k in raw.tensors if k.startswith("input.")}
    assert set(g.expected) == {"accepted_count", "accepted_path", "proposed", "status"}
    for name, arr in g.inputs.items():
        assert not arr.flags.writeable
        np.testing.assert_array_equal(arr, raw.tensors[f"input.{name}"])
    assert g.contracts == {n: Contract("exact") for n in g.expected}
    assert g.metadata["op"] == "tree_accept" and g.metadata["config"] == g.config


def test_goldens_carry_allclose_contracts() -> None:
    (g,) = goldens("verify_attn", GOLDEN, config="chain")
    assert g.contracts["out"].kind == "allclose"
    assert g.contracts["out"] == Contract.from_metadata(g.metadata, "out")
    assert "sm_scale" in g.inputs and "q" in g.inputs


def test_goldens_default_dir_and_config_glob() -> None:
    gs = goldens("tree_accept", config="wide*")
    assert [g.id for g in gs] == ["tree_accept/wide", "tree_accept/wide_token_ids"]
    assert gs[0].path.parent.parent == kdtr.goldens.default_golden_dir()


@pytest.mark.parametrize("op, kw, msg", [
    ("no_such_op", {}, "no golden of op 'no_such_op'"),
    ("tree_accept", {"config": "nope*"}, "with config 'nope*'"),
    ("tree_accept", {"tier": "some"}, "tier 'some'"),
    ("tree_accept", {"tier": "all"}, "registry"),
])
def test_goldens_refuses_bad_selections(op: str, kw: dict, msg: str) -> None:
    with pytest.raises(GoldenError, match=re.escape(msg)):
        goldens(op, GOLDEN, **kw)


def _golden_copy(tmp_path: Path, configs: list[str], waivers: dict[str, str] | None = None) -> Path:
    return golden_subset(tmp_path, "tree_accept", configs, waivers)


def test_goldens_only_what_the_manifest_vouches_for(tmp_path: Path) -> None:
    gdir = _golden_copy(tmp_path, ["chain", "default"])
    assert [g.config for g in goldens("tree_accept", gdir)] == ["chain", "default"]
    # a file the manifest does not list
    shutil.copyfile(gdir / "tree_accept/chain.kdtr", gdir / "tree_accept/extra.kdtr")
    with pytest.raises(GoldenError, match=r"extra\.kdtr: not listed in MANIFEST\.json"):
        goldens("tree_accept", gdir)
    # but a selection that leaves it out is fine
    assert [g.config for g in goldens("tree_accept", gdir, config="chain")] == ["chain"]
    (gdir / "tree_accept/extra.kdtr").unlink()
    # a hash that differs, and a listed file that is missing
    manifest = json.loads((gdir / "MANIFEST.json").read_text())
    manifest["files"]["tree_accept/default.kdtr"]["sha256"] = "0" * 64
    (gdir / "MANIFEST.json").write_text(json.dumps(manifest))
    (gdir / "tree_accept/chain.kdtr").unlink()
    with pytest.raises(GoldenError) as err:
        goldens("tree_accept", gdir)
    assert "default.kdtr: sha256 differs" in str(err.value)
    assert "chain.kdtr: listed in MANIFEST.json but missing" in str(err.value)


def test_goldens_without_manifest(tmp_path: Path) -> None:
    gdir = _golden_copy(tmp_path, ["chain"])
    (gdir / "MANIFEST.json").unlink()
    with pytest.raises(GoldenError, match="MANIFEST.json: missing"):
        goldens("tree_accept", gdir)
    with pytest.raises(GoldenError, match="does not exist"):
        goldens("tree_accept", tmp_path / "nowhere")


# ---------------------------------------------------------------- assert_conforms()


def test_reference_conforms_on_every_golden(accept: list[Golden]) -> None:
    for g in accept:
        results = assert_conforms(g, _reference(g))
        assert [r.name for r in results] == list(g.expected) and all(r.ok for r in results)


def test_reference_conforms_under_allclose() -> None:
    (g,) = goldens("verify_attn", GOLDEN, config="chain")
    assert_conforms(g, _reference(g))
    out = _reference(g)
    out["lse"] = out["lse"] + np.float32(1e-3)
    with pytest.raises(ConformanceError, match=r"lse: .* differ \[allclose"):
        assert_conforms(g, out)


def test_mismatch_is_an_assertion_error_with_the_runner_record(chain: Golden, tmp_path: Path) -> None:
    out = _wrong(chain)
    with pytest.raises(AssertionError) as info:
        assert_conforms(chain, out)
    err = info.value
    assert isinstance(err, ConformanceError) and err.golden is chain
    lines = str(err).splitlines()
    assert lines[0] == "tree_accept/chain@python: MISMATCH"
    assert lines[1].startswith("  proposed: 1/") and "[exact]" in lines[1] and "max abs 1 at [0, 1]" in lines[1]
    exp = int(chain.expected["proposed"][0, 1])
    assert lines[2] == f"    request 0, slot 1: expected {exp}, actual {exp + 1}"
    assert lines[-1] == f"  golden: {chain.path}"
    assert [r.name for r in err.results] == list(chain.expected)
    assert [r.name for r in err.failed] == ["proposed"] and err.lines == lines
    # the runner judging the same outputs written by a binary gives the same record
    out_path = tmp_path / "out.kdtr"
    kdtr.save(out_path, out)
    status, reason, results = judge(Golden.read(chain.path), out_path)
    assert status == "MISMATCH"
    assert [r.to_json() for r in results] == [r.to_json() for r in err.results]
    assert reason == "; ".join(r.summary() for r in err.failed)


def test_missing_output_dtype_and_shape_changes_fail(chain: Golden) -> None:
    out = _reference(chain)
    del out["status"]
    out["accepted_count"] = out["accepted_count"].astype(np.int64)
    out["accepted_path"] = out["accepted_path"][:, :-1]
    with pytest.raises(ConformanceError) as info:
        assert_conforms(chain, out)
    msg = str(info.value)
    assert "status: missing from the outputs" in msg
    assert "accepted_count: dtype i64 != expected i32" in msg
    assert "accepted_path: shape" in msg
    assert [r.name for r in info.value.failed] == ["accepted_count", "accepted_path", "status"]


def test_extra_outputs_are_ignored_and_listed_on_failure(chain: Golden) -> None:
    out = _reference(chain)
    out["scratch"] = np.zeros(3)
    assert_conforms(chain, out)
    out["proposed"] = _wrong(chain)["proposed"]
    with pytest.raises(ConformanceError, match="outputs not in the golden \\(ignored\\): scratch"):
        assert_conforms(chain, out)


def test_outputs_must_be_a_mapping(chain: Golden) -> None:
    with pytest.raises(TypeError, match="mapping"):
        assert_conforms(chain, list(_reference(chain).values()))


class ArrayLike:
    """Anything with __array__ (not a numpy array, no DLPack)."""

    def __init__(self, arr: np.ndarray) -> None:
        self.arr = arr

    def __array__(self, dtype=None, copy=None):  # noqa: ANN001, ANN204
        return self.arr


class FakeDLPack:
    """A DLPack producer around a numpy array; ``device`` as __dlpack_device__ reports it.
    On a device (not 1 = CPU) it refuses a host export, like a GPU tensor; ``cpu()`` (when
    ``movable``) gives the host copy, as torch's Tensor.cpu() does."""

    def __init__(self, arr: np.ndarray, device: int = 1, movable: bool = True) -> None:
        self.arr, self.device, self.moves = arr, device, 0
        if movable:
            self.cpu = self._cpu

    def __dlpack__(self, **kw):  # noqa: ANN003, ANN204
        if self.device != 1:
            raise BufferError("memory is on the device")
        return self.arr.__dlpack__(**kw)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (self.device, 0)

    def _cpu(self) -> FakeDLPack:
        self.moves += 1
        return FakeDLPack(self.arr, 1)


def test_array_likes_and_dlpack_outputs(chain: Golden) -> None:
    ref = _reference(chain)
    for wrap in (ArrayLike, FakeDLPack):
        assert_conforms(chain, {k: wrap(v) for k, v in ref.items()})
    on_gpu = {k: FakeDLPack(v, device=2) for k, v in ref.items()}
    assert_conforms(chain, on_gpu)
    assert all(t.moves == 1 for t in on_gpu.values())
    wrong = {k: FakeDLPack(v, device=2) for k, v in _wrong(chain).items()}
    with pytest.raises(ConformanceError, match="request 0, slot 1"):
        assert_conforms(chain, wrong)


def test_dlpack_on_a_device_that_cannot_reach_the_host(chain: Golden) -> None:
    stuck = FakeDLPack(chain.expected["status"], device=2, movable=False)
    with pytest.raises(TypeError, match="DLPack device type 2 to the host"):
        to_numpy(stuck)


def test_to_numpy_never_converts_dtype() -> None:
    a = np.arange(4, dtype=np.int32)
    assert to_numpy(a) is a
    assert to_numpy(FakeDLPack(a)).dtype == np.int32
    assert to_numpy(ArrayLike(a.astype(np.float16))).dtype == np.float16
