// The cuda backend's prefill (chunks of consecutive rows of one sequence on the GPU), end to
// end. The chunk logic first, with the per-row arithmetic of the vector kernels: every chunk
// size gives the same logits and the same sequence (entries, rings, pending rows) as one row
// per step; the full stack equals the GPU's decode steps token by token (which test_cuda_model
// checks against the CPU runner step by step); the CPU runner's prefill on calls of up to a
// few hundred rows; CED's cut. Then what the tensor-core projections change, all_logits, and
// bad input. Prompts are split over several calls at odd positions (groups left pending across
// calls and chunks), longer than the window, chunks below, at and above the window. Needs a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/qgemv.cuh"
#include "model/backend.hpp"
#include "model/model_dir.hpp"
#include "tests/cuda/cuda_test_util.hpp"
#include "tests/cuda_model/model_test_util.hpp"

namespace cm = cedar::model;
using namespace cedar::test_cuda_model;

namespace {

// Prefills `parts` (consecutive calls, each at the position the last left) with the GPU at
// every chunk size, the attention's launch shape fixed (attn_fixed); the first chunk size is
// the reference the others must equal: each call's logits within 1e-5 and the same sequence
// state. With the built-in shape (the key split depends on the row count) each chunk size's
// logits within 5e-2 of the reference (a flipped cache code carries over a long prompt). Then the same calls through the reference: the
// CPU runner (cpu_calls of them, tolerance 2e-3 and the same argmax) and, for full_stack,
// the GPU's own decode steps token by token (the path test_cuda_model checks against the
// CPU step by step; tolerance 1e-5). Tensor cores off (mma_off, attn_fp32) but in the built-in part.
void check_chunks(const cm::engine& e, const std::vector<int>& parts, const std::vector<int>& chunks,
                  cm::prefill_mode mode, size_t cpu_calls, const char* what) {
  mma_off no_mma;
  std::optional<attn_fp32> fp32_attn(std::in_place);
  std::optional<attn_fixed> fixed(std::in_place);
  const cm::model_config& c = e.config();
  const int V = c.vocab_size;
  cm::prefill_options o;
  o.mode = mode;
  std::vector<std::vector<float>> ref_logits;
  cm::sequence ref(c);
  for (size_t ci = 0; ci < chunks.size(); ++ci) {
    auto gpu = gpu_with_chunk(e, chunks[ci]);
    ASSERT_TRUE(gpu);
    cm::sequence g(c);
    double worst = 0;
    uint32_t seed = 300;
    for (size_t k = 0; k < parts.size(); ++k) {
      const auto toks = tokens_of(parts[k], V, seed++);
      auto lg = gpu->prefill(g, toks, o);
      ASSERT_TRUE(lg.ok()) << lg.err().message;
      ASSERT_EQ(lg->n_rows, 1);
      ASSERT_EQ(lg->first_pos, g.n_tokens() - 1);
      ASSERT_EQ(lg->values.size(), (size_t)V);
      if (ci == 0) ref_logits.push_back(lg->values);
      else worst = std::max(worst, rel_diff(ref_logits[k].data(), lg->values.data(), (size_t)V));
    }
    if (ci == 0) {
      ref = g;
      continue;
    }
    const state_diff sd = compare_state(c, ref, g);
    std::printf("[%s] chunk %3d against chunk %d: logits %.3g rel; entries differing %.1f%%, ring %.1f%%, pending %.3g\n",
                what, chunks[ci], chunks[0], worst, 100 * sd.entries, 100 * sd.ring, sd.pending);
    EXPECT_LE(worst, 1e-5) << what << " chunk " << chunks[ci];
    EXPECT_LE(sd.entries, 0.01) << what << " chunk " << chunks[ci];
    EXPECT_LE(sd.ring, 0.01) << what << " chunk " << chunks[ci];
    EXPECT_LE(sd.pending, 1e-5) << what << " chunk " << chunks[ci];
  }
  // the CPU runner's prefill, call by call
  auto cpu = cm::make_backend(e, cm::backend_request::cpu);
  ASSERT_TRUE(cpu.ok());
  cm::sequence a(c);
  uint32_t seed = 300;
  double worst_cpu = 0;
  for (size_t k = 0; k < std::min(cpu_calls, parts.size()); ++k) {
    const auto toks = tokens_of(parts[k], V, seed++);
    auto la = (*cpu)->prefill(a, toks, o);
    ASSERT_TRUE(la.ok());
    worst_cpu = std::max(worst_cpu, rel_diff(la->values.data(), ref_logits[k].data(), (size_t)V));
    EXPECT_EQ(argmax_of(la->values.data(), V), argmax_of(ref_logits[k].data(), V)) << what << " call " << k;
  }
  std::printf("[%s] the CPU runner's prefill, first %zu calls: logits %.3g rel\n", what, std::min(cpu_calls, parts.size()),
              worst_cpu);
  EXPECT_LE(worst_cpu, 2e-3) << what;
  // the attention's built-in launch shape and kernel choice (the key split depends on the row
  // count; chunks of 8+ rows take the tensor-core kernel at 16 heads): the same calls at every
  // chunk size stay close to the fixed-shape reference, no more
  fixed.reset();
  fp32_attn.reset();
  for (int chunk : chunks) {
    auto gpu = gpu_with_chunk(e, chunk);
    ASSERT_TRUE(gpu);
    cm::sequence g(c);
    double worst = 0;
    int argmax_same = 0;
    uint32_t sd = 300;
    for (size_t k = 0; k < parts.size(); ++k) {
      auto lg = gpu->prefill(g, tokens_of(parts[k], V, sd++), o);
      ASSERT_TRUE(lg.ok()) << lg.err().message;
      worst = std::max(worst, rel_diff(ref_logits[k].data(), lg->values.data(), (size_t)V));
      argmax_same += argmax_of(ref_logits[k].data(), V) == argmax_of(lg->values.data(), V);
    }
    std::printf("[%s] built-in attention shape, chunk %3d: logits %.3g rel of the fixed shape's, argmax equal in %d of %zu calls\n",
                what, chunk, worst, argmax_same, parts.size());
    EXPECT_LE(worst, 5e-2) << what << " chunk " << chunk;
  }
  fixed.emplace();
  fp32_attn.emplace();
  if (mode != cm::prefill_mode::full_stack) return;
  // the GPU's decode steps, token by token, over every call
  auto gpu = gpu_with_chunk(e, chunks[0]);
  ASSERT_TRUE(gpu);
  cm::sequence t(c);
  cm::sequence* pt = &t;
  std::vector<float> lg;
  double worst_steps = 0;
  seed = 300;
  for (size_t k = 0; k < parts.size(); ++k) {
    const auto toks = tokens_of(parts[k], V, seed++);
    size_t i0 = 0;
    if (t.n_tokens() == 0) {
      auto l0 = gpu->prefill(t, std::span<const int32_t>(toks.data(), 1), o);
      ASSERT_TRUE(l0.ok());
      lg = l0->values;
      i0 = 1;
    }
    for (size_t i = i0; i < toks.size(); ++i) ASSERT_TRUE(gpu->decode_step({&pt, 1}, {&toks[i], 1}, lg).ok());
    worst_steps = std::max(worst_steps, rel_diff(lg.data(), ref_logits[k].data(), (size_t)V));
  }
  const state_diff sd = compare_state(c, t, ref);
  std::printf("[%s] decode steps token by token: logits %.3g rel; entries differing %.1f%%, ring %.1f%%\n", what,
              worst_steps, 100 * sd.entries, 100 * sd.ring);
  EXPECT_LE(worst_steps, 1e-5) << what;
  EXPECT_LE(sd.entries, 0.01) << what;
  EXPECT_LE(sd.ring, 0.01) << what;
}

}  // namespace

