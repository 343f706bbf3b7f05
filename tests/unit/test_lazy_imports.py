"""ml_dtypes (more than a second of CPU to import) is imported only where bf16 is touched:
not by ``import kdtr`` or the CLI, not by ``kdtr --help``, ``kdtr list`` or a run of
integer goldens; reading or writing a bf16 tensor still gives ``ml_dtypes.bfloat16``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import op_binary

HANG_GUARD = 120  # seconds: a hang guard for a fresh interpreter, never a verdict


def _python(repo_root, code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(repo_root))
    return subprocess.run([sys.executable, "-c", code], cwd=repo_root, env=env, capture_output=True, text=True,
                          timeout=HANG_GUARD)


def _cli(args: list[str]) -> str:
    """Code that runs the CLI in-process; the command's exit code must be 0."""
    return ("from kdtr.cli.main import main\n"
            "try:\n"
            f"    rc = main({args!r}, standalone_mode=False)\n"
            "except SystemExit as e:\n"
            "    rc = e.code\n"
            "assert rc in (0, None), rc")


def _no_ml_dtypes_after(repo_root, code: str) -> None:
    r = _python(repo_root, "import sys\n" + code + "\nassert 'ml_dtypes' not in sys.modules, 'ml_dtypes imported'\n"
                "print('lazy')")
    assert r.returncode == 0 and r.stdout.strip().endswith("lazy"), r.stdout + r.stderr


def test_importing_kdtr_and_the_cli_does_not_import_ml_dtypes(repo_root):
    _no_ml_dtypes_after(
        repo_root, "import kdtr, kdtr.cli.main, kdtr.run, kdtr.report, kdtr.goldens, kdtr.generators"
    )


@pytest.mark.parametrize("args", [["--help"], ["list"], ["run", "--help"]])
def test_help_and_list_do_not_import_ml_dtypes(repo_root, args):
    _no_ml_dtypes_after(repo_root, _cli(args))


def test_a_run_of_integer_goldens_does_not_import_ml_dtypes(repo_root, tmp_path):
    op_binary("tree_accept")  # fails (never skips) when the build is missing
    args = ["run", "--golden-dir", str(repo_root / "golden"), "--bin-dir", str(repo_root / "build" / "bin"),
            "--report-dir", str(tmp_path / "reports"), "--only", "tree_accept/chain", "--backend", "cpu"]
    _no_ml_dtypes_after(repo_root, _cli(args))
    assert (tmp_path / "reports" / "conformance.json").is_file()


def test_bf16_tensors_still_read_and_write_as_ml_dtypes_bfloat16(repo_root, tmp_path):
    out = tmp_path / "bf16.kdtr"
    r = _python(repo_root, f"""
import sys, numpy as np, kdtr
g = kdtr.load({str(repo_root / 'golden' / 'verify_attn' / 'k2_dims_bf16.kdtr')!r})
import ml_dtypes
q = g.tensors['input.q']
assert q.dtype == np.dtype(ml_dtypes.bfloat16), q.dtype
kdtr.save({str(out)!r}, {{'q': np.array(q[:1]), 'x': np.array([1.5, -2.0], ml_dtypes.bfloat16)}})
back = kdtr.load({str(out)!r}).tensors
assert back['q'].dtype == np.dtype(ml_dtypes.bfloat16) and back['x'].dtype == np.dtype(ml_dtypes.bfloat16)
assert back['x'].astype(np.float32).tolist() == [1.5, -2.0]
print('ok')
""")
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr
    out2 = tmp_path / "bf16_first.kdtr"
    # a fresh process that writes bf16 first (ml_dtypes imported by the caller), then reads
    r = _python(repo_root, f"""
import numpy as np, ml_dtypes, kdtr
from kdtr.dtypes import code_of_dtype, name_of_dtype
assert code_of_dtype(np.dtype(ml_dtypes.bfloat16)) == 11 and name_of_dtype(np.dtype(ml_dtypes.bfloat16)) == 'bf16'
kdtr.save({str(out2)!r}, {{'x': np.array([0.5], ml_dtypes.bfloat16)}})
assert kdtr.load({str(out2)!r}).tensors['x'].dtype == np.dtype(ml_dtypes.bfloat16)
print('ok')
""")
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


def test_without_ml_dtypes_no_numpy_dtype_is_bf16(repo_root):
    _no_ml_dtypes_after(repo_root, """
import numpy as np
from kdtr.dtypes import DTYPE_BY_NAME, code_of_dtype
assert code_of_dtype(np.dtype('<f4')) == 12 and code_of_dtype(np.dtype('complex64')) is None
assert DTYPE_BY_NAME['bf16'].itemsize == 2
""")
