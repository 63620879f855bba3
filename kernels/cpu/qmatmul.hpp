// qmatmul — y = x · Wᵀ with the weight W kept in its stored (checkpoint) format and
// dequantised on the fly, block by block (MODEL_SPEC §5 "Quantisation").
//
// Owns: the weight-matrix view (qmatrix: format, shape, data and block-scale pointers, a row
// offset for slices), row dequantisation, the quantised GEMM qgemm_nt and its scalar oracle,
// and the encoders that produce the checkpoint's block formats from fp32 (for writers/tests).
// Does not own: the bytes (a qmatrix never owns memory: it points into a checkpoint's mapping
// or into an engine's own buffers, which must outlive it), the KV-cache codecs (quant.hpp).
//
// Formats (W [rows, cols] logical, row-major):
//   f32       float  [rows, cols]                         used as is (OpenBLAS, bit-identical
//                                                          to the plain fp32 path)
//   bf16      uint16 [rows, cols]                         value = bf16 bits << 16
//   f8_e4m3   uint8  [rows, cols] OCP E4M3FN codes        value = e4m3(code) · scale(r, c)
//   fp4_e2m1  uint8  [rows, cols/2], element 2i in the LOW nibble of byte i, E2M1 codes
//                                                          value = e2m1(code) · scale(r, c)
//   scale(r, c) = scales[((row0 + r) / scale_block_rows) · scale_cols + c / 32], one scale per
//   block of scale_block_rows × 32: 32×32 for dense FP8 weights, 1×32 for FP4 experts and
//   FP8 Engram tables. Scales are UE8M0 bytes (scale_e8m0) or decoded fp32 (scale_f32).
// Invariants: fp4 cols % 32 == 0; f8/fp4 have exactly one scale pointer; a slice keeps the
// tensor's data/scale base pointers and moves row0, so block-scale indexing stays global.
//
// qgemm_nt strategy (same numerics, different schedules):
//   f32                 -> gemm_nt_ld (OpenBLAS), unchanged;
//   m ≤ k_qgemm_small_m -> per weight row: dequantise it into an L1 buffer, dot it with the
//                          m activation rows (16-lane fp32 accumulators); rows split over the
//                          kernel worker threads. This is decode: weight bytes dominate, so
//                          reading bf16/fp8/fp4 instead of fp32 is what makes it faster;
//   m >  k_qgemm_small_m -> each worker dequantises tiles of its share of the weight rows
//   (or any f32)            (≤ 512 KB fp32) and runs a single-threaded OpenBLAS sgemm over
//                          them; each tile is reused across all m rows (prefill).
// Results equal the fp32 GEMM of the dequantised weight up to fp32 accumulation order.
// Threading: one process-wide pool of (cpu_threads() − 1) helpers; concurrent callers that
// find it busy run single-threaded. Starting the pool sets OpenBLAS to one thread (its own
// spinning workers would compete with the pool for the cores). Scratch is thread_local and
// grown once (decode steps do not allocate once warm).
#pragma once

#include <cstddef>
#include <cstdint>

namespace cedar::kernels {

enum class weight_format : uint8_t { f32, bf16, f8_e4m3, fp4_e2m1 };
const char* weight_format_name(weight_format f);

struct qmatrix {
  weight_format format = weight_format::f32;
  int64_t rows = 0;                     // logical rows of this view
  int64_t cols = 0;                     // logical columns (fp4: twice the stored bytes per row)
  const void* data = nullptr;           // base of the stored tensor (row 0 of the tensor)
  int64_t row0 = 0;                     // first tensor row of this view
  const uint8_t* scale_e8m0 = nullptr;  // f8/fp4: UE8M0 scales, or
  const float* scale_f32 = nullptr;     // f8/fp4: fp32 scales
  int scale_block_rows = 1;             // rows per scale block (32 or 1)
  int64_t scale_cols = 0;               // scales per row of blocks: ceil(cols / 32)

