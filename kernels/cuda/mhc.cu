// mhc — see mhc.cuh. hc_post runs a warp per row (hc² ≤ 32: the comb matrix in registers) or a
// thread per row (larger hc); collapse runs one block per row (float4 channels), expand a
// thread per channel over (channel blocks, rows).
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/mhc.cuh"

#include <algorithm>
#include <cstdint>
#include <string>

namespace cedar::kernels::cuda {
namespace {

// Serial form (any hc ≤ k_hc_max): one thread per row, the comb matrix in global memory.
__global__ void hc_post_kernel(hc_post_params p) {
  pdl_entry();
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= p.R) return;
  const int hc = p.hc, mix = (2 + hc) * hc;
  const float* m = p.mixes + (size_t)r * mix;
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

// Warp form (hc² ≤ 32, the official hc = 4): one warp per row, lane j·hc + k holds comb[j][k]
// in a register; row and column sums are read from the other lanes by shuffles and added in
// the serial form's order (k = 0.., j = 0..), so both forms give the same bits. The serial
// form's chain of dependent global loads cost ~56 µs per call at hc = 4, 20 iterations.
constexpr int k_post_warps = 4;

__global__ void __launch_bounds__(32 * k_post_warps) hc_post_warp_kernel(hc_post_params p) {
  pdl_entry();
  const int r = blockIdx.x * k_post_warps + (threadIdx.x >> 5);
  if (r >= p.R) return;
  const int lane = threadIdx.x & 31, hc = p.hc, mix = (2 + hc) * hc;
  const bool own = lane < hc * hc;
  const int j = own ? lane / hc : 0, k = own ? lane - j * hc : 0;
  const float* m = p.mixes + (size_t)r * mix;
  const float eps = p.eps;
  if (lane < hc) {
    p.pre[r * hc + lane] = sigmoid_stable(m[lane] * p.scale[0] + p.base[lane]) + eps;
    p.post[r * hc + lane] = 2.0f * sigmoid_stable(m[hc + lane] * p.scale[1] + p.base[hc + lane]);
  }
  float v = own ? m[2 * hc + lane] * p.scale[2] + p.base[2 * hc + lane] : 0.0f;
  auto row_sum = [&](float x) {  // Σ_k' x[j][k'], in k' order
    float s = 0.0f;
    for (int kk = 0; kk < hc; ++kk) s += __shfl_sync(0xffffffffu, x, j * hc + kk);
    return s;
  };
  auto col_sum = [&](float x) {  // Σ_j' x[j'][k], in j' order
    float s = 0.0f;
    for (int jj = 0; jj < hc; ++jj) s += __shfl_sync(0xffffffffu, x, jj * hc + k);
    return s;
  };
  float mx = -INFINITY;
  for (int kk = 0; kk < hc; ++kk) mx = fmaxf(mx, __shfl_sync(0xffffffffu, v, j * hc + kk));
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

// Block-wide sum (blockDim.x a multiple of 32, ≤ 1024).
__device__ inline float block_sum(float v, float* part) {
  for (int off = 16; off; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    float t = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.0f;
    for (int off = 16; off; off >>= 1) t += __shfl_xor_sync(0xffffffffu, t, off);
    if (threadIdx.x == 0) part[0] = t;
  }
  __syncthreads();
  return part[0];
}

// One block per row; a thread per 4 channels (float4) when d % 4 == 0, else per channel.
template <bool VEC>
__global__ void __launch_bounds__(1024) hc_collapse_norm_kernel(const float* X, const float* pre, const float* w,
                                                                 float* x, int hc, int d, float eps) {
  pdl_entry();
  extern __shared__ float row[];  // [d]
  __shared__ float part[32];
  const int r = blockIdx.x;
  const float* Xr = X + (size_t)r * hc * d;
  float pk[k_hc_max];
  for (int k = 0; k < hc; ++k) pk[k] = pre[r * hc + k];
  float ss = 0.0f;
  if constexpr (VEC) {
    for (int i = threadIdx.x; i < d / 4; i += blockDim.x) {
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      for (int k = 0; k < hc; ++k) {
        const float4 a = reinterpret_cast<const float4*>(Xr + (size_t)k * d)[i];
        v.x += pk[k] * a.x, v.y += pk[k] * a.y, v.z += pk[k] * a.z, v.w += pk[k] * a.w;
      }
      reinterpret_cast<float4*>(row)[i] = v;
      ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
  } else {
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
      float v = 0.0f;
      for (int k = 0; k < hc; ++k) v += pk[k] * Xr[(size_t)k * d + i];
      row[i] = v;
      ss += v * v;
    }
  }
  const float tot = block_sum(ss, part);
  const float inv = 1.0f / sqrtf(tot / (float)d + eps);
  if constexpr (VEC) {
    for (int i = threadIdx.x; i < d / 4; i += blockDim.x) {
      const float4 v = reinterpret_cast<const float4*>(row)[i], g = reinterpret_cast<const float4*>(w)[i];
      reinterpret_cast<float4*>(x + (size_t)r * d)[i] =
          make_float4(g.x * (v.x * inv), g.y * (v.y * inv), g.z * (v.z * inv), g.w * (v.w * inv));
    }
  } else {
    for (int i = threadIdx.x; i < d; i += blockDim.x) x[(size_t)r * d + i] = w[i] * (row[i] * inv);
  }
}

// grid (channel blocks, R): a thread per channel, every stream of the row in registers.
constexpr int k_expand_threads = 256;

__global__ void __launch_bounds__(k_expand_threads) hc_expand_kernel(float* X, const float* y, const float* post,
                                                                      const float* comb, int hc, int d) {
  pdl_entry();
  const int r = blockIdx.y;
  const int i = blockIdx.x * k_expand_threads + threadIdx.x;
  if (i >= d) return;
  float* Xr = X + (size_t)r * hc * d;
  const float* cb = comb + (size_t)r * hc * hc;
  float xj[k_hc_max];
  for (int j = 0; j < hc; ++j) xj[j] = Xr[(size_t)j * d + i];
  const float yi = y[(size_t)r * d + i];
  for (int k = 0; k < hc; ++k) {
    float t = post[r * hc + k] * yi;
    for (int j = 0; j < hc; ++j) t += cb[j * hc + k] * xj[j];
    Xr[(size_t)k * d + i] = t;
  }
}

status check_shape(const char* op, int R, int hc, int d) {
  if (R <= 0 || hc <= 0 || hc > k_hc_max || d <= 0)
    return make_error(errc::invalid_argument, std::string(op) + ": bad shape R " + std::to_string(R) + ", hc " +
                                                  std::to_string(hc) + " (at most " + std::to_string(k_hc_max) +
                                                  "), d " + std::to_string(d));
  return {};
}

}  // namespace

status hc_post(const hc_post_params& p, cudaStream_t stream) {
  CEDAR_TRY(check_shape("hc_post", p.R, p.hc, 1));
  if (!p.mixes || !p.base || !p.scale || !p.pre || !p.post || !p.comb)
    return make_error(errc::invalid_argument, "hc_post: null pointer");
  if (p.hc * p.hc <= 32)
    launch_kernel(hc_post_warp_kernel, (p.R + k_post_warps - 1) / k_post_warps, 32 * k_post_warps, 0, stream, p);
  else
    launch_kernel(hc_post_kernel, (p.R + 63) / 64, 64, 0, stream, p);
  CEDAR_CUDA_LAUNCHED("hc_post");
  return {};
}

status hc_collapse_norm(const float* X, const float* pre, const float* w, float* x, int R, int hc, int d,
                        float eps, cudaStream_t stream) {
  CEDAR_TRY(check_shape("hc_collapse_norm", R, hc, d));
  if (!X || !pre || !w || !x) return make_error(errc::invalid_argument, "hc_collapse_norm: null pointer");
  const bool vec = d % 4 == 0 && ((reinterpret_cast<uintptr_t>(X) | reinterpret_cast<uintptr_t>(w) |
                                    reinterpret_cast<uintptr_t>(x)) & 15u) == 0;
  const int work = vec ? d / 4 : d;
  const int threads = std::min(1024, std::max(32, (work + 31) / 32 * 32));
  if (vec) launch_kernel(hc_collapse_norm_kernel<true>, R, threads, sizeof(float) * (size_t)d, stream, X, pre, w, x, hc, d, eps);
  else launch_kernel(hc_collapse_norm_kernel<false>, R, threads, sizeof(float) * (size_t)d, stream, X, pre, w, x, hc, d, eps);
  CEDAR_CUDA_LAUNCHED("hc_collapse_norm");
  return {};
}

status hc_expand(float* X, const float* y, const float* post, const float* comb, int R, int hc, int d,
                 cudaStream_t stream) {
  CEDAR_TRY(check_shape("hc_expand", R, hc, d));
  if (!X || !y || !post || !comb) return make_error(errc::invalid_argument, "hc_expand: null pointer");
  const dim3 grid((unsigned)((d + k_expand_threads - 1) / k_expand_threads), (unsigned)R);
  launch_kernel(hc_expand_kernel, grid, k_expand_threads, 0, stream, X, y, post, comb, hc, d);
  CEDAR_CUDA_LAUNCHED("hc_expand");
  return {};
}

}  // namespace cedar::kernels::cuda
