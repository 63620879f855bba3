// Parity of the CPU forward pass with the HF-port fixture tests/fixtures/deepseek-v41-tiny-A
// (README there): full-stack prefill logits of every row, teacher-forced decode logits,
// greedy ids, indexer top-k, candidate pool, cache contents after prefill, layer probes,
// the Engram addressing and the RoPE frequencies. Runs the quant path (the model) and the
// noquant diagnostic (kv_storage::f32_diagnostic).
#include <gtest/gtest.h>
#include <simdjson.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "model/config.hpp"
#include "model/engine.hpp"
#include "model/forward.hpp"
#include "model/layers_engram.hpp"
#include "model/npy.hpp"
#include "model/sampler.hpp"

namespace cm = cedar::model;

namespace {

const std::string k_dir = std::string(CEDAR_SOURCE_DIR) + "/tests/fixtures/deepseek-v41-tiny-A";

cm::npy_array load(const std::string& rel) {
  auto a = cm::npy_load(k_dir + "/" + rel);
  EXPECT_TRUE(a.ok()) << (a.ok() ? "" : a.err().message);
  return a.ok() ? std::move(*a) : cm::npy_array{};
}

std::vector<int32_t> ids(const cm::npy_array& a) {
  std::vector<int32_t> v((size_t)a.numel());
  for (int64_t i = 0; i < a.numel(); ++i) v[(size_t)i] = (int32_t)a.at_i64(i);
  return v;
}

// Quantised caches: an element whose fp32 input sits on a rounding boundary may land one code
// away from the port's (manifest quant_fragility lists such elements). Counts elements off by
// more than 1e-5 of the array's max.
int n_off(const float* a, const float* b, size_t n) {
  double mb = 0;
  for (size_t i = 0; i < n; ++i) mb = std::max(mb, (double)std::fabs(b[i]));
  int k = 0;
  for (size_t i = 0; i < n; ++i) k += std::fabs(a[i] - b[i]) > 1e-5 * mb;
  return k;
}

// rel = max|a − b| / max|b|
double rel_err(const float* a, const float* b, size_t n) {
  double md = 0, mb = 0;
  for (size_t i = 0; i < n; ++i) {
    md = std::max(md, (double)std::fabs(a[i] - b[i]));
    mb = std::max(mb, (double)std::fabs(b[i]));
  }
  return md / std::max(mb, 1e-30);
}

struct fixture_model {
  cm::model_config cfg;
  std::unique_ptr<cm::engine> eng;
};

const fixture_model& model() {
  static fixture_model m = [] {
    fixture_model f;
    auto c = cm::load_model_config(k_dir + "/config.json");
    EXPECT_TRUE(c.ok()) << (c.ok() ? "" : c.err().message);
    f.cfg = *c;
    cm::engine_options o;
    auto tm = cm::load_token_map_npy(k_dir + "/engram/token_map.npy");
    EXPECT_TRUE(tm.ok());
    o.engram_token_map = *tm;
    auto e = cm::engine::load(f.cfg, k_dir + "/model.safetensors", o);
    EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.err().message);
    f.eng = std::make_unique<cm::engine>(std::move(*e));
    return f;
  }();
  return m;
}

class fixture_run : public ::testing::TestWithParam<const char*> {
 protected:
  std::string run() const { return GetParam(); }
  cm::kv_storage storage() const {
    return run() == "quant" ? cm::kv_storage::packed : cm::kv_storage::f32_diagnostic;
  }
};

TEST(fixture_engram, layout_matches_fixture_files) {
  const auto& m = model();
  const cm::engram_layout& L = m.eng->engram();
  auto primes = load("engram/primes.npy");
  auto offsets = load("engram/offsets.npy");
  auto mult = load("engram/multipliers.npy");
  ASSERT_EQ((size_t)primes.numel(), L.primes.size());
  for (int64_t i = 0; i < primes.numel(); ++i) EXPECT_EQ(primes.at_i64(i), L.primes[(size_t)i]) << i;
  ASSERT_EQ((size_t)offsets.numel(), L.offsets.size());
  for (int64_t i = 0; i < offsets.numel(); ++i) EXPECT_EQ(offsets.at_i64(i), L.offsets[(size_t)i]) << i;
  ASSERT_EQ((size_t)mult.numel(), L.multipliers.size());
  for (int64_t i = 0; i < mult.numel(); ++i) EXPECT_EQ(mult.at_i64(i), L.multipliers[(size_t)i]) << i;
}

