#!/usr/bin/env python3
"""Code size of every CUDA kernel in object files, archives or cubins (no CUDA tools needed).

A decode step launches ~220 kernels, each on every multiprocessor, and the step's code does not
fit the instruction caches: a kernel's code is fetched again from L2 on most launches, so a
large body with little of it run waits on instruction fetch (kernels/cuda/generic_kernels.hpp).
This lists the device code (.text.<kernel> sections) of the sm_XX ELF images nvcc embeds in its
objects, largest first, names demangled through c++filt when it is installed.

  python3 bench/cuda/kernel_sizes.py build/kernels/libcedar_kernels.a
  python3 bench/cuda/kernel_sizes.py --match hc_mix_collapse --json build/kernels/libcedar_kernels.a
"""
import argparse
import json
import shutil
import struct
import subprocess
import sys


def elf_images(blob):
    """Offsets of the ELF64 little-endian images inside a byte string (the host object's own
    header at 0 included; the caller keeps those whose machine is CUDA)."""
    at = blob.find(b"\x7fELF")
    while at >= 0:
        if blob[at + 4] == 2 and blob[at + 5] == 1:  # ELFCLASS64, little-endian
            yield at
        at = blob.find(b"\x7fELF", at + 4)


def cuda_kernels(blob, at):
    """(kernel symbol, bytes of code) of the CUDA ELF image at `at`; [] for other machines or a
    truncated image."""
    try:
        (e_machine,) = struct.unpack_from("<H", blob, at + 18)
        if e_machine != 190:  # EM_CUDA
            return []
        e_shoff, = struct.unpack_from("<Q", blob, at + 40)
        e_shentsize, e_shnum, e_shstrndx = struct.unpack_from("<HHH", blob, at + 58)
        def section(i):
            o = at + e_shoff + i * e_shentsize
            name, _type, _flags, _addr, off, size = struct.unpack_from("<IIQQQQ", blob, o)
            return name, off, size
        _, str_off, str_size = section(e_shstrndx)
        names = blob[at + str_off: at + str_off + str_size]
        out = []
        for i in range(e_shnum):
            n, _, size = section(i)
            end = names.find(b"\0", n)
            name = names[n:end].decode("ascii", "replace")
            if name.startswith(".text."):
                out.append((name[6:], size))
        return out
    except (struct.error, IndexError):
        return []


def demangle(symbols):
    tool = shutil.which("c++filt")
    if not tool or not symbols:
        return list(symbols)
    res = subprocess.run([tool], input="\n".join(symbols), capture_output=True, text=True)
    lines = res.stdout.split("\n")
    return lines[: len(symbols)] if res.returncode == 0 and len(lines) >= len(symbols) else list(symbols)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help="object files, static archives or cubins")
    ap.add_argument("--match", default="", help="only kernels whose demangled name contains this")
    ap.add_argument("--json", action="store_true", help="one JSON array of {kernel, bytes, file}")
    a = ap.parse_args(argv)
    rows = {}
    for f in a.files:
        try:
            with open(f, "rb") as fh:
                blob = fh.read()
        except OSError as e:
            print("kernel_sizes: cannot read %s: %s" % (f, e.strerror), file=sys.stderr)
            return 2
        for at in elf_images(blob):
            for sym, size in cuda_kernels(blob, at):
                rows[sym] = (size, f)  # a kernel in several images (archive members): one row
    syms = sorted(rows, key=lambda s: -rows[s][0])
    names = demangle(syms)
    out = [{"kernel": n, "bytes": rows[s][0], "file": rows[s][1]} for s, n in zip(syms, names) if a.match in n]
    if a.json:
        json.dump(out, sys.stdout, indent=1)
        print()
    else:
        for r in out:
            print("%8d  %s" % (r["bytes"], r["kernel"]))
        print("%d kernels, %d bytes of code" % (len(out), sum(r["bytes"] for r in out)))
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
