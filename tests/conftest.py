"""Shared fixtures: the repository root and the C++ reader ``build/bin/kdtr_check``."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
TESTS_DIR = Path(__file__).resolve().parent

# `import kdtr` and `import malformed` work however pytest was started.
for _p in (str(REPO_ROOT), str(TESTS_DIR)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

KDTR_CHECK = REPO_ROOT / "build" / "bin" / "kdtr_check"

# Hypothesis reaches no verdict from the clock (no per-example deadline, no "too slow" health
# check): a busy machine makes examples slow, not wrong (tests/timing.py says the rule).
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile("kdtr", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("kdtr")


def load_tool(name: str):
    """tools/<name>.py imported as the module ``name`` (the tools are scripts, not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "tools" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def golden_subset(dest: Path, op: str, configs: list[str], waivers: dict[str, str] | None = None) -> Path:
    """dest/golden: a golden directory holding the committed goldens `op`/`configs` and a
    MANIFEST.json that lists just them (their committed entries); with `waivers`, a
    known_failures.json."""
    import json
    import shutil

    committed = REPO_ROOT / "golden"
    gdir = dest / "golden"
    (gdir / op).mkdir(parents=True)
    manifest = json.loads((committed / "MANIFEST.json").read_text())
    files = {}
    for c in configs:
        rel = f"{op}/{c}.kdtr"
        shutil.copyfile(committed / rel, gdir / rel)
        files[rel] = manifest["files"][rel]
    manifest["files"] = files
    (gdir / "MANIFEST.json").write_text(json.dumps(manifest))
    if waivers:
        (gdir / "known_failures.json").write_text(json.dumps(waivers))
    return gdir


def op_binary(op: str) -> Path:
    """build/bin/kdtr_<op>; fails (never skips) when it has not been built."""
    path = REPO_ROOT / "build" / "bin" / f"kdtr_{op}"
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail(f"{path} is missing: run `make` first", pytrace=False)
    return path


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The repository root (the directory that holds kdtr/, golden/, build/)."""
    return REPO_ROOT


@pytest.fixture(scope="session")
def kdtr_check() -> Path:
    """Path of the C++ reader; fails (never skips) when it has not been built."""
    if not (KDTR_CHECK.is_file() and os.access(KDTR_CHECK, os.X_OK)):
        pytest.fail(
            f"{KDTR_CHECK} does not exist or is not executable: run `make` in {REPO_ROOT} "
            "to build the C++ reader before running tests/test_format_cpp.py",
            pytrace=False,
        )
    return KDTR_CHECK


@pytest.fixture
def fake_bin(tmp_path):
    """``fake_bin(gdir, op, **kw)``: write the fake binary ``tmp_path/bin/kdtr_<op>`` for the
    goldens in ``gdir/<op>`` (:func:`fakes.make_fake`, which takes the keywords) and return
    its path; the binary directory is its parent."""
    import fakes

    def make(gdir: Path, op: str, **kw) -> Path:
        return fakes.make_fake(tmp_path / "bin", gdir, op, **kw)

    return make
