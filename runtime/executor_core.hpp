// executor_core — the executor's state without actors (HOUSE_STYLE 11): the engine, one runner,
// the resident sequences of every session, the active generations, and the resume paths.
// The executor actor (runtime/actors.cpp) is a thin loop around it; tests drive it directly.
//
// Owns: every model::sequence (exactly one owner, ARCHITECTURE "Ownership") and the scratch of
// the runner. Does not own: the engine (shared, immutable), the store (the store actor's), the
// transcript (the agent's).
//
// Generation protocol (continuous batching):
//   start(session, new_tokens)  prefill the new tokens (CED), sample the first token
//   step()                      one batched decode step over every active generation: feed each
//                               one's last sampled token, sample the next; a generation whose
//                               last token was a stop token (or hit max_new_tokens) is finished
//                               by that feed, so the sequence holds every token of the turn.
//   take_finished()             finished generations, each with the turn's KV delta: the new
//                               FP4 entries of every KV source and the aux state, for the store.
//
// Resume paths (resume_path): a session is `resident` (in RAM), or restored from a checkpoint:
// `replayed` (pages ok: restore global KV, encoder bounded replay of the last n_win tokens) or
// `reprefilled` (pages missing or corrupt: prefill the whole token log again; slow, exact).
// Replayed rows take their index selections from the checkpoint's resume hints (aux blob
// "hint.selections": the top-k ids the exact pass chose for the last sliding_window + ratio rows at
// every index layer) instead of re-scoring every entry: replay then costs the same at 4K and
// 32K tokens. Hints are optional: missing (a checkpoint written before them), damaged or not
// matching, they are logged and the rows are re-scored; the path stays `replayed`.
// Residents are evicted least-recently-used when their bytes exceed the RAM budget; they were
// committed to the store at the end of their last turn, so eviction loses nothing.
// executor_options::policy (runtime_options::resume_policy) can make every resume go through the
// store: `replay` evicts every idle resident after each commit (production's path after a tool
// result under memory pressure, measured by `cedar eval`), `reprefill` also re-prefills on restore.
#pragma once

#include <chrono>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kernels/base/result.hpp"
#include "model/backend.hpp"
#include "model/engine.hpp"
#include "model/forward.hpp"
#include "model/sampler.hpp"
#include "model/sequence.hpp"
#include "model/tokenizer.hpp"
#include "model/tool_grammar.hpp"
#include "runtime/cedar.hpp"
#include "sessions/store.hpp"

namespace cedar::runtime {

enum class resume_path { fresh, resident, replayed, reprefilled };
const char* resume_path_name(resume_path p);

struct executor_options {
  resume_policy policy = resume_policy::resident;
  // packed: FP8 SWA + FP4 global KV (the model). f32_diagnostic: nothing quantised; its KV is not
  // persisted (the store holds FP4 pages), so a restore re-prefills from the token log.
  model::kv_storage storage = model::kv_storage::packed;
  uint8_t kv_rounded = 0;  // f32_diagnostic: model::kv_part bits rounded through their format
  // Where prefill/decode run (model/backend.hpp); cuda needs packed storage (else: cpu).
  model::backend_request backend = model::backend_request::cpu;
  // The bytes of each token id, for constrained tool calls (generation_params::tool_grammar);
  // without it a generation that asks for a grammar is an error.
  std::shared_ptr<const model::tokenizer> tokenizer;
};

struct generation_params {
  model::sampler_params sampling;
  int max_new_tokens = 512;
  // The stop tokens (EOS and stop_ids) are masked until the reply holds this many tokens, as
  // vLLM's min_tokens: a reply of a known length (benchmarks, a turn long enough to cancel).
  int min_new_tokens = 0;
  std::vector<int32_t> stop_ids;  // the engine's EOS is always a stop
  // Constrained tool calls (model/tool_grammar.hpp): a JSON array of {"name", "parameters"}; a
  // sampled token that would make a call invalid is masked and the sampler draws again.
  // Empty: unconstrained.
  std::string tool_grammar;
  // Text the reply already holds before the first sampled token (prefilled with the prompt, e.g.
  // the opening of a forced tool call): the grammar reads the reply from there.
  std::string reply_prefix;
};

// The new KV entries of one KV source since the session's last commit.
struct kv_source_delta {
  uint32_t layer = 0;
  uint64_t first_entry = 0;
  uint32_t n_entries = 0;
  std::vector<uint8_t> main;   // [n_entries, main_entry_bytes]
  std::vector<uint8_t> index;  // [n_entries, index_entry_bytes]
};

// Everything a turn adds to the store besides transcript items.
struct turn_kv {
  uint64_t first_token = 0;            // position of tokens[0] in the token log
  std::vector<int32_t> tokens;         // every token fed since the last commit
  std::vector<kv_source_delta> sources;
  std::vector<std::pair<std::string, std::vector<uint8_t>>> aux;  // name -> bytes
};

// A session's persisted state as the store hands it to the executor: the token log up to a
// checkpoint, the FP4 pages of every KV source concatenated in entry order, and the aux blobs.
// `pages_ok` false (or `problem` set) sends the resume down the reprefilled path.
struct resume_state {
  std::vector<int32_t> tokens;
  bool pages_ok = true;
  std::string problem;                          // why pages are not usable
  std::string hints_problem;                    // why the resume hints ("hint.selections") are not usable
  struct source {
    uint32_t layer = 0;
    std::vector<uint8_t> main, index;
  };
  std::vector<source> sources;                  // ascending layer
  std::vector<std::pair<std::string, std::vector<uint8_t>>> aux;
};
// Verified checkpoint -> resume_state (pages that failed verification set pages_ok = false).
resume_state resume_state_from(const sessions::checkpoint_data& cp);

struct generation_stats {
  resume_path path = resume_path::fresh;
  int64_t n_prompt = 0;       // new tokens prefilled
  int64_t n_replayed = 0;     // tokens re-run by bounded replay (or the whole log if reprefilled)
  int64_t n_generated = 0;
  int64_t context = 0;        // sequence length at the end
  double resume_ms = 0;       // restore + replay
  double prefill_ms = 0;      // prefill of the new tokens up to the first sampled token
  double decode_ms = 0;       // wall time of the decode steps this generation took part in
  int64_t n_masked = 0;       // sampled tokens the tool grammar rejected (drawn again)
};

struct finished_generation {
  int64_t session = 0;
  std::vector<int32_t> generated;  // sampled tokens, the stop token included
  bool stopped = false;            // ended on a stop token (else max_new_tokens)
  generation_stats stats;
  turn_kv kv;
};

// Per-step output: the token each active generation sampled in this step.
struct step_token {
  int64_t session = 0;
  int32_t token = 0;
};

class executor_core {
 public:
  executor_core(const model::engine& e, size_t ram_budget_bytes, executor_options o = {});
  ~executor_core();

