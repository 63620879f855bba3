// Fuzz target: tools::mcp::sse_parser, the text/event-stream parser of the Streamable HTTP
// transport, and mcp::connection's JSON-RPC handling of each event's data (what
// http_transport::deliver_ passes on). An HTTP MCP server is untrusted.
//
// Input: [chunk size] then the response body, fed in chunks of that size. Checked: no
// crash/UB/leak; the events, last_event_id and retry are the same as for a one-shot feed
// (chunking independence, including a CRLF split across chunks); every event's data and id are
// what a one-shot parse gives.
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_util.hpp"
#include "tests/fuzz/mcp_harness.hpp"
#include "tools_mcp/mcp_http.hpp"

using cedar::fuzz::fuzz_bytes;
using cedar::fuzz::fuzz_require;
using cedar::tools::mcp::sse_parser;

namespace {
struct seen {
  std::vector<std::string> events;  // id \x1f type \x1f data
  std::string last_id;
  long retry = -1;
};
std::string flat(const sse_parser::event& e) { return e.id + '\x1f' + e.type + '\x1f' + e.data; }
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz_bytes in(data, size);
  const size_t chunk = 1 + in.take_byte() % 64;
  const std::string_view body = in.rest();

  seen whole;
  sse_parser p1;
  p1.feed(body, [&](const sse_parser::event& e) { whole.events.push_back(flat(e)); });
  whole.last_id = p1.last_event_id();
  whole.retry = p1.retry_ms();

  cedar::fuzz::mcp_harness h;
  seen chunked;
  sse_parser p2;
  for (size_t off = 0; off < body.size(); off += chunk) {
    p2.feed(body.substr(off, chunk), [&](const sse_parser::event& e) {
      chunked.events.push_back(flat(e));
      if (!e.data.empty()) h.wire->deliver(e.data);
    });
  }
  fuzz_require(p2.buffered_bytes() <= body.size(), "sse: holds more bytes than it was given");
  chunked.last_id = p2.last_event_id();
  chunked.retry = p2.retry_ms();
  fuzz_require(chunked.events == whole.events, "sse: events depend on chunking");
  fuzz_require(chunked.last_id == whole.last_id, "sse: last_event_id depends on chunking");
  fuzz_require(chunked.retry == whole.retry, "sse: retry depends on chunking");
  h.conn->close();
  return 0;
}
