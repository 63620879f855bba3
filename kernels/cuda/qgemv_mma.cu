// qgemv_mma — see qgemv_mma.cuh (schedule, fragment layout, precision). Kernel template over
// (NT activation tiles of 8 rows, MW 16-row weight tiles per row warp); the host picks NT from
// m (2, 4, 8) and MW from how many blocks 128-row blocks would give.
#include "kernels/cuda/qgemv_mma.cuh"

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/launch.cuh"

#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

namespace cedar::kernels::cuda {
namespace {

constexpr int k_row_warps = 4;                            // warps across a block's weight rows
constexpr int k_col_warps = 2;                            // warps across a chunk's columns
constexpr int k_threads = 32 * k_row_warps * k_col_warps;  // 256
constexpr int k_chunk = 64 * k_col_warps;                 // columns of x staged per step: 128
constexpr int k_units = k_chunk / 8;                      // 16-byte (8 bf16) units per staged row
constexpr int k_m_max = 64;                               // activation rows per block (grid.y beyond)
constexpr int k_stage_rows = k_threads / (k_chunk / 4);   // x rows one staging pass covers: 8
static_assert(k_stage_rows == 8, "one staging pass fills one 8-row activation tile");

// Staged x chunk and, after the last chunk, column warp 1's partial sums (same bytes).
//   hi, lo: [8·NT x rows, k_chunk columns] bf16 as 16-byte units; unit q of row r is stored at
//   q ^ 4·(r & 1), so the 8 lanes of a quarter warp (rows 2i, 2i+1; units 4s .. 4s+3) hit
//   8 distinct 16-byte bank groups.
//   red: [row warp][accumulator][lane] fp32.
template <int NT, int MW>
union mma_shared {
  struct {
    uint4 hi[NT * 8][k_units];
    uint4 lo[NT * 8][k_units];
  } x;
  float red[k_row_warps][MW * NT * 4][32];
};

__device__ __forceinline__ int swizzle(int row, int unit) { return unit ^ ((row & 1) << 2); }

__device__ __forceinline__ uint32_t bf16x2_bits(__nv_bfloat162 v) {
  uint32_t u;
  memcpy(&u, &v, sizeof u);
  return u;
}

// c[16 × 8] += A[16 × 16] · B[16 × 8], bf16 in, fp32 accumulate (PTX fragment layout: a0..a3
// rows {g, g+8} × k pairs {2t, 2t+8}; b0, b1 column g × k pairs {2t, 2t+8}; c rows {g, g+8} ×
// columns {2t, 2t+1}).
__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

// This warp's weight fragments of the chunk at column k0: a[mt][h][s] = 16 bytes of view row
// R + 16·mt + 8·h + g, columns k0 + 32·(2·kw + s) + 8t .. + 8 (zeros past the rows or cols;
// cols % 8 == 0, so a run is all in or all out).
template <int MW>
__device__ __forceinline__ void load_w(const qmatrix& w, int64_t R, int64_t k0, int kw, int g, int t,
                                       uint4 (&a)[MW][2][2]) {
  const uint16_t* base = static_cast<const uint16_t*>(w.data);
#pragma unroll
  for (int mt = 0; mt < MW; mt++)
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
      for (int s = 0; s < 2; s++) {
        const int64_t r = R + 16 * mt + 8 * h + g, c = k0 + 32 * (2 * kw + s) + 8 * t;
        a[mt][h][s] = r < w.rows && c < w.cols ? __ldg(reinterpret_cast<const uint4*>(base + (w.row0 + r) * w.cols + c))
                                               : make_uint4(0u, 0u, 0u, 0u);
      }
}

// This thread's share of the x chunk at column k0: column k0 + 4·(tid % 32) (a float4) of
// activation rows m0 + tid / 32 + 8i, i < NT (zeros past m or cols), and the norm weights of
// that column when x_norm_w is set.
template <int NT>
__device__ __forceinline__ void load_x(const qgemv_params& p, int m0, int64_t k0, int tid, float4 (&v)[NT],
                                       float4& gw) {
  const int64_t c = k0 + 4 * (tid & 31);
  const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (int i = 0; i < NT; i++) {
    const int n = m0 + (tid >> 5) + k_stage_rows * i;
    v[i] = n < p.m && c < p.w.cols ? __ldg(reinterpret_cast<const float4*>(p.x + (int64_t)n * p.ldx + c)) : zero;
  }
  gw = p.x_norm_w && c < p.w.cols ? __ldg(reinterpret_cast<const float4*>(p.x_norm_w + c)) : zero;
}

// load_x's values -> shared memory as hi = bf16(x), lo = bf16(x − hi) (normalised first when
// x_norm_w is set; inv[r] the row factors).
template <int NT, int MW>
__device__ __forceinline__ void stage_x(mma_shared<NT, MW>& sh, const float4 (&v)[NT], float4 gw, const float* inv,
                                        bool norm, int tid) {
  const int c4 = tid & 31, unit = c4 >> 1, half = c4 & 1;
#pragma unroll
  for (int i = 0; i < NT; i++) {
    const int r = (tid >> 5) + k_stage_rows * i;
    const float4 a = norm ? x_norm_apply(v[i], inv[r], gw) : v[i];
    const __nv_bfloat162 h01 = __floats2bfloat162_rn(a.x, a.y), h23 = __floats2bfloat162_rn(a.z, a.w);
    const float2 f01 = __bfloat1622float2(h01), f23 = __bfloat1622float2(h23);
    const __nv_bfloat162 l01 = __floats2bfloat162_rn(a.x - f01.x, a.y - f01.y);
    const __nv_bfloat162 l23 = __floats2bfloat162_rn(a.z - f23.x, a.w - f23.y);
    const int u = swizzle(r, unit);
    reinterpret_cast<uint2*>(&sh.x.hi[r][u])[half] = make_uint2(bf16x2_bits(h01), bf16x2_bits(h23));
    reinterpret_cast<uint2*>(&sh.x.lo[r][u])[half] = make_uint2(bf16x2_bits(l01), bf16x2_bits(l23));
  }
}

// The MMAs of one staged chunk for column warp kw: its two 32-column sub-chunks s, each two
// k16 steps (physical columns 8t .. 8t+3, then 8t+4 .. 8t+7 of every lane's run), each step
// W·hi then W·lo into the same accumulators.
template <int NT, int MW>
__device__ __forceinline__ void mma_chunk(const mma_shared<NT, MW>& sh, const uint4 (&a)[MW][2][2],
                                          float (&acc)[MW][NT][4], int kw, int g, int t) {
#pragma unroll
  for (int s = 0; s < 2; s++) {
    const int u = swizzle(g, 4 * (2 * kw + s) + t);  // rows 8j + g share g's parity
#pragma unroll
    for (int j = 0; j < NT; j++) {
      const uint4 bh = sh.x.hi[8 * j + g][u], bl = sh.x.lo[8 * j + g][u];
#pragma unroll
      for (int mt = 0; mt < MW; mt++)
        mma_bf16(acc[mt][j], a[mt][0][s].x, a[mt][1][s].x, a[mt][0][s].y, a[mt][1][s].y, bh.x, bh.y);
#pragma unroll
      for (int mt = 0; mt < MW; mt++)
        mma_bf16(acc[mt][j], a[mt][0][s].x, a[mt][1][s].x, a[mt][0][s].y, a[mt][1][s].y, bl.x, bl.y);
#pragma unroll
      for (int mt = 0; mt < MW; mt++)
        mma_bf16(acc[mt][j], a[mt][0][s].z, a[mt][1][s].z, a[mt][0][s].w, a[mt][1][s].w, bh.z, bh.w);
#pragma unroll
      for (int mt = 0; mt < MW; mt++)
        mma_bf16(acc[mt][j], a[mt][0][s].z, a[mt][1][s].z, a[mt][0][s].w, a[mt][1][s].w, bl.z, bl.w);
    }
  }
}

// Block bx of an item: weight rows [bx·64·MW, +64·MW), activation rows [by·64, +64) ∩ [0, m).
template <int NT, int MW>
__device__ __forceinline__ void mma_body(const qgemv_params& p, unsigned bx, unsigned by) {
  __shared__ mma_shared<NT, MW> sh;
  __shared__ float inv[NT * 8];  // RMSNorm factors of the staged rows (x_norm_w)
  const int tid = (int)threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int rw = warp % k_row_warps, kw = warp / k_row_warps;
  const int64_t R = ((int64_t)bx * k_row_warps + rw) * 16 * MW;
  const int m0 = (int)by * k_m_max;
  const int64_t cols = p.w.cols;
  const bool norm = p.x_norm_w != nullptr;

  uint4 a[MW][2][2];
  float4 xv[NT], gw;
  load_w<MW>(p.w, R, 0, kw, g, t, a);
  load_x<NT>(p, m0, 0, tid, xv, gw);
  if (norm) {  // the staged rows' factors: given, or summed here (rms_norm's formula)
    const int rows_here = min(NT * 8, p.m - m0);
    if (p.x_norm_inv) {
      for (int r = tid; r < NT * 8; r += k_threads) inv[r] = r < rows_here ? __ldg(p.x_norm_inv + m0 + r) : 1.0f;
    } else {
      for (int r = warp; r < NT * 8; r += k_threads / 32) {
        float ss = 0.0f;
        if (r < rows_here) {
          const float4* xr = reinterpret_cast<const float4*>(p.x + (int64_t)(m0 + r) * p.ldx);
#pragma unroll 4
          for (int64_t c4 = lane; c4 < cols / 4; c4 += 32) {
            const float4 v = __ldg(xr + c4);
            ss = fmaf(v.x, v.x, ss);
            ss = fmaf(v.y, v.y, ss);
            ss = fmaf(v.z, v.z, ss);
            ss = fmaf(v.w, v.w, ss);
          }
        }
#pragma unroll
        for (int off = 16; off; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
        if (lane == 0) inv[r] = r < rows_here ? rsqrtf(ss / (float)cols + p.x_norm_eps) : 1.0f;
      }
    }
    __syncthreads();
  }
  stage_x<NT, MW>(sh, xv, gw, inv, norm, tid);
  __syncthreads();

  float acc[MW][NT][4];
#pragma unroll
  for (int mt = 0; mt < MW; mt++)
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) acc[mt][j][e] = 0.0f;

  // one chunk of look-ahead: the next chunk's weights and x are in flight during the MMAs
  for (int64_t k0 = 0;;) {
    const int64_t next = k0 + k_chunk;
    uint4 an[MW][2][2];
    load_w<MW>(p.w, R, next, kw, g, t, an);
    load_x<NT>(p, m0, next, tid, xv, gw);
    mma_chunk<NT, MW>(sh, a, acc, kw, g, t);
    if (next >= cols) break;  // uniform across the block
    k0 = next;
    __syncthreads();  // every warp done reading the chunk
    stage_x<NT, MW>(sh, xv, gw, inv, norm, tid);
    __syncthreads();
#pragma unroll
    for (int mt = 0; mt < MW; mt++)
#pragma unroll
      for (int h = 0; h < 2; h++)
#pragma unroll
        for (int s = 0; s < 2; s++) a[mt][h][s] = an[mt][h][s];
  }

  // column warp 1's sums -> column warp 0, which adds them (fixed order) and writes y
  __syncthreads();  // the staged x is dead; red reuses its bytes
  if (kw == 1) {
#pragma unroll
    for (int mt = 0; mt < MW; mt++)
#pragma unroll
      for (int j = 0; j < NT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) sh.red[rw][(mt * NT + j) * 4 + e][lane] = acc[mt][j][e];
  }
  __syncthreads();
  if (kw == 1) return;
#pragma unroll
  for (int mt = 0; mt < MW; mt++)
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int64_t row = R + 16 * mt + g + 8 * (e >> 1);  // c fragment: rows g, g + 8
        const int n = m0 + 8 * j + 2 * t + (e & 1);           // columns 2t, 2t + 1
        if (row >= p.w.rows || n >= p.m) continue;
        const float v = acc[mt][j][e] + sh.red[rw][(mt * NT + j) * 4 + e][lane];
        float* yp = p.y + (int64_t)n * p.ldy + row;
        *yp = p.accumulate ? *yp + v : v;
      }
}

// Before waiting for the previous kernel (pdl_prefetch_entry): ask L2 for the weight rows of
// block bx (contiguous in the view).
template <int MW>
__device__ __forceinline__ void prefetch_block_rows(const qmatrix& w, unsigned bx) {
  constexpr int64_t rows_per_block = (int64_t)k_row_warps * 16 * MW;
  const int64_t r0 = (int64_t)bx * rows_per_block;
  const int64_t n = max((int64_t)0, min(rows_per_block, w.rows - r0));
  l2_prefetch(static_cast<const uint16_t*>(w.data) + (w.row0 + r0) * w.cols, (size_t)(n * w.cols * 2));
}

// Items of one launch (a single qgemv is a group of one): block x of item i is blockIdx.x −
// start[i]; grid.y tiles m by k_m_max.
struct mma_group {
  int n = 0;
  qgemv_params item[k_qgemv_group_max];
  unsigned start[k_qgemv_group_max + 1] = {};
};

template <int NT, int MW>
__global__ void __launch_bounds__(k_threads, 1) qgemv_mma_kernel(mma_group gr) {
  int i = 0;
  while (i + 1 < gr.n && blockIdx.x >= gr.start[i + 1]) ++i;
  pdl_prefetch_entry([&] {
    if (blockIdx.y == 0) prefetch_block_rows<MW>(gr.item[i].w, blockIdx.x - gr.start[i]);
  });
  mma_body<NT, MW>(gr.item[i], blockIdx.x - gr.start[i], blockIdx.y);
}

int g_sms = 0;  // multiprocessors of the current device (read once)

status read_sms() {
  if (g_sms) return {};
  int dev = 0;
  CEDAR_CUDA_TRY(cudaGetDevice(&dev), "qgemv (tensor cores): device");
  CEDAR_CUDA_TRY(cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, dev),
                 "qgemv (tensor cores): device attribute");
  return {};
}

