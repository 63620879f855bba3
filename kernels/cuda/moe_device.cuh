// moe_device — the routing, SwiGLU and combine of the routed experts as device functions, shared
// by the kernels that run them alone (moe.cu) and those that fold them into a neighbour's launch
// (mhc.cu: the expand of the next site adds the experts' rows instead of a combine launch), so
// that every form gives the same bits.
#pragma once

#include <cstdint>

#include "kernels/cuda/device_math.cuh"

namespace cedar::kernels::cuda {

constexpr int k_route_warp_max_experts = 32 * 32;  // a warp, 32 experts per lane (taken mask)

__device__ inline float softplus_torch(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// One warp: row lr [E]'s K experts of largest sqrt(softplus(logit)) + bias (ties to the lower
// id) into sl[0..K) and their weights (s / Σ s when renormalised and K > 1, × route_scale)
// into wt[0..K). E ≤ k_route_warp_max_experts; sl, wt: memory the warp's lane 0 writes (global
// or shared), read back only after the call. Every lane of the warp calls it.
__device__ inline void route_row_warp(const float* lr, const float* bias, int E, int K, bool renormalise,
                                      float route_scale, int32_t* sl, float* wt, int lane) {
  uint32_t taken = 0;  // bit t: expert lane + 32 t
  for (int k = 0; k < K; ++k) {
    int best = -1;
    float bv = 0.0f;
    for (int t = 0, i = lane; i < E; ++t, i += 32) {
      if (taken >> t & 1u) continue;
      const float v = sqrtf(softplus_torch(lr[i])) + bias[i];
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
  float sum = 0.0f;
  for (int k = 0; k < K; ++k) sum += sqrtf(softplus_torch(lr[sl[k]]));
  for (int k = 0; k < K; ++k) {
    float wk = sqrtf(softplus_torch(lr[sl[k]]));
    if (renormalise && K > 1) wk = wk / (sum + 1e-20f);
    wt[k] = wk * route_scale;
  }
}

// SwiGLU of one channel: silu(min(gate, limit)) · clamp(up, ±limit) · scale (limit 0: none).
__device__ inline float swiglu_value(float g, float u, float limit, float scale) {
  if (limit > 0.0f) {
    u = fminf(fmaxf(u, -limit), limit);
    g = fminf(g, limit);
  }
  return g * sigmoid_stable(g) * u * scale;
}

// acc + the K expert rows of row r at channel i, ye [R·K, d], in ascending expert id (the CPU
// adds the experts in id order; ids within a row are distinct).
__device__ inline float add_routed_rows(float acc, const float* ye, const int32_t* sel, int K, int d, int r, int i) {
  const int32_t* sl = sel + (size_t)r * K;
  int last = -1;
  for (int n = 0; n < K; ++n) {
    int best = -1;
    for (int k = 0; k < K; ++k)
      if (sl[k] > last && (best < 0 || sl[k] < sl[best])) best = k;
    acc += ye[((size_t)r * K + best) * d + i];
    last = sl[best];
  }
  return acc;
}

}  // namespace cedar::kernels::cuda
