#!/usr/bin/env bash
# Mutation runs on the device machine (docs/mutation.md), through `python3 -m kdtr.cli`
# because that machine has no package index to build the venv from; Python deps missing
# there (construct, universalmutator and its deps) come as wheels in .whl/.  Reports go to
# $OUT (default ./h200-out); extra arguments go to `kdtr mutate`.
#
#   bash tools/h200_mutate.sh               `make mutate` on the CPU cores: kdtr mutate --generic
#   BACKEND=cuda bash tools/h200_mutate.sh  the GPU catalogue (mutants/gpu/): make -j$(nproc) build,
#                                           then kdtr mutate --backend cuda -j $(nproc); the whole
#                                           script bounded by MUTATE_S seconds (default 540: one
#                                           device call of at most 10 min, the build included):
#                                           kdtr gets --time-budget (what is left - 30 s), so it
#                                           writes its report (mutants not judged: NOT_RUN)
#
# BACKEND=cuda writes four plain files to $OUT: mutate-env.txt (date, machine, GPU, nvcc,
# compute-sanitizer, the build's last lines and seconds), mutate.log.gz (kdtr mutate's
# output), mutation.json and mutation.md (copies of the report set, which kdtr writes as
# links: the device machine returns plain files only).
set -uo pipefail
OUT=${OUT:-h200-out}
mkdir -p "$OUT"
if [ "${BACKEND:-cpu}" = cuda ]; then
  start=$(date +%s)
  . "$(dirname "$0")/h200_env.sh"
  {
    date -u
    echo "nproc $(nproc)"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    nvcc --version | tail -2
    compute-sanitizer --version | tail -1
    g++ --version | head -1
  } > "$OUT/mutate-env.txt" 2>&1
  make -j"$(nproc)" build > /tmp/h200-mutate-build.log 2>&1
  rc=$?
  { echo "make -j$(nproc) build: exit $rc, $(( $(date +%s) - start )) s since the start"; tail -n 5 /tmp/h200-mutate-build.log; } \
    >> "$OUT/mutate-env.txt"
  if [ "$rc" != 0 ]; then
    gzip -c /tmp/h200-mutate-build.log > "$OUT/mutate.log.gz"
    exit "$rc"
  fi
  left=$(( ${MUTATE_S:-540} - ($(date +%s) - start) ))
  [ "$left" -lt 90 ] && left=90
  budget=$(( left - 30 ))
  echo "kdtr mutate --backend cuda: --time-budget $budget, killed at $left s" >> "$OUT/mutate-env.txt"
  rdir=/tmp/h200-mutate-reports
  rm -rf "$rdir"  # a warm machine's earlier run: never copy its reports as this run's
  # --time-budget: kdtr stops what still runs, reports it NOT_RUN and writes the report;
  # the timeout is the backstop (SIGTERM: kdtr kills its builds and binaries, exits 143, no report)
  timeout --kill-after=20 "$left" python3 -m kdtr.cli mutate --backend cuda -j "$(nproc)" --time-budget "$budget" \
    --report-dir "$rdir" "$@" > /tmp/h200-mutate.log 2>&1
  rc=$?
  echo "kdtr mutate: exit $rc, $(( $(date +%s) - start )) s since the start" >> "$OUT/mutate-env.txt"
  gzip -c /tmp/h200-mutate.log > "$OUT/mutate.log.gz"
  for f in mutation.json mutation.md; do
    [ -e "$rdir/$f" ] && cp -L "$rdir/$f" "$OUT/$f"
  done
  tail -n 40 /tmp/h200-mutate.log
  exit "$rc"
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH COLUMNS=120 PYTHONUNBUFFERED=1
{ date -u; nproc; g++ --version | head -1; } 2>&1 | tee "$OUT/mutate-env.txt"
python3 -m kdtr.cli mutate --generic -j "$(nproc)" --report-dir "$OUT" "$@" 2>&1 | tee "$OUT/mutate.log"
exit "${PIPESTATUS[0]}"
