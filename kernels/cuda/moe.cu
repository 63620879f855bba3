// moe — see moe.cuh. Routing: one thread per row (K passes over E). Expert GEMVs: a warp per
// output row of the item's expert matrix, lanes striding the columns, elements dequantised by
// qmatrix_at (the expert is only known on the device); eight warps per block.
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/moe.cuh"
#include "kernels/cuda/qmatrix_device.cuh"

#include <string>

namespace cedar::kernels::cuda {
namespace {

constexpr int k_warps = 8;

__device__ inline float softplus_torch(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

__global__ void moe_route_kernel(moe_route_params p) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= p.R) return;
  const float* lr = p.logits + (size_t)r * p.E;
  int32_t* sl = p.sel + (size_t)r * p.K;
  for (int k = 0; k < p.K; ++k) {
    int best = -1;
    float bv = 0.0f;
    for (int i = 0; i < p.E; ++i) {
      bool taken = false;
      for (int j = 0; j < k; ++j) taken |= sl[j] == i;
      if (taken) continue;
      const float v = sqrtf(softplus_torch(lr[i])) + p.bias[i];
      if (best < 0 || v > bv) {
        best = i;
        bv = v;
      }
    }
    sl[k] = best;
  }
  float sum = 0.0f;
  for (int k = 0; k < p.K; ++k) sum += sqrtf(softplus_torch(lr[sl[k]]));
  for (int k = 0; k < p.K; ++k) {
    float wk = sqrtf(softplus_torch(lr[sl[k]]));
    if (p.renormalise && p.K > 1) wk = wk / (sum + 1e-20f);
    p.weight[(size_t)r * p.K + k] = wk * p.route_scale;
  }
}

__device__ inline float warp_dot(const qmatrix& w, int64_t row, const float* x, int n) {
  float s = 0.0f;
  for (int c = threadIdx.x & 31; c < n; c += 32) s += qmatrix_at(w, row, c) * x[c];
  for (int off = 16; off; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
  return s;
}

__global__ void moe_up_kernel(const qmatrix* w1, const qmatrix* w3, const int32_t* sel, int K, const float* x, int d,
                              int F, float* h) {
  const int i = blockIdx.x;
  const int j = blockIdx.y * k_warps + (threadIdx.x >> 5);
  if (j >= 2 * F) return;
  const int e = sel[i];
  const qmatrix& w = j < F ? w1[e] : w3[e];
  const float s = warp_dot(w, j < F ? j : j - F, x + (size_t)(i / K) * d, d);
  if ((threadIdx.x & 31) == 0) h[(size_t)i * 2 * F + j] = s;
}

__global__ void moe_down_kernel(const qmatrix* w2, const int32_t* sel, const float* a, int F, int d, float* ye) {
  const int i = blockIdx.x;
  const int j = blockIdx.y * k_warps + (threadIdx.x >> 5);
  if (j >= d) return;
  const float s = warp_dot(w2[sel[i]], j, a + (size_t)i * F, F);
  if ((threadIdx.x & 31) == 0) ye[(size_t)i * d + j] = s;
}

__global__ void swiglu_kernel(const float* h, int F, float limit, const float* row_weight, float* a) {
  const int r = blockIdx.x;
  const float scale = row_weight ? row_weight[r] : 1.0f;
  for (int i = threadIdx.x; i < F; i += blockDim.x) {
    float g = h[(size_t)r * 2 * F + i], u = h[(size_t)r * 2 * F + F + i];
    if (limit > 0.0f) {
      u = fminf(fmaxf(u, -limit), limit);
      g = fminf(g, limit);
    }
    a[(size_t)r * F + i] = g * sigmoid_stable(g) * u * scale;
  }
}

__global__ void moe_combine_kernel(float* y, const float* ye, const int32_t* sel, int K, int d) {
  const int r = blockIdx.x;
  const int32_t* sl = sel + (size_t)r * K;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    float acc = y[(size_t)r * d + i];
    int last = -1;
    for (int n = 0; n < K; ++n) {  // slots in ascending expert id (ids within a row are distinct)
      int best = -1;
      for (int k = 0; k < K; ++k)
        if (sl[k] > last && (best < 0 || sl[k] < sl[best])) best = k;
      acc += ye[((size_t)r * K + best) * d + i];
      last = sl[best];
    }
    y[(size_t)r * d + i] = acc;
  }
}

}  // namespace

status moe_route(const moe_route_params& p, cudaStream_t stream) {
  if (p.R <= 0 || p.E <= 0 || p.K <= 0 || p.K > p.E || !p.logits || !p.bias || !p.sel || !p.weight)
    return make_error(errc::invalid_argument, "moe_route: bad shape (rows " + std::to_string(p.R) + ", experts " +
                                                  std::to_string(p.E) + ", top " + std::to_string(p.K) + ") or null pointer");
  moe_route_kernel<<<(p.R + 63) / 64, 64, 0, stream>>>(p);
  CEDAR_CUDA_LAUNCHED("moe_route");
  return {};
}

status moe_up(const qmatrix* w1, const qmatrix* w3, const int32_t* sel, int R, int K, const float* x, int d, int F,
              float* h, cudaStream_t stream) {
  if (R <= 0 || K <= 0 || d <= 0 || F <= 0 || !w1 || !w3 || !sel || !x || !h)
    return make_error(errc::invalid_argument, "moe_up: bad shape or null pointer");
  moe_up_kernel<<<dim3((unsigned)(R * K), (unsigned)((2 * F + k_warps - 1) / k_warps)), 32 * k_warps, 0, stream>>>(
      w1, w3, sel, K, x, d, F, h);
  CEDAR_CUDA_LAUNCHED("moe_up");
  return {};
}

status swiglu_rows(const float* h, int n, int F, float limit, const float* row_weight, float* a, cudaStream_t stream) {
  if (n <= 0 || F <= 0 || !h || !a) return make_error(errc::invalid_argument, "swiglu_rows: bad shape or null pointer");
  swiglu_kernel<<<n, 128, 0, stream>>>(h, F, limit, row_weight, a);
  CEDAR_CUDA_LAUNCHED("swiglu_rows");
  return {};
}

status moe_down(const qmatrix* w2, const int32_t* sel, int R, int K, const float* a, int F, int d, float* ye,
                cudaStream_t stream) {
  if (R <= 0 || K <= 0 || d <= 0 || F <= 0 || !w2 || !sel || !a || !ye)
    return make_error(errc::invalid_argument, "moe_down: bad shape or null pointer");
  moe_down_kernel<<<dim3((unsigned)(R * K), (unsigned)((d + k_warps - 1) / k_warps)), 32 * k_warps, 0, stream>>>(
      w2, sel, a, F, d, ye);
  CEDAR_CUDA_LAUNCHED("moe_down");
  return {};
}

status moe_combine(float* y, const float* ye, const int32_t* sel, int R, int K, int d, cudaStream_t stream) {
  if (R <= 0 || K <= 0 || d <= 0 || !y || !ye || !sel)
    return make_error(errc::invalid_argument, "moe_combine: bad shape or null pointer");
  moe_combine_kernel<<<R, 256, 0, stream>>>(y, ye, sel, K, d);
  CEDAR_CUDA_LAUNCHED("moe_combine");
  return {};
}

}  // namespace cedar::kernels::cuda
