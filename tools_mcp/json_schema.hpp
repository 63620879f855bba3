// A compact JSON Schema validator for the subset tool schemas use in practice.
//
// Owns: checking a JSON value against a schema (MCP `inputSchema`/`outputSchema`, C++ tools'
// argument schemas). The tool registry validates arguments before a call; the MCP client checks
// `structuredContent` against `outputSchema`.
//
// Supported keywords: boolean schemas, type (string or array of names; "integer" accepts whole
// numbers), enum, const, properties, required, additionalProperties (bool or schema), items
// (one schema), minItems/maxItems, minimum/maximum, exclusiveMinimum/exclusiveMaximum (numeric
// form), multipleOf, minLength/maxLength (counted in Unicode code points), allOf/anyOf/oneOf/not.
// Everything else ($ref, format, pattern, $defs, dependent*, if/then/else, ...) is ignored, i.e.
// accepted: the validator may accept values a full validator rejects, never the reverse.
//
// The first violation is reported with a JSON-pointer-like path: "$.items[2].name: expected
// string, got integer".
#pragma once

#include <string>

#include "kernels/base/result.hpp"
#include "tools_mcp/json.hpp"

namespace cedar::tools {

// ok when `value` satisfies `schema`; otherwise an invalid_argument error naming the path.
status schema_validate(const json& schema, const json& value);

// Checks that `schema` is usable as a schema (an object or a boolean, keywords of the right
// kinds). Registries call it once when a tool is added.
status schema_check(const json& schema);

}  // namespace cedar::tools
