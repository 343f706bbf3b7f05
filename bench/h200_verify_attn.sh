#!/usr/bin/env bash
# verify_attn on the H200 device machine, in one call: build (nvcc, sm_90), SASS summary,
# conformance of every verify_attn golden on both backends, the edge-case check on every
# kernel, the K2 benchmark, then compute-sanitizer (memcheck on every golden, racecheck
# and initcheck on small and K2 goldens, both kernels).  Logs go to $OUT (default
# ./h200-out); extra bench arguments: BENCH_ARGS.  Needs python3 with torch, numpy,
# ml_dtypes, click, rich; construct comes as a wheel in .whl/ (see docs/conformance.md).
set -uo pipefail
OUT=${OUT:-h200-out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1 && ! python3 -c 'import construct' 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
fi
export COLUMNS=160 PYTHONUNBUFFERED=1
BIN=build/bin/kdtr_verify_attn

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  nvcc --version | tail -2
  python3 -c 'import torch, numpy; print("torch", torch.__version__, "numpy", numpy.__version__)'
  make -j16 build/bin/kdtr_check "$BIN" 2>&1 || exit 1
  echo "--- SASS: instructions per kernel (HMMA, LDSM, FFMA, local memory LDL/STL)"
  cuobjdump --dump-sass "$BIN" | awk '
    /Function :/ { if (f) printf "%-60s HMMA %5d LDSM %5d FFMA %6d LDL/STL %d\n", f, h, l, m, s; f = $3; h = l = m = s = 0 }
    /HMMA/ { h++ } /LDSM/ { l++ } /FFMA/ { m++ } /LDL|STL/ { s++ }
    END { if (f) printf "%-60s HMMA %5d LDSM %5d FFMA %6d LDL/STL %d\n", f, h, l, m, s }' | sed 's/_ZN4kdtr[^ ]*verify_attn_\(simt\|mma\)_kernel/\1/'
} > "$OUT/build.log" 2>&1 || { cat "$OUT/build.log"; exit 1; }
tail -15 "$OUT/build.log"

timeout 200 python3 -m runners.cli run --only verify_attn -j 8 --timeout 120 > "$OUT/run.log" 2>&1
echo "runner rc=$?"; tail -16 "$OUT/run.log"

timeout 200 python3 bench/check_verify_attn.py --bin "$BIN" > "$OUT/check.log" 2>&1
echo "check rc=$?"; grep -v '^PASS\|^SKIP' "$OUT/check.log" | tail -20

timeout 240 python3 bench/bench_verify_attn.py --bin "$BIN" --out "$OUT/bench.md" ${BENCH_ARGS:-} > "$OUT/bench.log" 2>&1
echo "bench rc=$?"; grep -v '^|' "$OUT/bench.log" | tail -30; grep '^|' "$OUT/bench.log"

: > "$OUT/sanitizer.log"
fails=0
san() {  # tool golden kernel
  local extra=""
  [ "$1" = memcheck ] && extra="--leak-check full"
  local line
  line=$(timeout 120 compute-sanitizer --tool "$1" $extra --error-exitcode 99 "$BIN" --input "$2" --output /tmp/san.kdtr \
           --backend cuda --kernel "$3" 2>&1 | tail -1)
  local rc=${PIPESTATUS[0]}
  echo "$1 $(basename "$2" .kdtr) $3 rc=$rc :: $line" >> "$OUT/sanitizer.log"
  [ "$rc" = 0 ] || [ "$rc" = 3 ] || fails=$((fails + 1))
}
G=golden/verify_attn
for g in $G/*.kdtr; do san memcheck "$g" auto; done
san memcheck $G/small_bf16.kdtr simt
san memcheck $G/k2_dims_bf16.kdtr simt
san racecheck $G/small_bf16.kdtr auto
san racecheck $G/k2_dims_bf16.kdtr auto
san racecheck $G/k2_dims_bf16.kdtr simt
san racecheck $G/ragged.kdtr auto
san initcheck $G/k2_dims_bf16.kdtr auto
san initcheck $G/k2_dims_fp32.kdtr auto
echo "sanitizer failures: $fails" >> "$OUT/sanitizer.log"
cat "$OUT/sanitizer.log"
