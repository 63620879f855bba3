// `cedar eval`: the task file reader (valid files, every kind of malformed line: the error names
// the line and the field), the committed task files, and an end-to-end run of the CI task set
// through the real runtime on the shipped default model under each resume policy.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "model/model_dir.hpp"
#include "model/sequence.hpp"
#include "runtime/cmd_eval.hpp"
#include "runtime/eval_tasks.hpp"
#include "runtime_test_util.hpp"

namespace cedar::runtime {
namespace {

using cedar::test::src;

// ============================================================================================
// reader
// ============================================================================================
TEST(EvalTasks, ParsesEveryField) {
  const std::string text =
      "{\"id\": \"a\", \"family\": \"chain\", \"system\": \"Be brief.\", \"tools\": [\"calculator\", \"file_read\"],"
      " \"files\": {\"conf/app.conf\": \"port = 8080\", \"b.txt\": \"x\"}, \"notes\": {\"budget\": \"12\"},"
      " \"clock\": \"2028-05-03 14:22\", \"turns\": [\"Hi\", \"What is the port?\"], \"expect\": \"8080\"}\r\n"
      "\n   \n"
      "{\"id\": \"b\", \"tools\": [\"clock\"], \"turns\": [\"Date?\"], \"expect\": {\"regex\": \"20[0-9]{2}\"}}";
  auto r = parse_eval_tasks(text, "t.jsonl");
  ASSERT_TRUE(r.ok()) << r.err().message;
  ASSERT_EQ(r->size(), 2u);
  const eval_task& a = (*r)[0];
  EXPECT_EQ(a.line, 1);
  EXPECT_EQ(a.id, "a");
  EXPECT_EQ(a.family, "chain");
  EXPECT_TRUE(a.has_system);
  EXPECT_EQ(a.system, "Be brief.");
  EXPECT_EQ(a.tools, (std::vector<std::string>{"calculator", "file_read"}));
  ASSERT_EQ(a.files.size(), 2u);
  std::map<std::string, std::string> files(a.files.begin(), a.files.end());
  EXPECT_EQ(files["conf/app.conf"], "port = 8080");
  ASSERT_EQ(a.notes.size(), 1u);
  EXPECT_EQ(a.notes[0], (std::pair<std::string, std::string>{"budget", "12"}));
  ASSERT_TRUE(a.clock.has_value());
  EXPECT_EQ(*a.clock, "2028-05-03 14:22");
  EXPECT_EQ(a.turns, (std::vector<std::string>{"Hi", "What is the port?"}));
  EXPECT_EQ(a.expect.text, "8080");
  EXPECT_TRUE(a.expect.regex.empty());
  const eval_task& b = (*r)[1];
  EXPECT_EQ(b.line, 4);
  EXPECT_FALSE(b.has_system);
  EXPECT_FALSE(b.clock.has_value());
  EXPECT_TRUE(b.files.empty());
  EXPECT_EQ(b.expect.regex, "20[0-9]{2}");
}

TEST(EvalTasks, ExpectMatching) {
  EXPECT_TRUE(eval_expect_matches({"8080", ""}, "The port is 8080."));
  EXPECT_FALSE(eval_expect_matches({"8080", ""}, "The port is 808."));
  EXPECT_FALSE(eval_expect_matches({"", ""}, "anything"));
  EXPECT_TRUE(eval_expect_matches({"", "^The [a-z]+ is 8+0"}, "The port is 8080"));
  EXPECT_FALSE(eval_expect_matches({"", "^port"}, "The port"));
  EXPECT_FALSE(eval_expect_matches({"", "(unclosed"}, "(unclosed"));  // never matches, never throws
}

// Each malformed line: the error names the file, the line and (where there is one) the field.
TEST(EvalTasks, MalformedLinesNameTheLineAndField) {
  const std::string good = R"({"id": "ok", "tools": ["clock"], "turns": ["t"], "expect": "x"})";
  struct bad_case {
    std::string line, want;
  };
  const std::vector<bad_case> cases = {
      {R"({"id": "a", "tools": ["clock"], "turns": ["t"], "expect": "x")", "not valid JSON"},
      {R"(["id", "a"])", "expected a JSON object, got an array"},
      {R"({"tools": ["clock"], "turns": ["t"], "expect": "x"})", "field 'id': missing"},
      {R"({"id": 5, "tools": ["clock"], "turns": ["t"], "expect": "x"})", "field 'id': expected a non-empty string, got a number"},
      {R"({"id": "", "tools": ["clock"], "turns": ["t"], "expect": "x"})", "field 'id': expected a non-empty string"},
      {R"({"id": "ok", "tools": ["clock"], "turns": ["t"], "expect": "x"})", "field 'id': duplicate id 'ok'"},
      {R"({"id": "a", "tool": ["clock"], "turns": ["t"], "expect": "x"})", "field 'tool': unknown field"},
      {R"({"id": "a", "turns": ["t"], "expect": "x"})", "field 'tools': missing"},
      {R"({"id": "a", "tools": "clock", "turns": ["t"], "expect": "x"})", "field 'tools': expected an array of tool names, got a string"},
      {R"({"id": "a", "tools": [], "turns": ["t"], "expect": "x"})", "field 'tools': empty"},
      {R"({"id": "a", "tools": ["clock", 3], "turns": ["t"], "expect": "x"})", "field 'tools': element 1: expected a non-empty string, got a number"},
      {R"({"id": "a", "system": ["x"], "tools": ["clock"], "turns": ["t"], "expect": "x"})", "field 'system': expected a string, got an array"},
      {R"({"id": "a", "family": 1, "tools": ["clock"], "turns": ["t"], "expect": "x"})", "field 'family': expected a string, got a number"},
      {R"({"id": "a", "clock": null, "tools": ["clock"], "turns": ["t"], "expect": "x"})", "field 'clock': expected a string, got null"},
      {R"({"id": "a", "tools": ["clock"], "files": ["a"], "turns": ["t"], "expect": "x"})", "field 'files': expected an object, got an array"},
      {R"({"id": "a", "tools": ["clock"], "files": {"/etc/passwd": "x"}, "turns": ["t"], "expect": "x"})", "field 'files': absolute path '/etc/passwd'"},
      {R"({"id": "a", "tools": ["clock"], "files": {"a/../../b": "x"}, "turns": ["t"], "expect": "x"})", "field 'files': path 'a/../../b' leaves the file root"},
      {R"({"id": "a", "tools": ["clock"], "files": {"": "x"}, "turns": ["t"], "expect": "x"})", "field 'files': empty path"},
      {R"({"id": "a", "tools": ["clock"], "files": {"d/": "x"}, "turns": ["t"], "expect": "x"})", "field 'files': path 'd/' names a directory"},
      {R"({"id": "a", "tools": ["clock"], "files": {"a.txt": 3}, "turns": ["t"], "expect": "x"})", "field 'files': 'a.txt': expected a string, got a number"},
      {R"({"id": "a", "tools": ["clock"], "notes": {"k": true}, "turns": ["t"], "expect": "x"})", "field 'notes': 'k': expected a string, got a boolean"},
      {R"({"id": "a", "tools": ["clock"], "notes": {"": "v"}, "turns": ["t"], "expect": "x"})", "field 'notes': empty key"},
      {R"({"id": "a", "tools": ["clock"], "expect": "x"})", "field 'turns': missing"},
      {R"({"id": "a", "tools": ["clock"], "turns": [], "expect": "x"})", "field 'turns': expected a non-empty array of user messages, got an empty array"},
      {R"({"id": "a", "tools": ["clock"], "turns": "t", "expect": "x"})", "field 'turns': expected a non-empty array of user messages, got a string"},
      {R"({"id": "a", "tools": ["clock"], "turns": ["t", {}], "expect": "x"})", "field 'turns': element 1: expected a string, got an object"},
      {R"({"id": "a", "tools": ["clock"], "turns": ["t"]})", "field 'expect': missing"},
      {R"({"id": "a", "tools": ["clock"], "turns": ["t"], "expect": ""})", "field 'expect': empty string"},
      {R"({"id": "a", "tools": ["clock"], "turns": ["t"], "expect": 42})", "field 'expect': expected a string or {\"regex\": \"...\"}, got a number"},
      {R"({"id": "a", "tools": ["clock"], "turns": ["t"], "expect": {"re": "x"}})", "field 'expect': an object must be exactly"},
      {R"({"id": "a", "tools": ["clock"], "turns": ["t"], "expect": {"regex": 1}})", "field 'expect': 'regex': expected a non-empty string, got a number"},
      {R"({"id": "a", "tools": ["clock"], "turns": ["t"], "expect": {"regex": "(ab"}})", "field 'expect': 'regex' does not compile"},
      {R"({"id": "a", "tools": ["clock"], "turns": ["t"], "expect": {"regex": ")" + std::string(600, 'a') + R"("}})",
       "field 'expect': 'regex' longer than 512 characters"},
      {std::string(40, '[') + std::string(40, ']'), "JSON nested deeper than 32 levels"},
      {"\xff\xfe{}", "not valid JSON"},
  };
  for (const auto& c : cases) {
    // The bad line is line 3, after a good task and a blank line.
    auto r = parse_eval_tasks(good + "\n\n" + c.line + "\n", "tasks.jsonl");
    ASSERT_FALSE(r.ok()) << "accepted: " << c.line;
    EXPECT_NE(r.err().message.find("tasks.jsonl:3: "), std::string::npos) << r.err().message;
    EXPECT_NE(r.err().message.find(c.want), std::string::npos) << "line: " << c.line << "\nerror: " << r.err().message;
  }
}

TEST(EvalTasks, EmptyAndMissingFiles) {
  auto e = parse_eval_tasks("\n  \n", "empty.jsonl");
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.err().message.find("empty.jsonl: no tasks"), std::string::npos);
  auto m = load_eval_tasks(src("tests/eval/does-not-exist.jsonl"));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.err().message.find("cannot open the task file"), std::string::npos);
}

// Every prefix of a valid file either parses or fails with a line-numbered error (truncated
// files never crash the reader).
TEST(EvalTasks, TruncatedFilesFailCleanly) {
  const std::string text =
      R"({"id": "a", "tools": ["calculator"], "files": {"x/y.txt": "q"}, "turns": ["1+1?"], "expect": {"regex": "2"}})"
      "\n"
      R"({"id": "b", "tools": ["clock"], "notes": {"k": "v"}, "turns": ["t", "u"], "expect": "x"})";
  int ok = 0;
  for (size_t n = 0; n <= text.size(); ++n) {
    auto r = parse_eval_tasks(std::string_view(text).substr(0, n), "cut");
    if (r.ok()) {
      ++ok;
      continue;
    }
    EXPECT_EQ(r.err().message.rfind("cut", 0), 0u) << r.err().message;
  }
  EXPECT_EQ(ok, 3);  // exactly the complete files: line 1, line 1 + newline, the whole text
}

// The committed task files: both parse, ids are unique, every family is present, the CI set is
// small and the held-out set a few hundred tasks.
TEST(EvalTasks, CommittedTaskFilesParse) {
  const std::set<std::string> families = {"single", "chain", "multi", "error", "notool", "recall"};
  for (const auto& [name, lo, hi] : std::vector<std::tuple<std::string, size_t, size_t>>{
           {"tests/eval/ci.jsonl", 10, 20}, {"tests/eval/heldout.jsonl", 200, 600}}) {
    auto r = load_eval_tasks(src(name));
    ASSERT_TRUE(r.ok()) << r.err().message;
    EXPECT_GE(r->size(), lo) << name;
    EXPECT_LE(r->size(), hi) << name;
    std::set<std::string> seen;
    for (const auto& t : *r) {
      seen.insert(t.family);
      EXPECT_TRUE(t.clock.has_value()) << t.id;  // generated tasks fix the clock
    }
    EXPECT_EQ(seen, families) << name;
  }
  // The hand-written everyday requests (make_everyday_tasks.py): real names, every built-in
  // tool offered and no system prompt, as `cedar run` does.
  auto e = load_eval_tasks(src("tests/eval/everyday.jsonl"));
  ASSERT_TRUE(e.ok()) << e.err().message;
  EXPECT_GE(e->size(), 30u);
  std::set<std::string> kinds;
  for (const auto& t : *e) {
    kinds.insert(t.family);
    EXPECT_FALSE(t.has_system) << t.id;
    EXPECT_EQ(t.tools.size(), 6u) << t.id;
    EXPECT_TRUE(t.clock.has_value()) << t.id;
  }
  EXPECT_EQ(kinds, (std::set<std::string>{"calc", "clock", "file", "list", "note", "chain", "multi", "error", "notool"}));
}

// The committed files' expects (make_eval_tasks.py expect_of) find the value only as a whole
// token under std::regex too: "1" must not pass for "1274". The values are those of
// tests/eval/ci.jsonl (seed 2002); Python's re checks the same patterns in
// tests/reference/test_make_eval_tasks.py.
TEST(EvalTasks, CommittedExpectsMatchWholeTokensOnly) {
  for (const char* name : {"tests/eval/ci.jsonl", "tests/eval/heldout.jsonl", "tests/eval/recall8k.jsonl",
                           "tests/eval/everyday.jsonl"}) {
    auto r = load_eval_tasks(src(name));
    ASSERT_TRUE(r.ok()) << r.err().message;
    for (const auto& t : *r) EXPECT_FALSE(t.expect.regex.empty()) << name << ": " << t.id;
  }
  auto r = load_eval_tasks(src("tests/eval/ci.jsonl"));
  ASSERT_TRUE(r.ok()) << r.err().message;
  std::map<std::string, eval_expect> by_id;
  for (const auto& t : *r) by_id[t.id] = t.expect;
  struct row {
    std::string id;
    std::vector<std::string> match, miss;
  };
  const std::vector<row> rows = {
      {"single-1",
       {"6", "The value is 6.", "= 6\n", "(6)", "6, as asked"},
       {"16", "61", "-6", "6.5", "0.6", "5,6", "1,6,2", "6k", "x6"}},
      {"chain-1",
       {"14198", "It is 14198.", "It is 14,198.", "14,198, then"},
       {"141980", "214198", "14198.5", "1,4198", "14,1980", "-14198"}},
      {"recall-0-d2290",
       {"SJ-7689", "The code is SJ-7689."},
       {"SJ-76891", "XSJ-7689", "SJ-7689.5", "SJ-768"}},
      {"notool-0", {"Nantes", "It is Nantes."}, {"Nantesx", "ONantes", "nantes"}},
      {"error-1", {"gisplis", "note gisplis: done"}, {"gisplisa", "agisplis", "gispli"}},
  };
  for (const row& w : rows) {
    ASSERT_TRUE(by_id.count(w.id)) << w.id << " is not in tests/eval/ci.jsonl";
    const eval_expect& e = by_id[w.id];
    for (const auto& a : w.match)
      EXPECT_TRUE(eval_expect_matches(e, a)) << w.id << " /" << e.regex << "/ on '" << a << "'";
    for (const auto& a : w.miss)
      EXPECT_FALSE(eval_expect_matches(e, a)) << w.id << " /" << e.regex << "/ on '" << a << "'";
  }
}

// ============================================================================================
// end to end: the CI set through the real runtime on the default model
// ============================================================================================
struct default_model {
  std::shared_ptr<const model::engine> eng;
  std::shared_ptr<const model::tokenizer> tok;
};
const default_model& shipped() {
  static default_model m = [] {
    auto r = model::load_model_dir(src("model/weights/cedar-agent-tiny"), true);
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.err().message);
    return default_model{r->eng, r->tok};
  }();
  return m;
}

