"""The drawing of one draft tree for ``kdtr show`` (:mod:`kdtr.cli.show`): the walk from
slot 0 and the lines it becomes, bounded whatever the file holds (docs/show.md, "Bounds").

:func:`walk` follows next_token / next_sibling from slot 0, each slot at most once, at
most MAX_WALK slots; :func:`tree_lines` turns the walk into at most MAX_LINES lines with
tree guides (├──, └──, │), folding a chain longer than FOLD_MIN slots to its first and
last FOLD_KEEP slots and its marked ones, and drawing slots deeper than MAX_INDENT levels
at that level, marked ». The side's arrays are int64 numpy rows, checked by the loader;
slot sets (:class:`Marks`, :class:`PathIndex`) are numpy arrays, never a Python object per
slot of the file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from rich.text import Text

from kdtr.text import printable

# Bounds (docs/show.md, "Bounds"): whatever the files hold, one tree's drawing is at most
# MAX_LINES lines of at most 4 * MAX_INDENT columns of guides plus one label (~100
# columns), the walk visits at most MAX_WALK slots, and every comparison is numpy work
# linear in the tensors' sizes.
MAX_WALK = 100_000  # slots the walk from slot 0 visits per tree, at most
MAX_LINES = 400  # lines of one tree (slots, folded chains, warnings), at most
FOLD_MIN = 40  # a chain (a run of single-child slots) longer than this is folded ...
FOLD_KEEP = 12  # ... to its first and last FOLD_KEEP slots and its marked (✗) slots
MAX_INDENT = 48  # indentation levels; deeper slots are drawn at this level, marked »
MAX_NAME = 120  # characters of a string from a file (config, op) in a title or message
PATH_SHOW = 20  # slots of a long accepted path shown at each end in the header
MAX_LISTED = 20  # slots listed in a warning

PATH_STYLE = "bold green"
DIFF_STYLE = "bold red"
BONUS_STYLE = "bold cyan"
WARN_STYLE = "yellow"


def short(value: Any, limit: int = MAX_NAME) -> str:
    """``value`` as text for a terminal or an SVG: :func:`kdtr.text.printable` (every
    control, format or unassigned character spelled ``\\xNN``), cut to ``limit``
    characters with the length said (``… (5000 characters)``)."""
    raw = str(value)
    s = printable(raw[: limit + 1])
    if len(raw) > limit or len(s) > limit:
        return s[:limit] + f"… ({len(raw)} characters)"
    return s


class Scores:
    """One request's ``input.top_log_probs`` / ``input.top_token_ids`` rows (float64 [D,K],
    int64 [D,K]): the log-probability of a token at a depth, each depth row indexed once."""

    def __init__(self, lp: np.ndarray, ids: np.ndarray) -> None:
        self.lp, self.ids = lp, ids
        self._index: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def weight(self, d: int, token: int) -> float | None:
        """top_log_probs[d-1][r] for the first rank r with top_token_ids[d-1][r] == token, or None."""
        if not 1 <= d <= len(self.ids):
            return None
        if d not in self._index:
            self._index[d] = np.unique(self.ids[d - 1], return_index=True)  # first occurrences
        u, first = self._index[d]
        i = int(np.searchsorted(u, token))
        return float(self.lp[d - 1][first[i]]) if i < len(u) and u[i] == token else None


class PathIndex:
    """The first position of each slot in an accepted path (int64 [n]), looked up in O(log n)."""

    def __init__(self, path: np.ndarray | None) -> None:
        p = np.zeros(0, np.int64) if path is None else path
        self.slots, self.first = np.unique(p, return_index=True)

    def get(self, s: int) -> int | None:
        i = int(np.searchsorted(self.slots, s))
        return int(self.first[i]) if i < len(self.slots) and self.slots[i] == s else None

    def __contains__(self, s: int) -> bool:
        return self.get(s) is not None


class Marks:
    """A set of slots in [0, n) (a bit per slot); slots outside it are never drawn, so never marked."""

    def __init__(self, n: int = 0) -> None:
        self.mask = np.zeros(n, dtype=bool)

    def add(self, slots: Any) -> None:
        s = np.asarray(slots, dtype=np.int64).reshape(-1)
        self.mask[s[(s >= 0) & (s < len(self.mask))]] = True

    def __contains__(self, s: int) -> bool:
        return 0 <= s < len(self.mask) and bool(self.mask[s])


@dataclass
class Side:
    """One request's draft tree and, where the op has one, its accepted path (int64 arrays)."""

    tokens: np.ndarray
    first_child: np.ndarray
    next_sibling: np.ndarray
    node_count: int
    depths: np.ndarray | None = None
    parents: np.ndarray | None = None
    build_status: int | None = None
    path: np.ndarray | None = None  # accepted_path[:accepted_count + 1]
    proposed: np.ndarray | None = None  # proposed[:accepted_count + 1]
    accepted_count: int | None = None
    accept_status: int | None = None
    scores: Scores | None = None  # for the score of each slot (tree_build, greedy_step)
    rows: dict[str, np.ndarray] = field(default_factory=dict)  # the whole accepted_path / proposed rows

    @property
    def n_slots(self) -> int:
        return min(len(self.tokens), len(self.first_child), len(self.next_sibling))

    @property
    def bonus(self) -> int | None:
        if self.proposed is None or self.accepted_count is None or self.accept_status not in (0, None):
            return None
        return int(self.proposed[-1]) if len(self.proposed) == self.accepted_count + 1 else None


