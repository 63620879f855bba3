// Parsing, validation and derived figures of model_config. See config.hpp for the contract.
//
// Field names follow the released checkpoint's config.json (nested "text_config"), with the
// HF port's spellings accepted where they differ (engram_pad_id / engram_pad_token_id).
// Defaults are the released DeepSeek-V4.1-Flash values, so a config only needs the fields
// that differ; the official file spells them all out anyway.
#include "model/config.hpp"

#include <simdjson.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

namespace cedar::model {

const char* layer_mode_name(layer_mode m) {
  switch (m) {
    case layer_mode::swa_only: return "swa";
    case layer_mode::full: return "full";
    case layer_mode::reindex: return "reindex";
    case layer_mode::reuse: return "reuse";
  }
  return "?";
}

bool model_config::is_kv_source(int l) const {
  return std::find(kv_source_layer_ids.begin(), kv_source_layer_ids.end(), l) != kv_source_layer_ids.end();
}
bool model_config::is_index_source(int l) const {
  return std::find(index_source_layer_ids.begin(), index_source_layer_ids.end(), l) !=
         index_source_layer_ids.end();
}

// ============================================================================================
// JSON field readers
// ============================================================================================
namespace {

using simdjson::dom::element;
using simdjson::dom::element_type;
using simdjson::dom::object;

struct reader {
  std::string origin;     // file name for messages
  object primary;         // text_config (or the root when flat)
  object root;            // the root object (fallback for fields stored at top level)
  bool has_root = false;

  error fail(std::string_view field, const std::string& what) const {
    return make_error(errc::invalid_format, origin + ": field '" + std::string(field) + "': " + what);
  }

  // Looks a field up in text_config first, then in the root. Returns false if absent.
  bool lookup(std::string_view key, element& out) const {
    if (primary[key].get(out) == simdjson::SUCCESS) return true;
    if (has_root && root[key].get(out) == simdjson::SUCCESS) return true;
    return false;
  }

  static const char* type_name(element_type t) {
    switch (t) {
      case element_type::ARRAY: return "an array";
      case element_type::OBJECT: return "an object";
      case element_type::INT64: case element_type::UINT64: return "an integer";
      case element_type::DOUBLE: return "a number";
      case element_type::STRING: return "a string";
      case element_type::BOOL: return "a boolean";
      case element_type::NULL_VALUE: return "null";
    }
    return "?";
  }

  // Integers may be written as 1e-0-style doubles by some exporters: accept integral doubles.
  static bool as_int(element e, int64_t& v) {
    switch (e.type()) {
      case element_type::INT64: v = int64_t(e); return true;
      case element_type::UINT64: {
        uint64_t u = uint64_t(e);
        if (u > uint64_t(INT64_MAX)) return false;
        v = int64_t(u);
        return true;
      }
      case element_type::DOUBLE: {
        double d = double(e);
        if (std::floor(d) != d || std::fabs(d) > 9.0e15) return false;
        v = int64_t(d);
        return true;
      }
      default: return false;
    }
  }

  template <class Int>
  status get_int(std::string_view key, Int& out, int64_t lo, int64_t hi) const {
    element e;
    if (!lookup(key, e)) return {};  // keep the default
    if (e.type() == element_type::NULL_VALUE) return {};
    int64_t v;
    if (!as_int(e, v)) return fail(key, std::string("expected an integer, got ") + type_name(e.type()));
    if (v < lo || v > hi)
      return fail(key, "expected a value in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                           "], got " + std::to_string(v));
    out = static_cast<Int>(v);
    return {};
  }

  status get_double(std::string_view key, double& out, double lo, double hi) const {
    element e;
    if (!lookup(key, e)) return {};
    if (e.type() == element_type::NULL_VALUE) return {};
    double v;
    if (e.type() == element_type::DOUBLE) v = double(e);
    else if (e.type() == element_type::INT64) v = double(int64_t(e));
    else if (e.type() == element_type::UINT64) v = double(uint64_t(e));
    else return fail(key, std::string("expected a number, got ") + type_name(e.type()));
    if (!(v >= lo && v <= hi)) {
      std::ostringstream s;
      s << "expected a value in [" << lo << ", " << hi << "], got " << v;
      return fail(key, s.str());
    }
    out = v;
    return {};
  }

