// model::tool_grammar — see tool_grammar.hpp for the rules.
//
// `viable` is one left-to-right scan over the reply with four states (content, block, call,
// value). Each literal tag is matched with `lit`, which also answers "the text ends inside this
// literal" (still viable: the next tokens may complete it). Attribute values (tool and parameter
// names) are matched against the offered names as prefixes while unterminated.
#include "model/tool_grammar.hpp"

#include <algorithm>

#include <simdjson.h>

#include "model/dsml.hpp"

namespace cedar::model {
namespace {

// The parser's tags (dsml_marker), in the one form the grammar lets the model write them.
constexpr std::string_view k_dsml = dsml_marker::dsml;
constexpr std::string_view k_calls_rest = dsml_marker::calls_open.substr(dsml_marker::dsml.size());  // " calls>"
constexpr std::string_view k_invoke = "<｜DSML｜ invoke name=\"";
constexpr std::string_view k_calls_close = dsml_marker::calls_close;
constexpr std::string_view k_param = "<｜DSML｜ parameter name=\"";
constexpr std::string_view k_invoke_close = dsml_marker::invoke_close;
constexpr std::string_view k_param_close = dsml_marker::param_close;
static_assert(k_invoke.starts_with(dsml_marker::invoke_open) && k_param.starts_with(dsml_marker::param_open));

enum class m { full, partial, no };

// Does `lit` start at text[i]? partial: the text ends inside it.
m lit(std::string_view text, size_t i, std::string_view lit) {
  const size_t n = std::min(lit.size(), text.size() - i);
  if (text.compare(i, n, lit.substr(0, n)) != 0) return m::no;
  return n == lit.size() ? m::full : m::partial;
}

bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

param_kind kind_of(simdjson::dom::element prop) {
  std::string_view t;
  if (prop.type() != simdjson::dom::element_type::OBJECT || prop["type"].get(t)) return param_kind::any;
  if (t == "string") return param_kind::string;
  if (t == "number") return param_kind::number;
  if (t == "integer") return param_kind::integer;
  if (t == "boolean") return param_kind::boolean;
  if (t == "object") return param_kind::object;
  if (t == "array") return param_kind::array;
  return param_kind::any;
}

// A complete string="false" value: JSON of the property's type.
bool json_value_ok(std::string_view raw, param_kind k) {
  simdjson::dom::parser p;
  simdjson::dom::element e;
  if (p.parse(std::string(raw)).get(e)) return false;
  using T = simdjson::dom::element_type;
  switch (k) {
    case param_kind::any: return true;
    case param_kind::string: return e.type() == T::STRING;
    case param_kind::number: return e.type() == T::INT64 || e.type() == T::UINT64 || e.type() == T::DOUBLE;
    case param_kind::integer: return e.type() == T::INT64 || e.type() == T::UINT64;
    case param_kind::boolean: return e.type() == T::BOOL;
    case param_kind::object: return e.type() == T::OBJECT;
    case param_kind::array: return e.type() == T::ARRAY;
  }
  return false;
}

}  // namespace

result<tool_grammar> tool_grammar::from_json(std::string_view spec) {
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  if (auto err = parser.parse(std::string(spec)).get(root))
    return make_error(errc::invalid_argument, std::string("tool grammar: not JSON: ") + simdjson::error_message(err));
  simdjson::dom::array arr;
  if (root.get(arr)) return make_error(errc::invalid_argument, "tool grammar: expected an array of tools");
  std::vector<tool_desc> tools;
  for (simdjson::dom::element t : arr) {
    std::string_view name;
    if (t.type() != simdjson::dom::element_type::OBJECT || t["name"].get(name) || name.empty())
      return make_error(errc::invalid_argument, "tool grammar: tool " + std::to_string(tools.size()) + " has no \"name\"");
    tool_desc d;
    d.name = std::string(name);
    simdjson::dom::element schema, props;
    if (t["parameters"].get(schema) || schema.type() != simdjson::dom::element_type::OBJECT ||
        schema["properties"].get(props) || props.type() != simdjson::dom::element_type::OBJECT) {
      d.open = true;
    } else {
      for (auto [k, v] : simdjson::dom::object(props)) d.params.push_back({std::string(k), kind_of(v), false});
      simdjson::dom::array req;
      if (!schema["required"].get(req))
        for (simdjson::dom::element r : req) {
          std::string_view rn;
          if (r.get(rn)) continue;
          for (auto& p : d.params)
            if (p.name == rn) p.required = true;
        }
    }
    tools.push_back(std::move(d));
  }
  return tool_grammar(std::move(tools));
}

std::string tool_grammar_spec(const std::vector<std::pair<std::string, std::string>>& tools) {
  std::string s = "[";
  for (size_t i = 0; i < tools.size(); ++i) {
    if (i) s += ", ";
    s += "{\"name\": " + json_quote(tools[i].first) + ", \"parameters\": " +
         (tools[i].second.empty() ? std::string("{}") : tools[i].second) + "}";
  }
  return s + "]";
}

bool tool_grammar::viable(std::string_view text, bool at_end) const {
  enum class st { content, block, call, value } state = st::content;
  const size_t n = text.size();
  size_t i = 0;
  const tool_desc* tool = nullptr;   // the call being read
  const tool_param* param = nullptr; // the value being read (null: an open tool's parameter)
  bool param_string = true;
  std::vector<const tool_param*> given;

  // Reads an attribute value up to '"' at text[i]: the names in `names` it may still become.
  // -> 1 complete (i after the quote, `out` the name), 0 the text ends inside it, -1 impossible.
  auto name_at = [&](auto&& accept, std::string& out) -> int {
    const size_t q = text.find('"', i);
    if (q == std::string_view::npos) return accept(text.substr(i), false) ? 0 : -1;
    out = std::string(text.substr(i, q - i));
    if (!accept(out, true)) return -1;
    i = q + 1;
    return 1;
  };

  while (true) {
    if (state == st::content) {
      const size_t p = text.find(k_dsml, i);
      if (tools_.empty()) {  // no tools: no block, nor the start of a marker at the end
        if (p != std::string_view::npos) return false;
        if (text.find_first_not_of(" \t\r\n") == std::string_view::npos && !text.empty()) return false;
        for (size_t k = std::min(text.size(), k_dsml.size() - 1); k > 0; --k)
          if (text.substr(text.size() - k) == k_dsml.substr(0, k)) return false;
        return true;
      }
      if (p == std::string_view::npos) return true;  // content (a partial marker at the end is content too)
      i = p + k_dsml.size();
      switch (lit(text, i, k_calls_rest)) {
        case m::no: return false;
        case m::partial: return !at_end;
        case m::full: i += k_calls_rest.size(); state = st::block; continue;
      }
    }
    while (i < n && is_ws(text[i])) ++i;
    if (state == st::value) {
      const size_t p = text.find(k_param_close, i);
      if (p == std::string_view::npos) return !at_end;
      if (!param_string) {
        std::string_view raw = text.substr(i, p - i);
        while (!raw.empty() && is_ws(raw.back())) raw.remove_suffix(1);
        if (!json_value_ok(raw, param ? param->kind : param_kind::any)) return false;
      }
      i = p + k_param_close.size();
      state = st::call;
      continue;
    }
    if (i >= n) return !at_end;
    if (state == st::block) {
      if (lit(text, i, k_invoke) == m::full) {
        i += k_invoke.size();
        std::string name;
        const int r = name_at([&](std::string_view s, bool whole) {
          for (const auto& t : tools_)
            if (whole ? t.name == s : t.name.compare(0, s.size(), s) == 0) return true;
          return false;
        }, name);
        if (r <= 0) return r == 0 && !at_end;
        tool = nullptr;
        for (const auto& t : tools_)
          if (t.name == name) tool = &t;
        if (lit(text, i, ">") != m::full) return i >= n && !at_end;
        ++i;
        given.clear();
        state = st::call;
        continue;
      }
      const m a = lit(text, i, k_invoke), b = lit(text, i, k_calls_close);
      if (b == m::full) {
        i += k_calls_close.size();
        state = st::content;
        continue;
      }
      return (a == m::partial || b == m::partial) && !at_end;
    }
    // st::call: a parameter tag only while the tool has a parameter left to give (no dead ends)
    bool can_param = tool->open;
    for (const auto& p : tool->params)
      can_param = can_param || std::find(given.begin(), given.end(), &p) == given.end();
    if (can_param && lit(text, i, k_param) == m::full) {
      i += k_param.size();
      std::string name;
      const int r = name_at([&](std::string_view s, bool whole) {
        if (tool->open) return true;
        for (const auto& p : tool->params) {
          if (std::find(given.begin(), given.end(), &p) != given.end()) continue;
          if (whole ? p.name == s : p.name.compare(0, s.size(), s) == 0) return true;
        }
        return false;
      }, name);
      if (r <= 0) return r == 0 && !at_end;
      param = nullptr;
      for (const auto& p : tool->params)
        if (p.name == name) param = &p;
      if (param) given.push_back(param);
      const param_kind k = param ? param->kind : param_kind::any;
      const bool allow_true = k == param_kind::any || k == param_kind::string;
      const bool allow_false = k != param_kind::string;
      const m t = allow_true ? lit(text, i, " string=\"true\">") : m::no;
      const m f = allow_false ? lit(text, i, " string=\"false\">") : m::no;
      if (t == m::full) {
        i += std::string_view(" string=\"true\">").size();
        param_string = true;
      } else if (f == m::full) {
        i += std::string_view(" string=\"false\">").size();
        param_string = false;
      } else {
        return (t == m::partial || f == m::partial) && !at_end;
      }
      state = st::value;
      continue;
    }
    const m a = can_param ? lit(text, i, k_param) : m::no, c = lit(text, i, k_invoke_close);
    if (c == m::full) {
      for (const auto& p : tool->params)
        if (p.required && std::find(given.begin(), given.end(), &p) == given.end()) return false;
      i += k_invoke_close.size();
      state = st::block;
      continue;
    }
    return (a == m::partial || c == m::partial) && !at_end;
  }
}

}  // namespace cedar::model
