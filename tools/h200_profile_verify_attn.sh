#!/usr/bin/env bash
# Nsight Compute profile of the bf16 verify_attn kernels at Kimi K2 dims on the H200 (one
# device call): builds kdtr_verify_attn (CUDA_ARCH 90, the Hopper kernel with the CUTLASS
# wheel carried in .cache/cutlass), writes bench/bench_verify_attn.py's K2 problem (B=8,
# T=65, H=64, Dqk=576, d_v=512, prefix 4096, random trees, seed 7) as an input-only golden,
# and profiles one launch of each of --kernel wgmma and --kernel mma: speed of light,
# compute and memory workload, scheduler and warp-state statistics, instruction mix, and
# the warp-stall reasons per issued instruction.  Clocks are left alone
# (--clock-control none).  Writes $OUT/ncu_<kernel>.txt and $OUT/profile.txt (the lines
# docs/ops/verify_attn.md quotes).
set -uo pipefail
OUT=${OUT:-h200-out}
mkdir -p "$OUT"
. "$(dirname "$0")/h200_env.sh"
BIN=build/bin/kdtr_verify_attn
make -j16 "$BIN" > "$OUT/profile_build.log" 2>&1 || { tail -20 "$OUT/profile_build.log"; exit 1; }
python3 - <<'PY' || exit 1
import sys
sys.path.insert(0, "bench")
import kdtr
from bench_verify_attn import Problem, synth
p = Problem(B=8, T=65, H=64, Dqk=576, d_v=512, prefix=4096, tree="random", seed=7)
x = synth(p, "bf16")
kdtr.save("/tmp/k2_bf16.kdtr", {f"input.{k}": v for k, v in x.items()}, {"op": "verify_attn", "config": "bench_k2_bf16"})
PY
: > "$OUT/profile.txt"
for k in wgmma mma; do
  timeout 300 ncu --clock-control none --launch-count 1 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section SchedulerStats --section WarpStateStats --section Occupancy --section InstructionStats \
    --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio \
    "$BIN" --input /tmp/k2_bf16.kdtr --output /tmp/k2_out.kdtr --backend cuda --kernel "$k" > "$OUT/ncu_$k.txt" 2>&1
  echo "== --kernel $k (ncu rc=$?)" >> "$OUT/profile.txt"
  grep -E "Duration|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|Issue Slots Busy|Executed Ipc Active|pipeline|Active Warps Per Scheduler|Eligible Warps|No Eligible|Warp Cycles Per Issued|L1/TEX Cache Throughput|L2 Cache Throughput|L2 Hit Rate|Registers Per Thread|Instructions Executed  " "$OUT/ncu_$k.txt" >> "$OUT/profile.txt"
  grep -E "stalled_.*_per_issue_active" "$OUT/ncu_$k.txt" | sort -k3 -g -r | head -8 >> "$OUT/profile.txt"
done
cat "$OUT/profile.txt"
