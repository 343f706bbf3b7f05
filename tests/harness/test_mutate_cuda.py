"""kdtr mutate --backend cuda (kdtr/mutate/cuda.py, docs/mutation.md "GPU catalogue"): the
GPU catalogue's schema and its errors, the forced-kernel rule, and the judging of GPU
mutants on a scratch checkout whose builds and binaries are fakes (no GPU, no nvcc):

- the "make" of the checkout (``CudaWorkspace.build``, patched) writes each op binary as a
  POSIX sh script whose behaviour is the ``MODE=...`` line of the op's source
  ``cuda_tests/kernels/<op>.cu`` (a mutant edits that line); comment lines do not reach
  the script (a comment-only edit is IDENTICAL);
- the script speaks the binaries' command line (``--batch``, ``--input/--output`` pairs,
  ``--backend cuda --device N --kernel K``): its output is a copy of the golden's expected
  tensors, precomputed; ``--kernel wgmma`` is NOT_SUPPORTED (exit 3) in every build, as on
  f32 goldens;
- a fake ``compute-sanitizer`` runs the binary with ``FAKE_SAN_TOOL`` set to its tool, and a
  binary in mode ``san_<tool>`` then prints a sanitizer report and exits with the error
  exit code.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import kdtr
from conftest import REPO_ROOT
from kdtr import goldens
from kdtr import mutate as mut
from kdtr import run as runner
from kdtr.cli.main import main
from kdtr.mutate import cuda, workspace

VA = "cuda_tests/kernels/verify_attn.cu"
CONFIGS = ("dv_full", "finite_padding")  # two small f32 verify_attn goldens

# --- the GPU catalogue's schema ---------------------------------------------------------

GOOD = '''[[mutant]]
name = "grid_floor"
op = "tree_accept"
backend = "cuda"
kernel = "tree_accept"
file = "cuda_tests/kernels/tree_accept.cu"
bug = "grid sizing"
origin = "test"
find = "const int64_t blocks = (B + kWarpsPerBlock - 1) / kWarpsPerBlock;"
replace = "const int64_t blocks = B / kWarpsPerBlock;"
'''


def _gpu_catalogue(tmp_path, text, name="tree_accept.toml"):
    d = tmp_path / "gpu"
    d.mkdir(exist_ok=True)
    (d / name).write_text(text)
    return d


def test_a_good_gpu_entry_loads_with_its_id_backend_and_kernel(tmp_path):
    (m,) = mut.load_gpu_catalogue(REPO_ROOT, _gpu_catalogue(tmp_path, GOOD))
    assert (m.id, m.backend, m.kernel, m.op, m.kind) == ("gpu/tree_accept/grid_floor", "cuda", "tree_accept",
                                                        "tree_accept", "catalogue")
    assert m.line > 1


def test_an_entry_of_another_op_than_the_file_stem_is_fine_on_the_gpu(tmp_path):
    (m,) = mut.load_gpu_catalogue(REPO_ROOT, _gpu_catalogue(
        tmp_path, GOOD.replace('kernel = "tree_accept"', 'kernel = "launch"'), "launch.toml"))
    assert m.id == "gpu/launch/grid_floor" and m.op == "tree_accept"


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace('backend = "cuda"\n', ""), "field 'backend' missing"),
    (lambda t: t.replace('backend = "cuda"', 'backend = "cpu"'), "field 'backend' 'cpu'"),
    (lambda t: t.replace('kernel = "tree_accept"\n', ""), "field 'kernel' missing"),
    (lambda t: t.replace('kernel = "tree_accept"', 'kernel = "simt"'), "field 'kernel' 'simt'"),
    (lambda t: t.replace('kernel = "tree_accept"', "kernel = 3"), "field 'kernel' missing or not a non-empty"),
    (lambda t: t.replace('op = "tree_accept"', 'op = "attention"'), "field 'op' 'attention': not an op"),
    (lambda t: t.replace('bug = "grid sizing"\n', ""), "field 'bug' missing"),
    (lambda t: t + 'colour = "red"\n', "unknown field 'colour'"),
    (lambda t: t.replace("cuda_tests/kernels/tree_accept.cu", "../etc/passwd"), "field 'file'"),
    (lambda t: t.replace("cuda_tests/kernels/tree_accept.cu", "cuda_tests/kernels/nope.cu"), "field 'file'"),
    (lambda t: t.replace('find = "const int64_t blocks', 'find = "const int64_t blockz'), "occurs 0 times"),
    (lambda t: t.replace('replace = "const int64_t blocks = B / kWarpsPerBlock;"',
                         'replace = "const int64_t blocks = (B + kWarpsPerBlock - 1) / kWarpsPerBlock;"'), "no edit"),
    (lambda t: t + 'equivalent = " "\n', "field 'equivalent'"),
    (lambda t: t.replace('name = "second"', 'name = "grid_floor"'), "duplicate mutant gpu/tree_accept/grid_floor"),
    (lambda t: t.replace("[[mutant]]", "[[mutants]]"), "unknown top-level key"),
    (lambda t: t.replace('name = "second"', 'name = "Second one"'), "field 'name' 'Second one'"),
])
def test_bad_gpu_entries_are_rejected_naming_file_entry_and_field(tmp_path, edit, message):
    d = _gpu_catalogue(tmp_path, GOOD + "\n" + edit(GOOD.replace("grid_floor", "second")))
    with pytest.raises(mut.CatalogueError, match="tree_accept.toml") as exc:
        mut.load_gpu_catalogue(REPO_ROOT, d)
    assert "mutant #2" in str(exc.value) or "top-level" in str(exc.value)
    assert message in str(exc.value)


def test_a_gpu_catalogue_dir_without_files_or_with_a_bad_stem_is_an_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(mut.CatalogueError, match="no GPU catalogue files"):
        mut.load_gpu_catalogue(REPO_ROOT, tmp_path / "empty")
    with pytest.raises(mut.CatalogueError, match="no GPU catalogue files"):
        mut.load_gpu_catalogue(REPO_ROOT, tmp_path / "absent")
    d = _gpu_catalogue(tmp_path, GOOD.replace('kernel = "tree_accept"', 'kernel = "Tree-Accept"'), "Tree-Accept.toml")
    with pytest.raises(mut.CatalogueError, match="not a kernel name"):
        mut.load_gpu_catalogue(REPO_ROOT, d)


def test_the_cpu_catalogue_refuses_the_gpu_fields(tmp_path):
    d = tmp_path / "cpu"
    d.mkdir()
    (d / "tree_accept.toml").write_text(GOOD)
    with pytest.raises(mut.CatalogueError, match="unknown field 'backend'"):
        mut.load_catalogue(REPO_ROOT, d)


# --- the forced-kernel rule -----------------------------------------------------------------

@pytest.mark.parametrize("op, kernel, want", [
    ("verify_attn", "simt", ("simt",)),
    ("verify_attn", "wgmma", ("wgmma",)),
    ("greedy_step", "mma", ("mma",)),            # greedy_step's axis is its verify_attn stage's
    ("tree_build", "select", ("select",)),
    ("tree_build", "heap", ("heap",)),
    ("greedy_step", "select", ("simt", "mma", "wgmma")),  # not on its axis: every kernel of it
    ("tree_build", "visibility", ("heap", "select")),
    ("verify_attn", "launch", ("simt", "mma", "wgmma")),
    ("tree_accept", "tree_accept", (None,)),     # no axis: the binary's own choice
    ("tree_accept", "simt", (None,)),
])
def test_the_forced_kernel_of_each_op(op, kernel, want):
    assert cuda.kernel_choices(op, kernel) == want


def test_the_plan_has_one_case_per_golden_and_kernel_of_the_axis():
    plan = cuda.load_goldens(REPO_ROOT / "golden")
    found = runner.discover(REPO_ROOT / "golden")
    for op in mut.OPS:
        n = sum(o == op for o, _, _ in found)
        ks = cuda.op_kernels()[op] or (None,)
        for k in ks:
            assert len(plan.cases[(op, k)]) == n
            assert all(c.backend == "cuda" and c.kernel == k and c.op == op for c in plan.cases[(op, k)])
    m = mut.Mutant("gpu/select/x", "tree_build", "f", "b", "o", "a", "b", backend="cuda", kernel="select")
    assert plan.groups_of(m, ["tree_build", "greedy_step"]) == [
        ("tree_build", "select"), ("greedy_step", "simt"), ("greedy_step", "mma"), ("greedy_step", "wgmma")]


# --- the fake checkout ----------------------------------------------------------------------

FAKE_BIN = r'''#!/bin/sh
# fake kdtr_@OP@ (tests/harness/test_mutate_cuda.py); MODE=@MODE@
MODE='@MODE@'; OUTS='@OUTS@'
LOG=${FAKE_LOG:-}
[ -n "$LOG" ] && echo "$MODE $*" >> "$LOG"
if [ "$MODE" = hang ]; then echo $$ >> "$FAKE_PIDS"; : < "$FAKE_FIFO"; fi  # blocks until killed
[ "$MODE" = crash ] && { echo "kdtr_@OP@: CUDA error: an illegal memory access was encountered" >&2; exit 1; }
if [ -n "${FAKE_OOM:-}" ]; then  # the GPU runs out of memory once a mutant's first run starts, for every build
  case "$*" in */obtained/*) : > "$FAKE_OOM" ;; esac
  [ -e "$FAKE_OOM" ] && { echo "kdtr_@OP@: CUDA error: out of memory" >&2; exit 1; }
fi
batch=0; kernel=''; prev=''
for a in "$@"; do
  [ "$a" = --batch ] && batch=1
  [ "$prev" = --kernel ] && kernel=$a
  prev=$a
done
if [ "$MODE" = "san_${FAKE_SAN_TOOL:-none}" ]; then
  echo "========= COMPUTE-SANITIZER"
  echo "========= Invalid __global__ read of size 4 bytes"
  echo "=========     at verify_attn_kernel+0x90"
  echo "========= ERROR SUMMARY: 1 error"
  exit "$FAKE_SAN_EXIT"
fi
k=0; rc=0; prev=''; inp=''
for a in "$@"; do
  case "$prev" in
    --input) inp=$a ;;
    --output)
      c=${inp##*/}; c=${c%.kdtr}; r=0; msg=''
      src="$OUTS/ok/$kernel/$c.kdtr"
      if [ "$kernel" = wgmma ] || { [ "$MODE" = ns_simt ] && [ "$kernel" = simt ]; }; then
        r=3; msg="--kernel $kernel does not apply to this golden"
      elif [ "$MODE" = wrong ]; then
        src="$OUTS/wrong/$kernel/$c.kdtr"
      elif [ "$MODE" = nondet ]; then
        case "$a" in */obtained-2/*|*/calibration-2/*) src="$OUTS/ulp/$kernel/$c.kdtr" ;; esac  # the second run
      fi
      [ $r = 0 ] && { cp "$src" "$a" || r=1; }
      [ -n "$msg" ] && echo "kdtr_@OP@: $msg" >&2
      [ $rc = 0 ] && rc=$r
      [ $batch = 1 ] || exit $r
      printf '@kdtr-batch i=%d rc=%d s=0.001 msg=%s\n' $k $r "$msg"
      k=$((k+1)) ;;
  esac
  prev=$a
done
exit $rc
'''

FAKE_SANITIZER = r'''#!/bin/sh
# fake compute-sanitizer (tests/harness/test_mutate_cuda.py)
tool=''
while [ $# -gt 0 ]; do
  case "$1" in
    --tool) tool=$2; shift 2 ;;
    --error-exitcode) FAKE_SAN_EXIT=$2; shift 2; break ;;
    *) shift ;;
  esac
done
[ -n "${FAKE_SAN_LOG:-}" ] && echo "$tool $*" >> "$FAKE_SAN_LOG"
if [ -n "${FAKE_SAN_BROKEN:-}" ]; then  # the tool stops starting once a mutant's sweep begins, for every build
  case "$*" in */sanitizer-$tool/*) : > "$FAKE_SAN_BROKEN" ;; esac
  if [ -e "$FAKE_SAN_BROKEN" ]; then
    echo "========= Error: Target application terminated before first instrumented API call"
    exit "$FAKE_SAN_BROKEN_EXIT"
  fi
fi
export FAKE_SAN_TOOL=$tool FAKE_SAN_EXIT
"$@"; rc=$?
echo "========= ERROR SUMMARY: 0 errors"
exit $rc
'''

MAKEFILE = "".join(f"build/bin/kdtr_{op}: cuda_tests/kernels/{op}.cu build/config.stamp\n" for op in mut.OPS) + \
    "build/config.stamp: ;\n"


def _outputs(gdir: Path, outs: Path) -> None:
    """outs/{ok,wrong,ulp}/<kernel>/<config>.kdtr: each golden's expected outputs as kernel
    simt or mma gives them (metadata ``kernel``): as they are, with one element far off, and
    with one element one float32 ulp away (within every tolerance)."""
    for g in sorted((gdir / "verify_attn").glob("*.kdtr")):
        with kdtr.load(g) as f:
            exp = {k[len("expected."):]: np.array(v) for k, v in f.tensors.items() if k.startswith("expected.")}
        for kernel in ("simt", "mma"):
            meta = {"op": "verify_attn", "kernel": kernel}
            for sub in ("ok", "wrong", "ulp"):
                (outs / sub / kernel).mkdir(parents=True, exist_ok=True)
            kdtr.save(outs / "ok" / kernel / g.name, exp, meta)
            for sub, change in (("wrong", lambda x: x + np.float32(1.0)),
                                ("ulp", lambda x: np.nextafter(x, np.float32(np.inf)))):
                e = {k: v.copy() for k, v in exp.items()}
                flat = e["out"].reshape(-1)
                i = int(np.flatnonzero(np.isfinite(flat) & (np.abs(flat) > 0.1))[0])
                flat[i] = change(flat[i])
                kdtr.save(outs / sub / kernel / g.name, e, meta)


def _mode(text: str) -> str:
    return next(ln.split("=", 1)[1].strip() for ln in text.splitlines() if ln.startswith("MODE="))


class FakeBuild:
    """CudaWorkspace.build: writes each target as FAKE_BIN with its source's MODE."""

    def __init__(self, outs: Path) -> None:
        self.outs, self.calls = outs, []

    def __call__(self, cwd: Path, targets: list[str], jobs: int = 1) -> subprocess.CompletedProcess:
        self.calls.append((Path(cwd), list(targets)))
        for t in targets:
            op = t.rsplit("kdtr_", 1)[1]
            text = (cwd / f"cuda_tests/kernels/{op}.cu").read_text()
            if "STILLBORN" in text:
                return subprocess.CompletedProcess(["make"], 2, "", f"cuda_tests/kernels/{op}.cu(1): error: boom\n")
            code = "\n".join(ln for ln in text.splitlines() if not ln.startswith("//"))
            script = FAKE_BIN.replace("@OP@", op).replace("@MODE@", _mode(text)).replace(
                "@OUTS@", str(self.outs)) + f"# {code!r}\n"
            dst = cwd / t
            dst.parent.mkdir(parents=True, exist_ok=True)
            if dst.exists():
                dst.unlink()
            dst.write_text(script)
            dst.chmod(0o755)
        (cwd / workspace.CONFIG_STAMP).write_text("cuda | fake | wgmma=sm_90a\n")
        return subprocess.CompletedProcess(["make"], 0, "", "")


