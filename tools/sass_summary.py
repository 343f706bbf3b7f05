#!/usr/bin/env python3
"""Instruction mix of each CUDA kernel in a binary or object, from its SASS.

    python3 tools/sass_summary.py [BINARY] [--ptxas-log FILE ...] [--md] [--filter REGEX]
    python3 tools/sass_summary.py --sass-text DUMP [--elf-text LIST] [...]

Runs ``cuobjdump --dump-sass BINARY`` (default build/bin/kdtr_verify_attn) and
``cuobjdump --list-elf BINARY`` and prints one row per (SM arch, kernel function): the
function's short name (demangled by c++filt where it is on PATH, else shortened from the
Itanium mangling by a regex; namespaces dropped, long template arguments elided), the
counts of the instructions whose base opcode (the mnemonic before the first '.', predicate
dropped) is HGMMA (wgmma), HMMA (mma.sync), LDSM (ldmatrix), FFMA, LDL / STL (local
memory: spills or local arrays), BAR (block barriers) and UTMALDG (TMA loads), and the
number of instructions (NOP padding not counted).  ``--ops A,B,...`` picks other opcodes.

With ``--ptxas-log FILE`` (the output of ``nvcc -Xptxas -v``, e.g. a build log; may
repeat), each row adds registers, stack frame and spill store / load bytes of that kernel
for that arch, matched by mangled name and arch ("Compiling entry function 'X' for
'sm_90a'", "Function properties for X", "Used N registers").  Build with
``make -O`` (``--output-sync``) when running make in parallel, so that the lines of one
ptxas run stay together.

``--md`` prints a Markdown table.  ``--sass-text`` / ``--elf-text`` read captured
cuobjdump output instead of running it (tests, or a dump taken on another machine).
cuobjdump is looked for on PATH, then in $CUDA_HOME/bin and /usr/local/cuda/bin
(``--cuobjdump PATH`` overrides).  Exit 0; 2 when cuobjdump is missing or fails, a file
cannot be read, or no kernel function is found (one line on stderr).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_BINARY = ROOT / "build" / "bin" / "kdtr_verify_attn"
DEFAULT_OPS = ("HGMMA", "HMMA", "LDSM", "FFMA", "LDL", "STL", "BAR", "UTMALDG")

_ARCH = re.compile(r"^\s*(?:arch\s*=|code for)\s*(sm_\w+)")
_FUNC = re.compile(r"^\s*Function\s*:\s*(\S+)")
# "        /*0890*/                   LDSM.16.M88.4 R4, [R4] ;   /* 0x0000... */"
_INSN = re.compile(r"^\s*/\*[0-9a-fA-F]+\*/\s+(.*?)\s*;")
_PRED = re.compile(r"^@!?U?P[A-Z0-9]+\s+")
_ELF = re.compile(r"ELF file\s+(\d+):\s*(\S+)")
_SM = re.compile(r"sm_\d+[a-z]?")

_PTX_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\w+)'")
_PTX_PROPS = re.compile(r"Function properties for (\S+)")
_PTX_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_PTX_USED = re.compile(r"Used (\d+) registers")


class Failure(Exception):
    """A reason to exit 2, said in one line."""


@dataclass
class Function:
    arch: str
    name: str  # mangled, as cuobjdump prints it
    ops: dict[str, int] = field(default_factory=dict)  # base opcode -> count
    instructions: int = 0  # NOP not counted

    def count(self, op: str) -> int:
        return self.ops.get(op, 0)


@dataclass
class PtxasInfo:
    registers: int | None = None
    stack: int | None = None
    spill_stores: int | None = None
    spill_loads: int | None = None


def base_opcode(insn: str) -> str:
    """'@!P0 HMMA.16816.F32.BF16 R8, ...' -> 'HMMA'."""
    s = insn.strip().lstrip("{").strip()
    s = _PRED.sub("", s)
    return s.split(None, 1)[0].split(".", 1)[0] if s else ""


def parse_sass(text: str) -> list[Function]:
    """Functions of a ``cuobjdump --dump-sass`` listing, in order, with opcode counts."""
    funcs: list[Function] = []
    arch = "?"
    cur: Function | None = None
    for line in text.splitlines():
        m = _ARCH.match(line)
        if m:
            arch, cur = m.group(1), None
            continue
        m = _FUNC.match(line)
        if m:
            cur = Function(arch, m.group(1))
            funcs.append(cur)
            continue
        if cur is None:
            continue
        m = _INSN.match(line)
        if m:
            op = base_opcode(m.group(1))
            if op:
                cur.ops[op] = cur.ops.get(op, 0) + 1
                if op != "NOP":
                    cur.instructions += 1
    return funcs


def parse_elf_list(text: str) -> list[tuple[int, str, str]]:
    """(index, file name, arch) per line of ``cuobjdump --list-elf``."""
    out = []
    for line in text.splitlines():
        m = _ELF.search(line)
        if m:
            sm = _SM.search(m.group(2))
            out.append((int(m.group(1)), m.group(2), sm.group(0) if sm else "?"))
    return out


def parse_ptxas(text: str) -> dict[tuple[str, str], PtxasInfo]:
    """{(mangled name, arch): PtxasInfo} from ``ptxas -v`` lines (other lines ignored)."""
    info: dict[tuple[str, str], PtxasInfo] = {}
    entry: tuple[str, str] | None = None  # the entry function ptxas is compiling
    props: tuple[str, str] | None = None  # whose "Function properties" the next line gives
    arch = "?"
    for line in text.splitlines():
        m = _PTX_ENTRY.search(line)
        if m:
            arch = m.group(2)
            entry = (m.group(1), arch)
            info.setdefault(entry, PtxasInfo())
            props = None
            continue
        m = _PTX_PROPS.search(line)
        if m:
            props = (m.group(1), arch)
            continue
        m = _PTX_FRAME.search(line)
        if m and props is not None:
            i = info.setdefault(props, PtxasInfo())
            i.stack, i.spill_stores, i.spill_loads = (int(g) for g in m.groups())
            props = None
            continue
        m = _PTX_USED.search(line)
        if m and entry is not None:
            info[entry].registers = int(m.group(1))
            entry = None
    return info


# ---------------------------------------------------------------------------------------
# names
# ---------------------------------------------------------------------------------------


def demangle_all(names: list[str], cxxfilt: str | None = None) -> dict[str, str]:
    """{mangled: demangled} through one c++filt process; {} when there is none or it fails."""
    tool = cxxfilt or shutil.which("c++filt")
    if not tool or not names:
        return {}
    try:
        r = subprocess.run([tool], input="\n".join(names) + "\n", capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return {}
    lines = r.stdout.splitlines()
    if r.returncode != 0 or len(lines) != len(names):
        return {}
    return dict(zip(names, lines))


def _top_level_split(s: str, sep: str) -> list[str]:
    """Split s on sep outside <>, () and []."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(s):
        c = s[i]
        if c in "<([":
            depth += 1
        elif c in ">)]":
            depth -= 1
        elif depth == 0 and s.startswith(sep, i):
            parts.append(s[start:i])
            i += len(sep)
            start = i
            continue
        i += 1
    parts.append(s[start:])
    return parts


