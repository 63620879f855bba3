// The CUDA ops (kernels/cuda/) against CPU references built from kernels/cpu (the codecs the
// CPU forward pass uses), over grids of shapes with fresh random inputs, outputs poisoned with
// NaN before each launch, and explicit tolerances. Needs a GPU: run by scripts/cuda-tests.sh on
// the GPU machine (CI builds this program but has no GPU to run it; it is registered in ctest
// only with -DCEDAR_CUDA_TESTS=ON).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/quant.hpp"
#include "kernels/cuda/device_probe.cuh"
#include "kernels/cuda/gather.cuh"
#include "kernels/cuda/generic_kernels.hpp"
#include "kernels/cuda/indexer.cuh"
#include "kernels/cuda/kv_pack.cuh"
#include "kernels/cuda/sparse_attention.cuh"
#include "tests/cuda/cuda_test_util.hpp"

namespace kc = cedar::kernels;
namespace cu = cedar::kernels::cuda;
using cedar::test::dev_array;
using cedar::test::randn;

namespace {

// Packs `rows` random rows of n channels with `pack`; returns the packed bytes.
template <class Pack>
std::vector<uint8_t> packed_rows(std::mt19937& g, int rows, int n, size_t bytes, float sd, Pack pack) {
  std::vector<uint8_t> out((size_t)rows * bytes);
  for (int i = 0; i < rows; ++i) {
    auto x = randn(g, (size_t)n, sd);
    pack(x.data(), n, out.data() + (size_t)i * bytes);
  }
  return out;
}

}  // namespace

// ---- sparse attention ------------------------------------------------------------------------

struct attn_case {
  int R, H, D, W, E, K;
};

class cuda_sparse_attention : public ::testing::TestWithParam<attn_case> {};

