"""Conformance reports: JSON (machine), JUnit XML (CI), Markdown (CI summary).

All three hold every case with its status; a mismatch carries, per output, the count and
share of differing elements, the worst errors with their index, the first differing
elements (request, slot, expected, actual), the kept output file and a rerun command.
They are published with the run's obtained outputs as one set (:func:`write_all`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import re
import subprocess
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import quote

from . import fsutil
from .run import STATUSES, Case, CaseResult
from .status import ERRORED, SKIPPED, Status
from .text import printable, printable_tree


def counts(results: list[CaseResult]) -> dict[str, int]:
    c = Counter(r.status for r in results)
    return {s: c.get(s, 0) for s in STATUSES}


def git_commit(root: Path) -> str:
    """The checkout's commit (``HEAD``), with ``+dirty`` when tracked files differ; ""
    when ``root`` is not a git checkout or git is absent."""
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10)
        if head.returncode != 0:
            return ""
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def environment() -> dict[str, Any]:
    import numpy as np

    return {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "host": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
    }


def to_json(results: list[CaseResult], env: dict[str, Any]) -> dict[str, Any]:
    """The JSON report; every string from files or binaries escaped (:mod:`kdtr.text`)."""
    return printable_tree({"environment": env, "counts": counts(results), "cases": [r.to_json() for r in results]})


def mismatch_lines(r: CaseResult) -> list[str]:
    """Human-readable lines for a failing case (used by the terminal and all reports);
    each line is :func:`kdtr.text.printable`: no control character from a file name, a
    tensor name or a binary's stderr survives."""
    return [printable(line) for line in _mismatch_lines(r)]


def _mismatch_lines(r: CaseResult) -> list[str]:
    lines = [f"{r.case.id}: {r.status}" + (f": {r.reason}" if r.status != Status.MISMATCH else "")]
    for o in r.outputs:
        if o.ok:
            continue
        lines.append(f"  {o.summary()}")
        for e in o.first:
            lines.append(f"    {e.where()}: expected {e.expected}, actual {e.actual}")
    if r.output_file and r.status == Status.MISMATCH:
        lines.append(f"  obtained tensors: {r.output_file}")
    if r.stderr.strip() and r.status in ERRORED:
        lines.append("  stderr: " + r.stderr.strip().splitlines()[-1][:300])
    lines.append(f"  rerun: {r.rerun}")
    return lines


def junit(results: list[CaseResult], env: dict[str, Any] | None = None) -> str:
    """JUnit XML: one testsuite per op, one testcase per case; statuses kept in properties.

    MISMATCH / NOT_INVARIANT -> <failure>, CRASH / TIMEOUT / ERROR -> <error>, NOT_SUPPORTED / WAIVED -> <skipped>.
    Every attribute and text is escaped (:mod:`kdtr.text`), so the file is well-formed XML
    whatever names, paths or stderr it reports.
    """
    suites = ET.Element("testsuites", name="kdtr")
    if env:
        props = ET.SubElement(suites, "properties")
        for key in ("run_id", "commit", "selection", "bin_dir", "date"):
            if key in env:
                ET.SubElement(props, "property", name=key, value=printable(env[key]))
    by_op: dict[str, list[CaseResult]] = {}
    for r in results:
        by_op.setdefault(r.case.op, []).append(r)
    for op, rs in by_op.items():
        c = counts(rs)
        suite = ET.SubElement(
            suites,
            "testsuite",
            name=printable(op),
            tests=str(len(rs)),
            failures=str(c[Status.MISMATCH] + c[Status.NOT_INVARIANT]),
            errors=str(c[Status.CRASH] + c[Status.TIMEOUT] + c[Status.ERROR]),
            skipped=str(c[Status.NOT_SUPPORTED] + c[Status.WAIVED]),
            time=f"{sum(r.seconds for r in rs):.3f}",
        )
        for r in rs:
            tc = ET.SubElement(
                suite, "testcase", classname=printable(f"kdtr.{op}.{r.case.backend}"),
                name=printable(f"{r.case.config}[{r.case.column}]"),
                time=f"{r.seconds:.3f}",
            )
            props = ET.SubElement(tc, "properties")
            ET.SubElement(props, "property", name="status", value=r.status)
            if r.device is not None:
                ET.SubElement(props, "property", name="device", value=str(r.device))
            if r.case.kernel:
                ET.SubElement(props, "property", name="kernel", value=printable(r.case.kernel))
                if r.detail:
                    ET.SubElement(props, "property", name="detail", value=printable(r.detail))
            ET.SubElement(props, "property", name="rerun", value=printable(r.rerun))
            text = "\n".join(mismatch_lines(r))
            if r.status in (Status.MISMATCH, Status.NOT_INVARIANT):
                ET.SubElement(tc, "failure", type=str(r.status), message=printable(r.reason)[:500]).text = text
            elif r.status in ERRORED:
                ET.SubElement(tc, "error", type=r.status, message=printable(r.reason)[:500]).text = text
            elif r.status in SKIPPED:
                ET.SubElement(tc, "skipped", message=printable(f"{r.status}: {r.reason}")[:500])
    ET.indent(suites)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"



