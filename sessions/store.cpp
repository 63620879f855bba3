// sessions/store — the session store on SQLite. Design, diagram and invariants first
// (SQLite's pager.c is the model); the code follows in data-flow order: open + schema,
// sessions, commit_turn, fork/remove, loading, invariants. The page file's recovery, migration,
// accounting and compaction are in store_pages.cpp.
//
// ── State of one session ─────────────────────────────────────────────────────────────────
//
//                 create_session()                    commit_turn(status_after=waiting_tool)
//        ∅ ─────────────────────────► CREATED ──┐   ┌───────────────────────────────┐
//                                                │   │                               ▼
//   fork_session(parent, n_turns)                ├──►ACTIVE ◄────────────────── WAITING_TOOL
//        ∅ ─────────────────────────► FORKED ───┘   │     commit_turn(status_after=active)
//          (parent unchanged; pages              │   │                               │
//           shared by reference)      commit_turn│   │commit_turn(done|failed),       │
//                                                    │finish_session(done|failed|     │
//                                                    │               cancelled)       │
//                                                    ▼                               │
//                                       DONE | FAILED | CANCELLED ◄──────────────────┘
//                                       (terminal: commit_turn refused; fork to continue)
//
//   commit_turn from CREATED/FORKED may also go straight to WAITING_TOOL, DONE or FAILED;
//   finish_session works from every non-terminal state. remove_session() takes any state to ∅.
//   fork_session() works from any state, terminal included.
//
// ── What one commit_turn writes ──────────────────────────────────────────────────────────
//
//   BEGIN IMMEDIATE                    (the write lock: also guards the page file's end)
//   <db>.kvpages   +p pages            pwritev of every new page (64-byte header + main +
//                                      index, page_format) at the committed end E, then ONE
//                                      fdatasync; nothing references these bytes yet
//   transcript_items  +k rows   (seq continues, turn = n_turns)
//   token_chunks      +1 row    (the turn's new token ids, int32 LE, xxh64)
//   kv_pages          +p rows   (header fields + file_offset, file_bytes, payload xxh64)
//   session_pages     +p rows   (session, source, first_entry) → kv_pages.id
//   checkpoints       +1 row    (session, n_turns+1, n_tokens)
//   checkpoint_sources+s rows   (entries per source at the checkpoint)
//   checkpoint_aux    +a rows   (named aux state blobs, xxh64; a turn that adds no tokens
//                               carries the previous checkpoint's rows: its state is unchanged)
//                     −h rows   (resume hints, names "hint.*": the session's earlier
//                               checkpoints' blobs of the names this turn writes are deleted)
//   turn_timings      +0/1 row  (time to first token, decode time; when the turn generated)
//   sessions          1 update  (status, n_turns, n_tokens, updated_ms)
//   COMMIT                             (the pages are committed: their rows are visible)
//   on any failure: ROLLBACK and the page file truncated back to E (best effort; open() does it
//   for certain)
//
// ── The page file across crashes ─────────────────────────────────────────────────────────
//
//        commit_turn: pwritev + fdatasync          COMMIT
//   CLEAN ─────────────────────────────► TAIL ───────────► CLEAN   (E moves past the new pages)
//     ▲                                   │ crash / failed turn
//     │ open(): recover_page_file()       ▼
//     └──────────────── truncate to E ◄─ TAIL (bytes past E that no row references)
//
//   E = max(file_offset + file_bytes) over kv_pages rows (64, the header, when there are none).
//   compact_pages(): writes <db>.kvpages-compact (live pages only, a new file_id), fdatasync,
//   COMMIT of the new offsets + file_id, rename over <db>.kvpages. open() renames a leftover
//   -compact file whose id the database already holds, and deletes one it does not.
//
// ── Invariants (checked by check_invariants(); asserted after every write in debug builds) ──
//
//   1. Append-only. Rows of transcript_items, token_chunks, kv_pages, session_pages,
//      checkpoints, checkpoint_sources, checkpoint_aux and turn_timings are never updated; only
//      remove_session() deletes them — and commit_turn deletes resume hints (checkpoint_aux
//      rows named "hint.*", a cache of what replay can recompute) of earlier checkpoints when
//      it writes a newer one of the same name. A turn never rewrites history. (Triggers make an UPDATE
//      of transcript_items, token_chunks, checkpoints or turn_timings fail in the database.)
//      Exception: a page's location (kv_pages.file_offset) moves in compact_pages() and the
//      schema-3 migration, and is cleared when the page file is lost; never its content.
//   2. A turn is atomic: after any crash a session is exactly the state after some committed
//      turn (WAL + one transaction per turn). Readers never see half a turn.
//   3. The token chunks of a session tile [0, sessions.n_tokens) with no gap or overlap, each
//      chunk's blob holds 4·n bytes and matches its xxh64.
//   4. Transcript items have seq 0, 1, 2, … in order, non-decreasing turn < n_turns, and
//      token ranges with begin ≤ end ≤ n_tokens.
//   5. For each (session, source) the session_pages rows tile [0, E) contiguously, and each
//      row agrees with its kv_pages row (source, first_entry, n_entries, model hash).
//   6. There is exactly one checkpoint for each n in [1, n_turns]; the last one is at
//      sessions.n_tokens; checkpoint n_tokens never decrease; each checkpoint's per-source entry
//      count is ≤ E and falls on a page boundary (all its pages were written with it).
//   7. Every kv_pages row is referenced by at least one session_pages row (no orphan pages;
//      a page shared by forks lives until its last session is removed).
//   8. Session status follows the diagram above; terminal sessions receive no turn.
//   9. Page bytes before rows: a kv_pages row commits only after its bytes were written and
//      fdatasync'ed to the page file (commit_turn, compact_pages, the migration). A crash
//      leaves at most unreferenced bytes past the committed end, never a row without bytes.
//  10. Page file extent: kv_pages rows hold file_bytes = 64 + n_entries·entry_bytes at
//      file_offset ≥ 64, do not overlap, and end at or before the committed end E; the file's
//      header id equals page_file.file_id; after open() the file is exactly E bytes long (it
//      is truncated to E under the write lock). A row whose bytes were lost with the page file
//      has file_offset NULL and loads as a missing page.
//   Page bytes (header, model hash, checksum) are not an invariant of the database: disks
//   corrupt them, so load_checkpoint() verifies every page (pread, header, payload xxh64, the
//   row's xxh64) and reports a per-page status.
//
// SWA state is never stored. The token log and transcript are the source of truth; pages are
// a cache of them that the executor can always rebuild by re-prefilling.
#include "sessions/store.hpp"

#include <sys/stat.h>
#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cassert>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

#include "kernels/base/log.hpp"

