// forward — see forward.hpp. Data flow of one call, in file order:
//
//   segments ─► embed (hc copies) ─► Engram hash ids ─► for each backbone layer:
//       [Engram] ─► attn mixes ─► collapse(pre_prev) + attn_norm ─► [compressor: new global
//       KV entries] ─► [CED cut at first_decoder_layer] ─► Q, SWA KV ─► [indexer top-k] ─►
//       sparse attention (window ∪ top-k entries, sink) ─► inverse RoPE, wo_a, wo_b ─► expand
//       ─► ffn mixes ─► collapse(attn pre) + ffn_norm ─► MoE ─► expand
//   ─► collapse(last pre) + norm ─► head ─► commit tokens / n-gram history to the sequences.
//
// Shapes: R rows, d hidden, hc streams, H heads × hd, Hi × Di indexer heads, E experts.
#include "model/forward.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "kernels/cpu/fp4_dot.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/qmatmul.hpp"
#include "kernels/cpu/quant.hpp"

namespace cedar::model {

namespace kc = cedar::kernels;

namespace {

constexpr float k_neg_inf = -std::numeric_limits<float>::infinity();

// A run of consecutive positions of one sequence inside the current row set.
struct segment {
  sequence* seq = nullptr;
  int row0 = 0;
  int n = 0;
  int64_t pos0 = 0;
  bool replay = false;   // rows already in the sequence: no compressor, no commit
  bool ced_cut = false;  // keep only the last sliding_window rows from first_decoder_layer on
  int hinted = 0;        // replay: the last `hinted` rows take their index selections from the
                         // sequence's resume hints instead of scoring (sequence::selection)
};

// An entry id with its index score: a row's running top-k keeps the scores of its ids because
// the score block they came from is transient (index_rows_packed).
struct scored_id {
  float s;
  int32_t id;
};
// The top-k order: higher score first, ties to the lower id (a total order on distinct ids).
inline bool better_scored(const scored_id& a, const scored_id& b) {
  return a.s > b.s || (a.s == b.s && a.id < b.id);
}

template <class T>
T* grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

}  // namespace

// A second worker for the runner's row loops: one persistent thread (started on first use),
// handed a function pointer + context, so a decode step allocates nothing to use both cores.
class row_helper {
 public:
  ~row_helper() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lk(m_);
      quit_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  // Runs fn(ctx, r0, r1) on the helper thread; pair with wait().
  void post(void (*fn)(void*, int, int), void* ctx, int r0, int r1) {
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    {
      std::lock_guard<std::mutex> lk(m_);
      fn_ = fn;
      ctx_ = ctx;
      r0_ = r0;
      r1_ = r1;
      pending_ = true;
      done_ = false;
    }
    cv_.notify_one();
  }
  void wait() {
    std::unique_lock<std::mutex> lk(m_);
    done_cv_.wait(lk, [this] { return done_; });
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lk(m_);
    for (;;) {
      cv_.wait(lk, [this] { return pending_ || quit_; });
      if (quit_) return;
      pending_ = false;
      lk.unlock();
      fn_(ctx_, r0_, r1_);
      lk.lock();
      done_ = true;
      done_cv_.notify_one();
    }
  }
  std::thread thread_;
  std::mutex m_;
  std::condition_variable cv_, done_cv_;
  void (*fn_)(void*, int, int) = nullptr;
  void* ctx_ = nullptr;
  int r0_ = 0, r1_ = 0;
  bool pending_ = false, done_ = true, quit_ = false;
};

// ============================================================================================
// Scratch: every buffer one call needs, grown on demand and reused (no per-token allocation).
// ============================================================================================
struct runner::workspace {
  std::vector<segment> segs;
  std::vector<int32_t> tok;     // [R]
  std::vector<int64_t> pos;     // [R]
  std::vector<int> seg_of;      // [R]
  std::vector<float> X, X2;     // [R, hc·d] residual streams
  std::vector<float> pre, apre, post, comb, mixes;  // [R, hc], [R, hc], [R, hc], [R, hc²], [R, mix]
  std::vector<float> flat;      // [R, hc·d]
  std::vector<float> x, y;      // [R, d]
  std::vector<float> qr, q, kv; // [R, q_lora], [R, H·hd], [R, hd]
  std::vector<float> o, oa;     // [R, H·hd], [R, G·o_rank]
  std::vector<float> ckv, cgate, latent, keys;  // compressor
  std::vector<float> qi, wts;   // [R, Hi·Di], [R, Hi]
  std::vector<float> sc, iscore;  // indexer score block, [n_entries]
  std::vector<int32_t> order, bsel;
  std::vector<int32_t> cand_ids;  // [≤ n_blocks·block] entries of one row's candidate blocks
  std::vector<float> cand_keys;   // [≤ n_blocks·block, Di] their index keys (f32_diagnostic only)
  std::vector<int32_t> cand_top;  // [K] top-k positions among cand_ids
  // Indexer of a block of rows over packed keys (index_rows_packed), per core: the block's
  // index scores over one key chunk, and every row's running top-k (ids with their scores).
  struct index_worker {
    std::vector<float> chunk;     // [rows, chunk + pad]
    std::vector<scored_id> kept;  // [rows, cap]
    std::vector<int> n_kept;      // [rows]
    std::vector<float> thr;       // [rows] the score an id must beat to be kept
  } iw[2];
  kc::fp4_index_queries iq;       // the block's index queries in integer form (made once per block)
  std::vector<int> vis;           // [rows] visible entries of each row of the block
  std::vector<float> bscore;      // [rows, n_blocks] candidate-block maxima of the block's rows
  std::vector<int32_t> topk;    // [R, K]
  std::vector<int> topk_n;      // [R]
  std::vector<uint8_t> cand;    // [R, n_blocks]
  int cand_blocks = 0;
  std::vector<float> cos, sin;  // [n_pairs]
  std::vector<float> kvbuf;     // [Σ (window rows before pos0 + n), hd] every segment's window keys
  std::vector<int64_t> seg_prior_lo;  // [segments] first window position read from the ring
  std::vector<size_t> seg_kv_off;     // [segments] row offset of the segment in kvbuf
  row_helper helper;            // the second core's worker
  std::vector<float> kc_w[2];   // per attention worker: [K, hd] the row's top-k entries, dequantised
  std::vector<float> logit_w[2];// per attention worker: [H, W + K]
  std::vector<float> scores, selw;  // MoE [R, E], [R, k]
  std::vector<int> sel;             // [R, k]
  std::vector<std::vector<int>> expert_rows;
  std::vector<std::vector<float>> expert_w;
  std::vector<float> xe, he, ae, ye;  // expert gather / hidden / act / out
  std::vector<int64_t> hash;    // [R, n_engram_layers, n_cols]
  std::vector<int64_t> comp;    // compressed ids of one segment (+ look-back)
  std::vector<int64_t> ctx;     // [max_ngram] one position's n-gram, newest first
  std::vector<float> emb, ekv;  // Engram rows / projection
  std::vector<float> head_in;   // [n_out, d]
  std::vector<int> out_rows;
  std::vector<int> keep;        // compaction map
  std::vector<float> tmp;
};

runner::runner(const engine& e) : e_(e), ws_(new workspace) {
  kc::cpu_threads();  // start the kernel pool (and set OpenBLAS to one thread) before any GEMM
}
runner::~runner() { delete ws_; }

namespace {

// ============================================================================================
// mHC (MODEL_SPEC §6): mixes, collapse, expand
// ============================================================================================
void hc_mixes(const model_config& c, const float* X, int R, const qmat& fn, const fvec& base,
              const fvec& scale, runner::workspace& ws, float* pre, float* post, float* comb) {
  const int hc = c.hc_mult, hd = hc * (int)c.hidden_size, mix = (2 + hc) * hc;
  float* flat = grow(ws.flat, (size_t)R * hd);
  kc::rmsnorm_rows(X, nullptr, R, hd, c.rms_norm_eps, flat);
  float* m = grow(ws.mixes, (size_t)R * mix);
  kc::qgemm_nt(R, flat, fn, m);
  const float eps = (float)c.hc_eps;
  for (int r = 0; r < R; ++r) {
    const float* mr = m + (size_t)r * mix;
    for (int k = 0; k < hc; ++k) {
      pre[r * hc + k] = kc::sigmoid(mr[k] * scale[0] + base[(size_t)k]) + eps;
      post[r * hc + k] = 2.0f * kc::sigmoid(mr[hc + k] * scale[1] + base[(size_t)(hc + k)]);
    }
    float* cb = comb + (size_t)r * hc * hc;  // [j][k]
    for (int j = 0; j < hc; ++j) {
      for (int k = 0; k < hc; ++k)
        cb[j * hc + k] = mr[2 * hc + j * hc + k] * scale[2] + base[(size_t)(2 * hc + j * hc + k)];
      kc::softmax(cb + j * hc, hc);
      for (int k = 0; k < hc; ++k) cb[j * hc + k] += eps;
    }
    auto col_norm = [&] {
      for (int k = 0; k < hc; ++k) {
        float s = 0;
        for (int j = 0; j < hc; ++j) s += cb[j * hc + k];
        for (int j = 0; j < hc; ++j) cb[j * hc + k] /= (s + eps);
      }
    };
    col_norm();
    for (int it = 0; it < c.hc_sinkhorn_iters - 1; ++it) {
      for (int j = 0; j < hc; ++j) {
        float s = 0;
        for (int k = 0; k < hc; ++k) s += cb[j * hc + k];
        for (int k = 0; k < hc; ++k) cb[j * hc + k] /= (s + eps);
      }
      col_norm();
    }
  }
}

// x[r] = Σ_k pre[r,k]·X[r,k]   [R, d]
void hc_collapse(const float* X, const float* pre, int R, int hc, int d, float* x) {
  for (int r = 0; r < R; ++r) {
    float* xr = x + (size_t)r * d;
    std::fill(xr, xr + d, 0.0f);
    for (int k = 0; k < hc; ++k) kc::axpy(pre[r * hc + k], X + ((size_t)r * hc + k) * d, xr, d);
  }
}

// X[r,k] ← post[r,k]·y[r] + Σ_j comb[r,j,k]·X[r,j]
void hc_expand(float* X, const float* y, const float* post, const float* comb, int R, int hc,
               int d, std::vector<float>& tmp) {
  float* t = grow(tmp, (size_t)hc * d);
  for (int r = 0; r < R; ++r) {
    float* Xr = X + (size_t)r * hc * d;
    const float* cb = comb + (size_t)r * hc * hc;
    for (int k = 0; k < hc; ++k) {
      float* tk = t + (size_t)k * d;
      const float pk = post[r * hc + k];
      const float* yr = y + (size_t)r * d;
      for (int i = 0; i < d; ++i) tk[i] = pk * yr[i];
      for (int j = 0; j < hc; ++j) kc::axpy(cb[j * hc + k], Xr + (size_t)j * d, tk, d);
    }
    std::memcpy(Xr, t, sizeof(float) * (size_t)hc * d);
  }
}

// ============================================================================================
// Engram (MODEL_SPEC §6)
// ============================================================================================
void engram_apply(const engine& e, int l, int eli, float* X, int R, runner::workspace& ws) {
  const model_config& c = e.config();
  const engram_weights& w = e.block(l).engram;
  const int hc = c.hc_mult, d = (int)c.hidden_size, ehd = c.engram_head_dim;
  const int nc = e.engram().n_cols(), nl = e.engram().n_layers, in = nc * ehd;
  float* emb = grow(ws.emb, (size_t)R * in);
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < nc; ++j) {
      const int64_t id = ws.hash[((size_t)r * nl + eli) * nc + j];
      kc::dequant_rows(w.table, id, 1, emb + (size_t)r * in + (size_t)j * ehd);
    }
  const int outw = d * (hc + 1);
  float* kv = grow(ws.ekv, (size_t)R * outw);
  kc::qgemm_nt(R, emb, w.wkv, kv);
  const float eps = (float)c.rms_norm_eps;
  for (int r = 0; r < R; ++r) {
    const float* value = kv + (size_t)r * outw + (size_t)hc * d;
    for (int k = 0; k < hc; ++k) {
      float* h = X + ((size_t)r * hc + k) * d;
      const float* key = kv + (size_t)r * outw + (size_t)k * d;
      const float* qk = w.qk.data() + (size_t)k * d;
      float hh = 0, kk = 0, dt = 0;
      for (int i = 0; i < d; ++i) {
        hh += h[i] * h[i];
        kk += key[i] * key[i];
        dt += h[i] * qk[i] * key[i];
      }
      const float rstd = (1.0f / std::sqrt(hh / d + eps)) * (1.0f / std::sqrt(kk / d + eps));
      const float dot = dt * rstd / std::sqrt((float)d);
      const float mag = std::sqrt(std::max(std::fabs(dot), 1e-6f));
      const float gate = kc::sigmoid(std::copysign(mag, dot));
      kc::axpy(gate, value, h, d);
    }
  }
}

// Hash ids of every row: ws.hash [R, n_engram_layers, n_cols].
void engram_hash_rows(const engine& e, runner::workspace& ws) {
  const engram_layout& L = e.engram();
  if (L.n_layers == 0) return;
  const int nc = L.n_cols(), back = L.max_ngram - 1;
  const std::vector<int64_t>& tmap = e.engram_token_map();
  int R = 0;
  for (const segment& s : ws.segs) R += s.n;
  int64_t* out = grow(ws.hash, (size_t)R * L.n_layers * nc);
  int64_t* ctx = grow(ws.ctx, (size_t)L.max_ngram);
  for (const segment& s : ws.segs) {
    // comp[k] = compressed id of position pos0 − h + k
    const int h = (int)std::min<int64_t>(s.pos0, back);
    int64_t* comp = grow(ws.comp, (size_t)(h + s.n));
    if (s.replay) {
      for (int k = 0; k < h; ++k) comp[k] = tmap[(size_t)s.seq->tokens()[(size_t)(s.pos0 - h + k)]];
    } else {
      const std::vector<int64_t>& hist = s.seq->ngram_history();
      for (int k = 0; k < h; ++k) comp[k] = hist[hist.size() - (size_t)h + (size_t)k];
    }
    for (int i = 0; i < s.n; ++i) comp[h + i] = tmap[(size_t)ws.tok[(size_t)(s.row0 + i)]];
    for (int i = 0; i < s.n; ++i) {
      const int64_t p = s.pos0 + i;
      for (int sh = 0; sh < L.max_ngram; ++sh)
        ctx[sh] = p < sh ? e.engram_pad_compressed() : comp[h + i - sh];
      for (int li = 0; li < L.n_layers; ++li)
        L.hash(li, ctx, out + ((size_t)(s.row0 + i) * L.n_layers + li) * nc);
    }
  }
}

// ============================================================================================
// MoE (MODEL_SPEC §1 "MoE")
// ============================================================================================
void run_expert(const model_config& c, const expert_weights& w, const float* x, int n,
                const float* row_w, runner::workspace& ws, float* y, float beta) {
  const int d = (int)c.hidden_size, F = c.moe_intermediate_size;
  float* h = grow(ws.he, (size_t)n * 2 * F);
  kc::qmatrix w13;
  if (kc::stacked_view(w.w1, w.w3, &w13)) {
    kc::qgemm_nt(n, x, w13, h);  // [gate | up] in one GEMM (w1, w3 adjacent in memory)
  } else {
    kc::qgemm_nt(n, x, d, w.w1, h, 2 * F);      // gate -> h[:, :F]
    kc::qgemm_nt(n, x, d, w.w3, h + F, 2 * F);  // up   -> h[:, F:]
  }
  float* a = grow(ws.ae, (size_t)n * F);
  for (int r = 0; r < n; ++r)
    kc::swiglu(h + (size_t)r * 2 * F, h + (size_t)r * 2 * F + F, F, (float)c.swiglu_limit,
               row_w ? row_w[r] : 1.0f, a + (size_t)r * F);
  kc::qgemm_nt(n, a, F, w.w2, y, d, 1.0f, beta);
}

void moe_forward(const engine& e, int l, const float* x, int R, runner::workspace& ws, float* y) {
  const model_config& c = e.config();
  const moe_weights& w = e.block(l).ffn;
  const int d = (int)c.hidden_size, E = c.n_routed_experts, K = c.num_experts_per_tok;
  // Shared expert first, straight into y.
  run_expert(c, w.shared, x, R, nullptr, ws, y, 0.0f);
  float* s = grow(ws.scores, (size_t)R * E);
  kc::qgemm_nt(R, x, w.gate, s);
  int* sel = grow(ws.sel, (size_t)R * K);
  float* sw = grow(ws.selw, (size_t)R * K);
  if ((int)ws.expert_rows.size() < E) {
    ws.expert_rows.resize((size_t)E);
    ws.expert_w.resize((size_t)E);
  }
  for (int i = 0; i < E; ++i) {
    ws.expert_rows[(size_t)i].clear();
    ws.expert_w[(size_t)i].clear();
  }
  for (int r = 0; r < R; ++r) {
    float* sr = s + (size_t)r * E;
    for (int i = 0; i < E; ++i) sr[i] = std::sqrt(kc::softplus(sr[i]));
    // top-K of score + bias, ties to the lower expert id
    int* sl = sel + (size_t)r * K;
    for (int k = 0; k < K; ++k) {
      int best = -1;
      float bv = 0;
      for (int i = 0; i < E; ++i) {
        bool taken = false;
        for (int j = 0; j < k; ++j) taken |= sl[j] == i;
        if (taken) continue;
        const float v = sr[i] + w.bias[(size_t)i];
        if (best < 0 || v > bv) {
          best = i;
          bv = v;
        }
      }
      sl[k] = best;
    }
    float sum = 0;
    for (int k = 0; k < K; ++k) sum += sr[sl[k]];
    for (int k = 0; k < K; ++k) {
      float wk = sr[sl[k]];
      if (c.norm_topk_prob && K > 1) wk = wk / (sum + 1e-20f);
      sw[(size_t)r * K + k] = wk * (float)c.routed_scaling_factor;
      ws.expert_rows[(size_t)sl[k]].push_back(r);
      ws.expert_w[(size_t)sl[k]].push_back(sw[(size_t)r * K + k]);
    }
  }
  for (int i = 0; i < E; ++i) {
    const std::vector<int>& rows = ws.expert_rows[(size_t)i];
    const int n = (int)rows.size();
    if (n == 0) continue;
    float* xe = grow(ws.xe, (size_t)n * d);
    for (int j = 0; j < n; ++j)
      std::memcpy(xe + (size_t)j * d, x + (size_t)rows[(size_t)j] * d, sizeof(float) * (size_t)d);
    float* ye = grow(ws.ye, (size_t)n * d);
    run_expert(c, w.experts[(size_t)i], xe, n, ws.expert_w[(size_t)i].data(), ws, ye, 0.0f);
    for (int j = 0; j < n; ++j) kc::axpy(1.0f, ye + (size_t)j * d, y + (size_t)rows[(size_t)j] * d, d);
  }
}

// ============================================================================================
// CSA2: compressor, indexer, sparse attention
// ============================================================================================
const rope_table& layer_rope(const engine& e, int l) {
  return e.config().layers[(size_t)l].ratio > 0 ? e.compress_rope() : e.main_rope();
}

// Runs layer l's compressor over every non-replay segment's rows and appends the completed
// groups' entries (main KV and index keys) to the sequence's KV source.
void compressor_forward(const engine& e, int l, const float* x, int R, runner::workspace& ws) {
  const model_config& c = e.config();
  const attention_weights& a = e.block(l).attn;
  const int hd = c.head_dim, Di = c.index_head_dim;
  const int ratio = c.layers[(size_t)l].ratio;
  const int np = c.qk_rope_head_dim / 2;
  float* kvc = grow(ws.ckv, (size_t)R * hd);
  kc::qgemm_nt(R, x, a.compressor.wkv, kvc);
  float* gate = nullptr;
  if (ratio > 1) {
    gate = grow(ws.cgate, (size_t)R * hd);
    kc::qgemm_nt(R, x, a.compressor.wgate, gate);
  }
  float* cs = grow(ws.cos, (size_t)np);
  float* sn = grow(ws.sin, (size_t)np);
  for (const segment& s : ws.segs) {
    if (s.replay) continue;
    const int si = s.seq->source_of_layer(l);
    kv_source_state& st = s.seq->source_mut(si);
    // Completed groups of this segment -> latents [n_emit, hd] (pre-RoPE, normalised).
    const int max_emit = (st.n_pending + s.n) / ratio;
    float* lat = grow(ws.latent, (size_t)std::max(1, max_emit) * hd);
    int n_emit = 0;
    for (int i = 0; i < s.n; ++i) {
      const float* kr = kvc + (size_t)(s.row0 + i) * hd;
      if (ratio == 1) {
        kc::rmsnorm(kr, a.compressor.norm.data(), hd, c.rms_norm_eps, lat + (size_t)n_emit * hd);
        ++n_emit;
        continue;
      }
      const float* gr = gate + (size_t)(s.row0 + i) * hd;
      if (st.n_pending < ratio - 1) {
        std::memcpy(st.pending_kv.data() + (size_t)st.n_pending * hd, kr, sizeof(float) * (size_t)hd);
        std::memcpy(st.pending_gate.data() + (size_t)st.n_pending * hd, gr, sizeof(float) * (size_t)hd);
        ++st.n_pending;
        continue;
      }
      // The group completes with this row: per-channel softmax over the group's gates.
      float* out = lat + (size_t)n_emit * hd;
      for (int ch = 0; ch < hd; ++ch) {
        float mx = gr[ch];
        for (int j = 0; j < st.n_pending; ++j) mx = std::max(mx, st.pending_gate[(size_t)j * hd + ch]);
        float den = std::exp(gr[ch] - mx), num = den * kr[ch];
        for (int j = 0; j < st.n_pending; ++j) {
          const float ew = std::exp(st.pending_gate[(size_t)j * hd + ch] - mx);
          den += ew;
          num += ew * st.pending_kv[(size_t)j * hd + ch];
        }
        out[ch] = num / den;
      }
      kc::rmsnorm(out, a.compressor.norm.data(), hd, c.rms_norm_eps, out);
      st.n_pending = 0;
      ++n_emit;
    }
    if (n_emit == 0) continue;
    // Index keys from the un-rotated latents: k_norm(wk · latent).
    float* keys = grow(ws.keys, (size_t)n_emit * Di);
    kc::qgemm_nt(n_emit, lat, a.indexer.wk, keys);
    for (int j = 0; j < n_emit; ++j) {
      const int64_t gpos = (st.n_entries) * (int64_t)ratio;  // first token of the group
      e.compress_rope().at(gpos, cs, sn);
      float* k = keys + (size_t)j * Di;
      kc::rmsnorm(k, a.indexer.k_norm.data(), Di, c.rms_norm_eps, k);
      kc::rope_interleaved(k, Di, np, cs, sn, false);
      float* m = lat + (size_t)j * hd;
      kc::rope_interleaved(m, hd, np, cs, sn, false);
      s.seq->append_entry(si, m, k);  // packs (FP4)
    }
  }
}

// Top-k selection of one query row: `score` [n] (−inf = not allowed), ties -> lower index;
// out = the K best ids in ascending order. One streaming pass over the scores: ids go to a
// buffer of `cap` ids only when they beat the K-th best kept so far (an equal score loses the
// tie: its id is higher), and a full buffer is pruned to its K best. The buffer sees about
// K·log(n/K) ids instead of n, which matters when replay scores a 32K-entry source per row.
// Same set as ordering all n by (score desc, id asc): the order is total.
int select_topk(const float* score, int n, int K, runner::workspace& ws, int32_t* out) {
  if (K <= 0 || n <= 0) return 0;
  const int cap = std::max(4 * K, 256);
  int32_t* ord = grow(ws.order, (size_t)cap);
  const auto better = [score](int32_t a, int32_t b) {
    return score[a] > score[b] || (score[a] == score[b] && a < b);
  };
  float thr = k_neg_inf;  // an id enters when score > thr (−inf never does)
  int nv = 0;
  for (int i = 0; i < n; ++i) {
    if (!(score[i] > thr)) continue;
    ord[nv++] = i;
    if (nv == cap) {
      std::nth_element(ord, ord + (K - 1), ord + nv, better);
      nv = K;
      thr = score[ord[K - 1]];
    }
  }
  if (nv > K) {
    std::nth_element(ord, ord + K, ord + nv, better);
    nv = K;
  }
  std::sort(ord, ord + nv);
  std::memcpy(out, ord, sizeof(int32_t) * (size_t)nv);
  return nv;
}

// A block of consecutive rows of one segment against the packed index keys of its source,
// keys [t0, t1) (one core's share): index_rows_packed's unit of work.
struct index_block {
  const float* q;       // [rows, Hi, Di] indexer queries (RoPE'd, FP4 fake-quantised)
  const float* w;       // [rows, Hi] head weights (× 1/√Hi)
  const int* vis;       // [rows] entries each row may see, non-decreasing
  int rows, Hi, Di, K, cap, chunk, ldc;
  float sscale;
  const uint8_t* keys;  // the source's fp4_index entries
  size_t ib;            // bytes per entry
  const kc::fp4_index_queries* iq;  // q prepared for the integer scoring path
  float* bscore;        // [rows, nb] block maxima (candidate-source layer) or null
  int nb, bs;
  runner::workspace::index_worker* wk[2];
};

// Scores keys [t0, t1) for every row of the block, chunk by chunk (each key tile decoded once
// per chunk for all rows: kernels::fp4_index_score_rows), and feeds each row's visible scores,
// in ascending id order, to its running top-k in `wk` — select_topk's streaming pass, its state
// kept from chunk to chunk — and, at the candidate-source layer, to its block maxima.
// Entries a row may not see (t ≥ vis) are never kept and never raise a block maximum, as the
// −∞ they stand for in select_topk's input. At the candidate-source layer chunks are multiples
// of the candidate block size and start at multiples of it (t0 is), so each block maximum
// comes from one chunk.
void index_rows_range(const index_block& b, runner::workspace::index_worker& wk, int t0, int t1) {
  for (int i = 0; i < b.rows; ++i) {
    wk.n_kept[(size_t)i] = 0;
    wk.thr[(size_t)i] = b.K > 0 ? k_neg_inf : std::numeric_limits<float>::infinity();  // K = 0: keep nothing
  }
  int rf = 0;  // first row that sees any entry of the chunk (vis non-decreasing)
  for (int c0 = t0; c0 < t1; c0 += b.chunk) {
    while (rf < b.rows && b.vis[rf] <= c0) ++rf;
    if (rf == b.rows) break;
    const int cn = std::min(b.chunk, t1 - c0);
    float* cs0 = wk.chunk.data();
    kc::fp4_index_score_rows(*b.iq, rf, b.q + (size_t)rf * b.Hi * b.Di, b.w + (size_t)rf * b.Hi, b.rows - rf,
                             b.keys + (size_t)c0 * b.ib, cn, b.sscale, cs0, b.ldc);
    for (int i = rf; i < b.rows; ++i) {
      const float* cs = cs0 + (size_t)(i - rf) * b.ldc;  // cs[t - c0], t in [c0, c0 + cn)
      const int te = std::min(c0 + cn, b.vis[i]);
      scored_id* kept = wk.kept.data() + (size_t)i * b.cap;
      int nv = wk.n_kept[(size_t)i];
      float thr = wk.thr[(size_t)i];
      // select_topk's pass: t enters when its score beats thr (thr only rises, so the SIMD skip
      // of the ids at or below it is the scalar test of each id in turn)
      for (int t = c0; t < te; ++t) {
        t += kc::index_next_above(cs + (t - c0), te - t, thr);
        if (t >= te) break;
        kept[nv++] = scored_id{cs[t - c0], t};
        if (nv == b.cap) {
          std::nth_element(kept, kept + (b.K - 1), kept + nv, better_scored);
          nv = b.K;
          thr = kept[b.K - 1].s;
        }
      }
      wk.n_kept[(size_t)i] = nv;
      wk.thr[(size_t)i] = thr;
      if (b.bscore) {
        float* bm = b.bscore + (size_t)i * b.nb;
        for (int bk = c0 / b.bs; bk * b.bs < te; ++bk)
          bm[bk] = kc::index_block_max(cs + (bk * b.bs - c0), std::min(te, (bk + 1) * b.bs) - bk * b.bs);
      }
    }
  }
}

// Index top-k (and, at the candidate-source layer, candidate-block maxima) of `rows` consecutive
// rows of one segment over the source's packed keys. Same selection as scoring every row over
// every entry into [rows·Hi, ne] with kernels::fp4_index_dot, summing the heads and running
// select_topk: every score is the same products and sums (fp4_index_score_rows equals
// fp4_index_dot + the head sum), and the kept set is the K best by (score desc, id asc),
// however the ids are split. The keys are split over both cores when the work is above
// OpenBLAS's threading threshold: each core keeps its own running top-k of every row, and a
// row's result is the K best of the two (each holds the K best of its half).
// Out: topk [rows, K] ascending ids, topn [rows]; bscore [rows, nb] when candidate source.
void index_rows_packed(runner::workspace& ws, const float* q, const float* w, const int64_t* pos, int rows, int ratio,
                       int ne, int Hi, int Di, int K, float sscale, const uint8_t* keys, size_t ib, int nb, int bs,
                       bool cand_src, int32_t* topk, int* topn) {
  int* vis = grow(ws.vis, (size_t)rows);
  for (int i = 0; i < rows; ++i) vis[i] = (int)std::min<int64_t>(ne, (pos[i] + 1) / ratio);
  const int vis_last = vis[rows - 1];
  // whole key tiles per chunk and, at the candidate-source layer, whole candidate blocks
  const int align = cand_src ? std::lcm(16, std::max(1, bs)) : 16;
  const int chunk = std::max(1, 256 / align) * align;
  const int cap = std::max(4 * K, 256);
  kc::fp4_index_prepare_queries(q, rows, Hi, Di, ws.iq);  // once for every key chunk of both cores
  index_block b{q, w, vis, rows, Hi, Di, K, cap, chunk, chunk + 16, sscale, keys, ib, &ws.iq, nullptr, nb, bs, {}};
  if (cand_src) {
    b.bscore = grow(ws.bscore, (size_t)rows * std::max(1, nb));
    std::fill(b.bscore, b.bscore + (size_t)rows * nb, k_neg_inf);
  }
  const bool split = (int64_t)rows * Hi * vis_last * Di >= (1 << 18) && vis_last >= 2 * align;
  for (int k = 0; k < (split ? 2 : 1); ++k) {
    runner::workspace::index_worker& wk = ws.iw[k];
    grow(wk.chunk, (size_t)rows * b.ldc);
    grow(wk.kept, (size_t)rows * cap);
    grow(wk.n_kept, (size_t)rows);
    grow(wk.thr, (size_t)rows);
    b.wk[k] = &wk;
  }
  if (split) {
    const int mid = vis_last / 2 / align * align;
    ws.helper.post(
        [](void* p, int t0, int t1) {
          const index_block& bb = *static_cast<const index_block*>(p);
          index_rows_range(bb, *bb.wk[1], t0, t1);
        },
        &b, mid, vis_last);
    index_rows_range(b, *b.wk[0], 0, mid);
    ws.helper.wait();
  } else {
    index_rows_range(b, *b.wk[0], 0, vis_last);
  }
  for (int i = 0; i < rows; ++i) {
    scored_id* kept = b.wk[0]->kept.data() + (size_t)i * cap;
    int nv = b.wk[0]->n_kept[(size_t)i];
    if (split) {
      // each half down to its K best, then the second half's after the first's (2K ≤ cap)
      if (nv > K) {
        std::nth_element(kept, kept + K, kept + nv, better_scored);
        nv = K;
      }
      scored_id* k1 = b.wk[1]->kept.data() + (size_t)i * cap;
      int n1 = b.wk[1]->n_kept[(size_t)i];
      if (n1 > K) {
        std::nth_element(k1, k1 + K, k1 + n1, better_scored);
        n1 = K;
      }
      std::copy_n(k1, n1, kept + nv);
      nv += n1;
    }
    if (nv > K) {
      std::nth_element(kept, kept + K, kept + nv, better_scored);
      nv = K;
    }
    int32_t* out = topk + (size_t)i * K;
    for (int j = 0; j < nv; ++j) out[j] = kept[j].id;
    std::sort(out, out + nv);
    topn[i] = nv;
  }
}

// Candidate pool of row r at the candidate-source layer from its block maxima `bscore` [nb]
// (overwritten): the block of the newest visible entry pinned, the candidate_topk_blocks best
// blocks marked in ws.cand.
void choose_candidates(const model_config& c, runner::workspace& ws, int r, int64_t p, int ratio, float* bscore,
                       int nb, int bs) {
  uint8_t* cm = ws.cand.data() + (size_t)r * ws.cand_blocks;
  std::fill(cm, cm + ws.cand_blocks, 0);
  const int64_t last = (((p + 1) / ratio) - 1) >= 0 ? ((p + 1) / ratio - 1) / bs : -1;
  if (last >= 0 && last < nb) bscore[last] = std::numeric_limits<float>::infinity();
  const int nk = std::min(c.candidate_topk_blocks, nb);
  int32_t* bsel = grow(ws.bsel, (size_t)std::max(1, nb));
  const int got = select_topk(bscore, nb, nk, ws, bsel);
  for (int j = 0; j < got; ++j) cm[bsel[j]] = 1;
}

// Indexer of index-source layer l: top-k entry ids per row into ws.topk / ws.topk_n.
void indexer_forward(const engine& e, int l, const float* x, const float* qr, int R,
                     runner::workspace& ws, forward_trace* trace) {
  const model_config& c = e.config();
  const layer_info& li = c.layers[(size_t)l];
  const indexer_weights& w = e.block(l).attn.indexer;
  const int Hi = c.index_n_heads, Di = c.index_head_dim;
  const int K = c.index_topk, ratio = li.ratio, np = c.qk_rope_head_dim / 2;
  float* qi = grow(ws.qi, (size_t)R * Hi * Di);
  kc::qgemm_nt(R, qr, w.wq_b, qi);
  float* wt = grow(ws.wts, (size_t)R * Hi);
  kc::qgemm_nt(R, x, w.weights_proj, wt);
  const float wscale = 1.0f / std::sqrt((float)Hi), sscale = 1.0f / std::sqrt((float)Di);
  float* cs = grow(ws.cos, (size_t)np);
  float* sn = grow(ws.sin, (size_t)np);
  for (int r = 0; r < R; ++r) {
    e.compress_rope().at(ws.pos[(size_t)r], cs, sn);
    const bool quant = ws.segs[(size_t)ws.seg_of[(size_t)r]].seq->rounds(kv_part_index);
    for (int h = 0; h < Hi; ++h) {
      float* qh = qi + ((size_t)r * Hi + h) * Di;
      kc::rope_interleaved(qh, Di, np, cs, sn, false);
      if (quant) kc::fp4_index_fake_quant(qh, Di);
    }
    for (int h = 0; h < Hi; ++h) wt[(size_t)r * Hi + h] *= wscale;
  }
  int32_t* topk = grow(ws.topk, (size_t)R * K);
  int* topn = grow(ws.topk_n, (size_t)R);
  const bool cand_src = li.candidate_source, cand_use = li.candidate_restricted;
  const int bs = c.candidate_block_size;
  std::vector<int32_t>* tr_topk = nullptr;
  if (trace) {
    tr_topk = &trace->topk[l];
    tr_topk->assign((size_t)R * K, -1);
  }
  if (cand_src) {
    // One row stride for the whole batch: the most blocks any segment has.
    int mb = 1;
    for (const segment& s : ws.segs)
      mb = std::max(mb, (int)((s.seq->source(s.seq->source_of_layer(li.kv_source)).n_entries + bs - 1) / bs));
    ws.cand_blocks = mb;
    grow(ws.cand, (size_t)R * mb);
  }
  for (const segment& s_all : ws.segs) {
    // a replay's hinted rows: the selections the exact pass made, no scoring
    segment s = s_all;
    for (int i = s.n - s.hinted; i < s.n; ++i) {
      const int r = s.row0 + i;
      const int32_t* h = s.seq->selection(l, ws.pos[(size_t)r]);
      int n = 0;
      while (n < K && h[n] >= 0) ++n;
      std::copy_n(h, n, topk + (size_t)r * K);
      topn[r] = n;
      if (tr_topk) std::copy_n(h, n, tr_topk->data() + (size_t)r * K);
    }
    s.n -= s.hinted;
    if (s.n <= 0) continue;
    const int src_i = s.seq->source_of_layer(li.kv_source);
    const kv_source_state& st = s.seq->source(src_i);
    const int ne = (int)st.n_entries;
    // The keys as stored: FP4 bytes (scored in place) or, f32_diagnostic, fp32 rows.
    const float* kf = s.seq->index_f32(src_i);
    const size_t ib = s.seq->index_entry_bytes();
    const int nb = (ne + bs - 1) / bs;
    if (cand_src) {
      if (trace) {
        trace->candidates_width = ne;
        trace->candidates.assign((size_t)R * ne, 0);
      }
    }
    if (cand_use && ne > 0) {
      // Restricted layer: only entries of the row's candidate blocks (chosen at the candidate
      // source layer) can be selected, so only they are scored: [Hi, n_cand] per row instead
      // of [Hi, ne]. The same products and sums as scoring every entry: the selection is the same.
      const int cap_ids = std::min(ne, ws.cand_blocks * bs);
      int32_t* ids = grow(ws.cand_ids, (size_t)std::max(1, cap_ids));
      float* kg = kf ? grow(ws.cand_keys, (size_t)std::max(1, cap_ids) * Di) : nullptr;
      float* cscore = grow(ws.iscore, (size_t)std::max(1, cap_ids));
      int32_t* ctop = grow(ws.cand_top, (size_t)K);
      // FP4 keys: the segment's queries in integer form once (fp4_index_score_rows' exact path)
      if (!kf) kc::fp4_index_prepare_queries(qi + (size_t)s.row0 * Hi * Di, s.n, Hi, Di, ws.iq);
      for (int i = 0; i < s.n; ++i) {
        const int r = s.row0 + i;
        const int64_t p = ws.pos[(size_t)r];
        const int vis = (int)std::min<int64_t>(ne, (p + 1) / ratio);
        const uint8_t* cm = ws.cand.data() + (size_t)r * ws.cand_blocks;
        int nc = 0;
        for (int bk = 0; bk < nb && bk * bs < vis; ++bk) {
          if (!cm[bk]) continue;
          const int t1 = std::min(vis, (bk + 1) * bs);
          for (int t = bk * bs; t < t1; ++t) ids[nc++] = t;
          if (kg)
            std::memcpy(kg + (size_t)(nc - (t1 - bk * bs)) * Di, kf + (size_t)bk * bs * Di,
                        sizeof(float) * (size_t)(t1 - bk * bs) * Di);
        }
        int got = 0;
        if (nc > 0 && !kg) {
          // each run of consecutive candidate entries (whole candidate blocks) scored from its
          // FP4 bytes, heads folded in: the same floats as the fp32 path below (fp4_dot.hpp)
          for (int j0 = 0; j0 < nc;) {
            int j1 = j0 + 1;
            while (j1 < nc && ids[j1] == ids[j1 - 1] + 1) ++j1;
            kc::fp4_index_score_rows(ws.iq, i, qi + (size_t)r * Hi * Di, wt + (size_t)r * Hi, 1,
                                     st.index.data() + (size_t)ids[j0] * ib, j1 - j0, sscale, cscore + j0, nc);
            j0 = j1;
          }
          got = select_topk(cscore, nc, K, ws, ctop);
        } else if (nc > 0) {
          float* sc = grow(ws.sc, (size_t)Hi * nc);
          kc::gemm_nt(Hi, nc, Di, qi + (size_t)r * Hi * Di, kg, sc);
          const float* wr = wt + (size_t)r * Hi;
          for (int t = 0; t < nc; ++t) cscore[t] = 0.0f;
          for (int h = 0; h < Hi; ++h) {
            const float* sh = sc + (size_t)h * nc;
            const float wh = wr[h];
            for (int t = 0; t < nc; ++t) cscore[t] += std::max(sh[t], 0.0f) * sscale * wh;
          }
          got = select_topk(cscore, nc, K, ws, ctop);
        }
        for (int j = 0; j < got; ++j) topk[(size_t)r * K + j] = ids[ctop[j]];
        topn[r] = got;
        if (tr_topk)
          std::memcpy(tr_topk->data() + (size_t)r * K, topk + (size_t)r * K, sizeof(int32_t) * (size_t)got);
      }
      continue;
    }
    if (!kf && ne > 0) {
      // Packed keys: blocks of rows scored chunk by chunk, each key tile decoded once per block
      // (replay's and chunked prefill's rows), straight into each row's running top-k.
      constexpr int k_block_rows = 128;
      for (int b0 = 0; b0 < s.n; b0 += k_block_rows) {
        const int nrow = std::min(k_block_rows, s.n - b0);
        const int r0 = s.row0 + b0;
        index_rows_packed(ws, qi + (size_t)r0 * Hi * Di, wt + (size_t)r0 * Hi, ws.pos.data() + r0, nrow, ratio, ne,
                          Hi, Di, K, sscale, st.index.data(), ib, nb, bs, cand_src, topk + (size_t)r0 * K, topn + r0);
        for (int i = 0; i < nrow; ++i) {
          const int r = r0 + i;
          if (cand_src) {
            choose_candidates(c, ws, r, ws.pos[(size_t)r], ratio, ws.bscore.data() + (size_t)i * nb, nb, bs);
            if (trace) {
              const uint8_t* cm = ws.cand.data() + (size_t)r * ws.cand_blocks;
              for (int t = 0; t < ne; ++t) trace->candidates[(size_t)r * ne + t] = cm[t / bs];
            }
          }
          if (tr_topk)
            std::memcpy(tr_topk->data() + (size_t)r * K, topk + (size_t)r * K, sizeof(int32_t) * (size_t)topn[r]);
        }
      }
      continue;
    }
    // fp32 keys (f32_diagnostic) or no entries yet: rows in blocks so the [rows·Hi, ne] score
    // block stays small.
    const int rb = std::max(1, std::min(s.n, (int)(4000000 / std::max<int64_t>(1, (int64_t)Hi * ne))));
    float* iscore = grow(ws.iscore, (size_t)std::max(1, ne));
    for (int b0 = 0; b0 < s.n; b0 += rb) {
      const int nrow = std::min(rb, s.n - b0);
      float* sc = nullptr;
      if (ne > 0) {
        sc = grow(ws.sc, (size_t)nrow * Hi * ne);
        kc::gemm_nt(nrow * Hi, ne, Di, qi + (size_t)(s.row0 + b0) * Hi * Di, kf, sc);
      }
      for (int i = 0; i < nrow; ++i) {
        const int r = s.row0 + b0 + i;
        const int64_t p = ws.pos[(size_t)r];
        const int vis = (int)std::min<int64_t>(ne, (p + 1) / ratio);
        const float* wr = wt + (size_t)r * Hi;
        for (int t = 0; t < ne; ++t) iscore[t] = k_neg_inf;
        for (int t = 0; t < vis; ++t) iscore[t] = 0.0f;
        for (int h = 0; h < Hi && vis > 0; ++h) {
          const float* sh = sc + ((size_t)i * Hi + h) * ne;
          const float wh = wr[h];
          for (int t = 0; t < vis; ++t) iscore[t] += std::max(sh[t], 0.0f) * sscale * wh;
        }
        if (cand_src) {
          // block score = max over its entries
          float* bscore = grow(ws.tmp, (size_t)std::max(1, nb));
          for (int bk = 0; bk < nb; ++bk) {
            float m = k_neg_inf;
            for (int t = bk * bs; t < std::min(ne, (bk + 1) * bs); ++t) m = std::max(m, iscore[t]);
            bscore[bk] = m;
          }
          choose_candidates(c, ws, r, p, ratio, bscore, nb, bs);
          const uint8_t* cm = ws.cand.data() + (size_t)r * ws.cand_blocks;
          if (trace)
            for (int t = 0; t < ne; ++t) trace->candidates[(size_t)r * ne + t] = cm[t / bs];
        } else if (cand_use) {
          const uint8_t* cm = ws.cand.data() + (size_t)r * ws.cand_blocks;
          for (int t = 0; t < vis; ++t)
            if (!cm[t / bs]) iscore[t] = k_neg_inf;
        }
        topn[r] = select_topk(iscore, ne, K, ws, topk + (size_t)r * K);
        if (tr_topk)
          std::memcpy(tr_topk->data() + (size_t)r * K, topk + (size_t)r * K, sizeof(int32_t) * (size_t)topn[r]);
      }
    }
  }
  // New rows' selections become the sequence's resume hints (only the rows a replay can reach;
  // a replay's own rows are not recorded: the hints stay the exact pass's).
  for (const segment& s : ws.segs) {
    if (s.replay) continue;
    for (int i = std::max(0, s.n - s.seq->selection_capacity()); i < s.n; ++i) {
      const int r = s.row0 + i;
      s.seq->note_selection(l, ws.pos[(size_t)r], topk + (size_t)r * K, topn[r]);
    }
  }
}


// Attention of layer l over the current rows: y [R, d]. Writes the rows' SWA entries into
// the layer's ring after every row of a segment has read the window it needs.
void attention_forward(const engine& e, int l, const float* x, int R, runner::workspace& ws,
                       float* y, forward_trace* trace) {
  const model_config& c = e.config();
  const layer_info& li = c.layers[(size_t)l];
  const attention_weights& a = e.block(l).attn;
  const int hd = c.head_dim, H = c.num_attention_heads;
  const int ql = c.q_lora_rank, G = c.o_groups, orank = c.o_lora_rank, W = c.sliding_window;
  const int np = c.qk_rope_head_dim / 2, K = c.index_topk;
  const rope_table& rope = layer_rope(e, l);

  float* qr = grow(ws.qr, (size_t)R * ql);
  kc::qgemm_nt(R, x, a.wq_a, qr);
  kc::rmsnorm_rows(qr, a.q_norm.data(), R, ql, c.rms_norm_eps, qr);
  float* q = grow(ws.q, (size_t)R * H * hd);
  kc::qgemm_nt(R, qr, a.wq_b, q);
  float* kv = grow(ws.kv, (size_t)R * hd);
  kc::qgemm_nt(R, x, a.wkv, kv);
  kc::rmsnorm_rows(kv, a.kv_norm.data(), R, hd, c.rms_norm_eps, kv);
  float* cs = grow(ws.cos, (size_t)np);
  float* sn = grow(ws.sin, (size_t)np);
  for (int r = 0; r < R; ++r) {
    rope.at(ws.pos[(size_t)r], cs, sn);
    for (int h = 0; h < H; ++h) kc::rope_interleaved(q + ((size_t)r * H + h) * hd, hd, np, cs, sn, false);
    kc::rope_interleaved(kv + (size_t)r * hd, hd, np, cs, sn, false);
    if (ws.segs[(size_t)ws.seg_of[(size_t)r]].seq->rounds(kv_part_swa)) kc::fp8_swa_fake_quant(kv + (size_t)r * hd, hd);
  }
  if (li.ratio > 0 && a.has_indexer) indexer_forward(e, l, x, qr, R, ws, trace);

  const float scale = 1.0f / std::sqrt((float)hd);
  float* o = grow(ws.o, (size_t)R * H * hd);
  // Window keys of every segment in one buffer: [ring rows before pos0; this call's rows].
  const int S = (int)ws.segs.size();
  grow(ws.seg_prior_lo, (size_t)S);
  grow(ws.seg_kv_off, (size_t)S);
  size_t total = 0;
  for (int si = 0; si < S; ++si) {
    const segment& s = ws.segs[(size_t)si];
    const int64_t prior_lo = std::max<int64_t>({s.seq->ring(l).first_pos, s.pos0 - W + 1, 0});
    ws.seg_prior_lo[(size_t)si] = prior_lo;
    ws.seg_kv_off[(size_t)si] = total;
    total += (size_t)(s.pos0 - prior_lo + s.n);
  }
  float* kvall = grow(ws.kvbuf, std::max<size_t>(1, total) * hd);
  for (int si = 0; si < S; ++si) {
    const segment& s = ws.segs[(size_t)si];
    const int64_t prior_lo = ws.seg_prior_lo[(size_t)si];
    const int n_prior = (int)(s.pos0 - prior_lo);
    float* kvb = kvall + ws.seg_kv_off[(size_t)si] * hd;
    for (int j = 0; j < n_prior; ++j) s.seq->swa_entry(l, prior_lo + j, kvb + (size_t)j * hd);
    std::memcpy(kvb + (size_t)n_prior * hd, kv + (size_t)s.row0 * hd, sizeof(float) * (size_t)s.n * hd);
  }
  // Rows [r0, r1), heads [h0, h1), on worker w (its own scratch); rows and heads are
  // independent.
  auto rows = [&](int r0, int r1, int w, int h0, int h1) {
    if (h1 < 0) h1 = H;  // -1: every head
    const int nh = h1 - h0;
    std::vector<float>& kc_buf = ws.kc_w[w];
    std::vector<float>& lg_buf = ws.logit_w[w];
    for (int r = r0; r < r1; ++r) {
      const int si = ws.seg_of[(size_t)r];
      const segment& s = ws.segs[(size_t)si];
      const int64_t prior_lo = ws.seg_prior_lo[(size_t)si];
      const float* kvb = kvall + ws.seg_kv_off[(size_t)si] * hd;
      const int src_i = li.ratio > 0 ? s.seq->source_of_layer(li.kv_source) : -1;
      const int64_t p = ws.pos[(size_t)r];
      const int64_t lo = std::max<int64_t>(prior_lo, p - W + 1);
      const int nw = (int)(p - lo + 1);
      const float* kw = kvb + (size_t)(lo - prior_lo) * hd;
      const int nc = src_i >= 0 ? ws.topk_n[(size_t)r] : 0;
      // the row's selected global entries, dequantised from their FP4 bytes: [nc, hd]
      float* kcm = grow(kc_buf, (size_t)std::max(1, nc) * hd);
      for (int j = 0; j < nc; ++j) s.seq->main_entry(src_i, ws.topk[(size_t)r * K + j], kcm + (size_t)j * hd);
      const int ld = nw + nc;
      float* lg = grow(lg_buf, (size_t)nh * ld);
      const float* qrow = q + ((size_t)r * H + h0) * hd;
      kc::gemm_nt_ld(nh, nw, hd, qrow, hd, kw, hd, lg, ld, scale, 0.0f);
      if (nc > 0) kc::gemm_nt_ld(nh, nc, hd, qrow, hd, kcm, hd, lg + nw, ld, scale, 0.0f);
      for (int h = h0; h < h1; ++h) {
        // softmax over [logits, sink]; the sink only enlarges the denominator
        float* lh = lg + (size_t)(h - h0) * ld;
        const float sink = a.attn_sink[(size_t)h];
        float mx = sink;
        for (int t = 0; t < ld; ++t) mx = std::max(mx, lh[t]);
        float den = std::exp(sink - mx);
        for (int t = 0; t < ld; ++t) {
          lh[t] = std::exp(lh[t] - mx);
          den += lh[t];
        }
        const float inv = 1.0f / den;
        for (int t = 0; t < ld; ++t) lh[t] *= inv;
      }
      float* orow = o + ((size_t)r * H + h0) * hd;
      kc::gemm_nn_ld(nh, hd, nw, lg, ld, kw, hd, orow, hd, 1.0f, 0.0f);
      if (nc > 0) kc::gemm_nn_ld(nh, hd, nc, lg + nw, ld, kcm, hd, orow, hd, 1.0f, 1.0f);
    }
  };
  // Both cores (OpenBLAS runs on the calling thread: qmatmul.hpp): rows split in two, or for
  // one row with enough work (decode at batch 1) its heads; each half dequantises the row's
  // selected entries itself.
  using rows_t = decltype(rows);
  if (R >= 2) {
    ws.helper.post([](void* f, int r0, int r1) { (*static_cast<rows_t*>(f))(r0, r1, 1, 0, -1); }, &rows, R / 2, R);
    rows(0, R / 2, 0, 0, H);
    ws.helper.wait();
  } else if (R == 1 && H >= 2 && (int64_t)H * (W + K) * hd >= (1 << 16)) {
    ws.helper.post([](void* f, int h0, int h1) { (*static_cast<rows_t*>(f))(0, 1, 1, h0, h1); }, &rows, H / 2, H);
    rows(0, 1, 0, 0, H / 2);
    ws.helper.wait();
  } else {
    rows(0, R, 0, 0, H);
  }
  for (const segment& s : ws.segs)
    for (int i = std::max(0, s.n - W); i < s.n; ++i)
      s.seq->swa_write(l, s.pos0 + i, kv + (size_t)(s.row0 + i) * hd);
  // K = V carried RoPE: remove the query position's rotation, then the grouped projection.
  for (int r = 0; r < R; ++r) {
    rope.at(ws.pos[(size_t)r], cs, sn);
    for (int h = 0; h < H; ++h) kc::rope_interleaved(o + ((size_t)r * H + h) * hd, hd, np, cs, sn, true);
  }
  const int gin = H * hd / G;
  float* oa = grow(ws.oa, (size_t)R * G * orank);
  for (int g = 0; g < G; ++g)
    kc::qgemm_nt(R, o + (size_t)g * gin, H * hd, a.wo_a.slice_rows((int64_t)g * orank, orank),
                 oa + (size_t)g * orank, G * orank, 1.0f, 0.0f);
  kc::qgemm_nt(R, oa, a.wo_b, y);
}

// Keeps only each CED segment's last sliding_window rows (the decoder tail), compacting every
// per-row buffer still needed, and starts those sequences' decoder rings afresh at the tail.
int ced_cut(const engine& e, int R, runner::workspace& ws) {
  const model_config& c = e.config();
  const int W = c.sliding_window, hc = c.hc_mult, d = (int)c.hidden_size;
  std::vector<int>& keep = ws.keep;
  keep.clear();
  int row = 0;
  for (segment& s : ws.segs) {
    int k0 = 0;
    if (s.ced_cut && s.n > W) {
      k0 = s.n - W;
      for (int l = c.first_decoder_layer; l < c.num_hidden_layers; ++l)
        s.seq->set_ring_first_pos(l, s.pos0 + k0);
    }
    for (int i = k0; i < s.n; ++i) keep.push_back(s.row0 + i);
    s.pos0 += k0;
    s.n -= k0;
    s.row0 = row;
    row += s.n;
  }
  if (row == R) return R;
  const int nl = e.engram().n_layers, ncol = e.engram().n_cols();
  auto compact = [&](auto* base, size_t width) {
    for (int j = 0; j < (int)keep.size(); ++j)
      if (keep[(size_t)j] != j)
        std::memmove(base + (size_t)j * width, base + (size_t)keep[(size_t)j] * width, sizeof(*base) * width);
  };
  compact(ws.X.data(), (size_t)hc * d);
  compact(ws.apre.data(), (size_t)hc);
  compact(ws.post.data(), (size_t)hc);
  compact(ws.comb.data(), (size_t)hc * hc);
  compact(ws.x.data(), (size_t)d);
  compact(ws.tok.data(), 1);
  compact(ws.pos.data(), 1);
  compact(ws.seg_of.data(), 1);
  if (nl > 0) compact(ws.hash.data(), (size_t)nl * ncol);
  return row;
}

// One backbone block over the current rows. Returns the row count (CED may shrink it).
int block_forward(const engine& e, int l, int R, bool ced, runner::workspace& ws, forward_trace* trace) {
  const model_config& c = e.config();
  const block_weights& b = e.block(l);
  const layer_info& li = c.layers[(size_t)l];
  const int hc = c.hc_mult, d = (int)c.hidden_size;
  float* X = ws.X.data();
  if (li.engram) {
    int eli = 0;
    while (c.engram_layer_ids[(size_t)eli] != l) ++eli;
    engram_apply(e, l, eli, X, R, ws);
  }
  // --- attention site ---
  hc_mixes(c, X, R, b.hc_attn_fn, b.hc_attn_base, b.hc_attn_scale, ws, grow(ws.apre, (size_t)R * hc),
           grow(ws.post, (size_t)R * hc), grow(ws.comb, (size_t)R * hc * hc));
  float* x = grow(ws.x, (size_t)R * d);
  hc_collapse(X, ws.pre.data(), R, hc, d, x);
  kc::rmsnorm_rows(x, b.attn_norm.data(), R, d, c.rms_norm_eps, x);
  if (b.attn.has_compressor) compressor_forward(e, l, x, R, ws);
  if (ced && l == c.first_decoder_layer) {
    R = ced_cut(e, R, ws);
    X = ws.X.data();
    x = ws.x.data();
  }
  float* y = grow(ws.y, (size_t)R * d);
  attention_forward(e, l, x, R, ws, y, trace);
  hc_expand(X, y, ws.post.data(), ws.comb.data(), R, hc, d, ws.tmp);
  // --- FFN site: collapse with the attention site's pre; its own pre goes to the next block ---
  hc_mixes(c, X, R, b.hc_ffn_fn, b.hc_ffn_base, b.hc_ffn_scale, ws, grow(ws.pre, (size_t)R * hc),
           ws.post.data(), ws.comb.data());
  hc_collapse(X, ws.apre.data(), R, hc, d, x);
  kc::rmsnorm_rows(x, b.ffn_norm.data(), R, d, c.rms_norm_eps, x);
  moe_forward(e, l, x, R, ws, y);
  hc_expand(X, y, ws.post.data(), ws.comb.data(), R, hc, d, ws.tmp);
  return R;
}

// Runs ws.segs (rows' tokens in ws.tok) through the model; logits of the output rows (every
// row that reached the head when all_logits, else each segment's last row) into `logits`.
void run_rows(const engine& e, runner::workspace& ws, bool ced, bool all_logits, forward_trace* trace,
              std::vector<float>& logits) {
  const model_config& c = e.config();
  const int hc = c.hc_mult, d = (int)c.hidden_size;
  int R = 0;
  for (const segment& s : ws.segs) R += s.n;
  grow(ws.pos, (size_t)R);
  grow(ws.seg_of, (size_t)R);
  for (size_t si = 0; si < ws.segs.size(); ++si) {
    const segment& s = ws.segs[si];
    for (int i = 0; i < s.n; ++i) {
      ws.pos[(size_t)(s.row0 + i)] = s.pos0 + i;
      ws.seg_of[(size_t)(s.row0 + i)] = (int)si;
    }
  }
  float* X = grow(ws.X, (size_t)R * hc * d);
  for (int r = 0; r < R; ++r) {
    // the token's embedding row, dequantised from the checkpoint's dtype, into every stream
    float* xr = X + (size_t)r * hc * d;
    kc::dequant_rows(e.embed(), ws.tok[(size_t)r], 1, xr);
    for (int k = 1; k < hc; ++k) std::memcpy(xr + (size_t)k * d, xr, sizeof(float) * (size_t)d);
  }
  float* pre = grow(ws.pre, (size_t)R * hc);
  for (int r = 0; r < R; ++r)
    for (int k = 0; k < hc; ++k) pre[r * hc + k] = k == 0 ? 1.0f : 0.0f;
  engram_hash_rows(e, ws);
  ws.cand_blocks = 0;
  const bool trace_layers = trace && !ced;
  if (trace_layers) trace->layer_out.assign((size_t)c.num_hidden_layers * R * hc * d, 0.0f);
  const int R0 = R;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    R = block_forward(e, l, R, ced, ws, trace);
    if (trace_layers && R == R0)
      std::memcpy(trace->layer_out.data() + (size_t)l * R * hc * d, ws.X.data(), sizeof(float) * (size_t)R * hc * d);
  }
  std::vector<int>& rows = ws.out_rows;
  rows.clear();
  for (const segment& s : ws.segs) {
    if (all_logits)
      for (int i = 0; i < s.n; ++i) rows.push_back(s.row0 + i);
    else
      rows.push_back(s.row0 + s.n - 1);
  }
  const int n_out = (int)rows.size();
  float* hin = grow(ws.head_in, (size_t)n_out * d);
  for (int j = 0; j < n_out; ++j) {
    const int r = rows[(size_t)j];
    hc_collapse(ws.X.data() + (size_t)r * hc * d, ws.pre.data() + (size_t)r * hc, 1, hc, d, hin + (size_t)j * d);
  }
  kc::rmsnorm_rows(hin, e.norm().data(), n_out, d, c.rms_norm_eps, hin);
  logits.resize((size_t)n_out * c.vocab_size);
  kc::qgemm_nt(n_out, hin, e.head(), logits.data());
}

