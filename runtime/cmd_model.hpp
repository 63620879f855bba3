// `cedar model info CONFIG [--json]` and `cedar demo`.
#pragma once

#include <CLI/CLI.hpp>

namespace cedar::runtime {
void add_model_commands(CLI::App& app, int* exit_code);
}
