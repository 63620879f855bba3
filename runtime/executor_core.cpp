#include "runtime/executor_core.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>

#include "kernels/base/log.hpp"

namespace cedar::runtime {

using clock_type = std::chrono::steady_clock;
static double ms_since(clock_type::time_point t0) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

const char* resume_path_name(resume_path p) {
  switch (p) {
    case resume_path::fresh: return "fresh";
    case resume_path::resident: return "resident";
    case resume_path::replayed: return "replayed";
    case resume_path::reprefilled: return "reprefilled";
  }
  return "?";
}

struct executor_core::gen {
  model::sampler smp;
  generation_params params;
  std::vector<int32_t> generated;
  int32_t last = -1;       // sampled, not yet fed
  bool finishing = false;  // `last` is the final token: feed it, then finish
  bool stopped = false;
  generation_stats stats;
  std::optional<model::tool_grammar> grammar;  // constrained tool calls
  std::string text;                            // the reply's bytes so far (with a grammar)
  std::vector<float> scratch;                  // logits with the rejected candidates masked
  std::vector<float> no_stop;                  // logits with the stop tokens masked (min_new_tokens)
  explicit gen(const generation_params& p) : smp(p.sampling), params(p) {}
};

// A token that ends the generation: the engine's EOS or one of the request's stop ids.
static bool is_stop_token(int32_t t, int32_t eos, const std::vector<int32_t>& stop_ids) {
  return t == eos || std::find(stop_ids.begin(), stop_ids.end(), t) != stop_ids.end();
}

// One token from a row of logits: the sampler's choice, or with a tool grammar the first draw
// that keeps the reply viable. A rejected candidate is masked (-inf) in a copy of the row and the
// sampler draws again from the rest; after 32 rejections every token is checked at once. Should
// nothing be viable (cannot happen while EOS is allowed in content), the first choice stands.
int32_t executor_core::choose(gen& g, const float* logits, int V) {
  // Before min_new_tokens the stop tokens cannot be drawn: the row is copied with them masked.
  if (int(g.generated.size()) < g.params.min_new_tokens) {
    g.no_stop.assign(logits, logits + V);
    const float ninf = -std::numeric_limits<float>::infinity();
    const int32_t eos = e_.config().eos_token_id;
    if (eos >= 0 && eos < V) g.no_stop[size_t(eos)] = ninf;
    for (int32_t t : g.params.stop_ids)
      if (t >= 0 && t < V) g.no_stop[size_t(t)] = ninf;
    logits = g.no_stop.data();
  }
  const int32_t first = g.smp.sample(logits, V);
  if (!g.grammar) return first;
  const model::tokenizer& tok = *opts_.tokenizer;
  std::string cand;
  auto ok = [&](int32_t t) {
    if (is_stop_token(t, e_.config().eos_token_id, g.params.stop_ids)) return g.grammar->viable(g.text, /*at_end=*/true);
    const std::string* b = tok.token_bytes(t);
    cand.assign(g.text);
    if (b) cand += *b;
    return g.grammar->viable(cand);
  };
  if (ok(first)) return first;  // the common case: no copy of the row
  g.scratch.assign(logits, logits + V);
  const float ninf = -std::numeric_limits<float>::infinity();
  int32_t t = first;
  for (int tries = 0; tries < 32; ++tries) {
    if (tries > 0 && ok(t)) return t;
    g.stats.n_masked++;
    g.scratch[size_t(t)] = ninf;
    t = g.smp.sample(g.scratch.data(), V);
  }
  bool any = false;
  for (int32_t v = 0; v < V; ++v) {
    if (g.scratch[size_t(v)] == ninf) continue;
    if (ok(v)) any = true;
    else g.scratch[size_t(v)] = ninf;
  }
  return any ? g.smp.sample(g.scratch.data(), V) : first;
}

// Appends a chosen token's bytes to the reply text the grammar reads.
void executor_core::note_token(gen& g, int32_t t) {
  if (!g.grammar) return;
  if (const std::string* b = opts_.tokenizer->token_bytes(t)) g.text += *b;
}

executor_core::executor_core(const model::engine& e, size_t ram_budget_bytes, executor_options o)
    : e_(e), budget_(ram_budget_bytes), opts_(o) {
  // The runtime checked that a requested cuda backend can run (agent_runtime::open); should it
  // still fail here (out of device memory), decoding stays on the CPU, said once.
  model::backend_request want = o.storage == model::kv_storage::packed ? o.backend : model::backend_request::cpu;
  auto b = model::make_backend(e, want);
  if (!b) {
    CEDAR_LOG_WARN("%s; decoding on the CPU", b.err().message.c_str());
    b = model::make_backend(e, model::backend_request::cpu);
  }
  runner_ = std::move(*b);
  if (runner_->kind() == model::backend_kind::cuda) CEDAR_LOG_INFO("executor: %s", runner_->device().c_str());
}
executor_core::~executor_core() = default;

// ============================================================================================
// aux state: the compressor's pending half-groups and the Engram n-gram history
// ============================================================================================
// Each blob: "CAX1" magic, then its fields little-endian. Names: "pending.L<layer>", "ngram".
namespace {
constexpr char kAuxMagic[4] = {'C', 'A', 'X', '1'};

template <class T>
void put(std::vector<uint8_t>& b, const T& v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  b.insert(b.end(), p, p + sizeof(T));
}
template <class T>
bool get(std::span<const uint8_t>& b, T& v) {
  if (b.size() < sizeof(T)) return false;
  std::memcpy(&v, b.data(), sizeof(T));
  b = b.subspan(sizeof(T));
  return true;
}
bool get_floats(std::span<const uint8_t>& b, std::vector<float>& v, size_t n) {
  if (b.size() < n * sizeof(float)) return false;
  v.resize(n);
  if (n > 0) std::memcpy(v.data(), b.data(), n * sizeof(float));  // data() may be null when n == 0
  b = b.subspan(n * sizeof(float));
  return true;
}
bool get_magic(std::span<const uint8_t>& b) {
  if (b.size() < 4 || std::memcmp(b.data(), kAuxMagic, 4) != 0) return false;
  b = b.subspan(4);
  return true;
}

// "hint.selections" (resume hints, model::index_selections): CAX1, u32 format 1, i64 first_pos,
// u32 n_rows, u32 n_layers, u32 top-k, then per layer and row: varint n ids, then each id as
// the zigzag varint of its difference from the previous one (ids ascend, so most take one or
// two bytes: 64 rows x 5 layers x 64 ids = 80 KB as int32, about 25 KB here).
constexpr uint32_t kSelectionsFormat = 1;
void put_varint(std::vector<uint8_t>& b, uint64_t v) {
  while (v >= 0x80) {
    b.push_back(uint8_t(v | 0x80));
    v >>= 7;
  }
  b.push_back(uint8_t(v));
}
bool get_varint(std::span<const uint8_t>& b, uint64_t& v) {
  v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (b.empty()) return false;
    const uint8_t c = b[0];
    b = b.subspan(1);
    v |= uint64_t(c & 0x7f) << shift;
    if (!(c & 0x80)) return true;
  }
  return false;
}
std::vector<uint8_t> encode_selections(const model::index_selections& h, int n_layers, int K) {
  std::vector<uint8_t> b(kAuxMagic, kAuxMagic + 4);
  put<uint32_t>(b, kSelectionsFormat);
  put<int64_t>(b, h.first_pos);
  put<uint32_t>(b, uint32_t(h.n_rows));
  put<uint32_t>(b, uint32_t(n_layers));
  put<uint32_t>(b, uint32_t(K));
  for (size_t row = 0; row < size_t(n_layers) * size_t(h.n_rows); ++row) {
    const int32_t* r = h.ids.data() + row * size_t(K);
    int n = 0;
    while (n < K && r[n] >= 0) ++n;
    put_varint(b, uint64_t(n));
    int64_t prev = 0;
    for (int k = 0; k < n; ++k) {
      const int64_t d = int64_t(r[k]) - prev;
      put_varint(b, d >= 0 ? uint64_t(d) << 1 : (uint64_t(-d) << 1) - 1);  // zigzag
      prev = r[k];
    }
  }
  return b;
}
// Parses a "hint.selections" blob for a model with n_layers index layers and top-k K; the error
// names what is wrong (sequence::restore_selections checks the ids against the entries).
result<model::index_selections> decode_selections(std::span<const uint8_t> b, int n_layers, int K) {
  const auto bad = [](const std::string& why) {
    return make_error(errc::invalid_format, "aux 'hint.selections': " + why);
  };
  uint32_t fmt = 0, rows = 0, layers = 0, k = 0;
  model::index_selections h;
  if (!get_magic(b) || !get(b, fmt)) return bad("no header");
  if (fmt != kSelectionsFormat) return bad("format " + std::to_string(fmt) + ", this build reads 1");
  if (!get(b, h.first_pos) || !get(b, rows) || !get(b, layers) || !get(b, k)) return bad("truncated header");
  if (int(layers) != n_layers || int(k) != K)
    return bad(std::to_string(layers) + " layers x top-k " + std::to_string(k) + ", the model has " +
               std::to_string(n_layers) + " x " + std::to_string(K));
  if (rows > 1u << 20) return bad(std::to_string(rows) + " rows");
  h.n_rows = int(rows);
  h.ids.assign(size_t(layers) * rows * size_t(K), -1);
  for (size_t row = 0; row < size_t(layers) * rows; ++row) {
    uint64_t n = 0;
    if (!get_varint(b, n) || n > uint64_t(K)) return bad("row " + std::to_string(row) + ": bad id count");
    int64_t prev = 0;
    for (uint64_t j = 0; j < n; ++j) {
      uint64_t z = 0;
      if (!get_varint(b, z)) return bad("truncated ids");
      prev += (z & 1) ? -int64_t(z >> 1) - 1 : int64_t(z >> 1);
      if (prev < 0 || prev > INT32_MAX) return bad("id out of range");
      h.ids[row * size_t(K) + j] = int32_t(prev);
    }
  }
  if (!b.empty()) return bad(std::to_string(b.size()) + " bytes after the last row");
  return h;
}
}  // namespace

