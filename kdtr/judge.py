"""The judge: one obtained output against one golden (docs/harness.md, "The judge").

Every verdict of kdtr comes from here: the runner's cases (``kdtr run``, ``pytest
--kdtr``, ``kdtr mutate``), :func:`kdtr.testing.assert_conforms` and the tools. Two names
are the API:

- :class:`Golden`: a golden read once, into private memory, and held to what vouched for
  its bytes (:mod:`kdtr.vouch`: its ``MANIFEST.json`` sha256, or the first read); its
  inputs, expected outputs and contracts are parsed from that copy, which no other process
  can change. A run reads each golden once, whatever the number of its cases (backends,
  forced kernels).
- :func:`judge`: every ``expected.<name>`` of the golden compared with the obtained
  ``<name>`` under the golden's contract for it (:func:`kdtr.compare.compare`); a missing
  output, another dtype or shape is a mismatch; outputs the golden does not expect are
  ignored.

Statuses (:class:`kdtr.status.Status`): PASS, MISMATCH, or ERROR for what is no verdict on
the output (an unreadable or oversized output file; a golden without ``expected.*``
tensors, with a contract for no output or a bad contract; an output of another kernel
than the one forced).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import format as kformat
from .compare import TensorResult, compare
from .contract import Contract, stray_contract_keys
from .errors import KdtrError
from .status import Status
from .vouch import NotVouched, Vouch, changed, load_private, load_vouched

__all__ = ["Golden", "GoldenError", "Verdict", "judge", "kernel_ran", "output_limit", "read_output"]


class GoldenError(ValueError):
    """Goldens that cannot be used: a golden unreadable, not the bytes vouched for, or whose
    metadata ``op`` / ``config`` are not those of its place ``<op>/<config>.kdtr``; for
    :mod:`kdtr.testing`, also no golden directory or manifest, or an unknown op. The
    message names each file.

    Attributes:
        kind: ``"vouch"`` (bytes not the vouched ones), ``"read"`` (unreadable, not a
            KDTR file), ``"place"`` (metadata against file name) or ``"other"``.
    """

    def __init__(self, message: str, kind: str = "other") -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(eq=False)
class Golden:
    """One golden file, read once into private memory and vouched for.

    Attributes:
        id: ``"op/config"``.
        op, config: the golden's op and configuration (its metadata ``op`` and ``config``).
        path: the file.
        tier: ``"committed"``, ``"cache"`` (second tier) or ``"file"`` (a file given by
            path, vouched for by its first read).
        vouch: what its bytes are (:class:`kdtr.vouch.Vouch`).
        inputs: input name (without ``input.``) -> read-only numpy array over the private copy.
        expected: output name (without ``expected.``) -> read-only numpy array.
        contracts: output name -> :class:`kdtr.contract.Contract` (empty when ``problem``).
        metadata: the file's metadata.
        problem: why no output can be judged against it ("" when it can): no
            ``expected.*`` tensor, a ``contract.*`` key for no output, a bad or missing
            contract. :func:`judge` then gives ERROR with this text.
        kernel: the kernel a test of it forces (:func:`kdtr.testing.goldens` with
            ``kernels=``; its id is then ``op/config:kernel``), else None.
    """

    id: str
    op: str
    config: str
    path: Path
    tier: str
    vouch: Vouch = field(repr=False)
    inputs: dict[str, np.ndarray] = field(repr=False)
    expected: dict[str, np.ndarray] = field(repr=False)
    contracts: dict[str, Contract] = field(repr=False)
    metadata: dict[str, Any] = field(repr=False)
    problem: str = ""
    kernel: str | None = None

    def __str__(self) -> str:
        return self.id

    @classmethod
    def read(cls, path: str | os.PathLike, vouch: Vouch | None = None, *, op: str | None = None,
             config: str | None = None, tier: str = "committed") -> Golden:
        """Read the golden at ``path`` once into private memory, held to ``vouch``.

        Args:
            path: the file.
            vouch: what its bytes must be (its MANIFEST.json entry); None: the bytes read
                now are vouched for (the returned golden's ``vouch`` holds them).
            op, config: what its metadata must say (its directory and file name); None:
                taken from the metadata.
            tier: recorded in :attr:`tier`.

        Raises:
            GoldenError: ``kind="vouch"``: the bytes are not the vouched ones;
                ``kind="read"``: unreadable, not a regular file or not a valid KDTR file;
                ``kind="place"``: metadata ``op`` / ``config`` differ from ``op`` / ``config``.
        """
        p = Path(path)
        try:
            f, got = load_vouched(p, vouch)
        except NotVouched as exc:
            raise GoldenError(f"golden not the one vouched for: {exc}", "vouch") from exc
        except (KdtrError, OSError) as exc:
            raise GoldenError(f"golden unreadable: {exc}", "read") from exc
        md = dict(f.metadata)
        if op is not None and md.get("op") != op:
            raise GoldenError(f"{p}: metadata op {md.get('op')!r} does not match directory {op!r}", "place")
        if config is not None and md.get("config") != config:
            raise GoldenError(f"{p}: metadata config {md.get('config')!r} does not match the file name {config!r}",
                              "place")
        op = str(md.get("op")) if op is None else op
        config = str(md.get("config", p.stem)) if config is None else config
        inputs = {k[len("input."):]: v for k, v in f.tensors.items() if k.startswith("input.")}
        expected = {k[len("expected."):]: v for k, v in f.tensors.items() if k.startswith("expected.")}
        contracts: dict[str, Contract] = {}
        problem = ""
        stray = stray_contract_keys(md, list(expected))
        if not expected:
            problem = f"{p}: golden has no expected.* tensors"
        elif stray:
            problem = f"{p}: metadata {stray[0]!r} is a contract for no expected.* output"
        else:
            for name in expected:
                try:
                    contracts[name] = Contract.from_metadata(md, name)
                except (KeyError, ValueError) as exc:
                    problem = f"{p}: bad or missing contract for {name!r}: {exc}"
                    contracts = {}
                    break
        return cls(f"{op}/{config}", op, config, p, tier, got, inputs, expected, contracts, md, problem)

    @property
    def tensors(self) -> dict[str, np.ndarray]:
        """Every input and expected tensor by its name in the file (``input.<name>``,
        ``expected.<name>``), as a loaded KDTR file names them (what ``kdtr show`` draws)."""
        return {**{f"input.{k}": v for k, v in self.inputs.items()},
                **{f"expected.{k}": v for k, v in self.expected.items()}}

    def changed(self) -> str | None:
        """None while the file still holds the vouched bytes, else what changed, in words
        (:func:`kdtr.vouch.changed`). The arrays never change: they are a private copy."""
        return changed(self.path, self.vouch)


@dataclass
class Verdict:
    """What :func:`judge` found.

    Attributes:
        status: PASS, MISMATCH or ERROR.
        reason: "" for PASS; the failing outputs' summaries (``; ``-joined) for MISMATCH;
            the error for ERROR.
        results: one :class:`kdtr.compare.TensorResult` per expected output, golden order
            (empty when nothing was compared).
        metadata: the obtained output file's metadata ({} for a mapping of arrays or an
            unreadable file).
    """

    status: Status
    reason: str = ""
    results: list[TensorResult] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)

    def __iter__(self):  # noqa: ANN204 - (status, reason, results), the judge's old triple
        return iter((self.status, self.reason, self.results))


def output_limit() -> int:
    """The largest obtained output file the judge reads: the binaries' output limit
    (:func:`kdtr.limits.max_output_bytes`) plus the largest header and padding a KDTR file
    can have. A larger file is an ERROR, refused unread."""
    from .limits import MAX_OUTPUT_BYTES, max_output_bytes

    try:
        tensors = max_output_bytes()
    except ValueError:  # a malformed KDTR_MAX_OUTPUT_BYTES: the binaries refuse to run anyway
        tensors = MAX_OUTPUT_BYTES
    return tensors + kformat.PREAMBLE_LEN + kformat.MAX_HEADER_LEN + kformat.ALIGNMENT * kformat.MAX_TENSORS


def read_output(path: str | os.PathLike) -> kformat.KdtrFile:
    """An obtained output file as :func:`judge` reads it: into private memory (never
    mapped), at most :func:`output_limit` bytes, every CRC checked. Whoever draws or
    reports an output next to its verdict reads it here, so both see the same bytes.

    Raises:
        kdtr.vouch.TooLarge: larger than :func:`output_limit` (not read).
        KdtrError: not a valid KDTR file.
        OSError: unreadable, not a regular file, or shrank while being read.
    """
    return load_private(path, output_limit(), "an output file (the binaries' output limit plus a header)")


def kernel_ran(forced: str, ran: Any) -> bool:
    """Whether an output whose metadata ``kernel`` is ``ran`` came from the forced kernel
    ``forced``: the same name, or an instance of it (``mma_bf16_dqk576_dv512`` for ``mma``)."""
    return isinstance(ran, str) and (ran == forced or (ran.startswith(forced + "_") and len(ran) > len(forced) + 1))


def judge(golden: Golden, obtained: str | os.PathLike | bytes | kformat.KdtrFile | Mapping[str, Any], *,
          kernel: str | None = None) -> Verdict:
    """Judge an obtained output against ``golden``.

    Args:
        golden: the golden (:meth:`Golden.read`).
        obtained: the output: a file path (read into private memory, at most
            :func:`output_limit` bytes), the file's bytes, a parsed
            :class:`kdtr.format.KdtrFile`, or a mapping of output name -> numpy array
            (what :func:`kdtr.testing.assert_conforms` passes).
        kernel: the kernel that was forced (``--kernel``), or None: the output's metadata
            ``kernel`` must name it (:func:`kernel_ran`), else the verdict is ERROR. For a
            mapping, its ``.kernel`` attribute (:class:`kdtr.kernels.Outputs` has one) is
            checked the same way; a plain mapping, which cannot say which kernel ran, is not.

    Returns:
        A :class:`Verdict`. Never raises for the output's content: an unreadable,
        oversized or malformed output file is an ERROR naming it; NaN or infinities are
        judged by the contract.

    Raises:
        TypeError: ``obtained`` is none of the accepted types.
    """
    metadata: dict[str, Any] = {}
    missing = ""
    if isinstance(obtained, Mapping):
        tensors: Mapping[str, Any] = obtained
        missing = "missing from the outputs"
        ran = getattr(obtained, "kernel", None)  # kdtr.kernels.Outputs names the kernel that ran
        if ran is not None:
            metadata["kernel"] = ran
    else:
        try:
            if isinstance(obtained, kformat.KdtrFile):
                out = obtained
            elif isinstance(obtained, (bytes, bytearray, memoryview)):
                out = kformat.load_bytes(obtained)
            elif isinstance(obtained, (str, os.PathLike)):
                out = read_output(obtained)
            else:
                raise TypeError(f"judge: obtained must be a path, bytes, a KdtrFile or a mapping of arrays, "
                                f"not {type(obtained).__name__}")
        except (KdtrError, OSError) as exc:
            return Verdict(Status.ERROR, f"output file unreadable: {exc}")
        tensors, metadata = out.tensors, dict(out.metadata)
    if golden.problem:
        return Verdict(Status.ERROR, golden.problem, metadata=metadata)
    if "op" in metadata and metadata["op"] != golden.op:
        return Verdict(Status.ERROR, f"the output's metadata op is {metadata['op']!r}, the golden's {golden.op!r}: "
                                     "an output of another op", metadata=metadata)
    if kernel is not None and (not missing or "kernel" in metadata) and not kernel_ran(kernel, metadata.get("kernel")):
        return Verdict(Status.ERROR, f"kernel {kernel} was forced but the output's metadata kernel is "
                                     f"{metadata.get('kernel')!r}: the binary ran another kernel", metadata=metadata)
    results = []
    for name, exp in golden.expected.items():
        res = compare(name, exp, tensors.get(name), golden.contracts[name])
        if missing and tensors.get(name) is None:
            res.problem = missing
        results.append(res)
    bad = [r for r in results if not r.ok]
    if bad:
        return Verdict(Status.MISMATCH, "; ".join(r.summary() for r in bad), results, metadata)
    return Verdict(Status.PASS, "", results, metadata)
