"""The report set of a run is replaced as one unit (kdtr/fsutil.py ReportSet,
kdtr/report.py write_all, kdtr/mutate/report.py write_reports).

The writer is killed after each of its file-system operations in turn (every call of
os.open, mkdir, symlink, replace, rename, link, unlink, rmdir, fsync and the directory
exchange raises from the k-th on, as if the process had died there), for every k until
it completes. After each kill a reader of the published names (reports/conformance.json,
junit.xml, conformance.md, obtained/...) sees the complete previous set or the complete
new one, never a mix and never a part; so does a reader of the pointer
(report.current_reports). The next run then publishes its set and leaves only its own
run directory behind.
"""

from __future__ import annotations

import json
import os
import re
import xml.etree.ElementTree as ET
from contextlib import contextmanager
from pathlib import Path

import pytest

from kdtr import fsutil, report
from kdtr import run as runner

FS_CALLS = ("open", "mkdir", "symlink", "replace", "rename", "link", "unlink", "rmdir", "fsync")
OBTAINED_REL = Path("tree_accept") / "a.cpu.kdtr"


@pytest.fixture(autouse=True)
def _no_fsync(monkeypatch):
    """Durability is not under test here; hundreds of fsyncs would only make it slow
    (fsync is still one of the counted steps)."""
    monkeypatch.setattr(os, "fsync", lambda fd: None)


class Killed(BaseException):
    """The writer's process 'died' here."""


@contextmanager
def killed_after(k: int):
    """Every file-system call from the k-th on raises Killed; yields the call counter.
    Report sets begun meanwhile have their marker lock dropped afterwards, as a dead
    process's would be."""
    calls = [0]
    saved = {name: getattr(os, name) for name in FS_CALLS}
    saved_exchange = fsutil.exchange
    sets: list[fsutil.ReportSet] = []
    real_begin = fsutil.ReportSet.begin

    def wrap(real):
        def call(*a, **kw):
            calls[0] += 1
            if calls[0] >= k:
                raise Killed
            return real(*a, **kw)
        return call

    def begin(self):
        sets.append(self)
        return real_begin(self)

    for name, real in saved.items():
        setattr(os, name, wrap(real))
    fsutil.exchange = wrap(saved_exchange)
    fsutil.ReportSet.begin = begin
    try:
        yield calls
    finally:
        for name, real in saved.items():
            setattr(os, name, real)
        fsutil.exchange = saved_exchange
        fsutil.ReportSet.begin = real_begin
        for s in sets:
            s._release()


def _env(run: str) -> dict:
    return dict(date="d", host="h", platform="p", python="3", numpy="2", run_id=run)


def _results(run: str) -> list[runner.CaseResult]:
    case = runner.Case("tree_accept", "a", Path("x"), "cpu")
    return [runner.CaseResult(case, "ERROR", reason=f"run {run}")]  # in every report's details


def _write(rdir: Path, run: str, obtained: bool) -> list[Path]:
    """One run's reports (and, with ``obtained``, one obtained output) published."""
    if not obtained:
        return report.write_all(rdir, _results(run), _env(run))
    rset = report.report_set(rdir)
    run_dir = rset.begin()
    out = run_dir / report.OBTAINED / OBTAINED_REL
    out.parent.mkdir(parents=True)
    out.write_text(run)
    results = _results(run)
    results[0].output_file = str(out)
    return report.write_all(rdir, results, _env(run), rset)


def _legacy(rdir: Path, run: str) -> None:
    """The reports an older kdtr left: regular files and a real obtained/ directory."""
    rdir.mkdir(parents=True)
    texts = [json.dumps(report.to_json(_results(run), _env(run))), report.junit(_results(run), _env(run)),
             report.markdown(_results(run), _env(run))]
    for name, text in zip(report.REPORT_NAMES, texts):
        (rdir / name).write_text(text)
    (rdir / "obtained" / OBTAINED_REL).parent.mkdir(parents=True)
    (rdir / "obtained" / OBTAINED_REL).write_text(run)


def _runs_seen(base: Path, obtained: bool) -> set[str | None]:
    """The run of every file a reader finds under ``base`` (None for a missing one)."""
    seen: set[str | None] = set()
    try:
        seen.add(json.loads((base / "conformance.json").read_text())["environment"]["run_id"])
    except FileNotFoundError:
        seen.add(None)
    try:
        props = ET.parse(base / "junit.xml").getroot().find("properties")
        seen.add(next(p.get("value") for p in props if p.get("name") == "run_id"))
    except FileNotFoundError:
        seen.add(None)
    try:
        md = (base / "conformance.md").read_text()
        m = re.search(r"^Run: (.*)\.$", md, re.M) or re.search(r": run (\w+)", md)
        seen.add(m[1] if m else "?")
    except FileNotFoundError:
        seen.add(None)
    if obtained:
        try:
            seen.add((base / "obtained" / OBTAINED_REL).read_text())
        except FileNotFoundError:
            seen.add(None)
    return seen


def _assert_one_complete_set(rdir: Path, allowed: set, obtained: bool, k: int) -> str | None:
    seen = _runs_seen(rdir, obtained)
    assert len(seen) == 1 and seen <= allowed, f"killed at call {k}: a reader sees {seen}"
    current = report.current_reports(rdir) if hasattr(report, "current_reports") else None
    if current is not None:
        assert _runs_seen(current, obtained) == seen, f"killed at call {k}: pointer and names disagree"
    return next(iter(seen))


