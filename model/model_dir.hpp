// A model directory on disk: config.json, model.safetensors (or a sharded index), an optional
// tokenizer.json, and the Engram token map when the config has Engram layers (token_map.npy, or
// engram/token_map.npy as in the HF fixture). One loader for the CLI and the runtime.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "kernels/base/result.hpp"
#include "model/engine.hpp"
#include "model/tokenizer.hpp"

namespace cedar::model {

struct loaded_model {
  std::shared_ptr<const engine> eng;
  std::shared_ptr<const tokenizer> tok;  // null when the directory has no tokenizer.json
};

// Errors name the file that is missing or wrong. `need_tokenizer`: a missing tokenizer.json is
// an error (else it is optional).
result<loaded_model> load_model_dir(const std::string& dir, bool need_tokenizer);

}  // namespace cedar::model
