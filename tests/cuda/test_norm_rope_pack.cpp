// norm_rope_pack (kernels/cuda/kv_pack.cuh), the fused RMSNorm -> RoPE -> encode of the decode
// step, against the steps it replaces: without a norm, its rotated values are rope_rows' bit
// for bit; with one, they match a double oracle; its packed entries are exactly what the CPU
// encoders (kernels/cpu/quant.hpp) make of its own fp32 values; the indexer queries' FP4 round
// trip equals rope_rows + fp4_index_fake_quant bit for bit; a row with a null destination is
// skipped (its bytes untouched).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/quant.hpp"
#include "kernels/cuda/kv_pack.cuh"
#include "tests/cuda/cuda_test_util.hpp"

namespace kc = cedar::kernels;
namespace cu = cedar::kernels::cuda;
using cedar::test::dev_array;
using cedar::test::randn;

namespace {

void angles(std::mt19937& g, size_t n, std::vector<float>& cs, std::vector<float>& sn) {
  std::uniform_real_distribution<float> a(-3.14159f, 3.14159f);
  cs.resize(n), sn.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const float t = a(g);
    cs[i] = std::cos(t), sn[i] = std::sin(t);
  }
}

}  // namespace

TEST(cuda_norm_rope_pack, encoders_match_the_cpu_on_the_fused_values) {
  CEDAR_REQUIRE_GPU();
  struct kc_case {
    cu::pack_kind kind;
    int n, np;
  };
  for (const kc_case& k : {kc_case{cu::pack_kind::fp8_swa, 256, 32}, kc_case{cu::pack_kind::fp4_kv, 512, 32},
                           kc_case{cu::pack_kind::fp4_index, 128, 32}, kc_case{cu::pack_kind::fp8_swa, 64, 8}}) {
    const int R = 3, n = k.n, np = k.np;
    std::mt19937 g(31u + (unsigned)n + (unsigned)k.kind);
    const auto x = randn(g, (size_t)R * n, 2.0f), w = randn(g, (size_t)n, 1.0f);
    std::vector<float> cs, sn;
    angles(g, (size_t)R * np, cs, sn);
    const size_t eb = k.kind == cu::pack_kind::fp8_swa ? kc::fp8_swa_bytes(n)
                      : k.kind == cu::pack_kind::fp4_kv ? kc::fp4_kv_bytes(n) : kc::fp4_index_bytes(n);
    std::vector<std::unique_ptr<dev_array<uint8_t>>> out;
    std::vector<uint8_t*> dst;
    for (int r = 0; r < R; ++r) {
      out.push_back(std::make_unique<dev_array<uint8_t>>(std::vector<uint8_t>(eb, 0xAB)));
      dst.push_back(r == 1 ? nullptr : out.back()->p);  // row 1: no destination
    }
    dev_array<uint8_t*> ddst(dst);
    dev_array<float> dx(x), dw(w), dcos(cs), dsin(sn);
    cu::norm_rope_pack_params p;
    p.R = R, p.n = n, p.x = dx.p, p.norm_w = dw.p, p.eps = 1e-6f, p.cos = dcos.p, p.sin = dsin.p, p.np = np;
    p.kind = k.kind, p.dst = ddst.p, p.write_back = true;
    const auto st = cu::norm_rope_pack(p, nullptr);
    ASSERT_TRUE(st.ok()) << st.err().message;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto y = dx.download();
    for (int r = 0; r < R; ++r) {
      double ss = 0;
      for (int c = 0; c < n; ++c) ss += (double)x[(size_t)r * n + c] * x[(size_t)r * n + c];
      const double inv = 1 / std::sqrt(ss / n + 1e-6);
      std::vector<double> v((size_t)n);
      for (int c = 0; c < n; ++c) v[(size_t)c] = x[(size_t)r * n + c] * inv * w[(size_t)c];
      for (int i = 0; i < np; ++i) {
        const int c = n - 2 * np + 2 * i;
        const double e = v[(size_t)c], o = v[(size_t)c + 1], cc = cs[(size_t)r * np + i], s = sn[(size_t)r * np + i];
        v[(size_t)c] = e * cc - o * s, v[(size_t)c + 1] = e * s + o * cc;
      }
      for (int c = 0; c < n; ++c)
        ASSERT_NEAR(y[(size_t)r * n + c], v[(size_t)c], 2e-5 * (std::fabs(v[(size_t)c]) + 1)) << "n " << n << " row " << r;
      const auto bytes = out[(size_t)r]->download();
      if (r == 1) {
        for (uint8_t b : bytes) ASSERT_EQ(b, 0xAB) << "a row without a destination was written";
        continue;
      }
      std::vector<uint8_t> want(eb);
      const float* yr = y.data() + (size_t)r * n;
      if (k.kind == cu::pack_kind::fp8_swa) kc::fp8_swa_pack(yr, n, want.data());
      else if (k.kind == cu::pack_kind::fp4_kv) kc::fp4_kv_pack(yr, n, want.data());
      else kc::fp4_index_pack(yr, n, want.data());
      ASSERT_EQ(bytes, want) << "n " << n << " row " << r;
    }
  }
}