MUTANTS = {  # name: (kernel, find, replace)
    "wrong": ("simt", "MODE=pass", "MODE=wrong"),
    "wrong_launch": ("launch", "MODE=pass", "MODE=wrong"),
    "survives": ("simt", "MODE=pass", "MODE=pass\nx = 1"),
    "comment_only": ("simt", "// a comment", "// another comment"),
    "no_compile": ("simt", "MODE=pass", "MODE=pass\nSTILLBORN"),
    "nondet": ("simt", "MODE=pass", "MODE=nondet"),
    "memcheck": ("mma", "MODE=pass", "MODE=san_memcheck"),
    "racecheck": ("simt", "MODE=pass", "MODE=san_racecheck"),
    "ns_simt": ("simt", "MODE=pass", "MODE=ns_simt"),
}


def _entry(name: str, kernel: str, find: str, replace: str, equivalent: str = "") -> str:
    return (f'[[mutant]]\nname = "{name}"\nop = "verify_attn"\nbackend = "cuda"\nkernel = "{kernel}"\n'
            f'file = "{VA}"\nbug = "b"\norigin = "o"\nfind = """{find}"""\nreplace = """{replace}"""\n'
            + (f'equivalent = "{equivalent}"\n' if equivalent else ""))


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    """A scratch checkout ($KDTR_ROOT) with fake sources, a GPU catalogue (one file per
    kernel named in MUTANTS), two verify_attn goldens, a fake build and a fake sanitizer."""
    root = tmp_path / "root"
    (root / "cuda_tests" / "kernels").mkdir(parents=True)
    for op in mut.OPS:
        (root / f"cuda_tests/kernels/{op}.cu").write_text("// a comment\nMODE=pass\n")
    (root / "Makefile").write_text(MAKEFILE)
    gpu = root / "mutants" / "gpu"
    gpu.mkdir(parents=True)
    by_kernel: dict[str, list[str]] = {}
    for name, (kernel, find, replace) in MUTANTS.items():
        by_kernel.setdefault(kernel, []).append(_entry(name, kernel, find, replace))
    for kernel, entries in by_kernel.items():
        (gpu / f"{kernel}.toml").write_text("\n".join(entries))
    gdir = root / "golden"
    (gdir / "verify_attn").mkdir(parents=True)
    for c in CONFIGS:
        (gdir / "verify_attn" / f"{c}.kdtr").write_bytes((REPO_ROOT / "golden/verify_attn" / f"{c}.kdtr").read_bytes())
    goldens.write_manifest(gdir, goldens.manifest_of_files(gdir))
    outs = tmp_path / "outs"
    _outputs(gdir, outs)
    build = FakeBuild(outs)
    monkeypatch.setattr(workspace.CudaWorkspace, "build", build)
    fakebin = tmp_path / "fakebin"
    fakebin.mkdir()
    (fakebin / "compute-sanitizer").write_text(FAKE_SANITIZER)
    (fakebin / "compute-sanitizer").chmod(0o755)
    monkeypatch.setattr(cuda, "cuda_devices", lambda: (0,))
    monkeypatch.setattr(cuda, "sanitizer_path", lambda: str(fakebin / "compute-sanitizer"))
    monkeypatch.setattr(workspace, "nvcc_path", lambda: "/usr/bin/true")
    monkeypatch.setenv("KDTR_ROOT", str(root))
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "bin.log"))
    monkeypatch.setenv("FAKE_SAN_LOG", str(tmp_path / "san.log"))
    return root


