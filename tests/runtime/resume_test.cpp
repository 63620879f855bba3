// Resume paths of the executor (issue 4, executor side): executor_core driven directly together
// with a real sessions::store on a temp file. Each turn's KV delta is committed exactly as the
// store actor does it (runtime/actors.cpp: pages from the kv deltas, the aux blobs, the tokens),
// then the session is resumed:
//   resident     the sequence is still in RAM;
//   replayed     after drop(): pages + aux from the store, encoder bounded replay of n_win;
//   reprefilled  a page's bytes flipped in the SQLite file, a page row gone, or a page written
//                by another model: the whole token log is prefilled again, which must give
//                exactly the state (and logits) of a full recompute, and lose no committed item.
// The last test measures and prints what bounded replay changes on the shipped default model:
// top-1 agreement and max |logit difference| of the next 64 tokens against an exact resume.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "model/forward.hpp"
#include "model/model_dir.hpp"
#include "model/sampler.hpp"
#include "runtime/executor_core.hpp"
#include "runtime_test_util.hpp"
#include "sessions/page_format.hpp"
#include "sessions/store.hpp"

using namespace cedar;
using runtime::resume_path;

namespace {

constexpr uint64_t kModelHash = 0xC3D4'0000'0000'0041ull;

// One executor + one store, as the runtime wires them (api.cpp), without actors.
struct rig {
  std::shared_ptr<const model::engine> eng;
  runtime::executor_core core;
  std::unique_ptr<sessions::store> st;
  sessions::page_geometry geom;
  // What was committed per session, in order, to check that nothing is ever lost.
  std::map<int64_t, std::vector<std::string>> payloads;
  std::map<int64_t, std::vector<int32_t>> log;

  rig(std::shared_ptr<const model::engine> e, const std::string& path)
      : eng(std::move(e)), core(*eng, size_t(1) << 30) {
    auto s = sessions::store::open(path);
    EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.err().message);
    if (s.ok()) st = std::move(*s);
    model::sequence probe(eng->config());
    geom.main_dims = uint16_t(eng->config().head_dim);
    geom.index_dims = uint16_t(eng->config().index_head_dim);
    geom.main_entry_bytes = uint32_t(probe.main_entry_bytes());
    geom.index_entry_bytes = uint32_t(probe.index_entry_bytes());
  }

  int64_t new_session() {
    auto id = st->create_session(kModelHash, "resume-test", geom);
    EXPECT_TRUE(id.ok()) << (id.ok() ? "" : id.err().message);
    core.open_fresh(*id);
    return *id;
  }

  // One turn: prefill `prompt`, greedy-decode up to max_new tokens, return the finished turn.
  runtime::finished_generation run_turn(int64_t id, const std::vector<int32_t>& prompt, int max_new,
                                        resume_path path, double resume_ms = 0) {
    runtime::generation_params p;
    p.max_new_tokens = max_new;
    auto t = core.start(id, prompt, p, path, resume_ms);
    EXPECT_TRUE(t.ok()) << (t.ok() ? "" : t.err().message);
    for (int i = 0; i < max_new + 2 && core.active(id); ++i) {
      auto s = core.step();
      EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.err().message);
    }
    auto fin = core.take_finished();
    EXPECT_EQ(fin.size(), 1u);
    return fin.empty() ? runtime::finished_generation{} : std::move(fin.front());
  }

  // Commits a turn the way the store actor does (actors.cpp, commit_atom): the user item covers
  // the prompt, the assistant item the generated tokens.
  void commit(const runtime::finished_generation& f, size_t n_prompt) {
    const runtime::turn_kv& kv = f.kv;
    sessions::turn_write t;
    const uint64_t b = kv.first_token, e = kv.first_token + kv.tokens.size();
    const int k = int(payloads[f.session].size());
    std::vector<std::string> pl = {"{\"item\":" + std::to_string(k) + ",\"role\":\"user\"}",
                                   "{\"item\":" + std::to_string(k + 1) + ",\"role\":\"assistant\"}"};
    t.items.push_back({sessions::item_kind::user, pl[0], b, b + n_prompt});
    t.items.push_back({sessions::item_kind::assistant, pl[1], b + n_prompt, e});
    t.tokens = kv.tokens;
    for (const auto& s : kv.sources) t.pages.push_back({s.layer, s.first_entry, s.n_entries, s.main, s.index});
    for (const auto& a : kv.aux) t.aux.push_back({a.first, a.second});
    t.status_after = sessions::session_status::waiting_tool;
    auto rec = st->commit_turn(f.session, t);
    ASSERT_TRUE(rec.ok()) << rec.err().message;
    payloads[f.session].insert(payloads[f.session].end(), pl.begin(), pl.end());
    auto& L = log[f.session];
    EXPECT_EQ(L.size(), kv.first_token) << "turn deltas must be contiguous in the token log";
    L.insert(L.end(), kv.tokens.begin(), kv.tokens.end());
  }

  runtime::resume_state load(int64_t id) {
    auto cp = st->load_checkpoint(id);
    EXPECT_TRUE(cp.ok()) << (cp.ok() ? "" : cp.err().message);
    return cp.ok() ? runtime::resume_state_from(*cp) : runtime::resume_state{};
  }

  // Every committed item and token is still in the store, in order.
  void expect_nothing_lost(int64_t id) {
    auto tr = st->transcript(id);
    ASSERT_TRUE(tr.ok()) << tr.err().message;
    std::vector<std::string> got;
    for (const auto& i : *tr) got.push_back(i.payload);
    EXPECT_EQ(got, payloads[id]);
    auto toks = st->tokens(id);
    ASSERT_TRUE(toks.ok()) << toks.err().message;
    EXPECT_EQ(*toks, log[id]);
  }
};