TEST(cuda_norm_rope_pack, rope_and_query_round_trip_equal_the_separate_kernels) {
  CEDAR_REQUIRE_GPU();
  const int B = 3, Hi = 8, Di = 128, np = 32;
  std::mt19937 g(5);
  const auto x = randn(g, (size_t)B * Hi * Di, 1.5f);
  std::vector<float> cs, sn;
  angles(g, (size_t)B * np, cs, sn);
  dev_array<float> dcos(cs), dsin(sn), da(x), db(x);
  // separate: rope_rows, then the FP4 round trip
  ASSERT_TRUE(cu::rope_rows(da.p, B, Hi, Di, np, dcos.p, dsin.p, false, nullptr).ok());
  dev_array<float> dr(B * Hi * Di);
  ASSERT_EQ(cudaMemcpy(dr.p, da.p, sizeof(float) * dr.n, cudaMemcpyDeviceToDevice), cudaSuccess);
  ASSERT_TRUE(cu::fp4_index_fake_quant(da.p, B * Hi, Di, nullptr).ok());
  // fused: RoPE only, then RoPE + round trip
  dev_array<float> dc(x);
  cu::norm_rope_pack_params p;
  p.R = B * Hi, p.nvec = Hi, p.n = Di, p.x = dc.p, p.cos = dcos.p, p.sin = dsin.p, p.np = np, p.write_back = true;
  ASSERT_TRUE(cu::norm_rope_pack(p, nullptr).ok());
  p.x = db.p, p.kind = cu::pack_kind::fp4_index_fake;
  ASSERT_TRUE(cu::norm_rope_pack(p, nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(dc.download(), dr.download());
  EXPECT_EQ(db.download(), da.download());
  // bad shapes are named
  p.n = 48;
  const auto st = cu::norm_rope_pack(p, nullptr);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.err().message.find("multiple of 32"), std::string::npos) << st.err().message;
}

// norm_rope_pack_many: the jobs of one decode layer (an FP4 index key with norm and RoPE, an FP4
// main entry, an FP8 SWA entry with a null destination row, indexer queries round-tripped in
// place: 3 widths, so the launch's widest block carries idle warps for the narrower jobs) in one
// launch give the bytes and values of one launch per job.
TEST(cuda_norm_rope_pack, many_jobs_in_one_launch_equal_one_launch_each) {
  CEDAR_REQUIRE_GPU();
  const int B = 3, np = 16, Hi = 4;
  struct job_spec {
    cu::pack_kind kind;
    int n, nvec;
    bool norm;
  };
  const job_spec specs[4] = {{cu::pack_kind::fp4_index, 128, 1, true}, {cu::pack_kind::fp4_kv, 256, 1, false},
                             {cu::pack_kind::fp8_swa, 512, 1, true}, {cu::pack_kind::fp4_index_fake, 128, Hi, false}};
  std::mt19937 g(77);
  std::vector<float> cs, sn;
  angles(g, (size_t)B * np, cs, sn);
  dev_array<float> dcos(cs), dsin(sn);
  struct side {
    std::vector<std::unique_ptr<dev_array<float>>> x, w;
    std::vector<std::unique_ptr<dev_array<uint8_t>>> out;
    std::vector<std::unique_ptr<dev_array<uint8_t*>>> dst;
    std::vector<cu::norm_rope_pack_params> jobs;
  };
  side one, many;
  std::vector<std::vector<float>> xs, ws;
  for (const job_spec& s : specs) {
    xs.push_back(randn(g, (size_t)B * s.nvec * s.n, 2.0f));
    ws.push_back(randn(g, (size_t)s.n, 1.0f));
  }
  for (side* sd : {&one, &many}) {
    for (int j = 0; j < 4; ++j) {
      const job_spec& s = specs[j];
      sd->x.push_back(std::make_unique<dev_array<float>>(xs[(size_t)j]));
      sd->w.push_back(std::make_unique<dev_array<float>>(ws[(size_t)j]));
      cu::norm_rope_pack_params p;
      p.R = B * s.nvec, p.nvec = s.nvec, p.n = s.n, p.x = sd->x.back()->p, p.norm_w = s.norm ? sd->w.back()->p : nullptr;
      p.eps = 1e-6f, p.cos = dcos.p, p.sin = dsin.p, p.np = np, p.kind = s.kind;
      if (s.kind == cu::pack_kind::fp4_index_fake) {
        p.write_back = true;
      } else {
        const size_t eb = s.kind == cu::pack_kind::fp8_swa ? kc::fp8_swa_bytes(s.n)
                          : s.kind == cu::pack_kind::fp4_kv ? kc::fp4_kv_bytes(s.n) : kc::fp4_index_bytes(s.n);
        std::vector<uint8_t*> d;
        for (int r = 0; r < B; ++r) {
          sd->out.push_back(std::make_unique<dev_array<uint8_t>>(std::vector<uint8_t>(eb, 0xAB)));
          d.push_back(s.kind == cu::pack_kind::fp8_swa && r == 1 ? nullptr : sd->out.back()->p);
        }
        sd->dst.push_back(std::make_unique<dev_array<uint8_t*>>(d));
        p.dst = sd->dst.back()->p;
      }
      sd->jobs.push_back(p);
    }
  }
  for (const auto& p : one.jobs) ASSERT_TRUE(cu::norm_rope_pack(p, nullptr).ok());
  const auto st = cu::norm_rope_pack_many(many.jobs.data(), 4, nullptr);
  ASSERT_TRUE(st.ok()) << st.err().message;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (size_t i = 0; i < one.out.size(); ++i) EXPECT_EQ(one.out[i]->download(), many.out[i]->download()) << "entry " << i;
  for (size_t j = 0; j < one.x.size(); ++j) EXPECT_EQ(one.x[j]->download(), many.x[j]->download()) << "job " << j;
  // too many jobs, or a bad one, is an error that says which
  std::vector<cu::norm_rope_pack_params> five(5, many.jobs[0]);
  ASSERT_FALSE(cu::norm_rope_pack_many(five.data(), 5, nullptr).ok());
  many.jobs[2].n = 48;
  const auto bad = cu::norm_rope_pack_many(many.jobs.data(), 4, nullptr);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.err().message.find("multiple of 32"), std::string::npos) << bad.err().message;
}
