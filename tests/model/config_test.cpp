// model_config: parsing, validation errors, the layer map and the derived figures, checked
// against the tech report (official shape) and against the HF fixture's tensor inventory.
#include <gtest/gtest.h>
#include <simdjson.h>

#include <fstream>
#include <sstream>

#include "model/config.hpp"

using namespace cedar::model;

namespace {
std::string src(const std::string& rel) { return std::string(CEDAR_SOURCE_DIR) + "/" + rel; }

model_config load_ok(const std::string& rel) {
  auto c = load_model_config(src(rel));
  EXPECT_TRUE(c.ok()) << (c.ok() ? "" : c.err().message);
  return c.ok() ? *c : model_config{};
}

std::string parse_err(const std::string& json) {
  auto c = parse_model_config(json, "t.json");
  if (c.ok()) return "";
  return c.err().message;
}
}  // namespace

TEST(ModelConfig, OfficialShapeReproducesTheTechReport) {
  model_config c = load_ok("config/deepseek-v41-flash.json");
  ASSERT_EQ(c.layers.size(), 43u);
  model_figures f = compute_figures(c);
  // P abstract / §6: 890 B per token = (288 + 68) x (3 x 1/2 + 1).
  EXPECT_EQ(f.fp4_main_entry_bytes, 288);
  EXPECT_EQ(f.fp4_index_key_bytes, 68);
  EXPECT_EQ(f.fp8_swa_entry_bytes, 528);
  EXPECT_DOUBLE_EQ(f.persistent_bytes_per_token, 890.0);
  EXPECT_EQ(f.swa_bytes_per_sequence, 43 * 128 * 528);
  EXPECT_EQ(f.bf16_equivalent_bytes_per_token, 40 * 512 * 2);
  EXPECT_GT(f.compression_ratio, 40.0);
  // P §2.1: 552B backbone + 196B Engram; HFC: ~763B checkpoint; ~8B / 16B active.
  EXPECT_NEAR(double(f.params_backbone), 552e9, 1.0e9);
  EXPECT_NEAR(double(f.params_engram), 196.5e9, 1.0e9);
  EXPECT_NEAR(double(f.params_total), 763e9, 2.0e9);
  EXPECT_NEAR(double(f.params_active_prefill), 8e9, 0.5e9);
  EXPECT_NEAR(double(f.params_active_decode), 16e9, 0.5e9);
}

TEST(ModelConfig, OfficialLayerMap) {
  model_config c = load_ok("config/deepseek-v41-flash.json");
  EXPECT_EQ(c.first_decoder_layer, 20);
  for (int l : {0, 1}) EXPECT_EQ(c.layers[l].mode, layer_mode::swa_only);
  for (int l : {2, 8, 14, 20}) EXPECT_EQ(c.layers[l].mode, layer_mode::full) << l;
  for (int l : {24, 28, 32, 36}) {
    EXPECT_EQ(c.layers[l].mode, layer_mode::reindex) << l;
    EXPECT_TRUE(c.layers[l].candidate_restricted) << l;
    EXPECT_EQ(c.layers[l].kv_source, 20);
  }
  EXPECT_EQ(c.layers[13].mode, layer_mode::reuse);
  EXPECT_EQ(c.layers[13].kv_source, 8);
  EXPECT_EQ(c.layers[13].index_source, 8);
  EXPECT_EQ(c.layers[27].index_source, 24);
  EXPECT_EQ(c.layers[27].kv_source, 20);
  EXPECT_TRUE(c.layers[20].candidate_source);
  EXPECT_FALSE(c.layers[19].decoder);
  EXPECT_TRUE(c.layers[20].decoder);
  EXPECT_TRUE(c.layers[1].engram);
  EXPECT_TRUE(c.layers[14].engram);
  for (int l : {40, 41, 42}) EXPECT_TRUE(c.layers[l].draft);
  EXPECT_EQ(c.dspark_target_layer_ids, (std::vector<int>{37, 38, 39}));
}

// The parameter count must equal the number of weight elements in the HF fixture's
// checkpoint (minus the Engram tables' FP8 block scales, which are storage, not parameters).
TEST(ModelConfig, TinyFixtureParamCountMatchesItsCheckpoint) {
  model_config c = load_ok("tests/fixtures/deepseek-v41-tiny-A/config.json");
  std::ifstream f(src("tests/fixtures/deepseek-v41-tiny-A/model.safetensors"), std::ios::binary);
  ASSERT_TRUE(f.good());
  uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), 8);
  std::string header(n, '\0');
  f.read(header.data(), std::streamsize(n));
  simdjson::dom::parser p;
  simdjson::dom::object obj = p.parse(header).get_object();
  int64_t total = 0, scales = 0;
  for (auto [k, v] : obj) {
    if (k == "__metadata__") continue;
    int64_t numel = 1;
    for (auto d : v["shape"].get_array()) numel *= int64_t(d.get_int64());
    total += numel;
    if (std::string_view(k).find("engram.embed.scale") != std::string_view::npos) scales += numel;
  }
  EXPECT_EQ(total, 2197292);  // manifest.json n_params
  model_figures fig = compute_figures(c);
  EXPECT_EQ(fig.params_total, total - scales);
}