eval_settings settings(resume_policy p, bool unquantised = false) {
  eval_settings s;
  s.model_dir = src("model/weights/cedar-agent-tiny");
  s.engine = shipped().eng;
  s.tokenizer = shipped().tok;
  s.resume = p;
  s.kv_unquantised = unquantised;
  s.max_rounds = 1;  // keep the suite fast: at most two model replies per user turn
  s.max_new_tokens = 48;
  return s;
}

// Checks that hold for any model: the task ran to its end, the counters agree with each other
// and with the resume policy, the score is the expectation applied to the final answer.
void check_outcome(const eval_task& t, const eval_outcome& o, resume_policy p) {
  SCOPED_TRACE(t.id);
  EXPECT_TRUE(o.error.empty()) << o.error;
  EXPECT_EQ(o.turns, int(t.turns.size()));
  EXPECT_GE(o.rounds, o.turns);  // at least one model reply per user turn
  EXPECT_EQ(o.fresh + o.resident + o.replayed + o.reprefilled, o.rounds);
  EXPECT_EQ(o.fresh, 1);  // only the first generation of a new session is fresh
  EXPECT_GE(o.invalid_tool_calls, 0);
  EXPECT_LE(o.invalid_tool_calls, o.tool_calls);
  EXPECT_GT(o.prompt_tokens, 0);
  EXPECT_GT(o.context, o.prompt_tokens / 2);
  switch (p) {
    case resume_policy::replay:
      // Every resume goes through the store and takes bounded replay: after a new user turn from
      // the last generation's checkpoint, after tool results from the tool-results commit, which
      // carries the previous checkpoint's aux state (sessions/store.cpp).
      EXPECT_EQ(o.resident, 0);
      EXPECT_EQ(o.reprefilled, 0);
      EXPECT_EQ(o.replayed, o.rounds - 1);
      if (o.rounds > 1) {
        EXPECT_GT(o.replayed_tokens, 0);
      }
      break;
    case resume_policy::reprefill:
      EXPECT_EQ(o.reprefilled, o.rounds - 1);
      if (o.rounds > 1) {
        EXPECT_GT(o.replayed_tokens, o.prompt_tokens / 2);  // the whole log each time
      }
      break;
    case resume_policy::resident:
      EXPECT_EQ(o.resident, o.rounds - 1);
      EXPECT_EQ(o.replayed_tokens, 0);
      break;
  }
  EXPECT_EQ(o.ok, eval_expect_matches(t.expect, o.answer));
  // the transcript (--transcripts): every user turn in order, one tool_call step per parsed call
  // and a result step after each call that ran
  // and a refused_call step for each call a limit stopped (answer_on_limit, the default here):
  // never run, its "not run" text the result the model read before its final reply
  std::vector<std::string> users;
  int calls = 0, results = 0, refused = 0;
  for (const eval_step& st : o.transcript) {
    if (st.role == "user") users.push_back(st.text);
    calls += st.role == "tool_call";
    results += st.role == "tool_result";
    if (st.role == "refused_call") {
      ++refused;
      EXPECT_EQ(st.text.rfind("not run: ", 0), 0u) << st.text;
      EXPECT_FALSE(st.tool.empty());
    }
  }
  EXPECT_EQ(refused > 0, o.round_limit || o.repeat_limit);
  EXPECT_EQ(users, t.turns);
  EXPECT_GE(calls, o.tool_calls - o.invalid_tool_calls);  // malformed DSML blocks carry no call step
  EXPECT_LE(calls, o.tool_calls);
  EXPECT_EQ(results, o.tool_calls);                     // an invalid call gets an error result too
  auto j = nlohmann::json::parse(eval_transcript_json(t, o));
  EXPECT_EQ(j["id"], t.id);
  EXPECT_EQ(j["steps"].size(), o.transcript.size());
  EXPECT_EQ(j["answer"], o.answer);
}

