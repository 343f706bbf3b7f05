#!/usr/bin/env python3
"""verify_attn and greedy_step goldens through each verify_attn kernel, judged by contract.

    python3 tools/va_check.py [--backend cuda] [--kernel auto --kernel simt --kernel mma --kernel wgmma]
                              [--require-kernel K ...] [--op verify_attn --op greedy_step] [GOLDEN ...]

`kdtr run` cannot force a kernel, so this runs build/bin/kdtr_verify_attn and
build/bin/kdtr_greedy_step with ``--kernel K`` (``auto``: no option, the binary's default)
on every committed golden of those ops (golden/<op>/*.kdtr, held against
golden/MANIFEST.json like `kdtr run` does; or the GOLDENs given, their op read from their
metadata) and judges each output exactly as `kdtr run` does (kdtr.runner's judge: every
``expected.<name>`` under the golden's own ``contract.<name>.*``, not bit equality), against
the golden bytes vouched for when the check began (MANIFEST.json's sha256, or for a GOLDEN
given the bytes read at the start): a golden changed meanwhile is a FAIL naming it.  A
forced kernel must also be the one that ran (output metadata ``kernel``, e.g.
``mma_bf16_dqk576_dv512`` for ``mma``).  One line per (golden, kernel):

    PASS verify_attn/k2_dims_bf16 kernel=wgmma ran=wgmma_bf16_dqk576_dv512 0.41s
    FAIL verify_attn/small kernel=mma: <what differs, or the exit code and error line>
    NOT_SUPPORTED verify_attn/small kernel=mma (exit 3; f32 q [2, 9, 4, 72]): <the binary's line>
    SKIP greedy_step/default kernel=simt: kdtr_greedy_step has no --kernel option

NOT_SUPPORTED (binary exit 3: the kernel does not apply to the golden's dtype or dims, or
no such backend here) is not a failure, except for the kernels named by
``--require-kernel``.  A binary whose ``--help`` lists no ``--kernel`` option runs only
``auto``.  Each (op, kernel) runs as one ``--batch`` process; goldens the batch did not
finish (a CUDA error ends a batch) run again one process each.  Exit 0 when nothing
failed, 1 on any FAIL, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kdtr import format as kformat  # noqa: E402
from kdtr.errors import KdtrError  # noqa: E402
from kdtr import streams  # noqa: E402
from kdtr.judge import Golden as JudgedGolden, judge as judge_output, output_limit  # noqa: E402
from kdtr.runner import BATCH_TAG, UsageError, check_manifest, discover  # noqa: E402
from kdtr.status import Status  # noqa: E402
from kdtr.vouch import NotVouched, Vouch, load_private, load_vouched  # noqa: E402

OPS = ("verify_attn", "greedy_step")
KERNELS = ("auto", "simt", "mma", "wgmma")
_BATCH_LINE = re.compile(re.escape(BATCH_TAG) + r" i=(\d+) rc=(-?\d+) s=([0-9.eE+-]+) msg=(.*)")


@dataclass
class Golden:
    op: str
    config: str
    path: Path
    problem: str = ""  # why it must not run (manifest), else ""
    vouch: Vouch | None = None  # what its bytes must be when an output is judged (kdtr.vouch)


@dataclass
class Outcome:
    status: str  # PASS FAIL NOT_SUPPORTED SKIP
    golden: Golden
    kernel: str
    detail: str = ""
    seconds: float = 0.0

    def line(self) -> str:
        sep = " " if self.status == "PASS" else ": " if self.detail else ""
        t = f" {self.seconds:.2f}s" if self.status == "PASS" else ""
        return f"{self.status} {self.golden.op}/{self.golden.config} kernel={self.kernel}{sep}{self.detail}{t}"


def has_kernel_option(binary: Path) -> bool:
    """Whether the binary's usage line offers --kernel."""
    try:
        r = streams.run([str(binary), "--help"], timeout=60)
    except (OSError, subprocess.SubprocessError):
        return False
    return "--kernel" in (r.stdout + r.stderr)


