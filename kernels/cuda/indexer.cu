// indexer — see indexer.cuh.
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/indexer.cuh"
#include "kernels/cuda/quant_device.cuh"

#include <string>

namespace cedar::kernels::cuda {
namespace {

// ---- scores: grid (ceil(E / 128), R), one thread per entry; q and w of the row in shared ----
// Generic Di: decodes each key channel once per head (the fallback). Di of 32/64/128: the
// entry is decoded ONCE into DI registers and every head's dot product reads q from shared
// memory (the same address across the warp: a broadcast). Same function; the order of the
// fp32 sums differs from the generic kernel's (scale folded into the key value, exact since
// scales are powers of two).
constexpr int k_score_threads = 128;

__device__ __forceinline__ bool score_masked(const index_scores_params& p, int r, int t, float* out) {
  if (t >= p.vis[r] || (p.allowed && !p.allowed[(size_t)r * p.nb + t / p.block])) {
    *out = -INFINITY;
    return true;
  }
  return false;
}

__global__ void index_scores_kernel(index_scores_params p) {
  pdl_entry();
  extern __shared__ float smem[];
  const int r = blockIdx.y, Hi = p.Hi, Di = p.Di;
  float* qs = smem;            // [Hi, Di]
  float* wsh = qs + Hi * Di;   // [Hi]
  for (int i = threadIdx.x; i < Hi * Di; i += blockDim.x) qs[i] = p.q[(size_t)r * Hi * Di + i];
  for (int i = threadIdx.x; i < Hi; i += blockDim.x) wsh[i] = p.w[(size_t)r * Hi + i];
  __syncthreads();
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= p.E) return;
  float* out = p.score + (size_t)r * p.E + t;
  if (score_masked(p, r, t, out)) return;
  const size_t eb = fp4_index_bytes(Di);
  const uint8_t* e = p.keys[r] + (size_t)t * eb;
  float acc = 0.0f;
  for (int h = 0; h < Hi; ++h) {
    const float* qh = qs + h * Di;
    float s = 0.0f;
    for (int c0 = 0; c0 < Di; c0 += 32) {
      const float sc = ue8m0_value(e[Di / 2 + c0 / 32]);
      float part = 0.0f;
      for (int c = c0; c < c0 + 32; c += 2) {
        const uint32_t byte = e[c >> 1];
        part += qh[c] * e2m1_value(byte & 15u) + qh[c + 1] * e2m1_value(byte >> 4);
      }
      s += part * sc;
    }
    acc += fmaxf(s, 0.0f) * p.sscale * wsh[h];
  }
  *out = acc;
}

template <int DI>
__global__ void __launch_bounds__(k_score_threads) index_scores_fixed_kernel(index_scores_params p) {
  pdl_entry();
  extern __shared__ float smem[];
  const int r = blockIdx.y, Hi = p.Hi;
  float* qs = smem;            // [Hi, DI]
  float* wsh = qs + Hi * DI;   // [Hi]
  for (int i = threadIdx.x; i < Hi * DI; i += blockDim.x) qs[i] = p.q[(size_t)r * Hi * DI + i];
  for (int i = threadIdx.x; i < Hi; i += blockDim.x) wsh[i] = p.w[(size_t)r * Hi + i] * p.sscale;
  __syncthreads();
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= p.E) return;
  float* out = p.score + (size_t)r * p.E + t;
  if (score_masked(p, r, t, out)) return;
  const uint8_t* e = p.keys[r] + (size_t)t * fp4_index_bytes(DI);
  float v[DI];
#pragma unroll
  for (int c0 = 0; c0 < DI; c0 += 32) {
    const float sc = ue8m0_value(e[DI / 2 + c0 / 32]);
#pragma unroll
    for (int b = 0; b < 16; ++b) {
      const uint32_t byte = e[c0 / 2 + b];
      v[c0 + 2 * b] = e2m1_value(byte & 15u) * sc;
      v[c0 + 2 * b + 1] = e2m1_value(byte >> 4) * sc;
    }
  }
  float acc = 0.0f;
  for (int h = 0; h < Hi; ++h) {
    const float* qh = qs + h * DI;
    float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
    for (int c = 0; c < DI; c += 2) {
      s0 = fmaf(qh[c], v[c], s0);
      s1 = fmaf(qh[c + 1], v[c + 1], s1);
    }
    acc += fmaxf(s0 + s1, 0.0f) * wsh[h];
  }
  *out = acc;
}

