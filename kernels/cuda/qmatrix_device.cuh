// qmatrix_device — one weight element of a kernels::qmatrix (kernels/cpu/qmatmul.hpp) whose
// pointers are device pointers, by definition: the formats and block-scale indexing of
// qmatmul.hpp, decoded with quant_device.cuh's codecs (exact, as the CPU oracle
// ref::qmatrix_at). For gathers and small GEMVs whose matrix is picked on the device (an
// embedding row, an Engram table row, a routed expert), where qgemv's vector loads do not apply.
#pragma once

#include <cstdint>

#include "kernels/cpu/qmatmul.hpp"
#include "kernels/cuda/quant_device.cuh"

namespace cedar::kernels::cuda {

__device__ inline float qmatrix_scale_at(const qmatrix& w, int64_t trow, int64_t c) {
  const int64_t i = (trow / w.scale_block_rows) * w.scale_cols + (c >> 5);
  return w.scale_f32 ? w.scale_f32[i] : ue8m0_value(w.scale_e8m0[i]);
}

// W[r, c] of the view (r relative to the view's row0).
__device__ inline float qmatrix_at(const qmatrix& w, int64_t r, int64_t c) {
  const int64_t trow = w.row0 + r;
  switch (w.format) {
    case weight_format::f32:
      return static_cast<const float*>(w.data)[trow * w.cols + c];
    case weight_format::bf16: {
      const uint32_t h = static_cast<const uint16_t*>(w.data)[trow * w.cols + c];
      return __uint_as_float(h << 16);
    }
    case weight_format::f8_e4m3:
      return e4m3_value(static_cast<const uint8_t*>(w.data)[trow * w.cols + c]) * qmatrix_scale_at(w, trow, c);
    case weight_format::fp4_e2m1: {
      const uint32_t byte = static_cast<const uint8_t*>(w.data)[trow * (w.cols / 2) + (c >> 1)];
      return e2m1_value(c & 1 ? byte >> 4 : byte & 15u) * qmatrix_scale_at(w, trow, c);
    }
  }
  return 0.0f;
}

// qmatrix_at for a view of format F known at compile time (a kernel compiled for one format holds
// none of the others' code); k_format_any: qmatrix_at's run-time switch. The same values.
constexpr int k_format_any = -1;
template <int F>
__device__ __forceinline__ float qmatrix_at_as(const qmatrix& w, int64_t r, int64_t c) {
  const int64_t trow = w.row0 + r;
  if constexpr (F == (int)weight_format::f32) {
    return static_cast<const float*>(w.data)[trow * w.cols + c];
  } else if constexpr (F == (int)weight_format::bf16) {
    const uint32_t h = static_cast<const uint16_t*>(w.data)[trow * w.cols + c];
    return __uint_as_float(h << 16);
  } else {
    return qmatrix_at(w, r, c);
  }
}

}  // namespace cedar::kernels::cuda
