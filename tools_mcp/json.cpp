// simdjson DOM -> nlohmann::json conversion and the non-throwing helpers of json.hpp.
#include "tools_mcp/json.hpp"

#include <simdjson.h>

#include <cmath>

namespace cedar::tools {
namespace {

json from_dom(simdjson::dom::element e) {
  using simdjson::dom::element_type;
  switch (e.type()) {
    case element_type::ARRAY: {
      json out = json::array();
      simdjson::dom::array arr = e.get_array().value_unsafe();  // a named copy: no dangling temporary
      for (auto child : arr) out.push_back(from_dom(child));
      return out;
    }
    case element_type::OBJECT: {
      json out = json::object();
      simdjson::dom::object obj = e.get_object().value_unsafe();
      for (auto field : obj)
        out[std::string(field.key)] = from_dom(field.value);
      return out;
    }
    case element_type::INT64: return json(e.get_int64().value_unsafe());
    case element_type::UINT64: return json(e.get_uint64().value_unsafe());
    case element_type::DOUBLE: return json(e.get_double().value_unsafe());
    case element_type::STRING: return json(std::string(e.get_string().value_unsafe()));
    case element_type::BOOL: return json(e.get_bool().value_unsafe());
    case element_type::NULL_VALUE: return json(nullptr);
  }
  return json(nullptr);
}

}  // namespace

result<json> json_parse(std::string_view text, std::string_view what) {
  // One parser per thread: parsing happens on transport reader threads and callers' threads.
  thread_local simdjson::dom::parser parser;
  simdjson::padded_string padded(text.data(), text.size());
  simdjson::dom::element root;
  auto err = parser.parse(padded).get(root);
  if (err) {
    return make_error(errc::invalid_format, std::string(what) + " is not valid JSON (" +
                                                simdjson::error_message(err) + "): '" +
                                                excerpt(text) + "'");
  }
  return from_dom(root);
}

std::string json_dump(const json& v, int indent) {
  return v.dump(indent, ' ', false, json::error_handler_t::replace);
}

std::string json_dump_ordered(const nlohmann::ordered_json& v, int indent) {
  return v.dump(indent, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

const json* json_member(const json& obj, std::string_view key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

std::string json_string_or(const json& obj, std::string_view key, std::string fallback) {
  const json* m = json_member(obj, key);
  return m && m->is_string() ? m->get<std::string>() : fallback;
}

const char* json_type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "integer";
    case json::value_t::number_float: {
      double d = v.get<double>();
      return std::isfinite(d) && std::floor(d) == d ? "integer" : "number";
    }
    case json::value_t::string: return "string";
    case json::value_t::array: return "array";
    case json::value_t::object: return "object";
    default: return "unknown";
  }
}

std::string excerpt(std::string_view text, size_t n) {
  std::string out;
  for (size_t i = 0; i < text.size() && i < n; ++i) {
    char c = text[i];
    if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (static_cast<unsigned char>(c) < 0x20) out += '?';
    else out += c;
  }
  if (text.size() > n) out += "...";
  return out;
}

}  // namespace cedar::tools
