// bench_store — what the session store costs on disk and how fast pages go through it
// (BENCHMARKS.md B1 and B8).
//
// B1: synthetic pages of the official DeepSeek-V4.1 shape (MODEL_SPEC §3: 4 KV sources, layers
//     2/8/14 at compress ratio 2 and layer 20 at ratio 1; 288 B main entry + 68 B index key)
//     are written turn by turn through the real page writer (sessions::store::commit_turn, with
//     token log, transcript items, aux state and a checkpoint per turn). The figure is the growth
//     of the store's files per context token: the database (WAL checkpointed into it: SQLite
//     overhead included) plus the page file `<db>.kvpages` (page headers included), against the
//     890 B/token payload and against bf16 KV of every layer (40 layers × 512 × 2 B = 40960
//     B/token).
// B8: page write throughput (commit_turn per turn: the turn's pages appended to the page file
//     with one pwritev + one fdatasync, then the SQLite transaction; plus a final WAL
//     checkpoint, which syncs) and page read throughput (load_checkpoint: every page pread from
//     the page file and its header, payload xxh64 and row checksum verified), against raw
//     sequential write (write() in 128 KB chunks + one fsync) and read() of a file of the same
//     bytes into freshly allocated memory, in the same run. Warm page cache for both reads
//     (dropping caches needs root).
//
// On a shared machine the wall clock also counts other processes, so B8 also reports throughput
// per CPU-second of this process (user + system), for the store and for the raw baseline.
//
// Output: CSV on stdout (commit, machine, config, figure, value, unit, baseline, baseline_value,
// ratio — ratio last), progress on stderr. Speeds are medians of --reps (≥ 5) repetitions.
// Usage: bench_store [--tokens N] [--reps R] [--dir PATH]
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "sessions/store.hpp"

namespace {

using namespace cedar::sessions;

constexpr page_geometry geometry{512, 128, 288, 68};
constexpr uint32_t layers[4] = {2, 8, 14, 20};
constexpr uint32_t ratios[4] = {2, 2, 2, 1};
constexpr double payload_per_token = 890.0;          // 356 B × 2.5 entries per token
constexpr double bf16_per_token = 40.0 * 512 * 2;     // 40960 B: bf16 KV of every layer
constexpr uint64_t model_hash = 0x5eedceda0000a441ull;

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

void fill(std::vector<uint8_t>& v, uint64_t seed) {
  uint64_t h = seed;
  for (size_t i = 0; i < v.size(); i += 8) {
    h = mix64(h);
    std::memcpy(v.data() + i, &h, std::min<size_t>(8, v.size() - i));
  }
}

double now_s() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

// CPU seconds of this process (user + system): on a shared machine the wall clock also counts
// other processes' time, so B8 reports both.
double cpu_s() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One turn's data, owning its bytes (the views in `write` point into it).
struct turn_data {
  std::vector<int32_t> tokens;
  std::vector<std::vector<uint8_t>> main, index;
  std::vector<uint8_t> compressor, engram;
  std::vector<item_write> items;
  std::vector<page_write> pages;
  turn_write write() const {
    turn_write w;
    w.items = items;
    w.tokens = tokens;
    w.pages = pages;
    w.aux = {{"compressor.pending", compressor}, {"engram.history", engram}};
    return w;
  }
};

// Turn sizes: a fixed size, or (0) an agent-like mix alternating a tool result of 512–2048
// tokens and an assistant turn of 64–512 tokens.
std::vector<uint32_t> schedule(uint64_t n_tokens, uint32_t fixed) {
  std::vector<uint32_t> out;
  uint64_t n = 0;
  for (uint64_t t = 0; n < n_tokens; ++t) {
    uint32_t k = fixed;
    if (fixed == 0) k = t % 2 == 0 ? 512 + mix64(t) % 1537 : 64 + mix64(t) % 449;
    k = static_cast<uint32_t>(std::min<uint64_t>(k, n_tokens - n));
    out.push_back(k);
    n += k;
  }
  return out;
}

std::vector<turn_data> make_turns(const std::vector<uint32_t>& sizes) {
  std::vector<turn_data> turns(sizes.size());
  uint64_t n = 0;
  for (size_t t = 0; t < sizes.size(); ++t) {
    turn_data& d = turns[t];
    d.tokens.resize(sizes[t]);
    for (uint32_t i = 0; i < sizes[t]; ++i) d.tokens[i] = static_cast<int32_t>(mix64(n + i) % 129280);
    const uint64_t after = n + sizes[t];
    d.items.push_back({item_kind::tool_result, "{\"content\":\"synthetic tool result\"}", n, n + sizes[t] / 2});
    d.items.push_back({item_kind::assistant, "{\"content\":\"synthetic answer\"}", n + sizes[t] / 2, after});
    d.main.resize(4);
    d.index.resize(4);
    for (int s = 0; s < 4; ++s) {
      const uint64_t first = n / ratios[s];
      const uint32_t e = static_cast<uint32_t>(after / ratios[s] - first);
      d.main[s].resize(uint64_t{e} * geometry.main_entry_bytes);
      d.index[s].resize(uint64_t{e} * geometry.index_entry_bytes);
      fill(d.main[s], mix64(t * 8 + s));
      fill(d.index[s], mix64(t * 8 + s + 4));
      d.pages.push_back({layers[s], first, e, d.main[s], d.index[s]});
    }
    d.compressor.resize(3 * 2 * 512 * 4);  // 3 ratio-2 sources × (kv, gate) × 512 fp32
    fill(d.compressor, t);
    d.engram.resize(3 * 4);
    fill(d.engram, t + 1);
    n = after;
  }
  return turns;
}

void remove_db(const std::string& p) {
  for (const char* suffix : {"", "-wal", "-shm", ".kvpages"}) std::remove((p + suffix).c_str());
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "bench_store: %s\n", what.c_str());
  std::exit(1);
}

