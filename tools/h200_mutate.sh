#!/usr/bin/env bash
# `make mutate` on the device machine's CPU cores (docs/mutation.md): the same command
# (`kdtr mutate --generic`, catalogue + a sample of the generic pass), run through
# `python3 -m kdtr.cli` because that machine has no package index to build the venv
# from.  Python deps missing there (construct, universalmutator and its deps) come as
# wheels in .whl/.  Reports go to $OUT (default ./h200-out); extra arguments go to
# `kdtr mutate`.
set -uo pipefail
OUT=${OUT:-h200-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH COLUMNS=120 PYTHONUNBUFFERED=1
{ date -u; nproc; g++ --version | head -1; } 2>&1 | tee "$OUT/mutate-env.txt"
python3 -m kdtr.cli mutate --generic -j "$(nproc)" --report-dir "$OUT" "$@" 2>&1 | tee "$OUT/mutate.log"
exit "${PIPESTATUS[0]}"
