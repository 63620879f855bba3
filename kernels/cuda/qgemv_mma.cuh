// qgemv_mma — qgemv's tensor-core path (internal to qgemv.cu, not a public op): bf16 weights
// and more activation rows than one k_qgemv_m_tile (8 < m), where the vector path would
// stream the weights once per 8-row tile and spend its time in fp32 FMAs. qgemv() and
// qgemv_grouped() route such items here on their own; the results agree with the vector
// path within its tolerance (not bit for bit: the sums run in another order).
//
// Schedule (y[m, rows] = x[m, cols] · Wᵀ as the MMA  Wᵀ-tile[16 rows × 16 k] · x-tileᵀ[16 k × 8 m]):
//   mma.sync.m16n8k16 bf16 → fp32: the weight rows are the MMA's M (16 per MMA), the activation
//   rows its N (8 per MMA, NT = 2, 4 or 8 tiles for m ≤ 16, 32, 64), K the columns, 16 per MMA.
//   Block: 8 warps = 4 row warps × 2 column warps; a row warp owns MW × 16 weight rows (MW 2,
//   or 1 when 128-row blocks would leave multiprocessors idle), so a block covers 64 or 128
//   rows and the grid has ceil(rows / rows_per_block) blocks per item (plus grid.y tiles of
//   64 activation rows when m > 64: the weights are read once per 64 rows of x, and once per
//   launch for m ≤ 64). Few-row matrices therefore give few blocks (2048 rows: 32 blocks);
//   there is no split-K across blocks (it would need a workspace for a deterministic sum).
//   Columns run in chunks of 128: the block stages x[m0 : m0 + 8·NT, chunk] in shared memory
//   as bf16 (hi and lo, below), each column warp takes 64 of its columns, and the two column
//   warps' partial sums meet in shared memory at the end in a fixed order (deterministic).
//   Weight fragments come straight from global memory: each lane loads 16 bytes (8 columns)
//   of one row per load; the next chunk's weights and x are loaded into registers while the
//   current chunk's MMAs run (one chunk of look-ahead, 64 KB in flight per block).
//   Measured (H200, bench_cuda --quick, m = 64): bf16 16384 × 4096 in 136 µs, 24% of the copy
//   roofline and 9.0× the vector path; 4096 × 2048 in 37 µs, 3.8×. One block per
//   multiprocessor (240 registers a thread at NT 8, MW 2) with one chunk of look-ahead is
//   latency-bound: a deeper pipeline (cp.async stages in shared memory) is the next step.
// Fragment layout: K order inside one MMA is free as long as A and B agree. Lane (g, t)
//   = (lane / 4, lane % 4) loads columns [8t, 8t + 8) of a 32-column sub-chunk for weight
//   rows g and g + 8; the PTX fragment's k pairs {2t, 2t+1} / {2t+8, 2t+9} are mapped to the
//   physical columns {8t, 8t+1} / {8t+2, 8t+3} for the first MMA of the sub-chunk and
//   {8t+4, 8t+5} / {8t+6, 8t+7} for the second; the B fragment (activation row g of the tile)
//   reads the same 8 columns from shared memory as one 16-byte load.
// Precision: the weights are exact bf16; each activation x is split as hi = bf16(x) and
//   lo = bf16(x − hi) (x − hi is exact in fp32) and both halves are multiplied by W into the
//   same fp32 accumulators (W·hi + W·lo). The MMA products are exact, so the only error beyond
//   fp32 accumulation is the split residual |x − hi − lo| ≤ 2^-16 |x| (bf16's unit roundoff
//   2^-8, twice: |x − hi| ≤ 2^-8 |x|, then lo rounds that to 8 significant bits), about 2^-20 |x|
//   on average with mixed signs: on the H200 the worst output error is ~1.5e-6 of Σ|w·x| at
//   64 columns and ~6e-7 at 520 (the fp32 vector path: ~1e-7), at twice the MMAs (the batch-64
//   stream stays memory-bound). An x that rounds to ±inf in bf16 (|x| within 2^-9 of FLT_MAX)
//   becomes NaN (inf − inf in lo).
// x_norm_w / x_norm_inv: the same RMSNorm as the vector path (x_norm_apply: (x · inv) · g,
//   inv = rsqrt(Σx² / cols + eps)), applied while staging x; each block sums the squares of its
//   rows unless the factors are given.
// Diagnostic switch: CEDAR_CUDA_QGEMV_MMA=0 (read once) or set_qgemv_mma(false) sends every
//   item back to the vector path (A/B benchmarks, cross-checks); see qgemv.cuh.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/qgemv.cuh"

namespace cedar::kernels::cuda {

// The on-the-fly RMSNorm of one float4 of an x row, as rms_norm computes it: (x · inv) · g.
// Shared by both qgemv paths so they normalise by one formula.
__device__ __forceinline__ float4 x_norm_apply(float4 a, float inv, float4 g) {
  return make_float4(a.x * inv * g.x, a.y * inv * g.y, a.z * inv * g.z, a.w * inv * g.w);
}

// Whether qgemv sends p to the tensor-core path: bf16 weights, m > k_qgemv_m_tile, path on.
bool qgemv_mma_applies(const qgemv_params& p);

// One launch for items[0 .. n) (1 ≤ n ≤ k_qgemv_group_max, each checked by qgemv's
// check_params, qgemv_mma_applies true for each, one m): y of each item as qgemv defines it.
status qgemv_mma(const qgemv_params* items, int n, cudaStream_t stream);

}  // namespace cedar::kernels::cuda