TEST(EvalEndToEnd, CiSetRunsThroughTheRuntimeWithBoundedReplay) {
  auto tasks = load_eval_tasks(src("tests/eval/ci.jsonl"));
  ASSERT_TRUE(tasks.ok()) << tasks.err().message;
  const eval_settings s = settings(resume_policy::replay);
  std::vector<eval_outcome> out;
  for (const auto& t : *tasks) {
    out.push_back(run_eval_task(t, s));
    check_outcome(t, out.back(), s.resume);
  }
  auto j = nlohmann::json::parse(eval_summary_json(out, s, true, 1.0));
  EXPECT_EQ(j["tasks"], tasks->size());
  for (const char* k : {"success_rate", "valid_tool_call_rate", "mean_turns", "mean_prompt_tokens", "mean_replayed_tokens"})
    EXPECT_TRUE(j.contains(k)) << k;
  int ok = 0, calls = 0;
  for (const auto& o : out) ok += o.ok, calls += o.tool_calls;
  EXPECT_EQ(j["ok"], ok);
  EXPECT_DOUBLE_EQ(j["success_rate"].get<double>(), double(ok) / double(out.size()));
  EXPECT_EQ(j["tool_calls"], calls);
  int round_limits = 0, repeat_limits = 0;
  for (const auto& o : out) round_limits += o.round_limit, repeat_limits += o.repeat_limit;
  EXPECT_EQ(j["round_limit_tasks"], round_limits);
  EXPECT_EQ(j["repeat_limit_tasks"], repeat_limits);
  for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(j["results"][i]["repeat_limit"], out[i].repeat_limit) << i;
  EXPECT_EQ(j["families"].size(), 6u);
  EXPECT_EQ(j["results"].size(), out.size());
  EXPECT_EQ(j["resume"], "replay");
  EXPECT_EQ(j["on_limit"], "answer");
}

