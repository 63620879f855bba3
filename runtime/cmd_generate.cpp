// cedar generate --model DIR (--prompt TEXT | --tokens FILE.npy) [--max-tokens N]
//                [--greedy | --temperature T --top-p P --min-p P] [--seed S]
//                [--print-logits K] [--mode ced|full] [--backend cpu|cuda|auto] [--json]
//
// Streams generated text (or ids, when the model directory has no tokenizer) to stdout.
// --print-logits K prints the top-K (id, logit) of every step, for comparisons with other
// implementations; --json prints one JSON object per step instead of text.
#include "runtime/cmd_generate.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <numeric>

#include "model/backend.hpp"
#include "model/forward.hpp"
#include "model/model_dir.hpp"
#include "model/npy.hpp"
#include "model/sampler.hpp"
#include "tools_mcp/json.hpp"

namespace cedar::runtime {
namespace {

struct gen_args {
  std::string model_dir, prompt, tokens_file, mode = "ced", backend = "cpu";
  int max_tokens = 64, print_logits = 0;
  bool greedy = false, json = false;
  float temperature = 0, top_p = 1, min_p = 0;
  uint64_t seed = 0;
};

std::vector<std::pair<int, float>> top_k(const float* l, int n, int k) {
  std::vector<int> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  k = std::min(k, n);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int a, int b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
  std::vector<std::pair<int, float>> out;
  for (int i = 0; i < k; ++i) out.emplace_back(idx[size_t(i)], l[idx[size_t(i)]]);
  return out;
}

int run_generate(const gen_args& a) {
  auto m = model::load_model_dir(a.model_dir, /*need_tokenizer=*/!a.prompt.empty());
  if (!m) {
    std::fprintf(stderr, "cedar generate: %s\n", m.err().message.c_str());
    return 2;
  }
  std::vector<int32_t> prompt;
  if (!a.prompt.empty()) {
    auto ids = m->tok->encode(a.prompt, true);
    if (!ids) {
      std::fprintf(stderr, "cedar generate: --prompt: %s\n", ids.err().message.c_str());
      return 2;
    }
    if (m->tok->bos_id() >= 0) prompt.push_back(m->tok->bos_id());
    prompt.insert(prompt.end(), ids->begin(), ids->end());
  } else {
    auto arr = model::npy_load(a.tokens_file);
    if (!arr) {
      std::fprintf(stderr, "cedar generate: %s\n", arr.err().message.c_str());
      return 2;
    }
    if (arr->dtype != "i64" && arr->dtype != "i32") {
      std::fprintf(stderr, "cedar generate: %s: expected an int32 or int64 array, got %s\n", a.tokens_file.c_str(),
                   arr->dtype.c_str());
      return 2;
    }
    for (int64_t i = 0; i < arr->numel(); ++i)
      prompt.push_back(arr->dtype == "i64" ? int32_t(arr->as<int64_t>()[i]) : arr->as<int32_t>()[i]);
  }
  const model::engine& e = *m->eng;
  const int V = int(e.config().vocab_size);
  if (prompt.empty()) {
    std::fprintf(stderr, "cedar generate: the prompt is empty\n");
    return 2;
  }
  for (int32_t t : prompt)
    if (t < 0 || t >= V) {
      std::fprintf(stderr, "cedar generate: token id %d outside the vocabulary [0, %d)\n", t, V);
      return 2;
    }
  if (a.mode != "ced" && a.mode != "full") {
    std::fprintf(stderr, "cedar generate: --mode: expected 'ced' or 'full', got '%s'\n", a.mode.c_str());
    return 2;
  }
  auto want = model::parse_backend_request(a.backend);
  if (!want) {
    std::fprintf(stderr, "cedar generate: --backend: %s\n", want.err().message.c_str());
    return 2;
  }
  auto be = model::make_backend(e, *want);
  if (!be) {
    std::fprintf(stderr, "cedar generate: %s\n", be.err().message.c_str());
    return 1;
  }
  model::backend& rn = **be;
  model::sequence seq(e.config());
  model::prefill_options po;
  po.mode = a.mode == "full" ? model::prefill_mode::full_stack : model::prefill_mode::ced;
  auto t0 = std::chrono::steady_clock::now();
  auto lg = rn.prefill(seq, prompt, po);
  if (!lg) {
    std::fprintf(stderr, "cedar generate: %s\n", lg.err().message.c_str());
    return 1;
  }
  auto t1 = std::chrono::steady_clock::now();
  model::sampler smp({a.greedy ? 0.0f : a.temperature, a.top_p, a.min_p, a.seed});
  std::vector<float> logits(lg->values.end() - V, lg->values.end());
  std::unique_ptr<model::stream_decoder> dec;
  if (m->tok) dec = std::make_unique<model::stream_decoder>(*m->tok);
  int n = 0;
  for (; n < a.max_tokens; ++n) {
    int32_t t = smp.sample(logits.data(), V);
    if (a.json) {
      nlohmann::json j{{"step", n}, {"token", t}};
      if (dec)
        if (auto s = m->tok->decode_text(std::vector<int32_t>{t}); s) j["text"] = *s;
      if (a.print_logits > 0) {
        nlohmann::json tk = nlohmann::json::array();
        for (auto [id, v] : top_k(logits.data(), V, a.print_logits)) tk.push_back({id, v});
        j["top"] = tk;
      }
      std::printf("%s\n", cedar::tools::json_dump(j).c_str());
    } else {
      if (a.print_logits > 0) {
        std::printf("\n[step %d]", n);
        for (auto [id, v] : top_k(logits.data(), V, a.print_logits)) std::printf(" %d:%.4f", id, v);
        std::printf("\n");
      }
      if (dec) {
        auto piece = dec->push(t);
        if (piece) std::fputs(piece->c_str(), stdout);
      } else {
        std::printf("%d ", t);
      }
      std::fflush(stdout);
    }
    if (t == e.config().eos_token_id) {
      ++n;
      break;
    }
    model::sequence* batch[] = {&seq};
    if (auto st = rn.decode_step(batch, std::span<const int32_t>(&t, 1), logits); !st) {
      std::fprintf(stderr, "\ncedar generate: %s\n", st.err().message.c_str());
      return 1;
    }
  }
  auto t2 = std::chrono::steady_clock::now();
  if (dec && !a.json) std::fputs(dec->finish().c_str(), stdout);
  double pf = std::chrono::duration<double>(t1 - t0).count(), dc = std::chrono::duration<double>(t2 - t1).count();
  std::fprintf(stderr, "\n[%zu prompt tokens in %.3f s (%.0f tok/s, %s), %d generated in %.3f s (%.1f tok/s)]\n",
               prompt.size(), pf, prompt.size() / std::max(pf, 1e-9), a.mode.c_str(), n, dc, n / std::max(dc, 1e-9));
  return 0;
}

}  // namespace

void add_generate_command(CLI::App& app, int* exit_code) {
  static gen_args a;
  auto* g = app.add_subcommand("generate", "run the model on a prompt and stream the continuation");
  g->add_option("--model", a.model_dir, "model directory (config.json, model.safetensors[, tokenizer.json])")->required();
  auto* p = g->add_option("--prompt", a.prompt, "prompt text (encoded with the model's tokenizer.json, BOS prepended)");
  auto* t = g->add_option("--tokens", a.tokens_file, "prompt token ids (.npy, int32/int64)");
  p->excludes(t);
  g->add_option("--max-tokens", a.max_tokens, "tokens to generate")->capture_default_str();
  g->add_flag("--greedy", a.greedy, "argmax sampling (the default when no temperature is given)");
  g->add_option("--temperature", a.temperature, "sampling temperature (0: greedy)");
  g->add_option("--top-p", a.top_p, "nucleus sampling mass");
  g->add_option("--min-p", a.min_p, "drop tokens below min_p x the top probability");
  g->add_option("--seed", a.seed, "sampling seed");
  g->add_option("--print-logits", a.print_logits, "print the top-K logits of every step");
  g->add_option("--mode", a.mode, "prefill path: ced (decoder runs only the last n_win tokens) or full")->capture_default_str();
  g->add_option("--backend", a.backend, "where decode steps run: cpu, cuda (an NVIDIA GPU) or auto")
      ->capture_default_str();
  g->add_flag("--json", a.json, "one JSON object per step");
  g->callback([exit_code, p, t] {
    if (!*p && !*t) {
      std::fprintf(stderr, "cedar generate: give --prompt TEXT or --tokens FILE.npy\n");
      *exit_code = 2;
      return;
    }
    *exit_code = run_generate(a);
  });
}

}  // namespace cedar::runtime
