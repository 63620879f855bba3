// indexer — CSA2 lightning indexer of one index layer on the GPU (MODEL_SPEC §1 "indexer",
// "candidate pool"): scores every visible compressed entry of a row, the candidate pool's
// block selection, and the top-k of the scores. The CPU path (model/forward.cpp
// indexer_forward, select_topk) is the reference.
//
//   index_scores   score[r, t] = Σ_h (w[r, h] · wscale) · sscale · relu(q[r, h, :] · k[t, :]) for t < vis[r],
//                  −inf for vis[r] <= t < E (row stride E); keys are packed FP4 index entries
//                  (fp4_index_bytes(Di) each), dequantised in registers; q is the FP4-quantised
//                  query in fp32 (what the CPU path scores with); w already carries 1/sqrt(Hi).
//                  With `allowed` ([R, nb] bytes, block b of `block` entries kept when != 0),
//                  entries of dropped blocks score −inf (the Reindex layers' restriction).
//   block_max      bscore[r, b] = max of score[r, b·block .. (b+1)·block); the block holding the
//                  row's newest visible entry (vis[r]−1) gets +inf (always kept).
//   topk           ids of the K largest finite scores of each row, exact ties to the LOWER id,
//                  written in ASCENDING id order (a set, as the CPU path returns it), n[r] of them
//                  (fewer when fewer are finite). Radix select on order-preserving 32-bit keys,
//                  one block per row, or a cluster of 8 blocks per row for the rows of small steps.
// Shapes: R rows; E entries (row stride); Hi heads of Di (multiple of 32) channels.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/base/result.hpp"

namespace cedar::kernels::cuda {

struct index_scores_params {
  int R = 0, E = 0, Hi = 0, Di = 0;
  float sscale = 0.0f;                // 1/sqrt(Di)
  float wscale = 1.0f;                // head weights are w · wscale (the decoder's 1/sqrt(Hi))
  const float* q = nullptr;           // [R, Hi, Di]
  const float* w = nullptr;           // [R, Hi]
  const uint8_t* const* keys = nullptr;  // [R] -> packed [>= vis[r], fp4_index_bytes(Di)]
  const int* vis = nullptr;           // [R] visible entries (<= E)
  const uint8_t* allowed = nullptr;   // optional [R, nb] block mask
  int block = 0, nb = 0;              // candidate block size and blocks per row of `allowed`
  float* score = nullptr;             // [R, E]
};
status index_scores(const index_scores_params& p, cudaStream_t stream);

status block_max(const float* score, const int* vis, int R, int E, int block, int nb, float* bscore,
                 cudaStream_t stream);

// ids [R, K], n [R]. Scores must not be NaN.
status topk(const float* score, int R, int E, int K, int32_t* ids, int* n, cudaStream_t stream);
// Steps of up to 16 rows of more than 2048 ids (up to 65536) run a cluster of 8 blocks per row
// (the same ids) when CEDAR_CUDA_TOPK_CLUSTER=1 (GPU-tested; off by default: 15–17 µs per launch on an
// H200, no faster than one block per row); set_topk_cluster(1 / 0) forces it on /
// off for the rows it can take, −1 returns to the environment's (tests, A/B).
void set_topk_cluster(int on);

// allowed [R, nb] = 1 for the n[r] block ids of row r in ids [R, K], else 0 (the candidate pool
// of a candidate-source row, as index_scores' `allowed` input of the Reindex layers).
status ids_to_mask(const int32_t* ids, const int* n, int R, int K, int nb, uint8_t* allowed,
                   cudaStream_t stream);

}  // namespace cedar::kernels::cuda
