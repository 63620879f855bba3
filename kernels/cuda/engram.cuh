// engram — the Engram gate of a decode step on the GPU (MODEL_SPEC §6 "Engram"): after the
// gathered table rows went through the projection (kv [R, d·(hc+1)] = emb · wkvᵀ: hc keys and
// one value per row), each residual stream h = X[r, k] gets
//   h += sigmoid(sign(s)·sqrt(max(|s|, 1e-6))) · value,
//   s = Σ_i h_i·qk[k, i]·key_i · rstd(h)·rstd(key) / sqrt(d),  rstd(v) = 1/sqrt(mean(v²) + eps).
// forward.cpp engram_apply is the reference (same formula and order per stream).
#pragma once

#include <cuda_runtime.h>

#include "kernels/base/result.hpp"

namespace cedar::kernels::cuda {

// X [R, hc, d] updated in place; kv [R, (hc + 1)·d]; qk [hc, d].
status engram_gate(float* X, const float* kv, const float* qk, int R, int hc, int d, float eps, cudaStream_t stream);

}  // namespace cedar::kernels::cuda