TEST(fixture_engram, hash_ids_match_prefill) {
  const auto& m = model();
  const cm::engram_layout& L = m.eng->engram();
  const std::vector<int32_t> in = ids(load("input_ids.npy"));
  auto want = load("engram/hash_ids_prefill.npy");  // [201, n_layers, n_cols]
  const auto& tm = m.eng->engram_token_map();
  std::vector<int64_t> ctx((size_t)L.max_ngram), out((size_t)L.n_cols());
  int bad = 0;
  for (size_t p = 0; p < in.size(); ++p)
    for (int li = 0; li < L.n_layers; ++li) {
      for (int s = 0; s < L.max_ngram; ++s)
        ctx[(size_t)s] = (int)p < s ? m.eng->engram_pad_compressed() : tm[(size_t)in[p - (size_t)s]];
      L.hash(li, ctx.data(), out.data());
      for (int j = 0; j < L.n_cols(); ++j)
        bad += out[(size_t)j] != want.at_i64(((int64_t)p * L.n_layers + li) * L.n_cols() + j);
    }
  EXPECT_EQ(bad, 0);
}

TEST(fixture_rope, inverse_frequencies_match) {
  const auto& m = model();
  auto mainf = load("rope_inv_freq_main.npy");
  auto comp = load("rope_inv_freq_compress.npy");
  ASSERT_EQ((size_t)mainf.numel(), m.eng->main_rope().inv_freq.size());
  ASSERT_EQ((size_t)comp.numel(), m.eng->compress_rope().inv_freq.size());
  EXPECT_LE(rel_err(m.eng->main_rope().inv_freq.data(), mainf.as<float>(), (size_t)mainf.numel()), 1e-6);
  for (int64_t i = 0; i < comp.numel(); ++i)
    EXPECT_NEAR(m.eng->compress_rope().inv_freq[(size_t)i], comp.as<float>()[i], 1e-6 * std::fabs(comp.as<float>()[i]))
        << i;
}

