// model::chat_format — see chat_format.hpp. Sections: Python-style JSON, message parsing,
// preprocessing (merge tool messages, sort results, drop old reasoning), rendering.
#include "model/chat_format.hpp"

#include <simdjson.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <unordered_map>

#include "model/dsml.hpp"

namespace cedar::model {

namespace {

constexpr std::string_view k_bos = tokens::bos;
constexpr std::string_view k_eos = tokens::eos;

// ============================================================================================
// Python-style JSON (json.dumps(ensure_ascii=False))
// ============================================================================================

// repr(float): shortest round-trip digits; fixed notation for exponents -4..15, else d.ddde±XX.
std::string python_float(double d) {
  if (d != d) return "NaN";
  if (d == 1.0 / 0.0) return "Infinity";
  if (d == -1.0 / 0.0) return "-Infinity";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string s(buf, r.ptr);  // e.g. "-1.2345e+17", "5e-05"
  std::string sign;
  if (s[0] == '-') {
    sign = "-";
    s.erase(0, 1);
  }
  const size_t epos = s.find('e');
  std::string digits = s.substr(0, epos);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exp = std::stoi(s.substr(epos + 1));
  if (exp >= -4 && exp < 16) {
    if (exp >= 0) {
      std::string ip = digits.substr(0, std::min<size_t>(digits.size(), exp + 1));
      while (static_cast<int>(ip.size()) < exp + 1) ip.push_back('0');
      std::string fp = digits.size() > static_cast<size_t>(exp + 1) ? digits.substr(exp + 1) : "0";
      return sign + ip + "." + fp;
    }
    return sign + "0." + std::string(-exp - 1, '0') + digits;
  }
  std::string m = digits.substr(0, 1);
  if (digits.size() > 1) m += "." + digits.substr(1);
  char e[16];
  std::snprintf(e, sizeof e, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
  return sign + m + e;
}

// The fields of a JSON object as a Python dict holds them: a repeated key keeps its first
// position and its last value.
using json_fields = std::vector<std::pair<std::string_view, simdjson::dom::element>>;
result<json_fields> dict_fields(simdjson::dom::element e) {
  json_fields fields;
  std::unordered_map<std::string_view, size_t> at;
  simdjson::dom::object obj;
  if (e.get_object().get(obj)) return make_error(errc::internal, "json: object expected");
  for (auto [k, v] : obj) {
    auto it = at.find(k);
    if (it != at.end()) {
      fields[it->second].second = v;
    } else {
      at.emplace(k, fields.size());
      fields.emplace_back(k, v);
    }
  }
  return fields;
}

result<std::string> dump_element(simdjson::dom::element e) {
  using simdjson::dom::element_type;
  switch (e.type()) {
    case element_type::NULL_VALUE:
      return std::string("null");
    case element_type::BOOL:
      return std::string(bool(e.get_bool().value()) ? "true" : "false");
    case element_type::INT64:
      return std::to_string(int64_t(e.get_int64().value()));
    case element_type::UINT64:
      return std::to_string(uint64_t(e.get_uint64().value()));
    case element_type::DOUBLE:
      return python_float(double(e.get_double().value()));
    case element_type::STRING:
      return json_quote(std::string_view(e.get_string().value()));
    case element_type::ARRAY: {
      std::string out = "[";
      bool first = true;
      simdjson::dom::array arr;
      if (e.get_array().get(arr)) return make_error(errc::internal, "json: array expected");
      for (simdjson::dom::element v : arr) {
        auto s = dump_element(v);
        if (!s) return s;
        if (!first) out += ", ";
        first = false;
        out += *s;
      }
      return out + "]";
    }
    case element_type::OBJECT: {
      auto fields = dict_fields(e);
      if (!fields) return fields.take_err();
      std::string out = "{";
      for (size_t i = 0; i < fields->size(); ++i) {
        auto s = dump_element((*fields)[i].second);
        if (!s) return s;
        if (i) out += ", ";
        out += json_quote((*fields)[i].first) + ": " + *s;
      }
      return out + "}";
    }
  }
  return make_error(errc::internal, "json: unknown element type");
}

// ============================================================================================
// Internal message form (after merging tool messages)
// ============================================================================================

struct block {
  bool is_result = false;
  std::string id;  // tool_result: the call id it answers
  std::string text;
};

struct msg {
  chat_role role;
  const chat_message* src;    // null for a user message made of tool results
  std::vector<block> blocks;  // user messages
  bool has_blocks = false;
  bool drop_reasoning = false;
};

bool has_tools(const msg& m) { return m.src && !m.src->tools_json.empty(); }

int last_user_index(const std::vector<msg>& ms) {
  for (int k = static_cast<int>(ms.size()) - 1; k >= 0; --k) {
    const chat_role r = ms[k].role;
    if (r == chat_role::user || r == chat_role::developer || (r == chat_role::system && k > 0)) return k;
  }
  return -1;
}

std::string effort_line(int budget) {
  return "Reasoning Effort: " + std::to_string(budget) +
         " (range 1-100, the higher the value, the more thorough the reasoning)\n\n";
}

std::string tools_section(const std::vector<std::string>& lines) {
  std::string s =
      "## Tools\n\n"
      "You have access to a set of tools to help answer the user's question. You can invoke tools by "
      "writing a \"<｜DSML｜ calls>\" block like the following:\n\n"
      "<｜DSML｜ calls>\n"
      "<｜DSML｜ invoke name=\"$TOOL_NAME\">\n"
      "<｜DSML｜ parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜ "
      "parameter>\n"
      "...\n"
      "</｜DSML｜ invoke>\n"
      "<｜DSML｜ invoke name=\"$TOOL_NAME2\">\n"
      "...\n"
      "</｜DSML｜ invoke>\n"
      "</｜DSML｜ calls>\n\n"
      "String parameters should be specified as is and set `string=\"true\"`. For all other types "
      "(numbers, booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n"
      "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
      "<think>...</think> BEFORE any tool calls or final response.\n\n"
      "Otherwise, output directly after </think> with tool calls or final response.\n\n"
      "### Available Tool Schemas\n\n";
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i) s += "\n";
    s += lines[i];
  }
  s += "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool "
       "calls.\n";
  return s;
}

result<std::string> render_tools_of(const chat_message& m, size_t index) {
  std::vector<std::string> lines;
  for (size_t t = 0; t < m.tools_json.size(); ++t) {
    simdjson::dom::parser parser;
    simdjson::dom::element e, fn;
    const std::string where = "message " + std::to_string(index) + " tools[" + std::to_string(t) + "]";
    if (parser.parse(m.tools_json[t]).get(e))
      return make_error(errc::invalid_argument, where + ": not valid JSON");
    if (!e.is_object() || e["function"].get(fn))
      return make_error(errc::invalid_argument, where + ": lacks its 'function' object");
    auto s = dump_element(fn);
    if (!s) return s;
    lines.push_back(std::move(*s));
  }
  return tools_section(lines);
}

result<std::string> render_arguments(const chat_tool_call& c) {
  simdjson::dom::parser parser;
  simdjson::dom::element e;
  if (parser.parse(c.arguments_json).get(e))
    return make_error(errc::invalid_argument, "tool call '" + c.name + "': arguments are not valid JSON");
  if (!e.is_object())
    return make_error(errc::invalid_argument, "tool call '" + c.name + "': arguments must be a JSON object");
  auto deduped = dict_fields(e);
  if (!deduped) return deduped.take_err();
  const auto& fields = *deduped;
  std::string out;
  for (size_t i = 0; i < fields.size(); ++i) {
    const bool is_str = fields[i].second.is_string();
    std::string val;
    if (is_str) {
      val = std::string(std::string_view(fields[i].second.get_string().value()));
    } else {
      auto s = dump_element(fields[i].second);
      if (!s) return s;
      val = std::move(*s);
    }
    if (i) out += "\n";
    out += "<｜DSML｜ parameter name=\"" + std::string(fields[i].first) + "\" string=\"" +
           (is_str ? "true" : "false") + "\">" + val + "</｜DSML｜ parameter>";
  }
  return out;
}

}  // namespace

