"""The mutation reports: the score per op and pass, what makes ``kdtr mutate`` exit 1,
``mutation.md`` and ``mutation.json`` published together as one report set."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kdtr import fsutil
from kdtr.mutate.catalogue import (
    BAD_CLAIM,
    BUILT,
    EQUIVALENT,
    GPU_OUTCOMES,
    IDENTICAL,
    KILLED,
    KILLED_BY_SANITIZER,
    NOT_RUN,
    OPS,
    OUTCOMES,
    STILLBORN,
    SURVIVED,
    Triage,
)
from kdtr.mutate.execute import MutantResult

MUTATION_REPORTS = ("mutation.json", "mutation.md")


def _counts(rs: list[MutantResult], outcomes: tuple[str, ...]) -> dict[str, Any]:
    c = {o: sum(r.outcome == o for r in rs) for o in outcomes}
    killed = c[KILLED] + c[BAD_CLAIM] + c.get(KILLED_BY_SANITIZER, 0)
    judged = killed + c[SURVIVED]
    return {"mutants": len(rs), **c, "score": (killed / judged) if judged else None}


def _outcomes_of(results: list[MutantResult]) -> tuple[str, ...]:
    return GPU_OUTCOMES if any(r.mutant.backend == "cuda" for r in results) else OUTCOMES


def score(results: list[MutantResult]) -> dict[str, dict[str, Any]]:
    """Per op and "all": counts of each outcome and the score killed / (killed +
    survived): the share of mutants that compute a wrong output which the goldens catch
    (EQUIVALENT, IDENTICAL and STILLBORN mutants compute no wrong output, BAD_CLAIM ones
    count as killed; GPU mutants: KILLED_BY_SANITIZER too, and the counts hold every
    outcome of :data:`GPU_OUTCOMES`)."""
    out: dict[str, dict[str, Any]] = {}
    outcomes = _outcomes_of(results)
    for key in (*OPS, "all"):
        rs = [r for r in results if key == "all" or r.mutant.op == key]
        if not rs:
            continue
        out[key] = _counts(rs, outcomes)
    return out


def kernel_score(results: list[MutantResult]) -> dict[str, dict[str, Any]]:
    """GPU mutants per target kernel (their catalogue file, in order of first appearance)
    and "all": the counts of :data:`GPU_OUTCOMES` and the score, as :func:`score`."""
    out: dict[str, dict[str, Any]] = {}
    kernels = list(dict.fromkeys(r.mutant.kernel for r in results))
    for key in (*kernels, "all"):
        rs = [r for r in results if key == "all" or r.mutant.kernel == key]
        if rs:
            out[key] = _counts(rs, GPU_OUTCOMES)
    return out


def failing(results: list[MutantResult], triage: dict[tuple[str, str, str], Triage]) -> list[MutantResult]:
    """The results that make ``kdtr mutate`` exit 1: a catalogue mutant that survived, did
    not compile or was wrongly declared equivalent; a GPU mutant that is IDENTICAL without
    being declared equivalent or was NOT_RUN; a generic survivor not triaged "equivalent"."""
    bad = []
    for r in results:
        if r.mutant.kind == "catalogue" and r.outcome in (SURVIVED, STILLBORN, BAD_CLAIM):
            bad.append(r)
        elif r.mutant.backend == "cuda" and r.outcome == IDENTICAL and not r.mutant.equivalent:
            bad.append(r)  # a GPU catalogue entry that changes no binary: fix it or declare why
        elif r.outcome == NOT_RUN:
            bad.append(r)  # the run ended (--time-budget) before judging it: incomplete
        elif r.mutant.kind == "generic" and r.outcome == SURVIVED:
            t = triage.get((r.mutant.file, r.mutant.find.strip(), r.mutant.replace.strip()))
            if t is None or t.verdict != "equivalent":
                bad.append(r)
    return bad


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ").replace("`", "'")


def markdown(results: list[MutantResult], triage: dict[tuple[str, str, str], Triage], env: dict[str, Any]) -> str:
    lines = ["# Mutation report", ""]
    lines += [f"- {k}: {v}" for k, v in env.items()]
    for kind in ("catalogue", "generic"):
        rs = [r for r in results if r.mutant.kind == kind and r.mutant.backend == "cpu"]
        if not rs:
            continue
        lines += ["", f"## {kind.capitalize()}", "",
                  "| op | mutants | killed | survived | equivalent | identical | stillborn | bad claim | score |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for op, s in score(rs).items():
            lines.append(f"| {op} | {s['mutants']} | {s[KILLED]} | {s[SURVIVED]} | {s[EQUIVALENT]} | "
                         f"{s[IDENTICAL]} | {s[STILLBORN]} | {s[BAD_CLAIM]} | {_pct(s['score'])} |")
        surv = [r for r in rs if r.outcome in (SURVIVED, BAD_CLAIM)]
        if surv:
            lines += ["", "### Survivors" if kind == "catalogue" else "### Survivors and their triage", ""]
            for r in surv:
                m = r.mutant
                t = triage.get((m.file, m.find.strip(), m.replace.strip()))
                untriaged = " -- untriaged" if kind == "generic" else ""
                verdict = f" -- triage: {t.verdict}: {t.reason}" if t else untriaged
                lines.append(f"- {r.outcome} `{m.id}` {m.file}:{m.line}: `{_cell(m.find.strip())}` -> "
                             f"`{_cell(m.replace.strip())}`{_cell(verdict)}")
        if kind == "catalogue":
            lines += ["", "### Every catalogue mutant", "",
                      "| mutant | bug | outcome | killed by / reason |", "|---|---|---|---|"]
            for r in rs:
                why = ", ".join(k.removesuffix("@cpu") for k in r.killed_by) or r.detail
                lines.append(f"| `{r.mutant.id}` | {_cell(r.mutant.bug)} | {r.outcome} | {_cell(why)} |")
    gpu = [r for r in results if r.mutant.backend == "cuda"]
    if gpu:
        lines += _gpu_markdown(gpu)
    return "\n".join(lines) + "\n"


_GPU_COLUMNS = ((KILLED, "killed by goldens"), (KILLED_BY_SANITIZER, "killed by sanitizer"), (SURVIVED, "survived"),
                (EQUIVALENT, "equivalent"), (IDENTICAL, "identical"), (STILLBORN, "stillborn"),
                (BAD_CLAIM, "bad claim"), (BUILT, "built"), (NOT_RUN, "not run"))


def _gpu_table(first: str, scores: dict[str, dict[str, Any]]) -> list[str]:
    # BUILT only where --build-only made it (nothing ran: no score), NOT_RUN only when the
    # time budget ran out
    cols = [(o, name) for o, name in _GPU_COLUMNS
            if o not in (BUILT, NOT_RUN) or any(s[o] for s in scores.values())]
    lines = [f"| {first} | mutants | " + " | ".join(name for _, name in cols) + " | score |",
             "|---" * (len(cols) + 3) + "|"]
    for key, s in scores.items():
        lines.append(f"| {key} | {s['mutants']} | " + " | ".join(str(s[o]) for o, _ in cols) +
                     f" | {_pct(s['score'])} |")
    return lines


def _gpu_markdown(rs: list[MutantResult]) -> list[str]:
    """The GPU catalogue's section: per op, per kernel, the survivors, every mutant."""
    lines = ["", "## GPU catalogue", "", *_gpu_table("op", score(rs)), "", "### Per kernel", "",
             *_gpu_table("kernel", kernel_score(rs))]
    surv = [r for r in rs if r.outcome in (SURVIVED, BAD_CLAIM)]
    if surv:
        lines += ["", "### Survivors", ""]
        for r in surv:
            m = r.mutant
            lines.append(f"- {r.outcome} `{m.id}` {m.file}:{m.line}: `{_cell(m.find.strip())}` -> "
                         f"`{_cell(m.replace.strip())}` -- {_cell(r.detail)}")
    lines += ["", "### Every GPU mutant", "", "| mutant | op | bug | outcome | killed by / reason |",
              "|---|---|---|---|---|"]
    for r in rs:
        why = r.detail or ", ".join(r.killed_by)  # a kill: its first failing case and why
        if len(r.killed_by) > 1:
            why += f" (+{len(r.killed_by) - 1} more failing cases)"
        lines.append(f"| `{r.mutant.id}` | {r.mutant.op} | {_cell(r.mutant.bug)} | {r.outcome} | {_cell(why)} |")
    return lines


