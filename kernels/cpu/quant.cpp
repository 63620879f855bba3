// quant — scalar codecs and the three cache-entry formats (see quant.hpp for the contract).
//
// Two layers, kept deliberately apart (HOUSE_STYLE 13):
//   * The scalar codecs (e2m1_encode, e4m3_encode, ...) are written from the format
//     definitions: "nearest representable value, ties to the even code", computed with exact
//     arithmetic (frexp/ldexp/rint). The ref:: fake-quants compose them: unpack(pack(x)).
//   * The fast paths (pack/unpack/fake_quant) are branch-free loops over one block the
//     compiler vectorises: E2M1 by comparing with the rounding thresholds, E4M3 by rounding the fp32 mantissa
//     to 3 bits in the integer domain. They are tested bit-exact against the scalar layer.
// Scale semantics are those of the HF port (`_fake_quant_fp4_block`, `_fake_quant_fp8_block`
// in modeling_deepseek_v41.py), reproduced operation by operation in fp32:
//   fp4_kv:    s = e4m3(max(amax, 6*2^-9f) / 6.0f)                 q = x / s  (true division)
//   fp4_index: s = 2^ceilbits(max(amax, 6*2^-126f) * float(1/6.0)) q = x / s  (== x * (1/s))
//   fp8_swa:   s = 2^ceilbits(max(amax, 1e-4f) * float(1/448.0))   q = clamp(x / s, ±448)
// where ceilbits(t) = exponent(t) - 127 + (mantissa(t) != 0), the port's bit-level ceil(log2),
// and the decoded value is grid(q) * s in fp32. For power-of-two scales x / s and x * (1/s)
// are the same real number, hence the same fp32 result, so the fast paths multiply.
// One deliberate difference: torch's e4m3 cast turns values above 464 into NaN; here the E4M3
// scale saturates at 448 (reached only when a block's amax exceeds 2688, far outside the
// post-RMSNorm range of the KV latent).
#include "kernels/cpu/quant.hpp"

#include <algorithm>
#include <bit>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>

