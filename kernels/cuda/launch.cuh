// launch — how every op of kernels/cuda starts its kernels: Programmatic Dependent Launch.
//
// A decode step is a chain of several hundred small kernels, each waiting for the one before.
// Launched plainly, a kernel's blocks are scheduled only after the previous kernel has fully
// drained; with PDL (Hopper, sm_90) the next kernel is launched while the previous one is still
// running, its blocks wait at their first instruction, and the launch latency and ramp-up
// overlap the previous kernel's tail (in a captured CUDA graph the edges become programmatic).
//
// The contract, for every __global__ function of kernels/cuda:
//   1. its first statement is pdl_entry(): griddepcontrol.wait (block until the previous grid in
//      the stream has completed and its memory is visible), then launch_dependents (let the next
//      grid be scheduled). Nothing is read or written before the wait, so a kernel sees every
//      write of all kernels before it (each waited for its own predecessor: the order is
//      transitive) and never overwrites what a running predecessor still reads;
//   2. it is launched through launch_kernel, which sets the PDL attribute (unless turned off:
//      CEDAR_CUDA_PDL=0, or set_pdl(false)).
//   The one exception: pdl_prefetch_entry(f) runs f before the wait, and f may only ask L2 for
//   data no kernel of the step writes (weights: l2_prefetch); it reads nothing into registers.
// tests/cuda_source/check_pdl_entry.py checks (1) for every kernel in CI. On a GPU without PDL the
// attribute and the instructions are no-ops.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "kernels/cuda/generic_kernels.hpp"
#include "kernels/cuda/launch_profiler.hpp"

namespace cedar::kernels::cuda {

// ---- timeline (launch_profiler.hpp): the device side ----
#if defined(CEDAR_CUDA_TIMELINE) && defined(__CUDACC__)
namespace {
__device__ unsigned long long* g_timeline = nullptr;
__device__ unsigned g_timeline_cap = 0;
inline void set_timeline_here(unsigned long long* b, unsigned cap) {
  cudaMemcpyToSymbol(g_timeline, &b, sizeof b);
  cudaMemcpyToSymbol(g_timeline_cap, &cap, sizeof cap);
}
[[maybe_unused]] const int g_timeline_registered = timeline_detail::add_setter(&set_timeline_here);
}  // namespace
__device__ __forceinline__ void timeline_record(bool pre = false) {
#if defined(__CUDA_ARCH__)
  if ((threadIdx.x | blockIdx.x | blockIdx.y | blockIdx.z) != 0) return;
  unsigned long long* b = g_timeline;
  if (!b) return;
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  const unsigned i = atomicAdd(reinterpret_cast<unsigned*>(b), 1u);
  if (i >= g_timeline_cap) return;
  b[2 + 2 * (size_t)i] = t;
  b[3 + 2 * (size_t)i] = timeline_tag(gridDim.x, gridDim.y, gridDim.z, blockDim.x) | (pre ? k_timeline_pre : 0ull);
#endif
}
#else
__device__ __forceinline__ void timeline_record(bool = false) {}
#endif

__device__ __forceinline__ void pdl_entry() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  timeline_record(true);
  asm volatile("griddepcontrol.wait;" ::: "memory");
  timeline_record();
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// L2 prefetch of [p, p + bytes) by the calling block's threads, one 128-byte line per
// instruction (a hint: no values are read, nothing waits for it).
__device__ __forceinline__ void l2_prefetch(const void* p, size_t bytes) {
#if defined(__CUDA_ARCH__)
  const char* b = static_cast<const char*>(p);
  for (size_t off = (size_t)threadIdx.x * 128; off < bytes; off += (size_t)blockDim.x * 128)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(b + off));
#endif
}

// L2 prefetch of the 128-byte line holding p (by the calling thread alone).
__device__ __forceinline__ void l2_prefetch_line(const void* p) {
#if defined(__CUDA_ARCH__)
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#endif
}

