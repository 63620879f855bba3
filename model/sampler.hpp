// sampler — turns one row of logits into a token id (greedy, temperature, top-p, min-p).
//
// Owns: the sampling rules and a deterministic per-sampler RNG (seeded; the same seed and
// logits give the same ids on every machine: a 64-bit SplitMix stream, no std::
// distributions whose output is implementation-defined).
// Does not own: logits (the runner's), stop conditions (the caller's).
// Rules, in order: temperature ≤ 0 or top_p ≤ 0 -> greedy (argmax, ties to the lowest id);
// else softmax(logits / temperature); min-p drops tokens with p < min_p · p_max; top-p keeps
// the smallest set, by descending p (ties: lower id first), whose mass reaches top_p; one draw
// from the renormalised rest.
#pragma once

#include <cstdint>
#include <vector>

namespace cedar::model {

struct sampler_params {
  float temperature = 0.0f;  // 0: greedy
  float top_p = 1.0f;        // (0, 1]
  float min_p = 0.0f;        // [0, 1)
  uint64_t seed = 0;
};

// argmax, ties -> lowest id.
int greedy_token(const float* logits, int n);

class sampler {
 public:
  explicit sampler(sampler_params p = {});
  int sample(const float* logits, int n);
  const sampler_params& params() const { return p_; }

 private:
  double next_uniform();  // [0, 1)
  sampler_params p_;
  uint64_t state_;
  std::vector<float> prob_;
  std::vector<int> idx_;
};

}  // namespace cedar::model
