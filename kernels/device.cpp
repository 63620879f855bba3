#include "kernels/device.hpp"

#include <mutex>

#include "kernels/base/log.hpp"
#include "kernels/cpu/qmatmul.hpp"

#ifdef CEDAR_HAVE_CUDA
#include "kernels/cuda/device_probe.cuh"
#endif

namespace cedar::kernels {

const device_info& probe_devices() {
  static device_info info = [] {
    device_info d;
#ifdef CEDAR_HAVE_CUDA
    d.cuda_built = true;
    cuda_probe_result r = cuda_probe();
    d.cuda_devices = r.n_devices;
    d.cuda_name = r.name;
    d.reason = r.message;
#else
    d.reason = "cedar was built without the CUDA backend";
#endif
    return d;
  }();
  return info;
}

void announce_device() {
  static std::once_flag once;
  std::call_once(once, [] {
    const device_info& d = probe_devices();
    if (d.use_cuda())
      CEDAR_LOG_INFO("CUDA device found: %s (%d visible): decode runs on it with --backend cuda or auto; "
                     "CPU kernels on %d threads",
                     d.cuda_name.c_str(), d.cuda_devices, cpu_threads());
    else
      CEDAR_LOG_INFO("running on the CPU, %d threads (%s)", cpu_threads(), d.reason.c_str());
  });
}

}  // namespace cedar::kernels
