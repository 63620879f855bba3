"""Fixture parity on any torch device (e.g. a CUDA GPU with torch 2.x):

    python3 model/reference/check_device.py [cuda|cpu]

Prints prefill / decode rel errors and greedy ids for the quant and noquant runs of
tests/fixtures/deepseek-v41-tiny-A, and (torch >= 2.1) checks the E4M3 rounding of
cedar_ref.quant against torch.float8_e4m3fn. Exit status 1 if anything fails.
"""

import json
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from cedar_ref import quant as Q  # noqa: E402
from cedar_ref.model import QuantFlags, load_model  # noqa: E402

FIX = os.path.join(HERE, "..", "..", "tests", "fixtures", "deepseek-v41-tiny-A")


def main():
    dev = torch.device(sys.argv[1] if len(sys.argv) > 1 else ("cuda" if torch.cuda.is_available() else "cpu"))
    print(f"torch {torch.__version__} on {dev}")
    torch.set_grad_enabled(False)
    ok = True
    if hasattr(torch, "float8_e4m3fn"):
        x = (torch.randn(1 << 20, device=dev) * 40).clamp(-448, 448)
        same = torch.equal(Q.e4m3_round(x), x.to(torch.float8_e4m3fn).float())
        print(f"e4m3_round == torch.float8_e4m3fn cast on 2^20 values: {same}")
        ok &= same
    with open(os.path.join(FIX, "manifest.json")) as f:
        man = json.load(f)
    ids = torch.from_numpy(np.load(os.path.join(FIX, "input_ids.npy")))[None].to(dev)
    for run in ("quant", "noquant"):
        m = load_model(FIX, QuantFlags() if run == "quant" else QuantFlags.off()).to(dev)
        st = m.new_state()
        lg = m(ids, st)[0].cpu().numpy()
        ref = np.load(os.path.join(FIX, run, "prefill_logits.npy"))
        rel = np.abs(lg - ref).max() / np.abs(ref).max()
        dids = np.load(os.path.join(FIX, run, "decode_input_ids.npy"))
        dref = np.load(os.path.join(FIX, run, "decode_logits.npy"))
        rels, greedy = [], [int(lg[-1].argmax())]
        for i, t in enumerate(dids):
            o = m(torch.tensor([[int(t)]], device=dev), st)[0, 0].cpu().numpy()
            rels.append(float(np.abs(o - dref[i]).max() / np.abs(dref[i]).max()))
            greedy.append(int(o.argmax()))
        g_ok = greedy == man["runs"][run]["greedy_ids"]
        print(f"[{run}] prefill rel {rel:.3e}; decode rel max {max(rels):.3e}; greedy equal {g_ok}")
        ok &= rel <= 1e-3 and max(rels) <= 1e-3 and g_ok
    print("PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
