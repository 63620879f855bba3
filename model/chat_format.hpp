// model::chat_format — messages + tool schemas + mode -> the DeepSeek-V4.1 prompt (text or ids).
//
// Owns: the V4.1 encoding as SGLang's `encoding_dsv41.py` gives it (adapted from the release's
// encoding/), byte-identical to cedar_ref/chat.py (golden-tested):
//   BOS
//   <｜System｜>[Reasoning Effort: N (...)\n\n]SYSTEM[\n\n## Tools ... JSON lines ...]   (index 0)
//   <｜User｜>TEXT  |  <｜User｜><tool_result>R1</tool_result>\n\n<tool_result>R2</tool_result>
//   <｜Assistant｜></think>  (chat)   or   <｜Assistant｜><think>  (thinking, latest turn)
//   [reasoning</think>]content[\n\n<｜DSML｜ calls>...</｜DSML｜ calls>]<｜end▁of▁sentence｜>
// Tool messages merge into the next user turn, sorted into the order of the calls they answer.
// In thinking mode, reasoning of turns before the last user turn is dropped (and those turns
// get no </think>), unless some message carries tools. JSON (tool schemas, non-string
// arguments) is written as Python's json.dumps(ensure_ascii=False): ", " and ": " separators,
// key order kept, floats in repr form.
// Does not own: tokenization (tokenizer.hpp) or parsing model output (dsml.hpp).
// Not supported (an error, never a silent change): images, task tokens, response_format,
// context continuation, user content given as a list of blocks.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/base/result.hpp"
#include "model/tokenizer.hpp"

namespace cedar::model {

enum class chat_role { system, developer, user, assistant, tool, latest_reminder };
const char* chat_role_name(chat_role r);

struct chat_tool_call {
  std::string id;  // matches a tool message's tool_call_id (orders the results)
  std::string name;
  std::string arguments_json;  // a JSON object
};

struct chat_message {
  chat_role role = chat_role::user;
  std::string content;
  std::string reasoning;                   // assistant: reasoning_content
  std::vector<chat_tool_call> tool_calls;  // assistant
  std::string tool_call_id;                // tool
  std::vector<std::string> tools_json;     // system/developer: OpenAI tool objects {"type","function"}
  bool wo_eos = false;                     // assistant: leave the turn open (no end of sentence)
};

enum class chat_mode { chat, thinking };

struct chat_options {
  chat_mode mode = chat_mode::chat;
  int reasoning_effort = 50;  // 1..100; only rendered in thinking mode (default "high" = 50)
  bool drop_thinking = true;
  bool add_bos = true;
};

// "low" / "high" / "xhigh" / "max" -> 25 / 50 / 75 / 100, or a number 1..100.
result<int> reasoning_effort_from(std::string_view name_or_number);

// The prompt text (what the model reads; special-token strings inline).
result<std::string> render_chat(std::span<const chat_message> messages, const chat_options& opts);
// The prompt as ids: render_chat, then tok.encode(text, allow_special=true).
result<std::vector<int32_t>> render_chat_ids(const tokenizer& tok, std::span<const chat_message> messages,
                                             const chat_options& opts);
// The DSML block of some calls, without the leading "\n\n".
result<std::string> render_tool_calls(std::span<const chat_tool_call> calls);
// Request-level tools go on the first system message (an empty one is prepended if needed).
void attach_tools(std::vector<chat_message>& messages, std::span<const std::string> tools_json);

// OpenAI-style message list (JSON array) -> messages. Assistant tool_calls may carry
// `function.arguments` as a JSON string or an object; tools' content may be a string or a
// list of {"type":"text"} blocks.
result<std::vector<chat_message>> messages_from_json(std::string_view json);
// Parses any JSON text and writes it back as Python's json.dumps(ensure_ascii=False).
result<std::string> json_python_dump(std::string_view json);

}  // namespace cedar::model
