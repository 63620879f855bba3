// `cedar serve`: the runtime, the HTTP server, the OpenAI-compatible API (and the dashboard).
#pragma once

#include <CLI/CLI.hpp>

namespace cedar::runtime {

void add_serve_command(CLI::App& app, int* exit_code);

}  // namespace cedar::runtime
