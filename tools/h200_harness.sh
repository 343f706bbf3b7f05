#!/usr/bin/env bash
# On the H200 device machine: the harness at hardware speed (docs/benchmarks.md,
# "Harness wall time"). Builds the binaries, checks that batch and one-process-per-golden
# runs report the same, times `kdtr run --backend cuda` both ways (bench/bench_harness.py)
# on one device and, where the host has several, on all of them, and times the batched
# compute-sanitizer sweeps. Logs go to $OUT (default ./h200-out).
# KDTR_STEPS="build check bench multi sanitize" (default all) picks the steps; SAN_TOOLS
# (default "memcheck racecheck initcheck synccheck") the sweeps.
set -uo pipefail
OUT=${OUT:-h200-out}
mkdir -p "$OUT"
. "$(dirname "$0")/h200_env.sh"
log="$OUT/harness.log"
STEPS=${KDTR_STEPS:-build check bench multi sanitize}
has() { [[ " $STEPS " == *" $1 "* ]]; }
{
  date -u
  nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv
  nproc
  git log -1 --format='commit %H %s' 2>/dev/null || true
} 2>&1 | tee "$log"
if has build; then
  make clean >/dev/null
  # named targets: `make build` would first try to install ISA-L (no network there)
  ( time make -j16 build/bin/kdtr_check $(for op in $(ls golden | grep -v -e MANIFEST -e known_failures); do echo build/bin/kdtr_$op; done) ) 2>&1 | tail -5 | tee -a "$log" || exit 1
fi
if has check; then
  # statuses, reasons and outputs of the two modes must agree case by case
  for mode in batch no-batch; do
    python3 -m kdtr.cli run --backend cuda --require-backend cuda --device 0 --$mode \
      --report-dir "/tmp/rep-$mode" 2>&1 | tail -3 | tee -a "$log"
  done
  python3 - <<'PY' 2>&1 | tee -a "$log"
import json
a = {c["id"]: c for c in json.load(open("/tmp/rep-batch/conformance.json"))["cases"]}
b = {c["id"]: c for c in json.load(open("/tmp/rep-no-batch/conformance.json"))["cases"]}
keys = ("status", "reason", "outputs", "device")
diff = [k for k in a if {f: a[k][f] for f in keys} != {f: b[k][f] for f in keys}]
print(f"batch vs single: {len(a)} cases, {len(diff)} differ {diff[:5]}; processes:",
      sorted({c['process'] for c in a.values()}), sorted({c['process'] for c in b.values()}))
PY
fi
if has bench; then
  python3 bench/bench_harness.py --backend cuda --device 0 --repeat ${REPEAT:-3} --jobs ${JOBS:-8} 2>&1 | tee -a "$log"
fi
ngpu=$(nvidia-smi -L | grep -c '^GPU ')
if has multi && [ "$ngpu" -gt 1 ]; then
  python3 bench/bench_harness.py --backend cuda --device all --repeat ${REPEAT:-3} --no-single 2>&1 | tee -a "$log"
  python3 -m kdtr.cli run --backend cuda --require-backend cuda --device all --report-dir /tmp/rep-all 2>&1 \
    | tail -3 | tee -a "$log"
  python3 -c "import json,collections; c=json.load(open('/tmp/rep-all/conformance.json'))['cases']; \
print('cases per device:', dict(collections.Counter(x['device'] for x in c)))" 2>&1 | tee -a "$log"
fi
if has sanitize; then
  tools=${SAN_TOOLS:-memcheck racecheck initcheck synccheck}
  python3 bench/bench_harness.py --backend cuda --device "${SAN_DEVICE:-0}" --repeat 1 --no-single \
    --sanitizer "$(echo $tools | tr ' ' ,)" 2>&1 | tee -a "$log"
fi
cp /tmp/rep-batch/conformance.md "$OUT/conformance.md" 2>/dev/null || true
