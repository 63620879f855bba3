// fp4_dot — see fp4_dot.hpp for the contract and the tiling.
#include "kernels/cpu/fp4_dot.hpp"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include "kernels/cpu/quant.hpp"

namespace cedar::kernels {

namespace {

constexpr int k_tile = 16;  // keys per tile: two 8-lane accumulators per query

// Byte -> the E2M1 values of its low and high nibble (elements 2i and 2i+1).
struct e2m1_pair_table {
  float v[256][2];
  e2m1_pair_table() {
    for (int b = 0; b < 256; ++b) {
      v[b][0] = e2m1_decode(static_cast<uint8_t>(b & 15));
      v[b][1] = e2m1_decode(static_cast<uint8_t>(b >> 4));
    }
  }
};
const e2m1_pair_table k_pairs;

struct ue8m0_table {
  float v[256];
  ue8m0_table() {
    for (int b = 0; b < 256; ++b) v[b] = ue8m0_decode(static_cast<uint8_t>(b));
  }
};
const ue8m0_table k_scales;

// Decodes keys [0, kt) of the tile into kt_buf [n, k_tile] (channel-major); columns kt..15 are
// zero so the compute loop never branches on the tile width.
void decode_tile(const uint8_t* keys, int kt, int n, size_t entry_bytes, float* tile) {
  const int nb = n / 32;
  for (int t = 0; t < k_tile; ++t) {
    if (t >= kt) {
      for (int i = 0; i < n; ++i) tile[(size_t)i * k_tile + t] = 0.0f;
      continue;
    }
    const uint8_t* e = keys + (size_t)t * entry_bytes;
    const uint8_t* sc = e + n / 2;
    for (int b = 0; b < nb; ++b) {
      const float s = k_scales.v[sc[b]];  // once per 32 channels
      float* col = tile + (size_t)b * 32 * k_tile + t;
      for (int j = 0; j < 16; ++j) {
        const float* p = k_pairs.v[e[b * 16 + j]];
        col[(size_t)(2 * j) * k_tile] = p[0] * s;
        col[(size_t)(2 * j + 1) * k_tile] = p[1] * s;
      }
    }
  }
}

// Four query rows against one decoded tile: acc[r][t] = Σ_i q_r[i] · tile[i, t], one fused
// multiply-add per channel in channel order. The AVX2 path and the portable loop compute the
// same roundings (fma per element, same order), so results do not depend on the build.
inline void dot4(const float* q0, const float* q1, const float* q2, const float* q3, const float* tile,
                 int n, float (&acc)[4][k_tile]) {
#if defined(__AVX2__) && defined(__FMA__)
  __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00, a31 = a00;
  for (int i = 0; i < n; ++i) {
    __m256 k0 = _mm256_loadu_ps(tile + (size_t)i * k_tile);
    __m256 k1 = _mm256_loadu_ps(tile + (size_t)i * k_tile + 8);
    // keep the two key vectors in registers: folded into each FMA as a memory operand they
    // would be loaded four times each (12 loads per 8 FMAs, load-port bound)
    __asm__("" : "+x"(k0), "+x"(k1));
    const __m256 b0 = _mm256_broadcast_ss(q0 + i), b1 = _mm256_broadcast_ss(q1 + i);
    const __m256 b2 = _mm256_broadcast_ss(q2 + i), b3 = _mm256_broadcast_ss(q3 + i);
    a00 = _mm256_fmadd_ps(b0, k0, a00);
    a01 = _mm256_fmadd_ps(b0, k1, a01);
    a10 = _mm256_fmadd_ps(b1, k0, a10);
    a11 = _mm256_fmadd_ps(b1, k1, a11);
    a20 = _mm256_fmadd_ps(b2, k0, a20);
    a21 = _mm256_fmadd_ps(b2, k1, a21);
    a30 = _mm256_fmadd_ps(b3, k0, a30);
    a31 = _mm256_fmadd_ps(b3, k1, a31);
  }
  _mm256_storeu_ps(acc[0], a00);
  _mm256_storeu_ps(acc[0] + 8, a01);
  _mm256_storeu_ps(acc[1], a10);
  _mm256_storeu_ps(acc[1] + 8, a11);
  _mm256_storeu_ps(acc[2], a20);
  _mm256_storeu_ps(acc[2] + 8, a21);
  _mm256_storeu_ps(acc[3], a30);
  _mm256_storeu_ps(acc[3] + 8, a31);
#else
  const float* q[4] = {q0, q1, q2, q3};
  for (int r = 0; r < 4; ++r)
    for (int l = 0; l < k_tile; ++l) acc[r][l] = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float* kr = tile + (size_t)i * k_tile;
    for (int r = 0; r < 4; ++r)
      for (int l = 0; l < k_tile; ++l) acc[r][l] = std::fma(q[r][i], kr[l], acc[r][l]);
  }
#endif
}

inline void dot1(const float* q0, const float* tile, int n, float (&acc)[k_tile]) {
#if defined(__AVX2__) && defined(__FMA__)
  __m256 a0 = _mm256_setzero_ps(), a1 = a0;
  for (int i = 0; i < n; ++i) {
    const __m256 b = _mm256_broadcast_ss(q0 + i);
    a0 = _mm256_fmadd_ps(b, _mm256_loadu_ps(tile + (size_t)i * k_tile), a0);
    a1 = _mm256_fmadd_ps(b, _mm256_loadu_ps(tile + (size_t)i * k_tile + 8), a1);
  }
  _mm256_storeu_ps(acc, a0);
  _mm256_storeu_ps(acc + 8, a1);
#else
  for (int l = 0; l < k_tile; ++l) acc[l] = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float* kr = tile + (size_t)i * k_tile;
    for (int l = 0; l < k_tile; ++l) acc[l] = std::fma(q0[i], kr[l], acc[l]);
  }
#endif
}

