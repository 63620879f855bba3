// qmatmul — see qmatmul.hpp. File order: decode tables, row dequantisation, the worker pool,
// the two qgemm schedules, encoders, the scalar oracle.
#include "kernels/cpu/qmatmul.hpp"

#include <algorithm>
#include <atomic>
#include <cassert>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <sched.h>

#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/quant.hpp"

namespace cedar::kernels {

const char* weight_format_name(weight_format f) {
  switch (f) {
    case weight_format::f32: return "f32";
    case weight_format::bf16: return "bf16";
    case weight_format::f8_e4m3: return "f8_e4m3";
    case weight_format::fp4_e2m1: return "fp4_e2m1";
  }
  return "?";
}

qmatrix qmatrix::slice_rows(int64_t r0, int64_t n) const {
  assert(r0 >= 0 && n >= 0 && r0 + n <= rows);
  qmatrix s = *this;
  s.row0 = row0 + r0;
  s.rows = n;
  return s;
}

size_t qmatrix::data_bytes() const {
  const size_t n = (size_t)rows * (size_t)cols;
  switch (format) {
    case weight_format::f32: return n * 4;
    case weight_format::bf16: return n * 2;
    case weight_format::f8_e4m3: return n;
    case weight_format::fp4_e2m1: return n / 2;
  }
  return 0;
}

bool stacked_view(const qmatrix& top, const qmatrix& bottom, qmatrix* out) {
  if (top.format != bottom.format || top.cols != bottom.cols || top.empty() || bottom.empty()) return false;
  if (top.format != weight_format::f32 && top.format != weight_format::bf16) return false;
  const size_t esize = top.format == weight_format::f32 ? 4 : 2;
  const auto* t = static_cast<const uint8_t*>(top.data) + (size_t)(top.row0 + top.rows) * (size_t)top.cols * esize;
  const auto* b = static_cast<const uint8_t*>(bottom.data) + (size_t)bottom.row0 * (size_t)bottom.cols * esize;
  if (t != b) return false;
  *out = top;
  out->rows = top.rows + bottom.rows;
  return true;
}

qmatrix qmatrix_f32(const float* w, int64_t rows, int64_t cols) {
  qmatrix q;
  q.format = weight_format::f32;
  q.rows = rows;
  q.cols = cols;
  q.data = w;
  return q;
}

qmatrix qmatrix_bf16(const uint16_t* w, int64_t rows, int64_t cols) {
  qmatrix q = qmatrix_f32(nullptr, rows, cols);
  q.format = weight_format::bf16;
  q.data = w;
  return q;
}

namespace {

// ============================================================================================
// Decode tables (built once from the scalar codecs, so they agree with them bit for bit)
// ============================================================================================
struct tables {
  float e4m3[256];
  float e8m0[256];
  float e2m1_pair[256][2];  // byte -> (low nibble, high nibble) values
  tables() {
    for (int b = 0; b < 256; ++b) {
      e4m3[b] = e4m3_decode((uint8_t)b);
      e8m0[b] = ue8m0_decode((uint8_t)b);
      e2m1_pair[b][0] = e2m1_decode((uint8_t)(b & 15));
      e2m1_pair[b][1] = e2m1_decode((uint8_t)(b >> 4));
    }
  }
};
const tables& tab() {
  static const tables t;
  return t;
}

inline float block_scale(const qmatrix& w, int64_t srow, int64_t blk) {
  const size_t i = (size_t)srow * (size_t)w.scale_cols + (size_t)blk;
  return w.scale_e8m0 ? tab().e8m0[w.scale_e8m0[i]] : w.scale_f32[i];
}

// ============================================================================================
// Row dequantisation: tensor row (w.row0 + r), all columns -> out [cols]
// ============================================================================================
void dequant_row(const qmatrix& w, int64_t r, float* out) {
  const int64_t k = w.cols, tr = w.row0 + r;
  switch (w.format) {
    case weight_format::f32:
      std::memcpy(out, w.f32_row(r), sizeof(float) * (size_t)k);
      return;
    case weight_format::bf16: {
      const uint16_t* p = static_cast<const uint16_t*>(w.data) + (size_t)tr * (size_t)k;
      for (int64_t i = 0; i < k; ++i) {
        const uint32_t bits = (uint32_t)p[i] << 16;
        std::memcpy(out + i, &bits, 4);
      }
      return;
    }
    case weight_format::f8_e4m3: {
      const uint8_t* p = static_cast<const uint8_t*>(w.data) + (size_t)tr * (size_t)k;
      const float* lut = tab().e4m3;
      const int64_t srow = tr / w.scale_block_rows;
      for (int64_t c0 = 0, blk = 0; c0 < k; c0 += 32, ++blk) {
        const float s = block_scale(w, srow, blk);
        const int64_t c1 = std::min<int64_t>(k, c0 + 32);
        // E4M3 bits eeeemmm placed as fp32 bits << 20 read as 2^(e−127)·1.mmm (or, e = 0, the
        // fp32 subnormal mmm·2^−129); times 2^120 that is the E4M3 value exactly, so one
        // multiply by (2^120·s) gives e4m3(code)·s bit for bit (the product is the same real
        // number, rounded once). Vectorises, unlike the table. 0x7F/0xFF stay NaN.
        const float s120 = s * 0x1p120f;
        if (!std::isfinite(s120)) {
          for (int64_t i = c0; i < c1; ++i) out[i] = lut[p[i]] * s;
          continue;
        }
        for (int64_t i = c0; i < c1; ++i) {
          const uint32_t b = p[i];
          const uint32_t bits = ((b & 0x80u) << 24) | ((b & 0x7Fu) << 20);
          float v;
          std::memcpy(&v, &bits, 4);
          out[i] = (b & 0x7Fu) == 0x7Fu ? std::numeric_limits<float>::quiet_NaN() : v * s120;
        }
      }
      return;
    }
    case weight_format::fp4_e2m1: {
      const uint8_t* p = static_cast<const uint8_t*>(w.data) + (size_t)tr * (size_t)(k / 2);
      const auto& pair = tab().e2m1_pair;
      const int64_t srow = tr / w.scale_block_rows;
      for (int64_t blk = 0; blk < k / 32; ++blk) {
        const float s = block_scale(w, srow, blk);
        const uint8_t* pb = p + blk * 16;
        float* ob = out + blk * 32;
        for (int i = 0; i < 16; ++i) {
          ob[2 * i] = pair[pb[i]][0] * s;
          ob[2 * i + 1] = pair[pb[i]][1] * s;
        }
      }
      return;
    }
  }
}

// ============================================================================================
// Worker pool: (cpu_threads() − 1) persistent helpers; run() splits work into parts.
// A decode step makes ~100 short calls, so helpers spin for a while (≈100 µs, yielding, like
// OpenBLAS's own threads) before sleeping on the condition variable. Part p ≥ 1 belongs to
// helper p, but whoever claims it first runs it: the caller, done with part 0, takes every
// part no helper has started, so a helper that is not scheduled (a loaded machine) never
// stalls a call. A claim is the run's generation CAS'd into claim_[p]; a helper that read a
// run's parameters claims only that run, so it never mixes two runs' parameters.
// ============================================================================================
// CEDAR_THREADS when set (1..16), else the CPUs this process may run on (its affinity mask).
int configured_threads() {
  int n = 0;
  if (const char* e = std::getenv("CEDAR_THREADS"); e && *e) n = std::atoi(e);
  if (n <= 0) {
    cpu_set_t set;
    n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
    if (n <= 0) n = (int)std::thread::hardware_concurrency();
  }
  return std::clamp(n, 1, 16);
}

class worker_pool {
 public:
  static worker_pool& get() {
    static worker_pool p;
    return p;
  }
  int parts() const { return (int)helpers_.size() + 1; }
  // fn(ctx, part, n_parts) for every part in [0, n_parts); the caller runs part 0 (and any
  // part not yet started). When another thread holds the pool, everything runs here.
  // More parts than threads is allowed (up to 16): the caller runs the ones no helper owns.
  void run(void (*fn)(void*, int, int), void* ctx, int n_parts) {
    n_parts = std::min(n_parts, 16);
    std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
    if (n_parts <= 1 || !busy.owns_lock()) {
      fn(ctx, 0, 1);
      return;
    }
    fn_.store(fn, std::memory_order_relaxed);
    ctx_.store(ctx, std::memory_order_relaxed);
    n_parts_.store(n_parts, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    uint64_t g;
    {
      std::lock_guard<std::mutex> lk(m_);
      g = generation_.fetch_add(1, std::memory_order_acq_rel) + 1;
    }
    cv_.notify_all();
    fn(ctx, 0, n_parts);
    for (int p = 1; p < n_parts; ++p)
      if (claim(p, g)) {
        fn(ctx, p, n_parts);
        done_.fetch_add(1, std::memory_order_acq_rel);
      }
    for (int spins = 0; done_.load(std::memory_order_acquire) != n_parts - 1; ++spins) {
      if (spins < 2048) continue;
      std::unique_lock<std::mutex> lk(m_);
      done_cv_.wait(lk, [&] { return done_.load(std::memory_order_acquire) == n_parts - 1; });
    }
  }
  ~worker_pool() {
    {
      std::lock_guard<std::mutex> lk(m_);
      quit_.store(true);
    }
    cv_.notify_all();
    for (auto& t : helpers_) t.join();
  }

 private:
  worker_pool() : claim_(new std::atomic<uint64_t>[16]) {
    for (int i = 0; i < 16; ++i) claim_[i].store(0);
    // OpenBLAS runs on the calling thread from here on: its own spinning workers would compete
    // with these for the same cores (measured on 2 cores: replay 24.2 -> 21.1 ms); the pool
    // splits every large GEMM instead (gemm_part).
    set_gemm_threads(1);
    const int n = configured_threads() - 1;
    for (int i = 0; i < n; ++i) helpers_.emplace_back([this, i] { loop(i + 1); });
  }
  // Claims part p of run g; false if someone already has.
  bool claim(int p, uint64_t g) {
    uint64_t c = claim_[p].load(std::memory_order_acquire);
    while (c < g)
      if (claim_[p].compare_exchange_weak(c, g, std::memory_order_acq_rel)) return true;
    return false;
  }
  void loop(int part) {
    uint64_t seen = 0;
    for (;;) {
      bool got = false;
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; !got; ++i) {
        if (quit_.load(std::memory_order_relaxed)) return;
        got = generation_.load(std::memory_order_acquire) != seen;
        if (got || (i & 63) != 63) continue;
        std::this_thread::yield();  // give the core away when others want it
        if (std::chrono::steady_clock::now() - t0 > std::chrono::microseconds(100)) break;
      }
      if (!got) {
        std::unique_lock<std::mutex> lk(m_);
        cv_.wait(lk, [&] { return quit_.load() || generation_.load() != seen; });
        if (quit_.load()) return;
      }
      const uint64_t g = generation_.load(std::memory_order_acquire);
      seen = g;
      auto* fn = fn_.load(std::memory_order_relaxed);
      void* ctx = ctx_.load(std::memory_order_relaxed);
      const int np = n_parts_.load(std::memory_order_relaxed);
      if (part >= np || !claim(part, g)) continue;
      fn(ctx, part, np);
      if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == np - 1) {
        std::lock_guard<std::mutex> lk(m_);
        done_cv_.notify_one();
      }
    }
  }
  std::vector<std::thread> helpers_;
  std::mutex busy_, m_;
  std::condition_variable cv_, done_cv_;
  // Written by run() before the generation bump (release), read by helpers after (acquire).
  std::atomic<void (*)(void*, int, int)> fn_{nullptr};
  std::atomic<void*> ctx_{nullptr};
  std::atomic<int> n_parts_{0};
  std::atomic<int> done_{0};  // helper parts finished in the current run
  std::atomic<uint64_t> generation_{0};
  std::unique_ptr<std::atomic<uint64_t>[]> claim_;  // [16] generation that claimed part p
  std::atomic<bool> quit_{false};
};

// Contiguous share [lo, hi) of n items for `part` of `n_parts`, in multiples of `align`.
void share(int64_t n, int part, int n_parts, int64_t align, int64_t& lo, int64_t& hi) {
  const int64_t units = (n + align - 1) / align;
  lo = std::min(n, units * part / n_parts * align);
  hi = std::min(n, units * (part + 1) / n_parts * align);
}

std::vector<float>& row_scratch() {
  thread_local std::vector<float> buf;
  return buf;
}

// ============================================================================================
// Small-m schedule: each weight row dequantised once, dotted with every activation row.
// ============================================================================================
struct small_job {
  int m;
  const float* a;
  int lda;
  const qmatrix* w;
  float* c;
  int ldc;
  float alpha, beta;
};

inline float weight_at(const float* w, int64_t i) { return w[i]; }
inline float weight_at(const uint16_t* w, int64_t i) {
  const uint32_t bits = (uint32_t)w[i] << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// out[r] = Σ_i a[r·lda + i] · w[i] for R rows; 16 independent lanes per row (vectorised).
// W is fp32 (a dequantised row) or bf16 read in place (no intermediate row).
template <int R, class W>
void dot_rows(const W* w, const float* a, int lda, int64_t k, float* out) {
  float acc[R][16];
  for (int r = 0; r < R; ++r)
    for (int l = 0; l < 16; ++l) acc[r][l] = 0.0f;
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) {
    float wv[16];
    for (int l = 0; l < 16; ++l) wv[l] = weight_at(w, i + l);
    for (int r = 0; r < R; ++r) {
      const float* ar = a + (size_t)r * lda + i;
      for (int l = 0; l < 16; ++l) acc[r][l] += ar[l] * wv[l];
    }
  }
  for (int r = 0; r < R; ++r) {
    float s = 0.0f;
    for (int64_t t = i; t < k; ++t) s += a[(size_t)r * lda + t] * weight_at(w, t);
    float h[8];
    for (int l = 0; l < 8; ++l) h[l] = acc[r][l] + acc[r][l + 8];
    for (int l = 0; l < 4; ++l) h[l] += h[l + 4];
    out[r] = (h[0] + h[2]) + (h[1] + h[3]) + s;
  }
}

// Dots of one weight row (fp32 or bf16 in place) with every activation row, into C column r.
template <class W>
void run_dots(const W* wr, const small_job& j, int64_t r, float* d) {
  const qmatrix& w = *j.w;
  for (int i0 = 0; i0 < j.m; i0 += 4) {
    const int g = std::min(4, j.m - i0);
    const float* ai = j.a + (size_t)i0 * j.lda;
    switch (g) {
      case 4: dot_rows<4>(wr, ai, j.lda, w.cols, d); break;
      case 3: dot_rows<3>(wr, ai, j.lda, w.cols, d); break;
      case 2: dot_rows<2>(wr, ai, j.lda, w.cols, d); break;
      default: dot_rows<1>(wr, ai, j.lda, w.cols, d); break;
    }
    for (int t = 0; t < g; ++t) {
      float& out = j.c[(size_t)(i0 + t) * j.ldc + r];
      out = j.beta == 0.0f ? j.alpha * d[t] : j.alpha * d[t] + j.beta * out;
    }
  }
}

void small_part(void* vjob, int part, int n_parts) {
  const small_job& j = *static_cast<const small_job*>(vjob);
  const qmatrix& w = *j.w;
  int64_t lo, hi;
  share(w.rows, part, n_parts, 16, lo, hi);
  std::vector<float>& buf = row_scratch();
  if (buf.size() < (size_t)w.cols) buf.resize((size_t)w.cols);
  const bool bf16 = w.format == weight_format::bf16;
  float d[4];
  for (int64_t r = lo; r < hi; ++r) {
    if (bf16) {
      run_dots(static_cast<const uint16_t*>(w.data) + (size_t)(w.row0 + r) * (size_t)w.cols, j, r, d);
    } else {
      dequant_row(w, r, buf.data());
      run_dots(buf.data(), j, r, d);
    }
  }
}


// ============================================================================================
// Large-m schedule (and every f32 weight): the weight rows (output columns) are cut into tiles
// whose size depends only on the matrix (never on the thread count), each part takes a
// contiguous run of tiles and runs a single-threaded OpenBLAS sgemm per tile (a quantised tile
// dequantised first into the part's own scratch). Every output element is computed by the same
// call, of the same shape, whatever the number of threads: results are bit-identical on any
// machine (a session resumed elsewhere replays the same logits).
// ============================================================================================
struct gemm_job {
  int m;
  const float* a;
  int lda;
  const qmatrix* w;
  float* c;
  int ldc;
  float alpha, beta;
};

std::vector<float>& tile_scratch();

// Rows per tile: 256 for f32 (no scratch; bigger calls amortise OpenBLAS's packing of the
// activations), else ≤ 512 KB of fp32 (L2-sized), at least 32 rows; multiples of 16.
int64_t tile_rows(const qmatrix& w) {
  if (w.format == weight_format::f32) return 256;
  return std::max<int64_t>(32, (131072 / std::max<int64_t>(1, w.cols)) / 16 * 16);
}

void gemm_part(void* vjob, int part, int n_parts) {
  const gemm_job& j = *static_cast<const gemm_job*>(vjob);
  const qmatrix& w = *j.w;
  const int64_t k = w.cols, nb = tile_rows(w), tiles = (w.rows + nb - 1) / nb;
  int64_t t0, t1;
  share(tiles, part, n_parts, 1, t0, t1);
  std::vector<float>* buf = nullptr;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t r0 = t * nb, n = std::min(nb, w.rows - r0);
    const float* b;
    if (w.format == weight_format::f32) {
      b = w.f32_row(r0);
    } else {
      if (!buf) {
        buf = &tile_scratch();
        if (buf->size() < (size_t)(nb * k)) buf->resize((size_t)(nb * k));
      }
      dequant_rows(w, r0, n, buf->data());
      b = buf->data();
    }
    gemm_nt_ld(j.m, (int)n, (int)k, j.a, j.lda, b, (int)k, j.c + r0, j.ldc, j.alpha, j.beta);
  }
}

