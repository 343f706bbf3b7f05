"""kdtr mutate (kdtr/mutate/, docs/mutation.md): the catalogue's schema and that every
entry still applies to today's code, the generic pass's line selection and sampling, the
scoring, and one end-to-end run over a small catalogue whose outcomes are known."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from click.testing import CliRunner

from conftest import REPO_ROOT
from kdtr import goldens
from kdtr import mutate as mut
from kdtr.cli.main import main
from timing import HANG_GUARD, wait_for

TA = "cuda_tests/kernels/tree_accept.cuh"


# --- the committed catalogue -----------------------------------------------------------

def test_every_catalogue_mutant_applies_to_todays_code():
    mutants = mut.load_catalogue(REPO_ROOT)
    for m in mutants:
        text = (REPO_ROOT / m.file).read_text()
        assert m.apply(text) != text, m.id
        assert text.count(m.find) == 1, m.id


def test_catalogue_covers_every_op_with_at_least_60_mutants():
    mutants = mut.load_catalogue(REPO_ROOT)
    assert len(mutants) >= 60
    for op in mut.OPS:
        assert sum(m.op == op for m in mutants) >= 8, op
    assert len({m.id for m in mutants}) == len(mutants)


def test_generic_triage_file_is_well_formed():
    triage = mut.load_triage(REPO_ROOT)
    for file, original, mutated in triage:
        assert (REPO_ROOT / file).is_file(), file
        assert original != mutated


# --- schema errors name the file, the entry and the field --------------------------------

GOOD = '''[[mutant]]
name = "bonus_late"
op = "tree_accept"
file = "cuda_tests/kernels/tree_accept.cuh"
bug = "off by one"
origin = "test"
find = "proposed[accepted] = target_predict[cur];"
replace = "proposed[accepted + 1] = target_predict[cur];"
'''


def _catalogue(tmp_path, text, name="tree_accept.toml"):
    d = tmp_path / "cat"
    d.mkdir(exist_ok=True)
    (d / name).write_text(text)
    return d


def test_good_entry_loads(tmp_path):
    (m,) = mut.load_catalogue(REPO_ROOT, _catalogue(tmp_path, GOOD))
    assert m.id == "tree_accept/bonus_late" and m.line > 1 and m.kind == "catalogue"


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace('bug = "off by one"\n', ""), "field 'bug' missing"),
    (lambda t: t.replace('origin = "test"', 'origin = ""'), "field 'origin' missing"),
    (lambda t: t + 'colour = "red"\n', "unknown field 'colour'"),
    (lambda t: t.replace('name = "bonus_late"', 'name = "Bonus late"'), "field 'name'"),
    (lambda t: t.replace('op = "tree_accept"', 'op = "tree_build"'), "field 'op'"),
    (lambda t: t.replace('cuda_tests/kernels/tree_accept.cuh', '../etc/passwd'), "field 'file'"),
    (lambda t: t.replace('cuda_tests/kernels/tree_accept.cuh', 'cuda_tests/kernels/nope.cuh'), "field 'file'"),
    (lambda t: t.replace('find = "proposed[accepted] = target_predict[cur];"', 'find = "no such text"'),
     "occurs 0 times"),
    (lambda t: t.replace('find = "proposed[accepted] = target_predict[cur];"', 'find = "int32_t"'),
     "must occur exactly once"),
    (lambda t: t.replace('replace = "proposed[accepted + 1] = target_predict[cur];"',
                         'replace = "proposed[accepted] = target_predict[cur];"'), "no edit"),
    (lambda t: t + 'equivalent = "  "\n', "field 'equivalent'"),
    (lambda t: t + t, "duplicate mutant tree_accept/bonus_late"),
    (lambda t: t.replace("[[mutant]]", "[[mutants]]"), "unknown top-level key"),
    (lambda t: t.replace('name = "bonus_late"', 'name = "bonus_late'), "unreadable catalogue"),
])
def test_bad_entries_are_rejected_naming_file_entry_and_field(tmp_path, edit, message):
    d = _catalogue(tmp_path, edit(GOOD))
    with pytest.raises(mut.CatalogueError, match="tree_accept.toml") as exc:
        mut.load_catalogue(REPO_ROOT, d)
    assert message in str(exc.value)


def test_empty_catalogue_dir_is_an_error(tmp_path):
    (tmp_path / "cat").mkdir()
    with pytest.raises(mut.CatalogueError, match="no catalogue files"):
        mut.load_catalogue(REPO_ROOT, tmp_path / "cat")


@pytest.mark.parametrize("text, message", [
    ('[[survivor]]\nfile = "a"\noriginal = "x"\nmutated = "y"\nverdict = "maybe"\nreason = "r"\n', "verdict"),
    ('[[survivor]]\nfile = "a"\noriginal = "x"\nmutated = "y"\nverdict = "gap"\n', "field 'reason'"),
    ('[[survivor]\n', "unreadable triage file"),
])
def test_bad_triage_entries_are_rejected(tmp_path, text, message):
    d = _catalogue(tmp_path, text, mut.TRIAGE_FILE)
    with pytest.raises(mut.CatalogueError, match=message):
        mut.load_triage(REPO_ROOT, d)


# --- generic pass pieces ---------------------------------------------------------------------

def test_code_lines_skip_comments_blank_and_preprocessor_lines():
    text = "// header\n#pragma once\n\nint x = 1;  // note\n  // indented comment\n  return x;\n"
    assert mut.code_lines(text) == [4, 6]


def test_generic_mutant_refuses_a_moved_line():
    m = mut.Mutant("generic/x/2.1", "tree_accept", TA, "g", "o", "b = 1;", "b = 0;", line=2, kind="generic")
    assert m.apply("a\nb = 1;\nc") == "a\nb = 0;\nc"
    with pytest.raises(mut.CatalogueError, match="the line changed"):
        m.apply("a\nb = 2;\nc")


def test_sample_is_deterministic_bounded_per_op_and_keeps_order():
    ms = [mut.Mutant(f"generic/{op}/{i}.1", op, TA, "g", "o", "x", "y", line=i, kind="generic")
          for op in ("tree_accept", "verify_attn") for i in range(1, 30)]
    a, b = mut.sample(ms, 5, seed=1), mut.sample(ms, 5, seed=1)
    assert a == b and len(a) == 10
    assert [m for m in ms if m in a] == a
    assert mut.sample(ms, 5, seed=2) != a
    assert mut.sample(ms, 0) == ms


def test_score_and_failing():
    def r(kind, outcome, equivalent="", find="x"):
        m = mut.Mutant("tree_accept/a", "tree_accept", TA, "b", "o", find, "y", equivalent, kind=kind)
        return mut.MutantResult(m, outcome)

    rs = [r("catalogue", mut.KILLED), r("catalogue", mut.SURVIVED), r("catalogue", mut.EQUIVALENT, "why"),
          r("catalogue", mut.IDENTICAL), r("catalogue", mut.BAD_CLAIM, "why")]
    s = mut.score(rs)["tree_accept"]
    assert (s[mut.KILLED], s[mut.SURVIVED], s["score"]) == (1, 1, pytest.approx(2 / 3))
    assert [x.outcome for x in mut.failing(rs, {})] == [mut.SURVIVED, mut.BAD_CLAIM]
    gen = [r("generic", mut.SURVIVED, find="a"), r("generic", mut.SURVIVED, find="b"),
           r("generic", mut.SURVIVED, find="c")]
    triage = {(TA, "a", "y"): mut.Triage(TA, "a", "y", "equivalent", "r"),
              (TA, "b", "y"): mut.Triage(TA, "b", "y", "gap", "r")}
    assert [x.mutant.find for x in mut.failing(gen, triage)] == ["b", "c"]


# --- end to end: a small catalogue against one golden -------------------------------------

E2E = {
    "killed": ("proposed[accepted] = target_predict[cur];  // the bonus token",
               "proposed[accepted + (accepted > 0)] = target_predict[cur];  // the bonus token", ""),
    # tree_accept/default holds no negative id: the goldens given to this run cannot tell.
    "survives": ("    return {0, TREE_ACCEPT_NEGATIVE_TOKEN};", "    return {0, TREE_ACCEPT_OK};", ""),
    "true_claim": ("if (!ok && lane == 0 && T > 0)", "if (!ok && lane == 0 && T >= 0)",
                   "T >= 1 always (a golden has at least the root slot)"),
    "bad_claim": ("proposed[accepted] = target_predict[cur];  // the bonus token",
                  "proposed[accepted + (accepted > 0)] = target_predict[cur];  // the bonus token",
                  "wrongly claimed"),
    "comment_only": ("int32_t accepted = 0;", "int32_t accepted = 0;  // a comment", ""),
    "no_compile": ("int32_t accepted = 0;", "int32_t accepted = ;", ""),
}


@pytest.mark.slow  # builds and runs mutants (about 20 s)
def test_end_to_end_outcomes_reports_and_exit_code(tmp_path):
    cat = tmp_path / "cat"
    cat.mkdir()
    entries = []
    for name, (find, replace, eq) in E2E.items():
        e = (f'[[mutant]]\nname = "{name}"\nop = "tree_accept"\nfile = "{TA}"\nbug = "test"\norigin = "test"\n'
             f"find = '''{find}'''\nreplace = '''{replace}'''\n")
        entries.append(e + (f'equivalent = "{eq}"\n' if eq else ""))
    (cat / "tree_accept.toml").write_text("\n".join(entries))
    gdir = tmp_path / "golden"
    (gdir / "tree_accept").mkdir(parents=True)
    shutil.copy2(REPO_ROOT / "golden" / "tree_accept" / "default.kdtr", gdir / "tree_accept" / "default.kdtr")
    goldens.write_manifest(gdir, goldens.manifest_of_files(gdir))
    rdir = tmp_path / "reports"
    args = ["mutate", "--catalogue-dir", str(cat), "--golden-dir", str(gdir), "--report-dir", str(rdir), "-j", "2"]
    res = CliRunner().invoke(main, args, catch_exceptions=False)
    assert res.exit_code == 1, res.output
    data = json.loads((rdir / "mutation.json").read_text())
    outcome = {m["id"].split("/")[1]: m for m in data["mutants"]}
    assert {k: v["outcome"] for k, v in outcome.items()} == {
        "killed": mut.KILLED, "survives": mut.SURVIVED, "true_claim": mut.EQUIVALENT, "bad_claim": mut.BAD_CLAIM,
        "comment_only": mut.IDENTICAL, "no_compile": mut.STILLBORN}
    assert outcome["killed"]["killed_by"] == ["tree_accept/default@cpu"]
    assert data["score"]["catalogue"]["tree_accept"]["score"] == pytest.approx(2 / 3)
    md = (rdir / "mutation.md").read_text()
    assert "SURVIVED `tree_accept/survives`" in md and "BAD_CLAIM `tree_accept/bad_claim`" in md
    # Only the mutants that pass: exit 0, both verdicts from the cache the real builds filled
    res = CliRunner().invoke(main, [*args, "--only", "tree_accept/killed", "--only", "tree_accept/true_claim"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "verdict cache: 2 of 2 verdicts" in res.output


def test_a_failing_unmutated_build_stops_the_run(tmp_path):
    """If a golden fails on the unmutated build, no mutant can be judged: usage error."""
    import numpy as np

    import kdtr

    gdir = tmp_path / "golden"
    (gdir / "tree_accept").mkdir(parents=True)
    with kdtr.load(REPO_ROOT / "golden" / "tree_accept" / "default.kdtr") as g:
        tensors = {k: np.array(v) for k, v in g.tensors.items()}
        meta = dict(g.metadata)
    tensors["expected.accepted_count"] = tensors["expected.accepted_count"] + 1
    kdtr.save(gdir / "tree_accept" / "default.kdtr", tensors, meta)
    goldens.write_manifest(gdir, goldens.manifest_of_files(gdir))
    res = CliRunner().invoke(main, ["mutate", "--golden-dir", str(gdir), "--report-dir", str(tmp_path / "r"),
                                    "--only", "tree_accept/*"], catch_exceptions=False)
    assert res.exit_code == 2
    assert "unmutated cpu build does not pass tree_accept/default@cpu" in res.output
    assert not (tmp_path / "r" / "mutation.json").exists()


def test_sigterm_stops_the_run_promptly_and_writes_no_report(tmp_path):
    """SIGTERM while mutants build: queued mutants dropped, builds killed, exit 128 + 15."""
    import os
    import signal
    import subprocess
    import sys

    from timing import never_fifo, release_fifo

    mut.Workspace(REPO_ROOT, tmp_path)  # the cached unmutated build, so the run reaches the mutants at once
    cat = tmp_path / "cat"
    cat.mkdir()
    # each mutant's compile blocks forever (it #includes a FIFO nothing writes to): only a
    # run that handles SIGTERM at once, killing the build, ever ends
    fifo = never_fifo(tmp_path)
    (cat / "tree_accept.toml").write_text("\n".join(
        f'[[mutant]]\nname = "m{i}"\nop = "tree_accept"\nfile = "{TA}"\nbug = "b"\norigin = "o"\n'
        f"find = '''int32_t accepted = 0;'''\nreplace = '''int32_t accepted = {i} - {i};\n#include \"{fifo}\"'''\n"
        for i in range(1, 9)))
    gdir = tmp_path / "golden"  # one golden: the run is among the mutant builds within a second or two
    (gdir / "tree_accept").mkdir(parents=True)
    shutil.copy2(REPO_ROOT / "golden" / "tree_accept" / "default.kdtr", gdir / "tree_accept" / "default.kdtr")
    goldens.write_manifest(gdir, goldens.manifest_of_files(gdir))
    rdir = tmp_path / "reports"
    scratch = tmp_path / "tmp"  # TMPDIR of the run: its scratch directory, kdtr-mutate-*, appears here
    scratch.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "kdtr.cli", "mutate", "--catalogue-dir", str(cat), "-j", "1",
                             "--golden-dir", str(gdir), "--report-dir", str(rdir)], cwd=REPO_ROOT,
                            stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, PYTHONPATH=str(REPO_ROOT), TMPDIR=str(scratch)))
    try:
        # the first mutant's build has started (its scratch copy m1 exists): signal it now
        wait_for(lambda: any(scratch.glob("kdtr-mutate-*/m1")), "the first mutant's build did not start")
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=HANG_GUARD)  # the builds never end by themselves
    except subprocess.TimeoutExpired:
        pytest.fail("kdtr mutate did not stop on SIGTERM")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
            release_fifo(fifo)  # no compiler left blocked on it
    assert proc.returncode == 128 + signal.SIGTERM, out
    assert "mutation run stopped" in out
    assert not (rdir / "mutation.json").exists()


@pytest.mark.slow  # the unmutated build when the sources changed (about 1 s when it is cached)
def test_a_core_edit_recompiles_only_that_core_and_relinks_only_its_binaries(tmp_path):
    """The per-mutant build cost: a tree_accept core mutant recompiles cpu_tree_accept.o
    alone and relinks the three binaries that link it (kdtr_tree_accept, kdtr_greedy_step,
    kdtr_ddtree_decode)."""
    from kdtr.mutate import workspace

    ws = mut.Workspace(REPO_ROOT, tmp_path)
    assert ws.ops_of(TA) == ["tree_accept", "greedy_step", "ddtree_decode"]
    assert ws.ops_of("cuda_tests/kernels/tree_build.cuh") == ["tree_build", "greedy_step", "ddtree_decode"]
    assert ws.ops_of("cuda_tests/kernels/ddtree_decode.cuh") == ["ddtree_decode"]
    d = ws.mutant_dir()
    src = d / TA
    src.write_text(src.read_text() + "\nstatic inline int kdtr_mutant_probe() { return 1; }\n")
    st = src.stat()
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))
    outputs = [p.relative_to(d).as_posix() for p in sorted((d / "build").rglob("*"))
               if p.suffix == ".o" or p.parent.name == "bin"]
    before = {p: (d / p).stat().st_mtime_ns for p in outputs}
    r = workspace._make(d, [workspace.binary(op) for op in mut.OPS], None)
    assert r.returncode == 0, r.stderr
    redone = sorted(p for p in outputs if (d / p).stat().st_mtime_ns != before[p])
    assert redone == ["build/bin/kdtr_ddtree_decode", "build/bin/kdtr_greedy_step", "build/bin/kdtr_tree_accept",
                      "build/obj/cpu_tree_accept.o"]
