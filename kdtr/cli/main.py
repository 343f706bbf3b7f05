"""The ``kdtr`` command line: run, regen, inspect, diff, list, mutate.

Only options and rendering live here; the work is in :mod:`kdtr.run`,
:mod:`kdtr.goldens`, :mod:`kdtr.compare` and :mod:`kdtr.report`.

Exit codes: 0 all pass (or no drift / no difference), 1 a mismatch, crash, timeout,
case error or drift, 2 usage or harness error (one line on stderr).
"""

from __future__ import annotations

import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import click
import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

import kdtr.generators  # the configuration registry (kdtr.generators.REGISTRY): the core of kdtr/ never imports it
from kdtr import children, fsutil, goldens, judge, report
from kdtr import format as kformat
from kdtr import run as runner
from kdtr.cli.convert_cmd import convert as convert_command  # kdtr convert
from kdtr.cli.mutate import mutate as mutate_command  # kdtr mutate (its engine, kdtr.mutate, is imported when it runs)
from kdtr.cli.show import show as show_command  # kdtr show; importing it also hooks the report's tree SVGs
from kdtr.compare import compare
from kdtr.contract import Contract, stray_contract_keys
from kdtr.dtypes import name_of_dtype
from kdtr.errors import KdtrError
from kdtr.status import Status
from kdtr.text import printable, terminal_columns

# Piped output (CI logs) is not cut to 80 columns: $COLUMNS (if a width in [20, 1000]), else 160.
console = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else terminal_columns())

STATUS_STYLE = {
    Status.PASS: "green",
    Status.MISMATCH: "bold red",
    Status.CRASH: "bold red",
    Status.TIMEOUT: "bold red",
    Status.ERROR: "bold magenta",
    Status.NOT_SUPPORTED: "dim",
    Status.WAIVED: "yellow",
    Status.NOT_INVARIANT: "bold red",
}


def fail_usage(msg: str) -> None:
    click.echo(f"kdtr: error: {printable(msg)}", err=True)
    sys.exit(2)


def _root_path(value: str | None, default: Path) -> Path:
    return Path(value) if value else default


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kdtr")
def main() -> None:
    """kdtr: golden-file conformance for DDTree kernels (tree_build, verify_attn, tree_accept, greedy_step)."""


def gpu_description() -> str:
    if not shutil.which("nvidia-smi"):
        return ""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    lines = [ln.strip() for ln in out.stdout.splitlines() if ln.strip()]
    return "; ".join(f"{ln.split(',')[0].strip()} (driver {ln.split(',')[1].strip()})" for ln in lines if "," in ln)


MAX_TIMEOUT = 7 * 24 * 3600.0


def _timeout(ctx: click.Context, param: click.Parameter, value: float) -> float:
    if not (math.isfinite(value) and 0.1 <= value <= MAX_TIMEOUT):
        raise click.BadParameter(f"{value!r} is not a number of seconds in [0.1, {MAX_TIMEOUT:g}]")
    return value


@main.command()
@click.option("--only", "only", multiple=True, metavar="PATTERN",
              help="op, op/config glob or case id op/config@backend (repeatable), e.g. tree_accept, "
                   "'tree_accept/ch*', tree_accept/chain@cuda; a #graph or #invariance suffix selects that mode's "
                   "cases (tree_accept/chain@cpu#graph, '*#graph').")
@click.option("--backend", "backends", multiple=True, type=click.Choice(runner.BACKENDS),
              help="Backend to run (repeatable); default: all.")
@click.option("--kernel", "kernel_specs", multiple=True, metavar="OP=K[,K...]",
              help="Force kernels on the cuda cases of OP, one case per kernel (op/config@cuda:K), e.g. "
                   "verify_attn=wgmma,mma or tree_build=all; 'auto' adds the unforced case (repeatable).")
@click.option("--require-backend", "required", multiple=True, type=click.Choice(runner.BACKENDS),
              help="Fail (exit 1) if any case of this backend is NOT_SUPPORTED, e.g. on a GPU runner whose "
                   "driver went missing (repeatable).")
@click.option("-j", "--jobs", type=click.IntRange(1, 256), default=runner.default_jobs, show_default="cores, max 8",
              help="Binary processes run at once (a batch of an op's goldens, or one golden).")
