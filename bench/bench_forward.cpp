// bench_forward — CPU forward-pass throughput (BENCHMARKS.md B3, B4 on the CPU).
//
// Figures (CSV on stdout: commit,machine,config,figure,value,unit):
//   prefill tok/s, CED vs full stack (same prompt, same weights, same process) at 1K and 4K,
//   with the quality figure that must accompany a speed figure: the last-row logits'
//   rel = max|ced − full| / max|full| and whether the argmax agrees;
//   decode tok/s (aggregate over the batch) at batch 1 / 8 / 32 and context 1K / 8K;
//   the same for the real tiny fixture model when its files are reachable;
//   the same random weights written as a BF16 and as an FP8/FP4 checkpoint (MODEL_SPEC §5),
//   memory-mapped and dequantised on the fly (engine.hpp): weight bytes owned / mapped / RSS
//   growth at load, prefill 1K, decode 1K/8K and, once, decode at 32K context (BF16).
// Models: "rand100m" — random weights for a ~100M-parameter config built in-process (12
// layers with every CSA2 mode, like the fixture, at d 512), fp32 in memory: the baseline;
// "rand100m-bf16" / "rand100m-fp8" — the same weights as checkpoints (see above);
// "tiny-A" — the fixture; "default" — the default model (model/weights/cedar-agent-tiny, or
// --model-dir), decode only, at --contexts (default 8192) and --batches (default 1,8), 20
// steps. --models picks a subset (default: every model but "default").
// Medians of `reps` repetitions (≥ 5 where the run is short). Progress goes to stderr.
// The last line is the CED / full-stack prefill time ratio at the longest prompt.
//
// Usage: bench_forward [--quick] [--fixture DIR] [--models tiny-A,rand100m,rand100m-bf16,rand100m-fp8,default]
//                      [--model-dir DIR] [--contexts N,...] [--batches B,...]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/qmatmul.hpp"
#include "model/config.hpp"
#include "model/engine.hpp"
#include "model/forward.hpp"
#include "model/model_dir.hpp"
#include "model/npy.hpp"
#include "bench_util.hpp"

namespace cm = cedar::model;
using clk = std::chrono::steady_clock;
using cedar::bench::median;
using cedar::bench::random_100m_config;
using cedar::bench::shell_line;

namespace {

std::string g_commit = "unknown", g_machine = "unknown";

void csv(const std::string& config, const std::string& figure, double value, const char* unit) {
  std::printf("%s,%s,%s,%s,%.6g,%s\n", g_commit.c_str(), g_machine.c_str(), config.c_str(), figure.c_str(), value,
              unit);
  std::fflush(stdout);
}

std::vector<int32_t> random_tokens(int n, int vocab, uint32_t seed) {
  std::vector<int32_t> t((size_t)n);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int i = 0; i < n; ++i) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    t[(size_t)i] = (int32_t)(s % (uint64_t)vocab);
  }
  return t;
}

double rel(const std::vector<float>& a, const std::vector<float>& b) {
  double md = 0, mb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    md = std::max(md, (double)std::fabs(a[i] - b[i]));
    mb = std::max(mb, (double)std::fabs(b[i]));
  }
  return md / std::max(mb, 1e-30);
}