// Recall through the global KV ~8K tokens back, on the shipped model and config with
// `cedar eval`'s defaults (8 rounds, 256 tokens per reply): the task's session grows past 10K
// tokens, so the decoder's Reindex layers choose among the candidate pool of layer 6's index
// blocks. With the pool of sessions 9-26 (128 blocks of 16 entries, a fifth of this context)
// the model missed this value; with the official pool size (1024 blocks) it finds it.
TEST(EvalEndToEnd, ShippedModelRecallsAValueEightThousandTokensBack) {
  auto tasks = load_eval_tasks(src("tests/eval/recall8k.jsonl"));
  ASSERT_TRUE(tasks.ok()) << tasks.err().message;
  const eval_task* t = nullptr;
  for (const auto& x : *tasks)
    if (x.id == "recall-9-d33384") t = &x;
  ASSERT_NE(t, nullptr);
  eval_settings s = settings(resume_policy::replay);
  s.max_rounds = eval_settings{}.max_rounds;
  s.max_new_tokens = eval_settings{}.max_new_tokens;
  ASSERT_GE(shipped().eng->config().candidate_topk_blocks, 1024);
  const eval_outcome o = run_eval_task(*t, s);
  check_outcome(*t, o, s.resume);
  EXPECT_GT(o.context, 8192);
  EXPECT_TRUE(o.ok) << "answer: " << o.answer;
  EXPECT_EQ(o.invalid_tool_calls, 0);
}

