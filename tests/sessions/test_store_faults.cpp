// Faults: a writer killed with SIGKILL at random points, damaged pages, a database from a newer
// cedar, files that are not (or no longer) SQLite, and a full disk. Each is detected and
// reported; nothing committed is lost; nothing crashes.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <random>
#include <thread>

#include "sessions/store.hpp"
#include "store_test_util.hpp"

namespace cedar::sessions {
namespace {

using test::make_turn;
using test::official_geometry;

constexpr uint64_t model = 0x0123456789abcdefull;

uint32_t turn_size(uint32_t turn) { return 20 + (turn * 97) % 300; }

// The writer a child process runs until it is killed: commits the next turn of session `id`
// forever, acknowledging each committed turn index on `ack_fd` after commit_turn returns.
[[noreturn]] void writer_child(const std::string& path, session_id id, uint64_t seed, int ack_fd) {
  auto st = store::open(path);
  if (!st) _exit(3);
  for (;;) {
    auto info = (*st)->get_session(id);
    if (!info) _exit(4);
    auto t = make_turn(seed, info->n_turns, info->n_tokens, turn_size(info->n_turns));
    t.status_after = info->n_turns % 2 ? session_status::active : session_status::waiting_tool;
    auto r = (*st)->commit_turn(id, t.write());
    if (!r) _exit(5);
    const uint32_t done = r->turn;
    if (::write(ack_fd, &done, sizeof done) != sizeof done) _exit(6);
  }
}

// Reads the session and checks every committed turn byte for byte against the generator.
void verify_session(store& st, session_id id, uint64_t seed, uint32_t min_turns) {
  ASSERT_TRUE(st.check_invariants(id).ok()) << st.check_invariants(id).err().message;
  auto info = st.get_session(id);
  ASSERT_TRUE(info.ok());
  ASSERT_GE(info->n_turns, min_turns);
  if (info->n_turns == 0) return;
  auto cp = st.load_checkpoint(id);
  ASSERT_TRUE(cp.ok()) << cp.err().message;
  ASSERT_EQ(cp->checkpoint.n_turns, info->n_turns);
  ASSERT_TRUE(cp->all_pages_ok());
  std::vector<int32_t> tokens;
  std::vector<item_write> items;
  uint64_t n = 0;
  for (uint32_t t = 0; t < info->n_turns; ++t) {
    auto turn = make_turn(seed, t, n, turn_size(t));
    tokens.insert(tokens.end(), turn.tokens.begin(), turn.tokens.end());
    items.insert(items.end(), turn.items.begin(), turn.items.end());
    n += turn.tokens.size();
  }
  ASSERT_EQ(cp->tokens, tokens);
  ASSERT_EQ(cp->transcript.size(), items.size());
  for (size_t i = 0; i < items.size(); ++i) ASSERT_EQ(cp->transcript[i].payload, items[i].payload);
  for (const loaded_source& s : cp->sources) {
    const uint32_t ratio = s.source_layer == 20 ? 1 : 2;
    ASSERT_EQ(s.n_entries, n / ratio);
    uint64_t next = 0;
    for (const loaded_page& p : s.pages) {
      ASSERT_EQ(p.first_entry, next);
      auto want = test::entry_bytes(seed, s.source_layer, p.first_entry, p.n_entries, 288, 0);
      ASSERT_TRUE(std::equal(p.main().begin(), p.main().end(), want.begin(), want.end()));
      next += p.n_entries;
    }
  }
}

TEST(store_faults, sigkill_at_random_points_loses_no_committed_turn) {
  test::temp_dir dir;
  const std::string path = dir.file("crash.db");
  const uint64_t seed = 77;
  session_id id = 0;
  {
    auto st = store::open(path);
    ASSERT_TRUE(st.ok());
    id = *(*st)->create_session(model, "crash", official_geometry);
  }
  std::mt19937 rng(20261130);
  uint32_t acked_turns = 0;  // turns the writers reported committed, over all runs
  int kills_mid_run = 0;
  int tails_cut = 0;  // runs killed after a page write and before its COMMIT
  const int runs = 60;
  for (int run = 0; run < runs; ++run) {
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(fds[0]);
      writer_child(path, id, seed, fds[1]);
    }
    ::close(fds[1]);
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 40000));
    ASSERT_EQ(::kill(pid, SIGKILL), 0);
    int wstatus = 0;
    ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
    // Killed by our signal, not exited on an error of its own.
    ASSERT_TRUE(WIFSIGNALED(wstatus)) << "writer exited with " << WEXITSTATUS(wstatus) << " in run " << run;
    uint32_t t = 0;
    bool any = false;
    while (::read(fds[0], &t, sizeof t) == sizeof t) {
      acked_turns = std::max(acked_turns, t + 1);
      any = true;
    }
    ::close(fds[0]);
    if (any) ++kills_mid_run;

