// The cuda backend's bounded replay (a resume after a restore: the SWA rings rebuilt from the
// last tokens, the persisted entries read, never rewritten) and the resume hints its steps
// record, end to end against the CPU runner. Needs a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "model/backend.hpp"
#include "model/model_dir.hpp"
#include "tests/cuda/cuda_test_util.hpp"
#include "tests/cuda_model/model_test_util.hpp"

namespace cm = cedar::model;
using namespace cedar::test_cuda_model;

namespace {

// A live sequence: `n` tokens prefilled on the CPU runner (full stack: every row's selections
// are the exact pass's), then its snapshot (pages, pending rows, n-gram history, hints).
cm::sequence_snapshot live_snapshot(const cm::engine& e, int n, uint32_t seed) {
  auto cpu = cm::make_backend(e, cm::backend_request::cpu);
  EXPECT_TRUE(cpu.ok());
  cm::sequence live(e.config());
  cm::prefill_options o;
  o.mode = cm::prefill_mode::full_stack;
  auto r = (*cpu)->prefill(live, tokens_of(n, e.config().vocab_size, seed), o);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.err().message);
  return live.snapshot();
}

// The rebuilt rings of two sequences compared by value (slots of the last window of every
// layer, dequantised): the fraction of channels whose FP8 code differs and the largest
// difference over the slot's largest value. The GPU's fp32 sums run in another order than the
// CPU's, so a value near a rounding boundary takes the neighbouring code now and then (one
// E4M3 step is at most 1/8 of the value; a block scale that flips moves its block by about as much).
struct ring_diff {
  double channels = 0, worst = 0;
};
ring_diff compare_rings(const cm::model_config& c, const cm::sequence& a, const cm::sequence& g) {
  ring_diff d;
  const int64_t N = a.n_tokens();
  const int hd = c.head_dim;
  std::vector<float> va((size_t)hd), vg((size_t)hd);
  size_t n = 0, diff = 0;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    EXPECT_EQ(a.ring(l).first_pos, g.ring(l).first_pos) << "layer " << l;
    for (int64_t p = std::max<int64_t>({a.ring(l).first_pos, N - c.sliding_window, 0}); p < N; ++p) {
      a.swa_entry(l, p, va.data());
      g.swa_entry(l, p, vg.data());
      float mx = 0;
      for (int i = 0; i < hd; ++i) mx = std::max(mx, std::fabs(va[(size_t)i]));
      for (int i = 0; i < hd; ++i, ++n) {
        const double e = std::fabs((double)va[(size_t)i] - vg[(size_t)i]);
        diff += e > 0;
        d.worst = std::max(d.worst, e / std::max(1e-30, (double)mx));
      }
    }
  }
  d.channels = n ? (double)diff / (double)n : 0;
  return d;
}

struct replay_case {
  int context = 0;  // tokens of the live sequence
  int n = 0;        // tokens replayed (the runtime replays sliding_window)
  bool hints = true;
};

