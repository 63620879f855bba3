// sessions/page_format — the on-disk format of one KV page: a versioned, checksummed header
// followed by the packed entries of one KV source over a contiguous entry range.
//
// The store knows nothing of the model: a page is `n_entries` fixed-size main entries followed
// by `n_entries` fixed-size index-key entries, both opaque bytes. For DeepSeek-V4.1 (MODEL_SPEC
// §3) a main entry is 288 B (512 FP4 values + 32 e4m3 scales) and an index key 68 B (128 FP4
// values + 4 E8M0 scales); the executor fills in `page_geometry` from its config.
//
// Layout (little-endian, 64-byte header; HOUSE_STYLE 8):
//   off size field
//     0   4  magic            'C','K','V','P'
//     4   2  format_version   1
//     6   2  header_bytes     64
//     8   8  model_hash       the engine's weights/config hash; a page of another model is refused
//    16   4  source_layer     the KV source layer that wrote the entries (e.g. 2, 8, 14, 20)
//    20   2  main_dims        values per main entry (512)
//    22   2  index_dims       values per index key (128)
//    24   4  main_entry_bytes   (288)
//    28   4  index_entry_bytes  (68)
//    32   8  first_entry      index of the first entry within the source
//    40   4  n_entries
//    44   4  flags            0 (reserved; must be 0 in version 1)
//    48   8  payload_xxh64    xxh64(seed 0) of the payload bytes [64, 64 + payload)
//    56   8  header_xxh64     xxh64(seed 0) of header bytes [0, 56)
//    64 ...  payload          [n_entries, main_entry_bytes] then [n_entries, index_entry_bytes]
//
// Invariants: total size == 64 + n_entries * (main_entry_bytes + index_entry_bytes); both
// checksums match; decode never reads past the buffer it is given (a truncated page is
// reported, not read).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kernels/base/result.hpp"

namespace cedar::sessions {

inline constexpr uint32_t page_magic = 0x5056'4b43;  // "CKVP" read as little-endian u32
inline constexpr uint16_t page_format_version = 1;
inline constexpr uint32_t page_header_bytes = 64;

// The entry shape of one KV source; fixed for a model.
struct page_geometry {
  uint16_t main_dims = 0;          // values per main entry
  uint16_t index_dims = 0;         // values per index key
  uint32_t main_entry_bytes = 0;   // bytes per main entry
  uint32_t index_entry_bytes = 0;  // bytes per index key
  uint64_t entry_bytes() const { return uint64_t{main_entry_bytes} + index_entry_bytes; }
  bool operator==(const page_geometry&) const = default;
};

struct page_header {
  uint64_t model_hash = 0;
  uint32_t source_layer = 0;
  page_geometry geometry;
  uint64_t first_entry = 0;
  uint32_t n_entries = 0;
  uint64_t payload_xxh64 = 0;  // filled by encode, checked by decode
  uint64_t payload_bytes() const { return geometry.entry_bytes() * n_entries; }
  uint64_t total_bytes() const { return page_header_bytes + payload_bytes(); }
};

// Why a page failed to load; `ok` when it is usable. Per page, so the executor can decide to
// replay from the good pages or re-prefill from the token log.
enum class page_status {
  ok,
  missing,         // no page covers this entry range (a gap, or the row is gone)
  truncated,       // fewer bytes than the header (or the row) says
  bad_header,      // wrong magic, unknown version, header checksum fails, or bad fields
  model_mismatch,  // written by another model (model hash differs)
  layout_mismatch, // header disagrees with the store's row (source, range, geometry)
  checksum,        // payload bytes fail their xxh64
};
const char* page_status_name(page_status s);

// Writes the 64-byte header for `h` (with h.payload_xxh64 already set) into `out`.
void encode_page_header(const page_header& h, uint8_t out[page_header_bytes]);

// Builds a whole page: header + main + index. `main` must hold n_entries * main_entry_bytes and
// `index` n_entries * index_entry_bytes (n_entries is taken from h); else invalid_argument.
result<std::vector<uint8_t>> encode_page(page_header h, std::span<const uint8_t> main,
                                         std::span<const uint8_t> index);

// Checks the header of `bytes` and returns it; `status` says why it is unusable otherwise.
struct decoded_header {
  page_status status = page_status::ok;
  std::string detail;  // a sentence naming the field and the expected value
  page_header header;
};
decoded_header decode_page_header(std::span<const uint8_t> bytes);

// Full check of one stored page against what the store expects of it: header, model hash,
// layout, length and payload checksum. `status == ok` means main/index views are valid.
struct page_check {
  page_status status = page_status::ok;
  std::string detail;
  page_header header;
  std::span<const uint8_t> main;   // [n_entries, main_entry_bytes] view into `bytes`
  std::span<const uint8_t> index;  // [n_entries, index_entry_bytes] view into `bytes`
};
page_check verify_page(std::span<const uint8_t> bytes, uint64_t model_hash, uint32_t source_layer,
                       uint64_t first_entry, uint32_t n_entries, const page_geometry& geometry);

// xxh64 of a buffer, seed 0 (exposed for the token log and aux blobs).
uint64_t checksum64(std::span<const uint8_t> bytes);

}  // namespace cedar::sessions
