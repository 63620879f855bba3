// Compute-device discovery. cedar runs on the CPU everywhere and uses a CUDA GPU when the
// build has the CUDA backend and a device is present. The probe runs once; the result is
// cached. It never throws and never aborts when the driver is missing.
#pragma once

#include <string>

namespace cedar::kernels {

struct device_info {
  bool cuda_built = false;    // compiled with the CUDA backend
  int cuda_devices = 0;       // GPUs visible at run time
  std::string cuda_name;      // first GPU's name, if any
  std::string reason;         // why there is no GPU (no CUDA build / no driver / no device)
  bool use_cuda() const { return cuda_devices > 0; }
};

const device_info& probe_devices();

// Logs once per process which device cedar computes on ("running on the CPU: <reason>").
void announce_device();

}  // namespace cedar::kernels
