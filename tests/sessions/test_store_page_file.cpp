// The page file of the session store (schema 3): dead bytes of removed sessions and their
// compaction, a compaction interrupted between its COMMIT and its rename, a missing or foreign
// page file, and the migration of a schema-2 store whose pages are BLOBs inside SQLite.
#include <gtest/gtest.h>

#include <filesystem>

#include "sessions/store.hpp"
#include "store_test_util.hpp"

namespace cedar::sessions {
namespace {

using test::make_turn;
using test::official_geometry;

constexpr uint64_t model = 0x0123456789abcdefull;

std::unique_ptr<store> open_store(const std::string& path, store_options opt = {}) {
  auto s = store::open(path, opt);
  EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.err().message);
  return s.ok() ? std::move(*s) : nullptr;
}

uint32_t turn_size(uint32_t t) { return 60 + (t * 53) % 200; }

// Commits turns [n_turns, n_turns + n) of seed `seed` to session `id`.
void commit(store& st, session_id id, uint64_t seed, int n) {
  auto info = st.get_session(id);
  ASSERT_TRUE(info.ok());
  uint64_t tokens = info->n_tokens;
  for (int i = 0; i < n; ++i) {
    const uint32_t t = info->n_turns + uint32_t(i);
    auto turn = make_turn(seed, t, tokens, turn_size(t));
    auto r = st.commit_turn(id, turn.write());
    ASSERT_TRUE(r.ok()) << r.err().message;
    tokens += turn.tokens.size();
  }
}

// The latest checkpoint of `id` holds exactly the pages of turns [0, n_turns) of `seed`.
void expect_pages(store& st, session_id id, uint64_t seed) {
  auto cp = st.load_checkpoint(id);
  ASSERT_TRUE(cp.ok()) << cp.err().message;
  ASSERT_TRUE(cp->all_pages_ok());
  uint64_t n = 0;
  for (uint32_t t = 0; t < cp->checkpoint.n_turns; ++t) n += turn_size(t);
  ASSERT_EQ(cp->tokens.size(), n);
  for (const loaded_source& s : cp->sources) {
    std::vector<uint8_t> main;
    for (const loaded_page& p : s.pages) main.insert(main.end(), p.main().begin(), p.main().end());
    EXPECT_EQ(main, test::entry_bytes(seed, s.source_layer, 0, uint32_t(s.n_entries), 288, 0));
  }
  EXPECT_TRUE(st.check_invariants(id).ok()) << st.check_invariants(id).err().message;
}

TEST(store_page_file, removed_sessions_leave_dead_bytes_that_compaction_drops) {
  test::temp_dir dir;
  const std::string path = dir.file("c.db");
  auto st = open_store(path);
  ASSERT_TRUE(st);
  const session_id a = *st->create_session(model, "a", official_geometry);
  const session_id b = *st->create_session(model, "b", official_geometry);
  commit(*st, a, 1, 3);
  commit(*st, b, 2, 4);
  const session_id fork = *st->fork_session(a, 2);  // shares a's first two turns' pages
  commit(*st, fork, 1, 1);
  commit(*st, a, 1, 2);
  auto before = st->page_stats();
  ASSERT_TRUE(before.ok());
  EXPECT_EQ(before->dead_bytes, 0u);
  EXPECT_EQ(before->file_bytes, page_file_header_bytes + before->live_bytes);

  // Removing b frees all its pages; removing a frees only those the fork does not share.
  const uint64_t b_bytes = before->live_bytes;
  ASSERT_TRUE(st->remove_session(b).ok());
  ASSERT_TRUE(st->remove_session(a).ok());
  auto dead = st->page_stats();
  ASSERT_TRUE(dead.ok());
  EXPECT_GT(dead->dead_bytes, 0u);
  EXPECT_LT(dead->live_bytes, b_bytes);
  EXPECT_EQ(dead->file_bytes, before->file_bytes);  // nothing is reclaimed by a removal
  EXPECT_EQ(dead->live_bytes + dead->dead_bytes + page_file_header_bytes, dead->file_bytes);

  auto after = st->compact_pages();
  ASSERT_TRUE(after.ok()) << after.err().message;
  EXPECT_EQ(after->dead_bytes, 0u);
  EXPECT_EQ(after->live_bytes, dead->live_bytes);
  EXPECT_EQ(after->file_bytes, page_file_header_bytes + dead->live_bytes);
  EXPECT_EQ(test::size_of(path + ".kvpages"), after->file_bytes);
  EXPECT_FALSE(std::filesystem::exists(path + ".kvpages-compact"));
  expect_pages(*st, fork, 1);
  // The store goes on: new turns append after the compacted pages; a reopen finds them all.
  commit(*st, fork, 1, 2);
  expect_pages(*st, fork, 1);
  st.reset();
  auto again = open_store(path);
  ASSERT_TRUE(again);
  expect_pages(*again, fork, 1);
  EXPECT_EQ(again->page_stats()->dead_bytes, 0u);
}

TEST(store_page_file, a_compaction_cut_short_is_finished_or_dropped_on_open) {
  test::temp_dir dir;
  const std::string path = dir.file("i.db");
  const std::string pages = path + ".kvpages";
  session_id id = 0;
  {
    auto st = open_store(path);
    ASSERT_TRUE(st);
    id = *st->create_session(model, "a", official_geometry);
    const session_id gone = *st->create_session(model, "gone", official_geometry);
    commit(*st, gone, 3, 2);
    commit(*st, id, 4, 3);
    ASSERT_TRUE(st->remove_session(gone).ok());
  }
  std::filesystem::copy_file(pages, dir.file("old.kvpages"));  // the file before compaction
  {
    auto st = open_store(path);
    ASSERT_TRUE(st->compact_pages().ok());
  }
  // A crash after the COMMIT, before the rename: the old file still has the name, the new one
  // sits beside it. open() finishes the rename.
  std::filesystem::rename(pages, pages + "-compact");
  std::filesystem::copy_file(dir.file("old.kvpages"), pages);
  {
    auto st = open_store(path);
    ASSERT_TRUE(st);
    EXPECT_FALSE(std::filesystem::exists(pages + "-compact"));
    expect_pages(*st, id, 4);
    EXPECT_EQ(st->page_stats()->dead_bytes, 0u);
  }
  // A crash before the COMMIT: the -compact file carries an id the database never recorded.
  // open() deletes it and keeps the file in use.
  {
    auto f = page_file::create(pages + "-compact", 42);
    ASSERT_TRUE(f.ok());
  }
  auto st = open_store(path);
  ASSERT_TRUE(st);
  EXPECT_FALSE(std::filesystem::exists(pages + "-compact"));
  expect_pages(*st, id, 4);
}

TEST(store_page_file, a_missing_page_file_loses_pages_not_sessions) {
  test::temp_dir dir;
  const std::string path = dir.file("m.db");
  session_id id = 0;
  {
    auto st = open_store(path);
    id = *st->create_session(model, "a", official_geometry);
    commit(*st, id, 5, 3);
  }
  std::filesystem::remove(path + ".kvpages");
  testing::internal::CaptureStderr();
  auto st = open_store(path);
  const std::string logged = testing::internal::GetCapturedStderr();
  ASSERT_TRUE(st);
  EXPECT_NE(logged.find("page file missing"), std::string::npos) << logged;
  // The transcript and token log are whole; every page reports itself lost.
  auto cp = st->load_checkpoint(id);
  ASSERT_TRUE(cp.ok()) << cp.err().message;
  EXPECT_EQ(cp->tokens.size(), uint64_t(turn_size(0) + turn_size(1) + turn_size(2)));
  EXPECT_EQ(cp->transcript.size(), 6u);
  ASSERT_FALSE(cp->sources.empty());
  for (const auto& s : cp->sources)
    for (const auto& p : s.pages) {
      EXPECT_EQ(p.status, page_status::missing);
      EXPECT_NE(p.detail.find("lost"), std::string::npos) << p.detail;
    }
  EXPECT_EQ(st->page_stats()->n_lost_pages, 12u);
  EXPECT_TRUE(st->check_invariants(id).ok()) << st->check_invariants(id).err().message;
  // A fork (which re-prefills) writes its new pages into the new file.
  const session_id f = *st->fork_session(id, 0);
  commit(*st, f, 6, 2);
  expect_pages(*st, f, 6);
}

TEST(store_page_file, a_page_file_of_another_store_is_refused_and_left_alone) {
  test::temp_dir dir;
  const std::string a = dir.file("a.db"), b = dir.file("b.db");
  {
    auto sa = open_store(a);
    auto sb = open_store(b);
    commit(*sa, *sa->create_session(model, "a", official_geometry), 1, 1);
  }
  std::filesystem::copy_file(a + ".kvpages", b + ".kvpages", std::filesystem::copy_options::overwrite_existing);
  const uint64_t size = test::size_of(b + ".kvpages");
  auto st = store::open(b);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.err().code, errc::mismatch);
  EXPECT_NE(st.err().message.find(b + ".kvpages"), std::string::npos) << st.err().message;
  EXPECT_NE(st.err().message.find("another store"), std::string::npos) << st.err().message;
  EXPECT_EQ(test::size_of(b + ".kvpages"), size);
  // Not a page file at all.
  ASSERT_TRUE(test::write_at(b + ".kvpages", 0, std::vector<uint8_t>(64, 0x33)));
  auto bad = store::open(b);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.err().message.find("not a cedar page file"), std::string::npos) << bad.err().message;
}

