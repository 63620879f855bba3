#include <cuda_runtime.h>

#include "kernels/cuda/device_probe.cuh"

namespace cedar::kernels {

cuda_probe_result cuda_probe() {
  cuda_probe_result r;
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    r.message = std::string("no usable CUDA device: ") + cudaGetErrorName(e) + " (" +
                cudaGetErrorString(e) + ")";
    cudaGetLastError();  // clear the sticky error
    return r;
  }
  r.n_devices = n;
  if (n == 0) {
    r.message = "the CUDA runtime sees no device";
    return r;
  }
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, 0) == cudaSuccess) r.name = p.name;
  r.message = "CUDA available";
  return r;
}

}  // namespace cedar::kernels
