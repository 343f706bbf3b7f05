"""Run goldens through the test binaries and judge the outputs (docs/harness.md, docs/binaries.md).

A *case* is one golden on one backend, under at most one forced kernel
(``op/config@backend`` or ``op/config@backend:kernel``). The package is split by
responsibility:

- :mod:`kdtr.run.cases`: :class:`Case`, :class:`RunConfig`, :class:`GoldenStore`,
  selection, the kernel axis, planning and device placement, the binaries of the cases;
- :mod:`kdtr.run.process`: running the binaries (single or ``--batch``), streams,
  time-outs, sanitizers, reruns, verdicts (:func:`run_case`, :func:`run_all`);
- :mod:`kdtr.run.results`: :class:`CaseResult`, statuses, :func:`exit_code`;
- :mod:`kdtr.run.graph`: ``kdtr run --graph``: a graph case's padded input file and its
  verdict over both replays;
- :mod:`kdtr.run.lock`: :class:`ReportDirLock`.

Discovery of the goldens, the manifest check and the waivers are :mod:`kdtr.goldens`'s;
every verdict is :func:`kdtr.judge.judge`'s. :func:`run_case` never raises for a case's own
failure: every outcome becomes a status (:mod:`kdtr.run.results` lists them).
"""

from ..children import Terminated, install_signal_handlers
from ..goldens import KNOWN_FAILURES, UsageError, check_manifest, discover, load_known_failures, stale_waivers
from ..judge import output_limit
from ..status import FAILING, Status
from . import cases, graph, lock, process, results
from .cases import (
                    AUTO,
                    BACKENDS,
                    SANITIZER_EXIT,
                    SANITIZERS,
                    Case,
                    GoldenStore,
                    RunConfig,
                    binary_of,
                    default_bin_dir,
                    default_jobs,
                    literal_pattern,
                    missing_binaries,
                    missing_binaries_line,
                    missing_binary,
                    parse_devices,
                    parse_kernels,
                    plan,
                    plan_units,
                    rerun_line,
                    select,
                    select_cases,
                    shard,
                    visible_devices,
)
from .lock import REPORT_LOCK, ReportDirLock
from .process import (
                    _BATCH_LINE,
                    BATCH_TAG,
                    EXIT_INPUT,
                    EXIT_NOT_SUPPORTED,
                    EXIT_RUNTIME,
                    TAMPERED,
                    _sanitizer_errors,
                    run_all,
                    run_case,
)
from .results import STATUSES, CaseResult, exit_code

__all__ = [
    "AUTO", "BACKENDS", "BATCH_TAG", "EXIT_INPUT", "EXIT_NOT_SUPPORTED", "EXIT_RUNTIME", "FAILING", "KNOWN_FAILURES",
    "REPORT_LOCK", "SANITIZERS", "SANITIZER_EXIT", "STATUSES", "TAMPERED", "Case", "CaseResult", "GoldenStore",
    "ReportDirLock", "RunConfig", "Status", "Terminated", "UsageError", "binary_of", "cases", "check_manifest",
    "default_bin_dir", "default_jobs", "discover", "exit_code", "graph", "install_signal_handlers", "literal_pattern",
    "load_known_failures", "lock", "missing_binaries", "missing_binaries_line", "missing_binary", "output_limit",
    "parse_devices", "parse_kernels", "plan", "plan_units", "process", "rerun_line", "results", "run_all",
    "run_case", "select", "select_cases", "shard", "stale_waivers", "visible_devices",
]
# _BATCH_LINE and _sanitizer_errors: for the tests of the batch protocol and the sanitizer report
_PRIVATE_FOR_TESTS = (_BATCH_LINE, _sanitizer_errors)
