// cuda_check — error handling shared by the CUDA ops: every launch and runtime call is checked
// and turned into a cedar::status naming the op and the CUDA error (never an abort).
//
//   CEDAR_CUDA_TRY(cudaMemcpyAsync(...), "sparse_attention: copy");   // returns status on error
//   CEDAR_CUDA_LAUNCHED("sparse_attention");   // after <<<>>>: checks cudaGetLastError()
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "kernels/base/result.hpp"

namespace cedar::kernels::cuda {

inline status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return {};
  return make_error(errc::internal, std::string(what) + ": CUDA error " + cudaGetErrorName(e) + " (" +
                                        cudaGetErrorString(e) + ")");
}

}  // namespace cedar::kernels::cuda

#define CEDAR_CUDA_TRY(call, what)                                                  \
  do {                                                                              \
    cudaError_t cedar_cuda_e_ = (call);                                             \
    if (cedar_cuda_e_ != cudaSuccess) return ::cedar::kernels::cuda::cuda_status(cedar_cuda_e_, what); \
  } while (0)

#define CEDAR_CUDA_LAUNCHED(what) CEDAR_CUDA_TRY(cudaGetLastError(), what " (launch)")
