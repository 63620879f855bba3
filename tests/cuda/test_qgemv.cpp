// qgemv and rms_norm (kernels/cuda/qgemv.cuh) against CPU oracles: weights quantised here with
// the scalar codecs of kernels/cpu/quant.hpp (bf16, E4M3 + UE8M0 per 32×32 or 1×32 block,
// E2M1 + UE8M0 per 1×32), dequantised element by element and accumulated in double. Grid of
// shapes (ragged rows, cols not a multiple of 256, row-offset views), m from 1 to 64, y
// poisoned with NaN before each launch; tolerance relative to Σ|w·x| of each output.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/quant.hpp"
#include "kernels/cuda/moe.cuh"
#include "kernels/cuda/qgemv.cuh"
#include "tests/cuda/cuda_test_util.hpp"

namespace kc = cedar::kernels;
namespace cu = cedar::kernels::cuda;
using cedar::test::dev_array;

namespace {

// A quantised weight tensor in host memory + the fp32 values it decodes to (the oracle's W).
struct host_weight {
  kc::weight_format fmt;
  int64_t rows, cols;
  int block_rows = 1;
  std::vector<uint8_t> data;    // stored bytes
  std::vector<uint8_t> scales;  // UE8M0, [ceil(rows/block_rows), ceil(cols/32)]
  std::vector<float> value;     // decoded [rows, cols]
};

uint8_t pow2_scale(float amax, float top) {
  // 2^ceil(log2(amax / top)), the weight encoders' rule (qmatmul.hpp), clamped to UE8M0's range
  const float s = std::exp2(std::ceil(std::log2(std::max(amax, 1e-30f) / top)));
  return kc::ue8m0_encode_pow2(std::min(std::max(s, std::ldexp(1.0f, -127)), std::ldexp(1.0f, 127)));
}

host_weight make_weight(std::mt19937& g, kc::weight_format fmt, int64_t rows, int64_t cols, int block_rows) {
  std::normal_distribution<float> nd(0.0f, 0.05f);
  std::vector<float> w((size_t)(rows * cols));
  for (auto& v : w) v = nd(g);
  host_weight h{fmt, rows, cols, block_rows, {}, {}, std::vector<float>(w.size())};
  const int64_t sc = (cols + 31) / 32, sr = (rows + block_rows - 1) / block_rows;
  switch (fmt) {
    case kc::weight_format::f32:
      h.data.resize(w.size() * 4);
      std::memcpy(h.data.data(), w.data(), h.data.size());
      h.value = w;
      break;
    case kc::weight_format::bf16: {
      h.data.resize(w.size() * 2);
      auto* d = reinterpret_cast<uint16_t*>(h.data.data());
      for (size_t i = 0; i < w.size(); ++i) h.value[i] = kc::bf16_to_f32(d[i] = kc::f32_to_bf16(w[i]));
      break;
    }
    case kc::weight_format::f8_e4m3:
    case kc::weight_format::fp4_e2m1: {
      const bool fp4 = fmt == kc::weight_format::fp4_e2m1;
      h.scales.assign((size_t)(sr * sc), 0);
      for (int64_t br = 0; br < sr; ++br)
        for (int64_t bc = 0; bc < sc; ++bc) {
          float amax = 0;
          for (int64_t r = br * block_rows; r < std::min(rows, (br + 1) * block_rows); ++r)
            for (int64_t c = bc * 32; c < std::min(cols, (bc + 1) * 32); ++c)
              amax = std::max(amax, std::fabs(w[(size_t)(r * cols + c)]));
          h.scales[(size_t)(br * sc + bc)] = pow2_scale(amax, fp4 ? 6.0f : 448.0f);
        }
      h.data.assign(fp4 ? w.size() / 2 : w.size(), 0);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          const size_t i = (size_t)(r * cols + c);
          const float s = kc::ue8m0_decode(h.scales[(size_t)((r / block_rows) * sc + c / 32)]);
          if (fp4) {
            const uint8_t code = kc::e2m1_encode(w[i] / s);
            h.data[i / 2] |= (uint8_t)(i % 2 ? code << 4 : code);
            h.value[i] = kc::e2m1_decode(code) * s;
          } else {
            h.data[i] = kc::e4m3_encode(w[i] / s);
            h.value[i] = kc::e4m3_decode(h.data[i]) * s;
          }
        }
      break;
    }
  }
  return h;
}

// A device copy of h (data and scales kept alive in `keep`) and its view.
kc::qmatrix dev_view(const host_weight& h, std::vector<std::unique_ptr<dev_array<uint8_t>>>& keep) {
  keep.push_back(std::make_unique<dev_array<uint8_t>>(h.data));
  kc::qmatrix q;
  q.format = h.fmt, q.rows = h.rows, q.cols = h.cols, q.data = keep.back()->p;
  if (!h.scales.empty()) {
    keep.push_back(std::make_unique<dev_array<uint8_t>>(h.scales));
    q.scale_e8m0 = keep.back()->p;
  }
  q.scale_block_rows = h.block_rows, q.scale_cols = (h.cols + 31) / 32;
  return q;
}

struct qgemv_case {
  kc::weight_format fmt;
  int64_t rows, cols;
  int block_rows;
  int64_t view_row0, view_rows;  // the view multiplied (a slice of the tensor)
  int m;
  bool accumulate;
};

std::string case_name(const ::testing::TestParamInfo<qgemv_case>& i) {
  const auto& c = i.param;
  const char* f = c.fmt == kc::weight_format::f32 ? "f32" : c.fmt == kc::weight_format::bf16 ? "bf16"
                  : c.fmt == kc::weight_format::f8_e4m3 ? "f8" : "fp4";
  return std::string(f) + "_" + std::to_string(c.rows) + "x" + std::to_string(c.cols) + "_b" +
         std::to_string(c.block_rows) + "_v" + std::to_string(c.view_row0) + "_m" + std::to_string(c.m) +
         (c.accumulate ? "_acc" : "");
}

class cuda_qgemv : public ::testing::TestWithParam<qgemv_case> {};

TEST_P(cuda_qgemv, matches_the_dequantised_oracle) {
  CEDAR_REQUIRE_GPU();
  const qgemv_case c = GetParam();
  std::mt19937 g((unsigned)(c.rows * 31 + c.cols * 7 + c.m + (int)c.fmt * 1000 + c.view_row0));
  const host_weight hw = make_weight(g, c.fmt, c.rows, c.cols, c.block_rows);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int ldx = (int)((c.cols + 3) / 4 * 4) + 4, ldy = (int)c.view_rows + 3;
  std::vector<float> x((size_t)c.m * ldx), y0((size_t)c.m * ldy);
  for (auto& v : x) v = nd(g);
  for (auto& v : y0) v = nd(g);

  dev_array<uint8_t> d_data(hw.data), d_scales(hw.scales.empty() ? std::vector<uint8_t>(1) : hw.scales);
  dev_array<float> d_x(x), d_y(c.accumulate ? y0 : std::vector<float>(y0.size(), std::nanf("")));
  cu::qgemv_params p;
  p.w.format = c.fmt;
  p.w.rows = c.view_rows;
  p.w.cols = c.cols;
  p.w.data = d_data.p;
  p.w.row0 = c.view_row0;
  p.w.scale_e8m0 = hw.scales.empty() ? nullptr : d_scales.p;
  p.w.scale_block_rows = c.block_rows;
  p.w.scale_cols = (c.cols + 31) / 32;
  p.m = c.m;
  p.x = d_x.p;
  p.ldx = ldx;
  p.y = d_y.p;
  p.ldy = ldy;
  p.accumulate = c.accumulate;
  const auto st = cu::qgemv(p, nullptr);
  ASSERT_TRUE(st.ok()) << st.err().message;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto y = d_y.download();

  double worst = 0;
  for (int i = 0; i < c.m; ++i)
    for (int64_t r = 0; r < c.view_rows; ++r) {
      double s = 0, mag = 0;
      for (int64_t k = 0; k < c.cols; ++k) {
        const double t = (double)hw.value[(size_t)((c.view_row0 + r) * c.cols + k)] * x[(size_t)i * ldx + k];
        s += t;
        mag += std::fabs(t);
      }
      if (c.accumulate) s += y0[(size_t)i * ldy + r], mag += std::fabs(y0[(size_t)i * ldy + r]);
      const double got = y[(size_t)i * ldy + r];
      ASSERT_TRUE(std::isfinite(got)) << "row " << r << " of x row " << i << " not written";
      const double err = std::fabs(got - s) / (mag + 1e-30);
      worst = std::max(worst, err);
      ASSERT_LE(err, 2e-6) << "x row " << i << ", output " << r << ": got " << got << ", want " << s;
    }
  // outputs past the view's rows (ldy padding) are never written
  for (int i = 0; i < c.m; ++i)
    for (int64_t r = c.view_rows; r < ldy; ++r) {
      const float got = y[(size_t)i * ldy + r];
      if (c.accumulate) EXPECT_EQ(got, y0[(size_t)i * ldy + r]);
      else EXPECT_TRUE(std::isnan(got));
    }
  std::printf("%s: worst error / sum|w x| %.2e\n", case_name({c, 0}).c_str(), worst);
}

