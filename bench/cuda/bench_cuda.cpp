// bench_cuda — the CUDA ops against the H200's memory roofline (issue 9, BENCHMARKS B5):
//   1. roofline: device-to-device copy bandwidth (bytes read + written per second), measured
//      here, in this run — every other figure is a fraction of it;
//   2. qgemv: decode projections (kernels/cuda/qgemv.cuh) over bf16 / fp8 (32×32 UE8M0) /
//      fp4 (1×32) weights at m = 1, 8, 64 activation rows, several shapes; bytes read ÷ time;
//      bf16 at m = 64 runs on tensor cores (qgemv_mma.cuh) and is timed a second time on the
//      vector path (set_qgemv_mma(false), the baseline), the ratio printed;
//   3. decode-step projection stream of a ~1.6B-parameter V4.1-shaped config at batch 1: every
//      weight matrix one token reads (attention projections, indexer, shared expert, 2 of 16
//      routed experts, LM head) of every layer, from one CUDA graph: one launch per matrix,
//      then grouped by input (qgemv_grouped); the per-token time against bytes ÷ roofline
//      (norms, attention, routing not included);
//   4. sparse attention + indexer scoring + top-k of one decode row at contexts 8K / 32K / 128K
//      (V4.1 flash shapes: 64 heads × 512, window 128, top-512 of the ratio-4 entries,
//      32 index heads × 128) at batch 1 / 8 / 64: bytes read ÷ time.
// Weights are rotated over copies that together exceed the L2 (60 MB), so no figure is an
// L2 hit rate. Timing: CUDA events around N launches after warm-up, median of 5.
// Output: a table on stdout and CSV (--csv FILE). Needs only the NVIDIA driver (cudart static).
//
//   bench_cuda [--csv FILE] [--quick]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/indexer.cuh"
#include "kernels/cuda/qgemv.cuh"
#include "kernels/cpu/quant.hpp"
#include "kernels/cuda/sparse_attention.cuh"

namespace kc = cedar::kernels;
namespace cu = cedar::kernels::cuda;

namespace {

#define CK(call)                                                                              \
  do {                                                                                        \
    cudaError_t e_ = (call);                                                                  \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "bench_cuda: %s failed: %s\n", #call, cudaGetErrorString(e_));     \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

void need(const cedar::status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "bench_cuda: %s: %s\n", what, s.err().message.c_str());
    std::exit(1);
  }
}

void* dmalloc(size_t bytes) {
  void* p = nullptr;
  CK(cudaMalloc(&p, std::max<size_t>(bytes, 16)));
  return p;
}

// Fills device memory with pseudo-random bytes (a fixed generator, then a device copy).
void fill_random(void* p, size_t bytes, uint32_t seed, uint8_t mask = 0xFF) {
  std::vector<uint8_t> h(std::min<size_t>(bytes, 64u << 20));
  std::mt19937 g(seed);
  for (auto& b : h) b = (uint8_t)(g() & mask);
  for (size_t o = 0; o < bytes; o += h.size())
    CK(cudaMemcpy(static_cast<uint8_t*>(p) + o, h.data(), std::min(h.size(), bytes - o), cudaMemcpyHostToDevice));
}

void fill_floats(float* p, size_t n, uint32_t seed, float sd) {
  std::vector<float> h(n);
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.0f, sd);
  for (auto& v : h) v = nd(g);
  CK(cudaMemcpy(p, h.data(), n * 4, cudaMemcpyHostToDevice));
}

// Median over 5 samples of (time of `reps` calls of fn) / reps, in seconds.
double time_it(const std::function<void()>& fn, int reps) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) fn();
  std::vector<double> t;
  for (int s = 0; s < 5; ++s) {
    CK(cudaEventRecord(a));
    for (int i = 0; i < reps; ++i) fn();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1e-3 / reps);
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[2];
}

struct csv_out {
  FILE* f = nullptr;
  void row(const std::string& kind, const std::string& what, int m, double s, double bytes, double roof) {
    if (f) std::fprintf(f, "%s,%s,%d,%.9f,%.0f,%.2f,%.4f\n", kind.c_str(), what.c_str(), m, s, bytes,
                        bytes / s / 1e9, bytes / s / roof);
  }
};

// A weight tensor on the device in one of the formats (values random; codes masked so fp8
// never holds NaN codes), `copies` copies to rotate over.
struct dev_weight {
  kc::weight_format fmt;
  int64_t rows, cols;
  std::vector<void*> data;
  std::vector<uint8_t*> scales;
  size_t bytes_per_copy = 0;