std::vector<std::pair<std::string, std::vector<uint8_t>>> executor_core::aux_of(const model::sequence& s) {
  std::vector<std::pair<std::string, std::vector<uint8_t>>> out;
  const int D = s.config().head_dim;
  for (int i = 0; i < s.n_sources(); ++i) {
    const auto& src = s.source(i);
    if (src.ratio <= 1) continue;
    std::vector<uint8_t> b(kAuxMagic, kAuxMagic + 4);
    put<uint32_t>(b, uint32_t(src.n_pending));
    for (const std::vector<float>* v : {&src.pending_kv, &src.pending_gate})
      for (int k = 0; k < src.n_pending * D; ++k) put<float>(b, (*v)[size_t(k)]);
    out.emplace_back("pending.L" + std::to_string(src.layer), std::move(b));
  }
  std::vector<uint8_t> b(kAuxMagic, kAuxMagic + 4);
  put<uint32_t>(b, uint32_t(s.ngram_history().size()));
  for (int64_t id : s.ngram_history()) put<int64_t>(b, id);
  out.emplace_back("ngram", std::move(b));
  if (s.n_index_layers() > 0)
    out.emplace_back("hint.selections", encode_selections(s.selections(s.selection_capacity()), s.n_index_layers(),
                                                     s.config().index_topk));
  return out;
}