// ---- candidate blocks ------------------------------------------------------------------------
__global__ void block_max_kernel(const float* score, const int* vis, int R, int E, int block, int nb,
                                 float* bscore) {
  pdl_entry();
  const int r = blockIdx.y, b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= nb) return;
  const float* s = score + (size_t)r * E;
  float m = -INFINITY;
  for (int t = b * block; t < min(E, (b + 1) * block); ++t) m = fmaxf(m, s[t]);
  const int last = vis[r] > 0 ? (vis[r] - 1) / block : -1;
  bscore[(size_t)r * nb + b] = b == last ? INFINITY : m;
}

// ---- top-k: radix select, one block per row ------------------------------------------------
constexpr int k_topk_threads = 512;

__device__ inline uint32_t order_key(float x) {
  // order-preserving map of fp32 to uint32 (larger float -> larger key); -0 folds onto +0
  uint32_t b = __float_as_uint(x + 0.0f);
  return b & 0x80000000u ? ~b : b | 0x80000000u;
}

__global__ void topk_kernel(const float* score, int E, int K, int32_t* ids, int* nout) {
  pdl_entry();
  __shared__ uint32_t hist[256];
  __shared__ uint32_t s_prefix, s_mask, s_need;
  __shared__ int s_count[k_topk_threads];
  __shared__ int s_ties[k_topk_threads];
  const int r = blockIdx.x;
  const float* s = score + (size_t)r * E;
  const uint32_t neg_inf_key = order_key(-INFINITY);
  // finite entries (> -inf) are the candidates
  int nfin = 0;
  for (int t = threadIdx.x; t < E; t += blockDim.x) nfin += order_key(s[t]) > neg_inf_key;
  s_count[threadIdx.x] = nfin;
  __syncthreads();
  for (int st = blockDim.x / 2; st > 0; st >>= 1) {
    if ((int)threadIdx.x < st) s_count[threadIdx.x] += s_count[threadIdx.x + st];
    __syncthreads();
  }
  const int finite = s_count[0];
  __syncthreads();
  const int k = min(K, finite);
  // threshold = the k-th largest key, found 8 bits at a time from the top
  if (threadIdx.x == 0) {
    s_prefix = 0;
    s_mask = 0;
    s_need = (uint32_t)k;
  }
  __syncthreads();
  if (k > 0) {
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
      __syncthreads();
      const uint32_t prefix = s_prefix, mask = s_mask;
      for (int t = threadIdx.x; t < E; t += blockDim.x) {
        const uint32_t key = order_key(s[t]);
        if (key > neg_inf_key && (key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        uint32_t need = s_need;
        int digit = 255;
        for (; digit > 0; --digit) {
          if (hist[digit] >= need) break;
          need -= hist[digit];
        }
        s_prefix = prefix | ((uint32_t)digit << shift);
        s_mask = mask | (255u << shift);
        s_need = need;  // how many entries equal to the threshold to take (lowest ids first)
      }
      __syncthreads();
    }
  }
  const uint32_t thr = s_prefix;
  const int need_ties = (int)s_need;
  // compaction in id order: each thread owns a contiguous range of ids
  const int chunk = (E + blockDim.x - 1) / blockDim.x;
  const int lo = threadIdx.x * chunk, hi = min(E, lo + chunk);
  int above = 0, ties = 0;
  if (k > 0)
    for (int t = lo; t < hi; ++t) {
      const uint32_t key = order_key(s[t]);
      above += key > thr;
      ties += key == thr;
    }
  s_count[threadIdx.x] = above;
  s_ties[threadIdx.x] = ties;
  __syncthreads();
  if (threadIdx.x == 0) {  // exclusive prefix sums (blockDim entries; cheap next to the scans)
    int a = 0, b = 0;
    for (int i = 0; i < (int)blockDim.x; ++i) {
      const int ca = s_count[i], cb = s_ties[i];
      s_count[i] = a;
      s_ties[i] = b;
      a += ca;
      b += cb;
    }
  }
  __syncthreads();
  if (k > 0) {
    int tie_rank = s_ties[threadIdx.x];
    // position of an id in the output = entries above the threshold before it + ties taken before it
    int out_pos = s_count[threadIdx.x] + min(tie_rank, need_ties);
    for (int t = lo; t < hi; ++t) {
      const uint32_t key = order_key(s[t]);
      if (key > thr) {
        ids[(size_t)r * K + out_pos++] = t;
      } else if (key == thr) {
        if (tie_rank < need_ties) ids[(size_t)r * K + out_pos++] = t;
        ++tie_rank;
      }
    }
  }
  if (threadIdx.x == 0) nout[r] = k;
}

__global__ void ids_to_mask_kernel(const int32_t* ids, const int* n, int K, int nb, uint8_t* allowed) {
  pdl_entry();
  const int r = blockIdx.x;
  uint8_t* m = allowed + (size_t)r * nb;
  for (int b = threadIdx.x; b < nb; b += blockDim.x) m[b] = 0;
  __syncthreads();
  for (int j = threadIdx.x; j < n[r]; j += blockDim.x) m[ids[(size_t)r * K + j]] = 1;
}

}  // namespace

