"""Goldens are a function of (config, seed) alone: regenerated in child processes whose numpy
has its SIMD dispatch narrowed to the baseline (NPY_DISABLE_CPU_FEATURES: every dispatch
target this CPU has above it, e.g. AVX2 / AVX-512, whose float64 exp and log differ in the
last bits from the baseline loops) and whose BLAS runs one thread, every committed golden
has the bytes of the committed file and of its manifest sha256, and every second-tier
golden its manifest sha256 (docs/harness.md, "Host independence of goldens").

Two children share the work (committed goldens; second tier), each single-threaded, so the
test costs about one regeneration of the second tier in wall time on two cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kdtr import goldens

CHILD = r"""
import json, sys, tempfile
from pathlib import Path
try:
    from numpy._core._multiarray_umath import __cpu_features__ as feats
except ImportError:  # numpy < 2
    from numpy.core._multiarray_umath import __cpu_features__ as feats
wanted = [f for f in sys.argv[2].split() if f]
still_on = [f for f in wanted if feats.get(f)]
from kdtr import goldens
from kdtr.generators import REGISTRY
tier = sys.argv[1]
out = {"still_on": still_on, "sha256": {}}
with tempfile.TemporaryDirectory() as tmp:
    for op, cfg in REGISTRY.all_configs():
        if (REGISTRY.tier_of(op, cfg) == "committed") != (tier == "committed"):
            continue
        _, entry = goldens.write_one(Path(tmp), REGISTRY, op, cfg)
        out["sha256"][f"{op}/{cfg}.kdtr"] = entry["sha256"]
print(json.dumps(out))
"""


def simd_above_baseline() -> list[str]:
    """numpy's dispatch targets that this CPU supports (those beyond the build's baseline)."""
    try:
        from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__
    except ImportError:  # numpy < 2
        from numpy.core._multiarray_umath import __cpu_dispatch__, __cpu_features__
    return [f for f in __cpu_dispatch__ if __cpu_features__.get(f)]


@pytest.mark.slow  # regenerates every golden in a child (about 20 s)
def test_every_golden_regenerates_bit_identically_with_narrowed_simd_and_one_blas_thread(repo_root):
    features = simd_above_baseline()
    env = dict(os.environ, NPY_DISABLE_CPU_FEATURES=" ".join(features), OPENBLAS_NUM_THREADS="1",
               OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(repo_root), *filter(None, [os.environ.get("PYTHONPATH")])]))
    kids = [subprocess.Popen([sys.executable, "-c", CHILD, tier, " ".join(features)], env=env, cwd=repo_root,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for tier in ("committed", "cache")]
    results = []
    for kid in kids:
        out, err = kid.communicate(timeout=900)  # a hang guard only
        assert kid.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    for res in results:
        assert res["still_on"] == [], f"NPY_DISABLE_CPU_FEATURES left {res['still_on']} on"
    manifest = goldens.read_manifest(repo_root / "golden")["files"]
    committed, second = results[0]["sha256"], results[1]["sha256"]
    assert committed and second
    assert set(committed) | set(second) == set(manifest)
    wrong = []
    for rel, sha in sorted(committed.items()):
        on_disk = goldens.sha256_of(repo_root / "golden" / rel)
        if not sha == on_disk == manifest[rel]["sha256"]:
            wrong.append(rel)
    wrong += [rel for rel, sha in sorted(second.items()) if sha != manifest[rel]["sha256"]]
    assert not wrong, f"regenerated with SIMD {features or '(none above baseline)'} off and one BLAS thread, " \
                      f"these differ from the committed bytes / manifest: {wrong}"