    const uint64_t size_at_kill = test::size_of(path + ".kvpages");
    auto st = store::open(path);
    ASSERT_TRUE(st.ok()) << "run " << run << ": " << st.err().message;
    // Bytes of a turn killed between its page write and its COMMIT are cut off on open: the
    // file ends exactly at the last committed page (invariant 10).
    auto ps = (*st)->page_stats();
    ASSERT_TRUE(ps.ok()) << ps.err().message;
    ASSERT_EQ(ps->file_bytes, page_file_header_bytes + ps->live_bytes) << "run " << run;
    ASSERT_EQ(ps->dead_bytes, 0u);
    if (size_at_kill > ps->file_bytes) ++tails_cut;
    auto info = (*st)->get_session(id);
    ASSERT_TRUE(info.ok());
    // Every acknowledged turn is there; at most the one in flight beyond it.
    ASSERT_GE(info->n_turns, acked_turns) << "run " << run;
    ASSERT_LE(info->n_turns, acked_turns + 1) << "run " << run;
    acked_turns = info->n_turns;
    verify_session(**st, id, seed, acked_turns);
    if (HasFatalFailure()) return;
  }
  EXPECT_GE(runs, 50);
  EXPECT_GT(acked_turns, 20u);      // the writers made progress
  EXPECT_GT(kills_mid_run, runs / 4);  // and many kills landed in a writing run
  std::printf("[          ] sigkill: %d runs, %u turns committed, %d uncommitted page tails cut on open\n",
              runs, acked_turns, tails_cut);
}

// A store with one session of three turns; returns the id.
session_id three_turns(const std::string& path, uint64_t seed) {
  auto st = store::open(path);
  EXPECT_TRUE(st.ok());
  const session_id id = *(*st)->create_session(model, "a", official_geometry);
  uint64_t n = 0;
  for (uint32_t t = 0; t < 3; ++t) {
    auto turn = make_turn(seed, t, n, 200 + 50 * t);
    EXPECT_TRUE((*st)->commit_turn(id, turn.write()).ok());
    n += turn.tokens.size();
  }
  return id;
}

const loaded_page* find_page(const checkpoint_data& cp, uint32_t layer, uint64_t first) {
  for (const auto& s : cp.sources)
    for (const auto& p : s.pages)
      if (s.source_layer == layer && p.first_entry == first) return &p;
  return nullptr;
}

