// moe_device — the routing, the SwiGLU and the combine of the routed experts as device functions:
// the routing shared by moe_route and the up projection that routes for itself (qgemv.cu), the
// SwiGLU by swiglu_rows and the up projections' SwiGLU epilogue (qgemv.cu), the
// combine by moe_combine (moe.cu) and the expands that fold it in (mhc.cu: hc_mix_collapse and
// hc_expand add the experts' rows as they read y), so that every form gives the same bits.
#pragma once

#include <cstdint>

#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/moe.cuh"

namespace cedar::kernels::cuda {

__device__ inline float softplus_torch(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// The weight of slot k of a row whose chosen experts are sl[0..K) (gate logits lr):
// s / Σ s (renormalised, K > 1) × route_scale.
__device__ inline float route_weight(const moe_route_params& p, const float* lr, const int32_t* sl, int k) {
  float sum = 0.0f;
  for (int j = 0; j < p.K; ++j) sum += sqrtf(softplus_torch(lr[sl[j]]));
  float wk = sqrtf(softplus_torch(lr[sl[k]]));
  if (p.renormalise && p.K > 1) wk = wk / (sum + 1e-20f);
  return wk * p.route_scale;
}

// Row r's weights of its chosen experts sl[0..K) into p.weight.
__device__ inline void route_weights(const moe_route_params& p, int r, const float* lr, const int32_t* sl) {
  for (int k = 0; k < p.K; ++k) p.weight[(size_t)r * p.K + k] = route_weight(p, lr, sl, k);
}

// SwiGLU of one channel (swiglu_rows, and the up projections' SwiGLU epilogue: the same bits):
// silu(min(g, limit)) · clamp(u, ±limit) · scale; limit 0: no clamp.
__device__ __forceinline__ float swiglu_value(float g, float u, float limit, float scale) {
  if (limit > 0.0f) {
    u = fminf(fmaxf(u, -limit), limit);
    g = fminf(g, limit);
  }
  return g * sigmoid_stable(g) * u * scale;
}

// Row r's K experts by one warp (E ≤ 32 · 32): lane l owns experts l, l + 32, ...; each of the
// K rounds takes the warp's best untaken (score + bias), ties to the lower id — the serial
// kernel's choice. Lane 0 writes the ids to out[0..K) (global or shared memory); every lane
// of the warp must call it. Shared by moe_route and the routed experts' up projection that
// routes for itself (qgemv_expert's route), so both give the same ids.
__device__ inline void route_row_warp(const moe_route_params& p, int r, int lane, int32_t* out) {
  const float* lr = p.logits + (size_t)r * p.E;
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
    if (lane == 0) out[k] = best;
  }
}

// acc + the K expert rows of row r at channel i, ye [R·K, d], in ascending expert id (the CPU
// adds the experts in id order; ids within a row are distinct).
__device__ inline float add_routed_rows(float acc, const float* ye, const int32_t* sel, int K, int d, int r, int i) {
  const int32_t* sl = sel + (size_t)r * K;
  constexpr int KB = 8;
  if (K <= KB) {  // the ids into registers, the order found there, then every row's load at once
    int32_t s[KB];
#pragma unroll
    for (int k = 0; k < KB; ++k) s[k] = k < K ? sl[k] : 0;
    int row[KB];
    int last = -1;
#pragma unroll
    for (int n = 0; n < KB; ++n) {
      int best = -1;
      int32_t bv = 0;  // s[best] (kept apart: a register array takes constant indices only)
#pragma unroll
      for (int k = 0; k < KB; ++k)
        if (k < K && s[k] > last && (best < 0 || s[k] < bv)) best = k, bv = s[k];
      row[n] = best;
      last = bv;
    }
    float v[KB];
#pragma unroll
    for (int n = 0; n < KB; ++n)
      if (n < K) v[n] = ye[((size_t)r * K + row[n]) * d + i];
#pragma unroll
    for (int n = 0; n < KB; ++n)
      if (n < K) acc += v[n];
    return acc;
  }
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