namespace cedar::kernels {

namespace {

inline uint32_t f32_bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
}
inline float bits_f32(uint32_t b) {
  float x;
  std::memcpy(&x, &b, 4);
  return x;
}

// E2M1 magnitudes by code (bit 3 = sign).
constexpr float k_e2m1_values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                     -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// Smallest magnitude that rounds to code i+1 (i = 0..6). Midpoints between an even code
// and the next round down (the even code wins the tie), so the threshold is the next float
// above the midpoint; midpoints after an odd code round up, so the midpoint itself.
// (nextafter spelled as the next bit pattern, so the table is a compile-time constant.)
constexpr float next_up(float x) { return std::bit_cast<float>(std::bit_cast<uint32_t>(x) + 1); }
constexpr float k_e2m1_thresholds[7] = {next_up(0.25f), 0.75f, next_up(1.25f), 1.75f,
                                        next_up(2.5f),  3.5f,  next_up(5.0f)};

constexpr float k_fp4_max = 6.0f;
constexpr float k_fp8_max = 448.0f;

// 256-entry E4M3 decode table.
struct e4m3_table {
  float v[256];
  e4m3_table() {
    for (int b = 0; b < 256; ++b) {
      const int e = (b >> 3) & 15, m = b & 7;
      float mag;
      if (e == 15 && m == 7) {
        mag = std::numeric_limits<float>::quiet_NaN();
      } else if (e == 0) {
        mag = std::ldexp(static_cast<float>(m), -9);  // subnormal: m * 2^-9
      } else {
        mag = std::ldexp(1.0f + m / 8.0f, e - 7);
      }
      v[b] = (b & 0x80) ? -mag : mag;
    }
  }
};
const e4m3_table k_e4m3;

// The port's power-of-two ceiling, as an exponent: exponent(t) - 127 + (mantissa != 0).
// t is positive and normal here (the callers clamp it from below).
inline int pow2_ceil_exponent(float t) {
  const uint32_t b = f32_bits(t);
  return static_cast<int>((b >> 23) & 0xFF) - 127 + ((b & 0x7FFFFF) != 0 ? 1 : 0);
}

// Rounds |a| <= 448 (finite, non-negative) to the nearest E4M3 value, ties to even.
// Normal range: round the fp32 mantissa to 3 bits in the integer domain. Subnormal range
// (a < 2^-6): the E4M3 quantum is 2^-9, the ulp of 2^14 in fp32, so (a + 2^14) - 2^14 rounds
// a to a multiple of 2^-9 with the FPU's round-to-nearest-even (both steps exact otherwise).
// Both results are computed and picked with an integer mask so that loops vectorise.
inline float e4m3_round_mag(float a) {
  const uint32_t b = std::bit_cast<uint32_t>(a);
  const uint32_t normal = (b + 0x7FFFFu + ((b >> 20) & 1u)) & 0xFFF00000u;
  const uint32_t sub = std::bit_cast<uint32_t>((a + 16384.0f) - 16384.0f);
  const uint32_t is_sub = 0u - static_cast<uint32_t>(b < 0x3C800000u);  // a < 2^-6
  return std::bit_cast<float>((sub & is_sub) | (normal & ~is_sub));
}

// E4M3 rounding of x / s for a power-of-two scale (inv = 1/s), saturated to ±448, times s.
// The clamp compares bit patterns (they order like non-negative floats).
inline float e4m3_fake(float x, float inv, float s) {
  const uint32_t qb = std::bit_cast<uint32_t>(x * inv);
  const uint32_t sign = qb & 0x80000000u;
  const uint32_t ab = std::min(qb ^ sign, 0x43E00000u);  // 448.0f
  return std::bit_cast<float>(std::bit_cast<uint32_t>(e4m3_round_mag(std::bit_cast<float>(ab))) | sign) * s;
}

// The E4M3 code of r, which must be exactly an E4M3 value (the output of the rounding
// above): sign | biased exponent | 3 mantissa bits; a subnormal r = k * 2^-9 (k = 0..8)
// leaves k in the low mantissa bits of r + 2^14.
inline uint8_t e4m3_code_of_exact(float r) {
  const uint32_t rb = std::bit_cast<uint32_t>(r);
  const uint32_t ab = rb & 0x7FFFFFFFu;
  const uint32_t normal = ((((ab >> 23) & 0xFF) - 120u) << 3) | ((ab >> 20) & 7u);
  const uint32_t sub = std::bit_cast<uint32_t>(std::bit_cast<float>(ab) + 16384.0f) & 0xFu;
  const uint32_t is_sub = 0u - static_cast<uint32_t>(ab < 0x3C800000u);
  return static_cast<uint8_t>(((sub & is_sub) | (normal & ~is_sub)) | ((rb >> 24) & 0x80u));
}

// Block absolute maximum. Compared as integers: for non-negative floats the bit patterns
// order like the values, and an integer max reduction vectorises without -ffast-math.
inline float block_amax(const float* x, int n) {
  uint32_t m = 0;
  for (int i = 0; i < n; ++i) {
    const uint32_t a = std::bit_cast<uint32_t>(x[i]) & 0x7FFFFFFFu;
    m = a > m ? a : m;
  }
  return std::bit_cast<float>(m);
}

// E2M1 code of q (already divided by its scale): count of thresholds |q| reaches, + sign.
inline uint8_t e2m1_code_fast(float q) {
  const uint32_t qb = std::bit_cast<uint32_t>(q);
  const float a = std::bit_cast<float>(qb & 0x7FFFFFFFu);
  const uint32_t c = (a >= k_e2m1_thresholds[0]) + (a >= k_e2m1_thresholds[1]) +
                     (a >= k_e2m1_thresholds[2]) + (a >= k_e2m1_thresholds[3]) +
                     (a >= k_e2m1_thresholds[4]) + (a >= k_e2m1_thresholds[5]) +
                     (a >= k_e2m1_thresholds[6]);
  return static_cast<uint8_t>(c | ((qb >> 28) & 8u));
}

// The E2M1 grid value of q, with q's sign (-0 for small negatives), as selects: the same
// thresholds as e2m1_code_fast, without a table lookup, so the loop vectorises.
inline float e2m1_fake(float q) {
  const uint32_t qb = std::bit_cast<uint32_t>(q);
  const uint32_t sign = qb & 0x80000000u;
  const float a = std::bit_cast<float>(qb ^ sign);
  float m = 0.0f;
  m = a >= k_e2m1_thresholds[0] ? 0.5f : m;
  m = a >= k_e2m1_thresholds[1] ? 1.0f : m;
  m = a >= k_e2m1_thresholds[2] ? 1.5f : m;
  m = a >= k_e2m1_thresholds[3] ? 2.0f : m;
  m = a >= k_e2m1_thresholds[4] ? 3.0f : m;
  m = a >= k_e2m1_thresholds[5] ? 4.0f : m;
  m = a >= k_e2m1_thresholds[6] ? 6.0f : m;
  return std::bit_cast<float>(std::bit_cast<uint32_t>(m) | sign);
}

// Scales, exactly as the port computes them.
inline float fp4_kv_scale_of(float amax) {  // e4m3-representable
  return e4m3_round_mag(std::min(std::max(amax, 6.0f * 0x1p-9f) / k_fp4_max, k_fp8_max));
}
inline int fp4_index_scale_exp(float amax) {
  return pow2_ceil_exponent(std::max(amax, 6.0f * 0x1p-126f) * static_cast<float>(1.0 / 6.0));
}
inline int fp8_swa_scale_exp(float amax) {
  return pow2_ceil_exponent(std::max(amax, 1e-4f) * static_cast<float>(1.0 / 448.0));
}

}  // namespace