using F = kc::weight_format;
INSTANTIATE_TEST_SUITE_P(
    grid, cuda_qgemv,
    ::testing::Values(
        qgemv_case{F::f32, 37, 264, 1, 0, 37, 1, false}, qgemv_case{F::f32, 512, 1024, 1, 0, 512, 8, false},
        qgemv_case{F::bf16, 1, 8, 1, 0, 1, 1, false}, qgemv_case{F::bf16, 37, 264, 1, 0, 37, 3, false},
        qgemv_case{F::bf16, 1027, 2048, 1, 0, 1027, 1, false}, qgemv_case{F::bf16, 300, 520, 1, 11, 200, 13, true},
        qgemv_case{F::bf16, 256, 768, 1, 0, 256, 64, false},
        qgemv_case{F::f8_e4m3, 64, 256, 32, 0, 64, 1, false}, qgemv_case{F::f8_e4m3, 100, 520, 32, 37, 50, 5, false},
        qgemv_case{F::f8_e4m3, 1030, 2048, 32, 0, 1030, 8, true}, qgemv_case{F::f8_e4m3, 96, 96, 1, 0, 96, 64, false},
        qgemv_case{F::fp4_e2m1, 64, 256, 1, 0, 64, 1, false}, qgemv_case{F::fp4_e2m1, 333, 544, 1, 5, 300, 2, false},
        qgemv_case{F::fp4_e2m1, 1024, 2048, 1, 0, 1024, 9, true}, qgemv_case{F::fp4_e2m1, 40, 64, 1, 0, 40, 64, false}),
    case_name);

TEST(cuda_qgemv_errors, bad_shapes_are_named) {
  CEDAR_REQUIRE_GPU();
  std::vector<float> host(64, 1.0f);
  dev_array<float> d(host);
  cu::qgemv_params p;
  p.w.format = kc::weight_format::bf16;
  p.w.rows = 2;
  p.w.cols = 12;  // not a multiple of 8
  p.w.data = d.p;
  p.m = 1;
  p.x = d.p;
  p.ldx = 12;
  p.y = d.p;
  p.ldy = 2;
  auto st = cu::qgemv(p, nullptr);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.err().message.find("multiple of 8"), std::string::npos) << st.err().message;
  p.w.cols = 8;
  p.w.format = kc::weight_format::f8_e4m3;
  st = cu::qgemv(p, nullptr);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.err().message.find("without scales"), std::string::npos) << st.err().message;
  p.m = 0;
  st = cu::qgemv(p, nullptr);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.err().message.find("m must be positive"), std::string::npos);
}

TEST(cuda_rms_norm, matches_the_cpu_definition) {
  CEDAR_REQUIRE_GPU();
  std::mt19937 g(7);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (int n : {8, 256, 1000, 7168}) {
    const int m = 5;
    std::vector<float> x((size_t)m * n), w((size_t)n);
    for (auto& v : x) v = nd(g);
    for (auto& v : w) v = nd(g);
    dev_array<float> dx(x), dw(w), dy(std::vector<float>(x.size(), std::nanf("")));
    ASSERT_TRUE(cu::rms_norm(dx.p, dw.p, dy.p, m, n, 1e-6f, nullptr).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto y = dy.download();
    for (int i = 0; i < m; ++i) {
      double ss = 0;
      for (int k = 0; k < n; ++k) ss += (double)x[(size_t)i * n + k] * x[(size_t)i * n + k];
      const double inv = 1.0 / std::sqrt(ss / n + 1e-6);
      for (int k = 0; k < n; ++k) {
        const double want = x[(size_t)i * n + k] * inv * w[(size_t)k];
        ASSERT_NEAR(y[(size_t)i * n + k], want, 1e-5 * (std::fabs(want) + 1e-3)) << "n " << n << " row " << i << " col " << k;
      }
    }
  }
}

// qgemv_grouped: 21 independent projections of mixed formats (bf16, fp8 with 16- and 8-wide
// loads, fp4, f32) and one m in a few launches (chunks of 16 per class); each output against
// the oracle, outputs of other items untouched.
TEST(cuda_qgemv_grouped, mixed_formats_match_the_oracle) {
  CEDAR_REQUIRE_GPU();
  for (int m : {1, 5}) {
    std::mt19937 g(4242u + (unsigned)m);
    struct spec {
      kc::weight_format f;
      int64_t rows, cols;
      int br;
    };
    std::vector<spec> specs = {{F::bf16, 300, 512, 1}, {F::f8_e4m3, 200, 1024, 32}, {F::f8_e4m3, 64, 520, 32},
                               {F::fp4_e2m1, 128, 2048, 1}, {F::f32, 40, 264, 1}};
    for (int i = 0; i < 16; ++i) specs.push_back({F::bf16, 8 + 8 * i, 256, 1});  // 17 bf16: two chunks
    std::vector<host_weight> hw;
    std::vector<std::unique_ptr<dev_array<uint8_t>>> dd, ds;
    std::vector<std::unique_ptr<dev_array<float>>> dx, dy;
    std::vector<std::vector<float>> xs;
    std::vector<cu::qgemv_params> items;
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (const auto& sp : specs) {
      hw.push_back(make_weight(g, sp.f, sp.rows, sp.cols, sp.br));
      dd.push_back(std::make_unique<dev_array<uint8_t>>(hw.back().data));
      ds.push_back(std::make_unique<dev_array<uint8_t>>(hw.back().scales.empty() ? std::vector<uint8_t>(1) : hw.back().scales));
      std::vector<float> x((size_t)m * sp.cols);
      for (auto& v : x) v = nd(g);
      xs.push_back(x);
      dx.push_back(std::make_unique<dev_array<float>>(x));
      dy.push_back(std::make_unique<dev_array<float>>(std::vector<float>((size_t)m * sp.rows, std::nanf(""))));
      cu::qgemv_params p;
      p.w.format = sp.f;
      p.w.rows = sp.rows;
      p.w.cols = sp.cols;
      p.w.data = dd.back()->p;
      p.w.scale_e8m0 = hw.back().scales.empty() ? nullptr : ds.back()->p;
      p.w.scale_block_rows = sp.br;
      p.w.scale_cols = (sp.cols + 31) / 32;
      p.m = m;
      p.x = dx.back()->p;
      p.ldx = (int)sp.cols;
      p.y = dy.back()->p;
      p.ldy = (int)sp.rows;
      items.push_back(p);
    }
    const auto st = cu::qgemv_grouped(items.data(), (int)items.size(), nullptr);
    ASSERT_TRUE(st.ok()) << st.err().message;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    for (size_t it = 0; it < specs.size(); ++it) {
      const auto y = dy[it]->download();
      for (int i = 0; i < m; ++i)
        for (int64_t r = 0; r < specs[it].rows; ++r) {
          double sum = 0, mag = 0;
          for (int64_t k = 0; k < specs[it].cols; ++k) {
            const double t = (double)hw[it].value[(size_t)(r * specs[it].cols + k)] * xs[it][(size_t)(i * specs[it].cols + k)];
            sum += t;
            mag += std::fabs(t);
          }
          const double got = y[(size_t)(i * specs[it].rows + r)];
          ASSERT_TRUE(std::isfinite(got)) << "item " << it << " row " << r << " not written";
          ASSERT_LE(std::fabs(got - sum), 2e-6 * (mag + 1e-30)) << "item " << it << " m " << m << " row " << r;
        }
    }
  }
  // a mismatched m is named
  cu::qgemv_params a, b;
  std::vector<float> host(64, 1.0f);
  dev_array<float> d(host);
  a.w.format = b.w.format = kc::weight_format::bf16;
  a.w.rows = b.w.rows = 2;
  a.w.cols = b.w.cols = 8;
  a.w.data = b.w.data = d.p;
  a.x = b.x = d.p;
  a.y = b.y = d.p;
  a.ldx = b.ldx = 8;
  a.ldy = b.ldy = 2;
  a.m = 1;
  b.m = 2;
  const cu::qgemv_params ab[2] = {a, b};
  const auto st = cu::qgemv_grouped(ab, 2, nullptr);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.err().message.find("item 1 has m 2"), std::string::npos) << st.err().message;
}

}  // namespace