// One head's term folded into a row's index scores: acc = fma(max(s, 0)·sscale, w, acc),
// 16 keys. max(0, s) as _mm256_max_ps(0, s) returns s when s is NaN, as std::max(s, 0) does.
inline void fold_head(const float (&s)[k_tile], float sscale, float w, float (&acc)[k_tile]) {
#if defined(__AVX2__) && defined(__FMA__)
  const __m256 z = _mm256_setzero_ps(), vs = _mm256_set1_ps(sscale), vw = _mm256_set1_ps(w);
  for (int l = 0; l < k_tile; l += 8) {
    const __m256 m = _mm256_mul_ps(_mm256_max_ps(z, _mm256_loadu_ps(s + l)), vs);
    _mm256_storeu_ps(acc + l, _mm256_fmadd_ps(m, vw, _mm256_loadu_ps(acc + l)));
  }
#else
  for (int l = 0; l < k_tile; ++l) acc[l] = std::fma(std::max(s[l], 0.0f) * sscale, w, acc[l]);
#endif
}

// ---- integer path (see fp4_dot.hpp "Integer path") ---------------------------------------

constexpr int k_off = 12;  // key values are stored as c + 12 in [0, 24]: unsigned for vpmaddubsw

// Byte of two codes -> (c_lo + 12) | (c_hi + 12) << 8, c the doubled signed E2M1 value
// (−0 is 0).
struct e2m1_offset_table {
  uint16_t v[256];
  e2m1_offset_table() {
    for (int b = 0; b < 256; ++b) {
      const int lo = (int)(2.0f * e2m1_decode(static_cast<uint8_t>(b & 15))) + k_off;
      const int hi = (int)(2.0f * e2m1_decode(static_cast<uint8_t>(b >> 4))) + k_off;
      v[b] = static_cast<uint16_t>(lo | (hi << 8));
    }
  }
};
const e2m1_offset_table k_offset_pairs;

// a·2^qe of a query value, for a in the doubled E2M1 grid: true with a set, else false.
inline bool doubled_grid_value(double x, int& a) {
  const double m = std::fabs(x);
  int v;
  if (m == 0.0) v = 0;
  else if (m == 1.0) v = 1;
  else if (m == 2.0) v = 2;
  else if (m == 3.0) v = 3;
  else if (m == 4.0) v = 4;
  else if (m == 6.0) v = 6;
  else if (m == 8.0) v = 8;
  else if (m == 12.0) v = 12;
  else return false;
  a = x < 0 ? -v : v;
  return true;
}

// What the (row, tile) conditions need of one decoded integer tile.
struct int_tile_info {
  bool usable = true;  // no NaN scale byte (0xFF) among the tile's keys
  int ke_min = 0, ke_max = 0;  // over the tile's keys and blocks
  int spread = 0;              // max over keys of (max − min ke of the key's blocks)
};

