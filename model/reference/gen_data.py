#!/usr/bin/python3
"""Generate cedar's synthetic agent transcripts (cedar_ref/data.py) as JSONL or plain text.

Each JSONL line is one sample: id, family, split, tools, world (files / notes / now at the
graded turn), messages (OpenAI-style, the whole transcript), n_prompt (messages before the
graded assistant turn), expect (what its final answer must contain), and for recall samples
distance_chars. --format text writes the rendered V4.1 prompts instead (tokenizer corpus),
one document per sample separated by a blank line. Deterministic in (--seed, --split, index).

  /usr/bin/python3 model/reference/gen_data.py --seed 1 --n 2000 --split heldout --out heldout.jsonl
  /usr/bin/python3 model/reference/gen_data.py --seed 7 --n 1000 --real-names 0.3 --format text --out corpus.txt
"""

import argparse
import json
import os
import sys
import time
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cedar_ref import chat, data  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=1, help="generator seed (default 1)")
    ap.add_argument("--n", type=int, required=True, help="number of samples")
    ap.add_argument("--start", type=int, default=0, help="first sample index (default 0)")
    ap.add_argument("--split", choices=["train", "heldout"], default="train")
    ap.add_argument("--family", choices=data.FAMILIES, help="only this family (default: the mix)")
    ap.add_argument("--recall-chars", type=int, nargs=2, default=[1500, 9000], metavar=("LO", "HI"),
                    help="recall distance range in characters (default 1500 9000)")
    ap.add_argument("--real-names", type=float, default=0.0, metavar="P",
                    help="train split: share (0..1) of drawn words that are real file, folder and note "
                         "names, as train.py --real-names (default 0)")
    ap.add_argument("--format", choices=["jsonl", "text"], default="jsonl")
    ap.add_argument("--out", required=True, help="output file ('-' for stdout)")
    args = ap.parse_args(argv)
    if args.n < 0 or args.start < 0:
        ap.error("--n and --start must be >= 0")
    if not 0.0 <= args.real_names <= 1.0:
        ap.error(f"--real-names {args.real_names}: a share from 0 to 1")

    out = sys.stdout if args.out == "-" else open(args.out, "w", encoding="utf-8")
    fam, chars, t0 = Counter(), 0, time.time()
    for k in range(args.n):
        i = args.start + k
        s = data.make_sample(args.seed, i, args.split, args.family, tuple(args.recall_chars), args.real_names)
        fam[s["family"]] += 1
        if args.format == "jsonl":
            out.write(json.dumps(s, ensure_ascii=False) + "\n")
        else:
            text = chat.encode_messages(s["messages"])
            chars += len(text)
            out.write(text + "\n\n")
        if (k + 1) % 200 == 0 or k + 1 == args.n:
            print(f"gen_data: {k + 1}/{args.n} samples, {time.time() - t0:.1f}s", file=sys.stderr)
    if out is not sys.stdout:
        out.close()
    print("gen_data: families " + ", ".join(f"{f} {c}" for f, c in sorted(fam.items())), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
