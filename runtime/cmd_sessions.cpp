// `cedar sessions …` — see cmd_sessions.hpp. Each command opens the store, does one thing,
// prints text (or JSON) on stdout and errors on stderr, and sets the exit code.
#include "runtime/cmd_sessions.hpp"

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "sessions/store.hpp"
#include "tools_mcp/json.hpp"

namespace cedar::runtime {
namespace {

using json = nlohmann::json;
using sessions::session_info;
using sessions::store;

struct sessions_args {
  std::string store_path;
  bool json_out = false;
  int64_t id = 0;
  uint32_t at_turn = 0;
  std::string agent;
};

int fail(const error& e) {
  std::fprintf(stderr, "cedar sessions: %s: %s\n", errc_name(e.code), e.message.c_str());
  return e.code == errc::invalid_argument ? 2 : 1;
}

std::string hex64(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string iso_time(int64_t ms) {
  const std::time_t t = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

json session_json(const session_info& s) {
  json j = {{"id", s.id},
            {"agent", s.agent},
            {"status", sessions::session_status_name(s.status)},
            {"model_hash", hex64(s.model_hash)},
            {"n_turns", s.n_turns},
            {"n_tokens", s.n_tokens},
            {"created", iso_time(s.created_ms)},
            {"updated", iso_time(s.updated_ms)},
            {"parent", s.parent ? json(*s.parent) : json(nullptr)}};
  if (s.status == sessions::session_status::forked || s.parent || s.fork_turns > 0) {
    j["fork_turns"] = s.fork_turns;
    j["fork_tokens"] = s.fork_tokens;
  }
  return j;
}

// The page file's space (whole store): shown by list, show and compact.
json page_stats_json(const sessions::page_file_stats& p) {
  return {{"path", p.path},          {"file_bytes", p.file_bytes}, {"live_bytes", p.live_bytes},
          {"dead_bytes", p.dead_bytes}, {"n_pages", p.n_pages},     {"n_lost_pages", p.n_lost_pages}};
}

std::string mb(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MB", static_cast<double>(bytes) / 1e6);
  return buf;
}

void print_page_stats(const sessions::page_file_stats& p) {
  std::printf("page file %s: %s (%s live in %llu pages, %s dead)%s\n", p.path.c_str(), mb(p.file_bytes).c_str(),
              mb(p.live_bytes).c_str(), static_cast<unsigned long long>(p.n_pages), mb(p.dead_bytes).c_str(),
              p.dead_bytes > p.live_bytes && p.dead_bytes > 0 ? "; `cedar sessions compact` reclaims the dead bytes"
                                                              : "");
}

// Opens an existing store; never creates one.
result<std::unique_ptr<store>> open_existing(const std::string& path) {
  if (path.empty())
    return make_error(errc::invalid_argument,
                      "no store path: set --store PATH (neither XDG_DATA_HOME nor HOME is set)");
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    return make_error(errc::not_found, "no session store at " + path + " (use --store PATH)");
  return store::open(path);
}

int cmd_list(const sessions_args& a) {
  std::error_code ec;
  if (!a.store_path.empty() && !std::filesystem::exists(a.store_path, ec)) {
    if (a.json_out) std::printf("[]\n");
    else std::fprintf(stderr, "no session store at %s yet\n", a.store_path.c_str());
    return 0;
  }
  auto st = open_existing(a.store_path);
  if (!st) return fail(st.err());
  auto list = (*st)->list_sessions();
  if (!list) return fail(list.err());
  if (a.json_out) {
    json arr = json::array();
    for (const auto& s : *list) arr.push_back(session_json(s));
    std::printf("%s\n", cedar::tools::json_dump(arr, 2).c_str());
    return 0;
  }
  std::printf("%-6s %-12s %6s %9s %-7s %-20s %s\n", "ID", "STATUS", "TURNS", "TOKENS", "PARENT",
              "UPDATED", "AGENT");
  for (const auto& s : *list)
    std::printf("%-6lld %-12s %6u %9llu %-7s %-20s %s\n", static_cast<long long>(s.id),
                sessions::session_status_name(s.status), s.n_turns,
                static_cast<unsigned long long>(s.n_tokens),
                s.parent ? std::to_string(*s.parent).c_str() : "-", iso_time(s.updated_ms).c_str(),
                s.agent.c_str());
  auto space = (*st)->page_stats();
  if (!space) return fail(space.err());
  print_page_stats(*space);
  return 0;
}

int cmd_show(const sessions_args& a) {
  auto st = open_existing(a.store_path);
  if (!st) return fail(st.err());
  store& s = **st;
  auto info = s.get_session(a.id);
  if (!info) return fail(info.err());
  auto items = s.transcript(a.id);
  if (!items) return fail(items.err());
  auto cps = s.checkpoints(a.id);
  if (!cps) return fail(cps.err());
  auto refs = s.page_refs(a.id);
  if (!refs) return fail(refs.err());
  struct per_source {
    uint64_t pages = 0, entries = 0;
  };
  std::map<uint32_t, per_source> sources;
  for (const auto& r : *refs) {
    sources[r.source_layer].pages += 1;
    sources[r.source_layer].entries += r.n_entries;
  }
  std::map<std::string, int> kinds;
  for (const auto& it : *items) kinds[sessions::item_kind_name(it.kind)] += 1;
  const uint64_t entry_bytes = info->geometry.entry_bytes();

  if (a.json_out) {
    json j = session_json(*info);
    j["geometry"] = {{"main_dims", info->geometry.main_dims},
                     {"index_dims", info->geometry.index_dims},
                     {"main_entry_bytes", info->geometry.main_entry_bytes},
                     {"index_entry_bytes", info->geometry.index_entry_bytes}};
    j["transcript_items"] = kinds;
    json cj = json::array();
    for (const auto& c : *cps) cj.push_back({{"n_turns", c.n_turns}, {"n_tokens", c.n_tokens}});
    j["checkpoints"] = cj;
    json sj = json::array();
    for (const auto& [layer, ps] : sources)
      sj.push_back({{"source_layer", layer}, {"pages", ps.pages}, {"entries", ps.entries},
                    {"payload_bytes", ps.entries * entry_bytes}});
    j["kv_sources"] = sj;
    auto space = s.page_stats();
    if (!space) return fail(space.err());
    j["page_file"] = page_stats_json(*space);
    std::printf("%s\n", cedar::tools::json_dump(j, 2).c_str());
    return 0;
  }
  std::printf("session %lld  (%s)\n", static_cast<long long>(info->id), info->agent.c_str());
  std::printf("  status      %s\n", sessions::session_status_name(info->status));
  std::printf("  model hash  %s\n", hex64(info->model_hash).c_str());
  std::printf("  turns       %u   tokens %llu\n", info->n_turns,
              static_cast<unsigned long long>(info->n_tokens));
  std::printf("  created     %s   updated %s\n", iso_time(info->created_ms).c_str(),
              iso_time(info->updated_ms).c_str());
  if (info->parent || info->fork_turns > 0)
    std::printf("  forked from %s at turn %u (%llu tokens)\n",
                info->parent ? ("session " + std::to_string(*info->parent)).c_str() : "a removed session",
                info->fork_turns, static_cast<unsigned long long>(info->fork_tokens));
  std::printf("  transcript  %zu items:", items->size());
  for (const auto& [k, n] : kinds) std::printf(" %s=%d", k.c_str(), n);
  std::printf("\n  checkpoints %zu", cps->size());
  if (!cps->empty())
    std::printf(" (latest after %u turns, %llu tokens)", cps->back().n_turns,
                static_cast<unsigned long long>(cps->back().n_tokens));
  std::printf("\n  kv pages    %u+%u B per entry\n", info->geometry.main_entry_bytes,
              info->geometry.index_entry_bytes);
  for (const auto& [layer, ps] : sources)
    std::printf("    source %-3u %6llu pages %9llu entries %12llu B\n", layer,
                static_cast<unsigned long long>(ps.pages), static_cast<unsigned long long>(ps.entries),
                static_cast<unsigned long long>(ps.entries * entry_bytes));
  auto space = s.page_stats();
  if (!space) return fail(space.err());
  std::printf("  store       ");
  print_page_stats(*space);
  return 0;
}

int cmd_export(const sessions_args& a) {
  auto st = open_existing(a.store_path);
  if (!st) return fail(st.err());
  auto info = (*st)->get_session(a.id);
  if (!info) return fail(info.err());
  auto items = (*st)->transcript(a.id);
  if (!items) return fail(items.err());
  json arr = json::array();
  for (const auto& it : *items) {
    // Payloads were validated as JSON on write; one that no longer parses is exported as text.
    json payload = json::parse(it.payload, nullptr, false);
    if (payload.is_discarded()) payload = it.payload;
    arr.push_back({{"seq", it.seq},
                   {"turn", it.turn},
                   {"kind", sessions::item_kind_name(it.kind)},
                   {"tokens", {it.token_begin, it.token_end}},
                   {"payload", std::move(payload)}});
  }
  json out = {{"format", "cedar.transcript"}, {"version", 1}, {"session", session_json(*info)},
              {"items", std::move(arr)}};
  std::printf("%s\n", cedar::tools::json_dump(out, 2).c_str());
  return 0;
}

int cmd_fork(const sessions_args& a) {
  auto st = open_existing(a.store_path);
  if (!st) return fail(st.err());
  auto child = (*st)->fork_session(a.id, a.at_turn, a.agent);
  if (!child) return fail(child.err());
  std::printf("%lld\n", static_cast<long long>(*child));
  std::fprintf(stderr, "forked session %lld at turn %u into session %lld\n",
               static_cast<long long>(a.id), a.at_turn, static_cast<long long>(*child));
  return 0;
}

int cmd_compact(const sessions_args& a) {
  auto st = open_existing(a.store_path);
  if (!st) return fail(st.err());
  auto before = (*st)->page_stats();
  if (!before) return fail(before.err());
  auto after = (*st)->compact_pages();
  if (!after) return fail(after.err());
  if (a.json_out) {
    std::printf("%s\n", cedar::tools::json_dump(json({{"before", page_stats_json(*before)}, {"after", page_stats_json(*after)}}), 2).c_str());
    return 0;
  }
  print_page_stats(*after);
  std::fprintf(stderr, "compacted the page file: %s -> %s\n", mb(before->file_bytes).c_str(),
               mb(after->file_bytes).c_str());
  return 0;
}

int cmd_rm(const sessions_args& a) {
  auto st = open_existing(a.store_path);
  if (!st) return fail(st.err());
  auto r = (*st)->remove_session(a.id);
  if (!r) return fail(r.err());
  std::fprintf(stderr, "removed session %lld\n", static_cast<long long>(a.id));
  return 0;
}

}  // namespace

std::string default_sessions_store_path() {
  const char* xdg = std::getenv("XDG_DATA_HOME");
  if (xdg && *xdg) return std::string(xdg) + "/cedar/sessions.db";
  const char* home = std::getenv("HOME");
  if (home && *home) return std::string(home) + "/.local/share/cedar/sessions.db";
  return {};
}

result<std::string> writable_store_path(const std::string& given) {
  std::string path = given.empty() ? default_sessions_store_path() : given;
  if (path.empty())
    return make_error(errc::invalid_argument, "no store path (neither XDG_DATA_HOME nor HOME is set): pass --store PATH");
  std::error_code ec;  // a parent that cannot be made shows up as the store's open error
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  return path;
}

void add_sessions_commands(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<sessions_args>();
  args->store_path = default_sessions_store_path();
  CLI::App* cmd = app.add_subcommand("sessions", "list, show, export, fork, remove stored sessions; compact the page file");
  cmd->require_subcommand(1);
  cmd->fallthrough();  // --store may come before or after the verb
  cmd->add_option("--store", args->store_path, "the session store file")
      ->capture_default_str();

  auto run = [exit_code, args](int (*fn)(const sessions_args&)) {
    return [exit_code, args, fn] { *exit_code = fn(*args); };
  };
  CLI::App* list = cmd->add_subcommand("list", "list the sessions of the store");
  list->add_flag("--json", args->json_out, "print JSON");
  list->callback(run(cmd_list));

  CLI::App* show = cmd->add_subcommand("show", "show one session: status, turns, checkpoints, KV pages");
  show->add_option("id", args->id, "session id")->required();
  show->add_flag("--json", args->json_out, "print JSON");
  show->callback(run(cmd_show));

  CLI::App* exp = cmd->add_subcommand("export", "print a session's transcript as JSON");
  exp->add_option("id", args->id, "session id")->required();
  exp->callback(run(cmd_export));

  CLI::App* fork = cmd->add_subcommand("fork", "start a new session from the first N turns of one (pages shared)");
  fork->add_option("id", args->id, "session id")->required();
  fork->add_option("--at-turn", args->at_turn, "how many of the session's turns the fork keeps")
      ->required();
  fork->add_option("--agent", args->agent, "agent name of the fork (default: the parent's)");
  fork->callback(run(cmd_fork));

  CLI::App* compact = cmd->add_subcommand(
      "compact", "rewrite the KV page file without the dead bytes of removed sessions");
  compact->add_flag("--json", args->json_out, "print JSON (page file space before and after)");
  compact->callback(run(cmd_compact));

  CLI::App* rm = cmd->add_subcommand("rm", "remove a session (pages shared with forks stay)");
  rm->add_option("id", args->id, "session id")->required();
  rm->callback(run(cmd_rm));
}

}  // namespace cedar::runtime
