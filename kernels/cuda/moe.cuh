// moe — the routed experts of a decode step on the GPU (MODEL_SPEC §1 "MoE"), with the routing
// decided and applied on the device (no host round trip, so a step can be one CUDA graph):
//   moe_route     scores s = sqrt(softplus(gate logits)); the K experts of largest s + bias
//                 (ties to the lower id); weights s / Σ s (when renormalised and K > 1) ×
//                 routed_scaling_factor;
//   moe_up        h[i] = [w1[e] · x_r ; w3[e] · x_r] for every (row r, slot k) item i = r·K + k,
//                 e = sel[i] (qgemv_expert: the expert's matrices picked on the device);
//   swiglu_rows   a = silu(min(gate, limit)) · clamp(up, ±limit) · row weight (moe_up_swiglu:
//                 both in one launch);
//   moe_down      ye[i] = w2[e] · a[i] (moe_down_swiglu: swiglu_rows' a computed on load);
//   moe_combine   y[r] += Σ_k ye[r·K + k], in ascending expert id (the CPU adds experts in id
//                 order).
// Expert matrices are arrays (device memory) of kernels::qmatrix views with device pointers,
// one per expert. forward.cpp moe_forward / run_expert are the reference. The shared expert
// runs through qgemv + swiglu_rows (every row, weight 1).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/base/result.hpp"
#include "kernels/cpu/qmatmul.hpp"

namespace cedar::kernels::cuda {

struct moe_route_params {
  int R = 0, E = 0, K = 0;
  const float* logits = nullptr;  // [R, E] x · gateᵀ
  const float* bias = nullptr;    // [E] selection bias
  bool renormalise = true;        // norm_topk_prob
  float route_scale = 1.0f;       // routed_scaling_factor
  int32_t* sel = nullptr;         // [R, K] expert ids
  float* weight = nullptr;        // [R, K]
};
status moe_route(const moe_route_params& p, cudaStream_t stream);

// h [R·K, 2F]; w1, w3: [E] views [F, d] (device arrays); like1, like3: copies of one expert's
// views (every expert has their format and shape).
// x_norm_w: x rows RMS-normalised on the fly with these weights (null: x as given).
// route: the routing of this step (moe_route_params with sel == the sel above): each block of
// the launch routes its row itself (the same ids as moe_route) and the first block of each row
// writes sel and the weights, so no moe_route launch precedes it (E ≤ 1024, K ≤ k_route_max_k).
constexpr int k_route_max_k = 32;
status moe_up(const qmatrix* w1, const qmatrix* w3, const qmatrix& like1, const qmatrix& like3, const int32_t* sel,
              int R, int K, const float* x, int d, int F, float* h, cudaStream_t stream,
              const float* x_norm_w = nullptr, float x_norm_eps = 0.0f, const float* x_norm_inv = nullptr,
              const moe_route_params* route = nullptr);
// moe_up and swiglu_rows in one launch (qgemv_expert's SwiGLU epilogue): a [R·K, F] =
// swiglu(w1[e] · x_r, w3[e] · x_r) · weight of item i — the same bits as moe_up then swiglu_rows.
// The weights: route's (computed in each block, and written to route->weight as moe_route would)
// when routing, else row_weight [R·K] (null: 1). Not for f32 experts (error).
status moe_up_swiglu(const qmatrix* w1, const qmatrix* w3, const qmatrix& like1, const qmatrix& like3,
                     const int32_t* sel, int R, int K, const float* x, int d, int F, float limit, const float* row_weight,
                     float* a, cudaStream_t stream, const float* x_norm_w = nullptr, float x_norm_eps = 0.0f,
                     const float* x_norm_inv = nullptr, const moe_route_params* route = nullptr);
// a [n, F] from h [n, 2F] = [gate | up]; row_weight [n] or null (1).
status swiglu_rows(const float* h, int n, int F, float limit, const float* row_weight, float* a, cudaStream_t stream);
// ye [R·K, d]; w2: [E] views [d, F]; a [R·K, F]. With shared_w2 (a view like like2): also the
// shared expert's down projection in the same launch, shared_y [R, d] = shared_w2 · shared_a[r]
// (shared_a [R, F]) — bit for bit the rows of one expert launch of the R·K + R items over an
// expert array that also holds shared_w2 (qgemv_expert_params' fixed items).
status moe_down(const qmatrix* w2, const qmatrix& like2, const int32_t* sel, int R, int K, const float* a, int F,
                int d, float* ye, cudaStream_t stream, const qmatrix* shared_w2 = nullptr,
                const float* shared_a = nullptr, float* shared_y = nullptr);
// swiglu_rows and moe_down in one launch (qgemv_expert's x_glu): h [R·K, 2F] = [gate | up] of
// each item, row_weight [R·K] (null: 1), the shared expert's shared_h [R, 2F] (weight 1); each
// block computes its item's activation on load — the bits of swiglu_rows then moe_down.
// F ≤ k_x_glu_max_cols (qgemv.cuh).
status moe_down_swiglu(const qmatrix* w2, const qmatrix& like2, const int32_t* sel, int R, int K, const float* h, int F,
                       float limit, const float* row_weight, int d, float* ye, cudaStream_t stream,
                       const qmatrix* shared_w2 = nullptr, const float* shared_h = nullptr, float* shared_y = nullptr);
// y [R, d] += the K rows of ye of each row, in ascending expert id. (Also folded into the next
// hc_mix_collapse / hc_expand: their ye, sel, K arguments.)
status moe_combine(float* y, const float* ye, const int32_t* sel, int R, int K, int d, cudaStream_t stream);

}  // namespace cedar::kernels::cuda
