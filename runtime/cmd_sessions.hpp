// `cedar sessions …` — inspect and manage the session store from the command line:
//   cedar sessions list [--json]
//   cedar sessions show ID [--json]
//   cedar sessions export ID            (the transcript as JSON)
//   cedar sessions fork ID --at-turn N [--agent NAME]
//   cedar sessions rm ID
//   cedar sessions compact [--json]      (drops the page file's dead bytes)
// list and show also print the page file's space (live / dead bytes). Every one takes
// --store PATH (default $XDG_DATA_HOME/cedar/sessions.db, else ~/.local/share/cedar/sessions.db).
// The commands never create a store file.
//
// add_sessions_commands registers the `sessions` sub-command on `app`; its callbacks run while
// CLI11 parses and write the process exit code to *exit_code (0 ok, 1 failure, 2 bad input).
// No CAF here: the commands open the store directly (no actor system is running).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "kernels/base/result.hpp"

namespace cedar::runtime {

void add_sessions_commands(CLI::App& app, int* exit_code);

// The default store path described above (empty when neither XDG_DATA_HOME nor HOME is set).
std::string default_sessions_store_path();

// The store a command that writes sessions opens: `given`, or the default path when it is
// empty; its parent directory is created. Error (naming --store) when there is neither.
result<std::string> writable_store_path(const std::string& given);

}  // namespace cedar::runtime