// qgemv_expert: each item's expert picked on the device from arrays of views, two matrices
// stacked in the output (w1 | w3) or one (w2), x rows shared by K items; every output against
// the oracle of the expert the item names; padding past the rows never written.
TEST(cuda_qgemv_expert, items_use_the_expert_they_name) {
  CEDAR_REQUIRE_GPU();
  struct spec {
    kc::weight_format f;
    int64_t rows, cols;
    int br, E, R, K;
    bool two;
  };
  for (const spec& sp : {spec{F::bf16, 96, 512, 1, 5, 3, 2, true}, spec{F::f8_e4m3, 64, 1024, 32, 4, 2, 2, true},
                         spec{F::fp4_e2m1, 128, 2048, 1, 6, 5, 3, false}, spec{F::f32, 40, 264, 1, 3, 4, 1, true},
                         spec{F::bf16, 2048, 768, 1, 3, 1, 2, false}}) {
    std::mt19937 g(99u + (unsigned)sp.rows + (unsigned)sp.f);
    std::vector<host_weight> wa, wb;
    std::vector<std::unique_ptr<dev_array<uint8_t>>> keep;
    std::vector<kc::qmatrix> va, vb;
    auto view = [&](const host_weight& h) { return dev_view(h, keep); };
    for (int e = 0; e < sp.E; ++e) {
      wa.push_back(make_weight(g, sp.f, sp.rows, sp.cols, sp.br));
      va.push_back(view(wa.back()));
      if (sp.two) {
        wb.push_back(make_weight(g, sp.f, sp.rows, sp.cols, sp.br));
        vb.push_back(view(wb.back()));
      }
    }
    const int n = sp.R * sp.K, out = (int)sp.rows * (sp.two ? 2 : 1), ldy = out + 5;
    std::vector<int32_t> sel((size_t)n);
    for (int i = 0; i < n; ++i) sel[(size_t)i] = (int32_t)(g() % (uint32_t)sp.E);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x((size_t)sp.R * sp.cols);
    for (auto& v : x) v = nd(g);
    dev_array<uint8_t> da(std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(va.data()),
                                               reinterpret_cast<const uint8_t*>(va.data() + va.size())));
    dev_array<uint8_t> db(sp.two ? std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(vb.data()),
                                                        reinterpret_cast<const uint8_t*>(vb.data() + vb.size()))
                                 : std::vector<uint8_t>(1));
    dev_array<int32_t> dsel(sel);
    dev_array<float> dx(x), dy(std::vector<float>((size_t)n * ldy, std::nanf("")));
    cu::qgemv_expert_params p;
    p.wa = reinterpret_cast<const kc::qmatrix*>(da.p);
    p.wb = sp.two ? reinterpret_cast<const kc::qmatrix*>(db.p) : nullptr;
    p.like_a = va[0];
    if (sp.two) p.like_b = vb[0];
    p.sel = dsel.p, p.n = n, p.x_div = sp.K, p.x = dx.p, p.ldx = (int)sp.cols, p.y = dy.p, p.ldy = ldy;
    const auto st = cu::qgemv_expert(p, nullptr);
    ASSERT_TRUE(st.ok()) << st.err().message;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto y = dy.download();
    for (int i = 0; i < n; ++i) {
      const int e = sel[(size_t)i];
      const float* xr = x.data() + (size_t)(i / sp.K) * sp.cols;
      for (int o = 0; o < out; ++o) {
        const host_weight& h = o < sp.rows ? wa[(size_t)e] : wb[(size_t)e];
        const int64_t r = o < sp.rows ? o : o - sp.rows;
        double s = 0, mag = 0;
        for (int64_t k = 0; k < sp.cols; ++k) {
          const double t = (double)h.value[(size_t)(r * sp.cols + k)] * xr[k];
          s += t, mag += std::fabs(t);
        }
        const double got = y[(size_t)i * ldy + o];
        ASSERT_TRUE(std::isfinite(got)) << "item " << i << " output " << o << " not written";
        ASSERT_LE(std::fabs(got - s) / (mag + 1e-30), 2e-6) << "item " << i << " (expert " << e << ") output " << o;
      }
      for (int o = out; o < ldy; ++o) EXPECT_TRUE(std::isnan(y[(size_t)i * ldy + o])) << "padding written";
    }
    // the items routed by the launch itself (moe_up's route, the decoder's default): moe_route's
    // ids and weights, and the rows of the launch given those ids, bit for bit
    {
      std::vector<float> lg((size_t)sp.R * sp.E), bias((size_t)sp.E);
      for (auto& v : lg) v = 1.5f * nd(g);
      for (auto& v : bias) v = 0.1f * nd(g);
      dev_array<float> dl(lg), dbias(bias), dw_ref((size_t)n), dw((size_t)n);
      dev_array<int32_t> dsel_ref((size_t)n), dsel_self((size_t)n);
      dw.poison(), dsel_self.poison();
      cu::moe_route_params rp;
      rp.R = sp.R, rp.E = sp.E, rp.K = sp.K, rp.logits = dl.p, rp.bias = dbias.p, rp.route_scale = 2.5f;
      rp.sel = dsel_ref.p, rp.weight = dw_ref.p;
      ASSERT_TRUE(cu::moe_route(rp, nullptr).ok());
      dev_array<float> dy_ref(std::vector<float>((size_t)n * ldy, std::nanf(""))), dy_self(dy_ref.download());
      cu::qgemv_expert_params pr = p;
      pr.sel = dsel_ref.p, pr.y = dy_ref.p;
      ASSERT_TRUE(cu::qgemv_expert(pr, nullptr).ok());
      cu::qgemv_expert_params ps = p;
      ps.route = true, ps.rp = rp, ps.rp.sel = dsel_self.p, ps.rp.weight = dw.p, ps.sel = dsel_self.p, ps.y = dy_self.p;
      const auto st2 = cu::qgemv_expert(ps, nullptr);
      ASSERT_TRUE(st2.ok()) << st2.err().message;
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_EQ(dsel_self.download(), dsel_ref.download()) << "routed ids";
      const auto wr = dw_ref.download(), ws = dw.download(), yr = dy_ref.download(), ys = dy_self.download();
      ASSERT_EQ(std::memcmp(ws.data(), wr.data(), sizeof(float) * wr.size()), 0) << "route weights";
      ASSERT_EQ(std::memcmp(ys.data(), yr.data(), sizeof(float) * yr.size()), 0) << "rows of the self-routed launch";
    }
  }
  // a mismatched second matrix is an error that names it
  cu::qgemv_expert_params p;
  std::vector<float> host(64, 1.0f);
  dev_array<float> d(host);
  p.wa = reinterpret_cast<const kc::qmatrix*>(d.p), p.wb = p.wa, p.sel = reinterpret_cast<const int32_t*>(d.p);
  p.like_a.format = F::bf16, p.like_a.rows = 2, p.like_a.cols = 8, p.like_a.data = d.p;
  p.like_b = p.like_a, p.like_b.format = F::f32;
  p.n = 1, p.x = d.p, p.ldx = 8, p.y = d.p, p.ldy = 4;
  const auto st = cu::qgemv_expert(p, nullptr);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.err().message.find("differs from the first"), std::string::npos) << st.err().message;
}

