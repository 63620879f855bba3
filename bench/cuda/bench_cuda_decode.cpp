// bench_cuda_decode — decode steps of the cuda backend (model/cuda_decoder.cpp) end to end on
// the GPU: tokens in, logits and the new cache bytes back in the host sequences, at contexts
// 8K / 32K / 128K and batches 1 / 8 / 64, for the shipped default model and a ~1.2B-parameter
// random model of the same architecture (BF16 checkpoint written first). Each point is printed
// beside the bandwidth roofline: bytes a step must read (every weight matrix once, the routed
// experts the batch selects — expected distinct experts for B rows —, the head; per row and
// layer the SWA window, the selected FP4 entries, and every visible FP4 index key of the
// index layers) ÷ the device's measured copy bandwidth (cudaMemcpy device to device, same run).
//
// Contexts are synthetic: a sequence is restored from random but well-formed packed pages
// (FP4 codes with sane scales, FP8 ring entries) of N tokens with full SWA rings, then copied
// B times; the work per step does not depend on the values. The default model's
// max_position_embeddings (65536) is raised for the 128K point (timing only, printed).
//
// Usage: bench_cuda_decode [--models default,rand1b] [--contexts 8192,32768,131072]
//                          [--batches 1,8,64] [--steps N] [--csv FILE] [--quick] [--help]
#include <cuda_runtime.h>
#include <cxxabi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <sstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.hpp"
#include "kernels/cuda/launch_profiler.hpp"
#include "model/backend.hpp"
#include "model/model_dir.hpp"

namespace cm = cedar::model;
namespace kc = cedar::kernels;
namespace kcu = cedar::kernels::cuda;

namespace {

// "8192,32768" -> {8192, 32768}; exits with a message naming the flag on anything else.
std::vector<int64_t> parse_list(const std::string& s, const char* flag) {
  std::vector<int64_t> v;
  std::stringstream ss(s);
  std::string x;
  while (std::getline(ss, x, ',')) {
    char* end = nullptr;
    const long long n = std::strtoll(x.c_str(), &end, 10);
    if (x.empty() || *end != '\0' || n <= 0) {
      std::fprintf(stderr, "bench_cuda_decode: %s: '%s' is not a positive integer\n", flag, x.c_str());
      std::exit(2);
    }
    v.push_back(n);
  }
  if (v.empty()) {
    std::fprintf(stderr, "bench_cuda_decode: %s: empty list\n", flag);
    std::exit(2);
  }
  return v;
}

// One --variants entry: a label and the settings its backend is made under.
struct variant {
  std::string label;
  std::vector<std::pair<std::string, std::string>> env;
};

// "base;fused:CEDAR_CUDA_FUSE_SHARED=8,CEDAR_CUDA_SWA_SIDE=1" -> two variants; exits
// with a message naming the bad entry on anything else (an empty label, a setting without '=',
// a name that is not CEDAR_CUDA_*, a label with a comma or a quote).
std::vector<variant> parse_variants(const std::string& s) {
  std::vector<variant> out;
  std::stringstream ss(s);
  std::string item;
  auto fail = [&](const std::string& why) {
    std::fprintf(stderr, "bench_cuda_decode: --variants: \"%s\": %s\n", item.c_str(), why.c_str());
    std::exit(2);
  };
  while (std::getline(ss, item, ';')) {
    variant v;
    const size_t colon = item.find(':');
    v.label = item.substr(0, colon);
    if (v.label.empty() || v.label.find_first_of(",\"") != std::string::npos) fail("a label without commas or quotes first");
    if (colon != std::string::npos) {
      std::stringstream es(item.substr(colon + 1));
      std::string kv;
      while (std::getline(es, kv, ',')) {
        const size_t eq = kv.find('=');
        if (eq == std::string::npos || kv.rfind("CEDAR_CUDA_", 0) != 0) fail("settings are CEDAR_CUDA_NAME=VALUE");
        v.env.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
      }
    }
    out.push_back(std::move(v));
  }
  if (out.empty()) fail("no variant");
  return out;
}

// ~1.2B parameters: the rand100m layer map at hidden 2048, 16 experts of 768, vocab 32768.
cm::model_config rand1b_config() {
  cm::model_config c = cedar::bench::random_100m_config();
  c.vocab_size = 32768;
  c.hidden_size = 2048;
  c.num_attention_heads = 16;
  c.head_dim = 256;
  c.qk_rope_head_dim = 64;
  c.q_lora_rank = 512;
  c.o_groups = 4;
  c.o_lora_rank = 512;
  c.index_n_heads = 8;
  c.index_head_dim = 128;
  c.index_topk = 512;
  c.candidate_topk_blocks = 64;
  c.candidate_block_size = 16;
  c.moe_intermediate_size = 768;
  c.n_routed_experts = 16;
  c.num_experts_per_tok = 2;
  c.max_position_embeddings = 262144;
  return c;
}

double matrix_bytes(const kc::qmatrix& q) {
  if (q.empty()) return 0;
  double b = (double)q.data_bytes();
  if (q.scale_e8m0) b += (double)((q.rows + q.scale_block_rows - 1) / q.scale_block_rows) * (double)q.scale_cols;
  if (q.scale_f32) b += 4.0 * (double)((q.rows + q.scale_block_rows - 1) / q.scale_block_rows) * (double)q.scale_cols;
  return b;
}

// Weight bytes one decode step of B rows reads.
double weight_bytes_per_step(const cm::engine& e, int B) {
  const cm::model_config& c = e.config();
  double b = matrix_bytes(e.head());
  const double E = c.n_routed_experts, K = c.num_experts_per_tok;
  const double distinct = E > 0 ? E * (1.0 - std::pow(1.0 - K / E, B)) : 0;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const cm::block_weights& w = e.block(l);
    const cm::attention_weights& a = w.attn;
    for (const kc::qmatrix* q : {&w.hc_attn_fn, &w.hc_ffn_fn, &a.wq_a, &a.wq_b, &a.wkv, &a.wo_a, &a.wo_b,
                                 &a.compressor.wkv, &a.compressor.wgate, &a.indexer.wq_b, &a.indexer.weights_proj,
                                 &a.indexer.wk, &w.ffn.gate, &w.ffn.shared.w1, &w.ffn.shared.w3, &w.ffn.shared.w2,
                                 &w.engram.wkv})
      b += matrix_bytes(*q);
    if (!w.ffn.experts.empty()) {
      const cm::expert_weights& x = w.ffn.experts[0];
      b += distinct * (matrix_bytes(x.w1) + matrix_bytes(x.w3) + matrix_bytes(x.w2));
    }
  }
  return b;
}

