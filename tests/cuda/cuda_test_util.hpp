// Shared by the CUDA op tests (tests/cuda/): a device array with upload / download / NaN
// poisoning, and the check that fails (never skips) a test when there is no GPU.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <random>
#include <vector>

#include "kernels/cuda/device_probe.cuh"

namespace cedar::test {

// A device array with upload/download; NaN-poisoned on request.
template <class T>
struct dev_array {
  T* p = nullptr;
  size_t n = 0;
  explicit dev_array(size_t count) : n(count) {
    if (cudaMalloc(&p, sizeof(T) * std::max<size_t>(1, n)) != cudaSuccess) p = nullptr;
  }
  explicit dev_array(const std::vector<T>& v) : dev_array(v.size()) { upload(v); }
  ~dev_array() { cudaFree(p); }
  dev_array(const dev_array&) = delete;
  dev_array& operator=(const dev_array&) = delete;
  void upload(const std::vector<T>& v) { cudaMemcpy(p, v.data(), sizeof(T) * v.size(), cudaMemcpyHostToDevice); }
  std::vector<T> download() const {
    std::vector<T> v(n);
    cudaMemcpy(v.data(), p, sizeof(T) * n, cudaMemcpyDeviceToHost);
    return v;
  }
  void poison() { cudaMemset(p, 0xFF, sizeof(T) * n); }  // NaN for floats, -1 for ints
};

// n normal values of standard deviation sd.
inline std::vector<float> randn(std::mt19937& g, size_t n, float sd) {
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// Fails (never skips) when there is no GPU, naming why.
#define CEDAR_REQUIRE_GPU()                                                                       \
  do {                                                                                          \
    auto pr_ = ::cedar::kernels::cuda_probe();                                                                \
    ASSERT_GT(pr_.n_devices, 0) << "these tests need a CUDA GPU (" << pr_.message               \
                                << "); run them on the GPU machine: scripts/cuda-tests.sh";     \
  } while (0)

}  // namespace cedar::test
