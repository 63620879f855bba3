// engine — the loaded model: config + fp32 weights + RoPE tables + Engram addressing.
//
// Owns: every backbone weight (layers.hpp structs), the embedding, final norm and LM head,
// the two RoPE tables, the Engram layout (primes/offsets/multipliers derived from the config)
// and the Engram token map (tokenizer-derived; supplied by the caller).
// Does not own: any per-sequence state (sequence.hpp), scratch memory (forward.hpp's runner),
// the tokenizer, DSpark draft blocks (their `mtp.*` tensors are ignored).
// Invariants: immutable after load and shared by every runner/sequence; every tensor was
// checked against the config at load (an error names the tensor, the expected and the actual
// shape); sizes the quant formats need (head_dim % 32, index_head_dim % 32) hold.
// Who calls it: the executor (runtime) loads one; tests and benchmarks also build random ones.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/base/result.hpp"
#include "model/config.hpp"
#include "model/layers.hpp"
#include "model/layers_engram.hpp"
#include "model/rope.hpp"

namespace cedar::model {

struct engine_options {
  // Token id -> compressed id ([vocab_size] values in [0, engram_compressed_vocab_size)).
  // Required when the config has Engram layers; derived from the tokenizer by its owner
  // (for the tiny fixture: engram/token_map.npy).
  std::vector<int64_t> engram_token_map;
};

class engine {
 public:
  // Loads `checkpoint_path` (a .safetensors file or a checkpoint directory) for config `c`.
  static result<engine> load(const model_config& c, const std::string& checkpoint_path,
                             engine_options opts = {});
  // Random weights (N(0, 0.02²) matrices, unit norms, zero biases), deterministic in `seed`;
  // for benchmarks and tests. With Engram layers and no token map, uses id % compressed_vocab.
  static result<engine> random(const model_config& c, uint64_t seed, engine_options opts = {});

  const model_config& config() const { return cfg_; }
  const block_weights& block(int l) const { return blocks_[(size_t)l]; }
  const fvec& embed() const { return embed_; }    // [vocab, d]
  const fvec& norm() const { return norm_; }      // [d]
  const fvec& head() const { return head_; }      // [vocab, d]
  const rope_table& main_rope() const { return main_rope_; }
  const rope_table& compress_rope() const { return compress_rope_; }
  const engram_layout& engram() const { return engram_; }
  const std::vector<int64_t>& engram_token_map() const { return token_map_; }
  int64_t engram_pad_compressed() const { return pad_compressed_; }
  int64_t n_params() const;  // fp32 values held

 private:
  static status check_config(const model_config& c);
  status finish(engine_options& opts);

  model_config cfg_;
  std::vector<block_weights> blocks_;  // [num_hidden_layers]
  fvec embed_, norm_, head_;
  rope_table main_rope_, compress_rope_;
  engram_layout engram_;
  std::vector<int64_t> token_map_;
  int64_t pad_compressed_ = 0;
};

// Loads an int64 .npy token map (e.g. the fixture's engram/token_map.npy).
result<std::vector<int64_t>> load_token_map_npy(const std::string& path);

}  // namespace cedar::model