// Cache bytes one row at context N reads in a step.
double kv_bytes_per_row(const cm::model_config& c, const cm::sequence& s, int64_t N) {
  double b = 0;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const cm::layer_info& li = c.layers[(size_t)l];
    b += (double)std::min<int64_t>(N + 1, c.sliding_window) * (double)s.swa_entry_bytes();
    if (li.ratio > 0) {
      const int64_t ne = (N + 1) / li.ratio;
      b += (double)std::min<int64_t>(ne, c.index_topk) * (double)s.main_entry_bytes();
      if (li.index_source == l)  // an index layer scores every visible key (Reindex: its pool)
        b += (double)(li.candidate_restricted
                          ? std::min<int64_t>(ne, (int64_t)c.candidate_topk_blocks * c.candidate_block_size)
                          : ne) *
             (double)s.index_entry_bytes();
    }
  }
  return b;
}

// A well-formed sequence of N tokens with random packed pages and full SWA rings.
cedar::result<cm::sequence> synthetic_sequence(const cm::engine& e, int64_t N, uint32_t seed) {
  const cm::model_config& c = e.config();
  std::mt19937 g(seed);
  cm::sequence s(c);
  cm::sequence_snapshot snap;
  snap.tokens.resize((size_t)N);
  for (auto& t : snap.tokens) t = (int32_t)(3 + g() % (uint32_t)(c.vocab_size - 3));
  const int hd = c.head_dim, di = c.index_head_dim;
  for (int i = 0; i < s.n_sources(); ++i) {
    const int ratio = s.source(i).ratio;
    const int64_t ne = N / ratio;
    cm::sequence_snapshot::source src;
    src.main.resize((size_t)ne * s.main_entry_bytes());
    src.index.resize((size_t)ne * s.index_entry_bytes());
    for (int64_t k = 0; k < ne; ++k) {
      uint8_t* m = src.main.data() + (size_t)k * s.main_entry_bytes();
      for (int j = 0; j < hd / 2; ++j) m[j] = (uint8_t)g();
      for (int j = 0; j < hd / 16; ++j) m[hd / 2 + j] = (uint8_t)(0x28 + g() % 16);  // E4M3 ~ 0.1..0.3
      uint8_t* x = src.index.data() + (size_t)k * s.index_entry_bytes();
      for (int j = 0; j < di / 2; ++j) x[j] = (uint8_t)g();
      for (int j = 0; j < di / 32; ++j) x[di / 2 + j] = (uint8_t)(124 + g() % 3);  // UE8M0 2^-3..2^-1
    }
    src.n_pending = (int)(N % ratio);
    src.pending_kv.assign((size_t)src.n_pending * hd, 0.01f);
    src.pending_gate.assign((size_t)src.n_pending * hd, 0.0f);
    snap.sources.push_back(std::move(src));
  }
  const size_t keep = c.engram_layer_ids.empty() ? 0 : (size_t)std::max(0, c.engram_max_ngram_size - 1);
  for (size_t k = 0; k < std::min<size_t>(keep, (size_t)N); ++k)
    snap.ngram_history.push_back(e.engram_token_map()[(size_t)snap.tokens[(size_t)N - std::min<size_t>(keep, (size_t)N) + k]]);
  CEDAR_TRY(s.restore(snap));
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    cm::swa_ring& r = s.ring_mut(l);
    for (size_t b = 0; b < r.bytes.size(); ++b) r.bytes[b] = (uint8_t)(g() & 0x77);  // no NaN codes
    const size_t eb = s.swa_entry_bytes();
    for (size_t slot = 0; slot < r.bytes.size() / eb; ++slot)
      for (int j = 0; j < hd / 32; ++j) r.bytes[slot * eb + hd + j] = (uint8_t)(118 + g() % 4);
    s.set_ring_first_pos(l, std::max<int64_t>(0, N - c.sliding_window));
  }
  return s;
}

double copy_bandwidth() {
  const size_t n = (size_t)1 << 30;
  void *a = nullptr, *b = nullptr;
  if (cudaMalloc(&a, n) != cudaSuccess || cudaMalloc(&b, n) != cudaSuccess) return 0;
  cudaMemset(a, 1, n);
  cudaEvent_t t0, t1;
  cudaEventCreate(&t0);
  cudaEventCreate(&t1);
  cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice);
  float best = 1e30f;
  for (int i = 0; i < 5; ++i) {
    cudaEventRecord(t0);
    cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice);
    cudaEventRecord(t1);
    cudaEventSynchronize(t1);
    float ms = 0;
    cudaEventElapsedTime(&ms, t0, t1);
    best = std::min(best, ms);
  }
  cudaFree(a);
  cudaFree(b);
  return 2.0 * (double)n / (best * 1e-3);  // read + write
}

// The per-kernel table of --profile and --timeline: name -> (launches per step, µs per step),
// largest first, with each kernel's share of `sum` and its µs per launch.
void print_kernel_table(const std::map<std::string, std::pair<int, double>>& by, double sum) {
  std::vector<std::pair<std::string, std::pair<int, double>>> rows(by.begin(), by.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.second > b.second.second; });
  std::printf("    %-40s %8s %10s %6s %9s\n", "kernel", "launches", "us/step", "share", "us/launch");
  for (const auto& [n, e] : rows)
    std::printf("    %-40s %8d %10.1f %5.1f%% %9.2f\n", n.substr(0, 40).c_str(), e.first, e.second, 100 * e.second / sum,
                e.second / e.first);
}

