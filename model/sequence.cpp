// sequence — see sequence.hpp.
#include "model/sequence.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <numeric>

#include "kernels/cpu/quant.hpp"

namespace cedar::model {

namespace kq = cedar::kernels;

uint64_t sequence::identity::next_id() {
  static std::atomic<uint64_t> n{1};
  return n.fetch_add(1, std::memory_order_relaxed);
}

sequence::sequence(const model_config& c, kv_storage storage, uint8_t rounded)
    : cfg_(c), storage_(storage), rounded_(storage == kv_storage::packed ? 0 : rounded) {
  const bool packed = storage == kv_storage::packed;
  swa_bytes_ = packed ? kq::fp8_swa_bytes(c.head_dim) : sizeof(float) * (size_t)c.head_dim;
  main_bytes_ = packed ? kq::fp4_kv_bytes(c.head_dim) : sizeof(float) * (size_t)c.head_dim;
  index_bytes_ = packed ? kq::fp4_index_bytes(c.index_head_dim) : sizeof(float) * (size_t)c.index_head_dim;
  rings_.resize((size_t)c.num_hidden_layers);
  for (swa_ring& r : rings_) r.bytes.assign((size_t)c.sliding_window * swa_bytes_, 0);
  source_of_layer_.assign((size_t)c.num_hidden_layers, -1);
  for (int l : c.kv_source_layer_ids) {
    if (l < 0 || l >= c.num_hidden_layers) continue;
    kv_source_state s;
    s.layer = l;
    s.ratio = std::max(1, c.compress_ratios[(size_t)l]);
    s.pending_kv.assign((size_t)(s.ratio - 1) * c.head_dim, 0.0f);
    s.pending_gate.assign((size_t)(s.ratio - 1) * c.head_dim, 0.0f);
    source_of_layer_[(size_t)l] = (int)sources_.size();
    sources_.push_back(std::move(s));
  }
  index_slot_.assign((size_t)c.num_hidden_layers, -1);
  int64_t align = 1;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const int r = c.compress_ratios[(size_t)l];
    if (r > 0) align = std::lcm(align, (int64_t)r);
    if (r > 0 && c.is_index_source(l)) {
      index_slot_[(size_t)l] = (int)index_layers_.size();
      index_layers_.push_back(l);
    }
  }
  sel_cap_ = index_layers_.empty() ? 0 : c.sliding_window + (int)align;
  sel_ids_.assign((size_t)index_layers_.size() * sel_cap_ * std::max(0, c.index_topk), -1);
  sel_from_.assign(index_layers_.size(), 0);
  sel_to_.assign(index_layers_.size(), 0);
}

int sequence::source_of_layer(int layer) const {
  if (layer < 0 || layer >= (int)source_of_layer_.size()) return -1;
  return source_of_layer_[(size_t)layer];
}

bool sequence::swa_valid(int layer, int64_t pos) const {
  const swa_ring& r = rings_[(size_t)layer];
  return pos >= r.first_pos && pos >= n_tokens() - cfg_.sliding_window && pos < n_tokens();
}

void sequence::swa_entry(int layer, int64_t pos, float* out) const {
  const uint8_t* p = rings_[(size_t)layer].bytes.data() + (size_t)(pos % cfg_.sliding_window) * swa_bytes_;
  if (storage_ == kv_storage::packed)
    kq::fp8_swa_unpack(p, cfg_.head_dim, out);
  else
    std::memcpy(out, p, swa_bytes_);
}

void sequence::swa_write(int layer, int64_t pos, const float* kv) {
  ++ident_.version;
  uint8_t* p = rings_[(size_t)layer].bytes.data() + (size_t)(pos % cfg_.sliding_window) * swa_bytes_;
  if (storage_ == kv_storage::packed) {
    kq::fp8_swa_pack(kv, cfg_.head_dim, p);
  } else {
    std::memcpy(p, kv, swa_bytes_);
    if (rounded_ & kv_part_swa) kq::fp8_swa_fake_quant(reinterpret_cast<float*>(p), cfg_.head_dim);
  }
}