TEST(ModelConfig, TinyFixtureLayerModesMatchTheManifest) {
  model_config c = load_ok("tests/fixtures/deepseek-v41-tiny-A/config.json");
  // manifest.json "layer_modes"
  const layer_mode want[12] = {layer_mode::swa_only, layer_mode::swa_only, layer_mode::full, layer_mode::reuse,
                               layer_mode::full,     layer_mode::reuse,    layer_mode::full, layer_mode::reuse,
                               layer_mode::reindex,  layer_mode::reuse,    layer_mode::reindex, layer_mode::reuse};
  for (int l = 0; l < 12; ++l) EXPECT_EQ(c.layers[l].mode, want[l]) << "layer " << l;
  EXPECT_TRUE(c.layers[1].engram);
  EXPECT_TRUE(c.layers[4].engram);
  EXPECT_TRUE(c.layers[6].candidate_source);
  EXPECT_EQ(c.first_decoder_layer, 6);
  EXPECT_EQ(c.engram_pad_id, 2);  // read from engram_pad_token_id
  EXPECT_TRUE(c.yarn.enabled);
  EXPECT_DOUBLE_EQ(c.yarn.factor, 16.0);
}

TEST(ModelConfig, FlatConfigAndDefaultsScaleTheSchedule) {
  // A flat deepseek_v41_text config with 12 layers and no schedule: HF's scaled default
  // [0,0] + [2]*5 + [1]*5, sources at the first layer of each same-ratio run.
  auto c = parse_model_config(R"({"model_type":"deepseek_v41_text","num_hidden_layers":12,
      "num_nextn_predict_layers":0,"engram_layer_ids":[]})", "flat.json");
  ASSERT_TRUE(c.ok()) << c.err().message;
  EXPECT_EQ(c->compress_ratios, (std::vector<int>{0, 0, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1}));
  EXPECT_EQ(c->kv_source_layer_ids, (std::vector<int>{2, 7}));
  EXPECT_EQ(c->candidate_source_layer_id, 7);
}

TEST(ModelConfig, ErrorsNameTheField) {
  struct bad { const char* json; const char* field; };
  const bad cases[] = {
      {R"({"hidden_size":"big"})", "'hidden_size'"},
      {R"({"hidden_size":-3})", "'hidden_size'"},
      {R"({"model_type":"llama"})", "'model_type'"},
      {R"({"num_key_value_heads":8})", "'num_key_value_heads'"},
      {R"({"compress_ratios":[0,1]})", "'compress_ratios'"},
      {R"({"num_hidden_layers":4,"num_nextn_predict_layers":0,"compress_ratios":[0,2,2,1],
           "kv_source_layer_ids":[1,5],"index_source_layer_ids":[1]})", "'kv_source_layer_ids'"},
      {R"({"num_hidden_layers":4,"num_nextn_predict_layers":0,"compress_ratios":[0,2,2,1],
           "kv_source_layer_ids":[1,3],"index_source_layer_ids":[1]})", "'index_source_layer_ids'"},
      {R"({"num_hidden_layers":4,"num_nextn_predict_layers":0,"compress_ratios":[0,2,2,1],
           "kv_source_layer_ids":[0],"index_source_layer_ids":[0]})", "'kv_source_layer_ids'"},
      {R"({"num_hidden_layers":4,"num_nextn_predict_layers":0,"compress_ratios":[0,2,1,1],
           "kv_source_layer_ids":[1],"index_source_layer_ids":[1]})", "'compress_ratios'"},
      {R"({"qk_rope_head_dim":63})", "'qk_rope_head_dim'"},
      {R"({"head_dim":100})", "'head_dim'"},
      {R"({"o_groups":7})", "'o_groups'"},
      {R"({"num_experts_per_tok":999})", "'num_experts_per_tok'"},
      {R"({"scoring_func":"softmax"})", "'scoring_func'"},
      {R"({"engram_layer_ids":[1],"engram_num_embeddings":[1,2]})", "'engram_num_embeddings'"},
      {R"({"rope_scaling":{"rope_type":"ntk"}})", "'rope_scaling.rope_type'"},
      {R"({"candidate_source_layer_id":21})", "'candidate_source_layer_id'"},
      {R"({"compress_ratios":"all"})", "'compress_ratios'"},
      {R"({"kv_source_layer_ids":[2,"8"]})", "'kv_source_layer_ids'"},
      {R"({"text_config":{"sliding_window":0}})", "'sliding_window'"},
  };
  for (const bad& b : cases) {
    std::string e = parse_err(b.json);
    EXPECT_NE(e, "") << b.json;
    EXPECT_NE(e.find(b.field), std::string::npos) << "error '" << e << "' should name " << b.field;
    EXPECT_EQ(e.rfind("t.json: ", 0), 0u) << "error '" << e << "' should name the file";
  }
}

TEST(ModelConfig, MalformedJsonAndMissingFile) {
  for (const char* j : {"", "{", "[1,2]", "{\"a\":", "nul", "{\"hidden_size\":1e999}"}) {
    auto c = parse_model_config(j, "m.json");
    ASSERT_FALSE(c.ok()) << j;
    EXPECT_NE(c.err().message.find("m.json"), std::string::npos);
  }
  auto c = load_model_config("/nonexistent/dir/config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.err().code, cedar::errc::not_found);
}
