#include "runtime/agent_loop.hpp"

#include <algorithm>
#include <map>

namespace cedar::runtime {

// The repeat guard's identity of a call: the same tool with the same arguments text.
static std::string failure_key(const tool_call& c) { return c.name + '\n' + c.arguments_json; }

const char* agent_phase_name(agent_phase p) {
  switch (p) {
    case agent_phase::idle: return "idle";
    case agent_phase::generating: return "generating";
    case agent_phase::running_tools: return "running_tools";
  }
  return "?";
}

agent_loop::agent_loop(const model::tokenizer& tok, std::string system_prompt, std::vector<std::string> tools_json,
                       std::vector<std::string> known_tools, agent_limits limits)
    : tok_(tok), limits_(limits), known_(std::move(known_tools)), dec_(tok) {
  if (!system_prompt.empty() || !tools_json.empty()) {
    model::chat_message s;
    s.role = model::chat_role::system;
    s.content = std::move(system_prompt);
    s.tools_json = std::move(tools_json);
    msgs_.push_back(std::move(s));
  }
}

// The text the sequence will hold after `next` (+ the generation prefix), minus what it holds
// now, encoded. The chat format renders a prefix-stable text (tested), so this is a suffix.
result<std::vector<int32_t>> agent_loop::delta_tokens(const std::vector<model::chat_message>& next) {
  model::chat_options o;
  auto text = model::render_chat(next, o);
  if (!text) return text.take_err();
  if (text->compare(0, rendered_.size(), rendered_) != 0)
    return make_error(errc::internal, "chat rendering is not prefix-stable for this transcript");
  auto ids = tok_.encode(std::string_view(*text).substr(rendered_.size()), true);
  if (!ids) return ids.take_err();
  std::vector<int32_t> out;
  if (!last_stopped_ && !rendered_.empty()) out.push_back(tok_.eos_id());  // close a cut reply
  out.insert(out.end(), ids->begin(), ids->end());
  rendered_ = std::move(*text);
  last_stopped_ = true;
  return out;
}

result<std::vector<int32_t>> agent_loop::begin_turn(const std::string& user_text) {
  if (phase_ != agent_phase::idle)
    return make_error(errc::invalid_argument, std::string("agent is ") + agent_phase_name(phase_) + ", not idle");
  std::vector<model::chat_message> next = msgs_;
  model::chat_message u;
  u.role = model::chat_role::user;
  u.content = user_text;
  next.push_back(u);
  auto toks = delta_tokens(next);
  if (!toks) return toks;
  msgs_ = std::move(next);
  round_ = 0;
  failed_.clear();
  final_pass_ = false;
  phase_ = agent_phase::generating;
  parser_.emplace(false);
  dec_ = model::stream_decoder(tok_);
  raw_reply_.clear();
  return toks;
}

void agent_loop::on_token(int32_t id, std::vector<model::dsml_event>& events) {
  if (phase_ != agent_phase::generating) return;
  auto piece = dec_.push(id);
  if (!piece) return;
  raw_reply_ += *piece;
  parser_->feed(*piece, events);
}

reply_action agent_loop::end_reply(bool stopped) {
  reply_action act;
  std::vector<model::dsml_event> ev;
  std::string tail = dec_.finish();
  raw_reply_ += tail;
  if (!tail.empty()) parser_->feed(tail, ev);
  parser_->finish(ev);
  (void)ev;
  model::dsml_result r = model::dsml_parse(raw_reply_, false);
  act.content = r.content;
  act.parse_errors = r.errors;
  last_stopped_ = stopped;

  model::chat_message a;
  a.role = model::chat_role::assistant;
  a.content = r.content;
  ++round_;
  for (const auto& c : r.calls) {
    tool_call tc;
    tc.id = "call_" + std::to_string(++call_counter_);
    tc.name = c.name;
    tc.arguments_json = c.arguments_json;
    if (std::find(known_.begin(), known_.end(), c.name) == known_.end())
      tc.error = "unknown tool '" + c.name + "'";
    a.tool_calls.push_back({tc.id, tc.name, tc.arguments_json});
    act.calls.push_back(std::move(tc));
  }
  // A malformed DSML block with no complete call still deserves an answer the model can read.
  if (act.calls.empty() && !r.errors.empty() && raw_reply_.find("｜DSML｜") != std::string::npos) {
    tool_call tc;
    tc.id = "call_" + std::to_string(++call_counter_);
    tc.name = "invalid_call";
    tc.arguments_json = "{}";
    tc.error = "malformed tool call: " + r.errors.front();
    a.tool_calls.push_back({tc.id, tc.name, tc.arguments_json});
    act.calls.push_back(std::move(tc));
  }
  msgs_.push_back(std::move(a));
  // The rendered transcript now ends with this assistant turn (what the sequence holds,
  // modulo the model's own tokenization of it).
  model::chat_options o;
  if (auto t = model::render_chat(msgs_, o); t) rendered_ = std::move(*t);

  // The runtime's limits: the turn ends here and the calls are not run (the reply keeps its
  // text; the calls move to `refused` for the caller and the dashboard).
  act.round_limit = !act.calls.empty() && round_ > limits_.max_tool_rounds;
  if (!act.calls.empty() && !act.round_limit && limits_.max_repeated_failures > 0)
    for (const tool_call& c : act.calls) {
      auto it = failed_.find(failure_key(c));
      if (it != failed_.end() && it->second >= limits_.max_repeated_failures) act.repeat_limit = true;
    }
  // The final reply after a limit never runs a call (an unconstrained model may still write one).
  if (final_pass_ && !act.calls.empty()) (final_by_round_ ? act.round_limit : act.repeat_limit) = true;
  if ((act.round_limit || act.repeat_limit) && limits_.answer_on_limit && !final_pass_) {
    // The calls stay in the transcript with "not run" results; the next reply is the last.
    const std::string why =
        act.round_limit ? "not run: this turn reached its limit of " + std::to_string(limits_.max_tool_rounds) +
                              " tool rounds; answer with what you have"
                        : "not run: this call already failed " + std::to_string(limits_.max_repeated_failures) +
                              " times; answer with what you have";
    for (tool_call& c : act.calls) {
      c.refused = true;
      if (c.error.empty()) c.error = why;
    }
    act.refused = act.calls;
    final_pass_ = true;
    final_by_round_ = act.round_limit;
    phase_ = agent_phase::running_tools;
    pending_ = act.calls;
    return act;
  }
  if (act.round_limit || act.repeat_limit) {
    act.refused = std::move(act.calls);
    act.calls.clear();
    msgs_.back().tool_calls.clear();
    if (auto t = model::render_chat(msgs_, o); t) rendered_ = std::move(*t);
  }
  if (act.calls.empty()) {
    phase_ = agent_phase::idle;
  } else {
    phase_ = agent_phase::running_tools;
    pending_ = act.calls;
  }
  return act;
}

result<std::vector<int32_t>> agent_loop::tool_results(std::vector<tool_outcome> outcomes) {
  if (phase_ != agent_phase::running_tools)
    return make_error(errc::invalid_argument, std::string("agent is ") + agent_phase_name(phase_) + ", not running tools");
  std::map<std::string, tool_outcome> by_id;
  for (auto& o : outcomes) by_id[o.id] = std::move(o);
  std::vector<model::chat_message> next = msgs_;
  for (const tool_call& c : pending_) {  // call order (invariant 2)
    model::chat_message t;
    t.role = model::chat_role::tool;
    t.tool_call_id = c.id;
    auto it = by_id.find(c.id);
    bool failed = it == by_id.end() || it->second.is_error || !c.error.empty();
    if (it == by_id.end()) t.content = "error: no result for this call";
    else t.content = it->second.is_error ? "error: " + it->second.text : it->second.text;
    if (failed) ++failed_[failure_key(c)];
    next.push_back(std::move(t));
  }
  auto toks = delta_tokens(next);
  if (!toks) return toks;
  msgs_ = std::move(next);
  pending_.clear();
  phase_ = agent_phase::generating;
  parser_.emplace(false);
  dec_ = model::stream_decoder(tok_);
  raw_reply_.clear();
  return toks;
}

void agent_loop::cancel() {
  if (phase_ == agent_phase::generating && !raw_reply_.empty()) {
    model::chat_message a;
    a.role = model::chat_role::assistant;
    a.content = model::dsml_parse(raw_reply_, false).content;
    msgs_.push_back(std::move(a));
    last_stopped_ = false;
    model::chat_options o;
    if (auto t = model::render_chat(msgs_, o); t) rendered_ = std::move(*t);
  } else if (phase_ == agent_phase::running_tools) {
    for (const tool_call& c : pending_) {
      model::chat_message t;
      t.role = model::chat_role::tool;
      t.tool_call_id = c.id;
      t.content = "error: cancelled";
      msgs_.push_back(std::move(t));
    }
    pending_.clear();
    // The cancelled results are rendered with the next user turn's delta.
  }
  phase_ = agent_phase::idle;
  final_pass_ = false;
}

status agent_loop::restore(std::vector<model::chat_message> msgs, bool last_reply_stopped) {
  // What the sequence holds ends with the last reply: a generation commits the items it
  // prefilled (user turn, tool results) together with itself.
  size_t held = msgs.size();
  while (held > 0 && msgs[held - 1].role == model::chat_role::tool) --held;
  model::chat_options o;
  auto t = model::render_chat(std::vector<model::chat_message>(msgs.begin(), msgs.begin() + ptrdiff_t(held)), o);
  if (!t) return t.take_err();
  interrupted_.clear();
  if (held > 0 && msgs[held - 1].role == model::chat_role::assistant) {
    std::vector<std::string> answered;
    for (size_t i = held; i < msgs.size(); ++i) answered.push_back(msgs[i].tool_call_id);
    const auto calls = msgs[held - 1].tool_calls;
    for (const auto& c : calls) {
      if (std::find(answered.begin(), answered.end(), c.id) != answered.end()) continue;
      tool_call ic{c.id, c.name, c.arguments_json, "interrupted: the runtime stopped before this call finished"};
      model::chat_message r;
      r.role = model::chat_role::tool;
      r.tool_call_id = c.id;
      r.content = "error: " + ic.error;
      msgs.push_back(std::move(r));
      interrupted_.push_back(std::move(ic));
    }
  }
  msgs_ = std::move(msgs);
  rendered_ = std::move(*t);
  last_stopped_ = last_reply_stopped;
  phase_ = agent_phase::idle;
  final_pass_ = false;
  for (const auto& m : msgs_)
    for (const auto& c : m.tool_calls) {
      auto pos = c.id.rfind('_');
      if (pos != std::string::npos) call_counter_ = std::max(call_counter_, std::atoi(c.id.c_str() + pos + 1));
    }
  return {};
}

}  // namespace cedar::runtime
