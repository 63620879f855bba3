// model::tokenizer — see tokenizer.hpp for the design. Sections in data-flow order:
// UTF-8 helpers, byte-level map, PCRE2 wrapper, tokenizer.json loading, encode, decode.
#include "model/tokenizer.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <simdjson.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <queue>
#include <sstream>

namespace cedar::model {

// ============================================================================================
// UTF-8
// ============================================================================================

namespace {

// Length of the well-formed sequence starting at s[i], or 0 if it is ill-formed; `valid_prefix` is
// set to how many of its bytes were valid before the first bad or missing byte (Unicode
// Table 3-7; the "maximal subpart" of an ill-formed sequence).
int utf8_seq(std::string_view s, size_t i, int& valid_prefix, bool& truncated) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  truncated = false;
  valid_prefix = 1;
  if (b0 < 0x80) return 1;
  int need = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 0;  // 80..C1, F5..FF: never a lead byte
  }
  for (int k = 1; k < need; ++k) {
    if (i + k >= s.size()) {
      truncated = true;
      return 0;
    }
    const auto b = static_cast<unsigned char>(s[i + k]);
    const unsigned char l = (k == 1) ? lo : 0x80, h = (k == 1) ? hi : 0xBF;
    if (b < l || b > h) return 0;
    valid_prefix = k + 1;
  }
  return need;
}

constexpr std::string_view replacement_char = "\xEF\xBF\xBD";  // U+FFFD

}  // namespace

bool utf8_valid(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    int vp;
    bool tr;
    const int n = utf8_seq(s, i, vp, tr);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

size_t utf8_sanitize(std::string_view s, bool final, std::string& out) {
  size_t i = 0;
  while (i < s.size()) {
    int vp;
    bool tr;
    const int n = utf8_seq(s, i, vp, tr);
    if (n > 0) {
      out.append(s.substr(i, n));
      i += n;
      continue;
    }
    if (tr && !final) return i;  // could still complete: hold it back
    out.append(replacement_char);
    i += vp;
  }
  return i;
}

// ============================================================================================
// Byte-level (GPT-2) map: every byte is a printable code point so that tokens are text.
// ============================================================================================

namespace {

struct byte_map {
  uint32_t byte_to_cp[256];
  std::unordered_map<uint32_t, uint8_t> cp_to_byte;
  std::string byte_to_utf8[256];
  byte_map() {
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      byte_to_cp[b] = keep ? b : 256 + extra++;
      cp_to_byte[byte_to_cp[b]] = static_cast<uint8_t>(b);
      const uint32_t cp = byte_to_cp[b];
      std::string u;
      if (cp < 0x80) {
        u.push_back(static_cast<char>(cp));
      } else {  // all mapped code points are < 0x800
        u.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        u.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      }
      byte_to_utf8[b] = u;
    }
  }
};

const byte_map& bytes_map() {
  static const byte_map m;
  return m;
}

// Token string (byte-level chars) -> bytes; false if a char is outside the byte alphabet.
bool token_to_bytes(std::string_view tok, std::string& out) {
  const auto& m = bytes_map();
  out.clear();
  size_t i = 0;
  while (i < tok.size()) {
    const auto b0 = static_cast<unsigned char>(tok[i]);
    uint32_t cp;
    if (b0 < 0x80) {
      cp = b0;
      i += 1;
    } else if ((b0 & 0xE0) == 0xC0 && i + 1 < tok.size()) {
      cp = ((b0 & 0x1F) << 6) | (static_cast<unsigned char>(tok[i + 1]) & 0x3F);
      i += 2;
    } else {
      return false;
    }
    auto it = m.cp_to_byte.find(cp);
    if (it == m.cp_to_byte.end()) return false;
    out.push_back(static_cast<char>(it->second));
  }
  return true;
}

}  // namespace

// ============================================================================================
// PCRE2
// ============================================================================================

struct pcre2_regex {
  pcre2_code* code = nullptr;
  std::string pattern;
  ~pcre2_regex() {
    if (code) pcre2_code_free(code);
  }
};

