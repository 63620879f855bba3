// Fuzz target: model::dsml_parser, the streaming parser of model output (reasoning, content,
// DSML tool calls). Model output is untrusted: any bytes, streamed in any chunking.
//
// Input layout: [flags][limit][chunk sizes...] then the text. flags bit 0 = thinking mode, bit 1
// = small limits (so the over-limit paths run on short inputs); the text is fed in chunks whose
// sizes cycle through up to 8 sizes taken from the input.
// Checked: no crash/UB/leak; the events of the chunked feed fold to exactly what the one-shot
// dsml_parse gives (dsml.hpp invariant 3: chunking independence); buffered_bytes() stays within
// the limits (invariant 1); call_end never follows an error in the same call (invariant 4).
#include <algorithm>
#include <string>
#include <vector>

#include "model/dsml.hpp"
#include "tests/fuzz/fuzz_util.hpp"

using namespace cedar::model;
using cedar::fuzz::fuzz_bytes;
using cedar::fuzz::fuzz_require;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz_bytes in(data, size);
  const uint8_t flags = in.take_byte();
  const bool thinking = flags & 1;
  dsml_limits limits;
  if (flags & 2) {
    const size_t l = 8 + in.take_byte();
    limits = dsml_limits{l, l * 2, l * 4};
  }
  std::vector<size_t> sizes;
  const size_t n_sizes = 1 + in.take_byte() % 8;
  for (size_t i = 0; i < n_sizes; ++i) sizes.push_back(1 + in.take_byte() % 64);
  const std::string_view text = in.rest();

  dsml_parser p(thinking, limits);
  std::vector<dsml_event> events;
  // Worst case held inside: the longest marker (< 64 B) + one tag + the value + the call's args.
  const size_t bound = 64 + limits.max_tag_bytes + limits.max_value_bytes + limits.max_call_bytes + 64;
  size_t off = 0;
  for (size_t i = 0; off < text.size(); ++i) {
    const size_t k = std::min(sizes[i % sizes.size()], text.size() - off);
    p.feed(text.substr(off, k), events);
    off += k;
    fuzz_require(p.buffered_bytes() <= bound, "dsml: buffered_bytes() exceeds the limits");
  }
  p.finish(events);

  bool call_failed = false;
  for (const auto& e : events) {
    if (e.kind == dsml_event_kind::call_begin) call_failed = false;
    if (e.kind == dsml_event_kind::error) call_failed = true;
    if (e.kind == dsml_event_kind::call_end) fuzz_require(!call_failed, "dsml: call_end after an error in the call");
  }

  dsml_result chunked;
  dsml_collect(events, chunked);
  const dsml_result whole = [&] {
    if (!(flags & 2)) return dsml_parse(text, thinking);
    dsml_parser q(thinking, limits);
    std::vector<dsml_event> ev;
    q.feed(text, ev);
    q.finish(ev);
    dsml_result r;
    dsml_collect(ev, r);
    return r;
  }();
  fuzz_require(chunked.reasoning == whole.reasoning, "dsml: reasoning depends on chunking");
  fuzz_require(chunked.content == whole.content, "dsml: content depends on chunking");
  fuzz_require(chunked.errors == whole.errors, "dsml: errors depend on chunking");
  fuzz_require(chunked.calls.size() == whole.calls.size(), "dsml: call count depends on chunking");
  for (size_t i = 0; i < chunked.calls.size(); ++i) {
    fuzz_require(chunked.calls[i].name == whole.calls[i].name, "dsml: call name depends on chunking");
    fuzz_require(chunked.calls[i].arguments_json == whole.calls[i].arguments_json,
                 "dsml: call arguments depend on chunking");
  }
  return 0;
}