// The shipped model (window 64, ratio-2 and ratio-1 sources, Engram, the candidate pool):
// three calls (an odd one first: a group left pending across the calls; the last longer than
// ten windows), chunks of 1 row, an odd size, the window and twice the window; CED (the calls
// above the window cut at the tail) and the full stack. The CPU runner's prefill is compared on
// the first two calls: over a long call its GEMM prefill and its own token-by-token decode part
// (the 700-token call at position 338: 1.5e-2 of the largest logit, the first row past 1e-4 at
// 71 rows in, measured on the CPU alone), and the GPU's chunks follow the latter to 1e-5.
TEST(cuda_prefill, shipped_model_chunks_ced) {
  CEDAR_REQUIRE_GPU();
  auto m = load_shipped_model();
  ASSERT_TRUE(m.eng);
  check_chunks(*m.eng, {301, 37, 700}, {1, 7, 64, 128}, cm::prefill_mode::ced, 2, "shipped ced");
}

TEST(cuda_prefill, shipped_model_chunks_full_stack) {
  CEDAR_REQUIRE_GPU();
  auto m = load_shipped_model();
  ASSERT_TRUE(m.eng);
  check_chunks(*m.eng, {301, 37, 700}, {64, 1, 128}, cm::prefill_mode::full_stack, 2, "shipped full");
}

