"""No file kdtr did not create is truncated, moved, written or removed (kdtr/fsutil.py).

The lock files of ``kdtr run`` and ``kdtr mutate`` are opened without following a link and
checked before anything is written to them; the reports, the obtained outputs, ``kdtr show
--svg`` and ``kdtr convert`` never write through a link or replace one; a temporary name
someone else made is never reused. Each refusal is one line, exit 2, naming the path, and
leaves the link's target (and the link) as they were.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import kdtr
from fakes import invoke
from kdtr import fsutil
from kdtr import mutate as mut
from kdtr import run as runner
from kdtr.cli.main import main

PRECIOUS = b"someone else's file\n" * 8


@pytest.fixture
def env(runner_env):
    """``(tmp_path, gdir, bdir)``: the tree_accept goldens and a fake binary (conftest.py)."""
    return runner_env


def _precious(tmp_path: Path, name: str = "precious.txt") -> Path:
    target = tmp_path / name
    target.write_bytes(PRECIOUS)
    return target


def _one_line_refusal(r, *needles: str) -> None:
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.output, r.output
    for n in needles:
        assert n in lines[0], lines[0]


def _marker_shim(bdir: Path, ran: Path) -> None:
    """The fake binary, but it first records that it ran."""
    fake = bdir / "kdtr_tree_accept"
    text = fake.read_text().split("\n")
    text.insert(2, f"open({str(ran)!r}, 'a').write('ran\\n')")
    fake.write_text("\n".join(text))


# --- the run's lock ----------------------------------------------------------------------


def test_run_refuses_a_symlinked_lock_and_leaves_its_target_untouched(env):  # noqa: F811
    tmp_path, gdir, bdir = env
    target = _precious(tmp_path)
    (tmp_path / "reports").mkdir()
    os.symlink(target, tmp_path / "reports" / runner.REPORT_LOCK)
    _marker_shim(bdir, tmp_path / "ran")
    r = invoke(tmp_path, gdir, bdir, "--backend", "cpu", "--only", "tree_accept/chain")
    _one_line_refusal(r, runner.REPORT_LOCK, "symbolic link")
    assert target.read_bytes() == PRECIOUS
    assert (tmp_path / "reports" / runner.REPORT_LOCK).is_symlink()
    assert not (tmp_path / "ran").exists()  # refused before any case ran


def test_run_refuses_a_hard_linked_lock(env):  # noqa: F811
    """O_NOFOLLOW does not see a hard link: the link count does."""
    tmp_path, gdir, bdir = env
    target = _precious(tmp_path)
    (tmp_path / "reports").mkdir()
    os.link(target, tmp_path / "reports" / runner.REPORT_LOCK)
    r = invoke(tmp_path, gdir, bdir, "--backend", "cpu", "--only", "tree_accept/chain")
    _one_line_refusal(r, runner.REPORT_LOCK, "hard links")
    assert target.read_bytes() == PRECIOUS


def test_lock_is_never_truncated_before_the_pid_is_written(tmp_path):
    """A stale lock of kdtr's (an old pid, longer than this one) gets this pid, cut to its length."""
    path = tmp_path / runner.REPORT_LOCK
    path.write_bytes(b"9" * 40 + b"\n")
    with runner.ReportDirLock(tmp_path):
        assert path.read_bytes() == f"{os.getpid()}\n".encode()
    path.write_bytes(b"x" * (fsutil.LOCK_MAX_BYTES + 1))
    with pytest.raises(runner.UsageError, match="not a lock file kdtr made"):
        runner.ReportDirLock(tmp_path).__enter__()
    assert path.read_bytes() == b"x" * (fsutil.LOCK_MAX_BYTES + 1)


# --- kdtr mutate's lock and cache ----------------------------------------------------------


def _no_build(*a, **k):
    raise RuntimeError("this test builds nothing")


def test_mutate_refuses_a_symlinked_cache_lock(tmp_path, repo_root, monkeypatch):
    """build/mutate/.lock as a link: refused before the cache is touched, the target intact
    (the old code opened it with "w": the target was truncated to 0 bytes)."""
    monkeypatch.setattr(mut.workspace, "_make", _no_build)
    cache = tmp_path / "cache"
    cache.mkdir()
    target = _precious(tmp_path)
    os.symlink(target, cache / ".lock")
    with pytest.raises(fsutil.UnsafePath, match="symbolic link"):
        mut.Workspace(repo_root, tmp_path, cache_dir=cache)
    assert target.read_bytes() == PRECIOUS


