// launch_profiler — the hook launch_kernel (launch.cuh) calls around every kernel launch, and
// the timeline's host side: a plain C++ header, so host code (bench_cuda_decode --profile,
// --timeline) can use them without nvcc.
#pragma once

#include <cuda_runtime.h>

namespace cedar::kernels::cuda {

// Per-launch timing (diagnostics: bench_cuda_decode --profile). While a profiler is set, every
// launch_kernel calls before() and after() around its launch, on the launching thread; the
// profiler records CUDA events there. Only for steps launched op by op: an event recorded
// while a stream is being captured would become a node of the graph.
class launch_profiler {
 public:
  virtual ~launch_profiler() = default;
  virtual void before(const void* kernel, dim3 grid, dim3 block, cudaStream_t stream) = 0;
  virtual void after(const void* kernel, cudaStream_t stream) = 0;
};
launch_profiler* profiler();
void set_profiler(launch_profiler* p);  // nullptr: none (the default)

// ---- timeline (diagnostics, compiled in only with -DCEDAR_CUDA_TIMELINE=ON) -----------------
// Where the time of a step goes inside a CUDA graph with PDL (which an event per kernel cannot
// see: events break the graph and PDL overlap): while a device buffer is set, the first thread
// of every kernel's first block, as its wait ends, appends (%globaltimer, grid/block tag) to
// it. The wait ends when the previous kernel of the stream has completed, so the gaps between
// consecutive records are the kernels' costs on the critical path (bench_cuda_decode
// --timeline). Off in normal builds: the check would cost a load on every kernel's start.
// The same thread also records as it reaches the wait (the tag | k_timeline_pre): with PDL a
// kernel's blocks are resident before its predecessor ends, so the two records' distance shows
// whether the launch was early (waited) or only began after its predecessor (no overlap).
// Buffer layout (u64): [0] record count (atomic, as u32), [1] unused, then [2·i + 2] time in ns,
// [2·i + 3] timeline_tag(grid, block) of record i < cap.
bool timeline_compiled();
void set_timeline(unsigned long long* dev_buf, unsigned cap);  // nullptr: records nothing
__host__ __device__ constexpr unsigned long long timeline_tag(unsigned gx, unsigned gy, unsigned gz, unsigned bx) {
  return (unsigned long long)(gx & 0xFFFFFu) | (unsigned long long)(gy & 0xFFFu) << 20 |
         (unsigned long long)(gz & 0xFFu) << 32 | (unsigned long long)(bx & 0x7FFu) << 40;
}
constexpr unsigned long long k_timeline_pre = 1ull << 63;  // a record taken before the wait
namespace timeline_detail {
using setter = void (*)(unsigned long long*, unsigned);
int add_setter(setter f);  // each translation unit's copy of the pointer (no separable compilation)
}  // namespace timeline_detail

}  // namespace cedar::kernels::cuda
