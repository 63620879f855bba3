// `cedar run`, `cedar chat` and `cedar demo`: agents from the command line.
#pragma once

#include <CLI/CLI.hpp>

namespace cedar::runtime {
void add_agent_commands(CLI::App& app, int* exit_code);
}
