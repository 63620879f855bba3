// bench_resume — resume latency after a tool result (BENCHMARKS.md B2, issue 4).
//
// For a session of N context tokens the executor (runtime::executor_core, the one the runtime
// uses) resumes and prefills a 32-token tool result up to its first sampled token, three ways:
//   resident     the sequence is in RAM: prefill the 32 new tokens;
//   replayed     restore the global-KV pages and aux state from their bytes (as the store hands
//                them over), encoder bounded replay of the last n_win tokens, then the 32 new;
//   reprefilled  prefill the whole token log of N tokens (CED) again, then the 32 new (N + 32).
// and, as the baseline of what the resume hints save, replayed from the same checkpoint without
// its "hint.selections" aux blob (the replayed rows re-score their index selections over every
// entry, as before the hints existed): rows replayed_without_hints_*.
// The pages are the session's own turn delta (the bytes commit_turn would store). Each figure
// is the median of `reps` repetitions (≥ 5) after one warm-up; progress goes to stderr.
//
// Models: "default-model" (model/weights/cedar-agent-tiny, loaded with model::load_model_dir; run from the
// repository root or pass --model-dir) and "wide-random": random weights of a wider config of
// the same architecture (d 512, head_dim 128, n_win 128, 8 experts).
//
// Ideal ratio (B2): re-prefill / replayed ≈ (N/2 + n_win) / n_win, with N the context before the
// new tokens and n_win the model's sliding_window. It counts work in "tokens through every
// layer": the CED re-prefill runs N tokens through about half the layers (the encoder) and a
// window through the decoder; the replay runs n_win tokens through every layer. The 32 new
// tokens that both paths prefill are left out of it, so the measured ratio sits below the ideal
// where those 32 tokens are a large share of the replayed path.
//
// The last ratio row leaves the 32 new tokens out of both sides: re-prefill of the log alone
// over restore + bounded replay alone (the figure the ideal ratio describes: B2 times "load KV
// + replay n_win + first token", and the replay's last row gives the first token's logits),
// with its fraction of the ideal and the same ratio without hints.
//
// Re-prefill grows as N² (every token's indexer scores all earlier entries): above
// --reprefill-once-above N (default 32768) it is measured in ONE run after the replayed and
// resident repetitions, not as a median; its rows then say `reprefill_runs,1`. The machine's
// 1-minute load average is printed per context (shared machines: read figures against it).
//
// Memory: the executor's resident bytes for the session right after the replayed restore
// (global KV entries at their exact size, SWA rings, token log), total and per context token.
//
// --max-position N overrides both models' max_position_embeddings (e.g. to time a 131072-token
// context on a model trained for 65536). Timing only: positions beyond the trained length are
// outside what the model was trained on; the output says so (stderr and a CSV row per model).
//
// CSV on stdout: model,n_ctx,n_win,figure,value,unit. The ratio rows come last.
// Usage: bench_resume [--quick] [--reps R] [--contexts 1024,4096,...] [--model-dir DIR] [--models M]
//                     [--reprefill-once-above N] [--max-position N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "model/config.hpp"
#include "model/engine.hpp"
#include "model/model_dir.hpp"
#include "kernels/base/log.hpp"
#include "runtime/executor_core.hpp"
#include "bench_util.hpp"

namespace cm = cedar::model;
namespace rt = cedar::runtime;
using clk = std::chrono::steady_clock;
using cedar::bench::median;

