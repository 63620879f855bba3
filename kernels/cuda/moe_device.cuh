// moe_device — the combine of the routed experts as a device function, shared by moe_combine
// (moe.cu) and the expands that fold it in (mhc.cu: hc_mix_collapse and hc_expand add the
// experts' rows as they read y), so that every form gives the same bits.
#pragma once

#include <cstdint>

namespace cedar::kernels::cuda {

// acc + the K expert rows of row r at channel i, ye [R·K, d], in ascending expert id (the CPU
// adds the experts in id order; ids within a row are distinct).
__device__ inline float add_routed_rows(float acc, const float* ye, const int32_t* sel, int K, int d, int r, int i) {
  const int32_t* sl = sel + (size_t)r * K;
  int last = -1;
  for (int n = 0; n < K; ++n) {
    int best = -1;
    for (int k = 0; k < K; ++k)
      if (sl[k] > last && (best < 0 || sl[k] < sl[best])) best = k;
    acc += ye[((size_t)r * K + best) * d + i];
    last = sl[best];
  }
  return acc;
}

}  // namespace cedar::kernels::cuda