// ============================================================================================
// Public helpers
// ============================================================================================

const char* chat_role_name(chat_role r) {
  switch (r) {
    case chat_role::system:
      return "system";
    case chat_role::developer:
      return "developer";
    case chat_role::user:
      return "user";
    case chat_role::assistant:
      return "assistant";
    case chat_role::tool:
      return "tool";
    case chat_role::latest_reminder:
      return "latest_reminder";
  }
  return "?";
}

result<int> reasoning_effort_from(std::string_view s) {
  if (s == "low") return 25;
  if (s == "high") return 50;
  if (s == "xhigh") return 75;
  if (s == "max") return 100;
  int v = 0;
  auto r = std::from_chars(s.data(), s.data() + s.size(), v);
  if (r.ec == std::errc() && r.ptr == s.data() + s.size() && v >= 1 && v <= 100) return v;
  return make_error(errc::invalid_argument, "reasoning effort '" + std::string(s) +
                                                "': expected low, high, xhigh, max or a number 1-100");
}

result<std::string> json_python_dump(std::string_view json) {
  simdjson::dom::parser parser;
  simdjson::padded_string p(json);
  simdjson::dom::element e;
  if (auto err = parser.parse(p).get(e))
    return make_error(errc::invalid_format, std::string("not valid JSON: ") + simdjson::error_message(err));
  return dump_element(e);
}

