// Tests of model::tokenizer against the goldens of cedar_ref/bpe.py (tests/tokenizer/, made by
// tests/tokenizer/make_goldens.py): identical pre-tokenizer pieces and ids on varied and random
// text, lossless decode, streaming decode, special ids, malformed tokenizer.json, and a
// long-input speed print (no time assertion).
#include "model/tokenizer.hpp"

#include <gtest/gtest.h>
#include <simdjson.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace cedar::model {
namespace {

const std::string k_dir = std::string(CEDAR_SOURCE_DIR) + "/tests/tokenizer/";

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

const tokenizer& golden_tokenizer() {
  static const tokenizer tok = [] {
    auto r = tokenizer::load(k_dir + "tokenizer.json");
    if (!r) {
      ADD_FAILURE() << r.err().message;
      std::abort();
    }
    return std::move(r).value();
  }();
  return tok;
}

struct encode_case {
  std::string text;
  bool allow_special;
  std::vector<std::string> pieces;
  std::vector<int32_t> ids;
};

std::vector<encode_case> load_encode_cases() {
  static simdjson::dom::parser parser;
  simdjson::dom::element root;
  const std::string json = read_file(k_dir + "encode_golden.json");
  EXPECT_FALSE(parser.parse(json).get(root));
  std::string_view fmt;
  EXPECT_FALSE(root["format"].get_string().get(fmt));
  EXPECT_EQ(fmt, "cedar-encode-golden-v1");
  std::vector<encode_case> out;
  simdjson::dom::array cases;
  EXPECT_FALSE(root["cases"].get_array().get(cases));
  for (simdjson::dom::element c : cases) {
    encode_case ec;
    std::string_view s;
    EXPECT_FALSE(c["text"].get_string().get(s));
    ec.text = std::string(s);
    bool b = false;
    EXPECT_FALSE(c["allow_special"].get_bool().get(b));
    ec.allow_special = b;
    simdjson::dom::array a;
    EXPECT_FALSE(c["pieces"].get_array().get(a));
    for (simdjson::dom::element p : a) ec.pieces.emplace_back(std::string_view(p.get_string().value()));
    EXPECT_FALSE(c["ids"].get_array().get(a));
    for (simdjson::dom::element p : a) ec.ids.push_back(static_cast<int32_t>(int64_t(p.get_int64().value())));
    out.push_back(std::move(ec));
  }
  return out;
}

TEST(Tokenizer, LoadsGoldenWithFixedSpecialIds) {
  const tokenizer& tok = golden_tokenizer();
  EXPECT_EQ(tok.n_merges(), 2000u);
  EXPECT_EQ(tok.bos_id(), 0);
  EXPECT_EQ(tok.eos_id(), 1);
  EXPECT_EQ(tok.pad_id(), 2);
  const std::pair<std::string_view, int32_t> table[] = {{tokens::system, 3},    {tokens::user, 4},
                                                        {tokens::assistant, 5}, {tokens::think_start, 6},
                                                        {tokens::think_end, 7}, {tokens::latest_reminder, 8},
                                                        {tokens::dsml, 9},      {tokens::image, 10}};
  for (auto [content, id] : table) {
    EXPECT_EQ(tok.token_to_id(content), id) << content;
    ASSERT_NE(tok.id_to_token(id), nullptr);
    EXPECT_EQ(*tok.id_to_token(id), content);
  }
  EXPECT_TRUE(tok.is_special(tok.bos_id()));
  EXPECT_FALSE(tok.is_special(tok.token_to_id(tokens::dsml)));  // content-like: survives skip_special
  EXPECT_TRUE(tok.is_added(tok.token_to_id(tokens::dsml)));
  EXPECT_EQ(tok.vocab_size(), 17 + 256 + 2000);
  EXPECT_EQ(tok.id_to_token(tok.vocab_size()), nullptr);
}

TEST(Tokenizer, MatchesPythonGoldens) {
  const tokenizer& tok = golden_tokenizer();
  const auto cases = load_encode_cases();
  ASSERT_GT(cases.size(), 300u);
  size_t n_ids = 0;
  for (const auto& c : cases) {
    auto pieces = tok.pretokenize(c.text);
    ASSERT_TRUE(pieces.ok()) << pieces.err().message;
    EXPECT_EQ(*pieces, c.pieces) << "text: " << c.text;
    auto ids = tok.encode(c.text, c.allow_special);
    ASSERT_TRUE(ids.ok()) << ids.err().message;
    EXPECT_EQ(*ids, c.ids) << "text: " << c.text;
    auto back = tok.decode(*ids);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, c.text);
    n_ids += ids->size();
  }
  EXPECT_GT(n_ids, 1000u);
}

