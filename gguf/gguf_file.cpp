#include "gguf/gguf_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace tandem {

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
constexpr int kMaxArrayDepth = 4;
constexpr uint32_t kMaxDims = 4;

// Thrown only inside this file and turned into an Error at the parse() boundary, so that the
// dozens of bounds checks below stay readable.
struct ParseFailure {
  std::string message;
};

[[noreturn]] void fail(std::string msg) { throw ParseFailure{std::move(msg)}; }

// Bounds-checked little-endian reader over the file image.
class Cursor {
 public:
  Cursor(const uint8_t* base, uint64_t size) : base_(base), size_(size) {}
  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  const uint8_t* take(uint64_t n, std::string_view what) {
    if (n > remaining())
      fail(fmt::format("{}: needs {} bytes at offset {}, but the file ends at {} ({} left)", what, n,
                       pos_, size_, remaining()));
    const uint8_t* p = base_ + pos_;
    pos_ += n;
    return p;
  }
  template <typename T>
  T read(std::string_view what) {
    T v;
    std::memcpy(&v, take(sizeof(T), what), sizeof(T));
    return v;
  }
  std::string_view string(std::string_view what) {
    const uint64_t len = read<uint64_t>(what);
    if (len > remaining())
      fail(fmt::format("{}: string length {} at offset {} exceeds the {} bytes left in the file", what,
                       len, pos_ - 8, remaining()));
    return {reinterpret_cast<const char*>(take(len, what)), (size_t)len};
  }

