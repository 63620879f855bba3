#include "runtime/builtin_tools.hpp"

#include <cctype>
#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <set>
#include <sstream>

namespace cedar::runtime {

namespace fs = std::filesystem;
using tools::json;

// ============================================================================================
// calculator: exact rationals over 128-bit integers (overflow is an error, never a wrong value)
// ============================================================================================
namespace {

using i128 = __int128;

struct rational {
  i128 n = 0, d = 1;
};

struct calc_error {
  std::string msg;
};

i128 gcd128(i128 a, i128 b) {
  if (a < 0) a = -a;
  if (b < 0) b = -b;
  while (b) {
    i128 t = a % b;
    a = b;
    b = t;
  }
  return a;
}

bool mul_ok(i128 a, i128 b, i128& out) { return !__builtin_mul_overflow(a, b, &out); }
bool add_ok(i128 a, i128 b, i128& out) { return !__builtin_add_overflow(a, b, &out); }

rational norm(rational r) {
  if (r.d < 0) r.n = -r.n, r.d = -r.d;
  i128 g = gcd128(r.n, r.d);
  if (g > 1) r.n /= g, r.d /= g;
  return r;
}

const char* kTooLarge = "number too large";

rational add(rational a, rational b, bool sub) {
  i128 x, y, d;
  if (sub) b.n = -b.n;
  if (!mul_ok(a.n, b.d, x) || !mul_ok(b.n, a.d, y) || !mul_ok(a.d, b.d, d) || !add_ok(x, y, x)) throw calc_error{kTooLarge};
  return norm({x, d});
}
rational mul(rational a, rational b) {
  i128 n, d;
  if (!mul_ok(a.n, b.n, n) || !mul_ok(a.d, b.d, d)) throw calc_error{kTooLarge};
  return norm({n, d});
}
rational div(rational a, rational b) {
  if (b.n == 0) throw calc_error{"division by zero"};
  return mul(a, norm({b.d, b.n}));
}

// Tokens as the data generator splits them: numbers (digits and dots), operators, parens.
struct calc_parser {
  std::vector<std::string> toks;
  size_t pos = 0;

  explicit calc_parser(const std::string& e) {
    for (size_t i = 0; i < e.size();) {
      unsigned char c = (unsigned char)e[i];
      if (std::isspace(c)) {
        ++i;
      } else if (std::isdigit(c) || c == '.') {
        size_t j = i;
        while (j < e.size() && (std::isdigit((unsigned char)e[j]) || e[j] == '.')) ++j;
        toks.push_back(e.substr(i, j - i));
        i = j;
      } else if (std::string_view("+-*/()").find(char(c)) != std::string_view::npos) {
        toks.push_back(std::string(1, char(c)));
        ++i;
      } else {
        throw calc_error{"unexpected character '" + std::string(1, char(c)) + "' at position " + std::to_string(i + 1)};
      }
    }
    if (toks.empty()) throw calc_error{"empty expression"};
  }
  const std::string* peek() const { return pos < toks.size() ? &toks[pos] : nullptr; }
  const std::string* take() { return pos < toks.size() ? &toks[pos++] : nullptr; }

