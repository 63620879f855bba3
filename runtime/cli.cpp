// The `cedar` command line: one CLI11 app, sub-commands registered by the runtime/cmd_*.cpp
// files. Exit codes: 0 ok, 1 runtime failure, 2 bad usage or bad input.
#include "runtime/cli.hpp"

#include <CLI/CLI.hpp>
#include <cstdio>

#include "kernels/base/log.hpp"
#include "kernels/device.hpp"
#include "runtime/cmd_agent.hpp"
#include "runtime/cmd_eval.hpp"
#include "runtime/cmd_generate.hpp"
#include "runtime/cmd_mcp.hpp"
#include "runtime/cmd_model.hpp"
#include "runtime/cmd_remote.hpp"
#include "runtime/cmd_serve.hpp"
#include "runtime/cmd_sessions.hpp"

namespace cedar::runtime {

int cli_main(int argc, char** argv) {
  CLI::App app{"cedar — a C++ agent runtime with the DeepSeek-V4.1 model inside it"};
  app.require_subcommand(1);
  bool verbose = false, quiet = false;
  app.add_flag("-v,--verbose", verbose, "log debug messages");
  app.add_flag("-q,--quiet", quiet, "log only errors");
  int exit_code = 0;

  auto* version = app.add_subcommand("version", "print the version and the compute device");
  version->callback([] {
    std::printf("cedar 0.1.0\n");
    kernels::announce_device();
  });
  add_model_commands(app, &exit_code);
  add_mcp_commands(app, &exit_code);
  add_sessions_commands(app, &exit_code);

  add_agent_commands(app, &exit_code);
  add_generate_command(app, &exit_code);
  add_serve_command(app, &exit_code);
  add_serve_remote_command(app, &exit_code);
  add_eval_command(app, &exit_code);

  app.parse_complete_callback([&] {
    if (verbose) log_set_level(log_level::debug);
    if (quiet) log_set_level(log_level::error);
  });
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return exit_code;
}

}  // namespace cedar::runtime
