"""Golden lifecycle: manifest, size budget, and `kdtr regen --check` drift detection."""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

import kdtr.generators
from kdtr import goldens
from kdtr.cli.main import main
from kdtr.generators import gen_accept_refs
from kdtr.ops import tree_accept as accept_op


@pytest.fixture
def gdir(tmp_path, repo_root, monkeypatch):
    """A copy of golden/ and a registry, both without the second tier: these tests are about
    drift detection in committed goldens, and regenerating the second tier (a third of a
    minute) each time adds nothing (tests/harness/test_host_independence.py checks its hashes)."""
    d = tmp_path / "golden"
    shutil.copytree(repo_root / "golden", d, ignore=shutil.ignore_patterns(".cache"))
    reg = kdtr.generators.REGISTRY
    every = reg.all_configs
    monkeypatch.setattr(reg, "all_configs", lambda ops=None: [(o, c) for o, c in every(ops)
                                                              if reg.tier_of(o, c) == "committed"])
    manifest = json.loads((d / "MANIFEST.json").read_text())
    manifest["files"] = {k: v for k, v in manifest["files"].items() if v["tier"] == "committed"}
    (d / "MANIFEST.json").write_text(json.dumps(manifest))
    return d


def check(gdir):
    return CliRunner().invoke(main, ["regen", "--check", "--golden-dir", str(gdir)])


def test_manifest_lists_every_committed_golden_with_hash(repo_root):
    manifest = goldens.read_manifest(repo_root / "golden")
    on_disk = {str(p.relative_to(repo_root / "golden")) for p in (repo_root / "golden").glob("*/*.kdtr")}
    committed = {k for k, v in manifest["files"].items() if v["tier"] == "committed"}
    assert committed == on_disk
    total = 0
    for rel in committed:
        e = manifest["files"][rel]
        assert e["sha256"] == goldens.sha256_of(repo_root / "golden" / rel)
        assert {"op", "config", "seed", "size", "generator_version", "numpy_version"} <= set(e)
        total += e["size"]
    assert total < goldens.COMMITTED_BUDGET


def test_check_passes_on_clean_tree(gdir):
    r = check(gdir)
    assert r.exit_code == 0, r.output
    assert "no drift" in r.output


def test_check_fails_naming_the_file_after_a_synthesis_change(gdir, monkeypatch):
    cfg = gen_accept_refs.CONFIGS["chain"]
    monkeypatch.setitem(gen_accept_refs.CONFIGS, "chain", dataclasses.replace(cfg, seed=cfg.seed + 1))
    r = check(gdir)
    assert r.exit_code == 1
    assert "tree_accept/chain.kdtr" in r.output and "input.node_token_ids" in r.output
    assert "tree_accept/default.kdtr" not in r.output


def test_check_fails_after_a_reference_change(gdir, monkeypatch):
    real = accept_op.tree_accept

    def off_by_one(*args, **kw):
        res = real(*args, **kw)
        res.accepted_count = res.accepted_count + np.int32(1)
        return res

    monkeypatch.setattr(accept_op, "tree_accept", off_by_one)  # what the op's reference calls
    r = check(gdir)
    assert r.exit_code == 1 and "expected.accepted_count" in r.output


def test_check_reports_orphan_missing_unlisted_and_hash(gdir):
    (gdir / "tree_accept" / "stale_config.kdtr").write_bytes((gdir / "tree_accept" / "chain.kdtr").read_bytes())
    (gdir / "tree_accept" / "wide.kdtr").unlink()
    manifest = json.loads((gdir / "MANIFEST.json").read_text())
    del manifest["files"]["tree_accept/mid.kdtr"]
    manifest["files"]["tree_accept/default.kdtr"]["sha256"] = "0" * 64
    (gdir / "MANIFEST.json").write_text(json.dumps(manifest))
    r = check(gdir)
    assert r.exit_code == 1
    out = r.output
    assert "tree_accept/stale_config.kdtr: extra" in out
    assert "tree_accept/wide.kdtr: missing" in out
    assert "tree_accept/mid.kdtr: unlisted" in out
    assert "tree_accept/default.kdtr: hash" in out


@pytest.mark.slow  # regenerates every golden (about 5 s)
def test_regen_writes_identical_bytes(tmp_path, gdir):
    fresh = tmp_path / "fresh"
    r = CliRunner().invoke(main, ["regen", "--golden-dir", str(fresh)])
    assert r.exit_code == 0, r.output
    for p in gdir.glob("*/*.kdtr"):
        assert (fresh / p.parent.name / p.name).read_bytes() == p.read_bytes(), p.name
    assert not list(fresh.glob("**/*.tmp"))


def test_check_detects_a_metadata_reorder(gdir, monkeypatch):
    entry = kdtr.generators.REGISTRY.entry("tree_accept")
    real = entry.generate

    def reordered(name):
        tensors, metadata = real(name)
        return tensors, dict(reversed(list(metadata.items())))

    monkeypatch.setattr(entry, "generate", reordered)
    r = check(gdir)
    assert r.exit_code == 1 and "tree_accept/chain.kdtr: bytes" in r.output


def test_check_reports_a_directory_in_place_of_a_golden(gdir):
    (gdir / "tree_accept" / "wide.kdtr").unlink()
    (gdir / "tree_accept" / "wide.kdtr").mkdir()
    r = check(gdir)
    assert r.exit_code == 1 and "tree_accept/wide.kdtr: unreadable: not a regular file" in r.output
