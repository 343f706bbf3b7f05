"""tools/va_check.py: goldens through forced verify_attn kernels, judged by their contracts.

The CPU build of build/bin/kdtr_verify_attn and kdtr_greedy_step checks the real path
(every committed golden of both ops, held against the manifest, PASS with kernel auto:
the CPU backend refuses a forced kernel).  The verdicts a GPU run can give -- an output
within or beyond its contract, exit 3, a kernel other than the forced one, a batch cut
short by a CUDA error, a binary without --kernel -- come from a fake binary that writes
the golden's expected tensors (perturbed as told) and speaks the binaries' batch protocol.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import load_tool, op_binary

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "golden"


va = load_tool("va_check")

FAKE = r'''#!{python}
"""Fake kdtr_<op>: writes the golden's expected.* tensors as its outputs (FAKE_MODE says how)."""
import os, sys
sys.path.insert(0, {root!r})
import numpy as np
import kdtr

argv = sys.argv[1:]
mode = os.environ.get("FAKE_MODE", "exact")
if "--help" in argv:
    print("usage: kdtr_fake [--batch] --input GOLDEN --output OUT [--backend cpu|cuda]"
          + ("" if os.environ.get("FAKE_NO_KERNEL") else " [--kernel VALUE]"))
    sys.exit(0)
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(" ".join(argv) + "\n")
ins = [argv[i + 1] for i, a in enumerate(argv) if a == "--input"]
outs = [argv[i + 1] for i, a in enumerate(argv) if a == "--output"]
kernel = argv[argv.index("--kernel") + 1] if "--kernel" in argv else "auto"
batch = "--batch" in argv

def one(inp, out):
    if mode == "exit3":
        return 3, "backend cuda not supported: --kernel " + kernel + " needs bf16 inputs"
    if mode == "exit2":
        return 2, "--kernel must be auto, simt or mma, not '" + kernel + "'"
    g = kdtr.load(inp)
    tensors = {{}}
    for name, v in g.tensors.items():
        if not name.startswith("expected."):
            continue
        n = name[len("expected."):]
        v = np.array(v)
        if g.metadata.get("contract." + n + ".kind") == "allclose" and mode in ("within", "beyond"):
            atol = float(g.metadata["contract." + n + ".atol"])
            step = 0.5 * atol if mode == "within" else 50 * atol
            v = np.where(np.isfinite(v), v + np.asarray(step, v.dtype), v).astype(v.dtype)
        tensors[n] = v
    ran = os.environ.get("FAKE_RAN") or ("cpu_f64" if kernel == "auto" else kernel + "_bf16_dqk576_dv512")
    kdtr.save(out, tensors, {{"op": g.metadata["op"], "config": g.metadata["config"], "kernel": ran}})
    return 0, ""

first_rc = 0
for i, (inp, out) in enumerate(zip(ins, outs)):
    if batch and mode == "batch_cut" and i == 1:
        print("@kdtr-batch i=1 rc=1 s=0.01 msg=CUDA error at x.cu:1: k: cudaErrorIllegalAddress: boom", flush=True)
        sys.exit(1)
    rc, msg = one(inp, out)
    first_rc = first_rc or rc
    if batch:
        print(f"@kdtr-batch i={{i}} rc={{rc}} s=0.01 msg={{msg}}", flush=True)
    elif rc:
        print("kdtr_fake: " + msg, file=sys.stderr)
        sys.exit(rc)
