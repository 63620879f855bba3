// Tests of the sequence's global KV storage (model/sequence.hpp invariants 3 and 4): entries
// exist only as bytes (fp4_kv + fp4_index, or raw fp32 in f32_diagnostic); main_entry /
// main_values / index_values read them back exactly as the codecs define; index_f32 is the
// diagnostic storage read in place; snapshot + restore is a plain byte copy, the same from
// borrowed bytes (sequence_snapshot_view), into arrays with room for the next turn.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/quant.hpp"
#include "model/config.hpp"
#include "model/sequence.hpp"

namespace cm = cedar::model;
namespace ck = cedar::kernels;

namespace {

cm::model_config fixture_config() {
  auto c = cm::load_model_config(std::string(CEDAR_SOURCE_DIR) + "/tests/fixtures/deepseek-v41-tiny-A/config.json");
  EXPECT_TRUE(c.ok()) << (c.ok() ? "" : c.err().message);
  return c.ok() ? *c : cm::model_config{};
}

// Appends n entries of normal values (varying magnitudes) to source 0; returns them.
void fill(cm::sequence& s, int n, std::vector<float>* mains, std::vector<float>* keys) {
  const int hd = s.config().head_dim, di = s.config().index_head_dim;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  mains->assign((size_t)n * hd, 0.0f);
  keys->assign((size_t)n * di, 0.0f);
  for (int e = 0; e < n; ++e) {
    const float mag = std::ldexp(1.0f, e % 7 - 3);
    for (int i = 0; i < hd; ++i) (*mains)[(size_t)e * hd + i] = nd(rng) * mag;
    for (int i = 0; i < di; ++i) (*keys)[(size_t)e * di + i] = nd(rng) * mag;
    s.append_entry(0, mains->data() + (size_t)e * hd, keys->data() + (size_t)e * di);
  }
}

}  // namespace

TEST(sequence_kv, packed_entries_are_bytes_read_back_by_the_codecs) {
  const cm::model_config c = fixture_config();
  ASSERT_GT(c.head_dim, 0);
  cm::sequence s(c);
  ASSERT_GT(s.n_sources(), 0);
  const int n = 37, hd = c.head_dim, di = c.index_head_dim;
  std::vector<float> mains, keys;
  fill(s, n, &mains, &keys);
  const cm::kv_source_state& src = s.source(0);
  ASSERT_EQ(src.n_entries, n);
  EXPECT_EQ(src.main.size(), (size_t)n * ck::fp4_kv_bytes(hd));  // the only copy: the bytes
  EXPECT_EQ(src.index.size(), (size_t)n * ck::fp4_index_bytes(di));
  EXPECT_EQ(s.index_f32(0), nullptr);
  const std::vector<float> mv = s.main_values(0), iv = s.index_values(0);
  ASSERT_EQ(mv.size(), (size_t)n * hd);
  ASSERT_EQ(iv.size(), (size_t)n * di);
  std::vector<float> one((size_t)hd, std::nanf(""));
  int bad = 0;
  for (int e = 0; e < n; ++e) {
    std::vector<float> m(mains.begin() + (ptrdiff_t)e * hd, mains.begin() + (ptrdiff_t)(e + 1) * hd);
    std::vector<float> k(keys.begin() + (ptrdiff_t)e * di, keys.begin() + (ptrdiff_t)(e + 1) * di);
    ck::fp4_kv_fake_quant(m.data(), hd);  // = unpack(pack(x))
    ck::fp4_index_fake_quant(k.data(), di);
    s.main_entry(0, e, one.data());
    for (int i = 0; i < hd; ++i) {
      bad += std::memcmp(&one[(size_t)i], &m[(size_t)i], 4) != 0;
      bad += std::memcmp(&mv[(size_t)e * hd + i], &m[(size_t)i], 4) != 0;
    }
    for (int i = 0; i < di; ++i) bad += std::memcmp(&iv[(size_t)e * di + i], &k[(size_t)i], 4) != 0;
  }
  EXPECT_EQ(bad, 0);
}

