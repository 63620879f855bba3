// The cuda backend against the CPU runner (its reference), end to end on real models: the
// shipped default model (BF16) and a random model written in the official storage layout
// (FP8 + UE8M0 32x32 projections, packed FP4 experts). Each test prefills on the CPU (the GPU's
// own prefill: prefill_test.cpp), then decodes the same tokens on both backends and compares
// every step's logits (explicit tolerance, same argmax), the cache bytes the GPU wrote back
// into the host sequence, and free greedy generations. Needs a GPU: fails (never skips) without one; run by
// scripts/cuda-tests.sh on the GPU machine.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/qgemv.cuh"
#include "model/backend.hpp"
#include "model/model_dir.hpp"
#include "tests/cuda/cuda_test_util.hpp"
#include "tests/cuda_model/model_test_util.hpp"

namespace cm = cedar::model;
using namespace cedar::test_cuda_model;

namespace {

struct diff_stats {
  double max_abs = 0, max_ref = 0;
  int argmax_diff = 0, rows = 0;
  void add(const float* a, const float* b, int n) {
    for (int i = 0; i < n; ++i) {
      max_abs = std::max(max_abs, (double)std::fabs(a[i] - b[i]));
      max_ref = std::max(max_ref, (double)std::fabs(a[i]));
    }
    argmax_diff += argmax_of(a, n) != argmax_of(b, n);
    ++rows;
  }
  double rel() const { return max_abs / std::max(1e-30, max_ref); }
};

// Fraction of differing packed entries between two byte arrays of `entry`-byte entries.
double entry_diff_fraction(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b, size_t entry) {
  if (a.size() != b.size() || entry == 0) return 1.0;
  const size_t n = a.size() / entry;
  size_t diff = 0;
  for (size_t i = 0; i < n; ++i) diff += std::memcmp(a.data() + i * entry, b.data() + i * entry, entry) != 0;
  return n ? (double)diff / (double)n : 0.0;
}

// Prefills B sequences per backend (different lengths: ratio-2 groups in both phases, SWA
// rings wrapped), decodes `steps` teacher-forced steps (the CPU's greedy tokens) on both.
void compare_decode(const cm::engine& e, const std::vector<int>& lengths, int steps, double tol, const char* what) {
  const cm::model_config& c = e.config();
  auto cpu = cm::make_backend(e, cm::backend_request::cpu);
  // equal states before the first step: both prefill on the CPU
  auto gpu = cuda_backend_with(e, "CEDAR_CUDA_PREFILL", "0");
  ASSERT_TRUE(cpu.ok()) << cpu.err().message;
  ASSERT_TRUE(gpu.ok()) << gpu.err().message;
  ASSERT_EQ((*gpu)->kind(), cm::backend_kind::cuda);
  std::printf("[%s] gpu backend: %s\n", what, (*gpu)->device().c_str());
  const int B = (int)lengths.size();
  std::vector<cm::sequence> a, g;
  for (int r = 0; r < B; ++r) {
    a.emplace_back(c);
    g.emplace_back(c);
  }
  std::vector<int32_t> next((size_t)B);
  for (int r = 0; r < B; ++r) {
    const auto toks = tokens_of(lengths[(size_t)r], c.vocab_size, 100 + r);
    auto la = (*cpu)->prefill(a[(size_t)r], toks);
    auto lg = (*gpu)->prefill(g[(size_t)r], toks);
    ASSERT_TRUE(la.ok() && lg.ok());
    next[(size_t)r] = argmax_of(la->values.data(), c.vocab_size);
  }
  std::vector<cm::sequence*> pa, pg;
  for (int r = 0; r < B; ++r) {
    pa.push_back(&a[(size_t)r]);
    pg.push_back(&g[(size_t)r]);
  }
  diff_stats ds;
  std::vector<float> la, lg;
  for (int s = 0; s < steps; ++s) {
    ASSERT_TRUE((*cpu)->decode_step(pa, next, la).ok());
    auto st = (*gpu)->decode_step(pg, next, lg);
    ASSERT_TRUE(st.ok()) << st.err().message;
    ASSERT_EQ(la.size(), lg.size());
    for (int r = 0; r < B; ++r) {
      ds.add(la.data() + (size_t)r * c.vocab_size, lg.data() + (size_t)r * c.vocab_size, c.vocab_size);
      next[(size_t)r] = argmax_of(la.data() + (size_t)r * c.vocab_size, c.vocab_size);
    }
  }
  double worst_entries = 0;
  for (int r = 0; r < B; ++r) {
    ASSERT_EQ(a[(size_t)r].n_tokens(), g[(size_t)r].n_tokens());
    EXPECT_EQ(a[(size_t)r].tokens(), g[(size_t)r].tokens());
    EXPECT_EQ(a[(size_t)r].ngram_history(), g[(size_t)r].ngram_history());
    for (int i = 0; i < a[(size_t)r].n_sources(); ++i) {
      const auto& sa = a[(size_t)r].source(i);
      const auto& sg = g[(size_t)r].source(i);
      ASSERT_EQ(sa.n_entries, sg.n_entries) << "source " << i;
      ASSERT_EQ(sa.n_pending, sg.n_pending) << "source " << i;
      ASSERT_EQ(sa.main.size(), sg.main.size());
      worst_entries = std::max(worst_entries, entry_diff_fraction(sa.main, sg.main, a[(size_t)r].main_entry_bytes()));
    }
  }
  std::printf("[%s] %d rows x %d steps: max |dlogit| %.3g (%.3g of the largest logit), argmax differs in %d rows, "
              "packed KV entries differing (GPU-written vs CPU) at most %.1f%%\n",
              what, B, steps, ds.max_abs, ds.rel(), ds.argmax_diff, 100 * worst_entries);
  EXPECT_LE(ds.rel(), tol);
  EXPECT_EQ(ds.argmax_diff, 0);
  // entries are re-encoded from fp32 values that differ in the last bits: a few may round
  // to a neighbouring code, most must be identical
  EXPECT_LE(worst_entries, 0.25);
}

}  // namespace

