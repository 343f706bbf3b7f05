"""Case statuses of a conformance run: one enum, used by the runner, the reports and the CLI.

A :class:`Status` is also a ``str`` equal to its name (``Status.PASS == "PASS"``), so JSON
reports, JUnit properties and comparisons with text read from a report keep working.
Their meanings: docs/harness.md, "Statuses and exit codes".
"""

from __future__ import annotations

from enum import Enum


class Status(str, Enum):
    """The outcome of one case (one golden on one backend)."""

    PASS = "PASS"  # every expected output meets its contract
    MISMATCH = "MISMATCH"  # an output is missing, of another dtype/shape, or breaks its contract
    CRASH = "CRASH"  # the binary died by a signal or exited 1
    TIMEOUT = "TIMEOUT"  # the binary ran past the time limit and was killed
    ERROR = "ERROR"  # harness or input problem
    NOT_SUPPORTED = "NOT_SUPPORTED"  # the backend is absent here
    WAIVED = "WAIVED"  # failing, and listed with a reason in known_failures.json
    # (kdtr run --invariance) a request's outputs differ, bit for bit, between two batch
    # compositions (docs/harness.md "Invariance"); the reason names the request and both
    NOT_INVARIANT = "NOT_INVARIANT"

    __str__ = str.__str__  # "PASS", not "Status.PASS", in f-strings and reports
    __format__ = str.__format__

    @property
    def failing(self) -> bool:
        """Whether this status fails a run (exit 1)."""
        return self in FAILING


FAILING = frozenset({Status.MISMATCH, Status.CRASH, Status.TIMEOUT, Status.ERROR, Status.NOT_INVARIANT})
"""Statuses that make ``kdtr run`` exit 1."""

ERRORED = frozenset({Status.CRASH, Status.TIMEOUT, Status.ERROR})
"""Failures in which the binary or the harness went wrong (JUnit ``<error>``), as opposed
to a wrong output (MISMATCH, JUnit ``<failure>``)."""

SKIPPED = frozenset({Status.NOT_SUPPORTED, Status.WAIVED})
"""Statuses that tested nothing (JUnit ``<skipped>``)."""
