// Tests of model/safetensors: the fixture checkpoint (cross-checked against an independent
// JSON parse of its header), dtype conversions including block-scaled FP8 and packed FP4,
// write -> read round trips, sharded checkpoints, and corrupted files (truncated at every
// point, garbage headers, bad offsets), each an error and never a crash.
#include "model/safetensors.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/quant.hpp"

using namespace cedar::model;
namespace ck = cedar::kernels;
namespace fs = std::filesystem;

namespace {

const std::string k_fixture_st =
    std::string(CEDAR_SOURCE_DIR) + "/tests/fixtures/deepseek-v41-tiny-A/model.safetensors";

// This process's scratch directory, removed when the test binary exits.
const fs::path& temp_root() {
  static const struct root {
    fs::path path = fs::temp_directory_path() / ("cedar_st_test_" + std::to_string(::getpid()));
    ~root() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  } r;
  return r.path;
}

fs::path temp_dir(const std::string& name) {
  const auto dir = temp_root() / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

void write_all(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// A safetensors image from a header string and a data section.
std::vector<uint8_t> make_file(const std::string& header, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out(8);
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

}  // namespace

TEST(safetensors, opens_the_fixture_and_agrees_with_an_independent_parse) {
  auto ck_r = checkpoint::open(k_fixture_st);
  ASSERT_TRUE(ck_r.ok()) << ck_r.err().message;
  const checkpoint& c = *ck_r;

  // Independent reading of the same header with nlohmann::json.
  const auto raw = read_all(k_fixture_st);
  ASSERT_GE(raw.size(), 8u);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(raw[i]) << (8 * i);
  const auto header = nlohmann::json::parse(std::string(raw.begin() + 8, raw.begin() + 8 + n));
  size_t expected_count = 0;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    ++expected_count;
    const tensor_view* t = c.find(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(dtype_name(t->type), entry["dtype"].get<std::string>()) << name;
    EXPECT_EQ(t->shape, entry["shape"].get<std::vector<int64_t>>()) << name;
    const auto off = entry["data_offsets"].get<std::vector<uint64_t>>();
    EXPECT_EQ(t->n_bytes, off[1] - off[0]) << name;
    EXPECT_EQ(t->data, c.tensors().front().data - header[c.tensors().front().name]["data_offsets"][0].get<uint64_t>() + off[0]);
    EXPECT_EQ(std::memcmp(t->data, raw.data() + 8 + n + off[0], t->n_bytes), 0) << name;
  }
  EXPECT_EQ(c.tensors().size(), expected_count);
  EXPECT_GT(expected_count, 100u);
  EXPECT_EQ(c.metadata("format"), header["__metadata__"]["format"].get<std::string>());
  EXPECT_EQ(c.metadata("no such key"), "");

  // Names the forward pass needs, with the tiny model's shapes (README: vocab 512, hidden 128).
  auto head = c.get("head.weight", dtype::f32, {512, 128});
  ASSERT_TRUE(head.ok()) << head.err().message;
  auto emb = c.get("embed.weight", dtype::f32, {512, 128});
  ASSERT_TRUE(emb.ok());
  auto vals = to_f32(c, **emb);
  ASSERT_TRUE(vals.ok());
  ASSERT_EQ(vals->size(), 512u * 128);
  EXPECT_EQ(std::memcmp(vals->data(), (*emb)->data, vals->size() * 4), 0);

  // get() errors name the tensor, both dtypes/shapes and the file.
  auto wrong = c.get("head.weight", dtype::bf16, {512, 129});
  ASSERT_FALSE(wrong.ok());
  for (const char* part : {"head.weight", "F32 [512, 128]", "BF16 [512, 129]", "model.safetensors"})
    EXPECT_NE(wrong.err().message.find(part), std::string::npos) << wrong.err().message;
  auto absent = c.get("layers.99.attn.wq_a.weight", dtype::f32, {1});
  ASSERT_FALSE(absent.ok());
  EXPECT_EQ(absent.err().code, cedar::errc::not_found);
  EXPECT_NE(absent.err().message.find("layers.99.attn.wq_a.weight"), std::string::npos);
  EXPECT_EQ(c.find("nope"), nullptr);

  // Opening the fixture's directory finds model.safetensors.
  auto by_dir = checkpoint::open(fs::path(k_fixture_st).parent_path().string());
  ASSERT_TRUE(by_dir.ok()) << by_dir.err().message;
  EXPECT_EQ(by_dir->tensors().size(), expected_count);

  // Moving keeps the views valid.
  checkpoint moved = std::move(*ck_r);
  const tensor_view* h2 = moved.find("head.weight");
  ASSERT_NE(h2, nullptr);
  EXPECT_EQ(std::memcmp(h2->data, raw.data() + 8 + n + header["head.weight"]["data_offsets"][0].get<uint64_t>(), 16), 0);
}

TEST(safetensors, write_read_round_trip) {
  const auto dir = temp_dir("round_trip");
  std::mt19937 rng(3);
  std::vector<float> a(6 * 7), b(5), s(1);
  for (auto* v : {&a, &b, &s})
    for (auto& x : *v) x = std::normal_distribution<float>(0, 2)(rng);
  f32_tensor_list list = {{"layers.0.a.weight", {{6, 7}, a}}, {"b \"quoted\"", {{5}, b}},
                          {"scalar", {{}, s}}, {"empty", {{0, 3}, {}}}};
  const std::string path = (dir / "t.safetensors").string();
  ASSERT_TRUE(write_safetensors(path, list, {{"format", "pt"}, {"note", "line\nbreak"}}).ok());
  auto c = checkpoint::open(path);
  ASSERT_TRUE(c.ok()) << c.err().message;
  EXPECT_EQ(c->tensors().size(), 4u);
  EXPECT_EQ(c->metadata("note"), "line\nbreak");
  for (const auto& [name, sv] : list) {
    auto t = c->get(name, dtype::f32, sv.first);
    ASSERT_TRUE(t.ok()) << t.err().message;
    auto v = to_f32(*c, **t);
    ASSERT_TRUE(v.ok());
    EXPECT_EQ(*v, sv.second) << name;
  }
  // The data section starts 8-byte aligned (header padded), so views are aligned for F32.
  for (const auto& t : c->tensors()) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % 4, 0u) << t.name;
  }
  // Writer validation.
  EXPECT_FALSE(write_safetensors(path, {{"x", {{2, 2}, {1, 2, 3}}}}).ok());
  EXPECT_FALSE(write_safetensors(path, {{"x", {{1}, {1}}}, {"x", {{1}, {2}}}}).ok());
  EXPECT_FALSE(write_safetensors((dir / "no_dir" / "t.safetensors").string(), list).ok());
}

TEST(safetensors, bf16_f16_and_integer_conversions) {
  const auto dir = temp_dir("conv");
  std::vector<raw_tensor> ts;
  const std::vector<float> src = {1.0f, -2.5f, 3.14159f, 1e-3f, -65504.0f, 0.0f};
  raw_tensor bf{"bf", dtype::bf16, {2, 3}, {}};
  for (float x : src) {
    const uint16_t h = ck::f32_to_bf16(x);
    bf.bytes.push_back(h & 0xFF);
    bf.bytes.push_back(h >> 8);
  }
  ts.push_back(bf);
  // F16: 1.0 = 0x3C00, -2.0 = 0xC000, 0.5 = 0x3800, 65504 = 0x7BFF
  ts.push_back({"h", dtype::f16, {4}, {0x00, 0x3C, 0x00, 0xC0, 0x00, 0x38, 0xFF, 0x7B}});
  ts.push_back({"i32", dtype::i32, {2}, {0xFF, 0xFF, 0xFF, 0xFF, 0x07, 0, 0, 0}});
  ts.push_back({"flags", dtype::bool_, {3}, {1, 0, 1}});
  ts.push_back({"i8", dtype::i8, {2}, {0xFE, 0x05}});
  const std::string path = (dir / "c.safetensors").string();
  ASSERT_TRUE(write_safetensors_raw(path, ts).ok());
  auto c = checkpoint::open(path);
  ASSERT_TRUE(c.ok()) << c.err().message;
  auto vb = to_f32(*c, *c->find("bf"));
  ASSERT_TRUE(vb.ok());
  for (size_t i = 0; i < src.size(); ++i) {
    EXPECT_EQ((*vb)[i], ck::bf16_to_f32(ck::f32_to_bf16(src[i])));
    EXPECT_NEAR((*vb)[i], src[i], std::fabs(src[i]) / 128);  // bf16 keeps 8 significant bits
  }
  auto vh = to_f32(*c, *c->find("h"));
  ASSERT_TRUE(vh.ok());
  EXPECT_EQ(*vh, (std::vector<float>{1.0f, -2.0f, 0.5f, 65504.0f}));
  EXPECT_EQ(*to_f32(*c, *c->find("i32")), (std::vector<float>{-1.0f, 7.0f}));
  EXPECT_EQ(*to_f32(*c, *c->find("flags")), (std::vector<float>{1.0f, 0.0f, 1.0f}));
  EXPECT_EQ(*to_f32(*c, *c->find("i8")), (std::vector<float>{-2.0f, 5.0f}));
}

TEST(safetensors, fp8_block_scaled_and_fp4_packed_weights) {
  const auto dir = temp_dir("quant");
  std::mt19937 rng(11);
  // Dense FP8 weight [40, 70] with UE8M0 scales per 32x32 block: [2, 3].
  const int R = 40, C = 70;
  raw_tensor w{"layers.0.attn.wq_a.weight", dtype::f8_e4m3, {R, C}, std::vector<uint8_t>(R * C)};
  for (auto& b : w.bytes) {
    b = static_cast<uint8_t>(rng() & 0xFF);
    if ((b & 0x7F) == 0x7F) b = 0x38;  // no NaN codes
  }
  raw_tensor ws{"layers.0.attn.wq_a.scale", dtype::f8_e8m0, {2, 3}, {120, 127, 130, 125, 140, 100}};
  // Engram-style FP8 table [5, 64] with one scale per row and 32 columns: [5, 2], F32.
  raw_tensor e{"layers.1.engram.embed.weight", dtype::f8_e4m3, {5, 64}, std::vector<uint8_t>(5 * 64)};
  for (auto& b : e.bytes) b = static_cast<uint8_t>(rng() % 0x7E);
  std::vector<float> es(10);
  for (int i = 0; i < 10; ++i) es[i] = 0.25f * (i + 1);
  raw_tensor esc{"layers.1.engram.embed.scale", dtype::f32, {5, 2}, f32_bytes(es)};
  // FP4 expert [8, 64 logical] packed in I8 [8, 32], E8M0 per 32 columns: [8, 2].
  raw_tensor x{"layers.0.ffn.experts.3.w1.weight", dtype::i8, {8, 32}, std::vector<uint8_t>(8 * 32)};
  for (auto& b : x.bytes) b = static_cast<uint8_t>(rng() & 0xFF);
  raw_tensor xs{"layers.0.ffn.experts.3.w1.scale", dtype::f8_e8m0, {8, 2}, std::vector<uint8_t>(16)};
  for (int i = 0; i < 16; ++i) xs.bytes[i] = static_cast<uint8_t>(120 + i);
  // A misshapen scale.
  raw_tensor bad{"bad.weight", dtype::f8_e4m3, {40, 70}, std::vector<uint8_t>(40 * 70, 0x38)};
  raw_tensor bads{"bad.scale", dtype::f8_e8m0, {3, 3}, std::vector<uint8_t>(9, 127)};
  raw_tensor lone{"lone.weight", dtype::f8_e4m3, {2, 2}, {0x38, 0x38, 0x38, 0x38}};
  const std::string path = (dir / "q.safetensors").string();
  ASSERT_TRUE(write_safetensors_raw(path, {w, ws, e, esc, x, xs, bad, bads, lone}).ok());
  auto c = checkpoint::open(path);
  ASSERT_TRUE(c.ok()) << c.err().message;

  auto vw = to_f32(*c, *c->find(w.name));
  ASSERT_TRUE(vw.ok()) << vw.err().message;
  EXPECT_EQ(to_f32_shape(*c, *c->find(w.name)), (std::vector<int64_t>{R, C}));
  for (int r = 0; r < R; ++r)
    for (int col = 0; col < C; ++col) {
      const float scale = std::ldexp(1.0f, ws.bytes[(r / 32) * 3 + col / 32] - 127);
      ASSERT_EQ((*vw)[r * C + col], ck::e4m3_decode(w.bytes[r * C + col]) * scale) << r << "," << col;
    }
  auto ve = to_f32(*c, *c->find(e.name));
  ASSERT_TRUE(ve.ok()) << ve.err().message;
  for (int r = 0; r < 5; ++r)
    for (int col = 0; col < 64; ++col)
      ASSERT_EQ((*ve)[r * 64 + col], ck::e4m3_decode(e.bytes[r * 64 + col]) * es[r * 2 + col / 32]);

  const tensor_view* xt = c->find(x.name);
  EXPECT_EQ(to_f32_shape(*c, *xt), (std::vector<int64_t>{8, 64}));
  auto vx = to_f32(*c, *xt);
  ASSERT_TRUE(vx.ok()) << vx.err().message;
  ASSERT_EQ(vx->size(), 8u * 64);
  for (int r = 0; r < 8; ++r)
    for (int col = 0; col < 64; ++col) {
      const uint8_t byte = x.bytes[r * 32 + col / 2];
      const uint8_t code = (col % 2 == 0) ? (byte & 15) : (byte >> 4);  // even element: low nibble
      const float scale = std::ldexp(1.0f, xs.bytes[r * 2 + col / 32] - 127);
      ASSERT_EQ((*vx)[r * 64 + col], ck::e2m1_decode(code) * scale) << r << "," << col;
    }

  auto vbad = to_f32(*c, *c->find("bad.weight"));
  ASSERT_FALSE(vbad.ok());
  EXPECT_NE(vbad.err().message.find("bad.scale"), std::string::npos) << vbad.err().message;
  auto vlone = to_f32(*c, *c->find("lone.weight"));
  ASSERT_FALSE(vlone.ok());
  EXPECT_NE(vlone.err().message.find("lone.weight"), std::string::npos);
}

TEST(safetensors, sharded_checkpoint) {
  const auto dir = temp_dir("sharded");
  ASSERT_TRUE(write_safetensors((dir / "model-00001-of-00002.safetensors").string(),
                                {{"a.weight", {{2, 2}, {1, 2, 3, 4}}}, {"b.weight", {{3}, {5, 6, 7}}}},
                                {{"format", "pt"}})
                  .ok());
  ASSERT_TRUE(write_safetensors((dir / "model-00002-of-00002.safetensors").string(),
                                {{"c.weight", {{1}, {8}}}})
                  .ok());
  auto write_index = [&](const std::string& body) {
    std::ofstream((dir / "model.safetensors.index.json").string()) << body;
  };
  write_index(R"({"metadata": {"total_size": 36}, "weight_map": {
      "a.weight": "model-00001-of-00002.safetensors", "b.weight": "model-00001-of-00002.safetensors",
      "c.weight": "model-00002-of-00002.safetensors"}})");
  {
    auto c = checkpoint::open(dir.string());
    ASSERT_TRUE(c.ok()) << c.err().message;
    EXPECT_EQ(c->tensors().size(), 3u);
    EXPECT_EQ(*to_f32(*c, *c->find("c.weight")), (std::vector<float>{8}));
    EXPECT_EQ(*to_f32(*c, *c->find("b.weight")), (std::vector<float>{5, 6, 7}));
    EXPECT_NE(c->find("c.weight")->file.find("00002"), std::string::npos);
    EXPECT_EQ(c->metadata("format"), "pt");
  }
  // A shard the index names but that is missing.
  write_index(R"({"weight_map": {"a.weight": "model-00001-of-00002.safetensors",
      "c.weight": "model-00003-of-00002.safetensors"}})");
  auto missing = checkpoint::open(dir.string());
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.err().message.find("model-00003-of-00002.safetensors"), std::string::npos)
      << missing.err().message;
  // A tensor mapped to the wrong shard.
  write_index(R"({"weight_map": {"a.weight": "model-00002-of-00002.safetensors",
      "c.weight": "model-00002-of-00002.safetensors"}})");
  auto wrong = checkpoint::open(dir.string());
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.err().message.find("a.weight"), std::string::npos) << wrong.err().message;
  // A path outside the directory, and malformed JSON.
  write_index(R"({"weight_map": {"a.weight": "../x.safetensors"}})");
  EXPECT_FALSE(checkpoint::open(dir.string()).ok());
  write_index(R"({"weight_map": {"a.weight": )");
  auto broken = checkpoint::open(dir.string());
  ASSERT_FALSE(broken.ok());
  EXPECT_NE(broken.err().message.find("model.safetensors.index.json"), std::string::npos);
  // The same tensor in two shards.
  ASSERT_TRUE(write_safetensors((dir / "model-00002-of-00002.safetensors").string(),
                                {{"a.weight", {{1}, {8}}}})
                  .ok());
  write_index(R"({"weight_map": {"b.weight": "model-00001-of-00002.safetensors",
      "c.weight": "model-00002-of-00002.safetensors"}})");
  auto dup = checkpoint::open(dir.string());
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.err().message.find("a.weight"), std::string::npos) << dup.err().message;
  // A directory with neither file.
  auto empty = checkpoint::open(temp_dir("empty").string());
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.err().code, cedar::errc::not_found);
}

