// `cedar serve-remote [--port P] [--model DIR] [--store PATH] [--ram-budget-mb N]`
//
// Opens a runtime on the model and the session store, publishes its executor and store on
// 127.0.0.1:P with CAF's io middleman (agent_runtime::publish; P = 0 picks a free port), prints
// the bound address and serves until SIGINT or SIGTERM, then closes the port and the runtime
// (every committed turn is in the store). Agents run in the client processes: a runtime opened
// with runtime_options::remote_port = P and the same model directory.
// Loopback only: there is no flag to bind another address.
#include "runtime/cmd_remote.hpp"

#include <cstdio>

#include "runtime/cedar.hpp"
#include "runtime/cmd_sessions.hpp"
#include "runtime/shutdown_signals.hpp"

namespace cedar::runtime {
namespace {

struct serve_remote_args {
  std::string model_dir = std::string(CEDAR_SOURCE_DIR) + "/model/weights/cedar-agent-tiny";
  std::string store;
  int port = 0;
  size_t ram_budget_mb = 2048;
};

int cmd_serve_remote(const serve_remote_args& a) {
  if (a.port < 0 || a.port > 65535) {
    std::fprintf(stderr, "cedar serve-remote: --port %d is not a TCP port (0-65535)\n", a.port);
    return 2;
  }
  auto store = writable_store_path(a.store);
  if (!store) {
    std::fprintf(stderr, "cedar serve-remote: %s\n", store.err().message.c_str());
    return 2;
  }
  shutdown_signals sigs;  // handlers write to a pipe: any thread may take the signal, wait() reacts here

  runtime_options ro;
  ro.model_dir = a.model_dir;
  ro.store_path = *store;
  ro.ram_budget_mb = a.ram_budget_mb;
  auto rt = agent_runtime::open(ro);
  if (!rt) {
    std::fprintf(stderr, "cedar serve-remote: %s\n", rt.err().message.c_str());
    return 2;
  }
  auto port = (*rt)->publish(uint16_t(a.port));
  if (!port) {
    std::fprintf(stderr, "cedar serve-remote: %s\n", port.err().message.c_str());
    return 1;
  }
  std::printf("cedar serve-remote: executor and store published on 127.0.0.1:%u (model %s, store %s)\n",
              unsigned(*port), a.model_dir.c_str(), store->c_str());
  std::fflush(stdout);

  std::fprintf(stderr, "cedar serve-remote: %s, shutting down\n", shutdown_signals::name(sigs.wait()));
  rt->reset();  // closes the port, then stops the actors
  return 0;
}

}  // namespace

void add_serve_remote_command(CLI::App& app, int* exit_code) {
  static serve_remote_args args;
  auto* c = app.add_subcommand("serve-remote",
                               "publish the executor and store on 127.0.0.1 for agents in other processes "
                               "(C++ API: runtime_options::remote_port)");
  c->add_option("--port", args.port, "TCP port on 127.0.0.1 (0: any free port)")->capture_default_str();
  c->add_option("--model", args.model_dir, "model directory (clients must open the same one)")->capture_default_str();
  c->add_option("--store", args.store, "session store (SQLite); default: the user's data directory");
  c->add_option("--ram-budget-mb", args.ram_budget_mb, "resident sequences beyond it are evicted to the store")
      ->capture_default_str();
  c->callback([exit_code] { *exit_code = cmd_serve_remote(args); });
}

}  // namespace cedar::runtime
