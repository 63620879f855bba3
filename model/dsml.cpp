// model::dsml — see dsml.hpp for the grammar, the state diagram and the invariants.
#include "model/dsml.hpp"

#include <simdjson.h>

#include <algorithm>
#include <cstdio>

#include "model/tokenizer.hpp"  // utf8_sanitize

namespace cedar::model {

namespace {

constexpr std::string_view k_think_end = "</think>";
constexpr std::string_view k_eos = "<｜end▁of▁sentence｜>";
constexpr std::string_view k_calls_open = dsml_marker::calls_open;
constexpr std::string_view k_calls_open_nl = "\n\n<｜DSML｜ calls>";
constexpr std::string_view k_calls_close = dsml_marker::calls_close;
constexpr std::string_view k_invoke_open = dsml_marker::invoke_open;
constexpr std::string_view k_invoke_close = dsml_marker::invoke_close;
constexpr std::string_view k_param_open = dsml_marker::param_open;
constexpr std::string_view k_param_close = dsml_marker::param_close;

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

// Earliest marker occurrence in buf (ties: the longest marker); npos if none.
size_t find_earliest(std::string_view buf, std::initializer_list<std::string_view> marks,
                     std::string_view& which) {
  size_t best = std::string_view::npos;
  which = {};
  for (auto mk : marks) {
    const size_t p = buf.find(mk);
    if (p == std::string_view::npos) continue;
    if (best == std::string_view::npos || p < best || (p == best && mk.size() > which.size())) {
      best = p;
      which = mk;
    }
  }
  return best;
}

// Length of the longest suffix of buf that is a proper prefix of some marker.
size_t holdback(std::string_view buf, std::initializer_list<std::string_view> marks) {
  size_t h = 0;
  for (auto mk : marks) {
    for (size_t n = std::min(mk.size() - 1, buf.size()); n > h; --n) {
      if (buf.substr(buf.size() - n) == mk.substr(0, n)) {
        h = n;
        break;
      }
    }
  }
  return h;
}

std::string sanitized(std::string_view bytes) {
  std::string s;
  utf8_sanitize(bytes, true, s);
  return s;
}

bool valid_json(const std::string& text) {
  simdjson::dom::parser parser;
  simdjson::dom::element e;
  return !parser.parse(text).get(e);
}

bool is_attr_char(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

// ` name="x" string="true"` -> pairs, or false with a reason.
bool parse_attrs(std::string_view s, std::vector<std::pair<std::string, std::string>>& attrs,
                 std::string& why) {
  size_t i = 0;
  const size_t n = s.size();
  if (n && !is_ws(s[0])) {
    why = "expected a space after the tag name";
    return false;
  }
  while (true) {
    while (i < n && is_ws(s[i])) ++i;
    if (i >= n) return true;
    size_t j = i;
    while (j < n && is_attr_char(static_cast<unsigned char>(s[j]))) ++j;
    if (j == i) {
      why = "expected an attribute name";
      return false;
    }
    std::string key(s.substr(i, j - i));
    if (j >= n || s[j] != '=' || j + 1 >= n || s[j + 1] != '"') {
      why = "expected =\"...\" after attribute '" + key + "'";
      return false;
    }
    const size_t end = s.find('"', j + 2);
    if (end == std::string_view::npos) {
      why = "unterminated value of attribute '" + key + "'";
      return false;
    }
    attrs.emplace_back(key, sanitized(s.substr(j + 2, end - j - 2)));
    i = end + 1;
    if (i < n && !is_ws(s[i])) {
      why = "expected a space after attribute '" + key + "'";
      return false;
    }
  }
}

}  // namespace

const char* dsml_event_kind_name(dsml_event_kind k) {
  switch (k) {
    case dsml_event_kind::reasoning:
      return "reasoning";
    case dsml_event_kind::content:
      return "content";
    case dsml_event_kind::call_begin:
      return "call_begin";
    case dsml_event_kind::parameter:
      return "parameter";
    case dsml_event_kind::call_end:
      return "call_end";
    case dsml_event_kind::error:
      return "error";
  }
  return "?";
}

std::string json_quote(std::string_view raw) {
  const std::string s = sanitized(raw);
  std::string out;
  out.reserve(s.size() + 2);
  out.push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
  }
  out.push_back('"');
  return out;
}

// ============================================================================================
// Parser
// ============================================================================================

dsml_parser::dsml_parser(bool thinking, dsml_limits limits)
    : state_(thinking ? state::reasoning : state::content), limits_(limits) {}

void dsml_parser::consume(size_t n) {
  buf_.erase(0, n);
  pos_ += n;
}

void dsml_parser::emit_text(dsml_event_kind kind, std::string_view bytes, bool final,
                            std::vector<dsml_event>& out) {
  std::string& pending = pending_[kind == dsml_event_kind::reasoning ? 0 : 1];
  pending.append(bytes);
  std::string text;
  const size_t used = utf8_sanitize(pending, final, text);
  pending.erase(0, used);
  if (final) pending.clear();
  if (!text.empty()) {
    dsml_event e;
    e.kind = kind;
    e.text = std::move(text);
    out.push_back(std::move(e));
  }
}

void dsml_parser::fail(std::string message, std::vector<dsml_event>& out) {
  dsml_event e;
  e.kind = dsml_event_kind::error;
  e.text = std::move(message);
  out.push_back(std::move(e));
  state_ = state::skip;
  // the abandoned call's arguments are dropped now, not when the next call starts: an error
  // must not leave more than the limits held (invariant 1; found by fuzz_dsml: a call over
  // max_call_bytes kept its arguments, up to ~2x the limit, while the parser skipped)
  params_.clear();
  params_bytes_ = 0;
  value_.clear();
}

void dsml_parser::feed(std::string_view chunk, std::vector<dsml_event>& out) {
  buf_.append(chunk);
  while (step(out)) {
  }
}

void dsml_parser::finish(std::vector<dsml_event>& out) {
  auto error = [&](std::string m) {
    dsml_event e;
    e.kind = dsml_event_kind::error;
    e.text = std::move(m);
    out.push_back(std::move(e));
  };
  switch (state_) {
    case state::reasoning:
      emit_text(dsml_event_kind::reasoning, buf_, true, out);
      error("output ended inside the reasoning (no </think>)");
      break;
    case state::content:
      emit_text(dsml_event_kind::content, buf_, true, out);
      break;
    case state::block:
      error("output ended inside the tool-call block (no </｜DSML｜ calls>)");
      break;
    case state::call:
    case state::value:
      error("output ended inside call '" + call_name_ + "'");
      break;
    case state::tag:
      if (tag_is_invoke_)
        error("output ended inside a DSML tag");
      else
        error("output ended inside call '" + call_name_ + "'");
      break;
    case state::skip:
    case state::done:
      break;
  }
  pos_ += buf_.size();
  buf_.clear();
  value_.clear();
  state_ = state::done;
}

bool dsml_parser::step(std::vector<dsml_event>& out) {
  std::string_view which;
  switch (state_) {
    case state::reasoning: {
      const size_t p = find_earliest(buf_, {k_think_end, k_eos}, which);
      if (p == std::string_view::npos) {
        const size_t keep = holdback(buf_, {k_think_end, k_eos});
        emit_text(dsml_event_kind::reasoning, std::string_view(buf_).substr(0, buf_.size() - keep), false,
                  out);
        consume(buf_.size() - keep);
        return false;
      }
      emit_text(dsml_event_kind::reasoning, std::string_view(buf_).substr(0, p), true, out);
      consume(p + which.size());
      if (which == k_eos) {
        dsml_event e;
        e.kind = dsml_event_kind::error;
        e.text = "<｜end▁of▁sentence｜> inside the reasoning (no </think>)";
        out.push_back(std::move(e));
        state_ = state::done;
      } else {
        state_ = state::content;
      }
      return true;
    }
    case state::content: {
      const size_t p = find_earliest(buf_, {k_calls_open_nl, k_calls_open, k_eos}, which);
      if (p == std::string_view::npos) {
        const size_t keep = holdback(buf_, {k_calls_open_nl, k_calls_open, k_eos});
        emit_text(dsml_event_kind::content, std::string_view(buf_).substr(0, buf_.size() - keep), false, out);
        consume(buf_.size() - keep);
        return false;
      }
      emit_text(dsml_event_kind::content, std::string_view(buf_).substr(0, p), true,
                out);  // a marker ends the text
      consume(p + which.size());
      state_ = which == k_eos ? state::done : state::block;
      return true;
    }
    case state::block:
    case state::call: {
      size_t k = 0;
      while (k < buf_.size() && is_ws(buf_[k])) ++k;
      consume(k);
      if (buf_.empty()) return false;
      const bool block = state_ == state::block;
      const std::string_view expected[3] = {block ? k_invoke_open : k_param_open,
                                            block ? k_calls_close : k_invoke_close, k_eos};
      for (auto tok : expected) {
        if (std::string_view(buf_).substr(0, tok.size()) == tok) {
          consume(tok.size());
          if (tok == k_eos) {
            dsml_event e;
            e.kind = dsml_event_kind::error;
            e.text = "<｜end▁of▁sentence｜> inside the tool-call block";
            out.push_back(std::move(e));
            state_ = state::done;
          } else if (tok == k_calls_close) {
            state_ = state::content;
          } else if (tok == k_invoke_open || tok == k_param_open) {
            tag_is_invoke_ = tok == k_invoke_open;
            state_ = state::tag;
          } else {  // </｜DSML｜ invoke>
            dsml_event e;
            e.kind = dsml_event_kind::call_end;
            e.name = call_name_;
            e.call_index = n_calls_ - 1;
            e.value = "{";
            for (size_t i = 0; i < params_.size(); ++i) {
              if (i) e.value += ", ";
              e.value += json_quote(params_[i].first) + ": " + params_[i].second;
            }
            e.value += "}";
            out.push_back(std::move(e));
            params_.clear();
            state_ = state::block;
          }
          return true;
        }
      }
      for (auto tok : expected)
        if (buf_.size() < tok.size() && tok.substr(0, buf_.size()) == buf_) return false;
      const std::string where = block ? "the tool-call block" : "call '" + call_name_ + "'";
      const std::string want = block ? "'<｜DSML｜ invoke' or '</｜DSML｜ calls>'"
                                     : "'<｜DSML｜ parameter' or '</｜DSML｜ invoke>'";
      fail("unexpected text at byte " + std::to_string(pos_) + " inside " + where + "; expected " + want,
           out);
      return true;
    }
    case state::tag:
      return step_tag(out);
    case state::value:
      return step_value(out);
    case state::skip: {
      const size_t p = find_earliest(buf_, {k_invoke_open, k_calls_close, k_eos}, which);
      if (p == std::string_view::npos) {
        consume(buf_.size() - holdback(buf_, {k_invoke_open, k_calls_close, k_eos}));
        return false;
      }
      consume(p + which.size());
      if (which == k_invoke_open) {
        tag_is_invoke_ = true;
        state_ = state::tag;
      } else if (which == k_calls_close) {
        state_ = state::content;
      } else {
        state_ = state::done;
      }
      return true;
    }
    case state::done: {
      size_t k = 0;
      while (k < buf_.size() && is_ws(buf_[k])) ++k;
      if (k < buf_.size() && !done_warned_) {
        done_warned_ = true;
        dsml_event e;
        e.kind = dsml_event_kind::error;
        e.text = "text after <｜end▁of▁sentence｜> at byte " + std::to_string(pos_ + k) + " ignored";
        out.push_back(std::move(e));
      }
      consume(buf_.size());
      return false;
    }
  }
  return false;
}

bool dsml_parser::step_tag(std::vector<dsml_event>& out) {
  bool in_quote = false;
  size_t end = std::string::npos;
  const size_t scan = std::min(buf_.size(), limits_.max_tag_bytes + 1);
  for (size_t k = 0; k < scan; ++k) {
    if (buf_[k] == '"') {
      in_quote = !in_quote;
    } else if (buf_[k] == '>' && !in_quote) {
      end = k;
      break;
    }
  }
  const std::string what = tag_is_invoke_ ? "invoke" : "parameter";
  if (end == std::string::npos) {
    if (buf_.size() > limits_.max_tag_bytes) {
      consume(limits_.max_tag_bytes);
      fail("DSML " + what + " tag longer than " + std::to_string(limits_.max_tag_bytes) + " bytes", out);
      return true;
    }
    return false;
  }
  const std::string raw = buf_.substr(0, end);
  consume(end + 1);
  std::vector<std::pair<std::string, std::string>> attrs;
  std::string why;
  if (!parse_attrs(raw, attrs, why)) {
    fail("malformed DSML " + what + " tag: " + why, out);
    return true;
  }
  std::string name, string_attr;
  bool have_name = false, have_string = false;
  for (auto& [key, val] : attrs) {
    const bool known = key == "name" || (!tag_is_invoke_ && key == "string");
    if (!known) {
      fail("unknown attribute '" + key + "' on DSML " + what + " tag", out);
      return true;
    }
    bool& have = key == "name" ? have_name : have_string;
    if (have) {
      fail("duplicate attribute '" + key + "' on DSML " + what + " tag", out);
      return true;
    }
    have = true;
    (key == "name" ? name : string_attr) = val;
  }
  if (name.empty()) {
    fail("DSML " + what + " tag without a name", out);
    return true;
  }
  if (tag_is_invoke_) {
    call_name_ = name;
    params_.clear();
    params_bytes_ = 0;
    ++n_calls_;
    dsml_event e;
    e.kind = dsml_event_kind::call_begin;
    e.name = name;
    e.call_index = n_calls_ - 1;
    out.push_back(std::move(e));
    state_ = state::call;
    return true;
  }
  if (string_attr != "true" && string_attr != "false") {
    fail("parameter '" + name + "' of call '" + call_name_ + "' needs string=\"true\" or string=\"false\"",
         out);
    return true;
  }
  for (const auto& p : params_) {
    if (p.first == name) {
      fail("duplicate parameter '" + name + "' in call '" + call_name_ + "'", out);
      return true;
    }
  }
  param_name_ = name;
  param_is_string_ = string_attr == "true";
  value_.clear();
  state_ = state::value;
  return true;
}

bool dsml_parser::step_value(std::vector<dsml_event>& out) {
  const size_t room = limits_.max_value_bytes - value_.size();
  const size_t p = buf_.find(k_param_close);
  auto too_long = [&] {
    consume(room);
    value_.clear();
    fail("value of parameter '" + param_name_ + "' in call '" + call_name_ + "' longer than " +
             std::to_string(limits_.max_value_bytes) + " bytes",
         out);
    return true;
  };
  if (p == std::string::npos) {
    const size_t safe = buf_.size() - holdback(buf_, {k_param_close});
    if (safe > room) return too_long();
    value_.append(buf_, 0, safe);
    consume(safe);
    return false;
  }
  if (p > room) return too_long();
  value_.append(buf_, 0, p);
  consume(p + k_param_close.size());
  const std::string text = sanitized(value_);
  value_.clear();
  std::string js;
  if (param_is_string_) {
    js = json_quote(text);
  } else {
    if (!valid_json(text)) {
      fail("parameter '" + param_name_ + "' of call '" + call_name_ +
               "' has string=\"false\" but its value is not valid JSON",
           out);
      return true;
    }
    js = text;
  }
  params_bytes_ += param_name_.size() + js.size();
  if (params_bytes_ > limits_.max_call_bytes) {
    fail("arguments of call '" + call_name_ + "' longer than " + std::to_string(limits_.max_call_bytes) +
             " bytes",
         out);
    return true;
  }
  params_.emplace_back(param_name_, js);
  dsml_event e;
  e.kind = dsml_event_kind::parameter;
  e.name = param_name_;
  e.value = std::move(js);
  e.is_string = param_is_string_;
  e.call_index = n_calls_ - 1;
  out.push_back(std::move(e));
  state_ = state::call;
  return true;
}

// ============================================================================================
// One-shot
// ============================================================================================

void dsml_collect(const std::vector<dsml_event>& events, dsml_result& r) {
  for (const auto& e : events) {
    switch (e.kind) {
      case dsml_event_kind::reasoning:
        r.reasoning += e.text;
        break;
      case dsml_event_kind::content:
        r.content += e.text;
        break;
      case dsml_event_kind::call_end:
        r.calls.push_back({e.name, e.value});
        break;
      case dsml_event_kind::error:
        r.errors.push_back(e.text);
        break;
      case dsml_event_kind::call_begin:
      case dsml_event_kind::parameter:
        break;
    }
  }
}

dsml_result dsml_parse(std::string_view text, bool thinking) {
  dsml_parser p(thinking);
  std::vector<dsml_event> ev;
  p.feed(text, ev);
  p.finish(ev);
  dsml_result r;
  dsml_collect(ev, r);
  return r;
}

}  // namespace cedar::model