TEST(sequence_kv, f32_diagnostic_keeps_raw_values_read_in_place) {
  const cm::model_config c = fixture_config();
  ASSERT_GT(c.head_dim, 0);
  cm::sequence s(c, cm::kv_storage::f32_diagnostic);
  const int n = 9, hd = c.head_dim;
  std::vector<float> mains, keys;
  fill(s, n, &mains, &keys);
  EXPECT_EQ(s.source(0).main.size(), (size_t)n * hd * sizeof(float));
  const float* kf = s.index_f32(0);
  ASSERT_NE(kf, nullptr);
  EXPECT_EQ(std::memcmp(kf, keys.data(), keys.size() * sizeof(float)), 0);
  EXPECT_EQ(s.main_values(0), mains);
  EXPECT_EQ(s.index_values(0), keys);
}

// kv_part rounding of an f32_diagnostic sequence: the chosen parts hold the values their stored
// format decodes to (bit for bit what a packed sequence reads back), the others the raw values;
// a packed sequence ignores the bits.
TEST(sequence_kv, f32_diagnostic_rounds_the_parts_asked_for) {
  const cm::model_config c = fixture_config();
  ASSERT_GT(c.head_dim, 0);
  const int n = 11, hd = c.head_dim, di = c.index_head_dim;
  std::vector<float> mains, keys;
  cm::sequence packed(c);
  fill(packed, n, &mains, &keys);
  const std::vector<float> pm = packed.main_values(0), pi = packed.index_values(0);
  for (uint8_t bits : {uint8_t(cm::kv_part_main), uint8_t(cm::kv_part_index), uint8_t(cm::kv_part_main | cm::kv_part_index)}) {
    cm::sequence s(c, cm::kv_storage::f32_diagnostic, bits);
    fill(s, n, &mains, &keys);
    const bool rm = bits & cm::kv_part_main, ri = bits & cm::kv_part_index;
    EXPECT_EQ(s.rounds(cm::kv_part_main), rm);
    EXPECT_EQ(s.rounds(cm::kv_part_index), ri);
    EXPECT_FALSE(s.rounds(cm::kv_part_swa));
    const std::vector<float> mv = s.main_values(0), iv = s.index_values(0);
    ASSERT_EQ(mv.size(), (size_t)n * hd);
    ASSERT_EQ(iv.size(), (size_t)n * di);
    EXPECT_EQ(std::memcmp(mv.data(), (rm ? pm : mains).data(), mv.size() * 4), 0) << "main, bits " << (int)bits;
    EXPECT_EQ(std::memcmp(iv.data(), (ri ? pi : keys).data(), iv.size() * 4), 0) << "index, bits " << (int)bits;
    EXPECT_NE(std::memcmp(mv.data(), (rm ? mains : pm).data(), mv.size() * 4), 0) << "main, bits " << (int)bits;
  }
  // SWA entries: rounded through FP8 when asked, raw otherwise
  std::vector<float> kv((size_t)hd), out((size_t)hd), want((size_t)hd), got_packed((size_t)hd);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (auto& v : kv) v = nd(rng);
  want = kv;
  ck::fp8_swa_fake_quant(want.data(), hd);
  cm::sequence sw(c, cm::kv_storage::f32_diagnostic, cm::kv_part_swa), plain(c, cm::kv_storage::f32_diagnostic);
  cm::sequence pk(c, cm::kv_storage::packed, cm::kv_part_swa);  // bits ignored: packed rounds all
  EXPECT_TRUE(sw.rounds(cm::kv_part_swa) && !sw.rounds(cm::kv_part_main));
  EXPECT_TRUE(pk.rounds(cm::kv_part_main) && pk.rounds(cm::kv_part_index) && pk.rounds(cm::kv_part_swa));
  sw.swa_write(0, 0, kv.data());
  sw.swa_entry(0, 0, out.data());
  EXPECT_EQ(std::memcmp(out.data(), want.data(), (size_t)hd * 4), 0);
  pk.swa_write(0, 0, kv.data());
  pk.swa_entry(0, 0, got_packed.data());
  EXPECT_EQ(std::memcmp(got_packed.data(), want.data(), (size_t)hd * 4), 0);
  plain.swa_write(0, 0, kv.data());
  plain.swa_entry(0, 0, out.data());
  EXPECT_EQ(std::memcmp(out.data(), kv.data(), (size_t)hd * 4), 0);
}

