"""Generate the reference goldens in tests/golden/<name>/ (format: tests/golden/README.md).

    OMP_NUM_THREADS=2 /usr/bin/python3 model/reference/make_goldens.py [--out DIR]

One tiny random config that keeps every layer mode (SWA, SWA+Engram, Full m=2, Reuse,
Full m=2 + Engram, Full m=1 candidate source, Reindex), seeded weights, and for each of the
quant / noquant runs: full-stack prefill logits, CED prefill logits, greedy decode after
both, chunked prefill, and an encoder-bounded-replay resume; quant also dumps the packed KV
bytes. Deterministic: running it twice gives identical files (tests/reference checks it).
"""

import argparse
import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cedar_ref import quant as Q  # noqa: E402
from cedar_ref.config import ModelConfig  # noqa: E402
from cedar_ref.engram import engram_multipliers, engram_primes  # noqa: E402
from cedar_ref.model import DeepseekV41, QuantFlags  # noqa: E402
from cedar_ref.persist import pack_state, persisted_from_packed  # noqa: E402
from cedar_ref.safetensors_io import save_file  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

TINY_B = {
    "vocab_size": 128, "hidden_size": 32, "moe_intermediate_size": 16,
    "num_hidden_layers": 10, "num_attention_heads": 2, "num_key_value_heads": 1,
    "head_dim": 32, "qk_rope_head_dim": 16, "q_lora_rank": 32, "o_lora_rank": 16, "o_groups": 2,
    "hidden_act": "silu", "swiglu_limit": 10.0, "rms_norm_eps": 1e-20,
    "tie_word_embeddings": False, "max_position_embeddings": 1048576, "rope_theta": 10000,
    "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
    "scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc", "norm_topk_prob": True,
    "routed_scaling_factor": 1.5, "sliding_window": 8,
    "compress_ratios": [0, 0, 2, 2, 2, 2, 1, 1, 1, 1],
    "compress_rope_theta": 160000, "kv_source_layer_ids": [2, 4, 6],
    "index_source_layer_ids": [2, 4, 6, 8], "index_n_heads": 4, "index_head_dim": 32,
    "index_topk": 4, "candidate_source_layer_id": 6, "candidate_topk_blocks": 2,
    "candidate_block_size": 4, "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-06,
    "engram_layer_ids": [1, 4], "engram_max_ngram_size": 4, "engram_vocab_size": 53,
    "engram_n_heads": 2, "engram_head_dim": 32, "engram_compressed_vocab_size": 64,
    "engram_pad_token_id": 2, "num_nextn_predict_layers": 0,
    "rope_scaling": {"rope_type": "yarn", "factor": 16, "beta_fast": 32, "beta_slow": 1,
                     "original_max_position_embeddings": 65536},
}

SEED = 20261201
N_PROMPT = 45            # odd: the ratio-2 sources end the prefill with one pending token
N_DECODE = 4
CHUNKS = [0, 13, 14, 30, N_PROMPT]   # chunked prefill boundaries (a 1-row chunk included)
RESUME_AT = 32           # even boundary for the encoder-replay resume
RESUME_NEW = 6           # tokens prefilled after the resume


def make_config():
    text = dict(TINY_B)
    cfg0 = ModelConfig.from_dict(dict(text, engram_num_embeddings=[0, 0]))
    primes = engram_primes(cfg0)
    text["engram_num_embeddings"] = [sum(sum(p) for p in layer) for layer in primes]
    return {"architectures": ["DeepseekV41ForCausalLM"], "model_type": "deepseek_v41",
            "tie_word_embeddings": False, "torch_dtype": "float32",
            "text_config": dict(text, model_type="deepseek_v41_text")}


def token_map_for(cfg):
    # toy tokenizer: token i and i^1 normalise alike (compressed id i // 2)
    return np.arange(cfg.vocab_size, dtype=np.int64) // 2


