#!/usr/bin/env bash
# On the H200 device machine (see docs/conformance.md): build with nvcc, run every golden on
# both backends, then compute-sanitizer over the CUDA binary of every op on every golden.
# Logs go to $OUT (default ./h200-out). Python deps missing there come as wheels in .whl/.
# KDTR_STEPS="build run sanitize" (default all three) picks the steps;
# KDTR_OPS="tree_accept tree_build" limits the build, the run and the sanitizer to those ops
# (default: every op with goldens); KDTR_TIER=all adds the second-tier goldens to the run.
set -uo pipefail
OUT=${OUT:-h200-out}
mkdir -p "$OUT"
. "$(dirname "$0")/h200_env.sh"
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  nvcc --version | tail -2
  compute-sanitizer --version | head -2
  python3 -c 'import numpy, ml_dtypes, click, rich, construct; print("numpy", numpy.__version__)'
} 2>&1 | tee "$OUT/env.txt"

OPS=${KDTR_OPS:-$(ls golden | grep -v MANIFEST | grep -v known_failures)}
targets="build/bin/kdtr_check"; only=""
for op in $OPS; do targets="$targets build/bin/kdtr_$op"; only="$only --only $op"; done
STEPS=${KDTR_STEPS:-build run sanitize}
if [[ " $STEPS " == *" build "* ]]; then
  make clean >/dev/null
  make -j8 $targets 2>&1 | tee "$OUT/build.log" || exit 1
fi
if [[ " $STEPS " == *" run "* ]]; then
  python3 -m kdtr.cli run -j 8 --timeout 300 --require-backend cuda --tier "${KDTR_TIER:-committed}" $only 2>&1 | tee "$OUT/run.log"
  cp reports/conformance.md "$OUT/conformance.md"
  cp reports/junit.xml "$OUT/junit.xml"
  python3 tools/error_table.py reports/conformance.json > "$OUT/errors.md"
fi
[[ " $STEPS " == *" sanitize "* ]] || exit 0

san_log="$OUT/sanitizer-$(echo ${SANITIZER_TOOLS:-all} | tr ' ' '-').log"
: > "$san_log"
fails=0
# One batched `kdtr run --sanitizer` per tool (docs/harness.md): one process per op, and
# every golden of a batch on which the sanitizer reports an error runs again alone, so each
# report is attributed to its golden (a CRASH naming the sanitizer's first error line).
for tool in ${SANITIZER_TOOLS:-memcheck racecheck initcheck}; do
  start=$(date +%s.%N)
  python3 -m kdtr.cli run -j 8 --timeout 600 --backend cuda --require-backend cuda --sanitizer "$tool" \
    --report-dir "/tmp/san-$tool" $only > "/tmp/san-$tool.log" 2>&1
  rc=$?
  end=$(date +%s.%N)
  python3 - "$tool" "$rc" "$start" "$end" <<'PY' | tee -a "$san_log"
import json, sys
tool, rc, start, end = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
cases = json.load(open(f"/tmp/san-{tool}/conformance.json"))["cases"]
for c in cases:
    print(f"{tool} {c['id']} {c['status']} ({c['process']}) {c['reason'][:200]}")
bad = [c for c in cases if c["status"] != "PASS"]
print(f"{tool}: {len(cases)} cases, {len(bad)} not PASS, exit {rc}, {end - start:.1f} s wall")
PY
  [ "$rc" = 0 ] || fails=$((fails + 1))
done
echo "sanitizer sweeps failing: $fails" | tee -a "$san_log"