def test_kdtr_mutate_refuses_a_symlinked_lock_in_one_line(tmp_path, repo_root, monkeypatch):
    """The command: exit 2, one line naming build/mutate/.lock, nothing built."""
    monkeypatch.setattr(mut.workspace, "_make", _no_build)
    root = tmp_path / "root"
    root.mkdir()
    shutil.copy2(repo_root / "Makefile", root / "Makefile")
    shutil.copytree(repo_root / "cuda_tests", root / "cuda_tests")
    (root / "build" / "mutate").mkdir(parents=True)
    target = _precious(tmp_path)
    os.symlink(target, root / "build" / "mutate" / ".lock")
    r = CliRunner().invoke(main, ["mutate", "--catalogue-dir", str(repo_root / "mutants"), "--only", "tree_accept/*",
                                  "--golden-dir", str(repo_root / "golden"), "--report-dir", str(tmp_path / "r")],
                           env={"KDTR_ROOT": str(root)}, catch_exceptions=False)
    assert r.exit_code == 2, r.output
    err = [ln for ln in r.output.splitlines() if ln.startswith("kdtr: error:")]
    assert len(err) == 1 and ".lock" in err[0] and "symbolic link" in err[0], r.output
    assert target.read_bytes() == PRECIOUS


def test_mutate_cache_removes_only_its_own_directories(tmp_path, repo_root, monkeypatch):
    """An old cached build is removed only if it carries kdtr's marker: a link named
    base-* (to someone's directory) and an unmarked directory are left alone."""
    monkeypatch.setattr(mut.workspace, "_make", _no_build)
    cache = tmp_path / "cache"
    cache.mkdir()
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "keep").write_bytes(PRECIOUS)
    os.symlink(theirs, cache / "base-0000000000000000")
    (cache / "base-1111111111111111").mkdir()
    (cache / "base-1111111111111111" / "keep").write_bytes(PRECIOUS)
    (cache / "base-2222222222222222").mkdir()
    (cache / "base-2222222222222222" / ".complete").touch()
    with pytest.raises(RuntimeError, match="builds nothing"):
        mut.Workspace(repo_root, tmp_path, cache_dir=cache)
    assert (theirs / "keep").read_bytes() == PRECIOUS and (cache / "base-0000000000000000").is_symlink()
    assert (cache / "base-1111111111111111" / "keep").read_bytes() == PRECIOUS
    assert not (cache / "base-2222222222222222").exists()  # kdtr's own old build
    assert not list(cache.glob(".base-tmp-*"))  # the failed staging is gone too


# --- reports and obtained outputs ------------------------------------------------------------


@pytest.mark.parametrize("name", ["conformance.json", "junit.xml", "conformance.md"])
def test_run_refuses_a_symlinked_report_and_keeps_the_link(env, name):  # noqa: F811
    tmp_path, gdir, bdir = env
    target = _precious(tmp_path)
    (tmp_path / "reports").mkdir()
    os.symlink(target, tmp_path / "reports" / name)
    _marker_shim(bdir, tmp_path / "ran")
    r = invoke(tmp_path, gdir, bdir, "--backend", "cpu", "--only", "tree_accept/chain")
    _one_line_refusal(r, name, "symbolic link")
    assert target.read_bytes() == PRECIOUS
    assert os.readlink(tmp_path / "reports" / name) == str(target)  # not replaced either
    assert not (tmp_path / "ran").exists()


def test_run_never_writes_into_a_symlinked_obtained_directory(env):  # noqa: F811
    """reports/obtained -> someone's directory: the old code removed their
    tree_accept/chain.cpu.kdtr and had the binary write there."""
    tmp_path, gdir, bdir = env
    theirs = tmp_path / "theirs"
    (theirs / "tree_accept").mkdir(parents=True)
    (theirs / "tree_accept" / "chain.cpu.kdtr").write_bytes(PRECIOUS)
    (tmp_path / "reports").mkdir()
    os.symlink(theirs, tmp_path / "reports" / "obtained")
    r = invoke(tmp_path, gdir, bdir, "--backend", "cpu", "--only", "tree_accept/chain")
    _one_line_refusal(r, "obtained", "symbolic link")
    assert [p.name for p in (theirs / "tree_accept").iterdir()] == ["chain.cpu.kdtr"]
    assert (theirs / "tree_accept" / "chain.cpu.kdtr").read_bytes() == PRECIOUS


def test_a_symlinked_op_directory_under_an_old_obtained_directory_is_never_followed(env):  # noqa: F811
    """An older kdtr's reports/obtained/ (a real directory) holding a link tree_accept ->
    someone's directory: the run neither removes nor writes anything there."""
    tmp_path, gdir, bdir = env
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "chain.cpu.kdtr").write_bytes(PRECIOUS)
    (tmp_path / "reports" / "obtained").mkdir(parents=True)
    os.symlink(theirs, tmp_path / "reports" / "obtained" / "tree_accept")
    r = invoke(tmp_path, gdir, bdir, "--backend", "cpu", "--only", "tree_accept/chain")
    assert r.exit_code == 0, r.output
    assert [p.name for p in theirs.iterdir()] == ["chain.cpu.kdtr"]
    assert (theirs / "chain.cpu.kdtr").read_bytes() == PRECIOUS
    assert (tmp_path / "reports" / "obtained" / "tree_accept" / "chain.cpu.kdtr").is_file()  # the run's own