// --profile: every kernel of a step timed between two CUDA events on its stream. The steps are
// launched op by op (no graph), without PDL and without the side streams, so each kernel runs
// alone and the times add up to the step; a host callback holds the stream at the first launch
// until the whole step is queued, so the GPU never waits for the CPU between two events.
class event_profiler final : public kcu::launch_profiler {
 public:
  struct launch {
    const void* fn = nullptr;
    dim3 grid, block;
    cudaEvent_t t0 = nullptr, t1 = nullptr;
  };
  ~event_profiler() override {
    for (launch& r : pool_) cudaEventDestroy(r.t0), cudaEventDestroy(r.t1);
  }
  void arm() {
    n_ = 0;
    hold_ = true;
  }
  void before(const void* fn, dim3 grid, dim3 block, cudaStream_t stream) override {
    if (hold_) {
      cudaLaunchHostFunc(stream, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(20)); }, nullptr);
      hold_ = false;
    }
    if (n_ == pool_.size()) {
      launch r;
      cudaEventCreate(&r.t0);
      cudaEventCreate(&r.t1);
      pool_.push_back(r);
    }
    launch& r = pool_[n_++];
    r.fn = fn, r.grid = grid, r.block = block;
    cudaEventRecord(r.t0, stream);
  }
  void after(const void*, cudaStream_t stream) override { cudaEventRecord(pool_[n_ - 1].t1, stream); }

  // After the step has finished: its launches' times added to the totals by position.
  // false when the sequence of kernels differs from the previous steps'.
  bool collect() {
    if (steps_ == 0) {
      fns_.clear(), us_.assign(n_, 0.0), grids_.clear(), blocks_.clear();
      for (size_t i = 0; i < n_; ++i) fns_.push_back(pool_[i].fn), grids_.push_back(pool_[i].grid), blocks_.push_back(pool_[i].block);
    } else if (n_ != fns_.size()) {
      return false;
    }
    for (size_t i = 0; i < n_; ++i) {
      if (pool_[i].fn != fns_[i]) return false;
      float ms = 0;
      cudaEventElapsedTime(&ms, pool_[i].t0, pool_[i].t1);
      us_[i] += 1e3 * ms;
    }
    float span = 0;
    if (n_ > 0) cudaEventElapsedTime(&span, pool_[0].t0, pool_[n_ - 1].t1);
    span_us_ += 1e3 * span;
    ++steps_;
    return true;
  }

  // The kernel's name without its namespace, return type or parameters; template arguments kept
  // (a weight format as its number: 0 f32, 1 bf16, 2 f8_e4m3, 3 fp4_e2m1).
  static std::string name_of(const void* fn) {
    const char* raw = nullptr;
    if (cudaFuncGetName(&raw, fn) != cudaSuccess || !raw) return "?";
    std::string n = raw;
    int st = 0;
    if (char* d = abi::__cxa_demangle(raw, nullptr, nullptr, &st)) {
      n = d;
      std::free(d);
    }
    if (n.rfind("void ", 0) == 0) n.erase(0, 5);
    for (const char* cut : {"cedar::kernels::cuda::", "(anonymous namespace)::", "(cedar::kernels::weight_format)"})
      for (size_t p; (p = n.find(cut)) != std::string::npos;) n.erase(p, std::strlen(cut));
    int depth = 0;
    for (size_t i = 0; i < n.size(); ++i) {  // drop the parameter list (the first '(' outside <>)
      if (n[i] == '<') ++depth;
      if (n[i] == '>') --depth;
      if (n[i] == '(' && depth == 0) return n.substr(0, i);
    }
    return n;
  }

  // Prints the per-kernel table; writes one CSV row per launch position to `csv` if given.
  void report(const std::string& what, FILE* csv) const {
    if (steps_ == 0) return;
    std::map<std::string, std::pair<int, double>> by;  // name -> launches per step, us per step
    double sum = 0;
    for (size_t i = 0; i < fns_.size(); ++i) {
      auto& e = by[name_of(fns_[i])];
      e.first += 1;
      e.second += us_[i] / steps_;
      sum += us_[i] / steps_;
    }
    std::printf("  profile %s: %zu launches per step, kernels %.1f us of a %.1f us step (op by op, no PDL, no graph)\n",
                what.c_str(), fns_.size(), sum, span_us_ / steps_);
    print_kernel_table(by, sum);
    if (csv)
      for (size_t i = 0; i < fns_.size(); ++i)
        std::fprintf(csv, "%s,%zu,\"%s\",%u,%u,%.3f\n", what.c_str(), i, name_of(fns_[i]).c_str(), grids_[i].x * grids_[i].y * grids_[i].z,
                     blocks_[i].x * blocks_[i].y * blocks_[i].z, us_[i] / steps_);
  }

 private:
  std::vector<launch> pool_;
  size_t n_ = 0;
  bool hold_ = false;
  std::vector<const void*> fns_;
  std::vector<dim3> grids_, blocks_;
  std::vector<double> us_;
  double span_us_ = 0;
  int steps_ = 0;
};

