"""Check your own kernel against the goldens from Python (docs/bring-your-own-kernel.md).

Two names are the API::

    from kdtr.testing import goldens, assert_conforms

    for g in goldens("tree_accept"):
        out = my_kernel(**g.inputs)               # name -> numpy array / torch tensor / ...
        assert_conforms(g, out)                   # AssertionError with the runner's mismatch lines

:func:`goldens` returns the committed goldens of an op, each checked against
``golden/MANIFEST.json`` exactly as ``kdtr run`` checks them (a golden the manifest does not
vouch for is an error, never silently used). :func:`assert_conforms` judges the outputs as
the runner judges a binary's output file: every ``expected.<name>`` of the golden under its
contract (:func:`kdtr.compare.compare`), a missing output or a dtype or shape change being a
mismatch. Outputs named by no ``expected.<name>`` are ignored, as the runner ignores extra
tensors in an output file; when the check fails, their names are listed (a typo in an output
name then shows as "missing" plus "not in the golden").

Outputs may be numpy arrays, anything with ``__array__``, or DLPack producers (torch tensors
on the CPU or a GPU, CuPy arrays, JAX arrays): a tensor on a device is copied to the host for
the comparison only. The pytest plugin (:mod:`kdtr.pytest_plugin`) gives the fixture
``kdtr_golden`` built on these.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .compare import TensorResult
from .judge import Golden, GoldenError, judge
from .status import Status
from .vouch import Vouch

__all__ = ["ConformanceError", "Golden", "GoldenError", "assert_conforms", "goldens", "to_numpy"]

TIERS = ("committed", "all")
# DLPack device types (dlpack.h DLDeviceType) whose memory the host can read directly.
_DL_CPU, _DL_CUDA_HOST, _DL_ROCM_HOST = 1, 3, 11
_HOST_DEVICES = (_DL_CPU, _DL_CUDA_HOST, _DL_ROCM_HOST)


class ConformanceError(AssertionError):
    """Outputs that break a golden's contracts.

    ``str(err)`` is the mismatch record that ``kdtr run`` prints for the case (per failing
    output: count and share of differing elements, worst errors with their index, the first
    differing elements with request, slot, expected and actual values).

    Attributes:
        golden: the :class:`Golden`.
        results: one :class:`kdtr.compare.TensorResult` per expected output, golden order.
        failed: the results that are not ``ok``.
        lines: the message, line by line.
    """

    def __init__(self, golden: Golden, results: list[TensorResult], lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.golden = golden
        self.results = results
        self.failed = [r for r in results if not r.ok]
        self.lines = lines


def _open_golden(op: str, config: str, path: Path, vouch: Vouch | None) -> Golden:
    """Load one golden (:meth:`kdtr.judge.Golden.read`, the runner's read): once into private
    memory, held to ``vouch`` (its MANIFEST.json entry); its arrays are views over that copy,
    which nothing outside this process can change or truncate.

    Raises:
        GoldenError: unreadable, not the vouched bytes, metadata against place, or no
            output can be judged against it (no expected.*, a stray or bad contract).
    """
    g = Golden.read(path, vouch, op=op, config=config)
    if g.problem:
        raise GoldenError(g.problem)
    return g


def golden_cases(
    golden_dir: Path, ops: Iterable[str] | None = None, tier: str = "committed", registry: Any = None,
    vouched: dict[Path, Vouch] | None = None,
) -> tuple[list[tuple[str, str, Path]], dict[Path, str]]:
    """The goldens of ``ops`` (None: all) as ``(op, config, path)``, sorted, and the problem
    of each golden the manifest does not vouch for (kdtr.goldens.discover + check_manifest).
    ``vouched`` receives each listed golden's manifest sha256 and size (check_manifest's).

    Raises:
        GoldenError: no golden directory, no goldens, no or a bad manifest; ``tier="all"``
            without ``registry``.
    """
    from .goldens import UsageError, check_manifest, discover

    if tier not in TIERS:
        raise GoldenError(f"tier {tier!r}: expected one of {', '.join(TIERS)}")
    if tier == "all" and registry is None:
        raise GoldenError("tier 'all': the second-tier goldens need the configuration registry "
                          "(pass registry=kdtr.generators.REGISTRY)")
    try:
        found = discover(Path(golden_dir), second_tier=tier == "all", registry=registry)
        wanted = None if ops is None else set(ops)
        if wanted is not None:
            found = [g for g in found if g[0] in wanted]
        found, problems = check_manifest(Path(golden_dir), found, vouched)
    except UsageError as exc:
        raise GoldenError(str(exc)) from exc
    if wanted is not None:  # check_manifest lists the other ops' goldens as missing
        found = [g for g in found if g[0] in wanted]
        problems = {p: why for p, why in problems.items() if any(p == g[2] for g in found)}
    return found, problems


def goldens(
    op: str,
    golden_dir: str | Path | None = None,
    tier: str = "committed",
    *,
    config: str | None = None,
    registry: Any = None,
    kernels: Iterable[str] | None = None,
) -> list[Golden]:
    """The goldens of ``op``, sorted by configuration, opened and checked.

    Args:
        op: an op name (``tree_build``, ``verify_attn``, ``tree_accept``, ``greedy_step``).
        golden_dir: default: the checkout's ``golden/`` ($KDTR_ROOT/golden if set).
        tier: ``"committed"`` (the files in git) or ``"all"`` (adds the second tier,
            generated on demand into ``golden_dir/.cache``; needs ``registry``).
        config: keep only the configurations matching this glob (``"wide*"``).
        registry: the configuration registry (``kdtr.generators.REGISTRY``), for ``tier="all"``.
        kernels: the kernel axis of ``kdtr run --kernel``: names of the op's kernels
            (``kdtr.ops`` OpSpec.kernels), ``"all"`` or ``"auto"`` (no forced kernel). Each
            golden then comes once per kernel, its :attr:`Golden.kernel` set and its id
            ``op/config:kernel`` (``op/config`` for ``auto``); the copies share one read.

    Raises:
        GoldenError: unknown op or no golden selected; an unknown kernel, or ``kernels``
            for an op without kernels; no manifest; a golden not listed in
            ``MANIFEST.json``, whose sha256 differs from its entry, listed but missing, or
            unreadable (all such files named in the message); a golden whose bytes, read
            into memory, are not the ones the manifest vouched for (changed meanwhile).

    Each golden is read once into private memory (about its file size: the committed
    goldens are 32 MiB at most in all) and its arrays are views over that copy, so a later
    change to the file (truncated, rewritten, replaced) cannot reach them.
    """
    from .goldens import default_golden_dir

    gdir = Path(golden_dir) if golden_dir is not None else default_golden_dir()
    vouched: dict[Path, Vouch] = {}
    found, problems = golden_cases(gdir, [op], tier, registry, vouched)
    if config is not None:
        found = [g for g in found if fnmatch.fnmatchcase(g[1], config)]
        problems = {p: why for p, why in problems.items() if any(p == g[2] for g in found)}
    if not found:
        what = f"op {op!r}" + (f" with config {config!r}" if config is not None else "")
        raise GoldenError(f"no golden of {what} under {gdir}")
    if problems:
        raise GoldenError("goldens not vouched for by MANIFEST.json (run `kdtr regen --check`):\n"
                          + "\n".join(f"  {why}" for why in problems.values()))
    axis: tuple[str | None, ...] = (None,)
    if kernels is not None:
        from .goldens import UsageError
        from .run import parse_kernels

        if isinstance(kernels, str):
            kernels = [kernels]
        try:
            axis = parse_kernels([f"{op}={','.join(kernels)}"], option="kernels").get(op, (None,))
        except UsageError as exc:
            raise GoldenError(str(exc)) from exc
    opened = [_open_golden(o, c, p, vouched.get(p)) for o, c, p in found]
    return [g if k is None else dataclasses.replace(g, id=f"{g.id}:{k}", kernel=k) for g in opened for k in axis]


def _dlpack_to_host(x: Any) -> np.ndarray:
    try:
        dev_type = int(x.__dlpack_device__()[0])
    except Exception as exc:  # noqa: BLE001 - a broken producer: say which
        raise TypeError(f"{type(x).__name__}.__dlpack_device__() failed: {exc}") from exc
    if dev_type in _HOST_DEVICES:
        return np.from_dlpack(x)
    # On a device: copy to the host, by the producer's own method where it has one.
    for method in ("cpu", "get"):  # torch / JAX-like .cpu(); CuPy .get()
        move = getattr(x, method, None)
        if callable(move):
            return to_numpy(move())
    try:
        return np.from_dlpack(x, device="cpu", copy=True)
    except Exception as exc:  # noqa: BLE001 - BufferError, TypeError, ... per producer
        raise TypeError(f"cannot copy a {type(x).__name__} on DLPack device type {dev_type} to the host: "
                        f"{exc}") from exc


def to_numpy(x: Any) -> np.ndarray:
    """An output as a host numpy array: numpy arrays as they are; torch tensors (CPU or GPU,
    bf16 included) via ``detach().cpu()``; DLPack producers via :func:`numpy.from_dlpack`
    (a producer on a device is first copied to the host); else ``numpy.asarray`` (anything
    with ``__array__``). The dtype is never converted.

    Raises:
        TypeError: a DLPack producer on a device that cannot be copied to the host.
    """
    if isinstance(x, np.ndarray):
        return x
    if type(x).__module__.split(".")[0] == "torch" and hasattr(x, "detach"):
        t = x.detach().cpu()
        if str(t.dtype) == "torch.bfloat16":  # numpy has no bf16: reinterpret the bits
            import ml_dtypes
            import torch

            return t.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return t.numpy()
    if hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__"):
        try:
            return _dlpack_to_host(x)
        except (BufferError, RuntimeError, TypeError):
            if not hasattr(x, "__array__"):  # e.g. a dtype DLPack cannot carry to numpy
                raise
    return np.asarray(x)


def check_outputs(golden: Golden, outputs: Mapping[str, Any]) -> list[TensorResult]:
    """Compare ``outputs`` with every expected output of ``golden`` under its contract;
    one :class:`kdtr.compare.TensorResult` per expected output (golden order).

    Raises:
        ConformanceError: the golden cannot be judged (no expected outputs, a missing or
            bad contract: the runner's ERROR), or ``golden.kernel`` was forced and the
            outputs' ``.kernel`` (:class:`kdtr.kernels.Outputs`) names another kernel.
        TypeError: ``outputs`` is not a mapping."""
    if not isinstance(outputs, Mapping):
        raise TypeError(f"outputs must be a mapping of output name -> array, got {type(outputs).__name__}")
    # the runner's judge; a missing output is "missing from the outputs" (not "the output file")
    got = _Obtained({name: to_numpy(outputs[name]) for name in golden.expected if outputs.get(name) is not None})
    got.kernel = getattr(outputs, "kernel", None)
    v = judge(golden, got, kernel=golden.kernel)
    if v.status == Status.ERROR:  # a golden that cannot be judged, or another kernel ran: never a pass
        lines = [f"{golden.id}@python: ERROR: {v.reason}", f"  golden: {golden.path}"]
        raise ConformanceError(golden, v.results, lines)
    return v.results


class _Obtained(dict):
    """The host copies of the outputs, with the kernel the call says ran (or None)."""

    kernel: str | None = None


def mismatch_lines(golden: Golden, results: list[TensorResult], extra: Iterable[str] = ()) -> list[str]:
    """The runner's mismatch lines (kdtr.report.mismatch_lines) for ``results`` on
    ``golden``; the case id is ``op/config@python``."""
    from .report import mismatch_lines as report_lines
    from .run import Case, CaseResult

    case = Case(golden.op, golden.config, golden.path, backend="python")
    res = CaseResult(case, Status.MISMATCH, outputs=results)
    lines = [ln for ln in report_lines(res) if not ln.startswith("  rerun:")]  # no kdtr run line here
    lines.append(f"  golden: {golden.path}")
    extra = sorted(extra)
    if extra:
        lines.append("  outputs not in the golden (ignored): " + ", ".join(extra))
    return lines


def assert_conforms(golden: Golden, outputs: Mapping[str, Any]) -> list[TensorResult]:
    """Assert that ``outputs`` (output name -> array) meet every contract of ``golden``.

    Each ``expected.<name>`` of the golden is compared with ``outputs[name]`` by
    :func:`kdtr.compare.compare` under the golden's contract for it, as ``kdtr run`` judges
    a binary's output file: a missing output, another dtype (no conversion: an int64
    ``accepted_count`` where int32 is expected fails) or shape is a mismatch. Names that
    the golden does not expect are ignored (and listed when the check fails).

    Returns:
        The comparison results (all ``ok``).

    Raises:
        ConformanceError: an ``AssertionError`` whose message is the runner's mismatch
            record and whose ``.results`` holds the comparison results.
        TypeError: ``outputs`` is not a mapping, or a device tensor cannot reach the host.
    """
    __tracebackhide__ = True  # pytest shows the caller's line, then this message
    results = check_outputs(golden, outputs)
    if all(r.ok for r in results):
        return results
    extra = [k for k in outputs if k not in golden.expected]
    raise ConformanceError(golden, results, mismatch_lines(golden, results, extra))
