// engram — see engram.cuh. One block per (row, stream): three block sums, then the update.
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/engram.cuh"

#include <string>

namespace cedar::kernels::cuda {
namespace {

__global__ void engram_gate_kernel(float* X, const float* kv, const float* qk, int hc, int d, float eps) {
  pdl_entry();
  __shared__ float part[3][32];
  const int r = blockIdx.x, k = blockIdx.y;
  float* h = X + ((size_t)r * hc + k) * d;
  const float* key = kv + (size_t)r * (hc + 1) * d + (size_t)k * d;
  const float* value = kv + (size_t)r * (hc + 1) * d + (size_t)hc * d;
  const float* q = qk + (size_t)k * d;
  float hh = 0.0f, kk = 0.0f, dt = 0.0f;
  struct hkq {
    float h, k, q;
  };
  strided_batched<8, hkq>(
      d, [&](int i) { return hkq{h[i], key[i], q[i]}; },
      [&](int, const hkq& v) {
        hh += v.h * v.h;
        kk += v.k * v.k;
        dt += v.h * v.q * v.k;
      });
  for (int off = 16; off; off >>= 1) {
    hh += __shfl_xor_sync(0xffffffffu, hh, off);
    kk += __shfl_xor_sync(0xffffffffu, kk, off);
    dt += __shfl_xor_sync(0xffffffffu, dt, off);
  }
  const int w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  if ((threadIdx.x & 31) == 0) {
    part[0][w] = hh;
    part[1][w] = kk;
    part[2][w] = dt;
  }
  __syncthreads();
  hh = kk = dt = 0.0f;
  for (int i = 0; i < nw; ++i) {
    hh += part[0][i];
    kk += part[1][i];
    dt += part[2][i];
  }
  const float rstd = (1.0f / sqrtf(hh / d + eps)) * (1.0f / sqrtf(kk / d + eps));
  const float dot = dt * rstd / sqrtf((float)d);
  const float mag = sqrtf(fmaxf(fabsf(dot), 1e-6f));
  const float gate = sigmoid_stable(copysignf(mag, dot));
  __syncthreads();  // every thread read h for the sums before any writes it
  struct hv {
    float h, v;
  };
  strided_batched<8, hv>(
      d, [&](int i) { return hv{h[i], value[i]}; }, [&](int i, const hv& t) { h[i] = t.h + gate * t.v; });
}

}  // namespace

status engram_gate(float* X, const float* kv, const float* qk, int R, int hc, int d, float eps, cudaStream_t stream) {
  if (R <= 0 || hc <= 0 || d <= 0 || !X || !kv || !qk)
    return make_error(errc::invalid_argument, "engram_gate: bad shape (rows " + std::to_string(R) + ", hc " +
                                                  std::to_string(hc) + ", d " + std::to_string(d) + ") or null pointer");
  launch_kernel(engram_gate_kernel, dim3((unsigned)R, (unsigned)hc), 256, 0, stream, X, kv, qk, hc, d, eps);
  CEDAR_CUDA_LAUNCHED("engram_gate");
  return {};
}

}  // namespace cedar::kernels::cuda