TEST(cuda_decode, shipped_model_batch1_matches_cpu) {
  CEDAR_REQUIRE_GPU();
  auto m = load_shipped_model();
  ASSERT_TRUE(m.eng);
  if (std::getenv("CEDAR_CUDA_TRACE")) {
    // diagnostics: the CPU's residual streams after each layer for the first decoded token
    // (a one-token full-stack prefill is that decode step), to put beside the GPU's trace
    const cm::model_config& c = m.eng->config();
    cm::runner rn(*m.eng);
    cm::sequence s(c);
    auto l0 = rn.prefill(s, tokens_of(301, c.vocab_size, 100));
    ASSERT_TRUE(l0.ok());
    const int32_t t = argmax_of(l0->values.data(), c.vocab_size);
    cm::forward_trace tr;
    cm::prefill_options o;
    o.mode = cm::prefill_mode::full_stack;
    o.trace = &tr;
    ASSERT_TRUE(rn.prefill(s, {&t, 1}, o).ok());
    const size_t per = (size_t)c.hc_mult * c.hidden_size;
    for (int l = 0; l < c.num_hidden_layers; ++l) {
      const float* x = tr.layer_out.data() + (size_t)l * per;
      double sa = 0;
      for (size_t i = 0; i < per; ++i) sa += std::fabs(x[i]);
      std::fprintf(stderr, "cpu  trace: layer %2d  sum|X| %.6g  X[0..3] %.5g %.5g %.5g %.5g\n", l, sa, x[0], x[1], x[2], x[3]);
    }
  }
  compare_decode(*m.eng, {301}, 48, 2e-3, "shipped b1");
}

