// model::tool_grammar: the viability rules of constrained tool calls, checked on the prefixes
// of valid and invalid replies, and against the DSML parser: every reply the grammar accepts
// to its end parses into calls of offered tools with the schema's parameters.
#include "model/tool_grammar.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/dsml.hpp"

namespace cedar::model {
namespace {

const char* k_spec = R"([
  {"name": "calculator", "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                                        "required": ["expression"]}},
  {"name": "clock", "parameters": {"type": "object", "properties": {}}},
  {"name": "head", "parameters": {"type": "object", "properties": {"path": {"type": "string"},
                                  "n": {"type": "integer"}}, "required": ["path"]}},
  {"name": "free"}
])";

tool_grammar grammar() {
  auto g = tool_grammar::from_json(k_spec);
  EXPECT_TRUE(g.ok()) << (g.ok() ? "" : g.err().message);
  return std::move(*g);
}

std::string call(const std::string& name, const std::string& params) {
  return "<｜DSML｜ invoke name=\"" + name + "\">\n" + params + "</｜DSML｜ invoke>\n";
}
std::string param(const std::string& k, const std::string& v, bool str = true) {
  return "<｜DSML｜ parameter name=\"" + k + "\" string=\"" + (str ? "true" : "false") + "\">" + v +
         "</｜DSML｜ parameter>\n";
}
std::string block(const std::string& calls) { return "\n\n<｜DSML｜ calls>\n" + calls + "</｜DSML｜ calls>"; }

// Every byte prefix of a valid reply is viable; the whole reply may end.
void expect_valid(const tool_grammar& g, const std::string& reply) {
  SCOPED_TRACE(reply);
  for (size_t n = 0; n <= reply.size(); ++n) ASSERT_TRUE(g.viable(std::string_view(reply).substr(0, n))) << "prefix " << n;
  EXPECT_TRUE(g.viable(reply, /*at_end=*/true));
}

// Some prefix is not viable, and every longer one neither (a rejected token stays rejected).
void expect_invalid(const tool_grammar& g, const std::string& reply) {
  SCOPED_TRACE(reply);
  size_t first = reply.size() + 1;
  for (size_t n = 0; n <= reply.size(); ++n)
    if (!g.viable(std::string_view(reply).substr(0, n))) {
      first = n;
      break;
    }
  ASSERT_LE(first, reply.size()) << "every prefix viable";
  for (size_t n = first; n <= reply.size(); ++n) EXPECT_FALSE(g.viable(std::string_view(reply).substr(0, n))) << n;
}

TEST(ToolGrammar, ValidRepliesAreViableAtEveryPrefix) {
  auto g = grammar();
  expect_valid(g, "The answer is 42.");
  expect_valid(g, "Let me compute." + block(call("calculator", param("expression", "1234 * 5678"))));
  expect_valid(g, block(call("clock", "")));
  expect_valid(g, block(call("head", param("n", "3", false) + param("path", "a/b.txt"))));
  expect_valid(g, block(call("calculator", param("expression", "2+2")) + call("clock", "")));
  expect_valid(g, block(call("free", param("anything", "{\"x\": 1}", false))));
  expect_valid(g, "text with < and </ and a lone ｜ are content");
  expect_valid(g, block(call("clock", "")) + "\nmore content after the block");
}

TEST(ToolGrammar, InvalidCallsAreRejectedWhereTheyGoWrong) {
  auto g = grammar();
  expect_invalid(g, block(call("calculate", param("expression", "1"))));      // not offered
  expect_invalid(g, block(call("calculatorx", param("expression", "1"))));    // longer than any name
  expect_invalid(g, block(call("calculator", param("expr", "1"))));           // unknown parameter
  expect_invalid(g, block(call("calculator", param("expression", "1", false))));  // string given as JSON
  expect_invalid(g, block(call("head", param("path", "a") + param("n", "three", false))));  // not JSON
  expect_invalid(g, block(call("head", param("path", "a") + param("n", "2.5", false))));    // not an integer
  expect_invalid(g, block(call("head", param("n", "3", false))));             // required path missing
  expect_invalid(g, block(call("head", param("path", "a") + param("path", "b"))));  // given twice
  expect_invalid(g, block(call("clock", param("tz", "UTC"))));                // no parameters declared
  expect_invalid(g, "text <｜DSML｜ invoke name=\"clock\">");                  // a call outside a block
  expect_invalid(g, "\n\n<｜DSML｜ calls>\nstray text");                       // text inside a block
}

TEST(ToolGrammar, EndingIsAllowedOnlyOutsideABlock) {
  auto g = grammar();
  const std::string open = "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"clock\">\n";
  EXPECT_TRUE(g.viable(open));
  EXPECT_FALSE(g.viable(open, /*at_end=*/true));
  EXPECT_FALSE(g.viable("\n\n<｜DSML｜ calls>", true));
  EXPECT_FALSE(g.viable(block(call("calculator", "<｜DSML｜ parameter name=\"expression\" string=\"true\">1+")), true));
  EXPECT_TRUE(g.viable(block(call("clock", "")), true));
  EXPECT_TRUE(g.viable("", true));
}

TEST(ToolGrammar, AcceptedRepliesParseIntoValidCalls) {
  auto g = grammar();
  const std::vector<std::string> replies = {
      block(call("calculator", param("expression", "3 * 4"))),
      block(call("head", param("path", "x.txt") + param("n", "10", false)) + call("clock", "")),
  };
  for (const auto& r : replies) {
    ASSERT_TRUE(g.viable(r, true)) << r;
    dsml_parser p;
    std::vector<dsml_event> ev;
    p.feed(r, ev);
    p.finish(ev);
    int ends = 0;
    for (const auto& e : ev) {
      EXPECT_NE(e.kind, dsml_event_kind::error) << e.text;
      ends += e.kind == dsml_event_kind::call_end;
    }
    EXPECT_GE(ends, 1);
  }
}

TEST(ToolGrammar, BadSpecsAreErrorsThatSayWhy) {
  auto a = tool_grammar::from_json("not json");
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.err().message.find("not JSON"), std::string::npos);
  auto b = tool_grammar::from_json(R"({"name": "x"})");
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.err().message.find("array"), std::string::npos);
  auto c = tool_grammar::from_json(R"([{"parameters": {}}])");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.err().message.find("tool 0"), std::string::npos);
}