// L2 policies for the cache-hint forms of loads and bulk prefetches (createpolicy, sm_80+).
enum class l2_policy { evict_first, evict_normal, evict_last };
__device__ __forceinline__ uint64_t make_l2_policy(l2_policy k) {
  uint64_t pol = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if (k == l2_policy::evict_first) asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  else if (k == l2_policy::evict_last) asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
  else asm("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(pol));
#endif
  return pol;
}

// L2 prefetches of [p, p + bytes) through the bulk-copy unit by the calling thread, under policy
// pol: the range shrunk to 16-byte bounds (the unit's granule; never past the allocation) and
// cut into 64 KB chunks, of which chunk k is issued when k % parts == part (threads sharing a
// range). Returns the range's chunk count. A hint: nothing is read into registers. sm_90 only.
__device__ __forceinline__ unsigned l2_bulk_prefetch(const void* p, size_t bytes, uint64_t pol, unsigned part = 0,
                                                     unsigned parts = 1) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p), e = (a + bytes) & ~(uintptr_t)15;
  constexpr uintptr_t chunk = (uintptr_t)64 << 10;
  unsigned k = 0;
  for (uintptr_t c = (a + 15) & ~(uintptr_t)15; c < e; c += chunk, ++k) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (k % parts != part) continue;
    const uint32_t n = (uint32_t)(e - c < chunk ? e - c : chunk);
    asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;" ::"l"(c), "r"(n), "l"(pol) : "memory");
#endif
  }
  return k;
}

// pdl_entry() after `prefetch()`, which may only issue L2 prefetches of data that no kernel of
// the step writes (the weights): they stream while the previous kernel is still running.
template <class F>
__device__ __forceinline__ void pdl_prefetch_entry(F&& prefetch) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  prefetch();
#endif
  pdl_entry();
}

// The block-strided loop `for (i = threadIdx.x; i < n; i += blockDim.x) use(i, load(i))` in
// batches of U iterations whose loads all issue before any value is used, in the loop's order
// (the same results, bit for bit). nvcc leaves a loop with a runtime count rolled — one round
// trip to memory per iteration, ~0.5 µs each in a decode step's small kernels — and unrolled it
// still keeps each iteration's loads behind the previous one's exit test and uses (a warp
// issues in order). Here the loads are predicated (i < n), not branched around.
template <int U, class T, class Load, class Use>
__device__ __forceinline__ void strided_batched(int n, Load&& load, Use&& use) {
  const int step = (int)blockDim.x;
  for (int i0 = (int)threadIdx.x; i0 < n; i0 += U * step) {
    T v[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (i0 + u * step < n) v[u] = load(i0 + u * step);
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (i0 + u * step < n) use(i0 + u * step, v[u]);
  }
}

// A whole-number setting of the environment in [lo, hi] (A/B switches of the kernels, read once
// by the caller): unset or empty -> dflt; anything else -> a warning naming it, dflt.
int env_choice(const char* name, int lo, int hi, int dflt);

// Whether launches carry the PDL attribute: CEDAR_CUDA_PDL=0 in the environment turns it off
// (read once); set_pdl overrides (tests, benchmarks comparing both).
bool pdl_enabled();
void set_pdl(bool on);

// kernel<<<grid, block, smem, stream>>>(args...) with the PDL attribute, and in thread block
// clusters of *cluster blocks when given (the grid a multiple of it in every dimension; sm_90).
// Errors surface through cudaGetLastError (CEDAR_CUDA_LAUNCHED) like a <<<>>> launch's.
template <class... P, class... A>
cudaError_t launch_kernel_in(void (*kernel)(P...), dim3 grid, const dim3* cluster, dim3 block, size_t smem,
                             cudaStream_t stream, A&&... args) {
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = pdl_enabled() ? 1 : 0;
  if (cluster) {
    attr[1].id = cudaLaunchAttributeClusterDimension;
    attr[1].val.clusterDim.x = cluster->x;
    attr[1].val.clusterDim.y = cluster->y;
    attr[1].val.clusterDim.z = cluster->z;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = cluster ? 2 : 1;
  launch_profiler* prof = profiler();
  if (prof) prof->before((const void*)kernel, grid, block, stream);
  const cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...);
  if (prof) prof->after((const void*)kernel, stream);
  return err;
}
template <class... P, class... A>
cudaError_t launch_kernel(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, A&&... args) {
  return launch_kernel_in(kernel, grid, nullptr, block, smem, stream, std::forward<A>(args)...);
}
template <class... P, class... A>
cudaError_t launch_kernel_cluster(void (*kernel)(P...), dim3 grid, dim3 cluster, dim3 block, size_t smem,
                                  cudaStream_t stream, A&&... args) {
  return launch_kernel_in(kernel, grid, &cluster, block, smem, stream, std::forward<A>(args)...);
}
}  // namespace cedar::kernels::cuda
