// Fuzz target: what an MCP stdio server's stdout goes through — tools::mcp::line_framer (the
// newline-delimited framing of stdio_transport) and then mcp::connection's JSON-RPC handling
// (parse, batch arrays, requests from the server, notifications, progress, responses).
// A server is an arbitrary child process: its stdout is untrusted.
//
// Input: [chunk size][max line bytes] then the stdout bytes, fed in chunks of that size.
// Checked: no crash/UB/leak; framing is chunking-independent (the same lines as a one-shot
// feed); no delivered line is empty, contains '\n' or exceeds the limit; once the framer
// reports an oversized line the transport stops feeding (as read_stdout_ does); everything the
// connection sends back (ping answers, method-not-found) is valid JSON.
#include <algorithm>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_util.hpp"
#include "tests/fuzz/mcp_harness.hpp"
#include "tools_mcp/json.hpp"
#include "tools_mcp/mcp_stdio.hpp"

using cedar::fuzz::fuzz_bytes;
using cedar::fuzz::fuzz_require;
using cedar::tools::mcp::line_framer;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz_bytes in(data, size);
  const size_t chunk = 1 + in.take_byte() % 32;
  const size_t max_line = 16 + size_t{in.take_byte()} * 16;
  const std::string_view bytes = in.rest();

  std::vector<std::string> whole_lines;
  line_framer whole(max_line);
  const bool whole_fits =
      whole.feed(bytes, [&](std::string_view l) { whole_lines.emplace_back(l); });

  cedar::fuzz::mcp_harness h;
  line_framer framer(max_line);
  std::vector<std::string> lines;
  bool fits = true;
  for (size_t off = 0; off < bytes.size() && fits; off += chunk) {
    fits = framer.feed(bytes.substr(off, chunk), [&](std::string_view l) {
      fuzz_require(!l.empty() && l.find('\n') == std::string_view::npos, "stdio: bad line delivered");
      fuzz_require(l.size() <= max_line + chunk, "stdio: line longer than the limit");
      lines.emplace_back(l);
      h.wire->deliver(l);
    });
  }
  // An oversized line is detected per chunk, so chunked feeding may stop earlier than a one-shot
  // feed (which checks only its final tail); the lines it delivered are a prefix of the
  // one-shot lines either way, and all of them when neither overflowed.
  fuzz_require(lines.size() <= whole_lines.size(), "stdio: more lines than a one-shot feed");
  for (size_t i = 0; i < lines.size(); ++i)
    fuzz_require(lines[i] == whole_lines[i], "stdio: framing depends on chunking");
  if (fits && whole_fits) fuzz_require(lines.size() == whole_lines.size(), "stdio: framing depends on chunking");
  for (const std::string& s : h.sent) fuzz_require(cedar::tools::json_parse(s).ok(), "mcp: sent invalid JSON");
  h.conn->close();
  return 0;
}
