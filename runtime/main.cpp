// The `cedar` command line. Sub-commands are registered from runtime/cli.cpp.
#include "runtime/cli.hpp"

int main(int argc, char** argv) { return cedar::runtime::cli_main(argc, argv); }
