// gather — row gathers and byte copies of a decode step on the GPU:
//   embed_rows   the token embedding, each row copied into the hc residual streams
//                (MODEL_SPEC §1 "embedding"; forward.cpp run_rows);
//   table_rows   Engram table rows addressed by the n-gram hash ids (MODEL_SPEC §6 "Engram";
//                forward.cpp engram_apply's gather);
//   copy_spans   many small device-to-device byte copies in one launch (the new cache entries
//                and pending rows a step hands back to the host, gathered into one staging
//                buffer so that one transfer carries them).
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

}  // namespace cedar::kernels::cuda