// Decodes keys [0, kt) of the tile into tq [n/4 quads][k_tile keys][4] of c + 12 and
// ks [n/32][k_tile] of 2^ke (exact floats; 2^-128 at byte 0), padding keys kt..15 with value
// 0 (byte 12) and unit 1.
void decode_tile_int(const uint8_t* keys, int kt, int n, size_t entry_bytes, uint8_t* tq, float* ks,
                     int_tile_info& info) {
  const int nb = n / 32, nbytes = n / 2;
  info = int_tile_info{};
  bool first = true;
  for (int t = 0; t < k_tile; ++t) {
    if (t >= kt) {
      for (int g = 0; g < n / 4; ++g) std::memset(tq + (size_t)g * 4 * k_tile + (size_t)t * 4, k_off, 4);
      for (int b = 0; b < nb; ++b) ks[(size_t)b * k_tile + t] = 1.0f;
      continue;
    }
    const uint8_t* e = keys + (size_t)t * entry_bytes;
    uint8_t* col = tq + (size_t)t * 4;
    for (int j = 0; j < nbytes; j += 2) {
      const uint32_t v = k_offset_pairs.v[e[j]] | ((uint32_t)k_offset_pairs.v[e[j + 1]] << 16);
      std::memcpy(col + (size_t)(j / 2) * 4 * k_tile, &v, 4);
    }
    const uint8_t* sc = e + nbytes;
    int lo = 1000, hi = -1000;
    for (int b = 0; b < nb; ++b) {
      if (sc[b] == 0xFF) info.usable = false;
      const int ke = (int)sc[b] - 128;
      lo = std::min(lo, ke);
      hi = std::max(hi, ke);
      ks[(size_t)b * k_tile + t] = k_scales.v[sc[b]] * 0.5f;  // 2^(byte−127) / 2, exact
    }
    info.ke_min = first ? lo : std::min(info.ke_min, lo);
    info.ke_max = first ? hi : std::max(info.ke_max, hi);
    info.spread = std::max(info.spread, hi - lo);
    first = false;
  }
}

// Whether the integer path of a row over a tile gives the fp32 path's floats (fp4_dot.hpp):
// every product unit 2^(qe+ke) at least 2^-149, every block sum (|S| < 2^13) and their total
// below 2^128, and for n > 32 the partial sums across blocks below 2^24 units of the smallest
// block exponent (nb · 4608 · 2^(spread_q + spread_k) < 2^24). Also S · 2^ke below 2^128
// (n = 32 scales by 2^ke first, then by 2^qe · sscale: see int_heads).
inline bool int_path_exact(const fp4_index_queries::row_info& r, const int_tile_info& t, int nb) {
  if (!r.exact || !t.usable) return false;
  if (r.qe_min + t.ke_min < -149 || t.ke_max + 13 > 127) return false;
  int lg = 0;
  while ((1 << lg) < nb) ++lg;
  if (r.qe_max + t.ke_max + 13 + lg > 127) return false;
  if (nb > 1 && std::ldexp(4608.0 * nb, r.spread + t.spread) >= 16777216.0) return false;
  return true;
}

