// device_math — scalar device functions shared by the CUDA ops, each the CPU path's formula
// (kernels/cpu/ops.hpp) so that a kernel and its reference compute the same expression.
#pragma once

namespace cedar::kernels::cuda {

// kernels::sigmoid: stable on both sides.
__device__ inline float sigmoid_stable(float x) {
  if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
  const float z = expf(x);
  return z / (1.0f + z);
}

}  // namespace cedar::kernels::cuda