 private:
  const uint8_t* base_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

GgufType checked_type(uint32_t raw, std::string_view what) {
  if (raw > static_cast<uint32_t>(GgufType::FLOAT64))
    fail(fmt::format("{}: unknown value type {}", what, raw));
  return static_cast<GgufType>(raw);
}

GgufValue read_value(Cursor& c, GgufType type, const std::string& what, int depth);

std::shared_ptr<const GgufArray> read_array(Cursor& c, const std::string& what, int depth) {
  if (depth >= kMaxArrayDepth) fail(fmt::format("{}: arrays nested deeper than {}", what, kMaxArrayDepth));
  auto arr = std::make_shared<GgufArray>();
  arr->elem_type = checked_type(c.read<uint32_t>(what + " (array type)"), what);
  arr->count = c.read<uint64_t>(what + " (array count)");
  // Every element takes at least this many bytes, so the count is bounded by what is left.
  const size_t scalar = gguf_scalar_size(arr->elem_type);
  const uint64_t min_elem = scalar ? scalar : (arr->elem_type == GgufType::STRING ? 8 : 12);
  if (arr->count > c.remaining() / min_elem)
    fail(fmt::format("{}: array of {} {} elements needs at least {} bytes, only {} left in the file", what,
                     arr->count, gguf_type_name(arr->elem_type), arr->count * (double)min_elem,
                     c.remaining()));
  if (scalar) {
    arr->raw = c.take(arr->count * scalar, what);
    if (arr->elem_type == GgufType::BOOL)
      for (uint64_t i = 0; i < arr->count; i++)
        if (arr->raw[i] > 1) fail(fmt::format("{}: element {} is not a valid bool ({})", what, i, arr->raw[i]));
  } else if (arr->elem_type == GgufType::STRING) {
    arr->strings.reserve(arr->count);
    for (uint64_t i = 0; i < arr->count; i++) arr->strings.push_back(c.string(what));
  } else {
    arr->arrays.reserve(arr->count);
    for (uint64_t i = 0; i < arr->count; i++) arr->arrays.push_back(read_value(c, GgufType::ARRAY, what, depth + 1));
  }
  return arr;
}

GgufValue read_value(Cursor& c, GgufType type, const std::string& what, int depth) {
  GgufValue v;
  v.type = type;
  switch (type) {
    case GgufType::UINT8: v.v = (uint64_t)c.read<uint8_t>(what); break;
    case GgufType::UINT16: v.v = (uint64_t)c.read<uint16_t>(what); break;
    case GgufType::UINT32: v.v = (uint64_t)c.read<uint32_t>(what); break;
    case GgufType::UINT64: v.v = c.read<uint64_t>(what); break;
    case GgufType::INT8: v.v = (int64_t)c.read<int8_t>(what); break;
    case GgufType::INT16: v.v = (int64_t)c.read<int16_t>(what); break;
    case GgufType::INT32: v.v = (int64_t)c.read<int32_t>(what); break;
    case GgufType::INT64: v.v = c.read<int64_t>(what); break;
    case GgufType::FLOAT32: v.v = (double)c.read<float>(what); break;
    case GgufType::FLOAT64: v.v = c.read<double>(what); break;
    case GgufType::BOOL: {
      const uint8_t b = c.read<uint8_t>(what);
      if (b > 1) fail(fmt::format("{}: not a valid bool ({})", what, b));
      v.v = b != 0;
      break;
    }
    case GgufType::STRING: v.v = c.string(what); break;
    case GgufType::ARRAY: v.v = read_array(c, what, depth); break;
  }
  return v;
}

// The metadata's key-value pairs; a key may appear once.
void read_metadata(Cursor& c, uint64_t n_kv, std::map<std::string, GgufValue, std::less<>>& kv) {
  for (uint64_t i = 0; i < n_kv; i++) {
    const std::string_view key = c.string(fmt::format("metadata key #{}", i));
    const std::string what = fmt::format("metadata '{}'", key);
    const GgufType type = checked_type(c.read<uint32_t>(what + " (type)"), what);
    GgufValue v = read_value(c, type, what, 0);
    if (!kv.emplace(std::string(key), std::move(v)).second) fail(fmt::format("metadata key '{}' appears twice", key));
  }
}

// general.alignment: a power of two up to 1 MiB.
uint64_t alignment_of(const GgufValue& a) {
  if (!a.is_integer()) fail("general.alignment is not an integer");
  const uint64_t al = std::holds_alternative<uint64_t>(a.v) ? std::get<uint64_t>(a.v) : (uint64_t)std::get<int64_t>(a.v);
  if (al == 0 || (al & (al - 1)) != 0 || al > (1u << 20))
    fail(fmt::format("general.alignment {} is not a power of two up to 1 MiB", al));
  return al;
}

// Tensor info #i: its name, dims (1 to 4, their product bounded), type, bytes and offset.
GgufTensor read_tensor_info(Cursor& c, uint64_t i, uint64_t alignment) {
  GgufTensor t;
  t.name = std::string(c.string(fmt::format("tensor info #{} name", i)));
  const std::string what = fmt::format("tensor {}", t.name);
  const uint32_t n_dims = c.read<uint32_t>(what + " n_dims");
  if (n_dims == 0 || n_dims > kMaxDims) fail(fmt::format("{}: n_dims {} (must be 1..{})", what, n_dims, kMaxDims));
  uint64_t n_el = 1;
  for (uint32_t d = 0; d < n_dims; d++) {
    const uint64_t dim = c.read<uint64_t>(what + " dims");
    if (dim == 0 || dim > (1ull << 40)) fail(fmt::format("{}: dimension {} is {}", what, d, dim));
    if (n_el > (1ull << 50) / dim) fail(fmt::format("{}: element count overflows (dims too large)", what));
    n_el *= dim;
    t.dims.push_back(dim);
  }
  t.type_id = c.read<uint32_t>(what + " type");
  auto info = dtype_info(t.type_id);
  if (!info) fail(fmt::format("{}: unknown tensor type id {}", what, t.type_id));
  t.type = *info;
  if (t.dims[0] % t.type.block_elems != 0)
    fail(fmt::format("{}: row length {} is not a multiple of the {} block size {}", what, t.dims[0], t.type.name,
                     t.type.block_elems));
  t.nbytes = n_el / t.type.block_elems * t.type.block_bytes;
  t.offset = c.read<uint64_t>(what + " offset");
  if (t.offset % alignment != 0)
    fail(fmt::format("{}: data offset {} is not a multiple of the alignment {}", what, t.offset, alignment));
  return t;
}

// Points each tensor at its data, which must lie inside the file.
void place_tensors(std::vector<GgufTensor>& tensors, const uint8_t* base, uint64_t size, uint64_t data_offset) {
  for (GgufTensor& t : tensors) {
    const uint64_t avail = size - std::min(size, data_offset);
    if (t.offset > avail || t.nbytes > avail - t.offset)
      fail(fmt::format("tensor {}: data [{}, {}) runs past the end of the file (file is {}, tensor ends at {})",
                       t.name, data_offset + t.offset, data_offset + t.offset + t.nbytes, human_bytes(size),
                       human_bytes(data_offset + t.offset + t.nbytes)));
    t.data = base + data_offset + t.offset;
  }
}

// No two tensors' data may overlap.
void check_no_overlap(const std::vector<GgufTensor>& tensors) {
  std::vector<const GgufTensor*> by_offset;
  for (const auto& t : tensors) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const GgufTensor* a, const GgufTensor* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); i++) {
    const GgufTensor* a = by_offset[i - 1];
    const GgufTensor* b = by_offset[i];
    if (a->offset + a->nbytes > b->offset)
      fail(fmt::format("tensors {} [{}, {}) and {} [{}, {}) overlap", a->name, a->offset, a->offset + a->nbytes,
                       b->name, b->offset, b->offset + b->nbytes));
  }
}

}  // namespace