// int_row: one row's index scores over an integer tile (AVX2 + FMA, else portable loops).
#if defined(__AVX2__) && defined(__FMA__)
// The integer sums of one 32-channel block for four heads (a0..a3: each head's 32 values of the
// block; c0..c3 their corr): x[2h + j] holds keys 8j..8j+7 of head h, each key's 32-bit lane two
// 16-bit partial sums (|·| ≤ 9216) that start at (corr, 0).
inline void int_block4(const int8_t* a0, const int8_t* a1, const int8_t* a2, const int8_t* a3, int32_t c0, int32_t c1,
                       int32_t c2, int32_t c3, const uint8_t* kb, __m256i (&x)[8]) {
  __m256i x00 = _mm256_set1_epi32((int32_t)(uint16_t)(int16_t)c0), x01 = x00;
  __m256i x10 = _mm256_set1_epi32((int32_t)(uint16_t)(int16_t)c1), x11 = x10;
  __m256i x20 = _mm256_set1_epi32((int32_t)(uint16_t)(int16_t)c2), x21 = x20;
  __m256i x30 = _mm256_set1_epi32((int32_t)(uint16_t)(int16_t)c3), x31 = x30;
  for (int g = 0; g < 8; ++g) {
    const __m256i k0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kb + (size_t)g * 4 * k_tile));
    const __m256i k1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kb + (size_t)g * 4 * k_tile + 32));
    int32_t v0, v1, v2, v3;
    std::memcpy(&v0, a0 + 4 * g, 4);
    std::memcpy(&v1, a1 + 4 * g, 4);
    std::memcpy(&v2, a2 + 4 * g, 4);
    std::memcpy(&v3, a3 + 4 * g, 4);
    const __m256i q0 = _mm256_set1_epi32(v0), q1 = _mm256_set1_epi32(v1);
    const __m256i q2 = _mm256_set1_epi32(v2), q3 = _mm256_set1_epi32(v3);
    x00 = _mm256_add_epi16(x00, _mm256_maddubs_epi16(k0, q0));
    x01 = _mm256_add_epi16(x01, _mm256_maddubs_epi16(k1, q0));
    x10 = _mm256_add_epi16(x10, _mm256_maddubs_epi16(k0, q1));
    x11 = _mm256_add_epi16(x11, _mm256_maddubs_epi16(k1, q1));
    x20 = _mm256_add_epi16(x20, _mm256_maddubs_epi16(k0, q2));
    x21 = _mm256_add_epi16(x21, _mm256_maddubs_epi16(k1, q2));
    x30 = _mm256_add_epi16(x30, _mm256_maddubs_epi16(k0, q3));
    x31 = _mm256_add_epi16(x31, _mm256_maddubs_epi16(k1, q3));
    // one running sum per accumulator: left to itself the compiler reassociates the integer
    // adds into trees over the quads and spills the products
    __asm__("" : "+x"(x00), "+x"(x01), "+x"(x10), "+x"(x11), "+x"(x20), "+x"(x21), "+x"(x30), "+x"(x31));
  }
  x[0] = x00, x[1] = x01, x[2] = x10, x[3] = x11, x[4] = x20, x[5] = x21, x[6] = x30, x[7] = x31;
}

const int8_t k_zero_block[32] = {};  // the values of a head slot beyond n_heads

// nh (1..4) heads of one row against one integer tile, each head's scores
// s[t] = Σ_b float(S_bt) · (ks[b, t] · unit_b), blocks in order, S the exact integer dot of the
// block (the offset's share removed by the accumulator's start value corr), folded into the
// row's 16 scores (r0, r1) as the fp32 path folds a head (fold_head):
// r = fma(max(s, 0) · sscale, w, r). a: the first head's values [nh, n]; unit, corr: [nh, nb];
// w: the nh head weights. n = 32 (one block): s = S · ks · unit exactly, so
// max(s, 0) · sscale = max(S · ks, 0) · vs with vs = unit · sscale (exact: the caller checks it
// is a normal float), one rounding of the same real number: the same float, one multiply less.
inline void int_heads(int nh, const int8_t* a, const float* unit, const float* vs, const int32_t* corr,
                      const uint8_t* tq, const float* ks, int n, const float* w, float sscale, __m256& r0,
                      __m256& r1) {
  const int nb = n / 32;
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256 z = _mm256_setzero_ps();
  const int8_t* ah[4];
  for (int h = 0; h < 4; ++h) ah[h] = h < nh ? a + (size_t)h * n : k_zero_block;
  if (nb == 1) {
    __m256i x[8];
    int_block4(ah[0], ah[1], ah[2], ah[3], corr[0], nh > 1 ? corr[1] : 0, nh > 2 ? corr[2] : 0, nh > 3 ? corr[3] : 0,
               tq, x);
    const __m256 ks0 = _mm256_loadu_ps(ks), ks1 = _mm256_loadu_ps(ks + 8);
    for (int h = 0; h < nh; ++h) {
      const __m256 f0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(x[2 * h], ones)), ks0);
      const __m256 f1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(x[2 * h + 1], ones)), ks1);
      const __m256 v = _mm256_set1_ps(vs[h]), vw = _mm256_set1_ps(w[h]);
      r0 = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_max_ps(z, f0), v), vw, r0);
      r1 = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_max_ps(z, f1), v), vw, r1);
    }
    return;
  }
  const __m256 vsc = _mm256_set1_ps(sscale);
  float s[4][k_tile];
  for (int b = 0; b < nb; ++b) {
    __m256i x[8];
    int_block4(ah[0] + (nh > 0 ? (size_t)b * 32 : 0), ah[1] + (nh > 1 ? (size_t)b * 32 : 0),
               ah[2] + (nh > 2 ? (size_t)b * 32 : 0), ah[3] + (nh > 3 ? (size_t)b * 32 : 0), corr[b],
               nh > 1 ? corr[nb + b] : 0, nh > 2 ? corr[2 * nb + b] : 0, nh > 3 ? corr[3 * nb + b] : 0,
               tq + (size_t)b * 8 * 4 * k_tile, x);
    const __m256 ks0 = _mm256_loadu_ps(ks + (size_t)b * k_tile), ks1 = _mm256_loadu_ps(ks + (size_t)b * k_tile + 8);
    for (int h = 0; h < nh; ++h) {
      const __m256 u = _mm256_set1_ps(unit[h * nb + b]);
      __m256 f0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(x[2 * h], ones)), _mm256_mul_ps(ks0, u));
      __m256 f1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(x[2 * h + 1], ones)), _mm256_mul_ps(ks1, u));
      if (b > 0) {
        f0 = _mm256_add_ps(_mm256_loadu_ps(s[h]), f0);
        f1 = _mm256_add_ps(_mm256_loadu_ps(s[h] + 8), f1);
      }
      _mm256_storeu_ps(s[h], f0);
      _mm256_storeu_ps(s[h] + 8, f1);
    }
  }
  for (int h = 0; h < nh; ++h) {
    const __m256 vw = _mm256_set1_ps(w[h]);
    r0 = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_max_ps(z, _mm256_loadu_ps(s[h])), vsc), vw, r0);
    r1 = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_max_ps(z, _mm256_loadu_ps(s[h] + 8)), vsc), vw, r1);
  }
}