// ============================================================================================
// residents
// ============================================================================================
executor_core::resident_seq& executor_core::touch(int64_t session) {
  resident_seq& r = seqs_.at(session);
  lru_.erase(r.lru);
  lru_.push_front(session);
  r.lru = lru_.begin();
  return r;
}

int64_t executor_core::context_of(int64_t session) const {
  auto it = seqs_.find(session);
  return it == seqs_.end() ? 0 : it->second.seq->n_tokens();
}

const model::sequence* executor_core::sequence_of(int64_t session) const {
  auto it = seqs_.find(session);
  return it == seqs_.end() ? nullptr : it->second.seq.get();
}

size_t executor_core::resident_bytes() const {
  size_t total = 0;
  for (const auto& [id, r] : seqs_) {
    const model::sequence& s = *r.seq;
    for (int i = 0; i < s.n_sources(); ++i) {
      const auto& src = s.source(i);
      total += src.main.capacity() + src.index.capacity();  // the entry bytes: the only copy
    }
    for (int l = 0; l < s.config().n_layers_total(); ++l) total += s.ring(l).bytes.capacity();
    total += s.tokens().capacity() * sizeof(int32_t);
  }
  return total;
}

void executor_core::open_fresh(int64_t session) {
  if (seqs_.count(session)) return;
  resident_seq r;
  r.seq = std::make_unique<model::sequence>(e_.config(), opts_.storage, opts_.kv_rounded);
  r.committed_entries.assign(size_t(r.seq->n_sources()), 0);
  lru_.push_front(session);
  r.lru = lru_.begin();
  seqs_.emplace(session, std::move(r));
}

