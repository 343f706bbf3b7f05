"""``kdtr show``: a golden's draft tree drawn in the terminal (tree guides, printed by rich) or as SVG.

One node per slot (slot, token id, depth, and for trees that tree_build made the score:
the cumulative log-probability, recomputed from the golden's inputs), children in
first-child / next-sibling order. For tree_accept and greedy_step the accepted path is
marked (✓, green) and the bonus token shown. With ``--output OUT`` (a binary's output file)
the actual tree and path are drawn too; where they differ from the golden, expected and
actual stand side by side and the differing nodes are marked ✗ (red).

Malformed trees (cycles, links out of range, a bad node_count) are drawn, not followed:
every slot is drawn at most once and a bad link becomes a ⚠ node, so a drawing always ends.

Bounded whatever the files hold (docs/show.md, "Bounds"): a chain longer than FOLD_MIN
slots is folded to its ends and its ✗ slots, a tree is at most MAX_LINES lines, the
indentation stops at MAX_INDENT levels, the walk visits at most MAX_WALK slots, and the
comparison of the two sides is numpy work linear in the rows. Untrusted: every tensor read
is checked (integer dtype, rank, request present; a :class:`ShowError` naming the file and
the tensor otherwise) and every string from a file (metadata config and op, file names)
passes through :func:`short` (``kdtr.text.printable``: ``\\xNN`` for control characters,
which XML 1.0 forbids even escaped) before it reaches the terminal or the SVG.

:func:`case_svg` is the hook the Markdown report calls (``kdtr.report.case_svg``, set when
this module is imported: ``kdtr/`` never imports ``kdtr/cli/``) to draw a failing
tree_accept / greedy_step case next to its obtained output.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import numpy as np
from rich.console import Console, Group
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from kdtr import format as kformat
from kdtr import judge, report
from kdtr.cli.show_tree import (
    BONUS_STYLE,
    DIFF_STYLE,
    PATH_SHOW,
    WARN_STYLE,
    Marks,
    PathIndex,
    Scores,
    Side,
    _slot_list,
    short,
    tree_lines,
    walk,
)
from kdtr.errors import KdtrError
from kdtr.status import Status
from kdtr.text import printable, terminal_columns

TREE_OPS = ("tree_build", "tree_accept", "greedy_step")
BUILD_STATUS = {0: "OK", 1: "BAD_BUDGET", 2: "BAD_DEPTH_LIMIT", 3: "NON_FINITE", 4: "UNSORTED", 5: "DUPLICATE_ID",
                6: "NEGATIVE_ID"}
ACCEPT_STATUS = {0: "OK", 1: "BAD_NODE_COUNT", 2: "BAD_INDEX", 3: "CYCLE", 4: "NEGATIVE_TOKEN"}
MAX_DIFF_LINES = 20


class ShowError(ValueError):
    """A usage problem of ``kdtr show`` (one line on stderr, exit 2)."""


# ---------------------------------------------------------------------------- loading

_B, _BT = ("B",), ("B", "T")


def _int_tensor(t: Mapping[str, np.ndarray], name: str, where: str) -> np.ndarray:
    """t[name], refused unless it is an integer tensor whose values fit int64."""
    if name not in t:
        raise ShowError(f"{where} has no tensor {name!r}")
    arr = t[name]
    dt = np.dtype(arr.dtype)
    if not (dt.kind in "ib" or (dt.kind == "u" and dt.itemsize <= 4)):
        raise ShowError(f"{where}: tensor {name!r} has dtype {short(dt)}, expected an integer dtype (int32 or int64)")
    return arr


def _row(t: Mapping[str, np.ndarray], name: str, b: int, where: str, dims: tuple[str, ...] = _BT) -> np.ndarray:
    """Request ``b`` of the integer tensor ``name`` of shape ``dims``, as int64; a
    :class:`ShowError` naming the file and the tensor for any other dtype or rank."""
    arr = _int_tensor(t, name, where)
    shape = [int(x) for x in arr.shape]
    if len(shape) != len(dims):
        raise ShowError(f"{where}: tensor {name!r} has shape {shape}, expected [{', '.join(dims)}]")
    if b >= shape[0]:
        raise ShowError(f"{where}: tensor {name!r} has no request {b} (shape {shape})")
    return np.asarray(arr[b], dtype=np.int64)


def _scalar(t: Mapping[str, np.ndarray], name: str, b: int, where: str) -> int:
    return int(_row(t, name, b, where, _B))


def _scores(golden: Mapping[str, np.ndarray], b: int, where: str) -> Scores | None:
    if "input.top_log_probs" not in golden or "input.top_token_ids" not in golden:
        return None
    lp = golden["input.top_log_probs"]
    ids = _int_tensor(golden, "input.top_token_ids", where)
    if lp.ndim != 3 or tuple(ids.shape) != tuple(lp.shape) or b >= lp.shape[0]:
        raise ShowError(f"{where}: tensors 'input.top_log_probs' (shape {list(lp.shape)}) and 'input.top_token_ids' "
                        f"(shape {list(ids.shape)}): expected both [B, D, K] with request {b}")
    try:
        lpb = np.asarray(lp[b], dtype=np.float64)
    except (TypeError, ValueError):
        raise ShowError(f"{where}: tensor 'input.top_log_probs' has dtype {short(lp.dtype)}, expected a float dtype") \
            from None
    return Scores(lpb, np.asarray(ids[b], dtype=np.int64))


def _path_part(side: Side, t: Mapping[str, np.ndarray], pre: str, b: int, where: str) -> None:
    count = _scalar(t, pre + "accepted_count", b, where)
    path = _row(t, pre + "accepted_path", b, where)
    proposed = _row(t, pre + "proposed", b, where)
    side.accepted_count = count
    side.accept_status = _scalar(t, pre + "status", b, where) if pre + "status" in t else None
    k = max(0, min(count, len(path) - 1)) + 1
    side.path = path[:k]
    side.proposed = proposed[:k]
    side.rows = {"accepted_path": path, "proposed": proposed}


def request_count(op: str, t: Mapping[str, np.ndarray]) -> int:
    name = {"tree_build": "input.root_token_ids", "tree_accept": "input.node_count",
            "greedy_step": "input.root_token_ids"}[op]
    if name not in t:
        raise ShowError(f"has no tensor {name!r}")
    return int(np.asarray(t[name]).shape[0]) if np.ndim(t[name]) else 0


def side_of(op: str, golden: Mapping[str, np.ndarray], b: int, out: Mapping[str, np.ndarray] | None = None,
            where: str = "golden", golden_where: str | None = None) -> Side:
    """Request ``b`` of a golden (``out`` None: its expected outputs) or of an output file.

    Every tensor read is checked first (integer dtype; [B] or [B, T]; request ``b``
    present): anything else is a :class:`ShowError` naming the file (``where``, or
    ``golden_where`` for the golden's tensors) and the tensor."""
    gw = golden_where or (where if out is None else "golden")
    t = golden if out is None else out
    pre = "expected." if out is None else ""
    if op == "tree_accept":
        tree_t, tree_pre, tree_where = golden, "input.", gw
    else:
        tree_t, tree_pre, tree_where = t, pre + ("tree_build." if op == "greedy_step" else ""), where
    side = Side(
        tokens=_row(tree_t, tree_pre + "node_token_ids", b, tree_where),
        first_child=_row(tree_t, tree_pre + "next_token", b, tree_where),
        next_sibling=_row(tree_t, tree_pre + "next_sibling", b, tree_where),
        node_count=_scalar(tree_t, tree_pre + "node_count", b, tree_where),
    )
    if op != "tree_accept":
        side.depths = _row(t, tree_pre + "node_depths", b, where)
        side.parents = _row(t, tree_pre + "parents", b, where) if tree_pre + "parents" in t else None
        if tree_pre + "status" in t:
            side.build_status = _scalar(t, tree_pre + "status", b, where)
        side.scores = _scores(golden, b, gw)
    if op in ("tree_accept", "greedy_step"):
        _path_part(side, t, pre + ("tree_accept." if op == "greedy_step" else ""), b, where)
    return side


# ---------------------------------------------------------------------------- differences


@dataclass
class Diff:
    """The differences of two sides: the first MAX_DIFF_LINES as text (``lines``), how many
    there are (``count``), the slots to mark on each side."""

    lines: list[str] = field(default_factory=list)
    count: int = 0
    expected: Marks = field(default_factory=Marks)  # slots marked on the expected side
    actual: Marks = field(default_factory=Marks)
    bonus: bool = False

    def __bool__(self) -> bool:
        return self.count > 0

    def add(self, line: str) -> None:
        self.count += 1
        if len(self.lines) < MAX_DIFF_LINES:
            self.lines.append(line)

    def add_each(self, idx: np.ndarray, line: Any) -> None:
        """One difference per index of ``idx``; ``line(i)`` the text of the first few."""
        room = max(0, MAX_DIFF_LINES - len(self.lines))
        self.lines.extend(line(int(i)) for i in idx[:room])
        self.count += len(idx)


def _differing(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The indices i < max(len(x), len(y)) where x[i] != y[i] (an element one of them lacks differs)."""
    m = min(len(x), len(y))
    return np.concatenate([np.flatnonzero(x[:m] != y[:m]), np.arange(m, max(len(x), len(y)), dtype=np.int64)])


def _at(x: np.ndarray | None, i: int) -> int | None:
    return int(x[i]) if x is not None and 0 <= i < len(x) else None


def diff_sides(e: Side, a: Side) -> Diff:
    """Every difference of expected ``e`` and actual ``a`` (numpy work linear in the rows)."""
    n = max(e.n_slots, a.n_slots)
    d = Diff(expected=Marks(n), actual=Marks(n))
    if e.node_count != a.node_count:
        d.add(f"node_count: expected {e.node_count}, actual {a.node_count}")
    if e.build_status != a.build_status:
        d.add(f"tree_build status: expected {e.build_status}, actual {a.build_status}")
    arrays = [("node_token_ids", e.tokens, a.tokens), ("next_token", e.first_child, a.first_child),
              ("next_sibling", e.next_sibling, a.next_sibling)]
    if e.depths is not None and a.depths is not None:
        arrays.append(("node_depths", e.depths, a.depths))
    if e.parents is not None and a.parents is not None:
        arrays.append(("parents", e.parents, a.parents))
    for name, x, y in arrays:
        idx = _differing(x, y)
        d.expected.add(idx)
        d.actual.add(idx)
        d.add_each(idx, lambda s, name=name, x=x, y=y: f"slot {s}: {name} expected {_at(x, s)}, actual {_at(y, s)}")
    if e.path is None or a.path is None or e.proposed is None or a.proposed is None:
        return d
    if e.accept_status != a.accept_status:
        d.add(f"tree_accept status: expected {e.accept_status}, actual {a.accept_status}")
    if e.accepted_count != a.accepted_count:
        d.add(f"accepted_count: expected {e.accepted_count}, actual {a.accepted_count}")
    idx = _differing(e.path, a.path)
    d.add_each(idx, lambda i: f"accepted_path[{i}]: expected slot {_at(e.path, i)}, actual slot {_at(a.path, i)}")
    for path in (e.path, a.path):  # where one path goes and the other does not: marked on both sides
        slots = path[idx[idx < len(path)]]
        d.expected.add(slots)
        d.actual.add(slots)
    idx = _differing(e.proposed, a.proposed)
    d.add_each(idx, lambda i: f"proposed[{i}]: expected {_role(e, i)}, actual {_role(a, i)}")
    for side, marks in ((e, d.expected), (a, d.actual)):
        sel = idx[(idx < (side.accepted_count or 0)) & (idx + 1 < len(side.path))]  # type: ignore[arg-type]
        marks.add(side.path[sel + 1])  # type: ignore[index]
    d.bonus = e.bonus != a.bonus
    for name, start in (("accepted_path", max(len(e.path), len(a.path))),
                        ("proposed", max(len(e.proposed), len(a.proposed)))):
        x, y = e.rows.get(name), a.rows.get(name)
        if x is None or y is None:
            continue
        idx = _differing(x[start:], y[start:]) + start
        d.add_each(idx, lambda i, name=name, x=x, y=y:
                   f"{name}[{i}] (padding past the path): expected {_at(x, i)}, actual {_at(y, i)}")
    return d


def _role(side: Side, i: int) -> str:
    """proposed[i] of ``side`` in words: the token of an accepted slot, or the bonus token."""
    if side.proposed is None or i >= len(side.proposed):
        return "nothing (its path is shorter)"
    v = int(side.proposed[i])
    if i == side.accepted_count:
        return f"{v} (bonus token)"
    if side.path is not None and i + 1 < len(side.path):
        return f"{v} (token of slot {int(side.path[i + 1])})"
    return str(v)


# ---------------------------------------------------------------------------- drawing


def _path_text(path: np.ndarray) -> str:
    """The accepted path as ``0 → 3 → 7``; past 2 * PATH_SHOW slots, its ends and how many are left out."""
    if len(path) <= 2 * PATH_SHOW:
        return " → ".join(str(int(s)) for s in path)
    head = " → ".join(str(int(s)) for s in path[:PATH_SHOW])
    tail = " → ".join(str(int(s)) for s in path[-PATH_SHOW:])
    return f"{head} → … ({len(path) - 2 * PATH_SHOW} more) → {tail}"


def _header(op: str, side: Side, title: str) -> Text:
    text = Text(title, style="bold")
    parts = [f"node_count {side.node_count}"]
    if side.build_status is not None:
        parts.append(f"tree_build status {side.build_status} {BUILD_STATUS.get(side.build_status, '?')}")
    if side.path is not None:
        parts.append(f"accepted {side.accepted_count}: path {_path_text(side.path)}")
        bonus = side.bonus
        parts.append(f"bonus {bonus}" if bonus is not None else "no bonus token")
        if side.accept_status is not None:
            parts.append(f"status {side.accept_status} {ACCEPT_STATUS.get(side.accept_status, '?')}")
    text.append("\n" + "; ".join(parts))
    return text


def draw_side(op: str, side: Side, title: str, marked: Marks | None = None, bonus_differs: bool = False) -> Group:
    """The header, the tree (:func:`tree_lines`) and the warnings of one side."""
    marked = marked or Marks()
    w = walk(side)
    on_path = PathIndex(side.path)
    parts: list[Any] = [_header(op, side, title)]
    for note in w.notes:
        parts.append(Text("⚠ " + note, style=WARN_STYLE))
    label = None
    if side.path is not None and len(side.path):
        bonus = side.bonus
        if bonus is not None and w.reached(int(side.path[-1])):
            label = Text()
            if bonus_differs:
                label.append("✗ ", style=DIFF_STYLE)
            label.append(f"+ bonus {bonus}", style=DIFF_STYLE if bonus_differs else BONUS_STYLE)
        p = side.path
        inside = (p >= 0) & (p < len(w.seen))
        reached = np.zeros(len(p), dtype=bool)
        reached[inside] = w.seen[p[inside]]
        missing = p[~reached]
        if len(missing):
            why = "not reached before the walk stopped" if w.stopped else "not in the drawn tree"
            parts.append(Text(f"⚠ {len(missing)} accepted_path slot(s) {why}: {_slot_list(missing)}",
                              style=WARN_STYLE))
    parts.extend(tree_lines(side, w, on_path, marked, label))
    if len(w.unreached):
        parts.append(Text(f"⚠ {len(w.unreached)} slot(s) in [1, node_count] not reached from slot 0: "
                          f"{_slot_list(w.unreached)}", style=WARN_STYLE))
    return Group(*parts)


def render(golden: Any, request: int, output: Any | None = None, golden_name: str = "golden",
           output_name: str = "output", verdict: judge.Verdict | None = None) -> Drawing:
    """The drawing of request ``request`` of ``golden`` (a :class:`kdtr.judge.Golden`, or
    any loaded KDTR file when there is no ``output``), with the output file ``output`` (a
    loaded KDTR file) next to it if given.

    Whether the output "matches expected" is the judge's verdict, never the drawing's:
    ``verdict``, or :func:`kdtr.judge.judge` of ``output`` against ``golden``. Where the
    drawn request shows no difference but the verdict is not PASS (another request, an
    output the drawing does not show, a dtype, NaN), or it shows differences the verdict
    does not fail (a contract that allows them) or fails otherwise (ERROR), a line gives
    the verdict and its reason (:data:`VERDICT_SHOWN` characters at most). (The trees and
    paths drawn are integer outputs, which every contract compares exactly: a difference
    drawn is never a PASS.)

    Raises:
        ShowError: an op without a tree, a request out of range, or a tensor the drawing
            reads that is missing or has the wrong dtype or rank (one line naming the file
            and the tensor).
    """
    golden_name, output_name = printable(golden_name), printable(output_name)
    op = golden.metadata.get("op")
    if op not in TREE_OPS:
        raise ShowError(f"{golden_name} is op {short(repr(op))}: it has no draft tree to draw "
                        f"(kdtr show draws {', '.join(TREE_OPS)})")
    if not any(k.startswith("expected.") for k in golden.tensors):
        raise ShowError(f"{golden_name} has no expected.* tensors: give a golden (kdtr show GOLDEN --output OUT)")
    try:
        n = request_count(op, golden.tensors)
    except ShowError as exc:
        raise ShowError(f"{golden_name} {exc}") from None
    if not 0 <= request < n:
        raise ShowError(f"--request {request}: out of range [0, {n - 1}] ({golden_name} has {n} requests)")
    config = short(golden.metadata.get("config", "?"))
    e = side_of(op, golden.tensors, request, where=golden_name)
    title = f"{op}/{config} request {request}"
    if output is None:
        one = Group(draw_side(op, e, f"{title} (expected)"))
        return Drawing(one, False, _width(one))
    if output.metadata.get("op") not in (None, op):
        raise ShowError(f"{golden_name} is op {op!r} but {output_name} is op {short(repr(output.metadata.get('op')))}")
    a = side_of(op, golden.tensors, request, out=output.tensors, where=output_name, golden_where=golden_name)
    d = diff_sides(e, a)
    if verdict is None and isinstance(golden, judge.Golden):
        verdict = judge.judge(golden, output)
    said = _verdict_line(verdict, bool(d))
    if not d:
        if said is None:
            one = Group(draw_side(op, a, f"{title}: actual ({output_name}) matches expected"))
            return Drawing(one, False, _width(one))
        one = Group(draw_side(op, a, f"{title}: actual ({output_name}) draws the same as expected"), said)
        return Drawing(one, True, _width(one))
    left = draw_side(op, e, f"{title} expected (golden)", d.expected, d.bonus)
    right = draw_side(op, a, f"{title} actual ({output_name})", d.actual, d.bonus)
    lines = [Text(f"✗ {d.count} difference(s) in request {request}:", style=DIFF_STYLE)]
    lines += [Text("  " + line) for line in d.lines]
    if d.count > len(d.lines):
        lines.append(Text(f"  ... {d.count - len(d.lines)} more"))
    if said is not None:
        lines.append(said)
    return Drawing(Group(*lines), True, _width(left) + _width(right) + SIDE_GAP, left, right)


VERDICT_SHOWN = 1000


def _verdict_line(verdict: judge.Verdict | None, differs: bool) -> Text | None:
    """The judge's verdict as one line, or None where the drawing already says it (no
    difference and PASS, differences and MISMATCH) or there is no verdict."""
    if verdict is None:
        return None
    status = Status(verdict.status)
    if (status == Status.PASS and not differs) or (status == Status.MISMATCH and differs):
        return None
    why = f": {short(verdict.reason, VERDICT_SHOWN)}" if verdict.reason else ""
    return Text(f"{'✓' if status == Status.PASS else '✗'} verdict (kdtr.judge, as kdtr run and kdtr diff give it, "
                f"over every request and output): {status}{why}",
                style=BONUS_STYLE if status == Status.PASS else DIFF_STYLE)


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
    """The drawing as SVG, wide enough to show both sides next to each other; ``title``
    passes through :func:`short` (XML 1.0 forbids most control characters even escaped)."""
    width = max(80, drawing.width)
    console = Console(file=io.StringIO(), record=True, width=width, highlight=False, color_system="truecolor")
    console.print(drawing.renderable(width))
    return console.export_svg(title=short(title, 400))


# ---------------------------------------------------------------------------- command


def _refusal(path: str, exc: BaseException) -> ShowError:
    if isinstance(exc, KdtrError):
        return ShowError(f"{path}: {type(exc).__name__}: {exc}")
    if isinstance(exc, OSError):
        return ShowError(f"{path}: {exc.strerror or exc}")
    return ShowError(f"{path}: {exc}")


def _load_golden(path: str) -> judge.Golden:
    """The golden as the judge reads it (:meth:`kdtr.judge.Golden.read`: once, into private
    memory, vouched for by this read, as ``kdtr diff`` reads it)."""
    try:
        return judge.Golden.read(path, tier="file")
    except judge.GoldenError as exc:
        raise _refusal(path, exc.__cause__ or exc) from None


def _load_output(path: str) -> kformat.KdtrFile:
    """The output as the judge reads it (:func:`kdtr.judge.read_output`)."""
    try:
        return judge.read_output(path)
    except (KdtrError, OSError) as exc:
        raise _refusal(path, exc) from None


def _fail(msg: str) -> None:
    click.echo(f"kdtr: error: {short(msg, 4000)}", err=True)
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
    try:
        if svg and not Path(svg).resolve().parent.is_dir():
            raise ShowError(f"--svg {svg}: its directory does not exist")
        g = _load_golden(golden)
        o = _load_output(output) if output is not None else None
        drawing = render(g, request, o, golden_name=golden, output_name=output or "")
        # A terminal keeps its width (the sides stacked if they do not fit); piped output
        # (CI logs, files) is as wide as the drawing needs, at least $COLUMNS or 160.
        width = None if sys.stdout.isatty() else max(terminal_columns(), drawing.width)
        console = Console(highlight=False, record=bool(svg), width=width)
        console.print(drawing.renderable(console.width))
        if svg:
            data = console.export_svg(title=short(f"kdtr show {Path(golden).name} --request {request}", 400))
            try:
                kformat.atomic_write(svg, data.encode("utf-8"))
            except OSError as exc:
                raise ShowError(f"--svg {svg}: {exc.strerror or exc}") from None
            console.print(f"wrote {printable(svg)}", markup=False, highlight=False)
    except ShowError as exc:
        _fail(str(exc))


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
    # private copies, as the judge reads them: a file a binary truncates meanwhile is an error,
    # never a SIGBUS; the golden is the one the case was judged against (kdtr.judge.Golden: the
    # run's read) and the verdict drawn is the case's
    g = getattr(result, "golden", None) or judge.Golden.read(result.case.golden, tier="file")
    status = getattr(result, "status", None)
    verdict = judge.Verdict(status, getattr(result, "reason", "")) if status is not None else None
    o = judge.read_output(out)
    request = _failing_request(result)
    drawing = render(g, request, o, golden_name=str(result.case.golden), output_name=out.name, verdict=verdict)
    data = svg_text(drawing, f"kdtr show {result.case.op}/{result.case.config} --request {request} "
                                f"--output {out.name}")
    kformat.atomic_write(svg, data.encode("utf-8"))
    return svg


report.case_svg = case_svg
