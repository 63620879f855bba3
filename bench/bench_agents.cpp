// bench_agents — many agents on one executor (BENCHMARKS.md B7): 1 / 8 / 64 agents run one turn
// each, concurrently, on the shipped default model (model/weights/cedar-agent-tiny); the executor batches
// their decode steps (continuous batching).
//
// Each repetition opens fresh agents (fresh sessions, the same prompt shape) and starts every
// turn at once; a turn generates up to max_new_tokens (no tools, so one model reply per turn)
// and the generated count is taken from turn_result, never assumed. Figures per agent count
// (medians over reps): aggregate generated tok/s = Σ generated / wall time of the rep; p50 and
// p99 turn latency (per rep, over its turns, measured around agent::ask); and the baseline
// ratio aggregate tok/s ÷ the 1-agent figure of the same run (target ≥ 8× at 64 agents on the
// CPU; p99 ≤ 2× p50).
//
// CSV on stdout: commit,machine,config,figure,value,unit. Progress on stderr. The last line is
// the ratio at the largest agent count.
//
// Usage: bench_agents [--quick] [--model DIR] [--reps N] [--max-new N] [--agents 1,8,64]
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.hpp"
#include "runtime/cedar.hpp"

using clk = std::chrono::steady_clock;
using cedar::bench::median;
using cedar::bench::shell_line;

namespace {

std::string g_commit = "unknown", g_machine = "unknown";

void csv(const std::string& config, const std::string& figure, double value, const char* unit) {
  std::printf("%s,%s,%s,%s,%.6g,%s\n", g_commit.c_str(), g_machine.c_str(), config.c_str(), figure.c_str(), value,
              unit);
  std::fflush(stdout);
}

// The q-quantile (nearest rank) of `v`.
double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t k = size_t(std::ceil(q * double(v.size())));
  return v[std::min(v.size() - 1, k == 0 ? 0 : k - 1)];
}

std::vector<int> parse_list(const char* s) {
  std::vector<int> out;
  for (const char* p = s; *p;) {
    out.push_back(std::atoi(p));
    const char* c = std::strchr(p, ',');
    if (!c) break;
    p = c + 1;
  }
  return out;
}

struct rep_figures {
  double tok_s = 0, p50_ms = 0, p99_ms = 0;
  int64_t generated = 0;
  int failed = 0;
};

