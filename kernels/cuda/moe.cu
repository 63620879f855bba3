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

// A warp per row (E ≤ 32 · 32): route_row_warp (moe_device.cuh).
constexpr int k_route_warps = 4;

__global__ void __launch_bounds__(32 * k_route_warps) moe_route_warp_kernel(moe_route_params p) {
  pdl_entry();
  const int r = blockIdx.x * k_route_warps + (threadIdx.x >> 5);
  if (r >= p.R) return;
  const int lane = threadIdx.x & 31;
  int32_t* sl = p.sel + (size_t)r * p.K;
  route_row_warp(p, r, lane, sl);
  __syncwarp();
  if (lane != 0) return;
  route_weights(p, r, p.logits + (size_t)r * p.E, sl);
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
    a[(size_t)r * F + i] = swiglu_value(h[(size_t)r * 2 * F + i], h[(size_t)r * 2 * F + F + i], limit, scale);
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

static status check_route(const moe_route_params& p, const char* who) {
  if (p.R <= 0 || p.E <= 0 || p.K <= 0 || p.K > p.E || !p.logits || !p.bias || !p.sel || !p.weight)
    return make_error(errc::invalid_argument, std::string(who) + ": bad shape (rows " + std::to_string(p.R) + ", experts " +
                                                  std::to_string(p.E) + ", top " + std::to_string(p.K) + ") or null pointer");
  return {};
}

status moe_route(const moe_route_params& p, cudaStream_t stream) {
  CEDAR_TRY(check_route(p, "moe_route"));
  if (p.E <= 32 * 32)
    launch_kernel(moe_route_warp_kernel, (p.R + k_route_warps - 1) / k_route_warps, 32 * k_route_warps, 0, stream, p);
  else
    launch_kernel(moe_route_kernel, (p.R + 63) / 64, 64, 0, stream, p);
  CEDAR_CUDA_LAUNCHED("moe_route");
  return {};
}

namespace {
// moe_up / moe_up_swiglu: the checks and the expert launch (a: the SwiGLU epilogue's output, or
// null for h = [gate | up])
status up_launch(const char* who, const qmatrix* w1, const qmatrix* w3, const qmatrix& like1, const qmatrix& like3,
                 const int32_t* sel, int R, int K, const float* x, int d, int F, float* out, cudaStream_t stream,
                 const float* x_norm_w, float x_norm_eps, const float* x_norm_inv, const moe_route_params* route,
                 bool glu, float limit, const float* row_weight) {
  const std::string w(who);
  if (R <= 0 || K <= 0 || d <= 0 || F <= 0 || !w1 || !w3 || !sel || !x || !out)
    return make_error(errc::invalid_argument, w + ": bad shape or null pointer");
  if (route) {
    CEDAR_TRY(check_route(*route, (w + " (route)").c_str()));
    if (route->R != R || route->K != K || route->sel != sel || route->E > 32 * 32 || K > k_route_max_k)
      return make_error(errc::invalid_argument, w + ": the route's rows, top-K or sel differ from the items' (or E > 1024, K > " +
                                                    std::to_string(k_route_max_k) + ")");
  }
  if (like1.rows != F || like3.rows != F || like1.cols != d || like3.cols != d)
    return make_error(errc::invalid_argument, w + ": expert matrices are not [F, d]");
  qgemv_expert_params p;
  p.wa = w1, p.wb = w3, p.like_a = like1, p.like_b = like3, p.sel = sel, p.n = R * K, p.x_div = K;
  p.x = x, p.ldx = d, p.y = out, p.ldy = glu ? F : 2 * F, p.x_norm_w = x_norm_w, p.x_norm_eps = x_norm_eps;
  p.x_norm_inv = x_norm_inv;
  if (route) p.route = true, p.rp = *route;
  if (glu) p.glu = true, p.glu_limit = limit, p.glu_scale = route ? nullptr : row_weight;
  if (auto st = qgemv_expert(p, stream); !st.ok()) return make_error(errc::invalid_argument, w + ": " + st.err().message);
  return {};
}
}  // namespace

status moe_up(const qmatrix* w1, const qmatrix* w3, const qmatrix& like1, const qmatrix& like3, const int32_t* sel,
              int R, int K, const float* x, int d, int F, float* h, cudaStream_t stream, const float* x_norm_w,
              float x_norm_eps, const float* x_norm_inv, const moe_route_params* route) {
  return up_launch("moe_up", w1, w3, like1, like3, sel, R, K, x, d, F, h, stream, x_norm_w, x_norm_eps, x_norm_inv, route,
                   false, 0.0f, nullptr);
}

status moe_up_swiglu(const qmatrix* w1, const qmatrix* w3, const qmatrix& like1, const qmatrix& like3,
                     const int32_t* sel, int R, int K, const float* x, int d, int F, float limit, const float* row_weight,
                     float* a, cudaStream_t stream, const float* x_norm_w, float x_norm_eps, const float* x_norm_inv,
                     const moe_route_params* route) {
  return up_launch("moe_up_swiglu", w1, w3, like1, like3, sel, R, K, x, d, F, a, stream, x_norm_w, x_norm_eps, x_norm_inv,
                   route, true, limit, row_weight);
}

status swiglu_rows(const float* h, int n, int F, float limit, const float* row_weight, float* a, cudaStream_t stream) {
  if (n <= 0 || F <= 0 || !h || !a) return make_error(errc::invalid_argument, "swiglu_rows: bad shape or null pointer");
  launch_kernel(swiglu_kernel, dim3((unsigned)((F + k_elem_threads - 1) / k_elem_threads), (unsigned)n), k_elem_threads, 0,
                  stream, h, F, limit, row_weight, a);
  CEDAR_CUDA_LAUNCHED("swiglu_rows");
  return {};
}

namespace {
// moe_down / moe_down_swiglu: the checks and the expert launch (glu: a and shared_a are [gate | up]
// rows of 2F, the activation taken on load with limit and row_weight)
status down_launch(const char* who, const qmatrix* w2, const qmatrix& like2, const int32_t* sel, int R, int K,
                   const float* a, int F, int d, float* ye, cudaStream_t stream, const qmatrix* shared_w2,
                   const float* shared_a, float* shared_y, bool glu, float limit, const float* row_weight) {
  const std::string w(who);
  if (R <= 0 || K <= 0 || d <= 0 || F <= 0 || !w2 || !sel || !a || !ye)
    return make_error(errc::invalid_argument, w + ": bad shape or null pointer");
  if (like2.rows != d || like2.cols != F) return make_error(errc::invalid_argument, w + ": expert matrix is not [d, F]");
  if (shared_w2 && (!shared_a || !shared_y))
    return make_error(errc::invalid_argument, w + ": the shared expert's matrix without its input or output rows");
  const int lda = glu ? 2 * F : F;
  qgemv_expert_params p;
  p.wa = w2, p.like_a = like2, p.sel = sel, p.n = R * K, p.x = a, p.ldx = lda, p.y = ye, p.ldy = d;
  if (shared_w2) {
    p.n_fixed = R, p.fixed_a = *shared_w2;
    p.fixed_x = shared_a, p.fixed_ldx = lda, p.fixed_y = shared_y, p.fixed_ldy = d;
  }
  if (glu) p.x_glu = true, p.x_glu_limit = limit, p.x_glu_scale = row_weight;
  if (auto st = qgemv_expert(p, stream); !st.ok()) return make_error(errc::invalid_argument, w + ": " + st.err().message);
  return {};
}
}  // namespace

status moe_down(const qmatrix* w2, const qmatrix& like2, const int32_t* sel, int R, int K, const float* a, int F,
                int d, float* ye, cudaStream_t stream, const qmatrix* shared_w2, const float* shared_a, float* shared_y) {
  return down_launch("moe_down", w2, like2, sel, R, K, a, F, d, ye, stream, shared_w2, shared_a, shared_y, false, 0.0f,
                     nullptr);
}

status moe_down_swiglu(const qmatrix* w2, const qmatrix& like2, const int32_t* sel, int R, int K, const float* h, int F,
                       float limit, const float* row_weight, int d, float* ye, cudaStream_t stream,
                       const qmatrix* shared_w2, const float* shared_h, float* shared_y) {
  return down_launch("moe_down_swiglu", w2, like2, sel, R, K, h, F, d, ye, stream, shared_w2, shared_h, shared_y, true,
                     limit, row_weight);
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
