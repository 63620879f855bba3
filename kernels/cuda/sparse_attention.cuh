// sparse_attention — CSA2 attention of one layer on the GPU (MODEL_SPEC §1 "attention"): for
// every row, one softmax over its sliding-window keys (FP8 SWA entries), its selected global
// entries (FP4 main KV, picked by the indexer) and a per-head learned sink, with K = V (the
// single latent). Entries are read packed and dequantised on chip (in shared memory tile by
// tile, or in registers by the cluster kernel of few-row steps); no dequantised copy of a cache
// ever reaches global memory.
//
// The CPU path (model/forward.cpp attention_forward) is the reference: same inputs, same
// function; the order of the floating-point sums differs (online softmax over tiles here).
//
// Shapes: R rows, H heads, D = head_dim (a multiple of 32). Per row r:
//   window: wn[r] keys, key j (0 = oldest) in slot (wstart[r] + j) % wcap of the packed array
//           wkeys[r] ([wcap, fp8_swa_bytes(D)]); a decode ring has wcap = sliding_window, a
//           prefill buffer of consecutive rows has wcap >= wstart + wn (no wrap);
//   global: nsel[r] entry ids sel[r·K .. r·K+nsel[r]) into the packed array main[r]
//           ([n_entries, fp4_kv_bytes(D)]); main[r] may be null when nsel[r] == 0.
// The arrays of pointers (wkeys, main) and every other array live in device memory.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/base/result.hpp"

namespace cedar::kernels::cuda {

struct sparse_attention_params {
  int R = 0;                          // rows
  int H = 0;                          // query heads
  int D = 0;                          // head_dim, multiple of 32
  float scale = 0.0f;                 // logit scale (1/sqrt(D))
  const float* q = nullptr;           // [R, H, D] queries (RoPE applied unless rope_cos is given)
  const float* sink = nullptr;        // [H] learned sinks (enlarge the denominator only)
  // sliding window (FP8 SWA entries)
  const uint8_t* const* wkeys = nullptr;  // [R] -> packed [wcap, fp8_swa_bytes(D)]
  const int* wstart = nullptr;        // [R] slot of the oldest key
  const int* wn = nullptr;            // [R] number of window keys (>= 1: a row sees itself)
  int wcap = 0;                       // slots per window array (modulus)
  // selected global entries (FP4 main KV)
  const uint8_t* const* main = nullptr;   // [R] -> packed [n_entries, fp4_kv_bytes(D)]
  const int32_t* sel = nullptr;       // [R, K] entry ids
  const int* nsel = nullptr;          // [R] ids used per row (<= K)
  int K = 0;                          // row stride of sel
  float* out = nullptr;               // [R, H, D]
  // optional RoPE (rope_rows' formula): q rotated by row r's angles as it is read, the output
  // rotated back (inverse) as it is written, on channels [D − 2·rope_np, D); null: q comes
  // rotated and the output stays rotated
  const float* rope_cos = nullptr;    // [R, rope_np]
  const float* rope_sin = nullptr;
  int rope_np = 0;
  // optional split of the keys over several blocks (decode batches of few rows): max_keys
  // bounds wn[r] + nsel[r]; a workspace of sparse_attention_workspace_floats(p) floats
  // (device) enables it. Without one (or a smaller one) each block takes all of a row's keys.
  // (The cluster kernel, the built-in choice for steps of few rows, splits the keys over the
  // blocks of a cluster and needs no workspace; max_keys, when given, bounds its key slots.)
  int max_keys = 0;
  float* workspace = nullptr;
  size_t workspace_floats = 0;
  // optional, with the split: done [R × H] counters, zero before the launch and left zero after
  // it. Given, the last split block of each (row, head group) folds the splits' partial states
  // (one launch); without, a second kernel does (two launches, the same results bit for bit).
  unsigned* done = nullptr;
};

// Workspace the split path needs for these shapes (0: no split would be used).
size_t sparse_attention_workspace_floats(const sparse_attention_params& p);

// Tests and diagnostics: every launch with `heads_per_block` heads per block and one split per
// `tiles_per_split` key tiles, whatever the row count (the per-row sums then run in the same
// order for any batch or chunk size); (0, 0) restores the built-in rule. Process-wide, like
// CEDAR_CUDA_ATTN="HB,TILES", which it overrides. Set it between steps, not during one.
void set_sparse_attention_shape(int heads_per_block, int tiles_per_split);

// Tests and diagnostics: which kernel the built-in rule may pick. 0: the fp32 kernel only;
// 1: the built-in rule: the tensor-core kernel (16 heads per block as MMA rows; head_dim 64,
// 128, 256 or 512) where a step has 8 or more (row, 16-head group) blocks, i.e. prefill chunks
// and decode batches of 8+ rows, with its keys split over blocks when the grid is still small;
// below that the cluster kernel (head_dim 32 · 2^k up to 512: clusters of blocks over a row's
// keys, folded in distributed shared memory; CEDAR_CUDA_ATTN_CLUSTER=0 leaves it out); 2: the
// tensor-core kernel wherever the head_dim allows, splits included; 3: the cluster kernel
// wherever the head_dim allows; −1: CEDAR_CUDA_ATTN_MMA's value (default 1). A forced shape
// (set_sparse_attention_shape) always takes the fp32 kernel. Set it between steps.
void set_sparse_attention_mma(int mode);

// Launches on `stream`; checks the parameters (a clear error names the bad one) and the launch.
status sparse_attention(const sparse_attention_params& p, cudaStream_t stream);

}  // namespace cedar::kernels::cuda