// x_norm_w: each activation row RMS-normalised (with weights) on the fly, in qgemv and in a
// group (one item normalised, one not), against the double oracle W · (x · inv · g).
TEST(cuda_qgemv_norm, rows_normalised_on_the_fly_match_the_oracle) {
  CEDAR_REQUIRE_GPU();
  for (int m : {1, 3, 9}) {
    for (F f : {F::bf16, F::f8_e4m3, F::f32}) {
      std::mt19937 g(600u + (unsigned)m + (unsigned)f);
      const int64_t rows = 40, cols = 512;
      const host_weight hw = make_weight(g, f, rows, cols, f == F::f8_e4m3 ? 32 : 1);
      std::normal_distribution<float> nd(0.0f, 3.0f);
      std::vector<float> x((size_t)m * cols), w((size_t)cols);
      for (auto& v : x) v = nd(g);
      for (auto& v : w) v = nd(g);
      dev_array<uint8_t> dd(hw.data), ds(hw.scales.empty() ? std::vector<uint8_t>(1) : hw.scales);
      dev_array<float> dx(x), dw(w), dy((size_t)m * rows), dy2((size_t)m * rows);
      dy.poison(), dy2.poison();
      cu::qgemv_params p;
      p.w.format = f, p.w.rows = rows, p.w.cols = cols, p.w.data = dd.p;
      p.w.scale_e8m0 = hw.scales.empty() ? nullptr : ds.p, p.w.scale_block_rows = f == F::f8_e4m3 ? 32 : 1;
      p.w.scale_cols = (cols + 31) / 32;
      p.m = m, p.x = dx.p, p.ldx = (int)cols, p.y = dy.p, p.ldy = (int)rows, p.x_norm_w = dw.p, p.x_norm_eps = 1e-6f;
      ASSERT_TRUE(cu::qgemv(p, nullptr).ok());
      cu::qgemv_params items[2] = {p, p};
      items[0].y = dy2.p;
      items[1].x_norm_w = nullptr;  // an unnormalised item in the same launch writes dy (overwritten below)
      items[1].y = dy.p;
      cu::qgemv_params solo = p;  // dy again, normalised, after the group
      ASSERT_TRUE(cu::qgemv_grouped(items, 2, nullptr).ok());
      ASSERT_TRUE(cu::qgemv(solo, nullptr).ok());
      // the rows' factors given (x_norm_inv) instead of summed by every block
      std::vector<float> inv_rows((size_t)m);
      for (int i = 0; i < m; ++i) {
        double ss = 0;
        for (int64_t k = 0; k < cols; ++k) ss += (double)x[(size_t)i * cols + k] * x[(size_t)i * cols + k];
        inv_rows[(size_t)i] = (float)(1 / std::sqrt(ss / (double)cols + 1e-6));
      }
      dev_array<float> dinv(inv_rows), dy3((size_t)m * rows);
      dy3.poison();
      cu::qgemv_params given = p;
      given.y = dy3.p, given.x_norm_inv = dinv.p;
      ASSERT_TRUE(cu::qgemv(given, nullptr).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto y = dy.download(), y2 = dy2.download(), y3 = dy3.download();
      for (int i = 0; i < m; ++i) {
        double ss = 0;
        for (int64_t k = 0; k < cols; ++k) ss += (double)x[(size_t)i * cols + k] * x[(size_t)i * cols + k];
        const double inv = 1 / std::sqrt(ss / (double)cols + 1e-6);
        for (int64_t r = 0; r < rows; ++r) {
          double s = 0, mag = 0;
          for (int64_t k = 0; k < cols; ++k) {
            const double t = (double)hw.value[(size_t)(r * cols + k)] * x[(size_t)i * cols + k] * inv * w[(size_t)k];
            s += t, mag += std::fabs(t);
          }
          ASSERT_LE(std::fabs(y[(size_t)i * rows + r] - s) / (mag + 1e-30), 1e-5) << "m " << m << " row " << r;
          ASSERT_LE(std::fabs(y2[(size_t)i * rows + r] - s) / (mag + 1e-30), 1e-5) << "grouped, m " << m << " row " << r;
          ASSERT_LE(std::fabs(y3[(size_t)i * rows + r] - s) / (mag + 1e-30), 1e-5) << "given factors, m " << m << " row " << r;
        }
      }
    }
  }
}

// ---- tensor-core path (qgemv_mma.cuh: bf16, m > 8) ----------------------------------------------
// The same double oracle over a grid of shapes (rows not a multiple of 16, cols a multiple of 8
// but not 16), m from 9 to 130 (m > 64 tiles x), accumulate on / off, RMSNorm of x on the fly
// (factors summed by the kernel or given), y poisoned with NaN unless accumulating. Tolerance
// relative to Σ|w·x| of each output: the split x = hi + lo leaves |x − hi − lo| ≤ 2^-16 |x| per
// product (bf16's roundoff 2^-8, twice) in the worst case, ~2^-20 on average with mixed signs;
// seen on an H200: ≤ 1.5e-6 at 64..72 columns, ≤ 7e-7 at 512 (≤ 2.6e-6 with the norm). 5e-6,
// and 1e-5 with the norm (as the vector path's norm test).
namespace {

// Sets the tensor-core switch for a scope and restores it after (tests that compare paths).
struct mma_switch {
  bool was;
  explicit mma_switch(bool on) : was(cu::qgemv_mma_enabled()) { cu::set_qgemv_mma(on); }
  ~mma_switch() { cu::set_qgemv_mma(was); }
};

enum class x_norm { none, summed, given };

// One output of the oracle: Σ_k W[r, k] · x'[i, k] in double and Σ_k |W[r, k] · x'[i, k]|, x'
// the row normalised (x · inv · g, inv from the double sum of squares) when g is given.
struct oracle_out {
  double sum, mag;
};

std::vector<oracle_out> oracle(const host_weight& hw, int64_t row0, int64_t rows, const std::vector<float>& x, int ldx,
                               int m, const std::vector<float>* g, float eps) {
  std::vector<oracle_out> out((size_t)m * rows);
  std::vector<double> xr((size_t)hw.cols);
  for (int i = 0; i < m; ++i) {
    double ss = 0;
    for (int64_t k = 0; k < hw.cols; ++k) ss += (double)x[(size_t)i * ldx + k] * x[(size_t)i * ldx + k];
    const double inv = 1 / std::sqrt(ss / (double)hw.cols + eps);
    for (int64_t k = 0; k < hw.cols; ++k) xr[(size_t)k] = g ? x[(size_t)i * ldx + k] * inv * (*g)[(size_t)k] : x[(size_t)i * ldx + k];
    for (int64_t r = 0; r < rows; ++r) {
      const float* wr = hw.value.data() + (size_t)((row0 + r) * hw.cols);
      double s = 0, mag = 0;
      for (int64_t k = 0; k < hw.cols; ++k) {
        const double t = (double)wr[k] * xr[(size_t)k];
        s += t, mag += std::fabs(t);
      }
      out[(size_t)i * rows + r] = {s, mag};
    }
  }
  return out;
}

// y[m, ldy] against the oracle (+ y0 when accumulating) within tol · Σ|…|; the ldy padding
// past rows untouched (NaN, or y0 when accumulating). *worst: the largest error / Σ|…|.
::testing::AssertionResult outputs_match(const std::vector<oracle_out>& want, const std::vector<float>& y,
                                         const std::vector<float>& y0, bool accumulate, int m, int64_t rows, int ldy,
                                         double tol, double* worst) {
  *worst = 0;
  for (int i = 0; i < m; ++i) {
    for (int64_t r = 0; r < rows; ++r) {
      const size_t o = (size_t)i * ldy + r;
      double s = want[(size_t)i * rows + r].sum, mag = want[(size_t)i * rows + r].mag;
      if (accumulate) s += y0[o], mag += std::fabs(y0[o]);
      const double got = y[o];
      if (!std::isfinite(got)) return ::testing::AssertionFailure() << "x row " << i << ", output " << r << " not written";
      const double err = std::fabs(got - s) / (mag + 1e-30);
      *worst = std::max(*worst, err);
      if (err > tol)
        return ::testing::AssertionFailure() << "x row " << i << ", output " << r << ": got " << got << ", want " << s
                                             << " (error / sum|w x| " << err << " > " << tol << ")";
    }
    for (int64_t r = rows; r < ldy; ++r) {
      const float got = y[(size_t)i * ldy + r];
      if (accumulate ? got != y0[(size_t)i * ldy + r] : !std::isnan(got))
        return ::testing::AssertionFailure() << "x row " << i << ": padding " << r << " written";
    }
  }
  return ::testing::AssertionSuccess();
}

struct mma_case {
  int64_t rows, cols;
  int m;
  bool accumulate;
  x_norm norm;
};

std::string mma_case_name(const ::testing::TestParamInfo<mma_case>& i) {
  const auto& c = i.param;
  return std::to_string(c.rows) + "x" + std::to_string(c.cols) + "_m" + std::to_string(c.m) +
         (c.accumulate ? "_acc" : "") + (c.norm == x_norm::summed ? "_norm" : c.norm == x_norm::given ? "_norminv" : "");
}

std::vector<mma_case> mma_grid() {
  std::vector<mma_case> v;
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{16, 64}, {40, 72}, {256, 512}};
  for (const auto& s : shapes)
    for (int m : {9, 16, 33, 64})
      for (bool acc : {false, true})
        for (x_norm n : {x_norm::none, x_norm::summed, x_norm::given}) v.push_back({s.first, s.second, m, acc, n});
  // a large matrix (64-row blocks: fewer than one 128-row block per multiprocessor), and m > 64
  v.push_back({2048, 2048, 9, false, x_norm::summed});
  v.push_back({2048, 2048, 33, true, x_norm::none});
  v.push_back({2048, 2048, 64, false, x_norm::given});
  v.push_back({2048, 2048, 64, true, x_norm::summed});
  v.push_back({256, 512, 80, true, x_norm::summed});
  v.push_back({40, 72, 130, false, x_norm::none});
  // rows < 16 (8 × 200: two chunks of 128 columns, the last 72), many chunks with a ragged last
  // one (1032: 9 chunks, the last 8 columns), and 128-row blocks (MW 2: at least one per
  // multiprocessor on an H200 — 133 blocks, the last with 4 rows; the matrices above all get
  // 64-row blocks, while rand1b's LM head at batch 64 takes 128-row ones)
  v.push_back({8, 200, 33, false, x_norm::none});
  v.push_back({8, 200, 64, true, x_norm::summed});
  v.push_back({72, 1032, 16, false, x_norm::given});
  v.push_back({72, 1032, 64, true, x_norm::none});
  v.push_back({16900, 136, 40, false, x_norm::none});
  v.push_back({16900, 136, 64, true, x_norm::summed});
  return v;
}

class cuda_qgemv_mma : public ::testing::TestWithParam<mma_case> {};

TEST_P(cuda_qgemv_mma, matches_the_dequantised_oracle) {
  CEDAR_REQUIRE_GPU();
  const mma_case c = GetParam();
  const mma_switch on(true);
  std::mt19937 g((unsigned)(c.rows * 131 + c.cols * 17 + c.m * 3 + (c.accumulate ? 1 : 0) + (int)c.norm * 7));
  const host_weight hw = make_weight(g, F::bf16, c.rows, c.cols, 1);
  const int ldx = (int)c.cols + 8, ldy = (int)c.rows + 5;
  const auto x = cedar::test::randn(g, (size_t)c.m * ldx, 1.5f);
  const auto y0 = cedar::test::randn(g, (size_t)c.m * ldy, 1.0f);
  const auto gw = cedar::test::randn(g, (size_t)c.cols, 1.0f);
  const float eps = 1e-6f;
  std::vector<float> inv((size_t)c.m);
  for (int i = 0; i < c.m; ++i) {
    double ss = 0;
    for (int64_t k = 0; k < c.cols; ++k) ss += (double)x[(size_t)i * ldx + k] * x[(size_t)i * ldx + k];
    inv[(size_t)i] = (float)(1 / std::sqrt(ss / (double)c.cols + eps));
  }
  dev_array<uint8_t> d_w(hw.data);
  dev_array<float> d_x(x), d_g(gw), d_inv(inv), d_y((size_t)c.m * ldy);
  if (c.accumulate) d_y.upload(y0);
  else d_y.poison();
  cu::qgemv_params p;
  p.w.format = F::bf16, p.w.rows = c.rows, p.w.cols = c.cols, p.w.data = d_w.p;
  p.m = c.m, p.x = d_x.p, p.ldx = ldx, p.y = d_y.p, p.ldy = ldy, p.accumulate = c.accumulate;
  if (c.norm != x_norm::none) p.x_norm_w = d_g.p, p.x_norm_eps = eps;
  if (c.norm == x_norm::given) p.x_norm_inv = d_inv.p;
  const auto st = cu::qgemv(p, nullptr);
  ASSERT_TRUE(st.ok()) << st.err().message;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto want = oracle(hw, 0, c.rows, x, ldx, c.m, c.norm == x_norm::none ? nullptr : &gw, eps);
  double worst = 0;
  EXPECT_TRUE(outputs_match(want, d_y.download(), y0, c.accumulate, c.m, c.rows, ldy,
                            c.norm == x_norm::none ? 5e-6 : 1e-5, &worst));
  std::printf("%s: worst error / sum|w x| %.2e\n", mma_case_name({c, 0}).c_str(), worst);
}

INSTANTIATE_TEST_SUITE_P(grid, cuda_qgemv_mma, ::testing::ValuesIn(mma_grid()), mma_case_name);

// The tensor-core path against the vector path (forced by the switch) on the same launch: a
// row-offset view, rows and cols ragged, RMSNorm on the fly, accumulating; both within the
// oracle's tolerance, so within 5e-6 · Σ|w·x| of each other (they differ in summation order and
// the hi + lo split, never in what they compute).
TEST(cuda_qgemv_mma_switch, tensor_core_and_vector_paths_agree) {
  CEDAR_REQUIRE_GPU();
  const int64_t rows = 300, cols = 520, row0 = 11, view_rows = 250;
  const int m = 37, ldx = (int)cols, ldy = (int)view_rows;
  std::mt19937 g(31337);
  const host_weight hw = make_weight(g, F::bf16, rows, cols, 1);
  const auto x = cedar::test::randn(g, (size_t)m * ldx, 2.0f);
  const auto y0 = cedar::test::randn(g, (size_t)m * ldy, 1.0f);
  const auto gw = cedar::test::randn(g, (size_t)cols, 1.0f);
  dev_array<uint8_t> d_w(hw.data);
  dev_array<float> d_x(x), d_g(gw), d_y(y0);
  cu::qgemv_params p;
  p.w.format = F::bf16, p.w.rows = view_rows, p.w.cols = cols, p.w.data = d_w.p, p.w.row0 = row0;
  p.m = m, p.x = d_x.p, p.ldx = ldx, p.y = d_y.p, p.ldy = ldy, p.accumulate = true;
  p.x_norm_w = d_g.p, p.x_norm_eps = 1e-6f;
  std::vector<float> y[2];
  for (int mma = 0; mma < 2; ++mma) {
    const mma_switch sw(mma == 1);
    EXPECT_EQ(cu::qgemv_mma_enabled(), mma == 1);
    d_y.upload(y0);
    const auto st = cu::qgemv(p, nullptr);
    ASSERT_TRUE(st.ok()) << st.err().message;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    y[mma] = d_y.download();
  }
  const auto want = oracle(hw, row0, view_rows, x, ldx, m, &gw, 1e-6f);
  double worst = 0, worst_vec = 0, worst_mma = 0;
  for (int i = 0; i < m; ++i)
    for (int64_t r = 0; r < view_rows; ++r) {
      const size_t o = (size_t)i * ldy + r;
      const double mag = want[(size_t)i * view_rows + r].mag + std::fabs(y0[o]);
      const double err = std::fabs((double)y[1][o] - y[0][o]) / (mag + 1e-30);
      worst = std::max(worst, err);
      ASSERT_LE(err, 5e-6) << "x row " << i << ", output " << r << ": tensor cores " << y[1][o] << ", vector path "
                           << y[0][o];
    }
  EXPECT_TRUE(outputs_match(want, y[0], y0, true, m, view_rows, ldy, 1e-5, &worst_vec)) << "vector path";
  EXPECT_TRUE(outputs_match(want, y[1], y0, true, m, view_rows, ldy, 1e-5, &worst_mma)) << "tensor cores";
  std::printf("tensor cores vs vector path: worst difference / sum|w x| %.2e (oracle: %.2e, %.2e)\n", worst,
              worst_mma, worst_vec);
}

// qgemv_grouped with m > 8: the bf16 items (19: two launches of at most 16, one accumulating,
// one row-offset view) on tensor cores, the fp8 and fp4 items on the vector path, each output
// against the oracle and every item's padding untouched; m = 70 tiles x on both paths.
TEST(cuda_qgemv_mma_grouped, mixed_items_match_the_oracle) {
  CEDAR_REQUIRE_GPU();
  const mma_switch on(true);
  struct spec {
    kc::weight_format f;
    int64_t rows, cols;
    int br;
    int64_t row0, view_rows;
    bool accumulate;
  };
  std::vector<spec> specs = {{F::bf16, 40, 72, 1, 0, 40, true},       {F::f8_e4m3, 200, 1024, 32, 0, 200, false},
                             {F::bf16, 300, 520, 1, 13, 270, false},  {F::fp4_e2m1, 128, 512, 1, 0, 128, false},
                             {F::bf16, 16, 64, 1, 0, 16, false}};
  for (int i = 0; i < 16; ++i) specs.push_back({F::bf16, 8 + 24 * i, 128, 1, 0, 8 + 24 * i, false});
  for (int m : {9, 33, 70}) {
    std::mt19937 g(777u + (unsigned)m);
    std::vector<host_weight> hw;
    std::vector<std::unique_ptr<dev_array<uint8_t>>> dd, ds;
    std::vector<std::unique_ptr<dev_array<float>>> dx, dy;
    std::vector<std::vector<float>> xs, y0s;
    std::vector<cu::qgemv_params> items;
    for (const auto& sp : specs) {
      hw.push_back(make_weight(g, sp.f, sp.rows, sp.cols, sp.br));
      dd.push_back(std::make_unique<dev_array<uint8_t>>(hw.back().data));
      ds.push_back(std::make_unique<dev_array<uint8_t>>(hw.back().scales.empty() ? std::vector<uint8_t>(1) : hw.back().scales));
      const int ldy = (int)sp.view_rows + 3;
      xs.push_back(cedar::test::randn(g, (size_t)m * sp.cols, 1.0f));
      y0s.push_back(cedar::test::randn(g, (size_t)m * ldy, 1.0f));
      dx.push_back(std::make_unique<dev_array<float>>(xs.back()));
      dy.push_back(std::make_unique<dev_array<float>>((size_t)m * ldy));
      if (sp.accumulate) dy.back()->upload(y0s.back());
      else dy.back()->poison();
      cu::qgemv_params p;
      p.w.format = sp.f, p.w.rows = sp.view_rows, p.w.cols = sp.cols, p.w.data = dd.back()->p, p.w.row0 = sp.row0;
      p.w.scale_e8m0 = hw.back().scales.empty() ? nullptr : ds.back()->p;
      p.w.scale_block_rows = sp.br, p.w.scale_cols = (sp.cols + 31) / 32;
      p.m = m, p.x = dx.back()->p, p.ldx = (int)sp.cols, p.y = dy.back()->p, p.ldy = ldy, p.accumulate = sp.accumulate;
      items.push_back(p);
    }
    const auto st = cu::qgemv_grouped(items.data(), (int)items.size(), nullptr);
    ASSERT_TRUE(st.ok()) << st.err().message;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    for (size_t it = 0; it < specs.size(); ++it) {
      const spec& sp = specs[it];
      const auto want = oracle(hw[it], sp.row0, sp.view_rows, xs[it], (int)sp.cols, m, nullptr, 0.0f);
      double worst = 0;
      const double tol = sp.f == F::bf16 ? 5e-6 : 2e-6;
      EXPECT_TRUE(outputs_match(want, dy[it]->download(), y0s[it], sp.accumulate, m, sp.view_rows, items[it].ldy, tol,
                                &worst))
          << "item " << it << ", m " << m;
    }
  }
}

}  // namespace

