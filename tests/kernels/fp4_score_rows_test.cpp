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
// The integer path (FP4-exact queries, as the indexer's fake-quantised ones are):
//   * fp4_index_prepare_queries: fake-quantised rows are exact and a·2^qe gives every value
//     back; rows with a non-grid value, NaN or ∞ are not;
//   * bit-exact equality with the fp32 per-row form over the shape grid with fake-quantised
//     queries (checked to take the integer path), with rows of both kinds mixed in one block,
//     through the prepared form at a row offset, and over hostile data: key scale bytes at
//     0, 1, 254 and 255 (NaN), query blocks scaled by 2^±100 or more (so the range checks
//     send some (row, tile) pairs to the fp32 path), scales far apart across the blocks of a
//     key or head (n > 32: the spread check), −0 codes and −0 query values, all-zero blocks.
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

// Scale bytes 127 ± spread: 20 spreads a key's blocks over 2^±20; the integer-path tests also
// use 3, close scales like real keys', so that n > 32 passes its exponent-spread check.
std::vector<uint8_t> random_keys(int n_keys, int n, std::mt19937& rng, int spread = 20) {
  const size_t eb = ck::fp4_index_bytes(n);
  std::vector<uint8_t> k((size_t)n_keys * eb);
  std::uniform_int_distribution<int> byte(0, 255), sc(127 - spread, 127 + spread);
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

// Queries fake-quantised to FP4 (the indexer's), with optional per-block powers of two and
// −0 / all-zero blocks mixed in: still exactly FP4 (a power of two times an FP4 block is one).
std::vector<float> fp4_queries(int rows, int n_heads, int n, std::mt19937& rng, int exp_lo, int exp_hi) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> ex(exp_lo, exp_hi), kind(0, 15);
  std::vector<float> q((size_t)rows * n_heads * n);
  for (size_t v = 0; v < q.size() / n; ++v) {
    float* x = q.data() + v * n;
    for (int b = 0; b < n / 32; ++b) {
      const int k = kind(rng);
      const float s = std::ldexp(1.0f, ex(rng));
      for (int i = 0; i < 32; ++i) x[b * 32 + i] = k == 0 ? (i % 2 ? -0.0f : 0.0f) : nd(rng) * s;
    }
    ck::fp4_index_fake_quant(x, n);
    for (int i = 0; i < n; ++i)
      if (x[i] == 0.0f && i % 3 == 0) x[i] = -0.0f;
  }
  return q;
}

// Block scorer (unprepared) vs the per-row fp32 form; counts differing bits and rows that took
// the integer path (prepare says exact).
int compare_rows(const std::vector<float>& q, const std::vector<float>& w, int rows, int H, int n,
                 const std::vector<uint8_t>& keys, int n_keys, float sscale, int* exact_rows) {
  const int ldo = n_keys + 5;
  std::vector<float> got((size_t)rows * ldo, std::numeric_limits<float>::quiet_NaN());
  ck::fp4_index_score_rows(q.data(), w.data(), rows, H, keys.data(), n_keys, n, sscale, got.data(), ldo);
  ck::fp4_index_queries prep;
  ck::fp4_index_prepare_queries(q.data(), rows, H, n, prep);
  std::vector<float> scratch((size_t)std::max(1, H * n_keys)), want((size_t)std::max(1, n_keys));
  int bad = 0;
  *exact_rows = 0;
  for (int r = 0; r < rows; ++r) {
    *exact_rows += prep.info[(size_t)r].exact;
    ck::fp4_index_score_row(q.data() + (size_t)r * H * n, w.data() + (size_t)r * H, H, keys.data(), n_keys, n,
                            sscale, scratch.data(), want.data());
    for (int t = 0; t < n_keys; ++t)
      bad += std::bit_cast<uint32_t>(got[(size_t)r * ldo + t]) != std::bit_cast<uint32_t>(want[(size_t)t]);
    for (int t = n_keys; t < ldo; ++t) bad += !std::isnan(got[(size_t)r * ldo + t]);  // nothing beyond
  }
  return bad;
}