std::vector<int32_t> text_ids(const model::tokenizer& tok, const std::string& text) {
  auto ids = tok.encode(text);
  EXPECT_TRUE(ids.ok());
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

// Runs the bytes of kv page `page_row` through `edit` in place in the store's page file
// (<db>.kvpages), as a disk fault or another process would.
template <class F>
void edit_page_blob(const std::string& path, int64_t page_row, F edit) {
  sqlite3* h = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &h), SQLITE_OK);
  sqlite3_stmt* s = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(h, "SELECT file_offset, file_bytes FROM kv_pages WHERE id=?", -1, &s, nullptr),
            SQLITE_OK) << sqlite3_errmsg(h);
  sqlite3_bind_int64(s, 1, page_row);
  const bool found = sqlite3_step(s) == SQLITE_ROW;
  const off_t offset = found ? off_t(sqlite3_column_int64(s, 0)) : 0;
  std::vector<uint8_t> bytes(found ? size_t(sqlite3_column_int64(s, 1)) : 0);
  sqlite3_finalize(s);
  sqlite3_close(h);
  ASSERT_TRUE(found) << "no kv_pages row " << page_row;
  const int fd = ::open((path + ".kvpages").c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::pread(fd, bytes.data(), bytes.size(), offset), ssize_t(bytes.size()));
  edit(bytes);
  ASSERT_EQ(::pwrite(fd, bytes.data(), bytes.size(), offset), ssize_t(bytes.size()));
  ::close(fd);
}

void exec_sql(const std::string& path, const std::string& sql) {
  sqlite3* h = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &h), SQLITE_OK);
  sqlite3_busy_timeout(h, 5000);
  char* err = nullptr;
  EXPECT_EQ(sqlite3_exec(h, sql.c_str(), nullptr, nullptr, &err), SQLITE_OK) << (err ? err : "");
  sqlite3_free(err);
  sqlite3_close(h);
}