def _invoke(root: Path, *extra: str):
    args = ["mutate", "--backend", "cuda", "--report-dir", str(root / "reports"), "-j", "2", *extra]
    return CliRunner().invoke(main, args, catch_exceptions=False)


def _report(root: Path) -> dict:
    return json.loads((root / "reports" / "mutation.json").read_text())


def _by_name(root: Path) -> dict[str, dict]:
    return {m["id"].rsplit("/", 1)[1]: m for m in _report(root)["mutants"]}


def test_each_outcome_of_a_gpu_run(checkout):
    res = _invoke(checkout)
    assert res.exit_code == 1, res.output  # the survivor, the stillborn and the identical mutant
    got = _by_name(checkout)
    assert {k: v["outcome"] for k, v in got.items()} == {
        "wrong": mut.KILLED, "wrong_launch": mut.KILLED, "survives": mut.SURVIVED, "comment_only": mut.IDENTICAL,
        "no_compile": mut.STILLBORN, "nondet": mut.KILLED, "memcheck": mut.KILLED_BY_SANITIZER,
        "racecheck": mut.KILLED_BY_SANITIZER, "ns_simt": mut.KILLED}
    # the forced kernel: simt's mutant meets only simt cases, launch's every kernel of the
    # axis whose cases calibration kept (wgmma is NOT_SUPPORTED on these goldens: dropped)
    assert sorted(got["wrong"]["killed_by"]) == [f"verify_attn/{c}@cuda:simt" for c in CONFIGS]
    assert sorted(got["wrong_launch"]["killed_by"]) == sorted(
        f"verify_attn/{c}@cuda:{k}" for c in CONFIGS for k in ("simt", "mma"))
    assert got["nondet"]["detail"].startswith("nondeterministic: verify_attn/dv_full@cuda:simt: out[")
    assert got["memcheck"]["detail"] == ("memcheck: verify_attn/dv_full@cuda:mma: Invalid __global__ read of size "
                                         "4 bytes")
    assert got["racecheck"]["detail"].startswith("racecheck: verify_attn/dv_full@cuda:simt: Invalid __global__")
    assert got["ns_simt"]["detail"].startswith("verify_attn/dv_full@cuda:simt: NOT_SUPPORTED")
    assert got["survives"]["detail"] == ("2 cases passed twice, byte-identical; clean under memcheck, racecheck, "
                                         "synccheck")
    assert all(m["backend"] == "cuda" for m in got.values())
    data = _report(checkout)
    assert data["score"]["gpu"]["all"]["score"] == pytest.approx(6 / 7)
    k = data["score"]["gpu_kernels"]
    assert (k["simt"]["mutants"], k["simt"][mut.KILLED_BY_SANITIZER], k["mma"][mut.KILLED_BY_SANITIZER]) == (7, 1, 1)
    md = (checkout / "reports" / "mutation.md").read_text()
    assert "### Per kernel" in md and "| mma | 1 | 0 | 1 | 0 |" in md
    assert "verdict cache: not used for the cuda backend" in md
    assert "calibration: 4 cases kept (PASS twice, byte-identical), 2 NOT_SUPPORTED dropped" in md


