// The session store on a real SQLite temp file: schema, turns, checkpoints, status
// transitions, validation of bad input, forks sharing pages, removal.
#include <gtest/gtest.h>

#include "sessions/store.hpp"
#include "store_test_util.hpp"

namespace cedar::sessions {
namespace {

using test::make_turn;
using test::official_geometry;

constexpr uint64_t model = 0x8badf00ddeadbeefull;  // high bit set: stored as a negative int64

std::unique_ptr<store> open_store(const std::string& path, store_options opt = {}) {
  auto s = store::open(path, opt);
  EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.err().message);
  return s.ok() ? std::move(*s) : nullptr;
}

// Commits `n` synthetic turns of sizes from `sizes` (cycled); returns the token count.
uint64_t commit_turns(store& st, session_id id, uint64_t seed, int n,
                      const std::vector<uint32_t>& sizes = {100, 37, 255, 3, 64}) {
  auto info = st.get_session(id);
  EXPECT_TRUE(info.ok());
  uint64_t tokens = info->n_tokens;
  for (int i = 0; i < n; ++i) {
    const uint32_t turn = info->n_turns + i;
    auto t = make_turn(seed, turn, tokens, sizes[turn % sizes.size()]);
    auto r = st.commit_turn(id, t.write());
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.err().message);
    if (!r.ok()) break;
    EXPECT_EQ(r->turn, turn);
    tokens += t.tokens.size();
    EXPECT_EQ(r->n_tokens, tokens);
  }
  return tokens;
}

// Everything a checkpoint at `n_turns` should hold, regenerated from the seed.
void expect_checkpoint_matches(const checkpoint_data& cp, uint64_t seed, const std::vector<uint32_t>& sizes,
                               uint32_t n_turns) {
  ASSERT_EQ(cp.checkpoint.n_turns, n_turns);
  std::vector<int32_t> tokens;
  std::vector<item_write> items;
  uint64_t n = 0;
  for (uint32_t t = 0; t < n_turns; ++t) {
    auto st = make_turn(seed, t, n, sizes[t % sizes.size()]);
    tokens.insert(tokens.end(), st.tokens.begin(), st.tokens.end());
    items.insert(items.end(), st.items.begin(), st.items.end());
    n += st.tokens.size();
  }
  EXPECT_EQ(cp.checkpoint.n_tokens, n);
  EXPECT_EQ(cp.tokens, tokens);
  ASSERT_EQ(cp.transcript.size(), items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    EXPECT_EQ(cp.transcript[i].payload, items[i].payload);
    EXPECT_EQ(cp.transcript[i].kind, items[i].kind);
    EXPECT_EQ(cp.transcript[i].token_begin, items[i].token_begin);
    EXPECT_EQ(cp.transcript[i].token_end, items[i].token_end);
  }
  ASSERT_EQ(cp.sources.size(), 4u);
  for (int s = 0; s < 4; ++s) {
    const loaded_source& src = cp.sources[s];
    EXPECT_EQ(src.source_layer, test::source_layers[s]);
    EXPECT_EQ(src.n_entries, test::entries_at(n, test::source_ratio[s]));
    std::vector<uint8_t> main, index;
    for (const loaded_page& p : src.pages) {
      ASSERT_EQ(p.status, page_status::ok) << p.detail;
      main.insert(main.end(), p.main().begin(), p.main().end());
      index.insert(index.end(), p.index().begin(), p.index().end());
    }
    // Page boundaries are the writer's, content is what a single page over [0, E) would hold.
    EXPECT_EQ(main, test::entry_bytes(seed, src.source_layer, 0, static_cast<uint32_t>(src.n_entries), 288, 0));
    EXPECT_EQ(index, test::entry_bytes(seed, src.source_layer, 0, static_cast<uint32_t>(src.n_entries), 68, 1));
  }
  ASSERT_EQ(cp.aux.size(), 2u);
  auto last = make_turn(seed, n_turns - 1, n - sizes[(n_turns - 1) % sizes.size()],
                        sizes[(n_turns - 1) % sizes.size()]);
  EXPECT_EQ(cp.aux[0].name, "compressor.pending");
  EXPECT_EQ(cp.aux[0].bytes, last.aux_bytes[0]);
  EXPECT_EQ(cp.aux[1].name, "engram.history");
  EXPECT_EQ(cp.aux[1].bytes, last.aux_bytes[1]);
  EXPECT_TRUE(cp.aux_errors.empty());
}

