// indexer — see indexer.cuh.
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/indexer.cuh"
#include "kernels/cuda/quant_device.cuh"

#include <cooperative_groups.h>

#include <atomic>
#include <string>

namespace cedar::kernels::cuda {
namespace {

namespace cg = cooperative_groups;

// ---- scores: grid (ceil(E / k_score_threads), R), one thread per entry; q and w of the row in shared ----
// Generic Di: decodes each key channel once per head (the fallback). Di of 32/64/128: the
// entry is decoded ONCE into DI registers and every head's dot product reads q from shared
// memory (the same address across the warp: a broadcast). Same function; the order of the
// fp32 sums differs from the generic kernel's (scale folded into the key value, exact since
// scales are powers of two).
constexpr int k_score_threads = 64;  // (an 8K-entry row: 128 blocks, one per multiprocessor or so)

__device__ __forceinline__ bool score_masked(const index_scores_params& p, int r, int t, float* out) {
  if (t >= p.vis[r] || (p.allowed && !p.allowed[(size_t)r * p.nb + t / p.block])) {
    *out = -INFINITY;
    return true;
  }
  return false;
}

// Row r's index queries [n floats] into shared memory, their loads in batches (float4 when
// aligned: n is a multiple of 32).
__device__ __forceinline__ void stage_query(const float* q, float* qs, int n) {
  if ((reinterpret_cast<uintptr_t>(q) & 15u) == 0) {
    const float4* q4 = reinterpret_cast<const float4*>(q);
    float4* s4 = reinterpret_cast<float4*>(qs);
    strided_batched<8, float4>(n / 4, [&](int i) { return __ldg(q4 + i); }, [&](int i, const float4& v) { s4[i] = v; });
  } else {
    strided_batched<8, float>(n, [&](int i) { return __ldg(q + i); }, [&](int i, float v) { qs[i] = v; });
  }
}

__global__ void index_scores_kernel(index_scores_params p) {
  pdl_entry();
  extern __shared__ float smem[];
  const int r = blockIdx.y, Hi = p.Hi, Di = p.Di;
  float* qs = smem;            // [Hi, Di]
  float* wsh = qs + Hi * Di;   // [Hi]
  stage_query(p.q + (size_t)r * Hi * Di, qs, Hi * Di);
  for (int i = threadIdx.x; i < Hi; i += blockDim.x) wsh[i] = p.w[(size_t)r * Hi + i] * p.wscale;
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
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  // the row's loads before the query's, so that the entry's two round trips (the row's count and
  // key pointer, then the entry) overlap the query's: the codes as 4-byte words (DI/8 loads; an
  // entry of 68 bytes at DI 128 starts aligned; the alignment tested once) rather than 68 byte
  // loads per thread; entries past vis[r] are not read (the store may end there)
  const bool in = t < p.E;
  // (volatile: loaded with vis[r], not sunk behind the test on it)
  const uint8_t* base = *static_cast<const uint8_t* const volatile*>(p.keys + r);
  const bool live = in && t < p.vis[r];
  uint32_t cw[DI / 8];
  uint8_t sb[DI / 32];
  const uint8_t* e = live ? base + (size_t)t * fp4_index_bytes(DI) : nullptr;
  if (live) {
    if ((reinterpret_cast<uintptr_t>(e) & 3u) == 0) {
#pragma unroll
      for (int k = 0; k < DI / 8; ++k) cw[k] = __ldg(reinterpret_cast<const uint32_t*>(e) + k);
    } else {
#pragma unroll
      for (int k = 0; k < DI / 8; ++k) cw[k] = load4(e + 4 * k);
    }
#pragma unroll
    for (int k = 0; k < DI / 32; ++k) sb[k] = e[DI / 2 + k];
  }
  stage_query(p.q + (size_t)r * Hi * DI, qs, Hi * DI);
  for (int i = threadIdx.x; i < Hi; i += blockDim.x) wsh[i] = p.w[(size_t)r * Hi + i] * p.wscale * p.sscale;
  __syncthreads();
  if (!in) return;
  float* out = p.score + (size_t)r * p.E + t;
  if (score_masked(p, r, t, out)) return;
  float v[DI];
#pragma unroll
  for (int c0 = 0; c0 < DI; c0 += 32) {
    const float sc = ue8m0_value(sb[c0 / 32]);
#pragma unroll
    for (int b = 0; b < 16; ++b) {
      const uint32_t byte = (cw[(c0 / 2 + b) >> 2] >> (8 * ((c0 / 2 + b) & 3))) & 0xFFu;
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
  const int t1 = min(E, (b + 1) * block);
  for (int t0 = b * block; t0 < t1; t0 += 8) {  // 8 loads in flight, then their maximum
    float v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) v[u] = t0 + u < t1 ? s[t0 + u] : -INFINITY;
#pragma unroll
    for (int u = 0; u < 8; ++u) m = fmaxf(m, v[u]);
  }
  const int last = vis[r] > 0 ? (vis[r] - 1) / block : -1;
  bscore[(size_t)r * nb + b] = b == last ? INFINITY : m;
}

// ---- top-k: radix select, one block per row ------------------------------------------------
// Thread t owns the contiguous ids [t·C, t·C + C) (C = ceil(E / threads), rounded up to a power
// of two ≤ 32 so the keys stay in registers: the row is read from memory once; past 16384 ids,
// C = 0 reads the row from global memory at every pass). The threshold — the k-th largest
// key — is found 8 bits at a time from the top: a shared histogram per pass, then warp 0 scans
// the 256 bins (8 per lane) and picks the digit while the other warps clear the next pass's
// histogram — two barriers a pass (a block-wide scan per pass cost five; at batch 1 the kernel
// was barrier-bound: ncu, session 40). It stops early once the choice is made (every finite key
// taken, or the chosen bin taken whole). The ids above the threshold, and the lowest-id ties,
// are written in id order at positions from one block-wide exclusive scan of both counts.
// (Session 38's CEDAR_CUDA_TOPK_SPREAD — one histogram copy per lane, against the first pass's
// bank conflicts — measured no faster on an H200 in session 39 and is gone with this form.)
constexpr int k_topk_threads = 512;
constexpr int k_topk_bins = 256;

__device__ inline uint32_t order_key(float x) {
  // order-preserving map of fp32 to uint32 (larger float -> larger key); -0 folds onto +0
  uint32_t b = __float_as_uint(x + 0.0f);
  return b & 0x80000000u ? ~b : b | 0x80000000u;
}

// Exclusive prefix sum of v over the block (blockDim.x a multiple of 32, ≤ 1024); *total gets
// the block's sum. tot: shared scratch of 32 ints. Every thread must call it.
__device__ int block_exclusive_scan(int v, int* tot, int* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  int x = v;
  for (int off = 1; off < 32; off <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, x, off);
    if (lane >= off) x += y;
  }
  if (lane == 31) tot[warp] = x;
  __syncthreads();
  if (warp == 0) {
    int t = lane < nw ? tot[lane] : 0;
    for (int off = 1; off < 32; off <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, t, off);
      if (lane >= off) t += y;
    }
    tot[lane] = t;
  }
  __syncthreads();
  *total = tot[nw - 1];
  const int r = (warp ? tot[warp - 1] : 0) + x - v;
  __syncthreads();
  return r;
}

// The keys of ids [lo, lo + C) of row s into registers (−inf past E): float4 loads when C and
// E are multiples of 4 and the scores 16-byte aligned (E and lo multiples of 4: a float4 is all
// in or all out), else one by one.
template <int C>
__device__ __forceinline__ void load_keys(const float* s, int E, int lo, bool aligned, uint32_t (&key)[C]) {
  const uint32_t neg_inf_key = order_key(-INFINITY);
  if constexpr (C % 4 == 0) {
    if (aligned && E % 4 == 0) {
#pragma unroll
      for (int j = 0; j < C; j += 4) {
        if (lo + j < E) {
          const float4 v = *reinterpret_cast<const float4*>(s + lo + j);
          key[j] = order_key(v.x), key[j + 1] = order_key(v.y), key[j + 2] = order_key(v.z), key[j + 3] = order_key(v.w);
        } else {
          key[j] = key[j + 1] = key[j + 2] = key[j + 3] = neg_inf_key;
        }
      }
      return;
    }
  }
#pragma unroll
  for (int j = 0; j < C; ++j) key[j] = lo + j < E ? order_key(s[lo + j]) : neg_inf_key;
}

// Ids lo + j of the keys above the threshold, and of the ties while fewer than need_ties were
// taken before them (tie_rank: ties of lower ids), at o[out_pos], o[out_pos + 1], ... in id order.
template <int C>
__device__ __forceinline__ void write_selected(const uint32_t (&key)[C], uint32_t thr, int lo, int need_ties, int out_pos,
                                               int tie_rank, int32_t* o) {
#pragma unroll
  for (int j = 0; j < C; ++j) {
    if (key[j] > thr) {
      o[out_pos++] = lo + j;
    } else if (key[j] == thr) {
      if (tie_rank < need_ties) o[out_pos++] = lo + j;
      ++tie_rank;
    }
  }
}

// Warp 0's digit choice of a pass: lane l takes the bins of digits 255 − 8l … 248 − 8l (from
// the top), a warp scan gives the keys above each, and the lane whose bin holds the need-th
// largest key publishes the new prefix / mask / need. At pass 0 (prefix 0) the bins hold every
// finite key: their total fixes k = min(K, finite) (s_k). Two early ends (s_done): every finite
// key is taken (threshold −inf, no ties), or the chosen bin is taken whole (threshold one below
// the bin's first key, no ties) — the same ids the remaining passes would find.
__device__ __forceinline__ void topk_pick_digit(const uint32_t* bins, int shift, bool first, int K, uint32_t* s_prefix,
                                                uint32_t* s_mask, int* s_need, int* s_k, int* s_done) {
  const int lane = (int)threadIdx.x & 31;
  const uint32_t neg_inf_key = order_key(-INFINITY);
  const uint32_t prefix = *s_prefix, mask = *s_mask;
  int need = *s_need;
  const uint4 hi = *reinterpret_cast<const uint4*>(bins + 252 - 8 * lane);  // digits 255−8l … 252−8l
  const uint4 lo4 = *reinterpret_cast<const uint4*>(bins + 248 - 8 * lane);
  const uint32_t c[8] = {hi.w, hi.z, hi.y, hi.x, lo4.w, lo4.z, lo4.y, lo4.x};
  int sum = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) sum += (int)c[j];
  int incl = sum;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl += y;
  }
  if (first) {
    const int total = __shfl_sync(0xffffffffu, incl, 31);
    need = min(K, total);
    if (lane == 0) *s_k = need;
    if (need == 0 || need == total) {  // nothing finite, or every finite key taken
      if (lane == 0) *s_prefix = neg_inf_key, *s_need = 0, *s_done = 1;
      return;
    }
  }
  int before = incl - sum;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    if (before < need && before + (int)c[j] >= need) {
      const uint32_t np = prefix | ((uint32_t)(255 - 8 * lane - j) << shift);
      const int rest = need - before;
      if (rest == (int)c[j] && np > neg_inf_key + 1u) {  // the whole bin: every key >= np
        *s_prefix = np - 1u, *s_need = 0, *s_done = 1;
      } else {
        *s_prefix = np, *s_mask = mask | (255u << shift), *s_need = rest;
      }
    }
    before += (int)c[j];
  }
}