namespace cedar::sessions {
namespace {

// Schema version written to PRAGMA user_version; application_id marks a cedar store ("CEDR").
constexpr int64_t schema_version = 3;
constexpr int64_t application_id = 0x43454452;

// Migration i takes the schema from version i to i+1. Append, never edit.
const char* const migrations[] = {
    // 0 → 1: the first schema.
    R"sql(
CREATE TABLE sessions(
  id INTEGER PRIMARY KEY,
  model_hash INTEGER NOT NULL,
  agent TEXT NOT NULL,
  status TEXT NOT NULL CHECK (status IN
    ('created','forked','active','waiting_tool','done','failed','cancelled')),
  main_dims INTEGER NOT NULL,
  index_dims INTEGER NOT NULL,
  main_entry_bytes INTEGER NOT NULL,
  index_entry_bytes INTEGER NOT NULL,
  created_ms INTEGER NOT NULL,
  updated_ms INTEGER NOT NULL,
  parent_id INTEGER REFERENCES sessions(id) ON DELETE SET NULL,
  fork_turns INTEGER NOT NULL DEFAULT 0,
  fork_tokens INTEGER NOT NULL DEFAULT 0,
  n_turns INTEGER NOT NULL DEFAULT 0,
  n_tokens INTEGER NOT NULL DEFAULT 0);
CREATE INDEX sessions_by_parent ON sessions(parent_id);

CREATE TABLE transcript_items(
  id INTEGER PRIMARY KEY,
  session_id INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  seq INTEGER NOT NULL,
  turn INTEGER NOT NULL,
  kind TEXT NOT NULL CHECK (kind IN ('system','user','assistant','tool_call','tool_result')),
  payload TEXT NOT NULL,
  token_begin INTEGER NOT NULL,
  token_end INTEGER NOT NULL,
  UNIQUE (session_id, seq));

CREATE TABLE token_chunks(
  id INTEGER PRIMARY KEY,
  session_id INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  token_begin INTEGER NOT NULL,
  n_tokens INTEGER NOT NULL,
  turn INTEGER NOT NULL,
  xxh64 INTEGER NOT NULL,
  ids BLOB NOT NULL,
  UNIQUE (session_id, token_begin));

CREATE TABLE kv_pages(
  id INTEGER PRIMARY KEY,
  model_hash INTEGER NOT NULL,
  source_layer INTEGER NOT NULL,
  first_entry INTEGER NOT NULL,
  n_entries INTEGER NOT NULL,
  bytes BLOB NOT NULL);

CREATE TABLE session_pages(
  session_id INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  source_layer INTEGER NOT NULL,
  first_entry INTEGER NOT NULL,
  n_entries INTEGER NOT NULL,
  turn INTEGER NOT NULL,
  page_id INTEGER NOT NULL REFERENCES kv_pages(id),
  PRIMARY KEY (session_id, source_layer, first_entry)) WITHOUT ROWID;
CREATE INDEX session_pages_by_page ON session_pages(page_id);

CREATE TABLE checkpoints(
  session_id INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  n_turns INTEGER NOT NULL,
  n_tokens INTEGER NOT NULL,
  created_ms INTEGER NOT NULL,
  PRIMARY KEY (session_id, n_turns)) WITHOUT ROWID;

CREATE TABLE checkpoint_sources(
  session_id INTEGER NOT NULL,
  n_turns INTEGER NOT NULL,
  source_layer INTEGER NOT NULL,
  n_entries INTEGER NOT NULL,
  PRIMARY KEY (session_id, n_turns, source_layer),
  FOREIGN KEY (session_id, n_turns) REFERENCES checkpoints(session_id, n_turns)
    ON DELETE CASCADE) WITHOUT ROWID;

CREATE TABLE checkpoint_aux(
  id INTEGER PRIMARY KEY,
  session_id INTEGER NOT NULL,
  n_turns INTEGER NOT NULL,
  name TEXT NOT NULL,
  xxh64 INTEGER NOT NULL,
  bytes BLOB NOT NULL,
  UNIQUE (session_id, n_turns, name),
  FOREIGN KEY (session_id, n_turns) REFERENCES checkpoints(session_id, n_turns)
    ON DELETE CASCADE);

-- Invariant 1 enforced by the database itself: history rows are never updated.
CREATE TRIGGER transcript_items_append_only BEFORE UPDATE ON transcript_items
  BEGIN SELECT RAISE(ABORT, 'transcript_items are append-only'); END;
CREATE TRIGGER token_chunks_append_only BEFORE UPDATE ON token_chunks
  BEGIN SELECT RAISE(ABORT, 'token_chunks are append-only'); END;
CREATE TRIGGER checkpoints_append_only BEFORE UPDATE ON checkpoints
  BEGIN SELECT RAISE(ABORT, 'checkpoints are append-only'); END;
)sql",
    // 1 → 2: per-turn timings (time to first token, decode time; the dashboard's timeline after
    // a restart) and the options an agent was created with (resume uses them).
    R"sql(
CREATE TABLE turn_timings(
  session_id INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  turn INTEGER NOT NULL,
  ttft_ms REAL NOT NULL,
  decode_ms REAL NOT NULL,
  n_decoded INTEGER NOT NULL,
  PRIMARY KEY (session_id, turn)) WITHOUT ROWID;
CREATE TRIGGER turn_timings_append_only BEFORE UPDATE ON turn_timings
  BEGIN SELECT RAISE(ABORT, 'turn_timings are append-only'); END;
ALTER TABLE sessions ADD COLUMN agent_options TEXT NOT NULL DEFAULT '';
)sql",
    // 2 → 3: page bytes move out of kv_pages.bytes into the page file <db>.kvpages; the row
    // keeps where they lie and the payload xxh64 (the header's). kv_pages.bytes stays as an
    // empty blob (its NOT NULL cannot be dropped in place). store::migrate() then moves the
    // existing blobs into the page file in the same transaction (move_blobs_to_page_file).
    R"sql(
CREATE TABLE page_file(
  id INTEGER PRIMARY KEY CHECK (id = 1),
  file_id INTEGER NOT NULL);
ALTER TABLE kv_pages ADD COLUMN file_offset INTEGER;
ALTER TABLE kv_pages ADD COLUMN file_bytes INTEGER;
ALTER TABLE kv_pages ADD COLUMN xxh64 INTEGER;
CREATE INDEX kv_pages_by_offset ON kv_pages(file_offset);
)sql",
};
static_assert(std::size(migrations) == schema_version);

int64_t now_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}
int64_t as_i64(uint64_t v) { return std::bit_cast<int64_t>(v); }
uint64_t as_u64(int64_t v) { return std::bit_cast<uint64_t>(v); }
int64_t clamp_i64(uint64_t v) {
  return v > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(v);
}

std::string sid(session_id id) { return "session " + std::to_string(id); }

error invariant_error(session_id id, int n, const std::string& what) {
  return make_error(errc::internal,
                    sid(id) + ": store invariant " + std::to_string(n) + " broken: " + what);
}

// The int32 token ids of a chunk, little-endian.
std::vector<uint8_t> pack_tokens(std::span<const int32_t> t) {
  std::vector<uint8_t> out(t.size() * 4);
  for (size_t i = 0; i < t.size(); ++i) {
    const uint32_t v = static_cast<uint32_t>(t[i]);
    for (int b = 0; b < 4; ++b) out[4 * i + b] = static_cast<uint8_t>(v >> (8 * b));
  }
  return out;
}
void unpack_tokens(std::span<const uint8_t> b, std::vector<int32_t>* out) {
  for (size_t i = 0; i + 4 <= b.size(); i += 4) {
    uint32_t v = 0;
    for (int k = 3; k >= 0; --k) v = (v << 8) | b[i + k];
    out->push_back(static_cast<int32_t>(v));
  }
}

// Allowed targets of commit_turn and finish_session (invariant 8).
bool turn_target_ok(session_status s) {
  return s == session_status::active || s == session_status::waiting_tool ||
         s == session_status::done || s == session_status::failed;
}

const char* const select_session_sql =
    "SELECT id, model_hash, agent, status, main_dims, index_dims, main_entry_bytes, "
    "index_entry_bytes, created_ms, updated_ms, parent_id, fork_turns, fork_tokens, n_turns, "
    "n_tokens, agent_options FROM sessions";

session_info read_session_row(const stmt& s) {
  session_info i;
  i.id = s.col_int(0);
  i.model_hash = as_u64(s.col_int(1));
  i.agent = s.col_text(2);
  auto st = parse_session_status(s.col_text(3));
  i.status = st ? *st : session_status::failed;
  i.geometry.main_dims = static_cast<uint16_t>(s.col_int(4));
  i.geometry.index_dims = static_cast<uint16_t>(s.col_int(5));
  i.geometry.main_entry_bytes = static_cast<uint32_t>(s.col_int(6));
  i.geometry.index_entry_bytes = static_cast<uint32_t>(s.col_int(7));
  i.created_ms = s.col_int(8);
  i.updated_ms = s.col_int(9);
  if (!s.col_is_null(10)) i.parent = s.col_int(10);
  i.fork_turns = static_cast<uint32_t>(s.col_int(11));
  i.fork_tokens = static_cast<uint64_t>(s.col_int(12));
  i.n_turns = static_cast<uint32_t>(s.col_int(13));
  i.n_tokens = static_cast<uint64_t>(s.col_int(14));
  i.agent_options = s.col_text(15);
  return i;
}

}  // namespace

// ── Names ─────────────────────────────────────────────────────────────────────────────────

const char* session_status_name(session_status s) {
  switch (s) {
    case session_status::created: return "created";
    case session_status::forked: return "forked";
    case session_status::active: return "active";
    case session_status::waiting_tool: return "waiting_tool";
    case session_status::done: return "done";
    case session_status::failed: return "failed";
    case session_status::cancelled: return "cancelled";
  }
  return "unknown";
}

