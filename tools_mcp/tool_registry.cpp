// Tool registry (see tool_registry.hpp).
#include "tools_mcp/tool_registry.hpp"

#include "kernels/base/log.hpp"
#include "tools_mcp/json_schema.hpp"
#include "tools_mcp/mcp_config.hpp"

namespace cedar::tools {

std::string mcp_tool_name(const std::string& server, const std::string& tool) { return server + "__" + tool; }

status tool_registry::add(tool t) {
  CEDAR_TRY(tool_name_check(t.name));
  if (!t.invoke) return make_error(errc::invalid_argument, "tool '" + t.name + "' has no invoke function");
  if (auto st = schema_check(t.input_schema); !st.ok())
    return make_error(errc::invalid_argument, "tool '" + t.name + "': input schema: " + st.err().message);
  std::lock_guard lock(mu_);
  if (tools_.count(t.name)) return make_error(errc::invalid_argument, "tool '" + t.name + "' is already registered");
  owner_[t.name] = "";
  std::string name = t.name;
  tools_[name] = std::make_shared<const tool>(std::move(t));
  return {};
}

status tool_registry::sync_server_(const std::shared_ptr<mcp::client>& c) {
  auto specs = c->tools();
  if (!specs.ok()) return specs.take_err();
  std::map<std::string, std::shared_ptr<const tool>> fresh;
  for (const auto& s : *specs) {
    tool t;
    t.name = mcp_tool_name(c->name(), s.name);
    if (auto st = tool_name_check(t.name); !st.ok()) {
      CEDAR_LOG_WARN("mcp %s: skipping tool: %s", c->name().c_str(), st.err().message.c_str());
      continue;
    }
    if (auto st = schema_check(s.input_schema); !st.ok()) {
      CEDAR_LOG_WARN("mcp %s: skipping tool '%s': input schema: %s", c->name().c_str(), s.name.c_str(),
                     st.err().message.c_str());
      continue;
    }
    t.title = s.title;
    t.description = s.description;
    t.input_schema = s.input_schema;
    t.output_schema = s.output_schema;
    t.annotations = s.annotations;
    std::weak_ptr<mcp::client> weak = c;
    std::string remote = s.name;
    t.invoke = [weak, remote](const json& args, const invoke_context& ctx) -> result<tool_result> {
      auto cl = weak.lock();
      if (!cl) return make_error(errc::unavailable, "MCP server of tool '" + remote + "' was removed");
      return cl->call_tool(remote, args, ctx);
    };
    std::string key = t.name;  // read before the move below
    fresh[key] = std::make_shared<const tool>(std::move(t));
  }
  std::lock_guard lock(mu_);
  for (const auto& [name, t] : fresh)
    if (auto it = owner_.find(name); it != owner_.end() && it->second != c->name())
      return make_error(errc::invalid_argument, "tool '" + name + "' of MCP server '" + c->name() + "' clashes with an existing tool");
  for (auto it = owner_.begin(); it != owner_.end();) {
    if (it->second == c->name()) {
      tools_.erase(it->first);
      it = owner_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto& [name, t] : fresh) {
    owner_[name] = c->name();
    tools_[name] = std::move(t);
  }
  return {};
}

status tool_registry::add_mcp_server(std::shared_ptr<mcp::client> c) {
  if (!c) return make_error(errc::invalid_argument, "add_mcp_server: null client");
  CEDAR_TRY(mcp::server_name_check(c->name()));
  {
    std::lock_guard lock(mu_);
    if (servers_.count(c->name())) return make_error(errc::invalid_argument, "MCP server '" + c->name() + "' is already registered");
    servers_[c->name()] = c;
  }
  auto st = sync_server_(c);
  if (!st.ok()) {
    std::lock_guard lock(mu_);
    servers_.erase(c->name());
  }
  return st;
}

status tool_registry::refresh() {
  std::vector<std::shared_ptr<mcp::client>> stale;
  {
    std::lock_guard lock(mu_);
    for (const auto& [name, c] : servers_)
      if (c->tools_stale()) stale.push_back(c);
  }
  for (const auto& c : stale) CEDAR_TRY(sync_server_(c));
  return {};
}

std::shared_ptr<const tool> tool_registry::find(const std::string& name) const {
  std::lock_guard lock(mu_);
  auto it = tools_.find(name);
  return it == tools_.end() ? nullptr : it->second;
}

std::vector<std::shared_ptr<const tool>> tool_registry::list() const {
  std::lock_guard lock(mu_);
  std::vector<std::shared_ptr<const tool>> out;
  for (const auto& [name, t] : tools_) out.push_back(t);
  return out;
}

std::shared_ptr<mcp::client> tool_registry::server(const std::string& name) const {
  std::lock_guard lock(mu_);
  auto it = servers_.find(name);
  return it == servers_.end() ? nullptr : it->second;
}

result<tool_result> tool_registry::call(const std::string& name, const json& arguments, const invoke_context& ctx) {
  if (auto st = refresh(); !st.ok()) CEDAR_LOG_WARN("tools: refresh failed: %s", st.err().message.c_str());
  auto t = find(name);
  if (!t) return make_error(errc::not_found, "no tool named '" + name + "'");
  json args = arguments.is_null() ? json::object() : arguments;
  if (auto st = schema_validate(t->input_schema, args); !st.ok())
    return text_result("invalid arguments for tool '" + name + "': " + st.err().message, true);
  return t->invoke(args, ctx);
}

void tool_registry::close_servers() {
  std::map<std::string, std::shared_ptr<mcp::client>> servers;
  {
    std::lock_guard lock(mu_);
    servers = servers_;
  }
  for (auto& [name, c] : servers) c->close();
}

}  // namespace cedar::tools
