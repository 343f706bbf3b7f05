#!/usr/bin/env bash
# On the H200 device machine: build the C ABI (`make lib`: build/lib/libkdtr_kernels.so with
# the CUDA kernels and the CPU backends) and run tests/binaries/test_kernels_abi.py, whose CUDA tests
# put every committed golden through the CUDA entries with torch tensors (kdtr.kernels).
# Logs go to $OUT (default ./h200-out): env.txt, build.log, pytest.log, junit-kernels-abi.xml.
# The CUDA tests skip without torch + a CUDA device; here that is a failure (exit 1) unless
# KDTR_ALLOW_NO_TORCH=1.
set -uo pipefail
OUT=${OUT:-h200-out}
mkdir -p "$OUT"
. "$(dirname "$0")/h200_env.sh"
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  nvcc --version | tail -2
  python3 -c 'import numpy, ml_dtypes; print("numpy", numpy.__version__, "ml_dtypes", ml_dtypes.__version__)'
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")'
  git log --oneline -1 2>/dev/null
} 2>&1 | tee "$OUT/env.txt"

if ! python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "torch with a CUDA device is not available: the CUDA tests would skip" | tee -a "$OUT/env.txt"
  [[ "${KDTR_ALLOW_NO_TORCH:-0}" == 1 ]] || exit 1
fi

rm -rf build/lib build/obj/pic
make -j8 lib 2>&1 | tee "$OUT/build.log"
[[ ${PIPESTATUS[0]} == 0 ]] || exit 1
nm -D --defined-only build/lib/libkdtr_kernels.so | grep ' kdtr_' >> "$OUT/build.log"

python3 -m pytest -q -rs -p no:cacheprovider --junitxml="$OUT/junit-kernels-abi.xml" \
  tests/binaries/test_kernels_abi.py 2>&1 | tee "$OUT/pytest.log"
exit "${PIPESTATUS[0]}"