// Restores `snap` twice, replays on the CPU runner and on the GPU at every chunk size, then
// decodes the same `steps` tokens on each side. Checked: the replay's logits (GPU against CPU
// within 2e-3 of the largest logit and the same argmax; chunk sizes against the first within
// 1e-5), the rebuilt rings by value (compare_rings: ≤ 2% of the channels on another code, none
// off by more than a quarter of the slot's largest value), the entries, pending rows
// and n-gram history as restored (replay never rewrites them), the hints unchanged, and the
// decode steps after it. Tensor cores off (mma_off, attn_fp32: the per-row arithmetic, see
// model_test_util.hpp).
void check_replay(const cm::engine& e, const cm::sequence_snapshot& snap0, const replay_case& rc,
                  const std::vector<int>& chunks, const char* what) {
  mma_off no_mma;
  attn_fp32 fp32_attn;
  const cm::model_config& c = e.config();
  const int V = c.vocab_size, steps = 5;
  cm::sequence_snapshot snap = snap0;
  if (!rc.hints) snap.selections = {};
  auto cpu = cm::make_backend(e, cm::backend_request::cpu);
  ASSERT_TRUE(cpu.ok());
  cm::sequence a(c);
  ASSERT_TRUE(a.restore(snap).ok());
  if (rc.hints) {
    ASSERT_LT(a.selections_from(), a.n_tokens());
  }
  auto la = (*cpu)->replay(a, rc.n);
  ASSERT_TRUE(la.ok()) << la.err().message;
  const auto next = tokens_of(steps, V, 77);
  std::vector<std::vector<float>> cpu_steps;
  {
    cm::sequence a2 = a;
    cm::sequence* pa = &a2;
    std::vector<float> lg;
    for (int32_t t : next) {
      ASSERT_TRUE((*cpu)->decode_step({&pa, 1}, {&t, 1}, lg).ok());
      cpu_steps.push_back(lg);
    }
  }
  std::vector<float> first_chunk;
  for (size_t ci = 0; ci < chunks.size(); ++ci) {
    auto gpu = gpu_with_chunk(e, chunks[ci]);
    ASSERT_TRUE(gpu);
    cm::sequence g(c);
    ASSERT_TRUE(g.restore(snap).ok());
    auto lg = gpu->replay(g, rc.n);
    ASSERT_TRUE(lg.ok()) << lg.err().message;
    ASSERT_EQ(lg->n_rows, la->n_rows);
    ASSERT_EQ(lg->first_pos, la->first_pos);
    ASSERT_EQ(lg->values.size(), (size_t)V);
    const double d_cpu = rel_diff(la->values.data(), lg->values.data(), (size_t)V);
    EXPECT_LE(d_cpu, 2e-3) << what << " chunk " << chunks[ci];
    EXPECT_EQ(argmax_of(la->values.data(), V), argmax_of(lg->values.data(), V)) << what << " chunk " << chunks[ci];
    double d_chunk = 0;
    if (ci == 0) first_chunk = lg->values;
    else d_chunk = rel_diff(first_chunk.data(), lg->values.data(), (size_t)V);
    EXPECT_LE(d_chunk, 1e-5) << what << " chunk " << chunks[ci];
    // the rebuilt rings against the CPU's by value; everything else exactly as restored
    const state_diff sd = compare_state(c, a, g);
    EXPECT_EQ(sd.entries, 0.0) << what;
    const ring_diff rd = compare_rings(c, a, g);
    EXPECT_LE(rd.channels, 0.02) << what << " chunk " << chunks[ci];
    EXPECT_LE(rd.worst, 0.25) << what << " chunk " << chunks[ci];
    const cm::sequence_snapshot after = g.snapshot();
    for (size_t i = 0; i < snap.sources.size(); ++i) {
      EXPECT_EQ(after.sources[i].main, snap.sources[i].main) << what << " source " << i;
      EXPECT_EQ(after.sources[i].index, snap.sources[i].index) << what << " source " << i;
      EXPECT_EQ(after.sources[i].pending_kv, snap.sources[i].pending_kv) << what << " source " << i;
    }
    EXPECT_EQ(after.ngram_history, snap.ngram_history) << what;
    EXPECT_EQ(after.selections.ids, snap.selections.ids) << what << ": a replay records no hints of its own";
    // decoding goes on from the rebuilt state as it does on the CPU
    cm::sequence* pg = &g;
    std::vector<float> l;
    double d_steps = 0;
    for (int k = 0; k < steps; ++k) {
      ASSERT_TRUE(gpu->decode_step({&pg, 1}, {&next[(size_t)k], 1}, l).ok());
      d_steps = std::max(d_steps, rel_diff(cpu_steps[(size_t)k].data(), l.data(), (size_t)V));
    }
    EXPECT_LE(d_steps, 2e-3) << what << " chunk " << chunks[ci];
    std::printf("[%s] chunk %3d: replay of %d at %d vs cpu %.3g rel (vs chunk %d: %.3g); ring slots with a code of "
                "their own %.1f%%, channels %.3f%% (worst %.3g of the slot's largest); %d decode steps after it %.3g rel\n",
                what, chunks[ci], rc.n, rc.context, d_cpu, chunks[0], d_chunk, 100 * sd.ring, 100 * rd.channels, rd.worst,
                steps, d_steps);
  }
}

}  // namespace

