// MCP client lifecycle and tool calls (see mcp_client.hpp for the state diagram).
#include "tools_mcp/mcp_client.hpp"

#include <algorithm>

#include "kernels/base/log.hpp"
#include "tools_mcp/json_schema.hpp"

namespace cedar::tools::mcp {

client::client(std::string server_name, std::unique_ptr<transport> t, client_options options)
    : conn_(std::move(t)), name_(std::move(server_name)), opt_(std::move(options)) {
  conn_.set_notification_handler([this](const std::string& method, const json& params) {
    if (method == "notifications/tools/list_changed") {
      stale_.store(true);
    } else if (method == "notifications/message") {
      CEDAR_LOG_DEBUG("mcp %s: %s", name_.c_str(), excerpt(json_dump(params), 300).c_str());
    }
  });
}

client::~client() { close(); }

void client::close() { conn_.close(); }

status client::connect() {
  CEDAR_TRY(conn_.open());
  auto st = initialize_();
  if (!st.ok()) conn_.close();
  return st;
}

status client::initialize_() {
  if (opt_.protocol_versions.empty())
    return make_error(errc::invalid_argument, "client_options.protocol_versions is empty");
  json params = {{"protocolVersion", opt_.protocol_versions.front()},
                 {"capabilities", json::object()},
                 {"clientInfo", {{"name", opt_.client_name}, {"version", opt_.client_version}}}};
  request_options ro;
  ro.timeout = opt_.request_timeout;
  ro.hard_cap = opt_.request_timeout;
  auto r = conn_.request("initialize", std::move(params), ro);
  if (!r.ok()) {
    error e = r.take_err();
    e.message = "MCP server '" + name_ + "': initialize failed: " + e.message;
    return e;
  }
  const json& res = *r;
  std::string version = json_string_or(res, "protocolVersion");
  if (std::find(opt_.protocol_versions.begin(), opt_.protocol_versions.end(), version) ==
      opt_.protocol_versions.end()) {
    std::string ours;
    for (const auto& v : opt_.protocol_versions) ours += (ours.empty() ? "" : ", ") + v;
    return make_error(errc::mismatch, "MCP server '" + name_ + "' answered protocol version '" + version +
                                          "'; cedar speaks " + ours + "; disconnected");
  }
  server_info info;
  info.protocol_version = version;
  if (const json* si = json_member(res, "serverInfo")) {
    info.name = json_string_or(*si, "name");
    info.title = json_string_or(*si, "title");
    info.version = json_string_or(*si, "version");
  }
  info.instructions = json_string_or(res, "instructions");
  if (const json* caps = json_member(res, "capabilities"); caps && caps->is_object()) info.capabilities = *caps;
  info_ = std::move(info);
  conn_.wire().set_protocol_version(version);
  CEDAR_TRY(conn_.notify("notifications/initialized", nullptr));
  conn_.wire().initialized();
  return {};
}

status client::reinitialize_() {
  std::lock_guard lock(reinit_mu_);
  n_reinit_.fetch_add(1);
  CEDAR_LOG_INFO("mcp %s: session expired, re-initialising", name_.c_str());
  conn_.wire().reset_session();
  return initialize_();
}

result<json> client::request(const std::string& method, json params, const request_options& opt) {
  auto r = conn_.request(method, params, opt);
  if (r.ok() || !conn_.wire().take_session_expired()) return r;
  // The session is gone (HTTP 404/400): re-initialise once and retry once.
  CEDAR_TRY(reinitialize_());
  auto again = conn_.request(method, std::move(params), opt);
  if (!again.ok() && conn_.wire().take_session_expired()) {
    error e = again.take_err();
    e.message += " (the session expired again right after re-initialising)";
    return e;
  }
  return again;
}

namespace {

result<tool_spec> parse_tool(const json& t, size_t index) {
  if (!t.is_object()) return make_error(errc::invalid_format, "tools[" + std::to_string(index) + "] is not an object");
  tool_spec s;
  s.name = json_string_or(t, "name");
  if (s.name.empty()) return make_error(errc::invalid_format, "tools[" + std::to_string(index) + "] has no name");
  s.title = json_string_or(t, "title");
  if (s.title.empty())
    if (const json* a = json_member(t, "annotations")) s.title = json_string_or(*a, "title");
  s.description = json_string_or(t, "description");
  const json* in = json_member(t, "inputSchema");
  if (!in || !in->is_object())
    return make_error(errc::invalid_format, "tool '" + s.name + "' has no inputSchema object");
  s.input_schema = *in;
  if (const json* out = json_member(t, "outputSchema"); out && out->is_object()) s.output_schema = *out;
  if (const json* a = json_member(t, "annotations"); a && a->is_object()) s.annotations = *a;
  return s;
}

}  // namespace

result<std::vector<tool_spec>> client::list_tools() {
  std::vector<tool_spec> all;
  std::string cursor;
  // Clear first: a list_changed arriving while we page means the next tools() lists again.
  stale_.store(false);
  for (int page = 0;; ++page) {
    if (page > 1000) return make_error(errc::invalid_format, "MCP server '" + name_ + "': tools/list pagination did not end after 1000 pages");
    json params = json::object();
    if (!cursor.empty()) params["cursor"] = cursor;
    request_options ro;
    ro.timeout = opt_.request_timeout;
    ro.hard_cap = opt_.request_timeout;
    auto r = request("tools/list", std::move(params), ro);
    if (!r.ok()) {
      stale_.store(true);
      error e = r.take_err();
      e.message = "MCP server '" + name_ + "': " + e.message;
      return e;
    }
    const json* tools = json_member(*r, "tools");
    if (!tools || !tools->is_array()) {
      stale_.store(true);
      return make_error(errc::invalid_format, "MCP server '" + name_ + "': tools/list result has no 'tools' array");
    }
    for (size_t i = 0; i < tools->size(); ++i) {
      auto t = parse_tool((*tools)[i], i);
      if (!t.ok()) {
        CEDAR_LOG_WARN("mcp %s: skipping a tool: %s", name_.c_str(), t.err().message.c_str());
        continue;
      }
      all.push_back(std::move(*t));
    }
    std::string next = json_string_or(*r, "nextCursor");
    if (next.empty()) break;
    if (next == cursor) return make_error(errc::invalid_format, "MCP server '" + name_ + "': tools/list repeated cursor '" + next + "'");
    cursor = next;
  }
  std::lock_guard lock(tools_mu_);
  tools_ = all;
  return all;
}

result<std::vector<tool_spec>> client::tools() {
  if (stale_.load()) return list_tools();
  std::lock_guard lock(tools_mu_);
  return tools_;
}

result<tool_result> parse_call_result(const json& r, const std::optional<json>& output_schema,
                                      const std::string& tool_name) {
  if (!r.is_object()) return make_error(errc::invalid_format, "tools/call '" + tool_name + "': result is not an object");
  tool_result out;
  if (const json* e = json_member(r, "isError"); e && e->is_boolean()) out.is_error = e->get<bool>();
  const json* content = json_member(r, "content");
  if (content && !content->is_array())
    return make_error(errc::invalid_format, "tools/call '" + tool_name + "': 'content' is not an array");
  if (content) {
    for (size_t i = 0; i < content->size(); ++i) {
      const json& c = (*content)[i];
      std::string where = "tools/call '" + tool_name + "': content[" + std::to_string(i) + "]";
      if (!c.is_object()) return make_error(errc::invalid_format, where + " is not an object");
      std::string type = json_string_or(c, "type");
      content_block b;
      b.raw = c;
      if (type == "text") {
        b.kind = content_kind::text;
        b.text = json_string_or(c, "text");
      } else if (type == "image" || type == "audio") {
        b.kind = type == "image" ? content_kind::image : content_kind::audio;
        b.data = json_string_or(c, "data");
        b.mime_type = json_string_or(c, "mimeType");
        if (b.data.empty()) return make_error(errc::invalid_format, where + " (" + type + ") has no 'data'");
      } else if (type == "resource_link") {
        b.kind = content_kind::resource_link;
        b.uri = json_string_or(c, "uri");
        b.name = json_string_or(c, "name");
        b.mime_type = json_string_or(c, "mimeType");
        if (b.uri.empty()) return make_error(errc::invalid_format, where + " (resource_link) has no 'uri'");
      } else if (type == "resource") {
        b.kind = content_kind::resource;
        const json* res = json_member(c, "resource");
        if (!res || !res->is_object()) return make_error(errc::invalid_format, where + " (resource) has no 'resource' object");
        b.uri = json_string_or(*res, "uri");
        b.mime_type = json_string_or(*res, "mimeType");
        b.text = json_string_or(*res, "text");
        b.data = json_string_or(*res, "blob");
      } else {
        // Unknown kinds (a newer revision) are kept as a described text block.
        b.kind = content_kind::text;
        b.text = "[unsupported content type '" + type + "']";
      }
      out.content.push_back(std::move(b));
    }
  }
  if (const json* sc = json_member(r, "structuredContent"); sc && !sc->is_null()) out.structured = *sc;
  if (output_schema && !out.is_error) {
    if (!out.structured)
      return make_error(errc::invalid_format, "tool '" + tool_name + "' declares an outputSchema but returned no structuredContent");
    if (auto st = schema_validate(*output_schema, *out.structured); !st.ok())
      return make_error(errc::invalid_format, "tool '" + tool_name + "': structuredContent does not match its outputSchema: " +
                                                  st.err().message);
  }
  return out;
}

result<tool_result> client::call_tool(const std::string& tool_name, const json& arguments, const invoke_context& ctx) {
  std::optional<json> output_schema;
  {
    std::lock_guard lock(tools_mu_);
    for (const auto& t : tools_)
      if (t.name == tool_name) output_schema = t.output_schema;
  }
  request_options ro;
  ro.timeout = ctx.timeout;
  ro.hard_cap = ctx.hard_cap;
  ro.cancel = ctx.cancel;
  // Always ask for progress: it is what lets a long call outlive its inactivity timeout.
  ro.on_progress = ctx.on_progress ? ctx.on_progress : [](const progress_update&) {};
  json params = {{"name", tool_name}, {"arguments", arguments.is_null() ? json::object() : arguments}};
  auto r = request("tools/call", std::move(params), ro);
  if (!r.ok()) {
    error e = r.take_err();
    e.message = "MCP server '" + name_ + "': " + e.message;
    return e;
  }
  return parse_call_result(*r, output_schema, tool_name);
}

}  // namespace cedar::tools::mcp
