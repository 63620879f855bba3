// Tests of kernels/cpu/fp4_dot: fp4_index_score_rows (the indexer's index scores of a block of
// token rows, each FP4 key tile decoded once for the whole block) against fp4_index_score_row
// (one row at a time: fp4_index_dot of the row's heads, then the head sum key by key), the
// computation the runner did per row before. Random packed keys (every byte value in the code
// bytes, UE8M0 scales spread over 2^±20), normal queries, head weights of both signs and some
// exact zeros; outputs are poisoned first.
//   * bit-exact equality, row by row, over shapes with odd row counts (1..130), key counts
//     (0..3000, across the 16-key tile edge), head counts (1..9, not only multiples of 4) and
//     channel counts (32..160);
//   * nothing written beyond n_keys in each output row, nor at all when there are no keys;
//   * n_heads == 0 scores every key 0;
//   * a spot check of the meaning: one score recomputed from fp4_index_unpack in double;
//   * the top-k scan helpers against their scalar loops: index_next_above (first s[i] > thr,
//     NaN never) and index_block_max (the chain m = max(m, s[i]) from −∞), over lengths 0..40
//     with ties at the threshold, NaN, ±∞ and ±0 in the data.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/fp4_dot.hpp"
#include "kernels/cpu/quant.hpp"

namespace ck = cedar::kernels;

