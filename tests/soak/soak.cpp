// cedar_soak — the crash-and-resume soak test of issue #10.
//
// Many agents (the default model, the real built-in tools: calculator, notes, clock, file_read,
// file_list) run many turns in a CHILD process that the PARENT kills with SIGKILL at random
// moments and starts again; every restart resumes each agent's session by id from the SQLite
// store and continues its script. One binary plays both roles (`--child` is internal).
//
//   parent                                    child (one per life)
//   ------                                    --------------------
//   plan: per agent {session, next turn} ──►  open runtime; create / resume_agent every agent
//   reads report lines from the pipe    ◄──   "ready|resume_fail|turn|end ..." (one line each)
//   at a random moment*: snapshot the store   one thread per agent: ask() its next turns
//   (read-only SQLite), SIGKILL, wait4        (user texts of tests/eval/ci.jsonl, deterministic
//   post-mortem: open the store, compare       from --seed, agent and turn index)
//   with the snapshot and the reports
//   (* a uniform delay in [--kill-min-ms, --kill-max-ms] after the first finished turn of the
//   life, or in one life of four after every agent is up)
//
// Checks (figures, also as one JSON object with --json):
//   committed items lost     items that another SQLite connection saw committed just before the
//                            kill, or that the previous post-mortem read, or turns the child
//                            reported finished, missing (or changed) afterwards. Must be 0.
//   failed resumes           resume_agent errors, and first turns after a resume that fail.
//                            Must be 0.
//   differing generations    every assistant generation in the final store is compared, token
//                            for token, with an uninterrupted greedy run of the same token log
//                            (an executor_core that never leaves RAM: the prompt delta of each
//                            generation prefilled, then decoded; greedy decoding is a function
//                            of the log). Grouped by how the generation began: fresh, resident,
//                            replayed (bounded replay: approximate, its rate is reported),
//                            reprefilled. Reported, not asserted: prefilling a whole log in one
//                            chunk rounds differently from prefilling it turn by turn, so even
//                            an exact resume may pick another token where two logits nearly tie.
//   exact resume             every reprefilled generation is also compared with a full
//                            recompute (a fresh sequence, the log prefix prefilled in one go,
//                            then decoded): the store round trip must reproduce it exactly. Must
//                            be 0.
//   peak RSS of the child, open fds and threads at the end of each life (bounded).
// Exit status: 0 when every invariant holds, 1 when one fails, 2 on bad usage.
// Wall-clock time is printed, never asserted.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "model/engine.hpp"
#include "model/model_dir.hpp"
#include "model/tokenizer.hpp"
#include "model/tool_grammar.hpp"
#include "runtime/actors.hpp"
#include "runtime/builtin_tools.hpp"
#include "runtime/cedar.hpp"
#include "runtime/eval_tasks.hpp"
#include "runtime/executor_core.hpp"
#include "sessions/store.hpp"
#include "tools_mcp/tool_registry.hpp"

namespace fs = std::filesystem;
using njson = nlohmann::json;

namespace cedar::soak {

using clock_type = std::chrono::steady_clock;

struct options {
  std::string model_dir = std::string(CEDAR_SOURCE_DIR) + "/model/weights/cedar-agent-tiny";
  std::string tasks = std::string(CEDAR_SOURCE_DIR) + "/tests/eval/ci.jsonl";
  std::string work_dir;  // store + file root; a fresh temp dir when empty
  int agents = 8, turns = 12, kills = 10;
  int kill_min_ms = 100, kill_max_ms = 3000;  // delay after a child starts until its SIGKILL
  uint64_t seed = 1;
  std::string resume = "resident";
  int max_new_tokens = 96;
  int max_tool_rounds = 4;
  int scheduler_threads = 2;
  int max_fds = 256, max_threads = 256;  // bounds checked at the end of every life
  int life_timeout_s = 900;               // a life that runs longer is a hung child
  bool json = false, keep = false, short_mode = false;
  // internal (child)
  bool child = false;
  std::string plan;
  bool verify_only = false;  // (debugging) only verify the store of --work-dir
};

resume_policy parse_policy(const std::string& s) {
  if (s == "replay") return resume_policy::replay;
  if (s == "reprefill") return resume_policy::reprefill;
  return resume_policy::resident;
}

std::string agent_name(int i) { return "soak-" + std::to_string(i); }

// ============================================================================================
// process figures (/proc/self)
// ============================================================================================
int count_fds() {
  int n = 0;
  std::error_code ec;
  for (auto it = fs::directory_iterator("/proc/self/fd", ec); !ec && it != fs::directory_iterator(); it.increment(ec)) ++n;
  return n - 1;  // the iterator's own descriptor
}

int count_threads() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("Threads:", 0) == 0) return std::atoi(line.c_str() + 8);
  return -1;
}

// ============================================================================================
// the script: what agent i says in turn t (deterministic in seed, i, t)
// ============================================================================================
struct script {
  std::vector<runtime::eval_task> tasks;

