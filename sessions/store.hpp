// sessions/store — the session store: sessions, their append-only transcript and token log, the
// FP4 global-KV pages of each KV source, and checkpoints. SQLite (WAL mode) holds every row; the
// page bytes live in an append-only page file beside it (`<db>.kvpages`, page_file.hpp), each
// kv_pages row holding the page's (file_offset, file_bytes, xxh64).
//
// Owns: one SQLite connection and the page file's descriptor. Exactly one owner (the store
// actor, ARCHITECTURE.md); not thread-safe. Other processes may open the same store (the CLI):
// writes are serialised by SQLite's write lock, which also guards the page file's end. Does not:
// know the model (pages are opaque entries of a `page_geometry`), hold SWA state (never
// persisted), decide between replay and re-prefill (the executor does, from the per-page status
// that load_checkpoint reports).
//
// The state diagram of a session and the numbered invariants are drawn at the top of store.cpp.
//
// Durability: a turn's page bytes are fdatasync'ed before the transaction that references them
// commits; SQLite runs WAL with synchronous=NORMAL. A commit_turn that returned ok survives a
// crash or SIGKILL of the process; after a power loss or OS crash the store is still consistent
// (every turn is all or nothing) but the last turns committed since the last WAL sync may be
// rolled back. Readers never see half a turn.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/base/result.hpp"
#include "sessions/page_file.hpp"
#include "sessions/page_format.hpp"
#include "sessions/sqlite_db.hpp"

