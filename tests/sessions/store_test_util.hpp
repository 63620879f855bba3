// Shared helpers of the session store tests: a temporary directory that removes itself, and
// deterministic synthetic turns (tokens, transcript items, FP4-shaped pages, aux blobs) that a
// test can regenerate to check what it reads back byte for byte.
//
// Pages have the official DeepSeek-V4.1 shape (MODEL_SPEC §3): 288 B main entry + 68 B index
// key; 4 KV sources, layers 2, 8, 14 at compress ratio 2 and layer 20 at ratio 1. The bytes are
// a hash of (seed, source, entry, byte), never zeros.
#pragma once

#include <fcntl.h>
#include <sqlite3.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "sessions/store.hpp"

namespace cedar::sessions::test {

inline constexpr page_geometry official_geometry{512, 128, 288, 68};
inline constexpr uint32_t source_layers[4] = {2, 8, 14, 20};
inline constexpr uint32_t source_ratio[4] = {2, 2, 2, 1};

inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

class temp_dir {
 public:
  temp_dir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/cedar-sessions-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    const char* p = ::mkdtemp(buf.data());
    path_ = p ? p : "";
  }
  ~temp_dir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Entry bytes of one source: [n, bytes_per_entry], value = hash(seed, layer, entry, byte, part).
inline std::vector<uint8_t> entry_bytes(uint64_t seed, uint32_t layer, uint64_t first, uint32_t n,
                                        uint32_t bytes_per_entry, uint32_t part) {
  std::vector<uint8_t> out(uint64_t{n} * bytes_per_entry);
  for (uint32_t e = 0; e < n; ++e) {
    uint64_t h = mix64(seed ^ (uint64_t{layer} << 48) ^ ((first + e) << 8) ^ part);
    for (uint32_t b = 0; b < bytes_per_entry; ++b) {
      if (b % 8 == 0) h = mix64(h + b);
      out[uint64_t{e} * bytes_per_entry + b] = static_cast<uint8_t>(h >> (8 * (b % 8)));
    }
  }
  return out;
}

// One synthetic turn that owns its bytes; `write()` gives the views commit_turn takes.
struct synthetic_turn {
  std::vector<int32_t> tokens;
  std::vector<item_write> items;
  std::vector<std::vector<uint8_t>> main, index;
  std::vector<page_write> pages;
  std::vector<std::vector<uint8_t>> aux_bytes;
  std::vector<aux_write> aux;
  session_status status_after = session_status::active;

  turn_write write() const {
    turn_write w;
    w.items = items;
    w.tokens = tokens;
    w.pages = pages;
    w.aux = aux;
    w.status_after = status_after;
    return w;
  }
};

// Entries a source holds after n tokens (ratio-2 sources only complete groups).
inline uint64_t entries_at(uint64_t n_tokens, uint32_t ratio) { return n_tokens / ratio; }

// Turn `turn` of a session whose log holds `n_before` tokens: `n_new` tokens, two items, the
// new entries of each source as one page, and two aux blobs. Same inputs, same bytes.
inline synthetic_turn make_turn(uint64_t seed, uint32_t turn, uint64_t n_before, uint32_t n_new,
                                const page_geometry& g = official_geometry) {
  synthetic_turn t;
  for (uint32_t i = 0; i < n_new; ++i)
    t.tokens.push_back(static_cast<int32_t>(mix64(seed + n_before + i) % 129280));
  const uint64_t n_after = n_before + n_new;
  const uint64_t mid = n_before + n_new / 2;
  t.items.push_back({item_kind::user,
                     "{\"turn\":" + std::to_string(turn) + ",\"text\":\"tool result \\\"" +
                         std::to_string(seed) + "\\\"\"}",
                     n_before, mid});
  t.items.push_back({item_kind::assistant, "{\"content\":\"answer " + std::to_string(turn) + "\"}",
                     mid, n_after});
  t.main.reserve(4);
  t.index.reserve(4);
  for (int s = 0; s < 4; ++s) {
    const uint64_t first = entries_at(n_before, source_ratio[s]);
    const uint32_t n = static_cast<uint32_t>(entries_at(n_after, source_ratio[s]) - first);
    t.main.push_back(entry_bytes(seed, source_layers[s], first, n, g.main_entry_bytes, 0));
    t.index.push_back(entry_bytes(seed, source_layers[s], first, n, g.index_entry_bytes, 1));
    t.pages.push_back({source_layers[s], first, n, t.main.back(), t.index.back()});
  }
  t.aux_bytes.push_back(entry_bytes(seed, 99, n_after, 1, 3 * 4096, 2));  // compressor pending
  t.aux_bytes.push_back(entry_bytes(seed, 98, n_after, 1, 12, 3));       // engram history
  t.aux.push_back({"compressor.pending", t.aux_bytes[0]});
  t.aux.push_back({"engram.history", t.aux_bytes[1]});
  return t;
}

// Runs a raw SQL statement on a store file through its own connection (fault injection).
inline int raw_exec(const std::string& path, const std::string& sql) {
  sqlite3* h = nullptr;
  int rc = sqlite3_open(path.c_str(), &h);
  if (rc == SQLITE_OK) rc = sqlite3_exec(h, sql.c_str(), nullptr, nullptr, nullptr);
  sqlite3_close(h);
  return rc;
}

inline int64_t raw_int(const std::string& path, const std::string& sql) {
  sqlite3* h = nullptr;
  int64_t v = -1;
  if (sqlite3_open(path.c_str(), &h) == SQLITE_OK) {
    sqlite3_stmt* s = nullptr;
    if (sqlite3_prepare_v2(h, sql.c_str(), -1, &s, nullptr) == SQLITE_OK && sqlite3_step(s) == SQLITE_ROW)
      v = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
  }
  sqlite3_close(h);
  return v;
}

// Reads or rewrites bytes of the page file in place (a disk fault, as another process would).
inline std::vector<uint8_t> read_at(const std::string& path, uint64_t offset, uint64_t n) {
  std::vector<uint8_t> out(n);
  const int fd = ::open(path.c_str(), O_RDONLY);
  const ssize_t got = fd >= 0 ? ::pread(fd, out.data(), n, static_cast<off_t>(offset)) : -1;
  if (fd >= 0) ::close(fd);
  out.resize(got > 0 ? static_cast<size_t>(got) : 0);
  return out;
}
inline bool write_at(const std::string& path, uint64_t offset, const std::vector<uint8_t>& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY);
  const ssize_t n = fd >= 0 ? ::pwrite(fd, bytes.data(), bytes.size(), static_cast<off_t>(offset)) : -1;
  if (fd >= 0) ::close(fd);
  return n == static_cast<ssize_t>(bytes.size());
}
inline uint64_t size_of(const std::string& path) {
  std::error_code ec;
  const auto n = std::filesystem::file_size(path, ec);
  return ec ? 0 : static_cast<uint64_t>(n);
}

