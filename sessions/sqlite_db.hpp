// sessions/sqlite_db — a thin RAII layer over the SQLite C API, used only by the session store.
//
// Owns: one sqlite3* connection (`db`) and prepared statements (`stmt`). Every value reaches SQL
// through sqlite3_bind_*; no SQL text is ever built from values. Errors come back as
// cedar::error with the SQLite message, the extended result code and the database path, so a
// user sees "sessions.db: database or disk is full (SQLITE_FULL)" rather than a bare code.
// Does not: know the schema (store.cpp does), retry on SQLITE_BUSY beyond the busy timeout.
// Threading: a db and its statements belong to one thread at a time (the store actor).
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "kernels/base/result.hpp"

namespace cedar::sessions {

class db;

// One prepared statement. Reset and cleared bindings on every `reset()`; finalized on
// destruction. Column/bind indices follow SQLite: bind from 1, columns from 0.
class stmt {
 public:
  stmt() = default;
  stmt(const stmt&) = delete;
  stmt& operator=(const stmt&) = delete;
  stmt(stmt&& o) noexcept : s_(o.s_), db_(o.db_) { o.s_ = nullptr; }
  stmt& operator=(stmt&& o) noexcept;
  ~stmt();

  stmt& bind(int i, int64_t v);
  stmt& bind(int i, std::string_view v);           // TEXT (copied by SQLite)
  stmt& bind_blob(int i, std::span<const uint8_t> v);  // BLOB (copied by SQLite)
  // BLOB not copied: `v` must outlive the statement's next step/reset.
  stmt& bind_blob_static(int i, std::span<const uint8_t> v);
  stmt& bind_zeroblob(int i, int64_t n);
  stmt& bind_null(int i);
  stmt& bind_real(int i, double v);  // REAL (a name apart: an overload of bind would make
                                     // bind(i, uint32_t) ambiguous)

  // Runs one step: true when a row is available, false when done; an error otherwise.
  result<bool> step();
  // Steps through every row, calling `row(*this)` on each. `row` returns nothing, or a status
  // whose error ends the walk; SQLite's errors end it too.
  template <class F>
  status each(F&& row);
  // Runs to completion, expecting no rows.
  status exec();
  void reset();

  int64_t col_int(int c) const { return sqlite3_column_int64(s_, c); }
  bool col_is_null(int c) const { return sqlite3_column_type(s_, c) == SQLITE_NULL; }
  double col_real(int c) const { return sqlite3_column_double(s_, c); }
  std::string col_text(int c) const;
  std::span<const uint8_t> col_blob(int c) const;  // valid until the next step/reset

 private:
  friend class db;
  sqlite3_stmt* s_ = nullptr;
  const db* db_ = nullptr;
};

template <class F>
status stmt::each(F&& row) {
  for (;;) {
    auto r = step();
    if (!r) return r.take_err();
    if (!*r) return {};
    if constexpr (std::is_void_v<std::invoke_result_t<F&, stmt&>>) {
      row(*this);
    } else {
      CEDAR_TRY(row(*this));
    }
  }
}

class db {
 public:
  db() = default;
  db(const db&) = delete;
  db& operator=(const db&) = delete;
  ~db();

  // Opens (creating if absent) the file at `path`.
  status open(const std::string& path);
  void close();
  bool is_open() const { return h_ != nullptr; }

  result<stmt> prepare(std::string_view sql) const;
  // Runs constant SQL (schema, pragmas) that carries no values.
  status exec(const char* sql) const;
  // Runs a pragma that returns a single integer row, e.g. "PRAGMA user_version".
  result<int64_t> query_int(const char* sql) const;

  int64_t last_rowid() const { return sqlite3_last_insert_rowid(h_); }
  sqlite3* handle() const { return h_; }
  const std::string& path() const { return path_; }

  // Builds an error from the connection's last failure (or `rc` when there is none).
  error last_error(int rc, std::string_view what) const;

 private:
  sqlite3* h_ = nullptr;
  std::string path_;
};

// Maps an SQLite primary result code to a cedar error class.
errc errc_from_sqlite(int rc);

// RAII transaction: BEGIN IMMEDIATE on begin(), ROLLBACK on destruction unless committed.
class transaction {
 public:
  explicit transaction(const db& d) : d_(d) {}
  transaction(const transaction&) = delete;
  transaction& operator=(const transaction&) = delete;
  ~transaction();
  status begin();
  status commit();

 private:
  const db& d_;
  bool open_ = false;
};

}  // namespace cedar::sessions
