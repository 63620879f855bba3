// backend — see backend.hpp. The CPU backend is the runner behind the interface.
#include "model/backend.hpp"

#include "kernels/cpu/qmatmul.hpp"

namespace cedar::model {

namespace {

class cpu_backend final : public backend {
 public:
  explicit cpu_backend(const engine& e) : rn_(e) {}
  backend_kind kind() const override { return backend_kind::cpu; }
  std::string device() const override {
    return "cpu (" + std::to_string(kernels::cpu_threads()) + " threads)";
  }
  result<logits_rows> prefill(sequence& seq, std::span<const int32_t> tokens, const prefill_options& opt) override {
    return rn_.prefill(seq, tokens, opt);
  }
  status decode_step(std::span<sequence* const> seqs, std::span<const int32_t> tokens,
                     std::vector<float>& logits) override {
    return rn_.decode_step(seqs, tokens, logits);
  }
  result<logits_rows> replay(sequence& seq, int n) override { return rn_.replay(seq, n); }

 private:
  runner rn_;
};

}  // namespace

const char* backend_name(backend_kind k) { return k == backend_kind::cuda ? "cuda" : "cpu"; }

result<backend_request> parse_backend_request(std::string_view s) {
  if (s == "cpu") return backend_request::cpu;
  if (s == "cuda") return backend_request::cuda;
  if (s == "auto") return backend_request::automatic;
  return make_error(errc::invalid_argument, "unknown backend '" + std::string(s) + "' (expected cpu, cuda or auto)");
}

result<std::unique_ptr<backend>> make_backend(const engine& e, backend_request r) {
  if (r == backend_request::cuda || (r == backend_request::automatic && cuda_unavailable_reason().empty()))
    return make_cuda_backend(e);
  return std::unique_ptr<backend>(new cpu_backend(e));
}

}  // namespace cedar::model
