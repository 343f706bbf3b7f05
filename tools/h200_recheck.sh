#!/usr/bin/env bash
# Re-check on the H200 device machine after a change of goldens or harness (docs/conformance.md):
#   STEP=check (default): tools/h200_conformance.sh (build, every golden of both tiers on both
#     backends, compute-sanitizer memcheck), every verify_attn/greedy_step golden through each
#     verify_attn kernel and every tree_build golden through each tree_build kernel (`kdtr run
#     --kernel`; NOT_SUPPORTED where a kernel does not apply, as wgmma to f32; the select build's
#     heap fallbacks in each case's detail), `kdtr regen --check` on this host's numpy, and
#     the host-independence and bf16-rounding tests;
#   STEP=mutate: the mutant catalogue (`kdtr mutate`, as .ci/run) on all CPU cores;
#   STEP=engine: the engine conditions (docs/harness.md "Graph replay" and "Invariance"):
#     every golden of both tiers under `kdtr run --graph --invariance` through every kernel
#     of every op, then the same under compute-sanitizer memcheck, then the GPU tests of the
#     torch ops and the device-side checks (pytest -m gpu), then bench/bench_bindings.py.
# Everything goes to one tarball $OUT/recheck-<step>.tgz and a summary $OUT/summary-<step>.txt
# (the device returns at most 8 files).  Python deps missing there come as wheels in .whl/, the
# CUTLASS wheel in .cache/cutlass/.
set -uo pipefail
OUT=${OUT:-h200-out}
STEP=${STEP:-check}
W=/tmp/recheck-$STEP
mkdir -p "$OUT" "$W"
. "$(dirname "$0")/h200_env.sh"
sum="$OUT/summary-$STEP.txt"
: > "$sum"
note() { echo "$*" | tee -a "$sum"; }
if [ "$STEP" = check ]; then
  OUT=$W/conf KDTR_TIER=all SANITIZER_TOOLS=memcheck bash tools/h200_conformance.sh > "$W/conformance.log" 2>&1
  note "h200_conformance: exit $?; $(grep -E '^PASS|^[A-Z_]+ [0-9]' "$W/conf/run.log" | tail -1)"
  grep -E 'memcheck: ' "$W/conf/"sanitizer-*.log | tail -1 | tee -a "$sum"
  # every golden (both tiers) of the ops with a kernel choice through each kernel, forced
  # (kdtr run --kernel: op/config@cuda:K cases); auto and simt apply to every golden
  # (--require-backend cuda: NOT_SUPPORTED is a failure), mma and wgmma not to f32 ones
  python3 -m kdtr.cli run --backend cuda --require-backend cuda --tier all --timeout 600 --report-dir "$W/kernels-always" \
    --only verify_attn --only greedy_step --only tree_build \
    --kernel verify_attn=auto,simt --kernel greedy_step=auto,simt --kernel tree_build=all > "$W/kernels-always.log" 2>&1
  note "kdtr run --kernel auto,simt + tree_build=all: exit $?; $(grep -E '^PASS|^[A-Z_]+ [0-9]' "$W/kernels-always.log" | tail -1)"
  python3 -m kdtr.cli run --backend cuda --tier all --timeout 600 --report-dir "$W/kernels-tc" \
    --only verify_attn --only greedy_step --kernel verify_attn=mma,wgmma --kernel greedy_step=mma,wgmma \
    > "$W/kernels-tc.log" 2>&1
  note "kdtr run --kernel mma,wgmma: exit $?; $(grep -E '^PASS|^[A-Z_]+ [0-9]' "$W/kernels-tc.log" | tail -1)"
  python3 -m kdtr.cli regen --check > "$W/regen_check.log" 2>&1
  note "regen --check: exit $?; $(tail -1 "$W/regen_check.log"); $(python3 -c 'import numpy, ml_dtypes, platform; print("numpy", numpy.__version__, "ml_dtypes", ml_dtypes.__version__, "python", platform.python_version(), platform.machine())')"
  python3 -m pytest -q -p no:cacheprovider tests/harness/test_host_independence.py tests/unit/test_bf16.py > "$W/pytest.log" 2>&1
  note "pytest host-independence + bf16: exit $?; $(tail -1 "$W/pytest.log")"
elif [ "$STEP" = engine ]; then
  # each step bounded (ENGINE_STEP_S seconds) so that one slow step still leaves the others' results
  lim=${ENGINE_STEP_S:-170}
  make -j"$(nproc)" build lib > "$W/build.log" 2>&1
  note "build: exit $?; $(tail -1 "$W/build.log")"
  K=(--kernel verify_attn=auto,simt,mma,wgmma --kernel greedy_step=auto,simt,mma,wgmma --kernel tree_build=auto,heap,select)
  timeout "$lim" python3 -m kdtr.cli run --graph --invariance --backend cuda --timeout 300 --report-dir "$W/engine" \
    "${K[@]}" > "$W/engine.log" 2>&1
  note "kdtr run --graph --invariance, every kernel: exit $?; $(grep -E '^PASS|^[A-Z_]+ [0-9]' "$W/engine.log" | tail -1)"
  grep -E '^(NOT_INVARIANT|MISMATCH|CRASH|ERROR|TIMEOUT) ' "$W/engine.log" | head -20 >> "$sum"
  timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests > "$W/pytest-gpu.log" 2>&1
  note "pytest -m gpu: exit $?; $(tail -1 "$W/pytest-gpu.log")"
  grep -E '^(FAILED|ERROR) ' "$W/pytest-gpu.log" | head -10 >> "$sum"
  timeout 90 python3 bench/bench_bindings.py > "$OUT/bench_bindings.log" 2>&1
  note "bench_bindings: exit $?"
  timeout "$lim" python3 -m kdtr.cli run --graph --invariance --backend cuda --sanitizer memcheck --timeout 300 \
    --report-dir "$W/engine-memcheck" "${K[@]}" > "$W/engine-memcheck.log" 2>&1
  note "kdtr run --graph --invariance --sanitizer memcheck: exit $?; $(grep -E '^PASS|^[A-Z_]+ [0-9]' "$W/engine-memcheck.log" | tail -1)"
  grep -E '^(NOT_INVARIANT|MISMATCH|CRASH|ERROR|TIMEOUT) ' "$W/engine-memcheck.log" | head -20 >> "$sum"
  for f in engine engine-memcheck pytest-gpu; do gzip -c "$W/$f.log" > "$OUT/$f.log.gz"; done
  cp "$W/engine/conformance.md" "$OUT/engine-conformance.md" 2>/dev/null
  cp "$W/engine-memcheck/conformance.md" "$OUT/engine-memcheck-conformance.md" 2>/dev/null
  cat "$sum"
  exit 0
else
  { date -u; nproc; g++ --version | head -1; } > "$W/mutate-env.txt" 2>&1
  python3 -m kdtr.cli mutate -j "$(nproc)" --report-dir "$W/mutation" > "$W/mutate.log" 2>&1
  note "kdtr mutate: exit $?; $(grep -iE 'killed|surviv|score' "$W/mutate.log" | tail -3)"
fi
tar czf "$OUT/recheck-$STEP.tgz" -C "$W" .
cat "$sum"
