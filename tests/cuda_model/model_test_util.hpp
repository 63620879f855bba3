// Helpers of the cuda backend's end-to-end tests (tests/cuda_model/): token streams, logit and
// cache-state comparisons, backends with a given prefill chunk, the tensor cores off for a scope.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/qgemv.cuh"
#include "kernels/cuda/sparse_attention.cuh"
#include "model/backend.hpp"
#include "model/model_dir.hpp"

namespace cedar::test_cuda_model {

namespace cm = cedar::model;

// The checkout may sit elsewhere on the GPU machine: CEDAR_SOURCE_DIR in the environment wins.
inline const std::string k_shipped =
    std::string(std::getenv("CEDAR_SOURCE_DIR") ? std::getenv("CEDAR_SOURCE_DIR") : CEDAR_SOURCE_DIR) +
    "/model/weights/cedar-agent-tiny";

inline std::vector<int32_t> tokens_of(int n, int vocab, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_int_distribution<int> u(3, vocab - 1);
  std::vector<int32_t> t((size_t)n);
  for (auto& x : t) x = u(g);
  return t;
}

inline int argmax_of(const float* v, int n) { return (int)(std::max_element(v, v + n) - v); }

// Largest |a − b| over the largest |a| (a the CPU's).
inline double rel_diff(const float* a, const float* b, size_t n) {
  double m = 0, r = 0;
  for (size_t i = 0; i < n; ++i) {
    m = std::max(m, (double)std::fabs(a[i] - b[i]));
    r = std::max(r, (double)std::fabs(a[i]));
  }
  return m / std::max(1e-30, r);
}

// Fraction of the `entry`-byte entries that differ.
inline double differing(const uint8_t* a, const uint8_t* b, size_t n_entries, size_t entry) {
  size_t d = 0;
  for (size_t i = 0; i < n_entries; ++i) d += std::memcmp(a + i * entry, b + i * entry, entry) != 0;
  return n_entries ? (double)d / (double)n_entries : 0.0;
}

// A cuda backend made while the environment has `name` = `value` (the backend reads its
// switches when it is made; unset again after).
inline result<std::unique_ptr<cm::backend>> cuda_backend_with(const cm::engine& e, const char* name,
                                                             const std::string& value) {
  setenv(name, value.c_str(), 1);
  auto g = cm::make_backend(e, cm::backend_request::cuda);
  unsetenv(name);
  return g;
}

// A cuda backend made with CEDAR_CUDA_PREFILL_CHUNK = chunk.
inline std::unique_ptr<cm::backend> gpu_with_chunk(const cm::engine& e, int chunk) {
  auto g = cuda_backend_with(e, "CEDAR_CUDA_PREFILL_CHUNK", std::to_string(chunk));
  EXPECT_TRUE(g.ok()) << (g.ok() ? "" : g.err().message);
  return g.ok() ? std::move(*g) : nullptr;
}

// The tensor-core projections (bf16, more than 8 rows) off for a scope: their products differ
// from the vector kernel's in the ~1e-5 (each activation split into two bf16), which the FP4 /
// FP8 caches can turn into a different code now and then; the tests of the chunk logic compare
// the exact per-row arithmetic, and one test measures what the tensor cores change.
struct mma_off {
  mma_off() { cedar::kernels::cuda::set_qgemv_mma(false); }
  ~mma_off() { cedar::kernels::cuda::set_qgemv_mma(true); }
};

// The sparse attention's fp32 kernel for a scope (its tensor-core kernel, the built-in choice for
// steps of 8+ rows at 16 heads, sums q·k and p·v in bf16 hi + lo halves: ~1e-6 from the fp32
// kernel, which the FP4 / FP8 caches can turn into a different code now and then). The tests of
// the chunk, replay and hint logic compare the exact per-row arithmetic; test_cuda holds the
// tensor-core kernel to the reference, and the prefill tests with the built-in choice (all_logits,
// tensor_cores, the built-in shape) measure it end to end.
struct attn_fp32 {
  attn_fp32() { cedar::kernels::cuda::set_sparse_attention_mma(0); }
  ~attn_fp32() { cedar::kernels::cuda::set_sparse_attention_mma(-1); }
};

// The sparse attention's launch shape fixed for a scope (one head per block, one key tile per
// split, whatever the row count): by its built-in rule a batch or chunk of few rows splits the
// keys over several blocks and a large one does not, which sums each row's softmax in another
// order (~1e-7) — enough to turn an FP4/FP8 cache code the other way now and then over a long
// prompt. Tests of the chunk logic fix it; the default shape is measured separately.
struct attn_fixed {
  attn_fixed() { cedar::kernels::cuda::set_sparse_attention_shape(1, 1); }
  ~attn_fixed() { cedar::kernels::cuda::set_sparse_attention_shape(0, 0); }
};

struct state_diff {
  double entries = 0, ring = 0, pending = 0;  // fractions of differing entries; pending rel
};

// What two sequences hold (the first one the reference): counts must be equal; the packed
// entries and the valid ring slots compared entry by entry, the pending rows by value.
inline state_diff compare_state(const cm::model_config& c, const cm::sequence& a, const cm::sequence& g) {
  state_diff r;
  EXPECT_EQ(a.n_tokens(), g.n_tokens());
  EXPECT_EQ(a.tokens(), g.tokens());
  EXPECT_EQ(a.ngram_history(), g.ngram_history());
  for (int i = 0; i < a.n_sources(); ++i) {
    const auto& sa = a.source(i);
    const auto& sg = g.source(i);
    EXPECT_EQ(sa.n_entries, sg.n_entries) << "source " << i;
    EXPECT_EQ(sa.n_pending, sg.n_pending) << "source " << i;
    if (sa.n_entries != sg.n_entries || sa.n_pending != sg.n_pending || sa.main.size() != sg.main.size() ||
        sa.index.size() != sg.index.size()) {
      r.entries = 1;
      continue;
    }
    r.entries = std::max(r.entries, differing(sa.main.data(), sg.main.data(), (size_t)sa.n_entries, a.main_entry_bytes()));
    r.entries = std::max(r.entries, differing(sa.index.data(), sg.index.data(), (size_t)sa.n_entries, a.index_entry_bytes()));
    const size_t pn = (size_t)sa.n_pending * c.head_dim;
    if (pn) {
      r.pending = std::max(r.pending, rel_diff(sa.pending_kv.data(), sg.pending_kv.data(), pn));
      r.pending = std::max(r.pending, rel_diff(sa.pending_gate.data(), sg.pending_gate.data(), pn));
    }
  }
  const int64_t N = a.n_tokens();
  const size_t eb = a.swa_entry_bytes();
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    EXPECT_EQ(a.ring(l).first_pos, g.ring(l).first_pos) << "layer " << l;
    size_t d = 0, n = 0;
    for (int64_t p = std::max<int64_t>({a.ring(l).first_pos, N - c.sliding_window, 0}); p < N; ++p, ++n) {
      const size_t slot = (size_t)(p % c.sliding_window) * eb;
      d += std::memcmp(a.ring(l).bytes.data() + slot, g.ring(l).bytes.data() + slot, eb) != 0;
    }
    if (n) r.ring = std::max(r.ring, (double)d / (double)n);
  }
  return r;
}