const std::vector<uint32_t> default_sizes = {100, 37, 255, 3, 64};

TEST(store, new_file_has_wal_schema_version_and_foreign_keys) {
  test::temp_dir dir;
  const std::string path = dir.file("s.db");
  { auto st = open_store(path); ASSERT_TRUE(st); }
  EXPECT_EQ(test::raw_int(path, "PRAGMA user_version"), 3);
  EXPECT_EQ(test::raw_int(path, "PRAGMA application_id"), 0x43454452);
  EXPECT_EQ(test::raw_int(path, "PRAGMA page_size"), 4096);
  EXPECT_EQ(test::raw_int(path, "SELECT COUNT(*) FROM sqlite_schema WHERE type='table'"), 10);
  // The page file beside it: only its 64-byte header, whose id the database records.
  EXPECT_EQ(test::size_of(path + ".kvpages"), page_file_header_bytes);
  auto id = page_file::read_id(path + ".kvpages");
  ASSERT_TRUE(id.ok()) << id.err().message;
  EXPECT_EQ(uint64_t(test::raw_int(path, "SELECT file_id FROM page_file")), *id);
  EXPECT_EQ(test::raw_int(path, "SELECT COUNT(*) FROM sqlite_schema WHERE type='trigger'"), 4);
  // journal_mode=WAL is persistent in the file.
  sqlite3* h = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &h), SQLITE_OK);
  sqlite3_stmt* s = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(h, "PRAGMA journal_mode", -1, &s, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_step(s), SQLITE_ROW);
  EXPECT_STREQ(reinterpret_cast<const char*>(sqlite3_column_text(s, 0)), "wal");
  sqlite3_finalize(s);
  sqlite3_close(h);
}

TEST(store, turns_round_trip_through_a_reopen) {
  test::temp_dir dir;
  const std::string path = dir.file("s.db");
  session_id id = 0;
  {
    auto st = open_store(path);
    auto r = st->create_session(model, "coder", official_geometry);
    ASSERT_TRUE(r.ok());
    id = *r;
    commit_turns(*st, id, 42, 7);
    ASSERT_TRUE(st->check_invariants(id).ok()) << st->check_invariants(id).err().message;
  }
  auto st = open_store(path);
  auto info = st->get_session(id);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->model_hash, model);
  EXPECT_EQ(info->agent, "coder");
  EXPECT_EQ(info->status, session_status::active);
  EXPECT_EQ(info->n_turns, 7u);
  EXPECT_EQ(info->geometry, official_geometry);
  auto cp = st->load_checkpoint(id);
  ASSERT_TRUE(cp.ok()) << cp.err().message;
  EXPECT_TRUE(cp->all_pages_ok());
  expect_checkpoint_matches(*cp, 42, default_sizes, 7);
  EXPECT_TRUE(st->check_invariants(id).ok());
}

