#!/usr/bin/python3
"""Evaluate a cedar model directory on the held-out agent split, the runtime's way.

For each held-out sample (generated with cedar_ref/data.py, or read from a gen_data.py JSONL
file): CED prefill of the prompt, greedy decode to end-of-sentence, parse the DSML, execute the
calls for real against the sample's virtual world, feed the results, continue (at most 4
assistant turns). Prints a JSON summary: success per family, valid tool-call rate, recall
accuracy by distance (tokens), and with --teacher-forced also the teacher-forced exact-match
rate. The C++ `cedar eval` must reproduce these numbers on the same samples.

  /usr/bin/python3 model/reference/eval_agent.py --model model/weights/cedar-agent-tiny --n 60
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from cedar_ref import bpe, data  # noqa: E402
from cedar_ref import train_eval as TE  # noqa: E402
from cedar_ref.model import QuantFlags, load_model  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="model directory (config.json, model.safetensors, "
                    "token_map.npy, tokenizer.json)")
    ap.add_argument("--tokenizer", help="tokenizer.json (default: MODEL/tokenizer.json)")
    ap.add_argument("--samples", help="JSONL from gen_data.py (default: generate held-out samples)")
    ap.add_argument("--n", type=int, default=60, help="samples to evaluate (default 60)")
    ap.add_argument("--seed", type=int, default=1001, help="held-out generator seed (default 1001)")
    ap.add_argument("--family", choices=data.FAMILIES, help="only this family")
    ap.add_argument("--recall-chars", type=int, nargs=2, default=[1500, 9000], metavar=("LO", "HI"))
    ap.add_argument("--teacher-forced", action="store_true", help="also report teacher-forced exact match")
    ap.add_argument("--kv", choices=["fp4", "bf16"], default="fp4",
                    help="fp4: FP4 global KV + FP8 SWA as the runtime stores them; bf16: no KV quantisation")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--time-limit", type=float, help="stop starting new samples after this many seconds")
    ap.add_argument("--details", action="store_true", help="include per-sample results")
    args = ap.parse_args(argv)

    if args.device == "cpu":
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    quant = QuantFlags() if args.kv == "fp4" else QuantFlags.off()
    try:
        m = load_model(args.model, quant).to(args.device)
        tok = bpe.Tokenizer.load(args.tokenizer or os.path.join(args.model, "tokenizer.json"))
    except (OSError, ValueError) as e:
        print(f"eval_agent: cannot load {args.model}: {e}", file=sys.stderr)
        return 2
    if args.samples:
        with open(args.samples, encoding="utf-8") as f:
            samples = [json.loads(line) for line in f if line.strip()]
        if args.family:
            samples = [s for s in samples if s["family"] == args.family]
        samples = samples[:args.n]
    else:
        samples = [data.make_sample(args.seed, i, "heldout", args.family, tuple(args.recall_chars))
                   for i in range(args.n)]
    t0 = time.time()
    res = {"model": os.path.basename(os.path.normpath(args.model)), "kv": args.kv,
           "generation": TE.gen_eval(m, tok, samples, args.device, args.time_limit,
                                     log=lambda s: print(f"eval_agent: {s}", file=sys.stderr))}
    if not args.details:
        res["generation"].pop("details")
    if args.teacher_forced:
        res["teacher_forced"] = TE.tf_eval(m, tok, samples, args.device,
                                           pad_id=tok.token_to_id(bpe.PAD))
    res["seconds"] = time.time() - t0
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