std::vector<float> head_weights(int rows, int H, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> w((size_t)rows * H);
  for (size_t i = 0; i < w.size(); ++i) w[i] = i % 7 == 3 ? 0.0f : nd(rng);
  return w;
}

TEST(Fp4ScoreRowsInt, PreparedQueriesAreExactFp4) {
  std::mt19937 rng(11);
  const int rows = 9, H = 3, n = 96;
  std::vector<float> q = fp4_queries(rows, H, n, rng, -30, 30);
  q[(size_t)1 * H * n + 5] = 0.3f;                                     // row 1: not on the grid
  q[(size_t)2 * H * n + 40] = std::numeric_limits<float>::quiet_NaN();  // row 2: NaN
  q[(size_t)3 * H * n + 70] = std::numeric_limits<float>::infinity();   // row 3: ∞
  q[(size_t)4 * H * n + 64] = std::nextafter(q[(size_t)4 * H * n + 64], 100.0f);  // row 4: one ulp off
  ck::fp4_index_queries prep;
  ck::fp4_index_prepare_queries(q.data(), rows, H, n, prep);
  ASSERT_EQ(prep.info.size(), (size_t)rows);
  for (int r = 0; r < rows; ++r) {
    const bool want = r < 1 || r > 4;
    EXPECT_EQ(prep.info[(size_t)r].exact, want) << "row " << r;
    if (!want) continue;
    int bad = 0;
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < n; ++i) {
        const size_t v = ((size_t)r * H + h) * n + i;
        const float back = (float)prep.a[v] * prep.unit[((size_t)r * H + h) * (n / 32) + i / 32];
        bad += back != q[v];
      }
    EXPECT_EQ(bad, 0) << "row " << r;
  }
}

TEST(Fp4ScoreRowsInt, FakeQuantisedQueriesEqualFp32BitForBit) {
  std::mt19937 rng(20261201);
  const shape shapes[] = {
      {1, 1, 4, 32},     {1, 17, 4, 32},    {2, 16, 4, 32},   {3, 15, 1, 64},   {5, 33, 3, 32},
      {7, 100, 4, 32},   {13, 257, 5, 64},  {16, 1000, 4, 32}, {31, 31, 8, 96}, {64, 3000, 4, 32},
      {65, 511, 2, 128}, {96, 1777, 4, 32}, {127, 48, 9, 32}, {128, 2049, 4, 32}, {130, 999, 7, 32},
      {130, 1, 4, 160},  {1, 3000, 6, 64},  {4, 2999, 4, 32}, {33, 0, 4, 32},   {9, 301, 2, 256},
  };
  for (const shape& s : shapes) {
    const std::vector<uint8_t> keys = random_keys(s.n_keys, s.n, rng, s.rows % 2 ? 3 : 20);
    const std::vector<float> q = fp4_queries(s.rows, s.n_heads, s.n, rng, -3, 3);
    const std::vector<float> w = head_weights(s.rows, s.n_heads, rng);
    int exact = 0;
    EXPECT_EQ(compare_rows(q, w, s.rows, s.n_heads, s.n, keys, s.n_keys, 1.0f / std::sqrt((float)s.n), &exact), 0)
        << "rows " << s.rows << " keys " << s.n_keys << " heads " << s.n_heads << " n " << s.n;
    EXPECT_EQ(exact, s.rows) << "fake-quantised rows must take the integer path";
  }
}