std::string shell_line(const char* cmd) {
  std::string out;
  if (FILE* f = ::popen(cmd, "r")) {
    char buf[256];
    if (std::fgets(buf, sizeof buf, f)) out = buf;
    ::pclose(f);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out.empty() ? "unknown" : out;
}

struct csv {
  std::string commit, machine;
  void header() const {
    std::printf("commit,machine,config,figure,value,unit,baseline,baseline_value,ratio\n");
  }
  void row(const std::string& config, const char* figure, double value, const char* unit,
           const char* baseline, double baseline_value, double ratio) const {
    std::printf("%s,%s,%s,%s,%.4g,%s,%s,%.4g,%.4f\n", commit.c_str(), machine.c_str(), config.c_str(),
                figure, value, unit, baseline, baseline_value, ratio);
    std::fflush(stdout);
  }
};

// Writes all turns into a fresh store; returns seconds (commits + final WAL checkpoint).
double write_store(const std::string& path, const store_options& opt, const std::vector<turn_data>& turns,
                   session_id* id_out, uint64_t* growth_out, double* cpu_out = nullptr) {
  remove_db(path);
  auto st = store::open(path, opt);
  if (!st) die(st.err().message);
  auto id = (*st)->create_session(model_hash, "bench", geometry);
  if (!id) die(id.err().message);
  if (auto c = (*st)->checkpoint_wal(); !c) die(c.err().message);
  const uint64_t before = (*st)->file_bytes();
  const double t0 = now_s(), c0 = cpu_s();
  for (const turn_data& d : turns) {
    auto r = (*st)->commit_turn(*id, d.write());
    if (!r) die(r.err().message);
  }
  if (auto c = (*st)->checkpoint_wal(); !c) die(c.err().message);
  const double dt = now_s() - t0;
  if (cpu_out) *cpu_out = cpu_s() - c0;
  *growth_out = (*st)->file_bytes() - before;
  *id_out = *id;
  return dt;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t n_tokens = 32768;
  int reps = 5;
  std::string dir;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf(
          "bench_store — B1 (store bytes per context token) and B8 (page write/read throughput)\n"
          "usage: bench_store [--tokens N] [--reps R] [--dir PATH]\n"
          "  --tokens N  context tokens written turn by turn (default 32768, at least 1024)\n"
          "  --reps R    repetitions per figure, median reported (default 5, at least 5)\n"
          "  --dir PATH  where the store and the raw-disk baseline files go (default: a fresh\n"
          "              directory under $TMPDIR or /tmp, removed at the end)\n"
          "CSV on stdout (commit,machine,config,figure,value,unit,baseline,baseline_value,ratio);\n"
          "progress on stderr.\n");
      return 0;
    }
    if (a == "--tokens" && i + 1 < argc) n_tokens = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (a == "--dir" && i + 1 < argc) dir = argv[++i];
    else die("usage: bench_store [--tokens N] [--reps R (>= 5)] [--dir PATH]; bad argument '" + a + "'");
  }
  if (reps < 5) die("--reps must be >= 5 (medians of at least 5 repetitions)");
  if (n_tokens < 1024) die("--tokens must be >= 1024");
  std::string tmp_dir;
  if (dir.empty()) {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/cedar-bench-store-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (!::mkdtemp(buf.data())) die("cannot create a temporary directory under " + tmpl);
    dir = tmp_dir = buf.data();
  }
  csv out;
