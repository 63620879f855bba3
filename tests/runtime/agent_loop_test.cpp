// The agent loop as a plain state machine (no actors): scripted model replies are encoded with
// the real tokenizer and streamed token by token, exactly as the executor streams them.
#include <gtest/gtest.h>

#include "runtime/agent_loop.hpp"
#include "runtime_test_util.hpp"

using namespace cedar;
using namespace cedar::runtime;

namespace {

const char* kCalcTool =
    R"({"type": "function", "function": {"name": "calculator", "description": "exact arithmetic", "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}})";

// Streams `text` (what the model "generates") into the loop token by token.
reply_action reply(agent_loop& loop, const std::string& text, bool stopped = true) {
  auto tok = test::test_tokenizer();
  auto ids = tok->encode(text, true);
  EXPECT_TRUE(ids.ok());
  std::vector<model::dsml_event> ev;
  for (int32_t id : *ids) loop.on_token(id, ev);
  return loop.end_reply(stopped);
}

std::string calc_call(const std::string& expr) {
  return "Let me compute.\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"calculator\">\n<｜DSML｜ parameter "
         "name=\"expression\" string=\"true\">" +
         expr + "</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>";
}

}  // namespace

TEST(AgentLoop, FirstTurnTokensAreTheRenderedPrompt) {
  auto tok = test::test_tokenizer();
  agent_loop loop(*tok, "You are helpful.", {kCalcTool}, {"calculator"}, {});
  auto t = loop.begin_turn("What is 6 * 7?");
  ASSERT_TRUE(t.ok()) << t.err().message;
  EXPECT_EQ(loop.phase(), agent_phase::generating);
  auto text = tok->decode(*t);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(text->rfind("<｜begin▁of▁sentence｜><｜System｜>You are helpful.", 0), 0u) << *text;
  EXPECT_NE(text->find("calculator"), std::string::npos);
  EXPECT_NE(text->find("<｜User｜>What is 6 * 7?<｜Assistant｜></think>"), std::string::npos);
  // A second begin_turn while generating is refused.
  EXPECT_FALSE(loop.begin_turn("again").ok());
}

TEST(AgentLoop, ToolCallRoundTripAndDeltasAreSuffixes) {
  auto tok = test::test_tokenizer();
  agent_loop loop(*tok, "sys", {kCalcTool}, {"calculator"}, {});
  auto first = loop.begin_turn("What is 6 * 7?");
  ASSERT_TRUE(first.ok());
  reply_action a = reply(loop, calc_call("6 * 7") + "<｜end▁of▁sentence｜>");
  ASSERT_EQ(a.calls.size(), 1u);
  EXPECT_EQ(a.calls[0].name, "calculator");
  EXPECT_EQ(a.calls[0].arguments_json, R"({"expression": "6 * 7"})");
  EXPECT_TRUE(a.calls[0].error.empty());
  EXPECT_EQ(loop.phase(), agent_phase::running_tools);

  auto next = loop.tool_results({{a.calls[0].id, "42", false, 1.0}});
  ASSERT_TRUE(next.ok()) << next.err().message;
  auto text = tok->decode(*next);
  EXPECT_EQ(*text, "<｜User｜><tool_result>42</tool_result><｜Assistant｜></think>");
  EXPECT_EQ(loop.phase(), agent_phase::generating);

  reply_action b = reply(loop, "6 * 7 = 42.<｜end▁of▁sentence｜>");
  EXPECT_TRUE(b.calls.empty());
  EXPECT_EQ(b.content, "6 * 7 = 42.");
  EXPECT_EQ(loop.phase(), agent_phase::idle);

  // The next user turn's delta starts right after the last EOS.
  auto t2 = loop.begin_turn("thanks");
  ASSERT_TRUE(t2.ok());
  EXPECT_EQ(*tok->decode(*t2), "<｜User｜>thanks<｜Assistant｜></think>");
}