def random_weights(model, seed):
    """Seeded weights with O(1) activations (1/sqrt(fan_in) linears, norms near 1)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, p in sorted(model.state_dict().items()):
        shape = tuple(p.shape)
        r = lambda: torch.randn(shape, generator=g)
        if name.endswith("norm.weight") or name.endswith(("q_weight", "k_weight")):
            t = 1.0 + 0.1 * r()
        elif name.endswith("attn_sink"):
            t = r()
        elif name.endswith(("gate.bias", "gate.bias_vl")):
            t = 0.1 * r()
        elif name.endswith(("hc_attn_fn", "hc_ffn_fn")):
            t = r() * (0.5 / math.sqrt(shape[1]))
        elif name.endswith(("hc_attn_base", "hc_ffn_base")):
            t = 0.5 * r()
        elif name.endswith(("hc_attn_scale", "hc_ffn_scale")):
            t = 0.5 + torch.rand(shape, generator=g)
        elif name.endswith("engram.embed.scale"):
            t = torch.ones(shape)
        elif name in ("embed.weight",) or name.endswith("engram.embed.weight"):
            t = r()
        elif len(shape) == 2:
            t = r() / math.sqrt(shape[1])
        else:
            t = r()
        out[name] = t.float().numpy()
    return out


def topk_table(sel, k):
    """bool [T, E] -> int32 [T, k] ascending selected indices, -1 padded."""
    out = np.full((sel.shape[0], k), -1, np.int32)
    for t in range(sel.shape[0]):
        ix = torch.nonzero(sel[t]).flatten().numpy()
        out[t, : len(ix)] = ix
    return out


def topk_boundary_diag(cfg, trace, cand):
    """Per index source: smallest gap between the k-th and (k+1)-th finite score of a row
    (how close a top-k pick is to flipping) and the number of exact ties there."""
    out = {}
    for L, score in sorted(trace["index_scores"].items()):
        s = score[0]
        if L > cfg.candidate_source_layer_id:
            s = s.masked_fill(~cand[0], float("-inf"))
        srt = torch.sort(s, -1, descending=True)[0]
        k = cfg.index_topk
        if srt.shape[-1] <= k:
            continue
        a, b = srt[:, k - 1], srt[:, k]
        ok = torch.isfinite(b)
        gap = (a - b)[ok]
        nz = gap[gap > 0]
        out[f"L{L}"] = {"rows_at_boundary": int(ok.sum()),
                        "min_nonzero_gap": float(nz.min()) if nz.numel() else None,
                        "ties": int((gap == 0).sum()),
                        "zero_score_ties": int(((gap == 0) & (a[ok] == 0)).sum())}
    return out


def pack_state_bytes(st, ledger):
    """pack_state with the global-KV entries packed from the raw rows (the HF scale rule on the
    quantiser's input, as the executor's sequence::append_entry packs them; cedar_ref/quant.py
    PACKING FROM A STATE), not re-packed from the state's fake-quantised rows. The SWA rows
    stay pack_state's: the FP8 encoding of the fake-quantised row, which is what the executor
    writes to its window ring (it fake-quantises the row for attention, then packs that)."""
    packed = pack_state(st)
    for s, src in st.sources.items():
        packed[f"kv_L{s}"] = ledger.pack("fp4_kv", src.kv[0]).numpy()
        packed[f"index_k_L{s}"] = ledger.pack("fp4_index", src.index_k[0]).numpy()
    return packed


def run_all(model, ids, quant_on):
    """run_all_ with a PackLedger open (only the quant run packs bytes)."""
    with Q.PackLedger() as ledger:
        return run_all_(model, ids, quant_on, ledger)


def run_all_(model, ids, quant_on, ledger):
    """Every golden quantity of one run -> dict relative path -> numpy array."""
    cfg = model.cfg
    f = {}
    ids_t = torch.from_numpy(ids)[None]
    # full-stack prefill + greedy decode
    st = model.new_state()
    trace = {"layer_out": {}}
    lg = model(ids_t, st, trace=trace)[0]
    f["prefill_logits.npy"] = lg.numpy()
    for L, sel in sorted(trace["topk"].items()):
        f[f"topk_prefill_L{L}.npy"] = topk_table(sel[0], cfg.index_topk)
    cand = trace["candidates"][cfg.candidate_source_layer_id]
    f[f"candidates_prefill_L{cfg.candidate_source_layer_id}.npy"] = cand[0].numpy().astype(np.uint8)
    f["_diag"] = topk_boundary_diag(cfg, trace, cand)
    if quant_on:
        for k, v in pack_state_bytes(st, ledger).items():
            f[f"kv_after_prefill/{k}" + (".bin" if v.dtype == np.uint8 else ".npy")] = v
    d_ids, d_lg = [], []
    nxt = int(lg[-1].argmax())
    for _ in range(N_DECODE):
        d_ids.append(nxt)
        o = model(torch.tensor([[nxt]]), st)[0, 0]
        d_lg.append(o.numpy())
        nxt = int(o.argmax())
    f["decode_input_ids.npy"] = np.array(d_ids, np.int64)
    f["decode_logits.npy"] = np.stack(d_lg)
    # CED prefill + greedy decode
    st = model.new_state()
    lc = model.prefill_ced(ids_t, st)[0]
    f["ced_logits.npy"] = lc.numpy()
    d_ids, d_lg = [], []
    nxt = int(lc[-1].argmax())
    for _ in range(N_DECODE):
        d_ids.append(nxt)
        o = model(torch.tensor([[nxt]]), st)[0, 0]
        d_lg.append(o.numpy())
        nxt = int(o.argmax())
    f["ced_decode_input_ids.npy"] = np.array(d_ids, np.int64)
    f["ced_decode_logits.npy"] = np.stack(d_lg)
    # chunked prefill
    st = model.new_state()
    parts = [model(ids_t[:, a:b], st)[0] for a, b in zip(CHUNKS[:-1], CHUNKS[1:])]
    f["chunked_logits.npy"] = torch.cat(parts).numpy()
    # encoder bounded replay: persist global KV after RESUME_AT tokens, resume, prefill more
    st = model.new_state()
    model(ids_t[:, :RESUME_AT], st)
    if quant_on:
        packed = pack_state_bytes(st, ledger)
        for k in packed:
            if k.startswith(("kv_L", "index_k_L", "pending_L", "engram_tail")):
                v = packed[k]
                f[f"resume/{k}" + (".bin" if v.dtype == np.uint8 else ".npy")] = v
        persisted = persisted_from_packed(cfg, packed, RESUME_AT)
    else:
        persisted = st.persist()
    rs = model.resume_encoder_replay(persisted, ids_t[:, :RESUME_AT])
    f["resume/resume_logits.npy"] = model(ids_t[:, RESUME_AT:RESUME_AT + RESUME_NEW], rs)[0].numpy()
    return f, lg


def build(out_dir):
    """Write the golden directory; returns the manifest dict. Runs single-threaded so the
    float results (and the quantised bytes derived from them) do not depend on the thread
    count of the caller."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _build(out_dir)
    finally:
        torch.set_num_threads(threads)


