// Tests of model/npy: the fixture's NumPy-written files, save/load round trips for every
// supported dtype, and malformed files (each an error naming the file, never a crash).
#include "model/npy.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

using namespace cedar::model;

namespace {

const std::string k_fixture = std::string(CEDAR_SOURCE_DIR) + "/tests/fixtures/deepseek-v41-tiny-A/";

std::string temp_path(const std::string& name) {
  // This process's scratch directory, removed when the test binary exits.
  static const struct root {
    std::filesystem::path path = std::filesystem::temp_directory_path() /
                                 ("cedar_npy_test_" + std::to_string(::getpid()));
    ~root() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  } r;
  const auto& dir = r.path;
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// A v1 .npy image with the given header text (padded as NumPy does) and data bytes.
std::vector<uint8_t> make_npy(const std::string& dict, const std::vector<uint8_t>& data, int major = 1) {
  std::string header = dict;
  const size_t pre = major == 1 ? 10 : 12;
  while ((pre + header.size() + 1) % 64) header.push_back(' ');
  header.push_back('\n');
  std::vector<uint8_t> out = {0x93, 'N', 'U', 'M', 'P', 'Y', static_cast<uint8_t>(major), 0};
  out.push_back(header.size() & 0xFF);
  out.push_back((header.size() >> 8) & 0xFF);
  if (major != 1) {
    out.push_back(0);
    out.push_back(0);
  }
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

}  // namespace

TEST(npy, loads_the_fixture_input_ids) {
  auto r = npy_load(k_fixture + "input_ids.npy");
  ASSERT_TRUE(r.ok()) << r.err().message;
  EXPECT_EQ(r->dtype, "i64");
  ASSERT_EQ(r->shape, (std::vector<int64_t>{201}));
  // Token ids of the tiny model's 512-entry vocabulary, and not all the same.
  const int64_t* ids = r->as<int64_t>();
  bool varied = false;
  for (int i = 0; i < 201; ++i) {
    EXPECT_GE(ids[i], 0);
    EXPECT_LT(ids[i], 512);
    varied = varied || ids[i] != ids[0];
    EXPECT_EQ(r->at_i64(i), ids[i]);
  }
  EXPECT_TRUE(varied);
  // The file is exactly preamble + header + 201 * 8 bytes, so the reader consumed all of it.
  EXPECT_EQ(r->bytes.size(), 201u * 8);
}

TEST(npy, loads_the_fixture_logits) {
  auto r = npy_load(k_fixture + "quant/prefill_logits.npy");
  ASSERT_TRUE(r.ok()) << r.err().message;
  EXPECT_EQ(r->dtype, "f32");
  ASSERT_EQ(r->shape, (std::vector<int64_t>{201, 512}));
  const float* v = r->as<float>();
  double max_abs = 0;
  for (int64_t i = 0; i < r->numel(); ++i) {
    ASSERT_TRUE(std::isfinite(v[i])) << i;
    max_abs = std::max(max_abs, static_cast<double>(std::fabs(v[i])));
  }
  EXPECT_GT(max_abs, 0.0);
  // The last 512*4 bytes of the file are the last row: the data offset is right.
  const auto raw = read_all(k_fixture + "quant/prefill_logits.npy");
  EXPECT_EQ(std::memcmp(raw.data() + raw.size() - 512 * 4, v + 200 * 512, 512 * 4), 0);
}

TEST(npy, save_load_round_trip_every_dtype) {
  std::mt19937 rng(7);
  std::vector<float> f(3 * 5 * 7);
  for (auto& x : f) x = std::uniform_real_distribution<float>(-10, 10)(rng);
  std::vector<int64_t> i64 = {-5, 0, 1LL << 40, 7};
  std::vector<int32_t> i32 = {-1, 2, 3, 2147483647, -2147483647 - 1, 0};

  const auto pf = temp_path("f.npy");
  ASSERT_TRUE(npy_save(pf, npy_from_f32({3, 5, 7}, f.data())).ok());
  auto lf = npy_load(pf);
  ASSERT_TRUE(lf.ok()) << lf.err().message;
  EXPECT_EQ(lf->shape, (std::vector<int64_t>{3, 5, 7}));
  EXPECT_EQ(std::memcmp(lf->as<float>(), f.data(), f.size() * 4), 0);
  // NumPy pads preamble + header to 64 bytes; so do we.
  EXPECT_EQ((read_all(pf).size() - f.size() * 4) % 64, 0u);

  const auto pi = temp_path("i64.npy");
  ASSERT_TRUE(npy_save(pi, npy_from_i64({4}, i64.data())).ok());
  auto li = npy_load(pi);
  ASSERT_TRUE(li.ok());
  EXPECT_EQ(li->shape, (std::vector<int64_t>{4}));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(li->as<int64_t>()[i], i64[i]);

  const auto p32 = temp_path("i32.npy");
  ASSERT_TRUE(npy_save(p32, npy_from_i32({2, 3}, i32.data())).ok());
  auto l32 = npy_load(p32);
  ASSERT_TRUE(l32.ok());
  for (int i = 0; i < 6; ++i) EXPECT_EQ(l32->as<int32_t>()[i], i32[i]);

  for (const char* dt : {"f64", "u8", "bool"}) {
    npy_array a;
    a.dtype = dt;
    a.shape = {2, 2};
    a.bytes.resize(4 * a.elem_size());
    for (size_t i = 0; i < a.bytes.size(); ++i) a.bytes[i] = static_cast<uint8_t>(std::string(dt) == "bool" ? i % 2 : i * 37 + 1);
    const auto p = temp_path(std::string(dt) + ".npy");
    ASSERT_TRUE(npy_save(p, a).ok()) << dt;
    auto l = npy_load(p);
    ASSERT_TRUE(l.ok()) << dt << ": " << l.err().message;
    EXPECT_EQ(l->dtype, dt);
    EXPECT_EQ(l->bytes, a.bytes) << dt;
  }

  // A 0-d array and an empty array.
  float scalar = 3.5f;
  const auto ps = temp_path("scalar.npy");
  ASSERT_TRUE(npy_save(ps, npy_from_f32({}, &scalar)).ok());
  auto ls = npy_load(ps);
  ASSERT_TRUE(ls.ok());
  EXPECT_TRUE(ls->shape.empty());
  EXPECT_EQ(ls->at_f64(0), 3.5);
  const auto pe = temp_path("empty.npy");
  ASSERT_TRUE(npy_save(pe, npy_from_f32({0, 4}, nullptr)).ok());
  auto le = npy_load(pe);
  ASSERT_TRUE(le.ok());
  EXPECT_EQ(le->shape, (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(le->numel(), 0);
}

TEST(npy, accepts_version_2_and_python_spellings) {
  const std::vector<uint8_t> data = {1, 0, 0, 0, 2, 0, 0, 0};
  auto v2 = npy_parse(make_npy("{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }", data, 2).data(),
                      make_npy("{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }", data, 2).size(), "v2");
  ASSERT_TRUE(v2.ok()) << v2.err().message;
  EXPECT_EQ(v2->as<int32_t>()[1], 2);
  // Keys in another order, double quotes, no trailing comma.
  const auto img = make_npy("{\"shape\": (1, 2), \"fortran_order\": False, \"descr\": \"<i4\"}", data);
  auto r = npy_parse(img.data(), img.size(), "reordered");
  ASSERT_TRUE(r.ok()) << r.err().message;
  EXPECT_EQ(r->shape, (std::vector<int64_t>{1, 2}));
}

TEST(npy, malformed_files_are_errors_naming_the_problem) {
  const std::vector<uint8_t> four_f32(16, 0x3F);
  struct bad_case {
    std::vector<uint8_t> bytes;
    const char* expect;  // a substring of the error
  };
  std::vector<bad_case> cases = {
      {{'N', 'O', 'T', 'N', 'P', 'Y', 1, 0, 0, 0}, "magic"},
      {make_npy("{'descr': '>f4', 'fortran_order': False, 'shape': (4,), }", four_f32), "unsupported dtype"},
      {make_npy("{'descr': '<c8', 'fortran_order': False, 'shape': (2,), }", four_f32), "unsupported dtype"},
      {make_npy("{'descr': '<f4', 'fortran_order': True, 'shape': (4,), }", four_f32), "Fortran"},
      {make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }", four_f32), "need"},
      {make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", four_f32), "need"},
      {make_npy("{'descr': '<f4', 'shape': (4,), }", four_f32), "fortran_order"},
      {make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (-4,), }", four_f32), "shape"},
      {make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (4,), 'x': 1}", four_f32), "unexpected key"},
      {make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (4,)", four_f32), "expected"},
      {make_npy("['descr', '<f4']", four_f32), "{"},
      {make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999, 99999999999, 99999999999), }", four_f32), "overflow"},
      {make_npy("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", four_f32), "duplicate"},
  };
  // Header length larger than the file.
  auto truncated = make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", four_f32);
  truncated.resize(40);
  cases.push_back({truncated, "header length"});
  auto version = make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", four_f32);
  version[6] = 9;
  cases.push_back({version, "version"});
  for (size_t i = 0; i < cases.size(); ++i) {
    auto r = npy_parse(cases[i].bytes.data(), cases[i].bytes.size(), "case" + std::to_string(i) + ".npy");
    ASSERT_FALSE(r.ok()) << "case " << i;
    EXPECT_NE(r.err().message.find("case" + std::to_string(i) + ".npy"), std::string::npos) << r.err().message;
    EXPECT_NE(r.err().message.find(cases[i].expect), std::string::npos)
        << "case " << i << ": " << r.err().message;
  }
  // Every truncation of a valid file is an error, never a crash.
  const auto good = make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", four_f32);
  ASSERT_TRUE(npy_parse(good.data(), good.size(), "good").ok());
  for (size_t n = 0; n < good.size(); ++n) {
    std::vector<uint8_t> cut(good.begin(), good.begin() + n);
    EXPECT_FALSE(npy_parse(cut.data(), cut.size(), "cut").ok()) << n;
  }
  auto missing = npy_load(temp_path("does_not_exist.npy"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.err().code, cedar::errc::not_found);
}
