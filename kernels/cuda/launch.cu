// launch — see launch.cuh.
#include "kernels/cuda/launch.cuh"

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace cedar::kernels::cuda {
namespace {

int initial_pdl() {
  const char* v = std::getenv("CEDAR_CUDA_PDL");
  return v && std::strcmp(v, "0") == 0 ? 0 : 1;
}

std::atomic<launch_profiler*> g_profiler{nullptr};

std::atomic<int>& pdl_flag() {
  static std::atomic<int> flag{initial_pdl()};
  return flag;
}

}  // namespace

bool pdl_enabled() { return pdl_flag().load(std::memory_order_relaxed) != 0; }
void set_pdl(bool on) { pdl_flag().store(on ? 1 : 0, std::memory_order_relaxed); }

launch_profiler* profiler() { return g_profiler.load(std::memory_order_relaxed); }
void set_profiler(launch_profiler* p) { g_profiler.store(p, std::memory_order_relaxed); }

}  // namespace cedar::kernels::cuda