void executor_core::drop(int64_t session) {
  auto it = seqs_.find(session);
  if (it == seqs_.end() || gens_.count(session)) return;
  lru_.erase(it->second.lru);
  seqs_.erase(it);
}

std::vector<int64_t> executor_core::enforce_budget() {
  std::vector<int64_t> evicted;
  // Under the replay / reprefill policies nothing idle stays: every resume goes through the store.
  const size_t budget = opts_.policy == resume_policy::resident ? budget_ : 0;
  if (resident_bytes() <= budget) return evicted;
  // Walk from the least recently used end; never evict a generating session.
  for (auto it = lru_.rbegin(); it != lru_.rend() && resident_bytes() > budget;) {
    int64_t id = *it;
    ++it;
    if (gens_.count(id)) continue;
    evicted.push_back(id);
    drop(id);
    it = lru_.rbegin();  // drop() invalidated the iterator
  }
  return evicted;
}

resume_state resume_state_from(const sessions::checkpoint_data& cp) {
  resume_state rs;
  rs.tokens = cp.tokens;
  // A damaged resume-hints blob costs speed, not correctness: replay re-scores those rows.
  std::vector<std::string> aux_errors;
  for (const auto& e : cp.aux_errors) {
    if (e.rfind("aux 'hint.selections'", 0) == 0)
      rs.hints_problem = e;
    else
      aux_errors.push_back(e);
  }
  rs.pages_ok = cp.all_pages_ok() && aux_errors.empty();
  for (const auto& ls : cp.sources) {
    resume_state::source s;
    s.layer = ls.source_layer;
    for (const auto& p : ls.pages) {
      if (p.status != sessions::page_status::ok) {
        rs.problem = "page of layer " + std::to_string(ls.source_layer) + " at entry " + std::to_string(p.first_entry) +
                     ": " + sessions::page_status_name(p.status) + (p.detail.empty() ? "" : " (" + p.detail + ")");
        continue;
      }
      auto m = p.main(), ix = p.index();
      s.main.insert(s.main.end(), m.begin(), m.end());
      s.index.insert(s.index.end(), ix.begin(), ix.end());
    }
    rs.sources.push_back(std::move(s));
  }
  if (!aux_errors.empty()) rs.problem = "aux state: " + aux_errors.front();
  for (const auto& a : cp.aux) rs.aux.emplace_back(a.name, a.bytes);
  return rs;
}

