// `cedar generate`: run the executor directly on a prompt (no agent, no store).
#pragma once

#include <CLI/CLI.hpp>

namespace cedar::runtime {
void add_generate_command(CLI::App& app, int* exit_code);
}