# Draws a failing tree_accept / greedy_step case as SVG next to its obtained output and
# returns the file (or None). Set by kdtr/cli/show.py when the CLI imports it: kdtr/ never
# imports kdtr/cli/, and without the hook the Markdown report simply has no picture links.
case_svg: Callable[[CaseResult], Path | None] | None = None
SVG_OPS = ("tree_accept", "greedy_step")


def draw_svg(r: CaseResult) -> Path | None:
    """The case's draft-tree SVG, drawn next to its obtained output by the hook; None when
    there is no hook, nothing to draw, or drawing fails in any way: a picture never stops
    a report. A graph case has none: its output file holds two replays of a padded batch,
    not the golden's shape."""
    if case_svg is None or r.case.op not in SVG_OPS or not r.output_file or r.case.mode == "graph":
        return None
    try:
        return case_svg(r)
    except Exception:  # noqa: BLE001 - never fail the report for a picture (Terminated is a BaseException)
        return None


def _svg_link(r: CaseResult, report_dir: Path | None, svgs: Mapping[Case, Path] | None = None) -> str | None:
    """The Markdown line linking the case's draft-tree SVG (``svgs[r.case]`` when given,
    else drawn now); None (no line) when there is none."""
    svg = svgs.get(r.case) if svgs is not None else draw_svg(r)
    if svg is None:
        return None
    try:
        target = Path(os.path.relpath(svg, report_dir)) if report_dir is not None else Path(svg)
    except ValueError:
        return None
    return f"Draft tree, expected vs obtained: [{_md_cell(target.name)}]({quote(target.as_posix(), safe='/.:')})"


def _md_cell(s: str) -> str:
    return printable(s).replace("|", "\\|")


def _fence(lines: list[str]) -> str:
    """A code fence longer than any backtick run in ``lines`` (a name cannot close it)."""
    return "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", "\n".join(lines))), default=0))


def markdown(results: list[CaseResult], env: dict[str, Any], report_dir: Path | None = None,
             svgs: Mapping[Case, Path] | None = None) -> str:
    """The Markdown report; ``report_dir`` (where it will be written) makes the draft-tree
    SVG links of failing tree_accept / greedy_step cases relative to it. ``svgs`` (case ->
    SVG file) gives those pictures already drawn; without it they are drawn now."""
    c = counts(results)
    backends = sorted({r.case.column for r in results})  # backend, or backend:kernel under a forced kernel
    out = ["# kdtr conformance report", ""]
    out.append(_md_cell(f"{env['date']} on {env['host']} ({env['platform']}), python {env['python']}, "
                        f"numpy {env['numpy']}."))
    if env.get("gpu"):
        out.append(_md_cell(f"GPU: {env['gpu']}."))
    if env.get("commit"):
        out.append(_md_cell(f"Commit: {env['commit']}."))
    if env.get("selection"):
        out.append(_md_cell(f"Selection: {env['selection']}."))
    if env.get("bin_dir"):
        out.append(_md_cell(f"Binaries tested: {env['bin_dir']}."))
    if env.get("run_id"):
        out.append(_md_cell(f"Run: {env['run_id']}."))
    devices = sorted({r.device for r in results if r.device is not None})
    if len(devices) > 1:
        per = ", ".join(f"{d}: {sum(r.device == d for r in results)}" for d in devices)
        out.append(f"CUDA devices (cases each): {per}; conformance.json gives each case's device.")
    out.append("")
    out.append("| " + " | ".join(STATUSES) + " |")
    out.append("|" + " --- |" * len(STATUSES))
    out.append("| " + " | ".join(str(c[s]) for s in STATUSES) + " |")
    out.append("")
    out.append("| op | config | " + " | ".join(backends) + " |")
    out.append("| --- | --- |" + " --- |" * len(backends))
    grid: dict[tuple[str, str], dict[str, CaseResult]] = {}
    for r in results:
        grid.setdefault((r.case.op, r.case.config), {})[r.case.column] = r
    for (op, cfg), row in grid.items():
        cells = [row[b].status if b in row else "" for b in backends]
        out.append(f"| {_md_cell(op)} | {_md_cell(cfg)} | " + " | ".join(cells) + " |")
    forced = [r for r in results if r.case.kernel and r.detail]
    if forced:  # which instance each forced kernel ran (tree_build select: its heap fallbacks)
        out += ["", "Forced kernels: " + "; ".join(f"{_md_cell(r.case.id)}: {_md_cell(r.detail)}" for r in forced)]
    failing = [r for r in results if r.status not in (Status.PASS, Status.NOT_SUPPORTED)]
    if failing:
        out += ["", "## Details", ""]
        for r in failing:
            lines = mismatch_lines(r)
            fence = _fence(lines)
            out += [fence, *lines, fence]
            link = _svg_link(r, report_dir, svgs)
            if link:
                out.append(link)
    not_supported = [r for r in results if r.status == Status.NOT_SUPPORTED]
    if not_supported:
        reasons = sorted({r.reason for r in not_supported})
        out += ["", "NOT_SUPPORTED reasons: " + "; ".join(_md_cell(x) for x in reasons)]
    return "\n".join(out) + "\n"


