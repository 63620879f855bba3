// A long-running session that is stopped and resumed: the first process runs a turn and exits
// (or is killed); the second reopens the store and continues the same session. The KV comes
// back from the store (FP4 pages) and only the last n_win tokens are replayed.
//
//   build/examples/example_resume_session start STORE.db [MODEL_DIR]   -> prints the session id
//   build/examples/example_resume_session resume STORE.db ID [MODEL_DIR]
#include <cstdio>
#include <cstdlib>
#include <string>

#include "runtime/cedar.hpp"

int main(int argc, char** argv) {
  const char* usage = "usage: %s start STORE.db [MODEL_DIR] | resume STORE.db ID [MODEL_DIR]\n";
  if (argc > 1 && (std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h")) {
    std::printf(usage, argv[0]);
    std::printf("Runs a turn and exits (start, prints the session id), then continues that session (resume).\n");
    return 0;
  }
  if (argc < 3) {
    std::fprintf(stderr, usage, argv[0]);
    return 2;
  }
  std::string mode = argv[1];
  bool resume = mode == "resume";
  if (!resume && mode != "start") {
    std::fprintf(stderr, "unknown mode '%s' (start or resume)\n", mode.c_str());
    std::fprintf(stderr, usage, argv[0]);
    return 2;
  }
  if (resume && argc < 4) {
    std::fprintf(stderr, "resume needs the session id\n");
    std::fprintf(stderr, usage, argv[0]);
    return 2;
  }
  int model_arg = resume ? 4 : 3;
  cedar::runtime_options opts;
  opts.store_path = argv[2];
  opts.model_dir = argc > model_arg ? argv[model_arg] : CEDAR_SOURCE_DIR "/model/weights/cedar-agent-tiny";
  auto rt = cedar::agent_runtime::open(opts);
  if (!rt) {
    std::fprintf(stderr, "cannot start: %s\n", rt.err().message.c_str());
    return 1;
  }
  cedar::agent_options a;
  a.system_prompt = "You are cedar, a helpful assistant. Use the tools when they help.";
  a.tools = {"notes_save", "notes_read", "calculator"};
  a.max_new_tokens = 120;
  auto agent = resume ? (*rt)->resume_agent(std::atoll(argv[3]), a) : (*rt)->create_agent(a);
  if (!agent) {
    std::fprintf(stderr, "%s\n", agent.err().message.c_str());
    return 1;
  }
  auto r = agent->ask(resume ? "What is the code I asked you to remember?"
                             : "Please remember the code 4417 for the blue locker.");
  if (!r) {
    std::fprintf(stderr, "turn failed: %s\n", r.err().message.c_str());
    return 1;
  }
  std::printf("session %lld\nresume_path %s\nreplayed_tokens %lld\ncontext %lld\nanswer %s\n",
              (long long)agent->session(), r->resume_path.c_str(), (long long)r->replayed_tokens,
              (long long)r->context, r->answer.c_str());
  return 0;
}