void sequence::append_entry(int i, const float* main, const float* key) {
  ++ident_.version;
  kv_source_state& s = sources_[(size_t)i];
  const int hd = cfg_.head_dim, di = cfg_.index_head_dim;
  const size_t m0 = s.main.size(), k0 = s.index.size();
  s.main.resize(m0 + main_bytes_);
  s.index.resize(k0 + index_bytes_);
  if (storage_ == kv_storage::packed) {
    kq::fp4_kv_pack(main, hd, s.main.data() + m0);
    kq::fp4_index_pack(key, di, s.index.data() + k0);
  } else {
    std::memcpy(s.main.data() + m0, main, main_bytes_);
    std::memcpy(s.index.data() + k0, key, index_bytes_);
    if (rounded_ & kv_part_main) kq::fp4_kv_fake_quant(reinterpret_cast<float*>(s.main.data() + m0), hd);
    if (rounded_ & kv_part_index) kq::fp4_index_fake_quant(reinterpret_cast<float*>(s.index.data() + k0), di);
  }
  ++s.n_entries;
}

void sequence::main_entry(int i, int64_t e, float* out) const {
  const uint8_t* p = sources_[(size_t)i].main.data() + (size_t)e * main_bytes_;
  if (storage_ == kv_storage::packed)
    kq::fp4_kv_unpack(p, cfg_.head_dim, out);
  else
    std::memcpy(out, p, main_bytes_);
}

const float* sequence::index_f32(int i) const {
  if (storage_ == kv_storage::packed) return nullptr;
  // f32_diagnostic entries are fp32 rows written by memcpy; vector storage is aligned for float
  return reinterpret_cast<const float*>(sources_[(size_t)i].index.data());
}

std::vector<float> sequence::main_values(int i) const {
  const kv_source_state& s = sources_[(size_t)i];
  std::vector<float> out((size_t)s.n_entries * cfg_.head_dim);
  for (int64_t e = 0; e < s.n_entries; ++e) main_entry(i, e, out.data() + (size_t)e * cfg_.head_dim);
  return out;
}

std::vector<float> sequence::index_values(int i) const {
  const kv_source_state& s = sources_[(size_t)i];
  const int di = cfg_.index_head_dim;
  std::vector<float> out((size_t)s.n_entries * di);
  for (int64_t e = 0; e < s.n_entries; ++e) {
    const uint8_t* p = s.index.data() + (size_t)e * index_bytes_;
    if (storage_ == kv_storage::packed)
      kq::fp4_index_unpack(p, di, out.data() + (size_t)e * di);
    else
      std::memcpy(out.data() + (size_t)e * di, p, index_bytes_);
  }
  return out;
}

void sequence::append_tokens(const int32_t* t, int n, const int64_t* compressed) {
  ++ident_.version;
  tokens_.insert(tokens_.end(), t, t + n);
  const size_t keep = (size_t)std::max(0, cfg_.engram_max_ngram_size - 1);
  if (keep == 0 || cfg_.engram_layer_ids.empty()) return;
  ngram_history_.insert(ngram_history_.end(), compressed, compressed + n);
  if (ngram_history_.size() > keep)
    ngram_history_.erase(ngram_history_.begin(), ngram_history_.end() - (std::ptrdiff_t)keep);
}

void sequence::note_selection(int layer, int64_t pos, const int32_t* ids, int n) {
  const int j = index_slot_[(size_t)layer];
  const int K = cfg_.index_topk;
  if (j < 0 || K <= 0) return;
  ++ident_.version;
  if (pos != sel_to_[(size_t)j]) sel_from_[(size_t)j] = pos;
  sel_to_[(size_t)j] = pos + 1;
  int32_t* dst = sel_ids_.data() + ((size_t)j * sel_cap_ + (size_t)(pos % sel_cap_)) * K;
  n = std::clamp(n, 0, K);
  std::copy_n(ids, n, dst);
  std::fill(dst + n, dst + K, -1);
}

int64_t sequence::selections_from() const {
  const int64_t n = n_tokens();
  if (index_layers_.empty()) return n;
  int64_t from = 0;
  for (size_t j = 0; j < index_layers_.size(); ++j) {
    if (sel_to_[j] != n) return n;
    from = std::max({from, sel_from_[j], sel_to_[j] - sel_cap_});
  }
  return std::min(from, n);
}

const int32_t* sequence::selection(int layer, int64_t pos) const {
  const int j = index_slot_[(size_t)layer];
  return sel_ids_.data() + ((size_t)j * sel_cap_ + (size_t)(pos % sel_cap_)) * cfg_.index_topk;
}

