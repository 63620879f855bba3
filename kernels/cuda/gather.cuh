// gather — row gathers and byte copies of a decode step on the GPU:
//   embed_rows   the token embedding, each row copied into the hc residual streams
//                (MODEL_SPEC §1 "embedding"; forward.cpp run_rows);
//   table_rows   Engram table rows addressed by the n-gram hash ids (MODEL_SPEC §6 "Engram";
//                forward.cpp engram_apply's gather);
//   copy_spans   many small device-to-device byte copies in one launch (the new cache entries
//                and pending rows a step hands back to the host, gathered into one staging
//                buffer so that one transfer carries them);
//   l2_prefetch_spans  weights a step reads later asked into L2 now (a lookahead issued while
//                the step's latency-bound kernels — index scores, top-k, attention — leave the
//                DRAM idle); it reads nothing into registers and writes nothing.
// Tables are kernels::qmatrix views with device pointers, dequantised per element
// (qmatrix_device.cuh).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/base/result.hpp"
#include "kernels/cpu/qmatmul.hpp"

namespace cedar::kernels::cuda {

// X [R, copies, table.cols]: every copy of row r = table row tok[r].
status embed_rows(const qmatrix& table, const int32_t* tok, int R, int copies, float* X, cudaStream_t stream);

// out [R, n_cols, table.cols]: out[r, j] = table row ids[(r·n_layers + layer)·n_cols + j].
status table_rows(const qmatrix& table, const int64_t* ids, int R, int n_layers, int layer, int n_cols,
                  float* out, cudaStream_t stream);

// n spans: bytes [src[i], src[i] + len[i]) -> dst[i].
status copy_spans(const uint8_t* const* src, uint8_t* const* dst, const uint32_t* len, int n,
                  cudaStream_t stream);

// Up to k_l2_spans_max byte ranges for l2_prefetch_spans (each shrunk to 16-byte bounds: a
// range is never widened past its allocation).
constexpr int k_l2_spans_max = 24;
struct l2_prefetch_params {
  const void* p[k_l2_spans_max] = {};
  size_t bytes[k_l2_spans_max] = {};
  int n = 0;
  // appends [p, p + bytes) unless full or empty; false when full
  bool add(const void* ptr, size_t n_bytes) {
    if (!ptr || n_bytes == 0) return true;
    if (n >= k_l2_spans_max) return false;
    p[n] = ptr, bytes[n++] = n_bytes;
    return true;
  }
};

// Bulk L2 prefetches of the spans, evict-normal (64 KB each, spread over a few blocks; hints
// only: the kernel ends as soon as they are issued). sm_90 (elsewhere a launch that does nothing).
status l2_prefetch_spans(const l2_prefetch_params& p, cudaStream_t stream);

}  // namespace cedar::kernels::cuda