result<std::string> render_tool_calls(std::span<const chat_tool_call> calls) {
  std::string out = "<｜DSML｜ calls>\n";
  for (size_t i = 0; i < calls.size(); ++i) {
    auto args = render_arguments(calls[i]);
    if (!args) return args;
    if (i) out += "\n";
    out += "<｜DSML｜ invoke name=\"" + calls[i].name + "\">\n" + *args + "\n</｜DSML｜ invoke>";
  }
  return out + "\n</｜DSML｜ calls>";
}

void attach_tools(std::vector<chat_message>& messages, std::span<const std::string> tools_json) {
  if (tools_json.empty()) return;
  if (messages.empty() || messages[0].role != chat_role::system) {
    chat_message sys;
    sys.role = chat_role::system;
    messages.insert(messages.begin(), sys);
  }
  messages[0].tools_json.assign(tools_json.begin(), tools_json.end());
}

// ============================================================================================
// Rendering
// ============================================================================================

result<std::string> render_chat(std::span<const chat_message> messages, const chat_options& opts) {
  if (opts.reasoning_effort < 1 || opts.reasoning_effort > 100)
    return make_error(errc::invalid_argument,
                      "reasoning effort " + std::to_string(opts.reasoning_effort) + ": expected 1-100");
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& m = messages[i];
    for (const std::string* f : {&m.content, &m.reasoning})
      if (!utf8_valid(*f))
        return make_error(errc::invalid_argument,
                          "message " + std::to_string(i) + ": text is not valid UTF-8");
  }
  const bool thinking = opts.mode == chat_mode::thinking;

  // 1. Merge tool messages (and user messages following them) into user messages of blocks.
  std::vector<msg> ms;
  for (const auto& m : messages) {
    if (m.role == chat_role::tool || m.role == chat_role::user) {
      block b{m.role == chat_role::tool, m.tool_call_id, m.content};
      if (!ms.empty() && ms.back().role == chat_role::user && ms.back().has_blocks) {
        ms.back().blocks.push_back(std::move(b));
      } else {
        msg u{chat_role::user, m.role == chat_role::user ? &m : nullptr, {std::move(b)}, true, false};
        ms.push_back(std::move(u));
      }
    } else {
      ms.push_back(msg{m.role, &m, {}, false, false});
    }
  }
  // 2. Sort each user message's tool results into the latest assistant's call order.
  std::unordered_map<std::string, int> order;
  for (auto& m : ms) {
    if (m.role == chat_role::assistant && !m.src->tool_calls.empty()) {
      order.clear();
      for (size_t k = 0; k < m.src->tool_calls.size(); ++k)
        if (!m.src->tool_calls[k].id.empty()) order[m.src->tool_calls[k].id] = static_cast<int>(k);
    } else if (m.role == chat_role::user && !order.empty()) {
      std::vector<block> results;
      for (auto& b : m.blocks)
        if (b.is_result) results.push_back(b);
      if (results.size() > 1) {
        auto key = [&](const block& b) {
          auto it = order.find(b.id);
          return it == order.end() ? 0 : it->second;
        };
        std::stable_sort(results.begin(), results.end(),
                         [&](const block& a, const block& b) { return key(a) < key(b); });
        size_t r = 0;
        for (auto& b : m.blocks)
          if (b.is_result) b = results[r++];
      }
    }
  }
  // 3. Thinking mode without tools: drop old reasoning (and old developer turns).
  bool any_tools = false;
  for (const auto& m : ms) any_tools = any_tools || has_tools(m);
  const bool drop = opts.drop_thinking && !any_tools;
  if (thinking && drop) {
    const int last = last_user_index(ms);
    std::vector<msg> kept;
    for (int k = 0; k < static_cast<int>(ms.size()); ++k) {
      const chat_role r = ms[k].role;
      if (r == chat_role::user || r == chat_role::system || r == chat_role::tool ||
          r == chat_role::latest_reminder || k >= last) {
        kept.push_back(ms[k]);
      } else if (r == chat_role::assistant) {
        kept.push_back(ms[k]);
        kept.back().drop_reasoning = true;
      }
    }
    ms.swap(kept);
  }

  // 4. Render.
  const int last_user = last_user_index(ms);
  std::string out = opts.add_bos ? std::string(k_bos) : std::string();
  for (int k = 0; k < static_cast<int>(ms.size()); ++k) {
    const msg& m = ms[k];
    const std::string effort = (k == 0 && thinking) ? effort_line(opts.reasoning_effort) : std::string();
    if (k == 0 && (!effort.empty() || m.role == chat_role::system)) out += tokens::system;
    out += effort;
    switch (m.role) {
      case chat_role::system:
        if (k > 0) out += tokens::system;
        out += m.src->content;
        if (has_tools(m)) {
          auto t = render_tools_of(*m.src, k);
          if (!t) return t;
          out += "\n\n" + *t;
        }
        break;
      case chat_role::developer:
        if (m.src->content.empty())
          return make_error(errc::invalid_argument,
                            "message " + std::to_string(k) + ": a developer message needs content");
        out += tokens::user;
        out += m.src->content;
        if (has_tools(m)) {
          auto t = render_tools_of(*m.src, k);
          if (!t) return t;
          out += "\n\n" + *t;
        }
        break;
      case chat_role::user:
        out += tokens::user;
        for (size_t b = 0; b < m.blocks.size(); ++b) {
          if (b) out += "\n\n";
          if (m.blocks[b].is_result)
            out += "<tool_result>" + m.blocks[b].text + "</tool_result>";
          else
            out += m.blocks[b].text;
        }
        break;
      case chat_role::latest_reminder:
        out += tokens::latest_reminder;
        out += m.src->content;
        break;
      case chat_role::assistant: {
        std::string dsml;
        if (!m.src->tool_calls.empty()) {
          auto b = render_tool_calls(m.src->tool_calls);
          if (!b) return b;
          dsml = "\n\n" + *b;
        }
        if (thinking && (!drop || k > last_user)) {
          if (!m.drop_reasoning) out += m.src->reasoning;
          out += tokens::think_end;
        }
        out += m.src->content + dsml;
        if (!m.src->wo_eos) out += k_eos;
        break;
      }
      case chat_role::tool:
        return make_error(errc::internal, "chat_format: a tool message survived merging");
    }
    // The generation prefix follows a user-side turn unless another user-side turn follows.
    if (k + 1 < static_cast<int>(ms.size()) && ms[k + 1].role != chat_role::assistant &&
        ms[k + 1].role != chat_role::latest_reminder)
      continue;
    if (m.role == chat_role::user || m.role == chat_role::developer ||
        (m.role == chat_role::system && k > 0)) {
      out += tokens::assistant;
      out += (thinking && (!drop || k >= last_user)) ? tokens::think_start : tokens::think_end;
    }
  }
  return out;
}

