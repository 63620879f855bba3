#include "runtime/cli.hpp"

#include <CLI/CLI.hpp>
#include <cstdio>

#include "kernels/device.hpp"

namespace cedar::runtime {

int cli_main(int argc, char** argv) {
  CLI::App app{"cedar — a C++ agent runtime with the DeepSeek-V4.1 model inside it"};
  app.require_subcommand(1);
  auto* version = app.add_subcommand("version", "print the version and the compute device");
  CLI11_PARSE(app, argc, argv);
  if (*version) {
    std::printf("cedar 0.1.0\n");
    kernels::announce_device();
  }
  return 0;
}

}  // namespace cedar::runtime
