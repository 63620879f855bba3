// sequence — one mutable timeline of the executor (ARCHITECTURE "Ownership"; MODEL_SPEC §1
// "What is cached").
//
// Owns, for one conversation:
//   * the token ids fed so far (positions 0..n_tokens−1);
//   * per backbone layer an SWA ring of sliding_window slots (slot = pos % W), FP8 packed
//     (fp8_swa layout, 528 B at head_dim 512), plus the first position whose entry is valid
//     (bounded replay starts a ring afresh: entries before it are never read);
//   * per KV source (config.kv_source_layer_ids order) the global KV as two contiguous,
//     growable byte arrays — main entries (fp4_kv, 288 B) and index keys (fp4_index, 68 B) —
//     exactly what the session store persists, and the only copy: the forward pass
//     dequantises the entries it selects from these bytes (main_entry, fp4_dot for the index
//     keys); and the ratio>1 pending partial group (kv and gate rows, fp32);
//   * the Engram n-gram history: compressed ids of the last max_ngram−1 tokens;
//   * resume hints: per index layer, the top-k entry ids the last sliding_window + ratio rows
//     selected (a ring like the SWA's), persisted with a checkpoint so bounded replay reuses
//     them (index_selections, runner::replay).
// Does not own: weights (engine), scratch (runner). Not thread-safe: exactly one owner.
//
// Invariants:
//   1. every KV source holds n_tokens / ratio entries and n_tokens % ratio pending rows;
//   2. ring entries of layer l are valid for positions [max(ring_first_pos, n_tokens−W), n);
//   3. global KV exists once, as entry bytes (no fp32 copy): a resident entry costs
//      main_entry_bytes + index_entry_bytes (53 B at head_dim 64 / index_head_dim 32);
//   4. storage is `packed` except in the diagnostic `f32_diagnostic`, where every entry is
//      fp32 (no quantisation, to compare with the fixture's noquant run, unless parts are asked
//      to be rounded through their stored format: kv_part); its bytes are read in place as
//      floats (index_f32), never converted;
//   5. the resume hints of index layer l are the exact forward pass's selections for rows
//      [max(from, to − capacity), to); replay never records its own rows, and they count only
//      when to == n_tokens for every index layer (selections_from), so a gap (a row run
//      elsewhere, e.g. a GPU decode step) disables them until enough new rows are recorded.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kernels/base/result.hpp"
#include "model/config.hpp"

namespace cedar::model {

enum class kv_storage {
  packed,          // FP8 SWA, FP4 global KV and index keys; FP4 indexer queries (the model)
  f32_diagnostic,  // diagnostic only: nothing quantised (the fixture's noquant run)
};

// Parts of the cache that an f32_diagnostic sequence may still round through their stored format
// (the values unpack(pack(x)) gives, kept as fp32): which quantisation costs what (`cedar eval
// --kv bf16+main+index+swa`; all three ≈ packed, up to the order of the index scores' sums).
enum kv_part : uint8_t {
  kv_part_main = 1,   // FP4 main entries of the global KV
  kv_part_index = 2,  // FP4 index keys and the indexer queries' FP4 round trip
  kv_part_swa = 4,    // FP8 SWA entries
};

struct kv_source_state {
  int layer = -1;                  // the KV source layer
  int ratio = 1;
  int64_t n_entries = 0;
  std::vector<uint8_t> main;       // [n_entries, main_entry_bytes]
  std::vector<uint8_t> index;      // [n_entries, index_entry_bytes]
  int n_pending = 0;               // tokens of the current partial group (< ratio)
  std::vector<float> pending_kv;   // [ratio−1, head_dim] fp32 (first n_pending rows valid)
  std::vector<float> pending_gate; // [ratio−1, head_dim] fp32
};

struct swa_ring {
  std::vector<uint8_t> bytes;      // [W, swa_entry_bytes]
  int64_t first_pos = 0;           // entries before this position are not valid
};

// Resume hints (MODEL_SPEC §4 "bounded replay"): the top-k entry ids the last rows chose at
// every index layer (the layers with their own indexer, ascending), as the exact forward pass
// chose them. Bounded replay reuses them instead of re-scoring those rows over every entry:
// the replayed rows then attend to exactly the entries they attended to before the resume.
struct index_selections {
  int64_t first_pos = 0;      // rows [first_pos, first_pos + n_rows)
  int n_rows = 0;
  std::vector<int32_t> ids;   // [n_index_layers, n_rows, index_topk], −1 padded, in selection order
};

// What the session store saves for a sequence (everything but the SWA rings).
struct sequence_snapshot {
  std::vector<int32_t> tokens;
  struct source {
    std::vector<uint8_t> main, index;
    int n_pending = 0;
    std::vector<float> pending_kv, pending_gate;  // [n_pending, head_dim] each
  };
  std::vector<source> sources;          // config.kv_source_layer_ids order
  std::vector<int64_t> ngram_history;   // compressed ids, oldest first
  index_selections selections;          // resume hints (n_rows 0: none)
};

// The same state borrowed, not owned: what sequence::restore reads. The executor restores
// straight from the store's buffers through it (no intermediate sequence_snapshot copy of the
// entry bytes). The spans must not point into the restored sequence's own arrays.
struct sequence_snapshot_view {
  std::span<const int32_t> tokens;
  struct source {
    std::span<const uint8_t> main, index;
    int n_pending = 0;
    std::span<const float> pending_kv, pending_gate;  // [n_pending, head_dim] each
  };
  std::vector<source> sources;             // config.kv_source_layer_ids order
  std::span<const int64_t> ngram_history;  // compressed ids, oldest first
  const index_selections* selections = nullptr;  // resume hints, optional (restore_selections)
};

class sequence {
 public:
  // rounded: kv_part bits, f32_diagnostic only (packed rounds every part by construction).
  explicit sequence(const model_config& c, kv_storage storage = kv_storage::packed, uint8_t rounded = 0);

