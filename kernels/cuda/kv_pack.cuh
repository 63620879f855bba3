// kv_pack — the per-row vector ops around the caches of a decode step on the GPU
// (MODEL_SPEC §1 "attention", §3 "KV formats"): interleaved-pair RoPE on the trailing
// qk_rope_head_dim channels (forward and inverse), and the cache encoders — FP8 SWA entries
// into a ring slot, FP4 main-KV and FP4 index-key entries appended to a KV source, each behind
// the RMSNorm and RoPE of its vector in one kernel (norm_rope_pack) — plus the FP4 fake
// quantisation of indexer queries. The encoders are kernels/cpu/quant.cpp's, bit for
// bit (same scale rules, same round-to-nearest-even, IEEE division where the CPU divides), so
// a page written by the GPU equals the CPU's page for the same input floats.
//
// Row pointer arrays (`dst`) live in device memory; a null entry skips that row (a row whose
// compressor group is not complete yet appends nothing).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/base/result.hpp"

namespace cedar::kernels::cuda {

// x [R, nvec, n]: rotates channels [n − 2·np, n) of every vector of row r by cos/sin [R, np]
// (pair (2i, 2i+1) by angle i; inverse: by −angle). kernels::rope_interleaved per vector.
status rope_rows(float* x, int R, int nvec, int n, int np, const float* cos, const float* sin, bool inverse,
                 cudaStream_t stream);

// x [rows, n] in place: the values fp4_index_unpack(fp4_index_pack(x)) gives (indexer queries).
status fp4_index_fake_quant(float* x, int rows, int n, cudaStream_t stream);

// RMSNorm -> RoPE -> encode, fused (one launch for what rms_norm, rope_rows and a pack kernel
// would do one after the other, with the same formulas; the norm's sum is in another order).
// Rows rr of x [R, n] (R = rows · nvec: nvec vectors per token row, RoPE angles of token row
// rr / nvec): normalised by norm_w (null: no norm), rotated on channels [n − 2·np, n) (np = 0:
// none), then encoded into dst[rr] (nvec 1; a null dst[rr] skips the row) as `kind`, or
// (fp4_index_fake) replaced by its FP4-index round trip; write_back stores the resulting fp32
// values into x. n % 32 == 0, n ≤ 1024.
enum class pack_kind { none, fp8_swa, fp4_kv, fp4_index, fp4_index_fake };

struct norm_rope_pack_params {
  int R = 0, nvec = 1, n = 0;
  float* x = nullptr;                 // [R, n]
  const float* norm_w = nullptr;      // [n] or null
  float eps = 0.0f;
  const float* cos = nullptr;         // [R / nvec, np]
  const float* sin = nullptr;
  int np = 0;
  pack_kind kind = pack_kind::none;
  uint8_t* const* dst = nullptr;      // [R] device pointers (encoders)
  bool write_back = false;
};
status norm_rope_pack(const norm_rope_pack_params& p, cudaStream_t stream);

// Up to k_norm_rope_pack_max independent jobs (no job reads what another writes) in one
// launch: the same values as one norm_rope_pack per job.
constexpr int k_norm_rope_pack_max = 4;
status norm_rope_pack_many(const norm_rope_pack_params* jobs, int n, cudaStream_t stream);

}  // namespace cedar::kernels::cuda