// Ratio-4 sources (groups of four spread over chunk and call boundaries), FP8 projections and
// FP4 experts in the official layout, random weights.
TEST(cuda_prefill, ratio4_fp8_random_model_chunks) {
  CEDAR_REQUIRE_GPU();
  random_fp8_model r(11, "cedar_cuda_prefill_r4.safetensors");
  ASSERT_TRUE(r.eng);
  const cm::engine* e = &*r.eng;
  check_chunks(*e, {5, 2, 233, 90}, {1, 3, 64, 100}, cm::prefill_mode::ced, 2, "ratio-4 fp8 ced");
  check_chunks(*e, {5, 2, 233, 90}, {3, 1, 100}, cm::prefill_mode::full_stack, 2, "ratio-4 fp8 full");
}

// The default path: bf16 projections of more than 8 rows on tensor cores. Against the vector
// kernel, every row's logits of a 173-row full-stack prefill in chunks of 50: the rows before
// the first FP4/FP8 code that rounds the other way within 1e-4 (measured on an H100: the first
// row past 1e-4 at 87), the worst row within 5e-2 (measured 1.6e-2), the same argmax on nearly
// every row (measured: all 173).
TEST(cuda_prefill, tensor_core_projections_stay_close) {
  CEDAR_REQUIRE_GPU();
  auto m = load_shipped_model();
  ASSERT_TRUE(m.eng);
  const cm::model_config& c = m.eng->config();
  const int V = c.vocab_size, N = 173;
  const auto toks = tokens_of(N, V, 5);
  cm::prefill_options o;
  o.mode = cm::prefill_mode::full_stack;
  o.all_logits = true;
  std::vector<float> v[2];
  for (int k = 0; k < 2; ++k) {
    cedar::kernels::cuda::set_qgemv_mma(k == 1);
    auto gpu = gpu_with_chunk(*m.eng, 50);
    ASSERT_TRUE(gpu);
    cm::sequence g(c);
    auto lg = gpu->prefill(g, toks, o);
    ASSERT_TRUE(lg.ok());
    v[k] = lg->values;
  }
  cedar::kernels::cuda::set_qgemv_mma(true);
  int first = -1, same_argmax = 0;
  double worst = 0;
  for (int r = 0; r < N; ++r) {
    const double d = rel_diff(v[0].data() + (size_t)r * V, v[1].data() + (size_t)r * V, (size_t)V);
    worst = std::max(worst, d);
    if (first < 0 && d > 1e-4) first = r;
    same_argmax += argmax_of(v[0].data() + (size_t)r * V, V) == argmax_of(v[1].data() + (size_t)r * V, V);
  }
  std::printf("[tensor cores] %d rows: first row past 1e-4 %d, worst %.3g, same argmax %d\n", N, first, worst, same_argmax);
  EXPECT_TRUE(first < 0 || first >= 50) << first;
  EXPECT_LE(worst, 5e-2);
  EXPECT_GE(same_argmax, N * 95 / 100);
}

