// The `cedar` CLI: parses argv with CLI11 and dispatches to sub-commands. Returns the process
// exit code (0 ok, 1 runtime failure, 2 bad usage or bad input).
#pragma once

namespace cedar::runtime {
int cli_main(int argc, char** argv);
}
