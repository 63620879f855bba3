// mhc_device — the device code of hc_post shared by its own kernels (mhc.cu) and by the
// grouped projections that run an mHC site's mix reduction in extra blocks of their launch
// (qgemv.cu, qgemv_group's side job): the warp and serial forms of the mix weights, and the
// reduction of hc_mix_collapse's partials. Device code only (include from .cu files).
#pragma once

#include <cstdint>

#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/mhc.cuh"

namespace cedar::kernels::cuda {

// The mix weights of row r from its mixes m [(2 + hc)·hc] — serial form (any hc ≤ k_hc_max):
// one thread, the comb matrix in global memory.
__device__ inline void post_serial(const hc_post_params& p, int r, const float* m) {
  const int hc = p.hc;
  const float eps = p.eps;
  for (int k = 0; k < hc; ++k) {
    p.pre[r * hc + k] = sigmoid_stable(m[k] * p.scale[0] + p.base[k]) + eps;
    p.post[r * hc + k] = 2.0f * sigmoid_stable(m[hc + k] * p.scale[1] + p.base[hc + k]);
  }
  float* cb = p.comb + (size_t)r * hc * hc;
  for (int j = 0; j < hc; ++j) {
    float* row = cb + j * hc;
    float mx = -INFINITY;
    for (int k = 0; k < hc; ++k) {
      row[k] = m[2 * hc + j * hc + k] * p.scale[2] + p.base[2 * hc + j * hc + k];
      mx = fmaxf(mx, row[k]);
    }
    float s = 0.0f;
    for (int k = 0; k < hc; ++k) {
      row[k] = expf(row[k] - mx);
      s += row[k];
    }
    const float inv = 1.0f / s;
    for (int k = 0; k < hc; ++k) row[k] = row[k] * inv + eps;
  }
  auto col_norm = [&] {
    for (int k = 0; k < hc; ++k) {
      float s = 0.0f;
      for (int j = 0; j < hc; ++j) s += cb[j * hc + k];
      for (int j = 0; j < hc; ++j) cb[j * hc + k] /= (s + eps);
    }
  };
  col_norm();
  for (int it = 0; it < p.sinkhorn_iters - 1; ++it) {
    for (int j = 0; j < hc; ++j) {
      float s = 0.0f;
      for (int k = 0; k < hc; ++k) s += cb[j * hc + k];
      for (int k = 0; k < hc; ++k) cb[j * hc + k] /= (s + eps);
    }
    col_norm();
  }
}

// Warp form (hc² ≤ 32, the official hc = 4): one warp, lane j·hc + k holds comb[j][k] in a
// register; row and column sums are read from the other lanes by shuffles and added in the
// serial form's order (k = 0.., j = 0..), so both forms give the same bits. (The serial form's
// chain of dependent global loads cost ~56 µs per call at hc = 4, 20 iterations.)
// HC > 0: hc known at compile time (the sums unrolled); HC = 0: any hc with hc² ≤ 32.
template <int HC>
__device__ inline void post_warp(const hc_post_params& p, int r, const float* m, int lane) {
  const int hc = HC > 0 ? HC : p.hc;
  const bool own = lane < hc * hc;
  const int j = own ? lane / hc : 0, k = own ? lane - j * hc : 0;
  const float eps = p.eps;
  if (lane < hc) {
    p.pre[r * hc + lane] = sigmoid_stable(m[lane] * p.scale[0] + p.base[lane]) + eps;
    p.post[r * hc + lane] = 2.0f * sigmoid_stable(m[hc + lane] * p.scale[1] + p.base[hc + lane]);
  }
  float v = own ? m[2 * hc + lane] * p.scale[2] + p.base[2 * hc + lane] : 0.0f;
  auto row_sum = [&](float x) {  // Σ_k' x[j][k'], in k' order
    float s = 0.0f;
#pragma unroll
    for (int kk = 0; kk < (HC > 0 ? HC : hc); ++kk) s += __shfl_sync(0xffffffffu, x, j * hc + kk);
    return s;
  };
  auto col_sum = [&](float x) {  // Σ_j' x[j'][k], in j' order
    float s = 0.0f;
#pragma unroll
    for (int jj = 0; jj < (HC > 0 ? HC : hc); ++jj) s += __shfl_sync(0xffffffffu, x, jj * hc + k);
    return s;
  };
  float mx = -INFINITY;
#pragma unroll
  for (int kk = 0; kk < (HC > 0 ? HC : hc); ++kk) mx = fmaxf(mx, __shfl_sync(0xffffffffu, v, j * hc + kk));
  v = expf(v - mx);
  const float inv = 1.0f / row_sum(v);
  v = v * inv + eps;
  v /= (col_sum(v) + eps);
  for (int it = 0; it < p.sinkhorn_iters - 1; ++it) {
    v /= (row_sum(v) + eps);
    v /= (col_sum(v) + eps);
  }
  if (own) p.comb[(size_t)r * hc * hc + lane] = v;
}

// From hc_mix_collapse's partials [nblk, mix + 2]: the block of row r sums each value over the
// channel blocks (fixed order: part t takes blocks t, t + parts, ..., then the parts in order;
// parts depends only on the mix count, so the separate and the fused form give the same bits),
// scales the mixes by the flat RMSNorm factor of the streams, leaves the collapsed row's
// RMSNorm factor in x_inv, then runs the warp or serial form on the mixes from shared memory.
// `sm` holds reduce_smem_floats(nv) floats; every thread of the block (≥ 32) calls it. The
// partials are read through L2 (__ldcg): in the fused form other blocks wrote them.
constexpr int k_reduce_threads = 256;
constexpr int k_reduce_width = 128;  // parts · nv ≤ this (at least one part)

__host__ __device__ constexpr int reduce_parts(int nv) { return nv >= k_reduce_width ? 1 : k_reduce_width / nv; }
__host__ __device__ constexpr int reduce_smem_floats(int nv) { return (reduce_parts(nv) + 1) * nv; }

template <int HC>
__device__ inline void post_reduce_row(const hc_post_params& p, int r, float* sm) {
  const int hc = HC > 0 ? HC : p.hc, mix = (2 + hc) * hc, nv = mix + 2;
  const int parts = reduce_parts(nv);
  float* tot = sm + (size_t)parts * nv;
  const float* pr = p.partial + (size_t)r * p.nblk * nv;
  for (int t = threadIdx.x; t < parts * nv; t += blockDim.x) {
    const int part = t / nv, v = t - part * nv;
    float s = 0.0f;
#pragma unroll 8
    for (int b = part; b < p.nblk; b += parts) s += __ldcg(pr + (size_t)b * nv + v);
    sm[t] = s;
  }
  __syncthreads();
  for (int v = threadIdx.x; v < nv; v += blockDim.x) {
    float s = 0.0f;
    for (int part = 0; part < parts; ++part) s += sm[part * nv + v];
    tot[v] = s;
  }
  __syncthreads();
  const float inv = rsqrtf(tot[mix] / (float)p.ncols + p.norm_eps);
  for (int v = threadIdx.x; v < mix; v += blockDim.x) tot[v] *= inv;
  if (threadIdx.x == 0 && p.x_inv) p.x_inv[r] = rsqrtf(tot[mix + 1] / (float)p.x_cols + p.x_eps);
  __syncthreads();
  if (hc * hc <= 32) {
    if (threadIdx.x < 32) post_warp<HC>(p, r, tot, threadIdx.x);
  } else if (threadIdx.x == 0) {
    post_serial(p, r, tot);
  }
}

}  // namespace cedar::kernels::cuda