def test_an_obtained_op_directory_that_is_a_link_is_an_error_naming_it(tmp_path):
    """Below a run's output directory (a fresh one for kdtr run; any for the API) no link
    is followed: the case is an ERROR naming the link, nothing written through it."""
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "default.cpu.kdtr").write_bytes(PRECIOUS)
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(theirs, out / "tree_accept")
    with pytest.raises(fsutil.UnsafePath, match="symbolic link"):
        fsutil.make_dirs(out, "tree_accept")
    case = runner.Case("tree_accept", "default", Path(__file__).resolve().parents[2] / "golden" / "tree_accept" /
                       "default.kdtr", "cpu")
    cfg = runner.RunConfig(golden_dir=case.golden.parent.parent, bin_dir=case.golden.parents[2] / "build" / "bin",
                           out_dir=out)
    res = runner.run_case(case, cfg)
    assert res.status == runner.Status.ERROR and "tree_accept" in res.reason and "symbolic link" in res.reason
    assert (theirs / "default.cpu.kdtr").read_bytes() == PRECIOUS


# --- kdtr show --svg, kdtr convert, kdtr.save ---------------------------------------------------


def test_show_svg_refuses_a_symlink_and_keeps_it(tmp_path, repo_root):
    target = _precious(tmp_path)
    link = tmp_path / "tree.svg"
    os.symlink(target, link)
    r = CliRunner().invoke(main, ["show", str(repo_root / "golden" / "tree_accept" / "chain.kdtr"), "--svg", str(link)],
                           catch_exceptions=False)
    assert r.exit_code == 2, r.output
    assert "tree.svg" in r.output and "symbolic link" in r.output
    assert target.read_bytes() == PRECIOUS and os.readlink(link) == str(target)


def test_convert_force_refuses_a_symlinked_destination(tmp_path, repo_root):
    target = _precious(tmp_path)
    link = tmp_path / "out.npz"
    os.symlink(target, link)
    r = CliRunner().invoke(main, ["convert", str(repo_root / "golden" / "tree_accept" / "chain.kdtr"), str(link),
                                  "--force"], catch_exceptions=False)
    _one_line_refusal(r, "out.npz", "symbolic link")
    assert target.read_bytes() == PRECIOUS and os.readlink(link) == str(target)


@pytest.mark.parametrize("kind", ["symlink", "fifo", "dir"])
def test_save_replaces_regular_files_only(tmp_path, kind):
    dest = tmp_path / "x.kdtr"
    target = _precious(tmp_path)
    if kind == "symlink":
        os.symlink(target, dest)
    elif kind == "fifo":
        os.mkfifo(dest)
    else:
        dest.mkdir()
    with pytest.raises(fsutil.UnsafePath):
        kdtr.save(dest, {"x": np.zeros(2, np.int8)})
    assert target.read_bytes() == PRECIOUS
    assert sorted(p.name for p in tmp_path.iterdir()) == ["precious.txt", "x.kdtr"]  # no temporary left


def test_a_precreated_temporary_name_is_never_used(tmp_path, monkeypatch):
    """Someone predicts the temporary name (here: forced) and plants a link there: the
    writer draws another name; the planted link and its target stay as they were."""
    target = _precious(tmp_path)
    names = iter(["deadbeef", "deadbeef", "cafef00d"])
    monkeypatch.setattr(fsutil.secrets, "token_hex", lambda n: next(names))
    planted = tmp_path / ".a.json.deadbeef.tmp"
    os.symlink(target, planted)
    fsutil.atomic_write(tmp_path / "a.json", b"new")
    assert (tmp_path / "a.json").read_bytes() == b"new"
    assert os.readlink(planted) == str(target) and target.read_bytes() == PRECIOUS
    assert sorted(p.name for p in tmp_path.iterdir()) == [".a.json.deadbeef.tmp", "a.json", "precious.txt"]


def test_regen_of_a_symlinked_golden_dir_keeps_the_link(tmp_path, monkeypatch):
    """The set the link points to is replaced; the link itself stays (the old code renamed
    the link aside and put a directory in its place)."""
    from kdtr import goldens
    from kdtr.registry import Registry

    real = tmp_path / "data" / "golden"
    real.mkdir(parents=True)
    link = tmp_path / "golden"
    os.symlink(real, link)
    reg = Registry()
    monkeypatch.setattr(reg, "all_configs", lambda: [])
    goldens.regenerate(link, reg)
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert (real / goldens.MANIFEST_NAME).is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "golden"]
