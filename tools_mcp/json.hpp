// JSON values for the tools module: nlohmann::json is the in-memory value (tool arguments,
// schemas, MCP messages); bytes are parsed with simdjson (strict, fast, never throws here) and
// converted. Serialisation never throws: invalid UTF-8 in strings is replaced, not fatal.
//
// Callers outside this module receive `json` values; they must use the non-throwing accessors
// (`find`, `is_*`, `get_ref` after a type check) or the helpers below.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "kernels/base/result.hpp"

namespace cedar::tools {

using json = nlohmann::json;

// Parses one JSON document. Errors name `what` (e.g. "MCP message from 'fs'") and the simdjson
// reason.
result<json> json_parse(std::string_view text, std::string_view what = "JSON");

// Serialisation that never throws: invalid UTF-8 is replaced by U+FFFD. Compact by default;
// indent >= 0 pretty-prints with that many spaces per level (CLI output). json_dump_ordered keeps
// insertion order (canonical tool descriptions); a separate name, so that scalars still convert
// to `json` without ambiguity.
std::string json_dump(const json& v, int indent = -1);
std::string json_dump_ordered(const nlohmann::ordered_json& v, int indent = -1);

// Non-throwing lookups: the member if `obj` is an object holding `key` of the wanted kind.
const json* json_member(const json& obj, std::string_view key);
std::string json_string_or(const json& obj, std::string_view key, std::string fallback = {});

// "string", "number", "object", ... as JSON Schema names the value's type ("integer" for
// whole numbers).
const char* json_type_name(const json& v);

// A short excerpt of text for error messages: at most n bytes, newlines escaped.
std::string excerpt(std::string_view text, size_t n = 120);

}  // namespace cedar::tools
