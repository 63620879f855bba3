// Shared set-up for runtime tests: the test tokenizer (tests/tokenizer/tokenizer.json, trained by
// model/reference/train_tokenizer.py) and a small random-weight model of the V4.1 architecture
// whose vocabulary matches it (the fixture's tiny config with every layer mode); temporary
// directories; and run_command, for tests that run the real `cedar` binary or an example.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "model/config.hpp"
#include "model/engine.hpp"
#include "model/tokenizer.hpp"

namespace cedar::test {

inline std::string src(const std::string& rel) { return std::string(CEDAR_SOURCE_DIR) + "/" + rel; }

inline std::shared_ptr<const model::tokenizer> test_tokenizer() {
  static std::shared_ptr<const model::tokenizer> tok = [] {
    auto t = model::tokenizer::load(src("tests/tokenizer/tokenizer.json"));
    EXPECT_TRUE(t.ok()) << (t.ok() ? "" : t.err().message);
    return std::make_shared<const model::tokenizer>(std::move(*t));
  }();
  return tok;
}

inline std::shared_ptr<const model::engine> random_engine(uint64_t seed = 7) {
  auto cfg = model::load_model_config(src("config/deepseek-v41-tiny-a.json"));
  EXPECT_TRUE(cfg.ok());
  cfg->vocab_size = test_tokenizer()->vocab_size();
  EXPECT_TRUE(model::finalize(*cfg).ok());
  auto e = model::engine::random(*cfg, seed);
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.err().message);
  return std::make_shared<const model::engine>(std::move(*e));
}

struct temp_dir {
  std::filesystem::path path;
  temp_dir() {
    path = std::filesystem::temp_directory_path() /
           ("cedar_rt_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++));
    std::filesystem::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  static int& counter() {
    static int c = 0;
    return c;
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

// A shell command's exit code (-1 when it did not exit normally) and its stdout + stderr.
struct run_result {
  int code = -1;
  std::string out;
};
inline run_result run_command(const std::string& cmd) {
  run_result r;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int st = pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

}  // namespace cedar::test
