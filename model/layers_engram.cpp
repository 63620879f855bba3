// layers_engram — see layers_engram.hpp. The numpy generator is re-derived from its published
// algorithms (numpy/random: SeedSequence entropy mixing, PCG64 XSL-RR 128/64, Lemire's
// bounded integers); tests check the result against the fixture's multipliers.npy.
#include "model/layers_engram.hpp"

#include <set>
#include <string>

namespace cedar::model {
namespace {

// ---- numpy SeedSequence (pool of 4 uint32 words) ------------------------------------------
constexpr uint32_t k_init_a = 0x43b0d7e5u, k_mult_a = 0x931e8875u;
constexpr uint32_t k_init_b = 0x8b51f9ddu, k_mult_b = 0x58f38dedu;
constexpr uint32_t k_mix_l = 0xca01f9ddu, k_mix_r = 0x4973f715u;

uint32_t hashmix(uint32_t v, uint32_t& h) {
  v ^= h;
  h *= k_mult_a;
  v *= h;
  v ^= v >> 16;
  return v;
}
uint32_t mix(uint32_t x, uint32_t y) {
  uint32_t r = k_mix_l * x - k_mix_r * y;
  r ^= r >> 16;
  return r;
}

std::vector<uint64_t> seed_sequence_state_u64(uint64_t seed, int n_u64) {
  std::vector<uint32_t> entropy;
  if (seed == 0) entropy.push_back(0);
  while (seed > 0) {
    entropy.push_back((uint32_t)(seed & 0xffffffffu));
    seed >>= 32;
  }
  uint32_t pool[4];
  uint32_t h = k_init_a;
  for (int i = 0; i < 4; ++i) pool[i] = hashmix(i < (int)entropy.size() ? entropy[(size_t)i] : 0u, h);
  for (int s = 0; s < 4; ++s)
    for (int d = 0; d < 4; ++d)
      if (s != d) pool[d] = mix(pool[d], hashmix(pool[s], h));
  for (size_t s = 4; s < entropy.size(); ++s)
    for (int d = 0; d < 4; ++d) pool[d] = mix(pool[d], hashmix(entropy[s], h));
  std::vector<uint32_t> words((size_t)n_u64 * 2);
  uint32_t hb = k_init_b;
  for (size_t i = 0; i < words.size(); ++i) {
    uint32_t v = pool[i % 4];
    v ^= hb;
    hb *= k_mult_b;
    v *= hb;
    v ^= v >> 16;
    words[i] = v;
  }
  std::vector<uint64_t> out((size_t)n_u64);
  for (int i = 0; i < n_u64; ++i)
    out[(size_t)i] = (uint64_t)words[2 * (size_t)i] | ((uint64_t)words[2 * (size_t)i + 1] << 32);
  return out;
}

// ---- PCG64 (XSL-RR, 128-bit LCG) ---------------------------------------------------------
struct pcg64 {
  unsigned __int128 state = 0, inc = 0;
  static constexpr unsigned __int128 mult =
      ((unsigned __int128)0x2360ED051FC65DA4ull << 64) | 0x4385DF649FCCF645ull;
  void step() { state = state * mult + inc; }
  void seed(unsigned __int128 init_state, unsigned __int128 init_seq) {
    state = 0;
    inc = (init_seq << 1) | 1u;
    step();
    state += init_state;
    step();
  }
  uint64_t next() {
    step();
    const uint64_t x = (uint64_t)(state >> 64) ^ (uint64_t)state;
    const unsigned rot = (unsigned)(state >> 122);
    return (x >> rot) | (x << ((64 - rot) & 63));
  }
};

bool is_prime(int64_t n) {
  if (n < 2) return false;
  if (n % 2 == 0) return n == 2;
  for (int64_t d = 3; d * d <= n; d += 2)
    if (n % d == 0) return false;
  return true;
}

}  // namespace

std::vector<int64_t> numpy_default_rng_integers(uint64_t seed, int64_t high, int n) {
  const std::vector<uint64_t> s = seed_sequence_state_u64(seed, 4);
  pcg64 g;
  g.seed(((unsigned __int128)s[0] << 64) | s[1], ((unsigned __int128)s[2] << 64) | s[3]);
  const uint64_t rng = (uint64_t)(high - 1);  // inclusive range, low = 0
  std::vector<int64_t> out((size_t)n);
  for (int i = 0; i < n; ++i) {
    if (rng == 0) {
      out[(size_t)i] = 0;
      continue;
    }
    // Lemire's nearly-divisionless bounded integer, 64-bit (numpy bounded_lemire_uint64).
    // numpy uses a buffered 32-bit variant when rng <= 0xFFFFFFFF; the engram bound is far
    // larger for every realistic compressed vocabulary (make_engram_layout checks it).
    const uint64_t excl = rng + 1;
    unsigned __int128 m = (unsigned __int128)g.next() * excl;
    uint64_t left = (uint64_t)m;
    if (left < excl) {
      const uint64_t threshold = (UINT64_MAX - rng) % excl;
      while (left < threshold) {
        m = (unsigned __int128)g.next() * excl;
        left = (uint64_t)m;
      }
    }
    out[(size_t)i] = (int64_t)(uint64_t)(m >> 64);
  }
  return out;
}

void engram_layout::hash(int li, const int64_t* ctx, int64_t* out) const {
  const int64_t* mul = multipliers.data() + (size_t)li * max_ngram;
  const int64_t* pr = primes.data() + (size_t)li * (max_ngram - 1) * n_heads;
  const int64_t* off = offsets.data() + (size_t)li * n_cols();
  // Rolling XOR of id·multiplier, newest first; after look-back i it hashes the (i+1)-gram.
  // Products never overflow: multipliers < INT64_MAX / compressed_vocab.
  int64_t rolling = ctx[0] * mul[0];
  for (int i = 1; i < max_ngram; ++i) {
    rolling ^= ctx[i] * mul[i];
    for (int h = 0; h < n_heads; ++h) {
      const int col = (i - 1) * n_heads + h;
      const int64_t p = pr[col];
      int64_t r = rolling % p;  // torch remainder: sign of the divisor (rolling ≥ 0 here)
      if (r < 0) r += p;
      out[col] = r + off[col];
    }
  }
}

result<engram_layout> make_engram_layout(const model_config& c) {
  engram_layout L;
  L.n_layers = (int)c.engram_layer_ids.size();
  L.max_ngram = c.engram_max_ngram_size;
  L.n_heads = c.engram_n_heads;
  if (L.n_layers == 0) return L;
  if (L.max_ngram < 2 || L.n_heads < 1)
    return make_error(errc::invalid_argument, "engram: max_ngram_size must be >= 2 and n_heads >= 1");
  if (c.engram_compressed_vocab_size < 1)
    return make_error(errc::invalid_argument, "engram: engram_compressed_vocab_size must be >= 1");
  const int64_t bound = std::max<int64_t>(1, (INT64_MAX / c.engram_compressed_vocab_size) / 2);
  if ((uint64_t)(bound - 1) <= 0xffffffffull)
    return make_error(errc::invalid_argument,
                      "engram: engram_compressed_vocab_size " +
                          std::to_string(c.engram_compressed_vocab_size) +
                          " is too large for the 64-bit multiplier generator");
  std::set<int64_t> seen;
  for (int li = 0; li < L.n_layers; ++li) {
    int64_t total = 0;
    for (int n = 0; n < L.max_ngram - 1; ++n) {
      int64_t cur = c.engram_vocab_size - 1;
      for (int h = 0; h < L.n_heads; ++h) {
        int64_t cand = cur + 1;
        while (!is_prime(cand) || seen.count(cand)) ++cand;
        seen.insert(cand);
        cur = cand;
        L.primes.push_back(cand);
        L.offsets.push_back(total);
        total += cand;
      }
    }
    L.table_rows.push_back(total);
    const std::vector<int64_t> v =
        numpy_default_rng_integers(10007ull * (uint64_t)c.engram_layer_ids[(size_t)li], bound, L.max_ngram);
    for (int64_t x : v) L.multipliers.push_back(x * 2 + 1);
  }
  return L;
}

}  // namespace cedar::model
