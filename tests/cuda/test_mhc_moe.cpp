// The mHC mixes (kernels/cuda/mhc.cuh) and the MoE routing / element kernels
// (kernels/cuda/moe.cuh) against host oracles written from MODEL_SPEC §6 / §1 (the CPU path's
// formulas, in double where the order of sums does not matter), over shapes that take each
// launch form: hc² ≤ 32 (a warp per row) and larger hc (a thread per row), float4 and scalar
// channels, one and several rows; outputs NaN-poisoned before each launch.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/quant.hpp"
#include "kernels/cuda/generic_kernels.hpp"
#include "kernels/cuda/mhc.cuh"
#include "kernels/cuda/moe.cuh"
#include "tests/cuda/cuda_test_util.hpp"

namespace cu = cedar::kernels::cuda;
namespace kc = cedar::kernels;
using cedar::test::dev_array;
using cedar::test::randn;

namespace {

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

}  // namespace

TEST(cuda_mhc, post_mixes_and_sinkhorn_match_the_oracle) {
  CEDAR_REQUIRE_GPU();
  for (int hc : {1, 2, 4, 5, 6, 8}) {
    for (int R : {1, 7}) {
      const int iters = 20, mix = (2 + hc) * hc;
      const float eps = 1e-6f;
      std::mt19937 g((unsigned)(hc * 100 + R));
      const auto mixes = randn(g, (size_t)R * mix, 1.0f), base = randn(g, (size_t)mix, 0.5f);
      const std::vector<float> scale = {0.7f, 1.3f, 0.9f};
      dev_array<float> dm(mixes), db(base), ds(scale), dpre((size_t)R * hc), dpost((size_t)R * hc),
          dcomb((size_t)R * hc * hc);
      dpre.poison(), dpost.poison(), dcomb.poison();
      cu::hc_post_params p;
      p.R = R, p.hc = hc, p.sinkhorn_iters = iters, p.eps = eps, p.mixes = dm.p, p.base = db.p, p.scale = ds.p;
      p.pre = dpre.p, p.post = dpost.p, p.comb = dcomb.p;
      ASSERT_TRUE(cu::hc_post(p, nullptr).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto pre = dpre.download(), post = dpost.download(), comb = dcomb.download();
      for (int r = 0; r < R; ++r) {
        const float* m = mixes.data() + (size_t)r * mix;
        for (int k = 0; k < hc; ++k) {
          EXPECT_NEAR(pre[(size_t)r * hc + k], sigmoid(m[k] * 0.7 + base[k]) + eps, 2e-6) << "hc " << hc;
          EXPECT_NEAR(post[(size_t)r * hc + k], 2 * sigmoid(m[hc + k] * 1.3 + base[hc + k]), 4e-6) << "hc " << hc;
        }
        std::vector<double> c((size_t)hc * hc);
        for (int j = 0; j < hc; ++j) {
          double mx = -1e300, s = 0;
          for (int k = 0; k < hc; ++k) mx = std::max(mx, (double)m[2 * hc + j * hc + k] * 0.9 + base[2 * hc + j * hc + k]);
          for (int k = 0; k < hc; ++k) s += c[(size_t)j * hc + k] = std::exp(m[2 * hc + j * hc + k] * 0.9 + base[2 * hc + j * hc + k] - mx);
          for (int k = 0; k < hc; ++k) c[(size_t)j * hc + k] = c[(size_t)j * hc + k] / s + eps;
        }
        auto cols = [&] {
          for (int k = 0; k < hc; ++k) {
            double s = 0;
            for (int j = 0; j < hc; ++j) s += c[(size_t)j * hc + k];
            for (int j = 0; j < hc; ++j) c[(size_t)j * hc + k] /= s + eps;
          }
        };
        cols();
        for (int it = 0; it < iters - 1; ++it) {
          for (int j = 0; j < hc; ++j) {
            double s = 0;
            for (int k = 0; k < hc; ++k) s += c[(size_t)j * hc + k];
            for (int k = 0; k < hc; ++k) c[(size_t)j * hc + k] /= s + eps;
          }
          cols();
        }
        for (int i = 0; i < hc * hc; ++i)
          ASSERT_NEAR(comb[(size_t)r * hc * hc + i], c[(size_t)i], 1e-5) << "hc " << hc << " row " << r << " elem " << i;
      }
    }
  }
}

TEST(cuda_mhc, collapse_norm_and_expand_match_the_oracle) {
  CEDAR_REQUIRE_GPU();
  for (int hc : {1, 4, 6}) {
    for (int d : {64, 2048, 2050, 7168}) {
      for (int R : {1, 3}) {
        std::mt19937 g((unsigned)(hc * 7 + d + R));
        const auto X = randn(g, (size_t)R * hc * d, 1.0f), pre = randn(g, (size_t)R * hc, 0.5f),
                   w = randn(g, (size_t)d, 1.0f), y = randn(g, (size_t)R * d, 1.0f),
                   post = randn(g, (size_t)R * hc, 1.0f), comb = randn(g, (size_t)R * hc * hc, 0.5f);
        const float eps = 1e-6f;
        dev_array<float> dX(X), dpre(pre), dw(w), dx((size_t)R * d), dy(y), dpost(post), dcomb(comb);
        dx.poison();
        ASSERT_TRUE(cu::hc_collapse_norm(dX.p, dpre.p, dw.p, dx.p, R, hc, d, eps, nullptr).ok());
        ASSERT_TRUE(cu::hc_expand(dX.p, dy.p, dpost.p, dcomb.p, R, hc, d, nullptr).ok());
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const auto x = dx.download(), Xn = dX.download();
        for (int r = 0; r < R; ++r) {
          std::vector<double> v((size_t)d);
          double ss = 0;
          for (int i = 0; i < d; ++i) {
            for (int k = 0; k < hc; ++k) v[(size_t)i] += (double)pre[(size_t)r * hc + k] * X[((size_t)r * hc + k) * d + i];
            ss += v[(size_t)i] * v[(size_t)i];
          }
          const double inv = 1 / std::sqrt(ss / d + eps);
          for (int i = 0; i < d; ++i) {
            const double want = w[(size_t)i] * v[(size_t)i] * inv;
            ASSERT_NEAR(x[(size_t)r * d + i], want, 1e-5 * (std::fabs(want) + 1)) << "hc " << hc << " d " << d << " i " << i;
          }
          for (int k = 0; k < hc; ++k)
            for (int i = 0; i < d; ++i) {
              double want = (double)post[(size_t)r * hc + k] * y[(size_t)r * d + i];
              for (int j = 0; j < hc; ++j)
                want += (double)comb[((size_t)r * hc + j) * hc + k] * X[((size_t)r * hc + j) * d + i];
              ASSERT_NEAR(Xn[((size_t)r * hc + k) * d + i], want, 1e-5 * (std::fabs(want) + 1))
                  << "expand hc " << hc << " d " << d << " stream " << k << " i " << i;
            }
        }
      }
    }
  }
}

// Routing: the K largest sqrt(softplus(logit)) + bias, ties to the lower id, weights
// renormalised × scale; tied scores are planted (equal logits and biases on chosen ids).
TEST(cuda_moe, routing_matches_the_oracle_ties_to_the_lower_id) {
  CEDAR_REQUIRE_GPU();
  struct rc {
    int R, E, K;
    bool renorm;
  };
  for (const rc& c : {rc{1, 16, 2, true}, rc{5, 8, 1, true}, rc{3, 64, 6, true}, rc{2, 384, 8, false},
                      rc{4, 1500, 3, true}}) {
    std::mt19937 g((unsigned)(c.E * 13 + c.K));
    auto lg = randn(g, (size_t)c.R * c.E, 1.5f);
    auto bias = randn(g, (size_t)c.E, 0.1f);
    // ties: expert 2·i+1 gets expert 2·i's logit and bias in row 0 (the lower id must win)
    for (int i = 0; i + 1 < std::min(c.E, 8); i += 2) lg[(size_t)i + 1] = lg[(size_t)i], bias[(size_t)i + 1] = bias[(size_t)i];
    dev_array<float> dl(lg), db(bias), dwt((size_t)c.R * c.K);
    dev_array<int32_t> dsel((size_t)c.R * c.K);
    dwt.poison(), dsel.poison();
    cu::moe_route_params p;
    p.R = c.R, p.E = c.E, p.K = c.K, p.logits = dl.p, p.bias = db.p, p.renormalise = c.renorm, p.route_scale = 1.5f;
    p.sel = dsel.p, p.weight = dwt.p;
    ASSERT_TRUE(cu::moe_route(p, nullptr).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto sel = dsel.download();
    const auto wt = dwt.download();
    for (int r = 0; r < c.R; ++r) {
      std::vector<int> ord((size_t)c.E);
      std::vector<float> sc((size_t)c.E);
      for (int i = 0; i < c.E; ++i) {
        const float x = lg[(size_t)r * c.E + i];
        sc[(size_t)i] = std::sqrt(x > 20.0f ? x : std::log1p(std::exp(x))) + bias[(size_t)i];
        ord[(size_t)i] = i;
      }
      std::stable_sort(ord.begin(), ord.end(), [&](int a, int b) { return sc[(size_t)a] > sc[(size_t)b]; });
      double sum = 0;
      for (int k = 0; k < c.K; ++k) sum += sc[(size_t)ord[(size_t)k]] - bias[(size_t)ord[(size_t)k]];
      for (int k = 0; k < c.K; ++k) {
        const int e = ord[(size_t)k];
        ASSERT_EQ(sel[(size_t)r * c.K + k], e) << "E " << c.E << " row " << r << " slot " << k;
        const double s = sc[(size_t)e] - bias[(size_t)e];
        const double want = (c.renorm && c.K > 1 ? s / sum : s) * 1.5;
        EXPECT_NEAR(wt[(size_t)r * c.K + k], want, 1e-5 * (want + 1)) << "E " << c.E << " row " << r;
      }
    }
  }
}

TEST(cuda_moe, swiglu_and_combine_match_the_oracle) {
  CEDAR_REQUIRE_GPU();
  for (int F : {24, 768, 1000}) {
    const int n = 6, K = 3, R = n / K;
    std::mt19937 g((unsigned)F);
    const auto h = randn(g, (size_t)n * 2 * F, 3.0f), rw = randn(g, (size_t)n, 1.0f);
    dev_array<float> dh(h), drw(rw), da((size_t)n * F);
    for (float limit : {0.0f, 2.5f}) {
      da.poison();
      ASSERT_TRUE(cu::swiglu_rows(dh.p, n, F, limit, drw.p, da.p, nullptr).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto a = da.download();
      for (int r = 0; r < n; ++r)
        for (int i = 0; i < F; ++i) {
          double gt = h[(size_t)r * 2 * F + i], up = h[(size_t)r * 2 * F + F + i];
          if (limit > 0) up = std::clamp(up, (double)-limit, (double)limit), gt = std::min(gt, (double)limit);
          const double want = gt * sigmoid(gt) * up * rw[(size_t)r];
          ASSERT_NEAR(a[(size_t)r * F + i], want, 1e-5 * (std::fabs(want) + 1)) << "F " << F << " limit " << limit;
        }
    }
    // combine: y[r] += ye rows of r in ascending expert id (ids given out of order)
    const int d = F;
    const std::vector<int32_t> sel = {7, 2, 5, 0, 9, 3};
    const auto y0 = randn(g, (size_t)R * d, 1.0f), ye = randn(g, (size_t)n * d, 1.0f);
    dev_array<float> dy(y0), dye(ye);
    dev_array<int32_t> ds(sel);
    ASSERT_TRUE(cu::moe_combine(dy.p, dye.p, ds.p, R, K, d, nullptr).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto y = dy.download();
    for (int r = 0; r < R; ++r) {
      std::vector<int> slot = {0, 1, 2};
      std::sort(slot.begin(), slot.end(), [&](int a, int b) { return sel[(size_t)r * K + a] < sel[(size_t)r * K + b]; });
      for (int i = 0; i < d; ++i) {
        float want = y0[(size_t)r * d + i];  // the same fp32 additions in the same order
        for (int s : slot) want += ye[((size_t)r * K + s) * d + i];
        ASSERT_EQ(y[(size_t)r * d + i], want) << "row " << r << " i " << i;
      }
    }
  }
}

// The combine folded into the next expand (the decoder's default): hc_expand and
// hc_mix_collapse given the routed experts' rows (ye, sel, K) write the bits of moe_combine
// followed by the plain expand — streams, collapse and partials; K 1..3, ids out of order,
// float4 and odd widths. Then ye without its ids is refused, named.
TEST(cuda_moe, combine_folded_into_the_expand_gives_moe_combines_bits) {
  CEDAR_REQUIRE_GPU();
  auto same = [](const std::vector<float>& u, const std::vector<float>& v, const char* what) {
    ASSERT_EQ(u.size(), v.size());
    for (size_t i = 0; i < u.size(); ++i)
      ASSERT_EQ(std::memcmp(&u[i], &v[i], sizeof(float)), 0) << what << " differs at " << i << ": " << u[i] << " vs " << v[i];
  };
  for (int d : {256, 2048, 100}) {
    for (int K : {1, 2, 3}) {
      SCOPED_TRACE("d " + std::to_string(d) + " K " + std::to_string(K));
      const int R = 3, hc = 4, mix = (2 + hc) * hc;
      std::mt19937 g((unsigned)(d * 7 + K));
      std::vector<int32_t> sel((size_t)R * K);
      for (int r = 0; r < R; ++r)  // distinct ids per row, descending (the combine sorts them)
        for (int k = 0; k < K; ++k) sel[(size_t)r * K + k] = (int32_t)(10 + 3 * r + 2 * (K - k));
      const auto y0 = randn(g, (size_t)R * d, 1.0f), ye = randn(g, (size_t)R * K * d, 1.0f),
                 X0 = randn(g, (size_t)R * hc * d, 1.0f), post = randn(g, (size_t)R * hc, 1.0f),
                 comb = randn(g, (size_t)R * hc * hc, 0.5f), pre = randn(g, (size_t)R * hc, 0.5f),
                 fn = randn(g, (size_t)mix * hc * d, 0.05f);
      dev_array<float> dy(y0), dyc(y0), dye(ye), dpost(post), dcomb(comb), dpre(pre), dfn(fn);
      dev_array<int32_t> dsel(sel);
      ASSERT_TRUE(cu::moe_combine(dyc.p, dye.p, dsel.p, R, K, d, nullptr).ok());
      // hc_expand
      dev_array<float> sX(X0), fX(X0);
      ASSERT_TRUE(cu::hc_expand(sX.p, dyc.p, dpost.p, dcomb.p, R, hc, d, nullptr).ok());
      auto st = cu::hc_expand(fX.p, dy.p, dpost.p, dcomb.p, R, hc, d, nullptr, dye.p, dsel.p, K);
      ASSERT_TRUE(st.ok()) << st.err().message;
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      same(fX.download(), sX.download(), "hc_expand's streams");
      // hc_mix_collapse's expand
      dev_array<float> sX2(X0), fX2(X0), spart(cu::hc_mix_partial_floats(R, hc, d)),
          fpart(cu::hc_mix_partial_floats(R, hc, d)), sv((size_t)R * d), fv((size_t)R * d);
      sv.poison(), fv.poison();
      cu::hc_mix_params mp;
      mp.R = R, mp.hc = hc, mp.d = d, mp.fn = kc::qmatrix_f32(dfn.p, mix, (int64_t)hc * d), mp.pre = dpre.p;
      mp.post = dpost.p, mp.comb = dcomb.p;
      cu::hc_mix_params sm = mp, fm = mp;
      sm.X = sX2.p, sm.partial = spart.p, sm.v = sv.p, sm.y = dyc.p;
      fm.X = fX2.p, fm.partial = fpart.p, fm.v = fv.p, fm.y = dy.p, fm.ye = dye.p, fm.ye_sel = dsel.p, fm.ye_K = K;
      st = cu::hc_mix_collapse(sm, nullptr);
      ASSERT_TRUE(st.ok()) << st.err().message;
      st = cu::hc_mix_collapse(fm, nullptr);
      ASSERT_TRUE(st.ok()) << st.err().message;
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      same(fX2.download(), sX2.download(), "hc_mix_collapse's streams");
      same(fv.download(), sv.download(), "hc_mix_collapse's collapse");
      same(fpart.download(), spart.download(), "hc_mix_collapse's partials");
      // and the streams are the oracle's: X ← post · (y + Σ ye) + combᵀ X
      const auto Xn = fX.download();
      for (int r = 0; r < R; ++r)
        for (int k = 0; k < hc; ++k)
          for (int i = 0; i < d; ++i) {
            double yi = y0[(size_t)r * d + i];
            for (int s = 0; s < K; ++s) yi += ye[((size_t)r * K + s) * d + i];
            double t = (double)post[(size_t)r * hc + k] * yi;
            for (int j = 0; j < hc; ++j) t += (double)comb[((size_t)r * hc + j) * hc + k] * X0[((size_t)r * hc + j) * d + i];
            ASSERT_NEAR(Xn[((size_t)r * hc + k) * d + i], t, 1e-5 * (std::fabs(t) + 1)) << "row " << r << " stream " << k;
          }
    }
  }
  std::vector<float> host(64, 1.0f);
  dev_array<float> dd(host);
  auto st = cu::hc_expand(dd.p, dd.p, dd.p, dd.p, 1, 2, 8, nullptr, dd.p, nullptr, 2);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.err().message.find("ye without"), std::string::npos) << st.err().message;
  cu::hc_mix_params mp;
  mp.R = 1, mp.hc = 2, mp.d = 8, mp.X = dd.p, mp.pre = dd.p, mp.partial = dd.p, mp.v = dd.p;
  mp.fn = kc::qmatrix_f32(dd.p, 8, 16), mp.ye = dd.p, mp.ye_K = 1;
  st = cu::hc_mix_collapse(mp, nullptr);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.err().message.find("ye without"), std::string::npos) << st.err().message;
}

// One mHC site fused: hc_mix_collapse's partials (hc_fn · flat streams per 32-channel block,
// their sum of squares) reduced by hc_post into the mixes of the normalised streams, and the
// collapse with the previous weights — against the oracle: mixes = hc_fn · rmsnorm(X flat),
// then the same mix weights as the unfused hc_post (pre, post, Sinkhorn comb).
TEST(cuda_mhc, fused_site_partials_and_collapse_match_the_oracle) {
  CEDAR_REQUIRE_GPU();
  for (int hc : {4, 2, 6}) {
    for (int d : {64, 2048, 100}) {
      for (int variant = 0; variant < 3; ++variant) {
        const bool bf16 = variant == 1, expand = variant == 2;
        const int R = 2, mix = (2 + hc) * hc, iters = 20;
        const float eps = 1e-6f, neps = 1e-6f;
        std::mt19937 g((unsigned)(hc * 31 + d + variant));
        const auto X0 = randn(g, (size_t)R * hc * d, 1.0f), pre_prev = randn(g, (size_t)R * hc, 0.5f);
        // expand variant: the previous sub-layer's output y expanded into the streams first
        const auto ey = randn(g, (size_t)R * d, 1.0f), epost = randn(g, (size_t)R * hc, 1.0f),
                   ecomb = randn(g, (size_t)R * hc * hc, 0.5f);
        std::vector<float> X = X0;
        if (expand)
          for (int r = 0; r < R; ++r)
            for (int k = 0; k < hc; ++k)
              for (int i = 0; i < d; ++i) {
                double t = (double)epost[(size_t)r * hc + k] * ey[(size_t)r * d + i];
                for (int j = 0; j < hc; ++j)
                  t += (double)ecomb[((size_t)r * hc + j) * hc + k] * X0[((size_t)r * hc + j) * d + i];
                X[((size_t)r * hc + k) * d + i] = (float)t;
              }
        auto fnw = randn(g, (size_t)mix * hc * d, 0.05f);
        std::vector<uint16_t> fnb(fnw.size());
        if (bf16)
          for (size_t i = 0; i < fnw.size(); ++i) fnw[i] = kc::bf16_to_f32(fnb[i] = kc::f32_to_bf16(fnw[i]));
        const auto base = randn(g, (size_t)mix, 0.5f);
        const std::vector<float> scale = {0.7f, 1.3f, 0.9f};
        dev_array<float> dey(ey), depost(epost), decomb(ecomb);
        dev_array<float> dX(X0), dpp(pre_prev), dfn(fnw), db(base), ds(scale), dv((size_t)R * d),
            dpart(cu::hc_mix_partial_floats(R, hc, d)), dpre((size_t)R * hc), dpost((size_t)R * hc),
            dcomb((size_t)R * hc * hc);
        dev_array<uint16_t> dfnb(fnb);
        dv.poison(), dpre.poison(), dpost.poison(), dcomb.poison();
        cu::hc_mix_params mp;
        mp.R = R, mp.hc = hc, mp.d = d, mp.X = dX.p, mp.pre = dpp.p, mp.partial = dpart.p, mp.v = dv.p;
        mp.fn = bf16 ? kc::qmatrix_bf16(dfnb.p, mix, (int64_t)hc * d) : kc::qmatrix_f32(dfn.p, mix, (int64_t)hc * d);
        if (expand) mp.y = dey.p, mp.post = depost.p, mp.comb = decomb.p;
        auto st = cu::hc_mix_collapse(mp, nullptr);
        ASSERT_TRUE(st.ok()) << st.err().message;
        cu::hc_post_params p;
        p.R = R, p.hc = hc, p.sinkhorn_iters = iters, p.eps = eps, p.base = db.p, p.scale = ds.p;
        p.partial = dpart.p, p.nblk = cu::hc_mix_blocks(d), p.ncols = hc * d, p.norm_eps = neps;
        p.pre = dpre.p, p.post = dpost.p, p.comb = dcomb.p;
        dev_array<float> sxinv((size_t)R);
        p.x_inv = sxinv.p, p.x_cols = d, p.x_eps = neps;
        st = cu::hc_post(p, nullptr);
        ASSERT_TRUE(st.ok()) << st.err().message;
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        // the unfused hc_post on the oracle's mixes: the fused result must match it
        std::vector<float> mixes((size_t)R * mix);
        for (int r = 0; r < R; ++r) {
          double ss = 0;
          for (int i = 0; i < hc * d; ++i) ss += (double)X[(size_t)r * hc * d + i] * X[(size_t)r * hc * d + i];
          const double inv = 1 / std::sqrt(ss / (hc * d) + neps);
          for (int m = 0; m < mix; ++m) {
            double s = 0;
            for (int i = 0; i < hc * d; ++i) s += (double)fnw[(size_t)m * hc * d + i] * X[(size_t)r * hc * d + i] * inv;
            mixes[(size_t)r * mix + m] = (float)s;
          }
        }
        dev_array<float> dm(mixes), rpre((size_t)R * hc), rpost((size_t)R * hc), rcomb((size_t)R * hc * hc);
        cu::hc_post_params q = p;
        q.partial = nullptr, q.mixes = dm.p, q.pre = rpre.p, q.post = rpost.p, q.comb = rcomb.p;
        ASSERT_TRUE(cu::hc_post(q, nullptr).ok());
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        auto near = [&](const dev_array<float>& a, const dev_array<float>& b, const char* what) {
          const auto x = a.download(), y = b.download();
          for (size_t i = 0; i < x.size(); ++i)
            ASSERT_NEAR(x[i], y[i], 2e-4 * (std::fabs(y[i]) + 1)) << what << " hc " << hc << " d " << d << " i " << i;
        };
        near(dpre, rpre, "pre");
        near(dpost, rpost, "post");
        near(dcomb, rcomb, "comb");
        if (expand) {
          const auto Xn = dX.download();
          for (size_t i = 0; i < X.size(); ++i) ASSERT_NEAR(Xn[i], X[i], 1e-5 * (std::fabs(X[i]) + 1)) << "expanded X " << i;
        }
        const auto v = dv.download();
        for (int r = 0; r < R; ++r)
          for (int i = 0; i < d; ++i) {
            double want = 0;
            for (int k = 0; k < hc; ++k) want += (double)pre_prev[(size_t)r * hc + k] * X[((size_t)r * hc + k) * d + i];
            ASSERT_NEAR(v[(size_t)r * d + i], want, 1e-5 * (std::fabs(want) + 1)) << "collapse hc " << hc << " d " << d;
          }
        // another form's outputs against the two launches above: bit for bit, counters reset
        auto same_site = [&](const char* form, const dev_array<float>& fpre, const dev_array<float>& fpost,
                             const dev_array<float>& fcomb, const dev_array<float>& fxinv, const dev_array<float>& fv,
                             const dev_array<float>& fX, const dev_array<unsigned>& done) {
          const std::pair<const dev_array<float>*, const dev_array<float>*> pairs[] = {
              {&fpre, &dpre}, {&fpost, &dpost}, {&fcomb, &dcomb}, {&fxinv, &sxinv}, {&fv, &dv}, {&fX, &dX}};
          const char* names[] = {"pre", "post", "comb", "x_inv", "collapse", "streams"};
          for (int j = 0; j < 6; ++j) {
            const auto x = pairs[j].first->download(), y = pairs[j].second->download();
            ASSERT_EQ(x.size(), y.size());
            for (size_t i = 0; i < x.size(); ++i)
              ASSERT_EQ(x[i], y[i]) << form << " " << names[j] << " hc " << hc << " d " << d << " variant " << variant
                                    << " i " << i;
          }
          for (unsigned c : done.download()) ASSERT_EQ(c, 0u) << form << ": row counter not reset";
        };
        // hc_post fused into the launch (the last block of each row reduces), its outputs in the
        // buffers the expand reads (as the decoder runs it): the same bits as the two launches;
        // launched twice (the row counters are left at zero for the next site)
        // (each form also through the generic kernel: hc = 4 launches the form compiled for the
        // format and tail unless generic_mhc is set — the same bits either way)
        for (int rep = 0; rep < (expand ? 2 : 4); ++rep) {
          dev_array<float> fX(X0), fv((size_t)R * d), fpart(cu::hc_mix_partial_floats(R, hc, d)), fpre((size_t)R * hc),
              fpost(epost), fcomb(ecomb), fxinv((size_t)R);
          dev_array<unsigned> done(std::vector<unsigned>((size_t)R, 0u));
          cu::hc_mix_params fp = mp;
          const bool generic = rep % 2 == 1;
          cu::generic_kernels_scope scope(generic ? cu::generic_mhc : 0u);
          fp.X = fX.p, fp.partial = fpart.p, fp.v = fv.p;
          if (expand) fp.post = fpost.p, fp.comb = fcomb.p;
          fp.site = p;
          fp.site.partial = nullptr, fp.site.pre = fpre.p, fp.site.post = fpost.p, fp.site.comb = fcomb.p;
          fp.site.x_inv = fxinv.p;
          fp.done = done.p;
          for (int twice = 0; twice <= rep / 2; ++twice) {
            st = cu::hc_mix_collapse(fp, nullptr);
            ASSERT_TRUE(st.ok()) << st.err().message;
          }
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          same_site(generic ? "fused (generic kernel)" : "fused", fpre, fpost, fcomb, fxinv, fv, fX, done);
        }
        // the plain form (no tail) through the generic kernel: the partials and the collapse of
        // the first launch above, bit for bit
        {
          dev_array<float> gX(X0), gv((size_t)R * d), gpart(cu::hc_mix_partial_floats(R, hc, d));
          gv.poison(), gpart.poison();
          cu::hc_mix_params gp = mp;
          gp.X = gX.p, gp.partial = gpart.p, gp.v = gv.p;
          {
            cu::generic_kernels_scope scope(cu::generic_mhc);
            st = cu::hc_mix_collapse(gp, nullptr);
          }
          ASSERT_TRUE(st.ok()) << st.err().message;
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          const auto a = gv.download(), b = dv.download(), pa = gpart.download(), pb = dpart.download(),
                     xa = gX.download(), xb = dX.download();
          ASSERT_EQ(a, b) << "generic kernel's collapse, hc " << hc << " d " << d << " variant " << variant;
          ASSERT_EQ(pa, pb) << "generic kernel's partials, hc " << hc << " d " << d << " variant " << variant;
          ASSERT_EQ(xa, xb) << "generic kernel's streams, hc " << hc << " d " << d << " variant " << variant;
        }
        // x_inv alone in the launch (its last block), the mixes from a separate hc_post on the
        // partials on a second stream after an event (as the decoder runs it): the same bits
        for (bool generic : {false, true}) {
          dev_array<float> fX(X0), fv((size_t)R * d), fpart(cu::hc_mix_partial_floats(R, hc, d)), fpre((size_t)R * hc),
              fpost(epost), fcomb(ecomb), fxinv((size_t)R);
          fpre.poison(), fxinv.poison();
          dev_array<unsigned> done(std::vector<unsigned>((size_t)R, 0u));
          cu::hc_mix_params fp = mp;
          cu::generic_kernels_scope scope(generic ? cu::generic_mhc : 0u);
          fp.X = fX.p, fp.partial = fpart.p, fp.v = fv.p;
          if (expand) fp.post = fpost.p, fp.comb = fcomb.p;
          fp.site = p;
          fp.site.partial = nullptr, fp.site.x_inv = fxinv.p;
          fp.site.pre = fp.site.post = fp.site.comb = nullptr;  // not needed: the launch writes no mixes
          fp.done = done.p, fp.x_inv_only = true;
          cudaStream_t side = nullptr;
          cudaEvent_t ev = nullptr;
          ASSERT_EQ(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), cudaSuccess);
          ASSERT_EQ(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), cudaSuccess);
          st = cu::hc_mix_collapse(fp, nullptr);
          ASSERT_TRUE(st.ok()) << st.err().message;
          ASSERT_EQ(cudaEventRecord(ev, nullptr), cudaSuccess);
          ASSERT_EQ(cudaStreamWaitEvent(side, ev, 0), cudaSuccess);
          cu::hc_post_params sp = p;
          sp.partial = fpart.p, sp.pre = fpre.p, sp.post = fpost.p, sp.comb = fcomb.p, sp.x_inv = nullptr;
          st = cu::hc_post(sp, side);
          ASSERT_TRUE(st.ok()) << st.err().message;
          ASSERT_EQ(cudaStreamSynchronize(side), cudaSuccess);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          cudaEventDestroy(ev);
          cudaStreamDestroy(side);
          same_site(generic ? "x_inv_only (generic kernel)" : "x_inv_only", fpre, fpost, fcomb, fxinv, fv, fX, done);
          // without x_inv the launch refuses, naming what is missing
          fp.site.x_inv = nullptr;
          st = cu::hc_mix_collapse(fp, nullptr);
          ASSERT_FALSE(st.ok());
          EXPECT_NE(st.err().message.find("x_inv_only"), std::string::npos) << st.err().message;
        }
      }
    }
  }
}
