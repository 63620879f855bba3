// sessions/page_format — see page_format.hpp for the byte layout and its invariants.
#include "sessions/page_format.hpp"

#include <xxhash.h>

#include <cstdio>
#include <cstring>

#include "sessions/le_bytes.hpp"

namespace cedar::sessions {
namespace {

using namespace le;

std::string hex64(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

const char* page_status_name(page_status s) {
  switch (s) {
    case page_status::ok: return "ok";
    case page_status::missing: return "missing";
    case page_status::truncated: return "truncated";
    case page_status::bad_header: return "bad_header";
    case page_status::model_mismatch: return "model_mismatch";
    case page_status::layout_mismatch: return "layout_mismatch";
    case page_status::checksum: return "checksum";
  }
  return "unknown";
}

uint64_t checksum64(std::span<const uint8_t> bytes) { return XXH64(bytes.data(), bytes.size(), 0); }

void encode_page_header(const page_header& h, uint8_t out[page_header_bytes]) {
  std::memset(out, 0, page_header_bytes);
  put_u32(out + 0, page_magic);
  put_u16(out + 4, page_format_version);
  put_u16(out + 6, static_cast<uint16_t>(page_header_bytes));
  put_u64(out + 8, h.model_hash);
  put_u32(out + 16, h.source_layer);
  put_u16(out + 20, h.geometry.main_dims);
  put_u16(out + 22, h.geometry.index_dims);
  put_u32(out + 24, h.geometry.main_entry_bytes);
  put_u32(out + 28, h.geometry.index_entry_bytes);
  put_u64(out + 32, h.first_entry);
  put_u32(out + 40, h.n_entries);
  put_u32(out + 44, 0);
  put_u64(out + 48, h.payload_xxh64);
  put_u64(out + 56, XXH64(out, 56, 0));
}

result<std::vector<uint8_t>> encode_page(page_header h, std::span<const uint8_t> main,
                                         std::span<const uint8_t> index) {
  const uint64_t want_main = uint64_t{h.n_entries} * h.geometry.main_entry_bytes;
  const uint64_t want_index = uint64_t{h.n_entries} * h.geometry.index_entry_bytes;
  if (main.size() != want_main || index.size() != want_index)
    return make_error(errc::invalid_argument,
                      "kv page (source layer " + std::to_string(h.source_layer) + "): expected " +
                          std::to_string(want_main) + " main + " + std::to_string(want_index) +
                          " index bytes for " + std::to_string(h.n_entries) + " entries, got " +
                          std::to_string(main.size()) + " + " + std::to_string(index.size()));
  std::vector<uint8_t> out(page_header_bytes + main.size() + index.size());
  if (!main.empty()) std::memcpy(out.data() + page_header_bytes, main.data(), main.size());
  if (!index.empty())
    std::memcpy(out.data() + page_header_bytes + main.size(), index.data(), index.size());
  h.payload_xxh64 = XXH64(out.data() + page_header_bytes, main.size() + index.size(), 0);
  encode_page_header(h, out.data());
  return out;
}

decoded_header decode_page_header(std::span<const uint8_t> bytes) {
  decoded_header d;
  if (bytes.size() < page_header_bytes) {
    d.status = page_status::truncated;
    d.detail = "page is " + std::to_string(bytes.size()) + " bytes, shorter than its " +
               std::to_string(page_header_bytes) + "-byte header";
    return d;
  }
  const uint8_t* p = bytes.data();
  if (get_u32(p) != page_magic) {
    d.status = page_status::bad_header;
    d.detail = "bad magic " + hex64(get_u32(p)) + " (expected 'CKVP')";
    return d;
  }
  if (get_u64(p + 56) != XXH64(p, 56, 0)) {
    d.status = page_status::bad_header;
    d.detail = "header checksum mismatch";
    return d;
  }
  const uint16_t version = get_u16(p + 4);
  if (version != page_format_version || get_u16(p + 6) != page_header_bytes || get_u32(p + 44) != 0) {
    d.status = page_status::bad_header;
    d.detail = "page format version " + std::to_string(version) + " (header " +
               std::to_string(get_u16(p + 6)) + " B) is not supported; this cedar reads version " +
               std::to_string(page_format_version);
    return d;
  }
  page_header& h = d.header;
  h.model_hash = get_u64(p + 8);
  h.source_layer = get_u32(p + 16);
  h.geometry.main_dims = get_u16(p + 20);
  h.geometry.index_dims = get_u16(p + 22);
  h.geometry.main_entry_bytes = get_u32(p + 24);
  h.geometry.index_entry_bytes = get_u32(p + 28);
  h.first_entry = get_u64(p + 32);
  h.n_entries = get_u32(p + 40);
  h.payload_xxh64 = get_u64(p + 48);
  if (h.geometry.main_entry_bytes == 0) {
    d.status = page_status::bad_header;
    d.detail = "main_entry_bytes is 0";
  }
  // entry_bytes (< 2^33) x n_entries (< 2^32) can wrap around 2^64 to a small total that a short
  // buffer matches; the views verify_page derives from it would then lie outside the buffer.
  uint64_t payload = 0;
  if (__builtin_mul_overflow(h.geometry.entry_bytes(), uint64_t{h.n_entries}, &payload) ||
      payload > UINT64_MAX - page_header_bytes) {
    d.status = page_status::bad_header;
    d.detail = "page size overflows: " + std::to_string(h.n_entries) + " entries of " +
               std::to_string(h.geometry.main_entry_bytes) + "+" +
               std::to_string(h.geometry.index_entry_bytes) + " B";
  }
  return d;
}

page_check verify_page(std::span<const uint8_t> bytes, uint64_t model_hash, uint32_t source_layer,
                       uint64_t first_entry, uint32_t n_entries, const page_geometry& geometry) {
  page_check c;
  decoded_header d = decode_page_header(bytes);
  c.header = d.header;
  if (d.status != page_status::ok) {
    c.status = d.status;
    c.detail = std::move(d.detail);
    return c;
  }
  const page_header& h = d.header;
  if (h.model_hash != model_hash) {
    c.status = page_status::model_mismatch;
    c.detail = "page written by model " + hex64(h.model_hash) + ", session model is " + hex64(model_hash);
    return c;
  }
  if (h.source_layer != source_layer || h.first_entry != first_entry || h.n_entries != n_entries ||
      !(h.geometry == geometry)) {
    c.status = page_status::layout_mismatch;
    c.detail = "page header says source " + std::to_string(h.source_layer) + " entries [" +
               std::to_string(h.first_entry) + ", +" + std::to_string(h.n_entries) + ") of " +
               std::to_string(h.geometry.main_entry_bytes) + "+" +
               std::to_string(h.geometry.index_entry_bytes) + " B; the store expects source " +
               std::to_string(source_layer) + " entries [" + std::to_string(first_entry) + ", +" +
               std::to_string(n_entries) + ") of " + std::to_string(geometry.main_entry_bytes) +
               "+" + std::to_string(geometry.index_entry_bytes) + " B";
    return c;
  }
  if (bytes.size() != h.total_bytes()) {
    c.status = page_status::truncated;
    c.detail = "page is " + std::to_string(bytes.size()) + " bytes, header says " +
               std::to_string(h.total_bytes());
    return c;
  }
  const auto payload = bytes.subspan(page_header_bytes);
  if (XXH64(payload.data(), payload.size(), 0) != h.payload_xxh64) {
    c.status = page_status::checksum;
    c.detail = "payload xxh64 mismatch over " + std::to_string(payload.size()) + " bytes";
    return c;
  }
  const size_t main_bytes = uint64_t{h.n_entries} * h.geometry.main_entry_bytes;
  c.main = payload.subspan(0, main_bytes);
  c.index = payload.subspan(main_bytes);
  return c;
}

}  // namespace cedar::sessions