  status load(const std::string& path) {
    auto t = runtime::load_eval_tasks(path);
    if (!t) return t.take_err();
    tasks = std::move(*t);
    if (tasks.empty()) return make_error(errc::invalid_argument, path + ": no tasks");
    return {};
  }
  std::string text(uint64_t seed, int agent, int turn) const {
    uint64_t h = seed * 0x9E3779B97F4A7C15ull ^ uint64_t(agent) * 0xBF58476D1CE4E5B9ull ^ uint64_t(turn) * 0x94D049BB133111EBull;
    h ^= h >> 31;
    const auto& task = tasks[h % tasks.size()];
    return task.turns[(h >> 20) % task.turns.size()];
  }
  // Every task's files under `root` (the file_read / file_list root), every note is ignored
  // (notes live in the process and are lost at a kill, like any in-memory tool state).
  status write_files(const fs::path& root) const {
    for (const auto& t : tasks)
      for (const auto& [rel, content] : t.files) {
        fs::path p = root / rel;
        std::error_code ec;
        fs::create_directories(p.parent_path(), ec);
        std::ofstream f(p, std::ios::binary);
        f << content;
        if (!f) return make_error(errc::io, "cannot write " + p.string());
      }
    return {};
  }
};

// ============================================================================================
// child: one life of the runtime
// ============================================================================================
std::mutex g_out_mu;
void report(const std::string& line) {
  std::lock_guard<std::mutex> lk(g_out_mu);
  std::string l = line + "\n";
  ssize_t off = 0;
  while (off < ssize_t(l.size())) {
    ssize_t w = ::write(1, l.data() + off, l.size() - size_t(off));
    if (w <= 0) return;
    off += w;
  }
}

std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s.size() > 300 ? s.substr(0, 300) : s;
}

int child_main(const options& o) {
  script sc;
  if (auto st = sc.load(o.tasks); !st) {
    report("fatal " + one_line(st.err().message));
    return 2;
  }
  struct plan_row {
    int agent = 0;
    int64_t session = -1;
    int next_turn = 0;
  };
  std::vector<plan_row> plan;
  {
    std::ifstream f(o.plan);
    plan_row r;
    while (f >> r.agent >> r.session >> r.next_turn) plan.push_back(r);
  }
  runtime_options ro;
  ro.model_dir = o.model_dir;
  ro.store_path = (fs::path(o.work_dir) / "soak.db").string();
  ro.files_root = (fs::path(o.work_dir) / "files").string();
  ro.resume = parse_policy(o.resume);
  ro.scheduler_threads = o.scheduler_threads;
  auto rt = agent_runtime::open(ro);
  if (!rt) {
    report("fatal runtime: " + one_line(rt.err().message));
    return 1;
  }
  report("open " + std::to_string(count_fds()) + " " + std::to_string(count_threads()));

  agent_options ao;
  ao.system_prompt = "You are cedar, a helpful assistant. Use the tools when they help.";
  ao.max_new_tokens = o.max_new_tokens;
  ao.max_tool_rounds = o.max_tool_rounds;
  ao.seed = o.seed;
  std::vector<std::unique_ptr<agent>> agents(plan.size());
  std::vector<bool> resumed(plan.size(), false);
  for (size_t k = 0; k < plan.size(); ++k) {
    agent_options a = ao;
    a.name = agent_name(plan[k].agent);
    if (plan[k].session >= 0) {
      auto r = (*rt)->resume_agent(plan[k].session, a);
      if (!r) {
        report("resume_fail " + std::to_string(plan[k].agent) + " " + std::to_string(plan[k].session) + " " +
               one_line(r.err().message));
        continue;
      }
      agents[k] = std::make_unique<agent>(std::move(*r));
      resumed[k] = true;
    } else {
      auto r = (*rt)->create_agent(a);
      if (!r) {
        report("fatal create_agent: " + one_line(r.err().message));
        return 1;
      }
      agents[k] = std::make_unique<agent>(std::move(*r));
    }
    report("ready " + std::to_string(plan[k].agent) + " " + std::to_string(agents[k]->session()) + " " +
           (resumed[k] ? "resumed" : "created"));
  }

  std::vector<std::thread> threads;
  for (size_t k = 0; k < plan.size(); ++k) {
    if (!agents[k]) continue;
    threads.emplace_back([&, k] {
      bool first = true;
      for (int t = plan[k].next_turn; t < o.turns; ++t) {
        auto r = agents[k]->ask(sc.text(o.seed, plan[k].agent, t));
        std::string head = std::to_string(plan[k].agent) + " " + std::to_string(t) + " " +
                           std::to_string(agents[k]->session());
        if (!r) {
          if (first && resumed[k]) report("resume_fail " + head + " first turn: " + one_line(r.err().message));
          else report("turn_error " + head + " " + one_line(r.err().message));
          return;
        }
        std::string paths;
        for (const auto& p : r->resume_paths) paths += (paths.empty() ? "" : ",") + p;
        report("turn " + head + " " + (paths.empty() ? "-" : paths));
        first = false;
      }
    });
  }
  for (auto& t : threads) t.join();
  report("end " + std::to_string(count_fds()) + " " + std::to_string(count_threads()));
  agents.clear();
  rt->reset();
  return 0;
}

