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

#include <cstdint>

#include "kernels/base/result.hpp"
#include "kernels/cpu/qmatmul.hpp"

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
  // instead of mixes: hc_mix_collapse's partials [R, nblk, mix + 2]; the mixes are their sums
  // scaled by rsqrt(Σ squares / ncols + norm_eps) (the flat RMSNorm of the streams); x_inv
  // (optional) gets each row's rsqrt(Σ v² / x_cols + x_eps), the collapsed row's RMSNorm factor
  const float* partial = nullptr;
  int nblk = 0, ncols = 0;
  float norm_eps = 0.0f;
  float* x_inv = nullptr;  // [R]
  int x_cols = 0;
  float x_eps = 0.0f;
};
status hc_post(const hc_post_params& p, cudaStream_t stream);

// One site's reads of the streams in one pass (for hc_post's partial form): per block of 32
// channels, the partial dot products of hc_fn [mix, hc·d] with the flat streams, their sum of
// squares and the collapse's sum of squares -> partial [R, hc_mix_blocks(d), mix + 2]; and the
// collapse with the previous site's weights, not yet normalised: v[r] = Σ_k pre[r, k] · X[r, k]
// [R, d] (its RMSNorm is left to the projections that read it: qgemv's x_norm_w, with the
// factor hc_post leaves in x_inv).
struct hc_mix_params {
  int R = 0, hc = 0, d = 0;
  float* X = nullptr;          // [R, hc, d] (written only when y is given)
  qmatrix fn;                  // hc_fn, device pointers
  const float* pre = nullptr;  // [R, hc] collapse weights
  float* partial = nullptr;    // [R, hc_mix_blocks(d), mix + 2]
  float* v = nullptr;          // [R, d]
  // optional: the previous sub-layer's hc_expand applied first (X updated in place, then read),
  // saving its launch: X[r, k] ← post[r, k] · y[r] + Σ_j comb[r, j, k] · X[r, j]
  const float* y = nullptr;    // [R, d]
  const float* post = nullptr; // [R, hc]
  const float* comb = nullptr; // [R, hc, hc]
  // optional, with y: the routed experts' rows added to y first, as moe_combine adds them
  // (saving its launch): y[r] + Σ_k ye[r·K + k] in ascending expert id sel[r·K + k]
  const float* ye = nullptr;       // [R·ye_K, d]
  const int32_t* ye_sel = nullptr; // [R, ye_K]
  int ye_K = 0;
  // optional: hc_post fused in (saves its launch): with `done` set, the last block of each row
  // to finish reduces the row's partials and writes the mix weights as hc_post(site) would
  // (site: R, hc, sinkhorn_iters, eps, base, scale, pre, post, comb, norm_eps, x_inv, x_cols,
  // x_eps; its partial form on this launch's partials is filled in). The outputs may be the
  // buffers this launch reads (pre, post, comb): every block has read them before the last one
  // starts. done [R]: zero before the launch, left zero after it.
  hc_post_params site;
  unsigned* done = nullptr;
  // with `done`: the last block writes site.x_inv alone (the same bits as hc_post's) and leaves
  // the mix weights to a separate hc_post on this launch's partials, which the decoder runs on a
  // side stream while the sub-layer's projections (which need only x_inv) go on: the mixes are
  // read first by the next site, so their Sinkhorn tail leaves the critical path
  bool x_inv_only = false;
};
int hc_mix_blocks(int d);
size_t hc_mix_partial_floats(int R, int hc, int d);
status hc_mix_collapse(const hc_mix_params& p, cudaStream_t stream);

// x[r] = rmsnorm(Σ_k pre[r, k] · X[r, k], w)   x [R, d]
status hc_collapse_norm(const float* X, const float* pre, const float* w, float* x, int R, int hc, int d,
                        float eps, cudaStream_t stream);

// X[r, k] ← post[r, k] · y[r] + Σ_j comb[r, j, k] · X[r, j]; with ye: y[r] + the routed
// experts' rows first (hc_mix_params' ye, ye_sel, ye_K).
status hc_expand(float* X, const float* y, const float* post, const float* comb, int R, int hc, int d,
                 cudaStream_t stream, const float* ye = nullptr, const int32_t* ye_sel = nullptr, int ye_K = 0);

}  // namespace cedar::kernels::cuda
