#!/usr/bin/python3
"""Average the weights of several exported models of one config (a "model soup").

Fine-tunes of the same starting weights (e.g. two seeds of a continuation run, or a run's last
and EMA weights) lie in one basin; their element-wise mean usually generalises at least as well
as the better of them and removes part of the seed-to-seed spread (Wortsman et al., 2022, "Model
soups"). Every tensor is averaged in fp32, router biases included, and written as bf16 under the
same official names; config.json, tokenizer.json and token_map.npy come from the first model.

  /usr/bin/python3 model/reference/average_models.py DIR_A DIR_B [DIR_C ...] --out DIR
  /usr/bin/python3 model/reference/average_models.py DIR_A DIR_B --weights 0.7 0.3 --out DIR

The models must share config.json (byte for byte after JSON parsing) and every tensor name and
shape; anything else is an error that names the model and the tensor.
"""

import argparse
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

from cedar_ref.safetensors_io import load_file  # noqa: E402
from cedar_ref.train_core import save_bf16_safetensors  # noqa: E402


def average(dirs, weights=None):
    """-> (averaged tensors as fp32 numpy, config dict). Raises ValueError on a mismatch."""
    if len(dirs) < 2:
        raise ValueError("give at least two model directories")
    weights = weights or [1.0] * len(dirs)
    if len(weights) != len(dirs):
        raise ValueError(f"{len(weights)} weights for {len(dirs)} models")
    if any(w < 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(f"weights must be non-negative with a positive sum, got {weights}")
    total = float(sum(weights))
    config, acc = None, None
    for d, w in zip(dirs, weights):
        cpath, mpath = os.path.join(d, "config.json"), os.path.join(d, "model.safetensors")
        for p in (cpath, mpath):
            if not os.path.isfile(p):
                raise ValueError(f"{d}: no {os.path.basename(p)}")
        with open(cpath) as f:
            conf = json.load(f)
        if config is None:
            config = conf
        elif conf != config:
            raise ValueError(f"{cpath} differs from {dirs[0]}'s config.json")
        tensors = load_file(mpath)
        if acc is None:
            acc = {k: np.zeros(v.shape, np.float64) for k, v in tensors.items()}
        missing = sorted(set(acc) - set(tensors))
        extra = sorted(set(tensors) - set(acc))
        if missing or extra:
            raise ValueError(f"{mpath}: tensor names differ from {dirs[0]}'s "
                             f"(missing {missing[:4]}, unexpected {extra[:4]})")
        for k, v in tensors.items():
            if v.shape != acc[k].shape:
                raise ValueError(f"{mpath}: {k} has shape {tuple(v.shape)}, "
                                 f"{dirs[0]} has {tuple(acc[k].shape)}")
            if not np.all(np.isfinite(v)):
                raise ValueError(f"{mpath}: {k} holds non-finite values")
            acc[k] += (w / total) * v.astype(np.float64)
    return {k: v.astype(np.float32) for k, v in acc.items()}, config


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", metavar="DIR", help="exported model directories")
    ap.add_argument("--out", required=True, help="output model directory")
    ap.add_argument("--weights", type=float, nargs="+", help="one weight per model (default: equal)")
    args = ap.parse_args(argv)
    try:
        tensors, config = average(args.models, args.weights)
    except (ValueError, OSError) as e:
        print(f"average_models: {e}", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    meta = {"format": "pt", "averaged_from": ",".join(os.path.basename(os.path.normpath(d))
                                                      for d in args.models)}
    if args.weights:
        meta["averaged_weights"] = ",".join(str(w) for w in args.weights)
    save_bf16_safetensors(tensors, os.path.join(args.out, "model.safetensors"), meta)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    for name in ("tokenizer.json", "token_map.npy"):
        src = os.path.join(args.models[0], name)
        if os.path.isfile(src):
            shutil.copyfile(src, os.path.join(args.out, name))
    print(f"average_models: {len(tensors)} tensors from {len(args.models)} models -> {args.out}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