def _strip_params(s: str) -> str:
    """'void a::f<1>(int, float*)' -> 'void a::f<1>' (the last top-level parenthesis)."""
    s = s.strip()
    if not s.endswith(")"):
        return s
    depth = 0
    for i in range(len(s) - 1, -1, -1):
        if s[i] == ")":
            depth += 1
        elif s[i] == "(":
            depth -= 1
            if depth == 0:
                return s[:i].rstrip()
    return s


_QUAL = re.compile(r"(?:\(anonymous namespace\)|[A-Za-z_]\w*)::")


def _elide_templates(s: str, width: int) -> str:
    """Replace template arguments nested deeper than one level by '...', then cut to width."""
    if len(s) > width:
        out, depth = [], 0
        for c in s:
            if c == "<":
                depth += 1
                if depth == 2:
                    out.append("<...")
                    continue
            elif c == ">":
                depth -= 1
                if depth == 1:
                    out.append(">")
                    continue
            if depth < 2:
                out.append(c)
        s = "".join(out)
    if len(s) > width:
        s = s[: max(width - 3, 1)] + "..."
    return s


def short_from_demangled(dem: str, width: int = 72) -> str:
    """'void kdtr::(anonymous namespace)::mma::kernel<576, 512>(kdtr::P)' -> 'kernel<576, 512>'."""
    s = _strip_params(dem)
    words = _top_level_split(s, " ")
    # a function template's demangling starts with its return type; keep the name
    s = words[-1] if words else s
    s = _QUAL.sub("", s)
    return _elide_templates(s, width)


_BUILTIN = {"i": "int", "j": "unsigned", "l": "long", "m": "unsigned long", "b": "bool",
            "f": "float", "d": "double", "c": "char", "h": "unsigned char", "s": "short", "t": "unsigned short"}