result<session_status> parse_session_status(std::string_view s) {
  for (auto v : {session_status::created, session_status::forked, session_status::active,
                 session_status::waiting_tool, session_status::done, session_status::failed,
                 session_status::cancelled})
    if (s == session_status_name(v)) return v;
  return make_error(errc::invalid_format, "unknown session status '" + std::string(s) + "'");
}

bool is_terminal(session_status s) {
  return s == session_status::done || s == session_status::failed || s == session_status::cancelled;
}

const char* item_kind_name(item_kind k) {
  switch (k) {
    case item_kind::system: return "system";
    case item_kind::user: return "user";
    case item_kind::assistant: return "assistant";
    case item_kind::tool_call: return "tool_call";
    case item_kind::tool_result: return "tool_result";
  }
  return "unknown";
}

result<item_kind> parse_item_kind(std::string_view s) {
  for (auto v : {item_kind::system, item_kind::user, item_kind::assistant, item_kind::tool_call,
                 item_kind::tool_result})
    if (s == item_kind_name(v)) return v;
  return make_error(errc::invalid_format, "unknown transcript item kind '" + std::string(s) + "'");
}

std::span<const uint8_t> loaded_page::main() const {
  if (status != page_status::ok) return {};
  return std::span<const uint8_t>(bytes).subspan(page_header_bytes,
                                                 uint64_t{n_entries} * main_entry_bytes);
}
std::span<const uint8_t> loaded_page::index() const {
  if (status != page_status::ok) return {};
  return std::span<const uint8_t>(bytes).subspan(page_header_bytes +
                                                 uint64_t{n_entries} * main_entry_bytes);
}

bool loaded_source::all_ok() const {
  return std::all_of(pages.begin(), pages.end(),
                     [](const loaded_page& p) { return p.status == page_status::ok; });
}

bool checkpoint_data::all_pages_ok() const {
  return std::all_of(sources.begin(), sources.end(),
                     [](const loaded_source& s) { return s.all_ok(); });
}

// ── Open, schema, migrations ─────────────────────────────────────────────────────────────

result<std::unique_ptr<store>> store::open(const std::string& path, const store_options& opt) {
  std::unique_ptr<store> s(new store());
  status st = s->init(path, opt);
  if (!st) return st.take_err();
  return s;
}

status store::init(const std::string& path, const store_options& opt) {
  opt_ = opt;
  if (opt.page_size < 512 || opt.page_size > 65536 || (opt.page_size & (opt.page_size - 1)))
    return make_error(errc::invalid_argument, "store page_size " + std::to_string(opt.page_size) +
                                                  " must be a power of two in [512, 65536]");
  page_path_ = path + ".kvpages";
  CEDAR_TRY(db_.open(path));
  sqlite3_busy_timeout(db_.handle(), opt.busy_timeout_ms);

  // The first read of the header: a file that is not SQLite fails here with SQLITE_NOTADB.
  auto version = db_.query_int("PRAGMA user_version");
  if (!version) {
    error e = version.take_err();
    e.message = path + ": not a cedar session store (" + e.message + ")";
    return e;
  }
  auto app = db_.query_int("PRAGMA application_id");
  if (!app) return app.take_err();
  if (*app != 0 && *app != application_id)
    return make_error(errc::mismatch, path + ": SQLite file of another application (application_id " +
                                          std::to_string(*app) + "), not a cedar session store");
  if (*version > schema_version)
    return make_error(errc::mismatch,
                      path + ": session store schema version " + std::to_string(*version) +
                          " is newer than this cedar understands (" + std::to_string(schema_version) +
                          "); upgrade cedar or use another --store");
  if (*version == 0) {
    // A new file: the page size must be set before the first table and before WAL.
    const std::string ps = "PRAGMA page_size=" + std::to_string(opt.page_size);
    CEDAR_TRY(db_.exec(ps.c_str()));
  }
  auto mode = db_.prepare("PRAGMA journal_mode=WAL");
  if (!mode) return mode.take_err();
  auto r = mode->step();
  if (!r) return r.take_err();
  if (!*r || mode->col_text(0) != "wal")
    return make_error(errc::io, path + ": cannot switch the session store to WAL mode");
  mode->reset();
  CEDAR_TRY(db_.exec("PRAGMA synchronous=NORMAL"));
  CEDAR_TRY(db_.exec("PRAGMA foreign_keys=ON"));
  // A turn's rows (aux state included) stay in the page cache until COMMIT; reads go through a
  // memory map.
  CEDAR_TRY(db_.exec("PRAGMA cache_size=-65536"));
  CEDAR_TRY(db_.exec("PRAGMA mmap_size=1073741824"));
  if (opt.max_page_count > 0) {
    const std::string mp = "PRAGMA max_page_count=" + std::to_string(opt.max_page_count);
    CEDAR_TRY(db_.exec(mp.c_str()));
  }
  return migrate();
}

status store::migrate() {
  transaction tx(db_);
  CEDAR_TRY(tx.begin());
  auto version = db_.query_int("PRAGMA user_version");  // re-read under the write lock
  if (!version) return version.take_err();
  if (*version < schema_version) {
    for (int64_t v = *version; v < schema_version; ++v) CEDAR_TRY(db_.exec(migrations[v]));
    if (*version < 3) CEDAR_TRY(move_blobs_to_page_file());
    const std::string uv = "PRAGMA user_version=" + std::to_string(schema_version);
    CEDAR_TRY(db_.exec(uv.c_str()));
    const std::string ai = "PRAGMA application_id=" + std::to_string(application_id);
    CEDAR_TRY(db_.exec(ai.c_str()));
  }
  // Under the same write lock: no other process is between its page write and its COMMIT.
  CEDAR_TRY(recover_page_file());
  return tx.commit();
}

uint64_t store::file_bytes() const {
  uint64_t total = 0;
  struct stat st;
  for (const std::string& p : {db_.path(), db_.path() + "-wal", page_path_})
    if (::stat(p.c_str(), &st) == 0) total += static_cast<uint64_t>(st.st_size);
  return total;
}

status store::checkpoint_wal() { return db_.exec("PRAGMA wal_checkpoint(TRUNCATE)"); }

// ── Sessions ─────────────────────────────────────────────────────────────────────────────

result<session_id> store::create_session(uint64_t model_hash, std::string_view agent,
                                         const page_geometry& g) {
  if (g.main_entry_bytes == 0)
    return make_error(errc::invalid_argument, "create_session: page geometry main_entry_bytes is 0");
  auto s = db_.prepare(
      "INSERT INTO sessions(model_hash, agent, status, main_dims, index_dims, main_entry_bytes, "
      "index_entry_bytes, created_ms, updated_ms) VALUES (?,?,?,?,?,?,?,?,?)");
  if (!s) return s.take_err();
  const int64_t t = now_ms();
  s->bind(1, as_i64(model_hash)).bind(2, agent).bind(3, std::string_view("created"));
  s->bind(4, int64_t{g.main_dims}).bind(5, int64_t{g.index_dims});
  s->bind(6, int64_t{g.main_entry_bytes}).bind(7, int64_t{g.index_entry_bytes});
  s->bind(8, t).bind(9, t);
  CEDAR_TRY(s->exec());
  return db_.last_rowid();
}

result<session_info> store::get_session(session_id id) {
  auto s = db_.prepare(std::string(select_session_sql) + " WHERE id=?");
  if (!s) return s.take_err();
  s->bind(1, id);
  auto r = s->step();
  if (!r) return r.take_err();
  if (!*r) return make_error(errc::not_found, sid(id) + " does not exist in " + db_.path());
  return read_session_row(*s);
}

result<std::vector<session_info>> store::list_sessions() {
  auto s = db_.prepare(std::string(select_session_sql) + " ORDER BY id");
  if (!s) return s.take_err();
  std::vector<session_info> out;
  CEDAR_TRY(s->each([&](stmt& row) { out.push_back(read_session_row(row)); }));
  return out;
}

