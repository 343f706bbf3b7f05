#!/usr/bin/env bash
# On the H200 device machine: tree_build's build kernels (heap, select) checked
# and measured.  Logs go to $OUT (default ./h200-out).  Python deps missing there come as
# wheels in .whl/.  KDTR_STEPS (default "build check sanitize profile bench") picks steps, run in this order:
#   build     make clean; make the tree_build and greedy_step binaries with nvcc
#             (BUILD_TARGETS: other make targets instead, e.g. "build lib", which the
#             pytest step needs; $NVCCFLAGS as the Makefile reads it)
#   oldbuild  a second kdtr_tree_build in /tmp/kdtr-old (a copy of Makefile and
#             cuda_tests/) built with OLD_NVCCFLAGS (default -O2: the default kernels) and,
#             if OLD_SRC names a folder, its tree_build* files over the kernels' -- for a
#             before/after bench in one call
#   check     `kdtr run --require-backend cuda` on the tree_build and greedy_step goldens
#             (--kernel auto), then every tree_build golden through both kernels on cuda,
#             each output judged against the golden (kdtr run --kernel tree_build=all)
#   pytest    python3 -m pytest -m gpu tests -k tree_build (the property tests on cuda)
#   (profile and bench run before sanitize and mutate, the long steps, see below)
#   sanitize  compute-sanitizer SANITIZER_TOOLS (default memcheck racecheck initcheck) on
#             every tree_build golden, SANITIZER_KERNELS (default "select heap"), 8 at once
#   mutate    tools/h200_mutate.sh with BACKEND=cuda over MUTANTS (globs, e.g.
#             "gpu/select/sort_*"), MUTATE_S seconds
#   profile   Nsight Compute (NCU_SECTIONS) on PROFILE_KERNELS for PROFILE_CONFIGS (B:N)
#   bench     python3 bench/bench_tree_build.py (BENCH_ARGS) --out $OUT/bench.md; with
#             oldbuild done, the same for the old binary first (--out $OUT/bench-old.md)
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

t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$OUT/steps.txt"; }
if has build; then
  make clean >/dev/null
  make -j16 ${BUILD_TARGETS:-build/bin/kdtr_tree_build build/bin/kdtr_greedy_step build/bin/kdtr_check} \
    > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
  cuobjdump -res-usage build/bin/kdtr_tree_build 2>&1 | grep -A1 -i "tree_build" >> "$OUT/build.log" || true
  stamp build
fi
OLD_BIN=/tmp/kdtr-old/build/bin/kdtr_tree_build
if has oldbuild; then
  rm -rf /tmp/kdtr-old && mkdir -p /tmp/kdtr-old
  cp -r Makefile cuda_tests /tmp/kdtr-old/
  [ -n "${OLD_SRC:-}" ] && cp "$OLD_SRC"/tree_build* /tmp/kdtr-old/cuda_tests/kernels/
  NVCCFLAGS="${OLD_NVCCFLAGS:--O2}" make -C /tmp/kdtr-old -j16 build/bin/kdtr_tree_build > "$OUT/oldbuild.log" 2>&1 ||
    { tail -30 "$OUT/oldbuild.log"; exit 1; }
  stamp oldbuild
fi
if has check; then
  python3 -m kdtr.cli run -j 8 --timeout 300 --require-backend cuda --tier all --only tree_build --only greedy_step \
    2>&1 | tail -25 > "$OUT/run.log"
  cp reports/conformance.md "$OUT/conformance.md"
  # every tree_build golden through both kernels; each case's detail: the kernel that ran
  # and the requests the select build handed to the heap build (select_fallbacks)
  python3 -m kdtr.cli run --backend cuda --only tree_build --kernel tree_build=all --report-dir "$OUT/kernels" \
    2>&1 | tail -40 > "$OUT/kernels.log"
  tail -8 "$OUT/run.log"; tail -12 "$OUT/kernels.log"
  stamp check
