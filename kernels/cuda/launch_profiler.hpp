// launch_profiler — the hook launch_kernel (launch.cuh) calls around every kernel launch: a
// plain C++ header, so host code (bench_cuda_decode --profile) can set one without nvcc.
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

}  // namespace cedar::kernels::cuda