namespace cedar::sessions {

using session_id = int64_t;

// See the diagram in store.cpp. `created` and `forked` are the two initial states.
enum class session_status { created, forked, active, waiting_tool, done, failed, cancelled };
const char* session_status_name(session_status s);
result<session_status> parse_session_status(std::string_view s);
bool is_terminal(session_status s);

enum class item_kind { system, user, assistant, tool_call, tool_result };
const char* item_kind_name(item_kind k);
result<item_kind> parse_item_kind(std::string_view s);

struct session_info {
  session_id id = 0;
  uint64_t model_hash = 0;
  std::string agent;
  session_status status = session_status::created;
  page_geometry geometry;
  int64_t created_ms = 0;  // unix epoch milliseconds
  int64_t updated_ms = 0;
  std::optional<session_id> parent;  // set for a fork while the parent exists
  uint32_t fork_turns = 0;           // for a fork: how many of the parent's turns it started with
  uint64_t fork_tokens = 0;
  uint32_t n_turns = 0;              // committed turns
  uint64_t n_tokens = 0;             // length of the token log
  std::string agent_options;         // JSON object text (set_agent_options); "" when never set
};

// One transcript item: `payload` is JSON text (validated on write); [token_begin, token_end) is
// its range in the token log (empty when it has no tokens).
struct transcript_item {
  uint32_t seq = 0;   // 0, 1, 2, ... within the session
  uint32_t turn = 0;  // 0-based index of the turn that wrote it
  item_kind kind = item_kind::user;
  std::string payload;
  uint64_t token_begin = 0;
  uint64_t token_end = 0;
};

struct item_write {
  item_kind kind = item_kind::user;
  std::string payload;  // JSON text
  uint64_t token_begin = 0;
  uint64_t token_end = 0;
};

// New entries of one KV source: [first_entry, first_entry + n_entries). `main` holds
// [n_entries, main_entry_bytes] and `index` [n_entries, index_entry_bytes], as the executor
// keeps them. Views: the bytes need only live for the duration of commit_turn.
struct page_write {
  uint32_t source_layer = 0;
  uint64_t first_entry = 0;
  uint32_t n_entries = 0;
  std::span<const uint8_t> main;
  std::span<const uint8_t> index;
};

// Auxiliary state needed to resume exactly (compressor pending half-group, Engram n-gram
// history, ...): named opaque bytes, replaced at every checkpoint, checksummed. A name that
// starts with "hint." (aux_is_hint) is a resume hint — a cache the executor can do without
// (runner::replay's index selections): the store keeps it for a session's latest checkpoint
// only, so hints cost a constant per session, not a constant per turn.
inline bool aux_is_hint(std::string_view name) { return name.starts_with("hint."); }
struct aux_write {
  std::string name;
  std::span<const uint8_t> bytes;
};
struct aux_blob {
  std::string name;
  std::vector<uint8_t> bytes;
};

// How long a turn's generation took, as its requester measured it (schema 2). Append-only like
// the rest of a turn; forks copy the rows of the turns they keep.
struct turn_timing {
  uint32_t turn = 0;       // 0-based turn index (ignored on write: the committed turn's index)
  double ttft_ms = 0;      // from the generation request to its first sampled token
  double decode_ms = 0;    // wall time of the decode steps after the first token
  uint64_t n_decoded = 0;  // tokens sampled
};

// Everything one turn adds. commit_turn writes it in ONE transaction, with a checkpoint at the
// end of the turn; only new rows are written (history is never rewritten).
struct turn_write {
  std::vector<item_write> items;
  std::span<const int32_t> tokens;  // appended to the token log at session.n_tokens
  std::vector<page_write> pages;    // per source, contiguous with what is stored; 0-entry pages skipped
  std::vector<aux_write> aux;       // the aux state at the end of the turn
  session_status status_after = session_status::active;  // active, waiting_tool, done or failed
  std::optional<turn_timing> timing;  // the turn's generation timing, when it generated
};

struct turn_receipt {
  uint32_t turn = 0;         // 0-based index of the committed turn
  uint64_t n_tokens = 0;     // token log length after it (= the checkpoint's position)
  uint64_t page_bytes = 0;   // bytes of KV pages written (headers included)
};

struct store_options {
  // SQLite page size of a new file. The database holds only rows (the page bytes are in the
  // page file), so 4096 keeps it small.
  uint32_t page_size = 4096;
  int busy_timeout_ms = 5000;
  uint64_t max_page_count = 0;       // PRAGMA max_page_count when > 0 (a size limit of the database)
  uint64_t max_page_file_bytes = 0;  // size limit of the page file when > 0: a turn that would
                                     // grow it beyond fails as a full disk would (errc::io)
};

// Space used by the page file (`cedar sessions list`, compact_pages).
struct page_file_stats {
  std::string path;
  uint64_t file_bytes = 0;     // size on disk
  uint64_t live_bytes = 0;     // bytes of the pages some session references
  uint64_t dead_bytes = 0;     // bytes past the header that no row references (removed pages)
  uint64_t n_pages = 0;        // kv_pages rows with bytes in the file
  uint64_t n_lost_pages = 0;   // rows whose bytes were lost with a missing page file
};

// Where one page's bytes lie (tests, diagnostics).
struct page_location {
  std::string path;
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

struct checkpoint_info {
  uint32_t n_turns = 0;   // the checkpoint is the session after its first n_turns turns
  uint64_t n_tokens = 0;
  int64_t created_ms = 0;
};

// One loaded (or missing) page. `bytes` holds the whole page (header + payload) as stored.
struct loaded_page {
  uint32_t source_layer = 0;
  uint64_t first_entry = 0;
  uint32_t n_entries = 0;
  page_status status = page_status::ok;
  std::string detail;           // why, when status != ok
  std::vector<uint8_t> bytes;
  std::span<const uint8_t> main() const;   // [n_entries, main_entry_bytes]; empty unless ok
  std::span<const uint8_t> index() const;  // [n_entries, index_entry_bytes]; empty unless ok
  uint32_t main_entry_bytes = 0;
};

struct loaded_source {
  uint32_t source_layer = 0;
  uint64_t n_entries = 0;           // entries at the checkpoint
  std::vector<loaded_page> pages;   // in entry order; gaps appear as `missing` pages
  bool all_ok() const;
};

struct checkpoint_data {
  session_info session;
  checkpoint_info checkpoint;
  std::vector<int32_t> tokens;               // [0, checkpoint.n_tokens)
  std::vector<transcript_item> transcript;   // items of the checkpoint's turns
  std::vector<loaded_source> sources;        // ascending source_layer
  std::vector<aux_blob> aux;                 // ascending name
  std::vector<std::string> aux_errors;       // aux blobs failing their checksum (omitted from aux)
  bool all_pages_ok() const;                 // every page of every source is `ok`
};

struct load_options {
  bool with_pages = true;  // false: tokens, transcript and aux only (the reprefill path)
};

class store {
 public:
  // Opens or creates the store at `path`, migrating an older schema. Refuses a file from a
  // newer cedar (schema version), a file that is not a cedar store, or not SQLite at all.
  static result<std::unique_ptr<store>> open(const std::string& path, const store_options& opt = {});