  status get_bool(std::string_view key, bool& out) const {
    element e;
    if (!lookup(key, e)) return {};
    if (e.type() == element_type::NULL_VALUE) return {};
    if (e.type() != element_type::BOOL) return fail(key, std::string("expected a boolean, got ") + type_name(e.type()));
    out = bool(e);
    return {};
  }

  status get_string(std::string_view key, std::string& out) const {
    element e;
    if (!lookup(key, e)) return {};
    if (e.type() == element_type::NULL_VALUE) return {};
    if (e.type() != element_type::STRING) return fail(key, std::string("expected a string, got ") + type_name(e.type()));
    out = std::string(std::string_view(e));
    return {};
  }

  template <class Int>
  status get_int_list(std::string_view key, std::vector<Int>& out, int64_t lo, int64_t hi) const {
    element e;
    if (!lookup(key, e)) return {};
    if (e.type() == element_type::NULL_VALUE) return {};
    if (e.type() != element_type::ARRAY)
      return fail(key, std::string("expected an array of integers, got ") + type_name(e.type()));
    std::vector<Int> v;
    size_t i = 0;
    for (element x : simdjson::dom::array(e)) {
      int64_t n;
      if (!as_int(x, n))
        return fail(key, "entry " + std::to_string(i) + ": expected an integer, got " + type_name(x.type()));
      if (n < lo || n > hi)
        return fail(key, "entry " + std::to_string(i) + ": expected a value in [" + std::to_string(lo) + ", " +
                             std::to_string(hi) + "], got " + std::to_string(n));
      v.push_back(static_cast<Int>(n));
      ++i;
    }
    out = std::move(v);
    return {};
  }
};

constexpr int64_t kBig = int64_t(1) << 40;

}  // namespace

// ============================================================================================
// parse
// ============================================================================================
result<model_config> parse_model_config(std::string_view json, std::string_view origin_sv) {
  std::string origin(origin_sv);
  simdjson::dom::parser parser;
  simdjson::padded_string padded(json);
  element doc;
  if (auto e = parser.parse(padded).get(doc); e != simdjson::SUCCESS)
    return make_error(errc::invalid_format, origin + ": not valid JSON (" + simdjson::error_message(e) + ")");
  if (doc.type() != element_type::OBJECT)
    return make_error(errc::invalid_format, origin + ": expected a JSON object at the top level");

  reader r;
  r.origin = origin;
  r.root = object(doc);
  element tc;
  if (r.root["text_config"].get(tc) == simdjson::SUCCESS && tc.type() == element_type::OBJECT) {
    r.primary = object(tc);
    r.has_root = true;
  } else {
    r.primary = r.root;
  }

  // The family check: an unknown model_type is rejected up front, naming it.
  for (std::string_view key : {"model_type"}) {
    element e;
    if (r.primary[key].get(e) == simdjson::SUCCESS || r.root[key].get(e) == simdjson::SUCCESS) {
      if (e.type() != element_type::STRING) return r.fail(key, "expected a string");
      std::string_view mt(e);
      if (mt != "deepseek_v41" && mt != "deepseek_v41_text")
        return r.fail(key, "unknown model_type '" + std::string(mt) +
                               "' (cedar runs the DeepSeek-V4.1 family: expected 'deepseek_v41' or 'deepseek_v41_text')");
    }
  }

  model_config c;
  // clang-format off
  CEDAR_TRY(r.get_int("vocab_size", c.vocab_size, 2, kBig));
  CEDAR_TRY(r.get_int("hidden_size", c.hidden_size, 1, 1 << 20));
  CEDAR_TRY(r.get_int("num_hidden_layers", c.num_hidden_layers, 1, 4096));
  CEDAR_TRY(r.get_int("num_attention_heads", c.num_attention_heads, 1, 1 << 16));
  CEDAR_TRY(r.get_int("num_key_value_heads", c.num_key_value_heads, 1, 1 << 16));
  CEDAR_TRY(r.get_int("head_dim", c.head_dim, 1, 1 << 16));
  CEDAR_TRY(r.get_int("qk_rope_head_dim", c.qk_rope_head_dim, 0, 1 << 16));
  CEDAR_TRY(r.get_int("q_lora_rank", c.q_lora_rank, 1, 1 << 20));
  CEDAR_TRY(r.get_int("o_groups", c.o_groups, 1, 1 << 16));
  CEDAR_TRY(r.get_int("o_lora_rank", c.o_lora_rank, 1, 1 << 20));
  CEDAR_TRY(r.get_int("max_position_embeddings", c.max_position_embeddings, 1, kBig));
  CEDAR_TRY(r.get_bool("tie_word_embeddings", c.tie_word_embeddings));
  CEDAR_TRY(r.get_double("rms_norm_eps", c.rms_norm_eps, 0.0, 1.0));
  CEDAR_TRY(r.get_int("bos_token_id", c.bos_token_id, 0, kBig));
  CEDAR_TRY(r.get_int("pad_token_id", c.pad_token_id, 0, kBig));
  {
    // eos_token_id may be an integer or a list (the first entry is used as the stop token).
    element e;
    if (r.lookup("eos_token_id", e) && e.type() == element_type::ARRAY) {
      std::vector<int> v;
      CEDAR_TRY(r.get_int_list("eos_token_id", v, 0, kBig));
      if (v.empty()) return r.fail("eos_token_id", "expected at least one id");
      c.eos_token_id = v[0];
    } else {
      CEDAR_TRY(r.get_int("eos_token_id", c.eos_token_id, 0, kBig));
    }
  }

  CEDAR_TRY(r.get_double("rope_theta", c.rope_theta, 1.0, 1e12));
  CEDAR_TRY(r.get_double("compress_rope_theta", c.compress_rope_theta, 1.0, 1e12));
  {
    element rs;
    if (r.lookup("rope_scaling", rs) && rs.type() != element_type::NULL_VALUE) {
      if (rs.type() != element_type::OBJECT) return r.fail("rope_scaling", "expected an object");
      reader sub = r;
      sub.primary = object(rs);
      sub.has_root = false;
      std::string type = "default";
      CEDAR_TRY(sub.get_string("rope_type", type));
      CEDAR_TRY(sub.get_string("type", type));
      if (type == "yarn") {
        c.yarn.enabled = true;
        CEDAR_TRY(sub.get_double("factor", c.yarn.factor, 1.0, 1e6));
        CEDAR_TRY(sub.get_double("beta_fast", c.yarn.beta_fast, 0.0, 1e6));
        CEDAR_TRY(sub.get_double("beta_slow", c.yarn.beta_slow, 0.0, 1e6));
        CEDAR_TRY(sub.get_int("original_max_position_embeddings", c.yarn.original_max_position, 1, kBig));
      } else if (type != "default") {
        return r.fail("rope_scaling.rope_type", "unsupported '" + type + "' (expected 'yarn' or 'default')");
      }
    }
  }

  CEDAR_TRY(r.get_int("sliding_window", c.sliding_window, 1, 1 << 20));
  CEDAR_TRY(r.get_int_list("compress_ratios", c.compress_ratios, 0, 1 << 16));
  CEDAR_TRY(r.get_int_list("kv_source_layer_ids", c.kv_source_layer_ids, 0, 1 << 16));
  CEDAR_TRY(r.get_int_list("index_source_layer_ids", c.index_source_layer_ids, 0, 1 << 16));
  CEDAR_TRY(r.get_int("candidate_source_layer_id", c.candidate_source_layer_id, -1, 1 << 16));
  CEDAR_TRY(r.get_int("candidate_topk_blocks", c.candidate_topk_blocks, 1, 1 << 30));
  CEDAR_TRY(r.get_int("candidate_block_size", c.candidate_block_size, 1, 1 << 20));
  CEDAR_TRY(r.get_int("index_n_heads", c.index_n_heads, 1, 1 << 16));
  CEDAR_TRY(r.get_int("index_head_dim", c.index_head_dim, 1, 1 << 16));
  CEDAR_TRY(r.get_int("index_topk", c.index_topk, 1, 1 << 30));

  CEDAR_TRY(r.get_int("moe_intermediate_size", c.moe_intermediate_size, 1, 1 << 24));
  CEDAR_TRY(r.get_int("n_routed_experts", c.n_routed_experts, 1, 1 << 20));
  CEDAR_TRY(r.get_int("n_shared_experts", c.n_shared_experts, 0, 1 << 10));
  CEDAR_TRY(r.get_int("num_experts_per_tok", c.num_experts_per_tok, 1, 1 << 20));
  CEDAR_TRY(r.get_string("scoring_func", c.scoring_func));
  CEDAR_TRY(r.get_string("topk_method", c.topk_method));
  CEDAR_TRY(r.get_bool("norm_topk_prob", c.norm_topk_prob));
  CEDAR_TRY(r.get_double("routed_scaling_factor", c.routed_scaling_factor, 0.0, 1e6));
  CEDAR_TRY(r.get_double("swiglu_limit", c.swiglu_limit, 0.0, 1e12));

  CEDAR_TRY(r.get_int("hc_mult", c.hc_mult, 1, 64));
  CEDAR_TRY(r.get_int("hc_sinkhorn_iters", c.hc_sinkhorn_iters, 1, 1000));
  CEDAR_TRY(r.get_double("hc_eps", c.hc_eps, 0.0, 1.0));

  CEDAR_TRY(r.get_int_list("engram_layer_ids", c.engram_layer_ids, 0, 1 << 16));
  CEDAR_TRY(r.get_int_list("engram_num_embeddings", c.engram_num_embeddings, 1, kBig));
  CEDAR_TRY(r.get_int("engram_max_ngram_size", c.engram_max_ngram_size, 2, 64));
  CEDAR_TRY(r.get_int("engram_vocab_size", c.engram_vocab_size, 1, kBig));
  CEDAR_TRY(r.get_int("engram_n_heads", c.engram_n_heads, 1, 1 << 12));
  CEDAR_TRY(r.get_int("engram_head_dim", c.engram_head_dim, 1, 1 << 16));
  CEDAR_TRY(r.get_int("engram_pad_id", c.engram_pad_id, 0, kBig));
  CEDAR_TRY(r.get_int("engram_pad_token_id", c.engram_pad_id, 0, kBig));
  CEDAR_TRY(r.get_int("engram_compressed_vocab_size", c.engram_compressed_vocab_size, 1, kBig));

  CEDAR_TRY(r.get_int("num_nextn_predict_layers", c.num_nextn_predict_layers, 0, 64));
  CEDAR_TRY(r.get_int("dspark_block_size", c.dspark_block_size, 1, 1024));
  CEDAR_TRY(r.get_int("dspark_noise_token_id", c.dspark_noise_token_id, 0, kBig));
  CEDAR_TRY(r.get_int_list("dspark_target_layer_ids", c.dspark_target_layer_ids, 0, 1 << 16));
  CEDAR_TRY(r.get_int("dspark_markov_rank", c.dspark_markov_rank, 1, 1 << 20));
  CEDAR_TRY(r.get_int("dspark_n_routed_experts", c.dspark_n_routed_experts, 1, 1 << 20));
  CEDAR_TRY(r.get_int("dspark_num_experts_per_tok", c.dspark_num_experts_per_tok, 1, 1 << 20));
  // clang-format on

  // Schedules the file leaves out take the released defaults, as HF's config class does.
  element tmp;
  bool has_ratios = r.lookup("compress_ratios", tmp) && tmp.type() != element_type::NULL_VALUE;
  bool has_kv = r.lookup("kv_source_layer_ids", tmp) && tmp.type() != element_type::NULL_VALUE;
  bool has_index = r.lookup("index_source_layer_ids", tmp) && tmp.type() != element_type::NULL_VALUE;
  bool has_cand = r.lookup("candidate_source_layer_id", tmp) && tmp.type() != element_type::NULL_VALUE;
  bool has_engram = r.lookup("engram_layer_ids", tmp) && tmp.type() != element_type::NULL_VALUE;
  const int n = c.num_hidden_layers;
  if (!has_ratios) {
    if (n == 40) {
      c.compress_ratios.assign(2, 0);
      c.compress_ratios.insert(c.compress_ratios.end(), 18, 2);
      c.compress_ratios.insert(c.compress_ratios.end(), 20, 1);
    } else {
      int n_slide = std::min(2, n), n_enc = std::max(0, (n - n_slide + 1) / 2);
      c.compress_ratios.assign(n_slide, 0);
      c.compress_ratios.insert(c.compress_ratios.end(), n_enc, 2);
      c.compress_ratios.insert(c.compress_ratios.end(), std::max(0, n - n_slide - n_enc), 1);
    }
  }
  if (!has_kv) {
    c.kv_source_layer_ids.clear();
    std::vector<int> released = {0, 0};
    released.insert(released.end(), 18, 2);
    released.insert(released.end(), 20, 1);
    bool is_released = n == 40 && c.compress_ratios.size() >= released.size() &&
                       std::equal(released.begin(), released.end(), c.compress_ratios.begin());
    if (is_released) c.kv_source_layer_ids = {2, 8, 14, 20};
    else
      for (int i = 0; i < n && i < int(c.compress_ratios.size()); ++i)
        if (c.compress_ratios[i] > 0 && (i == 0 || c.compress_ratios[i - 1] != c.compress_ratios[i]))
          c.kv_source_layer_ids.push_back(i);
  }
  if (!has_index) {
    std::vector<int> def_kv = {2, 8, 14, 20};
    c.index_source_layer_ids = c.kv_source_layer_ids == def_kv ? std::vector<int>{2, 8, 14, 20, 24, 28, 32, 36}
                                                               : c.kv_source_layer_ids;
  }
  if (!has_cand) c.candidate_source_layer_id = c.kv_source_layer_ids.empty() ? -1 : c.kv_source_layer_ids.back();
  if (!has_engram) c.engram_layer_ids.clear();
  if (c.engram_num_embeddings.empty() && !c.engram_layer_ids.empty() && !(r.lookup("engram_num_embeddings", tmp)))
    return r.fail("engram_num_embeddings", "required when engram_layer_ids is not empty");

  if (auto st = finalize(c); !st) {
    error e = st.take_err();
    e.message.replace(0, std::string("model config").size(), origin);  // name the file
    return e;
  }
  return c;
}

result<model_config> load_model_config(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return make_error(errc::not_found, path + ": cannot open model config");
  std::ostringstream ss;
  ss << f.rdbuf();
  if (!f.good() && !f.eof()) return make_error(errc::io, path + ": read failed");
  return parse_model_config(ss.str(), path);
}

// ============================================================================================
// validation + layer map
// ============================================================================================
status finalize(model_config& c) {
  auto fail = [](std::string_view field, const std::string& what) {
    return make_error(errc::invalid_format, "model config: field '" + std::string(field) + "': " + what);
  };
  const int n = c.num_hidden_layers;
  const int nx = c.num_nextn_predict_layers;

  if (c.num_key_value_heads != 1)
    return fail("num_key_value_heads", "expected 1 (V4.1 shares one K=V latent across heads), got " +
                                           std::to_string(c.num_key_value_heads));
  if (c.qk_rope_head_dim % 2 != 0 || c.qk_rope_head_dim >= c.head_dim)
    return fail("qk_rope_head_dim", "expected an even value below head_dim (" + std::to_string(c.head_dim) +
                                        "), got " + std::to_string(c.qk_rope_head_dim));
  if (c.head_dim % 32 != 0)
    return fail("head_dim", "expected a multiple of 32 (FP8 SWA and FP4 KV blocks), got " + std::to_string(c.head_dim));
  if (c.index_head_dim % 32 != 0 || c.index_head_dim < c.qk_rope_head_dim)
    return fail("index_head_dim", "expected a multiple of 32, at least qk_rope_head_dim (" +
                                      std::to_string(c.qk_rope_head_dim) + "), got " + std::to_string(c.index_head_dim));
  if (c.num_attention_heads % c.o_groups != 0)
    return fail("o_groups", "expected a divisor of num_attention_heads (" + std::to_string(c.num_attention_heads) +
                                "), got " + std::to_string(c.o_groups));
  if (c.num_experts_per_tok > c.n_routed_experts)
    return fail("num_experts_per_tok", "expected at most n_routed_experts (" + std::to_string(c.n_routed_experts) +
                                           "), got " + std::to_string(c.num_experts_per_tok));
  if (c.scoring_func != "sqrtsoftplus")
    return fail("scoring_func", "expected 'sqrtsoftplus' (the V4.1 router), got '" + c.scoring_func + "'");
  if (c.topk_method != "noaux_tc")
    return fail("topk_method", "expected 'noaux_tc' (bias-steered selection), got '" + c.topk_method + "'");
  if (c.tie_word_embeddings) return fail("tie_word_embeddings", "expected false (V4.1 has an untied fp32 head)");
  if (c.hc_mult < 1) return fail("hc_mult", "expected >= 1");
  if (c.bos_token_id >= c.vocab_size || c.eos_token_id >= c.vocab_size)
    return fail("bos_token_id/eos_token_id", "expected ids below vocab_size (" + std::to_string(c.vocab_size) + ")");

  // compress_ratios: n backbone entries, then optionally the draft layers' (always 0).
  if (int(c.compress_ratios.size()) < n || int(c.compress_ratios.size()) > n + nx)
    return fail("compress_ratios", "expected " + std::to_string(n) + (nx ? ".." + std::to_string(n + nx) : "") +
                                       " entries (num_hidden_layers" + (nx ? " + num_nextn_predict_layers" : "") +
                                       "), got " + std::to_string(c.compress_ratios.size()));
  for (int i = n; i < int(c.compress_ratios.size()); ++i)
    if (c.compress_ratios[i] != 0)
      return fail("compress_ratios", "entry " + std::to_string(i) + " is a DSpark draft layer and must be 0, got " +
                                         std::to_string(c.compress_ratios[i]));
  c.compress_ratios.resize(n + nx, 0);

  auto check_ids = [&](std::string_view field, std::vector<int>& ids) -> status {
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || ids[i] >= n)
        return fail(field, "entry " + std::to_string(i) + " = " + std::to_string(ids[i]) + " is outside [0, " +
                               std::to_string(n) + ")");
      if (i > 0 && ids[i] <= ids[i - 1]) return fail(field, "expected strictly increasing layer ids");
    }
    return {};
  };
  CEDAR_TRY(check_ids("kv_source_layer_ids", c.kv_source_layer_ids));
  CEDAR_TRY(check_ids("index_source_layer_ids", c.index_source_layer_ids));
  CEDAR_TRY(check_ids("engram_layer_ids", c.engram_layer_ids));
  for (int l : c.kv_source_layer_ids) {
    if (c.compress_ratios[l] == 0)
      return fail("kv_source_layer_ids", "layer " + std::to_string(l) + " has compress_ratios[" + std::to_string(l) +
                                             "] = 0; a KV source needs a ratio > 0");
    if (!c.is_index_source(l))
      return fail("index_source_layer_ids", "KV source layer " + std::to_string(l) +
                                                " must also be an index source (a Full layer publishes its top-k)");
  }
  for (int l : c.index_source_layer_ids)
    if (c.compress_ratios[l] == 0)
      return fail("index_source_layer_ids", "layer " + std::to_string(l) + " has compress_ratios[" +
                                                std::to_string(l) + "] = 0; an index source needs a ratio > 0");
  if (c.candidate_source_layer_id >= 0 && !c.is_index_source(c.candidate_source_layer_id))
    return fail("candidate_source_layer_id", std::to_string(c.candidate_source_layer_id) +
                                                 " is not in index_source_layer_ids");
  if (c.engram_num_embeddings.size() != c.engram_layer_ids.size())
    return fail("engram_num_embeddings", "expected " + std::to_string(c.engram_layer_ids.size()) +
                                             " entries (one per engram layer), got " +
                                             std::to_string(c.engram_num_embeddings.size()));
  if (!c.engram_layer_ids.empty() && c.engram_head_dim % 32 != 0)
    return fail("engram_head_dim", "expected a multiple of 32 (FP8 table rows, one scale per 32), got " +
                                       std::to_string(c.engram_head_dim));
  if (c.dspark_target_layer_ids.empty() && nx > 0) {
    std::vector<int> t;
    for (int i = 0; i < n; ++i)
      if (!c.is_kv_source(i)) t.push_back(i);
    if (t.size() > 3) t.erase(t.begin(), t.end() - 3);
    c.dspark_target_layer_ids = t;
  }
  for (int l : c.dspark_target_layer_ids)
    if (l < 0 || l >= n) return fail("dspark_target_layer_ids", "layer " + std::to_string(l) + " out of range");

  // The layer map.
  c.layers.assign(n + nx, layer_info{});
  c.first_decoder_layer = c.kv_source_layer_ids.empty() ? n : c.kv_source_layer_ids.back();
  for (int l = 0; l < n + nx; ++l) {
    layer_info& li = c.layers[l];
    li.ratio = c.compress_ratios[l];
    li.draft = l >= n;
    li.decoder = !li.draft && l >= c.first_decoder_layer;
    li.engram = std::find(c.engram_layer_ids.begin(), c.engram_layer_ids.end(), l) != c.engram_layer_ids.end();
    if (li.ratio == 0) continue;
    for (int s : c.kv_source_layer_ids)
      if (s <= l) li.kv_source = s;
    for (int s : c.index_source_layer_ids)
      if (s <= l) li.index_source = s;
    if (li.kv_source < 0)
      return fail("kv_source_layer_ids", "layer " + std::to_string(l) + " has ratio " + std::to_string(li.ratio) +
                                             " but no KV source at or before it");
    if (c.compress_ratios[li.kv_source] != li.ratio)
      return fail("compress_ratios", "layer " + std::to_string(l) + " has ratio " + std::to_string(li.ratio) +
                                         " but reads the KV of source layer " + std::to_string(li.kv_source) +
                                         " with ratio " + std::to_string(c.compress_ratios[li.kv_source]));
    if (li.index_source < li.kv_source)
      return fail("index_source_layer_ids", "layer " + std::to_string(l) + " has no index source between its KV source " +
                                                std::to_string(li.kv_source) + " and itself");
    bool kv = c.is_kv_source(l), ix = c.is_index_source(l);
    li.mode = kv ? layer_mode::full : ix ? layer_mode::reindex : layer_mode::reuse;
    li.candidate_source = l == c.candidate_source_layer_id;
    li.candidate_restricted = ix && c.candidate_source_layer_id >= 0 && l > c.candidate_source_layer_id &&
                              li.kv_source <= c.candidate_source_layer_id;
  }
  for (int l : c.engram_layer_ids)
    if (c.layers[l].draft) return fail("engram_layer_ids", "layer " + std::to_string(l) + " is a draft layer");
  return {};
}