TEST(ToolGrammar, SpecBuilderRoundTrips) {
  auto g = tool_grammar::from_json(tool_grammar_spec(
      {{"calc \"q\"", R"({"type": "object", "properties": {"e": {"type": "string"}}, "required": ["e"]})"}, {"clock", ""}}));
  ASSERT_TRUE(g.ok()) << g.err().message;
  ASSERT_EQ(g->tools().size(), 2u);
  EXPECT_EQ(g->tools()[0].name, "calc \"q\"");
  ASSERT_EQ(g->tools()[0].params.size(), 1u);
  EXPECT_TRUE(g->tools()[0].params[0].required);
  EXPECT_EQ(g->tools()[0].params[0].kind, param_kind::string);
  EXPECT_TRUE(g->tools()[1].open);
}

// No tools (the agent's final reply after a limit): text only; the text may not end inside the
// start of a DSML marker (a "<" may only be followed at once by what cannot become one).
TEST(ToolGrammar, NoToolsAllowsTextButNoBlock) {
  auto g = tool_grammar::from_json(tool_grammar_spec({}));
  ASSERT_TRUE(g.ok()) << g.err().message;
  EXPECT_TRUE(g->tools().empty());
  EXPECT_TRUE(g->viable("The answer is 42.", /*at_end=*/true));
  EXPECT_TRUE(g->viable("a <b, and 3 < 4", false));
  EXPECT_FALSE(g->viable("a <", false));
  EXPECT_FALSE(g->viable("x\n\n<｜DS", false));
  EXPECT_FALSE(g->viable("\n\n", false));  // the opening of a block after no text
  EXPECT_FALSE(g->viable(" ", false));
  EXPECT_TRUE(g->viable("It is 4.\n\nDone.", true));
  EXPECT_FALSE(g->viable("Let me check.\n\n<｜DSML｜", false));
  EXPECT_FALSE(g->viable("Let me check." + block(""), true));
  EXPECT_FALSE(g->viable("x" + block(call("clock", "")), true));
  // The same replies with a tool offered are viable.
  EXPECT_TRUE(grammar().viable("x" + block(call("clock", "")), true));
}

}  // namespace
}  // namespace cedar::model