TEST(store, load_at_or_before_picks_the_earlier_checkpoint_and_its_pages) {
  test::temp_dir dir;
  auto st = open_store(dir.file("s.db"));
  const session_id id = *st->create_session(model, "a", official_geometry);
  commit_turns(*st, id, 5, 5);
  auto cps = st->checkpoints(id);
  ASSERT_TRUE(cps.ok());
  ASSERT_EQ(cps->size(), 5u);
  // Between checkpoints 2 and 3 (in tokens): checkpoint 2 is the answer.
  const uint64_t between = ((*cps)[1].n_tokens + (*cps)[2].n_tokens) / 2;
  ASSERT_LT((*cps)[1].n_tokens, between);
  auto cp = st->load_checkpoint(id, between);
  ASSERT_TRUE(cp.ok()) << cp.err().message;
  expect_checkpoint_matches(*cp, 5, default_sizes, 2);
  // Exactly at a checkpoint's position: that checkpoint.
  auto exact = st->load_checkpoint(id, (*cps)[3].n_tokens);
  ASSERT_TRUE(exact.ok());
  EXPECT_EQ(exact->checkpoint.n_turns, 4u);
  // Before the first: not found, with the position in the message.
  auto none = st->load_checkpoint(id, (*cps)[0].n_tokens - 1);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.err().code, errc::not_found);
  // Without pages: the reprefill path reads tokens and transcript only.
  load_options lo;
  lo.with_pages = false;
  auto light = st->load_checkpoint(id, UINT64_MAX, lo);
  ASSERT_TRUE(light.ok());
  EXPECT_EQ(light->tokens.size(), (*cps)[4].n_tokens);
  for (const auto& s : light->sources) EXPECT_TRUE(s.pages.empty());
}

TEST(store, pages_are_appended_to_the_page_file_and_rows_point_at_them) {
  test::temp_dir dir;
  auto st = open_store(dir.file("p.db"));
  const session_id id = *st->create_session(model, "a", official_geometry);
  const std::vector<uint32_t> sizes = {700, 333, 2, 901};
  commit_turns(*st, id, 9, 4, sizes);
  // The database holds no page bytes; the file holds every page back to back after its header.
  EXPECT_EQ(test::raw_int(st->path(), "SELECT SUM(length(bytes)) FROM kv_pages"), 0);
  auto refs = st->page_refs(id);
  ASSERT_TRUE(refs.ok());
  ASSERT_EQ(refs->size(), 16u);
  uint64_t total = 0;
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (const auto& r : *refs) {
    auto loc = st->locate_page(r.page_row);
    ASSERT_TRUE(loc.ok()) << loc.err().message;
    EXPECT_EQ(loc->path, st->page_file_path());
    EXPECT_EQ(loc->bytes, page_header_bytes + uint64_t{r.n_entries} * official_geometry.entry_bytes());
    // The bytes at that offset are the page: header fields and payload as written.
    auto bytes = test::read_at(loc->path, loc->offset, loc->bytes);
    auto c = verify_page(bytes, model, r.source_layer, r.first_entry, r.n_entries, official_geometry);
    EXPECT_EQ(c.status, page_status::ok) << c.detail;
    spans.push_back({loc->offset, loc->bytes});
    total += loc->bytes;
  }
  std::sort(spans.begin(), spans.end());
  EXPECT_EQ(spans.front().first, page_file_header_bytes);
  for (size_t i = 1; i < spans.size(); ++i) EXPECT_EQ(spans[i].first, spans[i - 1].first + spans[i - 1].second);
  EXPECT_EQ(test::size_of(st->page_file_path()), page_file_header_bytes + total);
  auto stats = st->page_stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->live_bytes, total);
  EXPECT_EQ(stats->dead_bytes, 0u);
  EXPECT_EQ(stats->n_pages, 16u);
  auto cp = st->load_checkpoint(id);
  ASSERT_TRUE(cp.ok());
  expect_checkpoint_matches(*cp, 9, sizes, 4);
  EXPECT_TRUE(st->check_invariants(id).ok()) << st->check_invariants(id).err().message;
  EXPECT_EQ(st->locate_page(12345).err().code, errc::not_found);
}

