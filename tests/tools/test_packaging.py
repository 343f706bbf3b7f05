"""What an engine developer meets when adopting kdtr: a license, a wheel holding only the
kdtr package (no libkdtr_kernels.so that `make lib` left in build/lib, no other top-level
package), and an installed kdtr (no checkout above the package) that says how to find the
goldens instead of only that it found none."""

from __future__ import annotations

import configparser
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from timing import HANG_GUARD

REPO = Path(__file__).resolve().parents[2]


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_license_file_and_metadata():
    text = (REPO / "LICENSE").read_text()
    assert text.startswith("Copyright 2026 the kdtr authors\n")
    assert "Apache License" in text and "Version 2.0, January 2004" in text and "END OF TERMS AND CONDITIONS" in text
    project = _pyproject()["project"]
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]


def _makefile_var(name: str) -> str:
    m = re.search(rf"^{name}\s*[:?]?=\s*(\S+)", (REPO / "Makefile").read_text(), re.M)
    assert m, f"Makefile: no {name}"
    return m[1]


def test_setuptools_builds_outside_the_makefiles_build_lib():
    """setuptools' build_lib (<build_base>/lib) must not be the directory where `make lib`
    puts libkdtr_kernels.so ($(BUILD)/lib): the wheel takes all of build_lib."""
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    build_base = Path(cfg.get("build", "build_base", fallback="build"))
    make_build = Path(_makefile_var("BUILD"))
    make_lib = Path(_makefile_var("LIBDIR").replace("$(BUILD)", str(make_build)))
    assert build_base / "lib" != make_lib
    assert make_lib not in (build_base / "lib").parents and build_base / "lib" not in make_lib.parents


def _source_copy(dest: Path) -> Path:
    """The files a wheel is built from, plus what `make lib` and an old build leave in build/."""
    dest.mkdir()
    for name in ("pyproject.toml", "setup.cfg", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, dest / name)
    shutil.copytree(REPO / "kdtr", dest / "kdtr", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (dest / "build" / "lib" / "generators").mkdir(parents=True)
    (dest / "build" / "lib" / "libkdtr_kernels.so").write_bytes(b"\x7fELF not really")
    (dest / "build" / "lib" / "generators" / "__init__.py").write_text("")
    return dest


def test_the_wheel_holds_only_the_kdtr_package_and_its_license(tmp_path):
    src = _source_copy(tmp_path / "src")
    out = tmp_path / "wheels"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(src)],
                       capture_output=True, text=True, timeout=2 * HANG_GUARD, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    (wheel,) = out.glob("kdtr-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        metadata = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"kdtr", wheel.name.split("-py")[0] + ".dist-info"}, sorted(tops)
    assert not [n for n in names if n.endswith(".so")], names
    # every package under kdtr/ (pyproject finds them: a new one needs no listing)
    subpackages = {p.parent.name for p in (REPO / "kdtr").glob("*/__init__.py")}
    assert {"cli", "format", "generators", "ops"} <= subpackages
    assert {n.split("/")[1] for n in names if n.startswith("kdtr/") and n.count("/") > 1} == subpackages
    assert "License-Expression: Apache-2.0" in metadata
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names


# --- an installed kdtr: the package without a checkout around it ----------------------------


@pytest.fixture
def installed(tmp_path):
    """kdtr copied alone into a site directory, as `pip install` leaves it; the env runs
    the CLI from there with KDTR_ROOT unset."""
    site = tmp_path / "site"
    shutil.copytree(REPO / "kdtr", site / "kdtr", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    env = {k: v for k, v in os.environ.items() if k != "KDTR_ROOT"}
    env["PYTHONPATH"] = str(site)
    return site, env


def _kdtr(env, cwd, *args):
    return subprocess.run([sys.executable, "-c", "from kdtr.cli.main import entry; entry()", *args], env=env,
                          cwd=cwd, capture_output=True, text=True, timeout=HANG_GUARD)


@pytest.mark.parametrize("args", [["list"], ["run", "--backend", "cpu"], ["regen", "--check"], ["regen"]])
def test_an_installed_kdtr_says_how_to_find_the_goldens(installed, tmp_path, args):
    site, env = installed
    r = _kdtr(env, tmp_path, *args)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert f"golden directory {site / 'golden'} does not exist" in lines[0]
    assert "set KDTR_ROOT to a kdtr checkout" in lines[0] and "--golden-dir" in lines[0]
    assert not (site / "golden").exists()  # regen wrote nothing beside the package


def test_kdtr_root_points_an_installed_kdtr_at_a_checkout(installed, tmp_path):
    site, env = installed
    r = _kdtr(dict(env, KDTR_ROOT=str(REPO)), tmp_path, "list")
    assert r.returncode == 0 and "tree_accept" in r.stdout, r.stdout + r.stderr
    r = _kdtr(dict(env, KDTR_ROOT=str(tmp_path / "nowhere")), tmp_path, "list")
    assert r.returncode == 2 and f"taken to be $KDTR_ROOT, {tmp_path / 'nowhere'}" in r.stderr, r.stderr


def test_an_explicit_golden_dir_gets_the_plain_message(installed, tmp_path):
    _, env = installed
    r = _kdtr(env, tmp_path, "list", "--golden-dir", str(tmp_path / "nope"))
    assert r.returncode == 2 and r.stderr.strip() == f"kdtr: error: golden directory {tmp_path / 'nope'} does not exist"


def test_an_installed_kdtr_mutate_says_it_needs_a_checkout(installed, tmp_path):
    """`kdtr mutate` plants bugs in the C++ sources of a checkout: an installed kdtr names
    KDTR_ROOT instead of only '<site>/mutants: no catalogue files'."""
    _, env = installed
    r = _kdtr(env, tmp_path, "mutate")
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "set KDTR_ROOT to one" in lines[0], r.stderr
