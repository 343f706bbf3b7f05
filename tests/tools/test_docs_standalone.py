"""README.md and docs/ stand alone: no citation of a design document that is not in the
repository, no "issue N" a reader cannot look up (say what the feature or input is), and
every repository path they name exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("**/*.md"))]

FORBIDDEN = [
    (re.compile(r"\bDESIGN\b"), "cites DESIGN(.md), which is not in the repository: name the docs/ page "
                                "that states the rule, or say it"),
    (re.compile(r"\bissues?[- ]\d+", re.I), "names an issue number no reader can look up: say what it is"),
]

# Markdown links [text](target) and bare repository paths (docs/x.md, kdtr/y.py, ...).
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
PATH = re.compile(r"(?<![\w./<-])((?:docs|kdtr|tests|tools|bench|cuda_tests|golden|mutants|\.ci|\.github)/[\w./-]*\w)")
# Placeholders of the how-to pages, and files that exist only where a user makes them.
PLACEHOLDER = re.compile(r"my_|foo|_$")
# (golden/.cache/: the second tier, generated on demand; absent from a fresh clone)
OPTIONAL = {"golden/known_failures.json", "golden/.cache"}


def _rel(doc: Path) -> str:
    return str(doc.relative_to(REPO))


@pytest.mark.parametrize("doc", DOCS, ids=_rel)
def test_no_design_document_or_issue_number(doc):
    bad = []
    for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
        for pattern, why in FORBIDDEN:
            m = pattern.search(line)
            if m:
                bad.append(f"{_rel(doc)}:{n}: {m[0]!r} {why}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("doc", DOCS, ids=_rel)
def test_links_and_repository_paths_resolve(doc):
    text = doc.read_text(encoding="utf-8")
    missing = []
    for m in LINK.finditer(text):
        target = m[1].split("#")[0]
        if target and not re.match(r"^[a-z][a-z0-9+.-]*:", target) and not (doc.parent / target).exists():
            missing.append(f"link {m[1]}")
    for m in PATH.finditer(text):
        path = m[1].rstrip(".")
        if path not in OPTIONAL and not PLACEHOLDER.search(path) and not (REPO / path).exists():
            missing.append(f"path {path}")
    assert not missing, f"{_rel(doc)}: " + ", ".join(missing)


def test_the_forbidden_patterns_catch_what_they_are_for():
    texts = ["see shared/DESIGN.md section 3", "per DESIGN 4", "the goldens of issue 10", "Issues 8 and 9",
             "the issue-10 goldens"]
    assert all(any(p.search(t) for p, _ in FORBIDDEN) for t in texts)
    assert not any(p.search("tissue 10, designs, the issue of ties") for p, _ in FORBIDDEN)