template <int NT>
void launch_nt(bool wide, dim3 grid, cudaStream_t s, const mma_group& gr) {
  if (wide) launch_kernel(qgemv_mma_kernel<NT, 2>, grid, k_threads, 0, s, gr);
  else launch_kernel(qgemv_mma_kernel<NT, 1>, grid, k_threads, 0, s, gr);
}

// On unless CEDAR_CUDA_QGEMV_MMA=0, and only on devices with bf16 mma.sync (sm_80 and later;
// the kernel body is empty below that architecture, so an older device keeps the vector path).
int initial_mma() {
  const char* v = std::getenv("CEDAR_CUDA_QGEMV_MMA");
  if (v && std::strcmp(v, "0") == 0) return 0;
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
    return 0;
  return major >= 8 ? 1 : 0;
}

std::atomic<int>& mma_flag() {
  static std::atomic<int> flag{initial_mma()};
  return flag;
}

}  // namespace

bool qgemv_mma_enabled() { return mma_flag().load(std::memory_order_relaxed) != 0; }
void set_qgemv_mma(bool on) { mma_flag().store(on ? 1 : 0, std::memory_order_relaxed); }

bool qgemv_mma_applies(const qgemv_params& p) {
  return p.w.format == weight_format::bf16 && p.m > k_qgemv_m_tile && !p.glu_up.data && qgemv_mma_enabled();
}