template <int C>
__global__ void __launch_bounds__(k_topk_threads) topk_kernel(const float* score, int E, int K, int32_t* ids,
                                                               int* nout) {
  pdl_entry();
  // two histograms [2][bin] by pass parity: the one the next pass counts into is cleared while
  // warp 0 picks this pass's digit (two barriers a pass)
  __shared__ __align__(16) uint32_t hist[2 * k_topk_bins];
  __shared__ int tot[32];
  __shared__ uint32_t s_prefix, s_mask;
  __shared__ int s_need, s_k, s_done;
  const int r = blockIdx.x;
  const float* s = score + (size_t)r * E;
  const uint32_t neg_inf_key = order_key(-INFINITY);
  const int chunk = C > 0 ? C : (E + (int)blockDim.x - 1) / (int)blockDim.x;
  const int lo = (int)threadIdx.x * chunk, hi = min(E, lo + chunk);
  uint32_t key[C > 0 ? C : 1];
  if constexpr (C > 0) load_keys<C>(s, E, lo, (reinterpret_cast<uintptr_t>(score) & 15u) == 0, key);
  // the key of id lo + j (j < chunk); −inf past E
#define CEDAR_TOPK_KEY(j) (C > 0 ? key[(j) < C ? (j) : 0] : (lo + (j) < hi ? order_key(s[lo + (j)]) : neg_inf_key))
  const int warp = (int)threadIdx.x >> 5;
  for (int i = threadIdx.x; i < k_topk_bins; i += blockDim.x) hist[i] = 0;
  if (threadIdx.x == 0) s_prefix = 0, s_mask = 0, s_need = K, s_k = 0, s_done = 0;
  __syncthreads();
  int pass = 0;
  for (int shift = 24; shift >= 0; shift -= 8, ++pass) {
    const uint32_t prefix = s_prefix, mask = s_mask;
    uint32_t* h = hist + (pass & 1) * k_topk_bins;
    if constexpr (C > 0) {
#pragma unroll
      for (int j = 0; j < C; ++j)
        if (key[j] > neg_inf_key && (key[j] & mask) == prefix) atomicAdd(&h[(key[j] >> shift) & 255u], 1u);
    } else {
      for (int j = 0; j < chunk; ++j) {
        const uint32_t kk = CEDAR_TOPK_KEY(j);
        if (kk > neg_inf_key && (kk & mask) == prefix) atomicAdd(&h[(kk >> shift) & 255u], 1u);
      }
    }
    __syncthreads();
    if (warp == 0) {
      topk_pick_digit(h, shift, pass == 0, K, &s_prefix, &s_mask, &s_need, &s_k, &s_done);
    } else if ((int)threadIdx.x - 32 < k_topk_bins) {
      hist[((pass + 1) & 1) * k_topk_bins + (int)threadIdx.x - 32] = 0;
    }
    __syncthreads();
    if (s_done) break;
  }
  const int k = s_k;
  const uint32_t thr = s_prefix;
  const int need_ties = s_need;
  // compaction in id order: each thread owns a contiguous range of ids
  int above = 0, ties = 0;
  if (k > 0) {
    if constexpr (C > 0) {
#pragma unroll
      for (int j = 0; j < C; ++j) above += key[j] > thr, ties += key[j] == thr;
    } else {
      for (int j = 0; j < chunk; ++j) {
        const uint32_t kk = CEDAR_TOPK_KEY(j);
        above += kk > thr, ties += kk == thr;
      }
    }
  }
  int above_before = 0, tie_rank = 0, n_all = 0;
  if (E < 65536) {  // both counts in one scan (each total < 2^16)
    const int both = block_exclusive_scan(above | ties << 16, tot, &n_all);
    above_before = both & 0xffff, tie_rank = both >> 16;
  } else {
    above_before = block_exclusive_scan(above, tot, &n_all);
    tie_rank = block_exclusive_scan(ties, tot, &n_all);
  }
  if (k > 0) {
    // position of an id in the output = entries above the threshold before it + ties taken before it
    int out_pos = above_before + min(tie_rank, need_ties);
    int32_t* o = ids + (size_t)r * K;
    if constexpr (C > 0) {
      write_selected<C>(key, thr, lo, need_ties, out_pos, tie_rank, o);
    } else {
      for (int j = 0; j < chunk; ++j) {
        const uint32_t kk = CEDAR_TOPK_KEY(j);
        if (kk > thr) {
          o[out_pos++] = lo + j;
        } else if (kk == thr) {
          if (tie_rank < need_ties) o[out_pos++] = lo + j;
          ++tie_rank;
        }
      }
    }
  }
#undef CEDAR_TOPK_KEY
  if (threadIdx.x == 0) nout[r] = k;
}

