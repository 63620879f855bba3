// Tests of model::dsml: the goldens of cedar_ref/chat.py (tests/tokenizer/dsml_golden.json) under
// every uniform chunk size, every two-way split and random chunkings; event order and whole-
// character text; bounded memory on endless garbage; random fragment soup (no crash, chunking
// invariance); invalid UTF-8.
#include "model/dsml.hpp"

#include <gtest/gtest.h>
#include <simdjson.h>

#include <fstream>
#include <random>
#include <sstream>

#include "model/tokenizer.hpp"

namespace cedar::model {
namespace {

const std::string k_dir = std::string(CEDAR_SOURCE_DIR) + "/tests/tokenizer/";

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct golden {
  std::string name, text;
  bool thinking = false;
  dsml_limits limits;
  dsml_result want;
};

std::vector<golden> load_goldens() {
  simdjson::dom::parser parser;
  const std::string json = read_file(k_dir + "dsml_golden.json");
  simdjson::dom::element root;
  EXPECT_FALSE(parser.parse(json).get(root));
  std::string_view fmt;
  EXPECT_FALSE(root["format"].get_string().get(fmt));
  EXPECT_EQ(fmt, "cedar-dsml-golden-v1");
  simdjson::dom::array cases;
  EXPECT_FALSE(root["cases"].get_array().get(cases));
  std::vector<golden> out;
  auto str = [](simdjson::dom::element e) { return std::string(std::string_view(e.get_string().value())); };
  for (simdjson::dom::element c : cases) {
    golden g;
    g.name = str(c["name"].value());
    g.text = str(c["text"].value());
    g.thinking = bool(c["thinking"].get_bool().value());
    g.limits.max_tag_bytes = uint64_t(c["max_tag_bytes"].get_uint64().value());
    g.limits.max_value_bytes = uint64_t(c["max_value_bytes"].get_uint64().value());
    g.limits.max_call_bytes = uint64_t(c["max_call_bytes"].get_uint64().value());
    g.want.reasoning = str(c["reasoning"].value());
    g.want.content = str(c["content"].value());
    simdjson::dom::array a;
    EXPECT_FALSE(c["calls"].get_array().get(a));
    for (simdjson::dom::element call : a)
      g.want.calls.push_back({str(call["name"].value()), str(call["arguments"].value())});
    EXPECT_FALSE(c["errors"].get_array().get(a));
    for (simdjson::dom::element e : a) g.want.errors.push_back(str(e));
    out.push_back(std::move(g));
  }
  return out;
}

void expect_same(const dsml_result& got, const dsml_result& want, const std::string& what) {
  EXPECT_EQ(got.reasoning, want.reasoning) << what;
  EXPECT_EQ(got.content, want.content) << what;
  ASSERT_EQ(got.calls.size(), want.calls.size()) << what;
  for (size_t i = 0; i < got.calls.size(); ++i) {
    EXPECT_EQ(got.calls[i].name, want.calls[i].name) << what;
    EXPECT_EQ(got.calls[i].arguments_json, want.calls[i].arguments_json) << what;
  }
  EXPECT_EQ(got.errors, want.errors) << what;
}

// Feeds `text` in pieces whose sizes cycle through `sizes`; checks per-event invariants.
dsml_result parse_chunked(const std::string& text, const std::vector<size_t>& sizes, bool thinking,
                          dsml_limits limits = {}) {
  dsml_parser p(thinking, limits);
  std::vector<dsml_event> ev;
  size_t i = 0, k = 0;
  while (i < text.size()) {
    const size_t n = std::min(sizes[k++ % sizes.size()], text.size() - i);
    p.feed(std::string_view(text).substr(i, n), ev);
    i += n;
  }
  p.finish(ev);
  int open_call = -1;
  for (const auto& e : ev) {
    if (e.kind == dsml_event_kind::reasoning || e.kind == dsml_event_kind::content) {
      EXPECT_FALSE(e.text.empty());
      EXPECT_TRUE(utf8_valid(e.text));
    }
    if (e.kind == dsml_event_kind::call_begin) open_call = e.call_index;
    if (e.kind == dsml_event_kind::parameter || e.kind == dsml_event_kind::call_end) {
      EXPECT_EQ(e.call_index, open_call);
    }
  }
  dsml_result r;
  dsml_collect(ev, r);
  return r;
}

TEST(Dsml, GoldensOneShot) {
  const auto gs = load_goldens();
  ASSERT_GE(gs.size(), 30u);
  for (const auto& g : gs)
    expect_same(parse_chunked(g.text, {g.text.size() + 1}, g.thinking, g.limits), g.want, g.name);
  EXPECT_EQ(dsml_parse(gs[3].text).calls.size(), gs[3].want.calls.size());
}

TEST(Dsml, GoldensUnderEveryChunking) {
  for (const auto& g : load_goldens()) {
    for (size_t size = 1; size <= g.text.size(); ++size)
      expect_same(parse_chunked(g.text, {size}, g.thinking, g.limits), g.want,
                  g.name + " chunk " + std::to_string(size));
    for (size_t cut = 1; cut < g.text.size(); ++cut)
      expect_same(parse_chunked(g.text, {cut, g.text.size()}, g.thinking, g.limits), g.want,
                  g.name + " split at " + std::to_string(cut));
    std::mt19937 rng(static_cast<uint32_t>(g.text.size()));
    for (int r = 0; r < 20; ++r) {
      std::vector<size_t> sizes;
      for (int k = 0; k < 7; ++k) sizes.push_back(1 + rng() % 9);
      expect_same(parse_chunked(g.text, sizes, g.thinking, g.limits), g.want, g.name + " random");
    }
  }
}

TEST(Dsml, EventsOfAWellFormedCall) {
  const std::string text =
      "why</think>ok\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n"
      "<｜DSML｜ parameter name=\"s\" string=\"true\">a \"q\"</｜DSML｜ parameter>\n"
      "<｜DSML｜ parameter name=\"n\" string=\"false\">{\"k\": [1, 2]}</｜DSML｜ parameter>\n"
      "</｜DSML｜ invoke>\n</｜DSML｜ calls><｜end▁of▁sentence｜>";
  dsml_parser p(true);
  std::vector<dsml_event> ev;
  for (char c : text) p.feed(std::string_view(&c, 1), ev);
  p.finish(ev);
  std::vector<dsml_event_kind> kinds;
  for (const auto& e : ev)
    if (kinds.empty() || kinds.back() != e.kind) kinds.push_back(e.kind);
  const std::vector<dsml_event_kind> want = {dsml_event_kind::reasoning, dsml_event_kind::content,
                                             dsml_event_kind::call_begin, dsml_event_kind::parameter,
                                             dsml_event_kind::call_end};
  EXPECT_EQ(kinds, want);
  const dsml_event* s = nullptr;
  const dsml_event* end = nullptr;
  for (const auto& e : ev) {
    if (e.kind == dsml_event_kind::parameter && e.name == "s") s = &e;
    if (e.kind == dsml_event_kind::call_end) end = &e;
  }
  ASSERT_TRUE(s && end);
  EXPECT_TRUE(s->is_string);
  EXPECT_EQ(s->value, "\"a \\\"q\\\"\"");
  EXPECT_EQ(end->name, "f");
  EXPECT_EQ(end->value, "{\"s\": \"a \\\"q\\\"\", \"n\": {\"k\": [1, 2]}}");
}

TEST(Dsml, MemoryStaysBoundedOnEndlessGarbage) {
  dsml_limits lim{64, 256, 1024};
  dsml_parser p(false, lim);
  std::vector<dsml_event> ev;
  p.feed("\n\n<｜DSML｜ calls>\nnot a tag ", ev);
  for (int i = 0; i < 20000; ++i) {
    p.feed("garbage <｜DSML garbage ", ev);
    ASSERT_LT(p.buffered_bytes(), 64u);
    ev.clear();
  }
  p.feed("<｜DSML｜ invoke name=\"f\">\n<｜DSML｜ parameter name=\"a\" string=\"true\">", ev);
  bool too_long = false;
  for (int i = 0; i < 1000; ++i) {
    p.feed(std::string(50, 'v'), ev);
    ASSERT_LE(p.buffered_bytes(), 256u + 64u);
  }
  for (const auto& e : ev) too_long = too_long || e.text.find("longer than 256 bytes") != std::string::npos;
  EXPECT_TRUE(too_long);
  // Endless parameters of one call are cut at the call limit.
  dsml_parser c(false, lim);
  c.feed("<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n", ev);
  for (int i = 0; i < 5000; ++i) {
    c.feed(
        "<｜DSML｜ parameter name=\"k" + std::to_string(i) + "\" string=\"false\">1</｜DSML｜ parameter>\n",
        ev);
    ASSERT_LE(c.buffered_bytes(), 64u + 1024u + 64u);
  }
  // An endless attribute list is cut at the tag limit.
  dsml_parser q(false, lim);
  q.feed("<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"", ev);
  for (int i = 0; i < 1000; ++i) {
    q.feed("xxxxxxxx", ev);
    ASSERT_LE(q.buffered_bytes(), 64u + 8u);
  }
}

TEST(Dsml, InvalidUtf8BecomesReplacement) {
  dsml_parser p;
  std::vector<dsml_event> ev;
  p.feed("a\xFF\xE4\xB8", ev);
  p.feed(
      "\xAD"
      "b",
      ev);
  p.finish(ev);
  dsml_result r;
  dsml_collect(ev, r);
  EXPECT_EQ(r.content,
            "a\xEF\xBF\xBD\xE4\xB8\xAD"
            "b");
  EXPECT_TRUE(r.errors.empty());
}

// Random soup of markup fragments: never crashes, and every chunking agrees with one-shot.
TEST(Dsml, RandomFragmentsAreChunkingInvariant) {
  const std::vector<std::string> frags = {"\n\n<｜DSML｜ calls>",
                                          "<｜DSML｜ calls>",
                                          "</｜DSML｜ calls>",
                                          "<｜DSML｜ invoke",
                                          " name=\"f\"",
                                          ">",
                                          "\n",
                                          "<｜DSML｜ parameter",
                                          " string=\"true\"",
                                          " string=\"false\"",
                                          "</｜DSML｜ parameter>",
                                          "</｜DSML｜ invoke>",
                                          "<｜end▁of▁sentence｜>",
                                          "</think>",
                                          "text",
                                          "{\"a\": 1}",
                                          "[1,",
                                          "\"",
                                          " ",
                                          "é",
                                          "\xF0\x9F\x98\x80",
                                          "\xC3",
                                          "<｜DSML",
                                          "｜DSML｜",
                                          " name=\"g\"",
                                          " bad=\"1\"",
                                          "<",
                                          "/"};
  std::mt19937 rng(42);
  for (int iter = 0; iter < 400; ++iter) {
    std::string text;
    const int n = 1 + rng() % 30;
    for (int k = 0; k < n; ++k) text += frags[rng() % frags.size()];
    const bool thinking = rng() % 2;
    const dsml_limits lim{16 + rng() % 64, 8 + rng() % 64, 8 + rng() % 64};
    const dsml_result one = parse_chunked(text, {text.size() + 1}, thinking, lim);
    for (size_t size : {size_t(1), size_t(2), size_t(3), size_t(5), size_t(11)})
      expect_same(parse_chunked(text, {size}, thinking, lim), one, "soup " + std::to_string(iter));
  }
}

}  // namespace
}  // namespace cedar::model
