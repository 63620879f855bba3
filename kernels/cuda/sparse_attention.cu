// sparse_attention — see sparse_attention.cuh. One thread block per (row, group of HB heads,
// split of the keys); keys in tiles of TK: the block dequantises a tile into shared memory once for all its heads
// (K = V is shared by every head), scores it, and folds it into per-head running max / sum /
// output (online softmax). Shared memory: q [HB, D] + tile [TK, D] + probabilities [HB, TK] +
// output accumulators [HB, D], fp32. Splits (flash-decoding): a decode batch of one row has
// too few (row, head group) pairs to fill the GPU, so the keys are cut into whole-tile ranges,
// each block leaves its (max, sum, output) in the workspace and the splits are folded: by the
// last block of each (row, head group) to finish when the caller gives `done` counters (counted
// with an atomic, as the mHC site does; no second launch), else by a second kernel.
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/quant_device.cuh"
#include "kernels/cuda/sparse_attention.cuh"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

namespace cedar::kernels::cuda {
namespace {

constexpr int k_threads = 256;
constexpr int k_tile = 32;  // keys per tile
constexpr int k_unroll = 8;  // packed words each thread loads before decoding

// 4 bytes from any address: one load when aligned (D a multiple of 128 makes every entry
// start aligned), else byte loads.
__device__ __forceinline__ uint32_t load4(const uint8_t* p) {
  if ((reinterpret_cast<uintptr_t>(p) & 3u) == 0) return __ldg(reinterpret_cast<const uint32_t*>(p));
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

// RoPE of channel c of a D-vector, by row r's angles (rope_rows' formula and rounding; sg −1:
// the inverse). `at(j)` reads channel j of the same vector.
template <class At>
__device__ __forceinline__ float rope_channel(const sparse_attention_params& p, int r, int D, int c, float sg, At at) {
  const int k = c - (D - 2 * p.rope_np);
  if (!p.rope_cos || k < 0) return at(c);
  const int c0 = c - (k & 1);
  const float e = at(c0), o = at(c0 + 1);
  const float cs = p.rope_cos[(size_t)r * p.rope_np + (k >> 1)], sn = sg * p.rope_sin[(size_t)r * p.rope_np + (k >> 1)];
  return (k & 1) == 0 ? __fsub_rn(__fmul_rn(e, cs), __fmul_rn(o, sn)) : __fadd_rn(__fmul_rn(e, sn), __fmul_rn(o, cs));
}

constexpr int k_max_splits = 64;

// Folds the splits' partial states of (row r, head h) and the sink into p.out, with all the
// block's threads (an empty split has max −inf and contributes nothing). Warp 0 reduces the
// splits' maxima and sums with shuffles and leaves each split's weight exp(m_s − m) in wsplit
// [splits]; every thread then sums its channels over the splits with independent loads into
// orow [D], and the inverse RoPE is applied on the way out. orow, wsplit and s_den are shared
// memory; the partials are read through L2 (__ldcg: other blocks of this grid wrote them).
__device__ void combine_head(const sparse_attention_params& p, int splits, int r, int h, float* orow, float* wsplit,
                             float* s_den) {
  const int D = p.D;
  const float* ml = p.workspace + 2 * (((size_t)r * p.H + h) * splits);
  const float* po = p.workspace + (size_t)2 * p.R * p.H * splits + ((size_t)r * p.H + h) * splits * D;
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    float ms[2], ls[2];
    float m = p.sink[h];
    for (int k = 0; k < 2; ++k) {
      const int s = lane + 32 * k;
      ms[k] = s < splits ? __ldcg(ml + 2 * s) : -INFINITY;
      ls[k] = s < splits ? __ldcg(ml + 2 * s + 1) : 0.0f;
      m = fmaxf(m, ms[k]);
    }
    for (int off = 16; off; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    float den = 0.0f;
    for (int k = 0; k < 2; ++k) {
      const int s = lane + 32 * k;
      const float w = ms[k] == -INFINITY ? 0.0f : __expf(ms[k] - m);
      if (s < splits) wsplit[s] = w;
      den += ls[k] * w;
    }
    for (int off = 16; off; off >>= 1) den += __shfl_xor_sync(0xffffffffu, den, off);
    if (lane == 0) *s_den = den + __expf(p.sink[h] - m);
  }
  __syncthreads();
  const float inv = 1.0f / *s_den;
  for (int c = threadIdx.x; c < D; c += blockDim.x) {
    float o = 0.0f;
#pragma unroll 4
    for (int s = 0; s < splits; ++s) o += __ldcg(po + (size_t)s * D + c) * wsplit[s];
    orow[c] = o * inv;
  }
  __syncthreads();
  for (int c = threadIdx.x; c < D; c += blockDim.x)
    p.out[((size_t)r * p.H + h) * D + c] = rope_channel(p, r, D, c, -1.0f, [&](int j) { return orow[j]; });
  __syncthreads();  // orow and wsplit are free again
}

// grid (R, head groups, splits). With splits == 1 the block writes the output; else it writes
// its key range's partial state (max, sum, unnormalised output) to p.workspace, and the last
// block of its (row, head group) folds them (p.done) or sparse_attention_combine does.
// kFold: the split fold is compiled in only where it is used (its code made the kernel slower
// at batch 64, where the keys are not split: 12.4 -> 13.2 ms per step of the 1.2 B model).
template <bool kFold>
__global__ void sparse_attention_kernel(sparse_attention_params p, int hb, int splits) {
  pdl_entry();
  extern __shared__ float smem[];
  const int r = blockIdx.x, h0 = blockIdx.y * hb, split = blockIdx.z;
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
    const float* qv = p.q + ((size_t)r * p.H + h0) * D + (i / D) * D;
    qs[i] = rope_channel(p, r, D, i % D, 1.0f, [&](int j) { return qv[j]; });
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
  const int words8 = D / 4;  // 4-byte words of an fp8 entry's codes (an fp4 entry has half)
  __shared__ const uint8_t* tkey[k_tile];
  __shared__ bool tfp4[k_tile];
  __syncthreads();

  // this block's keys: [k_begin, k_end), split in whole tiles
  const int tiles = (n + k_tile - 1) / k_tile, per = (tiles + splits - 1) / splits;
  const int k_begin = min(n, split * per * k_tile), k_end = min(n, (split + 1) * per * k_tile);
  for (int t0 = k_begin; t0 < k_end; t0 += k_tile) {
    const int nt = min(k_tile, k_end - t0);
    // dequantise the tile: [nt, D]. First the tile's entry pointers (one thread per key: the
    // only dependent load, sel -> entry), then 4-byte words of packed codes, all independent;
    // consecutive lanes take consecutive words of a key, so loads coalesce and the float4
    // stores into the tile hit distinct banks (an fp8 word = 4 channels under one UE8M0 scale,
    // an fp4 word = 8 channels under one E4M3 scale).
    if ((int)threadIdx.x < nt) {
      const int j = t0 + (int)threadIdx.x;
      tkey[threadIdx.x] = j < nw ? wk + (size_t)((ws + j) % p.wcap) * wbytes
                                 : mk + (size_t)p.sel[(size_t)r * p.K + (j - nw)] * mbytes;
      tfp4[threadIdx.x] = j >= nw;
    }
    __syncthreads();
    // (k_unroll words per thread are loaded before any is decoded: independent loads in
    // flight instead of one load's latency per word)
    const int total = nt * words8;
    for (int base = threadIdx.x; base < total; base += blockDim.x * k_unroll) {
      uint32_t u[k_unroll], sb[k_unroll];
#pragma unroll
      for (int k = 0; k < k_unroll; ++k) {
        const int i = base + k * (int)blockDim.x;
        u[k] = 0, sb[k] = 0;
        if (i >= total) continue;
        const int j = i / words8, wd = i - j * words8;
        const uint8_t* e = tkey[j];
        if (!tfp4[j]) u[k] = load4(e + wd * 4), sb[k] = e[D + wd / 8];
        else if (wd < words8 / 2) u[k] = load4(e + wd * 4), sb[k] = e[D / 2 + wd / 2];
      }
#pragma unroll
      for (int k = 0; k < k_unroll; ++k) {
        const int i = base + k * (int)blockDim.x;
        if (i >= total) continue;
        const int j = i / words8, wd = i - j * words8;
        float4* dst = reinterpret_cast<float4*>(ts + j * D);
        if (!tfp4[j]) {
          const float sc = ue8m0_value(sb[k]);
          dst[wd] = make_float4(e4m3_value(u[k] & 0xFFu) * sc, e4m3_value((u[k] >> 8) & 0xFFu) * sc,
                                e4m3_value((u[k] >> 16) & 0xFFu) * sc, e4m3_value(u[k] >> 24) * sc);
        } else if (wd < words8 / 2) {
          const float sc = e4m3_value(sb[k]);
          dst[2 * wd] = make_float4(e2m1_value(u[k] & 15u) * sc, e2m1_value((u[k] >> 4) & 15u) * sc,
                                    e2m1_value((u[k] >> 8) & 15u) * sc, e2m1_value((u[k] >> 12) & 15u) * sc);
          dst[2 * wd + 1] = make_float4(e2m1_value((u[k] >> 16) & 15u) * sc, e2m1_value((u[k] >> 20) & 15u) * sc,
                                        e2m1_value((u[k] >> 24) & 15u) * sc, e2m1_value(u[k] >> 28) * sc);
        }
      }
    }
    __syncthreads();
    // logits [nh, nt]: one warp per (head, key), lanes over channels (consecutive addresses:
    // no shared-memory bank conflicts), warp-shuffle sum
    {
      const int lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
      for (int i = threadIdx.x >> 5; i < nh * nt; i += nwarps) {
        const int h = i / nt, j = i % nt;
        const float* qh = qs + h * D;
        const float* kj = ts + j * D;
        float s = 0.0f;
        for (int c = lane; c < D; c += 32) s = fmaf(qh[c], kj[c], s);
        for (int off = 16; off; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
        if (lane == 0) ps[h * k_tile + j] = s * p.scale;
      }
    }
    __syncthreads();
    // per head (one warp each, lane j = key j of the tile; nt <= 32): new max, rescale factor,
    // probabilities
    {
      const int lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
      for (int h = threadIdx.x >> 5; h < nh; h += nwarps) {
        const float lg = lane < nt ? ps[h * k_tile + lane] : -INFINITY;
        float m = lg;
        for (int off = 16; off; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
        m = fmaxf(m, mrun[h]);
        const float e = lane < nt ? __expf(lg - m) : 0.0f;
        float l = e;
        for (int off = 16; off; off >>= 1) l += __shfl_xor_sync(0xffffffffu, l, off);
        if (lane < nt) ps[h * k_tile + lane] = e;
        __syncwarp();
        if (lane == 0) {
          const float f = mrun[h] == -INFINITY ? 0.0f : __expf(mrun[h] - m);
          lrun[h] = lrun[h] * f + l;
          mrun[h] = m;
          fac[h] = f;
        }
      }
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
  if (splits > 1) {
    // partial state of this split: [R, H, splits] of (max, sum) and [R, H, splits, D] of output
    float* ml = p.workspace;
    float* po = p.workspace + (size_t)2 * p.R * p.H * splits;
    for (int h = threadIdx.x; h < nh; h += blockDim.x) {
      const size_t at = ((size_t)r * p.H + h0 + h) * splits + split;
      ml[2 * at] = mrun[h];
      ml[2 * at + 1] = lrun[h];
    }
    for (int i = threadIdx.x; i < nh * D; i += blockDim.x) {
      const int h = i / D;
      po[(((size_t)r * p.H + h0 + h) * splits + split) * D + (i - h * D)] = acc[i];
    }
    if (!kFold || !p.done) return;
    // the (row, head group)'s last split block to finish folds the splits, in the shared memory
    // of q (orow, D <= hb * D floats) and of the tile (wsplit, splits <= 64 <= k_tile * D)
    __shared__ unsigned last;
    __shared__ float s_den;
    unsigned* cnt = p.done + (size_t)r * gridDim.y + blockIdx.y;
    __threadfence();  // this block's partials are visible device-wide before it is counted
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(cnt, 1u) == (unsigned)splits - 1 ? 1u : 0u;
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (int h = 0; h < nh; ++h) combine_head(p, splits, r, h0 + h, qs, ts, &s_den);
    if (threadIdx.x == 0) *cnt = 0;  // ready for the next launch
    return;
  }
  // the sink joins the denominator only; the inverse RoPE (when given) on the way out
  for (int i = threadIdx.x; i < nh * D; i += blockDim.x) {
    const int h = i / D;
    const float sink = p.sink[h0 + h];
    const float m = fmaxf(mrun[h], sink);
    const float den = lrun[h] * __expf(mrun[h] - m) + __expf(sink - m);
    const float* ah = acc + h * D;
    p.out[((size_t)r * p.H + h0) * D + i] =
        rope_channel(p, r, D, i - h * D, -1.0f, [&](int j) { return ah[j] * __expf(mrun[h] - m) / den; });
  }
}

// One block per (row, head): the splits' fold when no `done` counters are given.
__global__ void sparse_attention_combine(sparse_attention_params p, int splits) {
  pdl_entry();
  extern __shared__ float orow[];  // [D] the row's output before the inverse RoPE
  __shared__ float wsplit[k_max_splits];
  __shared__ float s_den;
  combine_head(p, splits, blockIdx.x, blockIdx.y, orow, wsplit, &s_den);
}

// Heads per block, splits over the keys and the workspace they need.
struct launch_shape {
  int hb = -1, splits = 1;
  size_t workspace_floats = 0;
};

std::atomic<int> g_shape_hb{0}, g_shape_tiles{0};  // set_sparse_attention_shape (tests)

launch_shape shape_of(const sparse_attention_params& p) {
  static int sms = 0;  // kept for the first device a process uses (the executor drives one)
  if (!sms) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
      return {};
  }
  launch_shape ls;
  // CEDAR_CUDA_ATTN="HB,TILES" (diagnostics, read once): HB heads per block and TILES key
  // tiles per split instead of the rule below; benchmarks sweep it
  static const std::pair<int, int> env_forced = [] {
    std::pair<int, int> f{0, 0};
    if (const char* v = std::getenv("CEDAR_CUDA_ATTN")) std::sscanf(v, "%d,%d", &f.first, &f.second);
    return f;
  }();
  const std::pair<int, int> forced = g_shape_hb.load() > 0 ? std::pair<int, int>{g_shape_hb.load(), g_shape_tiles.load()}
                                                           : env_forced;
  auto bytes = [&](int h) { return sizeof(float) * ((size_t)2 * h * p.D + (size_t)k_tile * p.D + (size_t)h * k_tile + 3 * (size_t)h); };
  int hb = p.H;
  while (hb > 1 && bytes(hb) > 96 * 1024) hb = (hb + 1) / 2;
  // a decode batch of a few rows: fewer heads per block until the grid gives every
  // multiprocessor ~2 blocks, then split the keys (p.max_keys) over up to 4 blocks per
  // multiprocessor
  const int64_t want = 2 * (int64_t)sms;
  while (hb > 1 && (int64_t)p.R * ((p.H + hb - 1) / hb) < want) hb = (hb + 1) / 2;
  // each split takes at least one tile: a block's time is its chain of tiles (dequantise,
  // score, softmax, accumulate, each behind a barrier), so at batch 1 short chains on many
  // blocks beat long ones on few
  const int64_t blocks = (int64_t)p.R * ((p.H + hb - 1) / hb);
  const int max_tiles = (p.max_keys + k_tile - 1) / k_tile;
  int splits = 1;
  if (blocks < want) {
    const int64_t want_split = 2 * want;
    splits = (int)std::min<int64_t>({(want_split + blocks - 1) / blocks, (int64_t)max_tiles, (int64_t)k_max_splits});
    const int per = (max_tiles + splits - 1) / splits;  // tiles per split; no split left empty
    splits = (max_tiles + per - 1) / per;
  }
  if (forced.first > 0 && forced.second > 0) {
    hb = std::min(p.H, forced.first);
    while (hb > 1 && bytes(hb) > 96 * 1024) hb = (hb + 1) / 2;
    splits = std::min(k_max_splits, std::max(1, (max_tiles + forced.second - 1) / forced.second));
    const int per = (max_tiles + splits - 1) / splits;
    splits = (max_tiles + per - 1) / per;
  }
  ls.hb = hb;
  ls.splits = splits;
  ls.workspace_floats = splits > 1 ? (size_t)p.R * p.H * splits * (2 + (size_t)p.D) : 0;
  return ls;
}

}  // namespace

void set_sparse_attention_shape(int heads_per_block, int tiles_per_split) {
  const bool on = heads_per_block > 0 && tiles_per_split > 0;
  g_shape_tiles = on ? tiles_per_split : 0;
  g_shape_hb = on ? heads_per_block : 0;
}

size_t sparse_attention_workspace_floats(const sparse_attention_params& p) {
  return p.R > 0 && p.H > 0 && p.D > 0 ? shape_of(p).workspace_floats : 0;
}

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
  if (p.rope_cos && (!p.rope_sin || p.rope_np <= 0 || 2 * p.rope_np > p.D)) return bad("bad RoPE pairs or null sin");
  // heads per block: as many as fit in ~96 KB of shared memory with the tile, and no more
  // than leaves ~2 blocks per multiprocessor (each block dequantises its keys for its heads)
  const launch_shape ls = shape_of(p);
  if (ls.hb < 0) return bad("could not read the device's multiprocessor count");
  const int hb = ls.hb;
  auto bytes = [&](int h) { return sizeof(float) * ((size_t)2 * h * p.D + (size_t)k_tile * p.D + (size_t)h * k_tile + 3 * (size_t)h); };
  if (bytes(hb) > 200 * 1024) return bad("head_dim " + std::to_string(p.D) + " needs too much shared memory");
  const size_t smem = bytes(hb);
  // splits over the keys only when the caller gave a large enough workspace
  const int splits = p.workspace && p.workspace_floats >= ls.workspace_floats ? ls.splits : 1;
  // the opt-in above 48 KB, set once per size increase (a per-launch call costs host time);
  // like `sms`, kept for the first device a process uses (the executor drives one device)
  const bool fold = splits > 1 && p.done;
  auto* kernel = fold ? sparse_attention_kernel<true> : sparse_attention_kernel<false>;
  static size_t smem_optin[2] = {48 * 1024, 48 * 1024};  // per instantiation
  if (smem > smem_optin[fold]) {
    CEDAR_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                   "cuda::sparse_attention: shared memory attribute");
    smem_optin[fold] = smem;
  }
  dim3 grid((unsigned)p.R, (unsigned)((p.H + hb - 1) / hb), (unsigned)splits);
  launch_kernel(kernel, grid, k_threads, smem, stream, p, hb, splits);
  CEDAR_CUDA_LAUNCHED("cuda::sparse_attention");
  if (splits > 1 && !fold) {
    launch_kernel(sparse_attention_combine, dim3((unsigned)p.R, (unsigned)p.H), 128, sizeof(float) * (size_t)p.D, stream,
                  p, splits);
    CEDAR_CUDA_LAUNCHED("cuda::sparse_attention (combine)");
  }
  return {};
}

}  // namespace cedar::kernels::cuda
