#!/usr/bin/env bash
# The split-KV verification still owed on the H200 (docs/conformance.md, "Split-KV kernels on
# the H200"), in one device call of at most 10 minutes: the build; the split goldens (both
# tiers) on every verify_attn kernel under --graph --invariance; compute-sanitizer's racecheck,
# synccheck and initcheck over them (wgmma and mma forced); then the split mutants of the GPU
# catalogue not judged yet, with whatever time is left (kdtr mutate --time-budget: the rest
# are NOT_RUN).  Logs and reports to $OUT (default ./h200-out).
#
#   bash tools/h200_split_verify.sh      (carry .whl and .cache/cutlass; KDTR_COMMIT=<sha> for the logs)
set -uo pipefail
OUT=${OUT:-h200-out}
mkdir -p "$OUT"
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s] $*" | tee -a "$OUT/split-verify.txt"; }
. "$(dirname "$0")/h200_env.sh"
el "commit ${KDTR_COMMIT:-unknown}; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1)"
make -j"$(nproc)" build > "$OUT/build.log" 2>&1 || { el "build failed"; tail -30 "$OUT/build.log"; exit 1; }
el "built: $(tail -1 "$OUT/build.log")"
timeout 170 python3 -m kdtr.cli run -j 8 --timeout 150 --backend cuda --require-backend cuda --tier all \
  --kernel verify_attn=auto,simt,mma,wgmma --only 'verify_attn/split_*' --graph --invariance \
  --report-dir /tmp/r-split > "$OUT/run-split.log" 2>&1
el "split goldens, every kernel, graph + invariance: exit $?: $(tail -2 "$OUT/run-split.log" | head -1)"
cp /tmp/r-split/conformance.md "$OUT/run-split.md" 2>/dev/null
for tool in racecheck synccheck initcheck; do
  timeout 100 python3 -m kdtr.cli run -j 8 --timeout 90 --backend cuda --require-backend cuda --sanitizer "$tool" \
    --kernel verify_attn=wgmma,mma --only 'verify_attn/split_*' --report-dir "/tmp/san-$tool" > "$OUT/san-$tool.log" 2>&1
  el "$tool over the committed split goldens (wgmma, mma): exit $?: $(tail -2 "$OUT/san-$tool.log" | head -1)"
done
left=$(( 570 - ($(date +%s) - start) ))
if [ "$left" -gt 120 ]; then
  MUTATE_S=$left BACKEND=cuda bash "$(dirname "$0")/h200_mutate.sh" --only 'gpu/split/*' \
    > "$OUT/mutate-split.txt" 2>&1
  el "split mutants: exit $?"
else
  el "no time left for the split mutants ($left s)"
fi