@dataclass
class Walk:
    """The tree as drawn: each slot reached at most once from slot 0, at most MAX_WALK slots."""

    children: dict[int, list[int]] = field(default_factory=dict)
    problems: dict[int, list[str]] = field(default_factory=dict)
    depth: dict[int, int] = field(default_factory=lambda: {0: 0})
    score: dict[int, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    seen: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))  # [node_count + 1]
    visited: int = 0
    stopped: bool = False  # the walk reached MAX_WALK slots
    unreached: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    def reached(self, s: int) -> bool:
        return 0 <= s < len(self.seen) and bool(self.seen[s])


def walk(side: Side, limit: int = MAX_WALK) -> Walk:
    """Follow next_token / next_sibling from slot 0, visiting each slot at most once and
    stopping a sibling list at the first link outside [1, node_count] or back to a slot
    already drawn (recorded as a problem of the slot whose list it is); at most ``limit``
    slots in all (then ``stopped``, with a note)."""
    w = Walk()
    t = side.n_slots
    if t == 0:
        w.notes.append("no slots (empty tensors)")
        return w
    hi = side.node_count
    if not 0 <= hi <= t - 1:
        w.notes.append(f"node_count {hi} outside [0, {t - 1}]: links drawn up to slot {t - 1}")
        hi = t - 1
    if side.scores is not None:
        w.score[0] = 0.0
    seen = np.zeros(hi + 1, dtype=bool)
    seen[0] = True
    w.visited = 1
    stack = [0]
    while stack and not w.stopped:
        s = stack.pop()
        kids: list[int] = []
        via, c = f"next_token[{s}]", int(side.first_child[s])
        while c != -1:
            if not 1 <= c <= hi:
                w.problems.setdefault(s, []).append(f"{via} = {c}: outside [1, {hi}], not followed")
                break
            if seen[c]:
                w.problems.setdefault(s, []).append(f"{via} = {c}: slot {c} already drawn (a cycle), not followed")
                break
            if w.visited >= limit:
                w.stopped = True
                break
            seen[c] = True
            w.visited += 1
            kids.append(c)
            w.depth[c] = w.depth[s] + 1
            if side.scores is not None and s in w.score:
                _score(side, w, s, c)
            via, c = f"next_sibling[{c}]", int(side.next_sibling[c])
        w.children[s] = kids
        stack.extend(reversed(kids))
    w.seen = seen
    if w.stopped:
        w.notes.append(f"the walk stopped after {limit} slots (kdtr show follows at most {limit} per tree)")
    else:
        w.unreached = np.flatnonzero(~seen[1:]) + 1
    return w


def _score(side: Side, w: Walk, parent: int, c: int) -> None:
    """score[c] = score[parent] + top_log_probs[d-1][rank of c's token], in float64 (the
    builder's candidate weight, up to the last bits of its sibling update)."""
    d = _depth(side, w, c)
    x = side.scores.weight(d, int(side.tokens[c])) if d is not None else None  # type: ignore[union-attr]
    if x is not None:
        w.score[c] = w.score[parent] + x


def _depth(side: Side, w: Walk, s: int) -> int | None:
    """The depth shown for slot ``s``: node_depths[s] where the side has them, else the walk's."""
    if side.depths is not None:
        return int(side.depths[s]) if s < len(side.depths) else None
    return w.depth.get(s, 0)


def _label(side: Side, w: Walk, s: int, on_path: PathIndex, marked: Marks) -> Text:
    text = Text()
    pos = on_path.get(s)
    if s in marked:
        text.append("✗ ", style=DIFF_STYLE)
    if pos is not None:
        text.append("✓ ", style=PATH_STYLE)
    style = DIFF_STYLE if s in marked else PATH_STYLE if pos is not None else ""
    text.append(f"[{s}] tok {int(side.tokens[s])}", style=style)
    depth = _depth(side, w, s)
    text.append(f"  d{'?' if depth is None else depth}", style="dim")
    if s in w.score:
        text.append(f"  score {w.score[s]:.4f}", style="dim")
    if pos and side.proposed is not None and pos - 1 < len(side.proposed) \
            and int(side.proposed[pos - 1]) != int(side.tokens[s]):
        text.append(f"  proposed {int(side.proposed[pos - 1])}", style=DIFF_STYLE)
    return text


def _slot_list(slots: np.ndarray) -> str:
    shown = ", ".join(str(int(s)) for s in slots[:MAX_LISTED])
    return shown + (", ..." if len(slots) > MAX_LISTED else "")


