"""The result of a case: :class:`CaseResult`, its statuses in report order and the run's exit code.

Statuses (:class:`kdtr.status.Status`):

PASS           every expected output meets its contract
MISMATCH       an output is missing, has another dtype/shape, or breaks its contract
CRASH          the binary died by a signal or exited 1 (runtime failure)
TIMEOUT        the binary ran past the time limit (it is killed)
ERROR          harness or input problem: unreadable golden, missing binary, exit 2,
               unreadable output file, an output of another kernel than the forced one
NOT_SUPPORTED  the backend or forced kernel is absent here (binary exit 3: not built with
               CUDA, no GPU, a kernel that does not apply to the golden)
WAIVED         listed with a reason in golden/known_failures.json and not passing
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from ..compare import TensorResult
from ..status import FAILING, Status
from .cases import Case

STATUSES = tuple(Status)  # in report order


@dataclass
class CaseResult:
    case: Case
    status: Status
    reason: str = ""
    outputs: list[TensorResult] = field(default_factory=list)
    seconds: float = 0.0
    command: list[str] = field(default_factory=list)
    output_file: str = ""
    stderr: str = ""
    rerun: str = ""
    device: int | None = None  # the CUDA device that ran a cuda case; None for cpu
    process: str = ""  # "batch": judged from a batch run of its op; "single": its own process
    # Under a forced kernel: the kernel instance that ran (output metadata ``kernel``) and, for
    # tree_build's select, how many requests it handed to the heap build; "" otherwise.
    detail: str = ""
    # The golden it was judged against (kdtr.judge.Golden, the run's one read), kept on a
    # failing case for the report's drawing of it; never in conformance.json.
    golden: Any = field(default=None, repr=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.case.id,
            "op": self.case.op,
            "config": self.case.config,
            "backend": self.case.backend,
            "kernel": self.case.kernel,
            "mode": self.case.mode,
            "device": self.device,
            "process": self.process,
            "golden": str(self.case.golden),
            "status": self.status,
            "reason": self.reason,
            "detail": self.detail,
            "seconds": round(self.seconds, 4),
            "command": shlex.join(self.command) if self.command else "",
            "rerun": self.rerun,
            "output_file": self.output_file,
            "stderr": self.stderr,
            "outputs": [o.to_json() for o in self.outputs],
        }


def exit_code(results: list[CaseResult]) -> int:
    """0 if nothing failed (PASS, NOT_SUPPORTED, WAIVED only), else 1."""
    return 1 if any(r.status in FAILING for r in results) else 0