// Tool results are committed as a turn of their own with no tokens before the next
// generation; a resume from that checkpoint must still find the aux state (else it cannot
// replay and falls back to re-prefilling).
TEST(store, a_turn_without_tokens_carries_the_previous_aux_state) {
  test::temp_dir dir;
  auto st = open_store(dir.file("s.db"));
  const session_id id = *st->create_session(model, "a", official_geometry);
  auto t0 = make_turn(5, 0, 0, 40);
  ASSERT_TRUE(st->commit_turn(id, t0.write()).ok());
  turn_write results;  // items only: the tool results of turn 0's calls
  const std::string payload = "{\"name\":\"calculator\",\"result\":\"42\"}";
  results.items.push_back({item_kind::tool_result, payload, 40, 40});
  ASSERT_TRUE(st->commit_turn(id, results).ok());
  auto cp = st->load_checkpoint(id);
  ASSERT_TRUE(cp.ok()) << cp.err().message;
  EXPECT_EQ(cp->checkpoint.n_turns, 2u);
  EXPECT_EQ(cp->checkpoint.n_tokens, 40u);
  ASSERT_EQ(cp->aux.size(), 2u);
  EXPECT_EQ(cp->aux[0].bytes, t0.aux_bytes[0]);
  EXPECT_EQ(cp->aux[1].bytes, t0.aux_bytes[1]);
  EXPECT_TRUE(cp->aux_errors.empty());
  // A later turn with tokens writes its own aux, not a copy.
  auto t2 = make_turn(5, 2, 40, 20);
  ASSERT_TRUE(st->commit_turn(id, t2.write()).ok());
  cp = st->load_checkpoint(id);
  ASSERT_TRUE(cp.ok());
  ASSERT_EQ(cp->aux.size(), 2u);
  EXPECT_EQ(cp->aux[0].bytes, t2.aux_bytes[0]);
  EXPECT_TRUE(st->check_invariants(id).ok());
}

// Resume hints ("hint.*" aux blobs) are a cache: the store keeps them for the latest
// checkpoint only, so a long session does not pay for them turn after turn; other aux state is
// kept per checkpoint. A fork keeps the hint of the checkpoint it forks at, if it is there.
TEST(store, resume_hints_are_kept_for_the_latest_checkpoint_only) {
  test::temp_dir dir;
  auto st = open_store(dir.file("s.db"));
  const session_id id = *st->create_session(model, "a", official_geometry);
  std::vector<std::vector<uint8_t>> hints;
  uint64_t n = 0;
  for (uint32_t turn = 0; turn < 4; ++turn) {
    auto t = make_turn(11, turn, n, 30);
    hints.push_back(std::vector<uint8_t>(100 + turn, uint8_t(turn + 1)));
    t.aux.push_back({"hint.selections", hints.back()});
    ASSERT_TRUE(st->commit_turn(id, t.write()).ok());
    n += 30;
    EXPECT_EQ(test::raw_int(st->path(), "SELECT COUNT(*) FROM checkpoint_aux WHERE name='hint.selections'"), 1)
        << "after turn " << turn;
    EXPECT_EQ(test::raw_int(st->path(), "SELECT MAX(n_turns) FROM checkpoint_aux WHERE name='hint.selections'"),
              int64_t(turn) + 1);
    EXPECT_EQ(test::raw_int(st->path(), "SELECT COUNT(*) FROM checkpoint_aux WHERE name='engram.history'"),
              int64_t(turn) + 1);
  }
  EXPECT_TRUE(st->check_invariants(id).ok()) << st->check_invariants(id).err().message;
  auto cp = st->load_checkpoint(id);
  ASSERT_TRUE(cp.ok()) << cp.err().message;
  ASSERT_EQ(cp->aux.size(), 3u);
  EXPECT_EQ(cp->aux[2].name, "hint.selections");
  EXPECT_EQ(cp->aux[2].bytes, hints.back());
  // an earlier checkpoint: its state, without a hint
  cp = st->load_checkpoint(id, 60);
  ASSERT_TRUE(cp.ok()) << cp.err().message;
  EXPECT_EQ(cp->checkpoint.n_tokens, 60u);
  ASSERT_EQ(cp->aux.size(), 2u);
  EXPECT_EQ(cp->aux[0].name, "compressor.pending");
  EXPECT_TRUE(aux_is_hint("hint.selections"));
  EXPECT_FALSE(aux_is_hint("engram.history"));
}

