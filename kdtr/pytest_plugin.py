"""pytest plugin of kdtr (entry point ``pytest11``: loaded wherever kdtr is installed).

Without ``--kdtr`` it only registers its options, the markers ``kdtr`` and ``kdtr_golden``
and the fixture ``kdtr_golden``: a normal run collects and runs exactly what it did before.

``pytest --kdtr``
    adds one test item per golden x backend of the test binaries, ``kdtr::<op>/<config>@<backend>``,
    each running the case as ``kdtr run --no-batch`` does (:func:`kdtr.run.run_case`):
    PASS passes; MISMATCH, CRASH, TIMEOUT and ERROR fail with the runner's mismatch lines;
    WAIVED (golden/known_failures.json) is an xfail with its reason; NOT_SUPPORTED (no CUDA
    here) is a skip with the binary's reason. The items carry the marker ``kdtr`` and no
    other test does (``-m kdtr`` runs only them: the fixture tests below use the marker
    ``kdtr_golden``) and run under pytest-xdist: each worker writes its outputs under its own
    temporary directory. Each case is judged as ``kdtr run`` judges it: against the bytes
    that MANIFEST.json vouched for when the session began, read into private memory (a
    binary that writes to its golden makes its case an ERROR). The report header names the
    binary directory and any ``kdtr_<op>`` it lacks. Options: ``--kdtr-bin-dir``, ``--kdtr-golden-dir`` (ini
    ``kdtr_bin_dir``, ``kdtr_golden_dir``, relative to the rootdir), ``--kdtr-backend``
    (repeatable; default cpu and cuda), ``--kdtr-only`` (``kdtr run --only`` patterns),
    ``--kdtr-timeout``, ``--kdtr-kernel`` (``kdtr run --kernel``: the cuda cases of an op once
    per forced kernel, ``kdtr::<op>/<config>@cuda:<kernel>``).

``@pytest.mark.kdtr_golden(op="tree_accept")`` + fixture ``kdtr_golden``
    runs the test once per committed golden of the op (ids ``op/config``); the fixture's value
    is a :class:`kdtr.testing.Golden`. ``config="wide*"`` keeps the matching configurations;
    ``golden_dir=...`` reads another golden directory; ``kernels=["mma", "wgmma"]`` (or
    ``"all"``) runs it once per golden and kernel (ids ``op/config:kernel``, the fixture's
    ``.kernel`` naming the kernel to force). (``@pytest.mark.kdtr(op=...)``, the
    marker's name before, still works on such a test, with a deprecation warning: the test is
    read as marked ``kdtr_golden``, so ``-m kdtr`` never selects it.)

docs/bring-your-own-kernel.md has the examples.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

from . import testing
from .status import Status

_KEY = pytest.StashKey[dict]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kdtr", "kdtr conformance (golden x backend cases of the test binaries)")
    group.addoption("--kdtr", action="store_true", default=False,
                    help="collect one test per golden x backend of the kdtr test binaries")
    group.addoption("--kdtr-bin-dir", default=None, metavar="DIR",
                    help="directory of the kdtr_<op> binaries "
                         "(default: ini kdtr_bin_dir, else <kdtr checkout>/build/bin)")
    group.addoption("--kdtr-golden-dir", default=None, metavar="DIR",
                    help="golden directory (default: ini kdtr_golden_dir, else <kdtr checkout>/golden); "
                         "also used by the kdtr_golden fixture")
    group.addoption("--kdtr-backend", action="append", default=None, choices=("cpu", "cuda"),
                    help="backend to run (repeatable; default: cpu and cuda)")
    group.addoption("--kdtr-only", action="append", default=None, metavar="PATTERN",
                    help="keep the cases matching op[/config][@backend] globs (repeatable), as kdtr run --only")
    group.addoption("--kdtr-kernel", action="append", default=None, metavar="OP=K[,K...]",
                    help="force kernels on the cuda cases of OP, one case per kernel (kdtr::op/config@cuda:K), "
                         "as kdtr run --kernel (repeatable)")
    group.addoption("--kdtr-timeout", type=float, default=60.0, metavar="SECONDS",
                    help="time limit per case (default 60)")
    parser.addini("kdtr_bin_dir", "directory of the kdtr_<op> binaries, relative to the rootdir", default="")
    parser.addini("kdtr_golden_dir", "kdtr golden directory, relative to the rootdir", default="")


MARK = "kdtr"  # the --kdtr cases' marker: `-m kdtr` selects them
FIXTURE_MARK = "kdtr_golden"  # the kdtr_golden fixture's marker, named as the fixture


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MARK}(op, config, backend): the --kdtr cases (golden x backend of the test binaries); "
                   f"`-m {MARK}` selects them",
    )
    config.addinivalue_line(
        "markers",
        f"{FIXTURE_MARK}(op, config=None, golden_dir=None, kernels=None): run the test once per golden of `op` "
        "(and per kernel of `kernels`) with the kdtr_golden fixture (kdtr.testing.Golden)",
    )


def _dir(config: pytest.Config, option: str, ini: str, default: str) -> Path:
    value = config.getoption(option)
    if value:
        return Path(value).resolve()
    value = config.getini(ini)
    if value:
        return (config.rootpath / value).resolve()
    from .goldens import repo_root

    return repo_root() / default


def golden_dir(config: pytest.Config) -> Path:
    return _dir(config, "--kdtr-golden-dir", "kdtr_golden_dir", "golden")


def bin_dir(config: pytest.Config) -> Path:
    return _dir(config, "--kdtr-bin-dir", "kdtr_bin_dir", "build/bin")


# ---------------------------------------------------------------- the kdtr_golden fixture


@pytest.fixture
def kdtr_golden(request: pytest.FixtureRequest) -> testing.Golden:
    """One golden of the op named by ``@pytest.mark.kdtr_golden(op=...)`` (a
    :class:`kdtr.testing.Golden`); the test runs once per golden, ids ``op/config``."""
    if not hasattr(request, "param"):
        pytest.fail(f"kdtr_golden needs @pytest.mark.{FIXTURE_MARK}(op=...) on the test", pytrace=False)
    return request.param


def _fixture_marker(node: Any) -> Any:
    """The closest ``kdtr_golden`` marker, else the closest ``kdtr`` marker in the fixture's
    form (``op=`` or a positional op: what ``@pytest.mark.kdtr(op=...)`` meant before)."""
    marker = node.get_closest_marker(FIXTURE_MARK)
    if marker is None:
        legacy = node.get_closest_marker(MARK)
        if legacy is not None and _is_fixture_form(legacy):
            return legacy
    return marker


def _is_fixture_form(mark: Any) -> bool:
    return mark.name == MARK and ("op" in mark.kwargs or bool(mark.args))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "kdtr_golden" not in metafunc.fixturenames:
        return
    marker = _fixture_marker(metafunc.definition)
    if marker is None:
        return  # the fixture fails the test with a message
    if marker.name == MARK:
        warnings.warn(pytest.PytestDeprecationWarning(
            f"{metafunc.definition.nodeid}: write @pytest.mark.{FIXTURE_MARK}(op=...) for the kdtr_golden fixture: "
            f"@pytest.mark.{MARK} marks the --kdtr cases (this test is read as marked {FIXTURE_MARK}, so that "
            f"`-m {MARK}` does not select it)"), stacklevel=1)
    op = marker.kwargs.get("op", marker.args[0] if marker.args else None)
    if not isinstance(op, str) or not op:
        pytest.fail(f"{metafunc.definition.nodeid}: @pytest.mark.{FIXTURE_MARK} needs op='<op name>'",
                    pytrace=False)
    gdir = marker.kwargs.get("golden_dir") or golden_dir(metafunc.config)
    try:
        gs = testing.goldens(op, gdir, config=marker.kwargs.get("config"), kernels=marker.kwargs.get("kernels"))
    except testing.GoldenError as exc:
        pytest.fail(f"{metafunc.definition.nodeid}: {exc}", pytrace=False)  # a collection error
    metafunc.parametrize("kdtr_golden", gs, ids=[g.id for g in gs], indirect=True)


def _rename_legacy_marks(items: list[pytest.Item]) -> None:
    """On tests that use the kdtr_golden fixture, ``@pytest.mark.kdtr(op=...)`` becomes
    ``kdtr_golden`` (the marker ``kdtr`` is the --kdtr cases'): ``-m kdtr`` selects the
    cases of the binaries only, whichever form a test was written in."""
    for item in items:
        if isinstance(item, KdtrCaseItem) or "kdtr_golden" not in getattr(item, "fixturenames", ()):
            continue
        for node in item.listchain():
            marks = node.own_markers
            for i, m in enumerate(marks):
                if _is_fixture_form(m):
                    marks[i] = getattr(pytest.mark, FIXTURE_MARK)(*m.args, **m.kwargs).mark


# ---------------------------------------------------------------- pytest --kdtr


class KdtrCaseFailure(Exception):
    """A failing case (MISMATCH, CRASH, TIMEOUT, ERROR): its mismatch lines."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines


class KdtrCases(pytest.File):
    """The golden directory as a collector of golden x backend cases."""

    def collect(self):  # noqa: ANN201 - pytest's Item iterator
        state = self.config.stash[_KEY]
        for case in state["cases"]:
            item = KdtrCaseItem.from_parent(self, name=case.id, case=case)
            item.add_marker(getattr(pytest.mark, MARK)(op=case.op, config=case.config, backend=case.backend))
            yield item


class KdtrCaseItem(pytest.Item):
    """One case: a golden on one backend, run by its binary."""

    def __init__(self, *, case: Any, **kw: Any) -> None:
        super().__init__(**kw)
        self.case = case

    def _run_config(self) -> Any:
        from .run import RunConfig

        state = self.config.stash[_KEY]
        if "out_dir" not in state:  # one per process: xdist workers never share an output path
            factory = getattr(self.config, "_tmp_path_factory", None)
            if factory is not None:
                state["out_dir"] = factory.mktemp("kdtr-out", numbered=True)
            else:
                import tempfile

                state["out_dir"] = Path(tempfile.mkdtemp(prefix="kdtr-out-"))
        return RunConfig(golden_dir=state["golden_dir"], bin_dir=state["bin_dir"], out_dir=state["out_dir"],
                         timeout=state["timeout"], known_failures=state["known_failures"],
                         golden_problems=state["golden_problems"], vouched=state["vouched"], batch=False,
                         rerun_args=state["rerun_args"], goldens=state["store"])

    def runtest(self) -> None:
        from .report import mismatch_lines
        from .run import run_case

        res = run_case(self.case, self._run_config())
        self.user_properties += [("kdtr_status", str(res.status)), ("kdtr_rerun", res.rerun)]
        if res.output_file:
            self.user_properties.append(("kdtr_output_file", res.output_file))
        if res.status == Status.PASS:
            if res.reason:  # passes although waived
                self.warn(pytest.PytestWarning(f"{self.case.id}: {res.reason}"))
            return
        if res.status == Status.WAIVED:
            pytest.xfail(res.reason)
        if res.status == Status.NOT_SUPPORTED:
            pytest.skip(f"NOT_SUPPORTED: {res.reason}")
        raise KdtrCaseFailure(mismatch_lines(res))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, KdtrCaseFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.case.golden, None, self.case.id


def _plan(config: pytest.Config) -> dict[str, Any]:
    from .run import BACKENDS, UsageError, load_known_failures, parse_kernels, plan, select, select_cases

    gdir, bdir = golden_dir(config), bin_dir(config)
    backends = tuple(dict.fromkeys(config.getoption("--kdtr-backend") or BACKENDS))
    only = config.getoption("--kdtr-only") or []
    timeout = config.getoption("--kdtr-timeout")
    if not (timeout > 0 and timeout != float("inf")):
        raise pytest.UsageError(f"--kdtr-timeout {timeout}: must be a finite number of seconds > 0")
    vouched: dict[Path, Any] = {}  # what each golden's bytes must be, from MANIFEST.json now
    try:
        found, problems = testing.golden_cases(gdir, vouched=vouched)
        found = select(found, only)
        kernels = parse_kernels(config.getoption("--kdtr-kernel") or [], option="--kdtr-kernel")
        if kernels and "cuda" not in backends:
            raise UsageError("--kdtr-kernel forces kernels of the cuda cases: add --kdtr-backend cuda")
        cases = select_cases(plan(found, backends, kernels), only)
        known = load_known_failures(gdir)
    except (testing.GoldenError, UsageError) as exc:
        raise pytest.UsageError(f"--kdtr: {exc}") from exc
    rerun = ["--golden-dir", str(gdir), "--bin-dir", str(bdir)]
    if timeout != 60.0:
        rerun += ["--timeout", f"{timeout:g}"]
    from .run import GoldenStore

    return {"cases": cases, "golden_dir": gdir, "bin_dir": bdir, "timeout": timeout, "store": GoldenStore(),
            "known_failures": known, "golden_problems": problems, "vouched": vouched, "rerun_args": rerun}


def pytest_report_header(config: pytest.Config) -> list[str]:
    """With ``--kdtr``: the binary and golden directories tested."""
    if not config.getoption("--kdtr"):
        return []
    return [f"kdtr: binaries from {bin_dir(config)}, goldens from {golden_dir(config)}"]


def pytest_report_collectionfinish(config: pytest.Config, items: list[pytest.Item]) -> list[str]:
    """With ``--kdtr``: one line for the ``kdtr_<op>`` binaries the selected cases need and
    the binary directory lacks (each of their cases fails naming it)."""
    state = config.stash.get(_KEY, None)
    if not state:
        return []
    from .run import missing_binaries, missing_binaries_line

    missing = missing_binaries(state["cases"], state["bin_dir"])
    return [f"kdtr: {missing_binaries_line(missing, state['bin_dir'], '--kdtr-only')}"] if missing else []


@pytest.hookimpl(tryfirst=True)  # before -k / -m deselect
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    _rename_legacy_marks(items)
    if not config.getoption("--kdtr"):
        return
    config.stash[_KEY] = state = _plan(config)
    collector = KdtrCases.from_parent(session, path=state["golden_dir"], name="kdtr", nodeid="kdtr")
    cases = list(collector.collect())
    # the terminal counts collected items from collect reports (``--co``'s "N tests collected")
    session.ihook.pytest_collectreport(report=pytest.CollectReport(collector.nodeid, "passed", None, cases))
    items.extend(cases)
