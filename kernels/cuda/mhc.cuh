// mhc — the Single-Pass mHC stream mixes of a decode step on the GPU (MODEL_SPEC §6 "mHC"):
// the per-row mix weights from the mixing projection's output (pre, post and the
// Sinkhorn-normalised combination matrix), the collapse of the hc residual streams into one
// normalised hidden row, and the expansion of a sub-layer's output back into the streams.
// The CPU path (model/forward.cpp hc_mixes / hc_collapse / hc_expand) is the reference; these
// kernels follow its formulas and its order of operations per element.
//
// Shapes: R rows, hc streams (≤ k_hc_max) of d channels; X [R, hc, d] residual streams;
// mixes [R, (2 + hc)·hc] = rmsnorm(X[r] flat) · hc_fnᵀ.
#pragma once

#include <cuda_runtime.h>

#include "kernels/base/result.hpp"

namespace cedar::kernels::cuda {

constexpr int k_hc_max = 16;

struct hc_post_params {
  int R = 0, hc = 0;
  int sinkhorn_iters = 1;       // column, then (iters − 1) × (row, column) normalisations
  float eps = 0.0f;             // hc_eps
  const float* mixes = nullptr; // [R, (2 + hc)·hc]
  const float* base = nullptr;  // [(2 + hc)·hc]
  const float* scale = nullptr; // [3] pre, post, comb scales
  float* pre = nullptr;         // [R, hc]  sigmoid(·) + eps
  float* post = nullptr;        // [R, hc]  2·sigmoid(·)
  float* comb = nullptr;        // [R, hc, hc] [j][k], Sinkhorn-normalised
};
status hc_post(const hc_post_params& p, cudaStream_t stream);

// x[r] = rmsnorm(Σ_k pre[r, k] · X[r, k], w)   x [R, d]
status hc_collapse_norm(const float* X, const float* pre, const float* w, float* x, int R, int hc, int d,
                        float eps, cudaStream_t stream);

// X[r, k] ← post[r, k] · y[r] + Σ_j comb[r, j, k] · X[r, j]
status hc_expand(float* X, const float* y, const float* post, const float* comb, int R, int hc, int d,
                 cudaStream_t stream);

}  // namespace cedar::kernels::cuda
