"""``kdtr show`` and the report's tree SVGs take goldens and output files as untrusted data:
every string from a file (metadata config and op, file names) is escaped for the terminal
and the SVG (``\\xNN``: XML 1.0 forbids most control characters even as character
references), and every output a binary can write -- any rank, dtype, shape or value, a
tensor missing -- is drawn or refused with one line (exit 2), never a traceback."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner

import kdtr
from kdtr.cli.main import main
from kdtr.cli.show import case_svg

GOLDEN = Path(__file__).resolve().parents[2] / "golden"
HOSTILE = "".join(chr(i) for i in range(32)) + "\x7f\x85\u2028\u202e\ufffe\uffff<&>]]>"
CASES = [("tree_accept", "chain"), ("tree_accept", "malformed"), ("tree_build", "default"),
         ("greedy_step", "default")]


def arrays(path: Path) -> tuple[dict, dict]:
    with kdtr.load(path) as g:
        return {k: np.array(v) for k, v in g.tensors.items()}, dict(g.metadata)


def expected_as_output(op: str, config: str) -> dict:
    t, _ = arrays(GOLDEN / op / f"{config}.kdtr")
    return {k[len("expected."):]: v for k, v in t.items() if k.startswith("expected.")}


def show(*args) -> click.testing.Result:  # noqa: F821
    return CliRunner().invoke(main, ["show", *map(str, args)])


def assert_clean(text: str) -> None:
    """No control character but the newline (no ESC, BEL, NUL, CR), no bidi override."""
    bad = [c for c in text if (ord(c) < 32 and c != "\n") or c in "\x7f\x85\u2028\u202e"]
    assert not bad, sorted(set(bad))


def hostile_golden(tmp_path: Path) -> Path:
    t, meta = arrays(GOLDEN / "tree_accept" / "chain.kdtr")
    meta["config"] = "chain\x1b[2J\x1b]0;pwned\x07" + HOSTILE
    path = tmp_path / "g\x1b[31m\x07.kdtr"
    kdtr.save(path, t, meta)
    return path


def test_config_with_escape_sequences_never_reaches_the_terminal_raw(tmp_path):
    golden = hostile_golden(tmp_path)
    r = show(golden)
    assert r.exit_code == 0, r.output
    assert_clean(r.output)
    assert "tree_accept/chain\\x1b[2J\\x1b]0;pwned\\x07" in r.output


def test_long_config_is_cut(tmp_path):
    t, meta = arrays(GOLDEN / "tree_accept" / "chain.kdtr")
    meta["config"] = "x" * 100_000
    path = tmp_path / "long.kdtr"
    kdtr.save(path, t, meta)
    r = show(path)
    assert r.exit_code == 0
    assert "… (100000 characters)" in r.output and len(r.output) < 20_000


def test_svg_of_names_with_control_characters_is_well_formed(tmp_path):
    golden = hostile_golden(tmp_path)
    out = expected_as_output("tree_accept", "chain")
    out["accepted_count"][0] = 0
    out_path = tmp_path / "o\x1b]0;x\x07\x01.kdtr"
    kdtr.save(out_path, out, {"op": "tree_accept", "config": HOSTILE})
    svg = tmp_path / "x.svg"
    r = show(golden, "--output", out_path, "--svg", svg)
    assert r.exit_code == 0, r.output
    assert_clean(r.output)
    ET.parse(svg)  # well-formed XML
    assert "\\x1b" in svg.read_text()


def test_report_svg_of_names_with_control_characters_is_well_formed(tmp_path):
    """The hook `kdtr run` calls for a failing case (names from the golden and the case)."""
    golden = hostile_golden(tmp_path)
    out = expected_as_output("tree_accept", "chain")
    out["accepted_count"][0] = 0
    out_path = tmp_path / "chain\x1b.cpu.kdtr"
    kdtr.save(out_path, out, {"op": "tree_accept"})
    case = SimpleNamespace(op="tree_accept", config="chain\x1b[2J\x00", golden=golden)
    svg = case_svg(SimpleNamespace(case=case, output_file=str(out_path), outputs=[]))
    ET.parse(svg)
    assert_clean(svg.read_text())


@pytest.mark.parametrize("change,words", [
    (lambda t: t.update(accepted_path=t["accepted_path"].reshape(-1)),
     "'accepted_path' has shape [198], expected [B, T]"),
    (lambda t: t.update(accepted_count=t["accepted_count"][:, None]),
     "'accepted_count' has shape [6, 1], expected [B]"),
    (lambda t: t.update(proposed=t["proposed"].astype(np.float32)),
     "'proposed' has dtype float32, expected an integer"),
    (lambda t: t.update(accepted_count=np.full(6, np.nan, np.float64)), "'accepted_count' has dtype float64"),
    (lambda t: t.update(status=t["status"].astype(np.uint64)), "'status' has dtype uint64"),
    (lambda t: t.pop("proposed"), "has no tensor 'proposed'"),
    (lambda t: t.update(accepted_path=t["accepted_path"][:0]), "'accepted_path' has no request 0"),
])
def test_wrong_outputs_are_refused_with_one_line(tmp_path, change, words):
    out = expected_as_output("tree_accept", "chain")
    change(out)
    path = tmp_path / "bad.kdtr"
    kdtr.save(path, out, {"op": "tree_accept"})
    r = show(GOLDEN / "tree_accept" / "chain.kdtr", "--output", path)
    assert r.exit_code == 2, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
    assert r.output.count("\n") == 1 and r.output.startswith("kdtr: error: ") and "bad.kdtr" in r.output, r.output
    assert words in r.output, r.output


@pytest.mark.parametrize("change", [
    lambda t: t["accepted_path"].__setitem__((0, slice(1, 4)), [2**31 - 1, -2**31, -7]),
    lambda t: t.update(accepted_count=np.full(6, 2**31 - 1, np.int32)),
    lambda t: t.update(accepted_count=np.full(6, -5, np.int64)),
    lambda t: t.update(accepted_path=t["accepted_path"][:, :2].copy(), proposed=t["proposed"][:, :0].copy()),
    lambda t: t.update(proposed=np.concatenate([t["proposed"]] * 3, axis=1)),
    lambda t: t.update(accepted_path=t["accepted_path"].astype(np.int8), status=t["status"].astype(np.bool_)),
])
def test_odd_values_and_shapes_are_drawn(tmp_path, change):
    out = expected_as_output("tree_accept", "chain")
    change(out)
    path = tmp_path / "odd.kdtr"
    kdtr.save(path, out, {"op": "tree_accept"})
    r = show(GOLDEN / "tree_accept" / "chain.kdtr", "--output", path, "--svg", tmp_path / "odd.svg")
    assert r.exit_code == 0, r.output
    # values equal but another dtype: drawn the same, and the judge's MISMATCH said
    assert "difference(s) in request 0" in r.output or "matches expected" in r.output \
        or ("draws the same as expected" in r.output and "MISMATCH: " in r.output), r.output
    ET.parse(tmp_path / "odd.svg")


def test_tree_build_output_without_slots_is_drawn(tmp_path):
    out = expected_as_output("tree_build", "default")
    for k in ("node_token_ids", "node_depths", "parents", "next_token", "next_sibling"):
        out[k] = out[k][:, :0].copy()
    path = tmp_path / "empty.kdtr"
    kdtr.save(path, out, {"op": "tree_build"})
    r = show(GOLDEN / "tree_build" / "default.kdtr", "--output", path)
    assert r.exit_code == 0, r.output
    assert "no slots (empty tensors)" in r.output


def _mutate(t: dict, rng: np.random.Generator) -> dict:
    t = {k: v.copy() for k, v in t.items()}
    for _ in range(int(rng.integers(1, 4))):
        k = str(rng.choice(sorted(t))) if t else None
        if k is None:
            break
        v = t[k]
        m = int(rng.integers(0, 10))
        if m == 0:
            del t[k]
        elif m == 1:
            t[k] = v.reshape(-1)
        elif m == 2:
            t[k] = v.reshape(v.shape + (1,))
        elif m == 3:
            t[k] = np.array(v.reshape(-1)[0] if v.size else 0)
        elif m == 4:
            f = v.astype(np.float32)
            if f.size:
                f.reshape(-1)[int(rng.integers(0, f.size))] = np.nan
            t[k] = f
        elif m == 5:
            t[k] = v.astype([np.uint64, np.int8, np.bool_, np.float64, np.uint32, np.int16][int(rng.integers(0, 6))])
        elif m == 6:
            w = v.astype(np.int64)
            if w.size:
                w.reshape(-1)[rng.integers(0, w.size, size=3)] = [2**63 - 1, -2**63, -1, 2**31, -5, 10**12][
                    int(rng.integers(0, 6))]
            t[k] = w.astype(v.dtype) if rng.integers(0, 2) else w
        elif m == 7 and v.ndim >= 1:
            t[k] = v[:, : int(rng.integers(0, v.shape[1] + 1))].copy() if v.ndim >= 2 else v[: int(rng.integers(0, 3))]
        elif m == 8 and v.ndim >= 2:
            t[k] = np.concatenate([v, v[:, :3]], axis=1)
        elif v.ndim >= 1:
            t[k] = v[:0].copy()
    return t


def test_random_outputs_are_drawn_or_refused_with_one_line(tmp_path):
    """200 seeded random outputs (wrong rank, wrong dtype, huge and negative values, NaN,
    missing tensors, other T or B) of tree_accept, tree_build and greedy_step: each drawn
    (exit 0) or refused with one line naming the output file (exit 2), never a traceback;
    205 of 3,000 such renders used to raise."""
    rng = np.random.default_rng(21)
    base = {c: expected_as_output(*c) for c in CASES}
    outcomes = {0: 0, 2: 0}
    for i in range(200):
        op, config = CASES[int(rng.integers(0, len(CASES)))]
        out = _mutate(base[(op, config)], rng)
        path = tmp_path / f"out{i % 4}.kdtr"
        kdtr.save(path, out, {"op": op, "config": HOSTILE} if i % 5 == 0 else {"op": op})
        args = [GOLDEN / op / f"{config}.kdtr", "--request", int(rng.integers(0, 4)), "--output", path]
        if i % 10 == 0:
            args += ["--svg", tmp_path / "fuzz.svg"]
        r = show(*args)
        where = (i, op, config, {k: (v.shape, str(v.dtype)) for k, v in out.items()})
        assert r.exception is None or isinstance(r.exception, SystemExit), (where, r.exc_info)
        assert r.exit_code in (0, 2), (where, r.output)
        assert_clean(r.output)
        if r.exit_code == 2:
            assert r.output.count("\n") == 1 and r.output.startswith("kdtr: error: "), (where, r.output)
            assert path.name in r.output, (where, r.output)
        elif i % 10 == 0:
            ET.parse(tmp_path / "fuzz.svg")
        outcomes[r.exit_code] += 1
    assert outcomes[0] > 20 and outcomes[2] > 20, outcomes  # both kinds were tried


@pytest.mark.parametrize("columns", ["abc", "-5", "999999999", "\x1b[2J"])
def test_bad_or_huge_columns_variable_is_ignored(columns):
    """$COLUMNS that is not a width in [20, 1000] is ignored (160): "abc" raised ValueError."""
    r = CliRunner().invoke(main, ["show", str(GOLDEN / "tree_accept" / "chain.kdtr")], env={"COLUMNS": columns})
    assert r.exit_code == 0, r.output
    assert len(r.output) < 20_000


@pytest.mark.parametrize("columns", ["abc", "0", "\x1b[2J"])
def test_bad_columns_variable_does_not_break_any_command(columns):
    """The CLI's console is built at import from $COLUMNS when output is piped: a value that
    is not a width ("abc" raised ValueError while importing kdtr.cli.main) is ignored."""
    import os
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "kdtr.cli", "list"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "COLUMNS": columns})
    assert p.returncode == 0, p.stderr
    assert "tree_accept" in p.stdout and "Traceback" not in p.stderr
