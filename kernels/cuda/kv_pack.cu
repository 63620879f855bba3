// kv_pack — see kv_pack.cuh. One warp per 32-channel block (FP4 KV: two 16-channel scale
// blocks per warp, half-warp reductions); block maxima over |x| bit patterns as the CPU takes
// them; explicit _rn intrinsics so no multiply-add is contracted where the CPU rounds twice.
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/kv_pack.cuh"

#include <algorithm>
#include <string>

namespace cedar::kernels::cuda {
namespace {

__device__ inline float f32_next_up(float x) { return __uint_as_float(__float_as_uint(x) + 1u); }

// E2M1 code of q (already divided by its scale): RNE on {0,.5,1,1.5,2,3,4,6}, clamped, sign
// bit 3 (quant.cpp e2m1_code_fast).
__device__ inline uint32_t e2m1_code(float q) {
  const uint32_t qb = __float_as_uint(q);
  const float a = __uint_as_float(qb & 0x7FFFFFFFu);
  const uint32_t c = (a >= f32_next_up(0.25f)) + (a >= 0.75f) + (a >= f32_next_up(1.25f)) + (a >= 1.75f) +
                     (a >= f32_next_up(2.5f)) + (a >= 3.5f) + (a >= f32_next_up(5.0f));
  return c | ((qb >> 28) & 8u);
}

__device__ inline float e2m1_code_value(uint32_t code) {
  const uint32_t twice = (0xC8643210u >> ((code & 7u) * 4u)) & 15u;
  const float mag = 0.5f * (float)twice;
  return code & 8u ? -mag : mag;
}

// Rounds |a| to the E4M3 grid (RNE), quant.cpp e4m3_round_mag.
__device__ inline float e4m3_round_mag(float a) {
  const uint32_t b = __float_as_uint(a);
  const uint32_t normal = (b + 0x7FFFFu + ((b >> 20) & 1u)) & 0xFFF00000u;
  const uint32_t sub = __float_as_uint(__fsub_rn(__fadd_rn(a, 16384.0f), 16384.0f));
  const uint32_t is_sub = 0u - (uint32_t)(b < 0x3C800000u);
  return __uint_as_float((sub & is_sub) | (normal & ~is_sub));
}

// E4M3 code of a value already on the grid (quant.cpp e4m3_code_of_exact).
__device__ inline uint32_t e4m3_code_of_exact(float r) {
  const uint32_t rb = __float_as_uint(r);
  const uint32_t ab = rb & 0x7FFFFFFFu;
  const uint32_t normal = ((((ab >> 23) & 0xFFu) - 120u) << 3) | ((ab >> 20) & 7u);
  const uint32_t sub = __float_as_uint(__fadd_rn(__uint_as_float(ab), 16384.0f)) & 0xFu;
  const uint32_t is_sub = 0u - (uint32_t)(ab < 0x3C800000u);
  return ((sub & is_sub) | (normal & ~is_sub)) | ((rb >> 24) & 0x80u);
}

__device__ inline int pow2_ceil_exponent(float t) {
  const uint32_t b = __float_as_uint(t);
  return (int)((b >> 23) & 0xFFu) - 127 + ((b & 0x7FFFFFu) != 0 ? 1 : 0);
}

// max |x| over the `width` lanes of this lane's group (width 16 or 32), as bit patterns.
__device__ inline float group_amax(float x, int width) {
  uint32_t m = __float_as_uint(x) & 0x7FFFFFFFu;
  for (int off = width / 2; off; off >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, off));
  return __uint_as_float(m);
}

__global__ void rope_rows_kernel(float* x, int nvec, int n, int np, const float* cos, const float* sin,
                                 float sg) {
  pdl_entry();
  const int r = blockIdx.x;
  for (int t = threadIdx.x; t < nvec * np; t += blockDim.x) {
    const int v = t / np, i = t % np;
    float* pr = x + ((size_t)r * nvec + v) * n + (n - 2 * np) + 2 * i;
    const float e = pr[0], o = pr[1];
    const float c = cos[(size_t)r * np + i], s = sg * sin[(size_t)r * np + i];
    pr[0] = __fsub_rn(__fmul_rn(e, c), __fmul_rn(o, s));
    pr[1] = __fadd_rn(__fmul_rn(e, s), __fmul_rn(o, c));
  }
}

// The encoders, one lane per channel: a warp holds channels [32·blk, 32·blk + 32) of a row of
// n and writes their codes and scales into `out` (the entry of the row).
// fp8_swa_pack: codes + UE8M0 scale per 32 channels.
__device__ __forceinline__ void fp8_swa_lane(float v, int lane, int blk, int n, uint8_t* out) {
  const float amax = group_amax(v, 32);
  const int e = pow2_ceil_exponent(__fmul_rn(fmaxf(amax, 1e-4f), (float)(1.0 / 448.0)));
  const float inv = ldexpf(1.0f, -e);
  const uint32_t qb = __float_as_uint(__fmul_rn(v, inv));
  const uint32_t sign = qb & 0x80000000u;
  const uint32_t ab = min(qb ^ sign, 0x43E00000u);
  const float q = __uint_as_float(__float_as_uint(e4m3_round_mag(__uint_as_float(ab))) | sign);
  out[blk * 32 + lane] = (uint8_t)e4m3_code_of_exact(q);
  if (lane == 0) out[n + blk] = (uint8_t)(e + 127);
}

// fp4_kv_pack: two E4M3-scaled 16-channel blocks per warp.
__device__ __forceinline__ void fp4_kv_lane(float v, int lane, int blk, int n, uint8_t* out) {
  const int ch = blk * 32 + lane;
  const float amax = group_amax(v, 16);
  const float s = e4m3_round_mag(fminf(__fdiv_rn(fmaxf(amax, 6.0f * 0x1p-9f), 6.0f), 448.0f));
  const uint32_t code = e2m1_code(__fdiv_rn(v, s));
  const uint32_t hi = __shfl_down_sync(0xffffffffu, code, 1);
  if ((lane & 1) == 0) out[ch >> 1] = (uint8_t)(code | (hi << 4));
  if ((lane & 15) == 0) out[n / 2 + ch / 16] = (uint8_t)e4m3_code_of_exact(s);
}

// fp4_index_pack: UE8M0 scale per 32 channels; out == null: returns the decoded value
// (fake quantisation) instead of writing codes.
__device__ __forceinline__ float fp4_index_lane(float v, int lane, int blk, int n, uint8_t* out) {
  const int ch = blk * 32 + lane;
  const float amax = group_amax(v, 32);
  const int e = pow2_ceil_exponent(__fmul_rn(fmaxf(amax, 6.0f * 0x1p-126f), (float)(1.0 / 6.0)));
  const uint32_t code = e2m1_code(__fmul_rn(v, ldexpf(1.0f, -e)));
  if (!out) return e2m1_code_value(code) * ldexpf(1.0f, e);
  const uint32_t hi = __shfl_down_sync(0xffffffffu, code, 1);
  if ((lane & 1) == 0) out[ch >> 1] = (uint8_t)(code | (hi << 4));
  if (lane == 0) out[n / 2 + blk] = (uint8_t)(e + 127);
  return v;
}

// The FP4 index round trip of each row in place, one warp per 32 channels.
__global__ void fp4_index_fake_kernel(float* x, int n) {
  pdl_entry();
  const int r = blockIdx.x, lane = threadIdx.x & 31;
  for (int blk = threadIdx.x >> 5; blk < n / 32; blk += blockDim.x >> 5) {
    float* v = x + (size_t)r * n + blk * 32 + lane;
    *v = fp4_index_lane(*v, lane, blk, n, nullptr);
  }
}

// norm -> RoPE -> encode of vector rr of p per block, a thread per channel (blockDim ≥ n, a
// multiple of 32; warps past n take part in the block's barriers only): what rms_norm,
// rope_rows and a separate encoder would give, in one launch.
__device__ __forceinline__ void norm_rope_pack_row(const norm_rope_pack_params& p, int rr) {
  __shared__ float part[32];
  const int row = rr / p.nvec, c = threadIdx.x, lane = c & 31, n = p.n;
  const bool active = c < n;  // whole warps (n % 32 == 0)
  float* xr = p.x + (size_t)rr * n;
  // every load up front (one round trip to memory, not one per stage): the channel, its norm
  // weight, its RoPE angle, the row's destination
  float v = active ? xr[c] : 0.0f;
  const float g = p.norm_w && active ? p.norm_w[c] : 0.0f;
  const int k = c - (n - 2 * p.np);
  const bool rot = p.np > 0 && active && k >= 0;
  const float cs = rot ? p.cos[(size_t)row * p.np + (k >> 1)] : 0.0f;
  const float sn = rot ? p.sin[(size_t)row * p.np + (k >> 1)] : 0.0f;
  uint8_t* out = p.dst && active ? p.dst[row] : nullptr;
  if (p.norm_w) {
    float ss = v * v;
    for (int off = 16; off; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
    if (lane == 0 && active) part[c >> 5] = ss;
    __syncthreads();
    if (c < 32) {
      float t = c < (n >> 5) ? part[c] : 0.0f;
      for (int off = 16; off; off >>= 1) t += __shfl_xor_sync(0xffffffffu, t, off);
      if (c == 0) part[0] = t;
    }
    __syncthreads();
    if (active) v = v * rsqrtf(part[0] / (float)n + p.eps) * g;
  }
  if (!active) return;
  if (p.np > 0) {  // pairs (2i, 2i+1) of the last 2·np channels (an even start: lanes c, c ^ 1)
    const float other = __shfl_xor_sync(0xffffffffu, v, 1);
    if (rot)
      v = (k & 1) == 0 ? __fsub_rn(__fmul_rn(v, cs), __fmul_rn(other, sn))
                       : __fadd_rn(__fmul_rn(other, sn), __fmul_rn(v, cs));
  }
  switch (p.kind) {
    case pack_kind::fp8_swa:
      if (out) fp8_swa_lane(v, lane, c >> 5, n, out);
      break;
    case pack_kind::fp4_kv:
      if (out) fp4_kv_lane(v, lane, c >> 5, n, out);
      break;
    case pack_kind::fp4_index:
      if (out) fp4_index_lane(v, lane, c >> 5, n, out);
      break;
    case pack_kind::fp4_index_fake:
      v = fp4_index_lane(v, lane, c >> 5, n, nullptr);
      break;
    case pack_kind::none:
      break;
  }
  if (p.write_back) xr[c] = v;
}

__global__ void __launch_bounds__(1024) norm_rope_pack_kernel(norm_rope_pack_params p) {
  pdl_entry();
  norm_rope_pack_row(p, blockIdx.x);
}

// Several independent jobs in one launch: block b belongs to the job whose range of rows holds it.
struct norm_rope_pack_group {
  int n = 0;
  norm_rope_pack_params job[k_norm_rope_pack_max];
  int start[k_norm_rope_pack_max + 1] = {};
};

__global__ void __launch_bounds__(1024) norm_rope_pack_group_kernel(norm_rope_pack_group g) {
  pdl_entry();
  int j = 0;
  while (j + 1 < g.n && (int)blockIdx.x >= g.start[j + 1]) ++j;
  norm_rope_pack_row(g.job[j], (int)blockIdx.x - g.start[j]);
}

status check(const char* op, int R, int n, int block, const void* a, const void* b) {
  if (R <= 0 || n <= 0 || n % block != 0 || !a || !b)
    return make_error(errc::invalid_argument, std::string(op) + ": bad shape (rows " + std::to_string(R) +
                                                  ", n " + std::to_string(n) + ", must be a multiple of " +
                                                  std::to_string(block) + ") or null pointer");
  return {};
}

int block_threads(int n) { return n >= 256 ? 256 : ((n + 31) / 32) * 32; }

}  // namespace

status rope_rows(float* x, int R, int nvec, int n, int np, const float* cos, const float* sin, bool inverse,
                 cudaStream_t stream) {
  if (R <= 0 || nvec <= 0 || np <= 0 || 2 * np > n || !x || !cos || !sin)
    return make_error(errc::invalid_argument, "rope_rows: bad shape (rows " + std::to_string(R) + ", n " +
                                                  std::to_string(n) + ", pairs " + std::to_string(np) +
                                                  ") or null pointer");
  launch_kernel(rope_rows_kernel, R, 128, 0, stream, x, nvec, n, np, cos, sin, inverse ? -1.0f : 1.0f);
  CEDAR_CUDA_LAUNCHED("rope_rows");
  return {};
}

status fp4_index_fake_quant(float* x, int rows, int n, cudaStream_t stream) {
  CEDAR_TRY(check("fp4_index_fake_quant", rows, n, 32, x, x));
  launch_kernel(fp4_index_fake_kernel, rows, block_threads(n), 0, stream, x, n);
  CEDAR_CUDA_LAUNCHED("fp4_index_fake_quant");
  return {};
}

namespace {
status check_job(const norm_rope_pack_params& p) {
  auto bad = [](const std::string& what) { return make_error(errc::invalid_argument, "norm_rope_pack: " + what); };
  if (p.R <= 0 || p.nvec <= 0 || p.R % p.nvec != 0) return bad("rows must be a positive multiple of nvec");
  if (p.n <= 0 || p.n % 32 != 0 || p.n > 1024) return bad("n " + std::to_string(p.n) + " must be a multiple of 32, at most 1024");
  if (!p.x) return bad("null x");
  if (p.np < 0 || 2 * p.np > p.n || (p.np > 0 && (!p.cos || !p.sin))) return bad("bad RoPE pairs or null cos/sin");
  const bool packs = p.kind == pack_kind::fp8_swa || p.kind == pack_kind::fp4_kv || p.kind == pack_kind::fp4_index;
  if (packs && (!p.dst || p.nvec != 1)) return bad("an encoder needs dst and one vector per row");
  return {};
}
}  // namespace

status norm_rope_pack(const norm_rope_pack_params& p, cudaStream_t stream) {
  CEDAR_TRY(check_job(p));
  launch_kernel(norm_rope_pack_kernel, (unsigned)p.R, (unsigned)p.n, 0, stream, p);
  CEDAR_CUDA_LAUNCHED("norm_rope_pack");
  return {};
}

status norm_rope_pack_many(const norm_rope_pack_params* jobs, int n, cudaStream_t stream) {
  if (n <= 0 || n > k_norm_rope_pack_max || !jobs)
    return make_error(errc::invalid_argument, "norm_rope_pack_many: 1.." + std::to_string(k_norm_rope_pack_max) +
                                                  " jobs (got " + std::to_string(n) + ")");
  if (n == 1) return norm_rope_pack(jobs[0], stream);
  norm_rope_pack_group g;
  g.n = n;
  int threads = 32, blocks = 0;
  for (int j = 0; j < n; ++j) {
    CEDAR_TRY(check_job(jobs[j]));
    g.job[j] = jobs[j];
    g.start[j] = blocks;
    blocks += jobs[j].R;
    threads = std::max(threads, jobs[j].n);
  }
  g.start[n] = blocks;
  launch_kernel(norm_rope_pack_group_kernel, (unsigned)blocks, (unsigned)threads, 0, stream, g);
  CEDAR_CUDA_LAUNCHED("norm_rope_pack_many");
  return {};
}

}  // namespace cedar::kernels::cuda
