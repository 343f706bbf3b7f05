"""kdtr mutate's verdict cache (kdtr/mutate/cache.py, docs/mutation.md "The verdict cache").

The runs here use a small scratch checkout whose builds are fakes (no compiler runs): the
"make" of a mutant writes the real tree_accept binary with a trailing byte (a mutant that
survives), the same bytes (identical) or a script that fails (killed), so each run is a
fraction of a second.  What is checked: a rerun with nothing changed takes every verdict
from the cache and starts no process at all (no make, no binary); a changed golden, a
changed source of the mutated binary, the build configuration or the mutant itself is a
miss; an entry that is not the mutant's own (garbage, a link, another mutant's verdict,
a verdict that cannot be this mutant's) is ignored and the mutant runs again; --no-cache
neither reads nor writes the cache.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import REPO_ROOT, op_binary
from kdtr import children, goldens
from kdtr import mutate as mut
from kdtr.cli.main import main
from kdtr.mutate import execute, workspace
from kdtr.vouch import Vouch

TA = "cuda_tests/kernels/tree_accept.cuh"
CORE = "int32_t accepted = 0;\nint kill_switch = 0;\n// a comment\n"
# make's view of the scratch checkout: each binary is built from its core, one shared header
MAKEFILE = "".join(f"build/bin/kdtr_{op}: cuda_tests/kernels/{op}.cuh cuda_tests/include/shared.h build/config.stamp\n"
                   for op in mut.OPS) + "build/config.stamp: ;\n"
MUTANTS = {  # name: (find, replace, outcome)
    "killed": ("int kill_switch = 0;", "int kill_switch = 1;", mut.KILLED),
    "survives": ("int32_t accepted = 0;", "int32_t accepted = 2;", mut.SURVIVED),
    "identical": ("// a comment", "// another comment", mut.IDENTICAL),
}


def fake_make(cwd: Path, targets: list[str], cxxflags: str | None) -> subprocess.CompletedProcess:
    """The base build: the real binaries; a mutant's: decided by its edit (see the module doc)."""
    text = (cwd / TA).read_text()
    for t in targets:
        op = t.rsplit("kdtr_", 1)[1]
        dst = cwd / t
        dst.parent.mkdir(parents=True, exist_ok=True)
        real = op_binary(op).read_bytes()
        if not (cwd / ".complete").exists() or "another comment" in text:  # the base build, or identical
            data = real
        elif "kill_switch = 1" in text:
            data = b"#!/bin/sh\nexit 3\n"
        else:
            data = real + b"\0"
        if dst.exists():
            dst.unlink()
        dst.write_bytes(data)
        dst.chmod(0o755)
    (cwd / workspace.CONFIG_STAMP).write_text(f"fake | {cxxflags}\n")
    return subprocess.CompletedProcess(["make"], 0, "", "")


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    """A scratch checkout ($KDTR_ROOT): fake sources, catalogue and one golden."""
    root = tmp_path / "root"
    for op in mut.OPS:
        (root / "cuda_tests" / "kernels").mkdir(parents=True, exist_ok=True)
        (root / f"cuda_tests/kernels/{op}.cuh").write_text(CORE if op == "tree_accept" else f"// {op}\n")
    (root / "cuda_tests" / "include").mkdir()
    (root / "cuda_tests/include/shared.h").write_text("// shared\n")
    (root / "Makefile").write_text(MAKEFILE)
    (root / "mutants").mkdir()
    (root / "mutants" / "tree_accept.toml").write_text("\n".join(
        f'[[mutant]]\nname = "{name}"\nop = "tree_accept"\nfile = "{TA}"\nbug = "b"\norigin = "o"\n'
        f"find = '''{find}'''\nreplace = '''{replace}'''\n" for name, (find, replace, _) in MUTANTS.items()))
    gdir = root / "golden"
    (gdir / "tree_accept").mkdir(parents=True)
    shutil.copy2(REPO_ROOT / "golden" / "tree_accept" / "default.kdtr", gdir / "tree_accept" / "default.kdtr")
    goldens.write_manifest(gdir, goldens.manifest_of_files(gdir))
    monkeypatch.setattr(workspace, "_make", fake_make)
    monkeypatch.setattr(execute, "_make", fake_make)
    monkeypatch.setenv("KDTR_ROOT", str(root))
    return root


