// rope — the two rotary embeddings of DeepSeek-V4.1 (MODEL_SPEC §1 "Layer map").
//
//   main      ratio-0 layers: θ = rope_theta, plain inverse frequencies.
//   compress  ratio > 0 layers (their SWA branch, indexer and compressed entries included):
//             θ = compress_rope_theta with YaRN (factor, original length, β_fast/β_slow) when
//             the config enables it; attention scaling 1 (no mscale).
// Both rotate the last qk_rope_head_dim channels as adjacent (even, odd) pairs.
// Owns: the inverse frequencies ([qk_rope_head_dim/2] fp32, computed the way the HF port's
// ROPE_INIT_FUNCTIONS do: float32 powers, YaRN linear ramp between the truncated correction
// dims) and cos/sin for one position. Angles are float32(inv_freq) · float32(pos), as the port.
#pragma once

#include <vector>

#include "model/config.hpp"

namespace cedar::model {

struct rope_table {
  std::vector<float> inv_freq;  // [n_pairs]
  int n_pairs = 0;
  // cos/sin of every pair at absolute position `pos` -> cos[n_pairs], sin[n_pairs].
  void at(int64_t pos, float* cos, float* sin) const;
};

rope_table make_main_rope(const model_config& c);
rope_table make_compress_rope(const model_config& c);

}  // namespace cedar::model
