// The quantisers of kernels/cpu/quant against an implementation cedar did not write: the HF
// transformers deepseek_v41 port that produced tests/fixtures/deepseek-v41-tiny-A. Its
// cache_after_prefill files hold the port's fake-quantised cache rows (FP4 compressed KV,
// FP4 indexer keys, FP8 window rows). The upstream values differ between the quant and
// noquant runs, so the rows cannot be re-derived here; instead every quant/ row must be a
// FIXED POINT of our quantiser (re-quantising it changes no bit), which holds only if our
// grid, block size and scale rule produce the port's values. The noquant rows serve as the
// control: they are not on the grid, so the same check must fail for them.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/quant.hpp"
#include "model/npy.hpp"

namespace ck = cedar::kernels;
using cedar::model::npy_array;

namespace {

const std::string k_cache = std::string(CEDAR_SOURCE_DIR) + "/tests/fixtures/deepseek-v41-tiny-A/";

npy_array load(const std::string& rel) {
  auto r = cedar::model::npy_load(k_cache + rel);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.err().message);
  return r.ok() ? std::move(r).value() : npy_array{};
}

// Counts rows (of the last dimension) that change when quantised again.
template <class Quant>
int64_t rows_not_fixed(const npy_array& a, Quant quant, int64_t* nonzero_rows) {
  EXPECT_EQ(a.dtype, "f32");
  const int n = static_cast<int>(a.shape.back());
  const int64_t rows = a.numel() / n;
  const float* v = a.as<float>();
  int64_t changed = 0;
  *nonzero_rows = 0;
  std::vector<float> row(n);
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(row.data(), v + r * n, n * sizeof(float));
    bool nonzero = false;
    for (float x : row) nonzero = nonzero || x != 0.0f;
    *nonzero_rows += nonzero;
    quant(row.data(), n);
    if (std::memcmp(row.data(), v + r * n, n * sizeof(float)) != 0) ++changed;
  }
  return changed;
}

}  // namespace

TEST(quant_fixture, compressed_kv_rows_are_fixed_points_of_fp4_kv) {
  for (const char* layer : {"2", "4", "6"}) {
    const auto q = load(std::string("quant/cache_after_prefill/compressed_kv_L") + layer + ".npy");
    const auto nq = load(std::string("noquant/cache_after_prefill/compressed_kv_L") + layer + ".npy");
    ASSERT_EQ(q.shape.size(), 2u);
    ASSERT_EQ(q.shape[1] % 16, 0);
    int64_t nonzero = 0, nonzero_nq = 0;
    EXPECT_EQ(rows_not_fixed(q, ck::fp4_kv_fake_quant, &nonzero), 0) << "layer " << layer;
    EXPECT_EQ(nonzero, q.shape[0]) << "layer " << layer;  // real data, not zeros
    // Scalar oracle agrees too.
    EXPECT_EQ(rows_not_fixed(q, ck::ref::fp4_kv_fake_quant, &nonzero), 0) << "layer " << layer;
    // Control: un-quantised rows are off the grid.
    EXPECT_EQ(rows_not_fixed(nq, ck::fp4_kv_fake_quant, &nonzero_nq), nq.shape[0]) << "layer " << layer;
  }
}

TEST(quant_fixture, index_key_rows_are_fixed_points_of_fp4_index) {
  for (const char* layer : {"2", "4", "6"}) {
    const auto q = load(std::string("quant/cache_after_prefill/index_k_L") + layer + ".npy");
    const auto nq = load(std::string("noquant/cache_after_prefill/index_k_L") + layer + ".npy");
    ASSERT_EQ(q.shape[1] % 32, 0);
    int64_t nonzero = 0;
    EXPECT_EQ(rows_not_fixed(q, ck::fp4_index_fake_quant, &nonzero), 0) << "layer " << layer;
    EXPECT_EQ(nonzero, q.shape[0]);
    EXPECT_EQ(rows_not_fixed(q, ck::ref::fp4_index_fake_quant, &nonzero), 0) << "layer " << layer;
    EXPECT_EQ(rows_not_fixed(nq, ck::fp4_index_fake_quant, &nonzero), nq.shape[0]) << "layer " << layer;
  }
}

TEST(quant_fixture, index_keys_are_not_on_the_e4m3_scaled_grid_by_accident) {
  // The two FP4 schemes differ (block 16 + E4M3 scale vs block 32 + power-of-two scale). The
  // fixed-point check above discriminates between them only if the port's index keys are
  // not also fixed points of the other scheme; require that for at least some rows.
  const auto q = load("quant/cache_after_prefill/index_k_L6.npy");
  int64_t nonzero = 0;
  EXPECT_GT(rows_not_fixed(q, ck::fp4_kv_fake_quant, &nonzero), 0)
      << "index keys should not be on the E4M3-scaled block-16 grid";
  const auto kv = load("quant/cache_after_prefill/compressed_kv_L6.npy");
  EXPECT_GT(rows_not_fixed(kv, ck::fp4_index_fake_quant, &nonzero), 0)
      << "compressed KV rows should not be on the power-of-two-scaled grid";
}

TEST(quant_fixture, swa_window_rows_are_fixed_points_of_fp8_swa) {
  const auto q = load("quant/cache_after_prefill/swa_window.npy");
  const auto nq = load("noquant/cache_after_prefill/swa_window.npy");
  ASSERT_EQ(q.shape.size(), 3u);
  ASSERT_EQ(q.shape[2] % 32, 0);
  int64_t nonzero = 0;
  EXPECT_EQ(rows_not_fixed(q, ck::fp8_swa_fake_quant, &nonzero), 0);
  EXPECT_EQ(nonzero, q.shape[0] * q.shape[1]);
  EXPECT_EQ(rows_not_fixed(q, ck::ref::fp8_swa_fake_quant, &nonzero), 0);
  EXPECT_EQ(rows_not_fixed(nq, ck::fp8_swa_fake_quant, &nonzero), nq.shape[0] * nq.shape[1]);
}

TEST(quant_fixture, packed_round_trip_of_the_port_values_is_exact) {
  // The port's quantised rows survive pack -> unpack bit for bit in the packed byte layout.
  const auto kv = load("quant/cache_after_prefill/compressed_kv_L2.npy");
  const int n = static_cast<int>(kv.shape[1]);
  std::vector<uint8_t> packed(ck::fp4_kv_bytes(n));
  std::vector<float> back(n);
  for (int64_t r = 0; r < kv.shape[0]; ++r) {
    const float* row = kv.as<float>() + r * n;
    ck::fp4_kv_pack(row, n, packed.data());
    std::fill(back.begin(), back.end(), -12345.0f);
    ck::fp4_kv_unpack(packed.data(), n, back.data());
    ASSERT_EQ(std::memcmp(back.data(), row, n * sizeof(float)), 0) << "row " << r;
  }
  const auto swa = load("quant/cache_after_prefill/swa_window.npy");
  const int d = static_cast<int>(swa.shape[2]);
  std::vector<uint8_t> p8(ck::fp8_swa_bytes(d));
  std::vector<float> b8(d);
  for (int64_t r = 0; r < swa.numel() / d; ++r) {
    const float* row = swa.as<float>() + r * d;
    ck::fp8_swa_pack(row, d, p8.data());
    std::fill(b8.begin(), b8.end(), -12345.0f);
    ck::fp8_swa_unpack(p8.data(), d, b8.data());
    ASSERT_EQ(std::memcmp(b8.data(), row, d * sizeof(float)), 0) << "row " << r;
  }
}
