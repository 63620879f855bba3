// The tool interface the runtime sees: one shape for C++ tools and MCP servers' tools.
//
// A `tool` is a name, a description, a JSON Schema for its arguments and an invoke function.
// Invoking returns `result<tool_result>`: an error means the call could not be made or did not
// finish (timeout, cancelled, server gone, bad arguments); a tool_result with is_error = true is
// a tool failure to show to the model (e.g. "path outside allowed directories"), not a fault.
//
// Lifetime: invoke functions may capture shared state (an MCP client); the registry owns tools.
// Thread safety: invoke may be called from several threads; a cancel_token is shared and
// thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kernels/base/result.hpp"
#include "tools_mcp/json.hpp"

namespace cedar::tools {

// Shared flag: copies observe the same cancellation. Default-constructed tokens can be
// cancelled too (each owns fresh state).
class cancel_token {
 public:
  cancel_token() : flag_(std::make_shared<std::atomic<bool>>(false)) {}
  void cancel() const { flag_->store(true); }
  bool cancelled() const { return flag_->load(); }

 private:
  std::shared_ptr<std::atomic<bool>> flag_;
};

// One progress report of a running call (MCP notifications/progress).
struct progress_update {
  double progress = 0;
  std::optional<double> total;
  std::string message;
};

struct invoke_context {
  cancel_token cancel;
  // Inactivity timeout: the call fails when nothing (result or progress) arrives for this long.
  std::chrono::milliseconds timeout{60000};
  // Hard cap from the start of the call; progress never extends a call beyond it.
  std::chrono::milliseconds hard_cap{600000};
  // Called on the transport's thread; must not block or call back into the tool.
  std::function<void(const progress_update&)> on_progress;
  // The calling agent's session id ("" outside an agent): lets a tool keep per-session state.
  std::string session;
};

// MCP content kinds; C++ tools use text (and image for rendered output).
enum class content_kind { text, image, audio, resource_link, resource };

const char* content_kind_name(content_kind k);

struct content_block {
  content_kind kind = content_kind::text;
  std::string text;       // text; resource: the embedded text (if a text resource)
  std::string data;       // image/audio: base64 bytes; resource: base64 blob (if a blob resource)
  std::string mime_type;  // image/audio/resource/resource_link
  std::string uri;        // resource_link/resource
  std::string name;       // resource_link
  json raw;               // the block as received (annotations, _meta, title, ...)
};

struct tool_result {
  std::vector<content_block> content;
  std::optional<json> structured;  // MCP structuredContent, validated against outputSchema
  bool is_error = false;

  // The text shown to a model: text blocks verbatim, other blocks as one-line summaries
  // ("[image image/png, 1234 bytes base64]"), structured content as JSON when no text exists.
  std::string to_text() const;
};

struct tool {
  std::string name;         // [A-Za-z0-9_.-]{1,128}; MCP tools appear as "<server>__<tool>"
  std::string title;        // display name (may be empty)
  std::string description;
  json input_schema = json{{"type", "object"}};
  std::optional<json> output_schema;
  json annotations;  // MCP hints (readOnlyHint, ...): untrusted, for display only
  std::function<result<tool_result>(const json& arguments, const invoke_context& ctx)> invoke;
};

// ok when `name` matches [A-Za-z0-9_.-]{1,128}.
status tool_name_check(const std::string& name);

// Convenience for C++ tools: a single text block.
tool_result text_result(std::string text, bool is_error = false);

}  // namespace cedar::tools