status check_tokens(const model_config& c, std::span<const int32_t> t) {
  for (size_t i = 0; i < t.size(); ++i)
    if (t[i] < 0 || t[i] >= c.vocab_size)
      return make_error(errc::invalid_argument, "token " + std::to_string(i) + " has id " + std::to_string(t[i]) +
                                                    ", outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")");
  return {};
}

status check_sequence(const model_config& c, const sequence& s) {
  const model_config& sc = s.config();
  if (sc.num_hidden_layers != c.num_hidden_layers || sc.head_dim != c.head_dim ||
      sc.hidden_size != c.hidden_size || sc.sliding_window != c.sliding_window ||
      sc.kv_source_layer_ids != c.kv_source_layer_ids || sc.index_head_dim != c.index_head_dim)
    return make_error(errc::mismatch, "sequence was created for a different model config");
  return {};
}

void commit(const engine& e, sequence& s, const int32_t* t, int n, std::vector<int64_t>& comp) {
  const std::vector<int64_t>& tm = e.engram_token_map();
  comp.resize((size_t)n);
  for (int i = 0; i < n; ++i) comp[(size_t)i] = tm.empty() ? 0 : tm[(size_t)t[i]];
  s.append_tokens(t, n, comp.data());
}

}  // namespace

// ============================================================================================
// Public API
// ============================================================================================
status check_prefill(const model_config& c, const sequence& seq, std::span<const int32_t> tokens) {
  CEDAR_TRY(check_sequence(c, seq));
  if (tokens.empty()) return make_error(errc::invalid_argument, "prefill: no tokens");
  CEDAR_TRY(check_tokens(c, tokens));
  if (seq.n_tokens() + (int64_t)tokens.size() > c.max_position_embeddings)
    return make_error(errc::invalid_argument, "prefill: " + std::to_string(seq.n_tokens() + (int64_t)tokens.size()) +
                                                  " positions exceed max_position_embeddings = " +
                                                  std::to_string(c.max_position_embeddings));
  return {};
}

