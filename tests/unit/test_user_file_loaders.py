"""Every loader of a user file refuses a bad one with one line, exit 2, naming the file (and
the entry and field where there is one): the mutant catalogue (mutants/<op>.toml) and the
triage file (mutants/generic_triage.toml) through ``kdtr mutate``, golden/known_failures.json
and golden/MANIFEST.json through ``kdtr run`` (kdtr/userfiles.py).

Each file is given malformed syntax, bytes that are not UTF-8, nesting deeper than the parser
recurses, a size over the limit, the wrong types, and a FIFO (refused at once, not waited on).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import golden_subset
from kdtr import goldens, userfiles
from kdtr.cli.main import main

GOOD_MUTANT = '''[[mutant]]
name = "bonus_late"
op = "tree_accept"
file = "cuda_tests/kernels/tree_accept.cuh"
bug = "off by one"
origin = "test"
find = "proposed[accepted] = target_predict[cur];"
replace = "proposed[accepted + 1] = target_predict[cur];"
'''

DEEP_TOML = b"x = " + b"[" * 100_000 + b"]" * 100_000 + b"\n"
DEEP_JSON = b"[" * 100_000 + b"]" * 100_000


def _manifest_text(gdir: Path) -> str:
    return (gdir / goldens.MANIFEST_NAME).read_text()


# (loader, defect) -> (file content, or None for a FIFO; fragments the line must hold)
CASES: dict[tuple[str, str], tuple[bytes | None, tuple[str, ...]]] = {
    ("catalogue", "syntax"): (b"[[mutant]\n", ("not valid TOML",)),
    ("catalogue", "not UTF-8"): (GOOD_MUTANT.encode() + b"# \xff\xfe\n", ("not UTF-8",)),
    ("catalogue", "deep"): (DEEP_TOML, ("nested too deep",)),
    ("catalogue", "huge"): (GOOD_MUTANT.encode() + b"#" * 30_000 + b"\n", ("limit",)),
    ("catalogue", "types"): (b"mutant = [1, 2]\n", ("mutant #1", "not a table")),
    ("catalogue", "nul in file"): (GOOD_MUTANT.replace("tree_accept.cuh", "tree_accept.cuh\\u0000x").encode(),
                                   ("mutant #1", "field 'file'")),
    ("catalogue", "fifo"): (None, ("FIFO",)),
    ("triage", "syntax"): (b"[[survivor]\n", ("not valid TOML",)),
    ("triage", "not UTF-8"): (b"# \xff\n", ("not UTF-8",)),
    ("triage", "deep"): (DEEP_TOML, ("nested too deep",)),
    ("triage", "huge"): (b"#" * 30_000 + b"\n", ("limit",)),
    ("triage", "types"): (b'survivor = "x"\n', ("'survivor'", "not [[survivor]] tables")),
    ("triage", "entry types"): (b"survivor = [1]\n", ("survivor #1", "not a table")),
    ("triage", "fifo"): (None, ("FIFO",)),
    ("known failures", "syntax"): (b"{", ("not valid JSON", "line 1")),
    ("known failures", "not UTF-8"): (b'{"a/b": "\xff"}', ("not UTF-8",)),
    ("known failures", "deep"): (DEEP_JSON, ("nested too deep",)),
    ("known failures", "huge"): (b'{"tree_accept/default": "' + b"x" * 30_000 + b'"}', ("limit",)),
    ("known failures", "types"): (b'{"tree_accept/default": ["why"]}', ('"tree_accept/default"', "not list")),
    ("known failures", "fifo"): (None, ("FIFO",)),
    ("manifest", "syntax"): (b"{", ("not valid JSON",)),
    ("manifest", "not UTF-8"): (b'{"format": "\xff"}', ("not UTF-8",)),
    ("manifest", "deep"): (DEEP_JSON, ("nested too deep",)),
    ("manifest", "types"): (json.dumps({"format": goldens.MANIFEST_FORMAT, "files": []}).encode(),
                            ('"files"', "a JSON list")),
    ("manifest", "entry types"): (json.dumps({"format": goldens.MANIFEST_FORMAT,
                                              "files": {"tree_accept/default.kdtr": 7}}).encode(),
                                  ('"tree_accept/default.kdtr"', "not an entry")),
    ("manifest", "fifo"): (None, ("FIFO",)),
}


def _invoke(tmp_path: Path, loader: str, content: bytes | None):
    """Put ``content`` (None: a FIFO) where ``loader`` reads it; run the command that loads
    it; return (result, the file)."""
    if loader in ("catalogue", "triage"):
        cat = tmp_path / "cat"
        cat.mkdir()
        target = cat / ("tree_accept.toml" if loader == "catalogue" else "generic_triage.toml")
        if loader == "triage":
            (cat / "tree_accept.toml").write_text(GOOD_MUTANT)
        args = ["mutate", "--catalogue-dir", str(cat), "--report-dir", str(tmp_path / "r")]
    else:
        gdir = golden_subset(tmp_path, "tree_accept", ["default"])
        target = gdir / ("known_failures.json" if loader == "known failures" else goldens.MANIFEST_NAME)
        target.unlink(missing_ok=True)
        args = ["run", "--golden-dir", str(gdir), "--backend", "cpu", "--report-dir", str(tmp_path / "r")]
    if content is None:
        os.mkfifo(target)
    else:
        target.write_bytes(content)
    hung = []

    def unblock() -> None:  # hang guard: a writer lets an open blocked on the FIFO return
        hung.append(True)
        try:
            os.close(os.open(target, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass

    guard = threading.Timer(60, unblock) if content is None else None
    if guard:
        guard.start()
    try:
        r = CliRunner().invoke(main, args)
    finally:
        if guard:
            guard.cancel()
    assert not hung, f"{loader}: blocked on a FIFO"
    return r, target


@pytest.mark.parametrize("loader, defect", list(CASES), ids=[f"{a}-{b}" for a, b in CASES])
def test_bad_user_file_is_one_line_exit_2(tmp_path, monkeypatch, loader, defect):
    content, fragments = CASES[(loader, defect)]
    if defect == "huge":
        monkeypatch.setattr(userfiles, "MAX_TEXT_BYTES", 20_000)  # over tree_accept.cuh, a catalogue's source
    r, target = _invoke(tmp_path, loader, content)
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert r.exit_code == 2, (r.exit_code, r.output)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("kdtr: error: ") and str(target) in lines[0], lines[0]
    for f in fragments:
        assert f in lines[0], (f, lines[0])


def test_userfiles_reports_the_limit_and_reads_growth_bounded(tmp_path, monkeypatch):
    p = tmp_path / "f.json"
    p.write_text('{"a": 1}')
    assert userfiles.load_json(p, "thing") == {"a": 1}
    monkeypatch.setattr(userfiles, "MAX_TEXT_BYTES", 4)
    with pytest.raises(userfiles.UserFileError, match="8 bytes, over the 4-byte limit for a thing"):
        userfiles.load_json(p, "thing")
