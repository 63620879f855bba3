// gather — see gather.cuh. One block per gathered row or span.
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/gather.cuh"
#include "kernels/cuda/qmatrix_device.cuh"

#include <string>

namespace cedar::kernels::cuda {
namespace {

// F: the table's format (k_format_any: every format, qmatrix_at's switch inline 8 times: 49 KB
// of code for a one-block launch at the head of every step; bf16 / f32: a few KB).
template <int F>
__global__ void embed_rows_kernel(qmatrix t, const int32_t* tok, int copies, float* X) {
  pdl_entry();
  const int r = blockIdx.x;
  const int64_t d = t.cols;
  const int64_t row = tok[r];
  strided_batched<8, float>(
      (int)d, [&](int i) { return qmatrix_at_as<F>(t, row, i); },
      [&](int i, float v) {
        for (int k = 0; k < copies; ++k) X[((int64_t)r * copies + k) * d + i] = v;
      });
}

template <int F>
__global__ void table_rows_kernel(qmatrix t, const int64_t* ids, int n_layers, int layer, int n_cols, float* out) {
  pdl_entry();
  const int r = blockIdx.x, j = blockIdx.y;
  const int64_t w = t.cols;
  const int64_t row = ids[((int64_t)r * n_layers + layer) * n_cols + j];
  float* o = out + ((int64_t)r * n_cols + j) * w;
  strided_batched<8, float>((int)w, [&](int i) { return qmatrix_at_as<F>(t, row, i); }, [&](int i, float v) { o[i] = v; });
}

// The format a gather of table t is compiled for (generic_kernels.hpp).
int gather_format(const qmatrix& t) {
  if (generic_kernels() & generic_gathers) return k_format_any;
  if (t.format == weight_format::bf16) return (int)weight_format::bf16;
  if (t.format == weight_format::f32) return (int)weight_format::f32;
  return k_format_any;
}

__global__ void copy_spans_kernel(const uint8_t* const* src, uint8_t* const* dst, const uint32_t* len) {
  pdl_entry();
  const int i = blockIdx.x;
  const uint8_t* s = src[i];
  uint8_t* d = dst[i];
  for (uint32_t b = threadIdx.x; b < len[i]; b += blockDim.x) d[b] = s[b];
}

// Chunk j of the spans (l2_bulk_prefetch's 64 KB, counted over the spans in order) goes to
// thread j mod (blocks × threads): a few bulk prefetches per thread, on the copy units of
// several multiprocessors.
constexpr int k_l2_blocks = 16, k_l2_threads = 32;

__global__ void l2_prefetch_kernel(l2_prefetch_params p) {
  pdl_prefetch_entry([&] {  // (only prefetches: nothing of the step is read or written)
    const unsigned t = blockIdx.x * blockDim.x + threadIdx.x, nt = gridDim.x * blockDim.x;
    const uint64_t pol = make_l2_policy(l2_policy::evict_normal);
    unsigned j = 0;  // chunks before span s
    for (int s = 0; s < p.n; ++s) j += l2_bulk_prefetch(p.p[s], p.bytes[s], pol, (t + nt - j % nt) % nt, nt);
  });
}

}  // namespace

status embed_rows(const qmatrix& table, const int32_t* tok, int R, int copies, float* X, cudaStream_t stream) {
  if (R <= 0 || copies <= 0 || table.empty() || !tok || !X)
    return make_error(errc::invalid_argument, "embed_rows: empty shape or null pointer (rows " + std::to_string(R) + ")");
  switch (gather_format(table)) {
    case (int)weight_format::bf16:
      launch_kernel(embed_rows_kernel<(int)weight_format::bf16>, R, 256, 0, stream, table, tok, copies, X);
      break;
    case (int)weight_format::f32:
      launch_kernel(embed_rows_kernel<(int)weight_format::f32>, R, 256, 0, stream, table, tok, copies, X);
      break;
    default: launch_kernel(embed_rows_kernel<k_format_any>, R, 256, 0, stream, table, tok, copies, X);
  }
  CEDAR_CUDA_LAUNCHED("embed_rows");
  return {};
}

status table_rows(const qmatrix& table, const int64_t* ids, int R, int n_layers, int layer, int n_cols,
                  float* out, cudaStream_t stream) {
  if (R <= 0 || n_cols <= 0 || layer < 0 || layer >= n_layers || table.empty() || !ids || !out)
    return make_error(errc::invalid_argument, "table_rows: bad shape or null pointer (rows " + std::to_string(R) +
                                                  ", layer " + std::to_string(layer) + " of " + std::to_string(n_layers) + ")");
  const dim3 grid((unsigned)R, (unsigned)n_cols);
  switch (gather_format(table)) {
    case (int)weight_format::bf16:
      launch_kernel(table_rows_kernel<(int)weight_format::bf16>, grid, 128, 0, stream, table, ids, n_layers, layer, n_cols, out);
      break;
    case (int)weight_format::f32:
      launch_kernel(table_rows_kernel<(int)weight_format::f32>, grid, 128, 0, stream, table, ids, n_layers, layer, n_cols, out);
      break;
    default: launch_kernel(table_rows_kernel<k_format_any>, grid, 128, 0, stream, table, ids, n_layers, layer, n_cols, out);
  }
  CEDAR_CUDA_LAUNCHED("table_rows");
  return {};
}

status copy_spans(const uint8_t* const* src, uint8_t* const* dst, const uint32_t* len, int n, cudaStream_t stream) {
  if (n < 0 || (n > 0 && (!src || !dst || !len)))
    return make_error(errc::invalid_argument, "copy_spans: null pointer");
  if (n == 0) return {};
  launch_kernel(copy_spans_kernel, n, 128, 0, stream, src, dst, len);
  CEDAR_CUDA_LAUNCHED("copy_spans");
  return {};
}

status l2_prefetch_spans(const l2_prefetch_params& p, cudaStream_t stream) {
  if (p.n < 0 || p.n > k_l2_spans_max)
    return make_error(errc::invalid_argument, "l2_prefetch_spans: " + std::to_string(p.n) + " spans (at most " +
                                                  std::to_string(k_l2_spans_max) + ")");
  for (int i = 0; i < p.n; ++i)
    if (!p.p[i] && p.bytes[i] > 0)
      return make_error(errc::invalid_argument, "l2_prefetch_spans: span " + std::to_string(i) + " has a null pointer");
  if (p.n == 0) return {};
  launch_kernel(l2_prefetch_kernel, k_l2_blocks, k_l2_threads, 0, stream, p);
  CEDAR_CUDA_LAUNCHED("l2_prefetch_spans");
  return {};
}

}  // namespace cedar::kernels::cuda