index_selections sequence::selections(int max_rows) const {
  index_selections h;
  const int64_t n = n_tokens();
  h.first_pos = std::max(selections_from(), n - std::max(0, max_rows));
  h.n_rows = (int)(n - h.first_pos);
  const int K = cfg_.index_topk;
  h.ids.reserve((size_t)index_layers_.size() * h.n_rows * K);
  for (int l : index_layers_)
    for (int64_t p = h.first_pos; p < n; ++p) {
      const int32_t* r = selection(l, p);
      h.ids.insert(h.ids.end(), r, r + K);
    }
  return h;
}

status sequence::restore_selections(const index_selections& h) {
  const int64_t n = n_tokens();
  const int K = cfg_.index_topk;
  const int L = (int)index_layers_.size();
  std::fill(sel_from_.begin(), sel_from_.end(), n);
  std::fill(sel_to_.begin(), sel_to_.end(), n);
  if (h.n_rows == 0) return {};
  const std::string who = "index selections: ";
  if (h.n_rows < 0 || h.n_rows > sel_cap_ || h.first_pos + h.n_rows != n)
    return make_error(errc::mismatch, who + "rows [" + std::to_string(h.first_pos) + ", " +
                                          std::to_string(h.first_pos + h.n_rows) + ") must end at the " +
                                          std::to_string(n) + " tokens and number at most " + std::to_string(sel_cap_));
  if (h.ids.size() != (size_t)L * h.n_rows * K)
    return make_error(errc::mismatch, who + std::to_string(h.ids.size()) + " ids, expected " +
                                          std::to_string((size_t)L * h.n_rows * K) + " (" + std::to_string(L) +
                                          " index layers x " + std::to_string(h.n_rows) + " rows x top-k " +
                                          std::to_string(K) + ")");
  for (int j = 0; j < L; ++j) {
    const int l = index_layers_[(size_t)j];
    const int64_t ratio = std::max(1, cfg_.compress_ratios[(size_t)l]);
    for (int i = 0; i < h.n_rows; ++i) {
      const int64_t p = h.first_pos + i;
      const int64_t vis = (p + 1) / ratio;  // entries row p could select
      const int32_t* r = h.ids.data() + ((size_t)j * h.n_rows + i) * K;
      bool pad = false;
      for (int k = 0; k < K; ++k) {
        if (r[k] == -1) { pad = true; continue; }
        if (pad || r[k] < 0 || r[k] >= vis)
          return make_error(errc::mismatch, who + "layer " + std::to_string(l) + " row " + std::to_string(p) +
                                                ": id " + std::to_string(r[k]) + " is not an entry the row sees (" +
                                                std::to_string(vis) + " visible)");
      }
    }
  }
  ++ident_.version;
  for (int j = 0; j < L; ++j) {
    for (int i = 0; i < h.n_rows; ++i) {
      const int64_t p = h.first_pos + i;
      std::copy_n(h.ids.data() + ((size_t)j * h.n_rows + i) * K, K,
                  sel_ids_.data() + ((size_t)j * sel_cap_ + (size_t)(p % sel_cap_)) * K);
    }
    sel_from_[(size_t)j] = h.first_pos;
  }
  return {};
}

sequence_snapshot sequence::snapshot() const {
  sequence_snapshot s;
  s.selections = selections(sel_cap_);
  s.tokens = tokens_;
  s.ngram_history = ngram_history_;
  for (const kv_source_state& k : sources_) {
    sequence_snapshot::source o;
    o.main = k.main;
    o.index = k.index;
    o.n_pending = k.n_pending;
    o.pending_kv.assign(k.pending_kv.begin(), k.pending_kv.begin() + (std::ptrdiff_t)k.n_pending * cfg_.head_dim);
    o.pending_gate.assign(k.pending_gate.begin(), k.pending_gate.begin() + (std::ptrdiff_t)k.n_pending * cfg_.head_dim);
    s.sources.push_back(std::move(o));
  }
  return s;
}

void sequence::clear() {
  ++ident_.version;
  tokens_.clear();
  ngram_history_.clear();
  for (swa_ring& r : rings_) r.first_pos = 0;
  std::fill(sel_from_.begin(), sel_from_.end(), 0);
  std::fill(sel_to_.begin(), sel_to_.end(), 0);
  for (kv_source_state& k : sources_) {
    k.n_entries = 0;
    k.main.clear(); k.index.clear();
    k.n_pending = 0;
  }
}

