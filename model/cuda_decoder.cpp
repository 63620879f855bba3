// cuda_decoder — the cuda backend (backend.hpp): decode steps of a batch of sequences and
// chunked prefill and bounded replay on one NVIDIA GPU.
//
// Device state:
//   weights   every matrix uploaded once in its checkpoint format (BF16 / FP8 + UE8M0 /
//             FP4 + E8M0 bytes, qmatrix views with device pointers), small vectors as fp32;
//   sequences per sequence a mirror of its caches: per layer the FP8 SWA ring [W, swa bytes],
//             per KV source the packed FP4 main entries and index keys (grown by doubling) and
//             the pending half-group rows. The host sequence stays the owner. A mirror is
//             valid while (sequence id, version) match what the last step left; otherwise it
//             is rebuilt from the host bytes (after a CPU prefill, a replay or a restore) —
//             the same bytes, no conversion.
// One step (B rows: one token per sequence, or a prefill chunk of one sequence), in file order
// of run_rows():
//   host: positions, RoPE cos/sin, Engram hash ids, ring/source pointers, window bounds,
//         which rows complete a compressor group -> one pinned blob, one upload;
//   device: embedding -> per layer [Engram] -> mHC site (one pass over the streams: the mix
//         projection's partials + the collapse x; then the flat norm, mixes and Sinkhorn) ->
//         the projections of x, RMS-normalised as they read it, in one grouped launch (q_a,
//         kv, compressor kv/gate, indexer weights) -> [compressor: pending rows
//         or a new entry; index key and latent each normed/rotated/packed in one kernel,
//         appended in place] -> q_b and indexer queries (q_norm inside the projection) -> this
//         token's SWA entry (norm, RoPE, FP8 into the ring slot, one kernel) -> [indexer: RoPE +
//         FP4 round trip of the queries, scores over the packed keys, candidate pool, top-k] ->
//         sparse attention over ring + selected entries + sink (q's RoPE applied as it is read,
//         the inverse on the output as it is written) -> wo_a groups, wo_b -> expand -> mHC
//         site -> shared expert w1/w3 + router gate (one grouped launch), routed experts on a
//         second stream (routing on the device; x normed as they read it) -> expand (the
//         experts' rows added to y as it reads it: no combine launch); head;
//   back: the logits and every new cache byte of the step (ring slots, appended entries,
//         pending rows) gathered into one staging buffer -> one download -> written into the
//         host sequences, whose tokens and n-gram history are committed as the runner does.
// Launches: every kernel through kernels/cuda/launch.cuh (Programmatic Dependent Launch);
// after one eager step per batch shape the step is captured into a CUDA graph and replayed.
// Numerics: the CPU path's formulas; fp32 sums in another order (GEMV trees, online softmax,
// norms folded into projections), so logits agree to a tolerance, not bit for bit; cache
// encoders are bit-exact for equal inputs (kernels/cuda/kv_pack.cuh).
// Prefill chunks (prefill()): the same step over B consecutive rows of one sequence; each row
// reads the SWA entries of the rows before it from an extended ring of W + B slots (the
// sequence's ring copied in first, the last W positions copied back), and each compressor row
// reads its group's earlier rows from the step's projected rows (the sequence's pending rows
// copied in front of them); the new entries are appended in row order. Launched op by op.
// Replay chunks (replay()): the same over rows already in the sequence — no compressor, nothing
// appended, each row's index scoring limited to the entries its position saw, hinted rows'
// selections uploaded instead of scored; only the rings come back.
// Every step hands its rows' index selections back as resume hints (sequence::note_selection).
// Not yet: tensor-core GEMMs for the routed experts, tensor-core attention for long chunks,
// whole layers fused.
#include "model/backend.hpp"

#include <string>

#if CEDAR_HAVE_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <initializer_list>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <unordered_map>

#include "kernels/cuda/compressor.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/device_probe.cuh"
#include "kernels/cuda/engram.cuh"
#include "kernels/cuda/gather.cuh"
#include "kernels/cuda/generic_kernels.hpp"
#include "kernels/cuda/indexer.cuh"
#include "kernels/cuda/kv_pack.cuh"
#include "kernels/cuda/mhc.cuh"
#include "kernels/cuda/moe.cuh"
#include "kernels/cuda/qgemv.cuh"
#include "kernels/cuda/sparse_attention.cuh"
#include "kernels/base/log.hpp"
#endif