namespace {

std::vector<uint8_t> random_keys(int n_keys, int n, std::mt19937& rng) {
  const size_t eb = ck::fp4_index_bytes(n);
  std::vector<uint8_t> k((size_t)n_keys * eb);
  std::uniform_int_distribution<int> byte(0, 255), sc(127 - 20, 127 + 20);
  for (int t = 0; t < n_keys; ++t) {
    uint8_t* e = k.data() + (size_t)t * eb;
    for (int j = 0; j < n / 2; ++j) e[j] = (uint8_t)byte(rng);
    for (int b = 0; b < n / 32; ++b) e[n / 2 + b] = (uint8_t)sc(rng);
  }
  return k;
}

struct shape {
  int rows, n_keys, n_heads, n;
};

// Compares the block scorer with the per-row one; returns the number of differing scores.
int mismatches(const shape& s, std::mt19937& rng, int* touched) {
  const std::vector<uint8_t> keys = random_keys(s.n_keys, s.n, rng);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> q((size_t)s.rows * s.n_heads * s.n), w((size_t)s.rows * s.n_heads);
  for (float& x : q) x = nd(rng);
  for (size_t i = 0; i < w.size(); ++i) w[i] = i % 7 == 3 ? 0.0f : nd(rng);  // both signs, some zeros
  const float sscale = 1.0f / std::sqrt((float)s.n);
  const int ldo = s.n_keys + 3;
  const float poison = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> got((size_t)s.rows * ldo, poison);
  ck::fp4_index_score_rows(q.data(), w.data(), s.rows, s.n_heads, keys.data(), s.n_keys, s.n, sscale,
                           got.data(), ldo);
  std::vector<float> scratch((size_t)std::max(1, s.n_heads * s.n_keys)), want((size_t)std::max(1, s.n_keys));
  int bad = 0;
  *touched = 0;
  for (int r = 0; r < s.rows; ++r) {
    ck::fp4_index_score_row(q.data() + (size_t)r * s.n_heads * s.n, w.data() + (size_t)r * s.n_heads,
                            s.n_heads, keys.data(), s.n_keys, s.n, sscale, scratch.data(), want.data());
    for (int t = 0; t < s.n_keys; ++t)
      bad += std::bit_cast<uint32_t>(got[(size_t)r * ldo + t]) != std::bit_cast<uint32_t>(want[(size_t)t]);
    for (int t = s.n_keys; t < ldo; ++t) *touched += !std::isnan(got[(size_t)r * ldo + t]);
  }
  return bad;
}

TEST(Fp4ScoreRows, EqualsPerRowScoringBitForBit) {
  std::mt19937 rng(20261130);
  const shape shapes[] = {
      {1, 1, 4, 32},     {1, 17, 4, 32},    {2, 16, 4, 32},    {3, 15, 1, 64},     {5, 33, 3, 32},
      {7, 100, 4, 32},   {13, 257, 5, 64},  {16, 1000, 4, 32}, {31, 31, 8, 96},    {64, 3000, 4, 32},
      {65, 511, 2, 128}, {96, 1777, 4, 32}, {127, 48, 9, 32},  {128, 2049, 4, 32}, {129, 3000, 4, 32},
      {130, 999, 7, 32}, {130, 1, 4, 160},  {1, 3000, 6, 64},  {4, 2999, 4, 32},   {33, 0, 4, 32},
  };
  for (const shape& s : shapes) {
    int touched = 0;
    EXPECT_EQ(mismatches(s, rng, &touched), 0)
        << "rows " << s.rows << " keys " << s.n_keys << " heads " << s.n_heads << " n " << s.n;
    EXPECT_EQ(touched, 0) << "wrote beyond n_keys: rows " << s.rows << " keys " << s.n_keys;
  }
}

TEST(Fp4ScoreRows, NoHeadsScoresZero) {
  std::mt19937 rng(7);
  const std::vector<uint8_t> keys = random_keys(40, 32, rng);
  std::vector<float> out((size_t)3 * 40, 1.5f);
  const float q = 0.0f, w = 0.0f;
  ck::fp4_index_score_rows(&q, &w, 3, 0, keys.data(), 40, 32, 0.25f, out.data(), 40);
  for (float x : out) EXPECT_EQ(std::bit_cast<uint32_t>(x), std::bit_cast<uint32_t>(0.0f));
}

TEST(Fp4ScoreRows, MatchesTheIndexScoreDefinition) {
  // out[r, t] ≈ Σ_h max(q[r, h]·k_t, 0) · sscale · w[r, h], k_t dequantised, summed in double.
  std::mt19937 rng(99);
  const int rows = 6, n_keys = 70, H = 4, n = 64;
  const std::vector<uint8_t> keys = random_keys(n_keys, n, rng);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> q((size_t)rows * H * n), w((size_t)rows * H);
  for (float& x : q) x = nd(rng);
  for (float& x : w) x = nd(rng);
  const float sscale = 0.125f;
  std::vector<float> out((size_t)rows * n_keys);
  ck::fp4_index_score_rows(q.data(), w.data(), rows, H, keys.data(), n_keys, n, sscale, out.data(), n_keys);
  std::vector<float> k((size_t)n);
  const size_t eb = ck::fp4_index_bytes(n);
  int bad = 0;
  for (int t = 0; t < n_keys; ++t) {
    ck::fp4_index_unpack(keys.data() + (size_t)t * eb, n, k.data());
    for (int r = 0; r < rows; ++r) {
      double want = 0, mag = 0;
      for (int h = 0; h < H; ++h) {
        double dot = 0, dmag = 0;
        for (int i = 0; i < n; ++i) {
          dot += (double)q[((size_t)r * H + h) * n + i] * k[(size_t)i];
          dmag += std::fabs((double)q[((size_t)r * H + h) * n + i] * k[(size_t)i]);
        }
        const double wh = (double)w[(size_t)r * H + h] * sscale;
        want += std::max(dot, 0.0) * wh;
        mag += dmag * std::fabs(wh);
      }
      bad += !(std::fabs(out[(size_t)r * n_keys + t] - want) <= 1e-5 * mag + 1e-30);
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(Fp4ScoreRows, ScanHelpersMatchTheirScalarLoops) {
  std::mt19937 rng(5);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const float specials[] = {nan, inf, -inf, 0.0f, -0.0f, 0.5f, -0.5f};
  std::uniform_int_distribution<int> pick(0, 9), sp(0, 6), small(-3, 3);
  int bad_next = 0, bad_max = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int n = trial % 41;
    std::vector<float> s((size_t)std::max(1, n));
    for (float& x : s) x = pick(rng) < 3 ? specials[sp(rng)] : 0.5f * (float)small(rng);  // many ties
    for (float thr : {-inf, -0.5f, 0.0f, 0.5f, 1.0f, inf}) {
      int want = n;
      for (int i = 0; i < n; ++i)
        if (s[(size_t)i] > thr) {
          want = i;
          break;
        }
      bad_next += ck::index_next_above(s.data(), n, thr) != want;
    }
    float m = -inf;
    for (int i = 0; i < n; ++i) m = std::max(m, s[(size_t)i]);
    const float got = ck::index_block_max(s.data(), n);
    bad_max += !(got == m) || std::isnan(got);  // equal as floats: +0 and −0 may differ in sign
  }
  EXPECT_EQ(bad_next, 0);
  EXPECT_EQ(bad_max, 0);
}

}  // namespace
