#!/usr/bin/env bash
# The seesaw variant of the Hopper verify_attn kernel (docs/notes/wgmma-seesaw.patch) beside the kernel it
# was cut from, on the H200 (docs/benchmarks.md, "Variants of the Hopper kernel tried on the way").
#
#   bash tools/seesaw_variants.sh prepare   here (needs git): .devscratch/seesaw/ = the aba1b61 tree (the
#                                           kernel sources of bb46806 and a Makefile that builds the sm_90a
#                                           object) and three copies of verify_attn_sm90.cu: base (v5, as
#                                           committed then), bug (s3 as first written: the patch of c5bb078)
#                                           and fix (s3 + the producer's __syncwarp, the patch of HEAD)
#   bash tools/seesaw_variants.sh device    on the device machine (carry .devscratch, .cache/cutlass, .whl):
#                                           builds the three trees in parallel, then tools/seesaw_check.py
#                                           compares them on K2-shaped problems (L from 126 to 4161) and on
#                                           that tree's bf16 verify_attn goldens; results in $OUT
set -uo pipefail
D=.devscratch/seesaw
case "${1:-}" in
  prepare)
    rm -rf "$D" && mkdir -p "$D" || exit 1
    git archive aba1b61 | tar -x -C "$D" --one-top-level=ss && rm -rf "$D/ss/docs" "$D/ss/tests" || exit 1
    # only the verify_attn goldens are used (and the carry to the device is limited to 64 MiB)
    find "$D/ss/golden" -mindepth 1 -maxdepth 1 -type d ! -name verify_attn -exec rm -rf {} + || exit 1
    # aba1b61's binary takes --kernel auto|simt|mma only (wgmma came with 4de5990); its launcher
    # already handles VerifyAttnKernel::Wgmma, so the option is added to the command line
    t="$D/ss/cuda_tests/tests/test_verify_attn.cu"
    sed -i -e 's/if (k != "auto" \&\& k != "simt" \&\& k != "mma")/if (k != "auto" \&\& k != "simt" \&\& k != "mma" \&\& k != "wgmma")/' \
      -e 's/^\( *\): kernel == "mma" ? VerifyAttnKernel::Mma$/&\n\1: kernel == "wgmma" ? VerifyAttnKernel::Wgmma/' "$t" || exit 1
    grep -q 'kernel == "wgmma" ? VerifyAttnKernel::Wgmma' "$t" && grep -q 'k != "wgmma"' "$t" || { echo "patching $t failed" >&2; exit 1; }
    cp "$D/ss/cuda_tests/kernels/verify_attn_sm90.cu" "$D/sm90_base.cu"
    for v in bug fix; do
      rev=$([ $v = bug ] && echo c5bb078 || echo HEAD)
      rm -rf /tmp/seesaw-$v && mkdir -p /tmp/seesaw-$v && git archive aba1b61 cuda_tests | tar -x -C /tmp/seesaw-$v &&
        git show "$rev:docs/notes/wgmma-seesaw.patch" | (cd /tmp/seesaw-$v && patch -p0 -s) &&
        cp /tmp/seesaw-$v/cuda_tests/kernels/verify_attn_sm90.cu "$D/sm90_$v.cu" || exit 1
    done
    du -sh "$D" ;;
  device|device-build|device-check)
    OUT=${OUT:-h200-out}; mkdir -p "$OUT"
    . "$(dirname "$0")/h200_env.sh"
    R=$PWD
    if [ "$1" != device-check ]; then
      for v in base bug fix; do
        rm -rf /tmp/ss-$v && cp -r "$D/ss" /tmp/ss-$v && cp "$D/sm90_$v.cu" /tmp/ss-$v/cuda_tests/kernels/verify_attn_sm90.cu
        ln -sfn "$R/.cache" /tmp/ss-$v/.cache
        (cd /tmp/ss-$v && KDTR_CRC=zlib make -j3 build/bin/kdtr_verify_attn > "$OUT/seesaw-build-$v.log" 2>&1
         echo "exit $?" >> "$OUT/seesaw-build-$v.log") &
      done
      wait
      for v in base bug fix; do echo "seesaw build $v: $(tail -n 1 "$OUT/seesaw-build-$v.log")"; done
    fi
    if [ "$1" != device-build ]; then
      PYTHONPATH=/tmp/site:/tmp/ss-base timeout "${SEESAW_S:-300}" python3 tools/seesaw_check.py /tmp/ss-base base,bug,fix \
        2>&1 | tee "$OUT/seesaw-check.txt"
    fi ;;
  *) echo "usage: $0 prepare|device|device-build|device-check" >&2; exit 2 ;;
esac