REPORT_NAMES = ("conformance.json", "junit.xml", "conformance.md")
OBTAINED = "obtained"  # the obtained outputs (and draft-tree SVGs) of the run
REPORT_KIND = "conformance"


def report_set(report_dir: Path) -> fsutil.ReportSet:
    """The report set of ``kdtr run`` in ``report_dir``: :data:`REPORT_NAMES` and the
    :data:`OBTAINED` directory, published as one unit (:class:`kdtr.fsutil.ReportSet`)::

        report_dir/.conformance -> .conformance-<id>   (the run's whole set)
        report_dir/conformance.json -> .conformance/conformance.json   (and so on)
        report_dir/obtained -> .conformance/obtained
    """
    return fsutil.ReportSet(report_dir, REPORT_KIND, REPORT_NAMES, (OBTAINED,))


def current_reports(report_dir: Path) -> Path | None:
    """The directory of the last published run of ``report_dir``, resolved once: read
    every file of one run from it (the names in ``report_dir`` itself each show the run
    current when opened); None when no run was published there."""
    return fsutil.current_set(report_dir, REPORT_KIND)


def shown(results: list[CaseResult], rset: fsutil.ReportSet) -> list[CaseResult]:
    """``results`` with each obtained output, in its ``output_file`` and in the binary's
    recorded ``command``, spelt as readers see it once the set is published
    (``report_dir/obtained/...``) instead of inside the run directory."""
    return [dataclasses.replace(r, output_file=rset.shown(r.output_file) if r.output_file else r.output_file,
                                command=[rset.shown(a) for a in r.command]) for r in results]


def write_all(report_dir: Path, results: list[CaseResult], env: dict[str, Any],
              rset: fsutil.ReportSet | None = None) -> list[Path]:
    """Publish the reports of one run, with its obtained outputs, as one unit.

    ``rset`` is the run's set (:func:`report_set`, begun before the run, its obtained
    outputs written into ``rset.run_dir / "obtained"``); without it a new set with an empty
    ``obtained`` directory is begun here. The draft-tree SVGs of failing cases are drawn
    next to their obtained outputs, the three reports rendered and written into the run
    directory, and only then is the set published by one rename of the pointer
    (:meth:`kdtr.fsutil.ReportSet.publish`). A reader then sees the previous run's
    complete set or this run's, never a mix, whenever the writer is interrupted; an
    exception removes this run's unpublished directory. Each report records
    ``env["run_id"]``.

    Returns:
        The published report paths ``report_dir/<name>`` (:data:`REPORT_NAMES`).

    Raises:
        kdtr.fsutil.UnsafePath: a name of the set in ``report_dir`` is a symbolic link
            kdtr did not make, or not a regular file / directory.
        OSError: the reports cannot be written or published.
    """
    if rset is None:
        rset = report_set(report_dir)
        rset.begin()
    with rset.discarded_on_error():
        run_dir = rset.run_dir
        if run_dir is None:
            raise RuntimeError("write_all: the report set was not begun")
        svgs = {r.case: svg for r in results if r.status not in (Status.PASS, Status.NOT_SUPPORTED)
                and (svg := draw_svg(r)) is not None}
        public = shown(results, rset)
        texts = [json.dumps(to_json(public, env), indent=2) + "\n", junit(public, env),
                 markdown(public, env, run_dir, svgs)]
        fsutil.write_together([(run_dir / name, text.encode("utf-8")) for name, text in zip(REPORT_NAMES, texts)])
        published = rset.publish()
    return published[: len(REPORT_NAMES)]