def describe(path: Path) -> str:
    """'bf16 q [8, 65, 64, 576] d_v 512' for a NOT_SUPPORTED line."""
    try:
        f = kformat.load(path, verify=False, mmap=False)  # a private copy: a truncated file is no SIGBUS
        q = f.tensors["input.q"]
        dt = "bf16" if str(q.dtype) == "bfloat16" else "f32" if q.dtype.itemsize == 4 else str(q.dtype)
        d_v = int(f.tensors["input.d_v"]) if "input.d_v" in f.tensors else "?"
        return f"{dt} q {list(q.shape)} d_v {d_v}"
    except (KdtrError, OSError, KeyError, ValueError, TypeError):
        return "inputs unreadable"


def ran_matches(kernel: str, ran: str) -> bool:
    return kernel == "auto" or ran.startswith(kernel + "_")


def judge(g: Golden, kernel: str, backend: str, rc: int, msg: str, out: Path, seconds: float) -> Outcome:
    if rc == 3:
        return Outcome("NOT_SUPPORTED", g, kernel, f"(exit 3; {describe(g.path)}) {msg}".rstrip(), seconds)
    if rc != 0:
        return Outcome("FAIL", g, kernel, f"exit {rc}: {msg}".rstrip(), seconds)
    try:  # the vouched bytes, in private memory: never what a binary left in the file
        gold = JudgedGolden.read(g.path, g.vouch)
    except Exception as exc:  # kdtr.judge.GoldenError
        return Outcome("FAIL", g, kernel, f"golden changed since it was vouched for: {exc}", seconds)
    status, reason, _results = judge_output(gold, out)
    if status != Status.PASS:
        return Outcome("FAIL", g, kernel, f"{status}: {reason}", seconds)
    try:
        ran = str(load_private(out, output_limit()).metadata.get("kernel", "?"))
    except (KdtrError, OSError) as exc:
        return Outcome("FAIL", g, kernel, f"output unreadable: {exc}", seconds)
    if not ran_matches(kernel, ran):
        return Outcome("FAIL", g, kernel, f"forced {kernel}, but kernel {ran} ran", seconds)
    return Outcome("PASS", g, kernel, f"ran={ran}", seconds)


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else ""


def run_group(binary: Path, goldens: list[Golden], kernel: str, backend: str, device: int | None,
              tmp: Path, timeout: float, batch: bool) -> list[Outcome]:
    """Every golden through the binary with one kernel: one --batch process, then singles."""
    base = [str(binary), "--backend", backend] + (["--kernel", kernel] if kernel != "auto" else [])
    if device is not None:
        base += ["--device", str(device)]
    outs = {i: tmp / f"{kernel}.{i}.{g.config}.kdtr" for i, g in enumerate(goldens)}
    done: dict[int, Outcome] = {}
    if batch and len(goldens) > 1:
        cmd = base + ["--batch"]
        for i, g in enumerate(goldens):
            cmd += ["--input", str(g.path), "--output", str(outs[i])]
        try:
            r = streams.run(cmd, timeout=timeout)  # output capped, whatever the binary prints
            for m in _BATCH_LINE.finditer(r.stdout):
                i, rc, s, msg = int(m.group(1)), int(m.group(2)), float(m.group(3)), m.group(4)
                # exit 1 (runtime failure) ends a batch: rerun that golden alone for its own verdict
                if 0 <= i < len(goldens) and rc != 1:
                    done[i] = judge(goldens[i], kernel, backend, rc, msg, outs[i], s)
        except subprocess.TimeoutExpired:
            pass
    for i, g in enumerate(goldens):
        if i in done:
            continue
        t0 = time.monotonic()
        try:
            r = streams.run(base + ["--input", str(g.path), "--output", str(outs[i])], timeout=timeout)
            rc, msg = r.returncode, _last_line(r.stderr)
        except subprocess.TimeoutExpired:
            rc, msg = -1, f"timed out after {timeout:.0f}s"
        done[i] = judge(g, kernel, backend, rc, msg, outs[i], time.monotonic() - t0)
    for p in outs.values():
        p.unlink(missing_ok=True)
    return [done[i] for i in range(len(goldens))]