TEST(Tokenizer, SkipSpecialAndAllowSpecial) {
  const tokenizer& tok = golden_tokenizer();
  const std::string text = std::string(tokens::user) + "hi" + std::string(tokens::think_start);
  auto with = tok.encode(text, true);
  auto without = tok.encode(text, false);
  ASSERT_TRUE(with.ok() && without.ok());
  EXPECT_EQ(with->front(), tok.token_to_id(tokens::user));
  for (int32_t id : *without) EXPECT_NE(id, tok.token_to_id(tokens::user));
  EXPECT_EQ(without->back(), tok.token_to_id(tokens::think_start));  // special=false: always
  EXPECT_EQ(*tok.decode(*without), text);
  EXPECT_EQ(*tok.decode(*with, /*skip_special=*/true), "hi<think>");
}

TEST(Tokenizer, StreamingDecodeHoldsBackPartialCharacters) {
  const tokenizer& tok = golden_tokenizer();
  const std::string text = "emoji 😀👍🏽 中文 é and \xF0\x9F\x87\xAB\xF0\x9F\x87\xB7 flags";
  auto ids = tok.encode(text);
  ASSERT_TRUE(ids.ok());
  // Byte-level: an emoji the merges never saw is several ids, each one byte of it.
  stream_decoder dec(tok);
  std::string all;
  size_t partial_pushes = 0;
  for (int32_t id : *ids) {
    auto piece = dec.push(id);
    ASSERT_TRUE(piece.ok());
    EXPECT_TRUE(utf8_valid(*piece));
    if (piece->empty()) ++partial_pushes;
    all += *piece;
  }
  all += dec.finish();
  EXPECT_EQ(all, text);
  EXPECT_GT(partial_pushes, 0u);
  // A cut-off character is replaced by U+FFFD at the end, as Python's errors="replace".
  auto parrot = tok.encode("x\xF0\x9F\xA6\x9C");  // U+1F99C is not in the corpus: several byte ids
  ASSERT_TRUE(parrot.ok());
  ASSERT_GE(parrot->size(), 3u);
  std::vector<int32_t> cut(parrot->begin(), parrot->end() - 1);
  auto t = tok.decode_text(cut);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t, "x\xEF\xBF\xBD");
  auto bad = tok.decode(std::vector<int32_t>{5, 999999});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.err().message.find("999999"), std::string::npos);
}

TEST(Tokenizer, Utf8SanitizeMaximalSubparts) {
  std::string out;
  // E0 80: E0 needs A0..BF, so E0 alone is one bad subpart and 80 another.
  EXPECT_EQ(utf8_sanitize("a\xE0\x80"
                          "b\xF0\x9F\x98",
                          true, out),
            7u);
  EXPECT_EQ(out,
            "a\xEF\xBF\xBD\xEF\xBF\xBD"
            "b\xEF\xBF\xBD");
  out.clear();
  EXPECT_EQ(utf8_sanitize("ab\xF0\x9F\x98", false, out), 2u);  // incomplete tail held back
  EXPECT_EQ(out, "ab");
  EXPECT_FALSE(utf8_valid("\xED\xA0\x80"));  // a UTF-16 surrogate
  EXPECT_TRUE(utf8_valid("\xF4\x8F\xBF\xBD"));
}

TEST(Tokenizer, RejectsInvalidUtf8Input) {
  auto r = golden_tokenizer().encode("ok \xC3\x28 bad");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.err().message.find("UTF-8"), std::string::npos);
}

// Each malformed variant of the golden file must fail with an error naming the field.
TEST(Tokenizer, MalformedJsonNamesTheField) {
  const std::string good = read_file(k_dir + "tokenizer.json");
  auto with = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    const size_t p = s.find(from);
    EXPECT_NE(p, std::string::npos) << from;
    if (p != std::string::npos) s.replace(p, from.size(), to);
    return s;
  };
  struct bad_case {
    std::string json;
    std::string needle;
  };
  const bad_case cases[] = {
      {"{", "not valid JSON"},
      {"[1, 2]", "top level"},
      {"{\"pre_tokenizer\": {}}", "'model'"},
      {with("\"type\": \"BPE\"", "\"type\": \"Unigram\""), "model.type"},
      {with("\"merges\": [", "\"merges\": [\"a\", "), "model.merges[0]"},
      {with("\"merges\": [", "\"merges\": [\"zzzq qqqz\", "), "model.merges[0]"},
      {with("\"Ā\": 17", "\"Ā-gone\": 17"), "byte 0x00"},
      {with("\"behavior\": \"Isolated\"", "\"behavior\": \"Removed\""), "pretokenizers[0].behavior"},
      {with("\"Regex\": \"\\\\p{N}{1,3}\"", "\"Regex\": \"(\""), "pretokenizers[0].pattern.Regex"},
      {with("\"use_regex\": false", "\"use_regex\": true"), "use_regex"},
      {with("\"id\": 5,", "\"id\": -5,"), "added_tokens[5].id"},
      {with("\"lstrip\": false", "\"lstrip\": true"), "added_tokens[0].lstrip"},
      {with("\"type\": \"Sequence\"", "\"type\": \"Whitespace\""), "pre_tokenizer"},
  };
  for (const auto& c : cases) {
    auto r = tokenizer::from_json(c.json, "t.json");
    ASSERT_FALSE(r.ok()) << c.needle;
    EXPECT_NE(r.err().message.find(c.needle), std::string::npos) << r.err().message;
    EXPECT_EQ(r.err().message.rfind("t.json", 0), 0u) << r.err().message;
  }
  auto missing = tokenizer::load(k_dir + "no-such-tokenizer.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.err().code, errc::io);
}

