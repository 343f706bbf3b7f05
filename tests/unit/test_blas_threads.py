"""kdtr pins BLAS to one thread when it is imported before numpy (kdtr/__init__.py): the
harness forks binaries from worker threads while other threads run reference matmuls, and
OpenBLAS's pre-fork handler deadlocked on that (`kdtr run --invariance`, 2026-12-03). A value
the user set is kept."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import REPO_ROOT

PROBE = "import kdtr, os; print(os.environ.get('OPENBLAS_NUM_THREADS'), os.environ.get('OMP_NUM_THREADS'))"


def _probe(env_extra: dict[str, str]) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    env.update(env_extra)
    env["PYTHONPATH"] = str(REPO_ROOT)
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_import_pins_blas_to_one_thread():
    assert _probe({}) == "1 1"


def test_a_value_the_user_set_is_kept():
    assert _probe({"OPENBLAS_NUM_THREADS": "4"}) == "4 1"
