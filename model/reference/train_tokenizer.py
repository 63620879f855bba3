#!/usr/bin/python3
"""Train a small byte-level BPE tokenizer and write it as an HF tokenizer.json.

Uses cedar_ref/bpe.py (stdlib only): the DeepSeek-V3 pre-tokenizer, the V4.1 special tokens
at fixed low ids 0..16, bytes at 17..272, merges after. Deterministic: the same corpus and
--merges give a byte-identical file. Progress goes to stderr.

  /usr/bin/python3 model/reference/train_tokenizer.py --corpus tests/tokenizer/corpus.txt
      --merges 2000 --out tests/tokenizer/tokenizer.json   (one command line)
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cedar_ref import bpe  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", nargs="+", required=True, metavar="FILE",
                    help="UTF-8 text files; each file is one document")
    ap.add_argument("--merges", type=int, default=2000, help="number of merges to learn (default 2000)")
    ap.add_argument("--min-frequency", type=int, default=2, help="stop when the best pair is rarer")
    ap.add_argument("--out", required=True, help="tokenizer.json to write")
    args = ap.parse_args(argv)
    if args.merges < 0:
        ap.error("--merges must be >= 0")

    texts = []
    for path in args.corpus:
        try:
            with open(path, encoding="utf-8") as f:
                texts.append(f.read())
        except (OSError, UnicodeDecodeError) as e:
            print(f"train_tokenizer: cannot read corpus file {path}: {e}", file=sys.stderr)
            return 2
    n_chars = sum(len(t) for t in texts)
    print(f"train_tokenizer: {len(texts)} files, {n_chars} chars", file=sys.stderr)
    t0 = time.time()
    tok = bpe.train(texts, args.merges, args.min_frequency,
                    progress=lambda m: print(f"train_tokenizer: {m}", file=sys.stderr))
    tok.save(args.out)
    n_ids = sum(len(tok.encode(t)) for t in texts)
    print(f"train_tokenizer: {len(tok.merges)} merges, vocab {tok.vocab_size}, "
          f"{n_chars / max(n_ids, 1):.2f} chars/token on the corpus, {time.time() - t0:.1f}s -> {args.out}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
