"""Model config of the DeepSeek-V4.1 reference, read from an HF-style config.json.

Accepts the released layout (nested `text_config`, flat `rope_scaling`) and the HF port's flat
layout (`rope_parameters` with `main` / `compress`), `engram_pad_token_id` or `engram_pad_id`.
`compress_ratios` may carry extra trailing entries (DSpark layers); only the first
`num_hidden_layers` are used. Derived tables (layer modes, source lookups) live here.
"""

import json
from dataclasses import dataclass, field
from typing import List


@dataclass
class ModelConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    head_dim: int
    qk_rope_head_dim: int
    q_lora_rank: int
    o_lora_rank: int
    o_groups: int
    moe_intermediate_size: int
    n_routed_experts: int
    num_experts_per_tok: int
    sliding_window: int
    compress_ratios: List[int]
    kv_source_layer_ids: List[int]
    index_source_layer_ids: List[int]
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    candidate_source_layer_id: int = -1
    candidate_topk_blocks: int = 2048
    candidate_block_size: int = 8
    n_shared_experts: int = 1
    routed_scaling_factor: float = 1.5
    norm_topk_prob: bool = True
    gate_temp: float = 1.0
    swiglu_limit: float = 10.0
    rms_norm_eps: float = 1e-20
    rope_theta: float = 10000.0
    compress_rope_theta: float = 160000.0
    yarn_factor: float = 16.0
    yarn_original_max_position: int = 65536
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    engram_layer_ids: List[int] = field(default_factory=list)
    engram_num_embeddings: List[int] = field(default_factory=list)
    engram_max_ngram_size: int = 4
    engram_vocab_size: int = 0
    engram_n_heads: int = 0
    engram_head_dim: int = 0
    engram_compressed_vocab_size: int = 0
    engram_pad_id: int = 2

    # ---- derived ------------------------------------------------------------------------
    def __post_init__(self):
        L = self.num_hidden_layers
        self.compress_ratios = list(self.compress_ratios)[:L]
        if len(self.compress_ratios) != L:
            raise ValueError(f"compress_ratios has {len(self.compress_ratios)} entries, need {L}")
        for l in self.kv_source_layer_ids:
            if self.compress_ratios[l] == 0:
                raise ValueError(f"kv source layer {l} has compress ratio 0")
            if l not in self.index_source_layer_ids:
                raise ValueError(f"kv source layer {l} is not an index source")
        for l in self.index_source_layer_ids:
            if self.compress_ratios[l] == 0:
                raise ValueError(f"index source layer {l} has compress ratio 0")
        for l in range(L):
            if self.compress_ratios[l] and self.kv_source_of(l) is None:
                raise ValueError(f"layer {l} has a compressed branch but no kv source at or before it")
        if self.head_dim * self.num_attention_heads % self.o_groups:
            raise ValueError("num_attention_heads * head_dim must divide by o_groups")

    def kv_source_of(self, layer):
        srcs = [s for s in self.kv_source_layer_ids if s <= layer]
        return max(srcs) if srcs else None

    def layer_mode(self, layer):
        if self.compress_ratios[layer] == 0:
            return "swa"
        if layer in self.kv_source_layer_ids:
            return "full"
        if layer in self.index_source_layer_ids:
            return "reindex"
        return "reuse"

    @property
    def first_decoder_layer(self):
        """The CED boundary: the decoder KV source (the last kv source)."""
        return max(self.kv_source_layer_ids)

    @property
    def rope_dim(self):
        return self.qk_rope_head_dim

    # ---- loading ------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, d):
        d = dict(d.get("text_config", d))
        kw = {}
        names = set(cls.__dataclass_fields__)
        for k, v in d.items():
            if k in names:
                kw[k] = v
        if "engram_pad_token_id" in d:
            kw["engram_pad_id"] = d["engram_pad_token_id"]
        rs = d.get("rope_scaling")
        rp = d.get("rope_parameters")
        if isinstance(rp, dict) and isinstance(rp.get("compress"), dict):
            c = rp["compress"]
            kw["compress_rope_theta"] = c.get("rope_theta", kw.get("compress_rope_theta", 160000.0))
            if isinstance(rp.get("main"), dict):
                kw["rope_theta"] = rp["main"].get("rope_theta", kw.get("rope_theta", 10000.0))
            if c.get("rope_type") == "yarn":
                rs = c
        if isinstance(rs, dict) and rs.get("rope_type", rs.get("type")) == "yarn":
            kw["yarn_factor"] = float(rs["factor"])
            kw["yarn_original_max_position"] = int(rs["original_max_position_embeddings"])
            kw["yarn_beta_fast"] = float(rs.get("beta_fast", 32))
            kw["yarn_beta_slow"] = float(rs.get("beta_slow", 1))
        elif rs is None:
            kw.setdefault("yarn_factor", 1.0)
        try:
            return cls(**kw)
        except TypeError as e:
            raise ValueError(f"config.json: {e}") from e

    @classmethod
    def from_json(cls, path):
        with open(path) as f:
            return cls.from_dict(json.load(f))