std::vector<float>& tile_scratch() {
  thread_local std::vector<float> buf;
  return buf;
}

}  // namespace

void dequant_rows(const qmatrix& w, int64_t r0, int64_t n, float* out) {
  for (int64_t r = 0; r < n; ++r) dequant_row(w, r0 + r, out + (size_t)r * (size_t)w.cols);
}

void qgemm_nt(int m, const float* a, int lda, const qmatrix& w, float* c, int ldc, float alpha, float beta) {
  detail::qgemm_nt_split(worker_pool::get().parts(), m, a, lda, w, c, ldc, alpha, beta);
}

void detail::qgemm_nt_split(int max_parts, int m, const float* a, int lda, const qmatrix& w, float* c, int ldc,
                            float alpha, float beta) {
  if (m <= 0 || w.rows <= 0) return;
  worker_pool& pool = worker_pool::get();
  // Below ~32K multiply-adds a second thread costs more than it saves.
  const int parts = (int64_t)w.rows * w.cols * std::min(m, 8) >= (1 << 15) ? std::clamp(max_parts, 1, 16) : 1;
  if (m <= k_qgemm_small_m && w.format != weight_format::f32) {
    small_job j{m, a, lda, &w, c, ldc, alpha, beta};
    pool.run(small_part, &j, parts);
    return;
  }
  gemm_job j{m, a, lda, &w, c, ldc, alpha, beta};
  pool.run(gemm_part, &j, std::min<int64_t>(parts, (w.rows + tile_rows(w) - 1) / tile_rows(w)));
}

