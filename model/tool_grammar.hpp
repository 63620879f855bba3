// model::tool_grammar — constrained decoding of DSML tool calls: decides whether a reply's text
// so far can still become a reply whose every tool call is valid for the tools offered.
//
// Owns: the viability rules below and the compact tool descriptions they use.
// Does not own: sampling (the executor asks `viable` about the candidates its sampler draws and
// masks the rejected ones), the DSML parser (model/dsml.hpp, which stays the judge of what was
// generated), the tools' full JSON-schema validation (tools_mcp/json_schema).
//
// What is constrained (everything else, content and string values, is free):
//   - a `<｜DSML｜` in content must open a block: `<｜DSML｜ calls>`;
//   - in a block only `<｜DSML｜ invoke name="T">` (T an offered tool, byte for byte) or
//     `</｜DSML｜ calls>`, whitespace between tags;
//   - in a call only `<｜DSML｜ parameter name="K" string="S">` (K a property of T's input schema
//     not given yet in this call; S = true for a string property, false for a typed non-string
//     one, either when the schema does not say) or `</｜DSML｜ invoke>`, and the latter only once
//     every required property was given;
//   - a string="false" value must be JSON of the property's type when its closing tag completes;
//   - the reply may end (EOS / a stop token) only outside a block;
//   - with no tools (spec "[]") no block at all, the text may not end inside the start of a
//     marker ("<", "<｜", ...) and may not start with whitespace (the "\n\n" that opens a block
//     after no text): the reply is plain content. This is the agent's final reply after a limit
//     (runtime/agent_loop.hpp answer_on_limit): a model that wanted to call a tool writes words.
// Tools whose schema lists no `properties` accept any parameter name. The rules are a subset of
// what dsml_parser accepts, so a reply that passes them parses into calls that pass
// tools::schema_validate for the common schemas (types, required; not enums, ranges, patterns).
//
// Cost: `viable` rescans the reply (≤ a few KB) per candidate; the executor tries the sampler's
// choice first and rescans only for rejected candidates, so an unconstrained-looking step costs
// one scan.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/base/result.hpp"

namespace cedar::model {

enum class param_kind : uint8_t { any, string, number, integer, boolean, object, array };

struct tool_param {
  std::string name;
  param_kind kind = param_kind::any;
  bool required = false;
};

struct tool_desc {
  std::string name;
  bool open = false;  // the schema lists no properties: any parameter name
  std::vector<tool_param> params;
};

class tool_grammar {
 public:
  // `spec`: a JSON array of {"name": ..., "parameters": <JSON schema of the arguments>}
  // (OpenAI's function objects, or the registry's input schemas). Errors name what was wrong.
  static result<tool_grammar> from_json(std::string_view spec);
  explicit tool_grammar(std::vector<tool_desc> tools) : tools_(std::move(tools)) {}

  // Can `text` (the reply so far) still be continued into a reply whose calls are valid?
  // `at_end`: the reply would end right after `text` (the candidate is EOS or a stop token).
  bool viable(std::string_view text, bool at_end = false) const;

  const std::vector<tool_desc>& tools() const { return tools_; }

 private:
  std::vector<tool_desc> tools_;
};

// The spec `from_json` reads, for tools given as (name, input schema JSON text) pairs.
std::string tool_grammar_spec(const std::vector<std::pair<std::string, std::string>>& tools);

}  // namespace cedar::model
