// http_server — cedar's one HTTP server (cpp-httplib): authentication, CORS, JSON errors, and
// a background listener. The OpenAI API (openai_api.hpp) and the dashboard mount their routes
// on it through `mounts`, before it starts listening.
//
// Authentication: a random 256-bit token (64 hex characters), generated at the first start and
// kept in a 0600 file (default: <store dir>/serve.token; a file readable by group or others is
// refused). Every request must carry `Authorization: Bearer <token>`, or the cookie that a
// browser gets from one GET of a page with `?token=<token>` (HttpOnly, SameSite=Strict; any GET
// outside /v1/, e.g. the dashboard page; EventSource cannot send headers). Anything else gets
// 401 with an OpenAI-style JSON error. Token comparison is constant-time.
// CORS headers only with serve_options::cors (then OPTIONS preflights are answered without
// authentication). Binds 127.0.0.1 unless told otherwise.
// Errors that no handler answered (404 unknown route, exceptions -> 500) are OpenAI-style JSON.
//
// Lifetime: start() binds and listens on its own thread; stop() (or the destructor) stops
// listening and joins it. The runtime must outlive the server.
#pragma once

#include <httplib.h>

#include <functional>
#include <memory>
#include <string>
#include <atomic>
#include <thread>
#include <vector>

#include "kernels/base/result.hpp"

namespace cedar {
class agent_runtime;
}

namespace cedar::runtime {

struct serve_options {
  std::string host = "127.0.0.1";
  int port = 8377;           // 0: any free port
  std::string token_file;    // default: <dir of the store>/serve.token
  bool cors = false;
  int threads = 32;          // request threads (streams and SSE each hold one while open)
};

// Adds routes to the server before it listens (the OpenAI API, the dashboard).
using route_mount = std::function<void(httplib::Server&, agent_runtime&)>;

inline constexpr const char* k_token_cookie = "cedar_token";

// {"error": {"message", "type", "param", "code"}} (param/code null when empty).
std::string json_error(const std::string& message, const std::string& type, const std::string& param = {},
                       const std::string& code = {});
// Sets status + an OpenAI-style JSON error body; the type follows from the status.
void send_error(httplib::Response& res, int status, const std::string& message, const std::string& param = {},
                const std::string& code = {});

// Reads the token file, or creates it (0600) with a new random token; `created` tells which.
result<std::string> load_or_create_token(const std::string& path, bool* created = nullptr);

class http_server {
 public:
  static result<std::unique_ptr<http_server>> start(agent_runtime& rt, serve_options opts,
                                                    std::vector<route_mount> mounts = {});
  ~http_server();

  int port() const { return port_; }
  const std::string& host() const { return opts_.host; }
  const std::string& token() const { return token_; }
  const std::string& token_file() const { return opts_.token_file; }
  bool token_created() const { return token_created_; }
  std::string url() const;  // http://host:port
  httplib::Server& routes() { return svr_; }
  void stop();

 private:
  http_server(agent_runtime& rt, serve_options opts) : rt_(rt), opts_(std::move(opts)) {}
  bool authorized(const httplib::Request& req) const;

  agent_runtime& rt_;
  serve_options opts_;
  httplib::Server svr_;
  std::thread thread_;
  std::atomic<bool> listen_returned_{false};  // the listen thread is done (start waits for ready)
  std::string token_;
  bool token_created_ = false;
  int port_ = 0;
};

}  // namespace cedar::runtime
