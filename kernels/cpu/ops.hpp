// ops — the dense fp32 CPU operations the forward pass is built from (MODEL_SPEC §1, §6).
//
// Owns: GEMM (a thin wrapper on OpenBLAS cblas_sgemm, the one place BLAS is called), RMSNorm
// (weighted and unweighted), softmax, interleaved-pair RoPE on the trailing rope slice,
// clamped SwiGLU, and the small vector helpers (dot, axpy, activations).
// Does not own: the quantisation codecs (quant.hpp), any model state or layer logic.
//
// Conventions: row-major fp32, `n` elements per row, rows contiguous unless a stride is given.
// Weight matrices are stored as in the checkpoint, W [out, in], and applied as y = x · Wᵀ.
// Every fast op has a scalar oracle in `ref::` (HOUSE_STYLE 13), tested over a grid of shapes.
// Threading: everything here runs on the calling thread and is reentrant; OpenBLAS is set to
// one thread when the kernel pool starts (qmatmul.hpp, cpu_threads), which splits large GEMMs.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cedar::kernels {

// C[m, n] = alpha · A[m, k] · B[n, k]ᵀ + beta · C  (lda = k, ldb = k, ldc = n unless given).
void gemm_nt(int m, int n, int k, const float* a, const float* b, float* c, float beta = 0.0f);
void gemm_nt_ld(int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c,
                int ldc, float alpha, float beta);
// C[m, n] = A[m, k] · B[k, n] + beta · C  (B row-major [k, n]).
void gemm_nn_ld(int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c,
                int ldc, float alpha, float beta);
// Number of threads OpenBLAS uses (1 once the kernel pool runs); set_gemm_threads(n) changes it.
int gemm_threads();
void set_gemm_threads(int n);

// y[n] = w[n] · x[n] · rsqrt(mean(x²) + eps); w == nullptr: unweighted. In place allowed.
void rmsnorm(const float* x, const float* w, int n, double eps, float* y);
// Row-wise over rows of `n`.
void rmsnorm_rows(const float* x, const float* w, int rows, int n, double eps, float* y);

// In-place numerically stable softmax over n values.
void softmax(float* x, int n);

// Interleaved-pair RoPE on the LAST 2·n_pairs channels of x[n]: pair (2i, 2i+1) of the rope
// slice rotates by the angle whose cos/sin are cos[i]/sin[i]; inverse rotates by −angle.
void rope_interleaved(float* x, int n, int n_pairs, const float* cos, const float* sin,
                      bool inverse);

// SwiGLU with the DeepSeek clamps: up ∈ [−limit, limit], gate ≤ limit (limit ≤ 0: no clamp).
// out[i] = silu(min(gate[i], limit)) · clamp(up[i]) · scale.
void swiglu(const float* gate, const float* up, int n, float limit, float scale, float* out);

float dot(const float* a, const float* b, int n);
void axpy(float a, const float* x, float* y, int n);  // y += a·x
inline float sigmoid(float x);
float silu(float x);
float softplus(float x);

inline float sigmoid(float x) {
  // Stable on both sides; matches torch.sigmoid to a few ulp.
  if (x >= 0) {
    float z = __builtin_expf(-x);
    return 1.0f / (1.0f + z);
  }
  float z = __builtin_expf(x);
  return z / (1.0f + z);
}

namespace ref {
void gemm_nt(int m, int n, int k, const float* a, const float* b, float* c);
void rmsnorm(const float* x, const float* w, int n, double eps, float* y);
void softmax(float* x, int n);
void rope_interleaved(float* x, int n, int n_pairs, const float* cos, const float* sin,
                      bool inverse);
void swiglu(const float* gate, const float* up, int n, float limit, float scale, float* out);
}  // namespace ref

}  // namespace cedar::kernels
