"""``kdtr show``: a golden's draft tree drawn in the terminal (rich ``Tree``) or as SVG.

One node per slot (slot, token id, depth, and for trees that tree_build made the score:
the cumulative log-probability, recomputed from the golden's inputs), children in
first-child / next-sibling order. For tree_accept and greedy_step the accepted path is
marked (✓, green) and the bonus token shown. With ``--output OUT`` (a binary's output file)
the actual tree and path are drawn too; where they differ from the golden, expected and
actual stand side by side and the differing nodes are marked ✗ (red).

Malformed trees (cycles, links out of range, a bad node_count) are drawn, not followed:
every slot is drawn at most once and a bad link becomes a ⚠ node, so a drawing always ends.

:func:`case_svg` is the hook the Markdown report calls (``kdtr.report.case_svg``, set when
this module is imported: ``kdtr/`` never imports ``kdtr/cli/``) to draw a failing
tree_accept / greedy_step case next to its obtained output.
"""

from __future__ import annotations

import io
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import click
import numpy as np
from rich.console import Console, Group
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from kdtr import format as kformat
from kdtr import report
from kdtr.errors import KdtrError
from kdtr.text import printable

TREE_OPS = ("tree_build", "tree_accept", "greedy_step")
BUILD_STATUS = {0: "OK", 1: "BAD_BUDGET", 2: "BAD_DEPTH_LIMIT", 3: "NON_FINITE", 4: "UNSORTED", 5: "DUPLICATE_ID",
                6: "NEGATIVE_ID"}
ACCEPT_STATUS = {0: "OK", 1: "BAD_NODE_COUNT", 2: "BAD_INDEX", 3: "CYCLE", 4: "NEGATIVE_TOKEN"}
MAX_DIFF_LINES = 20

PATH_STYLE = "bold green"
DIFF_STYLE = "bold red"
BONUS_STYLE = "bold cyan"
WARN_STYLE = "yellow"


class ShowError(ValueError):
    """A usage problem of ``kdtr show`` (one line on stderr, exit 2)."""


@dataclass
class Side:
    """One request's draft tree and, where the op has one, its accepted path."""

    tokens: np.ndarray
    first_child: np.ndarray
    next_sibling: np.ndarray
    node_count: int
    depths: np.ndarray | None = None
    parents: np.ndarray | None = None
    build_status: int | None = None
    path: list[int] | None = None  # accepted_path[:accepted_count + 1]
    proposed: list[int] | None = None  # proposed[:accepted_count + 1]
    accepted_count: int | None = None
    accept_status: int | None = None
    lp: tuple[np.ndarray, np.ndarray] | None = None  # (top_log_probs[b], top_token_ids[b]) for the scores
    rows: dict[str, np.ndarray] = field(default_factory=dict)  # the whole accepted_path / proposed rows

    @property
    def n_slots(self) -> int:
        return min(len(self.tokens), len(self.first_child), len(self.next_sibling))

    @property
    def bonus(self) -> int | None:
        if self.proposed is None or self.accepted_count is None or self.accept_status not in (0, None):
            return None
        return self.proposed[-1] if len(self.proposed) == self.accepted_count + 1 else None