// One row's index scores over an integer tile into o [kt]. vs: the row's unit · sscale per
// head (n = 32).
void int_row(const fp4_index_queries& prep, int r, const float* w, const float* vs, const uint8_t* tq,
             const float* ks, float sscale, float* o, int kt) {
  const int H = prep.n_heads, n = prep.n, nb = n / 32;
  const int8_t* a = prep.a.data() + (size_t)r * H * n;
  const float* unit = prep.unit.data() + (size_t)r * H * nb;
  const int32_t* corr = prep.corr.data() + (size_t)r * H * nb;
  __m256 r0 = _mm256_setzero_ps(), r1 = r0;
  for (int h = 0; h < H; h += 4)
    int_heads(std::min(4, H - h), a + (size_t)h * n, unit + h * nb, vs + h, corr + h * nb, tq, ks, n, w + h, sscale,
              r0, r1);
  if (kt == k_tile) {
    _mm256_storeu_ps(o, r0);
    _mm256_storeu_ps(o + 8, r1);
  } else {
    float acc[k_tile];
    _mm256_storeu_ps(acc, r0);
    _mm256_storeu_ps(acc + 8, r1);
    std::copy_n(acc, kt, o);
  }
}
#else
// One head's scores over an integer tile: s[t] = Σ_b float(S_bt) · (ks[b, t] · unit_b), blocks
// in order, S the exact integer dot of the block (its offset share removed by starting at corr).
inline void int_head(const int8_t* a, const float* unit, const int32_t* corr, const uint8_t* tq, const float* ks,
                     int n, float (&s)[k_tile]) {
  const int nb = n / 32;
  for (int b = 0; b < nb; ++b) {
    int32_t S[k_tile];
    for (int t = 0; t < k_tile; ++t) S[t] = corr[b];
    for (int g = 0; g < 8; ++g) {
      const uint8_t* kg = tq + (size_t)(b * 8 + g) * 4 * k_tile;
      const int8_t* ag = a + (size_t)b * 32 + 4 * g;
      for (int t = 0; t < k_tile; ++t)
        S[t] += ag[0] * kg[4 * t] + ag[1] * kg[4 * t + 1] + ag[2] * kg[4 * t + 2] + ag[3] * kg[4 * t + 3];
    }
    for (int t = 0; t < k_tile; ++t) {
      const float f = (float)S[t] * (ks[(size_t)b * k_tile + t] * unit[b]);
      s[t] = b == 0 ? f : s[t] + f;
    }
  }
}