result<resume_path> executor_core::restore(int64_t session, const resume_state& cp, double* ms) {
  auto t0 = clock_type::now();
  if (seqs_.count(session)) return make_error(errc::internal, "restore: session already resident");
  const model::model_config& c = e_.config();
  open_fresh(session);
  resident_seq& r = seqs_.at(session);
  if (cp.tokens.empty()) {
    if (ms) *ms = ms_since(t0);
    return resume_path::fresh;
  }

  // Try the replayed path: global KV pages + aux state, then bounded replay.
  std::string why;
  // Borrowed from cp: sequence::restore copies the entry bytes once, straight from cp's buffers.
  model::sequence_snapshot_view snap;
  snap.tokens = cp.tokens;
  std::vector<std::vector<float>> pending((size_t)r.seq->n_sources() * 2);  // kv, gate per source
  std::vector<int64_t> ngram;
  bool ok = cp.pages_ok && cp.problem.empty();
  if (!ok) why = cp.problem.empty() ? "pages failed verification" : cp.problem;
  // Exact resume by policy, or unquantised KV (never persisted): re-prefill, without a warning.
  const bool forced = opts_.policy == resume_policy::reprefill || opts_.storage != model::kv_storage::packed;
  if (forced) ok = false;
  if (ok && int(cp.sources.size()) != r.seq->n_sources()) {
    ok = false;
    why = "checkpoint has " + std::to_string(cp.sources.size()) + " KV sources, the model " +
          std::to_string(r.seq->n_sources());
  }
  for (int i = 0; ok && i < r.seq->n_sources(); ++i) {
    const auto& ls = cp.sources[size_t(i)];
    const auto& st = r.seq->source(i);
    if (int(ls.layer) != st.layer) {
      ok = false;
      why = "KV source layer " + std::to_string(ls.layer) + " where the model has " + std::to_string(st.layer);
      break;
    }
    model::sequence_snapshot_view::source s;
    s.main = ls.main;
    s.index = ls.index;
    std::vector<float>& pkv = pending[2 * (size_t)i];
    std::vector<float>& pgate = pending[2 * (size_t)i + 1];
    if (st.ratio > 1) {
      auto a = std::find_if(cp.aux.begin(), cp.aux.end(),
                            [&](const auto& b) { return b.first == "pending.L" + std::to_string(st.layer); });
      std::span<const uint8_t> b;
      if (a != cp.aux.end()) b = a->second;
      uint32_t n = 0;
      if (a == cp.aux.end() || !get_magic(b) || !get(b, n) || int(n) >= st.ratio ||
          !get_floats(b, pkv, size_t(n) * c.head_dim) || !get_floats(b, pgate, size_t(n) * c.head_dim)) {
        ok = false;
        why = "aux 'pending.L" + std::to_string(st.layer) + "' missing or malformed";
        break;
      }
      s.n_pending = int(n);
    }
    s.pending_kv = pkv;
    s.pending_gate = pgate;
    snap.sources.push_back(std::move(s));
  }
  if (ok) {
    auto a = std::find_if(cp.aux.begin(), cp.aux.end(), [](const auto& b) { return b.first == "ngram"; });
    std::span<const uint8_t> b;
    if (a != cp.aux.end()) b = a->second;
    uint32_t n = 0;
    if (a == cp.aux.end() || !get_magic(b) || !get(b, n) || n > 64) {
      ok = false;
      why = "aux 'ngram' missing or malformed";
    } else {
      ngram.resize(n);
      for (auto& v : ngram)
        if (!get(b, v)) { ok = false; why = "aux 'ngram' truncated"; break; }
      snap.ngram_history = ngram;
    }
  }
  if (ok) {
    if (auto st = r.seq->restore(snap); !st) {
      ok = false;
      why = st.err().message;
    }
  }
  if (ok) {
    // Resume hints: optional. Missing (a checkpoint from before them, a fork), damaged or not
    // matching: the replayed rows re-score their index selections instead.
    auto a = std::find_if(cp.aux.begin(), cp.aux.end(), [](const auto& b) { return b.first == "hint.selections"; });
    std::string hw = cp.hints_problem;
    if (a != cp.aux.end() && r.seq->n_index_layers() > 0) {
      auto h = decode_selections(a->second, r.seq->n_index_layers(), c.index_topk);
      if (!h)
        hw = h.err().message;
      else if (auto st = r.seq->restore_selections(*h); !st)
        hw = st.err().message;
    }
    if (!hw.empty())
      CEDAR_LOG_WARN("session %lld: resume hints not used (%s); bounded replay re-scores its rows", (long long)session,
                     hw.c_str());
  }
  resume_path path = resume_path::replayed;
  if (ok) {
    int n = std::min<int64_t>(c.sliding_window, r.seq->n_tokens());
    if (auto rp = runner_->replay(*r.seq, n); !rp) {
      ok = false;
      why = "bounded replay failed: " + rp.err().message;
    }
  }
  if (!ok) {
    // The token log is the source of truth: rebuild everything from it.
    if (!forced)
      CEDAR_LOG_WARN("session %lld: %s; re-prefilling %zu tokens", (long long)session, why.c_str(), cp.tokens.size());
    r.seq = std::make_unique<model::sequence>(c, opts_.storage, opts_.kv_rounded);
    model::prefill_options opt;
    opt.mode = model::prefill_mode::ced;
    auto pr = runner_->prefill(*r.seq, cp.tokens, opt);
    if (!pr) {
      drop(session);
      return make_error(pr.err().code, "session " + std::to_string(session) + ": re-prefill failed: " + pr.err().message);
    }
    path = resume_path::reprefilled;
  }
  r.committed_tokens = uint64_t(r.seq->n_tokens());
  r.committed_entries.assign(size_t(r.seq->n_sources()), 0);
  for (int i = 0; i < r.seq->n_sources(); ++i) r.committed_entries[size_t(i)] = r.seq->source(i).n_entries;
  if (ms) *ms = ms_since(t0);
  return path;
}

