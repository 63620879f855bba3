#!/usr/bin/python3
"""Trainer step throughput: the model's sparse training path against the dense path it
replaces (same function; tests/reference/test_train.py checks equality), in the same run.

Batches mimic the training mix: rows of one length T per batch (the trainer groups by length),
B = max_tokens // T. Stage B and C steps (C adds FP4 STE, the candidate pool and one
bounded-replay tail). Prints one line per (stage, T, path) and the sparse/dense ratio; --json
writes the table; --profile prints the top GPU/CPU ops of one sparse stage-C step.
--sinkhorn adds a third path: the sparse step with mHC's Sinkhorn differentiated through the
eager loop (sinkhorn_eager, the trainer before its custom backward), and prints sparse/that.

  python3 bench/bench_train_step.py --lengths 1024 2048 3584 --max-tokens 98304 [--json F]
  python3 bench/bench_train_step.py --lengths 2048 --stages C --skip-dense-above 0 --sinkhorn
"""
import argparse
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "model", "reference"))

import torch  # noqa: E402

from cedar_ref import model as M  # noqa: E402
from cedar_ref import train_core as TC  # noqa: E402
from cedar_ref.config import ModelConfig  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    ap.add_argument("--config", default=os.path.join(root, "config", "cedar-agent-tiny.json"))
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 3584])
    ap.add_argument("--max-tokens", type=int, default=98304)
    ap.add_argument("--stages", nargs="+", default=["B", "C"])
    ap.add_argument("--steps", type=int, default=3, help="timed steps per point (after 1 warm-up)")
    ap.add_argument("--skip-dense-above", type=int, default=1 << 30,
                    help="no dense baseline for T above this (memory)")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--sinkhorn", action="store_true",
                    help="also time the sparse step with the eager Sinkhorn backward (baseline)")
    ap.add_argument("--json", help="write the table here")
    args = ap.parse_args()

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cfg = ModelConfig.from_json(args.config)
    m = TC.build_model(cfg, 0, dev)
    TC.init_model(m)
    if dev.type == "cuda":
        TC.use_dense_moe(m)
    base = {"index_topk": cfg.index_topk, "candidate_topk_blocks": cfg.candidate_topk_blocks}
    opt = torch.optim.AdamW(TC.param_groups(m, 1e-4), lr=1e-4)
    tracker = TC.MoETracker(m)
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if dev.type == "cuda" else None

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    custom_sinkhorn = M.sinkhorn
    rows = []
    for stage in args.stages:
        for T in args.lengths:
            B = max(1, args.max_tokens // T)
            g = torch.Generator().manual_seed(T)
            ids = torch.randint(20, cfg.vocab_size, (B, T), generator=g).to(dev)
            mask = (torch.rand(B, T, generator=g) < 0.27).to(torch.uint8).to(dev)
            lens = torch.full((B,), T, device=dev)
            starts = torch.full((B,), max(cfg.sliding_window, T - 160), device=dev)
            res = {}
            for path in ("dense", "sparse") + (("eager-sinkhorn",) if args.sinkhorn else ()):
                if path == "dense" and T > args.skip_dense_above:
                    continue
                TC.apply_stage(m, stage, base, sparse=(path != "dense"))
                M.sinkhorn = M.sinkhorn_eager if path == "eager-sinkhorn" else custom_sinkhorn
                rng = random.Random(0)
                step = lambda: TC.train_step(m, opt, tracker, (ids, mask, lens, starts), stage, 0.0,  # noqa: E731
                                             replay_rows=1 if stage == "C" else 0, autocast=autocast,
                                             rng=rng, update_bias=False)
                try:
                    if dev.type == "cuda":
                        torch.cuda.reset_peak_memory_stats()
                    step()
                    sync()
                    t0 = time.perf_counter()
                    for _ in range(args.steps):
                        step()
                    sync()
                    dt = (time.perf_counter() - t0) / args.steps
                except torch.OutOfMemoryError:
                    print(f"stage {stage} T={T} {path}: out of memory", flush=True)
                    torch.cuda.empty_cache()
                    continue
                peak = torch.cuda.max_memory_allocated() / 2**30 if dev.type == "cuda" else 0.0
                res[path] = B * T / dt
                rows.append({"stage": stage, "T": T, "B": B, "path": path, "s_per_step": dt,
                             "tok_per_s": B * T / dt, "peak_gib": peak})
                print(f"stage {stage} T={T:5d} B={B:3d} {path:14s}: {dt * 1000:8.1f} ms/step "
                      f"{B * T / dt:10.0f} tok/s  peak {peak:6.1f} GiB", flush=True)
            if "dense" in res and "sparse" in res:
                print(f"stage {stage} T={T:5d}: sparse/dense = {res['sparse'] / res['dense']:.2f}x", flush=True)
            if "eager-sinkhorn" in res and "sparse" in res:
                print(f"stage {stage} T={T:5d}: sparse/eager-sinkhorn = "
                      f"{res['sparse'] / res['eager-sinkhorn']:.2f}x", flush=True)
    M.sinkhorn = custom_sinkhorn
    if args.profile and dev.type == "cuda":
        from torch.profiler import ProfilerActivity, profile
        T = args.lengths[len(args.lengths) // 2]
        B = max(1, args.max_tokens // T)
        ids = torch.randint(20, cfg.vocab_size, (B, T), device=dev)
        mask = (torch.rand(B, T, device=dev) < 0.27).to(torch.uint8)
        batch = (ids, mask, torch.full((B,), T, device=dev), torch.full((B,), T - 160, device=dev))
        TC.apply_stage(m, "C", base, sparse=True)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
            TC.train_step(m, opt, tracker, batch, "C", 0.0, replay_rows=1, autocast=autocast,
                          rng=random.Random(0), update_bias=False)
            sync()
        print(p.key_averages().table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=60))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
