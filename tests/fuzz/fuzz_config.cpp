// Fuzz target: model::parse_model_config, the config.json validator (a model directory is
// untrusted input: downloaded, hand-edited, truncated).
//
// Input: the config.json text. Checked: no crash/UB/leak; an accepted config has a consistent
// derived layer map (one entry per backbone + draft layer) and its derived figures
// (compute_figures, which multiplies many fields) are computed without overflow UB.
#include <string>

#include "model/config.hpp"
#include "tests/fuzz/fuzz_util.hpp"

using namespace cedar::model;
using cedar::fuzz::fuzz_require;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto c = parse_model_config(text, "config.json");
  if (!c.ok()) {
    fuzz_require(!c.err().message.empty(), "config: an error without a message");
    return 0;
  }
  fuzz_require(static_cast<int>(c->layers.size()) == c->n_layers_total(),
               "config: derived layer map size differs from the layer count");
  const model_figures f = compute_figures(*c);
  fuzz_require(f.params_total >= 0, "config: negative parameter count");
  return 0;
}