namespace {

constexpr int kNewTokens = 32;

struct options {
  bool quick = false;
  int reps = 5;
  std::vector<int> sizes;
  std::string model_dir = "model/weights/cedar-agent-tiny";
  std::string models = "both";  // default | wide | both
  int reprefill_once_above = 32768;
  int64_t max_position = 0;  // 0: the models' own max_position_embeddings
};

void usage() {
  std::printf(
      "bench_resume — resume latency after a tool result (BENCHMARKS.md B2)\n"
      "usage: bench_resume [--quick] [--reps R] [--contexts N1,N2,...] [--model-dir DIR] [--models M]\n"
      "                    [--reprefill-once-above N] [--max-position N]\n"
      "  --quick       contexts 1K/4K/8K only (default 1K/4K/8K/32K)\n"
      "  --reps R      repetitions per figure, median reported (default 5, at least 5)\n"
      "  --contexts LIST  context sizes in tokens, comma-separated (overrides the defaults;\n"
      "                --sizes is the same option)\n"
      "  --model-dir   the default model's directory (default model/weights/cedar-agent-tiny)\n"
      "  --models M    default | wide | both (default both)\n"
      "  --reprefill-once-above N  above N tokens, re-prefill is timed in one run, not a median\n"
      "                (default 32768: it grows as N^2)\n"
      "  --max-position N  override max_position_embeddings of both models (timing only:\n"
      "                positions beyond the trained length are out of distribution), e.g. to\n"
      "                run --contexts 131072\n"
      "CSV on stdout (model,n_ctx,n_win,figure,value,unit), progress on stderr; the last rows\n"
      "are re-prefill/replayed ratios beside the ideal (N/2 + n_win)/n_win.\n");
}

void csv(const std::string& model, int n, int w, const char* fig, double v, const char* unit) {
  std::printf("%s,%d,%d,%s,%.6g,%s\n", model.c_str(), n, w, fig, v, unit);
  std::fflush(stdout);
}

std::vector<int32_t> random_tokens(int n, int vocab, uint64_t seed) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& x : t) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    x = int32_t(s % uint64_t(vocab - 32)) + 32;  // clear of the special tokens (EOS included)
  }
  return t;
}

// Prefills `tokens` on a resident session and samples one token (the first token of the
// answer); the finished turn carries the timings.
bool run_turn(rt::executor_core& core, int64_t id, const std::vector<int32_t>& tokens, rt::resume_path path,
              double resume_ms, rt::finished_generation* out) {
  rt::generation_params p;
  p.max_new_tokens = 1;
  auto t = core.start(id, tokens, p, path, resume_ms);
  if (!t.ok()) {
    std::fprintf(stderr, "start: %s\n", t.err().message.c_str());
    return false;
  }
  while (core.active(id))
    if (auto s = core.step(); !s.ok()) {
      std::fprintf(stderr, "step: %s\n", s.err().message.c_str());
      return false;
    }
  auto fin = core.take_finished();
  if (fin.size() != 1) return false;
  if (out) *out = std::move(fin.front());
  return true;
}

struct figures {
  double resident = 0, replayed = 0, replay_restore = 0, reprefilled = 0, reprefill_restore = 0;
  double nohints = 0, nohints_restore = 0;  // replayed without the resume hints (re-scored rows)
};

// One model at one context size.
double load_average() {
  double l = -1;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &l) != 1) l = -1;
    std::fclose(f);
  }
  return l;
}