def _one(checkout, name: str, *extra: str) -> dict:
    res = _invoke(checkout, "--only", f"gpu/*/{name}", *extra)
    assert res.exit_code in (0, 1), res.output
    return _by_name(checkout)[name]


def test_a_nondeterministic_mutant_is_killed_naming_case_output_and_element(checkout):
    m = _one(checkout, "nondet", "--sanitizer-tools", "none")
    assert m["outcome"] == mut.KILLED
    assert m["killed_by"] == ["verify_attn/dv_full@cuda:simt"]
    assert "nondeterministic: verify_attn/dv_full@cuda:simt: out[" in m["detail"]
    assert " vs " in m["detail"] and "(1 elements differ)" in m["detail"]


def test_a_sanitizer_error_kills_a_survivor_of_the_goldens(checkout, tmp_path):
    m = _one(checkout, "racecheck")
    assert m["outcome"] == mut.KILLED_BY_SANITIZER and m["killed_by"] == ["verify_attn/dv_full@cuda:simt"]
    tools = [ln.split()[0] for ln in (tmp_path / "san.log").read_text().splitlines() if ln.split()]  # not --version
    assert tools[0] == "memcheck" and "racecheck" in tools and "synccheck" not in tools  # in order, stops there
    # without racecheck in the sweep the same mutant survives
    m = _one(checkout, "racecheck", "--sanitizer-tools", "memcheck,synccheck")
    assert m["outcome"] == mut.SURVIVED