def _build(out_dir):
    conf = make_config()
    cfg = ModelConfig.from_dict(conf)
    tmap = token_map_for(cfg)
    model = DeepseekV41(cfg, QuantFlags(), tmap)
    weights = random_weights(model, SEED)
    model.load_official(weights)
    model.eval()
    g = torch.Generator().manual_seed(SEED + 1)
    ids = torch.randint(3, cfg.vocab_size, (N_PROMPT,), generator=g).numpy().astype(np.int64)

    files = {"input_ids.npy": ids, "engram/token_map.npy": tmap,
             "engram/primes.npy": np.array(engram_primes(cfg), np.int64),
             "engram/offsets.npy": model.hasher.offsets.numpy(),
             "engram/multipliers.npy": engram_multipliers(cfg)}
    with torch.no_grad():
        model.eval()
        pos = torch.arange(N_PROMPT)
        from cedar_ref.state import SequenceState
        st = SequenceState(cfg)
        st.write_engram(pos, model.hasher.compress(torch.from_numpy(ids)[None]))
        files["engram/hash_ids_prefill.npy"] = model.hasher.hash(st.engram_hist, pos)[0].numpy()
        summary = {}
        for run, flags in (("quant", QuantFlags()), ("noquant", QuantFlags.off())):
            model.quant = flags
            f, lg = run_all(model, ids, run == "quant")
            diag = f.pop("_diag")
            for k, v in f.items():
                files[f"{run}/{k}"] = v
            pl, cl = f["prefill_logits.npy"], f["ced_logits.npy"]
            tail = pl[-cl.shape[0]:]
            rl = f["resume/resume_logits.npy"]
            ref = pl[RESUME_AT:RESUME_AT + RESUME_NEW]
            summary[run] = {
                "greedy_after_prefill": [int(lg[-1].argmax())] + [int(x) for x in f["decode_logits.npy"].argmax(-1)],
                "ced_vs_full_tail_rel": float(np.abs(cl - tail).max() / np.abs(tail).max()),
                "ced_vs_full_tail_argmax_agree": float((cl.argmax(-1) == tail.argmax(-1)).mean()),
                "resume_vs_full_rel": float(np.abs(rl - ref).max() / np.abs(ref).max()),
                "chunked_vs_oneshot_rel": float(np.abs(f["chunked_logits.npy"] - pl).max() / np.abs(pl).max()),
                "indexer_topk_boundary_prefill": diag,
            }
        model.quant = QuantFlags()

    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as fh:
        json.dump(conf, fh, indent=2)
        fh.write("\n")
    save_file(weights, os.path.join(out_dir, "model.safetensors"))
    for rel, arr in sorted(files.items()):
        path = os.path.join(out_dir, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if rel.endswith(".bin"):
            with open(path, "wb") as fh:
                fh.write(np.ascontiguousarray(arr, np.uint8).tobytes())
        else:
            np.save(path, arr)
    manifest = {
        "name": "tiny-B",
        "generator": "model/reference/make_goldens.py (cedar_ref)",
        "weight_seed": SEED, "input_seed": SEED + 1, "seq_len": N_PROMPT, "n_decode": N_DECODE,
        "chunks": CHUNKS, "resume": {"prefix_len": RESUME_AT, "new_tokens": RESUME_NEW},
        "ced": {"first_decoder_layer": cfg.first_decoder_layer, "n_tail": cfg.sliding_window},
        "layer_modes": [cfg.layer_mode(l) + (" + engram" if l in cfg.engram_layer_ids else "")
                        for l in range(cfg.num_hidden_layers)],
        "shapes": {rel: list(np.asarray(a).shape) for rel, a in sorted(files.items())},
        "summary": summary,
    }
    with open(os.path.join(out_dir, "manifest.json"), "w") as fh:
        json.dump(manifest, fh, indent=1, sort_keys=True)
        fh.write("\n")
    return manifest


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "golden", "tiny-B"))
    args = ap.parse_args()
    m = build(args.out)
    print(json.dumps(m["summary"], indent=1))


if __name__ == "__main__":
    main()
