// Behaviour of the forward pass on the real tiny fixture model (tests/fixtures/deepseek-v41-
// tiny-A): chunked prefill == one-shot, decode after prefill == prefill of the longer prompt,
// batched decode == single decode, CED vs full stack (encoder/decoder KV identical, logits
// difference measured), encoder bounded replay after snapshot/restore, and input errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "model/config.hpp"
#include "model/engine.hpp"
#include "model/forward.hpp"
#include "model/npy.hpp"

namespace cm = cedar::model;

namespace {

const std::string k_dir = std::string(CEDAR_SOURCE_DIR) + "/tests/fixtures/deepseek-v41-tiny-A";

double rel_err(const float* a, const float* b, size_t n) {
  double md = 0, mb = 0;
  for (size_t i = 0; i < n; ++i) {
    md = std::max(md, (double)std::fabs(a[i] - b[i]));
    mb = std::max(mb, (double)std::fabs(b[i]));
  }
  return md / std::max(mb, 1e-30);
}

struct fx {
  cm::model_config cfg;
  std::unique_ptr<cm::engine> eng;
  std::vector<int32_t> prompt;  // [201]
};

const fx& tiny() {
  static fx f = [] {
    fx m;
    auto c = cm::load_model_config(k_dir + "/config.json");
    EXPECT_TRUE(c.ok());
    m.cfg = *c;
    cm::engine_options o;
    o.engram_token_map = *cm::load_token_map_npy(k_dir + "/engram/token_map.npy");
    auto e = cm::engine::load(m.cfg, k_dir + "/model.safetensors", o);
    EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.err().message);
    m.eng = std::make_unique<cm::engine>(std::move(*e));
    auto in = cm::npy_load(k_dir + "/input_ids.npy");
    for (int64_t i = 0; i < in->numel(); ++i) m.prompt.push_back((int32_t)in->at_i64(i));
    return m;
  }();
  return f;
}

std::span<const int32_t> span_of(const std::vector<int32_t>& v, size_t a, size_t b) {
  return std::span<const int32_t>(v.data() + a, b - a);
}

cm::logits_rows prefill(cm::runner& rn, cm::sequence& s, std::span<const int32_t> t, cm::prefill_mode m,
                        bool all = false) {
  cm::prefill_options o;
  o.mode = m;
  o.all_logits = all;
  auto r = rn.prefill(s, t, o);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.err().message);
  return r.ok() ? std::move(*r) : cm::logits_rows{};
}

TEST(forward_chunked, chunks_equal_one_shot) {
  const fx& f = tiny();
  cm::runner rn(*f.eng);
  cm::sequence one(f.cfg), chunked(f.cfg);
  auto ref = prefill(rn, one, f.prompt, cm::prefill_mode::full_stack, true);
  // uneven chunks, crossing ratio-2 group and window boundaries
  const std::vector<size_t> cuts = {0, 1, 8, 9, 40, 77, 150, 201};
  std::vector<float> got;
  for (size_t k = 0; k + 1 < cuts.size(); ++k) {
    auto r = prefill(rn, chunked, span_of(f.prompt, cuts[k], cuts[k + 1]), cm::prefill_mode::full_stack, true);
    ASSERT_EQ(r.first_pos, (int64_t)cuts[k]);
    got.insert(got.end(), r.values.begin(), r.values.end());
  }
  ASSERT_EQ(got.size(), ref.values.size());
  const double r = rel_err(got.data(), ref.values.data(), got.size());
  std::printf("chunked vs one-shot prefill: logits rel %.3g\n", r);
  EXPECT_LE(r, 1e-3);
  ASSERT_EQ(chunked.n_tokens(), one.n_tokens());
  for (int i = 0; i < one.n_sources(); ++i) {
    EXPECT_EQ(chunked.source(i).n_entries, one.source(i).n_entries);
    EXPECT_EQ(chunked.source(i).n_pending, one.source(i).n_pending);
    const std::vector<float> a = chunked.main_values(i), b = one.main_values(i);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_LE(rel_err(a.data(), b.data(), b.size()), 0.05);
  }
  EXPECT_EQ(chunked.ngram_history(), one.ngram_history());
}

