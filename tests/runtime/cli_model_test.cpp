// `cedar model info`: runs the real binary and checks its output and exit codes.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "runtime_test_util.hpp"

namespace {
using cedar::test::run_result;
using cedar::test::src;
run_result run(const std::string& args) {
  return cedar::test::run_command(std::string(CEDAR_BINARY_DIR) + "/bin/cedar " + args);
}
}  // namespace

TEST(CliModelInfo, OfficialConfigPrints890) {
  run_result r = run("model info " + src("config/deepseek-v41-flash.json"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("\npersistent_bytes_per_token: 890\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\nlayer_map: SSFRRRRRFRRRRRFRRRRR|FRRRIRRRIRRRIRRRIRRR|DDD\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\nswa_bytes_per_sequence: 2906112\n"), std::string::npos);
  EXPECT_NE(r.out.find("\nbf16_equivalent_bytes_per_token: 40960\n"), std::string::npos);
  EXPECT_NE(r.out.find("\nparams_backbone: "), std::string::npos);
  EXPECT_NE(r.out.find("(551.6B)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(196.9B)"), std::string::npos) << r.out;
}

TEST(CliModelInfo, JsonOutput) {
  run_result r = run("model info --json " + src("config/deepseek-v41-flash.json"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("\"persistent_bytes_per_token\": 890"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"layers_decoder_reindex\": \"24,28,32,36\""), std::string::npos) << r.out;
}

TEST(CliModelInfo, BadConfigIsOneLineNamingTheField) {
  std::string path = testing::TempDir() + "cedar_bad_config.json";
  std::ofstream(path) << R"({"text_config": {"hidden_size": 5120, "index_topk": "many"}})";
  run_result r = run("model info " + path);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("field 'index_topk'"), std::string::npos) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  r = run("model info /nonexistent.json");
  EXPECT_EQ(r.code, 2);
  r = run("model info");
  EXPECT_EQ(r.code, 2);
}

TEST(CliModelInfo, HelpExitsZero) {
  run_result r = run("--help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("model"), std::string::npos);
  r = run("model info --help");
  EXPECT_EQ(r.code, 0);
}

// `cedar generate` on the HF fixture reproduces its greedy ids (manifest.runs.quant.greedy_ids).
TEST(CliGenerate, FixtureGreedyIds) {
  std::string fx = src("tests/fixtures/deepseek-v41-tiny-A");
  run_result r = run("generate --model " + fx + " --tokens " + fx + "/input_ids.npy --max-tokens 9 --mode full");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("223 303 206 489 217 47 282 374 121 "), std::string::npos) << r.out;
  r = run("generate --model " + fx + " --tokens " + fx + "/input_ids.npy --max-tokens 2 --json --print-logits 2");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("{\"step\":0,\"token\":223,\"top\":[[223,"), std::string::npos) << r.out;
}

TEST(CliGenerate, BadInputsAreClearErrors) {
  std::string fx = src("tests/fixtures/deepseek-v41-tiny-A");
  run_result r = run("generate --model " + fx + " --tokens /nonexistent.npy");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("/nonexistent.npy"), std::string::npos) << r.out;
  r = run("generate --model " + fx + " --prompt hi");  // the fixture has no tokenizer.json
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("tokenizer.json"), std::string::npos) << r.out;
  r = run("generate --model /nonexistent-model --tokens " + fx + "/input_ids.npy");
  EXPECT_EQ(r.code, 2);
  r = run("generate --model " + fx + " --tokens " + fx + "/input_ids.npy --mode fast");
  EXPECT_EQ(r.code, 2);
}

// `cedar eval`'s limits out of range are refused before anything loads (exit 2, the option named).
TEST(CliEval, LimitsOutOfRangeAreClearErrors) {
  const std::string tasks = src("tests/eval/ci.jsonl");
  for (const char* opt : {"--max-repeated-failures -1", "--max-rounds -2", "--max-new-tokens 0"}) {
    run_result r = run("eval " + tasks + " " + opt);
    EXPECT_EQ(r.code, 2) << opt;
    const std::string name = std::string(opt).substr(0, std::string(opt).find(' '));
    EXPECT_NE(r.out.find(name), std::string::npos) << r.out;
  }
}