result<std::vector<int32_t>> render_chat_ids(const tokenizer& tok, std::span<const chat_message> messages,
                                             const chat_options& opts) {
  auto text = render_chat(messages, opts);
  if (!text) return text.take_err();
  return tok.encode(*text, true);
}

// ============================================================================================
// OpenAI-style JSON -> messages
// ============================================================================================

result<std::vector<chat_message>> messages_from_json(std::string_view json) {
  simdjson::dom::parser parser;
  simdjson::padded_string p(json);
  simdjson::dom::element root;
  if (auto err = parser.parse(p).get(root))
    return make_error(errc::invalid_format,
                      std::string("messages: not valid JSON: ") + simdjson::error_message(err));
  simdjson::dom::array arr;
  if (root.get_array().get(arr)) return make_error(errc::invalid_format, "messages: expected a JSON array");
  std::vector<chat_message> out;
  size_t i = 0;
  for (simdjson::dom::element e : arr) {
    const std::string where = "messages[" + std::to_string(i++) + "]";
    simdjson::dom::object o;
    if (e.get_object().get(o)) return make_error(errc::invalid_format, where + ": not an object");
    chat_message m;
    std::string_view role;
    if (o["role"].get_string().get(role))
      return make_error(errc::invalid_format, where + ".role: missing or not a string");
    if (role == "system")
      m.role = chat_role::system;
    else if (role == "developer")
      m.role = chat_role::developer;
    else if (role == "user")
      m.role = chat_role::user;
    else if (role == "assistant")
      m.role = chat_role::assistant;
    else if (role == "tool")
      m.role = chat_role::tool;
    else if (role == "latest_reminder")
      m.role = chat_role::latest_reminder;
    else
      return make_error(errc::invalid_format, where + ".role: unknown role '" + std::string(role) + "'");

    auto get_text = [&](const char* key, std::string& into) -> status {
      auto r = o[key];
      if (r.error() || r.value().is_null()) return {};
      std::string_view s;
      if (!r.get_string().get(s)) {
        into = std::string(s);
        return {};
      }
      simdjson::dom::array blocks;
      if (m.role == chat_role::tool && !r.get_array().get(blocks)) {
        // Text blocks joined by blank lines; other blocks are named, as SGLang does.
        bool first = true;
        for (simdjson::dom::element b : blocks) {
          std::string_view type, text;
          if (!first) into += "\n\n";
          first = false;
          if (b["type"].get_string().get(type)) type = "None";
          if (type == "text") {
            if (!b["text"].get_string().get(text)) into += std::string(text);
          } else {
            into += "[Unsupported " + std::string(type) + "]";
          }
        }
        return {};
      }
      return make_error(errc::invalid_format, where + "." + key + ": expected a string");
    };
    CEDAR_TRY(get_text("content", m.content));
    CEDAR_TRY(get_text("reasoning_content", m.reasoning));
    CEDAR_TRY(get_text("tool_call_id", m.tool_call_id));
    if (auto r = o["wo_eos"]; !r.error()) {
      bool b = false;
      if (r.get_bool().get(b)) return make_error(errc::invalid_format, where + ".wo_eos: expected a boolean");
      m.wo_eos = b;
    }
    if (auto r = o["tool_calls"]; !r.error() && !r.value().is_null()) {
      simdjson::dom::array calls;
      if (r.get_array().get(calls))
        return make_error(errc::invalid_format, where + ".tool_calls: expected an array");
      size_t c = 0;
      for (simdjson::dom::element tc : calls) {
        const std::string cw = where + ".tool_calls[" + std::to_string(c++) + "]";
        chat_tool_call call;
        std::string_view s;
        if (!tc["id"].get_string().get(s)) call.id = std::string(s);
        simdjson::dom::element fn = tc;
        if (simdjson::dom::element f; !tc["function"].get(f)) fn = f;
        if (fn["name"].get_string().get(s))
          return make_error(errc::invalid_format, cw + ".function.name: missing");
        call.name = std::string(s);
        simdjson::dom::element args;
        if (fn["arguments"].get(args)) {
          call.arguments_json = "{}";
        } else if (args.is_string()) {
          call.arguments_json = std::string(std::string_view(args.get_string().value()));
        } else {
          auto d = dump_element(args);
          if (!d) return d.take_err();
          call.arguments_json = std::move(*d);
        }
        m.tool_calls.push_back(std::move(call));
      }
    }
    if (auto r = o["tools"]; !r.error() && !r.value().is_null()) {
      simdjson::dom::array tools;
      if (r.get_array().get(tools))
        return make_error(errc::invalid_format, where + ".tools: expected an array");
      for (simdjson::dom::element t : tools) {
        auto d = dump_element(t);
        if (!d) return d.take_err();
        m.tools_json.push_back(std::move(*d));
      }
    }
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace cedar::model
