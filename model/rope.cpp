// rope — see rope.hpp. The YaRN ramp follows the published recipe (DeepSeek-V3 REF and HF
// `_compute_yarn_parameters`): correction dims from β_fast/β_slow at the original length,
// floored/ceiled, clamped to [0, dim−1]; ramp over dim/2 pairs; inv = interp·(1−e) + extrap·e.
#include "model/rope.hpp"

#include <algorithm>
#include <cmath>

namespace cedar::model {
namespace {

std::vector<float> plain_inv_freq(double theta, int dim) {
  std::vector<float> f((size_t)dim / 2);
  for (int i = 0; i < dim / 2; ++i) {
    // torch: 1 / base ** (arange(0, dim, 2).float() / dim), in float32.
    const float e = (float)(2 * i) / (float)dim;
    f[(size_t)i] = 1.0f / std::pow((float)theta, e);
  }
  return f;
}

double correction_dim(double n_rot, int dim, double base, double max_pos) {
  return (dim * std::log(max_pos / (n_rot * 2.0 * M_PI))) / (2.0 * std::log(base));
}

}  // namespace

void rope_table::at(int64_t pos, float* cos, float* sin) const {
  const float p = (float)pos;
  for (int i = 0; i < n_pairs; ++i) {
    const float a = inv_freq[(size_t)i] * p;  // float32 product, as the port
    cos[i] = std::cos(a);
    sin[i] = std::sin(a);
  }
}

rope_table make_main_rope(const model_config& c) {
  rope_table t;
  t.inv_freq = plain_inv_freq(c.rope_theta, c.qk_rope_head_dim);
  t.n_pairs = c.qk_rope_head_dim / 2;
  return t;
}

rope_table make_compress_rope(const model_config& c) {
  const int dim = c.qk_rope_head_dim;
  rope_table t;
  t.n_pairs = dim / 2;
  if (!c.yarn.enabled || c.yarn.factor <= 1.0) {
    t.inv_freq = plain_inv_freq(c.compress_rope_theta, dim);
    return t;
  }
  const double base = c.compress_rope_theta;
  double low = std::floor(correction_dim(c.yarn.beta_fast, dim, base, (double)c.yarn.original_max_position));
  double high = std::ceil(correction_dim(c.yarn.beta_slow, dim, base, (double)c.yarn.original_max_position));
  low = std::max(low, 0.0);
  high = std::min(high, (double)(dim - 1));
  if (low == high) high += 0.001;
  t.inv_freq.resize((size_t)t.n_pairs);
  for (int i = 0; i < t.n_pairs; ++i) {
    const float pos_freq = std::pow((float)base, (float)(2 * i) / (float)dim);
    const float extrap = 1.0f / pos_freq;
    const float interp = 1.0f / ((float)c.yarn.factor * pos_freq);
    float ramp = (float)(((double)i - low) / (high - low));
    ramp = std::clamp(ramp, 0.0f, 1.0f);
    const float e = 1.0f - ramp;  // extrapolation weight
    t.inv_freq[(size_t)i] = interp * (1.0f - e) + extrap * e;
  }
  return t;
}

}  // namespace cedar::model
