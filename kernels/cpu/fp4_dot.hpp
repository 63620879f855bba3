// fp4_dot — dot products of fp32 queries with FP4 index keys read straight from their packed
// bytes (the indexer's scoring, MODEL_SPEC §2 "The indexer", §3 "Indexer K").
//
// Owns: fp4_index_dot, which scores a run of consecutive fp4_index entries (E2M1 codes, element
// 2i in the low nibble of byte i, then one UE8M0 scale per 32 channels; quant.hpp) against a
// batch of fp32 query rows, and its scalar oracle; fp4_index_score_rows, the indexer's index
// score of a block of token rows (every head's dot, ReLU, head weight, summed over heads) on
// one decode of each key tile, and fp4_index_score_row, its one-row form over fp4_index_dot.
// Does not own: the key bytes (the sequence's KV sources), the codecs' definitions (quant.hpp).
//
// Strategy: keys are taken 16 at a time. A tile's codes are decoded once through a 256-entry
// byte -> (low, high) value table, the block's scale multiplied in once per 32 channels, into
// an L1 buffer transposed to [n, 16] (channel-major, one 16-key row per channel); every query
// then runs over it with 16-key accumulators (two 8-lane vectors: AVX2 + FMA intrinsics where
// the build targets them, else a portable loop with std::fma computing the same roundings),
// four queries at a time, so the decode is amortised over all queries and no horizontal sums
// are needed. A decoded value
// code·2^e is exact in fp32, so each score is the fp32 dot of the query with the dequantised
// key, summed in channel order (one fused multiply-add per channel).
// fp4_index_score_rows runs the same tiles with the heads of one token row as the four
// queries and folds the head scores into the row's index score while they are in registers,
// so a block of rows (bounded replay, chunked prefill) decodes each key once and writes one
// float per (row, key) instead of one per (row, head, key); the caller picks a key range that
// keeps out [rows, keys] in L2.
// Threads: none (the caller splits work); scratch is thread_local, grown once.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cedar::kernels {

// out[q, t] = Σ_i queries[q, i] · unpack(key t)[i]   for q < nq, t < n_keys.
//   queries [nq, n] fp32, row stride ldq (floats)
//   keys    n_keys contiguous fp4_index entries of fp4_index_bytes(n) bytes each
//   out     [nq, n_keys] fp32, row stride ldo (floats)
// n is a positive multiple of 32 (assert). nq or n_keys == 0: nothing is written.
void fp4_index_dot(const float* queries, int nq, int ldq, const uint8_t* keys, int n_keys, int n,
                   float* out, int ldo);

// Index scores of a block of token rows (MODEL_SPEC §2 "The indexer"):
//   out[r, t] = Σ_h fma-accumulated  max(q[r, h] · key t, 0) · sscale · w[r, h]
// heads in order from 0.0f, each term added as fma(max(s, 0) · sscale, w, acc), where s is
// the fp4_index_dot score (same roundings, so the result equals fp4_index_score_row's).
//   queries [rows, n_heads, n] fp32, contiguous (row stride n_heads·n)
//   weights [rows, n_heads] fp32 (the head weights, any scale already applied)
//   keys    n_keys contiguous fp4_index entries of fp4_index_bytes(n) bytes each
//   out     [rows, n_keys] fp32, row stride ldo (floats)
// n is a positive multiple of 32 (assert). rows or n_keys == 0: nothing is written;
// n_heads == 0: every score is 0.
void fp4_index_score_rows(const float* queries, const float* weights, int rows, int n_heads, const uint8_t* keys,
                          int n_keys, int n, float sscale, float* out, int ldo);

// One row of the above the plain way: fp4_index_dot of the row's n_heads queries into
// scratch [n_heads, n_keys], then the head sum key by key into out [n_keys]. The reference
// the multi-row scorer is tested against (bit-exact).
void fp4_index_score_row(const float* queries, const float* weights, int n_heads, const uint8_t* keys, int n_keys,
                         int n, float sscale, float* scratch, float* out);

// Helpers of the index top-k over a row's scores (the runner's streaming selection):
//   index_next_above   the first i in [0, n) with s[i] > thr (an ordered compare: NaN never
//                      is), or n;
//   index_block_max    max(−∞, s[0], ..., s[n−1]) ignoring NaN, as the chain m = max(m, s[i])
//                      from −∞ computes it; of +0 and −0 either may come back (they compare
//                      equal, and the result is only compared).
int index_next_above(const float* s, int n, float thr);
float index_block_max(const float* s, int n);

namespace ref {
// Oracle: fp4_index_unpack of each key, then the dot accumulated in double.
void fp4_index_dot(const float* queries, int nq, int ldq, const uint8_t* keys, int n_keys, int n,
                   float* out, int ldo);
}  // namespace ref

}  // namespace cedar::kernels
