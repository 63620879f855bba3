// sampler — see sampler.hpp.
#include "model/sampler.hpp"

#include <algorithm>
#include <cmath>

namespace cedar::model {

int greedy_token(const float* logits, int n) {
  int best = 0;
  for (int i = 1; i < n; ++i)
    if (logits[i] > logits[best]) best = i;
  return best;
}

sampler::sampler(sampler_params p) : p_(p), state_(p.seed ^ 0x9E3779B97F4A7C15ull) {}

double sampler::next_uniform() {
  // SplitMix64; the top 53 bits as a double in [0, 1).
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

int sampler::sample(const float* logits, int n) {
  if (n <= 0) return -1;
  if (p_.temperature <= 0.0f || p_.top_p <= 0.0f) return greedy_token(logits, n);
  prob_.resize((size_t)n);
  idx_.resize((size_t)n);
  const float inv_t = 1.0f / p_.temperature;
  float mx = logits[0] * inv_t;
  for (int i = 1; i < n; ++i) mx = std::max(mx, logits[i] * inv_t);
  double sum = 0;
  for (int i = 0; i < n; ++i) {
    prob_[(size_t)i] = std::exp(logits[i] * inv_t - mx);
    sum += prob_[(size_t)i];
  }
  for (int i = 0; i < n; ++i) prob_[(size_t)i] = (float)(prob_[(size_t)i] / sum);
  int m = 0;
  const float pmax = *std::max_element(prob_.begin(), prob_.end());
  for (int i = 0; i < n; ++i)
    if (prob_[(size_t)i] >= p_.min_p * pmax) idx_[(size_t)m++] = i;
  std::sort(idx_.begin(), idx_.begin() + m, [&](int a, int b) {
    return prob_[(size_t)a] > prob_[(size_t)b] || (prob_[(size_t)a] == prob_[(size_t)b] && a < b);
  });
  if (p_.top_p < 1.0f) {
    double acc = 0;
    int keep = 0;
    while (keep < m) {
      acc += prob_[(size_t)idx_[(size_t)keep]];
      ++keep;
      if (acc >= p_.top_p) break;
    }
    m = keep;
  }
  double total = 0;
  for (int j = 0; j < m; ++j) total += prob_[(size_t)idx_[(size_t)j]];
  const double u = next_uniform() * total;
  double acc = 0;
  for (int j = 0; j < m; ++j) {
    acc += prob_[(size_t)idx_[(size_t)j]];
    if (u < acc) return idx_[(size_t)j];
  }
  return idx_[(size_t)(m - 1)];
}

}  // namespace cedar::model