// all_logits: every row's logits, in order, within the tolerance of the CPU's full-stack
// prefill (where every row reaches the head); CED: the tail's rows.
TEST(cuda_prefill, all_logits_rows_match_cpu) {
  CEDAR_REQUIRE_GPU();
  auto m = load_shipped_model();
  ASSERT_TRUE(m.eng);
  const cm::model_config& c = m.eng->config();
  mma_off no_mma;
  for (cm::prefill_mode mode : {cm::prefill_mode::full_stack, cm::prefill_mode::ced}) {
    auto cpu = cm::make_backend(*m.eng, cm::backend_request::cpu);
    ASSERT_TRUE(cpu.ok());
    auto gpu = gpu_with_chunk(*m.eng, 50);
    ASSERT_TRUE(gpu);
    cm::sequence a(c), g(c);
    const auto toks = tokens_of(173, c.vocab_size, 5);
    cm::prefill_options o;
    o.mode = mode;
    o.all_logits = true;
    auto la = (*cpu)->prefill(a, toks, o);
    auto lg = gpu->prefill(g, toks, o);
    ASSERT_TRUE(la.ok() && lg.ok());
    ASSERT_EQ(lg->n_rows, la->n_rows);
    ASSERT_EQ(lg->first_pos, la->first_pos);
    ASSERT_EQ(la->values.size(), lg->values.size());
    double worst = 0;
    int argmax_diff = 0;
    for (int r = 0; r < la->n_rows; ++r) {
      const float* pa = la->values.data() + (size_t)r * c.vocab_size;
      const float* pg = lg->values.data() + (size_t)r * c.vocab_size;
      worst = std::max(worst, rel_diff(pa, pg, (size_t)c.vocab_size));
      argmax_diff += argmax_of(pa, c.vocab_size) != argmax_of(pg, c.vocab_size);
    }
    std::printf("[all_logits %s] %d rows from %lld: %.3g rel, argmax differs in %d\n",
                mode == cm::prefill_mode::ced ? "ced" : "full", la->n_rows, (long long)la->first_pos, worst, argmax_diff);
    EXPECT_LE(worst, 2e-3);
    EXPECT_EQ(argmax_diff, 0);
  }
}

// Bad input: an empty prompt, an id outside the vocabulary, more positions than the model
// has — each an error naming it, the sequence untouched; then the backend still prefills.
TEST(cuda_prefill, bad_input_is_an_error_and_leaves_the_sequence_alone) {
  CEDAR_REQUIRE_GPU();
  auto m = load_shipped_model();
  ASSERT_TRUE(m.eng);
  const cm::model_config& c = m.eng->config();
  auto gpu = cm::make_backend(*m.eng, cm::backend_request::cuda);
  ASSERT_TRUE(gpu.ok());
  cm::sequence s(c);
  auto r0 = (*gpu)->prefill(s, std::vector<int32_t>{});
  ASSERT_FALSE(r0.ok());
  EXPECT_NE(r0.err().message.find("no tokens"), std::string::npos) << r0.err().message;
  std::vector<int32_t> bad = {5, 6, (int32_t)c.vocab_size + 2};
  auto r1 = (*gpu)->prefill(s, bad);
  ASSERT_FALSE(r1.ok());
  EXPECT_NE(r1.err().message.find("outside the vocabulary"), std::string::npos) << r1.err().message;
  std::vector<int32_t> too_long((size_t)c.max_position_embeddings + 1, 5);
  auto r2 = (*gpu)->prefill(s, too_long);
  ASSERT_FALSE(r2.ok());
  EXPECT_NE(r2.err().message.find("max_position_embeddings"), std::string::npos) << r2.err().message;
  EXPECT_EQ(s.n_tokens(), 0);
  auto ok = (*gpu)->prefill(s, tokens_of(20, c.vocab_size, 1));
  ASSERT_TRUE(ok.ok()) << ok.err().message;
  EXPECT_EQ(s.n_tokens(), 20);
}