TEST(store_faults, damaged_pages_are_reported_page_by_page) {
  test::temp_dir dir;
  const std::string path = dir.file("d.db");
  const session_id id = three_turns(path, 5);
  // Page rows: source 2 turn 0 starts at entry 0, turn 1 at 100, turn 2 at 225; source 20 turn 2
  // (the last page written, at the end of the page file) at 450.
  auto row_of = [&](uint32_t layer, uint64_t first) {
    return test::raw_int(path, "SELECT page_id FROM session_pages WHERE session_id=" + std::to_string(id) +
                                   " AND source_layer=" + std::to_string(layer) +
                                   " AND first_entry=" + std::to_string(first));
  };
  auto where = [&](int64_t row) {
    auto st = store::open(path);
    EXPECT_TRUE(st.ok());
    auto loc = (*st)->locate_page(row);
    EXPECT_TRUE(loc.ok());
    return loc.ok() ? *loc : page_location{};
  };
  const page_location flipped = where(row_of(2, 100)), truncated = where(row_of(20, 450)),
                      header = where(row_of(14, 225)), foreign = where(row_of(20, 200));
  const int64_t gone_first = 0;
  ASSERT_GT(flipped.bytes, 5001u);
  ASSERT_EQ(foreign.bytes, page_header_bytes + 250u * official_geometry.entry_bytes());
  ASSERT_EQ(truncated.offset + truncated.bytes, test::size_of(path + ".kvpages"));
  // 1. a flipped payload byte; 2. a page cut short by the end of the file; 3. a flipped header
  // byte; 4. a page of another model (a well-formed page with another hash); 5. a missing page.
  auto flip = [&](const page_location& at, uint64_t byte) {
    auto b = test::read_at(at.path, at.offset + byte, 1);
    ASSERT_EQ(b.size(), 1u);
    b[0] ^= 0x5a;
    ASSERT_TRUE(test::write_at(at.path, at.offset + byte, b));
  };
  flip(flipped, 5000);
  flip(header, 9);
  ASSERT_EQ(::truncate(truncated.path.c_str(), static_cast<off_t>(truncated.offset + truncated.bytes - 100)), 0);
  {
    page_header h;
    h.model_hash = 0xbadbadbadull;
    h.source_layer = 20;
    h.geometry = official_geometry;
    h.first_entry = 200;
    h.n_entries = 250;
    auto main = test::entry_bytes(5, 20, 200, 250, 288, 0);
    auto index = test::entry_bytes(5, 20, 200, 250, 68, 1);
    ASSERT_TRUE(test::write_at(foreign.path, foreign.offset, *encode_page(h, main, index)));
  }
  ASSERT_EQ(test::raw_exec(path, "DELETE FROM session_pages WHERE session_id=" + std::to_string(id) +
                                     " AND source_layer=20 AND first_entry=" + std::to_string(gone_first)),
            SQLITE_OK);

  auto st = store::open(path);
  ASSERT_TRUE(st.ok());
  auto cp = (*st)->load_checkpoint(id);
  ASSERT_TRUE(cp.ok()) << cp.err().message;
  EXPECT_FALSE(cp->all_pages_ok());
  auto status_of = [&](uint32_t layer, uint64_t first) {
    const loaded_page* p = find_page(*cp, layer, first);
    return p ? p->status : page_status::ok;
  };
  EXPECT_EQ(status_of(2, 100), page_status::checksum);
  EXPECT_EQ(status_of(20, 450), page_status::truncated);
  EXPECT_EQ(status_of(14, 225), page_status::bad_header);
  EXPECT_EQ(status_of(20, 200), page_status::model_mismatch);
  EXPECT_EQ(status_of(20, 0), page_status::missing);
  EXPECT_EQ(find_page(*cp, 20, 0)->n_entries, 200u);
  // Every other page is intact and usable.
  int ok = 0;
  for (const auto& s : cp->sources)
    for (const auto& p : s.pages) {
      if (p.status == page_status::ok) {
        ++ok;
        EXPECT_EQ(p.main().size(), uint64_t{p.n_entries} * 288);
      } else {
        EXPECT_FALSE(p.detail.empty());
        EXPECT_TRUE(p.main().empty());
        if (p.status != page_status::missing) {  // the file and offset are named
          EXPECT_NE(p.detail.find(".kvpages at offset"), std::string::npos) << p.detail;
        }
      }
    }
  EXPECT_EQ(ok, 12 - 5);
  // The source of truth is intact: the executor can re-prefill from it.
  EXPECT_EQ(cp->tokens.size(), 200u + 250u + 300u);
  EXPECT_EQ(cp->transcript.size(), 6u);
  // The structural check sees the missing page (invariant 5) and names it.
  auto inv = (*st)->check_invariants(id);
  ASSERT_FALSE(inv.ok());
  EXPECT_NE(inv.err().message.find("invariant"), std::string::npos);
}

