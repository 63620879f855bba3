#!/usr/bin/env python3
"""bench/cuda/kernel_sizes.py on the build's own kernels library (argv[1]): it finds the CUDA
kernels nvcc embedded, and the forms compiled per launch case (kernels/cuda/generic_kernels.hpp)
are a fraction of their generic kernels' code — the property the decode step's instruction
fetch depends on, so a change that inflates them again fails here. Runs without a GPU."""
import io
import json
import os
import sys
import tempfile
import unittest
from contextlib import redirect_stderr, redirect_stdout

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "cuda"))
import kernel_sizes  # noqa: E402

LIB = None


def sizes(match):
    out = io.StringIO()
    with redirect_stdout(out):
        rc = kernel_sizes.main(["--json", "--match", match, LIB])
    assert rc == 0, "kernel_sizes found no kernels in " + LIB
    return {r["kernel"]: r["bytes"] for r in json.loads(out.getvalue())}


def one(table, fragment):
    hits = [b for k, b in table.items() if fragment in k]
    assert len(hits) == 1, "%d kernels match %r: %s" % (len(hits), fragment, sorted(table))
    return hits[0]


class KernelSizes(unittest.TestCase):
    def test_finds_the_kernels_with_positive_sizes(self):
        t = sizes("")
        self.assertGreater(len(t), 50)
        self.assertTrue(all(b > 0 for b in t.values()))
        self.assertTrue(any("qgemv_group_kernel" in k for k in t), "names are demangled")

    def test_mhc_site_forms_are_a_fraction_of_the_generic_kernel(self):
        t = sizes("hc_mix_collapse_kernel<4")
        generic = one(t, "hc_mix_collapse_kernel<4, 0, 3>")
        for fmt in (1, 2):  # bf16, f32 hc_fn, no tail: what the decode step launches
            self.assertLess(3 * one(t, "hc_mix_collapse_kernel<4, %d, 0>" % fmt), generic)

    def test_gather_forms_are_a_fraction_of_the_generic_kernel(self):
        for name in ("embed_rows_kernel", "table_rows_kernel"):
            t = sizes(name + "<")
            self.assertLess(1.5 * one(t, name + "<1>"), one(t, name + "<-1>"))  # bf16 table

    def test_bad_input_is_named_and_truncated_images_are_skipped(self):
        err = io.StringIO()
        with redirect_stderr(err), redirect_stdout(io.StringIO()):
            rc = kernel_sizes.main(["/nonexistent/lib.a"])
        self.assertEqual(rc, 2)
        self.assertIn("/nonexistent/lib.a", err.getvalue())
        with open(LIB, "rb") as fh:
            blob = fh.read()
        at = [a for a in kernel_sizes.elf_images(blob) if kernel_sizes.cuda_kernels(blob, a)][0]
        with tempfile.NamedTemporaryFile(suffix=".o") as f:  # a CUDA image cut after its header
            f.write(blob[at: at + 200])
            f.flush()
            with redirect_stdout(io.StringIO()):
                self.assertEqual(kernel_sizes.main([f.name]), 1)  # nothing found, no exception


if __name__ == "__main__":
    LIB = sys.argv.pop(1)
    unittest.main(verbosity=2)
