// Fuzz target: model::checkpoint::open on one .safetensors file (header length, JSON header,
// dtype/shape/offset validation) and to_f32 on every tensor it accepts. Checkpoints are
// downloaded files: any bytes, any truncation.
//
// Input: the whole file. It is written to one in-memory file (memfd, created once per process,
// truncated and rewritten per input: no file is created or unlinked per execution) and opened
// by its /proc/self/fd path through the public API, as `cedar` opens a model (open, fstat,
// mmap). Checked: no crash/UB/leak; every accepted tensor lies inside the file and its byte
// size matches shape x dtype (the reader's documented validation); to_f32 of a tensor returns
// numel values or an error.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "model/safetensors.hpp"
#include "tests/fuzz/fuzz_util.hpp"

using namespace cedar::model;
using cedar::fuzz::fuzz_require;

namespace {
// The in-memory file and its path; fuzz_require aborts when the kernel has no memfd.
struct scratch_file {
  int fd = -1;
  std::string path;
  scratch_file() {
    fd = memfd_create("cedar_fuzz_safetensors", MFD_CLOEXEC);
    fuzz_require(fd >= 0, "safetensors: memfd_create failed");
    path = "/proc/self/fd/" + std::to_string(fd);
  }
  // Makes the file exactly `data` (no leftover bytes of a longer earlier input).
  void write(const uint8_t* data, size_t size) {
    fuzz_require(ftruncate(fd, 0) == 0, "safetensors: cannot truncate the scratch file");
    for (size_t off = 0; off < size;) {
      const ssize_t n = pwrite(fd, data + off, size - off, off_t(off));
      fuzz_require(n > 0, "safetensors: cannot write the scratch file");
      off += size_t(n);
    }
  }
};
scratch_file& scratch() {
  static scratch_file f;
  return f;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  scratch_file& f = scratch();
  f.write(data, size);

  auto ck = checkpoint::open(f.path);
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
  return 0;
}