TEST(store, status_follows_the_state_diagram) {
  test::temp_dir dir;
  auto st = open_store(dir.file("s.db"));
  const session_id id = *st->create_session(model, "a", official_geometry);
  EXPECT_EQ(st->get_session(id)->status, session_status::created);
  auto t0 = make_turn(1, 0, 0, 10);
  t0.status_after = session_status::waiting_tool;
  ASSERT_TRUE(st->commit_turn(id, t0.write()).ok());
  EXPECT_EQ(st->get_session(id)->status, session_status::waiting_tool);
  auto t1 = make_turn(1, 1, 10, 10);
  t1.status_after = session_status::active;
  ASSERT_TRUE(st->commit_turn(id, t1.write()).ok());
  EXPECT_EQ(st->get_session(id)->status, session_status::active);
  // A turn cannot go back to an initial state or to cancelled (that is finish_session's).
  auto t2 = make_turn(1, 2, 20, 10);
  t2.status_after = session_status::created;
  EXPECT_EQ(st->commit_turn(id, t2.write()).err().code, errc::invalid_argument);
  // finish_session only takes final states.
  EXPECT_EQ(st->finish_session(id, session_status::active).err().code, errc::invalid_argument);
  ASSERT_TRUE(st->finish_session(id, session_status::cancelled).ok());
  EXPECT_EQ(st->get_session(id)->status, session_status::cancelled);
  // Terminal: no more turns, no second finish.
  t2.status_after = session_status::active;
  auto refused = st->commit_turn(id, t2.write());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.err().code, errc::mismatch);
  EXPECT_NE(refused.err().message.find("cancelled"), std::string::npos);
  EXPECT_FALSE(st->finish_session(id, session_status::done).ok());
  EXPECT_EQ(st->get_session(id)->n_turns, 2u);
  // A turn can end the session directly.
  const session_id id2 = *st->create_session(model, "b", official_geometry);
  auto d = make_turn(2, 0, 0, 5);
  d.status_after = session_status::done;
  ASSERT_TRUE(st->commit_turn(id2, d.write()).ok());
  EXPECT_EQ(st->get_session(id2)->status, session_status::done);
  EXPECT_TRUE(st->check_invariants(id).ok());
  EXPECT_TRUE(st->check_invariants(id2).ok());
}

TEST(store, bad_turns_are_refused_and_leave_nothing_behind) {
  test::temp_dir dir;
  auto st = open_store(dir.file("s.db"));
  const session_id id = *st->create_session(model, "a", official_geometry);
  commit_turns(*st, id, 3, 2);
  const auto before = *st->get_session(id);
  const uint64_t page_bytes_before = test::size_of(st->page_file_path());

  auto expect_refused = [&](const turn_write& w, const char* needle) {
    auto r = st->commit_turn(id, w);
    ASSERT_FALSE(r.ok()) << needle;
    EXPECT_EQ(r.err().code, errc::invalid_argument);
    EXPECT_NE(r.err().message.find(needle), std::string::npos) << r.err().message;
  };
  {  // a gap in a source's entries
    auto t = make_turn(3, 2, before.n_tokens, 50);
    t.pages[1].first_entry += 1;
    expect_refused(t.write(), "contiguous");
  }
  {  // a page whose byte count does not match its entry count
    auto t = make_turn(3, 2, before.n_tokens, 50);
    t.pages[3].n_entries += 1;
    expect_refused(t.write(), "needs");
  }
  {  // a payload that is not JSON
    auto t = make_turn(3, 2, before.n_tokens, 50);
    t.items[0].payload = "{\"text\": unterminated";
    expect_refused(t.write(), "not valid JSON");
  }
  {  // an item range past the token log
    auto t = make_turn(3, 2, before.n_tokens, 50);
    t.items[1].token_end = before.n_tokens + 51;
    expect_refused(t.write(), "outside the token log");
  }
  {  // the same aux name twice: the SQL constraint fires mid-transaction; all rolled back
    auto t = make_turn(3, 2, before.n_tokens, 50);
    t.aux[1].name = t.aux[0].name;
    auto r = st->commit_turn(id, t.write());
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.err().message.find("duplicate aux name"), std::string::npos) << r.err().message;
  }
  EXPECT_FALSE(st->commit_turn(id + 100, make_turn(3, 0, 0, 5).write()).ok());
  const auto after = *st->get_session(id);
  EXPECT_EQ(after.n_turns, before.n_turns);
  EXPECT_EQ(after.n_tokens, before.n_tokens);
  EXPECT_EQ(st->transcript(id)->size(), 4u);
  EXPECT_EQ(test::raw_int(st->path(), "SELECT COUNT(*) FROM kv_pages"), 8);
  // Refused turns left no bytes in the page file either (the duplicate-aux one had written its
  // pages before the constraint fired: they were cut off again).
  EXPECT_EQ(test::size_of(st->page_file_path()), page_bytes_before);
  // History cannot be rewritten even through SQL (invariant 1).
  EXPECT_EQ(test::raw_exec(st->path(), "UPDATE transcript_items SET payload='{}' WHERE seq=0"),
            SQLITE_CONSTRAINT);
  EXPECT_EQ(test::raw_exec(st->path(), "UPDATE checkpoints SET n_tokens=0"), SQLITE_CONSTRAINT);
  EXPECT_EQ(st->transcript(id)->front().payload, make_turn(3, 0, 0, 100).items[0].payload);
  EXPECT_TRUE(st->check_invariants(id).ok());
  // The session still takes the right turn afterwards.
  auto good = make_turn(3, 2, before.n_tokens, 50);
  ASSERT_TRUE(st->commit_turn(id, good.write()).ok());
  expect_checkpoint_matches(*st->load_checkpoint(id), 3, {100, 37, 50}, 3);
}

