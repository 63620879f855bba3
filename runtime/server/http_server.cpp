// The HTTP server: token file, authentication, CORS, JSON errors, the listener thread.
// Design notes in http_server.hpp.
#include "runtime/server/http_server.hpp"

#include <chrono>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "kernels/base/log.hpp"
#include "runtime/cedar.hpp"
#include "runtime/runtime_impl.hpp"
#include "runtime/server/request_parse.hpp"
#include "tools_mcp/json.hpp"

namespace cedar::runtime {

namespace fs = std::filesystem;
using njson = nlohmann::json;

std::string json_error(const std::string& message, const std::string& type, const std::string& param,
                       const std::string& code) {
  njson e{{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (!param.empty()) e["param"] = param;
  if (!code.empty()) e["code"] = code;
  return cedar::tools::json_dump(njson{{"error", e}});
}

void send_error(httplib::Response& res, int status, const std::string& message, const std::string& param,
                const std::string& code) {
  const char* type = status == 401   ? "authentication_error"
                     : status == 404 ? "not_found_error"
                     : status >= 500 ? "server_error"
                                     : "invalid_request_error";
  res.status = status;
  res.set_content(json_error(message, type, param, code), "application/json");
}

// ============================================================================================
// token
// ============================================================================================
namespace {

bool valid_token(const std::string& t) {
  if (t.size() != 64) return false;
  for (char c : t)
    if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

result<std::string> new_token() {
  std::ifstream f("/dev/urandom", std::ios::binary);
  uint8_t b[32];
  if (!f.read(reinterpret_cast<char*>(b), sizeof b)) return make_error(errc::io, "/dev/urandom: cannot read");
  static const char* hex = "0123456789abcdef";
  std::string t;
  for (uint8_t x : b) {
    t += hex[x >> 4];
    t += hex[x & 15];
  }
  return t;
}

}  // namespace

result<std::string> load_or_create_token(const std::string& path, bool* created) {
  if (created) *created = false;
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    if (st.st_mode & (S_IRWXG | S_IRWXO)) {
      char mode[8];
      std::snprintf(mode, sizeof mode, "%03o", unsigned(st.st_mode & 0777));
      return make_error(errc::invalid_argument, path + ": token file is open to group or others (mode " + mode +
                                                    "); run `chmod 600 " + path + "`");
    }
    std::ifstream f(path);
    std::string t;
    std::getline(f, t);
    while (!t.empty() && (t.back() == '\n' || t.back() == '\r' || t.back() == ' ')) t.pop_back();
    if (!valid_token(t))
      return make_error(errc::invalid_format, path + ": expected a 64-hex-digit token (delete the file to make a new one)");
    return t;
  }
  std::error_code ec;
  if (fs::path(path).has_parent_path()) fs::create_directories(fs::path(path).parent_path(), ec);
  auto t = new_token();
  if (!t) return t;
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return make_error(errc::io, path + ": cannot create the token file: " + std::strerror(errno));
  std::string line = *t + "\n";
  bool ok = ::write(fd, line.data(), line.size()) == ssize_t(line.size());
  ::close(fd);
  if (!ok) return make_error(errc::io, path + ": cannot write the token file");
  if (created) *created = true;
  return t;
}

// ============================================================================================
// server
// ============================================================================================
std::string http_server::url() const {
  std::string h = opts_.host == "0.0.0.0" ? "127.0.0.1" : opts_.host;
  if (h.find(':') != std::string::npos) h = "[" + h + "]";
  return "http://" + h + ":" + std::to_string(port_);
}

bool http_server::authorized(const httplib::Request& req) const {
  std::vector<std::string> cookies;
  for (size_t i = 0; i < req.get_header_value_count("Cookie"); ++i) cookies.push_back(req.get_header_value("Cookie", i));
  return request_authorized(req.get_header_value("Authorization"), cookies, k_token_cookie, token_);
}

result<std::unique_ptr<http_server>> http_server::start(agent_runtime& rt, serve_options opts,
                                                        std::vector<route_mount> mounts) {
  if (opts.port < 0 || opts.port > 65535)
    return make_error(errc::invalid_argument, "port " + std::to_string(opts.port) + ": expected 0-65535");
  if (opts.token_file.empty()) {
    fs::path store(rt.internals().opts.store_path);
    opts.token_file = (store.has_parent_path() ? store.parent_path() / "serve.token" : fs::path("serve.token")).string();
  }
  std::unique_ptr<http_server> s(new http_server(rt, opts));
  auto tok = load_or_create_token(s->opts_.token_file, &s->token_created_);
  if (!tok) return tok.take_err();
  s->token_ = *tok;

  httplib::Server& svr = s->svr_;
  int threads = std::max(2, opts.threads);
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  http_server* self = s.get();
  const bool cors = opts.cors;
  svr.set_pre_routing_handler([self, cors](const httplib::Request& req, httplib::Response& res) {
    if (cors) {
      res.set_header("Access-Control-Allow-Origin", req.has_header("Origin") ? req.get_header_value("Origin") : "*");
      res.set_header("Vary", "Origin");
      res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type");
      res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
      if (req.method == "OPTIONS") {
        res.status = 204;
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    if (self->authorized(req)) return httplib::Server::HandlerResponse::Unhandled;
    // A browser's first visit: GET <page>?token=... sets the cookie that authenticates the rest.
    if (req.method == "GET" && req.path.compare(0, 4, "/v1/") != 0 && req.has_param("token") &&
        equal_ct(req.get_param_value("token"), self->token_)) {
      res.set_header("Set-Cookie", std::string(k_token_cookie) + "=" + self->token_ +
                                       "; HttpOnly; SameSite=Strict; Path=/");
      return httplib::Server::HandlerResponse::Unhandled;
    }
    send_error(res, 401,
               "missing or wrong bearer token: send `Authorization: Bearer <token>` (the token is in " +
                   self->opts_.token_file + ")",
               "", "invalid_api_key");
    return httplib::Server::HandlerResponse::Handled;
  });
  svr.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 404) send_error(res, 404, "no route for " + req.method + " " + req.path, "", "unknown_route");
    else send_error(res, res.status, "request failed with HTTP " + std::to_string(res.status));
  });
  svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = std::string("internal error: ") + e.what();
    } catch (...) {
    }
    send_error(res, 500, what);
  });
  for (auto& m : mounts)
    if (m) m(svr, rt);

  if (opts.port == 0) s->port_ = svr.bind_to_any_port(opts.host);
  else s->port_ = svr.bind_to_port(opts.host, opts.port) ? opts.port : -1;
  if (s->port_ <= 0)
    return make_error(errc::io, "cannot listen on " + opts.host + ":" + std::to_string(opts.port) +
                                    " (in use, or not a local address)");
  s->thread_ = std::thread([self] {
    self->svr_.listen_after_bind();
    self->listen_returned_ = true;
  });
  // stop() only takes effect once the accept loop runs (httplib's stop() is a no-op before
  // is_running()): wait for it, so a stop right after start cannot leave the loop running and
  // the join hanging (found by the serve SIGINT/SIGTERM test).
  for (int i = 0; i < 5000 && !svr.is_running() && !s->listen_returned_; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return s;
}

void http_server::stop() {
  svr_.stop();
  if (thread_.joinable()) thread_.join();
}

http_server::~http_server() { stop(); }

}  // namespace cedar::runtime
