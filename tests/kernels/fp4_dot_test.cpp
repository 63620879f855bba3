// Tests of kernels/cpu/fp4_dot: fp4_index_dot (FP4 index keys read from their packed bytes x
// fp32 queries) against dequantise-then-dot. Keys cover every byte value, so every E2M1 code
// in both nibble positions, with a spread of UE8M0 scales; outputs are poisoned first and the
// padding beyond each output row must stay untouched.
//   * bit-exact against fp4_index_unpack + a sequential fused multiply-add in channel order
//     (the order the kernel promises, fp4_dot.hpp);
//   * within 1e-5 of Σ|q·k| against the double-precision oracle (ref::fp4_index_dot).
#include "kernels/cpu/fp4_dot.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/quant.hpp"

namespace ck = cedar::kernels;

namespace {

// n_keys entries of n channels; byte j of key t is (t·n/2 + j + salt) mod 256, so a run of
// ≥ 256 data bytes holds every byte value (every code in the low and in the high nibble).
std::vector<uint8_t> every_code_keys(int n_keys, int n, int salt, std::mt19937& rng) {
  const size_t eb = ck::fp4_index_bytes(n);
  std::vector<uint8_t> k((size_t)n_keys * eb);
  std::uniform_int_distribution<int> sc(127 - 20, 127 + 20);  // scales 2^-20 .. 2^20
  for (int t = 0; t < n_keys; ++t) {
    uint8_t* e = k.data() + (size_t)t * eb;
    for (int j = 0; j < n / 2; ++j) e[j] = (uint8_t)(((size_t)t * (n / 2) + j + salt) & 255);
    for (int b = 0; b < n / 32; ++b) e[n / 2 + b] = (uint8_t)sc(rng);
  }
  return k;
}

struct shape {
  int nq, n_keys, n;
};

void check(const shape& s, const std::vector<uint8_t>& keys, std::mt19937& rng) {
  const int ldq = s.n + 3, ldo = s.n_keys + 5;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> q((size_t)s.nq * ldq);
  for (float& x : q) x = nd(rng);
  const float poison = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> got((size_t)s.nq * ldo, poison), oracle((size_t)s.nq * ldo, poison);
  ck::fp4_index_dot(q.data(), s.nq, ldq, keys.data(), s.n_keys, s.n, got.data(), ldo);
  ck::ref::fp4_index_dot(q.data(), s.nq, ldq, keys.data(), s.n_keys, s.n, oracle.data(), ldo);
  const size_t eb = ck::fp4_index_bytes(s.n);
  std::vector<float> k((size_t)s.n);
  int exact_bad = 0, tol_bad = 0;
  for (int t = 0; t < s.n_keys; ++t) {
    ck::fp4_index_unpack(keys.data() + (size_t)t * eb, s.n, k.data());
    for (int r = 0; r < s.nq; ++r) {
      const float* qr = q.data() + (size_t)r * ldq;
      float seq = 0.0f;
      double mag = 0.0;
      for (int i = 0; i < s.n; ++i) {
        seq = std::fma(qr[i], k[(size_t)i], seq);
        mag += std::fabs((double)qr[i] * k[(size_t)i]);
      }
      const float g = got[(size_t)r * ldo + t];
      exact_bad += std::bit_cast<uint32_t>(g) != std::bit_cast<uint32_t>(seq);
      tol_bad += !(std::fabs((double)g - oracle[(size_t)r * ldo + t]) <= 1e-5 * mag + 1e-30);
    }
  }
  EXPECT_EQ(exact_bad, 0) << "nq " << s.nq << " keys " << s.n_keys << " n " << s.n;
  EXPECT_EQ(tol_bad, 0) << "nq " << s.nq << " keys " << s.n_keys << " n " << s.n;
  int touched = 0;
  for (int r = 0; r < s.nq; ++r)
    for (int t = s.n_keys; t < ldo; ++t) touched += !std::isnan(got[(size_t)r * ldo + t]);
  EXPECT_EQ(touched, 0) << "wrote beyond n_keys";
}

}  // namespace

TEST(fp4_index_dot, every_code_matches_dequantise_then_dot) {
  std::mt19937 rng(7);
  // query counts around the 4-row block, key counts around the 16-key tile, n = 1..16 blocks
  for (int n : {32, 64, 128, 512})
    for (int nq : {1, 3, 4, 5, 8, 13})
      for (int n_keys : {1, 15, 16, 17, 40, 300}) {
        const std::vector<uint8_t> keys = every_code_keys(n_keys, n, nq * 31 + n_keys, rng);
        check({nq, n_keys, n}, keys, rng);
      }
}

TEST(fp4_index_dot, packed_keys_of_real_values) {
  // keys as the sequence stores them: fp4_index_pack of normal vectors of mixed magnitudes
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int n : {32, 128}) {
    const int n_keys = 123;
    const size_t eb = ck::fp4_index_bytes(n);
    std::vector<uint8_t> keys((size_t)n_keys * eb);
    std::vector<float> x((size_t)n);
    for (int t = 0; t < n_keys; ++t) {
      const float mag = std::ldexp(1.0f, (t % 9) - 4);
      for (float& v : x) v = nd(rng) * mag;
      ck::fp4_index_pack(x.data(), n, keys.data() + (size_t)t * eb);
    }
    check({64, n_keys, n}, keys, rng);
  }
}

TEST(fp4_index_dot, empty_inputs_write_nothing) {
  std::vector<uint8_t> keys(ck::fp4_index_bytes(32), 0x11);
  std::vector<float> q(32, 1.0f), out(4, -7.0f);
  ck::fp4_index_dot(q.data(), 0, 32, keys.data(), 1, 32, out.data(), 4);
  ck::fp4_index_dot(q.data(), 1, 32, keys.data(), 0, 32, out.data(), 4);
  for (float v : out) EXPECT_EQ(v, -7.0f);
}