// ---- scalar codecs ----------------------------------------------------------------------

uint8_t e2m1_encode(float x) {
  const uint8_t sign = std::signbit(x) ? 8 : 0;
  if (std::isnan(x)) return sign;
  const float a = std::min(std::fabs(x), k_fp4_max);
  // Nearest grid value; on an exact tie the even code wins.
  int best = 0;
  for (int c = 1; c < 8; ++c) {
    const float d = std::fabs(a - k_e2m1_values[c]), db = std::fabs(a - k_e2m1_values[best]);
    if (d < db || (d == db && (c % 2) == 0)) best = c;
  }
  return static_cast<uint8_t>(best | sign);
}

float e2m1_decode(uint8_t code) { return k_e2m1_values[code & 15]; }

uint8_t e4m3_encode(float x) {
  if (std::isnan(x)) return 0x7F;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const float a = std::min(std::fabs(x), k_fp8_max);  // saturate
  if (a < 0x1p-6f) {
    // Subnormal (and zero): quantum 2^-9; q = 8 lands exactly on the smallest normal 0x08.
    return static_cast<uint8_t>(sign | static_cast<int>(std::rint(a * 512.0f)));
  }
  int e2;
  std::frexp(a, &e2);           // a = f * 2^e2, f in [0.5, 1)
  int e = e2 - 1;               // a = 1.m * 2^e, e in [-6, 8]
  int q = static_cast<int>(std::rint(std::ldexp(a, 3 - e)));  // in [8, 16], RNE
  if (q == 16) {
    q = 8;
    ++e;
  }
  return static_cast<uint8_t>(sign | ((e + 7) << 3) | (q - 8));
}

float e4m3_decode(uint8_t b) { return k_e4m3.v[b]; }

uint8_t ue8m0_encode_pow2(float scale) {
  const uint32_t b = f32_bits(scale);
  if (b == 0x00400000u) return 0;  // 2^-127 is the one subnormal power of two UE8M0 holds
  assert((b & 0x807FFFFFu) == 0 && ((b >> 23) & 0xFF) != 0 && ((b >> 23) & 0xFF) != 0xFF &&
         "ue8m0_encode_pow2: scale must be a positive normal power of two");
  return static_cast<uint8_t>((b >> 23) & 0xFF);
}

float ue8m0_decode(uint8_t b) {
  if (b == 0xFF) return std::numeric_limits<float>::quiet_NaN();
  if (b == 0) return 0x1p-127f;
  return bits_f32(static_cast<uint32_t>(b) << 23);
}

float bf16_to_f32(uint16_t h) { return bits_f32(static_cast<uint32_t>(h) << 16); }