@click.option("--shard", metavar="I/N", help="Run only shard I of N (1-based), dealt out golden by golden.")
@click.option("--tier", type=click.Choice(["committed", "all"]), default="committed", show_default=True,
              help="'all' adds the second-tier goldens, generated on demand into golden/.cache.")
@click.option("--timeout", type=float, default=60.0, show_default=True, callback=_timeout, help="Seconds per case.")
@click.option("--device", "device_spec", default="0", show_default=True, metavar="N|N,M,...|all",
              help="CUDA device(s): the cuda cases are spread over them, one process per op and device.")
@click.option("--batch/--no-batch", default=True, show_default=True,
              help="One binary process per op, backend and device for all its goldens; --no-batch starts "
                   "one process per golden.")
@click.option("--sanitizer", type=click.Choice(runner.SANITIZERS),
              help="Run every cuda case under compute-sanitizer with this tool; its errors make the case a CRASH.")
@click.option("--graph", is_flag=True,
              help="Also run each case captured in a CUDA graph at a padded batch, replayed twice (case suffix "
                   "#graph; docs/harness.md \"Graph replay\").")
@click.option("--invariance", is_flag=True,
              help="Also re-run each golden's requests in other batch compositions and require bit-identical "
                   "outputs per request (case suffix #invariance, status NOT_INVARIANT; docs/harness.md "
                   "\"Invariance\").")