namespace {

result<std::shared_ptr<pcre2_regex>> compile_regex(const std::string& pattern, const std::string& field) {
  int errnum = 0;
  PCRE2_SIZE erroff = 0;
  auto rx = std::make_shared<pcre2_regex>();
  rx->pattern = pattern;
  rx->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                           PCRE2_UTF | PCRE2_UCP, &errnum, &erroff, nullptr);
  if (!rx->code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(errnum, msg, sizeof msg);
    return make_error(errc::invalid_format, field + ": regex does not compile at offset " +
                                                std::to_string(erroff) + ": " +
                                                reinterpret_cast<const char*>(msg));
  }
  pcre2_jit_compile(rx->code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter on failure
  return rx;
}

struct match_data_holder {
  pcre2_match_data* md;
  explicit match_data_holder(uint32_t n) : md(pcre2_match_data_create(n, nullptr)) {}
  ~match_data_holder() { pcre2_match_data_free(md); }
};

size_t utf8_char_len(unsigned char b) {
  if (b < 0x80) return 1;
  if ((b & 0xE0) == 0xC0) return 2;
  if ((b & 0xF0) == 0xE0) return 3;
  return 4;
}

}  // namespace

// ============================================================================================
// Loading tokenizer.json
// ============================================================================================

namespace {

using simdjson::dom::array;
using simdjson::dom::element;
using simdjson::dom::object;

error field_error(const std::string& origin, const std::string& field, const std::string& what) {
  return make_error(errc::invalid_format, origin + ": field '" + field + "' " + what);
}

}  // namespace

result<tokenizer> tokenizer::load(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return make_error(errc::io, "cannot open tokenizer file '" + path + "'");
  std::stringstream ss;
  ss << f.rdbuf();
  if (f.bad()) return make_error(errc::io, "cannot read tokenizer file '" + path + "'");
  return from_json(ss.str(), path);
}