status store::finish_session(session_id id, session_status final_status) {
  if (!is_terminal(final_status))
    return make_error(errc::invalid_argument, std::string("finish_session: '") +
                                                  session_status_name(final_status) +
                                                  "' is not a final status (done, failed, cancelled)");
  transaction tx(db_);
  CEDAR_TRY(tx.begin());
  auto info = get_session(id);
  if (!info) return info.take_err();
  if (is_terminal(info->status))
    return make_error(errc::mismatch, sid(id) + " is already " + session_status_name(info->status));
  auto s = db_.prepare("UPDATE sessions SET status=?, updated_ms=? WHERE id=?");
  if (!s) return s.take_err();
  s->bind(1, std::string_view(session_status_name(final_status))).bind(2, now_ms()).bind(3, id);
  CEDAR_TRY(s->exec());
  return tx.commit();
}

// ── commit_turn ──────────────────────────────────────────────────────────────────────────

namespace {

// One page of a turn on its way to the page file: the encoded header and where it goes.
struct staged_page {
  const page_write* in = nullptr;
  uint8_t header[page_header_bytes];
  uint64_t offset = 0;
  uint64_t bytes = 0;
  uint64_t payload_xxh64 = 0;
};

uint64_t payload_checksum(std::span<const uint8_t> main, std::span<const uint8_t> index) {
  XXH64_state_t* st = XXH64_createState();
  XXH64_reset(st, 0);
  XXH64_update(st, main.data(), main.size());
  XXH64_update(st, index.data(), index.size());
  const uint64_t h = XXH64_digest(st);
  XXH64_freeState(st);
  return h;
}

}  // namespace

result<turn_receipt> store::commit_turn(session_id id, const turn_write& turn) {
  if (!turn_target_ok(turn.status_after))
    return make_error(errc::invalid_argument,
                      sid(id) + ": commit_turn cannot leave the session '" +
                          session_status_name(turn.status_after) +
                          "' (expected active, waiting_tool, done or failed)");
  transaction tx(db_);
  CEDAR_TRY(tx.begin());  // the write lock first: validation below reads a stable session
  auto info_r = get_session(id);
  if (!info_r) return info_r.take_err();
  const session_info& info = *info_r;
  if (is_terminal(info.status))
    return make_error(errc::mismatch, sid(id) + " is " + session_status_name(info.status) +
                                          " and takes no more turns; fork it to continue");
  const uint32_t turn_index = info.n_turns;
  const uint64_t n_tokens_after = info.n_tokens + turn.tokens.size();

  // Validate everything before the first write: bad input leaves the database untouched.
  for (size_t i = 0; i < turn.items.size(); ++i) {
    const item_write& it = turn.items[i];
    if (it.token_begin > it.token_end || it.token_end > n_tokens_after)
      return make_error(errc::invalid_argument,
                        sid(id) + " turn " + std::to_string(turn_index) + " item " + std::to_string(i) +
                            ": token range [" + std::to_string(it.token_begin) + ", " +
                            std::to_string(it.token_end) + ") is outside the token log [0, " +
                            std::to_string(n_tokens_after) + ")");
    if (!nlohmann::json::accept(it.payload))
      return make_error(errc::invalid_argument, sid(id) + " turn " + std::to_string(turn_index) +
                                                    " item " + std::to_string(i) + " (" +
                                                    item_kind_name(it.kind) +
                                                    "): payload is not valid JSON");
  }
  if (turn.timing && !(std::isfinite(turn.timing->ttft_ms) && turn.timing->ttft_ms >= 0 &&
                      std::isfinite(turn.timing->decode_ms) && turn.timing->decode_ms >= 0))
    return make_error(errc::invalid_argument, sid(id) + " turn " + std::to_string(turn_index) +
                                                  ": timing ttft_ms and decode_ms must be finite and >= 0");
  std::map<uint32_t, uint64_t> ends;  // source_layer → entries stored (from the last checkpoint)
  if (info.n_turns > 0) {
    auto s = db_.prepare(
        "SELECT source_layer, n_entries FROM checkpoint_sources WHERE session_id=? AND n_turns=?");
    if (!s) return s.take_err();
    s->bind(1, id).bind(2, int64_t{info.n_turns});
    CEDAR_TRY(s->each([&](stmt& row) {
      ends[static_cast<uint32_t>(row.col_int(0))] = static_cast<uint64_t>(row.col_int(1));
    }));
  }
  const page_geometry& g = info.geometry;
  for (const page_write& p : turn.pages) {
    if (p.n_entries == 0) continue;
    const uint64_t want_main = uint64_t{p.n_entries} * g.main_entry_bytes;
    const uint64_t want_index = uint64_t{p.n_entries} * g.index_entry_bytes;
    if (p.main.size() != want_main || p.index.size() != want_index)
      return make_error(errc::invalid_argument,
                        sid(id) + " source " + std::to_string(p.source_layer) + ": a page of " +
                            std::to_string(p.n_entries) + " entries needs " + std::to_string(want_main) +
                            " main + " + std::to_string(want_index) + " index bytes, got " +
                            std::to_string(p.main.size()) + " + " + std::to_string(p.index.size()));
    uint64_t& end = ends[p.source_layer];
    if (p.first_entry != end)
      return make_error(errc::invalid_argument,
                        sid(id) + " source " + std::to_string(p.source_layer) + ": page starts at entry " +
                            std::to_string(p.first_entry) + " but " + std::to_string(end) +
                            " entries are stored (pages must be contiguous)");
    end += p.n_entries;
  }

  turn_receipt receipt;
  receipt.turn = turn_index;
  receipt.n_tokens = n_tokens_after;

  // Page bytes first: every new page at the committed end E in one pwritev, one fdatasync
  // (invariant 9). Until COMMIT no row references them; on any failure below they are cut off.
  std::vector<staged_page> staged;
  for (const page_write& p : turn.pages)
    if (p.n_entries > 0) {
      staged.emplace_back();
      staged.back().in = &p;
    }
  struct tail_guard {
    page_file* f = nullptr;
    uint64_t end = 0;
    bool armed = false;
    ~tail_guard() {
      if (armed) (void)f->truncate(end);  // best effort: open() truncates to E in any case
    }
  } tail{&pages_};
  if (!staged.empty()) {
    CEDAR_TRY(ensure_page_file());
    auto end = committed_end();
    if (!end) return end.take_err();
    std::vector<iovec> parts;
    parts.reserve(3 * staged.size());
    uint64_t at = *end;
    for (staged_page& sp : staged) {
      const page_write& p = *sp.in;
      page_header h;
      h.model_hash = info.model_hash;
      h.source_layer = p.source_layer;
      h.geometry = g;
      h.first_entry = p.first_entry;
      h.n_entries = p.n_entries;
      h.payload_xxh64 = sp.payload_xxh64 = payload_checksum(p.main, p.index);
      encode_page_header(h, sp.header);
      sp.offset = at;
      sp.bytes = h.total_bytes();
      at += sp.bytes;
      parts.push_back({sp.header, page_header_bytes});
      parts.push_back({const_cast<uint8_t*>(p.main.data()), p.main.size()});
      parts.push_back({const_cast<uint8_t*>(p.index.data()), p.index.size()});
    }
    if (opt_.max_page_file_bytes > 0 && at > opt_.max_page_file_bytes)
      return make_error(errc::io, pages_.path() + ": page file full: this turn's pages would grow it to " +
                                      std::to_string(at) + " bytes, over its size limit of " +
                                      std::to_string(opt_.max_page_file_bytes) + " (store_options.max_page_file_bytes)");
    tail.end = *end;
    tail.armed = true;
    CEDAR_TRY(pages_.write_at(*end, parts));
    CEDAR_TRY(pages_.sync());
  }

  // Transcript items.
  {
    auto next = db_.prepare("SELECT COALESCE(MAX(seq)+1, 0) FROM transcript_items WHERE session_id=?");
    if (!next) return next.take_err();
    next->bind(1, id);
    auto r = next->step();
    if (!r) return r.take_err();
    int64_t seq = next->col_int(0);
    auto ins = db_.prepare(
        "INSERT INTO transcript_items(session_id, seq, turn, kind, payload, token_begin, token_end) "
        "VALUES (?,?,?,?,?,?,?)");
    if (!ins) return ins.take_err();
    for (const item_write& it : turn.items) {
      ins->bind(1, id).bind(2, seq++).bind(3, int64_t{turn_index});
      ins->bind(4, std::string_view(item_kind_name(it.kind))).bind(5, it.payload);
      ins->bind(6, static_cast<int64_t>(it.token_begin)).bind(7, static_cast<int64_t>(it.token_end));
      CEDAR_TRY(ins->exec());
    }
  }
  // Token log.
  if (!turn.tokens.empty()) {
    const std::vector<uint8_t> packed = pack_tokens(turn.tokens);
    auto ins = db_.prepare(
        "INSERT INTO token_chunks(session_id, token_begin, n_tokens, turn, xxh64, ids) "
        "VALUES (?,?,?,?,?,?)");
    if (!ins) return ins.take_err();
    ins->bind(1, id).bind(2, static_cast<int64_t>(info.n_tokens));
    ins->bind(3, static_cast<int64_t>(turn.tokens.size())).bind(4, int64_t{turn_index});
    ins->bind(5, as_i64(checksum64(packed))).bind_blob_static(6, packed);
    CEDAR_TRY(ins->exec());
  }
  // KV pages: the rows; their bytes are already synced in the page file (invariant 9).
  if (!staged.empty()) {
    auto ins = db_.prepare(
        "INSERT INTO kv_pages(model_hash, source_layer, first_entry, n_entries, bytes, file_offset, "
        "file_bytes, xxh64) VALUES (?,?,?,?,?,?,?,?)");
    if (!ins) return ins.take_err();
    auto map = db_.prepare(
        "INSERT INTO session_pages(session_id, source_layer, first_entry, n_entries, turn, page_id) "
        "VALUES (?,?,?,?,?,?)");
    if (!map) return map.take_err();
    for (const staged_page& sp : staged) {
      const page_write& p = *sp.in;
      ins->bind(1, as_i64(info.model_hash)).bind(2, int64_t{p.source_layer});
      ins->bind(3, static_cast<int64_t>(p.first_entry)).bind(4, int64_t{p.n_entries});
      ins->bind_blob(5, {}).bind(6, static_cast<int64_t>(sp.offset)).bind(7, static_cast<int64_t>(sp.bytes));
      ins->bind(8, as_i64(sp.payload_xxh64));
      CEDAR_TRY(ins->exec());
      map->bind(1, id).bind(2, int64_t{p.source_layer}).bind(3, static_cast<int64_t>(p.first_entry));
      map->bind(4, int64_t{p.n_entries}).bind(5, int64_t{turn_index}).bind(6, db_.last_rowid());
      CEDAR_TRY(map->exec());
      receipt.page_bytes += sp.bytes;
    }
  }
  // Checkpoint: the session after this turn, every page of which is written above or earlier.
  {
    const int64_t n_turns_after = int64_t{turn_index} + 1;
    auto cp = db_.prepare(
        "INSERT INTO checkpoints(session_id, n_turns, n_tokens, created_ms) VALUES (?,?,?,?)");
    if (!cp) return cp.take_err();
    cp->bind(1, id).bind(2, n_turns_after).bind(3, static_cast<int64_t>(n_tokens_after)).bind(4, now_ms());
    CEDAR_TRY(cp->exec());
    auto src = db_.prepare(
        "INSERT INTO checkpoint_sources(session_id, n_turns, source_layer, n_entries) VALUES (?,?,?,?)");
    if (!src) return src.take_err();
    for (const auto& [layer, n] : ends) {
      src->bind(1, id).bind(2, n_turns_after).bind(3, int64_t{layer}).bind(4, static_cast<int64_t>(n));
      CEDAR_TRY(src->exec());
    }
    auto aux = db_.prepare(
        "INSERT INTO checkpoint_aux(session_id, n_turns, name, xxh64, bytes) VALUES (?,?,?,?,?)");
    if (!aux) return aux.take_err();
    if (turn.aux.empty() && turn.tokens.empty() && turn_index > 0) {
      // A turn that adds no tokens (tool results committed before the next generation) leaves
      // the executor's aux state as it was: its checkpoint carries the previous one's, so that
      // a resume from it can replay instead of re-prefilling.
      auto carry = db_.prepare(
          "INSERT INTO checkpoint_aux(session_id, n_turns, name, xxh64, bytes) "
          "SELECT session_id, ?1, name, xxh64, bytes FROM checkpoint_aux WHERE session_id=?2 AND "
          "n_turns=(SELECT MAX(n_turns) FROM checkpoints WHERE session_id=?2 AND n_turns<?1)");
      if (!carry) return carry.take_err();
      carry->bind(1, n_turns_after).bind(2, id);
      CEDAR_TRY(carry->exec());
    }
    auto drop_hint = db_.prepare("DELETE FROM checkpoint_aux WHERE session_id=? AND name=? AND n_turns<?");
    if (!drop_hint) return drop_hint.take_err();
    for (const aux_write& a : turn.aux) {
      if (aux_is_hint(a.name)) {
        drop_hint->bind(1, id).bind(2, a.name).bind(3, n_turns_after);
        CEDAR_TRY(drop_hint->exec());
      }
      aux->bind(1, id).bind(2, n_turns_after).bind(3, a.name);
      aux->bind(4, as_i64(checksum64(a.bytes))).bind_blob_static(5, a.bytes);
      status st = aux->exec();
      if (!st) {
        error e = st.take_err();
        if (e.code == errc::invalid_argument) e.message += " (duplicate aux name '" + a.name + "'?)";
        return e;
      }
    }
  }
  if (turn.timing) {
    auto tt = db_.prepare(
        "INSERT INTO turn_timings(session_id, turn, ttft_ms, decode_ms, n_decoded) VALUES (?,?,?,?,?)");
    if (!tt) return tt.take_err();
    tt->bind(1, id).bind(2, int64_t{turn_index}).bind_real(3, turn.timing->ttft_ms).bind_real(4, turn.timing->decode_ms);
    tt->bind(5, clamp_i64(turn.timing->n_decoded));
    CEDAR_TRY(tt->exec());
  }
  {
    auto up = db_.prepare("UPDATE sessions SET status=?, n_turns=?, n_tokens=?, updated_ms=? WHERE id=?");
    if (!up) return up.take_err();
    up->bind(1, std::string_view(session_status_name(turn.status_after)));
    up->bind(2, int64_t{turn_index} + 1).bind(3, static_cast<int64_t>(n_tokens_after));
    up->bind(4, now_ms()).bind(5, id);
    CEDAR_TRY(up->exec());
  }
  CEDAR_TRY(tx.commit());
  tail.armed = false;
  CEDAR_TRY(assert_invariants(id));
  return receipt;
}

