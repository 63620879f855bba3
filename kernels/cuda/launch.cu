// launch — see launch.cuh.
#include "kernels/cuda/launch.cuh"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

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

int env_choice(const char* name, int lo, int hi, int dflt) {
  const char* v = std::getenv(name);
  if (!v || !*v) return dflt;
  char* end = nullptr;
  const long m = std::strtol(v, &end, 10);
  if (*end || m < lo || m > hi) {
    std::fprintf(stderr, "cedar: %s=%s is not a whole number in [%d, %d]; using %d\n", name, v, lo, hi, dflt);
    return dflt;
  }
  return (int)m;
}

namespace {
thread_local unsigned t_generic = 0;
}  // namespace

unsigned generic_kernels() { return t_generic; }
generic_kernels_scope::generic_kernels_scope(unsigned mask) : prev_(t_generic) { t_generic = mask; }
generic_kernels_scope::~generic_kernels_scope() { t_generic = prev_; }

bool pdl_enabled() { return pdl_flag().load(std::memory_order_relaxed) != 0; }
void set_pdl(bool on) { pdl_flag().store(on ? 1 : 0, std::memory_order_relaxed); }

bool timeline_compiled() {
#if defined(CEDAR_CUDA_TIMELINE)
  return true;
#else
  return false;
#endif
}

namespace {
std::vector<timeline_detail::setter>& timeline_setters() {
  static std::vector<timeline_detail::setter> v;
  return v;
}
}  // namespace

int timeline_detail::add_setter(setter f) {
  timeline_setters().push_back(f);
  return 0;
}

void set_timeline(unsigned long long* dev_buf, unsigned cap) {
  for (timeline_detail::setter f : timeline_setters()) f(dev_buf, cap);
}

launch_profiler* profiler() { return g_profiler.load(std::memory_order_relaxed); }
void set_profiler(launch_profiler* p) { g_profiler.store(p, std::memory_order_relaxed); }

}  // namespace cedar::kernels::cuda
