// sparse_attention — see sparse_attention.cuh. One thread block per (row, group of HB heads);
// keys in tiles of TK: the block dequantises a tile into shared memory once for all its heads
// (K = V is shared by every head), scores it, and folds it into per-head running max / sum /
// output (online softmax). Shared memory: q [HB, D] + tile [TK, D] + probabilities [HB, TK] +
// output accumulators [HB, D], fp32.
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/quant_device.cuh"
#include "kernels/cuda/sparse_attention.cuh"

#include <string>

namespace cedar::kernels::cuda {
namespace {

constexpr int k_threads = 256;
constexpr int k_tile = 32;  // keys per tile

__global__ void sparse_attention_kernel(sparse_attention_params p, int hb) {
  extern __shared__ float smem[];
  const int r = blockIdx.x, h0 = blockIdx.y * hb;
  const int nh = min(hb, p.H - h0);
  const int D = p.D;
  float* qs = smem;                   // [hb, D]
  float* ts = qs + hb * D;            // [k_tile, D]
  float* ps = ts + k_tile * D;        // [hb, k_tile]
  float* acc = ps + hb * k_tile;      // [hb, D]
  float* mrun = acc + hb * D;         // [hb] running max
  float* lrun = mrun + hb;            // [hb] running sum of exp
  float* fac = lrun + hb;             // [hb] rescale factor of this tile

  for (int i = threadIdx.x; i < nh * D; i += blockDim.x) {
    qs[i] = p.q[((size_t)r * p.H + h0) * D + i];
    acc[i] = 0.0f;
  }
  for (int h = threadIdx.x; h < nh; h += blockDim.x) {
    mrun[h] = -INFINITY;
    lrun[h] = 0.0f;
  }
  const int nw = p.wn[r];
  const int nc = p.nsel ? p.nsel[r] : 0;
  const int n = nw + nc;
  const size_t wbytes = fp8_swa_bytes(D), mbytes = fp4_kv_bytes(D);
  const uint8_t* wk = p.wkeys[r];
  const uint8_t* mk = nc > 0 ? p.main[r] : nullptr;
  const int ws = p.wstart[r];
  __syncthreads();

  for (int t0 = 0; t0 < n; t0 += k_tile) {
    const int nt = min(k_tile, n - t0);
    // dequantise the tile: [nt, D]
    for (int i = threadIdx.x; i < nt * D; i += blockDim.x) {
      const int j = t0 + i / D, c = i % D;
      float v;
      if (j < nw) {
        const uint8_t* e = wk + (size_t)((ws + j) % p.wcap) * wbytes;
        v = fp8_swa_at(e, D, c);
      } else {
        const uint8_t* e = mk + (size_t)p.sel[(size_t)r * p.K + (j - nw)] * mbytes;
        v = fp4_kv_at(e, D, c);
      }
      ts[i] = v;
    }
    __syncthreads();
    // logits [nh, nt]
    for (int i = threadIdx.x; i < nh * nt; i += blockDim.x) {
      const int h = i / nt, j = i % nt;
      const float* qh = qs + h * D;
      const float* kj = ts + j * D;
      float s = 0.0f;
      for (int c = 0; c < D; ++c) s += qh[c] * kj[c];
      ps[h * k_tile + j] = s * p.scale;
    }
    __syncthreads();
    // per head: new max, rescale factor, probabilities (one thread per head; nt <= 32)
    for (int h = threadIdx.x; h < nh; h += blockDim.x) {
      float m = mrun[h];
      for (int j = 0; j < nt; ++j) m = fmaxf(m, ps[h * k_tile + j]);
      const float f = mrun[h] == -INFINITY ? 0.0f : __expf(mrun[h] - m);
      float l = lrun[h] * f;
      for (int j = 0; j < nt; ++j) {
        const float e = __expf(ps[h * k_tile + j] - m);
        ps[h * k_tile + j] = e;
        l += e;
      }
      mrun[h] = m;
      lrun[h] = l;
      fac[h] = f;
    }
    __syncthreads();
    // acc[h, c] = acc · f + Σ_j p[h, j] · tile[j, c]
    for (int i = threadIdx.x; i < nh * D; i += blockDim.x) {
      const int h = i / D, c = i % D;
      float a = acc[i] * fac[h];
      for (int j = 0; j < nt; ++j) a += ps[h * k_tile + j] * ts[j * D + c];
      acc[i] = a;
    }
    __syncthreads();
  }
  // the sink joins the denominator only
  for (int i = threadIdx.x; i < nh * D; i += blockDim.x) {
    const int h = i / D;
    const float sink = p.sink[h0 + h];
    const float m = fmaxf(mrun[h], sink);
    const float den = lrun[h] * __expf(mrun[h] - m) + __expf(sink - m);
    p.out[((size_t)r * p.H + h0) * D + i] = acc[i] * __expf(mrun[h] - m) / den;
  }
}

}  // namespace

status sparse_attention(const sparse_attention_params& p, cudaStream_t stream) {
  auto bad = [](const std::string& what) {
    return make_error(errc::invalid_argument, "cuda::sparse_attention: " + what);
  };
  if (p.R < 0 || p.H <= 0) return bad("R must be >= 0 and H > 0");
  if (p.D <= 0 || p.D % 32) return bad("head_dim " + std::to_string(p.D) + " is not a positive multiple of 32");
  if (p.R == 0) return {};
  if (!p.q || !p.sink || !p.out || !p.wkeys || !p.wstart || !p.wn) return bad("a required pointer is null");
  if (p.wcap <= 0) return bad("wcap must be > 0");
  if (p.nsel && (!p.main || !p.sel || p.K <= 0)) return bad("nsel given without main/sel/K");
  // heads per block: as many as fit in ~96 KB of shared memory with the tile
  int hb = p.H;
  auto bytes = [&](int h) { return sizeof(float) * ((size_t)2 * h * p.D + (size_t)k_tile * p.D + (size_t)h * k_tile + 3 * (size_t)h); };
  while (hb > 1 && bytes(hb) > 96 * 1024) hb = (hb + 1) / 2;
  if (bytes(hb) > 200 * 1024) return bad("head_dim " + std::to_string(p.D) + " needs too much shared memory");
  const size_t smem = bytes(hb);
  if (smem > 48 * 1024)
    CEDAR_CUDA_TRY(cudaFuncSetAttribute(sparse_attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                   "cuda::sparse_attention: shared memory attribute");
  dim3 grid((unsigned)p.R, (unsigned)((p.H + hb - 1) / hb));
  sparse_attention_kernel<<<grid, k_threads, smem, stream>>>(p, hb);
  CEDAR_CUDA_LAUNCHED("cuda::sparse_attention");
  return {};
}

}  // namespace cedar::kernels::cuda
