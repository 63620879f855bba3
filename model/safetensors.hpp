// safetensors — read-only, memory-mapped access to a checkpoint in the safetensors format.
//
// Owns: opening one .safetensors file, or a directory holding model.safetensors or
// model.safetensors.index.json (sharded); mmap of every shard (read-only, MAP_SHARED); parsing
// and validating every header (simdjson); the tensor table; views of weight matrices in their
// stored dtype (weight_matrix: BF16/F32/F8_E4M3/packed FP4 referenced in the mapping, for the
// kernels to dequantise on the fly); conversion of a tensor to fp32 (to_f32), including the
// checkpoint's block-scaled FP8 and FP4 weights; a small writer for tests and tools.
// Does not own: what the tensors mean (weights.hpp maps names to layer structs).
//
// File format: [u64 little-endian header length N][N bytes of JSON header][data]. The header
// maps names to {"dtype", "shape", "data_offsets": [begin, end]} relative to the data start,
// plus an optional "__metadata__" object of string -> string.
// Validation (each failure is an error naming the file and the tensor or field; nothing here
// ever reads outside a mapping): N fits the file; the JSON parses; every dtype is known; shape
// dims are non-negative and shape x dtype size == end - begin without overflow; offsets lie in
// the data section, begin is aligned to the element size, no two tensors overlap; names are
// unique across all shards; the index's weight_map names only files that exist and every
// tensor it lists is in the shard it names.
// Lifetime: tensor_view::data points into a mapping owned by the checkpoint; valid while the
// checkpoint lives (the checkpoint is movable; a move keeps the mappings and the views valid).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kernels/base/result.hpp"
#include "kernels/cpu/qmatmul.hpp"

namespace cedar::model {

enum class dtype { f32, f16, bf16, f8_e4m3, f8_e8m0, i8, u8, i16, i32, i64, bool_ };
const char* dtype_name(dtype t);  // the safetensors spelling: "F32", "BF16", "F8_E4M3", ...
size_t dtype_size(dtype t);       // bytes per element

struct tensor_view {
  std::string name;
  dtype type = dtype::f32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // into the shard's mapping; n_bytes long
  size_t n_bytes = 0;
  std::string file;               // the shard this tensor lives in (for error messages)
  int64_t numel() const;
};

class checkpoint {
 public:
  // `path`: a .safetensors file, or a directory with model.safetensors or
  // model.safetensors.index.json. Maps every shard read-only and validates every header.
  static result<checkpoint> open(const std::string& path);

  checkpoint();
  ~checkpoint();
  checkpoint(checkpoint&&) noexcept;
  checkpoint& operator=(checkpoint&&) noexcept;
  checkpoint(const checkpoint&) = delete;
  checkpoint& operator=(const checkpoint&) = delete;

  const tensor_view* find(std::string_view name) const;  // nullptr if absent
  // The tensor, checked: the error names the tensor, the expected and actual dtype/shape and
  // the file (or says the tensor is absent).
  result<const tensor_view*> get(std::string_view name, dtype type,
                                 std::vector<int64_t> shape) const;
  const std::vector<tensor_view>& tensors() const;  // in (shard, offset) order
  // "__metadata__" values (of the first shard that has the key); "" if absent.
  std::string metadata(std::string_view key) const;
  const std::string& path() const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

// The tensor as fp32, row-major, numel() values.
//   F32, BF16, F16: converted directly.
//   F8_E4M3 weights [rows, cols]: dequantised with the companion scale tensor
//     "<name without .weight>.scale" (F8_E8M0/UE8M0 or F32), one scale per 32x32 block:
//     shape [ceil(rows/32), ceil(cols/32)].
//   I8 FP4 experts [rows, cols/2] (two E2M1 codes per byte, even element in the low nibble):
//     dequantised with "<...>.scale" (F8_E8M0 or F32) of shape [rows, cols/32], giving
//     [rows, cols] values.
//   I8/U8/I16/I32/I64/BOOL without a scale: converted value by value.
// Errors name the tensor and what is wrong (a missing or misshapen scale, an odd dtype).
result<std::vector<float>> to_f32(const checkpoint& ckpt, const tensor_view& t);
// The logical shape to_f32 returns (differs from t.shape for packed FP4: last dim x2).
std::vector<int64_t> to_f32_shape(const checkpoint& ckpt, const tensor_view& t);

// The tensor as a weight matrix [rows, cols] (leading dims flattened into rows; packed FP4:
// cols = 2 x the stored bytes per row) in its STORED format, referencing the mapping, no copy:
//   F32 and BF16 (aligned to their element size in memory) as is;
//   F8_E4M3 with its companion scale (32x32 or 1x32 blocks, as to_f32);
//   packed FP4 (I8/U8 with a companion scale [rows, cols/32]).
// UE8M0 scales are used in place; F32/BF16 scales are decoded into `scale_storage`, which the
// caller must keep (unmoved contents) as long as the matrix. Every other dtype (F16, integers
// without a scale, misaligned data) is converted by to_f32 into `f32_storage`, same rule.
// The matrix is valid while the checkpoint (and the storages) live.
result<kernels::qmatrix> weight_matrix(const checkpoint& ckpt, const tensor_view& t,
                                       std::vector<float>& f32_storage,
                                       std::vector<float>& scale_storage);

// Writes fp32 tensors (name -> (shape, values)) as one .safetensors file with the given
// __metadata__. For tests and tools. The header is padded so data starts 8-byte aligned; data
// is laid out larger elements first (stable otherwise), so every tensor is aligned to its
// element size and the data section has no gaps (what the reference Rust reader requires).
using f32_tensor_list =
    std::vector<std::pair<std::string, std::pair<std::vector<int64_t>, std::vector<float>>>>;
result<void> write_safetensors(const std::string& path, const f32_tensor_list& f32_tensors,
                               const std::map<std::string, std::string>& metadata = {});

// A raw tensor for the general writer: any dtype, bytes already in that dtype's encoding.
struct raw_tensor {
  std::string name;
  dtype type = dtype::f32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};
result<void> write_safetensors_raw(const std::string& path, const std::vector<raw_tensor>& tensors,
                                   const std::map<std::string, std::string>& metadata = {});

}  // namespace cedar::model