#ifdef CEDAR_SOURCE_DIR
  out.commit = shell_line("git -C " CEDAR_SOURCE_DIR " rev-parse --short HEAD 2>/dev/null");
#else
  out.commit = "unknown";
#endif
  out.machine = shell_line("uname -n") + "/" + std::to_string(::sysconf(_SC_NPROCESSORS_ONLN)) + "cpu";
  out.header();
  const std::string db = dir + "/bench.db";

  // ── B1: stored bytes per token ──────────────────────────────────────────────────────────
  for (uint32_t page_size : {4096u, 16384u, 65536u}) {
    for (uint32_t turn_tokens : {0u, 64u, 512u, 2048u}) {
      const auto turns = make_turns(schedule(n_tokens, turn_tokens));
      store_options opt;
      opt.page_size = page_size;
      session_id id = 0;
      uint64_t growth = 0;
      write_store(db, opt, turns, &id, &growth);
      const double per_token = static_cast<double>(growth) / static_cast<double>(n_tokens);
      const std::string config = "page_size=" + std::to_string(page_size) + ";turn_tokens=" +
                                 (turn_tokens ? std::to_string(turn_tokens) : std::string("agent_mix")) +
                                 ";tokens=" + std::to_string(n_tokens);
      std::fprintf(stderr, "B1 %s: %.1f B/token\n", config.c_str(), per_token);
      out.row(config, "stored_bytes_per_token", per_token, "B", "fp4_payload", payload_per_token,
              per_token / payload_per_token);
      out.row(config, "stored_bytes_per_token", per_token, "B", "bf16_kv_all_layers", bf16_per_token,
              bf16_per_token / per_token);
    }
  }

  // ── B8: page write/read throughput vs raw sequential I/O ────────────────────────────────
  const auto turns = make_turns(schedule(n_tokens, 2048));
  uint64_t page_bytes = 0;
  for (const turn_data& d : turns)
    for (const page_write& p : d.pages)
      page_bytes += page_header_bytes + p.main.size() + p.index.size();
  const double gb = static_cast<double>(page_bytes) / 1e9;

  // Raw baseline: the same bytes, written sequentially in 128 KB chunks + fsync, read back.
  std::vector<double> raw_w, raw_r, raw_wc, raw_rc;
  {
    const std::string raw = dir + "/raw.bin";
    std::vector<uint8_t> chunk(128 * 1024);
    fill(chunk, 99);
    std::vector<uint8_t> rbuf(128 * 1024);
    for (int r = 0; r < reps; ++r) {
      std::remove(raw.c_str());
      const double t0 = now_s(), c0 = cpu_s();
      const int fd = ::open(raw.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
      if (fd < 0) die("cannot create " + raw);
      for (uint64_t done = 0; done < page_bytes;) {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk.size(), page_bytes - done));
        if (::write(fd, chunk.data(), n) != static_cast<ssize_t>(n)) die("write failed on " + raw);
        done += n;
      }
      ::fsync(fd);
      ::close(fd);
      raw_w.push_back(gb / (now_s() - t0));
      raw_wc.push_back(gb / (cpu_s() - c0));
      // Read into freshly allocated memory, as load_checkpoint must deliver the pages.
      const double t1 = now_s(), c1 = cpu_s();
      const int rfd = ::open(raw.c_str(), O_RDONLY);
      std::vector<uint8_t> all(page_bytes);
      uint64_t got = 0;
      for (ssize_t n; got < page_bytes &&
                      (n = ::read(rfd, all.data() + got, std::min<uint64_t>(rbuf.size(), page_bytes - got))) > 0;)
        got += static_cast<uint64_t>(n);
      ::close(rfd);
      if (got != page_bytes) die("short read of " + raw);
      raw_r.push_back(gb / (now_s() - t1));
      raw_rc.push_back(gb / (cpu_s() - c1));
    }
    std::remove(raw.c_str());
  }
  const double raw_write = median(raw_w), raw_read = median(raw_r);
  const double raw_write_cpu = median(raw_wc), raw_read_cpu = median(raw_rc);
  std::fprintf(stderr, "B8 raw: write %.2f GB/s, read %.2f GB/s (%.1f MB)\n", raw_write, raw_read, gb * 1e3);

  for (uint32_t page_size : {4096u, 16384u, 65536u}) {
    {
      store_options opt;
      opt.page_size = page_size;
      std::vector<double> w, rd, wc, rc;
      for (int r = 0; r < reps; ++r) {
        session_id id = 0;
        uint64_t growth = 0;
        double cpu = 0;
        w.push_back(gb / write_store(db, opt, turns, &id, &growth, &cpu));
        wc.push_back(gb / cpu);
        auto st = store::open(db, opt);
        if (!st) die(st.err().message);
        const double t0 = now_s(), c0 = cpu_s();
        auto cp = (*st)->load_checkpoint(id);
        const double dt = now_s() - t0;
        rc.push_back(gb / (cpu_s() - c0));
        if (!cp) die(cp.err().message);
        if (!cp->all_pages_ok()) die("a page failed verification in the read benchmark");
        rd.push_back(gb / dt);
      }
      const std::string config = "page_size=" + std::to_string(page_size) + ";pages=kvpages_file" +
                                 ";turn_tokens=2048;tokens=" + std::to_string(n_tokens) +
                                 ";reps=" + std::to_string(reps);
      const double mw = median(w), mr = median(rd);
      std::fprintf(stderr, "B8 %s: write %.2f GB/s, read %.2f GB/s\n", config.c_str(), mw, mr);
      out.row(config, "page_write_commit_GBps", mw, "GB/s", "raw_seq_write_fsync", raw_write, mw / raw_write);
      out.row(config, "page_read_verify_GBps", mr, "GB/s", "raw_seq_read", raw_read, mr / raw_read);
      const double mwc = median(wc), mrc = median(rc);
      out.row(config, "page_write_commit_cpu_GBps", mwc, "GB/cpu-s", "raw_seq_write_fsync_cpu", raw_write_cpu,
              mwc / raw_write_cpu);
      out.row(config, "page_read_verify_cpu_GBps", mrc, "GB/cpu-s", "raw_seq_read_cpu", raw_read_cpu,
              mrc / raw_read_cpu);
    }
  }
  remove_db(db);
  if (!tmp_dir.empty()) std::filesystem::remove_all(tmp_dir);
  return 0;
}
