// Fuzz target: model::tokenizer of the default model (model/weights/cedar-agent-tiny), on the
// two untrusted directions: text from users/tools/models -> ids, and ids from a model -> text.
//
// Input layout: [mode] then the payload.
//   mode even: encode(payload) (allow_special = bit 1). Invalid UTF-8 must be an error; for
//     valid UTF-8, decode(encode(t)) == t (tokenizer.hpp invariant 1) and every id is known.
//   mode odd:  the payload as little-endian int32 ids (bit 1: reduced modulo vocab_size + 8, so
//     most are real tokens and some are just past the end). decode/decode_text fail exactly
//     when an id is unknown; decode_text is valid UTF-8; stream_decoder's pushes + finish()
//     equal decode_text (tokenizer.hpp, stream_decoder contract).
#include <cstring>
#include <string>
#include <vector>

#include "model/tokenizer.hpp"
#include "tests/fuzz/fuzz_util.hpp"

using namespace cedar::model;
using cedar::fuzz::fuzz_bytes;
using cedar::fuzz::fuzz_require;

namespace {
const tokenizer& tok() {
  static const tokenizer t = [] {
    auto r = tokenizer::load(cedar::fuzz::fuzz_data_path("model/weights/cedar-agent-tiny/tokenizer.json"));
    if (!r.ok()) {
      std::fprintf(stderr, "fuzz_tokenizer: %s\n", r.err().message.c_str());
      std::abort();
    }
    return std::move(*r);
  }();
  return t;
}

void fuzz_encode(std::string_view text, bool allow_special) {
  const tokenizer& t = tok();
  auto ids = t.encode(text, allow_special);
  if (!utf8_valid(text)) {
    fuzz_require(!ids.ok(), "tokenizer: encode accepted invalid UTF-8");
    return;
  }
  fuzz_require(ids.ok(), "tokenizer: encode rejected valid UTF-8");
  for (int32_t id : *ids) fuzz_require(t.token_bytes(id) != nullptr, "tokenizer: encode produced an unknown id");
  auto back = t.decode(*ids);
  fuzz_require(back.ok(), "tokenizer: decode failed on encode's ids");
  fuzz_require(*back == text, "tokenizer: decode(encode(t)) != t");
}

void fuzz_decode(std::string_view payload, bool wrap) {
  const tokenizer& t = tok();
  std::vector<int32_t> ids(payload.size() / 4);
  bool all_known = true;
  for (size_t i = 0; i < ids.size(); ++i) {
    uint32_t u;
    std::memcpy(&u, payload.data() + 4 * i, 4);
    int32_t id = static_cast<int32_t>(u);
    if (wrap) id = static_cast<int32_t>(u % (static_cast<uint32_t>(t.vocab_size()) + 8));
    ids[i] = id;
    all_known = all_known && t.token_bytes(id) != nullptr;
  }
  for (bool skip : {false, true}) {
    auto raw = t.decode(ids, skip);
    auto text = t.decode_text(ids, skip);
    fuzz_require(raw.ok() == all_known && text.ok() == all_known, "tokenizer: decode error iff unknown id");
    if (!all_known) continue;
    fuzz_require(utf8_valid(*text), "tokenizer: decode_text returned invalid UTF-8");
    stream_decoder sd(t, skip);
    std::string streamed;
    for (int32_t id : ids) {
      auto piece = sd.push(id);
      fuzz_require(piece.ok(), "tokenizer: stream_decoder rejected a known id");
      streamed += *piece;
    }
    streamed += sd.finish();
    fuzz_require(streamed == *text, "tokenizer: stream_decoder differs from decode_text");
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz_bytes in(data, size);
  const uint8_t mode = in.take_byte();
  if (mode & 1) {
    fuzz_decode(in.rest(), mode & 2);
  } else {
    fuzz_encode(in.rest(), mode & 2);
  }
  return 0;
}
