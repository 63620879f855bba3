// The forward pass against the project's PyTorch reference goldens (tests/golden/README.md,
// tiny-B): full-stack prefill, top-k, candidates, greedy decode, CED prefill + decode,
// chunked prefill, the packed KV bytes after prefill and at the resume point (byte for byte),
// and an encoder-bounded-replay resume restored from the reference's own bytes.
#include <gtest/gtest.h>
#include <simdjson.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "model/config.hpp"
#include "model/engine.hpp"
#include "model/forward.hpp"
#include "model/npy.hpp"
#include "model/sampler.hpp"
#include "kernels/cpu/quant.hpp"

namespace cm = cedar::model;

namespace {

const std::string k_dir = std::string(CEDAR_SOURCE_DIR) + "/tests/golden/tiny-B";

cm::npy_array load(const std::string& rel) {
  auto a = cm::npy_load(k_dir + "/" + rel);
  EXPECT_TRUE(a.ok()) << (a.ok() ? "" : a.err().message);
  return a.ok() ? std::move(*a) : cm::npy_array{};
}

std::vector<uint8_t> load_bin(const std::string& rel) {
  std::ifstream f(k_dir + "/" + rel, std::ios::binary);
  EXPECT_TRUE(f.good()) << rel;
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

std::vector<int32_t> ids(const cm::npy_array& a) {
  std::vector<int32_t> v((size_t)a.numel());
  for (int64_t i = 0; i < a.numel(); ++i) v[(size_t)i] = (int32_t)a.at_i64(i);
  return v;
}

double rel_err(const float* a, const float* b, size_t n) {
  double md = 0, mb = 0;
  for (size_t i = 0; i < n; ++i) {
    md = std::max(md, (double)std::fabs(a[i] - b[i]));
    mb = std::max(mb, (double)std::fabs(b[i]));
  }
  return md / std::max(mb, 1e-30);
}

struct golden_model {
  cm::model_config cfg;
  std::unique_ptr<cm::engine> eng;
  std::vector<int32_t> prompt;
};

const golden_model& model() {
  static golden_model m = [] {
    golden_model g;
    auto c = cm::load_model_config(k_dir + "/config.json");
    EXPECT_TRUE(c.ok()) << (c.ok() ? "" : c.err().message);
    g.cfg = *c;
    cm::engine_options o;
    o.engram_token_map = *cm::load_token_map_npy(k_dir + "/engram/token_map.npy");
    auto e = cm::engine::load(g.cfg, k_dir + "/model.safetensors", o);
    EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.err().message);
    g.eng = std::make_unique<cm::engine>(std::move(*e));
    g.prompt = ids(load("input_ids.npy"));
    return g;
  }();
  return m;
}

class golden_run : public ::testing::TestWithParam<const char*> {
 protected:
  std::string run() const { return GetParam(); }
  cm::kv_storage storage() const {
    return run() == "quant" ? cm::kv_storage::packed : cm::kv_storage::f32_diagnostic;
  }
};

std::span<const int32_t> sub(const std::vector<int32_t>& v, size_t a, size_t b) { return {v.data() + a, b - a}; }

TEST_P(golden_run, full_stack_prefill_topk_and_greedy_decode) {
  const auto& m = model();
  const int V = (int)m.cfg.vocab_size;
  cm::sequence s(m.cfg, storage());
  cm::runner rn(*m.eng);
  cm::forward_trace tr;
  cm::prefill_options o;
  o.mode = cm::prefill_mode::full_stack;
  o.all_logits = true;
  o.trace = &tr;
  auto lg = rn.prefill(s, m.prompt, o);
  ASSERT_TRUE(lg.ok()) << lg.err().message;
  auto ref = load(run() + "/prefill_logits.npy");
  const double r = rel_err(lg->values.data(), ref.as<float>(), (size_t)ref.numel());
  std::printf("[golden %s] full-stack prefill rel %.3g\n", run().c_str(), r);
  EXPECT_LE(r, 1e-3);
  for (int l : m.cfg.index_source_layer_ids) {
    auto want = load(run() + "/topk_prefill_L" + std::to_string(l) + ".npy");
    ASSERT_EQ(tr.topk[l].size(), (size_t)want.numel());
    for (int64_t i = 0; i < want.numel(); ++i) EXPECT_EQ(tr.topk[l][(size_t)i], want.as<int32_t>()[i]) << "L" << l << " " << i;
  }
  auto cand = load(run() + "/candidates_prefill_L6.npy");
  ASSERT_EQ((int64_t)tr.candidates.size(), cand.numel());
  for (int64_t i = 0; i < cand.numel(); ++i) EXPECT_EQ(tr.candidates[(size_t)i] != 0, cand.as<uint8_t>()[i] != 0) << i;

  auto din = load(run() + "/decode_input_ids.npy");
  auto dref = load(run() + "/decode_logits.npy");
  std::vector<int> greedy = {cm::greedy_token(lg->values.data() + (size_t)(m.prompt.size() - 1) * V, V)};
  std::vector<float> dl;
  for (int64_t i = 0; i < din.numel(); ++i) {
    cm::sequence* sp = &s;
    const int32_t t = (int32_t)din.at_i64(i);
    ASSERT_TRUE(rn.decode_step({&sp, 1}, {&t, 1}, dl).ok());
    EXPECT_LE(rel_err(dl.data(), dref.as<float>() + (size_t)i * V, (size_t)V), 1e-3) << "step " << i;
    greedy.push_back(cm::greedy_token(dl.data(), V));
  }
  simdjson::dom::parser parser;
  simdjson::dom::element man;
  ASSERT_EQ(parser.load(k_dir + "/manifest.json").get(man), simdjson::SUCCESS);
  simdjson::dom::array ga;
  ASSERT_EQ(man["summary"][run()]["greedy_after_prefill"].get(ga), simdjson::SUCCESS);
  std::vector<int> want;
  for (simdjson::dom::element v : ga) want.push_back((int)int64_t(v));
  EXPECT_EQ(greedy, want);
}

TEST_P(golden_run, ced_prefill_and_decode) {
  const auto& m = model();
  const int V = (int)m.cfg.vocab_size;
  cm::sequence s(m.cfg, storage());
  cm::runner rn(*m.eng);
  cm::prefill_options o;
  o.mode = cm::prefill_mode::ced;
  o.all_logits = true;
  auto lg = rn.prefill(s, m.prompt, o);
  ASSERT_TRUE(lg.ok());
  auto ref = load(run() + "/ced_logits.npy");  // [W, V], positions N−W … N−1
  ASSERT_EQ(lg->n_rows, (int)ref.shape[0]);
  EXPECT_EQ(lg->first_pos, (int64_t)m.prompt.size() - m.cfg.sliding_window);
  const double r = rel_err(lg->values.data(), ref.as<float>(), (size_t)ref.numel());
  std::printf("[golden %s] CED prefill rel %.3g\n", run().c_str(), r);
  EXPECT_LE(r, 1e-3);
  auto din = load(run() + "/ced_decode_input_ids.npy");
  auto dref = load(run() + "/ced_decode_logits.npy");
  std::vector<float> dl;
  for (int64_t i = 0; i < din.numel(); ++i) {
    cm::sequence* sp = &s;
    const int32_t t = (int32_t)din.at_i64(i);
    ASSERT_TRUE(rn.decode_step({&sp, 1}, {&t, 1}, dl).ok());
    EXPECT_LE(rel_err(dl.data(), dref.as<float>() + (size_t)i * V, (size_t)V), 1e-3) << "CED decode step " << i;
  }
}

TEST_P(golden_run, chunked_prefill) {
  const auto& m = model();
  cm::sequence s(m.cfg, storage());
  cm::runner rn(*m.eng);
  cm::prefill_options o;
  o.mode = cm::prefill_mode::full_stack;
  o.all_logits = true;
  const std::vector<size_t> cuts = {0, 13, 14, 30, 45};
  std::vector<float> got;
  for (size_t k = 0; k + 1 < cuts.size(); ++k) {
    auto lg = rn.prefill(s, sub(m.prompt, cuts[k], cuts[k + 1]), o);
    ASSERT_TRUE(lg.ok());
    got.insert(got.end(), lg->values.begin(), lg->values.end());
  }
  auto ref = load(run() + "/chunked_logits.npy");
  ASSERT_EQ(got.size(), (size_t)ref.numel());
  EXPECT_LE(rel_err(got.data(), ref.as<float>(), got.size()), 1e-3);
}

// Packed arrays [entries, entry bytes] against the reference's, byte for byte: the reference
// packs the raw rows with the HF port's scale rule and −0 as E2M1 code 8, exactly as
// kernels/cpu/quant.cpp does (cedar_ref/quant.py, PACKING FROM A STATE). For a differing
// entry the message says whether it still decodes to the same values (another encoding of
// one value, i.e. a codec convention drifted) or to different values (the float path moved).
enum class entry_format { fp4_kv, fp4_index, fp8_swa };

void decode_entry(entry_format f, const uint8_t* e, int n, float* out) {
  switch (f) {
    case entry_format::fp4_kv: cedar::kernels::fp4_kv_unpack(e, n, out); break;
    case entry_format::fp4_index: cedar::kernels::fp4_index_unpack(e, n, out); break;
    case entry_format::fp8_swa: cedar::kernels::fp8_swa_unpack(e, n, out); break;
  }
}

// Returns the number of identical entries; fails the test for every differing one.
int expect_entries_identical(const uint8_t* mine, const uint8_t* ref, size_t n_entries, size_t entry,
                             entry_format f, int n, const std::string& what) {
  int identical = 0;
  std::vector<float> va((size_t)n), vb((size_t)n);
  for (size_t e = 0; e < n_entries; ++e) {
    const uint8_t* a = mine + e * entry;
    const uint8_t* b = ref + e * entry;
    if (std::equal(a, a + entry, b)) {
      ++identical;
      continue;
    }
    decode_entry(f, a, n, va.data());
    decode_entry(f, b, n, vb.data());
    size_t byte = 0;
    while (a[byte] == b[byte]) ++byte;
    ADD_FAILURE() << what << ": entry " << e << " differs at byte " << byte << " (mine 0x" << std::hex
                  << (int)a[byte] << ", reference 0x" << (int)b[byte] << std::dec << "); it decodes to "
                  << (va == vb ? "the same values (another encoding)" : "different values");
  }
  return identical;
}

// Bytes of every KV source of `s` against `dir`/kv_L{s}.bin, index_k_L{s}.bin, pending, tail.
void expect_kv_bytes(const cm::sequence& s, const std::string& dir) {
  const int D = s.config().head_dim, Di = s.config().index_head_dim;
  for (int i = 0; i < s.n_sources(); ++i) {
    const cm::kv_source_state& st = s.source(i);
    const std::string L = std::to_string(st.layer);
    const std::vector<uint8_t> main_ref = load_bin(dir + "/kv_L" + L + ".bin");
    const std::vector<uint8_t> index_ref = load_bin(dir + "/index_k_L" + L + ".bin");
    ASSERT_EQ(st.main.size(), main_ref.size()) << dir << " main KV of source L" << L;
    ASSERT_EQ(st.index.size(), index_ref.size()) << dir << " index keys of source L" << L;
    const size_t mb = s.main_entry_bytes(), ib = s.index_entry_bytes();
    ASSERT_GT(main_ref.size(), 0u) << dir << " L" << L;
    ASSERT_EQ(main_ref.size() % mb, 0u);
    ASSERT_EQ(index_ref.size() / ib, main_ref.size() / mb) << "one index key per main entry";
    const int m = expect_entries_identical(st.main.data(), main_ref.data(), main_ref.size() / mb, mb,
                                           entry_format::fp4_kv, D, dir + " main KV L" + L);
    const int k = expect_entries_identical(st.index.data(), index_ref.data(), index_ref.size() / ib, ib,
                                           entry_format::fp4_index, Di, dir + " index keys L" + L);
    std::printf("[golden bytes] %s L%s: main entries byte-identical %d of %zu, index keys %d of %zu\n",
                dir.c_str(), L.c_str(), m, main_ref.size() / mb, k, index_ref.size() / ib);
    auto pend = load(dir + "/pending_L" + L + ".npy");  // [2, p, D]
    ASSERT_EQ(pend.shape[1], st.n_pending) << "L" << L;
    const size_t n = (size_t)st.n_pending * D;
    if (n) {
      EXPECT_LE(rel_err(st.pending_kv.data(), pend.as<float>(), n), 1e-5) << "L" << L;
      EXPECT_LE(rel_err(st.pending_gate.data(), pend.as<float>() + n, n), 1e-5) << "L" << L;
    }
  }
  auto tail = load(dir + "/engram_tail.npy");
  std::vector<int64_t> want;
  for (int64_t i = 0; i < tail.numel(); ++i) want.push_back(tail.at_i64(i));
  EXPECT_EQ(s.ngram_history(), want);
}

TEST(golden_bytes, packed_kv_after_prefill_is_byte_identical) {
  const auto& m = model();
  cm::sequence s(m.cfg);
  cm::runner rn(*m.eng);
  cm::prefill_options o;
  o.mode = cm::prefill_mode::full_stack;
  ASSERT_TRUE(rn.prefill(s, m.prompt, o).ok());
  expect_kv_bytes(s, "quant/kv_after_prefill");
  // SWA rows (FP8 packed, 33 bytes at head_dim 32) at the listed positions
  const std::vector<uint8_t> swa = load_bin("quant/kv_after_prefill/swa.bin");
  auto pos = load("quant/kv_after_prefill/swa_pos.npy");  // [L, W−1]
  const size_t eb = s.swa_entry_bytes();
  const int per = (int)pos.shape[1];
  ASSERT_EQ(swa.size(), (size_t)m.cfg.num_hidden_layers * per * eb);
  int identical = 0;
  for (int l = 0; l < m.cfg.num_hidden_layers; ++l)
    for (int j = 0; j < per; ++j) {
      const int64_t p = pos.at_i64((int64_t)l * per + j);
      ASSERT_TRUE(s.swa_valid(l, p));
      const uint8_t* mine = s.ring(l).bytes.data() + (size_t)(p % m.cfg.sliding_window) * eb;
      identical += expect_entries_identical(mine, swa.data() + ((size_t)l * per + j) * eb, 1, eb,
                                            entry_format::fp8_swa, m.cfg.head_dim,
                                            "SWA L" + std::to_string(l) + " position " + std::to_string(p));
    }
  std::printf("[golden bytes] SWA entries byte-identical %d of %d\n", identical, m.cfg.num_hidden_layers * per);
}

TEST(golden_bytes, resume_point_bytes_and_replay_from_reference_bytes) {
  const auto& m = model();
  const int V = (int)m.cfg.vocab_size, W = m.cfg.sliding_window;
  cm::runner rn(*m.eng);
  cm::prefill_options o;
  o.mode = cm::prefill_mode::full_stack;
  cm::sequence s(m.cfg);
  ASSERT_TRUE(rn.prefill(s, sub(m.prompt, 0, 32), o).ok());
  expect_kv_bytes(s, "quant/resume");

  // Restore from the REFERENCE's bytes, replay the last W tokens, prefill the next 6.
  cm::sequence_snapshot snap;
  snap.tokens.assign(m.prompt.begin(), m.prompt.begin() + 32);
  for (int i = 0; i < s.n_sources(); ++i) {
    const std::string L = std::to_string(s.source(i).layer);
    cm::sequence_snapshot::source src;
    src.main = load_bin("quant/resume/kv_L" + L + ".bin");
    src.index = load_bin("quant/resume/index_k_L" + L + ".bin");
    auto pend = load("quant/resume/pending_L" + L + ".npy");
    src.n_pending = (int)pend.shape[1];
    const size_t n = (size_t)src.n_pending * m.cfg.head_dim;
    src.pending_kv.assign(pend.as<float>(), pend.as<float>() + n);
    src.pending_gate.assign(pend.as<float>() + n, pend.as<float>() + 2 * n);
    snap.sources.push_back(std::move(src));
  }
  auto tail = load("quant/resume/engram_tail.npy");
  for (int64_t i = 0; i < tail.numel(); ++i) snap.ngram_history.push_back(tail.at_i64(i));
  cm::sequence r(m.cfg);
  auto st = r.restore(snap);
  ASSERT_TRUE(st.ok()) << st.err().message;
  ASSERT_TRUE(rn.replay(r, W).ok());
  o.all_logits = true;
  auto lg = rn.prefill(r, sub(m.prompt, 32, 38), o);
  ASSERT_TRUE(lg.ok());
  auto ref = load("quant/resume/resume_logits.npy");
  const double rr = rel_err(lg->values.data(), ref.as<float>(), (size_t)ref.numel());
  std::printf("[golden quant] resume (replay W=%d) logits rel %.3g\n", W, rr);
  EXPECT_LE(rr, 1e-3);
  (void)V;
}

TEST(golden_bytes, noquant_resume_logits) {
  const auto& m = model();
  cm::runner rn(*m.eng);
  cm::prefill_options o;
  o.mode = cm::prefill_mode::full_stack;
  cm::sequence s(m.cfg, cm::kv_storage::f32_diagnostic);
  ASSERT_TRUE(rn.prefill(s, sub(m.prompt, 0, 32), o).ok());
  cm::sequence r(m.cfg, cm::kv_storage::f32_diagnostic);
  ASSERT_TRUE(r.restore(s.snapshot()).ok());
  // the reference's replay re-scores the replayed rows (no resume hints)
  ASSERT_TRUE(rn.replay(r, m.cfg.sliding_window, /*use_hints=*/false).ok());
  o.all_logits = true;
  auto lg = rn.prefill(r, sub(m.prompt, 32, 38), o);
  ASSERT_TRUE(lg.ok());
  auto ref = load("noquant/resume/resume_logits.npy");
  EXPECT_LE(rel_err(lg->values.data(), ref.as<float>(), (size_t)ref.numel()), 1e-3);
}

// The diagnostic between the two runs (cedar eval --kv bf16+PART): an f32_diagnostic sequence
// that rounds every part through its stored format (FP4 main entries, FP4 index keys and
// queries, FP8 SWA) computes what the packed sequence computes — the same top-k selections and
// greedy tokens, logits within 1e-5 (only the index scores' sums run in another order) — while
// the unrounded one differs by the quantisation; each part alone lands in between.
TEST(golden_bytes, f32_with_every_part_rounded_is_the_packed_model) {
  const auto& m = model();
  const int V = (int)m.cfg.vocab_size;
  cm::runner rn(*m.eng);
  auto run = [&](cm::sequence& s, std::vector<float>* logits, std::vector<int>* greedy, cm::forward_trace* tr) {
    cm::prefill_options o;
    o.mode = cm::prefill_mode::full_stack;
    o.all_logits = true;
    o.trace = tr;
    auto lg = rn.prefill(s, m.prompt, o);
    ASSERT_TRUE(lg.ok()) << lg.err().message;
    *logits = lg->values;
    int t = cm::greedy_token(lg->values.data() + (size_t)(m.prompt.size() - 1) * V, V);
    std::vector<float> dl;
    for (int i = 0; i < 8; ++i) {  // greedy decode: every step reads the stored entries
      greedy->push_back(t);
      cm::sequence* sp = &s;
      const int32_t tok = t;
      ASSERT_TRUE(rn.decode_step({&sp, 1}, {&tok, 1}, dl).ok());
      logits->insert(logits->end(), dl.begin(), dl.end());
      t = cm::greedy_token(dl.data(), V);
    }
  };
  std::vector<float> lp, lr, lf;
  std::vector<int> gp, gr, gf;
  cm::forward_trace tp, trr;
  cm::sequence packed(m.cfg);
  run(packed, &lp, &gp, &tp);
  cm::sequence rounded(m.cfg, cm::kv_storage::f32_diagnostic, cm::kv_part_main | cm::kv_part_index | cm::kv_part_swa);
  EXPECT_TRUE(rounded.rounds(cm::kv_part_main) && rounded.rounds(cm::kv_part_index) && rounded.rounds(cm::kv_part_swa));
  run(rounded, &lr, &gr, &trr);
  cm::sequence raw(m.cfg, cm::kv_storage::f32_diagnostic);
  EXPECT_FALSE(raw.rounds(cm::kv_part_main) || raw.rounds(cm::kv_part_index) || raw.rounds(cm::kv_part_swa));
  cm::forward_trace tf;
  run(raw, &lf, &gf, &tf);
  ASSERT_EQ(lp.size(), lr.size());
  const double r_rounded = rel_err(lr.data(), lp.data(), lp.size()), r_raw = rel_err(lf.data(), lp.data(), lp.size());
  std::printf("[golden] packed vs f32 rounded rel %.3g, vs f32 raw rel %.3g\n", r_rounded, r_raw);
  EXPECT_LE(r_rounded, 1e-5);
  EXPECT_GT(r_raw, 10 * r_rounded);
  EXPECT_EQ(gr, gp);
  for (int l : m.cfg.index_source_layer_ids) EXPECT_EQ(trr.topk[l], tp.topk[l]) << "layer " << l;
  for (uint8_t part : {cm::kv_part_main, cm::kv_part_index, cm::kv_part_swa}) {
    cm::sequence one(m.cfg, cm::kv_storage::f32_diagnostic, part);
    std::vector<float> lo;
    std::vector<int> go;
    cm::forward_trace to;
    run(one, &lo, &go, &to);
    const double r = rel_err(lo.data(), lp.data(), lp.size());
    std::printf("[golden] part %d alone: vs packed rel %.3g\n", (int)part, r);
    EXPECT_GT(r, r_rounded) << "part " << (int)part;
  }
}

INSTANTIATE_TEST_SUITE_P(runs, golden_run, ::testing::Values("quant", "noquant"));

}  // namespace