def test_a_declared_equivalent_mutant_with_a_sanitizer_error_is_a_bad_claim(checkout):
    (checkout / "mutants/gpu/simt.toml").write_text(
        _entry("racecheck", "simt", "MODE=pass", "MODE=san_racecheck", "claimed"))
    res = _invoke(checkout)
    assert res.exit_code == 1
    assert _by_name(checkout)["racecheck"]["outcome"] == mut.BAD_CLAIM


def test_not_supported_cases_are_dropped_at_calibration(checkout, tmp_path):
    ws = mut.CudaWorkspace(checkout, tmp_path / "scratch")
    plan = cuda.load_goldens(checkout / "golden")
    cuda.calibrate(plan, ws, [("verify_attn", k) for k in ("simt", "mma", "wgmma")])
    assert [c.id for c in plan.kept[("verify_attn", "wgmma")]] == []
    assert sorted(c.id for c in plan.dropped) == [f"verify_attn/{c}@cuda:wgmma" for c in CONFIGS]
    assert sorted(c.id for c in plan.kept[("verify_attn", "mma")]) == [f"verify_attn/{c}@cuda:mma" for c in CONFIGS]
    assert all(t >= cuda.MIN_TIMEOUT for t in plan.timeouts.values())
    m = mut.Mutant("gpu/wgmma/x", "verify_attn", VA, "b", "o", "a", "b", backend="cuda", kernel="wgmma")
    assert cuda.mutant_cases(m, ["verify_attn"], plan) == []


