// Tests of model::chat_format against cedar_ref/chat.py goldens (tests/tokenizer/chat_golden.json):
// byte-identical prompts and ids for chat/thinking, tools, tool results, dropped reasoning,
// reminders and prefills; Python-identical JSON dumps; clear errors on bad input.
#include "model/chat_format.hpp"

#include <gtest/gtest.h>
#include <simdjson.h>

#include <fstream>
#include <sstream>

#include "model/dsml.hpp"

namespace cedar::model {
namespace {

const std::string k_dir = std::string(CEDAR_SOURCE_DIR) + "/tests/tokenizer/";

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// simdjson has no serializer for sub-elements here; minify() gives valid JSON text of one.
std::string to_text(simdjson::dom::element e) { return simdjson::minify(e); }

TEST(ChatFormat, MatchesPythonGoldens) {
  auto tok = tokenizer::load(k_dir + "tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.err().message;
  simdjson::dom::parser parser;
  const std::string json = read_file(k_dir + "chat_golden.json");
  simdjson::dom::element root;
  ASSERT_FALSE(parser.parse(json).get(root));
  std::string_view fmt;
  ASSERT_FALSE(root["format"].get_string().get(fmt));
  EXPECT_EQ(fmt, "cedar-chat-golden-v1");
  simdjson::dom::array cases;
  ASSERT_FALSE(root["cases"].get_array().get(cases));
  size_t n = 0;
  for (simdjson::dom::element c : cases) {
    std::string_view name, mode, prompt;
    ASSERT_FALSE(c["name"].get_string().get(name));
    ASSERT_FALSE(c["mode"].get_string().get(mode));
    ASSERT_FALSE(c["prompt"].get_string().get(prompt));
    auto msgs = messages_from_json(to_text(c["messages"].value()));
    ASSERT_TRUE(msgs.ok()) << name << ": " << msgs.err().message;
    chat_options opts;
    opts.mode = mode == "thinking" ? chat_mode::thinking : chat_mode::chat;
    opts.reasoning_effort = static_cast<int>(int64_t(c["reasoning_effort"].get_int64().value()));
    opts.drop_thinking = bool(c["drop_thinking"].get_bool().value());
    opts.add_bos = bool(c["add_bos"].get_bool().value());
    auto text = render_chat(*msgs, opts);
    ASSERT_TRUE(text.ok()) << name << ": " << text.err().message;
    EXPECT_EQ(*text, prompt) << name;
    std::vector<int32_t> want;
    simdjson::dom::array ids_arr;
    ASSERT_FALSE(c["ids"].get_array().get(ids_arr));
    for (simdjson::dom::element id : ids_arr) want.push_back(int32_t(int64_t(id.get_int64().value())));
    auto ids = render_chat_ids(*tok, *msgs, opts);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(*ids, want) << name;
    ++n;
  }
  EXPECT_GE(n, 19u);
}

TEST(ChatFormat, JsonDumpsLikePython) {
  simdjson::dom::parser parser;
  const std::string json = read_file(k_dir + "chat_golden.json");
  simdjson::dom::element root;
  ASSERT_FALSE(parser.parse(json).get(root));
  size_t n = 0;
  simdjson::dom::array dumps;
  ASSERT_FALSE(root["json_dumps"].get_array().get(dumps));
  for (simdjson::dom::element c : dumps) {
    std::string_view in, want;
    ASSERT_FALSE(c["json"].get_string().get(in));
    ASSERT_FALSE(c["python"].get_string().get(want));
    auto got = json_python_dump(in);
    ASSERT_TRUE(got.ok()) << in << ": " << got.err().message;
    EXPECT_EQ(*got, want) << in;
    ++n;
  }
  EXPECT_GE(n, 15u);
  EXPECT_EQ(json_quote("a\"\\\n\t\x01\x7f"), "\"a\\\"\\\\\\n\\t\\u0001\x7f\"");
}

TEST(ChatFormat, StructureOfATurn) {
  std::vector<chat_message> msgs(2);
  msgs[0].role = chat_role::system;
  msgs[0].content = "S";
  msgs[1].content = "Q";
  chat_options opts;
  auto chat_text = render_chat(msgs, opts);
  ASSERT_TRUE(chat_text.ok());
  EXPECT_EQ(*chat_text, "<｜begin▁of▁sentence｜><｜System｜>S<｜User｜>Q<｜Assistant｜></think>");
  opts.mode = chat_mode::thinking;
  opts.reasoning_effort = *reasoning_effort_from("xhigh");
  auto think_text = render_chat(msgs, opts);
  ASSERT_TRUE(think_text.ok());
  EXPECT_EQ(
      *think_text,
      "<｜begin▁of▁sentence｜><｜System｜>Reasoning Effort: 75 (range 1-100, the higher the value, the more "
      "thorough the reasoning)\n\nS<｜User｜>Q<｜Assistant｜><think>");
}

TEST(ChatFormat, AttachToolsPrependsASystemMessage) {
  std::vector<chat_message> msgs(1);
  msgs[0].content = "Q";
  const std::string tool =
      R"({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}})";
  attach_tools(msgs, std::vector<std::string>{tool});
  ASSERT_EQ(msgs.size(), 2u);
  EXPECT_EQ(msgs[0].role, chat_role::system);
  auto text = render_chat(msgs, {});
  ASSERT_TRUE(text.ok());
  EXPECT_NE(
      text->find(
          "### Available Tool Schemas\n\n{\"name\": \"f\", \"parameters\": {\"type\": \"object\"}}\n\n"),
      std::string::npos);
}

TEST(ChatFormat, RenderedCallsParseBack) {
  const std::vector<chat_tool_call> calls = {
      {"c1", "get_weather",
       R"({"city": "Zürich \"ZH\"\n<b>", "days": 3, "x": [1.5, {"y": null}], "f": 1E16})"},
      {"c2", "noop", "{}"},
      {"c3", "code", R"j({"src": "if a < b:\n    print('</｜DSML｜ parameter')"})j"}};
  auto block = render_tool_calls(calls);
  ASSERT_TRUE(block.ok()) << block.err().message;
  const dsml_result r = dsml_parse("done\n\n" + *block + "<｜end▁of▁sentence｜>");
  EXPECT_TRUE(r.errors.empty()) << r.errors.front();
  EXPECT_EQ(r.content, "done");
  ASSERT_EQ(r.calls.size(), 3u);
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(r.calls[i].name, calls[i].name);
    EXPECT_EQ(r.calls[i].arguments_json, *json_python_dump(calls[i].arguments_json));
  }
}

TEST(ChatFormat, BadInputGivesClearErrors) {
  std::vector<chat_message> msgs(2);
  msgs[0].content = "Q";
  msgs[1].role = chat_role::assistant;
  msgs[1].tool_calls.push_back({"", "f", "[1, 2]"});
  auto r = render_chat(msgs, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.err().message.find("'f'"), std::string::npos);
  EXPECT_NE(r.err().message.find("JSON object"), std::string::npos);
  msgs[1].tool_calls[0].arguments_json = "{oops";
  ASSERT_FALSE(render_chat(msgs, {}).ok());

  chat_options opts;
  opts.reasoning_effort = 0;
  ASSERT_FALSE(render_chat(std::vector<chat_message>(1), opts).ok());
  EXPECT_FALSE(reasoning_effort_from("medium").ok());
  EXPECT_FALSE(reasoning_effort_from("101").ok());
  EXPECT_EQ(*reasoning_effort_from("low"), 25);
  EXPECT_EQ(*reasoning_effort_from("max"), 100);
  EXPECT_EQ(*reasoning_effort_from("42"), 42);

  std::vector<chat_message> dev(1);
  dev[0].role = chat_role::developer;
  auto d = render_chat(dev, {});
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.err().message.find("developer"), std::string::npos);

  std::vector<chat_message> sys(1);
  sys[0].role = chat_role::system;
  sys[0].tools_json = {R"({"type": "function"})"};
  auto t = render_chat(sys, {});
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.err().message.find("tools[0]"), std::string::npos);

  std::vector<chat_message> bad_utf8(1);
  bad_utf8[0].content = "\xC0\xAF";
  EXPECT_FALSE(render_chat(bad_utf8, {}).ok());

  auto m = messages_from_json(R"([{"role": "wizard", "content": "x"}])");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.err().message.find("messages[0].role"), std::string::npos);
  auto m2 = messages_from_json(R"([{"role": "user", "content": 5}])");
  ASSERT_FALSE(m2.ok());
  EXPECT_NE(m2.err().message.find("messages[0].content"), std::string::npos);
}

}  // namespace
}  // namespace cedar::model
