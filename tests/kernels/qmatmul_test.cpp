// qmatmul: the weight formats dequantise bit-exactly to their definition (quant.hpp's scalar
// codecs), the encoders follow the format (power-of-two UE8M0 scale from the block amax, codes
// from the scalar encoders), and qgemm_nt matches the double-accumulating oracle over a grid
// of shapes, batch sizes (both schedules), strides, row slices and beta — outputs poisoned
// first. The f32 format is OpenBLAS's GEMM per tile; no result depends on the thread count.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/qmatmul.hpp"
#include "kernels/cpu/quant.hpp"

namespace ck = cedar::kernels;

namespace {

// A weight matrix in one format, with the storage its view points into.
struct stored {
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
  std::vector<uint8_t> codes, scales;
  std::vector<float> scales_f32;
  ck::qmatrix m;
};

enum class kind { f32, bf16, f8_32x32, f8_1x32, f8_f32_scales, fp4 };
const kind k_kinds[] = {kind::f32, kind::bf16, kind::f8_32x32, kind::f8_1x32, kind::f8_f32_scales, kind::fp4};
const char* kind_name(kind k) {
  switch (k) {
    case kind::f32: return "f32";
    case kind::bf16: return "bf16";
    case kind::f8_32x32: return "f8_32x32";
    case kind::f8_1x32: return "f8_1x32";
    case kind::f8_f32_scales: return "f8_f32_scales";
    case kind::fp4: return "fp4";
  }
  return "?";
}

std::vector<float> randn(size_t n, uint64_t seed, float sd) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

stored make(kind k, int64_t rows, int64_t cols, uint64_t seed) {
  stored s;
  // Rows of very different magnitudes so per-block scales matter.
  s.f32 = randn((size_t)(rows * cols), seed, 1.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) s.f32[(size_t)(r * cols + c)] *= std::ldexp(1.0f, (int)(r % 7) - 3);
  const int64_t scols = (cols + 31) / 32;
  switch (k) {
    case kind::f32:
      s.m = ck::qmatrix_f32(s.f32.data(), rows, cols);
      break;
    case kind::bf16:
      for (float x : s.f32) s.bf16.push_back(ck::f32_to_bf16(x));
      s.m = ck::qmatrix_bf16(s.bf16.data(), rows, cols);
      break;
    case kind::f8_32x32:
    case kind::f8_1x32:
    case kind::f8_f32_scales: {
      const int br = k == kind::f8_1x32 ? 1 : 32;
      s.codes.resize((size_t)(rows * cols));
      s.scales.resize((size_t)(((rows + br - 1) / br) * scols));
      ck::quantise_f8_blocks(s.f32.data(), rows, cols, br, s.codes.data(), s.scales.data());
      s.m.format = ck::weight_format::f8_e4m3;
      s.m.rows = rows;
      s.m.cols = cols;
      s.m.data = s.codes.data();
      s.m.scale_block_rows = br;
      s.m.scale_cols = scols;
      if (k == kind::f8_f32_scales) {
        // Non-power-of-two fp32 scales (a checkpoint may store F32 scales).
        for (uint8_t b : s.scales) s.scales_f32.push_back(ck::ue8m0_decode(b) * 0.75f);
        s.m.scale_f32 = s.scales_f32.data();
      } else {
        s.m.scale_e8m0 = s.scales.data();
      }
      break;
    }
    case kind::fp4:
      s.codes.resize((size_t)(rows * cols / 2));
      s.scales.resize((size_t)(rows * scols));
      ck::quantise_fp4_rows(s.f32.data(), rows, cols, s.codes.data(), s.scales.data());
      s.m.format = ck::weight_format::fp4_e2m1;
      s.m.rows = rows;
      s.m.cols = cols;
      s.m.data = s.codes.data();
      s.m.scale_e8m0 = s.scales.data();
      s.m.scale_block_rows = 1;
      s.m.scale_cols = scols;
      break;
  }
  return s;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

}  // namespace

TEST(qmatmul, dequant_rows_is_the_format_definition) {
  for (kind k : k_kinds) {
    const int64_t rows = 70, cols = k == kind::fp4 ? 96 : 83;  // ragged FP8 blocks on both axes
    {
      stored s = make(k, rows, cols, 3);
      std::vector<float> out((size_t)(rows * cols), std::numeric_limits<float>::quiet_NaN());
      ck::dequant_rows(s.m, 0, rows, out.data());
      int bad = 0;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) bad += !same_bits(out[(size_t)(r * cols + c)], ck::ref::qmatrix_at(s.m, r, c));
      EXPECT_EQ(bad, 0) << kind_name(k);
      // A slice keeps global block indexing: rows 37.. of the slice are rows 37.. of the tensor.
      const ck::qmatrix sl = s.m.slice_rows(37, 20);
      std::vector<float> part((size_t)(20 * cols));
      ck::dequant_rows(sl, 0, 20, part.data());
      EXPECT_EQ(0, std::memcmp(part.data(), out.data() + 37 * cols, part.size() * 4)) << kind_name(k);
    }
  }
}

