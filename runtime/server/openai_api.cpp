// The OpenAI-compatible routes: request JSON -> completion_request, completion_result -> JSON
// or SSE chunks. Design notes in openai_api.hpp.
#include "runtime/server/openai_api.hpp"

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>

#include "runtime/actors.hpp"
#include "runtime/completion.hpp"
#include "runtime/runtime_impl.hpp"

namespace cedar::runtime {

using njson = nlohmann::json;

namespace {

// A request field that is wrong: HTTP 400 with `param` naming it.
struct bad_field {
  std::string param, message;
};

struct parsed_request {
  completion_request req;
  bool stream = false, include_usage = false;
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
      else if (f["arguments"].is_object()) tc.arguments_json = f["arguments"].dump();
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
    throw bad_field{key, std::string(key) + ": " + v.dump() + " is out of range [" + njson(lo).dump() + ", " +
                             njson(hi).dump() + "]"};
  return x;
}

bool present(const njson& body, const char* key) { return body.contains(key) && !body[key].is_null(); }

parsed_request parse_request(const njson& body, const std::string& model_id) {
  parsed_request p;
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
      r.tools_json.push_back(tool_schema_json(tl));
    }
  }
  if (present(body, "tool_choice")) {
    const njson& tc = body["tool_choice"];
    if (tc.is_string()) {
      std::string c = tc;
      if (c == "none") {
        r.tools_json.clear();
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
  (void)model_id;
  return p;
}

int64_t now_s() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string completion_id() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[40];
  std::snprintf(buf, sizeof buf, "chatcmpl-%016llx%08llx", (unsigned long long)rng(), (unsigned long long)(rng() >> 32));
  return buf;
}

njson usage_json(const completion_result& r) {
  return njson{{"prompt_tokens", r.prompt_tokens},
               {"completion_tokens", r.completion_tokens},
               {"total_tokens", r.prompt_tokens + r.completion_tokens},
               {"prompt_tokens_details", {{"cached_tokens", r.cached_tokens}}}};
}

njson tool_call_json(const completion_call& c) {
  return njson{{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments_json}}}};
}

int status_of(const error& e) {
  return e.code == errc::invalid_argument || e.code == errc::invalid_format ? 400 : 500;
}

njson model_json(const std::string& id) {
  return njson{{"id", id}, {"object", "model"}, {"created", 0}, {"owned_by", "cedar"}};
}

}  // namespace

