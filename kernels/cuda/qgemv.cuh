// qgemv — the decode projections on the GPU: y[m, rows] = x[m, cols] · Wᵀ (+ y) for a few
// activation rows (m ≤ 64: one new token per sequence of a decode batch), with W kept in its
// checkpoint format and dequantised in registers (MODEL_SPEC §5 "Quantisation"). At batch 1
// this is a pure stream over the weight bytes, so its figure of merit is the fraction of the
// device's copy bandwidth it reaches (bench/bench_cuda.cpp prints it).
//
// W is described by kernels::qmatrix (kernels/cpu/qmatmul.hpp) whose data / scale pointers
// point into DEVICE memory; the formats and the block-scale indexing are the CPU path's:
//   f32 · bf16 · f8_e4m3 (+ UE8M0 or fp32 scale per scale_block_rows × 32) · fp4_e2m1 (+ per
//   1 × 32), a view's row0 offsets rows inside the tensor (block indexing stays global).
// The CPU qgemm_nt is the reference (tests/cuda compare with a double-accumulating oracle);
// the order of the fp32 sums differs.
//
// Schedule: a group of WS warps owns RW consecutive output rows (RW 1-2); each lane reads one
// 16-byte run of a row per step (8 bf16, 16 fp8 or 32 fp4 weights; f32 two) and dequantises
// it in registers, and each activation read serves all RW rows. WS = 4 warps split a row's
// columns (partials summed in shared memory, fixed order) when the matrix has too few rows to
// give every multiprocessor ~8 warps. Activation rows are taken 8 at a time (grid.y), so m > 8
// would re-read the weights once per tile: bf16 weights with m > 8 go instead to the tensor-core
// path (qgemv_mma.cuh: mma.sync bf16, x split into bf16 hi + lo for near-fp32 products, the
// weights read once per launch for m ≤ 64 and once per 64 rows of x beyond), in qgemv and
// qgemv_grouped alike; the other formats keep this schedule at every m.
// Requirements (checked, clear error): cols % 8 == 0, 16-byte-aligned rows for bf16/f32
// (cols % 8 == 0 gives it for aligned bases), ldx ≥ cols, ldy ≥ rows.
#pragma once

#include <cuda_runtime.h>

#include "kernels/base/result.hpp"
#include "kernels/cpu/qmatmul.hpp"
#include "kernels/cuda/mhc.cuh"
#include "kernels/cuda/moe.cuh"