// The SwiGLU epilogue (qgemv_params::glu_up, qgemv_expert_params::glu, moe_up_swiglu): the
// activation written by the up projection equals, bit for bit, the two plain projections then
// swiglu_rows — per format (bf16, fp8 with 16- and 8-wide loads, fp4), m 1 to 11 (past the
// 8-row tile, and past the tensor-core threshold for bf16: the SwiGLU item stays on the vector
// path, its reference is taken with the tensor cores off), x normalised on the fly (the factor
// deferred or given), the limit clamp on or off, row scales or none; a plain item grouped with a
// SwiGLU item keeps its own bits; the routed form with the routing in the launch gives
// moe_route's weights' bits; an f32 or mismatched up matrix is an error naming it.
namespace {

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), sizeof(float) * a.size()) == 0;
}

}  // namespace

TEST(cuda_qgemv_swiglu, epilogue_gives_the_bits_of_two_projections_and_swiglu_rows) {
  CEDAR_REQUIRE_GPU();
  struct spec {
    F f;
    int64_t rows, cols;
    int br;
  };
  const bool mma_was = cu::qgemv_mma_enabled();
  int cases = 0;
  for (const spec& sp : {spec{F::bf16, 200, 512, 1}, spec{F::f8_e4m3, 96, 1024, 32}, spec{F::f8_e4m3, 70, 520, 32},
                         spec{F::fp4_e2m1, 130, 2048, 1}, spec{F::bf16, 768, 2048, 1}})
    for (int m : {1, 3, 8, 11})
      for (int variant = 0; variant < 3; ++variant) {  // 0: no norm, no scale, no limit; 1: deferred norm,
                                                       // scale, limit; 2: given factors, limit
        std::mt19937 g(31u * (unsigned)sp.rows + (unsigned)m * 7u + (unsigned)variant);
        const int64_t Fr = sp.rows, d = sp.cols;
        host_weight hg = make_weight(g, sp.f, Fr, d, sp.br), hu = make_weight(g, sp.f, Fr, d, sp.br);
        host_weight hp = make_weight(g, sp.f, 24, d, sp.br);  // a plain item in the same group
        std::vector<std::unique_ptr<dev_array<uint8_t>>> keep;
        const kc::qmatrix vg = dev_view(hg, keep), vu = dev_view(hu, keep), vp = dev_view(hp, keep);
        std::normal_distribution<float> nd(0.0f, 1.0f);
        std::vector<float> x((size_t)m * d), nw((size_t)d), inv((size_t)m), scale((size_t)m);
        for (auto& v : x) v = 3.0f * nd(g);
        for (auto& v : nw) v = nd(g);
        for (auto& v : inv) v = 0.3f + 0.1f * std::fabs(nd(g));
        for (auto& v : scale) v = 0.5f + std::fabs(nd(g));
        dev_array<float> dx(x), dnw(nw), dinv(inv), dscale(scale);
        dev_array<float> dh((size_t)m * 2 * Fr), dref((size_t)m * Fr), dact((size_t)m * Fr), dpl((size_t)m * 24),
            dpl_ref((size_t)m * 24);
        dh.poison(), dref.poison(), dact.poison(), dpl.poison(), dpl_ref.poison();
        const float limit = variant ? 0.7f : 0.0f;
        auto item = [&](const kc::qmatrix& w, float* y, int ldy) {
          cu::qgemv_params p;
          p.w = w, p.m = m, p.x = dx.p, p.ldx = (int)d, p.y = y, p.ldy = ldy;
          if (variant >= 1) p.x_norm_w = dnw.p, p.x_norm_eps = 1e-6f;
          if (variant == 2) p.x_norm_inv = dinv.p;
          return p;
        };
        // reference: gate and up as plain items into h [m, 2F], the plain item alone, then
        // swiglu_rows (vector path: the SwiGLU item never takes the tensor cores)
        cu::set_qgemv_mma(false);
        const cu::qgemv_params ref[3] = {item(vg, dh.p, (int)(2 * Fr)), item(vu, dh.p + Fr, (int)(2 * Fr)),
                                         item(vp, dpl_ref.p, 24)};
        auto st = cu::qgemv_grouped(ref, 3, nullptr);
        cu::set_qgemv_mma(mma_was);
        ASSERT_TRUE(st.ok()) << st.err().message;
        ASSERT_TRUE(cu::swiglu_rows(dh.p, m, (int)Fr, limit, variant == 1 ? dscale.p : nullptr, dref.p, nullptr).ok());
        // the SwiGLU item grouped with the plain one (tensor cores as configured: the plain bf16
        // item may take them at m > 8, so its bits are compared on the vector path only)
        cu::qgemv_params glu = item(vg, dact.p, (int)Fr);
        glu.glu_up = vu, glu.glu_limit = limit, glu.glu_scale = variant == 1 ? dscale.p : nullptr;
        const cu::qgemv_params both[2] = {glu, item(vp, dpl.p, 24)};
        st = cu::qgemv_grouped(both, 2, nullptr);
        ASSERT_TRUE(st.ok()) << st.err().message;
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const auto got = dact.download(), want = dref.download();
        for (float v : got) ASSERT_TRUE(std::isfinite(v)) << "an activation was not written";
        ASSERT_TRUE(same_bits(got, want)) << "format " << (int)sp.f << " rows " << Fr << " m " << m << " variant " << variant;
        if (!(sp.f == F::bf16 && m > cu::k_qgemv_m_tile && mma_was)) {
          ASSERT_TRUE(same_bits(dpl.download(), dpl_ref.download())) << "the plain item beside the SwiGLU one";
        }
        // qgemv (one item) takes the same form
        dact.poison();
        st = cu::qgemv(glu, nullptr);
        ASSERT_TRUE(st.ok()) << st.err().message;
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        ASSERT_TRUE(same_bits(dact.download(), want)) << "qgemv, m " << m;
        ++cases;
      }
  EXPECT_EQ(cases, 60);

  // errors: an f32 SwiGLU item, an up matrix of another shape
  {
    std::vector<float> host(64, 1.0f);
    dev_array<float> dd(host);
    cu::qgemv_params p;
    p.w.format = F::f32, p.w.rows = 2, p.w.cols = 8, p.w.data = dd.p;
    p.m = 1, p.x = dd.p, p.ldx = 8, p.y = dd.p, p.ldy = 2;
    p.glu_up = p.w;
    auto st = cu::qgemv(p, nullptr);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.err().message.find("not f32"), std::string::npos) << st.err().message;
    p.w.format = p.glu_up.format = F::bf16;
    p.glu_up.rows = 3;
    st = cu::qgemv_grouped(&p, 1, nullptr);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.err().message.find("glu_up differs"), std::string::npos) << st.err().message;
  }
}

