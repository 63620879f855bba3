// request_parse — see request_parse.hpp. The chat completions rules moved here from
// openai_api.cpp unchanged; inside this file a wrong field is thrown as bad_field and caught at
// the one entry point, which never throws.
#include "runtime/server/request_parse.hpp"
#include "tools_mcp/json.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <random>

namespace cedar::runtime {

using njson = nlohmann::json;

namespace {

// A request field that is wrong: HTTP 400 with `param` naming it.
struct bad_field {
  std::string param, message;
};


std::string type_name(const njson& j) {
  switch (j.type()) {
    case njson::value_t::null: return "null";
    case njson::value_t::boolean: return "a boolean";
    case njson::value_t::string: return "a string";
    case njson::value_t::array: return "an array";
    case njson::value_t::object: return "an object";
    default: return "a number";
  }
}

// content: a string, null, or a list of {"type":"text","text":...} parts.
std::string content_text(const njson& c, const std::string& where) {
  if (c.is_null()) return {};
  if (c.is_string()) return c.get<std::string>();
  if (c.is_array()) {
    std::string out;
    size_t i = 0;
    for (const auto& p : c) {
      std::string w = where + "[" + std::to_string(i++) + "]";
      if (!p.is_object() || !p.contains("type") || !p["type"].is_string())
        throw bad_field{w, w + ": expected a content part {\"type\": \"text\", \"text\": ...}"};
      if (p["type"] != "text")
        throw bad_field{w + ".type", w + ".type: only text parts are supported, got '" + p["type"].get<std::string>() + "'"};
      if (!p.contains("text") || !p["text"].is_string()) throw bad_field{w + ".text", w + ".text: expected a string"};
      out += p["text"].get<std::string>();
    }
    return out;
  }
  throw bad_field{where, where + ": expected a string, null or a list of text parts, got " + type_name(c)};
}

model::chat_message parse_message(const njson& m, size_t i) {
  const std::string w = "messages[" + std::to_string(i) + "]";
  if (!m.is_object()) throw bad_field{w, w + ": expected an object, got " + type_name(m)};
  if (!m.contains("role") || !m["role"].is_string()) throw bad_field{w + ".role", w + ".role: missing or not a string"};
  std::string role = m["role"];
  model::chat_message out;
  if (role == "system") out.role = model::chat_role::system;
  else if (role == "developer") out.role = model::chat_role::developer;
  else if (role == "user") out.role = model::chat_role::user;
  else if (role == "assistant") out.role = model::chat_role::assistant;
  else if (role == "tool") out.role = model::chat_role::tool;
  else
    throw bad_field{w + ".role", w + ".role: unknown role '" + role + "' (system, developer, user, assistant or tool)"};
  if (m.contains("content")) out.content = content_text(m["content"], w + ".content");
  else if (out.role != model::chat_role::assistant) throw bad_field{w + ".content", w + ".content: missing"};
  if (out.role == model::chat_role::tool) {
    if (!m.contains("tool_call_id") || !m["tool_call_id"].is_string())
      throw bad_field{w + ".tool_call_id", w + ".tool_call_id: a tool message needs the id of the call it answers"};
    out.tool_call_id = m["tool_call_id"];
  }
  if (out.role == model::chat_role::assistant && m.contains("tool_calls") && !m["tool_calls"].is_null()) {
    const njson& calls = m["tool_calls"];
    if (!calls.is_array()) throw bad_field{w + ".tool_calls", w + ".tool_calls: expected an array"};
    for (size_t k = 0; k < calls.size(); ++k) {
      const std::string cw = w + ".tool_calls[" + std::to_string(k) + "]";
      const njson& c = calls[k];
      if (!c.is_object() || !c.contains("function") || !c["function"].is_object())
        throw bad_field{cw + ".function", cw + ".function: expected an object"};
      const njson& f = c["function"];
      if (!f.contains("name") || !f["name"].is_string())
        throw bad_field{cw + ".function.name", cw + ".function.name: missing or not a string"};
      model::chat_tool_call tc;
      tc.id = c.contains("id") && c["id"].is_string() ? c["id"].get<std::string>() : std::string();
      tc.name = f["name"];
      if (!f.contains("arguments") || f["arguments"].is_null()) tc.arguments_json = "{}";
      else if (f["arguments"].is_string()) tc.arguments_json = f["arguments"];
      else if (f["arguments"].is_object()) tc.arguments_json = cedar::tools::json_dump(f["arguments"]);
      else throw bad_field{cw + ".function.arguments", cw + ".function.arguments: expected a JSON string"};
      njson a = njson::parse(tc.arguments_json, nullptr, false);
      if (a.is_discarded() || !a.is_object())
        throw bad_field{cw + ".function.arguments", cw + ".function.arguments: not a JSON object"};
      out.tool_calls.push_back(std::move(tc));
    }
  }
  return out;
}

int get_int(const njson& body, const char* key, int lo, int hi) {
  const njson& v = body[key];
  if (!v.is_number_integer() && !v.is_number_unsigned())
    throw bad_field{key, std::string(key) + ": expected an integer, got " + type_name(v)};
  int64_t x = v.get<int64_t>();
  if (x < lo || x > hi)
    throw bad_field{key, std::string(key) + ": " + std::to_string(x) + " is out of range [" + std::to_string(lo) + ", " +
                             std::to_string(hi) + "]"};
  return int(x);
}

double get_number(const njson& body, const char* key, double lo, double hi) {
  const njson& v = body[key];
  if (!v.is_number()) throw bad_field{key, std::string(key) + ": expected a number, got " + type_name(v)};
  double x = v.get<double>();
  if (!(x >= lo && x <= hi))
    throw bad_field{key, std::string(key) + ": " + cedar::tools::json_dump(v) + " is out of range [" + cedar::tools::json_dump(njson(lo)) + ", " +
                             cedar::tools::json_dump(njson(hi)) + "]"};
  return x;
}

bool present(const njson& body, const char* key) { return body.contains(key) && !body[key].is_null(); }

chat_request parse_request(const njson& body) {
  chat_request p;
  completion_request& r = p.req;
  if (!body.is_object()) throw bad_field{"", "the request body must be a JSON object"};
  if (!present(body, "model") || !body["model"].is_string()) throw bad_field{"model", "model: missing or not a string"};
  if (!present(body, "messages") || !body["messages"].is_array())
    throw bad_field{"messages", "messages: missing or not an array"};
  if (body["messages"].empty()) throw bad_field{"messages", "messages: must not be empty"};
  for (size_t i = 0; i < body["messages"].size(); ++i) r.messages.push_back(parse_message(body["messages"][i], i));

  std::vector<std::string> names;
  if (present(body, "tools")) {
    const njson& tools = body["tools"];
    if (!tools.is_array()) throw bad_field{"tools", "tools: expected an array"};
    for (size_t i = 0; i < tools.size(); ++i) {
      const std::string w = "tools[" + std::to_string(i) + "]";
      const njson& t = tools[i];
      if (!t.is_object() || t.value("type", "") != "function" || !t.contains("function") || !t["function"].is_object())
        throw bad_field{w, w + ": expected {\"type\": \"function\", \"function\": {...}}"};
      const njson& f = t["function"];
      if (!f.contains("name") || !f["name"].is_string() || f["name"].get<std::string>().empty())
        throw bad_field{w + ".function.name", w + ".function.name: missing or not a string"};
      tools::tool tl;
      tl.name = f["name"];
      if (f.contains("description") && f["description"].is_string()) tl.description = f["description"];
      tl.input_schema = f.contains("parameters") && f["parameters"].is_object()
                            ? f["parameters"]
                            : njson{{"type", "object"}, {"properties", njson::object()}};
      names.push_back(tl.name);
      p.tools.push_back(std::move(tl));
    }
  }
  if (present(body, "tool_choice")) {
    const njson& tc = body["tool_choice"];
    if (tc.is_string()) {
      std::string c = tc;
      if (c == "none") {
        p.tools.clear();
        r.drop_calls = true;
      } else if (c == "required") {
        if (names.empty()) throw bad_field{"tool_choice", "tool_choice: 'required' needs tools"};
        r.forced_prefix = "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"";
      } else if (c != "auto") {
        throw bad_field{"tool_choice", "tool_choice: expected 'none', 'auto', 'required' or a function, got '" + c + "'"};
      }
    } else if (tc.is_object() && tc.value("type", "") == "function" && tc.contains("function") &&
               tc["function"].is_object() && tc["function"].contains("name") && tc["function"]["name"].is_string()) {
      std::string name = tc["function"]["name"];
      if (std::find(names.begin(), names.end(), name) == names.end())
        throw bad_field{"tool_choice", "tool_choice: function '" + name + "' is not in tools"};
      // Up to the name: the tag's end is the model's (as tokenized in training).
      r.forced_prefix = "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"" + name;
    } else {
      throw bad_field{"tool_choice", "tool_choice: expected a string or {\"type\": \"function\", \"function\": {\"name\": ...}}"};
    }
  }
  if (present(body, "stream")) {
    if (!body["stream"].is_boolean()) throw bad_field{"stream", "stream: expected a boolean"};
    p.stream = body["stream"];
  }
  if (present(body, "stream_options")) {
    const njson& so = body["stream_options"];
    if (!so.is_object()) throw bad_field{"stream_options", "stream_options: expected an object"};
    if (so.contains("include_usage")) {
      if (!so["include_usage"].is_boolean())
        throw bad_field{"stream_options.include_usage", "stream_options.include_usage: expected a boolean"};
      p.include_usage = so["include_usage"];
    }
  }
  r.max_tokens = 512;
  if (present(body, "max_tokens")) r.max_tokens = get_int(body, "max_tokens", 1, 1 << 20);
  if (present(body, "max_completion_tokens")) r.max_tokens = get_int(body, "max_completion_tokens", 1, 1 << 20);
  if (present(body, "min_tokens")) {  // vLLM's extension: EOS cannot end the reply before this many tokens
    r.min_tokens = get_int(body, "min_tokens", 0, 1 << 20);
    if (r.min_tokens > r.max_tokens)
      throw bad_field{"min_tokens", "min_tokens: " + std::to_string(r.min_tokens) + " is above max_tokens (" +
                                        std::to_string(r.max_tokens) + ")"};
  }
  r.temperature = 1;
  if (present(body, "temperature")) r.temperature = float(get_number(body, "temperature", 0, 2));
  if (present(body, "top_p")) {
    r.top_p = float(get_number(body, "top_p", 0, 1));
    if (r.top_p <= 0) throw bad_field{"top_p", "top_p: must be greater than 0"};
  }
  if (present(body, "seed")) {
    const njson& s = body["seed"];
    if (!s.is_number_integer() && !s.is_number_unsigned()) throw bad_field{"seed", "seed: expected an integer"};
    r.seed = s.is_number_unsigned() ? s.get<uint64_t>() : uint64_t(s.get<int64_t>());
  } else {
    r.seed = std::random_device{}();
  }
  if (present(body, "stop")) {
    const njson& s = body["stop"];
    if (s.is_string()) r.stop.push_back(s);
    else if (s.is_array() && s.size() <= 4) {
      for (const auto& x : s) {
        if (!x.is_string()) throw bad_field{"stop", "stop: expected strings"};
        r.stop.push_back(x);
      }
    } else {
      throw bad_field{"stop", "stop: expected a string or an array of up to 4 strings"};
    }
  }
  if (present(body, "n") && !(body["n"].is_number_integer() && body["n"].get<int64_t>() == 1))
    throw bad_field{"n", "n: only 1 choice is supported"};
  if (present(body, "response_format") &&
      !(body["response_format"].is_object() && body["response_format"].value("type", "") == "text"))
    throw bad_field{"response_format", "response_format: only {\"type\": \"text\"} is supported"};
  if (present(body, "logprobs") && body["logprobs"].is_boolean() && body["logprobs"].get<bool>())
    throw bad_field{"logprobs", "logprobs: not supported"};
  return p;
}

}  // namespace

std::optional<request_error> parse_chat_request(std::string_view body, const std::string& model_id, chat_request& out) {
  njson j = njson::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return request_error{400, "the request body is not valid JSON", "", "invalid_json"};
  try {
    out = parse_request(j);
  } catch (const bad_field& b) {
    return request_error{400, b.message, b.param, "invalid_value"};
  } catch (const njson::exception& e) {
    return request_error{400, std::string("bad request: ") + e.what(), "", ""};
  }
  if (j["model"] != model_id)
    return request_error{404,
                         "the model '" + j["model"].get<std::string>() + "' does not exist (this server has '" +
                             model_id + "')",
                         "model", "model_not_found"};
  return std::nullopt;
}

bool equal_ct(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char d = 0;
  for (size_t i = 0; i < a.size(); ++i) d |= static_cast<unsigned char>(a[i] ^ b[i]);
  return d == 0;
}

std::string cookie_value(std::string_view header, std::string_view name) {
  size_t pos = 0;
  while (pos < header.size()) {
    size_t end = header.find(';', pos);
    if (end == std::string_view::npos) end = header.size();
    std::string_view part = header.substr(pos, end - pos);
    size_t b = part.find_first_not_of(' ');
    part = b == std::string_view::npos ? std::string_view() : part.substr(b);
    if (part.size() > name.size() && part.substr(0, name.size()) == name && part[name.size()] == '=')
      return std::string(part.substr(name.size() + 1));
    pos = end + 1;
  }
  return {};
}

bool request_authorized(std::string_view authorization, const std::vector<std::string>& cookie_headers,
                        std::string_view cookie_name, std::string_view token) {
  if (authorization.substr(0, 7) == "Bearer " && equal_ct(authorization.substr(7), token)) return true;
  for (const auto& h : cookie_headers)
    if (equal_ct(cookie_value(h, cookie_name), token)) return true;
  return false;
}

}  // namespace cedar::runtime