TEST(qmatmul, decoded_values_follow_the_codecs) {
  // bf16: the top 16 bits; e4m3 and e2m1 codes times the UE8M0 scale, exactly.
  stored b = make(kind::bf16, 3, 32, 5);
  EXPECT_TRUE(same_bits(ck::ref::qmatrix_at(b.m, 2, 7), ck::bf16_to_f32(b.bf16[2 * 32 + 7])));
  stored f = make(kind::f8_32x32, 40, 64, 6);
  EXPECT_TRUE(same_bits(ck::ref::qmatrix_at(f.m, 33, 40),
                        ck::e4m3_decode(f.codes[33 * 64 + 40]) * ck::ue8m0_decode(f.scales[1 * 2 + 1])));
  stored p = make(kind::fp4, 2, 64, 7);
  const uint8_t byte = p.codes[1 * 32 + 20];  // elements 40 (low nibble) and 41 (high nibble)
  EXPECT_TRUE(same_bits(ck::ref::qmatrix_at(p.m, 1, 40), ck::e2m1_decode(byte & 15) * ck::ue8m0_decode(p.scales[1 * 2 + 1])));
  EXPECT_TRUE(same_bits(ck::ref::qmatrix_at(p.m, 1, 41), ck::e2m1_decode(byte >> 4) * ck::ue8m0_decode(p.scales[1 * 2 + 1])));
}

TEST(qmatmul, encoders_pick_the_power_of_two_block_scale) {
  const int64_t rows = 64, cols = 96;
  for (kind k : {kind::f8_32x32, kind::f8_1x32, kind::fp4}) {
    stored s = make(k, rows, cols, 11);
    const int br = k == kind::f8_32x32 ? 32 : 1;
    const float qmax = k == kind::fp4 ? 6.0f : 448.0f;
    for (int64_t r0 = 0; r0 < rows; r0 += br)
      for (int64_t b = 0; b < cols / 32; ++b) {
        float amax = 0;
        for (int64_t r = r0; r < r0 + br; ++r)
          for (int64_t c = b * 32; c < b * 32 + 32; ++c) amax = std::max(amax, std::fabs(s.f32[(size_t)(r * cols + c)]));
        const float sc = ck::ue8m0_decode(s.scales[(size_t)((r0 / br) * (cols / 32) + b)]);
        // smallest power of two with amax / scale <= qmax
        EXPECT_LE(amax / sc, qmax) << kind_name(k);
        EXPECT_GT(amax / sc, qmax / 2) << kind_name(k);
        for (int64_t r = r0; r < r0 + br; ++r)
          for (int64_t c = b * 32; c < b * 32 + 32; ++c) {
            const float x = s.f32[(size_t)(r * cols + c)] / sc;
            const uint8_t want = k == kind::fp4 ? ck::e2m1_encode(x) : ck::e4m3_encode(x);
            const uint8_t got = k == kind::fp4 ? (uint8_t)((s.codes[(size_t)(r * cols + c) / 2] >> (4 * (c % 2))) & 15)
                                               : s.codes[(size_t)(r * cols + c)];
            ASSERT_EQ(got, want) << kind_name(k) << " at " << r << "," << c;
          }
      }
  }
}

