// A calculator agent: the shipped default model, the built-in calculator, and one C++ tool of
// our own. This file is quoted in README.md and built (and run) by CI.
//
//   build/examples/example_calculator_agent [MODEL_DIR] [STORE.db]
#include <cstdio>
#include <string>

#include "runtime/cedar.hpp"

int main(int argc, char** argv) {
  if (argc > 1 && (std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h")) {
    std::printf("usage: %s [MODEL_DIR] [STORE.db]\nA calculator agent on the shipped model: the built-in calculator and a C++ tool.\n", argv[0]);
    return 0;
  }
  cedar::runtime_options opts;
  opts.model_dir = argc > 1 ? argv[1] : CEDAR_SOURCE_DIR "/model/weights/cedar-agent-tiny";
  opts.store_path = argc > 2 ? argv[2] : "calculator_agent.db";
  auto rt = cedar::agent_runtime::open(opts);
  if (!rt) {
    std::fprintf(stderr, "cannot start: %s\n", rt.err().message.c_str());
    return 1;
  }

  // A C++ tool: a name, a description, a JSON schema for its arguments, and a function.
  cedar::tools::tool shout;
  shout.name = "shout";
  shout.description = "Upper-case a text.";
  shout.input_schema = {{"type", "object"},
                        {"properties", {{"text", {{"type", "string"}}}}},
                        {"required", {"text"}}};
  shout.invoke = [](const cedar::tools::json& args, const cedar::tools::invoke_context&)
      -> cedar::result<cedar::tools::tool_result> {
    std::string s = args["text"].get<std::string>();  // validated against the schema first
    for (char& c : s) c = char(std::toupper((unsigned char)c));
    return cedar::tools::text_result(s);
  };
  if (auto st = (*rt)->add_tool(shout); !st) return 1;

  cedar::agent_options a;
  a.system_prompt = "You are cedar, a helpful assistant. Use the tools when they help.";
  a.tools = {"calculator", "shout"};
  a.max_new_tokens = 160;
  auto agent = (*rt)->create_agent(a);
  if (!agent) return 1;

  auto r = agent->ask("What is 1234 * 5678?", [](const cedar::agent_event& e) {
    if (e.type == cedar::agent_event::kind::token) std::fputs(e.text.c_str(), stdout);
    if (e.type == cedar::agent_event::kind::tool_call)
      std::printf("\n[calls %s %s]\n", e.tool.c_str(), e.arguments.c_str());
    if (e.type == cedar::agent_event::kind::tool_result) std::printf("[result %s]\n", e.text.c_str());
  });
  if (!r) {
    std::fprintf(stderr, "\nturn failed: %s\n", r.err().message.c_str());
    return 1;
  }
  std::printf("\n\nsession %lld: %d tool call(s), %lld tokens of context, first token after %.0f ms\n",
              (long long)agent->session(), r->tool_calls, (long long)r->context, r->first_token_ms);
  return 0;
}