// ── Fork and remove ──────────────────────────────────────────────────────────────────────

result<session_id> store::fork_session(session_id parent, uint32_t n_turns, std::string_view agent) {
  transaction tx(db_);
  CEDAR_TRY(tx.begin());
  auto p = get_session(parent);
  if (!p) return p.take_err();
  if (n_turns > p->n_turns)
    return make_error(errc::invalid_argument, sid(parent) + " has " + std::to_string(p->n_turns) +
                                                  " turns; cannot fork at turn " +
                                                  std::to_string(n_turns));
  uint64_t n_tokens = 0;
  if (n_turns > 0) {
    auto cp = db_.prepare("SELECT n_tokens FROM checkpoints WHERE session_id=? AND n_turns=?");
    if (!cp) return cp.take_err();
    cp->bind(1, parent).bind(2, int64_t{n_turns});
    auto r = cp->step();
    if (!r) return r.take_err();
    if (!*r)
      return make_error(errc::not_found, sid(parent) + " has no checkpoint after turn " +
                                             std::to_string(n_turns));
    n_tokens = static_cast<uint64_t>(cp->col_int(0));
  }
  auto ins = db_.prepare(
      "INSERT INTO sessions(model_hash, agent, status, main_dims, index_dims, main_entry_bytes, "
      "index_entry_bytes, created_ms, updated_ms, parent_id, fork_turns, fork_tokens, n_turns, "
      "n_tokens, agent_options) SELECT model_hash, ?, 'forked', main_dims, index_dims, "
      "main_entry_bytes, index_entry_bytes, ?, ?, id, ?, ?, ?, ?, agent_options FROM sessions "
      "WHERE id=?");
  if (!ins) return ins.take_err();
  const int64_t t = now_ms();
  ins->bind(1, agent.empty() ? std::string_view(p->agent) : agent).bind(2, t).bind(3, t);
  ins->bind(4, int64_t{n_turns}).bind(5, static_cast<int64_t>(n_tokens));
  ins->bind(6, int64_t{n_turns}).bind(7, static_cast<int64_t>(n_tokens)).bind(8, parent);
  CEDAR_TRY(ins->exec());
  const session_id child = db_.last_rowid();

  // Copy the small rows of the first n_turns turns; share the pages by reference (no copy).
  const char* const copies[] = {
      "INSERT INTO transcript_items(session_id, seq, turn, kind, payload, token_begin, token_end) "
      "SELECT ?1, seq, turn, kind, payload, token_begin, token_end FROM transcript_items "
      "WHERE session_id=?2 AND turn<?3 ORDER BY seq",
      "INSERT INTO token_chunks(session_id, token_begin, n_tokens, turn, xxh64, ids) "
      "SELECT ?1, token_begin, n_tokens, turn, xxh64, ids FROM token_chunks "
      "WHERE session_id=?2 AND turn<?3",
      "INSERT INTO session_pages(session_id, source_layer, first_entry, n_entries, turn, page_id) "
      "SELECT ?1, source_layer, first_entry, n_entries, turn, page_id FROM session_pages "
      "WHERE session_id=?2 AND turn<?3",
      "INSERT INTO checkpoints(session_id, n_turns, n_tokens, created_ms) "
      "SELECT ?1, n_turns, n_tokens, created_ms FROM checkpoints WHERE session_id=?2 AND n_turns<=?3",
      "INSERT INTO checkpoint_sources(session_id, n_turns, source_layer, n_entries) "
      "SELECT ?1, n_turns, source_layer, n_entries FROM checkpoint_sources "
      "WHERE session_id=?2 AND n_turns<=?3",
      "INSERT INTO checkpoint_aux(session_id, n_turns, name, xxh64, bytes) "
      "SELECT ?1, n_turns, name, xxh64, bytes FROM checkpoint_aux WHERE session_id=?2 AND n_turns<=?3",
      "INSERT INTO turn_timings(session_id, turn, ttft_ms, decode_ms, n_decoded) "
      "SELECT ?1, turn, ttft_ms, decode_ms, n_decoded FROM turn_timings WHERE session_id=?2 AND turn<?3",
  };
  for (const char* sql : copies) {
    auto s = db_.prepare(sql);
    if (!s) return s.take_err();
    s->bind(1, child).bind(2, parent).bind(3, int64_t{n_turns});
    CEDAR_TRY(s->exec());
  }
  CEDAR_TRY(tx.commit());
  CEDAR_TRY(assert_invariants(child));
  return child;
}

