#!/usr/bin/env python3
"""PyTorch baseline for bench_cuda (issue 9): the same decode projections through torch's own
bf16 path (F.linear -> cuBLAS) on the same GPU, in the same shapes: the qgemv sweep at m = 1, 8,
64 and the ~1.6B config's batch-1 projection stream captured in one CUDA graph. Weights rotate
over copies larger than the L2, as in bench_cuda. Prints the same table and writes CSV.

  python3 bench/cuda/bench_torch_linear.py [--csv FILE]
"""
import argparse
import random

import torch
import torch.nn.functional as F


def time_it(fn, reps):
    for _ in range(3):
        fn()
    ts = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e-3 / reps)
    return sorted(ts)[2]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--csv")
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    src = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    t = time_it(lambda: dst.copy_(src), 5)
    roof = 2 * src.numel() / t
    print(f"roofline: device copy {roof / 1e9:.0f} GB/s")
    rows = [("roofline", "d2d_copy", 0, t, 2 * src.numel())]
    del src, dst

    print(f"\n{'format':6s} {'shape':13s} {'m':>4s} {'us':>10s} {'GB/s':>10s} {'of roof':>8s}")
    for (n, k) in [(2048, 2048), (4096, 2048), (16384, 4096), (2048, 8192)]:
        per = n * k * 2
        copies = max(2, (256 << 20) // per + 1)
        ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        for m in (1, 8, 64):
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            it = [0]

            def step():
                F.linear(x, ws[it[0] % copies])
                it[0] += 1
            t = time_it(step, 50)
            byts = per + m * k * 2 + m * n * 2
            print(f"{'bf16':6s} {f'{n}x{k}':13s} {m:4d} {t * 1e6:10.2f} {byts / t / 1e9:10.0f} {100 * byts / t / roof:7.1f}%")
            rows.append(("torch_linear_bf16", f"{n}x{k}", m, t, byts))
        del ws

    # the ~1.6B config's batch-1 projection stream (bench_cuda.cpp section 3), bf16
    d = 2048
    layer = [(512, d, False), (16 * 256, 512, False), (256, d, False), (512, d, False), (8 * 128, 512, False),
             (128, d, False), (4 * 512, 1024, False), (d, 4 * 512, False), (2 * 768, d, False), (d, 768, False),
             (2 * 768, d, True), (d, 768, True)]
    rng = random.Random(9)
    mats, byts = [], 0
    for _ in range(16):
        for (n, k, expert) in layer:
            w = torch.randn(n * (16 if expert else 1), k, device=dev, dtype=torch.bfloat16) * 0.02
            for _ in range(2 if expert else 1):
                r0 = rng.randrange(16) * n if expert else 0
                mats.append(w[r0:r0 + n])
                byts += n * k * 2
    mats.append(torch.randn(32768, d, device=dev, dtype=torch.bfloat16) * 0.02)
    byts += 32768 * d * 2
    xs = {k: torch.randn(1, k, device=dev, dtype=torch.bfloat16) for k in {m.shape[1] for m in mats}}
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for m in mats:  # warm cuBLAS handles before capture
            F.linear(xs[m.shape[1]], m)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outs = [F.linear(xs[m.shape[1]], m) for m in mats]  # noqa: F841
    t = time_it(g.replay, 20)
    print(f"\ndecode projections, ~1.6B config (bf16, torch F.linear in one CUDA graph), batch 1: {len(mats)} GEMMs, "
          f"{byts / 1e6:.0f} MB per token,\n  {t * 1e6:.1f} us per token ({1 / t:.0f} tok/s) vs roofline "
          f"{byts / roof * 1e6:.1f} us: {100 * byts / roof / t:.1f}% of roofline")
    rows.append(("torch_decode_projections_1b_bf16", "batch1", 1, t, byts))
    if args.csv:
        with open(args.csv, "w") as f:
            f.write("kind,what,m,seconds,bytes,GBps,fraction_of_copy_bw\n")
            for (kind, what, m, t, b) in rows:
                f.write(f"{kind},{what},{m},{t:.9f},{b:.0f},{b / t / 1e9:.2f},{b / t / roof:.4f}\n")


if __name__ == "__main__":
    main()
