// engine — see engine.hpp. One table of (official tensor name, expected shape, destination,
// storage kind) drives loading, random initialisation and the random-checkpoint writer, so
// the three cannot drift apart. Loading keeps matrices as views into the mapped checkpoint.
#include "model/engine.hpp"

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>

#include "kernels/cpu/quant.hpp"
#include "model/npy.hpp"
#include "model/safetensors.hpp"

namespace cedar::model {
namespace {

enum class init_kind { matrix, ones, zeros, table };

// How write_random_checkpoint's fp8 layout stores a tensor (MODEL_SPEC §5, COL).
enum class store_kind {
  vector,  // F32 always
  plain,   // BF16 (indexer, compressor, wo_a, gate, mHC, embedding, head)
  dense,   // F8_E4M3 + UE8M0 32x32 blocks
  expert,  // packed FP4 E2M1 + E8M0 per 32 (routed experts)
  table,   // F8_E4M3 + UE8M0 1x32 row blocks (Engram tables)
};

// One tensor the engine needs: an fp32 copy (`vec`: vectors) or a matrix view in the stored
// format (`mat`: matrices and the embedding).
struct tensor_slot {
  std::string name;
  std::vector<int64_t> shape;
  fvec* vec = nullptr;
  qmat* mat = nullptr;
  init_kind init = init_kind::matrix;
  store_kind store = store_kind::vector;
  bool optional = false;
  bool stack_on_prev = false;  // an expert's w3: kept right after its w1 when both are fp32
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

void add_vec(std::vector<tensor_slot>& v, std::string name, std::vector<int64_t> shape, fvec& dest,
             init_kind init, bool optional = false) {
  v.push_back(tensor_slot{std::move(name), std::move(shape), &dest, nullptr, init,
                          store_kind::vector, optional});
}

void add_mat(std::vector<tensor_slot>& v, std::string name, std::vector<int64_t> shape, qmat& dest,
             store_kind store, init_kind init = init_kind::matrix) {
  v.push_back(tensor_slot{std::move(name), std::move(shape), nullptr, &dest, init, store, false});
}

// Every tensor of the backbone, in checkpoint naming.
std::vector<tensor_slot> tensor_table(const model_config& c, std::vector<block_weights>& blocks,
                                      qmat& embed, fvec& norm, qmat& head,
                                      const engram_layout& eg) {
  std::vector<tensor_slot> t;
  const int64_t d = c.hidden_size, hd = c.head_dim, H = c.num_attention_heads;
  const int64_t q = c.q_lora_rank, G = c.o_groups, orank = c.o_lora_rank;
  const int64_t hc = c.hc_mult, mix = (2 + hc) * hc, F = c.moe_intermediate_size;
  const int64_t E = c.n_routed_experts, Hi = c.index_n_heads, Di = c.index_head_dim;
  const store_kind dense = store_kind::dense, plain = store_kind::plain;
  add_mat(t, "embed.weight", {c.vocab_size, d}, embed, plain);
  add_vec(t, "norm.weight", {d}, norm, init_kind::ones);
  add_mat(t, "head.weight", {c.vocab_size, d}, head, plain);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    block_weights& b = blocks[(size_t)l];
    const layer_info& li = c.layers[(size_t)l];
    const std::string p = "layers." + std::to_string(l) + ".";
    add_vec(t, p + "attn_norm.weight", {d}, b.attn_norm, init_kind::ones);
    add_vec(t, p + "ffn_norm.weight", {d}, b.ffn_norm, init_kind::ones);
    add_mat(t, p + "hc_attn_fn", {mix, hc * d}, b.hc_attn_fn, plain);
    add_vec(t, p + "hc_attn_base", {mix}, b.hc_attn_base, init_kind::zeros);
    add_vec(t, p + "hc_attn_scale", {3}, b.hc_attn_scale, init_kind::ones);
    add_mat(t, p + "hc_ffn_fn", {mix, hc * d}, b.hc_ffn_fn, plain);
    add_vec(t, p + "hc_ffn_base", {mix}, b.hc_ffn_base, init_kind::zeros);
    add_vec(t, p + "hc_ffn_scale", {3}, b.hc_ffn_scale, init_kind::ones);
    attention_weights& a = b.attn;
    const std::string pa = p + "attn.";
    add_mat(t, pa + "wq_a.weight", {q, d}, a.wq_a, dense);
    add_vec(t, pa + "q_norm.weight", {q}, a.q_norm, init_kind::ones);
    add_mat(t, pa + "wq_b.weight", {H * hd, q}, a.wq_b, dense);
    add_mat(t, pa + "wkv.weight", {hd, d}, a.wkv, dense);
    add_vec(t, pa + "kv_norm.weight", {hd}, a.kv_norm, init_kind::ones);
    add_mat(t, pa + "wo_a.weight", {G * orank, H * hd / G}, a.wo_a, plain);
    add_mat(t, pa + "wo_b.weight", {d, G * orank}, a.wo_b, dense);
    add_vec(t, pa + "attn_sink", {H}, a.attn_sink, init_kind::zeros);
    a.has_compressor = li.ratio > 0 && c.is_kv_source(l);
    a.has_indexer = li.ratio > 0 && c.is_index_source(l);
    if (a.has_compressor) {
      add_mat(t, pa + "compressor.wkv.weight", {hd, d}, a.compressor.wkv, plain);
      if (li.ratio > 1) add_mat(t, pa + "compressor.wgate.weight", {hd, d}, a.compressor.wgate, plain);
      add_vec(t, pa + "compressor.norm.weight", {hd}, a.compressor.norm, init_kind::ones);
    }
    if (a.has_indexer) {
      add_mat(t, pa + "indexer.wq_b.weight", {Hi * Di, q}, a.indexer.wq_b, plain);
      add_mat(t, pa + "indexer.weights_proj.weight", {Hi, d}, a.indexer.weights_proj, plain);
      if (a.has_compressor) {
        add_mat(t, pa + "indexer.wk.weight", {Di, hd}, a.indexer.wk, plain);
        add_vec(t, pa + "indexer.k_norm.weight", {Di}, a.indexer.k_norm, init_kind::ones);
      }
    }
    moe_weights& m = b.ffn;
    const std::string pf = p + "ffn.";
    add_mat(t, pf + "gate.weight", {E, d}, m.gate, plain);
    add_vec(t, pf + "gate.bias", {E}, m.bias, init_kind::zeros);
    add_vec(t, pf + "gate.bias_vl", {E}, m.bias_vl, init_kind::zeros, /*optional=*/true);
    m.experts.resize((size_t)E);
    auto expert = [&](const std::string& pe, expert_weights& ew, store_kind k) {
      add_mat(t, pe + "w1.weight", {F, d}, ew.w1, k);
      add_mat(t, pe + "w3.weight", {F, d}, ew.w3, k);
      t.back().stack_on_prev = true;
      add_mat(t, pe + "w2.weight", {d, F}, ew.w2, k);
    };
    for (int64_t e = 0; e < E; ++e)
      expert(pf + "experts." + std::to_string(e) + ".", m.experts[(size_t)e], store_kind::expert);
    expert(pf + "shared_experts.", m.shared, dense);
    b.has_engram = li.engram;
    if (li.engram) {
      int li_idx = 0;
      while (c.engram_layer_ids[(size_t)li_idx] != l) ++li_idx;
      const int64_t rows = c.engram_num_embeddings[(size_t)li_idx];
      const std::string pe = p + "engram.";
      add_mat(t, pe + "embed.weight", {rows, c.engram_head_dim}, b.engram.table, store_kind::table,
              init_kind::table);
      add_mat(t, pe + "wkv.weight", {d * (hc + 1), (int64_t)eg.n_cols() * c.engram_head_dim}, b.engram.wkv,
              dense);
      add_vec(t, pe + "q_weight", {hc, d}, b.engram.q_weight, init_kind::ones);
      add_vec(t, pe + "k_weight", {hc, d}, b.engram.k_weight, init_kind::ones);
    }
  }
  return t;
}

// The values engine::random gives every tensor, slot by slot in table order (one stream).
template <class Fn>
void for_each_random(const std::vector<tensor_slot>& table, uint64_t seed, Fn&& fn) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  std::vector<float> v;
  for (const tensor_slot& s : table) {
    v.resize(numel(s.shape));
    for (float& x : v) x = s.init == init_kind::ones ? 1.0f : s.init == init_kind::zeros ? 0.0f : nd(rng);
    fn(s, v);
  }
}

// The config with Engram table sizes from the prime layout (random weights need no real rows).
model_config sized_config(const model_config& c, const engram_layout& eg) {
  model_config sized = c;
  for (size_t i = 0; i < sized.engram_num_embeddings.size() && i < eg.table_rows.size(); ++i)
    sized.engram_num_embeddings[i] = eg.table_rows[i];
  return sized;
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
  auto opened = checkpoint::open(checkpoint_path);
  if (!opened.ok()) return opened.take_err();
  engine e;
  e.cfg_ = c;
  e.ckpt_ = std::make_shared<const checkpoint>(std::move(*opened));
  const checkpoint& ck = *e.ckpt_;
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
    const tensor_view* tv = ck.find(s.name);
    if (!tv) {
      if (s.optional) {
        s.vec->assign(numel(s.shape), 0.0f);
        continue;
      }
      return make_error(errc::not_found, checkpoint_path + ": tensor '" + s.name +
                                             "' is missing (expected shape " + shape_str(s.shape) + ")");
    }
    const std::vector<int64_t> shape = to_f32_shape(ck, *tv);
    if (shape != s.shape)
      return make_error(errc::mismatch, checkpoint_path + ": tensor '" + s.name + "' has shape " +
                                            shape_str(shape) + ", expected " + shape_str(s.shape) +
                                            " for this config");
    if (s.vec) {
      auto v = to_f32(ck, *tv);
      if (!v.ok()) return v.take_err();
      *s.vec = std::move(*v);
      continue;
    }
    // Matrices stay in the file's dtype, referenced from the mapping.
    std::vector<float> f32_store, scale_store;
    auto m = weight_matrix(ck, *tv, f32_store, scale_store);
    if (!m.ok()) return m.take_err();
    *s.mat = *m;
    if (f32_store.empty()) {
      e.mapped_bytes_ += tv->n_bytes;
      if (m->scale_e8m0) e.mapped_bytes_ += (size_t)((m->rows + m->scale_block_rows - 1) / m->scale_block_rows) *
                                            (size_t)m->scale_cols;
    } else {
      e.owned_.push_back(std::move(f32_store));
    }
    if (!scale_store.empty()) e.owned_.push_back(std::move(scale_store));
    // fp32 w1/w3 of an expert: one stacked [2F, d] copy, so the gate/up projection stays one
    // GEMM and F32 checkpoints compute bit for bit what they always did (OpenBLAS results
    // depend on the GEMM's shape). Quantised experts stay mapped (two GEMMs).
    qmat* w1 = (&s != table.data()) ? (&s - 1)->mat : nullptr;
    qmat w13;
    if (s.stack_on_prev && w1 && w1->format == kernels::weight_format::f32 &&
        s.mat->format == kernels::weight_format::f32 && !kernels::stacked_view(*w1, *s.mat, &w13)) {
      std::vector<float> both((size_t)((w1->rows + s.mat->rows) * w1->cols));
      kernels::dequant_rows(*w1, 0, w1->rows, both.data());
      kernels::dequant_rows(*s.mat, 0, s.mat->rows, both.data() + (size_t)(w1->rows * w1->cols));
      for (const tensor_slot* slot : {&s - 1, &s})  // no longer referenced in the mapping
        if (const tensor_view* t = ck.find(slot->name); t && t->data == slot->mat->data) e.mapped_bytes_ -= t->n_bytes;
      e.owned_.push_back(std::move(both));
      const qmat all = kernels::qmatrix_f32(e.owned_.back().data(), w1->rows + s.mat->rows, w1->cols);
      *s.mat = all.slice_rows(w1->rows, s.mat->rows);
      *w1 = all.slice_rows(0, w1->rows);
    }
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
  const std::vector<tensor_slot> table =
      tensor_table(sized_config(c, e.engram_), e.blocks_, e.embed_, e.norm_, e.head_, e.engram_);
  for_each_random(table, seed, [&](const tensor_slot& s, const std::vector<float>& v) {
    if (s.vec) {
      *s.vec = v;
      return;
    }
    const int64_t cols = s.shape.back(), rows = (int64_t)(v.size() / (size_t)cols);
    if (s.stack_on_prev) {
      // w3 right after its w1 in one buffer (see load()).
      std::vector<float>& both = e.owned_.back();
      const size_t n1 = both.size();
      both.insert(both.end(), v.begin(), v.end());
      const qmat all = kernels::qmatrix_f32(both.data(), (int64_t)(n1 / (size_t)cols) + rows, cols);
      *(&s - 1)->mat = all.slice_rows(0, (int64_t)(n1 / (size_t)cols));
      *s.mat = all.slice_rows((int64_t)(n1 / (size_t)cols), rows);
      return;
    }
    e.owned_.push_back(v);
    *s.mat = kernels::qmatrix_f32(e.owned_.back().data(), rows, cols);
  });
  if (!c.engram_layer_ids.empty() && opts.engram_token_map.empty()) {
    opts.engram_token_map.resize((size_t)c.vocab_size);
    for (int64_t i = 0; i < c.vocab_size; ++i)
      opts.engram_token_map[(size_t)i] = i % c.engram_compressed_vocab_size;
  }
  CEDAR_TRY(e.finish(opts));
  return e;
}

int64_t engine::n_params() const {
  int64_t n = embed_.rows * embed_.cols + (int64_t)norm_.size() + head_.rows * head_.cols;
  auto v = [&](const fvec& x) { n += (int64_t)x.size(); };
  auto m = [&](const qmat& x) { n += x.rows * x.cols; };
  for (const block_weights& b : blocks_) {
    v(b.attn_norm); v(b.ffn_norm); m(b.hc_attn_fn); v(b.hc_attn_base); v(b.hc_attn_scale);
    m(b.hc_ffn_fn); v(b.hc_ffn_base); v(b.hc_ffn_scale);
    const attention_weights& a = b.attn;
    m(a.wq_a); v(a.q_norm); m(a.wq_b); m(a.wkv); v(a.kv_norm); m(a.wo_a); m(a.wo_b); v(a.attn_sink);
    m(a.compressor.wkv); m(a.compressor.wgate); v(a.compressor.norm);
    m(a.indexer.wq_b); m(a.indexer.weights_proj); m(a.indexer.wk); v(a.indexer.k_norm);
    m(b.ffn.gate); v(b.ffn.bias); v(b.ffn.bias_vl);
    for (const expert_weights& ew : b.ffn.experts) { m(ew.w1); m(ew.w3); m(ew.w2); }
    m(b.ffn.shared.w1); m(b.ffn.shared.w3); m(b.ffn.shared.w2);
    m(b.engram.table); m(b.engram.wkv); v(b.engram.q_weight); v(b.engram.k_weight);
  }
  return n;
}

size_t engine::owned_bytes() const {
  size_t n = 4 * norm_.size();
  for (const auto& o : owned_) n += 4 * o.size();
  auto v = [&](const fvec& x) { n += 4 * x.size(); };
  for (const block_weights& b : blocks_) {
    v(b.attn_norm); v(b.ffn_norm); v(b.hc_attn_base); v(b.hc_attn_scale); v(b.hc_ffn_base);
    v(b.hc_ffn_scale); v(b.attn.q_norm); v(b.attn.kv_norm); v(b.attn.attn_sink);
    v(b.attn.compressor.norm); v(b.attn.indexer.k_norm); v(b.ffn.bias); v(b.ffn.bias_vl);
    v(b.engram.q_weight); v(b.engram.k_weight); v(b.engram.qk);
  }
  return n;
}

// ============================================================================================
// Random checkpoints in a chosen storage layout
// ============================================================================================
status write_random_checkpoint(const model_config& c, uint64_t seed, storage_layout layout,
                               const std::string& path) {
  auto lay = make_engram_layout(c);
  if (!lay.ok()) return lay.take_err();
  const model_config sized = sized_config(c, *lay);
  std::vector<block_weights> blocks((size_t)c.num_hidden_layers);
  qmat embed, head;
  fvec norm;
  const std::vector<tensor_slot> table = tensor_table(sized, blocks, embed, norm, head, *lay);
  std::vector<raw_tensor> out;
  for_each_random(table, seed, [&](const tensor_slot& s, const std::vector<float>& v) {
    store_kind k = s.store;
    if (layout == storage_layout::f32) k = store_kind::vector;
    else if (layout == storage_layout::bf16 && k != store_kind::vector) k = store_kind::plain;
    const int64_t cols = s.shape.back(), rows = (int64_t)(v.size() / (size_t)std::max<int64_t>(1, cols));
    if (k == store_kind::expert && cols % 32 != 0) k = store_kind::dense;
    const std::string base = s.name.substr(0, s.name.size() - std::string(".weight").size());
    raw_tensor t{s.name, dtype::f32, s.shape, {}};
    switch (k) {
      case store_kind::vector:
        t.bytes.resize(v.size() * 4);
        std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
        break;
      case store_kind::plain:
        t.type = dtype::bf16;
        t.bytes.resize(v.size() * 2);
        for (size_t i = 0; i < v.size(); ++i) {
          const uint16_t h = kernels::f32_to_bf16(v[i]);
          std::memcpy(t.bytes.data() + 2 * i, &h, 2);
        }
        break;
      case store_kind::dense:
      case store_kind::table: {
        const int br = k == store_kind::dense ? 32 : 1;
        t.type = dtype::f8_e4m3;
        t.bytes.resize(v.size());
        raw_tensor sc{base + ".scale", dtype::f8_e8m0, {(rows + br - 1) / br, (cols + 31) / 32}, {}};
        sc.bytes.resize((size_t)(sc.shape[0] * sc.shape[1]));
        kernels::quantise_f8_blocks(v.data(), rows, cols, br, t.bytes.data(), sc.bytes.data());
        out.push_back(std::move(sc));
        break;
      }
      case store_kind::expert: {
        t.type = dtype::i8;
        t.shape.back() = cols / 2;
        t.bytes.resize(v.size() / 2);
        raw_tensor sc{base + ".scale", dtype::f8_e8m0, {rows, cols / 32}, {}};
        sc.bytes.resize((size_t)(rows * (cols / 32)));
        kernels::quantise_fp4_rows(v.data(), rows, cols, t.bytes.data(), sc.bytes.data());
        out.push_back(std::move(sc));
        break;
      }
    }
    out.push_back(std::move(t));
  });
  return write_safetensors_raw(path, out, {{"format", "pt"}});
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
