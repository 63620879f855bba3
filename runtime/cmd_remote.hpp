// `cedar serve-remote`: publishes a runtime's executor and store on 127.0.0.1 for agents in
// other processes (runtime/remote.cpp, agent_runtime::publish).
#pragma once

#include <CLI/CLI.hpp>

namespace cedar::runtime {

void add_serve_remote_command(CLI::App& app, int* exit_code);

}  // namespace cedar::runtime
