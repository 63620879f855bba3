// `cedar serve [--port P] [--host H] [--config FILE] [--model DIR] [--store PATH]
//              [--token-file F] [--cors] [--mcp-config FILE] [--files-root DIR]`
//
// Opens the runtime, starts the HTTP server with the OpenAI-compatible API mounted, prints the
// URL (with the token) and runs until SIGINT or SIGTERM, then stops the server and closes the
// runtime (every committed turn is in the store).
//
// --config FILE: a JSON object with any of the keys
//   {"host": "127.0.0.1", "port": 8377, "model": DIR, "store": PATH, "token_file": F,
//    "cors": false, "mcp_config": FILE, "files_root": DIR, "ram_budget_mb": 2048}
// Flags given on the command line win over the file.
#include "runtime/cmd_serve.hpp"

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "runtime/cedar.hpp"
#include "runtime/cmd_sessions.hpp"
#include "runtime/shutdown_signals.hpp"
#include "runtime/server/dashboard.hpp"
#include "runtime/server/http_server.hpp"
#include "runtime/server/openai_api.hpp"

namespace cedar::runtime {
namespace {

using njson = nlohmann::json;

struct serve_args {
  std::string config;
  std::string model_dir = std::string(CEDAR_SOURCE_DIR) + "/model/weights/cedar-agent-tiny";
  std::string store, host = "127.0.0.1", token_file, mcp_config, files_root = ".";
  int port = 8377;
  bool cors = false;
  size_t ram_budget_mb = 2048;
};

// Fills the fields not given on the command line from the config file.
status apply_config(serve_args& a, const CLI::App& cmd) {
  if (a.config.empty()) return {};
  std::ifstream f(a.config);
  if (!f) return make_error(errc::not_found, a.config + ": cannot open the config file");
  std::stringstream ss;
  ss << f.rdbuf();
  njson j = njson::parse(ss.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return make_error(errc::invalid_format, a.config + ": not a JSON object");
  static const char* keys[] = {"host", "port", "model", "store", "token_file", "cors", "mcp_config", "files_root",
                               "ram_budget_mb"};
  for (auto it = j.begin(); it != j.end(); ++it)
    if (std::find_if(std::begin(keys), std::end(keys), [&](const char* k) { return it.key() == k; }) == std::end(keys))
      return make_error(errc::invalid_format, a.config + ": unknown key '" + it.key() + "'");
  auto given = [&](const char* flag) { return cmd.get_option(flag)->count() > 0; };
  try {
    if (j.contains("host") && !given("--host")) a.host = j["host"].get<std::string>();
    if (j.contains("port") && !given("--port")) a.port = j["port"].get<int>();
    if (j.contains("model") && !given("--model")) a.model_dir = j["model"].get<std::string>();
    if (j.contains("store") && !given("--store")) a.store = j["store"].get<std::string>();
    if (j.contains("token_file") && !given("--token-file")) a.token_file = j["token_file"].get<std::string>();
    if (j.contains("cors") && !given("--cors")) a.cors = j["cors"].get<bool>();
    if (j.contains("mcp_config") && !given("--mcp-config")) a.mcp_config = j["mcp_config"].get<std::string>();
    if (j.contains("files_root") && !given("--files-root")) a.files_root = j["files_root"].get<std::string>();
    if (j.contains("ram_budget_mb")) a.ram_budget_mb = j["ram_budget_mb"].get<size_t>();
  } catch (const njson::exception& e) {
    return make_error(errc::invalid_format, a.config + ": " + e.what());
  }
  return {};
}

int cmd_serve(serve_args a, const CLI::App& cmd) {
  if (auto s = apply_config(a, cmd); !s) {
    std::fprintf(stderr, "cedar serve: %s\n", s.err().message.c_str());
    return 2;
  }
  auto store = writable_store_path(a.store);
  if (!store) {
    std::fprintf(stderr, "cedar serve: %s\n", store.err().message.c_str());
    return 2;
  }
  a.store = *store;
  shutdown_signals sigs;  // handlers write to a pipe: any thread may take the signal, wait() reacts here

  runtime_options ro;
  ro.model_dir = a.model_dir;
  ro.store_path = a.store;
  ro.mcp_config = a.mcp_config;
  ro.files_root = a.files_root;
  ro.ram_budget_mb = a.ram_budget_mb;
  auto rt = agent_runtime::open(ro);
  if (!rt) {
    std::fprintf(stderr, "cedar serve: %s\n", rt.err().message.c_str());
    return 2;
  }
  serve_options so;
  so.host = a.host;
  so.port = a.port;
  so.token_file = a.token_file;
  so.cors = a.cors;
  std::vector<route_mount> mounts = {openai_api_mount(), mount_dashboard};
  auto srv = http_server::start(**rt, so, mounts);
  if (!srv) {
    std::fprintf(stderr, "cedar serve: %s\n", srv.err().message.c_str());
    return 2;
  }
  auto& s = **srv;
  if (s.token_created()) std::fprintf(stderr, "cedar serve: new token written to %s (mode 0600)\n", s.token_file().c_str());
  std::printf("cedar serve: listening on %s (store %s)\n", s.url().c_str(), a.store.c_str());
  std::printf("  dashboard:  %s/?token=%s\n", s.url().c_str(), s.token().c_str());
  std::printf("  OpenAI API: %s/v1  (Authorization: Bearer <the token in %s>)\n", s.url().c_str(),
              s.token_file().c_str());
  std::fflush(stdout);

  std::fprintf(stderr, "cedar serve: %s, shutting down\n", shutdown_signals::name(sigs.wait()));
  s.stop();
  srv->reset();
  rt->reset();
  return 0;
}

}  // namespace

void add_serve_command(CLI::App& app, int* exit_code) {
  static serve_args args;
  auto* c = app.add_subcommand("serve", "serve the OpenAI-compatible API (and the dashboard) over HTTP");
  c->add_option("--port", args.port, "TCP port (0: any free port)")->capture_default_str();
  c->add_option("--host", args.host, "address to bind (keep 127.0.0.1 unless you mean it)")->capture_default_str();
  c->add_option("--config", args.config,
                "JSON config: {host, port, model, store, token_file, cors, mcp_config, files_root, ram_budget_mb}; "
                "flags win");
  c->add_option("--model", args.model_dir, "model directory")->capture_default_str();
  c->add_option("--store", args.store, "session store (SQLite); default: the user's data directory");
  c->add_option("--token-file", args.token_file, "bearer token file (0600); default: serve.token next to the store");
  c->add_flag("--cors", args.cors, "send CORS headers (browsers on other origins may call the API)");
  c->add_option("--mcp-config", args.mcp_config, "mcpServers JSON: their tools join the registry");
  c->add_option("--files-root", args.files_root, "directory file_read/file_list may read")->capture_default_str();
  c->callback([c, exit_code] { *exit_code = cmd_serve(args, *c); });
}

}  // namespace cedar::runtime