namespace cedar::kernels::cuda {

struct qgemv_params {
  qmatrix w;                 // [rows, cols], device pointers
  int m = 0;                 // activation rows, 1..any (tiled by k_qgemv_m_tile, or 64 on tensor cores)
  const float* x = nullptr;  // [m, ldx] fp32, device
  int ldx = 0;
  float* y = nullptr;        // [m, ldy] fp32, device
  int ldy = 0;
  bool accumulate = false;   // y += x·Wᵀ instead of y = x·Wᵀ
  // (set by the launch from weights_evict_first(): the weight loads' L2 policy)
  bool evict_first = false;
  bool bulk_prefetch = false;  // (likewise: the pre-wait prefetches as evict-first bulk prefetches)
  // optional RMSNorm of each x row first (rms_norm's formula over the cols channels, weights
  // [cols]); saves the separate normalising launch when only projections read the normed row
  const float* x_norm_w = nullptr;
  float x_norm_eps = 0.0f;
  const float* x_norm_inv = nullptr;  // [m] the rows' factors when known (else each block sums the
                                      // squares in its pass over x and scales its sums at the end)
  // optional SwiGLU epilogue (an FFN's up projections in one item, no swiglu_rows launch after
  // them): w is the gate matrix and glu_up the up matrix, of the same format, shape and scale
  // layout (not f32); y[m, r] = swiglu_rows' a = silu(min(g, limit)) · clamp(u, ±limit) ·
  // glu_scale[m] (limit 0: no clamp; glu_scale null: 1) for g, u the two products — the same
  // sums as two plain items, so the same bits as those then swiglu_rows. y is rows wide. Always
  // the vector path (at m > k_qgemv_m_tile too: it re-reads the weights once per 8 rows).
  qmatrix glu_up;
  float glu_limit = 0.0f;
  const float* glu_scale = nullptr;  // [m]
};

constexpr int k_qgemv_m_tile = 8;
// The L2 policy of the vector path's weight stream: evict first (each weight is read once per
// step, so its lines are the ones to drop, not the kernels' code, the activations or the KV
// pages the next kernels and the next step read again): its loads carry an evict-first cache
// hint and its pre-wait prefetches go through the bulk-copy unit with the same policy. Off,
// the loads carry the evict-normal policy (a plain load's) and the prefetches are per line
// (=2: evict-first loads, per-line prefetches). The mode (0, 1 or 2) is 1 unless
// CEDAR_CUDA_WEIGHTS_EVICT_FIRST says otherwise (read once); set_weights_evict_mode overrides
// (tests, A/B runs; a mode outside 0..2 is taken as 1). Process-wide.
int weights_evict_mode();
void set_weights_evict_mode(int mode);
inline bool weights_evict_first() { return weights_evict_mode() != 0; }

// Diagnostic switch for the tensor-core path (bf16, m > k_qgemv_m_tile): on unless the
// environment has CEDAR_CUDA_QGEMV_MMA=0 (read once) or the device predates sm_80 (no bf16 mma.sync); set_qgemv_mma overrides (tests and
// benchmarks comparing both paths). Off, every item takes the vector path. Process-wide.
bool qgemv_mma_enabled();
void set_qgemv_mma(bool on);

status qgemv(const qgemv_params& p, cudaStream_t stream);

// Several independent projections with the same m (e.g. every matrix that reads the same
// normalised hidden state: q_a, kv, compressor, index keys; or a token's experts) in one launch
// per weight class (format and load width) instead of one per matrix — at decode sizes a launch
// costs as much as moving a few MB, so fewer launches is most of the speed. Same results as
// one qgemv per item (same kernel body, same sums). Items must not write overlapping outputs.
constexpr int k_qgemv_group_max = 16;
status qgemv_grouped(const qgemv_params* items, int n, cudaStream_t stream);
// qgemv_grouped, and an mHC site's mix reduction (hc_post with its partials: pre, post, comb for
// the next site) in extra blocks of the first launch, one per row, after the items' blocks —
// instead of a launch of its own on a side stream, whose fork and join the step's graph would
// carry. The same bits as hc_post(mix) then qgemv_grouped. At hc = 4 and on the vector path;
// otherwise (or when the first launch takes the tensor cores, several activation tiles or a
// SwiGLU item) hc_post runs first on the stream.
status qgemv_grouped_with_mix(const qgemv_params* items, int n, const hc_post_params& mix, cudaStream_t stream);

// Projections whose matrix is picked on the device (a token's routed experts): item i
// (0 ≤ i < n) computes y[i, 0 : A] = wa[sel[i]] · x[i / x_div] and, when wb is given,
// y[i, A : A + B] = wb[sel[i]] · x[i / x_div] (A, B the rows of like_a, like_b). wa, wb are
// device arrays of views (device pointers), one per expert, all of like_a's (like_b's) format
// and shape: the launch is chosen, and the shapes checked, on those copies of one expert's views. Same schedule and sums as qgemv at
// m = 1 (a vector load per lane, not an element per lane): each item streams its expert once.
struct qgemv_expert_params {
  const qmatrix* wa = nullptr;  // [E] device array
  const qmatrix* wb = nullptr;  // [E] device array, or null
  qmatrix like_a, like_b;       // one expert's views (device pointers): format, shape, alignment
  const int32_t* sel = nullptr; // [n] expert ids (device)
  int n = 0, x_div = 1;
  const float* x = nullptr;     // [n / x_div, ldx]
  int ldx = 0;
  float* y = nullptr;           // [n, ldy], ldy ≥ A + B
  int ldy = 0;
  const float* x_norm_w = nullptr;  // as qgemv_params: x rows RMS-normalised on the fly
  float x_norm_eps = 0.0f;
  const float* x_norm_inv = nullptr;  // [n / x_div] the rows' factors when known
  // route: sel is not read but decided here (moe_up's route): every block routes its row
  // (item i / x_div, x_div = rp.K) with moe_route's warp and the first block of each row writes
  // rp.sel and rp.weight (rp.sel == sel)
  bool route = false;
  moe_route_params rp;
  // glu: SwiGLU epilogue (qgemv_params' glu_up): wa the gate matrices, wb the up matrices, and
  // y[i, 0 : A] = silu(min(g, glu_limit)) · clamp(u, ±glu_limit) · weight of item i — route's
  // weight of the item (computed in the block, the same bits as moe_route's) when routing, else
  // glu_scale[i] (null: 1); ldy ≥ A
  bool glu = false;
  float glu_limit = 0.0f;
  const float* glu_scale = nullptr;  // [n]
  // x_glu: SwiGLU on load (moe_down_swiglu): the items' x rows hold [gate | up], like_a.cols
  // each (ldx and fixed_ldx ≥ 2 · cols), and each block first computes its item's activation
  // silu(min(g, x_glu_limit)) · clamp(u, ±x_glu_limit) · x_glu_scale[i] (null, and fixed items:
  // 1) into shared memory — swiglu_rows' bits, so the results are those of swiglu_rows then this
  // launch, one launch fewer. Not with wb, route, glu or the on-the-fly norm; cols ≤
  // k_x_glu_max_cols.
  bool x_glu = false;
  float x_glu_limit = 0.0f;
  const float* x_glu_scale = nullptr;  // [n]
  bool evict_first = false;  // (set by the launch: weights_evict_first())
  // fixed items (the shared expert's down projection beside the routed ones, in one launch):
  // items n .. n + n_fixed − 1 read matrix fixed_a (a view of like_a's format, shape and scale
  // layout), x row fixed_x + (i − n) · fixed_ldx, y row fixed_y + (i − n) · fixed_ldy; not with
  // wb, route, glu or the on-the-fly norm. Bit for bit the rows of one launch of all n + n_fixed
  // items over an expert array that also holds fixed_a, the fixed items' id
  int n_fixed = 0;
  qmatrix fixed_a;
  const float* fixed_x = nullptr;
  int fixed_ldx = 0;
  float* fixed_y = nullptr;
  int fixed_ldy = 0;
};
constexpr int64_t k_x_glu_max_cols = 12288;  // (48 KB of shared memory: one fp32 activation row)
status qgemv_expert(const qgemv_expert_params& p, cudaStream_t stream);
// Whether two weight views are alike for one expert launch: format, shape and scale layout
// (a fixed item's matrix must be like the experts'; the caller can test before asking).
bool same_layout(const qmatrix& a, const qmatrix& b);

// y[m, n] = x[m, n] · rsqrt(mean(x²) + eps) · weight[n] (MODEL_SPEC §1 RMSNorm), fp32, one
// block per row. x and y may alias.
status rms_norm(const float* x, const float* weight, float* y, int m, int n, float eps,
                cudaStream_t stream);

}  // namespace cedar::kernels::cuda
