// agent_options <-> JSON, as the store keeps them per session for resume and fork.
#include <gtest/gtest.h>

#include "runtime/agent_options_json.hpp"

using namespace cedar;
using namespace cedar::runtime;

TEST(AgentOptionsJson, EveryLimitAndTheToolGrammarSurviveARoundTrip) {
  agent_options o;
  o.name = "worker";
  o.system_prompt = "be brief";
  o.tools = {"calculator", "fs__read_file"};
  o.temperature = 0.5f;
  o.seed = 99;
  o.max_new_tokens = 77;
  o.min_new_tokens = 12;
  o.max_tool_rounds = 3;
  o.max_repeated_failures = 0;  // not the default (2): a lost field would read back as 2
  o.tool_timeout_ms = 1234;
  o.constrain_tool_calls = false;  // not the default (true)
  o.answer_on_limit = false;       // not the default (true)
  auto back = agent_options_from_json(agent_options_to_json(o));
  ASSERT_TRUE(back.ok()) << back.err().message;
  EXPECT_EQ(back->name, "worker");
  EXPECT_EQ(back->system_prompt, "be brief");
  EXPECT_EQ(back->tools, o.tools);
  EXPECT_FLOAT_EQ(back->temperature, 0.5f);
  EXPECT_EQ(back->seed, 99u);
  EXPECT_EQ(back->max_new_tokens, 77);
  EXPECT_EQ(back->min_new_tokens, 12);
  EXPECT_EQ(back->max_tool_rounds, 3);
  EXPECT_EQ(back->max_repeated_failures, 0);
  EXPECT_EQ(back->tool_timeout_ms, 1234);
  EXPECT_FALSE(back->constrain_tool_calls);
  EXPECT_FALSE(back->answer_on_limit);
}

TEST(AgentOptionsJson, MissingFieldsKeepDefaultsAndWrongTypesNameTheField) {
  agent_options d;
  d.max_repeated_failures = 5;
  auto o = agent_options_from_json(R"({"max_tool_rounds": 2})", d);
  ASSERT_TRUE(o.ok()) << o.err().message;
  EXPECT_EQ(o->max_tool_rounds, 2);
  EXPECT_EQ(o->max_repeated_failures, 5);
  EXPECT_TRUE(o->constrain_tool_calls);
  EXPECT_TRUE(o->answer_on_limit);
  auto bad3 = agent_options_from_json(R"({"answer_on_limit": "yes"})");
  ASSERT_FALSE(bad3.ok());
  EXPECT_NE(bad3.err().message.find("'answer_on_limit' must be true or false"), std::string::npos) << bad3.err().message;

  auto bad = agent_options_from_json(R"({"max_repeated_failures": "two"})");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.err().message.find("'max_repeated_failures' must be an integer"), std::string::npos) << bad.err().message;
  auto bad2 = agent_options_from_json(R"({"constrain_tool_calls": 1})");
  ASSERT_FALSE(bad2.ok());
  EXPECT_NE(bad2.err().message.find("'constrain_tool_calls' must be true or false"), std::string::npos) << bad2.err().message;
  EXPECT_FALSE(agent_options_from_json("{not json").ok());
}