def _unmutated(checkout: Path, mode: str) -> None:
    (checkout / VA).write_text(f"// a comment\nMODE={mode}\n")
    (checkout / "mutants/gpu/simt.toml").write_text(_entry("fixed", "simt", f"MODE={mode}", "MODE=pass"))
    for f in ("launch", "mma"):
        (checkout / f"mutants/gpu/{f}.toml").unlink()


def test_a_nondeterministic_unmutated_build_stops_the_run_naming_the_case(checkout):
    _unmutated(checkout, "nondet")
    res = _invoke(checkout)
    assert res.exit_code == 2, res.output
    assert "the unmutated cuda build is nondeterministic on verify_attn/dv_full@cuda:simt" in res.output
    assert not (checkout / "reports" / "mutation.json").exists()


def test_an_unmutated_case_that_fails_stops_the_run(checkout):
    _unmutated(checkout, "wrong")
    res = _invoke(checkout)
    assert res.exit_code == 2, res.output
    assert "the unmutated cuda build does not pass verify_attn/dv_full@cuda:simt: MISMATCH" in res.output


def test_an_unmutated_sanitizer_error_stops_the_run(checkout):
    (checkout / VA).write_text("// a comment\nMODE=san_synccheck\n")
    (checkout / "mutants/gpu/simt.toml").write_text(_entry("survives", "simt", "MODE=san_synccheck",
                                                           "MODE=san_synccheck\nx = 1"))
    for f in ("launch", "mma"):
        (checkout / f"mutants/gpu/{f}.toml").unlink()
    res = _invoke(checkout)
    assert res.exit_code == 2, res.output
    assert ("the unmutated cuda build is not clean under compute-sanitizer synccheck on "
            "verify_attn/dv_full@cuda:simt: CRASH") in res.output
    assert not (checkout / "reports" / "mutation.json").exists()


def test_build_only_reports_built_identical_stillborn_and_runs_nothing(checkout, tmp_path, monkeypatch):
    monkeypatch.setattr(cuda, "cuda_devices", lambda: ())  # no GPU: --build-only does not need one
    res = _invoke(checkout, "--build-only")
    assert res.exit_code == 1, res.output  # a stillborn and an undeclared identical mutant
    got = _by_name(checkout)
    want = {n: mut.BUILT for n in MUTANTS}
    want.update(comment_only=mut.IDENTICAL, no_compile=mut.STILLBORN)
    assert {k: v["outcome"] for k, v in got.items()} == want
    assert got["no_compile"]["detail"] == "cuda_tests/kernels/verify_attn.cu(1): error: boom"
    assert not (tmp_path / "bin.log").exists()  # no binary ran
    # an IDENTICAL one not declared equivalent is a catalogue entry to fix: exit 1
    (checkout / "mutants/gpu/simt.toml").write_text(
        _entry("survives", "simt", "MODE=pass", "MODE=pass\nx = 1") + _entry("comment_only", "simt", "// a comment",
                                                                           "// another"))
    res = _invoke(checkout, "--build-only", "--only", "gpu/simt/*")
    assert res.exit_code == 1 and "IDENTICAL gpu/simt/comment_only" in res.output, res.output
    # only BUILT ones, and an IDENTICAL one declared equivalent: exit 0
    (checkout / "mutants/gpu/simt.toml").write_text(
        _entry("survives", "simt", "MODE=pass", "MODE=pass\nx = 1")
        + _entry("comment_only", "simt", "// a comment", "// another", "a comment changes no code"))
    res = _invoke(checkout, "--build-only", "--only", "gpu/simt/*")
    assert res.exit_code == 0, res.output
    assert {k: v["outcome"] for k, v in _by_name(checkout).items()} == {"survives": mut.BUILT,
                                                                         "comment_only": mut.IDENTICAL}


