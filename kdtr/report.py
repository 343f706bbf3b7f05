"""Conformance reports: JSON (machine), JUnit XML (CI), Markdown (CI summary).

All three hold every case with its status; a mismatch carries, per output, the count and
share of differing elements, the worst errors with their index, the first differing
elements (request, slot, expected, actual), the kept output file and a rerun command.
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .runner import STATUSES, CaseResult


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        mask = os.umask(0o022)
        os.umask(mask)
        os.fchmod(fd, 0o666 & ~mask)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def counts(results: list[CaseResult]) -> dict[str, int]:
    c = Counter(r.status for r in results)
    return {s: c.get(s, 0) for s in STATUSES}


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
    return {"environment": env, "counts": counts(results), "cases": [r.to_json() for r in results]}


def write_json(path: Path, results: list[CaseResult], env: dict[str, Any]) -> None:
    _atomic_write(path, json.dumps(to_json(results, env), indent=2) + "\n")


def mismatch_lines(r: CaseResult) -> list[str]:
    """Human-readable lines for a failing case (used by the terminal and Markdown reports)."""
    lines = [f"{r.case.id}: {r.status}" + (f": {r.reason}" if r.status != "MISMATCH" else "")]
    for o in r.outputs:
        if o.ok:
            continue
        lines.append(f"  {o.summary()}")
        for e in o.first:
            lines.append(f"    {e.where()}: expected {e.expected}, actual {e.actual}")
    if r.output_file and r.status == "MISMATCH":
        lines.append(f"  obtained tensors: {r.output_file}")
    if r.stderr and r.status in ("CRASH", "TIMEOUT", "ERROR"):
        lines.append("  stderr: " + r.stderr.splitlines()[-1][:300])
    lines.append(f"  rerun: {r.rerun}")
    return lines


def write_junit(path: Path, results: list[CaseResult]) -> None:
    """JUnit XML: one testsuite per op, one testcase per case; statuses kept in properties.

    MISMATCH -> <failure>, CRASH / TIMEOUT / ERROR -> <error>, NOT_SUPPORTED / WAIVED -> <skipped>.
    """
    suites = ET.Element("testsuites", name="kdtr")
    by_op: dict[str, list[CaseResult]] = {}
    for r in results:
        by_op.setdefault(r.case.op, []).append(r)
    for op, rs in by_op.items():
        c = counts(rs)
        suite = ET.SubElement(
            suites,
            "testsuite",
            name=op,
            tests=str(len(rs)),
            failures=str(c["MISMATCH"]),
            errors=str(c["CRASH"] + c["TIMEOUT"] + c["ERROR"]),
            skipped=str(c["NOT_SUPPORTED"] + c["WAIVED"]),
            time=f"{sum(r.seconds for r in rs):.3f}",
        )
        for r in rs:
            tc = ET.SubElement(
                suite, "testcase", classname=f"kdtr.{op}.{r.case.backend}", name=f"{r.case.config}[{r.case.backend}]",
                time=f"{r.seconds:.3f}",
            )
            props = ET.SubElement(tc, "properties")
            ET.SubElement(props, "property", name="status", value=r.status)
            ET.SubElement(props, "property", name="rerun", value=r.rerun)
            text = "\n".join(mismatch_lines(r))
            if r.status == "MISMATCH":
                ET.SubElement(tc, "failure", type="MISMATCH", message=r.reason[:500]).text = text
            elif r.status in ("CRASH", "TIMEOUT", "ERROR"):
                ET.SubElement(tc, "error", type=r.status, message=r.reason[:500]).text = text
            elif r.status in ("NOT_SUPPORTED", "WAIVED"):
                ET.SubElement(tc, "skipped", message=f"{r.status}: {r.reason}"[:500])
    ET.indent(suites)
    _atomic_write(path, '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n")


def _md_cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def markdown(results: list[CaseResult], env: dict[str, Any]) -> str:
    c = counts(results)
    backends = sorted({r.case.backend for r in results})
    out = ["# kdtr conformance report", ""]
    out.append(f"{env['date']} on {env['host']} ({env['platform']}), python {env['python']}, numpy {env['numpy']}.")
    if env.get("gpu"):
        out.append(f"GPU: {env['gpu']}.")
    out.append("")
    out.append("| " + " | ".join(STATUSES) + " |")
    out.append("|" + " --- |" * len(STATUSES))
    out.append("| " + " | ".join(str(c[s]) for s in STATUSES) + " |")
    out.append("")
    out.append("| op | config | " + " | ".join(backends) + " |")
    out.append("| --- | --- |" + " --- |" * len(backends))
    grid: dict[tuple[str, str], dict[str, CaseResult]] = {}
    for r in results:
        grid.setdefault((r.case.op, r.case.config), {})[r.case.backend] = r
    for (op, cfg), row in grid.items():
        cells = [row[b].status if b in row else "" for b in backends]
        out.append(f"| {op} | {cfg} | " + " | ".join(cells) + " |")
    failing = [r for r in results if r.status not in ("PASS", "NOT_SUPPORTED")]
    if failing:
        out += ["", "## Details", ""]
        for r in failing:
            out.append("```")
            out += mismatch_lines(r)
            out.append("```")
    not_supported = [r for r in results if r.status == "NOT_SUPPORTED"]
    if not_supported:
        reasons = sorted({r.reason for r in not_supported})
        out += ["", "NOT_SUPPORTED reasons: " + "; ".join(_md_cell(x) for x in reasons)]
    return "\n".join(out) + "\n"


def write_markdown(path: Path, results: list[CaseResult], env: dict[str, Any]) -> None:
    _atomic_write(path, markdown(results, env))


def write_all(report_dir: Path, results: list[CaseResult], env: dict[str, Any]) -> list[Path]:
    paths = [report_dir / "conformance.json", report_dir / "junit.xml", report_dir / "conformance.md"]
    write_json(paths[0], results, env)
    write_junit(paths[1], results)
    write_markdown(paths[2], results, env)
    return paths
