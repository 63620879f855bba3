// The internals behind the public API (cedar.hpp): what a runtime and an agent handle hold.
// For runtime/*.cpp only (the HTTP server, the OpenAI API and the dashboard reach the actors
// through these); it pulls in CAF.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "runtime/actors.hpp"
#include "runtime/cedar.hpp"
#include "runtime/observer.hpp"

namespace cedar {

struct agent_runtime::impl {
  std::shared_ptr<const model::engine> engine;
  std::shared_ptr<const model::tokenizer> tok;
  std::shared_ptr<tools::tool_registry> reg = std::make_shared<tools::tool_registry>();
  uint64_t model_hash = 0;
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  runtime::executor_actor exec;
  runtime::store_actor store;
  std::mutex mu;
  std::vector<caf::actor> agents;
  runtime_options opts;
  // Events of every agent, for the dashboard (runtime/observer.hpp).
  std::shared_ptr<runtime::observer> obs = std::make_shared<runtime::observer>();

  ~impl() {
    for (auto& a : agents) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(exec, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(store, caf::exit_reason::user_shutdown);
    agents.clear();
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
};

}  // namespace cedar