result<tokenizer> tokenizer::from_json(std::string_view json, const std::string& origin) {
  simdjson::dom::parser parser;
  simdjson::padded_string padded(json);
  element root;
  if (auto err = parser.parse(padded).get(root)) {
    return make_error(errc::invalid_format, origin + ": not valid JSON: " + simdjson::error_message(err));
  }
  object top;
  if (root.get_object().get(top))
    return make_error(errc::invalid_format, origin + ": top level is not an object");

  tokenizer t;

  // --- model ---
  object model;
  if (top["model"].get_object().get(model))
    return field_error(origin, "model", "is missing or not an object");
  std::string_view type;
  if (model["type"].get_string().get(type))
    return field_error(origin, "model.type", "is missing or not a string");
  if (type != "BPE")
    return field_error(origin, "model.type", "is \"" + std::string(type) + "\", expected \"BPE\"");
  bool ign = false;
  if (auto r = model["ignore_merges"]; r.error() == simdjson::SUCCESS && !r.value().is_null()) {
    if (r.get_bool().get(ign)) return field_error(origin, "model.ignore_merges", "is not a boolean");
  }
  t.ignore_merges_ = ign;
  for (const char* unsupported : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto r = model[unsupported];
    if (r.error() == simdjson::SUCCESS && !r.value().is_null()) {
      std::string_view s;
      if (r.get_string().get(s) || !s.empty())
        return field_error(origin, std::string("model.") + unsupported,
                           "is set; byte-level BPE does not use it");
    }
  }
  if (auto r = model["byte_fallback"];
      r.error() == simdjson::SUCCESS && r.value().is_bool() && bool(r.value().get_bool().value()))
    return field_error(origin, "model.byte_fallback", "is true; byte-level BPE does not use it");

  object vocab;
  if (model["vocab"].get_object().get(vocab))
    return field_error(origin, "model.vocab", "is missing or not an object");
  int32_t max_id = -1;
  for (auto [key, val] : vocab) {
    int64_t id;
    if (val.get_int64().get(id) || id < 0 || id > INT32_MAX)
      return field_error(origin, "model.vocab[\"" + std::string(key) + "\"]",
                         "is not a non-negative integer id");
    t.vocab_.emplace(std::string(key), static_cast<int32_t>(id));
    max_id = std::max<int32_t>(max_id, static_cast<int32_t>(id));
  }

  // --- added_tokens ---
  struct pending_added {
    std::string content;
    int32_t id;
    bool special;
  };
  std::vector<pending_added> added;
  if (auto r = top["added_tokens"]; r.error() == simdjson::SUCCESS && !r.value().is_null()) {
    array arr;
    if (r.get_array().get(arr)) return field_error(origin, "added_tokens", "is not an array");
    size_t k = 0;
    for (element e : arr) {
      const std::string where = "added_tokens[" + std::to_string(k++) + "]";
      object o;
      if (e.get_object().get(o)) return field_error(origin, where, "is not an object");
      int64_t id;
      std::string_view content;
      if (o["id"].get_int64().get(id) || id < 0 || id > INT32_MAX)
        return field_error(origin, where + ".id", "is missing or not a non-negative integer");
      if (o["content"].get_string().get(content) || content.empty())
        return field_error(origin, where + ".content", "is missing, not a string, or empty");
      bool special = false;
      if (auto s = o["special"]; s.error() == simdjson::SUCCESS) {
        if (s.get_bool().get(special)) return field_error(origin, where + ".special", "is not a boolean");
      }
      for (const char* flag : {"single_word", "lstrip", "rstrip"}) {
        bool v = false;
        if (auto s = o[flag]; s.error() == simdjson::SUCCESS && !s.get_bool().get(v) && v)
          return field_error(origin, where + "." + flag, "is true, which cedar does not support");
      }
      added.push_back({std::string(content), static_cast<int32_t>(id), special});
      max_id = std::max<int32_t>(max_id, static_cast<int32_t>(id));
    }
  }

  // --- id tables ---
  t.id_token_.assign(max_id + 1, std::string());
  t.id_bytes_.assign(max_id + 1, std::string());
  t.id_kind_.assign(max_id + 1, 0);
  std::string bytes;
  for (const auto& [tok, id] : t.vocab_) {
    t.id_token_[id] = tok;
    t.id_kind_[id] = 1;
    if (token_to_bytes(tok, bytes)) {
      t.id_bytes_[id] = bytes;
      t.by_bytes_[bytes] = id;
    } else {
      t.id_bytes_[id] = tok;  // not byte-level text (a marker): decodes to itself, as in HF
    }
  }
  for (const auto& a : added) {
    t.id_token_[a.id] = a.content;
    t.id_bytes_[a.id] = a.content;
    t.id_kind_[a.id] = a.special ? 3 : 2;
    t.added_.push_back({a.content, a.id, a.special});
    t.added_first_byte_[static_cast<unsigned char>(a.content[0])] = true;
  }
  std::stable_sort(t.added_.begin(), t.added_.end(), [](const added_token& a, const added_token& b) {
    return a.content.size() > b.content.size();
  });

  const auto& bm = bytes_map();
  for (int b = 0; b < 256; ++b) {
    auto it = t.vocab_.find(bm.byte_to_utf8[b]);
    if (it == t.vocab_.end()) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02x", b);
      return field_error(origin, "model.vocab", std::string("lacks the byte-level token for byte ") + hex);
    }
    t.byte_id_[b] = it->second;
  }

  // --- merges ---
  array merges;
  if (model["merges"].get_array().get(merges))
    return field_error(origin, "model.merges", "is missing or not an array");
  int32_t rank = 0;
  for (element m : merges) {
    const std::string where = "model.merges[" + std::to_string(rank) + "]";
    std::string left, right;
    std::string_view s;
    array pair;
    if (!m.get_string().get(s)) {
      const size_t sp = s.find(' ');
      if (sp == std::string_view::npos || s.find(' ', sp + 1) != std::string_view::npos)
        return field_error(origin, where, "is \"" + std::string(s) + "\", expected \"LEFT RIGHT\"");
      left = std::string(s.substr(0, sp));
      right = std::string(s.substr(sp + 1));
    } else if (!m.get_array().get(pair) && pair.size() == 2) {
      std::string_view l, r;
      if (pair.at(0).get_string().get(l) || pair.at(1).get_string().get(r))
        return field_error(origin, where, "is not a pair of strings");
      left = std::string(l);
      right = std::string(r);
    } else {
      return field_error(origin, where, "is neither \"LEFT RIGHT\" nor [LEFT, RIGHT]");
    }
    auto li = t.vocab_.find(left), ri = t.vocab_.find(right), mi = t.vocab_.find(left + right);
    if (li == t.vocab_.end() || ri == t.vocab_.end())
      return field_error(origin, where, "names a token missing from model.vocab");
    if (mi == t.vocab_.end())
      return field_error(origin, where,
                         "merges into \"" + left + right + "\", which is missing from model.vocab");
    const uint64_t key = (uint64_t(uint32_t(li->second)) << 32) | uint32_t(ri->second);
    t.merges_.try_emplace(key, merge_info{rank, mi->second});  // a repeated pair keeps its first rank
    ++rank;
  }
  t.n_merges_ = static_cast<size_t>(rank);

  // --- normalizer / pre_tokenizer / decoder ---
  if (auto r = top["normalizer"]; r.error() == simdjson::SUCCESS && !r.value().is_null()) {
    object n;
    std::string_view nt;
    array seq;
    if (r.get_object().get(n) || n["type"].get_string().get(nt) || nt != "Sequence" ||
        n["normalizers"].get_array().get(seq) || seq.size() != 0)
      return field_error(origin, "normalizer",
                         "must be null or an empty Sequence (cedar applies no normalizer)");
  }
  element pre_el;
  object pre;
  if (top["pre_tokenizer"].get(pre_el) || pre_el.get_object().get(pre))
    return field_error(origin, "pre_tokenizer", "is missing or not an object");
  std::string_view pre_type;
  if (pre["type"].get_string().get(pre_type)) return field_error(origin, "pre_tokenizer.type", "is missing");
  std::vector<std::pair<element, std::string>> subs;
  if (pre_type == "Sequence") {
    array arr;
    if (pre["pretokenizers"].get_array().get(arr))
      return field_error(origin, "pre_tokenizer.pretokenizers", "is missing or not an array");
    size_t k = 0;
    for (element e : arr) subs.emplace_back(e, "pre_tokenizer.pretokenizers[" + std::to_string(k++) + "]");
  } else {
    subs.emplace_back(pre_el, "pre_tokenizer");
  }
  bool saw_byte_level = false;
  for (auto& [e, where] : subs) {
    object o;
    std::string_view st;
    if (e.get_object().get(o) || o["type"].get_string().get(st))
      return field_error(origin, where + ".type", "is missing");
    if (st == "Split") {
      if (saw_byte_level)
        return field_error(origin, where, "is a Split after ByteLevel; cedar needs the splits first");
      std::string_view rx, behavior;
      if (o["pattern"]["Regex"].get_string().get(rx))
        return field_error(origin, where + ".pattern.Regex",
                           "is missing (only Regex patterns are supported)");
      if (o["behavior"].get_string().get(behavior) || behavior != "Isolated")
        return field_error(origin, where + ".behavior", "must be \"Isolated\"");
      bool invert = false;
      if (auto iv = o["invert"]; iv.error() == simdjson::SUCCESS && !iv.get_bool().get(invert) && invert)
        return field_error(origin, where + ".invert", "must be false");
      auto c = compile_regex(std::string(rx), origin + ": field '" + where + ".pattern.Regex'");
      if (!c) return c.take_err();
      t.splits_.push_back(std::move(c.value()));
    } else if (st == "ByteLevel") {
      bool v = false;
      if (auto u = o["use_regex"]; u.error() == simdjson::SUCCESS && !u.get_bool().get(v) && v)
        return field_error(origin, where + ".use_regex",
                           "must be false (the splits come from Split regexes)");
      if (auto u = o["add_prefix_space"]; u.error() == simdjson::SUCCESS && !u.get_bool().get(v) && v)
        return field_error(origin, where + ".add_prefix_space", "must be false");
      saw_byte_level = true;
    } else {
      return field_error(origin, where + ".type",
                         "is \"" + std::string(st) + "\"; cedar supports Split and ByteLevel");
    }
  }
  if (!saw_byte_level) return field_error(origin, "pre_tokenizer", "has no ByteLevel step");
  if (auto r = top["decoder"]; r.error() == simdjson::SUCCESS && !r.value().is_null()) {
    std::string_view dt;
    if (r["type"].get_string().get(dt) || dt != "ByteLevel")
      return field_error(origin, "decoder.type", "must be \"ByteLevel\"");
  }

  t.bos_id_ = t.token_to_id(tokens::bos);
  t.eos_id_ = t.token_to_id(tokens::eos);
  t.pad_id_ = t.token_to_id(tokens::pad);
  return t;
}

