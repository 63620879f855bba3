#!/usr/bin/python3
"""Which part of serving mode costs a trained model its loss: the LM loss (assistant tokens) of
one model over the same generated samples under the trainer's stage settings, with one part of
stage C taken away at a time, and under several candidate-pool sizes.

Stage B is the sparse top-k path with FP8 SWA; stage C adds the FP4 global KV, the FP4 indexer
query/keys and the candidate pool (cedar_ref/train_core.apply_stage). The rows:

  B                     stage B
  C                     stage C (what serving runs)
  C without pool        stage C, candidate pool off (Reindex layers see every entry)
  C without FP4 KV      stage C, compressed KV unquantised
  C without FP4 index   stage C, indexer query/keys unquantised
  B with pool           stage B plus the candidate pool alone
  C, pool N blocks      stage C with candidate_topk_blocks = N (--pools)

This measurement found the pool of 8 x 16 entries to be the whole stage-C gap of runs 1-8
(model card, "Run 9"). CPU, Debian torch:

    /usr/bin/python3 model/reference/stage_ablation.py --model model/weights/cedar-agent-tiny \
        --n 24 --pools 8,32,128
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from cedar_ref import data  # noqa: E402
from cedar_ref import train_core as TC  # noqa: E402


def _pool_list(text):
    """--pools: comma-separated positive block counts."""
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a comma-separated list of block counts")
    if any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError(f"'{text}': block counts must be at least 1")
    return vals


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="model directory (config.json, model.safetensors, tokenizer.json)")
    ap.add_argument("--n", type=int, default=24, help="samples to generate (longer than --max-len are skipped)")
    ap.add_argument("--split", choices=["train", "heldout"], default="train")
    ap.add_argument("--seed", type=int, default=4242, help="data seed of the samples")
    ap.add_argument("--max-len", type=int, default=3072)
    ap.add_argument("--pools", type=_pool_list, default=[], help="comma-separated candidate_topk_blocks values to try in stage C")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    try:
        cfg, tok, m = TC.load_trained(a.model)
    except (OSError, ValueError, KeyError) as e:
        print(f"stage_ablation: {a.model}: {e}", file=sys.stderr)
        return 2
    base = {"index_topk": cfg.index_topk, "candidate_topk_blocks": cfg.candidate_topk_blocks}
    items = []
    for i in range(a.n):
        s = data.make_sample(a.seed, i, a.split, None, (1500, 9000))
        ids, mask = data.tokenize_sample(tok, s["messages"])
        if len(ids) <= a.max_len:
            items.append((ids, mask, s["family"]))
    print(f"stage_ablation: {len(items)} {a.split} samples (seed {a.seed}), model {a.model}", file=sys.stderr)

    def setting(stage, fp4_kv=None, fp4_index=None, pool=None, blocks=None):
        def apply():
            TC.apply_stage(m, stage, base)
            q = m.quant
            if fp4_kv is not None:
                q.fp4_kv = fp4_kv
            if fp4_index is not None:
                q.fp4_index_k = q.fp4_index_q = fp4_index
            if pool is not None:
                m.cfg.candidate_topk_blocks = base["candidate_topk_blocks"] if pool else TC.BIG
            if blocks is not None:
                m.cfg.candidate_topk_blocks = blocks
        return apply

    rows = [("B", setting("B")), ("C", setting("C")), ("C without pool", setting("C", pool=False)),
            ("C without FP4 KV", setting("C", fp4_kv=False)),
            ("C without FP4 index", setting("C", fp4_index=False)), ("B with pool", setting("B", pool=True))]
    rows += [(f"C, pool {nb} blocks", setting("C", blocks=nb)) for nb in a.pools]
    out = []
    for k, (name, apply) in enumerate(rows):
        apply()
        t0 = time.time()
        total, weight, fam = 0.0, 0.0, {}
        with torch.no_grad():
            for ids, mask, f in items:
                x = torch.tensor([ids])
                logits, *_ = TC.full_forward(m, x, {"compressed_probs": {}})
                loss, w = TC.lm_loss(logits, x, torch.tensor([mask], dtype=torch.uint8))
                total += float(loss) * float(w)
                weight += float(w)
                acc = fam.setdefault(f, [0.0, 0.0])
                acc[0] += float(loss) * float(w)
                acc[1] += float(w)
        row = {"setting": name, "loss": total / max(weight, 1.0),
               "families": {f: v[0] / max(v[1], 1.0) for f, v in sorted(fam.items())}}
        out.append(row)
        print(f"stage_ablation: [{k + 1}/{len(rows)}] {name}: {row['loss']:.4f} ({time.time() - t0:.0f} s)",
              file=sys.stderr, flush=True)
    if a.json:
        print(json.dumps({"model": a.model, "samples": len(items), "split": a.split, "rows": out}))
    else:
        fams = sorted({f for r in out for f in r["families"]})
        print("| setting | loss | " + " | ".join(fams) + " |")
        print("|---|---|" + "---|" * len(fams))
        for r in out:
            print(f"| {r['setting']} | {r['loss']:.3f} | " +
                  " | ".join(f"{r['families'].get(f, float('nan')):.3f}" for f in fams) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
