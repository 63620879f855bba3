// `cedar model info`: the layer map, parameter counts and cache bytes of a V4.1-family config.
//
// Counting conventions (stated so the figures can be checked):
// - parameters are weight elements as stored in the checkpoint, without FP8/FP4 block scales;
// - backbone = embedding + 40 blocks (attention, mHC, norms, router, routed + shared experts,
//   compressors, indexers) + final norm + head; Engram = its tables and projections;
//   DSpark = the draft blocks and their heads;
// - active per decoded token = every block with k routed + shared experts, the router, the
//   Engram rows gathered and projected, one embedding row and the head;
// - active per prefilled (non-tail) token under CED = the encoder blocks [0, first decoder
//   layer) + the decoder KV source's compressor and index-key projection + Engram; the
//   decoder blocks run only on the last n_win tokens.
#include "runtime/cmd_model.hpp"

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/config.hpp"
#include "tools_mcp/json.hpp"

namespace cedar::runtime {
namespace {

// "0-1,8,10-12" from a sorted list of layer ids.
std::string ranges(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
    if (!s.empty()) s += ',';
    s += std::to_string(v[i]);
    if (j > i) s += '-' + std::to_string(v[j]);
    i = j + 1;
  }
  return s.empty() ? "-" : s;
}

std::string human(double x) {
  char b[32];
  if (x >= 1e9) std::snprintf(b, sizeof b, "%.1fB", x / 1e9);
  else if (x >= 1e6) std::snprintf(b, sizeof b, "%.1fM", x / 1e6);
  else if (x >= 1e3) std::snprintf(b, sizeof b, "%.1fK", x / 1e3);
  else std::snprintf(b, sizeof b, "%.0f", x);
  return b;
}

// One character per layer: S swa-only, F full, I reindex (re-index), R reuse, D draft;
// '|' marks the CED split (first decoder layer).
std::string layer_map_string(const model::model_config& c) {
  std::string s;
  for (int l = 0; l < int(c.layers.size()); ++l) {
    const auto& li = c.layers[l];
    if (l == c.first_decoder_layer || l == c.num_hidden_layers) s += '|';
    if (li.draft) s += 'D';
    else if (li.mode == model::layer_mode::swa_only) s += 'S';
    else if (li.mode == model::layer_mode::full) s += 'F';
    else if (li.mode == model::layer_mode::reindex) s += 'I';
    else s += 'R';
  }
  return s;
}

int model_info(const std::string& path, bool json) {
  auto cfg = model::load_model_config(path);
  if (!cfg) {
    std::fprintf(stderr, "cedar model info: %s\n", cfg.err().message.c_str());
    return 2;
  }
  const model::model_config& c = *cfg;
  const model::model_figures f = model::compute_figures(c);

  std::vector<int> swa, enc_full, enc_reuse, dec_full, dec_reindex, dec_reuse, draft;
  for (int l = 0; l < int(c.layers.size()); ++l) {
    const auto& li = c.layers[l];
    if (li.draft) draft.push_back(l);
    else if (li.mode == model::layer_mode::swa_only) swa.push_back(l);
    else if (!li.decoder) (li.mode == model::layer_mode::reuse ? enc_reuse : enc_full).push_back(l);
    else if (li.mode == model::layer_mode::full) dec_full.push_back(l);
    else if (li.mode == model::layer_mode::reindex) dec_reindex.push_back(l);
    else dec_reuse.push_back(l);
  }

  // Ordered key/value pairs, printed as text or JSON.
  nlohmann::ordered_json j;
  j["config"] = path;
  j["layers"] = c.num_hidden_layers;
  j["draft_layers"] = c.num_nextn_predict_layers;
  j["layer_map"] = layer_map_string(c);
  j["layers_swa_only"] = ranges(swa);
  j["layers_encoder_full"] = ranges(enc_full);
  j["layers_encoder_reuse"] = ranges(enc_reuse);
  j["layers_decoder_full"] = ranges(dec_full);
  j["layers_decoder_reindex"] = ranges(dec_reindex);
  j["layers_decoder_reuse"] = ranges(dec_reuse);
  j["layers_engram"] = ranges(c.engram_layer_ids);
  j["layers_draft"] = ranges(draft);
  j["first_decoder_layer"] = c.first_decoder_layer;
  j["candidate_source_layer"] = c.candidate_source_layer_id;
  j["kv_sources"] = ranges(c.kv_source_layer_ids);
  j["sliding_window"] = c.sliding_window;
  j["params_total"] = f.params_total;
  j["params_backbone"] = f.params_backbone;
  j["params_engram"] = f.params_engram;
  j["params_dspark"] = f.params_dspark;
  j["params_active_prefill"] = f.params_active_prefill;
  j["params_active_decode"] = f.params_active_decode;
  j["fp4_main_entry_bytes"] = f.fp4_main_entry_bytes;
  j["fp4_index_key_bytes"] = f.fp4_index_key_bytes;
  j["fp8_swa_entry_bytes"] = f.fp8_swa_entry_bytes;
  j["persistent_bytes_per_token"] = f.persistent_bytes_per_token;
  j["swa_bytes_per_sequence"] = f.swa_bytes_per_sequence;
  j["bf16_equivalent_bytes_per_token"] = f.bf16_equivalent_bytes_per_token;
  j["bf16_to_persistent_ratio"] = f.compression_ratio;

  if (json) {
    std::printf("%s\n", cedar::tools::json_dump(j, 2).c_str());
    return 0;
  }
  for (auto& [k, v] : j.items()) {
    std::string val;
    if (v.is_string()) val = v.get<std::string>();
    else if (v.is_number_float()) {
      char b[64];
      double d = v.get<double>();
      if (d == double(int64_t(d))) std::snprintf(b, sizeof b, "%lld", (long long)d);
      else std::snprintf(b, sizeof b, "%.2f", d);
      val = b;
    } else val = cedar::tools::json_dump(v);
    if (k.rfind("params_", 0) == 0) val += " (" + human(v.get<double>()) + ")";
    std::printf("%s: %s\n", k.c_str(), val.c_str());
  }
  return 0;
}

}  // namespace

void add_model_commands(CLI::App& app, int* exit_code) {
  auto* model = app.add_subcommand("model", "inspect model configs and checkpoints");
  model->require_subcommand(1);
  auto* info = model->add_subcommand("info", "print the layer map, parameter counts and KV bytes of a config.json");
  static std::string path;
  static bool json = false;
  info->add_option("config", path, "HF-style config.json of the DeepSeek-V4.1 family")->required();
  info->add_flag("--json", json, "print the same figures as one JSON object");
  info->callback([exit_code] { *exit_code = model_info(path, json); });
}

}  // namespace cedar::runtime
