// sparse_attention — see sparse_attention.cuh. One thread block per (row, group of HB heads,
// split of the keys); keys in tiles of TK: the block dequantises a tile into shared memory once for all its heads
// (K = V is shared by every head), scores it, and folds it into per-head running max / sum /
// output (online softmax). Shared memory: q [HB, D] + tile [TK, D] + probabilities [HB, TK] +
// output accumulators [HB, D], fp32. Splits (flash-decoding): a decode batch of one row has
// too few (row, head group) pairs to fill the GPU, so the keys are cut into whole-tile ranges,
// each block leaves its (max, sum, output) in the workspace and the splits are folded: by the
// last block of each (row, head group) to finish when the caller gives `done` counters (counted
// with an atomic, as the mHC site does; no second launch), else by a second kernel.
// A tensor-core form (sparse_attention_mma_kernel, below) takes 16 heads per block as the rows
// of bf16 MMAs; shape_of picks it for steps of many rows (prefill chunks, large batches). A
// cluster form (sparse_attention_cluster_kernel, below) takes the steps of few rows: a thread
// block cluster per (row, head group), keys dequantised in registers, the splits folded in
// distributed shared memory (no workspace, no counters).
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/quant_device.cuh"
#include "kernels/cuda/sparse_attention.cuh"

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