namespace {
// An array of weight views in device memory (the expert launches' wa / wb).
dev_array<uint8_t> views_on_device(const std::vector<kc::qmatrix>& v) {
  return dev_array<uint8_t>(std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(v.data()),
                                                 reinterpret_cast<const uint8_t*>(v.data() + v.size())));
}
}  // namespace

// A routed-experts case: E experts of rows × cols weights (scale blocks of br rows), R rows of K
// experts each.

struct experts_case {
  F f;
  int64_t rows, cols;
  int br, E, R, K;
};

TEST(cuda_qgemv_swiglu, routed_experts_up_and_swiglu_in_one_launch) {
  CEDAR_REQUIRE_GPU();
  using spec = experts_case;  // rows: F, cols: d
  for (const spec& sp : {spec{F::bf16, 96, 512, 1, 5, 3, 2}, spec{F::f8_e4m3, 64, 1024, 32, 4, 2, 2},
                         spec{F::f8_e4m3, 40, 520, 32, 3, 1, 3}, spec{F::fp4_e2m1, 128, 2048, 1, 6, 5, 3},
                         spec{F::bf16, 768, 2048, 1, 16, 1, 2}}) {
    std::mt19937 g(77u + (unsigned)sp.rows + (unsigned)sp.f);
    std::vector<std::unique_ptr<dev_array<uint8_t>>> keep;
    std::vector<kc::qmatrix> v1, v3;
    for (int e = 0; e < sp.E; ++e) {
      v1.push_back(dev_view(make_weight(g, sp.f, sp.rows, sp.cols, sp.br), keep));
      v3.push_back(dev_view(make_weight(g, sp.f, sp.rows, sp.cols, sp.br), keep));
    }
    dev_array<uint8_t> d1 = views_on_device(v1), d3 = views_on_device(v3);
    const auto* w1 = reinterpret_cast<const kc::qmatrix*>(d1.p);
    const auto* w3 = reinterpret_cast<const kc::qmatrix*>(d3.p);
    const int n = sp.R * sp.K, F_ = (int)sp.rows, d = (int)sp.cols;
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x((size_t)sp.R * d), nw((size_t)d), lg((size_t)sp.R * sp.E), bias((size_t)sp.E);
    for (auto& v : x) v = 2.0f * nd(g);
    for (auto& v : nw) v = nd(g);
    for (auto& v : lg) v = 1.5f * nd(g);
    for (auto& v : bias) v = 0.1f * nd(g);
    dev_array<float> dx(x), dnw(nw), dl(lg), dbias(bias), dw_ref((size_t)n), dw((size_t)n);
    dev_array<int32_t> dsel_ref((size_t)n), dsel((size_t)n);
    dev_array<float> dh((size_t)n * 2 * F_), dref((size_t)n * F_), dact((size_t)n * F_);
    dw.poison(), dsel.poison(), dh.poison(), dref.poison(), dact.poison();
    cu::moe_route_params rp;
    rp.R = sp.R, rp.E = sp.E, rp.K = sp.K, rp.logits = dl.p, rp.bias = dbias.p, rp.route_scale = 2.5f;
    rp.sel = dsel_ref.p, rp.weight = dw_ref.p;
    const float limit = 0.9f;
    // reference: moe_route, moe_up, swiglu_rows with the route's weights
    ASSERT_TRUE(cu::moe_route(rp, nullptr).ok());
    auto st = cu::moe_up(w1, w3, v1[0], v3[0], dsel_ref.p, sp.R, sp.K, dx.p, d, F_, dh.p, nullptr, dnw.p, 1e-6f);
    ASSERT_TRUE(st.ok()) << st.err().message;
    ASSERT_TRUE(cu::swiglu_rows(dh.p, n, F_, limit, dw_ref.p, dref.p, nullptr).ok());
    // the weights given (moe_route's): one launch
    st = cu::moe_up_swiglu(w1, w3, v1[0], v3[0], dsel_ref.p, sp.R, sp.K, dx.p, d, F_, limit, dw_ref.p, dact.p, nullptr,
                           dnw.p, 1e-6f);
    ASSERT_TRUE(st.ok()) << st.err().message;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto want = dref.download();
    ASSERT_TRUE(same_bits(dact.download(), want)) << "weights given, format " << (int)sp.f;
    // routed in the launch: the same ids, weights and activations
    dact.poison();
    cu::moe_route_params rs = rp;
    rs.sel = dsel.p, rs.weight = dw.p;
    st = cu::moe_up_swiglu(w1, w3, v1[0], v3[0], dsel.p, sp.R, sp.K, dx.p, d, F_, limit, nullptr, dact.p, nullptr, dnw.p,
                           1e-6f, nullptr, &rs);
    ASSERT_TRUE(st.ok()) << st.err().message;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(dsel.download(), dsel_ref.download()) << "routed ids";
    ASSERT_TRUE(same_bits(dw.download(), dw_ref.download())) << "route weights";
    ASSERT_TRUE(same_bits(dact.download(), want)) << "self-routed, format " << (int)sp.f;
  }
  // f32 experts have no SwiGLU form: an error naming it
  std::vector<float> host(64, 1.0f);
  dev_array<float> dd(host);
  kc::qmatrix like;
  like.format = F::f32, like.rows = 2, like.cols = 8, like.data = dd.p;
  const auto* arr = reinterpret_cast<const kc::qmatrix*>(dd.p);
  const auto st = cu::moe_up_swiglu(arr, arr, like, like, reinterpret_cast<const int32_t*>(dd.p), 1, 1, dd.p, 8, 2, 0.0f,
                                    nullptr, dd.p, nullptr);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.err().message.find("not f32"), std::string::npos) << st.err().message;
}

