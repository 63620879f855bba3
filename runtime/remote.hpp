// Remote runtimes (ARCHITECTURE "Scale-out"), the internal half; the public half is
// agent_runtime::publish and runtime_options::remote_port in cedar.hpp. Implementation in
// remote.cpp; for runtime/*.cpp only (it pulls in CAF through runtime_impl.hpp).
#pragma once

#include <cstdint>
#include <memory>

#include "runtime/runtime_impl.hpp"

namespace cedar::runtime {

// The CAF settings of every runtime's actor system that concern the io middleman (loaded by
// every runtime, so that any local runtime can publish()).
void configure_middleman(caf::actor_system_config& cfg);

// A runtime whose executor and store are those another process published on
// o.remote_host:o.remote_port. It loads the tokenizer and the model config (or takes the given
// engine's), registers the tools, and asks the gateway for the two actors; `model_hash` (of
// o.model_dir or o.engine, computed by the caller) must match the server's.
result<std::unique_ptr<agent_runtime::impl>> open_remote(const runtime_options& o, uint64_t model_hash);

// stop_published(impl&), the first step of agent_runtime::impl::~impl, is declared in
// runtime_impl.hpp.

}  // namespace cedar::runtime