// Prefill CED vs full stack at each length; returns the CED/full time ratio at the last one.
double bench_prefill(const std::string& name, const cm::engine& e, const std::vector<int>& lens, int reps) {
  const cm::model_config& c = e.config();
  cm::runner rn(e);
  double ratio = 0;
  for (int n : lens) {
    const std::vector<int32_t> prompt = random_tokens(n, (int)c.vocab_size, 11u + (uint32_t)n);
    std::vector<double> t_full, t_ced;
    std::vector<float> last_full, last_ced;
    for (int r = 0; r < reps; ++r) {
      for (cm::prefill_mode m : {cm::prefill_mode::full_stack, cm::prefill_mode::ced}) {
        cm::sequence s(c);
        cm::prefill_options o;
        o.mode = m;
        const auto t0 = clk::now();
        auto lg = rn.prefill(s, prompt, o);
        const double dt = std::chrono::duration<double>(clk::now() - t0).count();
        if (!lg.ok()) {
          std::fprintf(stderr, "prefill failed: %s\n", lg.err().message.c_str());
          return 0;
        }
        (m == cm::prefill_mode::ced ? t_ced : t_full).push_back(dt);
        (m == cm::prefill_mode::ced ? last_ced : last_full) = lg->values;
      }
      std::fprintf(stderr, "[%s] prefill n=%d rep %d: full %.3fs ced %.3fs\n", name.c_str(), n, r, t_full.back(),
                   t_ced.back());
    }
    const double mf = median(t_full), mc = median(t_ced);
    const std::string cfg = name + ";n=" + std::to_string(n);
    csv(cfg, "prefill_full_stack_tok_s", n / mf, "tok/s");
    csv(cfg, "prefill_ced_tok_s", n / mc, "tok/s");
    csv(cfg, "prefill_ced_over_full_time", mc / mf, "ratio");
    csv(cfg, "prefill_ced_theory_time", 0.5 + (double)c.sliding_window / n, "ratio");
    csv(cfg, "ced_vs_full_last_logits_rel", rel(last_ced, last_full), "rel");
    const bool same = std::max_element(last_ced.begin(), last_ced.end()) - last_ced.begin() ==
                      std::max_element(last_full.begin(), last_full.end()) - last_full.begin();
    csv(cfg, "ced_vs_full_argmax_equal", same ? 1 : 0, "bool");
    ratio = mc / mf;
  }
  return ratio;
}

void bench_decode(const std::string& name, const cm::engine& e, const std::vector<int>& ctxs,
                  const std::vector<int>& batches, int steps) {
  const cm::model_config& c = e.config();
  cm::runner rn(e);
  for (int ctx : ctxs) {
    // One CED prefill of `ctx` tokens, copied into every batch slot (same state, same cost).
    cm::sequence base(c);
    const auto t0 = clk::now();
    auto p = rn.prefill(base, random_tokens(ctx, (int)c.vocab_size, 5u + (uint32_t)ctx));
    if (!p.ok()) {
      std::fprintf(stderr, "prefill failed: %s\n", p.err().message.c_str());
      return;
    }
    std::fprintf(stderr, "[%s] decode: context %d prefilled in %.2fs\n", name.c_str(), ctx,
                 std::chrono::duration<double>(clk::now() - t0).count());
    for (int b : batches) {
      std::vector<cm::sequence> seqs((size_t)b, base);
      std::vector<cm::sequence*> ptrs;
      for (auto& s : seqs) ptrs.push_back(&s);
      std::vector<int32_t> toks((size_t)b);
      std::vector<float> lg;
      std::vector<double> times;
      for (int st = 0; st < steps + 1; ++st) {
        for (int i = 0; i < b; ++i) toks[(size_t)i] = (int32_t)((st * 131 + i * 17) % c.vocab_size);
        const auto t1 = clk::now();
        if (!rn.decode_step(ptrs, toks, lg).ok()) return;
        if (st > 0) times.push_back(std::chrono::duration<double>(clk::now() - t1).count());  // step 0 warms up
      }
      const double m = median(times);
      std::fprintf(stderr, "[%s] decode ctx %d batch %d: %.2f ms/step\n", name.c_str(), ctx, b, 1e3 * m);
      const std::string cfg = name + ";ctx=" + std::to_string(ctx) + ";batch=" + std::to_string(b);
      csv(cfg, "decode_tok_s", b / m, "tok/s");
      csv(cfg, "decode_step_ms", 1e3 * m, "ms");
    }
  }
}

long rss_kb() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  long kb = -1;
  while (std::fgets(line, sizeof line, f))
    if (!std::strncmp(line, "VmRSS:", 6)) kb = std::atol(line + 6);
  std::fclose(f);
  return kb;
}

