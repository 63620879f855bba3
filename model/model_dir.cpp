#include "model/model_dir.hpp"

#include <filesystem>

#include "kernels/base/log.hpp"

namespace cedar::model {

result<loaded_model> load_model_dir(const std::string& dir, bool need_tokenizer) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return make_error(errc::not_found, dir + ": not a model directory");
  auto cfg = load_model_config(dir + "/config.json");
  if (!cfg) return cfg.take_err();
  loaded_model m;
  if (fs::exists(dir + "/tokenizer.json")) {
    auto tok = tokenizer::load(dir + "/tokenizer.json");
    if (!tok) return tok.take_err();
    if (tok->vocab_size() > cfg->vocab_size)
      return make_error(errc::mismatch, dir + ": tokenizer.json has " + std::to_string(tok->vocab_size()) +
                                            " ids but config.json's vocab_size is " + std::to_string(cfg->vocab_size));
    m.tok = std::make_shared<const tokenizer>(std::move(*tok));
  } else if (need_tokenizer) {
    return make_error(errc::not_found, dir + "/tokenizer.json: missing");
  }
  engine_options eo;
  for (const char* name : {"token_map.npy", "engram/token_map.npy"})
    if (fs::exists(dir + "/" + name)) {
      auto tm = load_token_map_npy(dir + "/" + name);
      if (!tm) return tm.take_err();
      eo.engram_token_map = std::move(*tm);
      break;
    }
  std::string ckpt = fs::exists(dir + "/model.safetensors.index.json") ? dir : dir + "/model.safetensors";
  CEDAR_LOG_INFO("loading %s", dir.c_str());
  auto e = engine::load(*cfg, ckpt, std::move(eo));
  if (!e) return e.take_err();
  m.eng = std::make_shared<const engine>(std::move(*e));
  return m;
}

}  // namespace cedar::model
