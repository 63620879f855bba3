// Schema version 2 of the session store: per-turn timings and stored agent options, and the
// migration of a version-1 file (made from a real store by removing what versions 3 and 2
// added, then marking it version 1) to the current version without losing a session.
#include <gtest/gtest.h>

#include <cmath>

#include "sessions/store.hpp"
#include "store_test_util.hpp"

namespace cedar::sessions {
namespace {

using test::make_turn;
using test::official_geometry;

constexpr uint64_t model = 0x0123456789abcdefull;

std::unique_ptr<store> open_store(const std::string& path) {
  auto s = store::open(path);
  EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.err().message);
  return s.ok() ? std::move(*s) : nullptr;
}

// Commits `n` turns; turn t records the timing {10 + t, 100 + t, 5 + t} when `timed`.
uint64_t commit(store& st, session_id id, uint64_t seed, int n, bool timed) {
  auto info = st.get_session(id);
  EXPECT_TRUE(info.ok());
  uint64_t tokens = info->n_tokens;
  for (int i = 0; i < n; ++i) {
    const uint32_t turn = info->n_turns + uint32_t(i);
    auto t = make_turn(seed, turn, tokens, 40 + 7 * turn);
    turn_write w = t.write();
    if (timed) w.timing = turn_timing{0, 10.0 + turn, 100.0 + turn, 5u + turn};
    auto r = st.commit_turn(id, w);
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.err().message);
    tokens += t.tokens.size();
  }
  return tokens;
}

TEST(store_schema2, timings_round_trip_forks_copy_them_and_updates_are_refused) {
  test::temp_dir dir;
  const std::string path = dir.file("t.db");
  auto st = open_store(path);
  ASSERT_TRUE(st);
  const session_id id = *st->create_session(model, "a", official_geometry);
  commit(*st, id, 3, 2, true);
  commit(*st, id, 3, 1, false);  // a turn without a generation records none
  commit(*st, id, 3, 1, true);
  auto tt = st->turn_timings(id);
  ASSERT_TRUE(tt.ok()) << tt.err().message;
  ASSERT_EQ(tt->size(), 3u);
  const uint32_t want_turns[] = {0, 1, 3};
  for (size_t i = 0; i < 3; ++i) {
    const uint32_t t = want_turns[i];
    EXPECT_EQ((*tt)[i].turn, t);
    EXPECT_DOUBLE_EQ((*tt)[i].ttft_ms, 10.0 + t);
    EXPECT_DOUBLE_EQ((*tt)[i].decode_ms, 100.0 + t);
    EXPECT_EQ((*tt)[i].n_decoded, 5u + t);
  }
  EXPECT_TRUE(st->check_invariants(id).ok());

  // A fork keeps the timings of the turns it keeps.
  auto f = st->fork_session(id, 2);
  ASSERT_TRUE(f.ok());
  auto ft = st->turn_timings(*f);
  ASSERT_TRUE(ft.ok());
  ASSERT_EQ(ft->size(), 2u);
  EXPECT_EQ((*ft)[1].turn, 1u);
  EXPECT_DOUBLE_EQ((*ft)[1].ttft_ms, 11.0);

  // Bad timings are refused before anything is written.
  auto bad = make_turn(9, 4, st->get_session(id)->n_tokens, 8);
  turn_write w = bad.write();
  w.timing = turn_timing{0, std::nan(""), 1, 1};
  auto r = st->commit_turn(id, w);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.err().code, errc::invalid_argument);
  EXPECT_NE(r.err().message.find("timing"), std::string::npos) << r.err().message;
  EXPECT_EQ(st->get_session(id)->n_turns, 4u);

  st.reset();
  EXPECT_NE(test::raw_exec(path, "UPDATE turn_timings SET ttft_ms=0"), SQLITE_OK);  // append-only
  EXPECT_EQ(test::raw_int(path, "SELECT COUNT(*) FROM turn_timings"), 5);
}

