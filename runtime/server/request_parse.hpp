// request_parse — the pure request-parsing functions of `cedar serve`: bytes and header values
// in, a parsed request or an HTTP error out. No sockets, no runtime, no actors, never throws,
// so they can be fuzzed alone (tests/fuzz/fuzz_serve_request.cpp builds this file with nothing
// of the runtime but its headers). http_server.cpp (authentication) and openai_api.cpp (the
// chat completions body) call them; the field rules are documented in openai_api.hpp.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/completion.hpp"
#include "tools_mcp/tool.hpp"

namespace cedar::runtime {

// The body of POST /v1/chat/completions, checked.
struct chat_request {
  completion_request req;          // req.tools_json is left empty: the handler renders `tools`
  std::vector<tools::tool> tools;  // the function tools shown to the model (none with tool_choice "none")
  bool stream = false, include_usage = false;
};

// An answer the handler sends instead: an OpenAI-style error (`param` names the field).
struct request_error {
  int status = 400;  // 400 bad JSON or fields, 404 unknown model
  std::string message, param, code;
};

// Parses and checks a chat completions body for the served model `model_id`.
std::optional<request_error> parse_chat_request(std::string_view body, const std::string& model_id, chat_request& out);

// Constant-time comparison (the token must not leak through timing).
bool equal_ct(std::string_view a, std::string_view b);
// The value of cookie `name` in one Cookie header ("a=1; b=2"), empty when absent.
std::string cookie_value(std::string_view header, std::string_view name);
// Whether a request carries `token`: `Authorization: Bearer <token>`, or the cookie `cookie_name`
// in one of its Cookie headers.
bool request_authorized(std::string_view authorization, const std::vector<std::string>& cookie_headers,
                        std::string_view cookie_name, std::string_view token);

}  // namespace cedar::runtime