// One repetition: `n` fresh agents, one concurrent turn each.
rep_figures run_rep(cedar::agent_runtime& rt, int n, int max_new, int rep) {
  cedar::agent_options o;
  o.system_prompt = "You are a helpful assistant.";
  o.max_new_tokens = max_new;
  o.max_tool_rounds = 0;
  std::vector<cedar::agent> agents;
  for (int i = 0; i < n; ++i) {
    o.name = "bench" + std::to_string(i);
    auto a = rt.create_agent(o);
    if (!a) {
      std::fprintf(stderr, "create_agent: %s\n", a.err().message.c_str());
      std::exit(1);
    }
    agents.push_back(*a);
  }
  std::vector<double> lat(size_t(n), 0);
  std::vector<int64_t> gen(size_t(n), 0);
  std::atomic<int> failed{0};
  std::vector<std::thread> threads;
  auto t0 = clk::now();
  for (int i = 0; i < n; ++i)
    threads.emplace_back([&, i] {
      auto s = clk::now();
      // Distinct questions of the same shape (same prompt length class).
      auto r = agents[size_t(i)].ask("Tell me a story about the number " + std::to_string(100 + (i * 7 + rep) % 900) + ".");
      lat[size_t(i)] = std::chrono::duration<double, std::milli>(clk::now() - s).count();
      if (!r) {
        ++failed;
        std::fprintf(stderr, "agent %d: %s\n", i, r.err().message.c_str());
        return;
      }
      gen[size_t(i)] = r->generated_tokens;
    });
  for (auto& t : threads) t.join();
  double wall = std::chrono::duration<double>(clk::now() - t0).count();
  rep_figures f;
  for (int64_t g : gen) f.generated += g;
  f.tok_s = double(f.generated) / wall;
  f.p50_ms = quantile(lat, 0.50);
  f.p99_ms = quantile(lat, 0.99);
  f.failed = failed.load();
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  std::string model = std::string(CEDAR_SOURCE_DIR) + "/model/weights/cedar-agent-tiny";
  int reps = 0, max_new = 0;
  std::vector<int> counts = {1, 8, 64};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf(
          "bench_agents — B7: 1/8/64 agents on one executor, aggregate tok/s and turn latency.\n"
          "usage: bench_agents [--quick] [--model DIR] [--reps N] [--max-new N] [--agents 1,8,64]\n"
          "  --quick       3 reps of 16-token turns (default: 5 reps of 32-token turns)\n"
          "  --model DIR   model directory (default: model/weights/cedar-agent-tiny of the source tree)\n"
          "CSV on stdout (commit,machine,config,figure,value,unit); progress on stderr.\n");
      return 0;
    } else if (a == "--quick") {
      quick = true;
    } else if (a == "--model" && i + 1 < argc) {
      model = argv[++i];
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (a == "--max-new" && i + 1 < argc) {
      max_new = std::atoi(argv[++i]);
    } else if (a == "--agents" && i + 1 < argc) {
      counts = parse_list(argv[++i]);
    } else {
      std::fprintf(stderr, "bench_agents: unknown argument '%s' (try --help)\n", a.c_str());
      return 2;
    }
  }
  if (reps <= 0) reps = quick ? 3 : 5;
  if (reps < 3) reps = 3;
  if (max_new <= 0) max_new = quick ? 16 : 32;
  if (counts.empty() || *std::min_element(counts.begin(), counts.end()) < 1) {
    std::fprintf(stderr, "bench_agents: --agents needs positive counts\n");
    return 2;
  }
  g_commit = shell_line("git -C " CEDAR_SOURCE_DIR " rev-parse --short HEAD 2>/dev/null");
  if (g_commit.empty()) g_commit = "unknown";
  g_machine = shell_line("uname -m") + "-" + std::to_string(std::thread::hardware_concurrency()) + "cpu";

  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("cedar_bench_agents_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  double base = 0, last_ratio = 0;
  int last_n = 0;
  {
    cedar::runtime_options ro;
    ro.model_dir = model;
    ro.store_path = (dir / "bench.db").string();
    ro.builtin_tools = false;  // one model reply per turn: the figure is decode, not tools
    ro.ram_budget_mb = 4096;
    auto rt = cedar::agent_runtime::open(ro);
    if (!rt) {
      std::fprintf(stderr, "bench_agents: %s\n", rt.err().message.c_str());
      return 1;
    }
    std::fprintf(stderr, "[bench_agents] model %s, %d reps, max_new_tokens %d\n", model.c_str(), reps, max_new);
    run_rep(**rt, 1, max_new, -1);  // warm-up (page faults, allocator)
    std::sort(counts.begin(), counts.end());
    for (int n : counts) {
      std::vector<double> tps, p50, p99, gen;
      for (int r = 0; r < reps; ++r) {
        rep_figures f = run_rep(**rt, n, max_new, r);
        std::fprintf(stderr, "[bench_agents] agents=%d rep %d: %lld tokens, %.1f tok/s, p50 %.0f ms, p99 %.0f ms%s\n",
                     n, r, (long long)f.generated, f.tok_s, f.p50_ms, f.p99_ms,
                     f.failed ? (" (" + std::to_string(f.failed) + " failed)").c_str() : "");
        if (f.failed) return 1;
        tps.push_back(f.tok_s);
        p50.push_back(f.p50_ms);
        p99.push_back(f.p99_ms);
        gen.push_back(double(f.generated) / n);
      }
      const std::string cfg = "default-model;agents=" + std::to_string(n) + ";max_new=" + std::to_string(max_new);
      double t = median(tps);
      if (n == counts.front()) base = t;
      csv(cfg, "aggregate_tok_s", t, "tok/s");
      csv(cfg, "generated_per_turn", median(gen), "tokens");
      csv(cfg, "turn_latency_p50", median(p50), "ms");
      csv(cfg, "turn_latency_p99", median(p99), "ms");
      csv(cfg, "p99_over_p50", median(p99) / std::max(1e-9, median(p50)), "ratio");
      last_ratio = base > 0 ? t / base : 0;
      last_n = n;
      csv(cfg, "aggregate_over_1_agent", last_ratio, "ratio");
    }
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  std::printf("ratio aggregate tok/s at %d agents / %d agent: %.2fx (B7 target >= 8x at 64)\n", last_n, counts.front(),
              last_ratio);
  return 0;
}
