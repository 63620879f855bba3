// observer — the runtime-wide event hub the dashboard watches.
//
// Publishers (the agent actors, the dashboard's executor sampler) call publish() from any
// thread; the hub stamps each event with a sequence number and the wall clock, keeps it in
// bounded rings, and wakes the subscribers. Subscribers (SSE connections) hold a cursor: they
// call wait(after, timeout) and get every kept event with seq > after, so a slow or reconnecting
// subscriber never blocks a publisher and only misses what fell out of the ring.
//
// Kept, all bounded:
//   - the last `history` events of every kind (the SSE replay buffer);
//   - per session (the `sessions` most recently active): the last events without tokens, the
//     live text of the running turn (capped), whether a turn runs, last activity, and the
//     summaries of its last turns (first-token time and total time are not in the store);
//   - per tool name: calls, errors, total/max duration, the last error;
//   - executor samples (one per sampler tick): tok/s, batch, residents, RAM use.
//
// Event types and their `data` fields:
//   turn_begin  {agent, text}                          token       {text}
//   tool_call   {id, name, arguments}                  tool_result {id, name, text, is_error, ms}
//   generation  {resume_path, n_prompt, n_replayed, n_generated, context, resume_ms, prefill_ms,
//                decode_ms}
//   turn_end    {answer, error, cancelled, rounds, tool_calls, prompt_tokens, generated_tokens,
//                replayed_tokens, context, resume_path, first_token_ms, total_ms}
//   session     {action, ...}   (dashboard actions: started, resumed, forked, cancel)
//   executor    {n_resident, n_active, resident_bytes, ram_budget, steps, tokens_generated,
//                max_batch, tok_s, batch}
// Thread safety: every method locks one mutex; no callback runs under it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace cedar::runtime {

struct observer_event {
  uint64_t seq = 0;
  int64_t t_ms = 0;        // unix epoch milliseconds
  std::string type;
  int64_t session = -1;    // -1: runtime-wide (executor)
  nlohmann::json data = nlohmann::json::object();
  nlohmann::json to_json() const;
};

struct observer_limits {
  size_t history = 4096;             // events kept for replay (all sessions, tokens included)
  size_t sessions = 256;             // sessions whose live state is kept
  size_t session_events = 512;       // non-token events kept per session
  size_t session_turns = 256;        // turn summaries kept per session
  size_t live_text_bytes = 16 << 10; // live token text kept for the running turn
  size_t executor_samples = 900;     // executor samples kept (15 min at 1 s)
  size_t text_bytes = 4096;          // tool arguments/results are cut to this in events
};

class observer {
 public:
  explicit observer(observer_limits limits = {});

  // Records an event; returns its sequence number.
  uint64_t publish(const std::string& type, int64_t session, nlohmann::json data);

  // Events with seq > after (oldest first, at most `max`); waits up to `timeout` for the first.
  std::vector<observer_event> wait(uint64_t after, std::chrono::milliseconds timeout, size_t max = 512) const;
  std::vector<observer_event> since(uint64_t after, size_t max = 512) const;
  uint64_t last_seq() const;

  struct session_live {
    bool running = false;
    int64_t last_ms = 0;
    std::string live_text;                     // tokens of the running (or last) turn
    std::deque<observer_event> events;         // non-token events
    std::deque<nlohmann::json> turns;          // turn_end data, oldest first (+ "t_ms")
  };
  // A copy of a session's live state (nullopt-like: running=false, last_ms=0 when unknown).
  session_live session(int64_t id) const;
  bool known(int64_t id) const;

  // {name: {calls, errors, total_ms, max_ms, last_error}}
  nlohmann::json tool_stats() const;
  // executor samples, oldest first
  std::vector<nlohmann::json> executor_samples() const;

  const observer_limits& limits() const { return lim_; }
  // Cuts text to limits().text_bytes (at a UTF-8 boundary), marking the cut.
  std::string cut(const std::string& s) const;

 private:
  session_live& live_(int64_t id, int64_t now);

  observer_limits lim_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  uint64_t next_seq_ = 1;
  std::deque<observer_event> history_;
  std::map<int64_t, session_live> sessions_;
  std::map<std::string, nlohmann::json> tools_;
  std::deque<nlohmann::json> exec_;
};

}  // namespace cedar::runtime
