"""Shared test helpers: repository paths (CEDAR_SOURCE_DIR or this file's location)."""

import os
import sys

ROOT = os.environ.get("CEDAR_SOURCE_DIR") or os.path.abspath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
REF_DIR = os.path.join(ROOT, "model", "reference")
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "deepseek-v41-tiny-A")
GOLDEN = os.path.join(ROOT, "tests", "golden", "tiny-B")

if REF_DIR not in sys.path:
    sys.path.insert(0, REF_DIR)

# One intra-op thread: the 2-core CI machine is shared, and OpenMP spin-waiting under load makes
# these tiny matmuls ~3x slower with 2 threads. Results are deterministic per thread count.
import torch  # noqa: E402

torch.set_num_threads(1)


def rel_err(a, ref):
    import numpy as np
    a, ref = np.asarray(a, np.float64), np.asarray(ref, np.float64)
    return float(np.abs(a - ref).max() / np.abs(ref).max())