def _connector(prefix: str, last: bool, level: int) -> Text:
    """The guides in front of a node at ``level`` (1 = a child of slot 0); past MAX_INDENT
    the node is drawn at MAX_INDENT, its connector marked »."""
    return Text(prefix + ("└" if last else "├") + ("─» " if level > MAX_INDENT else "── "), style="dim")


def _child_prefix(prefix: str, last: bool, level: int) -> str:
    return prefix if level >= MAX_INDENT else prefix + ("    " if last else "│   ")


def tree_lines(side: Side, w: Walk, on_path: PathIndex, marked: Marks, bonus: Text | None) -> list[Text]:
    """The tree from slot 0 as lines, pre-order, first-child / next-sibling order: at most
    MAX_LINES lines (then a note saying how many slots are left out), chains longer than
    FOLD_MIN folded to their ends and marked slots (one line for each folded stretch),
    indentation capped at MAX_INDENT levels. ``bonus`` goes under the path's last slot."""
    if side.n_slots == 0:
        return []
    bonus_slot = int(side.path[-1]) if bonus is not None and side.path is not None else None

    def items(s: int) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = [("slot", c) for c in w.children.get(s, ())]
        out += [("warn", m) for m in w.problems.get(s, ())]
        if s == bonus_slot:
            out.append(("bonus", bonus))
        return out

    def only_child(s: int) -> int | None:
        kids = w.children.get(s, ())
        return kids[0] if len(kids) == 1 and not w.problems.get(s) and s != bonus_slot else None

    def chain(c: int, limit: int) -> list[int]:
        run = [c]
        nxt = only_child(c)
        while nxt is not None and len(run) < limit:
            run.append(nxt)
            nxt = only_child(nxt)
        return run

    def entries(run: list[int]) -> list[tuple[str, Any]]:
        """A long chain as kept slots and folded stretches (2 slots at least)."""
        keep = [i < FOLD_KEEP or i >= len(run) - FOLD_KEEP or s in marked for i, s in enumerate(run)]
        out: list[tuple[str, Any]] = []
        i = 0
        while i < len(run):
            j = i
            while j < len(run) and not keep[j]:
                j += 1
            if j - i >= 2:
                out.append(("fold", run[i:j]))
            else:
                out.extend(("slot", s) for s in run[i:j])
            if j < len(run):
                out.append(("slot", run[j]))
            i = j + 1
        return out

    def fold_label(stretch: list[int]) -> Text:
        d0, d1 = _depth(side, w, stretch[0]), _depth(side, w, stretch[-1])
        on = sum(s in on_path for s in stretch)
        text = f"┆ {len(stretch)} slots of a chain folded: [{stretch[0]}] … [{stretch[-1]}], d{d0} … d{d1}"
        if on:
            text += ", all on the accepted path" if on == len(stretch) else f", {on} on the accepted path"
        return Text(text, style="dim")

    lines = [_label(side, w, 0, on_path, marked)]
    drawn = folded = 0
    capped = full = False
    root_items = items(0)
    stack = [(it, 1, "", i == len(root_items) - 1) for i, it in reversed(list(enumerate(root_items)))]
    while stack and not full:
        (kind, value), level, prefix, last = stack.pop()
        if kind != "slot":
            label = Text("⚠ " + value, style=WARN_STYLE) if kind == "warn" else value
            lines.append(_connector(prefix, last, level).append_text(label))
            full = len(lines) >= MAX_LINES
            continue
        run = chain(value, FOLD_MIN + 1)
        todo = entries(chain(value, MAX_WALK + 1)) if len(run) > FOLD_MIN else [("slot", value)]
        for j, (kind, v) in enumerate(todo):
            if j:
                prefix, last, level = _child_prefix(prefix, last, level), True, level + 1
            if len(lines) >= MAX_LINES:
                full = True
                break
            capped = capped or level > MAX_INDENT
            if kind == "slot":
                lines.append(_connector(prefix, last, level).append_text(_label(side, w, v, on_path, marked)))
                drawn += 1
            else:
                lines.append(_connector(prefix, last, level).append_text(fold_label(v)))
                folded += len(v)
        else:
            kids = items(todo[-1][1])
            cp = _child_prefix(prefix, last, level)
            stack.extend((it, level + 1, cp, i == len(kids) - 1) for i, it in reversed(list(enumerate(kids))))
            full = len(lines) >= MAX_LINES
    notes = []
    if capped:
        notes.append(Text(f"⚠ indentation capped at {MAX_INDENT} levels: deeper slots are drawn at level "
                          f"{MAX_INDENT}, marked », their depth in d<n>", style=WARN_STYLE))
    rest = w.visited - 1 - drawn - folded
    if full and rest > 0:
        lines.append(Text(f"⚠ … {rest} more slot(s) not drawn: kdtr show draws at most {MAX_LINES} lines per tree",
                          style=WARN_STYLE))
    return notes + lines
