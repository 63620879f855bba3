// Shared by the bench programs: medians, one line of a shell command's output (the commit and
// machine columns of the CSV), and the ~100M-parameter random config of the V4.1 architecture
// (12 layers with every layer mode) that the CPU benchmarks use beside the default model.
#pragma once

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "model/config.hpp"
#include "model/layers_engram.hpp"

namespace cedar::bench {

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The first line a shell command prints ("" if it fails), without its newline.
inline std::string shell_line(const char* cmd) {
  std::string out;
  if (FILE* p = popen(cmd, "r")) {
    char buf[256];
    if (fgets(buf, sizeof buf, p)) out = buf;
    pclose(p);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

// ~124M parameters: hidden 512, 12 layers (SWA, encoder Full/Reuse at ratio 2, decoder
// Full/Reindex/Reuse at ratio 1 with a candidate pool), 8 experts top-2, Engram on layers 1, 4.
inline model::model_config random_100m_config() {
  model::model_config c;
  c.vocab_size = 16384;
  c.hidden_size = 512;
  c.num_hidden_layers = 12;
  c.num_attention_heads = 8;
  c.head_dim = 128;
  c.qk_rope_head_dim = 32;
  c.q_lora_rank = 256;
  c.o_groups = 4;
  c.o_lora_rank = 256;
  c.sliding_window = 128;
  c.compress_ratios = {0, 0, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1};
  c.kv_source_layer_ids = {2, 4, 6};
  c.index_source_layer_ids = {2, 4, 6, 8, 10};
  c.candidate_source_layer_id = 6;
  c.candidate_topk_blocks = 64;
  c.candidate_block_size = 8;
  c.index_n_heads = 8;
  c.index_head_dim = 64;
  c.index_topk = 128;
  c.moe_intermediate_size = 512;
  c.n_routed_experts = 8;
  c.num_experts_per_tok = 2;
  c.engram_layer_ids = {1, 4};
  c.engram_vocab_size = 4000;
  c.engram_n_heads = 2;
  c.engram_head_dim = 64;
  c.engram_compressed_vocab_size = 8192;
  c.num_nextn_predict_layers = 0;
  c.dspark_target_layer_ids.clear();
  auto layout = model::make_engram_layout(c);  // table sizes follow from the prime layout
  if (layout.ok()) c.engram_num_embeddings = layout->table_rows;
  return c;
}

}  // namespace cedar::bench
