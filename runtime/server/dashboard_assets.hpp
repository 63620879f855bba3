// The dashboard's static files, embedded into the binary at build time: runtime/CMakeLists.txt
// runs runtime/server/web/embed_assets.cmake over runtime/server/web/{index.html,app.js,
// style.css} and the vendored uPlot dist files (runtime/server/web/node_modules, installed by
// scripts/setup-npm.sh) and compiles the generated dashboard_assets.cpp.
#pragma once

#include <cstddef>
#include <string_view>

namespace cedar::runtime {

struct embedded_file {
  const char* name;  // "app.js", "uplot.js", ...
  const unsigned char* data;
  size_t size;
};

// The embedded file called `name`, or nullptr.
const embedded_file* find_dashboard_file(std::string_view name);

}  // namespace cedar::runtime
