"""``kdtr show`` and the report's tree SVGs cost work bounded before it is built, whatever
the golden: chains longer than FOLD_MIN slots are folded to their ends (and their marked
slots), a tree drawing is at most MAX_LINES lines, indentation stops at MAX_INDENT levels
(deeper slots marked », their depth in d<n>), the walk visits at most MAX_WALK slots and
the comparison of two sides is numpy work. A 2,000-slot chain used to take 38 s and 290 MB,
a 3,000-slot one 1,105 s and 3.7 GB for the SVG of a failing case (rich indents 4 columns
per level: quadratic)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
from click.testing import CliRunner

import kdtr
from conftest import REPO_ROOT
from kdtr.cli import show_tree
from kdtr.cli.main import main
from kdtr.ops.tree_accept import tree_accept


def tree_golden(path: Path, first_child: np.ndarray, next_sibling: np.ndarray, accept_all: bool = True) -> dict:
    """A one-request tree_accept golden for the links given (T = len); target_predict makes
    the walk accept along first children. Returns the reference outputs."""
    t = len(first_child)
    rng = np.random.default_rng(t)
    ids = rng.integers(0, 50_000, size=(1, t)).astype(np.int64)
    nt, ns = first_child.astype(np.int32)[None], next_sibling.astype(np.int32)[None]
    tp = np.full((1, t), 7, np.int64)
    if accept_all:
        has = first_child >= 0
        tp[0, has] = ids[0, first_child[has]]
    nc = np.array([t - 1], np.int32)
    res = {k: np.array(v) for k, v in tree_accept(ids, nt, ns, nc, tp).as_dict().items()}
    tensors = {"input.node_token_ids": ids, "input.next_token": nt, "input.next_sibling": ns,
               "input.node_count": nc, "input.target_predict": tp}
    tensors.update({f"expected.{k}": v for k, v in res.items()})
    kdtr.save(path, tensors, {"op": "tree_accept", "config": path.stem})
    return res


def chain_links(n: int) -> tuple[np.ndarray, np.ndarray]:
    fc = np.full(n + 1, -1, np.int64)
    fc[:n] = np.arange(1, n + 1)
    return fc, np.full(n + 1, -1, np.int64)


def chain_case(tmp_path: Path, n: int) -> tuple[Path, Path]:
    """An n-slot chain golden, all accepted, and an output that stops 5 slots early."""
    golden = tmp_path / f"chain{n}.kdtr"
    res = tree_golden(golden, *chain_links(n))
    assert res["accepted_count"][0] == n
    res["accepted_count"][0] = n - 5
    res["accepted_path"][0, n - 4:] = -1
    res["proposed"][0, n - 5] = 99
    res["proposed"][0, n - 4:] = -1
    out = tmp_path / f"chain{n}.cpu.kdtr"
    kdtr.save(out, res, {"op": "tree_accept"})
    return golden, out


def test_long_chains_render_in_bounded_time_memory_and_size(tmp_path):
    """The listed inputs, in a child (the hang guard: old code took 1,105 s): `kdtr show`
    with --output and --svg of a 2,000- and a 3,000-slot chain, and the report's SVG hook."""
    cases = [chain_case(tmp_path, n) for n in (2000, 3000)]
    code = textwrap.dedent(f"""
        import json, resource, sys
        from pathlib import Path
        from types import SimpleNamespace
        sys.path.insert(0, {str(REPO_ROOT)!r})
        from click.testing import CliRunner
        from kdtr.cli.main import main
        from kdtr.cli.show import case_svg
        sizes = []
        for golden, out in {[(str(g), str(o)) for g, o in cases]!r}:
            svg = out + ".show.svg"
            r = CliRunner().invoke(main, ["show", golden, "--output", out, "--svg", svg], catch_exceptions=False)
            case = SimpleNamespace(op="tree_accept", config=Path(golden).stem, golden=Path(golden))
            hook = case_svg(SimpleNamespace(case=case, output_file=out, outputs=[]))
            sizes.append(dict(exit=r.exit_code, text=r.output, svg=len(Path(svg).read_text()),
                              hook=len(hook.read_text())))
        # VmHWM: this process's own peak (ru_maxrss carries the parent's peak across fork + exec,
        # so under a long pytest session it reports pytest's memory, not this drawing's)
        hwm = next(int(ln.split()[1]) for ln in open("/proc/self/status") if ln.startswith("VmHWM:"))
        print(json.dumps(dict(sizes=sizes, maxrss_kb=hwm)))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, COLUMNS="160"))
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout)
    for n, s in zip((2000, 3000), got["sizes"]):
        text = s["text"]
        assert s["exit"] == 0, text[-2000:]
        # O(1) in n once folded (the old drawing was 4 columns per level: O(n^2) characters)
        assert len(text) < 200_000 and len(text) < 50 * n, len(text)
        assert s["svg"] < 1_000_000 and s["hook"] < 1_000_000, s
        assert f"✓ [{n}] tok" in text  # the end of the chain is drawn ...
        assert "slots of a chain folded: [13] … " in text  # ... its middle folded
        assert "all on the accepted path" in text
        assert f"accepted_count: expected {n}, actual {n - 5}" in text
        assert "✗ + bonus" in text
        assert max(len(line) for line in text.splitlines()) < 1000
    assert got["maxrss_kb"] < 1_000_000, got["maxrss_kb"]  # the old SVG took 3.7 GB


def draw(golden: Path, *args: str) -> str:
    r = CliRunner().invoke(main, ["show", str(golden), *args], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return r.output


def test_a_wide_tree_is_cut_at_max_lines_with_a_note(tmp_path):
    n = 3000  # slot 0 with 3,000 children
    fc = np.full(n + 1, -1, np.int64)
    fc[0] = 1
    ns = np.full(n + 1, -1, np.int64)
    ns[1:n] = np.arange(2, n + 1)
    golden = tmp_path / "star.kdtr"
    tree_golden(golden, fc, ns, accept_all=False)
    text = draw(golden)
    drawn = [int(s) for s in re.findall(r"\[(\d+)\] tok", text)]
    assert len(drawn) <= show_tree.MAX_LINES and drawn[:3] == [0, 1, 2]
    assert f"more slot(s) not drawn: kdtr show draws at most {show_tree.MAX_LINES} lines per tree" in text
    rest = int(re.search(r"… (\d+) more slot\(s\) not drawn", text).group(1))
    assert rest + len(drawn) == n + 1  # every slot is drawn or counted
    assert len(text) < 100 * show_tree.MAX_LINES


def test_a_deep_bushy_tree_has_its_indentation_capped(tmp_path):
    """A caterpillar: every slot of a 1,000-deep spine has a leaf beside it, so nothing
    folds; indentation stops at MAX_INDENT levels and the lines at MAX_LINES."""
    depth = 1000
    t = 2 * depth + 1
    fc = np.full(t, -1, np.int64)
    ns = np.full(t, -1, np.int64)
    for i in range(depth):  # spine slot 2i has children 2i+1 (leaf) and 2i+2 (spine)
        fc[2 * i] = 2 * i + 1
        ns[2 * i + 1] = 2 * i + 2
    golden = tmp_path / "caterpillar.kdtr"
    tree_golden(golden, fc, ns, accept_all=False)
    text = draw(golden)
    assert f"indentation capped at {show_tree.MAX_INDENT} levels" in text
    assert "─» " in text
    widths = [len(line.rstrip()) for line in text.splitlines() if " tok " in line]
    assert max(widths) <= 4 * show_tree.MAX_INDENT + 60, max(widths)
    assert len(text.splitlines()) < show_tree.MAX_LINES + 20


def test_a_folded_chain_keeps_its_marked_slots(tmp_path):
    golden = tmp_path / "chain2000.kdtr"
    res = tree_golden(golden, *chain_links(2000))
    res["accepted_path"][0, 1000] = 5  # the kernel's path jumps at step 1000
    out = tmp_path / "jump.kdtr"
    kdtr.save(out, res, {"op": "tree_accept"})
    text = draw(golden, "--output", str(out))
    assert "accepted_path[1000]: expected slot 1000, actual slot 5" in text
    assert "✗ ✓ [1000] tok" in text  # kept inside the fold, on both sides
    assert "slots of a chain folded: [13] … [999]" in text
    assert "slots of a chain folded: [1001] … [1988]" in text
    assert len(text) < 200_000


def test_short_chains_are_drawn_whole():
    """Chains up to FOLD_MIN slots are not folded (the committed chain golden: 32 slots)."""
    text = draw(REPO_ROOT / "golden" / "tree_accept" / "chain.kdtr", "--request", "3")
    assert "folded" not in text and "capped" not in text
