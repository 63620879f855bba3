// sessions/page_file — the append-only file that holds the bytes of the KV pages
// (`<db>.kvpages` beside the SQLite database). The database is its index and the source of truth
// for what is committed: a kv_pages row holds (file_offset, file_bytes, xxh64) of one page.
//
// Owns: one file descriptor. Does not: decide where to write (the store appends at the end of
// the last committed page, under the database's write lock), know the page format beyond its
// own 64-byte file header (pages are opaque byte ranges; store.cpp verifies them on read).
//
// Layout (little-endian; HOUSE_STYLE 8):
//   off size field
//     0   8  magic           "CEDRKVPF"
//     8   4  format_version  1
//    12   4  header_bytes    64
//    16   8  file_id         random; equals page_file.file_id in the database that owns the file
//                            (a page file of another store, or one left by an unfinished
//                            compaction, is told apart by it)
//    24  32  reserved        0
//    56   8  header_xxh64    xxh64(seed 0) of bytes [0, 56)
//    64 ...  pages           each a whole page_format page, back to back; bytes that no row
//                            references are dead (removed sessions) until compaction
//
// Threading: one owner (the store). Errors name the file and the failing call.
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <span>
#include <string>

#include "kernels/base/result.hpp"

namespace cedar::sessions {

inline constexpr uint64_t page_file_header_bytes = 64;
inline constexpr uint32_t page_file_version = 1;

class page_file {
 public:
  page_file() = default;
  page_file(const page_file&) = delete;
  page_file& operator=(const page_file&) = delete;
  page_file(page_file&& o) noexcept;
  page_file& operator=(page_file&& o) noexcept;
  ~page_file();

  // Creates (or truncates) the file at `path` holding only a header with `file_id`; the header
  // and the directory entry are synced before it returns.
  static result<page_file> create(const std::string& path, uint64_t file_id);
  // Opens an existing page file; its header must be valid and carry `expected_id`.
  // errc::not_found when there is no file; errc::mismatch when it belongs to another store.
  static result<page_file> open(const std::string& path, uint64_t expected_id);
  // The file id in the header of the file at `path` (errc::not_found / invalid_format).
  static result<uint64_t> read_id(const std::string& path);

  bool is_open() const { return fd_ >= 0; }
  uint64_t id() const { return id_; }
  const std::string& path() const { return path_; }

  result<uint64_t> size() const;
  // Writes `parts` back to back starting at `offset` (pwritev, repeated on short writes).
  status write_at(uint64_t offset, std::span<const iovec> parts);
  // fdatasync: the written bytes (and the file size) are on the disk when it returns.
  status sync();
  status truncate(uint64_t size);
  // Reads up to `n` bytes at `offset` into `out`; returns how many were read (short at EOF).
  result<uint64_t> read_at(uint64_t offset, uint8_t* out, uint64_t n) const;
  void close();

 private:
  int fd_ = -1;
  uint64_t id_ = 0;
  std::string path_;
};

// A fresh random file id (never 0).
uint64_t new_page_file_id();

// fsync of the directory that holds `path` (after creating or renaming a file in it).
status sync_parent_dir(const std::string& path);

}  // namespace cedar::sessions
