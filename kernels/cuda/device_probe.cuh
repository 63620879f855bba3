// Host-side probe of the CUDA runtime: how many devices, the first one's name, and a readable
// reason when there are none (no driver: cudaErrorInsufficientDriver / NoDevice, error 35/100).
#pragma once

#include <string>

namespace cedar::kernels {

struct cuda_probe_result {
  int n_devices = 0;
  std::string name;
  std::string message;
};

cuda_probe_result cuda_probe();

}  // namespace cedar::kernels
