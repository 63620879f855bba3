// `cedar eval TASKS.jsonl [--json]` — issue 6 "Evaluation": every task of a task file
// (runtime/eval_tasks.hpp) runs through the real runtime: an agent actor, the executor, a SQLite
// session store on a temp file, the real built-in tools (and MCP servers with --mcp-config),
// greedy decoding. The model is loaded once; each task gets its own runtime on it, in a fresh
// temporary directory holding its file root (the task's `files`) and its store.
//
// Resume policy (what the eval measures): by default `replay` — every session is evicted to the
// store after each commit, so every resume after a tool result or a user turn restores the FP4
// global KV and runs bounded replay, as production does once sessions leave RAM. `--exact-resume`
// re-prefills the token log instead; `--resume resident` keeps sessions in RAM; `--kv bf16`
// keeps the KV unquantised (fp32: the engine's no-quantisation diagnostic; never persisted, so
// resumes re-prefill — it is the "bf16 KV + exact resume" baseline of the issue);
// `--kv bf16+main+index+swa` (any of the three) rounds those parts through their stored format
// on top of it, to tell which quantisation costs what.
//
// Output: one line per task and a summary on stdout (or one JSON object with --json); progress
// on stderr. Counting: a tool call is every call the model made (DSML blocks that parsed into a
// call, plus one per malformed DSML block); it is valid when it names an offered tool and its
// arguments are JSON matching the tool's input schema (turn_result::invalid_tool_calls).
// Exit codes: 0 the run completed (whatever the success rate), 1 runtime failure, 2 bad input.
#include "runtime/cmd_eval.hpp"

#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "kernels/base/log.hpp"
#include "model/model_dir.hpp"
#include "model/sequence.hpp"
#include "runtime/builtin_tools.hpp"
#include "tools_mcp/json.hpp"