TEST(store, fork_shares_pages_and_survives_the_parent) {
  test::temp_dir dir;
  auto st = open_store(dir.file("s.db"));
  const session_id parent = *st->create_session(model, "planner", official_geometry);
  commit_turns(*st, parent, 11, 4);
  const int64_t pages_before = test::raw_int(st->path(), "SELECT COUNT(*) FROM kv_pages");
  EXPECT_EQ(pages_before, 16);
  const uint64_t page_file_bytes_before = test::size_of(st->page_file_path());

  auto child_r = st->fork_session(parent, 2);
  ASSERT_TRUE(child_r.ok()) << child_r.err().message;
  const session_id child = *child_r;
  auto ci = *st->get_session(child);
  EXPECT_EQ(ci.status, session_status::forked);
  EXPECT_EQ(ci.parent, parent);
  EXPECT_EQ(ci.fork_turns, 2u);
  EXPECT_EQ(ci.n_turns, 2u);
  EXPECT_EQ(ci.agent, "planner");
  // No page bytes copied: the child's refs point at the parent's rows.
  EXPECT_EQ(test::raw_int(st->path(), "SELECT COUNT(*) FROM kv_pages"), pages_before);
  EXPECT_EQ(st->page_stats()->live_bytes, page_file_bytes_before - page_file_header_bytes);
  EXPECT_EQ(test::size_of(st->page_file_path()), page_file_bytes_before);
  auto pr = *st->page_refs(parent);
  auto cr = *st->page_refs(child);
  ASSERT_EQ(cr.size(), 8u);
  for (const auto& c : cr) {
    auto same = std::find_if(pr.begin(), pr.end(), [&](const auto& p) {
      return p.page_row == c.page_row && p.source_layer == c.source_layer && p.first_entry == c.first_entry;
    });
    EXPECT_NE(same, pr.end());
  }
  expect_checkpoint_matches(*st->load_checkpoint(child), 11, default_sizes, 2);

  // The child goes its own way (different content, seed 12) from turn 2 on.
  auto info = *st->get_session(child);
  auto t = make_turn(12, 2, info.n_tokens, 77);
  // Pages of seed 12 continue the child's entries: contiguity is positional, not by content.
  ASSERT_TRUE(st->commit_turn(child, t.write()).ok());
  EXPECT_EQ(st->get_session(child)->status, session_status::active);
  EXPECT_EQ(st->get_session(parent)->n_turns, 4u);
  expect_checkpoint_matches(*st->load_checkpoint(parent), 11, default_sizes, 4);

  // Removing the parent keeps the child whole.
  ASSERT_TRUE(st->remove_session(parent).ok());
  EXPECT_EQ(st->get_session(parent).err().code, errc::not_found);
  auto ci2 = *st->get_session(child);
  EXPECT_FALSE(ci2.parent.has_value());
  auto cp = st->load_checkpoint(child, ci.n_tokens);
  ASSERT_TRUE(cp.ok());
  EXPECT_TRUE(cp->all_pages_ok());
  expect_checkpoint_matches(*cp, 11, default_sizes, 2);
  auto latest = st->load_checkpoint(child);
  ASSERT_TRUE(latest.ok());
  EXPECT_TRUE(latest->all_pages_ok());
  EXPECT_EQ(latest->checkpoint.n_turns, 3u);
  // The parent's unshared pages (turns 2, 3) are gone; shared ones + the child's stay.
  EXPECT_EQ(test::raw_int(st->path(), "SELECT COUNT(*) FROM kv_pages"), 8 + 4);
  EXPECT_TRUE(st->check_invariants(child).ok()) << st->check_invariants(child).err().message;
  ASSERT_TRUE(st->remove_session(child).ok());
  EXPECT_EQ(test::raw_int(st->path(), "SELECT COUNT(*) FROM kv_pages"), 0);
  EXPECT_EQ(test::raw_int(st->path(), "SELECT COUNT(*) FROM token_chunks"), 0);
  EXPECT_EQ(test::raw_int(st->path(), "SELECT COUNT(*) FROM checkpoint_aux"), 0);
}