// The same task under the other policies and with unquantised KV: the resume paths
// follow the policy.
TEST(EvalEndToEnd, ResumePoliciesAndUnquantisedKv) {
  auto tasks = load_eval_tasks(src("tests/eval/ci.jsonl"));
  ASSERT_TRUE(tasks.ok()) << tasks.err().message;
  const eval_task* multi = nullptr;
  for (const auto& t : *tasks)
    if (t.family == "single") {  // one tool call, then the answer: a resume after a tool result
      multi = &t;
      break;
    }
  ASSERT_NE(multi, nullptr);
  auto resident = run_eval_task(*multi, settings(resume_policy::resident));
  check_outcome(*multi, resident, resume_policy::resident);
  auto exact = run_eval_task(*multi, settings(resume_policy::reprefill));
  check_outcome(*multi, exact, resume_policy::reprefill);
  auto f32 = run_eval_task(*multi, settings(resume_policy::replay, /*unquantised=*/true));
  SCOPED_TRACE("kv unquantised");
  EXPECT_TRUE(f32.error.empty()) << f32.error;
  EXPECT_EQ(f32.fresh, 1);
  EXPECT_EQ(f32.reprefilled, f32.rounds - 1);  // unquantised KV is never persisted: exact resumes
}

// --kv bf16+PART: the parts rounded through their format on top of unquantised KV; the task
// runs (exact resumes, as bf16) and the same answer as packed FP4 comes out of all three parts;
// the flag's bad values are named.
TEST(EvalEndToEnd, KvPartsRoundedOnUnquantisedKv) {
  auto ok = parse_kv("bf16+swa+main");
  ASSERT_TRUE(ok.ok()) << ok.err().message;
  EXPECT_TRUE(ok->first);
  EXPECT_EQ(ok->second, model::kv_part_main | model::kv_part_swa);
  eval_settings named;
  named.kv_unquantised = true, named.kv_rounded = ok->second;
  EXPECT_EQ(kv_name(named), "bf16+main+swa");  // canonical order
  EXPECT_EQ(parse_kv("fp4")->first, false);
  EXPECT_EQ(parse_kv("bf16")->second, 0);
  for (const char* bad : {"bf17", "bf16+", "bf16+main+main", "bf16+keys", "fp4+main", "bf16main", ""}) {
    auto r = parse_kv(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.err().message.find("'" + std::string(bad) + "'"), std::string::npos) << r.err().message;
  }
  EXPECT_NE(parse_kv("bf16+keys").err().message.find("unknown part 'keys'"), std::string::npos);
  EXPECT_NE(parse_kv("bf16+main+main").err().message.find("given twice"), std::string::npos);

  auto tasks = load_eval_tasks(src("tests/eval/ci.jsonl"));
  ASSERT_TRUE(tasks.ok()) << tasks.err().message;
  const eval_task* single = nullptr;
  for (const auto& t : *tasks)
    if (t.family == "single") {
      single = &t;
      break;
    }
  ASSERT_NE(single, nullptr);
  auto packed = run_eval_task(*single, settings(resume_policy::reprefill));
  eval_settings all = settings(resume_policy::replay, /*unquantised=*/true);
  all.kv_rounded = model::kv_part_main | model::kv_part_index | model::kv_part_swa;
  auto rounded = run_eval_task(*single, all);
  EXPECT_TRUE(rounded.error.empty()) << rounded.error;
  EXPECT_EQ(rounded.reprefilled, rounded.rounds - 1);  // never persisted: exact resumes
  EXPECT_EQ(rounded.answer, packed.answer);             // the packed model's numerics
  EXPECT_EQ(rounded.ok, packed.ok);
}

