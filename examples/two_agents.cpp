// Two agents cooperating: a "manager" agent delegates arithmetic to a "worker" agent through a
// C++ tool whose function asks the worker (agents are actors; here the tool is the message).
//
//   build/examples/example_two_agents [MODEL_DIR] [STORE.db]
#include <cstdio>
#include <memory>
#include <string>

#include "runtime/cedar.hpp"

int main(int argc, char** argv) {
  if (argc > 1 && (std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h")) {
    std::printf("usage: %s [MODEL_DIR] [STORE.db]\nA manager agent delegating arithmetic to a worker agent through a C++ tool.\n", argv[0]);
    return 0;
  }
  cedar::runtime_options opts;
  opts.model_dir = argc > 1 ? argv[1] : CEDAR_SOURCE_DIR "/model/weights/cedar-agent-tiny";
  opts.store_path = argc > 2 ? argv[2] : "two_agents.db";
  auto rt = cedar::agent_runtime::open(opts);
  if (!rt) {
    std::fprintf(stderr, "cannot start: %s\n", rt.err().message.c_str());
    return 1;
  }
  cedar::agent_options w;
  w.name = "worker";
  w.system_prompt = "You are cedar, a helpful assistant. Use the tools when they help.";
  w.tools = {"calculator"};
  w.max_new_tokens = 120;
  auto worker = (*rt)->create_agent(w);
  if (!worker) return 1;
  auto worker_ptr = std::make_shared<cedar::agent>(*worker);

  // The manager's tool forwards a question to the worker agent and returns its answer.
  cedar::tools::tool ask_worker;
  ask_worker.name = "ask_worker";
  ask_worker.description = "Ask the worker agent a question; returns its answer.";
  ask_worker.input_schema = {{"type", "object"},
                             {"properties", {{"question", {{"type", "string"}}}}},
                             {"required", {"question"}}};
  ask_worker.invoke = [worker_ptr](const cedar::tools::json& args, const cedar::tools::invoke_context&)
      -> cedar::result<cedar::tools::tool_result> {
    auto r = worker_ptr->ask(args["question"].get<std::string>());
    if (!r) return cedar::tools::text_result(r.err().message, true);
    return cedar::tools::text_result(r->answer);
  };
  if (auto st = (*rt)->add_tool(ask_worker); !st) return 1;

  cedar::agent_options m;
  m.name = "manager";
  m.system_prompt = "You are cedar, a helpful assistant. Use the tools when they help.";
  m.tools = {"ask_worker"};
  m.max_new_tokens = 120;
  m.max_tool_rounds = 2;
  auto manager = (*rt)->create_agent(m);
  if (!manager) return 1;
  auto r = manager->ask("Ask the worker what 12 * 12 is, then tell me.", [](const cedar::agent_event& e) {
    if (e.type == cedar::agent_event::kind::tool_call) std::printf("[manager -> %s %s]\n", e.tool.c_str(), e.arguments.c_str());
    if (e.type == cedar::agent_event::kind::tool_result) std::printf("[worker answered: %s]\n", e.text.c_str());
  });
  if (!r) {
    std::fprintf(stderr, "turn failed: %s\n", r.err().message.c_str());
    return 1;
  }
  std::printf("manager: %s\n", r->answer.c_str());
  auto s = (*rt)->sessions();
  std::printf("%zu sessions in the store (manager %lld, worker %lld)\n", s ? s->size() : 0,
              (long long)manager->session(), (long long)worker->session());
  return 0;
}