TEST(cuda_decode, shipped_model_batch5_mixed_lengths_matches_cpu) {
  CEDAR_REQUIRE_GPU();
  auto m = load_shipped_model();
  ASSERT_TRUE(m.eng);
  // lengths: shorter than the window, odd/even (ratio-2 pending rows), several windows
  compare_decode(*m.eng, {7, 64, 65, 190, 1031}, 40, 2e-3, "shipped b5");
}

TEST(cuda_decode, fp8_fp4_random_model_matches_cpu) {
  CEDAR_REQUIRE_GPU();
  auto m = load_shipped_model();
  ASSERT_TRUE(m.eng);
  cm::model_config c = m.eng->config();  // the shipped shape, random weights in the official layout
  const auto path = std::filesystem::temp_directory_path() / "cedar_cuda_fp8_random.safetensors";
  ASSERT_TRUE(cm::write_random_checkpoint(c, 7, cm::storage_layout::fp8, path.string()).ok());
  cm::engine_options o;
  o.engram_token_map = m.eng->engram_token_map();
  auto e = cm::engine::load(c, path.string(), o);
  ASSERT_TRUE(e.ok()) << e.err().message;
  compare_decode(*e, {130, 33}, 24, 2e-3, "fp8/fp4 random");
  std::filesystem::remove(path);
}

// After GPU decode steps, a prefill (a tool result) changes the sequence: run by the CPU runner
// (CEDAR_CUDA_PREFILL=0) it makes the device mirror stale, which the next step rebuilds; run on
// the GPU it keeps the mirror in step. Either way decoding continues in step with the CPU.
TEST(cuda_decode, mirror_follows_prefill_between_decode_steps) {
  for (const char* on : {"0", "1"}) {
  CEDAR_REQUIRE_GPU();
  auto m = load_shipped_model();
  ASSERT_TRUE(m.eng);
  const cm::model_config& c = m.eng->config();
  auto cpu = cm::make_backend(*m.eng, cm::backend_request::cpu);
  auto gpu = cuda_backend_with(*m.eng, "CEDAR_CUDA_PREFILL", on);
  ASSERT_TRUE(cpu.ok() && gpu.ok());
  // the vector kernels for the GPU's prefill chunks (the per-row arithmetic; prefill_test.cpp
  // measures what the tensor cores change)
  cedar::kernels::cuda::set_qgemv_mma(false);
  cm::sequence a(c), g(c);
  const auto p1 = tokens_of(150, c.vocab_size, 1), p2 = tokens_of(37, c.vocab_size, 2);
  ASSERT_TRUE((*cpu)->prefill(a, p1).ok());
  ASSERT_TRUE((*gpu)->prefill(g, p1).ok());
  diff_stats ds;
  std::vector<float> la, lg;
  cm::sequence* pa = &a;
  cm::sequence* pg = &g;
  int32_t t = 11;
  for (int round = 0; round < 3; ++round) {
    for (int s = 0; s < 10; ++s) {
      ASSERT_TRUE((*cpu)->decode_step({&pa, 1}, {&t, 1}, la).ok());
      ASSERT_TRUE((*gpu)->decode_step({&pg, 1}, {&t, 1}, lg).ok());
      ds.add(la.data(), lg.data(), c.vocab_size);
      t = argmax_of(la.data(), c.vocab_size);
    }
    // the tool result arrives: prefilled on the CPU into both sequences
    ASSERT_TRUE((*cpu)->prefill(a, p2).ok());
    ASSERT_TRUE((*gpu)->prefill(g, p2).ok());
  }
  std::printf("[mirror, GPU prefill %s] max |dlogit| %.3g (%.3g rel), argmax differs %d of %d\n", on, ds.max_abs,
              ds.rel(), ds.argmax_diff, ds.rows);
  cedar::kernels::cuda::set_qgemv_mma(true);
  EXPECT_LE(ds.rel(), 2e-3);
  EXPECT_EQ(ds.argmax_diff, 0);
  }
}