TEST(forward_decode, decode_after_prefill_equals_longer_prefill) {
  const fx& f = tiny();
  const int V = (int)f.cfg.vocab_size;
  cm::runner rn(*f.eng);
  cm::sequence full(f.cfg), inc(f.cfg);
  auto ref = prefill(rn, full, f.prompt, cm::prefill_mode::full_stack, true);
  const size_t n0 = 185;
  prefill(rn, inc, span_of(f.prompt, 0, n0), cm::prefill_mode::full_stack);
  std::vector<float> lg;
  double worst = 0;
  for (size_t p = n0; p < f.prompt.size(); ++p) {
    cm::sequence* sp = &inc;
    ASSERT_TRUE(rn.decode_step({&sp, 1}, {&f.prompt[p], 1}, lg).ok());
    worst = std::max(worst, rel_err(lg.data(), ref.values.data() + p * (size_t)V, (size_t)V));
  }
  std::printf("decode after prefill vs one-shot prefill: worst logits rel %.3g\n", worst);
  EXPECT_LE(worst, 1e-3);
}

TEST(forward_decode, batched_equals_single) {
  const fx& f = tiny();
  const int V = (int)f.cfg.vocab_size;
  cm::runner rn(*f.eng);
  const std::vector<size_t> lens = {30, 120, 75};  // different entry counts: candidate pools differ in size
  std::vector<cm::sequence> bat, sgl;
  for (size_t i = 0; i < lens.size(); ++i) {
    bat.emplace_back(f.cfg);
    sgl.emplace_back(f.cfg);
  }
  for (size_t i = 0; i < lens.size(); ++i) {
    prefill(rn, bat[i], span_of(f.prompt, 10 * i, 10 * i + lens[i]), cm::prefill_mode::ced);
    prefill(rn, sgl[i], span_of(f.prompt, 10 * i, 10 * i + lens[i]), cm::prefill_mode::ced);
  }
  std::vector<float> lb, ls;
  double worst = 0;
  for (int step = 0; step < 5; ++step) {
    std::vector<cm::sequence*> ptrs;
    std::vector<int32_t> toks;
    for (size_t i = 0; i < lens.size(); ++i) {
      ptrs.push_back(&bat[i]);
      toks.push_back(f.prompt[100 + 7 * i + (size_t)step]);
    }
    ASSERT_TRUE(rn.decode_step(ptrs, toks, lb).ok());
    ASSERT_EQ(lb.size(), lens.size() * (size_t)V);
    for (size_t i = 0; i < lens.size(); ++i) {
      cm::sequence* sp = &sgl[i];
      ASSERT_TRUE(rn.decode_step({&sp, 1}, {&toks[i], 1}, ls).ok());
      worst = std::max(worst, rel_err(lb.data() + i * (size_t)V, ls.data(), (size_t)V));
    }
  }
  std::printf("batched vs single decode: worst logits rel %.3g\n", worst);
  EXPECT_LE(worst, 1e-4);
  for (size_t i = 0; i < lens.size(); ++i) EXPECT_EQ(bat[i].tokens(), sgl[i].tokens());
}

TEST(forward_ced, global_kv_identical_and_logits_close) {
  const fx& f = tiny();
  const int V = (int)f.cfg.vocab_size;
  cm::runner rn(*f.eng);
  cm::sequence full(f.cfg), ced(f.cfg);
  auto rf = prefill(rn, full, f.prompt, cm::prefill_mode::full_stack);
  auto rc = prefill(rn, ced, f.prompt, cm::prefill_mode::ced);
  // CED changes nothing the encoder or the decoder KV source's projections compute.
  for (int i = 0; i < full.n_sources(); ++i) {
    EXPECT_EQ(ced.source(i).main, full.source(i).main) << "source layer " << full.source(i).layer;
    EXPECT_EQ(ced.source(i).index, full.source(i).index) << "source layer " << full.source(i).layer;
  }
  // The decoder tail sees a truncated window: an approximation. Measured, bounded loosely.
  const double r = rel_err(rc.values.data(), rf.values.data(), (size_t)V);
  std::printf("CED vs full-stack prefill, last-row logits rel %.3g (argmax %s)\n", r,
              std::max_element(rc.values.begin(), rc.values.end()) - rc.values.begin() ==
                      std::max_element(rf.values.begin(), rf.values.end()) - rf.values.begin()
                  ? "equal"
                  : "differs");
  EXPECT_GT(r, 0.0);  // the skip really happened
  EXPECT_LE(r, 0.5);  // documented sane bound for a random tiny model (W = 16)
  // Decoder rings start at the tail; encoder rings are complete.
  const int64_t N = (int64_t)f.prompt.size(), W = f.cfg.sliding_window;
  EXPECT_EQ(ced.ring(f.cfg.first_decoder_layer).first_pos, N - W);
  EXPECT_EQ(ced.ring(0).first_pos, 0);
  // With no more than W new rows CED and full stack are the same computation.
  cm::sequence a(f.cfg), b(f.cfg);
  auto ra = prefill(rn, a, span_of(f.prompt, 0, (size_t)W), cm::prefill_mode::full_stack, true);
  auto rb = prefill(rn, b, span_of(f.prompt, 0, (size_t)W), cm::prefill_mode::ced, true);
  EXPECT_EQ(ra.values, rb.values);
}