bool bench_one(const std::string& name, const cm::engine& e, int n, int reps, bool reprefill_once, figures* out) {
  const int V = int(e.config().vocab_size);
  const int W = e.config().sliding_window;
  rt::executor_core core(e, size_t(8) << 30);
  const int64_t id = 1;
  auto ctx = random_tokens(n, V, uint64_t(n) * 31 + 7);
  auto fresh = random_tokens(kNewTokens, V, uint64_t(n) * 17 + 3);
  rt::resume_state log_only;
  log_only.tokens = ctx;
  log_only.pages_ok = false;
  log_only.problem = "re-prefill measured by the benchmark";
  // The session's checkpoint after N tokens: its global-KV bytes and aux state, taken from a
  // prefill of the context (what the store holds once the turn is committed).
  std::fprintf(stderr, "[%s N=%d] building the context...\n", name.c_str(), n);
  if (auto p = core.restore(id, log_only); !p.ok()) {
    std::fprintf(stderr, "prefill of the context: %s\n", p.err().message.c_str());
    return false;
  }
  rt::resume_state rs;
  {
    const cm::sequence* s = core.sequence_of(id);
    rs.tokens = s->tokens();
    const size_t mb = s->main_entry_bytes(), ib = s->index_entry_bytes();
    for (int i = 0; i < s->n_sources(); ++i) {
      const auto& src = s->source(i);
      rs.sources.push_back({uint32_t(src.layer),
                            std::vector<uint8_t>(src.main.begin(), src.main.begin() + int64_t(src.n_entries * mb)),
                            std::vector<uint8_t>(src.index.begin(), src.index.begin() + int64_t(src.n_entries * ib))});
    }
    rs.aux = rt::executor_core::aux_of(*s);
  }
  // The same checkpoint without its resume hints (as one written before them): the replayed
  // rows re-score their index selections over every entry. The baseline of what hints save.
  rt::resume_state bare = rs;
  std::erase_if(bare.aux, [](const auto& a) { return a.first == "hint.selections"; });
  for (const auto& a : rs.aux)
    if (a.first == "hint.selections") csv(name, n, W, "resume_hints_bytes", double(a.second.size()), "B");
  {
    // resident memory right after a replayed restore (vectors at their exact sizes)
    core.drop(id);
    if (auto p = core.restore(id, rs); !p.ok()) {
      std::fprintf(stderr, "restore: %s\n", p.err().message.c_str());
      return false;
    }
    const double bytes = double(core.resident_bytes());
    csv(name, n, W, "resident_bytes_after_restore", bytes, "B");
    csv(name, n, W, "resident_bytes_per_token", bytes / n, "B/token");
  }

  std::vector<double> t_res, t_rep, t_rep_restore, t_pre, t_pre_restore, t_bare, t_bare_restore;
  for (int r = 0; r <= reps; ++r) {  // r == 0: warm-up, not recorded
    // replayed: restore from bytes + bounded replay + 32 new tokens
    core.drop(id);
    double rms = 0;
    auto p = core.restore(id, rs, &rms);
    if (!p.ok() || *p != rt::resume_path::replayed) {
      std::fprintf(stderr, "replayed resume failed: %s\n", p.ok() ? rt::resume_path_name(*p) : p.err().message.c_str());
      return false;
    }
    rt::finished_generation f;
    if (!run_turn(core, id, fresh, *p, rms, &f)) return false;
    if (r > 0) {
      t_rep.push_back(rms + f.stats.prefill_ms);
      t_rep_restore.push_back(rms);
    }
    // replayed without hints
    core.drop(id);
    p = core.restore(id, bare, &rms);
    if (!p.ok() || *p != rt::resume_path::replayed) return false;
    if (!run_turn(core, id, fresh, *p, rms, &f)) return false;
    if (r > 0) {
      t_bare.push_back(rms + f.stats.prefill_ms);
      t_bare_restore.push_back(rms);
    }
    // resident: the same context in RAM (restored untimed), 32 new tokens
    core.drop(id);
    if (!core.restore(id, rs).ok()) return false;
    if (!run_turn(core, id, fresh, rt::resume_path::resident, 0, &f)) return false;
    if (r > 0) t_res.push_back(f.stats.prefill_ms);
    // reprefilled: the whole log again, then 32 new tokens (once, after the last repetition,
    // when reprefill_once)
    if (reprefill_once && r < reps) continue;
    core.drop(id);
    p = core.restore(id, log_only, &rms);
    if (!p.ok() || *p != rt::resume_path::reprefilled) return false;
    if (!run_turn(core, id, fresh, *p, rms, &f)) return false;
    t_pre.push_back(rms + f.stats.prefill_ms);
    t_pre_restore.push_back(rms);
    if (r == 0) {  // warm-up
      t_pre.clear();
      t_pre_restore.clear();
      continue;
    }
    std::fprintf(stderr,
                 "[%s N=%d] rep %d/%d: resident %.1f ms, replayed %.1f ms (without hints %.1f), re-prefill %.1f ms\n",
                 name.c_str(), n, r, reps, t_res.empty() ? 0.0 : t_res.back(), t_rep.empty() ? 0.0 : t_rep.back(),
                 t_bare.empty() ? 0.0 : t_bare.back(), t_pre.empty() ? 0.0 : t_pre.back());
  }
  out->resident = median(t_res);
  out->replayed = median(t_rep);
  out->replay_restore = median(t_rep_restore);
  out->reprefilled = median(t_pre);
  out->reprefill_restore = median(t_pre_restore);
  out->nohints = median(t_bare);
  out->nohints_restore = median(t_bare_restore);
  csv(name, n, W, "resident_ms", out->resident, "ms");
  csv(name, n, W, "replayed_ms", out->replayed, "ms");
  csv(name, n, W, "replayed_restore_replay_ms", out->replay_restore, "ms");
  csv(name, n, W, "replayed_without_hints_ms", out->nohints, "ms");
  csv(name, n, W, "replayed_without_hints_restore_replay_ms", out->nohints_restore, "ms");
  csv(name, n, W, "reprefilled_ms", out->reprefilled, "ms");
  csv(name, n, W, "reprefilled_log_only_ms", out->reprefill_restore, "ms");
  csv(name, n, W, "reprefill_runs", double(t_pre.size()), "runs");
  csv(name, n, W, "load_average_1min", load_average(), "load");
  return true;
}

