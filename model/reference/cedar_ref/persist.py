"""Packed byte images of a SequenceState (batch row 0) and the inverse, for goldens and
for resuming from persisted global KV. Byte layouts: quant.py docstring.

pack_state(state) -> dict of numpy arrays:
  kv_L{s}        uint8 [E, D/2 + D/16]    FP4 main entries of KV source s
  index_k_L{s}   uint8 [E, Di/2 + Di/32]  FP4 index-key entries of KV source s
  pending_L{s}   float32 [2, p, D]        ratio-2 pending group: [0] kv rows, [1] gate rows
                                          (p = 0 or 1; ratio-1 sources: p = 0)
  swa            uint8 [L, r, D + D/32]   FP8 SWA window rows per layer (r = W-1 when full)
  swa_pos        int64 [L, r]             their absolute positions
  engram_tail    int64 [N-1]              compressed ids of the last N-1 positions (-1 unknown)
Packing is lossless only for fake-quantised values, i.e. states built with quant on.
"""

import numpy as np
import torch

from . import quant as Q
from .state import PersistedKV, SourceState


def pack_state(state):
    cfg = state.cfg
    D, Di = cfg.head_dim, cfg.index_head_dim
    out = {}
    for s, src in state.sources.items():
        out[f"kv_L{s}"] = Q.pack_fp4_kv(src.kv[0]).cpu().numpy()
        out[f"index_k_L{s}"] = Q.pack_fp4_index(src.index_k[0]).cpu().numpy()
        p = src.pending_kv.shape[1]
        pend = np.zeros((2, p, D), np.float32)
        if p:
            pend[0] = src.pending_kv[0].cpu().numpy()
            pend[1] = src.pending_gate[0].cpu().numpy()
        out[f"pending_L{s}"] = pend
    out["swa"] = np.stack([Q.pack_fp8_swa(state.swa_kv[l][0]).cpu().numpy()
                           for l in range(cfg.num_hidden_layers)])
    out["swa_pos"] = np.stack([state.swa_pos[l].cpu().numpy() for l in range(cfg.num_hidden_layers)])
    out["engram_tail"] = state.persist().engram_tail[0].cpu().numpy().astype(np.int64)
    return out


def persisted_from_packed(cfg, packed, n_past, device="cpu"):
    """Inverse of pack_state's global part -> PersistedKV (batch 1)."""
    D, Di = cfg.head_dim, cfg.index_head_dim
    sources = {}
    for s in cfg.kv_source_layer_ids:
        m = cfg.compress_ratios[s]
        kv = Q.unpack_fp4_kv(torch.from_numpy(packed[f"kv_L{s}"]), D)[None].to(device)
        ik = Q.unpack_fp4_index(torch.from_numpy(packed[f"index_k_L{s}"]), Di)[None].to(device)
        pend = torch.from_numpy(packed[f"pending_L{s}"]).to(device)
        sources[s] = SourceState(m, kv, ik, pend[0][None].clone(),
                                 pend[1][None].clone() if m > 1 else None)
        if kv.shape[1] != n_past // m or pend.shape[1] != (n_past % m if m > 1 else 0):
            raise ValueError(f"source {s}: {kv.shape[1]} entries / {pend.shape[1]} pending rows "
                             f"do not match {n_past} positions at ratio {m}")
    tail = torch.from_numpy(np.asarray(packed["engram_tail"], np.int64))[None].to(device)
    return PersistedKV(n_past, sources, tail)