route_mount openai_api_mount() {
  return [](httplib::Server& svr, agent_runtime& rt) {
    auto svc = std::make_shared<completion_service>(rt);
    const std::string model_id = svc->model_id();

    svr.Get("/v1/models", [model_id](const httplib::Request&, httplib::Response& res) {
      res.set_content(njson{{"object", "list"}, {"data", njson::array({model_json(model_id)})}}.dump(), "application/json");
    });
    svr.Get(R"(/v1/models/([^/]+))", [model_id](const httplib::Request& req, httplib::Response& res) {
      if (req.matches[1] != model_id) {
        send_error(res, 404, "the model '" + std::string(req.matches[1]) + "' does not exist (this server has '" + model_id + "')",
                   "model", "model_not_found");
        return;
      }
      res.set_content(model_json(model_id).dump(), "application/json");
    });
    auto wrong_method = [](const httplib::Request& req, httplib::Response& res) {
      send_error(res, 405, req.method + " " + req.path + ": use POST", "", "method_not_allowed");
    };
    svr.Get("/v1/chat/completions", wrong_method);

    svr.Post("/v1/chat/completions", [svc, model_id](const httplib::Request& req, httplib::Response& res) {
      njson body;
      try {
        body = njson::parse(req.body);
      } catch (const njson::parse_error& e) {
        send_error(res, 400, std::string("the request body is not valid JSON: ") + e.what(), "", "invalid_json");
        return;
      }
      parsed_request p;
      try {
        p = parse_request(body, model_id);
      } catch (const bad_field& b) {
        send_error(res, 400, b.message, b.param, "invalid_value");
        return;
      } catch (const njson::exception& e) {
        send_error(res, 400, std::string("bad request: ") + e.what());
        return;
      }
      if (body["model"] != model_id) {
        send_error(res, 404,
                   "the model '" + body["model"].get<std::string>() + "' does not exist (this server has '" + model_id + "')",
                   "model", "model_not_found");
        return;
      }
      if (auto v = svc->validate(p.req); !v) {
        send_error(res, status_of(v.err()), v.err().message, "messages", "invalid_value");
        return;
      }
      const std::string id = completion_id();
      const int64_t created = now_s();

      if (!p.stream) {
        auto r = svc->complete(p.req);
        if (!r) {
          send_error(res, status_of(r.err()), r.err().message);
          return;
        }
        njson msg{{"role", "assistant"}, {"content", r->content}, {"refusal", nullptr}};
        if (!r->calls.empty()) {
          if (r->content.empty()) msg["content"] = nullptr;
          njson calls = njson::array();
          for (const auto& c : r->calls) calls.push_back(tool_call_json(c));
          msg["tool_calls"] = calls;
        }
        njson out{{"id", id},
                  {"object", "chat.completion"},
                  {"created", created},
                  {"model", model_id},
                  {"system_fingerprint", "cedar"},
                  {"choices", njson::array({njson{{"index", 0}, {"message", msg}, {"logprobs", nullptr},
                                                  {"finish_reason", r->finish_reason}}})},
                  {"usage", usage_json(*r)}};
        res.set_content(out.dump(), "application/json");
        return;
      }

      // Streaming: the whole generation runs inside the content provider, one SSE event per
      // delta; a failed write (client gone) stops the generation.
      res.set_header("Cache-Control", "no-cache");
      res.set_chunked_content_provider("text/event-stream", [svc, p, id, created, model_id](size_t, httplib::DataSink& sink) {
        auto chunk = [&](njson delta, const njson& finish) {
          njson c{{"id", id},
                  {"object", "chat.completion.chunk"},
                  {"created", created},
                  {"model", model_id},
                  {"system_fingerprint", "cedar"},
                  {"choices", njson::array({njson{{"index", 0}, {"delta", std::move(delta)}, {"logprobs", nullptr},
                                                  {"finish_reason", finish}}})}};
          if (p.include_usage) c["usage"] = nullptr;
          return c;
        };
        auto send = [&](const njson& j) {
          std::string line = "data: " + j.dump() + "\n\n";
          return sink.write(line.data(), line.size());
        };
        bool ok = send(chunk(njson{{"role", "assistant"}, {"content", ""}}, nullptr));
        completion_sink cs;
        cs.content = [&](std::string_view text) {
          return ok = ok && send(chunk(njson{{"content", std::string(text)}}, nullptr));
        };
        cs.tool_call = [&](const completion_call& c, int index) {
          njson first{{"index", index}, {"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", ""}}}};
          ok = ok && send(chunk(njson{{"tool_calls", njson::array({first})}}, nullptr));
          njson args{{"index", index}, {"function", {{"arguments", c.arguments_json}}}};
          return ok = ok && send(chunk(njson{{"tool_calls", njson::array({args})}}, nullptr));
        };
        auto r = ok ? svc->complete(p.req, cs) : result<completion_result>(make_error(errc::cancelled, "client went away"));
        if (!ok) return false;
        if (!r) {
          send(njson::parse(json_error(r.err().message, status_of(r.err()) == 400 ? "invalid_request_error" : "server_error")));
        } else {
          send(chunk(njson::object(), r->finish_reason));
          if (p.include_usage) {
            njson u = chunk(njson::object(), nullptr);
            u["choices"] = njson::array();
            u["usage"] = usage_json(*r);
            send(u);
          }
        }
        std::string done = "data: [DONE]\n\n";
        sink.write(done.data(), done.size());
        sink.done();
        return true;
      });
    });
  };
}

}  // namespace cedar::runtime
