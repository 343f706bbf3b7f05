#!/usr/bin/env bash
# The split-KV combine on the H200, in one device call: the combine kernel with one memory
# round trip and programmatic dependent launch (PDL) beside the kernels of the commit before
# it, then its correctness.  Logs to $OUT (default ./h200-out).  KDTR_STEPS picks steps
# (default "build bench check seesaw"):
#   build    in parallel: this tree (make build lib); .devscratch/old (the tree before, a
#            `git archive` prepared here: kdtr_verify_attn only); this tree with
#            -DKDTR_VERIFY_ATTN_NO_PDL (the new combine without PDL); the seesaw trees
#            (tools/seesaw_variants.sh device-build) when "seesaw" is a step
#   bench    bench/bench_verify_attn_split.py --graph at POINTS on the three binaries
#   check    kdtr run --tier all, verify_attn (every kernel) and ddtree_decode, --graph --invariance
#   sanitize racecheck, memcheck, synccheck, initcheck over the split goldens (wgmma, mma)
#   seesaw   tools/seesaw_check.py on the seesaw builds (SEESAW_S seconds)
#   profile  ncu --section SpeedOfLight of both split kernels, B=1, T=9, prefix 4096
#   sweep    bench/bench_verify_attn_split.py over its default grid (SWEEP_S seconds)
#
#   bash tools/h200_split_combine.sh   (carry .whl, .cache/cutlass, .devscratch; KDTR_COMMIT=<sha>)
set -uo pipefail
OUT=${OUT:-h200-out}
mkdir -p "$OUT"
start=$(date +%s)
STEPS=${KDTR_STEPS:-build bench check seesaw}
has() { [[ " $STEPS " == *" $1 "* ]]; }
el() { echo "[$(( $(date +%s) - start )) s] $*" | tee -a "$OUT/split-combine.txt"; }
. "$(dirname "$0")/h200_env.sh"
R=$PWD
POINTS=${POINTS:-"1,9,4096;1,9,16384;1,65,16384;2,33,16384;8,65,4096;1,9,1024;64,9,1024"}
el "commit ${KDTR_COMMIT:-unknown}; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1)"
if has build; then
  (make -j8 ${BUILD_TARGETS:-build lib} > "$OUT/build.log" 2>&1; echo "exit $?" >> "$OUT/build.log") &
  rm -rf /tmp/b-old /tmp/b-nopdl && cp -r .devscratch/old /tmp/b-old && mkdir -p /tmp/b-nopdl &&
    cp -r Makefile cuda_tests tools /tmp/b-nopdl/ && ln -sfn "$R/.cache" /tmp/b-old/.cache && ln -sfn "$R/.cache" /tmp/b-nopdl/.cache
  (cd /tmp/b-old && KDTR_CRC=zlib make -j3 build/bin/kdtr_verify_attn > "$OUT/build-old.log" 2>&1; echo "exit $?" >> "$OUT/build-old.log") &
  (cd /tmp/b-nopdl && KDTR_CRC=zlib make -j3 NVCCFLAGS="-O2 -DKDTR_VERIFY_ATTN_NO_PDL" build/bin/kdtr_verify_attn \
     > "$OUT/build-nopdl.log" 2>&1; echo "exit $?" >> "$OUT/build-nopdl.log") &
  has seesaw && { bash tools/seesaw_variants.sh device-build > "$OUT/seesaw-builds.txt" 2>&1 & }
  wait
  for f in "$OUT"/build*.log; do el "$(basename "$f"): $(tail -1 "$f")"; done
  grep -h "exit" "$OUT/seesaw-builds.txt" 2>/dev/null | tee -a "$OUT/split-combine.txt"
fi
if has bench; then
  CEIL=$(python3 -c "import sys; sys.path.insert(0, 'bench'); import bench_verify_attn_split as b; t, g = b.ceilings(); print(f'{t:.1f},{g:.0f}')")
  el "ceilings (bf16 TFLOP/s, copy GB/s): $CEIL"
  for v in ${BENCH_VARIANTS:-old nopdl new}; do
    bin=build/bin/kdtr_verify_attn; [ $v != new ] && bin=/tmp/b-$v/build/bin/kdtr_verify_attn
    timeout 150 python3 bench/bench_verify_attn_split.py --bin "$bin" --label "$v" --points "$POINTS" --graph \
      --ceilings "$CEIL" --out "$OUT/bench-points.md" 2>&1 | tail -30
    el "bench $v: exit ${PIPESTATUS[0]}"
  done
fi
if has check; then
  timeout 200 python3 -m kdtr.cli run -j 8 --timeout 180 --backend cuda --require-backend cuda --tier all \
    --kernel verify_attn=auto,simt,mma,wgmma --kernel ddtree_decode=auto,simt,mma,wgmma \
    --only verify_attn --only ddtree_decode --graph --invariance --report-dir /tmp/r-check > "$OUT/check.log" 2>&1
  el "verify_attn + ddtree_decode, every kernel, graph + invariance: exit $?: $(tail -3 "$OUT/check.log" | tr '\n' ' ')"
  grep -E "FAIL|NOT_INVARIANT|ERROR|TIMEOUT|CRASH" /tmp/r-check/conformance.md | head -20
fi
if has sanitize; then
  for tool in racecheck memcheck synccheck initcheck; do
    timeout 100 python3 -m kdtr.cli run -j 8 --timeout 90 --backend cuda --require-backend cuda --sanitizer "$tool" \
      --kernel verify_attn=wgmma,mma --only 'verify_attn/split_*' --report-dir "/tmp/san-$tool" > "$OUT/san-$tool.log" 2>&1
    el "$tool over the split goldens (wgmma, mma): exit $?: $(tail -2 "$OUT/san-$tool.log" | head -1)"
  done
fi
if has seesaw; then
  SEESAW_S=${SEESAW_S:-150} bash tools/seesaw_variants.sh device-check 2>&1 | tail -60
  el "seesaw check done"
fi
if has profile; then
  python3 bench/bench_verify_attn_split.py --points 1,9,4096 --ceilings 1,1 --write-input /tmp/p1_9_4096.kdtr
  ls /tmp/p1_9_4096.kdtr >/dev/null 2>&1 && for k in wgmma mma; do
    timeout 60 ncu --section SpeedOfLight --section LaunchStats --section Occupancy build/bin/kdtr_verify_attn \
      --input /tmp/p1_9_4096.kdtr --output /tmp/ncu.kdtr --backend cuda --kernel $k 2>&1 |
      grep -E "verify_attn|Duration|Throughput|Registers|Grid Size|Achieved Occ|Block Limit" | tee -a "$OUT/ncu.txt"
  done
fi
if has sweep; then
  SWEEP_S=${SWEEP_S:-$(( ${DEADLINE:-560} - ($(date +%s) - start) - 40 ))}
  el "sweep for $SWEEP_S s"
  timeout $(( ${SWEEP_S:-300} + 60 )) python3 bench/bench_verify_attn_split.py --graph --time-budget "${SWEEP_S:-300}" \
    --label "split-KV, PDL combine" --out "$OUT/sweep.md" 2>&1 | tail -12
  el "sweep done"
fi
el "end"
