// model_config — the DeepSeek-V4.1 family's hyper-parameters, parsed from an HF-style
// config.json and validated, plus everything derived from them (the layer map, parameter
// counts, cache bytes per token).
//
// Owns: parsing (nested `text_config` or flat), defaults (those of the released checkpoint,
// as HF's DeepseekV41TextConfig gives them), validation with errors that name the field and
// what was expected, and the derived layer map.
// Does not own: weights (weights.hpp), the tokenizer, or any runtime state.
// Invariants after a successful parse: every layer with ratio > 0 has a KV source at or
// before it; every index source has ratio > 0 and a KV source at or before it; Reuse layers
// read the KV and top-k of the nearest source at or before them; sizes are divisible where
// the architecture needs it (rope dims even, heads*head_dim by o_groups, quant blocks).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/base/result.hpp"

namespace cedar::model {

// What a layer's global (compressed) branch does. SWA-only layers have none.
enum class layer_mode {
  swa_only,  // ratio 0: sliding window only
  full,      // KV source and index source: compressor + indexer K/Q + top-k
  reindex,   // index source only: own indexer Q + weights, scores the shared keys
  reuse,     // neither: reuses main KV and the last published top-k
};
const char* layer_mode_name(layer_mode m);

struct layer_info {
  int ratio = 0;                        // compress ratio: 0 (SWA only), 1 (decoder), >1 (encoder)
  layer_mode mode = layer_mode::swa_only;
  int kv_source = -1;                   // layer whose compressed KV this layer reads
  int index_source = -1;                // layer whose top-k this layer uses (itself if full/reindex)
  bool engram = false;                  // Engram module before the attention
  bool decoder = false;                 // at or after the last KV source (CED decoder)
  bool candidate_source = false;        // builds the hierarchical candidate pool
  bool candidate_restricted = false;    // index source after the candidate source: top-k in the pool
  bool draft = false;                   // DSpark draft block (after the backbone)
};

struct rope_yarn {
  bool enabled = false;
  double factor = 1.0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  int64_t original_max_position = 65536;
};

struct model_config {
  // --- shape ---
  int64_t vocab_size = 129280;
  int64_t hidden_size = 5120;
  int num_hidden_layers = 40;
  int num_attention_heads = 64;
  int num_key_value_heads = 1;
  int head_dim = 512;
  int qk_rope_head_dim = 64;
  int q_lora_rank = 1280;
  int o_groups = 8;
  int o_lora_rank = 1024;
  int64_t max_position_embeddings = 1048576;
  bool tie_word_embeddings = false;
  double rms_norm_eps = 1e-20;
  int bos_token_id = 0;
  int eos_token_id = 1;
  int pad_token_id = 2;

  // --- RoPE ---
  double rope_theta = 10000.0;           // ratio-0 layers, no YaRN
  double compress_rope_theta = 160000.0; // ratio > 0 layers (their SWA branch included)
  rope_yarn yarn;                        // applies to the compress rope only

  // --- CSA2 ---
  int sliding_window = 128;
  std::vector<int> compress_ratios;      // num_hidden_layers + num_nextn_predict_layers entries
  std::vector<int> kv_source_layer_ids;
  std::vector<int> index_source_layer_ids;
  int candidate_source_layer_id = -1;    // < 0: no hierarchical pool
  int candidate_topk_blocks = 2048;
  int candidate_block_size = 8;
  int index_n_heads = 32;
  int index_head_dim = 128;
  int index_topk = 512;

  // --- MoE ---
  int moe_intermediate_size = 2304;
  int n_routed_experts = 384;
  int n_shared_experts = 1;
  int num_experts_per_tok = 6;
  std::string scoring_func = "sqrtsoftplus";
  std::string topk_method = "noaux_tc";
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.5;
  double swiglu_limit = 10.0;

  // --- mHC ---
  int hc_mult = 4;
  int hc_sinkhorn_iters = 20;
  double hc_eps = 1e-6;

  // --- Engram ---
  std::vector<int> engram_layer_ids;
  std::vector<int64_t> engram_num_embeddings;
  int engram_max_ngram_size = 4;
  int64_t engram_vocab_size = 16000000;
  int engram_n_heads = 8;
  int engram_head_dim = 256;
  int engram_pad_id = 2;
  int64_t engram_compressed_vocab_size = 99092;

  // --- DSpark ---
  int num_nextn_predict_layers = 3;
  int dspark_block_size = 5;
  int dspark_noise_token_id = 128799;
  std::vector<int> dspark_target_layer_ids;
  int dspark_markov_rank = 256;
  int dspark_n_routed_experts = 128;
  int dspark_num_experts_per_tok = 3;

  // --- derived (filled by finalize) ---
  std::vector<layer_info> layers;        // backbone then draft layers
  int first_decoder_layer = -1;          // = max(kv_source_layer_ids)

  int n_layers_total() const { return num_hidden_layers + num_nextn_predict_layers; }
  int nope_dim() const { return head_dim - qk_rope_head_dim; }
  bool is_kv_source(int l) const;
  bool is_index_source(int l) const;
};

// Parses config.json text (HF layout: nested "text_config" or flat). `origin` names the file
// in error messages. Unknown fields are ignored; wrong types and invalid values are errors
// naming the field: "config.json: field 'compress_ratios': expected 40..43 entries, got 12".
result<model_config> parse_model_config(std::string_view json, std::string_view origin);
result<model_config> load_model_config(const std::string& path);

// Validates the fields and fills the derived layer map. Called by the parsers; call it again
// after editing a config in code.
status finalize(model_config& c);

// --- derived figures (cedar model info) -------------------------------------------------
struct model_figures {
  // parameters (counted as in the checkpoint: every matrix, norm, bias, sink and table)
  int64_t params_total = 0;          // backbone + Engram + DSpark
  int64_t params_backbone = 0;       // everything except Engram tables and DSpark
  int64_t params_engram = 0;         // Engram tables + Engram projections
  int64_t params_dspark = 0;
  int64_t params_active_decode = 0;  // per generated token: all 40 layers, k routed + shared
  int64_t params_active_prefill = 0; // per non-tail prompt token under CED (encoder + L20 proj)
  // cache bytes
  int64_t fp4_main_entry_bytes = 0;  // head_dim/2 + head_dim/16      (288 at full size)
  int64_t fp4_index_key_bytes = 0;   // index_head_dim/2 + /32        (68)
  int64_t fp8_swa_entry_bytes = 0;   // head_dim + head_dim/32         (528)
  double persistent_bytes_per_token = 0;   // (main + index key) x entries per token
  int64_t swa_bytes_per_sequence = 0;      // every layer's FP8 ring (backbone + draft)
  int64_t bf16_equivalent_bytes_per_token = 0;  // each backbone layer's 512-d latent in bf16
  double compression_ratio = 0;            // bf16_equivalent / persistent
};
model_figures compute_figures(const model_config& c);

}  // namespace cedar::model
