#!/usr/bin/env python3
"""Checks launch.cuh's contract over kernels/cuda/*.cu: every __global__ function's first
statement is pdl_entry() (or pdl_prefetch_entry(...), which prefetches weights into L2 and then
calls it; the group kernel may first find its item), and no kernel is launched with <<<>>> (launch_kernel sets the PDL
attribute, so a kernel launched after one that skipped its wait could race with it).
Usage: check_pdl_entry.py KERNELS_CUDA_DIR  (exit 0 when every kernel conforms)."""
import pathlib
import re
import sys


def strip_comments(s: str) -> str:
    s = re.sub(r"/\*.*?\*/", " ", s, flags=re.S)
    return re.sub(r"//[^\n]*", " ", s)


def check(path: pathlib.Path) -> list:
    src = strip_comments(path.read_text())
    bad = []
    for m in re.finditer(r"__global__[^;{]*?\b(\w+)\s*\(", src):
        body = src.find("{", m.end())
        first = src[body + 1:].lstrip()
        if first.startswith("int i = 0;"):  # a grouped kernel finding its item (registers only)
            loop = re.match(r"int i = 0;\s*while \([^;]*\) \+\+i;\s*", first)
            first = first[loop.end():] if loop else first
        if not (first.startswith("pdl_entry();") or first.startswith("pdl_prefetch_entry(")):
            bad.append(f"{path.name}: kernel {m.group(1)} does not start with pdl_entry()")
    for m in re.finditer(r"<<<", src):
        line = src.count("\n", 0, m.start()) + 1
        bad.append(f"{path.name}:{line}: a <<<>>> launch (use launch_kernel)")
    return bad


def main() -> int:
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(sys.argv) == 2 else 2
    files = sorted(pathlib.Path(sys.argv[1]).glob("*.cu"))
    if not files:
        print(f"check_pdl_entry: no .cu files in {sys.argv[1]}", file=sys.stderr)
        return 2
    bad = [b for f in files for b in check(f)]
    kernels = sum(len(re.findall(r"__global__", strip_comments(f.read_text()))) for f in files)
    for b in bad:
        print(b, file=sys.stderr)
    print(f"check_pdl_entry: {kernels} kernels in {len(files)} files, {len(bad)} problems")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
