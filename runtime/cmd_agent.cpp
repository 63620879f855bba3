// Agents from the command line, on the public API (cedar.hpp) like any user program.
//
//   cedar run [--model DIR] [--store DB] [--agent FILE.json] [--session ID] [--json] "task"
//   cedar chat [--model DIR] [--store DB] [--agent FILE.json] [--session ID]
//   cedar demo [--model DIR] [--store DB]
//
// Tokens stream to stdout; tool calls and results go to stderr, prefixed, so that stdout is the
// model's text. Ctrl-C in `chat` interrupts the current generation; at the prompt it quits
// (runtime/shutdown_signals.hpp: the handler only writes to a pipe, the reaction runs here).
#include "runtime/cmd_agent.hpp"

#include <poll.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <unistd.h>

#include "kernels/base/log.hpp"
#include "runtime/agent_options_json.hpp"
#include "runtime/cedar.hpp"
#include "runtime/cmd_sessions.hpp"
#include "runtime/shutdown_signals.hpp"
#include "tools_mcp/json.hpp"

namespace cedar::runtime {
namespace {

namespace fs = std::filesystem;
using njson = nlohmann::json;

struct agent_args {
  std::string model_dir = std::string(CEDAR_SOURCE_DIR) + "/model/weights/cedar-agent-tiny";
  std::string store;
  std::string agent_file;
  std::string mcp_config;
  std::string files_root = ".";
  std::string backend = "cpu";
  int64_t session = -1;
  int max_new_tokens = -1;
  bool json = false;
};

void add_common(CLI::App* c, agent_args& a) {
  c->add_option("--model", a.model_dir, "model directory (config.json, model.safetensors, tokenizer.json)")
      ->capture_default_str();
  c->add_option("--store", a.store, "session store (SQLite); default: the user's data directory");
  c->add_option("--agent", a.agent_file,
                "agent JSON: {name, system_prompt, tools, temperature, top_p, min_p, seed, max_new_tokens, min_new_tokens, "
                "max_tool_rounds, max_repeated_failures, answer_on_limit, tool_timeout_ms, constrain_tool_calls}");
  c->add_option("--mcp-config", a.mcp_config, "mcpServers JSON: their tools join as <server>__<tool>");
  c->add_option("--files-root", a.files_root, "directory file_read/file_list may read")->capture_default_str();
  c->add_option("--session", a.session, "continue this stored session instead of starting a new one");
  c->add_option("--max-new-tokens", a.max_new_tokens, "tokens per model reply");
  c->add_option("--backend", a.backend, "where decode steps run: cpu, cuda (an NVIDIA GPU) or auto")
      ->capture_default_str();
}

result<agent_options> load_agent_options(const agent_args& a) {
  agent_options o;
  o.system_prompt = "You are cedar, a helpful assistant. Use the tools when they help.";
  if (!a.agent_file.empty()) {
    std::ifstream f(a.agent_file);
    if (!f) return make_error(errc::not_found, a.agent_file + ": cannot open agent file");
    std::stringstream ss;
    ss << f.rdbuf();
    // The keys and checks of a stored session's options (agent_options_json.hpp).
    auto r = agent_options_from_json(ss.str(), o);
    if (!r) return make_error(r.err().code, a.agent_file + ": " + r.err().message);
    o = std::move(*r);
  }
  if (a.max_new_tokens > 0) o.max_new_tokens = a.max_new_tokens;
  return o;
}

result<std::unique_ptr<agent_runtime>> open_runtime(agent_args& a) {
  auto store = writable_store_path(a.store);
  if (!store) return store.err();
  a.store = *store;
  runtime_options ro;
  ro.model_dir = a.model_dir;
  ro.store_path = a.store;
  ro.mcp_config = a.mcp_config;
  ro.files_root = a.files_root;
  ro.backend = a.backend;
  return agent_runtime::open(ro);
}

result<agent> open_agent(agent_runtime& rt, const agent_args& a) {
  auto o = load_agent_options(a);
  if (!o) return o.take_err();
  return a.session >= 0 ? rt.resume_agent(a.session, *o) : rt.create_agent(*o);
}

// Prints events as they come: text to stdout, tools to stderr.
void print_event(const agent_event& e) {
  switch (e.type) {
    case agent_event::kind::token:
      std::fputs(e.text.c_str(), stdout);
      std::fflush(stdout);
      break;
    case agent_event::kind::tool_call:
      std::fflush(stdout);
      std::fprintf(stderr, "\n[tool call] %s %s\n", e.tool.c_str(), e.arguments.c_str());
      break;
    case agent_event::kind::tool_result:
      std::fprintf(stderr, "[tool %s%s, %.0f ms] %s\n", e.tool.c_str(), e.is_error ? " error" : "", e.ms,
                   e.text.size() > 400 ? (e.text.substr(0, 400) + "...").c_str() : e.text.c_str());
      break;
    case agent_event::kind::error:
      std::fprintf(stderr, "\n[error] %s\n", e.text.c_str());
      break;
    case agent_event::kind::refused_call:
      std::fflush(stdout);
      std::fprintf(stderr, "\n[tool call not run] %s %s: %s\n", e.tool.c_str(), e.arguments.c_str(), e.text.c_str());
      break;
    case agent_event::kind::answer:
      break;
  }
}

njson to_json(const turn_result& r, int64_t session) {
  return njson{{"session", session},         {"answer", r.answer},
               {"rounds", r.rounds},         {"tool_calls", r.tool_calls},
               {"prompt_tokens", r.prompt_tokens}, {"generated_tokens", r.generated_tokens},
               {"replayed_tokens", r.replayed_tokens}, {"context", r.context},
               {"resume_path", r.resume_path}, {"first_token_ms", r.first_token_ms},
               {"total_ms", r.total_ms},     {"cancelled", r.cancelled},
               {"round_limit", r.round_limit}, {"repeat_limit", r.repeat_limit}};
}

void print_summary(const turn_result& r, int64_t session) {
  std::fflush(stdout);
  std::fprintf(stderr,
               "\n[session %lld] %d round(s), %d tool call(s), %lld prompt + %lld generated tokens, context %lld, "
               "resume %s, first token %.0f ms, total %.0f ms%s\n",
               (long long)session, r.rounds, r.tool_calls, (long long)r.prompt_tokens, (long long)r.generated_tokens,
               (long long)r.context, r.resume_path.c_str(), r.first_token_ms, r.total_ms,
               r.cancelled      ? " (cancelled)"
               : r.round_limit  ? " (tool round limit: a call was not run)"
               : r.repeat_limit ? " (a call repeated after failing was not run)"
                                : "");
}

int cmd_run(agent_args a, const std::string& task) {
  // SIGINT/SIGTERM cancel the turn (what was committed stays); the exit status is then 128 + the
  // signal, as a shell reports a process it interrupted. Installed first: a signal while the
  // model loads ends the command before the turn starts.
  shutdown_signals sigs;
  auto rt = open_runtime(a);
  if (!rt) {
    std::fprintf(stderr, "cedar run: %s\n", rt.err().message.c_str());
    return 2;
  }
  auto ag = open_agent(**rt, a);
  if (!ag) {
    std::fprintf(stderr, "cedar run: %s\n", ag.err().message.c_str());
    return 2;
  }
  if (pollfd p{sigs.fd(), POLLIN, 0}; ::poll(&p, 1, 0) == 1) {
    const int s = sigs.wait();
    std::fprintf(stderr, "cedar run: %s before the turn started\n", shutdown_signals::name(s));
    return 128 + s;
  }
  int stopped_by = 0;
  std::thread watcher([&] {
    for (int s; (s = sigs.wait()) != 0;) {
      ag->cancel();
      stopped_by = s;
    }
  });
  auto r = ag->ask(task, a.json ? std::function<void(const agent_event&)>() : print_event);
  sigs.wake();
  watcher.join();
  if (!r) {
    std::fprintf(stderr, "cedar run: %s\n", r.err().message.c_str());
    return 1;
  }
  if (a.json) std::printf("%s\n", cedar::tools::json_dump(to_json(*r, ag->session()), 2).c_str());
  else print_summary(*r, ag->session());
  if (stopped_by != 0) {
    std::fprintf(stderr, "cedar run: %s, turn cancelled\n", shutdown_signals::name(stopped_by));
    return 128 + stopped_by;
  }
  return 0;
}

// Reads stdin a line at a time with poll(), next to the signal pipe, so that a Ctrl-C at the
// prompt is seen at once (a blocking getline would sit until the next line).
enum class chat_input { line, eof, signal };
struct line_reader {
  std::string buf;
  bool at_eof = false;
  chat_input next(shutdown_signals& sigs, std::string& line, int& sig) {
    for (;;) {
      if (size_t nl = buf.find('\n'); nl != std::string::npos) {
        line = buf.substr(0, nl);
        buf.erase(0, nl + 1);
        return chat_input::line;
      }
      if (at_eof) {
        if (buf.empty()) return chat_input::eof;
        line = std::move(buf);
        buf.clear();
        return chat_input::line;
      }
      pollfd p[2] = {{0, POLLIN, 0}, {sigs.fd(), POLLIN, 0}};
      const sigset_t unblocked = shutdown_signals::wait_mask();
      if (::ppoll(p, 2, nullptr, &unblocked) < 0) {
        if (errno == EINTR) continue;
        return chat_input::eof;
      }
      if (p[1].revents & POLLIN) {
        sig = sigs.wait();  // readable: does not block
        if (sig != 0) return chat_input::signal;
        continue;
      }
      if (p[0].revents & (POLLIN | POLLHUP | POLLERR)) {
        char tmp[4096];
        const ssize_t n = ::read(0, tmp, sizeof tmp);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) at_eof = true;
        else buf.append(tmp, size_t(n));
      }
    }
  }
};

// Ctrl-C (SIGINT) during a reply cancels the turn; at the prompt it quits. SIGTERM cancels a
// running turn and quits. The handler only writes to shutdown_signals' pipe; the reactions run
// here: at the prompt in line_reader::next, during a turn in a watcher thread that owns the pipe
// until the turn ends (shutdown_signals invariant 4).
int cmd_chat(agent_args a) {
  shutdown_signals sigs;  // first: a signal while the model loads quits cleanly below
  auto rt = open_runtime(a);
  if (!rt) {
    std::fprintf(stderr, "cedar chat: %s\n", rt.err().message.c_str());
    return 2;
  }
  auto ag = open_agent(**rt, a);
  if (!ag) {
    std::fprintf(stderr, "cedar chat: %s\n", ag.err().message.c_str());
    return 2;
  }
  bool tty = isatty(0);
  std::fprintf(stderr, "cedar chat: session %lld (Ctrl-C interrupts a reply, Ctrl-D quits)\n",
               (long long)ag->session());
  line_reader in;
  std::string line;
  bool quit = false;
  while (!quit) {
    if (tty) std::fprintf(stderr, "\n> ");
    int sig = 0;
    const chat_input got = in.next(sigs, line, sig);
    if (got == chat_input::eof) break;
    if (got == chat_input::signal) {
      std::fprintf(stderr, "\ncedar chat: %s, quitting\n", shutdown_signals::name(sig));
      break;
    }
    if (line.empty()) continue;
    agent copy = *ag;
    std::thread watcher([&] {
      for (int s; (s = sigs.wait()) != 0;) {
        copy.cancel();
        if (s == SIGTERM) quit = true;
      }
    });
    auto r = copy.ask(line, print_event);
    sigs.wake();  // the watcher returns the pipe to this thread
    watcher.join();
    if (!r) std::fprintf(stderr, "\n[error] %s\n", r.err().message.c_str());
    else print_summary(*r, copy.session());
  }
  if (quit) std::fprintf(stderr, "cedar chat: SIGTERM, quitting\n");
  return 0;
}

int cmd_demo(agent_args a) {
  if (!fs::exists(a.model_dir + "/model.safetensors")) {
    std::fprintf(stderr, "cedar demo: no model at %s\n", a.model_dir.c_str());
    return 2;
  }
  if (a.store.empty()) a.store = (fs::temp_directory_path() / ("cedar-demo-" + std::to_string(::getpid()) + ".db")).string();
  auto rt = open_runtime(a);
  if (!rt) {
    std::fprintf(stderr, "cedar demo: %s\n", rt.err().message.c_str());
    return 2;
  }
  agent_options o;
  o.name = "demo";
  o.system_prompt = "You are cedar, a helpful assistant. Use the tools when they help.";
  o.max_new_tokens = 160;
  o.max_tool_rounds = 4;
  o.tools = {"calculator", "notes_save", "notes_read", "clock"};
  auto ag = (*rt)->create_agent(o);
  if (!ag) {
    std::fprintf(stderr, "cedar demo: %s\n", ag.err().message.c_str());
    return 2;
  }
  // Tasks of the kinds the shipped model was trained on (cedar_ref/data.py), asked in one session:
  // the second and third resume it after a committed turn.
  const char* tasks[] = {"What is 1234 * 5678?", "What's the date today?", "Compute 365 * 24."};
  for (const char* t : tasks) {
    std::printf("\n>>> %s\n", t);
    std::fflush(stdout);
    auto r = ag->ask(t, print_event);
    if (!r) {
      std::fprintf(stderr, "cedar demo: %s\n", r.err().message.c_str());
      return 1;
    }
    print_summary(*r, ag->session());
  }
  std::fprintf(stderr, "\nsessions are stored in %s (`cedar sessions list --store %s`)\n", a.store.c_str(),
               a.store.c_str());
  return 0;
}

}  // namespace

void add_agent_commands(CLI::App& app, int* exit_code) {
  static agent_args run_args, chat_args, demo_args;
  static std::string task;
  auto* run = app.add_subcommand("run", "run one agent turn on a task and print the answer");
  add_common(run, run_args);
  run->add_flag("--json", run_args.json, "print the turn's result as JSON (no streaming)");
  run->add_option("task", task, "what the agent should do")->required();
  run->callback([exit_code] { *exit_code = cmd_run(run_args, task); });

  auto* chat = app.add_subcommand("chat", "talk to an agent, turn by turn (Ctrl-C interrupts a reply)");
  add_common(chat, chat_args);
  chat->callback([exit_code] { *exit_code = cmd_chat(chat_args); });

  auto* demo = app.add_subcommand("demo", "the default agent demo: the shipped model calling built-in tools");
  demo->add_option("--model", demo_args.model_dir, "model directory")->capture_default_str();
  demo->add_option("--store", demo_args.store, "session store (default: a new temp file)");
  demo->add_option("--backend", demo_args.backend, "where decode steps run: cpu, cuda or auto")->capture_default_str();
  demo->callback([exit_code] { *exit_code = cmd_demo(demo_args); });
}

}  // namespace cedar::runtime
