// sessions/page_file — see page_file.hpp. POSIX file I/O with errno turned into errors that
// name the file, the call and the offset.
#include "sessions/page_file.hpp"

#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "sessions/page_format.hpp"
#include "sessions/le_bytes.hpp"

namespace cedar::sessions {
namespace {

using namespace le;

constexpr char file_magic[8] = {'C', 'E', 'D', 'R', 'K', 'V', 'P', 'F'};

error io_error(const std::string& path, const std::string& what, int err) {
  // ENOSPC / EFBIG / EDQUOT read as "full" to a user: say it in those words.
  std::string msg = path + ": " + what + ": " + std::strerror(err);
  if (err == ENOSPC || err == EFBIG || err == EDQUOT) msg += " (disk or file size limit full)";
  return make_error(errc::io, std::move(msg));
}

void encode_file_header(uint64_t file_id, uint8_t out[page_file_header_bytes]) {
  std::memset(out, 0, page_file_header_bytes);
  std::memcpy(out, file_magic, 8);
  put_u32(out + 8, page_file_version);
  put_u32(out + 12, static_cast<uint32_t>(page_file_header_bytes));
  put_u64(out + 16, file_id);
  put_u64(out + 56, checksum64({out, 56}));
}

// The id of a header, or why it is not a page file header.
result<uint64_t> decode_file_header(const std::string& path, std::span<const uint8_t> h) {
  if (h.size() < page_file_header_bytes)
    return make_error(errc::invalid_format, path + ": not a cedar page file (" + std::to_string(h.size()) +
                                                " bytes, shorter than its 64-byte header)");
  if (std::memcmp(h.data(), file_magic, 8) != 0)
    return make_error(errc::invalid_format, path + ": not a cedar page file (bad magic)");
  if (get_u64(h.data() + 56) != checksum64(h.first(56)))
    return make_error(errc::invalid_format, path + ": page file header fails its xxh64");
  if (get_u32(h.data() + 8) != page_file_version)
    return make_error(errc::mismatch, path + ": page file format version " +
                                          std::to_string(get_u32(h.data() + 8)) + ", this cedar reads " +
                                          std::to_string(page_file_version));
  if (get_u32(h.data() + 12) != page_file_header_bytes)
    return make_error(errc::invalid_format, path + ": page file header_bytes is not 64");
  return get_u64(h.data() + 16);
}

}  // namespace

uint64_t new_page_file_id() {
  std::random_device rd;
  uint64_t v = (uint64_t{rd()} << 32) ^ rd() ^
               static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  v ^= static_cast<uint64_t>(::getpid()) << 17;
  return v == 0 ? 1 : v;
}

status sync_parent_dir(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  const std::string dir = parent.empty() ? std::string(".") : parent.string();
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return io_error(dir, "cannot open the directory to sync it", errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return io_error(dir, "fsync of the directory failed", err);
  return {};
}

page_file::page_file(page_file&& o) noexcept : fd_(o.fd_), id_(o.id_), path_(std::move(o.path_)) {
  o.fd_ = -1;
}

page_file& page_file::operator=(page_file&& o) noexcept {
  if (this != &o) {
    close();
    fd_ = o.fd_;
    id_ = o.id_;
    path_ = std::move(o.path_);
    o.fd_ = -1;
  }
  return *this;
}

page_file::~page_file() { close(); }

void page_file::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

result<page_file> page_file::create(const std::string& path, uint64_t file_id) {
  page_file f;
  f.path_ = path;
  f.id_ = file_id;
  f.fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (f.fd_ < 0) return io_error(path, "cannot create the page file", errno);
  uint8_t h[page_file_header_bytes];
  encode_file_header(file_id, h);
  const iovec part{h, sizeof h};
  CEDAR_TRY(f.write_at(0, {&part, 1}));
  CEDAR_TRY(f.sync());
  CEDAR_TRY(sync_parent_dir(path));
  return f;
}

result<uint64_t> page_file::read_id(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return make_error(errc::not_found, path + ": no page file");
    return io_error(path, "cannot open the page file", errno);
  }
  uint8_t h[page_file_header_bytes];
  const ssize_t n = ::pread(fd, h, sizeof h, 0);
  const int err = errno;
  ::close(fd);
  if (n < 0) return io_error(path, "cannot read the page file header", err);
  return decode_file_header(path, {h, static_cast<size_t>(n)});
}

result<page_file> page_file::open(const std::string& path, uint64_t expected_id) {
  page_file f;
  f.path_ = path;
  f.fd_ = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (f.fd_ < 0) {
    if (errno == ENOENT) return make_error(errc::not_found, path + ": no page file");
    return io_error(path, "cannot open the page file", errno);
  }
  uint8_t h[page_file_header_bytes];
  auto n = f.read_at(0, h, sizeof h);
  if (!n) return n.take_err();
  auto id = decode_file_header(path, {h, static_cast<size_t>(*n)});
  if (!id) return id.take_err();
  if (*id != expected_id)
    return make_error(errc::mismatch, path + ": page file of another store (file id " + std::to_string(*id) +
                                          ", the database expects " + std::to_string(expected_id) + ")");
  f.id_ = *id;
  return f;
}

result<uint64_t> page_file::size() const {
  struct stat st;
  if (::fstat(fd_, &st) != 0) return io_error(path_, "fstat failed", errno);
  return static_cast<uint64_t>(st.st_size);
}

status page_file::write_at(uint64_t offset, std::span<const iovec> parts) {
  std::vector<iovec> left(parts.begin(), parts.end());
  size_t first = 0;
  while (first < left.size()) {
    if (left[first].iov_len == 0) {
      ++first;
      continue;
    }
    const int count = static_cast<int>(std::min<size_t>(left.size() - first, IOV_MAX));
    const ssize_t n = ::pwritev(fd_, left.data() + first, count, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return io_error(path_, "cannot write at offset " + std::to_string(offset), errno);
    }
    if (n == 0) return io_error(path_, "write at offset " + std::to_string(offset) + " made no progress", EIO);
    offset += static_cast<uint64_t>(n);
    for (size_t done = static_cast<size_t>(n); done > 0 && first < left.size();) {
      const size_t k = std::min(done, left[first].iov_len);
      left[first].iov_base = static_cast<uint8_t*>(left[first].iov_base) + k;
      left[first].iov_len -= k;
      done -= k;
      if (left[first].iov_len == 0) ++first;
    }
  }
  return {};
}

status page_file::sync() {
  if (::fdatasync(fd_) != 0) return io_error(path_, "fdatasync failed", errno);
  return {};
}

status page_file::truncate(uint64_t size) {
  if (::ftruncate(fd_, static_cast<off_t>(size)) != 0)
    return io_error(path_, "cannot truncate to " + std::to_string(size) + " bytes", errno);
  return {};
}

result<uint64_t> page_file::read_at(uint64_t offset, uint8_t* out, uint64_t n) const {
  uint64_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd_, out + got, static_cast<size_t>(n - got), static_cast<off_t>(offset + got));
    if (r < 0) {
      if (errno == EINTR) continue;
      return io_error(path_, "cannot read at offset " + std::to_string(offset + got), errno);
    }
    if (r == 0) break;
    got += static_cast<uint64_t>(r);
  }
  return got;
}

}  // namespace cedar::sessions