status store::remove_session(session_id id) {
  transaction tx(db_);
  CEDAR_TRY(tx.begin());
  auto info = get_session(id);
  if (!info) return info.take_err();
  std::vector<int64_t> pages;
  {
    auto s = db_.prepare("SELECT page_id FROM session_pages WHERE session_id=?");
    if (!s) return s.take_err();
    s->bind(1, id);
    CEDAR_TRY(s->each([&](stmt& row) { pages.push_back(row.col_int(0)); }));
  }
  // Children keep everything they need (their own rows; shared pages by reference): only
  // their parent link is cleared (ON DELETE SET NULL).
  auto del = db_.prepare("DELETE FROM sessions WHERE id=?");
  if (!del) return del.take_err();
  del->bind(1, id);
  CEDAR_TRY(del->exec());
  auto gc = db_.prepare(
      "DELETE FROM kv_pages WHERE id=?1 AND NOT EXISTS (SELECT 1 FROM session_pages WHERE page_id=?1)");
  if (!gc) return gc.take_err();
  for (int64_t page : pages) {
    gc->bind(1, page);
    CEDAR_TRY(gc->exec());
  }
  CEDAR_TRY(tx.commit());
#ifndef NDEBUG
  {
    auto orphans = db_.query_int(
        "SELECT COUNT(*) FROM kv_pages k WHERE NOT EXISTS "
        "(SELECT 1 FROM session_pages s WHERE s.page_id=k.id)");
    assert(orphans.ok() && *orphans == 0 && "store invariant 7: orphan kv page after remove");
  }
#endif
  return {};
}

// ── Reading ──────────────────────────────────────────────────────────────────────────────

result<std::vector<transcript_item>> store::transcript(session_id id) {
  CEDAR_TRY(get_session(id));
  auto s = db_.prepare(
      "SELECT seq, turn, kind, payload, token_begin, token_end FROM transcript_items "
      "WHERE session_id=? ORDER BY seq");
  if (!s) return s.take_err();
  s->bind(1, id);
  std::vector<transcript_item> out;
  CEDAR_TRY(s->each([&](stmt& row) -> status {
    transcript_item it;
    it.seq = static_cast<uint32_t>(row.col_int(0));
    it.turn = static_cast<uint32_t>(row.col_int(1));
    auto k = parse_item_kind(row.col_text(2));
    if (!k) return k.take_err();
    it.kind = *k;
    it.payload = row.col_text(3);
    it.token_begin = static_cast<uint64_t>(row.col_int(4));
    it.token_end = static_cast<uint64_t>(row.col_int(5));
    out.push_back(std::move(it));
    return {};
  }));
  return out;
}

result<std::vector<int32_t>> store::tokens(session_id id, uint64_t end) {
  CEDAR_TRY(get_session(id));
  auto s = db_.prepare(
      "SELECT token_begin, n_tokens, xxh64, ids FROM token_chunks WHERE session_id=? "
      "AND token_begin<? ORDER BY token_begin");
  if (!s) return s.take_err();
  s->bind(1, id).bind(2, clamp_i64(end));
  std::vector<int32_t> out;
  CEDAR_TRY(s->each([&](stmt& row) -> status {
    const uint64_t begin = static_cast<uint64_t>(row.col_int(0));
    const uint64_t n = static_cast<uint64_t>(row.col_int(1));
    const auto ids = row.col_blob(3);
    if (begin != out.size() || ids.size() != 4 * n || checksum64(ids) != as_u64(row.col_int(2)))
      return make_error(errc::checksum, sid(id) + ": token log chunk at token " + std::to_string(begin) +
                                            " is damaged (length or xxh64 mismatch)");
    unpack_tokens(ids, &out);
    return {};
  }));
  if (out.size() > end) out.resize(end);
  return out;
}

result<std::vector<checkpoint_info>> store::checkpoints(session_id id) {
  CEDAR_TRY(get_session(id));
  auto s = db_.prepare(
      "SELECT n_turns, n_tokens, created_ms FROM checkpoints WHERE session_id=? ORDER BY n_turns");
  if (!s) return s.take_err();
  s->bind(1, id);
  std::vector<checkpoint_info> out;
  CEDAR_TRY(s->each([&](stmt& row) {
    out.push_back(
        {static_cast<uint32_t>(row.col_int(0)), static_cast<uint64_t>(row.col_int(1)), row.col_int(2)});
  }));
  return out;
}

result<std::vector<turn_timing>> store::turn_timings(session_id id) {
  CEDAR_TRY(get_session(id));
  auto s = db_.prepare(
      "SELECT turn, ttft_ms, decode_ms, n_decoded FROM turn_timings WHERE session_id=? ORDER BY turn");
  if (!s) return s.take_err();
  s->bind(1, id);
  std::vector<turn_timing> out;
  CEDAR_TRY(s->each([&](stmt& row) {
    out.push_back({static_cast<uint32_t>(row.col_int(0)), row.col_real(1), row.col_real(2),
                   static_cast<uint64_t>(row.col_int(3))});
  }));
  return out;
}

