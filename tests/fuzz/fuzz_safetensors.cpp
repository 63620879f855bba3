// Fuzz target: model::checkpoint::open on one .safetensors file (header length, JSON header,
// dtype/shape/offset validation) and to_f32 on every tensor it accepts. Checkpoints are
// downloaded files: any bytes, any truncation.
//
// Input: the whole file. It is written to a per-process file under /dev/shm (or $TMPDIR) and
// opened through the public API, as `cedar` opens a model. Checked: no crash/UB/leak; every
// accepted tensor lies inside the file and its byte size matches shape x dtype (the reader's
// documented validation); to_f32 of a tensor returns numel values or an error.
#include <unistd.h>

#include <cstdio>
#include <string>

#include "model/safetensors.hpp"
#include "tests/fuzz/fuzz_util.hpp"

using namespace cedar::model;
using cedar::fuzz::fuzz_require;

namespace {
const std::string& scratch_path() {
  static const std::string p = [] {
    const char* dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : (getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    return std::string(dir) + "/cedar_fuzz_safetensors_" + std::to_string(getpid()) + ".safetensors";
  }();
  return p;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = scratch_path();
  FILE* f = std::fopen(path.c_str(), "wb");
  fuzz_require(f != nullptr, "safetensors: cannot write the scratch file");
  if (size) std::fwrite(data, 1, size, f);
  std::fclose(f);

  auto ck = checkpoint::open(path);
  if (ck.ok()) {
    for (const tensor_view& t : ck->tensors()) {
      fuzz_require(t.data != nullptr || t.n_bytes == 0, "safetensors: tensor without data");
      fuzz_require(t.n_bytes <= size, "safetensors: tensor larger than the file");
      fuzz_require(static_cast<size_t>(t.numel()) * dtype_size(t.type) == t.n_bytes,
                   "safetensors: byte size differs from shape x dtype");
      if (t.numel() > (1 << 20)) continue;  // keep one execution fast
      auto v = to_f32(*ck, t);
      if (v.ok()) {
        int64_t n = 1;
        for (int64_t d : to_f32_shape(*ck, t)) n *= d;
        fuzz_require(static_cast<int64_t>(v->size()) == n, "safetensors: to_f32 size differs from to_f32_shape");
      }
    }
    (void)ck->metadata("format");
  }
  std::remove(path.c_str());
  return 0;
}