class CountingSpawn:
    """children.spawn that records every process a run starts (then starts it)."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.spawn = children.spawn

    def __call__(self, cmd, **kwargs):
        self.calls.append(list(cmd))
        return self.spawn(cmd, **kwargs)


def _invoke(root: Path, *extra: str):
    args = ["mutate", "--report-dir", str(root / "reports"), "-j", "2", *extra]
    return CliRunner().invoke(main, args, catch_exceptions=False)


def _outcomes(root: Path) -> dict[str, str]:
    data = json.loads((root / "reports" / "mutation.json").read_text())
    return {m["id"].split("/")[1]: m["outcome"] for m in data["mutants"]}


def _entries(root: Path) -> list[Path]:
    return sorted((root / mut.CACHE_DIR).glob("*.json"))


def test_a_rerun_with_nothing_changed_takes_every_verdict_from_the_cache_and_starts_no_process(checkout,
                                                                                            monkeypatch):
    res = _invoke(checkout)
    assert res.exit_code == 1, res.output  # the survivor
    first = _outcomes(checkout)
    assert first == {name: outcome for name, (_, _, outcome) in MUTANTS.items()}
    assert "verdict cache: 0 of 3 verdicts" in res.output
    assert len(_entries(checkout)) == 3

    spawn = CountingSpawn()
    monkeypatch.setattr(children, "spawn", spawn)
    res = _invoke(checkout)
    assert spawn.calls == [] and res.exit_code == 1, res.output
    assert _outcomes(checkout) == first
    assert "verdict cache: 3 of 3 verdicts" in res.output
    assert "- verdict cache: 3 of 3 verdicts from" in (checkout / "reports" / "mutation.md").read_text()


def test_no_cache_neither_reads_nor_writes_the_cache(checkout, monkeypatch):
    assert _invoke(checkout).exit_code == 1
    before = {p: p.read_bytes() for p in _entries(checkout)}
    spawn = CountingSpawn()
    monkeypatch.setattr(children, "spawn", spawn)
    res = _invoke(checkout, "--no-cache")
    assert res.exit_code == 1 and _outcomes(checkout)["killed"] == mut.KILLED, res.output
    assert any("kdtr_tree_accept" in c[0] for c in spawn.calls)  # the goldens ran again
    assert "not used (--no-cache)" in (checkout / "reports" / "mutation.md").read_text()
    assert {p: p.read_bytes() for p in _entries(checkout)} == before


@pytest.fixture
def warm(checkout, tmp_path):
    """One run's workspace, plan, mutants and filled cache (direct API, no CLI)."""
    ws = mut.Workspace(checkout, tmp_path / "scratch")
    plan = mut.load_goldens(checkout / "golden")
    mutants = mut.load_catalogue(checkout)
    cache = mut.VerdictCache(tmp_path / "cache")
    results = mut.run(mutants, ws, plan, 1, cache=cache)
    assert [r.outcome for r in results] == [o for _, _, o in MUTANTS.values()]
    assert cache.stored == 3 and not any(r.cached for r in results)
    return ws, plan, mutants, cache


def _hit(cache, m, ws, plan) -> bool:
    return cache.get(m, ws, plan, mut.mutant_ops(m, ws, plan)) is not None


def test_every_verdict_is_a_hit_on_the_same_inputs(warm):
    ws, plan, mutants, cache = warm
    again = mut.VerdictCache(cache.directory)
    assert [_hit(again, m, ws, plan) for m in mutants] == [True, True, True]
    assert again.hits == 3


def test_a_changed_golden_is_a_miss(warm):
    ws, plan, mutants, cache = warm
    (golden,) = plan.vouched
    plan.vouched[golden] = Vouch("0" * 64, 1)
    assert not any(_hit(cache, m, ws, plan) for m in mutants)