sys.exit(first_rc)
'''


@pytest.fixture()
def fake_bin(tmp_path, monkeypatch):
    """A bin dir whose kdtr_verify_attn and kdtr_greedy_step are the fake; returns (dir, log)."""
    d = tmp_path / "bin"
    d.mkdir()
    text = FAKE.format(python=sys.executable, root=str(ROOT))
    for op in ("verify_attn", "greedy_step"):
        p = d / f"kdtr_{op}"
        p.write_text(text)
        p.chmod(p.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "calls.log"
    monkeypatch.setenv("FAKE_LOG", str(log))
    return d, log


SMALL = GOLDEN / "verify_attn" / "small.kdtr"
K2 = GOLDEN / "verify_attn" / "k2_dims_bf16.kdtr"
GS = GOLDEN / "greedy_step" / "default.kdtr"


def _lines(out: str) -> list[str]:
    return [ln for ln in out.splitlines() if ln]


def test_cpu_build_passes_every_golden_of_both_ops(capsys):
    op_binary("verify_attn"), op_binary("greedy_step")
    rc = va.main(["--backend", "cpu", "--kernel", "auto"])
    out = _lines(capsys.readouterr().out)
    n_va = len(list((GOLDEN / "verify_attn").glob("*.kdtr")))
    n_gs = len(list((GOLDEN / "greedy_step").glob("*.kdtr")))
    assert rc == 0, out
    assert out[-1] == f"va_check: PASS {n_va + n_gs}  FAIL 0  NOT_SUPPORTED 0  SKIP 0  (cpu)"
    assert "PASS verify_attn/k2_dims_bf16 kernel=auto ran=cpu_f64 " in "\n".join(out)
    assert sum(ln.startswith("PASS greedy_step/") for ln in out) == n_gs


def test_cpu_build_refuses_a_forced_kernel_as_a_failure(capsys):
    op_binary("verify_attn")
    rc = va.main(["--backend", "cpu", "--kernel", "simt", str(SMALL)])
    out = _lines(capsys.readouterr().out)
    assert rc == 1
    assert out[0].startswith("FAIL verify_attn/small kernel=simt: exit 2: ")
    assert "applies to --backend cuda only" in out[0]


def test_within_contract_passes_though_not_bit_equal(fake_bin, monkeypatch, capsys, tmp_path):
    d, log = fake_bin
    monkeypatch.setenv("FAKE_MODE", "within")
    rc = va.main(["--bin-dir", str(d), "--kernel", "mma", "--kernel", "wgmma", str(SMALL), str(K2), str(GS)])
    out = _lines(capsys.readouterr().out)
    assert rc == 0, out
    assert out[0].startswith("PASS verify_attn/small kernel=mma ran=mma_bf16_dqk576_dv512 ")
    assert out[3].startswith("PASS verify_attn/k2_dims_bf16 kernel=wgmma ran=wgmma_bf16_dqk576_dv512 ")
    assert out[-1] == "va_check: PASS 6  FAIL 0  NOT_SUPPORTED 0  SKIP 0  (cuda)"
    # one --batch process per (op, kernel), each with the kernel forced on the cuda backend
    calls = log.read_text().splitlines()
    assert len(calls) == 4 and all("--backend cuda" in c for c in calls)
    assert ["--batch" in c for c in calls] == [True, True, False, False]  # greedy_step: one golden, run alone
    assert ["--kernel mma" in c for c in calls] == [True, False, True, False]
    # the fake's output really differs from the golden (so bit equality would fail)
    import kdtr
    out_file = tmp_path / "o.kdtr"
    subprocess.run([str(d / "kdtr_verify_attn"), "--input", str(SMALL), "--output", str(out_file)], check=True)
    got, want = np.array(kdtr.load(out_file).tensors["out"]), np.array(kdtr.load(SMALL).tensors["expected.out"])
    assert got.dtype == want.dtype and not np.array_equal(got, want)


def test_beyond_contract_fails(fake_bin, monkeypatch, capsys):
    d, _log = fake_bin
    monkeypatch.setenv("FAKE_MODE", "beyond")
    rc = va.main(["--bin-dir", str(d), "--kernel", "simt", str(SMALL)])
    out = _lines(capsys.readouterr().out)
    assert rc == 1
    assert out[0].startswith("FAIL verify_attn/small kernel=simt: MISMATCH: out: ")
    assert out[-1] == "va_check: PASS 0  FAIL 1  NOT_SUPPORTED 0  SKIP 0  (cuda)"


def test_exit3_is_not_supported_unless_required(fake_bin, monkeypatch, capsys):
    d, _log = fake_bin
    monkeypatch.setenv("FAKE_MODE", "exit3")
    assert va.main(["--bin-dir", str(d), "--kernel", "wgmma", str(SMALL), str(K2)]) == 0
    out = _lines(capsys.readouterr().out)
    assert out[0] == ("NOT_SUPPORTED verify_attn/small kernel=wgmma: (exit 3; f32 q [2, 9, 4, 72] d_v 64) "
                      "backend cuda not supported: --kernel wgmma needs bf16 inputs")
    assert out[1].startswith("NOT_SUPPORTED verify_attn/k2_dims_bf16 kernel=wgmma: (exit 3; bf16 q [")
    assert out[-1] == "va_check: PASS 0  FAIL 0  NOT_SUPPORTED 2  SKIP 0  (cuda)"
    assert va.main(["--bin-dir", str(d), "--kernel", "wgmma", "--require-kernel", "wgmma", str(SMALL)]) == 1
    assert capsys.readouterr().out.startswith("FAIL verify_attn/small kernel=wgmma: (exit 3;")


def test_usage_error_of_the_binary_fails(fake_bin, monkeypatch, capsys):
    d, _log = fake_bin
    monkeypatch.setenv("FAKE_MODE", "exit2")
    assert va.main(["--bin-dir", str(d), "--kernel", "wgmma", "--no-batch", str(SMALL)]) == 1
    assert capsys.readouterr().out.startswith("FAIL verify_attn/small kernel=wgmma: exit 2: kdtr_fake: --kernel must be")


def test_another_kernel_than_the_forced_one_fails(fake_bin, monkeypatch, capsys):
    d, _log = fake_bin
    monkeypatch.setenv("FAKE_MODE", "exact")
    monkeypatch.setenv("FAKE_RAN", "mma_bf16_dqk576_dv512")
    assert va.main(["--bin-dir", str(d), "--kernel", "wgmma", "--kernel", "mma", "--kernel", "auto", str(K2)]) == 1
    out = _lines(capsys.readouterr().out)
    assert out[0] == "FAIL verify_attn/k2_dims_bf16 kernel=wgmma: forced wgmma, but kernel mma_bf16_dqk576_dv512 ran"
    assert out[1].startswith("PASS verify_attn/k2_dims_bf16 kernel=mma ran=mma_bf16_dqk576_dv512")
    assert out[2].startswith("PASS verify_attn/k2_dims_bf16 kernel=auto ran=mma_bf16_dqk576_dv512")


def test_a_batch_cut_short_reruns_the_rest_alone(fake_bin, monkeypatch, capsys):
    d, log = fake_bin
    monkeypatch.setenv("FAKE_MODE", "batch_cut")
    goldens = [SMALL, K2, GOLDEN / "verify_attn" / "ragged.kdtr"]
    assert va.main(["--bin-dir", str(d), "--kernel", "mma", *map(str, goldens)]) == 0
    out = _lines(capsys.readouterr().out)
    assert [ln.split()[0:2] for ln in out[:3]] == [["PASS", "verify_attn/small"], ["PASS", "verify_attn/k2_dims_bf16"],
                                                   ["PASS", "verify_attn/ragged"]]
    calls = log.read_text().splitlines()
    assert len(calls) == 3 and "--batch" in calls[0]
    assert str(K2) in calls[1] and str(goldens[2]) in calls[2] and "--batch" not in calls[1]


def test_binary_without_kernel_option_runs_auto_only(fake_bin, monkeypatch, capsys):
    d, log = fake_bin
    monkeypatch.setenv("FAKE_NO_KERNEL", "1")
    assert va.main(["--bin-dir", str(d), "--op", "greedy_step", "--kernel", "simt", "--kernel", "auto", str(GS)]) == 0
    out = _lines(capsys.readouterr().out)
    assert out[0] == "SKIP greedy_step/default kernel=simt: kdtr_greedy_step has no --kernel option"
    assert out[1].startswith("PASS greedy_step/default kernel=auto ran=cpu_f64")
    assert "--kernel" not in log.read_text()


def test_goldens_the_manifest_does_not_vouch_for_fail(fake_bin, monkeypatch, capsys, tmp_path):
    d, _log = fake_bin
    gd = tmp_path / "golden"
    (gd / "verify_attn").mkdir(parents=True)
    manifest = json.loads((GOLDEN / "MANIFEST.json").read_text())
    keep = ("verify_attn/small.kdtr", "verify_attn/ragged.kdtr")
    manifest["files"] = {k: v for k, v in manifest["files"].items() if k in keep}
    (gd / "MANIFEST.json").write_text(json.dumps(manifest))
    for k in keep:
        shutil.copy(GOLDEN / k, gd / k)
    with open(gd / "verify_attn" / "ragged.kdtr", "r+b") as f:  # a hand edit
        f.seek(-1, os.SEEK_END)
        b = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([b[0] ^ 1]))
    monkeypatch.setenv("FAKE_MODE", "exact")
    assert va.main(["--bin-dir", str(d), "--golden-dir", str(gd), "--kernel", "auto"]) == 1
    out = _lines(capsys.readouterr().out)
    assert out[0].startswith("FAIL verify_attn/ragged kernel=-: ") and "sha256 differs" in out[0]
    assert out[1].startswith("PASS verify_attn/small kernel=auto")
    assert out[-1] == "va_check: PASS 1  FAIL 1  NOT_SUPPORTED 0  SKIP 0  (cuda)"


def test_a_golden_of_another_op_is_a_usage_error(capsys):
    assert va.main([str(GOLDEN / "tree_accept" / "default.kdtr")]) == 2
    assert "op 'tree_accept' is not one of verify_attn, greedy_step" in capsys.readouterr().err
