// compressor — the CSA2 KV compressor of one KV-source layer in a decode step on the GPU
// (MODEL_SPEC §1 "compressor"): each row's projected kv (and, at ratio > 1, its gate) either
// waits in the sequence's pending half-group or completes the group, whose rows are pooled by
// a per-channel softmax over their gates and RMS-normalised into the new compressed entry's
// latent (pre-RoPE). Ratio 1: every row is its own group. The index key and the packed entry
// follow from the latent with qgemv, rms_norm, rope_rows and pack_fp4_* (kv_pack.cuh).
// forward.cpp compressor_forward is the reference (same formula, same order per channel).
#pragma once

#include <cuda_runtime.h>

#include "kernels/base/result.hpp"

namespace cedar::kernels::cuda {

struct compressor_params {
  int R = 0, hd = 0, ratio = 1;
  float eps = 0.0f;
  const float* kv = nullptr;          // [R, hd] wkv · x
  const float* gate = nullptr;        // [R, hd] wgate · x (ratio > 1)
  const float* norm = nullptr;        // [hd] compressor.norm
  float* const* pending_kv = nullptr;   // [R] -> [ratio − 1, hd] the row's sequence's pending rows
  float* const* pending_gate = nullptr; // [R] -> [ratio − 1, hd]
  const int* n_pending = nullptr;     // [R] pending rows before this row (< ratio)
  float* latent = nullptr;            // [R, hd] out: the completed group's latent (emitting rows)
};

// Rows with n_pending < ratio − 1 store kv/gate as pending row n_pending and emit nothing;
// the others (and every row at ratio 1) write their latent.
status compressor_step(const compressor_params& p, cudaStream_t stream);

}  // namespace cedar::kernels::cuda
