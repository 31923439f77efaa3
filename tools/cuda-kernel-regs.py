#!/usr/bin/env python3
"""Registers and spills of kiln's CUDA kernels, as ptxas reports them, without a GPU.

Assembles crates/kiln-cuda/src/kernels/*.cu in build.rs's order, compiles it with NVRTC
(`-Xptxas -v`) for one architecture, and prints a line per kernel whose name matches the
pattern: registers, stack frame and spill bytes. A decode product that spills keeps its
preloaded weight blocks in local memory instead of registers; this shows it before a GPU
run does.

    LD_LIBRARY_PATH=/tmp/nvrtc/nvidia/cu13/lib tools/cuda-kernel-regs.py 'matvec_dec_.*_4_1'
    tools/cuda-kernel-regs.py --spills            # only the kernels that spill

libnvrtc comes from the CUDA toolkit or the `nvidia-cuda-nvrtc` wheel (its lib directory on
LD_LIBRARY_PATH, with libnvrtc-builtins beside it).
"""
import argparse
import ctypes
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CRATE = ROOT / "crates" / "kiln-cuda"


def source() -> str:
    build = (CRATE / "build.rs").read_text()
    files = re.search(r"const FILES: \[&str; \d+\] = \[(.*?)\];", build, re.S)
    if not files:
        sys.exit("build.rs: no FILES list")
    names = re.findall(r'"([^"]+\.cu)"', files.group(1))
    return "".join((CRATE / "src" / "kernels" / n).read_text() for n in names)


def compile_log(src: str, arch: str) -> str:
    try:
        lib = ctypes.CDLL("libnvrtc.so.13")
    except OSError:
        try:
            lib = ctypes.CDLL("libnvrtc.so.12")
        except OSError:
            sys.exit("libnvrtc not found: put its lib directory on LD_LIBRARY_PATH")
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"kernels.cu", 0, None, None):
        sys.exit("nvrtcCreateProgram failed")
    opts = [f"--gpu-architecture={arch}".encode(), b"--std=c++17", b"-Xptxas", b"-v"]
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    n = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    buf = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetProgramLog(prog, buf)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    log = buf.value.decode(errors="replace")
    if rc:
        sys.exit(f"compile failed:\n{log}")
    return log


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pattern", nargs="?", default=".", help="regex on kernel names")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--spills", action="store_true", help="only kernels that spill")
    a = ap.parse_args()
    pat = re.compile(a.pattern)
    rows = []
    name = None
    frame = spill_st = spill_ld = 0
    for line in compile_log(source(), a.arch).splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            name, frame, spill_st, spill_ld = m.group(1), 0, 0, 0
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and name:
            frame, spill_st, spill_ld = map(int, m.groups())
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and name and pat.search(name):
            if not a.spills or spill_st or spill_ld:
                rows.append((name, int(m.group(1)), frame, spill_st, spill_ld))
            name = None
    for r in sorted(rows):
        print(f"{r[0]:40s} {r[1]:4d} registers  {r[2]:5d} B frame  {r[3]:5d} B spill stores  {r[4]:5d} B spill loads")
    return 0


if __name__ == "__main__":
    sys.exit(main())
