// Tests of kernels/cpu/quant: the scalar codecs against their format definitions (bit-exact,
// HOUSE_STYLE 14), the fast pack/unpack/fake-quant paths against the scalar oracles, and the
// packed byte layout. The check against the HF port's own quantised values lives in
// tests/model/quant_fixture_test.cpp (it needs the .npy reader of cedar_model).
#include "kernels/cpu/quant.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

namespace ck = cedar::kernels;

namespace {

float from_bits(uint32_t b) {
  float x;
  std::memcpy(&x, &b, 4);
  return x;
}
// Bit equality that treats every NaN as equal to every NaN.
bool same(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}

std::vector<float> random_vector(int n, std::mt19937& rng, float scale) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng) * scale;
  return v;
}

}  // namespace

// ---- E2M1 ---------------------------------------------------------------------------------

TEST(quant_e2m1, decodes_every_code) {
  const float expect[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0f, -0.5, -1, -1.5, -2, -3, -4, -6};
  for (int c = 0; c < 16; ++c) {
    EXPECT_TRUE(same(ck::e2m1_decode(static_cast<uint8_t>(c)), expect[c])) << "code " << c;
    // High nibble ignored.
    EXPECT_TRUE(same(ck::e2m1_decode(static_cast<uint8_t>(c | 0xA0)), expect[c])) << "code " << c;
    // Every code is a fixed point of encode(decode(.)).
    EXPECT_EQ(ck::e2m1_encode(expect[c]), c) << "code " << c;
  }
}

TEST(quant_e2m1, ties_follow_round_to_nearest_even) {
  // Ties at .25, 1.25, 2.5, 5 round down (to the even code); at .75, 1.75, 3.5 up.
  struct tie {
    float x;
    float expect;
  };
  const tie ties[] = {{0.25f, 0.0f}, {0.75f, 1.0f}, {1.25f, 1.0f}, {1.75f, 2.0f},
                      {2.5f, 2.0f},  {3.5f, 4.0f},  {5.0f, 4.0f}};
  for (const auto& t : ties) {
    EXPECT_EQ(ck::e2m1_decode(ck::e2m1_encode(t.x)), t.expect) << t.x;
    EXPECT_EQ(ck::e2m1_decode(ck::e2m1_encode(-t.x)), -t.expect) << -t.x;
    // Just above / below a tie goes to the nearer neighbour.
    const float up = std::nextafter(t.x, 10.0f), down = std::nextafter(t.x, -10.0f);
    EXPECT_GT(ck::e2m1_decode(ck::e2m1_encode(up)), t.x) << up;
    EXPECT_LT(ck::e2m1_decode(ck::e2m1_encode(down)), t.x) << down;
  }
}

TEST(quant_e2m1, clamps_and_signed_zero) {
  EXPECT_EQ(ck::e2m1_encode(6.0f), 7);
  EXPECT_EQ(ck::e2m1_encode(100.0f), 7);
  EXPECT_EQ(ck::e2m1_encode(-1e30f), 15);
  EXPECT_EQ(ck::e2m1_encode(-0.1f), 8);  // -0
  EXPECT_EQ(ck::e2m1_encode(-0.0f), 8);
  EXPECT_EQ(ck::e2m1_encode(0.2f), 0);
}

TEST(quant_e2m1, encode_is_nearest_value_on_a_dense_sweep) {
  // Every value is mapped to a grid point no farther than any other grid point.
  for (float x = -7.0f; x <= 7.0f; x += 1.0f / 1024) {
    const float q = ck::e2m1_decode(ck::e2m1_encode(x));
    const float c = std::fmax(-6.0f, std::fmin(6.0f, x));
    for (int code = 0; code < 16; ++code)
      ASSERT_LE(std::fabs(c - q), std::fabs(c - ck::e2m1_decode(static_cast<uint8_t>(code)))) << "x=" << x;
  }
}

// ---- E4M3 ---------------------------------------------------------------------------------

