// mhc — see mhc.cuh. hc_post runs one thread per row (hc² ≤ 256 values, a few dozen
// Sinkhorn sweeps: negligible next to the projections); collapse and expand run one block per
// row with a thread per channel.
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/mhc.cuh"

#include <string>

namespace cedar::kernels::cuda {
namespace {

__global__ void hc_post_kernel(hc_post_params p) {
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

__global__ void hc_collapse_norm_kernel(const float* X, const float* pre, const float* w, float* x, int hc,
                                        int d, float eps) {
  extern __shared__ float row[];  // [d]
  __shared__ float part[32];
  const int r = blockIdx.x;
  const float* Xr = X + (size_t)r * hc * d;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    float v = 0.0f;
    for (int k = 0; k < hc; ++k) v += pre[r * hc + k] * Xr[(size_t)k * d + i];
    row[i] = v;
    ss += v * v;
  }
  const float tot = block_sum(ss, part);
  const float inv = 1.0f / sqrtf(tot / (float)d + eps);
  for (int i = threadIdx.x; i < d; i += blockDim.x) x[(size_t)r * d + i] = w[i] * (row[i] * inv);
}

__global__ void hc_expand_kernel(float* X, const float* y, const float* post, const float* comb, int hc, int d) {
  const int r = blockIdx.x;
  float* Xr = X + (size_t)r * hc * d;
  const float* cb = comb + (size_t)r * hc * hc;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    float xj[k_hc_max];
    for (int j = 0; j < hc; ++j) xj[j] = Xr[(size_t)j * d + i];
    const float yi = y[(size_t)r * d + i];
    for (int k = 0; k < hc; ++k) {
      float t = post[r * hc + k] * yi;
      for (int j = 0; j < hc; ++j) t += cb[j * hc + k] * xj[j];
      Xr[(size_t)k * d + i] = t;
    }
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
  hc_post_kernel<<<(p.R + 63) / 64, 64, 0, stream>>>(p);
  CEDAR_CUDA_LAUNCHED("hc_post");
  return {};
}

status hc_collapse_norm(const float* X, const float* pre, const float* w, float* x, int R, int hc, int d,
                        float eps, cudaStream_t stream) {
  CEDAR_TRY(check_shape("hc_collapse_norm", R, hc, d));
  if (!X || !pre || !w || !x) return make_error(errc::invalid_argument, "hc_collapse_norm: null pointer");
  hc_collapse_norm_kernel<<<R, 256, sizeof(float) * (size_t)d, stream>>>(X, pre, w, x, hc, d, eps);
  CEDAR_CUDA_LAUNCHED("hc_collapse_norm");
  return {};
}

status hc_expand(float* X, const float* y, const float* post, const float* comb, int R, int hc, int d,
                 cudaStream_t stream) {
  CEDAR_TRY(check_shape("hc_expand", R, hc, d));
  if (!X || !y || !post || !comb) return make_error(errc::invalid_argument, "hc_expand: null pointer");
  hc_expand_kernel<<<R, 256, 0, stream>>>(X, y, post, comb, hc, d);
  CEDAR_CUDA_LAUNCHED("hc_expand");
  return {};
}

}  // namespace cedar::kernels::cuda
