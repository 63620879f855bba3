// fp4_dot — see fp4_dot.hpp for the contract and the tiling.
#include "kernels/cpu/fp4_dot.hpp"

#include <algorithm>
#include <cassert>
#include <cmath>
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

}  // namespace

void fp4_index_score_rows(const float* queries, const float* weights, int rows, int n_heads, const uint8_t* keys,
                          int n_keys, int n, float sscale, float* out, int ldo) {
  assert(n > 0 && n % 32 == 0);
  if (rows <= 0 || n_keys <= 0) return;
  if (n_heads <= 0) {
    for (int r = 0; r < rows; ++r) std::fill_n(out + (size_t)r * ldo, n_keys, 0.0f);
    return;
  }
  const size_t eb = fp4_index_bytes(n);
  const size_t lr = (size_t)n_heads * n;  // floats per token row of queries
  thread_local std::vector<float> tile_buf;
  if (tile_buf.size() < (size_t)n * k_tile) tile_buf.resize((size_t)n * k_tile);
  float* tile = tile_buf.data();
  for (int t0 = 0; t0 < n_keys; t0 += k_tile) {
    const int kt = std::min(k_tile, n_keys - t0);
    decode_tile(keys + (size_t)t0 * eb, kt, n, eb, tile);  // once for every row of the block
    for (int r = 0; r < rows; ++r) {
      const float* qr = queries + (size_t)r * lr;
      const float* wr = weights + (size_t)r * n_heads;
      float acc[k_tile] = {};
      int h = 0;
      for (; h + 4 <= n_heads; h += 4) {
        float s4[4][k_tile];
        dot4(qr + (size_t)h * n, qr + (size_t)(h + 1) * n, qr + (size_t)(h + 2) * n, qr + (size_t)(h + 3) * n, tile,
             n, s4);
        for (int j = 0; j < 4; ++j) fold_head(s4[j], sscale, wr[h + j], acc);
      }
      for (; h < n_heads; ++h) {
        float s1[k_tile];
        dot1(qr + (size_t)h * n, tile, n, s1);
        fold_head(s1, sscale, wr[h], acc);
      }
      float* o = out + (size_t)r * ldo + t0;
      if (kt == k_tile)
        for (int l = 0; l < k_tile; ++l) o[l] = acc[l];  // fixed length: vector stores, not a call
      else
        std::copy_n(acc, kt, o);
    }
  }
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