TEST_P(fixture_run, prefill_decode_topk_caches) {
  const auto& m = model();
  const cm::model_config& c = m.cfg;
  const std::vector<int32_t> in = ids(load("input_ids.npy"));
  const bool quant = storage() == cm::kv_storage::packed;
  cm::sequence seq(c, storage());
  cm::runner rn(*m.eng);
  cm::forward_trace tr;
  cm::prefill_options o;
  o.mode = cm::prefill_mode::full_stack;
  o.all_logits = true;
  o.trace = &tr;
  auto lg = rn.prefill(seq, in, o);
  ASSERT_TRUE(lg.ok()) << lg.err().message;
  ASSERT_EQ(lg->n_rows, (int)in.size());

  // Layer probes first: they localise a mismatch.
  auto probe = load(run() + "/layer_out_probe.npy");  // [L, P, hc, d]
  const int P = (int)probe.shape[1], hcd = c.hc_mult * (int)c.hidden_size;
  const std::vector<int64_t> pp = {0, 1, 2, 3, 15, 16, 17, 31, 32, 63, 100, 150, 199, 200};
  ASSERT_EQ((int)pp.size(), P);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    std::vector<float> got((size_t)P * hcd);
    for (int j = 0; j < P; ++j)
      std::copy_n(tr.layer_out.data() + ((size_t)l * in.size() + (size_t)pp[(size_t)j]) * hcd, hcd,
                  got.data() + (size_t)j * hcd);
    const double r = rel_err(got.data(), probe.as<float>() + (size_t)l * P * hcd, got.size());
    // quant: a rounding-boundary element one code away (see n_off) moves later layers a little
    EXPECT_LE(r, quant ? 1e-3 : 1e-4) << "layer " << l << " residual probe rel " << r;
  }

  auto ref = load(run() + "/prefill_logits.npy");
  const double r = rel_err(lg->values.data(), ref.as<float>(), (size_t)ref.numel());
  std::printf("[%s] prefill logits rel %.3g\n", run().c_str(), r);
  EXPECT_LE(r, 1e-3);

  // top-k per index source, candidate pool
  for (int l : c.index_source_layer_ids) {
    auto want = load(run() + "/topk_prefill_L" + std::to_string(l) + ".npy");
    const std::vector<int32_t>& got = tr.topk[l];
    ASSERT_EQ(got.size(), (size_t)want.numel()) << "layer " << l;
    int bad = 0;
    for (int64_t i = 0; i < want.numel(); ++i) bad += got[(size_t)i] != want.as<int32_t>()[i];
    EXPECT_EQ(bad, 0) << "top-k mismatches at layer " << l;
  }
  auto cand = load(run() + "/candidates_prefill_L" + std::to_string(c.candidate_source_layer_id) + ".npy");
  ASSERT_EQ(tr.candidates_width, cand.shape[1]);
  int cbad = 0;
  for (int64_t i = 0; i < cand.numel(); ++i) cbad += (tr.candidates[(size_t)i] != 0) != (cand.as<uint8_t>()[i] != 0);
  EXPECT_EQ(cbad, 0);

  // caches after prefill: compressed KV + index keys per source (unpacked), SWA windows
  for (int si = 0; si < seq.n_sources(); ++si) {
    const cm::kv_source_state& st = seq.source(si);
    auto kv = load(run() + "/cache_after_prefill/compressed_kv_L" + std::to_string(st.layer) + ".npy");
    auto ik = load(run() + "/cache_after_prefill/index_k_L" + std::to_string(st.layer) + ".npy");
    ASSERT_EQ(st.n_entries, kv.shape[0]);
    // dequantised from the entry bytes (the sequence keeps no fp32 copy)
    const std::vector<float> main_v = seq.main_values(si), index_v = seq.index_values(si);
    ASSERT_EQ(main_v.size(), (size_t)kv.numel());
    ASSERT_EQ(index_v.size(), (size_t)ik.numel());
    const int off_kv = n_off(main_v.data(), kv.as<float>(), (size_t)kv.numel());
    const int off_ik = n_off(index_v.data(), ik.as<float>(), (size_t)ik.numel());
    std::printf("[%s] L%d compressed kv: %d of %lld elements one code off; index keys: %d of %lld\n",
                run().c_str(), st.layer, off_kv, (long long)kv.numel(), off_ik, (long long)ik.numel());
    // noquant: exact up to fp32 rounding; quant: a handful of boundary elements, one code off
    // (one E2M1 code is at most 1/3 of its block's max)
    EXPECT_LE(rel_err(main_v.data(), kv.as<float>(), (size_t)kv.numel()), quant ? 0.34 : 1e-4);
    EXPECT_LE(rel_err(index_v.data(), ik.as<float>(), (size_t)ik.numel()), quant ? 0.34 : 1e-4);
    EXPECT_LE(off_kv, quant ? (int)(kv.numel() / 500) : 0) << "layer " << st.layer;
    EXPECT_LE(off_ik, quant ? (int)(ik.numel() / 500) : 0) << "layer " << st.layer;
    EXPECT_EQ(st.n_pending, (int)(in.size() % st.ratio));
  }
  auto swa = load(run() + "/cache_after_prefill/swa_window.npy");  // [L, W−1, hd]
  const int nw = (int)swa.shape[1];
  std::vector<float> got((size_t)nw * c.head_dim);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    for (int j = 0; j < nw; ++j) {
      const int64_t p = (int64_t)in.size() - nw + j;
      ASSERT_TRUE(seq.swa_valid(l, p));
      seq.swa_entry(l, p, got.data() + (size_t)j * c.head_dim);
    }
    const float* want = swa.as<float>() + (size_t)l * nw * c.head_dim;
    const int off = n_off(got.data(), want, got.size());
    if (off) std::printf("[%s] L%d SWA window: %d of %zu elements one code off\n", run().c_str(), l, off, got.size());
    EXPECT_LE(rel_err(got.data(), want, got.size()), quant ? 0.13 : 1e-4) << "layer " << l;
    EXPECT_LE(off, quant ? (int)(got.size() / 100) : 0) << "layer " << l;
  }

  // teacher-forced decode + greedy ids
  auto din = load(run() + "/decode_input_ids.npy");
  auto dref = load(run() + "/decode_logits.npy");
  const int V = (int)c.vocab_size;
  std::vector<int> greedy = {cm::greedy_token(lg->values.data() + (size_t)(in.size() - 1) * V, V)};
  std::vector<float> dl;
  for (int64_t i = 0; i < din.numel(); ++i) {
    cm::sequence* sp = &seq;
    const int32_t t = (int32_t)din.at_i64(i);
    ASSERT_TRUE(rn.decode_step({&sp, 1}, {&t, 1}, dl).ok());
    const double rd = rel_err(dl.data(), dref.as<float>() + (size_t)i * V, (size_t)V);
    EXPECT_LE(rd, 1e-3) << "decode step " << i;
    greedy.push_back(cm::greedy_token(dl.data(), V));
  }
  // the manifest's greedy ids: argmax of the prefill's last row, then of each decode step
  auto nxt = load(run() + "/decode_next_ids.npy");
  EXPECT_EQ(greedy[0], (int)din.at_i64(0));
  for (int64_t i = 0; i < nxt.numel(); ++i) EXPECT_EQ(greedy[(size_t)i + 1], (int)nxt.at_i64(i)) << i;
  simdjson::dom::parser parser;
  simdjson::dom::element man;
  ASSERT_EQ(parser.load(k_dir + "/manifest.json").get(man), simdjson::SUCCESS);
  simdjson::dom::array gi;
  ASSERT_EQ(man["runs"][run()]["greedy_ids"].get(gi), simdjson::SUCCESS);
  std::vector<int> want;
  for (simdjson::dom::element v : gi) want.push_back((int)int64_t(v));
  EXPECT_EQ(greedy, want) << "manifest.runs." << run() << ".greedy_ids";
}

INSTANTIATE_TEST_SUITE_P(runs, fixture_run, ::testing::Values("quant", "noquant"));

}  // namespace