namespace cedar::runtime {

namespace fs = std::filesystem;
using njson = nlohmann::json;

namespace {

using clock_type = std::chrono::steady_clock;

const char* policy_name(resume_policy p) {
  switch (p) {
    case resume_policy::resident: return "resident";
    case resume_policy::replay: return "replay";
    case resume_policy::reprefill: return "reprefill";
  }
  return "?";
}

// A fresh private directory under the system temp dir; removed by the destructor.
struct temp_dir {
  fs::path path;
  temp_dir() {
    std::string tmpl = (fs::temp_directory_path() / "cedar-eval-XXXXXX").string();
    if (char* p = mkdtemp(tmpl.data())) path = p;
  }
  ~temp_dir() {
    std::error_code ec;
    if (!path.empty()) fs::remove_all(path, ec);
  }
};

std::string one_line(const std::string& s, size_t max) {
  std::string out;
  for (char c : s) {
    if (out.size() >= max) {
      out += "...";
      break;
    }
    out += (c == '\n' || c == '\r' || c == '\t') ? ' ' : c;
  }
  return out;
}

status write_files(const fs::path& root, const eval_task& t) {
  for (const auto& [rel, content] : t.files) {
    fs::path p = root / rel;
    std::error_code ec;
    fs::create_directories(p.parent_path(), ec);
    if (ec) return make_error(errc::io, "files: cannot create " + p.parent_path().string() + ": " + ec.message());
    std::ofstream f(p, std::ios::binary);
    f << content;
    if (!f) return make_error(errc::io, "files: cannot write " + rel);
  }
  return {};
}

}  // namespace

result<std::pair<bool, uint8_t>> parse_kv(const std::string& v) {
  if (v == "fp4") return std::pair<bool, uint8_t>{false, 0};
  if (v.rfind("bf16", 0) != 0)
    return make_error(errc::invalid_argument, "'" + v + "': expected fp4, bf16 or bf16+PART+... (PART: main, index, swa)");
  uint8_t bits = 0;
  size_t at = 4;
  while (at < v.size()) {
    if (v[at] != '+')
      return make_error(errc::invalid_argument, "'" + v + "': expected fp4, bf16 or bf16+PART+... (PART: main, index, swa)");
    const size_t end = std::min(v.find('+', at + 1), v.size());
    const std::string part = v.substr(at + 1, end - at - 1);
    const uint8_t bit = part == "main" ? model::kv_part_main : part == "index" ? model::kv_part_index
                      : part == "swa"  ? model::kv_part_swa  : 0;
    if (!bit) return make_error(errc::invalid_argument, "'" + v + "': unknown part '" + part + "' (main, index, swa)");
    if (bits & bit) return make_error(errc::invalid_argument, "'" + v + "': part '" + part + "' given twice");
    bits |= bit;
    at = end;
  }
  return std::pair<bool, uint8_t>{true, bits};
}

std::string kv_name(const eval_settings& s) {
  if (!s.kv_unquantised) return "fp4";
  std::string n = "bf16";
  if (s.kv_rounded & model::kv_part_main) n += "+main";
  if (s.kv_rounded & model::kv_part_index) n += "+index";
  if (s.kv_rounded & model::kv_part_swa) n += "+swa";
  return n;
}

eval_outcome run_eval_task(const eval_task& t, const eval_settings& s) {
  auto t0 = clock_type::now();
  eval_outcome o;
  o.id = t.id;
  o.family = t.family;
  auto done = [&] {
    o.seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
    return o;
  };
  temp_dir dir;
  if (dir.path.empty()) {
    o.error = "cannot create a temporary directory";
    return done();
  }
  const fs::path root = dir.path / "files";
  std::error_code ec;
  fs::create_directories(root, ec);
  if (auto st = write_files(root, t); !st) {
    o.error = st.err().message;
    return done();
  }

  // The built-in tools on this task's file root; the clock fixed when the task says so.
  std::vector<tools::tool> builtins = builtin_tools(root.string());
  std::optional<tools::tool> notes_save;
  for (auto& tool : builtins) {
    if (tool.name == "clock" && t.clock) {
      std::string now = *t.clock;
      tool.invoke = [now](const tools::json&, const tools::invoke_context&) -> result<tools::tool_result> {
        return tools::text_result(now);
      };
    }
    if (tool.name == "notes_save") notes_save = tool;  // shares the notebook with the registered copy
  }

  runtime_options ro;
  ro.model_dir = s.model_dir;
  ro.engine = s.engine;
  ro.tokenizer = s.tokenizer;
  ro.store_path = (dir.path / "sessions.db").string();
  ro.mcp_config = s.mcp_config;
  ro.builtin_tools = false;
  ro.files_root = root.string();
  ro.resume = s.resume;
  ro.kv_unquantised = s.kv_unquantised;
  ro.kv_rounded = s.kv_rounded;
  ro.scheduler_threads = 2;
  auto rt = agent_runtime::open(ro);
  if (!rt) {
    o.error = "runtime: " + rt.err().message;
    return done();
  }
  for (auto& tool : builtins)
    if (auto st = (*rt)->add_tool(std::move(tool)); !st) {
      o.error = "tools: " + st.err().message;
      return done();
    }
  std::vector<std::string> have = (*rt)->tool_names();
  for (const auto& name : t.tools)
    if (std::find(have.begin(), have.end(), name) == have.end()) {
      o.error = "tool '" + name + "' is not registered" +
                (name.find("__") != std::string::npos ? " (MCP tools need --mcp-config)" : "");
      return done();
    }

  agent_options ao;
  ao.name = "eval";
  ao.system_prompt = t.has_system ? t.system : s.default_system;
  ao.tools = t.tools;
  ao.temperature = 0;
  ao.max_new_tokens = s.max_new_tokens;
  ao.max_tool_rounds = s.max_rounds;
  ao.max_repeated_failures = s.max_repeated_failures;
  ao.answer_on_limit = s.answer_on_limit;
  ao.constrain_tool_calls = s.constrain_tool_calls;
  auto a = (*rt)->create_agent(ao);
  if (!a) {
    o.error = "agent: " + a.err().message;
    return done();
  }
  if (!t.notes.empty()) {
    if (!notes_save) {
      o.error = "notes: the notes_save tool is not available";
      return done();
    }
    tools::invoke_context ctx;
    ctx.session = std::to_string(a->session());
    for (const auto& [k, v] : t.notes) {
      auto r = notes_save->invoke(tools::json{{"key", k}, {"text", v}}, ctx);
      if (!r || r->is_error) {
        o.error = "notes: cannot save '" + k + "'";
        return done();
      }
    }
  }

  for (const std::string& turn : t.turns) {
    o.transcript.push_back({"user", turn, "", "", false});
    auto on_event = [&](const agent_event& e) {
      switch (e.type) {
        case agent_event::kind::token:
          if (o.transcript.empty() || o.transcript.back().role != "assistant") o.transcript.push_back({"assistant", "", "", "", false});
          o.transcript.back().text += e.text;
          break;
        case agent_event::kind::tool_call:
          o.transcript.push_back({"tool_call", "", e.tool, e.arguments, false});
          break;
        case agent_event::kind::tool_result:
          if (e.is_error) o.tool_errors++;
          o.transcript.push_back({"tool_result", e.text, e.tool, "", e.is_error});
          break;
        case agent_event::kind::refused_call:  // a limit stopped it: never run, "not run: ..."
          o.transcript.push_back({"refused_call", e.text, e.tool, e.arguments, true});
          break;
        default:
          break;
      }
    };
    auto r = a->ask(turn, on_event);
    o.turns++;
    if (!r) {
      o.error = r.err().message;
      return done();
    }
    o.rounds += r->rounds;
    o.tool_calls += r->tool_calls;
    o.invalid_tool_calls += r->invalid_tool_calls;
    o.masked_tokens += r->masked_tokens;
    o.prompt_tokens += r->prompt_tokens;
    o.replayed_tokens += r->replayed_tokens;
    o.generated_tokens += r->generated_tokens;
    o.context = r->context;
    o.round_limit = o.round_limit || r->round_limit;
    o.repeat_limit = o.repeat_limit || r->repeat_limit;
    for (const auto& p : r->resume_paths) {
      if (p == "fresh") o.fresh++;
      else if (p == "resident") o.resident++;
      else if (p == "replayed") o.replayed++;
      else if (p == "reprefilled") o.reprefilled++;
    }
    o.answer = r->answer;
  }
  o.ok = eval_expect_matches(t.expect, o.answer);
  return done();
}

std::string eval_transcript_json(const eval_task& t, const eval_outcome& o) {
  njson steps = njson::array();
  for (const eval_step& st : o.transcript) {
    njson j{{"role", st.role}};
    if (!st.text.empty() || st.role != "tool_call") j["text"] = st.text;
    if (!st.tool.empty()) j["tool"] = st.tool;
    if (st.role == "tool_call" || st.role == "refused_call") j["arguments"] = st.arguments;
    if (st.role == "tool_result") j["is_error"] = st.is_error;
    steps.push_back(std::move(j));
  }
  njson j{{"id", o.id}, {"family", o.family}, {"ok", o.ok}, {"expect", t.expect.regex.empty() ? t.expect.text : "/" + t.expect.regex + "/"},
          {"answer", o.answer},
          {"error", o.error}, {"steps", std::move(steps)}};
  return cedar::tools::json_dump(j, 1);
}

std::string eval_summary_json(const std::vector<eval_outcome>& rs, const eval_settings& s, bool details,
                              double seconds) {
  auto summarize = [](const std::vector<const eval_outcome*>& v) {
    njson j;
    int64_t ok = 0, calls = 0, invalid = 0, errors = 0, turns = 0, rounds = 0, prompt = 0, replayed = 0, masked = 0;
    int64_t fresh = 0, resident = 0, rep = 0, repre = 0, round_limits = 0, repeat_limits = 0;
    for (const eval_outcome* o : v) {
      ok += o->ok;
      calls += o->tool_calls;
      invalid += o->invalid_tool_calls;
      masked += o->masked_tokens;
      errors += !o->error.empty();
      turns += o->turns;
      rounds += o->rounds;
      prompt += o->prompt_tokens;
      replayed += o->replayed_tokens;
      fresh += o->fresh, resident += o->resident, rep += o->replayed, repre += o->reprefilled;
      round_limits += o->round_limit, repeat_limits += o->repeat_limit;
    }
    const double n = v.empty() ? 1.0 : double(v.size());
    j["tasks"] = v.size();
    j["ok"] = ok;
    j["success_rate"] = double(ok) / n;
    j["tool_calls"] = calls;
    j["valid_tool_calls"] = calls - invalid;
    j["valid_tool_call_rate"] = calls ? njson(double(calls - invalid) / double(calls)) : njson(nullptr);
    j["masked_tokens"] = masked;
    j["mean_turns"] = double(turns) / n;
    j["mean_rounds"] = double(rounds) / n;
    j["mean_prompt_tokens"] = double(prompt) / n;
    j["mean_replayed_tokens"] = double(replayed) / n;
    j["resume_paths"] = {{"fresh", fresh}, {"resident", resident}, {"replayed", rep}, {"reprefilled", repre}};
    j["task_errors"] = errors;
    j["round_limit_tasks"] = round_limits;    // a turn where --max-rounds stopped a call
    j["repeat_limit_tasks"] = repeat_limits;  // a turn where a call repeated after failing was stopped
    return j;
  };
  std::vector<const eval_outcome*> all;
  std::map<std::string, std::vector<const eval_outcome*>> fam;
  for (const auto& o : rs) {
    all.push_back(&o);
    if (!o.family.empty()) fam[o.family].push_back(&o);
  }
  njson j = summarize(all);
  fs::path mp = fs::path(s.model_dir).lexically_normal();
  if (mp.filename().empty()) mp = mp.parent_path();
  j["model"] = s.model_dir.empty() ? std::string("(in-process engine)") : mp.filename().string();
  j["resume"] = policy_name(s.resume);
  j["on_limit"] = s.answer_on_limit ? "answer" : "stop";
  j["kv"] = kv_name(s);
  j["constrained_tool_calls"] = s.constrain_tool_calls;
  j["seconds"] = seconds;
  if (!fam.empty()) {
    njson f = njson::object();
    for (const auto& [name, v] : fam) f[name] = summarize(v);
    j["families"] = f;
  }
  if (details) {
    njson list = njson::array();
    for (const auto& o : rs)
      list.push_back({{"id", o.id}, {"family", o.family}, {"ok", o.ok}, {"error", o.error}, {"turns", o.turns},
                      {"rounds", o.rounds}, {"tool_calls", o.tool_calls}, {"invalid_tool_calls", o.invalid_tool_calls},
                      {"masked_tokens", o.masked_tokens},
                      {"tool_errors", o.tool_errors}, {"prompt_tokens", o.prompt_tokens},
                      {"replayed_tokens", o.replayed_tokens}, {"generated_tokens", o.generated_tokens},
                      {"context", o.context}, {"round_limit", o.round_limit}, {"repeat_limit", o.repeat_limit},
                      {"resume_paths", {{"fresh", o.fresh}, {"resident", o.resident}, {"replayed", o.replayed},
                                        {"reprefilled", o.reprefilled}}},
                      {"answer", o.answer}, {"seconds", o.seconds}});
    j["results"] = list;
  }
  return cedar::tools::json_dump(j, 1);
}

void add_eval_command(CLI::App& app, int* exit_code) {
  struct eval_args {
    std::string tasks;
    std::string model_dir = std::string(CEDAR_SOURCE_DIR) + "/model/weights/cedar-agent-tiny";
    std::string mcp_config, family, resume = "replay", kv = "fp4", transcripts, on_limit = "answer";
    int limit = -1, max_rounds = 8, max_repeated_failures = 2, max_new_tokens = 256;
    bool json = false, details = false, exact = false, unconstrained = false;
  };
  auto a = std::make_shared<eval_args>();
  auto* c = app.add_subcommand("eval", "run a task file (JSON Lines) through the runtime and score it");
  c->add_option("tasks", a->tasks, "task file: one JSON object per line (id, tools, turns, expect, ...)")->required();
  c->add_option("--model", a->model_dir, "model directory")->capture_default_str();
  c->add_flag("--json", a->json, "print one JSON summary object instead of the table");
  c->add_flag("--details", a->details, "with --json: include every task's outcome under \"results\"");
  c->add_option("--limit", a->limit, "run only the first N tasks (after --family)");
  c->add_option("--family", a->family, "run only tasks of this family");
  c->add_option("--mcp-config", a->mcp_config, "mcpServers JSON: their tools join as <server>__<tool>");
  c->add_option("--transcripts", a->transcripts,
                "write each task's conversation (user turns, model text, tool calls and results) to DIR/<id>.json");
  c->add_option("--max-rounds", a->max_rounds, "model replies with tool calls per user turn")
      ->check(CLI::Range(0, 1000))
      ->capture_default_str();
  c->add_option("--max-repeated-failures", a->max_repeated_failures,
                "end a turn when the model repeats a call that already failed this many times in it (0: never)")
      ->check(CLI::Range(0, 1000))
      ->capture_default_str();
  c->add_option("--on-limit", a->on_limit,
                "when --max-rounds or --max-repeated-failures stops a call: answer (the call is answered "
                "'not run' and one more reply, without tools, ends the turn) or stop (the turn ends there)")
      ->check(CLI::IsMember({"answer", "stop"}))
      ->capture_default_str();
  c->add_option("--max-new-tokens", a->max_new_tokens, "tokens per model reply")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  c->add_option("--resume", a->resume, "resume policy: replay (FP4 KV + bounded replay), reprefill (exact), resident")
      ->check(CLI::IsMember({"replay", "reprefill", "resident"}))
      ->capture_default_str();
  c->add_flag("--exact-resume", a->exact, "diagnostic: re-prefill the token log on every resume (= --resume reprefill)");
  c->add_flag("--no-constrain", a->unconstrained,
              "sample tool calls freely (default: constrained to the offered tools and their schemas)");
  c->add_option("--kv", a->kv,
                 "global KV: fp4 (as stored) or bf16 (diagnostic: unquantised, exact resumes); bf16+PART+... "
                 "rounds PARTs (main, index, swa) through their stored format on top of bf16")
      ->check([](const std::string& v) {
        auto k = parse_kv(v);
        return k ? std::string() : k.err().message;
      })
      ->capture_default_str();
  c->callback([a, exit_code] {
    auto tasks = load_eval_tasks(a->tasks);
    if (!tasks) {
      std::fprintf(stderr, "cedar eval: %s\n", tasks.err().message.c_str());
      *exit_code = 2;
      return;
    }
    std::vector<eval_task> run;
    for (auto& t : *tasks)
      if (a->family.empty() || t.family == a->family) run.push_back(std::move(t));
    if (a->limit >= 0 && size_t(a->limit) < run.size()) run.resize(size_t(a->limit));
    if (run.empty()) {
      if (a->limit == 0)
        std::fprintf(stderr, "cedar eval: --limit 0 leaves no task to run\n");
      else if (!a->family.empty())
        std::fprintf(stderr, "cedar eval: %s has no task of family '%s'\n", a->tasks.c_str(), a->family.c_str());
      else
        std::fprintf(stderr, "cedar eval: %s has no task\n", a->tasks.c_str());
      *exit_code = 2;
      return;
    }
    eval_settings s;
    s.model_dir = a->model_dir;
    s.mcp_config = a->mcp_config;
    s.resume = a->exact ? resume_policy::reprefill
               : a->resume == "reprefill" ? resume_policy::reprefill
               : a->resume == "resident"  ? resume_policy::resident
                                          : resume_policy::replay;
    const auto kv = parse_kv(a->kv);  // checked above
    s.kv_unquantised = kv->first;
    s.kv_rounded = kv->second;
    s.max_rounds = a->max_rounds;
    s.max_repeated_failures = a->max_repeated_failures;
    s.answer_on_limit = a->on_limit == "answer";
    s.max_new_tokens = a->max_new_tokens;
    s.constrain_tool_calls = !a->unconstrained;
    auto m = model::load_model_dir(a->model_dir, /*need_tokenizer=*/true);
    if (!m) {
      std::fprintf(stderr, "cedar eval: %s\n", m.err().message.c_str());
      *exit_code = 1;
      return;
    }
    s.engine = m->eng;
    s.tokenizer = m->tok;

    if (!a->transcripts.empty()) {
      std::error_code ec;
      fs::create_directories(a->transcripts, ec);
      if (ec || !fs::is_directory(a->transcripts)) {
        std::fprintf(stderr, "cedar eval: --transcripts %s: cannot create the directory%s%s\n", a->transcripts.c_str(),
                     ec ? ": " : "", ec ? ec.message().c_str() : "");
        *exit_code = 2;
        return;
      }
    }
    auto t0 = clock_type::now();
    std::vector<eval_outcome> out;
    for (size_t i = 0; i < run.size(); ++i) {
      out.push_back(run_eval_task(run[i], s));
      const eval_outcome& o = out.back();
      if (!a->transcripts.empty()) {
        // ids are free text: keep [A-Za-z0-9._-], replace the rest, so the file stays inside DIR
        std::string name;
        for (char ch : o.id) name += (std::isalnum((unsigned char)ch) || ch == '.' || ch == '_' || ch == '-') ? ch : '_';
        if (name.empty() || name[0] == '.') name = "task" + std::to_string(i) + "_" + name;
        std::ofstream f(fs::path(a->transcripts) / (name + ".json"));
        f << eval_transcript_json(run[i], o) << "\n";
        if (!f) std::fprintf(stderr, "cedar eval: cannot write the transcript of %s\n", o.id.c_str());
      }
      std::fprintf(stderr, "cedar eval: [%zu/%zu] %s %s (%.1f s)%s%s\n", i + 1, run.size(), o.id.c_str(),
                   o.ok ? "ok" : "FAIL", o.seconds, o.error.empty() ? "" : ": ", o.error.c_str());
    }
    const double secs = std::chrono::duration<double>(clock_type::now() - t0).count();
    if (a->json) {
      std::printf("%s\n", eval_summary_json(out, s, a->details, secs).c_str());
      return;
    }
    std::printf("%-28s %-4s %5s %6s %5s %7s %7s %8s  %-22s %s\n", "id", "ok", "turns", "rounds", "calls", "invalid",
                "prompt", "replayed", "resume f/res/rep/pre", "answer");
    for (const auto& o : out) {
      char paths[64];
      std::snprintf(paths, sizeof paths, "%d/%d/%d/%d", o.fresh, o.resident, o.replayed, o.reprefilled);
      std::string ans = o.error.empty() ? one_line(o.answer, 60) : "[error] " + one_line(o.error, 60);
      std::printf("%-28s %-4s %5d %6d %5d %7d %7lld %8lld  %-22s %s\n", one_line(o.id, 28).c_str(), o.ok ? "yes" : "no",
                  o.turns, o.rounds, o.tool_calls, o.invalid_tool_calls, (long long)o.prompt_tokens,
                  (long long)o.replayed_tokens, paths, ans.c_str());
    }
    njson j = njson::parse(eval_summary_json(out, s, false, secs));
    auto rate = [](const njson& v) { return v.is_null() ? std::string("n/a") : std::to_string(v.get<double>() * 100).substr(0, 5) + "%"; };
    std::printf("\n%lld/%zu tasks ok (%s), valid tool calls %s of %lld, mean turns %.2f, mean rounds %.2f, "
                "mean prompt tokens %.1f, mean replayed tokens %.1f; resume %s, kv %s, tool calls %s, %.1f s\n",
                (long long)j["ok"].get<int64_t>(), out.size(), rate(j["success_rate"]).c_str(),
                rate(j["valid_tool_call_rate"]).c_str(), (long long)j["tool_calls"].get<int64_t>(),
                j["mean_turns"].get<double>(), j["mean_rounds"].get<double>(), j["mean_prompt_tokens"].get<double>(),
                j["mean_replayed_tokens"].get<double>(), policy_name(s.resume), kv_name(s).c_str(),
                s.constrain_tool_calls ? "constrained" : "free", secs);
    std::printf("tasks with a turn ended at --max-rounds: %lld, on a call repeated after failing: %lld\n",
                (long long)j["round_limit_tasks"].get<int64_t>(), (long long)j["repeat_limit_tasks"].get<int64_t>());
    if (j.contains("families"))
      for (const auto& [name, f] : j["families"].items())
        std::printf("  %-10s %3lld/%-3lld ok (%s), valid tool calls %s\n", name.c_str(), (long long)f["ok"].get<int64_t>(),
                    (long long)f["tasks"].get<int64_t>(), rate(f["success_rate"]).c_str(),
                    rate(f["valid_tool_call_rate"]).c_str());
  });
}

}  // namespace cedar::runtime
