// observer — see observer.hpp.
#include "runtime/observer.hpp"

#include <algorithm>

namespace cedar::runtime {

namespace {

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

nlohmann::json observer_event::to_json() const {
  return nlohmann::json{{"seq", seq}, {"t_ms", t_ms}, {"type", type}, {"session", session}, {"data", data}};
}

observer::observer(observer_limits limits) : lim_(limits) {}

std::string observer::cut(const std::string& s) const {
  if (s.size() <= lim_.text_bytes) return s;
  size_t n = lim_.text_bytes;
  while (n > 0 && (uint8_t(s[n]) & 0xC0) == 0x80) --n;  // do not split a UTF-8 sequence
  return s.substr(0, n) + "… [" + std::to_string(s.size() - n) + " more bytes]";
}

observer::session_live& observer::live_(int64_t id, int64_t now) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) {
    if (sessions_.size() >= lim_.sessions) {
      // Forget the least recently active idle session.
      auto victim = sessions_.end();
      for (auto j = sessions_.begin(); j != sessions_.end(); ++j)
        if (!j->second.running && (victim == sessions_.end() || j->second.last_ms < victim->second.last_ms)) victim = j;
      if (victim != sessions_.end()) sessions_.erase(victim);
    }
    it = sessions_.emplace(id, session_live{}).first;
  }
  it->second.last_ms = now;
  return it->second;
}

uint64_t observer::publish(const std::string& type, int64_t session, nlohmann::json data) {
  observer_event ev;
  ev.t_ms = now_ms();
  ev.type = type;
  ev.session = session;
  ev.data = std::move(data);
  {
    std::lock_guard<std::mutex> lk(mu_);
    ev.seq = next_seq_++;
    if (session >= 0) {
      session_live& s = live_(session, ev.t_ms);
      if (type == "token") {
        s.live_text += ev.data.value("text", "");
        if (s.live_text.size() > lim_.live_text_bytes) {
          size_t drop = s.live_text.size() - lim_.live_text_bytes;
          while (drop < s.live_text.size() && (uint8_t(s.live_text[drop]) & 0xC0) == 0x80) ++drop;
          s.live_text.erase(0, drop);
        }
      } else {
        if (type == "turn_begin") {
          s.running = true;
          s.live_text.clear();
        } else if (type == "turn_end") {
          s.running = false;
          nlohmann::json t = ev.data;
          t["t_ms"] = ev.t_ms;
          s.turns.push_back(std::move(t));
          while (s.turns.size() > lim_.session_turns) s.turns.pop_front();
        }
        s.events.push_back(ev);
        while (s.events.size() > lim_.session_events) s.events.pop_front();
      }
    }
    if (type == "tool_result") {
      nlohmann::json& t = tools_[ev.data.value("name", "")];
      if (t.is_null()) t = {{"calls", 0}, {"errors", 0}, {"total_ms", 0.0}, {"max_ms", 0.0}, {"last_error", ""}};
      double ms = ev.data.value("ms", 0.0);
      t["calls"] = t["calls"].get<int64_t>() + 1;
      t["total_ms"] = t["total_ms"].get<double>() + ms;
      t["max_ms"] = std::max(t["max_ms"].get<double>(), ms);
      if (ev.data.value("is_error", false)) {
        t["errors"] = t["errors"].get<int64_t>() + 1;
        t["last_error"] = ev.data.value("text", "");
      }
    } else if (type == "executor") {
      nlohmann::json x = ev.data;
      x["t_ms"] = ev.t_ms;
      exec_.push_back(std::move(x));
      while (exec_.size() > lim_.executor_samples) exec_.pop_front();
    }
    history_.push_back(ev);
    while (history_.size() > lim_.history) history_.pop_front();
  }
  cv_.notify_all();
  return ev.seq;
}

std::vector<observer_event> observer::since(uint64_t after, size_t max) const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<observer_event> out;
  // history_ is in seq order: binary search for the first seq > after.
  auto it = std::upper_bound(history_.begin(), history_.end(), after,
                             [](uint64_t a, const observer_event& e) { return a < e.seq; });
  for (; it != history_.end() && out.size() < max; ++it) out.push_back(*it);
  return out;
}

std::vector<observer_event> observer::wait(uint64_t after, std::chrono::milliseconds timeout, size_t max) const {
  {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait_for(lk, timeout, [&] { return next_seq_ - 1 > after; });
  }
  return since(after, max);
}

uint64_t observer::last_seq() const {
  std::lock_guard<std::mutex> lk(mu_);
  return next_seq_ - 1;
}

observer::session_live observer::session(int64_t id) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = sessions_.find(id);
  return it == sessions_.end() ? session_live{} : it->second;
}

bool observer::known(int64_t id) const {
  std::lock_guard<std::mutex> lk(mu_);
  return sessions_.count(id) != 0;
}

nlohmann::json observer::tool_stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [name, t] : tools_) out[name] = t;
  return out;
}

std::vector<nlohmann::json> observer::executor_samples() const {
  std::lock_guard<std::mutex> lk(mu_);
  return {exec_.begin(), exec_.end()};
}

}  // namespace cedar::runtime
