// safetensors — memory-mapped checkpoint reader, validation, fp32 conversion and a small
// writer (see safetensors.hpp for the contract).
//
// Data flow: open() resolves `path` to a list of shard files (one file, a directory's
// model.safetensors, or the files named by model.safetensors.index.json) -> map_file() maps
// each shard -> parse_shard() validates its header and appends tensor_views -> the index's
// weight_map is checked against what the shards hold -> a name -> tensor index is built.
// Every check happens before any tensor byte is read, so a truncated or corrupted file is an
// error, never an out-of-bounds read.
#include "model/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <simdjson.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>
#include <sstream>

#include "kernels/cpu/quant.hpp"

namespace cedar::model {

namespace fs = std::filesystem;
namespace ck = cedar::kernels;

// ---- dtypes ---------------------------------------------------------------------------------

namespace {
struct dtype_entry {
  dtype type;
  const char* name;
  size_t size;
};
constexpr dtype_entry k_dtype_table[] = {
    {dtype::f32, "F32", 4},         {dtype::f16, "F16", 2},         {dtype::bf16, "BF16", 2},
    {dtype::f8_e4m3, "F8_E4M3", 1}, {dtype::f8_e8m0, "F8_E8M0", 1}, {dtype::i8, "I8", 1},
    {dtype::u8, "U8", 1},           {dtype::i16, "I16", 2},         {dtype::i32, "I32", 4},
    {dtype::i64, "I64", 8},         {dtype::bool_, "BOOL", 1},
};

bool dtype_from_name(std::string_view s, dtype& out) {
  for (const auto& e : k_dtype_table)
    if (s == e.name) {
      out = e.type;
      return true;
    }
  return false;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

constexpr uint64_t k_max_header = 100ull << 20;  // the format's own limit (100 MB)
}  // namespace

const char* dtype_name(dtype t) {
  for (const auto& e : k_dtype_table)
    if (e.type == t) return e.name;
  return "?";
}

size_t dtype_size(dtype t) {
  for (const auto& e : k_dtype_table)
    if (e.type == t) return e.size;
  return 0;
}

int64_t tensor_view::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

// ---- the checkpoint -------------------------------------------------------------------------

namespace {

struct mapping {
  const uint8_t* base = nullptr;
  size_t size = 0;
  std::string path;
};

result<mapping> map_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    return make_error(e == ENOENT ? errc::not_found : errc::io,
                      path + ": cannot open (" + std::strerror(e) + ")");
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return make_error(errc::io, path + ": not a regular file");
  }
  mapping m;
  m.path = path;
  m.size = static_cast<size_t>(st.st_size);
  if (m.size < 8) {
    ::close(fd);
    return make_error(errc::invalid_format,
                      path + ": file is " + std::to_string(m.size) +
                          " bytes, shorter than the 8-byte safetensors header length");
  }
  void* p = ::mmap(nullptr, m.size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int e = errno;
  ::close(fd);
  if (p == MAP_FAILED) return make_error(errc::io, path + ": mmap failed (" + std::strerror(e) + ")");
  m.base = static_cast<const uint8_t*>(p);
  return m;
}

void unmap(mapping& m) {
  if (m.base) ::munmap(const_cast<uint8_t*>(m.base), m.size);
  m.base = nullptr;
}

// Reads a JSON array of non-negative integers.
bool read_uint_array(simdjson::dom::element e, std::vector<uint64_t>& out) {
  simdjson::dom::array arr;
  if (e.get_array().get(arr)) return false;
  out.clear();
  for (simdjson::dom::element v : arr) {
    uint64_t x;
    if (v.get_uint64().get(x)) return false;
    out.push_back(x);
  }
  return true;
}

// Validates one shard's header and appends its tensors.
status parse_shard(const mapping& m, std::vector<tensor_view>& tensors,
                   std::map<std::string, std::string>& metadata) {
  const std::string& file = m.path;
  auto bad = [&](const std::string& what) { return make_error(errc::invalid_format, file + ": " + what); };
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(m.base[i]) << (8 * i);
  if (n > m.size - 8)
    return bad("header length " + std::to_string(n) + " exceeds the file size (" +
               std::to_string(m.size) + " bytes): truncated or not a safetensors file");
  if (n > k_max_header) return bad("header length " + std::to_string(n) + " exceeds the 100 MB limit");
  if (n < 2) return bad("header length " + std::to_string(n) + " is too small for a JSON object");
  const uint8_t* data = m.base + 8 + n;
  const uint64_t data_size = m.size - 8 - n;

  simdjson::dom::parser parser;
  simdjson::padded_string json(reinterpret_cast<const char*>(m.base + 8), static_cast<size_t>(n));
  simdjson::dom::element doc;
  if (auto err = parser.parse(json).get(doc))
    return bad(std::string("header is not valid JSON (") + simdjson::error_message(err) + ")");
  simdjson::dom::object obj;
  if (doc.get_object().get(obj)) return bad("header is not a JSON object");

  struct span {
    uint64_t begin, end;
    size_t idx;
  };
  std::vector<span> spans;
  const size_t first = tensors.size();
  std::set<std::string, std::less<>> seen;
  for (auto field : obj) {
    const std::string name(field.key);
    if (!seen.insert(name).second) return bad("duplicate entry '" + name + "' in the header");
    if (name == "__metadata__") {
      simdjson::dom::object md;
      if (field.value.get_object().get(md)) return bad("'__metadata__' is not an object");
      for (auto kv : md) {
        std::string_view v;
        if (kv.value.get_string().get(v))
          return bad("'__metadata__' field '" + std::string(kv.key) + "' is not a string");
        metadata.emplace(std::string(kv.key), std::string(v));
      }
      continue;
    }
    const std::string where = "tensor '" + name + "'";
    simdjson::dom::object t;
    if (field.value.get_object().get(t)) return bad(where + ": entry is not an object");
    tensor_view tv;
    tv.name = name;
    tv.file = file;
    bool have_dtype = false, have_shape = false, have_offsets = false;
    std::vector<uint64_t> offsets, dims;
    for (auto f : t) {
      if (f.key == "dtype") {
        std::string_view s;
        if (f.value.get_string().get(s)) return bad(where + ": field 'dtype' is not a string");
        if (!dtype_from_name(s, tv.type))
          return bad(where + ": unknown dtype '" + std::string(s) +
                     "' (known: F32 F16 BF16 F8_E4M3 F8_E8M0 I8 U8 I16 I32 I64 BOOL)");
        have_dtype = true;
      } else if (f.key == "shape") {
        if (!read_uint_array(f.value, dims))
          return bad(where + ": field 'shape' is not an array of non-negative integers");
        have_shape = true;
      } else if (f.key == "data_offsets") {
        if (!read_uint_array(f.value, offsets) || offsets.size() != 2)
          return bad(where + ": field 'data_offsets' is not [begin, end]");
        have_offsets = true;
      } else {
        return bad(where + ": unexpected field '" + std::string(f.key) + "'");
      }
    }
    if (!have_dtype) return bad(where + ": missing field 'dtype'");
    if (!have_shape) return bad(where + ": missing field 'shape'");
    if (!have_offsets) return bad(where + ": missing field 'data_offsets'");
    const uint64_t esize = dtype_size(tv.type);
    uint64_t bytes = esize;
    for (uint64_t d : dims) {
      if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          (d != 0 && bytes > std::numeric_limits<uint64_t>::max() / d))
        return bad(where + ": shape overflows");
      bytes *= d;
      tv.shape.push_back(static_cast<int64_t>(d));
    }
    const uint64_t begin = offsets[0], end = offsets[1];
    if (begin > end)
      return bad(where + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                 "] has begin > end");
    if (end > data_size)
      return bad(where + ": data_offsets end " + std::to_string(end) +
                 " lies past the data section (" + std::to_string(data_size) +
                 " bytes): truncated file or bad offsets");
    if (end - begin != bytes)
      return bad(where + ": shape " + shape_str(tv.shape) + " x " + dtype_name(tv.type) + " is " +
                 std::to_string(bytes) + " bytes, but data_offsets span " +
                 std::to_string(end - begin));
    if (begin % esize != 0)
      return bad(where + ": data offset " + std::to_string(begin) + " is not aligned to the " +
                 std::to_string(esize) + "-byte " + dtype_name(tv.type) + " element");
    tv.data = data + begin;
    tv.n_bytes = static_cast<size_t>(bytes);
    spans.push_back({begin, end, tensors.size()});
    tensors.push_back(std::move(tv));
  }
  std::sort(spans.begin(), spans.end(),
            [](const span& a, const span& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  uint64_t covered = 0;
  const std::string* last = nullptr;
  for (const auto& s : spans) {
    if (s.begin == s.end) continue;  // empty tensors overlap nothing
    if (s.begin < covered)
      return bad("tensor '" + tensors[s.idx].name + "' overlaps tensor '" + *last + "' in the data section");
    covered = s.end;
    last = &tensors[s.idx].name;
  }
  // Keep this shard's tensors in offset order.
  std::vector<tensor_view> ordered;
  ordered.reserve(spans.size());
  for (const auto& s : spans) ordered.push_back(std::move(tensors[s.idx]));
  tensors.resize(first);
  for (auto& t : ordered) tensors.push_back(std::move(t));
  return {};
}

result<std::string> read_text_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return make_error(errc::not_found, path + ": cannot open");
  std::string s;
  char buf[65536];
  size_t k;
  while ((k = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, k);
  const bool err = std::ferror(f);
  std::fclose(f);
  if (err) return make_error(errc::io, path + ": read failed");
  return s;
}

}  // namespace

struct checkpoint::impl {
  std::string path;
  std::vector<mapping> maps;
  std::vector<tensor_view> tensors;
  std::map<std::string, size_t, std::less<>> by_name;
  std::map<std::string, std::string> metadata;
  ~impl() {
    for (auto& m : maps) unmap(m);
  }
};

checkpoint::checkpoint() = default;
checkpoint::~checkpoint() = default;
checkpoint::checkpoint(checkpoint&&) noexcept = default;
checkpoint& checkpoint::operator=(checkpoint&&) noexcept = default;

result<checkpoint> checkpoint::open(const std::string& path) {
  checkpoint ck;
  ck.impl_ = std::make_unique<impl>();
  impl& im = *ck.impl_;
  im.path = path;

  std::error_code ec;
  std::vector<std::string> shards;
  std::map<std::string, std::string> weight_map;  // tensor -> shard path (sharded only)
  std::string index_path;
  if (fs::is_directory(path, ec)) {
    const fs::path dir(path);
    if (fs::exists(dir / "model.safetensors.index.json", ec)) {
      index_path = (dir / "model.safetensors.index.json").string();
      auto text = read_text_file(index_path);
      if (!text) return text.take_err();
      simdjson::dom::parser parser;
      simdjson::padded_string json(*text);
      simdjson::dom::element doc;
      auto bad = [&](const std::string& what) {
        return make_error(errc::invalid_format, index_path + ": " + what);
      };
      if (auto err = parser.parse(json).get(doc))
        return bad(std::string("not valid JSON (") + simdjson::error_message(err) + ")");
      simdjson::dom::object wm;
      if (doc["weight_map"].get_object().get(wm)) return bad("missing object 'weight_map'");
      std::set<std::string> files;
      for (auto kv : wm) {
        std::string_view f;
        if (kv.value.get_string().get(f))
          return bad("weight_map entry '" + std::string(kv.key) + "' is not a file name");
        const fs::path rel(f);
        if (f.empty() || rel.is_absolute() || rel.has_parent_path())
          return bad("weight_map entry '" + std::string(kv.key) + "' names '" + std::string(f) +
                     "', not a file name in the checkpoint directory");
        const std::string full = (dir / rel).string();
        if (!weight_map.emplace(std::string(kv.key), full).second)
          return bad("weight_map lists tensor '" + std::string(kv.key) + "' twice");
        if (files.insert(full).second) {
          if (!fs::is_regular_file(full, ec))
            return make_error(errc::not_found, index_path + ": weight_map names shard '" +
                                                   std::string(f) + "' (for tensor '" +
                                                   std::string(kv.key) + "'), which does not exist");
          shards.push_back(full);
        }
      }
      if (shards.empty()) return bad("weight_map is empty");
    } else if (fs::exists(dir / "model.safetensors", ec)) {
      shards.push_back((dir / "model.safetensors").string());
    } else {
      return make_error(errc::not_found, path +
                                             ": directory holds neither model.safetensors nor "
                                             "model.safetensors.index.json");
    }
  } else {
    shards.push_back(path);
  }

  for (const auto& s : shards) {
    auto m = map_file(s);
    if (!m) return m.take_err();
    im.maps.push_back(*m);
    CEDAR_TRY(parse_shard(im.maps.back(), im.tensors, im.metadata));
  }
  for (size_t i = 0; i < im.tensors.size(); ++i) {
    const auto& t = im.tensors[i];
    auto [it, fresh] = im.by_name.emplace(t.name, i);
    if (!fresh)
      return make_error(errc::invalid_format, "tensor '" + t.name + "' appears in both " +
                                                  im.tensors[it->second].file + " and " + t.file);
  }
  for (const auto& [name, file] : weight_map) {
    auto it = im.by_name.find(name);
    if (it == im.by_name.end())
      return make_error(errc::not_found, index_path + ": tensor '" + name + "' is mapped to " +
                                             file + ", which does not hold it");
    if (im.tensors[it->second].file != file)
      return make_error(errc::mismatch, index_path + ": tensor '" + name + "' is mapped to " + file +
                                            " but lives in " + im.tensors[it->second].file);
  }
  return ck;
}

const tensor_view* checkpoint::find(std::string_view name) const {
  if (!impl_) return nullptr;
  auto it = impl_->by_name.find(name);
  return it == impl_->by_name.end() ? nullptr : &impl_->tensors[it->second];
}

result<const tensor_view*> checkpoint::get(std::string_view name, dtype type,
                                           std::vector<int64_t> shape) const {
  const tensor_view* t = find(name);
  if (!t)
    return make_error(errc::not_found, (impl_ ? impl_->path : std::string("checkpoint")) +
                                           ": tensor '" + std::string(name) + "' not found (expected " +
                                           dtype_name(type) + " " + shape_str(shape) + ")");
  if (t->type != type || t->shape != shape)
    return make_error(errc::mismatch, t->file + ": tensor '" + t->name + "' is " +
                                          dtype_name(t->type) + " " + shape_str(t->shape) +
                                          ", expected " + dtype_name(type) + " " + shape_str(shape));
  return t;
}

const std::vector<tensor_view>& checkpoint::tensors() const {
  static const std::vector<tensor_view> none;
  return impl_ ? impl_->tensors : none;
}

std::string checkpoint::metadata(std::string_view key) const {
  if (!impl_) return {};
  auto it = impl_->metadata.find(std::string(key));
  return it == impl_->metadata.end() ? std::string() : it->second;
}

const std::string& checkpoint::path() const {
  static const std::string none;
  return impl_ ? impl_->path : none;
}

// ---- conversion to fp32 ---------------------------------------------------------------------

namespace {

// The companion scale of a quantised weight: "<name without .weight>.scale".
const tensor_view* scale_of(const checkpoint& ckpt, const tensor_view& t) {
  const std::string suffix = ".weight";
  std::string base = t.name;
  if (base.size() > suffix.size() && base.compare(base.size() - suffix.size(), suffix.size(), suffix) == 0)
    base.resize(base.size() - suffix.size());
  return ckpt.find(base + ".scale");
}

template <class T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Decoded scales, one float each; F8_E8M0 (UE8M0), F32 or BF16.
result<std::vector<float>> decode_scales(const tensor_view& s, const tensor_view& w) {
  std::vector<float> out(static_cast<size_t>(s.numel()));
  for (size_t i = 0; i < out.size(); ++i) {
    switch (s.type) {
      case dtype::f8_e8m0: out[i] = ck::ue8m0_decode(s.data[i]); break;
      case dtype::f32: out[i] = load<float>(s.data + 4 * i); break;
      case dtype::bf16: out[i] = ck::bf16_to_f32(load<uint16_t>(s.data + 2 * i)); break;
      default:
        return make_error(errc::mismatch, s.file + ": scale tensor '" + s.name + "' of '" + w.name +
                                              "' is " + dtype_name(s.type) +
                                              ", expected F8_E8M0, F32 or BF16");
    }
  }
  return out;
}

// rows x cols view of a tensor: leading dims flattened into rows.
void as_matrix(const std::vector<int64_t>& shape, int64_t& rows, int64_t& cols) {
  cols = shape.empty() ? 1 : shape.back();
  rows = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= shape[i];
}

bool is_fp4_packed(const checkpoint& ckpt, const tensor_view& t) {
  return (t.type == dtype::i8 || t.type == dtype::u8) && scale_of(ckpt, t) != nullptr;
}

// Rows per scale block of an F8_E4M3 weight: 32x32 blocks (dense weights:
// [ceil(r/32), ceil(c/32)]) or 1x32 row blocks (Engram tables: [r, ceil(c/32)]).
result<int64_t> f8_block_rows(const tensor_view& t, const tensor_view& s) {
  int64_t rows, cols, srows, scols;
  as_matrix(t.shape, rows, cols);
  as_matrix(s.shape, srows, scols);
  if (s.shape.size() == t.shape.size() && srows == (rows + 31) / 32 && scols == (cols + 31) / 32) return 32;
  if (s.shape.size() == t.shape.size() && srows == rows && scols == (cols + 31) / 32) return 1;
  return make_error(errc::mismatch,
                    t.file + ": tensor '" + t.name + "' " + shape_str(t.shape) + ": scale '" + s.name +
                        "' has shape " + shape_str(s.shape) + ", expected 32x32 blocks " +
                        shape_str({(rows + 31) / 32, (cols + 31) / 32}) + " or 1x32 row blocks " +
                        shape_str({rows, (cols + 31) / 32}));
}

// Packed FP4 [rows, cols/2] needs a scale [rows, cols/32] with cols a multiple of 32.
status check_fp4_scale(const tensor_view& t, const tensor_view& s) {
  int64_t rows, half, srows, scols;
  as_matrix(t.shape, rows, half);
  as_matrix(s.shape, srows, scols);
  const int64_t cols = half * 2;
  if (cols % 32 != 0 || s.shape.size() != t.shape.size() || srows != rows || scols != cols / 32)
    return make_error(errc::mismatch, t.file + ": tensor '" + t.name + "' " + shape_str(t.shape) +
                                          " (packed FP4, logical columns " + std::to_string(cols) +
                                          "): scale '" + s.name + "' has shape " + shape_str(s.shape) +
                                          ", expected " + shape_str({rows, cols / 32}) +
                                          " (logical columns a multiple of 32)");
  return {};
}

}  // namespace

result<kernels::qmatrix> weight_matrix(const checkpoint& ckpt, const tensor_view& t,
                                       std::vector<float>& f32_storage,
                                       std::vector<float>& scale_storage) {
  kernels::qmatrix q;
  as_matrix(t.shape, q.rows, q.cols);
  const uintptr_t addr = reinterpret_cast<uintptr_t>(t.data);
  const tensor_view* s = nullptr;
  if (t.type == dtype::f8_e4m3 || t.type == dtype::i8 || t.type == dtype::u8) s = scale_of(ckpt, t);
  // The block scales: UE8M0 bytes in place, anything else decoded to fp32.
  auto attach_scales = [&]() -> status {
    q.scale_cols = (q.cols + 31) / 32;
    if (s->type == dtype::f8_e8m0) {
      q.scale_e8m0 = s->data;
      return {};
    }
    auto sc = decode_scales(*s, t);
    if (!sc) return sc.take_err();
    scale_storage = std::move(*sc);
    q.scale_f32 = scale_storage.data();
    return {};
  };
  if (t.type == dtype::f32 && addr % alignof(float) == 0) {
    q.format = kernels::weight_format::f32;
    q.data = t.data;
    return q;
  }
  if (t.type == dtype::bf16 && addr % alignof(uint16_t) == 0) {
    q.format = kernels::weight_format::bf16;
    q.data = t.data;
    return q;
  }
  if (t.type == dtype::f8_e4m3 && s) {
    auto br = f8_block_rows(t, *s);
    if (!br) return br.take_err();
    q.format = kernels::weight_format::f8_e4m3;
    q.data = t.data;
    q.scale_block_rows = (int)*br;
    CEDAR_TRY(attach_scales());
    return q;
  }
  if ((t.type == dtype::i8 || t.type == dtype::u8) && s) {
    CEDAR_TRY(check_fp4_scale(t, *s));
    q.format = kernels::weight_format::fp4_e2m1;
    q.cols *= 2;
    q.data = t.data;
    q.scale_block_rows = 1;
    CEDAR_TRY(attach_scales());
    return q;
  }
  auto v = to_f32(ckpt, t);
  if (!v) return v.take_err();
  f32_storage = std::move(*v);
  q.format = kernels::weight_format::f32;
  q.data = f32_storage.data();
  return q;
}

std::vector<int64_t> to_f32_shape(const checkpoint& ckpt, const tensor_view& t) {
  std::vector<int64_t> s = t.shape;
  if (is_fp4_packed(ckpt, t) && !s.empty()) s.back() *= 2;
  return s;
}

result<std::vector<float>> to_f32(const checkpoint& ckpt, const tensor_view& t) {
  const size_t n = static_cast<size_t>(t.numel());
  std::vector<float> out;
  const std::string where = t.file + ": tensor '" + t.name + "'";
  switch (t.type) {
    case dtype::f32:
      out.resize(n);
      if (n) std::memcpy(out.data(), t.data, n * 4);
      return out;
    case dtype::bf16:
      out.resize(n);
      for (size_t i = 0; i < n; ++i) out[i] = ck::bf16_to_f32(load<uint16_t>(t.data + 2 * i));
      return out;
    case dtype::f16:
      out.resize(n);
      for (size_t i = 0; i < n; ++i) out[i] = ck::f16_to_f32(load<uint16_t>(t.data + 2 * i));
      return out;
    case dtype::f8_e8m0:
      out.resize(n);
      for (size_t i = 0; i < n; ++i) out[i] = ck::ue8m0_decode(t.data[i]);
      return out;
    case dtype::f8_e4m3: {
      const tensor_view* s = scale_of(ckpt, t);
      if (!s) return make_error(errc::not_found, where + " is F8_E4M3 but has no companion scale tensor "
                                                 "('<name without .weight>.scale')");
      auto sc = decode_scales(*s, t);
      if (!sc) return sc.take_err();
      int64_t rows, cols, scols;
      as_matrix(t.shape, rows, cols);
      auto br = f8_block_rows(t, *s);
      if (!br) return br.take_err();
      const int64_t brows = *br;
      scols = (cols + 31) / 32;
      out.resize(n);
      for (int64_t r = 0; r < rows; ++r) {
        const float* srow = sc->data() + (r / brows) * scols;
        for (int64_t c = 0; c < cols; ++c)
          out[r * cols + c] = ck::e4m3_decode(t.data[r * cols + c]) * srow[c / 32];
      }
      return out;
    }
    case dtype::i8:
    case dtype::u8: {
      const tensor_view* s = scale_of(ckpt, t);
      if (!s) {
        out.resize(n);
        for (size_t i = 0; i < n; ++i)
          out[i] = t.type == dtype::i8 ? static_cast<float>(static_cast<int8_t>(t.data[i]))
                                       : static_cast<float>(t.data[i]);
        return out;
      }
      // Packed FP4 (E2M1) experts: [rows, cols/2] bytes, element 2i in the low nibble;
      // one scale per 32 logical columns: [rows, cols/32].
      auto sc = decode_scales(*s, t);
      if (!sc) return sc.take_err();
      CEDAR_TRY(check_fp4_scale(t, *s));
      int64_t rows, half, scols;
      as_matrix(t.shape, rows, half);
      const int64_t cols = half * 2;
      scols = cols / 32;
      out.resize(n * 2);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t j = 0; j < half; ++j) {
          const uint8_t b = t.data[r * half + j];
          const float sv = (*sc)[r * scols + (2 * j) / 32];
          out[r * cols + 2 * j] = ck::e2m1_decode(b & 15) * sv;
          out[r * cols + 2 * j + 1] = ck::e2m1_decode(b >> 4) * sv;
        }
      }
      return out;
    }
    case dtype::i16:
      out.resize(n);
      for (size_t i = 0; i < n; ++i) out[i] = load<int16_t>(t.data + 2 * i);
      return out;
    case dtype::i32:
      out.resize(n);
      for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(load<int32_t>(t.data + 4 * i));
      return out;
    case dtype::i64:
      out.resize(n);
      for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(load<int64_t>(t.data + 8 * i));
      return out;
    case dtype::bool_:
      out.resize(n);
      for (size_t i = 0; i < n; ++i) out[i] = t.data[i] ? 1.0f : 0.0f;
      return out;
  }
  return make_error(errc::internal, where + ": unhandled dtype");
}

