// quant — the numeric codecs of the DeepSeek-V4.1 caches and weights (MODEL_SPEC §3, §5).
//
// Owns: the scalar codecs (E2M1, OCP FP8 E4M3FN, UE8M0, BF16) and the three per-entry cache
// formats built from them, each as pack (floats -> bytes), unpack (bytes -> floats) and
// fake_quant (floats -> the floats unpack(pack(x)) would give, in place):
//   fp4_kv     main/compressed KV   E2M1 codes + one E4M3 scale per 16 channels   (288 B at n=512)
//   fp4_index  indexer K and Q      E2M1 codes + one UE8M0 scale per 32 channels  ( 68 B at n=128)
//   fp8_swa    SWA KV, activations  E4M3 codes + one UE8M0 scale per 32 channels  (528 B at n=512)
// Does not own: where entries live (the caches), nor any GEMM.
//
// Packed layout (FlashMLA KVCacheFormat): [data bytes][1-byte scales], contiguous. FP4 codes:
// element 2i in the LOW nibble of byte i, element 2i+1 in the HIGH nibble (the torch
// float4_e2m1fn_x2 convention; FlashMLA does not spell it out for the KV cache, MODEL_SPEC §9).
//
// Numerics follow the HF port's fake-quant (`_fake_quant_fp4_block`, `_fake_quant_fp8_block`)
// bit for bit: the element is DIVIDED by its (decoded) scale, rounded to the code grid with
// round-to-nearest-even, and the decoded value is code * scale (exact: scales are e4m3 or
// powers of two, so every product is representable in fp32 unless it underflows).
// Invariants: n is a positive multiple of the block (16 or 32); callers guarantee it (assert).
// Inputs are finite; a NaN input element encodes as NaN in E4M3 (0x7F) and as 0 in E2M1.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cedar::kernels {

// ---- scalar codecs ----------------------------------------------------------------------
// E2M1: x already divided by its scale. Clamps to ±6 and rounds to nearest-even on the grid
// {0,.5,1,1.5,2,3,4,6}: ties at .25, 1.25, 2.5, 5 round down, at .75, 1.75, 3.5 round up.
// Sign in bit 3; -0 (code 8) is produced for negative values that round to zero.
uint8_t e2m1_encode(float x);
float e2m1_decode(uint8_t code);  // uses the low 4 bits only

// OCP FP8 E4M3FN (bias 7, no infinities, 0x7F/0xFF = NaN, max 448), RNE, saturating to ±448.
uint8_t e4m3_encode(float x);
float e4m3_decode(uint8_t b);

// UE8M0: an unsigned biased exponent, 2^(b-127). 0xFF is NaN in the OCP spec; decoding it
// returns NaN. The encoder requires an exact power of two in [2^-127, 2^127] (assert).
uint8_t ue8m0_encode_pow2(float scale);
float ue8m0_decode(uint8_t b);

// BF16 <-> F32. f32_to_bf16 rounds to nearest-even; NaN stays a (quiet) NaN.
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float x);
// F16 (IEEE half) -> F32, for checkpoints that store F16.
float f16_to_f32(uint16_t h);

// ---- entry formats: n = channels, a multiple of the block --------------------------------
// FP4 main KV: [n/2 data][n/16 E4M3 scales]; scale = e4m3(max(amax, 6*2^-9) / 6).
size_t fp4_kv_bytes(int n);                                // n/2 + n/16 (288 at n=512)
void fp4_kv_pack(const float* x, int n, uint8_t* out);     // x [n] fp32 -> out [fp4_kv_bytes(n)]
void fp4_kv_unpack(const uint8_t* in, int n, float* out);  // -> out [n] fp32
void fp4_kv_fake_quant(float* x, int n);                   // x [n], in place

// FP4 indexer K/Q: [n/2 data][n/32 UE8M0]; scale = 2^ceil(log2(max(amax, 6*2^-126) / 6)).
size_t fp4_index_bytes(int n);                             // n/2 + n/32 (68 at n=128)
void fp4_index_pack(const float* x, int n, uint8_t* out);
void fp4_index_unpack(const uint8_t* in, int n, float* out);
void fp4_index_fake_quant(float* x, int n);

// FP8 SWA KV: [n E4M3][n/32 UE8M0]; scale = 2^ceil(log2(max(amax, 1e-4) / 448)).
size_t fp8_swa_bytes(int n);                               // n + n/32 (528 at n=512)
void fp8_swa_pack(const float* x, int n, uint8_t* out);
void fp8_swa_unpack(const uint8_t* in, int n, float* out);
void fp8_swa_fake_quant(float* x, int n);

// ---- scalar oracles (HOUSE_STYLE 13) ------------------------------------------------------
// Straight-line definitions the fast paths above are tested against; not for hot loops.
namespace ref {
void fp4_kv_fake_quant(float* x, int n);
void fp4_index_fake_quant(float* x, int n);
void fp8_swa_fake_quant(float* x, int n);
}  // namespace ref

}  // namespace cedar::kernels