// The resident state of `id` equals a full recompute (a fresh sequence prefilled with the whole
// token log), byte for byte, and both give exactly the same logits for `probe`.
void expect_exact_recompute(const rig& r, int64_t id, const std::vector<int32_t>& log,
                            const std::vector<int32_t>& probe) {
  const model::sequence* s = r.core.sequence_of(id);
  ASSERT_NE(s, nullptr);
  model::sequence a = *s;
  model::sequence b(r.eng->config());
  model::runner run(*r.eng);
  model::prefill_options opt;
  opt.mode = model::prefill_mode::ced;
  ASSERT_TRUE(run.prefill(b, log, opt).ok());
  ASSERT_EQ(a.tokens(), b.tokens());
  for (int i = 0; i < a.n_sources(); ++i) {
    EXPECT_EQ(a.source(i).main, b.source(i).main) << "source " << i;
    EXPECT_EQ(a.source(i).index, b.source(i).index) << "source " << i;
    EXPECT_EQ(a.source(i).n_pending, b.source(i).n_pending) << "source " << i;
  }
  EXPECT_EQ(a.ngram_history(), b.ngram_history());
  opt.all_logits = true;
  auto la = run.prefill(a, probe, opt);
  auto lb = run.prefill(b, probe, opt);
  ASSERT_TRUE(la.ok() && lb.ok());
  ASSERT_EQ(la->n_rows, lb->n_rows);
  EXPECT_GT(la->n_rows, 0);
  EXPECT_TRUE(la->values == lb->values) << "re-prefilled logits differ from a full recompute";
}

// Two committed turns, then the session is dropped from RAM.
int64_t two_turns_then_drop(rig& r, const model::tokenizer& tok) {
  const int64_t id = r.new_session();
  auto p1 = text_ids(tok, "You are a careful agent. Read the file notes.txt and list its headings, then stop.");
  auto f1 = r.run_turn(id, p1, 8, resume_path::fresh);
  r.commit(f1, p1.size());
  auto p2 = text_ids(tok, "tool result: # Intro\n# Plan\n# Risks\n# Budget\nend of file.");
  auto f2 = r.run_turn(id, p2, 8, resume_path::resident);
  r.commit(f2, p2.size());
  r.core.drop(id);
  EXPECT_FALSE(r.core.resident(id));
  return id;
}

}  // namespace

TEST(Resume, ResidentSessionContinuesInRam) {
  test::temp_dir dir;
  auto tok = test::test_tokenizer();
  rig r(test::random_engine(), dir.file("s.db"));
  ASSERT_TRUE(r.st);
  const int64_t id = r.new_session();
  auto p1 = text_ids(*tok, "Compute 12 * 7 with the calculator.");
  auto f1 = r.run_turn(id, p1, 6, resume_path::fresh);
  EXPECT_EQ(f1.stats.path, resume_path::fresh);
  r.commit(f1, p1.size());
  ASSERT_TRUE(r.core.resident(id));
  const int64_t ctx = r.core.context_of(id);
  EXPECT_EQ(uint64_t(ctx), r.log[id].size());

  auto p2 = text_ids(*tok, "tool result: 84");
  auto f2 = r.run_turn(id, p2, 6, resume_path::resident);
  EXPECT_EQ(f2.stats.path, resume_path::resident);
  EXPECT_EQ(f2.stats.n_replayed, 0);
  EXPECT_EQ(f2.kv.first_token, uint64_t(ctx)) << "a resident turn continues where the last one ended";
  r.commit(f2, p2.size());
  EXPECT_EQ(r.core.context_of(id), int64_t(r.log[id].size()));
  r.expect_nothing_lost(id);
  EXPECT_TRUE(r.st->check_invariants(id).ok());
}

