// The KV page format: round trip, and every kind of damage reported with its own status.
#include <gtest/gtest.h>

#include "sessions/page_format.hpp"
#include "store_test_util.hpp"

namespace cedar::sessions {
namespace {

using test::official_geometry;

struct page_fixture {
  page_header h;
  std::vector<uint8_t> main, index, bytes;
  page_fixture(uint32_t n = 37, uint64_t model = 0xfeedfacecafebeefull) {
    h.model_hash = model;
    h.source_layer = 14;
    h.geometry = official_geometry;
    h.first_entry = 1000;
    h.n_entries = n;
    main = test::entry_bytes(7, 14, 1000, n, 288, 0);
    index = test::entry_bytes(7, 14, 1000, n, 68, 1);
    auto r = encode_page(h, main, index);
    EXPECT_TRUE(r.ok());
    bytes = std::move(*r);
  }
  page_check verify(std::span<const uint8_t> b) const {
    return verify_page(b, h.model_hash, h.source_layer, h.first_entry, h.n_entries, h.geometry);
  }
};

TEST(page_format, round_trip_keeps_every_field_and_byte) {
  page_fixture f;
  ASSERT_EQ(f.bytes.size(), page_header_bytes + 37u * (288 + 68));
  decoded_header d = decode_page_header(f.bytes);
  ASSERT_EQ(d.status, page_status::ok) << d.detail;
  EXPECT_EQ(d.header.model_hash, 0xfeedfacecafebeefull);
  EXPECT_EQ(d.header.source_layer, 14u);
  EXPECT_EQ(d.header.geometry, official_geometry);
  EXPECT_EQ(d.header.first_entry, 1000u);
  EXPECT_EQ(d.header.n_entries, 37u);
  page_check c = f.verify(f.bytes);
  ASSERT_EQ(c.status, page_status::ok) << c.detail;
  EXPECT_TRUE(std::equal(c.main.begin(), c.main.end(), f.main.begin(), f.main.end()));
  EXPECT_TRUE(std::equal(c.index.begin(), c.index.end(), f.index.begin(), f.index.end()));
  // The magic is the ASCII "CKVP" at offset 0.
  EXPECT_EQ(std::string(f.bytes.begin(), f.bytes.begin() + 4), "CKVP");
}

TEST(page_format, encode_rejects_wrong_byte_counts) {
  page_header h;
  h.geometry = official_geometry;
  h.n_entries = 4;
  std::vector<uint8_t> main(4 * 288), index(4 * 68 - 1);
  auto r = encode_page(h, main, index);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.err().code, errc::invalid_argument);
  EXPECT_NE(r.err().message.find("index bytes"), std::string::npos) << r.err().message;
}

TEST(page_format, every_flipped_header_byte_is_a_bad_header) {
  page_fixture f(5);
  for (size_t i = 0; i < page_header_bytes; ++i) {
    std::vector<uint8_t> b = f.bytes;
    b[i] ^= 0x10;
    page_check c = f.verify(b);
    EXPECT_EQ(c.status, page_status::bad_header) << "byte " << i << ": " << c.detail;
    EXPECT_FALSE(c.detail.empty());
  }
}

TEST(page_format, flipped_payload_bytes_fail_the_checksum) {
  page_fixture f;
  for (size_t i : {size_t{page_header_bytes}, f.bytes.size() / 2, f.bytes.size() - 1}) {
    std::vector<uint8_t> b = f.bytes;
    b[i] ^= 0x01;
    page_check c = f.verify(b);
    EXPECT_EQ(c.status, page_status::checksum) << "byte " << i;
    EXPECT_TRUE(c.main.empty());
  }
}

TEST(page_format, truncation_anywhere_is_reported_not_read) {
  page_fixture f;
  for (size_t n : {size_t{0}, size_t{10}, size_t{63}, size_t{64}, size_t{65}, f.bytes.size() - 1}) {
    page_check c = f.verify(std::span<const uint8_t>(f.bytes.data(), n));
    EXPECT_EQ(c.status, page_status::truncated) << "length " << n << ": " << c.detail;
  }
  // Trailing garbage is as wrong as a short page.
  std::vector<uint8_t> longer = f.bytes;
  longer.push_back(0);
  EXPECT_EQ(f.verify(longer).status, page_status::truncated);
}

TEST(page_format, a_page_of_another_model_is_refused) {
  page_fixture other(37, 0x1234);
  page_fixture mine(37);
  page_check c = verify_page(other.bytes, mine.h.model_hash, 14, 1000, 37, official_geometry);
  EXPECT_EQ(c.status, page_status::model_mismatch);
  EXPECT_NE(c.detail.find("model"), std::string::npos);
}

TEST(page_format, header_that_disagrees_with_the_store_row_is_a_layout_mismatch) {
  page_fixture f;
  EXPECT_EQ(verify_page(f.bytes, f.h.model_hash, 8, 1000, 37, official_geometry).status,
            page_status::layout_mismatch);
  EXPECT_EQ(verify_page(f.bytes, f.h.model_hash, 14, 999, 37, official_geometry).status,
            page_status::layout_mismatch);
  page_geometry g = official_geometry;
  g.index_entry_bytes = 64;
  EXPECT_EQ(verify_page(f.bytes, f.h.model_hash, 14, 1000, 37, g).status,
            page_status::layout_mismatch);
}

TEST(page_format, a_newer_format_version_is_refused_with_its_number) {
  page_fixture f;
  std::vector<uint8_t> b = f.bytes;
  b[4] = 2;  // format_version = 2, header checksum recomputed: a well-formed future page
  page_header h = decode_page_header(f.bytes).header;
  uint8_t hdr[page_header_bytes];
  encode_page_header(h, hdr);
  hdr[4] = 2;
  const uint64_t sum = checksum64(std::span<const uint8_t>(hdr, 56));
  for (int i = 0; i < 8; ++i) hdr[56 + i] = static_cast<uint8_t>(sum >> (8 * i));
  std::copy(hdr, hdr + page_header_bytes, b.begin());
  page_check c = f.verify(b);
  EXPECT_EQ(c.status, page_status::bad_header);
  EXPECT_NE(c.detail.find("version 2"), std::string::npos) << c.detail;
}

}  // namespace
}  // namespace cedar::sessions