std::string human_bytes(uint64_t n) {
  if (n >= 1000ull * 1000 * 1000) return fmt::format("{:.2f} GB", n / 1e9);
  if (n >= 1000ull * 1000) return fmt::format("{:.1f} MB", n / 1e6);
  if (n >= 1000) return fmt::format("{:.1f} kB", n / 1e3);
  return fmt::format("{} bytes", n);
}

uint64_t GgufTensor::n_elements() const {
  uint64_t n = 1;
  for (uint64_t d : dims) n *= d;
  return n;
}

GgufFile::~GgufFile() {
  if (mapping_) munmap(mapping_, size_);
}

Result<std::unique_ptr<GgufFile>> GgufFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return make_error("{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return make_error("{}: not a regular file", path);
  }
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->source_ = path;
  f->size_ = (uint64_t)st.st_size;
  if (f->size_ > 0) {
    void* m = mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      ::close(fd);
      return make_error("{}: mmap of {} failed: {}", path, human_bytes(f->size_), std::strerror(errno));
    }
    f->mapping_ = m;
    f->base_ = static_cast<const uint8_t*>(m);
  }
  ::close(fd);
  TANDEM_TRY(f->parse());
  return f;
}

void GgufFile::release_pages(const uint8_t* p, size_t n) const {
  if (!mapping_ || p < base_ || p + n > base_ + size_) return;
  const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
  const uintptr_t lo = ((uintptr_t)p + page - 1) / page * page, hi = ((uintptr_t)p + n) / page * page;
  if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
}

Result<std::unique_ptr<GgufFile>> GgufFile::from_bytes(const uint8_t* data, size_t size) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->source_ = "<memory>";
  f->owned_.assign(data, data + size);
  f->base_ = f->owned_.data();
  f->size_ = size;
  TANDEM_TRY(f->parse());
  return f;
}

