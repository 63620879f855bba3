// The internals behind the public API (cedar.hpp): what a runtime and an agent handle hold.
// For runtime/*.cpp only (the HTTP server, the OpenAI API and the dashboard reach the actors
// through these); it pulls in CAF.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "runtime/actors.hpp"
#include "runtime/cedar.hpp"
#include "runtime/observer.hpp"

namespace cedar {

namespace runtime {
struct exit_latch;  // runtime/remote.cpp
// The first step of a published runtime's shutdown (runtime/remote.cpp): stops the gateway, the
// executor and the store, waits until each of them has notified all its watchers (CAF's BASP
// broker among them), then closes the port. Only then may the actor system go down.
void stop_published(agent_runtime::impl& rt);
}  // namespace runtime

struct agent_runtime::impl {
  std::shared_ptr<const model::engine> engine;  // null in a remote runtime opened from model_dir
  std::shared_ptr<const model::model_config> config;  // the engine's, or config.json's (remote)
  std::shared_ptr<const model::tokenizer> tok;
  std::shared_ptr<tools::tool_registry> reg = std::make_shared<tools::tool_registry>();
  uint64_t model_hash = 0;
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  runtime::executor_actor exec;
  runtime::store_actor store;
  std::mutex mu;
  std::vector<caf::actor> agents;
  // The latest agent spawned for each session (create_agent / resume_agent), under `mu`: the
  // dashboard cancels any running agent through it, not only those it started.
  std::map<int64_t, caf::actor> agent_of;
  runtime_options opts;
  // Events of every agent, for the dashboard (runtime/observer.hpp).
  std::shared_ptr<runtime::observer> obs = std::make_shared<runtime::observer>();
  // Remote runtimes (runtime/remote.cpp).
  bool remote = false;              // exec and store are proxies of another process's actors
  runtime::gateway_actor gateway;   // set once published
  uint16_t published_port = 0;
  std::shared_ptr<runtime::exit_latch> published_exits;  // of gateway, exec, store (publish())

  ~impl() {
    if (gateway) runtime::stop_published(*this);
    for (auto& a : agents) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    if (!remote) {  // a client never stops the actors it borrows
      caf::anon_send_exit(exec, caf::exit_reason::user_shutdown);
      caf::anon_send_exit(store, caf::exit_reason::user_shutdown);
    }
    agents.clear();
    agent_of.clear();
    exec = nullptr;
    store = nullptr;
    sys.reset();  // waits for every actor (tool workers included) to finish
    reg->close_servers();
  }
};

struct agent::impl {
  caf::actor actor;
  caf::actor_system* sys = nullptr;
  int64_t session = 0;
  caf::actor remote_exec;  // set when the executor is remote: ask() watches it
};

}  // namespace cedar