// One row's index scores over an integer tile into o [kt] (the heads folded as fold_head does;
// vs is used by the AVX2 form only).
void int_row(const fp4_index_queries& prep, int r, const float* w, const float* vs, const uint8_t* tq,
             const float* ks, float sscale, float* o, int kt) {
  const int H = prep.n_heads, n = prep.n, nb = n / 32;
  const int8_t* a = prep.a.data() + (size_t)r * H * n;
  float acc[k_tile] = {};
  for (int h = 0; h < H; ++h) {
    float s[k_tile];
    int_head(a + (size_t)h * n, prep.unit.data() + ((size_t)r * H + h) * nb,
             prep.corr.data() + ((size_t)r * H + h) * nb, tq, ks, n, s);
    fold_head(s, sscale, w[h], acc);
  }
  std::copy_n(acc, kt, o);
}
#endif

}  // namespace

void fp4_index_prepare_queries(const float* queries, int rows, int n_heads, int n, fp4_index_queries& out) {
  assert(n > 0 && n % 32 == 0);
  rows = std::max(rows, 0);
  n_heads = std::max(n_heads, 0);
  const int nb = n / 32;
  out.rows = rows;
  out.n_heads = n_heads;
  out.n = n;
  out.a.resize((size_t)rows * n_heads * n);
  out.unit.resize((size_t)rows * n_heads * nb);
  out.corr.resize((size_t)rows * n_heads * nb);
  out.info.assign((size_t)rows, fp4_index_queries::row_info{});
  for (int r = 0; r < rows; ++r) {
    fp4_index_queries::row_info ri;
    ri.exact = true;
    bool any = false;
    for (int h = 0; h < n_heads && ri.exact; ++h) {
      int hlo = 0, hhi = 0;
      bool hany = false;
      for (int b = 0; b < nb && ri.exact; ++b) {
        const size_t hb = ((size_t)r * n_heads + h) * nb + b;
        const float* x = queries + ((size_t)r * n_heads + h) * n + (size_t)b * 32;
        int8_t* a = out.a.data() + ((size_t)r * n_heads + h) * n + (size_t)b * 32;
        float amax = 0.0f;
        for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));  // NaN: caught below
        if (amax == 0.0f) {  // all ±0 (or NaN, rejected by the value check)
          out.unit[hb] = 1.0f;
          out.corr[hb] = 0;
          for (int i = 0; i < 32; ++i) {
            a[i] = 0;
            if (!(x[i] == 0.0f)) ri.exact = false;
          }
          continue;
        }
        if (!(amax <= std::numeric_limits<float>::max())) {
          ri.exact = false;
          break;
        }
        // the largest value lands on 8 or 12 units: amax = m·2^x, m in [0.5, 1), unit 2^(x−4)
        int ex;
        std::frexp(amax, &ex);
        const int qe = ex - 4;
        if (qe < -149 || qe > 127) {
          ri.exact = false;
          break;
        }
        const double inv = std::ldexp(1.0, -qe);  // x · 2^-qe is exact in double
        int sum = 0;
        for (int i = 0; i < 32; ++i) {
          int v;
          if (!doubled_grid_value((double)x[i] * inv, v)) {
            ri.exact = false;
            break;
          }
          a[i] = static_cast<int8_t>(v);
          sum += v;
        }
        out.unit[hb] = (float)std::ldexp(1.0, qe);
        out.corr[hb] = -k_off * sum;
        hlo = hany ? std::min(hlo, qe) : qe;
        hhi = hany ? std::max(hhi, qe) : qe;
        hany = true;
      }
      if (hany) {
        ri.qe_min = any ? std::min(ri.qe_min, hlo) : hlo;
        ri.qe_max = any ? std::max(ri.qe_max, hhi) : hhi;
        ri.spread = std::max(ri.spread, hhi - hlo);
        any = true;
      }
    }
    if (!ri.exact) ri = fp4_index_queries::row_info{};
    out.info[(size_t)r] = ri;
  }
}

