// Sampler: greedy ties to the lowest id, seeded determinism, top-p / min-p truncation, and
// temperature sampling frequencies close to the softmax.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "model/sampler.hpp"

namespace cm = cedar::model;

TEST(sampler, greedy_ties_go_to_lowest_id) {
  const std::vector<float> l = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f};
  EXPECT_EQ(cm::greedy_token(l.data(), 5), 1);
  cm::sampler s;  // temperature 0
  EXPECT_EQ(s.sample(l.data(), 5), 1);
}

TEST(sampler, same_seed_same_ids) {
  std::vector<float> l(50);
  for (int i = 0; i < 50; ++i) l[(size_t)i] = std::sin(0.7f * i);
  cm::sampler a({1.0f, 1.0f, 0.0f, 42}), b({1.0f, 1.0f, 0.0f, 42}), c({1.0f, 1.0f, 0.0f, 43});
  std::vector<int> ia, ib, ic;
  for (int k = 0; k < 64; ++k) {
    ia.push_back(a.sample(l.data(), 50));
    ib.push_back(b.sample(l.data(), 50));
    ic.push_back(c.sample(l.data(), 50));
  }
  EXPECT_EQ(ia, ib);
  EXPECT_NE(ia, ic);
}

TEST(sampler, top_p_and_min_p_truncate) {
  // probabilities ≈ {0.64, 0.24, 0.09, 0.03}
  const std::vector<float> l = {3.0f, 2.0f, 1.0f, 0.0f};
  cm::sampler tp({1.0f, 0.5f, 0.0f, 1});  // top-p 0.5: only the first token
  for (int k = 0; k < 100; ++k) EXPECT_EQ(tp.sample(l.data(), 4), 0);
  cm::sampler mp({1.0f, 1.0f, 0.3f, 2});  // min-p 0.3: tokens with p ≥ 0.19 -> {0, 1}
  int seen1 = 0;
  for (int k = 0; k < 400; ++k) {
    const int t = mp.sample(l.data(), 4);
    EXPECT_LE(t, 1);
    seen1 += t == 1;
  }
  EXPECT_GT(seen1, 50);
}

TEST(sampler, temperature_frequencies_follow_softmax) {
  const std::vector<float> l = {1.0f, 0.0f, -1.0f};
  cm::sampler s({1.0f, 1.0f, 0.0f, 9});
  std::vector<int> n(3, 0);
  const int N = 20000;
  for (int k = 0; k < N; ++k) ++n[(size_t)s.sample(l.data(), 3)];
  const double z = std::exp(1.0) + 1.0 + std::exp(-1.0);
  EXPECT_NEAR(n[0] / (double)N, std::exp(1.0) / z, 0.02);
  EXPECT_NEAR(n[2] / (double)N, std::exp(-1.0) / z, 0.02);
}