@pytest.mark.parametrize("name, edit", [
    (TA, lambda t: t + "// elsewhere in the mutated file\n"),
    ("cuda_tests/include/shared.h", lambda t: t + "#define X 1\n"),
    ("Makefile", lambda t: t + "# a comment\n"),
    (workspace.CONFIG_STAMP, lambda t: t.replace("fake", "fake -O3")),
])
def test_a_changed_source_of_the_mutated_binary_is_a_miss(warm, tmp_path, name, edit):
    ws, plan, mutants, cache = warm
    other = copy.copy(ws)
    other.base = tmp_path / "base2"
    shutil.copytree(ws.base, other.base, symlinks=True)
    other._file_digests = {}
    assert all(_hit(cache, m, other, plan) for m in mutants)  # the copy itself changes nothing
    other._file_digests = {}
    (other.base / name).write_text(edit((other.base / name).read_text()))
    assert not any(_hit(cache, m, other, plan) for m in mutants)


def test_a_new_dependency_of_the_unmutated_build_is_a_miss(warm, tmp_path):
    """Every listed file unchanged, but the build is now made of one more (a header that
    shadows an include, found first in the includer's directory): the entry's build is not
    this one, so its verdict is not this mutant's."""
    ws, plan, mutants, cache = warm
    other = copy.copy(ws)
    other.base = tmp_path / "base2"
    shutil.copytree(ws.base, other.base, symlinks=True)
    other._file_digests = {}
    shadow = "cuda_tests/kernels/shadow.cuh"
    (other.base / shadow).write_text("// shadows an include\n")
    other.graph = {t: set(v) | ({shadow} if "kdtr_tree_accept" in t else set()) for t, v in ws.graph.items()}
    assert not any(_hit(cache, m, other, plan) for m in mutants if "tree_accept" in mut.mutant_ops(m, other, plan))
    other.graph = ws.graph
    assert all(_hit(cache, m, other, plan) for m in mutants)  # the same graph: hits again


def test_a_source_of_another_binary_changes_nothing(warm, tmp_path):
    ws, plan, mutants, cache = warm
    other = copy.copy(ws)
    other.base = tmp_path / "base2"
    shutil.copytree(ws.base, other.base, symlinks=True)
    other._file_digests = {}
    (other.base / "cuda_tests/kernels/tree_build.cuh").write_text("// changed\n")
    assert all(_hit(cache, m, other, plan) for m in mutants)


def test_a_limit_the_binaries_read_from_the_environment_is_part_of_the_key(warm, monkeypatch):
    ws, plan, mutants, cache = warm
    monkeypatch.setenv("KDTR_MAX_OUTPUT_BYTES", "1024")
    assert not any(_hit(cache, m, ws, plan) for m in mutants)


def test_a_changed_mutant_is_a_miss(warm):
    ws, plan, mutants, cache = warm
    m = mutants[0]
    for changed in (dataclasses.replace(m, replace="int kill_switch = 7;"),
                    dataclasses.replace(m, equivalent="claimed"),
                    dataclasses.replace(m, find="int kill_switch = 0;\n")):
        assert not _hit(cache, changed, ws, plan)


def _entry_of(cache, m, plan, ws) -> Path:
    return cache._path(cache.key(m, plan, mut.mutant_ops(m, ws, plan)))


@pytest.mark.parametrize("tamper", ["garbage", "empty", "link", "directory", "other_mutant", "other_key",
                                    "survived_but_killed_by", "killed_by_unknown_case", "unknown_outcome",
                                    "claimed_outcome", "sources_dropped", "extra_field", "huge"])