TEST(sequence_kv, restore_is_a_byte_copy) {
  const cm::model_config c = fixture_config();
  ASSERT_GT(c.head_dim, 0);
  cm::sequence a(c);
  // a consistent state: n_tok tokens and n_tok / ratio entries in every source
  const int n_tok = 24;
  std::vector<int32_t> toks((size_t)n_tok, 5);
  std::vector<int64_t> comp((size_t)n_tok, 1);
  a.append_tokens(toks.data(), n_tok, comp.data());
  const int hd = c.head_dim, di = c.index_head_dim;
  std::vector<float> m((size_t)hd, 0.25f), k((size_t)di, -0.5f);
  for (int i = 0; i < a.n_sources(); ++i)
    for (int e = 0; e < n_tok / a.source(i).ratio; ++e) {
      m[(size_t)(e % hd)] = (float)e;
      a.append_entry(i, m.data(), k.data());
    }
  cm::sequence_snapshot snap = a.snapshot();
  for (int i = 0; i < a.n_sources(); ++i) {  // pending groups as the snapshot of n_tok tokens needs
    snap.sources[(size_t)i].n_pending = n_tok % a.source(i).ratio;
    snap.sources[(size_t)i].pending_kv.assign((size_t)snap.sources[(size_t)i].n_pending * hd, 0.0f);
    snap.sources[(size_t)i].pending_gate.assign((size_t)snap.sources[(size_t)i].n_pending * hd, 0.0f);
  }
  cm::sequence b(c);
  ASSERT_TRUE(b.restore(snap).ok());
  for (int i = 0; i < a.n_sources(); ++i) {
    EXPECT_EQ(b.source(i).main, a.source(i).main);
    EXPECT_EQ(b.source(i).index, a.source(i).index);
    EXPECT_EQ(b.source(i).n_entries, a.source(i).n_entries);
    EXPECT_EQ(b.main_values(i), a.main_values(i));
  }
  // restore from borrowed bytes (the executor's form): the same state as from the snapshot
  cm::sequence_snapshot_view view;
  view.tokens = snap.tokens;
  view.ngram_history = snap.ngram_history;
  for (const auto& o : snap.sources) view.sources.push_back({o.main, o.index, o.n_pending, o.pending_kv, o.pending_gate});
  cm::sequence v(c);
  ASSERT_TRUE(v.restore(view).ok());
  EXPECT_EQ(v.tokens(), b.tokens());
  for (int i = 0; i < a.n_sources(); ++i) {
    EXPECT_EQ(v.source(i).main, b.source(i).main);
    EXPECT_EQ(v.source(i).index, b.source(i).index);
    EXPECT_EQ(v.source(i).n_entries, b.source(i).n_entries);
    EXPECT_EQ(v.source(i).n_pending, b.source(i).n_pending);
  }
  // the arrays keep room for the next turn: restore_spare_tokens(n) more tokens append in place
  const int spare = (int)cm::sequence::restore_spare_tokens(n_tok);
  std::vector<const uint8_t*> main0, index0;
  for (int i = 0; i < v.n_sources(); ++i) {
    main0.push_back(v.source(i).main.data());
    index0.push_back(v.source(i).index.data());
  }
  const int32_t* tok0 = v.tokens().data();
  std::vector<int32_t> more((size_t)spare, 7);
  std::vector<int64_t> more_comp((size_t)spare, 1);
  v.append_tokens(more.data(), spare, more_comp.data());
  for (int i = 0; i < v.n_sources(); ++i)
    for (int e = 0; e < spare / v.source(i).ratio; ++e) v.append_entry(i, m.data(), k.data());
  EXPECT_EQ(v.tokens().data(), tok0);
  for (int i = 0; i < v.n_sources(); ++i) {
    EXPECT_EQ(v.source(i).main.data(), main0[(size_t)i]) << "source " << i << " reallocated";
    EXPECT_EQ(v.source(i).index.data(), index0[(size_t)i]) << "source " << i << " reallocated";
  }
}