TEST(AgentLoop, ResultsGoInCallOrderWhateverOrderTheyArrive) {
  auto tok = test::test_tokenizer();
  agent_loop loop(*tok, "sys", {kCalcTool}, {"calculator"}, {});
  ASSERT_TRUE(loop.begin_turn("two sums").ok());
  std::string two =
      "<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"calculator\">\n<｜DSML｜ parameter name=\"expression\" "
      "string=\"true\">1+1</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n<｜DSML｜ invoke name=\"calculator\">\n<｜DSML｜ "
      "parameter name=\"expression\" string=\"true\">2+2</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>";
  reply_action a = reply(loop, two);
  ASSERT_EQ(a.calls.size(), 2u);
  auto next = loop.tool_results({{a.calls[1].id, "4", false, 0}, {a.calls[0].id, "2", false, 0}});
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(*tok->decode(*next),
            "<｜User｜><tool_result>2</tool_result>\n\n<tool_result>4</tool_result><｜Assistant｜></think>");
}

TEST(AgentLoop, UnknownToolAndMalformedCallBecomeErrorResults) {
  auto tok = test::test_tokenizer();
  agent_loop loop(*tok, "sys", {kCalcTool}, {"calculator"}, {});
  ASSERT_TRUE(loop.begin_turn("x").ok());
  reply_action a = reply(loop,
                         "<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"rm_rf\">\n</｜DSML｜ invoke>\n</｜DSML｜ calls>");
  ASSERT_EQ(a.calls.size(), 1u);
  EXPECT_NE(a.calls[0].error.find("unknown tool 'rm_rf'"), std::string::npos);
  ASSERT_TRUE(loop.tool_results({{a.calls[0].id, a.calls[0].error, true, 0}}).ok());

  // A truncated DSML block with no complete call: the model still gets an error to read.
  reply_action b = reply(loop, "<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"calculator\">\n<｜DSML｜ parameter name=",
                         /*stopped=*/false);
  ASSERT_EQ(b.calls.size(), 1u);
  EXPECT_NE(b.calls[0].error.find("malformed tool call"), std::string::npos) << b.calls[0].error;
  auto next = loop.tool_results({{b.calls[0].id, b.calls[0].error, true, 0}});
  ASSERT_TRUE(next.ok());
  // The cut reply owes its EOS: the delta closes it first.
  EXPECT_EQ((*next)[0], tok->eos_id());
}

TEST(AgentLoop, RoundLimitEndsTheTurn) {
  auto tok = test::test_tokenizer();
  agent_limits lim;
  lim.max_tool_rounds = 1;
  lim.answer_on_limit = false;
  agent_loop loop(*tok, "sys", {kCalcTool}, {"calculator"}, lim);
  ASSERT_TRUE(loop.begin_turn("loop forever").ok());
  reply_action a = reply(loop, calc_call("1+1"));
  ASSERT_EQ(a.calls.size(), 1u);
  ASSERT_TRUE(loop.tool_results({{a.calls[0].id, "2", false, 0}}).ok());
  reply_action b = reply(loop, calc_call("2+2"));
  EXPECT_TRUE(b.round_limit);
  EXPECT_TRUE(b.calls.empty());
  ASSERT_EQ(b.refused.size(), 1u);  // kept for the transcript item (dashboard: "not run")
  EXPECT_EQ(b.refused[0].arguments_json, R"({"expression": "2+2"})");
  EXPECT_EQ(loop.phase(), agent_phase::idle);
}