// ============================================================================================
// Lookups
// ============================================================================================

int32_t tokenizer::token_to_id(std::string_view token) const {
  for (const auto& a : added_)
    if (a.content == token) return a.id;
  auto it = vocab_.find(std::string(token));
  return it == vocab_.end() ? -1 : it->second;
}

const std::string* tokenizer::id_to_token(int32_t id) const {
  if (id < 0 || id >= vocab_size() || id_kind_[id] == 0) return nullptr;
  return &id_token_[id];
}

const std::string* tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= vocab_size() || id_kind_[id] == 0) return nullptr;
  return &id_bytes_[id];
}

bool tokenizer::is_special(int32_t id) const { return id >= 0 && id < vocab_size() && id_kind_[id] == 3; }
bool tokenizer::is_added(int32_t id) const { return id >= 0 && id < vocab_size() && id_kind_[id] >= 2; }

// ============================================================================================
// Encode
// ============================================================================================

status tokenizer::split_pieces(std::string_view text, std::vector<std::string_view>& out) const {
  std::vector<std::string_view> cur{text}, next;
  if (text.empty()) cur.clear();
  match_data_holder md(4);
  for (const auto& rx : splits_) {
    next.clear();
    for (std::string_view piece : cur) {
      const auto* subj = reinterpret_cast<PCRE2_SPTR>(piece.data());
      size_t pos = 0, gap = 0;
      while (pos < piece.size()) {
        int rc = pcre2_match(rx->code, subj, piece.size(), pos, PCRE2_NO_UTF_CHECK, md.md, nullptr);
        if (rc < 0 && rc != PCRE2_ERROR_NOMATCH)  // JIT stack exhausted: the interpreter has no such limit
          rc = pcre2_match(rx->code, subj, piece.size(), pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md.md,
                           nullptr);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
          PCRE2_UCHAR msg[256];
          pcre2_get_error_message(rc, msg, sizeof msg);
          return make_error(errc::internal, "tokenizer: pre-tokenizer regex failed at byte " +
                                                std::to_string(pos) + " of a " +
                                                std::to_string(piece.size()) +
                                                "-byte piece: " + reinterpret_cast<const char*>(msg));
        }
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.md);
        const size_t ms = ov[0], me = ov[1];
        if (me == ms) {  // an empty match splits nothing; step one character
          pos = ms + utf8_char_len(static_cast<unsigned char>(piece[ms]));
          continue;
        }
        if (gap < ms) next.push_back(piece.substr(gap, ms - gap));
        next.push_back(piece.substr(ms, me - ms));
        pos = gap = me;
      }
      if (gap < piece.size()) next.push_back(piece.substr(gap));
    }
    cur.swap(next);
  }
  out.insert(out.end(), cur.begin(), cur.end());
  return {};
}