// The Python reference (cedar_ref/bpe.py) classifies characters with unicodedata; the C++ one
// with PCRE2's UCP tables. Same ids need the same classes: check every code point.
TEST(Tokenizer, Pcre2ClassesMatchPythonsUnicodeData) {
  simdjson::dom::parser parser;
  const std::string json = read_file(k_dir + "unicode_classes.json");
  simdjson::dom::element root;
  ASSERT_FALSE(parser.parse(json).get(root));
  simdjson::dom::array classes;
  ASSERT_FALSE(root["classes"].get_array().get(classes));
  size_t n_classes = 0;
  for (simdjson::dom::element c : classes) {
    const std::string name(std::string_view(c["name"].get_string().value()));
    std::vector<bool> want(0x110000, false);
    simdjson::dom::array ranges;
    ASSERT_FALSE(c["ranges"].get_array().get(ranges));
    for (simdjson::dom::element r : ranges) {
      const int64_t a = r.at(0).get_int64().value(), b = r.at(1).get_int64().value();
      for (int64_t cp = a; cp <= b; ++cp) want[cp] = true;
    }
    const std::string pattern = name == "s" ? "^\\s$" : "^\\p{" + name + "}$";
    int errnum;
    PCRE2_SIZE erroff;
    pcre2_code* re = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP, &errnum, &erroff, nullptr);
    ASSERT_NE(re, nullptr);
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(re, nullptr);
    size_t mismatches = 0;
    for (uint32_t cp = 0; cp < 0x110000; ++cp) {
      if (cp >= 0xD800 && cp < 0xE000) continue;
      unsigned char u[4];
      size_t n;
      if (cp < 0x80) {
        u[0] = cp, n = 1;
      } else if (cp < 0x800) {
        u[0] = 0xC0 | (cp >> 6), u[1] = 0x80 | (cp & 0x3F), n = 2;
      } else if (cp < 0x10000) {
        u[0] = 0xE0 | (cp >> 12), u[1] = 0x80 | ((cp >> 6) & 0x3F), u[2] = 0x80 | (cp & 0x3F), n = 3;
      } else {
        u[0] = 0xF0 | (cp >> 18), u[1] = 0x80 | ((cp >> 12) & 0x3F), u[2] = 0x80 | ((cp >> 6) & 0x3F),
        u[3] = 0x80 | (cp & 0x3F), n = 4;
      }
      const bool got = pcre2_match(re, u, n, 0, 0, md, nullptr) >= 0;
      if (got != want[cp] && ++mismatches <= 5)
        ADD_FAILURE() << "class " << name << " differs at U+" << std::hex << cp;
    }
    EXPECT_EQ(mismatches, 0u) << "class " << name;
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    ++n_classes;
  }
  EXPECT_EQ(n_classes, 6u);
}

// Speed sanity on long inputs; prints throughput, asserts only correctness.
TEST(Tokenizer, LongInputs) {
  const tokenizer& tok = golden_tokenizer();
  std::string corpus = read_file(k_dir + "corpus.txt");
  std::string big;
  while (big.size() < (2u << 20)) big += corpus;
  auto t0 = std::chrono::steady_clock::now();
  auto ids = tok.encode(big);
  auto t1 = std::chrono::steady_clock::now();
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*tok.decode(*ids), big);
  const double s = std::chrono::duration<double>(t1 - t0).count();
  std::printf("[ speed    ] encode %.1f MiB of prose: %.3f s, %.1f MiB/s, %zu ids\n", big.size() / 1048576.0,
              s, big.size() / 1048576.0 / s, ids->size());
  // One enormous pre-token (a letter run): the merge queue must stay O(n log n).
  std::string run;
  while (run.size() < 200000) run += "the";
  t0 = std::chrono::steady_clock::now();
  auto run_ids = tok.encode(run);
  t1 = std::chrono::steady_clock::now();
  ASSERT_TRUE(run_ids.ok());
  EXPECT_EQ(*tok.decode(*run_ids), run);
  EXPECT_LT(run_ids->size(), run.size() / 2);
  std::printf("[ speed    ] encode one %zu-byte word: %.3f s, %zu ids\n", run.size(),
              std::chrono::duration<double>(t1 - t0).count(), run_ids->size());
}

}  // namespace
}  // namespace cedar::model