// A chunk's routed experts expert by expert (the items sorted by expert after the routing,
// each expert's rows in one projection: CEDAR_CUDA_CHUNK_EXPERTS, on from 16 rows) against
// item by item (each item streams its expert): with the vector kernels the per-row sums are
// the same, so the logits and the sequences agree to the last bits; with the tensor cores
// (bf16 experts of more than 8 rows) within the tensor-core tolerance. The shipped model (bf16)
// and the random FP8 model with FP4 experts (vector kernels either way).
TEST(cuda_prefill, chunk_experts_by_expert_equal_item_by_item) {
  CEDAR_REQUIRE_GPU();
  random_fp8_model r(13, "cedar_cuda_prefill_experts.safetensors");
  ASSERT_TRUE(r.eng);
  const cm::engine* shipped = r.shipped.eng.get();
  for (const cm::engine* e : std::vector<const cm::engine*>{shipped, &*r.eng}) {
    const cm::model_config& c = e->config();
    const int V = c.vocab_size;
    for (bool mma : {false, true}) {
      cedar::kernels::cuda::set_qgemv_mma(mma);
      std::vector<float> lg[2];
      cm::sequence s0(c), s1(c);
      for (int k = 0; k < 2; ++k) {
        setenv("CEDAR_CUDA_CHUNK_EXPERTS", k == 0 ? "0" : "16", 1);
        auto gpu = gpu_with_chunk(*e, 64);
        unsetenv("CEDAR_CUDA_CHUNK_EXPERTS");
        ASSERT_TRUE(gpu);
        cm::sequence& s = k == 0 ? s0 : s1;
        cm::prefill_options o;
        o.mode = cm::prefill_mode::full_stack;
        o.all_logits = true;
        uint32_t seed = 40;
        for (int n : {131, 70}) {  // chunks of 64, 64 and 3 rows, then 64 and 6
          auto r = gpu->prefill(s, tokens_of(n, V, seed++), o);
          ASSERT_TRUE(r.ok()) << r.err().message;
          lg[k].insert(lg[k].end(), r->values.begin(), r->values.end());
        }
      }
      cedar::kernels::cuda::set_qgemv_mma(true);
      ASSERT_EQ(lg[0].size(), lg[1].size());
      const size_t rows = lg[0].size() / (size_t)V;
      double worst = 0;
      int argmax_diff = 0;
      for (size_t r = 0; r < rows; ++r) {
        worst = std::max(worst, rel_diff(lg[0].data() + r * V, lg[1].data() + r * V, (size_t)V));
        argmax_diff += argmax_of(lg[0].data() + r * V, V) != argmax_of(lg[1].data() + r * V, V);
      }
      const state_diff sd = compare_state(c, s0, s1);
      std::printf("[experts by expert, %s, tensor cores %s] %zu rows: logits %.3g rel, argmax differs in %d; "
                  "entries differing %.1f%%, ring %.1f%%\n",
                  e == shipped ? "shipped" : "fp8/fp4", mma ? "on" : "off", rows, worst, argmax_diff,
                  100 * sd.entries, 100 * sd.ring);
      if (!mma) {
        EXPECT_LE(worst, 1e-6);
        EXPECT_EQ(sd.entries, 0.0);
        EXPECT_EQ(sd.ring, 0.0);
      } else {
        EXPECT_LE(worst, 5e-2);
        EXPECT_LE(argmax_diff, (int)rows * 5 / 100);
      }
    }
  }
}
