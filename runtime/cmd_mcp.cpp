// `cedar mcp …` — see cmd_mcp.hpp. Each command loads the config, connects what it needs,
// prints on stdout (errors on stderr) and closes every server before returning.
#include "runtime/cmd_mcp.hpp"

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "tools_mcp/json.hpp"
#include "tools_mcp/mcp_client.hpp"
#include "tools_mcp/mcp_config.hpp"
#include "tools_mcp/tool_registry.hpp"

namespace cedar::runtime {
namespace {

using tools::json;
namespace mcp = tools::mcp;

struct mcp_args {
  std::string config, server, tool, arguments;
  double timeout_s = 60;
  bool timeout_given = false;  // else the server's "timeout" from the config
  bool json_out = false;
};

int fail(const error& e) {
  std::fprintf(stderr, "cedar mcp: %s: %s\n", errc_name(e.code), e.message.c_str());
  return (e.code == errc::invalid_argument || e.code == errc::invalid_format || e.code == errc::not_found) ? 2 : 1;
}

std::string first_line(const std::string& s) {
  auto nl = s.find('\n');
  return nl == std::string::npos ? s : s.substr(0, nl) + " …";
}

std::shared_ptr<mcp::client> connect(const mcp::server_config& cfg, error* err) {
  auto c = std::make_shared<mcp::client>(cfg.name, mcp::make_transport(cfg));
  auto st = c->connect();
  if (!st.ok()) {
    *err = st.err();
    std::string tail = c->stderr_tail();
    if (!tail.empty() && err->message.find(tail.substr(0, 40)) == std::string::npos)
      err->message += "; server stderr: " + first_line(tail);
    return nullptr;
  }
  return c;
}

int run_list(const mcp_args& a) {
  auto cfgs = mcp::load_mcp_config(a.config);
  if (!cfgs.ok()) return fail(cfgs.err());
  int code = 0;
  json out = {{"servers", json::array()}};
  for (const auto& cfg : *cfgs) {
    error err;
    auto c = connect(cfg, &err);
    if (!c) {
      code = fail(err) == 2 ? std::max(code, 2) : std::max(code, 1);
      if (a.json_out) out["servers"].push_back({{"name", cfg.name}, {"error", err.message}});
      continue;
    }
    tools::tool_registry reg;
    if (auto st = reg.add_mcp_server(c); !st.ok()) {
      code = std::max(code, fail(st.err()));
      c->close();
      continue;
    }
    const auto& info = c->server();
    if (a.json_out) {
      json s = {{"name", cfg.name},
                {"protocol_version", info.protocol_version},
                {"server_info", {{"name", info.name}, {"version", info.version}}},
                {"tools", json::array()}};
      for (const auto& t : reg.list()) {
        json tj = {{"name", t->name}, {"description", t->description}, {"input_schema", t->input_schema}};
        if (t->output_schema) tj["output_schema"] = *t->output_schema;
        s["tools"].push_back(std::move(tj));
      }
      out["servers"].push_back(std::move(s));
    } else {
      auto list = reg.list();
      std::printf("%s: %s %s (protocol %s, %s), %zu tools\n", cfg.name.c_str(), info.name.c_str(),
                  info.version.c_str(), info.protocol_version.c_str(), c->wire().describe().c_str(), list.size());
      for (const auto& t : list) {
        std::string d = first_line(t->description);
        if (d.size() > 100) d = d.substr(0, 97) + "...";
        std::printf("  %-40s %s\n", t->name.c_str(), d.c_str());
      }
    }
    reg.close_servers();
  }
  if (a.json_out) std::printf("%s\n", cedar::tools::json_dump(out, 2).c_str());
  return code;
}

int run_call(const mcp_args& a) {
  auto cfgs = mcp::load_mcp_config(a.config);
  if (!cfgs.ok()) return fail(cfgs.err());
  auto args = tools::json_parse(a.arguments, "tool arguments (JSON)");
  if (!args.ok()) return fail(args.err());
  if (!args->is_object()) return fail(make_error(errc::invalid_argument, "tool arguments must be a JSON object"));
  if (!(a.timeout_s > 0)) return fail(make_error(errc::invalid_argument, "--timeout must be a positive number of seconds"));
  const mcp::server_config* cfg = nullptr;
  std::string names;
  for (const auto& c : *cfgs) {
    if (c.name == a.server) cfg = &c;
    names += (names.empty() ? "" : ", ") + c.name;
  }
  if (!cfg)
    return fail(make_error(errc::not_found, "no server '" + a.server + "' in " + a.config + " (servers: " + names + ")"));
  error err;
  auto c = connect(*cfg, &err);
  if (!c) return fail(err);
  tools::tool_registry reg;
  if (auto st = reg.add_mcp_server(c); !st.ok()) return fail(st.err());
  std::string name = tools::mcp_tool_name(a.server, a.tool);
  if (!reg.find(name)) {
    reg.close_servers();
    return fail(make_error(errc::not_found, "server '" + a.server + "' has no tool '" + a.tool + "'"));
  }
  tools::invoke_context ctx;
  ctx.timeout = a.timeout_given ? std::chrono::milliseconds(static_cast<int64_t>(a.timeout_s * 1000)) : cfg->timeout;
  ctx.hard_cap = ctx.timeout * 10;
  ctx.on_progress = [](const tools::progress_update& u) {
    if (u.total) std::fprintf(stderr, "progress %g/%g %s\n", u.progress, *u.total, u.message.c_str());
    else std::fprintf(stderr, "progress %g %s\n", u.progress, u.message.c_str());
  };
  auto r = reg.call(name, *args, ctx);
  reg.close_servers();
  if (!r.ok()) return fail(r.err());
  if (a.json_out) {
    json out = {{"isError", r->is_error}, {"content", json::array()}};
    for (const auto& b : r->content) out["content"].push_back(b.raw.is_null() ? json{{"type", "text"}, {"text", b.text}} : b.raw);
    if (r->structured) out["structuredContent"] = *r->structured;
    std::printf("%s\n", cedar::tools::json_dump(out, 2).c_str());
  } else {
    std::string text = r->to_text();
    std::fprintf(r->is_error ? stderr : stdout, "%s%s\n", r->is_error ? "tool error: " : "", text.c_str());
    if (r->structured && !r->is_error)
      std::printf("structuredContent: %s\n", tools::json_dump(*r->structured).c_str());
  }
  return r->is_error ? 1 : 0;
}

}  // namespace

void add_mcp_commands(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<mcp_args>();
  auto* mcp_cmd = app.add_subcommand("mcp", "list and call the tools of MCP servers (mcpServers config)");
  mcp_cmd->require_subcommand(1);

  auto* list = mcp_cmd->add_subcommand("list-tools", "connect to every configured server and list its tools");
  list->add_option("CONFIG", a->config, "JSON file with an \"mcpServers\" object")->required();
  list->add_flag("--json", a->json_out, "print JSON");
  list->callback([a, exit_code] { *exit_code = run_list(*a); });

  auto* call = mcp_cmd->add_subcommand("call", "call one tool of one server");
  call->add_option("CONFIG", a->config, "JSON file with an \"mcpServers\" object")->required();
  call->add_option("SERVER", a->server, "server name in the config")->required();
  call->add_option("TOOL", a->tool, "tool name as the server lists it")->required();
  call->add_option("JSON", a->arguments, "arguments as a JSON object")->required();
  call->add_option("--timeout", a->timeout_s,
                   "inactivity timeout in seconds (progress extends it); default: the server's \"timeout\" in CONFIG, else 60");
  call->add_flag("--json", a->json_out, "print the result as JSON");
  call->callback([a, call, exit_code] {
    a->timeout_given = call->count("--timeout") > 0;
    *exit_code = run_call(*a);
  });
}

}  // namespace cedar::runtime