TEST(store, fork_bounds_and_chains) {
  test::temp_dir dir;
  auto st = open_store(dir.file("s.db"));
  const session_id a = *st->create_session(model, "a", official_geometry);
  commit_turns(*st, a, 1, 3);
  EXPECT_EQ(st->fork_session(a, 4).err().code, errc::invalid_argument);
  EXPECT_EQ(st->fork_session(a + 50, 1).err().code, errc::not_found);
  auto empty = st->fork_session(a, 0, "fresh");
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(st->get_session(*empty)->n_tokens, 0u);
  EXPECT_EQ(st->load_checkpoint(*empty).err().code, errc::not_found);
  // A fork of a fork, then remove the middle one.
  const session_id b = *st->fork_session(a, 3);
  commit_turns(*st, b, 1, 1);  // same seed: b continues a's content
  const session_id c = *st->fork_session(b, 4);
  ASSERT_TRUE(st->remove_session(b).ok());
  ASSERT_TRUE(st->remove_session(a).ok());
  auto cp = st->load_checkpoint(c);
  ASSERT_TRUE(cp.ok());
  expect_checkpoint_matches(*cp, 1, default_sizes, 4);
  auto list = *st->list_sessions();
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0].id, *empty);
  EXPECT_EQ(list[1].id, c);
  EXPECT_TRUE(st->check_invariants(c).ok());
}

TEST(store, storage_grows_with_new_tokens_only) {
  // Each turn adds its own bytes: the file growth of turn k does not depend on k.
  test::temp_dir dir;
  auto st = open_store(dir.file("s.db"));
  const session_id id = *st->create_session(model, "a", official_geometry);
  std::vector<uint64_t> growth;
  uint64_t n = 0;
  for (uint32_t t = 0; t < 12; ++t) {
    ASSERT_TRUE(st->checkpoint_wal().ok());
    const uint64_t before = st->file_bytes();
    auto turn = make_turn(4, t, n, 512);
    ASSERT_TRUE(st->commit_turn(id, turn.write()).ok());
    n += 512;
    ASSERT_TRUE(st->checkpoint_wal().ok());
    growth.push_back(st->file_bytes() - before);
  }
  const uint64_t payload = 512 * 890;
  uint64_t first_half = 0, second_half = 0;
  for (int i = 2; i < 7; ++i) first_half += growth[i];
  for (int i = 7; i < 12; ++i) second_half += growth[i];
  // Linear growth: late turns cost what early turns cost (quadratic would double it).
  EXPECT_LT(second_half, first_half * 5 / 4);
  EXPECT_GT(second_half, 5 * payload);
}

}  // namespace
}  // namespace cedar::sessions
