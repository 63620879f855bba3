#include <cctype>
#include <cstdio>
#include <string>

#include "runtime/cedar.hpp"

int main(int argc, char** argv) {
  cedar::runtime_options opts;
  opts.model_dir = argc > 1 ? argv[1] : "model/weights/cedar-agent-tiny";  // config.json, model.safetensors, tokenizer.json
  opts.store_path = argc > 2 ? argv[2] : "readme_agent.db";      // the SQLite session store
  auto rt = cedar::agent_runtime::open(opts);
  if (!rt) return std::fprintf(stderr, "%s\n", rt.err().message.c_str()), 1;

  cedar::tools::tool shout;  // a C++ tool: name, description, JSON schema of its arguments, function
  shout.name = "shout";
  shout.description = "Upper-case a text.";
  shout.input_schema = {{"type", "object"},
                        {"properties", {{"text", {{"type", "string"}}}}},
                        {"required", {"text"}}};
  shout.invoke = [](const cedar::tools::json& args, const cedar::tools::invoke_context&)
      -> cedar::result<cedar::tools::tool_result> {
    std::string s = args["text"].get<std::string>();  // validated against the schema before the call
    for (char& c : s) c = char(std::toupper((unsigned char)c));
    return cedar::tools::text_result(s);
  };
  if (!(*rt)->add_tool(shout)) return 1;

  cedar::agent_options a;
  a.system_prompt = "You are cedar, a helpful assistant. Use the tools when they help.";
  a.tools = {"calculator", "shout"};
  auto agent = (*rt)->create_agent(a);
  if (!agent) return 1;
  auto r = agent->ask("What is 1234 * 5678?", [](const cedar::agent_event& e) {
    if (e.type == cedar::agent_event::kind::token) std::fputs(e.text.c_str(), stdout);
    if (e.type == cedar::agent_event::kind::tool_call)
      std::printf("\n[%s %s]\n", e.tool.c_str(), e.arguments.c_str());
  });
  if (!r) return std::fprintf(stderr, "%s\n", r.err().message.c_str()), 1;
  std::printf("\n%d tool call(s), %lld tokens of context, resume path %s\n", r->tool_calls,
              (long long)r->context, r->resume_path.c_str());
}
