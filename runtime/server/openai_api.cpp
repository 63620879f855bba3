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
#include "runtime/server/request_parse.hpp"
#include "tools_mcp/json.hpp"

namespace cedar::runtime {

using njson = nlohmann::json;

namespace {

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
      res.set_content(cedar::tools::json_dump(njson{{"object", "list"}, {"data", njson::array({model_json(model_id)})}}), "application/json");
    });
    svr.Get(R"(/v1/models/([^/]+))", [model_id](const httplib::Request& req, httplib::Response& res) {
      if (req.matches[1] != model_id) {
        send_error(res, 404, "the model '" + std::string(req.matches[1]) + "' does not exist (this server has '" + model_id + "')",
                   "model", "model_not_found");
        return;
      }
      res.set_content(cedar::tools::json_dump(model_json(model_id)), "application/json");
    });
    auto wrong_method = [](const httplib::Request& req, httplib::Response& res) {
      send_error(res, 405, req.method + " " + req.path + ": use POST", "", "method_not_allowed");
    };
    svr.Get("/v1/chat/completions", wrong_method);

    svr.Post("/v1/chat/completions", [svc, model_id](const httplib::Request& req, httplib::Response& res) {
      chat_request p;
      if (auto bad = parse_chat_request(req.body, model_id, p)) {
        send_error(res, bad->status, bad->message, bad->param, bad->code);
        return;
      }
      for (const auto& t : p.tools) p.req.tools_json.push_back(tool_schema_json(t));
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
        res.set_content(cedar::tools::json_dump(out), "application/json");
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
          std::string line = "data: " + cedar::tools::json_dump(j) + "\n\n";
          return sink.write(line.data(), line.size());
        };
        bool ok = send(chunk(njson{{"role", "assistant"}, {"content", ""}}, nullptr));
        completion_sink cs;
        cs.content = [&](std::string_view text) {
          return ok = ok && send(chunk(njson{{"content", std::string(text)}}, nullptr));
        };
        // Tool calls as they are parsed: the first fragment names the call, then the pieces of
        // its arguments JSON.
        cs.tool_call_delta = [&](const completion_call_delta& d) {
          njson tc = d.first ? njson{{"index", d.index}, {"id", d.id}, {"type", "function"},
                                     {"function", {{"name", d.name}, {"arguments", ""}}}}
                             : njson{{"index", d.index}, {"function", {{"arguments", d.arguments}}}};
          return ok = ok && send(chunk(njson{{"tool_calls", njson::array({tc})}}, nullptr));
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
