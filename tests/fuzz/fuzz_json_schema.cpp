// Fuzz target: tools::schema_check / schema_validate with JSON parsed by tools::json_parse.
// Schemas come from MCP servers (inputSchema, outputSchema) and values from models and
// servers: both untrusted. The MCP client validates structuredContent against a server's
// outputSchema, so the validator must not crash on any schema, checked or not.
//
// Input: "<schema JSON>\0<value JSON>" (no NUL: the text is both schema and value). Checked:
// no crash/UB/leak/stack overflow; errors carry a message; validating a value against the
// `true` schema always succeeds and against `false` never does.
#include <cstring>
#include <string_view>

#include "tests/fuzz/fuzz_util.hpp"
#include "tools_mcp/json.hpp"
#include "tools_mcp/json_schema.hpp"

using namespace cedar::tools;
using cedar::fuzz::fuzz_require;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view all(reinterpret_cast<const char*>(data), size);
  const size_t nul = all.find('\0');
  const std::string_view schema_text = all.substr(0, nul);
  const std::string_view value_text = nul == std::string_view::npos ? all : all.substr(nul + 1);

  auto schema = json_parse(schema_text, "schema");
  auto value = json_parse(value_text, "value");
  if (!schema.ok()) fuzz_require(!schema.err().message.empty(), "json: an error without a message");
  if (!schema.ok() || !value.ok()) return 0;

  auto checked = schema_check(*schema);
  if (!checked.ok()) fuzz_require(!checked.err().message.empty(), "schema: an error without a message");
  auto valid = schema_validate(*schema, *value);
  if (!valid.ok()) fuzz_require(!valid.err().message.empty(), "schema: an error without a message");
  (void)json_dump(*value);
  (void)json_type_name(*value);

  fuzz_require(schema_validate(json(true), *value).ok(), "schema: `true` rejected a value");
  fuzz_require(!schema_validate(json(false), *value).ok(), "schema: `false` accepted a value");
  return 0;
}
