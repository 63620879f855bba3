// qgemv — see qgemv.cuh. Kernel template over (weight format F, weights per lane-load V,
// activation tile MT, rows per warp group RW, warps per group WS); the host picks MT from m
// (1, 2, 4 or 8, so m = 1 keeps one accumulator per row), V and RW from the format (one
// 16-byte load per lane and row; RW × V bounded by registers), WS from the row count.
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/mhc_device.cuh"
#include "kernels/cuda/moe_device.cuh"
#include "kernels/cuda/qgemv.cuh"
#include "kernels/cuda/qgemv_mma.cuh"

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>

namespace cedar::kernels::cuda {
namespace {

constexpr int k_warps = 4;  // warps per block

__device__ __forceinline__ float ue8m0_fast(uint32_t b) {
  return b ? __uint_as_float(b << 23) : 5.877471754e-39f;  // 2^-127 (subnormal)
}

__device__ __forceinline__ float block_scale(const qmatrix& w, int64_t trow, int64_t c) {
  const int64_t i = (trow / w.scale_block_rows) * w.scale_cols + (c >> 5);
  return w.scale_f32 ? __ldg(w.scale_f32 + i) : ue8m0_fast(__ldg(w.scale_e8m0 + i));
}

// Weights (row r of the view, columns c..c+V-1; c % V == 0) -> v[V] and the run's scale:
// the true weights are v[k] · scale. One 16-byte load per lane for bf16 (V 8), fp8 (V 16) and
// fp4 (V 32); f32 reads two (V 8); fp8 with cols % 16 != 0 reads 8 bytes (V 8). A V-run never
// crosses a 32-column scale block, so the scale multiplies the run's partial dot product once.
//   fp8: the hardware converts two E4M3 codes to two fp16 per instruction (exact).
//   fp4: E2M1 codes through a 32-bit constant (e2m1_fast).
__device__ __forceinline__ void half2_to(uint32_t h2, float& lo, float& hi) {
  __half2_raw raw;
  raw.x = (unsigned short)(h2 & 0xFFFFu);
  raw.y = (unsigned short)(h2 >> 16);
  const float2 f = __half22float2(__half2(raw));
  lo = f.x;
  hi = f.y;
}

__device__ __forceinline__ uint32_t e4m3x2_to_half2(uint32_t two) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)two, __NV_E4M3);
  return (uint32_t)h.x | (uint32_t)h.y << 16;
}

// E2M1 code -> value: magnitudes ×2 = {0, 1, 2, 3, 4, 6, 8, 12} packed 4 bits each in one
// 32-bit constant. (The fp16 bit-placement trick, two nibbles -> half2, measured slower here:
// 15.0% against 18.8% of the copy bandwidth on the 16384 × 4096 matrix.)
__device__ __forceinline__ float e2m1_fast(uint32_t code) {
  const uint32_t twice = (0xC8643210u >> ((code & 7u) * 4u)) & 15u;
  const float mag = 0.5f * (float)twice;
  return code & 8u ? -mag : mag;
}