def _untidy(rdir: Path) -> list[str] | None:
    """After a completed run there is its pointer, its one run directory and the fixed
    links, nothing else: None; else what there is."""
    names = sorted(p.name for p in rdir.iterdir())
    runs = [n for n in names if n.startswith(".conformance-")]
    if len(runs) != 1 or names != sorted([".conformance", runs[0], *report.REPORT_NAMES, report.OBTAINED]):
        return names
    if any(os.readlink(rdir / n) != f".conformance/{n}" for n in (*report.REPORT_NAMES, report.OBTAINED)):
        return names
    return None


def _assert_tidy(rdir: Path) -> None:
    names = _untidy(rdir)
    assert names is None, names


@pytest.mark.parametrize("before, obtained", [("published", False), ("published", True), ("none", True),
                                              ("legacy", True)])
def test_a_writer_killed_at_any_step_leaves_the_old_set_or_the_new_one(tmp_path, before, obtained):
    """before: a set published by kdtr, no set, or an older kdtr's plain files and obtained/."""
    old = {"published": "old", "none": None, "legacy": "legacy"}[before]
    k = 1
    untidy = []
    while True:
        rdir = tmp_path / f"k{k}" / "reports"
        if before == "published":
            _write(rdir, "old", obtained)
        elif before == "legacy":
            _legacy(rdir, "legacy")
        with killed_after(k) as calls:
            try:
                _write(rdir, "new", obtained)
                done = True
            except Killed:
                done = False
        seen = _assert_one_complete_set(rdir, {old, "new"}, obtained or before == "legacy", k)
        _write(rdir, "next", obtained)  # the next run recovers whatever was left
        assert _runs_seen(rdir, obtained) == {"next"}
        if (names := _untidy(rdir)) is not None:
            untidy.append((k, names))
        if done:
            assert seen == "new" and calls[0] < k
            break
        k += 1
    assert k > 10  # the writer's steps were really visited one by one
    assert not untidy, untidy[:3]  # and each kill was tidied away by the next run


def test_the_top_level_names_are_links_fixed_once(tmp_path):
    """CI reads reports/conformance.md, reports/junit.xml: they are links into the pointer,
    created once; a run changes only the pointer (and its own directory)."""
    rdir = tmp_path / "reports"
    _write(rdir, "one", True)
    inodes = {n: os.lstat(rdir / n).st_ino for n in (*report.REPORT_NAMES, report.OBTAINED)}
    _write(rdir, "two", True)
    assert {n: os.lstat(rdir / n).st_ino for n in inodes} == inodes
    assert (rdir / "obtained" / OBTAINED_REL).read_text() == "two"
    assert report.current_reports(rdir) == rdir / os.readlink(rdir / ".conformance")


def test_a_set_in_progress_is_never_removed_by_another_publisher(tmp_path):
    """Its creator holds an flock on its marker until it has published."""
    rdir = tmp_path / "reports"
    slow = report.report_set(rdir)
    slow_dir = slow.begin()
    _write(rdir, "fast", False)
    assert slow_dir.is_dir()
    report.write_all(rdir, _results("slow"), _env("slow"), slow)
    assert _runs_seen(rdir, False) == {"slow"}
    _assert_tidy(rdir)


def test_only_run_directories_kdtr_made_are_removed(tmp_path):
    rdir = tmp_path / "reports"
    rdir.mkdir()
    (rdir / ".conformance-theirs").mkdir()  # the right name, no marker
    (rdir / ".conformance-theirs" / "keep").write_text("x")
    theirs = tmp_path / "theirs"
    (theirs).mkdir()
    (theirs / fsutil.SET_MARKER).write_text("kdtr report set\n")
    os.symlink(theirs, rdir / ".conformance-link")  # a link, even to a marked directory
    _write(rdir, "one", False)
    assert (rdir / ".conformance-theirs" / "keep").read_text() == "x"
    assert (theirs / fsutil.SET_MARKER).exists() and (rdir / ".conformance-link").is_symlink()


def test_a_pointer_kdtr_did_not_make_is_refused(tmp_path):
    rdir = tmp_path / "reports"
    rdir.mkdir()
    os.symlink(tmp_path, rdir / ".conformance")
    with pytest.raises(fsutil.UnsafePath, match="did not make"):
        _write(rdir, "one", False)
    assert os.readlink(rdir / ".conformance") == str(tmp_path)
    assert sorted(p.name for p in rdir.iterdir()) == [".conformance"]  # nothing made, nothing left


def _mutation_env(run: str) -> dict:
    return {"run": run}


def _mutation_runs(rdir: Path) -> set[str | None]:
    seen: set[str | None] = set()
    try:
        seen.add(json.loads((rdir / "mutation.json").read_text())["environment"]["run"])
    except FileNotFoundError:
        seen.add(None)
    try:
        m = re.search(r"^- run: (\w+)$", (rdir / "mutation.md").read_text(), re.M)
        seen.add(m[1] if m else "?")
    except FileNotFoundError:
        seen.add(None)
    return seen


def test_kdtr_mutate_reports_are_one_set_too(tmp_path):
    from kdtr import mutate as mut

    k = 1
    while True:
        rdir = tmp_path / f"k{k}"
        mut.write_reports(rdir, [], {}, _mutation_env("old"))
        with killed_after(k):
            try:
                mut.write_reports(rdir, [], {}, _mutation_env("new"))
                done = True
            except Killed:
                done = False
        seen = _mutation_runs(rdir)
        assert len(seen) == 1 and seen <= {"old", "new"}, f"killed at call {k}: {seen}"
        if done:
            assert seen == {"new"}
            break
        k += 1
    assert k > 10
