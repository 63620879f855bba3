#!/usr/bin/python3
"""The indexer check of TRAINING_NOTES §1 on a trained model: at the rows that predict the
assistant's tokens, how much of the attention's mass over EVERY visible compressed entry (the
teacher of `train.py --kl-teacher-topk`) the indexer's top-k selection holds, per index layer.

For each generated sample (teacher-forced, the trainer's sparse path with stage-C settings: FP4
global KV and indexer query/keys, the candidate pool) and each index layer:

  captured   share of the teacher's compressed-entry mass that lies on the selected entries
  recall     share of the teacher's top --teacher-topk entries that the selection holds
  random     what k entries drawn at random would hold: mean of min(k, N) / N over the rows
  oracle     share the teacher's own top --teacher-topk entries hold: the most any selection of
             that many entries can capture (with the default, k, it bounds 'captured')
  pool       on a Reindex layer (restricted to the candidate pool of the pool's source layer):
             the share of its attention over EVERY visible entry, the restriction lifted, that
             lies in the pool. The teacher sees only the pool, so 'captured' cannot show a line
             the pool misses; a low 'pool' says the pool, not the layer's indexer, loses it
             (1 on layers without a pool)

A selection that finds what the attention wants has captured and recall near 1; a low figure on a
layer says its indexer misses entries its attention would weigh (on recall samples at ~8K tokens,
the far line). CPU, Debian torch; about 4 minutes per 10K-token sample on 2 cores:

    /usr/bin/python3 model/reference/indexer_check.py --model model/weights/cedar-agent-tiny \
        --n 3 --recall-chars 32000 38000
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


def _chars(text):
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number of characters")
    if v < 1:
        raise argparse.ArgumentTypeError(f"'{text}': at least 1 character")
    return v


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="model directory (config.json, model.safetensors, tokenizer.json)")
    ap.add_argument("--n", type=int, default=3, help="samples to check")
    ap.add_argument("--family", choices=sorted(data.FAMILY_WEIGHTS), default="recall")
    ap.add_argument("--split", choices=["train", "heldout"], default="heldout")
    ap.add_argument("--seed", type=int, default=3004, help="data seed (3004: tests/eval/recall8k.jsonl's)")
    ap.add_argument("--recall-chars", type=_chars, nargs=2, default=[32000, 38000], metavar=("LO", "HI"),
                    help="recall distance in characters (32000-38000: ~8K tokens)")
    ap.add_argument("--teacher-topk", type=int, default=0, metavar="K",
                    help="the teacher's top entries counted by 'recall' (default: the config's index_topk)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    a = ap.parse_args(argv)
    if a.n < 1:
        ap.error(f"--n {a.n}: at least one sample")
    if a.teacher_topk < 0:
        ap.error(f"--teacher-topk {a.teacher_topk}: a number of entries >= 0 (0: index_topk)")
    if a.recall_chars[0] > a.recall_chars[1]:
        ap.error(f"--recall-chars {a.recall_chars[0]} {a.recall_chars[1]}: expected LO <= HI")
    torch.set_num_threads(a.threads)
    try:
        cfg, tok, m = TC.load_trained(a.model)
    except (OSError, ValueError, KeyError) as e:
        print(f"indexer_check: {a.model}: {e}", file=sys.stderr)
        return 2
    base = {"index_topk": cfg.index_topk, "candidate_topk_blocks": cfg.candidate_topk_blocks}
    TC.apply_stage(m, "C", base)  # sparse path, FP4 KV + indexer, candidate pool: what serving runs
    m.kl_teacher_topk = a.teacher_topk or cfg.index_topk
    m.pool_check = True
    samples, totals = [], {}
    for i in range(a.n):
        t0 = time.time()
        s = data.make_sample(a.seed, i, a.split, a.family, tuple(a.recall_chars))
        ids, mask = data.tokenize_sample(tok, s["messages"])
        x = torch.tensor([ids])
        rows = torch.zeros(1, len(ids), dtype=torch.bool)
        rows[0, :-1] = torch.tensor(mask[1:], dtype=torch.bool)  # rows predicting assistant tokens
        trace = {"compressed_probs": {}}
        with torch.no_grad():
            TC.full_forward(m, x, trace)
        chk = TC.teacher_check(trace, rows, cfg.index_topk)
        samples.append({"index": i, "tokens": len(ids), "layers": {str(l): c for l, c in chk.items()}})
        for l, c in chk.items():
            t = totals.setdefault(l, {"captured": 0.0, "recall": 0.0, "random": 0.0, "oracle": 0.0, "pool": 0.0, "rows": 0})
            for key in ("captured", "recall", "random", "oracle", "pool"):
                t[key] += c[key] * c["rows"]
            t["rows"] += c["rows"]
        print(f"indexer_check: [{i + 1}/{a.n}] {a.family} sample {i}: {len(ids)} tokens, "
              + " ".join(f"L{l} {c['captured']:.2f}" for l, c in chk.items())
              + f" ({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
    layers = {}
    for l, t in sorted(totals.items()):
        n = max(t["rows"], 1)
        layers[str(l)] = {"mode": cfg.layer_mode(l), "captured": t["captured"] / n, "recall": t["recall"] / n,
                          "random": t["random"] / n, "oracle": t["oracle"] / n, "pool": t["pool"] / n,
                          "rows": t["rows"]}
    out = {"model": a.model, "family": a.family, "split": a.split, "seed": a.seed,
           "recall_chars": a.recall_chars, "index_topk": cfg.index_topk, "teacher_topk": m.kl_teacher_topk,
           "layers": layers, "samples": samples}
    if a.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"{a.n} {a.split} {a.family} samples, rows predicting assistant tokens; selection k = "
          f"{cfg.index_topk}, teacher top {m.kl_teacher_topk}")
    print(f"{'layer':>5} {'mode':>8} {'captured':>9} {'oracle':>7} {'recall':>7} {'random':>7} {'pool':>6} {'rows':>6}")
    for l, c in layers.items():
        print(f"{l:>5} {c['mode']:>8} {c['captured']:9.3f} {c['oracle']:7.3f} {c['recall']:7.3f} "
              f"{c['random']:7.3f} {c['pool']:6.3f} {c['rows']:6d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