// --timeline (a build with -DCEDAR_CUDA_TIMELINE=ON): the decode steps as they run, in their
// CUDA graph with PDL and the side streams. The kernels append their start times (launch.cuh);
// the launches a step enqueues (eagerly or into the graph it captures) are recorded here on the
// host, so each device record is matched to a kernel by its grid/block tag in launch order
// (side-stream kernels may start a few places off). A kernel's cost on the critical path is
// the gap from its start to the next record's start.
class timeline_recorder final : public kcu::launch_profiler {
 public:
  struct launch {
    const void* fn = nullptr;
    unsigned long long tag = 0;
    dim3 grid, block;
  };
  static constexpr unsigned k_cap = 8192;
  timeline_recorder() {
    if (cudaMalloc(&buf_, sizeof(unsigned long long) * (2 + 2 * (size_t)k_cap)) != cudaSuccess) buf_ = nullptr;
  }
  ~timeline_recorder() override {
    kcu::set_timeline(nullptr, 0);
    if (buf_) cudaFree(buf_);
  }
  bool ok() const { return buf_ != nullptr; }
  void before(const void* fn, dim3 g, dim3 b, cudaStream_t) override {
    cur_.push_back({fn, kcu::timeline_tag(g.x, g.y, g.z, b.x), g, b});
  }
  void after(const void*, cudaStream_t) override {}
  // before a step: recording on, the count zeroed
  void arm() {
    cudaMemset(buf_, 0, sizeof(unsigned long long) * 2);
    kcu::set_timeline(buf_, k_cap);
  }
  // after a step (synchronised): the launches it enqueued, if any, become the sequence its graph
  // replays; its records matched to them and the gaps added per launch position. false when
  // fewer than all the records could be matched.
  bool collect() {
    kcu::set_timeline(nullptr, 0);
    if (!cur_.empty()) {
      if (!seq_.empty() && cur_.size() != seq_.size())
        gap_.clear(), cnt_.clear(), wait_.clear(), wcnt_.clear(), steps_ = 0, span_ = 0;
      seq_ = std::move(cur_);
    }
    cur_.clear();
    unsigned n = 0;
    cudaMemcpy(&n, buf_, sizeof n, cudaMemcpyDeviceToHost);
    n = std::min(n, k_cap);
    std::vector<unsigned long long> rec(2 * (size_t)n);
    if (n) cudaMemcpy(rec.data(), buf_ + 2, sizeof(unsigned long long) * rec.size(), cudaMemcpyDeviceToHost);
    std::vector<std::pair<unsigned long long, unsigned long long>> r, pre;  // (time, tag) by time
    for (unsigned i = 0; i < n; ++i) {
      const unsigned long long tag = rec[2 * (size_t)i + 1];
      if (tag & kcu::k_timeline_pre) pre.push_back({rec[2 * (size_t)i], tag & ~kcu::k_timeline_pre});
      else r.push_back({rec[2 * (size_t)i], tag});
    }
    std::sort(r.begin(), r.end());
    std::sort(pre.begin(), pre.end());
    gap_.resize(seq_.size(), 0.0), cnt_.resize(seq_.size(), 0);
    wait_.resize(seq_.size(), 0.0), wcnt_.resize(seq_.size(), 0);
    // the records before the waits, matched to launches the same way: their time per position
    std::vector<unsigned long long> pre_t(seq_.size(), 0);
    {
      std::vector<char> taken(seq_.size(), 0);
      size_t jp = 0;
      for (const auto& [t, tag] : pre) {
        while (jp < seq_.size() && taken[jp]) ++jp;
        for (size_t k = jp; k < std::min(seq_.size(), jp + 24); ++k)
          if (!taken[k] && seq_[k].tag == tag) {
            taken[k] = 1, pre_t[k] = t;
            break;
          }
      }
    }
    std::vector<char> used(seq_.size(), 0);
    size_t j = 0, matched = 0;
    std::vector<long> at(r.size(), -1);
    for (size_t i = 0; i < r.size(); ++i) {
      while (j < seq_.size() && used[j]) ++j;
      for (size_t k = j; k < std::min(seq_.size(), j + 24); ++k)
        if (!used[k] && seq_[k].tag == r[i].second) {
          used[k] = 1, at[i] = (long)k, ++matched;
          break;
        }
    }
    for (size_t i = 0; i + 1 < r.size(); ++i)
      if (at[i] >= 0) gap_[(size_t)at[i]] += 1e-3 * (double)(r[i + 1].first - r[i].first), cnt_[(size_t)at[i]]++;
    for (size_t i = 0; i < r.size(); ++i)
      if (at[i] >= 0 && pre_t[(size_t)at[i]] && pre_t[(size_t)at[i]] <= r[i].first)
        wait_[(size_t)at[i]] += 1e-3 * (double)(r[i].first - pre_t[(size_t)at[i]]), wcnt_[(size_t)at[i]]++;
    if (r.size() > 1) span_ += 1e-3 * (double)(r.back().first - r.front().first);
    ++steps_;
    records_ = r.size();
    return matched == r.size() && r.size() == seq_.size();
  }
  size_t records() const { return records_; }
  // Prints the per-kernel table (critical-path µs per step); one CSV row per launch position.
  void report(const std::string& what, FILE* csv) const {
    if (steps_ == 0 || seq_.empty()) return;
    std::map<std::string, std::pair<int, double>> by;
    double sum = 0;
    for (size_t i = 0; i < seq_.size(); ++i) {
      const double us = cnt_[i] ? gap_[i] / cnt_[i] : 0.0;
      auto& e = by[event_profiler::name_of(seq_[i].fn)];
      e.first += 1, e.second += us, sum += us;
    }
    std::printf("  timeline %s: %zu launches per step, first to last kernel start %.1f us (graph, PDL, side streams)\n",
                what.c_str(), seq_.size(), span_ / steps_);
    print_kernel_table(by, sum);
    int early = 0, timed = 0;  // launches resident before their predecessor ended (waited ≥ 0.2 µs)
    for (size_t i = 0; i < seq_.size(); ++i)
      if (wcnt_[i]) ++timed, early += wait_[i] / wcnt_[i] >= 0.2;
    std::printf("  timeline %s: %d of %d launches were resident before the kernel they wait for ended (PDL overlap)\n",
                what.c_str(), early, timed);
    if (csv)
      for (size_t i = 0; i < seq_.size(); ++i)
        std::fprintf(csv, "%s,%zu,\"%s\",%u,%u,%.3f,%.3f\n", what.c_str(), i, event_profiler::name_of(seq_[i].fn).c_str(),
                     seq_[i].grid.x * seq_[i].grid.y * seq_[i].grid.z, seq_[i].block.x, cnt_[i] ? gap_[i] / cnt_[i] : 0.0,
                     wcnt_[i] ? wait_[i] / wcnt_[i] : 0.0);
  }

 private:
  unsigned long long* buf_ = nullptr;
  std::vector<launch> seq_, cur_;
  std::vector<double> gap_, wait_;  // per launch position: µs to the next start; µs at the wait
  std::vector<int> cnt_, wcnt_;
  double span_ = 0;
  int steps_ = 0;
  size_t records_ = 0;
};