// ============================================================================================
// parent: store reads
// ============================================================================================
struct item_row {
  std::string kind, payload;
  bool operator==(const item_row&) const = default;
};
using transcripts = std::map<int64_t, std::vector<item_row>>;

// What another connection sees committed right now (read-only, does not disturb the writer).
result<transcripts> snapshot(const std::string& db) {
  sqlite3* h = nullptr;
  if (sqlite3_open_v2(db.c_str(), &h, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
    std::string m = h ? sqlite3_errmsg(h) : "out of memory";
    sqlite3_close(h);
    return make_error(errc::io, "snapshot: " + m);
  }
  sqlite3_busy_timeout(h, 5000);
  transcripts out;
  sqlite3_stmt* s = nullptr;
  int rc = sqlite3_prepare_v2(h, "SELECT session_id, kind, payload FROM transcript_items ORDER BY session_id, seq", -1, &s,
                              nullptr);
  if (rc == SQLITE_OK) {
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
      auto txt = [&](int c) {
        const unsigned char* p = sqlite3_column_text(s, c);
        return p ? std::string(reinterpret_cast<const char*>(p)) : std::string();
      };
      out[sqlite3_column_int64(s, 0)].push_back({txt(1), txt(2)});
    }
  }
  std::string err = rc == SQLITE_DONE ? "" : sqlite3_errmsg(h);
  sqlite3_finalize(s);
  sqlite3_close(h);
  // A store the child has not created its tables in yet reads as empty.
  if (!err.empty() && err.find("no such table") == std::string::npos) return make_error(errc::io, "snapshot: " + err);
  return out;
}

struct post_mortem {
  transcripts items;
  std::map<std::string, std::vector<int64_t>> sessions_of;  // agent name -> session ids
  int invariant_errors = 0;
  std::vector<std::string> problems;
};

result<post_mortem> read_store(const std::string& db) {
  post_mortem pm;
  if (!fs::exists(db)) return pm;
  auto st = sessions::store::open(db);
  if (!st) return st.take_err();
  auto l = (*st)->list_sessions();
  if (!l) return l.take_err();
  for (const auto& s : *l) {
    pm.sessions_of[s.agent].push_back(s.id);
    auto tr = (*st)->transcript(s.id);
    if (!tr) return tr.take_err();
    auto& v = pm.items[s.id];
    for (const auto& i : *tr) v.push_back({sessions::item_kind_name(i.kind), i.payload});
    if (auto c = (*st)->check_invariants(s.id); !c) {
      pm.invariant_errors++;
      pm.problems.push_back("session " + std::to_string(s.id) + ": " + c.err().message);
    }
  }
  return pm;
}

// Items of `before` missing from (or changed in) `after`.
int64_t lost_items(const transcripts& before, const transcripts& after, std::vector<std::string>& problems) {
  int64_t lost = 0;
  for (const auto& [id, v] : before) {
    auto it = after.find(id);
    size_t have = it == after.end() ? 0 : it->second.size();
    for (size_t k = 0; k < v.size(); ++k)
      if (k >= have || !(it->second[k] == v[k])) {
        lost++;
        if (problems.size() < 20)
          problems.push_back("session " + std::to_string(id) + " item " + std::to_string(k) + " (" + v[k].kind +
                             ") lost or changed");
      }
  }
  return lost;
}

int count_kind(const std::vector<item_row>& v, const char* kind) {
  return int(std::count_if(v.begin(), v.end(), [&](const item_row& r) { return r.kind == kind; }));
}

// ============================================================================================
// parent: verification of every generation against an uninterrupted greedy run
// ============================================================================================
struct verify_counts {
  std::map<std::string, std::pair<int64_t, int64_t>> by_path;  // path -> {generations, differing}
  // Reprefilled generations against a full recompute (the whole log prefix prefilled in one
  // go, as the reprefill path does): exact resume must match it token for token.
  int64_t recompute_checked = 0, recompute_differing = 0;
  int64_t turns = 0, resumed_turns = 0, resumed_turns_differing = 0, turns_differing = 0;
  int64_t first_divergent_tokens = 0;  // sum over differing generations: tokens before the first difference
  std::vector<std::string> problems;
};

// The grammar the soak's agents sample their replies under: every registered tool is offered
// (agent_options::tools empty), and the runtime registers the built-ins alone.
result<std::string> agents_tool_grammar(const std::string& files_root) {
  tools::tool_registry reg;
  for (auto& t : runtime::builtin_tools(files_root))
    if (auto st = reg.add(std::move(t)); !st) return st.take_err();
  return runtime::offer_tools(reg, {}).grammar;
}