TEST(qmatmul, gemm_matches_oracle_over_a_grid) {
  struct shape {
    int64_t n, k;
  };
  const shape shapes[] = {{1, 32}, {7, 64}, {33, 96}, {70, 200}, {600, 256}};  // 600x256: threaded
  const int ms[] = {1, 2, 3, 5, 8, 9, 17};  // both schedules (≤ 8 rows: row dots; more: tiles)
  double worst = 0;
  for (kind k : k_kinds)
    for (const shape& sh : shapes) {
      if (k == kind::fp4 && sh.k % 32 != 0) continue;
      stored s = make(k, sh.n, sh.k, 100 + sh.n);
      std::vector<float> wdef((size_t)(sh.n * sh.k));  // W by definition, for the error bound
      for (int64_t j = 0; j < sh.n; ++j)
        for (int64_t t = 0; t < sh.k; ++t) wdef[(size_t)(j * sh.k + t)] = ck::ref::qmatrix_at(s.m, j, t);
      for (int m : ms)
        for (float beta : {0.0f, 0.5f}) {
          if (beta != 0.0f && m != 1 && m != 9) continue;  // accumulate-into-C: one m per schedule
          if (sh.n >= 600 && m != 1 && m != 3 && m != 9) continue;  // keep the oracle cheap
          const int lda = (int)sh.k + 3, ldc = (int)sh.n + 5;
          const std::vector<float> a = randn((size_t)m * lda, 7 + m, 1.0f);
          std::vector<float> c((size_t)m * ldc, beta == 0.0f ? std::numeric_limits<float>::quiet_NaN() : 0.25f);
          std::vector<float> want = c;
          ck::qgemm_nt(m, a.data(), lda, s.m, c.data(), ldc, 0.5f, beta);
          ck::ref::qgemm_nt(m, a.data(), lda, s.m, want.data(), ldc, 0.5f, beta);
          for (int i = 0; i < m; ++i)
            for (int64_t j = 0; j < sh.n; ++j) {
              // Bound: fp32 accumulation of k products, relative to Σ|a·w|.
              double mag = 0;
              for (int64_t t = 0; t < sh.k; ++t) mag += std::fabs(a[(size_t)i * lda + t] * wdef[(size_t)(j * sh.k + t)]);
              const double err = std::fabs((double)c[(size_t)i * ldc + j] - want[(size_t)i * ldc + j]);
              const double rel = err / (0.5 * mag + 1e-30);
              worst = std::max(worst, rel);
              ASSERT_LE(rel, 4e-6) << kind_name(k) << " n=" << sh.n << " k=" << sh.k << " m=" << m << " beta=" << beta;
            }
          // Columns past n (the ldc padding) are untouched.
          for (int i = 0; i < m; ++i)
            for (int j = (int)sh.n; j < ldc; ++j)
              EXPECT_TRUE(same_bits(c[(size_t)i * ldc + j], want[(size_t)i * ldc + j]));
        }
    }
  std::printf("qgemm_nt vs oracle: worst |err| / sum|a*w| = %.3g\n", worst);
}

TEST(qmatmul, row_slice_gemm_uses_the_slice_rows) {
  for (kind k : {kind::bf16, kind::f8_32x32, kind::fp4}) {
    stored s = make(k, 96, 64, 21);
    const ck::qmatrix sl = s.m.slice_rows(40, 24);  // starts inside a 32-row scale block
    for (int m : {1, 12}) {
      const std::vector<float> a = randn((size_t)m * 64, 5, 1.0f);
      std::vector<float> got((size_t)m * 24), full((size_t)m * 96);
      ck::qgemm_nt(m, a.data(), sl, got.data());
      ck::ref::qgemm_nt(m, a.data(), 64, s.m, full.data(), 96, 1.0f, 0.0f);
      for (int i = 0; i < m; ++i)
        for (int j = 0; j < 24; ++j)
          EXPECT_NEAR(got[(size_t)i * 24 + j], full[(size_t)i * 96 + 40 + j], 1e-4f) << kind_name(k);
    }
  }
}

// The f32 format is OpenBLAS's GEMM, run per tile of weight rows: within fp32 rounding of
// one whole-matrix call. OpenBLAS picks its kernel (and so its summation order) by CPU and by
// shape, so the bound is fp32 rounding of the sum of |a*w| terms, not of the result: a dot
// product that cancels to ~1 out of terms summing to ~100 differs by ~1e-5 between two orders
// (it did on an AMD EPYC with the old 1e-5 * (1 + |result|) bound).
TEST(qmatmul, f32_format_matches_the_blas_gemm) {
  const int n = 300, k = 128;
  stored s = make(kind::f32, n, k, 9);
  for (int m : {1, 6, 40}) {
    const std::vector<float> a = randn((size_t)m * k, 13, 1.0f);
    std::vector<float> got((size_t)m * n, -1.0f), want((size_t)m * n, -2.0f);
    ck::qgemm_nt(m, a.data(), s.m, got.data());
    ck::gemm_nt(m, n, k, a.data(), s.f32.data(), want.data());
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) {
        double mag = 0;
        for (int t = 0; t < k; ++t) mag += std::fabs((double)a[(size_t)i * k + t] * s.f32[(size_t)j * k + t]);
        const size_t o = (size_t)i * n + j;
        ASSERT_LE(std::fabs((double)got[o] - want[o]), 4e-6 * mag + 1e-30) << "m=" << m << " i=" << i << " j=" << j;
      }
  }
}