TEST(forward_replay, full_replay_is_exact_and_bounded_replay_close) {
  const fx& f = tiny();
  const int V = (int)f.cfg.vocab_size;
  cm::runner rn(*f.eng);
  cm::sequence live(f.cfg);
  prefill(rn, live, f.prompt, cm::prefill_mode::full_stack);
  const cm::sequence_snapshot snap = live.snapshot();
  // odd prompt: the ratio-2 sources hold one pending token each
  for (const auto& s : snap.sources) EXPECT_LE(s.n_pending, 1);

  cm::sequence all(f.cfg), bounded(f.cfg);
  ASSERT_TRUE(all.restore(snap).ok());
  ASSERT_TRUE(bounded.restore(snap).ok());
  ASSERT_TRUE(rn.replay(all, (int)f.prompt.size()).ok());
  ASSERT_TRUE(rn.replay(bounded, f.cfg.sliding_window).ok());
  // Replay reads the persisted global KV and never rewrites it.
  const cm::sequence_snapshot after = bounded.snapshot();
  for (size_t i = 0; i < snap.sources.size(); ++i) {
    EXPECT_EQ(after.sources[i].main, snap.sources[i].main);
    EXPECT_EQ(after.sources[i].index, snap.sources[i].index);
    EXPECT_EQ(after.sources[i].pending_kv, snap.sources[i].pending_kv);
  }
  EXPECT_EQ(after.ngram_history, snap.ngram_history);

  std::vector<float> ll, la, lb;
  double worst_all = 0, worst_bounded = 0;
  for (int step = 0; step < 6; ++step) {
    const int32_t t = f.prompt[(size_t)(3 * step + 5)];
    cm::sequence* p = &live;
    cm::sequence* q = &all;
    cm::sequence* r = &bounded;
    ASSERT_TRUE(rn.decode_step({&p, 1}, {&t, 1}, ll).ok());
    ASSERT_TRUE(rn.decode_step({&q, 1}, {&t, 1}, la).ok());
    ASSERT_TRUE(rn.decode_step({&r, 1}, {&t, 1}, lb).ok());
    worst_all = std::max(worst_all, rel_err(la.data(), ll.data(), (size_t)V));
    worst_bounded = std::max(worst_bounded, rel_err(lb.data(), ll.data(), (size_t)V));
  }
  std::printf("replay of every token vs live: rel %.3g; bounded replay (W=%d) vs live: rel %.3g\n", worst_all,
              f.cfg.sliding_window, worst_bounded);
  EXPECT_LE(worst_all, 1e-4);
  EXPECT_LE(worst_bounded, 0.5);
}

