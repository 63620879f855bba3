// layers — the weight structs of one DeepSeek-V4.1 backbone block, one struct per
// architecture part (HOUSE_STYLE 4), named after the official checkpoint tensors.
//
// Owns: nothing but fp32 weight storage, laid out for y = x · Wᵀ GEMMs (W [out, in] row-major,
// as in the checkpoint). Two layouts differ from the checkpoint on purpose:
//   * each expert's gate and up projections are stacked into one w13 [2F, d] (w1 rows then
//     w3 rows), so one GEMM produces both;
//   * Engram tables are dequantised to fp32 rows [rows, head_dim].
// Filled by engine.cpp (from a checkpoint or at random); immutable afterwards; the forward
// pass (forward.cpp) reads them and keeps its state in model::sequence.
#pragma once

#include <cstdint>
#include <vector>

namespace cedar::model {

using fvec = std::vector<float>;

// layers.{i}.attn.compressor.* — KV-source layers only.
struct compressor_weights {
  fvec wkv;    // [head_dim, d]         compressor.wkv.weight
  fvec wgate;  // [head_dim, d]         compressor.wgate.weight (ratio > 1 only, else empty)
  fvec norm;   // [head_dim]            compressor.norm.weight
};

// layers.{i}.attn.indexer.* — index-source layers; wk/k_norm on KV sources only.
struct indexer_weights {
  fvec wq_b;          // [Hi·Di, q_lora]  indexer.wq_b.weight
  fvec weights_proj;  // [Hi, d]          indexer.weights_proj.weight
  fvec wk;            // [Di, head_dim]   indexer.wk.weight     (KV sources)
  fvec k_norm;        // [Di]             indexer.k_norm.weight (KV sources)
};

// layers.{i}.attn.*
struct attention_weights {
  fvec wq_a;       // [q_lora, d]
  fvec q_norm;     // [q_lora]
  fvec wq_b;       // [H·head_dim, q_lora]
  fvec wkv;        // [head_dim, d]
  fvec kv_norm;    // [head_dim]
  fvec wo_a;       // [G·o_rank, H·head_dim/G]  block-diagonal: group g uses rows g·o_rank..
  fvec wo_b;       // [d, G·o_rank]
  fvec attn_sink;  // [H]
  bool has_compressor = false;
  bool has_indexer = false;
  compressor_weights compressor;
  indexer_weights indexer;
};

// One SwiGLU expert: w13 = [w1; w3] [2F, d], w2 [d, F].
struct expert_weights {
  fvec w13;
  fvec w2;
};

// layers.{i}.ffn.*
struct moe_weights {
  fvec gate;      // [E, d]  ffn.gate.weight
  fvec bias;      // [E]     ffn.gate.bias (selection only)
  fvec bias_vl;   // [E]     ffn.gate.bias_vl (image tokens; loaded, unused by the text path)
  std::vector<expert_weights> experts;  // [E]
  expert_weights shared;                // ffn.shared_experts
};

// layers.{i}.engram.* — Engram layers only.
struct engram_weights {
  fvec table;     // [rows, engram_head_dim] fp32 (embed.weight, dequantised with embed.scale)
  fvec wkv;       // [d·(hc+1), n_cols·engram_head_dim]
  fvec q_weight;  // [hc, d]
  fvec k_weight;  // [hc, d]
  fvec qk;        // [hc, d]  q_weight · k_weight (the port only ever uses the product)
};

// layers.{i}.* — one backbone block.
struct block_weights {
  fvec attn_norm;    // [d]
  fvec ffn_norm;     // [d]
  fvec hc_attn_fn;   // [(2+hc)·hc, hc·d]
  fvec hc_attn_base; // [(2+hc)·hc]
  fvec hc_attn_scale;// [3]
  fvec hc_ffn_fn;
  fvec hc_ffn_base;
  fvec hc_ffn_scale;
  attention_weights attn;
  moe_weights ffn;
  bool has_engram = false;
  engram_weights engram;
};

}  // namespace cedar::model