result<verify_counts> verify_generations(const std::string& db, const model::engine& eng,
                                         std::shared_ptr<const model::tokenizer> tok, int max_new_tokens,
                                         const std::string& files_root) {
  verify_counts vc;
  auto agent_grammar = agents_tool_grammar(files_root);
  if (!agent_grammar) return agent_grammar.take_err();
  auto st = sessions::store::open(db);
  if (!st) return st.take_err();
  auto l = (*st)->list_sessions();
  if (!l) return l.take_err();
  runtime::executor_options eo;
  eo.tokenizer = std::move(tok);  // the grammar of a final reply after a limit reads token bytes
  runtime::executor_core core(eng, size_t(1) << 30, eo);
  runtime::generation_params gp;
  gp.max_new_tokens = max_new_tokens;
  gp.stop_ids = {int32_t(eng.config().eos_token_id)};
  for (const auto& s : *l) {
    auto tr = (*st)->transcript(s.id);
    if (!tr) return tr.take_err();
    auto log = (*st)->tokens(s.id);
    if (!log) return log.take_err();
    const int64_t ref = s.id;
    core.open_fresh(ref);
    uint64_t pos = 0;       // the reference sequence holds log[0, pos)
    uint64_t last_end = 0;  // end of the previous reply in the log
    bool fresh = true;
    int64_t turn = -1;
    bool turn_resumed = false, turn_differs = false;
    auto close_turn = [&] {
      if (turn < 0) return;
      vc.turns++;
      if (turn_differs) vc.turns_differing++;
      if (turn_resumed) {
        vc.resumed_turns++;
        if (turn_differs) vc.resumed_turns_differing++;
      }
    };
    for (const auto& item : *tr) {
      if (item.kind == sessions::item_kind::user) {
        close_turn();
        turn++;
        turn_resumed = turn_differs = false;
      }
      if (item.kind != sessions::item_kind::assistant) continue;
      njson p = njson::parse(item.payload, nullptr, false);
      std::string path = p.is_object() ? p.value("resume_path", "?") : "?";
      uint64_t b = item.token_begin, e = item.token_end;
      if (e > log->size() || b > e) {
        vc.problems.push_back("session " + std::to_string(s.id) + ": assistant item outside the token log");
        continue;
      }
      if (b <= pos || pos == UINT64_MAX) {  // the reference went elsewhere: rebuild it
        core.drop(ref);
        core.open_fresh(ref);
        pos = 0;
        fresh = true;
      }
      // Each reply decodes under the grammar the agent sampled it with: its offered tools', or
      // the grammar of no tools for the final reply after a limit (answer_on_limit).
      gp.tool_grammar = p.is_object() && p.value("final_reply", false) ? model::tool_grammar_spec({}) : *agent_grammar;
      std::span<const int32_t> prompt(log->data() + pos, b - pos);
      auto t = core.start(ref, prompt, gp, fresh ? runtime::resume_path::fresh : runtime::resume_path::resident, 0);
      if (!t) return make_error(errc::internal, "reference run: " + t.err().message);
      for (int i = 0; i < max_new_tokens + 2 && core.active(ref); ++i)
        if (auto r = core.step(); !r) return make_error(errc::internal, "reference run: " + r.err().message);
      auto fin = core.take_finished();
      if (fin.size() != 1) return make_error(errc::internal, "reference run did not finish");
      const auto& got = fin.front().generated;
      std::vector<int32_t> stored(log->begin() + int64_t(b), log->begin() + int64_t(e));
      bool same = got == stored;
      auto& c = vc.by_path[path];
      c.first++;
      if (!same) {
        c.second++;
        size_t k = 0;
        while (k < got.size() && k < stored.size() && got[k] == stored[k]) ++k;
        vc.first_divergent_tokens += int64_t(k);
        turn_differs = true;
      }
      if (path == "replayed" || path == "reprefilled") turn_resumed = true;
      if (path == "reprefilled") {
        // As the runtime's reprefill path computes it: the log up to the previous reply
        // re-prefilled by restore() (pages unusable -> reprefilled), then this turn's delta.
        const int64_t full = ref + (int64_t(1) << 40);
        runtime::resume_state rs;
        rs.tokens.assign(log->begin(), log->begin() + int64_t(last_end));
        rs.pages_ok = false;
        rs.problem = "soak reference: recompute";
        auto rp = core.restore(full, rs);
        if (!rp) return make_error(errc::internal, "recompute restore: " + rp.err().message);
        auto t2 = core.start(full, std::span<const int32_t>(log->data() + last_end, b - last_end), gp,
                             runtime::resume_path::reprefilled, 0);
        if (!t2) return make_error(errc::internal, "recompute run: " + t2.err().message);
        for (int i = 0; i < max_new_tokens + 2 && core.active(full); ++i)
          if (auto r = core.step(); !r) return make_error(errc::internal, "recompute run: " + r.err().message);
        auto fin2 = core.take_finished();
        if (fin2.size() != 1) return make_error(errc::internal, "recompute run did not finish");
        vc.recompute_checked++;
        if (fin2.front().generated != stored) vc.recompute_differing++;
        core.drop(full);
      }
      fresh = false;
      last_end = e;
      pos = same ? e : UINT64_MAX;
    }
    close_turn();
    core.drop(ref);
  }
  return vc;
}