// The shipped model (window 64, ratio-1 and ratio-2 sources, Engram, the candidate pool): the
// runtime's replay (the last window, every row hinted) with and without the hints, and a
// longer one (200 rows: rows before the hints score, chunks that mix scored and hinted rows,
// the extended ring over several chunks); chunks of 1 row, an odd size, the window and more.
TEST(cuda_replay, shipped_model_matches_cpu_runner) {
  CEDAR_REQUIRE_GPU();
  auto m = load_shipped_model();
  ASSERT_TRUE(m.eng);
  const int W = m.eng->config().sliding_window;
  const auto snap = live_snapshot(*m.eng, 301, 4);
  check_replay(*m.eng, snap, {301, W, true}, {64, 1, 7, 128}, "shipped hinted");
  check_replay(*m.eng, snap, {301, W, false}, {64, 7}, "shipped re-scored");
  check_replay(*m.eng, snap, {301, 200, true}, {128, 50, 64}, "shipped 200 rows");
}

// Ratio-4 sources (a replay start rounded down to their groups, pending rows kept), FP8
// projections and FP4 experts in the official layout, random weights.
TEST(cuda_replay, ratio4_fp8_random_model_matches_cpu_runner) {
  CEDAR_REQUIRE_GPU();
  random_fp8_model r(12, "cedar_cuda_replay_r4.safetensors");
  ASSERT_TRUE(r.eng);
  const cm::engine* e = &*r.eng;
  const cm::model_config& c = e->config();
  const auto snap = live_snapshot(*e, 263, 9);
  check_replay(*e, snap, {263, c.sliding_window, true}, {64, 5}, "ratio-4 fp8 hinted");
  check_replay(*e, snap, {263, 150, false}, {64}, "ratio-4 fp8 re-scored");
}

