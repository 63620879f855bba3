// quant_device — the cache codecs of kernels/cpu/quant.hpp on the device: decoding only (the
// GPU reads packed entries and dequantises them in registers). Same bits, same values:
// E2M1 codes are exact small multiples of 0.5, E4M3 and UE8M0 decode exactly, and every
// code × scale product is exact in fp32 (quant.hpp "Numerics").
//
// Layouts (quant.hpp; FlashMLA's KVCacheFormat):
//   fp4_kv     [n/2 data][n/16 E4M3 scales]    element 2i = low nibble of byte i
//   fp4_index  [n/2 data][n/32 UE8M0 scales]
//   fp8_swa    [n E4M3][n/32 UE8M0 scales]
#pragma once

#include <cstdint>

namespace cedar::kernels::cuda {

__host__ __device__ inline size_t fp4_kv_bytes(int n) { return (size_t)n / 2 + (size_t)n / 16; }
__host__ __device__ inline size_t fp4_index_bytes(int n) { return (size_t)n / 2 + (size_t)n / 32; }
__host__ __device__ inline size_t fp8_swa_bytes(int n) { return (size_t)n + (size_t)n / 32; }

// 4 bytes of a packed entry from any address, little-endian: one load when aligned, else byte
// loads (entries of some sizes start at odd addresses).
__device__ __forceinline__ uint32_t load4(const uint8_t* p) {
  if ((reinterpret_cast<uintptr_t>(p) & 3u) == 0) return __ldg(reinterpret_cast<const uint32_t*>(p));
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

__device__ inline float e2m1_value(uint32_t code) {
  // {0, .5, 1, 1.5, 2, 3, 4, 6}, sign in bit 3
  // magnitude ×2 = {0, 1, 2, 3, 4, 6, 8, 12}: 4 bits per entry of one 32-bit constant
  const uint32_t twice = (0xC8643210u >> ((code & 7u) * 4u)) & 15u;
  const float mag = 0.5f * (float)twice;
  return code & 8u ? -mag : mag;
}

__device__ inline float e4m3_value(uint32_t b) {
  // OCP E4M3FN: bias 7, subnormals at exponent 0 (m·2^-9), 0x7F/0xFF NaN (never produced by
  // the packers); normal values by bit placement (exponent rebiased 7 -> 127)
  const uint32_t e = (b >> 3) & 15u, m = b & 7u;
  float v;
  if (e == 0) v = (float)m * 0.001953125f;
  else if (e == 15u && m == 7u) v = __int_as_float(0x7fc00000);
  else v = __uint_as_float(((e + 120u) << 23) | (m << 20));
  return b & 0x80u ? -v : v;
}

__device__ inline float ue8m0_value(uint32_t b) {
  if (b == 0xFFu) return __int_as_float(0x7fc00000);
  if (b == 0u) return ldexpf(1.0f, -127);  // subnormal 2^-127
  return __int_as_float((int)(b << 23));
}

// Channel c of a packed fp4_kv entry of n channels.
__device__ inline float fp4_kv_at(const uint8_t* e, int n, int c) {
  const uint32_t byte = e[c >> 1];
  const uint32_t code = c & 1 ? byte >> 4 : byte & 15u;
  return e2m1_value(code) * e4m3_value(e[n / 2 + c / 16]);
}

// Channel c of a packed fp4_index entry of n channels.
__device__ inline float fp4_index_at(const uint8_t* e, int n, int c) {
  const uint32_t byte = e[c >> 1];
  const uint32_t code = c & 1 ? byte >> 4 : byte & 15u;
  return e2m1_value(code) * ue8m0_value(e[n / 2 + c / 32]);
}

// Channel c of a packed fp8_swa entry of n channels.
__device__ inline float fp8_swa_at(const uint8_t* e, int n, int c) {
  return e4m3_value(e[c]) * ue8m0_value(e[n + c / 32]);
}

}  // namespace cedar::kernels::cuda