TEST(Resume, ReplayedAfterDropRestoresGlobalKvAndContinues) {
  test::temp_dir dir;
  auto tok = test::test_tokenizer();
  rig r(test::random_engine(), dir.file("s.db"));
  ASSERT_TRUE(r.st);
  const int64_t id = r.new_session();
  auto p1 = text_ids(*tok, "Read the notes and summarise the plan in one line, then wait for the tool.");
  auto f1 = r.run_turn(id, p1, 8, resume_path::fresh);
  r.commit(f1, p1.size());
  const model::sequence before = *r.core.sequence_of(id);
  r.core.drop(id);
  ASSERT_FALSE(r.core.resident(id));

  double ms = -1;
  auto path = r.core.restore(id, r.load(id), &ms);
  ASSERT_TRUE(path.ok()) << path.err().message;
  EXPECT_EQ(*path, resume_path::replayed);
  EXPECT_GE(ms, 0.0);
  const model::sequence* after = r.core.sequence_of(id);
  ASSERT_NE(after, nullptr);
  EXPECT_EQ(after->tokens(), before.tokens());
  for (int i = 0; i < after->n_sources(); ++i) {
    EXPECT_EQ(after->source(i).main, before.source(i).main) << "global KV comes back from the pages unchanged";
    EXPECT_EQ(after->source(i).index, before.source(i).index);
    EXPECT_EQ(after->source(i).n_pending, before.source(i).n_pending);
    EXPECT_EQ(after->source(i).pending_kv, before.source(i).pending_kv);
  }
  EXPECT_EQ(after->ngram_history(), before.ngram_history());

  auto p2 = text_ids(*tok, "tool result: plan is to ship on Friday.");
  auto f2 = r.run_turn(id, p2, 8, *path, ms);
  EXPECT_EQ(f2.stats.path, resume_path::replayed);
  EXPECT_EQ(f2.stats.n_replayed, std::min<int64_t>(r.eng->config().sliding_window, int64_t(r.log[id].size())));
  EXPECT_EQ(f2.kv.first_token, r.log[id].size());
  r.commit(f2, p2.size());

  // A second drop/restore reads pages of both turns, contiguous.
  r.core.drop(id);
  auto path2 = r.core.restore(id, r.load(id));
  ASSERT_TRUE(path2.ok()) << path2.err().message;
  EXPECT_EQ(*path2, resume_path::replayed);
  EXPECT_EQ(r.core.context_of(id), int64_t(r.log[id].size()));
  r.expect_nothing_lost(id);
  EXPECT_TRUE(r.st->check_invariants(id).ok());
}

TEST(Resume, FlippedPageBytesReprefillExactlyAndLoseNothing) {
  test::temp_dir dir;
  auto tok = test::test_tokenizer();
  rig r(test::random_engine(), dir.file("s.db"));
  ASSERT_TRUE(r.st);
  const int64_t id = two_turns_then_drop(r, *tok);
  auto refs = r.st->page_refs(id);
  ASSERT_TRUE(refs.ok() && !refs->empty());
  const auto victim = refs->back();  // a page of the second turn
  edit_page_blob(r.st->path(), victim.page_row, [](std::vector<uint8_t>& b) {
    ASSERT_GT(b.size(), size_t(sessions::page_header_bytes) + 8);
    b[sessions::page_header_bytes + 5] ^= 0x5A;  // inside the payload
  });

  auto rs = r.load(id);
  EXPECT_FALSE(rs.pages_ok);
  EXPECT_NE(rs.problem.find("checksum"), std::string::npos) << rs.problem;
  testing::internal::CaptureStderr();
  auto path = r.core.restore(id, rs);
  const std::string logged = testing::internal::GetCapturedStderr();
  ASSERT_TRUE(path.ok()) << path.err().message;
  EXPECT_EQ(*path, resume_path::reprefilled);
  EXPECT_NE(logged.find("re-prefilling"), std::string::npos) << logged;
  EXPECT_NE(logged.find("checksum"), std::string::npos) << logged;

  auto probe = text_ids(*tok, "tool result: done.");
  expect_exact_recompute(r, id, r.log[id], probe);

  // The session goes on and commits on top of the recovered state.
  auto f3 = r.run_turn(id, probe, 6, *path);
  EXPECT_EQ(f3.stats.path, resume_path::reprefilled);
  EXPECT_EQ(f3.stats.n_replayed, int64_t(r.log[id].size()));
  r.commit(f3, probe.size());
  r.expect_nothing_lost(id);
}