uint16_t f32_to_bf16(float x) {
  const uint32_t b = f32_bits(x);
  if (std::isnan(x)) return static_cast<uint16_t>((b >> 16) | 0x0040);  // keep it a quiet NaN
  return static_cast<uint16_t>((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const int e = (h >> 10) & 0x1F;
  const uint32_t m = h & 0x3FF;
  float mag;
  if (e == 0) {
    mag = std::ldexp(static_cast<float>(m), -24);
  } else if (e == 31) {
    mag = m ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  } else {
    mag = std::ldexp(1.0f + m / 1024.0f, e - 15);
  }
  return bits_f32(f32_bits(mag) | sign);
}

// ---- FP4 main KV: E2M1 + E4M3 per 16 ----------------------------------------------------

size_t fp4_kv_bytes(int n) { return static_cast<size_t>(n / 2 + n / 16); }

void fp4_kv_pack(const float* x, int n, uint8_t* out) {
  assert(n > 0 && n % 16 == 0);
  uint8_t* scales = out + n / 2;
  for (int blk = 0; blk < n / 16; ++blk) {
    const float* xb = x + blk * 16;
    const float s = fp4_kv_scale_of(block_amax(xb, 16));
    scales[blk] = e4m3_code_of_exact(s);
    uint8_t codes[16];
    for (int i = 0; i < 16; ++i) codes[i] = e2m1_code_fast(xb[i] / s);
    for (int i = 0; i < 8; ++i)
      out[blk * 8 + i] = static_cast<uint8_t>(codes[2 * i] | (codes[2 * i + 1] << 4));
  }
}

void fp4_kv_unpack(const uint8_t* in, int n, float* out) {
  assert(n > 0 && n % 16 == 0);
  const uint8_t* scales = in + n / 2;
  for (int blk = 0; blk < n / 16; ++blk) {
    const float s = k_e4m3.v[scales[blk]];
    for (int i = 0; i < 8; ++i) {
      const uint8_t b = in[blk * 8 + i];
      out[blk * 16 + 2 * i] = k_e2m1_values[b & 15] * s;
      out[blk * 16 + 2 * i + 1] = k_e2m1_values[b >> 4] * s;
    }
  }
}

void fp4_kv_fake_quant(float* x, int n) {
  assert(n > 0 && n % 16 == 0);
  for (int blk = 0; blk < n / 16; ++blk) {
    float* xb = x + blk * 16;
    const float s = fp4_kv_scale_of(block_amax(xb, 16));
    for (int i = 0; i < 16; ++i) xb[i] = e2m1_fake(xb[i] / s) * s;
  }
}

// ---- FP4 indexer: E2M1 + UE8M0 per 32 ---------------------------------------------------

size_t fp4_index_bytes(int n) { return static_cast<size_t>(n / 2 + n / 32); }

void fp4_index_pack(const float* x, int n, uint8_t* out) {
  assert(n > 0 && n % 32 == 0);
  uint8_t* scales = out + n / 2;
  for (int blk = 0; blk < n / 32; ++blk) {
    const float* xb = x + blk * 32;
    const int e = fp4_index_scale_exp(block_amax(xb, 32));
    scales[blk] = static_cast<uint8_t>(e + 127);
    const float inv = std::ldexp(1.0f, -e);
    uint8_t codes[32];
    for (int i = 0; i < 32; ++i) codes[i] = e2m1_code_fast(xb[i] * inv);
    for (int i = 0; i < 16; ++i)
      out[blk * 16 + i] = static_cast<uint8_t>(codes[2 * i] | (codes[2 * i + 1] << 4));
  }
}

void fp4_index_unpack(const uint8_t* in, int n, float* out) {
  assert(n > 0 && n % 32 == 0);
  const uint8_t* scales = in + n / 2;
  for (int blk = 0; blk < n / 32; ++blk) {
    const float s = ue8m0_decode(scales[blk]);
    for (int i = 0; i < 16; ++i) {
      const uint8_t b = in[blk * 16 + i];
      out[blk * 32 + 2 * i] = k_e2m1_values[b & 15] * s;
      out[blk * 32 + 2 * i + 1] = k_e2m1_values[b >> 4] * s;
    }
  }
}

void fp4_index_fake_quant(float* x, int n) {
  assert(n > 0 && n % 32 == 0);
  for (int blk = 0; blk < n / 32; ++blk) {
    float* xb = x + blk * 32;
    const int e = fp4_index_scale_exp(block_amax(xb, 32));
    const float s = std::ldexp(1.0f, e), inv = std::ldexp(1.0f, -e);
    for (int i = 0; i < 32; ++i) xb[i] = e2m1_fake(xb[i] * inv) * s;
  }
}

// ---- FP8 SWA: E4M3 + UE8M0 per 32 -------------------------------------------------------

size_t fp8_swa_bytes(int n) { return static_cast<size_t>(n + n / 32); }

void fp8_swa_pack(const float* x, int n, uint8_t* out) {
  assert(n > 0 && n % 32 == 0);
  uint8_t* scales = out + n;
  for (int blk = 0; blk < n / 32; ++blk) {
    const float* xb = x + blk * 32;
    const int e = fp8_swa_scale_exp(block_amax(xb, 32));
    scales[blk] = static_cast<uint8_t>(e + 127);
    const float inv = std::ldexp(1.0f, -e);
    for (int i = 0; i < 32; ++i) {
      out[blk * 32 + i] = e4m3_code_of_exact(e4m3_fake(xb[i], inv, 1.0f));
    }
  }
}

void fp8_swa_unpack(const uint8_t* in, int n, float* out) {
  assert(n > 0 && n % 32 == 0);
  const uint8_t* scales = in + n;
  for (int blk = 0; blk < n / 32; ++blk) {
    const float s = ue8m0_decode(scales[blk]);
    for (int i = 0; i < 32; ++i) out[blk * 32 + i] = k_e4m3.v[in[blk * 32 + i]] * s;
  }
}

void fp8_swa_fake_quant(float* x, int n) {
  assert(n > 0 && n % 32 == 0);
  for (int blk = 0; blk < n / 32; ++blk) {
    float* xb = x + blk * 32;
    const int e = fp8_swa_scale_exp(block_amax(xb, 32));
    const float s = std::ldexp(1.0f, e), inv = std::ldexp(1.0f, -e);
    for (int i = 0; i < 32; ++i) xb[i] = e4m3_fake(xb[i], inv, s);
  }
}

// ---- scalar oracles -----------------------------------------------------------------------
// Written from the definitions with the scalar codecs only; no shared fast helpers except
// the port's scale formulas, spelled out again here.

namespace ref {

void fp4_kv_fake_quant(float* x, int n) {
  assert(n > 0 && n % 16 == 0);
  for (int blk = 0; blk < n / 16; ++blk) {
    float amax = 0.0f;
    for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(x[blk * 16 + i]));
    const float s = e4m3_decode(e4m3_encode(std::max(amax, 6.0f * 0x1p-9f) / 6.0f));
    for (int i = 0; i < 16; ++i) {
      float& v = x[blk * 16 + i];
      v = e2m1_decode(e2m1_encode(std::clamp(v / s, -6.0f, 6.0f))) * s;
    }
  }
}

void fp4_index_fake_quant(float* x, int n) {
  assert(n > 0 && n % 32 == 0);
  for (int blk = 0; blk < n / 32; ++blk) {
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[blk * 32 + i]));
    const float t = std::max(amax, 6.0f * 0x1p-126f) * static_cast<float>(1.0 / 6.0);
    int e2;
    const float f = std::frexp(t, &e2);  // t = f * 2^e2, f in [0.5, 1): ceil(log2 t) = e2 - (f == 0.5)
    const float s = ue8m0_decode(ue8m0_encode_pow2(std::ldexp(1.0f, f == 0.5f ? e2 - 1 : e2)));
    for (int i = 0; i < 32; ++i) {
      float& v = x[blk * 32 + i];
      v = e2m1_decode(e2m1_encode(std::clamp(v / s, -6.0f, 6.0f))) * s;
    }
  }
}

void fp8_swa_fake_quant(float* x, int n) {
  assert(n > 0 && n % 32 == 0);
  for (int blk = 0; blk < n / 32; ++blk) {
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[blk * 32 + i]));
    const float t = std::max(amax, 1e-4f) * static_cast<float>(1.0 / 448.0);
    int e2;
    const float f = std::frexp(t, &e2);
    const float s = ue8m0_decode(ue8m0_encode_pow2(std::ldexp(1.0f, f == 0.5f ? e2 - 1 : e2)));
    for (int i = 0; i < 32; ++i) {
      float& v = x[blk * 32 + i];
      v = e4m3_decode(e4m3_encode(std::clamp(v / s, -448.0f, 448.0f))) * s;
    }
  }
}

}  // namespace ref

}  // namespace cedar::kernels
