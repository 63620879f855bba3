// engine — see engine.hpp. One table of (official tensor name, expected shape, destination)
// drives both loading and random initialisation, so the two cannot drift apart.
#include "model/engine.hpp"

#include <cmath>
#include <functional>
#include <random>
#include <sstream>

#include "kernels/cpu/quant.hpp"
#include "model/npy.hpp"
#include "model/safetensors.hpp"

namespace cedar::model {
namespace {

enum class init_kind { matrix, ones, zeros, table };

// One tensor the engine needs. `dest` receives `numel(shape)` values at `offset`; dest is
// resized to `dest_size` first (w1 and w3 share one w13 buffer).
struct tensor_slot {
  std::string name;
  std::vector<int64_t> shape;
  fvec* dest = nullptr;
  size_t offset = 0;
  size_t dest_size = 0;
  init_kind init = init_kind::matrix;
  bool optional = false;
};

size_t numel(const std::vector<int64_t>& s) {
  size_t n = 1;
  for (int64_t d : s) n *= (size_t)d;
  return n;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
  o << "]";
  return o.str();
}

void add(std::vector<tensor_slot>& v, std::string name, std::vector<int64_t> shape, fvec& dest,
         init_kind init, size_t offset = 0, size_t dest_size = 0, bool optional = false) {
  const size_t n = numel(shape);
  v.push_back(tensor_slot{std::move(name), std::move(shape), &dest, offset,
                          dest_size ? dest_size : n, init, optional});
}

// Every tensor of the backbone, in checkpoint naming.
std::vector<tensor_slot> tensor_table(const model_config& c, std::vector<block_weights>& blocks,
                                      fvec& embed, fvec& norm, fvec& head,
                                      const engram_layout& eg) {
  std::vector<tensor_slot> t;
  const int64_t d = c.hidden_size, hd = c.head_dim, H = c.num_attention_heads;
  const int64_t q = c.q_lora_rank, G = c.o_groups, orank = c.o_lora_rank;
  const int64_t hc = c.hc_mult, mix = (2 + hc) * hc, F = c.moe_intermediate_size;
  const int64_t E = c.n_routed_experts, Hi = c.index_n_heads, Di = c.index_head_dim;
  add(t, "embed.weight", {c.vocab_size, d}, embed, init_kind::matrix);
  add(t, "norm.weight", {d}, norm, init_kind::ones);
  add(t, "head.weight", {c.vocab_size, d}, head, init_kind::matrix);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    block_weights& b = blocks[(size_t)l];
    const layer_info& li = c.layers[(size_t)l];
    const std::string p = "layers." + std::to_string(l) + ".";
    add(t, p + "attn_norm.weight", {d}, b.attn_norm, init_kind::ones);
    add(t, p + "ffn_norm.weight", {d}, b.ffn_norm, init_kind::ones);
    add(t, p + "hc_attn_fn", {mix, hc * d}, b.hc_attn_fn, init_kind::matrix);
    add(t, p + "hc_attn_base", {mix}, b.hc_attn_base, init_kind::zeros);
    add(t, p + "hc_attn_scale", {3}, b.hc_attn_scale, init_kind::ones);
    add(t, p + "hc_ffn_fn", {mix, hc * d}, b.hc_ffn_fn, init_kind::matrix);
    add(t, p + "hc_ffn_base", {mix}, b.hc_ffn_base, init_kind::zeros);
    add(t, p + "hc_ffn_scale", {3}, b.hc_ffn_scale, init_kind::ones);
    attention_weights& a = b.attn;
    const std::string pa = p + "attn.";
    add(t, pa + "wq_a.weight", {q, d}, a.wq_a, init_kind::matrix);
    add(t, pa + "q_norm.weight", {q}, a.q_norm, init_kind::ones);
    add(t, pa + "wq_b.weight", {H * hd, q}, a.wq_b, init_kind::matrix);
    add(t, pa + "wkv.weight", {hd, d}, a.wkv, init_kind::matrix);
    add(t, pa + "kv_norm.weight", {hd}, a.kv_norm, init_kind::ones);
    add(t, pa + "wo_a.weight", {G * orank, H * hd / G}, a.wo_a, init_kind::matrix);
    add(t, pa + "wo_b.weight", {d, G * orank}, a.wo_b, init_kind::matrix);
    add(t, pa + "attn_sink", {H}, a.attn_sink, init_kind::zeros);
    a.has_compressor = li.ratio > 0 && c.is_kv_source(l);
    a.has_indexer = li.ratio > 0 && c.is_index_source(l);
    if (a.has_compressor) {
      add(t, pa + "compressor.wkv.weight", {hd, d}, a.compressor.wkv, init_kind::matrix);
      if (li.ratio > 1)
        add(t, pa + "compressor.wgate.weight", {hd, d}, a.compressor.wgate, init_kind::matrix);
      add(t, pa + "compressor.norm.weight", {hd}, a.compressor.norm, init_kind::ones);
    }
    if (a.has_indexer) {
      add(t, pa + "indexer.wq_b.weight", {Hi * Di, q}, a.indexer.wq_b, init_kind::matrix);
      add(t, pa + "indexer.weights_proj.weight", {Hi, d}, a.indexer.weights_proj, init_kind::matrix);
      if (a.has_compressor) {
        add(t, pa + "indexer.wk.weight", {Di, hd}, a.indexer.wk, init_kind::matrix);
        add(t, pa + "indexer.k_norm.weight", {Di}, a.indexer.k_norm, init_kind::ones);
      }
    }
    moe_weights& m = b.ffn;
    const std::string pf = p + "ffn.";
    add(t, pf + "gate.weight", {E, d}, m.gate, init_kind::matrix);
    add(t, pf + "gate.bias", {E}, m.bias, init_kind::zeros);
    add(t, pf + "gate.bias_vl", {E}, m.bias_vl, init_kind::zeros, 0, 0, /*optional=*/true);
    m.experts.resize((size_t)E);
    auto expert = [&](const std::string& pe, expert_weights& ew) {
      add(t, pe + "w1.weight", {F, d}, ew.w13, init_kind::matrix, 0, (size_t)(2 * F * d));
      add(t, pe + "w3.weight", {F, d}, ew.w13, init_kind::matrix, (size_t)(F * d), (size_t)(2 * F * d));
      add(t, pe + "w2.weight", {d, F}, ew.w2, init_kind::matrix);
    };
    for (int64_t e = 0; e < E; ++e) expert(pf + "experts." + std::to_string(e) + ".", m.experts[(size_t)e]);
    expert(pf + "shared_experts.", m.shared);
    b.has_engram = li.engram;
    if (li.engram) {
      int li_idx = 0;
      while (c.engram_layer_ids[(size_t)li_idx] != l) ++li_idx;
      const int64_t rows = c.engram_num_embeddings[(size_t)li_idx];
      const std::string pe = p + "engram.";
      add(t, pe + "embed.weight", {rows, c.engram_head_dim}, b.engram.table, init_kind::table);
      add(t, pe + "wkv.weight", {d * (hc + 1), (int64_t)eg.n_cols() * c.engram_head_dim}, b.engram.wkv,
          init_kind::matrix);
      add(t, pe + "q_weight", {hc, d}, b.engram.q_weight, init_kind::ones);
      add(t, pe + "k_weight", {hc, d}, b.engram.k_weight, init_kind::ones);
    }
  }
  return t;
}

// Engram tables ship as FP8 rows with a per-(row, 32-channel) scale; fp32/bf16 copies need none.
result<std::vector<float>> load_engram_table(const checkpoint& ck, const tensor_view& tv,
                                             const std::string& name) {
  if (tv.type != dtype::f8_e4m3) return to_f32(ck, tv);
  const std::string sname = name.substr(0, name.size() - std::string("weight").size()) + "scale";
  const tensor_view* sv = ck.find(sname);
  const int64_t rows = tv.shape[0], cols = tv.shape[1];
  if (!sv || sv->shape.size() != 2 || sv->shape[0] != rows || sv->shape[1] != cols / 32)
    return make_error(errc::mismatch, ck.path() + ": tensor '" + sname + "' must have shape [" +
                                          std::to_string(rows) + ", " + std::to_string(cols / 32) +
                                          "] to dequantise '" + name + "'");
  auto sc = to_f32(ck, *sv);
  if (!sc.ok()) return sc.take_err();
  std::vector<float> out((size_t)(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < cols; ++k)
      out[(size_t)(r * cols + k)] =
          kernels::e4m3_decode(tv.data[r * cols + k]) * (*sc)[(size_t)(r * (cols / 32) + k / 32)];
  return out;
}

}  // namespace

status engine::check_config(const model_config& c) {
  if ((int)c.layers.size() < c.num_hidden_layers)
    return make_error(errc::invalid_argument, "engine: config has no layer map (call finalize)");
  if (c.head_dim % 32 != 0 || c.index_head_dim % 32 != 0)
    return make_error(errc::invalid_argument,
                      "engine: head_dim and index_head_dim must be multiples of 32 (FP8/FP4 blocks)");
  if (c.qk_rope_head_dim % 2 != 0 || c.qk_rope_head_dim > c.head_dim ||
      c.qk_rope_head_dim > c.index_head_dim)
    return make_error(errc::invalid_argument, "engine: qk_rope_head_dim must be even and fit the heads");
  if (c.scoring_func != "sqrtsoftplus")
    return make_error(errc::invalid_argument,
                      "engine: scoring_func '" + c.scoring_func + "' is not supported (sqrtsoftplus)");
  if (c.num_experts_per_tok > c.n_routed_experts)
    return make_error(errc::invalid_argument, "engine: num_experts_per_tok exceeds n_routed_experts");
  return {};
}

status engine::finish(engine_options& opts) {
  const model_config& c = cfg_;
  main_rope_ = make_main_rope(c);
  compress_rope_ = make_compress_rope(c);
  for (block_weights& b : blocks_)
    if (b.has_engram) {
      b.engram.qk.resize(b.engram.q_weight.size());
      for (size_t i = 0; i < b.engram.qk.size(); ++i)
        b.engram.qk[i] = b.engram.q_weight[i] * b.engram.k_weight[i];
    }
  if (!c.engram_layer_ids.empty()) {
    token_map_ = std::move(opts.engram_token_map);
    if ((int64_t)token_map_.size() != c.vocab_size)
      return make_error(errc::invalid_argument,
                        "engine: the Engram token map must have vocab_size = " +
                            std::to_string(c.vocab_size) + " entries, got " +
                            std::to_string(token_map_.size()));
    for (int64_t v : token_map_)
      if (v < 0 || v >= c.engram_compressed_vocab_size)
        return make_error(errc::invalid_argument,
                          "engine: Engram token map value " + std::to_string(v) +
                              " outside [0, engram_compressed_vocab_size)");
    if (c.engram_pad_id < 0 || c.engram_pad_id >= c.vocab_size)
      return make_error(errc::invalid_argument, "engine: engram_pad_id outside the vocabulary");
    pad_compressed_ = token_map_[(size_t)c.engram_pad_id];
  }
  return {};
}

result<engine> engine::load(const model_config& c, const std::string& checkpoint_path,
                            engine_options opts) {
  CEDAR_TRY(check_config(c));
  auto ck = checkpoint::open(checkpoint_path);
  if (!ck.ok()) return ck.take_err();
  engine e;
  e.cfg_ = c;
  auto lay = make_engram_layout(c);
  if (!lay.ok()) return lay.take_err();
  e.engram_ = std::move(*lay);
  for (size_t i = 0; i < c.engram_num_embeddings.size() && i < e.engram_.table_rows.size(); ++i)
    if (c.engram_num_embeddings[i] != e.engram_.table_rows[i])
      return make_error(errc::mismatch, "engine: engram_num_embeddings[" + std::to_string(i) + "] = " +
                                            std::to_string(c.engram_num_embeddings[i]) +
                                            " but the prime layout needs " +
                                            std::to_string(e.engram_.table_rows[i]) + " rows");
  e.blocks_.resize((size_t)c.num_hidden_layers);
  const std::vector<tensor_slot> table =
      tensor_table(c, e.blocks_, e.embed_, e.norm_, e.head_, e.engram_);
  for (const tensor_slot& s : table) {
    const tensor_view* tv = ck->find(s.name);
    if (!tv) {
      if (s.optional) {
        s.dest->assign(numel(s.shape), 0.0f);
        continue;
      }
      return make_error(errc::not_found, checkpoint_path + ": tensor '" + s.name +
                                             "' is missing (expected shape " + shape_str(s.shape) + ")");
    }
    const std::vector<int64_t> shape = to_f32_shape(*ck, *tv);
    if (shape != s.shape)
      return make_error(errc::mismatch, checkpoint_path + ": tensor '" + s.name + "' has shape " +
                                            shape_str(shape) + ", expected " + shape_str(s.shape) +
                                            " for this config");
    auto v = s.init == init_kind::table ? load_engram_table(*ck, *tv, s.name) : to_f32(*ck, *tv);
    if (!v.ok()) return v.take_err();
    if (s.dest->size() < s.dest_size) s.dest->resize(s.dest_size);
    std::copy(v->begin(), v->end(), s.dest->begin() + (std::ptrdiff_t)s.offset);
  }
  CEDAR_TRY(e.finish(opts));
  return e;
}

result<engine> engine::random(const model_config& c, uint64_t seed, engine_options opts) {
  CEDAR_TRY(check_config(c));
  engine e;
  e.cfg_ = c;
  auto lay = make_engram_layout(c);
  if (!lay.ok()) return lay.take_err();
  e.engram_ = std::move(*lay);
  e.blocks_.resize((size_t)c.num_hidden_layers);
  // Engram tables sized by the prime layout (the config's num_embeddings may be the real one).
  model_config sized = c;
  for (size_t i = 0; i < sized.engram_num_embeddings.size() && i < e.engram_.table_rows.size(); ++i)
    sized.engram_num_embeddings[i] = e.engram_.table_rows[i];
  const std::vector<tensor_slot> table =
      tensor_table(sized, e.blocks_, e.embed_, e.norm_, e.head_, e.engram_);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  for (const tensor_slot& s : table) {
    if (s.dest->size() < s.dest_size) s.dest->resize(s.dest_size);
    float* p = s.dest->data() + s.offset;
    const size_t n = numel(s.shape);
    for (size_t i = 0; i < n; ++i)
      p[i] = s.init == init_kind::ones ? 1.0f : s.init == init_kind::zeros ? 0.0f : nd(rng);
  }
  if (!c.engram_layer_ids.empty() && opts.engram_token_map.empty()) {
    opts.engram_token_map.resize((size_t)c.vocab_size);
    for (int64_t i = 0; i < c.vocab_size; ++i)
      opts.engram_token_map[(size_t)i] = i % c.engram_compressed_vocab_size;
  }
  CEDAR_TRY(e.finish(opts));
  return e;
}

int64_t engine::n_params() const {
  int64_t n = (int64_t)(embed_.size() + norm_.size() + head_.size());
  auto v = [&](const fvec& x) { n += (int64_t)x.size(); };
  for (const block_weights& b : blocks_) {
    v(b.attn_norm); v(b.ffn_norm); v(b.hc_attn_fn); v(b.hc_attn_base); v(b.hc_attn_scale);
    v(b.hc_ffn_fn); v(b.hc_ffn_base); v(b.hc_ffn_scale);
    const attention_weights& a = b.attn;
    v(a.wq_a); v(a.q_norm); v(a.wq_b); v(a.wkv); v(a.kv_norm); v(a.wo_a); v(a.wo_b); v(a.attn_sink);
    v(a.compressor.wkv); v(a.compressor.wgate); v(a.compressor.norm);
    v(a.indexer.wq_b); v(a.indexer.weights_proj); v(a.indexer.wk); v(a.indexer.k_norm);
    v(b.ffn.gate); v(b.ffn.bias); v(b.ffn.bias_vl);
    for (const expert_weights& ew : b.ffn.experts) { v(ew.w13); v(ew.w2); }
    v(b.ffn.shared.w13); v(b.ffn.shared.w2);
    v(b.engram.table); v(b.engram.wkv); v(b.engram.q_weight); v(b.engram.k_weight);
  }
  return n;
}

result<std::vector<int64_t>> load_token_map_npy(const std::string& path) {
  auto a = npy_load(path);
  if (!a.ok()) return a.take_err();
  if (a->shape.size() != 1)
    return make_error(errc::invalid_format, path + ": token map must be a 1-D array");
  std::vector<int64_t> out((size_t)a->numel());
  for (int64_t i = 0; i < a->numel(); ++i) out[(size_t)i] = a->at_i64(i);
  return out;
}

}  // namespace cedar::model
