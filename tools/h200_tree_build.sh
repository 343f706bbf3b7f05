#!/usr/bin/env bash
# On the H200 device machine: tree_build's build kernels (heap, select) checked
# and measured.  Logs go to $OUT (default ./h200-out).  Python deps missing there come as
# wheels in .whl/.  KDTR_STEPS (default "build check sanitize profile bench") picks steps:
#   build     make clean; make the tree_build and greedy_step binaries with nvcc
#   check     `kdtr run --require-backend cuda` on the tree_build and greedy_step goldens
#             (--kernel auto), then every tree_build golden through both kernels on cuda,
#             each output judged against the golden (kdtr run --kernel tree_build=all)
#   sanitize  compute-sanitizer memcheck, racecheck, initcheck on every tree_build golden,
#             both kernels
#   profile   Nsight Compute on both build kernels and the visibility kernel, B=1, N=1024
#   bench     python3 bench/bench_tree_build.py (BENCH_ARGS) --out $OUT/bench.md
set -uo pipefail
OUT=${OUT:-h200-out}
mkdir -p "$OUT"
. "$(dirname "$0")/h200_env.sh"
STEPS=${KDTR_STEPS:-build check sanitize profile bench}
has() { [[ " $STEPS " == *" $1 "* ]]; }
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  nvcc --version | tail -2
} 2>&1 | tee "$OUT/env.txt"

if has build; then
  make clean >/dev/null
  make -j16 build/bin/kdtr_tree_build build/bin/kdtr_greedy_step build/bin/kdtr_check 2>&1 | tee "$OUT/build.log" || exit 1
  cuobjdump -res-usage build/bin/kdtr_tree_build 2>&1 | grep -A1 -i "tree_build" >> "$OUT/build.log" || true
fi
if has check; then
  python3 -m kdtr.cli run -j 8 --timeout 300 --require-backend cuda --tier all --only tree_build --only greedy_step \
    2>&1 | tail -25 > "$OUT/run.log"
  cp reports/conformance.md "$OUT/conformance.md"
  # every tree_build golden through both kernels; each case's detail: the kernel that ran
  # and the requests the select build handed to the heap build (select_fallbacks)
  python3 -m kdtr.cli run --backend cuda --only tree_build --kernel tree_build=all --report-dir "$OUT/kernels" \
    2>&1 | tee "$OUT/kernels.log"
fi
if has sanitize; then
  san_log="$OUT/sanitizer.log"
  : > "$san_log"
  fails=0
  for tool in ${SANITIZER_TOOLS:-memcheck racecheck initcheck}; do
    for kernel in select heap; do
      for golden in golden/tree_build/*.kdtr; do
        extra=""
        [ "$tool" = memcheck ] && extra="--leak-check full"
        line=$(compute-sanitizer --tool "$tool" $extra --error-exitcode 99 build/bin/kdtr_tree_build --input "$golden" \
                 --output /tmp/san.kdtr --backend cuda --kernel $kernel 2>&1 | tail -1)
        rc=${PIPESTATUS[0]}
        echo "$tool $kernel tree_build/$(basename "$golden" .kdtr) rc=$rc :: $line" | tee -a "$san_log"
        [ "$rc" = 0 ] || fails=$((fails + 1))
      done
    done
  done
  echo "sanitizer failures: $fails" | tee -a "$san_log"
fi
if has profile; then
  : > "$OUT/ncu.txt"
  for cfg in ${PROFILE_CONFIGS:-1:64 1:1024 64:1024}; do
    b=${cfg%%:*}; n=${cfg##*:}
    # bench/bench_tree_build.py's drafter-like inputs (D=16, K=16, budget N), no expected outputs
    python3 - "$b" "$n" /tmp/tb_b${b}_n${n}.kdtr <<'PY'
import sys
import numpy as np
sys.path.insert(0, "bench")
import kdtr
from bench_tree_build import synth_inputs
b, n, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
x = synth_inputs(np.random.default_rng([20240, b, n]), b, n)
kdtr.save(path, {f"input.{k}": v for k, v in x.items()},
          {"op": "tree_build", "config": f"bench_B{b}_N{n}", "max_budget": n})
PY
    for kernel in ${PROFILE_KERNELS:-select heap}; do
      echo "=== B=$b N=$n --kernel $kernel" >> "$OUT/ncu.txt"
      ncu --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
          --section SchedulerStats --section MemoryWorkloadAnalysis -k regex:tree_build \
          build/bin/kdtr_tree_build --input /tmp/tb_b${b}_n${n}.kdtr --output /tmp/prof.kdtr --backend cuda \
          --kernel $kernel >> "$OUT/ncu.txt" 2>&1
    done
  done
fi
if has bench; then
  python3 bench/bench_tree_build.py ${BENCH_ARGS:-} --out "$OUT/bench.md" 2>&1 | tee "$OUT/bench.log"
fi