TEST(AgentLoop, ACallRepeatedAfterFailingTwiceEndsTheTurn) {
  auto tok = test::test_tokenizer();
  agent_limits stop;  // max_repeated_failures = 2
  stop.answer_on_limit = false;
  agent_loop loop(*tok, "sys", {kCalcTool}, {"calculator"}, stop);
  ASSERT_TRUE(loop.begin_turn("divide").ok());
  // The same failing call twice runs twice (a retry can be worth it: a tool may fail transiently).
  for (int i = 0; i < 2; ++i) {
    reply_action a = reply(loop, calc_call("1/0"));
    ASSERT_EQ(a.calls.size(), 1u) << i;
    EXPECT_FALSE(a.repeat_limit);
    ASSERT_TRUE(loop.tool_results({{a.calls[0].id, "division by zero", true, 0}}).ok());
  }
  // A different call that fails, and one that succeeds, do not count against "1/0".
  reply_action c = reply(loop, calc_call("2/0"));
  ASSERT_EQ(c.calls.size(), 1u);
  ASSERT_TRUE(loop.tool_results({{c.calls[0].id, "division by zero", true, 0}}).ok());
  // The third "1/0" is not run: the turn ends, like the round limit, with no call pending.
  reply_action d = reply(loop, calc_call("1/0"));
  EXPECT_TRUE(d.repeat_limit);
  EXPECT_FALSE(d.round_limit);
  EXPECT_TRUE(d.calls.empty());
  ASSERT_EQ(d.refused.size(), 1u);
  EXPECT_EQ(d.refused[0].name, "calculator");
  EXPECT_EQ(d.refused[0].arguments_json, R"({"expression": "1/0"})");
  EXPECT_EQ(loop.phase(), agent_phase::idle);
  EXPECT_TRUE(loop.messages().back().tool_calls.empty());

  // Counts are per turn: the next turn may make the call again.
  ASSERT_TRUE(loop.begin_turn("try again").ok());
  reply_action e = reply(loop, calc_call("1/0"));
  EXPECT_EQ(e.calls.size(), 1u);
  EXPECT_FALSE(e.repeat_limit);
}

// answer_on_limit (the default): the stopped call is answered "not run" (never run), the model
// gets one more reply, which may not call tools, and that reply ends the turn with its text.
TEST(AgentLoop, RoundLimitGetsOneFinalReplyWithoutTools) {
  auto tok = test::test_tokenizer();
  agent_limits lim;
  lim.max_tool_rounds = 1;
  agent_loop loop(*tok, "sys", {kCalcTool}, {"calculator"}, lim);
  ASSERT_TRUE(loop.begin_turn("loop forever").ok());
  reply_action a = reply(loop, calc_call("1+1"));
  ASSERT_EQ(a.calls.size(), 1u);
  EXPECT_TRUE(loop.calls_allowed());
  ASSERT_TRUE(loop.tool_results({{a.calls[0].id, "2", false, 0}}).ok());
  reply_action b = reply(loop, calc_call("2+2"));
  EXPECT_TRUE(b.round_limit);
  ASSERT_EQ(b.calls.size(), 1u);
  EXPECT_TRUE(b.calls[0].refused);
  EXPECT_EQ(b.calls[0].error, "not run: this turn reached its limit of 1 tool rounds; answer with what you have");
  ASSERT_EQ(b.refused.size(), 1u);
  EXPECT_EQ(b.refused[0].arguments_json, R"({"expression": "2+2"})");
  EXPECT_EQ(loop.phase(), agent_phase::running_tools);
  EXPECT_EQ(loop.messages().back().tool_calls.size(), 1u);  // the call stays, with its result
  EXPECT_FALSE(loop.calls_allowed());
  auto t = loop.tool_results({{b.calls[0].id, b.calls[0].error, true, 0}});
  ASSERT_TRUE(t.ok()) << t.err().message;
  auto text = tok->decode(*t);
  ASSERT_TRUE(text.ok());
  EXPECT_NE(text->find("<tool_result>error: not run: this turn reached its limit"), std::string::npos) << *text;
  // A call in the final reply (an unconstrained model) is not run either: the turn ends.
  reply_action c = reply(loop, calc_call("3+3"));
  EXPECT_TRUE(c.round_limit);
  EXPECT_TRUE(c.calls.empty());
  ASSERT_EQ(c.refused.size(), 1u);
  EXPECT_EQ(loop.phase(), agent_phase::idle);
  // The next turn may call tools again.
  ASSERT_TRUE(loop.begin_turn("once more").ok());
  EXPECT_TRUE(loop.calls_allowed());
  reply_action d = reply(loop, calc_call("4+4"));
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_FALSE(d.calls[0].refused);
}

