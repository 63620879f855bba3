// model::dsml — the streaming parser of DeepSeek-V4.1 assistant output: reasoning, content and
// DSML tool calls. The reference is cedar_ref/chat.py (DsmlParser); both give the same events
// for any chunking of the same bytes (golden- and chunking-tested).
//
// The output grammar (V4.1, leading-space tag names):
//   [reasoning </think>] content [\n\n<｜DSML｜ calls>
//     <｜DSML｜ invoke name="NAME">
//     <｜DSML｜ parameter name="K" string="true|false">VALUE</｜DSML｜ parameter>   (0..n)
//     </｜DSML｜ invoke>                                                           (1..n)
//   </｜DSML｜ calls>] [<｜end▁of▁sentence｜>]
// string="true" values are raw text; string="false" values are JSON. A call's arguments are
// rebuilt as `{"K": V, ...}` (", " and ": " separators, strings JSON-quoted as Python's
// json.dumps(ensure_ascii=False) does; JSON values verbatim), exactly as SGLang does.
//
// State diagram (transitions named after the text that is read):
// clang-format off
//
//   reasoning --</think>--> content --[\n\n]<｜DSML｜ calls>--> block --<｜DSML｜ invoke--> tag(invoke)
//   reasoning --EOS (error)--> done       content <--</｜DSML｜ calls>-- block
//   content --EOS--> done                 block <--</｜DSML｜ invoke>-- call <--ok: call_begin-- tag(invoke)
//   call --<｜DSML｜ parameter--> tag(parameter) --ok--> value --</｜DSML｜ parameter>--> call
//   block | call --EOS (error)--> done;  block | call | tag | value --error--> skip
//   skip --<｜DSML｜ invoke--> tag(invoke);  skip --</｜DSML｜ calls>--> content;  skip --EOS--> done
//
// clang-format on
// Invariants:
//   1. Memory is bounded: held-back text <= the longest marker, a tag <= max_tag_bytes, a value
//      <= max_value_bytes, one call's arguments <= max_call_bytes (more is an error).
//   2. Text events hold only complete UTF-8 (an incomplete tail waits; invalid bytes -> U+FFFD).
//   3. The concatenation of events is independent of how the input was chunked; error messages
//      name stream byte offsets, never chunk-dependent snippets.
//   4. A call with any error emits call_begin (if its tag was good) and an error, never call_end.
// Lenient where SGLang asserts: whitespace between tags is skipped, a block without the "\n\n"
// is a block, text after </｜DSML｜ calls> is more content. Errors never throw or abort.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cedar::model {

// The DSML tags (shared with model/tool_grammar.cpp, which constrains what the parser reads).
namespace dsml_marker {
inline constexpr std::string_view dsml = "<｜DSML｜";
inline constexpr std::string_view calls_open = "<｜DSML｜ calls>";
inline constexpr std::string_view calls_close = "</｜DSML｜ calls>";
inline constexpr std::string_view invoke_open = "<｜DSML｜ invoke";
inline constexpr std::string_view invoke_close = "</｜DSML｜ invoke>";
inline constexpr std::string_view param_open = "<｜DSML｜ parameter";
inline constexpr std::string_view param_close = "</｜DSML｜ parameter>";
}  // namespace dsml_marker

enum class dsml_event_kind {
  reasoning,   // text: reasoning (thinking mode, before </think>)
  content,     // text: visible answer text
  call_begin,  // name: a tool call started (its invoke tag was well formed)
  parameter,   // name, value (JSON text), is_string: one argument complete
  call_end,    // name, value = arguments as a JSON object text
  error,       // text: what was wrong, with the stream byte offset where useful
};
const char* dsml_event_kind_name(dsml_event_kind k);

struct dsml_event {
  dsml_event_kind kind = dsml_event_kind::content;
  std::string text;   // reasoning/content text or error message
  std::string name;   // call or parameter name
  std::string value;  // parameter value as JSON, or call arguments (JSON object)
  bool is_string = false;
  int call_index = -1;
};

struct dsml_limits {
  size_t max_tag_bytes = 1024;        // attributes of one tag
  size_t max_value_bytes = 1u << 20;  // one parameter value
  size_t max_call_bytes = 4u << 20;   // one call's names + JSON values
};

class dsml_parser {
 public:
  explicit dsml_parser(bool thinking = false, dsml_limits limits = {});
  // Appends the events produced by `chunk` (any size, any split point) to `out`.
  void feed(std::string_view chunk, std::vector<dsml_event>& out);
  // End of output: flushes held-back text and reports an unterminated state as an error.
  void finish(std::vector<dsml_event>& out);
  // Bytes held inside the parser (unconsumed input, a value being read, partial characters);
  // bounded by invariant 1.
  size_t buffered_bytes() const {
    return buf_.size() + value_.size() + pending_[0].size() + pending_[1].size() + params_bytes_;
  }

 private:
  enum class state { reasoning, content, block, call, tag, value, skip, done };
  bool step(std::vector<dsml_event>& out);
  bool step_tag(std::vector<dsml_event>& out);
  bool step_value(std::vector<dsml_event>& out);
  void emit_text(dsml_event_kind kind, std::string_view bytes, bool final, std::vector<dsml_event>& out);
  void fail(std::string message, std::vector<dsml_event>& out);
  void consume(size_t n);

  state state_;
  dsml_limits limits_;
  std::string buf_;         // unconsumed input
  uint64_t pos_ = 0;        // stream byte offset of buf_[0]
  std::string pending_[2];  // incomplete UTF-8 tails of reasoning [0] and content [1]
  int n_calls_ = 0;
  bool tag_is_invoke_ = true;
  std::string call_name_;
  std::vector<std::pair<std::string, std::string>> params_;  // name -> JSON value
  size_t params_bytes_ = 0;                                  // sum of names and values
  std::string param_name_;
  bool param_is_string_ = false;
  std::string value_;
  bool done_warned_ = false;
};

struct dsml_call {
  std::string name;
  std::string arguments_json;
};

struct dsml_result {
  std::string reasoning;
  std::string content;
  std::vector<dsml_call> calls;
  std::vector<std::string> errors;  // empty when the output was well formed
};

// One-shot parse of a whole output; `thinking` when generation began after <think>.
dsml_result dsml_parse(std::string_view text, bool thinking = false);
// Folds events into a result (what dsml_parse returns for the same input).
void dsml_collect(const std::vector<dsml_event>& events, dsml_result& into);

// Python's json.dumps(s, ensure_ascii=False) for a string (invalid UTF-8 -> U+FFFD).
std::string json_quote(std::string_view s);

}  // namespace cedar::model
