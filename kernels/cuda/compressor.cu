// compressor — see compressor.cuh. One block per row, a thread per channel.
#include "kernels/cuda/compressor.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/launch.cuh"

#include <string>

namespace cedar::kernels::cuda {
namespace {

__global__ void compressor_kernel(compressor_params p) {
  pdl_entry();
  extern __shared__ float lat[];  // [hd]
  __shared__ float part[32];
  const int r = blockIdx.x, hd = p.hd;
  const float* kr = p.kv + (size_t)r * hd;
  const int np = p.ratio > 1 ? p.n_pending[r] : 0;
  // (loads in batches, strided_batched and the pending loop below: a rolled loop pays one round
  // trip to memory per iteration)
  if (p.ratio > 1 && np < p.ratio - 1) {
    const float* gr = p.gate + (size_t)r * hd;
    float* pk = p.pending_kv[r] + (size_t)np * hd;
    float* pg = p.pending_gate[r] + (size_t)np * hd;
    strided_batched<4, float2>(
        hd, [&](int ch) { return make_float2(kr[ch], gr[ch]); },
        [&](int ch, const float2& v) { pk[ch] = v.x, pg[ch] = v.y; });
    return;
  }
  float ss = 0.0f;
  for (int ch = threadIdx.x; ch < hd; ch += blockDim.x) {
    float v = kr[ch];
    if (p.ratio > 1) {
      const float g = p.gate[(size_t)r * hd + ch];
      const float* pk = p.pending_kv[r];
      const float* pg = p.pending_gate[r];
      // the pending rows k_batch at a time, their loads issued together; the maximum first, then
      // the weighted sums in the rows' order (the values of a batch that holds them all are kept)
      constexpr int k_batch = 4;
      float gb[k_batch], kb[k_batch];
      auto load = [&](int j0) {
#pragma unroll
        for (int u = 0; u < k_batch; ++u)
          if (j0 + u < np) gb[u] = pg[(size_t)(j0 + u) * hd + ch], kb[u] = pk[(size_t)(j0 + u) * hd + ch];
      };
      float mx = g;
      for (int j0 = 0; j0 < np; j0 += k_batch) {
        load(j0);
#pragma unroll
        for (int u = 0; u < k_batch; ++u)
          if (j0 + u < np) mx = fmaxf(mx, gb[u]);
      }
      float den = expf(g - mx), num = den * v;
      for (int j0 = 0; j0 < np; j0 += k_batch) {
        if (np > k_batch) load(j0);
#pragma unroll
        for (int u = 0; u < k_batch; ++u)
          if (j0 + u < np) {
            const float ew = expf(gb[u] - mx);
            den += ew;
            num += ew * kb[u];
          }
      }
      v = num / den;
    }
    lat[ch] = v;
    ss += v * v;
  }
  for (int off = 16; off; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
  __syncthreads();
  float tot = 0.0f;
  for (int i = 0; i < (int)(blockDim.x >> 5); ++i) tot += part[i];
  const float inv = 1.0f / sqrtf(tot / (float)hd + p.eps);
  for (int ch = threadIdx.x; ch < hd; ch += blockDim.x) p.latent[(size_t)r * hd + ch] = p.norm[ch] * (lat[ch] * inv);
}

}  // namespace

status compressor_step(const compressor_params& p, cudaStream_t stream) {
  if (p.R <= 0 || p.hd <= 0 || p.ratio < 1 || !p.kv || !p.norm || !p.latent ||
      (p.ratio > 1 && (!p.gate || !p.pending_kv || !p.pending_gate || !p.n_pending)))
    return make_error(errc::invalid_argument, "compressor_step: bad shape (rows " + std::to_string(p.R) + ", hd " +
                                                  std::to_string(p.hd) + ", ratio " + std::to_string(p.ratio) +
                                                  ") or null pointer");
  launch_kernel(compressor_kernel, p.R, 128, sizeof(float) * (size_t)p.hd, stream, p);
  CEDAR_CUDA_LAUNCHED("compressor_step");
  return {};
}

}  // namespace cedar::kernels::cuda