void tokenizer::bpe_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.size() == 1) {
    out.push_back(byte_id_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  if (ignore_merges_) {
    auto it = by_bytes_.find(std::string(piece));
    if (it != by_bytes_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  // Symbols as a doubly linked list over the piece's bytes; dead symbols have id -1.
  struct sym {
    int32_t id;
    int32_t prev, next;
  };
  const int32_t n = static_cast<int32_t>(piece.size());
  std::vector<sym> s(n);
  for (int32_t i = 0; i < n; ++i)
    s[i] = {byte_id_[static_cast<unsigned char>(piece[i])], i - 1, i + 1 < n ? i + 1 : -1};
  // Candidate merges ordered by (rank, left position): the lowest rank, leftmost first.
  struct cand {
    int32_t rank, left, right, left_id, right_id, merged;
    bool operator>(const cand& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<cand, std::vector<cand>, std::greater<cand>> pq;
  auto push = [&](int32_t l) {
    if (l < 0) return;
    const int32_t r = s[l].next;
    if (r < 0) return;
    const uint64_t key = (uint64_t(uint32_t(s[l].id)) << 32) | uint32_t(s[r].id);
    auto it = merges_.find(key);
    if (it != merges_.end()) pq.push({it->second.rank, l, r, s[l].id, s[r].id, it->second.merged});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!pq.empty()) {
    const cand c = pq.top();
    pq.pop();
    // Stale if either side changed since the candidate was queued.
    if (s[c.left].id != c.left_id || s[c.left].next != c.right || s[c.right].id != c.right_id) continue;
    s[c.left].id = c.merged;
    s[c.left].next = s[c.right].next;
    if (s[c.right].next >= 0) s[s[c.right].next].prev = c.left;
    s[c.right].id = -1;
    push(s[c.left].prev);
    push(c.left);
  }
  for (int32_t i = 0; i >= 0; i = s[i].next) out.push_back(s[i].id);
}

status tokenizer::encode_plain(std::string_view text, std::vector<int32_t>& out,
                               std::unordered_map<std::string, std::vector<int32_t>>& cache) const {
  std::vector<std::string_view> pieces;
  CEDAR_TRY(split_pieces(text, pieces));
  for (std::string_view p : pieces) {
    if (p.size() <= 1) {
      bpe_piece(p, out);
      continue;
    }
    std::string key(p);
    auto it = cache.find(key);
    if (it == cache.end()) {
      std::vector<int32_t> ids;
      bpe_piece(p, ids);
      it = cache.emplace(std::move(key), std::move(ids)).first;
    }
    out.insert(out.end(), it->second.begin(), it->second.end());
  }
  return {};
}

result<std::vector<int32_t>> tokenizer::encode(std::string_view text, bool allow_special) const {
  if (!utf8_valid(text))
    return make_error(errc::invalid_argument, "tokenizer: input text is not valid UTF-8");
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  std::unordered_map<std::string, std::vector<int32_t>> cache;
  size_t seg = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    if (!added_first_byte_[static_cast<unsigned char>(text[i])]) continue;
    for (const auto& a : added_) {  // longest first
      if (!allow_special && a.special) continue;
      if (text.compare(i, a.content.size(), a.content) == 0) {
        CEDAR_TRY(encode_plain(text.substr(seg, i - seg), out, cache));
        out.push_back(a.id);
        i += a.content.size() - 1;
        seg = i + 1;
        break;
      }
    }
  }
  CEDAR_TRY(encode_plain(text.substr(seg), out, cache));
  return out;
}

result<std::vector<std::string>> tokenizer::pretokenize(std::string_view text) const {
  if (!utf8_valid(text))
    return make_error(errc::invalid_argument, "tokenizer: input text is not valid UTF-8");
  std::vector<std::string_view> pieces;
  CEDAR_TRY(split_pieces(text, pieces));
  return std::vector<std::string>(pieces.begin(), pieces.end());
}

// ============================================================================================
// Decode
// ============================================================================================

result<std::string> tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string out;
  for (int32_t id : ids) {
    const std::string* b = token_bytes(id);
    if (!b)
      return make_error(errc::invalid_argument,
                        "tokenizer: id " + std::to_string(id) + " is not in the vocabulary");
    if (skip_special && is_special(id)) continue;
    out += *b;
  }
  return out;
}

result<std::string> tokenizer::decode_text(std::span<const int32_t> ids, bool skip_special) const {
  auto raw = decode(ids, skip_special);
  if (!raw) return raw.take_err();
  std::string out;
  utf8_sanitize(*raw, true, out);
  return out;
}

result<std::string> stream_decoder::push(int32_t id) {
  const std::string* b = tok_->token_bytes(id);
  if (!b)
    return make_error(errc::invalid_argument,
                      "tokenizer: id " + std::to_string(id) + " is not in the vocabulary");
  if (skip_special_ && tok_->is_special(id)) return std::string();
  pending_ += *b;
  std::string out;
  const size_t used = utf8_sanitize(pending_, false, out);
  pending_.erase(0, used);
  return out;
}

std::string stream_decoder::finish() {
  std::string out;
  utf8_sanitize(pending_, true, out);
  pending_.clear();
  return out;
}

}  // namespace cedar::model
