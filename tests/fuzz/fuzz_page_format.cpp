// Fuzz target: sessions::decode_page_header / verify_page, the KV page decoder (pages come from
// the SQLite store on disk: torn writes, bit rot, files of another version or model).
//
// Input: the page bytes. Each input is checked twice: as given (checksums almost never match,
// so this covers the early rejections), and with both xxh64 fields recomputed over the
// mutated bytes (so the field validation and the length checks behind the checksums run too).
// Checked: no crash/UB/leak; a page that verifies against its own header's layout has views
// that lie inside the buffer with the documented sizes, and encode_page of its header and
// views gives back the same bytes (decode/encode round trip).
#include <cstring>
#include <vector>

#include "sessions/page_format.hpp"
#include "tests/fuzz/fuzz_util.hpp"

using namespace cedar::sessions;
using cedar::fuzz::fuzz_require;

namespace {
void check(std::span<const uint8_t> bytes) {
  decoded_header d = decode_page_header(bytes);
  (void)page_status_name(d.status);
  if (d.status != page_status::ok) return;
  const page_header& h = d.header;
  // Once with what the header claims (deep path), once with a layout the store would not expect.
  page_check c = verify_page(bytes, h.model_hash, h.source_layer, h.first_entry, h.n_entries, h.geometry);
  (void)verify_page(bytes, h.model_hash ^ 1, h.source_layer, h.first_entry, h.n_entries, h.geometry);
  if (c.status != page_status::ok) return;
  fuzz_require(bytes.size() == h.total_bytes(), "page: ok page whose size differs from the header");
  fuzz_require(c.main.size() == uint64_t{h.n_entries} * h.geometry.main_entry_bytes, "page: main view size");
  fuzz_require(c.index.size() == uint64_t{h.n_entries} * h.geometry.index_entry_bytes, "page: index view size");
  fuzz_require(c.main.data() >= bytes.data() && c.index.data() + c.index.size() <= bytes.data() + bytes.size(),
               "page: views outside the buffer");
  auto again = encode_page(h, c.main, c.index);
  fuzz_require(again.ok(), "page: a verified page does not re-encode");
  fuzz_require(again->size() == bytes.size() && std::memcmp(again->data(), bytes.data(), bytes.size()) == 0,
               "page: decode/encode round trip differs");
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  check(std::span<const uint8_t>(data, size));
  if (size < page_header_bytes) return 0;
  std::vector<uint8_t> fixed(data, data + size);
  const uint64_t payload = checksum64(std::span<const uint8_t>(fixed).subspan(page_header_bytes));
  std::memcpy(fixed.data() + 48, &payload, 8);  // little-endian host (x86-64, aarch64)
  const uint64_t header = checksum64(std::span<const uint8_t>(fixed.data(), 56));
  std::memcpy(fixed.data() + 56, &header, 8);
  check(fixed);
  return 0;
}
