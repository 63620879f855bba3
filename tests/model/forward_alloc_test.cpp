// Decode allocates nothing per token once warm: the runner's scratch is reused; only the
// sequences' own growable arrays (tokens, KV bytes and mirrors) grow, geometrically. Counts
// global operator new calls (this file replaces the global allocation functions of test_model
// with counting wrappers around malloc/free; behaviour is otherwise unchanged).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <string>
#include <memory>
#include <optional>
#include <vector>

#include "model/config.hpp"
#include "model/engine.hpp"
#include "model/forward.hpp"

namespace {
std::atomic<long> g_allocs{0};
}

void* operator new(std::size_t n) {
  g_allocs.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
// The nothrow form (std::stable_sort's temporary buffer) must allocate with malloc too, since the
// replaced delete above frees it: else ASan reports alloc-dealloc-mismatch. Not counted, as before.
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return std::malloc(n ? n : 1); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace cm = cedar::model;

// A model directory's engine and runner with three sequences prefilled with the same
// 100-token prompt (the state both tests decode from).
struct prefilled_model {
  cm::model_config config;
  std::optional<cm::engine> engine;
  std::unique_ptr<cm::runner> runner;
  std::vector<cm::sequence> seqs;
  std::vector<cm::sequence*> ptrs;
};

void load_and_prefill(const std::string& dir, const std::string& token_map, prefilled_model& m) {
  auto c = cm::load_model_config(dir + "/config.json");
  ASSERT_TRUE(c.ok());
  m.config = *c;
  cm::engine_options o;
  o.engram_token_map = *cm::load_token_map_npy(token_map);
  auto e = cm::engine::load(m.config, dir + "/model.safetensors", o);
  ASSERT_TRUE(e.ok());
  m.engine.emplace(std::move(e).value());
  m.runner = std::make_unique<cm::runner>(*m.engine);
  m.seqs.assign(3, cm::sequence(m.config));
  std::vector<int32_t> prompt(100);
  for (int i = 0; i < 100; ++i) prompt[(size_t)i] = (i * 37) % 512;
  for (cm::sequence& s : m.seqs) ASSERT_TRUE(m.runner->prefill(s, prompt).ok());
  m.ptrs = {&m.seqs[0], &m.seqs[1], &m.seqs[2]};
}

TEST(forward_alloc, warm_decode_does_not_allocate_per_token) {
  const std::string dir = std::string(CEDAR_SOURCE_DIR) + "/tests/fixtures/deepseek-v41-tiny-A";
  prefilled_model m;
  ASSERT_NO_FATAL_FAILURE(load_and_prefill(dir, dir + "/engram/token_map.npy", m));
  std::vector<int32_t> toks = {5, 6, 7};
  std::vector<float> logits;
  ASSERT_TRUE(m.runner->decode_step(m.ptrs, toks, logits).ok());  // warm-up
  int steps_with_allocs = 0;
  const int n_steps = 64;
  for (int step = 0; step < n_steps; ++step) {
    const long before = g_allocs.load();
    ASSERT_TRUE(m.runner->decode_step(m.ptrs, toks, logits).ok());
    steps_with_allocs += g_allocs.load() != before;
  }
  // 100 -> 165 tokens: each sequence array doubles at most once or twice.
  std::printf("decode steps that allocated: %d of %d\n", steps_with_allocs, n_steps);
  EXPECT_LE(steps_with_allocs, 6);
}

// The same with the shipped BF16 model: weights dequantised on the fly from the mapping (the
// kernels' row buffers and worker threads are set up by the warm-up step, then reused).
TEST(forward_alloc, warm_bf16_decode_does_not_allocate_per_token) {
  const std::string dir = std::string(CEDAR_SOURCE_DIR) + "/model/weights/cedar-agent-tiny";
  prefilled_model m;
  ASSERT_NO_FATAL_FAILURE(load_and_prefill(dir, dir + "/token_map.npy", m));
  ASSERT_EQ(m.engine->head().format, cedar::kernels::weight_format::bf16);
  std::vector<int32_t> toks = {5, 6, 7};
  std::vector<float> logits;
  ASSERT_TRUE(m.runner->decode_step(m.ptrs, toks, logits).ok());  // warm-up, batch 3
  cm::sequence* one = &m.seqs[0];
  ASSERT_TRUE(m.runner->decode_step({&one, 1}, {toks.data(), 1}, logits).ok());  // warm-up, batch 1
  int steps_with_allocs = 0;
  const int n_steps = 32;
  for (int step = 0; step < n_steps; ++step) {
    const long before = g_allocs.load();
    ASSERT_TRUE(m.runner->decode_step(m.ptrs, toks, logits).ok());
    ASSERT_TRUE(m.runner->decode_step({&one, 1}, {toks.data(), 1}, logits).ok());
    steps_with_allocs += g_allocs.load() != before;
  }
  // Two decode calls a step: seqs[0] grows 2 tokens a step (100 -> 166), the others 1; each
  // sequence array doubles at most once or twice.
  std::printf("bf16 decode steps that allocated: %d of %d\n", steps_with_allocs, n_steps);
  EXPECT_LE(steps_with_allocs, 8);
}