TEST(store_faults, damaged_aux_and_token_log_are_errors_not_garbage) {
  test::temp_dir dir;
  const std::string path = dir.file("a.db");
  const session_id id = three_turns(path, 6);
  ASSERT_EQ(test::raw_exec(path, "UPDATE checkpoint_aux SET bytes=x'00' || substr(bytes,2) WHERE name="
                                 "'compressor.pending' AND n_turns=3"),
            SQLITE_OK);
  auto st = store::open(path);
  ASSERT_TRUE(st.ok());
  auto cp = (*st)->load_checkpoint(id);
  ASSERT_TRUE(cp.ok());
  ASSERT_EQ(cp->aux.size(), 1u);
  EXPECT_EQ(cp->aux[0].name, "engram.history");
  ASSERT_EQ(cp->aux_errors.size(), 1u);
  EXPECT_NE(cp->aux_errors[0].find("compressor.pending"), std::string::npos);
  (*st).reset();
  // The schema refuses to rewrite history; the damage below comes from outside SQL's rules.
  EXPECT_EQ(test::raw_exec(path, "UPDATE token_chunks SET ids=substr(ids,1,length(ids)-4) WHERE turn=1"),
            SQLITE_CONSTRAINT);
  ASSERT_EQ(test::raw_exec(path, "DROP TRIGGER token_chunks_append_only;"
                                 "UPDATE token_chunks SET ids=substr(ids,1,length(ids)-4) WHERE turn=1"),
            SQLITE_OK);
  auto st2 = store::open(path);
  auto cp2 = (*st2)->load_checkpoint(id);
  ASSERT_FALSE(cp2.ok());
  EXPECT_EQ(cp2.err().code, errc::checksum);
  EXPECT_NE(cp2.err().message.find("token log"), std::string::npos);
}

std::vector<char> read_file(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(f), {});
}

TEST(store_faults, newer_schema_is_refused_and_left_untouched) {
  test::temp_dir dir;
  const std::string path = dir.file("n.db");
  const session_id id = three_turns(path, 8);
  ASSERT_EQ(test::raw_exec(path, "PRAGMA user_version=7"), SQLITE_OK);
  ASSERT_EQ(test::raw_exec(path, "PRAGMA wal_checkpoint(TRUNCATE)"), SQLITE_OK);
  const auto before = read_file(path);
  auto st = store::open(path);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.err().code, errc::mismatch);
  EXPECT_NE(st.err().message.find("schema version 7 is newer"), std::string::npos) << st.err().message;
  EXPECT_NE(st.err().message.find(path), std::string::npos);
  EXPECT_EQ(read_file(path), before);
  // Nothing was lost: back at the current version (3) the session loads whole.
  ASSERT_EQ(test::raw_exec(path, "PRAGMA user_version=3"), SQLITE_OK);
  auto again = store::open(path);
  ASSERT_TRUE(again.ok());
  auto cp = (*again)->load_checkpoint(id);
  ASSERT_TRUE(cp.ok());
  EXPECT_TRUE(cp->all_pages_ok());
  EXPECT_EQ(cp->checkpoint.n_turns, 3u);
}

TEST(store_faults, files_that_are_not_a_cedar_store_are_refused) {
  test::temp_dir dir;
  // Garbage bytes.
  const std::string garbage = dir.file("garbage.db");
  {
    std::ofstream f(garbage, std::ios::binary);
    std::mt19937 rng(1);
    for (int i = 0; i < 65536; ++i) f.put(static_cast<char>(rng()));
  }
  const auto before = read_file(garbage);
  auto g = store::open(garbage);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.err().code, errc::invalid_format);
  EXPECT_NE(g.err().message.find("not a cedar session store"), std::string::npos) << g.err().message;
  EXPECT_EQ(read_file(garbage), before);
  // Another application's SQLite file.
  const std::string other = dir.file("other.db");
  ASSERT_EQ(test::raw_exec(other, "PRAGMA application_id=1234; CREATE TABLE t(x)"), SQLITE_OK);
  auto o = store::open(other);
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.err().code, errc::mismatch);
  EXPECT_NE(o.err().message.find("another application"), std::string::npos);
  // A directory where the file should be.
  auto d = store::open(dir.path());
  ASSERT_FALSE(d.ok());
  EXPECT_FALSE(d.err().message.empty());
}