TEST(quant_e4m3, decode_matches_the_format_definition) {
  // OCP E4M3FN: bias 7, 3 mantissa bits, subnormals below 2^-6, max 448, S.1111.111 = NaN.
  EXPECT_EQ(ck::e4m3_decode(0x00), 0.0f);
  EXPECT_TRUE(std::signbit(ck::e4m3_decode(0x80)));
  EXPECT_EQ(ck::e4m3_decode(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(ck::e4m3_decode(0x07), 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(ck::e4m3_decode(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(ck::e4m3_decode(0x38), 1.0f);
  EXPECT_EQ(ck::e4m3_decode(0x7E), 448.0f);
  EXPECT_EQ(ck::e4m3_decode(0xFE), -448.0f);
  EXPECT_TRUE(std::isnan(ck::e4m3_decode(0x7F)));
  EXPECT_TRUE(std::isnan(ck::e4m3_decode(0xFF)));
  // Monotone over the positive codes.
  for (int b = 1; b < 0x7F; ++b)
    EXPECT_GT(ck::e4m3_decode(static_cast<uint8_t>(b)), ck::e4m3_decode(static_cast<uint8_t>(b - 1)));
}

TEST(quant_e4m3, all_bytes_round_trip) {
  for (int b = 0; b < 256; ++b) {
    const uint8_t byte = static_cast<uint8_t>(b);
    const float v = ck::e4m3_decode(byte);
    if ((b & 0x7F) == 0x7F) {
      EXPECT_EQ(ck::e4m3_encode(v), 0x7F) << "NaN byte " << b;
    } else {
      EXPECT_EQ(ck::e4m3_encode(v), byte) << "byte " << b << " value " << v;
    }
  }
}

TEST(quant_e4m3, round_to_nearest_even_and_saturation) {
  // Midpoints between consecutive codes go to the even mantissa.
  for (int b = 0; b < 0x7E; ++b) {
    const float lo = ck::e4m3_decode(static_cast<uint8_t>(b));
    const float hi = ck::e4m3_decode(static_cast<uint8_t>(b + 1));
    const float mid = (lo + hi) / 2;  // exact in fp32
    const int expect = (b % 2 == 0) ? b : b + 1;
    EXPECT_EQ(ck::e4m3_encode(mid), expect) << "between " << lo << " and " << hi;
    EXPECT_EQ(ck::e4m3_encode(-mid), expect | 0x80);
    EXPECT_EQ(ck::e4m3_encode(std::nextafter(mid, 0.0f)), b);
    EXPECT_EQ(ck::e4m3_encode(std::nextafter(mid, 1000.0f)), b + 1);
  }
  EXPECT_EQ(ck::e4m3_encode(450.0f), 0x7E);
  EXPECT_EQ(ck::e4m3_encode(1e9f), 0x7E);
  EXPECT_EQ(ck::e4m3_encode(-1e9f), 0xFE);
  EXPECT_EQ(ck::e4m3_encode(std::numeric_limits<float>::infinity()), 0x7E);
  EXPECT_EQ(ck::e4m3_encode(std::nanf("")), 0x7F);
  EXPECT_EQ(ck::e4m3_encode(1e-30f), 0x00);
  EXPECT_EQ(ck::e4m3_encode(-1e-30f), 0x80);
}

// ---- UE8M0, BF16, F16 ---------------------------------------------------------------------

TEST(quant_ue8m0, every_byte) {
  for (int b = 0; b < 255; ++b) {
    const float s = ck::ue8m0_decode(static_cast<uint8_t>(b));
    EXPECT_EQ(s, std::ldexp(1.0f, b - 127)) << b;
    EXPECT_EQ(ck::ue8m0_encode_pow2(s), b) << b;
  }
  EXPECT_TRUE(std::isnan(ck::ue8m0_decode(0xFF)));
  EXPECT_EQ(ck::ue8m0_decode(127), 1.0f);
}

TEST(quant_bf16, round_to_nearest_even) {
  EXPECT_EQ(ck::f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(ck::bf16_to_f32(0x3F80), 1.0f);
  // 1 + 2^-8 is the midpoint between 1 and 1 + 2^-7: ties to even (1.0).
  EXPECT_EQ(ck::f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);
  // 1 + 3*2^-8 is the midpoint between 1+2^-7 (odd) and 1+2^-6 (even): rounds up.
  EXPECT_EQ(ck::f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);
  EXPECT_EQ(ck::f32_to_bf16(std::nextafter(1.0f + std::ldexp(1.0f, -8), 2.0f)), 0x3F81);
  EXPECT_TRUE(std::isnan(ck::bf16_to_f32(ck::f32_to_bf16(std::nanf("")))));
  // Every bf16 that is not NaN survives bf16 -> f32 -> bf16.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = ck::bf16_to_f32(static_cast<uint16_t>(h));
    if (!std::isnan(f)) {
      ASSERT_EQ(ck::f32_to_bf16(f), h);
    }
  }
}

TEST(quant_f16, decode_definition) {
  EXPECT_EQ(ck::f16_to_f32(0x3C00), 1.0f);
  EXPECT_EQ(ck::f16_to_f32(0xC000), -2.0f);
  EXPECT_EQ(ck::f16_to_f32(0x7BFF), 65504.0f);
  EXPECT_EQ(ck::f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isinf(ck::f16_to_f32(0x7C00)));
  EXPECT_TRUE(std::isnan(ck::f16_to_f32(0x7E00)));
}

// ---- entry formats ------------------------------------------------------------------------

TEST(quant_formats, byte_sizes) {
  EXPECT_EQ(ck::fp4_kv_bytes(512), 288u);
  EXPECT_EQ(ck::fp4_index_bytes(128), 68u);
  EXPECT_EQ(ck::fp8_swa_bytes(512), 528u);
  EXPECT_EQ(ck::fp4_kv_bytes(64), 36u);
}

TEST(quant_formats, fp4_kv_layout_by_hand) {
  // One block of 16 with amax 3: scale = e4m3(3/6) = 0.5, so codes are x/0.5.
  float x[16] = {0.5f, -1.0f, 3.0f,  0.0f, 1.5f,  -3.0f, 0.25f, 0.75f,
                 2.0f, 1.0f,  -0.5f, 2.5f, -2.0f, 0.0f,  1.25f, -0.25f};
  uint8_t out[10];
  std::memset(out, 0xCD, sizeof out);
  ck::fp4_kv_pack(x, 16, out);
  // x/0.5: 1 -2 6 0 3 -6 .5 1.5 4 2 -1 5 -4 0 2.5 -.5 -> codes:
  // 1->2, -2->12, 6->7, 0->0, 3->5, -6->15, .5->1, 1.5->3, 4->6, 2->4, -1->10, 5->6 (tie down
  // to 4), -4->14, 0->0, 2.5->4 (tie down to 2), -.5->9
  const uint8_t expect[8] = {0xC2, 0x07, 0xF5, 0x31, 0x46, 0x6A, 0x0E, 0x94};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(out[i], expect[i]) << "byte " << i;
  EXPECT_EQ(out[8], ck::e4m3_encode(0.5f));
  EXPECT_EQ(out[9], 0xCD);  // nothing written past the entry
}

TEST(quant_formats, fp8_swa_scale_is_pow2_ceiling) {
  // amax 448 -> scale 1 (exact power: no rounding up); amax 449 -> scale 2.
  std::vector<float> x(32, 1.0f);
  x[5] = 448.0f;
  std::vector<uint8_t> out(ck::fp8_swa_bytes(32));
  ck::fp8_swa_pack(x.data(), 32, out.data());
  EXPECT_EQ(out[32], 127);
  x[5] = 449.0f;
  ck::fp8_swa_pack(x.data(), 32, out.data());
  EXPECT_EQ(out[32], 128);
  // Tiny blocks use the 1e-4 floor: scale 2^ceil(log2(1e-4/448)) = 2^-22.
  std::vector<float> z(32, 0.0f);
  ck::fp8_swa_pack(z.data(), 32, out.data());
  EXPECT_EQ(out[32], 127 - 22);
}

TEST(quant_formats, fp4_index_scale_is_pow2_ceiling) {
  std::vector<float> x(32, 0.1f);
  x[0] = 6.0f;  // amax/6 = 1 -> scale 1
  std::vector<uint8_t> out(ck::fp4_index_bytes(32));
  ck::fp4_index_pack(x.data(), 32, out.data());
  EXPECT_EQ(out[16], 127);
  x[0] = 6.5f;  // -> scale 2
  ck::fp4_index_pack(x.data(), 32, out.data());
  EXPECT_EQ(out[16], 128);
  std::vector<float> z(32, 0.0f);  // floor 6*2^-126 -> scale 2^-126
  ck::fp4_index_pack(z.data(), 32, out.data());
  EXPECT_EQ(out[16], 1);
}

namespace {

// Packs x with `pack`, unpacks into a poisoned buffer, and checks unpack(pack(x)) equals the
// fast fake-quant, equals the scalar oracle, and that the entry is exactly `bytes` long.
template <class Pack, class Unpack, class Fast, class Ref>
void check_format(const std::vector<float>& x, size_t bytes, Pack pack, Unpack unpack, Fast fast, Ref ref,
                  const char* what) {
  const int n = static_cast<int>(x.size());
  std::vector<uint8_t> packed(bytes + 8, 0xA5);
  pack(x.data(), n, packed.data());
  for (size_t i = bytes; i < bytes + 8; ++i) ASSERT_EQ(packed[i], 0xA5) << what << ": wrote past";
  std::vector<float> unpacked(n, std::nanf(""));
  unpack(packed.data(), n, unpacked.data());
  std::vector<float> f = x, r = x;
  fast(f.data(), n);
  ref(r.data(), n);
  for (int i = 0; i < n; ++i) {
    ASSERT_TRUE(same(unpacked[i], r[i])) << what << " unpack vs ref at " << i << ": " << unpacked[i] << " vs "
                                         << r[i] << " (x=" << x[i] << ")";
    ASSERT_TRUE(same(f[i], r[i])) << what << " fast vs ref at " << i << ": " << f[i] << " vs " << r[i]
                                  << " (x=" << x[i] << ")";
  }
  // Quantising a quantised vector changes nothing (the grid is closed under the scheme).
  std::vector<float> again = f;
  fast(again.data(), n);
  for (int i = 0; i < n; ++i) ASSERT_TRUE(same(again[i], f[i])) << what << " not idempotent at " << i;
}

void check_all_formats(const std::vector<float>& x) {
  const int n = static_cast<int>(x.size());
  check_format(x, ck::fp4_kv_bytes(n), ck::fp4_kv_pack, ck::fp4_kv_unpack, ck::fp4_kv_fake_quant,
               ck::ref::fp4_kv_fake_quant, "fp4_kv");
  check_format(x, ck::fp4_index_bytes(n), ck::fp4_index_pack, ck::fp4_index_unpack, ck::fp4_index_fake_quant,
               ck::ref::fp4_index_fake_quant, "fp4_index");
  check_format(x, ck::fp8_swa_bytes(n), ck::fp8_swa_pack, ck::fp8_swa_unpack, ck::fp8_swa_fake_quant,
               ck::ref::fp8_swa_fake_quant, "fp8_swa");
}

}  // namespace

TEST(quant_formats, random_round_trips_match_the_scalar_oracle) {
  std::mt19937 rng(1234);
  // Magnitudes from far below the scale floors to well above the KV range.
  for (float scale : {1e-9f, 1e-6f, 1e-3f, 0.3f, 1.0f, 4.0f, 30.0f, 1000.0f, 1e6f}) {
    for (int n : {32, 64, 128, 512}) {
      for (int rep = 0; rep < 8; ++rep) check_all_formats(random_vector(n, rng, scale));
    }
  }
}

TEST(quant_formats, structured_vectors_hit_ties_and_edges) {
  // Blocks built so x/scale lands exactly on E2M1 / E4M3 midpoints, zeros, and signed zeros.
  std::vector<float> x(512);
  const float pattern[] = {6.0f,   0.25f, 0.75f, 1.25f, 1.75f,  2.5f, 3.5f, 5.0f,
                           -0.25f, -5.0f, 0.0f,  -0.0f, 0.125f, 4.5f, 5.5f, 2.75f};
  for (int i = 0; i < 512; ++i) {
    const float m = std::ldexp(1.0f, (i / 32) - 8);
    x[i] = pattern[i % 16] * m;
  }
  check_all_formats(x);
  // E4M3 midpoints inside an fp8 block whose scale is exactly 1 (amax 448).
  std::vector<float> y(64);
  for (int i = 0; i < 64; ++i) {
    const float lo = ck::e4m3_decode(static_cast<uint8_t>(i)),
                hi = ck::e4m3_decode(static_cast<uint8_t>(i + 1));
    y[i] = (i % 32 == 0) ? 448.0f : (lo + hi) / 2;
  }
  check_all_formats(y);
  check_all_formats(std::vector<float>(64, 0.0f));
  check_all_formats(std::vector<float>(64, -3.0f));
}

TEST(quant_formats, fp8_rounding_matches_the_scalar_codec_on_a_sweep) {
  // The fast E4M3 rounding (integer-domain mantissa rounding + subnormal magic number) against
  // e4m3_encode/e4m3_decode on a strided sweep of every fp32 bit pattern in [0, 448].
  std::vector<float> x(32);
  int k = 0;
  for (uint32_t b = 0; b <= std::bit_cast<uint32_t>(448.0f); b += 4099) {
    x[k++] = from_bits(b);
    if (k == 31) {
      x[31] = 448.0f;  // pin the scale at 1 so the values are quantised as they are
      std::vector<float> f = x;
      ck::fp8_swa_fake_quant(f.data(), 32);
      for (int i = 0; i < 32; ++i) ASSERT_TRUE(same(f[i], ck::e4m3_decode(ck::e4m3_encode(x[i])))) << x[i];
      k = 0;
    }
  }
}

TEST(quant_formats, fp4_kv_scale_floor_and_saturation) {
  // amax below 6*2^-9 uses the floor scale 2^-9 (the smallest E4M3 subnormal).
  std::vector<float> x(16, 0.0f);
  x[3] = 1e-5f;
  std::vector<uint8_t> out(ck::fp4_kv_bytes(16));
  ck::fp4_kv_pack(x.data(), 16, out.data());
  EXPECT_EQ(out[8], 0x01);
  // A huge block saturates the scale at 448 instead of producing NaN.
  x[3] = 1e6f;
  ck::fp4_kv_pack(x.data(), 16, out.data());
  EXPECT_EQ(out[8], 0x7E);
  std::vector<float> back(16);
  ck::fp4_kv_unpack(out.data(), 16, back.data());
  EXPECT_EQ(back[3], 6.0f * 448.0f);
}