// ============================================================================================
// generation
// ============================================================================================
result<step_token> executor_core::start(int64_t session, std::span<const int32_t> new_tokens,
                                        const generation_params& p, resume_path path, double resume_ms) {
  if (!seqs_.count(session)) return make_error(errc::internal, "start: session not resident");
  if (gens_.count(session)) return make_error(errc::invalid_argument, "session " + std::to_string(session) + " is already generating");
  if (new_tokens.empty()) return make_error(errc::invalid_argument, "a generation needs at least one new token");
  const int64_t V = e_.config().vocab_size;
  for (int32_t t : new_tokens)
    if (t < 0 || t >= V) return make_error(errc::invalid_argument, "token id " + std::to_string(t) + " outside the vocabulary");
  std::optional<model::tool_grammar> grammar;
  if (!p.tool_grammar.empty()) {
    if (!opts_.tokenizer) return make_error(errc::invalid_argument, "constrained tool calls need the executor's tokenizer");
    auto gr = model::tool_grammar::from_json(p.tool_grammar);
    if (!gr) return gr.take_err();
    grammar = std::move(*gr);
  }
  resident_seq& r = touch(session);
  auto g = std::make_unique<gen>(p);
  g->grammar = std::move(grammar);
  if (g->grammar) g->text = p.reply_prefix;
  g->stats.path = path;
  g->stats.resume_ms = resume_ms;
  g->stats.n_prompt = int64_t(new_tokens.size());
  if (path == resume_path::replayed) g->stats.n_replayed = std::min<int64_t>(e_.config().sliding_window, r.seq->n_tokens());
  if (path == resume_path::reprefilled) g->stats.n_replayed = r.seq->n_tokens();
  auto t0 = clock_type::now();
  model::prefill_options opt;
  opt.mode = model::prefill_mode::ced;
  auto lr = runner_->prefill(*r.seq, new_tokens, opt);
  if (!lr) return lr.take_err();
  const float* last = lr->values.data() + size_t(lr->n_rows - 1) * size_t(V);
  int32_t tok = choose(*g, last, int(V));
  note_token(*g, tok);
  g->stats.prefill_ms = ms_since(t0);
  g->generated.push_back(tok);
  g->last = tok;
  auto is_stop = [&](int32_t t) { return is_stop_token(t, e_.config().eos_token_id, p.stop_ids); };
  if (is_stop(tok) || p.max_new_tokens <= 1) {
    g->finishing = true;
    g->stopped = is_stop(tok);
  }
  gens_[session] = std::move(g);
  return step_token{session, tok};
}

