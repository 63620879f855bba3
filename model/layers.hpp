// layers — the weight structs of one DeepSeek-V4.1 backbone block, one struct per
// architecture part (HOUSE_STYLE 4), named after the official checkpoint tensors.
//
// Owns: nothing. Matrices are qmat views (kernels/cpu/qmatmul.hpp) in the checkpoint's stored
// format — F32, BF16, F8_E4M3 with UE8M0 32x32 block scales, packed FP4 E2M1 with E8M0 per
// 32 — pointing into the engine's memory-mapped checkpoint (or, for random engines and dtypes
// used only after conversion, into fp32 buffers the engine owns). W [out, in] row-major as in
// the checkpoint, applied as y = x · Wᵀ by kernels::qgemm_nt, which dequantises per block on
// the fly. Small vectors (norms, biases, mHC bases/scales, sinks) are fp32 copies (fvec).
// Each expert's gate/up projections stay two views (w1, w3): the forward pass writes them into
// the two halves of one [n, 2F] buffer. Engram tables are row-gathered with dequant_rows.
// Filled by engine.cpp; immutable afterwards; the forward pass (forward.cpp) reads them and
// keeps its state in model::sequence. Lifetime: views are valid while their engine lives.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/qmatmul.hpp"

namespace cedar::model {

using fvec = std::vector<float>;
using qmat = kernels::qmatrix;

// layers.{i}.attn.compressor.* — KV-source layers only.
struct compressor_weights {
  qmat wkv;    // [head_dim, d]         compressor.wkv.weight
  qmat wgate;  // [head_dim, d]         compressor.wgate.weight (ratio > 1 only, else empty)
  fvec norm;   // [head_dim]            compressor.norm.weight
};

// layers.{i}.attn.indexer.* — index-source layers; wk/k_norm on KV sources only.
struct indexer_weights {
  qmat wq_b;          // [Hi·Di, q_lora]  indexer.wq_b.weight
  qmat weights_proj;  // [Hi, d]          indexer.weights_proj.weight
  qmat wk;            // [Di, head_dim]   indexer.wk.weight     (KV sources)
  fvec k_norm;        // [Di]             indexer.k_norm.weight (KV sources)
};

// layers.{i}.attn.*
struct attention_weights {
  qmat wq_a;       // [q_lora, d]
  fvec q_norm;     // [q_lora]
  qmat wq_b;       // [H·head_dim, q_lora]
  qmat wkv;        // [head_dim, d]
  fvec kv_norm;    // [head_dim]
  qmat wo_a;       // [G·o_rank, H·head_dim/G]  block-diagonal: group g uses rows g·o_rank..
  qmat wo_b;       // [d, G·o_rank]
  fvec attn_sink;  // [H]
  bool has_compressor = false;
  bool has_indexer = false;
  compressor_weights compressor;
  indexer_weights indexer;
};

// One SwiGLU expert: gate w1 [F, d], up w3 [F, d], down w2 [d, F].
struct expert_weights {
  qmat w1;
  qmat w3;
  qmat w2;
};

// layers.{i}.ffn.*
struct moe_weights {
  qmat gate;      // [E, d]  ffn.gate.weight
  fvec bias;      // [E]     ffn.gate.bias (selection only)
  fvec bias_vl;   // [E]     ffn.gate.bias_vl (image tokens; loaded, unused by the text path)
  std::vector<expert_weights> experts;  // [E]
  expert_weights shared;                // ffn.shared_experts
};

// layers.{i}.engram.* — Engram layers only.
struct engram_weights {
  qmat table;     // [rows, engram_head_dim] embed.weight (FP8 rows: embed.scale, 1x32)
  qmat wkv;       // [d·(hc+1), n_cols·engram_head_dim]
  fvec q_weight;  // [hc, d]
  fvec k_weight;  // [hc, d]
  fvec qk;        // [hc, d]  q_weight · k_weight (the port only ever uses the product)
};

// layers.{i}.* — one backbone block.
struct block_weights {
  fvec attn_norm;    // [d]
  fvec ffn_norm;     // [d]
  qmat hc_attn_fn;   // [(2+hc)·hc, hc·d]
  fvec hc_attn_base; // [(2+hc)·hc]
  fvec hc_attn_scale;// [3]
  qmat hc_ffn_fn;    // [(2+hc)·hc, hc·d]
  fvec hc_ffn_base;
  fvec hc_ffn_scale;
  attention_weights attn;
  moe_weights ffn;
  bool has_engram = false;
  engram_weights engram;
};

}  // namespace cedar::model