// One shape against the double-precision reference with the kernel choice `mma_mode`
// (set_sparse_attention_mma: 0 the fp32 kernel, 2 the tensor-core kernel where the head_dim
// allows it, splits included; 3 the cluster kernel wherever it applies; 1 the built-in rule).
static void check_attention_case(const attn_case& c, int mma_mode) {
  cu::set_sparse_attention_mma(mma_mode);
  struct restore {
    ~restore() { cu::set_sparse_attention_mma(-1); }
  } restore_mode;
  std::printf("[mma mode %d] ", mma_mode);
  std::mt19937 g(1000u + (unsigned)(c.R * 7 + c.H * 13 + c.D + c.W + c.E + c.K));
  const size_t wb = kc::fp8_swa_bytes(c.D), mb = kc::fp4_kv_bytes(c.D);
  // one window ring and one main array per row (rows of different sequences)
  std::vector<std::vector<uint8_t>> rings, mains;
  std::vector<int> wstart, wn, nsel;
  std::vector<int32_t> sel((size_t)c.R * std::max(1, c.K), 0);
  std::uniform_int_distribution<int> u(0, 1 << 30);
  for (int r = 0; r < c.R; ++r) {
    rings.push_back(packed_rows(g, c.W, c.D, wb, 1.0f, kc::fp8_swa_pack));
    mains.push_back(packed_rows(g, std::max(1, c.E), c.D, mb, 1.0f, kc::fp4_kv_pack));
    wstart.push_back(u(g) % c.W);
    wn.push_back(1 + u(g) % c.W);  // 1..W keys, wrapping around the ring
    const int ns = c.K == 0 ? 0 : (r % 3 == 0 ? c.K : u(g) % (std::min(c.K, c.E) + 1));
    nsel.push_back(std::min(ns, c.E));
    std::vector<int32_t> ids((size_t)c.E);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), g);
    std::sort(ids.begin(), ids.begin() + nsel.back());
    for (int j = 0; j < nsel.back(); ++j) sel[(size_t)r * std::max(1, c.K) + j] = ids[(size_t)j];
  }
  auto q = randn(g, (size_t)c.R * c.H * c.D, 1.0f);
  auto sink = randn(g, (size_t)c.H, 1.0f);
  const float scale = 1.0f / std::sqrt((float)c.D);

  // CPU reference in double: softmax over [window, selected] with the sink in the denominator
  std::vector<float> ref((size_t)c.R * c.H * c.D);
  std::vector<float> key((size_t)c.D);
  for (int r = 0; r < c.R; ++r) {
    std::vector<std::vector<float>> keys;
    for (int j = 0; j < wn[(size_t)r]; ++j) {
      kc::fp8_swa_unpack(rings[(size_t)r].data() + (size_t)((wstart[(size_t)r] + j) % c.W) * wb, c.D, key.data());
      keys.push_back(key);
    }
    for (int j = 0; j < nsel[(size_t)r]; ++j) {
      kc::fp4_kv_unpack(mains[(size_t)r].data() + (size_t)sel[(size_t)r * std::max(1, c.K) + j] * mb, c.D, key.data());
      keys.push_back(key);
    }
    for (int h = 0; h < c.H; ++h) {
      const float* qh = q.data() + ((size_t)r * c.H + h) * c.D;
      std::vector<double> lg(keys.size());
      double mx = sink[(size_t)h];
      for (size_t j = 0; j < keys.size(); ++j) {
        double s = 0;
        for (int d = 0; d < c.D; ++d) s += (double)qh[d] * keys[j][(size_t)d];
        lg[j] = s * scale;
        mx = std::max(mx, lg[j]);
      }
      double den = std::exp(sink[(size_t)h] - mx);
      for (auto& v : lg) den += (v = std::exp(v - mx));
      for (int d = 0; d < c.D; ++d) {
        double o = 0;
        for (size_t j = 0; j < keys.size(); ++j) o += lg[j] * keys[j][(size_t)d];
        ref[((size_t)r * c.H + h) * c.D + d] = (float)(o / den);
      }
    }
  }

  // device
  std::vector<std::unique_ptr<dev_array<uint8_t>>> dring, dmain;
  std::vector<const uint8_t*> ring_ptr, main_ptr;
  for (int r = 0; r < c.R; ++r) {
    dring.push_back(std::make_unique<dev_array<uint8_t>>(rings[(size_t)r]));
    dmain.push_back(std::make_unique<dev_array<uint8_t>>(mains[(size_t)r]));
    ring_ptr.push_back(dring.back()->p);
    main_ptr.push_back(dmain.back()->p);
  }
  dev_array<const uint8_t*> d_ring_ptr(ring_ptr), d_main_ptr(main_ptr);
  dev_array<float> dq(q), dsink(sink), dout(ref.size());
  dev_array<int> dws(wstart), dwn(wn), dns(nsel);
  dev_array<int32_t> dsel(sel);
  dout.poison();
  cu::sparse_attention_params p;
  p.R = c.R; p.H = c.H; p.D = c.D; p.scale = scale;
  p.q = dq.p; p.sink = dsink.p;
  p.wkeys = d_ring_ptr.p; p.wstart = dws.p; p.wn = dwn.p; p.wcap = c.W;
  if (c.K > 0) { p.main = d_main_ptr.p; p.sel = dsel.p; p.nsel = dns.p; p.K = c.K; }
  p.out = dout.p;
  p.max_keys = c.W + c.K;
  // the three paths: every key range in one block; then (when these shapes split) the keys cut
  // over several blocks and folded by the combine kernel; then folded by the last block of each
  // (row, head group), counted in `done` — the same bits as the combine kernel, and the
  // counters left zero, twice in a row (the second launch reuses them)
  const size_t wsf = cu::sparse_attention_workspace_floats(p);
  dev_array<float> dwork(std::max<size_t>(1, wsf));
  dev_array<unsigned> ddone(std::vector<unsigned>((size_t)c.R * c.H, 0u));
  std::vector<float> two_kernels;
  double worst = 0;
  for (int pass = 0; pass < (wsf > 0 ? 4 : 1); ++pass) {
    if (pass == 1) {
      p.workspace = dwork.p;
      p.workspace_floats = wsf;
      dwork.poison();
    }
    if (pass >= 2) p.done = ddone.p;
    dout.poison();
    auto st = cu::sparse_attention(p, nullptr);
    ASSERT_TRUE(st.ok()) << st.err().message;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    auto got = dout.download();
    if (pass == 1) two_kernels = got;
    if (pass >= 2) {
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_EQ(got[i], two_kernels[i]) << "fold in the attention kernel, launch " << pass - 1 << ", output " << i;
      for (unsigned d : ddone.download()) ASSERT_EQ(d, 0u) << "a done counter was not left zero";
    }
    for (size_t i = 0; i < ref.size(); ++i) {
      ASSERT_TRUE(std::isfinite(got[i])) << "output " << i << " not written (pass " << pass << ")";
      const double err = std::fabs((double)got[i] - ref[i]) / (1e-3 + std::fabs((double)ref[i]));
      worst = std::max(worst, err);
      ASSERT_LE(std::fabs((double)got[i] - ref[i]), 2e-5 + 2e-4 * std::fabs((double)ref[i]))
          << "pass " << pass << " row " << i / ((size_t)c.H * c.D) << " head " << (i / c.D) % c.H << " channel "
          << i % c.D;
    }
  }
  // fused RoPE (q rotated as it is read, the output rotated back as it is written): the same
  // bits as rope_rows before and after the attention, in both paths
  {
    const int np = c.D / 8;
    std::uniform_real_distribution<float> ang(-3.14159f, 3.14159f);
    std::vector<float> cs((size_t)c.R * np), sn((size_t)c.R * np);
    for (size_t i = 0; i < cs.size(); ++i) {
      const float a = ang(g);
      cs[i] = std::cos(a), sn[i] = std::sin(a);
    }
    dev_array<float> dcos(cs), dsin(sn), dq2(q), dref(ref.size());
    for (int pass = 0; pass < (wsf > 0 ? 2 : 1); ++pass) {
      p.workspace = pass ? dwork.p : nullptr;
      p.workspace_floats = pass ? wsf : 0;
      p.done = pass ? ddone.p : nullptr;
      dq2.upload(q);
      ASSERT_TRUE(cu::rope_rows(dq2.p, c.R, c.H, c.D, np, dcos.p, dsin.p, false, nullptr).ok());
      p.q = dq2.p, p.out = dref.p, p.rope_cos = nullptr, p.rope_sin = nullptr, p.rope_np = 0;
      ASSERT_TRUE(cu::sparse_attention(p, nullptr).ok());
      ASSERT_TRUE(cu::rope_rows(dref.p, c.R, c.H, c.D, np, dcos.p, dsin.p, true, nullptr).ok());
      dout.poison();
      p.q = dq.p, p.out = dout.p, p.rope_cos = dcos.p, p.rope_sin = dsin.p, p.rope_np = np;
      ASSERT_TRUE(cu::sparse_attention(p, nullptr).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto want = dref.download(), got = dout.download();
      for (size_t i = 0; i < want.size(); ++i)
        ASSERT_EQ(got[i], want[i]) << "fused RoPE, pass " << pass << ", output " << i;
    }
    p.rope_cos = nullptr, p.rope_sin = nullptr, p.rope_np = 0, p.q = dq.p, p.out = dout.p, p.done = nullptr;
  }
  std::printf("(split path: %s) ", wsf > 0 ? "tested" : "not used at these shapes");
  std::printf("R=%d H=%d D=%d W=%d E=%d K=%d: worst scaled error %.2e\n", c.R, c.H, c.D, c.W, c.E, c.K, worst);
}