turn_kv executor_core::collect_delta(resident_seq& r) {
  const model::sequence& s = *r.seq;
  turn_kv kv;
  kv.first_token = r.committed_tokens;
  kv.tokens.assign(s.tokens().begin() + int64_t(r.committed_tokens), s.tokens().end());
  // Unquantised (diagnostic) KV is not persisted: the store holds FP4 pages only.
  for (int i = 0; i < s.n_sources() && s.storage() == model::kv_storage::packed; ++i) {
    const auto& src = s.source(i);
    kv_source_delta d;
    d.layer = uint32_t(src.layer);
    d.first_entry = uint64_t(r.committed_entries[size_t(i)]);
    d.n_entries = uint32_t(src.n_entries - r.committed_entries[size_t(i)]);
    const size_t mb = s.main_entry_bytes(), ib = s.index_entry_bytes();
    d.main.assign(src.main.begin() + int64_t(d.first_entry * mb), src.main.end());
    d.index.assign(src.index.begin() + int64_t(d.first_entry * ib), src.index.end());
    r.committed_entries[size_t(i)] = src.n_entries;
    kv.sources.push_back(std::move(d));
  }
  kv.aux = aux_of(s);
  r.committed_tokens = uint64_t(s.n_tokens());
  return kv;
}

result<std::vector<step_token>> executor_core::step() {
  std::vector<step_token> out;
  if (gens_.empty()) return out;
  std::vector<model::sequence*> seqs;
  std::vector<int32_t> toks;
  std::vector<int64_t> ids;
  for (auto& [id, g] : gens_) {
    seqs.push_back(seqs_.at(id).seq.get());
    toks.push_back(g->last);
    ids.push_back(id);
  }
  auto t0 = clock_type::now();
  if (auto st = runner_->decode_step(seqs, toks, logits_); !st) return st.take_err();
  const double dt = ms_since(t0);
  const int64_t V = e_.config().vocab_size;
  for (size_t b = 0; b < ids.size(); ++b) {
    gen& g = *gens_.at(ids[b]);
    g.stats.decode_ms += dt;
    if (g.finishing) {
      resident_seq& r = seqs_.at(ids[b]);
      finished_generation f;
      f.session = ids[b];
      f.generated = std::move(g.generated);
      f.stopped = g.stopped;
      f.stats = g.stats;
      f.stats.n_generated = int64_t(f.generated.size());
      f.stats.context = r.seq->n_tokens();
      f.kv = collect_delta(r);
      finished_.push_back(std::move(f));
      gens_.erase(ids[b]);
      continue;
    }
    int32_t tok = choose(g, logits_.data() + b * size_t(V), int(V));
    note_token(g, tok);
    g.generated.push_back(tok);
    g.last = tok;
    bool stop = is_stop_token(tok, e_.config().eos_token_id, g.params.stop_ids);
    if (stop || int(g.generated.size()) >= g.params.max_new_tokens) {
      g.finishing = true;
      g.stopped = stop;
    }
    out.push_back({ids[b], tok});
  }
  return out;
}

void executor_core::cancel(int64_t session) {
  auto it = gens_.find(session);
  if (it == gens_.end()) return;
  gen& g = *it->second;
  resident_seq& r = seqs_.at(session);
  finished_generation f;
  f.session = session;
  f.generated = std::move(g.generated);
  if (!f.generated.empty()) f.generated.pop_back();  // the unfed token is not part of the turn
  f.stopped = false;
  f.stats = g.stats;
  f.stats.n_generated = int64_t(f.generated.size());
  f.stats.context = r.seq->n_tokens();
  f.kv = collect_delta(r);
  finished_.push_back(std::move(f));
  gens_.erase(it);
}

std::vector<finished_generation> executor_core::take_finished() {
  std::vector<finished_generation> out;
  out.swap(finished_);
  return out;
}

}  // namespace cedar::runtime
