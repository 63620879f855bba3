// forward — the CPU forward pass of DeepSeek-V4.1 (MODEL_SPEC §1–§4): prefill (full-stack or
// CED), chunked prefill, batched decode, and encoder bounded replay after a resume.
//
// Owns: the runner, i.e. the scratch memory of one executor thread (grown on demand, reused:
// a warmed-up decode step allocates nothing but sequence growth) and the control flow over
// the engine's weights and the sequences' state.
// Does not own: weights (engine, shared, immutable), per-sequence state (sequence), sampling.
//
// Rows: one call runs a batch of "segments", each a run of consecutive positions of one
// sequence (prefill: one segment of T rows; decode: B segments of one row). Per-row work
// (every projection, norm, mHC, MoE, head) runs as one GEMM over all rows; attention, the
// compressor and the indexer walk the segments.
//
// Modes (prefill_mode):
//   full_stack  every row through every layer (the HF port / REF path; the fixture's path).
//   ced         every row through layers [0, first_decoder_layer) and through the decoder KV
//               source's compressor + index-key projection; only the last sliding_window rows
//               through the decoder layers, whose SWA then sees only those rows (decoder
//               bounded replay). With ≤ sliding_window new rows the two modes are identical.
// Numerics (kv_storage::packed): SWA KV FP8 (e4m3, UE8M0/32) after RoPE; compressed KV FP4
// (e2m1, E4M3/16) after RoPE at j·m; index keys and indexer queries FP4 (UE8M0/32). Global KV
// exists only as the sequence's packed bytes: the indexer scores the FP4 keys in place, a
// block of rows at a time (kernels::fp4_index_score_rows: each key tile decoded once per block
// and chunk, the heads summed in registers, each row's top-k kept as the chunks stream by),
// and the sparse attention dequantises only the entries a row selected (its top-k, into a
// per-row [K, hd] scratch; the window comes from the FP8 ring).
// Index top-k ties go to the lower entry index; each KV source scores with its own keys.
// Weights: every projection is kernels::qgemm_nt over the engine's matrices in their stored
// dtype (F32 via OpenBLAS as before; BF16/FP8/FP4 dequantised per block on the fly).
// Threads: GEMMs use OpenBLAS's threads; the per-row sparse attention splits its rows over two
// std::threads when each row's work is below OpenBLAS's own threading threshold, and the
// indexer's FP4 scoring splits its keys over the same two threads when it is above it.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "kernels/base/result.hpp"
#include "model/engine.hpp"
#include "model/sequence.hpp"

namespace cedar::model {

enum class prefill_mode { full_stack, ced };

// Diagnostics a test can ask a prefill for (HOUSE_STYLE 21: they observe the one path).
struct forward_trace {
  // index-source layer -> [rows, index_topk] entry ids, ascending, −1 padded.
  std::map<int, std::vector<int32_t>> topk;
  // candidate pool of the candidate-source layer: [rows, candidates_width] 0/1 by entry.
  std::vector<uint8_t> candidates;
  int64_t candidates_width = 0;
  // residual streams after every backbone layer: [L, rows, hc, d] (full_stack only).
  std::vector<float> layer_out;
};

struct prefill_options {
  prefill_mode mode = prefill_mode::ced;
  bool all_logits = false;         // logits of every row that reached the head, not just the last
  forward_trace* trace = nullptr;  // tests only
};

// Logits of consecutive rows: values [n_rows, vocab], row i at position first_pos + i.
struct logits_rows {
  int64_t first_pos = 0;
  int n_rows = 0;
  std::vector<float> values;
};

// The checks every backend's decode_step makes (errors name the bad argument): one token per
// sequence, ids in the vocabulary, no null or repeated sequence, sequences made for this
// config, room for one more position.
status check_decode_batch(const model_config& c, std::span<sequence* const> seqs, std::span<const int32_t> tokens);

// The checks every backend's prefill makes before any row runs (errors name the bad argument):
// at least one token, ids in the vocabulary, a sequence made for this config, room for every
// position.
status check_prefill(const model_config& c, const sequence& seq, std::span<const int32_t> tokens);

// The checks every backend's replay makes (a sequence made for this config, n in [1,
// n_tokens]) and the first replayed position: n_tokens − n rounded down to a multiple of every
// compress ratio (so the replay starts on a group boundary of every KV source).
result<int64_t> replay_start(const model_config& c, const sequence& seq, int n);

class runner {
 public:
  explicit runner(const engine& e);
  ~runner();
  runner(const runner&) = delete;
  runner& operator=(const runner&) = delete;

  // Appends `tokens` to `seq` and runs them. Several calls equal one call with the
  // concatenation (chunked prefill), in either mode as long as each chunk's CED tail rule
  // sees the same rows (chunks ≤ sliding_window, or full_stack).
  result<logits_rows> prefill(sequence& seq, std::span<const int32_t> tokens,
                              const prefill_options& opt = {});

  // One new token per sequence (distinct sequences, same model), one GEMM per weight over the
  // batch. logits: resized to [B, vocab].
  status decode_step(std::span<sequence* const> seqs, std::span<const int32_t> tokens,
                     std::vector<float>& logits);

  // Encoder bounded replay after a resume (sequence::restore leaves the SWA rings empty):
  // reruns the last `n` tokens (start rounded down to a multiple of every compress ratio)
  // through every layer to rebuild the SWA rings. Persisted global KV is read, never
  // recomputed or overwritten; the pending groups and the n-gram history are kept. Returns
  // the logits of the last token. The rows whose index selections the sequence holds as
  // resume hints (sequence::selections_from(), restored with the pages) take them instead of
  // re-scoring every entry: the selections the exact pass made. use_hints = false re-scores
  // every row (diagnostics: what the hints change). trace: tests only.
  result<logits_rows> replay(sequence& seq, int n, bool use_hints = true, forward_trace* trace = nullptr);

  struct workspace;

 private:
  const engine& e_;
  workspace* ws_;
};

}  // namespace cedar::model