status qgemv_mma(const qgemv_params* items, int n, cudaStream_t stream) {
  if (n < 1 || n > k_qgemv_group_max)
    return make_error(errc::invalid_argument, "qgemv (tensor cores): " + std::to_string(n) + " items (1 to " +
                                                  std::to_string(k_qgemv_group_max) + " per launch)");
  if (auto st = read_sms(); !st.ok()) return st;
  // 128-row blocks (MW 2) unless that leaves multiprocessors idle; then 64-row blocks
  int64_t wide_blocks = 0;
  for (int i = 0; i < n; ++i) wide_blocks += (items[i].w.rows + 127) / 128;
  const bool wide = wide_blocks >= g_sms;
  const int64_t rows_per_block = (int64_t)k_row_warps * 16 * (wide ? 2 : 1);
  mma_group gr;
  gr.n = n;
  unsigned blocks = 0;
  for (int i = 0; i < n; ++i) {
    gr.item[i] = items[i];
    gr.start[i] = blocks;
    blocks += (unsigned)((items[i].w.rows + rows_per_block - 1) / rows_per_block);
  }
  gr.start[n] = blocks;
  const int m = items[0].m, m_tile = std::min(m, k_m_max);
  const dim3 grid(blocks, (unsigned)((m + k_m_max - 1) / k_m_max));
  if (m_tile <= 16) launch_nt<2>(wide, grid, stream, gr);
  else if (m_tile <= 32) launch_nt<4>(wide, grid, stream, gr);
  else launch_nt<8>(wide, grid, stream, gr);
  CEDAR_CUDA_LAUNCHED("qgemv (tensor cores)");
  return {};
}

}  // namespace cedar::kernels::cuda
