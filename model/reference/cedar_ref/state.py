"""Per-sequence runtime state of the reference (the "KV cache"), and its persisted form.

SequenceState (one timeline, batch B sharing positions):
  n_past             positions consumed so far (the next row's absolute position)
  swa_kv[l]          [B, r, D] fp32, r <= W-1: layer l's last window rows (post-RoPE, FP8
                     fake-quantised when quant is on); swa_pos[l] [r] their positions.
                     A forward sees these plus its own rows; afterwards the last W-1 are kept.
  sources[s]         one SourceState per KV source layer s (global KV, persisted):
                       kv       [B, E, D]  compressed entries, RoPE'd at j*m, FP4-quantised
                       index_k  [B, E, Di] indexer keys, RoPE'd at j*m, FP4-quantised
                       pending_kv / pending_gate [B, p, D] fp32, p < m: the ratio-2 group
                                still filling (kv and gate projections of its tokens)
  engram_hist        [B, cap] compressed token ids by absolute position (DEAD = unknown)

Invariants: E == n_past // m for a source that saw every row (write_global forwards);
p == n_past % m; replayed rows (write_global=False) never change `sources`.

PersistedKV is what survives a cache eviction of SWA (MODEL_SPEC §3 "persistent cache"):
n_past, every SourceState, and the last N-1 compressed Engram tokens.
"""

from dataclasses import dataclass, field
from typing import Dict, Optional

import torch

from .engram import DEAD


@dataclass
class SourceState:
    ratio: int
    kv: torch.Tensor
    index_k: torch.Tensor
    pending_kv: torch.Tensor
    pending_gate: Optional[torch.Tensor]

    @property
    def n_entries(self):
        return self.kv.shape[1]

    def clone(self):
        return SourceState(self.ratio, self.kv.clone(), self.index_k.clone(),
                           self.pending_kv.clone(),
                           None if self.pending_gate is None else self.pending_gate.clone())


@dataclass
class PersistedKV:
    n_past: int
    sources: Dict[int, SourceState]
    engram_tail: torch.Tensor  # [B, N-1] compressed ids of positions n_past-N+1 .. n_past-1


class SequenceState:
    def __init__(self, cfg, batch=1, device="cpu"):
        self.cfg = cfg
        self.batch = batch
        self.device = torch.device(device)
        D, Di = cfg.head_dim, cfg.index_head_dim
        z = lambda n: torch.zeros(batch, 0, n, device=self.device)
        self.n_past = 0
        self.swa_kv = [z(D) for _ in range(cfg.num_hidden_layers)]
        self.swa_pos = [torch.zeros(0, dtype=torch.long, device=self.device)
                        for _ in range(cfg.num_hidden_layers)]
        self.sources = {}
        for s in cfg.kv_source_layer_ids:
            m = cfg.compress_ratios[s]
            self.sources[s] = SourceState(m, z(D), z(Di), z(D), z(D) if m > 1 else None)
        self.engram_hist = torch.full((batch, 0), DEAD, dtype=torch.long, device=self.device)

    # ---- engram history ---------------------------------------------------------------------
    def write_engram(self, positions, compressed_ids):
        """positions [T], compressed_ids [B, T]."""
        need = int(positions.max()) + 1
        if self.engram_hist.shape[1] < need:
            grown = torch.full((self.batch, need), DEAD, dtype=torch.long, device=self.device)
            grown[:, : self.engram_hist.shape[1]] = self.engram_hist
            self.engram_hist = grown
        self.engram_hist[:, positions] = compressed_ids

    # ---- persistence ------------------------------------------------------------------------
    def persist(self):
        n = self.cfg.engram_max_ngram_size - 1
        tail = torch.full((self.batch, n), DEAD, dtype=torch.long, device=self.device)
        for i in range(n):
            p = self.n_past - n + i
            if 0 <= p < self.engram_hist.shape[1]:
                tail[:, i] = self.engram_hist[:, p]
        return PersistedKV(self.n_past, {s: st.clone() for s, st in self.sources.items()}, tail)

    @classmethod
    def from_persisted(cls, cfg, p, device="cpu"):
        st = cls(cfg, p.engram_tail.shape[0], device)
        st.n_past = p.n_past
        st.sources = {s: v.clone() for s, v in p.sources.items()}
        n = p.engram_tail.shape[1]
        if p.n_past > 0 and n > 0:
            first = p.n_past - n
            pos = torch.arange(max(first, 0), p.n_past, device=st.device)
            st.write_engram(pos, p.engram_tail[:, n - pos.numel():])
        return st
