"""Mutation testing of the CPU cores against the committed goldens (docs/mutation.md).

A *mutant* is one small edit of a C++ core file under ``cuda_tests/`` (the ops' CPU cores,
which the CUDA kernels share): a planted bug. :func:`run` applies each mutant alone to a
scratch copy of ``Makefile`` + ``cuda_tests/``, rebuilds the CPU-only binaries that depend
on the edited file (make's own dependency files decide which), runs the committed goldens
of those binaries' ops on the cpu backend and records which goldens fail. Outcomes:

KILLED      some golden failed (MISMATCH, CRASH, TIMEOUT or ERROR) on a rebuilt binary
SURVIVED    every golden passed: the goldens cannot tell the bug from the right code
EQUIVALENT  declared equivalent in the catalogue (with the reason no input can tell),
            and indeed not killed
IDENTICAL   the rebuilt binaries are byte-identical to the unmutated ones, so no input
            can tell (trivial compiler equivalence: Papadakis et al., ICSE 2015)
STILLBORN   the mutant does not compile
BAD_CLAIM   declared equivalent, yet a golden killed it: the claim is wrong

Two sources of mutants:

* the *catalogue*, ``mutants/<op>.toml``: hand-written realistic bugs, each with its op,
  bug class and origin (the public report or reasoning behind it); see
  :func:`load_catalogue` for the schema;
* the *generic pass*: every mutant the ``universalmutator`` package's C++ operator rules
  (Groce et al., "An extensible, regular-expression-based tool for multi-language mutant
  generation", ICSE 2018) make of the code lines of the cores listed in
  :data:`GENERIC_FILES`.  Its survivors are triaged in ``mutants/generic_triage.toml``.

The edits are applied to a scratch copy only; the checkout is never modified.

GPU mutants (``kdtr mutate --backend cuda``): the catalogue ``mutants/gpu/<kernel>.toml``
(:func:`load_gpu_catalogue`), planted in a copy of the unmutated CUDA build
(:class:`CudaWorkspace`) and judged on the cuda backend, survivors swept by
compute-sanitizer (:mod:`kdtr.mutate.cuda`; outcome KILLED_BY_SANITIZER).

Layout: :mod:`kdtr.mutate.catalogue` (the mutants, the generic pass, the triage),
:mod:`kdtr.mutate.workspace` (the cached unmutated build and the per-mutant copies),
:mod:`kdtr.mutate.execute` (running mutants), :mod:`kdtr.mutate.cache` (the verdict
cache) and :mod:`kdtr.mutate.report` (score and reports); ``kdtr mutate``
(:mod:`kdtr.cli.mutate`) is the command line over them.  Every public name is
re-exported here.
"""

from kdtr.mutate import cuda as cuda  # kdtr mutate --backend cuda: cuda.load_goldens, cuda.run, ...
from kdtr.mutate.cache import CACHE_DIR, VerdictCache
from kdtr.mutate.catalogue import (
    BAD_CLAIM,
    BUILT,
    CATALOGUE_DIR,
    EQUIVALENT,
    GENERIC_FILES,
    GPU_CATALOGUE_DIR,
    GPU_OUTCOMES,
    IDENTICAL,
    KILLED,
    KILLED_BY_SANITIZER,
    NOT_RUN,
    OPS,
    OUTCOMES,
    STILLBORN,
    SURVIVED,
    TRIAGE_FILE,
    CatalogueError,
    Mutant,
    Triage,
    code_lines,
    generic_mutants,
    load_catalogue,
    load_gpu_catalogue,
    load_triage,
    mutate_tool,
    sample,
    select,
)
from kdtr.mutate.execute import MutantResult, Plan, calibrate, load_goldens, mutant_ops, prepare, run, run_mutant
from kdtr.mutate.execute import _run_cases as _run_cases  # tests judge cases as a mutant run does
from kdtr.mutate.report import MUTATION_REPORTS, failing, kernel_score, markdown, score, to_json, write_reports
from kdtr.mutate.workspace import CudaWorkspace, Workspace, stop_builds

__all__ = [
    "BAD_CLAIM", "BUILT", "CACHE_DIR", "CATALOGUE_DIR", "EQUIVALENT", "GENERIC_FILES", "GPU_CATALOGUE_DIR",
    "GPU_OUTCOMES", "IDENTICAL", "KILLED", "KILLED_BY_SANITIZER", "MUTATION_REPORTS", "NOT_RUN", "OPS", "OUTCOMES",
    "STILLBORN", "SURVIVED", "TRIAGE_FILE", "CatalogueError", "CudaWorkspace", "Mutant", "MutantResult", "Plan",
    "Triage", "VerdictCache", "Workspace", "calibrate", "code_lines", "cuda", "failing", "generic_mutants",
    "kernel_score", "load_catalogue", "load_goldens", "load_gpu_catalogue", "load_triage", "markdown", "mutant_ops",
    "mutate_tool", "prepare", "run", "run_mutant", "sample", "score", "select", "stop_builds", "to_json",
    "write_reports",
]
