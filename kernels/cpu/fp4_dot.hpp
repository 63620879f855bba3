// fp4_dot — dot products of fp32 queries with FP4 index keys read straight from their packed
// bytes (the indexer's scoring, MODEL_SPEC §2 "The indexer", §3 "Indexer K").
//
// Owns: fp4_index_dot, which scores a run of consecutive fp4_index entries (E2M1 codes, element
// 2i in the low nibble of byte i, then one UE8M0 scale per 32 channels; quant.hpp) against a
// batch of fp32 query rows, and its scalar oracle; fp4_index_score_rows, the indexer's index
// score of a block of token rows (every head's dot, ReLU, head weight, summed over heads) on
// one decode of each key tile, with its integer path for FP4 queries (fp4_index_queries,
// fp4_index_prepare_queries), and fp4_index_score_row, its one-row form over fp4_index_dot.
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
// Integer path of fp4_index_score_rows (the indexer's queries are FP4 fake-quantised too, so
// in the runner every row takes it). A query block whose 32 values are all a·2^qe with a in
// the doubled E2M1 grid {0,±1,±2,±3,±4,±6,±8,±12} (fp4_index_prepare_queries finds qe from the
// block's largest value and checks every value), and a key block c·2^ke (c the doubled code
// value, −0 is 0; ke = its UE8M0 byte − 128), have the dot 2^(qe+ke)·S, S = Σ a·c an integer
// with |S| ≤ 32·144 < 2^13. The fp32 path sums the same products (each exact) with fma in
// channel order from +0; every partial sum is an integer multiple of 2^(smallest block
// exponent) below 2^24 of it whenever the conditions checked per (row, key tile) hold —
// every 2^(qe+ke) at least 2^-149, no sum reaching 2^128, no NaN scale byte (0xFF), and for
// n > 32 nb·4608·2^(spread_q + spread_k) < 2^24 (spreads: max − min exponent across the
// blocks of one head, of one key) — so the fp32 sum is the exact value, never −0. The integer
// path computes that same value exactly: S exactly in integers, float(S) exact, times 2^ke and
// 2^qe (powers of two, no rounding within those bounds), blocks added in order (each partial
// sum exact by the same bound). The head fold that follows is the fp32 path's, on the same
// floats (n = 32 folds 2^qe into sscale: one rounding of the same real number, int_heads), so
// the row score is bit-identical. A (row, tile) where a condition fails, and a row whose
// queries are not FP4 (e.g. f32-diagnostic storage, which skips the fake-quant), runs the
// fp32 path.
// The integer tile is [n/4 channel quads][16 keys][4 bytes] of c + 12 (unsigned, one decode
// per tile for all rows); per quad, the head's 4 query bytes broadcast and one u8×s8 pair
// multiply-add (AVX2 vpmaddubsw) per 8 keys into 16-bit accumulators (|·| ≤ 9216) that start
// at −12·Σa (the +12 offset's share), four heads at once; then one 16→32-bit pair add, one
// conversion and the scales. Without AVX2 the same integer sums run as plain loops (the
// portable build's fp32 path pays for a software std::fma; the integer one does not).
// Threads: none (the caller splits work); scratch is thread_local, grown once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

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
// n_heads == 0: every score is 0. The queries are prepared on each call (integer path where
// exact, see above); a caller scoring one block of rows over many key ranges prepares them
// once (fp4_index_prepare_queries) and calls the overload below.
void fp4_index_score_rows(const float* queries, const float* weights, int rows, int n_heads, const uint8_t* keys,
                          int n_keys, int n, float sscale, float* out, int ldo);

// The integer form of a block of index queries, made once and reused for every key chunk
// (fp4_index_prepare_queries). Per (row, head, 32-channel block): the integer values a, the
// unit 2^qe and the offset correction; per row whether every block is exactly a·2^qe (else
// the row is scored by the fp32 path) and its exponent range.
struct fp4_index_queries {
  struct row_info {
    bool exact = false;  // every query value of the row is a·2^qe (integer path usable)
    int qe_min = 0, qe_max = 0;  // over the row's nonzero blocks (0, 0 if none)
    int spread = 0;              // max over heads of (max − min qe of the head's nonzero blocks)
  };
  int rows = 0, n_heads = 0, n = 0;
  std::vector<int8_t> a;        // [rows, n_heads, n] the values in units 2^qe of their block
  std::vector<float> unit;      // [rows, n_heads, n/32] 2^qe (1 for an all-zero block)
  std::vector<int32_t> corr;    // [rows, n_heads, n/32] −12·Σ a of the block
  std::vector<row_info> info;   // [rows]
};

// Fills `out` from queries [rows, n_heads, n] (contiguous, as fp4_index_score_rows takes
// them). Rows that are not FP4-exact are marked so; any floats are accepted.
void fp4_index_prepare_queries(const float* queries, int rows, int n_heads, int n, fp4_index_queries& out);

// fp4_index_score_rows with the queries prepared: rows [row0, row0 + rows) of `prep`.
// queries, weights and out as above, starting at row row0 of the block `prep` was made from
// (queries are the floats prep was made from: the fp32 path reads them). Same results.
void fp4_index_score_rows(const fp4_index_queries& prep, int row0, const float* queries, const float* weights,
                          int rows, const uint8_t* keys, int n_keys, float sscale, float* out, int ldo);

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