// However many parts (threads) a product is cut into, every output element comes out of the
// same computation: bit-identical results on any core count, for both schedules and every
// format (a session resumed on another machine replays the same logits).
TEST(qmatmul, results_do_not_depend_on_the_thread_count) {
  for (kind k : k_kinds)
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1000, 96}, {300, 1024}}) {
      stored s = make(k, rows, cols, 21);
      for (int m : {1, 5, 8, 9, 40}) {
        const std::vector<float> a = randn((size_t)m * (size_t)cols, 22, 1.0f);
        std::vector<float> one((size_t)m * (size_t)rows, -1.0f);
        ck::detail::qgemm_nt_split(1, m, a.data(), (int)cols, s.m, one.data(), (int)rows, 1.0f, 0.0f);
        for (int parts : {2, 3, 7, 16}) {
          std::vector<float> got((size_t)m * (size_t)rows, -2.0f);
          ck::detail::qgemm_nt_split(parts, m, a.data(), (int)cols, s.m, got.data(), (int)rows, 1.0f, 0.0f);
          ASSERT_EQ(0, std::memcmp(got.data(), one.data(), got.size() * 4))
              << kind_name(k) << " " << rows << "x" << cols << " m=" << m << " parts=" << parts;
        }
      }
    }
}

TEST(qmatmul, format_sizes) {
  stored b = make(kind::bf16, 10, 64, 1), f = make(kind::f8_32x32, 10, 64, 1), p = make(kind::fp4, 10, 64, 1);
  EXPECT_EQ(b.m.data_bytes(), 10u * 64 * 2);
  EXPECT_EQ(f.m.data_bytes(), 10u * 64);
  EXPECT_EQ(p.m.data_bytes(), 10u * 32);
  EXPECT_STREQ(ck::weight_format_name(p.m.format), "fp4_e2m1");
}

// Every E4M3 code (NaNs and subnormals included) under several UE8M0 scales, and every FP4
// byte: the fast row decoders give exactly the codec's value times the scale.
TEST(qmatmul, every_code_decodes_exactly) {
  std::vector<uint8_t> codes(256 * 8);
  for (int i = 0; i < 256 * 8; ++i) codes[(size_t)i] = (uint8_t)(i % 256);
  const uint8_t scale_bytes[] = {127, 0, 1, 100, 134, 200, 254, 255};  // 1, 2^-127 .. 2^127, NaN
  std::vector<uint8_t> scales;
  for (uint8_t sb : scale_bytes)
    for (int b = 0; b < 8; ++b) scales.push_back(sb);  // row r: 8 blocks of 32 with scale_bytes[r]
  ck::qmatrix f8;
  f8.format = ck::weight_format::f8_e4m3;
  f8.rows = 8;
  f8.cols = 256;
  f8.data = codes.data();
  f8.scale_e8m0 = scales.data();
  f8.scale_block_rows = 1;
  f8.scale_cols = 8;
  ck::qmatrix f4 = f8;
  f4.format = ck::weight_format::fp4_e2m1;
  f4.cols = 512;
  f4.scale_cols = 16;
  std::vector<uint8_t> scales4;
  for (uint8_t sb : scale_bytes)
    for (int b = 0; b < 16; ++b) scales4.push_back(sb);
  f4.scale_e8m0 = scales4.data();
  for (const ck::qmatrix* m : {&f8, &f4}) {
    std::vector<float> out((size_t)(m->rows * m->cols));
    ck::dequant_rows(*m, 0, m->rows, out.data());
    int bad = 0;
    for (int64_t r = 0; r < m->rows; ++r)
      for (int64_t c = 0; c < m->cols; ++c) {
        const float got = out[(size_t)(r * m->cols + c)], want = ck::ref::qmatrix_at(*m, r, c);
        bad += !(same_bits(got, want) || (std::isnan(got) && std::isnan(want)));
      }
    EXPECT_EQ(bad, 0) << ck::weight_format_name(m->format);
  }
}