  result<session_id> create_session(uint64_t model_hash, std::string_view agent,
                                    const page_geometry& geometry);
  result<turn_receipt> commit_turn(session_id id, const turn_write& turn);
  // done / failed / cancelled without a new turn.
  status finish_session(session_id id, session_status final_status);
  // A new session holding the parent's first `n_turns` turns; KV pages are shared, not copied.
  result<session_id> fork_session(session_id parent, uint32_t n_turns, std::string_view agent = {});
  // Deletes a session; pages still used by a fork stay (they are shared by reference). The
  // bytes of the pages it frees stay in the page file as dead bytes until compact_pages().
  status remove_session(session_id id);

  result<session_info> get_session(session_id id);
  result<std::vector<session_info>> list_sessions();
  result<std::vector<transcript_item>> transcript(session_id id);
  result<std::vector<int32_t>> tokens(session_id id,
                                      uint64_t end = std::numeric_limits<uint64_t>::max());
  result<std::vector<checkpoint_info>> checkpoints(session_id id);
  // The timings of the turns that recorded one, ascending turn.
  result<std::vector<turn_timing>> turn_timings(session_id id);
  // Records the options the session's agent was created with (a JSON object; replaces any
  // earlier ones). Opaque to the store; forks inherit them.
  status set_agent_options(session_id id, std::string_view options_json);
  // The latest checkpoint at or before `at_or_before_tokens`, with every page verified
  // (header, model hash, layout, checksum) and a per-page status.
  result<checkpoint_data> load_checkpoint(session_id id,
                                          uint64_t at_or_before_tokens = std::numeric_limits<uint64_t>::max(),
                                          const load_options& opt = {});

  // Checks the numbered invariants of store.cpp for one session (and the global ones); ok or an
  // errc::internal naming the broken invariant. Asserted after each commit in debug builds.
  status check_invariants(session_id id);
  // Checkpoints the WAL into the main file (TRUNCATE), e.g. before measuring the file size.
  status checkpoint_wal();
  // Bytes on disk: the main file, its -wal file and the page file.
  uint64_t file_bytes() const;
  const std::string& page_file_path() const { return page_path_; }
  result<page_file_stats> page_stats();
  // Rewrites the page file with only the live pages (dead bytes of removed sessions dropped):
  // a new file beside it, synced, then the rows re-pointed in one transaction, then renamed over
  // the old one (a crash at any point leaves the old or the new file in use, never a mix; open()
  // finishes an interrupted rename). Holds the write lock throughout. Returns the stats after.
  result<page_file_stats> compact_pages();
  const std::string& path() const { return db_.path(); }

  // The page references of a session, in (source, entry) order; `page_row` is the kv_pages
  // rowid (shared by forks). For the CLI and tests.
  struct page_ref {
    uint32_t source_layer = 0;
    uint64_t first_entry = 0;
    uint32_t n_entries = 0;
    uint32_t turn = 0;
    int64_t page_row = 0;
  };
  result<std::vector<page_ref>> page_refs(session_id id);
  // Where the bytes of kv_pages row `page_row` lie in the page file.
  result<page_location> locate_page(int64_t page_row);

 private:
  store() = default;
  status init(const std::string& path, const store_options& opt);
  status migrate();
  status move_blobs_to_page_file();
  status recover_page_file();
  status ensure_page_file();
  result<uint64_t> committed_end();
  status assert_invariants(session_id id);

  db db_;
  store_options opt_;
  std::string page_path_;  // <db path>.kvpages
  page_file pages_;
};

}  // namespace cedar::sessions