def collect(args: argparse.Namespace) -> list[Golden]:
    if args.goldens:
        out = []
        for p in args.goldens:
            try:  # these bytes, read now, are what its outputs are judged against
                f, vouch = load_vouched(p, None)
            except (KdtrError, OSError) as exc:
                raise UsageError(f"{p}: {exc}") from exc
            md = f.metadata
            op = str(md.get("op", ""))
            if op not in args.op:
                raise UsageError(f"{p}: op {op!r} is not one of {', '.join(args.op)}")
            out.append(Golden(op, str(md.get("config", p.stem)), p, vouch=vouch))
        return out
    found = [f for f in discover(args.golden_dir) if f[0] in args.op]
    vouched: dict[Path, Vouch] = {}
    found, problems = check_manifest(args.golden_dir, found, vouched)
    return [Golden(op, cfg, p, problems.get(p, ""), vouched.get(p)) for op, cfg, p in found if op in args.op]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("goldens", nargs="*", type=Path)
    ap.add_argument("--backend", default="cuda", choices=["cpu", "cuda"])
    ap.add_argument("--kernel", action="append", choices=KERNELS, help="default: all four")
    ap.add_argument("--require-kernel", action="append", default=[], choices=KERNELS,
                    help="NOT_SUPPORTED for this kernel is a failure")
    ap.add_argument("--op", action="append", choices=OPS, help="default: both")
    ap.add_argument("--golden-dir", type=Path, default=ROOT / "golden")
    ap.add_argument("--bin-dir", type=Path, default=ROOT / "build" / "bin")
    ap.add_argument("--device", type=int)
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per binary process")
    ap.add_argument("--no-batch", action="store_true", help="one process per golden")
    args = ap.parse_args(argv)
    args.op = args.op or list(OPS)
    kernels = args.kernel or list(KERNELS)
    try:
        goldens = collect(args)
    except UsageError as exc:
        print(f"va_check: {exc}", file=sys.stderr)
        return 2
    if not goldens:
        print("va_check: no goldens", file=sys.stderr)
        return 2
    results: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="va_check.") as td:
        for op in args.op:
            mine = [g for g in goldens if g.op == op]
            if not mine:
                continue
            for g in mine:
                if g.problem:
                    results.append(Outcome("FAIL", g, "-", g.problem))
                    print(results[-1].line(), flush=True)
            runnable = [g for g in mine if not g.problem]
            binary = args.bin_dir / f"kdtr_{op}"
            if not (binary.is_file() and os.access(binary, os.X_OK)):
                for g in runnable:
                    results.append(Outcome("FAIL", g, ",".join(kernels), f"{binary} is missing: run `make` first"))
                    print(results[-1].line(), flush=True)
                continue
            forced_ok = has_kernel_option(binary)
            for k in kernels:
                if k != "auto" and not forced_ok:
                    group = [Outcome("SKIP", g, k, f"{binary.name} has no --kernel option") for g in runnable]
                else:
                    group = run_group(binary, runnable, k, args.backend, args.device, Path(td), args.timeout,
                                      not args.no_batch)
                for o in group:
                    if o.status == "NOT_SUPPORTED" and k in args.require_kernel:
                        o.status = "FAIL"
                        o.detail += " (--require-kernel " + k + ")"
                    print(o.line(), flush=True)
                results.extend(group)
    counts = {s: sum(o.status == s for o in results) for s in ("PASS", "FAIL", "NOT_SUPPORTED", "SKIP")}
    print("va_check: " + "  ".join(f"{s} {n}" for s, n in counts.items()) + f"  ({args.backend})")
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