namespace cedar::model {

#if !CEDAR_HAVE_CUDA

std::string cuda_unavailable_reason() {
  return "this build of cedar has no CUDA support (configure with -DCEDAR_CUDA=ON where nvcc is installed)";
}

result<std::unique_ptr<backend>> make_cuda_backend(const engine&) {
  return make_error(errc::unavailable, "cuda backend: " + cuda_unavailable_reason());
}

#else

namespace kcu = cedar::kernels::cuda;
using kernels::qmatrix;

std::string cuda_unavailable_reason() {
  const kernels::cuda_probe_result p = kernels::cuda_probe();
  if (p.n_devices > 0) return "";
  return p.message.empty() ? "no CUDA device found" : p.message;
}

namespace {

#define CEDAR_CU(call, what) CEDAR_CUDA_TRY(call, what)

// Index layers score entries in multiples of this (see run_rows).
constexpr int k_entry_quantum = 512;

// A device allocation that grows (contents are not kept unless `keep`).
struct dev_mem {
  void* p = nullptr;
  size_t bytes = 0;
  dev_mem() = default;
  dev_mem(const dev_mem&) = delete;
  dev_mem& operator=(const dev_mem&) = delete;
  dev_mem(dev_mem&& o) noexcept : p(o.p), bytes(o.bytes) { o.p = nullptr, o.bytes = 0; }
  dev_mem& operator=(dev_mem&& o) noexcept {
    std::swap(p, o.p);
    std::swap(bytes, o.bytes);
    return *this;
  }
  ~dev_mem() {
    if (p) cudaFree(p);
  }
  status reserve(size_t n, cudaStream_t s, bool keep = false) {
    if (n <= bytes) return {};
    size_t cap = std::max<size_t>(n, bytes * 2);
    void* q = nullptr;
    CEDAR_CU(cudaMalloc(&q, cap), "cuda backend: device allocation");
    if (keep && p && bytes) {
      if (cudaError_t e = cudaMemcpyAsync(q, p, bytes, cudaMemcpyDeviceToDevice, s); e != cudaSuccess) {
        cudaFree(q);
        return kcu::cuda_status(e, "cuda backend: device copy");
      }
      CEDAR_CU(cudaStreamSynchronize(s), "cuda backend: device copy");
    }
    if (p) cudaFree(p);
    p = q;
    bytes = cap;
    return {};
  }
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

// Switches of the environment (diagnostics and A/B): true when `name` is set to "0".
bool env_off(const char* name) {
  const char* v = std::getenv(name);
  return v && std::string(v) == "0";
}
// ... and true when set to "1" (switches off by default: paths that measured no faster).
bool env_on(const char* name) {
  const char* v = std::getenv(name);
  return v && std::string(v) == "1";
}

// A numeric setting of the environment: `out` takes the value when `name` holds a whole number
// >= lo (true); a value that is not one is left out with a warning naming it (false).
bool env_int(const char* name, int lo, int& out) {
  const char* v = std::getenv(name);
  if (!v) return false;
  char* end = nullptr;
  errno = 0;
  const long n = std::strtol(v, &end, 10);
  if (end == v || *end != '\0' || errno == ERANGE || n < lo || n > INT_MAX) {
    CEDAR_LOG_WARN("cuda backend: %s=\"%s\" is not a whole number >= %d; using %d", name, v, lo, out);
    return false;
  }
  out = (int)n;
  return true;
}

// A pinned host buffer of at least `need` bytes (twice that when it grows; contents not kept).
status grow_pinned(uint8_t*& p, size_t& bytes, size_t need) {
  if (need <= bytes) return {};
  if (p) cudaFreeHost(p);
  p = nullptr;
  bytes = 0;
  CEDAR_CU(cudaMallocHost(&p, need * 2), "cuda backend: pinned buffer");
  bytes = need * 2;
  return {};
}

// ---- weights ---------------------------------------------------------------------------
struct dev_expert {
  qmatrix w1, w3, w2;
};

struct dev_block {
  qmatrix hc_attn_fn, hc_ffn_fn;
  const float *hc_attn_base = nullptr, *hc_attn_scale = nullptr, *hc_ffn_base = nullptr, *hc_ffn_scale = nullptr;
  const float *attn_norm = nullptr, *ffn_norm = nullptr;
  qmatrix wq_a, wq_b, wkv, wo_a, wo_b;
  const float *q_norm = nullptr, *kv_norm = nullptr, *sink = nullptr;
  qmatrix c_wkv, c_wgate;
  const float* c_norm = nullptr;
  qmatrix i_wq_b, i_wproj, i_wk;
  const float* i_knorm = nullptr;
  qmatrix gate;
  const float* gate_bias = nullptr;
  dev_expert shared;
  const qmatrix *w1s = nullptr, *w3s = nullptr, *w2s = nullptr;  // device arrays [E]
  std::vector<dev_expert> experts;  // the same views on the host (a chunk's experts by expert)
  qmatrix x1, x3, x2;  // expert 0's device views: the format and shape every expert has
  qmatrix eg_table, eg_wkv;
  const float* eg_qk = nullptr;
};

// ---- per-sequence mirror ---------------------------------------------------------------
struct dev_source {
  dev_mem main, index, pending_kv, pending_gate;
  int64_t n_entries = 0;
};

struct dev_sequence {
  uint64_t id = 0, version = ~0ull;
  dev_mem rings;  // [L, W, swa_bytes]
  std::vector<dev_source> sources;
  uint64_t last_used = 0;
};

// Appends the bytes of one POD array to a host blob, 16-byte aligned; returns its offset.
template <class T>
size_t blob_put(std::vector<uint8_t>& blob, const T* v, size_t n) {
  size_t off = (blob.size() + 15) & ~size_t(15);
  blob.resize(off + sizeof(T) * n);
  if (n) std::memcpy(blob.data() + off, v, sizeof(T) * n);
  return off;
}

class cuda_backend final : public backend {
 public:
  explicit cuda_backend(const engine& e) : e_(e), cpu_(e), trace_(std::getenv("CEDAR_CUDA_TRACE") != nullptr) {
    graphs_ = !env_off("CEDAR_CUDA_GRAPHS");
    mhc_side_ = !env_off("CEDAR_CUDA_MHC_SIDE");
    moe_side_ = !env_off("CEDAR_CUDA_MOE_SIDE");
    fold_combine_ = !env_off("CEDAR_CUDA_FOLD_COMBINE");
    fuse_route_ = !env_off("CEDAR_CUDA_FUSE_ROUTE");
    fuse_swiglu_ = env_on("CEDAR_CUDA_FUSE_SWIGLU");
    swa_side_ = env_on("CEDAR_CUDA_SWA_SIDE");
    if (env_int("CEDAR_CUDA_GENERIC", 0, generic_mask_) && (generic_mask_ & ~(int)kcu::generic_all)) {
      CEDAR_LOG_WARN("cuda backend: CEDAR_CUDA_GENERIC=%d has bits beyond %d (mHC 1, gathers 2); using %d", generic_mask_,
                     (int)kcu::generic_all, generic_mask_ & (int)kcu::generic_all);
      generic_mask_ &= (int)kcu::generic_all;
    }
    swiglu_down_ = env_on("CEDAR_CUDA_SWIGLU_DOWN");
    mix_in_group_ = env_on("CEDAR_CUDA_MIX_IN_GROUP");
    phases_ = env_on("CEDAR_CUDA_STEP_PHASES");
    env_int("CEDAR_CUDA_FUSE_SHARED", 0, fuse_shared_rows_);
    gpu_prefill_ = !env_off("CEDAR_CUDA_PREFILL");
    gpu_replay_ = !env_off("CEDAR_CUDA_REPLAY");
    record_hints_ = !env_off("CEDAR_CUDA_HINTS");
    int defer = 1;  // a value that is not a whole number: a warning naming it, on
    env_int("CEDAR_CUDA_DEFER_NORM", 0, defer);
    defer_norm_ = defer != 0;
    env_int("CEDAR_CUDA_PREFILL_CHUNK", 1, prefill_chunk_);
    chunk_experts_forced_ = env_int("CEDAR_CUDA_CHUNK_EXPERTS", 0, chunk_experts_min_);
    int ahead = l2_lookahead_ ? 1 : 0;  // (0 or 1; another whole number counts as 1)
    env_int("CEDAR_CUDA_L2_LOOKAHEAD", 0, ahead);
    l2_lookahead_ = ahead != 0;
  }
  ~cuda_backend() override {
    seqs_.clear();
    scratch_.clear();
    arrays_.clear();
    weights_.clear();
    if (graph_exec_) cudaGraphExecDestroy(graph_exec_);
    if (pinned_) cudaFreeHost(pinned_);
    if (pinned_moe_) cudaFreeHost(pinned_moe_);
    for (cudaEvent_t ev : events_)
      if (ev) cudaEventDestroy(ev);
    for (cudaEvent_t ev : phase_events_)
      if (ev) cudaEventDestroy(ev);
    for (cudaEvent_t ev : side_events_)
      if (ev) cudaEventDestroy(ev);
    for (cudaEvent_t ev : moe_events_)
      if (ev) cudaEventDestroy(ev);
    for (cudaEvent_t ev : swa_events_)
      if (ev) cudaEventDestroy(ev);
    for (cudaEvent_t ev : pf_events_)
      if (ev) cudaEventDestroy(ev);
    if (pf_stream_) cudaStreamDestroy(pf_stream_);
    if (side_) cudaStreamDestroy(side_);
    if (moe_stream_) cudaStreamDestroy(moe_stream_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  status init();

  backend_kind kind() const override { return backend_kind::cuda; }
  std::string device() const override {
    const char* cpu = !gpu_prefill_ && !gpu_replay_ ? ", prefill and replay on the CPU"
                      : !gpu_prefill_                ? ", prefill on the CPU"
                      : !gpu_replay_                 ? ", replay on the CPU"
                                                     : "";
    return "cuda (" + device_name_ + ")" + cpu;
  }
  result<logits_rows> prefill(sequence& seq, std::span<const int32_t> tokens, const prefill_options& opt) override;
  result<logits_rows> replay(sequence& seq, int n) override;
  status decode_step(std::span<sequence* const> seqs, std::span<const int32_t> tokens,
                     std::vector<float>& logits) override;
  double last_step_device_ms() const override { return last_device_ms_; }
  std::vector<double> last_step_phases_ms() const override { return last_phases_ms_; }

 private:
  // weights
  result<const void*> upload(const void* host, size_t bytes);  // deduplicated by host pointer
  result<const void*> upload_array(const void* host, size_t bytes);  // a private copy
  result<qmatrix> upload(const qmatrix& q);
  result<const float*> upload(const fvec& v) {
    if (v.empty()) return (const float*)nullptr;
    auto r = upload(v.data(), v.size() * sizeof(float));
    if (!r) return r.take_err();
    return static_cast<const float*>(*r);
  }
  status upload_weights();
  // sequences
  status sync_sequence(const sequence& s, dev_sequence& d);
  // What one step of the device runs (run_rows). Default: a decode step, one row per sequence
  // (distinct sequences).
  struct step_spec {
    bool chunk = false;       // every row belongs to seqs[0], at consecutive positions
    bool all_logits = false;  // a chunk: every row's logits (else only the last row's)
    // a chunk before a CED prefill's tail: the layers before first_decoder_layer, then that
    // layer's mHC site and compressor (its KV source's entries and index keys), no head
    bool enc_only = false;
    // a chunk of rows already in the sequence, from position pos0 (bounded replay): every layer,
    // no compressor, nothing appended, only the SWA rings written; the last `hinted` rows take
    // their index selections from the sequence's resume hints instead of scoring
    bool replay = false;
    bool head = true;  // replay: false for a chunk whose logits nobody reads
    int64_t pos0 = 0;
    int hinted = 0;
  };
  // One step of the device. logits: [rows_out, vocab]: rows_out = B (decode, all_logits), 1 (a
  // chunk's last row) or 0 (enc_only, a replay chunk without head). New rows' index selections
  // become the sequences' resume hints (sequence::note_selection), as the CPU runner records them.
  status run_rows(std::span<sequence* const> seqs, std::span<const int32_t> tokens, const step_spec& sp,
                  std::vector<float>& logits);
  template <class T>
  T* ws(const char* name, size_t n) {
    dev_mem& m = scratch_[name];
    if (!m.reserve(sizeof(T) * std::max<size_t>(n, 1), stream_).ok()) return nullptr;
    return m.as<T>();
  }

  const engine& e_;
  runner cpu_;
  std::string device_name_;
  cudaStream_t stream_ = nullptr;
  std::unordered_map<const void*, dev_mem> weights_;  // host base pointer -> device copy
  std::vector<dev_mem> arrays_;                       // expert descriptor arrays
  std::vector<dev_block> blocks_;
  qmatrix embed_, head_;
  const float* norm_ = nullptr;
  std::unordered_map<uint64_t, dev_sequence> seqs_;  // by sequence id
  uint64_t step_ = 0;
  std::unordered_map<std::string, dev_mem> scratch_;
  uint8_t* pinned_ = nullptr;
  size_t pinned_bytes_ = 0;
  std::vector<uint8_t> blob_;
  bool trace_ = false;
  bool graphs_ = true;  // CEDAR_CUDA_GRAPHS=0: every step launched op by op (diagnostics)
  std::vector<uintptr_t> graph_key_, warm_key_;
  cudaGraphExec_t graph_exec_ = nullptr;
  uint64_t graph_launches_ = 0;
  cudaEvent_t events_[2] = {nullptr, nullptr};  // around a step's device work
  // diagnostics (CEDAR_CUDA_STEP_PHASES=1): external event nodes inside the step after the
  // upload and after the last kernel (last_step_phases_ms). The nodes themselves lengthen the
  // step by ~0.15 ms, all before the first kernel (H100, session 40): read the kernels' share
  bool phases_ = false;
  cudaEvent_t phase_events_[2] = {nullptr, nullptr};
  std::vector<double> last_phases_ms_;
  // the mHC sites' mix weights (reduce + Sinkhorn) on a side stream, forked after each site's
  // kernel and joined before the next reader of pre/post/comb (CEDAR_CUDA_MHC_SIDE=0: in line)
  bool mhc_side_ = true;
  // with mhc_side_, each site's mix reduction in extra blocks of the next grouped projections'
  // launch on the step's stream (qgemv_grouped_with_mix) instead of a launch on the side stream:
  // no fork and join in the step's graph, the same bits (CEDAR_CUDA_MIX_IN_GROUP=1; off until
  // measured)
  bool mix_in_group_ = false;
  cudaStream_t side_ = nullptr;
  cudaEvent_t side_events_[2] = {nullptr, nullptr};  // fork, join
  // the routed experts (route, up, SwiGLU, down) on a second stream while the shared expert's
  // SwiGLU and down projection run on the main one; joined before the combine (or the next
  // expand) adds them
  // (CEDAR_CUDA_MOE_SIDE=0: in line)
  bool moe_side_ = true;
  // CEDAR_CUDA_DEFER_NORM (default 1; 0 turns it off, A/B runs): steps whose projections all
  // take qgemv's vector path (up to k_qgemv_m_tile rows, or any rows with the tensor-core path
  // off) leave the mHC site without a last block, and the projections fold the collapsed rows'
  // RMSNorm factor into their own pass over x (Σ W·(x·w), then · inv: the last bits differ from
  // (x · inv) · w). Decode steps, chunks and replays all take it by the same rule, so a prompt's
  // rows give the same bits decoded one by one or in chunks (with the vector path); steps of
  // more rows on tensor cores keep the site's factors. Measured (H200, 8K, batch 1, device ms
  // per step): 1.2 B 1.03–1.04 vs 1.10 off, the shipped model 0.58–0.61 vs 0.62.
  bool defer_norm_ = true;
  // the routed experts' up projection routes for itself (each block its row, moe_route's warp;
  // the row's first block writes sel and the weights): no moe_route launch in decode steps and
  // chunks (CEDAR_CUDA_FUSE_ROUTE=0: the launch, A/B runs)
  bool fuse_route_ = true;
  // the FFNs' SwiGLU in their up projections' epilogue (qgemv's glu_up; moe_up_swiglu): a group
  // of rows holds a gate row and its up row, the lane with both sums writes the activation — no
  // swiglu_rows launch on either expert path (not for f32 weights, nor for bf16 shared experts
  // of steps on tensor cores). GPU-tested (the same bits as the two projections then swiglu_rows)
  // but measured no faster in a whole step on an H200 (session 39, README): off unless
  // CEDAR_CUDA_FUSE_SWIGLU=1.
  bool fuse_swiglu_ = false;
  // the routed experts' SwiGLU (and, in steps whose shared expert joins their down launch, the
  // shared expert's) taken on load by the down projection (moe_down_swiglu: each block computes
  // its item's activation into shared memory) — no swiglu_rows launch between the up and the
  // down projections; the same bits. Not yet run on a GPU (session 45 got no device): off
  // unless CEDAR_CUDA_SWIGLU_DOWN=1, until its tests and an A/B have run
  bool swiglu_down_ = false;
  // the generic kernels (kernels/cuda/generic_kernels.hpp) for the ops whose bits are set:
  // 1 the mHC sites (127 KB of code against 19 KB for the form compiled for the site's hc_fn
  // format and tail), 2 the embedding and Engram gathers — the same bits;
  // CEDAR_CUDA_GENERIC=mask, for A/B (default 0: the compiled forms)
  int generic_mask_ = 0;
  // this token's SWA entry (norm, RoPE, FP8 into the ring) on the expert stream, idle until the
  // FFN: forked after the projection that writes kv, joined before the attention, so the pack
  // leaves the critical path (q_b's projection runs meanwhile); with moe_side_ only. GPU-tested;
  // off unless CEDAR_CUDA_SWA_SIDE=1 (else in the step's pack launch): the fork and join cost
  // about what the pack saves (H200, session 39).
  bool swa_side_ = false;
  // the shared expert's down projection as fixed items of the routed experts' down launch
  // (qgemv_expert's n_fixed) in steps of at most this many rows: one launch and the expert
  // stream's fork and join fewer per layer, the FFN's chain group → up → down. Its items read the
  // weight once per row (the plain projection once per 8), so only small steps. Default 1 (steps
  // of one row); CEDAR_CUDA_FUSE_SHARED=N: steps of ≤ N rows, 0 off. Measured (H100, session 43,
  // device ms per step at 8K): the 1.2B config's batch 1 −1.9% (with N = 8 its batch 8 +0.6%),
  // the shipped model's batch 1 −4%; no faster on an H200 in session 39, before the evict-first
  // weight stream.
  int fuse_shared_rows_ = 1;
  cudaEvent_t swa_events_[2] = {nullptr, nullptr};  // fork, join
  // L2 lookahead (on unless CEDAR_CUDA_L2_LOOKAHEAD=0): after a layer's q_b projection, the weights read
  // after its index scores, top-k and attention (which leave the DRAM idle) — its output
  // projections, the FFN site's mix weights, the FFN's gate and shared expert, at most
  // k_lookahead_bytes — are asked into L2 by l2_prefetch_spans on pf_stream_, forked from the
  // step's stream there and joined before the head. Measured (H100, 1.2B config at 8K, device
  // ms per step): batch 1 −1.0%, batch 8 −0.4% (with the fused shared down: −2.2% / −0.7%, the
  // shipped model's batch 1 −3%); the next layer's attention-side projections
  // prefetched after the FFN's shared expert, evict-last lines or a 12 MB cap were slower, and
  // so was the routed experts' up launch asking for their down matrices once routed (session 43).
  bool l2_lookahead_ = true;
  static constexpr size_t k_lookahead_bytes = (size_t)32 << 20;
  cudaStream_t pf_stream_ = nullptr;
  cudaEvent_t pf_events_[2] = {nullptr, nullptr};  // fork, join
  // the routed experts' rows added to y by the next expand (hc_mix_collapse / hc_expand), not by
  // a moe_combine launch (CEDAR_CUDA_FOLD_COMBINE=0: the launch, diagnostics and A/B)
  bool fold_combine_ = true;
  cudaStream_t moe_stream_ = nullptr;
  cudaEvent_t moe_events_[2] = {nullptr, nullptr};  // fork, join
  double last_device_ms_ = -1.0;
  // prefill on the GPU in chunks of prefill_chunk_ rows (CEDAR_CUDA_PREFILL=0: on the CPU runner,
  // diagnostics and A/B; CEDAR_CUDA_PREFILL_CHUNK=N: the chunk)
  bool gpu_prefill_ = true;
  bool gpu_replay_ = true;  // bounded replay on the GPU (CEDAR_CUDA_REPLAY=0: on the CPU runner)
  // every step's index selections handed back as resume hints (CEDAR_CUDA_HINTS=0: not
  // recorded, diagnostics and A/B: a later replay then re-scores its rows)
  bool record_hints_ = true;
  // a chunk of at least this many rows runs its routed experts expert by expert (the items
  // sorted by expert on the host after the routing: each expert's rows in one projection, on
  // tensor cores for bf16 weights, the weights read once per chunk) instead of item by item,
  // when an expert's matrices are large (k_chunk_expert_bytes): the routing's round trip to the
  // host costs every layer ~tens of µs, which only large experts win back (H100, 8K prompt:
  // the 1.2B config's chunk of 256 rows +11%, the shipped model's −27%).
  // CEDAR_CUDA_CHUNK_EXPERTS=N: from N rows whatever the experts' size; 0: never.
  int chunk_experts_min_ = 256;
  bool chunk_experts_forced_ = false;
  bool big_experts_ = false;  // an expert's w1 of at least k_chunk_expert_bytes (upload_weights)
  static constexpr size_t k_chunk_expert_bytes = size_t(1) << 20;
  uint8_t* pinned_moe_ = nullptr;  // the chunk experts' routing down and span lists up
  size_t pinned_moe_bytes_ = 0;
  int prefill_chunk_ = 256;
};

result<const void*> cuda_backend::upload(const void* host, size_t bytes) {
  auto it = weights_.find(host);
  if (it != weights_.end()) {
    if (it->second.bytes < bytes)
      return make_error(errc::internal, "cuda backend: a weight view is larger than the tensor uploaded for it");
    return (const void*)it->second.p;
  }
  dev_mem m;
  CEDAR_TRY(m.reserve(bytes, stream_));
  if (auto st = kcu::cuda_status(cudaMemcpy(m.p, host, bytes, cudaMemcpyHostToDevice), "cuda backend: weight upload"); !st)
    return st.take_err();
  const void* p = m.p;
  weights_.emplace(host, std::move(m));
  return p;
}

result<const void*> cuda_backend::upload_array(const void* host, size_t bytes) {
  dev_mem m;
  CEDAR_TRY(m.reserve(bytes, stream_));
  if (auto st = kcu::cuda_status(cudaMemcpy(m.p, host, bytes, cudaMemcpyHostToDevice), "cuda backend: descriptor upload"); !st)
    return st.take_err();
  arrays_.push_back(std::move(m));
  return (const void*)arrays_.back().p;
}

result<qmatrix> cuda_backend::upload(const qmatrix& q) {
  if (q.empty()) return q;
  qmatrix d = q;
  const int64_t rows = q.row0 + q.rows;
  size_t row_bytes = 0;
  switch (q.format) {
    case kernels::weight_format::f32: row_bytes = 4 * (size_t)q.cols; break;
    case kernels::weight_format::bf16: row_bytes = 2 * (size_t)q.cols; break;
    case kernels::weight_format::f8_e4m3: row_bytes = (size_t)q.cols; break;
    case kernels::weight_format::fp4_e2m1: row_bytes = (size_t)q.cols / 2; break;
  }
  auto data = upload(q.data, row_bytes * (size_t)rows);
  if (!data) return data.take_err();
  d.data = *data;
  const size_t n_scales = (size_t)((rows + q.scale_block_rows - 1) / q.scale_block_rows) * (size_t)q.scale_cols;
  if (q.scale_e8m0) {
    auto s = upload(q.scale_e8m0, n_scales);
    if (!s) return s.take_err();
    d.scale_e8m0 = static_cast<const uint8_t*>(*s);
  }
  if (q.scale_f32) {
    auto s = upload(q.scale_f32, n_scales * sizeof(float));
    if (!s) return s.take_err();
    d.scale_f32 = static_cast<const float*>(*s);
  }
  return d;
}

#define CEDAR_UP(dst, src)          \
  do {                              \
    auto up_ = upload(src);         \
    if (!up_) return up_.take_err(); \
    dst = *up_;                     \
  } while (0)

status cuda_backend::upload_weights() {
  const model_config& c = e_.config();
  blocks_.resize((size_t)c.num_hidden_layers);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const block_weights& b = e_.block(l);
    dev_block& d = blocks_[(size_t)l];
    CEDAR_UP(d.hc_attn_fn, b.hc_attn_fn);
    CEDAR_UP(d.hc_ffn_fn, b.hc_ffn_fn);
    CEDAR_UP(d.hc_attn_base, b.hc_attn_base);
    CEDAR_UP(d.hc_attn_scale, b.hc_attn_scale);
    CEDAR_UP(d.hc_ffn_base, b.hc_ffn_base);
    CEDAR_UP(d.hc_ffn_scale, b.hc_ffn_scale);
    CEDAR_UP(d.attn_norm, b.attn_norm);
    CEDAR_UP(d.ffn_norm, b.ffn_norm);
    const attention_weights& a = b.attn;
    CEDAR_UP(d.wq_a, a.wq_a);
    CEDAR_UP(d.wq_b, a.wq_b);
    CEDAR_UP(d.wkv, a.wkv);
    CEDAR_UP(d.wo_a, a.wo_a);
    CEDAR_UP(d.wo_b, a.wo_b);
    CEDAR_UP(d.q_norm, a.q_norm);
    CEDAR_UP(d.kv_norm, a.kv_norm);
    CEDAR_UP(d.sink, a.attn_sink);
    if (a.has_compressor) {
      CEDAR_UP(d.c_wkv, a.compressor.wkv);
      CEDAR_UP(d.c_wgate, a.compressor.wgate);
      CEDAR_UP(d.c_norm, a.compressor.norm);
    }
    CEDAR_UP(d.i_wq_b, a.indexer.wq_b);
    CEDAR_UP(d.i_wproj, a.indexer.weights_proj);
    CEDAR_UP(d.i_wk, a.indexer.wk);
    CEDAR_UP(d.i_knorm, a.indexer.k_norm);
    const moe_weights& f = b.ffn;
    CEDAR_UP(d.gate, f.gate);
    CEDAR_UP(d.gate_bias, f.bias);
    CEDAR_UP(d.shared.w1, f.shared.w1);
    CEDAR_UP(d.shared.w3, f.shared.w3);
    CEDAR_UP(d.shared.w2, f.shared.w2);
    std::vector<qmatrix> w1(f.experts.size()), w3(f.experts.size()), w2(f.experts.size());
    for (size_t i = 0; i < f.experts.size(); ++i) {
      CEDAR_UP(w1[i], f.experts[i].w1);
      CEDAR_UP(w3[i], f.experts[i].w3);
      CEDAR_UP(w2[i], f.experts[i].w2);
    }
    if (!w1.empty()) {
      // the descriptor arrays are small device copies of the views (the moe kernels pick by id)
      // small device arrays of the views: the moe kernels pick an expert's matrices by id
      auto p1 = upload_array(w1.data(), sizeof(qmatrix) * w1.size());
      auto p3 = upload_array(w3.data(), sizeof(qmatrix) * w3.size());
      auto p2 = upload_array(w2.data(), sizeof(qmatrix) * w2.size());
      if (!p1 || !p3 || !p2) return make_error(errc::unavailable, "cuda backend: expert descriptor upload failed");
      d.x1 = w1[0], d.x3 = w3[0], d.x2 = w2[0];
      for (size_t i = 0; i < w1.size(); ++i) d.experts.push_back({w1[i], w3[i], w2[i]});
      big_experts_ = big_experts_ || f.experts[0].w1.data_bytes() >= k_chunk_expert_bytes;
      d.w1s = static_cast<const qmatrix*>(*p1);
      d.w3s = static_cast<const qmatrix*>(*p3);
      d.w2s = static_cast<const qmatrix*>(*p2);
    }
    if (b.has_engram) {
      CEDAR_UP(d.eg_table, b.engram.table);
      CEDAR_UP(d.eg_wkv, b.engram.wkv);
      CEDAR_UP(d.eg_qk, b.engram.qk);
    }
  }
  CEDAR_UP(embed_, e_.embed());
  CEDAR_UP(head_, e_.head());
  CEDAR_UP(norm_, e_.norm());
  return {};
}

status cuda_backend::init() {
  const kernels::cuda_probe_result p = kernels::cuda_probe();
  if (p.n_devices <= 0)
    return make_error(errc::unavailable, "cuda backend: " + (p.message.empty() ? std::string("no CUDA device found") : p.message));
  device_name_ = p.name;
  CEDAR_CU(cudaSetDevice(0), "cuda backend: select device 0");
  CEDAR_CU(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cuda backend: stream");
  for (cudaEvent_t& ev : events_) CEDAR_CU(cudaEventCreate(&ev), "cuda backend: event");
  if (phases_)
    for (cudaEvent_t& ev : phase_events_) CEDAR_CU(cudaEventCreate(&ev), "cuda backend: phase event");
  if (mhc_side_) {
    CEDAR_CU(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking), "cuda backend: side stream");
    for (cudaEvent_t& ev : side_events_)
      CEDAR_CU(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cuda backend: event");
  }
  if (moe_side_) {
    CEDAR_CU(cudaStreamCreateWithFlags(&moe_stream_, cudaStreamNonBlocking), "cuda backend: expert stream");
    for (cudaEvent_t& ev : moe_events_)
      CEDAR_CU(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cuda backend: event");
    for (cudaEvent_t& ev : swa_events_)
      CEDAR_CU(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cuda backend: event");
  }
  if (l2_lookahead_) {
    CEDAR_CU(cudaStreamCreateWithFlags(&pf_stream_, cudaStreamNonBlocking), "cuda backend: prefetch stream");
    for (cudaEvent_t& ev : pf_events_)
      CEDAR_CU(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cuda backend: event");
  }
  const model_config& c = e_.config();
  if (c.hc_mult > kcu::k_hc_max)
    return make_error(errc::mismatch, "cuda backend: hc_mult " + std::to_string(c.hc_mult) + " exceeds " +
                                          std::to_string(kcu::k_hc_max));
  return upload_weights();
}

// Rebuilds the device mirror of `s` from its host bytes.
status cuda_backend::sync_sequence(const sequence& s, dev_sequence& d) {
  const model_config& c = e_.config();
  const int L = c.num_hidden_layers, W = c.sliding_window;
  const size_t ring_bytes = (size_t)W * s.swa_entry_bytes();
  CEDAR_TRY(d.rings.reserve(ring_bytes * (size_t)L, stream_));
  for (int l = 0; l < L; ++l)
    CEDAR_CU(cudaMemcpyAsync(d.rings.as<uint8_t>() + ring_bytes * (size_t)l, s.ring(l).bytes.data(), ring_bytes,
                             cudaMemcpyHostToDevice, stream_),
             "cuda backend: ring upload");
  d.sources.resize((size_t)s.n_sources());
  for (int i = 0; i < s.n_sources(); ++i) {
    const kv_source_state& st = s.source(i);
    dev_source& ds = d.sources[(size_t)i];
    const size_t mb = s.main_entry_bytes(), ib = s.index_entry_bytes();
    const size_t cap = (size_t)std::max<int64_t>(st.n_entries + 64, 256);
    CEDAR_TRY(ds.main.reserve(cap * mb, stream_));
    CEDAR_TRY(ds.index.reserve(cap * ib, stream_));
    if (st.n_entries > 0) {
      CEDAR_CU(cudaMemcpyAsync(ds.main.p, st.main.data(), (size_t)st.n_entries * mb, cudaMemcpyHostToDevice, stream_),
               "cuda backend: KV upload");
      CEDAR_CU(cudaMemcpyAsync(ds.index.p, st.index.data(), (size_t)st.n_entries * ib, cudaMemcpyHostToDevice, stream_),
               "cuda backend: index key upload");
    }
    ds.n_entries = st.n_entries;
    const size_t pend = sizeof(float) * (size_t)std::max(1, st.ratio - 1) * (size_t)c.head_dim;
    CEDAR_TRY(ds.pending_kv.reserve(pend, stream_));
    CEDAR_TRY(ds.pending_gate.reserve(pend, stream_));
    if (st.n_pending > 0) {
      const size_t nb = sizeof(float) * (size_t)st.n_pending * (size_t)c.head_dim;
      CEDAR_CU(cudaMemcpyAsync(ds.pending_kv.p, st.pending_kv.data(), nb, cudaMemcpyHostToDevice, stream_),
               "cuda backend: pending upload");
      CEDAR_CU(cudaMemcpyAsync(ds.pending_gate.p, st.pending_gate.data(), nb, cudaMemcpyHostToDevice, stream_),
               "cuda backend: pending upload");
    }
  }
  // the host vectors may be reallocated by the caller after we return: wait for the copies
  CEDAR_CU(cudaStreamSynchronize(stream_), "cuda backend: sequence upload");
  d.id = s.id();
  d.version = s.version();
  return {};
}

status cuda_backend::decode_step(std::span<sequence* const> seqs, std::span<const int32_t> tokens,
                                 std::vector<float>& logits) {
  CEDAR_TRY(check_decode_batch(e_.config(), seqs, tokens));
  for (size_t i = 0; i < seqs.size(); ++i)
    if (seqs[i]->storage() != kv_storage::packed)
      return make_error(errc::mismatch, "decode_step: sequence " + std::to_string(i) +
                                            " keeps unquantised KV (the cuda backend decodes packed caches only)");
  return run_rows(seqs, tokens, step_spec{}, logits);
}

// Prefill on the GPU: the tokens in chunks of prefill_chunk_ rows, each chunk one step of the
// device (run_rows with chunk = true) that commits its rows before the next starts. CED mode
// (the runner's rule, forward.cpp ced_cut): when a call has more than sliding_window rows, the
// rows before its last sliding_window (the tail) run only up to the first decoder layer's
// compressor (enc_only chunks), and the decoder layers' rings start afresh at the tail; the
// tail starts a chunk. full_stack: every row runs every layer. all_logits: the logits of every
// row that reached the head (CED: the tail). On the CPU runner instead: a trace (tests),
// unquantised KV, or CEDAR_CUDA_PREFILL=0.
// An error in a later chunk leaves the earlier chunks' rows committed (the sequence stays
// consistent; the caller sees how far it got from n_tokens()).
result<logits_rows> cuda_backend::prefill(sequence& seq, std::span<const int32_t> tokens, const prefill_options& opt) {
  if (!gpu_prefill_ || opt.trace || seq.storage() != kv_storage::packed) return cpu_.prefill(seq, tokens, opt);
  const model_config& c = e_.config();
  CEDAR_TRY(check_prefill(c, seq, tokens));  // the runner's checks, before any row runs
  sequence* ps = &seq;
  const size_t T = tokens.size(), W = (size_t)c.sliding_window;
  const bool cut = opt.mode == prefill_mode::ced && T > W && c.first_decoder_layer >= 0;
  const size_t tail = cut ? T - W : 0;  // the first row that runs every layer
  const int64_t n0 = seq.n_tokens();
  logits_rows out;
  out.first_pos = opt.all_logits ? n0 + (int64_t)tail : n0 + (int64_t)T - 1;
  std::vector<float> lg;
  for (size_t off = 0; off < T;) {
    const bool enc = off < tail;
    const size_t n = std::min((enc ? tail : T) - off, (size_t)prefill_chunk_);
    if (cut && off == tail) {
      // the decoder layers' rings start at the tail (what the runner's CED cut leaves); the
      // mirror holds the same bytes, so it stays valid
      dev_sequence* m = nullptr;
      if (auto it = seqs_.find(seq.id()); it != seqs_.end() && it->second.id == seq.id() && it->second.version == seq.version())
        m = &it->second;
      for (int l = c.first_decoder_layer; l < c.num_hidden_layers; ++l) seq.set_ring_first_pos(l, n0 + (int64_t)tail);
      if (m) m->version = seq.version();
    }
    step_spec sp;
    sp.chunk = true, sp.all_logits = opt.all_logits, sp.enc_only = enc;
    CEDAR_TRY(run_rows({&ps, 1}, tokens.subspan(off, n), sp, lg));
    if (!enc) {
      if (opt.all_logits) out.values.insert(out.values.end(), lg.begin(), lg.end());
      else out.values.swap(lg);
    }
    off += n;
  }
  out.n_rows = opt.all_logits ? (int)(T - tail) : 1;
  return out;
}

// Bounded replay on the GPU (runner::replay's contract): the last n tokens (start rounded down
// to a multiple of every compress ratio) run again through every layer in chunks of
// prefill_chunk_ rows to rebuild the SWA rings; the persisted entries are read, never
// recomputed; the pending groups and the n-gram history are kept; the rows whose selections
// the sequence holds as resume hints take them instead of scoring. After a restore the mirror
// is uploaded first (the pages as stored, no conversion). On the CPU runner instead: unquantised
// KV, or CEDAR_CUDA_REPLAY=0.
result<logits_rows> cuda_backend::replay(sequence& seq, int n) {
  if (!gpu_replay_ || seq.storage() != kv_storage::packed) return cpu_.replay(seq, n);
  const model_config& c = e_.config();
  auto first = replay_start(c, seq, n);
  if (!first) return first.take_err();
  const int64_t N = seq.n_tokens(), start = *first;
  // the rings restart at `start`; a valid mirror stays valid (the windows exclude older slots)
  dev_sequence* m = nullptr;
  if (auto it = seqs_.find(seq.id()); it != seqs_.end() && it->second.id == seq.id() && it->second.version == seq.version())
    m = &it->second;
  for (int l = 0; l < c.num_hidden_layers; ++l) seq.set_ring_first_pos(l, start);
  if (m) m->version = seq.version();
  const int64_t hinted = N - std::max(start, seq.selections_from());  // the last rows
  sequence* ps = &seq;
  std::span<const int32_t> toks(seq.tokens().data() + start, (size_t)(N - start));
  logits_rows out;
  for (int64_t off = 0; off < N - start;) {
    const int64_t rows = std::min<int64_t>(N - start - off, prefill_chunk_);
    step_spec sp;
    sp.chunk = sp.replay = true;
    sp.pos0 = start + off;
    sp.head = off + rows == N - start;
    sp.hinted = (int)std::clamp<int64_t>(off + rows - (N - start - hinted), 0, rows);
    CEDAR_TRY(run_rows({&ps, 1}, toks.subspan((size_t)off, (size_t)rows), sp, out.values));
    off += rows;
  }
  out.n_rows = 1;
  out.first_pos = N - 1;
  return out;
}

status cuda_backend::run_rows(std::span<sequence* const> seqs, std::span<const int32_t> tokens, const step_spec& sp,
                              std::vector<float>& logits) {
  const model_config& c = e_.config();
  const bool chunk = sp.chunk || sp.replay, all_logits = sp.all_logits, enc_only = sp.enc_only, rep = sp.replay;
  const int B = (int)tokens.size();  // rows (decode: one per sequence)
  const int L = c.num_hidden_layers, W = c.sliding_window, hd = c.head_dim, H = c.num_attention_heads;
  const int d = (int)c.hidden_size, hc = c.hc_mult, V = c.vocab_size;
  const int ql = c.q_lora_rank, G = c.o_groups, orank = c.o_lora_rank, np = c.qk_rope_head_dim / 2;
  const int Hi = c.index_n_heads, Di = c.index_head_dim, K = c.index_topk, bs = c.candidate_block_size;
  const kcu::generic_kernels_scope generic_forms((unsigned)generic_mask_);  // (A/B: CEDAR_CUDA_GENERIC)
  const int F = c.moe_intermediate_size, E = c.n_routed_experts, KE = c.num_experts_per_tok;
  const float eps = (float)c.rms_norm_eps;
  const int S = seqs[0]->n_sources();
  const size_t swa_b = seqs[0]->swa_entry_bytes(), main_b = seqs[0]->main_entry_bytes(),
               idx_b = seqs[0]->index_entry_bytes();
  const engram_layout& EL = e_.engram();
  const int nl = EL.n_layers, nc = EL.n_layers ? EL.n_cols() : 0;
  ++step_;
  // row r's sequence: seqs[r] in a decode step, seqs[0] for every row of a prefill chunk
  const int nseq = chunk ? 1 : B;
  auto seq_of = [&](int r) -> sequence& { return *seqs[chunk ? 0 : (size_t)r]; };
  // A chunk's rows must see the SWA entries of the rows before them in the same step, which a
  // W-slot ring would overwrite: the chunk runs on an extended ring of Wx = W + B slots
  // (position p in slot p % Wx), filled from the sequence's ring first and copied back after.
  const int Wx = chunk ? W + B : W;
  const int fdl = c.first_decoder_layer;
  const int Lr = enc_only ? fdl : L;  // layers whose SWA entries this step writes
  // A chunk's compressor rows read their group's earlier rows straight from the projected
  // rows of this step: ckv/cgate hold P rows before row 0 (the sequence's pending rows, copied
  // in), so row r's group starts at row P + r − n_pending of the scratch.
  int P = 0;
  if (chunk)
    for (int i = 0; i < S; ++i) P = std::max(P, seqs[0]->source(i).ratio - 1);

  // ---- mirrors: valid or rebuilt; room for the new entries of every source -----------------
  std::vector<dev_sequence*> ds((size_t)B);
  for (int q = 0; q < nseq; ++q) {
    const sequence& s = *seqs[(size_t)q];
    dev_sequence& m = seqs_[s.id()];
    if (m.id != s.id() || m.version != s.version()) CEDAR_TRY(sync_sequence(s, m));
    m.last_used = step_;
    const size_t grow = chunk ? (size_t)B : 1;
    for (int i = 0; i < S; ++i) {
      dev_source& so = m.sources[(size_t)i];
      CEDAR_TRY(so.main.reserve((size_t)(so.n_entries + grow) * main_b, stream_, true));
      CEDAR_TRY(so.index.reserve((size_t)(so.n_entries + grow) * idx_b, stream_, true));
    }
    ds[(size_t)q] = &m;
  }
  if (chunk)
    for (int r = 1; r < B; ++r) ds[(size_t)r] = ds[0];
  if (seqs_.size() > 4 * (size_t)B + 64)  // forget mirrors of sequences not seen for a while
    for (auto it = seqs_.begin(); it != seqs_.end();)
      it = step_ - it->second.last_used > 1024 ? seqs_.erase(it) : std::next(it);
  // the compressor's projected rows (allocated before the step description: a chunk's pending
  // pointers point into them)
  float* ckv = ws<float>("ckv", (size_t)(P + B) * hd);
  float* cgate = ws<float>("cgate", (size_t)(P + B) * hd);
  if (!ckv || !cgate) return make_error(errc::unavailable, "cuda backend: out of device memory (step scratch)");
  uint8_t* ring_x = nullptr;  // a chunk's extended rings [L, Wx, swa_b]
  if (chunk) {
    ring_x = ws<uint8_t>("ring_x", (size_t)L * Wx * swa_b);
    if (!ring_x) return make_error(errc::unavailable, "cuda backend: out of device memory (prefill rings)");
  }

  // ---- host-side step description -> one blob ----------------------------------------------
  blob_.clear();
  std::vector<int64_t> pos((size_t)B);
  for (int r = 0; r < B; ++r)
    pos[(size_t)r] = chunk ? (rep ? sp.pos0 : seqs[0]->n_tokens()) + r : seqs[(size_t)r]->n_tokens();
  std::vector<float> cosm((size_t)B * np), sinm((size_t)B * np), cosc((size_t)B * np), sinc((size_t)B * np);
  for (int r = 0; r < B; ++r) {
    e_.main_rope().at(pos[(size_t)r], cosm.data() + (size_t)r * np, sinm.data() + (size_t)r * np);
    e_.compress_rope().at(pos[(size_t)r], cosc.data() + (size_t)r * np, sinc.data() + (size_t)r * np);
  }
  const size_t o_tok = blob_put(blob_, tokens.data(), (size_t)B);
  std::vector<float> e0((size_t)B * hc, 0.0f);  // the first block collapses with pre = e0
  for (int r = 0; r < B; ++r) e0[(size_t)r * hc] = 1.0f;
  const size_t o_e0 = blob_put(blob_, e0.data(), e0.size());
  const size_t o_cosm = blob_put(blob_, cosm.data(), cosm.size()), o_sinm = blob_put(blob_, sinm.data(), sinm.size());
  const size_t o_cosc = blob_put(blob_, cosc.data(), cosc.size()), o_sinc = blob_put(blob_, sinc.data(), sinc.size());
  // Engram hash ids [B, nl, nc] from each sequence's n-gram history (as run_rows does)
  std::vector<int64_t> hash((size_t)B * std::max(1, nl) * std::max(1, nc));
  if (nl > 0) {
    std::vector<int64_t> ctx((size_t)EL.max_ngram);
    for (int r = 0; r < B; ++r) {
      const std::vector<int64_t>& hist = seq_of(r).ngram_history();
      const int o = chunk ? r : 0;  // the row's predecessors in this step (a chunk's rows)
      for (int sh = 0; sh < EL.max_ngram; ++sh) {
        if (pos[(size_t)r] < sh) ctx[(size_t)sh] = e_.engram_pad_compressed();
        else if (sh <= o) ctx[(size_t)sh] = e_.engram_token_map()[(size_t)tokens[(size_t)(r - sh)]];
        else if (rep)  // a replayed row's predecessors are in the sequence's token log
          ctx[(size_t)sh] = e_.engram_token_map()[(size_t)seqs[0]->tokens()[(size_t)(pos[(size_t)r] - sh)]];
        else ctx[(size_t)sh] = hist[hist.size() - (size_t)(sh - o)];
      }
      for (int li = 0; li < nl; ++li) EL.hash(li, ctx.data(), hash.data() + ((size_t)r * nl + li) * nc);
    }
  }
  const size_t o_hash = blob_put(blob_, hash.data(), hash.size());
  // per source: emitting rows, new-entry destinations, pending pointers, entry RoPE
  std::vector<uint8_t*> dst_main((size_t)S * B), dst_index((size_t)S * B);
  std::vector<float*> pend_kv((size_t)S * B), pend_gate((size_t)S * B);
  std::vector<int> n_pend((size_t)S * B);
  std::vector<int64_t> ne_after((size_t)S * B);
  std::vector<float> cose((size_t)S * B * np), sine((size_t)S * B * np);
  std::vector<int> pend_end((size_t)S, 0), emits((size_t)S, 0);  // a chunk's: after its last row
  for (int i = 0; i < S; ++i) {
    int npend = 0;
    int64_t ne = 0;  // pending rows and entries before row r (a chunk's run on from row to row)
    for (int r = 0; r < B; ++r) {
      const kv_source_state& st = seq_of(r).source(i);
      dev_source& so = ds[(size_t)r]->sources[(size_t)i];
      const size_t k = (size_t)i * B + (size_t)r;
      if (!chunk || r == 0) npend = st.n_pending, ne = st.n_entries;
      const bool emit = !rep && (st.ratio == 1 || npend == st.ratio - 1);  // a replay appends nothing
      const size_t slot = (size_t)(so.n_entries + (ne - st.n_entries));  // the mirror's count = the host's
      dst_main[k] = emit ? so.main.as<uint8_t>() + slot * main_b : nullptr;
      dst_index[k] = emit ? so.index.as<uint8_t>() + slot * idx_b : nullptr;
      pend_kv[k] = chunk ? ckv + (size_t)(P + r - npend) * hd : so.pending_kv.as<float>();
      pend_gate[k] = chunk ? cgate + (size_t)(P + r - npend) * hd : so.pending_gate.as<float>();
      n_pend[k] = npend;
      e_.compress_rope().at(ne * (int64_t)st.ratio, cose.data() + k * np, sine.data() + k * np);
      if (emit) ++ne, npend = 0, ++emits[(size_t)i];
      else if (!rep) ++npend;
      ne_after[k] = ne;
    }
    pend_end[(size_t)i] = npend;
  }
  const size_t o_dmain = blob_put(blob_, dst_main.data(), dst_main.size());
  const size_t o_didx = blob_put(blob_, dst_index.data(), dst_index.size());
  const size_t o_pkv = blob_put(blob_, pend_kv.data(), pend_kv.size());
  const size_t o_pg = blob_put(blob_, pend_gate.data(), pend_gate.size());
  const size_t o_npend = blob_put(blob_, n_pend.data(), n_pend.size());
  const size_t o_cose = blob_put(blob_, cose.data(), cose.size()), o_sine = blob_put(blob_, sine.data(), sine.size());
  // per layer: ring slot destinations, ring bases, window bounds; source bases for reading
  std::vector<uint8_t*> ring_dst((size_t)L * B);
  std::vector<const uint8_t*> ring_base((size_t)L * B);
  std::vector<int> wstart((size_t)L * B), wn((size_t)L * B);
  for (int l = 0; l < L; ++l)
    for (int r = 0; r < B; ++r) {
      const size_t k = (size_t)l * B + (size_t)r;
      uint8_t* base = chunk ? ring_x + (size_t)l * Wx * swa_b : ds[(size_t)r]->rings.as<uint8_t>() + (size_t)l * W * swa_b;
      const int64_t p = pos[(size_t)r];
      ring_base[k] = base;
      ring_dst[k] = base + (size_t)(p % Wx) * swa_b;
      const int64_t lo = std::max<int64_t>({seq_of(r).ring(l).first_pos, p - W + 1, 0});
      wstart[k] = (int)(lo % Wx);
      wn[k] = (int)(p - lo + 1);
    }
  // a chunk's ring copies: the sequence's valid ring entries into the extended rings before the
  // layers run, the last W positions back after them
  std::vector<const uint8_t*> rx_src[2];
  std::vector<uint8_t*> rx_dst[2];
  std::vector<uint32_t> rx_len[2];
  if (chunk) {
    const int64_t n0 = pos[0], n1 = n0 + B;
    for (int l = 0; l < Lr; ++l) {
      uint8_t* ring = ds[0]->rings.as<uint8_t>() + (size_t)l * W * swa_b;
      uint8_t* ext = ring_x + (size_t)l * Wx * swa_b;
      const int64_t fp = seqs[0]->ring(l).first_pos;
      for (int64_t p = std::max<int64_t>({fp, n0 - W, 0}); p < n0; ++p) {
        rx_src[0].push_back(ring + (size_t)(p % W) * swa_b);
        rx_dst[0].push_back(ext + (size_t)(p % Wx) * swa_b);
        rx_len[0].push_back((uint32_t)swa_b);
      }
      for (int64_t p = std::max<int64_t>({fp, n1 - W, 0}); p < n1; ++p) {
        rx_src[1].push_back(ext + (size_t)(p % Wx) * swa_b);
        rx_dst[1].push_back(ring + (size_t)(p % W) * swa_b);
        rx_len[1].push_back((uint32_t)swa_b);
      }
    }
  }
  size_t o_rx[2][3] = {};
  for (int j = 0; j < 2; ++j) {
    o_rx[j][0] = blob_put(blob_, rx_src[j].data(), rx_src[j].size());
    o_rx[j][1] = blob_put(blob_, rx_dst[j].data(), rx_dst[j].size());
    o_rx[j][2] = blob_put(blob_, rx_len[j].data(), rx_len[j].size());
  }
  const size_t o_rdst = blob_put(blob_, ring_dst.data(), ring_dst.size());
  const size_t o_rbase = blob_put(blob_, ring_base.data(), ring_base.size());
  const size_t o_wstart = blob_put(blob_, wstart.data(), wstart.size()), o_wn = blob_put(blob_, wn.data(), wn.size());
  std::vector<const uint8_t*> src_main((size_t)S * B), src_index((size_t)S * B);
  for (int i = 0; i < S; ++i)
    for (int r = 0; r < B; ++r) {
      src_main[(size_t)i * B + r] = ds[(size_t)r]->sources[(size_t)i].main.as<uint8_t>();
      src_index[(size_t)i * B + r] = ds[(size_t)r]->sources[(size_t)i].index.as<uint8_t>();
    }
  const size_t o_smain = blob_put(blob_, src_main.data(), src_main.size());
  const size_t o_sidx = blob_put(blob_, src_index.data(), src_index.size());
  // per index layer: visible entries of each row
  std::vector<int> vis((size_t)L * B, 0);
  std::vector<int> vis_max((size_t)L, 0);
  for (int l = 0; l < L; ++l) {
    const layer_info& li = c.layers[(size_t)l];
    if (li.ratio <= 0) continue;
    const int si = seqs[0]->source_of_layer(li.kv_source);
    for (int r = 0; r < B; ++r) {
      const int v = (int)std::min<int64_t>(ne_after[(size_t)si * B + r], (pos[(size_t)r] + 1) / li.ratio);
      vis[(size_t)l * B + r] = v;
      vis_max[(size_t)l] = std::max(vis_max[(size_t)l], v);
    }
  }
  const size_t o_vis = blob_put(blob_, vis.data(), vis.size());
  // index selections: each index layer's top-k into its own slot of `sel` ([n_idx, B, K] ids,
  // then [n_idx, B] counts, after the staged cache bytes), so the rows a sequence keeps as
  // resume hints come down with the step (a decode step: every row, in the one download; a
  // chunk: its last selection_capacity() rows; a replay: none, the hints stay the exact pass's)
  std::vector<int> islot((size_t)L, -1), idx_layer;
  int n_idx_run = 0;  // index layers this step runs (enc_only: those before first_decoder_layer)
  for (int l = 0; l < L; ++l)
    if (c.layers[(size_t)l].ratio > 0 && e_.block(l).attn.has_indexer) {
      islot[(size_t)l] = (int)idx_layer.size();
      idx_layer.push_back(l);
      if (!enc_only || l < fdl) n_idx_run = (int)idx_layer.size();
    }
  const int n_idx = (int)idx_layer.size();
  const int keep = rep || !record_hints_ || n_idx_run == 0 ? 0 : chunk ? std::min(B, seqs[0]->selection_capacity()) : B;
  const size_t sel_bytes = sizeof(int32_t) * (size_t)n_idx * B * (K + 1);
  const size_t sel_dl = sizeof(int32_t) * (size_t)n_idx_run * keep * (K + 1);
  // a replay's hinted rows (its last nh): their selections, uploaded with the step
  const int nh = rep ? std::clamp(sp.hinted, 0, B) : 0;
  size_t o_hid = 0, o_hn = 0;
  if (nh > 0 && n_idx > 0) {
    std::vector<int32_t> hid((size_t)n_idx * nh * K);
    std::vector<int> hn((size_t)n_idx * nh);
    for (int j = 0; j < n_idx; ++j)
      for (int i = 0; i < nh; ++i) {
        const int32_t* h = seqs[0]->selection(idx_layer[(size_t)j], pos[(size_t)(B - nh + i)]);
        int n = 0;
        while (n < K && h[n] >= 0) ++n;
        std::copy_n(h, K, hid.data() + ((size_t)j * nh + i) * K);
        hn[(size_t)j * nh + i] = n;
      }
    o_hid = blob_put(blob_, hid.data(), hid.size());
    o_hn = blob_put(blob_, hn.data(), hn.size());
  }

  // write-back spans, at offsets that depend only on the batch shape (so a captured graph stays
  // valid): ring slots [L, B]; per (source, row) two slots — the new main entry and index key,
  // or the pending kv and gate rows when the row's group is not complete
  std::vector<const uint8_t*> span_src;
  std::vector<uint8_t*> span_dst;
  std::vector<uint32_t> span_len;
  struct back_item {
    int kind, a, r;  // 0 ring (layer a), 1 main (source a), 2 index, 3 pending kv, 4 pending gate
    size_t off, len;
    int pend = 0;  // kinds 3, 4: the pending row's index
  };
  std::vector<back_item> back;
  auto r16 = [](size_t n) { return (n + 15) & ~size_t(15); };
  const size_t slot_a = r16(std::max(main_b, sizeof(float) * (size_t)hd)),
               slot_b = r16(std::max(idx_b, sizeof(float) * (size_t)hd));
  const size_t stage_bytes = (size_t)L * B * r16(swa_b) + (size_t)S * B * (slot_a + slot_b);
  auto add_back = [&](int kind, int a, int r, const uint8_t* src, size_t len, size_t off, int pend = 0) {
    back.push_back({kind, a, r, off, len, pend});
    span_src.push_back(src);
    span_dst.push_back(nullptr);  // staging address filled in below
    span_len.push_back((uint32_t)len);
  };
  // (a chunk hands back only what outlives it: the ring slots of its last W rows, every new
  // entry, and the pending rows of its last, unfinished group)
  for (int l = 0; l < Lr; ++l)
    for (int r = chunk ? std::max(0, B - W) : 0; r < B; ++r)
      add_back(0, l, r, ring_dst[(size_t)l * B + r], swa_b, ((size_t)l * B + r) * r16(swa_b));
  for (int i = 0; i < S; ++i)
    for (int r = 0; r < B; ++r) {
      const size_t k = (size_t)i * B + (size_t)r;
      const size_t off = (size_t)L * B * r16(swa_b) + k * (slot_a + slot_b);
      if (dst_main[k]) {
        add_back(1, i, r, dst_main[k], main_b, off);
        add_back(2, i, r, dst_index[k], idx_b, off + slot_a);
      } else if (!rep && (!chunk || r >= B - pend_end[(size_t)i])) {
        // from the mirror's pending rows (a chunk copies its last group's rows there)
        const dev_source& so = ds[(size_t)r]->sources[(size_t)i];
        const size_t rowb = sizeof(float) * (size_t)hd, po = rowb * (size_t)n_pend[k];
        add_back(3, i, r, so.pending_kv.as<uint8_t>() + po, rowb, off, n_pend[k]);
        add_back(4, i, r, so.pending_gate.as<uint8_t>() + po, rowb, off + slot_a, n_pend[k]);
      }
    }
  uint8_t* stage = ws<uint8_t>("stage", stage_bytes + sel_bytes);  // sel (below) after the cache bytes
  if (!stage) return make_error(errc::unavailable, "cuda backend: out of device memory (staging)");
  int32_t* sel_ids = reinterpret_cast<int32_t*>(stage + stage_bytes);
  int* sel_n = reinterpret_cast<int*>(sel_ids + (size_t)n_idx * B * K);
  for (size_t j = 0; j < back.size(); ++j) span_dst[j] = stage + back[j].off;
  const int n_spans = (int)back.size();
  const size_t o_ssrc = blob_put(blob_, span_src.data(), span_src.size());
  const size_t o_sdst = blob_put(blob_, span_dst.data(), span_dst.size());
  const size_t o_slen = blob_put(blob_, span_len.data(), span_len.size());

  // ---- pinned host buffer (the blob going up, logits + staged bytes coming down) ------------
  const int rows_out = enc_only || (rep && !sp.head) ? 0 : chunk && !all_logits ? 1 : B,
            row_out0 = B - rows_out;  // rows reaching the head
  const size_t lg_bytes = sizeof(float) * (size_t)rows_out * V;
  CEDAR_TRY(grow_pinned(pinned_, pinned_bytes_, std::max(blob_.size(), lg_bytes + stage_bytes + sel_dl)));
  uint8_t* dblob = ws<uint8_t>("blob", blob_.size());
  if (!dblob) return make_error(errc::unavailable, "cuda backend: out of device memory (step inputs)");
  auto at = [&](size_t off) { return dblob + off; };
  const int32_t* d_tok = reinterpret_cast<const int32_t*>(at(o_tok));
  const float *d_cosm = (const float*)at(o_cosm), *d_sinm = (const float*)at(o_sinm);
  const float *d_cosc = (const float*)at(o_cosc), *d_sinc = (const float*)at(o_sinc);
  const int64_t* d_hash = (const int64_t*)at(o_hash);

  // ---- scratch -----------------------------------------------------------------------------
  float* X = ws<float>("X", (size_t)B * hc * d);
  float* partial = ws<float>("mix_partial", kcu::hc_mix_partial_floats(B, hc, d));
  float* xinv = ws<float>("x_inv", (size_t)B);  // RMSNorm factors of the collapsed rows x
  float* pre = ws<float>("pre", (size_t)B * hc);
  float* apre = ws<float>("apre", (size_t)B * hc);
  float* post = ws<float>("post", (size_t)B * hc);
  float* comb = ws<float>("comb", (size_t)B * hc * hc);
  float* x = ws<float>("x", (size_t)B * d);
  float* y = ws<float>("y", (size_t)B * d);
  float* qr = ws<float>("qr", (size_t)B * ql);
  float* q = ws<float>("q", (size_t)B * H * hd);
  float* kvr = ws<float>("kv", (size_t)B * hd);
  float* o = ws<float>("o", (size_t)B * H * hd);
  float* oa = ws<float>("oa", (size_t)B * G * orank);
  float* latent = ws<float>("latent", (size_t)B * hd);
  float* keys = ws<float>("keys", (size_t)B * Di);
  float* qi = ws<float>("qi", (size_t)B * Hi * Di);
  float* wts = ws<float>("wts", (size_t)B * Hi);
  // zeroed by one memset at the start of every step: topk_n [B], the mHC sites' row counters
  // [B] (hc_mix_collapse's fused hc_post) and the attention's (row, head group) counters [B × H]
  // (the split fold in the attention kernel); each kernel leaves its counters zero again
  const size_t n_zeroed = 2 * (size_t)B + (size_t)B * H;
  int* zeroed = ws<int>("zeroed", n_zeroed);
  int* topk_n = zeroed;
  unsigned* site_done = zeroed ? reinterpret_cast<unsigned*>(zeroed + B) : nullptr;
  unsigned* attn_done = zeroed ? reinterpret_cast<unsigned*>(zeroed + 2 * (size_t)B) : nullptr;
  float* h = ws<float>("h", (size_t)B * 2 * F);
  float* act = ws<float>("act", (size_t)B * F);
  float* gl = ws<float>("gate_logits", (size_t)B * std::max(1, E));
  int32_t* sel = ws<int32_t>("sel", (size_t)B * std::max(1, KE));
  float* selw = ws<float>("selw", (size_t)B * std::max(1, KE));
  float* h2 = ws<float>("h2", (size_t)B * std::max(1, KE) * 2 * F);
  float* act2 = ws<float>("act2", (size_t)B * std::max(1, KE) * F);
  float* ye = ws<float>("ye", (size_t)B * std::max(1, KE) * d);
  // a chunk's routed experts expert by expert (chunk_experts_min_): the items' rows gathered in
  // expert order (xg, their norm factors and route weights), [gate | up] and SwiGLU in h2 and
  // act2 in that order, the down projections into yg, scattered back to ye in item order
  const int n_items = B * KE;
  const bool by_expert = chunk && E > 0 && KE > 0 && chunk_experts_min_ > 0 && B >= chunk_experts_min_ &&
                         (chunk_experts_forced_ || big_experts_);
  float *xg = nullptr, *yg = nullptr, *xinvg = nullptr, *selwg = nullptr;
  uint8_t* mspans = nullptr;
  const size_t mspan_bytes = (size_t)4 * n_items * (2 * sizeof(void*) + sizeof(uint32_t));
  if (by_expert) {
    xg = ws<float>("xg", (size_t)n_items * d);
    yg = ws<float>("yg", (size_t)n_items * d);
    xinvg = ws<float>("xinvg", (size_t)n_items);
    selwg = ws<float>("selwg", (size_t)n_items);
    mspans = ws<uint8_t>("moe_spans", mspan_bytes);
    if (!xg || !yg || !xinvg || !selwg || !mspans)
      return make_error(errc::unavailable, "cuda backend: out of device memory (chunk experts)");
    CEDAR_TRY(grow_pinned(pinned_moe_, pinned_moe_bytes_, mspan_bytes + sizeof(int32_t) * (size_t)n_items));
  }
  float* emb = ws<float>("emb", (size_t)B * std::max(1, nc * c.engram_head_dim));
  float* ekv = ws<float>("ekv", (size_t)B * d * (hc + 1));
  float* lg = ws<float>("logits", (size_t)B * V);
  // index layers score a capacity of entries (a multiple of k_entry_quantum, −inf past each
  // row's visible ones): the launch shapes change once every k_entry_quantum entries, not every
  // step, so a captured step graph is reused
  std::vector<int> ecap((size_t)L, 0);
  int emax = 1;
  for (int l = 0; l < L; ++l) {
    ecap[(size_t)l] = (std::max(1, vis_max[(size_t)l]) + k_entry_quantum - 1) / k_entry_quantum * k_entry_quantum;
    emax = std::max(emax, ecap[(size_t)l]);
  }
  const int nbmax = std::max(1, (emax + bs - 1) / std::max(1, bs));
  float* score = ws<float>("score", (size_t)B * emax);
  float* bscore = ws<float>("bscore", (size_t)B * nbmax);
  int32_t* bids = ws<int32_t>("bids", (size_t)B * std::max(1, c.candidate_topk_blocks));
  int* bn = ws<int>("bn", (size_t)B);
  uint8_t* allowed = ws<uint8_t>("allowed", (size_t)B * nbmax);
  for (void* pp : {(void*)X, (void*)partial, (void*)xinv, (void*)pre, (void*)apre, (void*)post, (void*)comb, (void*)x,
                   (void*)y, (void*)qr, (void*)q, (void*)kvr, (void*)o, (void*)oa, (void*)ckv, (void*)cgate,
                   (void*)latent, (void*)keys, (void*)qi, (void*)wts, (void*)zeroed,
                   (void*)h, (void*)act, (void*)gl, (void*)sel, (void*)selw, (void*)h2, (void*)act2, (void*)ye,
                   (void*)emb, (void*)ekv, (void*)lg, (void*)score, (void*)bscore, (void*)bids, (void*)bn,
                   (void*)allowed})
    if (!pp) return make_error(errc::unavailable, "cuda backend: out of device memory (step scratch)");
  float* attn_ws = nullptr;  // split-over-keys workspace, sized for the widest layer once
  size_t attn_ws_floats = 0;
  {
    kcu::sparse_attention_params ap;
    ap.R = B, ap.H = H, ap.D = hd, ap.max_keys = W + K;
    attn_ws_floats = kcu::sparse_attention_workspace_floats(ap);
    if (attn_ws_floats > 0) {
      attn_ws = ws<float>("attn_ws", attn_ws_floats);
      if (!attn_ws) attn_ws_floats = 0;
    }
  }

  // norm_w: the x rows are RMS-normalised with these weights on the fly (qgemv's x_norm_w)
  // (norm_inv: the rows' factors when a previous kernel computed them, else each block sums)
  auto gemv_item = [&](const qmatrix& w, const float* in, int ldx, float* out, int ldy, const float* norm_w = nullptr,
                       const float* norm_inv = nullptr) {
    kcu::qgemv_params p;
    p.w = w;
    p.m = B;
    p.x = in;
    p.ldx = ldx;
    p.y = out;
    p.ldy = ldy;
    p.x_norm_w = norm_w;
    p.x_norm_eps = eps;
    p.x_norm_inv = norm_inv;
    return p;
  };
  auto gemv = [&](const qmatrix& w, const float* in, int ldx, float* out, int ldy) -> status {
    return kcu::qgemv(gemv_item(w, in, ldx, out, ldy), stream_);
  };

  // One mHC site: the mix projection's partials and the collapse of the streams with the
  // previous site's weights (collapse_pre) in one pass over X; then the mix weights (new_pre,
  // post, comb) from the partials. x is left un-normalised: its RMSNorm (attn_norm / ffn_norm)
  // is applied by the projections that read it (x_norm_w), so no launch writes a normed copy.
  // expand_y: the previous sub-layer's output, expanded into the streams by the same kernel
  // first (its post/comb are still those of the previous site).
  // With the side stream (mhc_side_), the site's kernel leaves only x_inv (what the sub-layer's
  // projections read) and the mix weights are reduced from its partials on side_, off the
  // critical path: nothing reads them before the next site (or hc_expand / the head), which
  // join_side() first. The partials are next written by the next site's kernel, after the join.
  // Steps whose projections all take the vector path (up to k_qgemv_m_tile rows, or the
  // tensor-core path off), with the side stream: the site's kernel has no last block at all (no
  // fence, atomic or reduction on the critical path); the projections fold x's RMSNorm factor
  // into their own pass over x (qgemv: x_norm_inv null; the rounding differs in the last bits).
  // The same rule for decode steps, chunks and replays, so a prompt's rows give the same bits
  // whatever the chunk size (tests hold them to it); the experts expert by expert take the
  // deferred form too (their gathered factors are then not used), so they still equal the
  // item-by-item experts bit for bit on the vector path.
  const bool defer_norm = defer_norm_ && side_ && (B <= kcu::k_qgemv_m_tile || !kcu::qgemv_mma_enabled());
  const float* xinv_in = defer_norm ? nullptr : xinv;  // what the projections are given
  bool side_pending = false;
  // a site's mix reduction left to the next grouped projections on stream_ (mix_in_group_)
  bool mix_pending = false;
  kcu::hc_post_params pending_mix;
  auto join_side = [&]() -> status {
    if (mix_pending) {  // no grouped launch took it: its own launch, in line
      mix_pending = false;
      CEDAR_TRY(kcu::hc_post(pending_mix, stream_));
    }
    if (!side_pending) return {};
    side_pending = false;
    CEDAR_CU(cudaStreamWaitEvent(stream_, side_events_[1], 0), "cuda backend: join side stream");
    return {};
  };
  // projections grouped on stream_, carrying a pending mix reduction in extra blocks
  auto grouped_main = [&](const kcu::qgemv_params* items, int n) -> status {
    if (!mix_pending) return kcu::qgemv_grouped(items, n, stream_);
    mix_pending = false;
    return kcu::qgemv_grouped_with_mix(items, n, pending_mix, stream_);
  };
  // a sub-layer output not yet expanded into the streams: y, and the routed experts' rows when
  // their combine is left to the expand (fold_combine_)
  struct pending_out {
    const float* y = nullptr;
    const float* ye = nullptr;
    const int32_t* sel = nullptr;
    int K = 0;
  };
  auto expand = [&](const pending_out& po) -> status {
    return kcu::hc_expand(X, po.y, post, comb, B, hc, d, stream_, po.ye, po.sel, po.K);
  };
  // The L2 lookahead (l2_lookahead_): the matrices' bytes (data, then scales), at most
  // k_lookahead_bytes in all, prefetched on pf_stream_ after what stream_ has so far; joined
  // before the head.
  bool pf_pending = false;
  auto lookahead = [&](std::initializer_list<const qmatrix*> ms) -> status {
    if (!pf_stream_) return {};
    kcu::l2_prefetch_params pp;
    size_t budget = k_lookahead_bytes;
    auto take = [&](const void* p, size_t n) {
      n = std::min(n, budget);
      if (n > 0 && pp.add(p, n)) budget -= n;
    };
    for (const qmatrix* q : ms) {
      if (q->empty()) continue;
      const size_t bytes = q->data_bytes(), row_bytes = bytes / (size_t)q->rows;
      take(static_cast<const char*>(q->data) + (size_t)q->row0 * row_bytes, bytes);
      const int64_t sb = std::max(1, q->scale_block_rows), b0 = q->row0 / sb, b1 = (q->row0 + q->rows + sb - 1) / sb;
      const size_t nsc = (size_t)(b1 - b0) * (size_t)q->scale_cols;
      if (q->scale_e8m0) take(q->scale_e8m0 + (size_t)b0 * q->scale_cols, nsc);
      if (q->scale_f32) take(q->scale_f32 + (size_t)b0 * q->scale_cols, sizeof(float) * nsc);
    }
    if (pp.n == 0) return {};
    CEDAR_CU(cudaEventRecord(pf_events_[0], stream_), "cuda backend: fork prefetch stream");
    CEDAR_CU(cudaStreamWaitEvent(pf_stream_, pf_events_[0], 0), "cuda backend: fork prefetch stream");
    CEDAR_TRY(kcu::l2_prefetch_spans(pp, pf_stream_));
    CEDAR_CU(cudaEventRecord(pf_events_[1], pf_stream_), "cuda backend: join prefetch stream");
    pf_pending = true;
    return {};
  };
  auto mhc_site = [&](const qmatrix& fn, const float* base, const float* scale, float* new_pre,
                      const float* collapse_pre, const pending_out& expand_y) -> status {
    CEDAR_TRY(join_side());
    kcu::hc_mix_params mp;
    mp.R = B, mp.hc = hc, mp.d = d, mp.X = X, mp.fn = fn, mp.pre = collapse_pre, mp.partial = partial, mp.v = x;
    if (expand_y.y) {
      mp.y = expand_y.y, mp.post = post, mp.comb = comb;
      mp.ye = expand_y.ye, mp.ye_sel = expand_y.sel, mp.ye_K = expand_y.K;
    }
    // the mixes (hc_post's partial form) in the same launch: the last block of each row reduces
    kcu::hc_post_params& hp = mp.site;
    hp.R = B, hp.hc = hc, hp.sinkhorn_iters = c.hc_sinkhorn_iters, hp.eps = (float)c.hc_eps;
    hp.norm_eps = eps;
    hp.x_inv = xinv, hp.x_cols = d, hp.x_eps = eps;
    hp.base = base, hp.scale = scale, hp.pre = new_pre, hp.post = post, hp.comb = comb;
    mp.done = site_done;
    if (!side_) return kcu::hc_mix_collapse(mp, stream_);
    mp.x_inv_only = true;
    if (defer_norm) mp.done = nullptr, mp.x_inv_only = false;
    CEDAR_TRY(kcu::hc_mix_collapse(mp, stream_));
    kcu::hc_post_params sp = hp;
    sp.partial = partial, sp.nblk = kcu::hc_mix_blocks(d), sp.ncols = hc * d, sp.x_inv = nullptr;
    if (mix_in_group_ && hc == 4) {  // in the next grouped projections' launch: no fork
      pending_mix = sp, mix_pending = true;
      return {};
    }
    CEDAR_CU(cudaEventRecord(side_events_[0], stream_), "cuda backend: fork side stream");
    CEDAR_CU(cudaStreamWaitEvent(side_, side_events_[0], 0), "cuda backend: fork side stream");
    CEDAR_TRY(kcu::hc_post(sp, side_));
    CEDAR_CU(cudaEventRecord(side_events_[1], side_), "cuda backend: join side stream");
    side_pending = true;
    return {};
  };

  // The routed experts of a chunk expert by expert (by_expert), on stream es after moe_route:
  // the routing comes down (the chunk runs op by op, so the host may wait), the items are
  // sorted by expert (ascending item within an expert), and each expert's rows go through one
  // grouped w1/w3 projection and one w2 projection — bf16 weights on tensor cores, read once
  // per chunk instead of once per item. h2/act2 hold the items in expert order; ye gets each
  // item's row back in item order, so the combine (or the folded expand) is unchanged.
  auto experts_by_expert = [&](const dev_block& b, const float* xin, cudaStream_t es) -> status {
    const int n = n_items;
    int32_t* hsel = reinterpret_cast<int32_t*>(pinned_moe_ + mspan_bytes);
    CEDAR_CU(cudaMemcpyAsync(hsel, sel, sizeof(int32_t) * (size_t)n, cudaMemcpyDeviceToHost, es), "cuda backend: routing download");
    CEDAR_CU(cudaStreamSynchronize(es), "cuda backend: routing download");
    std::vector<int> off((size_t)E + 1, 0), item((size_t)n);
    for (int i = 0; i < n; ++i) {
      if (hsel[i] < 0 || hsel[i] >= E)
        return make_error(errc::internal, "cuda backend: routed expert id " + std::to_string(hsel[i]) + " out of range");
      ++off[(size_t)hsel[i] + 1];
    }
    for (int e = 0; e < E; ++e) off[(size_t)e + 1] += off[(size_t)e];
    {
      std::vector<int> fill(off.begin(), off.end() - 1);
      for (int i = 0; i < n; ++i) item[(size_t)fill[(size_t)hsel[i]]++] = i;
    }
    // spans: [0, 3n) gather (x row, its norm factor, its route weight), [3n, 4n) scatter
    const uint8_t** src = reinterpret_cast<const uint8_t**>(pinned_moe_);
    uint8_t** dst = reinterpret_cast<uint8_t**>(pinned_moe_ + sizeof(void*) * 4 * (size_t)n);
    uint32_t* len = reinterpret_cast<uint32_t*>(pinned_moe_ + sizeof(void*) * 8 * (size_t)n);
    const uint32_t rowb = (uint32_t)(sizeof(float) * (size_t)d);
    for (int j = 0; j < n; ++j) {
      const int i = item[(size_t)j], r = i / KE;
      src[j] = reinterpret_cast<const uint8_t*>(xin + (size_t)r * d), dst[j] = reinterpret_cast<uint8_t*>(xg + (size_t)j * d), len[j] = rowb;
      src[n + j] = reinterpret_cast<const uint8_t*>(xinv + r), dst[n + j] = reinterpret_cast<uint8_t*>(xinvg + j), len[n + j] = 4;
      src[2 * n + j] = reinterpret_cast<const uint8_t*>(selw + i), dst[2 * n + j] = reinterpret_cast<uint8_t*>(selwg + j),
                len[2 * n + j] = 4;
      src[3 * n + j] = reinterpret_cast<const uint8_t*>(yg + (size_t)j * d), dst[3 * n + j] = reinterpret_cast<uint8_t*>(ye + (size_t)i * d),
                len[3 * n + j] = rowb;
    }
    CEDAR_CU(cudaMemcpyAsync(mspans, pinned_moe_, mspan_bytes, cudaMemcpyHostToDevice, es), "cuda backend: span upload");
    const uint8_t* const* dsrc = reinterpret_cast<const uint8_t* const*>(mspans);
    uint8_t* const* ddst = reinterpret_cast<uint8_t* const*>(mspans + sizeof(void*) * 4 * (size_t)n);
    const uint32_t* dlen = reinterpret_cast<const uint32_t*>(mspans + sizeof(void*) * 8 * (size_t)n);
    CEDAR_TRY(kcu::copy_spans(dsrc, ddst, dlen, 3 * n, es));
    for (int e = 0; e < E; ++e) {
      const int m = off[(size_t)e + 1] - off[(size_t)e], o0 = off[(size_t)e];
      if (m == 0) continue;
      const dev_expert& x = b.experts[(size_t)e];
      kcu::qgemv_params it[2];
      for (int k = 0; k < 2; ++k) {
        kcu::qgemv_params& p = it[k];
        p.w = k == 0 ? x.w1 : x.w3;
        p.m = m, p.x = xg + (size_t)o0 * d, p.ldx = d;
        p.y = h2 + (size_t)o0 * 2 * F + (size_t)k * F, p.ldy = 2 * F;
        p.x_norm_w = b.ffn_norm, p.x_norm_eps = eps, p.x_norm_inv = xinv_in ? xinvg + o0 : nullptr;
      }
      CEDAR_TRY(kcu::qgemv_grouped(it, 2, es));
    }
    CEDAR_TRY(kcu::swiglu_rows(h2, n, F, (float)c.swiglu_limit, selwg, act2, es));
    for (int e = 0; e < E; ++e) {
      const int m = off[(size_t)e + 1] - off[(size_t)e], o0 = off[(size_t)e];
      if (m == 0) continue;
      kcu::qgemv_params p;
      p.w = b.experts[(size_t)e].w2;
      p.m = m, p.x = act2 + (size_t)o0 * F, p.ldx = F, p.y = yg + (size_t)o0 * d, p.ldy = d;
      CEDAR_TRY(kcu::qgemv(p, es));
    }
    return kcu::copy_spans(dsrc + 3 * n, ddst + 3 * n, dlen + 3 * n, n, es);
  };

  // a phase mark (phases_): an external event node when captured, a plain record when eager
  auto phase = [&](int i) -> status {
    if (!phases_) return {};
    // (the external flag is an error outside a capture: CUDA's EventRecordFlags)
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    CEDAR_CU(cudaStreamIsCapturing(stream_, &cs), "cuda backend: phase event");
    CEDAR_CU(cudaEventRecordWithFlags(phase_events_[i], stream_,
                                      cs == cudaStreamCaptureStatusActive ? cudaEventRecordExternal : cudaEventRecordDefault),
             "cuda backend: phase event");
    return {};
  };
  auto enqueue = [&]() -> status {
    // ---- embedding: hc copies; the first block collapses with pre = e0 ----------------------
    CEDAR_CU(cudaMemcpyAsync(dblob, pinned_, blob_.size(), cudaMemcpyHostToDevice, stream_), "cuda backend: step upload");
    CEDAR_TRY(phase(0));
    CEDAR_CU(cudaMemsetAsync(zeroed, 0, sizeof(int) * n_zeroed, stream_), "cuda backend: memset");
    if (!rx_len[0].empty())  // a chunk: the sequence's ring entries into the extended rings
      CEDAR_TRY(kcu::copy_spans((const uint8_t* const*)at(o_rx[0][0]), (uint8_t* const*)at(o_rx[0][1]),
                                (const uint32_t*)at(o_rx[0][2]), (int)rx_len[0].size(), stream_));
    CEDAR_TRY(kcu::embed_rows(embed_, d_tok, B, hc, X, stream_));
    CEDAR_CU(cudaMemcpyAsync(pre, at(o_e0), sizeof(float) * (size_t)B * hc, cudaMemcpyDeviceToDevice, stream_),
             "cuda backend: pre");

    int eli = 0;
    int cand_nb = 0;
    // the latest index layer's selections (none before the first: topk_n is zeroed; a KV source
    // is always an index source, so no layer reads them before one)
    int32_t* cur_ids = sel_ids;
    int* cur_n = topk_n;
    pending_out pending;  // a sub-layer output not yet expanded into the streams
    for (int l = 0; l < L; ++l) {
      const layer_info& li = c.layers[(size_t)l];
      const dev_block& b = blocks_[(size_t)l];
      const attention_weights& ha = e_.block(l).attn;
      if (li.engram && pending.y) {  // Engram reads the streams: the FFN's expand first
        CEDAR_TRY(join_side());
        CEDAR_TRY(expand(pending));
        pending = {};
      }
      if (li.engram) {
        CEDAR_TRY(kcu::table_rows(b.eg_table, d_hash, B, nl, eli, nc, emb, stream_));
        CEDAR_TRY(gemv(b.eg_wkv, emb, nc * c.engram_head_dim, ekv, d * (hc + 1)));
        CEDAR_TRY(kcu::engram_gate(X, ekv, b.eg_qk, B, hc, d, eps, stream_));
        ++eli;
      }
      // --- attention site: mixes (apre, post, comb), collapse with the previous pre ---
      CEDAR_TRY(mhc_site(b.hc_attn_fn, b.hc_attn_base, b.hc_attn_scale, apre, pre, pending));
      pending = {};
      // --- compressor: a new entry (or a pending row) of this KV source ---
      // every projection of the hidden row x (normalised on the fly with attn_norm) in one
      // grouped launch: q_a, kv, the compressor's kv and gate, the indexer's head weights
      const bool indexed = li.ratio > 0 && ha.has_indexer;
      // a CED prefill's rows before the tail stop at the first decoder layer's compressor
      const bool cut = enc_only && l == fdl;
      const bool comp = ha.has_compressor && !rep;  // a replay's entries are in the sequence already
      const int csrc = comp ? seqs[0]->source_of_layer(l) : -1;
      const size_t rowf = sizeof(float) * (size_t)hd;
      float* ckv_rows = ckv + (size_t)P * hd;  // row 0 of this step's projected compressor rows
      float* cgate_rows = cgate + (size_t)P * hd;
      if (chunk && csrc >= 0 && li.ratio > 1) {  // the sequence's pending rows before row 0
        const int np0 = seqs[0]->source(csrc).n_pending;
        const dev_source& so = ds[0]->sources[(size_t)csrc];
        if (np0 > 0) {
          CEDAR_CU(cudaMemcpyAsync(ckv_rows - (size_t)np0 * hd, so.pending_kv.p, rowf * np0, cudaMemcpyDeviceToDevice, stream_),
                   "cuda backend: pending rows");
          CEDAR_CU(cudaMemcpyAsync(cgate_rows - (size_t)np0 * hd, so.pending_gate.p, rowf * np0, cudaMemcpyDeviceToDevice,
                                   stream_),
                   "cuda backend: pending rows");
        }
      }
      {
        kcu::qgemv_params it[5];
        int n = 0;
        if (!cut) {
          it[n++] = gemv_item(b.wq_a, x, d, qr, ql, b.attn_norm, xinv_in);
          it[n++] = gemv_item(b.wkv, x, d, kvr, hd, b.attn_norm, xinv_in);
        }
        if (comp) {
          it[n++] = gemv_item(b.c_wkv, x, d, ckv_rows, hd, b.attn_norm, xinv_in);
          if (li.ratio > 1) it[n++] = gemv_item(b.c_wgate, x, d, cgate_rows, hd, b.attn_norm, xinv_in);
        }
        if (indexed && !cut) it[n++] = gemv_item(b.i_wproj, x, d, wts, Hi, b.attn_norm, xinv_in);
        if (n > 0 || mix_pending) CEDAR_TRY(grouped_main(it, n));
      }
      // this token's SWA entry: norm, RoPE, FP8 into its ring slot (q's RoPE is applied by the
      // attention kernel as it reads q) — on the expert stream while q_b's projection runs
      // (swa_side_), else in the pack launch below
      const float* rc = li.ratio > 0 ? d_cosc : d_cosm;
      const float* rs = li.ratio > 0 ? d_sinc : d_sinm;
      kcu::norm_rope_pack_params swa;
      swa.R = B, swa.n = hd, swa.x = kvr, swa.norm_w = b.kv_norm, swa.eps = eps, swa.cos = rc, swa.sin = rs, swa.np = np;
      swa.kind = kcu::pack_kind::fp8_swa, swa.dst = (uint8_t* const*)at(o_rdst) + (size_t)l * B;
      const bool swa_fork = !cut && swa_side_ && moe_stream_;
      if (swa_fork) {
        CEDAR_CU(cudaEventRecord(swa_events_[0], stream_), "cuda backend: fork SWA entry");
        CEDAR_CU(cudaStreamWaitEvent(moe_stream_, swa_events_[0], 0), "cuda backend: fork SWA entry");
        CEDAR_TRY(kcu::norm_rope_pack(swa, moe_stream_));
        CEDAR_CU(cudaEventRecord(swa_events_[1], moe_stream_), "cuda backend: join SWA entry");
      }
      // the cache entries of this step: norm, RoPE and encoding jobs, launched together below
      kcu::norm_rope_pack_params packs[kcu::k_norm_rope_pack_max];
      int npacks = 0;
      if (comp) {
        const size_t k0 = (size_t)csrc * B;
        kcu::compressor_params cp;
        cp.R = B, cp.hd = hd, cp.ratio = li.ratio, cp.eps = eps, cp.kv = ckv_rows;
        cp.gate = li.ratio > 1 ? cgate_rows : nullptr;
        cp.norm = b.c_norm;
        cp.pending_kv = (float* const*)at(o_pkv) + k0;
        cp.pending_gate = (float* const*)at(o_pg) + k0;
        cp.n_pending = (const int*)at(o_npend) + k0;
        cp.latent = latent;
        CEDAR_TRY(kcu::compressor_step(cp, stream_));
        const int npe = pend_end[(size_t)csrc];
        if (chunk && li.ratio > 1 && npe > 0) {  // the unfinished group's rows into the mirror
          const dev_source& so = ds[0]->sources[(size_t)csrc];
          CEDAR_CU(cudaMemcpyAsync(so.pending_kv.p, ckv_rows + (size_t)(B - npe) * hd, rowf * npe, cudaMemcpyDeviceToDevice,
                                   stream_),
                   "cuda backend: pending rows");
          CEDAR_CU(cudaMemcpyAsync(so.pending_gate.p, cgate_rows + (size_t)(B - npe) * hd, rowf * npe,
                                   cudaMemcpyDeviceToDevice, stream_),
                   "cuda backend: pending rows");
        }
        const float* ce = (const float*)at(o_cose) + k0 * np;
        const float* se = (const float*)at(o_sine) + k0 * np;
        // index key (i_wk · latent, below): norm, RoPE, FP4 index entry; latent: RoPE, FP4 main
        // entry (rows that do not complete a group have null destinations and are skipped)
        kcu::norm_rope_pack_params& kp = packs[npacks++];
        kp.R = B, kp.n = Di, kp.x = keys, kp.norm_w = b.i_knorm, kp.eps = eps, kp.cos = ce, kp.sin = se, kp.np = np;
        kp.kind = kcu::pack_kind::fp4_index, kp.dst = (uint8_t* const*)at(o_didx) + k0;
        kcu::norm_rope_pack_params& lp = packs[npacks++];
        lp.R = B, lp.n = hd, lp.x = latent, lp.cos = ce, lp.sin = se, lp.np = np;
        lp.kind = kcu::pack_kind::fp4_kv, lp.dst = (uint8_t* const*)at(o_dmain) + k0;
      }
      // --- attention ---
      {  // the projections of the q latent, normalised on the fly: q heads, indexer queries; and
         // the compressor's index key from the new latent
        kcu::qgemv_params it[3];
        int n = 0;
        if (!cut) it[n++] = gemv_item(b.wq_b, qr, ql, q, H * hd, b.q_norm);
        if (indexed && !cut) it[n++] = gemv_item(b.i_wq_b, qr, ql, qi, Hi * Di, b.q_norm);
        if (comp) it[n++] = gemv_item(b.i_wk, latent, hd, keys, Di);
        if (n > 0 || mix_pending) CEDAR_TRY(grouped_main(it, n));
      }
      if (l2_lookahead_ && !cut)
        CEDAR_TRY(lookahead({&b.wo_a, &b.wo_b, &b.hc_ffn_fn, &b.shared.w1, &b.shared.w3, &b.gate, &b.shared.w2}));
      if (cut) {
        if (npacks > 0) CEDAR_TRY(kcu::norm_rope_pack_many(packs, npacks, stream_));
        break;
      }
      if (!swa_fork) packs[npacks++] = swa;
      if (indexed) {  // indexer queries: RoPE, then their FP4 round trip
        kcu::norm_rope_pack_params& qp = packs[npacks++];
        qp.R = B * Hi, qp.nvec = Hi, qp.n = Di, qp.x = qi, qp.cos = d_cosc, qp.sin = d_sinc, qp.np = np;
        qp.kind = kcu::pack_kind::fp4_index_fake, qp.write_back = true;
      }
      if (npacks > 0) CEDAR_TRY(kcu::norm_rope_pack_many(packs, npacks, stream_));
      int src = -1;
      if (li.ratio > 0) src = seqs[0]->source_of_layer(li.kv_source);
      if (indexed && nh < B) {
        const int Ev = ecap[(size_t)l];
        kcu::index_scores_params ip;
        ip.R = B, ip.E = Ev, ip.Hi = Hi, ip.Di = Di, ip.sscale = 1.0f / std::sqrt((float)Di);
        ip.wscale = 1.0f / std::sqrt((float)Hi);
        ip.q = qi, ip.w = wts, ip.keys = (const uint8_t* const*)at(o_sidx) + (size_t)src * B;
        ip.vis = (const int*)at(o_vis) + (size_t)l * B;
        ip.score = score;
        if (li.candidate_restricted && cand_nb > 0) {
          if (cand_nb < (Ev + bs - 1) / bs)
            return make_error(errc::internal, "cuda backend: candidate pool narrower than the restricted layer's entries");
          ip.allowed = allowed, ip.block = bs, ip.nb = cand_nb;
        }
        CEDAR_TRY(kcu::index_scores(ip, stream_));
        if (li.candidate_source) {
          cand_nb = (Ev + bs - 1) / bs;
          CEDAR_TRY(kcu::block_max(score, ip.vis, B, Ev, bs, cand_nb, bscore, stream_));
          CEDAR_TRY(kcu::topk(bscore, B, cand_nb, c.candidate_topk_blocks, bids, bn, stream_));
          CEDAR_TRY(kcu::ids_to_mask(bids, bn, B, c.candidate_topk_blocks, cand_nb, allowed, stream_));
        }
        CEDAR_TRY(kcu::topk(score, B, Ev, K, sel_ids + (size_t)islot[(size_t)l] * B * K,
                            sel_n + (size_t)islot[(size_t)l] * B, stream_));
      }
      if (indexed) {  // this layer's selections: read by its attention and the layers sharing them
        cur_ids = sel_ids + (size_t)islot[(size_t)l] * B * K;
        cur_n = sel_n + (size_t)islot[(size_t)l] * B;
        if (nh > 0) {  // a replay's hinted rows: the exact pass's selections instead
          const int j = islot[(size_t)l];
          CEDAR_CU(cudaMemcpyAsync(cur_ids + (size_t)(B - nh) * K, at(o_hid) + sizeof(int32_t) * (size_t)j * nh * K,
                                   sizeof(int32_t) * (size_t)nh * K, cudaMemcpyDeviceToDevice, stream_),
                   "cuda backend: resume hints");
          CEDAR_CU(cudaMemcpyAsync(cur_n + (B - nh), at(o_hn) + sizeof(int) * (size_t)j * nh, sizeof(int) * (size_t)nh,
                                   cudaMemcpyDeviceToDevice, stream_),
                   "cuda backend: resume hints");
        }
      }
      {
        kcu::sparse_attention_params ap;
        ap.R = B, ap.H = H, ap.D = hd, ap.scale = 1.0f / std::sqrt((float)hd);
        ap.q = q, ap.sink = b.sink;
        ap.wkeys = (const uint8_t* const*)at(o_rbase) + (size_t)l * B;
        ap.wstart = (const int*)at(o_wstart) + (size_t)l * B;
        ap.wn = (const int*)at(o_wn) + (size_t)l * B;
        ap.wcap = Wx;
        if (src >= 0) {
          ap.main = (const uint8_t* const*)at(o_smain) + (size_t)src * B;
          ap.sel = cur_ids, ap.nsel = cur_n, ap.K = K;
        }
        ap.out = o;
        ap.rope_cos = rc, ap.rope_sin = rs, ap.rope_np = np;  // q rotated on read, the output back
        ap.max_keys = W + (src >= 0 ? K : 0);
        ap.workspace = attn_ws;
        ap.workspace_floats = attn_ws_floats;
        ap.done = attn_done;
        if (swa_fork) CEDAR_CU(cudaStreamWaitEvent(stream_, swa_events_[1], 0), "cuda backend: join SWA entry");
        CEDAR_TRY(kcu::sparse_attention(ap, stream_));
      }
      {
        const int gin = H * hd / G;
        std::vector<kcu::qgemv_params> items((size_t)G);
        for (int g = 0; g < G; ++g) {
          kcu::qgemv_params& p = items[(size_t)g];
          p.w = b.wo_a.slice_rows((int64_t)g * orank, orank);
          p.m = B, p.x = o + (size_t)g * gin, p.ldx = H * hd, p.y = oa + (size_t)g * orank, p.ldy = G * orank;
        }
        for (int g0 = 0; g0 < G; g0 += kcu::k_qgemv_group_max)
          CEDAR_TRY(kcu::qgemv_grouped(items.data() + g0, std::min(G - g0, kcu::k_qgemv_group_max), stream_));
      }
      CEDAR_TRY(gemv(b.wo_b, oa, G * orank, y, d));
      // --- FFN site (the attention output expanded into the streams first): mixes (pre for
      // the next block, post, comb), collapse with apre ---
      CEDAR_TRY(mhc_site(b.hc_ffn_fn, b.hc_ffn_base, b.hc_ffn_scale, pre, apre, pending_out{y}));
      // --- MoE: shared expert into y, routed experts added in expert-id order ---
      // the shared expert's SwiGLU in its up projection (fuse_swiglu_): not f32, and a bf16 one
      // only on the vector path (tensor-core steps keep the two plain items)
      const kernels::weight_format sf = b.shared.w1.format;
      const bool shared_glu = fuse_swiglu_ && !b.shared.w1.empty() && sf != kernels::weight_format::f32 &&
                              (sf != kernels::weight_format::bf16 || B <= kcu::k_qgemv_m_tile || !kcu::qgemv_mma_enabled());
      {  // the projections of x (normalised on the fly with ffn_norm): the shared expert's w1 and
         // w3 (or its activation, shared_glu), the router's gate
        kcu::qgemv_params it[3];
        int n = 0;
        if (!b.shared.w1.empty() && shared_glu) {  // the activation straight into act
          it[n] = gemv_item(b.shared.w1, x, d, act, F, b.ffn_norm, xinv_in);
          it[n].glu_up = b.shared.w3, it[n++].glu_limit = (float)c.swiglu_limit;
        } else if (!b.shared.w1.empty()) {
          it[n++] = gemv_item(b.shared.w1, x, d, h, 2 * F, b.ffn_norm, xinv_in);
          it[n++] = gemv_item(b.shared.w3, x, d, h + F, 2 * F, b.ffn_norm, xinv_in);
        }
        if (E > 0 && KE > 0) it[n++] = gemv_item(b.gate, x, d, gl, E, b.ffn_norm, xinv_in);
        if (n > 0 || mix_pending) CEDAR_TRY(grouped_main(it, n));
      }
      // the routed experts on moe_stream_ (their own buffers: gate logits in, ye out) while
      // the shared expert runs here; the combine, which adds ye into y, waits for both
      const bool routed = E > 0 && KE > 0;
      const bool expert_order = routed && by_expert && (int)b.experts.size() == E;
      // the shared expert's down projection in the routed experts' down launch (fuse_shared_rows_):
      // everything on this stream, no fork; its w2 must be a matrix like the experts' w2
      const bool shared_down = routed && !expert_order && B <= fuse_shared_rows_ && !b.shared.w1.empty() &&
                               kcu::same_layout(b.shared.w2, b.x2);
      const bool fork = routed && moe_stream_ && !b.shared.w1.empty() && !shared_down;
      cudaStream_t es = fork ? moe_stream_ : stream_;
      if (fork) {
        CEDAR_CU(cudaEventRecord(moe_events_[0], stream_), "cuda backend: fork expert stream");
        CEDAR_CU(cudaStreamWaitEvent(moe_stream_, moe_events_[0], 0), "cuda backend: fork expert stream");
      }
      if (routed) {
        kcu::moe_route_params rp;
        rp.R = B, rp.E = E, rp.K = KE, rp.logits = gl, rp.bias = b.gate_bias, rp.renormalise = c.norm_topk_prob;
        rp.route_scale = (float)c.routed_scaling_factor, rp.sel = sel, rp.weight = selw;
        // the up projection routes for itself (fuse_route_): one launch fewer on the experts' path
        const bool self_route = fuse_route_ && !expert_order && E <= 32 * 32 && KE <= kcu::k_route_max_k;
        if (!self_route) CEDAR_TRY(kcu::moe_route(rp, es));
        // the SwiGLU on the down projection's load (swiglu_down_; the shared expert's too when it
        // joins the launch and its up projection wrote gate and up rows)
        const bool routed_glu = fuse_swiglu_ && b.x1.format != kernels::weight_format::f32;
        const bool down_glu = swiglu_down_ && !routed_glu && F <= kcu::k_x_glu_max_cols && !(shared_down && shared_glu);
        if (expert_order) {
          CEDAR_TRY(experts_by_expert(b, x, es));
        } else {
          if (routed_glu) {
            CEDAR_TRY(kcu::moe_up_swiglu(b.w1s, b.w3s, b.x1, b.x3, sel, B, KE, x, d, F, (float)c.swiglu_limit, selw, act2,
                                         es, b.ffn_norm, eps, xinv_in, self_route ? &rp : nullptr));
          } else {
            CEDAR_TRY(kcu::moe_up(b.w1s, b.w3s, b.x1, b.x3, sel, B, KE, x, d, F, h2, es, b.ffn_norm, eps, xinv_in,
                                  self_route ? &rp : nullptr));
            if (!down_glu) CEDAR_TRY(kcu::swiglu_rows(h2, B * KE, F, (float)c.swiglu_limit, selw, act2, es));
          }
          const kernels::qmatrix* sw2 = shared_down ? &b.shared.w2 : nullptr;
          if (down_glu) {
            CEDAR_TRY(kcu::moe_down_swiglu(b.w2s, b.x2, sel, B, KE, h2, F, (float)c.swiglu_limit, selw, d, ye, es, sw2, h, y));
          } else {  // the shared expert's activation first (unless its up wrote it)
            if (shared_down && !shared_glu) CEDAR_TRY(kcu::swiglu_rows(h, B, F, (float)c.swiglu_limit, nullptr, act, stream_));
            CEDAR_TRY(kcu::moe_down(b.w2s, b.x2, sel, B, KE, act2, F, d, ye, es, sw2, act, y));
          }
        }
      }
      // the combine folded into the next expand (the same bits as moe_combine then the expand)
      const bool fused = routed && fold_combine_;
      if (shared_down) {
        // in the down launch above
      } else if (!b.shared.w1.empty()) {
        if (!shared_glu) CEDAR_TRY(kcu::swiglu_rows(h, B, F, (float)c.swiglu_limit, nullptr, act, stream_));
        CEDAR_TRY(gemv(b.shared.w2, act, F, y, d));
      } else {
        CEDAR_CU(cudaMemsetAsync(y, 0, sizeof(float) * (size_t)B * d, stream_), "cuda backend: memset");
      }
      if (fork) {
        CEDAR_CU(cudaEventRecord(moe_events_[1], moe_stream_), "cuda backend: join expert stream");
        CEDAR_CU(cudaStreamWaitEvent(stream_, moe_events_[1], 0), "cuda backend: join expert stream");
      }
      if (routed && !fused) CEDAR_TRY(kcu::moe_combine(y, ye, sel, B, KE, d, stream_));
      // expanded by the next site's kernel (or below, before Engram / the head)
      pending = fused ? pending_out{y, ye, sel, KE} : pending_out{y};
      if (trace_) {  // diagnostics (CEDAR_CUDA_TRACE): row 0's residual streams after each layer
        CEDAR_TRY(join_side());
        CEDAR_TRY(expand(pending));
        pending = {};
        std::vector<float> hx((size_t)hc * d);
        CEDAR_CU(cudaMemcpyAsync(hx.data(), X, sizeof(float) * hx.size(), cudaMemcpyDeviceToHost, stream_), "trace");
        CEDAR_CU(cudaStreamSynchronize(stream_), "trace");
        double sa = 0;
        for (float v : hx) sa += std::fabs(v);
        std::fprintf(stderr, "cuda trace: layer %2d  sum|X| %.6g  X[0..3] %.5g %.5g %.5g %.5g\n", l, sa, hx[0], hx[1], hx[2], hx[3]);
      }
    }
    // ---- head ------------------------------------------------------------------------------
    CEDAR_TRY(join_side());
    if (pf_pending) {
      pf_pending = false;
      CEDAR_CU(cudaStreamWaitEvent(stream_, pf_events_[1], 0), "cuda backend: join prefetch stream");
    }
    if (rows_out > 0) {
      if (pending.y) CEDAR_TRY(expand(pending));
      CEDAR_TRY(kcu::hc_collapse_norm(X + (size_t)row_out0 * hc * d, pre + (size_t)row_out0 * hc, norm_, x, rows_out,
                                      hc, d, eps, stream_));
      kcu::qgemv_params hp = gemv_item(head_, x, d, lg, V);
      hp.m = rows_out;
      CEDAR_TRY(kcu::qgemv(hp, stream_));
    }
    if (!rx_len[1].empty())  // a chunk: the last W positions back into the sequence's rings
      CEDAR_TRY(kcu::copy_spans((const uint8_t* const*)at(o_rx[1][0]), (uint8_t* const*)at(o_rx[1][1]),
                                (const uint32_t*)at(o_rx[1][2]), (int)rx_len[1].size(), stream_));
    CEDAR_TRY(kcu::copy_spans((const uint8_t* const*)at(o_ssrc), (uint8_t* const*)at(o_sdst), (const uint32_t*)at(o_slen),
                              n_spans, stream_));
    CEDAR_TRY(phase(1));
    // one download: logits, then the staged cache bytes
    if (lg_bytes)
      CEDAR_CU(cudaMemcpyAsync(pinned_, lg, lg_bytes, cudaMemcpyDeviceToHost, stream_), "cuda backend: logits download");
    if (keep == B && n_idx_run == n_idx) {  // the selections contiguous after the cache bytes
      CEDAR_CU(cudaMemcpyAsync(pinned_ + lg_bytes, stage, stage_bytes + sel_dl, cudaMemcpyDeviceToHost, stream_),
               "cuda backend: cache download");
    } else {
      CEDAR_CU(cudaMemcpyAsync(pinned_ + lg_bytes, stage, stage_bytes, cudaMemcpyDeviceToHost, stream_),
               "cuda backend: cache download");
      if (sel_dl > 0) {  // rows [B − keep, B) of the index layers run: ids, then counts
        uint8_t* hs = pinned_ + lg_bytes + stage_bytes;
        const size_t w_ids = sizeof(int32_t) * (size_t)keep * K, w_n = sizeof(int) * (size_t)keep;
        CEDAR_CU(cudaMemcpy2DAsync(hs, w_ids, sel_ids + (size_t)(B - keep) * K, sizeof(int32_t) * (size_t)B * K, w_ids,
                                   (size_t)n_idx_run, cudaMemcpyDeviceToHost, stream_),
                 "cuda backend: selections download");
        CEDAR_CU(cudaMemcpy2DAsync(hs + w_ids * n_idx_run, w_n, sel_n + (B - keep), sizeof(int) * (size_t)B, w_n,
                                   (size_t)n_idx_run, cudaMemcpyDeviceToHost, stream_),
                 "cuda backend: selections download");
      }
    }
    return {};
  };

  // ---- run: eagerly the first time a shape is seen, captured into a CUDA graph the second time,
  // replayed from then on (one launch per step instead of ~40 per layer) -----------------------
  std::memcpy(pinned_, blob_.data(), blob_.size());
  std::vector<uintptr_t> key = {(uintptr_t)B, (uintptr_t)pinned_, (uintptr_t)dblob, (uintptr_t)stage,
                                (uintptr_t)blob_.size(), (uintptr_t)attn_ws};
  for (int l = 0; l < L; ++l) key.push_back((uintptr_t)ecap[(size_t)l]);
  for (auto& [name, m] : scratch_) key.push_back((uintptr_t)m.p);
  const bool graphs = graphs_ && !trace_ && !chunk;  // a prefill chunk runs op by op
  CEDAR_CU(cudaEventRecord(events_[0], stream_), "cuda backend: event");  // before any capture
  double launch_host_ms = -1.0;  // the host's cudaGraphLaunch call of a replay (phases_)
  if (graphs && graph_exec_ && key == graph_key_) {
    const auto h0 = std::chrono::steady_clock::now();
    CEDAR_CU(cudaGraphLaunch(graph_exec_, stream_), "cuda backend: graph launch");
    launch_host_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - h0).count();
    ++graph_launches_;
  } else if (graphs && key == warm_key_) {
    cudaGraph_t g = nullptr;
    CEDAR_CU(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed), "cuda backend: graph capture");
    const status st = enqueue();
    const cudaError_t ce = cudaStreamEndCapture(stream_, &g);
    if (!st) {
      if (g) cudaGraphDestroy(g);
      return st;
    }
    CEDAR_CU(ce, "cuda backend: graph capture");
    if (graph_exec_) cudaGraphExecDestroy(graph_exec_);
    graph_exec_ = nullptr;
    const cudaError_t ie = cudaGraphInstantiate(&graph_exec_, g, 0);
    cudaGraphDestroy(g);
    CEDAR_CU(ie, "cuda backend: graph instantiate");
    graph_key_ = key;
    CEDAR_CU(cudaGraphLaunch(graph_exec_, stream_), "cuda backend: graph launch");
    ++graph_launches_;
  } else {
    CEDAR_TRY(enqueue());
    if (!chunk) warm_key_ = key;
  }
  CEDAR_CU(cudaEventRecord(events_[1], stream_), "cuda backend: event");
  CEDAR_CU(cudaStreamSynchronize(stream_), "cuda backend: step");
  float dev_ms = -1.0f;
  last_device_ms_ = cudaEventElapsedTime(&dev_ms, events_[0], events_[1]) == cudaSuccess ? dev_ms : -1.0;
  last_phases_ms_.clear();
  if (phases_) {  // start event -> after the upload -> after the last kernel -> end event
    const cudaEvent_t mark[4] = {events_[0], phase_events_[0], phase_events_[1], events_[1]};
    for (int i = 0; i < 3; ++i) {
      float ms = 0.0f;
      if (cudaEventElapsedTime(&ms, mark[i], mark[i + 1]) != cudaSuccess) {
        last_phases_ms_.clear();
        cudaGetLastError();  // (a failed reading is not a sticky error; clear it)
        break;
      }
      last_phases_ms_.push_back(ms);
    }
    if (!last_phases_ms_.empty() && launch_host_ms >= 0) last_phases_ms_.push_back(launch_host_ms);
  }
  logits.resize((size_t)rows_out * V);
  std::memcpy(logits.data(), pinned_, lg_bytes);

  // ---- write back into the host sequences (the owners) ---------------------------------------
  const uint8_t* st_host = pinned_ + lg_bytes;
  for (const back_item& bi : back) {
    sequence& s = seq_of(bi.r);
    const uint8_t* bytes = st_host + bi.off;
    if (bi.kind == 0) {
      std::memcpy(s.ring_mut(bi.a).bytes.data() + (size_t)(pos[(size_t)bi.r] % W) * swa_b, bytes, bi.len);
    } else if (bi.kind == 1 || bi.kind == 2) {
      kv_source_state& st = s.source_mut(bi.a);
      std::vector<uint8_t>& v = bi.kind == 1 ? st.main : st.index;
      v.insert(v.end(), bytes, bytes + bi.len);
    } else {
      kv_source_state& st = s.source_mut(bi.a);
      std::vector<float>& v = bi.kind == 3 ? st.pending_kv : st.pending_gate;
      std::memcpy(v.data() + (size_t)bi.pend * hd, bytes, bi.len);
    }
  }
  if (sel_dl > 0) {  // [n_idx_run, keep, K] ids, then [n_idx_run, keep] counts
    const int32_t* hid = reinterpret_cast<const int32_t*>(pinned_ + lg_bytes + stage_bytes);
    const int* hn = reinterpret_cast<const int*>(hid + (size_t)n_idx_run * keep * K);
    for (int j = 0; j < n_idx_run; ++j)
      for (int i = 0; i < keep; ++i) {
        const int r = B - keep + i;
        seq_of(r).note_selection(idx_layer[(size_t)j], pos[(size_t)r], hid + ((size_t)j * keep + i) * K,
                                 hn[(size_t)j * keep + i]);
      }
  }
  if (rep) {  // only the rings changed (written back above); the mirror holds the same bytes
    ds[0]->version = seqs[0]->version();
    return {};
  }
  if (chunk) {
    sequence& s = *seqs[0];
    for (int i = 0; i < S; ++i) {
      kv_source_state& st = s.source_mut(i);
      st.n_entries += emits[(size_t)i];
      ds[0]->sources[(size_t)i].n_entries += emits[(size_t)i];
      st.n_pending = pend_end[(size_t)i];
    }
    std::vector<int64_t> cid((size_t)B, 0);
    if (!e_.engram_token_map().empty())
      for (int r = 0; r < B; ++r) cid[(size_t)r] = e_.engram_token_map()[(size_t)tokens[(size_t)r]];
    s.append_tokens(tokens.data(), B, cid.data());
    ds[0]->version = s.version();
    return {};
  }
  for (int r = 0; r < B; ++r) {
    sequence& s = *seqs[(size_t)r];
    for (int i = 0; i < S; ++i) {
      kv_source_state& st = s.source_mut(i);
      dev_source& so = ds[(size_t)r]->sources[(size_t)i];
      if (dst_main[(size_t)i * B + r]) {
        ++st.n_entries;
        ++so.n_entries;
        st.n_pending = 0;
      } else {
        ++st.n_pending;
      }
    }
    const int32_t t = tokens[(size_t)r];
    const int64_t cid = e_.engram_token_map().empty() ? 0 : e_.engram_token_map()[(size_t)t];
    s.append_tokens(&t, 1, &cid);
    ds[(size_t)r]->version = s.version();
  }
  return {};
}

}  // namespace

result<std::unique_ptr<backend>> make_cuda_backend(const engine& e) {
  const std::string why = cuda_unavailable_reason();
  if (!why.empty()) return make_error(errc::unavailable, "cuda backend: " + why);
  auto b = std::make_unique<cuda_backend>(e);
  CEDAR_TRY(b->init());
  return std::unique_ptr<backend>(std::move(b));
}

#endif  // CEDAR_HAVE_CUDA

}  // namespace cedar::model