  // Identity and change counter for caches of this sequence's state kept elsewhere (the cuda
  // backend's device mirror): id is unique per process (a copy is a new timeline with a new
  // id; a moved-from sequence gets a fresh one); version changes on every mutation (every
  // mutating call below, including the mutable accessors).
  uint64_t id() const { return ident_.id; }
  uint64_t version() const { return ident_.version; }

  const model_config& config() const { return cfg_; }
  kv_storage storage() const { return storage_; }
  // Whether the values of this part are those of its stored format (packed, or an f32_diagnostic
  // part rounded on request).
  bool rounds(kv_part p) const { return storage_ == kv_storage::packed || (rounded_ & p) != 0; }
  int64_t n_tokens() const { return (int64_t)tokens_.size(); }
  const std::vector<int32_t>& tokens() const { return tokens_; }

  size_t swa_entry_bytes() const { return swa_bytes_; }
  size_t main_entry_bytes() const { return main_bytes_; }
  size_t index_entry_bytes() const { return index_bytes_; }

  int n_sources() const { return (int)sources_.size(); }
  const kv_source_state& source(int i) const { return sources_[(size_t)i]; }
  int source_of_layer(int layer) const;  // index into sources, -1 if not a KV source
  const swa_ring& ring(int layer) const { return rings_[(size_t)layer]; }
  const std::vector<int64_t>& ngram_history() const { return ngram_history_; }

  // Unpacked SWA entry of `layer` at absolute position `pos` (must be valid) -> out[head_dim].
  void swa_entry(int layer, int64_t pos, float* out) const;
  bool swa_valid(int layer, int64_t pos) const;

  // Global KV of source i, read from its bytes (typed by storage()):
  //   main_entry   entry e (< n_entries) dequantised (packed) or copied (f32) -> out[head_dim];
  //   index_f32    f32_diagnostic only: the index keys in place, [n_entries, index_head_dim]
  //                fp32; nullptr for packed storage (score those with kernels::fp4_index_dot);
  //   main_values / index_values: every entry dequantised, [n_entries, head_dim] /
  //                [n_entries, index_head_dim] fp32, a fresh copy for tests and diagnostics.
  void main_entry(int i, int64_t e, float* out) const;
  const float* index_f32(int i) const;
  std::vector<float> main_values(int i) const;
  std::vector<float> index_values(int i) const;