TEST(Fp4ScoreRowsInt, MixedRowsAndPreparedOffsetEqualFp32) {
  std::mt19937 rng(3);
  const int rows = 40, H = 4, n = 64, n_keys = 301;
  std::vector<float> q = fp4_queries(rows, H, n, rng, -2, 2);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int r = 0; r < rows; r += 3)  // every third row: plain floats (fp32 path)
    for (int i = 0; i < H * n; ++i) q[(size_t)r * H * n + i] = nd(rng);
  const std::vector<float> w = head_weights(rows, H, rng);
  const std::vector<uint8_t> keys = random_keys(n_keys, n, rng, 3);
  int exact = 0;
  EXPECT_EQ(compare_rows(q, w, rows, H, n, keys, n_keys, 0.125f, &exact), 0);
  EXPECT_EQ(exact, rows - (rows + 2) / 3);
  // prepared once, scored from row 7 on (the runner's form), against the unprepared block
  ck::fp4_index_queries prep;
  ck::fp4_index_prepare_queries(q.data(), rows, H, n, prep);
  const int r0 = 7;
  std::vector<float> a((size_t)(rows - r0) * n_keys), b((size_t)(rows - r0) * n_keys);
  ck::fp4_index_score_rows(prep, r0, q.data() + (size_t)r0 * H * n, w.data() + (size_t)r0 * H, rows - r0,
                           keys.data(), n_keys, 0.125f, a.data(), n_keys);
  ck::fp4_index_score_rows(q.data() + (size_t)r0 * H * n, w.data() + (size_t)r0 * H, rows - r0, H, keys.data(),
                           n_keys, n, 0.125f, b.data(), n_keys);
  int bad = 0;
  for (size_t i = 0; i < a.size(); ++i) bad += std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i]);
  EXPECT_EQ(bad, 0);
}

TEST(Fp4ScoreRowsInt, ExtremeScalesAndZerosEqualFp32) {
  std::mt19937 rng(77);
  std::uniform_int_distribution<int> byte(0, 255), pick(0, 9), nib(0, 15);
  const uint8_t extreme[] = {0, 1, 2, 127, 200, 240, 241, 242, 253, 254, 255};
  std::uniform_int_distribution<int> ext(0, (int)sizeof(extreme) - 1), mid(127 - 20, 127 + 20);
  struct cfg {
    int rows, n_keys, H, n, qlo, qhi, p_extreme;  // p_extreme/10: a block's scale byte from `extreme`
  };
  const cfg cfgs[] = {
      {6, 200, 4, 32, -126, -100, 4},  // tiny queries: units below 2^-149 with small key scales
      {6, 200, 4, 32, 90, 125, 4},     // huge queries: overflow checks
      {5, 150, 3, 64, -40, 40, 4},     // n > 32, exponent spread across a head's blocks
      {4, 130, 5, 128, -8, 8, 4},
      {8, 97, 4, 32, -2, 2, 4},
      {8, 400, 4, 32, -126, -105, 0},  // the 2^-149 edge inside the tiles of ordinary keys
      {8, 400, 4, 32, 95, 118, 0},     // the 2^128 edge
      {6, 300, 4, 64, -6, 6, 0},       // spreads near the n > 32 limit
  };
  for (const cfg& c : cfgs) {
    const size_t eb = ck::fp4_index_bytes(c.n);
    std::vector<uint8_t> keys((size_t)c.n_keys * eb);
    for (int t = 0; t < c.n_keys; ++t) {
      uint8_t* e = keys.data() + (size_t)t * eb;
      const int style = t % 4;  // 0: random; 1: −0/±0 codes only; 2: many −0 codes; 3: all-zero block
      for (int j = 0; j < c.n / 2; ++j) {
        const int lo = style == 1 ? (nib(rng) < 8 ? 8 : 0) : style == 2 && pick(rng) < 5 ? 8 : nib(rng);
        const int hi = style == 1 ? 8 : style == 2 && pick(rng) < 5 ? 8 : nib(rng);
        e[j] = (uint8_t)(lo | hi << 4);
      }
      if (style == 3)
        for (int j = 0; j < 16; ++j) e[j] = 0;
      for (int b = 0; b < c.n / 32; ++b)  // far-apart scales within one key for n > 32
        e[c.n / 2 + b] = (uint8_t)(pick(rng) < c.p_extreme ? extreme[ext(rng)] : mid(rng));
    }
    const std::vector<float> q = fp4_queries(c.rows, c.H, c.n, rng, c.qlo, c.qhi);
    const std::vector<float> w = head_weights(c.rows, c.H, rng);
    int exact = 0;
    EXPECT_EQ(compare_rows(q, w, c.rows, c.H, c.n, keys, c.n_keys, 1.0f / std::sqrt((float)c.n), &exact), 0)
        << "rows " << c.rows << " n " << c.n << " query exponents [" << c.qlo << ", " << c.qhi << "]";
    EXPECT_GT(exact, 0);
  }
}

}  // namespace
