// engine — the loaded model: config + weights + RoPE tables + Engram addressing.
//
// Owns: every backbone weight (layers.hpp structs), the embedding, final norm and LM head,
// the memory-mapped checkpoint the weight matrices point into (they stay in their stored
// dtype: F32, BF16, F8_E4M3 + UE8M0 32x32 block scales, packed FP4 + E8M0/32; the kernels
// dequantise per block on the fly; the embedding too, one gathered row per token), fp32
// copies of the small vectors, fp32 buffers for random engines and for dtypes the kernels do
// not take as stored (F16, misaligned data),
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
#include <memory>
#include <string>
#include <vector>

#include "kernels/base/result.hpp"
#include "model/config.hpp"
#include "model/layers.hpp"
#include "model/layers_engram.hpp"
#include "model/rope.hpp"

namespace cedar::model {

class checkpoint;

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

  // Move-only: the weight views point into the engine's own buffers and mapping.
  engine(engine&&) noexcept = default;
  engine& operator=(engine&&) noexcept = default;
  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;

  const model_config& config() const { return cfg_; }
  const block_weights& block(int l) const { return blocks_[(size_t)l]; }
  const qmat& embed() const { return embed_; }    // [vocab, d] stored dtype (kernels::dequant_rows)
  const fvec& norm() const { return norm_; }      // [d]
  const qmat& head() const { return head_; }      // [vocab, d]
  const rope_table& main_rope() const { return main_rope_; }
  const rope_table& compress_rope() const { return compress_rope_; }
  const engram_layout& engram() const { return engram_; }
  const std::vector<int64_t>& engram_token_map() const { return token_map_; }
  int64_t engram_pad_compressed() const { return pad_compressed_; }
  int64_t n_params() const;  // parameters (logical values) of the backbone, embedding and head
  // Memory: bytes of weights the engine holds in its own heap buffers (fp32 vectors, the
  // embedding, converted or random matrices, decoded scales), and bytes of weights and scales
  // it references in the memory-mapped checkpoint (file pages, shared and evictable).
  size_t owned_bytes() const;
  size_t mapped_bytes() const { return mapped_bytes_; }

 private:
  engine() = default;
  static status check_config(const model_config& c);
  status finish(engine_options& opts);

  model_config cfg_;
  std::shared_ptr<const checkpoint> ckpt_;  // the mapping the views point into (load only)
  std::vector<std::vector<float>> owned_;   // fp32 matrices/scales views point into
  size_t mapped_bytes_ = 0;
  std::vector<block_weights> blocks_;  // [num_hidden_layers]
  qmat embed_;
  fvec norm_;
  qmat head_;
  rope_table main_rope_, compress_rope_;
  engram_layout engram_;
  std::vector<int64_t> token_map_;
  int64_t pad_compressed_ = 0;
};

// Writes random weights for config `c` as one .safetensors file, with exactly the values of
// engine::random(c, seed) before encoding, in one of three storage layouts:
//   f32   every tensor F32;
//   bf16  matrices BF16, vectors F32 (like the shipped tiny models);
//   fp8   as the official checkpoint (MODEL_SPEC §5): attention projections, shared experts
//         and the Engram projection F8_E4M3 with UE8M0 32x32 block scales; routed experts
//         packed FP4 E2M1 (I8, two codes per byte) with E8M0 per 32 (F8 where a dimension
//         is not a multiple of 32); Engram tables F8 with 1x32 row scales; the indexer,
//         compressor, wo_a, gate, mHC, embedding and head BF16; vectors F32.
// For tests and benchmarks. Engram tables are sized by the prime layout (as random()).
enum class storage_layout { f32, bf16, fp8 };
status write_random_checkpoint(const model_config& c, uint64_t seed, storage_layout layout,
                               const std::string& path);

// Loads an int64 .npy token map (e.g. the fixture's engram/token_map.npy).
result<std::vector<int64_t>> load_token_map_npy(const std::string& path);

}  // namespace cedar::model