  dev_weight(kc::weight_format f, int64_t r, int64_t c, int copies, uint32_t seed) : fmt(f), rows(r), cols(c) {
    const size_t n = (size_t)(r * c);
    const size_t db = f == kc::weight_format::f32 ? n * 4 : f == kc::weight_format::bf16 ? n * 2
                      : f == kc::weight_format::f8_e4m3 ? n : n / 2;
    const int br = f == kc::weight_format::f8_e4m3 ? 32 : 1;
    const size_t sb = (f == kc::weight_format::f8_e4m3 || f == kc::weight_format::fp4_e2m1)
                          ? (size_t)((r + br - 1) / br) * (size_t)((c + 31) / 32) : 0;
    bytes_per_copy = db + sb;
    for (int i = 0; i < copies; ++i) {
      data.push_back(dmalloc(db));
      // bf16 / f32: random bytes with the exponent's top bits cleared keep values finite and small
      fill_random(data.back(), db, seed + (uint32_t)i, f == kc::weight_format::f8_e4m3 ? 0x77 : 0xFF);
      if (f == kc::weight_format::bf16 || f == kc::weight_format::f32) {
        std::vector<float> vals((size_t)std::min<int64_t>((int64_t)n, 1 << 22));
        std::mt19937 g(seed + 17u * (uint32_t)i);
        std::normal_distribution<float> nd(0.0f, 0.02f);
        for (auto& v : vals) v = nd(g);
        if (f == kc::weight_format::bf16) {
          std::vector<uint16_t> h(vals.size());
          for (size_t k = 0; k < h.size(); ++k) {
            uint32_t u;
            std::memcpy(&u, &vals[k], 4);
            h[k] = (uint16_t)(u >> 16);
          }
          for (size_t o = 0; o < n; o += h.size())
            CK(cudaMemcpy(static_cast<uint16_t*>(data.back()) + o, h.data(), std::min(h.size(), n - o) * 2,
                          cudaMemcpyHostToDevice));
        } else {
          for (size_t o = 0; o < n; o += vals.size())
            CK(cudaMemcpy(static_cast<float*>(data.back()) + o, vals.data(), std::min(vals.size(), n - o) * 4,
                          cudaMemcpyHostToDevice));
        }
      }
      scales.push_back(sb ? static_cast<uint8_t*>(dmalloc(sb)) : nullptr);
      if (sb) {
        std::vector<uint8_t> h(sb, 120);  // 2^-7
        CK(cudaMemcpy(scales.back(), h.data(), sb, cudaMemcpyHostToDevice));
      }
    }
  }
  ~dev_weight() {
    for (void* p : data) cudaFree(p);
    for (uint8_t* p : scales) cudaFree(p);
  }
  dev_weight(const dev_weight&) = delete;
  dev_weight& operator=(const dev_weight&) = delete;

  kc::qmatrix view(int i) const {
    kc::qmatrix w;
    w.format = fmt;
    w.rows = rows;
    w.cols = cols;
    w.data = data[(size_t)i % data.size()];
    w.scale_e8m0 = scales[(size_t)i % scales.size()];
    w.scale_block_rows = fmt == kc::weight_format::f8_e4m3 ? 32 : 1;
    w.scale_cols = (cols + 31) / 32;
    return w;
  }
};

const char* fmt_name(kc::weight_format f) {
  return f == kc::weight_format::f32 ? "f32" : f == kc::weight_format::bf16 ? "bf16"
         : f == kc::weight_format::f8_e4m3 ? "fp8" : "fp4";
}

}  // namespace