// Resume hints: the selections of the last rows travel with the snapshot; bounded replay
// reuses them, so the replayed rows attend to exactly the entries the live pass chose.
TEST(forward_replay, resume_hints_are_the_exact_selections) {
  const fx& f = tiny();
  const int V = (int)f.cfg.vocab_size, W = f.cfg.sliding_window, K = f.cfg.index_topk;
  const int64_t N = (int64_t)f.prompt.size();
  cm::runner rn(*f.eng);
  cm::sequence live(f.cfg);
  cm::forward_trace tl;
  cm::prefill_options o;
  o.mode = cm::prefill_mode::full_stack;
  o.trace = &tl;
  ASSERT_TRUE(rn.prefill(live, f.prompt, o).ok());
  ASSERT_GT(live.n_index_layers(), 0);
  const cm::sequence_snapshot snap = live.snapshot();
  const cm::index_selections& h = snap.selections;
  EXPECT_EQ(h.n_rows, live.selection_capacity());
  EXPECT_EQ(h.first_pos + h.n_rows, N);
  ASSERT_EQ(h.ids.size(), (size_t)live.n_index_layers() * h.n_rows * K);
  for (int j = 0; j < live.n_index_layers(); ++j) {
    const int l = live.index_layers()[(size_t)j];
    for (int i = 0; i < h.n_rows; ++i)
      for (int k = 0; k < K; ++k)
        ASSERT_EQ(h.ids[((size_t)j * h.n_rows + i) * K + k], tl.topk[l][(size_t)(h.first_pos + i) * K + k])
            << "layer " << l << " row " << h.first_pos + i;
  }

  cm::sequence_snapshot bare = snap;
  bare.selections = {};
  cm::sequence hinted(f.cfg), rescored(f.cfg);
  ASSERT_TRUE(hinted.restore(snap).ok());
  ASSERT_TRUE(rescored.restore(bare).ok());
  EXPECT_EQ(hinted.selections_from(), h.first_pos);
  EXPECT_EQ(rescored.selections_from(), N);
  cm::forward_trace th, tr;
  ASSERT_TRUE(rn.replay(hinted, W, true, &th).ok());
  ASSERT_TRUE(rn.replay(rescored, W, true, &tr).ok());
  const int64_t start = N - W - (N - W) % 2;  // the tiny config's ratios: 1 and 2
  int differ = 0;
  for (int l : live.index_layers()) {
    for (int64_t p = start; p < N; ++p) {
      const size_t row = (size_t)(p - start);
      const bool eq_live = std::equal(th.topk[l].begin() + row * K, th.topk[l].begin() + (row + 1) * K,
                                      tl.topk[l].begin() + p * K);
      if (p >= h.first_pos) EXPECT_TRUE(eq_live) << "hinted replay, layer " << l << " row " << p;
      differ += !std::equal(tr.topk[l].begin() + row * K, tr.topk[l].begin() + (row + 1) * K,
                            tl.topk[l].begin() + p * K);
    }
  }
  // Replay never records its own rows: the hints stay the live pass's.
  EXPECT_EQ(hinted.snapshot().selections.ids, h.ids);

  std::vector<float> ll, lh, lr;
  double worst_h = 0, worst_r = 0;
  for (int step = 0; step < 6; ++step) {
    const int32_t t = f.prompt[(size_t)(3 * step + 5)];
    cm::sequence* a = &live;
    cm::sequence* b = &hinted;
    cm::sequence* c = &rescored;
    ASSERT_TRUE(rn.decode_step({&a, 1}, {&t, 1}, ll).ok());
    ASSERT_TRUE(rn.decode_step({&b, 1}, {&t, 1}, lh).ok());
    ASSERT_TRUE(rn.decode_step({&c, 1}, {&t, 1}, lr).ok());
    worst_h = std::max(worst_h, rel_err(lh.data(), ll.data(), (size_t)V));
    worst_r = std::max(worst_r, rel_err(lr.data(), ll.data(), (size_t)V));
  }
  std::printf("bounded replay (W=%d) vs live: with resume hints rel %.3g, re-scored rel %.3g "
              "(%d of %lld re-scored row selections differ from live)\n",
              W, worst_h, worst_r, differ, (long long)(N - start) * live.n_index_layers());
  EXPECT_LE(worst_h, 0.5);
  // New rows are recorded after the replay: the hints follow the sequence.
  EXPECT_EQ(hinted.selections_from(), hinted.n_tokens() - hinted.selection_capacity());
  EXPECT_EQ(rescored.selections_from(), N);  // rows from N on only: fewer than a replay needs
  EXPECT_EQ(rescored.snapshot().selections.n_rows, 6);

  // CED prefill: the decoder's index layers see only the last W rows, so hints cover those.
  cm::sequence ced(f.cfg);
  ASSERT_TRUE(rn.prefill(ced, f.prompt).ok());
  EXPECT_EQ(ced.selections_from(), N - W);
}