result<logits_rows> runner::prefill(sequence& seq, std::span<const int32_t> tokens,
                                    const prefill_options& opt) {
  const model_config& c = e_.config();
  CEDAR_TRY(check_prefill(c, seq, tokens));
  workspace& ws = *ws_;
  const bool ced = opt.mode == prefill_mode::ced;
  const int T = (int)tokens.size();
  ws.segs.assign(1, segment{&seq, 0, T, seq.n_tokens(), false, ced});
  ws.tok.assign(tokens.begin(), tokens.end());
  logits_rows out;
  run_rows(e_, ws, ced, opt.all_logits, opt.trace, out.values);
  const segment& s = ws.segs[0];
  out.n_rows = opt.all_logits ? s.n : 1;
  out.first_pos = opt.all_logits ? s.pos0 : s.pos0 + s.n - 1;
  commit(e_, seq, tokens.data(), T, ws.comp);
  return out;
}

result<int64_t> replay_start(const model_config& c, const sequence& seq, int n) {
  CEDAR_TRY(check_sequence(c, seq));
  const int64_t N = seq.n_tokens();
  if (n <= 0 || n > N)
    return make_error(errc::invalid_argument, "replay: n = " + std::to_string(n) + " must be in [1, " +
                                                  std::to_string(N) + "] (the sequence's tokens)");
  int64_t start = N - n, align = 1;
  for (int i = 0; i < seq.n_sources(); ++i) align = std::lcm(align, (int64_t)seq.source(i).ratio);
  return start - start % align;
}

