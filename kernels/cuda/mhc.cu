// mhc — see mhc.cuh. hc_post runs a warp per row (hc² ≤ 32: the comb matrix in registers) or a
// thread per row (larger hc); collapse runs one block per row (float4 channels), expand a
// thread per channel over (channel blocks, rows).
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/mhc.cuh"
#include "kernels/cuda/mhc_device.cuh"
#include "kernels/cuda/moe_device.cuh"
#include "kernels/cuda/qmatrix_device.cuh"

#include <algorithm>
#include <cstdint>
#include <string>

namespace cedar::kernels::cuda {
namespace {

__global__ void hc_post_kernel(hc_post_params p) {
  pdl_entry();
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= p.R) return;
  post_serial(p, r, p.mixes + (size_t)r * (2 + p.hc) * p.hc);
}

constexpr int k_post_warps = 4;

template <int HC>
__global__ void __launch_bounds__(32 * k_post_warps) hc_post_warp_kernel(hc_post_params p) {
  pdl_entry();
  const int r = blockIdx.x * k_post_warps + (threadIdx.x >> 5);
  if (r >= p.R) return;
  post_warp<HC>(p, r, p.mixes + (size_t)r * (2 + p.hc) * p.hc, threadIdx.x & 31);
}

// x_inv of row r alone from the partials, summed in post_reduce_row's order (part t takes
// blocks t, t + parts, ..., then the parts in order), so both give the same bits. `sm` holds
// reduce_parts(nv) floats; every thread of the block calls it.
__device__ void x_inv_reduce_row(const hc_post_params& p, int r, int mix, float* sm) {
  const int nv = mix + 2, parts = reduce_parts(nv);
  const float* pr = p.partial + (size_t)r * p.nblk * nv + mix + 1;
  for (int part = threadIdx.x; part < parts; part += blockDim.x) {
    float s = 0.0f;
#pragma unroll 8
    for (int b = part; b < p.nblk; b += parts) s += __ldcg(pr + (size_t)b * nv);
    sm[part] = s;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0.0f;
    for (int part = 0; part < parts; ++part) s += sm[part];
    p.x_inv[r] = rsqrtf(s / (float)p.x_cols + p.x_eps);
  }
}

template <int HC>
__global__ void __launch_bounds__(k_reduce_threads) hc_post_reduce_kernel(hc_post_params p) {
  pdl_entry();
  extern __shared__ float sm[];  // reduce_smem_floats(nv)
  post_reduce_row<HC>(p, blockIdx.x, sm);
}

// The transposing butterfly of hc_mix_collapse, level O (then O/2, ..., 1): a lane keeps the
// half of its O·2 values its bit O selects and adds the partner's copy of them; after the
// levels 16..1 lane l holds value l's warp sum. A template per level so that every index into
// t[] is a constant (a loop over levels left t[] on the stack).
template <int O>
__device__ __forceinline__ void butterfly_sum(float (&t)[32], int lane) {
  const bool upper = (lane & O) != 0;
#pragma unroll
  for (int q = 0; q < O; ++q) {  // selects on values, not on addresses into t[]
    const float lo = t[q], hi = t[q + O];
    const float send = upper ? lo : hi;
    const float keep = upper ? hi : lo;
    t[q] = keep + __shfl_xor_sync(0xffffffffu, send, O);
  }
  if constexpr (O > 1) butterfly_sum<O / 2>(t, lane);
}

// grid (channel blocks of 32, R), hc warps: warp k, lane l holds X[r, k, 32·blk + l]. Partials
// of the block: the hc_fn dot products over its hc·32 flat columns, the sum of their squares,
// and the sum of squares of the collapse Σ_k pre[r, k] · X[r, k, i] of its 32 channels (also
// written to v). HC > 0: hc known at compile time (the mix weights loaded together, the sums
// unrolled: a chain of one load and one reduction per mix would cost a load latency each).
// FN, TAIL: what the launch needs, known at compile time, so that its code holds nothing else
// (generic_kernels.hpp): the generic kernel (every hc_fn format inline, 24 times unrolled, and
// both last-block tails) was 127 KB of which ~470 instructions ran, in stretches far apart, and
// its warps waited on instruction fetch 64% of the time (ncu, session 41). FN: the hc_fn format
// (k_fn_any: the runtime dispatch of every format; k_fn_bf16, k_fn_f32). TAIL: the last block's
// work (k_tail_none: no `done`; k_tail_xinv: x_inv alone; k_tail_post: the fused hc_post;
// k_tail_any: chosen at run time). The specialised forms compute exactly what the generic one
// does (the same bits).
constexpr int k_fn_any = 0, k_fn_bf16 = 1, k_fn_f32 = 2;
constexpr int k_tail_none = 0, k_tail_xinv = 1, k_tail_post = 2, k_tail_any = 3;

template <int HC, int FN, int TAIL>
__global__ void __launch_bounds__(32 * k_hc_max) hc_mix_collapse_kernel(hc_mix_params p) {
  pdl_prefetch_entry([&] {  // lane m < mix of warp k: row m's 32 columns of this block (bf16/f32)
    const int lane = threadIdx.x & 31, k = threadIdx.x >> 5, hc = HC > 0 ? HC : p.hc;
    const int64_t col = (int64_t)k * p.d + (int64_t)blockIdx.x * 32;
    const int esz = p.fn.format == weight_format::f32 ? 4 : p.fn.format == weight_format::bf16 ? 2 : 0;
    if (esz && blockIdx.y == 0)
      for (int m = lane; m < (2 + hc) * hc; m += 32)
        l2_prefetch_line(static_cast<const char*>(p.fn.data) + ((p.fn.row0 + m) * p.fn.cols + col) * esz);
  });
  constexpr int MIXC = HC > 0 ? (2 + HC) * HC : 8;  // mix weights per register batch
  __shared__ float xs[k_hc_max][32];
  extern __shared__ float red[];  // [hc, mix + 1] per-warp sums
  const int r = blockIdx.y, blk = blockIdx.x, k = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int hc = HC > 0 ? HC : p.hc, d = p.d, mix = (2 + hc) * hc, nw = mix + 1;
  const int i = blk * 32 + lane;
  const bool valid = i < d;
  const int64_t col = (int64_t)k * d + i;
  // the mix weights of the butterfly form first: their loads (hc_fn is no kernel's output) go
  // out with the streams', not one round trip after the expand's
  constexpr bool kButterfly = HC > 0 && (2 + HC) * HC + 1 <= 32;
  constexpr int MIX = kButterfly ? (2 + HC) * HC : 1;
  float w[MIX];
  if constexpr (kButterfly) {
    const int64_t base = (p.fn.row0 * p.fn.cols) + col, stride = p.fn.cols;
    // the format dispatch outside the unrolled loads (inside, every load carried the generic
    // qmatrix_at path and t[] ended up on the stack)
    if (!valid) {
#pragma unroll
      for (int m = 0; m < MIX; ++m) w[m] = 0.0f;
    } else if constexpr (FN == k_fn_bf16) {
      const uint16_t* wp = static_cast<const uint16_t*>(p.fn.data) + base;
#pragma unroll
      for (int m = 0; m < MIX; ++m) w[m] = __uint_as_float((uint32_t)__ldg(wp + m * stride) << 16);
    } else if constexpr (FN == k_fn_f32) {
      const float* wp = static_cast<const float*>(p.fn.data) + base;
#pragma unroll
      for (int m = 0; m < MIX; ++m) w[m] = __ldg(wp + m * stride);
    } else if (p.fn.format == weight_format::bf16) {
      const uint16_t* wp = static_cast<const uint16_t*>(p.fn.data) + base;
#pragma unroll
      for (int m = 0; m < MIX; ++m) w[m] = __uint_as_float((uint32_t)__ldg(wp + m * stride) << 16);
    } else if (p.fn.format == weight_format::f32) {
      const float* wp = static_cast<const float*>(p.fn.data) + base;
#pragma unroll
      for (int m = 0; m < MIX; ++m) w[m] = __ldg(wp + m * stride);
    } else {
#pragma unroll
      for (int m = 0; m < MIX; ++m) w[m] = qmatrix_at(p.fn, m, col);
    }
  }
  float x = valid ? p.X[((size_t)r * hc + k) * d + i] : 0.0f;
  xs[k][lane] = x;
  if (p.y) {  // the previous sub-layer's expand first (hc_expand's formula), written back to X
    float yi = valid ? p.y[(size_t)r * d + i] : 0.0f;
    const float pk = p.post[r * hc + k];  // the mix weights loaded with y, before the barrier
    float cb[HC > 0 ? HC : 1];
    if constexpr (HC > 0) {
#pragma unroll
      for (int j = 0; j < HC; ++j) cb[j] = p.comb[((size_t)r * hc + j) * hc + k];
    }
    if (p.ye && valid) yi = add_routed_rows(yi, p.ye, p.ye_sel, p.ye_K, d, r, i);
    __syncthreads();
    float t = pk * yi;
    if constexpr (HC > 0) {
#pragma unroll
      for (int j = 0; j < HC; ++j) t += cb[j] * xs[j][lane];
    } else {
      for (int j = 0; j < hc; ++j) t += p.comb[((size_t)r * hc + j) * hc + k] * xs[j][lane];
    }
    x = t;
    __syncthreads();
    xs[k][lane] = x;
    if (valid) p.X[((size_t)r * hc + k) * d + i] = x;
  }
  if constexpr (kButterfly) {
    // 32 values per lane (the mix products, the square, zeros) reduced over the warp by a
    // transposing butterfly: at offset o a lane keeps the half of its values its bit o selects
    // and adds the partner's copy of them; after 5 levels lane l holds value l's warp sum
    // (31 shuffles instead of 5 per value). Row m of hc_fn is one stride (cols) further.
    float t[32];
#pragma unroll
    for (int m = 0; m < MIX; ++m) t[m] = w[m] * x;
    t[MIX] = x * x;
#pragma unroll
    for (int m = MIX + 1; m < 32; ++m) t[m] = 0.0f;
    butterfly_sum<16>(t, lane);
    if (lane <= MIX) red[k * nw + lane] = t[0];
  } else {
    for (int m0 = 0; m0 < mix; m0 += MIXC) {
      float t[MIXC];
#pragma unroll
      for (int m = 0; m < MIXC; ++m) t[m] = valid && m0 + m < mix ? qmatrix_at(p.fn, m0 + m, col) * x : 0.0f;
#pragma unroll
      for (int off = 16; off; off >>= 1)
#pragma unroll
        for (int m = 0; m < MIXC; ++m) t[m] += __shfl_xor_sync(0xffffffffu, t[m], off);
      if (lane == 0)
#pragma unroll
        for (int m = 0; m < MIXC; ++m)
          if (m0 + m < mix) red[k * nw + m0 + m] = t[m];
    }
    float ss = x * x;
    for (int off = 16; off; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
    if (lane == 0) red[k * nw + mix] = ss;
  }
  __syncthreads();
  float* out = p.partial + ((size_t)r * gridDim.x + blk) * (mix + 2);
  for (int v = threadIdx.x; v < nw; v += blockDim.x) {
    float s = 0.0f;
    for (int kk = 0; kk < hc; ++kk) s += red[kk * nw + v];
    out[v] = s;
  }
  if (k == 0) {
    float v = 0.0f;
    for (int kk = 0; kk < hc; ++kk) v += p.pre[r * hc + kk] * xs[kk][lane];
    if (valid) p.v[(size_t)r * d + i] = v;
    float vs = valid ? v * v : 0.0f;
    for (int off = 16; off; off >>= 1) vs += __shfl_xor_sync(0xffffffffu, vs, off);
    if (lane == 0) out[mix + 1] = vs;
  }
  if constexpr (TAIL == k_tail_none) return;
  if (TAIL == k_tail_any && !p.done) return;
  // hc_post fused: the row's last block to finish reduces the row's partials (every block has
  // read post/comb/pre before counting itself in, so the mix weights may be overwritten now)
  __shared__ unsigned last;
  __threadfence();  // this block's partials are visible device-wide before it is counted
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(p.done + r, 1u) == gridDim.x - 1 ? 1u : 0u;
  __syncthreads();
  if (!last) return;
  __threadfence();
  if (TAIL == k_tail_xinv || (TAIL == k_tail_any && p.x_inv_only)) x_inv_reduce_row(p.site, r, mix, red);
  else post_reduce_row<HC>(p.site, r, red);
  if (threadIdx.x == 0) p.done[r] = 0;  // ready for the next site
}

// Block-wide sum (blockDim.x a multiple of 32, ≤ 1024).
__device__ inline float block_sum(float v, float* part) {
  for (int off = 16; off; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    float t = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.0f;
    for (int off = 16; off; off >>= 1) t += __shfl_xor_sync(0xffffffffu, t, off);
    if (threadIdx.x == 0) part[0] = t;
  }
  __syncthreads();
  return part[0];
}

// One block per row; a thread per 4 channels (float4) when d % 4 == 0, else per channel.
template <bool VEC>
__global__ void __launch_bounds__(1024) hc_collapse_norm_kernel(const float* X, const float* pre, const float* w,
                                                                 float* x, int hc, int d, float eps) {
  pdl_entry();
  extern __shared__ float row[];  // [d]
  __shared__ float part[32];
  const int r = blockIdx.x;
  const float* Xr = X + (size_t)r * hc * d;
  float pk[k_hc_max];
  for (int k = 0; k < hc; ++k) pk[k] = pre[r * hc + k];
  float ss = 0.0f;
  if constexpr (VEC) {
    for (int i = threadIdx.x; i < d / 4; i += blockDim.x) {
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      for (int k = 0; k < hc; ++k) {
        const float4 a = reinterpret_cast<const float4*>(Xr + (size_t)k * d)[i];
        v.x += pk[k] * a.x, v.y += pk[k] * a.y, v.z += pk[k] * a.z, v.w += pk[k] * a.w;
      }
      reinterpret_cast<float4*>(row)[i] = v;
      ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
  } else {
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
      float v = 0.0f;
      for (int k = 0; k < hc; ++k) v += pk[k] * Xr[(size_t)k * d + i];
      row[i] = v;
      ss += v * v;
    }
  }
  const float tot = block_sum(ss, part);
  const float inv = 1.0f / sqrtf(tot / (float)d + eps);
  if constexpr (VEC) {
    for (int i = threadIdx.x; i < d / 4; i += blockDim.x) {
      const float4 v = reinterpret_cast<const float4*>(row)[i], g = reinterpret_cast<const float4*>(w)[i];
      reinterpret_cast<float4*>(x + (size_t)r * d)[i] =
          make_float4(g.x * (v.x * inv), g.y * (v.y * inv), g.z * (v.z * inv), g.w * (v.w * inv));
    }
  } else {
    for (int i = threadIdx.x; i < d; i += blockDim.x) x[(size_t)r * d + i] = w[i] * (row[i] * inv);
  }
}

// grid (channel blocks, R): a thread per channel, every stream of the row in registers.
constexpr int k_expand_threads = 256;

// HC > 0: hc known at compile time (the streams in registers, their loads issued together)
template <int HC>
__global__ void __launch_bounds__(k_expand_threads) hc_expand_kernel(float* X, const float* y, const float* post,
                                                                      const float* comb, int hc_arg, int d, const float* ye,
                                                                      const int32_t* ye_sel, int ye_K) {
  pdl_entry();
  const int hc = HC > 0 ? HC : hc_arg;
  const int r = blockIdx.y;
  const int i = blockIdx.x * k_expand_threads + threadIdx.x;
  if (i >= d) return;
  float* Xr = X + (size_t)r * hc * d;
  const float* cb = comb + (size_t)r * hc * hc;
  float xj[k_hc_max];
  for (int j = 0; j < hc; ++j) xj[j] = Xr[(size_t)j * d + i];
  float yi = y[(size_t)r * d + i];
  if (ye) yi = add_routed_rows(yi, ye, ye_sel, ye_K, d, r, i);
  for (int k = 0; k < hc; ++k) {
    float t = post[r * hc + k] * yi;
    for (int j = 0; j < hc; ++j) t += cb[j * hc + k] * xj[j];
    Xr[(size_t)k * d + i] = t;
  }
}

status check_shape(const char* op, int R, int hc, int d) {
  if (R <= 0 || hc <= 0 || hc > k_hc_max || d <= 0)
    return make_error(errc::invalid_argument, std::string(op) + ": bad shape R " + std::to_string(R) + ", hc " +
                                                  std::to_string(hc) + " (at most " + std::to_string(k_hc_max) +
                                                  "), d " + std::to_string(d));
  return {};
}

}  // namespace

status hc_post(const hc_post_params& p, cudaStream_t stream) {
  CEDAR_TRY(check_shape("hc_post", p.R, p.hc, 1));
  if ((!p.mixes && !p.partial) || !p.base || !p.scale || !p.pre || !p.post || !p.comb)
    return make_error(errc::invalid_argument, "hc_post: null pointer");
  if (p.partial) {  // mixes reduced from hc_mix_collapse's partials, one block per row
    if (p.nblk <= 0 || p.ncols <= 0) return make_error(errc::invalid_argument, "hc_post: partials without nblk/ncols");
    const int nv = (2 + p.hc) * p.hc + 2;
    const size_t smem = sizeof(float) * (size_t)reduce_smem_floats(nv);
    if (p.hc == 4) launch_kernel(hc_post_reduce_kernel<4>, (unsigned)p.R, k_reduce_threads, smem, stream, p);
    else launch_kernel(hc_post_reduce_kernel<0>, (unsigned)p.R, k_reduce_threads, smem, stream, p);
    CEDAR_CUDA_LAUNCHED("hc_post (reduce)");
    return {};
  }
  const unsigned blocks = (unsigned)((p.R + k_post_warps - 1) / k_post_warps);
  if (p.hc == 4)
    launch_kernel(hc_post_warp_kernel<4>, blocks, 32 * k_post_warps, 0, stream, p);
  else if (p.hc * p.hc <= 32)
    launch_kernel(hc_post_warp_kernel<0>, blocks, 32 * k_post_warps, 0, stream, p);
  else
    launch_kernel(hc_post_kernel, (p.R + 63) / 64, 64, 0, stream, p);
  CEDAR_CUDA_LAUNCHED("hc_post");
  return {};
}

int hc_mix_blocks(int d) { return (d + 31) / 32; }

size_t hc_mix_partial_floats(int R, int hc, int d) {
  return (size_t)R * hc_mix_blocks(d) * ((size_t)(2 + hc) * hc + 2);
}

namespace {
using mix_collapse_fn = void (*)(hc_mix_params);

template <int FN>
mix_collapse_fn mix_collapse_tail(const hc_mix_params& p) {
  if (!p.done) return hc_mix_collapse_kernel<4, FN, k_tail_none>;
  if (p.x_inv_only) return hc_mix_collapse_kernel<4, FN, k_tail_xinv>;
  return hc_mix_collapse_kernel<4, FN, k_tail_post>;
}

// The kernel of a launch: hc = 4 with a bf16 or f32 hc_fn gets the form compiled for its format
// and tail (unless generic_mhc is set: generic_kernels.hpp); anything else the generic kernel.
mix_collapse_fn mix_collapse_kernel_for(const hc_mix_params& p) {
  const bool generic = (generic_kernels() & generic_mhc) != 0;
  if (p.hc != 4) return hc_mix_collapse_kernel<0, k_fn_any, k_tail_any>;
  if (!generic && p.fn.format == weight_format::bf16) return mix_collapse_tail<k_fn_bf16>(p);
  if (!generic && p.fn.format == weight_format::f32) return mix_collapse_tail<k_fn_f32>(p);
  return hc_mix_collapse_kernel<4, k_fn_any, k_tail_any>;
}
}  // namespace

status hc_mix_collapse(const hc_mix_params& p, cudaStream_t stream) {
  CEDAR_TRY(check_shape("hc_mix_collapse", p.R, p.hc, p.d));
  if (!p.X || !p.pre || !p.partial || !p.v || p.fn.empty())
    return make_error(errc::invalid_argument, "hc_mix_collapse: null pointer or empty hc_fn");
  if (p.y && (!p.post || !p.comb)) return make_error(errc::invalid_argument, "hc_mix_collapse: y without post/comb");
  if (p.ye && (!p.y || !p.ye_sel || p.ye_K <= 0))
    return make_error(errc::invalid_argument, "hc_mix_collapse: ye without y, ye_sel or ye_K");
  const int mix = (2 + p.hc) * p.hc;
  if (p.fn.rows != mix || p.fn.cols != (int64_t)p.hc * p.d)
    return make_error(errc::invalid_argument, "hc_mix_collapse: hc_fn is " + std::to_string(p.fn.rows) + " x " +
                                                  std::to_string(p.fn.cols) + ", expected " + std::to_string(mix) +
                                                  " x " + std::to_string(p.hc * p.d));
  size_t smem = sizeof(float) * (size_t)p.hc * (mix + 1);
  hc_mix_params q = p;
  if (p.done && p.x_inv_only) {  // the last block of each row: x_inv alone
    hc_post_params& h = q.site;
    if (h.R != p.R || h.hc != p.hc || !h.x_inv || h.x_cols <= 0)
      return make_error(errc::invalid_argument, "hc_mix_collapse: x_inv_only needs site R, hc, x_inv and x_cols");
    h.mixes = nullptr, h.partial = p.partial, h.nblk = hc_mix_blocks(p.d), h.ncols = p.hc * p.d;
    smem = std::max(smem, sizeof(float) * (size_t)reduce_parts(mix + 2));
  } else if (p.done) {  // hc_post fused: its partial form on this launch's partials
    hc_post_params& h = q.site;
    if (h.R != p.R || h.hc != p.hc || !h.base || !h.scale || !h.pre || !h.post || !h.comb)
      return make_error(errc::invalid_argument, "hc_mix_collapse: fused hc_post needs R, hc, base, scale, pre, post, comb");
    h.mixes = nullptr, h.partial = p.partial, h.nblk = hc_mix_blocks(p.d), h.ncols = p.hc * p.d;
    smem = std::max(smem, sizeof(float) * (size_t)reduce_smem_floats(mix + 2));
  }
  const dim3 grid((unsigned)hc_mix_blocks(p.d), (unsigned)p.R);
  launch_kernel(mix_collapse_kernel_for(p), grid, (unsigned)(32 * p.hc), smem, stream, q);
  CEDAR_CUDA_LAUNCHED("hc_mix_collapse");
  return {};
}

status hc_collapse_norm(const float* X, const float* pre, const float* w, float* x, int R, int hc, int d,
                        float eps, cudaStream_t stream) {
  CEDAR_TRY(check_shape("hc_collapse_norm", R, hc, d));
  if (!X || !pre || !w || !x) return make_error(errc::invalid_argument, "hc_collapse_norm: null pointer");
  const bool vec = d % 4 == 0 && ((reinterpret_cast<uintptr_t>(X) | reinterpret_cast<uintptr_t>(w) |
                                    reinterpret_cast<uintptr_t>(x)) & 15u) == 0;
  const int work = vec ? d / 4 : d;
  const int threads = std::min(1024, std::max(32, (work + 31) / 32 * 32));
  if (vec) launch_kernel(hc_collapse_norm_kernel<true>, R, threads, sizeof(float) * (size_t)d, stream, X, pre, w, x, hc, d, eps);
  else launch_kernel(hc_collapse_norm_kernel<false>, R, threads, sizeof(float) * (size_t)d, stream, X, pre, w, x, hc, d, eps);
  CEDAR_CUDA_LAUNCHED("hc_collapse_norm");
  return {};
}

status hc_expand(float* X, const float* y, const float* post, const float* comb, int R, int hc, int d,
                 cudaStream_t stream, const float* ye, const int32_t* ye_sel, int ye_K) {
  CEDAR_TRY(check_shape("hc_expand", R, hc, d));
  if (!X || !y || !post || !comb) return make_error(errc::invalid_argument, "hc_expand: null pointer");
  if (ye && (!ye_sel || ye_K <= 0)) return make_error(errc::invalid_argument, "hc_expand: ye without sel or K");
  const dim3 grid((unsigned)((d + k_expand_threads - 1) / k_expand_threads), (unsigned)R);
  if (hc == 4) launch_kernel(hc_expand_kernel<4>, grid, k_expand_threads, 0, stream, X, y, post, comb, hc, d, ye, ye_sel, ye_K);
  else launch_kernel(hc_expand_kernel<0>, grid, k_expand_threads, 0, stream, X, y, post, comb, hc, d, ye, ye_sel, ye_K);
  CEDAR_CUDA_LAUNCHED("hc_expand");
  return {};
}

}  // namespace cedar::kernels::cuda