TEST(safetensors, bad_headers_are_errors_naming_the_field) {
  const auto dir = temp_dir("bad");
  const std::vector<uint8_t> data(64, 0x11);
  struct bad_case {
    std::string header;
    const char* expect;
  };
  const std::vector<bad_case> cases = {
      {R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)", "JSON"},
      {R"([1,2,3])", "not a JSON object"},
      {R"({"t":{"dtype":"F33","shape":[4],"data_offsets":[0,16]}})", "unknown dtype 'F33'"},
      {R"({"t":{"dtype":"F32","shape":[5],"data_offsets":[0,16]}})", "shape [5] x F32 is 20 bytes"},
      {R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[0,80]}})", "past the data section"},
      {R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[16,0]}})", "begin > end"},
      {R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})", "not aligned"},
      {R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"u":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", "overlaps"},
      {R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"t":{"dtype":"F32","shape":[4],"data_offsets":[16,32]}})", "duplicate entry 't'"},
      {R"({"t":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})", "'shape'"},
      {R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[0]}})", "'data_offsets'"},
      {R"({"t":{"dtype":"F32","data_offsets":[0,16]}})", "missing field 'shape'"},
      {R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[0,16],"extra":1}})", "unexpected field 'extra'"},
      {R"({"t":{"dtype":7,"shape":[4],"data_offsets":[0,16]}})", "'dtype'"},
      {R"({"t":[1]})", "not an object"},
      {R"({"__metadata__":{"k":1}})", "'__metadata__'"},
      {R"({"t":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,16]}})", "overflow"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string path = (dir / ("case" + std::to_string(i) + ".safetensors")).string();
    write_all(path, make_file(cases[i].header, data));
    auto c = checkpoint::open(path);
    ASSERT_FALSE(c.ok()) << "case " << i << " opened";
    EXPECT_NE(c.err().message.find(path), std::string::npos) << c.err().message;
    EXPECT_NE(c.err().message.find(cases[i].expect), std::string::npos)
        << "case " << i << ": " << c.err().message;
  }
  // Header length beyond the file, and files shorter than 8 bytes.
  auto huge = make_file(R"({})", data);
  huge[5] = 0x01;
  write_all((dir / "huge.safetensors").string(), huge);
  auto h = checkpoint::open((dir / "huge.safetensors").string());
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.err().message.find("header length"), std::string::npos) << h.err().message;
  write_all((dir / "tiny.safetensors").string(), {1, 2, 3});
  EXPECT_FALSE(checkpoint::open((dir / "tiny.safetensors").string()).ok());
  write_all((dir / "zero.safetensors").string(), {});
  EXPECT_FALSE(checkpoint::open((dir / "zero.safetensors").string()).ok());
  auto none = checkpoint::open((dir / "absent.safetensors").string());
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.err().code, cedar::errc::not_found);
}

