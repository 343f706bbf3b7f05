"""`make venv` (and the goals that need it: run, test, regen, ...): a Python older than 3.10
is refused in one line before anything is built, and a venv whose install failed does not
make every later `make venv` fail the same way. Driven with fake interpreters on copies of
the Makefile in tmp_path (nothing is built or installed)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from timing import HANG_GUARD

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def work(tmp_path):
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy2(REPO / name, tmp_path / name)
    return tmp_path


def _make(work: Path, *args: str, dry: bool = False) -> subprocess.CompletedProcess:
    cmd = ["make", "--no-print-directory", *(["-n"] if dry else []), "NO_CUDA=1", "KDTR_CRC=zlib",
           f"BUILD={work / 'b'}", f"VENV={work / 'v'}", *args]
    return subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=HANG_GUARD)


def _fake_python(work: Path, version: tuple[int, int]) -> Path:
    """A python3 that reports ``version`` (this interpreter with sys.version_info replaced
    by a sitecustomize, so the Makefile's probe sees what that Python would print)."""
    site = work / f"site{version[0]}{version[1]}"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import sys\n"
        "class _V(tuple):\n"
        "    major = property(lambda s: s[0]); minor = property(lambda s: s[1])\n"
        f"sys.version_info = _V(({version[0]}, {version[1]}, 18, 'final', 0))\n")
    fake = work / f"python{version[0]}.{version[1]}"
    fake.write_text(f"#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} \"$@\"\n")
    fake.chmod(0o755)
    return fake


@pytest.mark.parametrize("goal", ["venv", "test", "run", "check-goldens"])
def test_an_old_python_is_refused_before_anything_is_built(work, goal):
    fake = _fake_python(work, (3, 9))
    r = _make(work, f"PYTHON={fake}", goal, dry=True)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout == ""  # not one command: no compiler, no venv
    (line,) = r.stderr.strip().splitlines()
    assert line.endswith(f"*** kdtr needs Python >= 3.10; PYTHON={fake} is 3.9; set PYTHON=python3.11.  Stop."), line


def test_a_python_that_does_not_run_is_refused_in_one_line(work):
    r = _make(work, f"PYTHON={work / 'nosuch'}", "venv", dry=True)
    assert r.returncode == 2 and r.stdout == ""
    (line,) = r.stderr.strip().splitlines()
    assert f"kdtr needs Python >= 3.10; PYTHON={work / 'nosuch'} does not run; set PYTHON=python3.11" in line


def test_python_3_10_passes_the_check(work):
    r = _make(work, f"PYTHON={_fake_python(work, (3, 10))}", "venv", dry=True)
    assert r.returncode == 0, r.stderr
    assert " -m venv " in r.stdout


def test_goals_without_the_venv_and_a_fresh_venv_need_no_check(work):
    fake = _fake_python(work, (3, 9))
    assert _make(work, f"PYTHON={fake}", "clean", dry=True).returncode == 0  # a goal without the venv
    (work / "v").mkdir()
    (work / "v" / ".installed").touch()  # newer than pyproject.toml: nothing to remake
    r = _make(work, f"PYTHON={fake}", "venv", dry=True)
    assert r.returncode == 0, r.stderr


# A python3 whose `-m venv DIR` makes a stand-in venv as the real one would: an existing
# DIR/bin/python is kept (`python3.11 -m venv` over a 3.9 venv keeps its 3.9 interpreter).
# The venv's interpreter is "broken" (like a 3.9 one: older than 3.10, `pip install` of
# kdtr fails) when $BROKEN_FLAG existed at its creation, else it works.
VENV_PYTHON = r'''#!/bin/sh
if [ "$1" = -m ] && [ "$2" = venv ]; then
  mkdir -p "$3/bin"
  [ -e "$3/bin/python" ] && exit 0
  if [ -e '{flag}' ]; then
    printf '#!/bin/sh\n[ "$1" = -m ] && echo "ERROR: No matching distribution found for click>=8.2" >&2\nexit 1\n' \
      > "$3/bin/python"
  else
    printf '#!/bin/sh\n[ "$1" = -m ] && echo installed >> "%s"\nexit 0\n' '{log}' > "$3/bin/python"
  fi
  chmod +x "$3/bin/python"
  exit 0
fi
exec {python} "$@"
'''


def _venv_python(work: Path) -> tuple[Path, Path]:
    flag = work / "broken"
    fake = work / "python3"
    fake.write_text(VENV_PYTHON.format(flag=flag, log=work / "installs.log", python=sys.executable))
    fake.chmod(0o755)
    return fake, flag


def test_a_failed_install_is_removed_and_the_next_make_venv_works(work):
    fake, flag = _venv_python(work)
    flag.touch()
    r = _make(work, f"PYTHON={fake}", "venv")
    assert r.returncode != 0
    assert "No matching distribution found for click" in r.stderr
    assert "the install failed" in r.stderr and not (work / "v").exists(), r.stderr
    flag.unlink()  # the user fixes the cause (PYTHON=python3.11, a network)
    r = _make(work, f"PYTHON={fake}", "venv")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (work / "v" / ".installed").is_file()
    assert (work / "installs.log").read_text() == "installed\n"


def test_a_venv_with_an_old_interpreter_is_made_afresh(work):
    """A broken venv left by an earlier attempt (an older Makefile kept it): remade."""
    fake, flag = _venv_python(work)
    flag.touch()
    subprocess.run([str(fake), "-m", "venv", str(work / "v")], check=True, timeout=HANG_GUARD)
    flag.unlink()
    r = _make(work, f"PYTHON={fake}", "venv")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (work / "installs.log").read_text() == "installed\n"
    assert os.access(work / "v" / ".installed", os.F_OK)