// The resume hints ("hint.selections" aux blob) are optional: damaged or malformed, they are
// reported and the session still takes the replayed path, its rows re-scored.
TEST(Resume, DamagedResumeHintsStillReplayAndLoseNothing) {
  test::temp_dir dir;
  auto tok = test::test_tokenizer();
  rig r(test::random_engine(), dir.file("s.db"));
  ASSERT_TRUE(r.st);
  const int64_t id = two_turns_then_drop(r, *tok);
  {
    auto rs = r.load(id);
    ASSERT_TRUE(rs.pages_ok) << rs.problem;
    auto h = std::find_if(rs.aux.begin(), rs.aux.end(), [](const auto& a) { return a.first == "hint.selections"; });
    ASSERT_NE(h, rs.aux.end());
    // well-formed blob, wrong content: truncated by one byte, then an id no row can see
    for (int variant = 0; variant < 2; ++variant) {
      runtime::resume_state bad = rs;
      auto& b = std::find_if(bad.aux.begin(), bad.aux.end(), [](const auto& a) { return a.first == "hint.selections"; })->second;
      if (variant == 0) b.pop_back();
      else b[b.size() - 1] = 0x7e;  // the last id's delta: +63 past the last visible entry
      testing::internal::CaptureStderr();
      auto path = r.core.restore(id, bad);
      const std::string logged = testing::internal::GetCapturedStderr();
      ASSERT_TRUE(path.ok()) << path.err().message;
      EXPECT_EQ(*path, resume_path::replayed) << "variant " << variant;
      EXPECT_NE(logged.find("resume hints not used"), std::string::npos) << logged;
      EXPECT_NE(logged.find(variant == 0 ? "truncated" : "not an entry the row sees"), std::string::npos) << logged;
      const model::sequence* s = r.core.sequence_of(id);
      ASSERT_NE(s, nullptr);
      EXPECT_EQ(s->selections_from(), s->n_tokens()) << "no hints kept";
      r.core.drop(id);
    }
  }
  // bytes failing their xxh64 in the store: reported by the store, same outcome
  exec_sql(r.st->path(), "UPDATE checkpoint_aux SET xxh64 = xxh64 + 1 WHERE name = 'hint.selections'");
  auto rs = r.load(id);
  EXPECT_TRUE(rs.pages_ok) << rs.problem;
  EXPECT_TRUE(rs.problem.empty()) << rs.problem;
  EXPECT_NE(rs.hints_problem.find("xxh64 mismatch"), std::string::npos) << rs.hints_problem;
  testing::internal::CaptureStderr();
  auto path = r.core.restore(id, rs);
  const std::string logged = testing::internal::GetCapturedStderr();
  ASSERT_TRUE(path.ok()) << path.err().message;
  EXPECT_EQ(*path, resume_path::replayed);
  EXPECT_NE(logged.find("xxh64 mismatch"), std::string::npos) << logged;
  // the session goes on, its next checkpoint carries fresh hints
  auto probe = text_ids(*tok, "tool result: done.");
  auto f3 = r.run_turn(id, probe, 6, *path);
  EXPECT_EQ(f3.stats.path, resume_path::replayed);
  r.commit(f3, probe.size());
  r.expect_nothing_lost(id);
  r.core.drop(id);
  auto rs2 = r.load(id);
  EXPECT_TRUE(rs2.hints_problem.empty()) << rs2.hints_problem;
  auto p2 = r.core.restore(id, rs2);
  ASSERT_TRUE(p2.ok());
  EXPECT_EQ(*p2, resume_path::replayed);
  const model::sequence* s = r.core.sequence_of(id);
  EXPECT_LT(s->selections_from(), s->n_tokens());
}

TEST(Resume, MissingPageReprefillsExactlyAndLosesNothing) {
  test::temp_dir dir;
  auto tok = test::test_tokenizer();
  rig r(test::random_engine(), dir.file("s.db"));
  ASSERT_TRUE(r.st);
  const int64_t id = two_turns_then_drop(r, *tok);
  auto refs = r.st->page_refs(id);
  ASSERT_TRUE(refs.ok() && !refs->empty());
  exec_sql(r.st->path(), "DELETE FROM kv_pages WHERE id=" + std::to_string(refs->front().page_row));

  auto rs = r.load(id);
  EXPECT_FALSE(rs.pages_ok);
  EXPECT_NE(rs.problem.find("missing"), std::string::npos) << rs.problem;
  testing::internal::CaptureStderr();
  auto path = r.core.restore(id, rs);
  const std::string logged = testing::internal::GetCapturedStderr();
  ASSERT_TRUE(path.ok()) << path.err().message;
  EXPECT_EQ(*path, resume_path::reprefilled);
  EXPECT_NE(logged.find("missing"), std::string::npos) << logged;

  auto probe = text_ids(*tok, "tool result: 3 files.");
  expect_exact_recompute(r, id, r.log[id], probe);
  auto f3 = r.run_turn(id, probe, 6, *path);
  r.commit(f3, probe.size());
  r.expect_nothing_lost(id);
}