// The GPU's steps record their rows' index selections as resume hints, as the CPU runner does:
// after a GPU prefill (chunks of 50) and decode steps, the hints cover the same rows as the CPU
// runner's from the same tokens and hold the same ids (all but a few rows where near-equal
// scores may fall the other way); a GPU replay from a snapshot of the GPU-run sequence then
// follows the CPU's replay of the CPU-run one.
TEST(cuda_replay, gpu_steps_record_resume_hints) {
  CEDAR_REQUIRE_GPU();
  auto m = load_shipped_model();
  ASSERT_TRUE(m.eng);
  mma_off no_mma;
  attn_fp32 fp32_attn;
  const cm::model_config& c = m.eng->config();
  const int V = c.vocab_size, K = c.index_topk, W = c.sliding_window;
  auto cpu = cm::make_backend(*m.eng, cm::backend_request::cpu);
  ASSERT_TRUE(cpu.ok());
  auto gpu = gpu_with_chunk(*m.eng, 50);
  ASSERT_TRUE(gpu);
  const auto prompt = tokens_of(173, V, 21), next = tokens_of(12, V, 22);
  for (cm::prefill_mode mode : {cm::prefill_mode::full_stack, cm::prefill_mode::ced}) {
    const char* what = mode == cm::prefill_mode::ced ? "ced" : "full";
    cm::prefill_options o;
    o.mode = mode;
    cm::sequence a(c), g(c);
    ASSERT_TRUE((*cpu)->prefill(a, prompt, o).ok());
    ASSERT_TRUE(gpu->prefill(g, prompt, o).ok());
    EXPECT_EQ(g.selections_from(), a.selections_from()) << what << " after the prefill";
    cm::sequence* pa = &a;
    cm::sequence* pg = &g;
    std::vector<float> l;
    for (int32_t t : next) {
      ASSERT_TRUE((*cpu)->decode_step({&pa, 1}, {&t, 1}, l).ok());
      ASSERT_TRUE(gpu->decode_step({&pg, 1}, {&t, 1}, l).ok());
    }
    ASSERT_LT(a.selections_from(), a.n_tokens());
    EXPECT_EQ(g.selections_from(), a.selections_from()) << what;
    const cm::index_selections ha = a.selections(1 << 20), hg = g.selections(1 << 20);
    ASSERT_EQ(hg.first_pos, ha.first_pos);
    ASSERT_EQ(hg.n_rows, ha.n_rows);
    ASSERT_EQ(hg.ids.size(), ha.ids.size());
    const size_t rows = ha.ids.size() / (size_t)K;
    size_t same = 0;
    for (size_t r = 0; r < rows; ++r) same += std::equal(ha.ids.begin() + r * K, ha.ids.begin() + (r + 1) * K, hg.ids.begin() + r * K);
    std::printf("[hints %s] %d rows from %lld, %d index layers: %zu of %zu row selections equal to the CPU's\n", what,
                ha.n_rows, (long long)ha.first_pos, a.n_index_layers(), same, rows);
    EXPECT_GE(same, rows * 97 / 100) << what;
    if (mode != cm::prefill_mode::full_stack) continue;
    // a resume of each: the GPU's replay with the GPU's hints against the CPU's with the CPU's
    cm::sequence ra(c), rg(c);
    ASSERT_TRUE(ra.restore(a.snapshot()).ok());
    ASSERT_TRUE(rg.restore(g.snapshot()).ok());
    auto xa = (*cpu)->replay(ra, W);
    auto xg = gpu->replay(rg, W);
    ASSERT_TRUE(xa.ok() && xg.ok());
    const double d = rel_diff(xa->values.data(), xg->values.data(), (size_t)V);
    std::printf("[hints %s] replay from each side's snapshot: %.3g rel\n", what, d);
    EXPECT_LE(d, 2e-3);
    EXPECT_EQ(argmax_of(xa->values.data(), V), argmax_of(xg->values.data(), V));
  }
}

// Bad input: n outside [1, n_tokens] and a sequence of another config are errors naming them;
// the sequence is left as it was and still replays.
TEST(cuda_replay, bad_input_is_an_error_and_leaves_the_sequence_alone) {
  CEDAR_REQUIRE_GPU();
  auto m = load_shipped_model();
  ASSERT_TRUE(m.eng);
  const cm::model_config& c = m.eng->config();
  auto gpu = cm::make_backend(*m.eng, cm::backend_request::cuda);
  ASSERT_TRUE(gpu.ok());
  const auto snap = live_snapshot(*m.eng, 90, 3);
  cm::sequence s(c);
  ASSERT_TRUE(s.restore(snap).ok());
  const uint64_t v = s.version();
  for (int n : {0, -3, 91}) {
    auto r = (*gpu)->replay(s, n);
    ASSERT_FALSE(r.ok()) << n;
    EXPECT_NE(r.err().message.find("must be in [1, 90]"), std::string::npos) << r.err().message;
  }
  EXPECT_EQ(s.version(), v);
  cm::model_config other = c;
  other.sliding_window = c.sliding_window * 2;
  ASSERT_TRUE(cm::finalize(other).ok());
  cm::sequence alien(other);
  auto r = (*gpu)->replay(alien, 1);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.err().message.find("different model config"), std::string::npos) << r.err().message;
  auto ok = (*gpu)->replay(s, c.sliding_window);
  ASSERT_TRUE(ok.ok()) << ok.err().message;
  EXPECT_EQ(ok->first_pos, 89);
}