// ============================================================================================
// parent: the lives
// ============================================================================================
struct figures {
  int lives = 0, kills = 0, child_failures = 0;
  int64_t lost = 0, checked_items = 0, lost_turns = 0;
  int resumes = 0, failed_resumes = 0, turns_done = 0, turn_errors = 0, invariant_errors = 0;
  long peak_rss_kb = 0;
  int fds_open = -1, threads_open = -1;   // after the runtime opened (last life)
  int fds_end = -1, threads_end = -1;     // at the end of the last life
  int max_fds_end = 0, max_threads_end = 0;
  verify_counts v;
  double seconds = 0, verify_seconds = 0;
  std::vector<std::string> problems;
};

struct agent_progress {
  int64_t session = -1;
  int next_turn = 0;
  int reported_turns = 0;  // turns the child reported finished (committed)
};

std::vector<std::string> split(const std::string& s) {
  std::istringstream is(s);
  std::vector<std::string> v;
  std::string w;
  while (is >> w) v.push_back(w);
  return v;
}

int parent_main(options o, const std::vector<std::string>& argv0) {
  auto t_start = clock_type::now();
  bool temp = o.work_dir.empty();
  if (temp) {
    std::string tmpl = (fs::temp_directory_path() / "cedar-soak-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) {
      std::fprintf(stderr, "cedar_soak: cannot create a temp dir\n");
      return 1;
    }
    o.work_dir = tmpl;
  }
  fs::create_directories(fs::path(o.work_dir) / "files");
  const std::string db = (fs::path(o.work_dir) / "soak.db").string();
  const std::string log_path = (fs::path(o.work_dir) / "child.log").string();
  script sc;
  if (auto st = sc.load(o.tasks); !st) {
    std::fprintf(stderr, "cedar_soak: %s\n", st.err().message.c_str());
    return 2;
  }
  if (auto st = sc.write_files(fs::path(o.work_dir) / "files"); !st) {
    std::fprintf(stderr, "cedar_soak: %s\n", st.err().message.c_str());
    return 1;
  }

  figures f;
  bool finished = o.verify_only;
  std::mt19937_64 rng(o.seed * 1000003 + 17);
  std::vector<agent_progress> prog(size_t(o.agents));
  transcripts previous;  // what the last post-mortem read
  const int max_lives = o.kills + 1 + std::max(3, o.kills / 2);
  while (!finished && f.lives < max_lives) {
    // ---- plan ----
    std::string plan_path = (fs::path(o.work_dir) / "plan.txt").string();
    {
      std::ofstream pf(plan_path);
      for (int i = 0; i < o.agents; ++i)
        if (prog[size_t(i)].next_turn < o.turns) pf << i << " " << prog[size_t(i)].session << " " << prog[size_t(i)].next_turn << "\n";
    }
    // ---- start the child ----
    int fds[2];
    if (pipe(fds) != 0) return 1;
    pid_t pid = fork();
    if (pid == 0) {
      dup2(fds[1], 1);
      int lf = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (lf >= 0) dup2(lf, 2);
      close(fds[0]);
      std::vector<std::string> args = argv0;
      args.insert(args.end(), {"--child", "--plan", plan_path, "--work-dir", o.work_dir});
      std::vector<char*> cargs;
      for (auto& a : args) cargs.push_back(a.data());
      cargs.push_back(nullptr);
      execv("/proc/self/exe", cargs.data());
      _exit(127);
    }
    close(fds[1]);
    f.lives++;
    bool will_kill = f.kills < o.kills;
    std::uniform_int_distribution<int> delay(o.kill_min_ms, std::max(o.kill_min_ms, o.kill_max_ms));
    // The kill clock starts once every agent of the plan is created or resumed (model loading
    // takes a machine-dependent while); a watchdog ends a life that hangs.
    const auto never = clock_type::time_point::max();
    auto kill_at = never;
    const auto life_deadline = clock_type::now() + std::chrono::seconds(o.life_timeout_s);
    int planned = 0, started = 0;
    const bool arm_at_ready = rng() % 4 == 0;
    for (const auto& a : prog)
      if (a.next_turn < o.turns) planned++;
    std::string buf;
    bool eof = false, killed = false;
    transcripts before_kill;
    std::vector<int> resumed_agents;
    std::set<int> first_turn_seen;
    auto handle = [&](const std::string& line) {
      auto w = split(line);
      if (w.empty()) return;
      // One life in four arms its kill once every agent is up (kills during resumes and first
      // prefills), the others once a turn has finished (so that every life makes progress
      // whatever the machine's speed).
      if (w[0] == "ready" || w[0] == "resume_fail")
        if (++started == planned && will_kill && arm_at_ready) kill_at = clock_type::now() + std::chrono::milliseconds(delay(rng));
      if (w[0] == "turn" && will_kill && kill_at == never) kill_at = clock_type::now() + std::chrono::milliseconds(delay(rng));
      if (w[0] == "ready" && w.size() >= 4) {
        int a = std::stoi(w[1]);
        prog[size_t(a)].session = std::stoll(w[2]);
        if (w[3] == "resumed") f.resumes++;
      } else if (w[0] == "resume_fail") {
        f.failed_resumes++;
        f.problems.push_back("child: " + line);
      } else if (w[0] == "turn" && w.size() >= 4) {
        int a = std::stoi(w[1]), t = std::stoi(w[2]);
        prog[size_t(a)].reported_turns = std::max(prog[size_t(a)].reported_turns, t + 1);
        f.turns_done++;
      } else if (w[0] == "turn_error") {
        f.turn_errors++;
        f.problems.push_back("child: " + line);
      } else if (w[0] == "open" && w.size() >= 3) {
        f.fds_open = std::stoi(w[1]);
        f.threads_open = std::stoi(w[2]);
      } else if (w[0] == "end" && w.size() >= 3) {
        f.fds_end = std::stoi(w[1]);
        f.threads_end = std::stoi(w[2]);
        f.max_fds_end = std::max(f.max_fds_end, f.fds_end);
        f.max_threads_end = std::max(f.max_threads_end, f.threads_end);
      } else if (w[0] == "fatal") {
        f.problems.push_back("child: " + line);
      }
    };
    while (!eof) {
      int wait_ms = 200;
      if (!killed && clock_type::now() > life_deadline) {
        kill(pid, SIGKILL);
        killed = true;
        f.child_failures++;
        f.problems.push_back("life " + std::to_string(f.lives) + " hung for " + std::to_string(o.life_timeout_s) + " s");
        continue;
      }
      if (will_kill && !killed && kill_at != never) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(kill_at - clock_type::now()).count();
        if (left <= 0) {
          auto snap = snapshot(db);
          if (snap) before_kill = std::move(*snap);
          else f.problems.push_back(snap.err().message);
          kill(pid, SIGKILL);
          killed = true;
          f.kills++;
          continue;
        }
        wait_ms = int(std::min<int64_t>(left, 200));
      }
      pollfd p{fds[0], POLLIN, 0};
      int r = poll(&p, 1, wait_ms);
      if (r > 0) {
        char tmp[4096];
        ssize_t n = read(fds[0], tmp, sizeof tmp);
        if (n <= 0) {
          eof = true;
        } else {
          buf.append(tmp, size_t(n));
          size_t nl;
          while ((nl = buf.find('\n')) != std::string::npos) {
            handle(buf.substr(0, nl));
            buf.erase(0, nl + 1);
          }
        }
      }
    }
    close(fds[0]);
    int wst = 0;
    rusage ru{};
    wait4(pid, &wst, 0, &ru);
    f.peak_rss_kb = std::max(f.peak_rss_kb, long(ru.ru_maxrss));
    bool clean_exit = WIFEXITED(wst) && WEXITSTATUS(wst) == 0;
    if (!killed && !clean_exit) {
      f.child_failures++;
      f.problems.push_back("life " + std::to_string(f.lives) + ": child ended with status " + std::to_string(wst) +
                           " (see " + log_path + ")");
    }

    // ---- post-mortem ----
    auto pm = read_store(db);
    if (!pm) {
      f.problems.push_back("store after life " + std::to_string(f.lives) + ": " + pm.err().message);
      f.failed_resumes += o.agents;  // nothing can resume from a store that does not open
      break;
    }
    f.invariant_errors += pm->invariant_errors;
    for (auto& p : pm->problems) f.problems.push_back(p);
    for (const auto& [id, v] : before_kill) f.checked_items += int64_t(v.size());
    f.lost += lost_items(before_kill, pm->items, f.problems);
    f.lost += lost_items(previous, pm->items, f.problems);
    previous = pm->items;
    finished = true;
    for (int i = 0; i < o.agents; ++i) {
      auto& a = prog[size_t(i)];
      auto it = pm->sessions_of.find(agent_name(i));
      if (it != pm->sessions_of.end()) {
        if (it->second.size() > 1)
          f.problems.push_back(agent_name(i) + " has " + std::to_string(it->second.size()) + " sessions");
        a.session = it->second.front();
      }
      int users = a.session >= 0 ? count_kind(pm->items[a.session], "user") : 0;
      if (users < a.reported_turns) {
        f.lost_turns += a.reported_turns - users;
        f.problems.push_back(agent_name(i) + ": the child reported " + std::to_string(a.reported_turns) +
                             " turns finished, the store holds " + std::to_string(users));
      }
      a.next_turn = users;  // a turn whose first generation was lost starts again
      if (a.next_turn < o.turns) finished = false;
    }
    if (!killed && !finished && clean_exit) {
      // The child ended normally, yet some agent did not finish: its turn failed (reported).
      break;
    }
  }
  if (!finished) f.problems.push_back("the agents did not finish their turns in " + std::to_string(f.lives) + " lives");

  // ---- verification against an uninterrupted run ----
  auto tv = clock_type::now();
  auto m = model::load_model_dir(o.model_dir, true);
  if (!m) {
    std::fprintf(stderr, "cedar_soak: %s\n", m.err().message.c_str());
    return 1;
  }
  auto vc = verify_generations(db, *m->eng, m->tok, o.max_new_tokens, (fs::path(o.work_dir) / "files").string());
  if (!vc) f.problems.push_back("verification: " + vc.err().message);
  else f.v = std::move(*vc);
  for (auto& p : f.v.problems) f.problems.push_back(p);
  f.verify_seconds = std::chrono::duration<double>(clock_type::now() - tv).count();
  f.seconds = std::chrono::duration<double>(clock_type::now() - t_start).count();

  // ---- invariants ----
  int64_t gens = 0, differing = 0, resumed_gens = 0, resumed_differing = 0;
  for (const auto& [path, c] : f.v.by_path) {
    gens += c.first;
    differing += c.second;
    if (path == "replayed" || path == "reprefilled") {
      resumed_gens += c.first;
      resumed_differing += c.second;
    }
  }
  const int64_t exact_differing = f.v.recompute_differing;
  std::vector<std::string> failed;
  if (f.lost + f.lost_turns != 0) failed.push_back("committed items lost");
  if (f.failed_resumes != 0) failed.push_back("failed resumes");
  if (f.turn_errors != 0) failed.push_back("turn errors");
  if (f.child_failures != 0) failed.push_back("child failures");
  if (f.invariant_errors != 0) failed.push_back("store invariants");
  if (!finished) failed.push_back("unfinished agents");
  if (exact_differing != 0) failed.push_back("exact resume differs from a full recompute");
  if (f.max_fds_end > o.max_fds || f.max_threads_end > o.max_threads) failed.push_back("fds/threads bound");
  if (gens == 0) failed.push_back("no generation verified");
  for (const auto& p : f.problems)
    if (p.rfind("verification", 0) == 0) failed.push_back("verification");

  auto rate = [](int64_t a, int64_t b) { return b ? double(a) / double(b) : 0.0; };
  if (o.json) {
    njson j;
    j["agents"] = o.agents;
    j["turns_per_agent"] = o.turns;
    j["resume"] = o.resume;
    j["seed"] = o.seed;
    j["lives"] = f.lives;
    j["kills"] = f.kills;
    j["committed_items_lost"] = f.lost + f.lost_turns;
    j["committed_items_checked"] = f.checked_items;
    j["resumes"] = f.resumes;
    j["failed_resumes"] = f.failed_resumes;
    j["turns_done"] = f.turns_done;
    j["turn_errors"] = f.turn_errors;
    j["store_invariant_errors"] = f.invariant_errors;
    njson bp = njson::object();
    for (const auto& [path, c] : f.v.by_path) bp[path] = {{"generations", c.first}, {"differing", c.second}};
    j["generations"] = bp;
    j["generations_differing"] = differing;
    j["resumed_generations"] = resumed_gens;
    j["resumed_generations_differing"] = resumed_differing;
    j["resumed_generation_differ_rate"] = rate(resumed_differing, resumed_gens);
    j["turns_verified"] = f.v.turns;
    j["resumed_turns"] = f.v.resumed_turns;
    j["resumed_turns_differing"] = f.v.resumed_turns_differing;
    j["resumed_turn_differ_rate"] = rate(f.v.resumed_turns_differing, f.v.resumed_turns);
    j["exact_resume_checked"] = f.v.recompute_checked;
    j["exact_resume_differing"] = exact_differing;
    j["peak_rss_mb"] = double(f.peak_rss_kb) / 1024.0;
    j["fds_open"] = f.fds_open;
    j["fds_end"] = f.fds_end;
    j["threads_open"] = f.threads_open;
    j["threads_end"] = f.threads_end;
    j["max_fds_end"] = f.max_fds_end;
    j["max_threads_end"] = f.max_threads_end;
    j["seconds"] = f.seconds;
    j["verify_seconds"] = f.verify_seconds;
    j["ok"] = failed.empty();
    j["failed"] = failed;
    j["problems"] = f.problems;
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("cedar soak: %d agents x %d turns, resume %s, seed %llu, %d lives, %d SIGKILLs\n", o.agents, o.turns,
                o.resume.c_str(), (unsigned long long)o.seed, f.lives, f.kills);
    std::printf("  committed items lost            %lld   (%lld items checked at kills)\n",
                (long long)(f.lost + f.lost_turns), (long long)f.checked_items);
    std::printf("  sessions failed to resume       %d   (of %d resumes)\n", f.failed_resumes, f.resumes);
    std::printf("  turns finished / turn errors    %d / %d\n", f.turns_done, f.turn_errors);
    std::printf("  store invariant errors          %d\n", f.invariant_errors);
    std::printf("  generations vs uninterrupted    ");
    for (const auto& [path, c] : f.v.by_path)
      std::printf("%s %lld/%lld differ  ", path.c_str(), (long long)c.second, (long long)c.first);
    std::printf("\n");
    std::printf("  resumed generations differing   %lld / %lld (%.1f%%)\n", (long long)resumed_differing,
                (long long)resumed_gens, 100 * rate(resumed_differing, resumed_gens));
    std::printf("  resumed turns differing         %lld / %lld (%.1f%%)\n", (long long)f.v.resumed_turns_differing,
                (long long)f.v.resumed_turns, 100 * rate(f.v.resumed_turns_differing, f.v.resumed_turns));
    std::printf("  exact resume vs full recompute  %lld / %lld differ\n", (long long)exact_differing,
                (long long)f.v.recompute_checked);
    std::printf("  peak RSS (child)                %.1f MiB\n", double(f.peak_rss_kb) / 1024.0);
    std::printf("  fds / threads at open           %d / %d\n", f.fds_open, f.threads_open);
    std::printf("  fds / threads at end            %d / %d   (max over lives %d / %d)\n", f.fds_end, f.threads_end,
                f.max_fds_end, f.max_threads_end);
    std::printf("  seconds                         %.1f   (verification %.1f)\n", f.seconds, f.verify_seconds);
    for (size_t i = 0; i < f.problems.size() && i < 20; ++i) std::printf("  problem: %s\n", f.problems[i].c_str());
    std::printf("%s\n", failed.empty() ? "OK" : "FAILED");
    for (const auto& w : failed) std::printf("  failed: %s\n", w.c_str());
  }
  if (temp && !o.keep && failed.empty()) {
    std::error_code ec;
    fs::remove_all(o.work_dir, ec);
  } else if (!failed.empty()) {
    std::fprintf(stderr, "cedar_soak: work dir kept: %s (child stderr in child.log)\n", o.work_dir.c_str());
  }
  return failed.empty() ? 0 : 1;
}

}  // namespace cedar::soak