TEST(Resume, PageOfAnotherModelReprefillsWithALoggedReason) {
  test::temp_dir dir;
  auto tok = test::test_tokenizer();
  rig r(test::random_engine(), dir.file("s.db"));
  ASSERT_TRUE(r.st);
  const int64_t id = two_turns_then_drop(r, *tok);
  auto refs = r.st->page_refs(id);
  ASSERT_TRUE(refs.ok() && !refs->empty());
  // Re-stamp one page as written by another model: a valid header (both checksums right),
  // only the model hash differs.
  edit_page_blob(r.st->path(), refs->front().page_row, [](std::vector<uint8_t>& b) {
    auto d = sessions::decode_page_header(b);
    ASSERT_EQ(d.status, sessions::page_status::ok) << d.detail;
    sessions::page_header h = d.header;
    h.model_hash ^= 0xFFFF;
    sessions::encode_page_header(h, b.data());
    ASSERT_EQ(sessions::decode_page_header(b).status, sessions::page_status::ok);
  });

  auto rs = r.load(id);
  EXPECT_FALSE(rs.pages_ok);
  testing::internal::CaptureStderr();
  auto path = r.core.restore(id, rs);
  const std::string logged = testing::internal::GetCapturedStderr();
  ASSERT_TRUE(path.ok()) << path.err().message;
  EXPECT_EQ(*path, resume_path::reprefilled);
  EXPECT_NE(logged.find("model_mismatch"), std::string::npos) << logged;
  EXPECT_NE(logged.find("session model is"), std::string::npos) << logged;
  std::printf("[resume] logged reason: %s", logged.c_str());

  auto probe = text_ids(*tok, "ok");
  expect_exact_recompute(r, id, r.log[id], probe);
  r.expect_nothing_lost(id);
}