// ============================================================================================
// figures
// ============================================================================================
model_figures compute_figures(const model_config& c) {
  model_figures f;
  const int64_t d = c.hidden_size, D = c.head_dim, H = c.num_attention_heads, ql = c.q_lora_rank;
  const int64_t G = c.o_groups, Dg = c.o_lora_rank, Hi = c.index_n_heads, Di = c.index_head_dim;
  const int64_t F = c.moe_intermediate_size, hc = c.hc_mult;
  const int64_t mix = (2 + hc) * hc;  // pre[hc] + post[hc] + comb[hc x hc]

  // One block's attention: q low-rank + norm, K=V latent + norm, grouped output, sinks.
  const int64_t attn = d * ql + ql + ql * H * D + d * D + D + Dg * H * D + G * Dg * d + H;
  const int64_t norms_hc = 2 * d + 2 * (mix * hc * d + mix + 3);  // attn/ffn norms + 2 mHC sites
  auto expert = [&](int64_t) { return 3 * d * F; };                // w1, w2, w3 (SwiGLU)
  auto moe = [&](int64_t n_experts) {
    return n_experts * d + 2 * n_experts /* bias, bias_vl */ + n_experts * expert(0) + c.n_shared_experts * expert(0);
  };
  auto compressor = [&](int l) {
    return c.is_kv_source(l) ? d * D + (c.compress_ratios[l] > 1 ? d * D : 0) + D : 0;
  };
  auto indexer = [&](int l) {
    int64_t p = 0;
    if (c.is_index_source(l)) p += ql * Hi * Di + d * Hi;  // wq_b, weights_proj
    if (c.is_kv_source(l)) p += D * Di + Di;                // wk, k_norm
    return p;
  };
  const int64_t engram_rows_per_pos = int64_t(c.engram_max_ngram_size - 1) * c.engram_n_heads;
  const int64_t engram_in = engram_rows_per_pos * c.engram_head_dim;
  auto engram_proj = [&]() { return (hc + 1) * d * engram_in + 2 * hc * d; };  // wkv + q/k weights

  int64_t backbone = c.vocab_size * d /* embed */ + d /* norm */ + c.vocab_size * d /* head */;
  int64_t engram = 0;
  int64_t active_decode = d /* one embedding row */ + c.vocab_size * d /* head */ + d;
  int64_t active_prefill = d;
  const int64_t moe_active = c.num_experts_per_tok * expert(0) + c.n_shared_experts * expert(0) +
                             c.n_routed_experts * d /* router */;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    int64_t layer = attn + norms_hc + moe(c.n_routed_experts) + compressor(l) + indexer(l);
    backbone += layer;
    int64_t layer_active = attn + norms_hc + moe_active + compressor(l) + indexer(l);
    active_decode += layer_active;
    if (l < c.first_decoder_layer) active_prefill += layer_active;
    else if (l == c.first_decoder_layer)  // CED: only the decoder KV source's projections run
      active_prefill += compressor(l) + (c.is_kv_source(l) ? D * Di + Di : 0) + d + mix * hc * d;
  }
  for (size_t i = 0; i < c.engram_layer_ids.size(); ++i) {
    int64_t p = c.engram_num_embeddings[i] * c.engram_head_dim + engram_proj();
    engram += p;
    int64_t a = engram_rows_per_pos * c.engram_head_dim + engram_proj();  // rows gathered + projection
    active_decode += a;
    active_prefill += a;
  }
  int64_t dspark = 0;
  if (c.num_nextn_predict_layers > 0) {
    const int64_t r = c.dspark_markov_rank;
    const int64_t block = attn + norms_hc + c.dspark_n_routed_experts * d + 2 * c.dspark_n_routed_experts +
                          c.dspark_n_routed_experts * expert(0) + c.n_shared_experts * expert(0);
    dspark = c.num_nextn_predict_layers * block;
    dspark += int64_t(c.dspark_target_layer_ids.size()) * d * d + d;  // main_proj + main_norm
    dspark += c.vocab_size * r + r * c.vocab_size;                    // Markov embedding + head
    dspark += (d + r) + 1 + d;                                        // confidence head + final norm
  }
  f.params_backbone = backbone;
  f.params_engram = engram;
  f.params_dspark = dspark;
  f.params_total = backbone + engram + dspark;
  f.params_active_decode = active_decode;
  f.params_active_prefill = active_prefill;

  f.fp4_main_entry_bytes = D / 2 + D / 16;
  f.fp4_index_key_bytes = Di / 2 + Di / 32;
  f.fp8_swa_entry_bytes = D + D / 32;
  double per_tok = 0;
  for (int s : c.kv_source_layer_ids)
    per_tok += double(f.fp4_main_entry_bytes + f.fp4_index_key_bytes) / c.compress_ratios[s];
  f.persistent_bytes_per_token = per_tok;
  f.swa_bytes_per_sequence = int64_t(c.n_layers_total()) * c.sliding_window * f.fp8_swa_entry_bytes;
  f.bf16_equivalent_bytes_per_token = int64_t(c.num_hidden_layers) * D * 2;
  f.compression_ratio = per_tok > 0 ? double(f.bf16_equivalent_bytes_per_token) / per_tok : 0.0;
  return f;
}

}  // namespace cedar::model