void fp4_index_score_rows(const fp4_index_queries& prep, int row0, const float* queries, const float* weights,
                          int rows, const uint8_t* keys, int n_keys, float sscale, float* out, int ldo) {
  const int n = prep.n, n_heads = prep.n_heads, nb = n / 32;
  assert(n > 0 && n % 32 == 0 && row0 >= 0 && row0 + rows <= prep.rows);
  if (rows <= 0 || n_keys <= 0) return;
  if (n_heads <= 0) {
    for (int r = 0; r < rows; ++r) std::fill_n(out + (size_t)r * ldo, n_keys, 0.0f);
    return;
  }
  const size_t eb = fp4_index_bytes(n);
  const size_t lr = (size_t)n_heads * n;  // floats per token row of queries
  thread_local std::vector<float> tile_buf, ks_buf;
  thread_local std::vector<uint8_t> tq_buf;
  if (tile_buf.size() < (size_t)n * k_tile) tile_buf.resize((size_t)n * k_tile);
  if (tq_buf.size() < (size_t)n * k_tile + 32) tq_buf.resize((size_t)n * k_tile + 32);
  if (ks_buf.size() < (size_t)nb * k_tile) ks_buf.resize((size_t)nb * k_tile);
  float* tile = tile_buf.data();
  uint8_t* tq = tq_buf.data();
  float* ks = ks_buf.data();
  // Rows that take the integer path where the tile allows it: exact rows whose unit · sscale
  // (n = 32, see int_heads) is a normal float. agg: the conditions of all of them at once, so a
  // tile that suits every row skips the per-row test.
  thread_local std::vector<float> vs_buf;
  thread_local std::vector<uint8_t> row_int;
  if (vs_buf.size() < (size_t)rows * n_heads) vs_buf.resize((size_t)rows * n_heads);
  if (row_int.size() < (size_t)rows) row_int.resize((size_t)rows);
  fp4_index_queries::row_info agg;
  agg.exact = true;
  bool any_int = false, first = true;
  for (int r = 0; r < rows; ++r) {
    const fp4_index_queries::row_info& ri = prep.info[(size_t)(row0 + r)];
    bool ok = ri.exact;
    for (int h = 0; h < n_heads && ok; ++h) {
      const float v = prep.unit[((size_t)(row0 + r) * n_heads + h) * nb] * sscale;
      vs_buf[(size_t)r * n_heads + h] = v;
      ok = nb > 1 || (std::isnormal(v) && std::isnormal(sscale));
    }
    row_int[(size_t)r] = ok;
    any_int = any_int || ok;
    if (!ok) {
      agg.exact = false;
      continue;
    }
    agg.qe_min = first ? ri.qe_min : std::min(agg.qe_min, ri.qe_min);
    agg.qe_max = first ? ri.qe_max : std::max(agg.qe_max, ri.qe_max);
    agg.spread = std::max(agg.spread, ri.spread);
    first = false;
  }
  for (int t0 = 0; t0 < n_keys; t0 += k_tile) {
    const int kt = std::min(k_tile, n_keys - t0);
    const uint8_t* kp = keys + (size_t)t0 * eb;
    int_tile_info ti;
    ti.usable = false;
    if (any_int) decode_tile_int(kp, kt, n, eb, tq, ks, ti);  // once for every row of the block
    const bool all_int = agg.exact && int_path_exact(agg, ti, nb);
    bool have_f32 = false;
    for (int r = 0; r < rows; ++r) {
      const float* wr = weights + (size_t)r * n_heads;
      float* o = out + (size_t)r * ldo + t0;
      if (all_int || (row_int[(size_t)r] && int_path_exact(prep.info[(size_t)(row0 + r)], ti, nb))) {
        int_row(prep, row0 + r, wr, vs_buf.data() + (size_t)r * n_heads, tq, ks, sscale, o, kt);
        continue;
      }
      if (!have_f32) {
        decode_tile(kp, kt, n, eb, tile);
        have_f32 = true;
      }
      const float* qr = queries + (size_t)r * lr;
      float acc[k_tile] = {};
      int h = 0;
      for (; h + 4 <= n_heads; h += 4) {
        float s4[4][k_tile];
        dot4(qr + (size_t)h * n, qr + (size_t)(h + 1) * n, qr + (size_t)(h + 2) * n, qr + (size_t)(h + 3) * n,
             tile, n, s4);
        for (int j = 0; j < 4; ++j) fold_head(s4[j], sscale, wr[h + j], acc);
      }
      for (; h < n_heads; ++h) {
        float s1[k_tile];
        dot1(qr + (size_t)h * n, tile, n, s1);
        fold_head(s1, sscale, wr[h], acc);
      }
      if (kt == k_tile)
        std::memcpy(o, acc, sizeof acc);  // fixed length: vector moves, not a call
      else
        std::copy_n(acc, kt, o);
    }
  }
}