status sequence::restore(const sequence_snapshot& s) {
  sequence_snapshot_view v;
  v.tokens = s.tokens;
  v.ngram_history = s.ngram_history;
  v.selections = &s.selections;
  for (const sequence_snapshot::source& o : s.sources)
    v.sources.push_back({o.main, o.index, o.n_pending, o.pending_kv, o.pending_gate});
  return restore(v);
}

status sequence::restore(const sequence_snapshot_view& s) {
  ++ident_.version;
  if (s.sources.size() != sources_.size())
    return make_error(errc::mismatch, "sequence restore: " + std::to_string(s.sources.size()) +
                                          " KV sources given, the model has " + std::to_string(sources_.size()));
  const int64_t n = (int64_t)s.tokens.size();
  for (size_t i = 0; i < sources_.size(); ++i) {
    const kv_source_state& k = sources_[i];
    const sequence_snapshot_view::source& o = s.sources[i];
    const std::string who = "sequence restore: KV source layer " + std::to_string(k.layer);
    const int64_t entries = n / k.ratio;
    if (o.main.size() != (size_t)entries * main_bytes_)
      return make_error(errc::mismatch, who + ": main KV has " + std::to_string(o.main.size()) +
                                            " bytes, expected " + std::to_string((size_t)entries * main_bytes_) +
                                            " for " + std::to_string(n) + " tokens");
    if (o.index.size() != (size_t)entries * index_bytes_)
      return make_error(errc::mismatch, who + ": index keys have " + std::to_string(o.index.size()) +
                                            " bytes, expected " + std::to_string((size_t)entries * index_bytes_));
    if (o.n_pending != n % k.ratio ||
        o.pending_kv.size() != (size_t)o.n_pending * cfg_.head_dim ||
        o.pending_gate.size() != (size_t)o.n_pending * cfg_.head_dim)
      return make_error(errc::mismatch, who + ": pending group must hold " + std::to_string(n % k.ratio) +
                                            " rows of " + std::to_string(cfg_.head_dim) + " kv and gate values");
  }
  const size_t keep = cfg_.engram_layer_ids.empty() ? 0 : (size_t)std::max(0, cfg_.engram_max_ngram_size - 1);
  if (s.ngram_history.size() != std::min<size_t>(keep, (size_t)n))
    return make_error(errc::mismatch, "sequence restore: n-gram history must hold " +
                                          std::to_string(std::min<size_t>(keep, (size_t)n)) + " ids, got " +
                                          std::to_string(s.ngram_history.size()));
  for (int32_t t : s.tokens)
    if (t < 0 || t >= cfg_.vocab_size)
      return make_error(errc::invalid_argument, "sequence restore: token id " + std::to_string(t) + " out of range");
  const int64_t spare = restore_spare_tokens(n);
  // plain copies (the bytes are the only form of the global KV) into arrays with room for the
  // next turn: assign() into an array the size of the bytes would make the next append copy
  // them all again
  const auto copy_with_room = [](auto& dst, auto src, size_t room) {
    dst.clear();
    dst.reserve(src.size() + room);
    dst.insert(dst.end(), src.begin(), src.end());
  };
  copy_with_room(tokens_, s.tokens, (size_t)spare);
  ngram_history_.assign(s.ngram_history.begin(), s.ngram_history.end());
  for (swa_ring& r : rings_) r.first_pos = n;  // empty: replay rebuilds them
  for (size_t i = 0; i < sources_.size(); ++i) {
    kv_source_state& k = sources_[i];
    const sequence_snapshot_view::source& o = s.sources[i];
    const size_t room = (size_t)((spare + k.ratio - 1) / k.ratio);
    copy_with_room(k.main, o.main, room * main_bytes_);
    copy_with_room(k.index, o.index, room * index_bytes_);
    k.n_entries = n / k.ratio;
    k.n_pending = o.n_pending;
    std::copy(o.pending_kv.begin(), o.pending_kv.end(), k.pending_kv.begin());
    std::copy(o.pending_gate.begin(), o.pending_gate.end(), k.pending_gate.begin());
  }
  std::fill(sel_from_.begin(), sel_from_.end(), n);  // no hints unless given
  std::fill(sel_to_.begin(), sel_to_.end(), n);
  if (s.selections) return restore_selections(*s.selections);
  return {};
}

}  // namespace cedar::model