// Weight memory: bytes the engine owns, bytes it maps from the checkpoint, the fp32 size of
// the same parameters, and the process RSS growth over the load.
void memory_figures(const std::string& name, const cm::engine& e, long rss_before_kb) {
  csv(name, "weights_owned_bytes", (double)e.owned_bytes(), "B");
  csv(name, "weights_mapped_bytes", (double)e.mapped_bytes(), "B");
  csv(name, "weights_fp32_bytes", 4.0 * (double)e.n_params(), "B");
  csv(name, "rss_growth_at_load", 1024.0 * (double)(rss_kb() - rss_before_kb), "B");
}

// "1024,8192" -> {1024, 8192}; false on an empty list or a non-positive / non-numeric item.
bool parse_list(const char* s, std::vector<int>* out) {
  out->clear();
  const std::string str = s;
  for (size_t p = 0; p <= str.size();) {
    size_t q = str.find(',', p);
    if (q == std::string::npos) q = str.size();
    const std::string item = str.substr(p, q - p);
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v <= 0 || v > (1l << 30)) return false;
    out->push_back((int)v);
    p = q + 1;
  }
  return !out->empty();
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  std::string fixture = "tests/fixtures/deepseek-v41-tiny-A";
  std::string models = "tiny-A,rand100m,rand100m-bf16,rand100m-fp8";
  std::string model_dir = "model/weights/cedar-agent-tiny";
  std::vector<int> default_ctxs = {8192}, default_batches = {1, 8};
  for (int i = 1; i < argc; ++i) {
    const bool help = !std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h");
    if (!std::strcmp(argv[i], "--quick")) quick = true;
    else if (!std::strcmp(argv[i], "--fixture") && i + 1 < argc) fixture = argv[++i];
    else if (!std::strcmp(argv[i], "--models") && i + 1 < argc) models = argv[++i];
    else if (!std::strcmp(argv[i], "--model-dir") && i + 1 < argc) model_dir = argv[++i];
    else if (!std::strcmp(argv[i], "--contexts") && i + 1 < argc && parse_list(argv[i + 1], &default_ctxs)) ++i;
    else if (!std::strcmp(argv[i], "--batches") && i + 1 < argc && parse_list(argv[i + 1], &default_batches)) ++i;
    else {
      std::fprintf(help ? stdout : stderr,
                   "usage: %s [--quick] [--fixture DIR] [--models tiny-A,rand100m,rand100m-bf16,rand100m-fp8,default]\n"
                   "          [--model-dir DIR] [--contexts N,...] [--batches B,...]\n"
                   "  --contexts, --batches: decode points of the \"default\" model (default 8192 and 1,8)\n",
                   argv[0]);
      return help ? 0 : 2;
    }
  }
  auto wanted = [&](const std::string& m) { return ("," + models + ",").find("," + m + ",") != std::string::npos; };
  g_commit = shell_line("git rev-parse --short HEAD 2>/dev/null");
  if (g_commit.empty()) g_commit = "unknown";
  char host[128] = {0};
  gethostname(host, sizeof host - 1);
  g_machine = std::string(host) + ";cores=" + std::to_string(std::thread::hardware_concurrency()) +
              ";threads=" + std::to_string(cedar::kernels::cpu_threads());
  std::printf("commit,machine,config,figure,value,unit\n");

  // --- the tiny fixture model (when reachable from the working directory) ---
  auto fc = cm::load_model_config(fixture + "/config.json");
  if (fc.ok() && wanted("tiny-A")) {
    cm::engine_options o;
    auto tm = cm::load_token_map_npy(fixture + "/engram/token_map.npy");
    if (tm.ok()) o.engram_token_map = *tm;
    auto fe = cm::engine::load(*fc, fixture + "/model.safetensors", o);
    if (fe.ok()) {
      std::fprintf(stderr, "[tiny-A] %lld params\n", (long long)fe->n_params());
      bench_prefill("tiny-A", *fe, {1024}, 5);
      bench_decode("tiny-A", *fe, {1024}, {1, 8, 32}, quick ? 5 : 20);
    } else {
      std::fprintf(stderr, "[tiny-A] skipped: %s\n", fe.err().message.c_str());
    }
  } else if (!fc.ok()) {
    std::fprintf(stderr, "[tiny-A] skipped (run from the repository root or pass --fixture): %s\n",
                 fc.err().message.c_str());
  }

  // --- the default model (model/weights/cedar-agent-tiny): decode at the chosen contexts ---
  if (wanted("default")) {
    auto md = cm::load_model_dir(model_dir, /*need_tokenizer=*/false);
    if (md.ok()) {
      std::fprintf(stderr, "[default] %lld params\n", (long long)md->eng->n_params());
      bench_decode("default", *md->eng, default_ctxs, default_batches, quick ? 5 : 20);
    } else {
      std::fprintf(stderr, "[default] skipped: %s\n", md.err().message.c_str());
    }
  }

  // --- random ~100M model ---
  cm::model_config c = random_100m_config();
  if (auto st = cm::finalize(c); !st.ok()) {
    std::fprintf(stderr, "config: %s\n", st.err().message.c_str());
    return 1;
  }
  double ratio = 0;
  if (wanted("rand100m")) {
    const long rss_before = rss_kb();
    const auto t0 = clk::now();
    auto e = cm::engine::random(c, 1234);
    if (!e.ok()) {
      std::fprintf(stderr, "engine: %s\n", e.err().message.c_str());
      return 1;
    }
    std::fprintf(stderr, "[rand100m] %lld params, built in %.1fs\n", (long long)e->n_params(),
                 std::chrono::duration<double>(clk::now() - t0).count());
    csv("rand100m", "params", (double)e->n_params(), "count");
    memory_figures("rand100m", *e, rss_before);
    ratio = quick ? bench_prefill("rand100m", *e, {1024}, 3) : bench_prefill("rand100m", *e, {1024, 4096}, 5);
    bench_decode("rand100m", *e, quick ? std::vector<int>{1024} : std::vector<int>{1024, 8192}, {1, 8, 32},
                 quick ? 3 : 8);
  }  // the fp32 weights are freed before the next models

  // --- the same weights stored BF16 / FP8+FP4, memory-mapped, dequantised on the fly ---
  for (const auto& [tag, layout] : {std::pair{"rand100m-bf16", cm::storage_layout::bf16},
                                    std::pair{"rand100m-fp8", cm::storage_layout::fp8}}) {
    if (!wanted(tag)) continue;
    const std::string path = "/tmp/cedar_bench_forward_" + std::to_string(getpid()) + "_" + tag + ".safetensors";
    if (auto st = cm::write_random_checkpoint(c, 1234, layout, path); !st.ok()) {
      std::fprintf(stderr, "[%s] write: %s\n", tag, st.err().message.c_str());
      return 1;
    }
    const long rss0 = rss_kb();
    cm::engine_options o;
    o.engram_token_map.resize((size_t)c.vocab_size);
    for (int64_t i = 0; i < c.vocab_size; ++i) o.engram_token_map[(size_t)i] = i % c.engram_compressed_vocab_size;
    auto q = cm::engine::load(c, path, o);
    std::remove(path.c_str());  // the mapping keeps the data alive
    if (!q.ok()) {
      std::fprintf(stderr, "[%s] load: %s\n", tag, q.err().message.c_str());
      return 1;
    }
    memory_figures(tag, *q, rss0);
    const bool bf16 = layout == cm::storage_layout::bf16;
    if (bf16 || !quick) bench_prefill(tag, *q, {1024}, quick ? 3 : 5);
    std::vector<int> ctxs = {1024};
    if (bf16 && !quick) ctxs = {1024, 8192};
    bench_decode(tag, *q, ctxs, {1, 8, 32}, quick ? 3 : 8);
    // Decode at 32K context (issue #3): batch 1, 8 and 32, once, on the bf16 engine.
    if (bf16 && !quick) bench_decode(tag, *q, {32768}, {1, 8, 32}, 5);
  }
  std::printf("ced_over_full_prefill_time_ratio,%.4f\n", ratio);
  return 0;
}