status store::set_agent_options(session_id id, std::string_view options_json) {
  auto j = nlohmann::json::parse(options_json, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return make_error(errc::invalid_argument, sid(id) + ": agent options must be a JSON object");
  CEDAR_TRY(get_session(id));
  auto s = db_.prepare("UPDATE sessions SET agent_options=?, updated_ms=? WHERE id=?");
  if (!s) return s.take_err();
  s->bind(1, options_json).bind(2, now_ms()).bind(3, id);
  return s->exec();
}

result<std::vector<store::page_ref>> store::page_refs(session_id id) {
  CEDAR_TRY(get_session(id));
  auto s = db_.prepare(
      "SELECT source_layer, first_entry, n_entries, turn, page_id FROM session_pages "
      "WHERE session_id=? ORDER BY source_layer, first_entry");
  if (!s) return s.take_err();
  s->bind(1, id);
  std::vector<page_ref> out;
  CEDAR_TRY(s->each([&](stmt& row) {
    out.push_back({static_cast<uint32_t>(row.col_int(0)), static_cast<uint64_t>(row.col_int(1)),
                   static_cast<uint32_t>(row.col_int(2)), static_cast<uint32_t>(row.col_int(3)),
                   row.col_int(4)});
  }));
  return out;
}

result<checkpoint_data> store::load_checkpoint(session_id id, uint64_t at_or_before_tokens,
                                               const load_options& opt) {
  // One read transaction: a consistent snapshot even while another connection writes.
  CEDAR_TRY(db_.exec("BEGIN"));
  struct end_read {
    const db& d;
    ~end_read() { sqlite3_exec(d.handle(), "COMMIT", nullptr, nullptr, nullptr); }
  } guard{db_};

  checkpoint_data out;
  auto info = get_session(id);
  if (!info) return info.take_err();
  out.session = std::move(*info);
  {
    auto s = db_.prepare(
        "SELECT n_turns, n_tokens, created_ms FROM checkpoints WHERE session_id=? AND n_tokens<=? "
        "ORDER BY n_turns DESC LIMIT 1");
    if (!s) return s.take_err();
    s->bind(1, id).bind(2, clamp_i64(at_or_before_tokens));
    auto r = s->step();
    if (!r) return r.take_err();
    if (!*r)
      return make_error(errc::not_found,
                        sid(id) + " has no checkpoint at or before " +
                            (at_or_before_tokens == std::numeric_limits<uint64_t>::max()
                                 ? std::string("its end")
                                 : std::to_string(at_or_before_tokens) + " tokens"));
    out.checkpoint = {static_cast<uint32_t>(s->col_int(0)), static_cast<uint64_t>(s->col_int(1)),
                      s->col_int(2)};
  }
  const uint32_t n_turns = out.checkpoint.n_turns;
  auto toks = tokens(id, out.checkpoint.n_tokens);
  if (!toks) return toks.take_err();
  out.tokens = std::move(*toks);
  if (out.tokens.size() != out.checkpoint.n_tokens)
    return make_error(errc::internal, sid(id) + ": token log holds " + std::to_string(out.tokens.size()) +
                                          " tokens, checkpoint says " +
                                          std::to_string(out.checkpoint.n_tokens));
  auto items = transcript(id);
  if (!items) return items.take_err();
  for (auto& it : *items)
    if (it.turn < n_turns) out.transcript.push_back(std::move(it));

  // Aux state.
  {
    auto s = db_.prepare(
        "SELECT name, xxh64, bytes FROM checkpoint_aux WHERE session_id=? AND n_turns=? ORDER BY name");
    if (!s) return s.take_err();
    s->bind(1, id).bind(2, int64_t{n_turns});
    CEDAR_TRY(s->each([&](stmt& row) -> status {
      const auto b = row.col_blob(2);
      if (checksum64(b) != as_u64(row.col_int(1))) {
        out.aux_errors.push_back("aux '" + row.col_text(0) + "': xxh64 mismatch");
        return {};
      }
      out.aux.push_back({row.col_text(0), std::vector<uint8_t>(b.begin(), b.end())});
      return {};
    }));
  }

  // Pages per source, each verified.
  auto srcs = db_.prepare(
      "SELECT source_layer, n_entries FROM checkpoint_sources WHERE session_id=? AND n_turns=? "
      "ORDER BY source_layer");
  if (!srcs) return srcs.take_err();
  srcs->bind(1, id).bind(2, int64_t{n_turns});
  CEDAR_TRY(srcs->each([&](stmt& row) {
    loaded_source src;
    src.source_layer = static_cast<uint32_t>(row.col_int(0));
    src.n_entries = static_cast<uint64_t>(row.col_int(1));
    out.sources.push_back(std::move(src));
  }));
  if (!opt.with_pages) return out;

  const page_geometry& g = out.session.geometry;
  auto pages = db_.prepare(
      "SELECT sp.first_entry, sp.n_entries, sp.page_id, k.id, k.file_offset, k.file_bytes, k.xxh64 "
      "FROM session_pages sp LEFT JOIN kv_pages k ON k.id=sp.page_id WHERE sp.session_id=? AND "
      "sp.source_layer=? AND sp.first_entry<? ORDER BY sp.first_entry");
  if (!pages) return pages.take_err();
  // The page file this snapshot names; when it cannot be opened every page reports why.
  const status file_ok = ensure_page_file();
  for (loaded_source& src : out.sources) {
    pages->bind(1, id).bind(2, int64_t{src.source_layer}).bind(3, static_cast<int64_t>(src.n_entries));
    uint64_t covered = 0;
    auto missing = [&](uint64_t begin, uint64_t end) {
      loaded_page m;
      m.source_layer = src.source_layer;
      m.first_entry = begin;
      m.n_entries = static_cast<uint32_t>(end - begin);
      m.status = page_status::missing;
      m.detail = "no page covers entries [" + std::to_string(begin) + ", " + std::to_string(end) + ")";
      src.pages.push_back(std::move(m));
    };
    CEDAR_TRY(pages->each([&](stmt& row) -> status {
      loaded_page lp;
      lp.source_layer = src.source_layer;
      lp.first_entry = static_cast<uint64_t>(row.col_int(0));
      lp.n_entries = static_cast<uint32_t>(row.col_int(1));
      lp.main_entry_bytes = g.main_entry_bytes;
      const int64_t page_row = row.col_int(2);
      if (lp.first_entry > covered) missing(covered, lp.first_entry);
      covered = std::max(covered, lp.first_entry + lp.n_entries);
      const std::string where = "kv_pages row " + std::to_string(page_row);
      if (row.col_is_null(3) || row.col_is_null(4) || !file_ok) {
        // The row is gone, its bytes were lost with the page file, or the file cannot be read.
        lp.status = page_status::missing;
        lp.detail = row.col_is_null(3)   ? where + " is gone"
                    : row.col_is_null(4) ? where + ": its bytes were lost with the page file"
                                         : where + ": " + file_ok.err().message;
        src.pages.push_back(std::move(lp));
        return {};
      }
      const uint64_t offset = static_cast<uint64_t>(row.col_int(4));
      const uint64_t n = static_cast<uint64_t>(row.col_int(5));
      const uint64_t row_xxh = as_u64(row.col_int(6));
      if (n > (uint64_t{1} << 40)) {
        lp.status = page_status::layout_mismatch;
        lp.detail = where + ": file_bytes " + std::to_string(n) + " is not a page size";
        src.pages.push_back(std::move(lp));
        return {};
      }
      lp.bytes.resize(static_cast<size_t>(n));
      auto got = pages_.read_at(offset, lp.bytes.data(), n);
      if (!got) {  // an I/O error is this page's problem, not the session's
        lp.bytes.clear();
        lp.status = page_status::missing;
        lp.detail = where + ": " + got.err().message;
        src.pages.push_back(std::move(lp));
        return {};
      }
      lp.bytes.resize(static_cast<size_t>(*got));  // short at the end of the file: truncated
      page_check c = verify_page(lp.bytes, out.session.model_hash, src.source_layer, lp.first_entry,
                                 lp.n_entries, g);
      lp.status = c.status;
      if (c.status != page_status::ok) {
        lp.detail = pages_.path() + " at offset " + std::to_string(offset) + " (" + where + "): " + c.detail;
      } else if (c.header.payload_xxh64 != row_xxh || *got != n) {
        // A well-formed page, but not the one the row recorded (e.g. bytes moved under it).
        lp.status = page_status::checksum;
        lp.detail = pages_.path() + " at offset " + std::to_string(offset) + " (" + where +
                    "): the page there is not the one the row recorded (payload xxh64 differs)";
      }
      src.pages.push_back(std::move(lp));
      return {};
    }));
    pages->reset();
    if (covered < src.n_entries) missing(covered, src.n_entries);
  }
  return out;
}

// ── Invariants ───────────────────────────────────────────────────────────────────────────

status store::assert_invariants(session_id id) {
#ifndef NDEBUG
  status s = check_invariants(id);
  if (!s) CEDAR_LOG_ERROR("%s", s.err().message.c_str());
  assert(s.ok() && "session store invariant broken (see check_invariants)");
#else
  (void)id;
#endif
  return {};
}

status store::check_invariants(session_id id) {
  auto info_r = get_session(id);
  if (!info_r) return info_r.take_err();
  const session_info& info = *info_r;

  // 3. Token chunks tile [0, n_tokens) and match their checksums.
  {
    auto t = tokens(id);
    if (!t) return invariant_error(id, 3, t.err().message);
    if (t->size() != info.n_tokens)
      return invariant_error(id, 3, "token log holds " + std::to_string(t->size()) +
                                        " tokens, sessions.n_tokens is " + std::to_string(info.n_tokens));
  }
  // 4. Transcript order and ranges.
  {
    auto items = transcript(id);
    if (!items) return invariant_error(id, 4, items.err().message);
    uint32_t prev_turn = 0;
    for (size_t i = 0; i < items->size(); ++i) {
      const transcript_item& it = (*items)[i];
      if (it.seq != i || it.turn < prev_turn || it.turn >= info.n_turns ||
          it.token_begin > it.token_end || it.token_end > info.n_tokens)
        return invariant_error(id, 4, "transcript item seq " + std::to_string(it.seq) + " (turn " +
                                          std::to_string(it.turn) + ") is out of order or range");
      prev_turn = it.turn;
    }
  }
  // 5. Pages tile [0, E) per source and agree with their kv_pages rows.
  std::map<uint32_t, std::vector<uint64_t>> boundaries;  // source → 0 and every page end
  {
    auto s = db_.prepare(
        "SELECT sp.source_layer, sp.first_entry, sp.n_entries, sp.turn, k.source_layer, "
        "k.first_entry, k.n_entries, k.model_hash FROM session_pages sp LEFT JOIN kv_pages k "
        "ON k.id=sp.page_id WHERE sp.session_id=? ORDER BY sp.source_layer, sp.first_entry");
    if (!s) return s.take_err();
    s->bind(1, id);
    CEDAR_TRY(s->each([&](stmt& row) -> status {
      const uint32_t src = static_cast<uint32_t>(row.col_int(0));
      const uint64_t first = static_cast<uint64_t>(row.col_int(1));
      const uint64_t n = static_cast<uint64_t>(row.col_int(2));
      auto& b = boundaries[src];
      if (b.empty()) b.push_back(0);
      if (first != b.back())
        return invariant_error(id, 5, "source " + std::to_string(src) + " has a page at entry " +
                                          std::to_string(first) + " after entry " + std::to_string(b.back()));
      if (row.col_is_null(4) || row.col_int(4) != src || static_cast<uint64_t>(row.col_int(5)) != first ||
          static_cast<uint64_t>(row.col_int(6)) != n || as_u64(row.col_int(7)) != info.model_hash ||
          row.col_int(3) >= int64_t{info.n_turns})
        return invariant_error(id, 5, "source " + std::to_string(src) + " page at entry " +
                                          std::to_string(first) + " disagrees with its kv_pages row");
      b.push_back(first + n);
      return {};
    }));
  }
  // 6. One checkpoint per turn count, the last at n_tokens, entries on page boundaries.
  {
    auto cps = checkpoints(id);
    if (!cps) return cps.take_err();
    if (cps->size() != info.n_turns)
      return invariant_error(id, 6, std::to_string(cps->size()) + " checkpoints for " +
                                        std::to_string(info.n_turns) + " turns");
    uint64_t prev = 0;
    for (size_t i = 0; i < cps->size(); ++i) {
      const checkpoint_info& c = (*cps)[i];
      if (c.n_turns != i + 1 || c.n_tokens < prev)
        return invariant_error(id, 6, "checkpoint " + std::to_string(i) + " is out of order");
      prev = c.n_tokens;
    }
    if (!cps->empty() && cps->back().n_tokens != info.n_tokens)
      return invariant_error(id, 6, "last checkpoint at " + std::to_string(cps->back().n_tokens) +
                                        " tokens, session has " + std::to_string(info.n_tokens));
    auto s = db_.prepare("SELECT n_turns, source_layer, n_entries FROM checkpoint_sources WHERE session_id=?");
    if (!s) return s.take_err();
    s->bind(1, id);
    CEDAR_TRY(s->each([&](stmt& row) -> status {
      const uint32_t src = static_cast<uint32_t>(row.col_int(1));
      const uint64_t n = static_cast<uint64_t>(row.col_int(2));
      const auto it = boundaries.find(src);
      const bool on_boundary =
          n == 0 || (it != boundaries.end() &&
                     std::binary_search(it->second.begin(), it->second.end(), n));
      if (!on_boundary)
        return invariant_error(id, 6,
                               "checkpoint after " + std::to_string(row.col_int(0)) + " turns counts " +
                                   std::to_string(n) + " entries of source " + std::to_string(src) +
                                   ", not the end of a stored page");
      return {};
    }));
  }
  // 7. No orphan pages (global).
  {
    auto orphans = db_.query_int(
        "SELECT COUNT(*) FROM kv_pages k WHERE NOT EXISTS "
        "(SELECT 1 FROM session_pages s WHERE s.page_id=k.id)");
    if (!orphans) return orphans.take_err();
    if (*orphans != 0)
      return invariant_error(id, 7, std::to_string(*orphans) + " kv pages belong to no session");
  }
  // 10. The session's pages lie inside the page file, sized as their entries say, and (global)
  // no two pages overlap, the last ending at the committed end, within the file.
  {
    auto s = db_.prepare(
        "SELECT k.id, k.file_offset, k.file_bytes, k.n_entries FROM session_pages sp JOIN kv_pages k "
        "ON k.id=sp.page_id WHERE sp.session_id=? AND k.file_offset IS NOT NULL");
    if (!s) return s.take_err();
    s->bind(1, id);
    CEDAR_TRY(s->each([&](stmt& row) -> status {
      const uint64_t off = static_cast<uint64_t>(row.col_int(1)), n = static_cast<uint64_t>(row.col_int(2));
      if (off < page_file_header_bytes ||
          n != page_header_bytes + static_cast<uint64_t>(row.col_int(3)) * info.geometry.entry_bytes())
        return invariant_error(id, 10,
                               "kv_pages row " + std::to_string(row.col_int(0)) + " at offset " +
                                   std::to_string(off) + " holds " + std::to_string(n) +
                                   " bytes, not a page of its entries inside the page file");
      return {};
    }));
    auto all = db_.prepare(
        "SELECT id, file_offset, file_bytes FROM kv_pages WHERE file_offset IS NOT NULL ORDER BY file_offset");
    if (!all) return all.take_err();
    uint64_t prev_end = page_file_header_bytes;
    CEDAR_TRY(all->each([&](stmt& row) -> status {
      const uint64_t off = static_cast<uint64_t>(row.col_int(1));
      if (off < prev_end)
        return invariant_error(id, 10,
                               "kv_pages row " + std::to_string(row.col_int(0)) + " at offset " +
                                   std::to_string(off) + " overlaps the page before it");
      prev_end = off + static_cast<uint64_t>(row.col_int(2));
      return {};
    }));
    CEDAR_TRY(ensure_page_file());
    auto size = pages_.size();
    if (!size) return size.take_err();
    if (prev_end > *size)
      return invariant_error(id, 10, pages_.path() + " holds " + std::to_string(*size) +
                                         " bytes; its committed pages end at " + std::to_string(prev_end));
  }
  // 8. A terminal session's status is consistent (the diagram has no way back).
  if ((info.n_turns == 0 && info.status != session_status::created &&
       info.status != session_status::forked && !is_terminal(info.status)) ||
      (info.n_turns > 0 && info.status == session_status::created))
    return invariant_error(id, 8, std::string("session with ") + std::to_string(info.n_turns) +
                                      " turns is " + session_status_name(info.status));
  return {};
}

}  // namespace cedar::sessions