namespace cedar::kernels::cuda {
namespace {

constexpr int k_threads = 256;
constexpr int k_tile = 32;  // keys per tile
constexpr int k_unroll = 8;  // packed words each thread loads before decoding

// (load4: quant_device.cuh; D a multiple of 128 makes every entry start aligned)

// RoPE of channel c of a D-vector, by row r's angles (rope_rows' formula and rounding; sg −1:
// the inverse). `at(j)` reads channel j of the same vector.
template <class At>
__device__ __forceinline__ float rope_channel(const sparse_attention_params& p, int r, int D, int c, float sg, At at) {
  const int k = c - (D - 2 * p.rope_np);
  if (!p.rope_cos || k < 0) return at(c);
  const int c0 = c - (k & 1);
  const float e = at(c0), o = at(c0 + 1);
  const float cs = p.rope_cos[(size_t)r * p.rope_np + (k >> 1)], sn = sg * p.rope_sin[(size_t)r * p.rope_np + (k >> 1)];
  return (k & 1) == 0 ? __fsub_rn(__fmul_rn(e, cs), __fmul_rn(o, sn)) : __fadd_rn(__fmul_rn(e, sn), __fmul_rn(o, cs));
}

constexpr int k_max_splits = 64;

__device__ __forceinline__ float warp_max(float v) {
  for (int off = 16; off; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int off = 16; off; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// The online softmax's step for head h (one thread): the running max moves to m, the running
// sum takes this tile's l = Σ exp(logit − m), and fac[h] gets the factor that rescales the
// accumulators (0 before the first key: nothing accumulated yet).
__device__ __forceinline__ void fold_running(int h, float m, float l, float* mrun, float* lrun, float* fac) {
  const float f = mrun[h] == -INFINITY ? 0.0f : __expf(mrun[h] - m);
  lrun[h] = lrun[h] * f + l;
  mrun[h] = m;
  fac[h] = f;
}
constexpr int k_fold_outputs = 4;  // outputs per thread and pass of a split fold

// Row r's keys, in softmax order: nw window keys (oldest first, FP8 SWA entries of its ring)
// then nc selected global entries (FP4 main KV).
struct row_keys {
  int nw, nc, n, ws;
  const uint8_t* wk;
  const uint8_t* mk;
  size_t wbytes, mbytes;
  __device__ row_keys(const sparse_attention_params& p, int r, int D)
      : nw(p.wn[r]), nc(p.nsel ? p.nsel[r] : 0), n(nw + nc), ws(p.wstart[r]), wk(p.wkeys[r]),
        mk(nc > 0 ? p.main[r] : nullptr), wbytes(fp8_swa_bytes(D)), mbytes(fp4_kv_bytes(D)) {}
  // the packed entry of key j < n (a selected one: the only dependent load, sel -> entry)
  __device__ const uint8_t* entry(const sparse_attention_params& p, int r, int j) const {
    return j < nw ? wk + (size_t)((ws + j) % p.wcap) * wbytes : mk + (size_t)p.sel[(size_t)r * p.K + (j - nw)] * mbytes;
  }
};

// Folds the splits' partial states of heads h0 .. h0 + nh of row r and the sinks into p.out, with
// all the block's threads (an empty split has max −inf and contributes nothing), `cap` heads
// at a time. Per head, one warp reduces the splits' maxima and sums with shuffles and leaves
// each split's weight exp(m_s − m) in wsplit [cap, k_max_splits] and the denominator in den
// [cap]; every thread then sums channels over the splits with independent loads into orow
// [cap, D], and the inverse RoPE is applied on the way out. orow, wsplit and den are shared
// memory; the partials are read through L2 (__ldcg: other blocks of this grid wrote them). The
// arithmetic per head does not depend on cap or on the warp that runs it, so every caller (the
// combine kernel, either attention kernel's fold) gives the same bits.
__device__ void combine_heads(const sparse_attention_params& p, int splits, int r, int h0, int nh, int cap, float* orow,
                              float* wsplit, float* den) {
  const int D = p.D, nwarps = blockDim.x >> 5, lane = threadIdx.x & 31;
  for (int b0 = 0; b0 < nh; b0 += cap) {
    const int nb = min(cap, nh - b0);
    for (int j = threadIdx.x >> 5; j < nb; j += nwarps) {
      const int h = h0 + b0 + j;
      const float* ml = p.workspace + 2 * (((size_t)r * p.H + h) * splits);
      float ms[2], ls[2];
      float m = p.sink[h];
      for (int k = 0; k < 2; ++k) {
        const int s = lane + 32 * k;
        ms[k] = s < splits ? __ldcg(ml + 2 * s) : -INFINITY;
        ls[k] = s < splits ? __ldcg(ml + 2 * s + 1) : 0.0f;
        m = fmaxf(m, ms[k]);
      }
      for (int off = 16; off; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
      float dn = 0.0f;
      for (int k = 0; k < 2; ++k) {
        const int s = lane + 32 * k;
        const float w = ms[k] == -INFINITY ? 0.0f : __expf(ms[k] - m);
        if (s < splits) wsplit[j * k_max_splits + s] = w;
        dn += ls[k] * w;
      }
      for (int off = 16; off; off >>= 1) dn += __shfl_xor_sync(0xffffffffu, dn, off);
      if (lane == 0) den[j] = dn + __expf(p.sink[h] - m);
    }
    __syncthreads();
    // k_fold_outputs outputs per thread at a time, each summed over the splits in order: their
    // loads are independent, so a pass costs a few L2 round trips rather than one per split
    // batch and output (a 16-head fold of 10 splits took ~20 µs one output at a time)
    const float* pw = p.workspace + (size_t)2 * p.R * p.H * splits + ((size_t)r * p.H + h0 + b0) * splits * D;
    for (int i0 = threadIdx.x; i0 < nb * D; i0 += k_fold_outputs * blockDim.x) {
      float o[k_fold_outputs];
      const float* po[k_fold_outputs];
      const float* wj[k_fold_outputs];
#pragma unroll
      for (int u = 0; u < k_fold_outputs; ++u) {
        const int i = min(i0 + u * (int)blockDim.x, nb * D - 1), j = i / D, c = i - j * D;
        o[u] = 0.0f;
        po[u] = pw + (size_t)j * splits * D + c;
        wj[u] = wsplit + j * k_max_splits;
      }
#pragma unroll 4
      for (int s = 0; s < splits; ++s)
#pragma unroll
        for (int u = 0; u < k_fold_outputs; ++u) o[u] += __ldcg(po[u] + (size_t)s * D) * wj[u][s];
#pragma unroll
      for (int u = 0; u < k_fold_outputs; ++u) {
        const int i = i0 + u * (int)blockDim.x;
        if (i < nb * D) orow[i] = o[u] * (1.0f / den[i / D]);
      }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < nb * D; i += blockDim.x) {
      const int j = i / D, c = i - j * D;
      const float* oj = orow + (size_t)j * D;
      p.out[((size_t)r * p.H + h0 + b0 + j) * D + c] = rope_channel(p, r, D, c, -1.0f, [&](int k) { return oj[k]; });
    }
    __syncthreads();  // orow, wsplit and den are free again
  }
}

// The end of a block's key range, in either kernel: acc [nh, D] (unnormalised output), mrun and
// lrun [nh] (running max and sum of exp) of heads h0 .. h0 + nh of row r. With splits > 1 the
// block leaves its partial state in the workspace and the last block of its (row, head group)
// folds the splits (kFold and p.done; else sparse_attention_combine does); otherwise the sink
// joins the denominator and the output is written (inverse RoPE on the way out, when given).
// orow [cap, D], wsplit [cap, k_max_splits] and den [cap] are shared scratch the fold may use
// (cap ≥ 1 heads at a time); acc may alias none of them, mrun and lrun may (read before).
template <bool kFold>
__device__ void finish_block(const sparse_attention_params& p, int r, int h0, int nh, int split, int splits,
                             const float* acc, const float* mrun, const float* lrun, int cap, float* orow, float* wsplit,
                             float* den) {
  const int D = p.D;
  if (splits > 1) {
    // partial state of this split: [R, H, splits] of (max, sum) and [R, H, splits, D] of output
    float* ml = p.workspace;
    float* po = p.workspace + (size_t)2 * p.R * p.H * splits;
    for (int h = threadIdx.x; h < nh; h += blockDim.x) {
      const size_t at = ((size_t)r * p.H + h0 + h) * splits + split;
      ml[2 * at] = mrun[h];
      ml[2 * at + 1] = lrun[h];
    }
    for (int i = threadIdx.x; i < nh * D; i += blockDim.x) {
      const int h = i / D;
      po[(((size_t)r * p.H + h0 + h) * splits + split) * D + (i - h * D)] = acc[i];
    }
    if (!kFold || !p.done) return;
    // the (row, head group)'s last split block to finish folds the splits
    __shared__ unsigned last;
    unsigned* cnt = p.done + (size_t)r * gridDim.y + blockIdx.y;
    __threadfence();  // this block's partials are visible device-wide before it is counted
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(cnt, 1u) == (unsigned)splits - 1 ? 1u : 0u;
    __syncthreads();
    if (!last) return;
    __threadfence();
    combine_heads(p, splits, r, h0, nh, cap, orow, wsplit, den);
    if (threadIdx.x == 0) *cnt = 0;  // ready for the next launch
    return;
  }
  // the sink joins the denominator only; the inverse RoPE (when given) on the way out
  for (int i = threadIdx.x; i < nh * D; i += blockDim.x) {
    const int h = i / D;
    const float sink = p.sink[h0 + h];
    const float m = fmaxf(mrun[h], sink);
    const float den = lrun[h] * __expf(mrun[h] - m) + __expf(sink - m);
    const float* ah = acc + h * D;
    p.out[((size_t)r * p.H + h0) * D + i] =
        rope_channel(p, r, D, i - h * D, -1.0f, [&](int j) { return ah[j] * __expf(mrun[h] - m) / den; });
  }
}

// grid (R, head groups, splits). With splits == 1 the block writes the output; else it writes
// its key range's partial state (max, sum, unnormalised output) to p.workspace, and the last
// block of its (row, head group) folds them (p.done) or sparse_attention_combine does.
// kFold: the split fold is compiled in only where it is used (its code made the kernel slower
// at batch 64, where the keys are not split: 12.4 -> 13.2 ms per step of the 1.2 B model).
template <bool kFold>
__global__ void sparse_attention_kernel(sparse_attention_params p, int hb, int splits) {
  pdl_entry();
  extern __shared__ float smem[];
  const int r = blockIdx.x, h0 = blockIdx.y * hb, split = blockIdx.z;
  const int nh = min(hb, p.H - h0);
  const int D = p.D;
  float* qs = smem;                   // [hb, D]
  float* ts = qs + hb * D;            // [k_tile, D]
  float* ps = ts + k_tile * D;        // [hb, k_tile]
  float* acc = ps + hb * k_tile;      // [hb, D]
  float* mrun = acc + hb * D;         // [hb] running max
  float* lrun = mrun + hb;            // [hb] running sum of exp
  float* fac = lrun + hb;             // [hb] rescale factor of this tile

  for (int i = threadIdx.x; i < nh * D; i += blockDim.x) {
    const float* qv = p.q + ((size_t)r * p.H + h0) * D + (i / D) * D;
    qs[i] = rope_channel(p, r, D, i % D, 1.0f, [&](int j) { return qv[j]; });
    acc[i] = 0.0f;
  }
  for (int h = threadIdx.x; h < nh; h += blockDim.x) {
    mrun[h] = -INFINITY;
    lrun[h] = 0.0f;
  }
  const row_keys rk(p, r, D);
  const int n = rk.n;
  const int words8 = D / 4;  // 4-byte words of an fp8 entry's codes (an fp4 entry has half)
  __shared__ const uint8_t* tkey[k_tile];
  __shared__ bool tfp4[k_tile];
  __syncthreads();

  // this block's keys: [k_begin, k_end), split in whole tiles
  const int tiles = (n + k_tile - 1) / k_tile, per = (tiles + splits - 1) / splits;
  const int k_begin = min(n, split * per * k_tile), k_end = min(n, (split + 1) * per * k_tile);
  for (int t0 = k_begin; t0 < k_end; t0 += k_tile) {
    const int nt = min(k_tile, k_end - t0);
    // dequantise the tile: [nt, D]. First the tile's entry pointers (one thread per key: the
    // only dependent load, sel -> entry), then 4-byte words of packed codes, all independent;
    // consecutive lanes take consecutive words of a key, so loads coalesce and the float4
    // stores into the tile hit distinct banks (an fp8 word = 4 channels under one UE8M0 scale,
    // an fp4 word = 8 channels under one E4M3 scale).
    if ((int)threadIdx.x < nt) {
      const int j = t0 + (int)threadIdx.x;
      tkey[threadIdx.x] = rk.entry(p, r, j);
      tfp4[threadIdx.x] = j >= rk.nw;
    }
    __syncthreads();
    // (k_unroll words per thread are loaded before any is decoded: independent loads in
    // flight instead of one load's latency per word)
    const int total = nt * words8;
    for (int base = threadIdx.x; base < total; base += blockDim.x * k_unroll) {
      uint32_t u[k_unroll], sb[k_unroll];
#pragma unroll
      for (int k = 0; k < k_unroll; ++k) {
        const int i = base + k * (int)blockDim.x;
        u[k] = 0, sb[k] = 0;
        if (i >= total) continue;
        const int j = i / words8, wd = i - j * words8;
        const uint8_t* e = tkey[j];
        if (!tfp4[j]) u[k] = load4(e + wd * 4), sb[k] = e[D + wd / 8];
        else if (wd < words8 / 2) u[k] = load4(e + wd * 4), sb[k] = e[D / 2 + wd / 2];
      }
#pragma unroll
      for (int k = 0; k < k_unroll; ++k) {
        const int i = base + k * (int)blockDim.x;
        if (i >= total) continue;
        const int j = i / words8, wd = i - j * words8;
        float4* dst = reinterpret_cast<float4*>(ts + j * D);
        if (!tfp4[j]) {
          const float sc = ue8m0_value(sb[k]);
          dst[wd] = make_float4(e4m3_value(u[k] & 0xFFu) * sc, e4m3_value((u[k] >> 8) & 0xFFu) * sc,
                                e4m3_value((u[k] >> 16) & 0xFFu) * sc, e4m3_value(u[k] >> 24) * sc);
        } else if (wd < words8 / 2) {
          const float sc = e4m3_value(sb[k]);
          dst[2 * wd] = make_float4(e2m1_value(u[k] & 15u) * sc, e2m1_value((u[k] >> 4) & 15u) * sc,
                                    e2m1_value((u[k] >> 8) & 15u) * sc, e2m1_value((u[k] >> 12) & 15u) * sc);
          dst[2 * wd + 1] = make_float4(e2m1_value((u[k] >> 16) & 15u) * sc, e2m1_value((u[k] >> 20) & 15u) * sc,
                                        e2m1_value((u[k] >> 24) & 15u) * sc, e2m1_value(u[k] >> 28) * sc);
        }
      }
    }
    __syncthreads();
    // logits [nh, nt]: one warp per (head, key), lanes over channels (consecutive addresses:
    // no shared-memory bank conflicts), warp-shuffle sum
    {
      const int lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
      for (int i = threadIdx.x >> 5; i < nh * nt; i += nwarps) {
        const int h = i / nt, j = i % nt;
        const float* qh = qs + h * D;
        const float* kj = ts + j * D;
        float s = 0.0f;
        for (int c = lane; c < D; c += 32) s = fmaf(qh[c], kj[c], s);
        for (int off = 16; off; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
        if (lane == 0) ps[h * k_tile + j] = s * p.scale;
      }
    }
    __syncthreads();
    // per head (one warp each, lane j = key j of the tile; nt <= 32): new max, rescale factor,
    // probabilities
    {
      const int lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
      for (int h = threadIdx.x >> 5; h < nh; h += nwarps) {
        const float lg = lane < nt ? ps[h * k_tile + lane] : -INFINITY;
        const float m = fmaxf(warp_max(lg), mrun[h]);
        const float e = lane < nt ? __expf(lg - m) : 0.0f;
        const float l = warp_sum(e);
        if (lane < nt) ps[h * k_tile + lane] = e;
        __syncwarp();
        if (lane == 0) fold_running(h, m, l, mrun, lrun, fac);
      }
    }
    __syncthreads();
    // acc[h, c] = acc · f + Σ_j p[h, j] · tile[j, c]
    for (int i = threadIdx.x; i < nh * D; i += blockDim.x) {
      const int h = i / D, c = i % D;
      float a = acc[i] * fac[h];
      for (int j = 0; j < nt; ++j) a += ps[h * k_tile + j] * ts[j * D + c];
      acc[i] = a;
    }
    __syncthreads();
  }
  // the fold's scratch: q's memory [hb, D], the tile's [k_tile, D], fac [hb]
  finish_block<kFold>(p, r, h0, nh, split, splits, acc, mrun, lrun, max(1, min(hb, k_tile * D / k_max_splits)), qs, ts, fac);
}

// ---- tensor-core path ------------------------------------------------------------------------
// One block per (row, group of 16 heads, split of the keys), eight warps, keys in tiles of 64.
// The 16 heads are the rows of an m16n8k16 MMA (K = V is shared by every head, so a row's
// heads make one matrix against each key tile):
//   scores  S[16, 64] = Q[16, D] · Kᵀ      warp w: keys 8w .. 8w + 7, every head
//   output  O[16, D] = O · f + P[16, 64] · V    warp w: channels w·D/8 .. (w + 1)·D/8
// The tile is dequantised once into shared memory as bf16, which holds every FP8 (e4m3 ×
// power-of-two scale) and FP4 (e2m1 × e4m3 scale) key exactly; q and the probabilities are
// fp32 split into bf16 hi + lo halves (two MMAs each), so products keep ~16 mantissa bits
// and sums run in fp32: the results stay within the tolerance of the fp32 path. The online
// softmax and the fold of splits are the scalar kernel's (finish_block).
constexpr int k_mma_heads = 16;    // heads per block: one MMA row tile
constexpr int k_mma_keys = 64;     // keys per tile: one 8-key column tile per warp
constexpr int k_mma_threads = 256;
constexpr int k_mma_unroll = 4;    // 8-channel units each thread loads before converting
constexpr int k_s_stride = k_mma_keys + 4;   // floats per score row
constexpr int k_p_stride = k_mma_keys + 8;   // bf16 per probability row (16-byte rows, no bank conflicts)

// Shared memory of the MMA kernel at head_dim D (bf16 rows padded by 8: ldmatrix rows of
// consecutive heads / keys fall in distinct 16-byte bank groups).
__host__ __device__ constexpr size_t mma_smem_bytes(int D) {
  return sizeof(uint16_t) * (2 * (size_t)k_mma_heads * (D + 8) + (size_t)k_mma_keys * (D + 8) +
                             2 * (size_t)k_mma_heads * k_p_stride) +
         sizeof(float) * ((size_t)k_mma_heads * k_s_stride + 3 * (size_t)k_mma_heads);
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void ldsm_x4(uint32_t (&v)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x2(uint32_t (&v)[2], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(v[0]), "=r"(v[1]) : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x2_trans(uint32_t (&v)[2], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(v[0]), "=r"(v[1])
               : "r"(smem_addr(p)));
}

// c[16 × 8] += A[16 × 16] · B[16 × 8], bf16 in, fp32 accumulate (a: rows {g, g+8} × k pairs
// {2t, 2t+8}; b: column g × k pairs {2t, 2t+8}; c: rows {g, g+8} × columns {2t, 2t+1}).
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint16_t bf16_bits(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }
__device__ __forceinline__ float bf16_float(uint16_t b) { return __uint_as_float((uint32_t)b << 16); }
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  return (uint32_t)bf16_bits(lo) | (uint32_t)bf16_bits(hi) << 16;
}

// v → its bf16 hi half and the bf16 of the remainder
__device__ __forceinline__ void split_bf16(float v, uint16_t& hi, uint16_t& lo) {
  hi = bf16_bits(v);
  lo = bf16_bits(v - bf16_float(hi));
}

// NO = D / 64: 8-channel output column tiles per warp.
template <int NO, bool kFold>
__global__ void __launch_bounds__(k_mma_threads) sparse_attention_mma_kernel(sparse_attention_params p, int splits) {
  pdl_entry();
  constexpr int D = NO * 64, RS = D + 8;  // head_dim, bf16 row stride of q and of the tile
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint16_t* qhi = reinterpret_cast<uint16_t*>(smem_raw);  // [16, RS]
  uint16_t* qlo = qhi + k_mma_heads * RS;                 // [16, RS]
  uint16_t* kt = qlo + k_mma_heads * RS;                  // [64, RS] the key tile; at the end acc [16, D] fp32
  uint16_t* phi = kt + k_mma_keys * RS;                   // [16, k_p_stride]
  uint16_t* plo = phi + k_mma_heads * k_p_stride;         // [16, k_p_stride]
  float* ss = reinterpret_cast<float*>(plo + k_mma_heads * k_p_stride);  // [16, k_s_stride] scores
  float* mrun = ss + k_mma_heads * k_s_stride;            // [16] running max
  float* lrun = mrun + k_mma_heads;                       // [16] running sum of exp
  float* fac = lrun + k_mma_heads;                        // [16] rescale factor of this tile
  __shared__ const uint8_t* tkey[k_mma_keys];
  __shared__ int tfp4[k_mma_keys];

  const int r = blockIdx.x, h0 = blockIdx.y * k_mma_heads, split = blockIdx.z;
  const int nh = min(k_mma_heads, p.H - h0);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  // q rotated as it is read (rope_rows' rounding), split into hi + lo; heads past nh are zero
  for (int i = tid; i < k_mma_heads * D; i += blockDim.x) {
    const int h = i / D, c = i - h * D;
    float v = 0.0f;
    if (h < nh) {
      const float* qv = p.q + ((size_t)r * p.H + h0 + h) * D;
      v = rope_channel(p, r, D, c, 1.0f, [&](int j) { return qv[j]; });
    }
    split_bf16(v, qhi[h * RS + c], qlo[h * RS + c]);
  }
  if (tid < k_mma_heads) mrun[tid] = -INFINITY, lrun[tid] = 0.0f;
  const row_keys rk(p, r, D);
  const int n = rk.n;
  constexpr int units = D / 8;  // 8-channel units of a key

  float o[NO][4];
#pragma unroll
  for (int j = 0; j < NO; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;

  const int tiles = (n + k_mma_keys - 1) / k_mma_keys, per = (tiles + splits - 1) / splits;
  const int k_begin = min(n, split * per * k_mma_keys), k_end = min(n, (split + 1) * per * k_mma_keys);
  for (int t0 = k_begin; t0 < k_end; t0 += k_mma_keys) {
    const int nt = min(k_mma_keys, k_end - t0);
    if (tid < nt) {  // the tile's entry pointers: the only dependent load (sel -> entry)
      const int j = t0 + tid;
      tkey[tid] = rk.entry(p, r, j);
      tfp4[tid] = j >= rk.nw;
    }
    __syncthreads();
    // dequantise [64, D] as bf16: a thread per 8 channels of a key (an fp8 unit: 8 codes under
    // one UE8M0 scale; an fp4 unit: one 4-byte word under one E4M3 scale); rows past nt zero
    for (int base = tid; base < k_mma_keys * units; base += blockDim.x * k_mma_unroll) {
      uint32_t u0[k_mma_unroll], u1[k_mma_unroll], sb[k_mma_unroll];
#pragma unroll
      for (int k = 0; k < k_mma_unroll; ++k) {
        const int i = base + k * (int)blockDim.x, j = i / units, c0 = (i - j * units) * 8;
        u0[k] = 0, u1[k] = 0, sb[k] = 0;
        if (i >= k_mma_keys * units || j >= nt) continue;
        const uint8_t* e = tkey[j];
        if (!tfp4[j]) u0[k] = load4(e + c0), u1[k] = load4(e + c0 + 4), sb[k] = e[D + c0 / 32];
        else u0[k] = load4(e + c0 / 2), sb[k] = e[D / 2 + c0 / 16];
      }
#pragma unroll
      for (int k = 0; k < k_mma_unroll; ++k) {
        const int i = base + k * (int)blockDim.x, j = i / units, c0 = (i - j * units) * 8;
        if (i >= k_mma_keys * units) continue;
        float f[8];
        if (j >= nt) {
#pragma unroll
          for (int c = 0; c < 8; ++c) f[c] = 0.0f;
        } else if (!tfp4[j]) {
          const float sc = ue8m0_value(sb[k]);
#pragma unroll
          for (int c = 0; c < 4; ++c) f[c] = e4m3_value((u0[k] >> (8 * c)) & 0xFFu) * sc, f[4 + c] = e4m3_value((u1[k] >> (8 * c)) & 0xFFu) * sc;
        } else {
          const float sc = e4m3_value(sb[k]);
#pragma unroll
          for (int c = 0; c < 8; ++c) f[c] = e2m1_value((u0[k] >> (4 * c)) & 15u) * sc;
        }
        *reinterpret_cast<uint4*>(kt + j * RS + c0) =
            make_uint4(pack_bf16x2(f[0], f[1]), pack_bf16x2(f[2], f[3]), pack_bf16x2(f[4], f[5]), pack_bf16x2(f[6], f[7]));
      }
    }
    __syncthreads();
    // scores of keys 8·warp .. + 7 for the 16 heads: q hi and lo against the tile
    {
      float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (8 * warp < nt) {
        const int arow = (lane & 7) + 8 * ((lane >> 3) & 1), acol = 8 * (lane >> 4);  // ldmatrix x4 rows
        const int brow = 8 * warp + (lane & 7), bcol = 8 * ((lane >> 3) & 1);         // ldmatrix x2 rows
#pragma unroll 4
        for (int k0 = 0; k0 < D; k0 += 16) {
          uint32_t ah[4], al[4], b[2];
          ldsm_x4(ah, qhi + arow * RS + k0 + acol);
          ldsm_x4(al, qlo + arow * RS + k0 + acol);
          ldsm_x2(b, kt + brow * RS + k0 + bcol);
          mma16816(c, ah, b[0], b[1]);
          mma16816(c, al, b[0], b[1]);
        }
      }
      const int key = 8 * warp + 2 * t;
      ss[g * k_s_stride + key] = key < nt ? c[0] * p.scale : -INFINITY;
      ss[g * k_s_stride + key + 1] = key + 1 < nt ? c[1] * p.scale : -INFINITY;
      ss[(g + 8) * k_s_stride + key] = key < nt ? c[2] * p.scale : -INFINITY;
      ss[(g + 8) * k_s_stride + key + 1] = key + 1 < nt ? c[3] * p.scale : -INFINITY;
    }
    __syncthreads();
    // online softmax: warp w takes heads 2w, 2w + 1; lane keys lane, lane + 32
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int h = 2 * warp + hh;
      const float l0 = ss[h * k_s_stride + lane], l1 = ss[h * k_s_stride + lane + 32];
      const float m = fmaxf(warp_max(fmaxf(l0, l1)), mrun[h]);
      const float e0 = __expf(l0 - m), e1 = __expf(l1 - m);
      const float l = warp_sum(e0 + e1);
      split_bf16(e0, phi[h * k_p_stride + lane], plo[h * k_p_stride + lane]);
      split_bf16(e1, phi[h * k_p_stride + lane + 32], plo[h * k_p_stride + lane + 32]);
      __syncwarp();
      if (lane == 0) fold_running(h, m, l, mrun, lrun, fac);
    }
    __syncthreads();
    // O = O · f + P · V over this warp's channels
    {
      const float f0 = fac[g], f1 = fac[g + 8];
#pragma unroll
      for (int j = 0; j < NO; ++j) o[j][0] *= f0, o[j][1] *= f0, o[j][2] *= f1, o[j][3] *= f1;
      const int arow = (lane & 7) + 8 * ((lane >> 3) & 1), acol = 8 * (lane >> 4);
      const int vrow = (lane & 7) + 8 * ((lane >> 3) & 1);  // ldmatrix x2.trans: keys k0 .. k0 + 15
      const int kmax = (nt + 15) & ~15;                    // zero rows past nt add nothing
      for (int k0 = 0; k0 < kmax; k0 += 16) {
        uint32_t ah[4], al[4];
        ldsm_x4(ah, phi + arow * k_p_stride + k0 + acol);
        ldsm_x4(al, plo + arow * k_p_stride + k0 + acol);
#pragma unroll
        for (int j = 0; j < NO; ++j) {
          uint32_t b[2];
          ldsm_x2_trans(b, kt + (k0 + vrow) * RS + warp * 8 * NO + 8 * j);
          mma16816(o[j], ah, b[0], b[1]);
          mma16816(o[j], al, b[0], b[1]);
        }
      }
    }
    __syncthreads();  // the tile, scores and probabilities are free for the next tile
  }
  // the accumulators -> acc [16, D] fp32 over the tile's memory, then the common end
  float* acc = reinterpret_cast<float*>(kt);
#pragma unroll
  for (int j = 0; j < NO; ++j) {
    const int c = warp * 8 * NO + 8 * j + 2 * t;
    acc[g * D + c] = o[j][0], acc[g * D + c + 1] = o[j][1];
    acc[(g + 8) * D + c] = o[j][2], acc[(g + 8) * D + c + 1] = o[j][3];
  }
  __syncthreads();
  // the fold's scratch (acc is read first: the partials are written before the fold): q's
  // memory [16, D] (32·(D + 8) bytes), the scores' [16, k_s_stride ≥ k_max_splits], fac [16]
  finish_block<kFold>(p, r, h0, nh, split, splits, acc, mrun, lrun, k_mma_heads, reinterpret_cast<float*>(qhi), ss, fac);
}

// ---- cluster path: decode steps of few rows ---------------------------------------------------
// One cluster of S blocks per (row, group of HB heads). A row's keys are numbered by slot: window
// slots [0, tw) (slot j: window key j, if j < wn) then selected slots [0, tk) (slot j: entry
// sel[j], if j < nsel); tw and tk are bounds the host knows (wcap, K, max_keys), so every entry
// pointer follows from loads issued at once (row metadata and sel) — no chain beyond sel -> entry.
// Block s of the cluster takes slots s, s + S, s + 2S, ... (window and selected keys mixed, so no
// block idles early in a sequence). Lane l of a warp holds channels [l·CPL, l·CPL + CPL) of q (its
// HB heads, rotated as read), of a key (dequantised in registers: the warp reads an entry with one
// coalesced load per lane) and of the accumulators; each warp runs its own online softmax over
// its keys, the block's warps are folded through shared memory, and the cluster's blocks through
// distributed shared memory: block s folds channels [s·D/S, (s + 1)·D/S) of every head over the S
// blocks, adds the sink and writes them (inverse RoPE on the way out). No workspace, no atomics,
// no second pass over global memory: at batch 1 the split fold of the other kernels (partials to
// global memory, a fence, a counter, the last block reading them back) was most of a launch.
constexpr int k_cl_threads = 256;
constexpr int k_cl_warps = k_cl_threads / 32;
constexpr int k_cl_batch = 8;        // keys a warp loads before it computes (a decode row of the 1.2 B config: 10 per warp)
constexpr int k_cl_max_hb_cpl = 64;  // HB × CPL: q and the accumulators stay in registers
constexpr int k_cl_max_size = 8;     // blocks per cluster (the portable maximum)

// shared memory of the cluster kernel: warp partials [warps][HB][D] + their max and sum
// [warps][HB] ×2, the block's [HB][D] + [HB] ×2 (read by the other blocks), then ns entry pointers
__host__ __device__ constexpr size_t cl_floats(int D, int hb) {
  return (size_t)k_cl_warps * hb * D + 2 * (size_t)k_cl_warps * hb + (size_t)hb * D + 2 * (size_t)hb;
}
__host__ __device__ constexpr size_t cl_smem_bytes(int D, int hb, int ns) {
  return sizeof(float) * cl_floats(D, hb) + sizeof(const uint8_t*) * (size_t)ns;
}

// The packed codes of lane `lane`'s CPL channels of an entry and the byte of their scale (an fp8
// entry: one UE8M0 scale per 32 channels; an fp4 entry: one E4M3 scale per 16; CPL divides both).
template <int CPL>
struct lane_codes {
  static constexpr int kWords = CPL >= 4 ? CPL / 4 : 1;
  uint32_t w[kWords];
  uint32_t sb;
  __device__ void load(const uint8_t* e, bool fp8, int lane) {
    constexpr int D = 32 * CPL;
#pragma unroll
    for (int k = 0; k < kWords; ++k) w[k] = 0;
    if (fp8) {
      const uint8_t* a = e + lane * CPL;
      if constexpr (CPL >= 4) {
#pragma unroll
        for (int k = 0; k < CPL / 4; ++k) w[k] = load4(a + 4 * k);
      } else if constexpr (CPL == 2) {
        w[0] = (uint32_t)a[0] | (uint32_t)a[1] << 8;
      } else {
        w[0] = a[0];
      }
      sb = e[D + lane * CPL / 32];
    } else {
      const uint8_t* a = e + lane * CPL / 2;
      if constexpr (CPL >= 8) {
#pragma unroll
        for (int k = 0; k < CPL / 8; ++k) w[k] = load4(a + 4 * k);
      } else if constexpr (CPL == 4) {
        w[0] = (uint32_t)a[0] | (uint32_t)a[1] << 8;
      } else if constexpr (CPL == 2) {
        w[0] = a[0];
      } else {
        w[0] = (uint32_t)a[0] >> (4 * (lane & 1));  // one channel: this lane's nibble
      }
      sb = e[D / 2 + lane * CPL / 16];
    }
  }
  // channel i of the lane's CPL, dequantised (exact: code × scale). E4M3 pairs through the
  // hardware's conversion to fp16 (exact, and a fraction of e4m3_value's code: the loop decodes
  // 8 keys unrolled); the same values as e4m3_value for every code the packers write.
  __device__ void decode(bool fp8, float (&k)[CPL]) const {
    if (fp8) {
      const float sc = ue8m0_value(sb);
      if constexpr (CPL >= 2) {
#pragma unroll
        for (int i = 0; i < CPL; i += 2) {
          const uint32_t two = (w[i >> 2] >> (8 * (i & 3))) & 0xFFFFu;
          const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)two, __NV_E4M3);
          k[i] = __half2float(__ushort_as_half(h.x)) * sc;
          k[i + 1] = __half2float(__ushort_as_half(h.y)) * sc;
        }
      } else {
        k[0] = e4m3_value(w[0] & 0xFFu) * sc;
      }
    } else {
      const float sc = e4m3_value(sb);
#pragma unroll
      for (int i = 0; i < CPL; ++i) k[i] = e2m1_value((w[i >> 3] >> (4 * (i & 7))) & 15u) * sc;
    }
  }
};

// grid (R, ceil(H / HB), S) in clusters of (1, 1, S); tw, tk: the slot bounds; ns: slots per block
template <int CPL, int HB>
__global__ void __launch_bounds__(k_cl_threads) sparse_attention_cluster_kernel(sparse_attention_params p, int tw, int tk,
                                                                                int ns) {
  pdl_entry();
  namespace cg = cooperative_groups;
  constexpr int D = 32 * CPL;
  cg::cluster_group cl = cg::this_cluster();
  const int S = (int)cl.num_blocks(), rank = (int)cl.block_rank();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* wacc = reinterpret_cast<float*>(smem_raw);  // [warps][HB][D]
  float* wm = wacc + k_cl_warps * HB * D;            // [warps][HB]
  float* wl = wm + k_cl_warps * HB;                  // [warps][HB]
  float* bacc = wl + k_cl_warps * HB;                // [HB][D] this block's (read by the cluster)
  float* bm = bacc + HB * D;                         // [HB]
  float* bl = bm + HB;                               // [HB]
  const uint8_t** tkey = reinterpret_cast<const uint8_t**>(bl + HB);  // [ns]; null: no key in the slot

  const int r = blockIdx.x, h0 = blockIdx.y * HB, nh = min(HB, p.H - h0);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  // the block's entry pointers (row metadata and sel are independent loads)
  {
    const int nw = p.wn[r], ws = p.wstart[r], nc = p.nsel ? p.nsel[r] : 0;
    const uint8_t* wk = p.wkeys[r];
    const size_t wbytes = fp8_swa_bytes(D), mbytes = fp4_kv_bytes(D);
    for (int i = threadIdx.x; i < ns; i += blockDim.x) {
      const int t = rank + S * i;
      const uint8_t* e = nullptr;
      if (t < tw) {
        if (t < nw) e = wk + (size_t)((ws + t) % p.wcap) * wbytes;
      } else if (t - tw < tk) {
        const int j = t - tw;
        const int32_t id = p.sel[(size_t)r * p.K + j];
        if (j < nc) e = p.main[r] + (size_t)id * mbytes;
      }
      tkey[i] = e;
    }
  }
  float qr[HB][CPL], acc[HB][CPL], m[HB], l[HB];
#pragma unroll
  for (int h = 0; h < HB; ++h) {
    const float* qv = p.q + ((size_t)r * p.H + h0 + min(h, nh - 1)) * D;
#pragma unroll
    for (int i = 0; i < CPL; ++i) {
      qr[h][i] = h < nh ? rope_channel(p, r, D, lane * CPL + i, 1.0f, [&](int j) { return qv[j]; }) : 0.0f;
      acc[h][i] = 0.0f;
    }
    m[h] = -INFINITY, l[h] = 0.0f;
  }
  __syncthreads();
  // this warp's slots: warp, warp + warps, ...; k_cl_batch keys' codes in flight at once
  for (int i0 = warp; i0 < ns; i0 += k_cl_warps * k_cl_batch) {
    lane_codes<CPL> kc[k_cl_batch];
    const uint8_t* e[k_cl_batch];
#pragma unroll
    for (int b = 0; b < k_cl_batch; ++b) {
      const int i = i0 + b * k_cl_warps;
      e[b] = i < ns ? tkey[i] : nullptr;
      if (e[b]) kc[b].load(e[b], rank + S * i < tw, lane);
    }
#pragma unroll
    for (int b = 0; b < k_cl_batch; ++b) {
      if (!e[b]) continue;  // warp-uniform
      float k[CPL];
      kc[b].decode(rank + S * (i0 + b * k_cl_warps) < tw, k);
#pragma unroll
      for (int h = 0; h < HB; ++h) {
        float d = 0.0f;
#pragma unroll
        for (int i = 0; i < CPL; ++i) d = fmaf(qr[h][i], k[i], d);
        const float s = warp_sum(d) * p.scale;  // the same value in every lane
        const float mn = fmaxf(m[h], s);
        const float f = __expf(m[h] - mn), pe = __expf(s - mn);  // f = 0 before the first key
        l[h] = l[h] * f + pe;
        m[h] = mn;
#pragma unroll
        for (int i = 0; i < CPL; ++i) acc[h][i] = fmaf(pe, k[i], acc[h][i] * f);
      }
    }
  }
  // the warps' states -> the block's
#pragma unroll
  for (int h = 0; h < HB; ++h) {
#pragma unroll
    for (int i = 0; i < CPL; ++i) wacc[(warp * HB + h) * D + lane * CPL + i] = acc[h][i];
    if (lane == 0) wm[warp * HB + h] = m[h], wl[warp * HB + h] = l[h];
  }
  __syncthreads();
  for (int x = threadIdx.x; x < HB * D; x += blockDim.x) {
    const int h = x / D;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < k_cl_warps; ++w) mx = fmaxf(mx, wm[w * HB + h]);
    float a = 0.0f, s = 0.0f;
#pragma unroll
    for (int w = 0; w < k_cl_warps; ++w) {
      const float wt = wm[w * HB + h] == -INFINITY ? 0.0f : __expf(wm[w * HB + h] - mx);
      a += wacc[(w * HB) * D + x] * wt;
      s += wl[w * HB + h] * wt;
    }
    bacc[x] = a;
    if (x - h * D == 0) bm[h] = mx, bl[h] = s;
  }
  cl.sync();  // every block's state is complete and visible to the cluster
  // this block's channels [c0, c0 + cw) of every head, over the cluster's blocks and the sink;
  // the values before the inverse RoPE go to fo (the warp partials' memory, free now)
  const int cw = D / S, c0 = rank * cw;
  float* fo = wacc;  // [HB][cw]
  for (int x = threadIdx.x; x < nh * cw; x += blockDim.x) {
    const int h = x / cw, c = c0 + (x - h * cw);
    const float sink = p.sink[h0 + h];
    // the S blocks' values read first (their distributed-shared-memory loads in flight together,
    // not one round trip per block), then folded in block order
    float mq[k_cl_max_size], lq[k_cl_max_size], aq[k_cl_max_size];
#pragma unroll
    for (int q = 0; q < k_cl_max_size; ++q)
      if (q < S) {
        mq[q] = *cl.map_shared_rank(bm + h, q);
        lq[q] = *cl.map_shared_rank(bl + h, q);
        aq[q] = *cl.map_shared_rank(bacc + h * D + c, q);
      }
    float mx = sink;
#pragma unroll
    for (int q = 0; q < k_cl_max_size; ++q)
      if (q < S) mx = fmaxf(mx, mq[q]);
    float a = 0.0f, den = __expf(sink - mx);
#pragma unroll
    for (int q = 0; q < k_cl_max_size; ++q)
      if (q < S) {
        const float e = __expf(mq[q] - mx);
        const float wt = mq[q] == -INFINITY ? 0.0f : e;
        a += aq[q] * wt;
        den += lq[q] * wt;
      }
    fo[x] = a / den;
  }
  __syncthreads();
  // this block's reads of the cluster's shared memory are done (their values are in fo): say so
  // now, wait for the others' only before leaving (no block leaves while another may still read
  // its shared memory). Relaxed: the arrival publishes no writes.
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
  for (int x = threadIdx.x; x < nh * cw; x += blockDim.x) {
    const int h = x / cw, c = c0 + (x - h * cw);
    const float* fh = fo + h * cw - c0;  // fh[j]: channel j of head h (j in [c0, c0 + cw))
    p.out[((size_t)r * p.H + h0 + h) * D + c] = rope_channel(p, r, D, c, -1.0f, [&](int j) { return fh[j]; });
  }
  asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
}

// One block per (row, head): the splits' fold when no `done` counters are given.
__global__ void sparse_attention_combine(sparse_attention_params p, int splits) {
  pdl_entry();
  extern __shared__ float orow[];  // [D] the row's output before the inverse RoPE
  __shared__ float wsplit[k_max_splits];
  __shared__ float s_den;
  combine_heads(p, splits, blockIdx.x, blockIdx.y, 1, 1, orow, wsplit, &s_den);
}

// The cluster kernel of CPL channels per lane and hb heads per block (1, 2 or 4).
using cl_kernel_t = void (*)(sparse_attention_params, int, int, int);
template <int CPL>
cl_kernel_t cl_kernel_of(int hb) {
  if constexpr (CPL * 4 <= k_cl_max_hb_cpl) {
    if (hb >= 4) return sparse_attention_cluster_kernel<CPL, 4>;
  }
  if (hb == 2) return sparse_attention_cluster_kernel<CPL, 2>;
  return sparse_attention_cluster_kernel<CPL, 1>;
}
cl_kernel_t cl_kernel(int cpl, int hb) {
  switch (cpl) {
    case 1: return cl_kernel_of<1>(hb);
    case 2: return cl_kernel_of<2>(hb);
    case 4: return cl_kernel_of<4>(hb);
    case 8: return cl_kernel_of<8>(hb);
    default: return cl_kernel_of<16>(hb);
  }
}

// Heads per block, splits over the keys and the workspace they need.
struct launch_shape {
  int hb = -1, splits = 1;
  bool mma = false;  // the tensor-core kernel (hb = k_mma_heads, tiles of k_mma_keys)
  int cluster = 0;   // > 0: the cluster kernel, `splits` blocks per cluster = (row, head group)
  int tw = 0, tk = 0, ns = 0;  // the cluster kernel's window and selected slot bounds, slots per block
  size_t workspace_floats = 0;
};

std::atomic<int> g_shape_hb{0}, g_shape_tiles{0};  // set_sparse_attention_shape (tests)
std::atomic<int> g_mma_mode{-1};                   // set_sparse_attention_mma (tests); −1: the environment's

// Splits of max_tiles key tiles over about `want` blocks given `blocks` without a split (at
// most k_max_splits, each split at least one tile, none left empty).
int split_count(int64_t blocks, int64_t want, int max_tiles) {
  if (blocks >= want || max_tiles <= 1) return 1;
  int splits = (int)std::min<int64_t>({(want + blocks - 1) / blocks, (int64_t)max_tiles, (int64_t)k_max_splits});
  const int per = (max_tiles + splits - 1) / splits;  // tiles per split
  return (max_tiles + per - 1) / per;
}

// The built-in rule's threshold: the tensor-core kernel from this many (row, 16-head group)
// blocks before splits. Measured (1.2 B config, 8K context, device ms per decode step, fp32
// kernel vs tensor cores): batch 64 (64 blocks, 5 splits each) 8.90 vs 6.35 (H100 and H200);
// batch 8 (10 splits each) 2.66 vs 2.43 (H200); batch 1 (10 splits of one block) 1.14 vs
// 1.39 (H200), so a row alone stays on the fp32 kernel (its splits are per head: 16 times the
// blocks, each dequantising one key tile).
constexpr int64_t k_mma_min_blocks = 8;

int mma_mode() {
  // CEDAR_CUDA_ATTN_MMA (read once): 0 the fp32 kernel only; 1 (default) the built-in rule: the
  // tensor-core kernel from k_mma_min_blocks (row, 16-head group) blocks (prefill chunks, decode
  // batches of 8+ rows at 16 heads), the cluster kernel below that; 2 the tensor-core kernel
  // wherever the head_dim allows (splits included); 3 the cluster kernel wherever it allows
  static const int env = env_choice("CEDAR_CUDA_ATTN_MMA", 0, 3, 1);
  const int t = g_mma_mode.load();
  return t >= 0 ? t : env;
}

// CEDAR_CUDA_ATTN_CLUSTER=0 (read once) keeps the built-in rule off the cluster kernel (A/B runs)
bool cluster_rule_on() {
  static const bool on = env_choice("CEDAR_CUDA_ATTN_CLUSTER", 0, 1, 1) != 0;
  return on;
}

// The cluster kernel's head_dims: 32 · CPL channels, CPL a power of two up to 16.
bool cluster_head_dim(int D) { return D % 32 == 0 && D / 32 <= 16 && ((D / 32) & (D / 32 - 1)) == 0; }

bool mma_head_dim(int D) { return D == 64 || D == 128 || D == 256 || D == 512; }

// allow_cluster false: the shape the other kernels would take (the workspace is sized by it, so
// a caller keeps the split path when a test or a setting turns the cluster kernel off)
launch_shape shape_of(const sparse_attention_params& p, bool allow_cluster = true) {
  static int sms = 0;  // kept for the first device a process uses (the executor drives one)
  if (!sms) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
      return {};
  }
  launch_shape ls;
  // CEDAR_CUDA_ATTN="HB,TILES" (diagnostics, read once): HB heads per block and TILES key
  // tiles per split instead of the rule below (the fp32 kernel); benchmarks sweep it
  static const std::pair<int, int> env_forced = [] {
    std::pair<int, int> f{0, 0};
    if (const char* v = std::getenv("CEDAR_CUDA_ATTN")) std::sscanf(v, "%d,%d", &f.first, &f.second);
    return f;
  }();
  const std::pair<int, int> forced = g_shape_hb.load() > 0 ? std::pair<int, int>{g_shape_hb.load(), g_shape_tiles.load()}
                                                           : env_forced;
  const bool is_forced = forced.first > 0 && forced.second > 0;
  const int64_t want = 2 * (int64_t)sms;
  const int mode = is_forced ? 0 : mma_mode();
  const int64_t groups16 = (int64_t)p.R * ((p.H + k_mma_heads - 1) / k_mma_heads);
  if (allow_cluster && cluster_head_dim(p.D) && (mode == 3 || (mode == 1 && groups16 < k_mma_min_blocks && cluster_rule_on()))) {
    // one block per multiprocessor or so: clusters of 8 over one head each, more heads per block
    // and then smaller clusters while the grid is larger than that
    const int cpl = p.D / 32;
    int hb = 1, S = k_cl_max_size;
    auto nblocks = [&] { return (int64_t)p.R * ((p.H + hb - 1) / hb) * S; };
    while (nblocks() > sms && hb < 4 && hb < p.H && 2 * hb * cpl <= k_cl_max_hb_cpl) hb *= 2;
    while (nblocks() > 4 * sms && S > 2) S /= 2;  // (clusters of 8 up to 4 blocks per SM: a row sums the same way at batch 1..7)
    ls.hb = hb;
    ls.splits = S;
    ls.cluster = S;
    ls.tw = p.max_keys > 0 ? std::min(p.wcap, p.max_keys) : p.wcap;
    ls.tk = p.nsel ? (p.max_keys > 0 ? std::min(p.K, p.max_keys) : p.K) : 0;
    ls.ns = (ls.tw + ls.tk + S - 1) / S;
    if (cl_smem_bytes(p.D, hb, ls.ns) <= 160 * 1024) return ls;  // else (huge windows) the other kernels
    ls = launch_shape{};
  }
  if ((mode == 1 || mode == 2) && mma_head_dim(p.D)) {
    const int64_t blocks = groups16;
    if (mode == 2 || blocks >= k_mma_min_blocks) {
      ls.mma = true;
      ls.hb = k_mma_heads;
      ls.splits = split_count(blocks, want, (p.max_keys + k_mma_keys - 1) / k_mma_keys);
      ls.workspace_floats = ls.splits > 1 ? (size_t)p.R * p.H * ls.splits * (2 + (size_t)p.D) : 0;
      return ls;
    }
  }
  auto bytes = [&](int h) { return sizeof(float) * ((size_t)2 * h * p.D + (size_t)k_tile * p.D + (size_t)h * k_tile + 3 * (size_t)h); };
  int hb = p.H;
  while (hb > 1 && bytes(hb) > 96 * 1024) hb = (hb + 1) / 2;
  // a decode batch of a few rows: fewer heads per block until the grid gives every
  // multiprocessor ~2 blocks, then split the keys (p.max_keys) over up to 4 blocks per
  // multiprocessor
  while (hb > 1 && (int64_t)p.R * ((p.H + hb - 1) / hb) < want) hb = (hb + 1) / 2;
  // each split takes at least one tile: a block's time is its chain of tiles (dequantise,
  // score, softmax, accumulate, each behind a barrier), so at batch 1 short chains on many
  // blocks beat long ones on few
  const int64_t blocks = (int64_t)p.R * ((p.H + hb - 1) / hb);
  const int max_tiles = (p.max_keys + k_tile - 1) / k_tile;
  int splits = blocks < want ? split_count(blocks, 2 * want, max_tiles) : 1;
  if (is_forced) {
    hb = std::min(p.H, forced.first);
    while (hb > 1 && bytes(hb) > 96 * 1024) hb = (hb + 1) / 2;
    splits = std::min(k_max_splits, std::max(1, (max_tiles + forced.second - 1) / forced.second));
    if (max_tiles > 0) {  // no split left empty
      const int per = (max_tiles + splits - 1) / splits;
      splits = (max_tiles + per - 1) / per;
    }
  }
  ls.hb = hb;
  ls.splits = splits;
  ls.workspace_floats = splits > 1 ? (size_t)p.R * p.H * splits * (2 + (size_t)p.D) : 0;
  return ls;
}

}  // namespace

void set_sparse_attention_mma(int mode) { g_mma_mode = mode >= 0 && mode <= 3 ? mode : -1; }

void set_sparse_attention_shape(int heads_per_block, int tiles_per_split) {
  const bool on = heads_per_block > 0 && tiles_per_split > 0;
  g_shape_tiles = on ? tiles_per_split : 0;
  g_shape_hb = on ? heads_per_block : 0;
}

size_t sparse_attention_workspace_floats(const sparse_attention_params& p) {
  return p.R > 0 && p.H > 0 && p.D > 0 ? shape_of(p, false).workspace_floats : 0;
}

status sparse_attention(const sparse_attention_params& p, cudaStream_t stream) {
  auto bad = [](const std::string& what) {
    return make_error(errc::invalid_argument, "cuda::sparse_attention: " + what);
  };
  if (p.R < 0 || p.H <= 0) return bad("R must be >= 0 and H > 0");
  if (p.D <= 0 || p.D % 32) return bad("head_dim " + std::to_string(p.D) + " is not a positive multiple of 32");
  if (p.R == 0) return {};
  if (!p.q || !p.sink || !p.out || !p.wkeys || !p.wstart || !p.wn) return bad("a required pointer is null");
  if (p.wcap <= 0) return bad("wcap must be > 0");
  if (p.nsel && (!p.main || !p.sel || p.K <= 0)) return bad("nsel given without main/sel/K");
  if (p.rope_cos && (!p.rope_sin || p.rope_np <= 0 || 2 * p.rope_np > p.D)) return bad("bad RoPE pairs or null sin");
  // heads per block: as many as fit in ~96 KB of shared memory with the tile, and no more
  // than leaves ~2 blocks per multiprocessor (each block dequantises its keys for its heads);
  // or the tensor-core kernel's 16 (shape_of)
  const launch_shape ls = shape_of(p);
  if (ls.hb < 0) return bad("could not read the device's multiprocessor count");
  const int hb = ls.hb;
  // splits over the keys only when the caller gave a large enough workspace
  const int splits = p.workspace && p.workspace_floats >= ls.workspace_floats ? ls.splits : 1;
  const bool fold = splits > 1 && p.done;
  const dim3 grid((unsigned)p.R, (unsigned)((p.H + hb - 1) / hb), (unsigned)splits);
  // the opt-in above 48 KB, set once per kernel and size increase (a per-launch call costs host
  // time); like `sms`, kept for the first device a process uses (the executor drives one device)
  auto optin = [](const void* kernel, size_t smem, size_t& done) -> status {
    if (smem <= done) return {};
    CEDAR_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                   "cuda::sparse_attention: shared memory attribute");
    done = smem;
    return {};
  };
  if (ls.cluster > 0) {
    const size_t smem = cl_smem_bytes(p.D, hb, ls.ns);
    const cl_kernel_t kernel = cl_kernel(p.D / 32, hb);
    static size_t smem_optin[5][3] = {};  // [log2 CPL][log2 HB]
    int lc = 0, lh = 0;
    while ((1 << lc) < p.D / 32) ++lc;
    while ((1 << lh) < hb) ++lh;
    if (!smem_optin[lc][lh]) smem_optin[lc][lh] = 48 * 1024;
    CEDAR_TRY(optin(reinterpret_cast<const void*>(kernel), smem, smem_optin[lc][lh]));
    launch_kernel_cluster(kernel, dim3((unsigned)p.R, (unsigned)((p.H + hb - 1) / hb), (unsigned)ls.cluster),
                          dim3(1, 1, (unsigned)ls.cluster), k_cl_threads, smem, stream, p, ls.tw, ls.tk, ls.ns);
    CEDAR_CUDA_LAUNCHED("cuda::sparse_attention (cluster)");
    return {};
  }
  if (ls.mma) {
    const size_t smem = mma_smem_bytes(p.D);
    const int no = p.D / 64;
    using kernel_t = void (*)(sparse_attention_params, int);
    kernel_t kernel = nullptr;
    switch (no) {
      case 1: kernel = fold ? sparse_attention_mma_kernel<1, true> : sparse_attention_mma_kernel<1, false>; break;
      case 2: kernel = fold ? sparse_attention_mma_kernel<2, true> : sparse_attention_mma_kernel<2, false>; break;
      case 4: kernel = fold ? sparse_attention_mma_kernel<4, true> : sparse_attention_mma_kernel<4, false>; break;
      default: kernel = fold ? sparse_attention_mma_kernel<8, true> : sparse_attention_mma_kernel<8, false>; break;
    }
    static size_t smem_optin[4][2] = {{48 * 1024, 48 * 1024}, {48 * 1024, 48 * 1024}, {48 * 1024, 48 * 1024}, {48 * 1024, 48 * 1024}};
    const int slot = no == 1 ? 0 : no == 2 ? 1 : no == 4 ? 2 : 3;
    CEDAR_TRY(optin(reinterpret_cast<const void*>(kernel), smem, smem_optin[slot][fold]));
    launch_kernel(kernel, grid, k_mma_threads, smem, stream, p, splits);
    CEDAR_CUDA_LAUNCHED("cuda::sparse_attention (tensor cores)");
  } else {
    auto bytes = [&](int h) { return sizeof(float) * ((size_t)2 * h * p.D + (size_t)k_tile * p.D + (size_t)h * k_tile + 3 * (size_t)h); };
    if (bytes(hb) > 200 * 1024) return bad("head_dim " + std::to_string(p.D) + " needs too much shared memory");
    const size_t smem = bytes(hb);
    auto* kernel = fold ? sparse_attention_kernel<true> : sparse_attention_kernel<false>;
    static size_t smem_optin[2] = {48 * 1024, 48 * 1024};  // per instantiation
    CEDAR_TRY(optin(reinterpret_cast<const void*>(kernel), smem, smem_optin[fold]));
    launch_kernel(kernel, grid, k_threads, smem, stream, p, hb, splits);
    CEDAR_CUDA_LAUNCHED("cuda::sparse_attention");
  }
  if (splits > 1 && !fold) {
    launch_kernel(sparse_attention_combine, dim3((unsigned)p.R, (unsigned)p.H), 128, sizeof(float) * (size_t)p.D, stream,
                  p, splits);
    CEDAR_CUDA_LAUNCHED("cuda::sparse_attention (combine)");
  }
  return {};
}

}  // namespace cedar::kernels::cuda
