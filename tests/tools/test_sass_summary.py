"""tools/sass_summary.py: instruction counts per kernel from cuobjdump SASS, ptxas -v figures.

The fixtures under tests/data are real tool output for tests/data/sass_fixture.cu (sm_90)
and sass_fixture_sm90a.cu (sm_90a), linked into one executable (the commands are in
sass_fixture.cu): ``cuobjdump --dump-sass`` (sass_fixture.sass.txt), ``cuobjdump
--list-elf`` (sass_fixture.elf.txt) and ``nvcc -Xptxas -v`` (sass_fixture.ptxas.txt).  So
these tests run without cuobjdump; where nvcc and cuobjdump both exist, the last test also
compiles the fixture sources and summarizes the real object.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import load_tool

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
SASS = DATA / "sass_fixture.sass.txt"
ELF = DATA / "sass_fixture.elf.txt"
PTXAS = DATA / "sass_fixture.ptxas.txt"


ss = load_tool("sass_summary")

MMA = "_ZN4kdtr7fixture10mma_kernelILi2EEEvPK13__nv_bfloat16Pf"
FFMA = "_ZN4kdtr7fixture11ffma_kernelEPKfPff"
LOCAL = "_ZN4kdtr7fixture12local_kernelEPKfPfi"
WGMMA = "_ZN4kdtr7fixture12wgmma_kernelEmmPf"


def _by_key(funcs):
    return {(f.arch, f.name): f for f in funcs}


def test_counts_per_kernel_and_arch():
    funcs = ss.parse_sass(SASS.read_text())
    got = _by_key(funcs)
    assert sorted(got) == sorted([("sm_90", LOCAL), ("sm_90", MMA), ("sm_90", FFMA), ("sm_90", "spill_kernel"),
                                  ("sm_90a", WGMMA)])
    table = {k: tuple(f.count(o) for o in ("HGMMA", "HMMA", "LDSM", "FFMA", "LDL", "STL", "BAR"))
             for k, f in got.items()}
    assert table == {
        ("sm_90a", WGMMA): (1, 0, 0, 0, 0, 0, 0),
        ("sm_90", MMA): (0, 2, 1, 0, 0, 0, 1),
        ("sm_90", FFMA): (0, 0, 0, 8, 0, 0, 1),
        ("sm_90", LOCAL): (0, 0, 0, 0, 1, 1, 0),
        ("sm_90", "spill_kernel"): (0, 0, 0, 48, 10, 8, 0),
    }
    # instructions exclude the NOP padding after EXIT / BRA
    assert got[("sm_90a", WGMMA)].instructions == 17
    assert got[("sm_90a", WGMMA)].count("NOP") > 0
    assert got[("sm_90a", WGMMA)].count("WARPGROUP") == 2


def test_counts_agree_with_a_plain_scan_of_the_fixture():
    """Totals over all kernels equal the number of fixture lines whose opcode is that one."""
    text = SASS.read_text()
    funcs = ss.parse_sass(text)
    for op in ("HGMMA", "HMMA", "LDSM", "FFMA", "LDL", "STL", "BAR"):
        lines = len(re.findall(rf"^\s*/\*[0-9a-f]+\*/\s+(?:@!?P\w+\s+)?{op}[ .]", text, re.M))
        assert sum(f.count(op) for f in funcs) == lines, op
        assert lines > 0, op


@pytest.mark.parametrize("insn, op", [
    ("HMMA.16816.F32.BF16 R8, R4, R4, RZ", "HMMA"),
    ("@!P0 HMMA.16816.F32.BF16 R8, R4, R4, R8", "HMMA"),
    ("@P1 BRA 0x7d0", "BRA"),
    ("@!UP0 LDL.LU R3, [R1+0x4]", "LDL"),
    ("STL.128 [R1], R4", "STL"),
    ("HGMMA.64x8x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT, gsb0", "HGMMA"),
    ("LDSM.16.MT88.4 R4, [R4]", "LDSM"),
    ("BAR.SYNC.DEFER_BLOCKING 0x0", "BAR"),
    ("{ FFMA R0, R1, R2, R3", "FFMA"),
    ("UTMALDG.2D [UR8], [UR4]", "UTMALDG"),
    ("NOP", "NOP"),
])
def test_base_opcode(insn, op):
    assert ss.base_opcode(insn) == op


def test_elf_list():
    elfs = ss.parse_elf_list(ELF.read_text())
    assert [(i, a) for i, _n, a in elfs] == [(1, "sm_90"), (2, "sm_90a"), (3, "sm_90"), (4, "sm_90a")]
    assert ss.elf_line(elfs) == "ELF files: 4 (sm_90: 2, sm_90a: 2)"


def test_ptxas_figures():
    info = ss.parse_ptxas(PTXAS.read_text())
    sp = info[("spill_kernel", "sm_90")]
    assert (sp.registers, sp.stack, sp.spill_stores, sp.spill_loads) == (24, 32, 32, 40)
    loc = info[(LOCAL, "sm_90")]
    assert (loc.registers, loc.stack, loc.spill_stores, loc.spill_loads) == (10, 32, 0, 0)
    wg = info[(WGMMA, "sm_90a")]
    assert (wg.registers, wg.stack) == (30, 0)
    assert (WGMMA, "sm_90") not in info


def test_ptxas_log_inside_a_build_log():
    """Other make output around the ptxas lines, a second arch, a non-entry device function."""
    log = "\n".join([
        "nvcc -std=c++17 -O2 -Xptxas -v -c cuda_tests/kernels/verify_attn.cu -o build/obj/x.o",
        "ptxas info    : 11 bytes gmem",
        "ptxas info    : Function properties for _ZN4kdtr6helperEv",
        "    16 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads",
        "ptxas info    : Compiling entry function '_ZN4kdtr1kILi576EEEvv' for 'sm_90'",
        "ptxas info    : Function properties for _ZN4kdtr1kILi576EEEvv",
        "    8 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads",
        "ptxas info    : Used 255 registers, used 1 barriers, 8 bytes cumulative stack size, 528 bytes cmem[0]",
        "ptxas info    : Compile time = 812.000 ms",
        "cutlass: something else",
        "ptxas info    : Compiling entry function '_ZN4kdtr1kILi576EEEvv' for 'sm_90a'",
        "ptxas info    : Function properties for _ZN4kdtr1kILi576EEEvv",
        "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads",
        "ptxas info    : Used 168 registers, used 1 barriers",
    ])
    info = ss.parse_ptxas(log)
    a, b = info[("_ZN4kdtr1kILi576EEEvv", "sm_90")], info[("_ZN4kdtr1kILi576EEEvv", "sm_90a")]
    assert (a.registers, a.stack, a.spill_stores, a.spill_loads) == (255, 8, 8, 12)
    assert (b.registers, b.stack, b.spill_stores, b.spill_loads) == (168, 0, 0, 0)
    helper = info[("_ZN4kdtr6helperEv", "?")]
    assert helper.registers is None and helper.spill_stores == 4


@pytest.mark.parametrize("mangled, short", [
    (MMA, "mma_kernel<2>"),
    (WGMMA, "wgmma_kernel"),
    ("spill_kernel", "spill_kernel"),
    ("_ZN4kdtr12_GLOBAL__N_13mma22verify_attn_mma_kernelILi576ELi512EEEvNS_17VerifyAttnProblemE",
     "verify_attn_mma_kernel<576, 512>"),
    ("_ZN4kdtr4simt23verify_attn_simt_kernelItLi8EEEvNS_17VerifyAttnProblemE",
     "verify_attn_simt_kernel<unsigned short, 8>"),
])
def test_short_names_by_regex(mangled, short):
    assert ss.short_from_mangled(mangled) == short


def test_short_name_of_a_class_template_argument_is_elided():
    assert ss.short_from_mangled("_ZN7cutlass13device_kernelIN4kdtr4sm906KernelEEEvNT_6ParamsE") == "device_kernel<...>"


@pytest.mark.skipif(shutil.which("c++filt") is None, reason="c++filt is not on PATH")
def test_short_names_through_cxxfilt_match_the_regex():
    names = [MMA, WGMMA, FFMA, LOCAL, "spill_kernel",
             "_ZN4kdtr12_GLOBAL__N_13mma22verify_attn_mma_kernelILi576ELi512EEEvNS_17VerifyAttnProblemE"]
    dem = ss.demangle_all(names)
    assert dem[MMA] == "void kdtr::fixture::mma_kernel<2>(__nv_bfloat16 const*, float*)"
    for n in names:
        assert ss.short_from_demangled(dem[n]) == ss.short_from_mangled(n)
    long = "void a::b<c::d<int, x::y<1> >, 7>(int)"
    assert ss.short_from_demangled(long) == "b<d<int, y<1> >, 7>"
    assert ss.short_from_demangled(long, width=12) == "b<d<...>, 7>"


def test_cli_markdown_with_ptxas(capsys):
    rc = ss.main(["--sass-text", str(SASS), "--elf-text", str(ELF), "--ptxas-log", str(PTXAS), "--md"])
    out = capsys.readouterr().out
    assert rc == 0
    assert out.startswith("ELF files: 4 (sm_90: 2, sm_90a: 2)\n")
    assert "| arch | kernel | HGMMA | HMMA | LDSM | FFMA | LDL | STL | BAR | UTMALDG | instrs | regs | stack B |" in out
    assert "\n| --- | --- |" + " ---: |" * 13 + "\n" in out
    assert "| sm_90a | `wgmma_kernel` | 1 | 0 | 0 | 0 | 0 | 0 | 0 | 0 | 17 | 30 | 0 | 0 | 0 |" in out
    assert "| sm_90 | `spill_kernel` | 0 | 0 | 0 | 48 | 10 | 8 | 0 | 0 | 102 | 24 | 32 | 32 | 40 |" in out
    assert "| sm_90 | `mma_kernel<2>` | 0 | 2 | 1 | 0 | 0 | 0 | 1 | 0 | 25 | 20 | 0 | 0 | 0 |" in out


def test_cli_text_filter_ops_and_missing_ptxas_entries(capsys, tmp_path):
    log = tmp_path / "ptxas.txt"
    log.write_text("\n".join(PTXAS.read_text().splitlines()[:6]))  # the local_kernel entry only
    rc = ss.main(["--sass-text", str(SASS), "--filter", "kernel<|local", "--ops", "hmma,ldl", "--ptxas-log", str(log)])
    out = capsys.readouterr().out.splitlines()
    assert rc == 0
    assert out[0].split() == ["arch", "kernel", "HMMA", "LDL", "instrs", "regs", "stack", "B", "spill", "st", "B",
                              "spill", "ld", "B"]
    assert out[1].split() == ["sm_90", "local_kernel", "0", "1", "29", "10", "32", "0", "0"]
    assert out[2].split() == ["sm_90", "mma_kernel<2>", "2", "0", "25", "-", "-", "-", "-"]
    assert len(out) == 4 and out[3].startswith("(-: no ptxas -v entry")


def test_cli_failures(capsys, tmp_path):
    assert ss.main(["--sass-text", str(SASS), "--filter", "no_such_kernel"]) == 2
    assert "no kernel function in the SASS matching 'no_such_kernel'" in capsys.readouterr().err
    assert ss.main(["--sass-text", str(tmp_path / "missing.txt")]) == 2
    assert "missing.txt" in capsys.readouterr().err
    assert ss.main([str(SASS), "--cuobjdump", str(tmp_path / "no-cuobjdump")]) == 2
    assert "no-cuobjdump" in capsys.readouterr().err


def test_script_runs_as_a_command():
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "sass_summary.py"), "--sass-text", str(SASS),
                        "--filter", "wgmma"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[1].split()[:3] == ["sm_90a", "wgmma_kernel", "1"]


NVCC = shutil.which("nvcc")
CUOBJDUMP = ss.find_cuobjdump()


@pytest.mark.skipif(NVCC is None or CUOBJDUMP is None, reason="needs nvcc and cuobjdump")
def test_real_object(tmp_path, capsys):
    """Compile the fixture sources for sm_90 / sm_90a and summarize the real object."""
    a, b, exe, log = tmp_path / "a.o", tmp_path / "b.o", tmp_path / "fx", tmp_path / "ptxas.txt"
    cmds = [
        [NVCC, "-O2", "-gencode", "arch=compute_90,code=sm_90", "-Xptxas", "-v", "-c", str(DATA / "sass_fixture.cu"),
         "-o", str(a)],
        [NVCC, "-O2", "-gencode", "arch=compute_90a,code=sm_90a", "-Xptxas", "-v", "-c",
         str(DATA / "sass_fixture_sm90a.cu"), "-o", str(b)],
        [NVCC, "-gencode", "arch=compute_90,code=sm_90", "-gencode", "arch=compute_90a,code=sm_90a", str(a), str(b),
         "-o", str(exe)],
    ]
    text = ""
    for c in cmds:
        r = subprocess.run(c, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        text += r.stdout + r.stderr
    log.write_text(text)
    assert ss.main([str(exe), "--ptxas-log", str(log), "--no-cxxfilt"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert re.match(r"ELF files: \d+ \(.*sm_90a", lines[0])
    head = lines[1].split()
    col = {name: head.index(name) for name in ("HGMMA", "HMMA", "LDSM", "FFMA", "LDL", "STL", "BAR")}
    rows = {tuple(line.split()[:2]): line.split() for line in lines[2:] if line.startswith("sm_")}
    n = lambda arch, kern, op: int(rows[(arch, kern)][col[op]])  # noqa: E731
    assert n("sm_90", "ffma_kernel", "FFMA") > 0 and n("sm_90", "ffma_kernel", "BAR") > 0
    assert n("sm_90", "mma_kernel<2>", "HMMA") > 0 and n("sm_90", "mma_kernel<2>", "LDSM") > 0
    assert n("sm_90", "local_kernel", "LDL") > 0
    assert n("sm_90a", "wgmma_kernel", "HGMMA") > 0
    assert ("sm_90", "wgmma_kernel") not in rows
    spill = rows[("sm_90", "spill_kernel")]
    assert int(spill[-4]) > 0 and int(spill[-2]) > 0  # registers, spill stores from the ptxas log