def _parse_source_name(s: str, i: int) -> tuple[str | None, int]:
    m = re.match(r"(\d+)", s[i:])
    if not m:
        return None, i
    n = int(m.group(1))
    j = i + len(m.group(1))
    return s[j : j + n], j + n


def short_from_mangled(name: str, width: int = 72) -> str:
    """Regex shortening of an Itanium-mangled name when c++filt is absent.

    '_ZN4kdtr3mma22verify_attn_mma_kernelILi576ELi512EEEvNS_1PE' -> 'verify_attn_mma_kernel<576, 512>';
    unmangled names (extern "C") are returned as they are.
    """
    if not name.startswith("_Z"):
        return _elide_templates(name, width)
    i = 2
    last = None
    if name.startswith("N", i):
        i += 1
        while i < len(name) and name[i] in "rVKL":  # cv / ref qualifiers of member functions
            i += 1
        while i < len(name):
            if name.startswith("St", i):
                i += 2
                continue
            ident, j = _parse_source_name(name, i)
            if ident is None:
                break
            last, i = ident, j
            if i < len(name) and not name[i].isdigit():
                break  # 'I': the last name's template arguments; 'E': the end of the name
    else:
        last, i = _parse_source_name(name, i)
    if last is None:
        return _elide_templates(name, width)
    if i < len(name) and name[i] == "I":
        # template arguments: integer / bool literals and builtin types are shown, any other
        # argument (a class, a pointer, ...) makes the whole list '<...>'
        args, j = [], i + 1
        while j < len(name) and name[j] != "E":
            m = re.match(r"L([a-z])(n?\d+)E", name[j:])
            if m:
                v = m.group(2).replace("n", "-")
                args.append(("true" if v == "1" else "false") if m.group(1) == "b" else v)
                j += m.end()
            elif name[j] in _BUILTIN:
                args.append(_BUILTIN[name[j]])
                j += 1
            else:
                args = ["..."]
                break
        last += "<" + ", ".join(args) + ">"
    return _elide_templates(last, width)


def short_names(names: list[str], width: int = 72, use_cxxfilt: bool = True) -> dict[str, str]:
    dem = demangle_all(sorted(set(names))) if use_cxxfilt else {}
    out = {}
    for n in names:
        d = dem.get(n)
        out[n] = short_from_demangled(d, width) if d and d != n else short_from_mangled(n, width)
    return out


# ---------------------------------------------------------------------------------------
# cuobjdump
# ---------------------------------------------------------------------------------------


def find_cuobjdump(explicit: str | None = None) -> str | None:
    if explicit:
        return explicit
    found = shutil.which("cuobjdump")
    if found:
        return found
    for d in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if d and (Path(d) / "bin" / "cuobjdump").is_file():
            return str(Path(d) / "bin" / "cuobjdump")
    return None


def run_cuobjdump(tool: str, flag: str, binary: Path) -> str:
    try:
        r = subprocess.run([tool, flag, str(binary)], capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.SubprocessError) as exc:
        raise Failure(f"{tool} {flag} {binary}: {exc}") from exc
    if r.returncode != 0:
        msg = (r.stderr.strip() or r.stdout.strip()).splitlines()
        raise Failure(f"{tool} {flag} {binary}: exit {r.returncode}: {msg[-1] if msg else ''}")
    return r.stdout


# ---------------------------------------------------------------------------------------
# table
# ---------------------------------------------------------------------------------------


def _ptxas_for(f: Function, ptx: dict[tuple[str, str], PtxasInfo]) -> PtxasInfo | None:
    hit = ptx.get((f.name, f.arch))
    if hit is not None:
        return hit
    same = [v for (n, _a), v in ptx.items() if n == f.name]
    return same[0] if len(same) == 1 else None


def table_rows(funcs: list[Function], ops: tuple[str, ...], names: dict[str, str],
               ptx: dict[tuple[str, str], PtxasInfo] | None) -> tuple[list[str], list[list[str]]]:
    head = ["arch", "kernel", *ops, "instrs"]
    if ptx is not None:
        head += ["regs", "stack B", "spill st B", "spill ld B"]
    rows = []
    for f in funcs:
        row = [f.arch, names.get(f.name, f.name), *(str(f.count(o)) for o in ops), str(f.instructions)]
        if ptx is not None:
            i = _ptxas_for(f, ptx)
            vals = (i.registers, i.stack, i.spill_stores, i.spill_loads) if i else (None,) * 4
            row += ["-" if v is None else str(v) for v in vals]
        rows.append(row)
    return head, rows