  bool empty() const { return rows == 0 || data == nullptr; }
  // Rows [r0, r0 + n) of this view.
  qmatrix slice_rows(int64_t r0, int64_t n) const;
  // fp32 pointer of row r; only for format f32.
  const float* f32_row(int64_t r) const {
    return static_cast<const float*>(data) + (size_t)(row0 + r) * (size_t)cols;
  }
  // Bytes of weight data this view covers (scales excluded).
  size_t data_bytes() const;
};

// When `bottom`'s rows directly follow `top`'s in memory (same format f32 or bf16, same cols),
// sets *out to the [top.rows + bottom.rows, cols] view of both and returns true. Lets a caller
// run one GEMM over two stacked weights (an expert's w1/w3) as the fp32 path always did.
bool stacked_view(const qmatrix& top, const qmatrix& bottom, qmatrix* out);

// Views over caller-owned memory.
qmatrix qmatrix_f32(const float* w, int64_t rows, int64_t cols);
qmatrix qmatrix_bf16(const uint16_t* w, int64_t rows, int64_t cols);

// Rows [r0, r0 + n) of w dequantised to fp32: out [n, w.cols].
void dequant_rows(const qmatrix& w, int64_t r0, int64_t n, float* out);

// C[m, w.rows] = alpha · A[m, w.cols] · Wᵀ + beta · C; lda, ldc are row strides (in floats).
// beta == 0: C is written without being read.
void qgemm_nt(int m, const float* a, int lda, const qmatrix& w, float* c, int ldc, float alpha = 1.0f,
              float beta = 0.0f);
inline void qgemm_nt(int m, const float* a, const qmatrix& w, float* c) {
  qgemm_nt(m, a, (int)w.cols, w, c, (int)w.rows, 1.0f, 0.0f);
}

namespace detail {
// qgemm_nt cut into at most `max_parts` parts (1..16; more parts than threads run on the
// caller). Results do not depend on max_parts (tests check it: a session replays the same
// logits on a machine with another core count).
void qgemm_nt_split(int max_parts, int m, const float* a, int lda, const qmatrix& w, float* c, int ldc,
                    float alpha, float beta);
}  // namespace detail

// Threads the CPU kernels use (starts the pool): CEDAR_THREADS (1..16) when set, else the CPUs
// of the process's affinity mask, at most 16.
int cpu_threads();

// Activation-row count up to which qgemm_nt uses the row-dot (decode) schedule.
constexpr int k_qgemm_small_m = 8;

// ---- encoders (fp32 -> checkpoint formats), for checkpoint writers and tests ---------------
// FP8 E4M3 with one UE8M0 scale per block_rows × 32 block (block_rows 32 or 1):
// scale = 2^ceil(log2(max(amax, 2^-126·448) / 448)), code = e4m3(x / scale).
// codes [rows, cols]; scales [ceil(rows/block_rows), ceil(cols/32)].
void quantise_f8_blocks(const float* w, int64_t rows, int64_t cols, int block_rows, uint8_t* codes,
                        uint8_t* scales);
// FP4 E2M1, element 2i in the low nibble, one UE8M0 scale per row × 32 columns:
// scale = 2^ceil(log2(max(amax, 6·2^-126) / 6)), code = e2m1(x / scale). cols % 32 == 0.
// packed [rows, cols/2]; scales [rows, cols/32].
void quantise_fp4_rows(const float* w, int64_t rows, int64_t cols, uint8_t* packed, uint8_t* scales);

namespace ref {
// Oracle: dequantises each element with the scalar codecs of quant.hpp (no tables) and
// accumulates in double. Same contract as kernels::qgemm_nt.
void qgemm_nt(int m, const float* a, int lda, const qmatrix& w, float* c, int ldc, float alpha,
              float beta);
float qmatrix_at(const qmatrix& w, int64_t r, int64_t c);  // one element, by definition
}  // namespace ref

}  // namespace cedar::kernels
