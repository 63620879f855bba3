// agent_options <-> JSON (agent_options_json.hpp).
#include "runtime/agent_options_json.hpp"

#include <nlohmann/json.hpp>

namespace cedar::runtime {

using njson = nlohmann::json;

std::string agent_options_to_json(const agent_options& o) {
  return njson{{"name", o.name},
               {"system_prompt", o.system_prompt},
               {"tools", o.tools},
               {"temperature", o.temperature},
               {"top_p", o.top_p},
               {"min_p", o.min_p},
               {"seed", o.seed},
               {"max_new_tokens", o.max_new_tokens},
               {"min_new_tokens", o.min_new_tokens},
               {"max_tool_rounds", o.max_tool_rounds},
               {"max_repeated_failures", o.max_repeated_failures},
               {"answer_on_limit", o.answer_on_limit},
               {"tool_timeout_ms", o.tool_timeout_ms},
               {"constrain_tool_calls", o.constrain_tool_calls}}
      .dump();
}

result<agent_options> agent_options_from_json(std::string_view json, const agent_options& defaults) {
  njson j = njson::parse(json, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return make_error(errc::invalid_format, "agent options: not a JSON object");
  agent_options o = defaults;
  auto bad = [](const char* key, const char* want) {
    return make_error(errc::invalid_format, std::string("agent options: '") + key + "' must be " + want);
  };
  auto str = [&](const char* key, std::string& out) -> status {
    if (!j.contains(key)) return {};
    if (!j[key].is_string()) return bad(key, "a string");
    out = j[key].get<std::string>();
    return {};
  };
  auto num = [&](const char* key, float& out) -> status {
    if (!j.contains(key)) return {};
    if (!j[key].is_number()) return bad(key, "a number");
    out = j[key].get<float>();
    return {};
  };
  auto integer = [&](const char* key, int& out) -> status {
    if (!j.contains(key)) return {};
    if (!j[key].is_number_integer()) return bad(key, "an integer");
    out = j[key].get<int>();
    return {};
  };
  CEDAR_TRY(str("name", o.name));
  CEDAR_TRY(str("system_prompt", o.system_prompt));
  if (j.contains("tools")) {
    if (!j["tools"].is_array()) return bad("tools", "an array of tool names");
    o.tools.clear();
    for (const auto& t : j["tools"]) {
      if (!t.is_string()) return bad("tools", "an array of tool names");
      o.tools.push_back(t.get<std::string>());
    }
  }
  CEDAR_TRY(num("temperature", o.temperature));
  CEDAR_TRY(num("top_p", o.top_p));
  CEDAR_TRY(num("min_p", o.min_p));
  if (j.contains("seed")) {
    if (!j["seed"].is_number_unsigned() && !j["seed"].is_number_integer()) return bad("seed", "an integer");
    o.seed = j["seed"].is_number_unsigned() ? j["seed"].get<uint64_t>() : uint64_t(j["seed"].get<int64_t>());
  }
  CEDAR_TRY(integer("max_new_tokens", o.max_new_tokens));
  CEDAR_TRY(integer("min_new_tokens", o.min_new_tokens));
  CEDAR_TRY(integer("max_tool_rounds", o.max_tool_rounds));
  CEDAR_TRY(integer("max_repeated_failures", o.max_repeated_failures));
  CEDAR_TRY(integer("tool_timeout_ms", o.tool_timeout_ms));
  for (auto [key, out] : {std::pair<const char*, bool*>{"constrain_tool_calls", &o.constrain_tool_calls},
                          std::pair<const char*, bool*>{"answer_on_limit", &o.answer_on_limit}}) {
    if (!j.contains(key)) continue;
    if (!j[key].is_boolean()) return bad(key, "true or false");
    *out = j[key].get<bool>();
  }
  return o;
}

}  // namespace cedar::runtime