TEST_P(cuda_sparse_attention, matches_the_cpu_reference) {
  CEDAR_REQUIRE_GPU();
  for (int mode : {0, 2, 3, 1}) {
    check_attention_case(GetParam(), mode);
    if (HasFatalFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(
    shapes, cuda_sparse_attention,
    ::testing::Values(attn_case{1, 4, 64, 64, 0, 0},      // window only (SWA layer)
                      attn_case{3, 4, 64, 64, 200, 64},   // the default model's shape
                      attn_case{5, 1, 32, 8, 40, 16},
                      attn_case{2, 16, 128, 128, 1000, 128},
                      attn_case{2, 64, 512, 128, 3000, 512},  // official head_dim, window, top-k
                      attn_case{4, 128, 512, 128, 600, 512},
                      attn_case{3, 16, 256, 128, 1500, 512},  // the 1.2 B benchmark config
                      // batch 1 (the built-in rule's cluster kernel): the 1.2 B config, the
                      // default model's shape, a head_dim of 96 (no cluster kernel: fp32)
                      attn_case{1, 16, 256, 128, 1500, 512},
                      attn_case{1, 4, 64, 64, 200, 64},
                      attn_case{1, 8, 96, 16, 100, 24},
                      attn_case{2, 24, 128, 100, 300, 77},    // a partial 16-head group, odd tiles
                      // rows enough for the built-in rule's tensor-core kernel without splits
                      attn_case{140, 16, 128, 32, 200, 64}));

TEST(cuda_sparse_attention_params, bad_parameters_are_named) {
  cu::sparse_attention_params p;
  p.R = 1; p.H = 1; p.D = 48;
  auto st = cu::sparse_attention(p, nullptr);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.err().message.find("head_dim 48"), std::string::npos) << st.err().message;
}

// ---- indexer ---------------------------------------------------------------------------------

struct index_case {
  int R, E, Hi, Di, K, block, topk_blocks;
};

class cuda_indexer : public ::testing::TestWithParam<index_case> {};

// CPU rule (model/forward.cpp select_topk): the K largest finite scores, ties to the lower id,
// returned in ascending id order.
static std::vector<int32_t> cpu_topk(const float* s, int E, int K) {
  std::vector<int32_t> ord;
  for (int i = 0; i < E; ++i)
    if (s[i] > -std::numeric_limits<float>::infinity()) ord.push_back(i);
  std::sort(ord.begin(), ord.end(), [&](int32_t a, int32_t b) { return s[a] > s[b] || (s[a] == s[b] && a < b); });
  if ((int)ord.size() > K) ord.resize((size_t)K);
  std::sort(ord.begin(), ord.end());
  return ord;
}

TEST_P(cuda_indexer, scores_candidate_pool_and_topk_match_the_cpu_reference) {
  CEDAR_REQUIRE_GPU();
  const index_case c = GetParam();
  std::mt19937 g(77u + (unsigned)(c.R + c.E + c.Hi + c.Di + c.K));
  const size_t kb = kc::fp4_index_bytes(c.Di);
  std::vector<std::vector<uint8_t>> keys;
  std::vector<int> vis;
  std::uniform_int_distribution<int> u(0, 1 << 30);
  for (int r = 0; r < c.R; ++r) {
    keys.push_back(packed_rows(g, c.E, c.Di, kb, 1.0f, kc::fp4_index_pack));
    vis.push_back(r == 0 ? c.E : u(g) % (c.E + 1));
  }
  auto q = randn(g, (size_t)c.R * c.Hi * c.Di, 1.0f);
  for (int r = 0; r < c.R * c.Hi; ++r) kc::fp4_index_fake_quant(q.data() + (size_t)r * c.Di, c.Di);
  auto w = randn(g, (size_t)c.R * c.Hi, 0.5f);
  const float sscale = 1.0f / std::sqrt((float)c.Di);
  const int nb = (c.E + c.block - 1) / c.block;

  // CPU reference: scores, candidate blocks (block max, newest block forced), restricted scores
  std::vector<float> ref((size_t)c.R * c.E), restricted((size_t)c.R * c.E);
  std::vector<uint8_t> allowed((size_t)c.R * nb, 0);
  std::vector<float> k((size_t)c.Di);
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int r = 0; r < c.R; ++r) {
    for (int t = 0; t < c.E; ++t) {
      float acc = ninf;
      if (t < vis[(size_t)r]) {
        kc::fp4_index_unpack(keys[(size_t)r].data() + (size_t)t * kb, c.Di, k.data());
        acc = 0.0f;
        for (int h = 0; h < c.Hi; ++h) {
          double s = 0;
          for (int d = 0; d < c.Di; ++d) s += (double)q[((size_t)r * c.Hi + h) * c.Di + d] * k[(size_t)d];
          acc += std::max((float)s, 0.0f) * sscale * w[(size_t)r * c.Hi + h];
        }
      }
      ref[(size_t)r * c.E + t] = acc;
    }
    std::vector<float> bs((size_t)nb, ninf);
    for (int t = 0; t < c.E; ++t) bs[(size_t)(t / c.block)] = std::max(bs[(size_t)(t / c.block)], ref[(size_t)r * c.E + t]);
    if (vis[(size_t)r] > 0) bs[(size_t)((vis[(size_t)r] - 1) / c.block)] = std::numeric_limits<float>::infinity();
    for (int b : cpu_topk(bs.data(), nb, c.topk_blocks)) allowed[(size_t)r * nb + b] = 1;
    for (int t = 0; t < c.E; ++t)
      restricted[(size_t)r * c.E + t] = allowed[(size_t)r * nb + t / c.block] ? ref[(size_t)r * c.E + t] : ninf;
  }

  std::vector<std::unique_ptr<dev_array<uint8_t>>> dkeys;
  std::vector<const uint8_t*> kp;
  for (auto& kr : keys) {
    dkeys.push_back(std::make_unique<dev_array<uint8_t>>(kr));
    kp.push_back(dkeys.back()->p);
  }
  dev_array<const uint8_t*> dkp(kp);
  dev_array<float> dq(q), dw(w), dscore(ref.size()), dbs((size_t)c.R * nb);
  dev_array<int> dvis(vis), dn((size_t)c.R), dbn((size_t)c.R);
  dev_array<int32_t> dids((size_t)c.R * c.K), dbids((size_t)c.R * c.topk_blocks);
  dev_array<uint8_t> dallowed((size_t)c.R * nb);
  dscore.poison();
  cu::index_scores_params p;
  p.R = c.R; p.E = c.E; p.Hi = c.Hi; p.Di = c.Di; p.sscale = sscale;
  p.q = dq.p; p.w = dw.p; p.keys = dkp.p; p.vis = dvis.p; p.score = dscore.p;
  auto st = cu::index_scores(p, nullptr);
  ASSERT_TRUE(st.ok()) << st.err().message;
  auto got = dscore.download();
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isinf(ref[i])) {
      ASSERT_TRUE(std::isinf(got[i]) && got[i] < 0) << "entry " << i << " should be -inf";
      continue;
    }
    ASSERT_NEAR(got[i], ref[i], 1e-4 + 1e-4 * std::fabs(ref[i])) << "row " << i / c.E << " entry " << i % c.E;
  }
  // candidate pool: block max + forced newest block, top blocks, mask
  dbs.poison();
  ASSERT_TRUE(cu::block_max(dscore.p, dvis.p, c.R, c.E, c.block, nb, dbs.p, nullptr).ok());
  ASSERT_TRUE(cu::topk(dbs.p, c.R, nb, c.topk_blocks, dbids.p, dbn.p, nullptr).ok());
  ASSERT_TRUE(cu::ids_to_mask(dbids.p, dbn.p, c.R, c.topk_blocks, nb, dallowed.p, nullptr).ok());
  // (compare on the GPU's own scores: the pool is a discrete choice, and near-equal block maxima
  // may order differently between the two float paths; the scores were checked above)
  auto gs = got;
  auto gallowed = dallowed.download();
  for (int r = 0; r < c.R; ++r) {
    std::vector<float> bs((size_t)nb, ninf);
    for (int t = 0; t < c.E; ++t) bs[(size_t)(t / c.block)] = std::max(bs[(size_t)(t / c.block)], gs[(size_t)r * c.E + t]);
    if (vis[(size_t)r] > 0) bs[(size_t)((vis[(size_t)r] - 1) / c.block)] = std::numeric_limits<float>::infinity();
    std::vector<uint8_t> want((size_t)nb, 0);
    for (int b : cpu_topk(bs.data(), nb, c.topk_blocks)) want[(size_t)b] = 1;
    for (int b = 0; b < nb; ++b) ASSERT_EQ(gallowed[(size_t)r * nb + b], want[(size_t)b]) << "row " << r << " block " << b;
  }
  // restricted scores + top-k
  p.allowed = dallowed.p; p.block = c.block; p.nb = nb;
  dscore.poison();
  ASSERT_TRUE(cu::index_scores(p, nullptr).ok());
  dids.poison();
  ASSERT_TRUE(cu::topk(dscore.p, c.R, c.E, c.K, dids.p, dn.p, nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  auto rs = dscore.download();
  auto ids = dids.download();
  auto n = dn.download();
  for (int r = 0; r < c.R; ++r) {
    auto want = cpu_topk(rs.data() + (size_t)r * c.E, c.E, c.K);  // on the GPU's scores: exact rule
    ASSERT_EQ(n[(size_t)r], (int)want.size()) << "row " << r;
    for (size_t j = 0; j < want.size(); ++j) ASSERT_EQ(ids[(size_t)r * c.K + j], want[j]) << "row " << r << " rank " << j;
  }
}

INSTANTIATE_TEST_SUITE_P(shapes, cuda_indexer,
                         ::testing::Values(index_case{3, 200, 4, 32, 64, 16, 8},    // the default model
                                           index_case{2, 50, 2, 32, 64, 4, 2},      // fewer entries than K
                                           index_case{4, 5000, 8, 64, 256, 64, 16},
                                           index_case{2, 65536, 64, 128, 512, 512, 64}));  // official sizes

// cu::topk over the R rows of s (E scores each) against the CPU rule, id for id; n gets the
// counts the kernel wrote.
static void check_topk_rows(const std::vector<float>& s, int R, int E, int K, std::vector<int>& n) {
  dev_array<float> ds(s);
  dev_array<int32_t> dids((size_t)R * K);
  dev_array<int> dn((size_t)R);
  dids.poison();
  ASSERT_TRUE(cu::topk(ds.p, R, E, K, dids.p, dn.p, nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  auto ids = dids.download();
  n = dn.download();
  for (int r = 0; r < R; ++r) {
    auto want = cpu_topk(s.data() + (size_t)r * E, E, K);
    ASSERT_EQ(n[(size_t)r], (int)want.size()) << "E " << E << " row " << r;
    for (size_t j = 0; j < want.size(); ++j)
      ASSERT_EQ(ids[(size_t)r * K + j], want[j]) << "E " << E << " row " << r << " rank " << j;
  }
}

TEST(cuda_topk, ties_go_to_the_lower_id_and_ids_come_back_ascending) {
  CEDAR_REQUIRE_GPU();
  // many exact ties, ±0, -inf holes, +inf: the radix select must match the CPU rule exactly;
  // row lengths that take each launch form (ids per thread 1..32 in registers, float4 loads
  // or scalar ones, and the global-memory form past 16384), one block per row and a cluster of
  // 8 blocks per row (rows of more than 2048 ids: 2 to 32 ids per thread, up to 65536 ids)
  for (const int cluster : {1, 0})
  for (const int E : {300, 2048, 4099, 8192, 16384, 20000, 65536}) {
  cu::set_topk_cluster(cluster);
  const int R = 6, K = 300;
  std::mt19937 g(5u + (unsigned)E);
  std::uniform_int_distribution<int> u(-3, 3);
  std::vector<float> s((size_t)R * E);
  for (size_t i = 0; i < s.size(); ++i) s[i] = 0.5f * (float)u(g);
  for (size_t i = 0; i < s.size(); i += 7) s[i] = -std::numeric_limits<float>::infinity();
  for (size_t i = 3; i < s.size(); i += 11) s[i] = -0.0f;
  s[17] = std::numeric_limits<float>::infinity();
  for (int t = 0; t < E; ++t) s[(size_t)E + t] = t < 100 ? 1.0f : -std::numeric_limits<float>::infinity();  // < K finite
  std::vector<int> n;
  check_topk_rows(s, R, E, K, n);
  if (HasFatalFailure()) break;
  EXPECT_EQ(n[1], 100);
  }
  cu::set_topk_cluster(-1);
}

TEST(cuda_topk, early_ends_take_the_same_ids_as_the_full_select) {
  CEDAR_REQUIRE_GPU();
  // rows built so that the radix select may stop before its last pass: exactly K finite keys
  // (every one taken), no finite key, K keys in a first-pass bin of their own above the rest
  // (the bin taken whole), the K-th key alone in a later-pass bin, and K + 1 finite keys (a
  // full select); each against the CPU rule, one block per row and a cluster per row
  const int K = 64;
  const float ninf = -std::numeric_limits<float>::infinity();
  for (const int cluster : {0, 1})
  for (const int E : {100, 1000, 5000, 20000}) {
    cu::set_topk_cluster(cluster);
    const int R = 5;
    std::mt19937 g(11u + (unsigned)E);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> s((size_t)R * E, ninf);
    for (int t = 0; t < K; ++t) s[(size_t)(t * 13) % (size_t)E] = nd(g);            // row 0: K finite
    // row 1: all -inf
    for (int t = 0; t < E; ++t) s[(size_t)2 * E + t] = (t % 97 < 1 && t / 97 < K) ? 1.0e20f + (float)t : nd(g);
    for (int t = 0; t < E; ++t) s[(size_t)3 * E + t] = 1.0f + 1e-3f * (float)(t % 512);  // ties and close values
    for (int t = 0; t < E && t <= K; ++t) s[(size_t)4 * E + (size_t)(E - 1 - t * (E / (K + 1)))] = nd(g);  // K + 1 finite
    std::vector<int> n;
    check_topk_rows(s, R, E, K, n);
    if (HasFatalFailure()) break;
    EXPECT_EQ(n[1], 0);
    EXPECT_EQ(n[0], std::min(K, E));
  }
  cu::set_topk_cluster(-1);
}

// l2_prefetch_spans: ranges of any alignment and length (shorter than 16 bytes, across the 64 KB
// chunks, up to an allocation's unaligned end) are asked into L2 without a fault
// (compute-sanitizer memcheck runs this test), and the bytes stay as they were; bad parameters
// are named.
TEST(cuda_l2_prefetch, spans_of_any_alignment_leave_the_bytes_unchanged) {
  CEDAR_REQUIRE_GPU();
  std::mt19937 g(77u);
  std::vector<uint8_t> host((size_t)(3 << 20) + 37);
  for (auto& b : host) b = (uint8_t)g();
  dev_array<uint8_t> a(host), small(std::vector<uint8_t>(9, 7));
  for (int pass = 0; pass < 2; ++pass) {  // (the second: lines already in L2)
    cu::l2_prefetch_params p;
    ASSERT_TRUE(p.add(a.p, host.size()));                 // the whole allocation, unaligned end
    ASSERT_TRUE(p.add(a.p + 5, 11));                      // inside one 16-byte unit: nothing to ask
    ASSERT_TRUE(p.add(a.p + 1000, (size_t)(1 << 20) + 3));  // unaligned both ends, many chunks
    ASSERT_TRUE(p.add(small.p, 9));
    ASSERT_TRUE(p.add(nullptr, 0));                       // empty: skipped
    EXPECT_EQ(p.n, 4);
    const auto st = cu::l2_prefetch_spans(p, nullptr);
    ASSERT_TRUE(st.ok()) << st.err().message;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  EXPECT_EQ(a.download(), host);
  cu::l2_prefetch_params full;
  for (int i = 0; i < cu::k_l2_spans_max; ++i) ASSERT_TRUE(full.add(a.p + i, 64));
  EXPECT_FALSE(full.add(a.p, 64));  // full: refused, the count unchanged
  EXPECT_EQ(full.n, cu::k_l2_spans_max);
  EXPECT_TRUE(cu::l2_prefetch_spans(full, nullptr).ok());
  cu::l2_prefetch_params bad;
  bad.n = 1, bad.bytes[0] = 64;
  auto st = cu::l2_prefetch_spans(bad, nullptr);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.err().message.find("null pointer"), std::string::npos) << st.err().message;
  bad.n = cu::k_l2_spans_max + 1;
  st = cu::l2_prefetch_spans(bad, nullptr);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.err().message.find("spans"), std::string::npos) << st.err().message;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// The embedding and Engram gathers (embed_rows, table_rows) copy their table rows exactly —
// bf16 and f32 tables, the forms compiled for the format and the generic one (generic_kernels.hpp)
// alike — and the copies of a row all hold it.
TEST(cuda_gather, table_rows_come_back_exactly_in_every_form) {
  CEDAR_REQUIRE_GPU();
  std::mt19937 g(303u);
  const int rows = 50, cols = 300, R = 4, copies = 3, n_layers = 2, layer = 1, n_cols = 3;
  const auto vals = randn(g, (size_t)rows * cols, 1.0f);
  std::vector<uint16_t> bits(vals.size());
  std::vector<float> rounded(vals.size());
  for (size_t i = 0; i < vals.size(); ++i) rounded[i] = kc::bf16_to_f32(bits[i] = kc::f32_to_bf16(vals[i]));
  const std::vector<int32_t> tok = {7, 0, 49, 7};
  std::vector<int64_t> ids((size_t)R * n_layers * n_cols);
  for (auto& v : ids) v = (int64_t)(g() % rows);
  dev_array<float> df(vals);
  dev_array<uint16_t> db(bits);
  dev_array<int32_t> dtok(tok);
  dev_array<int64_t> dids(ids);
  for (const bool bf16 : {true, false}) {
    const kc::qmatrix t = bf16 ? kc::qmatrix_bf16(db.p, rows, cols) : kc::qmatrix_f32(df.p, rows, cols);
    const std::vector<float>& want = bf16 ? rounded : vals;
    for (const unsigned mask : {0u, (unsigned)cu::generic_gathers}) {
      cu::generic_kernels_scope scope(mask);
      const std::string form = std::string(bf16 ? "bf16" : "f32") + (mask ? " generic" : " compiled");
      dev_array<float> X((size_t)R * copies * cols), out((size_t)R * n_cols * cols);
      X.poison(), out.poison();
      auto st = cu::embed_rows(t, dtok.p, R, copies, X.p, nullptr);
      ASSERT_TRUE(st.ok()) << st.err().message;
      st = cu::table_rows(t, dids.p, R, n_layers, layer, n_cols, out.p, nullptr);
      ASSERT_TRUE(st.ok()) << st.err().message;
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto x = X.download(), o = out.download();
      for (int r = 0; r < R; ++r)
        for (int k = 0; k < copies; ++k)
          for (int i = 0; i < cols; ++i)
            ASSERT_EQ(x[((size_t)r * copies + k) * cols + i], want[(size_t)tok[(size_t)r] * cols + i])
                << form << " embed row " << r << " copy " << k << " col " << i;
      for (int r = 0; r < R; ++r)
        for (int j = 0; j < n_cols; ++j) {
          const int64_t row = ids[((size_t)r * n_layers + layer) * n_cols + j];
          for (int i = 0; i < cols; ++i)
            ASSERT_EQ(o[((size_t)r * n_cols + j) * cols + i], want[(size_t)row * cols + i])
                << form << " table row " << r << " col " << j << " channel " << i;
        }
    }
  }
}
