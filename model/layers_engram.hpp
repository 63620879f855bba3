// layers_engram — the Engram n-gram hash addressing (MODEL_SPEC §6 "Engram").
//
// Owns: the bucket layout derived from the config exactly as the HF port's EngramLayout and
// DeepseekV41NgramHashState do it:
//   primes       [n_engram_layers, max_ngram−1, n_heads]: for each layer, for each n-gram
//                size, heads draw the next primes above engram_vocab_size − 1 in order, never
//                reusing a prime (the search restarts at vocab−1 for each n-gram size);
//   offsets      [n_engram_layers, (max_ngram−1)·n_heads]: running sums of a layer's primes;
//   multipliers  [n_engram_layers, max_ngram]: numpy `default_rng(10007·layer_id)
//                .integers(0, bound, max_ngram, int64)·2 + 1`, bound = (INT64_MAX //
//                compressed_vocab) // 2 — reproduced here with SeedSequence + PCG64 + Lemire;
// and the hash of one position from the compressed ids of the n-gram ending there.
// Does not own: the token map (tokenizer-derived; the engine loads it), the tables.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/base/result.hpp"
#include "model/config.hpp"

namespace cedar::model {

struct engram_layout {
  int n_layers = 0;      // engram layers
  int max_ngram = 0;     // n-grams 2..max_ngram
  int n_heads = 0;
  int n_cols() const { return (max_ngram - 1) * n_heads; }  // row ids per position per layer
  std::vector<int64_t> primes;       // [n_layers, max_ngram-1, n_heads]
  std::vector<int64_t> offsets;      // [n_layers, n_cols]
  std::vector<int64_t> multipliers;  // [n_layers, max_ngram]
  std::vector<int64_t> table_rows;   // [n_layers] Σ primes = rows each layer's table needs

  // Row ids of one position for engram layer `li`: `ctx` holds the compressed ids of the
  // position and the max_ngram−1 before it, newest first (ctx[0] = this token), already
  // replaced by the compressed pad id where the look-back is blocked. out[n_cols].
  void hash(int li, const int64_t* ctx, int64_t* out) const;
};

result<engram_layout> make_engram_layout(const model_config& c);

// numpy's `np.random.default_rng(seed).integers(0, high, n, dtype=np.int64)`, high > 0.
std::vector<int64_t> numpy_default_rng_integers(uint64_t seed, int64_t high, int n);

}  // namespace cedar::model