  static rational number(const std::string& t) {
    size_t dot = t.find('.');
    if (t.find('.', dot == std::string::npos ? t.size() : dot + 1) != std::string::npos || t == ".")
      throw calc_error{"bad number '" + t + "'"};
    rational r{0, 1};
    for (char c : t) {
      if (c == '.') continue;
      if (!mul_ok(r.n, 10, r.n) || !add_ok(r.n, c - '0', r.n)) throw calc_error{kTooLarge};
    }
    if (dot != std::string::npos)
      for (size_t k = dot + 1; k < t.size(); ++k)
        if (!mul_ok(r.d, 10, r.d)) throw calc_error{kTooLarge};
    return norm(r);
  }
  rational atom() {
    const std::string* t = take();
    if (!t) throw calc_error{"expression ends too early"};
    if (*t == "(") {
      rational v = expr();
      const std::string* c = take();
      if (!c || *c != ")") throw calc_error{"missing ')'"};
      return v;
    }
    if (*t == "-") {
      rational v = atom();
      v.n = -v.n;
      return v;
    }
    if (std::isdigit((unsigned char)(*t)[0]) || (*t)[0] == '.') return number(*t);
    throw calc_error{"unexpected '" + *t + "'"};
  }
  rational term() {
    rational v = atom();
    while (peek() && (*peek() == "*" || *peek() == "/")) {
      bool is_mul = *take() == "*";
      rational r = atom();
      v = is_mul ? mul(v, r) : div(v, r);
    }
    return v;
  }
  rational expr() {
    rational v = term();
    while (peek() && (*peek() == "+" || *peek() == "-")) {
      bool sub = *take() == "-";
      v = add(v, term(), sub);
    }
    return v;
  }
};

std::string i128_str(i128 v) {
  if (v == 0) return "0";
  bool neg = v < 0;
  std::string s;
  while (v != 0) {
    int digit = int(v % 10);
    s.push_back(char('0' + (digit < 0 ? -digit : digit)));
    v /= 10;
  }
  if (neg) s.push_back('-');
  return {s.rbegin(), s.rend()};
}

// Python: f"{float(v):.4f}".rstrip("0").rstrip(".") with "-0" -> "0".
std::string format_number(rational v) {
  if (v.d == 1) return i128_str(v.n);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.4f", double(v.n) / double(v.d));
  std::string s = buf;
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  if (s == "-0" || s.empty()) s = "0";
  return s;
}

json fn_schema(std::map<std::string, json> props, std::vector<std::string> required) {
  json p = json::object();
  for (auto& [k, v] : props) p[k] = v;
  return json{{"type", "object"}, {"properties", p}, {"required", required}};
}

// Missing or non-string arguments give the data generator's message.
bool str_arg(const json& a, const char* k, std::string& out, tools::tool_result& err) {
  if (!a.is_object() || !a.contains(k) || !a[k].is_string()) {
    err = tools::text_result(std::string("error: missing or non-string argument '") + k + "'", true);
    return false;
  }
  out = a[k].get<std::string>();
  return true;
}

// "a/b", "./a", "." -> a path relative to the root, or an error when it would leave it.
result<fs::path> inside_root(const fs::path& root, const std::string& rel) {
  fs::path p = fs::path(rel).lexically_normal();
  if (p.is_absolute()) return make_error(errc::invalid_argument, "path must be relative to the workspace");
  for (const auto& part : p)
    if (part == "..") return make_error(errc::invalid_argument, "path leaves the workspace");
  std::error_code ec;
  fs::path full = fs::weakly_canonical(root / p, ec);
  fs::path croot = fs::weakly_canonical(root, ec);
  auto [a, b] = std::mismatch(croot.begin(), croot.end(), full.begin(), full.end());
  if (a != croot.end()) return make_error(errc::invalid_argument, "path leaves the workspace");
  return full;
}

}  // namespace

result<std::string> calculate(const std::string& expression) {
  try {
    calc_parser p(expression);
    rational v = p.expr();
    if (p.pos != p.toks.size()) throw calc_error{"unexpected '" + p.toks[p.pos] + "'"};
    return format_number(v);
  } catch (const calc_error& e) {
    return make_error(errc::invalid_argument, e.msg);
  }
}

std::vector<tools::tool> builtin_tools(const std::string& files_root) {
  std::vector<tools::tool> out;
  const json str{{"type", "string"}};

  tools::tool calc;
  calc.name = "calculator";
  calc.description = "Evaluate an arithmetic expression with + - * / and parentheses; returns the exact result.";
  calc.input_schema = fn_schema({{"expression", json{{"type", "string"}, {"description", "e.g. (12 + 30) * 4"}}}}, {"expression"});
  calc.invoke = [](const json& a, const tools::invoke_context&) -> result<tools::tool_result> {
    std::string e;
    tools::tool_result err;
    if (!str_arg(a, "expression", e, err)) return err;
    auto r = calculate(e);
    if (!r) return tools::text_result("error: " + r.err().message, true);
    return tools::text_result(*r);
  };
  out.push_back(std::move(calc));

  auto notes = std::make_shared<std::pair<std::mutex, std::map<std::string, std::string>>>();
  tools::tool save;
  save.name = "notes_save";
  save.description = "Save a short note under a key.";
  save.input_schema = fn_schema({{"key", str}, {"text", str}}, {"key", "text"});
  save.invoke = [notes](const json& a, const tools::invoke_context& ctx) -> result<tools::tool_result> {
    std::string k, t;
    tools::tool_result err;
    if (!str_arg(a, "key", k, err) || !str_arg(a, "text", t, err)) return err;
    std::lock_guard<std::mutex> lk(notes->first);
    notes->second[ctx.session + '\x1f' + k] = t;
    return tools::text_result("saved note '" + k + "'");
  };
  out.push_back(std::move(save));

  tools::tool read;
  read.name = "notes_read";
  read.description = "Read the note saved under a key.";
  read.input_schema = fn_schema({{"key", str}}, {"key"});
  read.invoke = [notes](const json& a, const tools::invoke_context& ctx) -> result<tools::tool_result> {
    std::string k;
    tools::tool_result err;
    if (!str_arg(a, "key", k, err)) return err;
    std::lock_guard<std::mutex> lk(notes->first);
    auto it = notes->second.find(ctx.session + '\x1f' + k);
    if (it == notes->second.end()) return tools::text_result("error: no note named '" + k + "'", true);
    return tools::text_result(it->second);
  };
  out.push_back(std::move(read));

  tools::tool clock;
  clock.name = "clock";
  clock.description = "Current local date and time.";
  clock.input_schema = fn_schema({}, {});
  clock.invoke = [](const json&, const tools::invoke_context&) -> result<tools::tool_result> {
    std::time_t t = std::time(nullptr);
    std::tm tm{};
    localtime_r(&t, &tm);
    char buf[64];
    std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M (%A)", &tm);
    return tools::text_result(buf);
  };
  out.push_back(std::move(clock));

  fs::path root = files_root.empty() ? fs::path(".") : fs::path(files_root);
  tools::tool fread;
  fread.name = "file_read";
  fread.description = "Read a text file from the workspace.";
  fread.input_schema = fn_schema({{"path", json{{"type", "string"}, {"description", "relative path"}}}}, {"path"});
  fread.invoke = [root](const json& a, const tools::invoke_context&) -> result<tools::tool_result> {
    std::string p;
    tools::tool_result err;
    if (!str_arg(a, "path", p, err)) return err;
    auto full = inside_root(root, p);
    if (!full) return tools::text_result("error: " + full.err().message + ": " + p, true);
    std::error_code ec;
    if (!fs::is_regular_file(*full, ec)) return tools::text_result("error: no such file: " + p, true);
    if (fs::file_size(*full, ec) > (1u << 20)) return tools::text_result("error: file larger than 1 MiB: " + p, true);
    std::ifstream f(*full, std::ios::binary);
    std::ostringstream ss;
    ss << f.rdbuf();
    return tools::text_result(ss.str());
  };
  out.push_back(std::move(fread));

  tools::tool flist;
  flist.name = "file_list";
  flist.description = "List a workspace directory; directories end with '/'.";
  flist.input_schema = fn_schema({{"path", json{{"type", "string"}, {"description", "relative path, '.' for the root"}}}}, {"path"});
  flist.invoke = [root](const json& a, const tools::invoke_context&) -> result<tools::tool_result> {
    std::string p;
    tools::tool_result err;
    if (!str_arg(a, "path", p, err)) return err;
    auto full = inside_root(root, p.empty() ? "." : p);
    if (!full) return tools::text_result("error: " + full.err().message + ": " + p, true);
    std::error_code ec;
    if (!fs::is_directory(*full, ec)) return tools::text_result("error: no such directory: " + p, true);
    std::set<std::string> names;
    for (const auto& e : fs::directory_iterator(*full, ec))
      names.insert(e.path().filename().string() + (e.is_directory() ? "/" : ""));
    std::string text;
    for (const auto& n : names) text += (text.empty() ? "" : "\n") + n;
    return tools::text_result(text);
  };
  out.push_back(std::move(flist));
  return out;
}

}  // namespace cedar::runtime