// ---- top-k of a few rows: a thread block cluster per row ----------------------------------------
// The same radix select and compaction, the row's ids cut into k_topk_cl contiguous slices, one
// block each (thread t of block s owns ids s·k_topk_cl_threads·C + [t·C, t·C + C)): each block
// counts its keys into its own histogram (lane copies, as above), the cluster's blocks read one
// another's bin counts through distributed shared memory and every block picks the same digit;
// the compaction adds the counts of the lower slices. One block per row left a row's 8–16K keys
// to one multiprocessor (9–15 µs per launch in a batch-1 step); 8 take an eighth each.
constexpr int k_topk_cl = 8;            // blocks per row (the portable cluster size)
constexpr int k_topk_cl_threads = 256;

template <int C>
__global__ void __launch_bounds__(k_topk_cl_threads) topk_cluster_kernel(const float* score, int E, int K, int32_t* ids,
                                                                         int* nout) {
  pdl_entry();
  cg::cluster_group cl = cg::this_cluster();
  __shared__ __align__(16) uint32_t hist[k_topk_bins * 32];  // [bin][lane]
  __shared__ uint32_t cnt[2][k_topk_bins];                    // this block's bins, pass parity (read by the cluster)
  __shared__ int xch[3];                                      // finite keys, keys above, ties (read by the cluster)
  __shared__ int tot[32];
  __shared__ uint32_t s_prefix, s_mask;
  __shared__ int s_need;
  const int r = blockIdx.y, sb = (int)cl.block_rank();
  const int lane = (int)threadIdx.x & 31, warp = (int)threadIdx.x >> 5, nw = k_topk_cl_threads / 32;
  const float* s = score + (size_t)r * E;
  const uint32_t neg_inf_key = order_key(-INFINITY);
  const int lo = (sb * k_topk_cl_threads + (int)threadIdx.x) * C;
  uint32_t key[C];
  load_keys<C>(s, E, lo, (reinterpret_cast<uintptr_t>(score) & 15u) == 0, key);
  int nfin = 0;
#pragma unroll
  for (int j = 0; j < C; ++j) nfin += key[j] > neg_inf_key;
  int fin_block = 0;
  (void)block_exclusive_scan(nfin, tot, &fin_block);
  if (threadIdx.x == 0) {
    xch[0] = fin_block;
    s_prefix = 0;
    s_mask = 0;
  }
  cl.sync();
  int finite = 0;
  for (int q = 0; q < k_topk_cl; ++q) finite += *cl.map_shared_rank(xch, q);
  const int k = min(K, finite);
  if (threadIdx.x == 0) s_need = k;
  __syncthreads();
  if (k > 0) {
    int pass = 0;
    for (int shift = 24; shift >= 0; shift -= 8, ++pass) {
      for (int i = threadIdx.x; i < k_topk_bins * 32 / 4; i += k_topk_cl_threads)
        reinterpret_cast<uint4*>(hist)[i] = make_uint4(0, 0, 0, 0);
      __syncthreads();
      const uint32_t prefix = s_prefix, mask = s_mask;
      const int need = s_need;
#pragma unroll
      for (int j = 0; j < C; ++j)
        if (key[j] > neg_inf_key && (key[j] & mask) == prefix) atomicAdd(&hist[(((key[j] >> shift) & 255u) << 5) + lane], 1u);
      __syncthreads();
      uint32_t* mine = cnt[pass & 1];
      for (int b = warp; b < k_topk_bins; b += nw) {
        const uint32_t c = __reduce_add_sync(0xffffffffu, hist[b * 32 + lane]);
        if (lane == 0) mine[b] = c;
      }
      // every block's counts complete (and a block writes this parity again only after the next
      // sync, when every block has read it)
      cl.sync();
      int h = 0;
      if (threadIdx.x < k_topk_bins)
        for (int q = 0; q < k_topk_cl; ++q) h += (int)*cl.map_shared_rank(mine + 255 - threadIdx.x, q);
      int all = 0;
      const int before = block_exclusive_scan(h, tot, &all);
      if (threadIdx.x < k_topk_bins && before < need && before + h >= need) {
        s_prefix = prefix | ((uint32_t)(255 - threadIdx.x) << shift);
        s_mask = mask | (255u << shift);
        s_need = need - before;
      }
      __syncthreads();
    }
  }
  const uint32_t thr = s_prefix;
  const int need_ties = s_need;
  int above = 0, ties = 0;
  if (k > 0) {
#pragma unroll
    for (int j = 0; j < C; ++j) above += key[j] > thr, ties += key[j] == thr;
  }
  int n_above = 0, n_ties = 0;
  int above_before = block_exclusive_scan(above, tot, &n_above);
  int tie_rank = block_exclusive_scan(ties, tot, &n_ties);
  if (threadIdx.x == 0) xch[1] = n_above, xch[2] = n_ties;
  cl.sync();
  for (int q = 0; q < sb; ++q) {  // the lower slices come first in id order
    above_before += *cl.map_shared_rank(xch + 1, q);
    tie_rank += *cl.map_shared_rank(xch + 2, q);
  }
  if (k > 0) {
    int out_pos = above_before + min(tie_rank, need_ties);
    write_selected<C>(key, thr, lo, need_ties, out_pos, tie_rank, ids + (size_t)r * K);
  }
  if (threadIdx.x == 0 && sb == 0) nout[r] = k;
  cl.sync();  // no block leaves while another may still read its shared memory
}