@dataclass
class Walk:
    """The tree as drawn: each slot reached at most once from slot 0."""

    children: dict[int, list[int]] = field(default_factory=dict)
    problems: dict[int, list[str]] = field(default_factory=dict)
    depth: dict[int, int] = field(default_factory=lambda: {0: 0})
    score: dict[int, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    unreached: list[int] = field(default_factory=list)


def walk(side: Side) -> Walk:
    """Follow next_token / next_sibling from slot 0, visiting each slot at most once and
    stopping a sibling list at the first link outside [1, node_count] or back to a slot
    already drawn (recorded as a problem of the slot whose list it is)."""
    w = Walk()
    t = side.n_slots
    if t == 0:
        w.notes.append("no slots (empty tensors)")
        return w
    hi = side.node_count
    if not 0 <= hi <= t - 1:
        w.notes.append(f"node_count {hi} outside [0, {t - 1}]: links drawn up to slot {t - 1}")
        hi = t - 1
    if side.lp is not None:
        w.score[0] = 0.0
    seen = {0}
    stack = [0]
    while stack:
        s = stack.pop()
        kids: list[int] = []
        via, c = f"next_token[{s}]", int(side.first_child[s])
        while c != -1:
            if not 1 <= c <= hi:
                w.problems.setdefault(s, []).append(f"{via} = {c}: outside [1, {hi}], not followed")
                break
            if c in seen:
                w.problems.setdefault(s, []).append(f"{via} = {c}: slot {c} already drawn (a cycle), not followed")
                break
            seen.add(c)
            kids.append(c)
            w.depth[c] = w.depth[s] + 1
            if side.lp is not None and s in w.score:
                _score(side, w, s, c)
            via, c = f"next_sibling[{c}]", int(side.next_sibling[c])
        w.children[s] = kids
        stack.extend(reversed(kids))
    w.unreached = [s for s in range(1, hi + 1) if s not in seen]
    return w


def _score(side: Side, w: Walk, parent: int, c: int) -> None:
    """score[c] = score[parent] + top_log_probs[d-1][rank of c's token], in float64 (the
    builder's candidate weight, up to the last bits of its sibling update)."""
    lp, ids = side.lp  # type: ignore[misc]
    d = int(side.depths[c]) if side.depths is not None else w.depth[c]
    if not 1 <= d <= len(ids):
        return
    ranks = np.flatnonzero(ids[d - 1] == side.tokens[c])
    if ranks.size:
        w.score[c] = w.score[parent] + float(lp[d - 1][ranks[0]])


# ---------------------------------------------------------------------------- loading


def _row(t: Mapping[str, np.ndarray], name: str, b: int, where: str) -> np.ndarray:
    if name not in t:
        raise ShowError(f"{where} has no tensor {name!r}")
    arr = np.asarray(t[name])
    if arr.ndim == 0 or b >= arr.shape[0]:
        raise ShowError(f"{where}: tensor {name!r} has no request {b} (shape {list(arr.shape)})")
    return np.array(arr[b])


def _path_part(side: Side, t: Mapping[str, np.ndarray], pre: str, b: int, where: str) -> None:
    count = int(_row(t, pre + "accepted_count", b, where))
    path = _row(t, pre + "accepted_path", b, where)
    proposed = _row(t, pre + "proposed", b, where)
    side.accepted_count = count
    side.accept_status = int(_row(t, pre + "status", b, where)) if pre + "status" in t else None
    k = max(0, min(count, len(path) - 1)) + 1
    side.path = [int(x) for x in path[:k]]
    side.proposed = [int(x) for x in proposed[:k]]
    side.rows = {"accepted_path": path, "proposed": proposed}


def request_count(op: str, t: Mapping[str, np.ndarray]) -> int:
    name = {"tree_build": "input.root_token_ids", "tree_accept": "input.node_count",
            "greedy_step": "input.root_token_ids"}[op]
    if name not in t:
        raise ShowError(f"has no tensor {name!r}")
    return int(np.asarray(t[name]).shape[0]) if np.ndim(t[name]) else 0


def side_of(op: str, golden: Mapping[str, np.ndarray], b: int, out: Mapping[str, np.ndarray] | None = None,
            where: str = "golden") -> Side:
    """Request ``b`` of a golden (``out`` None: its expected outputs) or of an output file."""
    t = golden if out is None else out
    pre = "expected." if out is None else ""
    if op == "tree_accept":
        tree_t, tree_pre, tree_where = golden, "input.", "golden"
    else:
        tree_t, tree_pre, tree_where = t, pre + ("tree_build." if op == "greedy_step" else ""), where
    side = Side(
        tokens=_row(tree_t, tree_pre + "node_token_ids", b, tree_where),
        first_child=_row(tree_t, tree_pre + "next_token", b, tree_where),
        next_sibling=_row(tree_t, tree_pre + "next_sibling", b, tree_where),
        node_count=int(_row(tree_t, tree_pre + "node_count", b, tree_where)),
    )
    if op != "tree_accept":
        side.depths = _row(t, tree_pre + "node_depths", b, where)
        side.parents = _row(t, tree_pre + "parents", b, where) if tree_pre + "parents" in t else None
        if tree_pre + "status" in t:
            side.build_status = int(_row(t, tree_pre + "status", b, where))
        if "input.top_log_probs" in golden and "input.top_token_ids" in golden:
            side.lp = (np.asarray(golden["input.top_log_probs"][b], dtype=np.float64),
                       np.asarray(golden["input.top_token_ids"][b]))
    if op in ("tree_accept", "greedy_step"):
        _path_part(side, t, pre + ("tree_accept." if op == "greedy_step" else ""), b, where)
    return side


# ---------------------------------------------------------------------------- differences


@dataclass
class Diff:
    lines: list[str] = field(default_factory=list)
    expected: set[int] = field(default_factory=set)  # slots marked on the expected side
    actual: set[int] = field(default_factory=set)
    bonus: bool = False

    def __bool__(self) -> bool:
        return bool(self.lines)


def diff_sides(e: Side, a: Side) -> Diff:
    d = Diff()
    if e.node_count != a.node_count:
        d.lines.append(f"node_count: expected {e.node_count}, actual {a.node_count}")
    if e.build_status != a.build_status:
        d.lines.append(f"tree_build status: expected {e.build_status}, actual {a.build_status}")
    arrays = [("node_token_ids", e.tokens, a.tokens), ("next_token", e.first_child, a.first_child),
              ("next_sibling", e.next_sibling, a.next_sibling)]
    if e.depths is not None and a.depths is not None:
        arrays.append(("node_depths", e.depths, a.depths))
    if e.parents is not None and a.parents is not None:
        arrays.append(("parents", e.parents, a.parents))
    for name, x, y in arrays:
        for s in range(max(len(x), len(y))):
            xv = int(x[s]) if s < len(x) else None
            yv = int(y[s]) if s < len(y) else None
            if xv != yv:
                d.expected.add(s)
                d.actual.add(s)
                d.lines.append(f"slot {s}: {name} expected {xv}, actual {yv}")
    if e.path is not None and a.path is not None:
        if e.accept_status != a.accept_status:
            d.lines.append(f"tree_accept status: expected {e.accept_status}, actual {a.accept_status}")
        if e.accepted_count != a.accepted_count:
            d.lines.append(f"accepted_count: expected {e.accepted_count}, actual {a.accepted_count}")
        for i in range(max(len(e.path), len(a.path))):
            xv = e.path[i] if i < len(e.path) else None
            yv = a.path[i] if i < len(a.path) else None
            if xv != yv:
                d.lines.append(f"accepted_path[{i}]: expected slot {xv}, actual slot {yv}")
                for slot in (xv, yv):  # where one path goes and the other does not: marked on both sides
                    if slot is not None:
                        d.expected.add(slot)
                        d.actual.add(slot)
        ep, ap = e.proposed or [], a.proposed or []
        for i in range(max(len(ep), len(ap))):
            xv = ep[i] if i < len(ep) else None
            yv = ap[i] if i < len(ap) else None
            if xv == yv:
                continue
            d.lines.append(f"proposed[{i}]: expected {_role(e, i)}, actual {_role(a, i)}")
            for side, marks in ((e, d.expected), (a, d.actual)):
                if side.accepted_count is not None and i < side.accepted_count and i + 1 < len(side.path or []):
                    marks.add(side.path[i + 1])  # type: ignore[index]
        d.bonus = e.bonus != a.bonus
        for name, used in (("accepted_path", len(e.path)), ("proposed", len(ep))):
            x, y = e.rows.get(name), a.rows.get(name)
            if x is None or y is None:
                continue
            for i in range(max(used, len(ap) if name == "proposed" else len(a.path)), max(len(x), len(y))):
                xv = int(x[i]) if i < len(x) else None
                yv = int(y[i]) if i < len(y) else None
                if xv != yv:
                    d.lines.append(f"{name}[{i}] (padding past the path): expected {xv}, actual {yv}")
    return d


def _role(side: Side, i: int) -> str:
    """proposed[i] of ``side`` in words: the token of an accepted slot, or the bonus token."""
    if side.proposed is None or i >= len(side.proposed):
        return "nothing (its path is shorter)"
    v = side.proposed[i]
    if i == side.accepted_count:
        return f"{v} (bonus token)"
    return f"{v} (token of slot {side.path[i + 1]})" if side.path and i + 1 < len(side.path) else str(v)


# ---------------------------------------------------------------------------- drawing


def _label(side: Side, w: Walk, s: int, on_path: dict[int, int], marked: set[int]) -> Text:
    text = Text()
    if s in marked:
        text.append("✗ ", style=DIFF_STYLE)
    if s in on_path:
        text.append("✓ ", style=PATH_STYLE)
    style = DIFF_STYLE if s in marked else PATH_STYLE if s in on_path else ""
    text.append(f"[{s}] tok {int(side.tokens[s])}", style=style)
    depth = int(side.depths[s]) if side.depths is not None else w.depth.get(s, 0)
    text.append(f"  d{depth}", style="dim")
    if s in w.score:
        text.append(f"  score {w.score[s]:.4f}", style="dim")
    pos = on_path.get(s)
    if pos and side.proposed is not None and pos - 1 < len(side.proposed) and side.proposed[pos - 1] != int(side.tokens[s]):
        text.append(f"  proposed {side.proposed[pos - 1]}", style=DIFF_STYLE)
    return text


def _header(op: str, side: Side, title: str) -> Text:
    text = Text(title, style="bold")
    parts = [f"node_count {side.node_count}"]
    if side.build_status is not None:
        parts.append(f"tree_build status {side.build_status} {BUILD_STATUS.get(side.build_status, '?')}")
    if side.path is not None:
        parts.append("accepted " + str(side.accepted_count) + ": path " + " → ".join(map(str, side.path)))
        bonus = side.bonus
        parts.append(f"bonus {bonus}" if bonus is not None else "no bonus token")
        if side.accept_status is not None:
            parts.append(f"status {side.accept_status} {ACCEPT_STATUS.get(side.accept_status, '?')}")
    text.append("\n" + "; ".join(parts))
    return text


def draw_side(op: str, side: Side, title: str, marked: set[int] | None = None, bonus_differs: bool = False) -> Group:
    """The header, the rich Tree and the warnings of one side."""
    marked = marked or set()
    w = walk(side)
    on_path: dict[int, int] = {}
    for i, s in enumerate(side.path or []):
        on_path.setdefault(s, i)
    nodes: dict[int, Tree] = {0: Tree(_label(side, w, 0, on_path, marked), guide_style="dim")}
    stack = [0]
    while stack:
        s = stack.pop()
        for c in w.children.get(s, []):
            nodes[c] = nodes[s].add(_label(side, w, c, on_path, marked))
        for msg in w.problems.get(s, []):
            nodes[s].add(Text("⚠ " + msg, style=WARN_STYLE))
        stack.extend(reversed(w.children.get(s, [])))
    parts: list[Any] = [_header(op, side, title)]
    for note in w.notes:
        parts.append(Text("⚠ " + note, style=WARN_STYLE))
    if side.path:
        last = side.path[-1]
        bonus = side.bonus
        if bonus is not None and last in nodes:
            label = Text()
            if bonus_differs:
                label.append("✗ ", style=DIFF_STYLE)
            label.append(f"+ bonus {bonus}", style=DIFF_STYLE if bonus_differs else BONUS_STYLE)
            nodes[last].add(label)
        missing = [s for s in side.path if s not in nodes]
        if missing:
            parts.append(Text(f"⚠ accepted_path slots not in the drawn tree: {missing}", style=WARN_STYLE))
    parts.append(nodes[0])
    if w.unreached:
        shown = ", ".join(map(str, w.unreached[:20])) + (", ..." if len(w.unreached) > 20 else "")
        parts.append(Text(f"⚠ {len(w.unreached)} slot(s) in [1, node_count] not reached from slot 0: {shown}",
                          style=WARN_STYLE))
    return Group(*parts)


def render(golden: Any, request: int, output: Any | None = None, golden_name: str = "golden",
           output_name: str = "output") -> Drawing:
    """The drawing of request ``request`` of ``golden`` (a loaded KDTR file), with the
    output file ``output`` next to it if given."""
    golden_name, output_name = printable(golden_name), printable(output_name)
    op = golden.metadata.get("op")
    if op not in TREE_OPS:
        raise ShowError(f"{golden_name} is op {op!r}: it has no draft tree to draw "
                        f"(kdtr show draws {', '.join(TREE_OPS)})")
    if not any(k.startswith("expected.") for k in golden.tensors):
        raise ShowError(f"{golden_name} has no expected.* tensors: give a golden (kdtr show GOLDEN --output OUT)")
    try:
        n = request_count(op, golden.tensors)
    except ShowError as exc:
        raise ShowError(f"{golden_name} {exc}") from None
    if not 0 <= request < n:
        raise ShowError(f"--request {request}: out of range [0, {n - 1}] ({golden_name} has {n} requests)")
    config = golden.metadata.get("config", "?")
    e = side_of(op, golden.tensors, request, where=golden_name)
    title = f"{op}/{config} request {request}"
    if output is None:
        one = Group(draw_side(op, e, f"{title} (expected)"))
        return Drawing(one, False, _width(one))
    if output.metadata.get("op") not in (None, op):
        raise ShowError(f"{golden_name} is op {op!r} but {output_name} is op {output.metadata.get('op')!r}")
    a = side_of(op, golden.tensors, request, out=output.tensors, where=output_name)
    d = diff_sides(e, a)
    if not d:
        one = Group(draw_side(op, a, f"{title}: actual ({output_name}) matches expected"))
        return Drawing(one, False, _width(one))
    left = draw_side(op, e, f"{title} expected (golden)", d.expected, d.bonus)
    right = draw_side(op, a, f"{title} actual ({output_name})", d.actual, d.bonus)
    lines = [Text(f"✗ {len(d.lines)} difference(s) in request {request}:", style=DIFF_STYLE)]
    lines += [Text("  " + line) for line in d.lines[:MAX_DIFF_LINES]]
    if len(d.lines) > MAX_DIFF_LINES:
        lines.append(Text(f"  ... {len(d.lines) - MAX_DIFF_LINES} more"))
    return Drawing(Group(*lines), True, _width(left) + _width(right) + SIDE_GAP, left, right)


SIDE_GAP = 4


@dataclass
class Drawing:
    """What :func:`render` draws: ``body`` alone, or ``left`` and ``right`` (expected and
    actual) above ``body`` (the list of differences); ``width`` is the width that shows it
    all unwrapped, the two sides next to each other."""

    body: Any
    differs: bool
    width: int
    left: Any = None
    right: Any = None

    def renderable(self, width: int) -> Any:
        """Side by side when ``width`` holds both sides, else the actual below the expected."""
        if self.left is None:
            return self.body
        if width >= self.width:
            grid = Table.grid(padding=(0, SIDE_GAP))
            grid.add_column(vertical="top")
            grid.add_column(vertical="top")
            grid.add_row(self.left, self.right)
            return Group(grid, self.body)
        return Group(self.left, Text(""), self.right, self.body)


def _width(renderable: Any) -> int:
    """The width ``renderable`` needs to be drawn without wrapping."""
    console = Console(file=io.StringIO(), width=100_000)
    return Measurement.get(console, console.options, renderable).maximum


def svg_text(drawing: Drawing, title: str) -> str:
    """The drawing as SVG, wide enough to show both sides next to each other."""
    width = max(80, drawing.width)
    console = Console(file=io.StringIO(), record=True, width=width, highlight=False, color_system="truecolor")
    console.print(drawing.renderable(width))
    return console.export_svg(title=title)


# ---------------------------------------------------------------------------- command


def _load(path: str) -> Any:
    try:
        return kformat.load(path)
    except KdtrError as exc:
        raise ShowError(f"{path}: {type(exc).__name__}: {exc}") from None
    except OSError as exc:
        raise ShowError(f"{path}: {exc.strerror or exc}") from None


def _fail(msg: str) -> None:
    click.echo(f"kdtr: error: {printable(msg)}", err=True)
    sys.exit(2)


@click.command("show")
@click.argument("golden", metavar="GOLDEN")
@click.option("--request", "request", type=int, default=0, show_default=True, metavar="B",
              help="The request (batch row) to draw.")
@click.option("--svg", "svg", metavar="FILE", help="Also write the drawing as an SVG file.")
@click.option("--output", "output", metavar="OUT",
              help="A binary's output file (e.g. reports/obtained/tree_accept/chain.cpu.kdtr): draw the actual "
                   "tree and path too, side by side with the expected ones where they differ.")
def show(golden, request, svg, output) -> None:
    """Draw a golden's draft tree (tree_build, tree_accept, greedy_step): slot, token, depth,
    score; the accepted path (✓) and bonus token; with --output, the differences (✗).

    Exit 0 once drawn (a difference is shown, not an exit status), 2 on a usage error."""
    files = []
    try:
        if svg and not Path(svg).resolve().parent.is_dir():
            raise ShowError(f"--svg {svg}: its directory does not exist")
        g = _load(golden)
        files.append(g)
        o = None
        if output is not None:
            o = _load(output)
            files.append(o)
        drawing = render(g, request, o, golden_name=golden, output_name=output or "")
        # A terminal keeps its width (the sides stacked if they do not fit); piped output
        # (CI logs, files) is as wide as the drawing needs, at least $COLUMNS or 160.
        width = None if sys.stdout.isatty() else max(int(os.environ.get("COLUMNS") or 160), drawing.width)
        console = Console(highlight=False, record=bool(svg), width=width)
        console.print(drawing.renderable(console.width))
        if svg:
            data = console.export_svg(title=f"kdtr show {Path(golden).name} --request {request}")
            try:
                kformat.atomic_write(svg, data.encode("utf-8"))
            except OSError as exc:
                raise ShowError(f"--svg {svg}: {exc.strerror or exc}") from None
            console.print(f"wrote {printable(svg)}", markup=False, highlight=False)
    except ShowError as exc:
        _fail(str(exc))
    finally:
        for f in files:
            f.close()


# ---------------------------------------------------------------------------- report hook


def _failing_request(result: Any) -> int:
    for o in result.outputs:
        if not o.ok and o.first and o.first[0].index:
            return int(o.first[0].index[0])
    return 0


def case_svg(result: Any) -> Path | None:
    """Draw a failing tree_accept / greedy_step case (its first differing request, golden
    against obtained output) as ``<output file minus .kdtr>.svg``; None when there is
    nothing to draw. The caller ignores any exception."""
    if result.case.op not in ("tree_accept", "greedy_step") or not result.output_file:
        return None
    out = Path(result.output_file)
    if not out.is_file():
        return None
    svg = out.with_name(out.name[: -len(".kdtr")] + ".svg" if out.name.endswith(".kdtr") else out.name + ".svg")
    with kformat.load(result.case.golden) as g, kformat.load(out) as o:
        request = _failing_request(result)
        drawing = render(g, request, o, golden_name=str(result.case.golden), output_name=out.name)
        data = svg_text(drawing, f"kdtr show {result.case.op}/{result.case.config} --request {request} "
                                    f"--output {out.name}")
    kformat.atomic_write(svg, data.encode("utf-8"))
    return svg


report.case_svg = case_svg