// Constrained tool calls (model/tool_grammar.hpp, on by default): offered only tools that do not
// fit the question, the model's calls still name an offered tool with its schema's parameters.
// Free sampling makes the same model call the calculator it was not offered (an invalid call).
TEST(EvalEndToEnd, ConstrainedToolCallsNameOnlyOfferedTools) {
  auto t = parse_eval_tasks(
      R"({"id": "c1", "tools": ["clock"], "turns": ["What is 1234 * 5678?"], "expect": "7006652"})" "\n"
      R"({"id": "c2", "tools": ["file_read", "file_list"], "turns": ["What is 17 * 23?"], "expect": "391"})");
  ASSERT_TRUE(t.ok()) << t.err().message;
  eval_settings s = settings(resume_policy::replay);
  s.max_new_tokens = 64;
  int free_invalid = 0;
  int64_t masked = 0;
  for (const auto& task : *t) {
    SCOPED_TRACE(task.id);
    s.constrain_tool_calls = true;
    auto o = run_eval_task(task, s);
    check_outcome(task, o, s.resume);
    EXPECT_EQ(o.invalid_tool_calls, 0);
    masked += o.masked_tokens;
    for (const eval_step& st : o.transcript)
      if (st.role == "tool_call") {
        EXPECT_NE(std::find(task.tools.begin(), task.tools.end(), st.tool), task.tools.end()) << st.tool;
        EXPECT_TRUE(nlohmann::json::parse(st.arguments, nullptr, false).is_object()) << st.arguments;
      }
    s.constrain_tool_calls = false;
    auto f = run_eval_task(task, s);
    check_outcome(task, f, s.resume);
    free_invalid += f.invalid_tool_calls;
    EXPECT_EQ(f.masked_tokens, 0);
  }
  EXPECT_GT(free_invalid, 0) << "the shipped model no longer reaches for unoffered tools: pick tasks that tempt it";
  EXPECT_GT(masked, 0);  // greedy decoding diverged from the free run only where the grammar masked
  auto j = nlohmann::json::parse(eval_summary_json({}, s, false, 0.0));
  EXPECT_EQ(j["constrained_tool_calls"], false);
}

// A task whose tool is not registered fails with a clear error and no crash.
TEST(EvalEndToEnd, UnknownToolIsATaskError) {
  auto t = parse_eval_tasks(R"({"id": "x", "tools": ["filesystem__read_text_file"], "turns": ["hi"], "expect": "y"})");
  ASSERT_TRUE(t.ok());
  auto o = run_eval_task((*t)[0], settings(resume_policy::replay));
  EXPECT_FALSE(o.ok);
  EXPECT_NE(o.error.find("tool 'filesystem__read_text_file' is not registered (MCP tools need --mcp-config)"),
            std::string::npos)
      << o.error;
}

}  // namespace
}  // namespace cedar::runtime