// Free greedy generation: the same 40 tokens on both backends.
TEST(cuda_decode, greedy_generation_identical) {
  CEDAR_REQUIRE_GPU();
  auto m = load_shipped_model();
  ASSERT_TRUE(m.eng);
  const cm::model_config& c = m.eng->config();
  auto cpu = cm::make_backend(*m.eng, cm::backend_request::cpu);
  auto gpu = cuda_backend_with(*m.eng, "CEDAR_CUDA_PREFILL", "0");
  ASSERT_TRUE(cpu.ok() && gpu.ok());
  std::vector<int32_t> out[2];
  for (int k = 0; k < 2; ++k) {
    cm::backend& be = k == 0 ? **cpu : **gpu;
    cm::sequence s(c);
    auto l = be.prefill(s, tokens_of(222, c.vocab_size, 9));
    ASSERT_TRUE(l.ok());
    int32_t t = argmax_of(l->values.data(), c.vocab_size);
    std::vector<float> lg;
    cm::sequence* ps = &s;
    for (int i = 0; i < 40; ++i) {
      out[k].push_back(t);
      ASSERT_TRUE(be.decode_step({&ps, 1}, {&t, 1}, lg).ok());
      t = argmax_of(lg.data(), c.vocab_size);
    }
  }
  EXPECT_EQ(out[0], out[1]);
}

TEST(cuda_decode, bad_input_is_an_error_not_a_crash) {
  CEDAR_REQUIRE_GPU();
  auto m = load_shipped_model();
  ASSERT_TRUE(m.eng);
  auto gpu = cm::make_backend(*m.eng, cm::backend_request::cuda);
  ASSERT_TRUE(gpu.ok());
  cm::sequence s(m.eng->config());
  cm::sequence* ps = &s;
  std::vector<float> lg;
  int32_t bad = m.eng->config().vocab_size + 5;
  auto st = (*gpu)->decode_step({&ps, 1}, {&bad, 1}, lg);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.err().message.find("outside the vocabulary"), std::string::npos) << st.err().message;
  cm::sequence* twice[2] = {ps, ps};
  int32_t toks[2] = {5, 6};
  EXPECT_FALSE((*gpu)->decode_step(twice, toks, lg).ok());
}

// Steps replayed from the captured CUDA graph give exactly the logits of steps launched op by
// op (CEDAR_CUDA_GRAPHS=0 when the backend is made): same kernels, same inputs, same order.
TEST(cuda_decode, graph_replay_equals_eager_launches) {
  CEDAR_REQUIRE_GPU();
  auto m = load_shipped_model();
  ASSERT_TRUE(m.eng);
  const cm::model_config& c = m.eng->config();
  auto eager = cuda_backend_with(*m.eng, "CEDAR_CUDA_GRAPHS", "0");
  auto graph = cm::make_backend(*m.eng, cm::backend_request::cuda);
  ASSERT_TRUE(eager.ok() && graph.ok());
  std::vector<cm::sequence> a, g;
  for (int r = 0; r < 3; ++r) {
    a.emplace_back(c);
    g.emplace_back(c);
    const auto t = tokens_of(90 + 41 * r, c.vocab_size, 50 + r);
    ASSERT_TRUE((*eager)->prefill(a.back(), t).ok());
    ASSERT_TRUE((*graph)->prefill(g.back(), t).ok());
  }
  std::vector<cm::sequence*> pa = {&a[0], &a[1], &a[2]}, pg = {&g[0], &g[1], &g[2]};
  std::vector<int32_t> next = {5, 6, 7};
  std::vector<float> la, lg;
  int identical = 0;
  const int steps = 20;
  for (int s = 0; s < steps; ++s) {
    ASSERT_TRUE((*eager)->decode_step(pa, next, la).ok());
    ASSERT_TRUE((*graph)->decode_step(pg, next, lg).ok());
    identical += la == lg;
    for (int r = 0; r < 3; ++r) next[(size_t)r] = argmax_of(la.data() + (size_t)r * c.vocab_size, c.vocab_size);
  }
  EXPECT_EQ(identical, steps);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(a[(size_t)r].source(0).main, g[(size_t)r].source(0).main);
}

