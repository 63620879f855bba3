// moe — see moe.cuh. Routing: a warp per row (K rounds of a warp argmax; a thread per row past
// 1024 experts). Expert GEMVs: qgemv_expert (the item's expert view read on the device, then
// qgemv's vector-load schedule); swiglu and combine: a thread per element.
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/moe.cuh"
#include "kernels/cuda/moe_device.cuh"
#include "kernels/cuda/qgemv.cuh"

#include <string>

namespace cedar::kernels::cuda {
namespace {


__device__ inline float softplus_torch(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// Row r's weights of its chosen experts sl[0..K): s / Σ s (renormalised, K > 1) × route_scale.
__device__ void route_weights(const moe_route_params& p, int r, const float* lr, const int32_t* sl) {
  float sum = 0.0f;
  for (int k = 0; k < p.K; ++k) sum += sqrtf(softplus_torch(lr[sl[k]]));
  for (int k = 0; k < p.K; ++k) {
    float wk = sqrtf(softplus_torch(lr[sl[k]]));
    if (p.renormalise && p.K > 1) wk = wk / (sum + 1e-20f);
    p.weight[(size_t)r * p.K + k] = wk * p.route_scale;
  }
}

__global__ void moe_route_kernel(moe_route_params p) {
  pdl_entry();
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
  route_weights(p, r, lr, sl);
}

// A warp per row (E ≤ 32 · 32): lane l owns experts l, l + 32, ...; each of the K rounds takes
// the warp's best untaken (score + bias), ties to the lower id — the serial kernel's choice.
constexpr int k_route_warps = 4;

__global__ void __launch_bounds__(32 * k_route_warps) moe_route_warp_kernel(moe_route_params p) {
  pdl_entry();
  const int r = blockIdx.x * k_route_warps + (threadIdx.x >> 5);
  if (r >= p.R) return;
  const int lane = threadIdx.x & 31;
  const float* lr = p.logits + (size_t)r * p.E;
  int32_t* sl = p.sel + (size_t)r * p.K;
  uint32_t taken = 0;  // bit t: expert lane + 32 t
  for (int k = 0; k < p.K; ++k) {
    int best = -1;
    float bv = 0.0f;
    for (int t = 0, i = lane; i < p.E; ++t, i += 32) {
      if (taken >> t & 1u) continue;
      const float v = sqrtf(softplus_torch(lr[i])) + p.bias[i];
      if (best < 0 || v > bv) best = i, bv = v;
    }
    for (int off = 16; off; off >>= 1) {
      const int ob = __shfl_xor_sync(0xffffffffu, best, off);
      const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
      if (ob >= 0 && (best < 0 || ov > bv || (ov == bv && ob < best))) best = ob, bv = ov;
    }
    if ((best & 31) == lane) taken |= 1u << (best >> 5);
    if (lane == 0) sl[k] = best;
  }
  __syncwarp();
  if (lane != 0) return;
  route_weights(p, r, lr, sl);
}

constexpr int k_elem_threads = 256;  // swiglu / combine: grid (element blocks, rows)

__global__ void __launch_bounds__(k_elem_threads) swiglu_kernel(const float* h, int F, float limit,
                                                                 const float* row_weight, float* a) {
  pdl_entry();
  const int r = blockIdx.y;
  const float scale = row_weight ? row_weight[r] : 1.0f;
  {
    const int i = blockIdx.x * k_elem_threads + threadIdx.x;
    if (i >= F) return;
    float g = h[(size_t)r * 2 * F + i], u = h[(size_t)r * 2 * F + F + i];
    if (limit > 0.0f) {
      u = fminf(fmaxf(u, -limit), limit);
      g = fminf(g, limit);
    }
    a[(size_t)r * F + i] = g * sigmoid_stable(g) * u * scale;
  }
}

__global__ void __launch_bounds__(k_elem_threads) moe_combine_kernel(float* y, const float* ye, const int32_t* sel,
                                                                      int K, int d) {
  pdl_entry();
  const int r = blockIdx.y;
  {
    const int i = blockIdx.x * k_elem_threads + threadIdx.x;
    if (i >= d) return;
    y[(size_t)r * d + i] = add_routed_rows(y[(size_t)r * d + i], ye, sel, K, d, r, i);
  }
}

}  // namespace

status moe_route(const moe_route_params& p, cudaStream_t stream) {
  if (p.R <= 0 || p.E <= 0 || p.K <= 0 || p.K > p.E || !p.logits || !p.bias || !p.sel || !p.weight)
    return make_error(errc::invalid_argument, "moe_route: bad shape (rows " + std::to_string(p.R) + ", experts " +
                                                  std::to_string(p.E) + ", top " + std::to_string(p.K) + ") or null pointer");
  if (p.E <= 32 * 32)
    launch_kernel(moe_route_warp_kernel, (p.R + k_route_warps - 1) / k_route_warps, 32 * k_route_warps, 0, stream, p);
  else
    launch_kernel(moe_route_kernel, (p.R + 63) / 64, 64, 0, stream, p);
  CEDAR_CUDA_LAUNCHED("moe_route");
  return {};
}

status moe_up(const qmatrix* w1, const qmatrix* w3, const qmatrix& like1, const qmatrix& like3, const int32_t* sel,
              int R, int K, const float* x, int d, int F, float* h, cudaStream_t stream, const float* x_norm_w,
              float x_norm_eps, const float* x_norm_inv) {
  if (R <= 0 || K <= 0 || d <= 0 || F <= 0 || !w1 || !w3 || !sel || !x || !h)
    return make_error(errc::invalid_argument, "moe_up: bad shape or null pointer");
  if (like1.rows != F || like3.rows != F || like1.cols != d || like3.cols != d)
    return make_error(errc::invalid_argument, "moe_up: expert matrices are not [F, d]");
  qgemv_expert_params p;
  p.wa = w1, p.wb = w3, p.like_a = like1, p.like_b = like3, p.sel = sel, p.n = R * K, p.x_div = K;
  p.x = x, p.ldx = d, p.y = h, p.ldy = 2 * F, p.x_norm_w = x_norm_w, p.x_norm_eps = x_norm_eps;
  p.x_norm_inv = x_norm_inv;
  if (auto st = qgemv_expert(p, stream); !st.ok()) return make_error(errc::invalid_argument, "moe_up: " + st.err().message);
  return {};
}

status swiglu_rows(const float* h, int n, int F, float limit, const float* row_weight, float* a, cudaStream_t stream) {
  if (n <= 0 || F <= 0 || !h || !a) return make_error(errc::invalid_argument, "swiglu_rows: bad shape or null pointer");
  launch_kernel(swiglu_kernel, dim3((unsigned)((F + k_elem_threads - 1) / k_elem_threads), (unsigned)n), k_elem_threads, 0,
                  stream, h, F, limit, row_weight, a);
  CEDAR_CUDA_LAUNCHED("swiglu_rows");
  return {};
}

status moe_down(const qmatrix* w2, const qmatrix& like2, const int32_t* sel, int R, int K, const float* a, int F,
                int d, float* ye, cudaStream_t stream) {
  if (R <= 0 || K <= 0 || d <= 0 || F <= 0 || !w2 || !sel || !a || !ye)
    return make_error(errc::invalid_argument, "moe_down: bad shape or null pointer");
  if (like2.rows != d || like2.cols != F)
    return make_error(errc::invalid_argument, "moe_down: expert matrix is not [d, F]");
  qgemv_expert_params p;
  p.wa = w2, p.like_a = like2, p.sel = sel, p.n = R * K, p.x = a, p.ldx = F, p.y = ye, p.ldy = d;
  if (auto st = qgemv_expert(p, stream); !st.ok()) return make_error(errc::invalid_argument, "moe_down: " + st.err().message);
  return {};
}

status moe_combine(float* y, const float* ye, const int32_t* sel, int R, int K, int d, cudaStream_t stream) {
  if (R <= 0 || K <= 0 || d <= 0 || !y || !ye || !sel)
    return make_error(errc::invalid_argument, "moe_combine: bad shape or null pointer");
  launch_kernel(moe_combine_kernel, dim3((unsigned)((d + k_elem_threads - 1) / k_elem_threads), (unsigned)R), k_elem_threads, 0,
                       stream, y, ye, sel, K, d);
  CEDAR_CUDA_LAUNCHED("moe_combine");
  return {};
}

}  // namespace cedar::kernels::cuda
