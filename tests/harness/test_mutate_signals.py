"""An interrupted ``kdtr mutate`` ends every process it started (kdtr/children.py,
docs/mutation.md "Interruption").

``kdtr mutate`` runs on a scratch checkout ($KDTR_ROOT) whose ``make`` (first on PATH) is a
fake: it writes its pid, starts a "compiler" that writes its own pid and sleeps, and waits
for it -- a build that takes as long as the test wants. SIGTERM or SIGINT sent while that
build runs must end the command with 128 + the signal and the one-line message, and leave
neither the make nor its compiler running. The same holds for the generic pass's
universalmutator process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
HANG_GUARD = 90.0  # seconds: only a hang reaches it

TA = "cuda_tests/kernels/tree_accept.cuh"

# A make (or universalmutator) that never finishes on its own: the pid of the tool and of
# its child are written (atomically: write then rename) to $KDTR_TEST_PIDS.
FAKE_TOOL = """#!/bin/sh
echo $$ > "$KDTR_TEST_PIDS/{name}.tmp" && mv "$KDTR_TEST_PIDS/{name}.tmp" "$KDTR_TEST_PIDS/{name}"
sh -c 'echo $$ > "$KDTR_TEST_PIDS/cc.tmp" && mv "$KDTR_TEST_PIDS/cc.tmp" "$KDTR_TEST_PIDS/cc"; exec sleep 600' &
wait
"""


def _scratch_checkout(tmp_path: Path, tool: str) -> tuple[Path, dict[str, str]]:
    root = tmp_path / "root"
    (root / "cuda_tests" / "kernels").mkdir(parents=True)
    (root / "Makefile").write_text("all:\n")
    (root / TA).write_text("int32_t accepted = 0;\n")
    (root / "mutants").mkdir()
    (root / "mutants" / "tree_accept.toml").write_text(
        f'[[mutant]]\nname = "m"\nop = "tree_accept"\nfile = "{TA}"\nbug = "b"\norigin = "o"\n'
        "find = 'int32_t accepted = 0;'\nreplace = 'int32_t accepted = 1;'\n")
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    fake = bin_dir / tool
    fake.write_text(FAKE_TOOL.format(name="tool"))
    fake.chmod(0o755)
    pids = tmp_path / "pids"
    pids.mkdir()
    env = dict(os.environ, KDTR_ROOT=str(root), KDTR_TEST_PIDS=str(pids), PYTHONPATH=str(REPO_ROOT),
               PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    return root, env


def _wait_for(path: Path, proc: subprocess.Popen) -> int:
    """The pid in ``path`` once the fake tool has written it (the command must still run)."""
    deadline = time.monotonic() + HANG_GUARD
    while not path.exists():
        if proc.poll() is not None:
            pytest.fail(f"kdtr mutate ended before the build started: {proc.communicate()}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("the fake tool never started")
        time.sleep(0.05)
    return int(path.read_text())


def _alive(pid: int) -> bool:
    """Running (a zombie, which init may not reap in a container, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def _all_gone(pids: list[int]) -> list[int]:
    """The pids still alive once they had a generous time to go (empty: all gone)."""
    deadline = time.monotonic() + HANG_GUARD / 3
    while True:
        alive = [p for p in pids if _alive(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def _interrupt(args: list[str], env: dict[str, str], cwd: Path, pids_dir: Path, sig: int) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "kdtr.cli", "mutate", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            # SIGINT's default disposition, as under a terminal (a suite started in
                            # the background of a shell inherits it ignored, and Python keeps that)
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    started: list[int] = []
    try:
        started.append(_wait_for(pids_dir / "tool", proc))
        started.append(_wait_for(pids_dir / "cc", proc))
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=HANG_GUARD)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        alive = _all_gone(started)
        for pid in alive:  # leave nothing behind, even when the test fails
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert not alive, f"still running after {signal.Signals(sig).name}: {alive}"
    assert proc.returncode == 128 + sig, (proc.returncode, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"kdtr: {signal.Signals(sig).name}: mutation run stopped"), err
    assert "Traceback" not in err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_during_the_unmutated_build_ends_make_and_its_compilers(tmp_path, sig):
    root, env = _scratch_checkout(tmp_path, "make")
    _interrupt(["--report-dir", str(tmp_path / "reports")], env, root, tmp_path / "pids", sig)
    assert not (tmp_path / "reports" / "mutation.json").exists()


@pytest.mark.skipif((Path(sys.executable).parent / "mutate").is_file(),
                    reason="universalmutator is installed beside this Python: kdtr would run it, not the fake")
def test_signal_during_the_generic_pass_ends_universalmutator(tmp_path):
    root, env = _scratch_checkout(tmp_path, "mutate")
    for rel in ("tree_build", "verify_attn", "greedy_step"):
        (root / "cuda_tests" / "kernels" / f"{rel}.cuh").write_text("int x = 0;\n")
    _interrupt(["--generic", "--no-catalogue", "--report-dir", str(tmp_path / "reports")], env, root,
               tmp_path / "pids", signal.SIGTERM)