// The default model with max_position_embeddings replaced (--max-position), loaded as
// model::load_model_dir does (config.json, the Engram token map, model.safetensors).
cedar::result<std::shared_ptr<const cm::engine>> load_with_max_position(const std::string& dir, int64_t max_pos) {
  auto cfg = cm::load_model_config(dir + "/config.json");
  if (!cfg.ok()) return cfg.take_err();
  cfg->max_position_embeddings = max_pos;
  cm::engine_options eo;
  for (const char* name : {"/token_map.npy", "/engram/token_map.npy"}) {
    auto tm = cm::load_token_map_npy(dir + name);
    if (!tm.ok()) continue;
    eo.engram_token_map = std::move(*tm);
    break;
  }
  const bool sharded = std::filesystem::exists(dir + "/model.safetensors.index.json");
  auto e = cm::engine::load(*cfg, sharded ? dir : dir + "/model.safetensors", std::move(eo));
  if (!e.ok()) return e.take_err();
  return std::make_shared<const cm::engine>(std::move(*e));
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      usage();
      return 0;
    } else if (a == "--quick") {
      o.quick = true;
    } else if (a == "--reps" && i + 1 < argc) {
      o.reps = std::max(5, std::atoi(argv[++i]));
    } else if ((a == "--contexts" || a == "--sizes") && i + 1 < argc) {
      std::string s = argv[++i];
      for (size_t p = 0; p < s.size();) {
        size_t q = s.find(',', p);
        if (q == std::string::npos) q = s.size();
        int v = std::atoi(s.substr(p, q - p).c_str());
        if (v <= 0) {
          std::fprintf(stderr, "bench_resume: bad context size '%s' in %s\n", s.substr(p, q - p).c_str(), a.c_str());
          return 2;
        }
        o.sizes.push_back(v);
        p = q + 1;
      }
    } else if (a == "--models" && i + 1 < argc) {
      o.models = argv[++i];
      if (o.models != "default" && o.models != "wide" && o.models != "both") {
        std::fprintf(stderr, "bench_resume: --models takes default, wide or both, not '%s'\n", o.models.c_str());
        return 2;
      }
    } else if (a == "--reprefill-once-above" && i + 1 < argc) {
      char* end = nullptr;
      const long v = std::strtol(argv[++i], &end, 10);
      if (end == argv[i] || *end != '\0' || v < 0) {
        std::fprintf(stderr, "bench_resume: --reprefill-once-above takes a token count, got '%s'\n", argv[i]);
        return 2;
      }
      o.reprefill_once_above = (int)std::min<long>(v, 1 << 30);
    } else if (a == "--max-position" && i + 1 < argc) {
      char* end = nullptr;
      const long long v = std::strtoll(argv[++i], &end, 10);
      if (end == argv[i] || *end != '\0' || v <= 0 || v > (1ll << 31)) {
        std::fprintf(stderr, "bench_resume: --max-position takes a positive token count, got '%s'\n", argv[i]);
        return 2;
      }
      o.max_position = v;
    } else if (a == "--model-dir" && i + 1 < argc) {
      o.model_dir = argv[++i];
    } else {
      std::fprintf(stderr, "bench_resume: unknown argument '%s' (see --help)\n", a.c_str());
      return 2;
    }
  }
  if (o.sizes.empty()) o.sizes = o.quick ? std::vector<int>{1024, 4096, 8192} : std::vector<int>{1024, 4096, 8192, 32768};

  struct model_entry {
    std::string name;
    std::shared_ptr<const cm::engine> eng;
  };
  std::vector<model_entry> models;
  cedar::log_set_level(cedar::log_level::error);  // every re-prefill logs why at warn level
  if (o.models != "wide") {
    if (o.max_position == 0) {
      auto md = cm::load_model_dir(o.model_dir, /*need_tokenizer=*/false);
      if (md.ok()) models.push_back({"default-model", md->eng});
      else std::fprintf(stderr, "[default-model] skipped: %s\n", md.err().message.c_str());
    } else if (auto e = load_with_max_position(o.model_dir, o.max_position); e.ok()) {
      models.push_back({"default-model", *e});
    } else {
      std::fprintf(stderr, "[default-model] skipped: %s\n", e.err().message.c_str());
    }
  }
  if (o.models != "default") {
    cm::model_config wc = cedar::bench::random_100m_config();
    if (auto st = cm::finalize(wc); !st.ok()) {
      std::fprintf(stderr, "wide config: %s\n", st.err().message.c_str());
      return 1;
    }
    if (o.max_position > 0) wc.max_position_embeddings = o.max_position;
    auto we = cm::engine::random(wc, 1234);
    if (!we.ok()) {
      std::fprintf(stderr, "wide engine: %s\n", we.err().message.c_str());
      return 1;
    }
    models.push_back({"wide-random", std::make_shared<const cm::engine>(std::move(*we))});
  }

  std::printf("model,n_ctx,n_win,figure,value,unit\n");
  if (o.max_position > 0)
    for (const auto& m : models) {
      std::fprintf(stderr,
                   "[%s] max_position_embeddings overridden to %lld: timing only, positions beyond the "
                   "trained length are out of distribution\n",
                   m.name.c_str(), (long long)o.max_position);
      csv(m.name, 0, m.eng->config().sliding_window, "max_position_override_timing_only", double(o.max_position),
          "tokens");
    }
  struct ratio_row {
    std::string model;
    int n, w;
    double measured, ideal, resume_only, resume_only_nohints;
  };
  std::vector<ratio_row> ratios;
  for (const auto& m : models) {
    const int W = m.eng->config().sliding_window;
    for (int n : o.sizes) {
      if (n > m.eng->config().max_position_embeddings - kNewTokens - 2) {
        std::fprintf(stderr, "[%s] N=%d skipped: beyond max_position_embeddings\n", m.name.c_str(), n);
        continue;
      }
      figures f;
      if (!bench_one(m.name, *m.eng, n, o.reps, n > o.reprefill_once_above, &f)) {
        std::fprintf(stderr, "[%s N=%d] failed\n", m.name.c_str(), n);
        return 1;
      }
      ratios.push_back({m.name, n, W, f.reprefilled / f.replayed, (n / 2.0 + W) / W, f.reprefill_restore / f.replay_restore,
                        f.reprefill_restore / f.nohints_restore});
    }
  }
  for (const auto& r : ratios) {
    csv(r.model, r.n, r.w, "ratio_reprefill_over_replayed", r.measured, "x");
    csv(r.model, r.n, r.w, "ideal_ratio_(N/2+n_win)/n_win", r.ideal, "x");
    csv(r.model, r.n, r.w, "fraction_of_ideal", r.measured / r.ideal, "x");
    csv(r.model, r.n, r.w, "ratio_resume_only_log_over_restore_replay", r.resume_only, "x");
    csv(r.model, r.n, r.w, "fraction_of_ideal_resume_only", r.resume_only / r.ideal, "x");
    csv(r.model, r.n, r.w, "ratio_resume_only_without_hints", r.resume_only_nohints, "x");
  }
  return 0;
}