TEST(store_faults, a_store_corrupted_in_the_middle_reports_errors_without_crashing) {
  test::temp_dir dir;
  const std::string path = dir.file("mid.db");
  const session_id id = three_turns(path, 9);
  ASSERT_EQ(test::raw_exec(path, "PRAGMA wal_checkpoint(TRUNCATE)"), SQLITE_OK);
  auto garbage = [](const std::string& file, uint64_t at, int n, unsigned seed) {
    std::fstream f(file, std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(static_cast<std::streamoff>(at));
    std::mt19937 rng(seed);
    for (int i = 0; i < n; ++i) f.put(static_cast<char>(rng()));
  };
  // 1. 40 KB of garbage in the middle of the page file: the pages there fail their checks.
  const uint64_t pages_size = test::size_of(path + ".kvpages");
  ASSERT_GT(pages_size, 200000u);
  garbage(path + ".kvpages", pages_size / 2, 40000, 3);
  {
    auto st = store::open(path);
    ASSERT_TRUE(st.ok()) << st.err().message;
    auto cp = (*st)->load_checkpoint(id);
    ASSERT_TRUE(cp.ok()) << cp.err().message;
    EXPECT_FALSE(cp->all_pages_ok());
    EXPECT_EQ(cp->tokens.size(), 200u + 250u + 300u);  // the source of truth is intact
  }
  // 2. Garbage over the middle half of the database (b-tree pages).
  const auto size = read_file(path).size();
  ASSERT_GT(size, 16384u);
  garbage(path, size / 4, static_cast<int>(size / 2), 2);
  int errors = 0;
  auto st = store::open(path);
  if (!st.ok()) {
    ++errors;
    EXPECT_FALSE(st.err().message.empty());
  } else {
    auto cp = (*st)->load_checkpoint(id);
    if (!cp.ok()) {
      ++errors;
      EXPECT_FALSE(cp.err().message.empty());
    } else if (!cp->all_pages_ok()) {
      ++errors;
    }
    auto inv = (*st)->check_invariants(id);
    if (!inv.ok()) ++errors;
  }
  EXPECT_GT(errors, 0) << "garbage inside the database went unnoticed";
}

// Fills the store under `limits` until a turn fails; checks the failure and that every
// committed turn survives, with the page file cut back to its committed end.
void fill_until_full(const store_options& limits, const char* needle) {
  test::temp_dir dir;
  const std::string path = dir.file("full.db");
  session_id id = 0;
  uint32_t committed = 0;
  uint64_t n = 0;
  error full;
  {
    auto st = store::open(path, limits);
    ASSERT_TRUE(st.ok());
    id = *(*st)->create_session(model, "a", official_geometry);
    for (uint32_t t = 0; t < 100; ++t) {
      auto turn = make_turn(3, t, n, 150);
      auto r = (*st)->commit_turn(id, turn.write());
      if (!r.ok()) {
        full = r.err();
        break;
      }
      ++committed;
      n += 150;
    }
    ASSERT_GT(committed, 2u);
    ASSERT_LT(committed, 100u);
    EXPECT_EQ(full.code, errc::io);
    EXPECT_NE(full.message.find("full"), std::string::npos) << full.message;
    EXPECT_NE(full.message.find(needle), std::string::npos) << full.message;
    // The store still answers, with the failed turn absent and none of its page bytes kept.
    auto info = (*st)->get_session(id);
    ASSERT_TRUE(info.ok());
    EXPECT_EQ(info->n_turns, committed);
    EXPECT_TRUE((*st)->check_invariants(id).ok());
    auto ps = (*st)->page_stats();
    ASSERT_TRUE(ps.ok());
    EXPECT_EQ(ps->file_bytes, page_file_header_bytes + ps->live_bytes);
    EXPECT_EQ(ps->n_pages, 4u * committed);
  }
  // Reopened without the limit: everything committed is there, and the session continues.
  auto st = store::open(path);
  ASSERT_TRUE(st.ok());
  auto cp = (*st)->load_checkpoint(id);
  ASSERT_TRUE(cp.ok());
  EXPECT_TRUE(cp->all_pages_ok());
  EXPECT_EQ(cp->checkpoint.n_turns, committed);
  EXPECT_EQ(cp->tokens.size(), n);
  auto next = make_turn(3, committed, n, 150);
  ASSERT_TRUE((*st)->commit_turn(id, next.write()).ok());
  EXPECT_TRUE((*st)->check_invariants(id).ok());
}

TEST(store_faults, a_full_database_fails_the_turn_and_keeps_every_committed_one) {
  store_options small;
  small.max_page_count = 200;  // 800 KB of rows at 4 KB pages (aux state: ~13 KB a turn)
  fill_until_full(small, "full.db");
}

TEST(store_faults, a_full_page_file_fails_the_turn_and_keeps_every_committed_one) {
  store_options small;
  small.max_page_file_bytes = 1 << 20;  // ~7 turns of 150 tokens (133 KB of pages each)
  fill_until_full(small, "full.db.kvpages");
}

// A real write failure of the page file: the kernel refuses to grow it past RLIMIT_FSIZE
// (EFBIG, as a full disk refuses with ENOSPC) in a child process; the pwrite fails half-way
// through a turn's pages. The parent then finds every acknowledged turn and no tail.
TEST(store_faults, a_page_write_refused_by_the_kernel_fails_the_turn_cleanly) {
  test::temp_dir dir;
  const std::string path = dir.file("efbig.db");
  session_id id = 0;
  {
    auto st = store::open(path);
    ASSERT_TRUE(st.ok());
    id = *(*st)->create_session(model, "a", official_geometry);
  }
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(fds[0]);
    ::signal(SIGXFSZ, SIG_IGN);  // get EFBIG from write instead of the signal
    const rlimit lim{1 << 20, 1 << 20};
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) _exit(3);
    auto st = store::open(path);
    if (!st) _exit(4);
    uint64_t n = 0;
    for (uint32_t t = 0; t < 100; ++t) {
      auto turn = make_turn(8, t, n, turn_size(t));
      auto r = (*st)->commit_turn(id, turn.write());
      if (!r) {
        const std::string& m = r.err().message;
        const bool named = m.find(".kvpages") != std::string::npos && m.find("full") != std::string::npos;
        const uint32_t code = (named ? 1000u : 2000u) + t;
        if (::write(fds[1], &code, sizeof code) != sizeof code) _exit(6);
        _exit(r.err().code == errc::io ? 0 : 5);
      }
      n += turn_size(t);
    }
    _exit(7);
  }
  ::close(fds[1]);
  int wstatus = 0;
  ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFEXITED(wstatus));
  ASSERT_EQ(WEXITSTATUS(wstatus), 0);
  uint32_t code = 0;
  ASSERT_EQ(::read(fds[0], &code, sizeof code), ssize_t(sizeof code));
  ::close(fds[0]);
  EXPECT_GE(code, 1000u);
  EXPECT_LT(code, 2000u) << "the error did not name the page file and a full disk";
  const uint32_t committed = code % 1000;
  ASSERT_GT(committed, 2u);
  auto st = store::open(path);
  ASSERT_TRUE(st.ok()) << st.err().message;
  EXPECT_EQ((*st)->get_session(id)->n_turns, committed);
  auto ps = (*st)->page_stats();
  ASSERT_TRUE(ps.ok());
  EXPECT_EQ(ps->file_bytes, page_file_header_bytes + ps->live_bytes);
  verify_session(**st, id, 8, committed);
}

}  // namespace
}  // namespace cedar::sessions