// Weight loads through the non-coherent path with an L2 cache policy (createpolicy once per
// thread: evict first, or evict normal — what a plain load does), carried by each load as a
// cache hint.
__device__ __forceinline__ uint64_t weight_policy(bool evict_first) {
  return make_l2_policy(evict_first ? l2_policy::evict_first : l2_policy::evict_normal);
}
__device__ __forceinline__ uint4 ldw4(const void* p, uint64_t pol) {
  uint4 v;
  asm("ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p), "l"(pol));
  return v;
}
__device__ __forceinline__ uint2 ldw2(const void* p, uint64_t pol) {
  uint2 v;
  asm("ld.global.nc.L2::cache_hint.v2.u32 {%0, %1}, [%2], %3;" : "=r"(v.x), "=r"(v.y) : "l"(p), "l"(pol));
  return v;
}

template <weight_format F, int V>
__device__ __forceinline__ float loadv(const qmatrix& w, int64_t r, int64_t c, float v[V], uint64_t pol) {
  const int64_t trow = w.row0 + r;
  if constexpr (F == weight_format::f32) {
    const uint4* p = reinterpret_cast<const uint4*>(static_cast<const float*>(w.data) + trow * w.cols + c);
    const uint4 ua = ldw4(p, pol), ub = ldw4(p + 1, pol);
    const float4 a = make_float4(__uint_as_float(ua.x), __uint_as_float(ua.y), __uint_as_float(ua.z), __uint_as_float(ua.w));
    const float4 b = make_float4(__uint_as_float(ub.x), __uint_as_float(ub.y), __uint_as_float(ub.z), __uint_as_float(ub.w));
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    return 1.0f;
  } else if constexpr (F == weight_format::bf16) {
    const uint4 q = ldw4(static_cast<const uint16_t*>(w.data) + trow * w.cols + c, pol);
    const uint32_t u[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
      v[2 * k] = __uint_as_float(u[k] << 16);
      v[2 * k + 1] = __uint_as_float(u[k] & 0xFFFF0000u);
    }
    return 1.0f;
  } else if constexpr (F == weight_format::f8_e4m3) {
    const uint8_t* base = static_cast<const uint8_t*>(w.data) + trow * w.cols + c;
    const float s = block_scale(w, trow, c);
    if constexpr (V == 16) {
      const uint4 q = ldw4(base, pol);
      const uint32_t u[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
      for (int k = 0; k < 4; k++) {
        half2_to(e4m3x2_to_half2(u[k] & 0xFFFFu), v[4 * k], v[4 * k + 1]);
        half2_to(e4m3x2_to_half2(u[k] >> 16), v[4 * k + 2], v[4 * k + 3]);
      }
    } else {
      const uint2 q = ldw2(base, pol);
      half2_to(e4m3x2_to_half2(q.x & 0xFFFFu), v[0], v[1]);
      half2_to(e4m3x2_to_half2(q.x >> 16), v[2], v[3]);
      half2_to(e4m3x2_to_half2(q.y & 0xFFFFu), v[4], v[5]);
      half2_to(e4m3x2_to_half2(q.y >> 16), v[6], v[7]);
    }
    return s;
  } else {  // fp4_e2m1, V 32: 16 bytes = 32 codes, element 2i in the low nibble of byte i
    const uint4 q = ldw4(static_cast<const uint8_t*>(w.data) + (trow * w.cols + c) / 2, pol);
    const uint32_t u[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int k = 0; k < 32; k++) v[k] = e2m1_fast((u[k >> 3] >> (4 * (k & 7))) & 15u);
    return block_scale(w, trow, c);
  }
}

// Block: k_warps warps = (k_warps / WS) row groups of RW rows, WS warps per group splitting the
// columns (WS > 1 when the matrix has too few rows to fill the GPU with one warp per group);
// partial sums of the WS warps meet in shared memory, in a fixed order (deterministic).
// SwiGLU items (p.glu_up): a group's RW rows are RW / 2 rows of the gate matrix and the same
// rows of the up matrix, so the lane that ends with the sums holds both and writes the
// activation (swiglu_rows' formula) — no exchange between warps, no second launch. G: the
// instantiation that has the SwiGLU form (its row bookkeeping costs registers the plain
// launches do not pay). XS: p.x points into shared memory (plain loads, not the read-only path).
template <weight_format F, int V, int MT, int RW, int WS, bool G = false, bool XS = false>
__device__ __forceinline__ void qgemv_body(const qgemv_params& p, unsigned bx, unsigned by) {
  __shared__ float red[k_warps][RW][MT];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int grp = warp / WS, part = warp % WS;
  // output rows per group: RW, or RW / 2 for a SwiGLU item (row i of the group: gate row ob + i
  // for i < ro, up row ob + i − ro after); f32 (RW 1) has no SwiGLU form (the host refuses it)
  const bool glu = G && RW % 2 == 0 && p.glu_up.data != nullptr;
  const int ro = glu ? RW / 2 : RW;
  const int64_t ob = ((int64_t)bx * (k_warps / WS) + grp) * ro;
  const int m0 = (int)by * MT;
  const int mt = min(MT, p.m - m0);
  float acc[RW][MT];
#pragma unroll
  for (int i = 0; i < RW; i++)
#pragma unroll
    for (int j = 0; j < MT; j++) acc[i][j] = 0.0f;
  // each row's matrix and row (the two matrices share format and shape: only pointers differ)
  qmatrix wm[RW];
  int64_t wr[RW];
#pragma unroll
  for (int i = 0; i < RW; i++) {
    const bool up = glu && i >= ro;
    wm[i] = p.w;
    if (up) wm[i].data = p.glu_up.data, wm[i].row0 = p.glu_up.row0, wm[i].scale_e8m0 = p.glu_up.scale_e8m0,
            wm[i].scale_f32 = p.glu_up.scale_f32;
    wr[i] = ob + (up ? i - ro : i);
  }

  const int64_t cols = p.w.cols;
  // RMSNorm of the activation rows on the fly (x_norm_w): with the rows' factors given
  // (x_norm_inv), rms_norm's (x · inv) · w on each x load; without, the factor is deferred: the
  // dot products take x · w, the squares of x are summed in the same pass (the group's lanes
  // read every column once) and the sums are scaled by inv at the end — no pass over x before
  // the weights stream (the rounding differs from rms_norm's in the last bits)
  float xs[MT], ss[MT];
#pragma unroll
  for (int j = 0; j < MT; j++) xs[j] = 1.0f, ss[j] = 0.0f;
  const float4* g4 = reinterpret_cast<const float4*>(p.x_norm_w);
  const bool defer = g4 && !p.x_norm_inv;
  if (g4 && p.x_norm_inv) {
#pragma unroll
    for (int j = 0; j < MT; j++) xs[j] = j < mt ? __ldg(p.x_norm_inv + m0 + j) : 1.0f;
  }
  const uint64_t pol = weight_policy(p.evict_first);
  if (ob < p.w.rows) {
#pragma unroll 2
    for (int64_t c = ((int64_t)part * 32 + lane) * V; c < cols; c += (int64_t)32 * V * WS) {
      float wv[RW][V], ws[RW];
#pragma unroll
      for (int i = 0; i < RW; i++) {
        if (wr[i] < p.w.rows) ws[i] = loadv<F, V>(wm[i], wr[i], c, wv[i], pol);
        else {
          ws[i] = 0.0f;
#pragma unroll
          for (int k = 0; k < V; k++) wv[i][k] = 0.0f;
        }
      }
#pragma unroll
      for (int j = 0; j < MT; j++) {
        if (j >= mt) break;
        const float4* xp = reinterpret_cast<const float4*>(p.x + (int64_t)(m0 + j) * p.ldx + c);
        float part[RW];
#pragma unroll
        for (int i = 0; i < RW; i++) part[i] = 0.0f;
#pragma unroll
        for (int q4 = 0; q4 < V / 4; q4++) {
          float4 a = XS ? xp[q4] : __ldg(xp + q4);
          if (defer) {
            ss[j] = fmaf(a.x, a.x, fmaf(a.y, a.y, fmaf(a.z, a.z, fmaf(a.w, a.w, ss[j]))));
            const float4 g = __ldg(g4 + c / 4 + q4);
            a = make_float4(a.x * g.x, a.y * g.y, a.z * g.z, a.w * g.w);
          } else if (g4) {
            a = x_norm_apply(a, xs[j], __ldg(g4 + c / 4 + q4));  // rms_norm's (x · inv) · w
          }
#pragma unroll
          for (int i = 0; i < RW; i++) {
            part[i] = fmaf(wv[i][4 * q4], a.x, part[i]);
            part[i] = fmaf(wv[i][4 * q4 + 1], a.y, part[i]);
            part[i] = fmaf(wv[i][4 * q4 + 2], a.z, part[i]);
            part[i] = fmaf(wv[i][4 * q4 + 3], a.w, part[i]);
          }
        }
#pragma unroll
        for (int i = 0; i < RW; i++) {
          if constexpr (F == weight_format::f32 || F == weight_format::bf16) acc[i][j] += part[i];
          else acc[i][j] = fmaf(ws[i], part[i], acc[i][j]);
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < RW; i++)
#pragma unroll
    for (int j = 0; j < MT; j++) {
      float v = acc[i][j];
#pragma unroll
      for (int off = 16; off; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
      if (WS > 1 && lane == 0) red[warp][i][j] = v;
      acc[i][j] = v;
    }
  __shared__ float sred[WS > 1 ? k_warps : 1][MT];  // the deferred norm's squares per warp
  if (defer) {
#pragma unroll
    for (int j = 0; j < MT; j++) {
#pragma unroll
      for (int off = 16; off; off >>= 1) ss[j] += __shfl_xor_sync(0xffffffffu, ss[j], off);
      if (WS > 1 && lane == 0) sred[warp][j] = ss[j];
    }
  }
  if constexpr (WS > 1) __syncthreads();
  if (lane != 0 || part != 0 || ob >= p.w.rows) return;
  if (defer) {
#pragma unroll
    for (int j = 0; j < MT; j++) {
      float t = ss[j];
      if constexpr (WS > 1)
#pragma unroll
        for (int k = 1; k < WS; k++) t += sred[warp + k][j];
      xs[j] = rsqrtf(t / (float)cols + p.x_norm_eps);
    }
  }
#pragma unroll
  for (int i = 0; i < RW; i++)
#pragma unroll
    for (int j = 0; j < MT; j++) {
      float v = acc[i][j];
      if constexpr (WS > 1)
#pragma unroll
        for (int k = 1; k < WS; k++) v += red[warp + k][i][j];
      if (defer) v *= xs[j];
      acc[i][j] = v;
    }
  if (glu) {
#pragma unroll
    for (int i = 0; i < RW / 2; i++)
#pragma unroll
      for (int j = 0; j < MT; j++)
        if (j < mt && wr[i] < p.w.rows)
          p.y[(int64_t)(m0 + j) * p.ldy + wr[i]] =
              swiglu_value(acc[i][j], acc[i + RW / 2][j], p.glu_limit, p.glu_scale ? p.glu_scale[m0 + j] : 1.0f);
    return;
  }
#pragma unroll
  for (int i = 0; i < RW; i++)
#pragma unroll
    for (int j = 0; j < MT; j++)
      if (j < mt && wr[i] < p.w.rows) {
        float* yp = p.y + (int64_t)(m0 + j) * p.ldy + wr[i];
        *yp = p.accumulate ? *yp + acc[i][j] : acc[i][j];
      }
}

// The weight rows block bx reads of one matrix (qgemv_body's mapping: k_warps / WS groups of
// `ro` rows of each matrix), as a byte range: [*begin, *begin + *bytes). Rows of a view are
// contiguous in every format.
template <weight_format F, int WS>
__device__ __forceinline__ void block_weight_span(const qmatrix& w, unsigned bx, int ro, const char** begin, size_t* bytes) {
  const int64_t rows_per_block = (int64_t)(k_warps / WS) * ro;
  const int64_t r0 = (int64_t)bx * rows_per_block;
  const int64_t n = max((int64_t)0, min(rows_per_block, w.rows - r0));
  const int64_t row_bytes = F == weight_format::f32 ? 4 * w.cols : F == weight_format::bf16 ? 2 * w.cols
                          : F == weight_format::f8_e4m3 ? w.cols : w.cols / 2;
  *begin = static_cast<const char*>(w.data) + (w.row0 + r0) * row_bytes;
  *bytes = (size_t)(n * row_bytes);
}

// A block's weight span into L2: per-line prefetches by its threads, or (bulk) bulk-copy-unit
// prefetches by thread 0 with the evict-first policy (l2_bulk_prefetch).
__device__ __forceinline__ void prefetch_span(const char* p, size_t bytes, bool bulk) {
  if (!bulk) {
    l2_prefetch(p, bytes);
    return;
  }
  if (threadIdx.x == 0) l2_bulk_prefetch(p, bytes, weight_policy(true));
}

// Before waiting for the previous kernel (pdl_prefetch_entry): ask L2 for this block's weight
// rows (first m tile only; both matrices of a SwiGLU item), so that the weights stream while
// the previous kernel finishes.
template <weight_format F, int RW, int WS, bool G = false>
__device__ __forceinline__ void prefetch_block_weights(const qgemv_params& p, unsigned bx, unsigned by) {
  if (by != 0) return;
  const bool glu = G && RW % 2 == 0 && p.glu_up.data != nullptr;
  const int ro = glu ? RW / 2 : RW;
  const char* b;
  size_t n;
  block_weight_span<F, WS>(p.w, bx, ro, &b, &n);
  prefetch_span(b, n, p.bulk_prefetch);
  if (glu) {
    block_weight_span<F, WS>(p.glu_up, bx, ro, &b, &n);
    prefetch_span(b, n, p.bulk_prefetch);
  }
}

template <weight_format F, int V, int MT, int RW, int WS>
__global__ void __launch_bounds__(k_warps * 32) qgemv_kernel(qgemv_params p) {
  pdl_prefetch_entry([&] { prefetch_block_weights<F, RW, WS>(p, blockIdx.x, blockIdx.y); });
  qgemv_body<F, V, MT, RW, WS>(p, blockIdx.x, blockIdx.y);
}

// Several independent projections in one launch: block x of item i is blockIdx.x − start[i];
// in the MIX form, blocks from start[n] on (mix_rows of them, qgemv_grouped_with_mix) reduce an
// mHC site's mixes, one row each (hc_post's partial form at hc = 4, post_reduce_row: the same
// bits at any block size).
struct qgemv_group {
  int n = 0;
  qgemv_params item[k_qgemv_group_max];
  unsigned start[k_qgemv_group_max + 1] = {};
  int mix_rows = 0;
  hc_post_params mix;
};

// MIX: the form with the mix-reduction blocks (only it carries hc_post's code: ~12 KB, which
// the plain forms of the step's hot launches do not pay).
template <weight_format F, int V, int MT, int RW, int WS, bool G, bool MIX = false>
__global__ void __launch_bounds__(k_warps * 32) qgemv_group_kernel(qgemv_group g) {
  int i = 0;
  while (i + 1 < g.n && blockIdx.x >= g.start[i + 1]) ++i;
  pdl_prefetch_entry([&] {
    if (!MIX || blockIdx.x < g.start[g.n])
      prefetch_block_weights<F, RW, WS, G>(g.item[i], blockIdx.x - g.start[i], blockIdx.y);
  });
  if constexpr (MIX) {
    if (blockIdx.x >= g.start[g.n]) {  // the mHC site's mix reduction (after the wait: the site's partials)
      constexpr int hc = 4, nv = (2 + hc) * hc + 2;
      __shared__ float sm[reduce_smem_floats(nv)];
      if (blockIdx.y == 0) post_reduce_row<hc>(g.mix, (int)(blockIdx.x - g.start[g.n]), sm);
      return;
    }
  }
  if (blockIdx.y * MT >= (unsigned)g.item[i].m) return;
  qgemv_body<F, V, MT, RW, WS, G>(g.item[i], blockIdx.x - g.start[i], blockIdx.y);
}

// The activation of an x_glu item (qgemv_expert_params::x_glu) into the block's shared memory:
// swiglu_value of the gate and up halves of x (cols each), the same bits as swiglu_rows. The
// block's weight rows are asked into L2 first, so their stream starts before the activation is
// ready (the routed expert is known only after the wait).
template <weight_format F, int RW, int WS>
__device__ __forceinline__ void glu_row_to_shared(qgemv_params& q, unsigned bx, float limit, float weight,
                                                  float* s_act) {
  const char* b;
  size_t nb;
  block_weight_span<F, WS>(q.w, bx, RW, &b, &nb);
  l2_prefetch(b, nb);
  const int n4 = (int)(q.w.cols / 4);
  const float4* g4 = reinterpret_cast<const float4*>(q.x);
  const float4* u4 = reinterpret_cast<const float4*>(q.x + q.w.cols);
  float4* s4 = reinterpret_cast<float4*>(s_act);
  struct gate_up {
    float4 g, u;
  };
  strided_batched<2, gate_up>(
      n4, [&](int c) { return gate_up{__ldg(g4 + c), __ldg(u4 + c)}; },
      [&](int c, const gate_up& v) {
        s4[c] = make_float4(swiglu_value(v.g.x, v.u.x, limit, weight), swiglu_value(v.g.y, v.u.y, limit, weight),
                            swiglu_value(v.g.z, v.u.z, limit, weight), swiglu_value(v.g.w, v.u.w, limit, weight));
      });
  __syncthreads();
  q.x = s_act;
  q.ldx = (int)q.w.cols;
}

// Routed experts: grid (blocks of wa's rows + blocks of wb's rows, items) — or, SwiGLU items
// (p.glu), blocks of wa's rows each reading both matrices; the block reads its item's expert
// view from the device array and runs qgemv_body at m = 1. One qgemv_body for every item: a
// fixed item only sets up its parameters (two inlined bodies made the kernel 32 KB of code).
// XG: x_glu items (the activation computed into dynamic shared memory, cols floats).
template <weight_format F, int V, int RW, int WS, bool G, bool XG = false>
__global__ void __launch_bounds__(k_warps * 32) qgemv_expert_kernel(qgemv_expert_params p, unsigned blocks_a) {
  pdl_entry();
  const int i = (int)blockIdx.y;
  const bool glu = G && p.glu;
  const bool second = !glu && blockIdx.x >= blocks_a;
  constexpr bool kFixed = !G;  // (a SwiGLU launch has no fixed items: qgemv_expert refuses them)
  __shared__ float s_weight;  // glu with route: the item's routing weight
  qgemv_params q;
  unsigned bx = blockIdx.x;
  if (kFixed && i >= p.n) {  // a fixed item: matrix fixed_a, its own x and y rows
    q.w = p.fixed_a;
    q.m = 1;
    q.x = p.fixed_x + (int64_t)(i - p.n) * p.fixed_ldx;
    q.ldx = p.fixed_ldx;
    q.y = p.fixed_y + (int64_t)(i - p.n) * p.fixed_ldy;
    q.ldy = p.fixed_ldy;
    q.accumulate = false;
    q.evict_first = p.evict_first;
  } else {
    int e;
    if (p.route) {  // this row's routing, by warp 0 (moe_route's ids); the row's first block writes it
      __shared__ int32_t s_sel[k_route_max_k];
      const int r = i / p.x_div;
      if (threadIdx.x < 32) route_row_warp(p.rp, r, (int)threadIdx.x, s_sel);
      __syncthreads();
      e = s_sel[i - r * p.x_div];
      const float* lr = p.rp.logits + (size_t)r * p.rp.E;
      if (blockIdx.x == 0 && i == r * p.x_div && threadIdx.x == 0) {
        for (int k = 0; k < p.rp.K; ++k) p.rp.sel[(size_t)r * p.rp.K + k] = s_sel[k];
        route_weights(p.rp, r, lr, s_sel);
      }
      if (glu) {
        if (threadIdx.x == 0) s_weight = route_weight(p.rp, lr, s_sel, i - r * p.x_div);
        __syncthreads();
      }
    } else {
      e = __ldg(p.sel + i);
    }
    q.w = second ? p.wb[e] : p.wa[e];
    if (glu) {
      q.glu_up = p.wb[e];
      q.glu_limit = p.glu_limit;
      q.glu_scale = p.route ? &s_weight : p.glu_scale ? p.glu_scale + i : nullptr;
    }
    q.m = 1;
    q.x = p.x + (int64_t)(i / p.x_div) * p.ldx;
    q.ldx = p.ldx;
    q.y = p.y + (int64_t)i * p.ldy + (second ? p.like_a.rows : 0);
    q.ldy = p.ldy;
    q.accumulate = false;
    q.evict_first = p.evict_first;
    q.x_norm_w = p.x_norm_w;
    q.x_norm_eps = p.x_norm_eps;
    q.x_norm_inv = p.x_norm_inv ? p.x_norm_inv + i / p.x_div : nullptr;
    if (second) bx = blockIdx.x - blocks_a;
  }
  if constexpr (XG) {
    extern __shared__ __align__(16) float s_act[];
    const float weight = i < p.n && p.x_glu_scale ? __ldg(p.x_glu_scale + i) : 1.0f;  // fixed items: 1
    glu_row_to_shared<F, RW, WS>(q, bx, p.x_glu_limit, weight, s_act);
  }
  qgemv_body<F, V, 1, RW, WS, G, XG>(q, bx, 0);
}

int g_sms = 0;  // multiprocessors of the current device (read once)

status read_sms() {
  if (g_sms) return {};
  int dev = 0;
  CEDAR_CUDA_TRY(cudaGetDevice(&dev), "qgemv: device");
  CEDAR_CUDA_TRY(cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, dev), "qgemv: device attribute");
  return {};
}

// Row groups of an item: RW rows each, RW / 2 of each matrix for a SwiGLU item.
template <int RW>
int64_t row_groups(const qgemv_params& p) {
  const int ro = p.glu_up.data && RW > 1 ? RW / 2 : RW;
  return (p.w.rows + ro - 1) / ro;
}

// 0 evict-normal loads, per-line prefetches; 1 evict-first loads, bulk prefetches; 2 evict-first
// loads, per-line prefetches (CEDAR_CUDA_WEIGHTS_EVICT_FIRST, read once; another value: a
// warning naming it, 1)
std::atomic<int>& evict_flag() {
  static std::atomic<int> flag{env_choice("CEDAR_CUDA_WEIGHTS_EVICT_FIRST", 0, 2, 1)};
  return flag;
}

template <weight_format F, int V, int RW, int WS>
status launch_ws(const qgemv_params& p_in, cudaStream_t s) {
  qgemv_params p = p_in;
  p.evict_first = weights_evict_first();
  p.bulk_prefetch = weights_evict_mode() == 1;
  const int64_t groups = row_groups<RW>(p);
  constexpr int gpb = k_warps / WS;  // row groups per block
  const int mt = p.m >= 8 ? 8 : p.m >= 4 ? 4 : p.m >= 2 ? 2 : 1;
  const dim3 grid((unsigned)((groups + gpb - 1) / gpb), (unsigned)((p.m + mt - 1) / mt));
  switch (mt) {
    case 1: launch_kernel(qgemv_kernel<F, V, 1, RW, WS>, grid, k_warps * 32, 0, s, p); break;
    case 2: launch_kernel(qgemv_kernel<F, V, 2, RW, WS>, grid, k_warps * 32, 0, s, p); break;
    case 4: launch_kernel(qgemv_kernel<F, V, 4, RW, WS>, grid, k_warps * 32, 0, s, p); break;
    default: launch_kernel(qgemv_kernel<F, V, 8, RW, WS>, grid, k_warps * 32, 0, s, p); break;
  }
  CEDAR_CUDA_LAUNCHED("qgemv");
  return {};
}

// Warps per row group: split the columns 4 ways when one warp per group would leave fewer
// than ~8 warps per multiprocessor (and the row is long enough to split).
template <weight_format F, int V, int RW>
status launch_rw(const qgemv_params& p, cudaStream_t s) {
  if (auto st = read_sms(); !st.ok()) return st;
  const int64_t groups = row_groups<RW>(p);
  if (groups < (int64_t)g_sms * 8 && p.w.cols >= (int64_t)32 * V * 4) return launch_ws<F, V, RW, 4>(p, s);
  return launch_ws<F, V, RW, 1>(p, s);
}

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }

}  // namespace

namespace {

status check_params(const qgemv_params& p) {
  const qmatrix& w = p.w;
  auto bad = [](const std::string& what) { return make_error(errc::invalid_argument, "qgemv: " + what); };
  if (p.m <= 0) return bad("m must be positive (got " + std::to_string(p.m) + ")");
  if (w.rows <= 0 || w.cols <= 0 || !w.data) return bad("empty weight matrix");
  if (w.cols % 8 != 0) return bad("cols must be a multiple of 8 (got " + std::to_string(w.cols) + ")");
  if (!p.x || !p.y) return bad("null x or y");
  if (p.ldx < w.cols || p.ldx % 4 != 0 || !aligned16(p.x))
    return bad("x must be 16-byte aligned with ldx >= cols and ldx % 4 == 0 (ldx " + std::to_string(p.ldx) + ")");
  if (p.ldy < w.rows) return bad("ldy < rows");
  if (p.x_norm_w && !aligned16(p.x_norm_w)) return bad("x_norm_w must be 16-byte aligned");
  const bool scaled = w.format == weight_format::f8_e4m3 || w.format == weight_format::fp4_e2m1;
  if (scaled && !w.scale_e8m0 && !w.scale_f32)
    return bad(std::string(w.format == weight_format::f8_e4m3 ? "f8_e4m3" : "fp4_e2m1") + " weight without scales");
  if (scaled && (w.scale_block_rows <= 0 || w.scale_cols < (w.cols + 31) / 32)) return bad("bad scale layout");
  if ((w.format == weight_format::f32 || w.format == weight_format::bf16) && !aligned16(w.data))
    return bad("weight data must be 16-byte aligned");
  if (w.format != weight_format::f32 && w.format != weight_format::bf16 && !scaled) return bad("unknown weight format");
  if (p.glu_up.data) {
    const qmatrix& u = p.glu_up;
    if (w.format == weight_format::f32) return bad("a SwiGLU item (glu_up) needs bf16, f8_e4m3 or fp4_e2m1 weights, not f32");
    if (u.format != w.format || u.rows != w.rows || u.cols != w.cols || u.scale_block_rows != w.scale_block_rows ||
        u.scale_cols != w.scale_cols || (scaled && !u.scale_e8m0 != !w.scale_e8m0))
      return bad("glu_up differs from the gate matrix in format, shape or scale layout");
    if (w.format == weight_format::bf16 && !aligned16(u.data)) return bad("glu_up data must be 16-byte aligned");
    if (p.accumulate) return bad("a SwiGLU item cannot accumulate");
  }
  return {};
}

// Launch classes: one kernel instantiation (format, weights per load V, rows per group RW).
// fp8 / fp4: 16 / 32 weights per row and load, two rows per group (one row per group measured
// slower at m = 8 on the H200: 5.7% against 9.4% of the copy bandwidth for fp8).
enum class launch_class { f32, bf16, f8_v16, f8_v8, fp4 };
launch_class class_of(const qmatrix& w) {
  switch (w.format) {
    case weight_format::f32: return launch_class::f32;
    case weight_format::bf16: return launch_class::bf16;
    case weight_format::f8_e4m3: return w.cols % 16 == 0 ? launch_class::f8_v16 : launch_class::f8_v8;
    default: return launch_class::fp4;
  }
}

template <weight_format F, int V, int RW>
status launch_group(const qgemv_params* items, int n, cudaStream_t s, const hc_post_params* mix = nullptr) {
  if (auto st = read_sms(); !st.ok()) return st;
  int64_t groups = 0, min_cols = INT64_MAX;
  for (int i = 0; i < n; ++i) {
    groups += row_groups<RW>(items[i]);
    min_cols = std::min<int64_t>(min_cols, items[i].w.cols);
  }
  const bool split = groups < (int64_t)g_sms * 8 && min_cols >= (int64_t)32 * V * 4;
  const int gpb = split ? k_warps / 4 : k_warps;
  qgemv_group g;
  g.n = n;
  unsigned blocks = 0;
  const bool ef = weights_evict_first(), bulk = weights_evict_mode() == 1;
  for (int i = 0; i < n; ++i) {
    g.item[i] = items[i];
    g.item[i].evict_first = ef;
    g.item[i].bulk_prefetch = bulk;
    g.start[i] = blocks;
    blocks += (unsigned)((row_groups<RW>(items[i]) + gpb - 1) / gpb);
  }
  g.start[n] = blocks;
  const int m = items[0].m;
  const int mt = m >= 8 ? 8 : m >= 4 ? 4 : m >= 2 ? 2 : 1;
  bool glu = false;  // a SwiGLU item: the instantiation with that form (never f32: check_params)
  for (int i = 0; i < n; ++i) glu |= items[i].glu_up.data != nullptr;
  constexpr bool can_glu = RW % 2 == 0;
  // the mix reduction rides only on the form compiled for it (one activation tile, no SwiGLU
  // item: the decode step's case); any other launch has hc_post run first, in its own launch
  if (mix && (mt != 1 || (can_glu && glu))) {
    CEDAR_TRY(hc_post(*mix, s));
    mix = nullptr;
  }
  if (mix) g.mix = *mix, g.mix_rows = mix->R, blocks += (unsigned)mix->R;
  const dim3 grid(blocks, (unsigned)((m + mt - 1) / mt));
  if (mix) {
    if (split) launch_kernel(qgemv_group_kernel<F, V, 1, RW, 4, false, true>, grid, k_warps * 32, 0, s, g);
    else launch_kernel(qgemv_group_kernel<F, V, 1, RW, 1, false, true>, grid, k_warps * 32, 0, s, g);
    CEDAR_CUDA_LAUNCHED("qgemv (grouped, with the mix reduction)");
    return {};
  }
#define CEDAR_QGEMV_GROUP(MT)                                                                                   \
  (can_glu && glu                                                                                              \
       ? (split ? launch_kernel(qgemv_group_kernel<F, V, MT, RW, 4, can_glu>, grid, k_warps * 32, 0, s, g)       \
                : launch_kernel(qgemv_group_kernel<F, V, MT, RW, 1, can_glu>, grid, k_warps * 32, 0, s, g))      \
       : (split ? launch_kernel(qgemv_group_kernel<F, V, MT, RW, 4, false>, grid, k_warps * 32, 0, s, g)         \
                : launch_kernel(qgemv_group_kernel<F, V, MT, RW, 1, false>, grid, k_warps * 32, 0, s, g)))
  switch (mt) {
    case 1: CEDAR_QGEMV_GROUP(1); break;
    case 2: CEDAR_QGEMV_GROUP(2); break;
    case 4: CEDAR_QGEMV_GROUP(4); break;
    default: CEDAR_QGEMV_GROUP(8); break;
  }
#undef CEDAR_QGEMV_GROUP
  CEDAR_CUDA_LAUNCHED("qgemv (grouped)");
  return {};
}

status launch_class_group(launch_class c, const qgemv_params* items, int n, cudaStream_t s,
                          const hc_post_params* mix = nullptr) {
  switch (c) {
    case launch_class::f32: return launch_group<weight_format::f32, 8, 1>(items, n, s, mix);
    case launch_class::bf16: return launch_group<weight_format::bf16, 8, 2>(items, n, s, mix);
    case launch_class::f8_v16: return launch_group<weight_format::f8_e4m3, 16, 2>(items, n, s, mix);
    case launch_class::f8_v8: return launch_group<weight_format::f8_e4m3, 8, 4>(items, n, s, mix);
    default: return launch_group<weight_format::fp4_e2m1, 32, 2>(items, n, s, mix);
  }
}

}  // namespace

namespace {

template <weight_format F, int V, int RW>
status launch_expert(const qgemv_expert_params& p_in, cudaStream_t s) {
  qgemv_expert_params p = p_in;
  p.evict_first = weights_evict_first();
  if (auto st = read_sms(); !st.ok()) return st;
  constexpr int64_t half = RW > 1 ? RW / 2 : 1;  // SwiGLU: RW / 2 rows of each matrix (never f32, RW 1)
  const int64_t ga = p.glu ? (p.like_a.rows + half - 1) / half : (p.like_a.rows + RW - 1) / RW;
  const int64_t gb = p.wb && !p.glu ? (p.like_b.rows + RW - 1) / RW : 0;
  const bool split = (ga + gb) * (p.n + p.n_fixed) < (int64_t)g_sms * 8 && p.like_a.cols >= (int64_t)32 * V * 4;
  const int gpb = split ? k_warps / 4 : k_warps;
  const unsigned ba = (unsigned)((ga + gpb - 1) / gpb), bb = (unsigned)((gb + gpb - 1) / gpb);
  const dim3 grid(ba + bb, (unsigned)(p.n + p.n_fixed));
  constexpr bool can_glu = RW % 2 == 0;  // (f32 has no SwiGLU form: qgemv_expert refuses it)
  if (p.x_glu) {  // (never with glu or wb: qgemv_expert refuses them)
    const size_t smem = sizeof(float) * (size_t)p.like_a.cols;
    if (split) launch_kernel(qgemv_expert_kernel<F, V, RW, 4, false, true>, grid, k_warps * 32, smem, s, p, ba);
    else launch_kernel(qgemv_expert_kernel<F, V, RW, 1, false, true>, grid, k_warps * 32, smem, s, p, ba);
  } else if (can_glu && p.glu) {
    if (split) launch_kernel(qgemv_expert_kernel<F, V, RW, 4, can_glu>, grid, k_warps * 32, 0, s, p, ba);
    else launch_kernel(qgemv_expert_kernel<F, V, RW, 1, can_glu>, grid, k_warps * 32, 0, s, p, ba);
  } else {
    if (split) launch_kernel(qgemv_expert_kernel<F, V, RW, 4, false>, grid, k_warps * 32, 0, s, p, ba);
    else launch_kernel(qgemv_expert_kernel<F, V, RW, 1, false>, grid, k_warps * 32, 0, s, p, ba);
  }
  CEDAR_CUDA_LAUNCHED("qgemv (experts)");
  return {};
}

}  // namespace

int weights_evict_mode() { return evict_flag().load(std::memory_order_relaxed); }
void set_weights_evict_mode(int mode) { evict_flag().store(mode >= 0 && mode <= 2 ? mode : 1, std::memory_order_relaxed); }

bool same_layout(const qmatrix& a, const qmatrix& b) {
  return a.format == b.format && a.rows == b.rows && a.cols == b.cols && a.scale_block_rows == b.scale_block_rows &&
         a.scale_cols == b.scale_cols && !a.scale_e8m0 == !b.scale_e8m0 && !a.scale_f32 == !b.scale_f32;
}

status qgemv_expert(const qgemv_expert_params& p, cudaStream_t stream) {
  auto bad = [](const std::string& what) { return make_error(errc::invalid_argument, "qgemv_expert: " + what); };
  if (p.n < 0 || p.x_div <= 0 || p.n_fixed < 0) return bad("n and n_fixed must be >= 0 and x_div > 0");
  if (p.n == 0 && p.n_fixed == 0) return {};
  if (!p.wa || !p.sel || !p.x || !p.y) return bad("null expert array, ids, x or y");
  qgemv_params probe;  // the shape checks of qgemv, on the host copy of one expert
  probe.w = p.like_a, probe.m = 1, probe.x = p.x, probe.ldx = p.ldx, probe.y = p.y, probe.x_norm_w = p.x_norm_w;
  probe.ldy = (int)(p.like_a.rows + (p.wb && !p.glu ? p.like_b.rows : 0));
  if (p.ldy < probe.ldy) return bad("ldy " + std::to_string(p.ldy) + " < the rows of both matrices " + std::to_string(probe.ldy));
  if (auto st = check_params(probe); !st.ok()) return bad(st.err().message);
  if (p.wb && (p.like_b.format != p.like_a.format || p.like_b.cols != p.like_a.cols))
    return bad("the second matrix differs from the first in format or columns");
  if (p.glu) {
    if (!p.wb) return bad("a SwiGLU launch (glu) needs the up matrices (wb)");
    probe.glu_up = p.like_b, probe.ldy = (int)p.like_a.rows;
    if (auto st = check_params(probe); !st.ok()) return bad(st.err().message);
  }
  if (p.x_glu) {  // the activation on load: x rows of [gate | up], into shared memory
    if (p.wb || p.route || p.glu || p.x_norm_w)
      return bad("x_glu (the activation on load) only in a launch without wb, route, glu or x_norm_w");
    if (p.ldx < 2 * p.like_a.cols || (p.n_fixed > 0 && p.fixed_ldx < 2 * p.like_a.cols))
      return bad("x_glu needs x rows of [gate | up]: ldx " + std::to_string(p.ldx) + " < 2 x cols " +
                 std::to_string(2 * p.like_a.cols));
    if (p.like_a.cols > k_x_glu_max_cols)
      return bad("x_glu: " + std::to_string(p.like_a.cols) + " columns exceed " + std::to_string(k_x_glu_max_cols) +
                 " (the activation row must fit the block's shared memory)");
  }
  if (p.n_fixed > 0) {  // the fixed items: the plain form, a matrix like the experts'
    if (p.wb || p.route || p.glu || p.x_norm_w)
      return bad("fixed items (n_fixed) only in a launch without wb, route, glu or x_norm_w");
    if (!same_layout(p.fixed_a, p.like_a))
      return bad("fixed_a differs from the experts' matrices in format, shape or scale layout");
    qgemv_params fp;
    fp.w = p.fixed_a, fp.m = 1, fp.x = p.fixed_x, fp.ldx = p.fixed_ldx, fp.y = p.fixed_y, fp.ldy = p.fixed_ldy;
    if (auto st = check_params(fp); !st.ok()) return bad("fixed items: " + st.err().message);
  }
  switch (class_of(p.like_a)) {
    case launch_class::f32: return launch_expert<weight_format::f32, 8, 1>(p, stream);
    case launch_class::bf16: return launch_expert<weight_format::bf16, 8, 2>(p, stream);
    case launch_class::f8_v16: return launch_expert<weight_format::f8_e4m3, 16, 2>(p, stream);
    case launch_class::f8_v8: return launch_expert<weight_format::f8_e4m3, 8, 4>(p, stream);
    default: return launch_expert<weight_format::fp4_e2m1, 32, 2>(p, stream);
  }
}

status qgemv(const qgemv_params& p, cudaStream_t stream) {
  if (auto st = check_params(p); !st.ok()) return st;
  if (qgemv_mma_applies(p)) return qgemv_mma(&p, 1, stream);
  if (p.glu_up.data) return launch_class_group(class_of(p.w), &p, 1, stream);  // the SwiGLU form
  switch (class_of(p.w)) {
    case launch_class::f32: return launch_rw<weight_format::f32, 8, 1>(p, stream);
    case launch_class::bf16: return launch_rw<weight_format::bf16, 8, 2>(p, stream);
    case launch_class::f8_v16: return launch_rw<weight_format::f8_e4m3, 16, 2>(p, stream);
    case launch_class::f8_v8: return launch_rw<weight_format::f8_e4m3, 8, 4>(p, stream);
    default: return launch_rw<weight_format::fp4_e2m1, 32, 2>(p, stream);
  }
}

namespace {
status grouped(const qgemv_params* items, int n, const hc_post_params* mix, cudaStream_t stream) {
  if (n < 0 || (n > 0 && !items)) return make_error(errc::invalid_argument, "qgemv_grouped: bad item list");
  for (int i = 0; i < n; ++i) {
    if (auto st = check_params(items[i]); !st.ok())
      return make_error(errc::invalid_argument, "qgemv_grouped: item " + std::to_string(i) + ": " + st.err().message);
    if (items[i].m != items[0].m)
      return make_error(errc::invalid_argument, "qgemv_grouped: item " + std::to_string(i) + " has m " +
                                                    std::to_string(items[i].m) + ", item 0 has " + std::to_string(items[0].m));
  }
  // one launch per class, in chunks of k_qgemv_group_max, items in their given order; the bf16
  // class goes to the tensor-core kernel when m > k_qgemv_m_tile (one m: all its items or none),
  // its SwiGLU items then in a vector launch of their own (pass 1)
  // the mixes' reduction rides on the first launch when it is a vector-path one, else runs
  // first in a launch of its own (the same results)
  auto launch = [stream, &mix](int c, const qgemv_params* chunk, int k) -> status {
    const bool mma = c == (int)launch_class::bf16 && qgemv_mma_applies(chunk[0]);
    const hc_post_params* m = mix;
    mix = nullptr;
    if (m && mma) {
      CEDAR_TRY(hc_post(*m, stream));
      m = nullptr;
    }
    if (mma) return qgemv_mma(chunk, k, stream);
    return launch_class_group((launch_class)c, chunk, k, stream, m);
  };
  if (n == 0) return mix ? hc_post(*mix, stream) : status{};
  qgemv_params plain = items[0];
  plain.glu_up = qmatrix{};
  plain.w.format = weight_format::bf16;
  const bool mma_m = qgemv_mma_applies(plain);  // bf16 items of this m take the tensor cores
  qgemv_params chunk[k_qgemv_group_max];
  for (int c = 0; c <= (int)launch_class::fp4; ++c)
    for (int pass = 0; pass < (c == (int)launch_class::bf16 && mma_m ? 2 : 1); ++pass) {
      int k = 0;
      for (int i = 0; i < n; ++i) {
        if ((int)class_of(items[i].w) != c) continue;
        if (c == (int)launch_class::bf16 && mma_m && (items[i].glu_up.data != nullptr) != (pass == 1)) continue;
        chunk[k++] = items[i];
        if (k == k_qgemv_group_max) {
          if (auto st = launch(c, chunk, k); !st.ok()) return st;
          k = 0;
        }
      }
      if (k > 0)
        if (auto st = launch(c, chunk, k); !st.ok()) return st;
    }
  return {};
}
}  // namespace

status qgemv_grouped(const qgemv_params* items, int n, cudaStream_t stream) { return grouped(items, n, nullptr, stream); }

status qgemv_grouped_with_mix(const qgemv_params* items, int n, const hc_post_params& mix, cudaStream_t stream) {
  const bool rides = mix.hc == 4 && mix.R > 0 && mix.partial && mix.nblk > 0 && mix.ncols > 0 && mix.base && mix.scale &&
                     mix.pre && mix.post && mix.comb;
  if (!rides) {  // hc_post checks it (and names what is wrong), then the projections
    CEDAR_TRY(hc_post(mix, stream));
    return grouped(items, n, nullptr, stream);
  }
  return grouped(items, n, &mix, stream);
}

namespace {

// One block per row, up to 1024 threads, float4 loads when n % 4 == 0 and the rows are
// 16-byte aligned: at decode sizes (one row of 256..16384) a row takes one or two loads per
// thread instead of a serial chain of dependent ones (the 256-thread scalar form spent ~13 µs
// on an 8192-wide row).
template <bool VEC>
__global__ void __launch_bounds__(1024) rms_norm_kernel(const float* x, const float* weight, float* y, int n,
                                                         float eps) {
  pdl_entry();
  __shared__ float part[32];
  const int64_t row = blockIdx.x;
  const float* xr = x + row * n;
  float ss = 0.0f;
  if constexpr (VEC) {
    const float4* x4 = reinterpret_cast<const float4*>(xr);
    for (int i = threadIdx.x; i < n / 4; i += blockDim.x) {
      const float4 v = x4[i];
      ss = fmaf(v.x, v.x, ss);
      ss = fmaf(v.y, v.y, ss);
      ss = fmaf(v.z, v.z, ss);
      ss = fmaf(v.w, v.w, ss);
    }
  } else {
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss = fmaf(xr[i], xr[i], ss);
  }
  for (int off = 16; off; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.0f;
    for (int off = 16; off; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    if (threadIdx.x == 0) part[0] = v;
  }
  __syncthreads();
  const float inv = rsqrtf(part[0] / (float)n + eps);
  if constexpr (VEC) {
    const float4* x4 = reinterpret_cast<const float4*>(xr);
    const float4* w4 = reinterpret_cast<const float4*>(weight);
    float4* y4 = reinterpret_cast<float4*>(y + row * n);
    for (int i = threadIdx.x; i < n / 4; i += blockDim.x) {
      const float4 v = x4[i], w = w4[i];
      y4[i] = make_float4(v.x * inv * w.x, v.y * inv * w.y, v.z * inv * w.z, v.w * inv * w.w);
    }
  } else {
    for (int i = threadIdx.x; i < n; i += blockDim.x) y[row * n + i] = xr[i] * inv * weight[i];
  }
}

}  // namespace

status rms_norm(const float* x, const float* weight, float* y, int m, int n, float eps, cudaStream_t stream) {
  if (m <= 0 || n <= 0 || !x || !weight || !y)
    return make_error(errc::invalid_argument, "rms_norm: empty shape or null pointer (m " + std::to_string(m) +
                                                  ", n " + std::to_string(n) + ")");
  const bool vec = n % 4 == 0 && aligned16(x) && aligned16(weight) && aligned16(y);
  const int work = vec ? n / 4 : n;
  const int threads = std::min(1024, std::max(32, (work + 31) / 32 * 32));
  if (vec) launch_kernel(rms_norm_kernel<true>, m, threads, 0, stream, x, weight, y, n, eps);
  else launch_kernel(rms_norm_kernel<false>, m, threads, 0, stream, x, weight, y, n, eps);
  CEDAR_CUDA_LAUNCHED("rms_norm");
  return {};
}

}  // namespace cedar::kernels::cuda