def format_text(head: list[str], rows: list[list[str]]) -> str:
    w = [max(len(r[k]) for r in [head, *rows]) for k in range(len(head))]
    lines = []
    for r in [head, *rows]:
        cells = [r[k].ljust(w[k]) if k < 2 else r[k].rjust(w[k]) for k in range(len(r))]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def format_md(head: list[str], rows: list[list[str]]) -> str:
    esc = lambda s: s.replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(head) + " |",
             "| " + " | ".join("---" if k < 2 else "---:" for k in range(len(head))) + " |"]
    lines += ["| " + " | ".join(esc(c) if k != 1 else f"`{esc(c)}`" for k, c in enumerate(r)) + " |" for r in rows]
    return "\n".join(lines)


def elf_line(elfs: list[tuple[int, str, str]]) -> str:
    if not elfs:
        return "ELF files: none listed"
    counts: dict[str, int] = {}
    for _i, _n, a in elfs:
        counts[a] = counts.get(a, 0) + 1
    return f"ELF files: {len(elfs)} (" + ", ".join(f"{a}: {c}" for a, c in counts.items()) + ")"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("binary", nargs="?", type=Path, default=DEFAULT_BINARY)
    ap.add_argument("--ptxas-log", action="append", type=Path, default=[],
                    help="output of nvcc -Xptxas -v (a build log); may repeat")
    ap.add_argument("--md", action="store_true", help="Markdown table")
    ap.add_argument("--filter", help="keep kernels whose mangled or short name matches this regex")
    ap.add_argument("--ops", help=f"comma-separated base opcodes to count (default {','.join(DEFAULT_OPS)})")
    ap.add_argument("--width", type=int, default=72, help="longest kernel name shown")
    ap.add_argument("--mangled", action="store_true", help="show mangled names")
    ap.add_argument("--no-cxxfilt", action="store_true", help="shorten names by regex even where c++filt exists")
    ap.add_argument("--cuobjdump", help="the cuobjdump to run")
    ap.add_argument("--sass-text", type=Path, help="read this cuobjdump --dump-sass output instead of running it")
    ap.add_argument("--elf-text", type=Path, help="read this cuobjdump --list-elf output instead of running it")
    args = ap.parse_args(argv)
    ops = tuple(o.strip().upper() for o in args.ops.split(",") if o.strip()) if args.ops else DEFAULT_OPS
    try:
        if args.sass_text:
            sass = _read(args.sass_text)
            elf_text = _read(args.elf_text) if args.elf_text else None
            source = str(args.sass_text)
        else:
            tool = find_cuobjdump(args.cuobjdump)
            if tool is None:
                raise Failure("cuobjdump not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin); "
                              "give --cuobjdump or --sass-text")
            if not args.binary.is_file():
                raise Failure(f"{args.binary}: no such file (build it first)")
            sass = run_cuobjdump(tool, "--dump-sass", args.binary)
            elf_text = run_cuobjdump(tool, "--list-elf", args.binary)
            source = str(args.binary)
        ptx = None
        if args.ptxas_log:
            ptx = {}
            for p in args.ptxas_log:
                ptx.update(parse_ptxas(_read(p)))
        funcs = parse_sass(sass)
        names = ({f.name: f.name for f in funcs} if args.mangled
                 else short_names([f.name for f in funcs], args.width, not args.no_cxxfilt))
        if args.filter:
            rx = re.compile(args.filter)
            funcs = [f for f in funcs if rx.search(f.name) or rx.search(names[f.name])]
        if not funcs:
            matching = f" matching {args.filter!r}" if args.filter else ""
            raise Failure(f"{source}: no kernel function in the SASS{matching}")
    except Failure as exc:
        print(f"sass_summary: {exc}", file=sys.stderr)
        return 2
    head, rows = table_rows(funcs, ops, names, ptx)
    if elf_text is not None:
        print(elf_line(parse_elf_list(elf_text)) + ("\n" if args.md else ""))
    print(format_md(head, rows) if args.md else format_text(head, rows))
    if ptx is not None and any(r[-4] == "-" for r in rows):
        print(("\n" if args.md else "") + "(-: no ptxas -v entry for that kernel and arch in the log)")
    return 0


def _read(p: Path) -> str:
    try:
        return p.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise Failure(f"{p}: {exc.strerror or exc}") from exc


if __name__ == "__main__":
    sys.exit(main())