TEST(forward_replay, bad_resume_hints_are_rejected) {
  const fx& f = tiny();
  const int K = f.cfg.index_topk;
  cm::runner rn(*f.eng);
  cm::sequence live(f.cfg);
  ASSERT_TRUE(rn.prefill(live, f.prompt).ok());
  const cm::sequence_snapshot snap = live.snapshot();
  const int64_t N = live.n_tokens();
  auto expect_bad = [&](cm::index_selections h, const std::string& what) {
    cm::sequence_snapshot bare = snap;
    bare.selections = {};
    cm::sequence s(f.cfg);
    ASSERT_TRUE(s.restore(bare).ok());
    auto st = s.restore_selections(h);
    ASSERT_FALSE(st.ok()) << what;
    EXPECT_NE(st.err().message.find("index selections"), std::string::npos) << st.err().message;
    EXPECT_EQ(s.selections_from(), N) << what << ": no hints after a rejected set";
    ASSERT_TRUE(rn.replay(s, f.cfg.sliding_window).ok());  // replay re-scores instead
  };
  cm::index_selections h = snap.selections;
  h.first_pos -= 1;
  expect_bad(h, "rows not ending at n_tokens");
  h = snap.selections;
  h.ids.pop_back();
  expect_bad(h, "short ids");
  h = snap.selections;
  h.ids[(size_t)(h.n_rows - 1) * K] = (int32_t)N;  // an entry no row can see
  expect_bad(h, "id out of range");
  h = snap.selections;
  h.ids[0] = -1;  // padding before an id
  if (h.ids[1] >= 0) expect_bad(h, "padding before ids");
  // A restore through sequence_snapshot carries them (and checks them the same way).
  cm::sequence ok(f.cfg);
  ASSERT_TRUE(ok.restore(snap).ok());
  EXPECT_EQ(ok.snapshot().selections.ids, snap.selections.ids);
}

TEST(forward_errors, bad_inputs_are_errors) {
  const fx& f = tiny();
  cm::runner rn(*f.eng);
  cm::sequence s(f.cfg);
  const std::vector<int32_t> bad = {1, 2, (int32_t)f.cfg.vocab_size};
  auto r = rn.prefill(s, bad);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.err().message.find("outside the vocabulary"), std::string::npos) << r.err().message;
  EXPECT_EQ(s.n_tokens(), 0);
  EXPECT_FALSE(rn.prefill(s, std::span<const int32_t>{}).ok());
  EXPECT_FALSE(rn.replay(s, 4).ok());
  // replay: n outside [1, n_tokens], a sequence made for another config (replay_start, shared
  // with the cuda backend)
  {
    cm::sequence r(f.cfg);
    prefill(rn, r, span_of(f.prompt, 0, 9), cm::prefill_mode::ced);
    for (int n : {0, -1, 10}) {
      auto e = rn.replay(r, n);
      ASSERT_FALSE(e.ok()) << n;
      EXPECT_NE(e.err().message.find("must be in [1, 9]"), std::string::npos) << e.err().message;
    }
    cm::model_config other = f.cfg;
    other.sliding_window = f.cfg.sliding_window * 2;
    ASSERT_TRUE(cm::finalize(other).ok());
    cm::sequence alien(other);
    auto e = rn.replay(alien, 1);
    ASSERT_FALSE(e.ok());
    EXPECT_NE(e.err().message.find("different model config"), std::string::npos) << e.err().message;
    EXPECT_TRUE(rn.replay(r, 9).ok());
  }
  cm::sequence* twice[2] = {&s, &s};
  const int32_t t2[2] = {3, 4};
  std::vector<float> lg;
  EXPECT_FALSE(rn.decode_step(twice, t2, lg).ok());
  // restore rejects a snapshot whose sizes do not match its token count
  cm::sequence a(f.cfg);
  prefill(rn, a, span_of(f.prompt, 0, 20), cm::prefill_mode::ced);
  cm::sequence_snapshot snap = a.snapshot();
  snap.sources[0].main.pop_back();
  cm::sequence b(f.cfg);
  auto st = b.restore(snap);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.err().message.find("main KV"), std::string::npos) << st.err().message;
}

}  // namespace
