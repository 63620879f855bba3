// The built-in tools against the data generator the default model was trained on
// (tests/runtime/builtin_tools_golden.json, written from cedar_ref/data.py): the same schemas in
// the system turn, the same calculator results and error texts.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "model/chat_format.hpp"
#include "runtime/actors.hpp"
#include "runtime/builtin_tools.hpp"
#include "runtime_test_util.hpp"

using namespace cedar;
using njson = nlohmann::json;

namespace {
njson golden() {
  std::ifstream f(test::src("tests/runtime/builtin_tools_golden.json"));
  return njson::parse(f);
}
const tools::tool* find(const std::vector<tools::tool>& v, const std::string& n) {
  for (const auto& t : v)
    if (t.name == n) return &t;
  return nullptr;
}
}  // namespace

TEST(BuiltinTools, SchemasRenderExactlyAsInTraining) {
  njson g = golden();
  auto tools = runtime::builtin_tools(".");
  ASSERT_EQ(tools.size(), g["schemas"].size());
  for (auto it = g["schemas"].begin(); it != g["schemas"].end(); ++it) {
    const tools::tool* t = find(tools, it.key());
    ASSERT_NE(t, nullptr) << it.key();
    auto ours = model::json_python_dump(runtime::tool_schema_json(*t));
    ASSERT_TRUE(ours.ok());
    EXPECT_EQ(*ours, it.value().get<std::string>()) << it.key();
  }
}

TEST(BuiltinTools, CalculatorMatchesTheDataGenerator) {
  njson g = golden();
  auto tools = runtime::builtin_tools(".");
  const tools::tool* calc = find(tools, "calculator");
  ASSERT_NE(calc, nullptr);
  for (const auto& c : g["calculator"]) {
    std::string expr = c["expr"];
    auto r = calc->invoke(njson{{"expression", expr}}, {});
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->is_error, !c["ok"].get<bool>()) << expr;
    EXPECT_EQ(r->to_text(), c["text"].get<std::string>()) << expr;
  }
  // Overflow is an error, never a wrong value.
  auto big = runtime::calculate("99999999999999999999999999999999999999 * 99999999999999999999");
  EXPECT_FALSE(big.ok());
  auto missing = calc->invoke(njson::object(), {});
  ASSERT_TRUE(missing.ok());
  EXPECT_TRUE(missing->is_error);
}

TEST(BuiltinTools, NotesAndFilesStayInsideTheirRoot) {
  test::temp_dir dir;
  std::ofstream(dir.file("a.txt")) << "alpha";
  std::filesystem::create_directories(dir.path / "sub");
  std::ofstream(dir.file("sub/b.txt")) << "beta";
  auto tools = runtime::builtin_tools(dir.path.string());
  auto call = [&](const char* n, njson a) {
    auto r = find(tools, n)->invoke(a, {});
    EXPECT_TRUE(r.ok());
    return *r;
  };
  EXPECT_EQ(call("file_read", {{"path", "a.txt"}}).to_text(), "alpha");
  EXPECT_EQ(call("file_read", {{"path", "./sub/b.txt"}}).to_text(), "beta");
  EXPECT_EQ(call("file_list", {{"path", "."}}).to_text(), "a.txt\nsub/");
  for (const char* bad : {"../etc/passwd", "/etc/passwd", "sub/../../x"}) {
    auto r = call("file_read", {{"path", bad}});
    EXPECT_TRUE(r.is_error) << bad;
  }
  EXPECT_TRUE(call("file_read", {{"path", "nope.txt"}}).is_error);
  EXPECT_EQ(call("notes_save", {{"key", "k"}, {"text", "v1"}}).to_text(), "saved note 'k'");
  EXPECT_EQ(call("notes_read", {{"key", "k"}}).to_text(), "v1");
  EXPECT_TRUE(call("notes_read", {{"key", "absent"}}).is_error);
  // Notes are scoped to the calling session.
  tools::invoke_context s1, s2;
  s1.session = "1";
  s2.session = "2";
  ASSERT_TRUE(find(tools, "notes_save")->invoke(njson{{"key", "k"}, {"text", "one"}}, s1).ok());
  EXPECT_EQ(find(tools, "notes_read")->invoke(njson{{"key", "k"}}, s1)->to_text(), "one");
  EXPECT_TRUE(find(tools, "notes_read")->invoke(njson{{"key", "k"}}, s2)->is_error);
  std::string clock = call("clock", njson::object()).to_text();
  EXPECT_EQ(clock.size(), std::string("2026-03-14 09:26 (").size() + clock.substr(18).size());
  EXPECT_EQ(clock[4], '-');
  EXPECT_EQ(clock.back(), ')');
}

// What an agent offers the model (runtime::offer_tools, used by the agent actor and the soak's
// reference): the named tools in registry order, their rendered schemas, and the grammar of
// exactly those tools.
TEST(BuiltinTools, OfferedToolsAreTheNamedOnesWithTheirGrammar) {
  tools::tool_registry reg;
  for (auto& t : runtime::builtin_tools(".")) ASSERT_TRUE(reg.add(std::move(t)).ok());
  std::vector<std::string> all;
  for (const auto& t : reg.list()) all.push_back(t->name);
  ASSERT_GE(all.size(), 3u);

  auto every = runtime::offer_tools(reg, {});
  EXPECT_EQ(every.names, all);
  ASSERT_EQ(every.schemas.size(), all.size());
  for (size_t i = 0; i < all.size(); i++) EXPECT_EQ(every.schemas[i], runtime::tool_schema_json(*reg.list()[i]));

  // Asked in the reverse order: still registry order; a name not registered is left out.
  std::vector<std::string> want = {all[2], all[0], "no_such_tool"};
  auto two = runtime::offer_tools(reg, want);
  EXPECT_EQ(two.names, (std::vector<std::string>{all[0], all[2]}));
  auto g = model::tool_grammar::from_json(two.grammar);
  ASSERT_TRUE(g.ok()) << g.err().message;
  ASSERT_EQ(g->tools().size(), 2u);
  EXPECT_EQ(g->tools()[0].name, all[0]);
  EXPECT_EQ(g->tools()[1].name, all[2]);
  const std::string open = "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"";
  EXPECT_TRUE(g->viable(open + all[0] + "\">"));
  EXPECT_FALSE(g->viable(open + all[1] + "\">"));

  auto none = runtime::offer_tools(reg, {"no_such_tool"});
  EXPECT_TRUE(none.names.empty());
  EXPECT_TRUE(none.grammar.empty());
}
