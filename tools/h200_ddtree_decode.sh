#!/usr/bin/env bash
# ddtree_decode's CUDA decode loop on the H200 (docs/ops/ddtree_decode.md, docs/conformance.md
# "ddtree_decode on the H200"), in one device call of at most 10 minutes: the build (binaries
# and libkdtr_kernels.so); every ddtree_decode golden of both tiers on cuda with every
# verify_attn kernel forced, under --graph --invariance; the gpu-marked tests of the binary and
# of the torch decode (tests/unit/test_torch_decode.py: the loop through the torch ops on the
# GPU); compute-sanitizer memcheck, racecheck, initcheck and synccheck over the committed
# goldens; the decode's time per run (--repeat, stream-launched); then, with the time left,
# the decode loop's GPU mutants (mutants/gpu/decode.toml).  Logs to $OUT (default
# ./h200-out).
#
#   KDTR_COMMIT=<sha> bash tools/h200_ddtree_decode.sh   (carry .whl and .cache/cutlass)
set -uo pipefail
OUT=${OUT:-h200-out}
mkdir -p "$OUT"
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s] $*" | tee -a "$OUT/ddtree-decode.txt"; }
. "$(dirname "$0")/h200_env.sh"
el "commit ${KDTR_COMMIT:-unknown}; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1)"
make -j"$(nproc)" build lib > "$OUT/build.log" 2>&1 || { el "build failed"; tail -30 "$OUT/build.log"; exit 1; }
el "built: $(tail -1 "$OUT/build.log")"
timeout 170 python3 -m kdtr.cli run -j 8 --timeout 150 --backend cuda --backend cpu --require-backend cuda \
  --tier all --only ddtree_decode --kernel ddtree_decode=auto,simt,mma,wgmma --graph --invariance \
  --report-dir /tmp/r-dd > "$OUT/run-ddtree.log" 2>&1
el "ddtree_decode, both tiers, every kernel, graph + invariance: exit $?: $(tail -2 "$OUT/run-ddtree.log" | head -1)"
cp /tmp/r-dd/conformance.md "$OUT/run-ddtree.md" 2>/dev/null
# the tests and the four sanitizer sweeps at once (the GPU has room for all of them)
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/binaries/test_ddtree_decode_binary.py \
  tests/unit/test_torch_decode.py > "$OUT/pytest-gpu.log" 2>&1 &
for tool in memcheck racecheck initcheck synccheck; do
  timeout 150 python3 -m kdtr.cli run -j 2 --timeout 140 --backend cuda --require-backend cuda --sanitizer "$tool" \
    --only ddtree_decode --kernel ddtree_decode=auto,mma --report-dir "/tmp/san-$tool" > "$OUT/san-$tool.log" 2>&1 &
done
wait
el "pytest -m gpu (binary, torch decode): $(tail -1 "$OUT/pytest-gpu.log")"
for tool in memcheck racecheck initcheck synccheck; do
  el "$tool over the committed ddtree_decode goldens (auto, mma): $(tail -2 "$OUT/san-$tool.log" | head -1)"
done
for g in golden/ddtree_decode/batch.kdtr golden/.cache/ddtree_decode/k2_dims.kdtr; do
  [ -f "$g" ] || continue
  r=$(build/bin/kdtr_ddtree_decode --input "$g" --output /tmp/dd-t.kdtr --backend cuda --repeat 50 2>&1 | tail -1)
  el "time $(basename "$g") (the whole decode, stream-launched, --repeat 50): $r"
done
left=$(( 570 - ($(date +%s) - start) ))
if [ "$left" -gt 90 ]; then
  MUTATE_S=$left BACKEND=cuda bash "$(dirname "$0")/h200_mutate.sh" --only 'gpu/decode/*' > "$OUT/mutate-decode.txt" 2>&1
  el "decode-loop mutants (mutants/gpu/decode.toml): exit $?: $(grep -E 'all' "$OUT/mutate-decode.txt" | head -2 | tr -s ' ')"
else
  el "no time left for the decode-loop mutants ($left s)"
fi