TEST(store_schema2, agent_options_are_stored_validated_and_inherited_by_forks) {
  test::temp_dir dir;
  auto st = open_store(dir.file("o.db"));
  ASSERT_TRUE(st);
  const session_id id = *st->create_session(model, "a", official_geometry);
  EXPECT_EQ(st->get_session(id)->agent_options, "");
  const std::string opts = R"({"max_new_tokens":12,"tools":["calculator"]})";
  ASSERT_TRUE(st->set_agent_options(id, opts).ok());
  EXPECT_EQ(st->get_session(id)->agent_options, opts);
  auto bad = st->set_agent_options(id, "[1, 2]");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.err().code, errc::invalid_argument);
  EXPECT_EQ(st->set_agent_options(id + 100, opts).err().code, errc::not_found);
  commit(*st, id, 4, 1, true);
  auto f = st->fork_session(id, 1);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(st->get_session(*f)->agent_options, opts);
  auto l = st->list_sessions();
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->front().agent_options, opts);
}

TEST(store_schema2, a_version_1_file_migrates_to_the_current_version_keeping_every_session) {
  test::temp_dir dir;
  const std::string path = dir.file("v1.db");
  session_id id = 0;
  uint64_t n_tokens = 0;
  {
    auto st = open_store(path);
    ASSERT_TRUE(st);
    id = *st->create_session(model, "old", official_geometry);
    n_tokens = commit(*st, id, 11, 3, false);
  }
  // Back to the version-1 schema: what migrations 2 -> 3 (page file) and 1 -> 2 add is removed.
  ASSERT_TRUE(test::downgrade_to_schema2(path));
  ASSERT_EQ(test::raw_exec(path,
                           "DROP TRIGGER turn_timings_append_only; DROP TABLE turn_timings; "
                           "ALTER TABLE sessions DROP COLUMN agent_options; PRAGMA user_version=1;"),
            SQLITE_OK);
  ASSERT_EQ(test::raw_int(path, "PRAGMA user_version"), 1);
  ASSERT_EQ(test::raw_int(path, "SELECT COUNT(*) FROM sqlite_schema WHERE name='turn_timings'"), 0);

  auto st = open_store(path);
  ASSERT_TRUE(st);
  EXPECT_EQ(test::raw_int(path, "PRAGMA user_version"), 3);
  EXPECT_EQ(test::raw_int(path, "SELECT COUNT(*) FROM sqlite_schema WHERE name='turn_timings'"), 1);
  EXPECT_EQ(test::raw_int(path, "SELECT SUM(length(bytes)) FROM kv_pages"), 0);  // pages moved out
  auto info = st->get_session(id);
  ASSERT_TRUE(info.ok()) << info.err().message;
  EXPECT_EQ(info->agent, "old");
  EXPECT_EQ(info->n_turns, 3u);
  EXPECT_EQ(info->n_tokens, n_tokens);
  EXPECT_EQ(info->agent_options, "");
  EXPECT_TRUE(st->turn_timings(id)->empty());
  auto cp = st->load_checkpoint(id);
  ASSERT_TRUE(cp.ok()) << cp.err().message;
  EXPECT_TRUE(cp->all_pages_ok());
  EXPECT_EQ(cp->tokens.size(), n_tokens);
  EXPECT_TRUE(st->check_invariants(id).ok());

  // The migrated file takes version-2 writes.
  commit(*st, id, 11, 1, true);
  ASSERT_TRUE(st->set_agent_options(id, R"({"name":"old"})").ok());
  auto tt = st->turn_timings(id);
  ASSERT_EQ(tt->size(), 1u);
  EXPECT_EQ((*tt)[0].turn, 3u);
  st.reset();
  // Opening again is a no-op migration.
  auto again = open_store(path);
  ASSERT_TRUE(again);
  EXPECT_EQ(again->get_session(id)->agent_options, R"({"name":"old"})");
  EXPECT_EQ(again->turn_timings(id)->size(), 1u);
}

}  // namespace
}  // namespace cedar::sessions