TEST(store_page_file, a_schema_2_store_with_blob_pages_migrates_into_the_page_file) {
  test::temp_dir dir;
  const std::string path = dir.file("v2.db");
  session_id id = 0, fork = 0;
  {
    auto st = open_store(path);
    id = *st->create_session(model, "old", official_geometry);
    commit(*st, id, 7, 4);
    fork = *st->fork_session(id, 2);
    commit(*st, fork, 7, 1);
  }
  ASSERT_TRUE(test::downgrade_to_schema2(path));
  ASSERT_EQ(test::raw_int(path, "PRAGMA user_version"), 2);
  ASSERT_GT(test::raw_int(path, "SELECT SUM(length(bytes)) FROM kv_pages"), 100000);
  ASSERT_FALSE(std::filesystem::exists(path + ".kvpages"));
  const int64_t n_pages = test::raw_int(path, "SELECT COUNT(*) FROM kv_pages");

  auto st = open_store(path);
  ASSERT_TRUE(st);
  EXPECT_EQ(test::raw_int(path, "PRAGMA user_version"), 3);
  // Every blob moved out, in one transaction; the rows point at them; forks still share.
  EXPECT_EQ(test::raw_int(path, "SELECT SUM(length(bytes)) FROM kv_pages"), 0);
  EXPECT_EQ(test::raw_int(path, "SELECT COUNT(*) FROM kv_pages WHERE file_offset IS NULL"), 0);
  EXPECT_EQ(test::raw_int(path, "SELECT COUNT(*) FROM kv_pages"), n_pages);
  auto stats = st->page_stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->n_pages, uint64_t(n_pages));
  EXPECT_EQ(stats->dead_bytes, 0u);
  EXPECT_EQ(stats->file_bytes, page_file_header_bytes + stats->live_bytes);
  expect_pages(*st, id, 7);
  expect_pages(*st, fork, 7);
  // The migrated store takes new turns.
  commit(*st, id, 7, 1);
  expect_pages(*st, id, 7);
}

}  // namespace
}  // namespace cedar::sessions
