// Parsing of the `mcpServers` configuration shape (see mcp_config.hpp).
#include "tools_mcp/mcp_config.hpp"

#include <fstream>
#include <sstream>

#include "tools_mcp/mcp_http.hpp"
#include "tools_mcp/mcp_stdio.hpp"

namespace cedar::tools::mcp {

status server_name_check(const std::string& name) {
  if (name.empty() || name.size() > 64)
    return make_error(errc::invalid_argument, "MCP server name '" + name + "' must be 1-64 characters long");
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
    if (!ok) return make_error(errc::invalid_argument, "MCP server name '" + name + "' has a character outside [A-Za-z0-9_-]");
  }
  if (name.find("__") != std::string::npos)
    return make_error(errc::invalid_argument, "MCP server name '" + name + "' must not contain \"__\" (the tool-name separator)");
  return {};
}

namespace {

result<std::map<std::string, std::string>> string_map(const json& v, const std::string& where) {
  if (!v.is_object()) return make_error(errc::invalid_format, where + " must be an object of strings");
  std::map<std::string, std::string> out;
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (!it->is_string()) return make_error(errc::invalid_format, where + "." + it.key() + " must be a string");
    out[it.key()] = it->get<std::string>();
  }
  return out;
}

}  // namespace

result<std::vector<server_config>> parse_mcp_config(std::string_view text, std::string_view source) {
  std::string src(source);
  auto parsed = json_parse(text, src);
  if (!parsed.ok()) return parsed.take_err();
  const json* servers = json_member(*parsed, "mcpServers");
  if (!servers) return make_error(errc::invalid_format, src + ": no 'mcpServers' object at the top level");
  if (!servers->is_object()) return make_error(errc::invalid_format, src + ": 'mcpServers' must be an object of servers by name");
  std::vector<server_config> out;
  for (auto it = servers->begin(); it != servers->end(); ++it) {
    std::string where = src + ": mcpServers." + it.key();
    server_config c;
    c.name = it.key();
    if (auto st = server_name_check(c.name); !st.ok()) return make_error(errc::invalid_format, src + ": " + st.err().message);
    const json& s = *it;
    if (!s.is_object()) return make_error(errc::invalid_format, where + " must be an object");
    const json* command = json_member(s, "command");
    const json* url = json_member(s, "url");
    std::string type = json_string_or(s, "type");
    if (type == "sse")
      return make_error(errc::invalid_format, where + ": the legacy SSE transport (\"type\": \"sse\") is not supported; "
                                                      "use a Streamable HTTP endpoint (\"type\": \"http\")");
    if (!type.empty() && type != "stdio" && type != "http" && type != "streamable-http" && type != "streamableHttp")
      return make_error(errc::invalid_format, where + ".type: '" + type + "' is not one of stdio, http, streamable-http");
    if (command && url) return make_error(errc::invalid_format, where + " has both 'command' and 'url'; pick one");
    if (!command && !url) return make_error(errc::invalid_format, where + " needs 'command' (stdio) or 'url' (Streamable HTTP)");
    if (command) {
      if (!type.empty() && type != "stdio") return make_error(errc::invalid_format, where + ": 'command' given but type is '" + type + "'");
      if (!command->is_string() || command->get<std::string>().empty())
        return make_error(errc::invalid_format, where + ".command must be a non-empty string");
      c.type = server_config::kind::stdio;
      c.command = command->get<std::string>();
      if (const json* args = json_member(s, "args")) {
        if (!args->is_array()) return make_error(errc::invalid_format, where + ".args must be an array of strings");
        for (size_t i = 0; i < args->size(); ++i) {
          if (!(*args)[i].is_string())
            return make_error(errc::invalid_format, where + ".args[" + std::to_string(i) + "] must be a string");
          c.args.push_back((*args)[i].get<std::string>());
        }
      }
      if (const json* env = json_member(s, "env")) {
        auto m = string_map(*env, where + ".env");
        if (!m.ok()) return m.take_err();
        c.env = std::move(*m);
      }
    } else {
      if (type == "stdio") return make_error(errc::invalid_format, where + ": 'url' given but type is 'stdio'");
      if (!url->is_string()) return make_error(errc::invalid_format, where + ".url must be a string");
      c.type = server_config::kind::http;
      c.url = url->get<std::string>();
      if (c.url.rfind("http://", 0) != 0 && c.url.rfind("https://", 0) != 0)
        return make_error(errc::invalid_format, where + ".url '" + c.url + "' must start with http:// or https://");
      if (const json* h = json_member(s, "headers")) {
        auto m = string_map(*h, where + ".headers");
        if (!m.ok()) return m.take_err();
        c.headers = std::move(*m);
      }
    }
    if (const json* t = json_member(s, "timeout")) {
      if (!t->is_number() || t->get<double>() <= 0)
        return make_error(errc::invalid_format, where + ".timeout must be a positive number of seconds");
      c.timeout = std::chrono::milliseconds(static_cast<int64_t>(t->get<double>() * 1000));
    }
    out.push_back(std::move(c));
  }
  return out;
}

result<std::vector<server_config>> load_mcp_config(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return make_error(errc::io, "cannot open MCP config '" + path + "'");
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_mcp_config(ss.str(), path);
}

std::unique_ptr<transport> make_transport(const server_config& cfg) {
  if (cfg.type == server_config::kind::stdio) {
    stdio_options o;
    o.command = cfg.command;
    o.args = cfg.args;
    o.env = cfg.env;
    return std::make_unique<stdio_transport>(std::move(o));
  }
  http_options o;
  o.url = cfg.url;
  o.headers = cfg.headers;
  return std::make_unique<http_transport>(std::move(o));
}

}  // namespace cedar::tools::mcp
