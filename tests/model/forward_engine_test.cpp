// Engine loading: every tensor is checked against the config; a missing or misshapen tensor
// is an error naming it. Random engines are deterministic in their seed.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <unistd.h>

#include "model/config.hpp"
#include "model/engine.hpp"
#include "model/safetensors.hpp"

namespace cm = cedar::model;

namespace {

const std::string k_dir = std::string(CEDAR_SOURCE_DIR) + "/tests/fixtures/deepseek-v41-tiny-A";

cm::engine_options opts() {
  cm::engine_options o;
  o.engram_token_map = *cm::load_token_map_npy(k_dir + "/engram/token_map.npy");
  return o;
}

// Copies the fixture checkpoint to `path`, dropping `drop` and giving `reshape` a wrong shape.
void write_variant(const std::string& path, const std::string& drop, const std::string& reshape) {
  auto ck = cm::checkpoint::open(k_dir + "/model.safetensors");
  ASSERT_TRUE(ck.ok());
  cm::f32_tensor_list list;
  for (const cm::tensor_view& t : ck->tensors()) {
    if (t.name == drop) continue;
    auto v = cm::to_f32(*ck, t);
    ASSERT_TRUE(v.ok());
    std::vector<int64_t> shape = t.shape;
    if (t.name == reshape) {
      shape = {shape[0] * shape[1]};  // same values, flattened
    }
    list.push_back({t.name, {shape, *v}});
  }
  ASSERT_TRUE(cm::write_safetensors(path, list).ok());
}

std::string tmp_path(const char* tag) {
  return "/tmp/cedar_engine_test_" + std::to_string(getpid()) + "_" + tag + ".safetensors";
}

TEST(forward_engine, loads_fixture) {
  auto c = cm::load_model_config(k_dir + "/config.json");
  ASSERT_TRUE(c.ok());
  auto e = cm::engine::load(*c, k_dir + "/model.safetensors", opts());
  ASSERT_TRUE(e.ok()) << e.err().message;
  EXPECT_GT(e->n_params(), 2000000);
}

TEST(forward_engine, missing_tensor_is_named) {
  auto c = cm::load_model_config(k_dir + "/config.json");
  const std::string p = tmp_path("missing");
  write_variant(p, "layers.6.attn.compressor.wkv.weight", "");
  auto e = cm::engine::load(*c, p, opts());
  std::remove(p.c_str());
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.err().message.find("'layers.6.attn.compressor.wkv.weight' is missing"), std::string::npos)
      << e.err().message;
}

TEST(forward_engine, wrong_shape_is_named) {
  auto c = cm::load_model_config(k_dir + "/config.json");
  const std::string p = tmp_path("shape");
  write_variant(p, "", "layers.3.ffn.experts.2.w3.weight");
  auto e = cm::engine::load(*c, p, opts());
  std::remove(p.c_str());
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.err().message.find("'layers.3.ffn.experts.2.w3.weight' has shape [4096], expected [32, 128]"),
            std::string::npos)
      << e.err().message;
}

TEST(forward_engine, engram_token_map_required) {
  auto c = cm::load_model_config(k_dir + "/config.json");
  auto e = cm::engine::load(*c, k_dir + "/model.safetensors", {});
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.err().message.find("token map"), std::string::npos) << e.err().message;
}

TEST(forward_engine, random_is_deterministic) {
  auto c = cm::load_model_config(k_dir + "/config.json");
  auto a = cm::engine::random(*c, 7);
  auto b = cm::engine::random(*c, 7);
  auto d = cm::engine::random(*c, 8);
  ASSERT_TRUE(a.ok() && b.ok() && d.ok());
  auto values = [](const cm::qmat& m) {
    std::vector<float> v((size_t)(m.rows * m.cols));
    cedar::kernels::dequant_rows(m, 0, m.rows, v.data());
    return v;
  };
  EXPECT_EQ(values(a->block(3).attn.wq_b), values(b->block(3).attn.wq_b));
  EXPECT_NE(values(a->block(3).attn.wq_b), values(d->block(3).attn.wq_b));
}

}  // namespace