  const model::engine& engine() const { return e_; }
  bool resident(int64_t session) const { return seqs_.count(session) != 0; }
  bool active(int64_t session) const { return gens_.count(session) != 0; }
  size_t n_active() const { return gens_.size(); }
  size_t n_resident() const { return seqs_.size(); }
  size_t resident_bytes() const;
  size_t ram_budget() const { return budget_; }
  int64_t context_of(int64_t session) const;
  // The resident sequence of a session (null when not resident), read-only: for tests and
  // benchmarks that compare a resumed state with a recomputed one.
  const model::sequence* sequence_of(int64_t session) const;

  // A new, empty session.
  void open_fresh(int64_t session);
  // Restores a non-resident session from a loaded checkpoint: replayed when every page and
  // aux blob is intact, reprefilled otherwise. Aux and page formats are checked; the error
  // names what did not fit.
  result<resume_path> restore(int64_t session, const resume_state& rs, double* ms = nullptr);
  // Drops a resident sequence (evicted, cancelled or removed). Not while it generates.
  void drop(int64_t session);

  // Prefills `new_tokens` and samples the first token. The session must be resident and idle.
  result<step_token> start(int64_t session, std::span<const int32_t> new_tokens, const generation_params& p,
                           resume_path path, double resume_ms);
  // One batched decode step over every active generation; the tokens sampled in it.
  result<std::vector<step_token>> step();
  // Cancels an active generation: feeds nothing more; the sequence stays consistent (its
  // sampled-but-unfed token is dropped) and the generation finishes as not stopped.
  void cancel(int64_t session);
  std::vector<finished_generation> take_finished();

  // The aux blobs that describe a sequence's resumable state (pending groups, n-gram history)
  // and its resume hints ("hint.selections", varint-coded; about 25 KB for the default model).
  static std::vector<std::pair<std::string, std::vector<uint8_t>>> aux_of(const model::sequence& s);
  // Evicts LRU residents (idle ones) until the budget holds (every idle one under the replay and
  // reprefill policies); returns the evicted sessions.
  std::vector<int64_t> enforce_budget();

 private:
  struct gen;
  struct resident_seq {
    std::unique_ptr<model::sequence> seq;
    uint64_t committed_tokens = 0;             // token log length at the last commit
    std::vector<int64_t> committed_entries;    // per source, entries at the last commit
    std::list<int64_t>::iterator lru;
  };
  resident_seq& touch(int64_t session);
  turn_kv collect_delta(resident_seq& r);
  int32_t choose(gen& g, const float* logits, int V);
  void note_token(gen& g, int32_t t);

  const model::engine& e_;
  std::unique_ptr<model::backend> runner_;
  size_t budget_;
  executor_options opts_;
  std::map<int64_t, resident_seq> seqs_;
  std::list<int64_t> lru_;  // front = most recently used
  std::map<int64_t, std::unique_ptr<gen>> gens_;
  std::vector<finished_generation> finished_;
  std::vector<float> logits_;
};

}  // namespace cedar::runtime