def test_a_corrupt_or_foreign_entry_is_ignored_and_the_mutant_runs_again(warm, tmp_path, tamper):
    ws, plan, mutants, cache = warm
    killed, survivor = mutants[0], mutants[1]
    path = _entry_of(cache, killed, plan, ws)
    entry = json.loads(path.read_text())
    foreign = json.loads(_entry_of(cache, survivor, plan, ws).read_text())
    path.unlink()
    if tamper == "garbage":
        path.write_bytes(b"\x00{not json")
    elif tamper == "empty":
        path.write_bytes(b"")
    elif tamper == "link":
        (tmp_path / "elsewhere.json").write_text(json.dumps(entry))
        os.symlink(tmp_path / "elsewhere.json", path)
    elif tamper == "directory":
        path.mkdir()
    elif tamper == "other_mutant":  # the survivor's entry under the killed mutant's name
        path.write_text(json.dumps(foreign))
    elif tamper == "other_key":  # the killer's verdict turned into a pass, with the survivor's key
        path.write_text(json.dumps({**foreign, "sources": entry["sources"]}))
    elif tamper == "survived_but_killed_by":
        path.write_text(json.dumps({**entry, "result": {**entry["result"], "outcome": mut.SURVIVED}}))
    elif tamper == "killed_by_unknown_case":
        path.write_text(json.dumps({**entry, "result": {**entry["result"], "killed_by": ["tree_accept/nope@cpu"]}}))
    elif tamper == "unknown_outcome":
        path.write_text(json.dumps({**entry, "result": {**entry["result"], "outcome": "PASS", "killed_by": []}}))
    elif tamper == "claimed_outcome":  # EQUIVALENT for a mutant that claims nothing
        path.write_text(json.dumps({**entry, "result": {**entry["result"], "outcome": mut.EQUIVALENT,
                                                        "killed_by": []}}))
    elif tamper == "sources_dropped":
        path.write_text(json.dumps({**entry, "sources": {}}))
    elif tamper == "extra_field":
        path.write_text(json.dumps({**entry, "trusted": True}))
    elif tamper == "huge":
        path.write_text(json.dumps(entry) + " " * (2 << 20))
    fresh = mut.VerdictCache(cache.directory)
    assert not _hit(fresh, killed, ws, plan)
    (r,) = mut.run([killed], ws, plan, 1, cache=fresh)
    assert r.outcome == mut.KILLED and not r.cached
    if tamper not in ("link", "directory"):  # rewritten with the true verdict
        assert json.loads(path.read_text())["result"]["outcome"] == mut.KILLED
        assert _hit(mut.VerdictCache(cache.directory), killed, ws, plan)


def test_a_mutate_run_reads_each_golden_once(checkout, monkeypatch):
    """Two goldens, three mutants (two run the goldens, one is identical), no verdict cache:
    the calibration and every mutant's cases share one read of each golden, and the
    verdicts are those of a read per case."""
    from kdtr.judge import Golden

    gdir = checkout / "golden"
    shutil.copy2(REPO_ROOT / "golden" / "tree_accept" / "chain.kdtr", gdir / "tree_accept" / "chain.kdtr")
    goldens.write_manifest(gdir, goldens.manifest_of_files(gdir))
    reads: list[Path] = []
    real = Golden.read.__func__

    def counting(cls, path, *args, **kwargs):
        reads.append(Path(path))
        return real(cls, path, *args, **kwargs)

    monkeypatch.setattr(Golden, "read", classmethod(counting))
    res = _invoke(checkout, "--no-cache")
    assert res.exit_code == 1, res.output  # the survivor
    assert _outcomes(checkout) == {name: outcome for name, (_, _, outcome) in MUTANTS.items()}
    data = json.loads((checkout / "reports" / "mutation.json").read_text())
    killed = next(m for m in data["mutants"] if m["id"].endswith("/killed"))
    assert sorted(killed["killed_by"]) == ["tree_accept/chain@cpu", "tree_accept/default@cpu"]
    assert sorted(reads) == sorted(gdir.glob("tree_accept/*.kdtr")), reads  # once each


def test_a_cached_rerun_does_not_say_it_builds_the_unmutated_binaries(checkout):
    first = _invoke(checkout)
    assert "building the unmutated CPU binaries" in first.output, first.output
    again = _invoke(checkout)
    assert again.exit_code == first.exit_code == 1, again.output
    assert "building" not in again.output and "verdict cache: 3 of 3 verdicts" in again.output, again.output
    no_cache = _invoke(checkout, "--no-cache")  # the mutants are built, the unmutated build is cached
    assert "building the unmutated" not in no_cache.output, no_cache.output