def to_json(results: list[MutantResult], triage: dict[tuple[str, str, str], Triage],
            env: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"environment": env, "score": {}, "mutants": []}
    for kind in ("catalogue", "generic"):
        rs = [r for r in results if r.mutant.kind == kind and r.mutant.backend == "cpu"]
        if rs:
            out["score"][kind] = score(rs)
    gpu = [r for r in results if r.mutant.backend == "cuda"]
    if gpu:
        out["score"]["gpu"] = score(gpu)
        out["score"]["gpu_kernels"] = kernel_score(gpu)
    for r in results:
        j = r.to_json()
        t = triage.get((r.mutant.file, r.mutant.find.strip(), r.mutant.replace.strip()))
        if r.mutant.kind == "generic" and r.outcome == SURVIVED:
            j["triage"] = asdict(t) if t else None
        out["mutants"].append(j)
    return out


def write_reports(report_dir: Path, results: list[MutantResult], triage: dict[tuple[str, str, str], Triage],
                  env: dict[str, Any]) -> list[Path]:
    """Publish ``mutation.json`` and ``mutation.md`` in ``report_dir`` as one set
    (:class:`kdtr.fsutil.ReportSet` of kind ``mutation``: ``report_dir/.mutation ->
    .mutation-<id>``, the two names links through it), so that a reader never sees the
    JSON of one run beside the Markdown of another.

    Raises:
        kdtr.fsutil.UnsafePath: a report name is a link kdtr did not make, or not a file.
        OSError: the reports cannot be written.
    """
    md = markdown(results, triage, env).encode()
    js = (json.dumps(to_json(results, triage, env), indent=1) + "\n").encode()
    rset = fsutil.ReportSet(report_dir, "mutation", MUTATION_REPORTS)
    run_dir = rset.begin()
    with rset.discarded_on_error():
        fsutil.write_together([(run_dir / MUTATION_REPORTS[0], js), (run_dir / MUTATION_REPORTS[1], md)])
        return rset.publish()