status ids_to_mask(const int32_t* ids, const int* n, int R, int K, int nb, uint8_t* allowed,
                   cudaStream_t stream) {
  if (R < 0 || K <= 0 || nb <= 0)
    return make_error(errc::invalid_argument, "cuda::ids_to_mask: R " + std::to_string(R) + ", K " +
                                                  std::to_string(K) + ", nb " + std::to_string(nb));
  if (R == 0) return {};
  launch_kernel(ids_to_mask_kernel, (unsigned)R, 128, 0, stream, ids, n, K, nb, allowed);
  CEDAR_CUDA_LAUNCHED("cuda::ids_to_mask");
  return {};
}

status index_scores(const index_scores_params& p, cudaStream_t stream) {
  auto bad = [](const std::string& what) { return make_error(errc::invalid_argument, "cuda::index_scores: " + what); };
  if (p.R < 0 || p.E < 0 || p.Hi <= 0) return bad("R, E must be >= 0 and Hi > 0");
  if (p.Di <= 0 || p.Di % 32) return bad("index_head_dim " + std::to_string(p.Di) + " is not a positive multiple of 32");
  if (p.R == 0 || p.E == 0) return {};
  if (!p.q || !p.w || !p.keys || !p.vis || !p.score) return bad("a required pointer is null");
  if (p.allowed && (p.block <= 0 || p.nb < (p.E + p.block - 1) / p.block)) return bad("allowed mask without block/nb");
  const size_t smem = sizeof(float) * ((size_t)p.Hi * p.Di + p.Hi);
  if (smem > 48 * 1024) return bad("Hi·Di too large for one block's query");
  dim3 grid((unsigned)((p.E + k_score_threads - 1) / k_score_threads), (unsigned)p.R);
  switch (p.Di) {
    case 32: launch_kernel(index_scores_fixed_kernel<32>, grid, k_score_threads, smem, stream, p); break;
    case 64: launch_kernel(index_scores_fixed_kernel<64>, grid, k_score_threads, smem, stream, p); break;
    case 128: launch_kernel(index_scores_fixed_kernel<128>, grid, k_score_threads, smem, stream, p); break;
    default: launch_kernel(index_scores_kernel, grid, k_score_threads, smem, stream, p); break;
  }
  CEDAR_CUDA_LAUNCHED("cuda::index_scores");
  return {};
}

status block_max(const float* score, const int* vis, int R, int E, int block, int nb, float* bscore,
                 cudaStream_t stream) {
  if (block <= 0 || nb < (E + block - 1) / block)
    return make_error(errc::invalid_argument, "cuda::block_max: block " + std::to_string(block) + ", nb " + std::to_string(nb));
  if (R == 0 || nb == 0) return {};
  dim3 grid((unsigned)((nb + 127) / 128), (unsigned)R);
  launch_kernel(block_max_kernel, grid, 128, 0, stream, score, vis, R, E, block, nb, bscore);
  CEDAR_CUDA_LAUNCHED("cuda::block_max");
  return {};
}

status topk(const float* score, int R, int E, int K, int32_t* ids, int* n, cudaStream_t stream) {
  if (R < 0 || E < 0 || K <= 0)
    return make_error(errc::invalid_argument, "cuda::topk: R " + std::to_string(R) + ", E " + std::to_string(E) +
                                                  ", K " + std::to_string(K));
  if (R == 0) return {};
  launch_kernel(topk_kernel, (unsigned)R, k_topk_threads, 0, stream, score, E, K, ids, n);
  CEDAR_CUDA_LAUNCHED("cuda::topk");
  return {};
}

}  // namespace cedar::kernels::cuda
