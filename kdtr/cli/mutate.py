"""``kdtr mutate``: the command line of the mutation engine :mod:`kdtr.mutate` (options,
progress, the score table; docs/mutation.md).

Exit codes: 0 every catalogue mutant killed (or truly equivalent) and every generic
survivor triaged equivalent, 1 otherwise, 2 a usage error (one line on stderr), 128 + N
when signal N stopped the run (no report written).

``--backend cuda`` (docs/mutation.md, "GPU catalogue"): the mutants of mutants/gpu/, built
with nvcc and judged on the GPU (:mod:`kdtr.mutate.cuda`); exit 0 every one killed (by the
goldens or a sanitizer) or truly equivalent, 1 a survivor, a stillborn mutant, a wrong
equivalence claim or an undeclared IDENTICAL one, 2 a usage error (no nvcc; no CUDA device
without --build-only; the unmutated build failing a case or a sanitizer check).
``--build-only``: exit 1 on a STILLBORN or undeclared IDENTICAL mutant, else 0.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kdtr import children, fsutil, goldens, report
from kdtr import run as runner
from kdtr.text import printable, terminal_columns

# Piped output (CI logs) is not cut to 80 columns: $COLUMNS (if a width in [20, 1000]), else 160.
console = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else terminal_columns())


def fail_usage(msg: str) -> None:
    click.echo(f"kdtr: error: {printable(msg)}", err=True)
    sys.exit(2)


def _root_path(value: str | None, default: Path) -> Path:
    return Path(value) if value else default


@click.command()
@click.option("--only", "only", multiple=True, metavar="PATTERN",
              help="Run only the mutants whose id matches this glob (repeatable), e.g. 'tree_accept/*'.")
@click.option("--generic/--no-generic", default=False, show_default=True,
              help="Also run the generic operator pass (universalmutator; pip install -e '.[mutate]').")
@click.option("--sample", type=click.IntRange(0), default=100, show_default=True,
              help="Generic pass: a fixed random sample of this many mutants per op (0: every one).")
@click.option("--seed", type=int, default=0, show_default=True, help="Generic pass: the sample's seed.")
@click.option("--catalogue/--no-catalogue", default=True, show_default=True, help="Run the mutant catalogue.")
@click.option("-j", "--jobs", type=click.IntRange(1, 256), default=lambda: os.cpu_count() or 1,
              show_default="cores", help="Mutants built and run at once.")
@click.option("--cxxflags", default=None, help="CXXFLAGS of the mutant builds. Default: the Makefile's (-O2).")
@click.option("--cache/--no-cache", default=True, show_default=True,
              help="Take verdicts from (and store them in) build/mutate-cache: a mutant whose sources, goldens "
                   "and judging code are unchanged is not built or run again.")
@click.option("--catalogue-dir", type=click.Path(file_okay=False),
              help="The catalogue (<op>.toml files) and generic_triage.toml. Default: <repo>/mutants.")
@click.option("--golden-dir", type=click.Path(file_okay=False), help="Default: <repo>/golden.")
@click.option("--report-dir", type=click.Path(file_okay=False), help="Default: <repo>/reports.")
@click.option("--backend", type=click.Choice(("cpu", "cuda")), default="cpu", show_default=True,
              help="cpu: the CPU cores' catalogue (mutants/<op>.toml). cuda: the GPU catalogue "
                   "(mutants/gpu/<kernel>.toml), built with nvcc and run on the GPU.")
@click.option("--build-only", is_flag=True, default=False,
              help="--backend cuda: only build every selected mutant (STILLBORN / IDENTICAL / BUILT); needs nvcc, "
                   "no GPU.")
@click.option("--sanitizer-tools", default=None, metavar="TOOLS",
              help="--backend cuda: the compute-sanitizer tools that sweep the goldens' survivors, in order "
                   "(comma-separated; none: no sweep). Default: memcheck,racecheck,synccheck.")
@click.option("--time-budget", type=click.FloatRange(min=1.0), default=None, metavar="SECONDS",
              help="--backend cuda: that long after the start, kill every build and binary still running and "
                   "report each mutant not judged by then as NOT_RUN (the report is written; exit 1).")
def mutate(only, generic, sample, seed, catalogue, jobs, cxxflags, cache, catalogue_dir, golden_dir,
           report_dir, backend, build_only, sanitizer_tools, time_budget) -> None:
    """Plant each catalogued bug alone in a scratch copy of the CPU cores, rebuild, run the
    committed goldens; write reports/mutation.md and .json (docs/mutation.md).

    Exit 1 if a catalogue mutant survives (or does not compile, or is wrongly declared
    equivalent), or a generic survivor is not triaged as equivalent.

    --backend cuda: the same with the GPU catalogue, the CUDA build and the GPU, survivors
    swept by compute-sanitizer (docs/mutation.md, "GPU catalogue")."""
    import kdtr.generators  # the configuration registry (kdtr.generators.REGISTRY)
    from kdtr import mutate as mut

    root = goldens.repo_root()
    gdir = _root_path(golden_dir, root / "golden")
    rdir = _root_path(report_dir, root / "reports")
    if backend == "cuda":
        _mutate_cuda(root, gdir, rdir, only, generic, catalogue, jobs, cxxflags, catalogue_dir, build_only,
                     sanitizer_tools, time_budget)
        return
    for name, given in (("--build-only", build_only), ("--sanitizer-tools", sanitizer_tools is not None),
                        ("--time-budget", time_budget is not None)):
        if given:
            fail_usage(f"{name} is an option of --backend cuda")
            return
    generic_note = ""
    children.install_signal_handlers()  # from here SIGTERM / SIGHUP raise children.Terminated
    try:
        try:
            cdir = _root_path(catalogue_dir, root / mut.CATALOGUE_DIR)
            mutants = mut.load_catalogue(root, cdir) if catalogue else []
            triage = mut.load_triage(root, cdir)
            if generic:
                everything = mut.generic_mutants(root)
                picked = mut.sample(everything, sample, seed)
                generic_note = (f"{len(picked)} of {len(everything)} universalmutator mutants "
                                f"({'all' if not sample else f'sample of {sample} per op, seed {seed}'})")
                mutants += picked
        except (mut.CatalogueError, FileNotFoundError, subprocess.CalledProcessError) as exc:
            fail_usage(printable(str(exc)))
            return
        mutants = mut.select(mutants, only)
        if not mutants:
            fail_usage("no mutant selected (check --only and --catalogue/--generic)")
            return
        t0 = time.monotonic()
        verdicts = mut.VerdictCache(root / mut.CACHE_DIR) if cache else None
        with tempfile.TemporaryDirectory(prefix="kdtr-mutate-") as tmp:
            try:
                ws = mut.Workspace(root, Path(tmp), cxxflags, on_build=lambda base: console.print(
                    f"kdtr mutate: building the unmutated CPU binaries (kept in {printable(str(base))})",
                    markup=False))
                plan = mut.load_goldens(gdir, registry=kdtr.generators.REGISTRY)
            except (RuntimeError, runner.UsageError) as exc:
                fail_usage(printable(str(exc)))
                return
            except OSError as exc:  # make not found, an unreadable source or cache file
                fail_usage(printable(f"{exc.filename or 'the unmutated build'}: {exc.strerror or exc}"))
                return
            with Progress(TextColumn("[bold]kdtr mutate"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                          TextColumn("{task.description}"), console=console, transient=True) as progress:
                task = progress.add_task("", total=len(mutants))

                def done(r: mut.MutantResult) -> None:
                    if r.outcome in (mut.SURVIVED, mut.STILLBORN, mut.BAD_CLAIM) and r.mutant.kind == "catalogue":
                        progress.console.print(f"[bold red]{r.outcome}[/] {escape(r.mutant.id)} "
                                               f"{escape(printable(r.detail[:160]))}")
                    progress.update(task, advance=1, description=escape(r.mutant.id))

                generic_ids = {m.id for m in mutants if m.kind == "generic"}
                try:
                    results = mut.run([m for m in mutants if m.id not in generic_ids], ws, plan, jobs, done,
                                      cache=verdicts)
                    results += mut.run([m for m in mutants if m.id in generic_ids], ws, plan, jobs, done,
                                       own_op_only=True, cache=verdicts)
                except runner.UsageError as exc:  # a golden failing on the unmutated build
                    progress.stop()
                    fail_usage(printable(str(exc)))
                    return
    except (children.Terminated, KeyboardInterrupt) as exc:
        _stopped(exc)
    env = _environment(root, t0)
    env["cxxflags"] = cxxflags if cxxflags is not None else "Makefile default"
    if generic_note:
        env["generic pass"] = generic_note
    from_cache = sum(r.cached for r in results)
    env["verdict cache"] = (f"{from_cache} of {len(results)} verdicts from {root / mut.CACHE_DIR}" if verdicts
                            else "not used (--no-cache)")
    try:
        paths = mut.write_reports(rdir, results, triage, env)
    except OSError as exc:  # kdtr.fsutil.UnsafePath names the path in str()
        fail_usage(str(exc) if isinstance(exc, fsutil.UnsafePath)
                   else f"report directory {rdir}: cannot write the reports ({exc.strerror or exc})")
        return
    table = Table(title="kdtr mutation score")
    for col in ("pass", "op", "mutants", "killed", "survived", "equivalent", "identical", "stillborn", "score"):
        table.add_column(col, no_wrap=True)
    for kind in ("catalogue", "generic"):
        for op, s in mut.score([r for r in results if r.mutant.kind == kind]).items():
            table.add_row(kind, op, str(s["mutants"]), str(s[mut.KILLED] + s[mut.BAD_CLAIM]), str(s[mut.SURVIVED]),
                          str(s[mut.EQUIVALENT]), str(s[mut.IDENTICAL]), str(s[mut.STILLBORN]),
                          "n/a" if s["score"] is None else f"{100 * s['score']:.1f}%")
    console.print(table)
    bad = mut.failing(results, triage)
    for r in bad:
        console.print(printable(f"{r.outcome} {r.mutant.id} ({r.mutant.file}:{r.mutant.line}): {r.detail[:200]}"),
                      markup=False)
    if verdicts:
        console.print(f"verdict cache: {from_cache} of {len(results)} verdicts from {root / mut.CACHE_DIR}",
                      markup=False)
    console.print("reports: " + ", ".join(printable(str(p)) for p in paths), markup=False)
    sys.exit(1 if bad else 0)


def _mutate_cuda(root: Path, gdir: Path, rdir: Path, only, generic: bool, catalogue: bool, jobs: int,
                 cxxflags: str | None, catalogue_dir: str | None, build_only: bool,
                 sanitizer_tools: str | None, time_budget: float | None) -> None:
    """``kdtr mutate --backend cuda`` (docs/mutation.md, "GPU catalogue"); exits."""
    t0 = time.monotonic()  # --time-budget counts from here, the unmutated build included
    import kdtr.generators  # the configuration registry (kdtr.generators.REGISTRY)
    from kdtr import mutate as mut
    from kdtr.cli.main import gpu_description
    from kdtr.mutate import cuda

    if generic:
        fail_usage("--generic mutates the CPU cores: it is not an option of --backend cuda")
        return
    if not catalogue:
        fail_usage("--backend cuda runs the GPU catalogue: --no-catalogue leaves nothing to run")
        return
    if cxxflags is not None:
        fail_usage("--cxxflags sets the CPU build's flags: it is not an option of --backend cuda")
        return
    children.install_signal_handlers()  # from here SIGTERM / SIGHUP raise children.Terminated
    try:
        try:
            tools = cuda.parse_tools(sanitizer_tools if sanitizer_tools is not None
                                     else ",".join(cuda.DEFAULT_SANITIZER_TOOLS))
        except runner.UsageError as exc:
            fail_usage(str(exc))
            return
        try:
            cdir = _root_path(catalogue_dir, root / mut.GPU_CATALOGUE_DIR)
            mutants = mut.load_gpu_catalogue(root, cdir)
        except mut.CatalogueError as exc:
            fail_usage(printable(str(exc)))
            return
        mutants = mut.select(mutants, only)
        if not mutants:
            fail_usage("no mutant selected (check --only)")
            return
        from kdtr.mutate.workspace import nvcc_path

        nvcc = nvcc_path()
        if nvcc is None:
            fail_usage("kdtr mutate --backend cuda needs nvcc (not found on PATH, or $NVCC): the GPU mutants are "
                       "built with the CUDA toolkit")
            return
        devices: tuple[int, ...] = ()
        san_bin = ""
        if not build_only:
            devices = cuda.cuda_devices()
            if not devices:
                fail_usage("kdtr mutate --backend cuda needs a CUDA device (nvidia-smi lists none here); "
                           "--build-only builds the mutants without one")
                return
            if tools:
                san_bin = cuda.sanitizer_path() or ""
                if not san_bin:
                    fail_usage("compute-sanitizer not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin): the survivor "
                               "sweep needs it (--sanitizer-tools none skips the sweep)")
                    return
        with tempfile.TemporaryDirectory(prefix="kdtr-mutate-") as tmp:
            try:
                ws = mut.CudaWorkspace(root, Path(tmp), jobs=jobs, on_build=lambda base: console.print(
                    f"kdtr mutate: building the unmutated CUDA binaries (kept in {printable(str(base))})",
                    markup=False))
                if build_only:
                    plan = cuda.CudaPlan({}, gdir)
                else:
                    plan = cuda.load_goldens(gdir, registry=kdtr.generators.REGISTRY)
                    plan.sanitizer_tools, plan.sanitizer_bin, plan.devices = tools, san_bin, devices
            except (RuntimeError, runner.UsageError) as exc:
                fail_usage(printable(str(exc)))
                return
            except OSError as exc:  # make not found, an unreadable source or cache file
                fail_usage(printable(f"{exc.filename or 'the unmutated build'}: {exc.strerror or exc}"))
                return
            if not ws.wgmma:
                console.print("kdtr mutate: the CUDA build has no Hopper kernel (no CUTLASS headers: run `make build` "
                              "first, or set CUTLASS_INCLUDE); mutants of its file are STILLBORN", markup=False)
            with Progress(TextColumn("[bold]kdtr mutate"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                          TextColumn("{task.description}"), console=console, transient=True) as progress:
                task = progress.add_task("", total=len(mutants))

                def done(r: mut.MutantResult) -> None:
                    if r.outcome in (mut.SURVIVED, mut.STILLBORN, mut.BAD_CLAIM) or (
                            r.outcome == mut.IDENTICAL and not r.mutant.equivalent):
                        progress.console.print(f"[bold red]{r.outcome}[/] {escape(r.mutant.id)} "
                                               f"{escape(printable(r.detail[:160]))}")
                    progress.update(task, advance=1, description=escape(r.mutant.id))

                try:
                    results = cuda.run(mutants, ws, plan, jobs, done, build_only=build_only,
                                       deadline=None if time_budget is None else t0 + time_budget)
                except runner.UsageError as exc:  # the unmutated build fails a case or a sanitizer check
                    progress.stop()
                    fail_usage(printable(str(exc)))
                    return
    except (children.Terminated, KeyboardInterrupt) as exc:
        _stopped(exc)
    env = _environment(root, t0)
    env["backend"] = "cuda" + (" (--build-only: nothing run)" if build_only else "")
    env["nvcc"] = f"{nvcc}: " + (_first_line([nvcc, "--version"], last=True) or "?")
    env["cuda build"] = (f"CUDA_ARCH={mut.workspace.CUDA_ARCH}, Hopper kernel "
                         f"{'built' if ws.wgmma else 'absent (no CUTLASS headers)'}")
    if not build_only:
        env["gpu"] = gpu_description() or "?"
        env["devices"] = ", ".join(map(str, plan.devices))
        kept = sum(len(v) for v in plan.kept.values())
        env["calibration"] = (f"{kept} cases kept (PASS twice, byte-identical), {len(plan.dropped)} NOT_SUPPORTED "
                              "dropped, on the unmutated build")
        env["sanitizer sweep"] = (", ".join(tools) + f" ({san_bin}: {_first_line([san_bin, '--version'], last=True)})"
                                  if tools else "none (--sanitizer-tools none)")
    if time_budget is not None:
        not_run = sum(r.outcome == mut.NOT_RUN for r in results)
        env["time budget"] = f"{time_budget:g} s" + (f": ran out, {not_run} mutants NOT_RUN" if not_run else "")
    env["verdict cache"] = "not used for the cuda backend"
    try:
        paths = mut.write_reports(rdir, results, {}, env)
    except OSError as exc:  # kdtr.fsutil.UnsafePath names the path in str()
        fail_usage(str(exc) if isinstance(exc, fsutil.UnsafePath)
                   else f"report directory {rdir}: cannot write the reports ({exc.strerror or exc})")
        return
    cols = ("killed", "by sanitizer", "survived", "equivalent", "identical", "stillborn", "bad claim")
    outcomes = (mut.KILLED, mut.KILLED_BY_SANITIZER, mut.SURVIVED, mut.EQUIVALENT, mut.IDENTICAL, mut.STILLBORN,
                mut.BAD_CLAIM)
    if build_only:
        cols, outcomes = ("built", "identical", "stillborn"), (mut.BUILT, mut.IDENTICAL, mut.STILLBORN)
    if any(r.outcome == mut.NOT_RUN for r in results):
        cols, outcomes = (*cols, "not run"), (*outcomes, mut.NOT_RUN)
    table = Table(title="kdtr GPU mutation score" + (" (--build-only)" if build_only else ""))
    for col in ("by", "name", "mutants", *cols, *(() if build_only else ("score",))):
        table.add_column(col, no_wrap=True)
    for by, scores in (("op", mut.score(results)), ("kernel", mut.kernel_score(results))):
        for name, s in scores.items():
            row = [by, name, str(s["mutants"]), *(str(s[o]) for o in outcomes)]
            if not build_only:
                row.append("n/a" if s["score"] is None else f"{100 * s['score']:.1f}%")
            table.add_row(*row)
    console.print(table)
    bad = mut.failing(results, {})
    for r in bad:
        if r.outcome != mut.NOT_RUN:
            console.print(printable(f"{r.outcome} {r.mutant.id} ({r.mutant.file}:{r.mutant.line}): "
                                    f"{r.detail[:200]}"), markup=False)
    not_run = sum(r.outcome == mut.NOT_RUN for r in results)
    if not_run:
        console.print(f"NOT_RUN: {not_run} of {len(results)} mutants (--time-budget {time_budget:g} s spent)",
                      markup=False)
    console.print("reports: " + ", ".join(printable(str(p)) for p in paths), markup=False)
    sys.exit(1 if bad else 0)


def _first_line(cmd: list[str], last: bool = False) -> str:
    """The first (``last``: last) non-empty line a tool prints, or "" if it cannot run."""
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    lines = [ln.strip() for ln in r.stdout.splitlines() if ln.strip()]
    return (lines[-1] if last else lines[0]) if lines else ""


def _stopped(exc: BaseException) -> None:
    """Ctrl-C / SIGTERM / SIGHUP: kill every build, compiler and test binary still running
    (each in its own process group), say so on stderr, exit 128 + the signal number."""
    children.stop_all()
    click.echo(f"kdtr: {signal.Signals(children.signal_number(exc)).name}: mutation run stopped, its builds "
               "and binaries killed; no report written", err=True)
    sys.exit(128 + children.signal_number(exc))


def _environment(root, t0: float) -> dict:
    """The report's environment: machine, commit, the command line, the run's seconds."""
    env = report.environment()
    env["commit"] = report.git_commit(root)
    env["command"] = "kdtr mutate " + " ".join(shlex.quote(a) for a in sys.argv[2:])
    env["seconds"] = round(time.monotonic() - t0, 1)
    return env