@click.option("--golden-dir", type=click.Path(file_okay=False), help="Default: <repo>/golden.")
@click.option("--bin-dir", type=click.Path(file_okay=False), help="Default: <repo>/build/bin.")
@click.option("--report-dir", type=click.Path(file_okay=False), help="Default: <repo>/reports.")
def run(only, backends, kernel_specs, required, jobs, shard, tier, timeout, device_spec, batch, sanitizer, graph,
        invariance, golden_dir, bin_dir, report_dir) -> None:
    """Run every golden on every backend, diff, and write the reports."""
    root = goldens.repo_root()
    gdir = _root_path(golden_dir, root / "golden")
    rdir = _root_path(report_dir, root / "reports")
    backends = backends or runner.BACKENDS
    # What a printed rerun line must repeat to run the same case the same way.
    rerun_args: list[str] = []
    for opt, value, default in (("--golden-dir", golden_dir, None), ("--bin-dir", bin_dir, None),
                                ("--report-dir", report_dir, None), ("--timeout", timeout, 60.0),
                                ("--sanitizer", sanitizer, None), ("--tier", tier, "committed")):
        if value is not None and value != default:
            rerun_args += [opt, str(Path(value).resolve()) if opt.endswith("-dir") else f"{value:g}" if
                           isinstance(value, float) else str(value)]
    lock = runner.ReportDirLock(rdir)
    rset = report.report_set(rdir)  # reports and obtained outputs, published as one unit
    try:
        devices = runner.parse_devices(device_spec)
        kernels = runner.parse_kernels(kernel_specs)
        if kernels and "cuda" not in backends:
            raise runner.UsageError("--kernel forces kernels of the cuda cases: add --backend cuda")
        if sanitizer and "cuda" not in backends:
            raise runner.UsageError("--sanitizer wraps the cuda cases: add --backend cuda")
        if sanitizer and not shutil.which("compute-sanitizer"):
            raise runner.UsageError("--sanitizer: compute-sanitizer not found on PATH (it comes with the CUDA toolkit)")
        for b in required:
            if b not in backends:
                raise runner.UsageError(f"--require-backend {b}: not among the chosen backends ({', '.join(backends)})")
        found = runner.discover(gdir, second_tier=tier == "all", registry=kdtr.generators.REGISTRY)
        vouched: dict = {}  # the sha256 of each golden, as MANIFEST.json gives it now: what is judged
        found, problems = runner.check_manifest(gdir, found, vouched)
        chosen = runner.select(found, only, known_ops=set(kdtr.generators.REGISTRY.ops()) | {g[0] for g in found})
        modes = [m for m, on in (("graph", graph), ("invariance", invariance)) if on]
        cases = runner.select_cases(runner.plan(chosen, backends, kernels, modes), only)
        cases = runner.shard(cases, shard)
        if not cases:
            raise runner.UsageError(f"--shard {shard}: this shard selects no case "
                                    "(there are fewer goldens than shards)")
        cfg = runner.RunConfig(
            golden_dir=gdir,
            bin_dir=_root_path(bin_dir, root / "build" / "bin"),
            out_dir=rdir / report.OBTAINED,  # replaced by the run's own directory below
            timeout=timeout,
            device=devices[0],
            devices=devices,
            batch=batch,
            sanitizer=sanitizer or "",
            known_failures=runner.load_known_failures(gdir),
            golden_problems=problems,
            vouched=vouched,
            rerun_args=rerun_args,
        )
        lock.__enter__()  # before any case runs: an unwritable or busy report directory stops here
        try:
            cfg.out_dir = rset.begin() / report.OBTAINED
        except fsutil.UnsafePath as exc:
            raise runner.UsageError(str(exc)) from None
        except OSError as exc:
            raise runner.UsageError(f"report directory {rdir}: not writable ({exc.strerror or exc})") from None
    except runner.UsageError as exc:
        fail_usage(str(exc))
        return

    for key in runner.stale_waivers(cfg.known_failures, found):
        click.echo(f"kdtr: warning: {runner.KNOWN_FAILURES}: {printable(repr(key))} names no golden or backend",
                   err=True)
    # the binaries the bin dir lacks: one line for all after the details, not one per case
    missing = runner.missing_binaries([c for c in cases if c.golden not in problems], cfg.bin_dir)
    runner.install_signal_handlers()
    try:
        with Progress(
            TextColumn("[bold]kdtr run"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("{task.description}"), console=console, transient=True,
        ) as progress:
            task = progress.add_task("", total=len(cases))

            def done(r: runner.CaseResult) -> None:
                if r.status in runner.FAILING and not _lacks_binary(r, missing, cfg.bin_dir):
                    progress.console.print(f"[{STATUS_STYLE[r.status]}]{r.status}[/] {escape(printable(r.case.id))}")
                progress.update(task, advance=1, description=escape(printable(r.case.id)))

            results = runner.run_all(cases, cfg, jobs, on_done=done)
    except runner.Terminated as exc:
        _discard(rset)
        click.echo(f"kdtr: {exc.args[0]}: run stopped, its binaries killed; no report written", err=True)
        sys.exit(128 + exc.signum)
    except BaseException:
        _discard(rset)
        raise

    console.print(results_table(results))
    for r in results:
        if r.case.kernel and r.detail:  # which instance a forced kernel ran
            console.print(f"{printable(r.case.id)}: {printable(r.detail)}", style="dim", markup=False)
    skipped = sorted({(r.case.backend, r.reason) for r in results if r.status == Status.NOT_SUPPORTED})
    for backend, reason in skipped:
        console.print(f"{backend}: NOT_SUPPORTED: {printable(reason)}", style="dim", markup=False)
    for r in report.shown(results, rset):  # obtained outputs named as published: reports/obtained/...
        if (r.status in runner.FAILING or r.status == Status.WAIVED) and not _lacks_binary(r, missing, cfg.bin_dir):
            console.print("\n".join(report.mismatch_lines(r)), markup=False)
    if missing:
        click.echo(f"kdtr: error: {printable(runner.missing_binaries_line(missing, cfg.bin_dir))}", err=True)
    env = report.environment()
    env["gpu"] = gpu_description()
    env["commit"] = report.git_commit(root)
    env["run_id"] = f"{env['date']} pid {os.getpid()}"
    env["selection"] = " ".join(shlex.quote(a) for a in _selection_args(only, backends, shard, tier, required,
                                                                        kernel_specs, modes))
    env["bin_dir"] = str(cfg.bin_dir.resolve())
    try:
        paths = report.write_all(rdir, results, env, rset)
    except fsutil.UnsafePath as exc:
        fail_usage(f"{exc}; the reports of this run were not published")
        return
    except OSError as exc:
        fail_usage(f"report directory {rdir}: cannot write the reports ({exc.strerror or exc})")
        return
    finally:
        lock.__exit__(None, None, None)
    c = report.counts(results)
    console.print("  ".join(f"[{STATUS_STYLE[s]}]{s}[/] {n}" for s, n in c.items() if n))
    console.print("reports: " + ", ".join(printable(p) for p in paths), markup=False)
    code = runner.exit_code(results)
    missing = sorted({r.case.backend for r in results
                      if r.status == Status.NOT_SUPPORTED and r.case.backend in required})
    for b in missing:
        click.echo(f"kdtr: error: --require-backend {b}: its cases are NOT_SUPPORTED here (see above)", err=True)
        code = max(code, 1)
    if not missing and all(r.status == Status.NOT_SUPPORTED for r in results):
        click.echo("kdtr: warning: every case is NOT_SUPPORTED: nothing was tested "
                   "(--require-backend makes that a failure)", err=True)
    sys.exit(code)


def _lacks_binary(r: runner.CaseResult, missing: dict[str, int], bin_dir: Path) -> bool:
    """An ERROR because the bin dir has no binary for its op (said in one line for all)."""
    return (r.case.op in missing and r.status == Status.ERROR
            and r.reason == runner.missing_binary(bin_dir, r.case.op))


def _discard(rset: fsutil.ReportSet) -> None:
    """Remove an interrupted run's unpublished report directory (the last set stays)."""
    try:
        rset.discard()
    except OSError:
        pass


def _selection_args(only, backends, shard, tier, required, kernel_specs=(), modes=()) -> list[str]:
    args = [a for pat in only for a in ("--only", pat)] + [a for b in backends for a in ("--backend", b)]
    args += [a for k in kernel_specs for a in ("--kernel", k)]
    args += [f"--{m}" for m in modes]
    args += ["--shard", shard] if shard else []
    args += ["--tier", tier] if tier != "committed" else []
    return args + [a for b in required for a in ("--require-backend", b)]


def results_table(results: list[runner.CaseResult]) -> Table:
    """One row per golden, one status column per backend (and backend:kernel for each forced
    kernel), then the slowest time."""
    columns = {r.case.column: r.case.backend for r in results}
    backends = sorted(columns, key=lambda c: (runner.BACKENDS.index(columns[c]), c != columns[c], c))
    table = Table(title="kdtr conformance")
    for col in ("op", "config", *backends):
        table.add_column(col, no_wrap=True)
    table.add_column("time", justify="right", no_wrap=True)
    rows: dict[tuple[str, str], dict[str, runner.CaseResult]] = {}
    for r in results:
        rows.setdefault((r.case.op, r.case.config), {})[r.case.column] = r
    for (op, config), row in rows.items():
        cells = [f"[{STATUS_STYLE[row[b].status]}]{row[b].status}[/]" if b in row else "" for b in backends]
        slowest = max(r.seconds for r in row.values())
        table.add_row(escape(printable(op)), escape(printable(config)), *cells, f"{slowest:.2f}s")
    return table


@main.command()
@click.option("--check", is_flag=True, help="Regenerate into a temporary directory and report drift; write nothing.")
@click.option("--golden-dir", type=click.Path(file_okay=False), help="Default: <repo>/golden.")
def regen(check, golden_dir) -> None:
    """Regenerate every golden and golden/MANIFEST.json (or, with --check, compare)."""
    gdir = _root_path(golden_dir, goldens.default_golden_dir())
    if check:
        if not gdir.is_dir():
            fail_usage(goldens.missing_golden_dir(gdir))
        children.install_signal_handlers()  # SIGTERM/SIGHUP: the scratch regeneration removed on the way out
        try:
            rep = goldens.check(gdir, kdtr.generators.REGISTRY)
        except (children.Terminated, KeyboardInterrupt) as exc:
            click.echo(f"kdtr: {signal.Signals(children.signal_number(exc)).name}: regen --check stopped", err=True)
            sys.exit(128 + children.signal_number(exc))
        for d in rep.drifts:
            console.print(f"[red]DRIFT[/] {escape(printable(d))}")
        if rep.ok:
            console.print(f"[green]no drift[/]: {rep.checked} goldens regenerate byte for byte")
            sys.exit(0)
        console.print(f"[red]{len(rep.drifts)} drift(s)[/] over {rep.checked} goldens")
        sys.exit(1)
    if golden_dir is None and not gdir.is_dir():  # an installed kdtr: never write goldens beside site-packages
        fail_usage(goldens.missing_golden_dir(gdir))
    try:
        with Progress(TextColumn("[bold]kdtr regen"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TextColumn("{task.description}"), console=console, transient=True) as progress:
            task = progress.add_task("", total=len(kdtr.generators.REGISTRY.all_configs()))

            def on_config(op: str, config: str, i: int, n: int) -> None:
                progress.update(task, completed=i, description=f"{op}/{config}")
                if not console.is_terminal:  # a CI log gets one line per configuration
                    console.print(f"regen [{i + 1}/{n}] {op}/{config}", markup=False)

            runner.install_signal_handlers()  # SIGTERM/SIGHUP: staging removed, old set kept
            manifest = goldens.regenerate(gdir, kdtr.generators.REGISTRY, on_config=on_config)
    except (children.Terminated, KeyboardInterrupt) as exc:
        click.echo(f"kdtr: {signal.Signals(children.signal_number(exc)).name}: regen stopped; {gdir} is unchanged",
                   err=True)
        sys.exit(128 + children.signal_number(exc))
    except ValueError as exc:
        fail_usage(str(exc))
        return
    except OSError as exc:
        fail_usage(f"{gdir}: {exc.strerror or exc}")
        return
    total = sum(e["size"] for e in manifest["files"].values() if e["tier"] == "committed")
    console.print(f"wrote {len(manifest['files'])} goldens ({total / 2**20:.2f} MiB committed) and "
                  f"{printable(gdir / goldens.MANIFEST_NAME)}", markup=False)


def _open(path: str, verify: bool = True) -> kformat.KdtrFile:
    # Verifying reads every byte anyway: read them into memory (mmap=False), so that a file
    # truncated while it is compared (by a binary's leftover child, a checkout) is an error
    # line, never a SIGBUS of this process.
    try:
        return kformat.load(path, verify=verify, mmap=not verify)
    except KdtrError as exc:
        click.echo(printable(f"kdtr: error: {type(exc).__name__}: {exc}"), err=True)
        sys.exit(2)
    except OSError as exc:
        fail_usage(f"{path}: {exc.strerror or exc}")
        raise


def _value_range(arr: np.ndarray) -> tuple[str, str]:
    """min and max of a numeric tensor as text: integers exactly, floats ignoring NaN
    ("nan" when every element is NaN); ("", "") for an empty or non-numeric tensor."""
    if not arr.size:
        return "", ""
    if arr.dtype.kind in "iub":
        return str(int(np.min(arr))), str(int(np.max(arr)))
    if arr.dtype.kind == "f" or name_of_dtype(arr.dtype) == "bf16":
        a = np.asarray(arr, dtype=np.float64)
        if np.isnan(a).all():
            return "nan", "nan"
        return f"{np.nanmin(a):.6g}", f"{np.nanmax(a):.6g}"
    return "", ""


@main.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--no-verify", is_flag=True, help="Skip the data checksums.")
@click.option("--values", is_flag=True, help="Print tensor values (numpy summary).")
def inspect(file, no_verify, values) -> None:
    """Show a KDTR file's metadata, tensors and comparison contracts."""
    f = _open(file, verify=not no_verify)
    console.print(f"[bold]{escape(printable(file))}[/]  KDTR {f.version[0]}.{f.version[1]}")
    meta = Table("key", "value", title="metadata")
    for k, v in f.metadata.items():
        meta.add_row(escape(printable(k)), escape(printable(repr(v))))
    console.print(meta)
    tens = Table("name", "dtype", "shape", "bytes", "min", "max", title="tensors")
    for name, arr in f.tensors.items():
        lo, hi = _value_range(arr)
        tens.add_row(escape(printable(name)), name_of_dtype(arr.dtype), str(list(arr.shape)), str(arr.nbytes), lo, hi)
    console.print(tens)
    if values:
        for name, arr in f.tensors.items():
            console.print(f"{printable(name)} =\n{np.array2string(np.asarray(arr), threshold=200)}", markup=False)


@main.command()
@click.argument("expected", type=click.Path(exists=True, dir_okay=False))
@click.argument("actual", type=click.Path(exists=True, dir_okay=False))
def diff(expected, actual) -> None:
    """Compare ACTUAL with EXPECTED.

    If EXPECTED is a golden (has expected.* tensors), each expected.<name> is compared
    with ACTUAL's <name> under the golden's contract; otherwise tensors of the same name
    are compared exactly. Exit 0 if all match, 1 otherwise.
    """
    e, a = _open(expected), _open(actual)
    if e.metadata.get("op") and a.metadata.get("op") and e.metadata["op"] != a.metadata["op"]:
        fail_usage(printable(f"{expected} is op {e.metadata['op']!r} but {actual} is op {a.metadata['op']!r}"))
    if not any(k.startswith("expected.") for k in e.tensors) and any(k.startswith("expected.") for k in a.tensors):
        fail_usage(f"{actual} is a golden: give it first (kdtr diff GOLDEN OUTPUT)")
    if any(k.startswith("expected.") for k in e.tensors):
        pairs = [(k[len("expected."):], v) for k, v in e.tensors.items() if k.startswith("expected.")]
    else:
        pairs = list(e.tensors.items())
    stray = stray_contract_keys(e.metadata, [name for name, _ in pairs])
    if stray:
        fail_usage(f"{expected}: metadata {stray[0]!r} is a contract for no compared tensor")
    results = None
    if any(k.startswith("expected.") for k in e.tensors):  # a golden: the runner's judge
        try:
            g = judge.Golden.read(expected)
        except judge.GoldenError as exc:
            fail_usage(printable(str(exc)))
            return
        if not g.problem:  # else (an output without a contract): compared exactly, below
            results = judge.judge(g, a).results
    if results is None:
        results = []
        for name, exp in pairs:
            try:
                contract = Contract.from_metadata(e.metadata, name)
            except KeyError:
                contract = Contract("exact")
            except ValueError as exc:
                fail_usage(printable(f"{expected}: bad contract for {name!r}: {exc}"))
                return
            results.append(compare(name, exp, a.tensors.get(name), contract))
    ok = True
    for res in results:
        ok &= res.ok
        style = "green" if res.ok else "red"
        console.print(f"[{style}]{escape(printable(res.summary()))}[/]")
        for el in res.first:
            console.print(printable(f"    {el.where()}: expected {el.expected}, actual {el.actual}"), markup=False)
    sys.exit(0 if ok else 1)


@main.command("list")
@click.option("--golden-dir", type=click.Path(file_okay=False), help="Default: <repo>/golden.")
def list_(golden_dir) -> None:
    """List every op and configuration with its tier, golden file and description."""
    gdir = _root_path(golden_dir, goldens.default_golden_dir())
    if not gdir.is_dir():
        fail_usage(goldens.missing_golden_dir(gdir))
    bin_dir = goldens.repo_root() / "build" / "bin"
    table = Table(title="kdtr configurations")
    for col in ("op", "config", "tier", "golden", "size", "binary"):
        table.add_column(col, no_wrap=True)
    table.add_column("description", overflow="fold")
    for op_configs in kdtr.generators.REGISTRY.entries():
        op = op_configs.op
        has_bin = "built" if (bin_dir / f"kdtr_{op}").exists() else "[yellow]not built[/]"
        for name, cfg in op_configs.configs.items():
            path = gdir / op / f"{name}.kdtr"
            tier = getattr(cfg, "tier", "committed")
            present = path.exists() if tier == "committed" else (gdir / ".cache" / op / f"{name}.kdtr").exists()
            size = f"{path.stat().st_size / 1024:.1f} KiB" if path.exists() else ""
            table.add_row(op, name, tier, "yes" if present else "[red]missing[/]", size, has_bin,
                          escape(cfg.description))
    console.print(table)


def entry() -> None:
    """Console-script entry point: click's usage errors as one line on stderr, exit 2;
    bare ``kdtr`` (no command) prints the help on stderr and exits 2."""
    try:
        main(standalone_mode=False, prog_name="kdtr")
    except getattr(click.exceptions, "NoArgsIsHelpError", ()) as exc:  # click >= 8.2
        click.echo(exc.ctx.get_help() if exc.ctx is not None else "kdtr: no command given", err=True)
        sys.exit(2)
    except click.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx is not None else "kdtr"
        click.echo(f"{where}: error: {exc.format_message()}", err=True)
        sys.exit(2)
    except click.ClickException as exc:
        click.echo(f"kdtr: error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except click.Abort:
        click.echo("kdtr: interrupted", err=True)
        sys.exit(130)


main.add_command(show_command)

main.add_command(convert_command)

main.add_command(mutate_command)

if __name__ == "__main__":
    entry()