__global__ void ids_to_mask_kernel(const int32_t* ids, const int* n, int K, int nb, uint8_t* allowed) {
  pdl_entry();
  const int r = blockIdx.x;
  uint8_t* m = allowed + (size_t)r * nb;
  const int nr = n[r];  // (its load goes out before the clearing stores)
  for (int b = threadIdx.x; b < nb; b += blockDim.x) m[b] = 0;
  __syncthreads();
  const int32_t* ir = ids + (size_t)r * K;
  strided_batched<8, int32_t>(nr, [&](int j) { return ir[j]; }, [&](int, int32_t id) { m[id] = 1; });
}

std::atomic<int> g_topk_cluster{-1};  // set_topk_cluster (tests, benchmarks); −1: the environment's

}  // namespace

void set_topk_cluster(int on) { g_topk_cluster = on < 0 ? -1 : on ? 1 : 0; }

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
  // (the cluster kernel: GPU-tested, measured no faster, off by default)
  // a cluster per row for the rows of a small step (up to 16 rows: a block per multiprocessor
  // or so) long enough to share, up to 32 ids per thread of the cluster
  static const bool cluster_env = env_choice("CEDAR_CUDA_TOPK_CLUSTER", 0, 1, 0) != 0;
  const int forced = g_topk_cluster.load();
  const bool cluster = (forced >= 0 ? forced != 0 : cluster_env) && R <= 16 && E > 2048 &&
                       E <= k_topk_cl * k_topk_cl_threads * 32;
  if (cluster) {
    const int per_cl = (E + k_topk_cl * k_topk_cl_threads - 1) / (k_topk_cl * k_topk_cl_threads);
    const dim3 grid(k_topk_cl, (unsigned)R), cdim(k_topk_cl, 1, 1);
    auto* kern = per_cl <= 2 ? topk_cluster_kernel<2> : per_cl <= 4 ? topk_cluster_kernel<4>
               : per_cl <= 8 ? topk_cluster_kernel<8> : per_cl <= 16 ? topk_cluster_kernel<16> : topk_cluster_kernel<32>;
    launch_kernel_cluster(kern, grid, cdim, k_topk_cl_threads, 0, stream, score, E, K, ids, n);
    CEDAR_CUDA_LAUNCHED("cuda::topk (cluster)");
    return {};
  }
  const int per = (E + k_topk_threads - 1) / k_topk_threads;  // ids per thread
  const dim3 grid((unsigned)R);
  if (per <= 1) launch_kernel(topk_kernel<1>, grid, k_topk_threads, 0, stream, score, E, K, ids, n);
  else if (per <= 2) launch_kernel(topk_kernel<2>, grid, k_topk_threads, 0, stream, score, E, K, ids, n);
  else if (per <= 4) launch_kernel(topk_kernel<4>, grid, k_topk_threads, 0, stream, score, E, K, ids, n);
  else if (per <= 8) launch_kernel(topk_kernel<8>, grid, k_topk_threads, 0, stream, score, E, K, ids, n);
  else if (per <= 16) launch_kernel(topk_kernel<16>, grid, k_topk_threads, 0, stream, score, E, K, ids, n);
  else if (per <= 32) launch_kernel(topk_kernel<32>, grid, k_topk_threads, 0, stream, score, E, K, ids, n);
  else launch_kernel(topk_kernel<0>, grid, k_topk_threads, 0, stream, score, E, K, ids, n);
  CEDAR_CUDA_LAUNCHED("cuda::topk");
  return {};
}

}  // namespace cedar::kernels::cuda
