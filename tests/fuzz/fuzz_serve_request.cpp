// Fuzz target: the request path of `cedar serve` (runtime/server/request_parse.hpp), without
// sockets and without the runtime.
//
// Input: byte 0 picks the mode, the rest is the payload.
//   even: the payload is a POST /v1/chat/completions body, given straight to
//         parse_chat_request (the function openai_api.cpp's handler calls first).
//   odd:  the payload is a raw HTTP/1.1 request (request line, headers, body, any bytes). It
//         goes through cpp-httplib's request parser (Server::process_request on an in-memory
//         stream) to routes wired like http_server.cpp and openai_api.cpp: authentication by
//         request_authorized (Bearer header or cookie) and the `?token=` check before routing,
//         then GET /v1/models[/{id}] and POST /v1/chat/completions -> parse_chat_request.
// Checked: no crash/UB/leak/timeout; an accepted body satisfies the documented ranges
// (messages non-empty, max_tokens 1..2^20, temperature 0..2, top_p in (0, 1], up to 4 stop
// strings, tool names non-empty, tool_choice "none" shows no tools and drops calls); errors are
// 400 or 404 with a message; authentication accepts exactly the token.
// Built from runtime/server/request_parse.cpp alone (tests/fuzz/CMakeLists.txt).
#include <httplib.h>

#include <string>

#include "runtime/server/request_parse.hpp"
#include "tests/fuzz/fuzz_util.hpp"

using namespace cedar::runtime;
using cedar::fuzz::fuzz_bytes;
using cedar::fuzz::fuzz_require;

namespace {

constexpr const char* kToken = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
constexpr const char* kModel = "cedar-agent-tiny";

void check_body(std::string_view body) {
  chat_request p;
  auto bad = parse_chat_request(body, kModel, p);
  if (bad) {
    fuzz_require(bad->status == 400 || bad->status == 404, "serve: an error status other than 400/404");
    fuzz_require(!bad->message.empty(), "serve: an error without a message");
    return;
  }
  const auto& r = p.req;
  fuzz_require(!r.messages.empty(), "serve: accepted without messages");
  fuzz_require(r.max_tokens >= 1 && r.max_tokens <= (1 << 20), "serve: max_tokens out of range");
  fuzz_require(r.temperature >= 0 && r.temperature <= 2, "serve: temperature out of range");
  fuzz_require(r.top_p > 0 && r.top_p <= 1, "serve: top_p out of range");
  fuzz_require(r.stop.size() <= 4, "serve: more than 4 stop strings");
  fuzz_require(r.tools_json.empty(), "serve: the parser rendered tools (the handler does)");
  for (const auto& t : p.tools) fuzz_require(!t.name.empty(), "serve: a tool without a name");
  if (r.drop_calls) fuzz_require(p.tools.empty() && r.forced_prefix.empty(), "serve: tool_choice none with tools shown");
  if (!r.forced_prefix.empty()) fuzz_require(!p.tools.empty(), "serve: a forced call without tools");
}

// A request as bytes in, the response bytes out (discarded).
class memory_stream : public httplib::Stream {
 public:
  explicit memory_stream(std::string_view in) : in_(in) {}
  bool is_readable() const override { return pos_ < in_.size(); }
  bool is_writable() const override { return true; }
  ssize_t read(char* ptr, size_t size) override {
    size_t n = std::min(size, in_.size() - pos_);
    std::memcpy(ptr, in_.data() + pos_, n);
    pos_ += n;
    return ssize_t(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    out_ += size;
    return ssize_t(size);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = "127.0.0.1";
    port = 40000;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip = "127.0.0.1";
    port = 8377;
  }
  socket_t socket() const override { return INVALID_SOCKET; }

 private:
  std::string_view in_;
  size_t pos_ = 0;
  size_t out_ = 0;
};

class fuzz_server : public httplib::Server {
 public:
  fuzz_server() {
    set_pre_routing_handler([](const httplib::Request& req, httplib::Response& res) {
      std::vector<std::string> cookies;
      for (size_t i = 0; i < req.get_header_value_count("Cookie"); ++i) cookies.push_back(req.get_header_value("Cookie", i));
      std::string auth = req.get_header_value("Authorization");
      bool ok = request_authorized(auth, cookies, "cedar_token", kToken);
      fuzz_require(ok == (auth == std::string("Bearer ") + kToken) || !cookies.empty(),
                   "serve: the Authorization header decided wrongly");
      if (ok) return HandlerResponse::Unhandled;
      if (req.method == "GET" && req.path.compare(0, 4, "/v1/") != 0 && req.has_param("token") &&
          equal_ct(req.get_param_value("token"), kToken))
        return HandlerResponse::Unhandled;
      res.status = 401;
      return HandlerResponse::Handled;
    });
    Get("/v1/models", [](const httplib::Request&, httplib::Response& res) { res.set_content("{}", "application/json"); });
    Get(R"(/v1/models/([^/]+))", [](const httplib::Request& req, httplib::Response& res) {
      res.status = req.matches[1] == kModel ? 200 : 404;
    });
    Post("/v1/chat/completions", [](const httplib::Request& req, httplib::Response& res) {
      check_body(req.body);
      res.status = 200;
    });
  }
  bool feed(std::string_view bytes) {
    memory_stream s(bytes);
    bool closed = false;
    return process_request(s, /*close_connection=*/true, closed, [](httplib::Request&) {});
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz_bytes in(data, size);
  const uint8_t mode = in.take_byte();
  std::string_view payload = in.rest();
  if (mode % 2 == 0) {
    check_body(payload);
    // The cookie parser on the same bytes, and the token comparison.
    std::string v = cookie_value(payload, "cedar_token");
    fuzz_require(v.size() <= payload.size(), "serve: a cookie value longer than its header");
    fuzz_require(request_authorized(std::string("Bearer ") + kToken, {}, "cedar_token", kToken),
                 "serve: the token itself is refused");
    fuzz_require(!request_authorized(payload, {}, "cedar_token", kToken) || payload == std::string("Bearer ") + kToken,
                 "serve: a header other than the token accepted");
    return 0;
  }
  static fuzz_server* server = new fuzz_server();  // routes are built once
  server->feed(payload);
  return 0;
}