fi
if has pytest; then
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests -k tree_build 2>&1 | tail -15 | tee "$OUT/pytest.log"
  stamp pytest
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
      sections=()
      for sec in ${NCU_SECTIONS:-SpeedOfLight LaunchStats Occupancy WarpStateStats SchedulerStats MemoryWorkloadAnalysis}; do
        sections+=(--section "$sec")
      done
      ncu --clock-control none "${sections[@]}" -k regex:tree_build \
          build/bin/kdtr_tree_build --input /tmp/tb_b${b}_n${n}.kdtr --output /tmp/prof.kdtr --backend cuda \
          --kernel $kernel >> "$OUT/ncu.txt" 2>&1
    done
  done
  grep -E "^===|tree_build_.*kernel|Duration|Registers Per|Compute \(SM\) Throughput|Memory Throughput|Block Size|Dynamic Shared" \
    "$OUT/ncu.txt" | head -60
  stamp profile
fi
if has bench; then
  if [ -x "$OLD_BIN" ]; then
    python3 bench/bench_tree_build.py --binary "$OLD_BIN" ${BENCH_OLD_ARGS:-${BENCH_ARGS:-}} --out "$OUT/bench-old.md" \
      > "$OUT/bench-old.log" 2>&1
    grep -E "^\| [0-9]|MISSED|met" "$OUT/bench-old.log"
    stamp bench-old
  fi
  python3 bench/bench_tree_build.py ${BENCH_ARGS:-} --out "$OUT/bench.md" > "$OUT/bench.log" 2>&1
  grep -E "^\| [0-9]|MISSED|met|Same GPU|DIFFERENT|differs" "$OUT/bench.log"
  stamp bench
fi
if has sanitize; then
  san_log="$OUT/sanitizer.log"
  : > "$san_log"
  fails=0
  san_one() {  # tool kernel golden -> one line
    local extra="" out="/tmp/san.$1.$2.$(basename "$3" .kdtr).kdtr" line rc
    [ "$1" = memcheck ] && extra="--leak-check full"
    line=$(compute-sanitizer --tool "$1" $extra --error-exitcode 99 build/bin/kdtr_tree_build --input "$3" \
             --output "$out" --backend cuda --kernel "$2" 2>&1 | tail -1)
    rc=${PIPESTATUS[0]}
    echo "$1 $2 tree_build/$(basename "$3" .kdtr) rc=$rc :: $line"
  }
  export -f san_one
  for tool in ${SANITIZER_TOOLS:-memcheck racecheck initcheck}; do
    for kernel in ${SANITIZER_KERNELS:-select heap}; do
      for golden in golden/tree_build/*.kdtr; do echo "$tool $kernel $golden"; done
    done
  done | xargs -P 8 -n 3 bash -c 'san_one "$0" "$1" "$2"' >> "$san_log"
  fails=$(grep -vc " rc=0 " "$san_log")
  echo "sanitizer failures: $fails (of $(wc -l < "$san_log") runs)" | tee -a "$san_log"
  grep -v " rc=0 \|^sanitizer failures" "$san_log" | head -20
  stamp sanitize
fi
if has mutate; then
  only=()
  set -f  # the globs are kdtr mutate's, not the shell's
  for m in ${MUTANTS:-gpu/select/*}; do only+=(--only "$m"); done
  set +f
  # MUTATE_ARGS: more kdtr mutate options, e.g. --catalogue-dir DIR (a copy of mutants/gpu)
  OUT="$OUT" BACKEND=cuda MUTATE_S=${MUTATE_S:-200} bash "$(dirname "$0")/h200_mutate.sh" "${only[@]}" \
    ${MUTATE_ARGS:-} 2>&1 | tail -30
  stamp mutate
fi
# COLLECT=DIR: the few files the device machine returns (at most 8), copied from $OUT:
# check.txt (steps, build tail, kdtr run, pytest), sanitizer.log, ncu.txt, mutation.md,
# bench.md, bench-old.md.
if [ -n "${COLLECT:-}" ]; then
  mkdir -p "$COLLECT"
  { cat "$OUT/env.txt" "$OUT/steps.txt"; tail -5 "$OUT/build.log"; grep -A1 -i "select\|kernel" "$OUT/build.log" | grep -i "REG\|Function" | head -20
    for f in run.log kernels.log pytest.log mutate-env.txt; do [ -f "$OUT/$f" ] && { echo "== $f"; cat "$OUT/$f"; }; done
  } > "$COLLECT/check.txt" 2>&1
  for f in sanitizer.log ncu.txt mutation.md bench.md bench-old.md bench.log; do
    [ -f "$OUT/$f" ] && cp "$OUT/$f" "$COLLECT/$f"
  done
fi