inline cm::loaded_model load_shipped_model() {
  auto m = cm::load_model_dir(k_shipped, false);
  EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.err().message);
  return m.ok() ? *m : cm::loaded_model{};
}

// The shipped model (`shipped`), and its config with ratio-4 sources at layers 2..5 and random
// weights in the official FP8 layout (FP8 projections, FP4 experts: `eng`) written to `file` in
// the temp directory (removed when the holder goes), with the shipped Engram token map.
struct random_fp8_model {
  cm::loaded_model shipped;
  std::filesystem::path path;
  std::optional<cm::engine> eng;
  random_fp8_model(uint32_t seed, const char* file) : shipped(load_shipped_model()) {
    if (!shipped.eng) return;
    cm::model_config c = shipped.eng->config();
    for (int l = 2; l < 6; ++l) c.compress_ratios[(size_t)l] = 4;
    EXPECT_TRUE(cm::finalize(c).ok());
    path = std::filesystem::temp_directory_path() / file;
    EXPECT_TRUE(cm::write_random_checkpoint(c, seed, cm::storage_layout::fp8, path.string()).ok());
    cm::engine_options o;
    o.engram_token_map = shipped.eng->engram_token_map();
    auto e = cm::engine::load(c, path.string(), o);
    EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.err().message);
    if (e.ok()) eng.emplace(std::move(*e));
  }
  ~random_fp8_model() {
    if (!path.empty()) std::filesystem::remove(path);
  }
};

}  // namespace cedar::test_cuda_model