int cpu_threads() { return worker_pool::get().parts(); }

// ============================================================================================
// Encoders
// ============================================================================================
void quantise_f8_blocks(const float* w, int64_t rows, int64_t cols, int block_rows, uint8_t* codes,
                        uint8_t* scales) {
  const int64_t scols = (cols + 31) / 32;
  for (int64_t br = 0; br < rows; br += block_rows)
    for (int64_t b = 0; b < scols; ++b) {
      const int64_t r1 = std::min(rows, br + block_rows), c0 = b * 32, c1 = std::min(cols, c0 + 32);
      float amax = 0.0f;
      for (int64_t r = br; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(w[r * cols + c]));
      const float s = std::exp2(std::ceil(std::log2(std::max(amax, 0x1p-126f * 448.0f) / 448.0f)));
      scales[(br / block_rows) * scols + b] = ue8m0_encode_pow2(s);
      for (int64_t r = br; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) codes[r * cols + c] = e4m3_encode(w[r * cols + c] / s);
    }
}

void quantise_fp4_rows(const float* w, int64_t rows, int64_t cols, uint8_t* packed, uint8_t* scales) {
  assert(cols % 32 == 0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < cols / 32; ++b) {
      const float* x = w + r * cols + b * 32;
      float amax = 0.0f;
      for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
      const float s = std::exp2(std::ceil(std::log2(std::max(amax, 6.0f * 0x1p-126f) / 6.0f)));
      scales[r * (cols / 32) + b] = ue8m0_encode_pow2(s);
      uint8_t* p = packed + r * (cols / 2) + b * 16;
      for (int i = 0; i < 16; ++i)
        p[i] = (uint8_t)(e2m1_encode(x[2 * i] / s) | (e2m1_encode(x[2 * i + 1] / s) << 4));
    }
}