status check_decode_batch(const model_config& c, std::span<sequence* const> seqs, std::span<const int32_t> tokens) {
  if (seqs.empty() || seqs.size() != tokens.size())
    return make_error(errc::invalid_argument, "decode_step: need one token per sequence (got " +
                                                  std::to_string(seqs.size()) + " sequences, " +
                                                  std::to_string(tokens.size()) + " tokens)");
  CEDAR_TRY(check_tokens(c, tokens));
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (!seqs[i]) return make_error(errc::invalid_argument, "decode_step: null sequence");
    CEDAR_TRY(check_sequence(c, *seqs[i]));
    if (seqs[i]->n_tokens() + 1 > c.max_position_embeddings)
      return make_error(errc::invalid_argument, "decode_step: sequence " + std::to_string(i) +
                                                    " is at max_position_embeddings");
    for (size_t j = 0; j < i; ++j)
      if (seqs[j] == seqs[i])
        return make_error(errc::invalid_argument, "decode_step: a sequence appears twice in the batch");
  }
  return {};
}

status runner::decode_step(std::span<sequence* const> seqs, std::span<const int32_t> tokens,
                           std::vector<float>& logits) {
  CEDAR_TRY(check_decode_batch(e_.config(), seqs, tokens));
  workspace& ws = *ws_;
  ws.segs.clear();
  for (size_t i = 0; i < seqs.size(); ++i)
    ws.segs.push_back(segment{seqs[i], (int)i, 1, seqs[i]->n_tokens(), false, false});
  ws.tok.assign(tokens.begin(), tokens.end());
  run_rows(e_, ws, false, false, nullptr, logits);
  for (size_t i = 0; i < seqs.size(); ++i) commit(e_, *seqs[i], &tokens[i], 1, ws.comp);
  return {};
}

result<logits_rows> runner::replay(sequence& seq, int n, bool use_hints, forward_trace* trace) {
  const model_config& c = e_.config();
  auto first = replay_start(c, seq, n);
  if (!first) return first.take_err();
  const int64_t N = seq.n_tokens(), start = *first;
  for (int l = 0; l < c.num_hidden_layers; ++l) seq.set_ring_first_pos(l, start);
  workspace& ws = *ws_;
  ws.segs.assign(1, segment{&seq, 0, (int)(N - start), start, true, false});
  if (use_hints) ws.segs[0].hinted = (int)(N - std::max(start, seq.selections_from()));
  ws.tok.assign(seq.tokens().begin() + start, seq.tokens().end());
  logits_rows out;
  run_rows(e_, ws, false, false, trace, out.values);
  out.n_rows = 1;
  out.first_pos = N - 1;
  return out;
}

}  // namespace cedar::model