// Two backends that differ in one switch give the same logits and caches, for prefill chunks,
// captured decode steps of 3 rows and their replays — alone, and with the other small-step
// switches (the shared expert's down projection in the routed experts' launch, the SWA entry on
// the side stream).
namespace {
void expect_switch_changes_no_bit(const char* name, const char* off, const char* on) {
  auto m = load_shipped_model();
  ASSERT_TRUE(m.eng);
  const cm::model_config& c = m.eng->config();
  for (const bool others : {false, true}) {
    const std::string mode = std::string(name) + (others ? " with the others" : " alone");
    setenv("CEDAR_CUDA_FUSE_SHARED", others ? "8" : "0", 1);
    setenv("CEDAR_CUDA_SWA_SIDE", others ? "1" : "0", 1);
    auto plain = cuda_backend_with(*m.eng, name, off);
    auto other = cuda_backend_with(*m.eng, name, on);
    unsetenv("CEDAR_CUDA_FUSE_SHARED");
    unsetenv("CEDAR_CUDA_SWA_SIDE");
    ASSERT_TRUE(plain.ok()) << plain.err().message;
    ASSERT_TRUE(other.ok()) << other.err().message;
    std::vector<cm::sequence> a, b;
    for (int r = 0; r < 3; ++r) {
      a.emplace_back(c);
      b.emplace_back(c);
      const auto t = tokens_of(70 + 53 * r, c.vocab_size, 80 + r);
      auto la = (*plain)->prefill(a.back(), t);
      auto lb = (*other)->prefill(b.back(), t);
      ASSERT_TRUE(la.ok() && lb.ok());
      EXPECT_EQ(la->values, lb->values) << "mode " << mode << " prefill " << r;
    }
    std::vector<cm::sequence*> pa = {&a[0], &a[1], &a[2]}, pb = {&b[0], &b[1], &b[2]};
    std::vector<int32_t> next = {5, 6, 7};
    std::vector<float> la, lb;
    int identical = 0;
    const int steps = 12;
    for (int s = 0; s < steps; ++s) {
      ASSERT_TRUE((*plain)->decode_step(pa, next, la).ok());
      ASSERT_TRUE((*other)->decode_step(pb, next, lb).ok());
      identical += la == lb;
      for (int r = 0; r < 3; ++r) next[(size_t)r] = argmax_of(la.data() + (size_t)r * c.vocab_size, c.vocab_size);
    }
    EXPECT_EQ(identical, steps) << "mode " << mode;
    for (int r = 0; r < 3; ++r) EXPECT_EQ(a[(size_t)r].source(0).main, b[(size_t)r].source(0).main) << "mode " << mode;
    auto ra = (*plain)->replay(a[1], 40);
    auto rb = (*other)->replay(b[1], 40);
    ASSERT_TRUE(ra.ok() && rb.ok());
    EXPECT_EQ(ra->values, rb->values) << "mode " << mode << " replay";
  }
}
}  // namespace

// The L2 lookahead (CEDAR_CUDA_L2_LOOKAHEAD=1: prefetches of later kernels' weights on a third
// stream, forked once a layer and joined before the head) changes no bit (against =0).
TEST(cuda_decode, l2_lookahead_changes_no_bit) {
  CEDAR_REQUIRE_GPU();
  expect_switch_changes_no_bit("CEDAR_CUDA_L2_LOOKAHEAD", "0", "1");
}

