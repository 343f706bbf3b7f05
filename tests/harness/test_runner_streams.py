"""Whatever a binary prints, the runner keeps a bounded amount of it (kdtr.streams): no
newline, binary junk, one endless line -- memory stays flat, the time is linear, and the
head and tail of each stream survive for the error message."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import golden_subset, op_binary
from kdtr import streams

JUNK = 48 << 20  # bytes a fake binary prints

# A wrapper around the real binary that first prints $JUNK_BYTES bytes: "stdout" without a
# newline; "stderr" of random bytes, then one last line and exit 1.
WRAPPER = r'''#!/bin/sh
case "$JUNK" in
  stdout) head -c "$JUNK_BYTES" /dev/zero | tr '\0' x ;;
  stderr) head -c "$JUNK_BYTES" /dev/urandom >&2; echo >&2; echo "kdtr_tree_accept: the last line" >&2; exit 1 ;;
esac
exec "$REAL" "$@"
'''


def test_capped_keeps_head_and_tail_and_counts_the_rest():
    c = streams.Capped(head=4, tail=6)
    for chunk in (b"ab", b"cdef", b"ghij", b"klmnop"):
        c.add(chunk)
    assert c.total == 16 and c.dropped == 6
    assert c.value() == b"abcd\n[... 6 bytes not kept ...]\nklmnop"
    small = streams.Capped(head=4, tail=6)
    small.add(b"0123456789")
    assert small.value() == b"0123456789" and small.dropped == 0


def test_lines_never_buffers_a_line_longer_than_the_cap():
    got, sunk = [], streams.Capped(head=8, tail=8)
    lines = streams.Lines(got.append, sunk.add, max_line=16)
    lines.feed(b"short\nx" + b"y" * 100)
    assert len(lines._pending) == 0  # the overlong line went on to the sink
    lines.feed(b"y" * 100 + b"\n@tag ok\nrest")
    lines.close()
    assert got == [b"short\n", b"@tag ok\n"]  # the overlong line is never a line
    assert sunk.total == 1 + 200 + 1 + 4 and sunk.value().endswith(b"y\nrest")


def test_lines_work_is_linear_in_the_bytes_fed():
    # 48 MiB in 64 KiB chunks without a newline: the old splitter rescanned what it held
    # for each chunk (quadratic) and held all of it; this one holds at most max_line bytes.
    sunk = streams.Capped()
    lines = streams.Lines(lambda line: pytest.fail("no line expected"), sunk.add)
    chunk = b"x" * (1 << 16)
    for _ in range(JUNK // len(chunk)):
        lines.feed(chunk)
        assert len(lines._pending) <= streams.MAX_LINE
    lines.close()
    assert sunk.total == JUNK and len(sunk.value()) < streams.HEAD + streams.TAIL + 100


PROBE = textwrap.dedent('''
    import json, os, sys
    from pathlib import Path
    from kdtr import run as runner

    def hwm_kib():
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1])

    gdir, bdir, out = map(Path, sys.argv[1:4])
    found, problems = runner.check_manifest(gdir, runner.discover(gdir))
    cases = runner.plan(found, ["cpu"])
    cfg = runner.RunConfig(golden_dir=gdir, bin_dir=bdir, out_dir=out, golden_problems=problems)
    warm = [r.status for r in runner.run_all(cases, cfg, jobs=1)]  # every code path once: the baseline
    base = hwm_kib()
    os.environ["JUNK"] = "stdout"
    batch = {r.case.id: [r.status, r.process] for r in runner.run_all(cases, cfg, jobs=1)}
    os.environ["JUNK"] = "stderr"
    cfg.batch = False
    single = runner.run_case(cases[0], cfg)
    print(json.dumps({"warm": warm, "batch": batch, "single": [single.status, single.reason, len(single.stderr)],
                      "growth_kib": hwm_kib() - base}))
''')


def test_a_binary_printing_48_mib_without_newline_keeps_the_runner_small(tmp_path):
    gdir = golden_subset(tmp_path, "tree_accept", ["chain", "default"])
    bdir = tmp_path / "bin"
    bdir.mkdir()
    fake = bdir / "kdtr_tree_accept"
    fake.write_text(WRAPPER)
    fake.chmod(0o755)
    env = dict(os.environ, REAL=str(op_binary("tree_accept")), JUNK_BYTES=str(JUNK))
    env.pop("JUNK", None)
    r = subprocess.run([sys.executable, "-c", PROBE, str(gdir), str(bdir), str(tmp_path / "out")],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout)
    assert got["warm"] == ["PASS", "PASS"]
    # the junk glued to the first result line: that case and those after it run alone, and pass
    assert got["batch"] == {"tree_accept/chain@cpu": ["PASS", "single"], "tree_accept/default@cpu": ["PASS", "single"]}
    status, reason, stderr_len = got["single"]
    assert status == "CRASH" and reason == "exit 1: kdtr_tree_accept: the last line"
    assert stderr_len <= 2100
    assert got["growth_kib"] < 40 << 10, f"the runner grew by {got['growth_kib']} KiB"


@pytest.mark.parametrize("runner_name", ["children.run_captured", "streams.run"])
def test_captured_commands_keep_a_bounded_amount(runner_name):
    # kdtr mutate's builds (a compiler's errors on a mutant) and the tools' binary runs
    from kdtr import children

    run = children.run_captured if runner_name == "children.run_captured" else streams.run
    r = run(["sh", "-c", f"head -c {JUNK} /dev/zero | tr '\\0' x; echo; echo 'the last line' >&2"], timeout=120)
    assert r.returncode == 0
    assert len(r.stdout) <= streams.HEAD + streams.TAIL + 100 and "bytes not kept" in r.stdout
    assert r.stderr == "the last line\n"