Status GgufFile::parse() {
  try {
    Cursor c(base_, size_);
    if (size_ < 4) fail(fmt::format("file is {} bytes, too short for a GGUF header", size_));
    const uint32_t magic = c.read<uint32_t>("magic");
    if (magic != kMagic)
      fail(fmt::format("bad magic 0x{:08x} (expected 0x{:08x} \"GGUF\"): not a GGUF file", magic, kMagic));
    version_ = c.read<uint32_t>("version");
    if (version_ < 2 || version_ > 3) fail(fmt::format("unsupported GGUF version {} (tandem reads 2 and 3)", version_));
    const uint64_t n_tensors = c.read<uint64_t>("tensor_count");
    const uint64_t n_kv = c.read<uint64_t>("metadata_kv_count");
    // A key-value pair takes at least 12 bytes and a tensor info at least 32.
    if (n_kv > c.remaining() / 12)
      fail(fmt::format("metadata_kv_count {} is impossible: the {} bytes left hold at most {}", n_kv, c.remaining(),
                       c.remaining() / 12));
    if (n_tensors > c.remaining() / 32)
      fail(fmt::format("tensor_count {} is impossible: the {} bytes left hold at most {}", n_tensors, c.remaining(),
                       c.remaining() / 32));

    read_metadata(c, n_kv, kv_);
    if (const GgufValue* a = find("general.alignment")) alignment_ = alignment_of(*a);

    tensors_.reserve(n_tensors);
    for (uint64_t i = 0; i < n_tensors; i++) {
      GgufTensor t = read_tensor_info(c, i, alignment_);
      tensor_bytes_ += t.nbytes;
      if (!tensor_index_.emplace(t.name, tensors_.size()).second) fail(fmt::format("tensor {} appears twice", t.name));
      tensors_.push_back(std::move(t));
    }

    data_offset_ = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
    if (!tensors_.empty() && data_offset_ > size_)
      fail(fmt::format("data section starts at {} but the file is only {} bytes", data_offset_, size_));
    place_tensors(tensors_, base_, size_, data_offset_);
    check_no_overlap(tensors_);
  } catch (const ParseFailure& e) {
    return make_error("{}: {}", source_, e.message);
  }
  return Status::Ok();
}

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

const GgufTensor* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

Result<std::optional<uint64_t>> GgufFile::get_uint(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::optional<uint64_t>{};
  if (!v->is_integer()) return make_error("metadata '{}' is {}, expected an integer", key, gguf_type_name(v->type));
  if (std::holds_alternative<uint64_t>(v->v)) return std::optional<uint64_t>{std::get<uint64_t>(v->v)};
  const int64_t s = std::get<int64_t>(v->v);
  if (s < 0) return make_error("metadata '{}' is {}, expected a non-negative integer", key, s);
  return std::optional<uint64_t>{(uint64_t)s};
}

Result<std::optional<double>> GgufFile::get_float(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::optional<double>{};
  if (v->is_float()) return std::optional<double>{std::get<double>(v->v)};
  if (v->is_integer())
    return std::optional<double>{std::holds_alternative<uint64_t>(v->v) ? (double)std::get<uint64_t>(v->v)
                                                                         : (double)std::get<int64_t>(v->v)};
  return make_error("metadata '{}' is {}, expected a number", key, gguf_type_name(v->type));
}

Result<std::optional<bool>> GgufFile::get_bool(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::optional<bool>{};
  if (v->type == GgufType::BOOL) return std::optional<bool>{std::get<bool>(v->v)};
  if (v->is_integer()) {  // some writers store flags as integers
    auto u = get_uint(key);
    if (!u.ok()) return u.error();
    return std::optional<bool>{**u != 0};
  }
  return make_error("metadata '{}' is {}, expected a bool", key, gguf_type_name(v->type));
}

Result<std::optional<std::string_view>> GgufFile::get_string(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::optional<std::string_view>{};
  if (!v->is_string()) return make_error("metadata '{}' is {}, expected a string", key, gguf_type_name(v->type));
  return std::optional<std::string_view>{std::get<std::string_view>(v->v)};
}

const GgufArray* GgufFile::get_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v || !v->is_array()) return nullptr;
  return std::get<std::shared_ptr<const GgufArray>>(v->v).get();
}

}  // namespace tandem