int main(int argc, char** argv) {
  std::string csv_path;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf(
          "usage: bench_cuda [--csv FILE] [--quick]\n"
          "CUDA ops against the device's copy bandwidth (the roofline): qgemv decode projections\n"
          "(bf16/fp8/fp4, m = 1/8/64), the decode-step projection stream of a ~1.6B config at\n"
          "batch 1 (one CUDA graph), sparse attention + indexer + top-k at 8K/32K/128K context.\n"
          "Needs an NVIDIA GPU. --quick: fewer shapes.\n");
      return 0;
    }
    if (a == "--csv" && i + 1 < argc) csv_path = argv[++i];
    else if (a == "--quick") quick = true;
    else {
      std::fprintf(stderr, "bench_cuda: unknown argument '%s' (see --help)\n", a.c_str());
      return 2;
    }
  }
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    std::fprintf(stderr, "bench_cuda: no CUDA GPU here (run it on the GPU machine)\n");
    return 1;
  }
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
  csv_out csv;
  if (!csv_path.empty()) {
    csv.f = std::fopen(csv_path.c_str(), "w");
    if (!csv.f) {
      std::fprintf(stderr, "bench_cuda: cannot write %s\n", csv_path.c_str());
      return 1;
    }
    std::fprintf(csv.f, "kind,what,m,seconds,bytes,GBps,fraction_of_copy_bw\n");
  }

  // ---- 1. roofline ---------------------------------------------------------------------------
  const size_t cbytes = (size_t)2 << 30;
  void* ca = dmalloc(cbytes);
  void* cb = dmalloc(cbytes);
  CK(cudaMemset(ca, 1, cbytes));
  const double tcopy = time_it([&] { CK(cudaMemcpyAsync(cb, ca, cbytes, cudaMemcpyDeviceToDevice)); }, 5);
  const double roof = 2.0 * (double)cbytes / tcopy;  // bytes read + written per second
  cudaFree(ca);
  cudaFree(cb);
  std::printf("roofline: device copy %.0f GB/s (read + write of %zu MiB, %.3f ms)\n", roof / 1e9, cbytes >> 20,
              tcopy * 1e3);
  csv.row("roofline", "d2d_copy", 0, tcopy, 2.0 * (double)cbytes, roof);

  // ---- 2. qgemv sweep ---------------------------------------------------------------------------
  std::printf("\n%-6s %-13s %4s %10s %10s %8s\n", "format", "shape", "m", "us", "GB/s", "of roof");
  struct shape {
    int64_t rows, cols;
  };
  std::vector<shape> shapes = {{2048, 2048}, {4096, 2048}, {16384, 4096}, {2048, 8192}};
  if (quick) shapes = {{4096, 2048}, {16384, 4096}};
  const float* xbuf;
  float* ybuf;
  {
    const size_t xn = (size_t)64 * 8192;
    float* x = static_cast<float*>(dmalloc(xn * 4));
    fill_floats(x, xn, 5, 1.0f);
    xbuf = x;
    ybuf = static_cast<float*>(dmalloc((size_t)64 * 16384 * 4));
  }
  for (auto f : {kc::weight_format::bf16, kc::weight_format::f8_e4m3, kc::weight_format::fp4_e2m1}) {
    for (const auto& s : shapes) {
      const size_t per = dev_weight(f, 32, s.cols, 1, 1).bytes_per_copy / 32 * (size_t)s.rows;
      const int copies = (int)std::max<size_t>(2, (size_t)(256u << 20) / per + 1);
      dev_weight w(f, s.rows, s.cols, copies, 100);
      for (int m : {1, 8, 64}) {
        int k = 0;
        cu::qgemv_params p;
        p.m = m;
        p.x = xbuf;
        p.ldx = (int)s.cols;
        p.y = ybuf;
        p.ldy = (int)s.rows;
        const double t = time_it(
            [&] {
              p.w = w.view(k++);
              need(cu::qgemv(p, nullptr), "qgemv");
            },
            50);
        const double bytes = (double)w.bytes_per_copy + (double)m * s.cols * 4 + (double)m * s.rows * 4;
        const std::string what = std::to_string(s.rows) + "x" + std::to_string(s.cols);
        const bool mma = cu::qgemv_mma_enabled() && f == kc::weight_format::bf16 && m > cu::k_qgemv_m_tile;
        std::printf("%-6s %-13s %4d %10.2f %10.0f %7.1f%%%s\n", fmt_name(f), what.c_str(), m, t * 1e6,
                    bytes / t / 1e9, 100.0 * bytes / t / roof, mma ? "  tensor cores" : "");
        csv.row(std::string("qgemv_") + fmt_name(f), what, m, t, bytes, roof);
        if (mma) {  // the baseline: the same launches on the vector path
          cu::set_qgemv_mma(false);
          const double tv = time_it(
              [&] {
                p.w = w.view(k++);
                need(cu::qgemv(p, nullptr), "qgemv (vector path)");
              },
              50);
          cu::set_qgemv_mma(true);
          std::printf("%-6s %-13s %4d %10.2f %10.0f %7.1f%%  vector path; tensor cores %.2fx faster\n", fmt_name(f),
                      what.c_str(), m, tv * 1e6, bytes / tv / 1e9, 100.0 * bytes / tv / roof, tv / t);
          csv.row(std::string("qgemv_") + fmt_name(f) + "_vector", what, m, tv, bytes, roof);
        }
      }
    }
  }

  // ---- 3. decode-step projection stream of a ~1.6B config, batch 1 ---------------------------
  // hidden 2048, 16 layers; attention: q_lora 512, 16 heads × 256, one K=V latent of 256,
  // o_groups 4 × o_lora 512; indexer 8 heads × 128 (q from the q latent, k and weights from h);
  // compressor kv + gate 2 × 256; shared expert and 16 routed experts (top 2) of 768; vocab 32768.
  {
    struct mat {
      const char* name;
      int64_t rows, cols;
      bool expert;
    };
    const int64_t d = 2048;
    const std::vector<mat> layer = {
        {"wq_a", 512, d, false},       {"wq_b", 16 * 256, 512, false}, {"wkv", 256, d, false},
        {"compressor", 512, d, false}, {"idx_q", 8 * 128, 512, false}, {"idx_k", 128, d, false},
        {"wo_a", 4 * 512, 1024, false}, {"wo_b", d, 4 * 512, false},  {"shared_gate_up", 2 * 768, d, false},
        {"shared_down", d, 768, false}, {"expert_gate_up", 2 * 768, d, true}, {"expert_down", d, 768, true}};
    const int n_layers = 16, n_experts = 16, top_k = 2;
    const int64_t vocab = 32768;
    for (auto f : {kc::weight_format::bf16, kc::weight_format::f8_e4m3}) {
      // every layer's own weights (experts: all 16 stored, 2 read per token), the LM head bf16
      std::vector<std::unique_ptr<dev_weight>> ws;
      std::vector<kc::qmatrix> seq;
      double bytes = 0, params = 0;
      std::mt19937 g(9);
      for (int l = 0; l < n_layers; ++l)
        for (const auto& mm : layer) {
          // experts: fp4 in the fp8 checkpoint (the official format), bf16 in the bf16 one
          const auto ef = mm.expert && f == kc::weight_format::f8_e4m3 ? kc::weight_format::fp4_e2m1 : f;
          ws.push_back(std::make_unique<dev_weight>(ef, mm.rows * (mm.expert ? n_experts : 1), mm.cols, 1,
                                                    (uint32_t)(l * 100 + seq.size())));
          params += (double)mm.rows * mm.cols * (mm.expert ? n_experts : 1);
          for (int e = 0; e < (mm.expert ? top_k : 1); ++e) {
            kc::qmatrix v = ws.back()->view(0);
            v.rows = mm.rows;
            v.row0 = mm.expert ? (int64_t)(g() % n_experts) * mm.rows : 0;
            seq.push_back(v);
            bytes += (double)ws.back()->bytes_per_copy / (mm.expert ? n_experts : 1);
          }
        }
      ws.push_back(std::make_unique<dev_weight>(kc::weight_format::bf16, vocab, d, 1, 4242));
      seq.push_back(ws.back()->view(0));
      bytes += (double)ws.back()->bytes_per_copy;
      params += (double)vocab * d * 2;  // embedding + head
      cudaStream_t st;
      CK(cudaStreamCreate(&st));
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
      for (const auto& v : seq) {
        cu::qgemv_params p;
        p.w = v;
        p.m = 1;
        p.x = xbuf;
        p.ldx = (int)v.cols;
        p.y = ybuf;
        p.ldy = (int)v.rows;
        need(cu::qgemv(p, st), "qgemv (graph capture)");
      }
      CK(cudaStreamEndCapture(st, &graph));
      CK(cudaGraphInstantiate(&exec, graph, 0));
      const double t = time_it([&] { CK(cudaGraphLaunch(exec, st)); }, 20);
      const double ideal = bytes / roof;
      std::printf(
          "\ndecode projections, ~%.2fB-param config (%s weights%s), batch 1: %zu GEMVs, %.0f MB per token,\n"
          "  %.1f us per token (%.0f tok/s) vs roofline %.1f us: %.1f%% of roofline\n",
          params / 1e9, fmt_name(f), f == kc::weight_format::f8_e4m3 ? ", fp4 experts" : "", seq.size(), bytes / 1e6,
          t * 1e6, 1.0 / t, ideal * 1e6, 100.0 * ideal / t);
      csv.row(std::string("decode_projections_1b_") + fmt_name(f), "batch1", 1, t, bytes, roof);

      // the same matrices, grouped by what they read (qgemv_grouped: one launch per weight
      // class per group): per layer {q_a, kv, compressor, index k} from h; {q_b, index q} from
      // the q latent; wo_a; wo_b; {shared gate_up, 2 expert gate_ups} from h2; their downs
      {
        const int per_layer = (int)(seq.size() - 1) / n_layers;  // 14 (2 experts × 2 matrices)
        const std::vector<std::vector<int>> stage_of = {{0, 2, 3, 5}, {1, 4}, {6}, {7}, {8, 10, 11}, {9, 12, 13}};
        std::vector<std::vector<cu::qgemv_params>> stages;
        for (int l = 0; l < n_layers; ++l)
          for (const auto& st_ids : stage_of) {
            std::vector<cu::qgemv_params> items;
            int64_t yoff = 0;
            for (int id : st_ids) {
              cu::qgemv_params p;
              p.w = seq[(size_t)(l * per_layer + id)];
              p.m = 1;
              p.x = xbuf;
              p.ldx = (int)p.w.cols;
              p.y = ybuf + yoff;
              p.ldy = (int)p.w.rows;
              yoff += (p.w.rows + 3) / 4 * 4;
              items.push_back(p);
            }
            stages.push_back(items);
          }
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        for (const auto& items : stages) need(cu::qgemv_grouped(items.data(), (int)items.size(), st), "qgemv_grouped");
        {
          cu::qgemv_params p;
          p.w = seq.back();
          p.m = 1, p.x = xbuf, p.ldx = (int)p.w.cols, p.y = ybuf, p.ldy = (int)p.w.rows;
          need(cu::qgemv(p, st), "qgemv (head)");
        }
        cudaGraph_t g2;
        cudaGraphExec_t e2;
        CK(cudaStreamEndCapture(st, &g2));
        CK(cudaGraphInstantiate(&e2, g2, 0));
        const double tg = time_it([&] { CK(cudaGraphLaunch(e2, st)); }, 20);
        std::printf("  grouped (%zu groups + head): %.1f us per token (%.0f tok/s): %.1f%% of roofline\n", stages.size(),
                    tg * 1e6, 1.0 / tg, 100.0 * ideal / tg);
        csv.row(std::string("decode_projections_1b_grouped_") + fmt_name(f), "batch1", 1, tg, bytes, roof);
        CK(cudaGraphExecDestroy(e2));
        CK(cudaGraphDestroy(g2));
      }
      CK(cudaGraphExecDestroy(exec));
      CK(cudaGraphDestroy(graph));
      CK(cudaStreamDestroy(st));
    }
  }

  // ---- 4. sparse attention + indexer at long context -------------------------------------------
  {
    const int H = 64, D = 512, W = 128, K = 512, Hi = 32, Di = 128, ratio = 4;
    std::printf("\n%-8s %5s %12s %12s %12s %10s %8s\n", "context", "batch", "index us", "topk us", "attn us",
                "GB/s", "of roof");
    std::vector<int> contexts = {8192, 32768, 131072};
    std::vector<int> batches = {1, 8, 64};
    if (quick) batches = {1, 8};
    for (int ctx : contexts)
      for (int B : batches) {
        const int E = ctx / ratio;
        const size_t ib = kc::fp4_index_bytes(Di), mb = kc::fp4_kv_bytes(D), wb = kc::fp8_swa_bytes(D);
        // per sequence: its own index keys, main entries and window ring
        uint8_t* keys = static_cast<uint8_t*>(dmalloc((size_t)B * E * ib));
        uint8_t* mains = static_cast<uint8_t*>(dmalloc((size_t)B * E * mb));
        uint8_t* rings = static_cast<uint8_t*>(dmalloc((size_t)B * W * wb));
        fill_random(keys, (size_t)B * E * ib, 1, 0x77);
        fill_random(mains, (size_t)B * E * mb, 2, 0x77);
        fill_random(rings, (size_t)B * W * wb, 3, 0x77);
        std::vector<const uint8_t*> kp, mp, rp;
        for (int b = 0; b < B; ++b) {
          kp.push_back(keys + (size_t)b * E * ib);
          mp.push_back(mains + (size_t)b * E * mb);
          rp.push_back(rings + (size_t)b * W * wb);
        }
        auto up_ptrs = [](const std::vector<const uint8_t*>& v) {
          auto* d = static_cast<const uint8_t**>(dmalloc(v.size() * sizeof(void*)));
          CK(cudaMemcpy(d, v.data(), v.size() * sizeof(void*), cudaMemcpyHostToDevice));
          return d;
        };
        auto up_ints = [](std::vector<int> v) {
          int* d = static_cast<int*>(dmalloc(v.size() * 4));
          CK(cudaMemcpy(d, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
          return d;
        };
        const uint8_t** dkp = up_ptrs(kp);
        const uint8_t** dmp = up_ptrs(mp);
        const uint8_t** drp = up_ptrs(rp);
        int* vis = up_ints(std::vector<int>((size_t)B, E));
        int* wstart = up_ints(std::vector<int>((size_t)B, 0));
        int* wn = up_ints(std::vector<int>((size_t)B, W));
        float* iq = static_cast<float*>(dmalloc((size_t)B * Hi * Di * 4));
        float* iw = static_cast<float*>(dmalloc((size_t)B * Hi * 4));
        float* q = static_cast<float*>(dmalloc((size_t)B * H * D * 4));
        float* sink = static_cast<float*>(dmalloc((size_t)H * 4));
        float* out = static_cast<float*>(dmalloc((size_t)B * H * D * 4));
        float* score = static_cast<float*>(dmalloc((size_t)B * E * 4));
        int32_t* ids = static_cast<int32_t*>(dmalloc((size_t)B * K * 4));
        int* nsel = static_cast<int*>(dmalloc((size_t)B * 4));
        fill_floats(iq, (size_t)B * Hi * Di, 11, 1.0f);
        fill_floats(iw, (size_t)B * Hi, 12, 0.2f);
        fill_floats(q, (size_t)B * H * D, 13, 1.0f);
        fill_floats(sink, (size_t)H, 14, 1.0f);
        cu::index_scores_params ip;
        ip.R = B, ip.E = E, ip.Hi = Hi, ip.Di = Di, ip.sscale = 1.0f / std::sqrt((float)Di);
        ip.q = iq, ip.w = iw, ip.keys = dkp, ip.vis = vis, ip.score = score;
        cu::sparse_attention_params ap;
        ap.R = B, ap.H = H, ap.D = D, ap.scale = 1.0f / std::sqrt((float)D), ap.q = q, ap.sink = sink;
        ap.wkeys = drp, ap.wstart = wstart, ap.wn = wn, ap.wcap = W, ap.main = dmp, ap.sel = ids, ap.nsel = nsel;
        ap.K = K, ap.out = out, ap.max_keys = W + K;
        const size_t wsf = cu::sparse_attention_workspace_floats(ap);
        float* work = static_cast<float*>(dmalloc(std::max<size_t>(1, wsf) * 4));
        ap.workspace = work, ap.workspace_floats = wsf;
        const int reps = ctx >= 131072 && B >= 64 ? 5 : 20;
        const double ti = time_it([&] { need(cu::index_scores(ip, nullptr), "index_scores"); }, reps);
        const double tk = time_it([&] { need(cu::topk(score, B, E, K, ids, nsel, nullptr), "topk"); }, reps);
        const double ta = time_it([&] { need(cu::sparse_attention(ap, nullptr), "sparse_attention"); }, reps);
        // bytes: index keys + scores written; scores read by top-k; window + selected entries + q/out
        const double bytes = (double)B * E * ib + 2.0 * B * E * 4 + (double)B * (W * wb + K * mb) +
                             2.0 * B * H * D * 4;
        const double t = ti + tk + ta;
        std::printf("%-8d %5d %12.1f %12.1f %12.1f %10.0f %7.1f%%\n", ctx, B, ti * 1e6, tk * 1e6, ta * 1e6,
                    bytes / t / 1e9, 100.0 * bytes / t / roof);
        const std::string what = std::to_string(ctx);
        csv.row("index_scores", what, B, ti, (double)B * E * ib + (double)B * E * 4, roof);
        csv.row("topk", what, B, tk, (double)B * E * 4, roof);
        csv.row("sparse_attention", what, B, ta, (double)B * (W * wb + K * mb) + 2.0 * B * H * D * 4, roof);
        csv.row("attention_step", what, B, t, bytes, roof);
        for (void* p : std::initializer_list<void*>{work, keys, mains, rings, (void*)dkp, (void*)dmp, (void*)drp, vis,
                                                    wstart, wn, iq, iw, q, sink, out, score, ids, nsel})
          cudaFree(p);
      }
  }
  if (csv.f) std::fclose(csv.f);
  return 0;
}