int main(int argc, char** argv) {
  using cedar::soak::options;
  options o;
  CLI::App app{
      "cedar_soak: agents run turns in a child process that is SIGKILLed at random moments and restarted; "
      "every restart resumes each session from the SQLite store. Prints committed items lost, failed resumes, "
      "generations that differ from an uninterrupted greedy run, peak RSS, fds and threads. Exit 0 when every "
      "invariant holds."};
  app.add_option("--model", o.model_dir, "model directory")->capture_default_str();
  app.add_option("--tasks", o.tasks, "task file whose user turns the agents say (cedar eval format)")->capture_default_str();
  app.add_option("--work-dir", o.work_dir, "directory for the store and the file root (default: a fresh temp dir)");
  app.add_option("-a,--agents", o.agents, "agents")->capture_default_str()->check(CLI::Range(1, 256));
  app.add_option("-t,--turns", o.turns, "user turns per agent")->capture_default_str()->check(CLI::Range(1, 100000));
  app.add_option("-k,--kills", o.kills, "SIGKILLs before the last life runs to its end")->capture_default_str()->check(CLI::Range(0, 100000));
  app.add_option("--kill-min-ms", o.kill_min_ms, "earliest kill after a child starts")->capture_default_str();
  app.add_option("--kill-max-ms", o.kill_max_ms, "latest kill after a child starts")->capture_default_str();
  app.add_option("--seed", o.seed, "seed of the script and of the kill times")->capture_default_str();
  app.add_option("--resume", o.resume, "resume policy: resident (production), replay (bounded replay at every resume), "
                                       "reprefill (exact: must not differ)")
      ->capture_default_str()
      ->check(CLI::IsMember({"resident", "replay", "reprefill"}));
  app.add_option("--max-new-tokens", o.max_new_tokens, "per model reply")->capture_default_str();
  app.add_option("--max-tool-rounds", o.max_tool_rounds, "model replies with tool calls per turn")->capture_default_str();
  app.add_option("--scheduler-threads", o.scheduler_threads, "CAF scheduler threads of the child")->capture_default_str();
  app.add_option("--life-timeout", o.life_timeout_s, "seconds after which a child counts as hung")->capture_default_str();
  app.add_option("--max-fds", o.max_fds, "bound on open fds at the end of a life")->capture_default_str();
  app.add_option("--max-threads", o.max_threads, "bound on threads at the end of a life")->capture_default_str();
  app.add_flag("--short", o.short_mode, "CI mode: 3 agents, 3 turns, 3 kills, kills within 0.1-1.5 s");
  app.add_flag("--json", o.json, "print the figures as one JSON object");
  app.add_flag("--keep", o.keep, "keep the work dir");
  app.add_flag("--child", o.child, "(internal) run one life")->group("");
  app.add_option("--plan", o.plan, "(internal) the child's plan file")->group("");
  app.add_flag("--verify-only", o.verify_only, "only compare the generations in the store of --work-dir with an "
                                               "uninterrupted run");
  CLI11_PARSE(app, argc, argv);
  if (o.child) return cedar::soak::child_main(o);
  if (o.short_mode) {
    o.agents = 3;
    o.turns = 3;
    o.kills = 3;
    o.kill_min_ms = 100;
    o.kill_max_ms = 1500;
  }
  // The child gets every option again (minus the parent-only ones).
  std::vector<std::string> args = {argv[0], "--model", o.model_dir, "--tasks", o.tasks, "--turns", std::to_string(o.turns),
                                   "--seed", std::to_string(o.seed), "--resume", o.resume, "--max-new-tokens",
                                   std::to_string(o.max_new_tokens), "--max-tool-rounds", std::to_string(o.max_tool_rounds),
                                   "--scheduler-threads", std::to_string(o.scheduler_threads)};
  return cedar::soak::parent_main(o, args);
}