@pytest.mark.slow  # waits out its --time-budget (SHORT_TIMEOUT)
def test_a_spent_time_budget_kills_what_runs_and_reports_the_rest_as_not_run(checkout, tmp_path, monkeypatch):
    """A mutant whose binary blocks forever is still running when --time-budget is spent:
    the binary is killed, the mutant is NOT_RUN, the report is written and the run exits 1
    (its time limits are far beyond the guard: only the budget can end it)."""
    import threading

    from timing import HANG_GUARD, SHORT_TIMEOUT, never_fifo, release_fifo

    monkeypatch.setattr(cuda, "MIN_TIMEOUT", 100 * HANG_GUARD)
    (checkout / "mutants/gpu/simt.toml").write_text(_entry("hangs", "simt", "MODE=pass", "MODE=hang")
                                                    + _entry("wrong", "simt", "MODE=pass", "MODE=wrong"))
    for f in ("launch", "mma"):
        (checkout / f"mutants/gpu/{f}.toml").unlink()
    pids, fifo = tmp_path / "pids", never_fifo(tmp_path)
    box: dict = {}
    args = ["mutate", "--backend", "cuda", "--report-dir", str(checkout / "reports"), "-j", "2",
            "--time-budget", f"{SHORT_TIMEOUT:g}"]
    t = threading.Thread(target=lambda: box.setdefault("res", CliRunner().invoke(
        main, args, env={"FAKE_PIDS": str(pids), "FAKE_FIFO": str(fifo)}, catch_exceptions=False)), daemon=True)
    t.start()
    t.join(HANG_GUARD + SHORT_TIMEOUT)
    if t.is_alive():
        release_fifo(fifo)
        pytest.fail("kdtr mutate did not stop when its --time-budget was spent")
    res = box["res"]
    assert res.exit_code == 1, res.output
    got = {k: v["outcome"] for k, v in _by_name(checkout).items()}
    assert got["hangs"] == mut.NOT_RUN and got["wrong"] in (mut.KILLED, mut.NOT_RUN)
    assert _by_name(checkout)["hangs"]["detail"] == "the time budget (--time-budget) ran out before it was judged"
    assert "NOT_RUN: " in res.output
    assert f"time budget: {SHORT_TIMEOUT:g} s: ran out" in (checkout / "reports/mutation.md").read_text()
    for pid in [int(x) for x in pids.read_text().split()] if pids.exists() else []:
        with pytest.raises(ProcessLookupError):  # the blocked binary was killed (and reaped)
            os.kill(pid, 0)


def test_a_mutant_rebuilds_only_the_binaries_built_from_its_file(checkout, tmp_path):
    ws = mut.CudaWorkspace(checkout, tmp_path / "scratch")
    build = workspace.CudaWorkspace.build
    build.calls.clear()
    m = mut.load_gpu_catalogue(checkout)[0]
    r = cuda.run_mutant(m, ws, cuda.CudaPlan({}, checkout / "golden"), build_only=True)
    assert r.outcome == mut.BUILT and r.detail == "binaries changed: kdtr_verify_attn"
    assert [targets for _, targets in build.calls] == [["build/bin/kdtr_verify_attn"]]


def test_no_nvcc_or_no_gpu_is_a_usage_error_in_one_line(checkout, monkeypatch):
    monkeypatch.setattr(cuda, "cuda_devices", lambda: ())
    res = _invoke(checkout)
    assert res.exit_code == 2 and "needs a CUDA device" in res.output and "--build-only" in res.output
    monkeypatch.setattr(workspace, "nvcc_path", lambda: None)
    for extra in ((), ("--build-only",)):
        res = _invoke(checkout, *extra)
        assert res.exit_code == 2 and "needs nvcc" in res.output, res.output
        assert len(res.output.strip().splitlines()) == 1


@pytest.mark.parametrize("args, message", [
    (("--backend", "cuda", "--generic"), "--generic mutates the CPU cores"),
    (("--backend", "cuda", "--cxxflags", "-O0"), "--cxxflags sets the CPU build's flags"),
    (("--backend", "cuda", "--sanitizer-tools", "memcheck,helgrind"), "unknown tool 'helgrind'"),
    (("--build-only",), "--build-only is an option of --backend cuda"),
    (("--sanitizer-tools", "memcheck"), "--sanitizer-tools is an option of --backend cuda"),
    (("--time-budget", "60"), "--time-budget is an option of --backend cuda"),
])
def test_options_that_do_not_fit_the_backend_are_usage_errors(checkout, args, message):
    res = CliRunner().invoke(main, ["mutate", "--report-dir", str(checkout / "reports"), *args],
                             catch_exceptions=False)
    assert res.exit_code == 2 and message in res.output, res.output


C_PROGRAM = """#include <stdio.h>
static const char* name = "_ZN4kdtr47_GLOBAL__N__%s_14_tree_accept_cu_7a163baa18tree_accept_kernelE";
int main(void) { puts(name); return %d; }
"""


def _cc(tmp_path: Path, hash8: str, rc: int) -> Path:
    d = tmp_path / f"{hash8}-{rc}"
    d.mkdir()
    (d / "p.c").write_text(C_PROGRAM % (hash8, rc))
    subprocess.run(["gcc", "-O1", "-Wl,--build-id=sha1", "p.c", "-o", "p"], cwd=d, check=True)
    return d / "p"


def test_the_cuda_workspace_compares_binaries_stripped_and_with_anonymous_namespaces_normalised(tmp_path):
    """nvcc names each anonymous namespace by a hash of its source's directory: two copies
    of one build differ there (and in the build-id over them), nowhere else."""
    assert workspace.CudaWorkspace.CACHE != workspace.Workspace.CACHE  # apart from the CPU build's cache
    ws = object.__new__(workspace.CudaWorkspace)
    ws.scratch = tmp_path
    a, b, c = _cc(tmp_path, "0f18cf7d", 0), _cc(tmp_path, "ed4ba970", 0), _cc(tmp_path, "0f18cf7d", 1)
    assert a.read_bytes() != b.read_bytes()
    assert ws.binary_digest(a) == ws.binary_digest(b)
    assert ws.binary_digest(a) != ws.binary_digest(c)  # other code
    junk = tmp_path / "junk"
    junk.write_bytes(b"not an ELF file _GLOBAL__N__0f18cf7d_x")
    assert ws.binary_digest(junk) == workspace._digest(junk)  # strip refuses it: its bytes are compared


