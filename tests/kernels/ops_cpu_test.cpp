// Fast CPU ops against their scalar oracles over a grid of shapes (HOUSE_STYLE 13, 14):
// outputs are poisoned first; tolerances are per op.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu/ops.hpp"

namespace kc = cedar::kernels;

namespace {

std::vector<float> randv(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  double md = 0, mb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    md = std::max(md, (double)std::fabs(a[i] - b[i]));
    mb = std::max(mb, (double)std::fabs(b[i]));
  }
  return md / std::max(mb, 1e-30);
}

TEST(ops_cpu, gemm_nt_matches_reference) {
  for (int m : {1, 2, 7, 33})
    for (int n : {1, 5, 64, 129})
      for (int k : {1, 16, 130}) {
        auto a = randv((size_t)m * k, 1u + m), b = randv((size_t)n * k, 2u + n);
        std::vector<float> c((size_t)m * n, NAN), r((size_t)m * n, NAN);
        kc::gemm_nt(m, n, k, a.data(), b.data(), c.data());
        kc::ref::gemm_nt(m, n, k, a.data(), b.data(), r.data());
        EXPECT_LE(max_rel(c, r), 1e-5) << m << "x" << n << "x" << k;
      }
}

// Few rows against a large weight (the batched-decode shape), strided A and C, alpha and beta.
TEST(ops_cpu, gemm_nt_small_batch_strided) {
  const int n = 300, k = 257;  // n·k ≥ 2^16; k not a multiple of the vector width
  for (int m : {2, 3, 8, 9, 16, 17, 32}) {
    auto a = randv((size_t)m * (k + 3), 20u + m), b = randv((size_t)n * k, 21u + m);
    auto c0 = randv((size_t)m * (n + 1), 22u + m);
    std::vector<float> c = c0, r((size_t)m * (n + 1));
    // strided A (lda = k + 3) and C (ldc = n + 1), alpha and beta
    kc::gemm_nt_ld(m, n, k, a.data(), k + 3, b.data(), k, c.data(), n + 1, 0.5f, 2.0f);
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) {
        double s = 0;
        for (int t = 0; t < k; ++t) s += (double)a[(size_t)i * (k + 3) + t] * b[(size_t)j * k + t];
        r[(size_t)i * (n + 1) + j] = (float)(0.5 * s + 2.0 * c0[(size_t)i * (n + 1) + j]);
      }
    for (int i = 0; i < m; ++i) r[(size_t)i * (n + 1) + n] = c0[(size_t)i * (n + 1) + n];  // untouched column
    EXPECT_LE(max_rel(c, r), 1e-5) << "m=" << m;
  }
}

TEST(ops_cpu, gemm_nn_and_beta) {
  const int m = 5, n = 9, k = 13;
  auto a = randv((size_t)m * k, 3), b = randv((size_t)k * n, 4), c0 = randv((size_t)m * n, 5);
  std::vector<float> c = c0, r((size_t)m * n);
  kc::gemm_nn_ld(m, n, k, a.data(), k, b.data(), n, c.data(), n, 2.0f, 1.0f);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double s = 0;
      for (int t = 0; t < k; ++t) s += (double)a[(size_t)i * k + t] * b[(size_t)t * n + j];
      r[(size_t)i * n + j] = (float)(2.0 * s + c0[(size_t)i * n + j]);
    }
  EXPECT_LE(max_rel(c, r), 1e-5);
}

TEST(ops_cpu, rmsnorm_softmax_swiglu_match_reference) {
  for (int n : {1, 3, 64, 517}) {
    auto x = randv((size_t)n, 7u + n, 3.0f), w = randv((size_t)n, 8u + n);
    std::vector<float> y((size_t)n, NAN), r((size_t)n, NAN);
    kc::rmsnorm(x.data(), w.data(), n, 1e-20, y.data());
    kc::ref::rmsnorm(x.data(), w.data(), n, 1e-20, r.data());
    EXPECT_LE(max_rel(y, r), 1e-5) << n;
    kc::rmsnorm(x.data(), nullptr, n, 1e-6, y.data());
    kc::ref::rmsnorm(x.data(), nullptr, n, 1e-6, r.data());
    EXPECT_LE(max_rel(y, r), 1e-5) << n;
    y = x;
    r = x;
    kc::softmax(y.data(), n);
    kc::ref::softmax(r.data(), n);
    EXPECT_LE(max_rel(y, r), 1e-5) << n;
    auto g = randv((size_t)n, 9u + n, 8.0f), u = randv((size_t)n, 10u + n, 8.0f);
    std::fill(y.begin(), y.end(), NAN);
    kc::swiglu(g.data(), u.data(), n, 10.0f, 0.7f, y.data());
    kc::ref::swiglu(g.data(), u.data(), n, 10.0f, 0.7f, r.data());
    EXPECT_LE(max_rel(y, r), 1e-5) << n;
  }
}

TEST(ops_cpu, swiglu_clamps) {
  const float g[3] = {20.0f, -3.0f, 1.0f}, u[3] = {50.0f, -50.0f, 2.0f};
  float y[3];
  kc::swiglu(g, u, 3, 10.0f, 1.0f, y);
  EXPECT_NEAR(y[0], 10.0f / (1.0f + std::exp(-10.0f)) * 10.0f, 1e-4);  // gate ≤ 10, up ≤ 10
  EXPECT_NEAR(y[1], -3.0f / (1.0f + std::exp(3.0f)) * -10.0f, 1e-5);   // up ≥ −10
}

TEST(ops_cpu, rope_matches_reference_and_inverts) {
  for (int pairs : {1, 8, 32}) {
    const int n = 2 * pairs + 48;
    auto x = randv((size_t)n, 11u + pairs);
    std::vector<float> c((size_t)pairs), s((size_t)pairs);
    for (int i = 0; i < pairs; ++i) {
      c[(size_t)i] = std::cos(0.3f * i + 0.1f);
      s[(size_t)i] = std::sin(0.3f * i + 0.1f);
    }
    std::vector<float> y = x, r = x;
    kc::rope_interleaved(y.data(), n, pairs, c.data(), s.data(), false);
    kc::ref::rope_interleaved(r.data(), n, pairs, c.data(), s.data(), false);
    EXPECT_LE(max_rel(y, r), 1e-6);
    for (int i = 0; i < n - 2 * pairs; ++i) EXPECT_EQ(y[(size_t)i], x[(size_t)i]);  // nope part untouched
    kc::rope_interleaved(y.data(), n, pairs, c.data(), s.data(), true);
    EXPECT_LE(max_rel(y, x), 1e-6);
  }
}

}  // namespace
