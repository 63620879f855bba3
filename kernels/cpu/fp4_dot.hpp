// fp4_dot — dot products of fp32 queries with FP4 index keys read straight from their packed
// bytes (the indexer's scoring, MODEL_SPEC §2 "The indexer", §3 "Indexer K").
//
// Owns: fp4_index_dot, which scores a run of consecutive fp4_index entries (E2M1 codes, element
// 2i in the low nibble of byte i, then one UE8M0 scale per 32 channels; quant.hpp) against a
// batch of fp32 query rows, and its scalar oracle.
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

namespace ref {
// Oracle: fp4_index_unpack of each key, then the dot accumulated in double.
void fp4_index_dot(const float* queries, int nq, int ldq, const uint8_t* keys, int n_keys, int n,
                   float* out, int ldo);
}  // namespace ref

}  // namespace cedar::kernels
