// ops — see ops.hpp. The fast paths are plain loops the compiler vectorises (-march=native)
// plus OpenBLAS for GEMM; the ref:: oracles are straight-line double-accumulating versions.
#include "kernels/cpu/ops.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>


extern "C" {
// OpenBLAS extensions (declared in cblas.h of some builds only).
int openblas_get_num_threads(void);
void openblas_set_num_threads(int);
}

namespace cedar::kernels {

void gemm_nt(int m, int n, int k, const float* a, const float* b, float* c, float beta) {
  gemm_nt_ld(m, n, k, a, k, b, k, c, n, 1.0f, beta);
}

void gemm_nt_ld(int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c,
                int ldc, float alpha, float beta) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) c[(size_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[(size_t)i * ldc + j];
    return;
  }
  if (m == 1) {
    // y[n] = B[n, k] · a[k]: a GEMV (OpenBLAS's sgemm with m == 1 is slower than sgemv).
    cblas_sgemv(CblasRowMajor, CblasNoTrans, n, k, alpha, b, ldb, a, 1, beta, c, 1);
    return;
  }
  // 2 ≤ m: OpenBLAS sgemm (both cores). Measured on 2 cores: a one-pass, register-light
  // small-batch kernel (each weight row dotted with all m rows) was slower than sgemm at batch
  // 8 (97 vs 139 tok/s) and 32 (90 vs 245 tok/s) on the ~100M model: the batch rows' loads,
  // not the weight bandwidth, bound it; sgemm's register tiles reuse them.
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, alpha, a, lda, b, ldb, beta, c,
              ldc);
}

void gemm_nn_ld(int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c,
                int ldc, float alpha, float beta) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) c[(size_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[(size_t)i * ldc + j];
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c,
              ldc);
}

int gemm_threads() { return openblas_get_num_threads(); }
void set_gemm_threads(int n) { openblas_set_num_threads(n); }

void rmsnorm(const float* x, const float* w, int n, double eps, float* y) {
  float ss = 0.0f;
  for (int i = 0; i < n; ++i) ss += x[i] * x[i];
  const float r = 1.0f / std::sqrt(ss / (float)n + (float)eps);
  if (w) {
    for (int i = 0; i < n; ++i) y[i] = w[i] * (x[i] * r);
  } else {
    for (int i = 0; i < n; ++i) y[i] = x[i] * r;
  }
}

void rmsnorm_rows(const float* x, const float* w, int rows, int n, double eps, float* y) {
  for (int r = 0; r < rows; ++r) rmsnorm(x + (size_t)r * n, w, n, eps, y + (size_t)r * n);
}

void softmax(float* x, int n) {
  if (n <= 0) return;
  float mx = x[0];
  for (int i = 1; i < n; ++i) mx = std::max(mx, x[i]);
  float s = 0.0f;
  for (int i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    s += x[i];
  }
  const float inv = 1.0f / s;
  for (int i = 0; i < n; ++i) x[i] *= inv;
}

void rope_interleaved(float* x, int n, int n_pairs, const float* cos, const float* sin,
                      bool inverse) {
  float* r = x + (n - 2 * n_pairs);
  const float sg = inverse ? -1.0f : 1.0f;
  for (int i = 0; i < n_pairs; ++i) {
    const float e = r[2 * i], o = r[2 * i + 1];
    const float c = cos[i], s = sg * sin[i];
    r[2 * i] = e * c - o * s;
    r[2 * i + 1] = e * s + o * c;
  }
}

float silu(float x) { return x * sigmoid(x); }

float softplus(float x) {
  // torch.nn.functional.softplus (beta 1, threshold 20).
  if (x > 20.0f) return x;
  return std::log1p(std::exp(x));
}

void swiglu(const float* gate, const float* up, int n, float limit, float scale, float* out) {
  for (int i = 0; i < n; ++i) {
    float g = gate[i], u = up[i];
    if (limit > 0) {
      u = std::min(std::max(u, -limit), limit);
      g = std::min(g, limit);
    }
    out[i] = silu(g) * u * scale;
  }
}

float dot(const float* a, const float* b, int n) {
  float s = 0.0f;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

void axpy(float a, const float* x, float* y, int n) {
  for (int i = 0; i < n; ++i) y[i] += a * x[i];
}

namespace ref {

void gemm_nt(int m, int n, int k, const float* a, const float* b, float* c) {
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double s = 0;
      for (int t = 0; t < k; ++t) s += (double)a[(size_t)i * k + t] * b[(size_t)j * k + t];
      c[(size_t)i * n + j] = (float)s;
    }
}

void rmsnorm(const float* x, const float* w, int n, double eps, float* y) {
  double ss = 0;
  for (int i = 0; i < n; ++i) ss += (double)x[i] * x[i];
  const double r = 1.0 / std::sqrt(ss / n + eps);
  for (int i = 0; i < n; ++i) y[i] = (float)((w ? w[i] : 1.0) * x[i] * r);
}

void softmax(float* x, int n) {
  double mx = x[0];
  for (int i = 1; i < n; ++i) mx = std::max(mx, (double)x[i]);
  double s = 0;
  for (int i = 0; i < n; ++i) s += std::exp(x[i] - mx);
  for (int i = 0; i < n; ++i) x[i] = (float)(std::exp(x[i] - mx) / s);
}

void rope_interleaved(float* x, int n, int n_pairs, const float* cos, const float* sin,
                      bool inverse) {
  for (int i = 0; i < n_pairs; ++i) {
    const int e = n - 2 * n_pairs + 2 * i;
    const double a = x[e], b = x[e + 1];
    const double c = cos[i], s = inverse ? -(double)sin[i] : (double)sin[i];
    x[e] = (float)(a * c - b * s);
    x[e + 1] = (float)(a * s + b * c);
  }
}

void swiglu(const float* gate, const float* up, int n, float limit, float scale, float* out) {
  for (int i = 0; i < n; ++i) {
    double g = gate[i], u = up[i];
    if (limit > 0) {
      u = std::clamp(u, -(double)limit, (double)limit);
      g = std::min(g, (double)limit);
    }
    out[i] = (float)(g / (1.0 + std::exp(-g)) * u * scale);
  }
}

}  // namespace ref
}  // namespace cedar::kernels
