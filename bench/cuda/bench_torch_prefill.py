#!/usr/bin/python3
"""Prefill throughput of the PyTorch reference (model/reference/cedar_ref) on the same GPU, the
baseline beside `bench_cuda_decode --prefill`: one forward of an N-token prompt through the
reference model (the trainer's sparse path with the serving quantisation: FP8 window, FP4 KV,
index keys and queries; bf16 autocast; no_grad), every row through every layer and the head,
random weights. Models: `default` (config/cedar-agent-tiny.json, the shipped model's shape) and
`rand1b` (bench_cuda_decode's ~1.2 B config: same dimensions; the Engram tables keep the tiny
config's sizes and an identity token map, which the reference needs).

  /usr/bin/python3 bench/cuda/bench_torch_prefill.py --models default,rand1b --prompt 8192 [--csv F]
"""
import argparse
import contextlib
import csv
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "model", "reference"))

import torch  # noqa: E402

from cedar_ref import train_core as TC  # noqa: E402
from cedar_ref.config import ModelConfig  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def config_of(name):
    import json
    with open(os.path.join(ROOT, "config", "cedar-agent-tiny.json")) as f:
        d = json.load(f)
    d = dict(d.get("text_config", d))
    if name == "rand1b":  # bench_cuda_decode's rand1b_config (random_100m_config + overrides)
        d.update(vocab_size=32768, hidden_size=2048, num_hidden_layers=12, num_attention_heads=16, head_dim=256,
                 qk_rope_head_dim=64, q_lora_rank=512, o_groups=4, o_lora_rank=512, sliding_window=128,
                 compress_ratios=[0, 0, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1], kv_source_layer_ids=[2, 4, 6],
                 index_source_layer_ids=[2, 4, 6, 8, 10], candidate_source_layer_id=6, candidate_topk_blocks=64,
                 candidate_block_size=16, index_n_heads=8, index_head_dim=128, index_topk=512,
                 moe_intermediate_size=768, n_routed_experts=16, num_experts_per_tok=2, engram_layer_ids=[1, 4],
                 engram_n_heads=2, engram_head_dim=64, engram_compressed_vocab_size=32768)
    elif name != "default":
        raise SystemExit(f"bench_torch_prefill: unknown model {name!r} (default, rand1b)")
    return ModelConfig.from_dict(d)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="default,rand1b")
    ap.add_argument("--prompt", type=int, default=8192, help="prompt tokens")
    ap.add_argument("--repeats", type=int, default=3, help="timed forwards (after one warm-up)")
    ap.add_argument("--csv", help="write the rows here")
    ap.add_argument("--cpu", action="store_true", help="run on the CPU in fp32 (a smoke test, not a figure)")
    args = ap.parse_args()
    if args.prompt <= 0 or args.repeats <= 0:
        ap.error(f"--prompt and --repeats must be positive (got {args.prompt}, {args.repeats})")
    if not args.cpu and not torch.cuda.is_available():
        raise SystemExit("bench_torch_prefill: needs a CUDA GPU (or --cpu for a smoke test)")
    dev = torch.device("cpu" if args.cpu else "cuda")
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    rows = []
    for name in args.models.split(","):
        cfg = config_of(name)
        m = TC.build_model(cfg, 0, dev)
        m.eval()
        base = {"index_topk": cfg.index_topk, "candidate_topk_blocks": cfg.candidate_topk_blocks}
        TC.apply_stage(m, "C", base, sparse=True)
        TC.use_dense_moe(m)
        n_params = sum(p.numel() for p in m.parameters())
        ids = torch.randint(3, cfg.vocab_size, (1, args.prompt), generator=torch.Generator().manual_seed(5)).to(dev)
        print(f"model {name}: {n_params / 1e6:.1f} M parameters, prompt {args.prompt}", flush=True)
        amp = torch.autocast("cuda", dtype=torch.bfloat16) if dev.type == "cuda" else contextlib.nullcontext()
        with torch.no_grad(), amp:
            try:
                m(ids)
                sync()
                t0 = time.perf_counter()
                for _ in range(args.repeats):
                    m(ids)
                sync()
                dt = (time.perf_counter() - t0) / args.repeats
            except torch.OutOfMemoryError:
                print(f"  {name}: out of memory at {args.prompt} tokens", flush=True)
                continue
        tps = args.prompt / dt
        print(f"  {name:8s} torch reference prefill {args.prompt} tokens: {dt:8.3f} s {tps:10.1f} tok/s", flush=True)
        rows.append({"model": name, "params": n_params, "prompt": args.prompt,
                     "backend": "torch_ref" if dev.type == "cuda" else "torch_ref_cpu",
                     "seconds": round(dt, 4), "tok_per_s": round(tps, 2)})
        del m
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    if args.csv and rows:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