// ============================================================================================
// Scalar oracle
// ============================================================================================
namespace ref {

float qmatrix_at(const qmatrix& w, int64_t r, int64_t c) {
  const int64_t tr = w.row0 + r;
  auto scale = [&] {
    const size_t i = (size_t)(tr / w.scale_block_rows) * (size_t)w.scale_cols + (size_t)(c / 32);
    return w.scale_e8m0 ? ue8m0_decode(w.scale_e8m0[i]) : w.scale_f32[i];
  };
  switch (w.format) {
    case weight_format::f32: return static_cast<const float*>(w.data)[tr * w.cols + c];
    case weight_format::bf16: return bf16_to_f32(static_cast<const uint16_t*>(w.data)[tr * w.cols + c]);
    case weight_format::f8_e4m3: return e4m3_decode(static_cast<const uint8_t*>(w.data)[tr * w.cols + c]) * scale();
    case weight_format::fp4_e2m1: {
      const uint8_t b = static_cast<const uint8_t*>(w.data)[tr * (w.cols / 2) + c / 2];
      return e2m1_decode(c % 2 ? (uint8_t)(b >> 4) : (uint8_t)(b & 15)) * scale();
    }
  }
  return 0.0f;
}

void qgemm_nt(int m, const float* a, int lda, const qmatrix& w, float* c, int ldc, float alpha, float beta) {
  for (int i = 0; i < m; ++i)
    for (int64_t j = 0; j < w.rows; ++j) {
      double s = 0;
      for (int64_t t = 0; t < w.cols; ++t) s += (double)a[(size_t)i * lda + t] * qmatrix_at(w, j, t);
      float& out = c[(size_t)i * ldc + j];
      out = beta == 0.0f ? (float)(alpha * s) : (float)(alpha * s + beta * out);
    }
}

}  // namespace ref
}  // namespace cedar::kernels
