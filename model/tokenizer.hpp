// model::tokenizer — byte-level BPE of the DeepSeek-V3 family, loaded from an HF tokenizer.json.
//
// Owns: parsing tokenizer.json (model.type BPE, vocab, merges, added_tokens, a pre_tokenizer
// that is a Sequence of Split(Isolated) regexes plus ByteLevel(use_regex=false)), encoding and
// decoding, and the special-token ids. Does not own: the chat format (chat_format.hpp) or
// tool-call parsing (dsml.hpp).
//
// Encoding, in order (the same as HF tokenizers and cedar_ref/bpe.py):
//   1. added tokens are cut out of the text, leftmost first and the longest at a position
//      (special=true ones only when allow_special; special=false ones such as `<think>` and
//      `｜DSML｜` always, as HF does);
//   2. each remaining segment is split by every Split regex in turn (PCRE2, UTF|UCP), keeping
//      both the matches and the gaps between them (behavior "Isolated");
//   3. each piece's UTF-8 bytes are byte-level symbols; adjacent symbols are merged lowest
//      merge rank first, the leftmost on ties (priority queue over a linked list), with a
//      per-call cache of pieces already seen.
// Decoding maps ids back to bytes (byte-level chars -> bytes; added tokens -> their content).
// A token cut in the middle of a UTF-8 character yields a partial sequence: decode() returns
// raw bytes, decode_text() replaces invalid sequences by U+FFFD (maximal-subpart rule, as
// Python's errors="replace"), and stream_decoder holds back an incomplete tail.
//
// Invariants: 1. decode(encode(t)) == t for valid UTF-8 t. 2. Every vocab token, merge part
// and merge result exists in model.vocab (checked at load). 3. A tokenizer is immutable after
// load and safe to share between threads (encode keeps its cache on the stack).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kernels/base/result.hpp"

namespace cedar::model {

// The V4.1 marker strings (U+FF5C `｜`, U+2581 `▁`).
namespace tokens {
inline constexpr std::string_view bos = "<｜begin▁of▁sentence｜>";
inline constexpr std::string_view eos = "<｜end▁of▁sentence｜>";
inline constexpr std::string_view pad = "<｜▁pad▁｜>";
inline constexpr std::string_view system = "<｜System｜>";
inline constexpr std::string_view user = "<｜User｜>";
inline constexpr std::string_view assistant = "<｜Assistant｜>";
inline constexpr std::string_view think_start = "<think>";
inline constexpr std::string_view think_end = "</think>";
inline constexpr std::string_view latest_reminder = "<｜latest_reminder｜>";
inline constexpr std::string_view dsml = "｜DSML｜";
inline constexpr std::string_view image = "<｜deepseek_image｜>";
}  // namespace tokens

struct pcre2_regex;  // a compiled Split pattern (PCRE2, JIT when available)

class tokenizer {
 public:
  // Reads and validates a tokenizer.json; errors name the file and the field.
  static result<tokenizer> load(const std::string& path);
  // The same from text in memory; `origin` prefixes error messages.
  static result<tokenizer> from_json(std::string_view json, const std::string& origin = "tokenizer.json");

  // Text (valid UTF-8, else an error) -> ids. No BOS is added: the chat format does that.
  result<std::vector<int32_t>> encode(std::string_view text, bool allow_special = true) const;
  // The pre-tokenizer alone (step 2 above) on text without added tokens; for tests and tools.
  result<std::vector<std::string>> pretokenize(std::string_view text) const;

  // ids -> raw bytes (may end inside a UTF-8 character). An unknown id is an error.
  result<std::string> decode(std::span<const int32_t> ids, bool skip_special = false) const;
  // ids -> valid UTF-8, invalid or truncated sequences replaced by U+FFFD.
  result<std::string> decode_text(std::span<const int32_t> ids, bool skip_special = false) const;

  int32_t token_to_id(std::string_view token) const;  // -1 when absent (added tokens first)
  const std::string* id_to_token(int32_t id) const;   // the tokenizer.json string; null if none
  const std::string* token_bytes(int32_t id) const;   // the bytes the id decodes to; null if none
  bool is_special(int32_t id) const;                  // an added token with special=true
  bool is_added(int32_t id) const;                    // any added token
  int32_t vocab_size() const { return static_cast<int32_t>(id_bytes_.size()); }  // max id + 1
  size_t n_merges() const { return n_merges_; }

  int32_t bos_id() const { return bos_id_; }  // -1 when the vocabulary lacks the marker
  int32_t eos_id() const { return eos_id_; }
  int32_t pad_id() const { return pad_id_; }

 private:
  struct added_token {
    std::string content;
    int32_t id = -1;
    bool special = false;
  };
  struct merge_info {
    int32_t rank = 0;
    int32_t merged = -1;
  };

  status encode_plain(std::string_view text, std::vector<int32_t>& out,
                      std::unordered_map<std::string, std::vector<int32_t>>& cache) const;
  status split_pieces(std::string_view text, std::vector<std::string_view>& out) const;
  void bpe_piece(std::string_view piece, std::vector<int32_t>& out) const;

  std::unordered_map<std::string, int32_t> vocab_;     // tokenizer.json token string -> id
  std::unordered_map<std::string, int32_t> by_bytes_;  // decoded bytes -> id (model vocab only)
  std::vector<std::string> id_token_;                  // id -> token string ("" if unused)
  std::vector<std::string> id_bytes_;                  // id -> bytes
  std::vector<uint8_t> id_kind_;                       // 0 unused, 1 vocab, 2 added, 3 added special
  std::unordered_map<uint64_t, merge_info> merges_;    // (left id << 32 | right id) -> rank, result
  size_t n_merges_ = 0;
  int32_t byte_id_[256] = {};       // byte -> id of its single-byte token
  std::vector<added_token> added_;  // longest content first
  bool added_first_byte_[256] = {};
  std::vector<std::shared_ptr<pcre2_regex>> splits_;
  bool ignore_merges_ = false;
  int32_t bos_id_ = -1, eos_id_ = -1, pad_id_ = -1;
};

// Incremental ids -> text for streaming output: push() returns the text that is complete so
// far and holds back a trailing incomplete UTF-8 sequence (at most 3 bytes); invalid bytes
// become U+FFFD. The concatenation of every push() and finish() equals decode_text(all ids).
// Lifetime: borrows `tok`, which must outlive the decoder (the engine owns the tokenizer).
class stream_decoder {
 public:
  explicit stream_decoder(const tokenizer& tok, bool skip_special = false)
      : tok_(&tok), skip_special_(skip_special) {}
  result<std::string> push(int32_t id);
  std::string finish();  // flushes the held-back bytes (as U+FFFD if incomplete)

 private:
  const tokenizer* tok_;
  bool skip_special_;
  std::string pending_;
};

// UTF-8 helpers shared with chat_format and dsml.
bool utf8_valid(std::string_view s);
// Appends the valid part of `bytes` to `out`, invalid sequences as U+FFFD. When !final, stops
// before a trailing sequence that is incomplete but could still become valid; returns the
// number of bytes consumed.
size_t utf8_sanitize(std::string_view bytes, bool final, std::string& out);

}  // namespace cedar::model
