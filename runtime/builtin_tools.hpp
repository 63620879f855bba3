// The built-in tools every cedar runtime offers and the default model was trained on
// (model/reference/cedar_ref/data.py TOOL_SCHEMAS: same names, schemas, result texts):
//   calculator(expression)   exact + - * / ( ) over integers and decimals
//   notes_save(key, text) / notes_read(key)   a key-value notebook per session (in memory)
//   clock()                  the local date and time, "YYYY-MM-DD HH:MM (Weekday)"
//   file_read(path) / file_list(path)         inside a root directory; no escape (.., links)
#pragma once

#include <string>
#include <vector>

#include "kernels/base/result.hpp"
#include "tools_mcp/tool.hpp"

namespace cedar::runtime {

std::vector<tools::tool> builtin_tools(const std::string& files_root);

// The calculator's evaluation, exposed for tests: the exact value formatted as the data
// generator does (integers exactly, else rounded to 4 decimals with trailing zeros dropped).
result<std::string> calculate(const std::string& expression);

}  // namespace cedar::runtime