TEST(AgentLoop, RepeatGuardGetsOneFinalReplyThatEndsTheTurnWithText) {
  auto tok = test::test_tokenizer();
  agent_loop loop(*tok, "sys", {kCalcTool}, {"calculator"}, {});  // max_repeated_failures = 2
  ASSERT_TRUE(loop.begin_turn("divide").ok());
  for (int i = 0; i < 2; ++i) {
    reply_action a = reply(loop, calc_call("1/0"));
    ASSERT_EQ(a.calls.size(), 1u) << i;
    ASSERT_TRUE(loop.tool_results({{a.calls[0].id, "division by zero", true, 0}}).ok());
  }
  reply_action b = reply(loop, calc_call("1/0"));
  EXPECT_TRUE(b.repeat_limit);
  EXPECT_FALSE(b.round_limit);
  ASSERT_EQ(b.calls.size(), 1u);
  EXPECT_TRUE(b.calls[0].refused);
  EXPECT_EQ(b.calls[0].error, "not run: this call already failed 2 times; answer with what you have");
  ASSERT_TRUE(loop.tool_results({{b.calls[0].id, b.calls[0].error, true, 0}}).ok());
  reply_action c = reply(loop, "I cannot divide by zero.");
  EXPECT_TRUE(c.calls.empty());
  EXPECT_FALSE(c.repeat_limit);
  EXPECT_EQ(c.content, "I cannot divide by zero.");
  EXPECT_EQ(loop.phase(), agent_phase::idle);
  EXPECT_EQ(loop.messages().back().content, "I cannot divide by zero.");
}

TEST(AgentLoop, RepeatedSuccessfulCallsAndADisabledLimitNeverStopATurn) {
  auto tok = test::test_tokenizer();
  agent_loop ok_loop(*tok, "sys", {kCalcTool}, {"calculator"}, {});
  ASSERT_TRUE(ok_loop.begin_turn("again and again").ok());
  for (int i = 0; i < 4; ++i) {
    reply_action a = reply(ok_loop, calc_call("1+1"));
    ASSERT_EQ(a.calls.size(), 1u) << i;
    ASSERT_TRUE(ok_loop.tool_results({{a.calls[0].id, "2", false, 0}}).ok());
  }
  agent_limits off;
  off.max_repeated_failures = 0;
  agent_loop loop(*tok, "sys", {kCalcTool}, {"calculator"}, off);
  ASSERT_TRUE(loop.begin_turn("divide").ok());
  for (int i = 0; i < 4; ++i) {
    reply_action a = reply(loop, calc_call("1/0"));
    ASSERT_EQ(a.calls.size(), 1u) << i;
    EXPECT_FALSE(a.repeat_limit);
    ASSERT_TRUE(loop.tool_results({{a.calls[0].id, "division by zero", true, 0}}).ok());
  }
}

TEST(AgentLoop, CancelWhileRunningToolsLeavesAValidTranscript) {
  auto tok = test::test_tokenizer();
  agent_loop loop(*tok, "sys", {kCalcTool}, {"calculator"}, {});
  ASSERT_TRUE(loop.begin_turn("x").ok());
  reply_action a = reply(loop, calc_call("1/0"));
  ASSERT_EQ(a.calls.size(), 1u);
  loop.cancel();
  EXPECT_EQ(loop.phase(), agent_phase::idle);
  EXPECT_EQ(loop.messages().back().role, model::chat_role::tool);
  EXPECT_EQ(loop.messages().back().content, "error: cancelled");
  auto t = loop.begin_turn("next");
  ASSERT_TRUE(t.ok()) << t.err().message;
  EXPECT_EQ(*tok->decode(*t), "<｜User｜><tool_result>error: cancelled</tool_result>\n\n" "next<｜Assistant｜></think>")
      << "(the chat format merges the cancelled result into the next user turn)";
}

