"""Shared fixtures: the repository root and the C++ reader ``build/bin/kdtr_check``."""

from __future__ import annotations

import os
import shutil
import subprocess
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


def cuda_device_present() -> bool:
    """Whether `nvidia-smi -L` lists a GPU (the cuda backends are checked only then)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return False
    try:
        r = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0 and "GPU" in r.stdout


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


def import_test_module(rel: str):
    """The test module tests/<rel> (e.g. ``"unit/test_format_fuzz.py"``) for its helpers: the
    one pytest collected when it did (the same module name, so the same objects), else
    imported now from its file."""
    import importlib.util

    name = Path(rel).stem
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, TESTS_DIR / rel)
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
            "to build the C++ reader before running tests/binaries/test_format_cpp.py",
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


@pytest.fixture
def runner_env(tmp_path, fake_bin):
    """``(tmp_path, gdir, bdir)``: a private copy of the tree_accept goldens in ``gdir``
    (its MANIFEST.json lists them; :func:`fakes.relist` after editing one) and ``bdir``
    holding the fake ``kdtr_tree_accept`` (each golden passes unless ``$FAKE_MODE`` says
    otherwise; mode ``wrong`` changes ``proposed``). Run it with :func:`fakes.invoke`."""
    import shutil

    import fakes

    gdir = tmp_path / "golden"
    shutil.copytree(REPO_ROOT / "golden" / "tree_accept", gdir / "tree_accept")
    fakes.relist(gdir)
    bdir = fake_bin(gdir, "tree_accept", wrong_tensor="proposed").parent
    return tmp_path, gdir, bdir


# --- markers ------------------------------------------------------------------------------
# `binaries` is marked here, not by hand: a test needs what `make build` makes when its
# function, a fixture it uses, or a function of its own module that it calls names it
# (op_binary, the kdtr_check fixture, KDTR_CHECK, a path under build/, libkdtr_kernels.so
# through kdtr.kernels). A heuristic that errs towards marking.
_BINARY_WORDS = ("op_binary(", "kdtr_check", "KDTR_CHECK", '"build" /', "build/bin", "build/lib", "BIN_DIR",
                 "default_bin_dir()", "libkdtr_kernels", "kernels.")


def _needs_binaries(func, module, seen: set) -> bool:
    import inspect

    if func in seen or getattr(func, "__module__", None) != getattr(module, "__name__", None):
        return False
    seen.add(func)
    try:
        source = inspect.getsource(func)
    except (OSError, TypeError):
        return False
    if any(w in source for w in _BINARY_WORDS):
        return True
    names = set(func.__code__.co_names)
    for const in func.__code__.co_consts:  # nested functions and lambdas
        if hasattr(const, "co_names"):
            names |= set(const.co_names)
    for name in names:
        value = getattr(module, name, None)
        if isinstance(value, Path) and "/build/" in value.as_posix() + "/":
            return True
        if inspect.isfunction(value) and _needs_binaries(value, module, seen):
            return True
    return False


def pytest_collection_modifyitems(config, items):
    for item in items:
        func = getattr(item, "function", None)
        module = getattr(item, "module", None)
        if func is None or module is None:
            continue
        needs = "kdtr_check" in item.fixturenames or _needs_binaries(func, module, set())
        if not needs:
            for defs in item._fixtureinfo.name2fixturedefs.values():
                fdef = defs[-1]
                fmod = sys.modules.get(getattr(fdef.func, "__module__", ""), None)
                if fmod is not None and fmod.__name__ != __name__ and _needs_binaries(fdef.func, fmod, set()):
                    needs = True
                    break
        if needs:
            item.add_marker(pytest.mark.binaries)
