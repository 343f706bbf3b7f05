"""Wall time of `kdtr run` over the committed goldens: batch mode (one binary process per
op, backend and device) beside one process per golden, and the Python start-up beside both
(docs/benchmarks.md, "Harness wall time").

    python bench/bench_harness.py --backend cpu [--repeat 5]
    python bench/bench_harness.py --backend cuda --device all --sanitizer memcheck

Each configuration runs `--repeat` times (after one untimed warm-up run); the table gives
the median and the minimum wall time, the work after start-up (median minus the median
of `python -c "import kdtr.cli.main"`, the CLI's imports), and the statuses the run
reported, so a timing of a failing run cannot pass unnoticed. Reports go to a temporary
directory. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def wall(cmd: list[str], env: dict[str, str]) -> tuple[float, int]:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return time.perf_counter() - t0, p.returncode


def statuses(report_dir: Path) -> str:
    try:
        cases = json.loads((report_dir / "conformance.json").read_text())["cases"]
    except (OSError, ValueError, KeyError):
        return "no report"
    c = Counter(x["status"] for x in cases)
    return " ".join(f"{k} {v}" for k, v in sorted(c.items()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--device", default="0", help="kdtr run --device (N, N,M or all)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--jobs", default="", help="comma-separated -j values for the runs (default: kdtr's)")
    ap.add_argument("--sanitizer", default="", help="comma-separated compute-sanitizer tools: one batch sweep each")
    ap.add_argument("--no-single", action="store_true", help="skip the one-process-per-golden comparison")
    args = ap.parse_args()

    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    py = sys.executable
    startup = [wall([py, "-c", "import kdtr.cli.main"], env)[0] for _ in range(max(3, args.repeat))]
    t_start = statistics.median(startup)

    rows = [("python start-up (`import kdtr.cli.main`)", statistics.median(startup), min(startup), None, "")]
    configs: list[tuple[str, list[str], int]] = []
    jobs = [j for j in args.jobs.split(",") if j] or [""]
    for j in jobs:
        jarg = ["-j", j] if j else []
        configs.append((f"batch{' -j ' + j if j else ''}", ["--batch", *jarg], args.repeat))
        if not args.no_single:
            configs.append((f"one process per golden{' -j ' + j if j else ''}", ["--no-batch", *jarg], args.repeat))
    for tool in [t for t in args.sanitizer.split(",") if t]:
        configs.append((f"--sanitizer {tool} (batch)", ["--sanitizer", tool], 1))

    with tempfile.TemporaryDirectory() as tmp:
        for name, extra, repeat in configs:
            rdir = Path(tmp) / "reports"
            cmd = [py, "-m", "kdtr.cli", "run", "--backend", args.backend, "--device", args.device,
                   "--report-dir", str(rdir), "--timeout", "600", *extra]
            if repeat > 1:
                wall(cmd, env)  # warm-up: page cache, driver state
            times = []
            for _ in range(repeat):
                t, rc = wall(cmd, env)
                times.append(t)
            rows.append((name, statistics.median(times), min(times), statistics.median(times) - t_start,
                         f"exit {rc}: {statuses(rdir)}"))

    print(f"`{' '.join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]])}`, backend {args.backend}, "
          f"device {args.device}, repeat {args.repeat}\n")
    print("| configuration | median wall s | min wall s | work after start-up s | run |")
    print("| --- | --- | --- | --- | --- |")
    for name, med, mn, work, st in rows:
        print(f"| {name} | {med:.3f} | {mn:.3f} | {'' if work is None else f'{work:.3f}'} | {st} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
