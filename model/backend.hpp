// backend — where the forward pass runs (ARCHITECTURE "executor"). The executor talks to one
// backend; each implements the three calls of the runner (forward.hpp) with the same
// contract, so the CPU runner is the reference every other backend is tested against.
//
//   cpu    model::runner (forward.cpp): prefill, batched decode, bounded replay, all on the CPU.
//   cuda   decode steps, chunked prefill and bounded replay on an NVIDIA GPU
//          (cuda_decoder.cpp): weights uploaded once in their checkpoint format; each
//          sequence's packed caches mirrored on the device (FP8 SWA rings, FP4 global KV and
//          index keys, byte for byte the host's) and kept in step with the host sequence, which
//          stays the owner (the session store persists it; the steps hand back their index
//          selections as its resume hints); prefill with CEDAR_CUDA_PREFILL=0 or a trace and
//          replay with CEDAR_CUDA_REPLAY=0 run on the CPU runner, and the device copy is
//          refreshed before the next step.
// Selection: `automatic` picks cuda when the build has CUDA and a device is present, else
// cpu; asking for cuda where it cannot run is an error that says why.
// Threads: a backend is used by one thread at a time (the executor's), like the runner.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/base/result.hpp"
#include "model/engine.hpp"
#include "model/forward.hpp"
#include "model/sequence.hpp"

namespace cedar::model {

enum class backend_kind { cpu, cuda };
enum class backend_request { cpu, cuda, automatic };

const char* backend_name(backend_kind k);
// "cpu", "cuda" or "auto"; anything else is an error naming the accepted values.
result<backend_request> parse_backend_request(std::string_view s);

class backend {
 public:
  virtual ~backend() = default;
  virtual backend_kind kind() const = 0;
  // One line for logs and `--json` outputs, e.g. "cpu (OpenBLAS, 2 threads)".
  virtual std::string device() const = 0;
  // runner::prefill / decode_step / replay (forward.hpp), same contracts.
  virtual result<logits_rows> prefill(sequence& seq, std::span<const int32_t> tokens,
                                      const prefill_options& opt = {}) = 0;
  virtual status decode_step(std::span<sequence* const> seqs, std::span<const int32_t> tokens,
                             std::vector<float>& logits) = 0;
  virtual result<logits_rows> replay(sequence& seq, int n) = 0;
  // Device time of the last decode_step in ms (CUDA: events around the step's upload, kernels
  // and download, so wall time minus this is host work); -1 where not measured (CPU).
  virtual double last_step_device_ms() const { return -1.0; }
  // The last decode_step's device time in phases, ms (CUDA with CEDAR_CUDA_STEP_PHASES=1: events
  // recorded inside the step's graph): [0] from the step's start event to the end of its upload
  // (the graph launch and the upload), [1] the kernels, [2] the downloads to the step's end
  // event, and [3] (a graph replay only) the host's time in the cudaGraphLaunch call itself;
  // empty where not measured.
  virtual std::vector<double> last_step_phases_ms() const { return {}; }
};

// Why the cuda backend cannot run here ("" when it can): built without CUDA, no device, or a
// driver error, in words.
std::string cuda_unavailable_reason();

// The engine must outlive the backend.
result<std::unique_ptr<backend>> make_backend(const engine& e, backend_request r);

// The CUDA backend itself (cuda_decoder.cpp); an error when cuda_unavailable_reason() != "".
result<std::unique_ptr<backend>> make_cuda_backend(const engine& e);

}  // namespace cedar::model