// --prefill: an N-token prompt prefilled on the GPU per chunk size (CED; the full stack at the
// first chunk size), each after a warm-up prefill on another sequence, wall time of the whole
// call; the bound is the weight bytes of one chunk step (the distinct experts of `chunk` rows)
// at the copy bandwidth, per token of the chunk. The CPU runner's CED prefill of cpu_n tokens
// beside it. false on an error (printed).
bool bench_prefill(const cm::engine& eng, const std::string& name, int64_t N, const std::vector<int64_t>& chunks,
                   int64_t cpu_n, double bw, FILE* csv, bool profile, FILE* pcsv) {
  const cm::model_config& c = eng.config();
  if (N > c.max_position_embeddings) {
    std::fprintf(stderr, "bench_cuda_decode: --prefill %lld exceeds the model's positions\n", (long long)N);
    return false;
  }
  std::mt19937 g(5);
  std::vector<int32_t> toks((size_t)N);
  for (auto& t : toks) t = (int32_t)(3 + g() % (uint32_t)(c.vocab_size - 3));
  auto row = [&](const char* backend, int64_t n, int64_t chunk, const char* mode, double sec) {
    const double bytes = chunk > 0 ? weight_bytes_per_step(eng, (int)chunk) : 0;
    const double bound = chunk > 0 && bw > 0 ? (double)chunk / (bytes / bw) : 0;
    const double tps = (double)n / sec;
    std::printf("  %-8s prefill %7lld tokens, %-4s chunk %4lld %-10s: %8.3f s %10.1f tok/s", name.c_str(), (long long)n,
                backend, (long long)chunk, mode, sec, tps);
    if (bound > 0) std::printf(" | weight-stream bound %10.1f tok/s -> %5.1f%%", bound, 100 * tps / bound);
    std::printf("\n");
    std::fflush(stdout);
    if (csv)
      std::fprintf(csv, "%s,%lld,%lld,%s,%lld,%s,%.4f,%.2f,%.0f,%.2f,%.4f\n", name.c_str(), (long long)eng.n_params(),
                   (long long)n, backend, (long long)chunk, mode, sec, tps, bytes, bound, bound > 0 ? tps / bound : 0);
  };
  for (size_t k = 0; k < chunks.size(); ++k) {
    setenv("CEDAR_CUDA_PREFILL_CHUNK", std::to_string(chunks[k]).c_str(), 1);
    auto be = cm::make_backend(eng, cm::backend_request::cuda);
    unsetenv("CEDAR_CUDA_PREFILL_CHUNK");
    if (!be) {
      std::fprintf(stderr, "bench_cuda_decode: %s\n", be.err().message.c_str());
      return false;
    }
    for (int full = 0; full < (k == 0 ? 2 : 1); ++full) {
      cm::prefill_options o;
      o.mode = full ? cm::prefill_mode::full_stack : cm::prefill_mode::ced;
      cm::sequence warm(c);
      const size_t nw = std::min<size_t>(toks.size(), (size_t)(2 * chunks[k] + c.sliding_window + 1));
      if (auto r = (*be)->prefill(warm, std::span<const int32_t>(toks.data(), nw), o); !r) {
        std::fprintf(stderr, "bench_cuda_decode: prefill: %s\n", r.err().message.c_str());
        return false;
      }
      cm::sequence s(c);
      const auto t0 = std::chrono::steady_clock::now();
      auto r = (*be)->prefill(s, toks, o);
      const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (!r) {
        std::fprintf(stderr, "bench_cuda_decode: prefill: %s\n", r.err().message.c_str());
        return false;
      }
      row("cuda", N, chunks[k], full ? "full_stack" : "ced", sec);
    }
    if (profile) {  // one full-stack chunk of this size after a context of N tokens, kernel by kernel
      cm::sequence s(c);
      const size_t n0 = (size_t)std::max<int64_t>(0, std::min<int64_t>(N, c.max_position_embeddings - chunks[k]));
      cm::prefill_options o;
      o.mode = cm::prefill_mode::full_stack;
      if (n0 > 0)
        if (auto r = (*be)->prefill(s, std::span<const int32_t>(toks.data(), n0)); !r) {
          std::fprintf(stderr, "bench_cuda_decode: prefill: %s\n", r.err().message.c_str());
          return false;
        }
      std::vector<int32_t> more((size_t)chunks[k], 17);
      event_profiler prof;
      prof.arm(), kcu::set_profiler(&prof);
      auto r = (*be)->prefill(s, more, o);
      kcu::set_profiler(nullptr);
      if (!r || !prof.collect()) {
        std::fprintf(stderr, "bench_cuda_decode: --profile of a prefill chunk: %s\n", r ? "no kernels" : r.err().message.c_str());
        return false;
      }
      char what[96];
      std::snprintf(what, sizeof what, "%s/prefill-ctx%lld/chunk%lld", name.c_str(), (long long)n0, (long long)chunks[k]);
      prof.report(what, pcsv);
    }
  }
  if (cpu_n > 0) {
    cm::runner rn(eng);
    cm::sequence s(c);
    const int64_t n = std::min(cpu_n, N);
    const auto t0 = std::chrono::steady_clock::now();
    auto r = rn.prefill(s, std::span<const int32_t>(toks.data(), (size_t)n));
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!r) {
      std::fprintf(stderr, "bench_cuda_decode: cpu prefill: %s\n", r.err().message.c_str());
      return false;
    }
    row("cpu", n, 0, "ced", sec);
  }
  return true;
}