// The shared expert's down projection as fixed items of the routed experts' down launch
// (moe_down's shared_w2, qgemv_expert's n_fixed): the routed rows and the shared rows are the bits
// of one launch of all items over an expert array that also holds the shared matrix, and the
// shared rows match the dequantised oracle; a shared matrix of another layout is refused.
TEST(cuda_qgemv_expert, shared_expert_down_as_fixed_items_of_the_routed_launch) {
  CEDAR_REQUIRE_GPU();
  using spec = experts_case;  // rows: d, cols: F
  for (const spec& sp : {spec{F::bf16, 96, 512, 1, 5, 1, 2}, spec{F::f8_e4m3, 64, 1024, 32, 4, 2, 2},
                         spec{F::f8_e4m3, 40, 520, 32, 3, 1, 3}, spec{F::fp4_e2m1, 128, 2048, 1, 6, 3, 3},
                         spec{F::f32, 40, 264, 1, 3, 2, 1}, spec{F::bf16, 2048, 768, 1, 16, 1, 6}}) {
    std::mt19937 g(131u + (unsigned)sp.rows + (unsigned)sp.f);
    std::vector<std::unique_ptr<dev_array<uint8_t>>> keep;
    std::vector<kc::qmatrix> v;  // E routed experts, then the shared one
    for (int e = 0; e < sp.E; ++e) v.push_back(dev_view(make_weight(g, sp.f, sp.rows, sp.cols, sp.br), keep));
    const host_weight shared = make_weight(g, sp.f, sp.rows, sp.cols, sp.br);
    v.push_back(dev_view(shared, keep));
    dev_array<uint8_t> dv = views_on_device(v);
    const auto* arr = reinterpret_cast<const kc::qmatrix*>(dv.p);
    const int n = sp.R * sp.K, d = (int)sp.rows, F_ = (int)sp.cols;
    std::vector<int32_t> sel((size_t)n);
    for (auto& e : sel) e = (int32_t)(g() % (uint32_t)sp.E);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> a((size_t)n * F_), as((size_t)sp.R * F_);
    for (auto& x : a) x = nd(g);
    for (auto& x : as) x = nd(g);
    // reference: one expert launch of the n + R items, the shared rows as expert E
    std::vector<int32_t> sel_all(sel);
    sel_all.resize((size_t)(n + sp.R), sp.E);
    std::vector<float> a_all(a);
    a_all.insert(a_all.end(), as.begin(), as.end());
    dev_array<int32_t> dsel(sel), dsel_all(sel_all);
    dev_array<float> da(a), das(as), da_all(a_all), dy_all((size_t)(n + sp.R) * d), dye((size_t)n * d),
        dys((size_t)sp.R * d);
    dy_all.poison(), dye.poison(), dys.poison();
    cu::qgemv_expert_params p;
    p.wa = arr, p.like_a = v[0], p.sel = dsel_all.p, p.n = n + sp.R, p.x = da_all.p, p.ldx = F_, p.y = dy_all.p, p.ldy = d;
    auto st = cu::qgemv_expert(p, nullptr);
    ASSERT_TRUE(st.ok()) << st.err().message;
    st = cu::moe_down(arr, v[0], dsel.p, sp.R, sp.K, da.p, F_, d, dye.p, nullptr, &v[(size_t)sp.E], das.p, dys.p);
    ASSERT_TRUE(st.ok()) << st.err().message;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto all = dy_all.download(), ye = dye.download(), ys = dys.download();
    ASSERT_TRUE(same_bits(ye, std::vector<float>(all.begin(), all.begin() + (size_t)n * d)))
        << "routed rows, format " << (int)sp.f << " d " << d;
    ASSERT_TRUE(same_bits(ys, std::vector<float>(all.begin() + (size_t)n * d, all.end())))
        << "shared rows, format " << (int)sp.f << " d " << d;
    for (int r = 0; r < sp.R; ++r)
      for (int o = 0; o < d; ++o) {
        double s = 0, mag = 0;
        for (int k = 0; k < F_; ++k) {
          const double t = (double)shared.value[(size_t)o * F_ + k] * as[(size_t)r * F_ + k];
          s += t, mag += std::fabs(t);
        }
        ASSERT_LE(std::fabs(ys[(size_t)r * d + o] - s) / (mag + 1e-30), 2e-6) << "shared row " << r << " output " << o;
      }
    // a shared matrix of another shape, or without its rows: errors that name it
    kc::qmatrix other = v[(size_t)sp.E];
    other.rows -= 8;
    st = cu::moe_down(arr, v[0], dsel.p, sp.R, sp.K, da.p, F_, d, dye.p, nullptr, &other, das.p, dys.p);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.err().message.find("fixed_a differs"), std::string::npos) << st.err().message;
    st = cu::moe_down(arr, v[0], dsel.p, sp.R, sp.K, da.p, F_, d, dye.p, nullptr, &v[(size_t)sp.E], nullptr, dys.p);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.err().message.find("shared expert"), std::string::npos) << st.err().message;
  }
}

// SwiGLU on the down projection's load (moe_down_swiglu, qgemv_expert's x_glu): the routed rows
// and the shared expert's rows are, bit for bit, swiglu_rows (routed: the rows' weights; shared:
// weight 1) then moe_down — per format (bf16, fp8 with 16- and 8-wide loads, fp4, f32), the limit
// clamp on and off, with the shared expert in the launch and without, the routed weights given
// and not; x_glu with an up matrix, rows narrower than [gate | up] or a row too wide for shared
// memory is an error naming it.
TEST(cuda_qgemv_expert, swiglu_on_the_down_load_gives_the_bits_of_swiglu_rows_then_moe_down) {
  CEDAR_REQUIRE_GPU();
  using spec = experts_case;  // rows: d, cols: F
  int cases = 0;
  for (const spec& sp : {spec{F::bf16, 96, 512, 1, 5, 1, 2}, spec{F::f8_e4m3, 64, 1024, 32, 4, 2, 2},
                         spec{F::f8_e4m3, 40, 520, 32, 3, 1, 3}, spec{F::fp4_e2m1, 128, 2048, 1, 6, 3, 3},
                         spec{F::f32, 40, 264, 1, 3, 2, 1}, spec{F::bf16, 2048, 768, 1, 16, 1, 2}})
    for (int variant = 0; variant < 3; ++variant) {  // 0: no limit, no weights, no shared; 1: limit,
                                                     // weights, shared; 2: limit, no weights, shared
      std::mt19937 g(211u + (unsigned)sp.rows + (unsigned)sp.f * 5u + (unsigned)variant);
      std::vector<std::unique_ptr<dev_array<uint8_t>>> keep;
      std::vector<kc::qmatrix> v;  // E routed experts, then the shared one
      for (int e = 0; e <= sp.E; ++e) v.push_back(dev_view(make_weight(g, sp.f, sp.rows, sp.cols, sp.br), keep));
      dev_array<uint8_t> dv = views_on_device(v);
      const auto* arr = reinterpret_cast<const kc::qmatrix*>(dv.p);
      const int n = sp.R * sp.K, d = (int)sp.rows, F_ = (int)sp.cols;
      std::vector<int32_t> sel((size_t)n);
      for (auto& e : sel) e = (int32_t)(g() % (uint32_t)sp.E);
      std::normal_distribution<float> nd(0.0f, 1.0f);
      std::vector<float> h((size_t)n * 2 * F_), hs((size_t)sp.R * 2 * F_), w((size_t)n);
      for (auto& x : h) x = 2.0f * nd(g);
      for (auto& x : hs) x = 2.0f * nd(g);
      for (auto& x : w) x = 0.2f + std::fabs(nd(g));
      const float limit = variant ? 1.5f : 0.0f;
      const bool shared = variant >= 1;
      const float* weights = nullptr;
      dev_array<int32_t> dsel(sel);
      dev_array<float> dh(h), dhs(hs), dw(w), da((size_t)n * F_), das((size_t)sp.R * F_);
      dev_array<float> dye_ref((size_t)n * d), dys_ref((size_t)sp.R * d), dye((size_t)n * d), dys((size_t)sp.R * d);
      da.poison(), das.poison(), dye_ref.poison(), dys_ref.poison(), dye.poison(), dys.poison();
      if (variant == 1) weights = dw.p;
      // reference: swiglu_rows (routed with the weights, shared with 1), then moe_down
      ASSERT_TRUE(cu::swiglu_rows(dh.p, n, F_, limit, weights, da.p, nullptr).ok());
      ASSERT_TRUE(cu::swiglu_rows(dhs.p, sp.R, F_, limit, nullptr, das.p, nullptr).ok());
      auto st = cu::moe_down(arr, v[0], dsel.p, sp.R, sp.K, da.p, F_, d, dye_ref.p, nullptr,
                             shared ? &v[(size_t)sp.E] : nullptr, das.p, dys_ref.p);
      ASSERT_TRUE(st.ok()) << st.err().message;
      st = cu::moe_down_swiglu(arr, v[0], dsel.p, sp.R, sp.K, dh.p, F_, limit, weights, d, dye.p, nullptr,
                               shared ? &v[(size_t)sp.E] : nullptr, dhs.p, dys.p);
      ASSERT_TRUE(st.ok()) << st.err().message;
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto want = dye_ref.download();
      for (float x : want) ASSERT_TRUE(std::isfinite(x)) << "a reference row was not written";
      ASSERT_TRUE(same_bits(dye.download(), want)) << "routed rows, format " << (int)sp.f << " d " << d << " variant " << variant;
      if (shared) {
        ASSERT_TRUE(same_bits(dys.download(), dys_ref.download())) << "shared rows, format " << (int)sp.f << " variant " << variant;
      }
      ++cases;
    }
  EXPECT_EQ(cases, 18);

  // errors: x_glu with the up matrices, x rows narrower than [gate | up], a row beyond shared memory
  std::vector<float> host(64, 1.0f);
  dev_array<float> dd(host);
  kc::qmatrix like;
  like.format = F::bf16, like.rows = 2, like.cols = 8, like.data = dd.p;
  cu::qgemv_expert_params p;
  p.wa = reinterpret_cast<const kc::qmatrix*>(dd.p), p.like_a = like, p.sel = reinterpret_cast<const int32_t*>(dd.p);
  p.n = 1, p.x = dd.p, p.ldx = 16, p.y = dd.p, p.ldy = 2, p.x_glu = true;
  p.wb = p.wa, p.like_b = like;
  auto st = cu::qgemv_expert(p, nullptr);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.err().message.find("x_glu"), std::string::npos) << st.err().message;
  p.wb = nullptr, p.ldx = 8;
  st = cu::qgemv_expert(p, nullptr);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.err().message.find("[gate | up]"), std::string::npos) << st.err().message;
  const std::vector<float> wide_host((size_t)2 * (cu::k_x_glu_max_cols + 8), 0.0f);
  dev_array<float> wide(wide_host);
  p.like_a.cols = cu::k_x_glu_max_cols + 8, p.like_a.data = wide.p, p.x = wide.p, p.ldx = (int)(2 * p.like_a.cols);
  st = cu::qgemv_expert(p, nullptr);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.err().message.find("shared memory"), std::string::npos) << st.err().message;
}