TEST(safetensors, truncated_and_corrupted_files_never_crash) {
  const auto dir = temp_dir("corrupt");
  const std::string good_path = (dir / "good.safetensors").string();
  ASSERT_TRUE(write_safetensors(good_path, {{"a.weight", {{3, 4}, std::vector<float>(12, 1.5f)}},
                                            {"b", {{5}, {1, 2, 3, 4, 5}}}})
                  .ok());
  const auto good = read_all(good_path);
  ASSERT_TRUE(checkpoint::open(good_path).ok());
  const std::string path = (dir / "bad.safetensors").string();
  // Truncated at every byte: always an error (every tensor is needed to fill the file).
  for (size_t n = 0; n < good.size(); ++n) {
    write_all(path, std::vector<uint8_t>(good.begin(), good.begin() + n));
    auto c = checkpoint::open(path);
    EXPECT_FALSE(c.ok()) << "truncated at " << n;
  }
  // Random byte corruption of the length and header: an error, or a checkpoint whose every
  // view lies inside the file. Reading every view must be safe.
  std::mt19937 rng(99);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(good[i]) << (8 * i);
  int opened = 0;
  for (int trial = 0; trial < 200; ++trial) {
    auto bytes = good;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int f = 0; f < flips; ++f)
      bytes[rng() % (8 + n)] = static_cast<uint8_t>(rng() & 0xFF);
    write_all(path, bytes);
    auto c = checkpoint::open(path);
    if (!c.ok()) {
      EXPECT_FALSE(c.err().message.empty());
      continue;
    }
    ++opened;
    for (const auto& t : c->tensors()) {
      // Touch every byte of the view: a view outside the mapping would fault here.
      volatile uint64_t sum = 0;
      for (size_t i = 0; i < t.n_bytes; ++i) sum = sum + t.data[i];
      auto v = to_f32(*c, t);
      if (v.ok()) {
        EXPECT_EQ(static_cast<int64_t>(v->size()), t.numel());
      }
    }
  }
  EXPECT_LT(opened, 200);  // most corruptions are detected
}
