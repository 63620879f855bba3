// sessions/store_pages — the store's side of the page file (page_file.hpp): creating it in
// the schema-3 migration (moving the BLOB pages of an older store into it), recovering it on
// open (finishing or dropping an interrupted compaction, cutting an uncommitted tail, starting
// over when it is missing), reopening it when another process compacted it, and its space
// accounting and compaction. The write of a turn's pages is in commit_turn (store.cpp), whose
// diagram and invariants 9 and 10 describe the ordering these functions keep.
//
// Every function here runs inside a transaction of its caller or its own: the database's write
// lock also guards the page file's end.
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "kernels/base/log.hpp"
#include "sessions/store.hpp"

namespace cedar::sessions {
namespace {

int64_t as_i64(uint64_t v) { return std::bit_cast<int64_t>(v); }
uint64_t as_u64(int64_t v) { return std::bit_cast<uint64_t>(v); }

}  // namespace

// Schema 3 (inside migrate's transaction): a new page file, every page blob appended to it and
// its row re-pointed; one fdatasync before the COMMIT (invariant 9). A crash before the COMMIT
// leaves the database at version 2 with its blobs; the next open starts the file over.
status store::move_blobs_to_page_file() {
  const uint64_t file_id = new_page_file_id();
  auto f = page_file::create(page_path_, file_id);
  if (!f) return f.take_err();
  pages_ = std::move(*f);
  std::vector<int64_t> rows;
  {
    auto s = db_.prepare("SELECT id FROM kv_pages ORDER BY id");
    if (!s) return s.take_err();
    CEDAR_TRY(s->each([&](stmt& row) { rows.push_back(row.col_int(0)); }));
  }
  auto get = db_.prepare("SELECT bytes FROM kv_pages WHERE id=?");
  if (!get) return get.take_err();
  auto put = db_.prepare("UPDATE kv_pages SET file_offset=?, file_bytes=?, xxh64=?, bytes=? WHERE id=?");
  if (!put) return put.take_err();
  uint64_t end = page_file_header_bytes;
  for (int64_t row : rows) {
    get->bind(1, row);
    auto r = get->step();
    if (!r) return r.take_err();
    const auto b = get->col_blob(0);
    // The payload xxh64 as the header states it; a damaged page keeps its damage (the read
    // reports it), its row the checksum of what it holds.
    const decoded_header d = decode_page_header(b);
    const uint64_t xxh = d.status == page_status::ok
                             ? d.header.payload_xxh64
                             : checksum64(b.size() > page_header_bytes ? b.subspan(page_header_bytes)
                                                                       : std::span<const uint8_t>());
    const iovec part{const_cast<uint8_t*>(b.data()), b.size()};
    CEDAR_TRY(pages_.write_at(end, {&part, 1}));
    put->bind(1, static_cast<int64_t>(end)).bind(2, static_cast<int64_t>(b.size()));
    put->bind(3, as_i64(xxh)).bind_blob(4, {}).bind(5, row);
    end += b.size();
    get->reset();
    CEDAR_TRY(put->exec());
  }
  CEDAR_TRY(pages_.sync());
  auto ins = db_.prepare("INSERT INTO page_file(id, file_id) VALUES (1, ?)");
  if (!ins) return ins.take_err();
  ins->bind(1, as_i64(file_id));
  CEDAR_TRY(ins->exec());
  if (!rows.empty())
    CEDAR_LOG_INFO("%s: moved %zu KV pages (%llu bytes) from the database into %s", db_.path().c_str(),
                   rows.size(), static_cast<unsigned long long>(end - page_file_header_bytes),
                   page_path_.c_str());
  return {};
}

result<uint64_t> store::committed_end() {
  // Pages never overlap (invariant 10): the one at the highest offset ends last.
  auto s = db_.prepare(
      "SELECT file_offset + file_bytes FROM kv_pages WHERE file_offset IS NOT NULL "
      "ORDER BY file_offset DESC LIMIT 1");
  if (!s) return s.take_err();
  auto r = s->step();
  if (!r) return r.take_err();
  return *r ? static_cast<uint64_t>(s->col_int(0)) : page_file_header_bytes;
}

namespace {
result<uint64_t> db_page_file_id(const db& d) {
  auto s = d.prepare("SELECT file_id FROM page_file WHERE id=1");
  if (!s) return s.take_err();
  auto r = s->step();
  if (!r) return r.take_err();
  if (!*r) return make_error(errc::invalid_format, d.path() + ": the page_file row is missing");
  return as_u64(s->col_int(0));
}
}  // namespace

// The page file the database names is the one open (another process may have compacted it).
status store::ensure_page_file() {
  auto id = db_page_file_id(db_);
  if (!id) return id.take_err();
  if (pages_.is_open() && pages_.id() == *id) return {};
  auto f = page_file::open(page_path_, *id);
  if (!f) return f.take_err();
  pages_ = std::move(*f);
  return {};
}

// On open, under the write lock: finish or drop an interrupted compaction, then cut the file to
// the committed end (invariant 10). A missing page file loses the page bytes, not the sessions:
// a new file is started and the rows are marked lost (they load as missing pages and the
// executor re-prefills). A file of another store is refused, never overwritten.
status store::recover_page_file() {
  auto id = db_page_file_id(db_);
  if (!id) return id.take_err();
  const std::string compact_path = page_path_ + "-compact";
  if (auto cid = page_file::read_id(compact_path); cid.ok() || cid.err().code != errc::not_found) {
    if (cid.ok() && *cid == *id) {
      if (::rename(compact_path.c_str(), page_path_.c_str()) != 0)
        return make_error(errc::io, compact_path + ": cannot finish the compaction (rename to " + page_path_ +
                                        "): " + std::strerror(errno));
      CEDAR_TRY(sync_parent_dir(page_path_));
      CEDAR_LOG_INFO("%s: finished an interrupted compaction", page_path_.c_str());
    } else {
      std::remove(compact_path.c_str());  // an uncommitted compaction: the old file is in use
    }
  }
  pages_.close();
  auto f = page_file::open(page_path_, *id);
  if (!f) {
    if (f.err().code != errc::not_found) {
      error e = f.take_err();
      e.message += "; move it away to start a new page file (the sessions' KV pages will be re-prefilled)";
      return e;
    }
    const uint64_t new_id = new_page_file_id();
    auto c = page_file::create(page_path_, new_id);
    if (!c) return c.take_err();
    pages_ = std::move(*c);
    auto lost = db_.prepare("UPDATE kv_pages SET file_offset=NULL WHERE file_offset IS NOT NULL");
    if (!lost) return lost.take_err();
    CEDAR_TRY(lost->exec());
    const int changed = sqlite3_changes(db_.handle());
    auto up = db_.prepare("UPDATE page_file SET file_id=? WHERE id=1");
    if (!up) return up.take_err();
    up->bind(1, as_i64(new_id));
    CEDAR_TRY(up->exec());
    if (changed > 0)
      CEDAR_LOG_WARN("%s: page file missing; %d KV pages are lost and their sessions will re-prefill",
                     page_path_.c_str(), changed);
    return {};
  }
  pages_ = std::move(*f);
  auto end = committed_end();
  if (!end) return end.take_err();
  auto size = pages_.size();
  if (!size) return size.take_err();
  if (*size > *end) {
    CEDAR_TRY(pages_.truncate(*end));
    CEDAR_TRY(pages_.sync());
  } else if (*size < *end) {
    CEDAR_LOG_WARN("%s: %llu bytes, shorter than its committed pages (%llu): pages past the end "
                   "will load as truncated", page_path_.c_str(), static_cast<unsigned long long>(*size),
                   static_cast<unsigned long long>(*end));
  }
  return {};
}

// ── Page file: location, space, compaction ───────────────────────────────────────────────

result<page_location> store::locate_page(int64_t page_row) {
  auto s = db_.prepare("SELECT file_offset, file_bytes FROM kv_pages WHERE id=?");
  if (!s) return s.take_err();
  s->bind(1, page_row);
  auto r = s->step();
  if (!r) return r.take_err();
  if (!*r || s->col_is_null(0))
    return make_error(errc::not_found, db_.path() + ": kv_pages row " + std::to_string(page_row) +
                                           (*r ? " has no bytes in the page file" : " does not exist"));
  return page_location{page_path_, static_cast<uint64_t>(s->col_int(0)), static_cast<uint64_t>(s->col_int(1))};
}

result<page_file_stats> store::page_stats() {
  CEDAR_TRY(ensure_page_file());
  page_file_stats out;
  out.path = page_path_;
  auto size = pages_.size();
  if (!size) return size.take_err();
  out.file_bytes = *size;
  auto s = db_.prepare(
      "SELECT COUNT(file_offset), COALESCE(SUM(file_bytes) FILTER (WHERE file_offset IS NOT NULL), 0), "
      "COUNT(*) - COUNT(file_offset) FROM kv_pages");
  if (!s) return s.take_err();
  auto r = s->step();
  if (!r) return r.take_err();
  out.n_pages = static_cast<uint64_t>(s->col_int(0));
  out.live_bytes = static_cast<uint64_t>(s->col_int(1));
  out.n_lost_pages = static_cast<uint64_t>(s->col_int(2));
  // Dead: every byte past the header that no row references (removed sessions' pages, and a
  // tail past the committed end that the next turn overwrites or the next open cuts off).
  const uint64_t used = out.file_bytes > page_file_header_bytes ? out.file_bytes - page_file_header_bytes : 0;
  out.dead_bytes = used > out.live_bytes ? used - out.live_bytes : 0;
  return out;
}

result<page_file_stats> store::compact_pages() {
  const std::string compact_path = page_path_ + "-compact";
  {
    transaction tx(db_);
    CEDAR_TRY(tx.begin());
    CEDAR_TRY(ensure_page_file());
    struct live_page {
      int64_t row;
      uint64_t offset, bytes;
    };
    std::vector<live_page> live;
    {
      auto s = db_.prepare(
          "SELECT id, file_offset, file_bytes FROM kv_pages WHERE file_offset IS NOT NULL ORDER BY file_offset");
      if (!s) return s.take_err();
      CEDAR_TRY(s->each([&](stmt& row) {
        live.push_back(
            {row.col_int(0), static_cast<uint64_t>(row.col_int(1)), static_cast<uint64_t>(row.col_int(2))});
      }));
    }
    // 1. The live pages, back to back, into a new file with a new id; synced (invariant 9).
    const uint64_t new_id = new_page_file_id();
    auto nf = page_file::create(compact_path, new_id);
    if (!nf) return nf.take_err();
    struct drop_file {
      const std::string& path;
      bool armed = true;
      ~drop_file() {
        if (armed) std::remove(path.c_str());
      }
    } drop{compact_path};
    auto up = db_.prepare("UPDATE kv_pages SET file_offset=? WHERE id=?");
    if (!up) return up.take_err();
    std::vector<uint8_t> buf;
    uint64_t at = page_file_header_bytes;
    for (const live_page& p : live) {
      buf.resize(static_cast<size_t>(p.bytes));
      auto got = pages_.read_at(p.offset, buf.data(), p.bytes);
      if (!got) return got.take_err();
      if (*got != p.bytes)
        return make_error(errc::io, pages_.path() + ": kv_pages row " + std::to_string(p.row) + " at offset " +
                                        std::to_string(p.offset) + " is cut short by the end of the file; "
                                        "compaction stopped, nothing changed");
      const iovec part{buf.data(), buf.size()};
      CEDAR_TRY(nf->write_at(at, {&part, 1}));
      up->bind(1, static_cast<int64_t>(at)).bind(2, p.row);
      CEDAR_TRY(up->exec());
      at += p.bytes;
    }
    if (opt_.max_page_file_bytes > 0 && at > opt_.max_page_file_bytes)
      return make_error(errc::io, compact_path + ": page file full: compaction needs " + std::to_string(at) +
                                      " bytes, over the size limit");
    CEDAR_TRY(nf->sync());
    // 2. The rows point into the new file, which the database now names.
    auto fid = db_.prepare("UPDATE page_file SET file_id=? WHERE id=1");
    if (!fid) return fid.take_err();
    fid->bind(1, as_i64(new_id));
    CEDAR_TRY(fid->exec());
    CEDAR_TRY(tx.commit());
    drop.armed = false;
    // 3. The new file takes the old one's name (open() finishes this step after a crash).
    if (::rename(compact_path.c_str(), page_path_.c_str()) != 0)
      return make_error(errc::io, compact_path + ": compaction committed but the rename to " + page_path_ +
                                      " failed (" + std::strerror(errno) + "); the next open finishes it");
    CEDAR_TRY(sync_parent_dir(page_path_));
    nf->close();
    auto f = page_file::open(page_path_, new_id);
    if (!f) return f.take_err();
    pages_ = std::move(*f);
  }
  return page_stats();
}

}  // namespace cedar::sessions