void fp4_index_score_rows(const float* queries, const float* weights, int rows, int n_heads, const uint8_t* keys,
                          int n_keys, int n, float sscale, float* out, int ldo) {
  assert(n > 0 && n % 32 == 0);
  if (rows <= 0 || n_keys <= 0) return;
  if (n_heads <= 0) {
    for (int r = 0; r < rows; ++r) std::fill_n(out + (size_t)r * ldo, n_keys, 0.0f);
    return;
  }
  thread_local fp4_index_queries prep;
  fp4_index_prepare_queries(queries, rows, n_heads, n, prep);
  fp4_index_score_rows(prep, 0, queries, weights, rows, keys, n_keys, sscale, out, ldo);
}

void fp4_index_score_row(const float* queries, const float* weights, int n_heads, const uint8_t* keys, int n_keys,
                         int n, float sscale, float* scratch, float* out) {
  if (n_keys <= 0) return;
  for (int t = 0; t < n_keys; ++t) out[t] = 0.0f;
  if (n_heads <= 0) return;
  fp4_index_dot(queries, n_heads, n, keys, n_keys, n, scratch, n_keys);
  for (int h = 0; h < n_heads; ++h) {
    const float* sh = scratch + (size_t)h * n_keys;
    for (int t = 0; t < n_keys; ++t) out[t] = std::fma(std::max(sh[t], 0.0f) * sscale, weights[h], out[t]);
  }
}

int index_next_above(const float* s, int n, float thr) {
  int i = 0;
#if defined(__AVX2__)
  const __m256 vt = _mm256_set1_ps(thr);
  for (; i + 8 <= n; i += 8) {
    const int m = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(s + i), vt, _CMP_GT_OQ));
    if (m) return i + __builtin_ctz((unsigned)m);
  }
#endif
  for (; i < n; ++i)
    if (s[i] > thr) return i;
  return n;
}

float index_block_max(const float* s, int n) {
  float m = -std::numeric_limits<float>::infinity();
  int i = 0;
#if defined(__AVX2__)
  if (n >= 8) {
    // lane-wise m = (x > m) ? x : m, as the scalar chain (a NaN x leaves m)
    __m256 v = _mm256_set1_ps(m);
    for (; i + 8 <= n; i += 8) v = _mm256_max_ps(_mm256_loadu_ps(s + i), v);
    float lanes[8];
    _mm256_storeu_ps(lanes, v);
    for (float x : lanes) m = std::max(m, x);
  }
#endif
  for (; i < n; ++i) m = std::max(m, s[i]);
  return m;
}

void fp4_index_dot(const float* queries, int nq, int ldq, const uint8_t* keys, int n_keys, int n,
                   float* out, int ldo) {
  assert(n > 0 && n % 32 == 0);
  if (nq <= 0 || n_keys <= 0) return;
  const size_t eb = fp4_index_bytes(n);
  thread_local std::vector<float> tile_buf;
  if (tile_buf.size() < (size_t)n * k_tile) tile_buf.resize((size_t)n * k_tile);
  float* tile = tile_buf.data();
  for (int t0 = 0; t0 < n_keys; t0 += k_tile) {
    const int kt = std::min(k_tile, n_keys - t0);
    decode_tile(keys + (size_t)t0 * eb, kt, n, eb, tile);
    int q = 0;
    for (; q + 4 <= nq; q += 4) {
      float acc[4][k_tile];
      const float* qb = queries + (size_t)q * ldq;
      dot4(qb, qb + ldq, qb + 2 * (size_t)ldq, qb + 3 * (size_t)ldq, tile, n, acc);
      for (int r = 0; r < 4; ++r) std::copy_n(acc[r], kt, out + (size_t)(q + r) * ldo + t0);
    }
    for (; q < nq; ++q) {
      float acc[k_tile];
      dot1(queries + (size_t)q * ldq, tile, n, acc);
      std::copy_n(acc, kt, out + (size_t)q * ldo + t0);
    }
  }
}

namespace ref {
void fp4_index_dot(const float* queries, int nq, int ldq, const uint8_t* keys, int n_keys, int n,
                   float* out, int ldo) {
  const size_t eb = fp4_index_bytes(n);
  std::vector<float> k((size_t)n);
  for (int t = 0; t < n_keys; ++t) {
    fp4_index_unpack(keys + (size_t)t * eb, n, k.data());
    for (int q = 0; q < nq; ++q) {
      double s = 0;
      for (int i = 0; i < n; ++i) s += (double)queries[(size_t)q * ldq + i] * (double)k[(size_t)i];
      out[(size_t)q * ldo + t] = (float)s;
    }
  }
}
}  // namespace ref

}  // namespace cedar::kernels
