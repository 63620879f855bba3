// openai_api — the OpenAI-compatible HTTP API on cedar's server (a route_mount):
//   GET  /v1/models, /v1/models/{id}
//   POST /v1/chat/completions   (JSON or SSE stream), on completion_service (completion.hpp)
//
// Request fields: model (must be the served model's id, else 404), messages (system, developer,
// user, assistant with tool_calls, tool; content a string, null, or a list of text parts),
// tools (function tools; their JSON schema keys are put in the order the model was trained on),
// tool_choice, stream, stream_options.include_usage, max_tokens / max_completion_tokens
// (default 512), min_tokens (vLLM's extension: EOS is masked until the reply holds this many
// tokens; default 0), temperature (default 1, as OpenAI; 0 = greedy), top_p, seed, stop (a
// string or up to 4). n must be 1; response_format must be text; logprobs are not offered. Other fields
// are ignored.
// tool_choice: "auto" (default) the model decides; "none" the tools are not shown to the model
//   and no calls are returned; "required" the reply is forced to open a DSML tool-call block
//   (the model picks the function and arguments); {"type":"function","function":{"name":N}}
//   the reply is forced to open a call of N (the model writes the arguments). Forcing is a
//   prefix of the reply, not constrained decoding: a malformed call can still come back as
//   an answer without tool_calls.
// Responses follow the official client: a chat.completion object, or chat.completion.chunk
// events (first delta carries the role; a tool call comes as one delta with index, id, type and
// name, then one with its arguments; a final chunk with finish_reason; with include_usage a
// last chunk with empty choices and usage; then `data: [DONE]`). usage has
// prompt_tokens_details.cached_tokens: prompt tokens whose KV came from a stored session.
// Errors: {"error":{"message","type","param","code"}}: 400 bad JSON or fields (param names the
// field), 401 (the server), 404 unknown model or route, 405 wrong method, 500 runtime failure.
#pragma once

#include "runtime/server/http_server.hpp"

namespace cedar::runtime {

// Mounts the API routes (they share one completion_service, owned by the routes).
route_mount openai_api_mount();

}  // namespace cedar::runtime