  sequence_snapshot snapshot() const;
  // Restores everything but the SWA rings (which come back empty: run runner::replay): the
  // entry bytes are copied as they are (nothing is unpacked), once, into arrays with room for
  // the next turn's entries (restore_spare_tokens(n) more tokens), so the first append
  // after a resume does not reallocate and copy the whole history. Checks sizes against the
  // config and the token count (errors name the source and field).
  status restore(const sequence_snapshot& s);
  status restore(const sequence_snapshot_view& s);
  // Tokens of room restore leaves after n restored tokens: n/16 + 256.
  static int64_t restore_spare_tokens(int64_t n) { return n / 16 + 256; }
  void clear();

  // ---- resume hints: the index selections of the last rows (index_selections) -----------
  // Index layers (their own indexer: full / reindex modes) and the rows kept per layer:
  // sliding_window + the lcm of the compress ratios (the most rows runner::replay reruns).
  int n_index_layers() const { return (int)index_layers_.size(); }
  const std::vector<int>& index_layers() const { return index_layers_; }
  int selection_capacity() const { return sel_cap_; }
  // First position from which every index layer holds the selection of every row up to
  // n_tokens (n_tokens when there are none, e.g. right after a restore without hints).
  int64_t selections_from() const;
  // Row `pos` (in [selections_from(), n_tokens)) of index layer `layer`: index_topk ids, −1 padded.
  const int32_t* selection(int layer, int64_t pos) const;
  // The hints of rows [selections_from(), n_tokens), at most the last `max_rows` of them.
  index_selections selections(int max_rows) const;
  // Installs hints after restore (rows must end at n_tokens, ids must name existing entries
  // visible to their row); an error names what is wrong and leaves no hints.
  status restore_selections(const index_selections& h);

  // ---- used by the forward pass (forward.cpp) -------------------------------------------
  kv_source_state& source_mut(int i) { return ++ident_.version, sources_[(size_t)i]; }
  swa_ring& ring_mut(int layer) { return ++ident_.version, rings_[(size_t)layer]; }
  void swa_write(int layer, int64_t pos, const float* kv);  // packs kv[head_dim] into its slot
  // Appends one compressed entry (main [head_dim], key [index_head_dim], both fp32 after
  // RoPE) to source i: packs them (f32_diagnostic: copies them) onto its byte arrays.
  void append_entry(int i, const float* main, const float* key);
  void append_tokens(const int32_t* t, int n, const int64_t* compressed);  // + n-gram history
  // Records row `pos`'s selection at index layer `layer` (n ids); a row that does not follow
  // the layer's last recorded row starts the layer's record afresh.
  void note_selection(int layer, int64_t pos, const int32_t* ids, int n);
  void set_ring_first_pos(int layer, int64_t pos) {
    ++ident_.version;
    rings_[(size_t)layer].first_pos = pos;
  }

 private:
  struct identity {
    static uint64_t next_id();
    uint64_t id = next_id(), version = 0;
    identity() = default;
    identity(const identity&) {}
    identity& operator=(const identity&) { return ++version, *this; }
    identity(identity&& o) noexcept : id(o.id), version(o.version) { o.id = next_id(); }
    identity& operator=(identity&& o) noexcept {
      id = o.id;
      version = o.version + 1;
      o.id = next_id();
      return *this;
    }
  };
  identity ident_;
  model_config cfg_;
  kv_storage storage_;
  uint8_t rounded_ = 0;
  size_t swa_bytes_ = 0, main_bytes_ = 0, index_bytes_ = 0;
  std::vector<int32_t> tokens_;
  std::vector<swa_ring> rings_;
  std::vector<kv_source_state> sources_;
  std::vector<int> source_of_layer_;
  std::vector<int64_t> ngram_history_;
  // resume hints: per index layer a ring of sel_cap_ rows (slot pos % sel_cap_) of index_topk
  // ids, valid for positions [max(sel_from_, sel_to_ − sel_cap_), sel_to_)
  std::vector<int> index_layers_, index_slot_;  // index layer ids; layer -> ordinal or −1
  int sel_cap_ = 0;
  std::vector<int32_t> sel_ids_;                // [n_index_layers, sel_cap_, index_topk]
  std::vector<int64_t> sel_from_, sel_to_;      // [n_index_layers]
};

}  // namespace cedar::model