// ---- writer ---------------------------------------------------------------------------------

namespace {

std::string json_escape(const std::string& s) {
  std::string o;
  for (unsigned char c : s) {
    switch (c) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\n': o += "\\n"; break;
      case '\t': o += "\\t"; break;
      case '\r': o += "\\r"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          o += buf;
        } else {
          o += static_cast<char>(c);
        }
    }
  }
  return o;
}

}  // namespace

result<void> write_safetensors_raw(const std::string& path, const std::vector<raw_tensor>& tensors,
                                   const std::map<std::string, std::string>& metadata) {
  std::ostringstream h;
  h << '{';
  bool first = true;
  if (!metadata.empty()) {
    h << "\"__metadata__\":{";
    bool f2 = true;
    for (const auto& [k, v] : metadata) {
      h << (f2 ? "" : ",") << '"' << json_escape(k) << "\":\"" << json_escape(v) << '"';
      f2 = false;
    }
    h << '}';
    first = false;
  }
  // Data order: larger elements first (stable), as the reference writer does, so every
  // offset is aligned to its element size without gaps between tensors.
  std::vector<const raw_tensor*> order;
  for (const auto& t : tensors) order.push_back(&t);
  std::stable_sort(order.begin(), order.end(), [](const raw_tensor* a, const raw_tensor* b) {
    return dtype_size(a->type) > dtype_size(b->type);
  });
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const raw_tensor* tp : order) {
    const raw_tensor& t = *tp;
    if (t.name.empty() || t.name == "__metadata__" || !names.insert(t.name).second)
      return make_error(errc::invalid_argument,
                        path + ": write_safetensors: bad or duplicate tensor name '" + t.name + "'");
    uint64_t numel = 1;
    for (auto d : t.shape) {
      if (d < 0)
        return make_error(errc::invalid_argument, path + ": tensor '" + t.name + "' has a negative dimension");
      numel *= static_cast<uint64_t>(d);
    }
    if (numel * dtype_size(t.type) != t.bytes.size())
      return make_error(errc::invalid_argument,
                        path + ": tensor '" + t.name + "': " + std::to_string(t.bytes.size()) +
                            " bytes, but shape " + shape_str(t.shape) + " x " + dtype_name(t.type) +
                            " needs " + std::to_string(numel * dtype_size(t.type)));
    h << (first ? "" : ",") << '"' << json_escape(t.name) << "\":{\"dtype\":\"" << dtype_name(t.type)
      << "\",\"shape\":[";
    for (size_t i = 0; i < t.shape.size(); ++i) h << (i ? "," : "") << t.shape[i];
    h << "],\"data_offsets\":[" << offset << ',' << offset + t.bytes.size() << "]}";
    offset += t.bytes.size();
    first = false;
  }
  h << '}';
  std::string header = h.str();
  header.append((8 - header.size() % 8) % 8, ' ');  // data section starts 8-byte aligned
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return make_error(errc::io, path + ": cannot create (" + std::strerror(errno) + ")");
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(header.size()) >> (8 * i));
  bool ok = std::fwrite(len, 1, 8, f) == 8 && std::fwrite(header.data(), 1, header.size(), f) == header.size();
  for (const raw_tensor* t : order)
    if (ok && !t->bytes.empty()) ok = std::fwrite(t->bytes.data(), 1, t->bytes.size(), f) == t->bytes.size();
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) return make_error(errc::io, path + ": write failed");
  return {};
}

result<void> write_safetensors(const std::string& path, const f32_tensor_list& f32_tensors,
                               const std::map<std::string, std::string>& metadata) {
  std::vector<raw_tensor> raw;
  raw.reserve(f32_tensors.size());
  for (const auto& [name, sv] : f32_tensors) {
    raw_tensor t;
    t.name = name;
    t.type = dtype::f32;
    t.shape = sv.first;
    t.bytes.resize(sv.second.size() * 4);
    if (!sv.second.empty()) std::memcpy(t.bytes.data(), sv.second.data(), t.bytes.size());
    raw.push_back(std::move(t));
  }
  return write_safetensors_raw(path, raw, metadata);
}

}  // namespace cedar::model