// Turns a closed schema-3 store back into what cedar wrote at schema version 2: every page's
// bytes back inline in kv_pages.bytes, the page-file columns, index and table gone, no page file.
// Returns false (with nothing guaranteed) when a step fails.
inline bool downgrade_to_schema2(const std::string& path) {
  const std::string pages = path + ".kvpages";
  sqlite3* h = nullptr;
  if (sqlite3_open(path.c_str(), &h) != SQLITE_OK) return false;
  bool ok = sqlite3_exec(h, "BEGIN", nullptr, nullptr, nullptr) == SQLITE_OK;
  std::vector<std::array<int64_t, 3>> rows;  // id, offset, bytes
  sqlite3_stmt* s = nullptr;
  ok = ok && sqlite3_prepare_v2(h, "SELECT id, file_offset, file_bytes FROM kv_pages", -1, &s, nullptr) == SQLITE_OK;
  while (ok && sqlite3_step(s) == SQLITE_ROW)
    rows.push_back({sqlite3_column_int64(s, 0), sqlite3_column_int64(s, 1), sqlite3_column_int64(s, 2)});
  sqlite3_finalize(s);
  s = nullptr;
  ok = ok && sqlite3_prepare_v2(h, "UPDATE kv_pages SET bytes=? WHERE id=?", -1, &s, nullptr) == SQLITE_OK;
  for (const auto& r : rows) {
    if (!ok) break;
    const auto b = read_at(pages, static_cast<uint64_t>(r[1]), static_cast<uint64_t>(r[2]));
    sqlite3_bind_blob64(s, 1, b.data(), b.size(), SQLITE_TRANSIENT);
    sqlite3_bind_int64(s, 2, r[0]);
    ok = sqlite3_step(s) == SQLITE_DONE && b.size() == static_cast<uint64_t>(r[2]);
    sqlite3_reset(s);
  }
  sqlite3_finalize(s);
  ok = ok && sqlite3_exec(h,
                          "DROP INDEX kv_pages_by_offset; ALTER TABLE kv_pages DROP COLUMN file_offset; "
                          "ALTER TABLE kv_pages DROP COLUMN file_bytes; ALTER TABLE kv_pages DROP COLUMN xxh64; "
                          "DROP TABLE page_file; PRAGMA user_version=2; COMMIT",
                          nullptr, nullptr, nullptr) == SQLITE_OK;
  sqlite3_close(h);
  std::remove(pages.c_str());
  return ok;
}

}  // namespace cedar::sessions::test