// The kernels compiled for their launch's case (the mHC sites' hc_fn format and tail, the
// gathers' table format) give the generic kernels' bits (CEDAR_CUDA_GENERIC=3: both generic).
TEST(cuda_decode, compiled_kernel_forms_change_no_bit) {
  CEDAR_REQUIRE_GPU();
  expect_switch_changes_no_bit("CEDAR_CUDA_GENERIC", "3", "0");
}

// The SwiGLU taken on the down projection's load (moe_down_swiglu, CEDAR_CUDA_SWIGLU_DOWN=1)
// gives the bits of the swiglu_rows launches (=0): routed alone, and with the shared expert in
// the down launch (the helper's second mode, FUSE_SHARED=8).
TEST(cuda_decode, swiglu_on_the_down_load_changes_no_bit) {
  CEDAR_REQUIRE_GPU();
  expect_switch_changes_no_bit("CEDAR_CUDA_SWIGLU_DOWN", "0", "1");
}

// The mHC sites' mix reductions in the next grouped projections' launch (no side-stream fork)
// give the bits of the side-stream launches (CEDAR_CUDA_MIX_IN_GROUP=1 against 0).
TEST(cuda_decode, mix_reduction_in_the_grouped_launch_changes_no_bit) {
  CEDAR_REQUIRE_GPU();
  expect_switch_changes_no_bit("CEDAR_CUDA_MIX_IN_GROUP", "0", "1");
}

// CEDAR_CUDA_STEP_PHASES=1: every step reports its device time split at events inside the step
// (graph launch + upload, kernels, downloads; a graph replay adds the host's cudaGraphLaunch
// call) — eager, captured and replayed steps alike — and the three device phases add up to the
// step's device time; the logits equal those of a backend without the events.
TEST(cuda_decode, step_phases_split_the_device_time) {
  CEDAR_REQUIRE_GPU();
  auto m = load_shipped_model();
  ASSERT_TRUE(m.eng);
  const cm::model_config& c = m.eng->config();
  auto plain = cm::make_backend(*m.eng, cm::backend_request::cuda);
  auto timed = cuda_backend_with(*m.eng, "CEDAR_CUDA_STEP_PHASES", "1");
  ASSERT_TRUE(plain.ok() && timed.ok());
  cm::sequence a(c), g(c);
  const auto t = tokens_of(60, c.vocab_size, 77);
  ASSERT_TRUE((*plain)->prefill(a, t).ok());
  ASSERT_TRUE((*timed)->prefill(g, t).ok());
  cm::sequence *pa = &a, *pg = &g;
  int32_t next = 5;
  std::vector<float> la, lg;
  int replays = 0;
  for (int s = 0; s < 6; ++s) {  // eager, captured, then replayed
    ASSERT_TRUE((*plain)->decode_step({&pa, 1}, {&next, 1}, la).ok());
    auto st = (*timed)->decode_step({&pg, 1}, {&next, 1}, lg);
    ASSERT_TRUE(st.ok()) << "step " << s << ": " << st.err().message;
    EXPECT_EQ(la, lg) << "step " << s;
    EXPECT_TRUE((*plain)->last_step_phases_ms().empty());
    const std::vector<double> ph = (*timed)->last_step_phases_ms();
    ASSERT_GE(ph.size(), 3u) << "step " << s;
    ASSERT_LE(ph.size(), 4u) << "step " << s;
    double sum = 0;
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_GE(ph[i], 0.0) << "step " << s << " phase " << i;
      sum += ph[i];
    }
    EXPECT_GT(ph[1], 0.0) << "step " << s << ": the kernels take time";
    const double dev = (*timed)->last_step_device_ms();
    EXPECT_NEAR(sum, dev, 1e-3 + 1e-3 * dev) << "step " << s;
    if (ph.size() == 4) {  // a replay: its host launch call
      EXPECT_GE(ph[3], 0.0);
      ++replays;
    }
    next = argmax_of(la.data(), c.vocab_size);
  }
  EXPECT_GE(replays, 1) << "no step was a graph replay";
}