// An mHC site's mix reduction in extra blocks of the grouped projections' launch
// (qgemv_grouped_with_mix): pre, post and comb are hc_post's bits on the same partials, and the
// projections are qgemv_grouped's — hc 4 (the reduction rides on the first launch: a bf16 and an
// fp8 class, so two launches; rows 1 and 3), hc 2 (hc_post's own launch first), no items at all;
// a reduction with a null output is an error naming hc_post.
TEST(cuda_qgemv_grouped, mix_reduction_in_the_launch_gives_hc_posts_bits) {
  CEDAR_REQUIRE_GPU();
  using cedar::test::randn;
  int cases = 0;
  for (int hc : {4, 2})
    for (int R : {1, 3})
      for (int with_items = 0; with_items < 2; ++with_items) {
        std::mt19937 g((unsigned)(hc * 17 + R * 5 + with_items));
        const int d = 512, mix = (2 + hc) * hc;
        const auto X = randn(g, (size_t)R * hc * d, 1.0f), pre_prev = randn(g, (size_t)R * hc, 0.5f);
        const auto fnw = randn(g, (size_t)mix * hc * d, 0.05f), base = randn(g, (size_t)mix, 0.5f);
        const std::vector<float> scale = {0.7f, 1.3f, 0.9f};
        dev_array<float> dX(X), dpp(pre_prev), dfn(fnw), db(base), ds(scale), dv((size_t)R * d),
            dpart(cu::hc_mix_partial_floats(R, hc, d));
        cu::hc_mix_params mp;
        mp.R = R, mp.hc = hc, mp.d = d, mp.X = dX.p, mp.pre = dpp.p, mp.partial = dpart.p, mp.v = dv.p;
        mp.fn = kc::qmatrix_f32(dfn.p, mix, (int64_t)hc * d);
        ASSERT_TRUE(cu::hc_mix_collapse(mp, nullptr).ok());
        dev_array<float> pre_a((size_t)R * hc), post_a((size_t)R * hc), comb_a((size_t)R * hc * hc);
        dev_array<float> pre_b((size_t)R * hc), post_b((size_t)R * hc), comb_b((size_t)R * hc * hc);
        pre_a.poison(), post_a.poison(), comb_a.poison(), pre_b.poison(), post_b.poison(), comb_b.poison();
        cu::hc_post_params p;
        p.R = R, p.hc = hc, p.sinkhorn_iters = 20, p.eps = 1e-6f, p.base = db.p, p.scale = ds.p;
        p.partial = dpart.p, p.nblk = cu::hc_mix_blocks(d), p.ncols = hc * d, p.norm_eps = 1e-6f;
        p.pre = pre_a.p, p.post = post_a.p, p.comb = comb_a.p;
        ASSERT_TRUE(cu::hc_post(p, nullptr).ok());
        // projections of the collapsed rows: a bf16 and an fp8 matrix (two launch classes)
        std::vector<std::unique_ptr<dev_array<uint8_t>>> keep;
        const kc::qmatrix w0 = dev_view(make_weight(g, F::bf16, 96, d, 1), keep);
        const kc::qmatrix w1 = dev_view(make_weight(g, F::f8_e4m3, 64, d, 32), keep);
        dev_array<float> y0a((size_t)R * 96), y1a((size_t)R * 64), y0b((size_t)R * 96), y1b((size_t)R * 64);
        y0a.poison(), y1a.poison(), y0b.poison(), y1b.poison();
        auto items = [&](float* y0, float* y1, cu::qgemv_params (&it)[2]) {
          it[0].w = w0, it[0].m = R, it[0].x = dv.p, it[0].ldx = d, it[0].y = y0, it[0].ldy = 96;
          it[1].w = w1, it[1].m = R, it[1].x = dv.p, it[1].ldx = d, it[1].y = y1, it[1].ldy = 64;
        };
        cu::qgemv_params ref[2], got[2];
        items(y0a.p, y1a.p, ref);
        items(y0b.p, y1b.p, got);
        const int n = with_items ? 2 : 0;
        if (n) {
          ASSERT_TRUE(cu::qgemv_grouped(ref, n, nullptr).ok());
        }
        cu::hc_post_params q = p;
        q.pre = pre_b.p, q.post = post_b.p, q.comb = comb_b.p;
        auto st = cu::qgemv_grouped_with_mix(got, n, q, nullptr);
        ASSERT_TRUE(st.ok()) << st.err().message;
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const std::string what = "hc " + std::to_string(hc) + " R " + std::to_string(R) + " items " + std::to_string(n);
        const auto want_pre = pre_a.download();
        for (float v : want_pre) ASSERT_TRUE(std::isfinite(v)) << "hc_post wrote no pre, " << what;
        ASSERT_TRUE(same_bits(pre_b.download(), want_pre)) << "pre, " << what;
        ASSERT_TRUE(same_bits(post_b.download(), post_a.download())) << "post, " << what;
        ASSERT_TRUE(same_bits(comb_b.download(), comb_a.download())) << "comb, " << what;
        if (n) {
          ASSERT_TRUE(same_bits(y0b.download(), y0a.download())) << "bf16 item, " << what;
          ASSERT_TRUE(same_bits(y1b.download(), y1a.download())) << "fp8 item, " << what;
        }
        ++cases;
        if (hc == 4 && R == 1 && with_items) {  // a reduction without its outputs: hc_post's error
          cu::hc_post_params bad = q;
          bad.comb = nullptr;
          st = cu::qgemv_grouped_with_mix(got, n, bad, nullptr);
          ASSERT_FALSE(st.ok());
          EXPECT_NE(st.err().message.find("hc_post"), std::string::npos) << st.err().message;
        }
      }
  EXPECT_EQ(cases, 8);
}

// The weight stream's L2 policy (weights_evict_first): evict-first loads and bulk prefetches
// or plain ones give the same bits — single projections (both column splits), a group with a
// SwiGLU item, routed experts — for every format and each mode (0 evict-normal, 1 evict-first
// with bulk prefetches, 2 evict-first with per-line ones); the mode is restored however the
// test ends.
TEST(cuda_qgemv_policy, evict_first_weight_stream_gives_the_same_bits) {
  CEDAR_REQUIRE_GPU();
  struct mode_guard {
    int was = cu::weights_evict_mode();
    ~mode_guard() { cu::set_weights_evict_mode(was); }
  } guard;
  std::mt19937 g(515u);
  std::vector<std::unique_ptr<dev_array<uint8_t>>> keep;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (F f : {F::f32, F::bf16, F::f8_e4m3, F::fp4_e2m1}) {
    for (int m : {1, 3, 8}) {
      // a tall matrix (one warp per row group) and a short wide one (columns split 4 ways)
      const host_weight tall = make_weight(g, f, 2048, 256, f == F::f8_e4m3 ? 32 : 1);
      const host_weight wide = make_weight(g, f, 64, 4096, f == F::f8_e4m3 ? 32 : 1);
      const kc::qmatrix vt = dev_view(tall, keep), vw = dev_view(wide, keep);
      std::vector<float> xt((size_t)m * 256), xw((size_t)m * 4096);
      for (auto& v : xt) v = nd(g);
      for (auto& v : xw) v = nd(g);
      dev_array<float> dxt(xt), dxw(xw), yt((size_t)m * 2048), yw((size_t)m * 64), yg((size_t)m * 64);
      auto run = [&](int mode) {
        cu::set_weights_evict_mode(mode);
        yt.poison(), yw.poison(), yg.poison();
        cu::qgemv_params a;
        a.w = vt, a.m = m, a.x = dxt.p, a.ldx = 256, a.y = yt.p, a.ldy = 2048;
        cu::qgemv_params b;
        b.w = vw, b.m = m, b.x = dxw.p, b.ldx = 4096, b.y = yw.p, b.ldy = 64;
        EXPECT_TRUE(cu::qgemv(a, nullptr).ok());
        EXPECT_TRUE(cu::qgemv(b, nullptr).ok());
        cu::qgemv_params items[2] = {a, b};
        items[1].y = yg.p;
        if (f != F::f32) items[1].glu_up = vw, items[1].ldy = 64;  // a SwiGLU item beside a plain one
        EXPECT_TRUE(cu::qgemv_grouped(items, 2, nullptr).ok());
        EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        std::vector<float> out = yt.download();
        for (const auto* d : {&yw, &yg}) {
          const auto v = d->download();
          out.insert(out.end(), v.begin(), v.end());
        }
        return out;
      };
      const auto plain = run(0);
      for (int mode : {1, 2}) ASSERT_TRUE(same_bits(plain, run(mode))) << "format " << (int)f << " m " << m << " mode " << mode;
      for (float v : plain) ASSERT_TRUE(std::isfinite(v)) << "format " << (int)f << " m " << m;
    }
  }
  // routed experts (the expert kernel's loads)
  for (F f : {F::bf16, F::fp4_e2m1}) {
    const int E = 4, R = 2, K = 2, Fr = 64, d = 512;
    std::vector<kc::qmatrix> v1, v3;
    for (int e = 0; e < E; ++e) {
      v1.push_back(dev_view(make_weight(g, f, Fr, d, 1), keep));
      v3.push_back(dev_view(make_weight(g, f, Fr, d, 1), keep));
    }
    dev_array<uint8_t> d1 = views_on_device(v1), d3 = views_on_device(v3);
    std::vector<float> x((size_t)R * d);
    for (auto& v : x) v = nd(g);
    dev_array<float> dx(x), dh((size_t)R * K * 2 * Fr);
    dev_array<int32_t> dsel(std::vector<int32_t>{3, 1, 0, 2});
    auto run = [&](int mode) {
      cu::set_weights_evict_mode(mode);
      dh.poison();
      const auto st = cu::moe_up(reinterpret_cast<const kc::qmatrix*>(d1.p), reinterpret_cast<const kc::qmatrix*>(d3.p),
                                 v1[0], v3[0], dsel.p, R, K, dx.p, d, Fr, dh.p, nullptr);
      EXPECT_TRUE(st.ok()) << st.err().message;
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      return dh.download();
    };
    const auto plain = run(0);
    for (int mode : {1, 2}) ASSERT_TRUE(same_bits(plain, run(mode))) << "experts, format " << (int)f << " mode " << mode;
    for (float v : plain) ASSERT_TRUE(std::isfinite(v)) << "experts, format " << (int)f;
  }
}