@pytest.mark.slow  # nvcc: the unmutated CUDA build (from the checkout's objects) and three compiles
def test_build_only_with_nvcc_on_tiny_mutants(tmp_path):
    """A real CUDA build: a comment edit of tree_accept.cu is IDENTICAL (nvcc's
    path-dependent names normalised), a grid-sizing edit BUILT, a syntax error STILLBORN."""
    import fcntl
    import shutil

    if workspace.nvcc_path() is None:
        pytest.fail("nvcc not found: this test needs the CUDA toolkit (compile only)")
    ta = "cuda_tests/kernels/tree_accept.cu"
    text = (REPO_ROOT / ta).read_text()
    cases = {"grid": ("const int64_t blocks = (B + kWarpsPerBlock - 1) / kWarpsPerBlock;",
                      "const int64_t blocks = B / kWarpsPerBlock;", mut.BUILT),
             "comment": ("// whole warps leave together: B is compared per warp", "// whole warps leave together",
                         mut.IDENTICAL),
             "syntax": ("if (B == 0) return cudaSuccess;", "if (B == 0) return cudaSuccess", mut.STILLBORN)}
    mutants = []
    for name, (find, replace, _) in cases.items():
        assert text.count(find) == 1, name
        mutants.append(mut.Mutant(f"gpu/tree_accept/{name}", "tree_accept", ta, "b", "o", find, replace,
                                  backend="cuda", kernel="tree_accept"))
    with open("/tmp/nvcc.lock", "w") as lock:  # nvcc compiles are serialised machine-wide
        fcntl.flock(lock, fcntl.LOCK_EX)
        ws = mut.CudaWorkspace(REPO_ROOT, tmp_path, tmp_path / "cache", jobs=2)
        results = cuda.run(mutants, ws, cuda.CudaPlan({}, REPO_ROOT / "golden"), 1, build_only=True)
    assert {r.mutant.id.rsplit("/", 1)[1]: r.outcome for r in results} == {n: o for n, (_, _, o) in cases.items()}
    assert ws.ops_of(ta) == ["tree_accept", "greedy_step", "ddtree_decode"]  # the binaries that link it
    shutil.rmtree(tmp_path / "cache", ignore_errors=True)


# --- failures of the machine, not of the mutant ------------------------------------------------

def test_a_crash_the_unmutated_build_shows_too_is_not_a_kill(checkout, tmp_path, monkeypatch):
    """The GPU out of memory for every build once the mutant runs (another job's memory):
    the survivor's CRASH is the machine's; the unmutated build, run again on that case,
    fails too, so the run stops (exit 2) instead of reporting a kill."""
    monkeypatch.setenv("FAKE_OOM", str(tmp_path / "oom"))
    res = _invoke(checkout, "--only", "gpu/simt/survives", "--sanitizer-tools", "none")
    assert res.exit_code == 2, res.output
    assert "the unmutated cuda build fails verify_attn/dv_full@cuda:simt too" in res.output
    assert "out of memory" in res.output
    assert not (checkout / "reports" / "mutation.json").exists()


def test_a_crash_only_the_mutant_shows_is_still_a_kill(checkout, tmp_path):
    (checkout / "mutants/gpu/simt.toml").write_text(_entry("crash", "simt", "MODE=pass", "MODE=crash"))
    m = _one(checkout, "crash", "--sanitizer-tools", "none")  # the unmutated build, run again, passes
    assert m["outcome"] == mut.KILLED, m
    assert m["detail"].startswith("verify_attn/dv_full@cuda:simt: CRASH: exit 1: ") and "illegal memory" in m["detail"]


@pytest.mark.parametrize("code", ["1", "error-exitcode"])  # its own exit code, or the one it was given
def test_a_sanitizer_that_stops_starting_is_not_a_kill(checkout, tmp_path, monkeypatch, code):
    """compute-sanitizer fails to start (for every build) after the unmutated build was
    checked clean: the survivor is not KILLED (nor KILLED_BY_SANITIZER); the run stops."""
    from kdtr.run.cases import SANITIZER_EXIT

    monkeypatch.setenv("FAKE_SAN_BROKEN", str(tmp_path / "san-broken"))
    monkeypatch.setenv("FAKE_SAN_BROKEN_EXIT", str(SANITIZER_EXIT) if code == "error-exitcode" else code)
    res = _invoke(checkout, "--only", "gpu/simt/survives", "--sanitizer-tools", "memcheck")
    assert res.exit_code == 2, res.output
    assert "the unmutated cuda build fails verify_attn/dv_full@cuda:simt too under compute-sanitizer memcheck" \
        in res.output
    assert not (checkout / "reports" / "mutation.json").exists()