// --replay N: resume after a restore. A context of N tokens (CED prefill on the GPU) is
// snapshotted; each timed run restores it into a fresh sequence and runs the bounded replay of
// the last sliding_window tokens (what the runtime does on a resume): on the GPU (the mirror's
// upload of every restored page included) and on the CPU runner, best of `reps`, after one
// warm-up each. false on an error (printed).
bool bench_replay(const cm::engine& eng, const std::string& name, int64_t N, int reps, FILE* csv) {
  const cm::model_config& c = eng.config();
  if (N > c.max_position_embeddings || N < 1) {
    std::fprintf(stderr, "bench_cuda_decode: --replay %lld is outside the model's positions\n", (long long)N);
    return false;
  }
  auto gpu = cm::make_backend(eng, cm::backend_request::cuda);
  auto cpu = cm::make_backend(eng, cm::backend_request::cpu);
  if (!gpu || !cpu) {
    std::fprintf(stderr, "bench_cuda_decode: %s\n", (!gpu ? gpu.err() : cpu.err()).message.c_str());
    return false;
  }
  std::mt19937 g(7);
  std::vector<int32_t> toks((size_t)N);
  for (auto& t : toks) t = (int32_t)(3 + g() % (uint32_t)(c.vocab_size - 3));
  cm::sequence live(c);
  if (auto r = (*gpu)->prefill(live, toks); !r) {
    std::fprintf(stderr, "bench_cuda_decode: replay's context: %s\n", r.err().message.c_str());
    return false;
  }
  const cm::sequence_snapshot snap = live.snapshot();
  const int n = (int)std::min<int64_t>(c.sliding_window, N);
  double best[2] = {1e30, 1e30};
  for (int b = 0; b < 2; ++b) {
    cm::backend& be = b == 0 ? **gpu : **cpu;
    for (int k = 0; k <= reps; ++k) {  // k = 0: warm-up
      cm::sequence s(c);
      if (auto st = s.restore(snap); !st) {
        std::fprintf(stderr, "bench_cuda_decode: restore: %s\n", st.err().message.c_str());
        return false;
      }
      const auto t0 = std::chrono::steady_clock::now();
      auto r = be.replay(s, n);
      const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (!r) {
        std::fprintf(stderr, "bench_cuda_decode: replay: %s\n", r.err().message.c_str());
        return false;
      }
      if (k > 0) best[b] = std::min(best[b], sec);
    }
  }
  std::printf("  %-8s replay of %d tokens after a restore at context %lld: cuda %.2f ms (pages uploaded included), "
              "cpu runner %.2f ms -> %.1fx\n",
              name.c_str(), n, (long long)N, best[0] * 1e3, best[1] * 1e3, best[1] / best[0]);
  std::fflush(stdout);
  if (csv)  // the --prefill-csv columns; prompt = the context, mode "replay", no bound
    for (int b = 0; b < 2; ++b)
      std::fprintf(csv, "%s,%lld,%lld,%s,0,replay-%d,%.6f,%.2f,0,0,0\n", name.c_str(), (long long)eng.n_params(),
                   (long long)N, b == 0 ? "cuda" : "cpu", n, best[b], n / best[b]);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::string models = "default,rand1b", csv_path, profile_path, prefill_csv_path, timeline_path;
  bool profile = false, decode = true;
  int64_t prefill_n = 0, prefill_cpu_n = 1024, replay_n = 0;
  std::vector<int64_t> prefill_chunks = {64, 128, 256};
  std::vector<int64_t> contexts = {8192, 32768, 131072}, batches = {1, 8, 64};
  int steps = 10, rounds = 1;
  std::vector<variant> variants;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&](const char* what) -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_cuda_decode: %s needs a value\n", what);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      std::printf(
          "usage: bench_cuda_decode [--models default,rand1b] [--contexts 8192,32768,131072]\n"
          "                         [--batches 1,8,64] [--steps N] [--csv FILE] [--quick]\n"
          "                         [--profile] [--profile-csv FILE]\n"
          "                         [--prefill N] [--prefill-chunks 64,128,256] [--prefill-cpu N]\n"
          "                         [--prefill-csv FILE] [--replay N] [--no-decode]\n"
          "                         [--timeline FILE] [--phases]\n"
          "                         [--variants 'LABEL[:NAME=VALUE,...];...'] [--rounds N]\n"
          "Decode steps of the cuda backend end to end (tokens in, logits and cache bytes back), per\n"
          "model x context x batch, beside the copy-bandwidth roofline. Needs a GPU.\n"
          "--prefill N: also a prefill of an N-token prompt on the GPU per chunk size (CED, and the\n"
          "full stack at the first chunk size), beside the weight-stream bound of a chunk step and\n"
          "the CPU runner's prefill of --prefill-cpu tokens (0: none). --no-decode: prefill only.\n"
          "--replay N: also the bounded replay after a restore at an N-token context, on the GPU\n"
          "(the restored pages' upload included) and on the CPU runner (rows in --prefill-csv).\n"
          "--profile: every kernel timed alone (steps launched op by op: no graph, no PDL, no side\n"
          "streams), a table per kernel (with --prefill: also of one full-stack chunk per chunk size\n"
          "after the N-token prompt); --profile-csv FILE: also one row per launch of a step\n"
          "(config, position, kernel, blocks, threads, us). The tok/s of a profiled run are not the\n"
          "backend's.\n"
          "--timeline FILE: the decode steps as they run (graph, PDL, side streams): each kernel's\n"
          "start recorded on the device, its cost on the critical path = the gap to the next start;\n"
          "a table per kernel and one CSV row per launch (config, position, kernel, blocks, threads,\n"
          "us, waited_us: how long its first block sat at the PDL wait, ~0 when it was launched only\n"
          "after its predecessor ended). Needs a build with -DCEDAR_CUDA_TIMELINE=ON.\n"
          "The ms per step of a --timeline run include the host's reading of the records between\n"
          "steps (device ms per step do not).\n"
          "--phases: the device ms per step split at events inside the step's graph\n"
          "(CEDAR_CUDA_STEP_PHASES=1): the graph launch and the upload (start event to the end of\n"
          "the upload), the kernels, the downloads (to the end event); and the host's time in the\n"
          "cudaGraphLaunch call of a replay.\n"
          "--variants: the decode runs once per variant, each with a backend made under its settings\n"
          "(NAME=VALUE set in the environment while the backend is made, then restored: the settings\n"
          "model/cuda_decoder.cpp reads, not the kernels' process-wide switches, which are read once);\n"
          "--rounds N: the variants N times over, alternated (A/B runs on one warm GPU). The CSV's\n"
          "first columns are the variant and the round.\n");
      return 0;
    } else if (a == "--models") {
      models = val("--models");
    } else if (a == "--contexts") {
      contexts = parse_list(val("--contexts"), "--contexts");
    } else if (a == "--batches") {
      batches = parse_list(val("--batches"), "--batches");
    } else if (a == "--steps") {
      steps = (int)parse_list(val("--steps"), "--steps")[0];
    } else if (a == "--csv") {
      csv_path = val("--csv");
    } else if (a == "--profile") {
      profile = true;
    } else if (a == "--profile-csv") {
      profile = true;
      profile_path = val("--profile-csv");
    } else if (a == "--timeline") {
      timeline_path = val("--timeline");
    } else if (a == "--phases") {
      setenv("CEDAR_CUDA_STEP_PHASES", "1", 1);  // read by the backends made below
    } else if (a == "--prefill") {
      prefill_n = parse_list(val("--prefill"), "--prefill")[0];
    } else if (a == "--replay") {
      replay_n = parse_list(val("--replay"), "--replay")[0];
    } else if (a == "--prefill-chunks") {
      prefill_chunks = parse_list(val("--prefill-chunks"), "--prefill-chunks");
    } else if (a == "--prefill-cpu") {
      const std::string v = val("--prefill-cpu");
      prefill_cpu_n = v == "0" ? 0 : parse_list(v, "--prefill-cpu")[0];
    } else if (a == "--prefill-csv") {
      prefill_csv_path = val("--prefill-csv");
    } else if (a == "--no-decode") {
      decode = false;
    } else if (a == "--variants") {
      variants = parse_variants(val("--variants"));
    } else if (a == "--rounds") {
      rounds = (int)parse_list(val("--rounds"), "--rounds")[0];
    } else if (a == "--quick") {
      contexts = {8192};
      batches = {1, 8};
      steps = 5;
    } else {
      std::fprintf(stderr, "bench_cuda_decode: unknown option %s (see --help)\n", a.c_str());
      return 2;
    }
  }
  if (!timeline_path.empty() && (profile || !kcu::timeline_compiled())) {
    std::fprintf(stderr, "bench_cuda_decode: --timeline %s\n",
                 profile ? "and --profile exclude each other" : "needs a build with -DCEDAR_CUDA_TIMELINE=ON");
    return 2;
  }
  const std::string why = cm::cuda_unavailable_reason();
  if (!why.empty()) {
    std::fprintf(stderr, "bench_cuda_decode: %s\n", why.c_str());
    return 1;
  }
  if (profile) {  // read by the backend and the launch helper at their first use
    setenv("CEDAR_CUDA_GRAPHS", "0", 1);
    setenv("CEDAR_CUDA_PDL", "0", 1);
    setenv("CEDAR_CUDA_MHC_SIDE", "0", 1);
    setenv("CEDAR_CUDA_MOE_SIDE", "0", 1);
  }
  // a per-launch CSV (--profile-csv, --timeline): null without a path; exit 2 if unwritable
  auto launch_csv = [](const std::string& path, const char* flag, const char* header) -> FILE* {
    if (path.empty()) return nullptr;
    FILE* f = std::fopen(path.c_str(), "w");
    if (!f) {
      std::fprintf(stderr, "bench_cuda_decode: %s: cannot write %s\n", flag, path.c_str());
      std::exit(2);
    }
    std::fprintf(f, "%s\n", header);
    return f;
  };
  FILE* pcsv = launch_csv(profile_path, "--profile-csv", "config,position,kernel,blocks,threads,us");
  FILE* tcsv = launch_csv(timeline_path, "--timeline", "config,position,kernel,blocks,threads,us,waited_us");
  const double bw = copy_bandwidth();
  std::printf("device copy bandwidth %.2f TB/s\n", bw / 1e12);
  FILE* csv = csv_path.empty() ? nullptr : std::fopen(csv_path.c_str(), "w");
  if (variants.empty()) variants.push_back({"default", {}});
  if (csv) std::fprintf(csv, "variant,round,model,params,context,batch,ms_per_step,device_ms_per_step,tok_per_s,bytes_per_step,roofline_tok_per_s,fraction\n");
  FILE* fcsv = prefill_csv_path.empty() ? nullptr : std::fopen(prefill_csv_path.c_str(), "w");
  if (!prefill_csv_path.empty() && !fcsv) {
    std::fprintf(stderr, "bench_cuda_decode: --prefill-csv: cannot write %s\n", prefill_csv_path.c_str());
    return 2;
  }
  if (fcsv) std::fprintf(fcsv, "model,params,prompt,backend,chunk,mode,seconds,tok_per_s,bytes_per_chunk_step,bound_tok_per_s,fraction\n");
  const char* src_dir = std::getenv("CEDAR_SOURCE_DIR");
  const std::string root = src_dir ? src_dir : ".";
  std::stringstream ms(models);
  std::string name;
  while (std::getline(ms, name, ',')) {
    cm::engine eng = [&]() -> cm::engine {
      if (name == "default") {
        auto m = cm::load_model_dir(root + "/model/weights/cedar-agent-tiny", false);
        if (!m) {
          std::fprintf(stderr, "bench_cuda_decode: %s\n", m.err().message.c_str());
          std::exit(1);
        }
        cm::model_config c = m->eng->config();
        c.max_position_embeddings = std::max<int64_t>(c.max_position_embeddings, 262144);  // timing only
        cm::engine_options o;
        o.engram_token_map = m->eng->engram_token_map();
        auto e = cm::engine::load(c, root + "/model/weights/cedar-agent-tiny/model.safetensors", o);
        if (!e) {
          std::fprintf(stderr, "bench_cuda_decode: %s\n", e.err().message.c_str());
          std::exit(1);
        }
        return std::move(*e);
      }
      cm::model_config c = rand1b_config();
      if (auto st = cm::finalize(c); !st) {
        std::fprintf(stderr, "bench_cuda_decode: rand1b config: %s\n", st.err().message.c_str());
        std::exit(1);
      }
      const auto path = std::filesystem::temp_directory_path() / "cedar_rand1b_bf16.safetensors";
      std::printf("writing the rand1b checkpoint (bf16) ...\n");
      std::fflush(stdout);
      if (auto st = cm::write_random_checkpoint(c, 3, cm::storage_layout::bf16, path.string()); !st) {
        std::fprintf(stderr, "bench_cuda_decode: %s\n", st.err().message.c_str());
        std::exit(1);
      }
      cm::engine_options o;  // Engram addressing: token id -> id mod the compressed vocabulary
      o.engram_token_map.resize((size_t)c.vocab_size);
      for (int64_t t = 0; t < c.vocab_size; ++t) o.engram_token_map[(size_t)t] = t % c.engram_compressed_vocab_size;
      auto e = cm::engine::load(c, path.string(), o);
      if (!e) {
        std::fprintf(stderr, "bench_cuda_decode: %s\n", e.err().message.c_str());
        std::exit(1);
      }
      return std::move(*e);
    }();
    const cm::model_config& c = eng.config();
    for (int round = 1; round <= rounds; ++round)
      for (const variant& var : variants) {
        std::vector<std::pair<std::string, std::optional<std::string>>> was;  // the settings before
        for (const auto& [k, v] : var.env) {
          const char* old = std::getenv(k.c_str());
          was.emplace_back(k, old ? std::optional<std::string>(old) : std::nullopt);
          setenv(k.c_str(), v.c_str(), 1);
        }
        auto be = cm::make_backend(eng, cm::backend_request::cuda);
        for (auto it = was.rbegin(); it != was.rend(); ++it) {  // restored
          if (it->second) setenv(it->first.c_str(), it->second->c_str(), 1);
          else unsetenv(it->first.c_str());
        }
        if (!be) {
          std::fprintf(stderr, "bench_cuda_decode: %s\n", be.err().message.c_str());
          return 1;
        }
        std::printf("model %s: %.3g parameters; %s; variant %s, round %d\n", name.c_str(), (double)eng.n_params(),
                    (*be)->device().c_str(), var.label.c_str(), round);
        for (int64_t N : decode ? contexts : std::vector<int64_t>{}) {
          if (N + steps + 8 > c.max_position_embeddings) continue;
          auto base = synthetic_sequence(eng, N, 1);
          if (!base) {
            std::fprintf(stderr, "bench_cuda_decode: %s\n", base.err().message.c_str());
            return 1;
          }
          for (int64_t B : batches) {
            std::vector<cm::sequence> seqs(B, *base);
            std::vector<cm::sequence*> ptrs;
            for (auto& s : seqs) ptrs.push_back(&s);
            std::vector<int32_t> tok((size_t)B, 17);
            std::vector<float> logits;
            bool ok = true;
            std::unique_ptr<timeline_recorder> tl;
            if (tcsv) {  // records the launches from the first step on (the graph is captured early)
              tl = std::make_unique<timeline_recorder>();
              if (!tl->ok()) {
                std::fprintf(stderr, "bench_cuda_decode: --timeline: out of device memory\n");
                return 1;
              }
              kcu::set_profiler(tl.get());
            }
            for (int w = 0; w < 2 && ok; ++w) {
              auto st = (*be)->decode_step(ptrs, tok, logits);  // uploads + warm-up
              if (!st) {
                std::fprintf(stderr, "bench_cuda_decode: warm-up step %d: %s\n", w, st.err().message.c_str());
                ok = false;
              }
              if (tl) tl->collect();
            }
            double dev_ms = 0;  // the backend's event-timed device work, summed over the steps
            std::vector<double> phase_ms;  // --phases: the same split in phases, summed over the steps
            std::vector<int> phase_n;      // (the host launch call: replays only)
            int steps_run = 0;
            event_profiler prof;
            const auto t0 = std::chrono::steady_clock::now();
            for (int s = 0; s < steps && ok; ++s) {
              if (profile) prof.arm(), kcu::set_profiler(&prof);
              if (tl) tl->arm();
              auto st = (*be)->decode_step(ptrs, tok, logits);
              if (!tl) kcu::set_profiler(nullptr);
              if (st && tl && !tl->collect() && s == steps - 1)
                std::fprintf(stderr, "bench_cuda_decode: --timeline: %zu records, not all matched to launches\n", tl->records());
              if (st && profile && !prof.collect()) {
                std::fprintf(stderr, "bench_cuda_decode: --profile: the steps launched different kernels\n");
                ok = false;
              }
              if (!st) {
                std::fprintf(stderr, "bench_cuda_decode: %s\n", st.err().message.c_str());
                ok = false;
              }
              dev_ms += (*be)->last_step_device_ms();
              const std::vector<double> ph = (*be)->last_step_phases_ms();
              if (ph.size() > phase_ms.size()) phase_ms.resize(ph.size(), 0.0), phase_n.resize(ph.size(), 0);
              for (size_t i = 0; i < ph.size(); ++i) phase_ms[i] += ph[i], ++phase_n[i];
              ++steps_run;
            }
            if (!ok) return 1;
            const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / steps;
            const double bytes = weight_bytes_per_step(eng, (int)B) + (double)B * kv_bytes_per_row(c, seqs[0], N);
            const double roof = bw > 0 ? (double)B / (bytes / bw) : 0;
            const double tps = (double)B / sec;
            dev_ms /= steps;
            std::printf("  %-8s ctx %7lld batch %3lld: %8.3f ms/step (device %.3f) %9.1f tok/s | roofline %9.1f tok/s "
                        "(%.1f MB/step) -> %5.1f%%\n",
                        name.c_str(), (long long)N, (long long)B, sec * 1e3, dev_ms, tps, roof, bytes / 1e6, 100 * tps / roof);
            if (phase_ms.size() >= 3 && phase_n[0] == steps_run) {
              std::printf("    phases (device ms per step): graph launch + upload %.3f | kernels %.3f | downloads %.3f",
                          phase_ms[0] / steps, phase_ms[1] / steps, phase_ms[2] / steps);
              if (phase_ms.size() > 3 && phase_n[3] > 0)
                std::printf(" | host cudaGraphLaunch call %.3f (%d replays)", phase_ms[3] / phase_n[3], phase_n[3]);
              std::printf("\n");
            }
            std::fflush(stdout);
            if (csv)
              std::fprintf(csv, "%s,%d,%s,%lld,%lld,%lld,%.4f,%.4f,%.2f,%.0f,%.2f,%.4f\n", var.label.c_str(), round,
                           name.c_str(), (long long)eng.n_params(),
                           (long long)N, (long long)B, sec * 1e3, dev_ms, tps, bytes, roof, tps / roof);
            char what[160];  // (with --variants: the variant and the round too)
            std::snprintf(what, sizeof what, "%s/ctx%lld/b%lld%s", name.c_str(), (long long)N, (long long)B,
                          variants.size() > 1 || rounds > 1 ? ("/" + var.label + "/r" + std::to_string(round)).c_str() : "");
            if (profile) prof.report(what, pcsv);
            if (tl) {
              kcu::set_profiler(nullptr);
              tl->report(what, tcsv);
            }
          }
        }
      }
    if (prefill_n > 0 && !bench_prefill(eng, name, prefill_n, prefill_chunks, prefill_cpu_n, bw, fcsv, profile, pcsv))
      return 1;
    if (replay_n > 0 && !bench_replay(eng, name, replay_n, 3, fcsv)) return 1;
  }
  if (fcsv) std::fclose(fcsv);
  if (csv) std::fclose(csv);
  if (pcsv) std::fclose(pcsv);
  if (tcsv) std::fclose(tcsv);
  return 0;
}
