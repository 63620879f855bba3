// sessions/sqlite_db — see sqlite_db.hpp. Error mapping and the RAII wrappers.
#include "sessions/sqlite_db.hpp"

#include <string>

namespace cedar::sessions {

errc errc_from_sqlite(int rc) {
  switch (rc & 0xff) {
    case SQLITE_NOTADB:
    case SQLITE_CORRUPT:
    case SQLITE_FORMAT: return errc::invalid_format;
    case SQLITE_FULL:
    case SQLITE_IOERR:
    case SQLITE_CANTOPEN:
    case SQLITE_READONLY:
    case SQLITE_PERM:
    case SQLITE_NOMEM: return errc::io;
    case SQLITE_BUSY:
    case SQLITE_LOCKED: return errc::unavailable;
    case SQLITE_CONSTRAINT:
    case SQLITE_MISMATCH:
    case SQLITE_RANGE:
    case SQLITE_TOOBIG: return errc::invalid_argument;
    case SQLITE_NOTFOUND: return errc::not_found;
    default: return errc::internal;
  }
}

error db::last_error(int rc, std::string_view what) const {
  int ext = h_ ? sqlite3_extended_errcode(h_) : rc;
  if (ext == SQLITE_OK) ext = rc;
  std::string msg = path_.empty() ? std::string("sqlite") : path_;
  msg += ": ";
  msg += what;
  msg += ": ";
  msg += h_ ? sqlite3_errmsg(h_) : sqlite3_errstr(rc);
  msg += " (";
  msg += sqlite3_errstr(ext);
  msg += ", code " + std::to_string(ext) + ")";
  return make_error(errc_from_sqlite(ext), std::move(msg));
}

db::~db() { close(); }

void db::close() {
  if (h_) {
    sqlite3_close_v2(h_);
    h_ = nullptr;
  }
}

status db::open(const std::string& path) {
  close();
  path_ = path;
  const int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX;
  int rc = sqlite3_open_v2(path.c_str(), &h_, flags, nullptr);
  if (rc != SQLITE_OK) {
    error e = last_error(rc, "cannot open the session store");
    close();
    return e;
  }
  sqlite3_extended_result_codes(h_, 1);
  return {};
}

result<stmt> db::prepare(std::string_view sql) const {
  stmt s;
  int rc = sqlite3_prepare_v2(h_, sql.data(), static_cast<int>(sql.size()), &s.s_, nullptr);
  if (rc != SQLITE_OK) return last_error(rc, "cannot prepare a statement");
  s.db_ = this;
  return s;
}

status db::exec(const char* sql) const {
  char* msg = nullptr;
  int rc = sqlite3_exec(h_, sql, nullptr, nullptr, &msg);
  sqlite3_free(msg);
  if (rc != SQLITE_OK) return last_error(rc, "cannot execute SQL");
  return {};
}

result<int64_t> db::query_int(const char* sql) const {
  auto s = prepare(sql);
  if (!s) return s.take_err();
  auto r = s->step();
  if (!r) return r.take_err();
  if (!*r) return make_error(errc::internal, path_ + ": no row from '" + sql + "'");
  return s->col_int(0);
}

stmt& stmt::operator=(stmt&& o) noexcept {
  if (this != &o) {
    if (s_) sqlite3_finalize(s_);
    s_ = o.s_;
    db_ = o.db_;
    o.s_ = nullptr;
  }
  return *this;
}

stmt::~stmt() {
  if (s_) sqlite3_finalize(s_);
}

stmt& stmt::bind(int i, int64_t v) {
  sqlite3_bind_int64(s_, i, v);
  return *this;
}
stmt& stmt::bind_real(int i, double v) {
  sqlite3_bind_double(s_, i, v);
  return *this;
}
stmt& stmt::bind(int i, std::string_view v) {
  sqlite3_bind_text(s_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
  return *this;
}
stmt& stmt::bind_blob(int i, std::span<const uint8_t> v) {
  // A zero-length span must still bind a BLOB (not NULL): SQLite binds NULL for a null pointer.
  static const uint8_t empty = 0;
  sqlite3_bind_blob64(s_, i, v.empty() ? &empty : v.data(), v.size(), SQLITE_TRANSIENT);
  return *this;
}
stmt& stmt::bind_blob_static(int i, std::span<const uint8_t> v) {
  static const uint8_t empty = 0;
  sqlite3_bind_blob64(s_, i, v.empty() ? &empty : v.data(), v.size(), SQLITE_STATIC);
  return *this;
}
stmt& stmt::bind_zeroblob(int i, int64_t n) {
  sqlite3_bind_zeroblob64(s_, i, static_cast<sqlite3_uint64>(n));
  return *this;
}
stmt& stmt::bind_null(int i) {
  sqlite3_bind_null(s_, i);
  return *this;
}

result<bool> stmt::step() {
  int rc = sqlite3_step(s_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  error e = db_->last_error(rc, "statement failed");
  sqlite3_reset(s_);
  return e;
}

status stmt::exec() {
  auto r = step();
  reset();
  if (!r) return r.take_err();
  return {};
}

void stmt::reset() {
  sqlite3_reset(s_);
  sqlite3_clear_bindings(s_);
}

std::string stmt::col_text(int c) const {
  const unsigned char* p = sqlite3_column_text(s_, c);
  int n = sqlite3_column_bytes(s_, c);
  return p ? std::string(reinterpret_cast<const char*>(p), static_cast<size_t>(n)) : std::string();
}

std::span<const uint8_t> stmt::col_blob(int c) const {
  const void* p = sqlite3_column_blob(s_, c);
  int n = sqlite3_column_bytes(s_, c);
  if (!p) return {};
  return {static_cast<const uint8_t*>(p), static_cast<size_t>(n)};
}

transaction::~transaction() {
  if (open_) sqlite3_exec(d_.handle(), "ROLLBACK", nullptr, nullptr, nullptr);
}

status transaction::begin() {
  CEDAR_TRY(d_.exec("BEGIN IMMEDIATE"));
  open_ = true;
  return {};
}

status transaction::commit() {
  status s = d_.exec("COMMIT");
  if (!s) return s;  // still open: the destructor rolls back
  open_ = false;
  return {};
}

}  // namespace cedar::sessions