// Not a pass/fail figure: what bounded replay changes against an exact resume (issue 4).
TEST(Resume, ReplayVersusExactNext64Tokens) {
  test::temp_dir dir;
  auto md = model::load_model_dir(test::src("model/weights/cedar-agent-tiny"), /*need_tokenizer=*/true);
  std::shared_ptr<const model::engine> eng;
  std::shared_ptr<const model::tokenizer> tok;
  const char* which = "default-model";
  if (md.ok()) {
    eng = md->eng;
    tok = md->tok;
  } else {
    std::printf("[resume] default model did not load (%s); measuring on the random model\n",
                md.err().message.c_str());
    eng = test::random_engine();
    tok = test::test_tokenizer();
    which = "random tiny-A";
  }
  rig r(eng, dir.file("q.db"));
  ASSERT_TRUE(r.st);
  const int64_t id = r.new_session();
  std::string text =
      "<｜begin▁of▁sentence｜>You are a helpful agent with tools: calculator, notes_save, notes_read, file_read.\n"
      "<｜User｜>I keep my project notes in notes.txt. The project is called Larch. It has three milestones: "
      "design review on March 3, a beta on April 14 and the release on June 2. The budget is 48000 euros, "
      "of which 17500 are already spent on hardware and 6200 on travel. The team is Ada (lead), Bruno "
      "(backend), Chen (frontend) and Dana (testing). Ada wants a weekly status every Friday. Bruno's "
      "database migration is late by nine days. Chen finished the login page and the settings page. Dana "
      "found 23 bugs, 15 of them are fixed. Please read the file, then compute how much budget is left, and "
      "save a note with the remaining budget and the next milestone.<｜Assistant｜></think>";
  auto prompt = text_ids(*tok, text);
  ASSERT_GT(prompt.size(), 200u);
  auto f1 = r.run_turn(id, prompt, 16, resume_path::fresh);
  r.commit(f1, prompt.size());
  r.core.drop(id);
  const int64_t W = eng->config().sliding_window;

  // (a) exact: the whole token log re-prefilled; (b) replayed: pages + bounded replay.
  runtime::resume_state rs = r.load(id);
  ASSERT_TRUE(rs.pages_ok) << rs.problem;
  runtime::resume_state exact_rs;
  exact_rs.tokens = rs.tokens;
  exact_rs.pages_ok = false;
  exact_rs.problem = "exact resume requested by the measurement";
  const int64_t exact_id = id + 1000;
  testing::internal::CaptureStderr();
  auto pe = r.core.restore(exact_id, exact_rs);
  testing::internal::GetCapturedStderr();
  auto pr = r.core.restore(id, rs);
  ASSERT_TRUE(pe.ok() && pr.ok());
  ASSERT_EQ(*pe, resume_path::reprefilled);
  ASSERT_EQ(*pr, resume_path::replayed);
  model::sequence se0 = *r.core.sequence_of(exact_id);
  model::sequence sr0 = *r.core.sequence_of(id);
  // (c) replayed without the resume hints (a checkpoint from before them): the replayed rows
  // re-score their index selections on their truncated-window states.
  runtime::resume_state bare = rs;
  const auto hint = std::find_if(bare.aux.begin(), bare.aux.end(), [](const auto& a) { return a.first == "hint.selections"; });
  ASSERT_NE(hint, bare.aux.end()) << "the checkpoint carries resume hints";
  std::printf("[resume] resume hints: %zu bytes for %d index layers x the last %lld rows\n", hint->second.size(),
              sr0.n_index_layers(), (long long)(sr0.n_tokens() - sr0.selections_from()));
  EXPECT_LT(sr0.selections_from(), sr0.n_tokens());
  bare.aux.erase(hint);
  const int64_t bare_id = id + 2000;
  auto pb = r.core.restore(bare_id, bare);
  ASSERT_TRUE(pb.ok());
  ASSERT_EQ(*pb, resume_path::replayed);
  model::sequence sb0 = *r.core.sequence_of(bare_id);
  EXPECT_EQ(sb0.selections_from(), sb0.n_tokens());

  // A tool result arrives, then 64 next tokens, the exact path's greedy tokens forced into both.
  auto tool = text_ids(*tok, "<｜User｜>tool result: 24300 euros left; next milestone: beta on April 14.<｜Assistant｜>");
  model::runner run(*eng);
  const int V = int(eng->config().vocab_size);
  auto compare = [&](model::sequence se, model::sequence sr, const char* how) {
    model::prefill_options opt;
    auto le = run.prefill(se, tool, opt);
    auto lr = run.prefill(sr, tool, opt);
    ASSERT_TRUE(le.ok() && lr.ok());
    std::vector<float> ve(le->values.end() - V, le->values.end()), vr(lr->values.end() - V, lr->values.end());
    int agree = 0, steps = 0;
    double max_diff = 0, max_abs = 0;
    std::vector<float> lg;
    for (int k = 0; k < 64; ++k) {
      const int te = model::greedy_token(ve.data(), V), tr = model::greedy_token(vr.data(), V);
      agree += te == tr;
      ++steps;
      for (int v = 0; v < V; ++v) {
        ASSERT_TRUE(std::isfinite(ve[size_t(v)]) && std::isfinite(vr[size_t(v)]));
        max_diff = std::max(max_diff, double(std::fabs(ve[size_t(v)] - vr[size_t(v)])));
        max_abs = std::max(max_abs, double(std::fabs(ve[size_t(v)])));
      }
      if (k == 63) break;
      model::sequence* both[1];
      int32_t t1[1] = {te};
      both[0] = &se;
      ASSERT_TRUE(run.decode_step(both, t1, lg).ok());
      ve.assign(lg.begin(), lg.begin() + V);
      both[0] = &sr;
      ASSERT_TRUE(run.decode_step(both, t1, lg).ok());
      vr.assign(lg.begin(), lg.begin() + V);
    }
    EXPECT_EQ(steps, 64);
    EXPECT_GT(max_abs, 0.0);
    std::printf("[resume] replay (%s) vs exact on %s: context %zu tokens, n_win %lld, tool result %zu tokens, "
                "64 next tokens: top-1 agreement %d/64 (%.1f%%), max |logit diff| %.4g (max |logit| %.4g, "
                "rel %.3g)\n",
                how, which, rs.tokens.size(), (long long)W, tool.size(), agree, 100.0 * agree / 64, max_diff, max_abs,
                max_diff / max_abs);
  };
  compare(se0, sr0, "with resume hints");
  compare(se0, sb0, "re-scored, no hints");
}