TEST(AgentLoop, RestoreContinuesWhereTheTranscriptEnds) {
  auto tok = test::test_tokenizer();
  agent_loop a(*tok, "sys", {kCalcTool}, {"calculator"}, {});
  ASSERT_TRUE(a.begin_turn("hello").ok());
  reply(a, "hi there<｜end▁of▁sentence｜>");
  agent_loop b(*tok, "sys", {kCalcTool}, {"calculator"}, {});
  ASSERT_TRUE(b.restore(a.messages(), true).ok());
  auto ta = a.begin_turn("more");
  auto tb = b.begin_turn("more");
  ASSERT_TRUE(ta.ok() && tb.ok());
  EXPECT_EQ(*ta, *tb);
}

// A crash between a reply's tool calls and their results (found by the soak test): the stored
// transcript ends with the assistant's calls. The restored loop answers them "interrupted"
// (once, for the agent to commit) and the next turn renders those results and the new user
// message as the continuation of the log, exactly as a cancel would have.
TEST(AgentLoop, RestoreAfterACrashBeforeTheToolResultsAnswersThemInterrupted) {
  auto tok = test::test_tokenizer();
  agent_loop a(*tok, "sys", {kCalcTool}, {"calculator"}, {});
  ASSERT_TRUE(a.begin_turn("What is 6 * 7?").ok());
  reply_action r = reply(a, calc_call("6 * 7") + "<｜end▁of▁sentence｜>");
  ASSERT_EQ(r.calls.size(), 1u);
  ASSERT_EQ(a.phase(), agent_phase::running_tools);  // the process dies here

  agent_loop b(*tok, "sys", {kCalcTool}, {"calculator"}, {});
  ASSERT_TRUE(b.restore(a.messages(), true).ok());
  auto lost = b.take_interrupted();
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].id, r.calls[0].id);
  EXPECT_EQ(lost[0].name, "calculator");
  EXPECT_NE(lost[0].error.find("interrupted"), std::string::npos) << lost[0].error;
  EXPECT_TRUE(b.take_interrupted().empty());  // handed over once
  EXPECT_EQ(b.messages().back().role, model::chat_role::tool);
  EXPECT_EQ(b.messages().back().tool_call_id, r.calls[0].id);

  auto t = b.begin_turn("next");
  ASSERT_TRUE(t.ok()) << t.err().message;
  EXPECT_EQ(*tok->decode(*t), "<｜User｜><tool_result>error: " + lost[0].error +
                                  "</tool_result>\n\nnext<｜Assistant｜></think>");
}

// A crash after the tool results were stored but before the next reply: the sequence (token
// log) ends with the reply, so the stored results must come back with the next turn's delta.
TEST(AgentLoop, RestoreAfterACrashAfterTheToolResultsRendersThemWithTheNextTurn) {
  auto tok = test::test_tokenizer();
  agent_loop a(*tok, "sys", {kCalcTool}, {"calculator"}, {});
  ASSERT_TRUE(a.begin_turn("What is 6 * 7?").ok());
  reply_action r = reply(a, calc_call("6 * 7") + "<｜end▁of▁sentence｜>");
  ASSERT_EQ(r.calls.size(), 1u);
  ASSERT_TRUE(a.tool_results({{r.calls[0].id, "42", false, 1.0}}).ok());  // stored; the process dies

  agent_loop b(*tok, "sys", {kCalcTool}, {"calculator"}, {});
  ASSERT_TRUE(b.restore(a.messages(), true).ok());
  EXPECT_TRUE(b.take_interrupted().empty());  // every call has its result
  auto t = b.begin_turn("next");
  ASSERT_TRUE(t.ok()) << t.err().message;
  EXPECT_EQ(*tok->decode(*t), "<｜User｜><tool_result>42</tool_result>\n\nnext<｜Assistant｜></think>");
}
